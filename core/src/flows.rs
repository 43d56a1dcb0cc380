//! Who holds LocalDNS's new flows, LocalDNS or the standby beside it, decided in one place.
//!
//! The standby's shell feeds in what it saw (a probe round answered or silent, the kernel's view
//! of the listeners' groups, the listener addresses gone) with the time, and carries out what comes back: [`Out::Take`],
//! [`Out::HandBack`], [`Out::Repoint`], and the two things it must do when due, [`Out::Ask`] (a
//! probe round) and [`Out::Look`] (a sock_diag dump). [`Flows::deadline`] says when to come
//! back. Pure: no socket, no clock.
//!
//! Two detectors take the flows from a LocalDNS that stops serving. The kernel's view is the
//! fast one: a LocalDNS that stops reading (SIGSTOP, a deadlock, a frozen cgroup) leaves what
//! reaches its sockets queued there, and a socket whose queue stays non-empty and never shrinks
//! for [`UNREAD_FOR`] is not being read; unless the process holding it is runnable (it waits for
//! a CPU: starved, or throttled by its slice's quota), which the shell is asked before a take. The probe (two silent rounds) catches the rest: a quiet
//! node where nothing queues, and a LocalDNS that reads but does not answer.
//!
//! The flows go back only to a LocalDNS that can keep them: its addresses on a link of its own
//! (not only on lo, where the standby put them), a socket of its in every group, and its probe
//! answered for its proof: two rounds for a LocalDNS that restarted, was stopped or lost its
//! addresses; [`SAME_PROOF`] for a process that served and then went silent to its probe (mute or
//! starved: it answers its probe well once the pods' load is off it); twice as long each time the
//! process the flows were handed back to fails again the same way within [`RECUR`], up to
//! [`MAX_PROOF`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How often the probe is asked. Two silent rounds take the flows within half a second.
pub const PROBE_EVERY: Duration = Duration::from_millis(120);
/// Rounds in a row that decide: two silent ones take the flows (one lost reply under load moves
/// nothing); two answered ones are the least proof that gives them back.
pub const ROUNDS_TO_ACT: u32 = 2;
/// How often the kernel's view is read while LocalDNS holds the flows and its queues were empty
/// at the last look: a query left unread is seen at most this late. Each look wakes the standby
/// (about 60 µs of CPU on a 2-core VM whose CPUs sleep between wakes) and reads one socket per
/// group (about 55 µs more, cold), so this sets what the standby costs beside a serving
/// LocalDNS (0.45 % of a core at 30 ms; 1.7 % at 10 ms with whole-table dumps). 30 ms is the
/// most that pods asking every 20 ms allow for a stopped LocalDNS to cost at most two of their
/// queries (seen within 30 ms of the first unread one, taken [`STOPPED_FOR`] and a busy look
/// later, before the third). While we hold the flows it is read as often, to follow the groups'
/// members: a LocalDNS that dies or restarts moves our index, and a steering left pointing at
/// the old one sends a listener's new flows to a socket that does not answer.
pub const LOOK_EVERY: Duration = Duration::from_millis(30);
/// A probe round due this soon after a look starts with it: one wake for both (the probe's
/// period is four looks).
const ASK_WITH_LOOK: Duration = Duration::from_millis(5);
/// How often it is read while a queue is not empty: often enough to see a queue that is read
/// shrink. A LocalDNS at its maximum rate keeps its queues non-empty, and the kernel frees their
/// memory in batches, so a queue that is read rises and falls in a saw of a few milliseconds; a
/// fixed period can alias with it into a queue that looks as if it only rose (it did, at 5 ms).
/// So the period varies, 1 to 3 ms, with what was queued.
pub const LOOK_BUSY: Duration = Duration::from_millis(1);
/// A LocalDNS socket whose queue has been non-empty and not shrinking this long is not read,
/// unless its process waits for a CPU. `tests/unread.rs` measures a healthy one, read every
/// millisecond: at most 5 ms in bursts of 2,000 queries, 12 ms at its maximum rate with 4
/// sockets a listener; with 1 socket at 280,000 queries/s, starved by its load generator on a
/// shared two-core machine, 36 ms, found runnable and left be.
/// A queue unshrinking this long has its owners asked whether they are stopped (SIGSTOP: not
/// reading, whatever else); a stopped LocalDNS is taken from then, not [`UNREAD_FOR`] later.
pub const STOPPED_FOR: Duration = Duration::from_millis(4);
/// One idle look in this many reads the TCP listeners too (half a look's cost): a TCP client
/// waits for a LocalDNS that stopped reading at most this many looks longer to be noticed.
const TCP_EVERY_LOOKS: u32 = 5;
pub const UNREAD_FOR: Duration = Duration::from_millis(30);
/// A look this much later than it was due says the standby itself was not running: the machine
/// paused (a VM's CPU quota at its host stops every CPU for tens of milliseconds at a time) or
/// starved it. LocalDNS was stopped as long, so that time is no evidence of a hang: a stall is
/// timed afresh from such a look (seen on this VM: 29 ms pauses every 100 ms under a parallel
/// build, each taken for an unread queue before this), and such a probe round asked again.
pub const LATE: Duration = Duration::from_millis(10);
/// The least time between two looks for pods' queries that reached the standby (see
/// [`Flows::stray`]): a steering that cannot be mended costs at most 100 dumps a second.
pub const STRAY_GAP: Duration = Duration::from_millis(10);
/// After handing back flows the queues took, the queues take nothing for this long (the probe
/// still does): a LocalDNS that its CPU quota freezes for tens of milliseconds at a time looks
/// hung to the queues and well to the probe, and would otherwise change hands every half second.
pub const UNREAD_REST: Duration = Duration::from_secs(10);
/// How long the same LocalDNS process that the probe found silent must answer every round before
/// it gets the flows back. A LocalDNS starved of CPU (its slice's quota) fails under the pods'
/// load and answers its probe well as soon as the standby holds the flows, so two rounds would
/// hand them back into the same starvation (once a second in a 6 s squeeze). Starvations last
/// seconds; this outlasts the ones seen.
pub const SAME_PROOF: Duration = Duration::from_secs(10);
/// A take this soon after a hand-back, for the same cause and from the process the flows were
/// handed to, is the same fault coming back: the next proof is doubled. A LocalDNS that restarted
/// since starts afresh (each crash of a crash storm is a fault of its own), and so does another
/// cause (a restart of LocalDNS, then a hang of the new process, are two faults).
pub const RECUR: Duration = Duration::from_secs(60);
/// The longest proof, however often the fault came back: a recovered LocalDNS gets its flows
/// back within this.
pub const MAX_PROOF: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    LocalDns,
    Fallback,
}

/// Cause the flows are ours: the one list that the log, `/metrics` (its `cause` label) and
/// `status` all read. In declaration order: a cause's index in [`Cause::ALL`] is `cause as usize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Started by systemd for a LocalDNS that failed (`OnFailure=`).
    LocalDnsFailed,
    /// The listener addresses went with LocalDNS's link.
    AddressesGone,
    /// Two probe rounds in a row went unanswered (so did the two a standby asks at its start).
    SilentProbe,
    /// A LocalDNS socket left its queue unread for [`UNREAD_FOR`].
    Unread,
    /// Started by neither: an operator, a test.
    ByHand,
}

impl Cause {
    pub const ALL: [Cause; 5] = [
        Cause::LocalDnsFailed,
        Cause::AddressesGone,
        Cause::SilentProbe,
        Cause::Unread,
        Cause::ByHand,
    ];

    /// The `cause` label of the takeover metrics.
    pub fn label(self) -> &'static str {
        match self {
            Cause::LocalDnsFailed => "localdns_failed",
            Cause::AddressesGone => "addresses_gone",
            Cause::SilentProbe => "silent_probe",
            Cause::Unread => "unread_queries",
            Cause::ByHand => "by_hand",
        }
    }

    /// What happened, in the words of the log and of `status`.
    pub fn sentence(self) -> &'static str {
        match self {
            Cause::LocalDnsFailed => "LocalDNS failed",
            Cause::AddressesGone => "LocalDNS's addresses went away",
            Cause::SilentProbe => "LocalDNS's probe went unanswered",
            Cause::Unread => "LocalDNS left queries unread in its sockets",
            Cause::ByHand => "it was started by hand",
        }
    }
}

/// Where the listener addresses are, as the shell last found them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addresses {
    /// On LocalDNS's link, or on lo where the standby did not put them.
    Theirs,
    /// Only on lo, where the standby put them: LocalDNS answers through them while its own link
    /// has none, and would lose them again at a hand-back.
    Ours,
    /// On no interface.
    Gone,
}

/// What the shell does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    /// New flows to us, the listener addresses on lo.
    Take(Cause),
    /// New flows to LocalDNS, the addresses off lo.
    HandBack,
    /// The steering afresh for the same holder, from the groups as they are now (a member that
    /// left moved the indices: a look finds it within `LOOK_EVERY`, so client queries that reach
    /// us need not tell), and the addresses back on lo if we hold the flows.
    Repoint,
    /// Start a probe round; report it with [`Flows::asked`].
    Ask,
    /// What are the processes that hold the sockets of [`Flows::suspects`] doing? Report it
    /// with [`Flows::owners`].
    CheckOwners,
    /// Read the kernel's view now; report it with [`Flows::looked`]. The TCP listeners' accept
    /// queues only when `tcp` (an idle look reads UDP alone, and takes the TCP members as they
    /// were, with nothing waiting): every look while a queue is busy, else every
    /// `TCP_EVERY_LOOKS`th. Each group's members dumped afresh when `dump` (while we hold the
    /// flows our index must follow them, and a stray says the steering is wrong), else each
    /// member read by its port.
    Look { tcp: bool, dump: bool },
}

/// What the threads of the processes holding LocalDNS's suspect sockets are doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owners {
    /// A thread running or waiting for a CPU (state R), or for the machine (D).
    Runnable,
    /// Every thread stopped (state T: SIGSTOP).
    Stopped,
    /// Asleep, blocked or frozen; or not known.
    Asleep,
}

/// One of LocalDNS's sockets (a member of a listener's group that is not ours).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queue {
    pub inode: u64,
    /// Bytes unread (UDP) or connections not accepted (TCP).
    pub queued: u32,
}

/// A stall being timed: a socket whose queue was non-empty and not shrinking since `since`.
#[derive(Clone, Copy, Debug)]
struct Watched {
    inode: u64,
    queued: u32,
    since: Option<Instant>,
    /// Its owners were found not stopped once in this stall, before [`UNREAD_FOR`].
    asked_early: bool,
}

#[derive(Debug)]
pub struct Flows {
    holder: Holder,
    silent: u32,
    answered: u32,
    asking: bool,
    /// The last round timed out late and was asked again (see [`Flows::timed_out`]).
    late_round: bool,
    next_ask: Instant,
    next_look: Instant,
    /// LocalDNS's sockets at the last look, by inode.
    watched: Vec<Watched>,
    /// LocalDNS has a socket in every group: there is someone to hand the flows to.
    complete: bool,
    looked_once: bool,
    last_look: Instant,
    /// When the look under way was due.
    look_due: Instant,
    looks: u32,
    /// A pod's query reached us since the last look (see [`Flows::stray`]).
    strayed: bool,
    unread_rests_until: Option<Instant>,
    addresses: Addresses,
    /// LocalDNS's sockets at its last answered round.
    served_from: Vec<u64>,
    /// Those of them still there when the flows were taken: one still there at the hand-back is
    /// the same process, which served and failed (a LocalDNS that restarted and has not answered
    /// yet is a new one, starting).
    taken_from: Vec<u64>,
    handed_back_at: Option<Instant>,
    /// LocalDNS's sockets when the flows were handed back to the process they were taken from,
    /// and why they were last taken (while we hold them: why we hold them).
    handed_to: Vec<u64>,
    last_cause: Option<Cause>,
    /// Takes in a row that each came within [`RECUR`] of a hand-back to the same process.
    recurrences: u32,
    out: VecDeque<Out>,
}

impl Flows {
    /// A daemon starting at `now`: beside a LocalDNS that answered (`None`: its listeners were
    /// bound with the flows on LocalDNS's sockets), or taking them at once for `cause`.
    pub fn new(now: Instant, taken: Option<Cause>) -> Flows {
        let mut f = Flows {
            holder: Holder::LocalDns,
            silent: 0,
            answered: 0,
            asking: false,
            late_round: false,
            next_ask: now,
            next_look: now,
            watched: Vec::new(),
            complete: false,
            looked_once: false,
            last_look: now,
            look_due: now,
            looks: 0,
            strayed: false,
            unread_rests_until: None,
            addresses: Addresses::Theirs,
            served_from: Vec::new(),
            taken_from: Vec::new(),
            handed_back_at: None,
            handed_to: Vec::new(),
            last_cause: None,
            recurrences: 0,
            out: VecDeque::new(),
        };
        if let Some(cause) = taken {
            f.take(now, cause);
        }
        f
    }

    pub fn holder(&self) -> Holder {
        self.holder
    }

    /// When to call [`Flows::poll`] again at the latest.
    pub fn deadline(&self) -> Instant {
        if self.asking {
            self.next_look
        } else {
            self.next_look.min(self.next_ask)
        }
    }

    /// The next thing to do at `now`, if any.
    pub fn poll(&mut self, now: Instant) -> Option<Out> {
        if let Some(out) = self.out.pop_front() {
            return Some(out);
        }
        let look = now >= self.next_look;
        if !self.asking && (now >= self.next_ask || look && now + ASK_WITH_LOOK >= self.next_ask) {
            self.asking = true;
            self.next_ask = now + PROBE_EVERY;
            return Some(Out::Ask);
        }
        if look {
            self.look_due = self.next_look;
            let busy = self.watched.iter().any(|w| w.queued > 0);
            // Idle looks keep to a grid, not to when the last one ran, so that a wake late by
            // its scheduling does not drift them away from the probe's rounds. A look that finds
            // a queue brings the next one sooner (`looked`).
            self.next_look = if self.next_look + LOOK_EVERY > now {
                self.next_look + LOOK_EVERY
            } else {
                now + LOOK_EVERY
            };
            self.looks = self.looks.wrapping_add(1);
            let tcp = busy || self.looks % TCP_EVERY_LOOKS == 1;
            let dump = self.holder == Holder::Fallback || std::mem::take(&mut self.strayed);
            return Some(Out::Look { tcp, dump });
        }
        None
    }

    /// A probe round ended at `now`: LocalDNS answered on both listeners, or not.
    pub fn asked(&mut self, now: Instant, answered: bool) {
        self.asking = false;
        self.late_round = false;
        if answered {
            self.silent = 0;
            self.answered += 1;
            self.served_from = self.watched.iter().map(|w| w.inode).collect();
            self.hand_back_if_proven(now);
            return;
        }
        self.silent += 1;
        // One lost reply neither counts nor undoes a proof; two silent rounds in a row (what
        // takes the flows) do.
        if self.silent >= ROUNDS_TO_ACT {
            self.answered = 0;
        }
        match self.holder {
            Holder::LocalDns if self.silent >= ROUNDS_TO_ACT => self.take(now, Cause::SilentProbe),
            // Asked again at once: a round refused (nothing bound: ICMP port unreachable) ends
            // in well under a millisecond, and the take is then due as soon.
            Holder::LocalDns => self.next_ask = now,
            Holder::Fallback => {}
        }
    }

    /// A probe round's wait ran out at `now`, `late` after it was due. A standby that did not
    /// run at the round's end tells that the machine stopped (see [`LATE`]), LocalDNS with it:
    /// that round is asked again rather than counted silent, once in a row.
    pub fn timed_out(&mut self, now: Instant, late: Duration) {
        if late <= LATE || std::mem::replace(&mut self.late_round, true) {
            return self.asked(now, false);
        }
        (self.asking, self.next_ask) = (false, now);
    }

    /// A socket the flows were taken from is still LocalDNS's: the same process.
    fn same_process(&self) -> bool {
        self.watched
            .iter()
            .any(|w| self.taken_from.contains(&w.inode))
    }

    /// Answered rounds LocalDNS owes before the flows go back (see the module's doc).
    fn proof(&self) -> u32 {
        let same = self.same_process();
        let base = match self.last_cause {
            Some(Cause::SilentProbe) if same => rounds(SAME_PROOF),
            _ => ROUNDS_TO_ACT,
        };
        base.saturating_mul(1 << self.recurrences.min(8))
            .min(rounds(MAX_PROOF))
    }

    fn hand_back_if_proven(&mut self, now: Instant) {
        if self.holder != Holder::Fallback
            || self.answered < self.proof()
            || !self.complete
            || self.addresses != Addresses::Theirs
        {
            return;
        }
        if self.last_cause == Some(Cause::Unread) {
            self.unread_rests_until = Some(now + UNREAD_REST);
        }
        self.holder = Holder::LocalDns;
        self.handed_back_at = Some(now);
        // Only a process that failed and was trusted again can fail again.
        self.handed_to = match self.same_process() {
            true => self.watched.iter().map(|w| w.inode).collect(),
            false => Vec::new(),
        };
        self.next_look = now;
        self.out.push_back(Out::HandBack);
    }

    /// Where the listener addresses are at `now`. Gone while LocalDNS holds the flows: taken at
    /// once (nothing answers there until LocalDNS's script recreates its link). Gone while we
    /// hold them: put back on lo. The flows go back only while they are LocalDNS's.
    pub fn addresses(&mut self, now: Instant, addresses: Addresses) {
        self.addresses = addresses;
        match (self.holder, addresses) {
            (Holder::LocalDns, Addresses::Gone) => self.take(now, Cause::AddressesGone),
            (Holder::Fallback, Addresses::Gone) => self.out.push_back(Out::Repoint),
            _ => {}
        }
    }

    /// The kernel's view at `now`: LocalDNS's sockets in the listeners' groups (every member but
    /// ours), and whether it has one in every group.
    pub fn looked(&mut self, now: Instant, theirs: &[Queue], complete: bool) {
        self.complete = complete;
        self.last_look = now;
        let mut inodes: Vec<u64> = theirs.iter().map(|q| q.inode).collect();
        inodes.sort_unstable();
        let mut before: Vec<u64> = self.watched.iter().map(|w| w.inode).collect();
        before.sort_unstable();
        // A member that came or went moves indices (the kernel fills a freed index with the
        // last member): our steering may point at the wrong one now.
        let moved = self.looked_once && inodes != before;
        self.looked_once = true;
        let watched = theirs
            .iter()
            .map(|q| {
                let was = self.watched.iter().find(|w| w.inode == q.inode);
                let (since, asked_early) = match was {
                    _ if q.queued == 0 => (None, false),
                    Some(w) if w.queued > 0 && q.queued >= w.queued => {
                        (w.since.or(Some(now)), w.asked_early)
                    }
                    _ => (Some(now), false),
                };
                Watched {
                    inode: q.inode,
                    queued: q.queued,
                    since,
                    asked_early,
                }
            })
            .collect();
        self.watched = watched;
        // A queue seen non-empty is followed by busy looks from this one on, not from the
        // next: two idle looks that each found a queue are 30 ms apart, and a healthy LocalDNS
        // at its maximum rate may show one at both.
        let queued: u64 = self.watched.iter().map(|w| u64::from(w.queued)).sum();
        if self.holder == Holder::LocalDns && queued > 0 {
            self.next_look = self
                .next_look
                .min(now + LOOK_BUSY * (1 + (queued % 3) as u32));
        }
        if now.saturating_duration_since(self.look_due) > LATE {
            for w in self.watched.iter_mut().filter(|w| w.since.is_some()) {
                (w.since, w.asked_early) = (Some(now), false);
            }
        }
        if moved {
            self.out.push_back(Out::Repoint);
        }
        let resting = self.unread_rests_until.is_some_and(|until| now < until);
        let due = self.watched.iter().any(|w| {
            w.since.is_some_and(|s| {
                let age = now.saturating_duration_since(s);
                age >= UNREAD_FOR || (age >= STOPPED_FOR && !w.asked_early)
            })
        });
        if self.holder == Holder::LocalDns && !resting && due {
            self.out.push_back(Out::CheckOwners);
        }
    }

    /// LocalDNS's sockets whose queue has been non-empty and unshrinking for [`STOPPED_FOR`].
    pub fn suspects(&self) -> Vec<u64> {
        self.stalled(STOPPED_FOR).map(|w| w.inode).collect()
    }

    fn stalled(&self, for_: Duration) -> impl Iterator<Item = &Watched> {
        let now = self.last_look;
        self.watched.iter().filter(move |w| {
            w.since
                .is_some_and(|s| now.saturating_duration_since(s) >= for_)
        })
    }

    /// What the processes holding the suspect sockets do at `now`. Stopped (SIGSTOP): the flows
    /// are taken at once. Waiting for a CPU (starved by its neighbours, throttled by its slice's
    /// quota): not a hang; the queue is timed afresh, and the probe judges a starvation that
    /// lasts. Otherwise (asleep: blocked, frozen, or between two reads) the queue decides once
    /// it has been unread for [`UNREAD_FOR`].
    pub fn owners(&mut self, now: Instant, owners: Owners) {
        if self.holder != Holder::LocalDns {
            return;
        }
        let old = self.stalled(UNREAD_FOR).count() > 0;
        match owners {
            Owners::Stopped => self.take(now, Cause::Unread),
            Owners::Asleep if old => self.take(now, Cause::Unread),
            Owners::Runnable if old => {
                let suspects = self.suspects();
                for w in self
                    .watched
                    .iter_mut()
                    .filter(|w| suspects.contains(&w.inode))
                {
                    (w.since, w.asked_early) = (Some(now), false);
                }
            }
            Owners::Asleep | Owners::Runnable => {
                let suspects = self.suspects();
                for w in self
                    .watched
                    .iter_mut()
                    .filter(|w| suspects.contains(&w.inode))
                {
                    w.asked_early = true;
                }
            }
        }
    }

    /// A pod's query reached the standby at `now` while LocalDNS holds the flows: the steering
    /// points at a socket of ours (a LocalDNS socket left its group and the kernel moved ours into
    /// its index). Looked at within [`STRAY_GAP`], so the steering follows at once rather than up
    /// to `LOOK_EVERY` later (a quick LocalDNS restart sent the standby a dozen pods' queries a
    /// listener in that time); at most one such look every [`STRAY_GAP`], however many come.
    pub fn stray(&mut self, now: Instant) {
        if self.holder == Holder::LocalDns {
            self.strayed = true;
            self.next_look = self.next_look.min(now.max(self.last_look + STRAY_GAP));
        }
    }

    fn take(&mut self, now: Instant, cause: Cause) {
        let recurs = self.handed_back_at.is_some_and(|at| now < at + RECUR)
            && self.last_cause == Some(cause)
            && self
                .watched
                .iter()
                .any(|w| self.handed_to.contains(&w.inode));
        self.recurrences = if recurs { self.recurrences + 1 } else { 0 };
        self.holder = Holder::Fallback;
        self.last_cause = Some(cause);
        self.taken_from = (self.watched.iter().map(|w| w.inode))
            .filter(|i| self.served_from.contains(i))
            .collect();
        self.silent = 0;
        self.answered = 0;
        self.out.push_back(Out::Take(cause));
    }
}

/// Probe rounds in `d`.
fn rounds(d: Duration) -> u32 {
    d.as_millis().div_ceil(PROBE_EVERY.as_millis()) as u32
}

#[cfg(test)]
mod tests;
