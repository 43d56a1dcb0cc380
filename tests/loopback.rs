//! The forwarder end to end on loopback: no root, no namespaces, seconds in all. Real `dig` and
//! raw sockets as clients, the scriptable responder as upstreams, the real binary in between.
//! What needs a node (the `localdns` link, privileges, discovery tools, systemd, floods) is
//! tested in network namespaces by the other test files.

mod common;

use common::client::{DigResult, make_query, parse_message, tcp_exchange_here, udp_exchange_here};
use common::loopback::LoopbackForwarder;
use common::responder::{Mode, Responder};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{RData, RecordType};
use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const VNET_ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const KUBE_ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn normal(answer_v4: Ipv4Addr) -> Responder {
    Responder::on_loopback(Mode::Normal { answer_v4 })
}

/// `dig` from this namespace; loopback needs no `ip netns exec`.
fn dig(server: SocketAddr, args: &[&str]) -> DigResult {
    let started = Instant::now();
    let out = std::process::Command::new("dig")
        .args(["+tries=1", "+time=3", &format!("@{}", server.ip())])
        .args(["-p", &server.port().to_string()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run dig (apt-get install bind9-dnsutils): {e}"));
    let mut raw = String::from_utf8_lossy(&out.stdout).into_owned();
    raw.push_str(&String::from_utf8_lossy(&out.stderr));
    DigResult::parse(raw, started.elapsed())
}

fn a_records(reply: &[u8]) -> Vec<Ipv4Addr> {
    let msg = parse_message(reply).expect("a reply that parses");
    msg.answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

#[test]
fn each_listener_routes_like_localdns_over_udp_and_tcp() {
    let (vnet, kube) = (normal(VNET_ANSWER), normal(KUBE_ANSWER));
    let f = LoopbackForwarder::start(vnet.addr(), kube.addr(), &[]);
    let cases = [
        (f.node, "example.com", VNET_ANSWER),
        (f.node, "kubernetes.default.svc.cluster.local", KUBE_ANSWER),
        (f.cluster, "example.com", KUBE_ANSWER),
        (
            f.cluster,
            "kubernetes.default.svc.cluster.local",
            KUBE_ANSWER,
        ),
    ];
    for (listener, name, want) in cases {
        for (transport, prefix) in [("+notcp", "udp"), ("+tcp", "tcp")] {
            // A name per transport, so the TCP one is not answered from the cache.
            let name = &format!("{prefix}.{name}");
            let r = dig(listener, &[transport, name, "A"]);
            assert_eq!(
                r.status, "NOERROR",
                "{name} at {listener} {transport}: {}",
                r.raw
            );
            assert_eq!(
                r.answers,
                [want.to_string()],
                "{name} at {listener} {transport}"
            );
        }
    }
    assert!(
        vnet.udp_queries() >= 1 && vnet.tcp_queries() >= 1,
        "TCP goes upstream as TCP"
    );
    let probe = dig(f.cluster, &["health-check.localdns.local", "A"]);
    assert_eq!(probe.status, "NOERROR", "{}", probe.raw);
}

#[test]
fn repeats_are_answered_from_the_cache_whatever_the_transport() {
    let kube = normal(KUBE_ANSWER);
    let f = LoopbackForwarder::start(kube.addr(), kube.addr(), &[]);
    let q = make_query("cached.example", RecordType::A, 1, None);
    let first = udp_exchange_here(f.cluster, &q, Duration::from_secs(3)).expect("an answer");
    assert_eq!(a_records(&first), [KUBE_ANSWER]);
    let again = make_query("CACHED.example", RecordType::A, 2, None);
    let over_tcp = tcp_exchange_here(f.cluster, &[again], Duration::from_secs(3));
    assert_eq!(over_tcp.len(), 1);
    assert_eq!(a_records(&over_tcp[0]), [KUBE_ANSWER]);
    assert_eq!(parse_message(&over_tcp[0]).map(|m| m.id()), Some(2));
    assert_eq!(kube.queries(), 1, "the second came from the cache");
}

#[test]
fn pipelined_tcp_queries_are_all_answered_each_with_its_own_id() {
    let kube = normal(KUBE_ANSWER);
    let f = LoopbackForwarder::start(kube.addr(), kube.addr(), &[]);
    let frames: Vec<Vec<u8>> = (0..24)
        .map(|i| {
            make_query(
                &format!("n{i}.pipelined.example"),
                RecordType::A,
                100 + i,
                None,
            )
        })
        .collect();
    let replies = tcp_exchange_here(f.cluster, &frames, Duration::from_secs(5));
    assert_eq!(
        replies.len(),
        frames.len(),
        "every pipelined query answered"
    );
    let ids: BTreeSet<u16> = replies
        .iter()
        .map(|r| parse_message(r).expect("parses").id())
        .collect();
    assert_eq!(
        ids,
        (100..124).collect(),
        "each reply carries its query's ID"
    );
    assert_eq!(kube.tcp_queries(), 24);
}

#[test]
fn a_silent_upstream_costs_a_servfail_within_the_query_budget() {
    let silent = Responder::on_loopback(Mode::Silent);
    let f = LoopbackForwarder::start(
        silent.addr(),
        silent.addr(),
        &["--upstream-timeout", "200ms", "--query-timeout", "600ms"],
    );
    for frames_over_tcp in [false, true] {
        let q = make_query("nobody.example", RecordType::A, 7, None);
        let started = Instant::now();
        let reply = if frames_over_tcp {
            tcp_exchange_here(f.node, &[q], Duration::from_secs(5)).pop()
        } else {
            udp_exchange_here(f.node, &q, Duration::from_secs(5))
        }
        .unwrap_or_else(|| panic!("no reply (tcp: {frames_over_tcp}); logs:\n{}", f.logs()));
        let took = started.elapsed();
        let msg = parse_message(&reply).expect("parses");
        assert_eq!(msg.response_code(), ResponseCode::ServFail);
        // 600 ms budget; a client's own timeout is 5 s. The margin covers a loaded CI machine.
        assert!(took < Duration::from_secs(3), "SERVFAIL after {took:?}");
        assert!(
            took >= Duration::from_millis(550),
            "SERVFAIL before the budget: {took:?}"
        );
    }
    assert!(
        silent.udp_queries() >= 2 && silent.tcp_queries() >= 2,
        "retried within budget"
    );
    assert!(f.logs().contains("timed out"), "the timeouts are logged");
}

#[test]
fn big_answers_are_cut_for_udp_clients_and_whole_over_tcp() {
    let kube = normal(KUBE_ANSWER);
    let f = LoopbackForwarder::start(kube.addr(), kube.addr(), &[]);
    let udp = dig(f.cluster, &["+noedns", "+ignore", "big.example", "TXT"]);
    assert!(udp.has_flag("tc"), "{}", udp.raw);
    let tcp = dig(f.cluster, &["+tcp", "big.example", "TXT"]);
    assert_eq!(tcp.status, "NOERROR", "{}", tcp.raw);
    assert!(!tcp.has_flag("tc"), "{}", tcp.raw);
    assert!(
        tcp.msg_size.is_some_and(|n| n > 1232),
        "the whole answer: {}",
        tcp.raw
    );
}

#[test]
fn it_stops_at_sigterm_and_frees_both_ports_at_once() {
    let kube = normal(KUBE_ANSWER);
    let f = LoopbackForwarder::start(kube.addr(), kube.addr(), &[]);
    let (node, cluster) = (f.node, f.cluster);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(f.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal");
    let freed = common::poll_until(Duration::from_secs(2), || {
        let all = [node, cluster].iter().all(|a| {
            std::net::UdpSocket::bind(a).is_ok() && std::net::TcpListener::bind(a).is_ok()
        });
        all.then_some(())
    });
    assert!(freed.is_some(), "ports still held; logs:\n{}", f.logs());
}
