//! The answer cache, with serve-stale (RFC 8767): pods on a LocalDNS node are used to cached
//! answers, and a forwarder of last resort runs exactly when upstreams blip.
//!
//! Entries are whole upstream replies keyed by the lower-cased question, the upstream group and
//! the query flags that change an answer. Every decision (cacheable? for how long? fresh, stale or
//! dead?) is a pure function of the bytes and the `now` passed in, so the tests need no clock.

use std::hash::{BuildHasher, Hash, Hasher};
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use lru::LruCache;

use crate::roles::UpstreamGroup;
use crate::wire::{self, rcode};

/// TTL written into stale answers (RFC 8767 §4 suggests 30 s).
pub const STALE_TTL: u32 = 30;
/// Bookkeeping per entry beyond its bytes (LRU node, hash slot, allocator headers), counted
/// against the byte cap so many tiny entries cannot exceed it. loadtest/cache-memory.sh measured
/// about 190 bytes (20,000 entries: 5.0 MiB of resident memory for 1.5 MiB of names and replies);
/// 256 keeps the cap on the safe side.
const ENTRY_OVERHEAD: usize = 256;
const TYPE_SOA: u16 = 6;
const TYPE_OPT: u16 = 41;

/// Limits, from the flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Entries at most; 0 turns the cache off.
    pub entries: usize,
    /// Bytes at most (replies, keys and per-entry overhead).
    pub bytes: usize,
    /// Shortest and longest time an answer is kept fresh, whatever its TTL says.
    pub min_ttl: Duration,
    pub max_ttl: Duration,
    /// How long past expiry an entry may still be served when upstreams fail.
    pub max_stale: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            // LocalDNS keeps 9984 success and 9984 denial entries.
            entries: 20_000,
            // Far inside the 128 MiB slice: the cache is the only thing here that grows with use.
            bytes: 32 << 20,
            min_ttl: Duration::from_secs(5),
            max_ttl: Duration::from_secs(3600),
            max_stale: Duration::from_secs(3600),
        }
    }
}

/// What identifies an answer: same key, same answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    /// A seeded 64-bit hash of the rest, made once: a query that misses looks its key up in the
    /// cache and in the table of waiting queries, and both again when the answer comes.
    hash: u64,
    /// The question name in lower-case wire form.
    name: Box<[u8]>,
    /// The rest, as an entry keeps it: the upstream group, QTYPE, QCLASS, and the query bits
    /// that change what an upstream puts in the answer: EDNS decides whether an OPT record is
    /// in it, DO whether DNSSEC records are, CD whether validation failures are hidden, RD
    /// whether the upstream recursed, and AD (without DO) whether it may say the answer was
    /// validated. (Bits: 1 = EDNS, 2 = DO, 4 = CD, 8 = RD, 16 = AD without DO.)
    head: (UpstreamGroup, u16, u16, u8),
}

impl Key {
    /// The key of a query's answer; `None` for a query whose answer must not come from or go to
    /// the cache, nor be shared with other askers: one for an EDNS version other than 0 (the
    /// upstream answers it BADVERS or its own way), and one with options that may change the
    /// answer (ECS scopes it to the asker's subnet; unknown options ask the upstream something
    /// of its own).
    pub fn new(
        hasher: &KeyHasher,
        group: UpstreamGroup,
        query: &[u8],
        q: &wire::Query,
    ) -> Option<Key> {
        if q.edns_version != 0 || q.answer_options {
            return None;
        }
        let name: Box<[u8]> = q.name(query).iter().map(u8::to_ascii_lowercase).collect();
        let (rd, ad) = (query[2] & 0x01 != 0, query[3] & 0x20 != 0);
        let flags = u8::from(q.edns)
            | (u8::from(q.dnssec_ok) << 1)
            | (u8::from(query[3] & 0x10 != 0) << 2)
            | (u8::from(rd) << 3)
            | (u8::from(ad && !q.dnssec_ok) << 4);
        let hash = hasher.0.hash_one((group, &name, q.qtype, q.qclass, flags));
        let head = (group, q.qtype, q.qclass, flags);
        Some(Key { hash, name, head })
    }

    /// Is this the key of a question for `name` (wire form, any case)?
    pub fn is_for(&self, name: &[u8]) -> bool {
        self.name.eq_ignore_ascii_case(name)
    }
}

/// Maps keyed by `Key` hash only its hash, with their own seed.
impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.hash);
    }
}

/// The seed of every key's hash: random per process (so a client cannot aim names at one hash),
/// the same for every key made for one cache (so keys made by any engine find its entries). The
/// cache holds it; engines copy it from there.
#[derive(Clone, Debug)]
pub struct KeyHasher(foldhash::fast::FixedState);

impl KeyHasher {
    pub fn new(seed: u64) -> KeyHasher {
        KeyHasher(foldhash::fast::FixedState::with_seed(seed))
    }
}

/// One answer, in one allocation: a miss that evicts the oldest entry touches (and frees) as
/// little memory as possible, and at 20,000 entries that memory is rarely in the CPU's caches.
struct Entry {
    /// The key's name, then the reply as the upstream sent it (ID and question case are the
    /// client's business), then where each record's TTL sits in the reply (two bytes each), so
    /// served copies can count down.
    bytes: Vec<u8>,
    name_len: u16,
    reply_len: u16,
    head: (UpstreamGroup, u16, u16, u8),
    stored: Instant,
    fresh_for: Duration,
}

impl Entry {
    fn size(&self) -> usize {
        self.bytes.len() + ENTRY_OVERHEAD
    }

    /// Fresh until its TTL runs out, then stale for `max_stale`, then of no use.
    fn state(&self, now: Instant, max_stale: Duration) -> Option<Hit> {
        let age = now.saturating_duration_since(self.stored);
        if age < self.fresh_for {
            Some(Hit::Fresh)
        } else if age <= self.fresh_for + max_stale {
            Some(Hit::Stale)
        } else {
            None
        }
    }

    fn is_for(&self, key: &Key) -> bool {
        self.head == key.head && self.bytes[..usize::from(self.name_len)] == *key.name
    }

    fn reply(&self) -> &[u8] {
        let start = usize::from(self.name_len);
        &self.bytes[start..start + usize::from(self.reply_len)]
    }

    fn ttl_offsets(&self) -> impl Iterator<Item = usize> + '_ {
        let start = usize::from(self.name_len) + usize::from(self.reply_len);
        self.bytes[start..]
            .chunks_exact(2)
            .map(|at| usize::from(u16::from_be_bytes([at[0], at[1]])))
    }
}

/// What the cache holds for a key that it may still serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hit {
    Fresh,
    /// Expired, but no longer than `max_stale` ago.
    Stale,
}

pub struct Cache {
    /// Entries by a 64-bit hash of their key. Each entry keeps its whole key and a lookup checks
    /// it, so two keys with one hash cost one of them its place, never a wrong answer.
    lru: LruCache<u64, Entry>,
    limits: Limits,
    bytes: usize,
    hasher: KeyHasher,
}

impl Cache {
    /// `None` when the limits turn caching off.
    pub fn new(limits: Limits, hasher: KeyHasher) -> Option<Cache> {
        NonZeroUsize::new(limits.entries)?;
        Some(Cache {
            // Unbounded here, capped in `put`: a bounded LruCache allocates its whole table up
            // front, which for a large --cache-size is memory the byte cap never sees.
            lru: LruCache::unbounded(),
            limits,
            bytes: 0,
            hasher,
        })
    }

    /// How keys for this cache are hashed.
    pub fn hasher(&self) -> &KeyHasher {
        &self.hasher
    }

    pub fn len(&self) -> usize {
        self.lru.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lru.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Copies the answer for `key` into `out`: a fresh one with its TTLs counted down, a stale
    /// one with every TTL set to `STALE_TTL`. A query that misses must know both (is a stale
    /// answer at hand if upstreams fail?), so this is one lookup, not two. Answers to be returned
    /// to a client still need its ID and question spelling.
    pub fn get(&mut self, key: &Key, now: Instant, out: &mut Vec<u8>) -> Option<Hit> {
        let max_stale = self.limits.max_stale;
        let entry = self.find(key)?;
        if entry.state(now, max_stale)? == Hit::Stale {
            copy_with_ttls(entry, |_| STALE_TTL, out);
            return Some(Hit::Stale);
        }
        // A record alive upstream is never served with TTL 0 (that says "do not cache"), also
        // when --cache-min-ttl keeps it past its own TTL; one that came with TTL 0 keeps it.
        let age = now.saturating_duration_since(entry.stored).as_secs();
        let age = age.min(u64::from(u32::MAX)) as u32;
        copy_with_ttls(
            entry,
            |ttl| ttl.saturating_sub(age).max(u32::from(ttl > 0)),
            out,
        );
        Some(Hit::Fresh)
    }

    /// [`Cache::get`] for a fresh answer only.
    #[cfg(test)]
    pub fn get_fresh(&mut self, key: &Key, now: Instant, out: &mut Vec<u8>) -> bool {
        self.get(key, now, out) == Some(Hit::Fresh)
    }

    /// Copies an answer for `key` that expired no longer than `max_stale` ago (or is still fresh)
    /// into `out`, every TTL set to `STALE_TTL`: for when every upstream has failed.
    pub fn get_stale(&mut self, key: &Key, now: Instant, out: &mut Vec<u8>) -> bool {
        let max_stale = self.limits.max_stale;
        let Some(entry) = self.find(key).filter(|e| e.state(now, max_stale).is_some()) else {
            return false;
        };
        copy_with_ttls(entry, |_| STALE_TTL, out);
        true
    }

    /// The entry for `key` (marked as just used), if the cache has one.
    fn find(&mut self, key: &Key) -> Option<&Entry> {
        self.lru.get(&key.hash).filter(|e| e.is_for(key))
    }

    /// Stores `reply` if it may be cached; returns whether it was. A COOKIE or ECS option in it
    /// is left out of what is stored: those belong to the client that asked.
    pub fn put(&mut self, key: Key, reply: &[u8], now: Instant) -> bool {
        let shared = without_private_options(reply);
        let reply = shared.as_deref().unwrap_or(reply);
        // Entries keep lengths and TTL offsets in 16 bits.
        if reply.len() < wire::HEADER_LEN || reply.len() > usize::from(u16::MAX) {
            return false;
        }
        let records: usize = wire::counts(reply)[1..]
            .iter()
            .map(|&n| usize::from(n))
            .sum();
        let mut bytes = Vec::with_capacity(key.name.len() + reply.len() + 2 * records);
        bytes.extend_from_slice(&key.name);
        bytes.extend_from_slice(reply);
        let Some(fresh_for) = cacheable(reply, &self.limits, &mut bytes) else {
            return false;
        };
        let entry = Entry {
            bytes,
            // A wire name is at most 255 bytes, and the reply's length was checked above.
            name_len: key.name.len() as u16,
            reply_len: reply.len() as u16,
            head: key.head,
            stored: now,
            fresh_for,
        };
        let size = entry.size();
        if size > self.limits.bytes {
            return false;
        }
        if let Some((_, old)) = self.lru.push(key.hash, entry) {
            // push hands back the replaced entry of the same hash, or the evicted LRU entry.
            self.bytes = self.bytes.saturating_sub(old.size());
        }
        self.bytes += size;
        while self.bytes > self.limits.bytes || self.lru.len() > self.limits.entries {
            match self.lru.pop_lru() {
                Some((_, e)) => self.bytes -= e.size(),
                None => break,
            }
        }
        true
    }
}

/// `reply` without the COOKIE and ECS options of its OPT record (and without any record after
/// it), if it has such options.
fn without_private_options(reply: &[u8]) -> Option<Vec<u8>> {
    let layout = wire::layout(reply)?;
    let opt = layout.opt?;
    if !wire::has_private_options(reply, &opt) {
        return None;
    }
    let mut out = reply[..opt.start].to_vec();
    let dnssec_ok = reply[opt.rdata - 4] & 0x80 != 0;
    wire::push_reply_opt(reply, &opt, dnssec_ok, false, false, &mut out);
    out[10..12].copy_from_slice(&(layout.additional_before_opt + 1).to_be_bytes());
    Some(out)
}

fn copy_with_ttls(entry: &Entry, ttl: impl Fn(u32) -> u32, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(entry.reply());
    for at in entry.ttl_offsets() {
        let old = u32::from_be_bytes([out[at], out[at + 1], out[at + 2], out[at + 3]]);
        out[at..at + 4].copy_from_slice(&ttl(old).to_be_bytes());
    }
}

/// May `reply` be cached, and for how long? Positive answers live for their smallest answer
/// TTL; negative ones (NXDOMAIN, NODATA) for the SOA's TTL capped by its MINIMUM field, and so
/// does a NODATA or NXDOMAIN behind a CNAME (RFC 2308 §5: an SOA in the authority section
/// bounds the whole answer, whatever TTL the CNAME has); both clamped to the limits. SERVFAIL,
/// REFUSED and every other error, truncated replies, negative answers without an SOA and
/// anything malformed are not cached. Where each record's TTL sits goes into `ttl_offsets`
/// (two bytes each). `reply` is at least a header long and at most 65,535 bytes (`put` checks).
fn cacheable(reply: &[u8], limits: &Limits, ttl_offsets: &mut Vec<u8>) -> Option<Duration> {
    if wire::is_truncated(reply) {
        return None;
    }
    let code = wire::rcode(reply);
    if code != rcode::NOERROR && code != rcode::NXDOMAIN {
        return None;
    }
    let records = wire::records(reply)?;
    let mut answer_ttl: Option<u32> = None;
    let mut negative_ttl: Option<u32> = None;
    for rr in &records {
        if rr.rtype == TYPE_OPT {
            continue;
        }
        ttl_offsets.extend_from_slice(&(rr.ttl_offset as u16).to_be_bytes());
        match rr.section {
            wire::Section::Answer => {
                answer_ttl = Some(answer_ttl.map_or(rr.ttl, |t| t.min(rr.ttl)));
            }
            wire::Section::Authority if rr.rtype == TYPE_SOA => {
                let minimum = rr.soa_minimum.unwrap_or(rr.ttl);
                let ttl = rr.ttl.min(minimum);
                negative_ttl = Some(negative_ttl.map_or(ttl, |t| t.min(ttl)));
            }
            _ => {}
        }
    }
    let negative = code == rcode::NXDOMAIN || answer_ttl.is_none();
    if negative && negative_ttl.is_none() {
        return None;
    }
    let ttl = answer_ttl.into_iter().chain(negative_ttl).min()?;
    Some(Duration::from_secs(u64::from(ttl)).clamp(limits.min_ttl, limits.max_ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Vec<u8> {
        wire::encode_name(s).unwrap()
    }

    /// A query as a stub sends it, then a reply to it with the given records appended.
    fn query(id: u16, qname: &str, qtype: u16, edns: bool) -> Vec<u8> {
        let mut p = id.to_be_bytes().to_vec();
        p.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, u8::from(edns)]);
        let mut n = name(qname);
        // keep the caller's case
        let mut at = 0;
        for label in qname.split('.') {
            n[at + 1..at + 1 + label.len()].copy_from_slice(label.as_bytes());
            at += 1 + label.len();
        }
        p.extend_from_slice(&n);
        p.extend_from_slice(&qtype.to_be_bytes());
        p.extend_from_slice(&[0, 1]);
        if edns {
            p.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 0]);
        }
        p
    }

    struct Rr<'a> {
        rtype: u16,
        ttl: u32,
        rdata: &'a [u8],
    }

    fn reply(q: &[u8], code: u8, answers: &[Rr], authority: &[Rr]) -> Vec<u8> {
        let parsed = wire::parse_query(q).unwrap();
        let mut r = q[..parsed.question_end].to_vec();
        r[2] |= 0x80;
        r[3] = 0x80 | code;
        r[6..8].copy_from_slice(&(answers.len() as u16).to_be_bytes());
        r[8..10].copy_from_slice(&(authority.len() as u16).to_be_bytes());
        r[10..12].copy_from_slice(&[0, 0]);
        for rr in answers.iter().chain(authority) {
            r.extend_from_slice(&[0xc0, 12]);
            r.extend_from_slice(&rr.rtype.to_be_bytes());
            r.extend_from_slice(&[0, 1]);
            r.extend_from_slice(&rr.ttl.to_be_bytes());
            r.extend_from_slice(&(rr.rdata.len() as u16).to_be_bytes());
            r.extend_from_slice(rr.rdata);
        }
        r
    }

    /// A NOERROR reply to `q` with one A record (1.2.3.4) of this TTL.
    fn a_reply(q: &[u8], ttl: u32) -> Vec<u8> {
        let a = Rr {
            rtype: A,
            ttl,
            rdata: &[1, 2, 3, 4],
        };
        reply(q, 0, &[a], &[])
    }

    fn soa(minimum: u32) -> Vec<u8> {
        let mut d = name("ns.example");
        d.extend_from_slice(&name("host.example"));
        for v in [1u32, 3600, 600, 86400, minimum] {
            d.extend_from_slice(&v.to_be_bytes());
        }
        d
    }

    fn ttls(r: &[u8]) -> Vec<u32> {
        wire::records(r)
            .unwrap()
            .iter()
            .filter(|rr| rr.rtype != TYPE_OPT)
            .map(|rr| rr.ttl)
            .collect()
    }

    fn key(q: &[u8]) -> Key {
        Key::new(
            &KeyHasher::new(7),
            UpstreamGroup::KubeDns,
            q,
            &wire::parse_query(q).unwrap(),
        )
        .unwrap()
    }

    fn cache() -> Cache {
        Cache::new(Limits::default(), KeyHasher::new(7)).unwrap()
    }

    const A: u16 = 1;

    #[test]
    fn keys_ignore_case_and_id_but_not_type_group_or_flags() {
        let k = key(&query(1, "WWW.Example.com", A, false));
        assert_eq!(k, key(&query(2, "www.example.COM", A, false)));
        assert_ne!(k, key(&query(1, "www.example.com", 28, false)), "type");
        assert_ne!(k, key(&query(1, "www.example.com", A, true)), "EDNS");
        let q = query(1, "www.example.com", A, false);
        assert_ne!(
            k,
            Key::new(
                &KeyHasher::new(7),
                UpstreamGroup::VnetDns,
                &q,
                &wire::parse_query(&q).unwrap()
            )
            .unwrap(),
            "group"
        );
        let mut cd = q.clone();
        cd[3] |= 0x10;
        assert_ne!(k, key(&cd), "CD");
    }

    #[test]
    fn an_entry_found_under_another_keys_hash_is_not_served() {
        let mut c = cache();
        let t0 = Instant::now();
        let (qa, qb) = (
            query(1, "a.example", A, false),
            query(1, "b.example", A, false),
        );
        let ra = a_reply(&qa, 60);
        assert!(c.put(key(&qa), &ra, t0));
        let mut out = Vec::new();
        assert_eq!(c.get(&key(&qa), t0, &mut out), Some(Hit::Fresh));
        // Two keys with one 64-bit hash: b's hash finds a's entry.
        let (_, entry) = c.lru.pop_lru().unwrap();
        c.lru.push(key(&qb).hash, entry);
        assert_eq!(c.get(&key(&qb), t0, &mut out), None);
        assert!(!c.get_stale(&key(&qb), t0, &mut out));
        // The same name with another group (or type, class, flags) is another key.
        let (_, entry) = c.lru.pop_lru().unwrap();
        let entry = Entry {
            head: (UpstreamGroup::VnetDns, A, 1, 0),
            ..entry
        };
        c.lru.push(key(&qa).hash, entry);
        assert_eq!(c.get(&key(&qa), t0, &mut out), None);
    }

    #[test]
    fn positive_answers_live_for_their_smallest_ttl_and_count_down() {
        let mut c = cache();
        let t0 = Instant::now();
        let q = query(1, "a.example", A, false);
        let r = reply(
            &q,
            0,
            &[
                Rr {
                    rtype: A,
                    ttl: 300,
                    rdata: &[1, 2, 3, 4],
                },
                Rr {
                    rtype: A,
                    ttl: 60,
                    rdata: &[1, 2, 3, 5],
                },
            ],
            &[],
        );
        assert!(c.put(key(&q), &r, t0));
        let mut out = Vec::new();
        assert!(c.get_fresh(&key(&q), t0 + Duration::from_secs(20), &mut out));
        assert_eq!(ttls(&out), [280, 40]);
        assert!(c.get_fresh(&key(&q), t0 + Duration::from_millis(59_999), &mut out));
        assert!(
            !c.get_fresh(&key(&q), t0 + Duration::from_secs(60), &mut out),
            "expired at the smallest TTL"
        );
    }

    #[test]
    fn ttls_are_clamped_to_the_limits() {
        let mut c = cache();
        let t0 = Instant::now();
        let q = query(1, "zero.example", A, false);
        c.put(key(&q), &a_reply(&q, 0), t0);
        let mut out = Vec::new();
        assert!(
            c.get_fresh(&key(&q), t0 + Duration::from_secs(4), &mut out),
            "floor of 5 s"
        );
        assert!(!c.get_fresh(&key(&q), t0 + Duration::from_secs(5), &mut out));
        let q = query(1, "long.example", A, false);
        c.put(key(&q), &a_reply(&q, 86400), t0);
        assert!(
            !c.get_fresh(&key(&q), t0 + Duration::from_secs(3600), &mut out),
            "cap of 1 h"
        );
    }

    #[test]
    fn negative_answers_live_for_the_soa_minimum() {
        let mut c = cache();
        let t0 = Instant::now();
        let mut out = Vec::new();
        let q = query(1, "nx.example", A, false);
        let soa = soa(30);
        let nx = reply(
            &q,
            rcode::NXDOMAIN,
            &[],
            &[Rr {
                rtype: TYPE_SOA,
                ttl: 3600,
                rdata: &soa,
            }],
        );
        assert!(c.put(key(&q), &nx, t0));
        assert!(c.get_fresh(&key(&q), t0 + Duration::from_secs(29), &mut out));
        assert_eq!(wire::rcode(&out), rcode::NXDOMAIN);
        assert!(
            !c.get_fresh(&key(&q), t0 + Duration::from_secs(30), &mut out),
            "min(SOA TTL, MINIMUM)"
        );
        // NODATA with an SOA whose own TTL is the smaller.
        let q = query(1, "nodata.example", 28, false);
        let nodata = reply(
            &q,
            0,
            &[],
            &[Rr {
                rtype: TYPE_SOA,
                ttl: 10,
                rdata: &soa,
            }],
        );
        assert!(c.put(key(&q), &nodata, t0));
        assert!(!c.get_fresh(&key(&q), t0 + Duration::from_secs(10), &mut out));
        // Without an SOA a negative answer is not cached (RFC 2308 §5).
        let q = query(1, "bare.example", A, false);
        assert!(!c.put(key(&q), &reply(&q, rcode::NXDOMAIN, &[], &[]), t0));
    }

    #[test]
    fn failures_and_truncation_are_never_cached() {
        let mut c = cache();
        let t0 = Instant::now();
        let q = query(1, "x.example", A, false);
        for code in [
            rcode::SERVFAIL,
            rcode::REFUSED,
            rcode::FORMERR,
            rcode::NOTIMP,
        ] {
            assert!(
                !c.put(key(&q), &reply(&q, code, &[], &[]), t0),
                "rcode {code}"
            );
        }
        let mut tc = a_reply(&q, 60);
        tc[2] |= 0x02;
        assert!(!c.put(key(&q), &tc, t0), "truncated");
        assert!(!c.put(key(&q), &[1, 2, 3], t0), "malformed");
        let mut cut = a_reply(&q, 60);
        cut.pop();
        assert!(!c.put(key(&q), &cut, t0), "cut short");
        assert!(c.is_empty());
    }

    #[test]
    fn stale_answers_are_served_for_max_stale_with_ttl_30() {
        let mut c = cache();
        let t0 = Instant::now();
        let q = query(1, "s.example", A, true);
        let mut r = a_reply(&q, 60);
        // An OPT record: its "TTL" field holds flags and must be left alone.
        r[11] = 1;
        r.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, 0x80, 0, 0, 0]);
        assert!(c.put(key(&q), &r, t0));
        let mut out = Vec::new();
        let expired = t0 + Duration::from_secs(61);
        assert!(!c.get_fresh(&key(&q), expired, &mut out));
        assert!(c.get_stale(&key(&q), expired, &mut out));
        assert_eq!(ttls(&out), [STALE_TTL]);
        assert_eq!(
            &out[out.len() - 4..out.len() - 2],
            &[0x80, 0],
            "OPT flags untouched"
        );
        assert!(c.get_stale(&key(&q), t0 + Duration::from_secs(60 + 3600), &mut out));
        assert!(
            !c.get_stale(&key(&q), t0 + Duration::from_secs(60 + 3601), &mut out),
            "too stale"
        );
    }

    #[test]
    fn bounded_by_entries_and_bytes_evicting_least_recently_used() {
        let limits = Limits {
            entries: 3,
            bytes: 1 << 20,
            ..Limits::default()
        };
        let mut c = Cache::new(limits, KeyHasher::new(7)).unwrap();
        let t0 = Instant::now();
        let put = |c: &mut Cache, n: &str| {
            let q = query(1, n, A, false);
            assert!(c.put(key(&q), &a_reply(&q, 60), t0));
        };
        for n in ["a.x", "b.x", "c.x"] {
            put(&mut c, n);
        }
        let mut out = Vec::new();
        assert!(
            c.get_fresh(&key(&query(1, "a.x", A, false)), t0, &mut out),
            "touch a"
        );
        put(&mut c, "d.x");
        assert_eq!(c.len(), 3);
        assert!(
            !c.get_fresh(&key(&query(1, "b.x", A, false)), t0, &mut out),
            "b was least recently used"
        );

        let small = Limits {
            entries: 1000,
            bytes: 2000,
            ..Limits::default()
        };
        let mut c = Cache::new(small, KeyHasher::new(7)).unwrap();
        for i in 0..100 {
            put(&mut c, &format!("n{i}.example"));
            assert!(c.bytes() <= 2000, "byte cap holds: {}", c.bytes());
        }
        assert!(c.len() < 100 && !c.is_empty());
        // Replacing an entry does not count it twice.
        let before = c.bytes();
        put(&mut c, "n99.example");
        assert_eq!(c.bytes(), before);
    }

    fn edns_query(qname: &str, options: &[(u16, &[u8])], version: u8) -> Vec<u8> {
        let mut o = wire::tests::opt(1232, false, options);
        o.version = version;
        wire::tests::query_with(qname, A, [1, 0], Some(&o))
    }

    fn key_of(q: &[u8]) -> Option<Key> {
        Key::new(
            &KeyHasher::new(7),
            UpstreamGroup::KubeDns,
            q,
            &wire::parse_query(q).unwrap(),
        )
    }

    #[test]
    fn queries_whose_answers_are_their_own_are_never_keyed() {
        use wire::option;
        assert!(key_of(&edns_query("a.x", &[], 0)).is_some());
        let cookie: &[u8] = &[1; 8];
        assert_eq!(
            key_of(&edns_query("a.x", &[(option::COOKIE, cookie)], 0)),
            key_of(&edns_query("a.x", &[], 0)),
            "a cookie does not change the answer"
        );
        assert!(key_of(&edns_query("a.x", &[(option::PADDING, &[0; 8])], 0)).is_some());
        assert!(
            key_of(&edns_query("a.x", &[], 1)).is_none(),
            "EDNS version 1"
        );
        let ecs: &[u8] = &[0, 1, 24, 0, 192, 0, 2];
        assert!(
            key_of(&edns_query("a.x", &[(option::ECS, ecs)], 0)).is_none(),
            "ECS"
        );
        // NSID asks who answered: we do, whatever the answer's source.
        assert!(key_of(&edns_query("a.x", &[(3, b"")], 0)).is_some(), "NSID");
        assert!(
            key_of(&edns_query("a.x", &[(65001, b"?")], 0)).is_none(),
            "unknown"
        );
    }

    #[test]
    fn rd_and_ad_are_part_of_the_key() {
        let with = |flags: [u8; 2], dnssec_ok: bool| {
            let o = wire::tests::opt(1232, dnssec_ok, &[]);
            key_of(&wire::tests::query_with("a.x", A, flags, Some(&o))).unwrap()
        };
        assert_ne!(with([1, 0], false), with([0, 0], false), "RD");
        assert_ne!(with([1, 0], false), with([1, 0x20], false), "AD");
        assert_eq!(
            with([1, 0], true),
            with([1, 0x20], true),
            "with DO, AD in the query changes nothing"
        );
    }

    #[test]
    fn a_record_alive_upstream_is_never_served_with_ttl_0() {
        let mut c = cache();
        let t0 = Instant::now();
        let q = query(1, "ttl1.example", A, false);
        let r = reply(
            &q,
            0,
            &[
                Rr {
                    rtype: A,
                    ttl: 1,
                    rdata: &[1, 2, 3, 4],
                },
                Rr {
                    rtype: A,
                    ttl: 0,
                    rdata: &[1, 2, 3, 5],
                },
            ],
            &[],
        );
        assert!(c.put(key(&q), &r, t0));
        let mut out = Vec::new();
        for s in [0, 1, 4] {
            assert!(c.get_fresh(&key(&q), t0 + Duration::from_secs(s), &mut out));
            assert_eq!(ttls(&out), [1, 0], "at {s} s: raised to 1, a 0 stays 0");
        }
    }

    #[test]
    fn a_denial_behind_a_cname_lives_for_the_negative_ttl() {
        let mut c = cache();
        let t0 = Instant::now();
        let mut out = Vec::new();
        let soa = soa(30);
        for (qtype, code) in [(28, rcode::NOERROR), (A, rcode::NXDOMAIN)] {
            let q = query(1, "alias.example", qtype, false);
            let r = reply(
                &q,
                code,
                &[Rr {
                    rtype: 5,
                    ttl: 3600,
                    rdata: &name("target.example"),
                }],
                &[Rr {
                    rtype: TYPE_SOA,
                    ttl: 3600,
                    rdata: &soa,
                }],
            );
            assert!(c.put(key(&q), &r, t0));
            assert!(c.get_fresh(&key(&q), t0 + Duration::from_secs(29), &mut out));
            assert!(
                !c.get_fresh(&key(&q), t0 + Duration::from_secs(30), &mut out),
                "rcode {code}: the SOA bounds it, not the CNAME's 3600 s"
            );
        }
    }

    #[test]
    fn cookies_and_ecs_are_not_stored() {
        use wire::option;
        let mut c = cache();
        let t0 = Instant::now();
        let q = edns_query("a.x", &[], 0);
        let cookie: &[u8] = &[7; 24];
        let ecs: &[u8] = &[0, 1, 24, 24, 192, 0, 2];
        let upstream_opt = wire::tests::opt(
            1232,
            false,
            &[(option::COOKIE, cookie), (option::ECS, ecs), (3, b"ns")],
        );
        let r = wire::tests::reply_with(&q, 0x80, &wire::tests::a_records(2), Some(&upstream_opt));
        assert!(c.put(key_of(&q).unwrap(), &r, t0));
        let mut out = Vec::new();
        assert!(c.get_fresh(&key_of(&q).unwrap(), t0, &mut out));
        let m = wire::tests::hickory(&out);
        use hickory_proto::rr::rdata::opt::EdnsCode;
        let edns = m.extensions().as_ref().unwrap();
        assert!(edns.option(EdnsCode::Cookie).is_none() && edns.option(EdnsCode::Subnet).is_none());
        assert!(
            edns.option(EdnsCode::NSID).is_none(),
            "the upstream's NSID is not ours"
        );
        assert_eq!(m.answers().len(), 2);
    }

    #[test]
    fn off_when_size_is_zero() {
        assert!(
            Cache::new(
                Limits {
                    entries: 0,
                    ..Limits::default()
                },
                KeyHasher::new(7)
            )
            .is_none()
        );
    }
}
