//! The upstream servers of each group and their passive health: which server a query tries next,
//! and whether the group is down.
//!
//! Health is learned only from evidence, and a reply of any RCODE is life. Each server keeps a
//! smoothed round-trip time and the number of tries it has outstanding (a try past its hedge
//! point is likely lost and no longer counts). A query goes to the least busy of the servers whose
//! RTT is within a band of the fastest, so equal servers share evenly and a much slower one gets
//! little. An error reply (SERVFAIL, REFUSED) is that server's answer for one name: the query asks
//! another server, and the server's standing does not change. A server becomes *suspect*, and is
//! tried after the others, when the network refuses a try or its tries go unanswered: a single
//! timeout among answers is forgiven (each loss adds to a score that every answer wears down, and
//! only a second loss before the first is worn off makes the server suspect). Suspect and slow
//! servers still get a probe query every `PROBE_EVERY`, so one that answers (or speeds up) again
//! is back in rotation within a second. No server is ever excluded.
//!
//! A group is *down* only when each of its servers is silent on the evidence: since its last
//! reply of any kind, tries for two different names went unanswered for their whole time (or
//! tries for one name, for a whole query budget), the latest judged within `SILENCE_COUNTS`. Silence counts only for tries sent, so a quiet listener
//! never makes a healthy upstream look dead; and it takes two names, so one name that the
//! upstream is slow to resolve (over a second, within the query budget) does not fail the others
//! (that name's own repeats are the resolution-failure cache's business). One name unanswered
//! for a whole budget is enough: a lone client in an outage asks one name at a time. The price:
//! after one name the upstream takes longer than the whole budget to answer, with nothing else
//! heard, the next name is answered at once until a probe is answered.
//!
//! Nothing here logs or reads the clock after creation: callers pass `now` and learn of changes
//! from the return values.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::hosts::Hosts;
use crate::roles::UpstreamGroup;
use crate::stats::{Counters, UpstreamStats};

/// How often a suspect or slow server gets one query to find out whether it recovered.
pub const PROBE_EVERY: Duration = Duration::from_millis(500);
/// Servers whose RTT is at most twice the fastest's plus this count as equally fast.
const BAND_SLACK_US: u32 = 2_000;
/// How long an unanswered try counts as evidence that its server is silent. A try is judged
/// unanswered at its timeout (a second after it went out), so during an outage that still has
/// traffic, each probe's timeout renews the evidence before the last one's runs out.
pub const SILENCE_COUNTS: Duration = Duration::from_secs(1);
/// RTT samples a server needs before it can be judged slow: the first reply sets the smoothed
/// RTT alone, and one reply held up by a busy moment must not cost a server its share.
const SAMPLES_TO_JUDGE: u32 = 4;
/// How often a standby beside a serving LocalDNS asks each group a question of its own (see
/// [`UpstreamSet::question_due`]): within the 10 s in which it must prove it could serve.
pub const ASK_EVERY: Duration = Duration::from_secs(9);
/// Each server of a group is asked at least this often, however many there are.
const EACH_ASKED_EVERY: Duration = Duration::from_secs(54);
/// A group is ready while one of its servers answered within this.
pub const READY_FOR: Duration = Duration::from_secs(30);

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
    /// When it last sent a reply of any kind, late ones included.
    replied_ms: AtomicU64,
    /// The latest send time of a try it left unanswered, and when that was judged.
    unanswered_sent_ms: AtomicU64,
    unanswered_at_ms: AtomicU64,
    /// The current run of unanswered tries (sent after its last reply): the first one's send
    /// time and name, and whether another name went unanswered in it too.
    run_sent_ms: AtomicU64,
    run_name: AtomicU64,
    run_names: AtomicBool,
    /// Tries in a row that went past their hedge point unanswered, since its last reply.
    late: AtomicU32,
}

/// What one timeout adds to a server's loss score; a score of `SUSPECT_AT` or more makes it
/// suspect. So a second timeout within four answers of the first demotes the server at once, and
/// a loss one answer in eight or rarer never does.
const LOSS: u32 = 8;
const SUSPECT_AT: u32 = 12;
/// Tries in a row past their hedge point with no reply that make a server tried after the others
/// until it answers. A server that dies is known at its second late try, milliseconds later,
/// not at its second timeout a second later: meanwhile half the queries would go to it and need
/// a hedge each, more than the hedge budget holds (15 queries of a burst waited a whole
/// `--upstream-timeout`). One late try, one lost packet, is forgiven.
const LATE_AT: u32 = 2;

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
    /// When the group's last question of its own went out.
    asked_ms: AtomicU64,
    /// When the network first refused a try since the last reply: an answer of sorts, so it is
    /// the reason given over silence (the kernel rate-limits ICMP, so some refusals time out).
    refused_ms: AtomicU64,
    /// The origin of every `_ms` field (ms since it plus one; 0 means never), given by whoever
    /// makes the set.
    epoch: Instant,
}

impl UpstreamSet {
    /// A set whose counters are its own (tests). `epoch` is any instant no later than the first
    /// `now` the set will be given.
    #[cfg(any(test, feature = "rig"))]
    pub fn new(addrs: Vec<SocketAddr>, epoch: Instant) -> UpstreamSet {
        UpstreamSet::with_stats(addrs, |_| Arc::default(), epoch)
    }

    /// A set counting into `counters`, where the counters of a server stay across set changes.
    pub fn counted(
        addrs: Vec<SocketAddr>,
        group: UpstreamGroup,
        counters: &Counters,
        epoch: Instant,
    ) -> UpstreamSet {
        UpstreamSet::with_stats(addrs, |a| counters.upstream(group, a), epoch)
    }

    fn with_stats(
        addrs: Vec<SocketAddr>,
        stats: impl Fn(SocketAddr) -> Arc<UpstreamStats>,
        epoch: Instant,
    ) -> UpstreamSet {
        // A server listed twice would stay "healthy" through its second entry after the first
        // was marked suspect; each server is listed once, first place kept.
        let mut unique: Vec<SocketAddr> = Vec::with_capacity(addrs.len());
        for addr in addrs {
            if !unique.contains(&addr) {
                unique.push(addr);
            }
        }
        UpstreamSet {
            health: unique.iter().map(|_| Health::default()).collect(),
            stats: unique.iter().map(|a| stats(*a)).collect(),
            addrs: unique,
            cursor: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            asked_ms: AtomicU64::new(0),
            refused_ms: AtomicU64::new(0),
            epoch,
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
        let order = move || (start..n).chain(0..start);
        let choice = |i: usize, probe| Choice {
            addr: self.addrs[i],
            probe,
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
            return Some(choice(i, false));
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
            let now_ms = self.ms(now);
            let due = order()
                .filter(fresh)
                .find(|i| (self.suspect(*i) || !in_band(i)) && self.claim_probe(*i, now_ms));
            if let Some(i) = due {
                return Some(choice(i, true));
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
        Some(choice(i, false))
    }

    /// Tried after the others: suspect, or late on its last tries.
    fn suspect(&self, i: usize) -> bool {
        let h = &self.health[i];
        h.suspect.load(Relaxed) || h.late.load(Relaxed) >= LATE_AT
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
        let known = self.index(addr).map(|i| &self.health[i]).and_then(|h| {
            let srtt = u64::from(h.srtt_us.load(Relaxed));
            let us = srtt + 4 * u64::from(h.rttvar_us.load(Relaxed));
            (srtt != 0).then(|| Duration::from_micros(us))
        });
        known.unwrap_or(unknown).clamp(floor, ceiling)
    }

    pub fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
    }

    /// Same servers, whatever the order? (Sources may list backends in another order each time;
    /// that is not a change worth a swap and a log line.)
    pub fn same_servers(&self, other: &[SocketAddr]) -> bool {
        let set = |s: &[SocketAddr]| s.iter().copied().collect::<BTreeSet<_>>();
        set(&self.addrs) == set(other)
    }

    fn index(&self, addr: SocketAddr) -> Option<usize> {
        self.addrs.iter().position(|a| *a == addr)
    }

    /// The instant of an `_ms` field's value (not 0).
    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms - 1)
    }

    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64 + 1
    }

    /// A try is on its way to `addr`.
    pub fn note_sent(&self, addr: SocketAddr) {
        if let Some(i) = self.index(addr) {
            self.stats[i].queries.fetch_add(1, Relaxed);
            self.health[i].outstanding.fetch_add(1, Relaxed);
        }
    }

    /// A try at `addr` no longer counts as outstanding: it is late (likely lost, and a lost
    /// packet must not keep queries off a healthy server for a whole timeout), or it failed for
    /// want of our own resources. Its reply, if one comes, is still evidence.
    pub fn end_try(&self, addr: SocketAddr) {
        if let Some(i) = self.index(addr) {
            let _ = self.health[i]
                .outstanding
                .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
        }
    }

    /// A try at `addr` went past its hedge point unanswered: no longer outstanding (see
    /// [`UpstreamSet::end_try`]), and late (see `LATE_AT`).
    pub fn note_late(&self, addr: SocketAddr) {
        if let Some(i) = self.index(addr) {
            self.end_try(addr);
            self.health[i].late.fetch_add(1, Relaxed);
        }
    }

    /// A reply of any kind from `addr` at `now`: the server is alive. `ends_try` when its try
    /// still counted as outstanding.
    fn note_alive(&self, i: usize, ends_try: bool, now: Instant) {
        if ends_try {
            self.end_try(self.addrs[i]);
        }
        self.health[i].late.store(0, Relaxed);
        self.health[i].replied_ms.fetch_max(self.ms(now), Relaxed);
        self.refused_ms.store(0, Relaxed);
    }

    /// An answer came `took` after its try was sent. True when this cleared a suspect server.
    pub fn note_reply(
        &self,
        addr: SocketAddr,
        took: Duration,
        ends_try: bool,
        now: Instant,
    ) -> bool {
        let Some(i) = self.index(addr) else {
            return false;
        };
        self.note_alive(i, ends_try, now);
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

    /// An error reply (SERVFAIL, REFUSED, FORMERR...): the server's answer for one name. It
    /// proves the server alive and changes nothing else: the next name may resolve fine. (Its
    /// time is not an RTT sample: a resolver's SERVFAIL often comes after its own timeouts.)
    pub fn note_error_reply(&self, addr: SocketAddr, ends_try: bool, now: Instant) {
        if let Some(i) = self.index(addr) {
            self.note_alive(i, ends_try, now);
            // Still a try that did not resolve, for whoever watches the upstream's error share.
            self.stats[i].failures.fetch_add(1, Relaxed);
        }
    }

    /// A try at `addr` for the name hashed to `name`, sent at `sent`, is known unanswered at
    /// `now`. `None` for a refusal by the network, which is about the server, not a name.
    fn note_unanswered(
        &self,
        i: usize,
        ends_try: bool,
        name: Option<u64>,
        sent: Instant,
        now: Instant,
    ) {
        if ends_try {
            self.end_try(self.addrs[i]);
        }
        self.failures.fetch_add(1, Relaxed);
        self.stats[i].failures.fetch_add(1, Relaxed);
        // A try sent before discovery made this set is no evidence here: the set never saw
        // the server's replies from before, so it cannot tell whether one came after the try.
        if sent < self.epoch {
            return;
        }
        let h = &self.health[i];
        let sent_ms = self.ms(sent);
        let replied = h.replied_ms.load(Relaxed);
        if sent_ms > replied {
            // Relay threads may race here; the worst outcome is a run judged a moment late.
            if h.run_sent_ms.load(Relaxed) <= replied {
                h.run_sent_ms.store(sent_ms, Relaxed);
                h.run_name.store(name.unwrap_or(0), Relaxed);
                h.run_names.store(name.is_none(), Relaxed);
            } else if name.is_none_or(|n| n != h.run_name.load(Relaxed)) {
                h.run_names.store(true, Relaxed);
            }
        }
        h.unanswered_sent_ms.fetch_max(sent_ms, Relaxed);
        h.unanswered_at_ms.fetch_max(self.ms(now), Relaxed);
    }

    /// The network refused a try at `addr` sent at `sent` (ICMP unreachable, a TCP exchange
    /// broken), learnt at `now`: the server becomes suspect; true when that is a change.
    pub fn note_failure(
        &self,
        addr: SocketAddr,
        ends_try: bool,
        sent: Instant,
        now: Instant,
    ) -> bool {
        let Some(i) = self.index(addr) else {
            return false;
        };
        self.note_unanswered(i, ends_try, None, sent, now);
        let refused = &self.refused_ms;
        let _ = refused.compare_exchange(0, self.ms(now), Relaxed, Relaxed);

        !self.health[i].suspect.swap(true, Relaxed)
    }

    /// A try at `addr` for the name hashed to `name`, sent at `sent`, timed out at `now`. The
    /// server becomes suspect only when its loss score reaches `SUSPECT_AT` (see the module's
    /// note): true when that is a change.
    pub fn note_loss(
        &self,
        addr: SocketAddr,
        ends_try: bool,
        name: u64,
        sent: Instant,
        now: Instant,
    ) -> bool {
        let Some(i) = self.index(addr) else {
            return false;
        };
        self.note_unanswered(i, ends_try, Some(name), sent, now);
        let h = &self.health[i];
        let score = h.losses.fetch_add(LOSS, Relaxed).saturating_add(LOSS);
        score >= SUSPECT_AT && !h.suspect.swap(true, Relaxed)
    }

    /// Has `i` left tries for two names (or one name for a whole query budget) unanswered since
    /// its last reply, the latest lately?
    fn silent(&self, i: usize, now_ms: u64, budget_ms: u64) -> bool {
        let h = &self.health[i];
        let (at, replied) = (h.unanswered_at_ms.load(Relaxed), h.replied_ms.load(Relaxed));
        at != 0
            && now_ms.saturating_sub(at) < SILENCE_COUNTS.as_millis() as u64
            && h.unanswered_sent_ms.load(Relaxed) > replied
            && h.run_sent_ms.load(Relaxed) > replied
            && (h.run_names.load(Relaxed)
                || now_ms.saturating_sub(h.run_sent_ms.load(Relaxed)) >= budget_ms)
    }

    /// The group is down: every server is silent (see the module's note; `budget` is a whole
    /// query's). A query is better answered at once than after a whole query budget. False for
    /// an empty set, and never because nobody asked.
    pub fn down(&self, now: Instant, budget: Duration) -> bool {
        let now_ms = self.ms(now);
        let budget_ms = budget.as_millis() as u64;
        !self.addrs.is_empty() && (0..self.addrs.len()).all(|i| self.silent(i, now_ms, budget_ms))
    }

    /// Is some server due a probe at `now` (see [`PROBE_EVERY`])? Nothing is claimed: the try
    /// that follows claims it.
    pub fn probe_due(&self, now: Instant) -> bool {
        let now_ms = self.ms(now);
        self.health.iter().any(|h| {
            let last = h.probed_ms.load(Relaxed);
            last == 0 || now_ms.saturating_sub(last) >= PROBE_EVERY.as_millis() as u64
        })
    }

    /// Is a question of the group's own due at `now`? Every [`ASK_EVERY`], sooner with many
    /// servers, so each is asked within `EACH_ASKED_EVERY` (a query starts where the last one
    /// did not). Claimed: whichever relay thread asks first.
    pub fn question_due(&self, now: Instant) -> bool {
        let n = u32::try_from(self.addrs.len()).unwrap_or(u32::MAX);
        let every = ASK_EVERY.min(EACH_ASKED_EVERY / n.max(1)).as_millis() as u64;
        let (now_ms, last) = (self.ms(now), self.asked_ms.load(Relaxed));
        let due = last == 0 || now_ms.saturating_sub(last) >= every;
        let claim = || (self.asked_ms).compare_exchange(last, now_ms, Relaxed, Relaxed);
        n > 0 && due && claim().is_ok()
    }

    /// When one of the servers last replied, with anything.
    pub fn last_reply(&self) -> Option<Instant> {
        let ms = self.health.iter().map(|h| h.replied_ms.load(Relaxed)).max();
        ms.filter(|&ms| ms != 0).map(|ms| self.at(ms))
    }

    /// The one judgment of readiness: ready while a server replied within [`READY_FOR`] (how long
    /// ago); else why not, and since when: the network's first refusal since the last reply, or
    /// that reply (or the set's making) when nothing was refused.
    pub fn readiness(&self, now: Instant) -> Result<Duration, (Instant, &'static str)> {
        let refused = self.refused_ms.load(Relaxed);
        let last = self.last_reply();
        match last.map(|at| now.saturating_duration_since(at)) {
            _ if self.addrs.is_empty() => Err((self.epoch, "no server found")),
            Some(ago) if ago <= READY_FOR => Ok(ago),
            _ if refused != 0 => Err((self.at(refused), "sends refused")),
            _ => Err((last.unwrap_or(self.epoch), "every server silent")),
        }
    }

    #[cfg(test)]
    pub fn is_suspect(&self, addr: SocketAddr) -> bool {
        self.index(addr).is_some_and(|i| self.suspect(i))
    }
}

/// The sets in force for both groups; replaced whole when discovery finds a new set (a clone
/// shares every part).
#[derive(Clone, Debug)]
pub struct UpstreamSets {
    pub vnet_dns: Arc<UpstreamSet>,
    pub kube_dns: Arc<UpstreamSet>,
    /// The node's hosts file: node state like the upstreams, so it reaches every engine the
    /// same way, swapped in whole between queries.
    pub hosts: Arc<Hosts>,
}

impl UpstreamSets {
    pub fn get(&self, group: UpstreamGroup) -> &Arc<UpstreamSet> {
        match group {
            UpstreamGroup::VnetDns => &self.vnet_dns,
            UpstreamGroup::KubeDns => &self.kube_dns,
        }
    }

    /// Sets with no counters behind them (tests).
    #[cfg(any(test, feature = "rig"))]
    pub fn uncounted(
        vnet_dns: Vec<SocketAddr>,
        kube_dns: Vec<SocketAddr>,
        epoch: Instant,
    ) -> UpstreamSets {
        UpstreamSets {
            vnet_dns: Arc::new(UpstreamSet::new(vnet_dns, epoch)),
            kube_dns: Arc::new(UpstreamSet::new(kube_dns, epoch)),
            hosts: Arc::default(),
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
                u.note_reply(to, Duration::from_millis(1), true, u.epoch);
                to == addr
            })
            .count()
    }

    #[test]
    fn a_single_loss_costs_no_share_and_a_second_in_a_row_demotes_at_once() {
        let u = UpstreamSet::new(vec![addr(1), addr(2)], Instant::now());
        share_of(&u, addr(1), 20);
        u.note_sent(addr(1));
        assert!(
            !u.note_loss(addr(1), true, 0, u.epoch, u.epoch),
            "one loss is forgiven"
        );
        assert!(!u.is_suspect(addr(1)));
        let share = share_of(&u, addr(1), 200);
        assert!(
            (95..=105).contains(&share),
            "share after one loss: {share} of 200"
        );
        // Two in a row: suspect at once.
        u.note_sent(addr(2));
        assert!(!u.note_loss(addr(2), true, 0, u.epoch, u.epoch));
        u.note_sent(addr(2));
        assert!(
            u.note_loss(addr(2), true, 0, u.epoch, u.epoch),
            "a second loss in a row demotes"
        );
        assert!(u.is_suspect(addr(2)));
        // A loss one answer in eight or rarer never demotes; one in three does.
        let u = UpstreamSet::new(vec![addr(1)], Instant::now());
        for _ in 0..10 {
            u.note_sent(addr(1));
            assert!(!u.note_loss(addr(1), true, 0, u.epoch, u.epoch));
            share_of(&u, addr(1), 8);
        }
        let mut demoted = false;
        for _ in 0..5 {
            u.note_sent(addr(1));
            demoted |= u.note_loss(addr(1), true, 0, u.epoch, u.epoch);
            share_of(&u, addr(1), 3);
        }
        assert!(demoted, "repeated losses demote");
    }

    /// Answers `n` tries at `a`, each `rtt` after it was sent.
    fn answer(u: &UpstreamSet, a: SocketAddr, rtt_us: u64, n: usize) {
        for _ in 0..n {
            u.note_sent(a);
            u.note_reply(a, Duration::from_micros(rtt_us), true, u.epoch);
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
        assert!(
            u.note_failure(addr(1), true, u.epoch, u.epoch),
            "became suspect"
        );
        u.note_sent(addr(1));
        assert!(
            !u.note_failure(addr(1), true, u.epoch, u.epoch),
            "already suspect"
        );
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
            u.note_reply(addr(1), Duration::from_micros(300), true, u.epoch),
            "recovered"
        );
        assert!(!u.note_reply(addr(1), Duration::ZERO, true, u.epoch));
        assert_eq!(u.choose(0, &[], &[], t).map(|c| c.addr), Some(addr(1)));
    }

    #[test]
    fn local_failures_do_not_make_a_server_suspect() {
        let u = three();
        u.note_sent(addr(1));
        u.end_try(addr(1));
        assert!(!u.is_suspect(addr(1)));
        assert_eq!(u.failures(), 0);
    }

    #[test]
    fn all_suspect_still_tries_every_server() {
        let u = three();
        for i in 1..=3 {
            u.note_failure(addr(i), true, u.epoch, u.epoch);
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
        u.note_failure(addr(1), true, u.epoch, u.epoch);
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

    /// The instants of the questions a set gives over `secs` seconds, polled every 500 ms (the
    /// relay's idle wake), as seconds since its epoch.
    fn asked(u: &UpstreamSet, from: u64, secs: u64) -> Vec<f64> {
        (from * 2..(from + secs) * 2)
            .map(|half| u.epoch + Duration::from_millis(half * 500))
            .filter(|&t| u.question_due(t))
            .map(|t| (t - u.epoch).as_secs_f64())
            .collect()
    }

    #[test]
    fn a_group_is_asked_every_9_s_while_standing_by_and_claimed_once() {
        let u = three();
        assert_eq!(asked(&u, 0, 40), [0.0, 9.0, 18.0, 27.0, 36.0]);
        // A second relay thread finds it claimed.
        let t = u.epoch + Duration::from_secs(45);
        assert!(u.question_due(t));
        assert!(!u.question_due(t), "one question per turn");
        // Answers to anything do not hold the standby's questions back.
        answer(&u, addr(1), 300, 1);
        assert_eq!(asked(&u, 46, 20), [54.0, 63.0]);
        assert!(
            !UpstreamSet::new(vec![], u.epoch).question_due(u.epoch),
            "nobody to ask"
        );
    }

    #[test]
    fn with_many_servers_each_is_asked_within_a_minute() {
        let many: Vec<SocketAddr> = (1..=12).map(addr).collect();
        let u = UpstreamSet::new(many.clone(), Instant::now());
        let times = asked(&u, 0, 54);
        assert_eq!(
            times.len(),
            12,
            "one question for each within 54 s: {times:?}"
        );
        assert!(times.windows(2).all(|w| w[1] - w[0] == 4.5), "{times:?}");
        // Each question starts where the last did not: every server is asked once.
        let firsts: BTreeSet<_> = (0..12).map(|_| pick(&u, u.next_start(), &[])).collect();
        assert_eq!(firsts.len(), 12);
    }

    #[test]
    fn readiness_ready_silent_refused_and_no_server() {
        let u = three();
        let at = |s: u64| u.epoch + Duration::from_secs(s);
        assert_eq!(
            u.readiness(at(5)),
            Err((u.epoch, "every server silent")),
            "never heard"
        );
        u.note_sent(addr(2));
        u.note_reply(addr(2), Duration::from_millis(1), true, at(10));
        assert_eq!(u.readiness(at(40)), Ok(Duration::from_secs(30)));
        assert_eq!(u.readiness(at(41)), Err((at(10), "every server silent")));
        // Refused at 50 and 59, lost at 61: refused since the first of them.
        u.note_failure(addr(1), false, at(50), at(50));
        u.note_failure(addr(2), false, at(59), at(59));
        u.note_loss(addr(3), false, 1, at(60), at(61));
        assert_eq!(u.readiness(at(62)), Err((at(50), "sends refused")));
        // Any reply, an error one too, is an answer; and ends the run of refusals.
        u.note_error_reply(addr(3), false, at(70));
        assert_eq!(u.readiness(at(75)), Ok(Duration::from_secs(5)));
        u.note_failure(addr(1), false, at(80), at(80));
        assert_eq!(u.readiness(at(101)), Err((at(80), "sends refused")));
        let none = UpstreamSet::new(vec![], u.epoch);
        assert_eq!(none.readiness(at(1)), Err((u.epoch, "no server found")));
    }

    #[test]
    fn unknown_addresses_are_ignored() {
        let u = three();
        assert!(!u.note_failure(addr(200), true, u.epoch, u.epoch));
        assert!(!u.note_reply(addr(200), Duration::ZERO, true, u.epoch));
        assert_eq!(pick(&u, 0, &[]), Some(addr(1)));
    }
}
