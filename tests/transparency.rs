//! Transparent on the wire: each client gets the answer the upstream would have given it.
//!
//! A differential test: a battery of queries varied in every way a client can vary them, each
//! sent through both listeners (twice, so the second can come from the cache) and straight to
//! the upstream behind that listener, with the same bytes; every answer is compared with the
//! upstream's own. The upstreams are real: knot serving a DNSSEC-signed zone (kube-dns, the
//! cluster listener) and unbound resolving it (the VNet DNS, the node listener). And real libc
//! clients, glibc and a static musl, against a stand-in that truncates like CoreDNS.
//! Run as root; every namespace and process is removed on drop.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsCode, EdnsOption};
use hickory_proto::rr::{DNSClass, Name, Record, RecordType};
use rand::{Rng, SeedableRng};

const NODE: &str = "169.254.10.10";
const CLUSTER: &str = "169.254.10.11";
const ZONE: &str = "transp.test.";
const WAIT: Duration = Duration::from_secs(3);

/// The signed zone knot serves: big RRsets, CNAME chains, a wildcard, an unknown type.
fn zone_text() -> String {
    let mut z = String::from(concat!(
        "$ORIGIN transp.test.\n",
        "$TTL 300\n",
        "@ SOA ns hostmaster 1 3600 600 86400 60\n",
        "@ NS ns\n",
        "ns A 198.18.1.2\n",
        "www A 192.0.2.1\n",
        "www AAAA 2001:db8::1\n",
        "www MX 10 mail\n",
        "mail A 192.0.2.25\n",
        "alias CNAME www\n",
        "chain1 CNAME chain2\n",
        "chain2 CNAME chain3\n",
        "chain3 CNAME www\n",
        "*.wild A 192.0.2.9\n",
        "*.wild TXT \"wild\"\n",
        "unk TYPE65280 \\# 4 01020304\n",
    ));
    for i in 0..100 {
        z.push_str(&format!("big A 10.9.{}.{}\n", i / 200, i % 200 + 1));
    }
    for i in 0..30 {
        z.push_str(&format!("txt TXT \"{i:02}{}\"\n", "t".repeat(60)));
    }
    z
}

/// One query of the battery.
#[derive(Clone, Debug)]
struct Spec {
    id: u16,
    name: String,
    qtype: RecordType,
    class: DNSClass,
    rd: bool,
    ad: bool,
    cd: bool,
    /// EDNS: UDP size, DO, version, options.
    edns: Option<(u16, bool, u8, Vec<EdnsOption>)>,
}

impl Spec {
    fn dnssec_ok(&self) -> bool {
        self.edns.as_ref().is_some_and(|e| e.1)
    }
}

fn query_bytes(s: &Spec) -> Vec<u8> {
    let mut m = Message::new();
    let name = Name::from_ascii(&s.name).expect("battery names are valid");
    let mut q = Query::query(name, s.qtype);
    q.set_query_class(s.class);
    m.set_id(s.id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(s.rd)
        .set_authentic_data(s.ad)
        .set_checking_disabled(s.cd)
        .add_query(q);
    if let Some((size, dnssec_ok, version, options)) = &s.edns {
        let mut e = Edns::new();
        e.set_max_payload(*size)
            .set_dnssec_ok(*dnssec_ok)
            .set_version(*version);
        for o in options {
            e.options_mut().insert(o.clone());
        }
        m.set_edns(e);
    }
    m.to_vec().expect("encode query")
}

/// The records of a section, TTLs aside, names lower-cased: RRsets compared as sets.
fn rrs(records: &[Record]) -> BTreeSet<String> {
    records
        .iter()
        .filter(|r| r.record_type() != RecordType::OPT)
        .map(|r| {
            let mut r = r.clone();
            r.set_ttl(0);
            r.to_string().to_ascii_lowercase()
        })
        .collect()
}

fn has_option(m: &Message, code: EdnsCode) -> bool {
    m.extensions()
        .as_ref()
        .is_some_and(|e| e.option(code).is_some())
}

/// Compares our answer to `s` (sent as `query`) with the upstream's own (`theirs`) and the
/// upstream's whole answer over TCP (`full`); returns what differs.
fn differences(s: &Spec, query: &[u8], ours: &[u8], theirs: &[u8], full: &[u8]) -> Vec<String> {
    let mut d = Vec::new();
    let (Ok(o), Ok(t), Ok(f)) = (
        Message::from_vec(ours),
        Message::from_vec(theirs),
        Message::from_vec(full),
    ) else {
        return vec!["an answer does not parse".into()];
    };
    let qlen = query.len() - opt_len(query);
    if o.id() != s.id {
        d.push(format!("ID {} instead of {}", o.id(), s.id));
    }
    if ours.get(12..qlen) != query.get(12..qlen) {
        d.push("question not as asked".into());
    }
    if o.response_code() != t.response_code() {
        d.push(format!(
            "rcode {} vs {}",
            o.response_code(),
            t.response_code()
        ));
    }
    if o.recursion_desired() != s.rd || o.checking_disabled() != s.cd {
        d.push("RD/CD not as asked".into());
    }
    if o.authentic_data() != t.authentic_data() {
        d.push(format!(
            "AD {} vs {}",
            o.authentic_data(),
            t.authentic_data()
        ));
    }
    if o.authoritative() != t.authoritative() || o.recursion_available() != t.recursion_available()
    {
        d.push("AA/RA differ".into());
    }
    match (o.extensions(), t.extensions()) {
        (Some(oe), Some(te)) => {
            if oe.flags().dnssec_ok != s.dnssec_ok() || oe.version() != te.version() {
                d.push("OPT DO/version differ".into());
            }
        }
        (None, None) => {}
        _ => d.push("OPT presence differs".into()),
    }
    if has_option(&o, EdnsCode::Cookie) {
        d.push("a COOKIE in our answer".into());
    }
    let asked_ecs = s
        .edns
        .as_ref()
        .is_some_and(|e| e.3.iter().any(|o| matches!(o, EdnsOption::Subnet(_))));
    if has_option(&o, EdnsCode::Subnet) && !asked_ecs {
        d.push("someone else's ECS".into());
    }
    let sections = |m: &Message| (rrs(m.answers()), rrs(m.name_servers()));
    let (oa, on) = sections(&o);
    if o.truncated() || t.truncated() {
        let (fa, fnn) = sections(&f);
        if !oa.is_subset(&fa) || !on.is_subset(&fnn) {
            d.push("cut answer holds records the upstream's whole answer lacks".into());
        }
        // The upstream leg advertises 1232 bytes; an asker that takes more must still get the
        // whole answer (the engine fetches it over TCP).
        if o.truncated() && !t.truncated() {
            d.push("TC where the upstream fitted the answer".into());
        }
        if oa.is_empty() && !o.answers().is_empty() {
            d.push("empty".into());
        }
    } else if (oa.clone(), on.clone()) != sections(&t)
        || rrs(o.additionals()) != rrs(t.additionals())
    {
        d.push(format!(
            "records differ:\n ours   {:?} {:?}\n theirs {:?} {:?}",
            oa,
            on,
            rrs(t.answers()),
            rrs(t.name_servers())
        ));
    }
    // TTLs: never above the upstream's (a second of rounding aside), never 0 unless its is.
    let ttl_of = |m: &Message| -> Vec<(String, u32)> {
        m.answers()
            .iter()
            .chain(m.name_servers())
            .map(|r| {
                let mut c = r.clone();
                c.set_ttl(0);
                (c.to_string().to_ascii_lowercase(), r.ttl())
            })
            .collect()
    };
    let theirs_ttl = ttl_of(&f).into_iter().chain(ttl_of(&t)).collect::<Vec<_>>();
    for (rr, ttl) in ttl_of(&o) {
        if let Some((_, up)) = theirs_ttl.iter().find(|(r, _)| *r == rr) {
            if ttl > up + 1 || (ttl == 0 && *up != 0) {
                d.push(format!("TTL {ttl} where the upstream says {up}: {rr}"));
            }
        }
    }
    d
}

/// Length of the OPT record at the end of a query built by [`query_bytes`] (0 without).
fn opt_len(query: &[u8]) -> usize {
    if query.len() < 12 || query[11] == 0 {
        return 0;
    }
    // The OPT record is last: root name, type, class, TTL, RDLENGTH and RDATA.
    let mut at = 12;
    while query[at] != 0 {
        at += 1 + usize::from(query[at]);
    }
    let opt_start = at + 5;
    query.len() - opt_start
}

/// The battery: every name and type crossed with client profiles, in deterministic 0x20 case.
fn battery() -> Vec<Spec> {
    let names: &[(&str, RecordType)] = &[
        ("www", RecordType::A),
        ("www", RecordType::AAAA),
        ("www", RecordType::MX),
        ("big", RecordType::A),
        ("txt", RecordType::TXT),
        ("alias", RecordType::A),
        ("alias", RecordType::MX),
        ("chain1", RecordType::AAAA),
        ("chain1", RecordType::TXT),
        ("nx", RecordType::A),
        ("x.wild", RecordType::A),
        ("y.wild", RecordType::TXT),
        ("unk", RecordType::Unknown(65280)),
        ("www", RecordType::Unknown(65280)),
        ("", RecordType::DNSKEY),
        ("", RecordType::ANY),
        ("", RecordType::SOA),
    ];
    let ecs = EdnsOption::Subnet(ClientSubnet::new(
        "192.0.2.0".parse().expect("literal"),
        24,
        0,
    ));
    let cookie = EdnsOption::Unknown(u16::from(EdnsCode::Cookie), vec![7, 1, 7, 2, 7, 3, 7, 4]);
    let unknown = EdnsOption::Unknown(65001, b"hello".to_vec());
    type Profile = (bool, bool, bool, Option<(u16, bool, u8, Vec<EdnsOption>)>);
    let profiles: Vec<Profile> = vec![
        (true, false, false, None),
        (false, false, false, None),
        (true, false, false, Some((512, false, 0, vec![]))),
        (true, false, false, Some((1232, true, 0, vec![]))),
        (true, false, true, Some((4096, true, 0, vec![]))),
        (
            true,
            true,
            false,
            Some((1232, false, 0, vec![cookie.clone()])),
        ),
        (true, false, false, Some((4096, true, 0, vec![ecs]))),
        (true, false, false, Some((1232, false, 0, vec![unknown]))),
        (true, false, false, Some((1232, false, 1, vec![]))),
        (false, true, true, Some((1232, true, 0, vec![cookie]))),
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let mut out = Vec::new();
    for (label, qtype) in names {
        for (rd, ad, cd, edns) in &profiles {
            let plain = if label.is_empty() {
                ZONE.to_string()
            } else {
                format!("{label}.{ZONE}")
            };
            let name: String = plain
                .chars()
                .map(|c| {
                    if rng.random() {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect();
            out.push(Spec {
                id: rng.random(),
                name,
                qtype: *qtype,
                class: DNSClass::IN,
                rd: *rd,
                ad: *ad,
                cd: *cd,
                edns: edns.clone(),
            });
        }
    }
    // Class CH (server identity queries): whatever the upstream says, we say.
    for edns in [None, Some((1232, false, 0, vec![]))] {
        out.push(Spec {
            id: rng.random(),
            name: "id.server.".into(),
            qtype: RecordType::TXT,
            class: DNSClass::CH,
            rd: true,
            ad: false,
            cd: false,
            edns,
        });
    }
    out
}

/// One exchange over UDP or TCP, from the namespace the caller runs in.
fn exchange(to: SocketAddr, tcp: bool, query: &[u8]) -> Option<Vec<u8>> {
    if tcp {
        tcp_exchange(Place::Here, to, &[query.to_vec()], WAIT).pop()
    } else {
        udp_exchange(Place::Here, to, query, WAIT)
    }
}

#[test]
fn every_answer_through_each_listener_is_the_upstreams_own() {
    require_tools(&["knotd", "unbound"]);
    let knot = free_loopback_port();
    let unbound = free_loopback_port();
    let _knot = Knot::start(Place::Here, knot, ZONE, &zone_text());
    let extra = format!(
        "local-zone: \"test.\" nodefault\nforward-zone:\nname: \"{ZONE}\"\nforward-addr: {}@{}\n",
        knot.ip(),
        knot.port()
    );
    let _unbound = Unbound::start_with(Place::Here, &[unbound], &[], &[], &extra);
    let fwd = Forwarder::spawn(
        Place::Here,
        &loopback_forwarder_args(&[unbound], &[knot], &[]),
    );
    let (node, cluster) = (
        fwd.listening_on("node", Duration::from_secs(10)),
        fwd.listening_on("cluster", Duration::from_secs(10)),
    );
    for l in [node, cluster] {
        fwd.wait_ready(Place::Here, l, Duration::from_secs(10));
    }
    let battery = battery();
    let pairs = [(cluster, knot), (node, unbound)];
    let (compared, failures) = {
        let mut failures = Vec::new();
        let mut compared = 0;
        for s in &battery {
            let query = query_bytes(s);
            for (via, upstream) in pairs {
                for tcp in [false, true] {
                    let full = exchange(upstream, true, &query);
                    let theirs = exchange(upstream, tcp, &query);
                    for attempt in ["first", "second"] {
                        let ours = exchange(via, tcp, &query);
                        compared += 1;
                        let what = format!(
                            "{attempt} via {via} ({}) {s:?}",
                            if tcp { "TCP" } else { "UDP" }
                        );
                        match (&ours, &theirs, &full) {
                            (Some(o), Some(t), Some(f)) => {
                                let d = differences(s, &query, o, t, f);
                                if !d.is_empty() {
                                    failures.push(format!("{what}: {}", d.join("; ")));
                                }
                            }
                            (None, Some(_), _) => {
                                failures.push(format!("{what}: no answer from us"))
                            }
                            _ => failures.push(format!("{what}: no answer from the upstream")),
                        }
                    }
                }
            }
        }
        (compared, failures)
    };
    assert!(compared >= 700, "only {compared} answers compared");
    assert!(
        failures.is_empty(),
        "{} of {compared} answers differ from the upstream's:\n{}\nforwarder log:\n{}",
        failures.len(),
        failures[..failures.len().min(30)].join("\n"),
        fwd.logs()
    );
}

/// A static musl program calling getaddrinfo(name, AF_INET) and printing each address.
const MUSL_GAI: &str = r#"
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
int main(int argc, char **argv) {
    struct addrinfo hints = {0}, *res, *p;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(argv[1], NULL, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "getaddrinfo: %s\n", gai_strerror(rc));
        return 2;
    }
    char buf[64];
    for (p = res; p; p = p->ai_next) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)p->ai_addr)->sin_addr, buf, sizeof buf);
        puts(buf);
    }
    return 0;
}
"#;

/// [`MUSL_GAI`] built static with musl-gcc into `dir`.
fn build_musl_gai(dir: &TempDir) -> std::path::PathBuf {
    let src = dir.path().join("gai.c");
    std::fs::write(&src, MUSL_GAI).expect("write gai.c");
    let gai = dir.path().join("gai");
    run_ok(
        std::process::Command::new("musl-gcc")
            .arg("-static")
            .arg("-o")
            .arg(&gai)
            .arg(&src),
    );
    gai
}

fn addresses(out: &std::process::Output) -> BTreeSet<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn glibc_gets_every_address_and_musl_the_ones_that_fit_through_each_listener() {
    require_root_and_tools(&["ip", "getent", "musl-gcc"]);
    let dir = TempDir::new("musl");
    let gai = build_musl_gai(&dir);
    let rig = Rig::namespaces().upstream(Mode::CoreDns).start();
    let topo = rig.topo.as_ref().expect("a namespace rig");
    for l in [NODE, CLUSTER] {
        topo.node
            .set_resolv_conf(&format!("nameserver {l}\noptions timeout:2 attempts:1\n"));
        for n in [40, 90] {
            let name = format!("many{n}.l{}.test", &l[l.len() - 2..]);
            let all: BTreeSet<String> = many_addresses(n).iter().map(|a| a.to_string()).collect();
            let musl = |when: &str| {
                let out = run_ok(&mut topo.node.exec(&gai, [&name]));
                let got = addresses(&out);
                // 512 bytes hold 28 A records of a name this long, 29 of a shorter one.
                assert!(
                    got.len() >= 25 && got.is_subset(&all),
                    "musl via {l}, {name} ({when}): {} addresses {got:?}",
                    got.len()
                );
            };
            // Fresh from the upstream (its own cut passes through), then glibc fetches it
            // whole over TCP after the TC reply, then musl again from the cache (our cut).
            musl("first, from the upstream");
            let out = run_ok(&mut topo.node.exec("getent", ["ahosts", &name]));
            let got: BTreeSet<String> = addresses(&out)
                .into_iter()
                .filter(|a| !a.contains(':'))
                .collect();
            assert_eq!(
                got,
                all,
                "glibc via {l}, {name}: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            musl("second, from the cache");
        }
    }
    assert!(
        rig.responder(0).truncated() > 0,
        "the stand-in never had to truncate: the test proves nothing"
    );
}

/// An upstream that cuts a UDP answer that does not fit to no record at all (as dnsmasq and
/// unbound do): the forwarder fetches it whole over TCP and gives clients that take 512 bytes and
/// never retry over TCP the records that fit, on the first query of a cold cache. musl's
/// getaddrinfo (before 1.2.4, as this static one) and busybox's nslookup (Alpine pods) each get
/// addresses, where they got none.
#[test]
fn musl_and_busybox_get_addresses_from_a_cold_cache_when_the_upstream_cuts_to_nothing() {
    require_root_and_tools(&["ip", "musl-gcc", "busybox"]);
    let dir = TempDir::new("musl-cut");
    let gai = build_musl_gai(&dir);
    let rig = Rig::namespaces().upstream(Mode::CoreDnsEmptyCut).start();
    let topo = rig.topo.as_ref().expect("a namespace rig");
    for l in [NODE, CLUSTER] {
        topo.node
            .set_resolv_conf(&format!("nameserver {l}\noptions timeout:2 attempts:1\n"));
        let all: BTreeSet<String> = many_addresses(60).iter().map(|a| a.to_string()).collect();
        // A fresh name for each client: each asks a cold cache.
        let name = format!("many60.musl{}.test", &l[l.len() - 2..]);
        let out = run_ok(&mut topo.node.exec(&gai, [&name]));
        let got = addresses(&out);
        assert!(
            got.len() >= 25 && got.is_subset(&all),
            "musl via {l}, {name}: {} addresses {got:?}",
            got.len()
        );
        let musl = got.len();
        let name = format!("many60.busybox{}.test", &l[l.len() - 2..]);
        let out = topo
            .node
            .exec("busybox", ["nslookup", "-type=a", &name, l])
            .output()
            .expect("run busybox");
        let text = String::from_utf8_lossy(&out.stdout);
        let got: BTreeSet<String> = text
            .lines()
            .filter_map(|line| line.trim().strip_prefix("Address:"))
            .map(|a| a.trim().to_string())
            .filter(|a| all.contains(a))
            .collect();
        assert!(
            got.len() >= 25,
            "busybox nslookup via {l}, {name}: {} addresses\n{text}",
            got.len()
        );
        eprintln!(
            "via {l}: a cold 60-record name gave musl {musl} addresses, busybox {}",
            got.len()
        );
    }
    assert!(
        rig.responder(0).truncated() > 0,
        "the stand-in never had to truncate: the test proves nothing"
    );
}
