//! Plain counters: what the serving loops and discovery count, read at scrape time by
//! the daemon's `metrics` and by the minute summary. Relaxed atomics only, so counting never waits;
//! each listener has its own block so the two relay threads never write to the same cache line.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::flows::Cause;
use crate::roles::{ListenerRole, Transport, UpstreamGroup};

/// Upper bounds of the upstream latency histogram, in seconds: LAN answers take well under a
/// millisecond, a VNet DNS recursing a few tens, and the per-try budget ends at 1 s.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// RCODEs counted by name; the rest are counted as `other`.
pub const RCODES: [&str; 7] = [
    "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "other",
];

/// A latency histogram with fixed buckets (not cumulative; rendering adds them up). The last
/// bucket holds what is over every bound, so the buckets add up to the count.
#[derive(Debug, Default)]
pub struct Histogram {
    pub buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    pub sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BUCKETS.iter().position(|&b| secs <= b);
        self.buckets[i.unwrap_or(LATENCY_BUCKETS.len())].fetch_add(1, Relaxed);
        self.sum_nanos.fetch_add(d.as_nanos() as u64, Relaxed);
    }
}

/// What one upstream server has seen; kept across upstream-set changes so counters only grow.
#[derive(Debug, Default)]
pub struct UpstreamStats {
    /// Tries sent to it, over either transport.
    pub queries: AtomicU64,
    /// Tries that timed out, could not be sent or were refused by the network.
    pub failures: AtomicU64,
    /// Time from sending a try to its accepted reply.
    pub latency: Histogram,
}

/// One listener's counters.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct ListenerStats {
    /// Replies sent, by transport and RCODE (index into [`RCODES`]).
    pub responses: [[AtomicU64; RCODES.len()]; 2],
    /// Client packets dropped unanswered (too short, or response-shaped).
    pub dropped: AtomicU64,
    /// Queries refused because too many were in flight.
    pub shed: AtomicU64,
    /// Queries waiting for an upstream (a gauge; relay threads add their changes).
    pub inflight: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    /// Answers served from expired cache entries because upstreams failed.
    pub stale: AtomicU64,
}

impl ListenerStats {
    /// A reply went to a client; its RCODE is read off the bytes.
    pub fn response(&self, transport: Transport, reply: &[u8]) {
        let code = reply.get(3).map_or(RCODES.len() - 1, |b| {
            usize::from(b & 0x0f).min(RCODES.len() - 1)
        });
        self.responses[transport as usize][code].fetch_add(1, Relaxed);
    }

    /// Adds `delta`, which may be negative (the add wraps, so that subtracts).
    pub fn add_inflight(&self, delta: i64) {
        self.inflight.fetch_add(delta as u64, Relaxed);
    }
}

/// Who holds LocalDNS's flows and how they moved, for a fleet view of every takeover. Both
/// listeners move together, so one holder stands for both.
#[derive(Debug, Default)]
pub struct Takeovers {
    /// 0 while LocalDNS holds the flows (or we stand by); else 1 + the index in
    /// [`Cause::ALL`] of the takeover in force.
    holding: AtomicU64,
    taken: [AtomicU64; Cause::ALL.len()],
    /// By the cause of the takeover each hand-back ended.
    handed: [AtomicU64; Cause::ALL.len()],
    /// Milliseconds since the Unix epoch; 0 for never.
    last_taken: AtomicU64,
    last_handed: AtomicU64,
}

/// Seconds since the Unix epoch; 0 for a time before it.
pub fn unix_secs(at: SystemTime) -> f64 {
    let since = at.duration_since(SystemTime::UNIX_EPOCH);
    since.unwrap_or_default().as_secs_f64()
}

fn unix_millis(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Takeovers {
    /// New flows come to us from `at` on. Counted once per takeover: taking again while we hold
    /// them changes nothing, not even the cause.
    pub fn took_over(&self, cause: Cause, at: SystemTime) {
        let index = cause as usize;
        let held = self
            .holding
            .compare_exchange(0, index as u64 + 1, Relaxed, Relaxed);
        if held.is_ok() {
            self.taken[index].fetch_add(1, Relaxed);
            self.last_taken.store(unix_millis(at), Relaxed);
        }
    }

    /// New flows go to LocalDNS again from `at` on; nothing if we did not hold them.
    pub fn handed_back(&self, at: SystemTime) {
        if let Some(index) = self.holding.swap(0, Relaxed).checked_sub(1) {
            self.handed[index as usize].fetch_add(1, Relaxed);
            self.last_handed.store(unix_millis(at), Relaxed);
        }
    }

    /// The cause of the takeover in force, while we hold the flows.
    pub fn holding(&self) -> Option<Cause> {
        let index = self.holding.load(Relaxed).checked_sub(1)?;
        Cause::ALL.get(index as usize).copied()
    }

    /// Takeovers and hand-backs so far, for `cause`.
    pub fn count(&self, cause: Cause) -> (u64, u64) {
        let i = cause as usize;
        (self.taken[i].load(Relaxed), self.handed[i].load(Relaxed))
    }

    /// Seconds since the Unix epoch of the last takeover and the last hand-back; 0 for never.
    pub fn last(&self) -> (f64, f64) {
        let secs = |a: &AtomicU64| a.load(Relaxed) as f64 / 1000.0;
        (secs(&self.last_taken), secs(&self.last_handed))
    }
}

/// Every counter of the process.
#[derive(Debug)]
pub struct Counters {
    pub started: SystemTime,
    /// Started as the standby (`--standby`), not as the fallback of a failed LocalDNS.
    pub standby: bool,
    pub takeovers: Takeovers,
    listeners: [Arc<ListenerStats>; 2],
    upstreams: Mutex<BTreeMap<(UpstreamGroup, SocketAddr), Arc<UpstreamStats>>>,
    /// Per group: where its upstreams came from, and how often the set changed.
    groups: Mutex<[(String, u64); 2]>,
}

/// Totals for the minute summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub answers: u64,
    pub servfail: u64,
    pub stale: u64,
    pub shed: u64,
}

impl Totals {
    pub fn since(self, earlier: Totals) -> Totals {
        Totals {
            answers: self.answers - earlier.answers,
            servfail: self.servfail - earlier.servfail,
            stale: self.stale - earlier.stale,
            shed: self.shed - earlier.shed,
        }
    }
}

impl Counters {
    /// `started` is the wall-clock time of the process's start, for `/metrics`.
    pub fn new(started: SystemTime, standby: bool) -> Arc<Counters> {
        Arc::new(Counters {
            started,
            standby,
            takeovers: Takeovers::default(),
            listeners: Default::default(),
            upstreams: Mutex::new(BTreeMap::new()),
            groups: Mutex::new([(String::from("none"), 0), (String::from("none"), 0)]),
        })
    }

    pub fn listener(&self, role: ListenerRole) -> &Arc<ListenerStats> {
        &self.listeners[role as usize]
    }

    /// The counters of one upstream server, created on first use and kept for good.
    pub fn upstream(&self, group: UpstreamGroup, addr: SocketAddr) -> Arc<UpstreamStats> {
        let mut map = self.upstreams.lock().unwrap_or_else(|p| p.into_inner());
        map.entry((group, addr)).or_default().clone()
    }

    /// Every upstream ever counted, in a stable order.
    pub fn upstreams(&self) -> Vec<((UpstreamGroup, SocketAddr), Arc<UpstreamStats>)> {
        let map = self.upstreams.lock().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(k, v)| (*k, v.clone())).collect()
    }

    /// A group got a new set of upstreams from `source`.
    pub fn upstreams_changed(&self, group: UpstreamGroup, source: &str) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let counted = &mut groups[group as usize];
        *counted = (source.to_string(), counted.1 + 1);
    }

    /// Discovery found no upstream for a group: where it looked, shown as the group's source.
    pub fn looked(&self, group: UpstreamGroup, looked: &str) {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())[group as usize].0 = looked.into();
    }

    /// Where a group's upstreams came from, and how often its set changed.
    pub fn group(&self, group: UpstreamGroup) -> (String, u64) {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())[group as usize].clone()
    }

    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        let count = |c: &AtomicU64| c.load(Relaxed);
        for l in &self.listeners {
            t.answers += l.responses.iter().flatten().map(count).sum::<u64>();
            t.servfail += l.responses.iter().map(|r| count(&r[2])).sum::<u64>();
            t.stale += l.stale.load(Relaxed);
            t.shed += l.shed.load(Relaxed);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_takeover_is_counted_once_and_its_hand_back_by_its_cause() {
        let t = Takeovers::default();
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_500);
        t.handed_back(at);
        assert_eq!(t.last(), (0.0, 0.0), "nothing held, nothing handed back");
        t.took_over(Cause::SilentProbe, at);
        t.took_over(Cause::AddressesGone, at + Duration::from_secs(1));
        assert_eq!(t.holding(), Some(Cause::SilentProbe));
        assert_eq!(t.count(Cause::SilentProbe), (1, 0));
        assert_eq!(t.count(Cause::AddressesGone), (0, 0));
        assert_eq!(t.last().0, 1_700_000_000.5);
        t.handed_back(at + Duration::from_secs(2));
        assert_eq!(t.holding(), None);
        assert_eq!(t.count(Cause::SilentProbe), (1, 1));
        assert_eq!(t.last().1, 1_700_000_002.5);
    }
}
