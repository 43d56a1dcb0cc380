//! One run of the generator: what was asked (`RunSpec`), the clock that both engines follow
//! (`Schedule`: warm-up, measurement window, drain, the scripted event) and the JSON line printed
//! at the end.

use crate::names::NameSet;
use crate::pace::Load;
use crate::procfs::{self, Snapshot};
use crate::track::{Expect, Tracker};
use serde_json::{Map, Value, json};
use std::net::SocketAddr;
use std::process::{Child, Command};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Udp,
    Tcp,
}

#[derive(Debug, Clone)]
pub struct RunSpec {
    pub server: SocketAddr,
    pub proto: Proto,
    pub names: NameSet,
    /// The record a good reply carries.
    pub expect: Expect,
    /// UDP sockets or TCP connections.
    pub channels: usize,
    pub load: Load,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub timeout_s: f64,
    /// A reply slower than this counts as `slow` (and fails its timeline interval).
    pub slow_ms: f64,
    pub watch_pid: Option<u32>,
    /// More processes of the harness (the upstreams): counted as ours, not as other load.
    pub also_pids: Vec<u32>,
    /// At this many seconds after the start, run this shell command (e.g. kill a backend).
    pub event: Option<(f64, String)>,
    pub timeline: bool,
    pub bucket_ms: u64,
    /// Generator threads, each with its share of the channels and of the load.
    pub threads: usize,
    pub labels: Vec<(String, String)>,
    pub seed: u64,
}

impl RunSpec {
    /// Sending time in seconds: warm-up plus window (an open-loop profile may say otherwise).
    pub fn send_secs(&self) -> f64 {
        self.load
            .open_secs()
            .unwrap_or(self.warmup_s + self.duration_s)
    }
}

/// The run's clock, shared by the UDP and TCP engines.
pub struct Schedule {
    pub start_ns: u64,
    pub window: (u64, u64),
    pub send_end_ns: u64,
    pub drain_end_ns: u64,
    pid: Option<u32>,
    also: Vec<u32>,
    pub snap_start: Option<Snapshot>,
    pub snap_end: Option<Snapshot>,
    event: Option<(u64, String)>,
    pub event_ns: Option<u64>,
    child: Option<Child>,
}

impl Schedule {
    /// The same clock without the samples and the event (for the other generator threads).
    pub fn silent_copy(&self) -> Schedule {
        Schedule {
            start_ns: self.start_ns,
            window: self.window,
            send_end_ns: self.send_end_ns,
            drain_end_ns: self.drain_end_ns,
            pid: None,
            also: Vec::new(),
            snap_start: Some(Snapshot::default()),
            snap_end: Some(Snapshot::default()),
            event: None,
            event_ns: None,
            child: None,
        }
    }

    pub fn new(spec: &RunSpec, start_ns: u64) -> Schedule {
        let s = |secs: f64| (secs * 1e9) as u64;
        let send_end_ns = start_ns + s(spec.send_secs());
        let window = (
            start_ns + s(spec.warmup_s).min(s(spec.send_secs())),
            send_end_ns,
        );
        Schedule {
            start_ns,
            window,
            send_end_ns,
            drain_end_ns: send_end_ns + s(spec.timeout_s),
            pid: spec.watch_pid,
            also: spec.also_pids.clone(),
            snap_start: None,
            snap_end: None,
            event: spec
                .event
                .as_ref()
                .map(|(t, c)| (start_ns + s(*t), c.clone())),
            event_ns: None,
            child: None,
        }
    }

    /// Takes the samples at the window's edges and fires the event when due.
    pub fn tick(&mut self, now: u64) {
        if self.snap_start.is_none() && now >= self.window.0 {
            self.snap_start = Some(procfs::snapshot(self.pid, &self.also));
        }
        if self.snap_end.is_none() && now >= self.window.1 {
            self.snap_end = Some(procfs::snapshot(self.pid, &self.also));
        }
        if let Some((at, cmd)) = &self.event
            && now >= *at
        {
            self.event_ns = Some(now);
            match Command::new("sh").arg("-c").arg(cmd).spawn() {
                Ok(c) => self.child = Some(c),
                Err(e) => eprintln!("dnsload: cannot run the event command {cmd:?}: {e}"),
            }
            self.event = None;
        }
    }

    pub fn sending(&self, now: u64) -> bool {
        now < self.send_end_ns
    }

    /// Nanoseconds until the next thing the clock must do (window edge, event, end of sending).
    pub fn until_next_ns(&self, now: u64) -> u64 {
        let mut next = if now < self.send_end_ns {
            self.send_end_ns
        } else {
            self.drain_end_ns
        };
        if self.snap_start.is_none() {
            next = next.min(self.window.0);
        }
        if let Some((at, _)) = &self.event {
            next = next.min(*at);
        }
        next.saturating_sub(now)
    }

    /// After the engine's loop: the end-of-window sample if the loop ended before taking it.
    pub fn finish(&mut self) {
        if self.snap_end.is_none() {
            self.snap_end = Some(procfs::snapshot(self.pid, &self.also));
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

/// Transport-level trouble seen by an engine.
#[derive(Default, Debug, Clone, Copy)]
pub struct TransportStats {
    /// ICMP errors reported on a UDP socket (e.g. port unreachable), or failed TCP connects.
    pub refused: u64,
    /// TCP connections (re)opened after the first.
    pub reconnects: u64,
    /// TCP connections closed by the server.
    pub closed_by_server: u64,
}

impl TransportStats {
    pub fn add(&mut self, o: &TransportStats) {
        self.refused += o.refused;
        self.reconnects += o.reconnects;
        self.closed_by_server += o.closed_by_server;
    }
}

fn us(ns: u64) -> f64 {
    (ns as f64 / 100.0).round() / 10.0
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 * 100.0 / whole as f64 * 1000.0).round() / 1000.0
    }
}

/// The JSON line of a run: labels first, then what was asked, then the figures.
pub fn to_json(
    spec: &RunSpec,
    sched: &Schedule,
    t: &Tracker,
    unsent: u64,
    transport: TransportStats,
) -> Value {
    let mut m = Map::new();
    for (k, v) in &spec.labels {
        m.insert(k.clone(), Value::String(v.clone()));
    }
    let window_s = (sched.window.1 - sched.window.0) as f64 / 1e9;
    let c = t.counts;
    m.insert("generator".into(), json!("dnsload"));
    m.insert(
        "proto".into(),
        json!(if spec.proto == Proto::Udp {
            "udp"
        } else {
            "tcp"
        }),
    );
    m.insert("server".into(), json!(spec.server.to_string()));
    m.insert(
        "names".into(),
        json!(format!("{:?}", spec.names).to_lowercase()),
    );
    m.insert("channels".into(), json!(spec.channels));
    m.insert("threads".into(), json!(spec.threads));
    m.insert(
        "expect".into(),
        json!(match spec.expect {
            Expect::Derived => "derived".to_string(),
            Expect::Fixed(a) => std::net::Ipv4Addr::from(a).to_string(),
        }),
    );
    match &spec.load {
        Load::Closed { outstanding } => {
            m.insert("mode".into(), json!("closed"));
            m.insert("outstanding".into(), json!(outstanding));
        }
        Load::Open { steps } => {
            m.insert("mode".into(), json!("open"));
            m.insert(
                "rate".into(),
                json!(
                    steps
                        .iter()
                        .map(|s| format!("{}:{}", s.0, s.1))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            );
        }
    }
    m.insert("window_s".into(), json!(window_s));
    m.insert(
        "qps".into(),
        json!((t.ok_received_in_window as f64 / window_s).round()),
    );
    m.insert(
        "replies_qps".into(),
        json!((t.received_in_window as f64 / window_s).round()),
    );
    m.insert(
        "offered_qps".into(),
        json!((c.sent as f64 / window_s).round()),
    );
    for (k, v) in [
        ("sent", c.sent),
        ("answered", c.answered),
        ("good", c.good),
        ("noerror", c.noerror),
        ("wrong_answer", c.wrong_answer),
        ("nxdomain", c.nxdomain),
        ("servfail", c.servfail),
        ("refused", c.refused),
        ("other_rcode", c.other_rcode),
        ("truncated", c.truncated),
        ("lost", c.lost),
        ("slow", c.slow),
        ("late", t.late),
        ("mismatched", t.mismatched),
        ("malformed", t.malformed),
        ("unsent", unsent),
        ("icmp_or_connect_errors", transport.refused),
        ("reconnects", transport.reconnects),
        ("closed_by_server", transport.closed_by_server),
    ] {
        m.insert(k.into(), json!(v));
    }
    m.insert("loss_pct".into(), json!(pct(c.lost, c.sent)));
    m.insert("error_pct".into(), json!(pct(c.errors(), c.sent)));
    m.insert("shed_pct".into(), json!(pct(c.refused, c.sent)));
    let h = &t.hist;
    // No answers, no latency (rather than a latency of 0).
    if h.count() > 0 {
        for (k, q) in [
            ("p50_us", 0.5),
            ("p90_us", 0.9),
            ("p99_us", 0.99),
            ("p999_us", 0.999),
        ] {
            m.insert(k.into(), json!(us(h.quantile(q))));
        }
        m.insert("max_us".into(), json!(us(h.max())));
        m.insert("mean_us".into(), json!(us(h.mean() as u64)));
    }
    if let (Some(a), Some(b)) = (sched.snap_start, sched.snap_end) {
        if let (Some(x), Some(y)) = (a.pid_cpu_ns, b.pid_cpu_ns) {
            let cpu = y.saturating_sub(x);
            let handled = t.received_in_window.max(1);
            m.insert(
                "cpu_us_per_query".into(),
                json!((cpu as f64 / handled as f64 / 100.0).round() / 10.0),
            );
            m.insert(
                "cpu_pct".into(),
                json!((cpu as f64 / (window_s * 1e9) * 1000.0).round() / 10.0),
            );
        }
        if let Some((busy, other)) = procfs::machine_shares(&a, &b) {
            m.insert("machine_busy_pct".into(), json!(busy));
            m.insert("other_load_pct".into(), json!(other));
        }
    }
    if let Some(pid) = spec.watch_pid {
        if let Some(v) = procfs::status_kib(pid, "VmHWM") {
            m.insert("rss_peak_kib".into(), json!(v));
        }
        if let Some(v) = procfs::status_kib(pid, "VmRSS") {
            m.insert("rss_kib".into(), json!(v));
        }
    }
    if let Some(ev) = sched.event_ns {
        event_figures(&mut m, t, ev);
        // Latency of the queries sent during the fault (from the event on).
        let f = &t.fault_hist;
        m.insert("fault_answered".into(), json!(f.count()));
        if f.count() > 0 {
            m.insert("fault_p50_us".into(), json!(us(f.quantile(0.5))));
            m.insert("fault_p99_us".into(), json!(us(f.quantile(0.99))));
            m.insert("fault_max_us".into(), json!(us(f.max())));
        }
    }
    if spec.timeline {
        let b: Vec<Value> = t
            .timeline
            .iter()
            .map(|b| json!([b.sent, b.ok, b.errors, b.lost, b.slow, us(b.max_latency_ns)]))
            .collect();
        m.insert("timeline_ms".into(), json!(t.bucket_ns / 1_000_000));
        m.insert(
            "timeline_columns".into(),
            json!(["sent", "ok", "errors", "lost", "slow", "max_us"]),
        );
        m.insert("timeline".into(), Value::Array(b));
    }
    Value::Object(m)
}

/// After the event: how many queries failed (error, lost or slow), from when to when, and how
/// long until service was whole again: the end of the last failing interval, measured from the
/// event. `recovered` is false when failures went on to the end of the run.
fn event_figures(m: &mut Map<String, Value>, t: &Tracker, event_ns: u64) {
    let first = (event_ns.saturating_sub(t.start_ns) / t.bucket_ns) as usize;
    let after = t.timeline.get(first..).unwrap_or(&[]);
    let event_s = event_ns.saturating_sub(t.start_ns) as f64 / 1e9;
    let sum = |f: fn(&crate::track::Bucket) -> u64| after.iter().map(f).sum::<u64>();
    // Before the event (e.g. during the overload itself): rates and shares, by send time.
    let before = t.timeline.get(..first.min(t.timeline.len())).unwrap_or(&[]);
    let bsum = |f: fn(&crate::track::Bucket) -> u64| before.iter().map(f).sum::<u64>();
    if event_s > 0.0 {
        let sent = bsum(|b| b.sent);
        m.insert(
            "before_event_offered_qps".into(),
            json!((sent as f64 / event_s).round()),
        );
        m.insert(
            "before_event_ok_qps".into(),
            json!((bsum(|b| b.ok) as f64 / event_s).round()),
        );
        m.insert(
            "before_event_shed_pct".into(),
            json!(pct(bsum(|b| b.refused), sent)),
        );
        m.insert(
            "before_event_loss_pct".into(),
            json!(pct(bsum(|b| b.lost), sent)),
        );
        m.insert(
            "before_event_error_pct".into(),
            json!(pct(bsum(|b| b.errors), sent)),
        );
    }
    m.insert(
        "event_at_s".into(),
        json!((event_s * 1000.0).round() / 1000.0),
    );
    m.insert("after_event_sent".into(), json!(sum(|b| b.sent)));
    m.insert("after_event_errors".into(), json!(sum(|b| b.errors)));
    m.insert("after_event_refused".into(), json!(sum(|b| b.refused)));
    m.insert("after_event_lost".into(), json!(sum(|b| b.lost)));
    m.insert("after_event_slow".into(), json!(sum(|b| b.slow)));
    let last_sending = after.iter().rposition(|b| b.sent > 0);
    let last_failed = after.iter().rposition(|b| b.failed());
    let bucket_s = t.bucket_ns as f64 / 1e9;
    let recovery = match last_failed {
        None => 0.0,
        Some(i) => ((first + i + 1) as f64 * bucket_s - event_s).max(0.0),
    };
    let recovered = match (last_failed, last_sending) {
        (Some(f), Some(s)) => f < s,
        _ => true,
    };
    m.insert("recovered".into(), json!(recovered));
    m.insert(
        "recovery_s".into(),
        if recovered {
            json!((recovery * 1000.0).round() / 1000.0)
        } else {
            Value::Null
        },
    );
    if let Some(i) = after.iter().position(|b| b.failed()) {
        m.insert(
            "first_failure_s".into(),
            json!((((first + i) as f64 * bucket_s - event_s).max(0.0) * 1000.0).round() / 1000.0),
        );
    }
}

/// One short human line about a run (on stderr while the harness runs).
pub fn summary(v: &Value) -> String {
    let s = |k: &str| match v.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => "-".into(),
    };
    let mut line = format!(
        "    {:24} {:10} qps {:>8}  p50 {:>7}us  p99 {:>8}us  loss {}%  err {}%",
        s("system"),
        s("phase"),
        s("qps"),
        s("p50_us"),
        s("p99_us"),
        s("loss_pct"),
        s("error_pct")
    );
    if v.get("cpu_us_per_query").is_some() {
        line += &format!("  cpu/q {}us", s("cpu_us_per_query"));
    }
    if v.get("event_at_s").is_some() {
        line += &format!(
            "  after event: errors {} lost {} slow {} recovery {}s",
            s("after_event_errors"),
            s("after_event_lost"),
            s("after_event_slow"),
            s("recovery_s")
        );
    }
    line
}
