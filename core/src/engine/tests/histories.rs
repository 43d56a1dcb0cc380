//! Seeded random histories of upstream behaviour, run through the engine on its fake clock and
//! checked against the upstreams' own answers.
//!
//! Each history draws one or two servers for a group, and for each name and server an answer
//! (NOERROR, SERVFAIL or REFUSED) and a delay (mostly milliseconds, sometimes up to 1.5 s), plus
//! random packet loss and whole seconds of silence; then client queries with quiet gaps of up to
//! 3 s. The property, after every history:
//! - every query gets exactly one reply, within the query budget;
//! - a NOERROR reply carries the upstream's records (fresh or from the cache);
//! - an error RCODE is one an upstream gave for that name, passed on;
//! - a SERVFAIL made here goes only to a query whose own tries all went unanswered, or, answered
//!   at once, to a name whose tries all went unanswered lately, or while every server of the
//!   group is silent on the evidence: since its last reply, tries for two names (or for one name
//!   over a whole query budget) left unanswered for their whole second, the latest judged within
//!   the last second.
//!
//! A failure names its seed; `HISTORY_SEED=<seed>` replays that history alone, and `HISTORIES=<n>`
//! runs more of them.

use std::collections::BinaryHeap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

const NAMES: usize = 5;
/// An error reply from a model upstream carries one authority record, so the check can tell
/// the upstream's SERVFAIL from one the engine made.
const ERROR_MARK: u16 = 1;

#[derive(Clone, Copy)]
struct Behaviour {
    rcode: u8,
    delay_ms: u64,
}

struct Server {
    addr: SocketAddr,
    /// Intervals (ms) during which it drops everything sent to it.
    silent: Vec<(u64, u64)>,
    /// Per-packet loss, in percent.
    loss: u32,
    names: [Behaviour; NAMES],
}

enum Input {
    Query(usize),
    Reply {
        leg: Leg,
        bytes: Vec<u8>,
        name: usize,
    },
}

struct Asked {
    name: usize,
    at: u64,
    client: Client,
    /// What the clients got: (ms, bytes).
    got: Vec<(u64, Vec<u8>)>,
    /// An upstream reply reached the engine while this query was among the askers of the query
    /// it went to: (RCODE).
    reply_reached: Option<u8>,
    /// Which input it was, in the order the engine took them.
    step: usize,
}

/// A try as the network saw it.
struct Sent {
    to: SocketAddr,
    name: usize,
    at: u64,
    /// When its reply reached the engine; `None` when the network dropped it.
    answered: Option<u64>,
}

fn name(k: usize) -> String {
    format!("n{k}.example.net")
}

fn draw_server(rng: &mut StdRng, last: u8) -> Server {
    let mut silent = Vec::new();
    if rng.random_bool(0.4) {
        let mut from = rng.random_range(0..20_000);
        for _ in 0..rng.random_range(1..=2) {
            let len = rng.random_range(500..8_000);
            silent.push((from, from + len));
            from += len + rng.random_range(500..10_000);
        }
    }
    let loss = [0, 0, 5, 20][rng.random_range(0..4)];
    let names = std::array::from_fn(|_| {
        let rcode = match rng.random_range(0..10) {
            0 => rcode::SERVFAIL,
            1 => rcode::REFUSED,
            _ => rcode::NOERROR,
        };
        let delay_ms = match rng.random_range(0..10) {
            0..7 => rng.random_range(1..20),
            7..9 => rng.random_range(20..300),
            _ => rng.random_range(300..=1500),
        };
        Behaviour { rcode, delay_ms }
    });
    Server {
        addr: up(last),
        silent,
        loss,
        names,
    }
}

/// The upstream's reply to `sent` (the engine's bytes, with the try's ID).
fn model_reply(sent: &[u8], k: usize, b: Behaviour, ttl: u32) -> Vec<u8> {
    let q = wire::parse_query(sent).expect("the engine sends well-formed queries");
    let mut r = sent[..q.question_end].to_vec();
    r[2] = 0x81;
    r[3] = 0x80 | b.rcode;
    r[6..12].copy_from_slice(&[0, 0, 0, 0, 0, 0]);
    if b.rcode == rcode::NOERROR {
        r[7] = 1;
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        r.extend_from_slice(&ttl.to_be_bytes());
        r.extend_from_slice(&[0, 4, 10, 0, 0, k as u8]);
    } else {
        r[9] = ERROR_MARK as u8;
        r.extend_from_slice(&[0xc0, 12, 0, 16, 0, 1, 0, 0, 0, 0, 0, 3, 2, b'u', b'p']);
    }
    r
}

/// The address in a NOERROR reply's first answer record.
fn address(reply: &[u8]) -> Option<[u8; 4]> {
    let records = wire::records(reply)?;
    let a = records
        .iter()
        .find(|r| r.section == wire::Section::Answer && r.rtype == 1)?;
    reply
        .get(a.ttl_offset + 6..a.ttl_offset + 10)?
        .try_into()
        .ok()
}

fn run_history(seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let nservers = rng.random_range(1..=2);
    let servers: Vec<Server> = (1..=nservers).map(|i| draw_server(&mut rng, i)).collect();
    let ttls: [u32; NAMES] = std::array::from_fn(|_| rng.random_range(0..=3));
    let transport = if rng.random_bool(0.7) {
        Transport::Udp
    } else {
        Transport::Tcp
    };
    let role = if rng.random_bool(0.5) {
        ListenerRole::Node
    } else {
        ListenerRole::Cluster
    };
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
    let (vnet, kube) = match role {
        ListenerRole::Node => (addrs.clone(), vec![up(99)]),
        ListenerRole::Cluster => (vec![up(99)], addrs.clone()),
    };
    let setup = Setup::new(role, vnet, kube);
    let budget = setup.settings.query_timeout.as_millis() as u64;
    let try_time = setup.settings.upstream_timeout.as_millis() as u64;
    let mut rig = setup.start(Instant::now());

    let mut asked = Vec::new();
    let mut at = 0;
    for i in 0..rng.random_range(20..80) {
        at += match rng.random_range(0..10) {
            0..5 => rng.random_range(0..20),
            5..8 => rng.random_range(20..1000),
            _ => rng.random_range(1000..=3000),
        };
        let client = match transport {
            Transport::Udp => Client::Udp(SocketAddr::from(([10, 1, 0, 1], 10_000 + i as u16))),
            Transport::Tcp => Client::Tcp(i as u64),
        };
        asked.push(Asked {
            name: rng.random_range(0..NAMES),
            at,
            client,
            got: Vec::new(),
            reply_reached: None,
            step: 0,
        });
    }
    let end = at + 10_000;
    // (Reverse(ms), Reverse(sequence)) orders inputs by time, then by arrival.
    let mut inputs: BinaryHeap<(Reverse<u64>, Reverse<u64>, usize)> = BinaryHeap::new();
    let mut parked: Vec<Option<Input>> = Vec::new();
    let mut seq = 0;
    let mut push = |inputs: &mut BinaryHeap<_>, parked: &mut Vec<Option<Input>>, ms, input| {
        parked.push(Some(input));
        seq += 1;
        inputs.push((Reverse(ms), Reverse(seq), parked.len() - 1));
    };
    for (i, a) in asked.iter().enumerate() {
        push(&mut inputs, &mut parked, a.at, Input::Query(i));
    }
    let mut sent: Vec<Sent> = Vec::new();
    // (server, ms, name, input number): replies in the order the engine took them.
    let mut heard: Vec<(SocketAddr, u64, usize, usize)> = Vec::new();
    let mut step = 0;
    let mut now = 0;
    loop {
        // Whatever the engine sent since the last input goes out on the model network.
        for (dest, bytes) in std::mem::take(&mut rig.sent) {
            match dest {
                Dest::Client(c) => {
                    let i = asked
                        .iter()
                        .position(|a| a.client == c)
                        .expect("a known client");
                    asked[i].got.push((now, bytes));
                }
                Dest::Upstream(leg) => {
                    let s = servers
                        .iter()
                        .find(|s| s.addr == leg.to)
                        .ok_or(format!("a try to {} outside the group", leg.to))?;
                    let q = wire::parse_query(&bytes).map_err(|e| format!("{e:?}"))?;
                    let qname = String::from_utf8_lossy(&bytes[12..q.name_end]).to_string();
                    let k = (0..NAMES)
                        .find(|k| wire::encode_name(&name(*k)).unwrap() == bytes[12..q.name_end])
                        .ok_or(format!("unknown name {qname}"))?;
                    let dropped = s.silent.iter().any(|(a, b)| (*a..*b).contains(&now))
                        || rng.random_range(0..100) < s.loss;
                    let b = s.names[k];
                    sent.push(Sent {
                        to: leg.to,
                        name: k,
                        at: now,
                        answered: (!dropped).then_some(now + b.delay_ms),
                    });
                    if !dropped {
                        let reply = model_reply(&bytes, k, b, ttls[k]);
                        push(
                            &mut inputs,
                            &mut parked,
                            now + b.delay_ms,
                            Input::Reply {
                                leg,
                                bytes: reply,
                                name: k,
                            },
                        );
                    }
                }
            }
        }
        rig.events.clear();
        let next_input = inputs.peek().map(|(Reverse(ms), ..)| *ms);
        let next_timer = rig.engine.poll_timeout().map(|t| {
            t.saturating_duration_since(rig.at(0))
                .as_micros()
                .div_ceil(1000) as u64
        });
        let timer_first = match (next_timer, next_input) {
            (Some(t), Some(i)) => t <= i,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        if timer_first {
            now = next_timer.expect("checked").max(now);
            if now > end {
                return Err(format!("timers still running at {now} ms"));
            }
            rig.handle_timeout(rig.at(now));
            continue;
        }
        let (_, _, index) = inputs.pop().expect("checked");
        now = next_input.expect("checked");
        step += 1;
        match parked[index].take().expect("each input once") {
            Input::Query(i) => {
                let packet = query(i as u16, &name(asked[i].name), None);
                asked[i].step = step;
                rig.handle_query(rig.at(now), asked[i].client, &packet);
            }
            Input::Reply { leg, bytes, name } => {
                heard.push((leg.to, now, name, step));
                // Which clients wait on the query this try belongs to, if it is still awaited.
                if let Some(&(slot, generation)) = rig.engine.keys.get(&TryKey::of(&leg)) {
                    if let Some(p) = rig.engine.slots[slot as usize].holds(generation) {
                        for (client, ..) in p.askers() {
                            if let Some(a) = asked.iter_mut().find(|a| a.client == client) {
                                a.reply_reached.get_or_insert(wire::rcode(&bytes));
                            }
                        }
                    }
                }
                rig.handle_reply(rig.at(now), leg.via, leg.to, &bytes);
            }
        }
    }

    if std::env::var("HISTORY_TRACE").is_ok() {
        for s in &sent {
            eprintln!(
                "{:>6} try {} n{} answered {:?}",
                s.at, s.to, s.name, s.answered
            );
        }
        for (from, h, k, _) in &heard {
            eprintln!("{h:>6} reply from {from} n{k}");
        }
        for (i, a) in asked.iter().enumerate() {
            for (t, r) in &a.got {
                eprintln!(
                    "{:>6} q{i} n{} asked {} -> rcode {} ns {}",
                    t,
                    a.name,
                    a.at,
                    wire::rcode(r),
                    wire::counts(r)[2]
                );
            }
        }
    }
    // The evidence of silence: since its last reply, tries for two names (or for one name over a
    // whole budget) left unanswered for their whole time (dropped, or answered later than that),
    // the latest judged within 1 s.
    let silent_at = |server: SocketAddr, t: u64, before: usize| {
        let last_reply = heard
            .iter()
            .filter(|(from, _, _, step)| *from == server && *step < before)
            .map(|(_, h, _, _)| *h)
            .max();
        let unanswered: Vec<&Sent> = sent
            .iter()
            .filter(|s| {
                s.to == server
                    && last_reply.is_none_or(|r| s.at > r)
                    && s.at + try_time <= t
                    && s.answered.is_none_or(|r| r >= s.at + try_time)
            })
            .collect();
        let names = unanswered.iter().map(|s| s.name);
        let latest = unanswered.iter().map(|s| s.at + try_time).max();
        let first = unanswered.iter().map(|s| s.at).min();
        (names.clone().min() != names.max() || first.is_some_and(|f| t - f >= budget))
            && latest.is_some_and(|j| j + 1000 > t)
    };
    for (i, a) in asked.iter().enumerate() {
        let what = format!("query {i} for {} at {} ms", name(a.name), a.at);
        let [(t, reply)] = a.got.as_slice() else {
            return Err(format!("{what}: {} replies", a.got.len()));
        };
        if *t > a.at + budget {
            return Err(format!("{what}: answered at {t} ms, past the budget"));
        }
        let code = wire::rcode(reply);
        let marked = wire::counts(reply)[2] == ERROR_MARK;
        match code {
            rcode::NOERROR => {
                if address(reply) != Some([10, 0, 0, a.name as u8]) {
                    return Err(format!("{what}: NOERROR without the upstream's record"));
                }
            }
            _ if marked => {
                if !servers.iter().any(|s| s.names[a.name].rcode == code) {
                    return Err(format!("{what}: RCODE {code} no upstream gave"));
                }
            }
            rcode::SERVFAIL => {
                if let Some(got) = a.reply_reached {
                    return Err(format!(
                        "{what}: SERVFAIL made here at {t} ms, though an upstream's reply \
                         (RCODE {got}) reached its query"
                    ));
                }
                let at_once = *t == a.at;
                // RFC 9520's resolution-failure cache: a try for this name went unanswered for
                // its whole time lately (its query ended within the last second at most a
                // budget later), and nothing was heard for the name since.
                let name_failed = sent.iter().any(|s| {
                    s.name == a.name
                        && s.at + try_time <= a.at
                        && s.at + budget + 1000 > a.at
                        && s.answered.is_none_or(|r| r >= s.at + try_time)
                        && !heard
                            .iter()
                            .any(|(_, h, k, step)| *k == a.name && *h >= s.at && *step < a.step)
                });
                let down = servers.iter().all(|s| silent_at(s.addr, a.at, a.step));
                if at_once && !name_failed && !down {
                    return Err(format!(
                        "{what}: SERVFAIL at once with a server not shown silent"
                    ));
                }
            }
            _ => return Err(format!("{what}: unexpected RCODE {code}")),
        }
    }
    Ok(())
}

#[test]
fn seeded_histories_get_the_upstreams_own_answers() {
    let seeds: Vec<u64> = match std::env::var("HISTORY_SEED") {
        Ok(s) => vec![s.parse().expect("HISTORY_SEED is a number")],
        Err(_) => {
            let n = std::env::var("HISTORIES").map_or(2000, |n| n.parse().expect("a number"));
            (0..n).collect()
        }
    };
    let failed: Vec<String> = seeds
        .iter()
        .filter_map(|&seed| {
            run_history(seed)
                .err()
                .map(|e| format!("seed {seed}: {e} (replay: HISTORY_SEED={seed})"))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} histories failed; first: {}",
        failed.len(),
        seeds.len(),
        failed.first().map_or("", |s| s.as_str())
    );
}
