//! The route table on the real binary: every listener to every upstream group the profile lets it
//! name, over UDP and TCP, asked with dig, each group on an address of its own (as on a node: the
//! VNet DNS at 168.63.129.16, kube-dns at pod addresses), each answering with records of its own
//! so an answer proves which group gave it. Every name is asked once, so no answer comes from the
//! cache: a route that works on one listener cannot hide a broken one on the other.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::*;

/// What each group answers for every name.
const VNET_ANSWER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const KUBE_ANSWER: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 66);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Listener {
    Node,
    Cluster,
}

/// (listener, domain asked under, the group it must reach): the defaults and an override of
/// each listener towards the other group, every pair the profile allows.
const CASES: [(Listener, &str, Ipv4Addr); 6] = [
    // --kube-dns-override example.com=VnetDNS
    (Listener::Cluster, "www.example.com", VNET_ANSWER),
    (Listener::Cluster, "other.test", KUBE_ANSWER),
    (Listener::Cluster, "svc.cluster.local", KUBE_ANSWER),
    (Listener::Node, "www.example.com", VNET_ANSWER),
    (Listener::Node, "svc.cluster.local", KUBE_ANSWER),
    // --vnet-dns-override corp.example=ClusterCoreDNS
    (Listener::Node, "db.corp.example", KUBE_ANSWER),
];

/// The VNet DNS and kube-dns on loopback addresses of their own, the forwarder between them.
struct Node {
    fwd: Forwarder,
    node: SocketAddr,
    cluster: SocketAddr,
    _vnet: Responder,
    _kube: Responder,
}

fn node() -> Node {
    require_tools(&["dig"]);
    let (vnet_addr, kube_addr) = (free_loopback_port(), free_loopback_port());
    assert_ne!(
        vnet_addr.ip(),
        kube_addr.ip(),
        "each group on its own address"
    );
    let vnet = Responder::start(
        Place::Here,
        vnet_addr,
        Mode::Normal {
            answer_v4: VNET_ANSWER,
        },
    );
    let kube = Responder::start(
        Place::Here,
        kube_addr,
        Mode::Normal {
            answer_v4: KUBE_ANSWER,
        },
    );
    let flags = [
        "--kube-dns-override",
        "example.com=VnetDNS",
        "--vnet-dns-override",
        "corp.example=ClusterCoreDNS",
    ];
    let fwd = Forwarder::spawn(
        Place::Here,
        &loopback_forwarder_args(&[vnet_addr], &[kube_addr], &flags),
    );
    let node = fwd.listening_on("node", Duration::from_secs(10));
    let cluster = fwd.listening_on("cluster", Duration::from_secs(10));
    for l in [node, cluster] {
        fwd.wait_ready(Place::Here, l, Duration::from_secs(10));
    }
    Node {
        fwd,
        node,
        cluster,
        _vnet: vnet,
        _kube: kube,
    }
}

/// Asks every case in `order` over each transport, each name new, on a fresh forwarder.
fn ask_all(order: &[(Listener, &str, Ipv4Addr)]) {
    let n = node();
    let (mut asked, mut wrong) = (0, Vec::new());
    for transport in ["+notcp", "+tcp"] {
        for &(listener, domain, want) in order {
            asked += 1;
            let to = match listener {
                Listener::Node => n.node,
                Listener::Cluster => n.cluster,
            };
            let name = format!("q{asked}.{domain}");
            let r = dig_to(Place::Here, to, &[&name, "A", transport]);
            if (r.status.as_str(), r.answers.as_slice()) != ("NOERROR", &[want.to_string()]) {
                wrong.push(format!("{listener:?} {name} {transport}: {}", r.raw));
            }
        }
    }
    // Every case is asked, so a failure on one listener shows what it did to the other.
    assert!(
        wrong.is_empty(),
        "{} of {asked} wrong, asked in the order {:?}:\n{}\nforwarder:\n{}",
        wrong.len(),
        order.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(),
        wrong.join("\n"),
        n.fwd.logs()
    );
}

/// The cluster listener's route to the VNet DNS asked first, then the node listener's: a try the
/// cluster listener could not send must not make the VNet DNS look down to the node listener.
#[test]
fn every_route_of_both_listeners_reaches_its_group_cluster_listener_first() {
    ask_all(&CASES);
}

/// The same the other way round: the node listener first, then the cluster listener.
#[test]
fn every_route_of_both_listeners_reaches_its_group_node_listener_first() {
    let mut order = CASES;
    order.reverse();
    ask_all(&order);
}
