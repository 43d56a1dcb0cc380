//! `localdns-fallback discover`: what the daemon would use, for the operator, as text or JSON.

use std::fmt::Write;
use std::net::{IpAddr, SocketAddr};

use crate::cli::Config;
use crate::discover::{explain, find_kube_dns, hosts, leases, resolv_conf};
use crate::hosts::Hosts;
use crate::roles::ListenerRole;
use crate::stats::unix_secs;

/// One group's upstreams, where they came from, and why there are none if so (in `--json` as
/// it is: the addresses as text, the problem null when there is none).
#[derive(Debug, serde::Serialize)]
pub struct Found {
    pub upstreams: Vec<SocketAddr>,
    pub source: String,
    pub problem: Option<String>,
}

#[derive(Debug)]
pub struct Report {
    pub vnet_dns: Found,
    pub kube_dns: Found,
    pub cluster_ip: Option<IpAddr>,
    /// The hosts file: `None` with `--hosts-file none`.
    pub hosts: Option<Result<Hosts, String>>,
}

impl Report {
    /// Both listeners have somewhere to send queries.
    pub fn complete(&self) -> bool {
        !self.vnet_dns.upstreams.is_empty() && !self.kube_dns.upstreams.is_empty()
    }
}

impl Found {
    fn ok(upstreams: Vec<SocketAddr>, source: impl Into<String>) -> Found {
        Found {
            upstreams,
            source: source.into(),
            problem: None,
        }
    }
}

/// Looks once, as the daemon does at start. Blocking: runs the node's tools.
pub fn gather(config: &Config) -> Report {
    let d = &config.discovery;
    let (kube_dns, cluster_ip) = if !config.cluster_upstreams.is_empty() {
        let f = Found::ok(config.cluster_upstreams.clone(), "--cluster-upstream");
        (f, d.cluster_ip)
    } else {
        let finding = find_kube_dns(d);
        let f = Found {
            problem: finding.source.is_none().then(|| explain(&finding.notes)),
            source: finding.source.map_or("none", |s| s.name()).to_string(),
            upstreams: finding.upstreams,
        };
        (f, finding.cluster_ip)
    };
    Report {
        vnet_dns: vnet_dns(config),
        kube_dns,
        cluster_ip,
        hosts: d.hosts_file.as_deref().map(hosts::read),
    }
}

/// The VNet DNS as the daemon takes it up at start: the flags' servers, else resolv.conf's, else
/// the DHCP leases'.
fn vnet_dns(config: &Config) -> Found {
    if !config.node_upstreams.is_empty() {
        return Found::ok(config.node_upstreams.clone(), "--node-upstream");
    }
    let d = &config.discovery;
    let skip = [config.node_listen.ip(), config.cluster_listen.ip()];
    let source = format!("resolv.conf {}", d.resolv_conf.display());
    let why = match resolv_conf::read(&d.resolv_conf, &skip) {
        Ok(upstreams) if !upstreams.is_empty() => return Found::ok(upstreams, source),
        Ok(_) => format!("{} lists no VNet DNS server", d.resolv_conf.display()),
        Err(e) => e,
    };
    match leases::servers(d.dhcp_leases.as_deref(), &skip) {
        Ok((upstreams, from)) => Found::ok(upstreams, format!("{from}, while {why}")),
        Err(e) => Found {
            upstreams: Vec::new(),
            source,
            problem: Some(format!("{why}; {e}")),
        },
    }
}

fn line(out: &mut String, label: &str, found: &Found) {
    let servers: Vec<String> = found.upstreams.iter().map(ToString::to_string).collect();
    let (servers, source) = (servers.join(" "), &found.source);
    let _ = match &found.problem {
        None => writeln!(out, "  {label:<40} {servers}  (from {source})"),
        Some(why) => writeln!(out, "  {label:<40} NONE: {why}"),
    };
}

pub fn text(config: &Config, r: &Report) -> String {
    let mut out = String::new();
    for (listener, addr) in ListenerRole::BOTH.into_iter().zip(config.listeners()) {
        let routes = config.routes_shown(listener);
        let _ = writeln!(out, "{} listener {addr}", listener.name());
        let (label, shown) = ("routes (longest match wins):", routes.join(" "));
        let _ = writeln!(out, "  {label:<40} {shown}");
        if routes.iter().any(|r| r.ends_with("=VnetDNS")) {
            line(&mut out, "VNet DNS:", &r.vnet_dns);
        }
        if routes.iter().any(|r| r.ends_with("=ClusterCoreDNS")) {
            line(&mut out, "kube-dns:", &r.kube_dns);
        }
    }
    if let Some(ip) = r.cluster_ip {
        let _ = writeln!(out, "kube-dns ClusterIP {ip}");
    }
    let path = config.discovery.hosts_file.as_ref().map(|p| p.display());
    let _ = match (&r.hosts, path) {
        (Some(Ok(h)), Some(path)) => writeln!(
            out,
            "hosts file {path}: {} entries, {} lines skipped, read at {} (Unix time)",
            h.len(),
            h.skipped,
            h.read_at.map_or(0.0, unix_secs) as u64,
        ),
        (Some(Err(e)), _) => writeln!(out, "hosts file: {e}; its names are forwarded"),
        _ => writeln!(out, "hosts file: none (--hosts-file none)"),
    };
    out
}

pub fn json(config: &Config, r: &Report) -> String {
    let doc = serde_json::json!({
        "node_listener": {
            "address": config.node_listen.to_string(),
            "routes": config.routes_shown(ListenerRole::Node),
            "vnet_dns": &r.vnet_dns,
            "kube_dns": &r.kube_dns,
        },
        "cluster_listener": {
            "address": config.cluster_listen.to_string(),
            "routes": config.routes_shown(ListenerRole::Cluster),
            "kube_dns": &r.kube_dns,
        },
        "cluster_ip": r.cluster_ip.map(|ip| ip.to_string()),
        "hosts_file": match &r.hosts {
            None => serde_json::Value::Null,
            Some(Ok(h)) => serde_json::json!({
                "path": config.discovery.hosts_file,
                "entries": h.len(),
                "lines_skipped": h.skipped,
                "read_at": h.read_at.map_or(0.0, unix_secs) as u64,
            }),
            Some(Err(e)) => serde_json::json!({
                "path": config.discovery.hosts_file,
                "problem": e,
            }),
        },
        "complete": r.complete(),
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}
