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
//! A query's life: its first try goes to the upstream [`crate::upstream::UpstreamSet::choose`] picks. If that one
//! has not answered within its usual time (its RTT plus deviations, at least `HEDGE_FLOOR`), the
//! query is also sent to the next upstream (a hedge: at most one per query, and hedges stay a
//! bounded share of the load); if a try's budget runs out, or the network refuses it, or the
//! upstream answers SERVFAIL, REFUSED or NOTIMP, the next upstream is tried at once. The first
//! acceptable answer wins. When nothing is left to try: a stale cached answer, else the error an
//! upstream gave, else SERVFAIL.

mod answers;
mod boundary;
mod outbox;
mod pending;
pub mod route;
#[cfg(test)]
mod tests;
mod tries;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cache::{Cache, Hit, Key, KeyHasher};
use crate::roles::{ListenerRole, Transport, UpstreamGroup};
use crate::stats::ListenerStats;
use crate::upstream::UpstreamSets;
use crate::wire::{self, rcode};
use answers::{deliver, lock, reply_limit};
pub use boundary::{Client, ConnId, Dest, Event, Failure, Leg, Outcome, Settings, Transmit, Via};
use outbox::Outbox;
use pending::{Asker, MAX_TRIES, Orphan, Pending, Slot, Timer, TimerKind, TryKey};
use route::{Decision, Routes};

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
/// How long tries go through one UDP socket before another is drawn.
const SOCKET_RUN: Duration = Duration::from_millis(10);
/// Query buffers kept for reuse, so a query costs no allocation: as many as were in flight at
/// once, up to 1,024 of at most 512 bytes (512 KiB per relay thread at worst; a bigger query is
/// allocated and freed as before).
const SPARE_QUERIES: usize = 1024;
const SPARE_QUERY_BYTES: usize = 512;
/// How long a name whose resolution failed is answered SERVFAIL at once (RFC 9520 asks for at
/// least a second; longer would outlast a recovered upstream).
const FAILURE_MEMORY: Duration = Duration::from_secs(1);
/// Names whose refresh failed, remembered for the failure-recheck timer; beyond this the oldest
/// memories go.
const RECHECK_CAP: usize = 4096;

/// The engine's hash maps. std's SipHash took about a tenth of the relay's CPU per query;
/// foldhash is several times faster. Its seed comes from the engine's seed, secret like the query
/// IDs, so a client cannot aim names at one bucket; and every map is bounded (by
/// `--max-inflight` or `RECHECK_CAP`), so even a perfect collision costs little.
type Map<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// The decisions of one relay thread of one listener. Not shared: each thread has its own; they
/// share the upstream sets (and their health), the cache and the counters.
pub struct Engine {
    role: ListenerRole,
    settings: Settings,
    /// Which group this listener sends each name to.
    routes: Routes,
    upstreams: Arc<UpstreamSets>,
    cache: Option<Arc<Mutex<Cache>>>,
    /// The cache's key hasher, copied so that making a key takes no lock; `None` with no cache.
    key_hasher: Option<KeyHasher>,
    stats: Arc<ListenerStats>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Queries in flight per group (`UpstreamGroup as usize`): one group may hold at most three
    /// quarters of `--max-inflight`, so a hung kube-dns behind a flood of cluster names on the
    /// node listener leaves room for the VNet DNS's queries.
    by_group: [usize; 2],
    /// Every try still awaited → (slot, generation).
    keys: Map<TryKey, (u32, u32)>,
    /// Tries still out whose queries are done.
    orphans: Map<TryKey, Orphan>,
    orphan_timers: BinaryHeap<Reverse<(Instant, TryKey)>>,
    /// Queries on their way upstream by cache key, for coalescing; one map per transport
    /// (`Transport as usize`), so a lookup needs no key of its own.
    waiting: [Map<Key, u32>; 2],
    /// When a refresh of each name last failed (serve-stale's failure-recheck timer).
    recheck: Map<Key, Instant>,
    /// When a query for each name last ended without any reply from any upstream (an error
    /// reply is the upstream's answer and is passed on each time, as LocalDNS does).
    unanswered: Map<Key, Instant>,
    timers: BinaryHeap<Reverse<Timer>>,
    hedge_tokens: u32,
    /// The UDP socket tries go through now, and until when (see `udp_socket`).
    socket_run: (usize, Option<Instant>),
    /// Query IDs and socket choices must be unpredictable to an off-path spoofer.
    rng: StdRng,
    outbox: Outbox,
    events: VecDeque<Event>,
    /// Buffers of answered queries, for the next ones (`Pending::query`).
    spare_queries: Vec<Vec<u8>>,
    /// A cached answer being handed out.
    answer: Vec<u8>,
    scratch: Vec<u8>,
}

/// A query about to go in flight ([`Engine::start`]): the client's query as routed.
struct Start<'a> {
    /// `None` for a query only to refresh the cache.
    client: Option<Client>,
    packet: &'a [u8],
    q: wire::Query,
    key: Option<Key>,
    group: UpstreamGroup,
    transport: Transport,
    /// An expired answer is cached: the client may get it if the upstreams are slow.
    stale_known: bool,
}

impl Engine {
    pub fn new(
        role: ListenerRole,
        settings: Settings,
        routes: Routes,
        upstreams: Arc<UpstreamSets>,
        cache: Option<Arc<Mutex<Cache>>>,
        stats: Arc<ListenerStats>,
        seed: [u8; 32],
    ) -> Engine {
        let mut rng = StdRng::from_seed(seed);
        let hasher = foldhash::fast::FixedState::with_seed(rng.random());
        let key_hasher = cache.as_ref().map(|c| lock(c).hasher().clone());
        Engine {
            role,
            settings,
            routes,
            upstreams,
            cache,
            key_hasher,
            stats,
            slots: Vec::new(),
            free: Vec::new(),
            by_group: [0; 2],
            keys: Map::with_hasher(hasher.clone()),
            orphans: Map::with_hasher(hasher.clone()),
            orphan_timers: BinaryHeap::new(),
            waiting: std::array::from_fn(|_| Map::with_hasher(hasher.clone())),
            recheck: Map::with_hasher(hasher.clone()),
            unanswered: Map::with_hasher(hasher),
            timers: BinaryHeap::new(),
            hedge_tokens: HEDGE_BURST,
            socket_run: (0, None),
            rng,
            outbox: Outbox::default(),
            events: VecDeque::new(),
            spare_queries: Vec::new(),
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

    /// Whether this listener's routes send any name to `group`.
    pub fn sends_to(&self, group: UpstreamGroup) -> bool {
        self.routes.reaches(self.role, group)
    }

    pub fn inflight(&self) -> usize {
        self.by_group.iter().sum()
    }

    /// The next transmit, until there are none.
    pub fn poll_transmit(&mut self) -> Option<Transmit<'_>> {
        self.outbox.pop()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Can a query of `group` go in flight (see `by_group`)?
    fn room_for(&self, group: UpstreamGroup) -> bool {
        let max = self.settings.max_inflight;
        self.inflight() < max && self.by_group[group as usize] < max - max / 4
    }

    /// When [`Engine::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let tries = self.timers.peek().map(|Reverse(t)| t.at);
        let orphans = self.orphan_timers.peek().map(|Reverse((at, _))| *at);
        tries.into_iter().chain(orphans).min()
    }

    /// A client's query (a datagram, or one message of a TCP stream).
    pub fn handle_query(&mut self, now: Instant, client: Client, packet: &[u8]) -> Outcome {
        let tables = (&self.routes, &*self.upstreams.hosts);
        let tcp = client.transport() == Transport::Tcp;
        let decision = route::decide(self.role, packet, tables, tcp, &mut self.scratch);
        let (q, group) = match decision {
            Decision::Drop => {
                self.stats.dropped.fetch_add(1, RELAXED);
                return Outcome::Dropped;
            }
            Decision::Answered => {
                self.outbox.push(Dest::Client(client), &self.scratch);
                return Outcome::Answered;
            }
            Decision::Forward(q, group) => (q, group),
        };
        let transport = client.transport();
        let key = self
            .key_hasher
            .as_ref()
            .and_then(|h| Key::new(h, group, packet, &q));
        let hit = key
            .as_ref()
            .and_then(|key| lock(self.cache.as_ref()?).get(key, now, &mut self.answer));
        if hit == Some(Hit::Fresh) {
            self.stats.cache_hits.fetch_add(1, RELAXED);
            deliver(&mut self.outbox, &self.answer, client, packet, &q);
            return Outcome::Answered;
        }
        let s = Start {
            client: Some(client),
            packet,
            q,
            key,
            group,
            transport,
            stale_known: hit == Some(Hit::Stale),
        };
        let (mut waiting, mut failed_just_now) = (None, false);
        if let Some(key) = &s.key {
            self.stats.cache_misses.fetch_add(1, RELAXED);
            waiting = self.waiting[transport as usize].get(key).copied();
            // The failure-recheck timer: this name failed lately; answer stale at once, and keep
            // (at most) one refresh going.
            let failed_lately = self
                .recheck
                .get(key)
                .is_some_and(|t| now.saturating_duration_since(*t) < self.settings.stale_recheck);
            if s.stale_known && failed_lately {
                self.serve_stale_to(client, packet, &q);
                if waiting.is_none() {
                    let key = Some(key.clone());
                    self.refresh_in_background(now, Start { key, ..s });
                }
                return Outcome::Answered;
            }
            failed_just_now = !s.stale_known
                && !self.unanswered.is_empty()
                && self
                    .unanswered
                    .get(key)
                    .is_some_and(|t| now.saturating_duration_since(*t) < FAILURE_MEMORY);
        }
        // Every upstream of the group is down, or no upstream answered this name a moment ago
        // (RFC 9520's resolution-failure cache): answered at once rather than after a whole query
        // budget.
        let down = self
            .upstreams
            .get(group)
            .down(now, self.settings.query_timeout);
        if failed_just_now || down {
            if s.stale_known {
                self.serve_stale_to(client, packet, &q);
            } else {
                self.reply_local(client, packet, &q, rcode::SERVFAIL);
            }
            // While the group is down, a query goes on in the background whenever a probe is due,
            // so the moment an upstream answers, forwarding resumes (and the cache is refreshed).
            if waiting.is_none() && down && self.upstreams.get(group).probe_due(now) {
                self.refresh_in_background(now, s);
            }
            return Outcome::Answered;
        }
        if let Some(slot) = waiting {
            let p = self.pending_mut(slot);
            if p.stale_served && s.stale_known {
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
        // Shed load with an explicit REFUSED: the client learns at once and memory stays flat.
        let shed = !self.room_for(group);
        if shed || self.upstreams.get(group).is_empty() {
            let code = if shed {
                self.stats.shed.fetch_add(1, RELAXED);
                rcode::REFUSED
            } else {
                rcode::SERVFAIL
            };
            self.reply_local(client, packet, &q, code);
            return Outcome::Answered;
        }
        self.start(now, s);
        Outcome::Waiting
    }

    /// A reply of our own to one client: its question, no records, this RCODE.
    fn reply_local(&mut self, client: Client, packet: &[u8], q: &wire::Query, code: u8) {
        self.outbox.push_with(Dest::Client(client), |out| {
            wire::local_reply(packet, q, code, out);
        });
    }

    /// `s` with no client, only to refresh the cache or probe an upstream. It is in flight like
    /// any other, so never over the cap.
    fn refresh_in_background(&mut self, now: Instant, mut s: Start) {
        if self.room_for(s.group) {
            (s.client, s.stale_known) = (None, false);
            self.start(now, s);
        }
    }

    /// Asks each group this listener sends to a question of our own when one is due (see
    /// [`crate::upstream::UpstreamSet::question_due`]), through the upstream sockets like any
    /// query: its answer feeds health and reaches no client. Only while `standing_by` (a standby
    /// beside a LocalDNS that holds the flows): else pods' queries tell what they get.
    pub fn ask_if_due(&mut self, now: Instant, standing_by: bool) {
        for group in UpstreamGroup::BOTH {
            let asks = standing_by && self.sends_to(group) && self.room_for(group);
            if !asks || !self.upstreams.get(group).question_due(now) {
                continue;
            }
            // kube-dns a name every cluster has, the VNet DNS the root's NS.
            let packet = match group {
                UpstreamGroup::KubeDns => wire::question(&self.routes.kubernetes, 1),
                UpstreamGroup::VnetDns => wire::question(b"\0", 2),
            };
            if let Ok(q) = wire::parse_query(&packet) {
                let s = Start {
                    client: None,
                    packet: &packet,
                    q,
                    key: None,
                    group,
                    transport: Transport::Udp,
                    stale_known: false,
                };
                self.start(now, s);
            }
        }
    }

    /// A new query in flight.
    fn start(&mut self, now: Instant, s: Start) {
        self.hedge_tokens = (self.hedge_tokens + 1).min(HEDGE_BURST);
        let mut query = self.spare_queries.pop().unwrap_or_default();
        query.extend_from_slice(s.packet);
        let pending = Pending {
            query,
            q: s.q,
            client: s.client,
            followers: Vec::new(),
            key: s.key.clone(),
            group: s.group,
            transport: s.transport,
            start: self.upstreams.get(s.group).next_start(),
            deadline: now + self.settings.query_timeout,
            tries: [None; MAX_TRIES],
            ntries: 0,
            hedged: false,
            stale_served: false,
            error_reply: None,
            refetch: None,
        };
        let slot = self.allocate(pending);
        if let Some(key) = s.key {
            self.waiting[s.transport as usize].insert(key, slot);
        }
        // The client-response timer: an expired answer beats making the client wait out a
        // failing upstream.
        if s.stale_known
            && s.client.is_some()
            && self.settings.stale_after < self.settings.query_timeout
        {
            self.arm(slot, 0, now + self.settings.stale_after, TimerKind::Stale);
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
        if let Some(orphan) = self.take_orphan(&leg) {
            let end = wire::question_name_end(packet, wire::HEADER_LEN);
            let name = end.and_then(|end| packet.get(wire::HEADER_LEN..end));
            // A reply with another question is a spoof (it kept a dead server alive, so its
            // group was never known down), and the real reply may still come. (An error with no
            // question matches on ID and source alone.)
            let question = u16::from_be_bytes([packet[4], packet[5]]) != 0;
            if question && name.is_none_or(|n| pending::name_hash(n) != orphan.name) {
                self.orphans.insert(TryKey::of(&leg), orphan);
                return;
            }
            // A late answer to a query already answered: it still proves the upstream alive.
            let took = now.saturating_duration_since(orphan.sent);
            self.note_reply(orphan.group, from, took, orphan.counted, now);
            // The name was answered after all, only late: not one to fail at once.
            if let Some(name) = name.filter(|_| !self.unanswered.is_empty()) {
                self.unanswered.retain(|k, _| !k.is_for(name));
            }
            return;
        }
        let Some((slot, try_no)) = self.find_try(&leg) else {
            return;
        };
        let p = self.slots[slot as usize]
            .pending
            .as_ref()
            .expect("a live slot");
        if !wire::reply_matches(packet, leg.id, p.q.question(&p.query)) {
            return;
        }
        // The name is answered (an error too is the upstream's answer): not one to fail at once.
        if let Some(key) = p.key.as_ref().filter(|_| !self.unanswered.is_empty()) {
            self.unanswered.remove(key);
        }
        let code = wire::rcode(packet);
        let has_question = u16::from_be_bytes([packet[4], packet[5]]) == 1;
        // A reply without a question is acceptable only as an error (FORMERR, BADVERS from a
        // server that chokes on the query); glibc discards a NOERROR one and waits out its timeout.
        if !has_question && code == rcode::NOERROR {
            return;
        }
        let group = p.group;
        let (sent, counted) = p.tries[try_no].map_or((now, false), |t| (t.sent, t.counted));
        let took = now.saturating_duration_since(sent);
        // We advertise at most 1232 bytes upstream, so the UDP leg never needs fragments; an
        // asker that takes more gets the whole answer fetched over TCP instead of a cut one. A
        // truncated reply with no answer record at all (dnsmasq, unbound and others cut that way)
        // is fetched whole too: cut at record boundaries it gives even a 512-byte asker that
        // never retries over TCP (musl before 1.2.4, busybox) the records that fit.
        let wants_more = || {
            wire::counts(packet)[1] == 0
                || p.askers()
                    .any(|(client, _, q)| reply_limit(client, q) > usize::from(wire::OUR_EDNS_SIZE))
        };
        if wire::is_truncated(packet) && matches!(via, Via::Udp { .. }) && wants_more() {
            let refetch = p.ntries < MAX_TRIES && now < p.deadline;
            // With no try left, a truncated answer is passed on only when nothing else is out:
            // another try, a fetch over TCP among them, may still bring the whole answer.
            let others_out = p
                .tries
                .iter()
                .enumerate()
                .any(|(i, t)| i != try_no && t.is_some_and(|t| t.live));
            if refetch || others_out {
                self.end_try(slot, try_no, false);
                self.note_reply(group, from, took, counted, now);
                if refetch {
                    self.pending_mut(slot).refetch = Some(from);
                    self.next_try(slot, now);
                }
                return;
            }
        }
        self.end_try(slot, try_no, false);
        if matches!(code, rcode::SERVFAIL | rcode::REFUSED | rcode::NOTIMP) || !has_question {
            // Errors are not answers: another upstream may resolve it.
            self.note_error(group, from, Failure::ErrorReply(code), counted, sent, now);
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
        self.note_reply(group, from, took, counted, now);
        let Some(mut p) = self.release(slot, now) else {
            return;
        };
        if let (Some(cache), Some(key)) = (&self.cache, p.key.take()) {
            lock(cache).put(key, packet, now);
        }
        for (client, query, q) in p.askers() {
            deliver(&mut self.outbox, packet, client, query, q);
        }
        let mut query = p.query;
        if self.spare_queries.len() < SPARE_QUERIES && query.capacity() <= SPARE_QUERY_BYTES {
            query.clear();
            self.spare_queries.push(query);
        }
    }

    /// A try could not be sent, or its TCP exchange broke: the query moves on at once.
    pub fn handle_failure(&mut self, now: Instant, leg: Leg, failure: Failure) {
        let refused = Failure::Network(std::io::ErrorKind::ConnectionRefused);
        if matches!(leg.via, Via::Udp { .. }) && failure == refused {
            // ICMP port unreachable: every try at that upstream is as good as lost.
            self.handle_unreachable(now, leg.to);
            return;
        }
        if let Some(o) = self.take_orphan(&leg) {
            self.note_error(o.group, leg.to, failure, o.counted, o.sent, now);
            return;
        }
        let Some((slot, try_no)) = self.find_try(&leg) else {
            return;
        };
        let p = self.pending(slot);
        let (sent, counted) = p.tries[try_no].map_or((now, false), |t| (t.sent, t.counted));
        let group = p.group;
        self.end_try(slot, try_no, false);
        self.note_error(group, leg.to, failure, counted, sent, now);
        self.next_try(slot, now);
    }

    /// The network says `upstream` cannot be reached over UDP (an ICMP error on a socket connected
    /// to it). The kernel rate-limits those errors, so one stands for every try out there: each
    /// moves on at once, and the upstream is tried after the others until it answers again.
    pub fn handle_unreachable(&mut self, now: Instant, upstream: SocketAddr) {
        let failure = Failure::Network(std::io::ErrorKind::ConnectionRefused);
        for group in UpstreamGroup::BOTH {
            if self.upstreams.get(group).contains(upstream) {
                self.note_error(group, upstream, failure, false, now, now);
            }
        }
        let upstreams = self.upstreams.clone();
        self.orphans.retain(|k, o| {
            let hit = matches!(k, TryKey::Udp(to, ..) if *to == upstream);
            if hit && o.counted {
                upstreams.get(o.group).end_try(upstream);
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
            let Some(p) = self.slots[slot as usize].holds(generation) else {
                continue;
            };
            let Some(try_no) = p
                .tries
                .iter()
                .position(|t| t.is_some_and(|t| TryKey::of(&t.leg) == key))
            else {
                continue;
            };
            if p.tries[try_no].is_some_and(|t| t.counted) {
                self.upstreams.get(p.group).end_try(upstream);
            }
            self.end_try(slot, try_no, false);
            self.next_try(slot, now);
        }
    }

    /// Runs every timer that is due: tries out of budget, hedges, serve-stale's client-response
    /// timer, and the deadlines of orphaned tries.
    pub fn handle_timeout(&mut self, now: Instant) {
        // A timer whose query has ended is dead, and goes as soon as it is at the top, due or
        // not, so poll_timeout never wakes the thread for it: nearly every query is answered
        // before its hedge timer (5 ms at least).
        while let Some(Reverse(top)) = self.timers.peek() {
            let live = self.slots[top.slot as usize]
                .holds(top.generation)
                .is_some();
            if live && top.at > now {
                break;
            }
            let Some(Reverse(timer)) = self.timers.pop() else {
                break;
            };
            if !live {
                continue;
            }
            match timer.kind {
                TimerKind::TryTimeout => self.try_timed_out(timer.slot, timer.try_no.into(), now),
                TimerKind::Hedge => self.hedge(timer.slot, timer.try_no.into(), now),
                TimerKind::Stale => self.stale_timer(timer.slot, now),
            }
        }
        while let Some(Reverse((at, key))) = self.orphan_timers.peek().copied() {
            if at > now {
                break;
            }
            self.orphan_timers.pop();
            let Some(kept) = self.orphans.get_mut(&key).filter(|o| o.deadline == at) else {
                continue;
            };
            if kept.judged {
                self.orphans.remove(&key);
                continue;
            }
            // Lost for its whole time; a late reply is still awaited, as for any try.
            let o = *kept;
            let late = (o.sent + self.settings.query_timeout).max(at);
            (kept.judged, kept.counted, kept.deadline) = (true, false, late);
            self.orphan_timers.push(Reverse((late, key)));
            self.note_timeout(o.group, key.upstream(), o.counted, o.name, o.sent, now);
        }
        // Timers of answered queries stay in the heap until they expire; at very high rates that
        // is many, so drop them early rather than let the heap grow with the query rate.
        if self.timers.len() > 4 * (self.settings.max_inflight + 1024) {
            let slots = &self.slots;
            self.timers
                .retain(|Reverse(t)| slots[t.slot as usize].holds(t.generation).is_some());
        }
    }

    /// The orphan a leg belongs to, taken out. Most of the time there are none, and a map's
    /// `remove` hashes its key even when the map is empty.
    fn take_orphan(&mut self, leg: &Leg) -> Option<Orphan> {
        if self.orphans.is_empty() {
            return None;
        }
        self.orphans.remove(&TryKey::of(leg))
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
}

const RELAXED: std::sync::atomic::Ordering = std::sync::atomic::Ordering::Relaxed;
