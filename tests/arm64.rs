//! The arm64 release binary (AKS runs arm64 node pools too), run under `qemu-aarch64` (user-mode
//! emulation) on loopback: both listeners answer a relayed query over UDP and over TCP, each
//! listener routing like LocalDNS. The binary is the cross build that `units/release.sh --arch
//! arm64` makes (tests/run.sh runs it before the tests); this test never builds it, and fails,
//! naming the command, when it or qemu is missing.
//!
//! qemu-user emulates neither Landlock nor the socket filter that steers flows between LocalDNS's
//! sockets and ours (SO_ATTACH_REUSEPORT_EBPF): the binary warns about both and serves anyway. The
//! network namespaces, privileges and systemd are tested with the native build by the other files;
//! this one proves that the arm64 build starts, binds, relays and answers.

mod common;

use common::*;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `units/release.sh --arch arm64` leaves the binary.
const ARM64_BINARY: &str = "target/cross/aarch64-unknown-linux-gnu/release/localdns-fallback";
const VNET_ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const KUBE_ANSWER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// Start-up under emulation is slower than native (about 0.1 s to `--version` here); generous.
const START_TIMEOUT: Duration = Duration::from_secs(30);

fn arm64_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(ARM64_BINARY);
    assert!(
        path.is_file(),
        "no arm64 binary at {}: build it with `units/release.sh --arch arm64` (tests/run.sh does)",
        path.display()
    );
    let header = Command::new("readelf")
        .arg("--file-header")
        .arg(&path)
        .output()
        .expect("run readelf (apt-get install binutils)");
    let header = String::from_utf8_lossy(&header.stdout);
    assert!(
        header
            .lines()
            .any(|l| l.contains("Machine:") && l.contains("AArch64")),
        "{} is not an arm64 binary:\n{header}",
        path.display()
    );
    path
}

/// The arm64 forwarder under `qemu-aarch64`; dropping it SIGKILLs and reaps qemu (the emulated
/// process is qemu itself).
struct EmulatedForwarder {
    child: Child,
    log: LogCollector,
}

impl EmulatedForwarder {
    fn spawn(binary: &Path, args: &[String]) -> EmulatedForwarder {
        let mut cmd = Command::new("qemu-aarch64");
        cmd.arg(binary).args(args).env_remove("JOURNAL_STREAM");
        // The loader and C library are the arm64 ones multiarch installs (libc6:arm64, which
        // libstd-rust-web-dev:arm64 pulls in) at /lib/ld-linux-aarch64.so.1.
        let (child, log) = spawn_logged(cmd, "qemu-aarch64 localdns-fallback");
        EmulatedForwarder { child, log }
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The address a listener (`node` or `cluster`) serves, from its start-up log line.
    fn listening_on(&mut self, listener: &str) -> SocketAddr {
        let tag = format!("listener=\"{listener}\"");
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.exited() {
                panic!(
                    "the arm64 forwarder exited ({status}) before serving; logs:\n{}",
                    self.log.text()
                );
            }
            let found = self.log.lines().iter().find_map(|l| {
                if !(l.contains("serving UDP and TCP") && l.contains(&tag)) {
                    return None;
                }
                let at = l.find(" addr=")? + " addr=".len();
                l[at..].split_whitespace().next()?.parse().ok()
            });
            if let Some(addr) = found {
                return addr;
            }
            assert!(
                Instant::now() < deadline,
                "the arm64 forwarder's {listener} listener did not come up within {START_TIMEOUT:?}; logs:\n{}",
                self.log.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `addr` answers LocalDNS's probe name over UDP.
    fn wait_ready(&mut self, addr: SocketAddr) {
        let deadline = Instant::now() + START_TIMEOUT;
        while !dns_answers(
            Place::Here,
            addr,
            HEALTH_CHECK_NAME,
            Duration::from_millis(300),
        ) {
            if let Some(status) = self.exited() {
                panic!(
                    "the arm64 forwarder exited ({status}); logs:\n{}",
                    self.log.text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the arm64 forwarder did not answer on {addr} within {START_TIMEOUT:?}; logs:\n{}",
                self.log.text()
            );
        }
    }
}

impl Drop for EmulatedForwarder {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

#[test]
fn the_arm64_binary_answers_on_both_listeners_over_udp_and_tcp_under_qemu() {
    require_tools(&["qemu-aarch64", "dig", "kdig", "readelf"]);
    let binary = arm64_binary();
    let started = Instant::now();

    // It runs at all: --version under emulation.
    let version = Command::new("qemu-aarch64")
        .arg(&binary)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .expect("run qemu-aarch64 (apt-get install qemu-user)");
    assert!(
        version.status.success()
            && String::from_utf8_lossy(&version.stdout).starts_with("localdns-fallback "),
        "qemu-aarch64 {} --version failed ({}):\n{}{}",
        binary.display(),
        version.status,
        String::from_utf8_lossy(&version.stdout),
        String::from_utf8_lossy(&version.stderr)
    );

    // Two upstreams on loopback: the VNet DNS and kube-dns, each answering with its own address.
    let vnet = Responder::start(
        Place::Here,
        SocketAddr::new(IpAddr::V4(loopback_ip()), 0),
        Mode::Normal {
            answer_v4: VNET_ANSWER,
        },
    );
    let kube = Responder::start(
        Place::Here,
        SocketAddr::new(IpAddr::V4(loopback_ip()), 0),
        Mode::Normal {
            answer_v4: KUBE_ANSWER,
        },
    );
    // Loopback listeners, these upstreams by flag, no discovery, no link setup.
    let args = loopback_forwarder_args(&[vnet.addr()], &[kube.addr()], &[]);
    let mut fwd = EmulatedForwarder::spawn(&binary, &args);
    let node = fwd.listening_on("node");
    let cluster = fwd.listening_on("cluster");
    fwd.wait_ready(node);
    fwd.wait_ready(cluster);
    vnet.reset_counts();
    kube.reset_counts();
    let ready = started.elapsed();

    let cases = [
        (node, "example.com", VNET_ANSWER),
        (node, "kubernetes.default.svc.cluster.local", KUBE_ANSWER),
        (cluster, "example.com", KUBE_ANSWER),
    ];
    for (listener, name, want) in cases {
        // dig over UDP, kdig over TCP; a name per transport, so TCP is not answered from the cache.
        for transport in ["udp", "tcp"] {
            let name = format!("{transport}.{name}");
            let r = if transport == "udp" {
                dig_to(Place::Here, listener, &["+notcp", &name, "A"])
            } else {
                kdig_to(Place::Here, listener, &["+tcp", &name, "A"])
            };
            assert_eq!(
                (r.status.as_str(), r.answers.clone()),
                ("NOERROR", vec![want.to_string()]),
                "{name} over {transport} at {listener}: {}\nforwarder logs:\n{}",
                r.raw,
                fwd.log.text()
            );
        }
    }
    // Relayed, not answered locally, and TCP went upstream as TCP.
    assert!(
        vnet.udp_queries() >= 1 && vnet.tcp_queries() >= 1,
        "VNet DNS saw {} UDP and {} TCP queries",
        vnet.udp_queries(),
        vnet.tcp_queries()
    );
    assert!(
        kube.udp_queries() >= 2 && kube.tcp_queries() >= 2,
        "kube-dns saw {} UDP and {} TCP queries",
        kube.udp_queries(),
        kube.tcp_queries()
    );
    assert!(fwd.exited().is_none(), "the arm64 forwarder exited");
    eprintln!(
        "arm64 under qemu: ready {ready:.1?} after start, 6 answers over UDP and TCP in {:.1?}; its warnings:\n{}",
        started.elapsed() - ready,
        fwd.log
            .lines()
            .iter()
            .filter(|l| l.contains("WARN"))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
