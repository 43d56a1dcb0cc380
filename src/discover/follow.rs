//! Following the node while serving: re-reads resolv.conf and the hosts file when they change
//! (and the DHCP leases while resolv.conf names no VNet DNS), looks for kube-dns every
//! `--rediscover-interval` (and early when upstreams keep failing), and publishes each new
//! upstream set (with the hosts file's table) whole. Workers pick a new set up
//! between datagrams; queries in flight finish against the set they started with.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use super::{KubeDnsFinding, Settings, explain, find_kube_dns, hosts, leases, resolv_conf};
use crate::roles::UpstreamGroup;
use crate::stats::Counters;
use crate::upstream::{UpstreamSet, UpstreamSets};

/// How often resolv.conf is checked (a `stat`; read only when it changed).
const RESOLV_CONF_CHECK: Duration = Duration::from_secs(1);
/// How often while the node listener has no VNet DNS at all: every external name asked on it
/// gets SERVFAIL meanwhile, so the real servers are taken up within this of resolv.conf (or a
/// lease) naming them. A `stat` or two each time.
const RESOLV_CONF_CHECK_WHILE_NONE: Duration = Duration::from_millis(100);
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

/// Runs until dropped. `first_pass` is sent once both groups have been looked for once, so the
/// server can start answering with upstreams rather than SERVFAIL when the node has them.
pub async fn follow(
    settings: Settings,
    owned: Owned,
    listeners: Vec<IpAddr>,
    publish: watch::Sender<Arc<UpstreamSets>>,
    metrics: Arc<Counters>,
    first_pass: oneshot::Sender<()>,
) {
    let settings = Arc::new(settings);
    let out = Publisher { publish, metrics };
    let mut first_pass = Some(first_pass);
    let mut node = VnetDnsFollower::new(&settings, listeners);
    let mut hosts_file = hosts::Follower::new(settings.hosts_file.clone());
    let mut cluster_said = None::<String>;
    let mut last_look: Option<Instant> = None;
    let mut look_took = Duration::ZERO;
    let mut failures_at_look = 0;
    loop {
        if let Some(table) = hosts_file.check() {
            out.publish
                .send_modify(|sets| Arc::make_mut(sets).hosts = Arc::new(table));
        }
        if owned.node {
            node.check(&out);
        }
        if owned.cluster {
            let failures = out.publish.borrow().kube_dns.failures();
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
                    cluster_update(&out, &settings, finding, &mut cluster_said);
                }
                look_took = started.elapsed();
            }
        }
        if let Some(tx) = first_pass.take() {
            let _ = tx.send(());
        }
        let next = if owned.node && out.publish.borrow().vnet_dns.is_empty() {
            RESOLV_CONF_CHECK_WHILE_NONE
        } else {
            RESOLV_CONF_CHECK
        };
        tokio::time::sleep(next).await;
    }
}

/// The VNet DNS side of following: resolv.conf first; the DHCP leases while resolv.conf names
/// no usable server and none of its servers were ever in force.
#[derive(Default)]
struct VnetDnsFollower {
    /// Where resolv.conf and the DHCP leases are.
    settings: Arc<Settings>,
    /// Our own listener addresses: never an upstream (the loop guard).
    listeners: Vec<IpAddr>,
    resolv_stamp: Option<resolv_conf::Stamp>,
    leases_stamp: Option<resolv_conf::Stamp>,
    /// Why resolv.conf gives nothing usable right now, and whether that is because it cannot
    /// be read (else it names no server but our listeners or loopback stubs); `None`: it does.
    resolv_problem: Option<(String, bool)>,
    /// resolv.conf's servers were in force once: they are kept from then on, never the leases'.
    resolv_conf_served: bool,
    /// The last complaint logged, so each is logged once.
    said: Option<String>,
}

impl VnetDnsFollower {
    fn new(settings: &Arc<Settings>, listeners: Vec<IpAddr>) -> VnetDnsFollower {
        VnetDnsFollower {
            settings: settings.clone(),
            listeners,
            ..VnetDnsFollower::default()
        }
    }

    /// A `stat` of resolv.conf (and of the lease directory while it is in use); a file is read
    /// only when it changed or is missing.
    fn check(&mut self, out: &Publisher) {
        let stamp = resolv_conf::stamp(&self.settings.resolv_conf);
        let resolv_changed = stamp.is_none() || stamp != self.resolv_stamp;
        if resolv_changed {
            self.resolv_stamp = stamp;
            let path = self.settings.resolv_conf.display();
            match resolv_conf::read(&self.settings.resolv_conf, &self.listeners) {
                Ok(servers) if !servers.is_empty() => {
                    out.swap(
                        UpstreamGroup::VnetDns,
                        servers,
                        &format!("resolv.conf {path}"),
                    );
                    self.resolv_conf_served = true;
                    self.resolv_problem = None;
                    self.said = None;
                    return;
                }
                Err(e) => self.resolv_problem = Some((e, true)),
                Ok(_) => {
                    let why = format!(
                        "{path} lists no VNet DNS server (only our listeners or loopback stubs)"
                    );
                    self.resolv_problem = Some((why, false));
                }
            }
        }
        let Some((why, unreadable)) = self.resolv_problem.clone() else {
            return;
        };
        // Servers resolv.conf named are kept over the leases: the file lists only our own
        // listener while LocalDNS's drop-in is in place, and a missing file is no reason to
        // forget working servers; it holds what the node is configured to use.
        if self.resolv_conf_served {
            // Naming only our listener is what resolv.conf does whenever LocalDNS starts again
            // (its drop-in is back) while we still serve: nothing to warn about. A file that
            // cannot be read is.
            let level = if unreadable {
                tracing::Level::WARN
            } else {
                tracing::Level::INFO
            };
            self.say(
                level,
                format!("{why}; keeping the VNet DNS servers found before"),
            );
            return;
        }
        if let Some(dir) = &self.settings.dhcp_leases {
            // networkd replaces a lease by a rename, which changes the directory's stamp.
            let stamp = resolv_conf::stamp(dir);
            if !resolv_changed && stamp.is_some() && stamp == self.leases_stamp {
                return;
            }
            self.leases_stamp = stamp;
        }
        let leases_said =
            match leases::servers(self.settings.dhcp_leases.as_deref(), &self.listeners) {
                Ok((servers, source)) => {
                    out.swap(UpstreamGroup::VnetDns, servers, &source);
                    self.say(
                        tracing::Level::INFO,
                        format!("{why}; using the VNet DNS servers of the {source} meanwhile"),
                    );
                    return;
                }
                Err(e) => e,
            };
        let serving = !out.publish.borrow().vnet_dns.is_empty();
        let then = if serving {
            "keeping the VNet DNS servers found before"
        } else {
            out.metrics
                .looked(UpstreamGroup::VnetDns, &format!("{why}; {leases_said}"));
            "the node listener answers SERVFAIL for external names until one appears"
        };
        self.say(
            tracing::Level::WARN,
            format!("{why}; {leases_said}; {then}"),
        );
    }

    fn say(&mut self, level: tracing::Level, what: String) {
        if self.said.as_deref() == Some(what.as_str()) {
            return;
        }
        if level == tracing::Level::INFO {
            tracing::info!("{what}");
        } else {
            tracing::warn!("{what}");
        }
        self.said = Some(what);
    }
}

fn cluster_update(
    out: &Publisher,
    settings: &Settings,
    finding: KubeDnsFinding,
    said: &mut Option<String>,
) {
    if let Some(source) = finding.source {
        out.swap(UpstreamGroup::KubeDns, finding.upstreams, source.name());
        *said = None;
        return;
    }
    let looked = explain(&finding.notes);
    let why = format!("no backends of {} found ({looked})", settings.service);
    if said.as_deref() != Some(why.as_str()) {
        if out.publish.borrow().kube_dns.is_empty() {
            out.metrics.looked(UpstreamGroup::KubeDns, &looked);
            tracing::warn!("{why}; the cluster listener answers SERVFAIL until some are found");
        } else {
            tracing::warn!("{why}; keeping the kube-dns servers found before");
        }
        *said = Some(why);
    }
}

/// Where new upstream sets go, with the counters their servers count into.
struct Publisher {
    publish: watch::Sender<Arc<UpstreamSets>>,
    metrics: Arc<Counters>,
}

impl Publisher {
    /// Publishes `servers` for `group` if they differ from the set in force.
    fn swap(&self, group: UpstreamGroup, servers: Vec<SocketAddr>, source: &str) {
        let current = self.publish.borrow().clone();
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
        self.metrics.upstreams_changed(group, source);
        let fresh = Arc::new(UpstreamSet::counted(
            servers,
            group,
            &self.metrics,
            Instant::now(),
        ));
        let mut sets = UpstreamSets::clone(&current);
        match group {
            UpstreamGroup::VnetDns => sets.vnet_dns = fresh,
            UpstreamGroup::KubeDns => sets.kube_dns = fresh,
        }
        self.publish.send_replace(Arc::new(sets));
    }
}
