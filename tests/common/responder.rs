//! The test kit's one scriptable DNS server: every stand-in upstream (kube-dns, the VNet DNS, a
//! CoreDNS that truncates) is this responder in a mode. (LocalDNS is played by
//! [`super::localdns::LocalDns`].)
//!
//! It serves UDP and TCP (2-byte length framing, several queries per
//! connection) on one address at a [`Place`]: a loopback address of the host,
//! or an address inside a namespace. Its sockets are created there through
//! [`Place::enter`]; the serving threads run anywhere.
//! Every byte it receives is untrusted: malformed input is answered with
//! FORMERR or dropped, never unwrapped.

use super::netns::Place;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use rand::Rng;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// TTL of every record the responder serves.
pub const RESPONDER_TTL: u32 = 60;
/// The big TXT RRset answered for names starting with `big.`: this many
/// strings of [`BIG_TXT_STRING_LEN`] bytes (about 4 KB on the wire).
pub const BIG_TXT_STRINGS: usize = 16;
pub const BIG_TXT_STRING_LEN: usize = 250;
/// How long a spoofing responder waits after its forgeries before the real reply.
pub const SPOOF_REAL_REPLY_DELAY: Duration = Duration::from_millis(20);

/// The strings of the big TXT RRset, in order. String i starts with its
/// two-digit index so a test can tell reordering or loss from truncation.
pub fn big_txt_strings() -> Vec<String> {
    (0..BIG_TXT_STRINGS)
        .map(|i| {
            let fill = char::from(b'a' + (i % 26) as u8);
            let mut s = format!("{i:02}");
            s.extend(std::iter::repeat_n(fill, BIG_TXT_STRING_LEN - 2));
            s
        })
        .collect()
}

/// How the responder behaves. Common answers (all modes that answer):
/// A -> one A record `answer_v4` (TTL 60); AAAA -> NOERROR/no data; TXT for a
/// The SOA MINIMUM in NXDOMAIN answers (names `nx.*`): how long a denial may be cached.
pub const NX_SOA_MINIMUM: u32 = 2;

/// name starting with `big.` -> the big RRset; `ttl1.*` -> A with TTL 1; `servfail.*` ->
/// SERVFAIL; any name starting with `nx.` (NXDOMAIN with an SOA)
/// -> NXDOMAIN; anything else -> NOERROR/no data. The question is echoed as
/// received (same case) and an OPT record is returned if the query had one.
#[derive(Clone, Debug)]
pub enum Mode {
    /// Correct answers; over UDP a reply larger than the client's EDNS size
    /// (512 without OPT) is sent with TC set and no answers.
    Normal { answer_v4: Ipv4Addr },
    /// Counts queries and never answers.
    Silent,
    /// For each UDP query sends, in this order, forged replies carrying
    /// `forged_v4`: (a) wrong ID, (b) right ID but another question name,
    /// (c) right ID and question from a second socket on another port of the
    /// same IP, (d) right ID and question with QR=0, (e) right ID and question
    /// from `alt_src` (same port, other IP; skipped if None). Then, after
    /// [`SPOOF_REAL_REPLY_DELAY`], the real reply with `answer_v4`.
    /// TCP queries get the real reply only.
    Spoof {
        answer_v4: Ipv4Addr,
        forged_v4: Ipv4Addr,
        alt_src: Option<IpAddr>,
    },
    /// Like Normal but never truncates: the full big TXT goes over UDP
    /// whatever the client advertised.
    Oversize { answer_v4: Ipv4Addr },
    /// Answers each UDP query with a datagram of random bytes (never starting
    /// with the query's ID), then with a datagram carrying the right ID,
    /// QR=0 and random bytes after the header. TCP queries get one frame of
    /// random bytes.
    Garbage,
    /// Correct answers (as Normal), each sent `delay` after the query.
    Delay {
        answer_v4: Ipv4Addr,
        delay: Duration,
    },
    /// Every query (UDP and TCP) answered with this RCODE and the question alone: CoreDNS's
    /// REFUSED when its `max_concurrent` overflows, a backend's SERVFAIL.
    Rcode { code: u8 },
    /// The first `n` UDP queries are lost; the rest answered as Normal (a lossy path).
    DropFirst { answer_v4: Ipv4Addr, n: usize },
    /// UDP answered as Normal; TCP connections accepted and never answered.
    TcpSilent { answer_v4: Ipv4Addr },
    /// kube-dns as CoreDNS answers it, with answers of its own: `many<N>.<anything>` has N A
    /// records ([`many_addresses`], TTL 30), every other name is NXDOMAIN with an SOA; replies are
    /// authoritative. Over UDP an answer larger than the client advertised (512 bytes without
    /// EDNS) keeps as many whole records as fit, with TC set (miekg/dns `Truncate`); over TCP it
    /// goes whole. A query that does not parse, or is not a query, is dropped.
    CoreDns,
    /// As [`Mode::CoreDns`], but a UDP answer that does not fit is cut to no record at all
    /// (header, question and OPT, with TC), as dnsmasq and unbound cut.
    CoreDnsEmptyCut,
    /// A resolver that cannot resolve some names: a name starting with `prefix` (any case) is
    /// answered with RCODE `code` and the question alone (its own SERVFAIL or REFUSED), every
    /// other name as Normal. UDP and TCP.
    RcodeFor {
        prefix: &'static str,
        code: u8,
        answer_v4: Ipv4Addr,
    },
    /// A resolver slow to resolve some names: a name starting with `prefix` (any case) is
    /// answered as Normal `delay` after its query, every other name at once. UDP and TCP.
    DelayFor {
        prefix: &'static str,
        delay: Duration,
        answer_v4: Ipv4Addr,
    },
    /// A path that loses packets after a while: the first `answered` UDP queries are answered
    /// as Normal, the next `dropped` are lost, the rest answered again. TCP as Normal.
    DropAfter {
        answer_v4: Ipv4Addr,
        answered: usize,
        dropped: usize,
    },
}

/// The question's name of raw `query`, lowercase, if it parses.
fn qname_lowercase(query: &[u8]) -> Option<String> {
    let msg = Message::from_vec(query).ok()?;
    Some(
        msg.queries()
            .first()?
            .name()
            .to_ascii()
            .to_ascii_lowercase(),
    )
}

/// Does the question of raw `query` name something starting with `prefix`?
fn asks_for(query: &[u8], prefix: &str) -> bool {
    qname_lowercase(query).is_some_and(|n| n.starts_with(&prefix.to_ascii_lowercase()))
}

/// The addresses of `many<n>.*` in [`Mode::CoreDns`], in the order they are answered.
pub fn many_addresses(n: usize) -> Vec<Ipv4Addr> {
    (0..n)
        .map(|i| Ipv4Addr::new(10, 77, (i / 250) as u8, (i % 250) as u8 + 1))
        .collect()
}

/// A running responder; dropping it stops and joins all its threads.
pub struct Responder {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    udp_count: Arc<AtomicUsize>,
    tcp_count: Arc<AtomicUsize>,
    truncated: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
    /// Per-connection and delayed-reply threads, joined on drop.
    workers: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

/// Binds the responder's sockets where the caller runs (`where_` names it for errors).
fn bind(
    addr: SocketAddr,
    mode: &Mode,
    where_: &str,
) -> (UdpSocket, TcpListener, Option<SpoofSockets>) {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = |ty: Type, proto: Protocol| -> std::io::Result<Socket> {
        let s = Socket::new(Domain::for_address(addr), ty, Some(proto))?;
        if ty == Type::STREAM {
            s.set_reuse_address(true)?;
        }
        Ok(s)
    };
    let udp = socket(Type::DGRAM, Protocol::UDP)
        .and_then(|s| s.bind(&addr.into()).map(|()| UdpSocket::from(s)))
        .unwrap_or_else(|e| panic!("responder: cannot bind UDP {addr} in {where_}: {e}"));
    let addr = udp.local_addr().expect("local_addr of a bound socket");
    let tcp = socket(Type::STREAM, Protocol::TCP)
        .and_then(|s| {
            s.bind(&addr.into())?;
            s.listen(128)?;
            Ok(TcpListener::from(s))
        })
        .unwrap_or_else(|e| panic!("responder: cannot bind TCP {addr} in {where_}: {e}"));
    let spoof = match &mode {
        Mode::Spoof { alt_src, .. } => {
            let other_port = UdpSocket::bind(SocketAddr::new(addr.ip(), 0))
                .unwrap_or_else(|e| panic!("responder: cannot bind spoof socket: {e}"));
            let other_ip = alt_src.map(|ip| {
                UdpSocket::bind(SocketAddr::new(ip, addr.port())).unwrap_or_else(|e| {
                    panic!(
                        "responder: cannot bind spoof source {ip}:{} in {}: {e}",
                        addr.port(),
                        where_
                    )
                })
            });
            Some(SpoofSockets {
                other_port,
                other_ip,
            })
        }
        _ => None,
    };
    (udp, tcp, spoof)
}

/// Sockets a spoofing responder forges from.
struct SpoofSockets {
    other_port: UdpSocket,
    other_ip: Option<UdpSocket>,
}

impl Responder {
    /// Starts serving on `addr` (UDP and TCP) at `at`. With port 0 the
    /// kernel picks a port for UDP and TCP uses the same one; see [`addr`].
    ///
    /// [`addr`]: Responder::addr
    pub fn start(at: impl Into<Place>, addr: SocketAddr, mode: Mode) -> Responder {
        let at = at.into();
        let where_ = at.describe();
        let (udp, tcp, spoof) = at.enter(|| bind(addr, &mode, &where_));
        Responder::serve(udp, tcp, spoof, mode)
    }

    fn serve(
        udp: UdpSocket,
        tcp: TcpListener,
        spoof: Option<SpoofSockets>,
        mode: Mode,
    ) -> Responder {
        let addr = udp.local_addr().expect("local_addr of a bound socket");

        // Timeouts and non-blocking accept let every loop notice `stop`.
        udp.set_read_timeout(Some(Duration::from_millis(50)))
            .expect("set_read_timeout");
        tcp.set_nonblocking(true).expect("set_nonblocking");

        let stop = Arc::new(AtomicBool::new(false));
        let udp_count = Arc::new(AtomicUsize::new(0));
        let tcp_count = Arc::new(AtomicUsize::new(0));
        let truncated = Arc::new(AtomicUsize::new(0));
        let workers = Arc::new(Mutex::new(Vec::new()));

        let udp_thread = {
            let ctx = Ctx {
                mode: mode.clone(),
                stop: Arc::clone(&stop),
                count: Arc::clone(&udp_count),
                truncated: Arc::clone(&truncated),
                seen: Arc::default(),
                workers: Arc::clone(&workers),
            };
            std::thread::Builder::new()
                .name(format!("responder-udp-{addr}"))
                .spawn(move || serve_udp(Arc::new(udp), spoof.map(Arc::new), ctx))
                .expect("spawn responder thread")
        };
        let tcp_thread = {
            let ctx = Ctx {
                mode,
                stop: Arc::clone(&stop),
                count: Arc::clone(&tcp_count),
                truncated: Arc::clone(&truncated),
                seen: Arc::default(),
                workers: Arc::clone(&workers),
            };
            std::thread::Builder::new()
                .name(format!("responder-tcp-{addr}"))
                .spawn(move || serve_tcp(tcp, ctx))
                .expect("spawn responder thread")
        };

        Responder {
            addr,
            stop,
            udp_count,
            tcp_count,
            truncated,
            threads: vec![udp_thread, tcp_thread],
            workers,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queries received so far over UDP and TCP (garbage included).
    pub fn queries(&self) -> usize {
        self.udp_queries() + self.tcp_queries()
    }

    pub fn udp_queries(&self) -> usize {
        self.udp_count.load(Ordering::SeqCst)
    }

    /// Length-prefixed frames received over TCP.
    pub fn tcp_queries(&self) -> usize {
        self.tcp_count.load(Ordering::SeqCst)
    }

    /// The live counters, for watching from another thread.
    pub fn counters(&self) -> (Arc<AtomicUsize>, Arc<AtomicUsize>) {
        (Arc::clone(&self.udp_count), Arc::clone(&self.tcp_count))
    }

    /// UDP replies sent with TC set.
    pub fn truncated(&self) -> usize {
        self.truncated.load(Ordering::SeqCst)
    }

    pub fn reset_counts(&self) {
        self.udp_count.store(0, Ordering::SeqCst);
        self.tcp_count.store(0, Ordering::SeqCst);
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // The two loops are the only ones adding workers: join them first so
        // the worker list is final.
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let workers: Vec<_> = self
            .workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for w in workers {
            let _ = w.join();
        }
    }
}

/// What a serving loop needs.
struct Ctx {
    mode: Mode,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
    /// UDP replies sent with TC set.
    truncated: Arc<AtomicUsize>,
    /// Queries seen over the responder's whole life (`count` may be reset by a test).
    seen: Arc<AtomicUsize>,
    workers: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Ctx {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn spawn_worker(&self, f: impl FnOnce() + Send + 'static) {
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        // Drop finished handles so a long test does not accumulate them.
        workers.retain(|w| !w.is_finished());
        match std::thread::Builder::new().spawn(f) {
            Ok(handle) => workers.push(handle),
            Err(e) => eprintln!("responder: cannot spawn worker: {e}"),
        }
    }
}

/// Sleeps `total`, waking every 10 ms to check `stop`; false if stopped.
fn sleep_unless_stopped(stop: &AtomicBool, total: Duration) -> bool {
    let deadline = Instant::now() + total;
    loop {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

fn serve_udp(sock: Arc<UdpSocket>, spoof: Option<Arc<SpoofSockets>>, ctx: Ctx) {
    // 64 KiB: the largest datagram, so nothing is silently cut.
    let mut buf = vec![0u8; 65536];
    while !ctx.stopped() {
        let (len, src) = match sock.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) if is_timeout(&e) => continue,
            Err(e) => {
                // E.g. ECONNREFUSED left over from an ICMP error: keep serving.
                eprintln!("responder: udp recv error: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        ctx.count.fetch_add(1, Ordering::SeqCst);
        let seen = ctx.seen.fetch_add(1, Ordering::SeqCst) + 1;
        let query = &buf[..len];
        match &ctx.mode {
            Mode::Silent => {}
            Mode::CoreDns | Mode::CoreDnsEmptyCut => {
                let keep = matches!(ctx.mode, Mode::CoreDns);
                if let Some(reply) = coredns_reply(query, true, keep) {
                    if reply.len() >= 3 && reply[2] & 0x02 != 0 {
                        ctx.truncated.fetch_add(1, Ordering::SeqCst);
                    }
                    let _ = sock.send_to(&reply, src);
                }
            }
            Mode::Rcode { code } => {
                if let Some(reply) = rcode_reply(query, *code) {
                    let _ = sock.send_to(&reply, src);
                }
            }
            Mode::DropFirst { n, .. } if seen <= *n => {}
            Mode::DropAfter {
                answered, dropped, ..
            } if seen > *answered && seen <= answered + dropped => {}
            Mode::RcodeFor { prefix, code, .. } if asks_for(query, prefix) => {
                if let Some(reply) = rcode_reply(query, *code) {
                    let _ = sock.send_to(&reply, src);
                }
            }
            Mode::DelayFor {
                prefix,
                delay,
                answer_v4,
            } if asks_for(query, prefix) => {
                let Some(reply) = reply_bytes(query, *answer_v4, true) else {
                    continue;
                };
                let (sock, stop, delay) = (Arc::clone(&sock), Arc::clone(&ctx.stop), *delay);
                ctx.spawn_worker(move || {
                    if sleep_unless_stopped(&stop, delay) {
                        let _ = sock.send_to(&reply, src);
                    }
                });
            }
            Mode::RcodeFor { answer_v4, .. }
            | Mode::DelayFor { answer_v4, .. }
            | Mode::DropAfter { answer_v4, .. } => {
                if let Some(reply) = reply_bytes(query, *answer_v4, true) {
                    let _ = sock.send_to(&reply, src);
                }
            }
            Mode::Normal { answer_v4 }
            | Mode::DropFirst { answer_v4, .. }
            | Mode::TcpSilent { answer_v4 } => {
                if let Some(reply) = reply_bytes(query, *answer_v4, true) {
                    let _ = sock.send_to(&reply, src);
                }
            }
            Mode::Oversize { answer_v4 } => {
                if let Some(reply) = reply_bytes(query, *answer_v4, false) {
                    let _ = sock.send_to(&reply, src);
                }
            }
            Mode::Delay { answer_v4, delay } => {
                let Some(reply) = reply_bytes(query, *answer_v4, true) else {
                    continue;
                };
                let (sock, stop, delay) = (Arc::clone(&sock), Arc::clone(&ctx.stop), *delay);
                ctx.spawn_worker(move || {
                    if sleep_unless_stopped(&stop, delay) {
                        let _ = sock.send_to(&reply, src);
                    }
                });
            }
            Mode::Garbage => {
                for datagram in garbage_replies(query) {
                    let _ = sock.send_to(&datagram, src);
                }
            }
            Mode::Spoof {
                answer_v4,
                forged_v4,
                ..
            } => {
                let Ok(msg) = Message::from_vec(query) else {
                    // Nothing to forge for a query that does not parse.
                    if let Some(reply) = formerr(query) {
                        let _ = sock.send_to(&reply, src);
                    }
                    continue;
                };
                let Some(spoof) = spoof.as_ref().map(Arc::clone) else {
                    continue;
                };
                let forged = forgeries(&msg, *forged_v4);
                let real = reply_bytes(query, *answer_v4, true);
                let (sock, stop) = (Arc::clone(&sock), Arc::clone(&ctx.stop));
                // A worker, so the 20 ms pause does not hold up other queries.
                ctx.spawn_worker(move || {
                    send_forgeries(&sock, &spoof, &forged, src);
                    if sleep_unless_stopped(&stop, SPOOF_REAL_REPLY_DELAY) {
                        if let Some(real) = real {
                            let _ = sock.send_to(&real, src);
                        }
                    }
                });
            }
        }
    }
}

/// The forged replies of [`Mode::Spoof`], by kind.
struct Forgeries {
    wrong_id: Option<Vec<u8>>,
    wrong_question: Option<Vec<u8>>,
    right: Option<Vec<u8>>,
    qr_zero: Option<Vec<u8>>,
}

fn forgeries(query: &Message, forged_v4: Ipv4Addr) -> Forgeries {
    let right = encode(&build_reply(query, forged_v4), None);
    let wrong_id = right.clone().map(|mut b| {
        b[0] ^= 0x5a;
        b[1] ^= 0xa5;
        b
    });
    let qr_zero = right.clone().map(|mut b| {
        b[2] &= 0x7f;
        b
    });
    let wrong_question = {
        let mut other = query.clone();
        let name = Name::from_ascii("forged-question.invalid.").expect("static name");
        for q in other.queries_mut() {
            q.set_name(name.clone());
        }
        encode(&build_reply(&other, forged_v4), None)
    };
    Forgeries {
        wrong_id,
        wrong_question,
        right,
        qr_zero,
    }
}

fn send_forgeries(main: &UdpSocket, spoof: &SpoofSockets, f: &Forgeries, to: SocketAddr) {
    if let Some(b) = &f.wrong_id {
        let _ = main.send_to(b, to);
    }
    if let Some(b) = &f.wrong_question {
        let _ = main.send_to(b, to);
    }
    if let Some(b) = &f.right {
        let _ = spoof.other_port.send_to(b, to);
    }
    if let Some(b) = &f.qr_zero {
        let _ = main.send_to(b, to);
    }
    if let (Some(sock), Some(b)) = (&spoof.other_ip, &f.right) {
        let _ = sock.send_to(b, to);
    }
}

/// The datagrams [`Mode::Garbage`] answers a UDP query with.
fn garbage_replies(query: &[u8]) -> Vec<Vec<u8>> {
    let mut rng = rand::rng();
    let mut noise = vec![0u8; rng.random_range(1..=300)];
    rng.fill(&mut noise[..]);
    let mut out = Vec::new();
    if query.len() >= 2 {
        // Never let pure noise carry the right ID by chance.
        if noise.len() >= 2 && noise[..2] == query[..2] {
            noise[0] ^= 0xff;
        }
        let mut header_then_noise = vec![
            query[0], query[1], // the query's ID
            0x01, 0x00, // QR=0, opcode QUERY, RD
            0x00, 0x01, // QDCOUNT 1
            0x00, 0x01, // ANCOUNT 1
            0x00, 0x00, 0x00, 0x00,
        ];
        let mut tail = vec![0u8; rng.random_range(1..=100)];
        rng.fill(&mut tail[..]);
        header_then_noise.extend_from_slice(&tail);
        out.push(noise);
        out.push(header_then_noise);
    } else {
        out.push(noise);
    }
    out
}

fn random_frame() -> Vec<u8> {
    let mut rng = rand::rng();
    let mut noise = vec![0u8; rng.random_range(1..=300)];
    rng.fill(&mut noise[..]);
    noise
}

fn serve_tcp(listener: TcpListener, ctx: Ctx) {
    let ctx = Arc::new(ctx);
    while !ctx.stopped() {
        match listener.accept() {
            Ok((stream, _peer)) => {
                let conn_ctx = Arc::clone(&ctx);
                ctx.spawn_worker(move || serve_tcp_conn(stream, &conn_ctx));
            }
            Err(e) if is_timeout(&e) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                eprintln!("responder: accept error: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Serves one TCP connection: any number of length-prefixed queries, answered
/// in order, until the client closes it or the responder stops.
fn serve_tcp_conn(mut stream: TcpStream, ctx: &Ctx) {
    if stream.set_nonblocking(false).is_err()
        || stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .is_err()
        || stream
            .set_write_timeout(Some(Duration::from_secs(5)))
            .is_err()
    {
        return;
    }
    let _ = stream.set_nodelay(true);
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 65536];
    while !ctx.stopped() {
        // Answer every complete frame already buffered.
        while pending.len() >= 2 {
            let len = usize::from(u16::from_be_bytes([pending[0], pending[1]]));
            if pending.len() < 2 + len {
                break;
            }
            let frame: Vec<u8> = pending.drain(..2 + len).skip(2).collect();
            ctx.count.fetch_add(1, Ordering::SeqCst);
            let Some(reply) = tcp_reply(&frame, ctx) else {
                continue;
            };
            let Ok(reply_len) = u16::try_from(reply.len()) else {
                continue;
            };
            let mut out = reply_len.to_be_bytes().to_vec();
            out.extend_from_slice(&reply);
            if stream.write_all(&out).is_err() {
                return;
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) if is_timeout(&e) => {}
            Err(_) => return,
        }
    }
}

fn tcp_reply(query: &[u8], ctx: &Ctx) -> Option<Vec<u8>> {
    match &ctx.mode {
        Mode::Silent | Mode::TcpSilent { .. } => None,
        Mode::CoreDns | Mode::CoreDnsEmptyCut => coredns_reply(query, false, true),
        Mode::Rcode { code } => rcode_reply(query, *code),
        Mode::Garbage => Some(random_frame()),
        Mode::Normal { answer_v4 }
        | Mode::DropFirst { answer_v4, .. }
        | Mode::Oversize { answer_v4 }
        | Mode::Spoof { answer_v4, .. } => reply_bytes(query, *answer_v4, false),
        Mode::Delay { answer_v4, delay } => {
            if !sleep_unless_stopped(&ctx.stop, *delay) {
                return None;
            }
            reply_bytes(query, *answer_v4, false)
        }
        Mode::RcodeFor { prefix, code, .. } if asks_for(query, prefix) => rcode_reply(query, *code),
        Mode::DelayFor {
            prefix,
            delay,
            answer_v4,
        } if asks_for(query, prefix) => {
            if !sleep_unless_stopped(&ctx.stop, *delay) {
                return None;
            }
            reply_bytes(query, *answer_v4, false)
        }
        Mode::RcodeFor { answer_v4, .. }
        | Mode::DelayFor { answer_v4, .. }
        | Mode::DropAfter { answer_v4, .. } => reply_bytes(query, *answer_v4, false),
    }
}

/// The encoded reply to raw `query`, or None if it deserves no reply (it is
/// itself a response, or too short to carry an ID). With `truncate` a reply
/// larger than the client's UDP size (EDNS, else 512) becomes a TC reply;
/// without it the full reply goes out whatever its size (TCP, Oversize).
fn reply_bytes(query: &[u8], answer_v4: Ipv4Addr, truncate: bool) -> Option<Vec<u8>> {
    let msg = match Message::from_vec(query) {
        Ok(msg) => msg,
        Err(_) => return formerr(query),
    };
    if msg.message_type() == MessageType::Response {
        return None;
    }
    let limit = truncate.then(|| usize::from(msg.max_payload()));
    encode(&build_reply(&msg, answer_v4), limit)
}

/// The query's header and question with QR and `code` set and nothing else: an error reply.
fn rcode_reply(query: &[u8], code: u8) -> Option<Vec<u8>> {
    let msg = Message::from_vec(query).ok()?;
    if msg.message_type() == MessageType::Response || msg.queries().len() != 1 {
        return formerr(query);
    }
    let mut reply = Message::new();
    reply
        .set_id(msg.id())
        .set_message_type(MessageType::Response)
        .set_op_code(msg.op_code())
        .set_recursion_desired(msg.recursion_desired())
        .set_recursion_available(true)
        .set_response_code(hickory_proto::op::ResponseCode::from_low(code))
        .add_query(msg.queries()[0].clone());
    reply.to_vec().ok()
}

/// A header-only FORMERR for a datagram that does not parse, if it is long
/// enough to be a query header.
fn formerr(query: &[u8]) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 {
        return None;
    }
    let flags1 = 0x80 | (query[2] & 0x78) | (query[2] & 0x01); // QR, opcode, RD
    Some(vec![
        query[0], query[1], flags1, 0x01, // rcode FORMERR
        0, 0, 0, 0, 0, 0, 0, 0,
    ])
}

/// The reply message to a parsed query (untruncated).
fn build_reply(query: &Message, answer_v4: Ipv4Addr) -> Message {
    let mut reply = Message::new();
    reply
        .set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(query.op_code())
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true)
        .set_checking_disabled(query.checking_disabled());
    // Cloned, not rebuilt, so the name keeps the case it was received with.
    reply.add_queries(query.queries().iter().cloned());
    if let Some(edns) = query.extensions() {
        let mut opt = Edns::new();
        opt.set_max_payload(edns.max_payload().max(512))
            .set_version(0)
            .set_dnssec_ok(edns.flags().dnssec_ok);
        reply.set_edns(opt);
    }

    if query.op_code() != OpCode::Query {
        reply.set_response_code(ResponseCode::NotImp);
        return reply;
    }
    let Some(question) = query.queries().first() else {
        reply.set_response_code(ResponseCode::FormErr);
        return reply;
    };
    let lower = question.name().to_ascii().to_ascii_lowercase();
    if lower.starts_with("nx.") {
        reply.set_response_code(ResponseCode::NXDomain);
        // RFC 2308: the SOA says how long the denial may be cached: min(TTL, MINIMUM).
        let soa = SOA::new(
            Name::from_ascii("ns.test.").expect("literal"),
            Name::from_ascii("host.test.").expect("literal"),
            1,
            3600,
            600,
            86400,
            NX_SOA_MINIMUM,
        );
        reply.add_name_server(Record::from_rdata(
            question.name().clone(),
            RESPONDER_TTL,
            RData::SOA(soa),
        ));
        return reply;
    }
    if lower.starts_with("servfail.") {
        reply.set_response_code(ResponseCode::ServFail);
        return reply;
    }
    match question.query_type() {
        RecordType::A => {
            let ttl = if lower.starts_with("ttl1.") {
                1
            } else {
                RESPONDER_TTL
            };
            reply.add_answer(Record::from_rdata(
                question.name().clone(),
                ttl,
                RData::A(A(answer_v4)),
            ));
        }
        RecordType::TXT if lower.starts_with("big.") => {
            reply.add_answer(Record::from_rdata(
                question.name().clone(),
                RESPONDER_TTL,
                RData::TXT(TXT::new(big_txt_strings())),
            ));
        }
        // AAAA and everything else: NOERROR, no data.
        _ => {}
    }
    reply
}

/// Encodes `reply`; if `limit` is given and the reply exceeds it, sends
/// instead the same header and question with TC set and no records.
fn encode(reply: &Message, limit: Option<usize>) -> Option<Vec<u8>> {
    let bytes = reply.to_vec().ok()?;
    match limit {
        Some(limit) if bytes.len() > limit => {
            let mut cut = reply.clone();
            cut.take_answers();
            cut.take_name_servers();
            cut.take_additionals();
            cut.set_truncated(true);
            cut.to_vec().ok()
        }
        _ => Some(bytes),
    }
}

/// The reply of [`Mode::CoreDns`] to `query`, cut like CoreDNS over UDP (whole records while
/// they fit), or to none when not `keep`.
fn coredns_reply(query: &[u8], udp: bool, keep: bool) -> Option<Vec<u8>> {
    let msg = Message::from_vec(query).ok()?;
    if msg.message_type() != MessageType::Query {
        return None;
    }
    let question = msg.queries().first()?.clone();
    let mut reply = Message::new();
    reply
        .set_id(msg.id())
        .set_message_type(MessageType::Response)
        .set_recursion_desired(msg.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true);
    reply.add_query(question.clone());
    let limit = match msg.extensions() {
        Some(edns) => {
            let mut opt = Edns::new();
            opt.set_max_payload(1232)
                .set_dnssec_ok(edns.flags().dnssec_ok);
            reply.set_edns(opt);
            usize::from(edns.max_payload().max(512))
        }
        None => 512,
    };
    let label = question.name().iter().next().unwrap_or_default();
    let count = std::str::from_utf8(label).ok().and_then(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("many")?
            .parse::<usize>()
            .ok()
    });
    match count {
        Some(n) if question.query_type() == RecordType::A => {
            for ip in many_addresses(n) {
                reply.add_answer(Record::from_rdata(
                    question.name().clone(),
                    30,
                    RData::A(A(ip)),
                ));
            }
        }
        Some(_) => {
            reply.add_name_server(coredns_soa(question.name()));
        }
        None => {
            reply.set_response_code(ResponseCode::NXDomain);
            reply.add_name_server(coredns_soa(question.name()));
        }
    }
    let bytes = reply.to_vec().ok()?;
    if !udp || bytes.len() <= limit {
        return Some(bytes);
    }
    // miekg/dns Truncate: whole answer records while they fit, the OPT record kept, TC set.
    let answers = reply.take_answers();
    reply.take_name_servers();
    reply.set_truncated(true);
    for record in answers.into_iter().filter(|_| keep) {
        reply.add_answer(record);
        if reply.to_vec().ok()?.len() > limit {
            reply.answers_mut().pop();
            break;
        }
    }
    reply.to_vec().ok()
}

fn coredns_soa(zone: &Name) -> Record {
    let soa = SOA::new(
        Name::from_ascii("ns.test.").expect("literal"),
        Name::from_ascii("host.test.").expect("literal"),
        1,
        3600,
        600,
        86400,
        30,
    );
    Record::from_rdata(zone.base_name(), 30, RData::SOA(soa))
}
