//! A flood of idle TCP connections must not lock real TCP clients out (in network namespaces, as
//! a hostile pod would do it): 250 connections to each listener opened within a moment and left
//! silent, in four batches, with the forwarder under 1,024 descriptors (a start by hand) and under
//! the unit's 8,192. Real clients (`kdig +tcp`, `dig`) are answered within 1 s throughout, UDP is
//! untouched, and the descriptors the forwarder holds stay within its budget. And a kube-dns that
//! accepts TCP connections and never answers, its listener flooded with pipelined queries, must
//! not hold up the VNet DNS's TCP clients on the node listener.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use hickory_proto::rr::RecordType;

const REAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PER_BATCH: usize = 250;
const BATCHES: usize = 4;
/// A real client's answer is due within this, flood or not.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn open_idle(r: &Rig, to: SocketAddr, n: usize) -> Vec<TcpStream> {
    r.at.enter(|| {
        (0..n)
            .filter_map(|_| TcpStream::connect_timeout(&to, Duration::from_millis(500)).ok())
            .collect()
    })
}

fn flood_then_ask(nofile: u64) {
    // Our end of 2,000 connections plus the harness's own files.
    raise_fd_limit(8192);
    let r = Rig::namespaces()
        .upstream(Mode::Normal { answer_v4: REAL })
        .tools(&["kdig"])
        .nofile(nofile)
        .start();
    let mut held = Vec::new();
    let mut answered = 0;
    let mut asked = 0;
    let mut slowest = Duration::ZERO;
    for batch in 1..=BATCHES {
        let started = Instant::now();
        for to in [r.node, r.cluster] {
            held.extend(open_idle(&r, to, PER_BATCH));
        }
        let opening = started.elapsed();
        // Real clients now: five TCP queries on each listener, and UDP.
        for to in [r.node, r.cluster] {
            for i in 0..5 {
                let name = format!("tcp-{nofile}-{batch}-{i}.default.svc.cluster.local");
                let d = r.kdig(to, &[&name, "A", "+tcp"]);
                asked += 1;
                slowest = slowest.max(d.elapsed);
                if d.answers == [REAL.to_string()] && d.elapsed <= ANSWER_WITHIN {
                    answered += 1;
                } else {
                    eprintln!(
                        "{to} batch {batch}: {:?} after {:?}\n{}",
                        d.answers, d.elapsed, d.raw
                    );
                }
            }
            let d = r.dig(
                to,
                &[
                    &format!("udp-{nofile}-{batch}.default.svc.cluster.local"),
                    "A",
                ],
            );
            assert_eq!(
                d.answers,
                [REAL.to_string()],
                "UDP on {to} during the flood:\n{}",
                d.raw
            );
        }
        let fds = descriptors(r.fwd.pid());
        let open = held.iter().filter(|s| !tcp_peer_closed(s)).count();
        eprintln!(
            "nofile {nofile}, batch {batch}: {} idle connections opened in {opening:?}, {open} still open; forwarder holds {fds} descriptors; {answered}/{asked} TCP answered within 1 s (slowest {slowest:?})",
            held.len()
        );
        assert!(
            fds < nofile as usize,
            "{fds} descriptors held under a limit of {nofile}"
        );
    }
    assert_eq!(
        answered,
        asked,
        "TCP clients locked out by idle connections (slowest {slowest:?}):\n{}",
        r.fwd.logs()
    );
    drop(held);
    assert!(r.fwd.is_running(), "{}", r.fwd.logs());
    let logs = r.fwd.logs();
    assert!(!logs.contains("ERROR"), "{logs}");
}

#[test]
fn idle_connections_never_lock_tcp_clients_out_under_1024_descriptors() {
    require_root_and_tools(&["prlimit", "kdig"]);
    flood_then_ask(1024);
}

#[test]
fn idle_connections_never_lock_tcp_clients_out_under_8192_descriptors() {
    require_root_and_tools(&["prlimit", "kdig"]);
    flood_then_ask(8192);
}

/// Queries each flooding connection pipelines.
const PIPELINED: usize = 4;
/// The forwarder's query budget (`--query-timeout`'s default): a query is answered by then.
const QUERY_BUDGET: Duration = Duration::from_millis(2500);
/// What a loaded 2-core machine may add to a deadline of the forwarder's.
const SLACK: Duration = Duration::from_millis(500);

/// Each flooding query's reply code and how long it took from the send; None for no reply.
fn flood_replies(
    flood: Vec<(TcpStream, Instant)>,
    deadline: Instant,
) -> Vec<Option<(u8, Duration)>> {
    let mut got: Vec<Vec<Option<(u8, Duration)>>> = vec![Vec::new(); flood.len()];
    let mut buffered: Vec<Vec<u8>> = vec![Vec::new(); flood.len()];
    let mut chunk = [0u8; 4096];
    for (s, _) in &flood {
        s.set_nonblocking(true).expect("set_nonblocking");
    }
    while Instant::now() < deadline && got.iter().any(|g| g.len() < PIPELINED) {
        for (i, (s, sent)) in flood.iter().enumerate() {
            loop {
                match (&mut &*s).read(&mut chunk) {
                    Ok(n) if n > 0 => buffered[i].extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    _ => break,
                }
            }
            let b = &mut buffered[i];
            while b.len() >= 2 {
                let len = usize::from(u16::from_be_bytes([b[0], b[1]]));
                if b.len() < 2 + len {
                    break;
                }
                let reply: Vec<u8> = b.drain(..2 + len).skip(2).collect();
                let code = raw_header(&reply).map_or(u8::MAX, |h| h.rcode);
                got[i].push(Some((code, sent.elapsed())));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    got.into_iter()
        .flat_map(|mut g| {
            g.resize(PIPELINED, None);
            g
        })
        .collect()
}

/// kube-dns accepts TCP connections and never answers; 250 clients of the cluster listener each
/// pipeline four queries within 0.1 s. Half a second later the node listener's clients ask
/// external names (the VNet DNS is healthy): over TCP and UDP they are answered at once, and the
/// flood's own clients get SERVFAIL within the query budget, not silence.
#[test]
fn a_hung_kube_dns_never_holds_up_the_vnet_dns_tcp_clients() {
    require_root_and_tools(&["prlimit", "kdig"]);
    raise_fd_limit(8192);
    let r = Rig::namespaces()
        .upstream(Mode::Normal { answer_v4: REAL })
        .upstream(Mode::Silent)
        .node_to(&[0])
        .cluster_to(&[1])
        .tools(&["kdig"])
        .nofile(1024)
        .start();
    let started = Instant::now();
    let flood: Vec<(TcpStream, Instant)> = r.at.enter(|| {
        (0..PER_BATCH)
            .filter_map(|c| {
                let mut s =
                    TcpStream::connect_timeout(&r.cluster, Duration::from_millis(500)).ok()?;
                let mut frames = Vec::new();
                for q in 0..PIPELINED {
                    let query = make_query(
                        &format!("hung-{c}-{q}.example.com"),
                        RecordType::A,
                        q as u16,
                        None,
                    );
                    frames.extend_from_slice(&(query.len() as u16).to_be_bytes());
                    frames.extend_from_slice(&query);
                }
                s.write_all(&frames).ok()?;
                Some((s, Instant::now()))
            })
            .collect()
    });
    let opening = started.elapsed();
    assert_eq!(flood.len(), PER_BATCH, "flooding connections opened");
    let replies =
        std::thread::spawn(move || flood_replies(flood, Instant::now() + QUERY_BUDGET + SLACK));
    std::thread::sleep(Duration::from_millis(500).saturating_sub(started.elapsed()));
    let tcp: Vec<DigResult> = (0..5)
        .map(|i| {
            let at = r.at.clone();
            let node = r.node;
            std::thread::spawn(move || {
                kdig_to(at, node, &[&format!("tcp-{i}.example.com"), "A", "+tcp"])
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().expect("kdig thread"))
        .collect();
    let udp = (0..20)
        .filter(|i| {
            let query = make_query(&format!("udp-{i}.example.com"), RecordType::A, *i, None);
            let reply = udp_exchange(&r.at, r.node, &query, ANSWER_WITHIN);
            reply.and_then(|b| parse_message(&b)).is_some_and(|m| {
                m.answers()
                    .iter()
                    .any(|a| a.data().to_string() == REAL.to_string())
            })
        })
        .count();
    let fds = descriptors(r.fwd.pid());
    let replies = replies.join().expect("reader thread");
    let answered = tcp
        .iter()
        .filter(|d| d.answers == [REAL.to_string()] && d.elapsed <= ANSWER_WITHIN)
        .count();
    let slowest = tcp.iter().map(|d| d.elapsed).max().unwrap_or_default();
    // kdig's own time from query to reply ("... (TCP) in 2.7 ms"); `elapsed` has its start-up.
    let kdig_slowest = tcp
        .iter()
        .filter_map(|d| {
            let ms = d.raw.split(") in ").nth(1)?.split(" ms").next()?;
            ms.trim().parse::<f64>().ok()
        })
        .fold(0.0, f64::max);
    let servfail = replies
        .iter()
        .filter(|r| matches!(r, Some((2, took)) if *took <= QUERY_BUDGET + SLACK))
        .count();
    let flood_slowest = replies
        .iter()
        .flatten()
        .map(|(_, took)| *took)
        .max()
        .unwrap_or_default();
    eprintln!(
        "flood of {PER_BATCH} connections x {PIPELINED} queries opened in {opening:?}; node listener: \
         TCP {answered}/5 answered within 1 s (slowest {slowest:?}, {kdig_slowest} ms by kdig), UDP {udp}/20; flood: \
         {servfail}/{} SERVFAIL within the budget (slowest {flood_slowest:?}); forwarder holds {fds} descriptors",
        replies.len()
    );
    for d in tcp.iter().filter(|d| d.answers != [REAL.to_string()]) {
        eprintln!("{:?} after {:?}\n{}", d.answers, d.elapsed, d.raw);
    }
    assert_eq!(
        answered,
        5,
        "TCP clients of the healthy VNet DNS held up:\n{}",
        r.fwd.logs()
    );
    assert_eq!(udp, 20, "UDP clients of the healthy VNet DNS held up");
    assert_eq!(
        servfail,
        replies.len(),
        "the hung kube-dns's TCP clients left without SERVFAIL within the query budget"
    );
    assert!(fds < 1024, "{fds} descriptors held under a limit of 1024");
    assert!(r.fwd.is_running(), "{}", r.fwd.logs());
}
