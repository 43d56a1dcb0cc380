//! Talking to systemd: readiness, status, watchdog and stopping notifications (sd_notify), done by
//! hand on the `NOTIFY_SOCKET` datagram socket. Outside systemd every call is a no-op.

use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub struct Notifier {
    socket: Option<(UnixDatagram, std::os::unix::net::SocketAddr)>,
}

impl Notifier {
    pub fn from_env() -> Notifier {
        let socket = std::env::var("NOTIFY_SOCKET").ok().and_then(|path| {
            let addr = if let Some(abstract_name) = path.strip_prefix('@') {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(abstract_name).ok()?
            } else {
                std::os::unix::net::SocketAddr::from_pathname(&path).ok()?
            };
            Some((UnixDatagram::unbound().ok()?, addr))
        });
        Notifier { socket }
    }

    /// Sends `state` (e.g. `READY=1`); failures are logged at debug level and otherwise ignored:
    /// serving DNS matters more than telling systemd about it.
    pub fn notify(&self, state: &str) {
        if let Some((socket, addr)) = &self.socket {
            if let Err(e) = socket.send_to_addr(state.as_bytes(), addr) {
                tracing::debug!(error = %e, state, "sd_notify failed");
            }
        }
    }

    /// The watchdog timeout systemd expects pings within, if it asked for pings from this process.
    pub fn watchdog_timeout() -> Option<Duration> {
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
        if let Ok(pid) = std::env::var("WATCHDOG_PID") {
            if pid.parse::<u32>().ok()? != std::process::id() {
                return None;
            }
        }
        (usec > 0).then(|| Duration::from_micros(usec))
    }
}

/// When each serving loop last went round. The watchdog is pinged only while every loop is alive,
/// so a wedged relay gets the process killed and restarted rather than kept.
#[derive(Debug)]
pub struct Heartbeats {
    epoch: Instant,
    beats: Vec<AtomicU64>,
}

impl Heartbeats {
    pub fn new(loops: usize) -> Arc<Heartbeats> {
        Arc::new(Heartbeats {
            epoch: Instant::now(),
            beats: (0..loops).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    pub fn beat(&self, index: usize) {
        self.beats[index].store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Has every loop gone round within `within`?
    pub fn all_within(&self, within: Duration) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let limit = within.as_millis() as u64;
        self.beats
            .iter()
            .all(|b| now.saturating_sub(b.load(Ordering::Relaxed)) <= limit)
    }
}

/// How often to ping a watchdog of `timeout`, and how recent every loop's beat must be for a
/// ping. Pings come at a quarter of the timeout, so one late ping never gets us killed; a loop
/// counts as stalled once it has not beaten for half the timeout (idle loops beat every 500 ms).
/// A wedged forwarder is thus killed at most 1.5 timeouts after it wedged (a whole process that
/// stopped: 1.25), which with the unit's WatchdogSec=2s keeps pods' dark time under 3 s.
pub fn watchdog_plan(timeout: Duration) -> (Duration, Duration) {
    (timeout / 4, timeout / 2)
}

/// Pings the watchdog while the serving loops are alive (see [`watchdog_plan`]).
pub async fn watchdog(notifier: Arc<Notifier>, heartbeats: Arc<Heartbeats>, timeout: Duration) {
    let (every, stale_after) = watchdog_plan(timeout);
    let mut ticker = tokio::time::interval(every);
    loop {
        ticker.tick().await;
        if heartbeats.all_within(stale_after) {
            notifier.notify("WATCHDOG=1");
        } else {
            tracing::error!("a serving loop has stalled; not pinging the watchdog");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_tell_a_stalled_loop() {
        let h = Heartbeats::new(2);
        h.beat(0);
        h.beat(1);
        assert!(h.all_within(Duration::from_secs(1)));
        std::thread::sleep(Duration::from_millis(30));
        h.beat(0);
        assert!(!h.all_within(Duration::from_millis(10)), "loop 1 is late");
    }

    #[test]
    fn the_watchdog_is_pinged_often_enough_and_a_stall_is_seen_in_time() {
        let timeout = Duration::from_secs(2);
        let (every, stale_after) = watchdog_plan(timeout);
        // Two pings fit in a timeout even if one is late; an idle loop (500 ms beats) is alive.
        assert!(every * 2 < timeout && stale_after > Duration::from_millis(500));
        // Worst case from a stall to the kill: stale_after + the next ping slot + the timeout.
        assert!(stale_after + every + timeout <= Duration::from_millis(3500));
    }

    #[test]
    fn notifications_reach_the_socket() {
        let dir = std::env::temp_dir().join(format!("lf-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        let addr = std::os::unix::net::SocketAddr::from_pathname(&path).unwrap();
        let n = Notifier {
            socket: Some((UnixDatagram::unbound().unwrap(), addr)),
        };
        n.notify("READY=1");
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
        std::fs::remove_dir_all(&dir).unwrap();
        Notifier { socket: None }.notify("READY=1");
    }
}
