//! The queries in flight and what became of them.
//!
//! Queries go out on *channels* (a UDP socket or a TCP connection); on each, IDs are handed out in
//! order, so a channel's slots form a ring whose oldest end holds the oldest query: timeouts are
//! found by walking from that end. A reply is taken only if its channel and ID match a query in
//! flight and its question is that query's name (anything else is counted, never trusted).
//!
//! Counters about *queries* (answered, lost, latency) are kept for the queries *sent* in the
//! measurement window; throughput counts good replies *received* in the window. A timeline with
//! one bucket per interval (by send time) shows when errors and losses happened.

use crate::dns::{self, HEADER};
use crate::hist::Hist;
use crate::names::Names;

/// One query in flight: when it was sent (0 = free slot) and which name it asked.
#[derive(Clone, Copy, Default)]
struct Slot {
    sent_ns: u64,
    key: u64,
}

struct Channel {
    slots: Vec<Slot>,
    next: u16,
    oldest: u16,
    inflight: u32,
}

impl Channel {
    fn new(first_id: u16) -> Channel {
        Channel {
            slots: vec![Slot::default(); 1 << 16],
            next: first_id,
            oldest: first_id,
            inflight: 0,
        }
    }

    /// Moves the oldest end past answered slots.
    fn advance_oldest(&mut self) {
        while self.oldest != self.next && self.slots[self.oldest as usize].sent_ns == 0 {
            self.oldest = self.oldest.wrapping_add(1);
        }
    }
}

/// The A record a good reply carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The harness's responder: an address derived from the name ([`dns::derived_a`]).
    Derived,
    /// One address for every name (knot's wildcard zone).
    Fixed([u8; 4]),
}

impl Expect {
    pub fn parse(s: &str) -> Result<Expect, String> {
        if s == "derived" {
            return Ok(Expect::Derived);
        }
        s.parse::<std::net::Ipv4Addr>()
            .map(|a| Expect::Fixed(a.octets()))
            .map_err(|_| format!("bad --expect {s:?}: `derived` or an IPv4 address"))
    }

    pub fn address(self, qname: &[u8]) -> [u8; 4] {
        match self {
            Expect::Derived => dns::derived_a(qname),
            Expect::Fixed(a) => a,
        }
    }
}

/// What became of the queries sent in the window.
#[derive(Clone, Copy, Default, Debug)]
pub struct Counts {
    pub sent: u64,
    /// Replies of any kind.
    pub answered: u64,
    /// NOERROR with the expected record: the only replies that count as answers.
    pub good: u64,
    pub noerror: u64,
    /// NOERROR without the expected record (no data, or another address).
    pub wrong_answer: u64,
    pub nxdomain: u64,
    pub servfail: u64,
    /// REFUSED: how a forwarder sheds load.
    pub refused: u64,
    pub other_rcode: u64,
    pub truncated: u64,
    /// No matching reply within the timeout.
    pub lost: u64,
    /// Answered, but slower than the `slow` threshold.
    pub slow: u64,
}

impl Counts {
    /// Replies that are the upstream's answer.
    pub fn ok(&self) -> u64 {
        self.good
    }
    /// Replies that are not (NXDOMAIN, SERVFAIL, REFUSED, other rcodes, wrong NOERROR).
    pub fn errors(&self) -> u64 {
        self.answered - self.good
    }
}

/// One interval of the timeline, by send time.
#[derive(Clone, Copy, Default, Debug)]
pub struct Bucket {
    pub sent: u64,
    pub ok: u64,
    pub errors: u64,
    pub refused: u64,
    pub lost: u64,
    pub slow: u64,
    pub max_latency_ns: u64,
}

impl Bucket {
    /// Some query sent in this interval was not served well.
    pub fn failed(&self) -> bool {
        self.errors + self.lost + self.slow > 0
    }
}

pub struct Tracker {
    chans: Vec<Channel>,
    names: Names,
    expect: Expect,
    /// Queries sent from this time on (the start of a fault) also go into `fault_hist`.
    pub fault_from_ns: u64,
    pub fault_hist: Hist,
    inflight: u64,
    timeout_ns: u64,
    slow_ns: u64,
    /// Start of the run (timeline origin) and the measurement window.
    pub start_ns: u64,
    pub window: (u64, u64),
    pub counts: Counts,
    pub hist: Hist,
    /// Good replies received inside the window (throughput).
    pub ok_received_in_window: u64,
    /// Replies of any kind received inside the window.
    pub received_in_window: u64,
    /// Replies for no query in flight (after its timeout, or duplicates).
    pub late: u64,
    /// Replies whose ID matched but whose question did not.
    pub mismatched: u64,
    /// Datagrams that were not replies at all.
    pub malformed: u64,
    pub bucket_ns: u64,
    pub timeline: Vec<Bucket>,
    scratch: [u8; 80],
}

impl Tracker {
    pub fn new(
        channels: usize,
        names: Names,
        expect: Expect,
        timeout_ns: u64,
        slow_ns: u64,
        seed: u64,
    ) -> Tracker {
        let chans = (0..channels)
            .map(|i| Channel::new((seed as u16).wrapping_add(i as u16 * 7919)))
            .collect();
        Tracker {
            chans,
            names,
            expect,
            fault_from_ns: u64::MAX,
            fault_hist: Hist::default(),
            inflight: 0,
            timeout_ns,
            slow_ns,
            start_ns: 0,
            window: (0, u64::MAX),
            counts: Counts::default(),
            hist: Hist::default(),
            ok_received_in_window: 0,
            received_in_window: 0,
            late: 0,
            mismatched: 0,
            malformed: 0,
            bucket_ns: 100_000_000,
            timeline: Vec::new(),
            scratch: [0; 80],
        }
    }

    pub fn inflight(&self) -> u64 {
        self.inflight
    }

    pub fn channel_inflight(&self, ch: usize) -> u32 {
        self.chans[ch].inflight
    }

    fn in_window(&self, t: u64) -> bool {
        t >= self.window.0 && t < self.window.1
    }

    fn bucket(&mut self, sent_ns: u64) -> &mut Bucket {
        let i = (sent_ns.saturating_sub(self.start_ns) / self.bucket_ns) as usize;
        if i >= self.timeline.len() {
            self.timeline.resize(i + 1, Bucket::default());
        }
        &mut self.timeline[i]
    }

    /// Writes the next query for channel `ch` into `out`, sent at `now_ns`; returns its length,
    /// or None when the channel has 65,535 queries in flight.
    pub fn prepare(&mut self, ch: usize, now_ns: u64, out: &mut [u8]) -> Option<usize> {
        let c = &mut self.chans[ch];
        if c.next.wrapping_add(1) == c.oldest {
            c.advance_oldest();
            if c.next.wrapping_add(1) == c.oldest {
                return None;
            }
        }
        let id = c.next;
        if c.slots[id as usize].sent_ns != 0 {
            return None;
        }
        let key = self.names.next_key();
        let name_len = self.names.write_wire(key, &mut self.scratch);
        let len = dns::write_query(out, id, &self.scratch[..name_len], dns::TYPE_A)?;
        let c = &mut self.chans[ch];
        c.slots[id as usize] = Slot {
            sent_ns: now_ns.max(1),
            key,
        };
        c.next = id.wrapping_add(1);
        c.inflight += 1;
        self.inflight += 1;
        if self.in_window(now_ns) {
            self.counts.sent += 1;
        }
        self.bucket(now_ns).sent += 1;
        Some(len)
    }

    /// Takes back the last `n` queries prepared on `ch` (they could not be sent).
    pub fn rollback(&mut self, ch: usize, n: usize) {
        for _ in 0..n {
            let c = &mut self.chans[ch];
            c.next = c.next.wrapping_sub(1);
            let slot = std::mem::take(&mut c.slots[c.next as usize]);
            c.inflight -= 1;
            self.inflight -= 1;
            if self.in_window(slot.sent_ns) {
                self.counts.sent -= 1;
            }
            self.bucket(slot.sent_ns).sent -= 1;
        }
    }

    /// Takes in a datagram received on `ch` at `rx_ns`.
    pub fn on_reply(&mut self, ch: usize, msg: &[u8], rx_ns: u64) {
        let Some(head) = dns::reply_head(msg) else {
            self.malformed += 1;
            return;
        };
        let slot = self.chans[ch].slots[head.id as usize];
        if slot.sent_ns == 0 {
            self.late += 1;
            return;
        }
        let name_len = self.names.write_wire(slot.key, &mut self.scratch);
        if msg.len() < HEADER || !dns::question_is(msg, &self.scratch[..name_len]) {
            self.mismatched += 1;
            return;
        }
        let c = &mut self.chans[ch];
        c.slots[head.id as usize] = Slot::default();
        c.inflight -= 1;
        self.inflight -= 1;
        let latency = rx_ns.saturating_sub(slot.sent_ns);
        let q_end = HEADER + name_len + 4;
        let noerror = head.rcode == dns::RCODE_NOERROR;
        let good = noerror
            && msg.len() >= q_end
            && dns::has_a(msg, q_end, self.expect.address(&self.scratch[..name_len]));
        if self.in_window(rx_ns) {
            self.received_in_window += 1;
            if good {
                self.ok_received_in_window += 1;
            }
        }
        let slow = latency > self.slow_ns;
        if self.in_window(slot.sent_ns) {
            let k = &mut self.counts;
            k.answered += 1;
            if good {
                k.good += 1;
            } else if noerror {
                k.wrong_answer += 1;
            }
            match head.rcode {
                dns::RCODE_NOERROR => k.noerror += 1,
                dns::RCODE_NXDOMAIN => k.nxdomain += 1,
                dns::RCODE_SERVFAIL => k.servfail += 1,
                dns::RCODE_REFUSED => k.refused += 1,
                _ => k.other_rcode += 1,
            }
            if head.truncated {
                k.truncated += 1;
            }
            if slow {
                k.slow += 1;
            }
            self.hist.record(latency);
        }
        if slot.sent_ns >= self.fault_from_ns {
            self.fault_hist.record(latency);
        }
        let b = self.bucket(slot.sent_ns);
        if good {
            b.ok += 1;
        } else {
            b.errors += 1;
            if head.rcode == dns::RCODE_REFUSED {
                b.refused += 1;
            }
        }
        if slow {
            b.slow += 1;
        }
        b.max_latency_ns = b.max_latency_ns.max(latency);
    }

    /// Adds what another tracker (another thread of the same run, same clock) saw.
    pub fn merge(&mut self, o: &Tracker) {
        let (a, b) = (&mut self.counts, &o.counts);
        a.sent += b.sent;
        a.answered += b.answered;
        a.good += b.good;
        a.noerror += b.noerror;
        a.wrong_answer += b.wrong_answer;
        a.nxdomain += b.nxdomain;
        a.servfail += b.servfail;
        a.refused += b.refused;
        a.other_rcode += b.other_rcode;
        a.truncated += b.truncated;
        a.lost += b.lost;
        a.slow += b.slow;
        self.hist.merge(&o.hist);
        self.fault_hist.merge(&o.fault_hist);
        self.ok_received_in_window += o.ok_received_in_window;
        self.received_in_window += o.received_in_window;
        self.late += o.late;
        self.mismatched += o.mismatched;
        self.malformed += o.malformed;
        if o.timeline.len() > self.timeline.len() {
            self.timeline.resize(o.timeline.len(), Bucket::default());
        }
        for (x, y) in self.timeline.iter_mut().zip(&o.timeline) {
            x.sent += y.sent;
            x.ok += y.ok;
            x.errors += y.errors;
            x.refused += y.refused;
            x.lost += y.lost;
            x.slow += y.slow;
            x.max_latency_ns = x.max_latency_ns.max(y.max_latency_ns);
        }
    }

    /// Counts as lost every query older than the timeout at `now_ns` (u64::MAX: all of them).
    pub fn sweep(&mut self, now_ns: u64) {
        let mut lost_at = Vec::new();
        for c in &mut self.chans {
            c.advance_oldest();
            while c.oldest != c.next {
                let s = c.slots[c.oldest as usize];
                if s.sent_ns != 0 {
                    if now_ns.saturating_sub(s.sent_ns) <= self.timeout_ns {
                        break;
                    }
                    c.slots[c.oldest as usize] = Slot::default();
                    c.inflight -= 1;
                    lost_at.push(s.sent_ns);
                }
                c.oldest = c.oldest.wrapping_add(1);
            }
        }
        self.inflight -= lost_at.len() as u64;
        for t in lost_at {
            if self.in_window(t) {
                self.counts.lost += 1;
            }
            self.bucket(t).lost += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::NameSet;

    const NOERROR: dns::Answer = dns::Answer {
        ttl: 1,
        rcode: dns::RCODE_NOERROR,
    };

    fn tracker() -> Tracker {
        let mut t = Tracker::new(
            1,
            Names::new(NameSet::Miss, 1),
            Expect::Derived,
            1_000,
            500,
            0,
        );
        t.start_ns = 1;
        t
    }

    #[test]
    fn a_reply_is_matched_by_id_and_question() {
        let mut t = tracker();
        let mut q = [0u8; 512];
        let len = t.prepare(0, 10, &mut q).unwrap();
        let mut other = [0u8; 512];
        let olen = t.prepare(0, 10, &mut other).unwrap();
        // The second query's reply sent with the first query's ID: a mismatch, ignored.
        let mut forged = other;
        forged[..2].copy_from_slice(&q[..2]);
        let flen = dns::answer_in_place(&mut forged, olen, NOERROR).unwrap();
        t.on_reply(0, &forged[..flen], 20);
        assert_eq!((t.mismatched, t.inflight()), (1, 2));
        let alen = dns::answer_in_place(&mut q, len, NOERROR).unwrap();
        t.on_reply(0, &q[..alen], 110);
        assert_eq!(t.counts.noerror, 1);
        assert_eq!(t.hist.max(), 100);
        t.on_reply(0, &q[..alen], 120);
        assert_eq!(t.late, 1, "a duplicate is late");
        t.sweep(2_000);
        assert_eq!((t.counts.lost, t.inflight()), (1, 0));
        assert_eq!(t.counts.sent, 2);
    }

    #[test]
    fn only_the_upstreams_answer_for_that_name_is_good() {
        let mut t = tracker();
        let mut q = [[0u8; 512]; 4];
        let lens: Vec<usize> = q.iter_mut().map(|b| t.prepare(0, 10, b).unwrap()).collect();
        // 0: the right answer. 1: NXDOMAIN made up by the forwarder (the unbound `test.` case).
        // 2: NOERROR with another address. 3: NOERROR without data.
        let mut replies = Vec::new();
        for (i, b) in q.iter_mut().enumerate() {
            let alen = dns::answer_in_place(b, lens[i], NOERROR).unwrap();
            replies.push(b[..alen].to_vec());
        }
        replies[1].truncate(lens[1]);
        replies[1][3] = 0x83;
        replies[1][7] = 0;
        let n = replies[2].len();
        replies[2][n - 1] ^= 1;
        replies[3].truncate(lens[3]);
        replies[3][7] = 0;
        for r in &replies {
            t.on_reply(0, r, 20);
        }
        let c = t.counts;
        assert_eq!(
            (c.answered, c.good, c.nxdomain, c.wrong_answer),
            (4, 1, 1, 2)
        );
        assert_eq!((c.ok(), c.errors()), (1, 3));
        assert_eq!(t.ok_received_in_window, 1);
        assert_eq!((t.timeline[0].ok, t.timeline[0].errors), (1, 3));
    }

    #[test]
    fn a_fixed_expectation_is_knots_wildcard() {
        let mut t = tracker();
        t.expect = Expect::parse("10.9.8.7").unwrap();
        let mut q = [0u8; 512];
        let len = t.prepare(0, 10, &mut q).unwrap();
        let alen = dns::answer_in_place(&mut q, len, NOERROR).unwrap();
        q[alen - 4..alen].copy_from_slice(&[10, 9, 8, 7]);
        t.on_reply(0, &q[..alen], 20);
        assert_eq!(t.counts.good, 1);
        assert!(Expect::parse("nonsense").is_err());
    }

    #[test]
    fn rollback_undoes_prepare() {
        let mut t = tracker();
        let mut q = [0u8; 512];
        t.prepare(0, 10, &mut q).unwrap();
        t.prepare(0, 10, &mut q).unwrap();
        t.rollback(0, 1);
        assert_eq!((t.counts.sent, t.inflight()), (1, 1));
        t.sweep(u64::MAX);
        assert_eq!(t.counts.lost, 1);
    }
}
