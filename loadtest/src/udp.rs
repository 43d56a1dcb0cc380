//! The UDP engine: one thread, `channels` connected non-blocking sockets. Each turn of the loop
//! drains every socket with `recvmmsg` (replies carry the kernel's receive timestamp, so a busy
//! generator does not inflate the latency it reports), sends what the pacer asks for with one
//! `sendmmsg` per socket in rotation, and sleeps in `ppoll` only when there is nothing to do.

use crate::net::{self, Batch};
use crate::now_ns;
use crate::outcome::{RunSpec, Schedule, TransportStats};
use crate::pace::Pacer;
use crate::track::Tracker;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// Datagrams per system call.
const BATCH: usize = 64;
/// At most this many queries per turn, so receiving is never starved by a backlog.
const MAX_SEND_PER_TURN: u64 = 512;
/// Timeouts are looked for this often.
const SWEEP_NS: u64 = 2_000_000;

/// Opens the sockets (before the clock starts: a 4 MiB buffer each takes a moment).
pub fn open(spec: &RunSpec) -> io::Result<Vec<OwnedFd>> {
    (0..spec.channels)
        .map(|_| net::udp_client(spec.server))
        .collect()
}

pub fn run(
    socks: Vec<OwnedFd>,
    tracker: &mut Tracker,
    pacer: &mut Pacer,
    sched: &mut Schedule,
) -> io::Result<TransportStats> {
    let mut pfds: Vec<libc::pollfd> = socks
        .iter()
        .map(|s| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let mut rx = Batch::new(BATCH);
    let mut tx = Batch::new(BATCH);
    let mut stats = TransportStats::default();
    let mut next_sock = 0;
    let mut last_sweep = 0;
    loop {
        let now = now_ns();
        sched.tick(now);
        let mut busy = false;

        for (ch, s) in socks.iter().enumerate() {
            loop {
                let n = match rx.recv(s.as_raw_fd(), libc::MSG_DONTWAIT) {
                    Ok(n) => n,
                    Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                        stats.refused += 1;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if n == 0 {
                    break;
                }
                busy = true;
                let fallback = now_ns();
                for i in 0..n {
                    let ts = if rx.stamps[i] != 0 {
                        rx.stamps[i]
                    } else {
                        fallback
                    };
                    tracker.on_reply(ch, rx.buf(i), ts);
                }
                if n < BATCH {
                    break;
                }
            }
        }

        let now = now_ns();
        if sched.sending(now) {
            let mut want = pacer.due(now, tracker.inflight()).min(MAX_SEND_PER_TURN);
            let mut tries = 0;
            while want > 0 && tries < socks.len() {
                let ch = next_sock;
                next_sock = (next_sock + 1) % socks.len();
                let k = (want as usize).min(BATCH);
                let mut built = 0;
                while built < k {
                    match tracker.prepare(ch, now, tx.slot_mut(built)) {
                        Some(len) => {
                            tx.lens[built] = len;
                            built += 1;
                        }
                        None => break,
                    }
                }
                let sent = match tx.send(socks[ch].as_raw_fd(), 0, built, false) {
                    Ok(n) => n,
                    Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                        stats.refused += 1;
                        0
                    }
                    Err(e) => return Err(e),
                };
                if sent < built {
                    tracker.rollback(ch, built - sent);
                }
                pacer.sent(sent as u64);
                want -= sent as u64;
                if sent == 0 {
                    tries += 1;
                } else {
                    busy = true;
                }
            }
        }

        if now.saturating_sub(last_sweep) >= SWEEP_NS {
            tracker.sweep(now);
            last_sweep = now;
        }
        if !sched.sending(now) && (tracker.inflight() == 0 || now >= sched.drain_end_ns) {
            break;
        }
        if !busy {
            let mut timeout = sched.until_next_ns(now).min(SWEEP_NS);
            if sched.sending(now)
                && let Some(t) = pacer.until_next_ns(now)
            {
                timeout = timeout.min(t);
            }
            if timeout > 0 {
                net::wait(&mut pfds, timeout);
            }
        }
    }
    tracker.sweep(u64::MAX);
    Ok(stats)
}
