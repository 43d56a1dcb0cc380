//! Test tools run inside the systemd test containers, in one file of plain `std` Rust (the test
//! compiles it with rustc: the containers have no Python, and dnsmasq cannot share a port).
//!
//!   standin serve [--no-reuseport] [--delay-ms N] NAME=IP...
//!       The stand-in LocalDNS's CoreDNS: binds UDP and TCP port 53 on 169.254.10.10 and .11 at
//!       once (with SO_REUSEPORT, like CoreDNS, unless --no-reuseport), reads nothing for N ms
//!       (CoreDNS's start-up; default 1000), then answers A queries for the NAMEs with their IP
//!       (TTL 0; any other name NXDOMAIN) and sends READY=1 to $NOTIFY_SOCKET. Exits 1 when it
//!       cannot bind.
//!   standin probe OUT [--every-ms N] [--timeout-ms N] SERVER=NAME...
//!       The pods' view: every N ms (default 20) asks each SERVER for its NAME from a new socket
//!       (a new flow, as a pod's resolver makes), waits at most --timeout-ms (default 100), and
//!       appends `SENT_US DONE_US SERVER=NAME ANSWER` to OUT (CLOCK_MONOTONIC µs, ANSWER the first A
//!       record or `-`). Runs until OUT.stop exists.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, UdpSocket};
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

const LISTENERS: [Ipv4Addr; 2] = [Ipv4Addr::new(169, 254, 10, 10), Ipv4Addr::new(169, 254, 10, 11)];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("probe") => probe(&args[1..]),
        _ => {
            eprintln!("usage: standin serve|probe ...");
            std::process::exit(2);
        }
    }
}

// ---- the stand-in CoreDNS ----------------------------------------------------------------------

unsafe extern "C" {
    fn socket(domain: i32, ty: i32, protocol: i32) -> i32;
    fn setsockopt(fd: i32, level: i32, name: i32, value: *const i32, len: u32) -> i32;
    fn bind(fd: i32, addr: *const SockaddrIn, len: u32) -> i32;
    fn listen(fd: i32, backlog: i32) -> i32;
    fn close(fd: i32) -> i32;
}

#[repr(C)]
struct SockaddrIn {
    family: u16,
    port: u16,
    addr: [u8; 4],
    zero: [u8; 8],
}

const AF_INET: i32 = 2;
const SOCK_STREAM: i32 = 1;
const SOCK_DGRAM: i32 = 2;
const SOCK_CLOEXEC: i32 = 0o2000000;
const SOL_SOCKET: i32 = 1;
const SO_REUSEADDR: i32 = 2;
const SO_REUSEPORT: i32 = 15;

/// A socket bound to `addr`:53, with SO_REUSEPORT if asked; the OS error otherwise.
fn bound(addr: Ipv4Addr, ty: i32, reuseport: bool) -> std::io::Result<i32> {
    // SAFETY: plain syscalls on a descriptor this function owns; closed on every error path.
    unsafe {
        let fd = socket(AF_INET, ty | SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let one = 1i32;
        let mut rc = 0;
        if ty == SOCK_STREAM {
            rc |= setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, 4);
        }
        if reuseport {
            rc |= setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, 4);
        }
        let sa = SockaddrIn {
            family: AF_INET as u16,
            port: 53u16.to_be(),
            addr: addr.octets(),
            zero: [0; 8],
        };
        if rc != 0 || bind(fd, &sa, std::mem::size_of::<SockaddrIn>() as u32) != 0 {
            let e = std::io::Error::last_os_error();
            close(fd);
            return Err(e);
        }
        if ty == SOCK_STREAM && listen(fd, 128) != 0 {
            let e = std::io::Error::last_os_error();
            close(fd);
            return Err(e);
        }
        Ok(fd)
    }
}

fn serve(args: &[String]) {
    let mut reuseport = true;
    let mut delay = Duration::from_millis(1000);
    let mut records: Vec<(String, Ipv4Addr)> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--no-reuseport" => reuseport = false,
            "--delay-ms" => delay = Duration::from_millis(num(it.next())),
            rec => {
                let (name, ip) = rec.split_once('=').expect("NAME=IP");
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                records.push((name, ip.parse().expect("an IPv4 address")));
            }
        }
    }
    let records = std::sync::Arc::new(records);
    let mut udp = Vec::new();
    let mut tcp = Vec::new();
    for addr in LISTENERS {
        for (ty, out) in [(SOCK_DGRAM, &mut udp), (SOCK_STREAM, &mut tcp)] {
            match bound(addr, ty, reuseport) {
                Ok(fd) => out.push(fd),
                Err(e) => {
                    let proto = if ty == SOCK_DGRAM { "udp" } else { "tcp" };
                    eprintln!("stand-in CoreDNS: listen {proto} {addr}:53: bind: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
    eprintln!(
        "stand-in CoreDNS: bound {:?} udp+tcp (SO_REUSEPORT {}); serving in {delay:?}",
        LISTENERS,
        if reuseport { "on" } else { "off" }
    );
    std::thread::sleep(delay);
    let mut threads = Vec::new();
    for fd in udp {
        // SAFETY: `bound` returned an open UDP socket that nothing else owns.
        let socket = unsafe { UdpSocket::from_raw_fd(fd) };
        let records = records.clone();
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf) else { continue };
                if let Some(reply) = answer(&buf[..n], &records) {
                    let _ = socket.send_to(&reply, from);
                }
            }
        }));
    }
    for fd in tcp {
        // SAFETY: `bound` returned an open listening TCP socket that nothing else owns.
        let listener = unsafe { TcpListener::from_raw_fd(fd) };
        let records = records.clone();
        threads.push(std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let records = records.clone();
                std::thread::spawn(move || {
                    let mut conn = conn;
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut len = [0u8; 2];
                    while conn.read_exact(&mut len).is_ok() {
                        let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                        if conn.read_exact(&mut q).is_err() {
                            return;
                        }
                        let Some(reply) = answer(&q, &records) else { return };
                        let mut out = (reply.len() as u16).to_be_bytes().to_vec();
                        out.extend_from_slice(&reply);
                        if conn.write_all(&out).is_err() {
                            return;
                        }
                    }
                });
            }
        }));
    }
    notify("READY=1\nSTATUS=serving 169.254.10.10 and 169.254.10.11");
    eprintln!("stand-in CoreDNS: serving");
    for t in threads {
        let _ = t.join();
    }
}

fn notify(state: &str) {
    let Ok(path) = std::env::var("NOTIFY_SOCKET") else { return };
    let socket = std::os::unix::net::UnixDatagram::unbound().expect("a unix socket");
    let sent = if let Some(name) = path.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|a| socket.send_to_addr(state.as_bytes(), &a))
    } else {
        socket.send_to(state.as_bytes(), &path)
    };
    if let Err(e) = sent {
        eprintln!("stand-in CoreDNS: sd_notify: {e}");
    }
}

/// The question's name, lower case, without the final dot, and where the question ends.
fn question(q: &[u8]) -> Option<(String, usize)> {
    if q.len() < 12 || u16::from_be_bytes([q[4], q[5]]) != 1 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = *q.get(at)? as usize;
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    (q.len() >= at + 4).then(|| (labels.join("."), at + 4))
}

fn answer(q: &[u8], records: &[(String, Ipv4Addr)]) -> Option<Vec<u8>> {
    let (name, end) = question(q)?;
    let qtype = u16::from_be_bytes([q[end - 4], q[end - 3]]);
    let hit = records.iter().find(|(n, _)| *n == name).map(|(_, ip)| *ip);
    let mut r = q[..end].to_vec();
    r[2] = 0x80 | (q[2] & 0x01) | 0x04; // QR, RD copied, AA
    r[3] = 0x80 | if hit.is_some() { 0 } else { 3 }; // RA; NOERROR or NXDOMAIN
    r[6..12].copy_from_slice(&[0, 0, 0, 0, 0, 0]);
    if let (Some(ip), 1) = (hit, qtype) {
        r[7] = 1;
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        r.extend_from_slice(&ip.octets());
    }
    Some(r)
}

// ---- the prober ---------------------------------------------------------------------------------

fn probe(args: &[String]) {
    let out_path = args.first().expect("OUT").clone();
    let mut every = Duration::from_millis(20);
    let mut timeout = Duration::from_millis(100);
    let mut targets: Vec<(Ipv4Addr, String)> = Vec::new();
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--every-ms" => every = Duration::from_millis(num(it.next())),
            "--timeout-ms" => timeout = Duration::from_millis(num(it.next())),
            t => {
                let (server, name) = t.split_once('=').expect("SERVER=NAME");
                targets.push((server.parse().expect("an IPv4 server"), name.to_owned()));
            }
        }
    }
    let stop = format!("{out_path}.stop");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let writer = std::thread::spawn(move || {
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&out_path)
            .expect("the probe output file");
        for line in rx {
            let _ = out.write_all(line.as_bytes());
        }
    });
    let mut next = Instant::now();
    let mut id: u16 = 1;
    while std::fs::metadata(&stop).is_err() {
        for (server, name) in &targets {
            let (server, name, tx) = (*server, name.clone(), tx.clone());
            id = id.wrapping_add(1);
            let qid = id;
            std::thread::spawn(move || {
                let sent = mono_us();
                let got = ask(server, &name, qid, timeout);
                let _ = tx.send(format!(
                    "{sent} {} {server}={name} {}\n",
                    mono_us(),
                    got.map(|a| a.to_string()).unwrap_or_else(|| "-".into())
                ));
            });
        }
        next += every;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    // Let the last exchanges finish (each is bounded by the timeout), then flush.
    std::thread::sleep(timeout + Duration::from_millis(50));
    drop(tx);
    let _ = writer.join();
}

/// One A query from a fresh socket; the first A record of a matching reply, if any in time.
fn ask(server: Ipv4Addr, name: &str, id: u16, timeout: Duration) -> Option<Ipv4Addr> {
    let socket = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    socket.connect(SocketAddr::from((server, 53))).ok()?;
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    socket.send(&q).ok()?;
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        socket.set_read_timeout(Some(left.max(Duration::from_micros(100)))).ok()?;
        // A refusal (nobody bound: ICMP port unreachable) ends the exchange at once.
        let n = socket.recv(&mut buf).ok()?;
        let r = &buf[..n];
        if n < 12 || r[..2] != id.to_be_bytes() || r[2] & 0x80 == 0 {
            continue;
        }
        return first_a(r);
    }
}

fn first_a(r: &[u8]) -> Option<Ipv4Addr> {
    let (_, mut at) = question(r)?;
    let answers = u16::from_be_bytes([r[6], r[7]]);
    for _ in 0..answers {
        // Name: a pointer or labels.
        loop {
            let b = *r.get(at)?;
            if b & 0xc0 == 0xc0 {
                at += 2;
                break;
            }
            at += 1 + b as usize;
            if b == 0 {
                break;
            }
        }
        let ty = u16::from_be_bytes([*r.get(at)?, *r.get(at + 1)?]);
        let len = u16::from_be_bytes([*r.get(at + 8)?, *r.get(at + 9)?]) as usize;
        at += 10;
        if ty == 1 && len == 4 {
            let o = r.get(at..at + 4)?;
            return Some(Ipv4Addr::new(o[0], o[1], o[2], o[3]));
        }
        at += len;
    }
    None
}

fn mono_us() -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime only writes the struct we pass (CLOCK_MONOTONIC = 1).
    unsafe { clock_gettime(1, &mut ts) };
    ts.sec as u64 * 1_000_000 + ts.nsec as u64 / 1000
}

fn num(v: Option<&String>) -> u64 {
    v.and_then(|v| v.parse().ok()).expect("a number")
}
