//! A kube-dns backend dies under the fallback (its node died: it stays in the endpoints for 40 s
//! and packets to it vanish) while another is healthy: every query must still be answered, none
//! waiting for the dead one's `--upstream-timeout`. Then both die: hedges and probes must stay a
//! bounded share of what goes upstream, so an outage does not multiply the load on a struggling
//! DNS.
//!
//! The real binary in the node namespace, two backends in namespaces of their own (the rig of
//! tests/common), bursts of new names from a raw UDP client in the node namespace. A backend dies
//! by an nftables table in its own namespace that drops every packet: no ICMP error tells the
//! forwarder. Network rule: packets go only to addresses in the namespaces this test made, and
//! the rig removes them on drop.

mod common;

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use hickory_proto::rr::RecordType;

/// Bursts of new names: a burst's queries reach the forwarder at once, so about half of them go
/// to the backend that just died (the pattern that ran the hedge budget dry).
const BURST: usize = 20;
const EVERY: Duration = Duration::from_millis(50);
/// The forwarder's defaults: one try's budget, and the whole query's.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(1);
const QUERY_TIMEOUT: Duration = Duration::from_millis(2500);
/// Scheduling on a loaded 2-core machine, on top of a functional deadline.
const MARGIN: Duration = Duration::from_millis(500);

/// One client query: when it was sent, and how long its answer took with which RCODE.
struct Asked {
    name: String,
    sent: Instant,
    answer: Option<(Duration, u8)>,
}

/// Sends a burst of `BURST` new names every `EVERY` for `length` from one UDP socket at `at`
/// to `to`, and collects the answers until `QUERY_TIMEOUT` plus `MARGIN` after the last burst.
fn bursts(at: &Place, to: SocketAddr, tag: &str, length: Duration) -> Vec<Asked> {
    at.enter(|| {
        let sock = UdpSocket::bind("0.0.0.0:0").expect("bind a client socket");
        sock.set_read_timeout(Some(Duration::from_millis(2)))
            .expect("set_read_timeout");
        let start = Instant::now();
        let mut asked: Vec<Asked> = Vec::new();
        let mut next = start;
        let mut buf = [0u8; 4096];
        while start.elapsed() < length + QUERY_TIMEOUT + MARGIN {
            if start.elapsed() < length && Instant::now() >= next {
                for _ in 0..BURST {
                    let id = asked.len() as u16;
                    let name = format!("many1.{tag}{id}.svc.cluster.local");
                    let query = make_query(&name, RecordType::A, id, None);
                    sock.send_to(&query, to).expect("send a query");
                    asked.push(Asked {
                        name,
                        sent: Instant::now(),
                        answer: None,
                    });
                }
                next += EVERY;
            }
            if let Ok((n, from)) = sock.recv_from(&mut buf) {
                let got = Instant::now();
                if from != to || n < 12 {
                    continue;
                }
                let id = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
                if let Some(a) = asked.get_mut(id).filter(|a| a.answer.is_none()) {
                    a.answer = Some((got - a.sent, buf[3] & 0x0f));
                }
            }
        }
        asked
    })
}

/// An nftables table in `ns` that drops every packet coming in: the backend there is gone
/// without a word (no ICMP error, no reset).
fn kill(ns: &str) {
    run_ok(Command::new("ip").args([
        "netns",
        "exec",
        ns,
        "nft",
        "add table inet dead; add chain inet dead input { type filter hook input priority -300; policy drop; }",
    ]));
}

fn revive(ns: &str) {
    run_ok(Command::new("ip").args(["netns", "exec", ns, "nft", "delete table inet dead"]));
}

/// A backend that hears every query and answers none, recording (when, name) of each.
struct Recorder {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recorder {
    fn start(at: &Place, addr: SocketAddr, log: Arc<Mutex<Vec<(Instant, String)>>>) -> Recorder {
        let sock = at.enter(|| UdpSocket::bind(addr).expect("bind the recorder"));
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .expect("set_read_timeout");
        let stop = Arc::new(AtomicBool::new(false));
        let done = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !done.load(Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    let name = parse_message(&buf[..n])
                        .and_then(|m| m.queries().first().map(|q| q.name().to_ascii()))
                        .unwrap_or_default()
                        .to_ascii_lowercase();
                    log.lock().unwrap().push((Instant::now(), name));
                }
            }
        });
        Recorder {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn through_a_backends_death_every_query_is_answered_and_an_outage_stays_bounded() {
    let mut rig = Rig::namespaces()
        .upstream(Mode::CoreDns)
        .upstream(Mode::CoreDns)
        .node_to(&[0])
        .cluster_to(&[0, 1])
        .tools(&["nft"])
        .start();
    let (to, at) = (rig.cluster, rig.at.clone());
    let dead_ns = rig.ups[1].ns.name.clone();

    // One backend dies a second into three seconds of bursts.
    let asked = std::thread::scope(|s| {
        let killer = s.spawn(|| {
            std::thread::sleep(Duration::from_secs(1));
            kill(&dead_ns);
            Instant::now()
        });
        let asked = bursts(&at, to, "d", Duration::from_secs(3));
        (asked, killer.join().expect("the backend killed"))
    });
    let (asked, died) = asked;
    let after: Vec<&Asked> = asked.iter().filter(|a| a.sent >= died).collect();
    let slow = after
        .iter()
        .filter(|a| a.answer.is_none_or(|(t, _)| t > Duration::from_millis(100)))
        .count();
    let worst = after
        .iter()
        .filter_map(|a| a.answer.map(|(t, _)| t))
        .max()
        .unwrap_or_default();
    eprintln!(
        "one backend dead: {} queries after the death, {slow} over 100 ms, the worst {worst:?}",
        after.len()
    );
    for a in &asked {
        let (took, code) = a.answer.unwrap_or_else(|| panic!("{}: no answer", a.name));
        assert_eq!(code, 0, "{}: RCODE {code}", a.name);
        // With one backend healthy, no query may wait out the dead one's whole try budget.
        assert!(
            took < UPSTREAM_TIMEOUT,
            "{} took {took:?}, the dead backend's whole --upstream-timeout",
            a.name
        );
    }

    // Both backends die (answering nothing, recording every query), after the forwarder has
    // had a healthy backend for a while.
    revive(&dead_ns);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut recorders = Vec::new();
    for i in 0..2 {
        rig.responders[i] = None;
        let place = Place::from(&rig.ups[i].ns);
        recorders.push(Recorder::start(&place, rig.upstreams[i], log.clone()));
    }
    let length = Duration::from_secs(3);
    let asked = bursts(&at, to, "o", length);
    drop(recorders);
    for a in &asked {
        let (took, code) = a
            .answer
            .unwrap_or_else(|| panic!("{}: no answer in an outage", a.name));
        assert!(
            matches!(code, 2 | 0),
            "{}: RCODE {code} in an outage",
            a.name
        );
        assert!(
            took < QUERY_TIMEOUT + MARGIN,
            "{}: answered after {took:?}",
            a.name
        );
    }
    // Each upstream query is a query's first try, its move on after a whole try budget, a
    // hedge (sooner than that, for a name already asked) or a probe (a query whose client had
    // its answer already).
    let answered: HashMap<String, Instant> = asked
        .iter()
        .filter_map(|a| a.answer.map(|(t, _)| (format!("{}.", a.name), a.sent + t)))
        .collect();
    let mut log = log.lock().unwrap().clone();
    log.sort();
    let mut last: HashMap<&str, Instant> = HashMap::new();
    let (mut hedges, mut probes) = (0, 0);
    for (t, name) in &log {
        let probe = answered.get(name).is_some_and(|done| done < t);
        let previous = last.insert(name, *t);
        if probe {
            probes += 1;
        } else if previous.is_some_and(|p| *t - p < UPSTREAM_TIMEOUT - Duration::from_millis(100)) {
            hedges += 1;
        }
    }
    let sends = log.len();
    eprintln!(
        "both backends dead: {} queries, {sends} upstream sends, {hedges} hedges and {probes} \
         probes ({:.0} % of the sends)",
        asked.len(),
        100.0 * (hedges + probes) as f64 / sends.max(1) as f64
    );
    // Hedges are paid from a budget each new query adds a fifth of a hedge to (plus 50 saved
    // up); probes are one per backend per 500 ms, plus the background query a down group's
    // client starts when one is due.
    let queries = asked.len();
    let probes_at_most = 2 * 2 * (length.as_secs() as usize + 3) * 2;
    assert!(
        hedges <= queries / 5 + 50 + probes_at_most,
        "{hedges} hedges for {queries} queries in an outage"
    );
    assert!(
        (hedges + probes) * 2 <= sends,
        "hedges and probes are {} of {sends} upstream sends in an outage",
        hedges + probes
    );
}
