//! The TCP engine: one thread, `channels` connections, each carrying many queries at once
//! (pipelining, RFC 7766) with 2-byte length framing. Replies are timestamped when read (TCP has
//! no per-message kernel timestamp). A connection the server closes is reopened (at most every
//! 100 ms); its queries in flight then time out and count as lost.

use crate::net;
use crate::now_ns;
use crate::outcome::{RunSpec, Schedule, TransportStats};
use crate::pace::Pacer;
use crate::track::Tracker;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

const SWEEP_NS: u64 = 2_000_000;
const RECONNECT_NS: u64 = 100_000_000;
const MAX_SEND_PER_TURN: u64 = 512;

struct Conn {
    fd: Option<OwnedFd>,
    connected: bool,
    out: Vec<u8>,
    out_at: usize,
    inbuf: Vec<u8>,
    last_attempt: u64,
}

impl Conn {
    fn open(&mut self, spec: &RunSpec, now: u64, stats: &mut TransportStats, first: bool) {
        self.last_attempt = now;
        self.out.clear();
        self.out_at = 0;
        self.inbuf.clear();
        self.connected = false;
        match net::tcp_connect_start(spec.server) {
            Ok(fd) => {
                self.fd = Some(fd);
                if !first {
                    stats.reconnects += 1;
                }
            }
            Err(_) => {
                self.fd = None;
                stats.refused += 1;
            }
        }
    }

    fn close(&mut self) {
        self.fd = None;
        self.connected = false;
    }

    /// Writes what is pending; false when the connection broke.
    fn flush(&mut self) -> bool {
        let Some(fd) = &self.fd else { return false };
        while self.out_at < self.out.len() {
            let rest = &self.out[self.out_at..];
            // SAFETY: writes from a buffer we own.
            let r = unsafe {
                libc::send(
                    fd.as_raw_fd(),
                    rest.as_ptr() as *const libc::c_void,
                    rest.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error().raw_os_error();
                return matches!(e, Some(libc::EAGAIN) | Some(libc::EINTR));
            }
            self.out_at += r as usize;
        }
        self.out.clear();
        self.out_at = 0;
        true
    }
}

pub fn run(
    spec: &RunSpec,
    tracker: &mut Tracker,
    pacer: &mut Pacer,
    sched: &mut Schedule,
) -> io::Result<TransportStats> {
    let mut stats = TransportStats::default();
    let now = now_ns();
    let mut conns: Vec<Conn> = (0..spec.channels)
        .map(|_| Conn {
            fd: None,
            connected: false,
            out: Vec::new(),
            out_at: 0,
            inbuf: Vec::new(),
            last_attempt: 0,
        })
        .collect();
    for c in &mut conns {
        c.open(spec, now, &mut stats, true);
    }
    let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(conns.len());
    let mut readbuf = vec![0u8; 64 * 1024];
    let mut qbuf = [0u8; 512];
    let mut next_conn = 0;
    let mut last_sweep = 0;
    loop {
        let now = now_ns();
        sched.tick(now);
        let mut busy = false;

        for (ch, c) in conns.iter_mut().enumerate() {
            let Some(fd) = &c.fd else {
                if now.saturating_sub(c.last_attempt) >= RECONNECT_NS && sched.sending(now) {
                    c.open(spec, now, &mut stats, false);
                }
                continue;
            };
            let raw = fd.as_raw_fd();
            if !c.connected {
                let mut p = [libc::pollfd {
                    fd: raw,
                    events: libc::POLLOUT,
                    revents: 0,
                }];
                if net::wait(&mut p, 0) == 0 {
                    continue;
                }
                if net::socket_error(raw).is_some() {
                    stats.refused += 1;
                    c.close();
                    continue;
                }
                c.connected = true;
            }
            loop {
                // SAFETY: reads into a buffer we own.
                let r = unsafe {
                    libc::recv(
                        raw,
                        readbuf.as_mut_ptr() as *mut libc::c_void,
                        readbuf.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if r == 0 {
                    stats.closed_by_server += 1;
                    c.close();
                    break;
                }
                if r < 0 {
                    let e = io::Error::last_os_error().raw_os_error();
                    if !matches!(e, Some(libc::EAGAIN) | Some(libc::EINTR)) {
                        stats.closed_by_server += 1;
                        c.close();
                    }
                    break;
                }
                busy = true;
                c.inbuf.extend_from_slice(&readbuf[..r as usize]);
                let ts = now_ns();
                let mut at = 0;
                while c.inbuf.len() - at >= 2 {
                    let len = u16::from_be_bytes([c.inbuf[at], c.inbuf[at + 1]]) as usize;
                    if c.inbuf.len() - at - 2 < len {
                        break;
                    }
                    tracker.on_reply(ch, &c.inbuf[at + 2..at + 2 + len], ts);
                    at += 2 + len;
                }
                c.inbuf.drain(..at);
            }
        }

        let now = now_ns();
        if sched.sending(now) {
            let mut want = pacer.due(now, tracker.inflight()).min(MAX_SEND_PER_TURN);
            let mut tries = 0;
            // Spread over the open connections, a few queries each per turn.
            let per = (want / conns.len() as u64).max(1);
            while want > 0 && tries < conns.len() {
                let ch = next_conn;
                next_conn = (next_conn + 1) % conns.len();
                let c = &mut conns[ch];
                if !c.connected || c.fd.is_none() {
                    tries += 1;
                    continue;
                }
                let mut n = 0;
                while n < per.min(want) {
                    let Some(len) = tracker.prepare(ch, now, &mut qbuf) else {
                        break;
                    };
                    c.out.extend_from_slice(&(len as u16).to_be_bytes());
                    c.out.extend_from_slice(&qbuf[..len]);
                    n += 1;
                }
                if n == 0 {
                    tries += 1;
                    continue;
                }
                pacer.sent(n);
                want -= n;
                busy = true;
                if !c.flush() {
                    stats.closed_by_server += 1;
                    c.close();
                }
            }
        }
        for c in &mut conns {
            if c.out_at < c.out.len() && !c.flush() {
                c.close();
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
            pfds.clear();
            for c in &conns {
                if let Some(fd) = &c.fd {
                    let mut events = libc::POLLIN;
                    if !c.connected || c.out_at < c.out.len() {
                        events |= libc::POLLOUT;
                    }
                    pfds.push(libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events,
                        revents: 0,
                    });
                }
            }
            if timeout > 0 {
                net::wait(&mut pfds, timeout);
            }
        }
    }
    tracker.sweep(u64::MAX);
    Ok(stats)
}
