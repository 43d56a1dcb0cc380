//! The cache end to end: real dig against the daemon on loopback (no root), the project's
//! responder upstream counting what reaches it, and upstreams gone silent to see stale answers.

mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::*;
use hickory_proto::rr::RecordType;

const ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

fn rig(mode: Mode, extra: &[&str]) -> Rig {
    Rig::loopback().upstream(mode).flags(extra).start()
}

fn ask(r: &Rig, name: &str) -> DigResult {
    r.dig(r.cluster, &[name, "+time=4"])
}

#[test]
fn a_cached_name_survives_its_upstream_going_away_as_a_stale_answer() {
    let mut r = rig(
        Mode::Normal { answer_v4: ANSWER },
        &["--cache-min-ttl", "0"],
    );
    let fresh = ask(&r, "ttl1.cached.svc.cluster.local");
    assert_eq!(fresh.answers, [ANSWER.to_string()], "{}", fresh.raw);
    // The kube-dns pod and its network go away: nothing answers there any more.
    r.replace_upstream(0, Mode::Silent);
    std::thread::sleep(Duration::from_millis(1500)); // past the answer's 1 s TTL
    let stale = ask(&r, "ttl1.cached.svc.cluster.local");
    assert_eq!(stale.status, "NOERROR", "{}", stale.raw);
    assert_eq!(stale.answers, [ANSWER.to_string()]);
    assert_eq!(
        stale.records[0].ttl, 30,
        "served stale with TTL 30: {}",
        stale.raw
    );
    assert!(
        stale.elapsed < Duration::from_secs(4),
        "before the client gives up: {:?}",
        stale.elapsed
    );
    let uncached = ask(&r, "never-asked.svc.cluster.local");
    assert_eq!(uncached.status, "SERVFAIL", "{}", uncached.raw);
    let logs = r.fwd.logs();
    assert!(
        logs.contains("answered from expired cache entries"),
        "{logs}"
    );
}

#[test]
fn nxdomain_is_cached_for_the_soa_minimum() {
    let r = rig(
        Mode::Normal { answer_v4: ANSWER },
        &["--cache-min-ttl", "0"],
    );
    let first = ask(&r, "nx.missing.example");
    assert_eq!(first.status, "NXDOMAIN", "{}", first.raw);
    assert_eq!(r.upstream_queries(0), 1);
    let second = ask(&r, "NX.Missing.Example");
    assert_eq!(second.status, "NXDOMAIN");
    assert_eq!(r.upstream_queries(0), 1, "the denial came from the cache");
    std::thread::sleep(Duration::from_millis(NX_SOA_MINIMUM as u64 * 1000 + 200));
    assert_eq!(ask(&r, "nx.missing.example").status, "NXDOMAIN");
    assert_eq!(
        r.upstream_queries(0),
        2,
        "expired after the SOA minimum ({NX_SOA_MINIMUM} s)"
    );
}

#[test]
fn servfail_is_never_cached() {
    let r = rig(Mode::Normal { answer_v4: ANSWER }, &[]);
    for n in 1..=3 {
        assert_eq!(ask(&r, "servfail.broken.example").status, "SERVFAIL");
        assert_eq!(
            r.upstream_queries(0),
            n,
            "every SERVFAIL query went upstream"
        );
    }
    // An ordinary answer is cached, for contrast.
    for _ in 0..3 {
        assert_eq!(ask(&r, "fine.example").answers, [ANSWER.to_string()]);
    }
    assert_eq!(r.upstream_queries(0), 4);
}

#[test]
fn a_burst_of_identical_queries_reaches_the_upstream_a_handful_of_times() {
    // A slow upstream keeps the first query in flight while the burst arrives.
    let r = rig(
        Mode::Delay {
            answer_v4: ANSWER,
            delay: Duration::from_millis(300),
        },
        &[],
    );
    let cluster = r.cluster;
    let answered = r.at.enter(|| {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // Room for the whole burst of answers, so none is lost on our side.
        socket2::SockRef::from(&socket)
            .set_recv_buffer_size(4 << 20)
            .unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        for id in 0..1000u16 {
            socket
                .send_to(
                    &make_query("storm.svc.cluster.local", RecordType::A, id, None),
                    cluster,
                )
                .unwrap();
        }
        let mut seen = std::collections::HashSet::new();
        let started = Instant::now();
        let mut buf = [0u8; 512];
        while seen.len() < 1000 && started.elapsed() < Duration::from_secs(5) {
            if let Ok(n) = socket.recv(&mut buf) {
                let msg = parse_message(&buf[..n]).expect("a DNS reply");
                assert_eq!(msg.answers().len(), 1);
                seen.insert(msg.id());
            }
        }
        seen.len()
    });
    assert_eq!(answered, 1000, "every query answered");
    let reached = r.upstream_queries(0);
    eprintln!("1000 identical queries reached the upstream {reached} times");
    // 256 askers share one upstream query, so 1000 need 4; each may be hedged once (the
    // upstream takes 300 ms, longer than the 100 ms hedge delay of an upstream not yet measured).
    assert!(reached <= 8, "coalesced: {reached} upstream queries");
}

#[test]
fn cache_size_zero_turns_it_off() {
    let r = rig(Mode::Normal { answer_v4: ANSWER }, &["--cache-size", "0"]);
    for n in 1..=3 {
        assert_eq!(ask(&r, "uncached.example").answers, [ANSWER.to_string()]);
        assert_eq!(r.upstream_queries(0), n);
    }
}

#[test]
fn hits_respect_the_clients_size_and_tcp_shares_the_cache() {
    let r = rig(Mode::Normal { answer_v4: ANSWER }, &[]);
    // Fill the cache over TCP with the big TXT answer, then ask over UDP with small buffers.
    let tcp = r.dig(r.cluster, &["big.example", "TXT", "+tcp"]);
    assert!(tcp.msg_size.unwrap_or(0) > 3000, "{}", tcp.raw);
    assert_eq!(r.upstream_queries(0), 1);
    let small = r.dig(
        r.cluster,
        &["big.example", "TXT", "+bufsize=1232", "+ignore", "+notcp"],
    );
    assert!(
        small.has_flag("tc"),
        "a hit larger than the client's size is a TC reply: {}",
        small.raw
    );
    let again = r.dig(r.cluster, &["big.example", "TXT", "+tcp"]);
    assert_eq!(again.answers, tcp.answers);
    assert_eq!(r.upstream_queries(0), 1, "both from the cache");
}
