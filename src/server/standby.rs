//! Never displacing a LocalDNS that serves, and the standby mode.
//!
//! Whoever starts the fallback (`OnFailure=`, an operator by hand), it
//! first asks LocalDNS's probe name on both listeners ([`localdns_serves`]): a LocalDNS that
//! answers is left alone. Without `--standby` the start ends there, cleanly (READY=1, then exit
//! 0: the unit is not `failed`). With `--standby` the daemon binds and serves as usual, but its
//! steering points at LocalDNS's sockets while LocalDNS answers: from the instant of the bind
//! (steered to us first and handed over after, each start and restart took a few queries), and
//! at the stop (the program stays: see `serve`). [`stand_by`] carries out what `flows` decides:
//! it takes the flows when LocalDNS leaves queries unread in its sockets for 30 ms (the kernel's
//! view, from sock_diag) or after two silent probe rounds, and hands them back after two answered
//! ones. Its own questions reach LocalDNS's sockets even while we hold the flows (the steering
//! program lets them through, and the relay drops any that reach us).

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::socket::MsgFlags;
use tokio::io::unix::AsyncFd;

use crate::cli::Config;
use crate::flows::{Flows, Holder, Out, ROUNDS_TO_ACT, Why};
use crate::link;
use crate::listen::{Diag, Held, Looked, Proto};
use crate::probe::{self, OwnProbes, Prober, Seen};
use crate::stats::{Counters, TakeoverCause};

/// Does LocalDNS answer its probe name on both listeners? Asked twice at most (a reply lost once
/// does not make a serving LocalDNS silent). Nothing answers a listener on port 0 (tests).
pub async fn localdns_serves(config: &Config) -> bool {
    let listeners = [config.node_listen, config.cluster_listen];
    if listeners.iter().any(|l| l.port() == 0) {
        return false;
    }
    let Ok(mut prober) = Prober::new(&listeners, rand::random()) else {
        return false;
    };
    for _ in 0..ROUNDS_TO_ACT {
        if prober.ask(probe::WAIT).await == Seen::Serving {
            return true;
        }
    }
    false
}

/// Why a start without `--standby` takes the flows: systemd started it for a failed LocalDNS
/// when it says so (`OnFailure=` sets MONITOR_UNIT from systemd 251); else it was started by
/// hand (so is an `OnFailure=` start on systemd 249, which tells nothing).
pub fn start_cause() -> TakeoverCause {
    if std::env::var_os("MONITOR_UNIT").is_some() {
        TakeoverCause::LocalDnsFailed
    } else {
        TakeoverCause::ByHand
    }
}

/// The standby's prober, and what the relays need to drop its questions. Beside a LocalDNS that
/// answers, the listeners were bound with the flows on LocalDNS's sockets (see `server::run`).
pub fn begin(config: &Config, localdns_serves: bool) -> Result<(Prober, Arc<OwnProbes>), String> {
    let prober = Prober::new(&probed(config), rand::random())
        .map_err(|e| format!("cannot make the standby's probe sockets: {e}"))?;
    let own = Arc::new(OwnProbes::new(prober.ports(), &probed(config)));
    if localdns_serves {
        tracing::info!("LocalDNS answers on both listeners; standing by");
    }
    Ok((prober, own))
}

/// A probe round under way; it hands the prober back when it ends.
type Round = Pin<Box<dyn Future<Output = (Prober, Seen)> + Send>>;

/// Runs until dropped: carries out what [`Flows`] decides (who holds the flows, when to ask the
/// probe, when to read the kernel's view of the groups) and feeds it what it saw.
pub async fn stand_by(
    prober: Prober,
    held: Arc<Mutex<Vec<Held>>>,
    config: Arc<Config>,
    counters: Arc<Counters>,
    initially: bool,
) {
    let mut flows = Flows::new(Instant::now(), initially);
    // Without sock_diag the probe alone decides (as before the kernel's view was read).
    let diag = Diag::open()
        .inspect_err(|e| tracing::warn!(error = %e, "no sock_diag; a hung LocalDNS is noticed by its probe alone"))
        .ok();
    let changes = match link::address_changes() {
        // SAFETY: an OwnedFd is an open descriptor that stays the same until it is dropped,
        // which the AsyncFd that owns it does.
        Ok(fd) => unsafe { AsyncFd::register(fd) }.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let changes = changes
        .inspect_err(|error| {
            tracing::debug!(error, "no address announcements; looking every 20 ms");
        })
        .ok();
    let mut prober = Some(prober);
    let mut round: Option<Round> = None;
    // LocalDNS's cgroups' directories, by id (see `listen::owners`).
    let mut cgroup_paths = Vec::new();
    // LocalDNS's sockets at the last look, and the TCP listeners as last read (see `Out::Look`).
    let mut seen = Looked::new();
    let mut tcp_seen: std::io::Result<(Looked, bool)> = Ok((Looked::new(), false));
    loop {
        let now = Instant::now();
        while let Some(out) = flows.poll(now) {
            match out {
                Out::Take(why) => {
                    hold_flows(&held, &config);
                    tracing::info!("{}; serving its listeners", said(why));
                    counters.takeovers.took_over(cause(why), SystemTime::now());
                }
                Out::HandBack => {
                    if give_back(&held, &config) {
                        counters.takeovers.handed_back(SystemTime::now());
                    }
                }
                Out::Repoint if flows.holder() == Holder::Standby => {
                    if !hold_flows(&held, &config).is_empty() {
                        tracing::info!("listener addresses were gone from lo; put back");
                    }
                }
                Out::Repoint => {
                    Held::hand_over_all(&mut held.lock().unwrap_or_else(|p| p.into_inner()));
                }
                Out::Ask => {
                    if let Some(mut p) = prober.take() {
                        round = Some(Box::pin(async move {
                            let seen = p.ask(probe::WAIT).await;
                            (p, seen)
                        }));
                    }
                }
                Out::CheckOwners => {
                    let suspects = flows.suspects();
                    let cgroups: Vec<u64> = seen
                        .iter()
                        .filter(|(m, _)| suspects.contains(&m.inode))
                        .map(|&(_, c)| c)
                        .collect();
                    let owners = crate::listen::owners(&cgroups, &mut cgroup_paths);
                    tracing::debug!(?owners, "LocalDNS leaves a queue unread");
                    flows.owners(now, owners);
                }
                Out::Look { tcp } => {
                    // Without the kernel's view nothing queues and the groups count as whole:
                    // the probe alone takes and gives back, and the flows are never stuck.
                    let Some(diag) = &diag else {
                        flows.looked(now, &[], true);
                        continue;
                    };
                    let lock = held.lock().unwrap_or_else(|p| p.into_inner());
                    if tcp {
                        tcp_seen = Held::look(diag, &lock, Proto::Tcp);
                    } else if let Ok((theirs, _)) = &mut tcp_seen {
                        theirs.iter_mut().for_each(|(m, _)| m.queued = 0);
                    }
                    match (Held::look(diag, &lock, Proto::Udp), &tcp_seen) {
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
        let aside = flows.holder() == Holder::LocalDns;
        tokio::select! {
            (p, seen) = async { round.as_mut().expect("a round").await }, if round.is_some() => {
                round = None;
                prober = Some(p);
                flows.asked(Instant::now(), seen == Seen::Serving);
            }
            () = tokio::time::sleep_until(flows.deadline().into()) => {}
            // Its script deletes LocalDNS's link when LocalDNS stops or fails, and nothing can
            // answer there until it is back: there is nothing to ask first.
            () = addresses_gone(&config, &changes), if aside => flows.addresses_gone(),
        }
    }
}

fn said(why: Why) -> &'static str {
    match why {
        Why::NotServing => "LocalDNS does not answer",
        Why::SilentProbe => "LocalDNS stopped answering its probe",
        Why::Unread => "LocalDNS left queries unread in its sockets",
        Why::AddressesGone => "the listener addresses are gone with LocalDNS's link",
    }
}

/// The metrics' cause: a standby that found LocalDNS not answering at its start counts as the
/// probe's.
fn cause(why: Why) -> TakeoverCause {
    match why {
        Why::AddressesGone => TakeoverCause::AddressesGone,
        Why::NotServing | Why::SilentProbe => TakeoverCause::SilentProbe,
        Why::Unread => TakeoverCause::UnreadQueries,
    }
}

/// Puts the listener addresses on lo and steers new flows to us, with our place in the groups
/// read afresh. Returns the addresses that were missing from lo.
fn hold_flows(held: &Mutex<Vec<Held>>, config: &Config) -> Vec<std::net::IpAddr> {
    let mut added = Vec::new();
    if config.link_setup {
        match link::claim_on_loopback(&super::prepare::link_addresses(config)) {
            Ok(outcome) => added = outcome.added,
            Err(e) => tracing::warn!("cannot put the listener addresses on lo: {e}"),
        }
    }
    for h in held.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
        h.take();
    }
    added
}

/// New flows to LocalDNS and the addresses off lo; true if every group had a socket of its to
/// take them (`flows` hands back only then; one that left since is found by the next look).
fn give_back(held: &Mutex<Vec<Held>>, config: &Config) -> bool {
    let handed = Held::hand_over_all(&mut held.lock().unwrap_or_else(|p| p.into_inner()));
    if config.link_setup {
        if let Err(e) = link::release_from_loopback(&super::prepare::link_addresses(config)) {
            tracing::warn!("cannot take the listener addresses off lo: {e}");
        }
    }
    tracing::info!(handed, "LocalDNS answers again; new flows go to it");
    handed
}

/// How often the standby looks for LocalDNS's addresses while LocalDNS holds the flows, where
/// the kernel's address announcements cannot be had.
const ADDRESS_CHECK: Duration = Duration::from_millis(20);

/// Returns once a listener address is on no interface of this host: looked at each time the
/// kernel announces an address change (they queue on the socket between calls, so none is
/// missed; nothing runs while none comes), or every `ADDRESS_CHECK` without the announcements.
async fn addresses_gone(config: &Config, changes: &Option<AsyncFd<OwnedFd>>) {
    loop {
        match changes {
            Some(fd) => {
                let Ok(mut ready) = fd.readable().await else {
                    return std::future::pending().await;
                };
                let mut buf = [0u8; 8192];
                // Read them all: only "something changed" matters.
                while nix::sys::socket::recv(fd.get_ref().as_raw_fd(), &mut buf, MsgFlags::empty())
                    .is_ok_and(|n| n > 0)
                {}
                ready.clear_ready();
            }
            None => tokio::time::sleep(ADDRESS_CHECK).await,
        }
        if !addresses_local(config) {
            return;
        }
    }
}

/// Are the listener addresses on an interface of this host? Binding a socket to an address that
/// is not (without IP_FREEBIND) fails; nothing is sent.
fn addresses_local(config: &Config) -> bool {
    probed(config)
        .iter()
        .all(|l| std::net::UdpSocket::bind(SocketAddr::new(l.ip(), 0)).is_ok())
}

/// The addresses the prober asks.
pub fn probed(config: &Config) -> [SocketAddr; 2] {
    [config.node_listen, config.cluster_listen]
}
