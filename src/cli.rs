//! Command-line flags: the whole configuration (there is deliberately no config file, so the
//! fallback shares no configuration with the LocalDNS it stands in for).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::discover::{self, ServiceName, Source};
use crate::wire;
use crate::{cache, engine};

pub const USAGE: &str = "\
localdns-fallback: the DNS forwarder of last resort for an AKS node whose LocalDNS has failed.

USAGE:
    localdns-fallback [FLAGS]                  serve
    localdns-fallback discover [--json] [FLAGS]  print the upstreams it would use, then exit
    localdns-fallback release-addresses [FLAGS]  remove the listener addresses it puts on lo, then exit
    localdns-fallback status [FLAGS]           say in one line who answers the listeners: exit 0
                                               LocalDNS, 1 a fallback or nothing, 2 cannot tell

Serves the node listener (--node-listen) and the cluster listener (--cluster-listen) over UDP and
TCP. The cluster listener relays every name to the kube-dns servers; the node listener relays
names under --cluster-domain to the kube-dns servers and every other name to the VNet DNS servers.
Upstreams not given by flags are discovered from the node and followed while serving: the VNet DNS
from --resolv-conf (or the DHCP leases while it names none), kube-dns backends from kube-proxy's rules or Cilium.
It never takes the listeners from a LocalDNS that answers its probe name on both: started beside
one, it exits (or, with --standby, waits beside it and serves only while it is silent).

FLAGS:
    --node-listen ADDR          node listener [default: 169.254.10.10:53]
    --cluster-listen ADDR       cluster listener [default: 169.254.10.11:53]
    --node-upstream ADDR        a VNet DNS server; repeat for several (IP, IP:PORT or [IPv6]:PORT)
                                [default: discovered from --resolv-conf]
    --cluster-upstream ADDR     a kube-dns server; repeat for several [default: discovered]
    --resolv-conf PATH          where the VNet DNS servers are listed
                                [default: /run/systemd/resolve/resolv.conf]
    --dhcp-leases DIR           systemd-networkd's DHCP leases: the VNet DNS while --resolv-conf
                                lists none; none turns them off [default: /run/systemd/netif/leases]
    --discovery LIST            where to look for kube-dns, in order, comma-separated, or none
                                [default: iptables,nftables,ipvs,cilium,cluster-ip]
    --kube-dns-service NS/NAME  the service whose backends are kube-dns [default: kube-system/kube-dns]
    --cluster-ip IP             the kube-dns ClusterIP, for ipvs and as the last resort
    --cilium-socket PATH        the Cilium agent's API socket [default: /var/run/cilium/cilium.sock]
    --rediscover-interval DUR   how often to look for kube-dns again [default: 5s]
    --cluster-domain NAME       names under it on the node listener go to kube-dns [default: cluster.local]
    --upstream-timeout DUR      budget for one try at one upstream [default: 1s]
    --query-timeout DUR         budget for a whole query; SERVFAIL after it [default: 2500ms]
    --max-inflight N            queries (UDP and TCP) in flight per relay thread; above it: REFUSED
                                [default: 4096]
    --max-tcp-connections N     TCP client connections per listener [default: 256]
    --tcp-idle-timeout DUR      close a TCP client that sends no full query for this long [default: 10s]
    --cache-size N              answers kept in the cache; 0 turns the cache off [default: 20000]
    --cache-bytes SIZE          memory the cache may use, e.g. 32M or 512K [default: 32M]
    --cache-min-ttl DUR         keep answers at least this long [default: 5s]
    --cache-max-ttl DUR         keep answers at most this long [default: 1h]
    --serve-stale DUR           when upstreams fail, answer from entries expired up to this long
                                ago, with TTL 30; 0 turns it off [default: 1h]
    --udp-threads N             relay threads per listener [default: 1]
    --upstream-sockets N        UDP sockets (random source ports) per upstream and relay thread [default: 8]
    --bind-timeout DUR          keep retrying a busy listener address this long [default: 10s]
    --allow-wildcard            allow a wildcard listen address (0.0.0.0, ::): off, because it would
                                answer on every interface of the node
    --standby                   run beside LocalDNS: ask its probe name every 120 ms, serve within
                                0.5 s of it going silent, hand back when it answers again
    --no-link-setup             do not put the listener addresses on lo (they keep us reachable while
                                LocalDNS recreates its localdns link)
    --metrics ADDR              serve Prometheus metrics at http://ADDR/metrics [default: off]
    --log-level LEVEL           error, warn, info, debug or trace [default: info]
    --json                      with discover: print JSON
    -h, --help                  print this help
    -V, --version               print the version

DUR is a number with a unit: 500ms, 2s, 1m, 1h.";

/// Everything the daemon needs to run, checked.
#[derive(Clone, Debug)]
pub struct Config {
    pub node_listen: SocketAddr,
    pub cluster_listen: SocketAddr,
    pub node_upstreams: Vec<SocketAddr>,
    pub cluster_upstreams: Vec<SocketAddr>,
    /// Display form, for logs.
    pub cluster_domain: String,
    /// Lower-case wire form, for matching.
    pub cluster_domain_wire: Vec<u8>,
    pub upstream_timeout: Duration,
    pub query_timeout: Duration,
    pub max_inflight: usize,
    pub max_tcp_connections: usize,
    pub tcp_idle_timeout: Duration,
    pub upstream_sockets: usize,
    /// Relay threads per listener.
    pub udp_threads: usize,
    pub bind_timeout: Duration,
    /// Listening on 0.0.0.0/:: would make the node an open resolver on every interface.
    pub allow_wildcard: bool,
    /// Where to serve /metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// Put the listener addresses on lo if missing (removed again when serving ends).
    pub link_setup: bool,
    /// Stand by beside LocalDNS and serve only while it does not answer its probe.
    pub standby: bool,
    pub log_level: tracing::Level,
    pub cache: cache::Limits,
    /// Where to look for upstreams not given by flags.
    pub discovery: discover::Settings,
}

impl Default for Config {
    fn default() -> Config {
        let engine = engine::Settings::default();
        Config {
            node_listen: SocketAddr::from(([169, 254, 10, 10], 53)),
            cluster_listen: SocketAddr::from(([169, 254, 10, 11], 53)),
            node_upstreams: Vec::new(),
            cluster_upstreams: Vec::new(),
            cluster_domain: "cluster.local".into(),
            cluster_domain_wire: engine.cluster_domain,
            upstream_timeout: engine.upstream_timeout,
            query_timeout: engine.query_timeout,
            max_inflight: engine.max_inflight,
            max_tcp_connections: 256,
            tcp_idle_timeout: Duration::from_secs(10),
            upstream_sockets: engine.udp_sockets_per_upstream,
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
    /// Say who answers the listeners and exit (node-problem-detector's plugin).
    Status(Box<Config>),
    Help,
    Version,
}

/// Parses the arguments after the program name. Errors are one sentence naming the bad value.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command, String> {
    let mut config = Config::default();
    let mut args = args.into_iter().peekable();
    let discover = args.next_if(|a| a == "discover").is_some();
    let release = !discover && args.next_if(|a| a == "release-addresses").is_some();
    let status = !discover && !release && args.next_if(|a| a == "status").is_some();
    let mut json = false;
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--json" if discover => {
                json = true;
                continue;
            }
            "--allow-wildcard" => {
                config.allow_wildcard = true;
                continue;
            }
            "--no-link-setup" => {
                config.link_setup = false;
                continue;
            }
            "--standby" => {
                config.standby = true;
                continue;
            }
            _ => {}
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--node-listen" => config.node_listen = parse_addr(&flag, &value()?)?,
            "--cluster-listen" => config.cluster_listen = parse_addr(&flag, &value()?)?,
            "--node-upstream" => config.node_upstreams.push(parse_addr(&flag, &value()?)?),
            "--cluster-upstream" => config.cluster_upstreams.push(parse_addr(&flag, &value()?)?),
            "--cluster-domain" => {
                let name = value()?;
                config.cluster_domain_wire =
                    wire::encode_name(&name).map_err(|e| format!("--cluster-domain: {e}"))?;
                config.cluster_domain = name.trim_end_matches('.').to_ascii_lowercase();
            }
            "--upstream-timeout" => config.upstream_timeout = parse_duration(&flag, &value()?)?,
            "--query-timeout" => config.query_timeout = parse_duration(&flag, &value()?)?,
            "--max-inflight" => config.max_inflight = parse_count(&flag, &value()?, 1, 1 << 20)?,
            "--max-tcp-connections" => {
                config.max_tcp_connections = parse_count(&flag, &value()?, 1, 1 << 16)?
            }
            "--tcp-idle-timeout" => config.tcp_idle_timeout = parse_duration(&flag, &value()?)?,
            "--upstream-sockets" => {
                config.upstream_sockets = parse_count(&flag, &value()?, 1, 256)?
            }
            "--udp-threads" => config.udp_threads = parse_count(&flag, &value()?, 1, 64)?,
            "--bind-timeout" => config.bind_timeout = parse_duration(&flag, &value()?)?,
            "--cache-size" => config.cache.entries = parse_count(&flag, &value()?, 0, 1 << 24)?,
            "--cache-bytes" => config.cache.bytes = parse_size(&flag, &value()?)?,
            "--cache-min-ttl" => config.cache.min_ttl = parse_duration_or_zero(&flag, &value()?)?,
            "--cache-max-ttl" => config.cache.max_ttl = parse_duration(&flag, &value()?)?,
            "--serve-stale" => config.cache.max_stale = parse_duration_or_zero(&flag, &value()?)?,
            "--metrics" => {
                let v = value()?;
                config.metrics = Some(
                    v.parse()
                        .map_err(|_| format!("--metrics {v:?}: expected IP:PORT"))?,
                )
            }
            "--resolv-conf" => config.discovery.resolv_conf = value()?.into(),
            "--dhcp-leases" => {
                let v = value()?;
                config.discovery.dhcp_leases = (v != "none").then(|| v.into());
            }
            "--discovery" => {
                config.discovery.sources =
                    Source::parse_list(&value()?).map_err(|e| format!("--discovery: {e}"))?
            }
            "--kube-dns-service" => config.discovery.service = parse_service(&value()?)?,
            "--cluster-ip" => {
                let v = value()?;
                config.discovery.cluster_ip = Some(
                    v.parse()
                        .map_err(|_| format!("--cluster-ip {v:?}: expected an IP address"))?,
                )
            }
            "--cilium-socket" => config.discovery.cilium_socket = value()?.into(),
            "--rediscover-interval" => {
                config.discovery.interval = parse_duration(&flag, &value()?)?
            }
            "--log-level" => {
                let v = value()?;
                config.log_level = v.parse().map_err(|_| {
                    format!("--log-level {v:?}: expected error, warn, info, debug or trace")
                })?
            }
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    check(&config)?;
    if discover {
        return Ok(Command::Discover {
            config: Box::new(config),
            json,
        });
    }
    if release {
        return Ok(Command::ReleaseAddresses(Box::new(config)));
    }
    if status {
        return Ok(Command::Status(Box::new(config)));
    }
    Ok(Command::Run(Box::new(config)))
}

fn parse_service(s: &str) -> Result<ServiceName, String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(ServiceName {
                namespace: ns.into(),
                name: name.into(),
            })
        }
        _ => Err(format!("--kube-dns-service {s:?}: expected NAMESPACE/NAME")),
    }
}

fn check(c: &Config) -> Result<(), String> {
    if c.upstream_timeout > c.query_timeout {
        return Err(format!(
            "--upstream-timeout {:?} is longer than --query-timeout {:?}",
            c.upstream_timeout, c.query_timeout
        ));
    }
    // Each try takes a query ID on one of an upstream's sockets, and one upstream may get every
    // try: with too few sockets for the in-flight cap, finding a free ID would take ever more
    // draws. Keep the IDs at most a quarter used (4 tries per query, 65,536 IDs per socket).
    if c.max_inflight * 4 * 4 > c.upstream_sockets * 65_536 {
        return Err(format!(
            "--max-inflight {} needs at least {} --upstream-sockets (query IDs per upstream would run short)",
            c.max_inflight,
            (c.max_inflight * 16).div_ceil(65_536)
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
    for listen in [c.node_listen, c.cluster_listen] {
        for up in c.node_upstreams.iter().chain(&c.cluster_upstreams) {
            if *up == listen {
                return Err(format!(
                    "upstream {up} is one of our own listeners: that would loop"
                ));
            }
        }
    }
    Ok(())
}

/// `IP`, `IP:PORT` or `[IPv6]:PORT`; a bare IP means port 53.
pub fn parse_addr(flag: &str, s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 53));
    }
    Err(format!("{flag} {s:?}: expected IP, IP:PORT or [IPv6]:PORT"))
}

/// Like `parse_duration`, but a bare `0` means zero (off).
fn parse_duration_or_zero(flag: &str, s: &str) -> Result<Duration, String> {
    if s == "0" {
        Ok(Duration::ZERO)
    } else {
        parse_duration(flag, s)
    }
}

/// Bytes, with an optional K, M or G suffix (powers of 1024).
fn parse_size(flag: &str, s: &str) -> Result<usize, String> {
    let bad = || format!("{flag} {s:?}: expected a size such as 32M, 512K or 1048576");
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: usize = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).filter(|&b| b > 0).ok_or_else(bad)
}

pub fn parse_duration(flag: &str, s: &str) -> Result<Duration, String> {
    let bad = || format!("{flag} {s:?}: expected a duration such as 500ms, 2s, 1m or 1h");
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
        return Err(format!("{flag} {s:?}: must be more than zero"));
    }
    Ok(d)
}

fn parse_count(flag: &str, s: &str, min: usize, max: usize) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag} {s:?}: expected a whole number from {min} to {max}"
        )),
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
            c.cluster_domain_wire,
            wire::encode_name("cluster.local").unwrap()
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
        assert_eq!(c.upstream_timeout, Duration::from_millis(300));
        assert_eq!(c.query_timeout, Duration::from_secs(2));
        assert_eq!(c.cluster_domain, "corp.example");
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
        let off = run(&["--dhcp-leases", "none"]).unwrap();
        assert_eq!(off.discovery.dhcp_leases, None);
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
        let args = ["status", "--cluster-listen", "127.0.0.2:5353"].map(String::from);
        match parse(args).unwrap() {
            Command::Status(config) => {
                assert_eq!(config.cluster_listen.to_string(), "127.0.0.2:5353");
                assert_eq!(config.node_listen.to_string(), "169.254.10.10:53");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn help_and_version() {
        assert!(matches!(parse(["--help".to_string()]), Ok(Command::Help)));
        assert!(matches!(parse(["-V".to_string()]), Ok(Command::Version)));
    }
}
