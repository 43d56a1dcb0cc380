//! DNS clients: real `dig`/`kdig`/`getent`, and raw UDP/TCP exchanges, each run at a [`Place`]:
//! on the host against a loopback address, or inside a namespace.

use super::netns::{Netns, Place};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

/// One record of dig's ANSWER section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DigRecord {
    pub name: String,
    pub ttl: u32,
    pub rtype: String,
    /// Everything after the type, as dig printed it (e.g. `10.0.0.1`, or the
    /// quoted strings of a TXT record).
    pub rdata: String,
}

/// What a dig/kdig run produced.
#[derive(Clone, Debug)]
pub struct DigResult {
    /// Response code of the first reply (`NOERROR`, `SERVFAIL`, `NXDOMAIN`,
    /// `REFUSED`, ...); `TIMEOUT` if no reply came; `CONNREFUSED` if the only
    /// outcome was a connection refusal (ICMP port unreachable for UDP, RST for
    /// TCP). [`DigResult::no_reply`] covers both of the last two.
    pub status: String,
    /// Rdata of each ANSWER section record, e.g. `10.0.0.1`.
    pub answers: Vec<String>,
    /// The ANSWER section records in full.
    pub records: Vec<DigRecord>,
    /// Header flags, lowercase, e.g. `["qr", "rd", "ra", "tc"]`.
    pub flags: Vec<String>,
    /// `MSG SIZE rcvd` if dig printed it.
    pub msg_size: Option<usize>,
    /// dig's own `Query time` of the reply it printed (not the process's start-up, which a
    /// saturated machine can stretch to seconds).
    pub query_time: Option<Duration>,
    /// How long the answer took: dig's `Query time` when it printed one (every dig here makes
    /// one try, so that is the time from its query to the reply), else the wall time around the
    /// command. Deadlines are asserted on this: starting a process in a namespace while the
    /// nspawn tests mount and unmount was measured taking 37-46 s of wall time.
    pub elapsed: Duration,
    /// Wall time around the command, process start-up included.
    pub wall: Duration,
    /// stdout then stderr of the command.
    pub raw: String,
}

impl DigResult {
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f.eq_ignore_ascii_case(flag))
    }

    pub fn no_reply(&self) -> bool {
        self.status == "TIMEOUT" || self.status == "CONNREFUSED"
    }

    /// Parses dig's (or kdig's) default output.
    pub fn parse(raw: String, elapsed: Duration) -> DigResult {
        let mut status = None;
        let mut flags = Vec::new();
        let mut records = Vec::new();
        let mut msg_size = None;
        let mut query_time = None;
        let mut in_answer = false;
        // Only the first reply counts (dig prints one per query it made).
        let mut replies_seen = 0;
        for line in raw.lines() {
            let trimmed = line.trim();
            if let Some(pos) = trimmed.find("->>HEADER<<-") {
                replies_seen += 1;
                if replies_seen > 1 {
                    break;
                }
                // dig: "opcode: QUERY, status: NOERROR, id: 1"; kdig uses ';'.
                status = trimmed[pos..]
                    .split("status:")
                    .nth(1)
                    .and_then(|rest| rest.split([',', ';']).next())
                    .map(|s| s.trim().to_string());
                continue;
            }
            let lower = trimmed.to_ascii_lowercase();
            if let Some(rest) = lower.strip_prefix(";; flags:") {
                flags = rest
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .map(str::to_string)
                    .collect();
                continue;
            }
            if let Some(rest) = lower.strip_prefix(";; query time:") {
                query_time = rest
                    .trim()
                    .trim_end_matches("msec")
                    .trim()
                    .parse()
                    .ok()
                    .map(Duration::from_millis);
                continue;
            }
            if lower.starts_with(";; msg size") {
                msg_size = trimmed
                    .rsplit(' ')
                    .next()
                    .and_then(|n| n.trim_end_matches(" B").parse().ok());
                continue;
            }
            if lower.starts_with(";; answer section") {
                in_answer = true;
                continue;
            }
            if in_answer {
                if trimmed.is_empty() || trimmed.starts_with(';') {
                    in_answer = false;
                    continue;
                }
                if let Some(rec) = parse_rr_line(trimmed) {
                    records.push(rec);
                }
            }
        }
        let status = status.unwrap_or_else(|| {
            let lower = raw.to_ascii_lowercase();
            if lower.contains("connection refused") {
                "CONNREFUSED".to_string()
            } else {
                "TIMEOUT".to_string()
            }
        });
        DigResult {
            status,
            answers: records.iter().map(|r| r.rdata.clone()).collect(),
            records,
            flags,
            msg_size,
            query_time,
            elapsed: query_time.unwrap_or(elapsed),
            wall: elapsed,
            raw,
        }
    }
}

/// `name ttl class type rdata...` (whitespace separated; rdata kept verbatim).
fn parse_rr_line(line: &str) -> Option<DigRecord> {
    let mut rest = line;
    let mut fields = Vec::new();
    for _ in 0..4 {
        let s = rest.trim_start();
        let end = s.find(char::is_whitespace).unwrap_or(s.len());
        fields.push(&s[..end]);
        rest = &s[end..];
    }
    Some(DigRecord {
        name: fields[0].to_string(),
        ttl: fields[1].parse().ok()?,
        rtype: fields[3].to_string(),
        rdata: rest.trim().to_string(),
    })
}

fn run_client(at: Place, prog: &str, args: Vec<String>) -> DigResult {
    let mut cmd = at.command(prog, &args);
    let started = Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {prog} {args:?}: {e}"));
    let elapsed = started.elapsed();
    let mut raw = String::from_utf8_lossy(&out.stdout).into_owned();
    raw.push_str(&String::from_utf8_lossy(&out.stderr));
    DigResult::parse(raw, elapsed)
}

/// Runs `dig +tries=1 +time=5 <args>` at `at` (pass `@server`, name, type, `+tcp`, `+ignore`,
/// ... in `args`; later options override earlier). [`server`] gives the `@server -p port`
/// arguments of a socket address.
pub fn dig(at: impl Into<Place>, args: &[&str]) -> DigResult {
    let mut all = vec!["+tries=1".to_string(), "+time=5".to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    run_client(at.into(), "dig", all)
}

/// Runs `kdig +retry=0 +timeout=5 <args>` at `at`; same parsing as dig.
pub fn kdig(at: impl Into<Place>, args: &[&str]) -> DigResult {
    let mut all = vec!["+retry=0".to_string(), "+timeout=5".to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    run_client(at.into(), "kdig", all)
}

/// `@ip -p port`: how dig and kdig are pointed at `addr`.
pub fn server(addr: SocketAddr) -> [String; 3] {
    [
        format!("@{}", addr.ip()),
        "-p".to_string(),
        addr.port().to_string(),
    ]
}

/// [`dig`] with [`server`]`(to)` in front of `args`.
pub fn dig_to(at: impl Into<Place>, to: SocketAddr, args: &[&str]) -> DigResult {
    let head = server(to);
    let mut all: Vec<&str> = head.iter().map(String::as_str).collect();
    all.extend_from_slice(args);
    dig(at, &all)
}

/// [`kdig`] with [`server`]`(to)` in front of `args`.
pub fn kdig_to(at: impl Into<Place>, to: SocketAddr, args: &[&str]) -> DigResult {
    let head = server(to);
    let mut all: Vec<&str> = head.iter().map(String::as_str).collect();
    all.extend_from_slice(args);
    kdig(at, &all)
}

/// `getent hosts <name>` inside `ns` (glibc resolver, so it follows the
/// namespace's resolv.conf set with [`Netns::set_resolv_conf`]); the first
/// address printed, if any.
pub fn getent_hosts(ns: &Netns, name: &str) -> Option<String> {
    let out = ns
        .exec("getent", ["hosts", name])
        .output()
        .unwrap_or_else(|e| panic!("cannot run getent: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(str::to_string)
}

/// An unspecified local address of the same family as `to`.
fn any_addr_for(to: SocketAddr) -> SocketAddr {
    match to {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    }
}

/// Sends `bytes` to `to` from a fresh UDP socket at `at` and returns the first
/// datagram that comes back from `to` within `wait` (the socket is connected,
/// so the kernel drops datagrams from anyone else). None on timeout or if the
/// port is unreachable.
pub fn udp_exchange(
    at: impl Into<Place>,
    to: SocketAddr,
    bytes: &[u8],
    wait: Duration,
) -> Option<Vec<u8>> {
    at.into().enter(|| udp_exchange_here(to, bytes, wait))
}

fn udp_exchange_here(to: SocketAddr, bytes: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let sock = UdpSocket::bind(any_addr_for(to)).expect("bind UDP client socket");
    sock.connect(to).ok()?;
    sock.send(bytes).ok()?;
    sock.set_read_timeout(Some(wait.max(Duration::from_millis(1))))
        .expect("set_read_timeout");
    let mut buf = vec![0u8; 65536];
    let n = sock.recv(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// Sends `bytes` to `to` from a fresh UDP socket at `at`, waiting for nothing.
pub fn udp_send(at: impl Into<Place>, to: SocketAddr, bytes: &[u8]) {
    at.into().enter(|| {
        let sock = UdpSocket::bind(any_addr_for(to)).expect("bind UDP client socket");
        let _ = sock.send_to(bytes, to);
    })
}

/// Opens one TCP connection from `at` to `to`, sends every frame (each with
/// its 2-byte length prefix, all written at once: pipelined), and reads reply
/// frames until there are as many as frames sent, the peer closes, or `wait`
/// (counted from the start, connect included) runs out. Returns the replies
/// received, without their prefixes; empty if the connection failed.
pub fn tcp_exchange(
    at: impl Into<Place>,
    to: SocketAddr,
    frames: &[Vec<u8>],
    wait: Duration,
) -> Vec<Vec<u8>> {
    at.into().enter(|| tcp_exchange_here(to, frames, wait))
}

fn tcp_exchange_here(to: SocketAddr, frames: &[Vec<u8>], wait: Duration) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + wait;
    let Ok(mut stream) = TcpStream::connect_timeout(&to, wait.max(Duration::from_millis(1))) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for f in frames {
        let len = u16::try_from(f.len()).expect("DNS message over 65535 bytes");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(f);
    }
    if stream.write_all(&out).is_err() {
        return Vec::new();
    }
    let mut replies = Vec::new();
    let mut pending = Vec::new();
    let mut chunk = vec![0u8; 65536];
    while replies.len() < frames.len() {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        if stream.set_read_timeout(Some(deadline - now)).is_err() {
            break;
        }
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(_) => break,
        }
        while pending.len() >= 2 {
            let len = usize::from(u16::from_be_bytes([pending[0], pending[1]]));
            if pending.len() < 2 + len {
                break;
            }
            replies.push(pending.drain(..2 + len).skip(2).collect());
        }
    }
    replies
}

/// Encodes a recursive query for `name`/`rtype` with `id`; with
/// `edns_payload` Some, adds an OPT record advertising that UDP size.
pub fn make_query(name: &str, rtype: RecordType, id: u16, edns_payload: Option<u16>) -> Vec<u8> {
    let name = Name::from_ascii(name).unwrap_or_else(|e| panic!("bad name {name:?}: {e}"));
    let mut msg = Message::new();
    msg.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name, rtype));
    if let Some(size) = edns_payload {
        let mut edns = Edns::new();
        edns.set_max_payload(size).set_version(0);
        msg.set_edns(edns);
    }
    msg.to_vec().expect("encode query")
}

/// Parses a DNS message, None if it does not parse.
pub fn parse_message(bytes: &[u8]) -> Option<Message> {
    Message::from_vec(bytes).ok()
}

/// One probe: true if a UDP A query for `name` sent to `addr` from `at` gets any DNS reply
/// with the query's ID within `wait`.
pub fn dns_answers(at: impl Into<Place>, addr: SocketAddr, name: &str, wait: Duration) -> bool {
    let id = rand::random::<u16>();
    let query = make_query(name, RecordType::A, id, None);
    udp_exchange(at, addr, &query, wait)
        .is_some_and(|reply| reply.len() >= 12 && reply[..2] == id.to_be_bytes())
}

/// A program that resolves its argument with Go's own resolver (as Go programs in pods do:
/// `net.Resolver{PreferGo: true}`, reading /etc/resolv.conf) and prints each address, or the
/// error and exit status 1. Built with the Debian Go toolchain into `dir`.
pub fn go_resolver(dir: &std::path::Path) -> std::path::PathBuf {
    const SOURCE: &str = r#"package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"
)

func main() {
	r := &net.Resolver{PreferGo: true}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	addrs, err := r.LookupIPAddr(ctx, os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, a := range addrs {
		fmt.Println(a.IP)
	}
}
"#;
    let src = dir.join("resolve.go");
    std::fs::write(&src, SOURCE).expect("write resolve.go");
    let bin = dir.join("go-resolve");
    let out = std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(&src)
        .env("CGO_ENABLED", "0")
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("HOME", dir)
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("run go build");
    assert!(
        out.status.success(),
        "go build failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}
