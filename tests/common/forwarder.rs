//! The forwarder under test, run as a child process at a [`Place`]: inside a namespace the test
//! built, or on the host serving loopback addresses (no root needed).

use super::client::dns_answers;
use super::metrics::Metrics;
use super::netns::{Netns, Place, Upstream};
use super::{LogCollector, kill_and_reap, spawn_logged};
use nix::sys::signal::Signal;
use std::net::SocketAddr;
use std::process::{Child, ExitStatus};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The name LocalDNS's probes query; any reply counts as alive.
pub const HEALTH_CHECK_NAME: &str = "health-check.localdns.local.";

/// Path of the project binary built by cargo for these tests.
pub fn forwarder_binary() -> &'static str {
    env!("CARGO_BIN_EXE_localdns-fallback")
}

/// `localdns-fallback status ARGS` in `ns` (on the default listeners): its exit status and the
/// first line it printed.
pub fn status(ns: &Netns, args: &[&str]) -> (i32, String) {
    let out = (ns.exec(forwarder_binary(), ["status"]).args(args))
        .output()
        .expect("run status");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or_default().to_string();
    eprintln!("status {args:?}: exit {:?}: {line}", out.status.code());
    (out.status.code().unwrap_or(-1), line)
}

/// Flags for a forwarder whose every upstream is `up` (both groups), then `extra`.
pub fn upstream_args(up: &Upstream, extra: &[&str]) -> Vec<String> {
    let up = up.sock_v4().to_string();
    let mut args: Vec<String> = ["--node-upstream", &up, "--cluster-upstream", &up]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A running `localdns-fallback`; dropping it SIGKILLs and reaps it.
/// Its stdout and stderr lines are collected (see [`Forwarder::logs`]).
pub struct Forwarder {
    child: Mutex<Child>,
    pid: u32,
    log: LogCollector,
    /// Where it runs: where its metrics endpoint is reached.
    at: Place,
}

/// How the binary is started, besides its flags and environment.
#[derive(Clone, Copy, Debug, Default)]
pub struct Launch {
    /// Under this many descriptors (soft and hard limit, set by `prlimit`, which then execs the
    /// binary: the pid is the forwarder's).
    pub nofile: Option<u64>,
    /// Entered into its namespace by `nsenter --net`, not `ip netns exec`: it sees the host's
    /// /sys and its cgroup mounts, as the daemon does on a node (the standby asks LocalDNS's
    /// cgroup whether LocalDNS waits for a CPU), and not `/etc/netns/<name>`.
    pub host_sys: bool,
}

impl Forwarder {
    /// Spawns the binary with `args` at `at`, inheriting our environment.
    pub fn spawn(at: impl Into<Place>, args: &[String]) -> Forwarder {
        Forwarder::spawn_with_env(at, args, &[])
    }

    /// As [`Forwarder::spawn`], with extra environment variables (e.g.
    /// `("RUST_LOG", "debug")`).
    pub fn spawn_with_env(
        at: impl Into<Place>,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Forwarder {
        Forwarder::launch(at, args, env, Launch::default())
    }

    /// The standby in `ns` as on a node (see [`Launch::host_sys`]), every upstream `up`, logging
    /// at debug level, with `extra` flags.
    pub fn standby(ns: &Netns, up: &Upstream, extra: &[&str]) -> Forwarder {
        let mut flags = vec!["--standby", "--log-level", "debug"];
        flags.extend_from_slice(extra);
        let launch = Launch {
            host_sys: true,
            ..Launch::default()
        };
        Forwarder::launch(ns, &upstream_args(up, &flags), &[], launch)
    }

    /// The one way the binary is started: with `args` and `env` at `at`, as `how` says.
    pub fn launch(
        at: impl Into<Place>,
        args: &[String],
        env: &[(&str, &str)],
        how: Launch,
    ) -> Forwarder {
        // Network rule: the forwarder must never discover the VNet DNS from the host's own
        // resolv.conf or DHCP leases (they name this machine's real DNS servers; `ip netns exec`
        // keeps the host's /run).
        let has = |flag: &str| args.iter().any(|a| a == flag);
        assert!(
            has("--node-upstream") || (has("--resolv-conf") && has("--dhcp-leases")),
            "a test forwarder needs --node-upstream, or --resolv-conf with --dhcp-leases: {args:?}"
        );
        let at = at.into();
        let (prog, mut all) = match how.nofile {
            None => (forwarder_binary().to_string(), Vec::new()),
            Some(n) => (
                "prlimit".to_string(),
                vec![
                    format!("--nofile={n}:{n}"),
                    "--".into(),
                    forwarder_binary().into(),
                ],
            ),
        };
        all.extend(args.iter().cloned());
        let mut cmd = match (&at, how.host_sys) {
            (Place::Ns(name), true) => {
                let mut cmd = std::process::Command::new("nsenter");
                cmd.arg(format!("--net=/run/netns/{name}"))
                    .arg(prog)
                    .args(all);
                cmd
            }
            _ => at.command(prog, all),
        };
        if at == Place::Here {
            // Logs as plain text, whatever the environment of the test run.
            cmd.env_remove("JOURNAL_STREAM");
        }
        cmd.envs(env.iter().copied());
        let (child, log) = spawn_logged(cmd, "localdns-fallback");
        Forwarder {
            pid: child.id(),
            child: Mutex::new(child),
            log,
            at,
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `sig` to the forwarder; panics if it cannot be delivered.
    /// (The pid cannot have been reused: we reap the child only in
    /// [`Forwarder::wait_exit`] and Drop.)
    pub fn signal(&self, sig: Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), sig)
            .unwrap_or_else(|e| panic!("cannot send {sig} to forwarder {}: {e}", self.pid));
    }

    /// Waits up to `timeout` for the process to exit; its status, or None if
    /// it is still running. Can be called again after it returned a status.
    pub fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The exit status if the process has exited, without waiting.
    pub fn try_exit_status(&self) -> Option<ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        child.try_wait().ok().flatten()
    }

    pub fn is_running(&self) -> bool {
        self.try_exit_status().is_none()
    }

    /// Everything printed so far on stdout and stderr, one line per line.
    pub fn logs(&self) -> String {
        self.log.text()
    }

    /// Waits up to `timeout` for a log line containing `needle`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        super::poll_until(timeout, || {
            self.log
                .lines()
                .iter()
                .any(|l| l.contains(needle))
                .then_some(())
        })
        .is_some()
    }

    /// Polls `addr` from `at` with UDP queries for
    /// `health-check.localdns.local` until one gets any reply. Panics, with
    /// the forwarder's logs, if it exits first or `timeout` passes.
    pub fn wait_ready(&self, at: impl Into<Place>, addr: SocketAddr, timeout: Duration) {
        let at = at.into();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                panic!(
                    "forwarder exited ({status}) before answering on {addr}; logs:\n{}",
                    self.logs()
                );
            }
            if dns_answers(&at, addr, HEALTH_CHECK_NAME, Duration::from_millis(200)) {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "forwarder did not answer on {addr} within {timeout:?}; logs:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The address one listener (`node` or `cluster`) serves, from its start-up log line: the
    /// way to learn a port the kernel picked for a listener given port 0. Waits up to `timeout`.
    pub fn listening_on(&self, listener: &str, timeout: Duration) -> SocketAddr {
        let tag = format!("listener=\"{listener}\"");
        let found = super::poll_until(timeout, || {
            if self.try_exit_status().is_some() {
                return None;
            }
            let lines = self.log.lines();
            let line = lines
                .iter()
                .find(|l| l.contains("serving UDP and TCP") && l.contains(&tag))?;
            let at = line.find(" addr=")? + " addr=".len();
            line[at..].split_whitespace().next()?.parse().ok()
        });
        found.unwrap_or_else(|| {
            panic!(
                "the {listener} listener did not come up within {timeout:?}; logs:\n{}",
                self.logs()
            )
        })
    }
}

impl Forwarder {
    /// Where its metrics endpoint serves, from its start-up log line (the port may be the
    /// kernel's pick). Waits up to 10 s; panics, with the logs, if it does not come up.
    pub fn metrics_addr(&self) -> SocketAddr {
        let found = super::poll_until(Duration::from_secs(10), || {
            let lines = self.log.lines();
            let line = lines.iter().find(|l| l.contains("serving /metrics"))?;
            let at = line.find("addr=Some(")? + "addr=Some(".len();
            line[at..].split(')').next()?.parse().ok()
        });
        found.unwrap_or_else(|| panic!("no metrics endpoint came up; logs:\n{}", self.logs()))
    }

    /// One scrape of its `/metrics`, from where it runs.
    pub fn metrics(&self) -> Metrics {
        Metrics::fetch(&self.at, self.metrics_addr())
    }

    /// One scrape of its `/metrics` by `curl`, from where it runs.
    pub fn curl_metrics(&self) -> Metrics {
        Metrics::curl(&self.at, self.metrics_addr())
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        kill_and_reap(child);
    }
}
