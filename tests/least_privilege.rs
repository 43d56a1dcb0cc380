//! After start-up the daemon keeps only the capabilities discovery needs, in its own sets and in
//! the bounding set its tools inherit, and still does its job with them.

mod common;

use std::time::Duration;

use common::*;

const NET_ADMIN_AND_RAW: u64 = (1 << 12) | (1 << 13);

/// Every thread's sets, named `thread name: field`. Capabilities belong to a thread, not to the
/// process: a thread started before the drop (an async runtime's worker, say) keeps them all,
/// and so does every tool it runs.
fn capabilities(pid: u32) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    for task in tasks {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let name = status.lines().next().unwrap_or("").to_string();
        for field in ["CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            let line = status.lines().find(|l| l.starts_with(field)).unwrap();
            let hex = line.split_whitespace().nth(1).unwrap();
            out.push((
                format!("{name}: {field}"),
                u64::from_str_radix(hex, 16).unwrap(),
            ));
        }
    }
    assert!(
        out.len() >= 4 * 3,
        "main, relay and runtime threads: {out:?}"
    );
    out
}

#[test]
fn with_upstreams_given_it_keeps_no_capability_at_all() {
    let n = Rig::namespaces()
        .upstream(Mode::Normal {
            answer_v4: "10.0.0.1".parse().unwrap(),
        })
        .start();
    let f = &n.fwd;
    for (field, value) in capabilities(f.pid()) {
        assert_eq!(value, 0, "{field} is {value:#x}; logs:\n{}", f.logs());
    }
    // Still serving on port 53 without CAP_NET_BIND_SERVICE: the sockets were bound before.
    let r = dig(
        n.node_ns(),
        &["@169.254.10.11", "kubernetes.default.svc.cluster.local"],
    );
    assert_eq!(r.answers, ["10.0.0.1"], "{}", r.raw);
}

#[test]
fn discovering_kube_dns_keeps_only_net_admin_and_net_raw_and_still_reads_iptables() {
    require_root_and_tools(&["ip", "dig", "iptables-restore"]);
    let topo = Topology::new();
    let up = topo.add_upstream_ns(true, false);
    let _r = Responder::start(
        &up.ns,
        up.sock_v4(),
        Mode::Normal {
            answer_v4: "10.0.0.1".parse().unwrap(),
        },
    );
    let dir = TempDir::new("lp");
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {}\n", up.v4.unwrap())).unwrap();
    let rules = |pod: &str| {
        format!(
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]\n:KUBE-SEP-A - [0:0]\n\
             -A KUBE-SERVICES -d 10.0.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns cluster IP\" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU\n\
             -A KUBE-SVC-TCOU7JCQXEZGVUNU -j KUBE-SEP-A\n\
             -A KUBE-SEP-A -p udp -m udp -j DNAT --to-destination {pod}\nCOMMIT\n"
        )
    };
    let load = |text: String| {
        let file = dir.path().join("nat.rules");
        std::fs::write(&file, text).unwrap();
        run_ok(&mut topo.node.exec("iptables-restore", [file.to_str().unwrap()]));
    };
    load(rules("198.18.1.99:53"));
    let args: Vec<String> = [
        "--resolv-conf",
        resolv.to_str().unwrap(),
        "--dhcp-leases",
        "none",
        "--discovery",
        "iptables",
        "--rediscover-interval",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let f = Forwarder::spawn(&topo.node, &args);
    f.wait_ready(
        &topo.node,
        "169.254.10.11:53".parse().unwrap(),
        Duration::from_secs(10),
    );
    for (field, value) in capabilities(f.pid()) {
        let want = if field.ends_with("CapAmb") {
            0
        } else {
            NET_ADMIN_AND_RAW
        };
        assert_eq!(value, want, "{field} is {value:#x}; logs:\n{}", f.logs());
    }
    // iptables run by the unprivileged daemon still reads the rules: move the backend.
    load(rules(&up.sock_v4().to_string()));
    let moved = poll_until(Duration::from_secs(8), || {
        let r = dig(
            &topo.node,
            &[
                "@169.254.10.11",
                &format!("n{}.svc.cluster.local", rand_suffix()),
            ],
        );
        (r.answers == ["10.0.0.1"]).then_some(())
    });
    assert!(
        moved.is_some(),
        "discovery works with the reduced set; logs:\n{}",
        f.logs()
    );
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}
