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
//! for [`UNREAD_FOR`] is not being read. The probe (two silent rounds) catches the rest: a quiet
//! node where nothing queues, and a LocalDNS that reads but does not answer. Two answered rounds
//! give the flows back, once LocalDNS has a socket in every group.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How often the probe is asked. Two silent rounds take the flows within half a second.
pub const PROBE_EVERY: Duration = Duration::from_millis(120);
/// Rounds in a row that decide: two silent ones take the flows, two answered ones give them back
/// (one lost reply under load moves nothing).
const ROUNDS_TO_ACT: u32 = 2;
/// How often the kernel's view is read while LocalDNS holds the flows: a stall is seen at most
/// this late. While we hold them it is read once a probe round, to follow the groups' members.
pub const LOOK_EVERY: Duration = Duration::from_millis(10);
/// A LocalDNS socket whose queue has been non-empty and not shrinking this long is not read. A
/// healthy LocalDNS never left one so long (`tests/unread.rs` measures it: at its own maximum
/// rate, in bursts, and while starting up).
pub const UNREAD_FOR: Duration = Duration::from_millis(30);
/// After handing back flows the queues took, the queues take nothing for this long (the probe
/// still does): a LocalDNS that its CPU quota freezes for tens of milliseconds at a time looks
/// hung to the queues and well to the probe, and would otherwise change hands every half second.
pub const UNREAD_REST: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    LocalDns,
    Standby,
}

/// Why the standby took the flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// LocalDNS did not answer when the standby started.
    NotServing,
    SilentProbe,
    /// A LocalDNS socket left its queue unread for [`UNREAD_FOR`].
    Unread,
    AddressesGone,
}

/// What the shell does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    /// New flows to us, the listener addresses on lo.
    Take(Why),
    /// New flows to LocalDNS, the addresses off lo.
    HandBack,
    /// The steering afresh for the same holder, from the groups as they are now (a member that
    /// left moved the indices: a look finds it within `LOOK_EVERY`, so client queries that reach
    /// us need not tell), and the addresses back on lo if we hold the flows.
    Repoint,
    /// Start a probe round; report it with [`Flows::asked`].
    Ask,
    /// Read the kernel's view now; report it with [`Flows::looked`].
    Look,
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
}

#[derive(Debug)]
pub struct Flows {
    holder: Holder,
    taken_for: Option<Why>,
    silent: u32,
    answered: u32,
    asking: bool,
    next_ask: Instant,
    next_look: Instant,
    /// LocalDNS's sockets at the last look, by inode.
    watched: Vec<Watched>,
    /// LocalDNS has a socket in every group: there is someone to hand the flows to.
    complete: bool,
    looked_once: bool,
    unread_rests_until: Option<Instant>,
    out: VecDeque<Out>,
}

impl Flows {
    /// A standby starting at `now`: beside a LocalDNS that answered (its listeners were bound with
    /// the flows on LocalDNS's sockets), or taking them at once.
    pub fn new(now: Instant, localdns_serves: bool) -> Flows {
        let mut f = Flows {
            holder: Holder::LocalDns,
            taken_for: None,
            silent: 0,
            answered: 0,
            asking: false,
            next_ask: now,
            next_look: now,
            watched: Vec::new(),
            complete: false,
            looked_once: false,
            unread_rests_until: None,
            out: VecDeque::new(),
        };
        if !localdns_serves {
            f.take(Why::NotServing);
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
        if !self.asking && now >= self.next_ask {
            self.asking = true;
            self.next_ask = now + PROBE_EVERY;
            return Some(Out::Ask);
        }
        if now >= self.next_look {
            self.next_look = now
                + match self.holder {
                    Holder::LocalDns => LOOK_EVERY,
                    Holder::Standby => PROBE_EVERY,
                };
            return Some(Out::Look);
        }
        None
    }

    /// A probe round ended at `now`: LocalDNS answered on both listeners, or not.
    pub fn asked(&mut self, now: Instant, answered: bool) {
        self.asking = false;
        if answered {
            self.silent = 0;
            self.answered += 1;
            if self.holder == Holder::Standby && self.answered >= ROUNDS_TO_ACT && self.complete {
                if self.taken_for == Some(Why::Unread) {
                    self.unread_rests_until = Some(now + UNREAD_REST);
                }
                self.holder = Holder::LocalDns;
                self.taken_for = None;
                self.watched.clear();
                self.next_look = now;
                self.out.push_back(Out::HandBack);
            }
            return;
        }
        self.answered = 0;
        self.silent += 1;
        match self.holder {
            Holder::LocalDns if self.silent >= ROUNDS_TO_ACT => self.take(Why::SilentProbe),
            Holder::LocalDns => {}
            // Now and then while we serve: the addresses back on lo if something took them off
            // (a stop of localdns-fallback.service beside us runs its release).
            Holder::Standby if self.silent % 4 == 0 => self.out.push_back(Out::Repoint),
            Holder::Standby => {}
        }
    }

    /// The kernel's view at `now`: LocalDNS's sockets in the listeners' groups (every member but
    /// ours), and whether it has one in every group.
    pub fn looked(&mut self, now: Instant, theirs: &[Queue], complete: bool) {
        self.complete = complete;
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
                let since = match was {
                    _ if q.queued == 0 => None,
                    Some(w) if w.queued > 0 && q.queued >= w.queued => w.since.or(Some(now)),
                    _ => Some(now),
                };
                Watched {
                    inode: q.inode,
                    queued: q.queued,
                    since,
                }
            })
            .collect();
        self.watched = watched;
        if moved {
            self.out.push_back(Out::Repoint);
        }
        let resting = self.unread_rests_until.is_some_and(|until| now < until);
        let stalled = self
            .watched
            .iter()
            .filter_map(|w| w.since)
            .any(|since| now.saturating_duration_since(since) >= UNREAD_FOR);
        if self.holder == Holder::LocalDns && stalled && !resting {
            self.take(Why::Unread);
        }
    }

    /// A listener address is on no interface (LocalDNS's link was deleted).
    pub fn addresses_gone(&mut self) {
        if self.holder == Holder::LocalDns {
            self.take(Why::AddressesGone);
        }
    }

    fn take(&mut self, why: Why) {
        self.holder = Holder::Standby;
        self.taken_for = Some(why);
        self.silent = 0;
        self.answered = 0;
        self.out.push_back(Out::Take(why));
    }
}

#[cfg(test)]
mod tests;
