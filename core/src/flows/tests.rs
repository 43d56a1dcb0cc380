//! Seeded lifecycles of LocalDNS beside the standby's [`Flows`], on a fake clock: starts, slow
//! start-ups, crashes (addresses kept or deleted) and crash storms, hangs and resumes, quick
//! restarts, a LocalDNS that reads but does not answer, one alive while its addresses are gone,
//! one starved of CPU (it fails under the pods' load and answers its probe once the load is off
//! it), one starved and then hung with what the starvation left queued, CPU-quota throttling,
//! sockets joining and leaving, lost and refused probe rounds, quiet and busy clients, the whole
//! machine paused (late looks), pods' queries that reach the standby aside, the standby's
//! addresses taken off lo while it holds, and the standby itself restarted.
//! A tenth of the lifecycles are longer and have one fault only, which the same process has again
//! soon after each hand-back, so that the proof doubles up to its cap.
//! The world here models the kernel (which socket a new flow reaches, what waits in each queue,
//! which interface carries the addresses) and carries out what the machine says; the checks read
//! only what the machine said and what the world did, never its fields. After every step:
//! - every take has its cause in what the world did (two silent rounds it delivered, a queue it
//!   left unread at least as long as the bound, timed as the looks reported it and afresh where
//!   it said the owners runnable, the addresses it deleted), never earlier; and
//!   comes within its bound: at the second silent round, at once for the addresses, within a
//!   round of a refusing LocalDNS, within the queues' bound of the first unread query;
//! - at most one take per fault (a storm: one per crash), blind shells aside (see `episode`);
//! - the flows go back only to a LocalDNS whose link carries the addresses and that answered the
//!   rounds its proof asks (counted by the world from its own rounds and takes), and at the
//!   round that completes them; at the latest at `MAX_PROOF`'s worth of rounds, however often
//!   the fault came back;
//! - a LocalDNS that serves healthily is never taken from; throttled, the flows change hands at
//!   most once every `UNREAD_REST`;
//! - the steering is pointed afresh within a look after the groups' members moved it, within
//!   `STRAY_GAP` of a pod's query reaching the standby aside, and the addresses put back on
//!   lo at once while the standby holds the flows.
//!
//! A failure names its seed; `FLOWS_SEED=<seed>` replays it, `FLOWS_LIFECYCLES=<n>` runs more.
//! Planted bugs this caught are listed in `planted.md` beside this file.

use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// What the standby promises, written out here again rather than read from the machine: a change
// to one of its constants is a change of behaviour, and the model must see it. (They shadow the
// machine's constants of the same names.)
const PROBE_EVERY: Duration = Duration::from_millis(120);
const ROUNDS_TO_ACT: u32 = 2;
const LOOK_EVERY: Duration = Duration::from_millis(30);
const LOOK_BUSY: Duration = Duration::from_millis(1);
const STOPPED_FOR: Duration = Duration::from_millis(4);
const UNREAD_FOR: Duration = Duration::from_millis(30);
const STRAY_GAP: Duration = Duration::from_millis(10);
const UNREAD_REST: Duration = Duration::from_secs(10);
const SAME_PROOF: Duration = Duration::from_secs(10);
const RECUR: Duration = Duration::from_secs(60);
const MAX_PROOF: Duration = Duration::from_secs(30);

/// The shell's wait for a probe round.
const WAIT: Duration = Duration::from_millis(120);
const MS: Duration = Duration::from_millis(1);
/// Two silent rounds from any point: a round under way, the next one, and one asked at once.
const PROBE_BOUND: Duration = Duration::from_millis(500);
/// A LocalDNS with no socket refuses a round at once, and the next is asked at once.
const REFUSED_BOUND: Duration = PROBE_EVERY.saturating_add(Duration::from_millis(5));
/// A look sees the first unread query at most a look late, the stall a busy look after it is old.
const QUEUE_BOUND: Duration = UNREAD_FOR
    .saturating_add(LOOK_EVERY)
    .saturating_add(LOOK_BUSY.saturating_mul(3))
    .saturating_add(MS);
/// A stopped LocalDNS (SIGSTOP) whose owners the shell can see: seen a look late, asked after
/// `STOPPED_FOR`, found at a busy look.
const STOPPED_BOUND: Duration = LOOK_EVERY
    .saturating_add(STOPPED_FOR)
    .saturating_add(LOOK_BUSY.saturating_mul(3))
    .saturating_add(MS);
/// A stall its owners were found runnable in, from that answer: a busy look after it is old.
const AFRESH_BOUND: Duration = UNREAD_FOR
    .saturating_add(LOOK_BUSY.saturating_mul(3))
    .saturating_add(MS);
/// After a resume, a round asked during the silence may still end silent.
const GRACE: Duration = WAIT.saturating_add(LOOK_EVERY).saturating_add(MS);
/// The longest a healthy socket's queue stays non-empty and growing (what `tests/unread.rs`
/// measures on the real thing, with margin below `UNREAD_FOR`).
const HEALTHY_RUN: Duration = Duration::from_millis(13);
const THROTTLE_PERIOD: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Serving,
    Hung,
    /// Reads, answers nothing.
    Mute,
    /// Bound, reading from `reads_at` on.
    Starting {
        reads_at: Instant,
    },
    /// Crashed: no socket.
    Absent,
    /// Frozen for the first `frozen` of every `THROTTLE_PERIOD` by its CPU quota; keeps up.
    Throttled {
        frozen: Duration,
    },
    /// Starved: under the pods' load it reads 2 ms in 100 and loses most probe rounds in its
    /// overflowing queues; without the load (the standby holds the flows) it serves.
    Starved,
}

#[derive(Debug)]
struct Sock {
    inode: u64,
    unread: u32,
    /// The healthy queue's current growing run, for its noise.
    run: Option<(Instant, u32)>,
    /// What the last look reported, and whether that was a queue left unread.
    reported: u32,
    stalled: bool,
    /// Since when the looks have reported this queue non-empty and not shrinking, timed afresh
    /// when its owners were found runnable with a stall `UNREAD_FOR` old, and after a pause.
    reported_since: Option<Instant>,
}

struct Probe {
    asked: Instant,
    lost: bool,
}

struct World {
    rng: StdRng,
    now: Instant,
    flows: Flows,
    phase: Phase,
    phase_since: Instant,
    sockets: Vec<Sock>,
    next_inode: u64,
    /// The listener addresses are on LocalDNS's link.
    addresses: bool,
    /// And on lo, where the standby put them.
    on_lo: bool,
    /// Where the steering points, as the machine's outs left it.
    target: Holder,
    /// Since when the members moved our index under the steering.
    stale: Option<Instant>,
    /// A pod's query reached the standby aside, told to the machine, while the steering was stale.
    strayed: Option<Instant>,
    probe: Option<Probe>,
    last_lost: bool,
    /// Rounds the world ended: silent ones in a row, and answered ones since the take with no
    /// two silent in a row among them.
    silent_in_row: u32,
    answered_since_take: u32,
    /// The second silent round in a row ended with LocalDNS holding the flows: a take is due.
    take_due: bool,
    /// The round that completes the proof ended: a hand-back is due.
    hand_back_due: bool,
    /// LocalDNS's TCP listeners join their groups from then on (it binds UDP first).
    tcp_at: Option<Instant>,
    /// The inodes the last look reported, whether it found a LocalDNS socket in every group, and
    /// the inodes it reported before the last take.
    view: Vec<u64>,
    view_complete: bool,
    view_at_take: Vec<u64>,
    view_at_hand_back: Vec<u64>,
    /// The last look's inodes at LocalDNS's last answered round.
    view_at_answer: Vec<u64>,
    last_hand_back: Option<Instant>,
    recurrences: u32,
    /// The owners' state the world last gave.
    owners_said: Option<Owners>,
    /// When the world last said the owners of a stalled queue runnable.
    runnable_at: Option<Instant>,
    /// The stall in force began while LocalDNS was starved.
    stall_starved: bool,
    /// A starved LocalDNS that hangs next, its queues still unread from the starvation.
    starved_then_hung: bool,
    /// The one fault the same process has again and again in this lifecycle, within `RECUR`.
    recurring: Option<Phase>,
    /// The round that ended was MAX_PROOF's worth of answered rounds: a hand-back is due, whatever
    /// the recurrences.
    cap_due: bool,
    /// Observations for the checks.
    not_serving_since: Option<Instant>,
    no_socket_since: Option<Instant>,
    first_unread: Option<Instant>,
    /// The last stall that reading ended: when it began and ended.
    last_stall: Option<(Instant, Instant)>,
    /// LocalDNS read at the last step; the last look's time.
    reading: bool,
    last_look_at: Instant,
    healthy_since: Option<Instant>,
    rest_until: Option<Instant>,
    last_take: Option<Cause>,
    throttled_takes: Vec<Instant>,
    /// Takes since the fault in force began, and that fault.
    episode_takes: u32,
    episode: Phase,
    /// Its sockets had answered LocalDNS's probe when it began.
    episode_served: bool,
    query_every: Option<Duration>,
    next_query: Instant,
    next_change: Instant,
    /// When the addresses deleted while LocalDNS runs come back.
    addresses_back_at: Option<Instant>,
    takes: u32,
    /// The shell cannot see LocalDNS's cgroup (no cgroup mount, another pid namespace).
    blind: bool,
    /// The hang in force is a SIGSTOP (else a blocked reader).
    stopped: bool,
    /// The next look comes after the whole machine paused: every queue as it was.
    paused: bool,
}

impl World {
    fn reads(&self) -> bool {
        match self.phase {
            Phase::Serving | Phase::Mute => true,
            Phase::Hung | Phase::Absent => false,
            Phase::Starting { reads_at } => self.now >= reads_at,
            Phase::Throttled { frozen } => self.in_period() >= frozen,
            Phase::Starved => {
                self.target == Holder::Fallback || self.in_period() < Duration::from_millis(2)
            }
        }
    }

    fn in_period(&self) -> Duration {
        let since = self.now - self.phase_since;
        Duration::from_nanos((since.as_nanos() % THROTTLE_PERIOD.as_nanos()) as u64)
    }

    /// LocalDNS could keep the pods' flows now.
    fn serves(&self) -> bool {
        self.addresses
            && !self.sockets.is_empty()
            && matches!(self.phase, Phase::Serving | Phase::Throttled { .. })
    }

    fn answers_now(&self) -> bool {
        self.serves() && self.reads()
    }

    /// The probe reaches a socket of LocalDNS's (through its link or through lo).
    fn probe_reaches(&self) -> bool {
        (self.addresses || self.on_lo) && !self.sockets.is_empty()
    }

    /// LocalDNS answers its probe now: serving, or starved with the load off it.
    fn answers_probe(&self) -> bool {
        self.probe_reaches()
            && self.reads()
            && matches!(
                self.phase,
                Phase::Serving | Phase::Throttled { .. } | Phase::Starved
            )
    }

    /// The phase's own next instant: a throttled or starved LocalDNS thaws, a starting one reads.
    fn phase_event(&self) -> Option<Instant> {
        let period = |frozen: Duration| {
            let at = self.in_period();
            Some(if at < frozen {
                self.now + (frozen - at)
            } else {
                self.now + (THROTTLE_PERIOD - at)
            })
        };
        match self.phase {
            Phase::Starting { reads_at } if reads_at > self.now => Some(reads_at),
            Phase::Throttled { frozen } => period(frozen),
            Phase::Starved => period(Duration::from_millis(2)),
            _ => None,
        }
    }

    fn new_socket(&mut self) {
        self.next_inode += 1;
        self.sockets.push(Sock {
            inode: self.next_inode,
            unread: 0,
            run: None,
            reported: 0,
            stalled: false,
            reported_since: None,
        });
    }

    /// Who serves changed: keep the observations in step.
    fn observe(&mut self) {
        let serves = self.serves();
        match (serves, self.not_serving_since) {
            (true, Some(_)) => self.not_serving_since = None,
            (false, None) => self.not_serving_since = Some(self.now),
            _ => {}
        }
        let reads = self.reads();
        if !reads && std::mem::replace(&mut self.reading, false) {
            // What the last look saw queued stays there unread, from when that queue began to
            // grow without shrinking.
            for s in &mut self.sockets {
                s.unread = s.reported;
            }
            self.first_unread = self
                .sockets
                .iter()
                .filter(|s| s.reported > 0)
                .map(|s| s.run.map_or(self.last_look_at, |(since, _)| since))
                .min();
            self.stall_starved = self.phase == Phase::Starved;
        }
        if reads {
            self.reading = true;
            if let Some(first) = self.first_unread.take() {
                self.last_stall = Some((first, self.now));
            }
            for s in &mut self.sockets {
                s.unread = 0;
            }
        }
        let healthy = serves && self.phase == Phase::Serving;
        match (healthy, self.healthy_since) {
            (true, None) => self.healthy_since = Some(self.now),
            (false, Some(_)) => self.healthy_since = None,
            _ => {}
        }
    }

    fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
        self.phase_since = self.now;
        self.observe();
    }

    /// A fault begins: takes are counted afresh.
    fn fault(&mut self, phase: Phase) {
        self.episode_takes = 0;
        self.episode = phase;
        self.episode_served = self.view.iter().any(|i| self.view_at_answer.contains(i));
        self.set_phase(phase);
    }

    /// Sockets closing move the last member into the freed index: our steering is stale.
    fn close_sockets(&mut self, keep: usize) {
        if self.sockets.len() > keep {
            self.sockets.truncate(keep);
            self.stale.get_or_insert(self.now);
            if keep == 0 {
                self.no_socket_since = Some(self.now);
                self.tcp_at = None;
            }
        }
    }

    /// The shell's report of where the addresses are (it hears of every change).
    fn report_addresses(&mut self) {
        let a = match (self.addresses, self.on_lo) {
            (true, _) => Addresses::Theirs,
            (false, true) => Addresses::Ours,
            (false, false) => Addresses::Gone,
        };
        self.flows.addresses(self.now, a);
    }

    /// The rounds LocalDNS owes before a hand-back, from what the world saw: the take's cause,
    /// whether a socket it had at the take is still there, and how soon after a hand-back the
    /// take came.
    fn proof(&self) -> u32 {
        let same = self.view.iter().any(|i| self.view_at_take.contains(i));
        let base = match self.last_take {
            Some(Cause::SilentProbe) if same => rounds(SAME_PROOF),
            _ => ROUNDS_TO_ACT,
        };
        (base << self.recurrences.min(8)).min(rounds(MAX_PROOF))
    }

    fn took(&mut self, why: Cause) -> Result<(), String> {
        if let Some(h) = self.healthy_since {
            if self.now - h > GRACE && self.phase == Phase::Serving && self.serves() {
                return Err(format!(
                    "took the flows ({why:?}) from a LocalDNS healthy for {:?}",
                    self.now - h
                ));
            }
        }
        // The take's cause is in what the world did, and no sooner than its bound.
        let justified = match why {
            Cause::SilentProbe => self.silent_in_row >= ROUNDS_TO_ACT,
            Cause::AddressesGone => !self.addresses,
            Cause::Unread => {
                let least = match self.owners_said {
                    Some(Owners::Stopped) => STOPPED_FOR,
                    _ => UNREAD_FOR,
                };
                // A stall that reading ended since the last look still counts: the machine saw
                // the queue only at its looks.
                let stall = match (self.first_unread, self.last_stall) {
                    (Some(first), _) => Some((first, self.now)),
                    (None, Some((first, end))) if self.now - end <= LOOK_BUSY * 3 => {
                        Some((first, end))
                    }
                    _ => None,
                };
                // A starved LocalDNS that reads for 2 ms in 100 may drain a queue between two
                // looks and fill it again: the looks see one stall (and it may hang next).
                let sampled = self.stall_starved;
                // And as the looks reported it: owners found runnable are no hang, and a stall
                // they were found runnable in is timed afresh from then.
                let reported = (self.sockets.iter().filter_map(|s| s.reported_since))
                    .map(|since| self.now - since)
                    .max();
                let timed = self.owners_said != Some(Owners::Runnable)
                    && reported.is_some_and(|r| r >= least);
                timed && stall.is_some_and(|(first, end)| sampled || end - first >= least)
            }
            Cause::LocalDnsFailed | Cause::ByHand => false,
        };
        if !justified {
            return Err(format!(
                "took the flows ({why:?}) without its cause: {} silent rounds in a row, \
                 addresses {}, first unread {:?} ago, reported stalled {:?}, owners {:?}",
                self.silent_in_row,
                self.addresses,
                self.first_unread.map(|f| self.now - f),
                (self.sockets.iter().filter_map(|s| s.reported_since))
                    .map(|since| self.now - since)
                    .max(),
                self.owners_said,
            ));
        }
        let starved = matches!(self.phase, Phase::Throttled { .. } | Phase::Starved);
        if let Phase::Throttled { .. } = self.phase {
            if !self.blind && self.now - self.phase_since > GRACE {
                return Err(format!(
                    "took the flows ({why:?}) from a LocalDNS throttled for {:?}",
                    self.now - self.phase_since
                ));
            }
        }
        if starved {
            if let Some(&last) = self.throttled_takes.last() {
                if last >= self.phase_since && self.now - last < UNREAD_REST && why == Cause::Unread
                {
                    return Err(format!(
                        "starved LocalDNS taken twice by its queues {:?} apart",
                        self.now - last
                    ));
                }
            }
            self.throttled_takes.push(self.now);
        }
        self.episode_takes += 1;
        // A blind shell cannot tell a starved or throttled LocalDNS from a hung one by its
        // queues: it may take once by the queues and once more by the probe, and a throttled
        // one once by the queues every `UNREAD_REST` (checked above).
        // And a LocalDNS starved before its first answer after a restart looks like one starting,
        // which gets the flows back after two rounds: one take more.
        let allowed = match self.episode {
            Phase::Throttled { .. } if self.blind => u32::MAX,
            Phase::Starved if self.blind || !self.episode_served => 2,
            _ => 1,
        };
        if self.episode_takes > allowed {
            return Err(format!(
                "took the flows ({why:?}) {} times in one fault ({:?}; now {:?} for {:?})",
                self.episode_takes,
                self.episode,
                self.phase,
                self.now - self.phase_since
            ));
        }
        let recurs = self.last_hand_back.is_some_and(|at| self.now < at + RECUR)
            && self.last_take == Some(why)
            && self.view.iter().any(|i| self.view_at_hand_back.contains(i));
        self.recurrences = if recurs { self.recurrences + 1 } else { 0 };
        self.target = Holder::Fallback;
        self.stale = None;
        self.strayed = None;
        self.last_take = Some(why);
        self.view_at_take = (self.view.iter().copied())
            .filter(|i| self.view_at_answer.contains(i))
            .collect();
        self.silent_in_row = 0;
        self.answered_since_take = 0;
        self.takes += 1;
        if !self.on_lo {
            self.on_lo = true;
            self.report_addresses();
        }
        Ok(())
    }

    fn handed_back(&mut self) -> Result<(), String> {
        if self.target != Holder::Fallback {
            return Err("handed back flows it did not hold".into());
        }
        if !self.addresses {
            return Err("handed back while LocalDNS's link does not carry the addresses".into());
        }
        if !self.view_complete {
            return Err("handed back to a LocalDNS without a socket in every group".into());
        }
        let proof = self.proof();
        if TRACE.with(|t| *t) {
            eprintln!(
                "hand-back: proof {proof}, view {:?}, at take {:?}, at answer {:?}",
                self.view, self.view_at_take, self.view_at_answer
            );
        }
        if self.answered_since_take < proof {
            return Err(format!(
                "handed back after {} answered rounds ({:?}, proof {proof})",
                self.answered_since_take, self.last_take
            ));
        }
        if self.last_take == Some(Cause::Unread) {
            self.rest_until = Some(self.now + UNREAD_REST);
        }
        self.target = Holder::LocalDns;
        self.stale = None;
        self.strayed = None;
        self.last_hand_back = Some(self.now);
        let same = self.view.iter().any(|i| self.view_at_take.contains(i));
        self.view_at_hand_back = if same { self.view.clone() } else { Vec::new() };
        self.hand_back_due = false;
        self.on_lo = false;
        self.report_addresses();
        Ok(())
    }

    fn carry_out(&mut self) -> Result<(), String> {
        while let Some(out) = self.flows.poll(self.now) {
            if TRACE.with(|t| *t) && !matches!(out, Out::Look { .. }) {
                eprintln!(
                    "{:?} {:?} {out:?} {:?} sockets {} addresses {} lo {} rest {:?}",
                    self.now,
                    self.now - self.phase_since,
                    self.phase,
                    self.sockets.len(),
                    self.addresses,
                    self.on_lo,
                    self.rest_until
                );
            }
            match out {
                Out::Take(why) => self.took(why)?,
                Out::HandBack => self.handed_back()?,
                Out::Repoint => {
                    self.stale = None;
                    self.strayed = None;
                    if self.target == Holder::Fallback && !self.on_lo {
                        self.on_lo = true;
                        self.report_addresses();
                    }
                }
                Out::CheckOwners => {
                    // A process waiting for a CPU is runnable; one reading may be caught asleep
                    // between datagrams; a hung one is stopped (SIGSTOP) or asleep (blocked), a
                    // starting one asleep. A shell that cannot see LocalDNS's cgroup (`blind`)
                    // says asleep.
                    let owners = match self.phase {
                        _ if self.blind => Owners::Asleep,
                        Phase::Throttled { .. } | Phase::Starved => Owners::Runnable,
                        Phase::Serving | Phase::Mute if self.rng.random_bool(0.5) => {
                            Owners::Runnable
                        }
                        Phase::Hung if self.stopped => Owners::Stopped,
                        _ => Owners::Asleep,
                    };
                    self.owners_said = Some(owners);
                    if owners == Owners::Runnable {
                        self.owners_found_runnable();
                    }
                    self.flows.owners(self.now, owners);
                }
                Out::Ask => {
                    // Lost replies come alone: two in a row is a silent LocalDNS. A starved one
                    // under load loses most.
                    let lost = if self.phase == Phase::Starved && self.target == Holder::LocalDns {
                        self.rng.random_bool(0.7)
                    } else {
                        !self.last_lost && self.rng.random_bool(0.05)
                    };
                    self.last_lost = lost;
                    self.probe = Some(Probe {
                        asked: self.now,
                        lost,
                    });
                }
                Out::Look { .. } => {
                    let reads = self.reads();
                    let now = self.now;
                    let paused = std::mem::take(&mut self.paused);
                    let mut view = Vec::new();
                    for s in &mut self.sockets {
                        // A LocalDNS that reads again drains what it left unread first.
                        // After a pause, what is queued counts as queued from now: nothing ran.
                        let queued = if paused {
                            s.run = (s.reported > 0).then_some((now, s.reported));
                            s.reported
                        } else if reads && std::mem::take(&mut s.stalled) {
                            s.run = None;
                            0
                        } else if reads {
                            healthy_noise(&mut self.rng, now, s)
                        } else {
                            s.stalled = true;
                            s.unread
                        };
                        s.reported_since = match queued {
                            0 => None,
                            _ if paused || s.reported == 0 || queued < s.reported => Some(now),
                            _ => s.reported_since.or(Some(now)),
                        };
                        s.reported = queued;
                        view.push(Queue {
                            inode: s.inode,
                            queued,
                        });
                    }
                    self.view = view.iter().map(|q| q.inode).collect();
                    self.last_look_at = now;
                    let complete =
                        !self.sockets.is_empty() && self.tcp_at.is_some_and(|t| now >= t);
                    self.view_complete = complete;
                    if TRACE.with(|t| *t) {
                        eprintln!("{:?} look {view:?}", self.now - self.phase_since);
                    }
                    self.flows.looked(now, &view, complete);
                }
            }
        }
        Ok(())
    }

    fn check(&mut self) -> Result<(), String> {
        // Nothing answers an address that is gone but our own on lo: taken at once.
        if !self.addresses && self.target == Holder::LocalDns {
            return Err("LocalDNS's addresses are gone and its flows not taken".into());
        }
        if !self.addresses && !self.on_lo {
            return Err("the standby holds the flows and the addresses are on no interface".into());
        }
        if std::mem::take(&mut self.take_due) && self.target == Holder::LocalDns {
            return Err(format!(
                "{} silent rounds in a row and the flows not taken",
                self.silent_in_row
            ));
        }
        if std::mem::take(&mut self.cap_due) && self.target == Holder::Fallback {
            return Err(format!(
                "LocalDNS answered {} rounds ({:?}), MAX_PROOF's worth, and the flows not handed \
                 back ({} takes within RECUR of a hand-back in a row)",
                self.answered_since_take, self.last_take, self.recurrences
            ));
        }
        if std::mem::take(&mut self.hand_back_due) && self.target == Holder::Fallback {
            return Err(format!(
                "LocalDNS answered {} rounds ({:?}, proof {}) and the flows not handed back",
                self.answered_since_take,
                self.last_take,
                self.proof()
            ));
        }
        // A LocalDNS with no socket refuses every round at once.
        if let (Holder::LocalDns, Some(since), true) = (
            self.target,
            self.no_socket_since,
            self.sockets.is_empty() && self.addresses,
        ) {
            if self.now - since > REFUSED_BOUND {
                return Err(format!(
                    "LocalDNS has no socket since {:?} and its flows are not taken",
                    self.now - since
                ));
            }
        }
        if let Some(stale) = self.stale {
            let bound = LOOK_EVERY + MS;
            if self.now - stale > bound {
                return Err(format!(
                    "steering stale for {:?} with {:?} holding",
                    self.now - stale,
                    self.target
                ));
            }
        }
        if let Some(at) = self.strayed {
            if self.now - at > STRAY_GAP + MS {
                return Err(format!(
                    "a pod's query reached the standby aside {:?} ago and the steering is stale",
                    self.now - at
                ));
            }
        }
        Ok(())
    }

    /// A new flow: which socket it reaches, and whether that one serves it in time.
    fn query(&mut self) -> Result<(), String> {
        let to_localdns = match (self.target, self.stale.is_some()) {
            (Holder::Fallback, false) | (Holder::LocalDns, true) => false,
            (Holder::Fallback, true) | (Holder::LocalDns, false) => !self.sockets.is_empty(),
        };
        if !to_localdns {
            // It reached one of our relays while we stand aside: the relay tells the standby.
            if self.target == Holder::LocalDns {
                if self.stale.is_some() {
                    self.strayed.get_or_insert(self.now);
                }
                self.flows.stray(self.now);
            }
            return Ok(());
        }
        let i = self.rng.random_range(0..self.sockets.len());
        if !self.reads() {
            self.sockets[i].unread += 100;
            self.first_unread.get_or_insert(self.now);
        }
        // A steering stale while we hold the flows is bounded by `check`.
        if self.answers_now()
            || self.target == Holder::Fallback
            || matches!(self.phase, Phase::Throttled { .. } | Phase::Starved)
        {
            return Ok(());
        }
        let since = self.not_serving_since.unwrap_or(self.now);
        let resting = self.rest_until.is_some_and(|r| self.now < r);
        let (bound, from) = match self.first_unread {
            // A stall that began during a rest is timed from its end.
            Some(first) if !resting && self.addresses => {
                let bound = match self.phase {
                    Phase::Hung if self.stopped && !self.blind => STOPPED_BOUND,
                    _ => QUEUE_BOUND,
                };
                // And one whose owners were found runnable, from then: timed afresh, it is seen
                // already, and taken once `UNREAD_FOR` old.
                let from = self.rest_until.map_or(first, |r| r.max(first));
                match self.runnable_at.filter(|&r| r >= from) {
                    Some(r) => (AFRESH_BOUND, r),
                    None => (bound, from),
                }
            }
            _ => (PROBE_BOUND, since),
        };
        if self.now - from > bound {
            return Err(format!(
                "a flow went to LocalDNS ({:?}) {:?} after it stopped serving (bound {bound:?}; {:?} holds, stale {:?})",
                self.phase,
                self.now - from,
                self.target,
                self.stale.map(|s| self.now - s)
            ));
        }
        Ok(())
    }

    /// The shell was told the owners of its suspect queues are runnable: a stall the looks
    /// reported `UNREAD_FOR` old restarts the clock of every queue stalled `STOPPED_FOR`.
    fn owners_found_runnable(&mut self) {
        let now = self.now;
        let age = |s: &Sock| s.reported_since.map(|since| now - since);
        if self.sockets.iter().any(|s| age(s) >= Some(UNREAD_FOR)) {
            for s in self
                .sockets
                .iter_mut()
                .filter(|s| age(s) >= Some(STOPPED_FOR))
            {
                s.reported_since = Some(now);
            }
        }
        self.runnable_at = self.first_unread.map(|_| now);
    }

    fn probe_event(&self) -> Option<Instant> {
        self.probe.as_ref().map(|p| {
            if self.now < p.asked + MS {
                p.asked + MS
            } else {
                p.asked + WAIT
            }
        })
    }

    fn settle_probe(&mut self) {
        let Some(p) = &self.probe else { return };
        let refused = !self.probe_reaches();
        let answered = !p.lost && self.now >= p.asked + MS && self.answers_probe();
        if refused || answered || self.now >= p.asked + WAIT {
            self.probe = None;
            if answered {
                self.silent_in_row = 0;
                self.answered_since_take += 1;
                self.view_at_answer = self.view.clone();
            } else {
                self.silent_in_row += 1;
                if self.silent_in_row >= ROUNDS_TO_ACT {
                    self.answered_since_take = 0;
                }
            }
            self.take_due = self.target == Holder::LocalDns && self.silent_in_row >= ROUNDS_TO_ACT;
            let ready =
                self.target == Holder::Fallback && answered && self.addresses && self.view_complete;
            self.hand_back_due = ready && self.answered_since_take >= self.proof();
            // Counted without the recurrences: however often the fault came back.
            self.cap_due = ready && self.answered_since_take >= rounds(MAX_PROOF);
            self.flows.asked(self.now, answered);
        }
    }

    /// The standby itself restarts: a new process asks before it binds.
    fn restart_standby(&mut self) {
        let serves = self.answers_now();
        self.flows = Flows::new(self.now, (!serves).then_some(Cause::SilentProbe));
        // Its take, if it makes one, is carried out as any other.
        self.target = Holder::LocalDns;
        self.stale = None;
        self.strayed = None;
        self.probe = None;
        // Its two rounds at the start went unanswered if it takes.
        self.silent_in_row = if serves { 0 } else { ROUNDS_TO_ACT };
        self.answered_since_take = 0;
        self.view.clear();
        self.view_at_take.clear();
        self.view_at_answer.clear();
        self.view_at_hand_back.clear();
        self.rest_until = None;
        self.last_take = None;
        self.last_hand_back = None;
        self.recurrences = 0;
        self.throttled_takes.clear();
        // The last one's addresses on lo were taken off by its unit's stop.
        self.on_lo = false;
        self.report_addresses();
    }

    /// The next thing that happens to LocalDNS.
    fn change(&mut self) {
        let r: f64 = self.rng.random();
        let d =
            |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..hi));
        if let Some(at) = self.addresses_back_at {
            if self.now >= at {
                // LocalDNS's link carries its addresses again.
                self.addresses_back_at = None;
                self.addresses = true;
                self.observe();
                self.report_addresses();
                self.next_change = self.now + d(&mut self.rng, 50, 3000);
                return;
            }
        }
        if let Some(again) = self.recurring {
            // The same process fails again soon after each hand-back, and nothing else happens.
            let (lo, hi) = match self.phase {
                Phase::Serving if self.target == Holder::LocalDns => {
                    self.stopped = self.rng.random_bool(0.5);
                    self.fault(again);
                    (200, 2000)
                }
                Phase::Serving => (500, 5000),
                _ => {
                    self.set_phase(Phase::Serving);
                    (500, 5000)
                }
            };
            self.next_change = self.now + d(&mut self.rng, lo, hi);
            return;
        }
        match self.phase {
            _ if self.addresses_back_at.is_some() => {
                self.next_change = self.addresses_back_at.unwrap_or(self.now);
                return;
            }
            Phase::Serving if r < 0.17 => {
                self.stopped = self.rng.random_bool(0.5);
                self.fault(Phase::Hung)
            }
            Phase::Serving if r < 0.27 => {
                self.close_sockets(0);
                self.episode_takes = 0;
                if self.rng.random_bool(0.5) {
                    self.addresses = false;
                    self.report_addresses();
                }
                self.fault(Phase::Absent);
            }
            Phase::Serving if r < 0.35 => {
                // A quick restart: new sockets at once.
                let n = self.sockets.len().max(1);
                self.close_sockets(0);
                for _ in 0..n {
                    self.new_socket();
                }
                self.tcp_at = Some(self.now);
                self.observe();
            }
            Phase::Serving if r < 0.39 => self.fault(Phase::Mute),
            Phase::Serving if r < 0.45 => {
                let frozen = d(&mut self.rng, 10, 80);
                self.fault(Phase::Throttled { frozen });
                self.next_change = self.now + d(&mut self.rng, 2000, 25000);
                return;
            }
            Phase::Serving if r < 0.51 => {
                // Starved for less than the proof a silent LocalDNS owes (see `SAME_PROOF`); or
                // briefly, and then it hangs with what the starvation left queued.
                self.fault(Phase::Starved);
                self.starved_then_hung = self.rng.random_bool(0.4);
                self.next_change = self.now
                    + match self.starved_then_hung {
                        true => d(&mut self.rng, 40, 600),
                        false => d(&mut self.rng, 2000, 9000),
                    };
                return;
            }
            Phase::Serving if r < 0.57 => {
                // LocalDNS's link loses its addresses (deleted by hand, or an orphaned CoreDNS
                // still running while its script recreates the link); LocalDNS runs on.
                self.episode_takes = 0;
                self.episode = Phase::Serving;
                self.addresses = false;
                self.observe();
                self.report_addresses();
                let back = self.now + d(&mut self.rng, 600, 3000);
                self.addresses_back_at = Some(back);
                self.next_change = back;
                return;
            }
            Phase::Serving if r < 0.61 && self.target == Holder::Fallback && self.on_lo => {
                // Someone takes the standby's addresses off lo while it holds the flows.
                self.on_lo = false;
                self.report_addresses();
            }
            Phase::Serving if r < 0.67 => {
                if self.sockets.len() > 1 && self.rng.random_bool(0.5) {
                    let keep = self.sockets.len() - 1;
                    self.close_sockets(keep);
                } else {
                    self.new_socket();
                    self.tcp_at.get_or_insert(self.now);
                }
                self.observe();
            }
            Phase::Serving if r < 0.71 => self.restart_standby(),
            Phase::Serving => {
                self.query_every = (!self.rng.random_bool(0.2))
                    .then(|| Duration::from_micros(self.rng.random_range(1000..20000)));
            }
            Phase::Absent => {
                // LocalDNS's script recreates its link, then CoreDNS binds; slow start-ups too.
                if !self.addresses {
                    self.addresses = true;
                    self.report_addresses();
                }
                let n = self.rng.random_range(1..=4);
                for _ in 0..n {
                    self.new_socket();
                }
                let slow = if self.rng.random_bool(0.2) { 2000 } else { 20 };
                let reads_at = self.now + d(&mut self.rng, 0, slow);
                self.tcp_at = Some(reads_at + d(&mut self.rng, 0, 400));
                self.set_phase(Phase::Starting { reads_at });
            }
            Phase::Starved if std::mem::take(&mut self.starved_then_hung) => {
                self.stopped = self.rng.random_bool(0.3);
                self.fault(Phase::Hung);
                // Starved, it answered some rounds: the probe's bound runs from the hang. And its
                // last read may have come between two looks: they see one stall across it.
                self.not_serving_since = Some(self.now);
                self.stall_starved = true;
            }
            Phase::Starting { .. } if r < 0.3 => {
                // A crash storm: it dies again while starting.
                self.close_sockets(0);
                self.fault(Phase::Absent);
            }
            Phase::Hung
            | Phase::Mute
            | Phase::Throttled { .. }
            | Phase::Starved
            | Phase::Starting { .. } => self.set_phase(Phase::Serving),
        }
        let (lo, hi) = match self.phase {
            Phase::Serving => (50, 3000),
            Phase::Hung => (10, 3000),
            Phase::Absent => (0, 3000),
            _ => (200, 2000),
        };
        self.next_change = self.now + d(&mut self.rng, lo, hi);
    }
}

/// Probe rounds in `d`.
fn rounds(d: Duration) -> u32 {
    d.as_millis().div_ceil(PROBE_EVERY.as_millis()) as u32
}

/// What a healthy socket's queue reads: often empty, now and then a few datagrams, never
/// growing for longer than `HEALTHY_RUN`.
fn healthy_noise(rng: &mut StdRng, now: Instant, s: &mut Sock) -> u32 {
    let q = if rng.random_bool(0.7) {
        0
    } else {
        rng.random_range(1..3000)
    };
    let q = match s.run {
        Some((since, last)) if q >= last && now - since >= HEALTHY_RUN => 0,
        _ => q,
    };
    s.run = match s.run {
        _ if q == 0 => None,
        Some((since, last)) if q >= last => Some((since, q)),
        _ => Some((now, q)),
    };
    q
}

thread_local!(static TRACE: bool = std::env::var_os("FLOWS_TRACE").is_some());

const LIFETIME: Duration = Duration::from_secs(40);
/// A recurring fault's lifecycle: long enough for the proof to reach its cap.
const RECURRING_LIFETIME: Duration = Duration::from_secs(120);

fn lifecycle(seed: u64) -> Result<u32, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let recurring = rng.random_bool(0.1).then(|| match rng.random_bool(0.6) {
        true => Phase::Mute,
        false => Phase::Hung,
    });
    let serving_at_start = recurring.is_some() || rng.random_bool(0.7);
    let mut w = World {
        now: start,
        flows: Flows::new(start, (!serving_at_start).then_some(Cause::SilentProbe)),
        phase: if serving_at_start {
            Phase::Serving
        } else {
            Phase::Absent
        },
        phase_since: start,
        sockets: Vec::new(),
        next_inode: 0,
        addresses: true,
        on_lo: false,
        target: Holder::LocalDns,
        stale: None,
        strayed: None,
        probe: None,
        last_lost: false,
        silent_in_row: if serving_at_start { 0 } else { ROUNDS_TO_ACT },
        answered_since_take: 0,
        take_due: false,
        hand_back_due: false,
        tcp_at: Some(start),
        view: Vec::new(),
        view_complete: false,
        view_at_take: Vec::new(),
        view_at_hand_back: Vec::new(),
        view_at_answer: Vec::new(),
        last_hand_back: None,
        recurrences: 0,
        owners_said: None,
        runnable_at: None,
        stall_starved: false,
        starved_then_hung: false,
        recurring,
        cap_due: false,
        not_serving_since: None,
        no_socket_since: None,
        first_unread: None,
        last_stall: None,
        reading: true,
        last_look_at: start,
        healthy_since: None,
        rest_until: None,
        last_take: None,
        throttled_takes: Vec::new(),
        episode_takes: 0,
        episode: Phase::Serving,
        episode_served: true,
        query_every: Some(Duration::from_millis(rng.random_range(1..20))),
        next_query: start,
        next_change: start + Duration::from_millis(rng.random_range(50..3000)),
        addresses_back_at: None,
        takes: 0,
        blind: rng.random_bool(0.3),
        stopped: false,
        paused: false,
        rng,
    };
    if !serving_at_start {
        w.tcp_at = None;
    }
    if serving_at_start {
        let n = w.rng.random_range(1..=4);
        for _ in 0..n {
            w.new_socket();
        }
    }
    w.report_addresses();
    w.observe();
    let end = start + recurring.map_or(LIFETIME, |_| RECURRING_LIFETIME);
    while w.now < end {
        w.carry_out()?;
        w.check()?;
        let deadline = w.flows.deadline();
        let mut next = deadline.min(w.next_change).min(end);
        if w.query_every.is_some() {
            next = next.min(w.next_query);
        }
        for at in [w.probe_event(), w.phase_event()].into_iter().flatten() {
            next = next.min(at);
        }
        if next <= w.now {
            next = w.now + Duration::from_micros(100);
        }
        // Now and then the whole machine pauses (a VM's CPUs stopped by its host's quota) at a
        // look of the standby beside a LocalDNS that serves: nothing runs, nothing queues.
        let pause = next == deadline
            && w.probe.is_none()
            && w.target == Holder::LocalDns
            && w.phase == Phase::Serving
            && w.stale.is_none()
            && w.rng.random_bool(0.02);
        if pause {
            let by = Duration::from_millis(w.rng.random_range(15..60));
            next += by;
            w.paused = true;
            w.next_query = w.next_query.max(next);
            w.next_change = w.next_change.max(next);
        }
        w.now = next;
        w.observe();
        w.settle_probe();
        // The shell carries out what a round decided before it reads anything else.
        w.carry_out()?;
        if let Some(every) = w.query_every {
            if w.now >= w.next_query {
                w.next_query = w.now + every;
                w.query()?;
            }
        }
        if w.now >= w.next_change {
            w.change();
        }
    }
    Ok(w.takes)
}

#[test]
fn seeded_lifecycles_keep_flows_on_a_responder_that_serves() {
    let seeds: Vec<u64> = match std::env::var("FLOWS_SEED") {
        Ok(s) => vec![s.parse().expect("FLOWS_SEED is a number")],
        Err(_) => {
            let n =
                std::env::var("FLOWS_LIFECYCLES").map_or(1000, |n| n.parse().expect("a number"));
            (0..n).collect()
        }
    };
    let mut takes = 0;
    let failed: Vec<String> = seeds
        .iter()
        .filter_map(|&seed| match lifecycle(seed) {
            Ok(t) => {
                takes += t;
                None
            }
            Err(e) => Some(format!("seed {seed}: {e} (replay: FLOWS_SEED={seed})")),
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} lifecycles failed; first: {}",
        failed.len(),
        seeds.len(),
        failed.first().map_or("", |s| s.as_str())
    );
    // Liveness has to have been exercised, not only safety.
    assert!(takes as usize > seeds.len(), "only {takes} takes");
}

/// Drives `f` from `start` as the shell would, each look seeing one socket with `queued(look)`
/// queued and each owners check answered with `owners(check)`, each wake `late` past its
/// deadline; returns how long after `start` the flows were taken, if within `until`.
fn drive(
    f: &mut Flows,
    start: Instant,
    until: Duration,
    late: Duration,
    mut queued: impl FnMut(u32) -> u32,
    owners: impl Fn(usize) -> Owners,
) -> Option<Duration> {
    let (mut t, mut looks, mut checks) = (start, 0, 0);
    while t - start <= until {
        while let Some(o) = f.poll(t) {
            match o {
                Out::Look { .. } => {
                    let q = [Queue {
                        inode: 7,
                        queued: queued(looks),
                    }];
                    looks += 1;
                    f.looked(t, &q, true);
                }
                Out::CheckOwners => {
                    f.owners(t, owners(checks));
                    checks += 1;
                }
                Out::Take(_) => return Some(t - start),
                _ => {}
            }
        }
        t = f.deadline() + late;
    }
    None
}

#[test]
fn a_socket_left_unread_is_taken_from_within_the_bound_and_a_draining_one_never() {
    let t0 = Instant::now();
    let long = Duration::from_secs(5);
    // Draining: grows for two looks, then shrinks; over and over.
    let saw = |look: u32| [0, 100, 200, 50][look as usize % 4];
    let mut f = Flows::new(t0, None);
    let taken = drive(&mut f, t0, long, Duration::ZERO, saw, |_| Owners::Asleep);
    assert_eq!(taken, None);
    // Unread: it only grows. A runnable owner (throttled) has it timed afresh; an asleep one is
    // taken from after `UNREAD_FOR`, a stopped one at once. The first unread query waits at most
    // a look to be seen.
    let runnable_then_asleep = [
        Owners::Runnable,
        Owners::Runnable,
        Owners::Asleep,
        Owners::Asleep,
    ];
    for (answers, within) in [
        (
            runnable_then_asleep,
            LOOK_EVERY + 2 * UNREAD_FOR + 2 * STOPPED_FOR,
        ),
        (
            [Owners::Stopped; 4],
            LOOK_EVERY + STOPPED_FOR + 3 * LOOK_BUSY,
        ),
    ] {
        let mut f = Flows::new(t0, None);
        // Empty at the first look, unread from just after it.
        let grows = |look: u32| 100 * look;
        let owners = |n: usize| answers[n.min(3)];
        let taken = drive(&mut f, t0, long, Duration::ZERO, grows, owners);
        assert!(taken.is_some_and(|t| t <= within), "{answers:?}: {taken:?}");
    }
    // The standby paused as long as LocalDNS (every wake 29 ms late: a VM's CPUs stopped by
    // their host's quota): not taken by the queue, however long it lasts.
    let mut f = Flows::new(t0, None);
    let late = Duration::from_millis(29);
    let taken = drive(&mut f, t0, long, late, |_| 832, |_| Owners::Asleep);
    assert_eq!(taken, None, "a pause of the whole machine taken for a hang");
}

#[test]
fn a_pods_query_that_reaches_the_standby_aside_brings_a_look_at_once_but_one_per_gap() {
    let t0 = Instant::now();
    let mut f = Flows::new(t0, None);
    let q = [Queue {
        inode: 7,
        queued: 0,
    }];
    while let Some(o) = f.poll(t0) {
        if let Out::Look { .. } = o {
            f.looked(t0, &q, true);
        }
    }
    let t = t0 + STRAY_GAP;
    f.stray(t);
    assert_eq!(f.deadline(), t);
    assert!(matches!(f.poll(t), Some(Out::Look { .. })));
    f.looked(t, &q, true);
    f.stray(t + MS);
    assert!(f.deadline() >= t + STRAY_GAP, "{:?}", f.deadline() - t);
    // Not while the standby holds the flows: the query is ours to answer.
    let mut f = Flows::new(t0, Some(Cause::SilentProbe));
    while f.poll(t0).is_some() {}
    let next = f.deadline();
    f.stray(t0 + STRAY_GAP);
    assert_eq!(f.deadline(), next);
}

/// The look a stray brings reads each group whole (the steering points wrong, so what the last
/// dump found may be stale), and only that look; while the standby holds the flows, every look
/// does (our index must follow the members).
#[test]
fn a_stray_makes_its_one_look_a_dump_and_holding_makes_every_look_one() {
    let t0 = Instant::now();
    let q = [Queue {
        inode: 7,
        queued: 0,
    }];
    let dumps = |f: &mut Flows, t: Instant| {
        let mut seen = Vec::new();
        while let Some(o) = f.poll(t) {
            if let Out::Look { dump, .. } = o {
                seen.push(dump);
                f.looked(t, &q, true);
            }
        }
        seen
    };
    let mut f = Flows::new(t0, None);
    assert_eq!(dumps(&mut f, t0), [false]);
    let t = t0 + STRAY_GAP;
    f.stray(t);
    assert_eq!(dumps(&mut f, t), [true]);
    assert_eq!(dumps(&mut f, t + LOOK_EVERY), [false]);
    let mut f = Flows::new(t0, Some(Cause::SilentProbe));
    assert_eq!(dumps(&mut f, t0), [true]);
    assert_eq!(dumps(&mut f, t0 + LOOK_EVERY), [true]);
}

/// Rounds a LocalDNS that never answers is asked before the take, the wait of round `i` running
/// out `late[i]` past its end (the last entry repeats).
fn rounds_to_take(late: &[Duration]) -> usize {
    let t0 = Instant::now();
    let mut f = Flows::new(t0, None);
    let (mut t, mut rounds) = (t0, 0);
    for _ in 0..1000 {
        while let Some(o) = f.poll(t) {
            match o {
                Out::Ask => {
                    let l = late[rounds.min(late.len() - 1)];
                    rounds += 1;
                    t += WAIT + l;
                    f.timed_out(t, l);
                }
                Out::Look { .. } => f.looked(t, &[], true),
                Out::Take(why) => {
                    assert_eq!(why, Cause::SilentProbe);
                    return rounds;
                }
                _ => {}
            }
        }
        t = t.max(f.deadline());
    }
    panic!("a LocalDNS silent to {} rounds not taken", rounds);
}

#[test]
fn a_silent_round_judged_late_is_asked_again_once_and_the_take_stays_bounded() {
    let (on_time, late) = (Duration::from_millis(9), Duration::from_millis(50));
    assert_eq!(rounds_to_take(&[Duration::ZERO]), 2);
    assert_eq!(rounds_to_take(&[on_time]), 2);
    // The machine stopped at the first round's end: that round proves nothing.
    assert_eq!(rounds_to_take(&[late, Duration::ZERO]), 3);
    // Stopped at every round's end: each other one counts, so a LocalDNS silent on a machine
    // that keeps stopping is still taken, at twice the rounds.
    assert_eq!(rounds_to_take(&[late]), 2 * ROUNDS_TO_ACT as usize);
}

mod bounds;
