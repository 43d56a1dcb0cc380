//! LocalDNS as a process of its own beside the real standby, as on a node: the stand-in in a
//! cgroup of its own (what the standby asks whether LocalDNS waits for a CPU), the standby entered
//! into the node namespace by `nsenter` (it sees the host's cgroup mounts), and pods' queries in an
//! open loop, each answer attributed (the stand-in's carry no record, the upstream's one).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hickory_proto::rr::RecordType;

use super::client::make_query;
use super::forwarder::{forwarder_binary, upstream_args};
use super::localdns::bind_like_coredns;
use super::netns::{Netns, Upstream};
use super::{LogCollector, poll_until, spawn_logged, unique_name};

const LISTENERS: [&str; 2] = ["169.254.10.10:53", "169.254.10.11:53"];

/// LocalDNS's server as a process of its own (the test binary itself, run as its test
/// `standin_process`, which calls [`serve_as_standin`]: every binary using it defines that test):
/// `per_address` sockets on each listener, a thread each, answering every query at once with no
/// record (the standby's answers carry one: a reply says who gave it). It makes its sockets in a
/// cgroup of its own, as LocalDNS's unit does (the cgroup is what the standby asks whether
/// LocalDNS waits for a CPU); SIGSTOP hangs it as it hangs knot or CoreDNS.
pub struct StandIn {
    child: std::process::Child,
    pub inodes: Vec<u64>,
    cgroups: Vec<std::path::PathBuf>,
    /// The cgroup v1 cpu controller's group it was moved to, if throttled there.
    cpu_v1: Option<std::path::PathBuf>,
}

impl StandIn {
    pub fn start(ns: &Netns, per_address: usize) -> StandIn {
        StandIn::start_costing(ns, per_address, Duration::ZERO)
    }

    /// As [`StandIn::start`], spending `cost` of CPU on each answer besides the socket calls
    /// (knot spends several times what this stand-in does, which matters under a CPU quota).
    pub fn start_costing(ns: &Netns, per_address: usize, cost: Duration) -> StandIn {
        let cgroup = localdns_fallback::standby::owners::cgroup_root()
            .join(format!("lf-standin-{}", unique_name()));
        std::fs::create_dir(&cgroup).unwrap();
        let mut child = ns
            .exec(
                std::env::current_exe().unwrap(),
                ["--exact", "standin_process", "--nocapture"],
            )
            .env("STANDIN_SOCKETS", per_address.to_string())
            .env("STANDIN_COST_NS", cost.as_nanos().to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        // Owned from here, so that a failed start still kills it and removes its cgroup.
        let mut standin = StandIn {
            child,
            inodes: Vec::new(),
            cgroups: vec![cgroup.clone()],
            cpu_v1: None,
        };
        // Into its cgroup before it makes a socket (`ip netns exec` gives it a /sys of its own,
        // without the cgroup mounts); then it may bind.
        let pid = standin.child.id().to_string();
        std::fs::write(cgroup.join("cgroup.procs"), pid).unwrap();
        std::io::Write::write_all(standin.child.stdin.as_mut().unwrap(), b"go\n").unwrap();
        let mut line = String::new();
        let mut out = std::io::BufReader::new(stdout);
        while !line.starts_with("ready") {
            line.clear();
            assert!(
                std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
                "the stand-in ended"
            );
        }
        standin.inodes = line
            .split_whitespace()
            .skip(1)
            .map(|i| i.parse().unwrap())
            .collect();
        standin
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Puts the stand-in under a CPU quota of `quota` every 100 ms, or lifts it (None): cgroup
    /// v1's cpu controller where it has one (then the v2 hierarchy beside it has none), else
    /// v2's cpu.max.
    pub fn throttle(&mut self, quota: Option<Duration>) {
        let v1 = std::path::Path::new("/sys/fs/cgroup/cpu");
        if v1.join("cpu.cfs_quota_us").exists() {
            if self.cpu_v1.is_none() {
                let dir = v1.join(format!("lf-standin-{}", unique_name()));
                std::fs::create_dir(&dir).unwrap();
                self.cgroups.push(dir.clone());
                std::fs::write(dir.join("cpu.cfs_period_us"), "100000").unwrap();
                std::fs::write(dir.join("cgroup.procs"), self.child.id().to_string()).unwrap();
                self.cpu_v1 = Some(dir);
            }
            let us = quota.map_or("-1".to_string(), |q| q.as_micros().to_string());
            let dir = self.cpu_v1.as_ref().unwrap();
            std::fs::write(dir.join("cpu.cfs_quota_us"), us).unwrap();
        } else {
            let us = quota.map_or("max".to_string(), |q| q.as_micros().to_string());
            std::fs::write(self.cgroups[0].join("cpu.max"), format!("{us} 100000")).unwrap();
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for c in self.cgroups.iter().rev() {
            let _ = std::fs::remove_dir(c);
        }
    }
}

/// The stand-in's own process, for the test `standin_process` of a binary using [`StandIn`]:
/// nothing unless this binary was started by `StandIn::start`.
pub fn serve_as_standin() {
    let Ok(per_address) = std::env::var("STANDIN_SOCKETS") else {
        return;
    };
    let cost = Duration::from_nanos(std::env::var("STANDIN_COST_NS").unwrap().parse().unwrap());
    std::io::stdin().read_line(&mut String::new()).unwrap();
    let mut inodes = Vec::new();
    for l in LISTENERS {
        for _ in 0..per_address.parse::<usize>().unwrap() {
            let (udp, tcp) = bind_like_coredns(l.parse().unwrap(), 16);
            inodes.push(
                nix::sys::stat::fstat(udp.as_fd())
                    .unwrap()
                    .st_ino
                    .to_string(),
            );
            std::thread::spawn(move || {
                let _tcp = tcp;
                let mut buf = [0u8; 512];
                loop {
                    if let Ok((n, from)) = udp.recv_from(&mut buf) {
                        if n >= 12 {
                            let spent = Instant::now();
                            while spent.elapsed() < cost {}
                            buf[2] |= 0x80;
                            let _ = udp.send_to(&buf[..n], from);
                        }
                    }
                }
            });
        }
    }
    println!("ready {}", inodes.join(" "));
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// One query: when it was sent, and when and by whom it was answered.
#[derive(Clone, Copy)]
pub struct Sample {
    pub sent: Instant,
    pub answered: Option<(Instant, By)>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum By {
    LocalDns,
    Standby,
}

const CLIENT_SOCKETS: usize = 16;

/// One client socket's answers, by query ID.
type Answers = Arc<Mutex<Vec<Option<(Instant, By)>>>>;

/// Pods' queries from the node namespace: `rate` a second (open loop: a late answer holds
/// nothing back), alternating the listeners, for `how_long`; answers are awaited `linger` more.
pub fn open_loop(ns: &Netns, rate: u32, how_long: Duration, linger: Duration) -> Vec<Sample> {
    let sockets: Vec<Arc<UdpSocket>> = (0..CLIENT_SOCKETS)
        .map(|_| Arc::new(ns.enter(|| UdpSocket::bind("0.0.0.0:0").unwrap())))
        .collect();
    let total = (rate as f64 * how_long.as_secs_f64()) as usize;
    let per_socket = total.div_ceil(CLIENT_SOCKETS);
    assert!(per_socket < 65536, "IDs run out");
    let start = Instant::now();
    let end = start + how_long + linger;
    let answers: Vec<Answers> = (0..CLIENT_SOCKETS)
        .map(|_| Arc::new(Mutex::new(vec![None; per_socket])))
        .collect();
    let receivers: Vec<JoinHandle<()>> = sockets
        .iter()
        .zip(&answers)
        .map(|(s, a)| {
            let (s, a) = (s.clone(), a.clone());
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                let mut buf = [0u8; 512];
                while Instant::now() < end {
                    let Ok(n) = s.recv(&mut buf) else { continue };
                    if n < 12 {
                        continue;
                    }
                    let id = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
                    let by = if buf[7] > 0 {
                        By::Standby
                    } else {
                        By::LocalDns
                    };
                    if let Some(slot) = a.lock().unwrap().get_mut(id) {
                        slot.get_or_insert((Instant::now(), by));
                    }
                }
            })
        })
        .collect();
    let mut query = make_query("a.example.", RecordType::A, 0, None);
    let mut sent = vec![vec![start; per_socket]; CLIENT_SOCKETS];
    let targets: Vec<SocketAddr> = LISTENERS.iter().map(|l| l.parse().unwrap()).collect();
    for i in 0..per_socket * CLIENT_SOCKETS {
        let due = start + Duration::from_secs_f64(i as f64 / f64::from(rate));
        let now = Instant::now();
        if due > now + Duration::from_micros(300) {
            std::thread::sleep(due - now);
        }
        let (k, id) = (i % CLIENT_SOCKETS, i / CLIENT_SOCKETS);
        query[..2].copy_from_slice(&(id as u16).to_be_bytes());
        sent[k][id] = Instant::now();
        let _ = sockets[k].send_to(&query, targets[id % 2]);
    }
    for r in receivers {
        r.join().unwrap();
    }
    let mut samples = Vec::new();
    for (k, a) in answers.iter().enumerate() {
        let a = a.lock().unwrap();
        for id in 0..per_socket {
            samples.push(Sample {
                sent: sent[k][id],
                answered: a[id],
            });
        }
    }
    samples.sort_by_key(|s| s.sent);
    samples
}

/// The standby in `ns` by `nsenter`, not `ip netns exec`: it sees the host's /sys and its cgroup
/// mounts, as the daemon does on a node (it asks LocalDNS's cgroup whether LocalDNS waits for a
/// CPU). SIGKILLed when dropped.
pub struct Standby {
    child: std::process::Child,
    log: LogCollector,
}

impl Standby {
    pub fn spawn(ns: &Netns, up: &Upstream, extra: &[&str]) -> Standby {
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", ns.name))
            .arg(forwarder_binary())
            .args(upstream_args(up, &["--standby", "--log-level", "debug"]))
            .args(extra);
        let (child, log) = spawn_logged(cmd, "localdns-fallback");
        Standby { child, log }
    }

    pub fn logs(&self) -> String {
        self.log.text()
    }

    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        poll_until(timeout, || self.logs().contains(needle).then_some(())).is_some()
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node namespace, one upstream answering 10.0.0.1, the stand-in LocalDNS `localdns` makes, and
/// the standby (with `args`) beside it, standing by.
pub fn standby_beside(
    localdns: impl FnOnce(&Netns) -> StandIn,
    args: &[&str],
) -> (
    super::netns::Topology,
    Upstream,
    super::responder::Responder,
    StandIn,
    Standby,
) {
    let (topo, up, r) = super::rig::node_and_upstream();
    let localdns = localdns(&topo.node);
    let f = Standby::spawn(&topo.node, &up, args);
    assert!(
        f.wait_for_log("standing by", Duration::from_secs(10)),
        "{}",
        f.logs()
    );
    std::thread::sleep(Duration::from_millis(300));
    (topo, up, r, localdns, f)
}

/// Pods asking both listeners every `every`, each query from a new socket (a new flow) waiting up
/// to `wait`, for `how_long`. An answer with a record is the upstream's (through the standby),
/// one without is the stand-in LocalDNS's; a query that cannot be sent (no route while the
/// addresses are on no interface) is unanswered, as it is for a pod.
pub fn new_flows(
    ns: &Netns,
    every: Duration,
    wait: Duration,
    how_long: Duration,
) -> JoinHandle<Vec<Sample>> {
    let at = super::netns::Place::from(ns);
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut askers = Vec::new();
        let mut id = 0u16;
        while started.elapsed() < how_long {
            for to in ["169.254.10.10:53", "169.254.10.11:53"] {
                id = id.wrapping_add(1);
                let query = make_query("a.example.", RecordType::A, id, None);
                let at = at.clone();
                let sent = Instant::now();
                askers.push(std::thread::spawn(move || {
                    let to: SocketAddr = to.parse().unwrap();
                    let reply = super::client::udp_exchange(at, to, &query, wait);
                    let by = |r: &[u8]| match r.len() > 7 && r[7] > 0 {
                        true => By::Standby,
                        false => By::LocalDns,
                    };
                    Sample {
                        sent,
                        answered: reply.map(|r| (Instant::now(), by(&r))),
                    }
                }));
            }
            std::thread::sleep(every);
        }
        let mut samples: Vec<Sample> = askers.into_iter().map(|t| t.join().unwrap()).collect();
        samples.sort_by_key(|s| s.sent);
        samples
    })
}
