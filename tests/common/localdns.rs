//! LocalDNS as the fallback meets it, played by one stand-in ([`LocalDns`]): UDP and TCP on
//! 169.254.10.10 and .11 port 53, every socket with SO_REUSEPORT as CoreDNS binds them,
//! answering every query at once with no record (the fallback's answers carry one: a reply says
//! who gave it). It runs as a process of its own in a cgroup of its own, as LocalDNS's unit runs
//! it (what the standby asks whether LocalDNS waits for a CPU): told to hang it blocks; SIGSTOP
//! stops it as it stops knot or CoreDNS; a CPU quota starves it. Its serving is one copy,
//! `localdns/serve.rs`, which the stand-in program of the systemd containers
//! (`tests/systemd/standin.rs`) runs too.
//!
//! Beside it: pods asking both listeners, each answer attributed ([`open_loop`], [`new_flows`]).

#[path = "localdns/serve.rs"]
pub mod serve;

use std::io::BufRead;
use std::net::{SocketAddr, SocketAddrV4, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hickory_proto::rr::RecordType;

use super::client::make_query;
use super::forwarder::Forwarder;
use super::netns::{Netns, Place};
use super::{kill_and_reap, kill_with_parent, poll_until, unique_name};
use serve::LISTENERS;

/// UDP and TCP sockets on `addr` with SO_REUSEPORT, as CoreDNS binds its listeners, in the
/// namespace the calling thread is in; blocking, as the socket calls make them.
pub fn bind_like_coredns(addr: SocketAddr, backlog: i32) -> (UdpSocket, TcpListener) {
    let SocketAddr::V4(v4) = addr else {
        panic!("CoreDNS's listeners are IPv4: {addr}")
    };
    serve::bind_listener(v4, true, backlog)
        .unwrap_or_else(|e| panic!("cannot bind {addr} as CoreDNS does: {e}"))
}

/// The stand-in program (`tests/systemd/standin.rs` with the serving it includes, plain `std`),
/// compiled once per source version with the rustc of this toolchain into the target directory.
pub fn standin_program() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            use std::hash::{Hash, Hasher};
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
            let src = dir.join("systemd/standin.rs");
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for file in [&src, &dir.join("common/localdns/serve.rs")] {
                let text =
                    std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                text.hash(&mut h);
            }
            let out =
                Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("standin-{:016x}", h.finish()));
            if out.exists() {
                return out;
            }
            // Built in a directory of this process's own and renamed: parallel test processes
            // never run a half-written binary, and never share rustc's intermediate objects
            // (named after the output's stem, so two builds to one directory overwrite each
            // other's and the link finds no `main`).
            let dir = out.with_extension(format!("build{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let tmp = dir.join("standin");
            let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
            let built = Command::new(&rustc)
                .args(["--edition", "2021", "-O", "-o"])
                .arg(&tmp)
                .arg(&src)
                .output()
                .unwrap_or_else(|e| panic!("cannot run {rustc}: {e}"));
            assert!(
                built.status.success(),
                "{rustc} {} failed:\n{}",
                src.display(),
                String::from_utf8_lossy(&built.stderr)
            );
            std::fs::rename(&tmp, &out).unwrap();
            let _ = std::fs::remove_dir_all(&dir);
            out
        })
        .clone()
}

/// How a [`LocalDns`] is made; see [`LocalDns::with`].
#[derive(Clone, Copy, Debug)]
pub struct LocalDnsOptions {
    sockets: usize,
    cost: Duration,
}

impl LocalDnsOptions {
    /// `n` UDP and TCP sockets on each listener, a thread each (CoreDNS has one; knot, unbound
    /// or a CoreDNS with `reuseport` more). One unless given.
    pub fn sockets(mut self, n: usize) -> LocalDnsOptions {
        self.sockets = n;
        self
    }

    /// `cost` of CPU spent on each answer besides the socket calls (it matters under a CPU
    /// quota).
    pub fn cost(mut self, cost: Duration) -> LocalDnsOptions {
        self.cost = cost;
        self
    }

    /// Binds in `ns` and serves; returns once every socket is bound.
    pub fn start(self, ns: &Netns) -> LocalDns {
        let mut localdns = self.prepare(ns);
        localdns.bind();
        localdns
    }

    /// The process started in its cgroup, not bound yet: [`LocalDns::bind`] binds it within
    /// milliseconds, where starting a process takes up to a third of a second on a loaded
    /// machine (a quick restart is the old one dropped, then this bound).
    pub fn prepare(self, ns: &Netns) -> LocalDns {
        LocalDns::spawn(ns, self)
    }
}

/// The stand-in LocalDNS (see the module's doc). Dropping it kills it and removes its cgroups.
pub struct LocalDns {
    process: Process,
    /// Probe questions answered so far.
    probes: Arc<AtomicUsize>,
    first_other: Arc<Mutex<Option<String>>>,
    /// The inodes of its UDP sockets, as sock_diag names them.
    pub inodes: Vec<u64>,
    /// Its reports, until it binds.
    stdout: Option<std::process::ChildStdout>,
}

struct Process {
    child: Child,
    cgroups: Vec<PathBuf>,
    /// The cgroup v1 cpu controller's group it was moved to, if throttled there.
    cpu_v1: Option<PathBuf>,
}

impl LocalDns {
    /// One socket per listener, answering at once.
    pub fn start(ns: &Netns) -> LocalDns {
        LocalDns::with().start(ns)
    }

    /// Options, from one socket per listener, answering at once.
    pub fn with() -> LocalDnsOptions {
        LocalDnsOptions {
            sockets: 1,
            cost: Duration::ZERO,
        }
    }

    fn spawn(ns: &Netns, options: LocalDnsOptions) -> LocalDns {
        let cgroup = localdns_fallback::standby::owners::cgroup_root()
            .join(format!("lf-standin-{}", unique_name()));
        std::fs::create_dir(&cgroup)
            .unwrap_or_else(|e| panic!("cannot make {}: {e}", cgroup.display()));
        let sockets = options.sockets.to_string();
        let cost = options.cost.as_micros().to_string();
        let mut cmd = ns.exec(
            standin_program(),
            [
                "serve",
                "--for-test",
                "--delay-ms",
                "0",
                "--sockets",
                &sockets,
                "--cost-us",
                &cost,
            ],
        );
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        kill_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the stand-in ({cmd:?}): {e}"));
        let stdout = child.stdout.take();
        let pid = child.id();
        // Owned from here, so that a failed start still kills it and removes its cgroup.
        let localdns = LocalDns {
            process: Process {
                child,
                cgroups: vec![cgroup.clone()],
                cpu_v1: None,
            },
            probes: Arc::new(AtomicUsize::new(0)),
            first_other: Arc::default(),
            inodes: Vec::new(),
            stdout,
        };
        // Into its cgroup before it makes a socket (`ip netns exec` gives it a /sys of its own,
        // without the cgroup mounts); then it may bind.
        std::fs::write(cgroup.join("cgroup.procs"), pid.to_string()).unwrap();
        localdns
    }

    /// Lets a prepared stand-in bind; returns once every socket is bound.
    pub fn bind(&mut self) {
        let stdout = self.stdout.take().expect("a stand-in binds once");
        self.tell("go");
        let mut out = std::io::BufReader::new(stdout);
        let mut line = String::new();
        while !line.starts_with("ready") {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the stand-in ended before it was ready"
            );
        }
        self.inodes = line
            .split_whitespace()
            .skip(1)
            .map(|i| i.parse().unwrap())
            .collect();
        // Its report of each probe answered (and of another query), read from here on.
        let (probes, other) = (self.probes.clone(), self.first_other.clone());
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                if line == "probe" {
                    probes.fetch_add(1, Ordering::Relaxed);
                } else if let Some(name) = line.strip_prefix("other ") {
                    *other.lock().unwrap() = Some(name.to_string());
                }
            }
        });
    }

    /// A line to the stand-in on its stdin (`go`, `hang`, `serve`).
    fn tell(&self, line: &str) {
        let stdin = self.process.child.stdin.as_ref().expect("piped");
        std::io::Write::write_all(&mut &*stdin, format!("{line}\n").as_bytes())
            .unwrap_or_else(|e| panic!("cannot tell the stand-in {line}: {e}"));
    }

    /// Stops answering (true: its threads block, as a deadlocked LocalDNS's do, each holding
    /// what it read last while the rest queues unread) or answers again (false). SIGSTOP
    /// ([`LocalDns::signal`]) stops it the other way.
    pub fn hang(&self, hung: bool) {
        self.tell(if hung { "hang" } else { "serve" });
    }

    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, sig).unwrap_or_else(|e| panic!("{sig} to the stand-in: {e}"));
    }

    /// Puts the stand-in under a CPU quota of `quota` every 100 ms, or lifts it (None): cgroup
    /// v1's cpu controller where it has one (then the v2 hierarchy beside it has none), else
    /// v2's cpu.max.
    pub fn throttle(&mut self, quota: Option<Duration>) {
        let pid = self.pid();
        let process = &mut self.process;
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        if v1.join("cpu.cfs_quota_us").exists() {
            if process.cpu_v1.is_none() {
                let dir = v1.join(format!("lf-standin-{}", unique_name()));
                std::fs::create_dir(&dir).unwrap();
                process.cgroups.push(dir.clone());
                std::fs::write(dir.join("cpu.cfs_period_us"), "100000").unwrap();
                std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
                process.cpu_v1 = Some(dir);
            }
            let us = quota.map_or("-1".to_string(), |q| q.as_micros().to_string());
            let dir = process.cpu_v1.as_ref().unwrap();
            std::fs::write(dir.join("cpu.cfs_quota_us"), us).unwrap();
        } else {
            let us = quota.map_or("max".to_string(), |q| q.as_micros().to_string());
            std::fs::write(process.cgroups[0].join("cpu.max"), format!("{us} 100000")).unwrap();
        }
    }

    /// Probe questions (`health-check.localdns.local`) answered so far, on either listener.
    pub fn probes(&self) -> usize {
        self.probes.load(Ordering::Relaxed)
    }

    /// The first query for any name but the probe's that it answered, if any.
    pub fn first_other(&self) -> Option<String> {
        self.first_other.lock().unwrap().clone()
    }

    /// Waits until `standby` stands by and has had `rounds` rounds of its probe answered since
    /// (both listeners each): it has seen this LocalDNS serve. Panics, with its logs, after
    /// `timeout`.
    pub fn wait_stood_by(&self, standby: &Forwarder, rounds: usize, timeout: Duration) {
        assert!(
            standby.wait_for_log("standing by", timeout),
            "not standing by:\n{}",
            standby.logs()
        );
        let from = self.probes();
        assert!(
            poll_until(timeout, || (self.probes() >= from + 2 * rounds)
                .then_some(()))
            .is_some(),
            "the standby's probe was answered {} times in {timeout:?}:\n{}",
            self.probes() - from,
            standby.logs()
        );
    }
}

impl Drop for LocalDns {
    fn drop(&mut self) {
        kill_and_reap(&mut self.process.child);
        for c in self.process.cgroups.iter().rev() {
            let _ = std::fs::remove_dir(c);
        }
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

/// Who gave `reply`: one with a record is the upstream's (through the standby), one without the
/// stand-in LocalDNS's.
fn by(reply: &[u8]) -> By {
    match reply.len() > 7 && reply[7] > 0 {
        true => By::Standby,
        false => By::LocalDns,
    }
}

const CLIENT_SOCKETS: usize = 16;

/// One client socket's answers, by query ID.
type Answers = Arc<Mutex<Vec<Option<(Instant, By)>>>>;

fn listeners() -> [SocketAddr; 2] {
    LISTENERS.map(|ip| SocketAddrV4::new(ip, 53).into())
}

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
                    if let Some(slot) = a.lock().unwrap().get_mut(id) {
                        slot.get_or_insert((Instant::now(), by(&buf[..n])));
                    }
                }
            })
        })
        .collect();
    let mut query = make_query("a.example.", RecordType::A, 0, None);
    let mut sent = vec![vec![start; per_socket]; CLIENT_SOCKETS];
    let targets = listeners();
    for i in 0..per_socket * CLIENT_SOCKETS {
        // Pacing the load: each query leaves at its time.
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

/// Pods asking both listeners every `every`, each query from a new socket (a new flow) waiting up
/// to `wait`, for `how_long`. A query that cannot be sent (no route while the addresses are on
/// no interface) is unanswered, as it is for a pod.
pub fn new_flows(
    ns: &Netns,
    every: Duration,
    wait: Duration,
    how_long: Duration,
) -> JoinHandle<Vec<Sample>> {
    let at = Place::from(ns);
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut askers = Vec::new();
        let mut id = 0u16;
        while started.elapsed() < how_long {
            for to in listeners() {
                id = id.wrapping_add(1);
                let query = make_query("a.example.", RecordType::A, id, None);
                let at = at.clone();
                let sent = Instant::now();
                askers.push(std::thread::spawn(move || {
                    let reply = super::client::udp_exchange(at, to, &query, wait);
                    Sample {
                        sent,
                        answered: reply.map(|r| (Instant::now(), by(&r))),
                    }
                }));
            }
            // Pacing the pods: a query every `every`.
            std::thread::sleep(every);
        }
        let mut samples: Vec<Sample> = askers.into_iter().map(|t| t.join().unwrap()).collect();
        samples.sort_by_key(|s| s.sent);
        samples
    })
}
