//! Who holds LocalDNS's new flows, carried out: the one loop that every daemon runs, whether it
//! starts beside a LocalDNS that answers (`--standby`) or holding the flows (started by
//! `OnFailure=` or by hand). `flows` decides; this wing reads the kernel and the probe for it and
//! moves the steering and the addresses as it says.
//!
//! Whoever starts the fallback, it first asks LocalDNS's probe name on both listeners
//! ([`localdns_serves`]): a LocalDNS that answers is left alone. Without `--standby` the start
//! ends there, cleanly (READY=1, then exit 0: the unit is not `failed`). With `--standby` the
//! daemon binds beside it with its steering pointing at LocalDNS's sockets from the instant of
//! the bind. [`run`] takes the flows when LocalDNS leaves queries unread in its sockets for
//! 30 ms, or 4 ms if its process is stopped (the kernel's view, from sock_diag), after two silent
//! probe rounds, or when its addresses go; and hands them back once it has proven itself (see
//! `flows`). Its own questions reach LocalDNS's sockets even while we hold the flows (the
//! steering program lets them through, and the relay drops any that reach us).
//!
//! Here: the loop; `probe` (LocalDNS's own question); `owners` (what the processes behind a
//! queue left unread are doing).

pub mod owners;
pub mod probe;

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{MsgFlags, recv};

use crate::cli::Config;
use crate::flows::{Addresses, Cause, Flows, Holder, Out, ROUNDS_TO_ACT};
use crate::listen::Held;
use crate::netlink::{self, Diag, Looked, Proto};
use crate::stats::Counters;
use crate::stop::Stop;
pub use probe::OwnProbes;
use probe::{Prober, Seen};

/// Does LocalDNS answer its probe name on both listeners? Asked twice at most (a reply lost once
/// does not make a serving LocalDNS silent). Nothing answers a listener on port 0 (tests).
pub fn localdns_serves(config: &Config) -> bool {
    let listeners = config.listeners();
    if listeners.iter().any(|l| l.port() == 0) {
        return false;
    }
    let Ok(mut prober) = Prober::new(&listeners, rand::random()) else {
        return false;
    };
    (0..ROUNDS_TO_ACT).any(|_| prober.ask(probe::WAIT) == Seen::Serving)
}

/// Why a daemon takes the flows at its start (`None`: it stands by a LocalDNS that answers).
/// A standby found LocalDNS's probe silent twice. Any other start: systemd started it for a
/// failed LocalDNS when it says so (`OnFailure=` sets MONITOR_UNIT from systemd 251); else it was
/// started by hand (so is an `OnFailure=` start on systemd 249, which tells nothing).
pub fn start_cause(config: &Config, localdns_serves: bool) -> Option<Cause> {
    match (localdns_serves, config.standby) {
        (true, _) => None,
        (false, true) => Some(Cause::SilentProbe),
        (false, false) if std::env::var_os("MONITOR_UNIT").is_some() => Some(Cause::LocalDnsFailed),
        (false, false) => Some(Cause::ByHand),
    }
}

/// The loop's prober, and what the relays need to drop its questions.
pub fn prober(config: &Config) -> Result<(Prober, Arc<OwnProbes>), String> {
    let prober = Prober::new(&config.listeners(), rand::random())
        .map_err(|e| format!("cannot make the probe's sockets: {e}"))?;
    let own = Arc::new(OwnProbes::new(prober.ports(), &config.listeners()));
    Ok((prober, own))
}

/// Pods' queries that reach us while LocalDNS holds the flows: the steering points at a socket
/// of ours (a LocalDNS socket left its group and the kernel moved ours into its index). The
/// relay says so at once; the loop then reads the groups at once rather than up to a look later.
pub struct Strays {
    wake: EventFd,
    /// Who holds the flows, as the loop last published it.
    counters: Arc<Counters>,
}

impl Strays {
    pub fn new(counters: Arc<Counters>) -> std::io::Result<Arc<Strays>> {
        let wake = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Arc::new(Strays { wake, counters }))
    }

    /// New flows go to LocalDNS, not to us.
    pub fn aside(&self) -> bool {
        self.counters.takeovers.holding().is_none()
    }

    /// A standby (`--standby`) beside a LocalDNS that has the flows: its upstreams hear from it
    /// only what it asks them itself.
    pub fn standing_by(&self) -> bool {
        self.counters.standby && self.aside()
    }

    /// A relay read pods' queries.
    pub fn reached_us(&self) {
        if self.aside() {
            let _ = self.wake.write(1);
        }
    }
}

/// What the loop acts on and hears from besides its prober.
pub struct Shell {
    pub held: Arc<Mutex<Vec<Held>>>,
    pub config: Arc<Config>,
    pub counters: Arc<Counters>,
    pub strays: Arc<Strays>,
    pub stop: Arc<Stop>,
}

/// Runs until `shell.stop`: carries out what [`Flows`] decides (who holds the flows, when to ask
/// the probe, when to read the kernel's view of the groups) and feeds it what it saw; from the
/// start, the flows are taken for `taken` if it says so. A plain loop on one thread, asleep in
/// poll(2) between its deadlines: each wake costs CPU (about 50 µs on a VM whose CPU sleeps
/// between wakes), and a runtime's timers and wake-ups cost as much again.
pub fn run(mut prober: Prober, shell: Shell, taken: Option<Cause>) {
    let config = &shell.config;
    // A daemon started for a failed LocalDNS put the addresses on lo at its start and keeps no
    // capability to move them (nor does it need to: it leaves when LocalDNS starts).
    let moves_addresses = config.link_setup && config.standby;
    let mut flows = Flows::new(Instant::now(), taken);
    // Without sock_diag the probe alone decides (as before the kernel's view was read).
    let mut diag = Diag::open()
        .inspect_err(|e| tracing::warn!(error = %e, "no sock_diag; a hung LocalDNS is noticed by its probe alone"))
        .ok();
    let changes = netlink::address_changes()
        .inspect_err(
            |e| tracing::debug!(error = %e, "no address announcements; looking at every look"),
        )
        .ok();
    // The listener addresses we put on lo (they are LocalDNS's only where they are also on
    // another link): a daemon that is not a standby put them there at its start (nobody else
    // puts them on lo, so those it found there are its own too).
    let mut ours = match config.link_setup && !config.standby {
        true => lo_addresses(config),
        false => Vec::new(),
    };
    if let Some(found) = where_addresses(config, &ours) {
        flows.addresses(Instant::now(), found);
    }
    // The end of the probe round under way, if one is.
    let mut round: Option<Instant> = None;
    // LocalDNS's cgroups' directories, by id (see `owners`).
    let mut cgroup_paths = Vec::new();
    // LocalDNS's sockets at the last look, and the TCP listeners as last read (see `Out::Look`).
    let mut seen = Looked::new();
    let mut tcp_seen: std::io::Result<(Looked, bool)> = Ok((Looked::new(), false));
    loop {
        let now = Instant::now();
        while let Some(out) = flows.poll(now) {
            match out {
                Out::Take(cause) => {
                    ours.extend(hold_flows(&shell, diag.as_mut(), moves_addresses));
                    tracing::info!("{}; serving its listeners", cause.sentence());
                    shell.counters.takeovers.took_over(cause, SystemTime::now());
                }
                Out::HandBack => {
                    if moves_addresses {
                        ours.clear();
                    }
                    if give_back(&shell, diag.as_mut(), moves_addresses) {
                        shell.counters.takeovers.handed_back(SystemTime::now());
                    }
                }
                Out::Repoint if flows.holder() == Holder::Fallback => {
                    let added = hold_flows(&shell, diag.as_mut(), moves_addresses);
                    if !added.is_empty() {
                        tracing::info!("listener addresses were gone from lo; put back");
                    }
                    ours.extend(added);
                }
                Out::Repoint => {
                    let mut held = shell.held.lock().unwrap_or_else(|p| p.into_inner());
                    Held::read_places(diag.as_mut(), &mut held);
                    Held::hand_over_all(&mut held);
                }
                Out::Ask if prober.start() => round = Some(now + probe::WAIT),
                Out::Ask => flows.asked(now, false),
                Out::CheckOwners => {
                    let suspects = flows.suspects();
                    let cgroups: Vec<u64> = seen
                        .iter()
                        .filter(|(m, _)| suspects.contains(&m.inode))
                        .map(|&(_, c)| c)
                        .collect();
                    let owners = owners::owners(&cgroups, &mut cgroup_paths);
                    tracing::debug!(?owners, "LocalDNS leaves a queue unread");
                    flows.owners(now, owners);
                }
                Out::Look { tcp, dump } => {
                    if changes.is_none() {
                        if let Some(found) = where_addresses(config, &ours) {
                            flows.addresses(now, found);
                        }
                    }
                    // Without the kernel's view nothing queues and the groups count as whole:
                    // the probe alone takes and gives back, and the flows are never stuck.
                    let Some(diag) = &mut diag else {
                        flows.looked(now, &[], true);
                        continue;
                    };
                    let lock = shell.held.lock().unwrap_or_else(|p| p.into_inner());
                    if tcp {
                        tcp_seen = Held::look(diag, &lock, Proto::Tcp, dump);
                    } else if let Ok((theirs, _)) = &mut tcp_seen {
                        theirs.iter_mut().for_each(|(m, _)| m.queued = 0);
                    }
                    match (Held::look(diag, &lock, Proto::Udp, dump), &tcp_seen) {
                        (Ok((udp, udp_complete)), Ok((tcp, tcp_complete))) => {
                            seen = udp;
                            seen.extend_from_slice(tcp);
                            let queues: Vec<_> = seen.iter().map(|&(m, _)| m).collect();
                            flows.looked(now, &queues, udp_complete && *tcp_complete);
                        }
                        (Err(e), _) => tracing::debug!(error = %e, "cannot read the groups"),
                        (_, Err(e)) => tracing::debug!(error = %e, "cannot read the groups"),
                    }
                }
            }
        }
        // Its script deletes LocalDNS's link when LocalDNS stops or fails, and nothing can
        // answer there until it is back: there is nothing to ask first; and the flows go back
        // only once its link carries them again. The kernel announces address changes on
        // `changes` (they queue between reads, so none is missed); without them the addresses
        // are checked at every look.
        let wake = round.map_or(flows.deadline(), |end| flows.deadline().min(end));
        let mut fds = vec![
            PollFd::new(shell.stop.fd(), PollFlags::POLLIN),
            PollFd::new(shell.strays.wake.as_fd(), PollFlags::POLLIN),
        ];
        if let Some(fd) = &changes {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        if round.is_some() {
            fds.extend(prober.fds().map(|fd| PollFd::new(fd, PollFlags::POLLIN)));
        }
        let left = wake.saturating_duration_since(Instant::now());
        // Rounded up: a deadline is never met early, nor a millisecond spun away.
        let timeout = PollTimeout::try_from(left.as_micros().div_ceil(1000) as i32)
            .unwrap_or(PollTimeout::MAX);
        if poll(&mut fds, timeout).is_err_and(|e| e != nix::errno::Errno::EINTR) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let revents = |i: usize| {
            fds.get(i)
                .and_then(PollFd::revents)
                .is_some_and(|r| !r.is_empty())
        };
        if revents(0) {
            return;
        }
        let now = Instant::now();
        // A query reached us since the last read (`flows` heeds it only while it stands aside).
        if revents(1) && shell.strays.wake.read().is_ok() {
            flows.stray(now);
        }
        // An overrun of the announcements (an error to read) counts as a change too. Every
        // queued one is read: only "something changed" matters.
        if let Some(fd) = changes.as_ref().filter(|_| revents(2)) {
            let mut buf = [0u8; 8192];
            while recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).is_ok_and(|n| n > 0) {}
            if let Some(found) = where_addresses(config, &ours) {
                flows.addresses(now, found);
            }
        }
        let read = round.and_then(|_| prober.read());
        if let Some(end) = round.filter(|&end| read.is_some() || now >= end) {
            round = None;
            let late = now.saturating_duration_since(end);
            if read != Some(Seen::Serving) {
                let (refused, queued) = (read.is_some(), seen.iter().map(|(q, _)| q.queued));
                let queued: Vec<_> = queued.collect();
                tracing::debug!(refused, ?late, ?queued, "probe round silent");
            }
            match read {
                Some(verdict) => flows.asked(now, verdict == Seen::Serving),
                None => flows.timed_out(now, late),
            }
        }
    }
}

/// Puts the listener addresses on lo and steers new flows to us, with our place in the groups
/// read afresh. Returns the addresses that were missing from lo.
fn hold_flows(shell: &Shell, diag: Option<&mut Diag>, addresses: bool) -> Vec<IpAddr> {
    let mut added = Vec::new();
    if addresses {
        match netlink::claim_on_loopback(&lo_addresses(&shell.config)) {
            Ok(outcome) => added = outcome.added,
            Err(e) => tracing::warn!("cannot put the listener addresses on lo: {e}"),
        }
    }
    let mut held = shell.held.lock().unwrap_or_else(|p| p.into_inner());
    Held::read_places(diag, &mut held);
    for h in held.iter_mut() {
        h.steer_to_us();
    }
    added
}

/// New flows to LocalDNS and the addresses off lo; true if every group had a socket of its to
/// take them (`flows` hands back only then; one that left since is found by the next look).
fn give_back(shell: &Shell, diag: Option<&mut Diag>, addresses: bool) -> bool {
    let mut held = shell.held.lock().unwrap_or_else(|p| p.into_inner());
    Held::read_places(diag, &mut held);
    let handed = Held::hand_over_all(&mut held);
    drop(held);
    if addresses {
        if let Err(e) = netlink::release_from_loopback(&lo_addresses(&shell.config)) {
            tracing::warn!("cannot take the listener addresses off lo: {e}");
        }
    }
    tracing::info!(handed, "LocalDNS answers again; new flows go to it");
    handed
}

/// Where the listener addresses are: each on an interface, and on one that is not lo or not only
/// on lo because the standby put it there (`ours`). Without rtnetlink, a bind to each tells
/// whether it is on any interface (a bind to an address that is not fails; nothing is sent).
/// `None` when neither can be asked (out of descriptors): not knowing is not "gone".
fn where_addresses(config: &Config, ours: &[IpAddr]) -> Option<Addresses> {
    let wanted = config.listeners().map(|l| l.ip());
    let Ok(found) = netlink::interfaces_of(&wanted) else {
        for ip in wanted {
            match std::net::UdpSocket::bind(SocketAddr::new(ip, 0)) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(nix::libc::EADDRNOTAVAIL) => {
                    return Some(Addresses::Gone);
                }
                Err(_) => return None,
            }
        }
        return Some(Addresses::Theirs);
    };
    let lo = nix::net::if_::if_nametoindex(netlink::LOOPBACK).unwrap_or(1);
    let mut all_theirs = true;
    for ip in wanted {
        let on: Vec<u32> = found.iter().filter(|f| f.0 == ip).map(|f| f.1).collect();
        if on.is_empty() {
            return Some(Addresses::Gone);
        }
        all_theirs &= on.iter().any(|&i| i != lo) || !ours.contains(&ip);
    }
    Some(if all_theirs {
        Addresses::Theirs
    } else {
        Addresses::Ours
    })
}

/// The listener addresses that go on `lo`: loopback and wildcard listen addresses (tests, odd
/// setups) are local already.
pub fn lo_addresses(config: &Config) -> Vec<IpAddr> {
    config
        .listeners()
        .map(|l| l.ip())
        .into_iter()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .collect()
}
