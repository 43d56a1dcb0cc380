//! What a node engineer sees: `/metrics` scraped with curl and checked by promtool, counters that
//! move by exactly the queries sent, and a metrics endpoint that hostile HTTP clients cannot use
//! to slow DNS down. On loopback, no root.

mod common;

use std::io::Write;
use std::net::{Ipv4Addr, TcpStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

fn rig() -> Rig {
    // A port the kernel picks on an address of this rig's own, so tests running side by side
    // each have their endpoint.
    let metrics = format!("{}:0", loopback_ip());
    Rig::loopback()
        .upstream(Mode::Normal { answer_v4: ANSWER })
        .flags(&["--metrics", &metrics])
        .tools(&["curl", "promtool"])
        .start()
}

fn promtool_check(text: &str) {
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

const RESPONSES: &str = "localdns_fallback_responses_total";

fn responses<'a>(listener: &'a str, transport: &'a str, rcode: &'a str) -> [(&'a str, &'a str); 3] {
    [
        ("listener", listener),
        ("transport", transport),
        ("rcode", rcode),
    ]
}

#[test]
fn metrics_pass_promtool_and_count_exactly_what_was_sent() {
    let r = rig();
    let before = r.fwd.curl_metrics();
    let seen_before = r.upstream_queries(0);
    promtool_check(before.text());
    // Started by a test (no systemd, no LocalDNS markers): it holds the flows since its start,
    // by hand.
    for listener in ["node", "cluster"] {
        let gauge = before.get("localdns_fallback_holding_flows", &[("listener", listener)]);
        assert_eq!(gauge, 1.0, "{before}");
    }
    assert_eq!(
        before.get("localdns_fallback_takeovers_total", &[("cause", "by_hand")]),
        1.0,
        "a start by hand (unless this host has /run/localdns-handoff or MONITOR_UNIT set):\n{before}"
    );
    assert_eq!(before.get("localdns_fallback_standby", &[]), 0.0);
    let started = before.get("process_start_time_seconds", &[]);
    let since = before.get("localdns_fallback_last_takeover_timestamp_seconds", &[]);
    // process_start_time_seconds comes from /proc in clock ticks, the takeover's time from the
    // wall clock in whole seconds: either may read a second before the other.
    assert!((started - 1.0..started + 30.0).contains(&since), "{before}");
    for i in 0..3 {
        assert_eq!(
            r.dig(r.cluster, &[&format!("n{i}.svc.cluster.local")])
                .status,
            "NOERROR"
        );
    }
    for i in 0..2 {
        assert_eq!(
            r.dig(r.node, &[&format!("nx.gone{i}.example")]).status,
            "NXDOMAIN"
        );
    }
    assert_eq!(r.dig(r.node, &["tcp.example", "+tcp"]).status, "NOERROR");
    assert_eq!(r.dig(r.cluster, &["servfail.example"]).status, "SERVFAIL");
    assert_eq!(
        r.dig(r.cluster, &["n0.svc.cluster.local"]).status,
        "NOERROR"
    ); // a cache hit
    let after = r.fwd.curl_metrics();
    promtool_check(after.text());
    // Counters by label set: one the daemon has not counted yet is not rendered, and is 0.
    let delta =
        |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);
    assert_eq!(
        delta(RESPONSES, &responses("cluster", "udp", "NOERROR")),
        4.0,
        "{after}"
    );
    assert_eq!(
        delta(RESPONSES, &responses("cluster", "udp", "SERVFAIL")),
        1.0
    );
    assert_eq!(delta(RESPONSES, &responses("node", "udp", "NXDOMAIN")), 2.0);
    assert_eq!(delta(RESPONSES, &responses("node", "tcp", "NOERROR")), 1.0);
    assert_eq!(
        delta(RESPONSES, &responses("node", "udp", "NOERROR")),
        0.0,
        "wait_ready's probes came before"
    );
    let cluster = [("listener", "cluster")];
    assert_eq!(delta("localdns_fallback_cache_hits_total", &cluster), 1.0);
    assert_eq!(delta("localdns_fallback_cache_misses_total", &cluster), 4.0);
    let up = r.upstreams[0].to_string();
    let upstream = [("group", "cluster"), ("upstream", up.as_str())];
    // Four tries to kube-dns at least: a try unanswered for 100 ms on a loaded machine is also
    // hedged, and a hedge is a try too; the counters must match what the upstream saw.
    let cluster_tries = delta("localdns_fallback_upstream_queries_total", &upstream);
    assert!(cluster_tries >= 4.0, "{after}");
    // The SERVFAIL is a failed try, not an accepted reply: it is not in the latency histogram.
    let timed = delta(
        "localdns_fallback_upstream_duration_seconds_count",
        &upstream,
    );
    assert!(
        (3.0..cluster_tries).contains(&timed),
        "{timed} timed replies"
    );
    assert_eq!(
        delta("localdns_fallback_upstream_failures_total", &upstream),
        1.0
    );
    let node_up = [("group", "node"), ("upstream", up.as_str())];
    let node_tries = delta("localdns_fallback_upstream_queries_total", &node_up);
    assert!(node_tries >= 3.0, "{after}");
    let seen = (r.upstream_queries(0) - seen_before) as f64;
    assert_eq!(
        cluster_tries + node_tries,
        seen,
        "every try the upstream saw, counted"
    );
    assert_eq!(
        after.get(
            "localdns_fallback_upstreams",
            &[("group", "cluster"), ("source", "flag")]
        ),
        1.0
    );
    assert!(after.get("localdns_fallback_cache_entries", &[]) >= 4.0);
    assert!(after.get("process_start_time_seconds", &[]) > 1.7e9);
    assert!(
        after
            .text()
            .contains("localdns_fallback_build_info{version=\"")
    );
}

/// The shipped alerting rules, through promtool's own rule tests (units/prometheus).
#[test]
fn alert_rules_pass_their_promtool_tests() {
    require_tools(&["promtool"]);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("units/prometheus");
    for args in [
        &["check", "rules", "localdns-fallback-alerts.yaml"][..],
        &["test", "rules", "localdns-fallback-alerts.test.yaml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("SUCCESS"),
            "promtool {args:?}:\n{text}"
        );
    }
}

/// The node-problem-detector custom plugin monitor shipped in units/node-problem-detector runs
/// the installed binary's `status` and sets a condition of its own from it, and a second one from
/// `status --ready` (whether the standby could serve).
#[test]
fn the_npd_plugin_config_runs_status_and_sets_its_conditions() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("units/node-problem-detector/localdns-fallback.json");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(config["plugin"], "custom");
    let plugin = &config["pluginConfig"];
    // The status lines are longer than NPD's default 80 characters.
    assert!(plugin["max_output_length"].as_u64().unwrap() >= 300);
    let conditions: Vec<&str> = (config["conditions"].as_array().unwrap().iter())
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        conditions,
        ["LocalDNSOnFallback", "LocalDNSFallbackNotReady"]
    );
    let rules = config["rules"].as_array().unwrap();
    let of_type = |t: &str| rules.iter().filter(|r| r["type"] == t).count();
    assert_eq!((of_type("permanent"), of_type("temporary")), (2, 1));
    for rule in rules {
        assert_eq!(
            rule["path"],
            "/opt/azure/containers/localdns/localdns-fallback"
        );
        let args = match rule["condition"].as_str() {
            Some("LocalDNSFallbackNotReady") => serde_json::json!(["status", "--ready"]),
            Some(c) => {
                assert_eq!(c, "LocalDNSOnFallback");
                serde_json::json!(["status"])
            }
            None => serde_json::json!(["status"]),
        };
        assert_eq!(rule["args"], args, "{rule}");
    }
}

/// `status` beside a fallback whose state it cannot read (no `--metrics`) cannot tell LocalDNS's
/// answers from the fallback's: Unknown (exit 2), never OK.
#[test]
fn status_cannot_tell_beside_a_fallback_without_metrics() {
    let r = Rig::loopback()
        .upstream(Mode::Normal { answer_v4: ANSWER })
        .start();
    let out = std::process::Command::new(forwarder_binary())
        .args(["status", "--node-listen"])
        .arg(r.node.to_string())
        .arg("--cluster-listen")
        .arg(r.cluster.to_string())
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(2), "{line}");
    assert!(
        line.starts_with("cannot tell whether LocalDNS or its fallback answers")
            && line.contains(&format!(
                "(pid {}) serves these listeners without --metrics",
                r.fwd.pid()
            )),
        "{line}"
    );
}

#[test]
fn hostile_http_clients_do_not_delay_dns() {
    let r = rig();
    let metrics = r.fwd.metrics_addr();
    let slow = r.at.enter(|| {
        // Slow and junk clients: more than the endpoint serves at once.
        let mut conns = Vec::new();
        for i in 0..12 {
            let mut s = TcpStream::connect(metrics).unwrap();
            let junk: &[u8] = if i % 2 == 0 {
                b"G"
            } else {
                b"\x16\x03\x01\x00\xa5garbage"
            };
            s.write_all(junk).unwrap();
            conns.push(s);
        }
        conns
    });
    let started = Instant::now();
    for i in 0..5 {
        let d = r.dig(r.cluster, &[&format!("busy{i}.example")]);
        assert_eq!(d.status, "NOERROR");
        assert!(
            d.elapsed < Duration::from_secs(1),
            "DNS unaffected: {:?}",
            d.elapsed
        );
    }
    // Once the slow clients hit the request deadline, scraping works again.
    let text = poll_until(Duration::from_secs(6), || {
        let out =
            r.at.command(
                "curl",
                [
                    "-s",
                    "--max-time",
                    "2",
                    &format!("http://{metrics}/metrics"),
                ],
            )
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    })
    .expect("scrape after the slow clients were cut off");
    assert!(text.contains("localdns_fallback_responses_total"));
    assert!(started.elapsed() < Duration::from_secs(8));
    let not_found =
        r.at.command(
            "curl",
            [
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &format!("http://{metrics}/"),
            ],
        )
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&not_found.stdout), "404");
    drop(slow);
    assert!(r.fwd.is_running());
}
