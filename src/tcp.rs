//! The TCP shell: client connections and upstream exchanges. These tasks only move frames: every
//! decision about a query is made by the engine of the relay thread a connection is assigned
//! to, which they reach through its [`Mailbox`].
//!
//! TCP is the rare path (truncated answers, some clients): a task per client connection, a task
//! per upstream exchange, and a fresh TCP connection upstream per try.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Instant;

use crate::engine::{ConnId, Failure, Leg};
use crate::frame::{self, FrameDecoder};
use crate::mailbox::{Letter, Mailbox};
use crate::roles::ListenerRole;
use crate::wire;

/// Queries one TCP client connection may have in flight at once (RFC 7766 pipelining).
const TCP_PIPELINE: usize = 32;
/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 4096;

/// Connection IDs are unique in the process, so a relay thread never mixes two connections up.
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// What the TCP client connections of one listener share.
pub struct ClientSide {
    pub role: ListenerRole,
    /// The relay threads of this listener; connections are spread over them in turn.
    pub mailboxes: Vec<Arc<Mailbox>>,
    next: AtomicUsize,
    /// Caps connections: over it a new one is closed at once.
    connections: Arc<Semaphore>,
    /// A client that does not send a whole query for this long is closed.
    idle: Duration,
    /// How long a closing connection waits for answers to queries it already sent.
    answer_wait: Duration,
}

impl ClientSide {
    pub fn new(
        role: ListenerRole,
        mailboxes: Vec<Arc<Mailbox>>,
        max_connections: usize,
        idle: Duration,
        answer_wait: Duration,
    ) -> ClientSide {
        ClientSide {
            role,
            mailboxes,
            next: AtomicUsize::new(0),
            connections: Arc::new(Semaphore::new(max_connections)),
            idle,
            answer_wait,
        }
    }
}

/// Accepts TCP clients until `stop` turns true, then drops the listening socket at once.
/// `drain` is held by every connection so the caller can wait for them to finish.
pub async fn serve(
    socket: TcpListener,
    side: Arc<ClientSide>,
    mut stop: watch::Receiver<bool>,
    drain: mpsc::Sender<()>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            _ = stop.changed() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Usually EMFILE: back off instead of spinning on the error.
                tracing::warn!(error = %e, listener = side.role.name(), "TCP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Over the cap the connection is closed at once: a client would rather see that than hang.
        let Ok(permit) = side.connections.clone().try_acquire_owned() else {
            continue;
        };
        let turn = side.next.fetch_add(1, Ordering::Relaxed) % side.mailboxes.len();
        let mailbox = side.mailboxes[turn].clone();
        tokio::spawn(connection(
            stream,
            side.clone(),
            mailbox,
            stop.clone(),
            (drain.clone(), permit),
        ));
    }
}

async fn connection(
    stream: TcpStream,
    side: Arc<ClientSide>,
    mailbox: Arc<Mailbox>,
    mut stop: watch::Receiver<bool>,
    _held: (mpsc::Sender<()>, OwnedSemaphorePermit),
) {
    let _ = stream.set_nodelay(true);
    let conn: ConnId = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let (mut reader, mut writer) = stream.into_split();
    let (replies, mut outbox) = mpsc::channel::<Vec<u8>>(TCP_PIPELINE);
    mailbox.post(Letter::TcpOpened { conn, replies });
    // One permit per query that may be in flight; each reply (or "dropped") gives one back.
    let slots = Arc::new(Semaphore::new(TCP_PIPELINE));
    let idle = side.idle;
    let returned = slots.clone();
    let write_side = tokio::spawn(async move {
        let mut framed = Vec::new();
        while let Some(reply) = outbox.recv().await {
            returned.add_permits(1);
            if reply.is_empty() {
                continue;
            }
            framed.clear();
            frame::encode(&reply, &mut framed);
            match tokio::time::timeout(idle, writer.write_all(&framed)).await {
                Ok(Ok(())) => {}
                _ => return,
            }
        }
    });
    let mut decoder = FrameDecoder::new(wire::MAX_QUERY);
    let mut chunk = vec![0u8; READ_CHUNK];
    // The whole frame must arrive within the idle timeout, so a client that dribbles bytes
    // (slowloris) cannot hold a connection slot for longer than an idle one.
    let mut deadline = Instant::now() + idle;
    'read: loop {
        let n = tokio::select! {
            read = tokio::time::timeout_at(deadline, reader.read(&mut chunk)) => match read {
                Ok(Ok(n)) if n > 0 => n,
                _ => break,
            },
            _ = stop.changed() => break,
        };
        decoder.feed(&chunk[..n]);
        loop {
            let query = match decoder.next_frame() {
                Ok(Some(query)) => query.to_vec(),
                Ok(None) => break,
                // Not worth reading: a query this big is no stub's.
                Err(_) => break 'read,
            };
            let Ok(slot) = slots.acquire().await else {
                break 'read;
            };
            slot.forget();
            mailbox.post(Letter::TcpQuery { conn, query });
            deadline = Instant::now() + idle;
        }
    }
    // Answers to queries already sent still go out, within the query budget.
    let pending = u32::try_from(TCP_PIPELINE).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(side.answer_wait, slots.acquire_many(pending)).await;
    mailbox.post(Letter::TcpClosed { conn });
    let _ = write_side.await;
}

/// Upstream TCP exchanges, started by a relay thread, run on the async runtime.
pub struct UpstreamSide {
    runtime: tokio::runtime::Handle,
    /// Exchanges in flight in the whole process: each holds a descriptor, and the process has a
    /// descriptor limit that its own listeners and other clients need too.
    exchanges: Arc<Semaphore>,
    /// A try's budget; the engine has moved on by then, so the exchange is abandoned.
    budget: Duration,
}

impl UpstreamSide {
    pub fn new(
        runtime: tokio::runtime::Handle,
        max_exchanges: usize,
        budget: Duration,
    ) -> UpstreamSide {
        UpstreamSide {
            runtime,
            exchanges: Arc::new(Semaphore::new(max_exchanges)),
            budget,
        }
    }

    /// Starts sending `message` to `leg.to` over a new TCP connection; every message read back
    /// is posted to `mailbox`. Fails at once (a local failure) when too many are in flight.
    pub fn start(&self, leg: Leg, message: Vec<u8>, mailbox: Arc<Mailbox>) -> Result<(), Failure> {
        let permit = self
            .exchanges
            .clone()
            .try_acquire_owned()
            .map_err(|_| Failure::Local(io::ErrorKind::WouldBlock))?;
        let budget = self.budget;
        self.runtime.spawn(async move {
            let _permit = permit;
            // A try that runs out of time is the engine's business (its own timer fires); only
            // errors the network reported are posted.
            if let Ok(Err(e)) =
                tokio::time::timeout(budget, exchange(leg, &message, &mailbox)).await
            {
                mailbox.post(Letter::UpstreamFailed {
                    leg,
                    failure: Failure::from_io(&e),
                });
            }
        });
        Ok(())
    }
}

/// One try over TCP: connect, send, and pass on what comes back until the message with the
/// try's ID (whether the engine accepts it is the engine's call).
async fn exchange(leg: Leg, message: &[u8], mailbox: &Mailbox) -> io::Result<()> {
    let mut stream = TcpStream::connect(leg.to).await?;
    stream.set_nodelay(true)?;
    // One connection per try, closed by us: without this each would sit in TIME-WAIT for a
    // minute, and a few hundred TCP queries a second would run the node out of source ports
    // (measured: 15,000 TIME-WAIT sockets in 3 s). An abortive close leaves none.
    stream.set_zero_linger()?;
    let mut framed = Vec::with_capacity(message.len() + 2);
    frame::encode(message, &mut framed);
    stream.write_all(&framed).await?;
    let mut decoder = FrameDecoder::new(usize::from(u16::MAX));
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before the reply",
            ));
        }
        decoder.feed(&chunk[..n]);
        while let Some(reply) = decoder
            .next_frame()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "frame over 65,535 bytes"))?
        {
            let done = reply.len() >= 2 && wire::id(reply) == leg.id;
            mailbox.post(Letter::UpstreamReply {
                leg,
                reply: reply.to_vec(),
            });
            if done {
                return Ok(());
            }
        }
    }
}
