//! `/metrics` in Prometheus text format, on `--metrics ADDR`, by a tiny HTTP server that cannot
//! stall DNS serving (own tasks, bounded connections, a deadline per request). It only reads the
//! plain counters of [`crate::stats`], the upstream sets and the cache, at scrape time.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::cache::Cache;
use crate::roles::{ListenerRole, Transport, UpstreamGroup};
use crate::stats::{Counters, Histogram, LATENCY_BUCKETS, ListenerStats, RCODES};
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
    let count = h.count.load(Relaxed);
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
    let sum = h.sum_nanos.load(Relaxed) as f64 / 1e9;
    let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
    let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
}

/// The Prometheus text exposition (format 0.0.4).
pub fn render(counters: &Counters, sets: &UpstreamSets, cache: Option<&Mutex<Cache>>) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let o = &mut out;
    let header = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };

    header(
        o,
        "localdns_fallback_responses_total",
        "counter",
        "Replies sent to clients, by listener, transport and RCODE.",
    );
    for l in ListenerRole::BOTH {
        for (t, transport) in TRANSPORTS.iter().map(|t| t.name()).enumerate() {
            for (c, rcode) in RCODES.iter().enumerate() {
                let n = counters.listener(l).responses[t][c].load(Relaxed);
                let _ = writeln!(
                    o,
                    "localdns_fallback_responses_total{{listener=\"{}\",transport=\"{transport}\",rcode=\"{rcode}\"}} {n}",
                    l.name()
                );
            }
        }
    }
    let per_listener = |o: &mut String,
                        name: &str,
                        kind: &str,
                        help: &str,
                        get: &dyn Fn(&ListenerStats) -> u64| {
        header(o, name, kind, help);
        for l in ListenerRole::BOTH {
            let _ = writeln!(
                o,
                "{name}{{listener=\"{}\"}} {}",
                l.name(),
                get(counters.listener(l))
            );
        }
    };
    per_listener(
        o,
        "localdns_fallback_dropped_total",
        "counter",
        "Client packets dropped unanswered (too short, or response-shaped).",
        &|s| s.dropped.load(Relaxed),
    );
    per_listener(
        o,
        "localdns_fallback_shed_total",
        "counter",
        "UDP queries refused because too many were in flight.",
        &|s| s.shed.load(Relaxed),
    );
    per_listener(
        o,
        "localdns_fallback_inflight_queries",
        "gauge",
        "UDP queries waiting for an upstream.",
        &|s| s.inflight.load(Relaxed),
    );
    per_listener(
        o,
        "localdns_fallback_cache_hits_total",
        "counter",
        "Queries answered fresh from the cache.",
        &|s| s.cache_hits.load(Relaxed),
    );
    per_listener(
        o,
        "localdns_fallback_cache_misses_total",
        "counter",
        "Queries the cache could not answer.",
        &|s| s.cache_misses.load(Relaxed),
    );
    per_listener(
        o,
        "localdns_fallback_stale_answers_total",
        "counter",
        "Answers served from expired cache entries because upstreams failed.",
        &|s| s.stale.load(Relaxed),
    );

    let (entries, bytes) = cache.map_or((0, 0), |c| {
        let c = c.lock().unwrap_or_else(|p| p.into_inner());
        (c.len(), c.bytes())
    });
    header(
        o,
        "localdns_fallback_cache_entries",
        "gauge",
        "Answers in the cache.",
    );
    let _ = writeln!(o, "localdns_fallback_cache_entries {entries}");
    header(
        o,
        "localdns_fallback_cache_bytes",
        "gauge",
        "Memory the cache accounts for.",
    );
    let _ = writeln!(o, "localdns_fallback_cache_bytes {bytes}");

    let upstreams = counters.upstreams();
    let label = |(g, addr): &(UpstreamGroup, std::net::SocketAddr)| {
        format!("group=\"{}\",upstream=\"{addr}\"", g.name())
    };
    header(
        o,
        "localdns_fallback_upstream_queries_total",
        "counter",
        "Queries sent to each upstream (every try counts).",
    );
    for (k, s) in &upstreams {
        let _ = writeln!(
            o,
            "localdns_fallback_upstream_queries_total{{{}}} {}",
            label(k),
            s.queries.load(Relaxed)
        );
    }
    header(
        o,
        "localdns_fallback_upstream_failures_total",
        "counter",
        "Tries at each upstream that timed out, could not be sent, were refused by the network or got an error reply (SERVFAIL, REFUSED, NOTIMP).",
    );
    for (k, s) in &upstreams {
        let _ = writeln!(
            o,
            "localdns_fallback_upstream_failures_total{{{}}} {}",
            label(k),
            s.failures.load(Relaxed)
        );
    }
    header(
        o,
        "localdns_fallback_upstream_duration_seconds",
        "histogram",
        "Time from sending a try to its accepted reply, per upstream.",
    );
    for (k, s) in &upstreams {
        render_histogram(
            &s.latency,
            o,
            "localdns_fallback_upstream_duration_seconds",
            &label(k),
        );
    }

    header(
        o,
        "localdns_fallback_upstreams",
        "gauge",
        "Upstreams in use per group, labelled with where they were found.",
    );
    for g in UpstreamGroup::BOTH {
        let n = sets.get(g).addrs().len();
        let _ = writeln!(
            o,
            "localdns_fallback_upstreams{{group=\"{}\",source=\"{}\"}} {n}",
            g.name(),
            escape(&counters.source(g))
        );
    }
    header(
        o,
        "localdns_fallback_upstream_set_changes_total",
        "counter",
        "Times a group's set of upstreams changed.",
    );
    for g in UpstreamGroup::BOTH {
        let _ = writeln!(
            o,
            "localdns_fallback_upstream_set_changes_total{{group=\"{}\"}} {}",
            g.name(),
            counters.set_changes(g)
        );
    }

    header(
        o,
        "localdns_fallback_build_info",
        "gauge",
        "Always 1; the version is in the label.",
    );
    let _ = writeln!(
        o,
        "localdns_fallback_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    header(
        o,
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since the Unix epoch.",
    );
    let started = counters
        .started
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let _ = writeln!(o, "process_start_time_seconds {started}");
    out
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
            let response = if path == "/metrics" {
                let body = render(&counters, &sets.borrow(), cache.as_deref());
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\nConnection: close\r\n\r\nnot found\n".to_string()
            };
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
        let m = Counters::new(std::time::SystemTime::now());
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
