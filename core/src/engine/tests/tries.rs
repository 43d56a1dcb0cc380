//! Tries and upstream health: timeouts, hedges, error replies, unreachable upstreams, probes.

use super::*;

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
            rig.events.is_empty(),
            "one timeout is forgiven: {:?}",
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
        assert!(rig.events.is_empty(), "{:?}", rig.events);
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
    // By 999 ms no try has timed out yet; the hedges of the first 900 queries are due. The
    // server, late again and again, is probed (a probe's hedge is free) once per PROBE_EVERY.
    let extra = rig.upstream_sends() - 1000;
    let probes = 1000 / crate::upstream::PROBE_EVERY.as_millis() as usize;
    let most = 900 / HEDGE_COST as usize + (HEDGE_BURST / HEDGE_COST) as usize + probes;
    assert!(extra <= most, "{extra} hedges, more than {most}");
    assert!(extra >= 150, "but hedges do happen: {extra}");
    // A try whose hedge was not paid for still times out: every query ends by its deadline.
    for ms in (1000..=3600).step_by(50) {
        rig.tick(ms);
    }
    assert_eq!(rig.engine.inflight(), 0);
    assert_eq!(rig.to_client().len(), 1000);
}

/// An upstream that drops a burst of datagrams (its socket buffer full) leaves more tries late
/// at once than the hedge budget holds. The budget refills as new queries come, and each late
/// try looks again until it is paid for: its client waits milliseconds, not the try's timeout
/// (a client with a closed loop of queries pays that second in throughput). The budget holds.
#[test]
fn a_burst_of_lost_tries_beyond_the_budget_is_hedged_as_the_budget_refills() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    let burst_name = |i: u16| wire::encode_name(&format!("b{i}.svc")).unwrap();
    let (mut id, mut steady) = (0u16, 0usize);
    // A quick server: the hedge delay is its floor.
    let mut answered = |rig: &mut Rig, ms: u64| {
        id += 1;
        steady += 1;
        rig.query(&query(id, &format!("s{id}.svc"), None), ms);
        let (leg, sent) = rig.last_upstream();
        rig.reply_at(leg, answer(&sent, 60), leg.to, ms);
    };
    for ms in 0..10 {
        answered(&mut rig, ms);
    }
    const BURST: u16 = 120;
    for i in 0..BURST {
        rig.query(&query(1000 + i, &format!("b{i}.svc"), None), 10);
    }
    // Ten answered queries a millisecond: two hedges' worth.
    for ms in 11..300 {
        for _ in 0..10 {
            answered(&mut rig, ms);
        }
        rig.tick(ms);
    }
    let sends_of = |name: &[u8]| {
        rig.sent
            .iter()
            .filter(|(d, b)| {
                matches!(d, Dest::Upstream(_)) && b.get(12..12 + name.len()) == Some(name)
            })
            .count()
    };
    let unhedged: Vec<u16> = (0..BURST)
        .filter(|&i| sends_of(&burst_name(i)) < 2)
        .collect();
    assert!(unhedged.is_empty(), "left to the try timeout: {unhedged:?}");
    let hedges = rig.upstream_sends() - steady - usize::from(BURST);
    let most =
        (steady + usize::from(BURST)) / HEDGE_COST as usize + (HEDGE_BURST / HEDGE_COST) as usize;
    assert!(
        hedges <= most,
        "{hedges} hedges, more than the budget's {most}"
    );
}

/// Tries go through one socket for `SOCKET_RUN` (a relay's batch leaves in one `sendmmsg`), so a
/// batch (the tries of one instant) never changes socket; each run's socket is drawn at random,
/// so every socket is used.
#[test]
fn tries_go_through_one_socket_a_run_and_every_socket_in_turn() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    let mut sent_at = Vec::new();
    for ms in 0..400u64 {
        // Batches of 1 to 7 queries, one a millisecond.
        for _ in 0..ms * 37 % 7 + 1 {
            let i = sent_at.len() as u16;
            rig.query(&query(i, &format!("n{i}.svc"), None), ms);
            sent_at.push(ms);
        }
    }
    let sockets: Vec<usize> = rig
        .sent
        .iter()
        .filter_map(|(d, _)| match d {
            Dest::Upstream(Leg {
                via: Via::Udp { socket },
                ..
            }) => Some(*socket),
            _ => None,
        })
        .collect();
    assert_eq!(sockets.len(), sent_at.len());
    let run = SOCKET_RUN.as_millis() as u64;
    let mut run_start = 0;
    for i in 1..sockets.len() {
        if sockets[i] != sockets[i - 1] {
            assert!(
                sent_at[i] >= run_start + run,
                "switched at {i}: {sockets:?}"
            );
            assert_ne!(sent_at[i], sent_at[i - 1], "switched within a batch at {i}");
            run_start = sent_at[i];
        } else if sent_at[i] >= run_start + run {
            // Drawn again, the same socket.
            run_start = sent_at[i];
        }
    }
    for socket in 0..crate::rig::SOCKETS {
        assert!(sockets.contains(&socket), "socket {socket} never drawn");
    }
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
                !rig.engine.upstreams.kube_dns.is_suspect(first.to),
                "its answer for one name, not a fault"
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
    let now = rig.at(2);
    rig.engine.handle_unreachable(now, up(1));
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
fn an_upstream_that_timed_out_twice_in_a_row_gets_only_probes_until_it_answers() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Cluster, vec![], vec![up(1), up(2)]);
        rig.query(&query(1, "a.b", None), 0);
        let (first, _) = rig.last_upstream();
        rig.tick(1000);
        // Forgiven once: the next query may still start there; a second loss demotes it.
        rig.query(&query(40, "again.b", None), 1001);
        let (next, _) = rig.last_upstream();
        assert_eq!(
            next.to, first.to,
            "{transport:?}: one timeout cost it no turn"
        );
        rig.tick(2001);
        assert!(
            rig.events.iter().any(|e| matches!(
                e,
                Event::UpstreamSuspect { upstream, failure: Failure::TimedOut, .. } if *upstream == first.to
            )),
            "{:?}",
            rig.events
        );
        let mut probes = 0;
        for i in 0..20 {
            rig.query(&query(2 + i, &format!("c{i}.d"), None), 2002 + u64::from(i));
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
    assert!(
        !rig.events
            .iter()
            .any(|e| matches!(e, Event::UpstreamSuspect { .. })),
        "not suspect: {:?}",
        rig.events
    );
    assert!(!rig.engine.upstreams.kube_dns.is_suspect(up(1)));
}

/// A try that never left this host (no socket for it in this relay, a send the kernel refused
/// for want of the family or a route) fails over at once, and with nothing else to try the
/// client gets SERVFAIL at once; but it is no evidence against the upstream, whose health the
/// other listener shares: there, queries to it still go out and are answered.
#[test]
fn a_try_that_never_left_this_host_is_no_evidence_against_its_upstream() {
    let errno = |n| Failure::from_io(&io::Error::from_raw_os_error(n));
    // No socket; EAFNOSUPPORT; ENETUNREACH.
    for failure in [Failure::NoSocket, errno(97), errno(101)] {
        for transport in BOTH {
            let mut cluster = Rig::with(
                transport,
                ListenerRole::Cluster,
                vec![up(1)],
                vec![up(2)],
                |s| {
                    let domain = wire::encode_name("example.com").unwrap();
                    s.routes
                        .set(ListenerRole::Cluster, &domain, UpstreamGroup::VnetDns)
                },
            );
            // Twenty names over three seconds, every try of each failing as it is sent.
            for i in 0..20u16 {
                let ms = u64::from(i) * 150;
                let mut seen = cluster.upstream_sends();
                cluster.query(&query(i, &format!("n{i}.example.com"), None), ms);
                while cluster.upstream_sends() > seen {
                    seen = cluster.upstream_sends();
                    let (leg, _) = cluster.last_upstream();
                    assert_eq!(
                        leg.to,
                        up(1),
                        "{failure:?} {transport:?}: routed to the VNet DNS"
                    );
                    cluster.fail(leg, failure, ms);
                }
                let last = cluster.to_client().pop().expect("answered at once");
                assert_eq!(
                    (wire::id(&last), wire::rcode(&last)),
                    (i, rcode::SERVFAIL),
                    "{failure:?} {transport:?}"
                );
            }
            let sets = cluster.engine.upstreams().clone();
            assert!(
                !sets.vnet_dns.is_suspect(up(1)),
                "{failure:?} {transport:?}"
            );
            assert!(
                !cluster
                    .events
                    .iter()
                    .any(|e| matches!(e, Event::UpstreamSuspect { .. })),
                "{failure:?} {transport:?}: {:?}",
                cluster.events
            );
            // The node listener, sharing the health: its query goes to the VNet DNS.
            let mut node = Rig::new(transport, ListenerRole::Node, vec![up(1)], vec![up(2)]);
            node.engine.set_upstreams(sets);
            let outcome = node.query(&query(99, "www.example.com", None), 3000);
            assert_eq!(outcome, Outcome::Waiting, "{failure:?} {transport:?}");
            let (leg, sent) = node.last_upstream();
            assert_eq!(leg.to, up(1));
            node.reply_at(leg, answer(&sent, 60), up(1), 3001);
            let got = node.to_client().pop().expect("answered");
            assert_eq!(
                wire::rcode(&got),
                rcode::NOERROR,
                "{failure:?} {transport:?}"
            );
        }
    }
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
fn a_group_known_down_is_answered_at_once_and_probed_in_the_background() {
    for transport in BOTH {
        let mut rig = Rig::new(transport, ListenerRole::Cluster, vec![], vec![up(1)]);
        rig.query(&query(1, "a.b", None), 0);
        rig.query(&query(9, "x.y", None), 0);
        for ms in [1000, 2000, 2500] {
            rig.tick(ms);
        }
        let answers = rig.to_client();
        assert_eq!(answers.len(), 2, "{transport:?}: SERVFAIL at the deadline");
        // Its only upstream left two names unanswered and has sent nothing: the group is down.
        let before = rig.upstream_sends();
        assert_eq!(rig.query(&query(2, "c.d", None), 2600), Outcome::Answered);
        let last = rig.to_client().pop().unwrap();
        assert_eq!((wire::id(&last), wire::rcode(&last)), (2, rcode::SERVFAIL));
        assert_eq!(
            rig.upstream_sends(),
            before + 1,
            "a probe goes on in the background"
        );
        // Within the probe interval no second probe; still at once.
        assert_eq!(rig.query(&query(3, "e.f", None), 2700), Outcome::Answered);
        assert_eq!(rig.upstream_sends(), before + 1);
        // The probe is answered: forwarding resumes for the next query.
        let (leg, sent) = rig.last_upstream();
        rig.reply_at(leg, answer(&sent, 60), leg.to, 2750);
        assert_eq!(rig.query(&query(4, "g.h", None), 2800), Outcome::Waiting);
        assert_eq!(rig.upstream_sends(), before + 2);
    }
}

#[test]
fn a_name_no_upstream_answered_is_servfail_at_once_for_a_second_only() {
    let mut rig = Rig::new(
        Transport::Udp,
        ListenerRole::Cluster,
        vec![],
        vec![up(1), up(2)],
    );
    rig.query(&query(1, "lost.b", None), 0);
    for ms in [100, 1000, 1100, 2000, 2500] {
        rig.tick(ms);
    }
    assert_eq!(rig.to_client().len(), 1, "SERVFAIL at the deadline");
    let sends = rig.upstream_sends();
    // Both upstreams lost only this name's tries: the group is not down, but the name is
    // answered at once for a second.
    assert_eq!(
        rig.query(&query(2, "lost.b", None), 2600),
        Outcome::Answered
    );
    assert_eq!(rig.upstream_sends(), sends);
    assert_eq!(
        rig.query(&query(3, "other.b", None), 2600),
        Outcome::Waiting
    );
    assert_eq!(rig.query(&query(4, "lost.b", None), 3600), Outcome::Waiting);
}

#[test]
fn background_probes_of_a_down_group_never_go_over_the_inflight_cap() {
    let mut rig = Rig::with(
        Transport::Udp,
        ListenerRole::Cluster,
        vec![],
        vec![up(1)],
        |s| s.settings.max_inflight = 1,
    );
    rig.query(&query(1, "a.b", None), 0);
    for ms in [1000, 2000, 2500] {
        rig.tick(ms);
    }
    rig.query(&query(4, "x.y", None), 2500);
    for ms in [3000, 3500, 4500, 5000] {
        rig.tick(ms);
    }
    // Down: the next query is answered at once and its probe takes the one slot.
    assert_eq!(rig.query(&query(2, "c.d", None), 5100), Outcome::Answered);
    assert_eq!(rig.engine.inflight(), 1);
    // Half a second on a probe is due again, but the slot is taken: no second query in flight.
    assert_eq!(rig.query(&query(3, "e.f", None), 5700), Outcome::Answered);
    assert!(
        rig.engine.inflight() <= 1,
        "{} in flight",
        rig.engine.inflight()
    );
}

#[test]
fn a_group_known_down_answers_stale_at_once_even_for_a_name_not_asked_during_the_outage() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    rig.query(&query(1, "cached.b", None), 0);
    let (leg, sent) = rig.last_upstream();
    rig.reply_at(leg, answer(&sent, 1), leg.to, 1);
    // The outage: two other names' tries time out; the only upstream is down from 12.0 s on.
    rig.query(&query(2, "other.b", None), 10_000);
    rig.query(&query(4, "more.b", None), 10_000);
    for ms in [11_000, 12_000, 12_500] {
        rig.tick(ms);
    }
    let sends = rig.upstream_sends();
    // The expired answer is served at once, not after serve-stale's 1.8 s.
    assert_eq!(
        rig.query(&query(3, "cached.b", None), 12_600),
        Outcome::Answered
    );
    let stale = rig.to_client().pop().unwrap();
    assert_eq!((wire::id(&stale), wire::rcode(&stale)), (3, rcode::NOERROR));
    assert_eq!(wire::counts(&stale)[1], 1);
    assert_eq!(
        rig.upstream_sends(),
        sends + 1,
        "and refreshed in the background"
    );
}

/// The healthy paths of the fail-fast: an upstream that answers anything is alive, however
/// quiet the listener is afterwards.
#[test]
fn after_an_error_reply_and_quiet_seconds_the_next_name_is_still_asked() {
    for code in [rcode::SERVFAIL, rcode::REFUSED] {
        for servers in [vec![up(1)], vec![up(1), up(2)]] {
            for gap in [1500, 3000] {
                let mut rig = Rig::new(Transport::Udp, ListenerRole::Node, servers.clone(), vec![]);
                rig.query(&query(1, "bad.example.com", None), 0);
                // Every server asked answers the broken name with the error.
                for ms in 1..=servers.len() as u64 {
                    let (leg, sent) = rig.last_upstream();
                    rig.reply_at(leg, with_rcode(&sent, code), leg.to, ms);
                }
                let first = rig.to_client();
                assert_eq!(first.len(), 1);
                assert_eq!(wire::rcode(&first[0]), code, "the upstream's own answer");
                let case = format!("rcode {code}, {} servers, {gap} ms quiet", servers.len());
                assert_eq!(
                    rig.query(&query(2, "good1.example.com", None), gap),
                    Outcome::Waiting,
                    "{case}: asked, not failed at once"
                );
                let (leg, sent) = rig.last_upstream();
                rig.reply_at(leg, answer(&sent, 60), leg.to, gap + 1);
                let last = rig.to_client().pop().unwrap();
                assert_eq!(
                    (wire::id(&last), wire::rcode(&last)),
                    (2, rcode::NOERROR),
                    "{case}"
                );
            }
        }
    }
}

#[test]
fn after_one_slow_answer_and_a_quiet_second_the_next_name_is_still_asked() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Node, vec![up(1)], vec![]);
    rig.query(&query(1, "slow.example.com", None), 0);
    let (first, sent) = rig.last_upstream();
    for ms in [100, 1000, 1100, 1200] {
        rig.tick(ms);
    }
    // Past the try's second, inside the query's budget: the client gets it.
    rig.reply_at(first, answer(&sent, 60), first.to, 1300);
    let got = rig.to_client();
    assert_eq!(got.len(), 1);
    assert_eq!(wire::rcode(&got[0]), rcode::NOERROR);
    for ms in [2000, 2200, 2300, 2800] {
        rig.tick(ms);
    }
    assert_eq!(
        rig.query(&query(2, "next.example.com", None), 2800),
        Outcome::Waiting,
        "a slow server is not a dead one"
    );
}

#[test]
fn a_try_cut_short_by_the_query_budget_is_not_judged_lost() {
    let mut rig = Rig::new(Transport::Udp, ListenerRole::Cluster, vec![], vec![up(1)]);
    rig.query(&query(1, "a.b", None), 0);
    for ms in [1000, 2000, 2500] {
        rig.tick(ms);
    }
    assert_eq!(rig.to_client().len(), 1, "SERVFAIL at the deadline");
    // The last try went out at 2.0 s and is awaited until 3.0 s; its late answer is life.
    let (leg, sent) = rig.last_upstream();
    rig.reply_at(leg, answer(&sent, 60), leg.to, 2900);
    assert_eq!(rig.query(&query(2, "c.d", None), 3000), Outcome::Waiting);
}

/// One of two kube-dns backends dies (its node died; it stays in the endpoints) under bursts of
/// new names: `dead_after`, when each backend stops answering; a burst of `burst` queries every
/// `every_ms`, 1 ms round trips.
struct Death {
    /// The worst time to an answer, and how many queries took over 100 ms.
    worst: u64,
    slow: usize,
    /// Upstream sends after the first backend died: all, and those that are neither a query's
    /// first try nor its move on after a whole `--upstream-timeout` (hedges and probes).
    sends: usize,
    extra: usize,
}

fn backends_dying(dead_after: [u64; 2], bursts: u64, burst: u16, every_ms: u64) -> Death {
    let mut rig = Rig::new(
        Transport::Udp,
        ListenerRole::Cluster,
        vec![],
        vec![up(1), up(2)],
    );
    let timeout = rig.engine.settings.upstream_timeout.as_millis() as u64;
    // Per client: when it asked, and how long its answer took.
    let mut asked: Vec<(Client, u64, Option<u64>)> = Vec::new();
    let mut replies: Vec<(u64, Leg, Vec<u8>)> = Vec::new();
    // Per name: its latest send.
    let mut last_send: HashMap<Vec<u8>, u64> = HashMap::new();
    let (mut sends, mut extra) = (0, 0);
    for ms in 0..bursts * every_ms + 3000 {
        for (_, leg, r) in replies.extract_if(.., |(at, ..)| *at == ms) {
            rig.reply_at(leg, r, leg.to, ms);
        }
        if ms % every_ms == 0 && ms / every_ms < bursts {
            for b in 0..burst {
                let i = (ms / every_ms) as u16 * burst + b;
                let client = Client::Udp(SocketAddr::from(([10, 1, 2, 3], 1000 + i)));
                asked.push((client, ms, None));
                let packet = query(i, &format!("n{i}.svc.cluster.local"), None);
                rig.rig.handle_query(rig.at(ms), client, &packet);
            }
        }
        rig.tick(ms);
        for (dest, bytes) in std::mem::take(&mut rig.rig.sent) {
            match dest {
                Dest::Upstream(leg) => {
                    let q = wire::parse_query(&bytes).expect("a query");
                    let name = bytes[12..q.name_end].to_ascii_lowercase();
                    let previous = last_send.insert(name.clone(), ms);
                    if ms >= dead_after[0].min(dead_after[1]) {
                        sends += 1;
                        // A send for a name whose asker already has its answer is a probe.
                        let i: usize = String::from_utf8_lossy(&name[2..])
                            .split(|c: char| !c.is_ascii_digit())
                            .next()
                            .and_then(|n| n.parse().ok())
                            .expect("our names");
                        let probe = asked[i].2.is_some();
                        let hedge = previous.is_some_and(|p| ms < p + timeout);
                        extra += usize::from(probe || hedge);
                    }
                    let k = usize::from(leg.to != up(1));
                    if ms < dead_after[k] {
                        replies.push((ms + 1, leg, answer(&bytes, 30)));
                    }
                }
                Dest::Client(c) => {
                    let a = asked.iter_mut().find(|a| a.0 == c).expect("a client");
                    assert!(a.2.is_none(), "one answer per query");
                    a.2 = Some(ms - a.1);
                }
            }
        }
    }
    let took: Vec<u64> = asked
        .iter()
        .map(|a| a.2.expect("every query answered"))
        .collect();
    Death {
        worst: took.iter().copied().max().unwrap_or(0),
        slow: took.iter().filter(|t| **t > 100).count(),
        sends,
        extra,
    }
}

#[test]
fn through_a_backends_death_every_query_is_answered_fast_and_an_outage_costs_few_hedges() {
    // Bursts of 20 queries every 50 ms, one backend dead from 1 s on. Before, half of each burst
    // went to the dead one until its tries timed out a second later, each needing a hedge; 0.4 s
    // after the death the hedge budget was spent, and 80 queries waited the whole 1 s.
    let d = backends_dying([1000, u64::MAX], 60, 20, 50);
    eprintln!(
        "one backend dead: {} queries over 100 ms, worst {} ms",
        d.slow, d.worst
    );
    assert_eq!(d.slow, 0, "queries over 100 ms (worst {} ms)", d.worst);
    // Both dead: hedges and probes stay a bounded share of what goes upstream (hedges a fifth
    // of new queries at most, past the saved-up burst; probes a few per second).
    let d = backends_dying([1000, 1000], 60, 20, 50);
    eprintln!(
        "both dead: {} hedges and probes of {} sends",
        d.extra, d.sends
    );
    assert!(
        d.extra * 4 <= d.sends,
        "{} hedges and probes of {} upstream sends in an outage",
        d.extra,
        d.sends
    );
}
