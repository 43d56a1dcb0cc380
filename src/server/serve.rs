//! Serving, as one lifecycle: [`Running::start`] starts discovery, both listeners
//! (`listener`), the reporting tasks (`reporting`) and the steering's follower;
//! [`Running::stop`] hands new flows to LocalDNS, closes the listeners and lets work in flight
//! finish for a moment. On standby (`standby`) the steering follows LocalDNS's answers instead.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{AbortHandle, JoinHandle};

use super::listener::{DRAIN, Shared, start_listener};
use super::prepare::Prepared;
use super::reporting::start_reporting;
use super::standby;
use crate::cache::{Cache, KeyHasher};
use crate::cli::Config;
use crate::discover::follow;
use crate::listen::Held;
use crate::netlink;
use crate::probe::OwnProbes;
use crate::relay::{Stop, Strays};
use crate::roles::{ListenerRole, UpstreamGroup};
use crate::stats::Counters;
use crate::systemd::{Heartbeats, Notifier};
use crate::tcp;
use crate::tcp_pool::{self, UpstreamSide};
use crate::upstream::{UpstreamSet, UpstreamSets};

/// How long the first look for upstreams may hold back serving. Queries meanwhile wait in the
/// bound sockets' buffers; a slower look finishes in the background while we serve.
const FIRST_LOOK: Duration = Duration::from_secs(3);

/// Serves until `shutdown`. With `--standby`, the flows go to LocalDNS while it answers (it did at
/// start if `localdns_serves`), and to us while it does not.
pub async fn serve(
    config: Config,
    prepared: Prepared,
    localdns_serves: bool,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    if !config.standby {
        let running = Running::start(config, prepared, Arc::default(), None).await?;
        shutdown.await;
        running.stop().await;
        return Ok(());
    }
    let (prober, own_probes) = standby::begin(&config, localdns_serves)?;
    let strays = Strays::new().map_err(|e| format!("cannot make the standby's eventfd: {e}"))?;
    let running =
        Running::start(config, prepared, own_probes.clone(), Some(strays.clone())).await?;
    // A thread of its own (see `standby::stand_by`), stopped by closing the other end of `stop`.
    let (stop, stop_here) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("cannot make the standby's stop pipe: {e}"))?;
    let (held, config, counters) = (
        running.held.clone(),
        running.config.clone(),
        running.counters.clone(),
    );
    let standing = std::thread::Builder::new()
        .name("standby".into())
        .spawn(move || {
            let shell = standby::Shell {
                held,
                config,
                counters,
                strays,
                stop,
            };
            standby::stand_by(prober, shell, localdns_serves)
        })
        .map_err(|e| format!("cannot start the standby's thread: {e}"))?;
    shutdown.await;
    drop(stop_here);
    let _ = tokio::task::spawn_blocking(move || standing.join()).await;
    running.stop().await;
    Ok(())
}

/// A serving daemon: what its stop needs to reach.
struct Running {
    config: Arc<Config>,
    notifier: Arc<Notifier>,
    /// Who holds the flows, for `/metrics`: the standby moves them, the stop hands them back.
    counters: Arc<Counters>,
    /// The listeners' steering and sockets, for the hand-over to LocalDNS at the stop.
    held: Arc<Mutex<Vec<Held>>>,
    /// Keeps `held` on our own sockets (not on standby); ends first at the stop.
    following: Option<AbortHandle>,
    /// The status line, metrics and watchdog: they end at the stop without a word.
    reporting: Vec<AbortHandle>,
    /// Discovery and the TCP listeners' tasks: they end on `stop_tx`, and are waited for.
    tasks: Vec<JoinHandle<()>>,
    stop_tx: watch::Sender<bool>,
    relay_stop: Arc<Stop>,
    relay_threads: Vec<std::thread::JoinHandle<()>>,
    /// Each TCP connection holds a clone; `drain_rx` closes when the last is gone.
    drain_tx: mpsc::Sender<()>,
    drain_rx: mpsc::Receiver<()>,
}

impl Running {
    /// Starts discovery (waiting up to `FIRST_LOOK` for its first look), both listeners' relay
    /// threads and TCP tasks, then the status line, metrics, the watchdog and the steering's
    /// follower, and tells systemd we are ready.
    async fn start(
        config: Config,
        prepared: Prepared,
        own_probes: Arc<OwnProbes>,
        strays: Option<Arc<Strays>>,
    ) -> Result<Running, String> {
        let config = Arc::new(config);
        let counters = Counters::new(std::time::SystemTime::now());
        let Prepared {
            node,
            cluster,
            metrics: metrics_listener,
            owned,
        } = prepared;
        let metrics_listener = match metrics_listener.map(tokio::net::TcpListener::from_std) {
            Some(Ok(l)) => Some(l),
            Some(Err(e)) => return Err(format!("cannot register the metrics socket: {e}")),
            None => None,
        };
        let sets = flag_upstreams(&config, &counters);
        // Discovery publishes new upstream sets here; relay threads pick them up between datagrams.
        let (publish, sets_rx) = watch::channel(sets);
        let (stop_tx, stop_rx) = watch::channel(false);
        let relay_stop = Stop::new().map_err(|e| format!("cannot make an eventfd: {e}"))?;
        let (drain_tx, drain_rx) = mpsc::channel::<()>(1);
        let notifier = Arc::new(Notifier::from_env());

        let mut tasks = Vec::new();
        // Discovery runs even with every group given by flags: it follows the hosts file too.
        {
            let (first_tx, first_rx) = oneshot::channel();
            let listeners = vec![config.node_listen.ip(), config.cluster_listen.ip()];
            tasks.push(tokio::spawn(follow::follow(
                config.discovery.clone(),
                owned,
                listeners,
                publish,
                counters.clone(),
                first_tx,
                stop_rx.clone(),
            )));
            if tokio::time::timeout(FIRST_LOOK, first_rx).await.is_err() {
                tracing::warn!(
                    "the first look for upstreams takes over {FIRST_LOOK:?}; serving meanwhile"
                );
            }
        }
        let sets = sets_rx.borrow().clone();
        let heartbeats = Heartbeats::new(2 * config.udp_threads);
        // One cache for both listeners: the key holds the upstream group, so kube-dns and VNet
        // DNS answers never mix, while a cluster name asked on either listener shares one entry.
        let cache = Cache::new(config.cache, KeyHasher::new(rand::random()))
            .map(|c| Arc::new(Mutex::new(c)));
        let upstream_tcp = Arc::new(UpstreamSide::new(
            tokio::runtime::Handle::current(),
            config.engine.upstream_timeout,
        ));
        let shared = Shared {
            config: &config,
            sets: &sets,
            counters: &counters,
            sets_rx: &sets_rx,
            cache: &cache,
            upstream_tcp: &upstream_tcp,
            heartbeats: &heartbeats,
            relay_stop: &relay_stop,
            stop_rx: &stop_rx,
            drain_tx: &drain_tx,
            own_probes: &own_probes,
            strays: &strays,
            tcp_cap: tcp::connection_cap(config.max_tcp_connections, other_descriptors(&config)),
        };
        let mut relay_threads = Vec::new();
        let mut held = Vec::new();
        for (index, (role, bound)) in [(ListenerRole::Node, node), (ListenerRole::Cluster, cluster)]
            .into_iter()
            .enumerate()
        {
            let started = start_listener(&shared, index, role, bound)?;
            held.push(started.held);
            relay_threads.extend(started.relay_threads);
            tasks.push(started.tcp);
        }
        counters.takeovers.set_standby(config.standby);
        if !config.standby {
            counters
                .takeovers
                .took_over(standby::start_cause(), std::time::SystemTime::now());
        }
        tracing::info!("ready");
        notifier.notify("READY=1");
        let reporting = start_reporting(
            &notifier,
            &config,
            &sets_rx,
            &counters,
            &cache,
            &heartbeats,
            metrics_listener,
        );
        let held = Arc::new(Mutex::new(held));
        // On standby, the steering follows LocalDNS's answers instead (see `standby`).
        let following =
            (!config.standby).then(|| tokio::spawn(follow_steering(held.clone())).abort_handle());
        Ok(Running {
            config,
            notifier,
            counters,
            held,
            following,
            reporting,
            tasks,
            stop_tx,
            relay_stop,
            relay_threads,
            drain_tx,
            drain_rx,
        })
    }

    /// Hands new flows to LocalDNS where it has joined our ports, stops the listeners, lets
    /// what is in flight finish for up to `DRAIN`, then takes the listener addresses off `lo`
    /// (and detaches the steering first if LocalDNS has not joined).
    async fn stop(self) {
        let Running {
            config,
            notifier,
            counters,
            held,
            following,
            reporting,
            tasks,
            stop_tx,
            relay_stop,
            relay_threads,
            drain_tx,
            mut drain_rx,
        } = self;
        notifier.notify("STOPPING=1");
        if let Some(following) = following {
            following.abort();
        }
        // New flows to LocalDNS first (when it has joined our ports): the relay threads then
        // answer what already reached us before they close.
        let mut held = std::mem::take(&mut *held.lock().unwrap_or_else(|p| p.into_inner()));
        // The drain needs every listener handed over.
        let handed = Held::hand_over_all(&mut held);
        if handed {
            counters.takeovers.handed_back(std::time::SystemTime::now());
            tracing::info!("stopping: new flows go to LocalDNS; answering what we have");
        } else {
            tracing::info!("stopping: closing listeners");
        }
        for task in reporting {
            task.abort();
        }
        let _ = stop_tx.send(true);
        relay_stop.stop(handed);
        for task in tasks {
            let _ = task.await;
        }
        tracing::info!("listeners closed; draining queries in flight");
        drop(drain_tx);
        let drained = tokio::time::timeout(DRAIN, drain_rx.recv()).await.is_ok();
        for thread in relay_threads {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        // Handed over, the program stays on the groups: it never picks our index, so after our
        // sockets close it picks LocalDNS's (or, out of range, the kernel hashes over them),
        // where a detach right before the close would let hashing put flows on our closing
        // sockets, to be lost with them. Not handed over, it goes right before they close.
        if !handed {
            for h in held {
                h.release();
            }
        }
        // Then the addresses on lo.
        if config.link_setup {
            // Without CAP_NET_ADMIN (dropped when nothing needs it) this fails; the unit's
            // ExecStopPost removes them then, as it does after a kill.
            if let Err(e) = netlink::release_from_loopback(&super::prepare::link_addresses(&config))
            {
                tracing::info!("listener addresses left on lo for the unit to remove: {e}");
            }
        }
        tracing::info!(drained, "stopped");
    }
}

/// Descriptors kept for everything but client TCP connections: the TCP connections to upstreams
/// and each relay thread's UDP sockets, both for up to four upstreams per group, and a margin for
/// the listeners, epoll, eventfds, the metrics socket, discovery's pipes and the runtime.
fn other_descriptors(config: &Config) -> usize {
    tcp_pool::DESCRIPTORS
        + 2 * config.udp_threads * config.engine.udp_sockets_per_upstream * 2 * 4
        + 64
}

/// The upstreams given by flags, before discovery has looked; a group given by flags is
/// recorded with the source `flag`.
fn flag_upstreams(config: &Config, counters: &Arc<Counters>) -> Arc<UpstreamSets> {
    let sets = Arc::new(UpstreamSets {
        vnet_dns: Arc::new(UpstreamSet::counted(
            config.node_upstreams.clone(),
            UpstreamGroup::VnetDns,
            counters,
            Instant::now(),
        )),
        kube_dns: Arc::new(UpstreamSet::counted(
            config.cluster_upstreams.clone(),
            UpstreamGroup::KubeDns,
            counters,
            Instant::now(),
        )),
        hosts: Default::default(),
    });
    for (group, given) in [
        (UpstreamGroup::VnetDns, &config.node_upstreams),
        (UpstreamGroup::KubeDns, &config.cluster_upstreams),
    ] {
        if !given.is_empty() {
            counters.upstreams_changed(group, "flag");
        }
    }
    sets
}

/// How often our place in the ports' SO_REUSEPORT groups is looked at while we serve. Our place
/// moves only when a member that joined before us leaves: an orphaned CoreDNS, or, during
/// `systemctl restart localdns`, the old LocalDNS server, whose index the new one takes when it
/// binds. Until we follow, the steering program sends every flow to that index, so a second here
/// was 0.8 s of pods dark on each restart. The look (a sock_diag dump) is skipped while we are
/// first in the group (our place cannot move then), which is the usual case.
const FOLLOW_EVERY: Duration = Duration::from_millis(100);

/// Keeps each listener's steering on our own socket as other members of its groups come and go.
async fn follow_steering(held: Arc<Mutex<Vec<Held>>>) {
    let mut ticker = tokio::time::interval(FOLLOW_EVERY);
    loop {
        ticker.tick().await;
        for h in held.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
            h.follow();
        }
    }
}
