//! Leaving without a gap: what the fallback does between SIGTERM (LocalDNS is ready: its
//! ExecStartPost stops us) and exit, so that no query a pod sent is lost in the handoff.
//!
//! 1. [`hand_over`]: new flows go to LocalDNS's sockets in each SO_REUSEPORT group (our steering
//!    program now picks any member but us; see [`crate::listen`]). With LocalDNS not bound (a stop
//!    for another reason) flows stay with us and the drain below simply ends.
//! 2. Drain: keep serving what is already in our sockets' queues, our TCP accept queue, and the
//!    queries relayed upstream and not yet answered, until [`Drain`] says done: nothing was read
//!    for [`QUIET`] and nothing is in flight, or [`DRAIN_LIMIT`] passed.
//! 3. [`release`]: detach the steering program (LocalDNS's sockets share as before), close our
//!    sockets at once after it (between the two a new flow may still hash to us: microseconds),
//!    and remove the listener addresses we put on `lo`.
//!
//! The serving loops own the sockets; they call these in this order.

use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use crate::listen::Steering;

/// No datagram or connection for this long, and nothing in flight: the queues are empty. Flows
/// the kernel had already steered to us land within microseconds of the hand-over.
pub const QUIET: Duration = Duration::from_millis(50);
/// The drain's bound: LocalDNS serves already, and an upstream that has not answered in a second
/// is not going to beat the client's own retry to LocalDNS.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// One listener's sockets and their place in the groups.
pub struct ListenerFds<'a> {
    pub steering: &'a Steering,
    pub udp: BorrowedFd<'a>,
    pub tcp: BorrowedFd<'a>,
}

/// Step 1 for every listener. A failure is logged and the others still go on: a listener that
/// keeps its flows only costs its share of queries to the drain's bound.
pub fn hand_over(listeners: &[ListenerFds<'_>]) {
    for l in listeners {
        match l.steering.hand_over(l.udp, l.tcp) {
            Ok(()) => tracing::info!(addr = %l.steering.addr, "new flows go to LocalDNS"),
            Err(e) => tracing::warn!(addr = %l.steering.addr, error = %e, "cannot hand flows over"),
        }
    }
}

/// Step 3's first half: detach the steering programs. The caller closes the sockets right after.
pub fn release(listeners: &[ListenerFds<'_>]) {
    for l in listeners {
        if let Err(e) = l.steering.release(l.udp, l.tcp) {
            tracing::warn!(addr = %l.steering.addr, error = %e, "cannot detach the steering program");
        }
    }
}

/// Step 3's second half, after the sockets are closed: the listener addresses leave `lo`.
pub fn release_addresses(addrs: &[IpAddr]) {
    if let Err(e) = crate::link::release_from_loopback(addrs) {
        tracing::warn!("{e}");
    }
}

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
