//! responder: the synthetic upstream of the load tests.
//!
//! ```text
//! responder --listen IP:PORT [--listen IP:PORT]... [--threads N] [--delay-ms MS] [--ttl SECS]
//!           [--rcode NAME] [--fault-rcode NAME]
//! ```
//!
//! Answers every query at once: A and AAAA with one record derived from the name (10.x.y.z and
//! 2001:db8::10.x.y.z, see `dns::derived_a`, so the generator can check that an answer is this
//! upstream's answer for that name; TTL `--ttl`, default 300), other types NOERROR with no data;
//! responses and malformed packets are dropped. `--rcode REFUSED|SERVFAIL` answers every query
//! with that error instead; `--fault-rcode` starts normal and switches to that error on SIGUSR1
//! (the fault scenarios: a backend that starts refusing mid-run).
//!
//! It counts the queries it receives; `_stats.load.test. A`, asked directly, is answered with
//! that count as the address (big-endian u32) and is not counted itself: the harness's proof
//! that queries sent through a system really reached the upstream.
//! UDP: `--threads` sockets per address (default: one per CPU) sharing the port with
//! SO_REUSEPORT, each served by its own thread with `recvmmsg`/`sendmmsg` batches, answers built
//! in place in the receive buffer. TCP: a thread per connection, pipelined queries answered in
//! order. `--delay-ms` holds every answer back that long (the "slow backend" scenario). Runs until
//! killed.

use loadtest::dns;
use loadtest::net::{self, Batch};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Queries received (all threads, UDP and TCP), stats queries not included.
static QUERIES: AtomicU64 = AtomicU64::new(0);
/// The rcode answers get now, and the one SIGUSR1 switches to.
static RCODE_NOW: AtomicU8 = AtomicU8::new(dns::RCODE_NOERROR);
static RCODE_ON_SIGNAL: AtomicU8 = AtomicU8::new(dns::RCODE_NOERROR);

extern "C" fn on_usr1(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    RCODE_NOW.store(RCODE_ON_SIGNAL.load(Ordering::Relaxed), Ordering::Relaxed);
}

const BATCH: usize = 64;

struct Config {
    listen: Vec<SocketAddr>,
    threads: usize,
    delay: Duration,
    ttl: u32,
    rcode: u8,
    fault_rcode: Option<u8>,
}

fn rcode(name: &str, v: &str) -> Result<u8, String> {
    match v.to_ascii_uppercase().as_str() {
        "NOERROR" => Ok(dns::RCODE_NOERROR),
        "SERVFAIL" => Ok(dns::RCODE_SERVFAIL),
        "NXDOMAIN" => Ok(dns::RCODE_NXDOMAIN),
        "REFUSED" => Ok(dns::RCODE_REFUSED),
        _ => Err(format!(
            "bad value {v:?} for {name}: NOERROR, SERVFAIL, NXDOMAIN or REFUSED"
        )),
    }
}

fn parse() -> Result<Config, String> {
    fn num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
        v.parse().map_err(|_| format!("bad value {v:?} for {name}"))
    }
    let mut c = Config {
        listen: Vec::new(),
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        delay: Duration::ZERO,
        ttl: 300,
        rcode: dns::RCODE_NOERROR,
        fault_rcode: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--listen" => c.listen.push(num(&a, &v)?),
            "--threads" => c.threads = num::<usize>(&a, &v)?.max(1),
            "--delay-ms" => c.delay = Duration::from_millis(num(&a, &v)?),
            "--ttl" => c.ttl = num(&a, &v)?,
            "--rcode" => c.rcode = rcode(&a, &v)?,
            "--fault-rcode" => c.fault_rcode = Some(rcode(&a, &v)?),
            _ => return Err(format!("unknown option {a:?}")),
        }
    }
    if c.listen.is_empty() {
        return Err(
            "usage: responder --listen IP:PORT [--threads N] [--delay-ms MS] [--ttl SECS] [--rcode NAME] [--fault-rcode NAME]".into(),
        );
    }
    Ok(c)
}

fn main() -> ExitCode {
    let c = match parse() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("responder: {e}");
            return ExitCode::from(2);
        }
    };
    RCODE_NOW.store(c.rcode, Ordering::Relaxed);
    if let Some(f) = c.fault_rcode {
        RCODE_ON_SIGNAL.store(f, Ordering::Relaxed);
        // SAFETY: installs a handler that only stores an atomic.
        unsafe { libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t) };
    }
    let mut handles = Vec::new();
    for addr in &c.listen {
        for _ in 0..c.threads {
            let sock = match net::udp_bound(*addr, true, c.delay > Duration::ZERO) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("responder: cannot bind UDP {addr}: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let (delay, ttl) = (c.delay, c.ttl);
            handles.push(std::thread::spawn(move || {
                if delay.is_zero() {
                    serve_udp(sock, ttl)
                } else {
                    serve_udp_delayed(sock, ttl, delay)
                }
            }));
        }
        let listener = match TcpListener::bind(addr) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("responder: cannot bind TCP {addr}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let (delay, ttl) = (c.delay, c.ttl);
        handles.push(std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                std::thread::spawn(move || serve_tcp(conn, ttl, delay));
            }
        }));
    }
    eprintln!(
        "responder: serving {:?} with {} UDP threads each, delay {:?}",
        c.listen, c.threads, c.delay
    );
    for h in handles {
        let _ = h.join();
    }
    ExitCode::SUCCESS
}

/// Blocking loop: a batch in, answers built in place and copied to the outgoing batch, the
/// batch out (a partial send is retried from where it stopped; a failing one is dropped).
fn serve_udp(sock: OwnedFd, ttl: u32) {
    let fd = sock.as_raw_fd();
    let mut rx = Batch::new(BATCH);
    let mut tx = Batch::new(BATCH);
    loop {
        let n = match rx.recv(fd, libc::MSG_WAITFORONE) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("responder: recvmmsg: {e}");
                return;
            }
        };
        let mut out = 0;
        for i in 0..n {
            let len = rx.lens[i];
            if let Some(alen) = respond(rx.slot_mut(i), len, ttl) {
                let (msg, dst) = (&rx.slot_mut(i)[..alen], out);
                tx.slot_mut(dst)[..alen].copy_from_slice(msg);
                tx.lens[dst] = alen;
                let (addr, addr_len) = peer(&rx, i);
                tx.set_addr(dst, addr, addr_len);
                out += 1;
            }
        }
        let mut at = 0;
        while at < out {
            match tx.send(fd, at, out, true) {
                Ok(sent) if sent > 0 => at += sent,
                _ => break,
            }
        }
    }
}

/// Like `serve_udp`, but each answer waits `delay` in a queue (first in, first out: every answer
/// waits the same time).
fn serve_udp_delayed(sock: OwnedFd, ttl: u32, delay: Duration) {
    let fd = sock.as_raw_fd();
    let mut b = Batch::new(BATCH);
    let mut out = Batch::new(BATCH);
    let mut queue: VecDeque<(Instant, Vec<u8>, libc::sockaddr_storage, libc::socklen_t)> =
        VecDeque::new();
    loop {
        let timeout = queue.front().map_or(Duration::from_millis(100), |q| {
            q.0.saturating_duration_since(Instant::now())
        });
        let mut p = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        net::wait(&mut p, timeout.as_nanos() as u64);
        let n = b.recv(fd, libc::MSG_DONTWAIT).unwrap_or(0);
        let due = Instant::now() + delay;
        for i in 0..n {
            let len = b.lens[i];
            if let Some(alen) = respond(b.slot_mut(i), len, ttl) {
                let (addr, alen_addr) = peer(&b, i);
                queue.push_back((due, b.slot_mut(i)[..alen].to_vec(), addr, alen_addr));
            }
        }
        let now = Instant::now();
        let mut k = 0;
        while k < BATCH && queue.front().is_some_and(|q| q.0 <= now) {
            let (_, msg, addr, len) = queue.pop_front().expect("checked");
            out.slot_mut(k)[..msg.len()].copy_from_slice(&msg);
            out.lens[k] = msg.len();
            out.set_addr(k, addr, len);
            k += 1;
        }
        let _ = out.send(fd, 0, k, true);
    }
}

/// The answer to the query in `buf[..len]`, built in place (see the module's header); counts it.
fn respond(buf: &mut [u8], len: usize, ttl: u32) -> Option<usize> {
    let noerror = dns::Answer {
        ttl: 0,
        rcode: dns::RCODE_NOERROR,
    };
    if dns::question_is(&buf[..len], dns::STATS_WIRE) {
        let alen = dns::answer_in_place(buf, len, noerror)?;
        let n = QUERIES.load(Ordering::Relaxed).min(u64::from(u32::MAX)) as u32;
        buf[alen - 4..alen].copy_from_slice(&n.to_be_bytes());
        return Some(alen);
    }
    QUERIES.fetch_add(1, Ordering::Relaxed);
    let how = dns::Answer {
        ttl,
        rcode: RCODE_NOW.load(Ordering::Relaxed),
    };
    dns::answer_in_place(buf, len, how)
}

fn peer(b: &Batch, i: usize) -> (libc::sockaddr_storage, libc::socklen_t) {
    let len = if b.addrs[i].ss_family == libc::AF_INET as libc::sa_family_t {
        std::mem::size_of::<libc::sockaddr_in>()
    } else {
        std::mem::size_of::<libc::sockaddr_in6>()
    };
    (b.addrs[i], len as libc::socklen_t)
}

/// One TCP client: length-prefixed queries, answered in order as they arrive.
fn serve_tcp(mut conn: TcpStream, ttl: u32, delay: Duration) {
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut inbuf = Vec::with_capacity(4096);
    let mut chunk = vec![0u8; 16 * 1024];
    let mut out = Vec::with_capacity(4096);
    let mut msg = vec![0u8; 65_535 + 64];
    loop {
        let n = match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        inbuf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while inbuf.len() - at >= 2 {
            let len = u16::from_be_bytes([inbuf[at], inbuf[at + 1]]) as usize;
            if inbuf.len() - at - 2 < len {
                break;
            }
            msg[..len].copy_from_slice(&inbuf[at + 2..at + 2 + len]);
            if let Some(alen) = respond(&mut msg, len, ttl) {
                out.extend_from_slice(&(alen as u16).to_be_bytes());
                out.extend_from_slice(&msg[..alen]);
            }
            at += 2 + len;
        }
        inbuf.drain(..at);
        if !out.is_empty() {
            if !delay.is_zero() {
                std::thread::sleep(delay);
            }
            if conn.write_all(&out).is_err() {
                return;
            }
            out.clear();
        }
    }
}
