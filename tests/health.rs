//! Health from evidence only, on the real binary: an upstream that answers is alive, whatever
//! its RCODE and however late, and a quiet moment is no evidence at all. The VNet DNS (the node
//! listener) is the project's responder on loopback; `dig` is the client; no root needed.
//!
//! Each case once failed the next good name with SERVFAIL in 0 ms: the upstream's own SERVFAIL
//! or REFUSED for one name, or one answer later than a try, followed by a quiet second, made the
//! group look down. Here the next names must be asked upstream and answered.

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use common::*;

const ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// The default `--query-timeout`: whatever a client gets, it gets within this (plus margin).
const QUERY_BUDGET: Duration = Duration::from_millis(2500);
/// Room for a loaded 2-core machine around the budget.
const MARGIN: Duration = Duration::from_millis(1500);

/// `dig` a name on the node listener (it goes to the VNet DNS upstreams).
fn ask(r: &Rig, name: &str) -> DigResult {
    r.dig(r.node, &[name, "A"])
}

/// Queries the VNet DNS responders have received so far.
fn asked(r: &Rig) -> usize {
    (0..r.upstreams.len()).map(|i| r.upstream_queries(i)).sum()
}

/// After `broken` got what the upstream said (or the answer, late), `quiet` passes with no
/// query at all; then two good names must each be asked upstream and answered NOERROR with its
/// record. Prints what the first good name got and when.
fn good_names_after(r: &Rig, case: &str, quiet: Duration) {
    std::thread::sleep(quiet);
    for good in ["good1.example.com", "good2.example.com"] {
        let before = asked(r);
        let got = ask(r, good);
        let upstream_asked = asked(r) - before;
        eprintln!(
            "{case}: after {quiet:?} without a query, {good}: {} in {:?}, upstream asked {upstream_asked} times",
            got.status, got.elapsed
        );
        assert_eq!(
            got.status,
            "NOERROR",
            "{case}: {good}: {}\nlogs:\n{}",
            got.raw,
            r.fwd.logs()
        );
        assert_eq!(got.answers, [ANSWER.to_string()], "{case}: {good}");
        assert!(
            upstream_asked >= 1,
            "{case}: {good} was answered without asking the upstream"
        );
    }
}

/// The upstream's SERVFAIL or REFUSED for one name is passed on, and is no evidence against
/// the upstream: after a quiet 1.5 s (or 3 s), the next names are asked and answered. Also with
/// two VNet DNS servers that both fail the broken name.
#[test]
fn an_upstreams_error_for_one_name_fails_no_other_name_after_a_quiet_moment() {
    let bad = |code| Mode::RcodeFor {
        prefix: "bad",
        code,
        answer_v4: ANSWER,
    };
    let cases: [(&str, u8, usize, Duration); 4] = [
        ("SERVFAIL", 2, 1, Duration::from_millis(1500)),
        ("REFUSED", 5, 1, Duration::from_millis(1500)),
        ("SERVFAIL", 2, 1, Duration::from_secs(3)),
        ("SERVFAIL", 2, 2, Duration::from_millis(1500)),
    ];
    for (status, code, servers, quiet) in cases {
        let case = format!("{status} from {servers} server(s), {quiet:?} quiet");
        let mut rig = Rig::loopback();
        for _ in 0..servers {
            rig = rig.upstream(bad(code));
        }
        let all: Vec<usize> = (0..servers).collect();
        let r = rig.node_to(&all).cluster_to(&all).start();
        let broken = ask(&r, "bad.example.com");
        eprintln!(
            "{case}: bad.example.com: {} in {:?}",
            broken.status, broken.elapsed
        );
        assert_eq!(broken.status, status, "{case}: {}", broken.raw);
        assert!(
            broken.elapsed < QUERY_BUDGET,
            "{case}: the upstream's own answer, passed on, took {:?}",
            broken.elapsed
        );
        assert_eq!(
            asked(&r),
            servers,
            "{case}: each server was asked the broken name once"
        );
        good_names_after(&r, &case, quiet);
    }
}

/// One name the upstream is slow to resolve: each of its answers comes 1.3 s after the query,
/// past the 1 s try but inside the 2.5 s budget, and the client gets it. A late answer is life:
/// after a quiet 1.5 s the next names are asked and answered.
#[test]
fn one_answer_later_than_a_try_fails_no_other_name_after_a_quiet_moment() {
    let r = Rig::loopback()
        .upstream(Mode::DelayFor {
            prefix: "slow",
            delay: Duration::from_millis(1300),
            answer_v4: ANSWER,
        })
        .start();
    let slow = ask(&r, "slow.example.com");
    eprintln!(
        "slow answer: slow.example.com: {} {:?} in {:?}",
        slow.status, slow.answers, slow.elapsed
    );
    assert_eq!(slow.status, "NOERROR", "{}", slow.raw);
    assert_eq!(slow.answers, [ANSWER.to_string()]);
    assert!(
        slow.elapsed >= Duration::from_millis(1200),
        "the late answer itself reached the client: {:?}",
        slow.elapsed
    );
    assert!(
        slow.elapsed < QUERY_BUDGET + MARGIN,
        "within the budget: {:?}",
        slow.elapsed
    );
    good_names_after(&r, "one late answer", Duration::from_millis(1500));
}
