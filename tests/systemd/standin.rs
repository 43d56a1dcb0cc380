//! The stand-in LocalDNS as a program of its own and the pods' prober, in plain `std` Rust (the
//! kit compiles it with rustc, `common::localdns::standin_program`: the systemd containers have
//! no Python, and dnsmasq cannot share a port). Its serving is the kit's own
//! (`tests/common/localdns/serve.rs`), the same the stand-in on the test's threads runs.
//!
//!   standin serve [--no-reuseport] [--delay-ms N] [--sockets N] [--cost-us N] [--for-test] NAME=IP...
//!       The stand-in LocalDNS's CoreDNS: binds UDP and TCP port 53 on 169.254.10.10 and .11 at
//!       once, --sockets of each per address (default 1; with SO_REUSEPORT, like CoreDNS, unless
//!       --no-reuseport), reads nothing for N ms (CoreDNS's start-up; default 1000), then answers
//!       A queries for the NAMEs with their IP (TTL 0; any other name NXDOMAIN; with no NAME,
//!       every name NOERROR and no record), spending --cost-us of CPU on each, and sends READY=1
//!       to $NOTIFY_SOCKET. Exits 1 when it cannot bind. --for-test: waits for a line on stdin
//!       before it binds (the test moves it into a cgroup first), then prints `ready INODE...`
//!       (its UDP sockets) and `probe` for each probe question it answers.
//!   standin probe OUT [--every-ms N] [--timeout-ms N] SERVER=NAME...
//!       The pods' view: every N ms (default 20) asks each SERVER for its NAME from a new socket
//!       (a new flow, as a pod's resolver makes), waits at most --timeout-ms (default 100), and
//!       appends `SENT_US DONE_US SERVER=NAME ANSWER` to OUT (CLOCK_MONOTONIC µs, ANSWER the first A
//!       record or `-`). Runs until OUT.stop exists.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

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

#[path = "../common/localdns/serve.rs"]
mod serving;

use serving::{LISTENERS, Serving, question};

fn serve(args: &[String]) {
    let mut reuseport = true;
    let mut delay = Duration::from_millis(1000);
    let mut sockets = 1;
    let mut cost = Duration::ZERO;
    let mut for_test = false;
    let mut records: Vec<(String, Ipv4Addr)> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--no-reuseport" => reuseport = false,
            "--delay-ms" => delay = Duration::from_millis(num(it.next())),
            "--sockets" => sockets = num(it.next()),
            "--cost-us" => cost = Duration::from_micros(num(it.next())),
            "--for-test" => for_test = true,
            rec => {
                let (name, ip) = rec.split_once('=').expect("NAME=IP");
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                records.push((name, ip.parse().expect("an IPv4 address")));
            }
        }
    }
    if for_test {
        // Moved into its cgroup by the test before it makes a socket.
        std::io::stdin().read_line(&mut String::new()).expect("the go line");
    }
    let serving = std::sync::Arc::new(Serving {
        records,
        cost,
        report_probes: for_test,
        ..Serving::default()
    });
    let mut bound = Vec::new();
    for addr in LISTENERS {
        for _ in 0..sockets {
            match serving::bind_listener(SocketAddrV4::new(addr, 53), reuseport, 128) {
                Ok(pair) => bound.push(pair),
                Err(e) => {
                    eprintln!("stand-in CoreDNS: listen {addr}:53: bind: {e}");
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
    let inodes: Vec<String> = bound
        .iter()
        .map(|(udp, _)| serving::inode(udp).to_string())
        .collect();
    let mut threads = Vec::new();
    for (udp, tcp) in bound {
        let s = serving.clone();
        threads.push(std::thread::spawn(move || serving::serve_udp(udp, s)));
        let s = serving.clone();
        threads.push(std::thread::spawn(move || serving::serve_tcp(tcp, s)));
    }
    notify("READY=1\nSTATUS=serving 169.254.10.10 and 169.254.10.11");
    eprintln!("stand-in CoreDNS: serving");
    if for_test {
        println!("ready {}", inodes.join(" "));
        // The test's word: `hang` blocks every UDP loop, `serve` lets them answer again.
        let s = serving.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lines().map_while(Result::ok) {
                let hung = line == "hang";
                s.hung.store(hung, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }
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
