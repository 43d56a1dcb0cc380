//! Upstream trouble must cost clients little: two kube-dns backends on loopback, one of them
//! misbehaving (refusing, failing, closed port, black hole, lossy, slow, a TCP side that never
//! answers), and the real binary between them and a client; no root needed. The
//! functional deadlines here are far below a client's 5 s timeout and below one 1 s try; the
//! latency figures the README reports come from `loadtest/run.sh`, not from these asserts.

mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{RData, RecordType};

const GOOD_ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const OTHER_ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// Well under one `--upstream-timeout` (1 s): nobody waited out a try.
const NO_TRY_WASTED: Duration = Duration::from_millis(700);

/// Upstream 0 answers well and is the VNet DNS; upstream 1, misbehaving as `bad` (or closed:
/// nothing listens there, the kernel answers ICMP), is the first kube-dns backend, upstream 0 the
/// second.
struct TwoBackends;

impl TwoBackends {
    fn start(bad: Option<Mode>, extra: &[&str]) -> Rig {
        let rig = Rig::loopback().upstream(Mode::Normal {
            answer_v4: GOOD_ANSWER,
        });
        let rig = match bad {
            Some(mode) => rig.upstream(mode),
            None => rig.closed_upstream(),
        };
        rig.node_to(&[0]).cluster_to(&[1, 0]).flags(extra).start()
    }
}

/// The clients of these tests.
trait Ask {
    fn ask(&self, name: &str) -> (Option<(ResponseCode, Vec<Ipv4Addr>)>, Duration);
    fn all_good(&self, tag: &str, n: usize, gap: Duration) -> Vec<Duration>;
}

impl Ask for Rig {
    /// One UDP query to the cluster listener: its RCODE and A records, and how long it took.
    fn ask(&self, name: &str) -> (Option<(ResponseCode, Vec<Ipv4Addr>)>, Duration) {
        let q = make_query(name, RecordType::A, 0x4242, None);
        let started = Instant::now();
        let reply = udp_exchange(&self.at, self.cluster, &q, Duration::from_secs(4));
        let took = started.elapsed();
        let parsed = reply.and_then(|r| parse_message(&r)).map(|m| {
            let addrs = m
                .answers()
                .iter()
                .filter_map(|r| match r.data() {
                    RData::A(a) => Some(a.0),
                    _ => None,
                })
                .collect();
            (m.response_code(), addrs)
        });
        (parsed, took)
    }

    /// `n` distinct names, one every `gap`: each must be answered NOERROR with the good
    /// backend's address. Returns the latencies, sorted.
    fn all_good(&self, tag: &str, n: usize, gap: Duration) -> Vec<Duration> {
        let mut took = Vec::with_capacity(n);
        for i in 0..n {
            let name = format!("{tag}{i}.svc.cluster.local");
            let (reply, t) = self.ask(&name);
            let Some((code, addrs)) = reply else {
                panic!("{name}: no reply in {t:?}; logs:\n{}", self.fwd.logs());
            };
            assert_eq!(code, ResponseCode::NoError, "{name} after {t:?}");
            assert_eq!(addrs, [GOOD_ANSWER], "{name}");
            took.push(t);
            std::thread::sleep(gap);
        }
        took.sort();
        took
    }
}

fn pct(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// Prints the latencies of one case (for the figures the README quotes) and returns the slowest.
fn report(case: &str, sorted: &[Duration]) -> Duration {
    let max = sorted[sorted.len() - 1];
    eprintln!(
        "{case}: p50 {:?} p90 {:?} p99 {:?} max {max:?}",
        pct(sorted, 50),
        pct(sorted, 90),
        pct(sorted, 99)
    );
    max
}

#[test]
fn a_refusing_or_failing_backend_costs_no_lookup() {
    for code in [5u8, 2] {
        let t = TwoBackends::start(Some(Mode::Rcode { code }), &[]);
        let took = t.all_good(&format!("rc{code}-"), 40, Duration::from_millis(5));
        let slowest = report(&format!("rcode {code}"), &took);
        assert!(slowest < NO_TRY_WASTED, "slowest {slowest:?}");
        let bad = t.responders[1].as_ref().expect("a bad responder").queries();
        assert!(bad >= 1, "the bad backend was asked");
        assert!(
            bad < 40,
            "and learned about: asked {bad} times for 40 queries"
        );
    }
}

#[test]
fn a_closed_port_backend_costs_milliseconds_not_a_try() {
    let t = TwoBackends::start(None, &[]);
    let took = t.all_good("closed-", 60, Duration::from_millis(20));
    let slowest = report("closed port", &took);
    assert!(slowest < NO_TRY_WASTED, "slowest {slowest:?}");
    assert!(
        t.fwd
            .wait_for_log("cannot be reached", Duration::from_secs(2)),
        "the ICMP error is logged against the backend: {}",
        t.fwd.logs()
    );
}

#[test]
fn a_black_holed_backend_at_100_qps_gives_no_servfail_and_no_wasted_try() {
    let t = TwoBackends::start(Some(Mode::Silent), &[]);
    let took = t.all_good("hole-", 200, Duration::from_millis(10));
    let slowest = report("black hole", &took);
    assert!(slowest < NO_TRY_WASTED, "slowest {slowest:?}");
    assert!(
        t.fwd.wait_for_log("timed out", Duration::from_secs(3)),
        "the silent backend is found out although hedges answered for it"
    );
}

/// Both backends answer; the second loses its first query. Ten queries go out meanwhile, each
/// answered at once (a hedge covers the lost one).
fn one_backend_lost_one_packet(tag: &str) -> Rig {
    let t = TwoBackends::start(
        Some(Mode::DropFirst {
            answer_v4: OTHER_ANSWER,
            n: 1,
        }),
        &[],
    );
    for i in 0..10 {
        let (reply, took) = t.ask(&format!("{tag}{i}.svc.cluster.local"));
        let (code, _) = reply.expect("answered");
        assert_eq!(code, ResponseCode::NoError);
        assert!(took < NO_TRY_WASTED, "{tag}{i} took {took:?}");
    }
    t
}

#[test]
fn a_few_lost_packets_do_not_demote_a_backend_for_long() {
    let t = one_backend_lost_one_packet("lossy");
    let lost = Instant::now();
    // Its lost try times out after a second (forgiven: one loss among answers), and it takes
    // its share again: asked in rounds of 20 until it has a quarter of one, within seconds
    // (a loaded machine delays what the forwarder and the backends do, not the claim).
    let bad = t.responders[1].as_ref().unwrap();
    let (mut round, mut back) = (0, None);
    while back.is_none() && lost.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(500));
        bad.reset_counts();
        let before_good = t.responder(0).queries();
        for i in 0..20 {
            let _ = t.ask(&format!("after{round}-{i}.svc.cluster.local"));
            std::thread::sleep(Duration::from_millis(10));
        }
        let (to_bad, to_good) = (bad.queries(), t.responder(0).queries() - before_good);
        eprintln!("round {round}: {to_bad} to the lossy backend, {to_good} to the other");
        back = (to_bad >= 5).then(|| lost.elapsed());
        round += 1;
    }
    let back = back.expect("the lossy backend not back in rotation within 10 s");
    figure(
        "lossy-backend-back-in-rotation",
        back,
        Duration::from_millis(1500),
    );
}

/// Both backends answer; the second answers two warm-up queries, loses the next `lost` in a
/// row, then answers everything. Queries go out one at a time until it has lost them, each
/// answered at once (a hedge covers a lost one).
fn backend_loses_after_warming_up(lost: usize) -> Rig {
    let t = TwoBackends::start(
        Some(Mode::DropAfter {
            answer_v4: OTHER_ANSWER,
            answered: 2,
            dropped: lost,
        }),
        &[],
    );
    for i in 0..40 {
        if t.responder(1).queries() >= 2 + lost {
            return t;
        }
        let (reply, took) = t.ask(&format!("warm{i}.svc.cluster.local"));
        let (code, _) = reply.expect("answered");
        assert_eq!(code, ResponseCode::NoError);
        assert!(took < NO_TRY_WASTED, "warm{i} took {took:?}");
    }
    panic!(
        "the lossy backend got {} of 40 warm-up queries",
        t.responder(1).queries()
    );
}

/// The next `n` queries, one at a time: how many reached each backend, and how long they took.
fn shares_of_next(t: &Rig, tag: &str, n: usize) -> (usize, usize, Duration) {
    let bad = t.responder(1);
    bad.reset_counts();
    let before_good = t.responder(0).queries();
    let started = Instant::now();
    for i in 0..n {
        let _ = t.ask(&format!("{tag}{i}.svc.cluster.local"));
    }
    let took = started.elapsed();
    (bad.queries(), t.responder(0).queries() - before_good, took)
}

/// The forwarder's warnings that it put `upstream` behind the others.
fn demotions_of(t: &Rig, upstream: std::net::SocketAddr) -> Vec<String> {
    let upstream = format!("upstream={upstream} ");
    t.fwd
        .logs()
        .lines()
        .filter(|l| l.contains("trying other upstreams first") && l.contains(&upstream))
        .map(str::to_string)
        .collect()
}

/// One lost packet is forgiven, and costs no share even while its try is still out: right after
/// the loss (no wait for its timeout), and again once the try has timed out, the backend that
/// lost it gets its even share of the next 200 queries (50 % is even; 40 % is the floor here).
#[test]
fn one_lost_packet_costs_a_backend_next_to_none_of_its_share() {
    let t = backend_loses_after_warming_up(1);
    let (to_bad, to_good, took) = shares_of_next(&t, "now", 200);
    eprintln!(
        "right after one lost packet: {to_bad} of the next 200 to the backend that lost it, {to_good} to the other ({took:?})"
    );
    assert!(
        to_bad >= 80,
        "the lost try kept queries off its backend: {to_bad} of 200 (other: {to_good})"
    );
    // The lost try times out (--upstream-timeout 1s) meanwhile.
    std::thread::sleep(Duration::from_millis(1100));
    let (to_bad, to_good, took) = shares_of_next(&t, "later", 200);
    eprintln!(
        "once its try timed out: {to_bad} of the next 200 to the backend that lost it, {to_good} to the other ({took:?})"
    );
    assert!(
        to_bad >= 80,
        "one loss cost the backend its share: {to_bad} of 200 (other: {to_good})"
    );
    let demoted = demotions_of(&t, t.upstreams[1]);
    assert!(demoted.is_empty(), "one loss demoted it: {demoted:?}");
}

/// Two lost packets in a row demote the backend at once: at the second try's timeout (about a
/// second after it went out) it is put behind the other, with no third loss needed; and its next
/// answer, to a probe, puts it back.
#[test]
fn two_lost_packets_in_a_row_demote_a_backend_at_once() {
    let t = backend_loses_after_warming_up(2);
    let lossy = t.upstreams[1];
    let lost_at = Instant::now();
    let demoted = poll_until(Duration::from_secs(3), || {
        let d = demotions_of(&t, lossy);
        (!d.is_empty()).then_some(d)
    });
    let waited = lost_at.elapsed();
    eprintln!("two lost packets in a row: demoted {waited:?} after the second was lost");
    assert!(
        demoted.is_some(),
        "not demoted after two losses in a row; logs:\n{}",
        t.fwd.logs()
    );
    // Back in rotation at its first answer: queries come, it is probed and answers.
    let answers_again = format!("upstream answers again upstream={lossy} ");
    let back = poll_until(Duration::from_secs(3), || {
        let _ = t.ask("probe-me.svc.cluster.local");
        t.fwd.logs().contains(&answers_again).then_some(())
    });
    assert!(
        back.is_some(),
        "not back after answering a probe; logs:\n{}",
        t.fwd.logs()
    );
}

#[test]
fn a_backend_200ms_slower_gets_a_small_share() {
    let t = TwoBackends::start(
        Some(Mode::Delay {
            answer_v4: OTHER_ANSWER,
            delay: Duration::from_millis(200),
        }),
        &[],
    );
    // Warm up: each backend answers a few times, so both RTTs are known.
    for i in 0..10 {
        let _ = t.ask(&format!("warm{i}.svc.cluster.local"));
    }
    let mut took = Vec::new();
    for i in 0..100 {
        let (reply, t1) = t.ask(&format!("slow{i}.svc.cluster.local"));
        assert_eq!(reply.expect("answered").0, ResponseCode::NoError);
        took.push(t1);
        std::thread::sleep(Duration::from_millis(10));
    }
    took.sort();
    report("slow backend", &took);
    assert!(
        pct(&took, 90) < Duration::from_millis(150),
        "p90 {:?}",
        pct(&took, 90)
    );
}

#[test]
fn stale_answers_come_within_2s_then_at_once_while_every_upstream_is_down() {
    let mut r = Rig::loopback()
        .upstream(Mode::Normal {
            answer_v4: GOOD_ANSWER,
        })
        .flags(&["--cache-min-ttl", "0"])
        .start();
    let (at, cluster) = (r.at.clone(), r.cluster);
    let ask = || {
        let q = make_query("ttl1.stale.svc.cluster.local", RecordType::A, 7, None);
        let started = Instant::now();
        let reply = udp_exchange(&at, cluster, &q, Duration::from_secs(4));
        let msg = reply.and_then(|r| parse_message(&r)).expect("answered");
        (msg.response_code(), msg.answers().len(), started.elapsed())
    };
    assert_eq!(ask().0, ResponseCode::NoError);
    // The upstream goes dark (a black hole: it stops answering but the port stays bound).
    r.replace_upstream(0, Mode::Silent);
    std::thread::sleep(Duration::from_millis(1200)); // the TTL of 1 s has run out
    let (code, answers, first) = ask();
    assert_eq!(
        (code, answers),
        (ResponseCode::NoError, 1),
        "a stale answer"
    );
    assert!(
        first < Duration::from_millis(2300),
        "the first stale answer took {first:?}"
    );
    assert!(
        first >= Duration::from_millis(1700),
        "at the client-response timer: {first:?}"
    );
    for _ in 0..5 {
        let (code, answers, next) = ask();
        assert_eq!((code, answers), (ResponseCode::NoError, 1));
        assert!(
            next < Duration::from_millis(300),
            "later stale answers at once: {next:?}"
        );
    }
}

#[test]
fn tcp_clients_piling_on_a_silent_tcp_upstream_cannot_starve_the_process_of_descriptors() {
    let t = TwoBackends::start(
        Some(Mode::TcpSilent {
            answer_v4: GOOD_ANSWER,
        }),
        &["--upstream-timeout", "2s", "--query-timeout", "2500ms"],
    );
    // systemd's default soft limit for a service.
    let pid = t.fwd.pid().to_string();
    let out = std::process::Command::new("prlimit")
        .args(["--pid", &pid, "--nofile=1024:1024"])
        .output()
        .expect("prlimit (util-linux)");
    assert!(
        out.status.success(),
        "prlimit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 250 clients, 4 pipelined queries each: their TCP tries go to both backends, and the ones
    // at the silent TCP side stay open until their budget ends.
    let cluster = t.cluster;
    let streams: Vec<std::net::TcpStream> = t.at.enter(|| {
        (0..250)
            .filter_map(|c| {
                let mut s = std::net::TcpStream::connect(cluster).ok()?;
                let mut frames = Vec::new();
                for k in 0..4 {
                    let q = make_query(
                        &format!("t{c}-{k}.svc.cluster.local"),
                        RecordType::A,
                        k,
                        None,
                    );
                    frames.extend_from_slice(&(q.len() as u16).to_be_bytes());
                    frames.extend_from_slice(&q);
                }
                std::io::Write::write_all(&mut s, &frames).ok()?;
                Some(s)
            })
            .collect()
    });
    assert!(
        streams.len() >= 240,
        "{} TCP clients connected",
        streams.len()
    );
    // Meanwhile everyone else still gets answers.
    let took = t.all_good("udp-", 30, Duration::from_millis(20));
    assert!(
        took[took.len() - 1] < Duration::from_secs(2),
        "slowest {:?}",
        took[took.len() - 1]
    );
    assert!(t.fwd.is_running());
    // Running short of descriptors is our own trouble: it never makes the backend that answers
    // suspect.
    let good = t.upstreams[0].to_string();
    let logs = t.fwd.logs();
    let blamed: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("trying other upstreams first") && l.contains(&good))
        .collect();
    assert!(
        blamed.is_empty(),
        "the answering backend was blamed: {blamed:?}"
    );
    drop(streams);
}

/// Every upstream black-holed, with the clients pods really use: the outage's first lookups (one
/// name, or two names at once as two pods ask them) wait out the query budget while their tries
/// time out; tries for two names unanswered, or for one name over a whole budget, make the group
/// known down, and from then on every query is answered at once (SERVFAIL here, stale where the cache has
/// it), while probes test the upstream in the background. glibc (getent) and Go's own resolver
/// then fail over within 1 s, and busybox nslookup (Alpine pods; it takes a SERVFAIL only after
/// asking again) within its own 5 s budget.
#[test]
fn real_clients_fail_fast_once_every_upstream_is_known_down() {
    let dir = TempDir::new("go");
    let go = go_resolver(dir.path());
    // The outage starts with one name (its tries unanswered for a whole query budget), or with
    // two names at once (two pods, or one pod's search-path expansion).
    let starts: [&[&str]; 2] = [&["first.example"], &["first.example", "second.example"]];
    for first_names in starts {
        let case = format!("{} name(s) first", first_names.len());
        let rig = Rig::namespaces()
            .upstream(Mode::Silent)
            .tools(&["getent", "busybox", "go"])
            .start();
        let ns = rig.node_ns();
        ns.set_resolv_conf("nameserver 169.254.10.11\noptions timeout:5 attempts:1\n");
        let firsts: Vec<DigResult> = std::thread::scope(|s| {
            let asks: Vec<_> = first_names
                .iter()
                .map(|name| s.spawn(|| rig.dig(rig.cluster, &[name, "A"])))
                .collect();
            asks.into_iter().map(|a| a.join().expect("dig")).collect()
        });
        for first in &firsts {
            assert_eq!(first.status, "SERVFAIL", "{}", first.raw);
            assert!(
                first.elapsed < Duration::from_secs(4),
                "the outage's first lookups: SERVFAIL only after {:?}",
                first.elapsed
            );
        }
        let took: Vec<Duration> = firsts.iter().map(|f| f.elapsed).collect();
        eprintln!("{case}: the outage's first lookups {first_names:?}: SERVFAIL after {took:?}");

        let started = Instant::now();
        assert_eq!(getent_hosts(ns, "glibc.example"), None);
        let glibc = started.elapsed();
        let started = Instant::now();
        let out = ns
            .exec(
                "busybox",
                ["nslookup", "-type=a", "busybox.example", "169.254.10.11"],
            )
            .output()
            .expect("run busybox");
        let busybox = started.elapsed();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let started = Instant::now();
        let gone = ns
            .exec(&go, ["go.example"])
            .output()
            .expect("run the Go resolver");
        let golang = started.elapsed();
        assert!(!gone.status.success(), "Go resolved a black-holed name");
        let dig = rig.dig(rig.cluster, &["dig.example", "A"]);
        eprintln!(
            "{case}: once known down: glibc failed over in {glibc:?}, busybox in {busybox:?}, Go in {golang:?}, dig SERVFAIL in {:?}",
            dig.elapsed
        );
        assert!(golang < Duration::from_secs(1), "Go waited {golang:?}");
        assert!(glibc < Duration::from_secs(1), "glibc waited {glibc:?}");
        assert!(
            busybox < Duration::from_secs(5),
            "busybox waited {busybox:?}:\n{text}"
        );
        assert!(
            text.contains("SERVFAIL")
                || text.contains("server failure")
                || text.contains("Server failure"),
            "busybox got no SERVFAIL:\n{text}"
        );
        assert_eq!(dig.status, "SERVFAIL", "{}", dig.raw);
        assert!(
            dig.elapsed < Duration::from_millis(500),
            "dig waited {:?}",
            dig.elapsed
        );
        assert!(
            rig.responder(0).queries() > 3,
            "probes kept testing the upstream in the background"
        );
    }
}
