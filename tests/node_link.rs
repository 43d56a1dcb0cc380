//! The `localdns` link as the daemon finds it after LocalDNS stopped: absent (clean stop), present
//! with both addresses (crash), or present with only one; and left in place when we stop.
//! This kernel has no `dummy` link type, so creating the link exercises the veth fallback.

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

fn args(up: &Upstream, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--node-upstream",
        &up.sock_v4().to_string(),
        "--cluster-upstream",
        &up.sock_v4().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

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

fn addresses(ns: &Netns) -> String {
    ns.ip("-4 addr show dev localdns")
}

#[test]
fn creates_the_link_and_both_addresses_and_leaves_them_on_exit() {
    let (node, up) = bare_node();
    let _r = Responder::start(
        &up.ns,
        up.sock_v4(),
        Mode::Normal {
            answer_v4: "10.0.0.1".parse().unwrap(),
        },
    );
    let f = Forwarder::spawn(&node, &args(&up, &[]));
    f.wait_ready(
        &node,
        "169.254.10.11:53".parse().unwrap(),
        Duration::from_secs(10),
    );
    let shown = addresses(&node);
    assert!(
        shown.contains("169.254.10.10/32") && shown.contains("169.254.10.11/32"),
        "{shown}"
    );
    assert!(node.ip("link show localdns").contains("UP"), "link is up");
    let logs = f.logs();
    assert!(
        logs.contains("no dummy link type"),
        "the veth fallback is said: {logs}"
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
    let after = addresses(&node);
    assert!(
        after.contains("169.254.10.10/32") && after.contains("169.254.10.11/32"),
        "kept: {after}"
    );
}

#[test]
fn adds_only_the_missing_address_to_an_existing_link() {
    require_root_and_tools(&["ip", "dig"]);
    let topo = Topology::new();
    let up = topo.add_upstream_ns(true, false);
    topo.node.ip("addr del 169.254.10.11/32 dev localdns");
    let f = Forwarder::spawn(&topo.node, &args(&up, &[]));
    f.wait_ready(
        &topo.node,
        "169.254.10.11:53".parse().unwrap(),
        Duration::from_secs(10),
    );
    let logs = f.logs();
    assert!(logs.contains("added=[169.254.10.11]"), "{logs}");
    assert!(logs.contains("already_there=[169.254.10.10]"), "{logs}");
    assert!(
        logs.contains("created=\"no, it was there\""),
        "an existing veth is accepted: {logs}"
    );
    assert_eq!(addresses(&topo.node).matches("169.254.10.1").count(), 2);
}

#[test]
fn no_link_setup_leaves_the_node_alone() {
    let (node, up) = bare_node();
    let f = Forwarder::spawn(&node, &args(&up, &["--no-link-setup"]));
    assert!(
        f.wait_for_log("ready", Duration::from_secs(10)),
        "{}",
        f.logs()
    );
    let links = node.ip("link show");
    assert!(!links.contains("localdns"), "no link made: {links}");
}

#[test]
fn a_link_that_cannot_be_made_is_a_clear_error() {
    let (node, up) = bare_node();
    // No dummy type here, and the veth fallback's peer name is taken: nothing can be made.
    node.ip("link add localdns-peer type veth peer name other-end");
    let f = Forwarder::spawn(&node, &args(&up, &[]));
    let status = f.wait_exit(Duration::from_secs(5)).expect("gives up");
    assert_eq!(status.code(), Some(1));
    let logs = f.logs();
    assert!(logs.contains("cannot create link localdns"), "{logs}");
    assert_eq!(
        logs.lines().filter(|l| l.contains("ERROR")).count(),
        1,
        "one error line: {logs}"
    );
}
