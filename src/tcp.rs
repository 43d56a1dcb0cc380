//! The TCP shell's client side: a task per client connection. These tasks only move frames:
//! every decision about a query is made by the engine of the relay thread a connection is
//! assigned to, which they reach through its [`Mailbox`]. The upstream side is in
//! [`crate::tcp_pool`].
//!
//! Connections are capped per listener, and the cap must never lock real clients out: a pod that
//! opens hundreds of connections and sends nothing would otherwise hold every slot until the idle
//! timeout, and TCP is where every client goes after a truncated answer. So a new client over the
//! cap (or one the kernel has no descriptor for) closes the connection that has been idle longest
//! in its place, as unbound and dnsdist do; only when every connection has a query in flight is
//! the new one turned away. Past half the cap, a connection that goes idle gets less time, down
//! to a tenth of `--tcp-idle-timeout` when full.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use crate::engine::ConnId;
use crate::frame::{self, FrameDecoder};
use crate::mailbox::{Letter, Mailbox};
use crate::roles::ListenerRole;
use crate::stop::Stop;
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
    /// Caps connections: over it the longest idle one makes room, or the new one is closed.
    connections: Arc<Semaphore>,
    cap: usize,
    /// A client that does not send a whole query for this long is closed.
    idle: Duration,
    /// How long a closing connection waits for answers to queries it already sent.
    answer_wait: Duration,
    /// The open connections, to pick the one idle the longest when the cap is reached. Each
    /// connection marks itself idle or busy in its own atomic (no lock per query); only opening,
    /// closing and the rare eviction take the lock.
    open: Mutex<HashMap<ConnId, Arc<Conn>>>,
    /// The origin of `Conn::idle_since_ms`.
    epoch: Instant,
}

/// What the listener knows of one connection.
#[derive(Default)]
struct Conn {
    /// Since when it waits for a query, in ms since `ClientSide::epoch` plus one; 0 while a query
    /// is being read.
    idle_since_ms: AtomicU64,
    close: Notify,
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
            cap: max_connections,
            idle,
            answer_wait,
            open: Mutex::default(),
            epoch: Instant::now(),
        }
    }

    /// Completes once every connection has ended (each holds a permit for its life).
    pub async fn closed(&self) {
        let _ = self.connections.acquire_many(self.cap as u32).await;
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<ConnId, Arc<Conn>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn opened(&self, conn: ConnId) -> Arc<Conn> {
        let state = Arc::new(Conn::default());
        self.open().insert(conn, state.clone());
        state
    }

    /// The connection waits for a query from `since` on (Some), or is busy with one (None).
    fn set_idle(&self, conn: &Conn, since: Option<Instant>) {
        let ms = since.map_or(0, |t| {
            t.saturating_duration_since(self.epoch).as_millis() as u64 + 1
        });
        conn.idle_since_ms.store(ms, Ordering::Relaxed);
    }

    /// Tells every open connection to stop reading: the stop (each still waits for the answers
    /// to what it asked).
    fn close_all(&self) {
        self.open().values().for_each(|c| c.close.notify_one());
    }

    /// Closes the connection idle the longest; false when none is idle. A walk over at most
    /// `--max-tcp-connections` entries, only when the cap is reached.
    fn close_longest_idle(&self) -> bool {
        let open = self.open();
        let longest = open
            .iter()
            .map(|(id, c)| (c.idle_since_ms.load(Ordering::Relaxed), *id, c))
            .filter(|(since, ..)| *since != 0)
            .min_by_key(|(since, id, _)| (*since, *id));
        let Some((since, conn, c)) = longest else {
            return false;
        };
        // Taken out of the running at once; notify_one keeps the wake-up for a task not waiting yet.
        c.idle_since_ms.store(0, Ordering::Relaxed);
        c.close.notify_one();
        let idle_for = (self.epoch.elapsed().as_millis() as u64 + 1).saturating_sub(since);
        tracing::debug!(
            conn,
            idle_for_ms = idle_for,
            "closing the longest idle TCP client for a new one"
        );
        true
    }

    /// How long a connection that goes idle now may stay so: the whole `--tcp-idle-timeout` up
    /// to half the cap in use, then less, down to a tenth when full.
    fn idle_timeout(&self) -> Duration {
        let cap = self.cap.max(1);
        let used = cap.saturating_sub(self.connections.available_permits());
        idle_timeout_at(self.idle, used, cap)
    }
}

fn idle_timeout_at(idle: Duration, used: usize, cap: usize) -> Duration {
    let free = cap.saturating_sub(used);
    if free * 2 >= cap {
        return idle;
    }
    // Linear from the whole timeout at half use to a tenth when full.
    let scaled = idle.mul_f64(free as f64 * 2.0 / cap as f64);
    scaled.max(idle / 10)
}

/// The client connections each of the two listeners may hold under the descriptor limit: the soft
/// limit is raised to the hard one first (a hand start often has 1,024 of a much higher hard
/// limit); `others` descriptors are kept for everything else (upstream sockets, TCP connections
/// to upstreams, the listeners, the runtime).
pub fn connection_cap(configured: usize, others: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((mut limit, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return configured;
    };
    if limit < hard && setrlimit(Resource::RLIMIT_NOFILE, hard.min(1 << 20), hard).is_ok() {
        limit = hard.min(1 << 20);
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let cap = budget(configured, limit, others);
    if cap < configured {
        tracing::warn!(
            configured,
            cap,
            descriptors = limit,
            "too few descriptors for --max-tcp-connections; capping TCP clients per listener lower"
        );
    }
    cap
}

fn budget(configured: usize, limit: usize, others: usize) -> usize {
    (limit.saturating_sub(others) / 2).clamp(1, configured.max(1))
}

/// Accepts TCP clients until `stop`, then drops the listening socket at once and tells the
/// connections. Each holds a permit of `side` until it ends, so the caller can wait for them
/// ([`ClientSide::closed`]).
pub async fn serve(socket: TcpListener, side: Arc<ClientSide>, stop: Arc<Stop>) {
    let warned = &mut (std::time::Instant::now() - Duration::from_secs(60));
    let stopped = stop.stopped();
    tokio::pin!(stopped);
    loop {
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            () = &mut stopped => return side.close_all(),
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Usually EMFILE: a descriptor comes back when the longest idle client goes;
                // without one, back off instead of spinning on the error.
                let freed = side.close_longest_idle();
                let now = std::time::Instant::now();
                if now.duration_since(*warned) >= Duration::from_secs(10) {
                    tracing::warn!(error = %e, listener = side.role.name(), "TCP accept failed; closing the longest idle client");
                    *warned = now;
                }
                let pause = if freed { 5 } else { 50 };
                tokio::time::sleep(Duration::from_millis(pause)).await;
                continue;
            }
        };
        let permit = match side.connections.clone().try_acquire_owned() {
            Ok(permit) => permit,
            // Over the cap the longest idle connection makes room; with every connection busy
            // the new one is closed at once: a client would rather see that than hang.
            Err(_) if side.close_longest_idle() => {
                let room = side.connections.clone().acquire_owned();
                let Ok(Ok(permit)) = tokio::time::timeout(Duration::from_millis(200), room).await
                else {
                    continue;
                };
                permit
            }
            Err(_) => continue,
        };
        let turn = side.next.fetch_add(1, Ordering::Relaxed) % side.mailboxes.len();
        let mailbox = side.mailboxes[turn].clone();
        tokio::spawn(connection(stream, side.clone(), mailbox, permit));
    }
}

async fn connection(
    stream: TcpStream,
    side: Arc<ClientSide>,
    mailbox: Arc<Mailbox>,
    _permit: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let conn: ConnId = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let state = side.opened(conn);
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
            let Ok(Ok(())) = tokio::time::timeout(idle, writer.write_all(&framed)).await else {
                return;
            };
        }
    });
    let mut decoder = FrameDecoder::new(wire::MAX_QUERY);
    let mut chunk = vec![0u8; READ_CHUNK];
    // The whole frame must arrive within the idle timeout, so a client that dribbles bytes
    // (slowloris) cannot hold a connection slot for longer than an idle one.
    let started = Instant::now();
    side.set_idle(&state, Some(started));
    let mut deadline = started + side.idle_timeout();
    'read: loop {
        let n = tokio::select! {
            read = tokio::time::timeout_at(deadline, reader.read(&mut chunk)) => match read {
                Ok(Ok(n)) if n > 0 => n,
                _ => break,
            },
            () = state.close.notified() => break,
        };
        side.set_idle(&state, None);
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
            deadline = Instant::now() + side.idle_timeout();
        }
        // Waiting for a query again, with none partly read: it may be closed for a new client.
        // (A client with queries in flight counts as idle too: its answers are on their way and
        // the close waits for them below.)
        if !decoder.mid_frame() {
            side.set_idle(&state, Some(Instant::now()));
        }
    }
    side.open().remove(&conn);
    // Answers to queries already sent still go out, within the query budget.
    let pending = u32::try_from(TCP_PIPELINE).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(side.answer_wait, slots.acquire_many(pending)).await;
    mailbox.post(Letter::TcpClosed { conn });
    let _ = write_side.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_timeout_shrinks_past_half_the_cap_to_a_tenth_when_full() {
        let idle = Duration::from_secs(10);
        assert_eq!(idle_timeout_at(idle, 0, 256), idle);
        assert_eq!(idle_timeout_at(idle, 128, 256), idle);
        assert_eq!(idle_timeout_at(idle, 192, 256), Duration::from_secs(5));
        assert_eq!(idle_timeout_at(idle, 256, 256), Duration::from_secs(1));
        assert_eq!(idle_timeout_at(idle, 255, 256), Duration::from_secs(1));
    }

    #[test]
    fn the_descriptor_budget_splits_what_is_left_between_the_listeners() {
        assert_eq!(budget(256, 8192, 600), 256);
        assert_eq!(budget(256, 1024, 600), 212);
        assert_eq!(budget(256, 500, 600), 1);
    }

    #[tokio::test]
    async fn the_longest_idle_connection_is_closed_first_and_busy_ones_never() {
        let side = ClientSide::new(
            ListenerRole::Node,
            Vec::new(),
            4,
            Duration::from_secs(10),
            Duration::from_secs(1),
        );
        let t0 = Instant::now();
        let conns: Vec<_> = (1..=3).map(|c| side.opened(c)).collect();
        side.set_idle(&conns[1], Some(t0));
        side.set_idle(&conns[0], Some(t0 + Duration::from_millis(5)));
        // 3 is busy with a query.
        let told = |c: &Arc<Conn>| {
            let c = c.clone();
            async move {
                tokio::time::timeout(Duration::from_millis(10), c.close.notified())
                    .await
                    .is_ok()
            }
        };
        assert!(side.close_longest_idle());
        assert!(told(&conns[1]).await, "the longest idle goes first");
        assert!(!told(&conns[0]).await);
        assert!(side.close_longest_idle());
        assert!(told(&conns[0]).await);
        assert!(!side.close_longest_idle(), "the busy one stays");
        for c in 1..=3 {
            side.open().remove(&c);
        }
        assert!(side.open().is_empty());
    }
}
