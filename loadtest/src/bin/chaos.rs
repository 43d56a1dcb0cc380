//! chaos: the standby beside knot (as LocalDNS) under load while a seeded schedule hits knot, every
//! query attributed; run by `loadtest/chaos.sh` (which builds it and says how to read it).
//!
//!   chaos --standby BIN --responder BIN --out DIR --name PREFIX [--seed N] [--minutes M]
//!         [--lf-args 'FLAGS']   (more flags for the standby, e.g. '--log-level debug')
//!
//! Builds two network namespaces (PREFIX-node, PREFIX-up) like the tests' node and upstream:
//! knot on 169.254.10.10 and .11 (4 UDP workers, each on its own SO_REUSEPORT socket per address,
//! in cgroups PREFIX-knot of its own: the v2 one the standby reads, the cpu one that squeezes it),
//! the standby (`--standby`, entered by nsenter so that it sees the cgroup mounts) forwarding to the
//! harness's responder. Pods' queries: 2,000 a second to .11 and 500 to .10, each a new name
//! (no cache answers), open loop. knot's wildcard zone answers 192.0.2.1, the responder the name's
//! derived 10.x.y.z: the address says who answered. A query answered after 1 s is late; one with
//! no answer (or that could not be sent) is lost.
//!
//! Writes into DIR: timeline.csv (per 100 ms of send time: LocalDNS, standby, late, lost),
//! events.csv, hands.csv (every take and hand-back, from the standby's log, stamped as read),
//! resources.csv (the standby's RSS, fds, threads, CPU and its /metrics counters, every second),
//! summary.json, timeline.png, standby.log, knot.log; prints the verdict line last.
//! Everything it makes is removed when it ends, also on SIGINT/SIGTERM.

use std::fmt::Write as _;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loadtest::dns;

const NODE: &str = "169.254.10.10";
const CLUSTER: &str = "169.254.10.11";
const UPSTREAM: &str = "198.18.1.2:53";
const METRICS: &str = "127.0.0.1:9353";
/// Queries a second to .11 and to .10 (as the run: pods and the host).
const RATE_CLUSTER: u64 = 2_000;
const RATE_NODE: u64 = 500;
const SOCKETS: usize = 8;
const LATE: Duration = Duration::from_secs(1);
const BUCKET: Duration = Duration::from_millis(100);
/// After a fault ends, what is still its doing: knot's restart, the hand-back (with whatever
/// longer proof a LocalDNS taken from again must give) and queries answered late. Shorter than
/// the shortest gap between faults, so windows never overlap.
const AFTERMATH: Duration = Duration::from_secs(8);
/// Before a fault starts, what is already its doing: a query sent this shortly before is still
/// in flight when knot is killed or its addresses go (read and not yet answered), and is lost to
/// the fault. Far longer than an answer takes (well under a millisecond), far shorter than the
/// gap between faults.
const IN_FLIGHT: Duration = Duration::from_millis(100);
const KNOT_ANSWER: [u8; 4] = [192, 0, 2, 1];

static STOP: AtomicBool = AtomicBool::new(false);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
    STOP.store(true, Ordering::Relaxed);
}

fn stopping() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Sleeps `d`, or less when asked to stop.
fn nap(d: Duration) {
    let end = Instant::now() + d;
    while !stopping() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// SplitMix64: the schedule from the seed, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi] seconds.
    fn secs(&mut self, lo: f64, hi: f64) -> Duration {
        Duration::from_secs_f64(lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

fn sh(cmd: &str) -> Result<(), String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `f` on a thread of its own in namespace `ns`: sockets it makes belong there.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("open the namespace");
        // SAFETY: setns on a descriptor we own; it changes only this thread's namespace.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("thread in namespace")
}

/// What the run made, removed on drop: processes in its namespaces, the namespaces, the cgroups.
struct World {
    prefix: String,
    node: String,
    /// knot's cgroup in the v2 hierarchy (what the standby reads), and its cpu cgroup where the
    /// cpu controller is v1's.
    v2: PathBuf,
    cpu_v1: Option<PathBuf>,
}

impl World {
    fn build(prefix: &str) -> Result<World, String> {
        let node = format!("{prefix}-node");
        let up = format!("{prefix}-up");
        let unified = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/unified")
        };
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let w = World {
            prefix: prefix.to_string(),
            node: node.clone(),
            v2: unified.join(format!("{prefix}-knot")),
            cpu_v1: v1
                .join("cpu.cfs_quota_us")
                .exists()
                .then(|| v1.join(format!("{prefix}-knot"))),
        };
        for dir in std::iter::once(&w.v2).chain(&w.cpu_v1) {
            std::fs::create_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        for cmd in [
            format!("ip netns add {node}"),
            format!("ip netns add {up}"),
            format!("ip -n {node} link set lo up"),
            format!("ip -n {up} link set lo up"),
            format!("ip -n {node} link add localdns type veth peer name localdns-p"),
            format!("ip -n {node} addr add {NODE}/32 dev localdns"),
            format!("ip -n {node} addr add {CLUSTER}/32 dev localdns"),
            format!("ip -n {node} link set localdns up"),
            format!("ip -n {node} link set localdns-p up"),
            format!("ip -n {node} link add up1 type veth peer name eth0 netns {up}"),
            format!("ip -n {node} addr add 198.18.1.1/24 dev up1"),
            format!("ip -n {up} addr add 198.18.1.2/24 dev eth0"),
            format!("ip -n {node} link set up1 up"),
            format!("ip -n {up} link set eth0 up"),
        ] {
            sh(&cmd)?;
        }
        Ok(w)
    }

    fn up(&self) -> String {
        format!("{}-up", self.prefix)
    }

    fn addresses(&self, add: bool) {
        for a in [NODE, CLUSTER] {
            let verb = if add { "add" } else { "del" };
            if let Err(e) = sh(&format!(
                "ip -n {} addr {verb} {a}/32 dev localdns",
                self.node
            )) {
                eprintln!("chaos: {e}");
            }
        }
    }

    /// knot's CPU: squeezed to `quota` of every 100 ms, or (None) unlimited. With cgroup v1's cpu
    /// controller knot is in a group of its own only while squeezed: v1 weighs a group as one task
    /// of the root's, and on a machine busy with other work that alone left knot's threads
    /// waiting hundreds of milliseconds (its probe unanswered).
    fn squeeze(&self, pid: u32, quota: Option<Duration>) {
        let done = match &self.cpu_v1 {
            Some(dir) => {
                let us = quota.map_or("-1".to_string(), |q| q.as_micros().to_string());
                let to = if quota.is_some() {
                    dir.as_path()
                } else {
                    Path::new("/sys/fs/cgroup/cpu")
                };
                std::fs::write(dir.join("cpu.cfs_period_us"), "100000")
                    .and_then(|_| std::fs::write(dir.join("cpu.cfs_quota_us"), us))
                    .and_then(|_| std::fs::write(to.join("cgroup.procs"), pid.to_string()))
            }
            None => {
                let us = quota.map_or("max".to_string(), |q| q.as_micros().to_string());
                std::fs::write(self.v2.join("cpu.max"), format!("{us} 100000"))
            }
        };
        if let Err(e) = done {
            eprintln!("chaos: cpu quota: {e}");
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for ns in [self.node.clone(), self.up()] {
            for _ in 0..50 {
                let out = Command::new("ip").args(["netns", "pids", &ns]).output();
                let pids: Vec<i32> = out
                    .map(|o| {
                        String::from_utf8_lossy(&o.stdout)
                            .split_whitespace()
                            .filter_map(|p| p.parse().ok())
                            .collect()
                    })
                    .unwrap_or_default();
                if pids.is_empty() {
                    break;
                }
                for p in pids {
                    // SAFETY: kill has no memory effects; these are processes in our namespace.
                    unsafe { libc::kill(p, libc::SIGKILL) };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
        for dir in std::iter::once(&self.v2).chain(&self.cpu_v1) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// knot as LocalDNS, restartable.
struct Knot {
    dir: PathBuf,
    node: String,
    cgroup: PathBuf,
    child: Option<Child>,
}

impl Knot {
    fn new(out: &Path, w: &World) -> Knot {
        let dir = out.join("knot");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("load.test.zone"),
            "$ORIGIN load.test.\n$TTL 300\n@ SOA ns.load.test. hostmaster.load.test. 1 3600 600 86400 300\n\
             @ NS ns\nns A 192.0.2.53\n* A 192.0.2.1\n",
        )
        .unwrap();
        let d = dir.display();
        std::fs::write(
            dir.join("knot.conf"),
            format!(
                "server:\n    rundir: \"{d}\"\n    user: root:root\n    listen: [ {NODE}@53, {CLUSTER}@53 ]\n\
                 \x20   udp-workers: 4\n    tcp-workers: 1\n    tcp-reuseport: on\n    background-workers: 1\n\
                 control:\n    listen: \"{d}/knot.sock\"\nlog:\n  - target: stderr\n    any: warning\n\
                 database:\n    storage: \"{d}\"\ntemplate:\n  - id: default\n    storage: \"{d}\"\n\
                 \x20   file: \"%s.zone\"\nzone:\n  - domain: load.test\n"
            ),
        )
        .unwrap();
        Knot {
            dir,
            node: w.node.clone(),
            cgroup: w.v2.clone(),
            child: None,
        }
    }

    /// Starts knotd in its cgroup (joined by the shell before it execs knotd, so every thread is in
    /// it from the start).
    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.parent().unwrap().join("knot.log"))
            .unwrap();
        let join = format!("echo $$ > {}/cgroup.procs && ", self.cgroup.display());
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{join}exec ip netns exec {} knotd -c {}/knot.conf",
                self.node,
                self.dir.display()
            ))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn knotd");
        self.child = Some(child);
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(c) = &self.child {
            // SAFETY: kill has no memory effects; the child is ours and not yet reaped.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// Waits up to `within` for knotd to exit, then kills it; reaps it.
    fn reap(&mut self, within: Duration) {
        if let Some(mut c) = self.child.take() {
            let end = Instant::now() + within;
            while Instant::now() < end && c.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Knot {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.reap(Duration::ZERO);
    }
}

/// A take or a hand-back, as the standby logged it.
#[derive(Clone)]
struct Hand {
    at: Duration,
    take: bool,
    cause: String,
    instance: u32,
}

/// The standby daemon, restartable; its log lines are stamped as they arrive.
struct Standby {
    bin: String,
    extra: Vec<String>,
    node: String,
    child: Option<Child>,
    pid: Arc<AtomicU32>,
    instance: u32,
}

impl Standby {
    fn start(
        &mut self,
        t0: Instant,
        hands: &Arc<Mutex<Vec<Hand>>>,
        log: &Arc<Mutex<std::fs::File>>,
    ) {
        self.instance += 1;
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.node))
            .arg(&self.bin)
            .args([
                "--standby",
                "--node-upstream",
                UPSTREAM,
                "--cluster-upstream",
                UPSTREAM,
            ])
            .args(["--metrics", METRICS])
            .args(&self.extra)
            .env_remove("JOURNAL_STREAM")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the standby");
        self.pid.store(child.id(), Ordering::Relaxed);
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let (hands, log, instance) = (hands.clone(), log.clone(), self.instance);
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    let at = t0.elapsed();
                    let _ = writeln!(
                        log.lock().unwrap(),
                        "{:9.3} #{instance} {line}",
                        at.as_secs_f64()
                    );
                    let take = line.find("; serving its listeners");
                    if take.is_some() || line.contains("LocalDNS answers again") {
                        let cause = take.map_or("", |i| {
                            let start = line[..i].find("INFO ").map_or(0, |s| s + 5);
                            &line[start..i]
                        });
                        hands.lock().unwrap().push(Hand {
                            at,
                            take: take.is_some(),
                            cause: cause.to_string(),
                            instance,
                        });
                    }
                }
            });
        }
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            self.pid.store(0, Ordering::Relaxed);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        self.kill();
    }
}

const BY_NONE: u8 = 0;
const BY_LOCALDNS: u8 = 1;
const BY_STANDBY: u8 = 2;
const BY_OTHER: u8 = 3;

/// Every query of the run, by sequence number (its name is `c<seq>.load.test.`).
struct Ledger {
    sent_us: Vec<AtomicU64>,
    latency_us: Vec<AtomicU32>,
    by: Vec<AtomicU8>,
}

/// The pods: an open loop of new names from `SOCKETS` sockets in the node namespace, each read by
/// a thread of its own.
fn load(
    node: &str,
    t0: Instant,
    seconds: u64,
    ledger: Arc<Ledger>,
) -> std::thread::JoinHandle<u64> {
    let sockets: Vec<Arc<UdpSocket>> = in_ns(node, || {
        (0..SOCKETS)
            .map(|_| Arc::new(UdpSocket::bind("0.0.0.0:0").expect("bind a client socket")))
            .collect()
    });
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = sockets
        .iter()
        .map(|s| {
            let (s, ledger, done) = (s.clone(), ledger.clone(), done.clone());
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                let mut buf = [0u8; 1500];
                while !done.load(Ordering::Relaxed) {
                    let Ok(n) = s.recv(&mut buf) else { continue };
                    let now = t0.elapsed().as_micros() as u64;
                    let msg = &buf[..n];
                    let (Some(_), Some(q_end)) = (dns::reply_head(msg), dns::question_end(msg))
                    else {
                        continue;
                    };
                    let qname = &msg[dns::HEADER..q_end - 4];
                    let Some(seq) = seq_of(qname) else { continue };
                    let Some(sent) = ledger.sent_us.get(seq) else {
                        continue;
                    };
                    let by = if dns::has_a(msg, q_end, KNOT_ANSWER) {
                        BY_LOCALDNS
                    } else if dns::has_a(msg, q_end, dns::derived_a(qname)) {
                        BY_STANDBY
                    } else {
                        BY_OTHER
                    };
                    if ledger.by[seq]
                        .compare_exchange(BY_NONE, by, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                    {
                        let lat = now.saturating_sub(sent.load(Ordering::Relaxed));
                        ledger.latency_us[seq]
                            .store(lat.min(u32::MAX as u64) as u32, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    std::thread::spawn(move || {
        let rate = RATE_CLUSTER + RATE_NODE;
        let total = (rate * seconds).min(ledger.sent_us.len() as u64);
        let (node, cluster): (SocketAddr, SocketAddr) = (
            format!("{NODE}:53").parse().unwrap(),
            format!("{CLUSTER}:53").parse().unwrap(),
        );
        let mut buf = [0u8; 512];
        let mut seq = 0u64;
        let start = t0.elapsed();
        while seq < total && !stopping() {
            let due = start + Duration::from_nanos(seq * 1_000_000_000 / rate);
            let now = t0.elapsed();
            if due > now {
                std::thread::sleep((due - now).min(Duration::from_millis(5)));
                continue;
            }
            let name = dns::encode_name(&format!("c{seq}.load.test")).unwrap();
            let len = dns::write_query(&mut buf, seq as u16, &name, dns::TYPE_A).unwrap();
            // Every (RATE_CLUSTER + RATE_NODE) / RATE_NODE-th query to the node listener.
            let to = if seq % (rate / RATE_NODE) == 0 {
                node
            } else {
                cluster
            };
            let i = seq as usize;
            ledger.sent_us[i].store(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
            if sockets[i % SOCKETS].send_to(&buf[..len], to).is_err() {
                // Not sent (no route while the addresses are on no interface): lost, as for a pod.
                ledger.by[i].store(BY_OTHER, Ordering::Relaxed);
                ledger.latency_us[i].store(u32::MAX, Ordering::Relaxed);
            }
            seq += 1;
        }
        // Answers to the last queries may take up to LATE and more.
        nap(LATE + Duration::from_secs(1));
        done.store(true, Ordering::Relaxed);
        for r in readers {
            let _ = r.join();
        }
        seq
    })
}

/// The sequence number in a name `c<seq>.load.test.` (wire format).
fn seq_of(qname: &[u8]) -> Option<usize> {
    let l = *qname.first()? as usize;
    let label = qname.get(1..1 + l)?;
    std::str::from_utf8(label.strip_prefix(b"c")?)
        .ok()?
        .parse()
        .ok()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Kill,
    Storm,
    Stop,
    Term,
    AddressesGone,
    Squeeze,
    StandbyKill,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::Storm => "storm",
            Kind::Stop => "stop",
            Kind::Term => "term",
            Kind::AddressesGone => "addresses_gone",
            Kind::Squeeze => "squeeze",
            Kind::StandbyKill => "standby_kill",
        }
    }

    /// Takes a fault may cause: one, one per crash of a storm, none for the standby's own restart.
    fn allowed(self) -> u64 {
        match self {
            Kind::Storm => 4,
            Kind::StandbyKill => 0,
            _ => 1,
        }
    }
}

const FAULTS: [Kind; 6] = [
    Kind::Kill,
    Kind::Storm,
    Kind::Stop,
    Kind::Term,
    Kind::AddressesGone,
    Kind::Squeeze,
];

struct Event {
    kind: Kind,
    start: Duration,
    end: Duration,
    detail: String,
}

/// Per-run tallies over a set of queries.
#[derive(Default, Clone, Copy)]
struct Tally {
    localdns: u64,
    standby: u64,
    late: u64,
    lost: u64,
}

impl Tally {
    fn add(&mut self, by: u8, latency_us: u32) {
        match by {
            BY_NONE | BY_OTHER => self.lost += 1,
            _ if u64::from(latency_us) > LATE.as_micros() as u64 => self.late += 1,
            BY_LOCALDNS => self.localdns += 1,
            _ => self.standby += 1,
        }
    }
}

struct Sample {
    at: Duration,
    pid: u32,
    rss_kib: u64,
    fds: u64,
    threads: u64,
    cpu_pct: f64,
    takeovers: f64,
    handbacks: f64,
}

/// Every second: the standby's RSS, descriptors, threads, CPU and its /metrics counters.
fn sampler(node: &str, t0: Instant, pid: Arc<AtomicU32>, out: Arc<Mutex<Vec<Sample>>>) {
    let node = node.to_string();
    std::thread::spawn(move || {
        in_ns(&node.clone(), move || {
            let mut last: Option<(u32, u64, Instant)> = None;
            while !stopping() {
                let p = pid.load(Ordering::Relaxed);
                if p != 0 {
                    let status =
                        std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
                    let field = |k: &str| -> u64 {
                        status
                            .lines()
                            .find_map(|l| {
                                l.strip_prefix(k)?.split_whitespace().next()?.parse().ok()
                            })
                            .unwrap_or(0)
                    };
                    let cpu = loadtest::procfs::cpu_ns(p).unwrap_or(0);
                    let now = Instant::now();
                    let cpu_pct = match last {
                        Some((lp, lc, lt)) if lp == p => {
                            (cpu - lc) as f64 / (now - lt).as_nanos() as f64 * 100.0
                        }
                        _ => 0.0,
                    };
                    last = Some((p, cpu, now));
                    let metrics = scrape();
                    let sum = |prefix: &str| -> f64 {
                        metrics
                            .lines()
                            .filter(|l| l.starts_with(prefix))
                            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                            .fold(0.0, |a, b| a + b)
                    };
                    out.lock().unwrap().push(Sample {
                        at: t0.elapsed(),
                        pid: p,
                        rss_kib: field("VmRSS:"),
                        fds: std::fs::read_dir(format!("/proc/{p}/fd"))
                            .map_or(0, |d| d.count() as u64),
                        threads: field("Threads:"),
                        cpu_pct,
                        takeovers: sum("localdns_fallback_takeovers_total{"),
                        handbacks: sum("localdns_fallback_handbacks_total{"),
                    });
                }
                nap(Duration::from_secs(1));
            }
        })
    });
}

fn scrape() -> String {
    let Ok(mut s) =
        TcpStream::connect_timeout(&METRICS.parse().unwrap(), Duration::from_millis(200))
    else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = write!(s, "GET /metrics HTTP/1.0\r\nHost: {METRICS}\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// Waits until something answers `name` on `addr` from the node namespace (any reply).
fn answers(node: &str, addr: &str, within: Duration) -> bool {
    let addr: SocketAddr = addr.parse().unwrap();
    in_ns(node, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let name = dns::encode_name("ready.load.test").unwrap();
        let mut q = [0u8; 512];
        let len = dns::write_query(&mut q, 7, &name, dns::TYPE_A).unwrap();
        let end = Instant::now() + within;
        let mut buf = [0u8; 512];
        while Instant::now() < end && !stopping() {
            let _ = s.send_to(&q[..len], addr);
            if s.recv(&mut buf).is_ok() {
                return true;
            }
        }
        false
    })
}

struct Args {
    standby: String,
    lf_args: Vec<String>,
    responder: String,
    out: PathBuf,
    name: String,
    seed: u64,
    minutes: f64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        standby: String::new(),
        lf_args: Vec::new(),
        responder: String::new(),
        out: PathBuf::new(),
        name: format!("lchaos{}", std::process::id()),
        seed: 1,
        minutes: 15.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--standby" => a.standby = v,
            "--lf-args" => a.lf_args = v.split_whitespace().map(String::from).collect(),
            "--responder" => a.responder = v,
            "--out" => a.out = v.into(),
            "--name" => a.name = v,
            "--seed" => a.seed = v.parse().map_err(|e| format!("--seed: {e}"))?,
            "--minutes" => a.minutes = v.parse().map_err(|e| format!("--minutes: {e}"))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.standby.is_empty() || a.responder.is_empty() || a.out.as_os_str().is_empty() {
        return Err("usage: chaos --standby BIN --responder BIN --out DIR [--name PREFIX] [--seed N] [--minutes M] [--lf-args 'FLAGS']".into());
    }
    Ok(a)
}

fn main() {
    let mut args = parse_args().unwrap_or_else(|e| {
        eprintln!("chaos: {e}");
        std::process::exit(2)
    });
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    std::fs::create_dir_all(&args.out).unwrap();
    // knot reads paths in its config from its rundir: absolute ones only.
    args.out = std::fs::canonicalize(&args.out).unwrap();
    let font =
        std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").unwrap_or_else(|e| {
            panic!("DejaVuSans.ttf (Debian's fonts-dejavu-core) for the picture's text: {e}")
        });
    let world = World::build(&args.name).unwrap_or_else(|e| panic!("chaos: {e}"));
    let code = run(&args, &world, font);
    drop(world);
    std::process::exit(code);
}

fn run(args: &Args, world: &World, font: Vec<u8>) -> i32 {
    let seconds = (args.minutes * 60.0).round() as u64;
    let mut responder = Command::new("ip")
        .args([
            "netns",
            "exec",
            &world.up(),
            &args.responder,
            "--listen",
            UPSTREAM,
            "--threads",
            "1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the responder");
    let mut knot = Knot::new(&args.out, world);
    knot.start();
    assert!(
        answers(
            &world.node,
            &format!("{CLUSTER}:53"),
            Duration::from_secs(10)
        ),
        "knot does not answer"
    );
    let t0 = Instant::now();
    let hands = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::new(Mutex::new(
        std::fs::File::create(args.out.join("standby.log")).unwrap(),
    ));
    let mut standby = Standby {
        bin: args.standby.clone(),
        extra: args.lf_args.clone(),
        node: world.node.clone(),
        child: None,
        pid: Arc::new(AtomicU32::new(0)),
        instance: 0,
    };
    standby.start(t0, &hands, &log);
    nap(Duration::from_secs(2));
    let samples = Arc::new(Mutex::new(Vec::new()));
    sampler(&world.node, t0, standby.pid.clone(), samples.clone());

    let total = ((RATE_CLUSTER + RATE_NODE) * seconds) as usize;
    let ledger = Arc::new(Ledger {
        sent_us: (0..total).map(|_| AtomicU64::new(0)).collect(),
        latency_us: (0..total).map(|_| AtomicU32::new(0)).collect(),
        by: (0..total).map(|_| AtomicU8::new(BY_NONE)).collect(),
    });
    let l0 = t0.elapsed();
    let m0 = loadtest::procfs::machine_ns();
    let pods = load(&world.node, t0, seconds, ledger.clone());
    eprintln!(
        "chaos: seed {} for {seconds} s; results in {}",
        args.seed,
        args.out.display()
    );

    // The schedule: faults in a seeded order (each kind once per round of six), 10-40 s apart,
    // the standby killed at a third and two thirds of the run.
    let mut rng = Rng(args.seed);
    let mut events: Vec<Event> = Vec::new();
    let mut round: Vec<Kind> = Vec::new();
    let mut standby_kills = 0;
    nap(rng.secs(10.0, 20.0));
    while !stopping() {
        let now = t0.elapsed() - l0;
        if now.as_secs_f64() + 20.0 + AFTERMATH.as_secs_f64() > seconds as f64 {
            break;
        }
        let kind = if standby_kills < 2
            && now.as_secs_f64() > seconds as f64 * f64::from(standby_kills + 1) / 3.0
        {
            standby_kills += 1;
            Kind::StandbyKill
        } else {
            if round.is_empty() {
                round = FAULTS.to_vec();
                for i in (1..round.len()).rev() {
                    round.swap(i, (rng.next() % (i as u64 + 1)) as usize);
                }
            }
            round.pop().unwrap()
        };
        let start = t0.elapsed();
        let mut detail = String::new();
        match kind {
            Kind::Kill => {
                knot.signal(libc::SIGKILL);
                knot.reap(Duration::from_secs(1));
                let d = rng.secs(0.2, 1.0);
                nap(d);
                knot.start();
                detail = format!("restarted after {:.0} ms", d.as_millis());
            }
            Kind::Storm => {
                for k in 0..4 {
                    knot.signal(libc::SIGKILL);
                    knot.reap(Duration::from_secs(1));
                    let d = rng.secs(0.2, 0.6);
                    nap(d);
                    knot.start();
                    let _ = write!(
                        detail,
                        "{}{:.0}{}",
                        if k == 0 { "down " } else { "/" },
                        d.as_millis(),
                        if k == 3 { " ms" } else { "" }
                    );
                    if k < 3 {
                        nap(rng.secs(0.5, 1.5));
                    }
                }
            }
            Kind::Stop => {
                let d = rng.secs(2.0, 5.0);
                knot.signal(libc::SIGSTOP);
                nap(d);
                knot.signal(libc::SIGCONT);
                detail = format!("stopped {:.1} s", d.as_secs_f64());
            }
            Kind::Term => {
                knot.signal(libc::SIGTERM);
                knot.reap(Duration::from_secs(5));
                let d = rng.secs(0.2, 1.0);
                nap(d);
                knot.start();
                detail = format!("restarted after {:.0} ms", d.as_millis());
            }
            Kind::AddressesGone => {
                let d = rng.secs(0.6, 3.0);
                world.addresses(false);
                nap(d);
                world.addresses(true);
                detail = format!("gone {:.1} s", d.as_secs_f64());
            }
            Kind::Squeeze => {
                let d = rng.secs(6.0, 10.0);
                let pid = knot.pid();
                world.squeeze(pid, Some(Duration::from_millis(2)));
                nap(d);
                world.squeeze(pid, None);
                detail = format!("2 ms per 100 ms for {:.1} s", d.as_secs_f64());
            }
            Kind::StandbyKill => {
                standby.kill();
                nap(Duration::from_secs(1));
                standby.start(t0, &hands, &log);
                detail = "restarted after 1 s".into();
            }
        }
        let end = t0.elapsed();
        eprintln!(
            "chaos: {:7.1} s {} ({detail})",
            (start - l0).as_secs_f64(),
            kind.name()
        );
        events.push(Event {
            kind,
            start,
            end,
            detail,
        });
        nap(rng.secs(10.0, 40.0));
    }
    let sent = pods.join().unwrap() as usize;
    // How busy the machine was, this run included: a shared machine's other work shows here.
    let busy = match (m0, loadtest::procfs::machine_ns()) {
        (Some(a), Some(b)) => (b.busy - a.busy) as f64 * 100.0 / (b.total - a.total).max(1) as f64,
        _ => f64::NAN,
    };
    STOP.store(true, Ordering::Relaxed);
    let final_metrics = in_ns(&world.node, scrape);
    standby.kill();
    drop(knot);
    let _ = responder.kill();
    let _ = responder.wait();
    let hands = hands.lock().unwrap().clone();
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    report(
        args,
        busy,
        &ledger,
        sent,
        l0,
        &events,
        &hands,
        &samples,
        &final_metrics,
        font,
    )
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    busy: f64,
    ledger: &Ledger,
    sent: usize,
    l0: Duration,
    events: &[Event],
    hands: &[Hand],
    samples: &[Sample],
    final_metrics: &str,
    font: Vec<u8>,
) -> i32 {
    let secs = |d: Duration| d.as_secs_f64() - l0.as_secs_f64();
    let window = |e: &Event| (secs(e.start) - IN_FLIGHT.as_secs_f64(), secs(e.end + AFTERMATH));
    let event_of = |t: f64| {
        events.iter().position(|e| {
            let (a, b) = window(e);
            t >= a && t < b
        })
    };
    // Per 100 ms of send time, per event, and outside every event.
    let n_buckets = ((sent as u64 * 1000 / (RATE_CLUSTER + RATE_NODE)) / BUCKET.as_millis() as u64
        + 1) as usize;
    let mut timeline = vec![Tally::default(); n_buckets];
    let mut per_event = vec![Tally::default(); events.len()];
    let mut outside = Tally::default();
    // After each fault's end: the first query LocalDNS answered, and the last it did not.
    let mut first_back = vec![f64::NAN; events.len()];
    let mut all_back = vec![0.0f64; events.len()];
    for i in 0..sent {
        let t = ledger.sent_us[i].load(Ordering::Relaxed) as f64 / 1e6 - l0.as_secs_f64();
        let (by, lat) = (
            ledger.by[i].load(Ordering::Relaxed),
            ledger.latency_us[i].load(Ordering::Relaxed),
        );
        let b = ((t / BUCKET.as_secs_f64()).max(0.0) as usize).min(n_buckets - 1);
        timeline[b].add(by, lat);
        match event_of(t) {
            Some(e) => {
                per_event[e].add(by, lat);
                let since = t - secs(events[e].end);
                let localdns = by == BY_LOCALDNS && u64::from(lat) <= LATE.as_micros() as u64;
                if since >= 0.0 && localdns && (first_back[e].is_nan() || since < first_back[e]) {
                    first_back[e] = since;
                }
                if since >= 0.0 && !localdns {
                    all_back[e] = all_back[e].max(since);
                }
            }
            None => outside.add(by, lat),
        }
    }
    let mut takes_in = vec![0u64; events.len()];
    let mut backs_in = vec![0u64; events.len()];
    let mut takes_outside = 0;
    for h in hands {
        match (event_of(secs(h.at)), h.take) {
            (Some(e), true) => takes_in[e] += 1,
            (Some(e), false) => backs_in[e] += 1,
            (None, true) => takes_outside += 1,
            (None, false) => {}
        }
    }
    let takes: u64 = hands.iter().filter(|h| h.take).count() as u64;
    let handbacks = hands.len() as u64 - takes;
    let allowed: u64 = events.iter().map(|e| e.kind.allowed()).sum();
    let faults = events
        .iter()
        .filter(|e| e.kind != Kind::StandbyKill)
        .count();

    // Files.
    let mut csv = String::from("t_s,localdns,standby,late,lost\n");
    for (i, t) in timeline.iter().enumerate() {
        let _ = writeln!(
            csv,
            "{:.1},{},{},{},{}",
            i as f64 * 0.1,
            t.localdns,
            t.standby,
            t.late,
            t.lost
        );
    }
    std::fs::write(args.out.join("timeline.csv"), csv).unwrap();
    let mut csv = String::from(
        "kind,start_s,end_s,detail,takes,allowed_takes,handbacks,localdns,standby,late,lost,\
         localdns_first_s,localdns_all_s\n",
    );
    for (i, e) in events.iter().enumerate() {
        let p = per_event[i];
        let _ = writeln!(
            csv,
            "{},{:.3},{:.3},{},{},{},{},{},{},{},{},{:.3},{:.3}",
            e.kind.name(),
            secs(e.start),
            secs(e.end),
            e.detail,
            takes_in[i],
            e.kind.allowed(),
            backs_in[i],
            p.localdns,
            p.standby,
            p.late,
            p.lost,
            first_back[i],
            all_back[i]
        );
    }
    std::fs::write(args.out.join("events.csv"), csv).unwrap();
    let mut csv = String::from("t_s,what,cause,instance\n");
    for h in hands {
        let _ = writeln!(
            csv,
            "{:.3},{},{},{}",
            secs(h.at),
            if h.take { "take" } else { "handback" },
            h.cause,
            h.instance
        );
    }
    std::fs::write(args.out.join("hands.csv"), csv).unwrap();
    let mut csv =
        String::from("t_s,pid,rss_kib,fds,threads,cpu_pct,takeovers_total,handbacks_total\n");
    for s in samples {
        let _ = writeln!(
            csv,
            "{:.1},{},{},{},{},{:.2},{},{}",
            secs(s.at),
            s.pid,
            s.rss_kib,
            s.fds,
            s.threads,
            s.cpu_pct,
            s.takeovers,
            s.handbacks
        );
    }
    std::fs::write(args.out.join("resources.csv"), csv).unwrap();

    // Resources: flat if the last quarter's peaks are within the first half's (RSS with 25 % and
    // 2 MiB of room: the cache fills as the standby answers).
    let half = samples.len() / 2;
    let peak = |s: &[Sample], f: fn(&Sample) -> u64| s.iter().map(f).max().unwrap_or(0);
    let (first, last) = (&samples[..half], &samples[samples.len() * 3 / 4..]);
    let rss = |s: &Sample| s.rss_kib;
    let fds = |s: &Sample| s.fds;
    let threads = |s: &Sample| s.threads;
    let flat = !first.is_empty()
        && peak(last, rss) <= peak(first, rss) * 5 / 4 + 2048
        && peak(last, fds) <= peak(first, fds) + 4
        && peak(last, threads) <= peak(first, threads);
    let range = |f: fn(&Sample) -> u64| {
        let v = samples.iter().map(f);
        (v.clone().min().unwrap_or(0), v.max().unwrap_or(0))
    };
    let cpu_mean = samples.iter().map(|s| s.cpu_pct).sum::<f64>() / samples.len().max(1) as f64;

    let mut kinds: Vec<Kind> = events.iter().map(|e| e.kind).collect();
    kinds.sort_by_key(|k| k.name());
    kinds.dedup();
    let mut per_kind = String::new();
    let mut kinds_json = Vec::new();
    for k in &kinds {
        let idx: Vec<usize> = (0..events.len())
            .filter(|&i| events[i].kind == *k)
            .collect();
        let sum = |f: &dyn Fn(usize) -> u64| idx.iter().map(|&i| f(i)).sum::<u64>();
        let (t, b) = (sum(&|i| takes_in[i]), sum(&|i| backs_in[i]));
        let (lost, late, sb) = (
            sum(&|i| per_event[i].lost),
            sum(&|i| per_event[i].late),
            sum(&|i| per_event[i].standby),
        );
        let back = idx.iter().map(|&i| all_back[i]).fold(0.0, f64::max);
        let first = idx.iter().map(|&i| first_back[i]).fold(0.0, f64::max);
        let _ = write!(
            per_kind,
            "{}{} x{}: {t} takes, {b} hand-backs, {lost} lost, {late} late, {sb} by the standby, \
             LocalDNS's first answer {first:.2} s and every answer {back:.2} s after the end \
             (worst)",
            if per_kind.is_empty() { "" } else { "; " },
            k.name(),
            idx.len()
        );
        kinds_json.push(
            serde_json::json!({"kind": k.name(), "events": idx.len(), "takes": t, "handbacks": b,
            "lost": lost, "late": late, "standby": sb, "localdns_first_s": first,
            "localdns_all_s": back}),
        );
    }
    let pass = takes <= allowed
        && takes_outside == 0
        && events
            .iter()
            .enumerate()
            .all(|(i, e)| takes_in[i] <= e.kind.allowed())
        && outside.lost == 0
        && outside.late == 0
        && outside.standby == 0
        && flat;
    let (r0, r1) = range(rss);
    let (f0, f1) = range(fds);
    let (h0, h1) = range(threads);
    let verdict = format!(
        "VERDICT {}{}: {takes} takeovers for {faults} faults ({allowed} allowed: one each, one per \
         crash of a storm, none for the standby's own restarts), {handbacks} hand-backs, \
         {takes_outside} takes outside the events; outside the events {} lost, {} late, {} \
         answered by the standby (of {}); {per_kind}; standby RSS {:.1}-{:.1} MiB, fds {f0}-{f1}, \
         threads {h0}-{h1}, CPU {cpu_mean:.2} % of a core on average: {}; the machine {busy:.0} % \
         busy{}",
        if pass { "PASS" } else { "FAIL" },
        if INTERRUPTED.load(Ordering::Relaxed) {
            " (interrupted)"
        } else {
            ""
        },
        outside.lost,
        outside.late,
        outside.standby,
        outside.localdns + outside.standby + outside.late + outside.lost,
        r0 as f64 / 1024.0,
        r1 as f64 / 1024.0,
        if flat { "flat" } else { "NOT flat" },
        // The run itself takes about a fifth of one core; more is other work, which starves knot
        // (to the standby, a starved LocalDNS) and the pods' client.
        if busy > 60.0 {
            " (DISTURBED: other work shared the CPUs; rerun on a quiet machine)"
        } else {
            ""
        }
    );
    let metric_takes: f64 = final_metrics
        .lines()
        .filter(|l| l.starts_with("localdns_fallback_takeovers_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b);
    let summary = serde_json::json!({
        "seed": args.seed, "minutes": args.minutes, "rates": {"cluster": RATE_CLUSTER, "node": RATE_NODE},
        "queries": sent, "takes": takes, "handbacks": handbacks, "allowed_takes": allowed, "faults": faults,
        "takes_outside_events": takes_outside,
        "last_standby_takeovers_metric": metric_takes,
        "outside": {"localdns": outside.localdns, "standby": outside.standby, "late": outside.late, "lost": outside.lost},
        "per_kind": kinds_json,
        "resources": {"rss_kib": [r0, r1], "fds": [f0, f1], "threads": [h0, h1], "cpu_pct_mean": cpu_mean, "flat": flat},
        "machine_busy_pct": busy,
        "pass": pass, "verdict": verdict,
    });
    std::fs::write(
        args.out.join("summary.json"),
        serde_json::to_string_pretty(&summary).unwrap(),
    )
    .unwrap();
    if let Err(e) = picture(
        &args.out.join("timeline.png"),
        font,
        &timeline,
        events,
        hands,
        samples,
        l0,
        args,
    ) {
        eprintln!("chaos: the picture: {e}");
    }
    println!("{verdict}");
    if pass { 0 } else { 1 }
}

#[allow(clippy::too_many_arguments)]
fn picture(
    path: &Path,
    font: Vec<u8>,
    timeline: &[Tally],
    events: &[Event],
    hands: &[Hand],
    samples: &[Sample],
    l0: Duration,
    args: &Args,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| "DejaVuSans.ttf is not a font")?;
    let secs = |d: Duration| d.as_secs_f64() - l0.as_secs_f64();
    let end = timeline.len() as f64 * BUCKET.as_secs_f64();
    let width = (1600.0 + end * 2.0).min(4000.0) as u32;
    let root = BitMapBackend::new(path, (width, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(760);
    // Shares, not counts: the pods' sends come in uneven batches on a busy machine.
    let ymax = 125.0;
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!(
                "who answered each 100 ms (by send time): seed {}, {:.1} min, {} q/s on .11 + {} on .10",
                args.seed, args.minutes, RATE_CLUSTER, RATE_NODE
            ),
            ("sans-serif", 22),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, 0.0..ymax)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("seconds")
        .y_desc("% of the queries sent in each 100 ms")
        .label_style(("sans-serif", 14))
        .draw()?;
    let shade = |k: Kind| match k {
        Kind::Kill => RGBColor(255, 220, 220),
        Kind::Storm => RGBColor(255, 200, 150),
        Kind::Stop => RGBColor(220, 220, 255),
        Kind::Term => RGBColor(240, 220, 255),
        Kind::AddressesGone => RGBColor(255, 255, 170),
        Kind::Squeeze => RGBColor(200, 240, 240),
        Kind::StandbyKill => RGBColor(220, 220, 220),
    };
    // The faults: their span shaded, their aftermath lighter, their name above.
    for e in events {
        let (a, b) = (secs(e.start), secs(e.end).max(secs(e.start) + 0.3));
        let after = secs(e.end + AFTERMATH);
        chart.draw_series(std::iter::once(Rectangle::new(
            [(b, 0.0), (after, ymax)],
            shade(e.kind).mix(0.35).filled(),
        )))?;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(a, 0.0), (b, ymax)],
            shade(e.kind).filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            e.kind.name().to_string(),
            (a, ymax * 0.99),
            ("sans-serif", 13)
                .into_font()
                .transform(FontTransform::Rotate90),
        )))?;
    }
    let colors = [
        ("LocalDNS", RGBColor(60, 160, 60)),
        ("standby", RGBColor(40, 90, 220)),
        ("late (> 1 s)", RGBColor(240, 150, 0)),
        ("lost", RGBColor(220, 0, 0)),
    ];
    // Each kind drawn over all buckets before the next, so a thin stripe of a rarer kind is
    // never painted over by a neighbouring bucket's green.
    for (k, &(label, color)) in colors.iter().enumerate() {
        let bars = timeline.iter().enumerate().filter_map(move |(i, t)| {
            let all = (t.localdns + t.standby + t.late + t.lost).max(1) as f64;
            let v = [t.localdns, t.standby, t.late, t.lost].map(|x| x as f64 * 100.0 / all);
            let below: f64 = v[..k].iter().sum();
            (v[k] > 0.0).then(|| {
                let x = i as f64 * BUCKET.as_secs_f64();
                Rectangle::new(
                    [(x, below), (x + BUCKET.as_secs_f64(), below + v[k])],
                    color.filled(),
                )
            })
        });
        chart
            .draw_series(bars)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    // Every take (red, down from the top) and hand-back (blue, up to it).
    let (take_y, back_y) = (112.0, 105.0);
    chart
        .draw_series(
            hands.iter().filter(|h| h.take).map(|h| {
                TriangleMarker::new((secs(h.at), take_y), 6, RGBColor(200, 0, 0).filled())
            }),
        )?
        .label("take")
        .legend(|(x, y)| TriangleMarker::new((x + 6, y), 6, RGBColor(200, 0, 0).filled()));
    chart
        .draw_series(
            hands
                .iter()
                .filter(|h| !h.take)
                .map(|h| Circle::new((secs(h.at), back_y), 4, RGBColor(0, 0, 200).filled())),
        )?
        .label("hand-back")
        .legend(|(x, y)| Circle::new((x + 6, y), 4, RGBColor(0, 0, 200).filled()));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;

    // The standby's resources.
    let rmax = samples
        .iter()
        .map(|s| (s.fds as f64).max(s.rss_kib as f64 / 1024.0).max(s.cpu_pct))
        .fold(10.0, f64::max)
        * 1.15;
    let mut res = ChartBuilder::on(&bottom)
        .caption(
            "the standby: RSS (MiB), descriptors, threads, CPU (% of a core), every second",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, 0.0..rmax)?;
    res.configure_mesh()
        .disable_mesh()
        .label_style(("sans-serif", 14))
        .draw()?;
    type Line = (&'static str, RGBColor, fn(&Sample) -> f64);
    let lines: [Line; 4] = [
        ("RSS MiB", RGBColor(120, 0, 160), |s| {
            s.rss_kib as f64 / 1024.0
        }),
        ("fds", RGBColor(0, 130, 130), |s| s.fds as f64),
        ("threads", RGBColor(150, 100, 0), |s| s.threads as f64),
        ("CPU %", RGBColor(200, 0, 0), |s| s.cpu_pct),
    ];
    for (label, color, f) in lines {
        // A line per standby instance: a restart is a gap, not a slope.
        let mut pids: Vec<u32> = samples.iter().map(|s| s.pid).collect();
        pids.dedup();
        for (n, pid) in pids.iter().enumerate() {
            let series = res.draw_series(LineSeries::new(
                samples
                    .iter()
                    .filter(|s| s.pid == *pid)
                    .map(|s| (secs(s.at), f(s))),
                color.stroke_width(2),
            ))?;
            if n == 0 {
                series.label(label).legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2))
                });
            }
        }
    }
    res.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_found_by_its_name() {
        let name = dns::encode_name("c2250000.load.test").unwrap();
        assert_eq!(seq_of(&name), Some(2_250_000));
        assert_eq!(seq_of(&dns::encode_name("ready.load.test").unwrap()), None);
    }

    #[test]
    fn an_answer_counts_once_by_who_gave_it_and_when() {
        let mut t = Tally::default();
        t.add(BY_LOCALDNS, 900);
        t.add(BY_STANDBY, 1_000_000);
        t.add(BY_LOCALDNS, 1_000_001);
        t.add(BY_NONE, 0);
        t.add(BY_OTHER, u32::MAX);
        assert_eq!((t.localdns, t.standby, t.late, t.lost), (1, 1, 1, 2));
    }

    #[test]
    fn a_seed_gives_the_same_schedule() {
        let (mut a, mut b) = (Rng(7), Rng(7));
        for _ in 0..100 {
            let d = a.secs(10.0, 40.0);
            assert_eq!(d, b.secs(10.0, 40.0));
            assert!((10.0..=40.0).contains(&d.as_secs_f64()));
        }
    }
}
