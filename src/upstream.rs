//! Upstream groups and their passive health: which server a query tries next.
//!
//! Health is learned only from traffic and is forgiving (CONTEXT §5): a server that let a try time
//! out becomes *suspect* and is tried after the others until any well-formed reply clears it; no
//! server is ever excluded, and when every server is suspect they are all still tried.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::metrics::{Metrics, UpstreamStats};

/// How often a warning about one upstream may be logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The two places a query can be sent, as LocalDNS routes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    /// The VNet DNS servers: every name the node listener is asked outside the cluster domain.
    Node,
    /// The kube-dns backends: everything on the cluster listener, and the cluster domain on the node
    /// listener.
    Cluster,
}

impl Group {
    pub fn name(self) -> &'static str {
        match self {
            Group::Node => "node",
            Group::Cluster => "cluster",
        }
    }
}

/// One group of interchangeable upstream servers, shared by every worker and connection.
#[derive(Debug)]
pub struct Upstreams {
    addrs: Vec<SocketAddr>,
    suspect: Vec<AtomicBool>,
    /// Timeouts since the last warning, per server, so a warning can say how many it covers.
    timeouts: Vec<AtomicU64>,
    /// Milliseconds since `epoch` of the last warning per server; 0 means never.
    last_warn_ms: Vec<AtomicU64>,
    epoch: Instant,
    /// Rotates the first choice so load spreads over the kube-dns replicas.
    cursor: AtomicUsize,
    /// Failures of any server, ever: discovery looks again early when this climbs.
    failures: AtomicU64,
    /// Per server counters for /metrics; they outlive this set (see `Metrics::upstream`).
    stats: Vec<Arc<UpstreamStats>>,
}

impl Upstreams {
    /// A group whose counters are its own (tests, and sets never exported).
    pub fn new(addrs: Vec<SocketAddr>) -> Upstreams {
        let stats = addrs.iter().map(|_| Arc::default()).collect();
        Upstreams::with_stats(addrs, stats)
    }

    /// A group counting into `metrics`, where the counters of a server stay across set changes.
    pub fn counted(addrs: Vec<SocketAddr>, group: Group, metrics: &Metrics) -> Upstreams {
        let stats = addrs.iter().map(|a| metrics.upstream(group, *a)).collect();
        Upstreams::with_stats(addrs, stats)
    }

    fn with_stats(addrs: Vec<SocketAddr>, stats: Vec<Arc<UpstreamStats>>) -> Upstreams {
        // A server listed twice would stay "healthy" through its second entry after the first
        // was marked suspect; each server is listed once, first place kept.
        let mut unique: Vec<SocketAddr> = Vec::with_capacity(addrs.len());
        let mut unique_stats = Vec::with_capacity(addrs.len());
        for (addr, stat) in addrs.into_iter().zip(stats) {
            if !unique.contains(&addr) {
                unique.push(addr);
                unique_stats.push(stat);
            }
        }
        let (addrs, stats) = (unique, unique_stats);
        let n = addrs.len();
        Upstreams {
            addrs,
            suspect: (0..n).map(|_| AtomicBool::new(false)).collect(),
            timeouts: (0..n).map(|_| AtomicU64::new(0)).collect(),
            last_warn_ms: (0..n).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            cursor: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            stats,
        }
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Where a new query starts its walk through the servers.
    pub fn next_start(&self) -> usize {
        self.cursor.fetch_add(1, Ordering::Relaxed)
    }

    /// The server for a query's next try: healthy servers first in rotation order from `start`,
    /// then suspect ones, skipping those already `tried`; once all were tried, round again.
    pub fn pick(&self, start: usize, tried: &[SocketAddr]) -> Option<SocketAddr> {
        let n = self.addrs.len();
        if n == 0 {
            return None;
        }
        for want_suspect in [false, true] {
            for k in 0..n {
                let i = (start + k) % n;
                let addr = self.addrs[i];
                if self.suspect[i].load(Ordering::Relaxed) == want_suspect && !tried.contains(&addr)
                {
                    return Some(addr);
                }
            }
        }
        Some(self.addrs[(start + tried.len()) % n])
    }

    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Same servers, whatever the order? (Sources may list backends in another order each time;
    /// that is not a change worth a swap and a log line.)
    pub fn same_servers(&self, other: &[SocketAddr]) -> bool {
        let mut a = self.addrs.clone();
        let mut b = other.to_vec();
        a.sort();
        a.dedup();
        b.sort();
        b.dedup();
        a == b
    }

    fn index(&self, addr: SocketAddr) -> Option<usize> {
        self.addrs.iter().position(|a| *a == addr)
    }

    /// A try is on its way to `addr`.
    pub fn note_sent(&self, addr: SocketAddr) {
        if let Some(i) = self.index(addr) {
            self.stats[i].queries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Any well-formed reply proves the server alive. `took` is the time since its try was sent.
    pub fn note_reply(&self, addr: SocketAddr, took: Duration) {
        if let Some(i) = self.index(addr) {
            self.stats[i].latency.observe(took);
            if self.suspect[i].load(Ordering::Relaxed) {
                self.suspect[i].store(false, Ordering::Relaxed);
                tracing::info!(upstream = %addr, "upstream answers again");
            }
        }
    }

    /// A try timed out or could not be sent. Marks the server suspect and logs a warning at most
    /// once per `WARN_EVERY` per server.
    pub fn note_failure(&self, addr: SocketAddr, group: Group, why: &str) {
        let Some(i) = self.index(addr) else { return };
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.stats[i].failures.fetch_add(1, Ordering::Relaxed);
        self.suspect[i].store(true, Ordering::Relaxed);
        let missed = self.timeouts[i].fetch_add(1, Ordering::Relaxed) + 1;
        let now_ms = self.epoch.elapsed().as_millis() as u64 + 1;
        let last = self.last_warn_ms[i].load(Ordering::Relaxed);
        if (last == 0 || now_ms.saturating_sub(last) >= WARN_EVERY.as_millis() as u64)
            && self.last_warn_ms[i]
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.timeouts[i].store(0, Ordering::Relaxed);
            tracing::warn!(
                upstream = %addr,
                group = group.name(),
                failures = missed,
                "upstream {why}; trying other upstreams first"
            );
        }
    }

    #[cfg(test)]
    fn is_suspect(&self, addr: SocketAddr) -> bool {
        self.index(addr)
            .is_some_and(|i| self.suspect[i].load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(last: u8) -> SocketAddr {
        SocketAddr::from(([198, 18, 0, last], 53))
    }

    fn three() -> Upstreams {
        Upstreams::new(vec![addr(1), addr(2), addr(3)])
    }

    #[test]
    fn rotates_the_first_choice() {
        let u = three();
        let firsts: Vec<_> = (0..3)
            .map(|_| u.pick(u.next_start(), &[]).unwrap())
            .collect();
        assert_eq!(firsts, vec![addr(1), addr(2), addr(3)]);
    }

    #[test]
    fn retries_go_to_servers_not_yet_tried() {
        let u = three();
        assert_eq!(u.pick(1, &[addr(2)]), Some(addr(3)));
        assert_eq!(u.pick(1, &[addr(2), addr(3)]), Some(addr(1)));
    }

    #[test]
    fn suspect_servers_go_last_until_they_answer() {
        let u = three();
        u.note_failure(addr(1), Group::Cluster, "timed out");
        assert!(u.is_suspect(addr(1)));
        assert_eq!(u.pick(0, &[]), Some(addr(2)));
        assert_eq!(
            u.pick(0, &[addr(2), addr(3)]),
            Some(addr(1)),
            "never excluded"
        );
        u.note_reply(addr(1), Duration::ZERO);
        assert_eq!(u.pick(0, &[]), Some(addr(1)));
    }

    #[test]
    fn all_suspect_still_tries_every_server() {
        let u = three();
        for i in 1..=3 {
            u.note_failure(addr(i), Group::Node, "timed out");
        }
        assert_eq!(u.pick(2, &[]), Some(addr(3)));
        assert_eq!(u.pick(2, &[addr(3)]), Some(addr(1)));
    }

    #[test]
    fn once_all_were_tried_it_rounds_again() {
        let single = Upstreams::new(vec![addr(9)]);
        assert_eq!(single.pick(0, &[addr(9)]), Some(addr(9)));
        assert_eq!(single.pick(0, &[addr(9), addr(9)]), Some(addr(9)));
        let u = three();
        assert_eq!(u.pick(0, &[addr(1), addr(2), addr(3)]), Some(addr(1)));
    }

    #[test]
    fn a_server_listed_twice_is_one_server() {
        let u = Upstreams::new(vec![addr(1), addr(2), addr(1)]);
        assert_eq!(u.addrs(), [addr(1), addr(2)]);
        u.note_failure(addr(1), Group::Cluster, "timed out");
        assert_eq!(
            u.pick(0, &[]),
            Some(addr(2)),
            "no healthy second copy of the dead one"
        );
    }

    #[test]
    fn empty_group_has_nothing_to_pick() {
        assert_eq!(Upstreams::new(vec![]).pick(0, &[]), None);
    }

    #[test]
    fn unknown_addresses_are_ignored() {
        let u = three();
        u.note_failure(addr(200), Group::Node, "timed out");
        u.note_reply(addr(200), Duration::ZERO);
        assert_eq!(u.pick(0, &[]), Some(addr(1)));
    }
}
