//! `/metrics` in Prometheus text format, on `--metrics ADDR`, by a tiny HTTP server that cannot
//! stall DNS serving (own tasks, bounded connections, a deadline per request). It only reads the
//! plain counters of [`crate::stats`], the upstream sets and the cache, at scrape time. Beside
//! it, `/ready`: the one line `status --ready` prints, 200 when every group could be served.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::cache::Cache;
use crate::flows::Cause;
use crate::roles::UpstreamGroup::{KubeDns, VnetDns};
use crate::roles::{ListenerRole, Transport, UpstreamGroup};
use crate::stats::{
    Counters, Histogram, LATENCY_BUCKETS, ListenerStats, RCODES, Takeovers, UpstreamStats,
    unix_secs,
};
use crate::upstream::UpstreamSets;

const TRANSPORTS: [Transport; 2] = [Transport::Udp, Transport::Tcp];
/// Scrapes served at once; more wait.
const HTTP_CONNECTIONS: usize = 4;
/// A scraper must send its request within this; slow or hostile clients are cut off.
const HTTP_DEADLINE: Duration = Duration::from_secs(2);
const HTTP_MAX_REQUEST: usize = 8192;

fn render_histogram(h: &Histogram, out: &mut String, name: &str, labels: &str) {
    let mut cumulative = 0;
    for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&h.buckets) {
        cumulative += bucket.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
    }
    let count = cumulative + h.buckets[LATENCY_BUCKETS.len()].load(Relaxed);
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
    let sum = h.sum_nanos.load(Relaxed) as f64 / 1e9;
    let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
    let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
}

/// What one scrape reads, besides the listeners' counters: each upstream's counters and the
/// cache's size.
struct Scrape<'a> {
    counters: &'a Counters,
    sets: &'a UpstreamSets,
    upstreams: Vec<((UpstreamGroup, SocketAddr), Arc<UpstreamStats>)>,
    /// The cache's entries and bytes (0 and 0 without a cache).
    cache: (usize, usize),
}

/// How the samples of a series are read.
enum Samples {
    /// One sample per listener, labelled `listener`.
    PerListener(fn(&Scrape, &ListenerStats) -> u64),
    /// One sample per upstream, labelled `group` and `upstream`.
    PerUpstream(fn(&UpstreamStats) -> u64),
    /// One sample per takeover cause, labelled `cause`.
    PerCause(fn(&Takeovers, Cause) -> u64),
    /// One sample per upstream group, labelled `group`.
    PerGroup(fn(&Scrape, UpstreamGroup) -> f64),
    /// One sample, unlabelled (whole numbers print without a fraction).
    One(fn(&Scrape) -> f64),
    /// Writes its own sample lines for the series it is given the name of.
    Own(fn(&Scrape, &str, &mut String)),
}

/// One series: its name, help text and samples. Its type follows from its name, by Prometheus's
/// conventions: `_total` a counter, `_duration_seconds` a histogram, anything else a gauge.
struct Series {
    name: &'static str,
    help: &'static str,
    samples: Samples,
}

/// Every series, in the order of the exposition.
const SERIES: &[Series] = &[
    Series {
        name: "localdns_fallback_responses_total",
        help: "Replies sent to clients, by listener, transport and RCODE.",
        samples: Samples::Own(|s, name, o| {
            for l in ListenerRole::BOTH {
                for (t, transport) in TRANSPORTS.iter().map(|t| t.name()).enumerate() {
                    for (c, rcode) in RCODES.iter().enumerate() {
                        let n = s.counters.listener(l).responses[t][c].load(Relaxed);
                        let _ = writeln!(
                            o,
                            "{name}{{listener=\"{}\",transport=\"{transport}\",rcode=\"{rcode}\"}} {n}",
                            l.name()
                        );
                    }
                }
            }
        }),
    },
    Series {
        name: "localdns_fallback_dropped_total",
        help: "Client packets dropped unanswered (too short, or response-shaped).",
        samples: Samples::PerListener(|_, l| l.dropped.load(Relaxed)),
    },
    Series {
        name: "localdns_fallback_shed_total",
        help: "Queries (UDP and TCP) refused because too many were in flight.",
        samples: Samples::PerListener(|_, l| l.shed.load(Relaxed)),
    },
    Series {
        name: "localdns_fallback_inflight_queries",
        help: "Queries (UDP and TCP) waiting for an upstream.",
        samples: Samples::PerListener(|_, l| l.inflight.load(Relaxed)),
    },
    Series {
        name: "localdns_fallback_cache_hits_total",
        help: "Queries answered fresh from the cache.",
        samples: Samples::PerListener(|_, l| l.cache_hits.load(Relaxed)),
    },
    Series {
        name: "localdns_fallback_cache_misses_total",
        help: "Queries the cache could not answer.",
        samples: Samples::PerListener(|_, l| l.cache_misses.load(Relaxed)),
    },
    Series {
        name: "localdns_fallback_stale_answers_total",
        help: "Answers served from expired cache entries because upstreams failed.",
        samples: Samples::PerListener(|_, l| l.stale.load(Relaxed)),
    },
    Series {
        name: "localdns_fallback_hosts_entries",
        help: "(name, address) records from the hosts file (--hosts-file), as CoreDNS's coredns_hosts_entries.",
        samples: Samples::One(|s| s.sets.hosts.len() as f64),
    },
    Series {
        name: "localdns_fallback_hosts_reload_timestamp_seconds",
        help: "When the hosts file was last read, since the Unix epoch; 0 for never.",
        samples: Samples::One(|s| s.sets.hosts.read_at.map_or(0.0, unix_secs)),
    },
    Series {
        name: "localdns_fallback_cache_entries",
        help: "Answers in the cache.",
        samples: Samples::One(|s| s.cache.0 as f64),
    },
    Series {
        name: "localdns_fallback_cache_bytes",
        help: "Memory the cache accounts for.",
        samples: Samples::One(|s| s.cache.1 as f64),
    },
    Series {
        name: "localdns_fallback_upstream_queries_total",
        help: "Queries sent to each upstream (every try counts).",
        samples: Samples::PerUpstream(|s| s.queries.load(Relaxed)),
    },
    Series {
        name: "localdns_fallback_upstream_failures_total",
        help: "Tries at each upstream that timed out, could not be sent, were refused by the network or got an error reply (SERVFAIL, REFUSED, NOTIMP).",
        samples: Samples::PerUpstream(|s| s.failures.load(Relaxed)),
    },
    Series {
        name: "localdns_fallback_upstream_duration_seconds",
        help: "Time from sending a try to its accepted reply, per upstream.",
        samples: Samples::Own(|s, name, o| {
            for (k, u) in &s.upstreams {
                render_histogram(&u.latency, o, name, &upstream_labels(k));
            }
        }),
    },
    Series {
        name: "localdns_fallback_upstreams",
        help: "Upstreams in use per group, labelled with where they were found (or, while none are, where discovery looked).",
        samples: Samples::Own(|s, name, o| {
            for g in UpstreamGroup::BOTH {
                let n = s.sets.get(g).addrs().len();
                let _ = writeln!(
                    o,
                    "{name}{{group=\"{}\",source=\"{}\"}} {n}",
                    g.name(),
                    escape(&s.counters.group(g).0)
                );
            }
        }),
    },
    Series {
        name: "localdns_fallback_upstream_set_changes_total",
        help: "Times a group's set of upstreams changed.",
        samples: Samples::PerGroup(|s, g| s.counters.group(g).1 as f64),
    },
    Series {
        name: "localdns_fallback_upstreams_ready",
        help: "1 while one of the group's upstreams answered within 30 s: the process could serve the group (GET /ready says why not). The standby asks each group a question of its own every 9 s.",
        samples: Samples::PerGroup(|s, g| {
            let ready = s.sets.get(g).readiness(Instant::now()).is_ok();
            f64::from(u8::from(ready))
        }),
    },
    Series {
        name: "localdns_fallback_upstreams_last_answer_timestamp_seconds",
        help: "When one of the group's upstreams last answered (any reply), since the Unix epoch; 0 for never.",
        samples: Samples::PerGroup(|s, g| s.sets.get(g).last_reply().map_or(0.0, unix)),
    },
    Series {
        name: "localdns_fallback_holding_flows",
        help: "1 while this process holds LocalDNS's flows on the listener (new flows come to it), 0 while LocalDNS has them.",
        samples: Samples::PerListener(|s, _| u64::from(s.counters.takeovers.holding().is_some())),
    },
    Series {
        name: "localdns_fallback_takeovers_total",
        help: "Times this process took LocalDNS's flows, by cause: localdns_failed (started by systemd for a failed or restarting LocalDNS), addresses_gone (the standby saw LocalDNS's addresses removed), silent_probe (the standby's probe went unanswered), unread_queries (the standby saw LocalDNS leave queries unread in its sockets), by_hand.",
        samples: Samples::PerCause(|t, c| t.count(c).0),
    },
    Series {
        name: "localdns_fallback_handbacks_total",
        help: "Times this process gave LocalDNS its flows back, by the cause of the takeover it ended.",
        samples: Samples::PerCause(|t, c| t.count(c).1),
    },
    Series {
        name: "localdns_fallback_last_takeover_timestamp_seconds",
        help: "When this process last took LocalDNS's flows, since the Unix epoch; 0 for never.",
        samples: Samples::One(|s| s.counters.takeovers.last().0),
    },
    Series {
        name: "localdns_fallback_last_handback_timestamp_seconds",
        help: "When this process last gave LocalDNS its flows back, since the Unix epoch; 0 for never.",
        samples: Samples::One(|s| s.counters.takeovers.last().1),
    },
    Series {
        name: "localdns_fallback_standby",
        help: "1 for the standby (--standby), which runs beside LocalDNS for as long as the node is up; 0 for a fallback started when LocalDNS failed.",
        samples: Samples::One(|s| f64::from(u8::from(s.counters.standby))),
    },
    Series {
        name: "localdns_fallback_build_info",
        help: "Always 1; the version is in the label.",
        samples: Samples::Own(|_, name, o| {
            let _ = writeln!(o, "{name}{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
        }),
    },
    Series {
        name: "process_start_time_seconds",
        help: "Start time of the process since the Unix epoch.",
        samples: Samples::One(|s| unix_secs(s.counters.started)),
    },
];

/// An instant of the past as seconds since the Unix epoch.
fn unix(t: Instant) -> f64 {
    unix_secs(SystemTime::now() - t.elapsed())
}

/// `/ready`: whether the process could serve each group now, and why not, in one line.
pub fn ready(counters: &Counters, sets: &UpstreamSets) -> (bool, String) {
    let (mut all, mut said) = (true, Vec::new());
    for (g, name) in [(KubeDns, "kube-dns"), (VnetDns, "VNet DNS")] {
        let set = sets.get(g);
        let (servers, one) = match set.addrs() {
            [] => (String::new(), ""),
            [one] => (one.to_string(), ""),
            [first, more @ ..] => (format!("{first} and {} more", more.len()), ", one"),
        };
        let r = set.readiness(Instant::now());
        all &= r.is_ok();
        said.push(match r {
            _ if servers.is_empty() => format!("{name}: no server found ({})", counters.group(g).0),
            Ok(a) => format!("{name} {servers}{one} answered {} ago", ago(a)),
            Err((t, why)) => {
                let (at, a) = (utc(unix(t)), ago(t.elapsed()));
                format!("{name} {servers}: {why} since {at} ({a} ago)")
            }
        });
    }
    let who = ["fallback", "standby"][usize::from(counters.standby)];
    let could = if all { "could" } else { "could not" };
    let line = format!("the {who} {could} serve: {}\n", said.join("; "));
    (all, line)
}

fn upstream_labels((g, addr): &(UpstreamGroup, SocketAddr)) -> String {
    format!("group=\"{}\",upstream=\"{addr}\"", g.name())
}

/// The Prometheus text exposition (format 0.0.4).
pub fn render(counters: &Counters, sets: &UpstreamSets, cache: Option<&Mutex<Cache>>) -> String {
    let scrape = Scrape {
        counters,
        sets,
        upstreams: counters.upstreams(),
        cache: cache.map_or((0, 0), |c| {
            let c = c.lock().unwrap_or_else(|p| p.into_inner());
            (c.len(), c.bytes())
        }),
    };
    let mut out = String::with_capacity(16 * 1024);
    let o = &mut out;
    for Series {
        name,
        help,
        samples,
    } in SERIES
    {
        let kind = match name {
            n if n.ends_with("_total") => "counter",
            n if n.ends_with("_duration_seconds") => "histogram",
            _ => "gauge",
        };
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        match samples {
            Samples::PerListener(get) => {
                for l in ListenerRole::BOTH {
                    let n = get(&scrape, counters.listener(l));
                    let _ = writeln!(o, "{name}{{listener=\"{}\"}} {n}", l.name());
                }
            }
            Samples::PerUpstream(get) => {
                for (k, u) in &scrape.upstreams {
                    let _ = writeln!(o, "{name}{{{}}} {}", upstream_labels(k), get(u));
                }
            }
            Samples::PerCause(get) => {
                for c in Cause::ALL {
                    let n = get(&counters.takeovers, c);
                    let _ = writeln!(o, "{name}{{cause=\"{}\"}} {n}", c.label());
                }
            }
            Samples::PerGroup(get) => {
                for g in UpstreamGroup::BOTH {
                    let _ = writeln!(o, "{name}{{group=\"{}\"}} {}", g.name(), get(&scrape, g));
                }
            }
            Samples::One(get) => {
                let _ = writeln!(o, "{name} {}", get(&scrape));
            }
            Samples::Own(write) => write(&scrape, name, o),
        }
    }
    out
}

/// Seconds since the Unix epoch as RFC 3339 in UTC, to the second.
pub fn utc(secs: f64) -> String {
    let secs = secs.max(0.0) as u64;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm), from 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

pub fn ago(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m{}s", s / 60, s % 60),
        3_600..86_400 => format!("{}h{}m", s / 3_600, s % 3_600 / 60),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3_600),
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serves `GET /metrics` until the task is aborted.
pub async fn serve(
    listener: TcpListener,
    counters: Arc<Counters>,
    sets: tokio::sync::watch::Receiver<Arc<UpstreamSets>>,
    cache: Option<Arc<Mutex<Cache>>>,
) {
    let slots = Arc::new(Semaphore::new(HTTP_CONNECTIONS));
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (counters, sets, cache) = (counters.clone(), sets.clone(), cache.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let Ok(Some(path)) =
                tokio::time::timeout(HTTP_DEADLINE, read_request(&mut stream)).await
            else {
                return;
            };
            let sets = sets.borrow().clone();
            let (code, body) = match path.as_str() {
                "/metrics" => ("200 OK", render(&counters, &sets, cache.as_deref())),
                "/ready" => match ready(&counters, &sets) {
                    (true, line) => ("200 OK", line),
                    (false, line) => ("503 Service Unavailable", line),
                },
                _ => ("404 Not Found", "not found\n".to_string()),
            };
            let response = format!(
                "HTTP/1.1 {code}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ =
                tokio::time::timeout(HTTP_DEADLINE, stream.write_all(response.as_bytes())).await;
        });
    }
}

/// Reads a request head and returns the path of a GET; `None` for anything else.
async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() + n > HTTP_MAX_REQUEST {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    parse_request_line(&buf)
}

fn parse_request_line(head: &[u8]) -> Option<String> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut words = line.split(' ');
    match (words.next(), words.next(), words.next()) {
        (Some("GET"), Some(path), Some(v)) if v.starts_with("HTTP/1.") => {
            Some(path.split('?').next().unwrap_or(path).to_string())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        for ms in [0, 3, 3, 40, 5000] {
            h.observe(Duration::from_millis(ms));
        }
        let mut out = String::new();
        render_histogram(&h, &mut out, "x", "g=\"a\"");
        assert!(out.contains("x_bucket{g=\"a\",le=\"0.0005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{g=\"a\",le=\"0.005\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{g=\"a\",le=\"2.5\"} 4\n"), "{out}");
        assert!(out.contains("x_bucket{g=\"a\",le=\"+Inf\"} 5\n"), "{out}");
        assert!(out.contains("x_count{g=\"a\"} 5\n"));
    }

    #[test]
    fn responses_are_counted_by_rcode() {
        let m = Counters::new(std::time::SystemTime::now(), false);
        let l = m.listener(ListenerRole::Cluster);
        l.response(Transport::Udp, &[0, 0, 0x80, 0x83]);
        l.response(Transport::Tcp, &[0, 0, 0x80, 0x80]);
        l.response(Transport::Udp, &[0, 0, 0x80, 0x8b]);
        let sets = UpstreamSets::uncounted(vec![], vec![], std::time::Instant::now());
        let text = render(&m, &sets, None);
        assert!(text.contains(
            "responses_total{listener=\"cluster\",transport=\"udp\",rcode=\"NXDOMAIN\"} 1\n"
        ));
        assert!(text.contains(
            "responses_total{listener=\"cluster\",transport=\"tcp\",rcode=\"NOERROR\"} 1\n"
        ));
        assert!(text.contains(
            "responses_total{listener=\"cluster\",transport=\"udp\",rcode=\"other\"} 1\n"
        ));
        assert!(text.contains(
            "responses_total{listener=\"node\",transport=\"udp\",rcode=\"NOERROR\"} 0\n"
        ));
        assert_eq!(m.totals().answers, 3);
    }

    #[test]
    fn takeovers_show_as_the_gauge_the_causes_and_the_times() {
        let m = Counters::new(std::time::SystemTime::now(), false);
        let sets = UpstreamSets::uncounted(vec![], vec![], std::time::Instant::now());
        let text = render(&m, &sets, None);
        assert!(text.contains("localdns_fallback_holding_flows{listener=\"node\"} 0\n"));
        assert!(text.contains("localdns_fallback_takeovers_total{cause=\"by_hand\"} 0\n"));
        assert!(text.contains("localdns_fallback_last_takeover_timestamp_seconds 0\n"));
        assert!(text.contains("localdns_fallback_standby 0\n"));
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let m = Counters::new(std::time::SystemTime::now(), true);
        m.takeovers.took_over(Cause::AddressesGone, at);
        let text = render(&m, &sets, None);
        assert!(text.contains("localdns_fallback_holding_flows{listener=\"cluster\"} 1\n"));
        assert!(text.contains("localdns_fallback_takeovers_total{cause=\"addresses_gone\"} 1\n"));
        assert!(text.contains("localdns_fallback_last_takeover_timestamp_seconds 1700000000\n"));
        assert!(text.contains("localdns_fallback_standby 1\n"));
        m.takeovers.handed_back(at + Duration::from_secs(5));
        let text = render(&m, &sets, None);
        assert!(text.contains("localdns_fallback_holding_flows{listener=\"node\"} 0\n"));
        assert!(text.contains("localdns_fallback_handbacks_total{cause=\"addresses_gone\"} 1\n"));
        assert!(text.contains("localdns_fallback_last_handback_timestamp_seconds 1700000005\n"));
    }

    #[test]
    fn times() {
        assert_eq!(utc(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400.0), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_750_000_000.9), "2025-06-15T15:06:40Z");
        assert_eq!(ago(Duration::from_secs(42)), "42s");
        assert_eq!(ago(Duration::from_secs(3_725)), "1h2m");
    }

    #[test]
    fn readiness_shows_as_the_gauge_the_last_answer_and_the_line_of_ready() {
        let m = Counters::new(std::time::SystemTime::now(), true);
        let (a, b) = (
            "10.244.0.5:53".parse().unwrap(),
            "10.244.0.6:53".parse().unwrap(),
        );
        let sets = UpstreamSets::uncounted(vec![], vec![a, b], Instant::now());
        m.looked(
            UpstreamGroup::VnetDns,
            "/run/resolv.conf lists no VNet DNS server",
        );
        sets.kube_dns.note_error_reply(b, false, Instant::now());
        let text = render(&m, &sets, None);
        assert!(text.contains("localdns_fallback_upstreams_ready{group=\"cluster\"} 1\n"));
        assert!(text.contains("localdns_fallback_upstreams_ready{group=\"node\"} 0\n"));
        assert!(text.contains("_last_answer_timestamp_seconds{group=\"node\"} 0\n"));
        assert!(!text.contains("_last_answer_timestamp_seconds{group=\"cluster\"} 0\n"));
        let (ready, line) = ready(&m, &sets);
        assert!(!ready);
        assert_eq!(
            line,
            "the standby could not serve: kube-dns 10.244.0.5:53 and 1 more, one answered 0s \
             ago; VNet DNS: no server found (/run/resolv.conf lists no VNet DNS server)\n"
        );
    }

    #[test]
    fn request_lines() {
        assert_eq!(
            parse_request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").as_deref(),
            Some("/metrics")
        );
        assert_eq!(
            parse_request_line(b"GET /metrics?x=1 HTTP/1.0\n\n").as_deref(),
            Some("/metrics")
        );
        assert_eq!(parse_request_line(b"POST /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(parse_request_line(b"\xff\xfe garbage"), None);
        assert_eq!(parse_request_line(b""), None);
    }
}
