//! Never displacing a LocalDNS that serves, and the standby mode.
//!
//! Whoever starts the fallback (`OnFailure=`, an operator by hand), it
//! first asks LocalDNS's probe name on both listeners ([`localdns_serves`]): a LocalDNS that
//! answers is left alone. Without `--standby` the start ends there, cleanly (READY=1, then exit
//! 0: the unit is not `failed`). With `--standby` the daemon binds and serves as usual, but its
//! steering points at LocalDNS's sockets while LocalDNS answers: from the instant of the bind
//! (steered to us first and handed over after, each start and restart took a few queries), and
//! at the stop (the program stays: see `serve`). [`stand_by`] keeps asking, takes the flows after
//! two silent rounds (within 0.5 s of LocalDNS going silent) and hands them back after two
//! answered ones. Its own questions reach LocalDNS's sockets even while we hold the flows (the
//! steering program lets them through, and the relay drops any that reach us).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use nix::sys::socket::MsgFlags;
use tokio::io::unix::AsyncFd;

use crate::cli::Config;
use crate::link;
use crate::listen::Held;
use crate::probe::{self, OwnProbes, Prober, Seen};
use crate::stats::{Counters, TakeoverCause};

/// Rounds in a row that decide: two silent ones take the flows, two answered ones give them back
/// (one lost reply under load moves nothing).
const ROUNDS_TO_ACT: u32 = 2;

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

/// Runs until dropped: asks LocalDNS every `probe::EVERY` and moves the flows. Who holds them is
/// `own.aside()` (LocalDNS), which the relays read too.
pub async fn stand_by(
    mut prober: Prober,
    own: Arc<OwnProbes>,
    held: Arc<Mutex<Vec<Held>>>,
    config: Arc<Config>,
    counters: Arc<Counters>,
    initially: bool,
) {
    let take = |why, cause| {
        hold_flows(&held, &config);
        tracing::info!("{why}; serving its listeners");
        counters.takeovers.took_over(cause, SystemTime::now());
        own.set_aside(false);
    };
    own.set_aside(initially);
    if !initially {
        take("LocalDNS does not answer", TakeoverCause::SilentProbe);
    }
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
    let (mut silent, mut answered) = (0u32, 0u32);
    // LocalDNS answers but is not in our groups: said once, not every round.
    let mut said_stuck = false;
    let mut next = tokio::time::Instant::now();
    loop {
        // While LocalDNS holds the flows, its addresses are watched between and during rounds:
        // its script deletes its link when LocalDNS stops or fails, and nothing can answer there
        // until they are back, so there is nothing to ask first.
        let watching = own.aside();
        let seen = tokio::select! {
            seen = async {
                tokio::time::sleep_until(next).await;
                next = tokio::time::Instant::now() + probe::EVERY;
                prober.ask(probe::WAIT).await
            } => Some(seen),
            () = addresses_gone(&config, &changes), if watching => None,
            never = keep_aside(&held, &own), if watching => match never {},
        };
        let Some(seen) = seen else {
            take(
                "the listener addresses are gone with LocalDNS's link",
                TakeoverCause::AddressesGone,
            );
            (silent, answered) = (0, 0);
            continue;
        };
        match seen {
            Seen::Serving => {
                silent = 0;
                answered += 1;
                if !own.aside() && answered >= ROUNDS_TO_ACT {
                    if give_back(&held, &config) {
                        counters.takeovers.handed_back(SystemTime::now());
                        own.set_aside(true);
                        said_stuck = false;
                    } else if !said_stuck {
                        tracing::warn!(
                            "LocalDNS answers, but has no socket in our ports' groups; serving on"
                        );
                        said_stuck = true;
                    }
                }
            }
            Seen::Silent => {
                answered = 0;
                silent += 1;
                if own.aside() && silent >= ROUNDS_TO_ACT {
                    take(
                        "LocalDNS stopped answering its probe",
                        TakeoverCause::SilentProbe,
                    );
                } else if own.aside() {
                    // Asked again at once: the takeover is due within 0.5 s of the silence.
                    next = tokio::time::Instant::now();
                } else if silent % 4 == 0 {
                    // While we serve, a LocalDNS that joined the ports since we took them is
                    // asked only once the steering knows it is there; and the addresses go back
                    // on lo if something took them off (a stop of localdns-fallback.service
                    // beside us runs its release).
                    if !hold_flows(&held, &config).is_empty() {
                        tracing::info!("listener addresses were gone from lo; put back");
                    }
                }
            }
        }
    }
}

/// The least time between two re-pointings of the steering on strays: a LocalDNS that is gone
/// (not yet noticed) leaves us alone in the groups, where every query is a stray.
const STRAY_PAUSE: Duration = Duration::from_millis(2);

/// While LocalDNS holds the flows: each time a pod's query reaches us (a LocalDNS restart moved
/// us into the index the steering picks), the steering is pointed away from us again, from the
/// groups as they are now. That query is still answered; the next ones go to LocalDNS.
async fn keep_aside(held: &Mutex<Vec<Held>>, own: &OwnProbes) -> std::convert::Infallible {
    loop {
        own.strayed.notified().await;
        for h in held.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
            h.stand_aside();
        }
        tokio::time::sleep(STRAY_PAUSE).await;
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
    refresh(held);
    added
}

fn refresh(held: &Mutex<Vec<Held>>) {
    for h in held.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
        h.take();
    }
}

/// True once new flows go to LocalDNS; false if it has no socket in our ports' groups (then we
/// keep serving, and the listener addresses stay on lo).
fn give_back(held: &Mutex<Vec<Held>>, config: &Config) -> bool {
    let handed = Held::hand_over_all(&mut held.lock().unwrap_or_else(|p| p.into_inner()));
    if !handed {
        refresh(held);
        return false;
    }
    if config.link_setup {
        if let Err(e) = link::release_from_loopback(&super::prepare::link_addresses(config)) {
            tracing::warn!("cannot take the listener addresses off lo: {e}");
        }
    }
    tracing::info!("LocalDNS answers again; new flows go to it");
    true
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
