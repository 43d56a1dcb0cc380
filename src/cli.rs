//! Command-line flags: the whole configuration (there is deliberately no config file, so the
//! fallback shares no configuration with the LocalDNS it stands in for).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::discover::{self, ServiceName, Source};
use crate::engine::route::Routes;
use crate::roles::{ListenerRole, UpstreamGroup};
use crate::wire;
use crate::{cache, engine};

const ABOUT: &str = "\
localdns-fallback: the DNS forwarder of last resort for an AKS node whose LocalDNS has failed.

USAGE:
    localdns-fallback [FLAGS]                  serve
    localdns-fallback discover [--json] [FLAGS]  print the upstreams it would use, then exit
    localdns-fallback release-addresses [FLAGS]  remove the listener addresses it puts on lo, then exit
    localdns-fallback status [--ready] [FLAGS] say in one line who answers the listeners: exit 0
                                               LocalDNS, 1 a fallback or nothing, 2 cannot tell;
                                               --ready: whether the standby could serve now

Serves the node listener (--node-listen) and the cluster listener (--cluster-listen) over UDP and
TCP. The cluster listener relays every name to the kube-dns servers; the node listener relays
names under --cluster-domain to the kube-dns servers and every other name to the VNet DNS servers.
Upstreams not given by flags are discovered from the node and followed while serving: the VNet DNS
from --resolv-conf (or the DHCP leases while it names none), kube-dns backends from kube-proxy's rules or Cilium.
It never takes the listeners from a LocalDNS that answers its probe name on both: started beside
one, it exits (or, with --standby, waits beside it and serves only while it does not).";

/// Everything the daemon needs to run, checked.
#[derive(Clone, Debug)]
pub struct Config {
    pub node_listen: SocketAddr,
    pub cluster_listen: SocketAddr,
    pub node_upstreams: Vec<SocketAddr>,
    pub cluster_upstreams: Vec<SocketAddr>,
    /// The routes, as the flags gave them: `--cluster-domain` (lower case, no final dot) and
    /// `--vnet-dns-override` and `--kube-dns-override` in order (the listener, the domain, where it
    /// goes). [`Config::routes`] lays the overrides over the domain's defaults.
    pub cluster_domain: String,
    pub overrides: Vec<(ListenerRole, String, UpstreamGroup)>,
    /// What each relay thread's engine decides with: `--upstream-timeout`, `--query-timeout`,
    /// `--max-inflight` and `--upstream-sockets` land here, and nowhere else.
    pub engine: engine::Settings,
    pub max_tcp_connections: usize,
    pub tcp_idle_timeout: Duration,
    /// Relay threads per listener.
    pub udp_threads: usize,
    pub bind_timeout: Duration,
    /// Listening on 0.0.0.0/:: would make the node an open resolver on every interface.
    pub allow_wildcard: bool,
    /// Where to serve /metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// Put the listener addresses on lo if missing (removed again when serving ends).
    pub link_setup: bool,
    /// Stand by beside LocalDNS and serve only while it does not.
    pub standby: bool,
    pub log_level: tracing::Level,
    pub cache: cache::Limits,
    /// Where to look for upstreams not given by flags.
    pub discovery: discover::Settings,
}

impl Config {
    /// The node listener, then the cluster listener.
    pub fn listeners(&self) -> [SocketAddr; 2] {
        [self.node_listen, self.cluster_listen]
    }

    /// The engine's routes: `--cluster-domain`'s defaults with the overrides laid over them, in
    /// order.
    pub fn routes(&self) -> Routes {
        let mut routes = Routes::defaults(&wire_of(&self.cluster_domain));
        for (listener, domain, group) in &self.overrides {
            routes.set(*listener, &wire_of(domain), *group);
        }
        routes
    }

    /// The routes of `listener` in force, longest domain first, each domain named as the flags
    /// gave it: `cluster.local=ClusterCoreDNS`, `.=VnetDNS`.
    pub fn routes_shown(&self, listener: ListenerRole) -> Vec<String> {
        let given =
            std::iter::once(&self.cluster_domain).chain(self.overrides.iter().map(|o| &o.1));
        self.routes()
            .of(listener)
            .iter()
            .map(|(domain, group)| {
                let name = given.clone().find(|d| wire_of(d) == *domain);
                format!("{}={}", name.map_or(".", String::as_str), dest_name(*group))
            })
            .collect()
    }
}

/// The defaults, written once: `--help` and the README's flag table show them from here (through
/// [`FLAGS`]), and the engine's, the cache's and discovery's own come from their `Default`.
impl Default for Config {
    fn default() -> Config {
        Config {
            node_listen: SocketAddr::from(([169, 254, 10, 10], 53)),
            cluster_listen: SocketAddr::from(([169, 254, 10, 11], 53)),
            node_upstreams: Vec::new(),
            cluster_upstreams: Vec::new(),
            cluster_domain: "cluster.local".into(),
            overrides: Vec::new(),
            engine: engine::Settings::default(),
            max_tcp_connections: 256,
            tcp_idle_timeout: Duration::from_secs(10),
            // Measured on 2 cores shared with the load's generator and upstream (the harness's
            // localdns-fallback-2threads row): a second thread costs 1.3-1.6x the CPU per query
            // (smaller batches, twice the wake-ups) and relays more only when a core is idle.
            // More pay on a node with free cores (see README, Speed).
            udp_threads: 1,
            bind_timeout: Duration::from_secs(10),
            link_setup: true,
            standby: false,
            metrics: None,
            allow_wildcard: false,
            log_level: tracing::Level::INFO,
            cache: cache::Limits::default(),
            discovery: discover::Settings::default(),
        }
    }
}

/// One flag of the daemon: the single definition its parser, `--help` and the README's flag
/// table (held to it by a test) are made from.
pub struct Flag {
    pub name: &'static str,
    /// The form of its value; empty for a switch.
    pub value: &'static str,
    pub help: &'static str,
    set: fn(&mut Config, &str) -> Result<(), String>,
    /// The value in a config, as the flag would take it: the default shown is
    /// `show(&Config::default())`.
    show: fn(&Config) -> String,
}

impl Flag {
    /// What the daemon does without the flag.
    pub fn default_shown(&self) -> String {
        (self.show)(&Config::default())
    }
}

macro_rules! flag {
    ($name:literal, $value:literal, $help:literal, $set:expr, $show:expr) => {
        Flag {
            name: $name,
            value: $value,
            help: $help,
            set: $set,
            show: $show,
        }
    };
}

/// Every flag of the daemon, in the order `--help` lists them. A row per flag (hence unformatted,
/// and each setter one assignment inside `Ok`).
#[rustfmt::skip]
#[allow(clippy::unit_arg)]
pub static FLAGS: &[Flag] = &[
    flag!("--node-listen", "ADDR", "node listener, UDP and TCP",
        |c, v| Ok(c.node_listen = parse_addr(v)?), |c| c.node_listen.to_string()),
    flag!("--cluster-listen", "ADDR", "cluster listener, UDP and TCP",
        |c, v| Ok(c.cluster_listen = parse_addr(v)?), |c| c.cluster_listen.to_string()),
    flag!("--node-upstream", "ADDR", "a VNet DNS server; repeat for several (IP, IP:PORT or [IPv6]:PORT); turns its discovery off",
        |c, v| Ok(c.node_upstreams.push(parse_addr(v)?)), |_| "discovered".into()),
    flag!("--cluster-upstream", "ADDR", "a kube-dns server (backend or ClusterIP); repeat for several; turns its discovery off",
        |c, v| Ok(c.cluster_upstreams.push(parse_addr(v)?)), |_| "discovered".into()),
    flag!("--resolv-conf", "PATH", "where the VNet DNS servers are listed",
        |c, v| Ok(c.discovery.resolv_conf = v.into()), |c| c.discovery.resolv_conf.display().to_string()),
    flag!("--dhcp-leases", "DIR", "systemd-networkd's DHCP leases: the VNet DNS while --resolv-conf lists none; none turns them off",
        |c, v| Ok(c.discovery.dhcp_leases = (v != "none").then(|| v.into())),
        |c| c.discovery.dhcp_leases.as_ref().map_or("none".into(), |d| d.display().to_string())),
    flag!("--hosts-file", "PATH", "the node's hosts file, answered as LocalDNS's hosts plugin does; none turns it off",
        |c, v| Ok(c.discovery.hosts_file = (v != "none").then(|| v.into())),
        |c| c.discovery.hosts_file.as_ref().map_or("none".into(), |d| d.display().to_string())),
    flag!("--discovery", "LIST", "where to look for kube-dns, in order, comma-separated, or none",
        |c, v| Ok(c.discovery.sources = Source::parse_list(v)?),
        |c| c.discovery.sources.iter().map(|s| s.name()).collect::<Vec<_>>().join(",")),
    flag!("--kube-dns-service", "NS/NAME", "the service whose backends are kube-dns",
        |c, v| Ok(c.discovery.service = parse_service(v)?), |c| c.discovery.service.to_string()),
    flag!("--cluster-ip", "IP", "the kube-dns ClusterIP: selects the ipvs virtual service, and is the last-resort upstream",
        |c, v| Ok(c.discovery.cluster_ip = Some(v.parse().map_err(|_| "expected an IP address")?)),
        |_| "learned".into()),
    flag!("--cilium-socket", "PATH", "the Cilium agent's API socket",
        |c, v| Ok(c.discovery.cilium_socket = v.into()), |c| c.discovery.cilium_socket.display().to_string()),
    flag!("--rediscover-interval", "DUR", "how often kube-dns is looked for again while serving",
        |c, v| Ok(c.discovery.interval = parse_duration(v)?), |c| show_duration(c.discovery.interval)),
    flag!("--cluster-domain", "NAME", "the default route to kube-dns of both listeners (a shorthand for the overrides below)",
        |c, v| {
            wire::encode_name(v).map_err(|e| e.to_string())?;
            Ok(c.cluster_domain = v.trim_end_matches('.').to_ascii_lowercase())
        },
        |c| c.cluster_domain.clone()),
    flag!("--vnet-dns-override", "DOMAIN=DEST", "on the node listener, send DOMAIN and the names under it to DEST: VnetDNS or ClusterCoreDNS; repeatable, the longest match wins",
        |c, v| override_route(c, ListenerRole::Node, v), |c| show_overrides(c, ListenerRole::Node)),
    flag!("--kube-dns-override", "DOMAIN=DEST", "the same on the cluster listener",
        |c, v| override_route(c, ListenerRole::Cluster, v), |c| show_overrides(c, ListenerRole::Cluster)),
    flag!("--upstream-timeout", "DUR", "budget for one try at one upstream; then the next is tried",
        |c, v| Ok(c.engine.upstream_timeout = parse_duration(v)?), |c| show_duration(c.engine.upstream_timeout)),
    flag!("--query-timeout", "DUR", "budget for a whole query; the client gets SERVFAIL (or stale) after it",
        |c, v| Ok(c.engine.query_timeout = parse_duration(v)?), |c| show_duration(c.engine.query_timeout)),
    flag!("--max-inflight", "N", "queries (UDP and TCP) in flight per relay thread, one upstream group at most three quarters; beyond it: REFUSED",
        |c, v| Ok(c.engine.max_inflight = parse_count(v, 1, 1 << 20)?), |c| c.engine.max_inflight.to_string()),
    flag!("--max-tcp-connections", "N", "TCP client connections per listener; beyond it the idlest is closed",
        |c, v| Ok(c.max_tcp_connections = parse_count(v, 1, 1 << 16)?), |c| c.max_tcp_connections.to_string()),
    flag!("--tcp-idle-timeout", "DUR", "close a TCP client that sends no whole query for this long",
        |c, v| Ok(c.tcp_idle_timeout = parse_duration(v)?), |c| show_duration(c.tcp_idle_timeout)),
    flag!("--cache-size", "N", "answers kept in the cache; 0 turns the cache (and coalescing) off",
        |c, v| Ok(c.cache.entries = parse_count(v, 0, 1 << 24)?), |c| c.cache.entries.to_string()),
    flag!("--cache-bytes", "SIZE", "memory the cache may use, e.g. 32M or 512K",
        |c, v| Ok(c.cache.bytes = parse_size(v)?), |c| show_size(c.cache.bytes)),
    flag!("--cache-min-ttl", "DUR", "keep answers at least this long, whatever their TTL (0 allowed)",
        |c, v| Ok(c.cache.min_ttl = parse_duration_or_zero(v)?), |c| show_duration(c.cache.min_ttl)),
    flag!("--cache-max-ttl", "DUR", "keep answers at most this long",
        |c, v| Ok(c.cache.max_ttl = parse_duration(v)?), |c| show_duration(c.cache.max_ttl)),
    flag!("--serve-stale", "DUR", "when upstreams fail, answer from entries expired up to this long ago, TTL 30; 0 turns it off",
        |c, v| Ok(c.cache.max_stale = parse_duration_or_zero(v)?), |c| show_duration(c.cache.max_stale)),
    flag!("--upstream-sockets", "N", "UDP sockets (random source ports) per upstream and relay thread",
        |c, v| Ok(c.engine.udp_sockets_per_upstream = parse_count(v, 1, 256)?),
        |c| c.engine.udp_sockets_per_upstream.to_string()),
    flag!("--udp-threads", "N", "relay threads per listener, sharing its socket",
        |c, v| Ok(c.udp_threads = parse_count(v, 1, 64)?), |c| c.udp_threads.to_string()),
    flag!("--bind-timeout", "DUR", "how long to keep retrying a busy listener address",
        |c, v| Ok(c.bind_timeout = parse_duration(v)?), |c| show_duration(c.bind_timeout)),
    flag!("--metrics", "ADDR", "serve Prometheus metrics at http://ADDR/metrics",
        |c, v| Ok(c.metrics = Some(v.parse().map_err(|_| "expected IP:PORT")?)),
        |c| c.metrics.map_or("off".into(), |m| m.to_string())),
    flag!("--standby", "", "run beside LocalDNS: serve only while it does not, hand back when it does again",
        |c, _| Ok(c.standby = true), |c| if c.standby { "on" } else { "off" }.into()),
    flag!("--no-link-setup", "", "do not put the listener addresses on lo (they keep us reachable while LocalDNS recreates its link)",
        |c, _| Ok(c.link_setup = false), |c| if c.link_setup { "off" } else { "on" }.into()),
    flag!("--allow-wildcard", "", "allow a wildcard listen address (0.0.0.0, ::), which would answer on every interface",
        |c, _| Ok(c.allow_wildcard = true), |c| if c.allow_wildcard { "on" } else { "off" }.into()),
    flag!("--log-level", "LEVEL", "error, warn, info, debug or trace",
        |c, v| Ok(c.log_level = v.parse().map_err(|_| "expected error, warn, info, debug or trace")?),
        |c| c.log_level.to_string().to_ascii_lowercase()),
];

/// `DOMAIN=VnetDNS|ClusterCoreDNS` (the AKS profile's `forwardDestination` names; `.` is every
/// name): one more route for `listener`. The same domain twice is an error unless it says the
/// same both times.
fn override_route(c: &mut Config, listener: ListenerRole, v: &str) -> Result<(), String> {
    let (domain, dest) = v
        .split_once('=')
        .ok_or("expected DOMAIN=VnetDNS or DOMAIN=ClusterCoreDNS")?;
    let group = UpstreamGroup::BOTH
        .into_iter()
        .find(|&g| dest_name(g).eq_ignore_ascii_case(dest))
        .ok_or("the destination is VnetDNS or ClusterCoreDNS")?;
    let domain = match domain.trim_end_matches('.').to_ascii_lowercase() {
        d if d.is_empty() && domain == "." => ".".to_string(),
        d if d.is_empty() => return Err("no domain before the =".into()),
        d => {
            wire::encode_name(&d).map_err(|e| e.to_string())?;
            d
        }
    };
    let given = |(l, d, _): &&(ListenerRole, String, _)| *l == listener && *d == domain;
    match c.overrides.iter().find(given) {
        Some(&(.., was)) if was != group => {
            return Err(format!("{domain} is already sent elsewhere"));
        }
        Some(_) => {}
        None => c.overrides.push((listener, domain, group)),
    }
    Ok(())
}

fn show_overrides(c: &Config, listener: ListenerRole) -> String {
    let given: Vec<String> = c
        .overrides
        .iter()
        .filter(|(l, ..)| *l == listener)
        .map(|(_, d, g)| format!("{d}={}", dest_name(*g)))
        .collect();
    if given.is_empty() {
        "none".into()
    } else {
        given.join(",")
    }
}

/// The AKS profile's name of a destination.
fn dest_name(group: UpstreamGroup) -> &'static str {
    match group {
        UpstreamGroup::VnetDns => "VnetDNS",
        UpstreamGroup::KubeDns => "ClusterCoreDNS",
    }
}

/// A flag's domain in wire form (both were checked when given); `.` is the root's lone 0.
fn wire_of(domain: &str) -> Vec<u8> {
    wire::encode_name(domain).unwrap_or_else(|_| vec![0])
}

/// `--help`: what it is, then every flag with its default.
pub fn usage() -> String {
    let mut out = format!("{ABOUT}\n\nFLAGS:\n");
    for f in FLAGS {
        let head = format!("{} {}", f.name, f.value);
        out += &format!(
            "    {:<31}  {} [default: {}]\n",
            head.trim_end(),
            f.help,
            f.default_shown()
        );
    }
    out += "    --json                           with discover: print JSON\n";
    out += "    -h, --help                       print this help\n";
    out += "    -V, --version                    print the version\n\n";
    out += "DUR is a number with a unit: 500ms, 2s, 1m, 1h.";
    out
}

/// A duration the way the flags take it.
fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0".into(),
        _ if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        _ if ms % 1000 == 0 => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// A size the way `--cache-bytes` takes it.
fn show_size(bytes: usize) -> String {
    match bytes {
        _ if bytes % (1 << 30) == 0 => format!("{}G", bytes >> 30),
        _ if bytes % (1 << 20) == 0 => format!("{}M", bytes >> 20),
        _ if bytes % (1 << 10) == 0 => format!("{}K", bytes >> 10),
        _ => bytes.to_string(),
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Run(Box<Config>),
    /// Print what discovery finds and exit.
    Discover {
        config: Box<Config>,
        json: bool,
    },
    /// Remove the listener addresses from lo and exit (the unit's ExecStopPost, after a kill).
    ReleaseAddresses(Box<Config>),
    /// Say who answers the listeners, or (`--ready`) whether the standby could serve, and exit
    /// (node-problem-detector's plugin).
    Status(Box<Config>, bool),
    Help,
    Version,
}

/// Parses the arguments after the program name. Errors are one sentence naming the bad value.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command, String> {
    let mut config = Config::default();
    let mut args = args.into_iter().peekable();
    let sub = args.next_if(|a| ["discover", "release-addresses", "status"].contains(&a.as_str()));
    let discover = sub.as_deref() == Some("discover");
    let mut json = false;
    // `status --ready`: the flag belongs to the subcommand, right after it.
    let ready = sub.as_deref() == Some("status") && args.next_if(|a| a == "--ready").is_some();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        match name {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--json" if discover => {
                json = true;
                continue;
            }
            _ => {}
        }
        let flag = FLAGS
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| format!("unknown argument {arg:?}"))?;
        let value = match (flag.value.is_empty(), inline) {
            (true, None) => String::new(),
            (true, Some(_)) => return Err(format!("{name} takes no value")),
            (false, Some(v)) => v,
            (false, None) => args.next().ok_or_else(|| format!("{name} needs a value"))?,
        };
        (flag.set)(&mut config, &value).map_err(|why| format!("{name} {value:?}: {why}"))?;
    }
    check(&config)?;
    let config = Box::new(config);
    Ok(match sub.as_deref() {
        Some("discover") => Command::Discover { config, json },
        Some("release-addresses") => Command::ReleaseAddresses(config),
        Some("status") => Command::Status(config, ready),
        _ => Command::Run(config),
    })
}

fn parse_service(s: &str) -> Result<ServiceName, String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(ServiceName {
                namespace: ns.into(),
                name: name.into(),
            })
        }
        _ => Err("expected NAMESPACE/NAME".into()),
    }
}

fn check(c: &Config) -> Result<(), String> {
    let e = &c.engine;
    if e.upstream_timeout > e.query_timeout {
        return Err(format!(
            "--upstream-timeout {:?} is longer than --query-timeout {:?}",
            e.upstream_timeout, e.query_timeout
        ));
    }
    // Each try takes a query ID on one of an upstream's sockets, and one upstream may get every
    // try: with too few sockets for the in-flight cap, finding a free ID would take ever more
    // draws. Keep the IDs at most a quarter used (4 tries per query, 65,536 IDs per socket).
    if e.max_inflight * 4 * 4 > e.udp_sockets_per_upstream * 65_536 {
        return Err(format!(
            "--max-inflight {} needs at least {} --upstream-sockets (query IDs per upstream would run short)",
            e.max_inflight,
            (e.max_inflight * 16).div_ceil(65_536)
        ));
    }
    if c.cache.min_ttl > c.cache.max_ttl {
        return Err(format!(
            "--cache-min-ttl {:?} is longer than --cache-max-ttl {:?}",
            c.cache.min_ttl, c.cache.max_ttl
        ));
    }
    for (flag, addr) in [
        ("--node-listen", c.node_listen),
        ("--cluster-listen", c.cluster_listen),
    ] {
        if addr.ip().is_unspecified() && !c.allow_wildcard {
            return Err(format!(
                "{flag} {addr} is a wildcard address: it would answer on every interface of the node; \
                 give the listener address, or add --allow-wildcard"
            ));
        }
    }
    if c.node_listen == c.cluster_listen {
        return Err(format!(
            "--node-listen and --cluster-listen are both {}",
            c.node_listen
        ));
    }
    let listeners = c.listeners();
    let mut upstreams = c.node_upstreams.iter().chain(&c.cluster_upstreams);
    if let Some(up) = upstreams.find(|up| listeners.contains(up)) {
        return Err(format!(
            "upstream {up} is one of our own listeners: that would loop"
        ));
    }
    Ok(())
}

/// `IP`, `IP:PORT` or `[IPv6]:PORT`; a bare IP means port 53.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| "expected IP, IP:PORT or [IPv6]:PORT".into())
}

/// Like `parse_duration`, but a bare `0` means zero (off).
fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    match s {
        "0" => Ok(Duration::ZERO),
        _ => parse_duration(s),
    }
}

/// Bytes, with an optional K, M or G suffix (powers of 1024).
fn parse_size(s: &str) -> Result<usize, String> {
    let bad = || "expected a size such as 32M, 512K or 1048576".to_string();
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: usize = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).filter(|&b| b > 0).ok_or_else(bad)
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || "expected a duration such as 500ms, 2s, 1m or 1h".to_string();
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = s.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(bad()),
    };
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d)
}

fn parse_count(s: &str, min: usize, max: usize) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected a whole number from {min} to {max}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Config, String> {
        let base = [
            "--node-upstream",
            "198.18.0.1",
            "--cluster-upstream",
            "198.18.0.2",
        ];
        match parse(base.iter().chain(args).map(|s| s.to_string()))? {
            Command::Run(c) => Ok(*c),
            other => panic!("expected a run, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_the_aks_ones() {
        let c = run(&[]).unwrap();
        assert_eq!(c.node_listen.to_string(), "169.254.10.10:53");
        assert_eq!(c.cluster_listen.to_string(), "169.254.10.11:53");
        assert_eq!(c.node_upstreams, vec!["198.18.0.1:53".parse().unwrap()]);
        assert_eq!(
            c.routes(),
            Routes::defaults(&wire::encode_name("cluster.local").unwrap())
        );
    }

    #[test]
    fn addresses_take_every_documented_form() {
        let c = run(&[
            "--node-upstream=198.18.0.3:5353",
            "--cluster-upstream",
            "[fd00::1]:54",
            "--cluster-upstream",
            "fd00::2",
        ])
        .unwrap();
        assert_eq!(c.node_upstreams[1].to_string(), "198.18.0.3:5353");
        assert_eq!(c.cluster_upstreams[1].to_string(), "[fd00::1]:54");
        assert_eq!(c.cluster_upstreams[2].to_string(), "[fd00::2]:53");
    }

    #[test]
    fn durations_and_domain() {
        let c = run(&[
            "--upstream-timeout",
            "300ms",
            "--query-timeout",
            "2s",
            "--cluster-domain",
            "Corp.Example.",
        ])
        .unwrap();
        assert_eq!(c.engine.upstream_timeout, Duration::from_millis(300));
        assert_eq!(c.engine.query_timeout, Duration::from_secs(2));
        assert_eq!(c.cluster_domain, "corp.example");
    }

    #[test]
    fn route_overrides() {
        let name = |s: &str| wire::encode_name(s).unwrap();
        let c = run(&[
            "--vnet-dns-override",
            "Contoso.Internal.=ClusterCoreDNS",
            "--kube-dns-override=corp.example=VnetDNS",
            "--kube-dns-override",
            ".=VnetDNS",
            "--vnet-dns-override",
            "contoso.internal=clustercoredns",
            "--cluster-domain",
            "k8s.example",
        ])
        .unwrap();
        let (node, cluster) = (ListenerRole::Node, ListenerRole::Cluster);
        for (listener, domain, group) in [
            (node, "db.contoso.internal", UpstreamGroup::KubeDns),
            (node, "a.k8s.example", UpstreamGroup::KubeDns),
            (node, "a.cluster.local", UpstreamGroup::VnetDns),
            (cluster, "example.com", UpstreamGroup::VnetDns),
            (cluster, "svc.k8s.example", UpstreamGroup::KubeDns),
        ] {
            let got = c.routes().group(listener, &name(domain));
            assert_eq!(got, group, "{listener:?} {domain}");
        }
        assert_eq!(
            show_overrides(&c, cluster),
            "corp.example=VnetDNS,.=VnetDNS"
        );
        let err = |a: &[&str]| run(a).unwrap_err();
        for (args, names) in [
            (
                &["--vnet-dns-override", "x.example=Google"][..],
                "\"x.example=Google\"",
            ),
            (&["--vnet-dns-override", "x.example"], "DOMAIN=VnetDNS"),
            (&["--kube-dns-override", "=VnetDNS"], "no domain"),
            (
                &["--kube-dns-override", "a..b=VnetDNS"],
                "--kube-dns-override",
            ),
            (
                &[
                    "--vnet-dns-override",
                    "a.b=VnetDNS",
                    "--vnet-dns-override",
                    "A.B.=ClusterCoreDNS",
                ],
                "already",
            ),
        ] {
            assert!(err(args).contains(names), "{args:?}: {}", err(args));
        }
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        let err = |a: &[&str]| run(a).unwrap_err();
        assert!(err(&["--node-upstream", "nonsense"]).contains("\"nonsense\""));
        assert!(err(&["--query-timeout", "5"]).contains("duration"));
        assert!(err(&["--query-timeout", "0s"]).contains("more than zero"));
        assert!(err(&["--bogus"]).contains("unknown argument"));
        assert!(err(&["--max-inflight", "0"]).contains("whole number"));
        assert!(err(&["--cluster-domain", "a..b"]).contains("--cluster-domain"));
        assert!(err(&["--upstream-timeout", "3s"]).contains("longer than"));
        assert!(err(&["--cluster-upstream", "169.254.10.11"]).contains("loop"));
        assert!(err(&["--log-level", "loud"]).contains("--log-level"));
        assert!(err(&["--cluster-listen", "0.0.0.0:53"]).contains("wildcard"));
        assert!(err(&["--node-listen", "[::]:53"]).contains("wildcard"));
        assert!(run(&["--node-listen", "0.0.0.0:5353", "--allow-wildcard"]).is_ok());
        assert!(err(&["--node-listen"]).contains("needs a value"));
    }

    #[test]
    fn discovery_flags() {
        let c = run(&[
            "--resolv-conf",
            "/tmp/r",
            "--discovery",
            "cilium,cluster-ip",
            "--kube-dns-service",
            "dns/coredns",
            "--cluster-ip",
            "10.0.0.10",
            "--cilium-socket",
            "/tmp/c.sock",
            "--rediscover-interval",
            "2s",
            "--dhcp-leases",
            "/tmp/l",
        ])
        .unwrap();
        let d = &c.discovery;
        assert_eq!(d.resolv_conf, std::path::Path::new("/tmp/r"));
        assert_eq!(
            d.dhcp_leases.as_deref(),
            Some(std::path::Path::new("/tmp/l"))
        );
        let off = run(&["--dhcp-leases", "none", "--hosts-file", "none"]).unwrap();
        assert_eq!(off.discovery.dhcp_leases, None);
        assert_eq!(off.discovery.hosts_file, None);
        assert_eq!(
            run(&[]).unwrap().discovery.hosts_file.as_deref(),
            Some(std::path::Path::new("/etc/localdns/hosts"))
        );
        assert_eq!(
            run(&[]).unwrap().discovery.dhcp_leases.as_deref(),
            Some(std::path::Path::new("/run/systemd/netif/leases"))
        );
        assert_eq!(d.sources, [Source::Cilium, Source::ClusterIp]);
        assert_eq!(d.service.to_string(), "dns/coredns");
        assert_eq!(d.cluster_ip, Some("10.0.0.10".parse().unwrap()));
        assert_eq!(d.interval, Duration::from_secs(2));
        let err = |a: &[&str]| run(a).unwrap_err();
        assert!(err(&["--kube-dns-service", "kube-dns"]).contains("NAMESPACE/NAME"));
        assert!(err(&["--discovery", "magic"]).contains("\"magic\""));
        assert!(err(&["--cluster-ip", "ten"]).contains("--cluster-ip"));
        assert!(
            err(&["--json"]).contains("unknown argument"),
            "--json belongs to discover"
        );
    }

    #[test]
    fn cache_flags() {
        let c = run(&[
            "--cache-size",
            "0",
            "--cache-bytes",
            "8M",
            "--cache-min-ttl",
            "0",
            "--serve-stale",
            "0",
        ])
        .unwrap();
        assert_eq!(c.cache.entries, 0);
        assert_eq!(c.cache.bytes, 8 << 20);
        assert_eq!(c.cache.min_ttl, Duration::ZERO);
        assert_eq!(c.cache.max_stale, Duration::ZERO);
        assert_eq!(run(&["--cache-bytes", "4096"]).unwrap().cache.bytes, 4096);
        assert!(
            run(&["--cache-bytes", "lots"])
                .unwrap_err()
                .contains("size")
        );
        assert!(run(&["--cache-bytes", "0"]).is_err());
        assert!(
            run(&["--cache-min-ttl", "2h"])
                .unwrap_err()
                .contains("longer than")
        );
    }

    #[test]
    fn the_discover_subcommand() {
        let args = ["discover", "--json", "--discovery", "none"].map(String::from);
        match parse(args).unwrap() {
            Command::Discover { json, config } => {
                assert!(json);
                assert!(config.discovery.sources.is_empty());
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(parse(Vec::<String>::new()).unwrap(), Command::Run(_)),
            "no upstream flags: discover them"
        );
    }

    #[test]
    fn the_status_subcommand_takes_the_listeners() {
        let args = ["status", "--ready", "--cluster-listen", "127.0.0.2:5353"].map(String::from);
        match parse(args).unwrap() {
            Command::Status(config, ready) => {
                assert!(ready);
                assert_eq!(config.cluster_listen.to_string(), "127.0.0.2:5353");
                assert_eq!(config.node_listen.to_string(), "169.254.10.10:53");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Each flag takes its own default as shown and shows it back: what --help and the README
    /// print as the default is what the daemon runs with. A switch shows "off" until given.
    #[test]
    fn every_flag_takes_the_default_it_shows() {
        for f in FLAGS {
            let shown = f.default_shown();
            let mut c = Config::default();
            if f.value.is_empty() {
                assert_eq!(shown, "off", "{}", f.name);
                (f.set)(&mut c, "").unwrap();
                assert_eq!((f.show)(&c), "on", "{}", f.name);
            } else if !["discovered", "learned", "off", "none"].contains(&shown.as_str()) {
                (f.set)(&mut c, &shown).unwrap_or_else(|e| panic!("{}: {e}", f.name));
                assert_eq!((f.show)(&c), shown, "{}", f.name);
            }
            assert!(
                usage().contains(&format!("[default: {shown}]")),
                "{}",
                f.name
            );
        }
        assert_eq!(show_duration(Duration::from_millis(2500)), "2500ms");
        assert_eq!(show_size(512 << 10), "512K");
    }

    #[test]
    fn help_and_version() {
        assert!(matches!(parse(["--help".to_string()]), Ok(Command::Help)));
        assert!(matches!(parse(["-V".to_string()]), Ok(Command::Version)));
    }
}
