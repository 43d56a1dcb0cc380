//! The cache, coalescing and serve-stale as the engine uses them.

use super::*;

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
    let now = rig.at(0);
    rig.engine
        .handle_query(now, Client::Tcp(TCP_CLIENT), &query(2, "big.svc", None));
    rig.drain();
    let vias: Vec<_> = rig.upstream_legs().iter().map(|l| l.via).collect();
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
