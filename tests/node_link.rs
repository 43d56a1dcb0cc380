//! The `localdns` link as the daemon finds it after LocalDNS stopped: absent (clean stop), present
//! with both addresses (crash), or present with only one. Whatever it finds, the daemon serves
//! from the listener addresses it puts on `lo` and leaves LocalDNS's link exactly as it is (never
//! creating it: LocalDNS's own start deletes and recreates it, and a link or address of ours
//! would make that fail).

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

/// A node namespace without LocalDNS's link, and one upstream.
fn bare_node() -> (Netns, Upstream) {
    require_root_and_tools(&["ip", "dig"]);
    // Topology builds the link; take its upstream plumbing and remove the link to start bare.
    let topo = Topology::new();
    let up = topo.add_upstream_ns(true, false);
    topo.node.ip("link del localdns");
    let Topology { node, .. } = topo;
    (node, up)
}

fn on_lo(ns: &Netns) -> String {
    ns.ip("-4 addr show dev lo")
}

#[test]
fn serves_from_lo_without_making_the_link() {
    let (node, up) = bare_node();
    let _r = Responder::start(
        &up.ns,
        up.sock_v4(),
        Mode::Normal {
            answer_v4: "10.0.0.1".parse().unwrap(),
        },
    );
    let f = Forwarder::spawn(&node, &upstream_args(&up, &[]));
    f.wait_ready(
        &node,
        "169.254.10.11:53".parse().unwrap(),
        Duration::from_secs(10),
    );
    let shown = on_lo(&node);
    assert!(
        shown.contains("169.254.10.10/32") && shown.contains("169.254.10.11/32"),
        "{shown}"
    );
    assert!(
        !node.ip("link show").contains("localdns"),
        "no link localdns made"
    );
    for l in ["169.254.10.10", "169.254.10.11"] {
        let r = dig(
            &node,
            &[&format!("@{l}"), "kubernetes.default.svc.cluster.local"],
        );
        assert_eq!(r.answers, ["10.0.0.1"], "{l}: {}", r.raw);
    }
    f.signal(Signal::SIGTERM);
    assert!(
        f.wait_exit(Duration::from_secs(3))
            .expect("exits")
            .success()
    );
}

#[test]
fn leaves_a_partial_link_as_it_is() {
    require_root_and_tools(&["ip", "dig"]);
    let topo = Topology::new();
    let up = topo.add_upstream_ns(true, false);
    topo.node.ip("addr del 169.254.10.11/32 dev localdns");
    let before = topo.node.ip("-4 addr show dev localdns");
    let f = Forwarder::spawn(&topo.node, &upstream_args(&up, &[]));
    f.wait_ready(
        &topo.node,
        "169.254.10.11:53".parse().unwrap(),
        Duration::from_secs(10),
    );
    assert_eq!(topo.node.ip("-4 addr show dev localdns"), before);
    let logs = f.logs();
    assert!(
        logs.contains("added=[169.254.10.10, 169.254.10.11]"),
        "both go on lo: {logs}"
    );
    // A second run finds them there (a fallback killed before it could remove them).
    drop(f);
    let again = Forwarder::spawn(&topo.node, &upstream_args(&up, &[]));
    again.wait_ready(
        &topo.node,
        "169.254.10.11:53".parse().unwrap(),
        Duration::from_secs(10),
    );
    let logs = again.logs();
    assert!(
        logs.contains("already_there=[169.254.10.10, 169.254.10.11]"),
        "{logs}"
    );
}

#[test]
fn no_link_setup_leaves_the_node_alone() {
    let (node, up) = bare_node();
    let f = Forwarder::spawn(&node, &upstream_args(&up, &["--no-link-setup"]));
    assert!(
        f.wait_for_log("ready", Duration::from_secs(10)),
        "{}",
        f.logs()
    );
    let links = node.ip("link show");
    assert!(!links.contains("localdns"), "no link made: {links}");
    assert!(!on_lo(&node).contains("169.254.10.1"), "nothing on lo");
}
