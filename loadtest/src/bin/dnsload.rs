//! dnsload: the harness's DNS load generator.
//!
//! ```text
//! dnsload run --server IP:PORT [--tcp] [--names miss|hit|mix|mixNN] [--channels N]
//!             (--outstanding N | --rate QPS[:SECS][,QPS:SECS...]) [--duration SECS] [--warmup SECS]
//!             [--timeout SECS] [--slow-ms MS] [--watch-pid PID] [--also-pid PID]...
//!             [--event-at SECS --event-cmd CMD]
//!             [--timeline] [--bucket-ms MS] [--threads N] [--label KEY=VALUE]...
//! dnsload dnsperf --datafile FILE  (the same options: runs Debian's dnsperf instead, same JSON)
//! dnsload names --names SET --count N [--seed N]     query file for dnsperf on stdout
//! dnsload probe --server IP:PORT [--tcp] [--wait SECS]   exit 0 once the server answers
//! dnsload count --server IP:PORT      the query count of the harness's responder there
//! dnsload stale --server IP:PORT [--count N] [--expire-wait SECS] [--rounds N]
//!               [--interval SECS] [--timeout SECS] --event-cmd CMD [--label KEY=VALUE]...
//! ```
//!
//! `stale` measures serving stale answers through an outage: it asks `--count` fresh names once
//! (the system caches them), waits `--expire-wait` (they expire), runs `--event-cmd` (which takes
//! every upstream down), then asks all the names again `--rounds` times, a round every
//! `--interval` (or when the previous one is done): round 1 is each name's first lookup during
//! the outage, the others the following ones.
//!
//! `run` prints one JSON line: the labels, what was asked, then the figures (see
//! `loadtest/README.md`). `--outstanding N` is a closed loop (saturation); `--rate` an open loop
//! at a fixed rate, or a profile of steps. Replies are matched by socket, ID and question;
//! latency runs from just before the send call to the kernel's receive timestamp (UDP).

use loadtest::names::{NameSet, Names};
use loadtest::outcome::{Proto, RunSpec, Schedule, TransportStats};
use loadtest::pace::{Load, Pacer};
use loadtest::track::{Expect, Tracker};
use loadtest::{dns, now_ns, procfs, tcp, udp};
use serde_json::{Value, json};
use std::io::{BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => cmd_run(&args[1..]),
        Some("dnsperf") => cmd_dnsperf(&args[1..]),
        Some("names") => cmd_names(&args[1..]),
        Some("probe") => cmd_probe(&args[1..]),
        Some("count") => cmd_count(&args[1..]),
        Some("stale") => cmd_stale(&args[1..]),
        _ => Err("usage: dnsload run|dnsperf|names|probe|count|stale [OPTIONS] (see the source's header or loadtest/README.md)".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dnsload: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The options of `run` and `dnsperf`, and the few of the other commands.
struct Opts {
    spec: RunSpec,
    datafile: Option<String>,
    count: u64,
    wait_s: f64,
    expire_wait_s: f64,
    rounds: u64,
    interval_s: f64,
    event_cmd: Option<String>,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut server: Option<SocketAddr> = None;
    let mut proto = Proto::Udp;
    let mut names = NameSet::Miss;
    let mut expect = Expect::Derived;
    let mut channels = 8;
    let mut outstanding: Option<u64> = None;
    let mut rate: Option<String> = None;
    let mut duration_s = 5.0;
    let mut warmup_s = 1.0;
    let mut timeout_s = 1.0;
    let mut slow_ms = 100.0;
    let mut watch_pid = None;
    let mut also_pids = Vec::new();
    let mut event_at = None;
    let mut event_cmd = None;
    let mut timeline = false;
    let mut bucket_ms = 100;
    let mut threads = 1;
    let mut labels = Vec::new();
    let mut datafile = None;
    let mut count = 1_000_000;
    let mut wait_s = 10.0;
    let mut expire_wait_s = 6.0;
    let mut rounds = 6;
    let mut interval_s = 0.5;
    let mut seed = now_ns() ^ u64::from(std::process::id()) << 32;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        fn num<T: std::str::FromStr>(name: &str, v: String) -> Result<T, String> {
            v.parse().map_err(|_| format!("bad value {v:?} for {name}"))
        }
        match a.as_str() {
            "--server" => server = Some(num("--server", val(a)?)?),
            "--tcp" => proto = Proto::Tcp,
            "--udp" => proto = Proto::Udp,
            "--names" => names = NameSet::parse(&val(a)?)?,
            "--expect" => expect = Expect::parse(&val(a)?)?,
            "--channels" => channels = num(a, val(a)?)?,
            "--outstanding" => outstanding = Some(num(a, val(a)?)?),
            "--rate" => rate = Some(val(a)?),
            "--duration" => duration_s = num(a, val(a)?)?,
            "--warmup" => warmup_s = num(a, val(a)?)?,
            "--timeout" => timeout_s = num(a, val(a)?)?,
            "--slow-ms" => slow_ms = num(a, val(a)?)?,
            "--watch-pid" => watch_pid = Some(num(a, val(a)?)?),
            "--also-pid" => also_pids.push(num(a, val(a)?)?),
            "--event-at" => event_at = Some(num::<f64>(a, val(a)?)?),
            "--event-cmd" => event_cmd = Some(val(a)?),
            "--timeline" => timeline = true,
            "--bucket-ms" => bucket_ms = num(a, val(a)?)?,
            "--threads" => threads = num(a, val(a)?)?,
            "--label" => {
                let v = val(a)?;
                let (k, v) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--label wants KEY=VALUE, not {v:?}"))?;
                labels.push((k.to_string(), v.to_string()));
            }
            "--datafile" => datafile = Some(val(a)?),
            "--count" => count = num(a, val(a)?)?,
            "--wait" => wait_s = num(a, val(a)?)?,
            "--expire-wait" => expire_wait_s = num(a, val(a)?)?,
            "--rounds" => rounds = num(a, val(a)?)?,
            "--interval" => interval_s = num(a, val(a)?)?,
            "--seed" => seed = num(a, val(a)?)?,
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    let load = match (outstanding, rate) {
        (Some(_), Some(_)) => {
            return Err("give --outstanding (closed loop) or --rate (open loop), not both".into());
        }
        (Some(n), None) => Load::Closed {
            outstanding: n.max(1),
        },
        (None, Some(r)) => Load::parse_rate(&r, warmup_s + duration_s)?,
        (None, None) => Load::Closed { outstanding: 100 },
    };
    let event = match (event_at, event_cmd.clone()) {
        (Some(t), Some(c)) => Some((t, c)),
        (None, _) => None,
        _ => return Err("--event-at needs --event-cmd".into()),
    };
    if channels == 0 {
        return Err("--channels must be at least 1".into());
    }
    let spec = RunSpec {
        server: server.unwrap_or_else(|| "127.0.0.1:53".parse().expect("literal")),
        proto,
        names,
        expect,
        channels,
        load,
        warmup_s,
        duration_s,
        timeout_s,
        slow_ms,
        watch_pid,
        also_pids,
        event,
        timeline,
        bucket_ms,
        threads,
        labels,
        seed,
    };
    Ok(Opts {
        spec,
        datafile,
        count,
        wait_s,
        expire_wait_s,
        rounds,
        interval_s,
        event_cmd,
    })
}

fn cmd_run(args: &[String]) -> Result<(), String> {
    let Opts { spec, .. } = parse(args)?;
    let threads = spec.threads.clamp(1, spec.channels);
    let start = now_ns() + 20_000_000; // after every thread has opened its sockets
    let mut sched = Schedule::new(&spec, start);
    let mut handles = Vec::new();
    for i in 1..threads {
        let (spec, sched) = (spec.clone(), sched.silent_copy());
        handles.push(std::thread::spawn(move || {
            generate(&spec, i, threads, sched)
        }));
    }
    let first = generate_with(&spec, 0, threads, &mut sched);
    let (mut tracker, mut unsent, mut transport) = first?;
    for h in handles {
        let (t, u, tr) = h
            .join()
            .map_err(|_| "a generator thread panicked".to_string())??;
        tracker.merge(&t);
        unsent += u;
        transport.add(&tr);
    }
    sched.finish();
    let line = loadtest::outcome::to_json(&spec, &sched, &tracker, unsent, transport);
    eprintln!("{}", loadtest::outcome::summary(&line));
    println!("{line}");
    Ok(())
}

type ThreadResult = Result<(Tracker, u64, TransportStats), String>;

fn generate(spec: &RunSpec, i: usize, n: usize, mut sched: Schedule) -> ThreadResult {
    generate_with(spec, i, n, &mut sched)
}

/// Thread `i` of `n`: its share of the channels and of the load, on the common clock.
fn generate_with(spec: &RunSpec, i: usize, n: usize, sched: &mut Schedule) -> ThreadResult {
    loadtest::net::tight_timer_slack();
    let channels = spec.channels / n + usize::from(i < spec.channels % n);
    let mut mine = spec.clone();
    mine.channels = channels;
    let seed = spec.seed.wrapping_add(i as u64 * 0x9e37_79b9_7f4a_7c15);
    let names = Names::new(spec.names, seed);
    let slow_ns = (spec.slow_ms * 1e6) as u64;
    let mut tracker = Tracker::new(
        channels,
        names,
        spec.expect,
        (spec.timeout_s * 1e9) as u64,
        slow_ns,
        seed,
    );
    tracker.bucket_ns = spec.bucket_ms.max(1) * 1_000_000;
    tracker.start_ns = sched.start_ns;
    if let Some((at, _)) = &spec.event {
        tracker.fault_from_ns = sched.start_ns + (at * 1e9) as u64;
    }
    tracker.window = sched.window;
    let socks = match spec.proto {
        Proto::Udp => udp::open(&mine)
            .map_err(|e| format!("cannot open UDP sockets to {}: {e}", spec.server))?,
        Proto::Tcp => Vec::new(),
    };
    // Wait for the common start.
    let wait = sched.start_ns.saturating_sub(now_ns());
    std::thread::sleep(Duration::from_nanos(wait));
    let mut pacer = Pacer::new(spec.load.share(i as u64, n as u64), sched.start_ns);
    let transport = match spec.proto {
        Proto::Udp => udp::run(socks, &mut tracker, &mut pacer, sched),
        Proto::Tcp => tcp::run(&mine, &mut tracker, &mut pacer, sched),
    }
    .map_err(|e| format!("talking to {}: {e}", spec.server))?;
    Ok((tracker, pacer.unsent, transport))
}

fn cmd_names(args: &[String]) -> Result<(), String> {
    let Opts { spec, count, .. } = parse(args)?;
    let mut names = Names::new(spec.names, spec.seed);
    let out = std::io::stdout();
    let mut w = BufWriter::new(out.lock());
    for _ in 0..count {
        let k = names.next_key();
        writeln!(w, "{} A", names.text(k)).map_err(|e| e.to_string())?;
    }
    w.flush().map_err(|e| e.to_string())
}

/// Asks `probe.load.test. A` every 100 ms until any reply comes back or `--wait` runs out.
fn cmd_probe(args: &[String]) -> Result<(), String> {
    let Opts { spec, wait_s, .. } = parse(args)?;
    let name = dns::encode_name("probe.load.test").expect("literal");
    let deadline = Instant::now() + Duration::from_secs_f64(wait_s);
    let mut q = [0u8; 512];
    let mut last_err = String::from("no reply");
    let mut id: u16 = 1;
    while Instant::now() < deadline {
        id = id.wrapping_add(1);
        let len = dns::write_query(&mut q, id, &name, dns::TYPE_A).expect("fits");
        let r = match spec.proto {
            Proto::Udp => probe_udp(spec.server, &q[..len]),
            Proto::Tcp => probe_tcp(spec.server, &q[..len]),
        };
        match r {
            Ok(reply) if dns::reply_head(&reply).is_some_and(|h| h.id == id) => return Ok(()),
            Ok(_) => last_err = "a reply that did not match".into(),
            Err(e) => last_err = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "{} did not answer within {wait_s} s ({last_err})",
        spec.server
    ))
}

/// Prints the number of queries the harness's responder at `--server` has received.
fn cmd_count(args: &[String]) -> Result<(), String> {
    let Opts { spec, .. } = parse(args)?;
    let name = dns::encode_name(dns::STATS_NAME).expect("literal");
    let mut q = [0u8; 512];
    let mut last_err = String::from("no reply");
    for id in 1..=5u16 {
        let len = dns::write_query(&mut q, id, &name, dns::TYPE_A).expect("fits");
        match probe_udp(spec.server, &q[..len]) {
            Ok(r) if dns::reply_head(&r).is_some_and(|h| h.id == id) && r.len() >= 4 => {
                let n = u32::from_be_bytes([
                    r[r.len() - 4],
                    r[r.len() - 3],
                    r[r.len() - 2],
                    r[r.len() - 1],
                ]);
                println!("{n}");
                return Ok(());
            }
            Ok(_) => last_err = "a reply that did not match".into(),
            Err(e) => last_err = e.to_string(),
        }
    }
    Err(format!(
        "{} did not tell its query count ({last_err})",
        spec.server
    ))
}

/// What became of one query of `ask_all`.
#[derive(Clone, Copy, Debug)]
enum Fate {
    Good(Duration),
    /// Answered, but not with the upstream's answer (rcode or record).
    Error(Duration),
    Lost,
}

/// Sends one A query for each of `names` at once on `sock` (connected to the server) and waits up
/// to `timeout` for the replies.
fn ask_all(
    sock: &UdpSocket,
    names: &[Vec<u8>],
    base_id: u16,
    expect: Expect,
    timeout: Duration,
) -> std::io::Result<Vec<Fate>> {
    let mut fates = vec![Fate::Lost; names.len()];
    let mut q = [0u8; 512];
    let t0 = Instant::now();
    for (i, n) in names.iter().enumerate() {
        let len =
            dns::write_query(&mut q, base_id.wrapping_add(i as u16), n, dns::TYPE_A).expect("fits");
        sock.send(&q[..len])?;
    }
    let deadline = t0 + timeout;
    let mut left = names.len();
    let mut buf = vec![0u8; 4096];
    while left > 0 {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        sock.set_read_timeout(Some(deadline - now))?;
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break;
            }
            // ICMP errors of an earlier query: nothing to match.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => continue,
            Err(e) => return Err(e),
        };
        let msg = &buf[..n];
        let Some(head) = dns::reply_head(msg) else {
            continue;
        };
        let i = head.id.wrapping_sub(base_id) as usize;
        if i >= names.len() || !matches!(fates[i], Fate::Lost) || !dns::question_is(msg, &names[i])
        {
            continue;
        }
        let q_end = dns::HEADER + names[i].len() + 4;
        let took = t0.elapsed();
        let good = head.rcode == dns::RCODE_NOERROR
            && msg.len() >= q_end
            && dns::has_a(msg, q_end, expect.address(&names[i]));
        fates[i] = if good {
            Fate::Good(took)
        } else {
            Fate::Error(took)
        };
        left -= 1;
    }
    Ok(fates)
}

/// Counts and latency percentiles of a set of fates, into `m` with `prefix`.
fn fate_figures(m: &mut serde_json::Map<String, Value>, prefix: &str, fates: &[Fate]) {
    let mut lat: Vec<f64> = Vec::new();
    let (mut good, mut errors, mut lost) = (0, 0, 0);
    for f in fates {
        match f {
            Fate::Good(d) => {
                good += 1;
                lat.push(d.as_secs_f64() * 1e6);
            }
            Fate::Error(d) => {
                errors += 1;
                lat.push(d.as_secs_f64() * 1e6);
            }
            Fate::Lost => lost += 1,
        }
    }
    m.insert(format!("{prefix}_asked"), json!(fates.len()));
    m.insert(format!("{prefix}_good"), json!(good));
    m.insert(format!("{prefix}_errors"), json!(errors));
    m.insert(format!("{prefix}_lost"), json!(lost));
    lat.sort_by(f64::total_cmp);
    if !lat.is_empty() {
        let q = |q: f64| lat[((q * lat.len() as f64).ceil() as usize).clamp(1, lat.len()) - 1];
        m.insert(format!("{prefix}_p50_us"), json!(q(0.5).round()));
        m.insert(format!("{prefix}_p99_us"), json!(q(0.99).round()));
        m.insert(format!("{prefix}_max_us"), json!(q(1.0).round()));
    }
}

fn cmd_stale(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let spec = &o.spec;
    let cmd = o
        .event_cmd
        .clone()
        .ok_or("stale needs --event-cmd (what takes the upstreams down)")?;
    let n = o.count.clamp(1, 1000) as usize;
    // Fresh names for this run: no cache has seen them.
    let mut names_gen = Names::new(NameSet::Miss, spec.seed);
    let names: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            let mut w = [0u8; 64];
            let k = names_gen.next_key();
            let len = names_gen.write_wire(k, &mut w);
            w[..len].to_vec()
        })
        .collect();
    let sock = UdpSocket::bind(if spec.server.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })
    .and_then(|s| s.connect(spec.server).map(|_| s))
    .map_err(|e| format!("cannot open a socket to {}: {e}", spec.server))?;
    let timeout = Duration::from_secs_f64(spec.timeout_s);
    let io = |e: std::io::Error| format!("talking to {}: {e}", spec.server);
    let mut m = serde_json::Map::new();
    for (k, v) in &spec.labels {
        m.insert(k.clone(), json!(v));
    }
    m.insert("generator".into(), json!("dnsload stale"));
    m.insert("server".into(), json!(spec.server.to_string()));
    let mut id = spec.seed as u16;
    let fill = ask_all(&sock, &names, id, spec.expect, timeout).map_err(io)?;
    fate_figures(&mut m, "fill", &fill);
    std::thread::sleep(Duration::from_secs_f64(o.expire_wait_s));
    m.insert("expire_wait_s".into(), json!(o.expire_wait_s));
    let status = Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .status()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !status.success() {
        return Err(format!("the event command {cmd:?} failed ({status})"));
    }
    let t0 = Instant::now();
    let mut first = Vec::new();
    let mut next = Vec::new();
    let mut round_max = Vec::new();
    for r in 0..o.rounds.max(1) {
        let due = t0 + Duration::from_secs_f64(o.interval_s * r as f64);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        id = id.wrapping_add(n as u16);
        let fates = ask_all(&sock, &names, id, spec.expect, timeout).map_err(io)?;
        let worst = fates
            .iter()
            .map(|f| match f {
                Fate::Good(d) | Fate::Error(d) => d.as_secs_f64() * 1e3,
                Fate::Lost => f64::INFINITY,
            })
            .fold(0.0, f64::max);
        round_max.push(if worst.is_finite() {
            json!((worst * 10.0).round() / 10.0)
        } else {
            json!("lost")
        });
        if r == 0 {
            first = fates;
        } else {
            next.extend(fates);
        }
    }
    fate_figures(&mut m, "first", &first);
    fate_figures(&mut m, "next", &next);
    m.insert("rounds".into(), json!(o.rounds.max(1)));
    m.insert("interval_s".into(), json!(o.interval_s));
    m.insert("round_max_ms".into(), Value::Array(round_max));
    let line = Value::Object(m);
    eprintln!(
        "    {:24} stale: fill good {}/{}  first lookups: good {} p50 {}us max {}us  next: good {}/{} p99 {}us max {}us",
        line["system"].as_str().unwrap_or("-"),
        line["fill_good"],
        n,
        line["first_good"],
        line["first_p50_us"],
        line["first_max_us"],
        line["next_good"],
        line["next_asked"],
        line["next_p99_us"],
        line["next_max_us"]
    );
    println!("{line}");
    Ok(())
}

fn probe_udp(server: SocketAddr, q: &[u8]) -> std::io::Result<Vec<u8>> {
    let bind = if server.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let s = UdpSocket::bind(bind)?;
    s.connect(server)?;
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    s.send(q)?;
    let mut buf = vec![0u8; 4096];
    let n = s.recv(&mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

fn probe_tcp(server: SocketAddr, q: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&server, Duration::from_millis(200))?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(q);
    s.write_all(&framed)?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len)?;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

/// Runs dnsperf with the same load and prints the same JSON line. Closed loop: `-q N`; open loop:
/// `-Q QPS` (dnsperf paces, with up to 65,535 outstanding) and `-v`, whose per-query lines give
/// the latency percentiles. dnsperf has no warm-up: the window is the whole run, and its
/// latencies are taken in user space.
fn cmd_dnsperf(args: &[String]) -> Result<(), String> {
    let Opts { spec, datafile, .. } = parse(args)?;
    let datafile = datafile.ok_or("dnsperf needs --datafile (make one with `dnsload names`)")?;
    let secs = spec.send_secs();
    let mut cmd = Command::new("dnsperf");
    cmd.args([
        "-s",
        &spec.server.ip().to_string(),
        "-p",
        &spec.server.port().to_string(),
    ])
    .args(["-d", &datafile, "-c", &spec.channels.to_string()])
    .args([
        "-l",
        &format!("{secs}"),
        "-t",
        &format!("{}", spec.timeout_s),
    ])
    .args([
        "-m",
        if spec.proto == Proto::Tcp {
            "tcp"
        } else {
            "udp"
        },
    ]);
    let open = match &spec.load {
        Load::Closed { outstanding } => {
            cmd.args(["-q", &outstanding.to_string()]);
            false
        }
        Load::Open { steps } => {
            if steps.len() != 1 {
                return Err("with dnsperf the rate must be one number (no profile)".into());
            }
            cmd.args(["-Q", &format!("{}", steps[0].0), "-q", "65535", "-v"]);
            true
        }
    };
    if spec.event.is_some() {
        return Err("--event-at needs dnsload's own engine (dnsload run)".into());
    }
    let before = procfs::snapshot(spec.watch_pid, &spec.also_pids);
    let t0 = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run dnsperf: {e} (install the dnsperf package)"))?;
    let elapsed = t0.elapsed().as_secs_f64();
    let after = procfs::snapshot(spec.watch_pid, &spec.also_pids);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "dnsperf failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let line = dnsperf_json(&spec, &text, open, before, after, elapsed)?;
    eprintln!("{}", loadtest::outcome::summary(&line));
    println!("{line}");
    Ok(())
}

fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix(key))
        .map(str::trim)
}

fn first_num(s: Option<&str>) -> Option<f64> {
    s?.split_whitespace().next()?.parse().ok()
}

fn dnsperf_json(
    spec: &RunSpec,
    text: &str,
    open: bool,
    before: procfs::Snapshot,
    after: procfs::Snapshot,
    elapsed: f64,
) -> Result<Value, String> {
    let sent = first_num(field(text, "Queries sent:"))
        .ok_or_else(|| format!("no 'Queries sent' in dnsperf's output:\n{text}"))?;
    let completed = first_num(field(text, "Queries completed:")).unwrap_or(0.0);
    let lost = first_num(field(text, "Queries lost:")).unwrap_or(0.0);
    let run_s = first_num(field(text, "Run time (s):")).unwrap_or(elapsed);
    let qps = first_num(field(text, "Queries per second:")).unwrap_or(completed / run_s);
    // "Response codes:       NOERROR 99999 (100.00%), SERVFAIL 1 (0.00%)"
    let mut rcodes = serde_json::Map::new();
    if let Some(codes) = field(text, "Response codes:") {
        for part in codes.split(',') {
            let mut w = part.split_whitespace();
            if let (Some(name), Some(n)) = (w.next(), w.next().and_then(|n| n.parse::<u64>().ok()))
            {
                rcodes.insert(name.to_lowercase(), json!(n));
            }
        }
    }
    let count = |k: &str| rcodes.get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut m = serde_json::Map::new();
    for (k, v) in &spec.labels {
        m.insert(k.clone(), json!(v));
    }
    m.insert("generator".into(), json!("dnsperf"));
    m.insert("expect".into(), json!("rcode NOERROR (dnsperf)"));
    m.insert(
        "proto".into(),
        json!(if spec.proto == Proto::Udp {
            "udp"
        } else {
            "tcp"
        }),
    );
    m.insert("server".into(), json!(spec.server.to_string()));
    m.insert("mode".into(), json!(if open { "open" } else { "closed" }));
    m.insert(
        "names".into(),
        json!(format!("{:?}", spec.names).to_lowercase()),
    );
    m.insert("channels".into(), json!(spec.channels));
    match &spec.load {
        Load::Closed { outstanding } => m.insert("outstanding".into(), json!(outstanding)),
        Load::Open { steps } => m.insert(
            "rate".into(),
            json!(
                steps
                    .iter()
                    .map(|s| format!("{}:{}", s.0, s.1))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        ),
    };
    m.insert("window_s".into(), json!(run_s));
    // dnsperf reports rcodes only: NOERROR is the best it can tell (the record is not checked;
    // the harness's forwarding check before each measurement covers a system answering alone).
    let ok = count("noerror") as f64;
    let good_share = if completed > 0.0 { ok / completed } else { 0.0 };
    m.insert("qps".into(), json!((qps * good_share).round()));
    m.insert("replies_qps".into(), json!(qps.round()));
    m.insert("offered_qps".into(), json!((sent / run_s).round()));
    m.insert("sent".into(), json!(sent as u64));
    m.insert("answered".into(), json!(completed as u64));
    m.insert("good".into(), json!(ok as u64));
    m.insert("lost".into(), json!(lost as u64));
    for k in ["noerror", "nxdomain", "servfail", "refused"] {
        m.insert(k.into(), json!(count(k)));
    }
    let pct = |a: f64| {
        if sent > 0.0 {
            (a * 100.0 / sent * 1000.0).round() / 1000.0
        } else {
            0.0
        }
    };
    m.insert("loss_pct".into(), json!(pct(lost)));
    m.insert("error_pct".into(), json!(pct(completed - ok)));
    m.insert("shed_pct".into(), json!(pct(count("refused") as f64)));
    if let Some(avg) = field(text, "Average Latency (s):") {
        if let Some(mean) = first_num(Some(avg)) {
            m.insert("mean_us".into(), json!((mean * 1e7).round() / 10.0));
        }
        if let Some(max) = avg
            .split("max ")
            .nth(1)
            .and_then(|s| s.trim_end_matches(')').parse::<f64>().ok())
        {
            m.insert("max_us".into(), json!((max * 1e7).round() / 10.0));
        }
    }
    if open {
        // Verbose lines end with the latency in seconds: "> NOERROR name A 0.000123".
        let mut lat: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with("> "))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .collect();
        lat.sort_by(f64::total_cmp);
        if !lat.is_empty() {
            for (k, q) in [
                ("p50_us", 0.5),
                ("p90_us", 0.9),
                ("p99_us", 0.99),
                ("p999_us", 0.999),
            ] {
                let i = ((q * lat.len() as f64).ceil() as usize).clamp(1, lat.len()) - 1;
                m.insert(k.into(), json!((lat[i] * 1e7).round() / 10.0));
            }
        }
    }
    if let (Some(a), Some(b)) = (before.pid_cpu_ns, after.pid_cpu_ns) {
        let cpu = b.saturating_sub(a) as f64;
        m.insert(
            "cpu_us_per_query".into(),
            json!((cpu / completed.max(1.0) / 100.0).round() / 10.0),
        );
        m.insert(
            "cpu_pct".into(),
            json!((cpu / (elapsed * 1e9) * 1000.0).round() / 10.0),
        );
    }
    if let Some((busy, other)) = procfs::machine_shares(&before, &after) {
        m.insert("machine_busy_pct".into(), json!(busy));
        m.insert("other_load_pct".into(), json!(other));
    }
    if let Some(pid) = spec.watch_pid {
        if let Some(v) = procfs::status_kib(pid, "VmHWM") {
            m.insert("rss_peak_kib".into(), json!(v));
        }
        if let Some(v) = procfs::status_kib(pid, "VmRSS") {
            m.insert("rss_kib".into(), json!(v));
        }
    }
    Ok(Value::Object(m))
}
