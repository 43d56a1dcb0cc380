//! Sharing LocalDNS's ports and handing them back, in network namespaces:
//! - the steering program keeps every new flow on the fallback's sockets while it serves, even
//!   when a socket bound later (a LocalDNS that is starting) or earlier (an orphaned CoreDNS)
//!   shares the SO_REUSEPORT group; after `stand_aside` new flows go to the other member, what the
//!   fallback had queued is still there to answer; after `release` the group shares again;
//! - the listener addresses on `lo` keep the daemon answering while LocalDNS deletes and
//!   recreates its link, and the fallback never makes that link itself;
//! - the daemon itself, stopped beside a LocalDNS that joined its ports, answers every query a
//!   client sent across the handoff (hand over, drain, detach) and leaves nothing on `lo`.

mod common;

use std::net::{SocketAddr, UdpSocket};

use std::time::{Duration, Instant};

use common::*;
use hickory_proto::rr::RecordType;
use localdns_fallback::listen::{self, Bound};
use localdns_fallback::netlink;

/// Our places in the groups read afresh, as the daemon does before it moves the flows.
fn read_places(held: &mut listen::Held) {
    let mut diag = netlink::Diag::open().unwrap();
    listen::Held::read_places(Some(&mut diag), std::slice::from_mut(held));
}
use nix::sys::signal::Signal;

const LISTENER: &str = "169.254.10.10:53";

fn listener() -> SocketAddr {
    LISTENER.parse().expect("literal")
}

/// A namespace with the listener address on `lo`.
fn node() -> Netns {
    require_root_and_tools(&["ip"]);
    let ns = Netns::new("handoff");
    ns.ip("addr add 169.254.10.10/32 dev lo");
    ns
}

/// Our listener, bound the way the daemon binds it (both sockets non-blocking).
fn bind_ours() -> Bound {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(listen::bind_listener(
        listener(),
        Duration::from_secs(1),
        true,
    ))
    .expect("binds")
}

/// Another process's sockets on the same port with SO_REUSEPORT, as CoreDNS binds them.
fn bind_coredns() -> (UdpSocket, std::net::TcpListener) {
    let (udp, tcp) = bind_like_coredns(listener(), 128);
    udp.set_nonblocking(true).unwrap();
    tcp.set_nonblocking(true).unwrap();
    (udp, tcp)
}

/// Sends `n` datagrams, each from a new socket (a new flow), tagged `tag`.
fn send_flows(n: usize, tag: u8) {
    for i in 0..n {
        let c = UdpSocket::bind("0.0.0.0:0").unwrap();
        c.send_to(&[tag, i as u8], listener()).unwrap();
    }
}

/// Datagrams waiting on `s`, by tag.
fn drain_udp(s: &UdpSocket) -> Vec<u8> {
    // What was sent is queued on one member or the other, and some tests count that nothing
    // reached one: no state says "nothing more will arrive", so a quiet time stands for it.
    std::thread::sleep(Duration::from_millis(50));
    let mut tags = Vec::new();
    let mut buf = [0u8; 16];
    while let Ok(n) = s.recv(&mut buf) {
        if n > 0 {
            tags.push(buf[0]);
        }
    }
    tags
}

/// Opens `n` TCP connections to the listener and returns them (kept open until dropped).
fn connect_flows(n: usize) -> Vec<std::net::TcpStream> {
    (0..n)
        .map(|_| std::net::TcpStream::connect_timeout(&listener(), Duration::from_secs(2)).unwrap())
        .collect()
}

fn accepted(l: &std::net::TcpListener) -> usize {
    // As in `drain_udp`: a quiet time for "no more connections will be queued".
    std::thread::sleep(Duration::from_millis(50));
    let mut n = 0;
    while l.accept().is_ok() {
        n += 1;
    }
    n
}

#[test]
fn steering_keeps_flows_on_the_fallback_until_it_hands_over_then_shares_again() {
    let ns = node();
    ns.enter(|| {
        let mut ours = bind_ours();
        assert_eq!(
            (ours.held.udp.index(), ours.held.tcp.index()),
            (Some(0), Some(0))
        );
        let our_tcp = ours.tcp;
        // LocalDNS starting beside us: bound, in the group.
        let (ld_udp, ld_tcp) = bind_coredns();

        send_flows(200, 1);
        let _c1 = connect_flows(20);
        assert_eq!(
            drain_udp(&ours.udp).len(),
            200,
            "every flow to the fallback"
        );
        assert!(
            drain_udp(&ld_udp).is_empty(),
            "none to the starting LocalDNS"
        );
        assert_eq!((accepted(&our_tcp), accepted(&ld_tcp)), (20, 0));

        // LocalDNS is ready: hand over. Queued before, still ours to answer; new flows go to it.
        send_flows(50, 2);
        read_places(&mut ours.held);
        let handed = ours.held.stand_aside();
        assert!(handed, "LocalDNS is in both groups");
        send_flows(200, 3);
        let _c2 = connect_flows(20);
        let mine = drain_udp(&ours.udp);
        assert_eq!(
            mine,
            vec![2; 50],
            "exactly what was queued before the hand-over"
        );
        assert_eq!(
            drain_udp(&ld_udp),
            vec![3; 200],
            "every new flow to LocalDNS"
        );
        assert_eq!((accepted(&our_tcp), accepted(&ld_tcp)), (0, 20));

        // Released: plain SO_REUSEPORT sharing, both members get flows.
        ours.held.release();
        send_flows(200, 4);
        let (a, b) = (drain_udp(&ours.udp).len(), drain_udp(&ld_udp).len());
        assert_eq!(a + b, 200);
        assert!(a > 20 && b > 20, "shared after release: {a} / {b}");
    });
}

#[test]
fn an_orphan_bound_before_the_fallback_gets_no_flows_while_it_serves() {
    let ns = node();
    ns.enter(|| {
        let (orphan_udp, orphan_tcp) = bind_coredns();
        let ours = bind_ours();
        assert_eq!(
            (ours.held.udp.index(), ours.held.tcp.index()),
            (Some(1), Some(1)),
            "joined after the orphan"
        );
        let our_tcp = ours.tcp;
        send_flows(200, 1);
        let _c = connect_flows(20);
        assert_eq!(drain_udp(&ours.udp).len(), 200);
        assert!(drain_udp(&orphan_udp).is_empty());
        assert_eq!((accepted(&our_tcp), accepted(&orphan_tcp)), (20, 0));
    });
}

#[test]
fn when_the_orphan_exits_the_steering_follows_our_new_place() {
    // The orphan (index 0) exits while we are the last member: the kernel moves us to index 0,
    // and the program still names 1, which a LocalDNS starting next would get. The re-point
    // (`steer_to_us` afresh, as the standby's loop does when a look finds the members changed) sees it.
    let ns = node();
    ns.enter(|| {
        let (orphan_udp, orphan_tcp) = bind_coredns();
        let mut ours = bind_ours();
        let our_tcp = ours.tcp;
        drop((orphan_udp, orphan_tcp));
        read_places(&mut ours.held);
        assert!(ours.held.steer_to_us());
        assert_eq!(
            (ours.held.udp.index(), ours.held.tcp.index()),
            (Some(0), Some(0))
        );
        let (ld_udp, ld_tcp) = bind_coredns();
        send_flows(200, 1);
        let _c = connect_flows(20);
        assert_eq!(
            drain_udp(&ours.udp).len(),
            200,
            "still every flow to the fallback"
        );
        assert!(drain_udp(&ld_udp).is_empty());
        assert_eq!((accepted(&our_tcp), accepted(&ld_tcp)), (20, 0));
    });
}

#[test]
fn a_localdns_restarted_since_our_last_look_gets_the_flows_at_the_hand_over() {
    // A hung LocalDNS's socket (index 0) when we bound (index 1); it closes and the kernel moves
    // us into index 0; the restarted LocalDNS joins at 1; no look ran between (one runs every
    // 30 ms). Handing over with the place known before would point the flows at index 0: us.
    let ns = node();
    ns.enter(|| {
        let (old_udp, old_tcp) = bind_coredns();
        let mut ours = bind_ours();
        assert_eq!(ours.held.udp.index(), Some(1));
        let our_tcp = ours.tcp;
        drop((old_udp, old_tcp));
        let (ld_udp, ld_tcp) = bind_coredns();
        read_places(&mut ours.held);
        let handed = ours.held.stand_aside();
        assert!(handed, "the restarted LocalDNS is in both groups");
        assert_eq!(
            (ours.held.udp.index(), ours.held.tcp.index()),
            (Some(0), Some(0))
        );
        send_flows(200, 1);
        let _c = connect_flows(20);
        assert!(drain_udp(&ours.udp).is_empty(), "a flow stayed with us");
        assert_eq!(drain_udp(&ld_udp).len(), 200);
        assert_eq!((accepted(&our_tcp), accepted(&ld_tcp)), (0, 20));
    });
}

#[test]
fn a_socket_without_so_reuseport_cannot_bind_beside_the_fallback() {
    // What LocalDNS's server meets if it binds without SO_REUSEPORT: the fallback must yield the
    // ports (the units do it before LocalDNS's next start attempt).
    let ns = node();
    ns.enter(|| {
        let _ours = bind_ours();
        let e = UdpSocket::bind(LISTENER).expect_err("the port is shared only with SO_REUSEPORT");
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
    });
}

#[test]
fn loopback_addresses_are_claimed_once_and_released() {
    let ns = Netns::new("lo");
    let addrs = [
        "169.254.10.10".parse().unwrap(),
        "169.254.10.11".parse().unwrap(),
    ];
    ns.enter(|| {
        let first = netlink::claim_on_loopback(&addrs).unwrap();
        assert_eq!(first.added, addrs);
        let again = netlink::claim_on_loopback(&addrs).unwrap();
        assert_eq!((again.added.len(), again.present), (0, addrs.to_vec()));
    });
    let shown = ns.ip("-4 addr show dev lo");
    assert!(
        shown.contains("169.254.10.10/32") && shown.contains("169.254.10.11/32"),
        "{shown}"
    );
    ns.enter(|| {
        netlink::release_from_loopback(&addrs).unwrap();
        netlink::release_from_loopback(&addrs).expect("releasing twice is fine");
    });
    let shown = ns.ip("-4 addr show dev lo");
    assert!(!shown.contains("169.254.10.1"), "{shown}");
}

#[test]
fn the_daemon_keeps_answering_while_localdns_recreates_its_link() {
    let node = Rig::namespaces()
        .upstream(Mode::Normal {
            answer_v4: "10.0.0.1".parse().unwrap(),
        })
        .start();
    let ns = node.node_ns();
    let on_lo = ns.ip("-4 addr show dev lo");
    assert!(
        on_lo.contains("169.254.10.10/32") && on_lo.contains("169.254.10.11/32"),
        "{on_lo}"
    );
    let ask = |l: &str| dig(ns, &[&format!("@{l}"), "+time=1", "+tries=1", "a.example"]);
    // LocalDNS's start: delete the link, (a moment later) recreate it with both addresses.
    ns.ip("link del localdns");
    for l in ["169.254.10.10", "169.254.10.11"] {
        let r = ask(l);
        assert_eq!(r.answers, ["10.0.0.1"], "{l} without the link: {}", r.raw);
    }
    // The fallback does not put the link back: LocalDNS's own `ip link add` must not collide.
    // (The scenario: 1.5 s without the link, in which a fallback that made it would have.)
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !ns.ip("link show").contains("localdns"),
        "the fallback made the link"
    );
    ns.ip("link add localdns type veth peer name localdns-p");
    ns.ip("addr add 169.254.10.10/32 dev localdns");
    ns.ip("addr add 169.254.10.11/32 dev localdns");
    ns.ip("link set localdns up");
    let started = Instant::now();
    for l in ["169.254.10.10", "169.254.10.11"] {
        let r = ask(l);
        assert_eq!(r.answers, ["10.0.0.1"], "{l} with the link back: {}", r.raw);
    }
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn the_daemon_answers_every_query_across_its_handoff_to_a_localdns_that_joined() {
    // Upstream answers come 30 ms late, so queries are in flight at the hand-over.
    let node = Rig::namespaces()
        .upstream(Mode::Delay {
            answer_v4: "10.0.0.1".parse().unwrap(),
            delay: Duration::from_millis(30),
        })
        .start();
    let ns = node.node_ns();
    let localdns = LocalDns::start(ns);
    // Pods asking every 2 ms from new sockets (new flows), each waiting up to 1 s for a reply.
    let path = ns.path();
    let asking = std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let to: SocketAddr = "169.254.10.11:53".parse().unwrap();
        let mut waiting = Vec::new();
        let started = Instant::now();
        let mut id = 0u16;
        while started.elapsed() < Duration::from_millis(800) {
            id += 1;
            let query = make_query("a.example.", RecordType::A, id, None);
            let me = std::thread::spawn(move || {
                udp_exchange(Place::Here, to, &query, Duration::from_secs(1))
            });
            waiting.push(me);
            // Pacing the pods.
            std::thread::sleep(Duration::from_millis(2));
        }
        waiting
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Vec<_>>()
    });
    // The scenario: pods ask for 300 ms before the daemon is stopped.
    std::thread::sleep(Duration::from_millis(300));
    node.fwd.signal(Signal::SIGTERM);
    let status = node.fwd.wait_exit(Duration::from_secs(5)).expect("exits");
    let replies = asking.join().unwrap();
    drop(localdns);
    assert!(status.success(), "{status}: {}", node.fwd.logs());
    let logs = node.fwd.logs();
    assert!(logs.contains("new flows go to LocalDNS"), "{logs}");
    let lost = replies.iter().filter(|r| r.is_none()).count();
    let by_fallback = replies
        .iter()
        .flatten()
        .filter(|r| r.len() > 7 && r[7] > 0)
        .count();
    let by_localdns = replies.len() - lost - by_fallback;
    eprintln!(
        "{} queries across the handoff: {by_fallback} answered by the fallback, {by_localdns} by LocalDNS, {lost} lost",
        replies.len()
    );
    assert_eq!(lost, 0, "queries lost in the handoff");
    assert!(by_fallback > 0 && by_localdns > 0);
    assert!(
        !logs.contains(" WARN ") && !logs.contains(" ERROR "),
        "a plain handoff is nothing to warn about: {logs}"
    );
}
