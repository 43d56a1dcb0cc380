//! A flood of idle TCP connections must not lock real TCP clients out (in network namespaces, as
//! a hostile pod would do it): 250 connections to each listener opened within a moment and left
//! silent, in four batches, with the forwarder under 1,024 descriptors (a start by hand) and under
//! the unit's 8,192. Real clients (`kdig +tcp`, `dig`) are answered within 1 s throughout, UDP is
//! untouched, and the descriptors the forwarder holds stay within its budget.

mod common;

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;

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
