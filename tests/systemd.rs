//! End to end under a real systemd as PID 1: our units and binary inside containers booted
//! with `systemd-nspawn --boot`, on two systemd generations, against a stand-in LocalDNS shaped like
//! AKS's `localdns.service`, installed the one way every node gets them (`units/install.sh`: the
//! standby unit enabled, and the node image's two lines on localdns.service, added where it lacks
//! them).
//!
//! - Debian 12 "bookworm", systemd 252: `OnFailure=` fires once, at the terminal failure (like AKS's
//!   Ubuntu 22.04);
//! - Debian 13 "trixie", systemd 257: `OnFailure=` fires on every failed start attempt (like Ubuntu
//!   24.04).
//!
//! Each test boots its own container from a cached root file system (`tests/systemd/build-rootfs.sh`,
//! built once under `/var/cache/localdns-fallback-tests/`) with `--volatile=overlay`, so it starts
//! clean and never writes to the cache. The container has its own network namespace
//! (`--private-network`): the stand-in LocalDNS (`tests/systemd/localdns.{service,sh}`), VNet DNS and
//! kube-dns pod (`tests/systemd/upstreams.sh`) and every query the tests send live inside it. The
//! test drives the container with `systemctl`/`journalctl` run inside it through `nsenter` (there is
//! no machined on a host without systemd), and queries it with the host's `dig` entered into the
//! container's network namespace. Each answer's address says who gave it (`tests/systemd/markers.env`).
//!
//! Teardown (also on panic): every container runs in a cgroup of its own, created by the test; `Drop`
//! kills that whole cgroup (`cgroup.kill`: the container, nspawn and anything they started), then
//! removes the cgroups and the temporary directory. The network namespace and the overlay go away
//! with the last process. If the test process itself is killed (Drop never runs, and the
//! container's PID 1 outlives nspawn), a small reaper shell per container notices and does the same.
//!
//! The measured windows (outage, takeover, handoff) are printed per run (run with `--nocapture` to
//! see them as they come) and summarised, median and worst, in
//! `target/tmp/systemd-node-image-<suite>-<boot>.md`; `LOCALDNS_E2E_RUNS` sets the number of runs
//! (default 3). `LOCALDNS_E2E_BINARY=PATH` runs the scenarios with another build of the binary (e.g.
//! the release build) instead of the one cargo built for this test.

mod common;

use std::fmt::Write as _;
use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{TempDir, kill_and_reap, poll_until, require_root_and_tools};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");
const BINARY: &str = env!("CARGO_BIN_EXE_localdns-fallback");

/// The binary installed into the containers: this build's, unless LOCALDNS_E2E_BINARY names another.
fn binary() -> String {
    std::env::var("LOCALDNS_E2E_BINARY").unwrap_or_else(|_| BINARY.to_owned())
}

/// The stand-in CoreDNS and the prober (tests/systemd/standin.rs, plain `std`; see
/// `common::standin_program`).
fn standin() -> PathBuf {
    common::standin_program()
}

/// Where the root file systems are cached between runs (see build-rootfs.sh).
const ROOTFS_CACHE: &str = "/var/cache/localdns-fallback-tests";
/// Prefix of every container and cgroup name this file makes.
const PREFIX: &str = "lf-e2e";

// The names asked and the marker addresses each stand-in answers with; the same values are in
// tests/systemd/markers.env, which the stand-ins read.
const CLUSTER_NAME: &str = "kubernetes.default.svc.cluster.local";
const EXTERNAL_NAME: &str = "www.example.com";
const LOCALDNS_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const LOCALDNS_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const KUBEDNS_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 53);
const VNETDNS_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 16);

#[path = "systemd/asking.rs"]
mod asking;
#[path = "systemd/container.rs"]
mod container;
#[path = "systemd/node_image.rs"]
mod node_image;

use asking::*;
use container::*;

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

/// Scenario 4: the fallback `OnFailure=` starts (the standby disabled) serves whatever LocalDNS's
/// failure left behind, and never touches LocalDNS's link: it serves from the listener addresses
/// it puts on `lo`, and removes them when it leaves.
/// (a) graceful failures: LocalDNS's EXIT trap deleted the link, and resolv.conf still names only
///     169.254.10.10 when the fallback starts (networkd's reload is late; the test holds it back):
///     .11 and cluster names are served at once, and external names on .10 too, through the VNet
///     DNS of networkd's DHCP lease; still so once resolv.conf names it; no link `localdns` is made;
/// (b) a crash storm: the link and both addresses survive and are left as they are;
/// (c) a crash storm after which the link is down and has lost 169.254.10.11: still served, and
///     the link is left as it is (LocalDNS recreates it on its next start).
fn failure_paths(suite: Suite) {
    // The fallback as `OnFailure=` starts it, fresh, knowing nothing of the node yet: the
    // standby, beside LocalDNS since boot, learned the VNet DNS long before (s9 covers it).
    let boot = Boot {
        image_lines: false,
        standby: false,
    };
    let mut c = Container::boot(suite, boot);

    // (a) graceful: CoreDNS dies, the script's EXIT trap deletes the link, every restart fails
    // the same way; and resolved has not rewritten resolv.conf yet (the test holds the reload).
    c.ok("touch /run/localdns-test/resolved-hold");
    c.set_localdns_failure(Some("graceful"));
    c.ok("kill -TERM $(cat /run/localdns-test/coredns.pid)");
    c.wait_localdns_failed_and_served();
    let resolv = c.ok("cat /run/systemd/resolve/resolv.conf");
    if resolv.contains("168.63.129.16") || !resolv.contains("169.254.10.10") {
        c.fail(&format!(
            "precondition: resolv.conf should still name only 169.254.10.10 here:\n{resolv}"
        ));
    }
    c.expect_answers_on(
        &[PROBES[0], NODE_CLUSTER_PROBE],
        Who::Fallback,
        "stale resolv.conf",
    );
    // External names: the VNet DNS of the DHCP lease (tests/systemd/upstreams.sh writes it).
    let asked = mono_us();
    c.expect_answers_on(&[PROBES[1]], Who::Fallback, "stale resolv.conf, DHCP lease");
    let external_after = ms(mono_us() - asked);
    let logs = c.ok(&format!(
        "journalctl --no-pager -q -o cat -u {}",
        c.serving_unit()
    ));
    if !logs.contains("source=\"DHCP leases /run/systemd/netif/leases\"") {
        c.fail(&format!(
            "stale resolv.conf: expected the VNet DNS taken from the DHCP leases:\n{logs}"
        ));
    }
    // Now networkd's reload lands: resolv.conf names the VNet DNS, and external names still go
    // there.
    // Read within a second of the reload (`follow`'s period), on the same server.
    c.ok("rm /run/localdns-test/resolved-hold && /opt/test/localdns.sh resolved-reload");
    c.expect_answers_throughout(&[PROBES[1]], Who::Fallback, Duration::from_secs(2));
    eprintln!(
        "[{}] graceful path: with resolv.conf stale the fallback served .11, cluster names and \
         external ones (VNet DNS from the DHCP lease, answered {external_after:.0} ms after we asked)",
        suite.label(),
    );
    c.expect_answers(Who::Fallback, "graceful path");
    let link = c.link();
    if link.ifindex.is_some() {
        c.fail(&format!(
            "graceful path: the fallback must not make LocalDNS's link (found {link:?})"
        ));
    }
    c.assert_listener_addresses_on_lo(true, "graceful path, fallback serving");
    let p = Prober::start(&c, "graceful-recovery");
    c.recover_localdns();
    wait_settled_on_localdns(&mut c, Some(&p));
    let dark = dark_time(&p.finish());
    eprintln!(
        "[{}] recovery after failed starts that exited: dark {}",
        suite.label(),
        brief(dark)
    );
    c.assert_handed_back("recovery after the graceful path");
    if !c.link().complete() {
        c.fail(&format!("LocalDNS's link after recovery: {:?}", c.link()));
    }
    eprintln!(
        "[{}] graceful path: served from lo without a localdns link, handed back, lo cleaned",
        suite.label()
    );

    // (b) crash: nothing cleans up; the link stays exactly as the crash left it.
    let before = c.link();
    c.crash_storm();
    c.wait_localdns_failed_and_served();
    let after = c.link();
    if after != before {
        c.fail(&format!(
            "crash path: expected the link left as it was (before {before:?}, now {after:?})"
        ));
    }
    let p = Prober::start(&c, "crash-recovery");
    c.recover_localdns();
    wait_settled_on_localdns(&mut c, Some(&p));
    eprintln!(
        "[{}] recovery after failed starts that were killed: dark {}",
        suite.label(),
        brief(dark_time(&p.finish()))
    );
    c.assert_handed_back("recovery after the crash path");
    eprintln!(
        "[{}] crash path: surviving link left alone, served, handed back",
        suite.label()
    );

    // (c) crash, and meanwhile the link went down and lost .11 (the storm takes seconds; the
    // crashing restarts do not touch the link).
    c.crash_storm();
    c.ok("ip addr del 169.254.10.11/32 dev localdns && ip link set localdns down");
    let before = c.link();
    c.wait_localdns_failed_and_served();
    let after = c.link();
    if after != before {
        c.fail(&format!(
            "partial link: expected the link left as it was (before {before:?}, now {after:?})"
        ));
    }
    c.recover_localdns();
    wait_settled_on_localdns(&mut c, None);
    c.assert_handed_back("recovery after the partial link");
    if !c.link().complete() {
        c.fail(&format!("LocalDNS's link after recovery: {:?}", c.link()));
    }
    eprintln!(
        "[{}] partial link: served from lo, link left to LocalDNS, handed back",
        suite.label()
    );
}

/// Scenario 5: a wedged fallback (SIGSTOP: alive, listeners bound, answering nothing) stops
/// feeding the watchdog (the unit's own WatchdogSec=2s); systemd kills it and restarts it, and the
/// new process serves. Measured: pods' dark time from the SIGSTOP.
fn wedged_fallback(suite: Suite) {
    let mut c = Container::boot(suite, Boot::default());
    let unit = c.serving_unit();
    c.crash_storm();
    c.wait_localdns_failed_and_served();
    let pid = c.show(unit, "MainPID");
    let cursor = c.cursor();
    let p = Prober::start(&c, "wedged");
    c.ok(&format!("kill -STOP {pid}"));
    c.wait_until("a new fallback process", Duration::from_secs(40), |c| {
        let now = c.show(unit, "MainPID");
        now != pid && now != "0" && c.show(unit, "ActiveState") == "active"
    });
    c.expect_answers(Who::Fallback, "the restarted fallback serves");
    p.watch(SETTLED_ROUNDS);
    let d = dark_time(&p.finish());
    let journal = c.journal_since(&cursor);
    if !journal.contains(&format!("{unit}: Watchdog timeout")) {
        c.fail(&format!("no watchdog timeout in the journal:\n{journal}"));
    }
    let restarts = c.show_us(unit, "NRestarts");
    assert!(restarts >= 1, "NRestarts={restarts}");
    eprintln!(
        "[{}] wedged {unit} (pid {pid}) killed by the watchdog and restarted; pods dark {:.0} ms (.11), {:.0} ms (.10 cluster)",
        suite.label(),
        d[0].0,
        d[1].0
    );
    // The unit's budget is under 3 s (WatchdogSec=2s, pings every 500 ms, RestartSec=200ms);
    // the margin is for a loaded test machine.
    if d[0].0 > 6000.0 {
        c.fail(&format!(
            "a wedged fallback left pods dark {:.0} ms",
            d[0].0
        ));
    }
}

/// Scenario 6 and the static checks: on a healthy node, with the standby standing by, a start of
/// `localdns-fallback.service` by hand (what `OnFailure=` does) finds LocalDNS answering, takes
/// no flow and ends cleanly (inactive, not failed); `systemd-analyze verify` is clean; the
/// `systemd-analyze security` exposure is OK or better (printed with its top complaints); the
/// uninstall removes exactly what the install put there.
fn healthy_node_and_static_checks(suite: Suite) {
    let mut c = Container::boot(suite, Boot::default());
    let p = Prober::start(&c, "hand-start");
    let cursor = c.cursor();
    let start = c.exec("systemctl start localdns-fallback.service");
    if !start.status.success() {
        c.fail(&format!(
            "`systemctl start localdns-fallback` on a healthy node failed: {}",
            String::from_utf8_lossy(&start.stderr)
        ));
    }
    c.wait_until(
        "the hand-started fallback to end",
        Duration::from_secs(10),
        |c| {
            !matches!(
                c.show("localdns-fallback.service", "ActiveState").as_str(),
                "active" | "activating" | "deactivating"
            )
        },
    );
    p.watch(SETTLED_ROUNDS);
    let samples = p.finish();
    let taken = samples.iter().filter(|s| s.who != Who::LocalDns).count();
    let journal = c.journal_since(&cursor);
    if taken > 0 {
        c.fail(&format!(
            "a start by hand on a healthy node took or lost {taken} of {} probes:\n{journal}",
            samples.len()
        ));
    }
    if !journal.contains("LocalDNS answers on both listeners; not taking over") {
        c.fail(&format!(
            "the hand-started fallback did not say why it stood down:\n{journal}"
        ));
    }
    c.assert_handed_back("after a start by hand on a healthy node");
    c.assert_no_unit_failed("after a start by hand on a healthy node");
    eprintln!(
        "[{}] healthy node: a start by hand took none of {} probes and ended cleanly",
        suite.label(),
        samples.len()
    );

    // systemd-analyze verify of our units and the drop-in (loaded with the stand-in
    // localdns.service), and install.sh's own check of the node.
    let verify = c.exec(
        "cd / && systemd-analyze verify /etc/systemd/system/localdns-fallback.service \
         /etc/systemd/system/localdns-fallback-standby.service /etc/systemd/system/localdns.service 2>&1",
    );
    let text = String::from_utf8_lossy(&verify.stdout).trim().to_owned();
    if !verify.status.success() || !text.is_empty() {
        c.fail(&format!(
            "systemd-analyze verify is not clean ({}):\n{text}",
            verify.status
        ));
    }

    // systemd-analyze security: overall exposure and the top complaints.
    let sec = c.ok("systemd-analyze security --no-pager localdns-fallback.service");
    let overall = sec
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| c.fail(&format!("no overall exposure in:\n{sec}")))
        .trim()
        .to_owned();
    let mut complaints: Vec<(f64, String)> = sec
        .lines()
        .filter(|l| l.starts_with('✗'))
        .filter_map(|l| {
            let score: f64 = l.split_whitespace().last()?.parse().ok()?;
            Some((score, l.split_whitespace().collect::<Vec<_>>().join(" ")))
        })
        .collect();
    complaints.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut report = format!(
        "[{}] systemd-analyze security: {overall}\n  top complaints:\n",
        suite.label()
    );
    for (_, l) in complaints.iter().take(8) {
        let _ = writeln!(report, "    {l}");
    }
    eprintln!("{report}");
    let file = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("systemd-e2e-security-{}.txt", suite.name()));
    fs::write(&file, format!("{report}\n{sec}")).unwrap();
    let levels = [
        "PERFECT",
        "SAFE",
        "OK",
        "MEDIUM",
        "EXPOSED",
        "UNSAFE",
        "DANGEROUS",
    ];
    let level = overall
        .split_whitespace()
        .find(|w| levels.contains(w))
        .unwrap_or("");
    if !matches!(level, "OK" | "SAFE" | "PERFECT") {
        c.fail(&format!("exposure should be OK or better: {overall}"));
    }
    let check = c.exec("/opt/units/install.sh --check 2>&1");
    if !check.status.success() {
        c.fail(&format!(
            "install.sh --check on the installed node: {}",
            String::from_utf8_lossy(&check.stdout)
        ));
    }

    // Uninstall removes exactly what install put there, and leaves LocalDNS's own files alone.
    let listing =
        "find /etc/systemd/system /opt/azure -newer /etc/hostname -not -type d 2>/dev/null | sort";
    let installed = c.ok(listing);
    c.ok("/opt/units/install.sh --uninstall");
    let left = c.ok(listing);
    let removed: Vec<&str> = installed
        .lines()
        .filter(|l| !left.lines().any(|k| k == *l))
        .collect();
    let expected = [
        "/etc/systemd/system/localdns-fallback-standby.service",
        "/etc/systemd/system/localdns-fallback.service",
        "/etc/systemd/system/localdns.service.d/50-localdns-fallback.conf",
        "/etc/systemd/system/multi-user.target.wants/localdns-fallback-standby.service",
        "/opt/azure/containers/localdns/localdns-fallback",
    ];
    if removed != expected {
        c.fail(&format!(
            "uninstall removed {removed:?}, expected exactly {expected:?}"
        ));
    }
}

/// The scenarios, once per systemd generation.
macro_rules! generation {
    ($module:ident, $suite:expr) => {
        mod $module {
            use super::*;

            #[test]
            fn s4_graceful_crash_and_partial_link_failure_paths() {
                failure_paths($suite);
            }

            #[test]
            fn s5_wedged_fallback_is_killed_by_the_watchdog_and_restarted() {
                wedged_fallback($suite);
            }

            #[test]
            fn s6_healthy_node_start_stands_down_and_units_verify() {
                healthy_node_and_static_checks($suite);
            }

            #[test]
            fn s8_standby_disabled_the_on_failure_start_alone_phases() {
                node_image::phases(
                    $suite,
                    Boot {
                        image_lines: true,
                        standby: false,
                    },
                );
            }

            #[test]
            fn s9_lines_added_by_install_and_the_standby_phases_and_a_hung_localdns() {
                node_image::phases($suite, Boot::default());
            }

            #[test]
            fn s10_standby_killed_and_restarted_beside_a_serving_localdns_takes_no_flow() {
                node_image::standby_restarts_beside_a_serving_localdns($suite);
            }
        }
    };
}

generation!(bookworm_systemd_252, Suite::Bookworm);
generation!(trixie_systemd_257, Suite::Trixie);
