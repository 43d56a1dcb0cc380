//! Serving: the relay threads of both listeners, their TCP tasks, discovery, the status line,
//! metrics and the watchdog; on the stop signal the listeners close first, then work in flight
//! gets a moment to finish.

use std::future::Future;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{AbortHandle, JoinHandle};

use super::prepare::Prepared;
use super::standby;
use crate::cache::{Cache, KeyHasher};
use crate::cli::Config;
use crate::discover::follow;
use crate::engine::{self, Engine};
use crate::listen::{Bound, Held};
use crate::mailbox::Mailbox;
use crate::probe::{OwnProbes, Prober};
use crate::relay::{self, Relay, Stop};
use crate::roles::{ListenerRole, UpstreamGroup};
use crate::stats::{Counters, Totals};
use crate::systemd::{self, Heartbeats, Notifier};
use crate::tcp::{self, ClientSide};
use crate::tcp_pool::UpstreamSide;
use crate::upstream::{UpstreamSet, UpstreamSets};
use crate::{link, listen, metrics};

/// How long queries already read may take to finish after the listeners close (TCP clients in
/// the middle of an exchange). LocalDNS is waiting to start, so this stays short.
const DRAIN: Duration = Duration::from_secs(1);
/// How long the first look for upstreams may hold back serving. Queries meanwhile wait in the
/// bound sockets' buffers; a slower look finishes in the background while we serve.
const FIRST_LOOK: Duration = Duration::from_secs(3);
/// Upstream TCP exchanges in flight in the whole process. Each holds a descriptor; with both
/// listeners' client connections (2 x `--max-tcp-connections`, 512 by default) and the UDP
/// sockets this stays well under systemd's default soft limit of 1,024 descriptors.
const MAX_TCP_EXCHANGES: usize = 256;
/// How often a summary line is logged (and systemd's STATUS= refreshed) while serving.
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// Serves until `shutdown`. With `--standby`, the flows go to LocalDNS while it answers (it did at
/// start if `localdns_serves`), and to us while it does not.
pub async fn serve(
    config: Config,
    prepared: Prepared,
    localdns_serves: bool,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    if !config.standby {
        let running = Running::start(config, prepared, Arc::default()).await?;
        shutdown.await;
        running.stop().await;
        return Ok(());
    }
    let prober = Prober::new(&standby::probed(&config), rand::random())
        .map_err(|e| format!("cannot make the standby's probe sockets: {e}"))?;
    let own = Arc::new(OwnProbes::new(prober.ports(), &standby::probed(&config)));
    if localdns_serves {
        // Bound a moment ago with the steering on us: LocalDNS gets its flows back before
        // anything else starts (discovery's first look alone can take seconds).
        for bound in [&prepared.node, &prepared.cluster] {
            if let Ok(h) = Held::new(bound) {
                h.hand_over();
            }
        }
        tracing::info!("LocalDNS answers on both listeners; standing by");
    }
    let running = Running::start(config, prepared, own).await?;
    tokio::select! {
        () = shutdown => {}
        () = standby::stand_by(prober, running.held.clone(), running.config.clone(), localdns_serves) => {}
    }
    running.stop().await;
    Ok(())
}

/// A serving daemon: what its stop needs to reach.
struct Running {
    config: Arc<Config>,
    notifier: Arc<Notifier>,
    /// The listeners' steering and sockets, for the hand-over to LocalDNS at the stop.
    held: Arc<Mutex<Vec<Held>>>,
    /// Keeps `held` on our own sockets; ends first at the stop.
    following: AbortHandle,
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
    /// With nothing to discover, the sender of the upstream sets, kept so receivers never see a
    /// closed channel.
    publish_kept: Option<watch::Sender<Arc<UpstreamSets>>>,
}

/// What the relay threads and TCP tasks of both listeners are started with.
struct Shared<'a> {
    config: &'a Config,
    /// The upstreams as the first look left them; later changes reach the relays by `sets_rx`.
    sets: &'a Arc<UpstreamSets>,
    counters: &'a Arc<Counters>,
    sets_rx: &'a watch::Receiver<Arc<UpstreamSets>>,
    cache: &'a Option<Arc<Mutex<Cache>>>,
    upstream_tcp: &'a Arc<UpstreamSide>,
    heartbeats: &'a Arc<Heartbeats>,
    relay_stop: &'a Arc<Stop>,
    stop_rx: &'a watch::Receiver<bool>,
    drain_tx: &'a mpsc::Sender<()>,
    own_probes: &'a Arc<OwnProbes>,
    /// Client connections per listener, within the descriptor limit.
    tcp_cap: usize,
}

/// One listener, started: its hold on the steering, its relay threads and its TCP task.
struct Started {
    held: Held,
    relay_threads: Vec<std::thread::JoinHandle<()>>,
    tcp: JoinHandle<()>,
}

impl Running {
    /// Starts discovery (waiting up to `FIRST_LOOK` for its first look), both listeners' relay
    /// threads and TCP tasks, then the status line, metrics, the watchdog and the steering's
    /// follower, and tells systemd we are ready.
    async fn start(
        config: Config,
        prepared: Prepared,
        own_probes: Arc<OwnProbes>,
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
        let mut publish_kept = None;
        if owned.node || owned.cluster {
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
        } else {
            publish_kept = Some(publish);
        }
        let sets = sets_rx.borrow().clone();
        let heartbeats = Heartbeats::new(2 * config.udp_threads);
        // One cache for both listeners: the key holds the upstream group, so kube-dns and VNet
        // DNS answers never mix, while a cluster name asked on either listener shares one entry.
        let cache = Cache::new(config.cache, KeyHasher::new(rand::random()))
            .map(|c| Arc::new(Mutex::new(c)));
        let upstream_tcp = Arc::new(UpstreamSide::new(
            tokio::runtime::Handle::current(),
            MAX_TCP_EXCHANGES,
            config.upstream_timeout,
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
        let following = if config.standby {
            tokio::spawn(std::future::pending::<()>()).abort_handle()
        } else {
            tokio::spawn(follow_steering(held.clone())).abort_handle()
        };
        Ok(Running {
            config,
            notifier,
            held,
            following,
            reporting,
            tasks,
            stop_tx,
            relay_stop,
            relay_threads,
            drain_tx,
            drain_rx,
            publish_kept,
        })
    }

    /// Hands new flows to LocalDNS where it has joined our ports, stops the listeners, lets
    /// what is in flight finish for up to `DRAIN`, then detaches the steering and takes the
    /// listener addresses off `lo`.
    async fn stop(self) {
        let Running {
            config,
            notifier,
            held,
            following,
            reporting,
            tasks,
            stop_tx,
            relay_stop,
            relay_threads,
            drain_tx,
            mut drain_rx,
            publish_kept,
        } = self;
        notifier.notify("STOPPING=1");
        following.abort();
        // New flows to LocalDNS first (when it has joined our ports): the relay threads then
        // answer what already reached us before they close.
        let held = std::mem::take(&mut *held.lock().unwrap_or_else(|p| p.into_inner()));
        // Every listener hands over (no short cut), and the drain needs all of them handed.
        let handed: Vec<bool> = held.iter().map(Held::hand_over).collect();
        let handed = handed.iter().all(|&h| h);
        if handed {
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
        // The steering goes right before our last descriptors close, then the addresses on lo.
        for h in held {
            h.release();
        }
        if config.link_setup {
            // Without CAP_NET_ADMIN (dropped when nothing needs it) this fails; the unit's
            // ExecStopPost removes them then, as it does after a kill.
            if let Err(e) = link::release_from_loopback(&super::prepare::link_addresses(&config)) {
                tracing::info!("listener addresses left on lo for the unit to remove: {e}");
            }
        }
        tracing::info!(drained, "stopped");
        drop(publish_kept);
    }
}

/// Descriptors kept for everything but client TCP connections: the TCP exchanges with upstreams,
/// each relay thread's UDP sockets for up to four upstreams per group, and a margin for the
/// listeners, epoll, eventfds, the metrics socket, discovery's pipes and the runtime.
fn other_descriptors(config: &Config) -> usize {
    MAX_TCP_EXCHANGES + 2 * config.udp_threads * config.upstream_sockets * 2 * 4 + 64
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

/// The status line, `/metrics` (if asked for) and the systemd watchdog (if armed).
fn start_reporting(
    notifier: &Arc<Notifier>,
    config: &Arc<Config>,
    sets_rx: &watch::Receiver<Arc<UpstreamSets>>,
    counters: &Arc<Counters>,
    cache: &Option<Arc<Mutex<Cache>>>,
    heartbeats: &Arc<Heartbeats>,
    metrics_listener: Option<tokio::net::TcpListener>,
) -> Vec<AbortHandle> {
    let mut reporting = vec![
        tokio::spawn(report_status(
            notifier.clone(),
            config.clone(),
            sets_rx.clone(),
            counters.clone(),
        ))
        .abort_handle(),
    ];
    if let Some(listener) = metrics_listener {
        tracing::info!(addr = ?listener.local_addr().ok(), "serving /metrics");
        reporting.push(
            tokio::spawn(metrics::serve(
                listener,
                counters.clone(),
                sets_rx.clone(),
                cache.clone(),
            ))
            .abort_handle(),
        );
    }
    if let Some(timeout) = Notifier::watchdog_timeout() {
        tracing::info!(?timeout, "feeding the systemd watchdog");
        reporting.push(
            tokio::spawn(systemd::watchdog(
                notifier.clone(),
                heartbeats.clone(),
                timeout,
            ))
            .abort_handle(),
        );
    }
    reporting
}

/// Starts one listener: `--udp-threads` relay threads on its UDP socket (heartbeats from
/// `index * threads`) and the task that accepts its TCP connections.
fn start_listener(
    shared: &Shared<'_>,
    index: usize,
    role: ListenerRole,
    bound: Bound,
) -> Result<Started, String> {
    let config = shared.config;
    let threads = config.udp_threads;
    let sets = shared.sets;
    log_listener(role, bound.addr, sets, config, &bound.udp);
    let held =
        Held::new(&bound).map_err(|e| format!("cannot keep the sockets of {}: {e}", bound.addr))?;
    // Each thread has its own engine, upstream sockets, pending queries and timers; they share
    // the listener socket itself, and epoll wakes one of them per datagram.
    let mut mailboxes = Vec::new();
    let mut relay_threads = Vec::new();
    for t in 0..threads {
        let udp = bound
            .udp
            .try_clone()
            .map_err(|e| format!("cannot share the UDP socket of {}: {e}", bound.addr))?;
        let settings = engine::Settings {
            cluster_domain: config.cluster_domain_wire.clone(),
            upstream_timeout: config.upstream_timeout,
            query_timeout: config.query_timeout,
            max_inflight: config.max_inflight,
            udp_sockets_per_upstream: config.upstream_sockets,
            ..engine::Settings::default()
        };
        let stats = shared.counters.listener(role).clone();
        let engine = Engine::new(
            role,
            settings,
            sets.clone(),
            shared.cache.clone(),
            stats.clone(),
            rand::random(),
        );
        let mailbox = Mailbox::new().map_err(|e| format!("cannot make an eventfd: {e}"))?;
        mailboxes.push(mailbox.clone());
        let relay = Relay {
            engine,
            listener: udp,
            sockets_per_upstream: config.upstream_sockets,
            mailbox,
            tcp: shared.upstream_tcp.clone(),
            upstreams: shared.sets_rx.clone(),
            stats,
            stop: shared.relay_stop.clone(),
            heartbeat: (shared.heartbeats.clone(), index * threads + t),
            drain: DRAIN,
            own_probes: shared.own_probes.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("relay-{}-{t}", role.name()))
            .spawn(move || relay::run(relay))
            .map_err(|e| format!("cannot start a relay thread: {e}"))?;
        relay_threads.push(thread);
    }
    drop(bound.udp);
    let side = Arc::new(ClientSide::new(
        role,
        mailboxes,
        shared.tcp_cap,
        config.tcp_idle_timeout,
        config.query_timeout,
    ));
    let listener = tokio::net::TcpListener::from_std(bound.tcp)
        .map_err(|e| format!("cannot register TCP socket {}: {e}", bound.addr))?;
    let tcp = tokio::spawn(tcp::serve(
        listener,
        side,
        shared.stop_rx.clone(),
        shared.drain_tx.clone(),
    ));
    Ok(Started {
        held,
        relay_threads,
        tcp,
    })
}

/// How often our place in the ports' SO_REUSEPORT groups is looked at while we serve. Our place
/// moves only when a member that joined before us leaves: an orphaned CoreDNS, or, during
/// `systemctl restart localdns`, the old LocalDNS server, whose index the new one takes when it
/// binds. Until we follow, the steering program sends every flow to that index, so a second here
/// was 0.8 s of pods dark on each restart. The look reads /proc/net, which walks the kernel's
/// socket table and holds up packet processing for a moment; it is skipped while we are first
/// in the group (our place cannot move then), which is the usual case.
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

/// Keeps systemd's STATUS= line current (what is served, by whom, how it went in the last
/// minute), so `systemctl status` tells at a glance, and logs the same summary every minute.
async fn report_status(
    notifier: Arc<Notifier>,
    config: Arc<Config>,
    mut sets: watch::Receiver<Arc<UpstreamSets>>,
    counters: Arc<Counters>,
) {
    let mut ticker =
        tokio::time::interval_at(tokio::time::Instant::now() + SUMMARY_EVERY, SUMMARY_EVERY);
    let mut last = counters.totals();
    let mut minute = Totals::default();
    loop {
        let (vnet_dns, kube_dns) = {
            let s = sets.borrow_and_update();
            (list(&s.vnet_dns), list(&s.kube_dns))
        };
        notifier.notify(&format!(
            "STATUS=serving {} and {}; last minute: {} answers, {} SERVFAIL, {} stale, {} shed; VNet DNS: {vnet_dns}; kube-dns: {kube_dns}",
            config.node_listen,
            config.cluster_listen,
            minute.answers,
            minute.servfail,
            minute.stale,
            minute.shed
        ));
        tokio::select! {
            _ = ticker.tick() => {
                let now = counters.totals();
                minute = now.since(last);
                last = now;
                tracing::info!(
                    answers = minute.answers,
                    servfail = minute.servfail,
                    stale = minute.stale,
                    shed = minute.shed,
                    vnet_dns,
                    kube_dns,
                    "serving; the last minute"
                );
            }
            changed = sets.changed() => if changed.is_err() { return },
        }
    }
}

fn list(u: &UpstreamSet) -> String {
    if u.is_empty() {
        return "none".to_string();
    }
    u.addrs()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

fn log_listener(
    role: ListenerRole,
    addr: SocketAddr,
    sets: &UpstreamSets,
    config: &Config,
    udp: &UdpSocket,
) {
    let (recv_buffer, send_buffer) = listen::buffers(udp);
    match role {
        ListenerRole::Node => tracing::info!(
            listener = role.name(),
            %addr,
            vnet_dns = ?sets.vnet_dns.addrs(),
            kube_dns = ?sets.kube_dns.addrs(),
            cluster_domain = %config.cluster_domain,
            recv_buffer,
            send_buffer,
            "serving UDP and TCP: the cluster domain goes to kube-dns, all else to the VNet DNS"
        ),
        ListenerRole::Cluster => tracing::info!(
            listener = role.name(),
            %addr,
            kube_dns = ?sets.kube_dns.addrs(),
            recv_buffer,
            send_buffer,
            "serving UDP and TCP: every name goes to kube-dns"
        ),
    }
}
