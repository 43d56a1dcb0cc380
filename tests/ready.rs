//! An armed standby proves it could serve (issue 47): beside a stand-in LocalDNS that answers, it
//! asks each upstream group a question of its own, and `status --ready` and `/metrics` say
//! whether it could serve now, or why not. The real binary in namespaces: three scenes side by
//! side, each a node of its own, so the 30 s readiness window is waited out once.

mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::*;

const METRICS: &str = "127.0.0.1:9356";
const READY: &str = "localdns_fallback_upstreams_ready";

/// Waits up to `bound` for `status --ready` to exit `code`: how long that took, and its line.
/// Panics, with the standby's logs, when it does not.
fn until_status(node: &Netns, f: &Forwarder, code: i32, bound: Duration) -> (Duration, String) {
    let t0 = Instant::now();
    let mut last = (0, String::new());
    let got = poll_until(bound, || {
        // A process a look: twice a second is enough beside bounds of seconds.
        std::thread::sleep(Duration::from_millis(500));
        last = status(node, &["--ready"]);
        (last.0 == code).then(|| last.1.clone())
    });
    let line = got.unwrap_or_else(|| {
        panic!(
            "status --ready did not exit {code} within {bound:?}; last {last:?}; logs:\n{}",
            f.logs()
        )
    });
    (t0.elapsed(), line)
}

fn respond(up: &Upstream) -> Responder {
    let answer_v4 = Ipv4Addr::new(10, 0, 0, 1);
    Responder::start(&up.ns, up.sock_v4(), Mode::Normal { answer_v4 })
}

/// The upstream's packets dropped in its own namespace (`on`), or let through again.
fn drop_dns(up: &Upstream, on: bool) {
    let rule = if on { "-I" } else { "-D" };
    let args = [rule, "INPUT", "-p", "udp", "--dport", "53", "-j", "DROP"];
    run_ok(&mut up.ns.exec("iptables", args));
}

/// Panics unless `line` says each of `said`.
fn says(line: &str, said: &[&str]) {
    for s in said {
        assert!(line.contains(s), "{s:?} not in: {line}");
    }
}

/// What a scene saw: the lines of `status --ready`, and what the standby did meanwhile.
struct Seen {
    lines: Vec<(&'static str, i32, String)>,
}

/// A standby beside a LocalDNS whose one upstream (both groups) answers, then is cut off by `cut`
/// and let back by `back`: ready, not ready naming it, ready again; the figures of each step.
fn upstream_goes_and_comes_back(
    tag: &'static str,
    cut: impl Fn(&Upstream, &mut Option<Responder>),
    back: impl Fn(&Upstream, &mut Option<Responder>),
    reason: &str,
) -> Seen {
    let (topo, up, r) = node_and_upstream();
    let mut r = Some(r);
    let localdns = LocalDns::start(&topo.node);
    let f = Forwarder::standby(&topo.node, &up, &["--metrics", METRICS]);
    localdns.wait_stood_by(&f, 2, Duration::from_secs(10));
    let mut lines = Vec::new();
    let (t, line) = until_status(&topo.node, &f, 0, Duration::from_secs(15));
    figure(&format!("ready_{tag}_at_start"), t, Duration::from_secs(10));
    let server = up.sock_v4().to_string();
    let vnet_answered = format!("VNet DNS {server} answered ");
    says(
        &line,
        &["the standby could serve: kube-dns ", &vnet_answered],
    );
    lines.push(("answering", 0, line));
    let asked = r.as_ref().unwrap().queries();
    assert!(asked >= 2, "the upstream heard {asked} questions");

    cut(&up, &mut r);
    let (t, line) = until_status(&topo.node, &f, 1, Duration::from_secs(40));
    figure(&format!("not_ready_{tag}"), t, Duration::from_secs(30));
    let [kube, vnet] = ["kube-dns", "VNet DNS"].map(|g| format!("{g} {server}: {reason} since "));
    says(&line, &["the standby could not serve: ", &kube, &vnet]);
    let m = f.metrics();
    for group in ["node", "cluster"] {
        assert_eq!(m.get(READY, &[("group", group)]), 0.0, "{}", m.text());
        let last = "localdns_fallback_upstreams_last_answer_timestamp_seconds";
        assert!(m.get(last, &[("group", group)]) > 0.0, "{}", m.text());
    }
    lines.push((tag, 1, line));

    back(&up, &mut r);
    let (t, line) = until_status(&topo.node, &f, 0, Duration::from_secs(15));
    figure(&format!("ready_{tag}_back"), t, Duration::from_secs(10));
    lines.push(("back", 0, line));

    let m = f.metrics();
    assert_eq!(m.get(READY, &[("group", "cluster")]), 1.0, "{}", m.text());
    assert_eq!(
        m.sum("localdns_fallback_takeovers_total", &[]),
        0.0,
        "the standby took the flows:\n{}",
        f.logs()
    );
    assert_eq!(m.sum("localdns_fallback_holding_flows", &[]), 0.0);
    assert_eq!(
        m.sum("localdns_fallback_responses_total", &[]),
        0.0,
        "a question counted as a pod's answer"
    );
    assert_eq!(
        localdns.first_other(),
        None,
        "LocalDNS's sockets got a question of the standby's"
    );
    Seen { lines }
}

/// No kube-dns server found: discovery looked in kube-proxy's iptables rules of a node that has
/// none; the VNet DNS answers.
fn no_server_found() -> Seen {
    let (topo, up, _r) = node_and_upstream();
    let localdns = LocalDns::start(&topo.node);
    let server = up.sock_v4().to_string();
    let args: Vec<String> = [
        "--standby",
        "--node-upstream",
        &server,
        "--discovery",
        "iptables",
        "--metrics",
        METRICS,
    ]
    .map(String::from)
    .to_vec();
    let launch = Launch {
        host_sys: true,
        ..Launch::default()
    };
    let f = Forwarder::launch(&topo.node, &args, &[], launch);
    localdns.wait_stood_by(&f, 2, Duration::from_secs(10));
    let (t, line) = until_status(&topo.node, &f, 1, Duration::from_secs(15));
    figure("not_ready_no_server", t, Duration::from_secs(10));
    let vnet_answered = format!("VNet DNS {server} answered ");
    says(
        &line,
        &["kube-dns: no server found (iptables: ", &vnet_answered],
    );
    let m = f.metrics();
    assert_eq!(m.get(READY, &[("group", "cluster")]), 0.0);
    assert_eq!(m.get(READY, &[("group", "node")]), 1.0);
    assert_eq!(m.sum("localdns_fallback_takeovers_total", &[]), 0.0);
    Seen {
        lines: vec![("no server found", 1, line)],
    }
}

#[test]
fn the_standby_says_whether_it_could_serve_and_why_not() {
    require_root_and_tools(&["ip", "iptables", "nsenter"]);
    let killed = std::thread::spawn(|| {
        upstream_goes_and_comes_back(
            "killed",
            |_, r| *r = None,
            |up, r| *r = Some(respond(up)),
            "sends refused",
        )
    });
    let dropped = std::thread::spawn(|| {
        upstream_goes_and_comes_back(
            "dropped",
            |up, _| drop_dns(up, true),
            |up, _| drop_dns(up, false),
            "every server silent",
        )
    });
    let none = no_server_found();
    for seen in [killed.join().unwrap(), dropped.join().unwrap(), none] {
        for (case, code, line) in seen.lines {
            eprintln!("{case}: exit {code}: {line}");
        }
    }
}

/// With no standby beside LocalDNS, `status --ready` cannot tell (exit 2).
#[test]
fn status_ready_cannot_tell_without_a_standby() {
    require_root_and_tools(&["ip"]);
    let node = Netns::new("nostandby");
    let (code, line) = status(&node, &["--ready"]);
    assert_eq!(code, 2, "{line}");
    assert!(
        line.starts_with("cannot tell whether the standby could serve: no standby runs"),
        "{line}"
    );
}
