//! Discovery against real node state: kube-proxy-shaped rules loaded with the real `iptables` into a
//! test namespace, resolv.conf files rewritten under a running daemon, and the daemon following a
//! kube-dns backend that moves. Rules are never hooked into a base chain (nothing is translated)
//! and live only in the test's own namespace.

mod common;

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::*;
use localdns_fallback::discover::{KubeDns, ServiceName, iptables};

const KUBE_DNS_SVC_UDP: &str = "KUBE-SVC-TCOU7JCQXEZGVUNU";
const KUBE_DNS_SVC_TCP: &str = "KUBE-SVC-ERIFXISQEP7F7OF4";

/// An `iptables-restore` nat table shaped as kube-proxy writes it: `unrelated` other services,
/// kube-dns's `dns` (udp) and `dns-tcp` (tcp) ports spread over `endpoints` with statistic rules.
fn kube_proxy_nat(endpoints: &[SocketAddr], unrelated: usize) -> String {
    let mut t = String::from(
        "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-NODEPORTS - [0:0]\n",
    );
    let mut rules = String::new();
    let mut chains = String::new();
    for i in 0..unrelated {
        let (svc, sep) = (format!("KUBE-SVC-U{i:015}"), format!("KUBE-SEP-U{i:015}"));
        let ip = Ipv4Addr::from(0x0a00_1000 + i as u32);
        let pod = Ipv4Addr::from(0x0af4_0000 + i as u32);
        let _ = writeln!(chains, ":{svc} - [0:0]\n:{sep} - [0:0]");
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {ip}/32 -p tcp -m comment --comment \"ns{i}/web{i}:http cluster IP\" -m tcp --dport 80 -j {svc}\n\
             -A {svc} -m comment --comment \"ns{i}/web{i}:http -> {pod}:8080\" -j {sep}\n\
             -A {sep} -p tcp -m comment --comment \"ns{i}/web{i}:http\" -m tcp -j DNAT --to-destination {pod}:8080"
        );
        if i == unrelated / 2 {
            kube_dns_rules(endpoints, &mut chains, &mut rules);
        }
    }
    if unrelated == 0 {
        kube_dns_rules(endpoints, &mut chains, &mut rules);
    }
    t.push_str(&chains);
    t.push_str(&rules);
    t.push_str("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\nCOMMIT\n");
    t
}

fn kube_dns_rules(endpoints: &[SocketAddr], chains: &mut String, rules: &mut String) {
    for (port, proto, svc) in [
        ("dns", "udp", KUBE_DNS_SVC_UDP),
        ("dns-tcp", "tcp", KUBE_DNS_SVC_TCP),
    ] {
        let _ = writeln!(chains, ":{svc} - [0:0]");
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d 10.0.0.10/32 -p {proto} -m comment --comment \"kube-system/kube-dns:{port} cluster IP\" -m {proto} --dport 53 -j {svc}\n\
             -A {svc} ! -s 10.244.0.0/16 -d 10.0.0.10/32 -p {proto} -m comment --comment \"kube-system/kube-dns:{port} cluster IP\" -m {proto} --dport 53 -j KUBE-MARK-MASQ"
        );
        for (k, ep) in endpoints.iter().enumerate() {
            let sep = format!("KUBE-SEP-{}{k:011}", proto.to_uppercase());
            let _ = writeln!(chains, ":{sep} - [0:0]");
            let left = endpoints.len() - k;
            let spread = if left > 1 {
                format!(
                    "-m statistic --mode random --probability {:.11} ",
                    1.0 / left as f64
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                rules,
                "-A {svc} -m comment --comment \"kube-system/kube-dns:{port} -> {ep}\" {spread}-j {sep}\n\
                 -A {sep} -s {ip}/32 -m comment --comment \"kube-system/kube-dns:{port}\" -j KUBE-MARK-MASQ\n\
                 -A {sep} -p {proto} -m comment --comment \"kube-system/kube-dns:{port}\" -m {proto} -j DNAT --to-destination {ep}",
                ip = ep.ip()
            );
        }
    }
}

fn load_nat(ns: &Netns, table: &str) {
    let dir = TempDir::new("nat");
    let file = dir.path().join("nat.rules");
    std::fs::write(&file, table).unwrap();
    run_ok(
        ns.exec("iptables-restore", [file.to_str().unwrap()])
            .env("LC_ALL", "C"),
    );
}

fn eps(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

fn discover_in(ns: &Netns) -> Result<KubeDns, String> {
    ns.enter(|| iptables::discover(&ServiceName::default(), false))
}

#[test]
fn iptables_rules_with_one_two_and_three_endpoints() {
    require_root_and_tools(&["ip", "iptables", "iptables-restore"]);
    let ns = Netns::new("ipt");
    for list in [
        &["10.244.0.5:53"][..],
        &["10.244.0.5:53", "10.244.1.7:53"],
        &["10.244.0.5:53", "10.244.1.7:53", "10.244.2.9:53"],
    ] {
        load_nat(&ns, &kube_proxy_nat(&eps(list), 20));
        let found = discover_in(&ns).expect("iptables works here");
        assert_eq!(found.udp, eps(list), "udp backends, in rule order");
        assert_eq!(found.tcp, eps(list), "dns-tcp backends");
        assert_eq!(found.cluster_ip, Some("10.0.0.10".parse().unwrap()));
    }
}

#[test]
fn iptables_without_kube_dns_or_without_kube_proxy() {
    require_root_and_tools(&["ip", "iptables", "iptables-restore"]);
    let ns = Netns::new("ipt");
    // No KUBE-SERVICES chain at all: kube-proxy is not in iptables mode here.
    let err = discover_in(&ns).unwrap_err();
    assert!(err.contains("iptables"), "{err}");
    // kube-proxy rules, but no kube-dns among them.
    let mut table = kube_proxy_nat(&[], 5);
    table = table
        .lines()
        .filter(|l| !l.contains("kube-dns"))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    load_nat(&ns, &table);
    assert_eq!(discover_in(&ns).unwrap(), KubeDns::default());
}

#[test]
fn iptables_table_of_ten_thousand_services() {
    require_root_and_tools(&["ip", "iptables", "iptables-restore"]);
    let ns = Netns::new("ipt");
    let backends = eps(&["10.244.3.4:53", "10.244.8.1:53"]);
    load_nat(&ns, &kube_proxy_nat(&backends, 10_000));
    let found = discover_in(&ns).unwrap();
    assert_eq!(found.udp, backends);
}

#[test]
fn ip6tables_rules_of_an_ipv6_cluster() {
    require_root_and_tools(&["ip", "ip6tables", "ip6tables-restore"]);
    let ns = Netns::new("ipt6");
    let table = r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]
-A KUBE-SERVICES -d fd00:10:96::a/128 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> [fd00:10:244::5]:53" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-AAAAAAAAAAAAAAAA
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> [fd00:10:244:1::7]:53" -j KUBE-SEP-BBBBBBBBBBBBBBBB
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination [fd00:10:244::5]:53
-A KUBE-SEP-BBBBBBBBBBBBBBBB -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination [fd00:10:244:1::7]:53
COMMIT
"#;
    let dir = TempDir::new("nat6");
    let file = dir.path().join("nat6.rules");
    std::fs::write(&file, table).unwrap();
    run_ok(&mut ns.exec("ip6tables-restore", [file.to_str().unwrap()]));
    let found = ns
        .enter(|| iptables::discover(&ServiceName::default(), true))
        .unwrap();
    assert_eq!(
        found.udp,
        eps(&["[fd00:10:244::5]:53", "[fd00:10:244:1::7]:53"])
    );
    assert_eq!(found.cluster_ip, Some("fd00:10:96::a".parse().unwrap()));
}

/// The daemon in a node namespace with no upstream flags: VNet DNS from a resolv.conf and DHCP
/// lease directory the test rewrites (never the host's), kube-dns from iptables rules the test
/// rewrites.
struct Discovering {
    topo: Topology,
    resolv: TempDir,
    leases: TempDir,
    fwd: Option<Forwarder>,
}

impl Discovering {
    fn new() -> Discovering {
        require_root_and_tools(&["ip", "iptables", "iptables-restore", "dig"]);
        Discovering {
            topo: Topology::new(),
            resolv: TempDir::new("resolv"),
            leases: TempDir::new("leases"),
            fwd: None,
        }
    }

    fn resolv_path(&self) -> String {
        self.resolv.path().join("resolv.conf").display().to_string()
    }

    fn write_resolv(&self, text: &str) {
        // Replace atomically, as systemd-resolved does.
        let tmp = self.resolv.path().join("resolv.conf.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.resolv_path()).unwrap();
    }

    fn leases_path(&self) -> String {
        self.leases.path().display().to_string()
    }

    /// Writes the lease of interface `ifindex` as systemd-networkd does: a temporary file renamed
    /// over the old one.
    fn write_lease(&self, ifindex: u32, text: &str) {
        let tmp = self.leases.path().join(format!(".#{ifindex}tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.leases.path().join(ifindex.to_string())).unwrap();
    }

    /// `localdns-fallback discover ARGS` in the node namespace, with this rig's lease directory.
    fn discover(&self, args: &[&str]) -> (Option<i32>, String) {
        let leases = self.leases_path();
        let mut all = vec!["discover", "--dhcp-leases", &leases];
        all.extend_from_slice(args);
        let out = self
            .topo
            .node
            .exec(forwarder_binary(), all)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    fn start(&mut self, extra: &[&str]) {
        let mut args = vec![
            "--resolv-conf".to_string(),
            self.resolv_path(),
            "--dhcp-leases".to_string(),
            self.leases_path(),
            "--discovery".into(),
            "iptables".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let f = Forwarder::spawn(&self.topo.node, &args);
        f.wait_ready(
            &self.topo.node,
            "169.254.10.11:53".parse().unwrap(),
            Duration::from_secs(10),
        );
        self.fwd = Some(f);
    }

    fn dig(&self, listener: &str, name: &str) -> DigResult {
        dig(&self.topo.node, &[&format!("@{listener}"), name, "+time=3"])
    }
}

#[test]
fn follows_resolv_conf_from_the_startup_race_to_the_real_servers() {
    let mut d = Discovering::new();
    let vnet = d.topo.add_upstream_ns(true, false);
    let _r = Responder::start(
        &vnet.ns,
        vnet.sock_v4(),
        Mode::Normal {
            answer_v4: Ipv4Addr::new(198, 51, 100, 7),
        },
    );
    // At our start LocalDNS's drop-in is still in place: only its own listener is listed.
    d.write_resolv(
        "# managed by systemd-resolved\nnameserver 169.254.10.10\nsearch example.internal\n",
    );
    d.start(&[]);
    // One try: a reply that waited for a timeout would be no reply at all. The time is dig's own,
    // not the wall clock around it (starting a process can take seconds on a saturated machine).
    let early = dig(
        &d.topo.node,
        &["@169.254.10.10", "www.example.com", "+time=3", "+tries=1"],
    );
    assert_eq!(
        early.status, "SERVFAIL",
        "no VNet DNS yet: fast SERVFAIL, {}",
        early.raw
    );
    assert!(
        early.query_time.is_some_and(|t| t < Duration::from_secs(1)),
        "{:?} (wall {:?})",
        early.query_time,
        early.elapsed
    );
    // The scenario: the real upstream appears in the file 3 s after our start.
    std::thread::sleep(Duration::from_secs(3));
    d.write_resolv(&format!(
        "nameserver {}\nnameserver 127.0.0.53\noptions edns0 trust-ad\n",
        vnet.v4.unwrap()
    ));
    let started = Instant::now();
    let answered = poll_until(Duration::from_secs(10), || {
        let r = d.dig("169.254.10.10", "www.example.com");
        (r.answers == ["198.51.100.7"]).then_some(())
    });
    assert!(
        answered.is_some(),
        "VNet DNS picked up; logs:\n{}",
        d.fwd.as_ref().unwrap().logs()
    );
    eprintln!("resolv.conf change followed in {:?}", started.elapsed());
    let logs = d.fwd.as_ref().unwrap().logs();
    assert!(logs.contains("upstreams changed"), "{logs}");
    assert_eq!(
        logs.matches("lists no VNet DNS server").count(),
        1,
        "said once: {logs}"
    );
    // The file going back to listing only our listener keeps the good server.
    d.write_resolv("nameserver 169.254.10.10\n");
    // Re-reads pass (nothing to wait for: what is proved is that nothing changes).
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        d.dig("169.254.10.10", "uncached.example.com").answers,
        ["198.51.100.7"]
    );
}

/// While resolv.conf names only our own listener (LocalDNS's networkd drop-in is still in place,
/// as at every takeover), the VNet DNS comes from systemd-networkd's DHCP lease, which keeps the
/// offered servers whatever the drop-in says; resolv.conf's servers win once it names some, and
/// are kept when it goes back to naming only our listener.
#[test]
fn takes_the_vnet_dns_from_the_dhcp_lease_while_resolv_conf_names_none() {
    let mut d = Discovering::new();
    let offered = d.topo.add_upstream_ns(true, false);
    let configured = d.topo.add_upstream_ns(true, false);
    let _offered = Responder::start(
        &offered.ns,
        offered.sock_v4(),
        Mode::Normal {
            answer_v4: Ipv4Addr::new(198, 51, 100, 7),
        },
    );
    let _configured = Responder::start(
        &configured.ns,
        configured.sock_v4(),
        Mode::Normal {
            answer_v4: Ipv4Addr::new(198, 51, 100, 8),
        },
    );
    d.write_resolv("nameserver 169.254.10.10\nsearch example.internal\n");
    // No lease yet (networkd not up, or a static node): external names get SERVFAIL at once...
    d.start(&[]);
    let early = d.dig("169.254.10.10", "www.example.com");
    assert_eq!(early.status, "SERVFAIL", "{}", early.raw);
    // ...until the lease names a server; one of another link (no DNS=) changes nothing.
    d.write_lease(
        1,
        "# This is private data. Do not parse.\nADDRESS=10.9.0.4\n",
    );
    d.write_lease(
        2,
        &format!(
            "# This is private data. Do not parse.\nADDRESS=10.224.0.4\nNETMASK=255.255.0.0\n\
             ROUTER=10.224.0.1\nSERVER_ADDRESS=168.63.129.16\nDNS=169.254.10.10 {}\n\
             DOMAINNAME=abc.internal.cloudapp.net\n",
            offered.v4.unwrap()
        ),
    );
    let leased = Instant::now();
    let answered = poll_until(Duration::from_secs(5), || {
        let r = d.dig("169.254.10.10", "www.example.com");
        (r.answers == ["198.51.100.7"]).then(|| leased.elapsed())
    });
    let logs = d.fwd.as_ref().unwrap().logs();
    let took = answered.unwrap_or_else(|| panic!("the lease's server is not used; logs:\n{logs}"));
    eprintln!("DHCP lease taken up {took:?} after it was written");
    assert!(logs.contains("source=\"DHCP leases "), "{logs}");
    let (code, text) = d.discover(&["--resolv-conf", &d.resolv_path(), "--discovery", "none"]);
    assert_eq!(code, Some(1), "no kube-dns: {text}");
    assert!(
        text.contains(&format!(
            "{}:53  (from DHCP leases {}, while {} lists no VNet DNS server)",
            offered.v4.unwrap(),
            d.leases_path(),
            d.resolv_path()
        )),
        "{text}"
    );
    let (_, text) = d.discover(&["--resolv-conf", &d.resolv_path(), "--dhcp-leases", "none"]);
    assert!(
        text.contains("NONE:") && text.contains("not used"),
        "{text}"
    );

    // networkd's reload lands: resolv.conf names the node's configured server, which wins.
    d.write_resolv(&format!("nameserver {}\n", configured.v4.unwrap()));
    let mut polls = 0;
    let switched = poll_until(Duration::from_secs(5), || {
        // A new name each time: the lease server's cached answers are rightly kept.
        polls += 1;
        let name = format!("poll{polls}.example.com");
        (d.dig("169.254.10.10", &name).answers == ["198.51.100.8"]).then_some(())
    });
    assert!(
        switched.is_some(),
        "resolv.conf wins over the lease; logs:\n{}",
        d.fwd.as_ref().unwrap().logs()
    );
    // LocalDNS's drop-in back: resolv.conf's server is kept, not the lease's.
    d.write_resolv("nameserver 169.254.10.10\n");
    // Re-reads pass (nothing to wait for: what is proved is that nothing changes).
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        d.dig("169.254.10.10", "again.example.com").answers,
        ["198.51.100.8"]
    );
    let logs = d.fwd.as_ref().unwrap().logs();
    assert!(
        logs.contains("keeping the VNet DNS servers found before"),
        "{logs}"
    );
}

#[test]
fn follows_kube_dns_backends_that_move() {
    let mut d = Discovering::new();
    let old = d.topo.add_upstream_ns(true, false);
    let new = d.topo.add_upstream_ns(true, false);
    let vnet = d.topo.add_upstream_ns(true, false);
    let old_answer = Ipv4Addr::new(10, 0, 0, 1);
    let new_answer = Ipv4Addr::new(10, 0, 0, 2);
    let old_pod = Responder::start(
        &old.ns,
        old.sock_v4(),
        Mode::Normal {
            answer_v4: old_answer,
        },
    );
    let _vnet = Responder::start(
        &vnet.ns,
        vnet.sock_v4(),
        Mode::Normal {
            answer_v4: Ipv4Addr::new(198, 51, 100, 7),
        },
    );
    d.write_resolv(&format!("nameserver {}\n", vnet.v4.unwrap()));
    load_nat(&d.topo.node, &kube_proxy_nat(&[old.sock_v4()], 50));
    d.start(&[]);
    let name = "kubernetes.default.svc.cluster.local";
    for l in ["169.254.10.11", "169.254.10.10"] {
        assert_eq!(d.dig(l, name).answers, [old_answer.to_string()], "{l}");
    }

    // The pod is rescheduled: its replacement comes up elsewhere, kube-proxy rewrites the rules,
    // the old pod is gone.
    let _new_pod = Responder::start(
        &new.ns,
        new.sock_v4(),
        Mode::Normal {
            answer_v4: new_answer,
        },
    );
    load_nat(&d.topo.node, &kube_proxy_nat(&[new.sock_v4()], 50));
    drop(old_pod);
    d.topo
        .node
        .ip(&format!("link set {} down", old.node_ifname));
    let changed = Instant::now();
    let mut failures = 0;
    let moved = poll_until(Duration::from_secs(10), || {
        // A new name each time: a cached answer would (rightly) outlive the move.
        let r = d.dig("169.254.10.11", &format!("poll{failures}.{name}"));
        if r.answers == [new_answer.to_string()] {
            return Some(changed.elapsed());
        }
        failures += 1;
        None
    });
    let logs = d.fwd.as_ref().unwrap().logs();
    let took =
        moved.unwrap_or_else(|| panic!("still not on the new backend after 10 s; logs:\n{logs}"));
    eprintln!("followed the backend move in {took:?} ({failures} failed queries meanwhile)");
    assert!(
        logs.contains("upstreams changed") && logs.contains("source=\"iptables\""),
        "{logs}"
    );
    // And it stays there.
    for i in 0..3 {
        assert_eq!(
            d.dig("169.254.10.11", &format!("after{i}.{name}")).answers,
            [new_answer.to_string()]
        );
    }
}

#[test]
fn no_backends_anywhere_means_fast_servfail_and_one_explanation() {
    let mut d = Discovering::new();
    d.write_resolv("nameserver 169.254.10.10\n");
    d.start(&["--rediscover-interval", "1s"]);
    let r = d.dig("169.254.10.11", "kubernetes.default.svc.cluster.local");
    assert_eq!(r.status, "SERVFAIL", "{}", r.raw);
    assert!(r.elapsed < Duration::from_secs(1), "{:?}", r.elapsed);
    // The scenario: two rediscoveries (1 s apart) pass, each finding no backend.
    std::thread::sleep(Duration::from_millis(2500));
    let logs = d.fwd.as_ref().unwrap().logs();
    assert_eq!(
        logs.matches("no backends of kube-system/kube-dns found")
            .count(),
        1,
        "said once: {logs}"
    );
}

#[test]
fn the_discover_command_reports_what_it_would_use() {
    let d = Discovering::new();
    let run = |args: &[&str]| d.discover(&args[1..]);
    let resolv = d.resolv_path();
    d.write_resolv("nameserver 169.254.10.10\n");
    let (code, text) = run(&["discover", "--resolv-conf", &resolv]);
    assert_eq!(code, Some(1), "nothing found: {text}");
    assert!(text.contains("NONE"), "{text}");
    assert!(text.contains("iptables:"), "says why per source: {text}");

    d.write_resolv("nameserver 198.18.77.1\nnameserver fd00::53\n");
    load_nat(
        &d.topo.node,
        &kube_proxy_nat(&eps(&["10.244.0.5:53", "10.244.1.7:53"]), 10),
    );
    let (code, text) = run(&["discover", "--resolv-conf", &resolv]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("198.18.77.1:53 [fd00::53]:53"), "{text}");
    assert!(
        text.contains("10.244.0.5:53 10.244.1.7:53  (from iptables)"),
        "{text}"
    );
    assert!(text.contains("ClusterIP 10.0.0.10"), "{text}");

    let (code, json) = run(&["discover", "--json", "--resolv-conf", &resolv]);
    assert_eq!(code, Some(0));
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["cluster_listener"]["kube_dns"]["source"], "iptables");
    assert_eq!(
        doc["cluster_listener"]["kube_dns"]["upstreams"][1],
        "10.244.1.7:53"
    );
    assert_eq!(
        doc["node_listener"]["vnet_dns"]["upstreams"][0],
        "198.18.77.1:53"
    );
    assert_eq!(doc["cluster_ip"], "10.0.0.10");
    assert_eq!(doc["complete"], true);

    // Pinning the ClusterIP source and flags that win over discovery.
    let (code, text) = run(&[
        "discover",
        "--resolv-conf",
        &resolv,
        "--discovery",
        "cluster-ip",
        "--cluster-ip",
        "10.0.0.10",
    ]);
    assert_eq!(code, Some(0));
    assert!(text.contains("10.0.0.10:53  (from cluster-ip)"), "{text}");
    let (_, text) = run(&[
        "discover",
        "--resolv-conf",
        &resolv,
        "--cluster-upstream",
        "10.9.9.9",
    ]);
    assert!(
        text.contains("10.9.9.9:53  (from --cluster-upstream)"),
        "{text}"
    );
}
