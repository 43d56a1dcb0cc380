//! What the system under test costs, from `/proc`: CPU time (user + system, all threads, plus
//! children it has reaped — dnsmasq forks for TCP) and memory (VmRSS now, VmHWM the peak).

use std::fs;

fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// CPU time of process `pid` in nanoseconds (resolution 1/CLK_TCK, 10 ms here).
pub fn cpu_ns(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime, stime, cutime, cstime are fields 14..=17, i.e. rest[11..=14].
    let ticks: u64 = f
        .get(11..15)?
        .iter()
        .map(|v| v.parse::<u64>().unwrap_or(0))
        .sum();
    Some(ticks * 1_000_000_000 / clk_tck())
}

/// A `Vm*` line of `/proc/PID/status`, in KiB.
pub fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        let v = l.strip_prefix(key)?.strip_prefix(':')?;
        v.split_whitespace().next()?.parse().ok()
    })
}

/// The whole machine's CPU time in nanoseconds, from the first line of `/proc/stat`.
#[derive(Clone, Copy, Debug)]
pub struct MachineCpu {
    pub busy: u64,
    pub total: u64,
    /// Softirq time not charged to any process (packet processing, mostly ours here).
    pub softirq: u64,
}

pub fn machine_ns() -> Option<MachineCpu> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).unwrap_or(&0);
    let k = 1_000_000_000 / clk_tck();
    Some(MachineCpu {
        busy: (total - idle) * k,
        total: total * k,
        softirq: v.get(6).unwrap_or(&0) * k,
    })
}

/// Samples taken at both ends of the measurement window.
#[derive(Default, Clone, Copy)]
pub struct Snapshot {
    /// The system under test.
    pub pid_cpu_ns: Option<u64>,
    pub machine: Option<MachineCpu>,
    /// The harness's own processes: this generator (and its reaped children, e.g. dnsperf), the
    /// system under test, the upstreams.
    pub ours_ns: u64,
}

pub fn snapshot(pid: Option<u32>, also: &[u32]) -> Snapshot {
    let pid_cpu_ns = pid.and_then(cpu_ns);
    let mut ours = cpu_ns(std::process::id()).unwrap_or(0) + pid_cpu_ns.unwrap_or(0);
    for p in also {
        ours += cpu_ns(*p).unwrap_or(0);
    }
    Snapshot {
        pid_cpu_ns,
        machine: machine_ns(),
        ours_ns: ours,
    }
}

/// Between two snapshots: the whole machine's busy share, and the share taken by other work
/// (busy time less ours and less unattributed softirq time), both in percent of all CPUs.
pub fn machine_shares(a: &Snapshot, b: &Snapshot) -> Option<(f64, f64)> {
    let (x, y) = (a.machine?, b.machine?);
    let total = y.total.saturating_sub(x.total).max(1) as f64;
    let busy = y.busy.saturating_sub(x.busy) as f64;
    let softirq = y.softirq.saturating_sub(x.softirq) as f64;
    let ours = b.ours_ns.saturating_sub(a.ours_ns) as f64;
    let round = |v: f64| (v * 10.0).round() / 10.0;
    Some((
        round(busy * 100.0 / total),
        round(((busy - softirq - ours) * 100.0 / total).clamp(0.0, 100.0)),
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_itself() {
        let me = std::process::id();
        assert!(super::cpu_ns(me).is_some());
        assert!(super::status_kib(me, "VmHWM").unwrap() > 0);
        let m = super::machine_ns().unwrap();
        assert!(m.busy <= m.total && m.softirq <= m.busy);
    }
}
