//! The TCP shell's client side: a task per client connection. These tasks only move frames:
//! every decision about a query is made by the engine of the relay thread a connection is
//! assigned to, which they reach through its [`Mailbox`]. The upstream side is in
//! [`crate::tcp_pool`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Instant;

use crate::engine::ConnId;
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
