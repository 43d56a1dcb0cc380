//! The TCP shell's upstream side: tries over TCP go out on pooled, pipelined connections, a few
//! per upstream, each kept while it is used and closed after `IDLE` without work. A message read
//! back goes to the mailbox of the relay thread whose engine sent the try; whether it is an
//! acceptable answer is that engine's call.
//!
//! Every client falls back to TCP after a truncated answer, so a burst of big answers (a
//! headless service with many pods) lands here: a fresh connection per try cost a handshake and
//! a teardown each (measured: 6,004 QPS at 96 us of CPU per query).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use crate::engine::{Failure, Leg};
use crate::frame::{self, FrameDecoder};
use crate::mailbox::{Letter, Mailbox};
use crate::wire;

/// Tries in flight on one connection before another is opened beside it.
const PIPELINE: usize = 32;
/// Connections kept per upstream at most; beyond, tries share the least busy.
const CONNECTIONS_PER_UPSTREAM: usize = 8;
/// A connection with nothing in flight for this long is closed (CoreDNS's forward plugin keeps
/// idle upstream connections a similar few seconds).
const IDLE: Duration = Duration::from_secs(10);

/// One try handed to a connection.
struct Request {
    leg: Leg,
    message: Vec<u8>,
    mailbox: Arc<Mailbox>,
    /// Its place under the process-wide cap on tries in flight over TCP.
    _permit: OwnedSemaphorePermit,
    /// Already moved once from a connection that broke.
    retried: bool,
}

/// What the pool knows of a connection task.
struct Conn {
    requests: mpsc::UnboundedSender<Request>,
    inflight: AtomicUsize,
    closed: AtomicBool,
}

struct Inner {
    runtime: tokio::runtime::Handle,
    /// Tries in flight over TCP in the whole process: each connection holds a descriptor, and the
    /// process's descriptor limit is shared with its listeners and other clients.
    exchanges: Arc<Semaphore>,
    /// A try's budget: the engine has moved on by then, so the try is forgotten here too.
    budget: Duration,
    pools: Mutex<HashMap<SocketAddr, Vec<Arc<Conn>>>>,
}

/// The upstream TCP connections of the whole process, shared by every relay thread.
pub struct UpstreamSide {
    inner: Arc<Inner>,
}

impl UpstreamSide {
    pub fn new(
        runtime: tokio::runtime::Handle,
        max_exchanges: usize,
        budget: Duration,
    ) -> UpstreamSide {
        UpstreamSide {
            inner: Arc::new(Inner {
                runtime,
                exchanges: Arc::new(Semaphore::new(max_exchanges)),
                budget,
                pools: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Sends `message` to `leg.to` over TCP; every message read back is posted to `mailbox`.
    /// Fails at once (a local failure) when too many tries are in flight over TCP.
    pub fn start(&self, leg: Leg, message: Vec<u8>, mailbox: Arc<Mailbox>) -> Result<(), Failure> {
        let permit = self
            .inner
            .exchanges
            .clone()
            .try_acquire_owned()
            .map_err(|_| Failure::Local(io::ErrorKind::WouldBlock))?;
        submit(
            &self.inner,
            Request {
                leg,
                message,
                mailbox,
                _permit: permit,
                retried: false,
            },
        );
        Ok(())
    }
}

/// Hands a try to the least busy open connection to its upstream, opening one if all are busy.
fn submit(inner: &Arc<Inner>, mut request: Request) {
    let to = request.leg.to;
    for _ in 0..2 {
        let conn = pick(inner, to);
        conn.inflight.fetch_add(1, Relaxed);
        match conn.requests.send(request) {
            Ok(()) => return,
            // The connection ended between the pick and the send: try a fresh one.
            Err(mpsc::error::SendError(back)) => {
                conn.closed.store(true, Relaxed);
                request = back;
            }
        }
    }
    fail(
        &request,
        io::Error::other("no connection to the upstream could take the try"),
    );
}

fn pick(inner: &Arc<Inner>, to: SocketAddr) -> Arc<Conn> {
    let mut pools = inner.pools.lock().unwrap_or_else(|p| p.into_inner());
    let pool = pools.entry(to).or_default();
    pool.retain(|c| !c.closed.load(Relaxed));
    let least = pool
        .iter()
        .min_by_key(|c| c.inflight.load(Relaxed))
        .cloned();
    match least {
        Some(c)
            if c.inflight.load(Relaxed) < PIPELINE || pool.len() >= CONNECTIONS_PER_UPSTREAM =>
        {
            c
        }
        _ => {
            let (tx, rx) = mpsc::unbounded_channel();
            let conn = Arc::new(Conn {
                requests: tx,
                inflight: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
            });
            pool.push(conn.clone());
            inner
                .runtime
                .spawn(run_connection(inner.clone(), to, rx, conn.clone()));
            conn
        }
    }
}

fn fail(request: &Request, e: io::Error) {
    request.mailbox.post(Letter::UpstreamFailed {
        leg: request.leg,
        failure: Failure::from_io(&e),
    });
}

/// A try sent on the connection and not yet answered.
struct Waiting {
    request: Request,
    sent: Instant,
}

/// One upstream connection: connects, writes each try as it comes, passes on each message read,
/// and when it breaks moves its unanswered tries once to a fresh connection (a reused connection
/// the upstream closed while idle is no fault of the try) or fails them.
async fn run_connection(
    inner: Arc<Inner>,
    to: SocketAddr,
    mut requests: mpsc::UnboundedReceiver<Request>,
    conn: Arc<Conn>,
) {
    let mut waiting: HashMap<u16, Waiting> = HashMap::new();
    let broke = match tokio::time::timeout(inner.budget, connect(to)).await {
        Ok(Ok(stream)) => serve(&inner, stream, &mut requests, &conn, &mut waiting).await,
        Ok(Err(e)) => Some((e, false)),
        Err(_) => None,
    };
    conn.closed.store(true, Relaxed);
    requests.close();
    let mut left: Vec<Request> = waiting.into_values().map(|w| w.request).collect();
    while let Ok(r) = requests.try_recv() {
        left.push(r);
    }
    for mut request in left {
        match &broke {
            Some((_, true)) if !request.retried => {
                request.retried = true;
                submit(&inner, request);
            }
            Some((e, _)) => fail(&request, io::Error::new(e.kind(), e.to_string())),
            // Timed out connecting: the engine's own timers move its tries on.
            None => {}
        }
    }
}

async fn connect(to: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(to).await?;
    stream.set_nodelay(true)?;
    // Closed by us with a reset: a FIN would leave each closed connection in TIME-WAIT for a
    // minute, and under a burst that runs the node out of source ports.
    stream.set_zero_linger()?;
    Ok(stream)
}

/// Runs an open connection until it idles out or breaks. `Some((error, reused))` when it broke;
/// `reused` when it had answered before (its unanswered tries deserve another connection).
async fn serve(
    inner: &Inner,
    stream: TcpStream,
    requests: &mut mpsc::UnboundedReceiver<Request>,
    conn: &Conn,
    waiting: &mut HashMap<u16, Waiting>,
) -> Option<(io::Error, bool)> {
    let (mut reader, mut writer) = stream.into_split();
    let mut decoder = FrameDecoder::new(usize::from(u16::MAX));
    let mut chunk = vec![0u8; 16 * 1024];
    let mut framed = Vec::new();
    let mut answered = 0usize;
    let mut idle_since = Instant::now();
    // Each connection numbers its own tries: relay threads choose their IDs independently, and
    // two of them may pick the same one for the same upstream. (Over TCP an off-path spoofer
    // cannot inject a reply, so these need not be random.)
    let mut next_id: u16 = 0;
    let mut sweep = tokio::time::interval(inner.budget.max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            request = requests.recv() => {
                let mut request = request?;
                while waiting.contains_key(&next_id) {
                    next_id = next_id.wrapping_add(1);
                }
                let local = next_id;
                next_id = next_id.wrapping_add(1);
                wire::set_id(&mut request.message, local);
                framed.clear();
                frame::encode(&request.message, &mut framed);
                let written = tokio::time::timeout(inner.budget, writer.write_all(&framed)).await;
                waiting.insert(local, Waiting { request, sent: Instant::now() });
                match written {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Some((e, answered > 0)),
                    Err(_) => return Some((io::Error::new(io::ErrorKind::TimedOut, "the upstream does not read"), answered > 0)),
                }
            }
            read = reader.read(&mut chunk) => {
                let n = match read {
                    Ok(0) => return Some((io::Error::new(io::ErrorKind::UnexpectedEof, "the upstream closed the connection"), answered > 0)),
                    Ok(n) => n,
                    Err(e) => return Some((e, answered > 0)),
                };
                decoder.feed(&chunk[..n]);
                loop {
                    let reply = match decoder.next_frame() {
                        Ok(Some(reply)) => reply,
                        Ok(None) => break,
                        Err(_) => return Some((io::Error::new(io::ErrorKind::InvalidData, "a frame over 65,535 bytes"), answered > 0)),
                    };
                    if reply.len() < wire::HEADER_LEN {
                        continue;
                    }
                    if let Some(w) = waiting.remove(&wire::id(reply)) {
                        conn.inflight.fetch_sub(1, Relaxed);
                        answered += 1;
                        let mut reply = reply.to_vec();
                        wire::set_id(&mut reply, w.request.leg.id);
                        w.request.mailbox.post(Letter::UpstreamReply { leg: w.request.leg, reply });
                    }
                }
                if waiting.is_empty() {
                    idle_since = Instant::now();
                }
            }
            _ = sweep.tick() => {
                // Tries past their budget are the engine's business now; forget them here.
                let budget = inner.budget;
                let before = waiting.len();
                waiting.retain(|_, w| w.sent.elapsed() < budget);
                conn.inflight.fetch_sub(before - waiting.len(), Relaxed);
                if waiting.is_empty() && idle_since.elapsed() >= IDLE {
                    return None;
                }
            }
        }
    }
}
