//! A relay thread: the IO shell around one [`Engine`]. It owns one listener's UDP socket (shared
//! with the listener's other relay threads, if any), its own UDP sockets connected to each
//! upstream (several per upstream, each on a random source port), and the mailbox through which
//! the TCP tasks hand it client queries and upstream replies.
//!
//! A datagram is read, decided on and sent by this one thread, with no channel or task in
//! between: per-packet hand-offs between threads were measured as the real cost of a relay. The
//! thread waits in epoll for whichever sockets are readable, reads what each has queued (one
//! `recvmmsg`), runs the engine's timers and waits again; what the engine queued meanwhile leaves
//! in one `sendmmsg` per socket. Plain non-blocking syscalls, since an async runtime would learn
//! of new datagrams only when its reactor next runs (a wake-up and a hand-off per burst).
//!
//! Here: the loop, and the forwarding path through it (read, engine, flush). Beside it:
//! `upstream_sockets` (the connected sockets to each upstream) and `events` (engine events as
//! rate-limited log lines).

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::PollTimeout;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use tokio::sync::{mpsc, watch};

use crate::engine::{Client, ConnId, Dest, Engine, Failure, Leg, Outcome, Via};
use crate::handoff::Drain;
use crate::mailbox::{Letter, Mailbox};
use crate::mmsg::{RecvBatch, SendBatch};
use crate::standby::{OwnProbes, Strays};
use crate::stop::Stop;

mod events;
mod upstream_sockets;

use crate::roles::{Transport, UpstreamGroup};
use crate::stats::ListenerStats;
use crate::systemd::Heartbeats;
use crate::tcp_pool::UpstreamSide;
use crate::upstream::UpstreamSets;
use events::EventLog;
use upstream_sockets::UpstreamSockets;

/// Datagrams read from one socket (one `recvmmsg`) before looking at the others, so no socket
/// starves the rest; also the replies sent to clients by one `sendmmsg`.
const BATCH: usize = 64;
/// Longest an idle loop sleeps before going round (and beating its heartbeat) again.
const HEARTBEAT_IDLE: Duration = Duration::from_millis(500);
/// How long queries already read may take to finish after the listeners close (TCP clients in
/// the middle of an exchange). LocalDNS is waiting to start, so this stays short.
pub const DRAIN: Duration = Duration::from_secs(1);

/// epoll tokens: the stop eventfd, the mailbox, the listener; upstream socket `i` is `i`.
const STOP_TOKEN: u64 = u64::MAX;
const MAILBOX_TOKEN: u64 = u64::MAX - 1;
const LISTENER_TOKEN: u64 = u64::MAX - 2;
/// The tag of the listener in the send batch; upstream sockets are tagged with their index in
/// `UpstreamSockets`. Sorted last, so the queries of a flush leave before its replies.
const LISTENER_TAG: usize = usize::MAX;

/// Where a relay thread is in its life. The stop moves it out of `Serving`, once; the thread
/// returns when the phase it moved to says it is over.
enum Phase {
    Serving,
    /// New flows go to LocalDNS. The listener stays open: what still reaches it or is in flight
    /// is answered until the drain says done.
    HandedOver(Drain),
    /// The listener is closed. Answers can still reach TCP clients, until `until` at the latest.
    Closing {
        until: Instant,
    },
}

impl Phase {
    /// Whether the thread is done, with `inflight` queries in flight at `now`.
    fn over(&self, now: Instant, inflight: usize, tcp_clients: bool) -> bool {
        match self {
            Phase::Serving => false,
            Phase::HandedOver(drain) => drain.done(now, inflight),
            Phase::Closing { until } => inflight == 0 || !tcp_clients || now >= *until,
        }
    }
}

/// Everything one relay thread runs with.
pub struct Relay {
    pub engine: Engine,
    pub listener: UdpSocket,
    /// Connected UDP sockets kept per upstream (the engine's `udp_sockets_per_upstream`).
    pub sockets_per_upstream: usize,
    pub mailbox: Arc<Mailbox>,
    pub tcp: Arc<UpstreamSide>,
    pub upstreams: watch::Receiver<Arc<UpstreamSets>>,
    pub stats: Arc<ListenerStats>,
    pub stop: Arc<Stop>,
    pub heartbeat: (Arc<Heartbeats>, usize),
    /// Our own standby prober's questions, which must find LocalDNS or silence, never us.
    pub own_probes: Arc<OwnProbes>,
    /// Who holds the flows, and the standby's ear for pods' queries that reach us while
    /// LocalDNS does.
    pub strays: Arc<Strays>,
}

/// The state of a running relay thread besides the engine.
struct Shell {
    epoll: Epoll,
    listener: Option<UdpSocket>,
    /// Watched with their index as epoll token.
    upstream_sockets: UpstreamSockets,
    mailbox: Arc<Mailbox>,
    tcp: Arc<UpstreamSide>,
    stats: Arc<ListenerStats>,
    clients: HashMap<ConnId, mpsc::Sender<Vec<u8>>>,
    /// UDP datagrams sent together at the end of each flush, each with the try it is for (none
    /// for a reply to a client).
    out: SendBatch<Option<Leg>>,
    failed: Vec<(Leg, Failure)>,
    log: EventLog,
}

/// Runs on the calling thread until the stop and the drain after it; returning closes the sockets.
pub fn run(mut relay: Relay) {
    let mut engine = relay.engine;
    let (heartbeats, beat) = &relay.heartbeat;
    let epoll = match register(&relay.listener, &relay.mailbox, &relay.stop) {
        Ok(epoll) => epoll,
        Err(e) => {
            tracing::error!(error = %e, listener = engine.role().name(), "cannot set up epoll; UDP not served");
            return;
        }
    };
    let mut shell = Shell {
        epoll,
        listener: Some(relay.listener),
        upstream_sockets: UpstreamSockets::new(relay.sockets_per_upstream),
        mailbox: relay.mailbox,
        tcp: relay.tcp,
        stats: relay.stats,
        clients: HashMap::new(),
        out: SendBatch::new(BATCH),
        failed: Vec::new(),
        log: EventLog::default(),
    };
    let mut batch = RecvBatch::new(BATCH);
    let mut letters = Vec::new();
    shell.connect_upstreams(&engine);
    let mut events = vec![EpollEvent::empty(); 256];
    let mut wait = PollTimeout::ZERO;
    let mut phase = Phase::Serving;
    // This thread's share of the listener's in-flight gauge.
    let mut reported_inflight = 0;
    loop {
        heartbeats.beat(*beat);
        let ready = match shell.epoll.wait(&mut events, wait) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => {
                tracing::error!(error = %e, "epoll_wait failed; retrying");
                std::thread::sleep(Duration::from_millis(10));
                0
            }
        };
        // After the wait: a thread idle when the sets (and the hosts file) changed answers its
        // first query with the new ones.
        if relay.upstreams.has_changed().unwrap_or(false) {
            engine.set_upstreams(relay.upstreams.borrow_and_update().clone());
            shell.connect_upstreams(&engine);
        }
        for event in &events[..ready] {
            match event.data() {
                STOP_TOKEN => {
                    let _ = shell.epoll.delete(relay.stop.fd());
                    // New flows already go to LocalDNS (see `handoff`): what still reaches the
                    // listener is answered until the drain says done.
                    if relay.strays.aside() {
                        phase = Phase::HandedOver(Drain::new(Instant::now()));
                    } else if let Some(l) = shell.listener.take() {
                        let _ = shell.epoll.delete(&l);
                        phase = Phase::Closing {
                            until: Instant::now() + DRAIN,
                        };
                    }
                }
                LISTENER_TOKEN => {
                    if let Some(l) = shell.listener.as_ref() {
                        let read = receive(l, &mut batch).unwrap_or(0);
                        let now = Instant::now();
                        let mut pods = false;
                        for (packet, from) in batch.with_senders() {
                            if let Some(from) = from.filter(|&f| !relay.own_probes.sent(f)) {
                                engine.handle_query(now, Client::Udp(from), packet);
                                pods = true;
                            }
                        }
                        if pods {
                            relay.strays.reached_us();
                        }
                        if let (true, Phase::HandedOver(d)) = (read > 0, &mut phase) {
                            d.activity(now);
                        }
                    }
                    shell.flush(&mut engine);
                }
                MAILBOX_TOKEN => {
                    shell.mailbox.take(&mut letters);
                    for letter in letters.drain(..) {
                        shell.deliver_letter(&mut engine, letter);
                    }
                    shell.flush(&mut engine);
                }
                index => {
                    shell.read_upstream(&mut engine, index as usize, &mut batch);
                    shell.flush(&mut engine);
                }
            }
        }
        let now = Instant::now();
        engine.handle_timeout(now);
        // On the loop's own wakes (at least twice a second): no timer of its own.
        if matches!(phase, Phase::Serving) {
            engine.ask_if_due(now, relay.strays.standing_by());
        }
        shell.flush(&mut engine);
        let inflight = engine.inflight();
        if inflight != reported_inflight {
            shell
                .stats
                .add_inflight(inflight as i64 - reported_inflight as i64);
            reported_inflight = inflight;
        }
        if phase.over(now, inflight, !shell.clients.is_empty()) {
            shell.stats.add_inflight(-(reported_inflight as i64));
            return;
        }
        // Sleep until the next deadline, waking at least twice a second so the heartbeat shows
        // this loop alive. Also right after work: epoll is level-triggered, so a socket that
        // filled meanwhile ends the wait at once, where a zero-timeout look first cost two more
        // system calls per query at low rates (7.7 against 5.9 per query at 2,000 QPS).
        wait = {
            let mut until = engine.poll_timeout().map_or(HEARTBEAT_IDLE, |t| {
                t.saturating_duration_since(now).min(HEARTBEAT_IDLE)
            });
            if let Phase::HandedOver(d) = &phase {
                until = until.min(d.next_look(now));
            }
            // Round up: waking a millisecond early would only spin until the deadline.
            PollTimeout::from(until.as_micros().div_ceil(1000).min(u128::from(u16::MAX)) as u16)
        };
    }
}

impl Shell {
    /// Keeps connected sockets for every upstream of every group this listener's routes name,
    /// and closes those of upstreams no longer in use.
    fn connect_upstreams(&mut self, engine: &Engine) {
        let sets = engine.upstreams();
        let wanted: Vec<SocketAddr> = UpstreamGroup::BOTH
            .into_iter()
            .filter(|&group| engine.sends_to(group))
            .flat_map(|group| sets.get(group).addrs().iter().copied())
            .collect();
        self.upstream_sockets.connect(&wanted, &self.epoll);
    }

    /// Hands the engine what upstream socket `index` has queued: replies, or the upstream's
    /// ICMP error, which a connected socket reports as an error on the socket. Nothing if there
    /// is no such socket (closed since the event was queued).
    fn read_upstream(&self, engine: &mut Engine, index: usize, batch: &mut RecvBatch) {
        let Some(up) = self.upstream_sockets.get(index) else {
            return;
        };
        let (to, via) = (up.to, Via::Udp { socket: up.slot });
        match receive(&up.socket, batch) {
            Ok(_) => {
                let now = Instant::now();
                for packet in batch.datagrams() {
                    engine.handle_reply(now, via, to, packet);
                }
            }
            Err(e) if is_unreachable(&e) => engine.handle_unreachable(Instant::now(), to),
            Err(_) => {}
        }
    }

    fn deliver_letter(&mut self, engine: &mut Engine, letter: Letter) {
        let now = Instant::now();
        match letter {
            Letter::TcpOpened { conn, replies } => {
                self.clients.insert(conn, replies);
            }
            Letter::TcpQuery { conn, query } => {
                if engine.handle_query(now, Client::Tcp(conn), &query) == Outcome::Dropped {
                    // Tell the connection no reply is coming, so it can count the query done.
                    if let Some(tx) = self.clients.get(&conn) {
                        let _ = tx.try_send(Vec::new());
                    }
                }
            }
            Letter::TcpClosed { conn } => {
                self.clients.remove(&conn);
            }
            Letter::UpstreamReply { leg, reply } => {
                engine.handle_reply(now, leg.via, leg.to, &reply);
            }
            Letter::UpstreamFailed { leg, failure } => engine.handle_failure(now, leg, failure),
        }
    }

    /// Sends everything the engine has queued: UDP datagrams together at the end (one
    /// `sendmmsg` per socket), TCP ones at once. Sends that fail go back in as failures, which
    /// may queue more.
    fn flush(&mut self, engine: &mut Engine) {
        loop {
            while let Some(t) = engine.poll_transmit() {
                match t.dest {
                    Dest::Client(Client::Udp(to)) => {
                        self.stats.response(Transport::Udp, t.bytes);
                        if self.listener.is_some() {
                            self.queue_udp(t.bytes, Some(to), LISTENER_TAG, None);
                        }
                    }
                    Dest::Client(Client::Tcp(conn)) => {
                        self.stats.response(Transport::Tcp, t.bytes);
                        if let Some(tx) = self.clients.get(&conn) {
                            let _ = tx.try_send(t.bytes.to_vec());
                        }
                    }
                    Dest::Upstream(leg) => match leg.via {
                        Via::Udp { socket } => {
                            match self.upstream_sockets.index_of(leg.to, socket) {
                                Some(i) => self.queue_udp(t.bytes, None, i, Some(leg)),
                                None => self.failed.push((leg, Failure::NoSocket)),
                            }
                        }
                        Via::Tcp => {
                            let started =
                                self.tcp.start(leg, t.bytes.to_vec(), self.mailbox.clone());
                            if let Err(failure) = started {
                                self.failed.push((leg, failure));
                            }
                        }
                    },
                }
            }
            while let Some(event) = engine.poll_event() {
                self.log.event(event, Instant::now());
            }
            self.send_udp();
            if self.failed.is_empty() {
                return;
            }
            let now = Instant::now();
            for (leg, failure) in std::mem::take(&mut self.failed) {
                engine.handle_failure(now, leg, failure);
            }
        }
    }

    /// Queues a datagram for `send_udp`, from the listener (`LISTENER_TAG`, to a client) or from
    /// upstream socket `tag` (for `leg`); sends the queue first when it is full.
    fn queue_udp(&mut self, bytes: &[u8], to: Option<SocketAddr>, tag: usize, leg: Option<Leg>) {
        if self.out.is_full() {
            self.send_udp();
        }
        self.out.push(bytes, to, tag, leg);
    }

    fn send_udp(&mut self) {
        let (listener, sockets, failed) =
            (&self.listener, &self.upstream_sockets, &mut self.failed);
        let socket = |tag| match tag {
            LISTENER_TAG => listener.as_ref(),
            _ => sockets.get(tag).map(|up| &up.socket),
        };
        self.out.send(
            |tag| socket(tag).map(AsRawFd::as_raw_fd),
            |leg, e| match leg {
                // A full send queue is congestion here, not a fault of the upstream: the
                // datagram is lost like any other and the try's timer moves the query on.
                Some(leg) if e.kind() != io::ErrorKind::WouldBlock => {
                    failed.push((leg, Failure::from_io(&e)))
                }
                Some(_) => {}
                None => tracing::debug!(error = %e, "cannot send a reply to a UDP client"),
            },
        );
    }
}

fn register(listener: &UdpSocket, mailbox: &Mailbox, stop: &Stop) -> nix::Result<Epoll> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    // Several threads may wait on the one listener socket; EPOLLEXCLUSIVE wakes one per datagram
    // instead of all of them.
    epoll.add(
        listener,
        EpollEvent::new(
            EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE,
            LISTENER_TOKEN,
        ),
    )?;
    epoll.add(
        mailbox.fd(),
        EpollEvent::new(EpollFlags::EPOLLIN, MAILBOX_TOKEN),
    )?;
    epoll.add(stop.fd(), EpollEvent::new(EpollFlags::EPOLLIN, STOP_TOKEN))?;
    Ok(epoll)
}

/// Reads what a readable socket has queued, up to `BATCH` datagrams, so one busy socket cannot
/// starve the others; what is left is reported again by the next (level-triggered) wait.
fn receive(socket: &UdpSocket, batch: &mut RecvBatch) -> io::Result<usize> {
    batch.recv(socket).inspect_err(|e| {
        tracing::debug!(error = %e, "UDP receive error");
    })
}

/// Errors with which the kernel passes on an ICMP error for a connected socket.
fn is_unreachable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
    )
}
