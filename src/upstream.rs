//! The upstream servers of each group and their passive health: which server a query tries next.
//!
//! Health is learned only from traffic and is forgiving: a server that let a try fail becomes
//! *suspect* and is tried after the others until any well-formed reply clears it; no server is
//! ever excluded, and when every server is suspect they are all still tried. Nothing here logs or
//! reads a clock: callers learn of changes from the return values and report them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::roles::UpstreamGroup;
use crate::stats::{Counters, UpstreamStats};

/// One group of interchangeable servers, shared by every relay thread; replaced whole when
/// discovery finds a new set.
#[derive(Debug)]
pub struct UpstreamSet {
    addrs: Vec<SocketAddr>,
    suspect: Vec<AtomicBool>,
    /// Rotates the first choice so load spreads over the kube-dns replicas.
    cursor: AtomicUsize,
    /// Failures of any server, ever: discovery looks again early when this climbs.
    failures: AtomicU64,
    /// Per server counters for /metrics; they outlive this set (see [`Counters::upstream`]).
    stats: Vec<Arc<UpstreamStats>>,
}

impl UpstreamSet {
    /// A set whose counters are its own (tests, and sets never exported).
    pub fn new(addrs: Vec<SocketAddr>) -> UpstreamSet {
        let stats = addrs.iter().map(|_| Arc::default()).collect();
        UpstreamSet::with_stats(addrs, stats)
    }

    /// A set counting into `counters`, where the counters of a server stay across set changes.
    pub fn counted(
        addrs: Vec<SocketAddr>,
        group: UpstreamGroup,
        counters: &Counters,
    ) -> UpstreamSet {
        let stats = addrs.iter().map(|a| counters.upstream(group, *a)).collect();
        UpstreamSet::with_stats(addrs, stats)
    }

    fn with_stats(addrs: Vec<SocketAddr>, stats: Vec<Arc<UpstreamStats>>) -> UpstreamSet {
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
        let n = unique.len();
        UpstreamSet {
            addrs: unique,
            suspect: (0..n).map(|_| AtomicBool::new(false)).collect(),
            cursor: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            stats: unique_stats,
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
    /// True when this cleared a suspect server.
    pub fn note_reply(&self, addr: SocketAddr, took: Duration) -> bool {
        let Some(i) = self.index(addr) else {
            return false;
        };
        self.stats[i].latency.observe(took);
        self.suspect[i].swap(false, Ordering::Relaxed)
    }

    /// A try timed out, could not be sent or was refused by the network. True when this made a
    /// healthy server suspect.
    pub fn note_failure(&self, addr: SocketAddr) -> bool {
        let Some(i) = self.index(addr) else {
            return false;
        };
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.stats[i].failures.fetch_add(1, Ordering::Relaxed);
        !self.suspect[i].swap(true, Ordering::Relaxed)
    }

    pub fn is_suspect(&self, addr: SocketAddr) -> bool {
        self.index(addr)
            .is_some_and(|i| self.suspect[i].load(Ordering::Relaxed))
    }
}

/// The sets in force for both groups; replaced whole when discovery finds a new set.
#[derive(Debug)]
pub struct UpstreamSets {
    pub vnet_dns: Arc<UpstreamSet>,
    pub kube_dns: Arc<UpstreamSet>,
}

impl UpstreamSets {
    pub fn get(&self, group: UpstreamGroup) -> &Arc<UpstreamSet> {
        match group {
            UpstreamGroup::VnetDns => &self.vnet_dns,
            UpstreamGroup::KubeDns => &self.kube_dns,
        }
    }

    /// Sets with no counters behind them (tests).
    pub fn uncounted(vnet_dns: Vec<SocketAddr>, kube_dns: Vec<SocketAddr>) -> UpstreamSets {
        UpstreamSets {
            vnet_dns: Arc::new(UpstreamSet::new(vnet_dns)),
            kube_dns: Arc::new(UpstreamSet::new(kube_dns)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(last: u8) -> SocketAddr {
        SocketAddr::from(([198, 18, 0, last], 53))
    }

    fn three() -> UpstreamSet {
        UpstreamSet::new(vec![addr(1), addr(2), addr(3)])
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
        assert!(u.note_failure(addr(1)), "became suspect");
        assert!(!u.note_failure(addr(1)), "already suspect");
        assert!(u.is_suspect(addr(1)));
        assert_eq!(u.pick(0, &[]), Some(addr(2)));
        assert_eq!(
            u.pick(0, &[addr(2), addr(3)]),
            Some(addr(1)),
            "never excluded"
        );
        assert!(u.note_reply(addr(1), Duration::ZERO), "recovered");
        assert!(!u.note_reply(addr(1), Duration::ZERO));
        assert_eq!(u.pick(0, &[]), Some(addr(1)));
    }

    #[test]
    fn all_suspect_still_tries_every_server() {
        let u = three();
        for i in 1..=3 {
            u.note_failure(addr(i));
        }
        assert_eq!(u.pick(2, &[]), Some(addr(3)));
        assert_eq!(u.pick(2, &[addr(3)]), Some(addr(1)));
    }

    #[test]
    fn once_all_were_tried_it_rounds_again() {
        let single = UpstreamSet::new(vec![addr(9)]);
        assert_eq!(single.pick(0, &[addr(9)]), Some(addr(9)));
        assert_eq!(single.pick(0, &[addr(9), addr(9)]), Some(addr(9)));
        let u = three();
        assert_eq!(u.pick(0, &[addr(1), addr(2), addr(3)]), Some(addr(1)));
    }

    #[test]
    fn a_server_listed_twice_is_one_server() {
        let u = UpstreamSet::new(vec![addr(1), addr(2), addr(1)]);
        assert_eq!(u.addrs(), [addr(1), addr(2)]);
        u.note_failure(addr(1));
        assert_eq!(
            u.pick(0, &[]),
            Some(addr(2)),
            "no healthy second copy of the dead one"
        );
    }

    #[test]
    fn empty_set_has_nothing_to_pick() {
        assert_eq!(UpstreamSet::new(vec![]).pick(0, &[]), None);
    }

    #[test]
    fn unknown_addresses_are_ignored() {
        let u = three();
        assert!(!u.note_failure(addr(200)));
        assert!(!u.note_reply(addr(200), Duration::ZERO));
        assert_eq!(u.pick(0, &[]), Some(addr(1)));
    }
}
