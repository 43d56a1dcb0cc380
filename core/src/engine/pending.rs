//! The engine's book of queries in flight: who is waiting, which tries are out, and the timers.

use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use super::{Client, Leg, Via};
use crate::cache::Key;
use crate::roles::{Transport, UpstreamGroup};
use crate::wire;

/// The most tries one query makes (a hedge counts as one); the query deadline usually ends it first.
pub const MAX_TRIES: usize = 4;

/// One try of a query at one upstream.
#[derive(Clone, Copy, Debug)]
pub struct Try {
    pub leg: Leg,
    pub sent: Instant,
    /// Still awaited: no reply, failure or timeout has ended it yet.
    pub live: bool,
    /// It ended with an error reply: that upstream is not asked again for this query.
    pub errored: bool,
    /// Its key is in the engine's table of tries: a reply to it would still be taken.
    pub keyed: bool,
    /// Still counted among its upstream's outstanding tries: live and not yet past its hedge
    /// point.
    pub counted: bool,
    /// A probe of a suspect or slow server: its hedge is free.
    pub probe: bool,
}

/// A client waiting for an answer besides the first: how it asked (its ID, spelling and size
/// limit go back into the answer).
pub struct Asker {
    pub client: Client,
    pub query: Box<[u8]>,
    pub q: wire::Query,
}

/// A query waiting for upstreams, with any identical queries that arrived while it was on its
/// way (they share its answer instead of multiplying upstream load).
pub struct Pending {
    /// The first asker's query: what goes upstream. A buffer of an earlier query, reused.
    pub query: Vec<u8>,
    pub q: wire::Query,
    /// The first asker; `None` once it was answered (stale) while the query goes on to refresh
    /// the cache, or for a refresh nobody waits on.
    pub client: Option<Client>,
    pub followers: Vec<Asker>,
    /// The cache key, when the cache is on: also the coalescing key (with the transport).
    pub key: Option<Key>,
    pub group: UpstreamGroup,
    /// The transport of every try: the asker's own (a TCP client's query goes upstream over TCP).
    pub transport: Transport,
    /// Where the query starts among equal upstreams.
    pub start: usize,
    pub deadline: Instant,
    pub tries: [Option<Try>; MAX_TRIES],
    pub ntries: usize,
    /// At most one hedge per query.
    pub hedged: bool,
    /// Its askers got a stale answer already (the client-response timer fired).
    pub stale_served: bool,
    /// The first error reply an upstream gave: passed on if every upstream gives one.
    pub error_reply: Option<Box<[u8]>>,
    /// An upstream truncated its UDP answer that an asker could take bigger: the next try
    /// fetches it from that upstream over TCP.
    pub refetch: Option<SocketAddr>,
}

impl Pending {
    /// Everyone waiting: (client, its query bytes, its parse).
    pub fn askers(&self) -> impl Iterator<Item = (Client, &[u8], &wire::Query)> {
        let first = self.client.map(|c| (c, &*self.query, &self.q));
        first
            .into_iter()
            .chain(self.followers.iter().map(|a| (a.client, &*a.query, &a.q)))
    }

    pub fn has_askers(&self) -> bool {
        self.client.is_some() || !self.followers.is_empty()
    }

    /// The question's name, hashed (FNV-1a, any case): upstream health tells one name's
    /// failures from another's.
    pub fn name_hash(&self) -> u64 {
        name_hash(self.q.name(&self.query))
    }

    pub fn live_tries(&self) -> usize {
        self.tries.iter().flatten().filter(|t| t.live).count()
    }

    /// Upstreams already tried, those that answered with an error first, and how many of each:
    /// `addrs[..tried]` were tried, `addrs[..errored]` are not to be asked again (in a fixed
    /// array: this runs for every try).
    pub fn tried(&self) -> ([SocketAddr; MAX_TRIES], usize, usize) {
        let mut addrs = [SocketAddr::from(([0, 0, 0, 0], 0)); MAX_TRIES];
        let (mut tried, mut errored) = (0, 0);
        for t in self.tries.iter().flatten() {
            addrs[tried] = t.leg.to;
            if t.errored {
                addrs.swap(errored, tried);
                errored += 1;
            }
            tried += 1;
        }
        (addrs, tried, errored)
    }
}

/// A wire-form name hashed (FNV-1a, any case).
pub fn name_hash(name: &[u8]) -> u64 {
    name.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b.to_ascii_lowercase())).wrapping_mul(0x100_0000_01b3)
    })
}

pub struct Slot {
    /// Bumped whenever the slot is freed, so stale keys and timers of an earlier query are ignored.
    pub generation: u32,
    pub pending: Option<Pending>,
}

impl Slot {
    /// The query a key or timer of this `generation` was made for, if it is still in flight.
    pub fn holds(&self, generation: u32) -> Option<&Pending> {
        self.pending
            .as_ref()
            .filter(|_| self.generation == generation)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerKind {
    /// The try's budget is used up.
    TryTimeout,
    /// The try has gone unanswered longer than its upstream usually takes: ask elsewhere too.
    Hedge,
    /// The client-response timer of serve-stale.
    Stale,
}

/// Ordered by time first so the heap's top is the next to expire.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
pub struct Timer {
    pub at: Instant,
    pub slot: u32,
    pub generation: u32,
    pub try_no: u8,
    pub kind: TimerKind,
}

/// Where a try's reply is looked up: UDP by (upstream, socket, ID), TCP by (upstream, ID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TryKey {
    Udp(SocketAddr, usize, u16),
    Tcp(SocketAddr, u16),
}

/// A derived hash feeds a `SocketAddr` to the hasher part by part (family, address, port, and
/// for IPv6 flow label and scope); every query hashes a try key about five times, and that took
/// a tenth of the engine's instructions. Two words carry all that tells keys apart in practice.
/// Keys that differ only in an IPv6 flow label or scope share a hash; equality tells them apart.
impl Hash for TryKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let (to, tag) = match *self {
            TryKey::Udp(to, socket, id) => (to, (socket as u64) << 17 | u64::from(id) << 1),
            TryKey::Tcp(to, id) => (to, u64::from(id) << 1 | 1),
        };
        let ip = match to.ip() {
            IpAddr::V4(ip) => u128::from(ip.to_bits()),
            IpAddr::V6(ip) => ip.to_bits(),
        };
        h.write_u128(ip);
        h.write_u64(tag ^ u64::from(to.port()) << 48);
    }
}

impl TryKey {
    pub fn of(leg: &Leg) -> TryKey {
        match leg.via {
            Via::Udp { socket } => TryKey::Udp(leg.to, socket, leg.id),
            Via::Tcp => TryKey::Tcp(leg.to, leg.id),
        }
    }

    pub fn upstream(&self) -> SocketAddr {
        match *self {
            TryKey::Udp(to, _, _) | TryKey::Tcp(to, _) => to,
        }
    }
}

/// A try still out when its query was answered by another: kept until its reply or its
/// deadline, so a server that answers late or never still counts in its health.
#[derive(Clone, Copy)]
pub struct Orphan {
    pub group: UpstreamGroup,
    pub sent: Instant,
    pub deadline: Instant,
    /// As [`Try::counted`].
    pub counted: bool,
    /// As [`Pending::name_hash`].
    pub name: u64,
    /// Its timeout was counted already: its deadline only stops the wait for a late reply.
    pub judged: bool,
}
