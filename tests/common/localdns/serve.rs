//! The stand-in LocalDNS's serving, in plain `std` (no crate, no test kit): one copy, compiled
//! into the stand-in program (`tests/systemd/standin.rs`: the stand-in as a process of its own,
//! in a namespace or inside a systemd container) and, for its binding, into the test kit.
//!
//! It binds as CoreDNS binds (SO_REUSEPORT on every socket) and answers A queries for its
//! records with their address (TTL 0, authoritative) and every other name NXDOMAIN; with no
//! records, every name NOERROR with no record (the fallback's answers carry one: a reply says
//! who gave it). Hung, it answers nothing and its queues fill, as a deadlocked CoreDNS's do.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// LocalDNS's two listener addresses (port 53).
pub const LISTENERS: [Ipv4Addr; 2] = [
    Ipv4Addr::new(169, 254, 10, 10),
    Ipv4Addr::new(169, 254, 10, 11),
];

/// The name LocalDNS's probes (and the fallback's) ask, lower case, without the final dot.
pub const HEALTH_CHECK: &str = "health-check.localdns.local";

/// How often a hung loop looks whether it may answer again.
const TICK: Duration = Duration::from_millis(5);

/// What every serving thread of one stand-in shares.
#[derive(Default)]
pub struct Serving {
    /// Names and the address each is answered with.
    pub records: Vec<(String, Ipv4Addr)>,
    /// CPU spent on each answer besides the socket calls (knot spends several times what this
    /// stand-in does, which matters under a CPU quota).
    pub cost: Duration,
    /// Answers nothing while set: each UDP loop holds what it read last and reads no more.
    pub hung: AtomicBool,
    /// Probe questions answered (`health-check.localdns.local`), on any listener.
    pub probes: AtomicUsize,
    /// Queries for any other name answered, on any listener.
    pub others: AtomicUsize,
    /// Print `probe` on stdout for each probe answered, and `other NAME` for the first other
    /// query (the stand-in program's report to the test that runs it).
    pub report_probes: bool,
}

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

/// A socket of type `ty` bound to `addr` (and listening, for TCP), with SO_REUSEPORT if asked.
fn bound(addr: SocketAddrV4, ty: i32, reuseport: bool, backlog: i32) -> std::io::Result<i32> {
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
            port: addr.port().to_be(),
            addr: addr.ip().octets(),
            zero: [0; 8],
        };
        if rc != 0 || bind(fd, &sa, std::mem::size_of::<SockaddrIn>() as u32) != 0 {
            let e = std::io::Error::last_os_error();
            close(fd);
            return Err(e);
        }
        if ty == SOCK_STREAM && listen(fd, backlog) != 0 {
            let e = std::io::Error::last_os_error();
            close(fd);
            return Err(e);
        }
        Ok(fd)
    }
}

/// UDP and TCP sockets on `addr` as CoreDNS binds its listeners (SO_REUSEPORT, unless not
/// `reuseport`), in the namespace the calling thread is in; blocking, as the socket calls make
/// them.
pub fn bind_listener(
    addr: SocketAddrV4,
    reuseport: bool,
    backlog: i32,
) -> std::io::Result<(UdpSocket, TcpListener)> {
    let udp = bound(addr, SOCK_DGRAM, reuseport, backlog)?;
    // SAFETY: `bound` returned an open socket that nothing else owns.
    let udp = unsafe { UdpSocket::from_raw_fd(udp) };
    let tcp = bound(addr, SOCK_STREAM, reuseport, backlog)?;
    // SAFETY: as above.
    let tcp = unsafe { TcpListener::from_raw_fd(tcp) };
    Ok((udp, tcp))
}

/// The inode of a socket, as sock_diag names it.
pub fn inode(socket: &impl AsRawFd) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/self/fd/{}", socket.as_raw_fd()))
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// Answers UDP queries on `socket` for as long as the process lives.
pub fn serve_udp(socket: UdpSocket, serving: Arc<Serving>) {
    let mut buf = [0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        while serving.hung.load(Ordering::Relaxed) {
            std::thread::sleep(TICK);
        }
        if let Some(reply) = answer(&buf[..n], &serving) {
            let _ = socket.send_to(&reply, from);
        }
    }
}

/// Accepts TCP connections on `listener` for as long as the process lives and answers each
/// one's queries (2-byte length framing) on a thread of its own. (The tests in namespaces ask
/// the stand-in over UDP only: there its TCP listeners are bound and never accepted.)
pub fn serve_tcp(listener: TcpListener, serving: Arc<Serving>) {
    for conn in listener.incoming().flatten() {
        let serving = serving.clone();
        std::thread::spawn(move || serve_tcp_conn(conn, &serving));
    }
}

fn serve_tcp_conn(mut conn: TcpStream, serving: &Serving) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut len = [0u8; 2];
    while conn.read_exact(&mut len).is_ok() {
        let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
        if conn.read_exact(&mut q).is_err() {
            return;
        }
        let Some(reply) = answer(&q, serving) else {
            return;
        };
        let mut out = (reply.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&reply);
        if conn.write_all(&out).is_err() {
            return;
        }
    }
}

/// The question's name, lower case, without the final dot, and where the question ends.
pub fn question(q: &[u8]) -> Option<(String, usize)> {
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

/// The reply to query `q` (header and question, and the A record of a name in the records), or
/// None for what is not a query of one question.
fn answer(q: &[u8], serving: &Serving) -> Option<Vec<u8>> {
    if q.len() < 12 || q[2] & 0x80 != 0 {
        return None;
    }
    let (name, end) = question(q)?;
    let spent = Instant::now();
    while spent.elapsed() < serving.cost {}
    if name == HEALTH_CHECK {
        serving.probes.fetch_add(1, Ordering::Relaxed);
        if serving.report_probes {
            println!("probe");
        }
    } else if serving.others.fetch_add(1, Ordering::Relaxed) == 0 && serving.report_probes {
        println!("other {name}");
    }
    let qtype = u16::from_be_bytes([q[end - 4], q[end - 3]]);
    let hit = serving
        .records
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, ip)| *ip);
    let mut r = q[..end].to_vec();
    r[2] = 0x80 | (q[2] & 0x01) | 0x04; // QR, RD copied, AA
    let rcode = match (hit, serving.records.is_empty()) {
        (None, false) => 3, // NXDOMAIN
        _ => 0,
    };
    r[3] = 0x80 | rcode; // RA
    r[6..12].copy_from_slice(&[0, 0, 0, 0, 0, 0]);
    if let (Some(ip), 1) = (hit, qtype) {
        r[7] = 1;
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        r.extend_from_slice(&ip.octets());
    }
    Some(r)
}
