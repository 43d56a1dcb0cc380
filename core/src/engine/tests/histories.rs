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

mod judge;
mod run;

use judge::judge;
use run::run_history;

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
