//! `discover::cilium::discover` against a stand-in Cilium agent on a real unix socket: plain,
//! chunked and failing answers, an agent that never answers, and no agent at all. No root needed.

use localdns_fallback::discover::ServiceName;
use localdns_fallback::discover::cilium::discover;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SERVICES: &str = include_str!("fixtures/cilium/v1.18-udp-tcp-dualstack.json");

/// What the stand-in agent does with the one connection it accepts.
enum Answer {
    Plain(u16, String),
    Chunked(String),
    /// Holds the connection open, silent, until the test ends.
    Nothing,
}

/// A fresh directory for sockets, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("discover-cilium-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A stand-in agent listening in a fresh directory.
struct FakeAgent {
    _dir: TempDir,
    socket: PathBuf,
    /// The request line the agent received.
    served: Option<JoinHandle<String>>,
    /// Dropping it releases a silent agent's connection.
    _release: mpsc::Sender<()>,
}

impl FakeAgent {
    fn start(answer: Answer) -> FakeAgent {
        let dir = TempDir::new();
        let socket = dir.0.join("cilium.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let (release, released) = mpsc::channel::<()>();
        let served = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            // Read the rest of the request head so the client never sees a reset.
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let mut stream = reader.into_inner();
            let response = match answer {
                Answer::Plain(code, body) => format!(
                    "HTTP/1.1 {code} Whatever\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                ),
                Answer::Chunked(body) => {
                    let mut out =
                        String::from("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
                    let bytes = body.as_bytes();
                    for chunk in bytes.chunks(1000) {
                        out.push_str(&format!("{:x}\r\n", chunk.len()));
                        out.push_str(std::str::from_utf8(chunk).unwrap());
                        out.push_str("\r\n");
                    }
                    out + "0\r\n\r\n"
                }
                Answer::Nothing => {
                    let _ = released.recv_timeout(Duration::from_secs(60));
                    String::new()
                }
            };
            let _ = stream.write_all(response.as_bytes());
            request_line
        });
        FakeAgent {
            _dir: dir,
            socket,
            served: Some(served),
            _release: release,
        }
    }

    fn request_line(mut self) -> String {
        self.served.take().unwrap().join().unwrap()
    }
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

fn expected_backends() -> Vec<SocketAddr> {
    addrs(&[
        "[fd00:10:244:1::5]:53",
        "[fd00:10:244:2::7]:53",
        "10.244.1.5:53",
        "10.244.2.7:53",
    ])
}

#[test]
fn reads_the_service_list() {
    let agent = FakeAgent::start(Answer::Plain(200, SERVICES.into()));
    let k = discover(&agent.socket, &ServiceName::default()).unwrap();
    assert_eq!(k.udp, expected_backends());
    assert_eq!(k.tcp, expected_backends());
    assert_eq!(k.cluster_ip, Some("10.0.0.10".parse().unwrap()));
    assert_eq!(agent.request_line(), "GET /v1/service HTTP/1.0\r\n");
}

#[test]
fn reads_a_chunked_service_list() {
    let agent = FakeAgent::start(Answer::Chunked(SERVICES.into()));
    let k = discover(&agent.socket, &ServiceName::default()).unwrap();
    assert_eq!(k.udp, expected_backends());
    assert_eq!(k.tcp, expected_backends());
}

#[test]
fn an_error_status_is_an_error() {
    let agent = FakeAgent::start(Answer::Plain(500, "\"k8s cache not synced\"".into()));
    let err = discover(&agent.socket, &ServiceName::default()).unwrap_err();
    assert!(
        err.contains("500") && err.contains("k8s cache not synced"),
        "{err}"
    );
}

#[test]
fn a_silent_agent_times_out() {
    let agent = FakeAgent::start(Answer::Nothing);
    let started = Instant::now();
    let err = discover(&agent.socket, &ServiceName::default()).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(err.contains("did not answer"), "{err}");
}

#[test]
fn no_socket_no_agent() {
    let dir = TempDir::new();
    let missing = dir.0.join("absent.sock");
    let err = discover(&missing, &ServiceName::default()).unwrap_err();
    assert_eq!(
        err,
        format!("no Cilium agent socket at {}", missing.display())
    );
}

#[test]
fn a_dead_agent_refuses() {
    let dir = TempDir::new();
    // A socket file left behind by an agent that exited: nobody listens on it.
    let stale = dir.0.join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let err = discover(&stale, &ServiceName::default()).unwrap_err();
    assert!(err.contains("refuses connections"), "{err}");
}
