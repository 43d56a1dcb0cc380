//! A LocalDNS that stops reading, seen from the kernel's view of its sockets, beside the real
//! standby in network namespaces, with a LocalDNS stand-in of 1 and of 4 sockets per listener
//! (CoreDNS has one; knot, unbound or a CoreDNS with `reuseport` more):
//! - what a healthy one leaves in its queues at its own maximum rate, in bursts and as it starts
//!   (the longest a queue stayed non-empty and unshrinking, against `flows::UNREAD_FOR`), and
//!   that the standby answers none of its queries then;
//! - hung under 10,000 queries a second: how soon the standby answers, and how many queries went
//!   unanswered or were answered more than a second late;
//! - throttled by a CPU quota: how often the flows change hands (never more than once in 10 s).
//!
//! Each test prints its figures (`cargo nextest run --release --test unread --no-capture`).

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use hickory_proto::rr::RecordType;
use localdns_fallback::netlink::{Diag, Proto};

const LISTENERS: [&str; 2] = ["169.254.10.10:53", "169.254.10.11:53"];

/// Closed loop, LocalDNS's own maximum rate: a client per listener keeps `window` queries in
/// flight for `how_long` (two, not more: on this two-core machine more clients starve the
/// stand-in of CPU, which is another failure, see the throttled test). Returns the answers by
/// whom, and the rate reached.
fn closed_loop(ns: &Netns, window: usize, how_long: Duration) -> (usize, usize, f64) {
    let threads: Vec<JoinHandle<(usize, usize)>> = (0..2)
        .map(|k| {
            let s = ns.enter(|| UdpSocket::bind("0.0.0.0:0").unwrap());
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                let to: SocketAddr = LISTENERS[k % 2].parse().unwrap();
                let query = make_query("a.example.", RecordType::A, k as u16, None);
                let (mut localdns, mut standby) = (0, 0);
                for _ in 0..window {
                    let _ = s.send_to(&query, to);
                }
                let end = Instant::now() + how_long;
                let mut buf = [0u8; 512];
                while Instant::now() < end {
                    match s.recv(&mut buf) {
                        Ok(n) if n >= 12 && buf[7] > 0 => standby += 1,
                        Ok(_) => localdns += 1,
                        // Lost: keep the window full.
                        Err(_) => {}
                    }
                    let _ = s.send_to(&query, to);
                }
                (localdns, standby)
            })
        })
        .collect();
    let (mut localdns, mut standby) = (0, 0);
    for t in threads {
        let (l, s) = t.join().unwrap();
        localdns += l;
        standby += s;
    }
    (
        localdns,
        standby,
        (localdns + standby) as f64 / how_long.as_secs_f64(),
    )
}

/// Reads the stand-in's queues every millisecond as the standby reads them, until stopped:
/// the longest a queue stayed non-empty and unshrinking, and the longest it stayed non-empty.
struct Watch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(Duration, Duration)>,
}

impl Watch {
    fn start(ns: &Netns, inodes: Vec<u64>) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let diag = ns.enter(|| Diag::open().unwrap());
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            // inode -> (last queued, unshrinking since, non-empty since)
            let mut runs: std::collections::HashMap<u64, (u32, Option<Instant>, Option<Instant>)> =
                Default::default();
            let (mut unshrinking, mut non_empty) = (Duration::ZERO, Duration::ZERO);
            while !s.load(Ordering::Relaxed) {
                let now = Instant::now();
                for (_, m, _) in diag.port(53, false, Proto::Udp).unwrap() {
                    if !inodes.contains(&m.inode) {
                        continue;
                    }
                    let (last, grow, full) = runs.entry(m.inode).or_insert((0, None, None));
                    if m.queued == 0 {
                        (*grow, *full) = (None, None);
                    } else {
                        if *last == 0 || m.queued < *last {
                            *grow = Some(now);
                        }
                        full.get_or_insert(now);
                    }
                    *last = m.queued;
                    unshrinking = unshrinking.max(grow.map_or(Duration::ZERO, |g| now - g));
                    non_empty = non_empty.max(full.map_or(Duration::ZERO, |f| now - f));
                }
                // Sampling the queues every millisecond.
                std::thread::sleep(Duration::from_millis(1));
            }
            (unshrinking, non_empty)
        });
        Watch { stop, thread }
    }

    fn finish(self) -> (Duration, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// A node namespace, one upstream answering 10.0.0.1, the stand-in (a process of its own) and
/// the standby beside it.
fn beside(per_address: usize) -> (Topology, Upstream, Responder, LocalDns, Forwarder) {
    standby_beside(LocalDns::with().sockets(per_address), &[])
}

fn healthy(per_address: usize) {
    let (topo, _up, _r, localdns, f) = beside(per_address);
    let watch = Watch::start(&topo.node, localdns.inodes.clone());
    let (by_localdns, by_standby, rate) = closed_loop(&topo.node, 64, Duration::from_secs(3));
    let at_max = watch.finish();
    // Bursts: 2,000 queries at once, ten times.
    let watch = Watch::start(&topo.node, localdns.inodes.clone());
    let mut bursts = Vec::new();
    for _ in 0..10 {
        bursts.extend(open_loop(
            &topo.node,
            1_000_000,
            Duration::from_millis(2),
            Duration::from_millis(200),
        ));
    }
    let in_bursts = watch.finish();
    let burst_standby = bursts
        .iter()
        .filter(|s| s.answered.is_some_and(|a| a.1 == By::Standby))
        .count();
    let burst_lost = bursts.iter().filter(|s| s.answered.is_none()).count();
    eprintln!(
        "healthy LocalDNS, {per_address} socket(s) per listener: at its maximum rate \
         ({rate:.0} queries/s, {by_localdns} answered by it, {by_standby} by the standby) a queue \
         stayed unshrinking {:?} at most (non-empty {:?}); in {} queries of bursts of 2,000 \
         ({burst_standby} answered by the standby, {burst_lost} lost) {:?} (non-empty {:?})",
        at_max.0,
        at_max.1,
        bursts.len(),
        in_bursts.0,
        in_bursts.1
    );
    let logs = f.logs();
    assert_eq!(
        (by_standby, burst_standby),
        (0, 0),
        "the standby answered a healthy LocalDNS's queries:\n{logs}"
    );
    assert!(!logs.contains("serving its listeners"), "{logs}");
    // A queue can stay unshrinking past `UNREAD_FOR` while LocalDNS waits for a CPU (on this
    // shared two-core machine: up to 36 ms at 280,000 queries/s): the standby then asks its
    // cgroup, finds it runnable, and leaves it be.
}

#[test]
fn a_healthy_localdns_with_one_socket_at_its_maximum_rate_and_in_bursts_keeps_its_flows() {
    healthy(1);
}

#[test]
fn a_healthy_localdns_with_four_sockets_at_its_maximum_rate_and_in_bursts_keeps_its_flows() {
    healthy(4);
}

/// LocalDNS starts beside the standby that holds its flows, and takes 10,000 queries a second
/// from its first instant on: handed back, it is never taken from again.
#[test]
fn a_localdns_starting_under_load_is_handed_its_flows_and_keeps_them() {
    let (topo, up, _r) = node_and_upstream();
    let f = Forwarder::standby(&topo.node, &up, &[]);
    assert!(
        f.wait_for_log("serving its listeners", Duration::from_secs(10)),
        "{}",
        f.logs()
    );
    let started = Instant::now();
    let localdns = LocalDns::start(&topo.node);
    let samples = open_loop(
        &topo.node,
        10_000,
        Duration::from_secs(3),
        Duration::from_millis(300),
    );
    let logs = f.logs();
    let handed = logs.matches("LocalDNS answers again").count();
    let taken_after = logs
        .split("LocalDNS answers again")
        .nth(1)
        .is_some_and(|rest| rest.contains("serving its listeners"));
    let last_standby = samples
        .iter()
        .filter(|s| s.answered.is_some_and(|a| a.1 == By::Standby))
        .map(|s| s.sent)
        .max();
    eprintln!(
        "LocalDNS started under 10,000 queries/s: handed back {handed} time(s); the standby's last \
         answer was to a query sent {:?} after the start; {} of {} unanswered",
        last_standby.map(|t| t.saturating_duration_since(started)),
        samples.iter().filter(|s| s.answered.is_none()).count(),
        samples.len()
    );
    drop(localdns);
    assert_eq!(handed, 1, "{logs}");
    assert!(
        !taken_after,
        "taken from a LocalDNS that started well:\n{logs}"
    );
}

/// LocalDNS stops reading for 3 s under 10,000 queries a second: the standby's first answer
/// after the stop, and the queries sent from 1 s before to 2 s after it that went unanswered or
/// were answered more than 1 s late.
fn hung_under_load(per_address: usize) {
    let (topo, _up, _r, localdns, f) = beside(per_address);
    let (samples, stop) = std::thread::scope(|s| {
        // The scenario: 1.5 s of load, then LocalDNS stopped for 3 s.
        let stopper = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(1500));
            let at = Instant::now();
            localdns.signal(nix::sys::signal::Signal::SIGSTOP);
            std::thread::sleep(Duration::from_secs(3));
            localdns.signal(nix::sys::signal::Signal::SIGCONT);
            at
        });
        let samples = open_loop(
            &topo.node,
            10_000,
            Duration::from_millis(8000),
            Duration::from_millis(1500),
        );
        (samples, stopper.join().unwrap())
    });
    let first = samples
        .iter()
        .filter_map(|s| s.answered)
        .filter(|&(at, by)| by == By::Standby && at >= stop)
        .map(|(at, _)| at - stop)
        .min();
    let window: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            s.sent + Duration::from_secs(1) >= stop && s.sent < stop + Duration::from_secs(2)
        })
        .collect();
    let unanswered = window.iter().filter(|s| s.answered.is_none()).count();
    let late = window
        .iter()
        .filter(|s| {
            s.answered
                .is_some_and(|(at, _)| at - s.sent > Duration::from_secs(1))
        })
        .count();
    let before = samples
        .iter()
        .filter(|s| s.sent < stop && s.answered.is_some_and(|a| a.1 == By::Standby && a.0 < stop))
        .count();
    let back = samples
        .iter()
        .filter(|s| s.sent > stop + Duration::from_secs(3))
        .filter(|s| !s.answered.is_some_and(|a| a.1 == By::LocalDns))
        .map(|s| s.sent - stop - Duration::from_secs(3))
        .max();
    let logs = f.logs();
    eprintln!(
        "hung LocalDNS, {per_address} socket(s) per listener, 10,000 queries/s: first answer by \
         the standby {first:?} after the stop; of {} queries sent from 1 s before to 2 s after \
         it, {unanswered} unanswered and {late} answered over 1 s late ({} in all); {before} \
         answered by the standby before the stop; after the resume every query LocalDNS's from \
         {back:?}",
        window.len(),
        unanswered + late
    );
    assert_eq!(before, 0, "taken from a healthy LocalDNS:\n{logs}");
    let first = first.unwrap_or_else(|| panic!("the standby never answered:\n{logs}"));
    let back = back.unwrap_or_default();
    figure(
        &format!("hung-10k-qps-{per_address}-sockets-first-standby-answer"),
        first,
        Duration::from_millis(50),
    );
    figure(
        &format!("hung-10k-qps-{per_address}-sockets-localdns-again-after-sigcont"),
        back,
        Duration::from_secs(1),
    );
    // What a client sees: an answer well before its own timeout (the open loop waits 1.5 s),
    // nothing lost beyond what was queued in the hung LocalDNS, its flows back within seconds.
    assert!(
        first <= Duration::from_millis(500),
        "first answer {first:?}:\n{logs}"
    );
    assert!(unanswered + late <= 700, "{logs}");
    // (The loop asks 3.5 s past the resume: a LocalDNS never given its flows back fails this.)
    assert!(
        back <= Duration::from_secs(3),
        "back after {back:?}:\n{logs}"
    );
}

#[test]
fn a_hung_localdns_with_one_socket_under_10k_queries_a_second() {
    hung_under_load(1);
}

#[test]
fn a_hung_localdns_with_four_sockets_under_10k_queries_a_second() {
    hung_under_load(4);
}

/// LocalDNS under a CPU quota (2 ms of every 100 ms) and 2,000 queries a second for 20 s: it
/// waits for the CPU for most of each period, leaving queries unread tens of milliseconds, but
/// it is runnable, so its flows stay put; whatever the standby does, it never takes and gives
/// them back more often than once in 10 s.
#[test]
fn a_throttled_localdns_never_changes_hands_more_than_once_in_ten_seconds() {
    let (topo, _up, _r, mut localdns, f) = beside(1);
    localdns.throttle(Some(Duration::from_millis(2)));
    let how_long = Duration::from_secs(20);
    let samples = open_loop(&topo.node, 2_000, how_long, Duration::from_millis(1500));
    let logs = f.logs();
    let takes = logs.matches("serving its listeners").count();
    let hand_backs = logs.matches("LocalDNS answers again").count();
    let checks = logs
        .matches("leaves a queue unread owners=Runnable")
        .count();
    let by = |who: By| {
        samples
            .iter()
            .filter(|s| s.answered.is_some_and(|a| a.1 == who))
            .count()
    };
    let mut latencies: Vec<Duration> = samples
        .iter()
        .filter_map(|s| {
            s.answered
                .filter(|a| a.1 == By::LocalDns)
                .map(|a| a.0 - s.sent)
        })
        .collect();
    latencies.sort();
    let p99 = latencies.get(latencies.len() * 99 / 100).copied();
    eprintln!(
        "LocalDNS throttled to 2 ms of CPU every 100 ms, 2,000 queries/s for {how_long:?}: \
         {takes} take(s), {hand_backs} hand-back(s), {checks} unread queues found runnable; \
         {} answered by LocalDNS (p99 {p99:?}), {} by the standby, {} unanswered",
        by(By::LocalDns),
        by(By::Standby),
        samples.iter().filter(|s| s.answered.is_none()).count()
    );
    assert!(
        takes as u64 <= 1 + how_long.as_secs() / 10,
        "the flows changed hands {takes} times in {how_long:?}:\n{logs}"
    );
}
