//! The node's hosts file and NSID on the real binary, with `dig` on both listeners over UDP and
//! TCP: a file that appears after the start, the AgentBaker e2e's canary appended to it and
//! answered within 7 s, a new file renamed over it, a deleted one still served, NODATA for a name
//! the file has without that type, names not in it forwarded, `--hosts-file none`, the file in
//! `discover` and `/metrics`, and NSID in replies to queries that ask. The file is the test's own
//! (`--hosts-file`), in a temporary directory; the daemon confines its writes (Landlock) and
//! reads it there as it would `/etc/localdns/hosts`.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// What the upstream answers for every A question: a forwarded name shows.
const UPSTREAM: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 77);
const CANARY: &str = "localdns-fallback-e2e-canary.invalid";
/// AgentBaker's fallback e2e: the canary resolves through the fallback within this.
const CANARY_WITHIN: Duration = Duration::from_secs(7);

fn rig(file: &Path, extra: &[&str]) -> Rig {
    let metrics = format!("{}:0", loopback_ip());
    let mut flags = vec![
        "--hosts-file",
        file.to_str().unwrap(),
        "--metrics",
        &metrics,
    ];
    flags.extend_from_slice(extra);
    Rig::loopback()
        .upstream(Mode::Normal {
            answer_v4: UPSTREAM,
        })
        .flags(&flags)
        .tools(&["curl"])
        .start()
}

/// Writes the file as aks-hosts-setup does: a temporary file renamed over it.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Asks until `name` gets `want` (an A record's address), for up to `within`; how long it took.
fn answered_within(r: &Rig, to: SocketAddr, name: &str, want: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let d = r.dig(to, &[name, "A"]);
        if d.answers == [want] {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{name} not {want} within {within:?}: {}\n{}",
            d.raw,
            r.fwd.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_hosts_file_is_answered_on_both_listeners_and_followed() {
    let dir = TempDir::new("hosts");
    let path: PathBuf = dir.path().join("hosts");
    // No file at the start: the daemon starts and forwards.
    let r = rig(&path, &[]);
    let d = r.dig(r.cluster, &["mcr.example.com", "A"]);
    assert_eq!(d.answers, [UPSTREAM.to_string()], "{}", d.raw);

    // The file appears: used within the re-read time.
    replace(
        &path,
        "# critical names\n10.1.2.3 mcr.example.com MCR-alias.example.com\n\
         2001:db8::5 mcr.example.com\n10.9.9.9 v4only.example.com # no AAAA\nbogus line.example\n",
    );
    answered_within(&r, r.node, "mcr.example.com", "10.1.2.3", CANARY_WITHIN);
    let before = r.upstream_queries(0);
    for to in [r.node, r.cluster] {
        for tcp in [&[][..], &["+tcp"][..]] {
            let ask = |name: &str, qtype: &str| r.dig(to, &[&[name, qtype][..], tcp].concat());
            let d = ask("Mcr-Alias.Example.COM", "A");
            assert_eq!(d.answers, ["10.1.2.3"], "{}", d.raw);
            assert!(d.has_flag("aa") && d.records[0].ttl == 5, "{}", d.raw);
            assert!(
                d.raw.contains("Mcr-Alias.Example.COM."),
                "the question's case: {}",
                d.raw
            );
            let d = ask("mcr.example.com", "AAAA");
            assert_eq!(d.answers, ["2001:db8::5"], "{}", d.raw);
            let d = ask("v4only.example.com", "AAAA");
            assert_eq!(
                (d.status.as_str(), d.answers.len()),
                ("NOERROR", 0),
                "{}",
                d.raw
            );
            assert!(d.has_flag("aa"), "NODATA from the file: {}", d.raw);
            let d = ask("mcr.example.com", "MX");
            assert_eq!(
                (d.status.as_str(), d.answers.len()),
                ("NOERROR", 0),
                "{}",
                d.raw
            );
            let d = ask("3.2.1.10.in-addr.arpa", "PTR");
            assert_eq!(
                d.answers,
                ["mcr.example.com.", "mcr-alias.example.com."],
                "{}",
                d.raw
            );
        }
    }
    assert_eq!(
        r.upstream_queries(0),
        before,
        "nothing of the file's went upstream"
    );
    for to in [r.node, r.cluster] {
        let d = r.dig(to, &["other.example.com", "A"]);
        assert_eq!(d.answers, [UPSTREAM.to_string()], "forwarded: {}", d.raw);
        let d = r.dig(to, &["line.example", "A"]);
        assert_eq!(
            d.answers,
            [UPSTREAM.to_string()],
            "a malformed line: {}",
            d.raw
        );
    }
    let m = r.fwd.curl_metrics();
    assert_eq!(m.get("localdns_fallback_hosts_entries", &[]), 4.0, "{m}");
    assert_ne!(
        m.get("localdns_fallback_hosts_reload_timestamp_seconds", &[]),
        0.0,
        "{m}"
    );

    // The AgentBaker e2e's canary, appended in place.
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("10.99.99.99 {CANARY}\n"));
    std::fs::write(&path, &text).unwrap();
    let took = answered_within(&r, r.cluster, CANARY, "10.99.99.99", CANARY_WITHIN);
    eprintln!("canary answered {took:?} after it was appended");
    let d = r.dig(r.cluster, &[CANARY, "A", "+tcp"]);
    assert_eq!(d.answers, ["10.99.99.99"], "{}", d.raw);

    // A new file renamed over the old one.
    replace(&path, "10.7.7.7 mcr.example.com\n");
    answered_within(&r, r.node, "mcr.example.com", "10.7.7.7", CANARY_WITHIN);
    let d = r.dig(r.cluster, &[CANARY, "A"]);
    assert_eq!(
        d.answers,
        [UPSTREAM.to_string()],
        "gone from the file: {}",
        d.raw
    );

    // Deleted: the last content stays.
    std::fs::remove_file(&path).unwrap();
    // Seen gone at its next re-read (said at the start, when there was no file, then again).
    poll_until(CANARY_WITHIN, || {
        (r.fwd.logs().matches("no hosts file at").count() >= 2).then_some(())
    })
    .unwrap_or_else(|| panic!("the deletion was not seen:\n{}", r.fwd.logs()));
    for to in [r.node, r.cluster] {
        let d = r.dig(to, &["mcr.example.com", "A", "+tcp"]);
        assert_eq!(d.answers, ["10.7.7.7"], "{}", d.raw);
    }
    assert!(
        r.fwd.logs().contains("no hosts file at"),
        "{}",
        r.fwd.logs()
    );
}

#[test]
fn hosts_file_none_forwards_every_name_and_discover_shows_the_file() {
    let dir = TempDir::new("hosts-none");
    let path = dir.path().join("hosts");
    replace(&path, "10.1.2.3 mcr.example.com\n::1 # no name\n");
    let r = rig(&path, &["--hosts-file", "none"]);
    for to in [r.node, r.cluster] {
        let d = r.dig(to, &["mcr.example.com", "A"]);
        assert_eq!(d.answers, [UPSTREAM.to_string()], "{}", d.raw);
    }
    assert_eq!(
        r.fwd
            .curl_metrics()
            .get("localdns_fallback_hosts_entries", &[]),
        0.0
    );

    let up = r.upstreams[0].to_string();
    let discover = |file: &str| {
        let out = std::process::Command::new(forwarder_binary())
            .args([
                "discover",
                "--node-upstream",
                &up,
                "--cluster-upstream",
                &up,
            ])
            .args(["--hosts-file", file])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let text = discover(path.to_str().unwrap());
    let want = format!(
        "hosts file {}: 1 entries, 1 lines skipped, read at",
        path.display()
    );
    assert!(text.contains(&want), "{text}");
    assert!(discover("none").contains("hosts file: none"));
    let missing = discover(dir.path().join("absent").to_str().unwrap());
    assert!(missing.contains("its names are forwarded"), "{missing}");
}

#[test]
fn nsid_names_the_fallback_whoever_answered() {
    let dir = TempDir::new("nsid");
    let path = dir.path().join("hosts");
    replace(&path, "10.1.2.3 mcr.example.com\n");
    let r = rig(&path, &[]);
    let ours = "(\"localdns-fallback\")";
    for to in [r.node, r.cluster] {
        for tcp in ["+notcp", "+tcp"] {
            // From the file, from the upstream, then from the cache; the probe name is ours too.
            for name in [
                "mcr.example.com",
                "www.example.org",
                "www.example.org",
                "health-check.localdns.local",
            ] {
                let d = r.dig(to, &[name, "A", tcp, "+nsid"]);
                assert!(
                    d.raw.contains("NSID: ") && d.raw.contains(ours),
                    "{}",
                    d.raw
                );
                let d = r.dig(to, &[name, "A", tcp]);
                assert!(
                    d.status == "NOERROR" && !d.raw.contains("NSID"),
                    "{}",
                    d.raw
                );
            }
        }
    }
}
