//! The fallback beside a LocalDNS that serves, in network namespaces: a start (by hand, by
//! `OnFailure=`, by anything) never takes a flow from it and ends cleanly; the standby mode stays
//! beside it, takes the flows within about 70 ms of LocalDNS going silent (bound and alive,
//! reading nothing: a hung CoreDNS; a stopped one, in `tests/systemd.rs`, within 60) and gives
//! them back within 1 s of its answering again.

mod common;

use localdns_fallback::flows::{LOOK_BUSY, LOOK_EVERY, UNREAD_FOR};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;

const NODE: &str = "169.254.10.10:53";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    LocalDns,
    Fallback,
    Nobody,
}

/// What a pod sees: queries from new sockets (new flows) to both listeners every 5 ms, each
/// waiting up to 1 s (a loaded machine may delay an answer that much; a query left in a hung
/// LocalDNS's socket is never answered), for `how_long`. Each sample: when it was sent and who
/// answered.
fn ask_for(ns: &Netns, how_long: Duration) -> JoinHandle<Vec<(Instant, Who)>> {
    let pods = new_flows(
        ns,
        Duration::from_millis(5),
        Duration::from_secs(1),
        how_long,
    );
    std::thread::spawn(move || {
        let who = |s: Sample| match s.answered {
            Some((_, By::Standby)) => Who::Fallback,
            Some((_, By::LocalDns)) => Who::LocalDns,
            None => Who::Nobody,
        };
        pods.join()
            .unwrap()
            .into_iter()
            .map(|s| (s.sent, who(s)))
            .collect()
    })
}

fn listener_addresses_on_lo(ns: &Netns) -> bool {
    let out = ns.ip("-4 addr show dev lo");
    out.contains("169.254.10.10") || out.contains("169.254.10.11")
}

#[test]
fn a_start_beside_a_serving_localdns_takes_no_flow_and_ends_cleanly() {
    let (topo, up, _r) = node_and_upstream();
    let _localdns = LocalDns::start(&topo.node);
    let asking = ask_for(&topo.node, Duration::from_millis(800));
    // The scenario: pods ask for 100 ms before the fallback starts.
    std::thread::sleep(Duration::from_millis(100));
    let f = Forwarder::spawn(&topo.node, &upstream_args(&up, &[]));
    let status = f
        .wait_exit(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("still running beside a serving LocalDNS:\n{}", f.logs()));
    let samples = asking.join().unwrap();
    let logs = f.logs();
    assert!(status.success(), "{status}:\n{logs}");
    assert!(
        logs.contains("LocalDNS answers on both listeners; not taking over"),
        "{logs}"
    );
    let taken = samples.iter().filter(|s| s.1 == Who::Fallback).count();
    let lost = samples.iter().filter(|s| s.1 == Who::Nobody).count();
    eprintln!(
        "{} queries while the fallback started: {taken} answered by it, {lost} lost",
        samples.len()
    );
    assert_eq!((taken, lost), (0, 0), "flows taken from a serving LocalDNS");
    assert!(
        !listener_addresses_on_lo(&topo.node),
        "addresses left on lo"
    );
}

/// Whatever happens to the standby beside a LocalDNS that answers (a start, a kill and the
/// restart after it, a stop, a start again), pods' queries to both listeners all go to LocalDNS:
/// none is answered by the standby, none is lost. The one exception is the first join of a group
/// that has no steering program yet: between its bind and the program's attach (two system calls
/// in a row, longer only if the thread is preempted between them, as on this machine under the
/// whole suite: 1 query of 1,754 once) the kernel hashes new flows over both members. Every later
/// join finds the program the first one left with the group.
#[test]
fn standby_starts_killed_restarted_and_stopped_beside_a_serving_localdns_take_no_flow() {
    let (topo, up, _r) = node_and_upstream();
    let localdns = LocalDns::start(&topo.node);
    let asking = ask_for(&topo.node, Duration::from_secs(5));
    // The scenario: pods ask for 100 ms before the first start.
    std::thread::sleep(Duration::from_millis(100));
    let args = upstream_args(&up, &["--standby"]);
    // Standing by, its probe answered by LocalDNS twice (it has seen LocalDNS serve).
    let standing_by = |f: &Forwarder| localdns.wait_stood_by(f, 2, Duration::from_secs(5));
    let mut logs = String::new();
    let first = Forwarder::spawn(&topo.node, &args);
    assert!(
        first.wait_for_log("ready", Duration::from_secs(5)),
        "{}",
        first.logs()
    );
    let first_steered = Instant::now();
    standing_by(&first);
    first.signal(Signal::SIGKILL);
    first.wait_exit(Duration::from_secs(5)).expect("killed");
    logs += &first.logs();
    let restarted = Forwarder::spawn(&topo.node, &args);
    standing_by(&restarted);
    restarted.signal(Signal::SIGTERM);
    let status = restarted.wait_exit(Duration::from_secs(5)).expect("stops");
    logs += &restarted.logs();
    assert!(status.success(), "{status}:\n{logs}");
    let again = Forwarder::spawn(&topo.node, &args);
    standing_by(&again);
    let samples = asking.join().unwrap();
    logs += &again.logs();
    let (at_first_join, later): (Vec<&(Instant, Who)>, Vec<_>) =
        samples.iter().partition(|s| s.0 < first_steered);
    let taken_at_first_join = at_first_join
        .iter()
        .filter(|s| s.1 == Who::Fallback)
        .count();
    let taken = later.iter().filter(|s| s.1 == Who::Fallback).count();
    let lost = samples.iter().filter(|s| s.1 == Who::Nobody).count();
    eprintln!(
        "{} queries across a standby's start, kill, restart, stop and start beside a serving \
         LocalDNS: {taken} answered by the standby once it was steered ({taken_at_first_join} \
         in its first join), {lost} lost",
        samples.len()
    );
    assert_eq!(
        (taken, lost),
        (0, 0),
        "flows taken from a serving LocalDNS:\n{logs}"
    );
    assert!(
        taken_at_first_join <= 5,
        "{taken_at_first_join} flows taken while the first join was steered:\n{logs}"
    );
    assert!(
        !listener_addresses_on_lo(&topo.node),
        "addresses on lo while standing by"
    );
}

#[test]
fn standby_takes_a_hung_localdns_flows_within_its_bound_and_gives_them_back() {
    let (topo, up, _r) = node_and_upstream();
    let localdns = LocalDns::start(&topo.node);
    let f = Forwarder::spawn(&topo.node, &upstream_args(&up, &["--standby"]));
    assert!(
        f.wait_for_log("standing by", Duration::from_secs(10)),
        "{}",
        f.logs()
    );
    // Beside a LocalDNS that answers, the standby takes nothing.
    let healthy = ask_for(&topo.node, Duration::from_millis(500))
        .join()
        .unwrap();
    let taken = healthy.iter().filter(|s| s.1 == Who::Fallback).count();
    assert_eq!(
        taken,
        0,
        "the standby took flows from a serving LocalDNS:\n{}",
        f.logs()
    );
    assert!(
        !listener_addresses_on_lo(&topo.node),
        "addresses on lo while standing by"
    );

    // LocalDNS goes silent.
    let asking = ask_for(&topo.node, Duration::from_millis(1500));
    // The scenario: pods ask a serving LocalDNS for 200 ms before it goes silent.
    std::thread::sleep(Duration::from_millis(200));
    let silent_at = Instant::now();
    localdns.hang(true);
    let samples = asking.join().unwrap();
    // Dark: from the silence to the first query after which every query is answered.
    let last_unanswered = samples
        .iter()
        .filter(|s| s.0 >= silent_at && s.1 == Who::Nobody)
        .map(|s| s.0)
        .max();
    let dark = last_unanswered.map_or(Duration::ZERO, |t| t - silent_at);
    let by_fallback = samples.iter().filter(|s| s.1 == Who::Fallback).count();
    eprintln!(
        "LocalDNS silent: dark {dark:?}, then {by_fallback} of {} queries answered by the standby",
        samples.len()
    );
    assert!(by_fallback > 0, "{}", f.logs());
    // A query left unread is seen within a look, and a queue unread for `UNREAD_FOR` (its
    // owner asleep, not stopped) takes the flows, checked by busy looks of up to 3 ms; the pods
    // here ask every 5 ms. That is the goal; the suite allows a loaded machine 1 s (pods'
    // clients wait 5 s).
    let goal = LOOK_EVERY + UNREAD_FOR + 3 * LOOK_BUSY + Duration::from_millis(15);
    figure("silent-localdns-pods-dark", dark, goal);
    let bound = Duration::from_secs(1);
    assert!(
        dark <= bound,
        "pods dark {dark:?} (bound {bound:?}) after LocalDNS went silent:\n{}",
        f.logs()
    );
    assert!(
        listener_addresses_on_lo(&topo.node),
        "serving without the addresses on lo"
    );

    // LocalDNS answers again.
    // Asked 3.8 s past the resume: a LocalDNS never given its flows back fails the bound. The
    // scenario: pods ask the standby for 200 ms before LocalDNS answers again.
    let asking = ask_for(&topo.node, Duration::from_millis(4000));
    std::thread::sleep(Duration::from_millis(200));
    let back_at = Instant::now();
    localdns.hang(false);
    let samples = asking.join().unwrap();
    let last_not_localdns = samples
        .iter()
        .filter(|s| s.0 >= back_at && s.1 != Who::LocalDns)
        .map(|s| s.0)
        .max();
    let back = last_not_localdns.map_or(Duration::ZERO, |t| t - back_at);
    let lost = samples.iter().filter(|s| s.1 == Who::Nobody).count();
    eprintln!(
        "LocalDNS back: every query its own after {back:?}; {lost} lost across the hand-back"
    );
    figure(
        "silent-localdns-every-flow-its-own-again",
        back,
        Duration::from_secs(1),
    );
    assert!(
        back <= Duration::from_secs(3),
        "LocalDNS had every flow again only after {back:?}:\n{}",
        f.logs()
    );
    assert_eq!(lost, 0, "queries lost across the hand-back:\n{}", f.logs());
    assert!(
        !listener_addresses_on_lo(&topo.node),
        "addresses left on lo after the hand-back"
    );
    let logs = f.logs();
    assert!(
        logs.contains("LocalDNS left queries unread in its sockets; serving its listeners"),
        "{logs}"
    );
    assert!(
        logs.contains("LocalDNS answers again; new flows go to it"),
        "{logs}"
    );

    // A standby that is stopped ends cleanly.
    f.signal(Signal::SIGTERM);
    let status = f.wait_exit(Duration::from_secs(5)).expect("exits");
    assert!(status.success(), "{status}:\n{}", f.logs());
}

#[test]
fn standby_serves_at_once_where_no_localdns_is_bound() {
    let (topo, up, _r) = node_and_upstream();
    let f = Forwarder::spawn(&topo.node, &upstream_args(&up, &["--standby"]));
    f.wait_ready(&topo.node, NODE.parse().unwrap(), Duration::from_secs(10));
    let r = dig(&topo.node, &["@169.254.10.11", "a.example.", "A"]);
    assert_eq!(r.answers, ["10.0.0.1"], "{}\n{}", r.raw, f.logs());
    assert!(
        f.logs()
            .contains("LocalDNS's probe went unanswered; serving its listeners"),
        "{}",
        f.logs()
    );
    f.signal(Signal::SIGTERM);
    let status = f.wait_exit(Duration::from_secs(5)).expect("exits");
    assert!(status.success(), "{status}:\n{}", f.logs());
}

/// A fallback started for a failed LocalDNS (here by hand) runs the standby's own loop, holding
/// the flows from its start: a LocalDNS that comes back (bound, answering, its addresses on its
/// link) gets them back, and pods' new flows all go to it.
#[test]
fn a_fallback_started_without_standby_holds_the_flows_and_hands_them_to_a_localdns_back() {
    let (topo, up, _r) = node_and_upstream();
    let f = Forwarder::spawn(&topo.node, &upstream_args(&up, &[]));
    f.wait_ready(&topo.node, NODE.parse().unwrap(), Duration::from_secs(10));
    let r = dig(&topo.node, &["@169.254.10.11", "a.example.", "A"]);
    assert_eq!(r.answers, ["10.0.0.1"], "{}\n{}", r.raw, f.logs());
    assert!(
        f.logs()
            .contains("it was started by hand; serving its listeners"),
        "{}",
        f.logs()
    );
    let _localdns = LocalDns::start(&topo.node);
    assert!(
        f.wait_for_log(
            "LocalDNS answers again; new flows go to it",
            Duration::from_secs(5)
        ),
        "{}",
        f.logs()
    );
    let samples = ask_for(&topo.node, Duration::from_millis(300))
        .join()
        .unwrap();
    let not_localdns = samples.iter().filter(|s| s.1 != Who::LocalDns).count();
    assert_eq!(
        not_localdns,
        0,
        "of {} queries after the hand-back:\n{}",
        samples.len(),
        f.logs()
    );
    f.signal(Signal::SIGTERM);
    let status = f.wait_exit(Duration::from_secs(5)).expect("exits");
    assert!(status.success(), "{status}:\n{}", f.logs());
}

/// LocalDNS restarting quickly beside the standby (its sockets close, new ones join at once)
/// makes the kernel move the standby's sockets into the indices LocalDNS's left, where the
/// steering points: pods' queries must still go to LocalDNS. Queries sent while a restart is under
/// way (no LocalDNS socket, or one not yet bound) may be answered by the standby; of those sent
/// while a LocalDNS is bound, only the one per listener that shows the steering went stale.
#[test]
fn standby_takes_no_flow_across_quick_localdns_restarts() {
    const RESTARTS: usize = 5;
    let (topo, up, _r) = node_and_upstream();
    let mut localdns = LocalDns::start(&topo.node);
    let f = Forwarder::spawn(&topo.node, &upstream_args(&up, &["--standby"]));
    localdns.wait_stood_by(&f, 2, Duration::from_secs(10));
    let asking = ask_for(
        &topo.node,
        Duration::from_millis(400 * (RESTARTS as u64 + 1)),
    );
    let mut restarts = Vec::new();
    for _ in 0..RESTARTS {
        // The scenario: LocalDNS serves 400 ms between restarts.
        std::thread::sleep(Duration::from_millis(400));
        // The next process started beforehand: what is timed is the restart, not a spawn.
        let next = LocalDns::with().prepare(&topo.node);
        let from = Instant::now();
        drop(std::mem::replace(&mut localdns, next));
        localdns.bind();
        restarts.push(from..Instant::now());
    }
    let samples = asking.join().unwrap();
    let logs = f.logs();
    let restarting = |t: Instant| restarts.iter().any(|r| r.contains(&t));
    let count = |who: Who, during: bool| {
        samples
            .iter()
            .filter(|s| s.1 == who && restarting(s.0) == during)
            .count()
    };
    let (taken, taken_in_gaps) = (count(Who::Fallback, false), count(Who::Fallback, true));
    let (lost, lost_in_gaps) = (count(Who::Nobody, false), count(Who::Nobody, true));
    let gaps: Vec<Duration> = restarts.iter().map(|r| r.end - r.start).collect();
    eprintln!(
        "{} queries across {RESTARTS} LocalDNS restarts (gaps {gaps:?}): {taken} answered by the \
         standby while LocalDNS was bound ({taken_in_gaps} during the restarts), {lost} lost \
         ({lost_in_gaps} during the restarts)",
        samples.len()
    );
    // The first stray query on each listener is what tells the standby its steering went stale
    // (it answers it, then re-points, which takes a few milliseconds, more on a loaded machine;
    // others land meanwhile): a few per restart, where it was 149 of 930 before re-pointing.
    assert!(
        taken <= 4 * RESTARTS,
        "the standby answered {taken} queries while LocalDNS was bound:\n{logs}"
    );
    assert!(
        !logs.contains("serving its listeners"),
        "the standby took the flows from a LocalDNS that answers:\n{logs}"
    );
}
