//! The engine: every decision about a query, whichever transport it came on and goes out on.
//!
//! Local answers, routing, the cache and serve-stale, coalescing of identical queries, the choice
//! of upstream, each try's deadline and hedge, shedding and health updates are made here, and only
//! here. The engine owns no socket, reads no clock (every input carries `now`), seeds no RNG from
//! the OS (the caller passes a seed) and logs nothing. Its shells (the relay thread for UDP, the
//! TCP tasks) drive it the same way:
//!
//! 1. feed an input: [`Engine::handle_query`], [`Engine::handle_reply`], [`Engine::handle_failure`],
//!    [`Engine::handle_unreachable`] or [`Engine::handle_timeout`];
//! 2. drain [`Engine::poll_transmit`] (send these bytes to that client or upstream, over UDP or
//!    TCP; a send that fails goes back in as [`Engine::handle_failure`]) and [`Engine::poll_event`]
//!    (things worth a log line);
//! 3. sleep until [`Engine::poll_timeout`] or the next input, whichever comes first.
//!
//! A query's life: its first try goes to the upstream [`UpstreamSet::choose`] picks. If that one
//! has not answered within its usual time (its RTT plus deviations, at least `HEDGE_FLOOR`), the
//! query is also sent to the next upstream (a hedge: at most one per query, and hedges stay a
//! bounded share of the load); if a try's budget runs out, or the network refuses it, or the
//! upstream answers SERVFAIL, REFUSED or NOTIMP, the next upstream is tried at once. The first
//! acceptable answer wins. When nothing is left to try: a stale cached answer, else the error an
//! upstream gave, else SERVFAIL.

mod boundary;
mod outbox;
mod pending;
pub mod route;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::answer;
use crate::cache::{Cache, Key};
use crate::roles::{ListenerRole, Transport, UpstreamGroup};
use crate::stats::ListenerStats;
use crate::upstream::UpstreamSets;
use crate::wire::{self, rcode};
pub use boundary::{Client, ConnId, Dest, Event, Failure, Leg, Outcome, Settings, Transmit, Via};
use outbox::Outbox;
use pending::{Asker, MAX_TRIES, Orphan, Pending, Slot, Timer, TimerKind, Try, TryKey};
use route::Decision;

/// Identical queries that may wait on one upstream query; more start their own.
const MAX_FOLLOWERS: usize = 256;
/// Random draws for a free query ID before a try gives up as a local failure (only reachable
/// when nearly all 65,536 IDs of a socket are in flight).
const ID_DRAWS: usize = 32;
/// The largest message a TCP client can be sent (its length prefix is 16 bits).
const TCP_MAX_MESSAGE: usize = u16::MAX as usize;
/// A hedge never goes out sooner than this after its try: LAN round trips take well under a
/// millisecond, so a try this late is very likely lost or stuck.
const HEDGE_FLOOR: Duration = Duration::from_millis(5);
/// The hedge delay for an upstream that has not answered anything yet.
const HEDGE_UNKNOWN: Duration = Duration::from_millis(100);
/// Hedges cost this many tokens; each new query earns one. So hedges add at most a fifth to
/// upstream load, even when every query would want one (an overloaded upstream must not get
/// twice the traffic).
const HEDGE_COST: u32 = 5;
/// Tokens saved up at most: a burst of losses can be hedged.
const HEDGE_BURST: u32 = 50 * HEDGE_COST;
/// Names whose refresh failed, remembered for the failure-recheck timer; beyond this the oldest
/// memories go.
const RECHECK_CAP: usize = 4096;

/// The decisions of one relay thread of one listener. Not shared: each thread has its own; they
/// share the upstream sets (and their health), the cache and the counters.
pub struct Engine {
    role: ListenerRole,
    settings: Settings,
    upstreams: Arc<UpstreamSets>,
    cache: Option<Arc<Mutex<Cache>>>,
    stats: Arc<ListenerStats>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    inflight: usize,
    /// Every try still awaited → (slot, generation).
    keys: HashMap<TryKey, (u32, u32)>,
    /// Tries still out whose queries are done.
    orphans: HashMap<TryKey, Orphan>,
    orphan_timers: BinaryHeap<Reverse<(Instant, TryKey)>>,
    /// Queries on their way upstream by cache key and transport, for coalescing.
    waiting: HashMap<(Key, Transport), u32>,
    /// When a refresh of each name last failed (serve-stale's failure-recheck timer).
    recheck: HashMap<Key, Instant>,
    timers: BinaryHeap<Reverse<Timer>>,
    hedge_tokens: u32,
    /// Query IDs and socket choices must be unpredictable to an off-path spoofer.
    rng: StdRng,
    outbox: Outbox,
    events: VecDeque<Event>,
    /// A cached answer being handed out.
    answer: Vec<u8>,
    scratch: Vec<u8>,
}

impl Engine {
    pub fn new(
        role: ListenerRole,
        settings: Settings,
        upstreams: Arc<UpstreamSets>,
        cache: Option<Arc<Mutex<Cache>>>,
        stats: Arc<ListenerStats>,
        seed: [u8; 32],
    ) -> Engine {
        Engine {
            role,
            settings,
            upstreams,
            cache,
            stats,
            slots: Vec::new(),
            free: Vec::new(),
            inflight: 0,
            keys: HashMap::new(),
            orphans: HashMap::new(),
            orphan_timers: BinaryHeap::new(),
            waiting: HashMap::new(),
            recheck: HashMap::new(),
            timers: BinaryHeap::new(),
            hedge_tokens: HEDGE_BURST,
            rng: StdRng::from_seed(seed),
            outbox: Outbox::default(),
            events: VecDeque::new(),
            answer: Vec::new(),
            scratch: Vec::new(),
        }
    }

    pub fn role(&self) -> ListenerRole {
        self.role
    }

    /// Discovery found new upstreams; queries in flight finish against the upstreams their tries
    /// already name.
    pub fn set_upstreams(&mut self, upstreams: Arc<UpstreamSets>) {
        self.upstreams = upstreams;
    }

    pub fn upstreams(&self) -> &Arc<UpstreamSets> {
        &self.upstreams
    }

    pub fn inflight(&self) -> usize {
        self.inflight
    }

    /// The next transmit, until there are none.
    pub fn poll_transmit(&mut self) -> Option<Transmit<'_>> {
        self.outbox.pop()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Engine::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let tries = self.timers.peek().map(|Reverse(t)| t.at);
        let orphans = self.orphan_timers.peek().map(|Reverse((at, _))| *at);
        match (tries, orphans) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A client's query (a datagram, or one message of a TCP stream).
    pub fn handle_query(&mut self, now: Instant, client: Client, packet: &[u8]) -> Outcome {
        let mut local = std::mem::take(&mut self.scratch);
        let decision = route::decide(self.role, packet, &self.settings.cluster_domain, &mut local);
        let (q, group) = match decision {
            Decision::Drop => {
                self.scratch = local;
                self.stats.dropped.fetch_add(1, RELAXED);
                return Outcome::Dropped;
            }
            Decision::Answered => {
                self.outbox.push(Dest::Client(client), &local);
                self.scratch = local;
                return Outcome::Answered;
            }
            Decision::Forward(q, group) => {
                self.scratch = local;
                (q, group)
            }
        };
        let transport = client.transport();
        let key = self
            .cache
            .as_ref()
            .and_then(|_| Key::new(group, packet, &q));
        let mut stale_known = false;
        if let Some(key) = &key {
            if self.lookup(key, now, false) {
                self.stats.cache_hits.fetch_add(1, RELAXED);
                self.deliver_answer(client, packet, &q);
                return Outcome::Answered;
            }
            self.stats.cache_misses.fetch_add(1, RELAXED);
            stale_known = self.lookup(key, now, true);
            let waiting = self.waiting.get(&(key.clone(), transport)).copied();
            // The failure-recheck timer: this name failed lately; answer stale at once, and keep
            // (at most) one refresh going.
            let failed_lately = self
                .recheck
                .get(key)
                .is_some_and(|t| now.saturating_duration_since(*t) < self.settings.stale_recheck);
            if stale_known && failed_lately {
                self.serve_stale_to(client, packet, &q);
                if waiting.is_none() {
                    self.start(
                        now,
                        None,
                        packet,
                        q,
                        Some(key.clone()),
                        group,
                        transport,
                        false,
                    );
                }
                return Outcome::Answered;
            }
            if let Some(slot) = waiting {
                let p = self.slots[slot as usize]
                    .pending
                    .as_mut()
                    .expect("waiting is live");
                if p.stale_served && stale_known {
                    self.serve_stale_to(client, packet, &q);
                    return Outcome::Answered;
                }
                if p.followers.len() < MAX_FOLLOWERS {
                    p.followers.push(Asker {
                        client,
                        query: packet.into(),
                        q,
                    });
                    return Outcome::Waiting;
                }
            }
        }
        let upstreams = self.upstreams.get(group);
        // Shed load with an explicit REFUSED: the client learns at once and memory stays flat.
        let shed = self.inflight >= self.settings.max_inflight;
        if shed || upstreams.is_empty() {
            let code = if shed {
                self.stats.shed.fetch_add(1, RELAXED);
                rcode::REFUSED
            } else {
                rcode::SERVFAIL
            };
            wire::local_reply(packet, &q, code, &mut self.scratch);
            self.outbox.push(Dest::Client(client), &self.scratch);
            return Outcome::Answered;
        }
        self.start(
            now,
            Some(client),
            packet,
            q,
            key,
            group,
            transport,
            stale_known,
        );
        Outcome::Waiting
    }

    /// A new query in flight, for `client` or (with `None`) only to refresh the cache.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        now: Instant,
        client: Option<Client>,
        packet: &[u8],
        q: wire::Query,
        key: Option<Key>,
        group: UpstreamGroup,
        transport: Transport,
        stale_known: bool,
    ) {
        self.hedge_tokens = (self.hedge_tokens + 1).min(HEDGE_BURST);
        let pending = Pending {
            query: packet.into(),
            q,
            client,
            followers: Vec::new(),
            key: key.clone(),
            group,
            transport,
            start: self.upstreams.get(group).next_start(),
            deadline: now + self.settings.query_timeout,
            tries: [None; MAX_TRIES],
            ntries: 0,
            hedged: false,
            stale_served: false,
            error_reply: None,
        };
        let slot = self.allocate(pending);
        let generation = self.slots[slot as usize].generation;
        if let Some(key) = key {
            self.waiting.insert((key, transport), slot);
        }
        // The client-response timer: an expired answer beats making the client wait out a
        // failing upstream.
        if stale_known
            && client.is_some()
            && self.settings.stale_after < self.settings.query_timeout
        {
            self.timers.push(Reverse(Timer {
                at: now + self.settings.stale_after,
                slot,
                generation,
                try_no: 0,
                kind: TimerKind::Stale,
            }));
        }
        self.next_try(slot, now);
    }

    /// A message from an upstream: a datagram on UDP socket `via`, or a frame of a TCP exchange.
    /// Anything that is not the awaited reply from the exact upstream address is ignored, and the
    /// query keeps waiting.
    pub fn handle_reply(&mut self, now: Instant, via: Via, from: SocketAddr, packet: &[u8]) {
        if packet.len() < wire::HEADER_LEN {
            return;
        }
        let leg = Leg {
            via,
            to: from,
            id: wire::id(packet),
        };
        if let Some(orphan) = self.orphans.remove(&TryKey::of(&leg)) {
            // A late answer to a query already answered: it still proves the upstream alive.
            let took = now.saturating_duration_since(orphan.sent);
            self.note_reply(orphan.group, from, took, true);
            return;
        }
        let Some((slot, try_no)) = self.find_try(&leg) else {
            return;
        };
        let p = self.pending(slot);
        if !wire::reply_matches(packet, leg.id, p.q.question(&p.query)) {
            return;
        }
        let code = wire::rcode(packet);
        let has_question = u16::from_be_bytes([packet[4], packet[5]]) == 1;
        // A reply without a question is acceptable only as an error (FORMERR, BADVERS from a
        // server that chokes on the query); glibc discards a NOERROR one and waits out its timeout.
        if !has_question && code == rcode::NOERROR {
            return;
        }
        let group = p.group;
        let (sent, live) = p.tries[try_no].map_or((now, false), |t| (t.sent, t.live));
        self.end_try(slot, try_no, false);
        if matches!(code, rcode::SERVFAIL | rcode::REFUSED | rcode::NOTIMP) || !has_question {
            // Errors are not answers: another upstream may resolve it.
            self.note_error(group, from, Failure::ErrorReply(code), live);
            let p = self.pending_mut(slot);
            if let Some(t) = p.tries[try_no].as_mut() {
                t.errored = true;
            }
            if p.error_reply.is_none() {
                p.error_reply = Some(packet.into());
            }
            self.next_try(slot, now);
            return;
        }
        self.note_reply(group, from, now.saturating_duration_since(sent), live);
        let Some(p) = self.release(slot, now) else {
            return;
        };
        if let (Some(cache), Some(key)) = (&self.cache, p.key.clone()) {
            lock(cache).put(key, packet, now);
        }
        for (client, query, q) in p.askers() {
            deliver(
                &mut self.outbox,
                &mut self.scratch,
                packet,
                client,
                query,
                q,
            );
        }
    }

    /// A try could not be sent, or its TCP exchange broke: the query moves on at once.
    pub fn handle_failure(&mut self, now: Instant, leg: Leg, failure: Failure) {
        if matches!(leg.via, Via::Udp { .. })
            && matches!(
                failure,
                Failure::Network(std::io::ErrorKind::ConnectionRefused)
            )
        {
            // ICMP port unreachable: every try at that upstream is as good as lost.
            self.handle_unreachable(now, leg.to);
            return;
        }
        let key = TryKey::of(&leg);
        if let Some(orphan) = self.orphans.remove(&key) {
            self.note_failure(orphan.group, leg.to, failure);
            return;
        }
        let Some((slot, try_no)) = self.find_try(&leg) else {
            return;
        };
        let p = self.pending(slot);
        let (group, live) = (p.group, p.tries[try_no].is_some_and(|t| t.live));
        self.end_try(slot, try_no, false);
        self.note_error(group, leg.to, failure, live);
        self.next_try(slot, now);
    }

    /// The network says `upstream` cannot be reached over UDP (an ICMP error on a socket connected
    /// to it). The kernel rate-limits those errors, so one stands for every try out there: each
    /// moves on at once, and the upstream is tried after the others until it answers again.
    pub fn handle_unreachable(&mut self, now: Instant, upstream: SocketAddr) {
        let failure = Failure::Network(std::io::ErrorKind::ConnectionRefused);
        for group in UpstreamGroup::BOTH {
            if self.upstreams.get(group).contains(upstream) {
                self.note_error(group, upstream, failure, false);
            }
        }
        let upstreams = self.upstreams.clone();
        self.orphans.retain(|k, o| {
            let hit = matches!(k, TryKey::Udp(to, ..) if *to == upstream);
            if hit {
                upstreams.get(o.group).note_failure(upstream, false);
            }
            !hit
        });
        let hit: Vec<(TryKey, u32, u32)> = self
            .keys
            .iter()
            .filter(|(k, _)| matches!(k, TryKey::Udp(to, ..) if *to == upstream))
            .map(|(k, &(slot, generation))| (*k, slot, generation))
            .collect();
        for (key, slot, generation) in hit {
            if self.slots[slot as usize].generation != generation {
                continue;
            }
            let Some(p) = self.slots[slot as usize].pending.as_ref() else {
                continue;
            };
            let Some(try_no) = p
                .tries
                .iter()
                .position(|t| t.is_some_and(|t| TryKey::of(&t.leg) == key))
            else {
                continue;
            };
            if p.tries[try_no].is_some_and(|t| t.live) {
                self.upstreams.get(p.group).note_failure(upstream, false);
            }
            self.end_try(slot, try_no, false);
            self.next_try(slot, now);
        }
    }

    /// Runs every timer that is due: tries out of budget, hedges, serve-stale's client-response
    /// timer, and the deadlines of orphaned tries.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(Reverse(top)) = self.timers.peek() {
            if top.at > now {
                break;
            }
            let Some(Reverse(timer)) = self.timers.pop() else {
                break;
            };
            let entry = &self.slots[timer.slot as usize];
            if entry.generation != timer.generation || entry.pending.is_none() {
                continue;
            }
            match timer.kind {
                TimerKind::TryTimeout => self.try_timed_out(timer.slot, timer.try_no, now),
                TimerKind::Hedge => self.hedge(timer.slot, timer.try_no, now),
                TimerKind::Stale => self.stale_timer(timer.slot, now),
            }
        }
        while let Some(Reverse((at, key))) = self.orphan_timers.peek().copied() {
            if at > now {
                break;
            }
            self.orphan_timers.pop();
            if self.orphans.get(&key).is_some_and(|o| o.deadline == at) {
                if let Some(orphan) = self.orphans.remove(&key) {
                    self.note_failure(orphan.group, key.upstream(), Failure::TimedOut);
                }
            }
        }
        // Timers of answered queries stay in the heap until they expire; at very high rates that
        // is many, so drop them early rather than let the heap grow with the query rate.
        if self.timers.len() > 4 * (self.settings.max_inflight + 1024) {
            let slots = &self.slots;
            self.timers.retain(|Reverse(t)| {
                let e = &slots[t.slot as usize];
                e.generation == t.generation && e.pending.is_some()
            });
        }
    }

    fn try_timed_out(&mut self, slot: u32, try_no: usize, now: Instant) {
        let p = self.pending(slot);
        let Some(t) = p.tries[try_no].filter(|t| t.live) else {
            return;
        };
        let (group, latest) = (p.group, try_no + 1 == p.ntries);
        self.end_try(slot, try_no, true);
        self.note_failure(group, t.leg.to, Failure::TimedOut);
        // An earlier try that runs out while a later one is out just ends; the later one's own
        // timer moves the query on.
        if latest || self.pending(slot).live_tries() == 0 {
            self.next_try(slot, now);
        }
    }

    fn hedge(&mut self, slot: u32, try_no: usize, now: Instant) {
        let p = self.pending(slot);
        let still_out = p.tries[try_no].is_some_and(|t| t.live);
        if p.hedged || !still_out || try_no + 1 != p.ntries || p.ntries == MAX_TRIES {
            return;
        }
        let probe = self.pending(slot).tries[try_no]
            .is_some_and(|t| self.upstreams.get(p.group).is_suspect(t.leg.to));
        // Hedges of probes are free (probes are few); the rest are paid for from the budget.
        if !probe {
            if self.hedge_tokens < HEDGE_COST {
                return;
            }
            self.hedge_tokens -= HEDGE_COST;
        }
        self.pending_mut(slot).hedged = true;
        self.next_try(slot, now);
    }

    fn stale_timer(&mut self, slot: u32, now: Instant) {
        let p = self.pending(slot);
        let Some(key) = p.key.clone().filter(|_| p.has_askers() && !p.stale_served) else {
            return;
        };
        if !self.lookup(&key, now, true) {
            return;
        }
        let mut p = self.slots[slot as usize].pending.take().expect("checked");
        let askers = p.askers().count();
        self.stats.stale.fetch_add(askers as u64, RELAXED);
        self.events
            .push_back(Event::ServedStale { answers: askers });
        for (client, query, q) in p.askers() {
            deliver(
                &mut self.outbox,
                &mut self.scratch,
                &self.answer,
                client,
                query,
                q,
            );
        }
        p.client = None;
        p.followers.clear();
        p.stale_served = true;
        self.slots[slot as usize].pending = Some(p);
    }

    fn pending(&self, slot: u32) -> &Pending {
        self.slots[slot as usize]
            .pending
            .as_ref()
            .expect("a live slot")
    }

    fn pending_mut(&mut self, slot: u32) -> &mut Pending {
        self.slots[slot as usize]
            .pending
            .as_mut()
            .expect("a live slot")
    }

    /// The query and try index a leg belongs to, while a reply to it would still be taken.
    fn find_try(&self, leg: &Leg) -> Option<(u32, usize)> {
        let &(slot, generation) = self.keys.get(&TryKey::of(leg))?;
        let entry = &self.slots[slot as usize];
        let p = entry
            .pending
            .as_ref()
            .filter(|_| entry.generation == generation)?;
        Some((slot, p.try_index(leg)?))
    }

    /// A try is over, however it ended. A try that only ran out of time keeps its key: its
    /// late reply is still a good answer.
    fn end_try(&mut self, slot: u32, try_no: usize, may_still_answer: bool) {
        let p = self.pending_mut(slot);
        if let Some(t) = p.tries[try_no].as_mut() {
            t.live = false;
            if !may_still_answer {
                let key = TryKey::of(&t.leg);
                self.keys.remove(&key);
            }
        }
    }

    /// `live`: the try was still counted as outstanding (not already ended by its timeout).
    fn note_reply(
        &mut self,
        group: UpstreamGroup,
        upstream: SocketAddr,
        took: Duration,
        live: bool,
    ) {
        if self.upstreams.get(group).note_reply(upstream, took, live) {
            self.events
                .push_back(Event::UpstreamRecovered { group, upstream });
        }
    }

    /// A try that was still outstanding failed.
    fn note_failure(&mut self, group: UpstreamGroup, upstream: SocketAddr, failure: Failure) {
        self.note_error(group, upstream, failure, true);
    }

    /// A failure of `upstream`; `live` when it ended a try still counted as outstanding.
    fn note_error(
        &mut self,
        group: UpstreamGroup,
        upstream: SocketAddr,
        failure: Failure,
        live: bool,
    ) {
        let set = self.upstreams.get(group);
        if set.note_failure_of(upstream, failure.blames_upstream(), live) {
            self.events.push_back(Event::UpstreamSuspect {
                group,
                upstream,
                failure,
            });
        }
    }

    fn allocate(&mut self, pending: Pending) -> u32 {
        self.inflight += 1;
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
    fn release(&mut self, slot: u32, now: Instant) -> Option<Pending> {
        let entry = &mut self.slots[slot as usize];
        let pending = entry.pending.take()?;
        entry.generation = entry.generation.wrapping_add(1);
        for t in pending.tries.iter().flatten() {
            let key = TryKey::of(&t.leg);
            self.keys.remove(&key);
            if !t.live {
                continue;
            }
            let deadline = (t.sent + self.settings.upstream_timeout).max(now);
            if self.orphans.len() < 4 * self.settings.max_inflight {
                let orphan = Orphan {
                    group: pending.group,
                    sent: t.sent,
                    deadline,
                };
                self.orphans.insert(key, orphan);
                self.orphan_timers.push(Reverse((deadline, key)));
            } else {
                self.upstreams
                    .get(pending.group)
                    .note_failure(t.leg.to, false);
            }
        }
        if let Some(key) = &pending.key {
            self.waiting.remove(&(key.clone(), pending.transport));
        }
        self.free.push(slot);
        self.inflight -= 1;
        Some(pending)
    }

    /// Sends the query's next try, if it has time and an upstream left to try; when it has
    /// neither and no try is still out, the query ends.
    fn next_try(&mut self, slot: u32, now: Instant) {
        loop {
            let generation = self.slots[slot as usize].generation;
            let p = self.pending(slot);
            let (group, transport) = (p.group, p.transport);
            let choice = if p.ntries < MAX_TRIES && now < p.deadline {
                let (tried, excluded) = p.tried_and_excluded();
                self.upstreams
                    .get(group)
                    .choose(p.start, &tried, &excluded, now)
            } else {
                None
            };
            let Some(choice) = choice else {
                if self.pending(slot).live_tries() == 0 {
                    self.give_up(slot, now);
                }
                return;
            };
            let set = self.upstreams.get(group).clone();
            let via = match transport {
                Transport::Udp => Via::Udp {
                    socket: self
                        .rng
                        .random_range(0..self.settings.udp_sockets_per_upstream.max(1)),
                },
                Transport::Tcp => Via::Tcp,
            };
            let leg = self.free_leg(via, choice.addr);
            let upstream_timeout = self.settings.upstream_timeout;
            let p = self.slots[slot as usize]
                .pending
                .as_mut()
                .expect("a live slot");
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
            });
            let timeout = (now + upstream_timeout).min(p.deadline);
            let hedge_at = (!p.hedged && p.ntries < MAX_TRIES).then(|| {
                let delay = if choice.probe {
                    HEDGE_FLOOR
                } else {
                    set.hedge_delay(choice.addr, HEDGE_FLOOR, upstream_timeout, HEDGE_UNKNOWN)
                };
                now + delay
            });
            self.outbox.push_with(Dest::Upstream(leg), |out| {
                answer::upstream_query(&p.query, &p.q, leg.id, out);
            });
            self.keys.insert(TryKey::of(&leg), (slot, generation));
            let timer = |at, kind| {
                Reverse(Timer {
                    at,
                    slot,
                    generation,
                    try_no,
                    kind,
                })
            };
            self.timers.push(timer(timeout, TimerKind::TryTimeout));
            if let Some(at) = hedge_at.filter(|at| *at < timeout) {
                self.timers.push(timer(at, TimerKind::Hedge));
            }
            set.note_sent(choice.addr);
            return;
        }
    }

    /// A leg with a query ID not in use on that socket (UDP) or to that upstream (TCP).
    fn free_leg(&mut self, via: Via, to: SocketAddr) -> Option<Leg> {
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

    /// Nothing is left to try: a stale answer if the cache has one (RFC 8767), else the error an
    /// upstream answered, else SERVFAIL.
    fn give_up(&mut self, slot: u32, now: Instant) {
        let Some(p) = self.release(slot, now) else {
            return;
        };
        if let Some(key) = &p.key {
            if self.recheck.len() >= RECHECK_CAP {
                let keep = self.settings.stale_recheck;
                self.recheck
                    .retain(|_, t| now.saturating_duration_since(*t) < keep);
                if self.recheck.len() >= RECHECK_CAP {
                    self.recheck.clear();
                }
            }
            self.recheck.insert(key.clone(), now);
        }
        if !p.has_askers() {
            return;
        }
        if let Some(key) = &p.key {
            if self.lookup(key, now, true) {
                let answers = p.askers().count();
                self.stats.stale.fetch_add(answers as u64, RELAXED);
                self.events.push_back(Event::ServedStale { answers });
                for (client, query, q) in p.askers() {
                    deliver(
                        &mut self.outbox,
                        &mut self.scratch,
                        &self.answer,
                        client,
                        query,
                        q,
                    );
                }
                return;
            }
        }
        for (client, query, q) in p.askers() {
            match &p.error_reply {
                Some(reply) => {
                    deliver(&mut self.outbox, &mut self.scratch, reply, client, query, q)
                }
                None => {
                    wire::local_reply(query, q, rcode::SERVFAIL, &mut self.scratch);
                    self.outbox.push(Dest::Client(client), &self.scratch);
                }
            }
        }
    }

    /// Copies a fresh (or, with `stale`, an expired but servable) cached answer into
    /// `self.answer`.
    fn lookup(&mut self, key: &Key, now: Instant, stale: bool) -> bool {
        let Some(cache) = &self.cache else {
            return false;
        };
        let mut cache = lock(cache);
        if stale {
            cache.get_stale(key, now, &mut self.answer)
        } else {
            cache.get_fresh(key, now, &mut self.answer)
        }
    }

    fn deliver_answer(&mut self, client: Client, query: &[u8], q: &wire::Query) {
        deliver(
            &mut self.outbox,
            &mut self.scratch,
            &self.answer,
            client,
            query,
            q,
        );
    }

    /// The stale answer in `self.answer`, to one client now.
    fn serve_stale_to(&mut self, client: Client, query: &[u8], q: &wire::Query) {
        self.stats.stale.fetch_add(1, RELAXED);
        self.events.push_back(Event::ServedStale { answers: 1 });
        self.deliver_answer(client, query, q);
    }
}

/// Queues `reply` for a client as the answer to its own query: its ID, its spelling of the
/// question, and cut to fit what it can take.
fn deliver(
    outbox: &mut Outbox,
    scratch: &mut Vec<u8>,
    reply: &[u8],
    client: Client,
    query: &[u8],
    q: &wire::Query,
) {
    let limit = match client {
        Client::Udp(_) => usize::from(q.udp_size),
        Client::Tcp(_) => TCP_MAX_MESSAGE,
    };
    outbox.push_with(Dest::Client(client), |out| {
        answer::for_asker(reply, query, q, limit, out, scratch);
    });
}

const RELAXED: std::sync::atomic::Ordering = std::sync::atomic::Ordering::Relaxed;

/// A poisoned lock only means another thread panicked mid-update of plain data; the cache is
/// still usable, and DNS service matters more than the entry that thread was writing.
fn lock(cache: &Mutex<Cache>) -> std::sync::MutexGuard<'_, Cache> {
    cache
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
