//! The forwarder end to end: the real binary, real DNS servers (dnsmasq, unbound) and the
//! project's test responder as upstreams, real clients (dig, kdig, glibc's getent). Most of it
//! runs on loopback without root, real servers included; glibc's resolv.conf (which takes no
//! port), an IPv6 upstream and the node's own listener addresses run in namespaces as root. Every
//! namespace and process is removed on drop.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

const NODE: &str = "169.254.10.10";
const CLUSTER: &str = "169.254.10.11";
/// A client's own timeout (glibc and dig default to 5 s); every answer, SERVFAIL included, must
/// arrive well before it.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The forwarder's default query deadline is 2.5 s; allow process start-up of dig and scheduling
/// noise on a loaded 2-core machine on top of it.
const DEADLINE_WITH_MARGIN: Duration = Duration::from_millis(4000);

const KUBERNETES: &str = "kubernetes.default.svc.cluster.local";
const KUBERNETES_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// What the VNet DNS (unbound) answers for www.example.
const VNET_ANSWER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
/// What kube-dns (dnsmasq) answers for every name under example., so a misrouted query shows.
const KUBE_DNS_EXAMPLE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 66);

fn listener(ip: &str) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), 53)
}

fn args(node: &[SocketAddr], cluster: &[SocketAddr], extra: &[&str]) -> Vec<String> {
    let mut a = Vec::new();
    for n in node {
        a.push("--node-upstream".to_string());
        a.push(n.to_string());
    }
    for c in cluster {
        a.push("--cluster-upstream".to_string());
        a.push(c.to_string());
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn start(
    topo: &Topology,
    node: &[SocketAddr],
    cluster: &[SocketAddr],
    extra: &[&str],
) -> Forwarder {
    let f = Forwarder::spawn(&topo.node, &args(node, cluster, extra));
    f.wait_ready(&topo.node, listener(NODE), Duration::from_secs(10));
    f.wait_ready(&topo.node, listener(CLUSTER), Duration::from_secs(10));
    f
}

/// The usual node: unbound as the VNet DNS, dnsmasq as kube-dns, the forwarder between them.
/// Fields drop in order: the processes before the namespaces they run in.
struct Node {
    _fwd: Forwarder,
    _vnet: Unbound,
    _kube_dns: Dnsmasq,
    /// The forwarder's listeners.
    node: SocketAddr,
    cluster: SocketAddr,
    /// Where clients run.
    at: Place,
    _ups: Vec<Upstream>,
    topo: Option<Topology>,
}

/// The usual node on loopback (no root).
fn usual_node() -> Node {
    usual_node_at(Site::Loopback, &[])
}

/// The usual node at `site`, the forwarder run with `extra` flags; in namespaces it listens on the
/// node's own addresses, port 53.
fn usual_node_at(site: Site, extra: &[&str]) -> Node {
    let topo = match site {
        Site::Loopback => {
            require_tools(&["dig", "kdig", "dnsmasq", "unbound"]);
            None
        }
        Site::Namespaces => {
            require_root_and_tools(&["ip", "dig", "kdig", "dnsmasq", "unbound", "getent"]);
            Some(Topology::new())
        }
    };
    let (vnet_at, vnet_addr, kube_at, kube_addr, ups) = match &topo {
        Some(topo) => {
            let vnet_up = topo.add_upstream_ns(true, false);
            let kube_up = topo.add_upstream_ns(true, false);
            (
                Place::from(&vnet_up.ns),
                vnet_up.sock_v4(),
                Place::from(&kube_up.ns),
                kube_up.sock_v4(),
                vec![vnet_up, kube_up],
            )
        }
        None => (
            Place::Here,
            free_loopback_port(),
            Place::Here,
            free_loopback_port(),
            Vec::new(),
        ),
    };
    let big = unbound_big_txt("big.example.", 12, 250);
    let mut data = vec![format!("www.example. 60 IN A {VNET_ANSWER}")];
    data.push(big);
    let data: Vec<&str> = data.iter().map(String::as_str).collect();
    let vnet = Unbound::start(vnet_at, vnet_addr, &data);
    let kube_dns = Dnsmasq::start_with(
        kube_at,
        &[kube_addr],
        &[(KUBERNETES, IpAddr::V4(KUBERNETES_IP))],
        &[("example", IpAddr::V4(KUBE_DNS_EXAMPLE))],
        &[],
    );
    let (fwd, node, cluster, at) = match &topo {
        Some(topo) => (
            start(topo, &[vnet_addr], &[kube_addr], extra),
            listener(NODE),
            listener(CLUSTER),
            Place::from(&topo.node),
        ),
        None => {
            let fwd = Forwarder::spawn(
                Place::Here,
                &loopback_forwarder_args(&[vnet_addr], &[kube_addr], extra),
            );
            let node = fwd.listening_on("node", Duration::from_secs(10));
            let cluster = fwd.listening_on("cluster", Duration::from_secs(10));
            for l in [node, cluster] {
                fwd.wait_ready(Place::Here, l, Duration::from_secs(10));
            }
            (fwd, node, cluster, Place::Here)
        }
    };
    Node {
        _fwd: fwd,
        _vnet: vnet,
        _kube_dns: kube_dns,
        node,
        cluster,
        at,
        _ups: ups,
        topo,
    }
}

#[test]
fn cluster_names_on_both_listeners_reach_kube_dns() {
    let n = usual_node();
    for l in [n.cluster, n.node] {
        let r = dig_to(&n.at, l, &[KUBERNETES, "A"]);
        assert_eq!(r.status, "NOERROR", "{l}: {}", r.raw);
        assert_eq!(r.answers, vec![KUBERNETES_IP.to_string()], "{l}: {}", r.raw);
    }
}

#[test]
fn external_names_on_the_node_listener_go_to_the_vnet_dns_only() {
    let n = usual_node();
    let r = dig_to(&n.at, n.node, &["www.example", "A"]);
    assert_eq!(
        r.answers,
        vec![VNET_ANSWER.to_string()],
        "node listener: {}",
        r.raw
    );
    // The cluster listener sends every name to kube-dns, which answers example. differently.
    let r = dig_to(&n.at, n.cluster, &["www.example", "A"]);
    assert_eq!(
        r.answers,
        vec![KUBE_DNS_EXAMPLE.to_string()],
        "cluster listener: {}",
        r.raw
    );
}

/// LocalDNS's per-domain routes (the AKS profile's vnetDNSOverrides and kubeDNSOverrides), asked
/// with dig on both listeners over UDP and TCP: a private zone sent to the cluster's CoreDNS from
/// the node listener, one name of kube-dns's domain sent to the VNet DNS from the cluster
/// listener, the longest match winning, and the defaults everywhere else.
#[test]
fn per_domain_routes_send_each_name_where_the_profile_says() {
    let n = usual_node_at(
        Site::Loopback,
        &[
            "--vnet-dns-override",
            "corp.example=ClusterCoreDNS",
            "--vnet-dns-override",
            "WWW.Corp.Example.=VnetDNS",
            "--kube-dns-override",
            "www.example=VnetDNS",
        ],
    );
    let kube = KUBE_DNS_EXAMPLE.to_string();
    let vnet = VNET_ANSWER.to_string();
    let kubernetes = KUBERNETES_IP.to_string();
    // (listener, name, the answer that proves where it went; None: anything but kube-dns's).
    // Node listener: the private zone goes to kube-dns; its www (a longer override) and every
    // other name to the VNet DNS, which knows nothing of the zone. Cluster listener: www.example
    // to the VNet DNS, the rest of example. to kube-dns.
    let cases = [
        (n.node, "db.corp.example", Some(&kube)),
        (n.node, "www.corp.example", None),
        (n.node, "www.example", Some(&vnet)),
        (n.node, KUBERNETES, Some(&kubernetes)),
        (n.cluster, "www.example", Some(&vnet)),
        (n.cluster, "other.example", Some(&kube)),
        (n.cluster, "db.corp.example", Some(&kube)),
    ];
    for transport in ["+notcp", "+tcp"] {
        for (listener, name, want) in cases {
            let r = dig_to(&n.at, listener, &[name, "A", transport]);
            match want {
                Some(want) => assert_eq!(
                    r.answers,
                    std::slice::from_ref(want),
                    "{listener} {name} {transport}: {}",
                    r.raw
                ),
                None => assert_ne!(
                    r.answers,
                    std::slice::from_ref(&kube),
                    "{listener} {name} {transport}: {}",
                    r.raw
                ),
            }
        }
    }
}

/// A bad route is a start-up error naming the flag and the value, never a forwarder that starts.
#[test]
fn a_bad_route_override_is_a_start_up_error_naming_it() {
    for (flag, value) in [
        ("--vnet-dns-override", "corp.example=Google"),
        ("--kube-dns-override", "=VnetDNS"),
        ("--kube-dns-override", "a..b=VnetDNS"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_localdns-fallback"))
            .args([flag, value])
            .output()
            .expect("run the binary");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag) && err.contains(value), "{err}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_localdns-fallback"))
        .args(["--vnet-dns-override", "a.example=VnetDNS"])
        .args(["--vnet-dns-override", "A.example=ClusterCoreDNS"])
        .output()
        .expect("run the binary");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already"));
}

#[test]
fn tcp_works_on_both_listeners() {
    let n = usual_node();
    let r = dig_to(&n.at, n.cluster, &[KUBERNETES, "+tcp"]);
    assert_eq!(r.answers, vec![KUBERNETES_IP.to_string()], "{}", r.raw);
    let r = kdig_to(&n.at, n.node, &["www.example", "+tcp"]);
    assert_eq!(r.answers, vec![VNET_ANSWER.to_string()], "{}", r.raw);
}

#[test]
fn glibc_resolves_through_the_node_listener() {
    let n = usual_node_at(Site::Namespaces, &[]);
    let node_ns = &n.topo.as_ref().expect("a namespace node").node;
    node_ns.set_resolv_conf(&format!(
        "nameserver {NODE}\noptions timeout:5 attempts:1\n"
    ));
    assert_eq!(
        getent_hosts(node_ns, "www.example").as_deref(),
        Some("198.51.100.10")
    );
    assert_eq!(
        getent_hosts(node_ns, KUBERNETES).as_deref(),
        Some("10.0.0.1")
    );
}

#[test]
fn a_large_answer_is_truncated_over_udp_and_whole_over_tcp() {
    let n = usual_node();
    let udp = dig_to(&n.at, n.node, &["big.example", "TXT", "+ignore"]);
    assert_eq!(udp.status, "NOERROR", "{}", udp.raw);
    assert!(udp.has_flag("tc"), "TC passes through: {}", udp.raw);
    let tcp = dig_to(&n.at, n.node, &["big.example", "TXT", "+tcp"]);
    assert!(!tcp.has_flag("tc"), "{}", tcp.raw);
    assert!(
        tcp.msg_size.unwrap_or(0) > 2500,
        "full answer over TCP: {}",
        tcp.raw
    );
    // And dig's own fallback: UDP first, TC, then TCP.
    let auto = dig_to(&n.at, n.node, &["big.example", "TXT"]);
    assert_eq!(auto.answers.len(), tcp.answers.len(), "{}", auto.raw);
}

#[test]
fn an_answer_larger_than_the_client_asked_for_becomes_tc() {
    // This upstream ignores the client's size and sends ~4 KB over UDP.
    let n = Rig::loopback()
        .upstream(Mode::Oversize {
            answer_v4: KUBERNETES_IP,
        })
        .start();
    for (size, truncated) in [
        ("+noedns", true),
        ("+bufsize=1232", true),
        ("+bufsize=8192", false),
    ] {
        let r = n.dig(n.cluster, &["big.example", "TXT", size, "+ignore"]);
        assert_eq!(r.status, "NOERROR", "{size}: {}", r.raw);
        assert_eq!(r.has_flag("tc"), truncated, "{size}: {}", r.raw);
        let limit = if size == "+noedns" { 512 } else { 1232 };
        if truncated {
            assert!(r.msg_size.unwrap() <= limit, "{size}: {}", r.raw);
        }
    }
}

#[test]
fn one_silent_upstream_of_two_still_answers_in_time() {
    let n = Rig::loopback()
        .upstream(Mode::Silent)
        .upstream(Mode::Normal {
            answer_v4: KUBERNETES_IP,
        })
        .node_to(&[1])
        .cluster_to(&[0, 1])
        .start();
    let (silent, f) = (n.responder(0), &n.fwd);
    // The rotation puts the silent one first for some of these; each must still be answered
    // within one per-try budget plus margin, never the client's whole timeout. A second round
    // after its first try timed out (forgiven once) gives it a second loss in a row.
    for i in 0..8 {
        if i == 4 {
            std::thread::sleep(Duration::from_millis(1100));
        }
        let r = n.dig(n.cluster, &[&format!("q{i}.svc.cluster.local")]);
        assert_eq!(
            r.answers,
            vec![KUBERNETES_IP.to_string()],
            "query {i}: {}",
            r.raw
        );
        assert!(
            r.elapsed < DEADLINE_WITH_MARGIN,
            "query {i} took {:?}",
            r.elapsed
        );
    }
    assert!(silent.queries() >= 1, "the silent upstream was tried");
    // The silent one's tries were hedged, and time out a second after they went out; the second
    // loss in a row makes it suspect, which is logged.
    assert!(
        f.wait_for_log("timed out", Duration::from_secs(3)),
        "a warning names the silent upstream: {}",
        f.logs()
    );
}

#[test]
fn every_upstream_silent_gives_servfail_before_the_client_gives_up() {
    let n = Rig::loopback()
        .upstream(Mode::Silent)
        .upstream(Mode::Silent)
        .node_to(&[0, 1])
        .cluster_to(&[0, 1])
        .start();
    let (sa, sb) = (n.responder(0), n.responder(1));
    for l in [n.node, n.cluster] {
        let r = n.dig(l, &["www.example.com"]);
        assert_eq!(r.status, "SERVFAIL", "{l}: {}", r.raw);
        assert!(
            r.elapsed < DEADLINE_WITH_MARGIN,
            "{l}: SERVFAIL after {:?}",
            r.elapsed
        );
        assert!(r.elapsed < CLIENT_TIMEOUT);
    }
    assert!(
        sa.queries() >= 1 && sb.queries() >= 1,
        "both upstreams were tried"
    );
}

#[test]
fn spoofed_replies_are_ignored_and_the_real_answer_wins() {
    let forged = Ipv4Addr::new(6, 6, 6, 6);
    let n = Rig::loopback()
        .upstream(Mode::Spoof {
            answer_v4: KUBERNETES_IP,
            forged_v4: forged,
            alt_src: Some(IpAddr::V4(loopback_ip())),
        })
        .start();
    for i in 0..10 {
        let name = format!("Spoof{i}.Example.COM");
        let r = n.dig(n.node, &[&name]);
        assert_eq!(r.status, "NOERROR", "{}", r.raw);
        assert_eq!(
            r.answers,
            vec![KUBERNETES_IP.to_string()],
            "query {i}: {}",
            r.raw
        );
        assert!(
            r.raw.contains(&format!(";{name}.")),
            "question case restored: {}",
            r.raw
        );
    }
}

#[test]
fn an_ipv6_upstream_works() {
    require_root_and_tools(&["ip", "dig", "dnsmasq"]);
    let topo = Topology::new();
    let up = topo.add_upstream_ns(false, true);
    let _d = Dnsmasq::start(
        &up.ns,
        up.sock_v6(),
        &[(KUBERNETES, IpAddr::V4(KUBERNETES_IP))],
    );
    let _f = start(&topo, &[up.sock_v6()], &[up.sock_v6()], &[]);
    for l in [NODE, CLUSTER] {
        let r = dig(&topo.node, &[&format!("@{l}"), KUBERNETES]);
        assert_eq!(r.answers, vec![KUBERNETES_IP.to_string()], "{l}: {}", r.raw);
        let r = dig(&topo.node, &[&format!("@{l}"), KUBERNETES, "+tcp"]);
        assert_eq!(
            r.answers,
            vec![KUBERNETES_IP.to_string()],
            "{l} over TCP: {}",
            r.raw
        );
    }
}

#[test]
fn the_health_check_name_is_answered_without_any_upstream() {
    let n = Rig::loopback().closed_upstream().start();
    for l in [n.node, n.cluster] {
        for transport in ["+notcp", "+tcp"] {
            let r = n.dig(l, &["health-check.localdns.local", transport]);
            assert_eq!(r.status, "NOERROR", "{l} {transport}: {}", r.raw);
            assert!(
                r.elapsed < Duration::from_secs(1),
                "{l} {transport}: {:?}",
                r.elapsed
            );
        }
    }
    let r = n.dig(n.node, &["a.b.c.d.internal.cloudapp.net"]);
    assert_eq!(
        r.status, "NXDOMAIN",
        "search-path junk is answered locally: {}",
        r.raw
    );
}

#[test]
fn sigterm_frees_both_ports_for_the_next_owner_within_100ms() {
    let n = Rig::loopback().closed_upstream().start();
    let f = &n.fwd;
    let freed = n.at.enter(|| {
        f.signal(nix::sys::signal::Signal::SIGTERM);
        let sent = Instant::now();
        let mut taken = Vec::new();
        let mut pending: Vec<(SocketAddr, bool)> = vec![
            (n.node, false),
            (n.node, true),
            (n.cluster, false),
            (n.cluster, true),
        ];
        while !pending.is_empty() && sent.elapsed() < Duration::from_secs(2) {
            pending.retain(|(addr, tcp)| {
                // Bind as a plain server would: no SO_REUSEPORT, so it only works once we let go.
                let addr = *addr;
                let ok = if *tcp {
                    std::net::TcpListener::bind(addr)
                        .map(|s| taken.push(Box::new(s) as Box<dyn Send>))
                        .is_ok()
                } else {
                    std::net::UdpSocket::bind(addr)
                        .map(|s| taken.push(Box::new(s) as Box<dyn Send>))
                        .is_ok()
                };
                !ok
            });
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(pending.is_empty(), "still held after 2 s: {pending:?}");
        sent.elapsed()
    });
    assert!(
        freed < Duration::from_millis(100),
        "ports freed after {freed:?}"
    );
    let status = f
        .wait_exit(Duration::from_secs(3))
        .expect("exits after SIGTERM");
    assert!(
        status.success(),
        "exit status {status:?}; logs:\n{}",
        f.logs()
    );
}

#[test]
fn garbage_from_clients_does_not_stop_service() {
    let n = Rig::loopback()
        .upstream(Mode::Normal {
            answer_v4: KUBERNETES_IP,
        })
        .start();
    let (at, f, node) = (&n.at, &n.fwd, n.node);
    let good = make_query("example.com", RecordType::A, 0x4242, None);
    let mut response = good.clone();
    response[2] |= 0x80;
    let mut two_questions = good.clone();
    two_questions[5] = 2;
    let mut pointer_loop = good[..12].to_vec();
    pointer_loop.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
    let mut long_label = good[..12].to_vec();
    long_label.push(64);
    long_label.extend_from_slice(&[b'a'; 70]);
    long_label.extend_from_slice(&[0, 0, 1, 0, 1]);
    // Not replied to at all: too short, or response-shaped (never forwarded, never looped).
    for packet in [vec![], vec![0x12], vec![0u8; 11], response.clone()] {
        assert_eq!(
            udp_exchange(at, node, &packet, Duration::from_millis(300)),
            None
        );
    }
    // Replied to with FORMERR.
    for packet in [
        two_questions,
        pointer_loop,
        long_label,
        good[..good.len() - 2].to_vec(),
    ] {
        let reply = udp_exchange(at, node, &packet, Duration::from_secs(1)).expect("a reply");
        let msg = parse_message(&reply).expect("a well-formed reply");
        assert_eq!(msg.response_code(), ResponseCode::FormErr);
        assert_eq!(msg.id(), 0x4242);
    }
    let mut rng_state = 0x1234_5678u32;
    for _ in 0..2000 {
        let len = (rng_state % 600) as usize;
        let packet: Vec<u8> = (0..len)
            .map(|_| {
                rng_state ^= rng_state << 13;
                rng_state ^= rng_state >> 17;
                rng_state ^= rng_state << 5;
                rng_state as u8
            })
            .collect();
        udp_send(at, node, &packet);
    }
    assert_eq!(
        n.upstream_queries(0),
        0,
        "nothing malformed or response-shaped went upstream"
    );
    let r = n.dig(node, &["example.com"]);
    assert_eq!(r.answers, vec![KUBERNETES_IP.to_string()], "{}", r.raw);
    assert!(f.is_running());
}

#[test]
fn a_garbage_upstream_gives_servfail_not_a_hang() {
    let n = Rig::loopback().upstream(Mode::Garbage).start();
    for transport in ["+notcp", "+tcp"] {
        let r = n.dig(n.cluster, &["example.com", transport]);
        assert_eq!(r.status, "SERVFAIL", "{transport}: {}", r.raw);
        assert!(
            r.elapsed < DEADLINE_WITH_MARGIN,
            "{transport}: {:?}",
            r.elapsed
        );
    }
}

#[test]
fn tcp_pipelining_idle_timeout_and_connection_cap() {
    let n = Rig::loopback()
        .upstream(Mode::Normal {
            answer_v4: KUBERNETES_IP,
        })
        .flags(&["--tcp-idle-timeout", "1s", "--max-tcp-connections", "2"])
        .start();
    let cluster = n.cluster;
    let frames: Vec<Vec<u8>> = (0..5)
        .map(|i| make_query(&format!("p{i}.example"), RecordType::A, 100 + i, None))
        .collect();
    let replies = tcp_exchange(&n.at, cluster, &frames, Duration::from_secs(3));
    let mut ids: Vec<u16> = replies
        .iter()
        .map(|r| parse_message(r).expect("reply parses").id())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        vec![100, 101, 102, 103, 104],
        "five pipelined queries, five answers"
    );

    n.at.enter(|| {
        use std::io::Read;
        // Two idle connections fill the cap; a third is closed at once.
        use std::io::Write;
        // Each answers one query first, so both surely hold a slot (no guessing with sleeps);
        // retried while the slot of the pipelining connection above is still being released.
        let open = || {
            poll_until(Duration::from_secs(3), || {
                let mut s = std::net::TcpStream::connect(cluster).ok()?;
                let q = make_query("health-check.localdns.local", RecordType::A, 7, None);
                let mut frame = (q.len() as u16).to_be_bytes().to_vec();
                frame.extend_from_slice(&q);
                s.write_all(&frame).ok()?;
                s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
                let mut len = [0u8; 2];
                s.read_exact(&mut len).ok()?;
                let mut reply = vec![0u8; u16::from_be_bytes(len) as usize];
                s.read_exact(&mut reply).ok()?;
                Some(s)
            })
            .expect("a connection within the cap is served")
        };
        let a = open();
        let b = open();
        let mut c = std::net::TcpStream::connect(cluster).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(c.read(&mut buf).ok(), Some(0), "over the cap: closed");
        // The idle ones are closed after the idle timeout (1 s), freeing the slots.
        for mut s in [a, b] {
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let started = Instant::now();
            assert_eq!(s.read(&mut buf).ok(), Some(0), "idle connection closed");
            assert!(started.elapsed() < Duration::from_millis(2500));
        }
    });
    let replies = tcp_exchange(&n.at, cluster, &frames[..1], Duration::from_secs(2));
    assert_eq!(replies.len(), 1, "slots are free again");
}

#[test]
fn binding_waits_for_a_busy_port() {
    require_root_and_tools(&["ip"]);
    let topo = Topology::new();
    let up = topo.add_upstream_ns(true, false);
    // Something (an orphaned CoreDNS) holds the node listener's UDP port for a moment: bound
    // before the forwarder starts.
    let holder = topo
        .node
        .enter(|| std::net::UdpSocket::bind(listener(NODE)).unwrap());
    let f = Forwarder::spawn(&topo.node, &args(&[up.sock_v4()], &[up.sock_v4()], &[]));
    // The scenario: the port stays busy 700 ms, in which a forwarder that gave up would have.
    std::thread::sleep(Duration::from_millis(700));
    assert!(f.is_running(), "still retrying, not failed: {}", f.logs());
    drop(holder);
    f.wait_ready(&topo.node, listener(NODE), Duration::from_secs(5));
}

#[test]
fn a_port_busy_for_longer_than_the_bind_timeout_is_a_clear_error() {
    require_root_and_tools(&["ip"]);
    let topo = Topology::new();
    let up = topo.add_upstream_ns(true, false);
    let f = topo.node.enter(|| {
        let _held = std::net::TcpListener::bind(listener(CLUSTER)).unwrap();
        let f = Forwarder::spawn(
            &topo.node,
            &args(
                &[up.sock_v4()],
                &[up.sock_v4()],
                &["--bind-timeout", "300ms"],
            ),
        );
        let status = f.wait_exit(Duration::from_secs(5)).expect("gives up");
        assert_eq!(status.code(), Some(1));
        f
    });
    assert!(
        f.logs().contains("cannot bind 169.254.10.11:53"),
        "{}",
        f.logs()
    );
}

#[test]
fn several_relay_threads_share_one_listener_and_all_let_go_on_sigterm() {
    let n = Rig::loopback()
        .upstream(Mode::Normal {
            answer_v4: KUBERNETES_IP,
        })
        .flags(&["--udp-threads", "3"])
        .start();
    let (at, f, cluster) = (&n.at, &n.fwd, n.cluster);
    let answered = at.enter(|| {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // The answers may all arrive before the last query is sent: the default receive buffer
        // (212,992 bytes) holds only 256 small datagrams, so give it room for the whole burst.
        socket2::SockRef::from(&socket)
            .set_recv_buffer_size(4 << 20)
            .unwrap();
        // A datagram of the burst lost on the way (the responder's queue) is asked again within
        // one try's budget: wait longer than that for the last answers.
        socket
            .set_read_timeout(Some(Duration::from_millis(2500)))
            .unwrap();
        for id in 0..300u16 {
            let q = make_query(&format!("t{id}.svc.cluster.local"), RecordType::A, id, None);
            socket.send_to(&q, cluster).unwrap();
        }
        let mut ids = std::collections::HashSet::new();
        let mut buf = [0u8; 512];
        while let Ok(n) = socket.recv(&mut buf) {
            ids.insert(parse_message(&buf[..n]).expect("a reply").id());
        }
        ids.len()
    });
    assert_eq!(answered, 300, "every query answered once");
    f.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        f.wait_exit(Duration::from_secs(3))
            .expect("exits")
            .success()
    );
    at.enter(|| std::net::UdpSocket::bind(cluster).expect("every thread let go of the port"));
}
