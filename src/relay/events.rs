//! A relay thread's engine events as log lines: at most one per upstream (and one about stale
//! answers) every `WARN_EVERY`, each saying how many it stands for, so a failing upstream at
//! thousands of queries a second costs a line every ten seconds, not a line per query.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::engine::{Event, Failure};

/// How often a warning about one upstream, or about stale answers, may be logged.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// Upstreams remembered; past this, those not warned about within `WARN_EVERY` are forgotten
/// (their next warning is simply due at once). Discovery replaces kube-dns backends as pods
/// come and go, so over months the addresses that ever failed are not bounded by themselves.
const REMEMBERED: usize = 1024;

/// Turns engine events into log lines, at most one per upstream (and one about stale answers)
/// every `WARN_EVERY`, each saying how many it stands for.
#[derive(Default)]
pub(super) struct EventLog {
    /// Per upstream: when it was last warned about, and failures since.
    upstreams: HashMap<SocketAddr, (Option<Instant>, u64)>,
    stale: (Option<Instant>, u64),
}

impl EventLog {
    pub(super) fn event(&mut self, event: Event, now: Instant) {
        let due = |last: Option<Instant>| last.is_none_or(|t| now.duration_since(t) >= WARN_EVERY);
        match event {
            Event::UpstreamSuspect {
                group,
                upstream,
                failure,
            }
            | Event::NotSent {
                group,
                upstream,
                failure,
            } => {
                if self.upstreams.len() >= REMEMBERED && !self.upstreams.contains_key(&upstream) {
                    self.upstreams.retain(|_, (last, _)| {
                        last.is_some_and(|t| now.duration_since(t) < WARN_EVERY)
                    });
                }
                let (last, missed) = self.upstreams.entry(upstream).or_default();
                *missed += 1;
                if due(*last) {
                    let then = match event {
                        Event::NotSent { .. } => "not held against it",
                        _ => "trying other upstreams first",
                    };
                    tracing::warn!(
                        upstream = %upstream,
                        group = group.name(),
                        failures = *missed,
                        "upstream {}; {then}",
                        describe(failure)
                    );
                    (*last, *missed) = (Some(now), 0);
                }
            }
            Event::UpstreamRecovered { group, upstream } => {
                tracing::info!(upstream = %upstream, group = group.name(), "upstream answers again");
            }
            Event::ServedStale { answers } => {
                let (last, unlogged) = &mut self.stale;
                *unlogged += answers as u64;
                if due(*last) {
                    tracing::warn!(
                        stale = *unlogged,
                        "upstreams failing; answered from expired cache entries"
                    );
                    (*last, *unlogged) = (Some(now), 0);
                }
            }
        }
    }
}

fn describe(failure: Failure) -> String {
    match failure {
        Failure::TimedOut => "timed out".into(),
        Failure::Network(kind) => format!("cannot be reached ({kind})"),
        Failure::NoSocket => "was not tried: no socket to it".into(),
        Failure::ErrorReply(code) => format!("answered with an error (RCODE {code})"),
        Failure::Local(kind) => format!("was not tried: this host refused the send ({kind})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roles::UpstreamGroup;

    #[test]
    fn upstreams_that_failed_long_ago_are_forgotten() {
        let mut log = EventLog::default();
        let t0 = Instant::now();
        for i in 0..5000u32 {
            let upstream = SocketAddr::from((std::net::Ipv4Addr::from(0x0a00_0000 + i), 53));
            let event = Event::UpstreamSuspect {
                group: UpstreamGroup::KubeDns,
                upstream,
                failure: Failure::TimedOut,
            };
            log.event(event, t0 + Duration::from_millis(u64::from(i) * 20));
            assert!(log.upstreams.len() <= REMEMBERED, "at {i}");
        }
        // Those warned about within the last WARN_EVERY are kept (500 at one per 20 ms).
        assert!(log.upstreams.len() >= 500, "{}", log.upstreams.len());
    }
}
