//! How a query's tries go out and end: choosing the upstream, the ID, the deadline and the hedge
//! of each try, and what a timeout, a failure or the end of the query does to them and to the
//! upstream's health.

use std::cmp::Reverse;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::Rng;

use super::pending::{MAX_TRIES, Orphan, Pending, Slot, Timer, TimerKind, Try, TryKey};
use super::{
    Dest, Engine, Event, Failure, HEDGE_COST, HEDGE_FLOOR, HEDGE_UNKNOWN, ID_DRAWS, Leg,
    SOCKET_RUN, Via,
};
use crate::roles::{Transport, UpstreamGroup};
use crate::upstream::Choice;
use crate::wire;

impl Engine {
    pub(super) fn try_timed_out(&mut self, slot: u32, try_no: usize, now: Instant) {
        let p = self.pending(slot);
        let Some(t) = p.tries[try_no].filter(|t| t.live) else {
            return;
        };
        if now < t.sent + self.settings.upstream_timeout {
            // The query's budget ran out before the try's own: the query ends, and the try waits
            // on as an orphan, so a slow server is not judged on a cut-short wait.
            self.give_up(slot, now);
            return;
        }
        let (group, latest, name) = (p.group, try_no + 1 == p.ntries, p.name_hash());
        self.end_try(slot, try_no, true);
        self.note_timeout(group, t.leg.to, t.counted, name, t.sent, now);
        // An earlier try that runs out while a later one is out just ends; the later one's own
        // timer moves the query on.
        if latest || self.pending(slot).live_tries() == 0 {
            self.next_try(slot, now);
        }
    }

    /// A try's hedge timer fired: the try's own timeout is armed now (the first time), and a
    /// hedge goes out if the try is still the latest and the budget allows; if the budget does
    /// not, the timer looks again later.
    pub(super) fn hedge(&mut self, slot: u32, try_no: usize, now: Instant) {
        let p = self.pending(slot);
        let Some(t) = p.tries[try_no].filter(|t| t.live) else {
            return;
        };
        let (timeout, group) = (
            (t.sent + self.settings.upstream_timeout).min(p.deadline),
            p.group,
        );
        // Late: likely lost. It stops counting as outstanding, or one lost packet would steer
        // every query away from its server until the timeout; and a server late again and
        // again is likely dead, so new queries go elsewhere first.
        if t.counted {
            self.arm(slot, try_no, timeout, TimerKind::TryTimeout);
            self.upstreams.get(group).note_late(t.leg.to);
            if let Some(t) = self.pending_mut(slot).tries[try_no].as_mut() {
                t.counted = false;
            }
        }
        let p = self.pending(slot);
        if p.hedged || try_no + 1 != p.ntries || p.ntries == MAX_TRIES {
            return;
        }
        // Hedges of probes are free (at most one probe per server per `PROBE_EVERY`); the rest
        // are paid for from the budget, so in an outage hedges add at most a fifth to the load.
        if !t.probe {
            if self.hedge_tokens < HEDGE_COST {
                // The budget refills with every new query. An upstream that drops a burst of
                // datagrams (a full socket buffer) leaves more tries late at once than the budget
                // holds: each looks again after as long again as it has waited (a few looks at
                // most), rather than hold its client the whole try timeout, which a client
                // waiting for its answer (a closed loop, 200 outstanding) pays in throughput.
                let again = now + now.saturating_duration_since(t.sent).max(HEDGE_FLOOR);
                if again < timeout {
                    self.arm(slot, try_no, again, TimerKind::Hedge);
                }
                return;
            }
            self.hedge_tokens -= HEDGE_COST;
        }
        self.pending_mut(slot).hedged = true;
        self.next_try(slot, now);
    }

    /// The query and try index a leg belongs to, while a reply to it would still be taken.
    pub(super) fn find_try(&self, leg: &Leg) -> Option<(u32, usize)> {
        let &(slot, generation) = self.keys.get(&TryKey::of(leg))?;
        let tries = &self.slots[slot as usize].holds(generation)?.tries;
        let try_no = tries
            .iter()
            .position(|t| t.is_some_and(|t| t.leg == *leg))?;
        Some((slot, try_no))
    }

    /// A try is over, however it ended. A try that only ran out of time keeps its key: its
    /// late reply is still a good answer.
    pub(super) fn end_try(&mut self, slot: u32, try_no: usize, may_still_answer: bool) {
        let p = self.pending_mut(slot);
        if let Some(t) = p.tries[try_no].as_mut() {
            t.live = false;
            t.counted = false;
            if !may_still_answer && t.keyed {
                t.keyed = false;
                let key = TryKey::of(&t.leg);
                self.keys.remove(&key);
            }
        }
    }

    /// An answer from `upstream`; `counted`: its try still counted as outstanding.
    pub(super) fn note_reply(
        &mut self,
        group: UpstreamGroup,
        upstream: SocketAddr,
        took: Duration,
        counted: bool,
        now: Instant,
    ) {
        if self
            .upstreams
            .get(group)
            .note_reply(upstream, took, counted, now)
        {
            self.events
                .push_back(Event::UpstreamRecovered { group, upstream });
        }
    }

    /// A try at `upstream` for the name hashed to `name`, sent at `sent`, went unanswered for
    /// its whole time; `counted` as in [`Engine::note_reply`].
    pub(super) fn note_timeout(
        &mut self,
        group: UpstreamGroup,
        upstream: SocketAddr,
        counted: bool,
        name: u64,
        sent: Instant,
        now: Instant,
    ) {
        if self
            .upstreams
            .get(group)
            .note_loss(upstream, counted, name, sent, now)
        {
            self.events.push_back(Event::UpstreamSuspect {
                group,
                upstream,
                failure: Failure::TimedOut,
            });
        }
    }

    /// A try at `upstream`, sent at `sent`, ended without an answer at `now`; `counted` as in
    /// [`Engine::note_reply`]. (Timeouts: [`Engine::note_timeout`].)
    pub(super) fn note_error(
        &mut self,
        group: UpstreamGroup,
        upstream: SocketAddr,
        failure: Failure,
        counted: bool,
        sent: Instant,
        now: Instant,
    ) {
        let set = self.upstreams.get(group);
        let demoted = match failure {
            Failure::TimedOut => set.note_loss(upstream, counted, 0, sent, now),
            Failure::ErrorReply(_) => {
                set.note_error_reply(upstream, counted, now);
                false
            }
            // Never evidence against the upstream: health is shared by every relay thread of
            // both listeners, and one thread's missing socket would make the others' queries
            // to a working upstream fail at once.
            Failure::Local(_) | Failure::NoSocket => {
                if counted {
                    set.end_try(upstream);
                }
                self.events.push_back(Event::NotSent {
                    group,
                    upstream,
                    failure,
                });
                false
            }
            Failure::Network(_) => set.note_failure(upstream, counted, sent, now),
        };
        if demoted {
            self.events.push_back(Event::UpstreamSuspect {
                group,
                upstream,
                failure,
            });
        }
    }

    pub(super) fn allocate(&mut self, pending: Pending) -> u32 {
        self.by_group[pending.group as usize] += 1;
        if let Some(slot) = self.free.pop() {
            self.slots[slot as usize].pending = Some(pending);
            return slot;
        }
        self.slots.push(Slot {
            generation: 0,
            pending: Some(pending),
        });
        (self.slots.len() - 1) as u32
    }

    /// Frees a query's slot; tries still out become orphans, awaited for the health they tell.
    /// Inlined because the 552-byte `Pending` it returns was otherwise copied through two more
    /// frames on every answer (callgrind: 330 instructions per query).
    #[inline(always)]
    pub(super) fn release(&mut self, slot: u32, now: Instant) -> Option<Pending> {
        let entry = &mut self.slots[slot as usize];
        let pending = entry.pending.take()?;
        entry.generation = entry.generation.wrapping_add(1);
        for t in pending.tries.iter().flatten() {
            let key = TryKey::of(&t.leg);
            if t.keyed {
                self.keys.remove(&key);
            }
            // A try still out, or one judged lost whose late reply would still have been taken,
            // stays awaited: a reply of any kind, however late, is life.
            if !t.live && !t.keyed {
                continue;
            }
            let wait = if t.live {
                self.settings.upstream_timeout
            } else {
                self.settings.query_timeout
            };
            let deadline = (t.sent + wait).max(now);
            if self.orphans.len() < 4 * self.settings.max_inflight {
                let orphan = Orphan {
                    group: pending.group,
                    sent: t.sent,
                    deadline,
                    counted: t.counted,
                    name: pending.name_hash(),
                    judged: !t.live,
                };
                self.orphans.insert(key, orphan);
                self.orphan_timers.push(Reverse((deadline, key)));
            } else if t.counted {
                self.upstreams.get(pending.group).end_try(t.leg.to);
            }
        }
        if let Some(key) = &pending.key {
            self.waiting[pending.transport as usize].remove(key);
        }
        self.free.push(slot);
        self.by_group[pending.group as usize] -= 1;
        Some(pending)
    }

    /// Sends the query's next try, if it has time and an upstream left to try; when it has
    /// neither and no try is still out, the query ends.
    pub(super) fn next_try(&mut self, slot: u32, now: Instant) {
        loop {
            let generation = self.slots[slot as usize].generation;
            let p = self.pending(slot);
            let (group, transport) = (p.group, p.transport);
            let refetch = p
                .refetch
                .filter(|_| p.ntries < MAX_TRIES && now < p.deadline);
            let choice = if let Some(addr) = refetch {
                Some(Choice { addr, probe: false })
            } else if p.ntries < MAX_TRIES && now < p.deadline {
                let (addrs, tried, errored) = p.tried();
                let set = self.upstreams.get(group);
                set.choose(p.start, &addrs[..tried], &addrs[..errored], now)
            } else {
                None
            };
            let Some(choice) = choice else {
                if self.pending(slot).live_tries() == 0 {
                    self.give_up(slot, now);
                }
                return;
            };
            let via = match transport {
                Transport::Udp if refetch.is_none() => Via::Udp {
                    socket: self.udp_socket(now),
                },
                Transport::Udp | Transport::Tcp => Via::Tcp,
            };
            let leg = self.free_leg(via, choice.addr);
            let upstream_timeout = self.settings.upstream_timeout;
            let p = self.slots[slot as usize]
                .pending
                .as_mut()
                .expect("a live slot");
            p.refetch = None;
            let try_no = p.ntries;
            p.ntries += 1;
            let Some(leg) = leg else {
                // Every ID drawn is in use: our own limit, not the upstream's.
                continue;
            };
            p.tries[try_no] = Some(Try {
                leg,
                sent: now,
                live: true,
                errored: false,
                keyed: true,
                counted: true,
                probe: choice.probe,
            });
            let timeout = (now + upstream_timeout).min(p.deadline);
            let set = self.upstreams.get(group);
            let hedge_at = (!p.hedged && p.ntries < MAX_TRIES).then(|| {
                let delay = if choice.probe {
                    HEDGE_FLOOR
                } else {
                    set.hedge_delay(choice.addr, HEDGE_FLOOR, upstream_timeout, HEDGE_UNKNOWN)
                };
                now + delay
            });
            self.outbox.push_with(Dest::Upstream(leg), |out| {
                wire::upstream_query(&p.query, &p.q, leg.id, out);
            });
            self.keys.insert(TryKey::of(&leg), (slot, generation));
            // One timer per try at a time: the hedge's if it comes first, and the timeout's only
            // once the hedge has fired (see `hedge`). Nearly every try is answered long before
            // its hedge (5 ms at least), so the heap holds milliseconds' worth of timers, not the
            // upstream timeout's worth.
            let (at, kind) = match hedge_at.filter(|at| *at < timeout) {
                Some(at) => (at, TimerKind::Hedge),
                None => (timeout, TimerKind::TryTimeout),
            };
            set.note_sent(choice.addr);
            self.arm(slot, try_no, at, kind);
            return;
        }
    }

    /// The UDP socket of the next try: drawn at random and kept for `SOCKET_RUN`, so the tries of
    /// one batch (made at one `now`) leave in one `sendmmsg` and their replies come back on one
    /// socket (one `recvmmsg`) rather than spread over every socket, and an upstream serving
    /// from several threads by source port is not woken on each of them in turn; which socket a
    /// try used is still unknown to an off-path spoofer.
    fn udp_socket(&mut self, now: Instant) -> usize {
        let (socket, until) = &mut self.socket_run;
        if until.is_none_or(|t| now >= t) {
            *socket = self
                .rng
                .random_range(0..self.settings.udp_sockets_per_upstream.max(1));
            *until = Some(now + SOCKET_RUN);
        }
        *socket
    }

    /// Sets a timer for the query now in `slot` (try `try_no`, or 0 for the query's own).
    pub(super) fn arm(&mut self, slot: u32, try_no: usize, at: Instant, kind: TimerKind) {
        self.timers.push(Reverse(Timer {
            at,
            slot,
            generation: self.slots[slot as usize].generation,
            try_no: try_no as u8,
            kind,
        }));
    }

    /// A leg with a query ID not in use on that socket (UDP) or to that upstream (TCP).
    pub(super) fn free_leg(&mut self, via: Via, to: SocketAddr) -> Option<Leg> {
        (0..ID_DRAWS).find_map(|_| {
            let leg = Leg {
                via,
                to,
                id: self.rng.random(),
            };
            let key = TryKey::of(&leg);
            (!self.keys.contains_key(&key) && !self.orphans.contains_key(&key)).then_some(leg)
        })
    }
}
