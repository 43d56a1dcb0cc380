//! The engine: every decision about a query, whichever transport it came on and goes out on.
//!
//! Local answers, routing, the cache and serve-stale, coalescing of identical queries, the choice
//! of upstream and of each try's deadline, shedding and health updates are made here, and only
//! here. The engine owns no socket, reads no clock (every input carries `now`), seeds no RNG from
//! the OS (the caller passes a seed) and logs nothing. Its shells (the relay thread for UDP, the
//! TCP tasks) drive it the same way:
//!
//! 1. feed an input: [`Engine::handle_query`], [`Engine::handle_reply`], [`Engine::handle_failure`]
//!    or [`Engine::handle_timeout`];
//! 2. drain [`Engine::poll_transmit`] (send these bytes to that client or upstream, over UDP or
//!    TCP; a send that fails goes back in as [`Engine::handle_failure`]) and [`Engine::poll_event`]
//!    (things worth a log line);
//! 3. sleep until [`Engine::poll_timeout`] or the next input, whichever comes first.

mod boundary;
mod outbox;
pub mod route;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
use route::Decision;

/// The most tries one query makes; the query deadline usually ends it first.
const MAX_TRIES: usize = 4;
/// Identical queries that may wait on one upstream query; more start their own.
const MAX_FOLLOWERS: usize = 256;
/// Random draws for a free query ID before a try gives up as a local failure (only reachable
/// when nearly all 65,536 IDs of a socket are in flight).
const ID_DRAWS: usize = 32;
/// The largest message a TCP client can be sent (its length prefix is 16 bits).
const TCP_MAX_MESSAGE: usize = u16::MAX as usize;

/// One try of a query at one upstream.
#[derive(Clone, Copy, Debug)]
struct Try {
    leg: Leg,
    sent: Instant,
}

/// A client waiting for an answer: where to send it and how it asked (its ID, spelling and
/// size limit go back into the answer).
struct Asker {
    client: Client,
    query: Box<[u8]>,
    q: wire::Query,
}

impl Asker {
    /// The largest reply this client may be sent.
    fn limit(&self) -> usize {
        match self.client {
            Client::Udp(_) => usize::from(self.q.udp_size),
            Client::Tcp(_) => TCP_MAX_MESSAGE,
        }
    }
}

/// A query waiting for an upstream, with any identical queries that arrived while it was on its
/// way (they share its answer instead of multiplying upstream load).
struct Pending {
    asker: Asker,
    followers: Vec<Asker>,
    /// The cache key, when the cache is on: also the coalescing key (with the transport).
    key: Option<Key>,
    group: UpstreamGroup,
    /// The transport of every try: the asker's own (a TCP client's query goes upstream over TCP).
    transport: Transport,
    /// The query's starting point in the upstream rotation.
    start: usize,
    deadline: Instant,
    tries: [Option<Try>; MAX_TRIES],
    ntries: usize,
}

impl Pending {
    fn askers(&self) -> impl Iterator<Item = &Asker> {
        std::iter::once(&self.asker).chain(&self.followers)
    }
}

struct Slot {
    /// Bumped whenever the slot is freed, so stale keys and timers of an earlier query are ignored.
    generation: u32,
    pending: Option<Pending>,
}

/// A try's deadline. Ordered by time first so the heap's top is the next to expire.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Instant,
    slot: u32,
    generation: u32,
    try_no: usize,
}

/// Where a try's reply is looked up: UDP by (socket, ID), TCP by (upstream, ID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum TryKey {
    Udp(u32),
    Tcp(SocketAddr, u16),
}

impl TryKey {
    fn of(leg: &Leg) -> TryKey {
        match leg.via {
            Via::Udp { socket } => TryKey::Udp((socket as u32) << 16 | u32::from(leg.id)),
            Via::Tcp => TryKey::Tcp(leg.to, leg.id),
        }
    }
}

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
    /// Queries on their way upstream by cache key and transport, for coalescing.
    waiting: HashMap<(Key, Transport), u32>,
    timers: BinaryHeap<Reverse<Timer>>,
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
            waiting: HashMap::new(),
            timers: BinaryHeap::new(),
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

    /// Discovery found new upstreams; queries in flight finish against the sets they started with
    /// (their tries already name their upstreams).
    pub fn set_upstreams(&mut self, upstreams: Arc<UpstreamSets>) {
        self.upstreams = upstreams;
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
        self.timers.peek().map(|Reverse(t)| t.at)
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
        let asker = Asker {
            client,
            query: packet.into(),
            q,
        };
        let transport = client.transport();
        let key = self
            .cache
            .as_ref()
            .and_then(|_| Key::new(group, packet, &q));
        if let (Some(cache), Some(key)) = (&self.cache, &key) {
            if lock(cache).get_fresh(key, now, &mut self.answer) {
                self.stats.cache_hits.fetch_add(1, RELAXED);
                deliver(&mut self.outbox, &mut self.scratch, &self.answer, &asker);
                return Outcome::Answered;
            }
            self.stats.cache_misses.fetch_add(1, RELAXED);
            if let Some(&slot) = self.waiting.get(&(key.clone(), transport)) {
                if let Some(p) = self.slots[slot as usize].pending.as_mut() {
                    if p.followers.len() < MAX_FOLLOWERS {
                        p.followers.push(asker);
                        return Outcome::Waiting;
                    }
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
        let pending = Pending {
            asker,
            followers: Vec::new(),
            key: key.clone(),
            group,
            transport,
            start: upstreams.next_start(),
            deadline: now + self.settings.query_timeout,
            tries: [None; MAX_TRIES],
            ntries: 0,
        };
        let slot = self.allocate(pending);
        if let Some(key) = key {
            self.waiting.insert((key, transport), slot);
        }
        self.send_try(slot, now);
        Outcome::Waiting
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
        let Some((slot, p, t)) = self.find_try(&leg) else {
            return;
        };
        if t.leg.to != from
            || !wire::reply_matches(packet, t.leg.id, p.asker.q.question(&p.asker.query))
        {
            return;
        }
        let group = p.group;
        let took = now.saturating_duration_since(t.sent);
        if self.upstreams.get(group).note_reply(from, took) {
            self.events.push_back(Event::UpstreamRecovered {
                group,
                upstream: from,
            });
        }
        let Some(p) = self.release(slot) else { return };
        let code = wire::rcode(packet);
        // An upstream that answers but cannot resolve is no better than a silent one when the
        // cache still knows the answer (RFC 8767 §4).
        if (code == rcode::SERVFAIL || code == rcode::REFUSED) && self.serve_stale(&p, now) {
            return;
        }
        if let (Some(cache), Some(key)) = (&self.cache, p.key.clone()) {
            lock(cache).put(key, packet, now);
        }
        for asker in p.askers() {
            deliver(&mut self.outbox, &mut self.scratch, packet, asker);
        }
    }

    /// A try could not be sent, or its TCP exchange broke. If it is the query's latest try, the
    /// query moves on to the next upstream at once.
    pub fn handle_failure(&mut self, now: Instant, leg: Leg, failure: Failure) {
        let Some((slot, p, t)) = self.find_try(&leg) else {
            return;
        };
        let latest = p.ntries > 0 && p.tries[p.ntries - 1].is_some_and(|l| l.leg == t.leg);
        let group = p.group;
        self.keys.remove(&TryKey::of(&leg));
        self.note_failure(group, leg.to, failure);
        if latest {
            self.send_try(slot, now);
        }
    }

    /// Expires tries whose time is up: each moves on to another upstream or ends in a stale
    /// answer or SERVFAIL.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(Reverse(top)) = self.timers.peek() {
            if top.at > now {
                break;
            }
            let Some(Reverse(timer)) = self.timers.pop() else {
                break;
            };
            let entry = &self.slots[timer.slot as usize];
            let Some(p) = entry
                .pending
                .as_ref()
                .filter(|_| entry.generation == timer.generation)
            else {
                continue;
            };
            // Only the latest try's timer moves the query on; a try that failed already did.
            if timer.try_no + 1 != p.ntries {
                continue;
            }
            let failed = p.tries[timer.try_no].map(|t| (p.group, t.leg.to));
            if let Some((group, upstream)) = failed {
                self.note_failure(group, upstream, Failure::TimedOut);
            }
            self.send_try(timer.slot, now);
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

    fn find_try(&self, leg: &Leg) -> Option<(u32, &Pending, Try)> {
        let &(slot, generation) = self.keys.get(&TryKey::of(leg))?;
        let entry = &self.slots[slot as usize];
        let p = entry
            .pending
            .as_ref()
            .filter(|_| entry.generation == generation)?;
        let t = p.tries.iter().flatten().find(|t| t.leg == *leg)?;
        Some((slot, p, *t))
    }

    fn note_failure(&mut self, group: UpstreamGroup, upstream: SocketAddr, failure: Failure) {
        if failure.blames_upstream() && self.upstreams.get(group).note_failure(upstream) {
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

    fn release(&mut self, slot: u32) -> Option<Pending> {
        let entry = &mut self.slots[slot as usize];
        let pending = entry.pending.take()?;
        entry.generation = entry.generation.wrapping_add(1);
        for t in pending.tries.iter().flatten() {
            self.keys.remove(&TryKey::of(&t.leg));
        }
        if let Some(key) = &pending.key {
            self.waiting.remove(&(key.clone(), pending.transport));
        }
        self.free.push(slot);
        self.inflight -= 1;
        Some(pending)
    }

    /// Queues the query's next try, or gives up once its time or tries are used up.
    fn send_try(&mut self, slot: u32, now: Instant) {
        loop {
            let generation = self.slots[slot as usize].generation;
            let Some(p) = self.slots[slot as usize].pending.as_mut() else {
                return;
            };
            if p.ntries == MAX_TRIES || now >= p.deadline {
                self.give_up(slot, now);
                return;
            }
            let tried: [SocketAddr; MAX_TRIES] =
                std::array::from_fn(|i| p.tries[i].map_or(UNSPECIFIED, |t| t.leg.to));
            let set = self.upstreams.get(p.group).clone();
            let Some(upstream) = set.pick(p.start, &tried[..p.ntries]) else {
                self.give_up(slot, now);
                return;
            };
            let try_no = p.ntries;
            p.ntries += 1;
            let (group, transport) = (p.group, p.transport);
            let leg = match transport {
                Transport::Udp => {
                    let (base, count) = match upstream {
                        SocketAddr::V4(_) => (0, self.settings.udp_sockets_v4),
                        SocketAddr::V6(_) => {
                            (self.settings.udp_sockets_v4, self.settings.udp_sockets_v6)
                        }
                    };
                    if count == 0 {
                        self.note_failure(group, upstream, Failure::NoSocket);
                        continue;
                    }
                    let socket = base + self.rng.random_range(0..count);
                    self.free_leg(Via::Udp { socket }, upstream)
                }
                Transport::Tcp => self.free_leg(Via::Tcp, upstream),
            };
            let Some(leg) = leg else {
                // Every ID drawn is in use: our own limit, not the upstream's.
                continue;
            };
            let p = self.slots[slot as usize]
                .pending
                .as_mut()
                .expect("checked above");
            p.tries[try_no] = Some(Try { leg, sent: now });
            let at = (now + self.settings.upstream_timeout).min(p.deadline);
            self.keys.insert(TryKey::of(&leg), (slot, generation));
            self.timers.push(Reverse(Timer {
                at,
                slot,
                generation,
                try_no,
            }));
            set.note_sent(upstream);
            self.outbox.push_with(Dest::Upstream(leg), |out| {
                answer::upstream_query(&p.asker.query, &p.asker.q, leg.id, out);
            });
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
            (!self.keys.contains_key(&TryKey::of(&leg))).then_some(leg)
        })
    }

    /// Every try failed: a stale answer if the cache has one (RFC 8767), else SERVFAIL.
    fn give_up(&mut self, slot: u32, now: Instant) {
        let Some(p) = self.release(slot) else { return };
        if self.serve_stale(&p, now) {
            return;
        }
        for asker in p.askers() {
            wire::local_reply(&asker.query, &asker.q, rcode::SERVFAIL, &mut self.scratch);
            self.outbox.push(Dest::Client(asker.client), &self.scratch);
        }
    }

    /// Answers everyone waiting on `p` from an expired cache entry, if there is one.
    fn serve_stale(&mut self, p: &Pending, now: Instant) -> bool {
        let (Some(cache), Some(key)) = (&self.cache, &p.key) else {
            return false;
        };
        if !lock(cache).get_stale(key, now, &mut self.answer) {
            return false;
        }
        let answers = 1 + p.followers.len();
        self.stats.stale.fetch_add(answers as u64, RELAXED);
        self.events.push_back(Event::ServedStale { answers });
        for asker in p.askers() {
            deliver(&mut self.outbox, &mut self.scratch, &self.answer, asker);
        }
        true
    }
}

/// Queues `reply` for `asker` as an answer to its own query: its ID, its spelling of the
/// question, and cut to a TC reply if larger than it can take.
fn deliver(outbox: &mut Outbox, scratch: &mut Vec<u8>, reply: &[u8], asker: &Asker) {
    let limit = asker.limit();
    outbox.push_with(Dest::Client(asker.client), |out| {
        answer::for_asker(reply, &asker.query, &asker.q, limit, out, scratch);
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

const UNSPECIFIED: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    0,
));
