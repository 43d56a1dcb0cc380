//! One listener, started: `--udp-threads` relay threads sharing its UDP socket, each with an
//! engine of its own, and the task that accepts its TCP connections and hands their queries to
//! those threads.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cache::Cache;
use crate::cli::Config;
use crate::engine::Engine;
use crate::listen::{self, Bound, Held};
use crate::mailbox::Mailbox;
use crate::relay::{self, Relay};
use crate::roles::ListenerRole;
use crate::standby::{OwnProbes, Strays};
use crate::stats::Counters;
use crate::stop::Stop;
use crate::systemd::Heartbeats;
use crate::tcp::{self, ClientSide};
use crate::tcp_pool::UpstreamSide;
use crate::upstream::UpstreamSets;

/// What the relay threads and TCP tasks of both listeners, and the reporting tasks, are started
/// with.
pub(super) struct Shared<'a> {
    pub(super) config: &'a Config,
    pub(super) counters: &'a Arc<Counters>,
    /// The upstreams: each engine starts with the sets in it, and is given later ones through it.
    pub(super) sets_rx: &'a watch::Receiver<Arc<UpstreamSets>>,
    pub(super) cache: &'a Option<Arc<Mutex<Cache>>>,
    pub(super) upstream_tcp: &'a Arc<UpstreamSide>,
    pub(super) heartbeats: &'a Arc<Heartbeats>,
    pub(super) stop: &'a Arc<Stop>,
    pub(super) own_probes: &'a Arc<OwnProbes>,
    pub(super) strays: &'a Arc<Strays>,
    /// Client connections per listener, within the descriptor limit.
    pub(super) tcp_cap: usize,
}

/// What the listeners started: their holds on the steering, their relay threads, the tasks that
/// accept their TCP connections, and those connections.
#[derive(Default)]
pub(super) struct Started {
    pub(super) held: Vec<Held>,
    pub(super) relay_threads: Vec<std::thread::JoinHandle<()>>,
    pub(super) tcp: Vec<JoinHandle<()>>,
    pub(super) tcp_sides: Vec<Arc<ClientSide>>,
}

/// Starts one listener, into `started`: `--udp-threads` relay threads on its UDP socket
/// (heartbeats from `role as usize * threads`) and the task that accepts its TCP connections.
pub(super) fn start_listener(
    shared: &Shared<'_>,
    role: ListenerRole,
    bound: Bound,
    started: &mut Started,
) -> Result<(), String> {
    let config = shared.config;
    let threads = config.udp_threads;
    let sets = shared.sets_rx.borrow().clone();
    let (recv_buffer, send_buffer) = listen::buffers(&bound.udp);
    tracing::info!(
        listener = role.name(),
        addr = %bound.addr,
        routes = %config.routes_shown(role).join(" "),
        vnet_dns = ?sets.vnet_dns.addrs(),
        kube_dns = ?sets.kube_dns.addrs(),
        recv_buffer,
        send_buffer,
        "serving UDP and TCP"
    );
    // Each thread has its own engine, upstream sockets, pending queries and timers; they share
    // the listener socket itself, and epoll wakes one of them per datagram.
    let mut mailboxes = Vec::new();
    for t in 0..threads {
        let udp = bound
            .udp
            .try_clone()
            .map_err(|e| format!("cannot share the UDP socket of {}: {e}", bound.addr))?;
        let stats = shared.counters.listener(role).clone();
        let engine = Engine::new(
            role,
            config.engine.clone(),
            config.routes(),
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
            sockets_per_upstream: config.engine.udp_sockets_per_upstream,
            mailbox,
            tcp: shared.upstream_tcp.clone(),
            upstreams: shared.sets_rx.clone(),
            stats,
            stop: shared.stop.clone(),
            heartbeat: (shared.heartbeats.clone(), role as usize * threads + t),
            own_probes: shared.own_probes.clone(),
            strays: shared.strays.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("relay-{}-{t}", role.name()))
            .spawn(move || relay::run(relay))
            .map_err(|e| format!("cannot start a relay thread: {e}"))?;
        started.relay_threads.push(thread);
    }
    drop(bound.udp);
    let side = Arc::new(ClientSide::new(
        role,
        mailboxes,
        shared.tcp_cap,
        config.tcp_idle_timeout,
        config.engine.query_timeout,
    ));
    let listener = tokio::net::TcpListener::from_std(bound.tcp)
        .map_err(|e| format!("cannot register TCP socket {}: {e}", bound.addr))?;
    let tcp = tokio::spawn(tcp::serve(listener, side.clone(), shared.stop.clone()));
    started.held.push(bound.held);
    started.tcp.push(tcp);
    started.tcp_sides.push(side);
    Ok(())
}
