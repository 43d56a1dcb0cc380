//! The TCP shell's upstream side: tries over TCP go out on pooled, pipelined connections, a few
//! per upstream, each kept while it is used and closed after `IDLE` without work. A message read
//! back goes to the mailbox of the relay thread whose engine sent the try; whether it is an
//! acceptable answer is that engine's call.
//!
//! Every client falls back to TCP after a truncated answer, so a burst of big answers (a
//! headless service with many pods) lands here: a fresh connection per try cost a handshake and
//! a teardown each (measured: 6,004 QPS at 96 us of CPU per query).
//!
//! Every limit here is per upstream, so a hung upstream holds up only its own tries: one that
//! has as many in flight as it may gets the next try refused at once, and the engine moves on.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
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
/// Tries in flight to one upstream at most; more are refused as a local failure rather than
/// queued behind a hung upstream.
const TRIES_PER_UPSTREAM: usize = CONNECTIONS_PER_UPSTREAM * PIPELINE;
/// Upstreams per group the descriptor reserve counts on, as it does for the UDP sockets.
const UPSTREAMS_PER_GROUP: usize = 4;
/// Connections beyond each upstream's first, in the whole process: with up to four upstreams a
/// group every upstream can open all of its own. A first connection needs none of these, so
/// however many upstreams a troubled group has, every other upstream keeps one.
const SHARED_CONNECTIONS: usize = 2 * UPSTREAMS_PER_GROUP * (CONNECTIONS_PER_UPSTREAM - 1);
/// The descriptors the pool holds at most with four upstreams a group: kept for it at start-up.
pub const DESCRIPTORS: usize = 2 * UPSTREAMS_PER_GROUP * CONNECTIONS_PER_UPSTREAM;
/// Why a try was refused: its upstream has all the tries in flight it may.
const BUSY: Failure = Failure::Local(io::ErrorKind::WouldBlock);
/// A connection with nothing in flight for this long is closed (CoreDNS's forward plugin keeps
/// idle upstream connections a similar few seconds).
const IDLE: Duration = Duration::from_secs(10);

/// One try handed to a connection.
struct Request {
    leg: Leg,
    message: Vec<u8>,
    mailbox: Arc<Mailbox>,
    /// Already moved once from a connection that broke.
    retried: bool,
}

/// What the pool knows of a connection task.
struct Conn {
    requests: mpsc::UnboundedSender<Request>,
    inflight: AtomicUsize,
}

/// The upstream TCP connections of the whole process, shared by every relay thread.
pub struct UpstreamSide {
    runtime: tokio::runtime::Handle,
    /// `SHARED_CONNECTIONS`: each connection holds a descriptor, and the process's descriptor
    /// limit is shared with its listeners and clients.
    shared_connections: Arc<Semaphore>,
    /// A try's budget: the engine has moved on by then, so the try is forgotten here too.
    budget: Duration,
    pools: Mutex<HashMap<SocketAddr, Vec<Arc<Conn>>>>,
}

impl UpstreamSide {
    pub fn new(runtime: tokio::runtime::Handle, budget: Duration) -> Arc<UpstreamSide> {
        Arc::new(UpstreamSide {
            runtime,
            shared_connections: Arc::new(Semaphore::new(SHARED_CONNECTIONS)),
            budget,
            pools: Mutex::new(HashMap::new()),
        })
    }

    /// Sends `message` to `leg.to` over TCP; every message read back is posted to `mailbox`.
    /// Fails at once (a local failure, which the engine does not hold against the upstream)
    /// when the upstream has all the tries in flight it may: the query moves on instead of
    /// waiting behind a hung upstream.
    pub fn start(
        self: &Arc<Self>,
        leg: Leg,
        message: Vec<u8>,
        mailbox: Arc<Mailbox>,
    ) -> Result<(), Failure> {
        let request = Request {
            leg,
            message,
            mailbox,
            retried: false,
        };
        submit(self, request).map_err(|_| BUSY)
    }
}

/// Hands a try to a connection to its upstream; gives it back when the upstream has all the
/// tries in flight it may.
fn submit(side: &Arc<UpstreamSide>, mut request: Request) -> Result<(), Request> {
    // Twice: the connection picked may end before the send.
    for _ in 0..2 {
        let Some(conn) = pick(side, request.leg.to) else {
            break;
        };
        match conn.requests.send(request) {
            Ok(()) => return Ok(()),
            Err(mpsc::error::SendError(back)) => request = back,
        }
    }
    Err(request)
}

/// The least busy open connection to `to`, or a new one beside it when all are busy, with the
/// try counted on it; None when `to` has `TRIES_PER_UPSTREAM` in flight. Counted under the
/// lock, so relay threads picking at once cannot overshoot the cap.
fn pick(side: &Arc<UpstreamSide>, to: SocketAddr) -> Option<Arc<Conn>> {
    let mut pools = side.pools.lock().unwrap_or_else(|p| p.into_inner());
    let pool = pools.entry(to).or_default();
    pool.retain(|c| !c.requests.is_closed());
    let inflight = |c: &Arc<Conn>| c.inflight.load(Relaxed);
    if pool.iter().map(inflight).sum::<usize>() >= TRIES_PER_UPSTREAM {
        return None;
    }
    let least = pool.iter().min_by_key(|c| inflight(c)).cloned();
    let conn = match least {
        Some(c) if inflight(&c) < PIPELINE || pool.len() >= CONNECTIONS_PER_UPSTREAM => c,
        Some(c) => match side.shared_connections.clone().try_acquire_owned() {
            Ok(permit) => open(side, to, pool, Some(permit)),
            // The other upstreams hold every shared connection: this one's take more tries.
            Err(_) => c,
        },
        None => open(side, to, pool, None),
    };
    conn.inflight.fetch_add(1, Relaxed);
    Some(conn)
}

/// A new connection to `to` in `pool`; `permit` is its place among `SHARED_CONNECTIONS`.
fn open(
    side: &Arc<UpstreamSide>,
    to: SocketAddr,
    pool: &mut Vec<Arc<Conn>>,
    permit: Option<OwnedSemaphorePermit>,
) -> Arc<Conn> {
    let (tx, rx) = mpsc::unbounded_channel();
    let conn = Arc::new(Conn {
        requests: tx,
        inflight: AtomicUsize::new(0),
    });
    pool.push(conn.clone());
    side.runtime
        .spawn(run_connection(side.clone(), to, rx, conn.clone(), permit));
    conn
}

/// One upstream connection: connects, writes each try as it comes, passes on each message read,
/// and when it breaks moves its unanswered tries once to a fresh connection (a reused connection
/// the upstream closed while idle is no fault of the try) or fails them.
async fn run_connection(
    side: Arc<UpstreamSide>,
    to: SocketAddr,
    mut requests: mpsc::UnboundedReceiver<Request>,
    conn: Arc<Conn>,
    _permit: Option<OwnedSemaphorePermit>,
) {
    // Tries sent on the connection and not yet answered, with when they were sent.
    let mut waiting: HashMap<u16, (Request, Instant)> = HashMap::new();
    // Whether it answered before it broke: its unanswered tries then deserve another connection.
    let reused = &mut false;
    let broke = match tokio::time::timeout(side.budget, connect(to)).await {
        Ok(Ok(stream)) => serve(&side, stream, &mut requests, &conn, &mut waiting, reused)
            .await
            .err(),
        Ok(Err(e)) => Some(e),
        Err(_) => None,
    };
    requests.close();
    let queued = std::iter::from_fn(|| requests.try_recv().ok());
    for mut request in waiting.into_values().map(|(r, _)| r).chain(queued) {
        let failure = match &broke {
            Some(_) if *reused && !request.retried => {
                request.retried = true;
                match submit(&side, request) {
                    Ok(()) => continue,
                    Err(back) => {
                        request = back;
                        BUSY
                    }
                }
            }
            Some(e) => Failure::from_io(e),
            // Timed out connecting: the engine's own timers move its tries on.
            None => continue,
        };
        request.mailbox.post(Letter::UpstreamFailed {
            leg: request.leg,
            failure,
        });
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

/// Runs an open connection until it idles out (`Ok`) or breaks; sets `answered` at its first
/// reply passed on.
async fn serve(
    side: &UpstreamSide,
    stream: TcpStream,
    requests: &mut mpsc::UnboundedReceiver<Request>,
    conn: &Conn,
    waiting: &mut HashMap<u16, (Request, Instant)>,
    answered: &mut bool,
) -> io::Result<()> {
    let (mut reader, mut writer) = stream.into_split();
    let mut decoder = FrameDecoder::new(usize::from(u16::MAX));
    let mut chunk = vec![0u8; 16 * 1024];
    let mut framed = Vec::new();
    let mut idle_since = Instant::now();
    // Each connection numbers its own tries: relay threads choose their IDs independently, and
    // two of them may pick the same one for the same upstream. (Over TCP an off-path spoofer
    // cannot inject a reply, so these need not be random.)
    let mut next_id: u16 = 0;
    let mut sweep = tokio::time::interval(side.budget.max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            request = requests.recv() => {
                let Some(mut request) = request else {
                    return Ok(());
                };
                while waiting.contains_key(&next_id) {
                    next_id = next_id.wrapping_add(1);
                }
                let local = next_id;
                next_id = next_id.wrapping_add(1);
                wire::set_id(&mut request.message, local);
                framed.clear();
                frame::encode(&request.message, &mut framed);
                let written = tokio::time::timeout(side.budget, writer.write_all(&framed)).await;
                waiting.insert(local, (request, Instant::now()));
                written.map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the upstream does not read"))??;
            }
            read = reader.read(&mut chunk) => {
                let n = match read? {
                    0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the upstream closed the connection")),
                    n => n,
                };
                decoder.feed(&chunk[..n]);
                let too_long = |_| io::Error::new(io::ErrorKind::InvalidData, "a frame over 65,535 bytes");
                while let Some(reply) = decoder.next_frame().map_err(too_long)? {
                    if reply.len() < wire::HEADER_LEN {
                        continue;
                    }
                    if let Some((request, _)) = waiting.remove(&wire::id(reply)) {
                        conn.inflight.fetch_sub(1, Relaxed);
                        *answered = true;
                        let mut reply = reply.to_vec();
                        wire::set_id(&mut reply, request.leg.id);
                        request.mailbox.post(Letter::UpstreamReply { leg: request.leg, reply });
                    }
                }
                if waiting.is_empty() {
                    idle_since = Instant::now();
                }
            }
            _ = sweep.tick() => {
                // Tries past their budget are the engine's business now; forget them here.
                let budget = side.budget;
                let before = waiting.len();
                waiting.retain(|_, (_, sent)| sent.elapsed() < budget);
                conn.inflight.fetch_sub(before - waiting.len(), Relaxed);
                if waiting.is_empty() && idle_since.elapsed() >= IDLE {
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Via;
    use tokio::net::TcpListener;

    /// An upstream on loopback that accepts connections and never answers.
    async fn hung_upstream() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local_addr");
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        addr
    }

    /// An upstream on loopback that sends every frame back as its reply.
    async fn echoing_upstream() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local_addr");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn leg(to: SocketAddr, id: u16) -> Leg {
        Leg {
            via: Via::Tcp,
            to,
            id,
        }
    }

    #[tokio::test]
    async fn a_hung_upstream_refuses_its_own_tries_at_once_and_no_other_upstreams() {
        let side = UpstreamSide::new(tokio::runtime::Handle::current(), Duration::from_secs(5));
        let mailbox = Mailbox::new().expect("eventfd");
        let (hung, healthy) = (hung_upstream().await, echoing_upstream().await);
        let query = vec![0u8; wire::HEADER_LEN];
        for id in 0..TRIES_PER_UPSTREAM as u16 {
            assert_eq!(
                side.start(leg(hung, id), query.clone(), mailbox.clone()),
                Ok(())
            );
        }
        assert_eq!(
            side.start(leg(hung, 9999), query.clone(), mailbox.clone()),
            Err(BUSY),
            "over its cap a try is refused at once, as a local failure"
        );
        assert_eq!(side.start(leg(healthy, 7), query, mailbox.clone()), Ok(()));
        let mut letters = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(2);
        while !letters
            .iter()
            .any(|l| matches!(l, Letter::UpstreamReply { leg, .. } if leg.to == healthy))
        {
            assert!(
                Instant::now() < deadline,
                "no reply from the healthy upstream"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
            let mut more = Vec::new();
            mailbox.take(&mut more);
            letters.extend(more);
        }
        assert!(
            !letters
                .iter()
                .any(|l| matches!(l, Letter::UpstreamFailed { .. })),
            "{letters:?}"
        );
    }
}
