//! kube-proxy nftables discovery against real kernel rules.
//!
//! Each test makes a network namespace of its own, loads a kube-proxy-shaped ruleset into it
//! (`tests/fixtures/nftables/*.nft`, or a generated one), and reads it back with `nft -j` the way
//! a node would be read. Nothing is hooked into netfilter and no packet is sent; the host
//! namespace's rules are never touched. These tests need root and `nft`, and fail rather than
//! skip without them, so a green run always means the kernel was asked.

use localdns_fallback::discover::nftables;
use localdns_fallback::discover::{KubeDns, ServiceName};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// A network namespace named `lfnft<pid>-<n>`, deleted on drop, also when the test panics.
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Netns {
        require_root_and_nft();
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "lfnft{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        run(Command::new("ip").args(["netns", "add", &name]));
        Netns { name }
    }

    /// `nft ARGS` inside the namespace; panics with nft's stderr if it fails.
    fn nft(&self, args: &[&str]) -> String {
        run(Command::new("ip")
            .args(["netns", "exec", &self.name, "nft"])
            .args(args))
    }

    /// Loads an nft script (one atomic transaction, as kube-proxy does).
    fn load(&self, script: &str) {
        let file = ScratchFile::new(&format!("{}.nft", self.name), script);
        self.nft(&["-f", &file.0.to_string_lossy()]);
    }

    /// The table as `nftables::discover` would read it, parsed.
    fn discover_family(&self, family: &str) -> KubeDns {
        let json = self.nft(&["-j", "list", "table", family, "kube-proxy"]);
        nftables::parse(&json, &ServiceName::default())
            .unwrap_or_else(|e| panic!("{family} kube-proxy in {}: {e}", self.name))
    }

    /// Runs `nftables::discover()` itself on a thread that has entered this namespace: nft talks
    /// netlink in its caller's namespace, and the child `tool::run` spawns inherits the thread's.
    fn discover(&self) -> Result<KubeDns, String> {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let handle = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            nix::sched::setns(handle, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns into {path}: {e}"));
            nftables::discover(&ServiceName::default())
        })
        .join()
        .expect("the discovery thread panicked")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let deleted = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        if !deleted.as_ref().is_ok_and(|s| s.success()) {
            eprintln!(
                "warning: could not delete network namespace {}: {deleted:?}",
                self.name
            );
        }
    }
}

/// A file in the temp directory, removed on drop.
struct ScratchFile(PathBuf);

impl ScratchFile {
    fn new(name: &str, text: &str) -> ScratchFile {
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        ScratchFile(path)
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn require_root_and_nft() {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .expect("cannot run id -u");
    assert_eq!(
        String::from_utf8_lossy(&uid.stdout).trim(),
        "0",
        "tests/discover_nftables.rs must run as root: it creates network namespaces and loads \
         nftables rules into them (run `sudo -E cargo test --test discover_nftables`)"
    );
    let nft = Command::new("nft").arg("--version").output();
    assert!(
        nft.is_ok_and(|o| o.status.success()),
        "nft is not installed (apt-get install nftables): these tests need it and do not skip"
    );
}

/// Runs a command and returns its stdout; panics with its stderr unless it exits 0.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("nft printed something that is not UTF-8")
}

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/nftables/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

/// Loads `<case>.nft`, checks what is found, and that the checked-in `<case>.json` (which the
/// unit tests read) still says the same as the live kernel.
fn check_fixture(case: &str, family: &str, udp: &[&str], tcp: &[&str], cluster_ip: &str) {
    let ns = Netns::new();
    ns.load(&fixture(&format!("{case}.nft")));
    let found = ns.discover_family(family);
    assert_eq!(found.udp, addrs(udp), "{case}: udp");
    assert_eq!(found.tcp, addrs(tcp), "{case}: tcp (dns-tcp)");
    assert_eq!(
        found.cluster_ip,
        Some(cluster_ip.parse().unwrap()),
        "{case}: cluster IP"
    );
    let checked_in = nftables::parse(&fixture(&format!("{case}.json")), &ServiceName::default());
    assert_eq!(
        checked_in,
        Ok(found),
        "{case}.json is stale: run tests/fixtures/nftables/regen.sh"
    );
}

#[test]
fn one_endpoint() {
    let one = ["10.244.0.5:53"];
    check_fixture("one-endpoint", "ip", &one, &one, "10.0.0.10");
}

#[test]
fn two_endpoints() {
    let two = ["10.244.0.5:53", "10.244.1.7:53"];
    check_fixture("two-endpoints", "ip", &two, &two, "10.0.0.10");
}

#[test]
fn three_endpoints_with_affinity_and_a_stale_endpoint_chain() {
    let three = ["10.244.0.5:53", "10.244.1.7:53", "10.244.2.11:53"];
    check_fixture("three-endpoints-stale", "ip", &three, &three, "10.0.0.10");
}

#[test]
fn ipv6() {
    let two = ["[fd00:10:244::5]:53", "[fd00:10:244:1::7]:53"];
    check_fixture("ipv6", "ip6", &two, &two, "fd00:10:96::a");
}

#[test]
fn no_kube_dns() {
    let ns = Netns::new();
    ns.load(&fixture("no-kube-dns.nft"));
    assert_eq!(ns.discover_family("ip"), KubeDns::default());
}

/// A big cluster's table: 10,000 services with an endpoint each, kube-dns in the middle. (It runs
/// alone: .config/nextest.toml says why.)
#[test]
fn ten_thousand_services() {
    let ns = Netns::new();
    let started = Instant::now();
    ns.load(&big_table(10_000, 5_000));
    let loaded = started.elapsed();
    let json = ns.nft(&["-j", "list", "table", "ip", "kube-proxy"]);
    let listed = started.elapsed() - loaded;
    let parse_started = Instant::now();
    let found = nftables::parse(&json, &ServiceName::default()).expect("the big table parses");
    eprintln!(
        "10,000 services: load {loaded:?}, nft -j list {listed:?} ({} bytes), parse {:?}",
        json.len(),
        parse_started.elapsed()
    );
    let three = addrs(&["10.244.0.5:53", "10.244.1.7:53", "10.244.2.11:53"]);
    assert_eq!(found.udp, three);
    assert_eq!(found.tcp, three);
    assert_eq!(found.cluster_ip, Some("10.0.0.10".parse().unwrap()));
    let service_chains = json
        .matches(r#""table": "kube-proxy", "name": "service-"#)
        .count();
    assert_eq!(
        service_chains, 10_001,
        "9,999 others and kube-dns's two ports are listed"
    );
}

#[test]
fn discover_reads_both_families_in_the_namespace() {
    let ns = Netns::new();
    ns.load(&fixture("two-endpoints.nft"));
    ns.load(&fixture("ipv6.nft"));
    let found = ns.discover().expect("both tables are readable");
    let want = addrs(&[
        "10.244.0.5:53",
        "10.244.1.7:53",
        "[fd00:10:244::5]:53",
        "[fd00:10:244:1::7]:53",
    ]);
    assert_eq!(found.udp, want, "IPv4 first, then IPv6");
    assert_eq!(found.tcp, want);
    assert_eq!(found.cluster_ip, Some("10.0.0.10".parse().unwrap()));
}

#[test]
fn discover_with_one_family_or_none() {
    let ns = Netns::new();
    let err = ns
        .discover()
        .expect_err("an empty namespace has no kube-proxy table");
    assert!(err.contains("not in nftables mode"), "{err}");

    ns.load(&fixture("ipv6.nft"));
    let found = ns.discover().expect("the ip6 table alone is enough");
    assert_eq!(
        found.udp,
        addrs(&["[fd00:10:244::5]:53", "[fd00:10:244:1::7]:53"])
    );

    ns.nft(&["delete", "table", "ip6", "kube-proxy"]);
    ns.load(&fixture("one-endpoint.nft"));
    let found = ns.discover().expect("the ip table alone is enough");
    assert_eq!(found.udp, addrs(&["10.244.0.5:53"]));
}

/// kube-proxy's shapes for `services` unrelated services (one endpoint each) with kube-dns, three
/// endpoints on both ports, in place of number `kube_dns_at`. Chain hashes are made up: only
/// kube-proxy computes them, and nothing reads them.
fn big_table(services: usize, kube_dns_at: usize) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    let mut elements = String::new();
    let t = "ip kube-proxy";
    let mut made = 0;
    let mut add_service = |base: String,
                           cluster_ip: String,
                           proto: &str,
                           port: u16,
                           endpoints: &[(String, u16)]| {
        made += 1;
        let service = format!("service-H{made:07}-{base}");
        chains += &format!("add chain {t} {service}\n");
        let mut vmap = Vec::new();
        for (i, (ip, target_port)) in endpoints.iter().enumerate() {
            let endpoint = format!("endpoint-E{i:07}-{base}__{ip}/{target_port}");
            chains += &format!("add chain {t} {endpoint}\n");
            rules += &format!("add rule {t} {endpoint} ip saddr {ip} jump mark-for-masquerade\n");
            rules += &format!(
                "add rule {t} {endpoint} meta l4proto {proto} dnat to {ip}:{target_port}\n"
            );
            vmap.push(format!("{i} : goto {endpoint}"));
        }
        rules += &format!(
            "add rule {t} {service} numgen random mod {} vmap {{ {} }}\n",
            endpoints.len(),
            vmap.join(" , ")
        );
        elements += &format!(
            "add element {t} service-ips {{ {cluster_ip} . {proto} . {port} : goto {service} }}\n"
        );
    };
    for i in 0..services {
        if i == kube_dns_at {
            let pods: Vec<(String, u16)> = ["10.244.0.5", "10.244.1.7", "10.244.2.11"]
                .iter()
                .map(|ip| (ip.to_string(), 53))
                .collect();
            add_service(
                "kube-system/kube-dns/udp/dns".into(),
                "10.0.0.10".into(),
                "udp",
                53,
                &pods,
            );
            add_service(
                "kube-system/kube-dns/tcp/dns-tcp".into(),
                "10.0.0.10".into(),
                "tcp",
                53,
                &pods,
            );
            continue;
        }
        let (hi, lo) = (i / 250, i % 250 + 1);
        add_service(
            format!("ns{i}/svc{i}/tcp/http"),
            format!("10.1.{hi}.{lo}"),
            "tcp",
            80,
            &[(format!("10.200.{hi}.{lo}"), 8080)],
        );
    }
    format!(
        "add table {t} {{ comment \"rules for kube-proxy\" ; }}\n\
         add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}\n\
         add chain {t} mark-for-masquerade\n\
         add chain {t} services\n\
         add rule {t} mark-for-masquerade mark set mark or 0x4000\n\
         add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         {chains}{rules}{elements}"
    )
}
