//! Seeded random histories of a whole little world, run through the engine on its fake clock and
//! judged by a model that knows only what crossed the engine's boundary: the queries the clients
//! sent, the bytes the engine sent upstream (destination, ID, question) and to clients, and what
//! the model upstreams and network did. It never reads the engine's tables, so a bookkeeping bug
//! cannot blind the check that should catch it.
//!
//! The world: one or two listeners (node and cluster, sharing the cache and the upstream health,
//! as the daemon's relay threads do), so both upstream groups are busy at once; one to three
//! servers per group, each answering each name NOERROR, NXDOMAIN, NODATA, SERVFAIL or REFUSED after
//! its own delay, with answers that change over time, sometimes truncated over UDP; servers that
//! fall silent for a while or for good, that the network refuses (ICMP), that lose packets, whose
//! sends fail or whose TCP connections break, and replies that come twice or spoofed (wrong ID,
//! source address, source port or question). Clients ask in any case, with and without EDNS, DO,
//! CD and RD; each listener may route domains its own way (LocalDNS's per-domain overrides, drawn
//! per history and matched by the model on the names' text, never through the engine's own
//! routes); the node's hosts file may name some of the names (with A or AAAA addresses, in any
//! case, with malformed lines among them), and change mid-history: the model predicts from the
//! lines it wrote which queries are answered from it (the name in the version in force, routed by
//! the root) and with what, and every other query is judged as forwarded; discovery may replace
//! a group's servers mid-history; timers may fire late as on a
//! busy thread; and some histories have a tiny `--max-inflight`, so shedding happens. A quarter
//! of the histories lose one of two backends of a group for good, and some of those both, some
//! under bursts of new names.
//!
//! What every history must show (`judge`):
//! - safety: exactly one reply per query, within the budget; the client's own ID, QR, RD, CD,
//!   question (spelling included), OPT and DO; records only as an upstream gave them, their TTLs
//!   counted down from the upstream's, fresh only before expiry and stale only within the
//!   serve-stale window; an error RCODE only as an upstream gave it; SERVFAIL made here only where
//!   no reply reached the query, or at once for a name just unanswered or a group down on the
//!   evidence; REFUSED only over a cap; a truncated answer only with no try, time or fetch over
//!   TCP left; every try to a server of the query's group in the set in force; hedges within
//!   their budget in a full outage;
//! - liveness: an answer whenever a clean server could give it in the budget; a query whose
//!   first server answered an error asks the others while it has time and tries; a query whose
//!   answer is fresh in the cache, or whose group is down on the evidence, is answered at once;
//!   one whose answer has expired but may still be served stale gets it by the 1.8 s timer;
//!   through a backend's death with another healthy, every query is answered within 100 ms;
//!   queries in flight never over the caps.
//!
//! Bugs planted to prove the test can fail, and which it catches: `planted.md` beside it.
//!
//! A failure names its seed; `HISTORY_SEED=<seed>` replays that history alone (with
//! `HISTORY_TRACE` it prints it), `HISTORIES=<n>` runs more of them, `HISTORY_FIRST` stops at the
//! first failure.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::IpAddr;

use rand::{Rng, RngCore};

use super::*;
use crate::cache::Limits;
use crate::hosts::Hosts;
use crate::stats::ListenerStats;
use crate::upstream::{UpstreamSet, UpstreamSets};

/// Histories per run (CI); `HISTORIES` overrides.
const HISTORIES: u64 = 20_000;
/// Names per suffix; a name is `n<k>.example.net` or `n<k>.svc.cluster.local`.
const PER_SUFFIX: usize = 4;
const NAMES: usize = 2 * PER_SUFFIX;
const SUFFIXES: [&str; 2] = ["example.net", "svc.cluster.local"];
/// How late a timer may fire, on a busy thread.
const MAX_LATE: u64 = 20;
/// The serve-stale window of these histories: short, so that serving past it shows.
const MAX_STALE_MS: u64 = 8_000;
const MIN_TTL_MS: u64 = 5_000;
/// The goal through a backend's death.
const DEATH_BOUND_MS: u64 = 100;

/// SplitMix64: the model's random draws. StdRng's ChaCha took a third of a debug history.
struct Mix(u64);

impl RngCore for Mix {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Answer,
    NxDomain,
    NoData,
    ServFail,
    Refused,
}

impl Kind {
    fn answers(self) -> bool {
        matches!(self, Kind::Answer | Kind::NxDomain | Kind::NoData)
    }
}

#[derive(Clone, Copy)]
struct Behaviour {
    kind: Kind,
    delay: u64,
    /// Over UDP it answers TC with no record (the whole answer only over TCP).
    truncates: bool,
    /// Its answer's data changes every `period` ms (0: never).
    period: u64,
}

struct Server {
    addr: SocketAddr,
    group: usize,
    /// Its number among all servers (part of its answers' data).
    index: usize,
    silent: Vec<(u64, u64)>,
    dies: Option<u64>,
    unreachable: Vec<(u64, u64)>,
    /// Percentages: lost packets, failed sends, broken TCP exchanges, duplicated and spoofed
    /// replies.
    loss: u32,
    send_fail: u32,
    tcp_break: u32,
    dup: u32,
    spoof: u32,
    names: [Behaviour; NAMES],
}

fn within(spans: &[(u64, u64)], t: u64) -> bool {
    spans.iter().any(|(a, b)| (*a..*b).contains(&t))
}

fn overlaps(spans: &[(u64, u64)], from: u64, to: u64) -> bool {
    spans.iter().any(|(a, b)| *a < to && from < *b)
}

impl Server {
    fn drops(&self, t: u64) -> bool {
        within(&self.silent, t) || self.dies.is_some_and(|d| t >= d)
    }

    /// Answers every try in `[from, to)`, every name in less than `fast` ms (twice over for a
    /// truncated answer on `udp`).
    fn clean(&self, from: u64, to: u64, fast: u64, udp: bool) -> bool {
        self.loss == 0
            && self.send_fail == 0
            && self.tcp_break == 0
            && !overlaps(&self.silent, from, to)
            && !overlaps(&self.unreachable, from, to)
            && self.dies.is_none_or(|d| d >= to)
            && self.names.iter().all(|b| cost(b, udp) < fast)
    }

    fn version(&self, nid: usize, t: u64) -> u8 {
        let b = self.names[nid];
        let step = t.checked_div(b.period).map_or(0, |n| n % 40);
        (self.index as u64 * 40 + step + 1) as u8
    }
}

/// How long a try's answer takes, a truncated one fetched again over TCP included.
fn cost(b: &Behaviour, udp: bool) -> u64 {
    if b.truncates && udp {
        2 * b.delay
    } else {
        b.delay
    }
}

fn draw_behaviour(rng: &mut Mix, fast: bool, slow: bool) -> Behaviour {
    let kind = match rng.random_range(0..100) {
        0..55 => Kind::Answer,
        55..67 => Kind::NxDomain,
        67..77 => Kind::NoData,
        _ if fast => Kind::Answer,
        77..90 => Kind::ServFail,
        _ => Kind::Refused,
    };
    let delay = if fast {
        rng.random_range(1..=5)
    } else if slow {
        rng.random_range(700..=1400)
    } else {
        match rng.random_range(0..20) {
            0..13 => rng.random_range(1..20),
            13..17 => rng.random_range(20..300),
            17..19 => rng.random_range(300..1000),
            _ => rng.random_range(1000..=1500),
        }
    };
    Behaviour {
        kind,
        delay,
        truncates: !fast && rng.random_bool(0.08),
        period: if rng.random_bool(0.5) {
            0
        } else {
            rng.random_range(2_000..15_000)
        },
    }
}

fn draw_server(rng: &mut Mix, group: usize, last: u8, index: usize, fast: bool) -> Server {
    let mut silent = Vec::new();
    let (mut dies, mut unreachable) = (None, Vec::new());
    let pct = |rng: &mut Mix, p: f64, v: u32| if rng.random_bool(p) { v } else { 0 };
    let (mut loss, mut send_fail, mut tcp_break) = (0, 0, 0);
    if !fast {
        if rng.random_bool(0.3) {
            let mut from = rng.random_range(0..20_000);
            for _ in 0..rng.random_range(1..=2) {
                let len = rng.random_range(500..8_000);
                silent.push((from, from + len));
                from += len + rng.random_range(500..10_000);
            }
        }
        if rng.random_bool(0.1) {
            dies = Some(rng.random_range(0..30_000));
        }
        if rng.random_bool(0.1) {
            let from = rng.random_range(0..20_000);
            unreachable.push((from, from + rng.random_range(500..5_000)));
        }
        loss = [0, 0, 0, 5, 20][rng.random_range(0..5)];
        send_fail = pct(rng, 0.1, 15);
        tcp_break = pct(rng, 0.1, 25);
    }
    let dup = pct(rng, 0.2, 30);
    let spoof = pct(rng, 0.25, 40);
    let slow = !fast && rng.random_bool(0.1);
    let names = std::array::from_fn(|_| draw_behaviour(rng, fast, slow));
    Server {
        addr: SocketAddr::from(([198, 18, group as u8, last], 53)),
        group,
        index,
        silent,
        dies,
        unreachable,
        loss,
        send_fail,
        tcp_break,
        dup,
        spoof,
        names,
    }
}

fn name_of(nid: usize) -> String {
    format!("n{}.{}", nid % PER_SUFFIX, SUFFIXES[nid / PER_SUFFIX])
}

/// Domains a history may route its own way: every suffix of the names asked, and the root.
const ROUTE_DOMAINS: [&str; 8] = [
    ".",
    "net",
    "example.net",
    "n1.example.net",
    "local",
    "cluster.local",
    "svc.cluster.local",
    "n2.svc.cluster.local",
];

/// LocalDNS's routing in a history: its defaults (the node listener sends cluster.local to
/// kube-dns and the rest to the VNet DNS; the cluster listener everything to kube-dns) with the
/// history's own overrides over them, a later one for the same listener and domain replacing an
/// earlier. The model's own reading: the longest matching suffix of the name's text.
#[derive(Clone, Debug, Default)]
struct Routing {
    overrides: Vec<(ListenerRole, &'static str, usize)>,
}

impl Routing {
    fn draw(rng: &mut Mix) -> Routing {
        let n = [0, 0, 1, 2, 4][rng.random_range(0..5)];
        let overrides = (0..n)
            .map(|_| {
                let role = [ListenerRole::Node, ListenerRole::Cluster][rng.random_range(0..2)];
                (
                    role,
                    ROUTE_DOMAINS[rng.random_range(0..ROUTE_DOMAINS.len())],
                    rng.random_range(0..2),
                )
            })
            .collect();
        Routing { overrides }
    }

    /// The group `role` sends name `nid` to.
    fn group_of(&self, role: ListenerRole, nid: usize) -> usize {
        self.route_of(role, nid).1
    }

    /// The route name `nid` takes on `role`: its domain and group.
    fn route_of(&self, role: ListenerRole, nid: usize) -> (&'static str, usize) {
        let (kube, vnet) = (
            UpstreamGroup::KubeDns as usize,
            UpstreamGroup::VnetDns as usize,
        );
        let mut routes: Vec<(&str, usize)> = match role {
            ListenerRole::Node => vec![(".", vnet), ("cluster.local", kube)],
            ListenerRole::Cluster => vec![(".", kube), ("cluster.local", kube)],
        };
        for &(r, domain, group) in &self.overrides {
            if r == role {
                routes.retain(|(d, _)| *d != domain);
                routes.push((domain, group));
            }
        }
        let name = name_of(nid);
        let under = |d: &str| d == "." || name == d || name.ends_with(&format!(".{d}"));
        routes
            .into_iter()
            .filter(|(d, _)| under(d))
            .max_by_key(|(d, _)| if *d == "." { 0 } else { d.len() + 1 })
            .unwrap_or((".", kube))
    }

    /// The same as the engine's settings take it.
    fn routes(&self) -> crate::engine::route::Routes {
        let wire_of = |d: &str| {
            if d == "." {
                vec![0]
            } else {
                wire::encode_name(d).expect("a domain")
            }
        };
        let mut routes = crate::engine::route::Routes::defaults(&wire_of("cluster.local"));
        for &(role, domain, group) in &self.overrides {
            let group = if group == UpstreamGroup::VnetDns as usize {
                UpstreamGroup::VnetDns
            } else {
                UpstreamGroup::KubeDns
            };
            routes.set(role, &wire_of(domain), group);
        }
        routes
    }
}

/// A line of a history's hosts file as the model wrote it: an address (none: a malformed line,
/// which must change nothing) and names of ours, written in capitals if `upper`.
#[derive(Clone, Debug)]
struct HostsLine {
    addr: Option<IpAddr>,
    names: Vec<usize>,
    upper: bool,
}

/// Half the histories have a hosts file: one to three versions (from 0 ms, then each replacing
/// the last at its ms) of up to four lines over a few IPv4 and IPv6 addresses.
fn draw_hosts(rng: &mut Mix) -> Vec<(u64, Vec<HostsLine>)> {
    let versions = [0, 0, 0, 1, 2, 3][rng.random_range(0..6)];
    let mut hosts: Vec<(u64, Vec<HostsLine>)> = (0..versions)
        .map(|v| {
            let at = if v == 0 {
                0
            } else {
                rng.random_range(1_000..30_000)
            };
            let lines = (0..rng.random_range(0..5))
                .map(|_| HostsLine {
                    addr: match rng.random_range(0..6u8) {
                        0 => None,
                        k @ 1..3 => Some(IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, k.into()])),
                        k => Some(IpAddr::from([192, 0, 2, k % 3])),
                    },
                    names: (0..rng.random_range(1..3))
                        .map(|_| rng.random_range(0..NAMES))
                        .collect(),
                    upper: rng.random_bool(0.3),
                })
                .collect();
            (at, lines)
        })
        .collect();
    hosts.sort_by_key(|(at, _)| *at);
    hosts
}

/// The file's text: a line per `HostsLine`, with comments and odd spacing.
fn hosts_text(lines: &[HostsLine]) -> String {
    let mut text = String::from("# a history's hosts file\n");
    for l in lines {
        let addr = l.addr.map_or("not-an-address".into(), |a| a.to_string());
        let names: Vec<String> = l.names.iter().map(|&n| name_of(n)).collect();
        let names = names.join(" \t");
        let names = if l.upper { names.to_uppercase() } else { names };
        text.push_str(&format!("{addr}\t{names}  # n{}\n", l.names[0]));
    }
    text
}

/// What identifies an answer: group, name and the query bits that change it (RD, CD, EDNS, DO).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct MKey {
    group: usize,
    nid: usize,
    flags: u8,
}

fn flags_of(packet: &[u8], q: &wire::Query) -> u8 {
    (packet[2] & 1)
        | u8::from(packet[3] & 0x10 != 0) << 1
        | u8::from(q.edns) << 2
        | u8::from(q.dnssec_ok) << 3
}

/// Which name of ours a question asks, any case.
fn nid_of(packet: &[u8], q: &wire::Query) -> Option<usize> {
    static WIRE: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    let names = WIRE.get_or_init(|| {
        (0..NAMES)
            .map(|n| wire::encode_name(&name_of(n)).expect("ours"))
            .collect()
    });
    let name = q.name(packet);
    names.iter().position(|w| w.eq_ignore_ascii_case(name))
}

/// A client's query in a failure message, formatted only then.
struct What(usize, usize, u64);

impl std::fmt::Display for What {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "q{} for {} at {} ms", self.0, name_of(self.1), self.2)
    }
}

struct Client0 {
    engine: usize,
    key: MKey,
    at: u64,
    step: usize,
    client: Client,
    query: Vec<u8>,
    /// (ms, step, bytes) of every reply it got.
    got: Vec<(u64, usize, Vec<u8>)>,
}

/// A try as the network saw it.
struct Sent {
    engine: usize,
    leg: Leg,
    key: MKey,
    server: usize,
    at: u64,
    step: usize,
    /// When a valid reply first reached the engine.
    answered: Option<u64>,
    /// When the network ended it (a failure, an ICMP error for its server).
    ended: Option<u64>,
}

/// A valid reply that reached the engine.
struct Heard {
    sent: usize,
    at: u64,
    step: usize,
    kind: Kind,
    truncated: bool,
    /// The data it carried: (version, TTL) of its record.
    version: u8,
    ttl: u32,
    /// The first to reach the engine for its try: a duplicate is ignored there, and proves
    /// nothing.
    first: bool,
}

impl Heard {
    /// Could the engine have taken it: the first for a try the network had not ended?
    fn taken(&self, h: &History) -> bool {
        self.first && h.sent[self.sent].ended.is_none_or(|e| e > self.at)
    }
}

/// Evidence of silence the network gave the engine outright: (server, ms, step).
struct Refusal {
    server: usize,
    at: u64,
    step: usize,
    /// The send time the engine notes with it.
    sent_at: u64,
}

enum Input {
    Query(usize),
    Reply {
        engine: usize,
        leg: Leg,
        from: SocketAddr,
        bytes: Vec<u8>,
        valid: Option<(usize, Kind, bool, u8, u32)>,
    },
    Failure {
        engine: usize,
        leg: Leg,
        failure: Failure,
        sent: usize,
    },
    Unreachable {
        engine: usize,
        server: usize,
    },
    Discovery {
        group: usize,
        set: Vec<usize>,
    },
    /// The hosts file's version `0` comes into force.
    Hosts(usize),
}

struct History {
    servers: Vec<Server>,
    /// Per group: the server sets in force, from when (ms).
    sets: [Vec<(u64, Vec<usize>)>; 2],
    /// Per group and name: the record TTL and the SOA MINIMUM.
    ttls: [[(u32, u32); NAMES]; 2],
    roles: Vec<ListenerRole>,
    routing: Routing,
    /// The hosts file's versions and the ms each came into force.
    hosts: Vec<(u64, Vec<HostsLine>)>,
    transport: Transport,
    cache: bool,
    max_inflight: usize,
    late_timers: bool,
    /// The group whose backend dies with another healthy: every query answered within 100 ms.
    death: Option<usize>,
    /// Both of its backends die, at this ms, under bursts: hedges stay within their budget.
    outage: Option<u64>,
    /// Which steps were timers firing.
    timer_steps: Vec<bool>,
    budget: u64,
    try_time: u64,
    // What happened.
    clients: Vec<Client0>,
    sent: Vec<Sent>,
    heard: Vec<Heard>,
    refusals: Vec<Refusal>,
}

impl History {
    /// The model's answer from the hosts file to client `c`: the RDATA of its records, in
    /// order (none: NODATA); `None` if it is forwarded. A version comes into force before the
    /// queries of its ms.
    fn hosts_answer(&self, c: &Client0) -> Option<Vec<Vec<u8>>> {
        let (_, lines) = self.hosts.iter().rev().find(|(at, _)| *at <= c.at)?;
        if self.routing.route_of(self.roles[c.engine], c.key.nid).0 != "." {
            return None;
        }
        let mut addrs = lines
            .iter()
            .filter(|l| l.names.contains(&c.key.nid))
            .filter_map(|l| l.addr)
            .peekable();
        addrs.peek()?;
        let qtype = wire::parse_query(&c.query).expect("ours").qtype;
        let mut rdata: Vec<Vec<u8>> = addrs
            .filter_map(|a| match (a, qtype) {
                (IpAddr::V4(a), 1) => Some(a.octets().to_vec()),
                (IpAddr::V6(a), 28) => Some(a.octets().to_vec()),
                _ => None,
            })
            .collect();
        rdata.sort();
        rdata.dedup();
        Some(rdata)
    }

    fn set_at(&self, group: usize, t: u64) -> &[usize] {
        let sets = &self.sets[group];
        let i = sets.iter().rposition(|(from, _)| *from <= t).unwrap_or(0);
        &sets[i].1
    }

    /// The set of `group` stayed the same over `[from, to]`.
    fn set_stable(&self, group: usize, from: u64, to: u64) -> bool {
        self.sets[group]
            .iter()
            .skip(1)
            .all(|(at, _)| *at <= from || *at > to)
    }

    fn replaced_at(&self, group: usize, t: u64) -> u64 {
        let sets = &self.sets[group];
        sets.iter()
            .rev()
            .find(|(from, _)| *from <= t)
            .map_or(0, |(from, _)| *from)
    }
}

fn upstream_reply(
    sent: &[u8],
    h: &History,
    server: &Server,
    key: MKey,
    via: Via,
    t: u64,
) -> (Vec<u8>, Kind, bool, u8, u32) {
    let q = wire::parse_query(sent).expect("the engine sends well-formed queries");
    let b = server.names[key.nid];
    let truncated = b.truncates && matches!(via, Via::Udp { .. });
    let version = server.version(key.nid, t);
    let (ttl, minimum) = h.ttls[key.group][key.nid];
    let mut r = sent[..q.question_end].to_vec();
    let code = match b.kind {
        Kind::Answer | Kind::NoData => rcode::NOERROR,
        Kind::NxDomain => rcode::NXDOMAIN,
        Kind::ServFail => rcode::SERVFAIL,
        Kind::Refused => rcode::REFUSED,
    };
    let code = if truncated { rcode::NOERROR } else { code };
    r[2] = 0x80 | (sent[2] & 0x01) | if truncated { 0x02 } else { 0 };
    r[3] = 0x80 | (sent[3] & 0x10) | code;
    r[4..12].copy_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    let (g, n) = (key.group as u8, key.nid as u8);
    if !truncated {
        match b.kind {
            Kind::Answer => {
                r[7] = 1;
                r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
                r.extend_from_slice(&ttl.to_be_bytes());
                r.extend_from_slice(&[0, 4, 10, g, version, n]);
            }
            Kind::NxDomain | Kind::NoData => {
                r[9] = 1;
                r.extend_from_slice(&[0xc0, 12, 0, 6, 0, 1]);
                r.extend_from_slice(&ttl.to_be_bytes());
                r.extend_from_slice(&[0, 22, 0, 0, 0, g, version, n]);
                r.extend_from_slice(&[0, 0, 0, 60, 0, 0, 0, 60, 0, 0, 0, 60]);
                r.extend_from_slice(&minimum.to_be_bytes());
            }
            Kind::ServFail | Kind::Refused => {
                r[9] = 1;
                r.extend_from_slice(&[0xc0, 12, 0, 16, 0, 1, 0, 0, 0, 0, 0, 3, 2, g, n]);
            }
        }
    }
    if q.edns {
        r[11] = 1;
        let dnssec_ok = if q.dnssec_ok { 0x80 } else { 0 };
        r.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, dnssec_ok, 0, 0, 0]);
    }
    (r, b.kind, truncated, version, ttl)
}

/// What a reply to a client carries, as far as the model can tell.
#[derive(Debug, PartialEq)]
enum Mark {
    /// No record at all: made here (or an upstream's truncated reply, when TC is set).
    Bare,
    Answer {
        group: u8,
        version: u8,
        nid: u8,
        ttl: u32,
    },
    Negative {
        group: u8,
        version: u8,
        nid: u8,
        ttl: u32,
    },
    Error {
        group: u8,
        nid: u8,
    },
    Foreign,
}

fn mark(reply: &[u8]) -> Mark {
    let Some(records) = wire::records(reply) else {
        return Mark::Foreign;
    };
    let Some(r) = records.iter().find(|r| r.rtype != 41) else {
        return Mark::Bare;
    };
    let rdata = r.ttl_offset + 6;
    let at = |i: usize| reply.get(rdata + i).copied().unwrap_or(0xff);
    match (r.section, r.rtype) {
        (wire::Section::Answer, 1) if at(0) == 10 => Mark::Answer {
            group: at(1),
            version: at(2),
            nid: at(3),
            ttl: r.ttl,
        },
        (wire::Section::Authority, 6) if at(2) == 0 => Mark::Negative {
            group: at(3),
            version: at(4),
            nid: at(5),
            ttl: r.ttl,
        },
        (wire::Section::Authority, 16) => Mark::Error {
            group: at(1),
            nid: at(2),
        },
        _ => Mark::Foreign,
    }
}

/// A spoofer's data in place of the upstream's: taken, it shows in what the client gets.
fn poison(reply: &mut [u8]) {
    let Some(r) = wire::records(reply).and_then(|rs| rs.into_iter().find(|r| r.rtype != 41)) else {
        return;
    };
    let at = r.ttl_offset + 6 + if r.rtype == 6 { 2 } else { 1 };
    reply[at] = 66;
}

/// The OPT record of a message: (present, DO).
fn opt_of(reply: &[u8]) -> (bool, bool) {
    let Some(records) = wire::records(reply) else {
        return (false, false);
    };
    match records.iter().find(|r| r.rtype == 41) {
        Some(r) => (
            true,
            reply.get(r.ttl_offset + 2).is_some_and(|b| b & 0x80 != 0),
        ),
        None => (false, false),
    }
}

/// Client `i`'s query for name `nid` on engine `engine`, asked at `at` ms.
fn new_client(rng: &mut Mix, h: &History, i: usize, engine: usize, nid: usize, at: u64) -> Client0 {
    let id: u16 = rng.random();
    let query = client_query(rng, id, nid);
    let q = wire::parse_query(&query).expect("a well-formed query");
    let client = match h.transport {
        Transport::Udp => Client::Udp(SocketAddr::from(([10, 1, (i >> 8) as u8, i as u8], 5353))),
        Transport::Tcp => Client::Tcp(i as u64),
    };
    Client0 {
        engine,
        key: MKey {
            group: h.routing.group_of(h.roles[engine], nid),
            nid,
            flags: flags_of(&query, &q),
        },
        at,
        step: 0,
        client,
        query,
        got: Vec::new(),
    }
}

fn client_query(rng: &mut Mix, id: u16, nid: usize) -> Vec<u8> {
    let mut name = name_of(nid);
    if rng.random_bool(0.3) {
        name = name
            .chars()
            .map(|c| {
                if rng.random_bool(0.5) {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect();
    }
    let edns = match rng.random_range(0..10) {
        0..4 => None,
        4..7 => Some(1232u16),
        _ => Some(4096),
    };
    let mut p = query(id, &name, edns);
    if rng.random_bool(0.1) {
        p[2] &= !0x01;
    }
    if rng.random_bool(0.1) {
        p[3] |= 0x10;
    }
    if edns.is_some() && rng.random_bool(0.15) {
        let n = p.len();
        p[n - 4] |= 0x80;
    }
    p
}

#[allow(clippy::needless_range_loop)] // both groups' sets and servers, by group number
fn run_history(seed: u64) -> Result<(), String> {
    let mut rng = Mix(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5bd1_e995);
    let cluster_only = rng.random_bool(0.2);
    let roles = if cluster_only {
        vec![ListenerRole::Cluster]
    } else if rng.random_bool(0.5) {
        vec![ListenerRole::Node, ListenerRole::Cluster]
    } else {
        vec![ListenerRole::Node]
    };
    let small = rng.random_bool(0.12);
    let death = (!small && rng.random_bool(0.25)).then(|| {
        if cluster_only {
            1
        } else {
            rng.random_range(0..2)
        }
    });
    // Sometimes both die at once: a full outage, under bursts of new names.
    let outage = death.is_some() && rng.random_bool(0.05);
    let died_at = rng.random_range(2_000..20_000);
    // The death scenarios pick names that reach the dying group through the default routes.
    let routing = if death.is_none() {
        Routing::draw(&mut rng)
    } else {
        Routing::default()
    };
    let hosts = if death.is_none() {
        draw_hosts(&mut rng)
    } else {
        Vec::new()
    };
    let mut servers = Vec::new();
    let mut sets: [Vec<(u64, Vec<usize>)>; 2] = [Vec::new(), Vec::new()];
    for g in 0..2 {
        let n = if death == Some(g) {
            2
        } else {
            rng.random_range(1..=3)
        };
        let mut set = Vec::new();
        for i in 0..n {
            let index = servers.len();
            let mut s = draw_server(&mut rng, g, i as u8 + 1, index, death == Some(g));
            if death == Some(g) && (i == 1 || outage) {
                s.dies = Some(died_at);
            }
            servers.push(s);
            set.push(index);
        }
        sets[g].push((0, set));
    }
    // Discovery replaces a group's servers: one goes (it still answers whoever asks it), a new
    // one comes.
    let mut discoveries = Vec::new();
    for g in 0..2 {
        if death != Some(g) && rng.random_bool(0.2) {
            let at = rng.random_range(1_000..30_000);
            let mut set = sets[g][0].1.clone();
            if set.len() > 1 {
                set.remove(rng.random_range(0..set.len()));
            }
            let index = servers.len();
            servers.push(draw_server(&mut rng, g, 10, index, false));
            set.push(index);
            sets[g].push((at, set.clone()));
            discoveries.push((at, g, set));
        }
    }
    let ttl_choices = [0, 1, 3, 7, 20];
    let ttls = std::array::from_fn(|_| {
        std::array::from_fn(|_| {
            let t = ttl_choices[rng.random_range(0..ttl_choices.len())];
            let m = if rng.random_bool(0.3) {
                ttl_choices[rng.random_range(0..ttl_choices.len())]
            } else {
                t
            };
            (t, m)
        })
    });
    let transport = if rng.random_bool(0.7) {
        Transport::Udp
    } else {
        Transport::Tcp
    };
    // Through a backend's death, sometimes bursts of new names: half of each burst goes to the
    // dead one until it is known dead, more hedges than the budget holds (the cache off, so that
    // every query goes upstream).
    let death_bursts = death.is_some() && (outage || rng.random_bool(0.05));
    let cache = !death_bursts && rng.random_bool(0.9);
    let max_inflight = if small {
        rng.random_range(4..=12)
    } else {
        Settings::default().max_inflight
    };
    let late_timers = rng.random_bool(0.5);

    let addrs =
        |g: usize| -> Vec<SocketAddr> { sets[g][0].1.iter().map(|i| servers[*i].addr).collect() };
    let mut setup = Setup::new(roles[0], addrs(0), addrs(1));
    setup.settings.max_inflight = max_inflight;
    setup.routes = routing.routes();
    setup.seed = std::array::from_fn(|i| (seed >> (8 * (i % 8))) as u8 ^ i as u8);
    setup.cache = cache.then(|| Limits {
        min_ttl: Duration::from_millis(MIN_TTL_MS),
        max_stale: Duration::from_millis(MAX_STALE_MS),
        ..Limits::default()
    });
    let (settings, routes) = (setup.settings.clone(), setup.routes.clone());
    let budget = settings.query_timeout.as_millis() as u64;
    let try_time = settings.upstream_timeout.as_millis() as u64;
    let t0 = Instant::now();
    let first = setup.start(t0).engine;
    let mut engines = vec![first];
    for (i, role) in roles.iter().enumerate().skip(1) {
        let e = &engines[0];
        let mut seed2 = [0u8; 32];
        rng.fill_bytes(&mut seed2);
        seed2[0] ^= i as u8;
        engines.push(Engine::new(
            *role,
            settings.clone(),
            routes.clone(),
            e.upstreams.clone(),
            e.cache.clone(),
            Arc::new(ListenerStats::default()),
            seed2,
        ));
    }
    let at = |ms: u64| t0 + Duration::from_millis(ms);

    let mut h = History {
        servers,
        sets,
        ttls,
        roles: roles.clone(),
        routing: routing.clone(),
        hosts,
        transport,
        cache,
        max_inflight,
        late_timers,
        death: death.filter(|_| !outage),
        outage: outage.then_some(died_at),
        timer_steps: Vec::new(),
        budget,
        try_time,
        clients: Vec::new(),
        sent: Vec::new(),
        heard: Vec::new(),
        refusals: Vec::new(),
    };

    // The clients' queries: gaps from none (bursts) to seconds.
    let mut t = 0;
    let count = rng.random_range(15..60);
    let bursty = small || rng.random_bool(0.15);
    for i in 0..count {
        t += match rng.random_range(0..10) {
            _ if bursty && rng.random_bool(0.5) => 0,
            0..5 => rng.random_range(0..20),
            5..8 => rng.random_range(20..1000),
            _ => rng.random_range(1000..=3000),
        };
        // The death scenario warms both servers up first, so their round trips are known.
        if death.is_some() && i < 6 {
            t = i as u64 * 150;
        }
        let mut engine = rng.random_range(0..engines.len());
        let mut nid = rng.random_range(0..NAMES);
        if let Some(g) = death.filter(|_| rng.random_bool(0.6) || i < 6) {
            // Only the node listener (the first) sends anything to the VNet DNS.
            if g == UpstreamGroup::VnetDns as usize {
                engine = 0;
            }
            while routing.group_of(roles[engine], nid) != g {
                nid = rng.random_range(0..NAMES);
            }
        }
        let client = new_client(&mut rng, &h, i, engine, nid, t);
        h.clients.push(client);
    }
    if let (Some(g), true) = (death, death_bursts) {
        let died = died_at;
        let n = h.clients.len();
        for b in 0..16 * 20 {
            let i = n + b;
            let engine = if g == UpstreamGroup::VnetDns as usize {
                0
            } else {
                rng.random_range(0..engines.len())
            };
            let mut nid = rng.random_range(0..NAMES);
            while routing.group_of(roles[engine], nid) != g {
                nid = rng.random_range(0..NAMES);
            }
            let at = died + 20 + (b / 20) as u64 * 50;
            t = t.max(at);
            let client = new_client(&mut rng, &h, i, engine, nid, at);
            h.clients.push(client);
        }
    }
    // A query answered from the hosts file may ask AAAA or any other type (NODATA).
    for i in 0..h.clients.len() {
        if h.hosts_answer(&h.clients[i]).is_some() && rng.random_bool(0.4) {
            let c = &mut h.clients[i];
            let at = wire::parse_query(&c.query).expect("ours").name_end;
            let qtype: u16 = [28, 15][rng.random_range(0..2)];
            c.query[at..at + 2].copy_from_slice(&qtype.to_be_bytes());
        }
    }
    let end = t + 20_000;

    let mut inputs: BinaryHeap<(Reverse<u64>, Reverse<u64>, usize)> = BinaryHeap::new();
    let mut parked: Vec<Option<Input>> = Vec::new();
    let mut seq = 0;
    let mut push = |inputs: &mut BinaryHeap<_>, parked: &mut Vec<Option<Input>>, ms, input| {
        parked.push(Some(input));
        seq += 1;
        inputs.push((Reverse(ms), Reverse(seq), parked.len() - 1));
    };
    // At the same ms, discovery and the hosts file first: the model's sets change at their ms.
    for v in 0..h.hosts.len() {
        push(&mut inputs, &mut parked, h.hosts[v].0, Input::Hosts(v));
    }
    for (ms, group, set) in discoveries {
        push(
            &mut inputs,
            &mut parked,
            ms,
            Input::Discovery { group, set },
        );
    }
    for i in 0..h.clients.len() {
        push(&mut inputs, &mut parked, h.clients[i].at, Input::Query(i));
    }
    let trace = std::env::var("HISTORY_TRACE").is_ok();
    let mut step = 0;
    let mut now = 0;
    // A timer due at the first, to fire at the second (late on a busy thread).
    let mut timer: Option<(u64, u64)> = None;
    let mut out = Vec::new();
    loop {
        for (e, engine) in engines.iter_mut().enumerate() {
            while let Some(t) = engine.poll_transmit() {
                out.push((e, t.dest, t.bytes.to_vec()));
            }
            while engine.poll_event().is_some() {}
        }
        for (e, dest, bytes) in out.drain(..) {
            match dest {
                Dest::Client(c) => {
                    let i = h
                        .clients
                        .iter()
                        .position(|a| a.client == c && a.engine == e)
                        .ok_or_else(|| format!("a reply to {c:?}, who never asked"))?;
                    if trace {
                        note(format!(
                            "{now:>6} [{step}] q{i} <- rcode {} {:?}",
                            wire::rcode(&bytes),
                            mark(&bytes)
                        ));
                    }
                    h.clients[i].got.push((now, step, bytes));
                }
                Dest::Upstream(leg) => {
                    let q = wire::parse_query(&bytes)
                        .map_err(|e| format!("a bad query upstream: {e:?}"))?;
                    let nid = nid_of(&bytes, &q).ok_or("a try for a name nobody asked")?;
                    let group = h.routing.group_of(h.roles[e], nid);
                    let key = MKey {
                        group,
                        nid,
                        flags: flags_of(&bytes, &q),
                    };
                    let server = h
                        .servers
                        .iter()
                        .position(|s| s.addr == leg.to)
                        .ok_or_else(|| format!("a try to {}, no server", leg.to))?;
                    // A truncated answer is fetched again over TCP from the same server, even
                    // one discovery has just removed: the try named it.
                    let refetch = leg.via == Via::Tcp
                        && h.heard.last().is_some_and(|r| {
                            let s = &h.sent[r.sent];
                            r.step == step && r.truncated && s.server == server && s.key == key
                        });
                    if !refetch && !h.set_at(group, now).contains(&server) {
                        return Err(format!(
                            "{now} ms: a try for {} to {}, not a server of its group now",
                            name_of(nid),
                            leg.to
                        ));
                    }
                    if h.transport == Transport::Tcp && leg.via != Via::Tcp {
                        return Err(format!(
                            "{now} ms: a TCP client's query went upstream over UDP"
                        ));
                    }
                    let si = h.sent.len();
                    h.sent.push(Sent {
                        engine: e,
                        leg,
                        key,
                        server,
                        at: now,
                        step,
                        answered: None,
                        ended: None,
                    });
                    let s = &h.servers[server];
                    let b = s.names[nid];
                    let udp = matches!(leg.via, Via::Udp { .. });
                    let roll = |rng: &mut Mix, pct: u32| pct > 0 && rng.random_range(0..100) < pct;
                    let mut fate = "lost";
                    if within(&s.unreachable, now) {
                        fate = "refused";
                        let input = if udp && rng.random_bool(0.5) {
                            Input::Unreachable { engine: e, server }
                        } else {
                            Input::Failure {
                                engine: e,
                                leg,
                                failure: Failure::Network(std::io::ErrorKind::ConnectionRefused),
                                sent: si,
                            }
                        };
                        push(&mut inputs, &mut parked, now + 1, input);
                    } else if roll(&mut rng, s.send_fail) {
                        fate = "send failed";
                        let failure = Failure::Network(std::io::ErrorKind::NetworkUnreachable);
                        push(
                            &mut inputs,
                            &mut parked,
                            now,
                            Input::Failure {
                                engine: e,
                                leg,
                                failure,
                                sent: si,
                            },
                        );
                    } else if s.drops(now) || roll(&mut rng, s.loss) {
                    } else if !udp && roll(&mut rng, s.tcp_break) {
                        fate = "broken";
                        let failure = Failure::Network(std::io::ErrorKind::ConnectionReset);
                        push(
                            &mut inputs,
                            &mut parked,
                            now + b.delay / 2,
                            Input::Failure {
                                engine: e,
                                leg,
                                failure,
                                sent: si,
                            },
                        );
                    } else {
                        fate = "answered";
                        let (reply, kind, tc, version, ttl) =
                            upstream_reply(&bytes, &h, s, key, leg.via, now + b.delay);
                        let valid = Some((si, kind, tc, version, ttl));
                        if roll(&mut rng, s.dup) {
                            let later = now + b.delay + rng.random_range(0..50);
                            push(
                                &mut inputs,
                                &mut parked,
                                later,
                                Input::Reply {
                                    engine: e,
                                    leg,
                                    from: leg.to,
                                    bytes: reply.clone(),
                                    valid,
                                },
                            );
                        }
                        push(
                            &mut inputs,
                            &mut parked,
                            now + b.delay,
                            Input::Reply {
                                engine: e,
                                leg,
                                from: leg.to,
                                bytes: reply,
                                valid,
                            },
                        );
                    }
                    // An off-path spoofer sees the try go out, whatever becomes of it.
                    if roll(&mut rng, s.spoof) {
                        let mut spoof = upstream_reply(&bytes, &h, s, key, leg.via, now).0;
                        poison(&mut spoof);
                        let mut from = leg.to;
                        match rng.random_range(0..4) {
                            0 => {
                                let id = wire::id(&spoof) ^ rng.random_range(1..=u16::MAX);
                                wire::set_id(&mut spoof, id);
                            }
                            1 => from.set_port(5353),
                            2 => from = SocketAddr::from(([198, 18, group as u8, 99], 53)),
                            _ => {
                                // The same ID and source, another question.
                                let other = (nid + 1) % PER_SUFFIX + nid / PER_SUFFIX * PER_SUFFIX;
                                let mut q2 = query(
                                    wire::id(&bytes),
                                    &name_of(other),
                                    q.edns.then_some(1232),
                                );
                                q2[2] = bytes[2];
                                let k2 = MKey { nid: other, ..key };
                                spoof = upstream_reply(&q2, &h, s, k2, leg.via, now).0;
                                poison(&mut spoof);
                            }
                        }
                        push(
                            &mut inputs,
                            &mut parked,
                            now + rng.random_range(0..=1500),
                            Input::Reply {
                                engine: e,
                                leg,
                                from,
                                bytes: spoof,
                                valid: None,
                            },
                        );
                    }
                    if trace {
                        note(format!(
                            "{now:>6} [{step}] try#{si} e{e} {} {:?} {} flags {} -> {fate}",
                            leg.to,
                            leg.via,
                            name_of(nid),
                            key.flags
                        ));
                    }
                }
            }
        }
        let next_input = inputs.peek().map(|(Reverse(ms), ..)| *ms);
        let next_timer = engines
            .iter()
            .filter_map(|e| e.poll_timeout())
            .min()
            .map(|t| t.saturating_duration_since(t0).as_micros().div_ceil(1000) as u64);
        let due = next_timer.map(|t| match timer {
            Some((was, fires)) if was == t => fires,
            _ => {
                let late = if h.late_timers {
                    rng.random_range(0..=MAX_LATE)
                } else {
                    0
                };
                timer = Some((t, t + late));
                t + late
            }
        });
        // Discovery and the hosts file change at their ms, before a timer due then: the model
        // takes them in force from that ms.
        let node_state = inputs.peek().is_some_and(|&(.., k)| {
            matches!(parked[k], Some(Input::Discovery { .. } | Input::Hosts(_)))
        });
        let timer_first = match (due, next_input) {
            (Some(t), Some(i)) => t < i || (t == i && !node_state),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        step += 1;
        h.timer_steps.push(timer_first);
        if step > 100_000 {
            return Err(format!(
                "runaway at {now} ms: timer {due:?}, input {next_input:?}"
            ));
        }
        if timer_first {
            now = due.expect("checked").max(now);
            if now > end {
                return Err(format!("timers still running at {now} ms"));
            }
            for e in engines.iter_mut() {
                e.handle_timeout(at(now));
            }
            continue;
        }
        let (_, _, index) = inputs.pop().expect("checked");
        now = next_input.expect("checked");
        match parked[index].take().expect("each input once") {
            Input::Query(i) => {
                let c = &mut h.clients[i];
                c.step = step;
                if trace {
                    note(format!(
                        "{now:>6} [{step}] q{i} e{} asks {} flags {} (down: {:?})",
                        c.engine,
                        String::from_utf8_lossy(&c.query[13..c.query.len().min(40)]),
                        c.key.flags,
                        UpstreamGroup::BOTH.map(|g| engines[0]
                            .upstreams()
                            .get(g)
                            .down(at(now), settings.query_timeout))
                    ));
                }
                engines[c.engine].handle_query(at(now), c.client, &c.query);
            }
            Input::Reply {
                engine,
                leg,
                from,
                bytes,
                valid,
            } => {
                // A spoof whose made-up ID is that of another try at that server, for the same
                // name, is a lucky guess no check can tell from the answer: not sent.
                let lucky = valid.is_none()
                    && wire::id(&bytes) != leg.id
                    && h.sent.iter().any(|s| {
                        s.leg.to == from
                            && s.leg.id == wire::id(&bytes)
                            && s.at + budget + 1000 > now
                    });
                if lucky {
                    continue;
                }
                if let Some((si, kind, truncated, version, ttl)) = valid {
                    let first = h.sent[si].answered.is_none();
                    h.heard.push(Heard {
                        first,
                        sent: si,
                        at: now,
                        step,
                        kind,
                        truncated,
                        version,
                        ttl,
                    });
                    h.sent[si].answered.get_or_insert(now);
                }
                if trace {
                    note(format!(
                        "{now:>6} [{step}] reply from {from} id {} {}",
                        wire::id(&bytes),
                        match valid {
                            Some(v) => format!("valid for try#{}", v.0),
                            None => "SPOOFED".to_string(),
                        }
                    ));
                }
                engines[engine].handle_reply(at(now), leg.via, from, &bytes);
            }
            Input::Failure {
                engine,
                leg,
                failure,
                sent,
            } => {
                let server = h.sent[sent].server;
                let sent_at = h.sent[sent].at;
                if matches!(leg.via, Via::Udp { .. })
                    && matches!(
                        failure,
                        Failure::Network(std::io::ErrorKind::ConnectionRefused)
                    )
                {
                    end_udp_tries(&mut h, engine, server, now);
                    h.refusals.push(Refusal {
                        server,
                        at: now,
                        step,
                        sent_at: now,
                    });
                } else {
                    h.sent[sent].ended.get_or_insert(now);
                    h.refusals.push(Refusal {
                        server,
                        at: now,
                        step,
                        sent_at,
                    });
                }
                if trace {
                    note(format!("{now:>6} [{step}] try#{sent} {failure:?}"));
                }
                engines[engine].handle_failure(at(now), leg, failure);
            }
            Input::Unreachable { engine, server } => {
                end_udp_tries(&mut h, engine, server, now);
                h.refusals.push(Refusal {
                    server,
                    at: now,
                    step,
                    sent_at: now,
                });
                if trace {
                    note(format!(
                        "{now:>6} [{step}] ICMP unreachable from {}",
                        h.servers[server].addr
                    ));
                }
                engines[engine].handle_unreachable(at(now), h.servers[server].addr);
            }
            Input::Discovery { group, set } => {
                let old = engines[0].upstreams().clone();
                let addrs = set.iter().map(|i| h.servers[*i].addr).collect();
                // As the daemon's discovery makes it: a new set, born now.
                let fresh = Arc::new(UpstreamSet::new(addrs, at(now)));
                let sets = Arc::new(if group == UpstreamGroup::VnetDns as usize {
                    UpstreamSets {
                        vnet_dns: fresh,
                        kube_dns: old.kube_dns.clone(),
                        hosts: old.hosts.clone(),
                    }
                } else {
                    UpstreamSets {
                        vnet_dns: old.vnet_dns.clone(),
                        kube_dns: fresh,
                        hosts: old.hosts.clone(),
                    }
                });
                if trace {
                    note(format!(
                        "{now:>6} [{step}] discovery: group {group} is now {set:?}"
                    ));
                }
                for e in engines.iter_mut() {
                    e.set_upstreams(sets.clone());
                }
            }
            Input::Hosts(v) => {
                let old = engines[0].upstreams().clone();
                let text = hosts_text(&h.hosts[v].1);
                if trace {
                    note(format!("{now:>6} [{step}] hosts file:\n{text}"));
                }
                let sets = Arc::new(UpstreamSets {
                    vnet_dns: old.vnet_dns.clone(),
                    kube_dns: old.kube_dns.clone(),
                    hosts: Arc::new(Hosts::parse(text.as_bytes())),
                });
                for e in engines.iter_mut() {
                    e.set_upstreams(sets.clone());
                }
            }
        }
    }
    judge(&h)
}

fn note(line: String) {
    eprintln!("{line}");
}

/// An ICMP error for `server` ends every UDP try of that engine still out there, and every one
/// judged lost whose late reply would still have been taken.
fn end_udp_tries(h: &mut History, engine: usize, server: usize, now: u64) {
    for s in h.sent.iter_mut() {
        if s.engine == engine
            && s.server == server
            && matches!(s.leg.via, Via::Udp { .. })
            && s.answered.is_none()
            && s.at + h.budget >= now
        {
            s.ended.get_or_insert(now);
        }
    }
}

fn judge(h: &History) -> Result<(), String> {
    let (budget, try_time) = (h.budget, h.try_time);
    let stale_after = Settings::default().stale_after.as_millis() as u64;
    let mut idx = Index {
        sent_by_server: vec![Vec::new(); h.servers.len()],
        heard_by_server: vec![Vec::new(); h.servers.len()],
    };
    for (i, s) in h.sent.iter().enumerate() {
        idx.sent_by_server[s.server].push(i);
    }
    for (i, r) in h.heard.iter().enumerate() {
        idx.heard_by_server[h.sent[r.sent].server].push(i);
    }
    // The sends of each listener and key, in order: the checks below look them up often.
    let mut by_key: std::collections::HashMap<(usize, MKey), Vec<usize>> = Default::default();
    for (i, s) in h.sent.iter().enumerate() {
        by_key.entry((s.engine, s.key)).or_default().push(i);
    }
    let sends_of = |c: &Client0| {
        by_key
            .get(&(c.engine, c.key))
            .map_or(&[][..], |v| v.as_slice())
    };
    // Did this client's query start one of its own (a try went out as it was asked)?
    let first_askers: Vec<bool> = h
        .clients
        .iter()
        .map(|c| sends_of(c).iter().any(|&k| h.sent[k].step == c.step))
        .collect();
    let cap = h.max_inflight;
    let default_cap = cap == Settings::default().max_inflight;
    let udp = h.transport == Transport::Udp;
    // Each client: (ms, step) of its one reply.
    let mut answered = Vec::with_capacity(h.clients.len());
    for (i, c) in h.clients.iter().enumerate() {
        let what = What(i, c.key.nid, c.at);
        let [(t, st, _)] = c.got.as_slice() else {
            return Err(format!("{what}: {} replies", c.got.len()));
        };
        if *t > c.at + budget + MAX_LATE {
            return Err(format!("{what}: answered at {t} ms, past the budget"));
        }
        answered.push((*t, *st));
    }
    let waiting_at = |c: &Client0, step: usize, i: usize| c.step <= step && answered[i].1 > step;

    // Queries in flight never over the caps: every client waiting (one query per key with the
    // cache on, per client without) is a query in flight.
    for c in h.clients.iter().filter(|_| !default_cap) {
        let e = c.engine;
        let mut per_group = [0usize; 2];
        let mut keys: Vec<MKey> = Vec::new();
        for (j, d) in h.clients.iter().enumerate() {
            if d.engine == e && waiting_at(d, c.step, j) && !(h.cache && keys.contains(&d.key)) {
                keys.push(d.key);
                per_group[d.key.group] += 1;
            }
        }
        if per_group[c.key.group] > cap - cap / 4 || per_group.iter().sum::<usize>() > cap {
            return Err(format!(
                "{} ms: {per_group:?} queries in flight on one listener, over the cap {cap}",
                c.at
            ));
        }
    }

    for (i, c) in h.clients.iter().enumerate() {
        let what = What(i, c.key.nid, c.at);
        let (t, st) = answered[i];
        let reply = &c.got[0].2;
        let at_once = st == c.step;
        let q = wire::parse_query(&c.query).expect("ours");
        let qlen = q.question_end;
        // The fields a client checks.
        if reply.len() < qlen || reply[..2] != c.query[..2] {
            return Err(format!("{what}: not its ID"));
        }
        if reply[2] & 0x80 == 0 || reply[2] & 0x78 != 0 {
            return Err(format!("{what}: QR or opcode wrong"));
        }
        if reply[2] & 1 != c.query[2] & 1 || reply[3] & 0x10 != c.query[3] & 0x10 {
            return Err(format!("{what}: RD or CD not its own"));
        }
        if reply[4..6] != [0, 1] || reply[12..qlen] != c.query[12..qlen] {
            return Err(format!("{what}: not its question as asked"));
        }
        let (opt, dnssec_ok) = opt_of(reply);
        if opt != q.edns || dnssec_ok != q.dnssec_ok {
            return Err(format!(
                "{what}: OPT {opt} DO {dnssec_ok}, asked {} {}",
                q.edns, q.dnssec_ok
            ));
        }
        if let Some(rdata) = h.hosts_answer(c) {
            // From the hosts file: at once, authoritative, its records with TTL 5, nothing sent.
            let records = wire::records(reply).unwrap_or_default();
            let got: Vec<&[u8]> = records
                .iter()
                .filter(|r| r.section == wire::Section::Answer)
                .filter(|r| r.rtype == q.qtype && r.ttl == route::HOSTS_TTL)
                .map(|r| &reply[r.ttl_offset + 6..])
                .collect();
            let fits =
                got.len() == rdata.len() && got.iter().zip(&rdata).all(|(g, w)| g.starts_with(w));
            let [_, an, ns, _] = wire::counts(reply);
            if !at_once || first_askers[i] || reply[2] & 0x06 != 0x04 || wire::rcode(reply) != 0 {
                return Err(format!(
                    "{what}: not the hosts file's answer at once: {reply:02x?}"
                ));
            }
            if !fits || usize::from(an) != rdata.len() || ns != 0 {
                return Err(format!(
                    "{what}: the hosts file says {rdata:?}: {reply:02x?}"
                ));
            }
            continue;
        }
        let truncated = wire::is_truncated(reply);
        let code = wire::rcode(reply);
        let m = mark(reply);
        let g = c.key.group;
        let same_name = |s: &Sent| s.key.group == g && s.key.nid == c.key.nid;
        // Sends for this client's own query: the same listener and key, from when it asked.
        let own =
            |s: &Sent| s.engine == c.engine && s.key == c.key && s.step >= c.step && s.step <= st;
        let first_asker = first_askers[i];
        let tries = sends_of(c).iter().filter(|&&k| own(&h.sent[k])).count();
        let stable = h.set_stable(g, c.at.saturating_sub(4_000), c.at + budget);
        let reached: Vec<&Heard> = h
            .heard
            .iter()
            .filter(|r| r.taken(h) && r.step < st && own(&h.sent[r.sent]))
            .collect();
        let alone = h.cache
            || !h.clients.iter().enumerate().any(|(j, d)| {
                j != i
                    && d.engine == c.engine
                    && d.key == c.key
                    && d.step <= st
                    && answered[j].1 >= c.step
            });
        let mut answer_grade = false;
        match m {
            Mark::Answer {
                group,
                version,
                nid,
                ttl,
            }
            | Mark::Negative {
                group,
                version,
                nid,
                ttl,
            } => {
                let negative = matches!(m, Mark::Negative { .. });
                if usize::from(group) != g || usize::from(nid) != c.key.nid {
                    return Err(format!("{what}: the records of group {group} name n{nid}"));
                }
                if code
                    != if negative && code == rcode::NXDOMAIN {
                        rcode::NXDOMAIN
                    } else {
                        rcode::NOERROR
                    }
                    || truncated
                {
                    return Err(format!("{what}: RCODE {code} TC {truncated} with {m:?}"));
                }
                let (record_ttl, minimum) = h.ttls[g][c.key.nid];
                let keep = if negative {
                    record_ttl.min(minimum)
                } else {
                    record_ttl
                };
                let fresh_for = (u64::from(keep) * 1000).max(MIN_TTL_MS);
                let mut stale = false;
                let fits = h.heard.iter().any(|r| {
                    let s = &h.sent[r.sent];
                    let kind_fits = match r.kind {
                        Kind::Answer => !negative,
                        Kind::NxDomain => negative && code == rcode::NXDOMAIN,
                        Kind::NoData => negative && code == rcode::NOERROR,
                        _ => false,
                    };
                    if !kind_fits
                        || r.truncated
                        || r.version != version
                        || !same_name(s)
                        || r.step > st
                    {
                        return false;
                    }
                    let age = t - r.at;
                    let counted = if r.ttl == 0 {
                        0
                    } else {
                        r.ttl.saturating_sub((age / 1000) as u32).max(1)
                    };
                    if age < fresh_for && ttl == counted {
                        return true;
                    }
                    if ttl == crate::cache::STALE_TTL && age <= fresh_for + MAX_STALE_MS && h.cache
                    {
                        stale = true;
                        return true;
                    }
                    false
                });
                if !fits {
                    return Err(format!(
                        "{what}: {m:?} at {t} ms matches no upstream answer (fresh for {fresh_for} ms, stale {MAX_STALE_MS} ms more)"
                    ));
                }
                answer_grade = true;
                // A stale answer while the query's own try brought a fresh one.
                if stale && !at_once && alone {
                    if let Some(r) = reached.iter().find(|r| r.kind.answers() && !r.truncated) {
                        return Err(format!(
                            "{what}: stale at {t} ms, though an answer reached its query at {} ms",
                            r.at
                        ));
                    }
                }
            }
            Mark::Error { group, nid } => {
                let kind = match code {
                    rcode::SERVFAIL => Kind::ServFail,
                    rcode::REFUSED => Kind::Refused,
                    _ => return Err(format!("{what}: an error record with RCODE {code}")),
                };
                if usize::from(group) != g || usize::from(nid) != c.key.nid {
                    return Err(format!("{what}: the error of group {group} name n{nid}"));
                }
                if !h.heard.iter().any(|r| {
                    r.kind == kind && !r.truncated && r.step <= st && same_name(&h.sent[r.sent])
                }) {
                    return Err(format!("{what}: RCODE {code} no upstream gave"));
                }
                // An error leaves time to ask another server: it must be asked.
                let asked_all = h
                    .set_at(g, c.at)
                    .iter()
                    .all(|&sv| h.sent.iter().any(|s| own(s) && s.server == sv));
                if first_asker
                    && !asked_all
                    && tries < MAX_TRIES
                    && t + MAX_LATE + 10 < c.at + budget
                    && h.set_stable(g, c.at, t)
                {
                    return Err(format!(
                        "{what}: an upstream's error passed on at {t} ms, another server never asked ({tries} tries)"
                    ));
                }
            }
            Mark::Bare if truncated => {
                // An upstream's truncated answer, passed on only with no try or time left.
                if !udp
                    || !h
                        .heard
                        .iter()
                        .any(|r| r.truncated && r.step <= st && same_name(&h.sent[r.sent]))
                {
                    return Err(format!("{what}: TC no upstream gave"));
                }
                if first_asker && tries < MAX_TRIES && t < c.at + budget {
                    return Err(format!(
                        "{what}: a truncated answer passed on at {t} ms, not fetched over TCP"
                    ));
                }
                // Nor while its own fetch over TCP may still bring the whole answer.
                let fetching = sends_of(c).iter().map(|&k| &h.sent[k]).find(|s| {
                    own(s)
                        && s.leg.via == Via::Tcp
                        && s.step < st
                        && t < s.at + try_time
                        && s.answered.is_none_or(|r| r > t)
                        && s.ended.is_none_or(|e| e > t)
                });
                if let Some(f) = fetching.filter(|_| alone) {
                    return Err(format!(
                        "{what}: a truncated answer passed on at {t} ms, its fetch over TCP (at {} ms) still out",
                        f.at
                    ));
                }
            }
            Mark::Bare if code == rcode::REFUSED => {
                // Shed: only over a cap. Queries in flight are at most: the keys waiting, and
                // those with a try possibly still out (a refresh nobody waits on).
                let mut per_group = [0usize; 2];
                let mut keys: Vec<MKey> = Vec::new();
                for (j, d) in h.clients.iter().enumerate() {
                    if j != i
                        && d.engine == c.engine
                        && waiting_at(d, c.step, j)
                        && !(h.cache && keys.contains(&d.key))
                    {
                        keys.push(d.key);
                        per_group[d.key.group] += 1;
                    }
                }
                for s in &h.sent {
                    let out = s.step < c.step
                        && s.at + try_time + MAX_LATE >= c.at
                        && s.answered.is_none_or(|r| r >= c.at)
                        && s.ended.is_none_or(|r| r >= c.at);
                    if s.engine == c.engine && out && !(h.cache && keys.contains(&s.key)) {
                        if h.cache {
                            keys.push(s.key);
                        }
                        per_group[s.key.group] += 1;
                    }
                }
                if !at_once
                    || (per_group[g] < cap - cap / 4 && per_group.iter().sum::<usize>() < cap)
                {
                    return Err(format!(
                        "{what}: REFUSED with at most {per_group:?} in flight, cap {cap}"
                    ));
                }
            }
            Mark::Bare if code == rcode::SERVFAIL => {
                if at_once {
                    let name_failed = name_failed_lately(h, c);
                    let down = h
                        .set_at(g, c.at)
                        .iter()
                        .all(|&sv| silent(h, &idx, sv, c.at, c.step, false));
                    if !name_failed && !down && !h.set_at(g, c.at).is_empty() {
                        return Err(format!(
                            "{what}: SERVFAIL at once with a server not shown silent"
                        ));
                    }
                } else if alone {
                    if let Some(r) = reached.iter().find(|r| !r.truncated) {
                        return Err(format!(
                            "{what}: SERVFAIL made here at {t} ms, though an upstream's reply (try#{}) reached its query at {} ms",
                            r.sent, r.at
                        ));
                    }
                }
            }
            _ => return Err(format!("{what}: RCODE {code}, {m:?}")),
        }

        // Liveness. A clean server that answers the name in time: the client gets an answer.
        if default_cap && stable {
            let set = h.set_at(g, c.at);
            let from = c.at.saturating_sub(4_000);
            let fast = try_time - 2 * MAX_LATE - 10;
            let clean = set.iter().find(|&&x| {
                let s = &h.servers[x];
                s.names[c.key.nid].kind.answers() && s.clean(from, c.at + budget, fast, udp)
            });
            if let Some(&x) = clean {
                let tries_of = |b: &Behaviour| if b.truncates && udp { 2 } else { 1 };
                let others = set
                    .iter()
                    .filter(|&&y| y != x)
                    .map(|&y| &h.servers[y].names[c.key.nid]);
                let x_b = &h.servers[x].names[c.key.nid];
                // A hedge may take a try, and a hedge or a retry may go to a server tried
                // already (one that just refused): a try to spare for each.
                let tries_needed: usize =
                    others.clone().map(tries_of).sum::<usize>() + tries_of(x_b) + 2;
                let time_needed: u64 = others.map(|b| try_time * tries_of(b) as u64).sum::<u64>()
                    + cost(x_b, udp)
                    + (set.len() as u64 + 1) * MAX_LATE
                    + 20;
                if tries_needed <= MAX_TRIES && time_needed < budget && !answer_grade {
                    return Err(format!(
                        "{what}: {m:?} RCODE {code} at {t} ms, though {} answers it in {} ms",
                        h.servers[x].addr, x_b.delay
                    ));
                }
            }
        }
        // A group down on the evidence is answered at once.
        if default_cap && h.set_stable(g, c.at.saturating_sub(4_000), c.at) {
            let set = h.set_at(g, c.at);
            if !set.is_empty()
                && set
                    .iter()
                    .all(|&sv| silent(h, &idx, sv, c.at, c.step, true))
                && !at_once
            {
                return Err(format!(
                    "{what}: its group down on the evidence, answered only at {t} ms"
                ));
            }
        }
        // Through a backend's death with the other healthy: within 100 ms.
        if h.death == Some(g) && (t - c.at > DEATH_BOUND_MS + MAX_LATE || !answer_grade) {
            return Err(format!(
                "{what}: {m:?} after {} ms, one backend dead, the other healthy",
                t - c.at
            ));
        }
    }

    // A full outage under bursts: hedges stay within their budget. Each new query earns a fifth
    // of a hedge, 50 are saved up at most, and a probe's hedge is free (a probe per server per
    // 500 ms). A hedge is a send when a timer fires while another try for the key is out, and
    // not a move on after a whole try budget.
    if let Some(died) = h.outage {
        let window = died..died + 2_000;
        let g = h
            .sent
            .iter()
            .find(|s| h.servers[s.server].dies == Some(died))
            .map_or(0, |s| s.key.group);
        let probes = 2 * (window.end - window.start) as usize / 500 + 2;
        for e in 0..h.roles.len() {
            let started = h
                .clients
                .iter()
                .filter(|c| c.engine == e && window.contains(&c.at))
                .count();
            let out_at = |p: &Sent, t: u64| {
                p.answered.is_none_or(|r| r > t) && p.ended.is_none_or(|x| x > t)
            };
            let hedges = h
                .sent
                .iter()
                .filter(|s| {
                    s.engine == e
                        && s.key.group == g
                        && window.contains(&s.at)
                        && h.timer_steps[s.step - 1]
                })
                .filter(|s| {
                    let same = by_key[&(e, s.key)]
                        .iter()
                        .map(|&k| &h.sent[k])
                        .filter(|p| p.step < s.step && out_at(p, s.at));
                    let another_out = same.clone().any(|p| s.at < p.at + try_time);
                    let timed_out = same
                        .clone()
                        .any(|p| (p.at + try_time..=p.at + try_time + MAX_LATE).contains(&s.at));
                    another_out && !timed_out
                })
                .count();
            if hedges > 50 + started / 5 + probes {
                return Err(format!(
                    "an outage from {died} ms: {hedges} hedges for {started} new queries on listener {e}"
                ));
            }
        }
    }

    // A fresh cached answer is served at once.
    if h.cache {
        for (j, d) in h.clients.iter().enumerate() {
            let (t1, _) = answered[j];
            let (ttl, kept, negative) = match mark(&d.got[0].2) {
                Mark::Answer { ttl, .. } => (ttl, h.ttls[d.key.group][d.key.nid].0, false),
                Mark::Negative { ttl, .. } => {
                    let (t, m) = h.ttls[d.key.group][d.key.nid];
                    (ttl, t.min(m), true)
                }
                _ => continue,
            };
            // Another server's answer of the other kind may have replaced it, kept for less.
            let replaced = h.heard.iter().any(|r| {
                let k = h.sent[r.sent].key;
                k.group == d.key.group
                    && k.nid == d.key.nid
                    && r.kind.answers()
                    && (r.kind == Kind::Answer) == negative
            });
            if replaced {
                continue;
            }
            let original = h.ttls[d.key.group][d.key.nid].0;
            if ttl <= 1 || ttl == crate::cache::STALE_TTL || original == 0 {
                continue;
            }
            // Stored at most this long before it was served: its TTL tells its age.
            let stored = t1.saturating_sub(u64::from(original - ttl + 1) * 1000);
            let fresh_until = stored + (u64::from(kept) * 1000).max(MIN_TTL_MS);
            for (i, c) in h.clients.iter().enumerate() {
                if c.key == d.key
                    && c.step > answered[j].1
                    && c.at + 1 < fresh_until
                    && answered[i].1 != c.step
                {
                    return Err(format!(
                        "q{i} for {} at {} ms: not answered at once, though q{j} got it fresh at {t1} ms (TTL {ttl})",
                        name_of(c.key.nid),
                        c.at
                    ));
                }
                // Expired when asked, still servable when the client-response timer fires: the
                // stale answer comes then at the latest (RFC 8767), if this client started the
                // query.
                let fresh_for = (u64::from(kept) * 1000).max(MIN_TTL_MS);
                let timer = c.at + stale_after + MAX_LATE;
                let first_asker = first_askers[i];
                if c.key == d.key
                    && c.step > answered[j].1
                    && c.at >= t1 + fresh_for
                    && timer < stored + fresh_for + MAX_STALE_MS
                    && first_asker
                    && answered[i].0 > timer
                {
                    return Err(format!(
                        "q{i} for {} at {} ms: answered at {} ms, though q{j}'s answer (at {t1} ms) was there to serve stale",
                        name_of(c.key.nid),
                        c.at,
                        answered[i].0
                    ));
                }
            }
        }
    }
    Ok(())
}

/// RFC 9520's memory: a try for this name went unanswered for its whole time (or the network
/// refused it) lately, and nothing was heard for the name since its query may have ended (the
/// engine remembers a query that got no error reply, though a truncated one may have come).
fn name_failed_lately(h: &History, c: &Client0) -> bool {
    h.sent.iter().any(|s| {
        s.key.group == c.key.group
            && s.key.nid == c.key.nid
            && s.at <= c.at
            && s.at + h.budget + 1000 + MAX_LATE > c.at
            && (s.ended.is_some_and(|e| e <= c.at)
                || (s.at + h.try_time <= c.at + MAX_LATE
                    && s.answered.is_none_or(|r| r >= s.at + h.try_time)))
            // (A reply for the name asked with other flags need not clear it.)
            && !h
                .heard
                .iter()
                .any(|r| r.taken(h) && h.sent[r.sent].key == c.key && r.at > s.at + h.budget + MAX_LATE && r.step < c.step)
    })
}

/// The sends and valid replies of each server.
struct Index {
    sent_by_server: Vec<Vec<usize>>,
    heard_by_server: Vec<Vec<usize>>,
}

/// Is `server` silent on the evidence at `t` (the input at `step`): since its last reply, tries
/// for two names (or one name for a whole budget) left unanswered for their whole time or
/// refused by the network, the latest judged within the last second? `strict`: surely so, with
/// margins for late timers (for what must happen); else possibly so (for what may).
fn silent(h: &History, idx: &Index, server: usize, t: u64, step: usize, strict: bool) -> bool {
    let since = if strict {
        h.replaced_at(h.servers[server].group, t)
    } else {
        0
    };
    let last_reply = idx.heard_by_server[server]
        .iter()
        .map(|&k| &h.heard[k])
        // A reply to a try the network ended (an ICMP error for its server) may still be
        // taken, if its query was freed as the error came: life when life is required.
        .filter(|r| (if strict { r.first } else { r.taken(h) }) && r.step < step)
        .map(|r| r.at)
        .max();
    let after = |sent_at: u64| last_reply.is_none_or(|r| sent_at > r) && sent_at >= since;
    // (sent, judged, name): None for a refusal, which is about the server, not a name.
    let mut evidence: Vec<(u64, u64, Option<usize>)> = Vec::new();
    // The engine dates a server's silence from the latest judgment of any unanswered try, one
    // sent before the last reply too: a fast SERVFAIL within a second of it is allowed, not
    // required.
    let mut latest_any = 0;
    for s in idx.sent_by_server[server].iter().map(|&k| &h.sent[k]) {
        let judged = s.at + h.try_time;
        let unanswered =
            s.answered.is_none_or(|r| r >= judged) && s.ended.is_none_or(|e| e >= judged);
        let in_time = if strict {
            judged + MAX_LATE < t
        } else {
            judged <= t
        };
        if unanswered && in_time {
            latest_any = latest_any.max(judged);
        }
        if unanswered && in_time && after(s.at) {
            evidence.push((s.at, judged, Some(s.key.nid)));
        }
    }
    for r in h
        .refusals
        .iter()
        .filter(|r| r.server == server && r.step < step)
    {
        latest_any = latest_any.max(r.at);
        if after(r.sent_at) {
            evidence.push((r.sent_at, r.at, None));
        }
    }
    let Some(latest) = evidence.iter().map(|e| e.1).max() else {
        return false;
    };
    let names = evidence.iter().map(|e| e.2);
    let two_names = names.clone().any(|n| n.is_none()) || names.clone().min() != names.max();
    let first = evidence.iter().map(|e| e.0).min().expect("some");
    if strict {
        two_names && t - latest + 1 < 1000
    } else {
        (two_names || t + MAX_LATE + 1 >= first + h.budget) && latest_any + 1000 + MAX_LATE > t
    }
}

#[test]
fn seeded_histories_get_the_upstreams_own_answers() {
    let seeds: Vec<u64> = match std::env::var("HISTORY_SEED") {
        Ok(s) => vec![s.parse().expect("HISTORY_SEED is a number")],
        Err(_) => {
            let n = std::env::var("HISTORIES").map_or(HISTORIES, |n| n.parse().expect("a number"));
            (0..n).collect()
        }
    };
    let started = std::time::Instant::now();
    // Histories are independent: one thread per core.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    // `HISTORY_FIRST`: stop at the first failure (for planting bugs one after another).
    let first_only = std::env::var("HISTORY_FIRST").is_ok();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let failed: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let (seeds, stop) = (&seeds, &stop);
                scope.spawn(move || {
                    seeds
                        .iter()
                        .skip(k)
                        .step_by(threads)
                        .take_while(|_| !stop.load(std::sync::atomic::Ordering::Relaxed))
                        .filter_map(|&seed| {
                            run_history(seed).err().map(|e| {
                                stop.store(first_only, std::sync::atomic::Ordering::Relaxed);
                                format!("seed {seed}: {e} (replay: HISTORY_SEED={seed})")
                            })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("no panic"))
            .collect()
    });
    let took = started.elapsed();
    eprintln!(
        "{} histories in {:.1} s ({:.0} per second, {threads} threads)",
        seeds.len(),
        took.as_secs_f64(),
        seeds.len() as f64 / took.as_secs_f64()
    );
    let mut failed = failed;
    failed.sort_by_key(|f| {
        f.split(':')
            .next()
            .and_then(|s| s.trim_start_matches("seed ").parse::<u64>().ok())
    });
    assert!(
        failed.is_empty(),
        "{} of {} histories failed; first ones:\n{}",
        failed.len(),
        seeds.len(),
        failed[..failed.len().min(8)].join("\n")
    );
}
