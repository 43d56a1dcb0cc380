//! Asking the container's listeners as pods do: one `dig` at a time, or the stand-in prober
//! every 20 ms; who answered is read off the marker address of the answer.

use super::*;

// ---------------------------------------------------------------------------------------------
// Asking: dig from the host, entered into the container's network namespace
// ---------------------------------------------------------------------------------------------

/// One question at one listener, and the marker answers that identify who replied.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Probe {
    pub(crate) label: &'static str,
    pub(crate) server: &'static str,
    pub(crate) name: &'static str,
    pub(crate) localdns: Ipv4Addr,
    pub(crate) fallback: Ipv4Addr,
}

/// `.11` (ClusterFirst pods) asked a cluster name: the fallback answers from kube-dns.
/// `.10` (the node) asked an external name: the fallback answers from the VNet DNS, which it learns
/// from the DHCP lease while resolv.conf still names only LocalDNS (see localdns.sh `cleanup`).
pub(crate) const PROBES: [Probe; 2] = [
    Probe {
        label: ".11 cluster name",
        server: "169.254.10.11",
        name: CLUSTER_NAME,
        localdns: LOCALDNS_CLUSTER_IP,
        fallback: KUBEDNS_CLUSTER_IP,
    },
    Probe {
        label: ".10 external name",
        server: "169.254.10.10",
        name: EXTERNAL_NAME,
        localdns: LOCALDNS_EXTERNAL_IP,
        fallback: VNETDNS_EXTERNAL_IP,
    },
];

/// `.10` asked a cluster name: the fallback sends it to kube-dns, not to the VNet DNS.
pub(crate) const NODE_CLUSTER_PROBE: Probe = Probe {
    label: ".10 cluster name",
    server: "169.254.10.10",
    name: CLUSTER_NAME,
    localdns: LOCALDNS_CLUSTER_IP,
    fallback: KUBEDNS_CLUSTER_IP,
};

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Who {
    LocalDns,
    Fallback,
    /// An answer with an address neither should give (a routing bug).
    Other(String),
    /// No answer: refused, unreachable, timeout, SERVFAIL or empty.
    Nobody,
}

pub(crate) fn dig(leader: u32, probe: Probe) -> Who {
    let out = Command::new("nsenter")
        .arg(format!("--target={leader}"))
        .args(["--net", "--", "dig", "+time=1", "+tries=1", "+short"])
        .arg(format!("@{}", probe.server))
        .args([probe.name, "A"])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("cannot run nsenter dig");
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(addr) = text.lines().find_map(|l| l.trim().parse::<Ipv4Addr>().ok()) else {
        return Who::Nobody;
    };
    if addr == probe.localdns {
        Who::LocalDns
    } else if addr == probe.fallback {
        Who::Fallback
    } else {
        Who::Other(addr.to_string())
    }
}

// ---------------------------------------------------------------------------------------------
// Measurements: per run, then median and worst per generation
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
pub(crate) struct Windows {
    /// (metric label, values in ms)
    pub(crate) series: Vec<(String, Vec<f64>)>,
}

impl Windows {
    /// Adds a phase's dark time and failed probes per target; returns them too.
    pub(crate) fn record(&mut self, phase: &str, samples: &[ProbeSample]) -> [(f64, usize); 3] {
        let d = dark_time(samples);
        for (t, (dark, failed)) in d.iter().enumerate() {
            self.add(&format!("{phase}: dark {} (ms)", PROBE_LABELS[t]), *dark);
            self.add(
                &format!("{phase}: failed probes {}", PROBE_LABELS[t]),
                *failed as f64,
            );
        }
        d
    }

    pub(crate) fn add(&mut self, label: &str, ms: f64) {
        match self.series.iter_mut().find(|(l, _)| l == label) {
            Some((_, v)) => v.push(ms),
            None => self.series.push((label.to_owned(), vec![ms])),
        }
    }

    pub(crate) fn summary(&self, suite: Suite) -> String {
        let mut out = format!(
            "systemd end-to-end windows, {} — median / worst over runs (prober: every {PROBE_EVERY_MS} ms, {PROBE_TIMEOUT_MS} ms timeout)\n\n\
             | measure | median | worst | runs |\n|---|---|---|---|\n",
            suite.label(),
        );
        for (label, values) in &self.series {
            let mut v = values.clone();
            v.sort_by(f64::total_cmp);
            let median = if v.len() % 2 == 1 {
                v[v.len() / 2]
            } else {
                (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
            };
            let _ = writeln!(
                out,
                "| {label} | {median:.0} | {:.0} | {} |",
                v[v.len() - 1],
                v.len()
            );
        }
        out
    }
}

/// A phase's dark time per target, for a run's log line.
pub(crate) fn brief(d: [(f64, usize); 3]) -> String {
    format!(
        "{:.0}/{:.0}/{:.0} ms ({}/{}/{} failed)",
        d[0].0, d[1].0, d[2].0, d[0].1, d[1].1, d[2].1
    )
}

pub(crate) fn runs() -> usize {
    std::env::var("LOCALDNS_E2E_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3)
}

// ---------------------------------------------------------------------------------------------
// LocalDNS's failure lifecycle, phase by phase, as pods see it
// ---------------------------------------------------------------------------------------------

/// What the prober asks (tests/systemd/standin.rs `probe`): `.11` and `.10` a cluster name (served
/// by kube-dns through the fallback) and `.10` an external name (served by the VNet DNS, which the
/// fallback learns from resolv.conf, possibly only a moment after it starts).
pub(crate) const PROBE_TARGETS: [(&str, &str, [Ipv4Addr; 2]); 3] = [
    (
        "169.254.10.11",
        CLUSTER_NAME,
        [LOCALDNS_CLUSTER_IP, KUBEDNS_CLUSTER_IP],
    ),
    (
        "169.254.10.10",
        CLUSTER_NAME,
        [LOCALDNS_CLUSTER_IP, KUBEDNS_CLUSTER_IP],
    ),
    (
        "169.254.10.10",
        EXTERNAL_NAME,
        [LOCALDNS_EXTERNAL_IP, VNETDNS_EXTERNAL_IP],
    ),
];
pub(crate) const PROBE_LABELS: [&str; 3] = [".11 cluster", ".10 cluster", ".10 external"];
/// The prober's cadence and patience: a query every 20 ms per target, 100 ms to answer.
pub(crate) const PROBE_EVERY_MS: u64 = 20;
pub(crate) const PROBE_TIMEOUT_MS: u64 = 100;
/// Prober rounds that show a state settled: at the start of a phase, and after its end.
pub(crate) const SETTLED_ROUNDS: usize = 15;

#[derive(Clone, Debug)]
pub(crate) struct ProbeSample {
    /// When the query was sent and when its answer (or the timeout) came, CLOCK_MONOTONIC µs.
    pub(crate) sent: u64,
    pub(crate) done: u64,
    pub(crate) target: usize,
    /// Who answered in time (Nobody: no answer within the timeout, refused, or a wrong one).
    pub(crate) who: Who,
}

impl ProbeSample {
    pub(crate) fn ok(&self) -> bool {
        matches!(self.who, Who::LocalDns | Who::Fallback)
    }
}

/// The prober, running inside the container's namespaces until [`Prober::finish`].
pub(crate) struct Prober {
    pub(crate) child: Option<Child>,
    pub(crate) file: PathBuf,
}

impl Prober {
    pub(crate) fn start(c: &Container, tag: &str) -> Prober {
        let name = format!("probe-{}-{tag}.txt", c.suite.name());
        let file = c.tmp.path().join("out").join(&name);
        let _ = fs::remove_file(&file);
        let _ = fs::remove_file(file.with_extension("txt.stop"));
        let mut cmd = c.nsenter(&["--all"]);
        cmd.arg("/opt/bin/standin")
            .arg("probe")
            .arg(format!("/opt/out/{name}"))
            .args(["--every-ms", &PROBE_EVERY_MS.to_string()])
            .args(["--timeout-ms", &PROBE_TIMEOUT_MS.to_string()])
            .args(PROBE_TARGETS.iter().map(|(s, n, _)| format!("{s}={n}")))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().expect("cannot start the prober");
        let p = Prober {
            child: Some(child),
            file,
        };
        // Its first samples: the phase starts from a serving node.
        p.watch(SETTLED_ROUNDS);
        p
    }

    /// Waits until the prober has written `rounds` more rounds of samples (every target asked
    /// that often): the phase's tail, seen for what was asked rather than for a fixed time.
    pub(crate) fn watch(&self, rounds: usize) {
        let lines = || fs::read_to_string(&self.file).map_or(0, |t| t.lines().count());
        let want = lines() + rounds * PROBE_TARGETS.len();
        let wrote = poll_until(Duration::from_secs(20), || (lines() >= want).then_some(()));
        let file = self.file.display();
        assert!(
            wrote.is_some(),
            "the prober wrote {} of {want} samples in 20 s ({file})",
            lines()
        );
    }

    /// Stops the prober and returns its samples, ordered by when they were sent.
    pub(crate) fn finish(mut self) -> Vec<ProbeSample> {
        fs::write(self.file.with_extension("txt.stop"), "").unwrap();
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        let text = fs::read_to_string(&self.file).unwrap_or_default();
        // Kept for a look at the raw samples after the run.
        if let Some(name) = self.file.file_name() {
            let _ = fs::write(Path::new(env!("CARGO_TARGET_TMPDIR")).join(name), &text);
        }
        let mut v: Vec<ProbeSample> = text
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let [sent, done, target, answer] = w[..] else {
                    return None;
                };
                let (server, name) = target.split_once('=')?;
                let t = PROBE_TARGETS
                    .iter()
                    .position(|(s, n, _)| *s == server && *n == name)?;
                let [localdns, fallback] = PROBE_TARGETS[t].2;
                let who = match answer.parse::<Ipv4Addr>() {
                    Ok(a) if a == localdns => Who::LocalDns,
                    Ok(a) if a == fallback => Who::Fallback,
                    Ok(a) => Who::Other(a.to_string()),
                    Err(_) => Who::Nobody,
                };
                Some(ProbeSample {
                    sent: sent.parse().ok()?,
                    done: done.parse().ok()?,
                    target: t,
                    who,
                })
            })
            .collect();
        v.sort_by_key(|s| s.sent);
        v
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }
}

/// Per target: (dark ms, failed probes). Dark is the time from each first failed probe to the
/// next answered one, summed over the phase.
pub(crate) fn dark_time(samples: &[ProbeSample]) -> [(f64, usize); 3] {
    let mut out = [(0.0, 0); 3];
    for (t, slot) in out.iter_mut().enumerate() {
        let mut dark_since: Option<u64> = None;
        for s in samples.iter().filter(|s| s.target == t) {
            match (s.ok(), dark_since) {
                (false, None) => {
                    dark_since = Some(s.sent);
                    slot.1 += 1;
                }
                (false, Some(_)) => slot.1 += 1,
                (true, Some(since)) => {
                    slot.0 += ms(s.sent - since);
                    dark_since = None;
                }
                (true, None) => {}
            }
        }
        if let (Some(since), Some(last)) = (dark_since, samples.last()) {
            slot.0 += ms(last.sent - since);
        }
    }
    out
}

/// Waits until LocalDNS is active, the fallback is not running and the addresses are off lo;
/// then, with a prober, for its view of the settled state (part of the phase).
pub(crate) fn wait_settled_on_localdns(c: &mut Container, p: Option<&Prober>) {
    c.wait_until("LocalDNS active", Duration::from_secs(30), |c| {
        c.show("localdns.service", "ActiveState") == "active"
    });
    c.wait_until("the fallback to leave", Duration::from_secs(15), |c| {
        !matches!(
            c.show("localdns-fallback.service", "ActiveState").as_str(),
            "active" | "activating" | "deactivating"
        )
    });
    c.expect_answers(Who::LocalDns, "LocalDNS serves, settled");
    // The standby takes the listener addresses off lo once it has handed back.
    c.wait_until(
        "the listener addresses off lo",
        Duration::from_secs(5),
        |c| !c.ok("ip -o -4 addr show dev lo").contains("169.254.10.1"),
    );
    if let Some(p) = p {
        p.watch(SETTLED_ROUNDS);
    }
}
