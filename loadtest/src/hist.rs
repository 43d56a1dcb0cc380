//! A log-linear histogram of latencies in nanoseconds: exact below 128 ns, then 64 buckets per
//! power of two (relative error under 1%), 3,776 counters in all, so recording is an index and an
//! add and percentiles need no stored samples.

const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS; // 64
const BUCKETS: usize = ((64 - SUB_BITS as usize) * SUB as usize) + SUB as usize;

#[derive(Clone)]
pub struct Hist {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
}

impl Default for Hist {
    fn default() -> Self {
        Hist {
            counts: vec![0; BUCKETS],
            total: 0,
            sum: 0,
            max: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < 2 * SUB {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let e = msb - SUB_BITS; // >= 1
    (e as usize) * SUB as usize + (v >> e) as usize
}

/// The middle of bucket `i`.
fn value(i: usize) -> u64 {
    if i < 2 * SUB as usize {
        return i as u64;
    }
    let e = (i / SUB as usize - 1) as u32;
    let m = (i % SUB as usize) as u64 + SUB;
    (m << e) + (1u64 << e) / 2
}

impl Hist {
    pub fn record(&mut self, ns: u64) {
        self.counts[index(ns)] += 1;
        self.total += 1;
        self.sum += u128::from(ns);
        self.max = self.max.max(ns);
    }

    /// Adds the samples of `other`.
    pub fn merge(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The value at quantile `q` (0..=1), or 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return value(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_tight() {
        let mut last = 0;
        for v in (0..5_000_000u64).step_by(997) {
            let i = index(v);
            assert!(i >= last);
            last = i;
            let mid = value(i) as f64;
            assert!(
                (mid - v as f64).abs() <= (v as f64 * 0.01).max(1.0),
                "{v} -> {mid}"
            );
        }
        assert!(index(u64::MAX) < BUCKETS);
    }

    #[test]
    fn quantiles() {
        let mut h = Hist::default();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 - 500_000.0).abs() < 5_000.0, "{p50}");
        assert!((p99 - 990_000.0).abs() < 10_000.0, "{p99}");
        assert_eq!(h.quantile(1.0), 1_000_000);
    }
}
