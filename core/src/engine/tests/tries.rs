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
    // By 999 ms no try has timed out yet; the hedges of the first 900 queries are due.
    let extra = rig.upstream_sends() - 1000;
    let most = 900 / HEDGE_COST as usize + (HEDGE_BURST / HEDGE_COST) as usize;
    assert!(extra <= most, "{extra} hedges, more than {most}");
    assert!(extra >= 150, "but hedges do happen: {extra}");
    // A try whose hedge was not paid for still times out: every query ends by its deadline.
    for ms in (1000..=3600).step_by(50) {
        rig.tick(ms);
    }
    assert_eq!(rig.engine.inflight(), 0);
    assert_eq!(rig.to_client().len(), 1000);
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
    assert!(rig.events.is_empty(), "not suspect: {:?}", rig.events);
    assert!(!rig.engine.upstreams.kube_dns.is_suspect(up(1)));
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
        |s| s.max_inflight = 1,
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
    assert_eq!(wire::answer_count(&stale), 1);
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
