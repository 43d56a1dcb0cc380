//! The forwarder end to end on loopback: no root, no namespaces, seconds in all. Real `dig` and
//! raw sockets as clients, the scriptable responder as upstreams, the real binary in between.
//! What needs a node (the `localdns` link, privileges, discovery tools, systemd, floods) is
//! tested in network namespaces by the other test files.

mod common;

use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{RData, RecordType};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const VNET_ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const KUBE_ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// The forwarder with one upstream answering `answer_v4`, serving as VNet DNS and kube-dns.
fn one_upstream(answer_v4: Ipv4Addr, flags: &[&str]) -> Rig {
    Rig::loopback()
        .upstream(Mode::Normal { answer_v4 })
        .flags(flags)
        .start()
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
    let f = Rig::loopback()
        .upstream(Mode::Normal {
            answer_v4: VNET_ANSWER,
        })
        .upstream(Mode::Normal {
            answer_v4: KUBE_ANSWER,
        })
        .node_to(&[0])
        .cluster_to(&[1])
        .start();
    let vnet = f.responder(0);
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
            let r = f.dig(listener, &[transport, name, "A"]);
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
    let probe = f.dig(f.cluster, &["health-check.localdns.local", "A"]);
    assert_eq!(probe.status, "NOERROR", "{}", probe.raw);
}

#[test]
fn repeats_are_answered_from_the_cache_whatever_the_transport() {
    let f = one_upstream(KUBE_ANSWER, &[]);
    let kube = f.responder(0);
    let q = make_query("cached.example", RecordType::A, 1, None);
    let first =
        udp_exchange(Place::Here, f.cluster, &q, Duration::from_secs(3)).expect("an answer");
    assert_eq!(a_records(&first), [KUBE_ANSWER]);
    let again = make_query("CACHED.example", RecordType::A, 2, None);
    let over_tcp = tcp_exchange(Place::Here, f.cluster, &[again], Duration::from_secs(3));
    assert_eq!(over_tcp.len(), 1);
    assert_eq!(a_records(&over_tcp[0]), [KUBE_ANSWER]);
    assert_eq!(parse_message(&over_tcp[0]).map(|m| m.id()), Some(2));
    assert_eq!(kube.queries(), 1, "the second came from the cache");
}

#[test]
fn pipelined_tcp_queries_are_all_answered_each_with_its_own_id() {
    let f = one_upstream(KUBE_ANSWER, &[]);
    let kube = f.responder(0);
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
    let replies = tcp_exchange(Place::Here, f.cluster, &frames, Duration::from_secs(5));
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
fn a_silent_upstream_costs_a_servfail_within_the_query_budget_then_at_once() {
    // A rig per transport: the first names of each find the upstream not yet known down.
    for frames_over_tcp in [false, true] {
        let f = Rig::loopback()
            .upstream(Mode::Silent)
            .flags(&["--upstream-timeout", "200ms", "--query-timeout", "600ms"])
            .start();
        let silent = f.responder(0);
        let ask = |name: &str| {
            let q = make_query(name, RecordType::A, 7, None);
            let started = Instant::now();
            let reply = if frames_over_tcp {
                tcp_exchange(Place::Here, f.node, &[q], Duration::from_secs(5)).pop()
            } else {
                udp_exchange(Place::Here, f.node, &q, Duration::from_secs(5))
            }
            .unwrap_or_else(|| {
                panic!("no reply (tcp: {frames_over_tcp}); logs:\n{}", f.fwd.logs())
            });
            let msg = parse_message(&reply).expect("parses");
            assert_eq!(msg.response_code(), ResponseCode::ServFail);
            started.elapsed()
        };
        let took = ask("nobody.example");
        // 600 ms budget; a client's own timeout is 5 s. The margin covers a loaded CI machine.
        assert!(took < Duration::from_secs(3), "SERVFAIL after {took:?}");
        assert!(
            took >= Duration::from_millis(550),
            "SERVFAIL before the budget: {took:?}"
        );
        let tries = if frames_over_tcp {
            silent.tcp_queries()
        } else {
            silent.udp_queries()
        };
        assert!(tries >= 2, "retried within budget (tcp: {frames_over_tcp})");
        assert!(
            f.fwd.logs().contains("timed out"),
            "the timeouts are logged"
        );
        // A second name goes unanswered too (SERVFAIL within the budget at the latest): with
        // tries for two names unanswered, every upstream of the group is known down, and the
        // next name is answered at once.
        let took = ask("nobody-else.example");
        assert!(
            took < Duration::from_secs(3),
            "SERVFAIL after {took:?} (tcp: {frames_over_tcp})"
        );
        let took = ask("a-third-name.example");
        assert!(
            took < Duration::from_millis(100),
            "SERVFAIL from a group known down after {took:?} (tcp: {frames_over_tcp})"
        );
    }
}

#[test]
fn big_answers_are_cut_for_udp_clients_and_whole_over_tcp() {
    let f = one_upstream(KUBE_ANSWER, &[]);
    let udp = f.dig(f.cluster, &["+noedns", "+ignore", "big.example", "TXT"]);
    assert!(udp.has_flag("tc"), "{}", udp.raw);
    let tcp = f.dig(f.cluster, &["+tcp", "big.example", "TXT"]);
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
    let f = one_upstream(KUBE_ANSWER, &[]);
    let (node, cluster) = (f.node, f.cluster);
    f.fwd.signal(nix::sys::signal::Signal::SIGTERM);
    let freed = poll_until(Duration::from_secs(2), || {
        let all = [node, cluster].iter().all(|a| {
            std::net::UdpSocket::bind(a).is_ok() && std::net::TcpListener::bind(a).is_ok()
        });
        all.then_some(())
    });
    assert!(freed.is_some(), "ports still held; logs:\n{}", f.fwd.logs());
}
