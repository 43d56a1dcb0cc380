//! How many queries to send now.
//!
//! - Closed loop (`--outstanding N`): keep N queries in flight; a reply (or a timeout) makes room
//!   for the next. The rate found is the saturation throughput.
//! - Open loop (`--rate QPS` or a profile `QPS:SECS,QPS:SECS,...`): send on a fixed schedule
//!   whatever the replies do, the way many independent clients behave. If the generator itself
//!   falls behind by more than a few milliseconds of queries, the backlog is dropped and counted
//!   (`unsent`) instead of being sent as one burst.

#[derive(Debug, Clone)]
pub enum Load {
    Closed { outstanding: u64 },
    Open { steps: Vec<(f64, f64)> },
}

impl Load {
    /// `N` outstanding, or a rate profile `QPS[:SECS][,QPS:SECS...]` (the last step's length may
    /// be left out: it runs for the rest of `duration`).
    pub fn parse_rate(s: &str, duration_s: f64) -> Result<Load, String> {
        let mut steps = Vec::new();
        let mut used = 0.0;
        let parts: Vec<&str> = s.split(',').collect();
        for (i, p) in parts.iter().enumerate() {
            let (q, d) = match p.split_once(':') {
                Some((q, d)) => (q, Some(d)),
                None => (*p, None),
            };
            let qps: f64 = q.parse().map_err(|_| format!("bad rate {q:?} in {s:?}"))?;
            let secs = match d {
                Some(d) => d
                    .parse::<f64>()
                    .map_err(|_| format!("bad step length {d:?} in {s:?}"))?,
                None if i + 1 == parts.len() => (duration_s - used).max(0.0),
                None => {
                    return Err(format!(
                        "rate profile {s:?}: only the last step may omit :SECS"
                    ));
                }
            };
            if qps.is_nan() || qps <= 0.0 || secs < 0.0 {
                return Err(format!("rate profile {s:?}: rates must be positive"));
            }
            used += secs;
            steps.push((qps, secs));
        }
        Ok(Load::Open { steps })
    }

    /// This load shared by `n` generator threads: share `i` of it.
    pub fn share(&self, i: u64, n: u64) -> Load {
        match self {
            Load::Closed { outstanding } => Load::Closed {
                outstanding: (outstanding / n + u64::from(i < outstanding % n)).max(1),
            },
            Load::Open { steps } => Load::Open {
                steps: steps.iter().map(|&(q, s)| (q / n as f64, s)).collect(),
            },
        }
    }

    /// Total sending time in seconds (closed loop: None, the caller's duration).
    pub fn open_secs(&self) -> Option<f64> {
        match self {
            Load::Closed { .. } => None,
            Load::Open { steps } => Some(steps.iter().map(|s| s.1).sum()),
        }
    }
}

pub struct Pacer {
    load: Load,
    start_ns: u64,
    sent: u64,
    /// Open loop: queries dropped because the generator fell behind.
    pub unsent: u64,
}

impl Pacer {
    pub fn new(load: Load, start_ns: u64) -> Pacer {
        Pacer {
            load,
            start_ns,
            sent: 0,
            unsent: 0,
        }
    }

    /// Queries the schedule has called for by `t` seconds after the start.
    fn planned(&self, t: f64) -> f64 {
        let Load::Open { steps } = &self.load else {
            return 0.0;
        };
        let mut n = 0.0;
        let mut at = 0.0;
        for &(qps, secs) in steps {
            if t <= at + secs {
                return n + qps * (t - at);
            }
            n += qps * secs;
            at += secs;
        }
        n
    }

    fn rate_at(&self, t: f64) -> f64 {
        let Load::Open { steps } = &self.load else {
            return 0.0;
        };
        let mut at = 0.0;
        for &(qps, secs) in steps {
            at += secs;
            if t < at {
                return qps;
            }
        }
        steps.last().map_or(0.0, |s| s.0)
    }

    /// How many queries to send at `now_ns` with `inflight` outstanding.
    pub fn due(&mut self, now_ns: u64, inflight: u64) -> u64 {
        match &self.load {
            Load::Closed { outstanding } => outstanding.saturating_sub(inflight),
            Load::Open { .. } => {
                let t = now_ns.saturating_sub(self.start_ns) as f64 / 1e9;
                let target = self.planned(t) as u64;
                let due = target.saturating_sub(self.sent + self.unsent);
                // At most 3 ms of queries (and at least 64) at once.
                let max_backlog = ((self.rate_at(t) * 0.003) as u64).max(64);
                if due > max_backlog {
                    self.unsent += due - max_backlog;
                    return max_backlog;
                }
                due
            }
        }
    }

    pub fn sent(&mut self, n: u64) {
        self.sent += n;
    }

    /// Open loop: nanoseconds until the next query is due (0 if one is due now). Closed loop:
    /// None (wait for replies).
    pub fn until_next_ns(&self, now_ns: u64) -> Option<u64> {
        let Load::Open { .. } = &self.load else {
            return None;
        };
        let t = now_ns.saturating_sub(self.start_ns) as f64 / 1e9;
        let rate = self.rate_at(t);
        if rate <= 0.0 {
            return Some(1_000_000);
        }
        let owed = self.planned(t) - (self.sent + self.unsent) as f64;
        if owed >= 1.0 {
            return Some(0);
        }
        Some((((1.0 - owed) / rate) * 1e9) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_loop_follows_the_profile() {
        let load = Load::parse_rate("1000:1,100", 3.0).unwrap();
        assert_eq!(load.open_secs(), Some(3.0));
        let mut p = Pacer::new(load, 0);
        assert_eq!(p.due(500_000_000, 0), 64, "a backlog is capped");
        assert_eq!(p.unsent, 436);
        p.sent(64);
        assert_eq!(p.due(1_500_000_000, 0), 64);
        p.sent(64);
        // Caught up with the schedule: the next query is due in 1/100 s.
        let next = p.until_next_ns(1_500_000_000).unwrap();
        assert!((9_000_000..=10_000_000).contains(&next), "{next}");
    }

    #[test]
    fn closed_loop_refills() {
        let mut p = Pacer::new(Load::Closed { outstanding: 100 }, 0);
        assert_eq!(p.due(0, 40), 60);
        assert_eq!(p.until_next_ns(0), None);
    }
}
