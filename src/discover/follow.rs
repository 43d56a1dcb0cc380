//! Following the node while serving: re-reads resolv.conf when it changes, looks for kube-dns
//! every `--rediscover-interval` (and early when upstreams keep failing), and publishes each new
//! upstream set whole. Workers pick a new set up between datagrams; queries in flight finish
//! against the set they started with.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use super::{KubeDnsFinding, Settings, explain, find_kube_dns, resolv_conf};
use crate::roles::UpstreamGroup;
use crate::stats::Counters;
use crate::upstream::{UpstreamSet, UpstreamSets};

/// How often resolv.conf is checked (a `stat`; read only when it changed).
const RESOLV_CONF_CHECK: Duration = Duration::from_secs(1);
/// Upstream failures since the last look that make kube-dns worth looking for again at once:
/// a backend pod went away and its replacement is probably already in the node's rules.
const FAILURES_BEFORE_EARLY_LOOK: u64 = 3;
/// Never look for kube-dns more often than this, however much fails.
const EARLIEST_LOOK: Duration = Duration::from_secs(1);
/// A look may cost at most this share of one core: on a huge cluster one `nft -j list table`
/// takes seconds of CPU, and the node is already in trouble.
const LOOK_DUTY: u32 = 10;

/// Which groups discovery owns: a group given by flags is never touched.
#[derive(Clone, Copy, Debug)]
pub struct Owned {
    pub node: bool,
    pub cluster: bool,
}

/// Runs until `stop`. `first_pass` is sent once both groups have been looked for once, so the
/// server can start answering with upstreams rather than SERVFAIL when the node has them.
pub async fn follow(
    settings: Settings,
    owned: Owned,
    listeners: Vec<IpAddr>,
    publish: watch::Sender<Arc<UpstreamSets>>,
    metrics: Arc<Counters>,
    first_pass: oneshot::Sender<()>,
    mut stop: watch::Receiver<bool>,
) {
    let settings = Arc::new(settings);
    let mut first_pass = Some(first_pass);
    let mut resolv_stamp = None;
    let mut node_said = None::<String>;
    let mut cluster_said = None::<String>;
    let mut last_look: Option<Instant> = None;
    let mut look_took = Duration::ZERO;
    let mut failures_at_look = 0;
    loop {
        if owned.node {
            let stamp = resolv_conf::stamp(&settings.resolv_conf);
            if stamp.is_none() || stamp != resolv_stamp {
                resolv_stamp = stamp;
                let found = resolv_conf::read(&settings.resolv_conf, &listeners);
                node_update(&publish, &metrics, &settings, found, &mut node_said);
            }
        }
        if owned.cluster {
            let failures = publish.borrow().kube_dns.failures();
            let pace = look_took * LOOK_DUTY;
            let due = last_look.is_none_or(|t| {
                let since = t.elapsed();
                since >= settings.interval.max(pace)
                    || (failures >= failures_at_look + FAILURES_BEFORE_EARLY_LOOK
                        && since >= EARLIEST_LOOK.max(pace))
            });
            if due {
                let started = Instant::now();
                last_look = Some(started);
                failures_at_look = failures;
                let s = settings.clone();
                if let Ok(finding) = tokio::task::spawn_blocking(move || find_kube_dns(&s)).await {
                    cluster_update(&publish, &metrics, &settings, finding, &mut cluster_said);
                }
                look_took = started.elapsed();
            }
        }
        if let Some(tx) = first_pass.take() {
            let _ = tx.send(());
        }
        tokio::select! {
            _ = tokio::time::sleep(RESOLV_CONF_CHECK) => {}
            _ = stop.changed() => return,
        }
    }
}

fn node_update(
    publish: &watch::Sender<Arc<UpstreamSets>>,
    metrics: &Counters,
    settings: &Settings,
    found: Result<Vec<SocketAddr>, String>,
    said: &mut Option<String>,
) {
    let path = settings.resolv_conf.display();
    match found {
        Ok(servers) if !servers.is_empty() => {
            swap(
                publish,
                metrics,
                UpstreamGroup::VnetDns,
                servers,
                &format!("resolv.conf {path}"),
            );
            *said = None;
        }
        // Keep the last good set: the file lists only our own listener while LocalDNS's drop-in
        // is being removed, and a missing file is no reason to forget working servers.
        other => {
            let why = match other {
                Err(e) => e,
                Ok(_) => format!(
                    "{path} lists no VNet DNS server (only our listeners or loopback stubs)"
                ),
            };
            if said.as_deref() != Some(why.as_str()) {
                let serving = !publish.borrow().vnet_dns.is_empty();
                if serving {
                    tracing::warn!("{why}; keeping the VNet DNS servers found before");
                } else {
                    tracing::warn!(
                        "{why}; the node listener answers SERVFAIL for external names until one appears"
                    );
                }
                *said = Some(why);
            }
        }
    }
}

fn cluster_update(
    publish: &watch::Sender<Arc<UpstreamSets>>,
    metrics: &Counters,
    settings: &Settings,
    finding: KubeDnsFinding,
    said: &mut Option<String>,
) {
    if let Some(source) = finding.source {
        swap(
            publish,
            metrics,
            UpstreamGroup::KubeDns,
            finding.upstreams,
            source.name(),
        );
        *said = None;
        return;
    }
    let why = format!(
        "no backends of {} found ({})",
        settings.service,
        explain(&finding.notes)
    );
    if said.as_deref() != Some(why.as_str()) {
        if publish.borrow().kube_dns.is_empty() {
            tracing::warn!("{why}; the cluster listener answers SERVFAIL until some are found");
        } else {
            tracing::warn!("{why}; keeping the kube-dns servers found before");
        }
        *said = Some(why);
    }
}

/// Publishes `servers` for `group` if they differ from the set in force.
fn swap(
    publish: &watch::Sender<Arc<UpstreamSets>>,
    metrics: &Counters,
    group: UpstreamGroup,
    servers: Vec<SocketAddr>,
    source: &str,
) {
    let current = publish.borrow().clone();
    let old = current.get(group);
    if old.same_servers(&servers) {
        return;
    }
    tracing::info!(
        group = group.name(),
        source,
        old = ?old.addrs(),
        new = ?servers,
        "upstreams changed"
    );
    metrics.upstreams_changed(group, source);
    let fresh = Arc::new(UpstreamSet::counted(servers, group, metrics));
    let sets = match group {
        UpstreamGroup::VnetDns => UpstreamSets {
            vnet_dns: fresh,
            kube_dns: current.kube_dns.clone(),
        },
        UpstreamGroup::KubeDns => UpstreamSets {
            vnet_dns: current.vnet_dns.clone(),
            kube_dns: fresh,
        },
    };
    publish.send_replace(Arc::new(sets));
}
