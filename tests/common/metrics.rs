//! `/metrics` as a test reads it: one scrape (an HTTP/1.0 GET from the place the daemon serves,
//! or `curl` where the test is about what a real client sees), parsed once, each sample looked up
//! by name and labels.
//!
//! One rule for a series that is not there: [`Metrics::value`] says so (None), and
//! [`Metrics::get`] panics (the test expects the series). Only [`Metrics::sum`] counts an absent
//! series as nothing: it adds up the series of a name whose labels include those given, which is
//! 0 where none does, for counters the daemon renders only once something was counted.

use super::netns::Place;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// One scrape of `/metrics`, parsed.
pub struct Metrics {
    text: String,
    samples: Vec<Sample>,
}

struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Metrics {
    /// Parses Prometheus text format: `name{label="value",...} value` lines; comments and blank
    /// lines are skipped. Panics on a sample line that does not parse.
    pub fn parse(text: String) -> Metrics {
        let samples = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| parse_sample(l).unwrap_or_else(|| panic!("not a sample: {l:?} in:\n{text}")))
            .collect();
        Metrics { text, samples }
    }

    /// `GET /metrics` over TCP from `at` (the daemon's own namespace: it serves on its loopback);
    /// None if the endpoint does not answer with 200 within 5 s.
    pub fn try_fetch(at: impl Into<Place>, addr: SocketAddr) -> Option<Metrics> {
        let response = at.into().enter(|| -> std::io::Result<String> {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
            let mut text = String::new();
            s.read_to_string(&mut text)?;
            Ok(text)
        });
        let response = response.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let ok = head.starts_with("HTTP/1.") && head.split_whitespace().nth(1) == Some("200");
        ok.then(|| Metrics::parse(body.to_string()))
    }

    /// As [`Metrics::try_fetch`]; panics if the endpoint does not answer.
    pub fn fetch(at: impl Into<Place>, addr: SocketAddr) -> Metrics {
        Metrics::try_fetch(at, addr)
            .unwrap_or_else(|| panic!("no answer from http://{addr}/metrics"))
    }

    /// `curl http://addr/metrics` run at `at`; panics if curl fails.
    pub fn curl(at: impl Into<Place>, addr: SocketAddr) -> Metrics {
        let url = format!("http://{addr}/metrics");
        let out = at
            .into()
            .command("curl", ["-sS", "--max-time", "5", &url])
            .output()
            .unwrap_or_else(|e| panic!("cannot run curl: {e}"));
        assert!(
            out.status.success(),
            "curl {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Metrics::parse(String::from_utf8(out.stdout).expect("metrics are UTF-8"))
    }

    /// The value of the one series `name` whose labels are exactly `labels` (in any order), or
    /// None if there is none.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels.len() == labels.len() && s.has(labels))
            .map(|s| s.value)
    }

    /// As [`Metrics::value`]; panics, with the scrape, if the series is absent.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels)
            .unwrap_or_else(|| panic!("no {name}{labels:?} in:\n{}", self.text))
    }

    /// The sum of every series `name` whose labels include `labels` (all of them, with `&[]`); 0
    /// where there is none.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && s.has(labels))
            .map(|s| s.value)
            .sum()
    }

    /// The text as scraped.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Sample {
    fn has(&self, labels: &[(&str, &str)]) -> bool {
        labels
            .iter()
            .all(|(k, v)| self.labels.iter().any(|(sk, sv)| sk == k && sv == v))
    }
}

/// `name{k="v",...} value` or `name value` (a timestamp after the value is ignored).
fn parse_sample(line: &str) -> Option<Sample> {
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}')?;
            (
                &line[..open],
                parse_labels(&line[open + 1..close])?,
                &line[close + 1..],
            )
        }
        None => {
            let (name, rest) = line.split_once(' ')?;
            (name, Vec::new(), rest)
        }
    };
    let value = match rest.split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `k="v",k2="v2"` (values may escape `\"`, `\\` and `\n`).
fn parse_labels(mut s: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches(',');
        if s.is_empty() {
            return Some(labels);
        }
        let (key, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key.to_string(), value));
        s = &rest[end + 1..];
    }
}
