//! The forwarding path: what happens to a query from the moment it is read until its answer (or
//! SERVFAIL) is sent back.
//!
//! UDP is the hot path. One task per listener reads a datagram, decides, and sends it upstream
//! itself, and the same task reads the upstream replies and sends them to the clients: no channel
//! and no task spawn between reading and sending (CONTEXT §6 measured hand-offs as the real cost of
//! a relay). The decisions live in [`UdpRelay`], which owns no socket and no clock, so its unit
//! tests drive it with plain bytes and instants; [`serve_udp`] only moves bytes in and out of it.
//!
//! TCP is the rare path (truncated answers, some clients): a task per connection, a task per
//! pipelined query, and a fresh TCP connection upstream per query.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::PollTimeout;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

use crate::cache::{Cache, Key};
use crate::cli::Config;
use crate::metrics::{ListenerStats, Metrics, Transport};
use crate::systemd::Heartbeats;
use crate::upstream::{Group, Upstreams};
use crate::wire::{self, Reject, rcode};

/// The most tries one query makes; the query deadline usually ends it first.
const MAX_TRIES: usize = 4;
/// Identical queries that may wait on one upstream query; more start their own.
const MAX_FOLLOWERS: usize = 256;
/// Datagrams read from one socket before looking at the others, so no socket starves the rest.
const BATCH: usize = 64;
/// Room for the largest datagram UDP can carry: upstream answers are never cut by us.
const MAX_DATAGRAM: usize = 65535;
/// Longest an idle UDP loop sleeps before going round (and beating its heartbeat) again.
const HEARTBEAT_IDLE: Duration = Duration::from_millis(500);
/// Queries one TCP client connection may have in flight at once (RFC 7766 pipelining).
const TCP_PIPELINE: usize = 32;

/// Names LocalDNS answers itself (CONTEXT §2), in lower-case wire form.
const HEALTH_CHECK: &[u8] = b"\x0chealth-check\x08localdns\x05local\x00";
const REDDOG: &[u8] = b"\x06reddog\x09microsoft\x03com\x00";
const CLOUDAPP_INTERNAL: &[u8] = b"\x08internal\x08cloudapp\x03net\x00";

/// Which of the two listeners a query arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// 169.254.10.10: the host, hostNetwork and dnsPolicy=Default pods.
    Node,
    /// 169.254.10.11: ClusterFirst pods.
    Cluster,
}

impl Listener {
    pub fn name(self) -> &'static str {
        match self {
            Listener::Node => "node",
            Listener::Cluster => "cluster",
        }
    }
}

/// Where a query goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Answered by us with this RCODE and no records.
    Local(u8),
    Upstream(Group),
}

/// LocalDNS's routing: the health-check name and search-path junk are answered locally; the
/// cluster listener sends everything to kube-dns; the node listener sends the cluster domain to
/// kube-dns and the rest to the VNet DNS.
pub fn route(listener: Listener, name: &[u8], cluster_domain: &[u8]) -> Route {
    if name.eq_ignore_ascii_case(HEALTH_CHECK) {
        return Route::Local(rcode::NOERROR);
    }
    // Search-path expansion of names like `a.b.c.d` on Azure produces these; nothing real lives
    // there and the VNet DNS would be asked for each of them.
    if wire::name_is_under(name, REDDOG)
        || wire::labels_below(name, CLOUDAPP_INTERNAL).is_some_and(|n| n >= 4)
    {
        return Route::Local(rcode::NXDOMAIN);
    }
    match listener {
        Listener::Cluster => Route::Upstream(Group::Cluster),
        Listener::Node if wire::name_is_under(name, cluster_domain) => {
            Route::Upstream(Group::Cluster)
        }
        Listener::Node => Route::Upstream(Group::Node),
    }
}

/// What to do with a client's packet.
enum Decision {
    Drop,
    /// A reply of our own is in the output buffer.
    Answered,
    Forward(wire::Query, Group),
}

fn decide(listener: Listener, packet: &[u8], cluster_domain: &[u8], out: &mut Vec<u8>) -> Decision {
    match wire::parse_query(packet) {
        Err(Reject::Drop) => Decision::Drop,
        Err(Reject::Reply(code)) => {
            wire::header_only_reply(packet, code, out);
            Decision::Answered
        }
        Ok(q) => match route(listener, q.name(packet), cluster_domain) {
            Route::Local(code) => {
                wire::local_reply(packet, &q, code, out);
                Decision::Answered
            }
            Route::Upstream(group) => Decision::Forward(q, group),
        },
    }
}

/// The upstream groups in force; replaced whole when discovery finds a new set.
#[derive(Debug)]
pub struct Groups {
    pub node: Arc<Upstreams>,
    pub cluster: Arc<Upstreams>,
}

impl Groups {
    pub fn get(&self, group: Group) -> &Arc<Upstreams> {
        match group {
            Group::Node => &self.node,
            Group::Cluster => &self.cluster,
        }
    }
}

/// Where the relay wants a datagram sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    Client(SocketAddr),
    /// Through upstream socket number `socket` of the worker's pool.
    Upstream {
        socket: usize,
        to: SocketAddr,
    },
}

/// One try of a query at one upstream.
#[derive(Clone, Copy, Debug)]
struct Try {
    /// Socket index and query ID: how the reply finds its way back to the query.
    key: u32,
    upstream: SocketAddr,
    id: u16,
    sent: Instant,
}

/// A client waiting for an answer: where to send it and how it asked (its ID, spelling and EDNS
/// size go back into the answer).
struct Asker {
    client: SocketAddr,
    query: Box<[u8]>,
    q: wire::Query,
}

/// A client's UDP query waiting for an upstream, with any identical queries that arrived while
/// it was on its way (they share its answer instead of multiplying upstream load).
struct Pending {
    asker: Asker,
    followers: Vec<Asker>,
    /// The cache key, when the cache is on: also the coalescing key.
    key: Option<Key>,
    group: Group,
    /// The query's starting point in the upstream rotation.
    start: usize,
    deadline: Instant,
    tries: [Option<Try>; MAX_TRIES],
    ntries: usize,
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

/// The UDP relay of one listener, without sockets or clock: feed it datagrams and the time, and it
/// tells a sink what to send where.
pub struct UdpRelay {
    listener: Listener,
    cluster_domain: Vec<u8>,
    upstream_timeout: Duration,
    query_timeout: Duration,
    max_inflight: usize,
    groups: Arc<Groups>,
    cache: Option<Arc<Mutex<Cache>>>,
    metrics: Arc<Metrics>,
    /// Upstream sockets `0..v4_sockets` are IPv4, the next `v6_sockets` IPv6.
    v4_sockets: usize,
    v6_sockets: usize,
    slots: Vec<Slot>,
    free: Vec<u32>,
    inflight: usize,
    /// (socket, ID) of every try still awaited → (slot, generation).
    keys: HashMap<u32, (u32, u32)>,
    /// Queries on their way upstream by cache key, for coalescing.
    waiting: HashMap<Key, u32>,
    timers: BinaryHeap<Reverse<Timer>>,
    /// Query IDs and socket choices must be unpredictable to an off-path spoofer (CONTEXT §5).
    rng: StdRng,
    out: Vec<u8>,
    scratch: Vec<u8>,
}

impl UdpRelay {
    pub fn new(
        listener: Listener,
        config: &Config,
        groups: Arc<Groups>,
        cache: Option<Arc<Mutex<Cache>>>,
        metrics: Arc<Metrics>,
        (v4_sockets, v6_sockets): (usize, usize),
    ) -> UdpRelay {
        UdpRelay {
            listener,
            cluster_domain: config.cluster_domain_wire.clone(),
            upstream_timeout: config.upstream_timeout,
            query_timeout: config.query_timeout,
            max_inflight: config.max_inflight,
            groups,
            cache,
            metrics,
            v4_sockets,
            v6_sockets,
            slots: Vec::new(),
            free: Vec::new(),
            inflight: 0,
            keys: HashMap::new(),
            waiting: HashMap::new(),
            timers: BinaryHeap::new(),
            rng: StdRng::from_os_rng(),
            out: Vec::with_capacity(MAX_DATAGRAM),
            scratch: Vec::with_capacity(MAX_DATAGRAM),
        }
    }

    pub fn set_groups(&mut self, groups: Arc<Groups>) {
        self.groups = groups;
    }

    pub fn inflight(&self) -> usize {
        self.inflight
    }

    fn stats(&self) -> &ListenerStats {
        self.metrics.listener(self.listener)
    }

    /// The earliest try deadline, for the IO loop's sleep.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse(t)| t.at)
    }

    /// A datagram from a client.
    pub fn on_query<S>(&mut self, packet: &[u8], client: SocketAddr, now: Instant, sink: &mut S)
    where
        S: FnMut(Dest, &[u8]) -> io::Result<()>,
    {
        let (q, group) = match decide(self.listener, packet, &self.cluster_domain, &mut self.out) {
            Decision::Drop => {
                self.stats().dropped();
                return;
            }
            Decision::Answered => {
                let _ = sink(Dest::Client(client), &self.out);
                return;
            }
            Decision::Forward(q, group) => (q, group),
        };
        let asker = Asker {
            client,
            query: packet.into(),
            q,
        };
        let key = self.cache.as_ref().map(|_| Key::new(group, packet, &q));
        if let (Some(cache), Some(key)) = (&self.cache, &key) {
            if lock(cache).get_fresh(key, now, &mut self.scratch) {
                self.stats().cache_hit();
                let reply = std::mem::take(&mut self.scratch);
                self.deliver(&reply, &asker, sink);
                self.scratch = reply;
                return;
            }
            self.stats().cache_miss();
            if let Some(&slot) = self.waiting.get(key) {
                if let Some(p) = self.slots[slot as usize].pending.as_mut() {
                    if p.followers.len() < MAX_FOLLOWERS {
                        p.followers.push(asker);
                        return;
                    }
                }
            }
        }
        let upstreams = self.groups.get(group);
        // Shed load with an explicit REFUSED: the client learns at once and memory stays flat.
        let shed = self.inflight >= self.max_inflight;
        if shed {
            self.stats().shed();
        }
        if shed || upstreams.is_empty() {
            let code = if shed {
                rcode::REFUSED
            } else {
                rcode::SERVFAIL
            };
            wire::local_reply(packet, &q, code, &mut self.out);
            let _ = sink(Dest::Client(client), &self.out);
            return;
        }
        let pending = Pending {
            asker,
            followers: Vec::new(),
            key: key.clone(),
            group,
            start: upstreams.next_start(),
            deadline: now + self.query_timeout,
            tries: [None; MAX_TRIES],
            ntries: 0,
        };
        let slot = self.allocate(pending);
        if let Some(key) = key {
            self.waiting.insert(key, slot);
        }
        self.send_try(slot, now, sink);
    }

    /// Sends `reply` to `asker` as an answer to its own query: its ID, its spelling of the
    /// question, and cut to a TC reply if larger than it can take over UDP.
    fn deliver<S>(&mut self, reply: &[u8], asker: &Asker, sink: &mut S)
    where
        S: FnMut(Dest, &[u8]) -> io::Result<()>,
    {
        let question = asker.q.question(&asker.query);
        self.out.clear();
        self.out.extend_from_slice(reply);
        wire::restore_for_client(&mut self.out, asker.q.id, question);
        if self.out.len() > usize::from(asker.q.udp_size) {
            let full = std::mem::take(&mut self.out);
            wire::truncate_reply(&full, question.len(), asker.q.edns, &mut self.out);
            let _ = sink(Dest::Client(asker.client), &self.out);
            // Keep the larger buffer for reuse.
            self.out = full;
        } else {
            let _ = sink(Dest::Client(asker.client), &self.out);
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
            self.keys.remove(&t.key);
        }
        if let Some(key) = &pending.key {
            self.waiting.remove(key);
        }
        self.free.push(slot);
        self.inflight -= 1;
        Some(pending)
    }

    /// Sends the query's next try, or gives up once its time or tries are used up.
    fn send_try<S>(&mut self, slot: u32, now: Instant, sink: &mut S)
    where
        S: FnMut(Dest, &[u8]) -> io::Result<()>,
    {
        loop {
            let generation = self.slots[slot as usize].generation;
            let Some(p) = self.slots[slot as usize].pending.as_mut() else {
                return;
            };
            if p.ntries == MAX_TRIES || now >= p.deadline {
                self.give_up(slot, now, sink);
                return;
            }
            let tried: [SocketAddr; MAX_TRIES] =
                std::array::from_fn(|i| p.tries[i].map_or(UNSPECIFIED, |t| t.upstream));
            let upstreams = self.groups.get(p.group).clone();
            let Some(upstream) = upstreams.pick(p.start, &tried[..p.ntries]) else {
                self.give_up(slot, now, sink);
                return;
            };
            let (base, count) = match upstream {
                SocketAddr::V4(_) => (0, self.v4_sockets),
                SocketAddr::V6(_) => (self.v4_sockets, self.v6_sockets),
            };
            let try_no = p.ntries;
            p.ntries += 1;
            if count == 0 {
                upstreams.note_failure(
                    upstream,
                    p.group,
                    "has an address family this host cannot use",
                );
                continue;
            }
            let socket = base + self.rng.random_range(0..count);
            let (key, id) = loop {
                let id: u16 = self.rng.random();
                let key = (socket as u32) << 16 | u32::from(id);
                if !self.keys.contains_key(&key) {
                    break (key, id);
                }
            };
            p.tries[try_no] = Some(Try {
                key,
                upstream,
                id,
                sent: now,
            });
            let at = (now + self.upstream_timeout).min(p.deadline);
            self.out.clear();
            self.out.extend_from_slice(&p.asker.query);
            wire::set_id(&mut self.out, id);
            let group = p.group;
            self.keys.insert(key, (slot, generation));
            self.timers.push(Reverse(Timer {
                at,
                slot,
                generation,
                try_no,
            }));
            upstreams.note_sent(upstream);
            match sink(
                Dest::Upstream {
                    socket,
                    to: upstream,
                },
                &self.out,
            ) {
                Ok(()) => return,
                Err(e) => {
                    upstreams.note_failure(upstream, group, &format!("cannot be sent to ({e})"))
                }
            }
        }
    }

    /// Every try failed: a stale answer if the cache has one (RFC 8767), else SERVFAIL.
    fn give_up<S>(&mut self, slot: u32, now: Instant, sink: &mut S)
    where
        S: FnMut(Dest, &[u8]) -> io::Result<()>,
    {
        let Some(p) = self.release(slot) else { return };
        if self.serve_stale(&p, now, sink) {
            return;
        }
        for asker in std::iter::once(&p.asker).chain(&p.followers) {
            wire::local_reply(&asker.query, &asker.q, rcode::SERVFAIL, &mut self.out);
            let _ = sink(Dest::Client(asker.client), &self.out);
        }
    }

    /// Answers everyone waiting on `p` from an expired cache entry, if there is one.
    fn serve_stale<S>(&mut self, p: &Pending, now: Instant, sink: &mut S) -> bool
    where
        S: FnMut(Dest, &[u8]) -> io::Result<()>,
    {
        let (Some(cache), Some(key)) = (&self.cache, &p.key) else {
            return false;
        };
        let askers = 1 + p.followers.len();
        if !lock(cache).get_stale(key, now, askers, &mut self.scratch) {
            return false;
        }
        self.stats().stale(askers);
        let reply = std::mem::take(&mut self.scratch);
        for asker in std::iter::once(&p.asker).chain(&p.followers) {
            self.deliver(&reply, asker, sink);
        }
        self.scratch = reply;
        true
    }

    /// A datagram on upstream socket `socket`. Anything that is not the awaited reply from the
    /// exact upstream address is ignored, and the query keeps waiting.
    pub fn on_reply<S>(
        &mut self,
        socket: usize,
        packet: &mut [u8],
        from: SocketAddr,
        now: Instant,
        sink: &mut S,
    ) where
        S: FnMut(Dest, &[u8]) -> io::Result<()>,
    {
        if packet.len() < wire::HEADER_LEN {
            return;
        }
        let key = (socket as u32) << 16 | u32::from(wire::id(packet));
        let Some(&(slot, generation)) = self.keys.get(&key) else {
            return;
        };
        let entry = &self.slots[slot as usize];
        let Some(p) = entry
            .pending
            .as_ref()
            .filter(|_| entry.generation == generation)
        else {
            return;
        };
        let Some(t) = p.tries.iter().flatten().find(|t| t.key == key) else {
            return;
        };
        if t.upstream != from
            || !wire::reply_matches(packet, t.id, p.asker.q.question(&p.asker.query))
        {
            return;
        }
        self.groups
            .get(p.group)
            .note_reply(from, now.saturating_duration_since(t.sent));
        let Some(p) = self.release(slot) else { return };
        let code = wire::rcode(packet);
        // An upstream that answers but cannot resolve is no better than a silent one when the
        // cache still knows the answer (RFC 8767 §4).
        if (code == rcode::SERVFAIL || code == rcode::REFUSED) && self.serve_stale(&p, now, sink) {
            return;
        }
        if let (Some(cache), Some(key)) = (&self.cache, p.key.clone()) {
            lock(cache).put(key, packet, now);
        }
        for asker in std::iter::once(&p.asker).chain(&p.followers) {
            self.deliver(packet, asker, sink);
        }
    }

    /// Expires tries whose time is up: each moves on to another upstream or ends in a stale
    /// answer or SERVFAIL.
    pub fn on_timers<S>(&mut self, now: Instant, sink: &mut S)
    where
        S: FnMut(Dest, &[u8]) -> io::Result<()>,
    {
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
            // Only the latest try's timer moves the query on; a try that failed to send already did.
            if timer.try_no + 1 != p.ntries {
                continue;
            }
            if let Some(t) = p.tries[timer.try_no] {
                self.groups
                    .get(p.group)
                    .note_failure(t.upstream, p.group, "timed out");
            }
            self.send_try(timer.slot, now, sink);
        }
        // Timers of answered queries stay in the heap until they expire; at very high rates that
        // is many, so drop them early rather than let the heap grow with the query rate.
        if self.timers.len() > 4 * (self.max_inflight + 1024) {
            let slots = &self.slots;
            self.timers.retain(|Reverse(t)| {
                let e = &slots[t.slot as usize];
                e.generation == t.generation && e.pending.is_some()
            });
        }
    }
}

/// A poisoned lock only means another task panicked mid-update of plain data; the cache is still
/// usable, and DNS service matters more than the entry that task was writing.
fn lock(cache: &Mutex<Cache>) -> std::sync::MutexGuard<'_, Cache> {
    cache
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

const UNSPECIFIED: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    0,
));

/// Tells the UDP relay threads to stop: an eventfd in each thread's epoll set, so a sleeping
/// thread wakes at once (LocalDNS is waiting for the port). Once written it stays readable.
pub struct Stop {
    wake: EventFd,
}

impl Stop {
    pub fn new() -> io::Result<Arc<Stop>> {
        let wake = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Arc::new(Stop { wake }))
    }

    pub fn stop(&self) {
        let _ = self.wake.write(1);
    }
}

/// epoll token of the eventfd that `Stop` writes to.
const STOP_TOKEN: u64 = u64::MAX;
/// epoll token of the client-facing socket; upstream socket `i` is `1 + i`.
const LISTENER_TOKEN: u64 = 0;

/// Runs one listener's UDP relay on the calling thread until `stop`; returning closes the
/// listener socket. Waits in epoll for whichever sockets are readable, drains each of them, runs
/// the timers, and waits again. Plain non-blocking syscalls on a thread of its own: an async
/// runtime would learn of new datagrams only when its reactor next runs, which costs a wake-up
/// and a hand-off per burst (CONTEXT §6); and asking only the sockets epoll names keeps an idle
/// upstream socket from costing a syscall per loop.
pub fn serve_udp(
    listener: std::net::UdpSocket,
    pool: Vec<std::net::UdpSocket>,
    mut relay: UdpRelay,
    mut groups: watch::Receiver<Arc<Groups>>,
    stop: Arc<Stop>,
    (heartbeats, beat): (Arc<Heartbeats>, usize),
) {
    let epoll = match register(&listener, &pool, &stop) {
        Ok(epoll) => epoll,
        Err(e) => {
            tracing::error!(error = %e, listener = relay.listener.name(), "cannot set up epoll; UDP not served");
            return;
        }
    };
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let stats = relay.metrics.clone();
    let kind = relay.listener;
    let mut sink = |dest: Dest, bytes: &[u8]| -> io::Result<()> {
        match dest {
            Dest::Client(to) => {
                stats.listener(kind).response(Transport::Udp, bytes);
                listener.send_to(bytes, to).map(drop)
            }
            // A full send queue is congestion here, not a fault of the upstream: the datagram is
            // lost like any other and the try's timer moves the query on.
            Dest::Upstream { socket, to } => match pool[socket].send_to(bytes, to) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
                other => other.map(drop),
            },
        }
    };
    let mut events = vec![EpollEvent::empty(); pool.len() + 2];
    let mut wait = PollTimeout::ZERO;
    // This thread's share of the listener's in-flight gauge.
    let mut reported_inflight = 0;
    loop {
        heartbeats.beat(beat);
        if groups.has_changed().unwrap_or(false) {
            relay.set_groups(groups.borrow_and_update().clone());
        }
        let ready = match epoll.wait(&mut events, wait) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => {
                tracing::error!(error = %e, "epoll_wait failed; retrying");
                std::thread::sleep(Duration::from_millis(10));
                0
            }
        };
        for event in &events[..ready] {
            match event.data() {
                STOP_TOKEN => return,
                LISTENER_TOKEN => drain(&listener, &mut buf, |packet, from| {
                    relay.on_query(packet, from, Instant::now(), &mut sink)
                }),
                token => {
                    let index = (token - 1) as usize;
                    drain(&pool[index], &mut buf, |packet, from| {
                        relay.on_reply(index, packet, from, Instant::now(), &mut sink)
                    })
                }
            }
        }
        let now = Instant::now();
        relay.on_timers(now, &mut sink);
        let inflight = relay.inflight();
        if inflight != reported_inflight {
            stats
                .listener(kind)
                .add_inflight(inflight as i64 - reported_inflight as i64);
            reported_inflight = inflight;
        }
        // After work, look again at once; when idle, sleep until the next try deadline, but wake
        // at least twice a second so the heartbeat shows this loop alive.
        wait = if ready > 0 {
            PollTimeout::ZERO
        } else {
            let until = relay.next_deadline().map_or(HEARTBEAT_IDLE, |t| {
                t.saturating_duration_since(now).min(HEARTBEAT_IDLE)
            });
            // Round up: waking a millisecond early would only spin until the deadline.
            PollTimeout::from(until.as_micros().div_ceil(1000).min(u128::from(u16::MAX)) as u16)
        };
    }
}

fn register(
    listener: &std::net::UdpSocket,
    pool: &[std::net::UdpSocket],
    stop: &Stop,
) -> nix::Result<Epoll> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    // Several threads wait on the one listener socket; EPOLLEXCLUSIVE wakes one per datagram
    // instead of all of them.
    epoll.add(
        listener,
        EpollEvent::new(
            EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE,
            LISTENER_TOKEN,
        ),
    )?;
    for (i, socket) in pool.iter().enumerate() {
        epoll.add(socket, EpollEvent::new(EpollFlags::EPOLLIN, 1 + i as u64))?;
    }
    epoll.add(&stop.wake, EpollEvent::new(EpollFlags::EPOLLIN, STOP_TOKEN))?;
    Ok(epoll)
}

/// Reads up to `BATCH` datagrams from a readable socket, so one busy socket cannot starve the
/// others; what is left is reported again by the next (level-triggered) wait.
fn drain(
    socket: &std::net::UdpSocket,
    buf: &mut [u8],
    mut handle: impl FnMut(&mut [u8], SocketAddr),
) {
    for _ in 0..BATCH {
        match socket.recv_from(buf) {
            Ok((n, from)) => handle(&mut buf[..n], from),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => {
                tracing::debug!(error = %e, "UDP receive error");
                return;
            }
        }
    }
}

/// What TCP connections of one listener share.
pub struct TcpContext {
    pub listener: Listener,
    pub config: Arc<Config>,
    pub groups: watch::Receiver<Arc<Groups>>,
    pub cache: Option<Arc<Mutex<Cache>>>,
    pub metrics: Arc<Metrics>,
    pub connections: Arc<Semaphore>,
}

/// Accepts TCP clients until `stop` turns true, then drops the listening socket at once.
/// `drain` is held by every connection so the caller can wait for them to finish.
pub async fn serve_tcp(
    socket: TcpListener,
    ctx: Arc<TcpContext>,
    mut stop: watch::Receiver<bool>,
    drain: mpsc::Sender<()>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            _ = stop.changed() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Usually EMFILE: back off instead of spinning on the error.
                tracing::warn!(error = %e, listener = ctx.listener.name(), "TCP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Over the cap the connection is closed at once: a client would rather see that than hang.
        let Ok(permit) = ctx.connections.clone().try_acquire_owned() else {
            continue;
        };
        tokio::spawn(tcp_connection(
            stream,
            ctx.clone(),
            stop.clone(),
            drain.clone(),
            permit,
        ));
    }
}

async fn tcp_connection(
    stream: TcpStream,
    ctx: Arc<TcpContext>,
    mut stop: watch::Receiver<bool>,
    drain: mpsc::Sender<()>,
    _permit: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = stream.into_split();
    let (replies, mut outbox) = mpsc::channel::<Vec<u8>>(TCP_PIPELINE);
    let idle = ctx.config.tcp_idle_timeout;
    let metrics = ctx.metrics.clone();
    let kind = ctx.listener;
    let write_side = tokio::spawn(async move {
        while let Some(reply) = outbox.recv().await {
            metrics.listener(kind).response(Transport::Tcp, &reply);
            let mut frame = Vec::with_capacity(reply.len() + 2);
            frame.extend_from_slice(&(reply.len() as u16).to_be_bytes());
            frame.extend_from_slice(&reply);
            match tokio::time::timeout(idle, writer.write_all(&frame)).await {
                Ok(Ok(())) => {}
                _ => return,
            }
        }
    });
    let slots = Arc::new(Semaphore::new(TCP_PIPELINE));
    loop {
        // The whole frame must arrive within the idle timeout, so a client that dribbles bytes
        // (slowloris) cannot hold a connection slot for longer than an idle one.
        let frame = tokio::select! {
            frame = tokio::time::timeout(idle, read_frame(&mut reader, wire::MAX_QUERY)) => frame,
            _ = stop.changed() => break,
        };
        let Ok(Ok(Some(query))) = frame else { break };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let (ctx, replies, drain) = (ctx.clone(), replies.clone(), drain.clone());
        tokio::spawn(async move {
            if let Some(reply) = answer_tcp(&ctx, query).await {
                let _ = replies.send(reply).await;
            }
            drop((slot, drain));
        });
    }
    drop(replies);
    let _ = write_side.await;
}

/// Reads one length-prefixed DNS message; `None` at a clean end of stream.
async fn read_frame(
    reader: &mut (impl AsyncReadExt + Unpin),
    max: usize,
) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match reader.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = usize::from(u16::from_be_bytes(len));
    if len > max {
        // Not worth reading: a query this big is no stub's, and every byte read is held.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message over the size limit",
        ));
    }
    let mut message = vec![0u8; len];
    reader.read_exact(&mut message).await?;
    Ok(Some(message))
}

/// Answers one query that arrived over TCP; it goes upstream over TCP. Shares the cache with the
/// UDP relays (no coalescing: TCP queries are few).
async fn answer_tcp(ctx: &TcpContext, query: Vec<u8>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let stats = ctx.metrics.listener(ctx.listener);
    let (q, group) = match decide(
        ctx.listener,
        &query,
        &ctx.config.cluster_domain_wire,
        &mut out,
    ) {
        Decision::Drop => {
            stats.dropped();
            return None;
        }
        Decision::Answered => return Some(out),
        Decision::Forward(q, group) => (q, group),
    };
    let key = ctx.cache.as_ref().map(|_| Key::new(group, &query, &q));
    let from_cache = |stale: bool, out: &mut Vec<u8>| -> bool {
        let (Some(cache), Some(key)) = (&ctx.cache, &key) else {
            return false;
        };
        let mut cache = lock(cache);
        let now = Instant::now();
        if !stale {
            return cache.get_fresh(key, now, out);
        }
        let found = cache.get_stale(key, now, 1, out);
        if found {
            stats.stale(1);
        }
        found
    };
    if from_cache(false, &mut out) {
        stats.cache_hit();
        wire::restore_for_client(&mut out, q.id, q.question(&query));
        return Some(out);
    }
    if ctx.cache.is_some() {
        stats.cache_miss();
    }
    let upstreams = ctx.groups.borrow().get(group).clone();
    let deadline = tokio::time::Instant::now() + ctx.config.query_timeout;
    let start = upstreams.next_start();
    let mut tried = Vec::with_capacity(MAX_TRIES);
    while tried.len() < MAX_TRIES && tokio::time::Instant::now() < deadline {
        let Some(upstream) = upstreams.pick(start, &tried) else {
            break;
        };
        tried.push(upstream);
        // The thread's CSPRNG, seeded once, not a fresh one from the OS per query.
        let id: u16 = rand::rng().random();
        let mut message = query.clone();
        wire::set_id(&mut message, id);
        let budget = deadline.min(tokio::time::Instant::now() + ctx.config.upstream_timeout);
        let sent = Instant::now();
        upstreams.note_sent(upstream);
        let why = match tokio::time::timeout_at(budget, exchange_tcp(upstream, &message)).await {
            Ok(Ok(mut reply)) if wire::reply_matches(&reply, id, q.question(&query)) => {
                upstreams.note_reply(upstream, sent.elapsed());
                let code = wire::rcode(&reply);
                if (code == rcode::SERVFAIL || code == rcode::REFUSED) && from_cache(true, &mut out)
                {
                    break;
                }
                if let (Some(cache), Some(key)) = (&ctx.cache, key.clone()) {
                    lock(cache).put(key, &reply, Instant::now());
                }
                wire::restore_for_client(&mut reply, q.id, q.question(&query));
                return Some(reply);
            }
            Ok(Ok(_)) => "sent a reply that does not match the query over TCP".to_string(),
            Ok(Err(e)) => format!("failed over TCP ({e})"),
            Err(_) => "timed out over TCP".to_string(),
        };
        upstreams.note_failure(upstream, group, &why);
    }
    if !out.is_empty() || from_cache(true, &mut out) {
        wire::restore_for_client(&mut out, q.id, q.question(&query));
        return Some(out);
    }
    wire::local_reply(&query, &q, rcode::SERVFAIL, &mut out);
    Some(out)
}

async fn exchange_tcp(upstream: SocketAddr, message: &[u8]) -> io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    // One connection per query, closed by us: without this each would sit in TIME-WAIT for a
    // minute, and a few hundred TCP queries a second would run the node out of source ports
    // (measured: 15,000 TIME-WAIT sockets in 3 s). An abortive close leaves none.
    stream.set_zero_linger()?;
    let mut frame = Vec::with_capacity(message.len() + 2);
    frame.extend_from_slice(&(message.len() as u16).to_be_bytes());
    frame.extend_from_slice(message);
    stream.write_all(&frame).await?;
    read_frame(&mut stream, usize::from(u16::MAX))
        .await?
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before a reply",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli;

    const CLIENT: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::new(10, 1, 1, 1),
        40000,
    ));

    fn up(last: u8) -> SocketAddr {
        SocketAddr::from(([198, 18, 0, last], 53))
    }

    fn query(id: u16, name: &str, edns: Option<u16>) -> Vec<u8> {
        let mut p = id.to_be_bytes().to_vec();
        p.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, u8::from(edns.is_some())]);
        p.extend_from_slice(&wire::encode_name(name).unwrap());
        // keep the caller's case: encode_name lowercases, so patch the letters back
        let mut at = 12;
        for label in name.split('.') {
            p[at + 1..at + 1 + label.len()].copy_from_slice(label.as_bytes());
            at += 1 + label.len();
        }
        p.extend_from_slice(&[0, 1, 0, 1]);
        if let Some(size) = edns {
            p.extend_from_slice(&[0, 0, 41]);
            p.extend_from_slice(&size.to_be_bytes());
            p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        }
        p
    }

    /// An upstream's reply to `sent`: QR set, an A record of `extra` bytes of padding appended.
    fn reply(sent: &[u8], lowercase: bool, extra: usize) -> Vec<u8> {
        let mut r = sent.to_vec();
        r[2] |= 0x80;
        if lowercase {
            r[12..].make_ascii_lowercase();
        }
        if extra > 0 {
            r[7] = 1;
            r.extend_from_slice(&[0xc0, 12, 0, 16, 0, 1, 0, 0, 0, 60]);
            r.extend_from_slice(&((extra) as u16).to_be_bytes());
            r.extend(std::iter::repeat_n(b'x', extra));
        }
        r
    }

    struct Rig {
        relay: UdpRelay,
        sent: Vec<(Dest, Vec<u8>)>,
        t0: Instant,
    }

    impl Rig {
        fn new(listener: Listener, node: Vec<SocketAddr>, cluster: Vec<SocketAddr>) -> Rig {
            let config = cli::Config::default();
            let groups = Arc::new(Groups {
                node: Arc::new(Upstreams::new(node)),
                cluster: Arc::new(Upstreams::new(cluster)),
            });
            let cache = Cache::new(config.cache).map(|c| Arc::new(Mutex::new(c)));
            Rig {
                relay: UdpRelay::new(listener, &config, groups, cache, Metrics::new(), (2, 2)),
                sent: Vec::new(),
                t0: Instant::now(),
            }
        }

        fn at(&self, ms: u64) -> Instant {
            self.t0 + Duration::from_millis(ms)
        }

        fn query(&mut self, packet: &[u8], ms: u64) {
            let now = self.at(ms);
            let sent = &mut self.sent;
            self.relay.on_query(packet, CLIENT, now, &mut |d, b| {
                sent.push((d, b.to_vec()));
                Ok(())
            });
        }

        fn reply(&mut self, socket: usize, packet: Vec<u8>, from: SocketAddr) {
            self.reply_at(socket, packet, from, 0);
        }

        fn reply_at(&mut self, socket: usize, mut packet: Vec<u8>, from: SocketAddr, ms: u64) {
            let now = self.at(ms);
            let sent = &mut self.sent;
            self.relay
                .on_reply(socket, &mut packet, from, now, &mut |d, b| {
                    sent.push((d, b.to_vec()));
                    Ok(())
                });
        }

        fn tick(&mut self, ms: u64) {
            let now = self.at(ms);
            let sent = &mut self.sent;
            self.relay.on_timers(now, &mut |d, b| {
                sent.push((d, b.to_vec()));
                Ok(())
            });
        }

        /// The last upstream send: (socket, upstream, bytes).
        fn last_upstream(&self) -> (usize, SocketAddr, Vec<u8>) {
            self.sent
                .iter()
                .rev()
                .find_map(|(d, b)| match d {
                    Dest::Upstream { socket, to } => Some((*socket, *to, b.clone())),
                    _ => None,
                })
                .expect("something was sent upstream")
        }

        fn to_client(&self) -> Vec<Vec<u8>> {
            self.sent
                .iter()
                .filter(|(d, _)| *d == Dest::Client(CLIENT))
                .map(|(_, b)| b.clone())
                .collect()
        }
    }

    #[test]
    fn routes_as_localdns_does() {
        let cd = wire::encode_name("cluster.local").unwrap();
        let name = |s: &str| wire::encode_name(s).unwrap();
        assert_eq!(
            route(Listener::Cluster, &name("example.com"), &cd),
            Route::Upstream(Group::Cluster)
        );
        assert_eq!(
            route(Listener::Node, &name("example.com"), &cd),
            Route::Upstream(Group::Node)
        );
        assert_eq!(
            route(
                Listener::Node,
                &name("kube-dns.kube-system.svc.cluster.local"),
                &cd
            ),
            Route::Upstream(Group::Cluster)
        );
        assert_eq!(
            route(Listener::Node, &name("Health-Check.LocalDNS.local"), &cd),
            Route::Local(0)
        );
        assert_eq!(
            route(Listener::Cluster, &name("health-check.localdns.local"), &cd),
            Route::Local(0)
        );
        assert_eq!(
            route(Listener::Node, &name("x.reddog.microsoft.com"), &cd),
            Route::Local(3)
        );
        assert_eq!(
            route(Listener::Node, &name("a.b.c.d.internal.cloudapp.net"), &cd),
            Route::Local(3)
        );
        assert_eq!(
            route(Listener::Node, &name("vm1.internal.cloudapp.net"), &cd),
            Route::Upstream(Group::Node)
        );
        assert_eq!(HEALTH_CHECK, name("health-check.localdns.local").as_slice());
        assert_eq!(REDDOG, name("reddog.microsoft.com").as_slice());
        assert_eq!(CLOUDAPP_INTERNAL, name("internal.cloudapp.net").as_slice());
    }

    #[test]
    fn relays_and_restores_id_and_case() {
        let mut rig = Rig::new(Listener::Node, vec![up(1)], vec![up(2)]);
        let q = query(0xabcd, "WWW.Example.com", None);
        rig.query(&q, 0);
        let (socket, to, sent) = rig.last_upstream();
        assert_eq!(to, up(1));
        assert_eq!(&sent[2..], &q[2..], "forwarded unchanged but for the ID");
        rig.reply(socket, reply(&sent, true, 0), up(1));
        let answers = rig.to_client();
        assert_eq!(answers.len(), 1);
        assert_eq!(wire::id(&answers[0]), 0xabcd);
        assert_eq!(&answers[0][12..], &q[12..], "client's spelling restored");
        assert_eq!(rig.relay.inflight(), 0);
    }

    #[test]
    fn ignores_replies_that_do_not_match() {
        let mut rig = Rig::new(Listener::Cluster, vec![up(1)], vec![up(2)]);
        let q = query(1, "a.svc.cluster.local", None);
        rig.query(&q, 0);
        let (socket, _, sent) = rig.last_upstream();
        rig.reply(socket, reply(&sent, false, 0), up(3)); // wrong source address
        rig.reply(
            socket,
            reply(&sent, false, 0),
            SocketAddr::from(([198, 18, 0, 2], 5353)),
        ); // wrong port
        rig.reply(socket ^ 1, reply(&sent, false, 0), up(2)); // wrong socket
        let mut wrong_id = reply(&sent, false, 0);
        wrong_id[0] ^= 0xff;
        rig.reply(socket, wrong_id, up(2));
        rig.reply(
            socket,
            reply(
                &query(wire::id(&sent), "b.svc.cluster.local", None),
                false,
                0,
            ),
            up(2),
        );
        rig.reply(socket, sent.clone(), up(2)); // not a response
        rig.reply(socket, vec![1, 2, 3], up(2));
        assert!(rig.to_client().is_empty());
        assert_eq!(rig.relay.inflight(), 1, "still waiting");
        rig.reply(socket, reply(&sent, false, 0), up(2));
        assert_eq!(rig.to_client().len(), 1);
    }

    #[test]
    fn a_timeout_moves_to_another_upstream_and_late_replies_still_count() {
        let mut rig = Rig::new(Listener::Cluster, vec![], vec![up(1), up(2)]);
        rig.query(&query(5, "x.cluster.local", None), 0);
        let (s1, first, sent1) = rig.last_upstream();
        rig.tick(999);
        assert_eq!(rig.sent.len(), 1, "not yet");
        rig.tick(1000);
        let (_, second, sent2) = rig.last_upstream();
        assert_ne!(first, second);
        assert_ne!(wire::id(&sent1), wire::id(&sent2), "fresh ID per try");
        rig.reply(s1, reply(&sent1, false, 0), first);
        assert_eq!(
            rig.to_client().len(),
            1,
            "the first upstream's late answer is taken"
        );
        assert_eq!(rig.relay.inflight(), 0);
    }

    #[test]
    fn servfail_when_every_try_fails_before_the_deadline() {
        let mut rig = Rig::new(Listener::Node, vec![up(1)], vec![]);
        rig.query(&query(5, "example.com", Some(1232)), 0);
        for ms in [1000, 2000] {
            rig.tick(ms);
            assert!(rig.to_client().is_empty(), "retrying at {ms} ms");
        }
        assert_eq!(
            rig.relay.next_deadline(),
            Some(rig.at(2500)),
            "last try is cut to the deadline"
        );
        rig.tick(2500);
        let answers = rig.to_client();
        assert_eq!(answers.len(), 1);
        assert_eq!(wire::rcode(&answers[0]), rcode::SERVFAIL);
        assert_eq!(wire::id(&answers[0]), 5);
        assert_eq!(rig.relay.inflight(), 0);
        let upstream_sends = rig
            .sent
            .iter()
            .filter(|(d, _)| matches!(d, Dest::Upstream { .. }))
            .count();
        assert_eq!(upstream_sends, 3);
    }

    #[test]
    fn a_timed_out_upstream_is_tried_last_by_later_queries() {
        let mut rig = Rig::new(Listener::Cluster, vec![], vec![up(1), up(2)]);
        rig.query(&query(1, "a.b", None), 0);
        let (_, first, _) = rig.last_upstream();
        rig.tick(1000);
        for i in 0..4 {
            rig.query(&query(2 + i, "c.d", None), 1001);
            assert_ne!(rig.last_upstream().1, first);
        }
    }

    #[test]
    fn oversized_answers_become_tc_replies() {
        let mut rig = Rig::new(Listener::Node, vec![up(1)], vec![]);
        let q = query(9, "big.example", None);
        rig.query(&q, 0);
        let (socket, to, sent) = rig.last_upstream();
        rig.reply(socket, reply(&sent, false, 1000), to);
        let a = &rig.to_client()[0];
        assert!(wire::is_truncated(a));
        assert_eq!(&a[12..], &q[12..]);
        let q = query(10, "big.example", Some(4096));
        rig.query(&q, 0);
        let (socket, to, sent) = rig.last_upstream();
        rig.reply(socket, reply(&sent, false, 1000), to);
        let a = &rig.to_client()[1];
        assert!(
            !wire::is_truncated(a) && a.len() > 1000,
            "fits the advertised size"
        );
    }

    #[test]
    fn answers_locally_and_drops_responses() {
        let mut rig = Rig::new(Listener::Node, vec![up(1)], vec![up(2)]);
        rig.query(&query(3, "health-check.localdns.local", None), 0);
        let mut response = query(4, "example.com", None);
        response[2] |= 0x80;
        rig.query(&response, 0);
        rig.query(&[0xff; 5], 0);
        let answers = rig.to_client();
        assert_eq!(answers.len(), 1);
        assert_eq!(wire::rcode(&answers[0]), rcode::NOERROR);
        assert!(
            rig.sent
                .iter()
                .all(|(d, _)| !matches!(d, Dest::Upstream { .. }))
        );
    }

    #[test]
    fn sheds_with_refused_above_the_cap_and_servfails_without_upstreams() {
        let mut rig = Rig::new(Listener::Cluster, vec![], vec![up(1)]);
        rig.relay.max_inflight = 2;
        for i in 0..3 {
            rig.query(&query(i, &format!("n{i}.b"), None), 0);
        }
        let answers = rig.to_client();
        assert_eq!(answers.len(), 1);
        assert_eq!(wire::rcode(&answers[0]), rcode::REFUSED);
        let mut empty = Rig::new(Listener::Cluster, vec![up(1)], vec![]);
        empty.query(&query(1, "a.b", None), 0);
        assert_eq!(wire::rcode(&empty.to_client()[0]), rcode::SERVFAIL);
    }

    #[test]
    fn a_send_error_moves_on_at_once() {
        let mut rig = Rig::new(Listener::Cluster, vec![], vec![up(1), up(2)]);
        let mut failed = Vec::new();
        let mut delivered = Vec::new();
        rig.relay.on_query(
            &query(1, "a.b", None),
            CLIENT,
            rig.t0,
            &mut |d, _| match d {
                Dest::Upstream { to, .. } if failed.is_empty() => {
                    failed.push(to);
                    Err(io::Error::from(io::ErrorKind::NetworkUnreachable))
                }
                Dest::Upstream { to, .. } => {
                    delivered.push(to);
                    Ok(())
                }
                Dest::Client(_) => Ok(()),
            },
        );
        assert_eq!(failed.len(), 1);
        assert_eq!(delivered.len(), 1);
        assert_ne!(failed[0], delivered[0]);
    }

    #[test]
    fn ids_spread_over_sockets_and_values() {
        let mut rig = Rig::new(Listener::Cluster, vec![], vec![up(1)]);
        for i in 0..200 {
            rig.query(&query(i, &format!("n{i}.b"), None), 0);
        }
        let mut ids = std::collections::HashSet::new();
        let mut sockets = std::collections::HashSet::new();
        for (d, b) in &rig.sent {
            if let Dest::Upstream { socket, .. } = d {
                ids.insert(wire::id(b));
                sockets.insert(*socket);
            }
        }
        assert!(
            ids.len() > 190,
            "IDs look random: {} distinct of 200",
            ids.len()
        );
        assert_eq!(sockets.len(), 2, "both IPv4 sockets used");
    }

    fn upstream_sends(rig: &Rig) -> usize {
        rig.sent
            .iter()
            .filter(|(d, _)| matches!(d, Dest::Upstream { .. }))
            .count()
    }

    /// A reply to `sent` carrying one A record with this TTL.
    fn answer(sent: &[u8], ttl: u32) -> Vec<u8> {
        let mut r = sent.to_vec();
        r[2] |= 0x80;
        r[7] = 1;
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        r.extend_from_slice(&ttl.to_be_bytes());
        r.extend_from_slice(&[0, 4, 10, 0, 0, 1]);
        r
    }

    #[test]
    fn identical_queries_in_flight_share_one_upstream_query() {
        let mut rig = Rig::new(Listener::Cluster, vec![], vec![up(1)]);
        for id in 0..50 {
            let name = if id % 2 == 0 {
                "Same.Name.svc"
            } else {
                "same.name.SVC"
            };
            rig.query(&query(id, name, None), 0);
        }
        assert_eq!(
            upstream_sends(&rig),
            1,
            "one upstream query for fifty identical ones"
        );
        let (socket, to, sent) = rig.last_upstream();
        rig.reply(socket, answer(&sent, 60), to);
        let answers = rig.to_client();
        assert_eq!(answers.len(), 50);
        for (id, a) in answers.iter().enumerate() {
            assert_eq!(wire::id(a), id as u16, "each asker gets its own ID back");
            let spelled = if id % 2 == 0 { b"Same" } else { b"same" };
            assert_eq!(&a[13..17], spelled, "and its own spelling");
        }
        assert_eq!(rig.relay.inflight(), 0);
    }

    #[test]
    fn answers_come_from_the_cache_until_they_expire() {
        let mut rig = Rig::new(Listener::Cluster, vec![], vec![up(1)]);
        rig.query(&query(1, "c.svc", None), 0);
        let (socket, to, sent) = rig.last_upstream();
        rig.reply(socket, answer(&sent, 30), to);
        rig.query(&query(2, "C.SVC", None), 10_000);
        assert_eq!(upstream_sends(&rig), 1, "a hit");
        let hit = rig.to_client().pop().unwrap();
        assert_eq!(wire::id(&hit), 2);
        assert_eq!(
            &hit[hit.len() - 10..hit.len() - 6],
            &20u32.to_be_bytes(),
            "TTL counted down"
        );
        rig.query(&query(3, "c.svc", None), 30_000);
        assert_eq!(upstream_sends(&rig), 2, "expired: asked again");
    }

    #[test]
    fn stale_answers_when_every_try_fails_and_servfail_without_one() {
        let mut rig = Rig::new(Listener::Cluster, vec![], vec![up(1)]);
        rig.query(&query(1, "s.svc", None), 0);
        let (socket, to, sent) = rig.last_upstream();
        rig.reply(socket, answer(&sent, 10), to);
        // Later the upstream goes silent.
        rig.query(&query(2, "s.svc", None), 60_000);
        rig.query(&query(3, "other.svc", None), 60_000);
        for ms in [61_000, 62_000, 62_500] {
            rig.tick(ms);
        }
        let answers = rig.to_client();
        let stale = answers.iter().find(|a| wire::id(a) == 2).expect("answered");
        assert_eq!(wire::rcode(stale), rcode::NOERROR);
        assert_eq!(
            &stale[stale.len() - 10..stale.len() - 6],
            &30u32.to_be_bytes(),
            "stale TTL"
        );
        let other = answers.iter().find(|a| wire::id(a) == 3).expect("answered");
        assert_eq!(
            wire::rcode(other),
            rcode::SERVFAIL,
            "nothing cached: SERVFAIL"
        );
    }

    #[test]
    fn an_upstream_servfail_is_passed_on_but_never_cached_and_loses_to_stale() {
        let mut rig = Rig::new(Listener::Cluster, vec![], vec![up(1)]);
        let servfail = |sent: &[u8]| {
            let mut r = sent.to_vec();
            r[2] |= 0x80;
            r[3] = rcode::SERVFAIL;
            r
        };
        rig.query(&query(1, "f.svc", None), 0);
        let (socket, to, sent) = rig.last_upstream();
        rig.reply(socket, servfail(&sent), to);
        assert_eq!(wire::rcode(&rig.to_client()[0]), rcode::SERVFAIL);
        rig.query(&query(2, "f.svc", None), 100);
        assert_eq!(upstream_sends(&rig), 2, "SERVFAIL was not cached");
        let (socket, to, sent) = rig.last_upstream();
        rig.reply_at(socket, answer(&sent, 10), to, 100);
        rig.query(&query(3, "f.svc", None), 20_000);
        let (socket, to, sent) = rig.last_upstream();
        rig.reply_at(socket, servfail(&sent), to, 20_000);
        let last = rig.to_client().pop().unwrap();
        assert_eq!(
            (wire::id(&last), wire::rcode(&last)),
            (3, rcode::NOERROR),
            "stale beats SERVFAIL"
        );
    }
}
