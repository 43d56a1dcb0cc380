//! Counters for the people looking at a node in trouble, exposed in Prometheus text format on
//! `--metrics ADDR` by a tiny HTTP server that cannot stall DNS serving (own tasks, bounded
//! connections, a deadline per request).
//!
//! The serving loops only bump relaxed atomics; each listener has its own block so the two UDP
//! loops never write to the same cache line. Rendering reads them at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::cache::Cache;
use crate::forward::{Groups, Listener};
use crate::upstream::Group;

/// Upper bounds of the upstream latency histogram, in seconds: LAN answers take well under a
/// millisecond, a VNet DNS recursing a few tens, and the per-try budget ends at 1 s.
const LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// RCODEs counted by name; the rest are counted as `other`.
const RCODES: [&str; 7] = [
    "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "other",
];
const TRANSPORTS: [&str; 2] = ["udp", "tcp"];
/// Scrapes served at once; more wait.
const HTTP_CONNECTIONS: usize = 4;
/// A scraper must send its request within this; slow or hostile clients are cut off.
const HTTP_DEADLINE: Duration = Duration::from_secs(2);
const HTTP_MAX_REQUEST: usize = 8192;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp = 0,
    Tcp = 1,
}

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_nanos.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = self.sum_nanos.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// What one upstream server has seen; kept across upstream-set changes so counters only grow.
#[derive(Debug, Default)]
pub struct UpstreamStats {
    pub queries: AtomicU64,
    pub failures: AtomicU64,
    pub latency: Histogram,
}

/// One listener's counters.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct ListenerStats {
    responses: [[AtomicU64; RCODES.len()]; 2],
    dropped: AtomicU64,
    shed: AtomicU64,
    inflight: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    stale: AtomicU64,
}

impl ListenerStats {
    /// A reply went to a client; its RCODE is read off the bytes.
    pub fn response(&self, transport: Transport, reply: &[u8]) {
        let code = reply.get(3).map_or(RCODES.len() - 1, |b| {
            usize::from(b & 0x0f).min(RCODES.len() - 1)
        });
        self.responses[transport as usize][code].fetch_add(1, Relaxed);
    }

    pub fn dropped(&self) {
        self.dropped.fetch_add(1, Relaxed);
    }

    pub fn shed(&self) {
        self.shed.fetch_add(1, Relaxed);
    }

    /// Several relay threads serve one listener; each adds the change in its own count.
    pub fn add_inflight(&self, delta: i64) {
        if delta >= 0 {
            self.inflight.fetch_add(delta as u64, Relaxed);
        } else {
            self.inflight.fetch_sub(delta.unsigned_abs(), Relaxed);
        }
    }

    pub fn cache_hit(&self) {
        self.cache_hits.fetch_add(1, Relaxed);
    }

    pub fn cache_miss(&self) {
        self.cache_misses.fetch_add(1, Relaxed);
    }

    pub fn stale(&self, n: usize) {
        self.stale.fetch_add(n as u64, Relaxed);
    }

    fn total(&self) -> u64 {
        self.responses
            .iter()
            .flatten()
            .map(|c| c.load(Relaxed))
            .sum()
    }
}

/// Everything counted, for `/metrics`, the minute summary and `systemctl status`.
#[derive(Debug)]
pub struct Metrics {
    started: SystemTime,
    listeners: [ListenerStats; 2],
    upstreams: Mutex<BTreeMap<(u8, SocketAddr), Arc<UpstreamStats>>>,
    /// Per group: where its upstreams came from, and how often the set changed.
    sources: Mutex<[String; 2]>,
    changes: [AtomicU64; 2],
}

fn group_index(g: Group) -> usize {
    match g {
        Group::Node => 0,
        Group::Cluster => 1,
    }
}

const GROUPS: [Group; 2] = [Group::Node, Group::Cluster];
const LISTENERS: [Listener; 2] = [Listener::Node, Listener::Cluster];

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics {
            started: SystemTime::now(),
            listeners: Default::default(),
            upstreams: Mutex::new(BTreeMap::new()),
            sources: Mutex::new([String::from("none"), String::from("none")]),
            changes: Default::default(),
        })
    }

    pub fn listener(&self, l: Listener) -> &ListenerStats {
        &self.listeners[l as usize]
    }

    /// The stats of one upstream server, created on first use and kept for good.
    pub fn upstream(&self, group: Group, addr: SocketAddr) -> Arc<UpstreamStats> {
        let mut map = self.upstreams.lock().unwrap_or_else(|p| p.into_inner());
        map.entry((group_index(group) as u8, addr))
            .or_default()
            .clone()
    }

    /// A group got a new set of upstreams from `source`.
    pub fn upstreams_changed(&self, group: Group, source: &str) {
        self.changes[group_index(group)].fetch_add(1, Relaxed);
        self.sources.lock().unwrap_or_else(|p| p.into_inner())[group_index(group)] =
            source.to_string();
    }

    /// Totals for the minute summary: (answers, SERVFAILs, stale answers, shed).
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        let mut t = (0, 0, 0, 0);
        for l in &self.listeners {
            t.0 += l.total();
            t.1 += l.responses.iter().map(|r| r[2].load(Relaxed)).sum::<u64>();
            t.2 += l.stale.load(Relaxed);
            t.3 += l.shed.load(Relaxed);
        }
        t
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self, groups: &Groups, cache: Option<&Mutex<Cache>>) -> String {
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
        for l in LISTENERS {
            for (t, transport) in TRANSPORTS.iter().enumerate() {
                for (c, rcode) in RCODES.iter().enumerate() {
                    let n = self.listener(l).responses[t][c].load(Relaxed);
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
            for l in LISTENERS {
                let _ = writeln!(
                    o,
                    "{name}{{listener=\"{}\"}} {}",
                    l.name(),
                    get(self.listener(l))
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

        let upstreams = self
            .upstreams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let label = |(g, addr): &(u8, SocketAddr)| {
            format!(
                "group=\"{}\",upstream=\"{addr}\"",
                GROUPS[*g as usize].name()
            )
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
            "Tries at each upstream that timed out or could not be sent.",
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
            s.latency
                .render(o, "localdns_fallback_upstream_duration_seconds", &label(k));
        }

        let sources = self
            .sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        header(
            o,
            "localdns_fallback_upstreams",
            "gauge",
            "Upstreams in use per group, labelled with where they were found.",
        );
        for g in GROUPS {
            let n = groups.get(g).addrs().len();
            let _ = writeln!(
                o,
                "localdns_fallback_upstreams{{group=\"{}\",source=\"{}\"}} {n}",
                g.name(),
                escape(&sources[group_index(g)])
            );
        }
        header(
            o,
            "localdns_fallback_upstream_set_changes_total",
            "counter",
            "Times a group's set of upstreams changed.",
        );
        for g in GROUPS {
            let _ = writeln!(
                o,
                "localdns_fallback_upstream_set_changes_total{{group=\"{}\"}} {}",
                g.name(),
                self.changes[group_index(g)].load(Relaxed)
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
        let started = self
            .started
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let _ = writeln!(o, "process_start_time_seconds {started}");
        out
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
    metrics: Arc<Metrics>,
    groups: tokio::sync::watch::Receiver<Arc<Groups>>,
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
        let (metrics, groups, cache) = (metrics.clone(), groups.clone(), cache.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let Ok(Some(path)) =
                tokio::time::timeout(HTTP_DEADLINE, read_request(&mut stream)).await
            else {
                return;
            };
            let response = if path == "/metrics" {
                let body = metrics.render(&groups.borrow(), cache.as_deref());
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
    use crate::upstream::Upstreams;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        for ms in [0, 3, 3, 40, 5000] {
            h.observe(Duration::from_millis(ms));
        }
        let mut out = String::new();
        h.render(&mut out, "x", "g=\"a\"");
        assert!(out.contains("x_bucket{g=\"a\",le=\"0.0005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{g=\"a\",le=\"0.005\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{g=\"a\",le=\"2.5\"} 4\n"), "{out}");
        assert!(out.contains("x_bucket{g=\"a\",le=\"+Inf\"} 5\n"), "{out}");
        assert!(out.contains("x_count{g=\"a\"} 5\n"));
    }

    #[test]
    fn responses_are_counted_by_rcode() {
        let m = Metrics::new();
        let l = m.listener(Listener::Cluster);
        l.response(Transport::Udp, &[0, 0, 0x80, 0x83]);
        l.response(Transport::Tcp, &[0, 0, 0x80, 0x80]);
        l.response(Transport::Udp, &[0, 0, 0x80, 0x8b]);
        let groups = Groups {
            node: Arc::new(Upstreams::new(vec![])),
            cluster: Arc::new(Upstreams::new(vec![])),
        };
        let text = m.render(&groups, None);
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
        assert_eq!(m.totals().0, 3);
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
