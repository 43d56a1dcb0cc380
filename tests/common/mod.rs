//! Integration-test harness: network namespaces, a scriptable DNS responder,
//! real DNS servers (dnsmasq, unbound), the forwarder under test and DNS clients.
//!
//! Network rule: every packet a test sends goes to a loopback address or to an
//! address inside a namespace the test created; nothing is sent from the host
//! namespace to a non-loopback address. Every resource is released in `Drop`, also when a
//! test panics.
//!
//! Each integration test binary does `mod common; use common::*;` and uses a
//! subset of this module, hence the module-level `allow(dead_code)`.
#![allow(dead_code)]

pub mod client;
pub mod figure;
pub mod forwarder;
pub mod hostile;
pub mod localdns;
pub mod metrics;
pub mod netns;
pub mod responder;
pub mod rig;
pub mod servers;

// Re-exports for `use common::*`; a binary that uses none of a module's items
// would otherwise warn.
#[allow(unused_imports)]
pub use client::*;
#[allow(unused_imports)]
pub use figure::*;
#[allow(unused_imports)]
pub use forwarder::*;
#[allow(unused_imports)]
pub use hostile::*;
#[allow(unused_imports)]
pub use localdns::*;
#[allow(unused_imports)]
pub use metrics::*;
#[allow(unused_imports)]
pub use netns::*;
#[allow(unused_imports)]
pub use responder::*;
#[allow(unused_imports)]
pub use rig::*;
#[allow(unused_imports)]
pub use servers::*;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Panics unless we run as root and every tool in `tools` is on PATH.
/// Tests must fail loudly when their environment is incomplete, never skip.
pub fn require_root_and_tools(tools: &[&str]) {
    assert!(
        effective_uid() == Some(0),
        "these integration tests need root (network namespaces, veth, port 53): run `sudo cargo test`"
    );
    require_tools(tools);
}

/// Panics unless every tool in `tools` is on PATH.
pub fn require_tools(tools: &[&str]) {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| which(t).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "required tools not found on PATH: {missing:?} (PATH={:?})",
        std::env::var("PATH").unwrap_or_default()
    );
}

/// The effective uid, from /proc/self/status (nix's geteuid needs a feature
/// this crate does not enable).
pub(crate) fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    // "Uid:\treal\teffective\tsaved\tfs"
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Full path of `tool` if an executable file of that name is on PATH.
pub fn which(tool: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|p| {
            p.metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// A name unique within this machine for as long as this process lives:
/// `lf{pid}x{n}`. Short, because interface names are limited to 15 bytes.
pub fn unique_name() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("lf{}x{}", std::process::id(), n)
}

/// A directory under /tmp removed (recursively) on drop.
pub struct TempDir {
    path: std::path::PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("{}-{tag}", unique_name()));
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("cannot create temp dir {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("harness: cannot remove {}: {e}", self.path.display());
        }
    }
}

/// Collects the stdout and stderr lines of a child process, in arrival order,
/// from two detached reader threads (they end when the pipes close).
#[derive(Clone, Default)]
pub struct LogCollector {
    lines: Arc<Mutex<Vec<String>>>,
}

impl LogCollector {
    /// Takes the piped stdout/stderr out of `child` and starts reading them.
    pub fn attach(child: &mut Child) -> LogCollector {
        let collector = LogCollector::default();
        if let Some(out) = child.stdout.take() {
            collector.spawn_reader(out);
        }
        if let Some(err) = child.stderr.take() {
            collector.spawn_reader(err);
        }
        collector
    }

    fn spawn_reader(&self, pipe: impl std::io::Read + Send + 'static) {
        use std::io::BufRead;
        let lines = Arc::clone(&self.lines);
        // Detached on purpose: joining could hang if a grandchild inherited the
        // pipe; the thread ends by itself at EOF.
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn text(&self) -> String {
        self.lines().join("\n")
    }
}

/// Makes the child get SIGKILL when the thread that spawned it exits, so that a
/// test process killed hard (SIGKILL, abort) leaves no servers behind.
/// Caveat: the signal follows the *spawning thread*, not the process: do not
/// spawn a long-lived process from a short-lived helper thread.
pub(crate) fn kill_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        })
    }
}

/// Spawns `cmd` with piped stdout/stderr, returning the child and its log.
pub(crate) fn spawn_logged(mut cmd: Command, what: &str) -> (Child, LogCollector) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    kill_with_parent(&mut cmd);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {what} ({cmd:?}): {e}"));
    let log = LogCollector::attach(&mut child);
    (child, log)
}

/// SIGKILLs and reaps a child; never panics (it runs in Drop).
pub(crate) fn kill_and_reap(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Calls `f` every 20 ms until it returns Some or `timeout` passes.
pub fn poll_until<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
