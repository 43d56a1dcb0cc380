//! A timing goal of a real-process test, printed for `loadtest/timing.sh`: the suite asserts what
//! a client sees, with a margin that holds on a loaded two-core machine; whether the product
//! meets the goal itself is judged by the benchmark over repetitions (the tight bound is also
//! asserted on the fake clock in the core).

use std::time::Duration;

/// Prints `figure <name> <ms> goal <ms>`, the line `loadtest/timing.sh` collects.
pub fn figure(name: &str, value: Duration, goal: Duration) {
    eprintln!(
        "figure {name} {:.1} goal {:.1}",
        value.as_secs_f64() * 1e3,
        goal.as_secs_f64() * 1e3
    );
}
