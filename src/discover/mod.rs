//! Upstream discovery from the node's own state. Never resolves a name, never asks the
//! Kubernetes API, never reads LocalDNS's own configuration.
//!
//! Each source is one file with a pure parser (node text in, upstreams out) and a thin reader that
//! fetches that text. A source answers `Err(reason)` when it cannot be used on this node (tool
//! missing, socket absent, command failed) and `Ok` with empty lists when it works but knows no
//! kube-dns.

pub mod cilium;
pub mod follow;
pub mod hosts;
pub mod iptables;
pub mod ipvs;
pub mod leases;
pub mod nftables;
pub mod resolv_conf;
pub mod tool;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// The Kubernetes service whose backends are the cluster upstreams (`--kube-dns-service`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceName {
    pub namespace: String,
    pub name: String,
}

impl Default for ServiceName {
    fn default() -> ServiceName {
        ServiceName {
            namespace: "kube-system".into(),
            name: "kube-dns".into(),
        }
    }
}

impl std::fmt::Display for ServiceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What one source knows about the kube-dns service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeDns {
    /// Backends of the UDP port named `dns`, in the order the source lists them.
    pub udp: Vec<SocketAddr>,
    /// Backends of the TCP port named `dns-tcp`.
    pub tcp: Vec<SocketAddr>,
    /// The service's ClusterIP, when the source shows it (the last-resort upstream).
    pub cluster_ip: Option<IpAddr>,
}

/// Where the kube-dns backends can be found, in the default order of preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Iptables,
    Nftables,
    Ipvs,
    Cilium,
    /// The service's ClusterIP itself: kube-proxy or Cilium translate it for a host process too.
    ClusterIp,
}

impl Source {
    pub const ALL: [Source; 5] = [
        Source::Iptables,
        Source::Nftables,
        Source::Ipvs,
        Source::Cilium,
        Source::ClusterIp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Source::Iptables => "iptables",
            Source::Nftables => "nftables",
            Source::Ipvs => "ipvs",
            Source::Cilium => "cilium",
            Source::ClusterIp => "cluster-ip",
        }
    }

    /// `iptables,cilium` → those sources in that order; `none` → no discovery of kube-dns.
    pub fn parse_list(s: &str) -> Result<Vec<Source>, String> {
        if s == "none" {
            return Ok(Vec::new());
        }
        let sources = s.split(',').map(|word| {
            Source::ALL.into_iter().find(|src| src.name() == word).ok_or_else(|| {
                format!("unknown discovery source {word:?}: expected iptables, nftables, ipvs, cilium, cluster-ip or none")
            })
        });
        Ok(unique(sources.collect::<Result<Vec<_>, _>>()?))
    }
}

/// `items` in order, each once: sources list one backend several times (two rules, two
/// entries, two families' views of one pod), and an upstream is listed once.
pub fn unique<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// How to look for upstreams (the discovery flags).
#[derive(Clone, Debug)]
pub struct Settings {
    pub resolv_conf: PathBuf,
    /// systemd-networkd's DHCP lease directory: the VNet DNS while resolv.conf lists none
    /// (`None`: not used).
    pub dhcp_leases: Option<PathBuf>,
    /// The node's hosts file (`None`: not used).
    pub hosts_file: Option<PathBuf>,
    pub sources: Vec<Source>,
    pub service: ServiceName,
    pub cluster_ip: Option<IpAddr>,
    pub cilium_socket: PathBuf,
    /// How often kube-dns is looked for again while serving.
    pub interval: Duration,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            resolv_conf: resolv_conf::DEFAULT_PATH.into(),
            dhcp_leases: Some(leases::DEFAULT_DIR.into()),
            hosts_file: Some(hosts::DEFAULT_PATH.into()),
            sources: Source::ALL.to_vec(),
            service: ServiceName::default(),
            cluster_ip: None,
            cilium_socket: cilium::DEFAULT_SOCKET.into(),
            interval: Duration::from_secs(5),
        }
    }
}

/// The outcome of one look for kube-dns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeDnsFinding {
    pub upstreams: Vec<SocketAddr>,
    /// The source that gave `upstreams`.
    pub source: Option<Source>,
    pub cluster_ip: Option<IpAddr>,
    /// Why each source asked before the winner (or every source) gave nothing.
    pub notes: Vec<(Source, String)>,
}

/// Asks the sources in order; the first that lists backends wins. Blocking: runs tools.
pub fn find_kube_dns(settings: &Settings) -> KubeDnsFinding {
    let mut finding = KubeDnsFinding {
        cluster_ip: settings.cluster_ip,
        ..KubeDnsFinding::default()
    };
    let service = &settings.service;
    for &source in &settings.sources {
        let result = match source {
            Source::Iptables => both_families(|ipv6| iptables::discover(service, ipv6)),
            Source::Nftables => nftables::discover(service),
            Source::Ipvs => ipvs::discover(finding.cluster_ip),
            Source::Cilium => cilium::discover(&settings.cilium_socket, service),
            Source::ClusterIp => match finding.cluster_ip {
                Some(ip) => Ok(KubeDns {
                    udp: vec![SocketAddr::new(ip, 53)],
                    ..KubeDns::default()
                }),
                None => Err("no ClusterIP known (no source showed one and no --cluster-ip)".into()),
            },
        };
        match result {
            Ok(found) => {
                finding.cluster_ip = finding.cluster_ip.or(found.cluster_ip);
                // UDP backends serve TCP too (same pods); the TCP list only stands in when a
                // source shows no UDP port.
                let lists = [found.udp, found.tcp];
                if let Some(upstreams) = lists.into_iter().find(|list| !list.is_empty()) {
                    finding.upstreams = upstreams;
                    finding.source = Some(source);
                    return finding;
                }
                finding
                    .notes
                    .push((source, format!("no backends of {service}")));
            }
            Err(why) => finding.notes.push((source, why)),
        }
    }
    finding
}

/// One source's look in both address families, side by side: either may be absent on a
/// single-stack node. The backends come IPv4 first.
fn both_families(look: impl Fn(bool) -> Result<KubeDns, String> + Sync) -> Result<KubeDns, String> {
    let (v4, v6) = tool::side_by_side(|| look(false), || look(true));
    either(v4, v6)
}

/// The two families' results, one merged.
fn either(v4: Result<KubeDns, String>, v6: Result<KubeDns, String>) -> Result<KubeDns, String> {
    match (v4, v6) {
        (Err(a), Err(b)) if a == b => Err(a),
        (Err(a), Err(b)) => Err(format!("{a}; {b}")),
        (Ok(k), Err(_)) | (Err(_), Ok(k)) => Ok(k),
        (Ok(mut k), Ok(k6)) => {
            k.udp.extend(k6.udp);
            k.tcp.extend(k6.tcp);
            k.cluster_ip = k.cluster_ip.or(k6.cluster_ip);
            Ok(k)
        }
    }
}

/// One-line summary of why no source gave backends.
pub fn explain(notes: &[(Source, String)]) -> String {
    if notes.is_empty() {
        return "discovery of kube-dns is off (--discovery none)".into();
    }
    notes
        .iter()
        .map(|(s, why)| format!("{}: {why}", s.name()))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_lists() {
        assert_eq!(
            Source::parse_list("cilium,iptables,cilium").unwrap(),
            [Source::Cilium, Source::Iptables]
        );
        assert!(Source::parse_list("none").unwrap().is_empty());
        assert!(
            Source::parse_list("iptables,bogus")
                .unwrap_err()
                .contains("\"bogus\"")
        );
        assert_eq!(
            Source::parse_list("iptables,nftables,ipvs,cilium,cluster-ip").unwrap(),
            Source::ALL
        );
    }

    #[test]
    fn cluster_ip_stands_in_when_nothing_lists_backends() {
        let settings = Settings {
            sources: vec![Source::ClusterIp],
            cluster_ip: Some("10.0.0.10".parse().unwrap()),
            ..Settings::default()
        };
        let f = find_kube_dns(&settings);
        assert_eq!(f.upstreams, ["10.0.0.10:53".parse().unwrap()]);
        assert_eq!(f.source, Some(Source::ClusterIp));
        let none = find_kube_dns(&Settings {
            sources: vec![Source::ClusterIp],
            ..Settings::default()
        });
        assert!(none.upstreams.is_empty());
        assert!(explain(&none.notes).starts_with("cluster-ip: no ClusterIP known"));
    }

    #[test]
    fn merges_families() {
        let a: SocketAddr = "10.0.0.5:53".parse().unwrap();
        let b: SocketAddr = "[fd00::5]:53".parse().unwrap();
        let k = |x| KubeDns {
            udp: vec![x],
            ..KubeDns::default()
        };
        assert_eq!(either(Ok(k(a)), Ok(k(b))).unwrap().udp, [a, b]);
        assert_eq!(either(Err("x".into()), Ok(k(b))).unwrap().udp, [b]);
        assert_eq!(
            either(Err("x".into()), Err("y".into())).unwrap_err(),
            "x; y"
        );
    }
}
