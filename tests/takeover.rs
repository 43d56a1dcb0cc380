//! The fleet's view of a takeover, in network namespaces: `/metrics` says whether the fallback
//! holds LocalDNS's flows, why it took them and when, and `localdns-fallback status` (the
//! node-problem-detector plugin) tells LocalDNS, a fallback and silence apart, with the real
//! binary beside a LocalDNS stand-in.

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

const LISTENERS: &str = "169.254.10.10:53 and 169.254.10.11:53";

/// A node namespace (listeners on link `localdns`) and one upstream.
fn node() -> (Topology, Upstream, Responder) {
    require_root_and_tools(&["ip", "curl"]);
    node_and_upstream()
}

/// The sample of `name` with no labels; panics if absent.
fn sample(m: &Metrics, name: &str) -> f64 {
    m.get(name, &[])
}

fn holding(m: &Metrics) -> [f64; 2] {
    ["node", "cluster"].map(|l| m.get("localdns_fallback_holding_flows", &[("listener", l)]))
}

fn count(m: &Metrics, total: &str, cause: &str) -> f64 {
    m.get(&format!("localdns_fallback_{total}"), &[("cause", cause)])
}

#[test]
fn the_standby_counts_each_takeover_by_cause_and_status_follows_it() {
    let (topo, up, _r) = node();
    let localdns = LocalDns::start(&topo.node);
    let metrics = "127.0.0.1:9356";
    let f = Forwarder::spawn(
        &topo.node,
        &upstream_args(&up, &["--standby", "--metrics", metrics]),
    );
    assert!(
        f.wait_for_log("standing by", Duration::from_secs(10)),
        "{}",
        f.logs()
    );
    let text = f.curl_metrics();
    assert_eq!(holding(&text), [0.0, 0.0], "{text}");
    assert_eq!(sample(&text, "localdns_fallback_standby"), 1.0);
    assert_eq!(
        sample(&text, "localdns_fallback_last_takeover_timestamp_seconds"),
        0.0
    );
    let (code, line) = status(&topo.node, &[]);
    assert_eq!(code, 0, "{line}");
    assert_eq!(
        line,
        format!(
            "LocalDNS answers on {LISTENERS}; localdns-fallback --standby (pid {}) stands by",
            f.pid()
        )
    );

    // LocalDNS hangs: the standby's own probe question waits unread in LocalDNS's socket, and
    // the standby takes the flows (counted with the probe's cause: `stats` has none of its own
    // for a queue left unread).
    localdns.hang(true);
    assert!(
        f.wait_for_log(
            "LocalDNS left queries unread in its sockets",
            Duration::from_secs(5)
        ),
        "{}",
        f.logs()
    );
    let text = f.curl_metrics();
    assert_eq!(holding(&text), [1.0, 1.0], "{text}");
    assert_eq!(count(&text, "takeovers_total", "unread_queries"), 1.0);
    let since = sample(&text, "localdns_fallback_last_takeover_timestamp_seconds");
    let started = sample(&text, "process_start_time_seconds");
    assert!(since > started, "{text}");
    let (code, line) = status(&topo.node, &[]);
    assert_eq!(code, 1, "{line}");
    let fallback = format!(
        "LocalDNS is on its fallback: localdns-fallback --standby (pid {}) holds the flows of {LISTENERS} since ",
        f.pid()
    );
    assert!(line.starts_with(&fallback), "{line}");
    // The standby still sends the probe name to the hung LocalDNS.
    assert!(
        line.ends_with(&format!(
            "ago), because LocalDNS left queries unread in its sockets; the probe gets no answer on {LISTENERS}"
        )),
        "{line}"
    );

    // LocalDNS answers again: the hand-back is counted under the cause of the takeover it ends.
    localdns.hang(false);
    assert!(
        f.wait_for_log("LocalDNS answers again", Duration::from_secs(5)),
        "{}",
        f.logs()
    );
    let text = f.curl_metrics();
    assert_eq!(holding(&text), [0.0, 0.0], "{text}");
    assert_eq!(count(&text, "handbacks_total", "unread_queries"), 1.0);
    assert!(sample(&text, "localdns_fallback_last_handback_timestamp_seconds") >= since);
    assert_eq!(status(&topo.node, &[]).0, 0);

    // LocalDNS stops and its script deletes its link: the standby takes the flows as the
    // addresses go.
    topo.node.ip("link del localdns");
    drop(localdns);
    assert!(
        f.wait_for_log(
            "LocalDNS's addresses went away; serving its listeners",
            Duration::from_secs(5)
        ),
        "{}",
        f.logs()
    );
    let text = f.curl_metrics();
    assert_eq!(holding(&text), [1.0, 1.0], "{text}");
    assert_eq!(count(&text, "takeovers_total", "addresses_gone"), 1.0);
    assert_eq!(count(&text, "takeovers_total", "unread_queries"), 1.0);
    assert_eq!(count(&text, "takeovers_total", "localdns_failed"), 0.0);
    assert_eq!(count(&text, "takeovers_total", "by_hand"), 0.0);
    let (code, line) = status(&topo.node, &[]);
    assert_eq!(code, 1, "{line}");
    assert!(
        line.starts_with(&fallback) && line.ends_with("because LocalDNS's addresses went away"),
        "{line}"
    );
}

#[test]
fn status_tells_localdns_a_fallback_and_silence_apart() {
    let (topo, up, _r) = node();
    let localdns = LocalDns::start(&topo.node);
    let (code, line) = status(&topo.node, &[]);
    assert_eq!(
        (code, line.as_str()),
        (0, format!("LocalDNS answers on {LISTENERS}").as_str())
    );

    // LocalDNS is gone, its link left behind (a crash): nothing answers, and nothing covers.
    drop(localdns);
    let (code, line) = status(&topo.node, &[]);
    assert_eq!(code, 1, "{line}");
    assert_eq!(
        line,
        format!("nothing answers LocalDNS's probe on {LISTENERS}; no fallback runs")
    );

    // systemd starts the fallback for the failed LocalDNS (OnFailure= says which unit failed).
    let metrics = "127.0.0.1:9355";
    let f = Forwarder::spawn_with_env(
        &topo.node,
        &upstream_args(&up, &["--metrics", metrics]),
        &[("MONITOR_UNIT", "localdns.service")],
    );
    f.wait_ready(
        &topo.node,
        "169.254.10.11:53".parse().unwrap(),
        Duration::from_secs(10),
    );
    let text = f.curl_metrics();
    assert_eq!(holding(&text), [1.0, 1.0], "{text}");
    assert_eq!(count(&text, "takeovers_total", "localdns_failed"), 1.0);
    assert_eq!(sample(&text, "localdns_fallback_standby"), 0.0);
    let (code, line) = status(&topo.node, &[]);
    assert_eq!(code, 1, "{line}");
    assert!(
        line.starts_with(&format!(
            "LocalDNS is on its fallback: localdns-fallback (pid {}) holds the flows of {LISTENERS} since 20",
            f.pid()
        )) && line.ends_with("s ago), because LocalDNS failed"),
        "{line}"
    );

    // The fallback is stopped and LocalDNS has not come back: silence again.
    f.signal(Signal::SIGTERM);
    let exited = f.wait_exit(Duration::from_secs(5)).expect("exits");
    assert!(exited.success(), "{exited}:\n{}", f.logs());
    let (code, line) = status(&topo.node, &[]);
    assert_eq!(
        (code, line.as_str()),
        (
            1,
            format!("nothing answers LocalDNS's probe on {LISTENERS}; no fallback runs").as_str()
        )
    );
}
