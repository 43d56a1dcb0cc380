//! `localdns-fallback status`: who answers the node's DNS, in the contract of node-problem-
//! detector's custom plugin monitor (exit 0 OK, 1 NonOK, 2 Unknown; the first line of stdout is
//! the message).
//!
//! It asks LocalDNS's probe name on both listeners, as LocalDNS's own probe does (while the
//! standby holds the flows that name still reaches LocalDNS's sockets, see `listen`; a fallback
//! that holds them alone answers it). An answer cannot tell LocalDNS from a fallback, so the
//! fallbacks are asked too:
//! every `localdns-fallback` daemon of this network namespace serving these listeners is found in
//! /proc by its command line, which also names its `--metrics` address, and its `/metrics` say
//! whether it holds the flows and since when. The daemon writes no file (Landlock), so nothing
//! it published can outlive it; and a fallback whose metrics cannot be read makes the answer
//! Unknown, never OK.
//!
//! `status --ready` asks the standby found so its `/ready`: whether it could serve each upstream
//! group if LocalDNS failed now (exit 0), which could not and why (1), or nothing to ask (2).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use crate::cli::{self, Command, Config};
use crate::discover::tool::side_by_side;
use crate::flows::Cause;
use crate::metrics::{ago, utc};
use crate::roles::ListenerRole;
use crate::standby::probe::{Prober, Seen};
use crate::stats::unix_secs;

/// Rounds asked of each listener; one answer is enough, as for LocalDNS's own probe.
const ROUNDS: u32 = 3;
const WAIT: Duration = Duration::from_millis(500);
/// Between rounds: an unreachable listener fails a round at once, and a restart gap is short.
const PAUSE: Duration = Duration::from_millis(100);
/// A fallback's `/metrics` must answer within this (it serves them from tasks of their own).
const SCRAPE: Duration = Duration::from_secs(2);
const SCRAPE_MAX: u64 = 1 << 20;

/// What node-problem-detector makes of the exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// LocalDNS serves.
    Ok = 0,
    /// A fallback holds the flows, or nothing answers.
    NonOk = 1,
    /// Cannot tell.
    Unknown = 2,
}

/// Looks, prints the one line and returns the exit status; with `ready`, of whether the standby
/// could serve (see `ready`).
pub fn report(config: &Config, ready: bool) -> ExitCode {
    let listeners = config.listeners();
    let (verdict, line) = match ready.then_some(()).ok_or_else(|| look(listeners)) {
        Ok(()) => self::ready(listeners),
        Err(Ok(look)) => judge(&look, listeners, SystemTime::now()),
        Err(Err(e)) => (Verdict::Unknown, format!("cannot tell who answers: {e}")),
    };
    println!("{line}");
    ExitCode::from(verdict as u8)
}

/// What a fallback's `/metrics` say.
#[derive(Debug, PartialEq)]
struct Published {
    /// Per listener, node first.
    holding: [bool; 2],
    /// The last takeover, seconds since the Unix epoch (0: never).
    since: f64,
    /// The cause of the takeover in force.
    cause: Option<Cause>,
}

/// Everything looked at: whether each listener answered, and each fallback by name with what
/// it says.
struct Look {
    answered: [bool; 2],
    daemons: Vec<(String, Result<Published, String>)>,
}

fn look(listeners: [SocketAddr; 2]) -> Result<Look, String> {
    let (node, cluster) = side_by_side(|| answers(listeners[0]), || answers(listeners[1]));
    let answered = [node?, cluster?];
    let daemons = daemons(&listeners)?
        .into_iter()
        .map(|(name, metrics)| {
            let said = scrape(metrics, "/metrics").and_then(|(_, text)| published(&text));
            (name, said)
        })
        .collect();
    Ok(Look { answered, daemons })
}

fn answers(addr: SocketAddr) -> Result<bool, String> {
    let mut prober = Prober::new(&[addr], rand::random())
        .map_err(|e| format!("cannot make a socket to ask {addr}: {e}"))?;
    Ok((0..ROUNDS).any(|round| {
        if round > 0 {
            std::thread::sleep(PAUSE);
        }
        prober.ask(WAIT) == Seen::Serving
    }))
}

/// The `localdns-fallback` daemons in /proc that serve one of `listeners` in our network
/// namespace (tests and nodes may run others elsewhere, on the same addresses): each one's name
/// for the status line, and its `--metrics` address.
fn daemons(listeners: &[SocketAddr; 2]) -> Result<Vec<(String, Option<SocketAddr>)>, String> {
    let ours = std::fs::read_link("/proc/self/ns/net")
        .map_err(|e| format!("cannot read our network namespace: {e}"))?;
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").map_err(|e| format!("cannot list /proc: {e}"))? {
        let Some(pid) = entry
            .ok()
            .and_then(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me)
        else {
            continue;
        };
        // A process that ended meanwhile has no command line, and so is no daemon.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let Some(config) = daemon_config(&cmdline).filter(|c| serves(c, listeners)) else {
            continue;
        };
        match std::fs::read_link(format!("/proc/{pid}/ns/net")) {
            Ok(ns) if ns != ours => continue,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(format!(
                    "cannot read the network namespace of localdns-fallback (pid {pid}): {e}"
                ));
            }
        }
        let standby = if config.standby { " --standby" } else { "" };
        found.push((
            format!("localdns-fallback{standby} (pid {pid})"),
            config.metrics,
        ));
    }
    Ok(found)
}

/// The configuration of a serving `localdns-fallback` from its command line; None for any other
/// process, and for our subcommands, which serve nothing.
fn daemon_config(cmdline: &[u8]) -> Option<Config> {
    let cmdline = cmdline.strip_suffix(&[0]).unwrap_or(cmdline);
    let mut args = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned());
    let program = args.next()?;
    if Path::new(&program).file_name()? != "localdns-fallback" {
        return None;
    }
    match cli::parse(args) {
        Ok(Command::Run(config)) => Some(*config),
        _ => None,
    }
}

/// Does a daemon run with `c` serve one of `listeners`? Port 0 (tests) is whatever the kernel
/// picked, so the address decides.
fn serves(c: &Config, listeners: &[SocketAddr; 2]) -> bool {
    c.listeners().iter().any(|l| {
        listeners
            .iter()
            .any(|o| l.ip() == o.ip() && (l.port() == o.port() || l.port() == 0))
    })
}

/// GET `path` from a daemon's metrics server: the body of a 200 (true) or 503 (false) answer.
fn scrape(addr: Option<SocketAddr>, path: &str) -> Result<(bool, String), String> {
    let addr = addr.ok_or("serves these listeners without --metrics")?;
    let cannot = |e: std::io::Error| format!("its metrics at {addr} cannot be read: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, SCRAPE).map_err(cannot)?;
    stream.set_read_timeout(Some(SCRAPE)).map_err(cannot)?;
    stream.set_write_timeout(Some(SCRAPE)).map_err(cannot)?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .map_err(cannot)?;
    let mut response = Vec::new();
    stream
        .take(SCRAPE_MAX)
        .read_to_end(&mut response)
        .map_err(cannot)?;
    let response = String::from_utf8_lossy(&response);
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200 ") => Ok((true, body.to_string())),
        Some((head, body)) if head.starts_with("HTTP/1.1 503 ") => Ok((false, body.to_string())),
        _ => Err(format!(
            "its metrics at {addr} answered {:?}",
            response.lines().next().unwrap_or("nothing")
        )),
    }
}

/// Reads the takeover series out of a `/metrics` text.
fn published(text: &str) -> Result<Published, String> {
    let value = |series: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    let mut holding = [false; 2];
    for (held, l) in holding.iter_mut().zip(ListenerRole::BOTH) {
        let series = format!(
            "localdns_fallback_holding_flows{{listener=\"{}\"}}",
            l.name()
        );
        *held = value(&series)
            .ok_or("its metrics have no localdns_fallback_holding_flows (an older version?)")?
            == 1.0;
    }
    let by_cause = |total: &str, c: Cause| {
        value(&format!(
            "localdns_fallback_{total}{{cause=\"{}\"}}",
            c.label()
        ))
        .unwrap_or(0.0)
    };
    Ok(Published {
        holding,
        since: value("localdns_fallback_last_takeover_timestamp_seconds").unwrap_or(0.0),
        cause: Cause::ALL
            .into_iter()
            .find(|&c| by_cause("takeovers_total", c) > by_cause("handbacks_total", c)),
    })
}

/// The verdict and its line, from what was seen at `now`.
fn judge(look: &Look, listeners: [SocketAddr; 2], now: SystemTime) -> (Verdict, String) {
    // The listeners whose flag is `set`, joined by "and" ("" for none).
    let which = |flags: [bool; 2], set: bool| {
        let named: Vec<String> = listeners
            .iter()
            .zip(flags)
            .filter(|(_, f)| *f == set)
            .map(|(l, _)| l.to_string())
            .collect();
        named.join(" and ")
    };
    let silent = which(look.answered, false);
    let now = unix_secs(now);
    for (daemon, said) in &look.daemons {
        let Ok(p) = said else { continue };
        if !p.holding.contains(&true) {
            continue;
        }
        let mut line = format!(
            "LocalDNS is on its fallback: {daemon} holds the flows of {} since {} ({} ago)",
            which(p.holding, true),
            utc(p.since),
            ago(Duration::from_secs_f64((now - p.since).max(0.0)))
        );
        if let Some(cause) = p.cause {
            line += &format!(", because {}", cause.sentence());
        }
        // While the standby holds the flows, its steering still sends the probe name to
        // LocalDNS's sockets: silence here is LocalDNS's own.
        if !silent.is_empty() {
            line += &format!("; the probe gets no answer on {silent}");
        }
        return (Verdict::NonOk, line);
    }
    if !silent.is_empty() {
        let each: Vec<String> = look
            .daemons
            .iter()
            .map(|(d, said)| match said {
                Ok(_) => format!("{d} does not hold the flows"),
                Err(e) => format!("{d} {e}"),
            })
            .collect();
        let fallbacks = if each.is_empty() {
            "no fallback runs".to_string()
        } else {
            each.join("; ")
        };
        let line = format!("nothing answers LocalDNS's probe on {silent}; {fallbacks}");
        return (Verdict::NonOk, line);
    }
    if let Some((daemon, Err(e))) = look.daemons.iter().find(|(_, said)| said.is_err()) {
        let line = format!(
            "cannot tell whether LocalDNS or its fallback answers on {} and {}: {daemon} {e}",
            listeners[0], listeners[1],
        );
        return (Verdict::Unknown, line);
    }
    let mut line = format!("LocalDNS answers on {} and {}", listeners[0], listeners[1]);
    for (daemon, _) in &look.daemons {
        line += &format!("; {daemon} stands by");
    }
    (Verdict::Ok, line)
}

/// `status --ready`: what the standby of these listeners says of whether it could serve now
/// (its `/ready`: 200 yes, 503 no).
fn ready(listeners: [SocketAddr; 2]) -> (Verdict, String) {
    let said = daemons(&listeners).and_then(|found| {
        let (daemon, metrics) = (found.iter().find(|(d, _)| d.contains(" --standby ")))
            .ok_or_else(|| format!("no standby runs for {} and {}", listeners[0], listeners[1]))?;
        scrape(*metrics, "/ready").map_err(|e| format!("{daemon} {e}"))
    });
    let cannot = |e| format!("cannot tell whether the standby could serve: {e}");
    match said {
        Ok((true, line)) => (Verdict::Ok, line.trim_end().into()),
        Ok((false, line)) => (Verdict::NonOk, line.trim_end().into()),
        Err(e) => (Verdict::Unknown, cannot(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "169.254.10.10:53";
    const CLUSTER: &str = "169.254.10.11:53";

    fn listeners() -> [SocketAddr; 2] {
        [NODE.parse().unwrap(), CLUSTER.parse().unwrap()]
    }

    fn daemon(standby: bool) -> String {
        let standby = if standby { " --standby" } else { "" };
        format!("localdns-fallback{standby} (pid 4242)")
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn the_verdicts() {
        let holding = Published {
            holding: [true, true],
            since: 1_750_000_000.0,
            cause: Some(Cause::SilentProbe),
        };
        let idle = Published {
            holding: [false, false],
            since: 0.0,
            cause: None,
        };
        let judge_of =
            |answered, daemons| judge(&Look { answered, daemons }, listeners(), at(1_750_000_192));
        assert_eq!(
            judge_of([true, true], vec![(daemon(true), Ok(holding))]),
            (
                Verdict::NonOk,
                "LocalDNS is on its fallback: localdns-fallback --standby (pid 4242) holds the \
                 flows of 169.254.10.10:53 and 169.254.10.11:53 since 2025-06-15T15:06:40Z (3m12s \
                 ago), because LocalDNS's probe went unanswered"
                    .to_string()
            )
        );
        assert_eq!(
            judge_of([true, true], vec![(daemon(true), Ok(idle))]),
            (
                Verdict::Ok,
                "LocalDNS answers on 169.254.10.10:53 and 169.254.10.11:53; localdns-fallback \
                 --standby (pid 4242) stands by"
                    .to_string()
            )
        );
        assert_eq!(judge_of([true, true], vec![]).0, Verdict::Ok);
        let (v, line) = judge_of([true, false], vec![]);
        assert_eq!(v, Verdict::NonOk);
        assert_eq!(
            line,
            "nothing answers LocalDNS's probe on 169.254.10.11:53; no fallback runs"
        );
        // An answer, and a fallback whose state cannot be read: never OK.
        let unread = Err("serves these listeners without --metrics".to_string());
        let (v, line) = judge_of([true, true], vec![(daemon(false), unread)]);
        assert_eq!(v, Verdict::Unknown, "{line}");
        assert!(line.contains("(pid 4242) serves these listeners without --metrics"));
    }

    #[test]
    fn published_reads_the_daemons_own_rendering() {
        let m = crate::stats::Counters::new(SystemTime::now(), false);
        let sets =
            crate::upstream::UpstreamSets::uncounted(vec![], vec![], std::time::Instant::now());
        m.takeovers
            .took_over(Cause::LocalDnsFailed, at(1_700_000_000));
        let p = published(&crate::metrics::render(&m, &sets, None)).unwrap();
        assert_eq!(
            p,
            Published {
                holding: [true, true],
                since: 1_700_000_000.0,
                cause: Some(Cause::LocalDnsFailed),
            }
        );
        m.takeovers.handed_back(at(1_700_000_100));
        let p = published(&crate::metrics::render(&m, &sets, None)).unwrap();
        assert_eq!((p.holding, p.cause), ([false, false], None));
        assert!(published("# nothing\n").is_err());
    }

    #[test]
    fn daemons_are_told_by_their_command_line() {
        let cmdline = |args: &[&str]| args.join("\0").into_bytes();
        let c = daemon_config(&cmdline(&[
            "/opt/azure/containers/localdns/localdns-fallback",
            "--standby",
            "--metrics",
            "127.0.0.1:9356",
            "",
        ]));
        let c = c.expect("the standby unit's command line");
        assert!(c.standby && serves(&c, &listeners()));
        assert_eq!(c.metrics, Some("127.0.0.1:9356".parse().unwrap()));
        for other in [
            &["/usr/bin/coredns", "-conf", "x"][..],
            &["localdns-fallback", "status"],
            &["localdns-fallback", "release-addresses"],
            &["localdns-fallback", "--bogus"],
        ] {
            assert!(daemon_config(&cmdline(other)).is_none(), "{other:?}");
        }
        let loopback = daemon_config(&cmdline(&[
            "target/debug/localdns-fallback",
            "--node-listen",
            "127.0.0.9:0",
            "--cluster-listen",
            "127.0.0.10:0",
        ]))
        .unwrap();
        let asked = [
            "127.0.0.9:4053".parse().unwrap(),
            "127.0.0.10:4054".parse().unwrap(),
        ];
        assert!(serves(&loopback, &asked));
        assert!(!serves(&loopback, &listeners()));
    }
}
