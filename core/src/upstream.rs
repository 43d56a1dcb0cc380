//! The upstream servers of each group and their passive health: which server a query tries next.
//!
//! Health is learned only from traffic and is forgiving. Each server keeps a smoothed round-trip
//! time and the number of tries it has outstanding. A query goes to the least busy of the servers
//! whose RTT is within a band of the fastest, so equal servers share evenly and a much slower one
//! gets little. A server that failed a try (unreachable, answered an error, or timed out twice in
//! a row) becomes *suspect* and is tried after the others. A single timeout among answers is
//! forgiven: each loss adds to a score that every answer wears down, and only a second loss before
//! the first is worn off makes the server suspect, so one lost packet costs a healthy server none
//! of its share. Suspect and slow servers still get a probe query every
//! `PROBE_EVERY`, so one that answers (or speeds up) again is back in rotation within a second. No
//! server is ever excluded, and when every server is suspect they are all still tried.
//!
//! Nothing here logs or reads the clock after creation: callers pass `now` and learn of changes
//! from the return values.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::roles::UpstreamGroup;
use crate::stats::{Counters, UpstreamStats};

/// How often a suspect or slow server gets one query to find out whether it recovered.
pub const PROBE_EVERY: Duration = Duration::from_millis(500);
/// Servers whose RTT is at most twice the fastest's plus this count as equally fast.
const BAND_SLACK_US: u32 = 2_000;
/// RTT samples a server needs before it can be judged slow: the first reply sets the smoothed
/// RTT alone, and one reply held up by a busy moment must not cost a server its share.
const SAMPLES_TO_JUDGE: u32 = 4;

/// What the set knows about one server.
#[derive(Debug, Default)]
struct Health {
    suspect: AtomicBool,
    /// Smoothed RTT and its mean deviation (RFC 6298), in microseconds; 0 before any sample.
    srtt_us: AtomicU32,
    rttvar_us: AtomicU32,
    /// Tries sent to it that have not yet ended (reply, failure or timeout).
    outstanding: AtomicU32,
    /// When it last got a probe, in ms since the set's epoch plus one; 0 means never.
    probed_ms: AtomicU64,
    /// Recent timeouts, in eighths: a timeout adds `LOSS`, an answer takes one eighth off.
    losses: AtomicU32,
    /// RTT samples taken, up to `SAMPLES_TO_JUDGE`.
    samples: AtomicU32,
}

/// What one timeout adds to a server's loss score; a score of `SUSPECT_AT` or more makes it
/// suspect. So a second timeout within four answers of the first demotes the server at once, and
/// a loss one answer in eight or rarer never does.
const LOSS: u32 = 8;
const SUSPECT_AT: u32 = 12;

/// Where a query's next try goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub addr: SocketAddr,
    /// A probe of a suspect or slow server: the query should not wait long for it.
    pub probe: bool,
}

/// One group of interchangeable servers, shared by every relay thread; replaced whole when
/// discovery finds a new set.
#[derive(Debug)]
pub struct UpstreamSet {
    addrs: Vec<SocketAddr>,
    health: Vec<Health>,
    /// Breaks ties between equal servers in turn, so load spreads over the kube-dns replicas.
    cursor: AtomicUsize,
    /// Failures of any server, ever: discovery looks again early when this climbs.
    failures: AtomicU64,
    /// Per server counters for /metrics; they outlive this set (see [`Counters::upstream`]).
    stats: Vec<Arc<UpstreamStats>>,
    /// The origin of `probed_ms` and `heard_ms`, given by whoever makes the set.
    epoch: Instant,
    /// When any server last sent a reply, in ms since `epoch` plus one; 0 means never.
    heard_ms: AtomicU64,
}

impl UpstreamSet {
    /// A set whose counters are its own (tests, and sets never exported). `epoch` is any
    /// instant no later than the first `now` the set will be given.
    pub fn new(addrs: Vec<SocketAddr>, epoch: Instant) -> UpstreamSet {
        let stats = addrs.iter().map(|_| Arc::default()).collect();
        UpstreamSet::with_stats(addrs, stats, epoch)
    }

    /// A set counting into `counters`, where the counters of a server stay across set changes.
    pub fn counted(
        addrs: Vec<SocketAddr>,
        group: UpstreamGroup,
        counters: &Counters,
        epoch: Instant,
    ) -> UpstreamSet {
        let stats = addrs.iter().map(|a| counters.upstream(group, *a)).collect();
        UpstreamSet::with_stats(addrs, stats, epoch)
    }

    fn with_stats(
        addrs: Vec<SocketAddr>,
        stats: Vec<Arc<UpstreamStats>>,
        epoch: Instant,
    ) -> UpstreamSet {
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
        UpstreamSet {
            health: unique.iter().map(|_| Health::default()).collect(),
            addrs: unique,
            cursor: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            stats: unique_stats,
            epoch,
            heard_ms: AtomicU64::new(0),
        }
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    pub fn contains(&self, addr: SocketAddr) -> bool {
        self.index(addr).is_some()
    }

    /// Where a new query starts when breaking ties.
    pub fn next_start(&self) -> usize {
        self.cursor.fetch_add(1, Relaxed)
    }

    /// The server for a query's next try, not one of `tried` nor of `excluded` (servers that
    /// answered this query with an error). On a query's first try a suspect or slow server that
    /// is due a probe gets it. Once every server was tried, round again over those not excluded;
    /// `None` when all are excluded.
    pub fn choose(
        &self,
        start: usize,
        tried: &[SocketAddr],
        excluded: &[SocketAddr],
        now: Instant,
    ) -> Option<Choice> {
        // Runs once per try: filters over the rotation order, no allocation.
        let n = self.addrs.len();
        // One division per try, not one per server visited in each of the passes below.
        let start = start.checked_rem(n).unwrap_or(0);
        let order = move || {
            (0..n).map(move |k| {
                if start + k < n {
                    start + k
                } else {
                    start + k - n
                }
            })
        };
        let open = move |i: &usize| !excluded.contains(&self.addrs[*i]);
        let fresh = move |i: &usize| open(i) && !tried.contains(&self.addrs[*i]);
        let healthy = move |i: &usize| fresh(i) && !self.suspect(*i);
        let open_count = order().filter(open).count();
        if open_count == 0 {
            return None;
        }
        if !order().any(|i| fresh(&i)) {
            let i = order().filter(open).nth(tried.len() % open_count)?;
            return Some(Choice {
                addr: self.addrs[i],
                probe: false,
            });
        }
        let srtt = |i: usize| self.health[i].srtt_us.load(Relaxed);
        let best = order().filter(healthy).map(srtt).min().unwrap_or(0);
        let in_band = move |i: &usize| {
            let s = srtt(*i);
            s == 0
                || self.health[*i].samples.load(Relaxed) < SAMPLES_TO_JUDGE
                || s <= best.saturating_mul(2).saturating_add(BAND_SLACK_US)
        };
        if tried.is_empty() {
            let now_ms = now.saturating_duration_since(self.epoch).as_millis() as u64 + 1;
            let due = order()
                .filter(fresh)
                .find(|i| (self.suspect(*i) || !in_band(i)) && self.claim_probe(*i, now_ms));
            if let Some(i) = due {
                return Some(Choice {
                    addr: self.addrs[i],
                    probe: true,
                });
            }
        }
        let banded = move |i: &usize| healthy(i) && in_band(i);
        // The first non-empty pool of: healthy and in band, healthy, any not yet tried. Least
        // outstanding first; min_by_key keeps the first of equals in rotation order, so equal
        // servers take turns.
        let outstanding = |i: &usize| self.health[*i].outstanding.load(Relaxed);
        let i = order()
            .filter(banded)
            .min_by_key(outstanding)
            .or_else(|| order().filter(healthy).min_by_key(outstanding))
            .or_else(|| order().filter(fresh).min_by_key(outstanding))?;
        Some(Choice {
            addr: self.addrs[i],
            probe: false,
        })
    }

    fn suspect(&self, i: usize) -> bool {
        self.health[i].suspect.load(Relaxed)
    }

    fn claim_probe(&self, i: usize, now_ms: u64) -> bool {
        let probed = &self.health[i].probed_ms;
        let last = probed.load(Relaxed);
        (last == 0 || now_ms.saturating_sub(last) >= PROBE_EVERY.as_millis() as u64)
            && probed
                .compare_exchange(last, now_ms, Relaxed, Relaxed)
                .is_ok()
    }

    /// How long a try at `addr` may go unanswered before the query also asks elsewhere: its
    /// smoothed RTT plus four deviations, within `[floor, ceiling]`; `unknown` before any sample.
    pub fn hedge_delay(
        &self,
        addr: SocketAddr,
        floor: Duration,
        ceiling: Duration,
        unknown: Duration,
    ) -> Duration {
        let Some(i) = self.index(addr) else {
            return unknown.clamp(floor, ceiling);
        };
        let h = &self.health[i];
        let srtt = h.srtt_us.load(Relaxed);
        if srtt == 0 {
            return unknown.clamp(floor, ceiling);
        }
        let us = u64::from(srtt) + 4 * u64::from(h.rttvar_us.load(Relaxed));
        Duration::from_micros(us).clamp(floor, ceiling)
    }

    pub fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
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
            self.stats[i].queries.fetch_add(1, Relaxed);
            self.health[i].outstanding.fetch_add(1, Relaxed);
        }
    }

    fn end_try(&self, i: usize) {
        let _ = self.health[i]
            .outstanding
            .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
    }

    /// A well-formed reply came `took` after its try was sent: the server is alive. `ends_try`
    /// unless the try was already counted as ended (a late reply after its timeout). True when
    /// this cleared a suspect server.
    pub fn note_reply(&self, addr: SocketAddr, took: Duration, ends_try: bool) -> bool {
        let Some(i) = self.index(addr) else {
            return false;
        };
        if ends_try {
            self.end_try(i);
        }
        self.stats[i].latency.observe(took);
        let h = &self.health[i];
        let _ = h
            .losses
            .fetch_update(Relaxed, Relaxed, |l| (l > 0).then(|| l - 1));
        let _ = h.samples.fetch_update(Relaxed, Relaxed, |n| {
            (n < SAMPLES_TO_JUDGE).then_some(n + 1)
        });
        let sample = u32::try_from(took.as_micros()).unwrap_or(u32::MAX).max(1);
        let srtt = h.srtt_us.load(Relaxed);
        if srtt == 0 {
            h.srtt_us.store(sample, Relaxed);
            h.rttvar_us.store(sample / 2, Relaxed);
        } else {
            let var = h.rttvar_us.load(Relaxed);
            let deviation = srtt.abs_diff(sample);
            h.rttvar_us.store(var - var / 4 + deviation / 4, Relaxed);
            h.srtt_us.store(srtt - srtt / 8 + sample / 8, Relaxed);
        }
        h.suspect.swap(false, Relaxed)
    }

    /// A try at `addr` ended without an answer. With `blame` (a timeout, the network refusing,
    /// an error reply) the server becomes suspect: true when that is a change. Without (our own
    /// resources ran out), only the try is counted as ended.
    pub fn note_failure(&self, addr: SocketAddr, blame: bool) -> bool {
        self.note_failure_of(addr, blame, true)
    }

    /// As [`UpstreamSet::note_failure`], for a failure that may not end a try of its own
    /// (`ends_try` false: the network said the server is unreachable).
    pub fn note_failure_of(&self, addr: SocketAddr, blame: bool, ends_try: bool) -> bool {
        let Some(i) = self.index(addr) else {
            return false;
        };
        if ends_try {
            self.end_try(i);
        }
        if !blame {
            return false;
        }
        self.failures.fetch_add(1, Relaxed);
        self.stats[i].failures.fetch_add(1, Relaxed);
        !self.health[i].suspect.swap(true, Relaxed)
    }

    /// A try at `addr` timed out. Counted like any failure, but the server becomes suspect only
    /// when its loss score reaches `SUSPECT_AT` (see the module's note): true when that is a
    /// change.
    pub fn note_loss(&self, addr: SocketAddr, ends_try: bool) -> bool {
        let Some(i) = self.index(addr) else {
            return false;
        };
        if ends_try {
            self.end_try(i);
        }
        self.failures.fetch_add(1, Relaxed);
        self.stats[i].failures.fetch_add(1, Relaxed);
        let h = &self.health[i];
        let score = h.losses.fetch_add(LOSS, Relaxed).saturating_add(LOSS);
        score >= SUSPECT_AT && !h.suspect.swap(true, Relaxed)
    }

    /// A server of the group sent a reply at `now`, an error reply included: it is alive.
    pub fn note_heard(&self, now: Instant) {
        let now_ms = now.saturating_duration_since(self.epoch).as_millis() as u64 + 1;
        self.heard_ms.fetch_max(now_ms, Relaxed);
    }

    /// The group is down: every server failed lately and none has sent a reply of any kind in
    /// the last second. A query is better answered at once than after a whole query budget.
    /// False for an empty set.
    pub fn down(&self, now: Instant) -> bool {
        let now_ms = now.saturating_duration_since(self.epoch).as_millis() as u64 + 1;
        let heard = self.heard_ms.load(Relaxed);
        !self.addrs.is_empty()
            && (heard == 0 || now_ms.saturating_sub(heard) >= 1000)
            && (0..self.addrs.len()).all(|i| self.suspect(i))
    }

    /// Is some server due a probe at `now` (see [`PROBE_EVERY`])? Nothing is claimed: the try
    /// that follows claims it.
    pub fn probe_due(&self, now: Instant) -> bool {
        let now_ms = now.saturating_duration_since(self.epoch).as_millis() as u64 + 1;
        self.health.iter().any(|h| {
            let last = h.probed_ms.load(Relaxed);
            last == 0 || now_ms.saturating_sub(last) >= PROBE_EVERY.as_millis() as u64
        })
    }

    pub fn is_suspect(&self, addr: SocketAddr) -> bool {
        self.index(addr).is_some_and(|i| self.suspect(i))
    }

    /// The smoothed RTT of `addr`, if it has answered yet.
    pub fn srtt(&self, addr: SocketAddr) -> Option<Duration> {
        let i = self.index(addr)?;
        let us = self.health[i].srtt_us.load(Relaxed);
        (us > 0).then(|| Duration::from_micros(u64::from(us)))
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
    pub fn uncounted(
        vnet_dns: Vec<SocketAddr>,
        kube_dns: Vec<SocketAddr>,
        epoch: Instant,
    ) -> UpstreamSets {
        UpstreamSets {
            vnet_dns: Arc::new(UpstreamSet::new(vnet_dns, epoch)),
            kube_dns: Arc::new(UpstreamSet::new(kube_dns, epoch)),
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
        UpstreamSet::new(vec![addr(1), addr(2), addr(3)], Instant::now())
    }

    fn pick(u: &UpstreamSet, start: usize, tried: &[SocketAddr]) -> Option<SocketAddr> {
        u.choose(start, tried, &[], u.epoch).map(|c| c.addr)
    }

    /// `n` queries, each answered in 1 ms by whichever server it went to: the share of `addr`.
    fn share_of(u: &UpstreamSet, addr: SocketAddr, n: usize) -> usize {
        (0..n)
            .filter(|_| {
                let start = u.next_start();
                let to = pick(u, start, &[]).unwrap();
                u.note_sent(to);
                u.note_reply(to, Duration::from_millis(1), true);
                to == addr
            })
            .count()
    }

    #[test]
    fn a_single_loss_costs_no_share_and_a_second_in_a_row_demotes_at_once() {
        let u = UpstreamSet::new(vec![addr(1), addr(2)], Instant::now());
        share_of(&u, addr(1), 20);
        u.note_sent(addr(1));
        assert!(!u.note_loss(addr(1), true), "one loss is forgiven");
        assert!(!u.is_suspect(addr(1)));
        let share = share_of(&u, addr(1), 200);
        assert!(
            (95..=105).contains(&share),
            "share after one loss: {share} of 200"
        );
        // Two in a row: suspect at once.
        u.note_sent(addr(2));
        assert!(!u.note_loss(addr(2), true));
        u.note_sent(addr(2));
        assert!(u.note_loss(addr(2), true), "a second loss in a row demotes");
        assert!(u.is_suspect(addr(2)));
        // A loss one answer in eight or rarer never demotes; one in three does.
        let u = UpstreamSet::new(vec![addr(1)], Instant::now());
        for _ in 0..10 {
            u.note_sent(addr(1));
            assert!(!u.note_loss(addr(1), true));
            share_of(&u, addr(1), 8);
        }
        let mut demoted = false;
        for _ in 0..5 {
            u.note_sent(addr(1));
            demoted |= u.note_loss(addr(1), true);
            share_of(&u, addr(1), 3);
        }
        assert!(demoted, "repeated losses demote");
    }

    /// Answers `n` tries at `a`, each `rtt` after it was sent.
    fn answer(u: &UpstreamSet, a: SocketAddr, rtt_us: u64, n: usize) {
        for _ in 0..n {
            u.note_sent(a);
            u.note_reply(a, Duration::from_micros(rtt_us), true);
        }
    }

    #[test]
    fn equal_servers_take_turns() {
        let u = three();
        let firsts: Vec<_> = (0..3)
            .map(|_| pick(&u, u.next_start(), &[]).unwrap())
            .collect();
        assert_eq!(firsts, vec![addr(1), addr(2), addr(3)]);
        for a in [addr(1), addr(2), addr(3)] {
            answer(&u, a, 300, 5);
        }
        let mut counts = [0; 3];
        for _ in 0..300 {
            let a = pick(&u, u.next_start(), &[]).unwrap();
            let k = [addr(1), addr(2), addr(3)]
                .iter()
                .position(|x| *x == a)
                .unwrap();
            counts[k] += 1;
        }
        assert_eq!(counts, [100, 100, 100], "even shares");
    }

    #[test]
    fn the_least_busy_server_goes_first() {
        let u = UpstreamSet::new(vec![addr(1), addr(2)], Instant::now());
        answer(&u, addr(1), 300, 3);
        answer(&u, addr(2), 300, 3);
        u.note_sent(addr(1));
        u.note_sent(addr(1));
        for start in 0..4 {
            assert_eq!(pick(&u, start, &[]), Some(addr(2)), "start {start}");
        }
    }

    #[test]
    fn one_slow_first_reply_does_not_cost_a_server_its_share() {
        let u = UpstreamSet::new(vec![addr(1), addr(2)], Instant::now());
        answer(&u, addr(1), 300, 8);
        // Its first reply was held up 20 ms (a busy moment): still one of the equals.
        answer(&u, addr(2), 20_000, 1);
        let t = u.epoch + Duration::from_secs(10);
        let to_2 = (0..20)
            .filter(|&k| u.choose(k, &[], &[], t).unwrap().addr == addr(2))
            .count();
        assert_eq!(to_2, 10, "an even share");
        // Slow reply after slow reply: judged slow, and probed only.
        answer(&u, addr(2), 20_000, 3);
        let to_2 = (0..20)
            .filter(|&k| {
                let c = u
                    .choose(k, &[], &[], t + Duration::from_millis(k as u64))
                    .unwrap();
                c.addr == addr(2) && !c.probe
            })
            .count();
        assert_eq!(to_2, 0, "a slow server gets probes only");
    }

    #[test]
    fn a_much_slower_server_gets_only_probes() {
        let u = UpstreamSet::new(vec![addr(1), addr(2)], Instant::now());
        answer(&u, addr(1), 300, 8);
        answer(&u, addr(2), 200_000, 8);
        let t = u.epoch + Duration::from_secs(10);
        let first = u.choose(0, &[], &[], t).unwrap();
        assert_eq!(
            first,
            Choice {
                addr: addr(2),
                probe: true
            },
            "the slow one is probed"
        );
        for k in 0..50 {
            let c = u
                .choose(k, &[], &[], t + Duration::from_millis(k as u64))
                .unwrap();
            assert_eq!(c.addr, addr(1), "query {k}");
        }
        let later = u.choose(0, &[], &[], t + PROBE_EVERY).unwrap();
        assert_eq!(
            later,
            Choice {
                addr: addr(2),
                probe: true
            },
            "probed again"
        );
    }

    #[test]
    fn retries_go_to_servers_not_yet_tried() {
        let u = three();
        assert_eq!(pick(&u, 1, &[addr(2)]), Some(addr(3)));
        assert_eq!(pick(&u, 1, &[addr(2), addr(3)]), Some(addr(1)));
    }

    #[test]
    fn suspect_servers_go_last_are_probed_and_come_back_when_they_answer() {
        let u = three();
        u.note_sent(addr(1));
        assert!(u.note_failure(addr(1), true), "became suspect");
        u.note_sent(addr(1));
        assert!(!u.note_failure(addr(1), true), "already suspect");
        assert!(u.is_suspect(addr(1)));
        let t = u.epoch + Duration::from_secs(5);
        assert_eq!(
            u.choose(0, &[], &[], t),
            Some(Choice {
                addr: addr(1),
                probe: true
            })
        );
        assert_eq!(
            u.choose(0, &[], &[], t).map(|c| c.addr),
            Some(addr(2)),
            "one probe at a time"
        );
        assert_eq!(
            pick(&u, 0, &[addr(2), addr(3)]),
            Some(addr(1)),
            "never excluded"
        );
        u.note_sent(addr(1));
        assert!(
            u.note_reply(addr(1), Duration::from_micros(300), true),
            "recovered"
        );
        assert!(!u.note_reply(addr(1), Duration::ZERO, true));
        assert_eq!(u.choose(0, &[], &[], t).map(|c| c.addr), Some(addr(1)));
    }

    #[test]
    fn local_failures_do_not_make_a_server_suspect() {
        let u = three();
        u.note_sent(addr(1));
        assert!(!u.note_failure(addr(1), false));
        assert!(!u.is_suspect(addr(1)));
        assert_eq!(u.failures(), 0);
    }

    #[test]
    fn all_suspect_still_tries_every_server() {
        let u = three();
        for i in 1..=3 {
            u.note_failure(addr(i), true);
        }
        assert!(pick(&u, 2, &[]).is_some());
        assert_eq!(pick(&u, 2, &[addr(3)]).map(|a| a != addr(3)), Some(true));
    }

    #[test]
    fn once_all_were_tried_it_rounds_again_but_never_to_an_excluded_one() {
        let single = UpstreamSet::new(vec![addr(9)], Instant::now());
        assert_eq!(pick(&single, 0, &[addr(9)]), Some(addr(9)));
        assert_eq!(single.choose(0, &[addr(9)], &[addr(9)], single.epoch), None);
        let u = three();
        assert_eq!(pick(&u, 0, &[addr(1), addr(2), addr(3)]), Some(addr(1)));
        let excluded = [addr(1), addr(3)];
        let c = u.choose(0, &[addr(1), addr(2), addr(3)], &excluded, u.epoch);
        assert_eq!(c.map(|c| c.addr), Some(addr(2)));
    }

    #[test]
    fn hedge_delay_follows_the_rtt_within_bounds() {
        let u = three();
        let (floor, ceiling, unknown) = (
            Duration::from_millis(5),
            Duration::from_secs(1),
            Duration::from_millis(100),
        );
        assert_eq!(u.hedge_delay(addr(1), floor, ceiling, unknown), unknown);
        answer(&u, addr(1), 300, 10);
        assert_eq!(u.hedge_delay(addr(1), floor, ceiling, unknown), floor);
        answer(&u, addr(2), 50_000, 20);
        let d = u.hedge_delay(addr(2), floor, ceiling, unknown);
        assert!(
            d >= Duration::from_millis(50) && d < Duration::from_millis(200),
            "{d:?}"
        );
        answer(&u, addr(3), 5_000_000, 20);
        assert_eq!(u.hedge_delay(addr(3), floor, ceiling, unknown), ceiling);
    }

    #[test]
    fn a_server_listed_twice_is_one_server() {
        let u = UpstreamSet::new(vec![addr(1), addr(2), addr(1)], Instant::now());
        assert_eq!(u.addrs(), [addr(1), addr(2)]);
        u.note_failure(addr(1), true);
        assert_eq!(pick(&u, 0, &[]), Some(addr(1)), "probed once");
        assert_eq!(
            pick(&u, 0, &[]),
            Some(addr(2)),
            "no healthy second copy of the dead one"
        );
    }

    #[test]
    fn empty_set_has_nothing_to_choose() {
        let u = UpstreamSet::new(vec![], Instant::now());
        assert_eq!(u.choose(0, &[], &[], u.epoch), None);
    }

    #[test]
    fn unknown_addresses_are_ignored() {
        let u = three();
        assert!(!u.note_failure(addr(200), true));
        assert!(!u.note_reply(addr(200), Duration::ZERO, true));
        assert_eq!(pick(&u, 0, &[]), Some(addr(1)));
    }
}
