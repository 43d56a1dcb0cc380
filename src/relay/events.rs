//! A relay thread's engine events as log lines: at most one per upstream (and one about stale
//! answers) every `WARN_EVERY`, each saying how many it stands for, so a failing upstream at
//! thousands of queries a second costs a line every ten seconds, not a line per query.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::engine::{Event, Failure};

/// How often a warning about one upstream, or about stale answers, may be logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

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
            } => {
                let (last, missed) = self.upstreams.entry(upstream).or_default();
                *missed += 1;
                if due(*last) {
                    tracing::warn!(
                        upstream = %upstream,
                        group = group.name(),
                        failures = *missed,
                        "upstream {}; trying other upstreams first",
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
        Failure::NoSocket => "has an address family this host cannot use".into(),
        Failure::ErrorReply(code) => format!("answered with an error (RCODE {code})"),
        Failure::Local(kind) => format!("was not tried: out of local resources ({kind})"),
    }
}
