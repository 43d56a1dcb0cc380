//! Helpers for the hostile-input tests (`tests/hostile.rs`): hand-made malformed DNS bytes, raw
//! TCP clients that misbehave, a look at the forwarder's sockets and memory through /proc, and a
//! flood of forged upstream replies sent with a spoofed source address.
//!
//! Network rule: the flood sends only inside the test's own namespaces, every raw client only to
//! loopback or inside them.

use super::netns::{Netns, Place};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::collections::HashSet;
use std::io::{ErrorKind, Read};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// A DNS header with the given ID, flags and section counts.
pub fn dns_header(id: u16, flags: u16, counts: [u16; 4]) -> Vec<u8> {
    let mut h = Vec::with_capacity(12);
    h.extend_from_slice(&id.to_be_bytes());
    h.extend_from_slice(&flags.to_be_bytes());
    for c in counts {
        h.extend_from_slice(&c.to_be_bytes());
    }
    h
}

/// Flags of a plain recursive query (RD).
pub const QUERY_FLAGS: u16 = 0x0100;

/// `name` as uncompressed wire labels, exactly as given (no case change, no length checks, so a
/// test can write labels and names that are too long).
pub fn wire_labels(labels: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in labels {
        out.push(u8::try_from(l.len()).expect("a label length fits a byte"));
        out.extend_from_slice(l);
    }
    out.push(0);
    out
}

/// A question: the name bytes as given, then QTYPE and QCLASS IN.
pub fn question(name: &[u8], qtype: u16) -> Vec<u8> {
    let mut q = name.to_vec();
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

/// An OPT record (root owner) advertising `udp_size`, with no options.
pub fn opt_record(udp_size: u16) -> Vec<u8> {
    let mut r = vec![0, 0, 41];
    r.extend_from_slice(&udp_size.to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    r
}

/// Header fields of a reply, read straight from the bytes (the reply may not parse otherwise).
#[derive(Debug, PartialEq, Eq)]
pub struct RawHeader {
    pub id: u16,
    pub qr: bool,
    pub tc: bool,
    pub rcode: u8,
    pub counts: [u16; 4],
}

pub fn raw_header(p: &[u8]) -> Option<RawHeader> {
    if p.len() < 12 {
        return None;
    }
    let at = |i: usize| u16::from_be_bytes([p[i], p[i + 1]]);
    Some(RawHeader {
        id: at(0),
        qr: p[2] & 0x80 != 0,
        tc: p[2] & 0x02 != 0,
        rcode: p[3] & 0x0f,
        counts: [at(4), at(6), at(8), at(10)],
    })
}

/// A TCP connection opened from `at` (the socket stays in that place's namespace).
pub fn tcp_connect(at: impl Into<Place>, to: SocketAddr, timeout: Duration) -> Option<TcpStream> {
    at.into()
        .enter(|| TcpStream::connect_timeout(&to, timeout).ok())
}

/// Has the peer closed `stream`? Reads without waiting; data the peer sent is discarded.
/// True on end of stream or a reset, false while it stays open.
pub fn tcp_peer_closed(stream: &TcpStream) -> bool {
    let mut reader = stream;
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut buf = [0u8; 512];
    let closed = loop {
        match reader.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break true,
        }
    };
    let _ = stream.set_nonblocking(false);
    closed
}

/// Waits up to `limit` for the peer to close `stream`; how long that took, from `since`.
pub fn tcp_wait_closed(
    stream: &mut TcpStream,
    since: Instant,
    limit: Duration,
) -> Option<Duration> {
    let deadline = since + limit;
    let mut buf = [0u8; 512];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        let _ = stream.set_read_timeout(Some((deadline - now).min(Duration::from_millis(50))));
        match stream.read(&mut buf) {
            Ok(0) => return Some(since.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Some(since.elapsed()),
        }
    }
}

/// Raises this process's open-file limit to at least `n` (the test opens thousands of sockets).
/// Uses util-linux `prlimit` on our own pid: this crate does not enable nix's `resource` feature.
pub fn raise_fd_limit(n: u64) {
    let current = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    if current >= n {
        return;
    }
    let out = Command::new("prlimit")
        .arg(format!("--pid={}", std::process::id()))
        .arg(format!("--nofile={n}:{n}"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run prlimit: {e}"));
    assert!(
        out.status.success(),
        "prlimit --nofile={n} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The forwarder's resident memory in KiB (`VmRSS` of /proc/<pid>/status).
pub fn vm_rss_kib(pid: u32) -> u64 {
    proc_status_kib(pid, "VmRSS:")
}

/// The most resident memory the process has had so far, in KiB (`VmHWM`, the high-water mark).
pub fn vm_hwm_kib(pid: u32) -> u64 {
    proc_status_kib(pid, "VmHWM:")
}

fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Socket inodes of the process's open files (`/proc/<pid>/fd/* -> socket:[inode]`).
fn socket_inodes(pid: u32) -> HashSet<u64> {
    let dir = format!("/proc/{pid}/fd");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {dir}: {e}"))
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|target| {
            target
                .to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// The local ports of the forwarder's own IPv4 UDP sockets other than the listeners (port 53):
/// the random source ports its upstream queries leave from, which an off-path spoofer has to hit.
/// Read from `/proc/<pid>/net/udp` (the sockets of its namespace), keeping those whose inode is
/// one of the process's open files.
pub fn upstream_source_ports(pid: u32) -> Vec<u16> {
    let mine = socket_inodes(pid);
    let path = format!("/proc/{pid}/net/udp");
    let table =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    let mut ports: Vec<u16> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
            let inode: u64 = f.get(9)?.parse().ok()?;
            (mine.contains(&inode) && port != 53).then_some(port)
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// What a flood of unsolicited replies should look like.
pub struct FloodPlan {
    /// The address the replies claim to come from (the real upstream's IP and port 53).
    pub spoofed_source: SocketAddrV4,
    /// Where the forwarder's upstream sockets are (its address on the upstream link).
    pub target_ip: Ipv4Addr,
    /// The forwarder's upstream-facing source ports.
    pub ports: Vec<u16>,
    /// A well-formed reply to the question the victim's queries ask, carrying a forged answer;
    /// its ID is replaced for every datagram (ID guessing).
    pub forged_reply: Vec<u8>,
    /// How many datagrams to send at most, and over about how long.
    pub datagrams: usize,
    pub duration: Duration,
}

/// What the flood managed to send.
#[derive(Debug, Default, Clone, Copy)]
pub struct FloodReport {
    pub sent: usize,
    pub send_errors: usize,
    pub elapsed: Duration,
}

/// The UDP header and payload of one spoofed datagram: the source port is whatever we claim.
fn udp_datagram(src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(8 + payload.len()).expect("datagram fits");
    let mut d = Vec::with_capacity(8 + payload.len());
    d.extend_from_slice(&src_port.to_be_bytes());
    d.extend_from_slice(&dst_port.to_be_bytes());
    d.extend_from_slice(&len.to_be_bytes());
    // Checksum 0: "no checksum", valid for UDP over IPv4 (RFC 768), so no pseudo-header sums.
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(payload);
    d
}

/// Sends a bounded flood of unsolicited replies from inside `ns` (the upstream's namespace),
/// through a raw socket so each datagram can claim the upstream's own source address and port.
/// The datagrams rotate over the forwarder's ports and over four kinds:
/// 1. random bytes;
/// 2. the forged reply with a guessed ID (IDs swept in order per port), from the upstream's
///    exact address and port: what an off-path spoofer who knows the question sends;
/// 3. the forged reply from the right address but port 5353 (must be ignored whatever its ID);
/// 4. a bare FORMERR header with a guessed ID and no question (the one shape accepted on ID and
///    source alone, so the cheapest forgery).
///
/// Paced to spread `datagrams` over `duration`; stops at whichever bound comes first (it never
/// runs longer than twice `duration`).
pub fn flood_unsolicited_replies(ns: &Netns, plan: &FloodPlan) -> FloodReport {
    assert!(!plan.ports.is_empty(), "no ports to flood");
    let socket = ns.enter(|| {
        let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP))
            .unwrap_or_else(|e| panic!("cannot open a raw UDP socket in {}: {e}", ns.name));
        s.bind(&SockAddr::from(SocketAddrV4::new(
            *plan.spoofed_source.ip(),
            0,
        )))
        .unwrap_or_else(|e| panic!("cannot bind the raw socket to the upstream address: {e}"));
        s
    });
    let to = SockAddr::from(SocketAddrV4::new(plan.target_ip, 0));
    let mut formerr = plan.forged_reply[..12].to_vec();
    formerr[2] = 0x80;
    formerr[3] = 0x01;
    formerr[4..12].fill(0);
    let mut rng = rand::rng();
    let mut report = FloodReport::default();
    let started = Instant::now();
    let hard_stop = started + plan.duration * 2;
    let mut next_id: Vec<u16> = plan.ports.iter().map(|_| rand::random()).collect();
    let mut payload = Vec::with_capacity(512);
    for i in 0..plan.datagrams {
        // Pace in batches of 256: ahead of schedule, sleep; past the hard stop, give up.
        if i % 256 == 0 {
            let due = plan.duration.mul_f64(i as f64 / plan.datagrams as f64);
            let now = started.elapsed();
            if due > now {
                std::thread::sleep(due - now);
            }
            if Instant::now() >= hard_stop {
                break;
            }
        }
        let slot = i % plan.ports.len();
        let port = plan.ports[slot];
        payload.clear();
        let mut src_port = plan.spoofed_source.port();
        match (i / plan.ports.len()) % 4 {
            0 => {
                let len = rand::Rng::random_range(&mut rng, 12..=120);
                payload.extend((0..len).map(|_| rand::random::<u8>()));
            }
            1 | 2 => {
                payload.extend_from_slice(&plan.forged_reply);
                payload[..2].copy_from_slice(&next_id[slot].to_be_bytes());
                next_id[slot] = next_id[slot].wrapping_add(1);
                if (i / plan.ports.len()) % 4 == 2 {
                    src_port = 5353;
                }
            }
            _ => {
                payload.extend_from_slice(&formerr);
                payload[..2].copy_from_slice(&next_id[slot].to_be_bytes());
                next_id[slot] = next_id[slot].wrapping_add(1);
            }
        }
        match socket.send_to(&udp_datagram(src_port, port, &payload), &to) {
            Ok(_) => report.sent += 1,
            Err(_) => report.send_errors += 1,
        }
    }
    report.elapsed = started.elapsed();
    report
}

/// Sends every packet in `packets` to `to` from one fresh UDP socket at `at`, then collects every
/// datagram that comes back from `to` for `wait`. (One socket and one wait for a whole batch of
/// packets that should get no reply, instead of a wait per packet.)
pub fn udp_burst(
    at: impl Into<Place>,
    to: SocketAddr,
    packets: &[Vec<u8>],
    wait: Duration,
) -> Vec<Vec<u8>> {
    at.into().enter(|| {
        let any: SocketAddr = match to {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let sock = std::net::UdpSocket::bind(any).expect("bind UDP client socket");
        sock.connect(to).expect("connect UDP client socket");
        for p in packets {
            let _ = sock.send(p);
        }
        let deadline = Instant::now() + wait;
        let mut replies = Vec::new();
        let mut buf = vec![0u8; 65536];
        // Bounded: at most one reply per packet sent, plus a few, within `wait`.
        while replies.len() <= packets.len() + 4 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let _ = sock.set_read_timeout(Some(deadline - now));
            match sock.recv(&mut buf) {
                Ok(n) => replies.push(buf[..n].to_vec()),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                // ECONNREFUSED from an ICMP error: nothing listening; keep waiting out `wait`.
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        replies
    })
}
