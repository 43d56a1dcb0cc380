//! dnsreport: turns the JSON lines of a `loadtest/run.sh` run into what a person reads.
//!
//! ```text
//! dnsreport --raw RAW.jsonl --out DIR [--header FILE]
//! ```
//!
//! Groups the runs by scenario, system and phase, takes the median of each figure over the
//! repetitions, and for the throughput and TCP scenarios divides each figure by the same figure
//! of `direct` and of `localdns-fallback`. A system that failed the forwarding check, or (in
//! those two scenarios) gave any answer that was not the upstream's, is marked INVALID with the
//! reason and not ranked: no ratios, not in the chart. Prints the tables (also to `DIR/table.txt`), writes one
//! JSON line per system and phase to `DIR/results.jsonl`, and draws `DIR/chart.png` with gnuplot
//! (saturation QPS and p99 latency per system) when gnuplot is installed.

use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const DIRECT: &str = "direct";
const LF: &str = "localdns-fallback";
const SCENARIOS: [&str; 8] = [
    "calibrate",
    "throughput",
    "tcp",
    "kill",
    "slow",
    "faults",
    "outage-stale",
    "overload",
];
/// The forwarding check's phase (see `check_forwarding` in run.sh).
const CHECK: &str = "check";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dnsreport: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The runs of one scenario: system -> phase -> the JSON objects of its repetitions.
struct Scenario {
    systems: Vec<String>,
    runs: BTreeMap<(String, String), Vec<Map<String, Value>>>,
}

impl Scenario {
    /// Median over the repetitions of `key` in `phase` for `system`.
    fn median(&self, system: &str, phase: &str, key: &str) -> Option<f64> {
        let runs = self.runs.get(&(system.to_string(), phase.to_string()))?;
        let mut v: Vec<f64> = runs.iter().filter_map(|r| num(r.get(key)?)).collect();
        median(&mut v)
    }

    /// Do the repetitions of `key` disagree by more than a quarter of their median?
    fn spread(&self, system: &str, phase: &str, key: &str) -> bool {
        let Some(runs) = self.runs.get(&(system.to_string(), phase.to_string())) else {
            return false;
        };
        let v: Vec<f64> = runs.iter().filter_map(|r| num(r.get(key)?)).collect();
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        match self.median(system, phase, key) {
            Some(m) if v.len() > 1 && m.abs() > 0.0 => (hi - lo) / m.abs() > 0.25,
            _ => false,
        }
    }

    /// Why `system`'s figures in this scenario do not count, or None when they do: a failed
    /// forwarding check, or (`answers_must_be_good`: throughput and TCP) any reply that was not
    /// the upstream's answer, e.g. "246,147 NXDOMAIN".
    fn invalid(&self, system: &str, answers_must_be_good: bool) -> Option<String> {
        let mut why = Vec::new();
        for ((sys, phase), runs) in &self.runs {
            if sys != system {
                continue;
            }
            for r in runs {
                let n = |k: &str| r.get(k).and_then(num).unwrap_or(0.0);
                if phase == CHECK {
                    if r.get("check_ok") != Some(&Value::Bool(true)) {
                        why.push(format!(
                            "forwarding check: {} of {} answers were the upstream's, the upstream saw {} queries",
                            n("good"),
                            n("sent"),
                            n("upstream_saw")
                        ));
                    }
                    continue;
                }
                if !answers_must_be_good {
                    continue;
                }
                for (k, label) in [
                    ("nxdomain", "NXDOMAIN"),
                    ("servfail", "SERVFAIL"),
                    ("refused", "REFUSED"),
                    ("other_rcode", "other rcode"),
                    ("wrong_answer", "NOERROR without the upstream's record"),
                ] {
                    if n(k) > 0.0 {
                        why.push(format!("{} {label} in {phase}", fmt_num(n(k), 0)));
                    }
                }
            }
        }
        why.dedup();
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// How many repetitions of `system`/`phase` had `key` true (for booleans).
    fn count_true(&self, system: &str, phase: &str, key: &str) -> (usize, usize) {
        let runs = self
            .runs
            .get(&(system.to_string(), phase.to_string()))
            .map_or(&[][..], |r| &r[..]);
        (
            runs.iter()
                .filter(|r| r.get(key) == Some(&Value::Bool(true)))
                .count(),
            runs.len(),
        )
    }
}

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn run() -> Result<(), String> {
    let mut raw = None;
    let mut out = None;
    let mut header = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--raw" => raw = Some(PathBuf::from(v)),
            "--out" => out = Some(PathBuf::from(v)),
            "--header" => header = Some(PathBuf::from(v)),
            _ => {
                return Err(format!(
                    "unknown option {a:?}; usage: dnsreport --raw FILE --out DIR [--header FILE]"
                ));
            }
        }
    }
    let raw = raw.ok_or("--raw FILE is required")?;
    let out = out.ok_or("--out DIR is required")?;
    let text =
        std::fs::read_to_string(&raw).map_err(|e| format!("cannot read {}: {e}", raw.display()))?;
    let mut scenarios: BTreeMap<String, Scenario> = BTreeMap::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value =
            serde_json::from_str(line).map_err(|e| format!("{}:{}: {e}", raw.display(), i + 1))?;
        let Value::Object(m) = v else { continue };
        let get = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let (scen, system, phase) = (get("scenario"), get("system"), get("phase"));
        let s = scenarios.entry(scen).or_insert_with(|| Scenario {
            systems: Vec::new(),
            runs: BTreeMap::new(),
        });
        if !s.systems.contains(&system) {
            s.systems.push(system.clone());
        }
        s.runs.entry((system, phase)).or_default().push(m);
    }

    let mut report = String::new();
    if let Some(h) = header.and_then(|h| std::fs::read_to_string(h).ok()) {
        report.push_str(&h);
        report.push('\n');
    }
    let mut results = String::new();
    for name in SCENARIOS {
        let Some(s) = scenarios.get(name) else {
            continue;
        };
        match name {
            "calibrate" => calibrate_table(s, &mut report),
            "throughput" => throughput_tables(s, &mut report),
            "tcp" => tcp_tables(s, &mut report),
            "kill" => kill_table(s, &mut report),
            "faults" => faults_table(s, &mut report),
            "outage-stale" => stale_table(s, &mut report),
            "slow" => slow_table(s, &mut report),
            "overload" => overload_table(s, &mut report),
            _ => {}
        }
        results_lines(name, s, &mut results);
    }
    print!("{report}");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    write(&out.join("table.txt"), &report)?;
    write(&out.join("results.jsonl"), &results)?;
    if let Some(s) = scenarios.get("throughput") {
        chart(s, &out)?;
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// One column of a table: a figure of one phase.
struct Col {
    title: &'static str,
    phase: &'static str,
    key: &'static str,
    /// Multiply the stored value by this (KiB -> MiB).
    scale: f64,
    decimals: usize,
}

const fn col(title: &'static str, phase: &'static str, key: &'static str, decimals: usize) -> Col {
    Col {
        title,
        phase,
        key,
        scale: 1.0,
        decimals,
    }
}

fn fmt_num(v: f64, decimals: usize) -> String {
    if decimals == 0 && v.abs() >= 10_000.0 {
        // Thousands separators for big counts.
        let s = format!("{:.0}", v);
        let (sign, digits) = s.split_at(usize::from(s.starts_with('-')));
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        return format!("{sign}{out}");
    }
    format!("{v:.decimals$}")
}

fn table(title: &str, note: &str, head: &[&str], rows: &[Vec<String>], out: &mut String) {
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let _ = writeln!(out, "\n{title}");
    if !note.is_empty() {
        let _ = writeln!(out, "{note}");
    }
    let line = |cells: &[String], out: &mut String| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i] - c.chars().count();
            if i == 0 {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str("  ");
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            }
        }
        let _ = writeln!(out, "{}", s.trim_end());
    };
    line(&head.iter().map(|h| h.to_string()).collect::<Vec<_>>(), out);
    let _ = writeln!(
        out,
        "{}",
        "-".repeat(w.iter().sum::<usize>() + 2 * (w.len() - 1))
    );
    for r in rows {
        line(r, out);
    }
}

/// The values table and the two ratio tables of a scenario with `cols`.
fn value_and_ratio_tables(s: &Scenario, title: &str, note: &str, cols: &[Col], out: &mut String) {
    let mut head = vec!["system"];
    head.extend(cols.iter().map(|c| c.title));
    head.push("answers");
    let invalid = |sys: &str| s.invalid(sys, true);
    let value = |sys: &str, c: &Col| s.median(sys, c.phase, c.key).map(|v| v * c.scale);
    let rows: Vec<Vec<String>> = s
        .systems
        .iter()
        .map(|sys| {
            let mut r = vec![sys.clone()];
            r.extend(cols.iter().map(|c| {
                let mark = if s.spread(sys, c.phase, c.key) {
                    "*"
                } else {
                    ""
                };
                value(sys, c).map_or("-".into(), |v| format!("{}{mark}", fmt_num(v, c.decimals)))
            }));
            r.push(invalid(sys).map_or("all good".into(), |w| format!("INVALID: {w}")));
            r
        })
        .collect();
    let any_spread = rows.iter().flatten().any(|c| c.ends_with('*'));
    let note = if any_spread {
        format!(
            "{note}\n*: the repetitions differ by more than 25% of the median (other work on the machine: see 'other load %')."
        )
    } else {
        note.to_string()
    };
    table(title, &note, &head, &rows, out);
    // The machine's other load describes the run, not the system: no ratios of it.
    let rcols: Vec<&Col> = cols.iter().filter(|c| c.key != "other_load_pct").collect();
    let mut rhead = vec!["system"];
    rhead.extend(rcols.iter().map(|c| c.title));
    for base in [DIRECT, LF] {
        if !s.systems.iter().any(|x| x == base) {
            continue;
        }
        let rows: Vec<Vec<String>> = s
            .systems
            .iter()
            .map(|sys| {
                let mut r = vec![sys.clone()];
                if invalid(sys).is_some() || invalid(base).is_some() {
                    r.extend(rcols.iter().map(|_| "INVALID".to_string()));
                    return r;
                }
                r.extend(rcols.iter().map(|c| match (value(sys, c), value(base, c)) {
                    (Some(a), Some(b)) if b != 0.0 => format!("{:.2}x", a / b),
                    (Some(0.0), Some(_)) => "=".into(),
                    _ => "-".into(),
                }));
                r
            })
            .collect();
        table(
            &format!("{title}: each figure divided by {base}'s"),
            "",
            &rhead,
            &rows,
            out,
        );
    }
}

fn throughput_tables(s: &Scenario, out: &mut String) {
    let reps = s.runs.values().map(Vec::len).max().unwrap_or(0);
    let rate = s
        .runs
        .iter()
        .find(|((_, p), _)| p == "rate-miss")
        .and_then(|(_, r)| {
            r[0].get("rate")
                .and_then(Value::as_str)
                .map(|x| x.split(':').next().unwrap_or(x).to_string())
        })
        .unwrap_or_else(|| "?".into());
    let outstanding = s
        .runs
        .iter()
        .find(|((_, p), _)| p == "sat-miss")
        .and_then(|(_, r)| r[0].get("outstanding").and_then(num))
        .map_or("?".into(), |v| format!("{v}"));
    // From a measured phase: the forwarding checks always use dnsload.
    let generator = s
        .runs
        .iter()
        .find(|((_, p), _)| p == "sat-miss")
        .and_then(|(_, r)| r[0].get("generator").and_then(Value::as_str))
        .unwrap_or("?");
    let note = format!(
        "UDP, generator {generator}, medians of {reps} repetition(s). QPS: good answers (NOERROR with the upstream's record \
         for that name; dnsperf: NOERROR) per second with {outstanding} queries outstanding (closed loop).\nanswers: \
         INVALID when a forwarding check failed or any answer was not the upstream's (such a row is not ranked).\nLatency and loss: open loop at {rate} QPS, cache-miss names. CPU: the forwarder's \
         user+system time per answered query at saturation (cache-miss).\nRSS: resident memory just after start (idle) and \
         its peak over the run (VmHWM). '-': not applicable (no process of its own).\nother load: the share of \
         the machine's CPU taken by work other than the harness's during sat-miss (from /proc/stat)."
    );
    let mib = |title, phase, key| Col {
        title,
        phase,
        key,
        scale: 1.0 / 1024.0,
        decimals: 1,
    };
    let cols = [
        col("QPS miss", "sat-miss", "qps", 0),
        col("QPS hit", "sat-hit", "qps", 0),
        col("QPS mix", "sat-mix", "qps", 0),
        col("p50 us", "rate-miss", "p50_us", 0),
        col("p99 us", "rate-miss", "p99_us", 0),
        col("p99.9 us", "rate-miss", "p999_us", 0),
        col("loss %", "rate-miss", "loss_pct", 2),
        col("CPU us/q", "sat-miss", "cpu_us_per_query", 1),
        mib("RSS idle MiB", "idle", "rss_idle_kib"),
        mib("RSS peak MiB", "rate-miss", "rss_peak_kib"),
        col("other load %", "sat-miss", "other_load_pct", 0),
    ];
    value_and_ratio_tables(s, "== Throughput and latency (UDP)", &note, &cols, out);
}

fn tcp_tables(s: &Scenario, out: &mut String) {
    let note = "TCP, pipelined queries over a few connections. QPS at saturation (closed loop); latency and loss \
                open loop at the scenario rate; CPU per query at saturation.";
    let cols = [
        col("QPS", "tcp-sat", "qps", 0),
        col("p50 us", "tcp-rate", "p50_us", 0),
        col("p99 us", "tcp-rate", "p99_us", 0),
        col("p99.9 us", "tcp-rate", "p999_us", 0),
        col("loss %", "tcp-rate", "loss_pct", 2),
        col("CPU us/q", "tcp-sat", "cpu_us_per_query", 1),
    ];
    value_and_ratio_tables(s, "== TCP clients", note, &cols, out);
}

/// Milliseconds from a microsecond figure, with a sensible number of decimals.
fn ms(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(us) if us < 10_000.0 => format!("{:.2}", us / 1000.0),
        Some(us) => fmt_num(us / 1000.0, 0),
    }
}

fn faults_table(s: &Scenario, out: &mut String) {
    let head = [
        "system",
        "fault",
        "QPS",
        "sent after",
        "errors",
        "timeouts",
        "slow",
        "p50 ms",
        "p99 ms",
        "max ms",
        "recovery s",
        "check",
    ];
    let mut phases: Vec<&str> = Vec::new();
    for (_, p) in s.runs.keys() {
        if p != CHECK && !phases.contains(&p.as_str()) {
            phases.push(p);
        }
    }
    // The order the scenario runs them in.
    let order = ["refuse", "servfail", "closed-port", "blackhole"];
    phases.sort_by_key(|p| order.iter().position(|o| o == p).unwrap_or(order.len()));
    let mut rows: Vec<Vec<String>> = Vec::new();
    for phase in phases {
        for sys in &s.systems {
            let runs = s.runs.get(&(sys.clone(), phase.to_string()));
            let check = s
                .invalid(sys, false)
                .map_or("ok".into(), |w| format!("INVALID: {w}"));
            let Some(runs) = runs else {
                if check != "ok" {
                    rows.push(vec![sys.clone(), phase.into(), check]);
                }
                continue;
            };
            let f = |k: &str, d: usize| {
                s.median(sys, phase, k)
                    .map_or("-".into(), |v| fmt_num(v, d))
            };
            let qps = runs[0]
                .get("rate")
                .and_then(Value::as_str)
                .and_then(|r| r.split(':').next())
                .unwrap_or("?")
                .to_string();
            let (yes, n) = s.count_true(sys, phase, "recovered");
            rows.push(vec![
                sys.clone(),
                phase.to_string(),
                qps,
                f("after_event_sent", 0),
                f("after_event_errors", 0),
                f("after_event_lost", 0),
                f("after_event_slow", 0),
                ms(s.median(sys, phase, "fault_p50_us")),
                ms(s.median(sys, phase, "fault_p99_us")),
                ms(s.median(sys, phase, "fault_max_us")),
                if yes * 2 > n {
                    f("recovery_s", 2)
                } else {
                    "never".into()
                },
                check,
            ]);
        }
    }
    table(
        "== One of two kube-dns backends goes wrong mid-run",
        "Open loop, cache-miss names; backend 2 goes wrong at the event: refuse / servfail = it answers every query \
         REFUSED / SERVFAIL; closed-port = its server is SIGKILLed\n(the kernel answers ICMP port unreachable, \
         rate-limited); blackhole = its namespace drops every DNS packet. Counts are of the queries sent after the \
         event: errors = any answer\nthat is not the upstream's (non-NOERROR or without its record), timeouts = no \
         answer within 5 s, slow = answered after more than 100 ms. p50/p99/max: latency of the\nqueries sent during \
         the fault. recovery = from the event to the end of the last 100 ms interval with an error, timeout or slow \
         answer ('never': still failing when the run ended).",
        &head,
        &rows,
        out,
    );
}

fn stale_table(s: &Scenario, out: &mut String) {
    let head = [
        "system",
        "filled",
        "first: good",
        "errors",
        "lost",
        "p50 ms",
        "max ms",
        "next: good",
        "errors",
        "lost",
        "p50 ms",
        "p99 ms",
        "max ms",
        "check",
    ];
    let phase = "outage-stale";
    let rows: Vec<Vec<String>> = s
        .systems
        .iter()
        .map(|sys| {
            let m = |k: &str| s.median(sys, phase, k);
            let f = |k: &str| m(k).map_or("-".into(), |v| fmt_num(v, 0));
            let of = |a: &str, b: &str| match (m(a), m(b)) {
                (Some(x), Some(y)) => format!("{}/{}", fmt_num(x, 0), fmt_num(y, 0)),
                _ => "-".into(),
            };
            vec![
                sys.clone(),
                of("fill_good", "fill_asked"),
                of("first_good", "first_asked"),
                f("first_errors"),
                f("first_lost"),
                ms(m("first_p50_us")),
                ms(m("first_max_us")),
                of("next_good", "next_asked"),
                f("next_errors"),
                f("next_lost"),
                ms(m("next_p50_us")),
                ms(m("next_p99_us")),
                ms(m("next_max_us")),
                s.invalid(sys, false)
                    .map_or("ok".into(), |w| format!("INVALID: {w}")),
            ]
        })
        .collect();
    table(
        "== Every upstream down, the cache holding expired entries",
        "20 fresh names asked once (TTL 2 s), 6 s later every DNS packet to both upstreams is dropped and the 20 names \
         are asked again, 6 rounds 0.5 s apart (or back to back when a round\ntakes longer). first = each name's first \
         lookup during the outage, next = the 5 lookups after it. good = the upstream's (stale) answer; lost = no \
         answer within 5 s.",
        &head,
        &rows,
        out,
    );
}

/// One line per system that failed its forwarding check (its row is empty or partial).
fn invalid_lines(s: &Scenario, out: &mut String) {
    for sys in &s.systems {
        if let Some(w) = s.invalid(sys, false) {
            let _ = writeln!(out, "INVALID {sys}: {w}");
        }
    }
}

fn kill_table(s: &Scenario, out: &mut String) {
    let head = [
        "system",
        "how",
        "sent after",
        "errors",
        "lost",
        "slow",
        "first failure s",
        "recovery s",
        "recovered",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for phase in ["kill", "blackhole"] {
        for sys in &s.systems {
            if !s.runs.contains_key(&(sys.clone(), phase.to_string())) {
                continue;
            }
            let f = |k: &str, d: usize| {
                s.median(sys, phase, k)
                    .map_or("-".into(), |v| fmt_num(v, d))
            };
            let (yes, n) = s.count_true(sys, phase, "recovered");
            rows.push(vec![
                sys.clone(),
                phase.to_string(),
                f("after_event_sent", 0),
                f("after_event_errors", 0),
                f("after_event_lost", 0),
                f("after_event_slow", 0),
                f("first_failure_s", 2),
                if yes * 2 > n {
                    f("recovery_s", 2)
                } else {
                    "never".into()
                },
                format!("{yes}/{n}"),
            ]);
        }
    }
    table(
        "== A kube-dns backend lost mid-run",
        "Two backends, open loop at a fixed rate, cache-miss names. kill: backend 2's server is SIGKILLed (its address \
         stays, so the kernel answers ICMP port unreachable);\nblackhole: backend 2 silently drops every DNS packet (a pod \
         gone without a trace). Counts are of the queries sent after that moment: errors = SERVFAIL/REFUSED/other \
         answers,\nlost = no answer within 5 s, slow = answered after more than 100 ms. recovery = from the event to the \
         end of the last 100 ms interval with a failed or slow query ('never': still failing when the run ended).",
        &head,
        &rows,
        out,
    );
    invalid_lines(s, out);
}

fn slow_table(s: &Scenario, out: &mut String) {
    let head = [
        "system", "p50 us", "p90 us", "p99 us", "p99.9 us", "slow %", "loss %", "errors %",
    ];
    let rows: Vec<Vec<String>> = s
        .systems
        .iter()
        .map(|sys| {
            let f = |k: &str, d: usize| {
                s.median(sys, "slow", k)
                    .map_or("-".into(), |v| fmt_num(v, d))
            };
            let slow_pct = match (s.median(sys, "slow", "slow"), s.median(sys, "slow", "sent")) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.1}", a * 100.0 / b),
                _ => "-".into(),
            };
            vec![
                sys.clone(),
                f("p50_us", 0),
                f("p90_us", 0),
                f("p99_us", 0),
                f("p999_us", 0),
                slow_pct,
                f("loss_pct", 2),
                f("error_pct", 2),
            ]
        })
        .collect();
    table(
        "== One of two backends answers slowly",
        "Two backends, the second adds 200 ms to every answer; open loop at a fixed rate, cache-miss names. slow = answered \
         after more than 100 ms.",
        &head,
        &rows,
        out,
    );
    invalid_lines(s, out);
}

fn overload_table(s: &Scenario, out: &mut String) {
    let head = [
        "system",
        "sat QPS",
        "offered QPS",
        "good QPS",
        "shed %",
        "loss %",
        "other errors %",
        "RSS peak MiB",
        "full service after s",
    ];
    let rows: Vec<Vec<String>> = s
        .systems
        .iter()
        .map(|sys| {
            let m = |k: &str| s.median(sys, "overload", k);
            let f = |k: &str, d: usize| m(k).map_or("-".into(), |v| fmt_num(v, d));
            let (yes, n) = s.count_true(sys, "overload", "recovered");
            let other = match (m("before_event_error_pct"), m("before_event_shed_pct")) {
                (Some(e), Some(r)) => format!("{:.2}", (e - r).max(0.0)),
                _ => "-".into(),
            };
            vec![
                sys.clone(),
                f("sat_qps", 0),
                f("before_event_offered_qps", 0),
                f("before_event_ok_qps", 0),
                f("before_event_shed_pct", 2),
                f("before_event_loss_pct", 2),
                other,
                m("rss_peak_kib").map_or("-".into(), |v| format!("{:.1}", v / 1024.0)),
                if yes * 2 > n {
                    f("recovery_s", 2)
                } else {
                    "never".into()
                },
            ]
        })
        .collect();
    table(
        "== Overload (a placeholder)",
        "Open loop at twice the system's own saturation QPS, then 1000 QPS. Offered, good (NOERROR/NXDOMAIN answers), \
         shed (REFUSED), loss and other errors are of the queries sent during the overload (the generator may fall short \
         of 2x).\nRSS peak: VmHWM over the run. full service after = from the end of the overload to the end of the last \
         100 ms interval with an error, a loss or an answer slower than 50 ms.",
        &head,
        &rows,
        out,
    );
    invalid_lines(s, out);
}

fn calibrate_table(s: &Scenario, out: &mut String) {
    let head = [
        "upstream+generator",
        "QPS",
        "p50 us",
        "p99 us",
        "machine busy %",
    ];
    let mut phases: Vec<&String> = s.runs.keys().map(|(_, p)| p).collect();
    phases.dedup();
    let rows: Vec<Vec<String>> = phases
        .iter()
        .map(|p| {
            let f =
                |k: &str, d: usize| s.median(DIRECT, p, k).map_or("-".into(), |v| fmt_num(v, d));
            vec![
                (*p).clone(),
                f("qps", 0),
                f("p50_us", 0),
                f("p99_us", 0),
                f("machine_busy_pct", 0),
            ]
        })
        .collect();
    table(
        "== Calibration: direct to the upstream, by upstream server and load generator",
        "Saturation (closed loop), cache-miss names, medians. The fastest upstream sets the ceiling every other system is \
         compared with; a generator that reaches less than another is the bottleneck of `direct`.",
        &head,
        &rows,
        out,
    );
}

/// One JSON line per system and phase: medians, repetition count and both ratios.
fn results_lines(scenario: &str, s: &Scenario, out: &mut String) {
    for ((system, phase), runs) in &s.runs {
        let mut keys: Vec<&String> = runs
            .iter()
            .flat_map(|r| r.keys())
            .filter(|k| runs.iter().any(|r| r.get(*k).and_then(num).is_some()))
            .collect();
        keys.sort();
        keys.dedup();
        let mut med = Map::new();
        let mut x_direct = Map::new();
        let mut x_lf = Map::new();
        for k in keys {
            if k == "rep" {
                continue;
            }
            let Some(v) = s.median(system, phase, k) else {
                continue;
            };
            med.insert(k.clone(), json!(v));
            for (base, into) in [(DIRECT, &mut x_direct), (LF, &mut x_lf)] {
                if let Some(b) = s.median(base, phase, k)
                    && b != 0.0
                {
                    into.insert(k.clone(), json!((v / b * 1000.0).round() / 1000.0));
                }
            }
        }
        let answers_must_be_good = matches!(scenario, "throughput" | "tcp");
        let line = json!({
            "scenario": scenario,
            "system": system,
            "phase": phase,
            "valid": s.invalid(system, answers_must_be_good).is_none(),
            "invalid": s.invalid(system, answers_must_be_good),
            "reps": runs.len(),
            "median": med,
            "x_direct": x_direct,
            "x_localdns_fallback": x_lf,
        });
        let _ = writeln!(out, "{line}");
    }
}

/// The PNG: saturation QPS (cache-miss and cache-hit) and latency (p50, p99) per system.
fn chart(s: &Scenario, out: &Path) -> Result<(), String> {
    if Command::new("gnuplot").arg("--version").output().is_err() {
        eprintln!("dnsreport: gnuplot is not installed (loadtest/run.sh --install), so no chart");
        return Ok(());
    }
    let mut dat = String::from("# system qps_miss qps_hit p50_us p99_us\n");
    // Invalid systems are not ranked, so not drawn either.
    for sys in s.systems.iter().filter(|x| s.invalid(x, true).is_none()) {
        let g = |p: &str, k: &str| s.median(sys, p, k).unwrap_or(0.0);
        let _ = writeln!(
            dat,
            "\"{}\" {} {} {} {}",
            sys,
            g("sat-miss", "qps"),
            g("sat-hit", "qps"),
            g("rate-miss", "p50_us"),
            g("rate-miss", "p99_us")
        );
    }
    let rate = s
        .runs
        .iter()
        .find(|((_, p), _)| p == "rate-miss")
        .and_then(|(_, r)| {
            r[0].get("rate")
                .and_then(Value::as_str)
                .map(|x| x.split(':').next().unwrap_or(x).to_string())
        })
        .unwrap_or_else(|| "?".into());
    // Room above the tallest latency bar for its label (a log axis has no offsets).
    let lat_max = s
        .systems
        .iter()
        .filter_map(|sys| s.median(sys, "rate-miss", "p99_us"))
        .fold(100.0_f64, f64::max);
    let lat_top = 10f64.powf((lat_max * 4.0).log10().ceil());
    let dat_path = out.join("chart.dat");
    let png = out.join("chart.png");
    write(&dat_path, &dat)?;
    let script = format!(
        r##"set terminal pngcairo size 1500,650 font "DejaVu Sans,11"
set output "{png}"
set multiplot layout 1,2 title "localdns-fallback load test (medians)" font ",14"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics
set key top right
set xtics rotate by 30 right nomirror
set bmargin 7
set yrange [0:*]
set offsets 0, 0, graph 0.1, 0
set format y "%.0f"
set title "Saturation throughput, UDP (good answers/s)"
set ylabel "queries per second"
plot "{dat}" using 2:xtic(1) title "cache-miss" lc rgb "#3b6fb6", \
     "" using 3 title "cache-hit" lc rgb "#8fb3e0", \
     "" using ($0-0.15):2:(sprintf("%.1fk",$2/1000)) with labels rotate by 90 left offset 0,0.4 font ",9" notitle, \
     "" using ($0+0.15):3:(sprintf("%.1fk",$3/1000)) with labels rotate by 90 left offset 0,0.4 font ",9" notitle
set title "Latency at {rate} QPS, open loop, cache-miss (log scale)"
set ylabel "microseconds"
set logscale y
set offsets 0, 0, 0, 0
set yrange [10:{lat_top}]
set format y "%.0f"
plot "{dat}" using 4:xtic(1) title "p50" lc rgb "#e0a060", \
     "" using 5 title "p99" lc rgb "#c0392b", \
     "" using ($0-0.15):4:(sprintf("%.0f",$4)) with labels rotate by 90 left offset 0,0.4 font ",9" notitle, \
     "" using ($0+0.15):5:(sprintf("%.0f",$5)) with labels rotate by 90 left offset 0,0.4 font ",9" notitle
unset multiplot
"##,
        png = png.display(),
        lat_top = lat_top,
        dat = dat_path.display(),
    );
    let gp = out.join("chart.gp");
    write(&gp, &script)?;
    let r = Command::new("gnuplot")
        .arg(&gp)
        .output()
        .map_err(|e| format!("cannot run gnuplot: {e}"))?;
    if !r.status.success() {
        return Err(format!(
            "gnuplot failed: {}",
            String::from_utf8_lossy(&r.stderr)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_numbers() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(fmt_num(1_234_567.0, 0), "1,234,567");
        assert_eq!(fmt_num(9_999.0, 0), "9999");
        assert_eq!(fmt_num(-12_345.0, 0), "-12,345");
        assert_eq!(fmt_num(0.125, 2), "0.12");
    }

    #[test]
    fn ratios_use_the_same_phase_of_the_base_system() {
        let mut s = Scenario {
            systems: vec![DIRECT.into(), LF.into()],
            runs: BTreeMap::new(),
        };
        for (sys, qps) in [(DIRECT, [100.0, 120.0, 110.0]), (LF, [50.0, 60.0, 55.0])] {
            for q in qps {
                let Value::Object(m) = json!({"qps": q}) else {
                    unreachable!()
                };
                s.runs
                    .entry((sys.to_string(), "sat-miss".to_string()))
                    .or_default()
                    .push(m);
            }
        }
        let mut out = String::new();
        results_lines("throughput", &s, &mut out);
        let lf: Value =
            serde_json::from_str(out.lines().find(|l| l.contains(LF)).unwrap()).unwrap();
        assert_eq!(lf["median"]["qps"], json!(55.0));
        assert_eq!(lf["x_direct"]["qps"], json!(0.5));
        assert_eq!(lf["x_localdns_fallback"]["qps"], json!(1.0));
    }
}
