//! The load-test harness of `localdns-fallback`: the Rust half of `loadtest/run.sh`.
//!
//! # Layout
//! - `bin/dnsload.rs` — the load generator (`dnsload run`), a readiness probe (`dnsload probe`), the
//!   query-file writer for dnsperf (`dnsload names`) and a dnsperf wrapper (`dnsload dnsperf`) that
//!   prints the same JSON line as `run`, so either can be the load source.
//! - `bin/responder.rs` — the synthetic upstream: answers every A/AAAA query at once (or after
//!   `--delay-ms`), UDP on SO_REUSEPORT sockets with one thread each, and TCP.
//! - `bin/dnsreport.rs` — reads the JSON lines of a run, takes medians over repetitions, prints the
//!   tables with ratios, writes `results.jsonl` and the PNG chart (through gnuplot).
//! - [`dns`] — the few wire-format operations a generator and a synthetic server need.
//! - [`names`] — the query sets: cache-miss (unique names), cache-hit (100 names), a mix.
//! - [`hist`] — a log-linear latency histogram (under 1% error) for the percentiles.
//! - [`net`] — raw sockets: SO_REUSEPORT, forced buffer sizes, kernel receive timestamps and
//!   `recvmmsg`/`sendmmsg` batches.
//! - [`track`] — the queries in flight, matched to replies by channel and ID, with the counters,
//!   the histogram, timeouts and the per-interval timeline; shared by the UDP and TCP engines.
//! - [`pace`] — how many queries to send now: closed loop (N outstanding) or open loop (a rate).
//! - [`udp`], [`tcp`] — the two single-threaded engines.
//! - [`procfs`] — CPU time and memory of the system under test, from `/proc`.
//! - [`outcome`] — the JSON line a run prints.

pub mod dns;
pub mod hist;
pub mod names;
pub mod net;
pub mod outcome;
pub mod pace;
pub mod procfs;
pub mod tcp;
pub mod track;
pub mod udp;

/// Wall-clock nanoseconds (CLOCK_REALTIME), the clock of the kernel's receive timestamps.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the pointer we own.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
