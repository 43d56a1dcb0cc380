//! Start-up and shutdown: binds both listeners, starts their UDP relays and TCP acceptors, and on
//! the stop signal closes the listeners first, then gives work in flight a moment to finish.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::net::UdpSocket;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use crate::cache::Cache;
use crate::cli::Config;
use crate::discover::Source;
use crate::discover::follow::{self, Owned};
use crate::forward::{self, Groups, Listener, TcpContext, UdpRelay};
use crate::metrics::{self, Metrics};
use crate::systemd::{self, Heartbeats, Notifier};
use crate::upstream::{Group, Upstreams};
use crate::{link, listen, privilege};

/// How long queries already read may take to finish after the listeners close (TCP clients in
/// the middle of an exchange). LocalDNS is waiting to start, so this stays short.
const DRAIN: Duration = Duration::from_secs(1);
/// How long the first look for upstreams may hold back serving. Queries meanwhile wait in the
/// bound sockets' buffers; a slower look finishes in the background while we serve.
const FIRST_LOOK: Duration = Duration::from_secs(3);

/// Serves until `shutdown` completes, then stops cleanly.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), String> {
    let config = Arc::new(config);
    let metrics = Metrics::new();
    let groups = Arc::new(Groups {
        node: Arc::new(Upstreams::counted(
            config.node_upstreams.clone(),
            Group::Node,
            &metrics,
        )),
        cluster: Arc::new(Upstreams::counted(
            config.cluster_upstreams.clone(),
            Group::Cluster,
            &metrics,
        )),
    });
    for (group, given) in [
        (Group::Node, &config.node_upstreams),
        (Group::Cluster, &config.cluster_upstreams),
    ] {
        if !given.is_empty() {
            metrics.upstreams_changed(group, "flag");
        }
    }
    // Discovery publishes new upstream sets here; workers pick them up between datagrams.
    let (publish, groups_rx) = watch::channel(groups);
    let (stop_tx, stop_rx) = watch::channel(false);
    let udp_stop = forward::Stop::new().map_err(|e| format!("cannot make an eventfd: {e}"))?;
    let mut udp_threads = Vec::new();
    let (drain_tx, mut drain_rx) = mpsc::channel::<()>(1);
    let notifier = Arc::new(Notifier::from_env());

    if config.link_setup {
        set_up_link(&config)?;
    }
    let metrics_listener = match config.metrics {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?,
        ),
        None => None,
    };
    let (node, cluster) = tokio::try_join!(
        listen::bind_listener(config.node_listen, config.bind_timeout),
        listen::bind_listener(config.cluster_listen, config.bind_timeout),
    )?;

    let owned = Owned {
        node: config.node_upstreams.is_empty(),
        cluster: config.cluster_upstreams.is_empty(),
    };
    drop_privileges(&config, owned);
    let mut tasks = Vec::new();
    let mut _publish_kept = None;
    if owned.node || owned.cluster {
        let (first_tx, first_rx) = oneshot::channel();
        let listeners = vec![config.node_listen.ip(), config.cluster_listen.ip()];
        tasks.push(tokio::spawn(follow::follow(
            config.discovery.clone(),
            owned,
            listeners,
            publish,
            metrics.clone(),
            first_tx,
            stop_rx.clone(),
        )));
        if tokio::time::timeout(FIRST_LOOK, first_rx).await.is_err() {
            tracing::warn!(
                "the first look for upstreams takes over {FIRST_LOOK:?}; serving meanwhile"
            );
        }
    } else {
        // Nothing to discover; the sender stays alive so receivers never see a closed channel.
        _publish_kept = Some(publish);
    }
    let groups = groups_rx.borrow().clone();
    let threads = config.udp_threads;
    let heartbeats = Heartbeats::new(2 * threads);
    // One cache for both listeners: the key holds the upstream group, so cluster and VNet answers
    // never mix, while a cluster name asked on either listener shares one entry.
    let cache = Cache::new(config.cache).map(|c| Arc::new(Mutex::new(c)));

    for (index, (listener, bound, addr)) in [
        (Listener::Node, node, config.node_listen),
        (Listener::Cluster, cluster, config.cluster_listen),
    ]
    .into_iter()
    .enumerate()
    {
        log_listener(listener, addr, &groups, &config, &bound.udp);
        // Each thread has its own upstream sockets, pending queries and timers; they share the
        // listener socket itself (one bind, no SO_REUSEPORT), and epoll wakes one of them per
        // datagram.
        for t in 0..threads {
            let udp = bound
                .udp
                .try_clone()
                .map_err(|e| format!("cannot share the UDP socket of {addr}: {e}"))?;
            let (v4, v6) = upstream_pool(&config, &groups, listener, owned);
            let relay = UdpRelay::new(
                listener,
                &config,
                groups.clone(),
                cache.clone(),
                metrics.clone(),
                (v4.len(), v6.len()),
            );
            let pool = v4.into_iter().chain(v6).collect();
            let (relay_groups, stop, beats) =
                (groups_rx.clone(), udp_stop.clone(), heartbeats.clone());
            let beat = index * threads + t;
            let thread = std::thread::Builder::new()
                .name(format!("udp-{}-{t}", listener.name()))
                .spawn(move || {
                    forward::serve_udp(udp, pool, relay, relay_groups, stop, (beats, beat))
                })
                .map_err(|e| format!("cannot start a UDP thread: {e}"))?;
            udp_threads.push(thread);
        }
        drop(bound.udp);
        let ctx = Arc::new(TcpContext {
            listener,
            config: config.clone(),
            groups: groups_rx.clone(),
            cache: cache.clone(),
            metrics: metrics.clone(),
            connections: Arc::new(Semaphore::new(config.max_tcp_connections)),
        });
        tasks.push(tokio::spawn(forward::serve_tcp(
            bound.tcp,
            ctx,
            stop_rx.clone(),
            drain_tx.clone(),
        )));
    }
    tracing::info!("ready");
    notifier.notify("READY=1");
    let status = tokio::spawn(report_status(
        notifier.clone(),
        config.clone(),
        groups_rx.clone(),
        metrics.clone(),
    ));
    let metrics_server = metrics_listener.map(|listener| {
        tracing::info!(addr = ?listener.local_addr().ok(), "serving /metrics");
        tokio::spawn(metrics::serve(
            listener,
            metrics.clone(),
            groups_rx.clone(),
            cache.clone(),
        ))
    });
    let watchdog = Notifier::watchdog_timeout().map(|timeout| {
        tracing::info!(?timeout, "feeding the systemd watchdog");
        tokio::spawn(systemd::watchdog(
            notifier.clone(),
            heartbeats.clone(),
            timeout,
        ))
    });

    shutdown.await;
    notifier.notify("STOPPING=1");
    tracing::info!("stopping: closing listeners");
    status.abort();
    if let Some(m) = metrics_server {
        m.abort();
    }
    if let Some(w) = watchdog {
        w.abort();
    }
    let _ = stop_tx.send(true);
    udp_stop.stop();
    for thread in udp_threads {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    for task in tasks {
        let _ = task.await;
    }
    tracing::info!("listeners closed; draining queries in flight");
    drop(drain_tx);
    let drained = tokio::time::timeout(DRAIN, drain_rx.recv()).await.is_ok();
    tracing::info!(drained, "stopped");
    Ok(())
}

/// Everything that needed privilege is done (ports bound, link set up): keep only what discovery
/// still needs to read kube-proxy's rules, or nothing at all.
fn drop_privileges(config: &Config, owned: Owned) {
    if !nix::unistd::geteuid().is_root() {
        tracing::debug!("not root: no capabilities to drop");
        return;
    }
    let reads_rules = owned.cluster
        && config
            .discovery
            .sources
            .iter()
            .any(|s| matches!(s, Source::Iptables | Source::Nftables | Source::Ipvs));
    // iptables, nft and ipvsadm talk netlink/netfilter (CAP_NET_ADMIN); iptables-legacy also opens
    // a raw socket (CAP_NET_RAW).
    let keep: Vec<u32> = if reads_rules {
        vec![privilege::CAP_NET_ADMIN, privilege::CAP_NET_RAW]
    } else {
        Vec::new()
    };
    match privilege::keep_only(&keep) {
        Ok(()) => tracing::info!(kept = ?privilege::names(&keep), "dropped every other capability"),
        Err(e) => tracing::warn!("{e}; running with the capabilities it was started with"),
    }
}

/// Makes sure link `localdns` exists, is up and carries the listener addresses. Loopback and
/// wildcard listen addresses (tests, odd setups) are not put on the link.
fn set_up_link(config: &Config) -> Result<(), String> {
    let addrs: Vec<IpAddr> = [config.node_listen.ip(), config.cluster_listen.ip()]
        .into_iter()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .collect();
    let outcome = link::ensure(link::LINK_NAME, &addrs)?;
    tracing::info!(
        link = link::LINK_NAME,
        created = outcome.created.unwrap_or("no, it was there"),
        added = ?outcome.added,
        already_there = ?outcome.present,
        "listener addresses in place"
    );
    Ok(())
}

/// How often a summary line is logged (and systemd's STATUS= refreshed) while serving.
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// Keeps systemd's STATUS= line current (what is served, by whom, how it went in the last
/// minute), so `systemctl status` tells at a glance, and logs the same summary every minute.
async fn report_status(
    notifier: Arc<Notifier>,
    config: Arc<Config>,
    mut groups: watch::Receiver<Arc<Groups>>,
    metrics: Arc<Metrics>,
) {
    let mut ticker =
        tokio::time::interval_at(tokio::time::Instant::now() + SUMMARY_EVERY, SUMMARY_EVERY);
    let mut last = metrics.totals();
    let mut minute = (0, 0, 0, 0);
    loop {
        let (vnet_dns, kube_dns) = {
            let g = groups.borrow_and_update();
            (list(&g.node), list(&g.cluster))
        };
        notifier.notify(&format!(
            "STATUS=serving {} and {}; last minute: {} answers, {} SERVFAIL, {} stale, {} shed; VNet DNS: {vnet_dns}; kube-dns: {kube_dns}",
            config.node_listen, config.cluster_listen, minute.0, minute.1, minute.2, minute.3
        ));
        tokio::select! {
            _ = ticker.tick() => {
                let now = metrics.totals();
                minute = (now.0 - last.0, now.1 - last.1, now.2 - last.2, now.3 - last.3);
                last = now;
                tracing::info!(
                    answers = minute.0,
                    servfail = minute.1,
                    stale = minute.2,
                    shed = minute.3,
                    vnet_dns,
                    kube_dns,
                    "serving; the last minute"
                );
            }
            changed = groups.changed() => if changed.is_err() { return },
        }
    }
}

fn list(u: &Upstreams) -> String {
    if u.is_empty() {
        return "none".to_string();
    }
    u.addrs()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The upstream sockets of one listener: `--upstream-sockets` per address family that its groups
/// may use. An IPv6 pool that cannot be created (IPv6 disabled on the node) is logged and left empty.
fn upstream_pool(
    config: &Config,
    groups: &Groups,
    listener: Listener,
    owned: Owned,
) -> (Vec<UdpSocket>, Vec<UdpSocket>) {
    let mut addrs: Vec<SocketAddr> = groups.cluster.addrs().to_vec();
    if listener == Listener::Node {
        addrs.extend_from_slice(groups.node.addrs());
    }
    let make = |ipv6: bool| -> Vec<UdpSocket> {
        (0..config.upstream_sockets)
            .map_while(|_| match listen::upstream_socket(ipv6) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(ipv6, error = %e, "cannot open an upstream socket");
                    None
                }
            })
            .collect()
    };
    let v4 = make(false);
    // Discovered upstreams may turn out to be IPv6 later, so discovery always gets an IPv6 pool.
    let v6 = if owned.node || owned.cluster || addrs.iter().any(SocketAddr::is_ipv6) {
        make(true)
    } else {
        Vec::new()
    };
    (v4, v6)
}

fn log_listener(
    listener: Listener,
    addr: SocketAddr,
    groups: &Groups,
    config: &Config,
    udp: &UdpSocket,
) {
    let (recv_buffer, send_buffer) = listen::buffers(udp);
    match listener {
        Listener::Node => tracing::info!(
            listener = listener.name(),
            %addr,
            vnet_dns = ?groups.node.addrs(),
            kube_dns = ?groups.cluster.addrs(),
            cluster_domain = %config.cluster_domain,
            recv_buffer,
            send_buffer,
            "serving UDP and TCP: the cluster domain goes to kube-dns, all else to the VNet DNS"
        ),
        Listener::Cluster => tracing::info!(
            listener = listener.name(),
            %addr,
            kube_dns = ?groups.cluster.addrs(),
            recv_buffer,
            send_buffer,
            "serving UDP and TCP: every name goes to kube-dns"
        ),
    }
}
