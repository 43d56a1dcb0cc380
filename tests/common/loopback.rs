//! The forwarder on loopback, without root or namespaces: both listeners on ephemeral ports of
//! 127.0.0.1 and 127.0.0.2 (UDP and TCP share each port), upstreams given by flag, discovery
//! off. The addresses it bound are read from its own start-up log.

use super::forwarder::forwarder_binary;
use super::{LogCollector, kill_and_reap, poll_until, spawn_logged};
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::Duration;

/// A forwarder serving on loopback; dropping it SIGKILLs and reaps it.
pub struct LoopbackForwarder {
    child: Child,
    log: LogCollector,
    pub node: SocketAddr,
    pub cluster: SocketAddr,
}

impl LoopbackForwarder {
    /// Starts the binary relaying the node listener's external names to `vnet_dns` and
    /// everything of kube-dns to `kube_dns`, with `extra` flags.
    pub fn start(vnet_dns: SocketAddr, kube_dns: SocketAddr, extra: &[&str]) -> LoopbackForwarder {
        let mut cmd = Command::new(forwarder_binary());
        cmd.args([
            "--node-listen",
            "127.0.0.1:0",
            "--cluster-listen",
            "127.0.0.2:0",
            "--node-upstream",
            &vnet_dns.to_string(),
            "--cluster-upstream",
            &kube_dns.to_string(),
            "--discovery",
            "none",
            "--no-link-setup",
            "--log-level",
            "debug",
        ]);
        cmd.args(extra);
        // Logs as plain text, whatever the environment of the test run.
        cmd.env_remove("JOURNAL_STREAM");
        let (child, log) = spawn_logged(cmd, "localdns-fallback");
        let mut f = LoopbackForwarder {
            child,
            log,
            node: "0.0.0.0:0".parse().expect("literal"),
            cluster: "0.0.0.0:0".parse().expect("literal"),
        };
        let bound = poll_until(Duration::from_secs(10), || {
            let lines = f.log.lines();
            let node = bound_addr(&lines, "node")?;
            let cluster = bound_addr(&lines, "cluster")?;
            lines
                .iter()
                .any(|l| l.contains(" ready"))
                .then_some((node, cluster))
        });
        let Some((node, cluster)) = bound else {
            panic!("the forwarder did not get ready; logs:\n{}", f.logs());
        };
        (f.node, f.cluster) = (node, cluster);
        f
    }

    pub fn logs(&self) -> String {
        self.log.text()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The `addr=` of the "serving UDP and TCP" line of one listener (`node` or `cluster`).
fn bound_addr(lines: &[String], listener: &str) -> Option<SocketAddr> {
    let tag = format!("listener=\"{listener}\"");
    let line = lines
        .iter()
        .find(|l| l.contains("serving UDP and TCP") && l.contains(&tag))?;
    let at = line.find(" addr=")? + " addr=".len();
    line[at..].split_whitespace().next()?.parse().ok()
}

impl Drop for LoopbackForwarder {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}
