//! Tests of the test harness itself (tests/common): namespaces, the scripted
//! responder in every mode, dnsmasq, unbound and the client helpers.
//! Needs root: `cargo test --test harness_selftest`.

mod common;
use common::*;

use hickory_proto::op::{MessageType, ResponseCode};
use hickory_proto::rr::{RData, RecordType};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

const ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const FORGED: Ipv4Addr = Ipv4Addr::new(6, 6, 6, 6);

fn netns_list() -> String {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn setup() -> (Topology, Upstream) {
    require_root_and_tools(&["ip", "dig"]);
    let topo = Topology::new();
    let up = topo.add_upstream_ns(true, false);
    (topo, up)
}

#[test]
fn topology_is_built_and_fully_removed() {
    require_root_and_tools(&["ip"]);
    let topo = Topology::new();
    let up1 = topo.add_upstream_ns(true, false);
    let up2 = topo.add_upstream_ns(true, true);
    topo.node.set_resolv_conf("nameserver 169.254.10.10\n");
    let names = [
        topo.node.name.clone(),
        up1.ns.name.clone(),
        up2.ns.name.clone(),
    ];

    let localdns = topo.node.ip("addr show dev localdns");
    assert!(localdns.contains("169.254.10.10/32"), "{localdns}");
    assert!(localdns.contains("169.254.10.11/32"), "{localdns}");
    assert!(
        localdns.contains("state UP") || localdns.contains(",UP"),
        "{localdns}"
    );
    assert!(topo.node.ip("link show dev localdns-p").contains("UP"));
    assert_eq!(up1.v4, Some(Ipv4Addr::new(198, 18, 1, 2)));
    assert_eq!(up1.v6, None);
    assert_eq!(up2.v4, Some(Ipv4Addr::new(198, 18, 2, 2)));
    assert_eq!(up2.v6, Some("fd00:18:2::2".parse().unwrap()));
    assert!(
        topo.node
            .ip("-6 addr show dev up2")
            .contains("fd00:18:2::1/64")
    );
    assert!(up2.ns.ip("addr show dev eth0").contains("198.18.2.2/24"));
    // No interface of ours leaks into the host namespace.
    let host_links = Command::new("ip").args(["link"]).output().unwrap();
    let host_links = String::from_utf8_lossy(&host_links.stdout);
    assert!(!host_links.contains("localdns"), "{host_links}");

    // Sockets made in `enter` live in the namespace: 169.254.10.10 exists
    // only there.
    topo.node
        .enter(|| UdpSocket::bind((LOCALDNS_10, 0)).expect("bind in node ns"));
    assert!(
        UdpSocket::bind((LOCALDNS_10, 0)).is_err(),
        "169.254.10.10 must not exist in the host namespace"
    );

    let listed = netns_list();
    for n in &names {
        assert!(listed.contains(n.as_str()), "{n} not in {listed}");
    }
    assert!(std::path::Path::new(&format!("/etc/netns/{}", topo.node.name)).exists());

    let node_name = topo.node.name.clone();
    drop(topo);
    drop(up1);
    drop(up2);
    let listed = netns_list();
    for n in &names {
        assert!(!listed.contains(n.as_str()), "{n} still in {listed}");
    }
    assert!(!std::path::Path::new(&format!("/etc/netns/{node_name}")).exists());
}

#[test]
fn namespaces_are_removed_when_a_test_panics() {
    require_root_and_tools(&["ip"]);
    let mut name = String::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let topo = Topology::new();
        let _up = topo.add_upstream_ns(true, true);
        name = topo.node.name.clone();
        panic!("deliberate");
    }));
    assert!(result.is_err());
    assert!(!name.is_empty());
    assert!(!netns_list().contains(&name));
}

#[test]
fn responder_normal_answers_and_truncates_to_client_size() {
    let (topo, up) = setup();
    let r = Responder::start(&up.ns, up.sock_v4(), Mode::Normal { answer_v4: ANSWER });
    let server = format!("@{}", up.v4.unwrap());

    let a = dig(&topo.node, &[&server, "MiXeD.Example.", "A"]);
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    assert_eq!(a.answers, vec![ANSWER.to_string()], "{}", a.raw);
    assert_eq!(a.records[0].ttl, 60);
    assert!(
        a.has_flag("qr") && a.has_flag("rd") && a.has_flag("ra"),
        "{:?}",
        a.flags
    );
    // The question comes back with the case it was sent with.
    assert!(a.raw.contains(";MiXeD.Example."), "{}", a.raw);

    let aaaa = dig(&topo.node, &[&server, "a.example.", "AAAA"]);
    assert_eq!(aaaa.status, "NOERROR");
    assert!(aaaa.answers.is_empty(), "{}", aaaa.raw);

    let nx = dig(&topo.node, &[&server, "nx.example.", "A"]);
    assert_eq!(nx.status, "NXDOMAIN", "{}", nx.raw);

    // Big TXT over UDP: TC for dig's default 1232 and for no EDNS (512)...
    for extra in [&[][..], &["+noedns"][..]] {
        let mut args = vec![server.as_str(), "big.example.", "TXT", "+ignore"];
        args.extend_from_slice(extra);
        let tc = dig(&topo.node, &args);
        assert_eq!(tc.status, "NOERROR", "{}", tc.raw);
        assert!(tc.has_flag("tc"), "{}", tc.raw);
        assert!(tc.answers.is_empty(), "{}", tc.raw);
    }
    // ...full when the client allows it, and over TCP.
    let udp_full = dig(
        &topo.node,
        &[&server, "big.example.", "TXT", "+ignore", "+bufsize=4096"],
    );
    assert!(!udp_full.has_flag("tc"), "{}", udp_full.raw);
    let tcp = dig(&topo.node, &[&server, "big.example.", "TXT", "+tcp"]);
    assert_eq!(tcp.status, "NOERROR", "{}", tcp.raw);
    assert!(!tcp.has_flag("tc"));
    assert_eq!(tcp.answers.len(), 1, "{}", tcp.raw);
    for s in big_txt_strings() {
        assert!(
            tcp.answers[0].contains(&s),
            "missing a string in {}",
            tcp.raw
        );
    }
    assert!(tcp.msg_size.unwrap() > 4000, "{:?}", tcp.msg_size);
    assert!(r.tcp_queries() >= 1);
    let udp_before = r.udp_queries();
    assert!(udp_before >= 6, "{udp_before}");

    // Garbage and responses sent to it are counted and survived.
    udp_send(&topo.node, r.addr(), &[0xde, 0xad]);
    udp_send(&topo.node, r.addr(), &[0u8; 40]);
    let mut response = make_query("x.example.", RecordType::A, 7, None);
    response[2] |= 0x80;
    assert_eq!(
        udp_exchange(&topo.node, r.addr(), &response, Duration::from_millis(200)),
        None
    );
    let again = dig(&topo.node, &[&server, "again.example."]);
    assert_eq!(again.answers, vec![ANSWER.to_string()], "{}", again.raw);
    assert_eq!(r.udp_queries(), udp_before + 4);

    // Several queries pipelined on one TCP connection, answered in order.
    let frames: Vec<Vec<u8>> = (1..=3)
        .map(|id| make_query(&format!("q{id}.example."), RecordType::A, id, None))
        .collect();
    let replies = tcp_exchange(&topo.node, r.addr(), &frames, Duration::from_secs(2));
    assert_eq!(replies.len(), 3);
    for (i, reply) in replies.iter().enumerate() {
        let msg = parse_message(reply).expect("reply parses");
        assert_eq!(msg.id(), i as u16 + 1);
        assert_eq!(msg.answers().len(), 1);
    }
    // A raw query with EDNS gets an OPT back.
    let q = make_query("e.example.", RecordType::A, 99, Some(1232));
    let reply = udp_exchange(&topo.node, r.addr(), &q, Duration::from_secs(1)).expect("reply");
    let msg = parse_message(&reply).unwrap();
    assert!(msg.extensions().is_some());
    assert_eq!(msg.message_type(), MessageType::Response);
}

#[test]
fn kdig_output_is_parsed_too() {
    require_root_and_tools(&["kdig"]);
    let (topo, up) = setup();
    let _r = Responder::start(&up.ns, up.sock_v4(), Mode::Normal { answer_v4: ANSWER });
    let server = format!("@{}", up.v4.unwrap());
    let a = kdig(&topo.node, &[&server, "k.example.", "A"]);
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    assert_eq!(a.answers, vec![ANSWER.to_string()], "{}", a.raw);
    assert!(a.has_flag("qr"), "{}", a.raw);
    let nx = kdig(&topo.node, &[&server, "nx.example.", "A"]);
    assert_eq!(nx.status, "NXDOMAIN", "{}", nx.raw);
}

#[test]
fn responder_silent_counts_and_never_answers() {
    let (topo, up) = setup();
    let r = Responder::start(&up.ns, up.sock_v4(), Mode::Silent);
    let server = format!("@{}", up.v4.unwrap());
    let res = dig(&topo.node, &[&server, "s.example.", "+time=1"]);
    assert_eq!(res.status, "TIMEOUT", "{}", res.raw);
    assert!(res.no_reply());
    assert!(
        res.elapsed >= Duration::from_millis(900),
        "{:?}",
        res.elapsed
    );
    let tcp = dig(&topo.node, &[&server, "s.example.", "+time=1", "+tcp"]);
    assert_eq!(tcp.status, "TIMEOUT", "{}", tcp.raw);
    assert_eq!(r.udp_queries(), 1);
    assert_eq!(r.tcp_queries(), 1);
    assert_eq!(r.queries(), 2);
}

#[test]
fn nothing_listening_is_connection_refused() {
    let (topo, up) = setup();
    let server = format!("@{}", up.v4.unwrap());
    let res = dig(&topo.node, &[&server, "r.example."]);
    assert_eq!(res.status, "CONNREFUSED", "{}", res.raw);
    assert!(res.elapsed < Duration::from_secs(2), "{:?}", res.elapsed);
}

/// Every datagram reaching a socket within `window` of the first one, which may take up to 5 s
/// after sending `query`: on a loaded machine the responder's threads were held off past a 1 s
/// window from the send, and the verdict is what arrives, not when.
fn collect_udp(
    ns: &Netns,
    to: SocketAddr,
    query: &[u8],
    window: Duration,
) -> Vec<(SocketAddr, Vec<u8>)> {
    ns.enter(|| {
        let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        sock.send_to(query, to).unwrap();
        let mut deadline = Instant::now() + Duration::from_secs(5);
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if left.is_zero() {
                break;
            }
            sock.set_read_timeout(Some(left)).unwrap();
            match sock.recv_from(&mut buf) {
                Ok((n, from)) => {
                    if got.is_empty() {
                        deadline = Instant::now() + window;
                    }
                    got.push((from, buf[..n].to_vec()));
                }
                Err(_) => break,
            }
        }
        got
    })
}

fn first_a(msg: &hickory_proto::op::Message) -> Option<Ipv4Addr> {
    msg.answers().iter().find_map(|r| match r.data() {
        RData::A(a) => Some(a.0),
        _ => None,
    })
}

#[test]
fn responder_spoof_sends_each_forgery_then_the_real_reply() {
    let (topo, up) = setup();
    let alt = up.alt_v4.unwrap();
    let r = Responder::start(
        &up.ns,
        up.sock_v4(),
        Mode::Spoof {
            answer_v4: ANSWER,
            forged_v4: FORGED,
            alt_src: Some(IpAddr::V4(alt)),
        },
    );
    let id = 0x1234;
    let query = make_query("Spoof.Example.", RecordType::A, id, None);
    let got = collect_udp(&topo.node, r.addr(), &query, Duration::from_secs(3));
    assert_eq!(got.len(), 6, "{got:?}");

    let from_server: Vec<_> = got.iter().filter(|(from, _)| *from == r.addr()).collect();
    let other_port: Vec<_> = got
        .iter()
        .filter(|(from, _)| from.ip() == r.addr().ip() && from.port() != r.addr().port())
        .collect();
    let other_ip: Vec<_> = got
        .iter()
        .filter(|(from, _)| *from == SocketAddr::new(IpAddr::V4(alt), 53))
        .collect();
    assert_eq!(
        (from_server.len(), other_port.len(), other_ip.len()),
        (4, 1, 1)
    );

    let msgs: Vec<_> = from_server
        .iter()
        .map(|(_, b)| parse_message(b).unwrap())
        .collect();
    // (a) wrong ID
    assert_ne!(msgs[0].id(), id);
    assert_eq!(first_a(&msgs[0]), Some(FORGED));
    // (b) another question
    assert_eq!(msgs[1].id(), id);
    assert_ne!(msgs[1].queries()[0].name().to_ascii(), "Spoof.Example.");
    // (d) QR=0
    assert_eq!(msgs[2].id(), id);
    assert_eq!(msgs[2].message_type(), MessageType::Query);
    assert_eq!(first_a(&msgs[2]), Some(FORGED));
    // the real one, last
    assert_eq!(msgs[3].id(), id);
    assert_eq!(msgs[3].message_type(), MessageType::Response);
    assert_eq!(msgs[3].queries()[0].name().to_ascii(), "Spoof.Example.");
    assert_eq!(first_a(&msgs[3]), Some(ANSWER));
    // (c) and (e): right ID and question, forged answer, wrong source
    for (_, b) in other_port.iter().chain(other_ip.iter()) {
        let m = parse_message(b).unwrap();
        assert_eq!(m.id(), id);
        assert_eq!(m.message_type(), MessageType::Response);
        assert_eq!(first_a(&m), Some(FORGED));
    }
    // The real reply comes last, after the pause.
    assert_eq!(got.last().unwrap().0, r.addr());
    assert_eq!(r.udp_queries(), 1);

    // TCP gets the real answer only.
    let tcp = dig(
        &topo.node,
        &[&format!("@{}", up.v4.unwrap()), "t.example.", "+tcp"],
    );
    assert_eq!(tcp.answers, vec![ANSWER.to_string()], "{}", tcp.raw);
}

#[test]
fn responder_oversize_never_truncates() {
    let (topo, up) = setup();
    let _r = Responder::start(&up.ns, up.sock_v4(), Mode::Oversize { answer_v4: ANSWER });
    let server = format!("@{}", up.v4.unwrap());
    let q = make_query("big.example.", RecordType::TXT, 5, None);
    let reply = udp_exchange(&topo.node, up.sock_v4(), &q, Duration::from_secs(3))
        .expect("a 4 KB reply over UDP");
    assert!(reply.len() > 4000, "{}", reply.len());
    let msg = parse_message(&reply).unwrap();
    assert!(!msg.truncated());
    assert_eq!(msg.answers().len(), 1);
    let a = dig(&topo.node, &[&server, "o.example."]);
    assert_eq!(a.answers, vec![ANSWER.to_string()]);
}

#[test]
fn responder_garbage_answers_with_noise() {
    let (topo, up) = setup();
    let r = Responder::start(&up.ns, up.sock_v4(), Mode::Garbage);
    let id = 0x4242;
    let q = make_query("g.example.", RecordType::A, id, None);
    // 3 s from the first: in a full parallel run the responder's thread was once held off past
    // 1 s between its two sends.
    let got = collect_udp(&topo.node, r.addr(), &q, Duration::from_secs(3));
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].1.len() < 2 || got[0].1[..2] != id.to_be_bytes());
    let second = &got[1].1;
    assert_eq!(second[..2], id.to_be_bytes());
    assert_eq!(second[2] & 0x80, 0, "QR must be 0");
    let tcp = tcp_exchange(&topo.node, r.addr(), &[q], Duration::from_secs(1));
    assert_eq!(tcp.len(), 1);
    // dig gets nothing usable.
    let res = dig(
        &topo.node,
        &[&format!("@{}", up.v4.unwrap()), "g.example.", "+time=1"],
    );
    assert!(res.answers.is_empty(), "{}", res.raw);
}

#[test]
fn responder_delay_answers_late() {
    let (topo, up) = setup();
    let delay = Duration::from_millis(400);
    let _r = Responder::start(
        &up.ns,
        up.sock_v4(),
        Mode::Delay {
            answer_v4: ANSWER,
            delay,
        },
    );
    let server = format!("@{}", up.v4.unwrap());
    for extra in ["+notcp", "+tcp"] {
        let res = dig(&topo.node, &[&server, "d.example.", extra]);
        assert_eq!(res.answers, vec![ANSWER.to_string()], "{}", res.raw);
        // dig reports whole milliseconds, measured from its own send: 399 ms happens.
        assert!(
            res.elapsed + Duration::from_millis(5) >= delay,
            "{:?}",
            res.elapsed
        );
    }
    // Dropping a responder with a reply still pending returns promptly.
    let r2 = Responder::start(
        &up.ns,
        SocketAddr::new(up.v4.unwrap().into(), 5353),
        Mode::Delay {
            answer_v4: ANSWER,
            delay: Duration::from_secs(30),
        },
    );
    udp_send(
        &topo.node,
        r2.addr(),
        &make_query("d.example.", RecordType::A, 1, None),
    );
    assert!(poll_until(Duration::from_secs(2), || (r2.queries() == 1).then_some(())).is_some());
    let t = Instant::now();
    drop(r2);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn ipv6_upstream_works() {
    require_root_and_tools(&["ip", "dig"]);
    let topo = Topology::new();
    let up = topo.add_upstream_ns(false, true);
    assert_eq!(up.v4, None);
    let r = Responder::start(&up.ns, up.sock_v6(), Mode::Normal { answer_v4: ANSWER });
    let server = format!("@{}", up.v6.unwrap());
    let udp = dig(&topo.node, &[&server, "six.example."]);
    assert_eq!(udp.answers, vec![ANSWER.to_string()], "{}", udp.raw);
    let tcp = dig(&topo.node, &[&server, "six.example.", "+tcp"]);
    assert_eq!(tcp.answers, vec![ANSWER.to_string()], "{}", tcp.raw);
    assert_eq!((r.udp_queries(), r.tcp_queries()), (1, 1));
}

#[test]
fn getent_uses_the_namespace_resolv_conf() {
    require_root_and_tools(&["ip", "getent"]);
    let (topo, up) = setup();
    let r = Responder::start(&up.ns, up.sock_v4(), Mode::Normal { answer_v4: ANSWER });
    topo.node.set_resolv_conf(&format!(
        "nameserver {}\noptions timeout:1 attempts:1\n",
        up.v4.unwrap()
    ));
    assert_eq!(
        getent_hosts(&topo.node, "host.example"),
        Some(ANSWER.to_string())
    );
    assert_eq!(getent_hosts(&topo.node, "nx.example"), None);
    assert!(r.queries() >= 2);
}

#[test]
fn dnsmasq_serves_records_and_wildcards_on_v4_and_v6() {
    require_root_and_tools(&["ip", "dig", "dnsmasq"]);
    let topo = Topology::new();
    let up = topo.add_upstream_ns(true, true);
    let v6_answer: Ipv6Addr = "fd00:99::1".parse().unwrap();
    let dm = Dnsmasq::start_with(
        &up.ns,
        &[up.sock_v4(), up.sock_v6()],
        &[
            ("host.example.com", ANSWER.into()),
            ("host.example.com", v6_answer.into()),
        ],
        &[("wild.example.net", Ipv4Addr::new(10, 2, 2, 2).into())],
        &[],
    );
    for server in [
        format!("@{}", up.v4.unwrap()),
        format!("@{}", up.v6.unwrap()),
    ] {
        let a = dig(&topo.node, &[&server, "host.example.com", "A"]);
        assert_eq!(a.status, "NOERROR", "{}", a.raw);
        assert_eq!(a.answers, vec![ANSWER.to_string()], "{}", a.raw);
        assert_eq!(a.records[0].ttl, DNSMASQ_LOCAL_TTL);
        let aaaa = dig(&topo.node, &[&server, "host.example.com", "AAAA"]);
        assert_eq!(aaaa.answers, vec![v6_answer.to_string()], "{}", aaaa.raw);
        let wild = dig(&topo.node, &[&server, "deep.down.wild.example.net", "+tcp"]);
        assert_eq!(wild.answers, vec!["10.2.2.2".to_string()], "{}", wild.raw);
        let unknown = dig(&topo.node, &[&server, "unknown.example.org"]);
        assert_eq!(unknown.status, "REFUSED", "{}", unknown.raw);
    }
    let pid = dm.pid();
    drop(dm);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());

    // The short form.
    let _dm = Dnsmasq::start(&up.ns, up.sock_v4(), &[("one.test", ANSWER.into())]);
    let a = dig(&topo.node, &[&format!("@{}", up.v4.unwrap()), "one.test"]);
    assert_eq!(a.answers, vec![ANSWER.to_string()], "{}", a.raw);
}

#[test]
fn unbound_serves_local_data_and_a_big_txt() {
    require_root_and_tools(&["ip", "dig", "unbound"]);
    let (topo, up) = setup();
    let mut data = vec![
        "a.example. 60 IN A 10.0.0.1".to_string(),
        "b.example. 300 IN AAAA fd00::b".to_string(),
        // One record of 12 strings, and an RRset of 12 one-string records.
        unbound_big_txt("big.example.", 12, 250),
    ];
    data.extend(unbound_txt_rrset("set.example.", 12, 250));
    let data: Vec<&str> = data.iter().map(String::as_str).collect();
    let ub = Unbound::start(&up.ns, up.sock_v4(), &data);
    let server = format!("@{}", up.v4.unwrap());
    let a = dig(&topo.node, &[&server, "a.example."]);
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    assert_eq!(a.answers, vec!["10.0.0.1".to_string()], "{}", a.raw);
    let aaaa = dig(&topo.node, &[&server, "b.example.", "AAAA"]);
    assert_eq!(aaaa.answers, vec!["fd00::b".to_string()], "{}", aaaa.raw);
    let nx = dig(&topo.node, &[&server, "nope.example."]);
    assert_eq!(nx.status, "NXDOMAIN", "{}", nx.raw);

    for (name, records) in [("big.example.", 1), ("set.example.", 12)] {
        let tc = dig(&topo.node, &[&server, name, "TXT", "+ignore"]);
        assert_eq!(tc.status, "NOERROR", "{}", tc.raw);
        assert!(tc.has_flag("tc"), "{}", tc.raw);
        assert!(tc.answers.is_empty(), "{}", tc.raw);
        let full = dig(&topo.node, &[&server, name, "TXT", "+tcp"]);
        assert!(!full.has_flag("tc"), "{}", full.raw);
        assert_eq!(full.answers.len(), records, "{}", full.raw);
        for i in 0..12 {
            assert!(
                full.answers
                    .iter()
                    .any(|a| a.contains(&format!("\"{i:02}"))),
                "string {i} missing: {}",
                full.raw
            );
        }
        assert!(full.msg_size.unwrap() > 3000, "{:?}", full.msg_size);
        // Without +ignore dig itself falls back to TCP.
        let auto = dig(&topo.node, &[&server, name, "TXT"]);
        assert_eq!(auto.answers.len(), records, "{}", auto.raw);
    }

    let pid = ub.pid();
    let conf = ub.config_path();
    assert!(conf.exists());
    drop(ub);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(!conf.exists(), "temp dir must be removed");
}

#[test]
fn unbound_with_custom_zones_on_v6() {
    require_root_and_tools(&["ip", "dig", "unbound"]);
    let topo = Topology::new();
    let up = topo.add_upstream_ns(false, true);
    let _ub = Unbound::start_with(
        &up.ns,
        &[up.sock_v6()],
        &["corp.test."],
        &["www.corp.test. 30 IN A 10.3.3.3"],
        "",
    );
    let res = dig(
        &topo.node,
        &[&format!("@{}", up.v6.unwrap()), "www.corp.test."],
    );
    assert_eq!(res.answers, vec!["10.3.3.3".to_string()], "{}", res.raw);
    assert_eq!(res.records[0].ttl, 30);
}

#[test]
fn dig_output_parser() {
    let raw = "\
; <<>> DiG 9.18 <<>> @1.2.3.4 x.example
;; Got answer:
;; ->>HEADER<<- opcode: QUERY, status: SERVFAIL, id: 1
;; flags: qr rd ra tc; QUERY: 1, ANSWER: 2, AUTHORITY: 0, ADDITIONAL: 1

;; OPT PSEUDOSECTION:
; EDNS: version: 0, flags:; udp: 1232
;; QUESTION SECTION:
;x.example.\t\t\tIN\tA

;; ANSWER SECTION:
x.example.\t\t60\tIN\tA\t10.0.0.1
x.example.\t\t60\tIN\tTXT\t\"a b\" \"c\"

;; MSG SIZE  rcvd: 58
"
    .to_string();
    let r = DigResult::parse(raw, Duration::ZERO);
    assert_eq!(r.status, "SERVFAIL");
    assert_eq!(r.flags, vec!["qr", "rd", "ra", "tc"]);
    assert_eq!(r.answers, vec!["10.0.0.1", "\"a b\" \"c\""]);
    assert_eq!(r.records[1].rtype, "TXT");
    assert_eq!(r.msg_size, Some(58));
    let timeout = DigResult::parse(
        ";; connection timed out; no servers could be reached\n".into(),
        Duration::ZERO,
    );
    assert_eq!(timeout.status, "TIMEOUT");
    assert!(timeout.no_reply());
    let _ = ResponseCode::NoError; // hickory types re-exported for tests
}

#[test]
fn servers_and_namespaces_are_cleaned_up_when_a_test_panics() {
    require_root_and_tools(&["ip", "dig", "dnsmasq", "unbound"]);
    let mut names = Vec::new();
    let mut pids = Vec::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let topo = Topology::new();
        let up = topo.add_upstream_ns(true, true);
        names.extend([topo.node.name.clone(), up.ns.name.clone()]);
        let dm = Dnsmasq::start(&up.ns, up.sock_v4(), &[("x.test", ANSWER.into())]);
        let ub = Unbound::start(&up.ns, up.sock_v6(), &[]);
        let _r = Responder::start(
            &up.ns,
            SocketAddr::new(up.v4.unwrap().into(), 5300),
            Mode::Normal { answer_v4: ANSWER },
        );
        pids.extend([dm.pid(), ub.pid()]);
        // A TCP query makes dnsmasq fork a helper process.
        let r = dig(
            &topo.node,
            &[&format!("@{}", up.v4.unwrap()), "x.test", "+tcp"],
        );
        assert_eq!(r.answers, vec![ANSWER.to_string()], "{}", r.raw);
        panic!("deliberate");
    }));
    assert!(result.is_err());
    let listed = netns_list();
    for n in &names {
        assert!(!listed.contains(n.as_str()), "{n} still in {listed}");
    }
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{pid} alive"
        );
    }
}

#[test]
fn spoof_without_alt_src_skips_forgery_e() {
    let (topo, up) = setup();
    let r = Responder::start(
        &up.ns,
        up.sock_v4(),
        Mode::Spoof {
            answer_v4: ANSWER,
            forged_v4: FORGED,
            alt_src: None,
        },
    );
    let q = make_query("n.example.", RecordType::A, 77, None);
    let got = collect_udp(&topo.node, r.addr(), &q, Duration::from_secs(1));
    assert_eq!(got.len(), 5, "{got:?}");
    let d = dig(&topo.node, &[&format!("@{}", up.v4.unwrap()), "n.example."]);
    // dig skips (a), (b) and (c) but takes the QR=0 forgery (d) as its
    // reply: a Spoof responder tests the forwarder, never dig directly.
    assert!(!d.has_flag("qr"), "{}", d.raw);
    assert_eq!(d.answers, vec![FORGED.to_string()], "{}", d.raw);
}

// ---- the load harness (loadtest/) counts honestly --------------------------------------------

/// Builds the load harness's binaries (a workspace of its own, debug: these checks send a few
/// hundred queries) and returns the directory they are in.
fn loadtest_bins() -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--locked", "--bins", "--manifest-path"])
        .arg(root.join("loadtest/Cargo.toml"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "building loadtest/ failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    root.join("loadtest/target/debug")
}

/// A process of the load harness, killed and reaped when dropped.
struct Spawned(std::process::Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A number field of the generator's JSON line.
fn json_num(line: &str, key: &str) -> u64 {
    let at = line
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    line[at + key.len() + 3..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {line}"))
}

/// `dnsload` in `ns` with `args`; its stdout, trimmed.
fn dnsload(bins: &std::path::Path, ns: &Netns, args: &[&str]) -> String {
    let out = ns
        .exec(bins.join("dnsload"), args)
        .output()
        .expect("dnsload runs");
    assert!(
        out.status.success(),
        "dnsload {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// 100 fresh names through `server`: the generator's JSON line.
fn burst(bins: &std::path::Path, ns: &Netns, server: SocketAddr) -> String {
    let server = server.to_string();
    dnsload(
        bins,
        ns,
        &[
            "run",
            "--server",
            &server,
            "--channels",
            "1",
            "--names",
            "miss",
            "--rate",
            "200",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--timeout",
            "1",
        ],
    )
}

/// A reply counts as good only when it is the upstream's answer for that name, and the
/// responder's query counter shows what really reached it: unbound answering `load.test.` from
/// its built-in `test.` zone (RFC 6761) and an upstream giving every name one address are both
/// caught, and unbound told to forward `test.` passes.
#[test]
fn load_harness_counts_only_the_upstreams_answers() {
    require_root_and_tools(&["ip", "unbound"]);
    let bins = loadtest_bins();
    let (topo, up) = setup();
    let upstream = up.sock_v4();
    let _responder = Spawned(
        up.ns
            .exec(
                bins.join("responder"),
                ["--listen", &upstream.to_string(), "--threads", "1"],
            )
            .spawn()
            .expect("responder starts"),
    );
    dnsload(
        &bins,
        &topo.node,
        &["probe", "--server", &upstream.to_string()],
    );
    let count = || -> u64 {
        dnsload(
            &bins,
            &topo.node,
            &["count", "--server", &upstream.to_string()],
        )
        .parse()
        .expect("a count")
    };

    // Direct: every answer good, and the responder saw every query.
    let before = count();
    let line = burst(&bins, &topo.node, upstream);
    let sent = json_num(&line, "sent");
    assert!(sent >= 90, "{line}");
    assert_eq!(json_num(&line, "good"), sent, "{line}");
    assert_eq!(json_num(&line, "wrong_answer"), 0, "{line}");
    assert_eq!(count() - before, sent);

    // An upstream that gives every name the same address: NOERROR, but not the answer.
    let fixed = SocketAddr::new(upstream.ip(), 5353);
    let _r = Responder::start(&up.ns, fixed, Mode::Normal { answer_v4: ANSWER });
    let line = burst(&bins, &topo.node, fixed);
    assert_eq!(json_num(&line, "good"), 0, "{line}");
    assert_eq!(
        json_num(&line, "wrong_answer"),
        json_num(&line, "sent"),
        "{line}"
    );

    // unbound forwarding "." to the responder answers `test.` itself unless told not to.
    let forward = format!(
        "forward-zone:\nname: \".\"\nforward-addr: {}@53",
        upstream.ip()
    );
    for (nodefault, forwards) in [("", false), ("local-zone: \"test.\" nodefault", true)] {
        let ub = Unbound::start_with(
            &topo.node,
            &[dns53(LOCALDNS_11)],
            &[],
            &[],
            &format!("{nodefault}\n{forward}"),
        );
        let before = count();
        let line = burst(&bins, &topo.node, SocketAddr::new(LOCALDNS_11.into(), 53));
        let (sent, saw) = (json_num(&line, "sent"), count() - before);
        if forwards {
            assert_eq!(json_num(&line, "good"), sent, "{line}\n{}", ub.logs());
            assert!(saw >= sent, "the responder saw {saw} of {sent}");
        } else {
            assert_eq!(json_num(&line, "good"), 0, "{line}");
            assert_eq!(json_num(&line, "nxdomain"), sent, "{line}");
            assert_eq!(
                saw, 0,
                "unbound answered alone, yet the responder saw {saw}"
            );
        }
    }
}
