//! The engine driven with plain bytes and instants. Every behaviour is checked for a UDP client
//! and for a TCP client, since one engine decides for both.

use super::*;
use super::{HEDGE_BURST, HEDGE_COST};
use crate::cache::Limits;
use crate::stats::ListenerStats;
use std::io;
use std::time::Duration;

const UDP_CLIENT: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::new(10, 1, 1, 1),
    40000,
));
const TCP_CLIENT: ConnId = 7;

const BOTH: [Transport; 2] = [Transport::Udp, Transport::Tcp];

fn up(last: u8) -> SocketAddr {
    SocketAddr::from(([198, 18, 0, last], 53))
}

fn query(id: u16, name: &str, edns: Option<u16>) -> Vec<u8> {
    let mut p = id.to_be_bytes().to_vec();
    p.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, u8::from(edns.is_some())]);
    p.extend_from_slice(&wire::encode_name(name).unwrap());
    // keep the caller's case: encode_name lowercases, so patch the letters back
    let mut at = 12;
    for label in name.split('.') {
        p[at + 1..at + 1 + label.len()].copy_from_slice(label.as_bytes());
        at += 1 + label.len();
    }
    p.extend_from_slice(&[0, 1, 0, 1]);
    if let Some(size) = edns {
        p.extend_from_slice(&[0, 0, 41]);
        p.extend_from_slice(&size.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    }
    p
}

/// An upstream's reply to `sent`: QR set, an RR of `extra` bytes of padding appended.
fn reply(sent: &[u8], lowercase: bool, extra: usize) -> Vec<u8> {
    let mut r = sent.to_vec();
    r[2] |= 0x80;
    if lowercase {
        r[12..].make_ascii_lowercase();
    }
    if extra > 0 {
        r[7] = 1;
        r.extend_from_slice(&[0xc0, 12, 0, 16, 0, 1, 0, 0, 0, 60]);
        r.extend_from_slice(&(extra as u16).to_be_bytes());
        r.extend(std::iter::repeat_n(b'x', extra));
    }
    r
}

/// A reply to `sent` carrying one A record with this TTL.
fn answer(sent: &[u8], ttl: u32) -> Vec<u8> {
    let mut r = sent.to_vec();
    r[2] |= 0x80;
    r[7] = 1;
    r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
    r.extend_from_slice(&ttl.to_be_bytes());
    r.extend_from_slice(&[0, 4, 10, 0, 0, 1]);
    r
}

fn with_rcode(sent: &[u8], code: u8) -> Vec<u8> {
    let mut r = sent.to_vec();
    r[2] |= 0x80;
    r[3] = code;
    r
}

struct Rig {
    engine: Engine,
    sent: Vec<(Dest, Vec<u8>)>,
    events: Vec<Event>,
    t0: Instant,
    /// The transport of the client this rig plays.
    transport: Transport,
}

impl Rig {
    fn new(
        transport: Transport,
        role: ListenerRole,
        vnet: Vec<SocketAddr>,
        kube: Vec<SocketAddr>,
    ) -> Rig {
        Rig::with(transport, role, vnet, kube, |_| {})
    }

    fn with(
        transport: Transport,
        role: ListenerRole,
        vnet: Vec<SocketAddr>,
        kube: Vec<SocketAddr>,
        tweak: impl FnOnce(&mut Settings),
    ) -> Rig {
        let mut settings = Settings {
            cluster_domain: wire::encode_name("cluster.local").unwrap(),
            upstream_timeout: Duration::from_secs(1),
            query_timeout: Duration::from_millis(2500),
            max_inflight: 4096,
            udp_sockets_per_upstream: 2,
            stale_after: Duration::from_millis(1800),
            stale_recheck: Duration::from_secs(30),
        };
        tweak(&mut settings);
        let cache = Cache::new(Limits::default()).map(|c| Arc::new(Mutex::new(c)));
        let sets = Arc::new(UpstreamSets::uncounted(vnet, kube));
        Rig {
            engine: Engine::new(
                role,
                settings,
                sets,
                cache,
                Arc::new(ListenerStats::default()),
                [7; 32],
            ),
            sent: Vec::new(),
            events: Vec::new(),
            t0: Instant::now(),
            transport,
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn client(&self) -> Client {
        match self.transport {
            Transport::Udp => Client::Udp(UDP_CLIENT),
            Transport::Tcp => Client::Tcp(TCP_CLIENT),
        }
    }

    fn drain(&mut self) {
        while let Some(t) = self.engine.poll_transmit() {
            self.sent.push((t.dest, t.bytes.to_vec()));
        }
        while let Some(e) = self.engine.poll_event() {
            self.events.push(e);
        }
    }

    fn query(&mut self, packet: &[u8], ms: u64) -> Outcome {
        let (now, client) = (self.at(ms), self.client());
        let outcome = self.engine.handle_query(now, client, packet);
        self.drain();
        outcome
    }

    fn reply_at(&mut self, leg: Leg, packet: Vec<u8>, from: SocketAddr, ms: u64) {
        let now = self.at(ms);
        self.engine.handle_reply(now, leg.via, from, &packet);
        self.drain();
    }

    fn reply(&mut self, leg: Leg, packet: Vec<u8>) {
        self.reply_at(leg, packet, leg.to, 0);
    }

    fn tick(&mut self, ms: u64) {
        let now = self.at(ms);
        self.engine.handle_timeout(now);
        self.drain();
    }

    fn fail(&mut self, leg: Leg, failure: Failure, ms: u64) {
        let now = self.at(ms);
        self.engine.handle_failure(now, leg, failure);
        self.drain();
    }

    /// The last upstream send: its leg and bytes.
    fn last_upstream(&self) -> (Leg, Vec<u8>) {
        self.sent
            .iter()
            .rev()
            .find_map(|(d, b)| match d {
                Dest::Upstream(leg) => Some((*leg, b.clone())),
                _ => None,
            })
            .expect("something was sent upstream")
    }

    fn upstream_sends(&self) -> usize {
        self.sent
            .iter()
            .filter(|(d, _)| matches!(d, Dest::Upstream(_)))
            .count()
    }

    fn to_client(&self) -> Vec<Vec<u8>> {
        let me = Dest::Client(self.client());
        self.sent
            .iter()
            .filter(|(d, _)| *d == me)
            .map(|(_, b)| b.clone())
            .collect()
    }
}

#[test]
fn relays_over_the_askers_transport_and_restores_id_and_case() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Node, vec![up(1)], vec![up(2)]);
        let q = query(0xabcd, "WWW.Example.com", None);
        assert_eq!(rig.query(&q, 0), Outcome::Waiting);
        let (leg, sent) = rig.last_upstream();
        assert_eq!(leg.to, up(1));
        let tcp = matches!(leg.via, Via::Tcp);
        assert_eq!(
            tcp,
            transport == Transport::Tcp,
            "upstream transport = client's"
        );
        assert_eq!(&sent[2..], &q[2..], "forwarded unchanged but for the ID");
        rig.reply(leg, reply(&sent, true, 0));
        let answers = rig.to_client();
        assert_eq!(answers.len(), 1, "{transport:?}");
        assert_eq!(wire::id(&answers[0]), 0xabcd);
        assert_eq!(&answers[0][12..], &q[12..], "client's spelling restored");
        assert_eq!(rig.engine.inflight(), 0);
    }
}

#[test]
fn ignores_replies_that_do_not_match_on_both_transports() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Cluster, vec![up(1)], vec![up(2)]);
        let q = query(1, "a.svc.cluster.local", None);
        rig.query(&q, 0);
        let (leg, sent) = rig.last_upstream();
        rig.reply_at(leg, reply(&sent, false, 0), up(3), 0); // wrong source address
        let other_port = SocketAddr::from(([198, 18, 0, 2], 5353));
        rig.reply_at(leg, reply(&sent, false, 0), other_port, 0);
        if let Via::Udp { socket } = leg.via {
            let other = Leg {
                via: Via::Udp { socket: socket ^ 1 },
                ..leg
            };
            rig.reply(other, reply(&sent, false, 0)); // wrong socket
        }
        let mut wrong_id = reply(&sent, false, 0);
        wrong_id[0] ^= 0xff;
        rig.reply(leg, wrong_id);
        let other_question = query(wire::id(&sent), "b.svc.cluster.local", None);
        rig.reply(leg, reply(&other_question, false, 0));
        rig.reply(leg, sent.clone()); // not a response
        rig.reply(leg, vec![1, 2, 3]);
        assert!(rig.to_client().is_empty(), "{transport:?}");
        assert_eq!(rig.engine.inflight(), 1, "still waiting");
        rig.reply(leg, reply(&sent, false, 0));
        assert_eq!(rig.to_client().len(), 1);
    }
}

#[test]
fn an_unanswered_try_is_hedged_then_timed_out_and_late_replies_still_count() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Cluster, vec![], vec![up(1), up(2)]);
        rig.query(&query(5, "x.cluster.local", None), 0);
        let (first, sent1) = rig.last_upstream();
        rig.tick(99);
        assert_eq!(rig.upstream_sends(), 1, "not yet");
        rig.tick(100);
        let (second, sent2) = rig.last_upstream();
        assert_eq!(
            rig.upstream_sends(),
            2,
            "hedged after the delay for an unknown upstream"
        );
        assert_ne!(first.to, second.to, "to the other upstream");
        assert_ne!(wire::id(&sent1), wire::id(&sent2), "fresh ID per try");
        rig.tick(1000);
        assert!(
            matches!(
                rig.events[..],
                [Event::UpstreamSuspect {
                    failure: Failure::TimedOut,
                    ..
                }]
            ),
            "{:?}",
            rig.events
        );
        assert_eq!(
            rig.upstream_sends(),
            2,
            "the hedge is still out: no third try yet"
        );
        rig.reply_at(first, reply(&sent1, false, 0), first.to, 1050);
        assert_eq!(
            rig.to_client().len(),
            1,
            "the first upstream's late answer is taken"
        );
        assert_eq!(rig.engine.inflight(), 0);
        assert!(
            matches!(rig.events.last(), Some(Event::UpstreamRecovered { .. })),
            "{:?}",
            rig.events
        );
    }
}

#[test]
fn one_hedge_per_query_and_hedges_stay_a_bounded_share() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    rig.query(&query(1, "one.svc", None), 0);
    rig.tick(100);
    let hedges: Vec<_> = rig
        .sent
        .iter()
        .filter(|(d, _)| matches!(d, Dest::Upstream(_)))
        .collect();
    assert_eq!(
        hedges.len(),
        2,
        "a single upstream: the hedge is a retransmission"
    );
    rig.tick(900);
    assert_eq!(rig.upstream_sends(), 2, "never a second hedge");
    // A flood of queries nobody answers: hedges are paid from a budget the queries earn.
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    for i in 0..1000u16 {
        rig.query(&query(i, &format!("n{i}.svc"), None), u64::from(i));
        rig.tick(u64::from(i));
    }
    // By 999 ms no try has timed out yet; the hedges of the first 900 queries are due.
    let extra = rig.upstream_sends() - 1000;
    let most = 900 / HEDGE_COST as usize + (HEDGE_BURST / HEDGE_COST) as usize;
    assert!(extra <= most, "{extra} hedges, more than {most}");
    assert!(extra >= 150, "but hedges do happen: {extra}");
}

#[test]
fn an_error_reply_moves_the_query_to_another_upstream_at_once() {
    for code in [rcode::REFUSED, rcode::SERVFAIL, rcode::NOTIMP] {
        for transport in BOTH {
            let mut rig = Rig::new(transport, ListenerRole::Cluster, vec![], vec![up(1), up(2)]);
            rig.query(&query(3, "e.svc", None), 0);
            let (first, sent) = rig.last_upstream();
            rig.reply_at(first, with_rcode(&sent, code), first.to, 1);
            assert!(rig.to_client().is_empty(), "an error is not an answer");
            let (second, sent2) = rig.last_upstream();
            assert_ne!(second.to, first.to);
            assert!(
                rig.engine.upstreams.kube_dns.is_suspect(first.to),
                "counts against it"
            );
            rig.reply_at(second, answer(&sent2, 60), second.to, 2);
            let answers = rig.to_client();
            assert_eq!(answers.len(), 1);
            assert_eq!(
                wire::rcode(&answers[0]),
                rcode::NOERROR,
                "rcode {code} {transport:?}"
            );
        }
    }
}

#[test]
fn when_every_upstream_answers_an_error_that_error_is_passed_on() {
    let mut rig = Rig::new(
        Transport::Udp,
        ListenerRole::Cluster,
        vec![],
        vec![up(1), up(2)],
    );
    rig.query(&query(3, "e.svc", None), 0);
    for _ in 0..2 {
        let (leg, sent) = rig.last_upstream();
        rig.reply_at(leg, with_rcode(&sent, rcode::REFUSED), leg.to, 1);
    }
    let answers = rig.to_client();
    assert_eq!(
        answers.len(),
        1,
        "answered once both refused, not after the deadline"
    );
    assert_eq!(wire::rcode(&answers[0]), rcode::REFUSED);
    assert_eq!(
        rig.upstream_sends(),
        2,
        "a refusing upstream is not asked twice"
    );
}

#[test]
fn a_reply_without_a_question_counts_only_as_an_error() {
    let mut rig = Rig::new(
        Transport::Udp,
        ListenerRole::Cluster,
        vec![],
        vec![up(1), up(2)],
    );
    rig.query(&query(3, "q.svc", None), 0);
    let (leg, sent) = rig.last_upstream();
    let mut bare = sent[..12].to_vec();
    bare[2] |= 0x80;
    bare[4..12].fill(0);
    rig.reply_at(leg, bare.clone(), leg.to, 1);
    assert_eq!(
        rig.upstream_sends(),
        1,
        "NOERROR without a question is ignored"
    );
    assert!(rig.to_client().is_empty());
    bare[3] = rcode::FORMERR;
    rig.reply_at(leg, bare, leg.to, 2);
    assert_eq!(
        rig.upstream_sends(),
        2,
        "FORMERR without a question is a failed try"
    );
}

#[test]
fn an_unreachable_upstream_moves_every_query_there_on_at_once() {
    let mut rig = Rig::new(
        Transport::Udp,
        ListenerRole::Cluster,
        vec![],
        vec![up(1), up(2)],
    );
    for i in 0..10 {
        rig.query(&query(i, &format!("u{i}.svc"), None), 0);
    }
    let at_one = rig
        .sent
        .iter()
        .filter(|(d, _)| matches!(d, Dest::Upstream(l) if l.to == up(1)))
        .count();
    assert!(at_one >= 4, "shared between both: {at_one} at the first");
    rig.engine.handle_unreachable(rig.at(2), up(1));
    rig.drain();
    assert_eq!(
        rig.upstream_sends(),
        10 + at_one,
        "each one at up(1) went to up(2) at once"
    );
    assert!(rig.engine.upstreams.kube_dns.is_suspect(up(1)));
    rig.query(&query(99, "after.svc", None), 3);
    let (leg, _) = rig.last_upstream();
    assert_eq!(leg.to, up(1), "one probe...");
    rig.query(&query(98, "after2.svc", None), 4);
    assert_eq!(rig.last_upstream().0.to, up(2), "...then the others");
}

#[test]
fn a_timed_out_upstream_gets_only_probes_until_it_answers() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Cluster, vec![], vec![up(1), up(2)]);
        rig.query(&query(1, "a.b", None), 0);
        let (first, _) = rig.last_upstream();
        rig.tick(1000);
        let mut probes = 0;
        for i in 0..20 {
            rig.query(&query(2 + i, &format!("c{i}.d"), None), 1001 + u64::from(i));
            if rig.last_upstream().0.to == first.to {
                probes += 1;
            }
        }
        assert_eq!(probes, 1, "{transport:?}");
    }
}

#[test]
fn servfail_when_every_try_fails_before_the_deadline() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Node, vec![up(1)], vec![]);
        rig.query(&query(5, "example.com", Some(1232)), 0);
        for ms in [1000, 2000] {
            rig.tick(ms);
            assert!(rig.to_client().is_empty(), "retrying at {ms} ms");
        }
        assert_eq!(
            rig.engine.poll_timeout(),
            Some(rig.at(2500)),
            "last try is cut to the deadline"
        );
        rig.tick(2500);
        let answers = rig.to_client();
        assert_eq!(answers.len(), 1);
        assert_eq!(wire::rcode(&answers[0]), rcode::SERVFAIL);
        assert_eq!(wire::id(&answers[0]), 5);
        assert_eq!(rig.engine.inflight(), 0);
        assert_eq!(rig.upstream_sends(), 3);
    }
}

#[test]
fn a_failed_send_or_broken_exchange_moves_on_at_once() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Cluster, vec![], vec![up(1), up(2)]);
        rig.query(&query(1, "a.b", None), 0);
        let (first, _) = rig.last_upstream();
        let refused = Failure::Network(io::ErrorKind::ConnectionRefused);
        rig.fail(first, refused, 5);
        let (second, sent) = rig.last_upstream();
        assert_ne!(first.to, second.to, "{transport:?}");
        assert_eq!(rig.upstream_sends(), 2);
        // The failed leg is forgotten: a reply on it now is ignored.
        rig.reply(first, reply(&sent, false, 0));
        assert!(rig.to_client().is_empty());
        rig.reply(second, reply(&sent, false, 0));
        assert_eq!(rig.to_client().len(), 1);
    }
}

#[test]
fn local_resource_errors_do_not_count_against_the_upstream() {
    let mut rig = Rig::new(Transport::Tcp, ListenerRole::Cluster, vec![], vec![up(1)]);
    rig.query(&query(1, "a.b", None), 0);
    let (leg, _) = rig.last_upstream();
    let emfile = Failure::from_io(&io::Error::from_raw_os_error(24));
    assert!(matches!(emfile, Failure::Local(_)));
    rig.fail(leg, emfile, 1);
    assert!(rig.events.is_empty(), "not suspect: {:?}", rig.events);
    assert!(!rig.engine.upstreams.kube_dns.is_suspect(up(1)));
}

#[test]
fn oversized_answers_become_tc_replies_over_udp_only() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Node, vec![up(1)], vec![]);
        let q = query(9, "big.example", None);
        rig.query(&q, 0);
        let (leg, sent) = rig.last_upstream();
        rig.reply(leg, reply(&sent, false, 1000));
        let a = &rig.to_client()[0];
        match transport {
            Transport::Udp => {
                assert!(wire::is_truncated(a));
                assert_eq!(&a[12..], &q[12..]);
            }
            Transport::Tcp => assert!(!wire::is_truncated(a) && a.len() > 1000),
        }
    }
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Node, vec![up(1)], vec![]);
    rig.query(&query(10, "big.example", Some(4096)), 0);
    let (leg, sent) = rig.last_upstream();
    rig.reply(leg, reply(&sent, false, 1000));
    let a = &rig.to_client()[0];
    assert!(
        !wire::is_truncated(a) && a.len() > 1000,
        "fits the advertised size"
    );
}

#[test]
fn answers_locally_and_drops_responses() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Node, vec![up(1)], vec![up(2)]);
        let probe = query(3, "health-check.localdns.local", None);
        assert_eq!(rig.query(&probe, 0), Outcome::Answered);
        let mut response = query(4, "example.com", None);
        response[2] |= 0x80;
        assert_eq!(rig.query(&response, 0), Outcome::Dropped);
        assert_eq!(rig.query(&[0xff; 5], 0), Outcome::Dropped);
        let answers = rig.to_client();
        assert_eq!(answers.len(), 1);
        assert_eq!(wire::rcode(&answers[0]), rcode::NOERROR);
        assert_eq!(rig.upstream_sends(), 0);
    }
}

#[test]
fn sheds_with_refused_above_the_cap_and_servfails_without_upstreams() {
    for transport in BOTH {
        let mut rig = Rig::with(transport, ListenerRole::Cluster, vec![], vec![up(1)], |s| {
            s.max_inflight = 2
        });
        for i in 0..3 {
            rig.query(&query(i, &format!("n{i}.b"), None), 0);
        }
        let answers = rig.to_client();
        assert_eq!(answers.len(), 1, "{transport:?}");
        assert_eq!(wire::rcode(&answers[0]), rcode::REFUSED);
        assert_eq!(rig.engine.stats.shed.load(RELAXED), 1);
        let mut empty = Rig::new(transport, ListenerRole::Cluster, vec![up(1)], vec![]);
        empty.query(&query(1, "a.b", None), 0);
        assert_eq!(wire::rcode(&empty.to_client()[0]), rcode::SERVFAIL);
    }
}

#[test]
fn ids_spread_over_sockets_and_values() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    for i in 0..200 {
        rig.query(&query(i, &format!("n{i}.b"), None), 0);
    }
    let mut ids = std::collections::HashSet::new();
    let mut sockets = std::collections::HashSet::new();
    for (d, b) in &rig.sent {
        if let Dest::Upstream(leg) = d {
            ids.insert(wire::id(b));
            if let Via::Udp { socket } = leg.via {
                sockets.insert(socket);
            }
        }
    }
    assert!(
        ids.len() > 190,
        "IDs look random: {} distinct of 200",
        ids.len()
    );
    assert_eq!(sockets.len(), 2, "both IPv4 sockets used");
}

#[test]
fn an_upstream_the_shell_has_no_socket_for_is_skipped() {
    let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 53));
    let mut rig = Rig::new(
        Transport::Udp,
        ListenerRole::Cluster,
        vec![],
        vec![v6, up(1)],
    );
    rig.query(&query(1, "a.b", None), 0);
    let (leg, _) = rig.last_upstream();
    assert_eq!(leg.to, v6, "the first in turn");
    rig.fail(leg, Failure::NoSocket, 0);
    assert_eq!(rig.upstream_sends(), 2);
    assert_eq!(rig.last_upstream().0.to, up(1));
}

#[test]
fn identical_queries_in_flight_share_one_upstream_query_per_transport() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Cluster, vec![], vec![up(1)]);
        for id in 0..50 {
            let name = if id % 2 == 0 {
                "Same.Name.svc"
            } else {
                "same.name.SVC"
            };
            rig.query(&query(id, name, None), 0);
        }
        assert_eq!(rig.upstream_sends(), 1, "one upstream query for fifty");
        let (leg, sent) = rig.last_upstream();
        rig.reply(leg, answer(&sent, 60));
        let answers = rig.to_client();
        assert_eq!(answers.len(), 50);
        for (id, a) in answers.iter().enumerate() {
            assert_eq!(wire::id(a), id as u16, "each asker gets its own ID back");
            let spelled = if id % 2 == 0 { b"Same" } else { b"same" };
            assert_eq!(&a[13..17], spelled, "and its own spelling");
        }
        assert_eq!(rig.engine.inflight(), 0);
    }
}

#[test]
fn a_udp_query_and_a_tcp_query_for_one_name_do_not_share_a_try() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    let q = query(1, "big.svc", None);
    rig.query(&q, 0);
    rig.engine.handle_query(
        rig.at(0),
        Client::Tcp(TCP_CLIENT),
        &query(2, "big.svc", None),
    );
    rig.drain();
    let vias: Vec<_> = rig
        .sent
        .iter()
        .filter_map(|(d, _)| match d {
            Dest::Upstream(leg) => Some(leg.via),
            _ => None,
        })
        .collect();
    assert_eq!(
        vias.len(),
        2,
        "a TCP asker must not wait for a UDP answer that may be cut"
    );
    assert!(matches!(vias[1], Via::Tcp));
}

#[test]
fn answers_come_from_the_cache_until_they_expire_whoever_filled_it() {
    for (fill, ask) in [
        (Transport::Udp, Transport::Tcp),
        (Transport::Tcp, Transport::Udp),
        (Transport::Udp, Transport::Udp),
    ] {
        let mut rig = Rig::new(fill, ListenerRole::Cluster, vec![], vec![up(1)]);
        rig.query(&query(1, "c.svc", None), 0);
        let (leg, sent) = rig.last_upstream();
        rig.reply(leg, answer(&sent, 30));
        rig.transport = ask;
        assert_eq!(
            rig.query(&query(2, "C.SVC", None), 10_000),
            Outcome::Answered
        );
        assert_eq!(rig.upstream_sends(), 1, "a hit");
        let hit = rig.to_client().pop().unwrap();
        assert_eq!(wire::id(&hit), 2);
        assert_eq!(
            &hit[hit.len() - 10..hit.len() - 6],
            &20u32.to_be_bytes(),
            "TTL counted down"
        );
        rig.query(&query(3, "c.svc", None), 30_000);
        assert_eq!(rig.upstream_sends(), 2, "expired: asked again");
    }
}

#[test]
fn stale_answers_when_every_try_fails_and_servfail_without_one() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Cluster, vec![], vec![up(1)]);
        rig.query(&query(1, "s.svc", None), 0);
        let (leg, sent) = rig.last_upstream();
        rig.reply(leg, answer(&sent, 10));
        // Later the upstream goes silent.
        rig.query(&query(2, "s.svc", None), 60_000);
        rig.query(&query(3, "other.svc", None), 60_000);
        for ms in [61_000, 62_000, 62_500] {
            rig.tick(ms);
        }
        let answers = rig.to_client();
        let stale = answers.iter().find(|a| wire::id(a) == 2).expect("answered");
        assert_eq!(wire::rcode(stale), rcode::NOERROR);
        let ttl = &stale[stale.len() - 10..stale.len() - 6];
        assert_eq!(ttl, &30u32.to_be_bytes(), "stale TTL");
        let other = answers.iter().find(|a| wire::id(a) == 3).expect("answered");
        assert_eq!(
            wire::rcode(other),
            rcode::SERVFAIL,
            "nothing cached: SERVFAIL"
        );
        assert!(rig.events.contains(&Event::ServedStale { answers: 1 }));
    }
}

#[test]
fn an_upstream_servfail_is_passed_on_but_never_cached_and_loses_to_stale() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Cluster, vec![], vec![up(1)]);
        rig.query(&query(1, "f.svc", None), 0);
        let (leg, sent) = rig.last_upstream();
        rig.reply(leg, with_rcode(&sent, rcode::SERVFAIL));
        assert_eq!(wire::rcode(&rig.to_client()[0]), rcode::SERVFAIL);
        rig.query(&query(2, "f.svc", None), 100);
        assert_eq!(rig.upstream_sends(), 2, "SERVFAIL was not cached");
        let (leg, sent) = rig.last_upstream();
        rig.reply_at(leg, answer(&sent, 10), leg.to, 100);
        rig.query(&query(3, "f.svc", None), 20_000);
        let (leg, sent) = rig.last_upstream();
        rig.reply_at(leg, with_rcode(&sent, rcode::SERVFAIL), leg.to, 20_000);
        let last = rig.to_client().pop().unwrap();
        assert_eq!(
            (wire::id(&last), wire::rcode(&last)),
            (3, rcode::NOERROR),
            "stale beats SERVFAIL"
        );
    }
}

#[test]
fn every_query_gets_exactly_one_reply_and_nothing_stays_in_flight() {
    // A mix of everything at once, on both transports: each client is answered once.
    for transport in BOTH {
        let mut rig = Rig::new(
            transport,
            ListenerRole::Node,
            vec![up(1), up(2)],
            vec![up(3)],
        );
        let names = [
            "a.example",
            "b.svc.cluster.local",
            "a.example",
            "health-check.localdns.local",
        ];
        for (i, n) in names.iter().enumerate() {
            rig.query(&query(i as u16, n, None), 0);
        }
        let (leg, sent) = rig.last_upstream();
        rig.reply(leg, answer(&sent, 5));
        for ms in (500..=3000).step_by(500) {
            rig.tick(ms);
        }
        let mut ids: Vec<u16> = rig.to_client().iter().map(|a| wire::id(a)).collect();
        ids.sort();
        assert_eq!(ids, [0, 1, 2, 3], "{transport:?}");
        assert_eq!(rig.engine.inflight(), 0);
    }
}

#[test]
fn stale_answers_come_at_the_client_response_timer_then_at_once_while_failing() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    rig.query(&query(1, "s.svc", None), 0);
    let (leg, sent) = rig.last_upstream();
    rig.reply(leg, answer(&sent, 10));
    // The upstream goes silent; the entry expired long ago.
    rig.query(&query(2, "s.svc", None), 60_000);
    rig.tick(61_799);
    assert_eq!(rig.to_client().len(), 1, "not yet");
    rig.tick(61_800);
    let stale = rig.to_client().pop().unwrap();
    assert_eq!(
        (wire::id(&stale), wire::rcode(&stale)),
        (2, rcode::NOERROR),
        "stale at 1.8 s"
    );
    rig.tick(62_500);
    assert_eq!(
        rig.to_client().len(),
        2,
        "answered once, not again at the deadline"
    );
    // The refresh failed: for the next 30 s the stale answer comes at once, and only one
    // refresh at a time goes upstream.
    let sends = rig.upstream_sends();
    rig.query(&query(3, "s.svc", None), 63_000);
    assert_eq!(wire::id(&rig.to_client().pop().unwrap()), 3, "at once");
    assert_eq!(rig.upstream_sends(), sends + 1, "one refresh");
    rig.query(&query(4, "s.svc", None), 63_001);
    assert_eq!(wire::id(&rig.to_client().pop().unwrap()), 4, "at once");
    assert_eq!(rig.upstream_sends(), sends + 1, "still one refresh");
    // The upstream is back: the refresh fills the cache, and fresh answers follow.
    let (leg, sent) = rig.last_upstream();
    rig.reply_at(leg, answer(&sent, 60), leg.to, 63_002);
    rig.query(&query(5, "s.svc", None), 63_003);
    let fresh = rig.to_client().pop().unwrap();
    let ttl = &fresh[fresh.len() - 10..fresh.len() - 6];
    assert_eq!(ttl, &60u32.to_be_bytes(), "a fresh answer from the cache");
    assert_eq!(rig.engine.inflight(), 0);
}

#[test]
fn a_truncated_udp_answer_is_fetched_over_tcp_for_an_asker_that_takes_more() {
    let mut rig = Rig::new(
        Transport::Udp,
        ListenerRole::Cluster,
        vec![],
        vec![up(1), up(2)],
    );
    rig.query(&query(1, "big.svc", Some(4096)), 0);
    let (leg, sent) = rig.last_upstream();
    let mut tc = reply(&sent, false, 0);
    tc[2] |= 0x02;
    rig.reply_at(leg, tc, leg.to, 1);
    assert!(rig.to_client().is_empty(), "not passed on cut");
    let (again, sent2) = rig.last_upstream();
    assert_eq!(
        (again.via, again.to),
        (Via::Tcp, leg.to),
        "the same upstream, over TCP"
    );
    rig.reply_at(again, reply(&sent2, false, 3000), again.to, 2);
    let answers = rig.to_client();
    assert_eq!(answers.len(), 1);
    assert!(!wire::is_truncated(&answers[0]) && answers[0].len() > 3000);
    // A client that takes only 512 bytes would get a cut answer from the upstream too: passed on.
    rig.query(&query(2, "big2.svc", None), 10);
    let (leg, sent) = rig.last_upstream();
    let mut tc = reply(&sent, false, 0);
    tc[2] |= 0x02;
    rig.reply_at(leg, tc, leg.to, 11);
    let last = rig.to_client().pop().unwrap();
    assert_eq!(wire::id(&last), 2);
    assert!(wire::is_truncated(&last));
}
