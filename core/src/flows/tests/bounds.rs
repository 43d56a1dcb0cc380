//! The standby's timing goals on the fake clock, where they can be asserted tight: the suite
//! times the same goals on real processes with margins a loaded machine allows. Each test drives
//! [`Flows`] as the shell would, beside a LocalDNS whose every instant is given by a script, and
//! sweeps the fault's start across the looks' and the probe's grid for the worst case.

use super::*;

/// The goal for a hung LocalDNS: dark at most this long (the 60 ms).
const DARK_GOAL: Duration = Duration::from_millis(60);
/// A LocalDNS answers a probe round this fast.
const ANSWER_IN: Duration = Duration::from_millis(1);
/// What a hang's first `queries` pods' queries (one a millisecond) leave in an unread queue:
/// datagrams of many sizes, so that the busy looks' period (set by what is queued) varies.
fn queued_by(queries: u32) -> u32 {
    (0..queries).map(|i| 40 + (i * 7919) % 500).sum()
}

/// What LocalDNS is at one instant, as the shell's looks, owners checks and probe rounds see it.
#[derive(Clone, Copy)]
struct Seen {
    queued: u32,
    owners: Owners,
    answers: bool,
}

const SERVING: Seen = Seen {
    queued: 0,
    owners: Owners::Asleep,
    answers: true,
};

/// When the flows changed hands.
#[derive(Default, Debug)]
struct Changes {
    takes: Vec<(Instant, Cause)>,
    hand_backs: Vec<Instant>,
}

/// Drives a standby started at `start` beside LocalDNS as `seen` says, until `until`.
fn run(start: Instant, until: Instant, seen: impl Fn(Instant) -> Seen) -> Changes {
    let mut f = Flows::new(start, None);
    let mut changes = Changes::default();
    let mut round: Option<(Instant, bool)> = None;
    let mut t = start;
    while t < until {
        while let Some(out) = f.poll(t) {
            match out {
                Out::Look { .. } => {
                    let q = [Queue {
                        inode: 7,
                        queued: seen(t).queued,
                    }];
                    f.looked(t, &q, true);
                }
                Out::CheckOwners => f.owners(t, seen(t).owners),
                // A round LocalDNS answers ends at once; one it does not, at the shell's wait.
                Out::Ask => {
                    round = Some(match seen(t).answers {
                        true => (t + ANSWER_IN, true),
                        false => (t + PROBE_EVERY, false),
                    })
                }
                Out::Take(why) => changes.takes.push((t, why)),
                Out::HandBack => changes.hand_backs.push(t),
                Out::Repoint => {}
            }
        }
        let next = round.map_or(f.deadline(), |(end, _)| end.min(f.deadline()));
        t = next.max(t + Duration::from_micros(50));
        if let Some((end, answered)) = round {
            if t >= end {
                round = None;
                f.asked(t, answered);
            }
        }
    }
    changes
}

/// A LocalDNS that serves, then from `at` neither reads nor answers (its owners `owners`), with
/// pods asking every millisecond (`busy`) or not at all.
fn hung(at: Instant, until: Instant, owners: Owners, busy: bool) -> impl Fn(Instant) -> Seen {
    move |t| match t {
        _ if t < at || t >= until => SERVING,
        _ => Seen {
            queued: if busy {
                queued_by(1 + (t - at).as_millis() as u32)
            } else {
                0
            },
            owners,
            answers: false,
        },
    }
}

/// The fault's start a warm-up in and then at every quarter millisecond across a look and a probe
/// round, the grids both run against.
fn starts(t0: Instant) -> impl Iterator<Item = Instant> {
    let warm = Duration::from_secs(1);
    (0..4 * PROBE_EVERY.as_millis() as u32).map(move |i| t0 + warm + Duration::from_micros(250) * i)
}

/// The worst delay from the hang's start to the take, over every start.
fn worst_take(owners: Owners) -> Duration {
    let t0 = Instant::now();
    starts(t0)
        .map(|at| {
            let end = at + Duration::from_secs(1);
            let c = run(t0, end, hung(at, end, owners, true));
            assert_eq!(c.takes.len(), 1, "{owners:?} from {:?}: {c:?}", at - t0);
            c.takes[0].0 - at
        })
        .max()
        .unwrap_or_default()
}

#[test]
fn a_stopped_localdns_is_taken_within_60ms_of_going_dark() {
    let worst = worst_take(Owners::Stopped);
    assert!(worst <= DARK_GOAL, "taken {worst:?} after the SIGSTOP");
}

/// A blocked (asleep) owner is taken only once its queue is `UNREAD_FOR` old, at a busy look,
/// and the first unread query may wait a whole idle look to be seen: that sum is the promise,
/// and it misses the goal by up to a busy look (see the commit that added this test).
#[test]
fn a_blocked_localdns_is_taken_within_an_idle_look_unread_for_and_a_busy_look_of_going_dark() {
    let worst = worst_take(Owners::Asleep);
    let promised = LOOK_EVERY + UNREAD_FOR + LOOK_BUSY * 3;
    assert!(worst <= promised, "taken {worst:?} after the hang");
}

/// The flows go back once the proof is answered: two rounds for a queue take, `SAME_PROOF` for a
/// probe take of the same process (a quiet node); a round asked during the hang may end after it.
#[test]
fn a_localdns_resumed_after_a_hang_has_its_flows_back_within_a_second_and_its_proof() {
    let t0 = Instant::now();
    for (busy, proof) in [(true, Duration::ZERO), (false, SAME_PROOF)] {
        let worst = starts(t0)
            .step_by(7)
            .map(|at| {
                let resume = at + Duration::from_secs(2);
                let end = resume + proof + Duration::from_secs(3);
                let c = run(t0, end, hung(at, resume, Owners::Asleep, busy));
                assert_eq!(c.hand_backs.len(), 1, "busy {busy}: {c:?}");
                c.hand_backs[0] - resume
            })
            .max()
            .unwrap_or_default();
        let bound = Duration::from_secs(1) + proof;
        assert!(
            worst <= bound,
            "busy {busy}: back {worst:?} after the resume"
        );
    }
}

/// Faults of each kind, one after another, each longer than its own detection and each followed
/// by serving long enough for any proof: one take and one hand-back each, in turn.
#[test]
fn each_fault_takes_the_flows_once_and_hands_them_back_once() {
    let t0 = Instant::now();
    let gap = MAX_PROOF + Duration::from_secs(5);
    let fault = Duration::from_secs(1);
    let kinds = [
        (Owners::Asleep, true),
        (Owners::Stopped, true),
        (Owners::Asleep, false),
        (Owners::Asleep, true),
        (Owners::Stopped, true),
    ];
    let at = |i: usize| t0 + Duration::from_secs(1) + (fault + gap) * i as u32;
    let end = at(kinds.len());
    let c = run(t0, end, |t| {
        let i = (0..kinds.len()).rev().find(|&i| t >= at(i));
        match i {
            Some(i) if t < at(i) + fault => {
                let (owners, busy) = kinds[i];
                hung(at(i), at(i) + fault, owners, busy)(t)
            }
            _ => SERVING,
        }
    });
    assert_eq!(c.takes.len(), kinds.len(), "{c:?}");
    assert_eq!(c.hand_backs.len(), kinds.len(), "{c:?}");
    for i in 0..kinds.len() {
        let (took, back) = (c.takes[i].0, c.hand_backs[i]);
        assert!(
            at(i) <= took && took < back && back < at(i + 1),
            "fault {i}: {c:?}"
        );
    }
}

/// Starved of CPU, LocalDNS reads for 2 ms in every 100 and its owners are runnable whenever the
/// shell asks: its queues fill and drain, or fill and only shrink, and it answers its probe.
#[test]
fn a_starved_localdns_that_keeps_reading_is_never_taken() {
    let t0 = Instant::now();
    let period = Duration::from_millis(100);
    for drains in [true, false] {
        let c = run(t0, t0 + Duration::from_secs(20), |t| {
            let n = (t - t0).as_millis() as u32;
            let (cycle, into) = (n / 100, n % 100);
            let left = if drains { 0 } else { 5_000 + 10 * (cycle % 7) };
            Seen {
                queued: if into < 2 {
                    left
                } else {
                    left + queued_by(into)
                },
                owners: Owners::Runnable,
                answers: true,
            }
        });
        assert!(
            c.takes.is_empty(),
            "drains {drains}, every {period:?}: {c:?}"
        );
    }
}
