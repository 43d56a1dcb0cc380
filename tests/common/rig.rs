//! The rig of an end-to-end test: upstream responders, the forwarder relaying to them, and the
//! place its clients run. Two sites, same API:
//!
//! - loopback: everything on the host's 127.0.0.0/8 with ports the kernel picks, the binary told
//!   its listeners and upstreams by flag (no discovery, no link setup). Needs no root, so most of
//!   the suite runs in a contributor's plain `cargo test`.
//! - namespaces: the node namespace with the `localdns` link (169.254.10.10/.11 port 53) and one
//!   upstream namespace per responder, for what needs the node's own addresses or privileges.
//!   Fails loudly when not root.

use super::client::{DigResult, dig_to, kdig_to};
use super::forwarder::{Forwarder, Launch};
use super::localdns::{LocalDns, LocalDnsOptions};
use super::netns::{LOCALDNS_10, LOCALDNS_11, Netns, Place, Topology, Upstream, dns53};
use super::responder::{Mode, Responder};
use super::{require_root_and_tools, require_tools};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A loopback address no other rig of this process uses, so that a test's listeners and
/// upstreams are told apart in logs and a spoofing responder has a source of its own. The second
/// octet comes from the pid: test binaries run side by side.
pub fn loopback_ip() -> Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    Ipv4Addr::new(
        127,
        (10 + pid % 240) as u8,
        ((n / 250) % 256) as u8,
        (n % 250 + 1) as u8,
    )
}

/// An address on loopback where nothing listens: the kernel refuses UDP with ICMP port
/// unreachable and TCP with a reset, as for a backend whose server is gone. Also where to start a
/// server that must be told its port up front (dnsmasq, unbound, knotd).
pub fn free_loopback_port() -> SocketAddr {
    let probe = std::net::UdpSocket::bind((loopback_ip(), 0)).expect("bind a loopback port");
    probe.local_addr().expect("local_addr of a bound socket")
}

/// The flags of a forwarder on loopback: its listeners on fresh loopback addresses with ports
/// the kernel picks (see [`Forwarder::listening_on`]), the upstreams given, nothing discovered
/// and no link made, then `extra`.
pub fn loopback_forwarder_args(
    node_upstreams: &[SocketAddr],
    cluster_upstreams: &[SocketAddr],
    extra: &[&str],
) -> Vec<String> {
    let mut args = Vec::new();
    for (flag, ups) in [
        ("--node-upstream", node_upstreams),
        ("--cluster-upstream", cluster_upstreams),
    ] {
        for up in ups {
            args.extend([flag.to_string(), up.to_string()]);
        }
    }
    for flag in ["--node-listen", "--cluster-listen"] {
        args.extend([flag.to_string(), format!("{}:0", loopback_ip())]);
    }
    args.extend(
        ["--discovery", "none", "--no-link-setup"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string()),
    );
    args
}

/// Where the rig is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    Loopback,
    Namespaces,
}

/// What the rig is built of; see [`Rig::loopback`] and [`Rig::namespaces`].
pub struct RigBuilder {
    site: Site,
    /// One per upstream: its responder's mode, or None for an address where nothing listens.
    upstreams: Vec<Option<Mode>>,
    node_to: Option<Vec<usize>>,
    cluster_to: Option<Vec<usize>>,
    flags: Vec<String>,
    tools: Vec<&'static str>,
    nofile: Option<u64>,
}

impl RigBuilder {
    /// Runs the forwarder under `n` descriptors (soft and hard), as a start by hand may.
    pub fn nofile(mut self, n: u64) -> RigBuilder {
        self.nofile = Some(n);
        self.tools.push("prlimit");
        self
    }

    /// One more upstream, answering as `mode`; its index is the number added before it.
    pub fn upstream(mut self, mode: Mode) -> RigBuilder {
        self.upstreams.push(Some(mode));
        self
    }

    /// One more upstream address where nothing listens.
    pub fn closed_upstream(mut self) -> RigBuilder {
        self.upstreams.push(None);
        self
    }

    /// The upstreams (by index) the node listener's names outside the cluster domain go to
    /// (`--node-upstream`); upstream 0 unless given.
    pub fn node_to(mut self, upstreams: &[usize]) -> RigBuilder {
        self.node_to = Some(upstreams.to_vec());
        self
    }

    /// The upstreams (by index) that are kube-dns (`--cluster-upstream`); upstream 0 unless given.
    pub fn cluster_to(mut self, upstreams: &[usize]) -> RigBuilder {
        self.cluster_to = Some(upstreams.to_vec());
        self
    }

    /// More forwarder flags.
    pub fn flags(mut self, flags: &[&str]) -> RigBuilder {
        self.flags.extend(flags.iter().map(|s| s.to_string()));
        self
    }

    /// Tools the test runs besides `dig` (which every rig needs).
    pub fn tools(mut self, tools: &[&'static str]) -> RigBuilder {
        self.tools.extend_from_slice(tools);
        self
    }

    pub fn start(self) -> Rig {
        let mut tools = vec!["dig"];
        tools.extend_from_slice(&self.tools);
        match self.site {
            Site::Loopback => require_tools(&tools),
            Site::Namespaces => {
                tools.push("ip");
                require_root_and_tools(&tools);
            }
        }
        assert!(!self.upstreams.is_empty(), "a rig needs an upstream");
        let topo = (self.site == Site::Namespaces).then(Topology::new);
        let at = topo.as_ref().map_or(Place::Here, |t| Place::from(&t.node));
        let mut ups = Vec::new();
        let mut responders = Vec::new();
        let mut addrs = Vec::new();
        for mode in self.upstreams {
            let addr = match &topo {
                Some(topo) => {
                    let up = topo.add_upstream_ns(true, false);
                    let addr = up.sock_v4();
                    responders.push(mode.map(|m| Responder::start(&up.ns, addr, m)));
                    ups.push(up);
                    addr
                }
                None => match mode {
                    Some(m) => {
                        let r = Responder::start(
                            Place::Here,
                            SocketAddr::new(IpAddr::V4(loopback_ip()), 0),
                            m,
                        );
                        let addr = r.addr();
                        responders.push(Some(r));
                        addr
                    }
                    None => {
                        responders.push(None);
                        free_loopback_port()
                    }
                },
            };
            addrs.push(addr);
        }
        let pick = |to: Option<Vec<usize>>| -> Vec<SocketAddr> {
            to.unwrap_or_else(|| vec![0])
                .iter()
                .map(|&i| addrs[i])
                .collect()
        };
        let (node_ups, cluster_ups) = (pick(self.node_to), pick(self.cluster_to));
        let flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        let args = if topo.is_some() {
            let mut args = Vec::new();
            for (flag, ups) in [
                ("--node-upstream", &node_ups),
                ("--cluster-upstream", &cluster_ups),
            ] {
                for up in ups {
                    args.extend([flag.to_string(), up.to_string()]);
                }
            }
            args.extend(self.flags.iter().cloned());
            args
        } else {
            loopback_forwarder_args(&node_ups, &cluster_ups, &flags)
        };
        let launch = Launch {
            nofile: self.nofile,
            ..Launch::default()
        };
        let fwd = Forwarder::launch(&at, &args, &[], launch);
        let (node, cluster) = match topo {
            Some(_) => (dns53(LOCALDNS_10), dns53(LOCALDNS_11)),
            None => (
                fwd.listening_on("node", Duration::from_secs(10)),
                fwd.listening_on("cluster", Duration::from_secs(10)),
            ),
        };
        for listener in [node, cluster] {
            fwd.wait_ready(&at, listener, Duration::from_secs(10));
        }
        // The readiness probes are answered locally; count from zero anyway.
        for r in responders.iter().flatten() {
            r.reset_counts();
        }
        Rig {
            fwd,
            responders,
            upstreams: addrs,
            node,
            cluster,
            at,
            ups,
            topo,
        }
    }
}

/// A running rig. Fields drop in order: the forwarder first, the namespaces last.
pub struct Rig {
    pub fwd: Forwarder,
    /// One per upstream, by index; None where nothing listens (or a test took it away).
    pub responders: Vec<Option<Responder>>,
    /// The address of each upstream, by index.
    pub upstreams: Vec<SocketAddr>,
    /// The forwarder's node listener.
    pub node: SocketAddr,
    /// The forwarder's cluster listener.
    pub cluster: SocketAddr,
    /// Where clients run: the host for loopback, the node namespace otherwise.
    pub at: Place,
    /// The upstream namespaces of a namespace rig, by index.
    pub ups: Vec<Upstream>,
    pub topo: Option<Topology>,
}

impl Rig {
    /// A rig on the host's loopback (no root).
    pub fn loopback() -> RigBuilder {
        Rig::builder(Site::Loopback)
    }

    /// A rig in network namespaces, the forwarder on the node's real listener addresses (root).
    pub fn namespaces() -> RigBuilder {
        Rig::builder(Site::Namespaces)
    }

    pub fn builder(site: Site) -> RigBuilder {
        RigBuilder {
            site,
            upstreams: Vec::new(),
            node_to: None,
            cluster_to: None,
            flags: Vec::new(),
            tools: Vec::new(),
            nofile: None,
        }
    }

    /// The node namespace; panics for a loopback rig.
    pub fn node_ns(&self) -> &Netns {
        &self.topo.as_ref().expect("a namespace rig").node
    }

    /// The responder of upstream `i`; panics if none runs there.
    pub fn responder(&self, i: usize) -> &Responder {
        self.responders[i]
            .as_ref()
            .unwrap_or_else(|| panic!("no responder runs at upstream {i}"))
    }

    /// Queries upstream `i` has received so far (0 once it was taken away).
    pub fn upstream_queries(&self, i: usize) -> usize {
        self.responders[i].as_ref().map_or(0, Responder::queries)
    }

    /// Stops the responder of upstream `i` and starts one answering as `mode` at its address.
    pub fn replace_upstream(&mut self, i: usize, mode: Mode) {
        self.responders[i] = None;
        let at = self
            .ups
            .get(i)
            .map_or(Place::Here, |up| Place::from(&up.ns));
        self.responders[i] = Some(Responder::start(at, self.upstreams[i], mode));
    }

    /// `dig` from the rig's client place to `to` (a listener, usually).
    pub fn dig(&self, to: SocketAddr, args: &[&str]) -> DigResult {
        dig_to(&self.at, to, args)
    }

    /// `kdig` from the rig's client place to `to`.
    pub fn kdig(&self, to: SocketAddr, args: &[&str]) -> DigResult {
        kdig_to(&self.at, to, args)
    }
}

/// A node namespace (listeners on link `localdns`) and one upstream namespace whose responder
/// answers every A query with 10.0.0.1: what a standby test needs beside its own LocalDNS. The
/// caller checks for root and its own tools first.
pub fn node_and_upstream() -> (Topology, Upstream, Responder) {
    require_root_and_tools(&["ip"]);
    let topo = Topology::new();
    let up = topo.add_upstream_ns(true, false);
    let r = Responder::start(
        &up.ns,
        up.sock_v4(),
        Mode::Normal {
            answer_v4: Ipv4Addr::new(10, 0, 0, 1),
        },
    );
    (topo, up, r)
}

/// A node namespace, one upstream answering 10.0.0.1, the stand-in LocalDNS `localdns` makes, and
/// the standby beside it ([`Forwarder::standby`], with `args`), standing by and having seen the
/// stand-in answer its probe.
pub fn standby_beside(
    localdns: LocalDnsOptions,
    args: &[&str],
) -> (Topology, Upstream, Responder, LocalDns, Forwarder) {
    let (topo, up, r) = node_and_upstream();
    let localdns = localdns.start(&topo.node);
    let f = Forwarder::standby(&topo.node, &up, args);
    localdns.wait_stood_by(&f, 2, Duration::from_secs(10));
    (topo, up, r, localdns, f)
}
