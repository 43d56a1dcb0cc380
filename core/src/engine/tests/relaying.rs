//! Relaying, matching replies, local answers, shedding, sizes and query IDs.

use super::*;

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
    // A client that takes only 512 bytes gets a cut answer that carries records as it is.
    rig.query(&query(2, "big2.svc", None), 10);
    let (leg, sent) = rig.last_upstream();
    let mut tc = answer(&sent, 60);
    tc[2] |= 0x02;
    rig.reply_at(leg, tc, leg.to, 11);
    let last = rig.to_client().pop().unwrap();
    assert_eq!(wire::id(&last), 2);
    assert!(wire::is_truncated(&last) && wire::counts(&last)[1] == 1);
}

#[test]
fn a_truncated_answer_without_records_is_fetched_over_tcp_and_cut_to_what_fits() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    // No EDNS: the asker takes 512 bytes and (musl before 1.2.4, busybox) never retries over TCP.
    rig.query(&query(3, "headless.svc", None), 0);
    let (leg, sent) = rig.last_upstream();
    let mut tc = reply(&sent, false, 0);
    tc[2] |= 0x02;
    rig.reply_at(leg, tc, leg.to, 1);
    assert!(
        rig.to_client().is_empty(),
        "an empty cut answer is not passed on"
    );
    let (again, sent2) = rig.last_upstream();
    assert_eq!(
        (again.via, again.to),
        (Via::Tcp, leg.to),
        "the same upstream, over TCP"
    );
    // Sixty A records, as a headless service with sixty pods has.
    let mut whole = sent2.clone();
    whole[2] |= 0x80;
    whole[6..8].copy_from_slice(&60u16.to_be_bytes());
    for i in 0..60u8 {
        whole.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 1, 0, i]);
    }
    rig.reply_at(again, whole, again.to, 2);
    let answers = rig.to_client();
    assert_eq!(answers.len(), 1);
    let cut = &answers[0];
    assert!(cut.len() <= 512, "{} bytes", cut.len());
    assert!(wire::is_truncated(cut), "TC: there is more");
    let records = wire::counts(cut)[1];
    assert!(
        (20..60).contains(&records),
        "{records} records that fit in 512 bytes"
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
            s.settings.max_inflight = 2
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
fn a_flood_of_one_group_leaves_room_for_the_other_on_the_node_listener() {
    for transport in BOTH {
        let mut rig = Rig::with(
            transport,
            ListenerRole::Node,
            vec![up(1)],
            vec![up(2)],
            |s| s.settings.max_inflight = 8,
        );
        // Cluster names to a kube-dns that never answers, as many as the cap: three quarters go
        // in flight, the rest are shed.
        for i in 0..8 {
            let name = format!("n{i}.svc.cluster.local");
            rig.query(&query(i, &name, None), 0);
        }
        let shed = rig.to_client();
        assert_eq!(shed.len(), 2, "{transport:?}");
        assert!(shed.iter().all(|r| wire::rcode(r) == rcode::REFUSED));
        // The VNet DNS's names still go upstream and are answered.
        assert_eq!(
            rig.query(&query(100, "example.com", None), 1),
            Outcome::Waiting
        );
        let (leg, sent) = rig.last_upstream();
        assert_eq!(leg.to, up(1));
        rig.reply_at(leg, answer(&sent, 60), leg.to, 2);
        let last = rig.to_client().pop().unwrap();
        assert_eq!((wire::id(&last), wire::rcode(&last)), (100, rcode::NOERROR));
    }
}

#[test]
fn ids_spread_over_sockets_and_values() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    // A query a millisecond: tries share a socket for `SOCKET_RUN`.
    for i in 0..200 {
        rig.query(&query(i, &format!("n{i}.b"), None), u64::from(i));
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
fn an_answered_query_leaves_no_timer_to_wake_for() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    rig.query(&query(1, "a.svc", None), 0);
    assert!(rig.engine.poll_timeout().is_some(), "the try's timer");
    let (leg, sent) = rig.last_upstream();
    rig.reply(leg, reply(&sent, false, 0));
    // The shell runs the timers after every turn; a dead timer must not set its next wake-up.
    rig.tick(0);
    assert_eq!(rig.engine.poll_timeout(), None);
}

/// The standby's own questions: one per group the listener sends to, through the upstream
/// sockets, each group's in turn; the answer feeds health and reaches no client.
#[test]
fn questions_of_our_own_go_to_each_group_in_turn_and_reach_no_client() {
    let mut r =
        Setup::new(ListenerRole::Node, vec![up(1)], vec![up(2), up(3)]).start(Instant::now());
    let t0 = r.now();
    r.engine.ask_if_due(t0, true);
    r.drain();
    let sent: Vec<(Leg, Vec<u8>)> = r
        .sent
        .drain(..)
        .map(|(d, b)| match d {
            Dest::Upstream(leg) => (leg, b),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sent.len(), 2);
    let (vnet, kube) = (&sent[0], &sent[1]);
    assert_eq!(vnet.0.to, up(1));
    assert_eq!(&vnet.1[12..], b"\0\0\x02\0\x01", "the root's NS");
    assert_eq!(kube.0.to, up(2));
    assert_eq!(
        &kube.1[12..],
        b"\x0akubernetes\x07default\x03svc\x07cluster\x05local\0\0\x01\0\x01"
    );
    for (leg, bytes) in &sent {
        r.handle_reply(t0, leg.via, leg.to, &reply(bytes, false, 0));
    }
    assert!(r.sent.is_empty(), "nothing for a client: {:?}", r.sent);
    assert_eq!(r.engine.inflight(), 0);
    let sets = r.engine.upstreams().clone();
    assert_eq!(sets.kube_dns.readiness(t0), Ok(Duration::ZERO));
    // Not due again before 9 s; then kube-dns's next server.
    r.engine.ask_if_due(t0 + Duration::from_secs(8), true);
    r.drain();
    assert_eq!(r.upstream_sends(), 0);
    r.engine.ask_if_due(t0 + Duration::from_secs(9), true);
    r.drain();
    let to: Vec<SocketAddr> = r.upstream_legs().iter().map(|l| l.to).collect();
    assert_eq!(to, [up(1), up(3)]);
    // Holding the flows (not standing by), nothing is asked.
    r.sent.clear();
    r.engine.ask_if_due(t0 + Duration::from_secs(60), false);
    r.drain();
    assert_eq!(r.upstream_sends(), 0);
    // The cluster listener sends nothing to the VNet DNS, so never asks it.
    let mut c = Setup::new(ListenerRole::Cluster, vec![up(1)], vec![up(2)]).start(Instant::now());
    c.engine.ask_if_due(c.now(), true);
    c.drain();
    assert_eq!(c.last_upstream().0.to, up(2));
    assert_eq!(c.upstream_sends(), 1);
}
