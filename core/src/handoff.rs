//! Leaving without a gap: what the fallback does between SIGTERM (LocalDNS is ready: its
//! ExecStartPost stops us) and exit, so that no query a pod sent is lost in the handoff.
//!
//! 1. Hand over (`listen::Held::hand_over`): new flows go to LocalDNS's sockets in each
//!    SO_REUSEPORT group (our steering program now picks any member but us). With LocalDNS not
//!    bound (a stop for another reason) flows stay with us, and we close at once as before.
//! 2. Drain: the relay threads keep serving what is already in the listener's queue and the
//!    queries relayed upstream and not yet answered, until [`Drain`] says done: nothing was read
//!    for [`QUIET`] and nothing is in flight, or [`DRAIN_LIMIT`] passed.
//! 3. Release (`listen::Held::release`): detach the steering program (LocalDNS's sockets share
//!    as before) and close our sockets at once after it (between the two a new flow may still
//!    hash to us: microseconds); then the listener addresses leave `lo`
//!    (`netlink::release_from_loopback`).
//!
//! This module is the pure part: when the drain is over.

use std::time::{Duration, Instant};

/// No datagram or connection for this long, and nothing in flight: the queues are empty. Flows
/// the kernel had already steered to us land within microseconds of the hand-over.
pub const QUIET: Duration = Duration::from_millis(50);
/// The drain's bound: LocalDNS serves already, and an upstream that has not answered in a second
/// is not going to beat the client's own retry to LocalDNS.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// When the drain is over. Pure: the loop reports what it saw and when.
#[derive(Debug, Clone, Copy)]
pub struct Drain {
    started: Instant,
    last_activity: Instant,
}

impl Drain {
    pub fn new(now: Instant) -> Drain {
        Drain {
            started: now,
            last_activity: now,
        }
    }

    /// The loop read a datagram, accepted a connection or got an upstream answer at `now`.
    pub fn activity(&mut self, now: Instant) {
        self.last_activity = now;
    }

    /// Whether to stop serving, given how many queries are still in flight at `now`.
    pub fn done(&self, now: Instant, in_flight: usize) -> bool {
        let quiet = now.saturating_duration_since(self.last_activity) >= QUIET;
        now.saturating_duration_since(self.started) >= DRAIN_LIMIT || (quiet && in_flight == 0)
    }

    /// How long the loop may sleep before it must look again (wait for I/O at most this long).
    pub fn next_look(&self, now: Instant) -> Duration {
        let quiet_at = self.last_activity + QUIET;
        let limit_at = self.started + DRAIN_LIMIT;
        quiet_at.min(limit_at).saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_ends_when_quiet_and_idle_or_at_its_limit() {
        let t0 = Instant::now();
        let mut d = Drain::new(t0);
        assert!(!d.done(t0, 0), "not before a quiet period");
        assert_eq!(d.next_look(t0), QUIET);
        assert!(d.done(t0 + QUIET, 0), "quiet and nothing in flight");
        assert!(!d.done(t0 + QUIET, 1), "an answer is still coming");
        d.activity(t0 + Duration::from_millis(40));
        assert!(
            !d.done(t0 + QUIET, 0),
            "a datagram came: quiet again from there"
        );
        assert!(d.done(t0 + Duration::from_millis(90), 0));
        // Busy to the end: the limit wins, in flight or not.
        let mut busy = Drain::new(t0);
        for ms in (0..1000).step_by(10) {
            busy.activity(t0 + Duration::from_millis(ms));
        }
        assert!(!busy.done(t0 + Duration::from_millis(999), 3));
        assert!(busy.done(t0 + DRAIN_LIMIT, 3));
        assert_eq!(busy.next_look(t0 + DRAIN_LIMIT), Duration::ZERO);
    }
}
