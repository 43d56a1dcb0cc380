//! Network namespaces, the standard node/upstream topology, and [`Place`]: where a client or
//! server of a test runs (the test's own namespace, or one the test created).

use super::unique_name;
use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Once;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// The two addresses of the `localdns` interface.
pub const LOCALDNS_10: Ipv4Addr = Ipv4Addr::new(169, 254, 10, 10);
pub const LOCALDNS_11: Ipv4Addr = Ipv4Addr::new(169, 254, 10, 11);

/// `addr:53` as a socket address.
pub fn dns53(addr: impl Into<IpAddr>) -> SocketAddr {
    SocketAddr::new(addr.into(), 53)
}

/// Runs `cmd` and panics with its stderr unless it exits 0.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

/// A named network namespace (`ip netns add`), deleted on drop together with
/// `/etc/netns/<name>` and any process still running inside it.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Creates `lf{pid}x{n}-{tag}` with `lo` up. `tag` only helps a human
    /// reading `ip netns list`; it is cut to 8 characters.
    pub fn new(tag: &str) -> Netns {
        remove_stale_namespaces();
        let tag: String = tag
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(8)
            .collect();
        let name = if tag.is_empty() {
            unique_name()
        } else {
            format!("{}-{tag}", unique_name())
        };
        run_ok(Command::new("ip").args(["netns", "add", &name]));
        // Built right after `add` so that Drop deletes it if a later step panics.
        let ns = Netns { name };
        ns.ip("link set lo up");
        ns
    }

    /// Path of the namespace handle that `setns` opens.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.name))
    }

    /// A Command running `prog args...` inside the namespace via
    /// `ip netns exec`, which also bind-mounts `/etc/netns/<name>/*` over
    /// `/etc/*`. `ip netns exec` execs the program itself, so the child's pid
    /// is the program's pid.
    pub fn exec<I, S>(&self, prog: impl AsRef<OsStr>, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Place::from(self).command(prog, args)
    }

    /// Runs `ip -n <name> <args>` (args split on whitespace); panics with
    /// stderr on failure.
    pub fn ip(&self, args: &str) -> String {
        let out = run_ok(
            Command::new("ip")
                .args(["-n", &self.name])
                .args(args.split_whitespace()),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Writes `/etc/netns/<name>/resolv.conf`; processes started with
    /// [`Netns::exec`] then see it as `/etc/resolv.conf`.
    pub fn set_resolv_conf(&self, contents: &str) {
        let dir = self.etc_dir();
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let path = dir.join("resolv.conf");
        std::fs::write(&path, contents)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }

    fn etc_dir(&self) -> PathBuf {
        PathBuf::from(format!("/etc/netns/{}", self.name))
    }

    /// Runs `f` on a fresh thread that first joins this namespace; sockets
    /// created there belong to the namespace and stay in it wherever they are
    /// used afterwards. A panic in `f` is propagated.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        enter_named(&self.name, f)
    }

    /// Pids of the processes living in this namespace (`ip netns pids`).
    pub fn pids(&self) -> Vec<i32> {
        let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        else {
            return Vec::new();
        };
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Whatever still runs in here was started by this test (servers, their
        // forked TCP helpers): kill it, or the namespace would live on
        // anonymously after `ip netns del`.
        let me = std::process::id() as i32;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pids: Vec<i32> = self.pids().into_iter().filter(|&p| p != me).collect();
            if pids.is_empty() || Instant::now() >= deadline {
                break;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match Command::new("ip")
            .args(["netns", "del", &self.name])
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "harness: ip netns del {} failed: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("harness: cannot run ip netns del {}: {e}", self.name),
        }
        let etc = self.etc_dir();
        if etc.exists() {
            if let Err(e) = std::fs::remove_dir_all(&etc) {
                eprintln!("harness: cannot remove {}: {e}", etc.display());
            }
        }
    }
}

/// Runs `f` on a fresh thread that first joins the named namespace (see [`Netns::enter`]).
fn enter_named<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = PathBuf::from(format!("/var/run/netns/{name}"));
    std::thread::scope(|scope| {
        let handle = scope.spawn(move || {
            let file = std::fs::File::open(&path)
                .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns({}) failed: {e}", path.display()));
            f()
        });
        handle
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Where a client, server or forwarder of a test runs: `Here` is the namespace the calling
/// thread is in (the host's, for the loopback tier), `Ns` a namespace the test created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    Here,
    Ns(String),
}

impl Place {
    /// A Command running `prog args...` at this place (`ip netns exec` for a namespace).
    pub fn command<I, S>(&self, prog: impl AsRef<OsStr>, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        match self {
            Place::Here => {
                let mut cmd = Command::new(prog);
                cmd.args(args);
                cmd
            }
            Place::Ns(name) => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", name]).arg(prog).args(args);
                cmd
            }
        }
    }

    /// Runs `f` at this place: sockets it creates belong there (see [`Netns::enter`]).
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        match self {
            Place::Here => f(),
            Place::Ns(name) => enter_named(name, f),
        }
    }

    /// For error messages.
    pub fn describe(&self) -> String {
        match self {
            Place::Here => "the test's own namespace".to_string(),
            Place::Ns(name) => format!("namespace {name}"),
        }
    }
}

impl From<&Netns> for Place {
    fn from(ns: &Netns) -> Place {
        Place::Ns(ns.name.clone())
    }
}

impl From<&Place> for Place {
    fn from(p: &Place) -> Place {
        p.clone()
    }
}

/// Deletes namespaces (and their /etc/netns dirs) left by harness processes
/// that died without running Drop (SIGKILL): names `lf{pid}x...` whose pid is
/// gone. Only the names are removed; nothing is killed. Runs once per process.
fn remove_stale_namespaces() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(entries) = std::fs::read_dir("/var/run/netns") else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix("lf")
                .and_then(|rest| rest.split_once('x'))
                .and_then(|(pid, _)| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if pid == std::process::id() || std::path::Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{name}"));
        }
    });
}

/// The standard layout: a node namespace holding the `localdns` veth
/// (`localdns` <-> `localdns-p`, both inside the node namespace, both up) with
/// 169.254.10.10/32 and 169.254.10.11/32 on `localdns`, plus upstream
/// namespaces each linked to the node by its own veth pair.
pub struct Topology {
    pub node: Netns,
    next_index: AtomicU8,
}

/// An upstream namespace linked to the node namespace, index k = 1, 2, ...:
/// node side `up{k}` with 198.18.k.1/24 and fd00:18:k::1/64, upstream side
/// `eth0` with 198.18.k.2/24 and fd00:18:k::2/64. The upstream side also
/// carries a spare address (198.18.k.3 / fd00:18:k::3) that a spoofing
/// responder can send from.
pub struct Upstream {
    pub ns: Netns,
    pub index: u8,
    /// Address of the upstream side (where its DNS server listens).
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
    /// A second address of the upstream namespace, for forged replies.
    pub alt_v4: Option<Ipv4Addr>,
    pub alt_v6: Option<Ipv6Addr>,
    /// Address of the node side of the link.
    pub node_v4: Option<Ipv4Addr>,
    pub node_v6: Option<Ipv6Addr>,
    /// Interface name of the link inside the node namespace (`ip link set
    /// <it> down` there cuts the upstream off).
    pub node_ifname: String,
}

impl Upstream {
    /// `v4:53`; panics if the upstream has no IPv4.
    pub fn sock_v4(&self) -> SocketAddr {
        dns53(self.v4.expect("upstream has no IPv4 address"))
    }

    /// `[v6]:53`; panics if the upstream has no IPv6.
    pub fn sock_v6(&self) -> SocketAddr {
        dns53(self.v6.expect("upstream has no IPv6 address"))
    }
}

impl Topology {
    pub fn new() -> Topology {
        let node = Netns::new("node");
        node.ip("link add localdns type veth peer name localdns-p");
        node.ip("addr add 169.254.10.10/32 dev localdns");
        node.ip("addr add 169.254.10.11/32 dev localdns");
        node.ip("link set localdns up");
        node.ip("link set localdns-p up");
        Topology {
            node,
            next_index: AtomicU8::new(1),
        }
    }

    /// Creates the next upstream namespace. Connected routes are all the
    /// node needs; the upstream gets no default route, so a server in it can
    /// never reach anything outside the test.
    pub fn add_upstream_ns(&self, v4: bool, v6: bool) -> Upstream {
        assert!(v4 || v6, "an upstream needs at least one address family");
        let k = self.next_index.fetch_add(1, Ordering::Relaxed);
        assert!((1..255).contains(&k), "too many upstreams");

        let ns = Netns::new(&format!("up{k}"));
        let node_if = format!("up{k}");
        // Created inside the node namespace with the peer placed directly in
        // the upstream namespace: no interface ever exists in the host
        // namespace, so names cannot collide across tests.
        self.node.ip(&format!(
            "link add {node_if} type veth peer name eth0 netns {}",
            ns.name
        ));
        let mut up = Upstream {
            ns,
            index: k,
            v4: None,
            v6: None,
            alt_v4: None,
            alt_v6: None,
            node_v4: None,
            node_v6: None,
            node_ifname: node_if.clone(),
        };
        if v4 {
            self.node
                .ip(&format!("addr add 198.18.{k}.1/24 dev {node_if}"));
            up.ns.ip(&format!("addr add 198.18.{k}.2/24 dev eth0"));
            up.ns.ip(&format!("addr add 198.18.{k}.3/32 dev eth0"));
            up.node_v4 = Some(Ipv4Addr::new(198, 18, k, 1));
            up.v4 = Some(Ipv4Addr::new(198, 18, k, 2));
            up.alt_v4 = Some(Ipv4Addr::new(198, 18, k, 3));
        }
        if v6 {
            // nodad: the address is usable at once instead of after ~1 s of
            // duplicate address detection (binding to a tentative address fails).
            self.node
                .ip(&format!("addr add fd00:18:{k}::1/64 dev {node_if} nodad"));
            up.ns
                .ip(&format!("addr add fd00:18:{k}::2/64 dev eth0 nodad"));
            up.ns
                .ip(&format!("addr add fd00:18:{k}::3/128 dev eth0 nodad"));
            let seg = u16::from(k);
            up.node_v6 = Some(Ipv6Addr::new(0xfd00, 0x18, seg, 0, 0, 0, 0, 1));
            up.v6 = Some(Ipv6Addr::new(0xfd00, 0x18, seg, 0, 0, 0, 0, 2));
            up.alt_v6 = Some(Ipv6Addr::new(0xfd00, 0x18, seg, 0, 0, 0, 0, 3));
        }
        self.node.ip(&format!("link set {node_if} up"));
        up.ns.ip("link set eth0 up");
        up
    }
}

impl Default for Topology {
    fn default() -> Self {
        Topology::new()
    }
}
