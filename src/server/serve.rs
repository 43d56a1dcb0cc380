//! Serving, as one lifecycle: [`Running::start`] starts discovery, both listeners
//! (`listener`) and the reporting tasks (`reporting`); `standby::run` moves the flows on a
//! thread of its own; [`Running::stop`] hands new flows to LocalDNS, closes the listeners and
//! lets work in flight finish for a moment.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::listener::{Shared, Started, start_listener};
use super::prepare::Prepared;
use super::reporting::reporting;
use crate::cache::{Cache, KeyHasher};
use crate::cli::Config;
use crate::discover::follow;
use crate::flows::Cause;
use crate::listen::Held;
use crate::netlink::{self, Diag};
use crate::relay::DRAIN;
use crate::roles::{ListenerRole, UpstreamGroup};
use crate::standby::{self, Strays};
use crate::stats::Counters;
use crate::stop::{Stop, until};
use crate::systemd::{Heartbeats, Notifier};
use crate::tcp::{self, ClientSide};
use crate::tcp_pool::{self, UpstreamSide};
use crate::upstream::{UpstreamSet, UpstreamSets};

/// How long the first look for upstreams may hold back serving. Queries meanwhile wait in the
/// bound sockets' buffers; a slower look finishes in the background while we serve.
const FIRST_LOOK: Duration = Duration::from_secs(3);

/// A serving daemon: what its stop needs to reach.
pub(super) struct Running {
    config: Arc<Config>,
    notifier: Arc<Notifier>,
    /// Who holds the flows, for `/metrics`: the standby moves them, the stop hands them back.
    counters: Arc<Counters>,
    /// The listeners' steering and sockets, for the hand-over to LocalDNS at the stop.
    held: Arc<Mutex<Vec<Held>>>,
    /// Discovery, the TCP listeners' tasks, the status line, metrics and watchdog, the relay
    /// threads: all end at `stop`.
    stop: Arc<Stop>,
    tasks: Vec<JoinHandle<()>>,
    relay_threads: Vec<std::thread::JoinHandle<()>>,
    /// Each listener's TCP clients, waited for at the stop.
    tcp_sides: Vec<Arc<ClientSide>>,
    /// The thread that moves the flows (see `standby::run`) and its own stop: it ends before
    /// the rest, so that the stop's hand-over does not race its moves.
    standby: (Arc<Stop>, std::thread::JoinHandle<()>),
}

impl Running {
    /// Starts discovery (waiting up to `FIRST_LOOK` for its first look), both listeners' relay
    /// threads and TCP tasks, then the status line, metrics and the watchdog, tells systemd we
    /// are ready, and starts the standby's loop: the flows taken from the start for `taken`, or
    /// left with LocalDNS while it answers (`--standby`); moved after that as `standby::run`
    /// decides.
    pub(super) async fn start(
        config: Config,
        prepared: Prepared,
        taken: Option<Cause>,
    ) -> Result<Running, String> {
        let (prober, own_probes) = standby::prober(&config)?;
        let config = Arc::new(config);
        let counters = Counters::new(SystemTime::now(), config.standby);
        let strays =
            Strays::new(counters.clone()).map_err(|e| format!("cannot make an eventfd: {e}"))?;
        let metrics_listener = match prepared.metrics.map(tokio::net::TcpListener::from_std) {
            Some(Ok(l)) => Some(l),
            Some(Err(e)) => return Err(format!("cannot register the metrics socket: {e}")),
            None => None,
        };
        let sets = flag_upstreams(&config, &counters);
        // Discovery publishes new upstream sets here; relay threads pick them up between datagrams.
        let (publish, sets_rx) = watch::channel(sets);
        let stop = Stop::new().map_err(|e| format!("cannot make an eventfd: {e}"))?;
        let notifier = Arc::new(Notifier::from_env());

        let mut tasks = Vec::new();
        // Discovery runs even with every group given by flags: it follows the hosts file too.
        {
            let (first_tx, first_rx) = oneshot::channel();
            let listeners = vec![config.node_listen.ip(), config.cluster_listen.ip()];
            tasks.push(tokio::spawn(until(
                stop.clone(),
                follow::follow(
                    config.discovery.clone(),
                    prepared.owned,
                    listeners,
                    publish,
                    counters.clone(),
                    first_tx,
                ),
            )));
            if tokio::time::timeout(FIRST_LOOK, first_rx).await.is_err() {
                tracing::warn!(
                    "the first look for upstreams takes over {FIRST_LOOK:?}; serving meanwhile"
                );
            }
        }
        let heartbeats = Heartbeats::new(2 * config.udp_threads);
        // One cache for both listeners: the key holds the upstream group, so kube-dns and VNet
        // DNS answers never mix, while a cluster name asked on either listener shares one entry.
        let cache = Cache::new(config.cache, KeyHasher::new(rand::random()))
            .map(|c| Arc::new(Mutex::new(c)));
        let upstream_tcp = UpstreamSide::new(
            tokio::runtime::Handle::current(),
            config.engine.upstream_timeout,
        );
        let shared = Shared {
            config: &config,
            counters: &counters,
            sets_rx: &sets_rx,
            cache: &cache,
            upstream_tcp: &upstream_tcp,
            heartbeats: &heartbeats,
            stop: &stop,
            own_probes: &own_probes,
            strays: &strays,
            tcp_cap: tcp::connection_cap(config.max_tcp_connections, other_descriptors(&config)),
        };
        let mut started = Started::default();
        for (role, bound) in [
            (ListenerRole::Node, prepared.node),
            (ListenerRole::Cluster, prepared.cluster),
        ] {
            start_listener(&shared, role, bound, &mut started)?;
        }
        tasks.append(&mut started.tcp);
        tracing::info!("ready");
        notifier.notify("READY=1");
        tasks.extend(reporting(&shared, &notifier, metrics_listener));
        if taken.is_none() {
            tracing::info!("LocalDNS answers on both listeners; standing by");
        }
        let held = Arc::new(Mutex::new(started.held));
        let standby_stop = Stop::new().map_err(|e| format!("cannot make an eventfd: {e}"))?;
        let shell = standby::Shell {
            held: held.clone(),
            config: config.clone(),
            counters: counters.clone(),
            strays,
            stop: standby_stop.clone(),
        };
        let standing = std::thread::Builder::new()
            .name("standby".into())
            .spawn(move || standby::run(prober, shell, taken))
            .map_err(|e| format!("cannot start the standby's thread: {e}"))?;
        Ok(Running {
            config,
            notifier,
            counters,
            held,
            stop,
            tasks,
            relay_threads: started.relay_threads,
            tcp_sides: started.tcp_sides,
            standby: (standby_stop, standing),
        })
    }

    /// Hands new flows to LocalDNS where it has joined our ports, stops the listeners, lets
    /// what is in flight finish for up to `DRAIN`, then takes the listener addresses off `lo`
    /// (and detaches the steering first if LocalDNS has not joined).
    pub(super) async fn stop(self) {
        self.notifier.notify("STOPPING=1");
        let (standby_stop, standing) = self.standby;
        standby_stop.stop();
        let _ = tokio::task::spawn_blocking(move || standing.join()).await;
        // New flows to LocalDNS first (when it has joined our ports): the relay threads then
        // answer what already reached us before they close.
        let mut held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()));
        // The drain needs every listener handed over.
        Held::read_places(Diag::open().ok().as_mut(), &mut held);
        let handed = Held::hand_over_all(&mut held);
        if handed {
            self.counters.takeovers.handed_back(SystemTime::now());
            tracing::info!("stopping: new flows go to LocalDNS; answering what we have");
        } else {
            tracing::info!("stopping: closing listeners");
        }
        // The relay threads read who holds the flows at the stop: handed over, they drain.
        self.stop.stop();
        for task in self.tasks {
            let _ = task.await;
        }
        tracing::info!("listeners closed; draining queries in flight");
        let clients = async {
            for side in &self.tcp_sides {
                side.closed().await;
            }
        };
        let drained = tokio::time::timeout(DRAIN, clients).await.is_ok();
        for thread in self.relay_threads {
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
        if self.config.link_setup {
            // Without CAP_NET_ADMIN (dropped when nothing needs it) this fails; the unit's
            // ExecStopPost removes them then, as it does after a kill.
            if let Err(e) = netlink::release_from_loopback(&standby::lo_addresses(&self.config)) {
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
    let set = |group, given: &Vec<SocketAddr>| {
        if !given.is_empty() {
            counters.upstreams_changed(group, "flag");
        }
        let set = UpstreamSet::counted(given.clone(), group, counters, Instant::now());
        Arc::new(set)
    };
    Arc::new(UpstreamSets {
        vnet_dns: set(UpstreamGroup::VnetDns, &config.node_upstreams),
        kube_dns: set(UpstreamGroup::KubeDns, &config.cluster_upstreams),
        hosts: Default::default(),
    })
}
