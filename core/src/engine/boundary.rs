//! What crosses the engine's boundary: its settings, who asks, how a try travels, what the
//! shells are asked to send, why a try failed, and the events worth a log line.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::roles::{Transport, UpstreamGroup};

/// What the engine needs to know from the flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Budget for one try at one upstream; then the next upstream is tried.
    pub upstream_timeout: Duration,
    /// Budget for a whole query; the client gets SERVFAIL (or a stale answer) after it.
    pub query_timeout: Duration,
    /// Queries in flight at once; beyond it clients get REFUSED at once.
    pub max_inflight: usize,
    /// Connected UDP sockets the shell keeps per upstream (each on its own random source port):
    /// a try goes out through one of them, picked at random.
    pub udp_sockets_per_upstream: usize,
    /// When a query still has no answer this long after it arrived and the cache holds an
    /// expired one, that answer is served (RFC 8767's client-response timer) while the
    /// query goes on to refresh the cache.
    pub stale_after: Duration,
    /// After every try for a name failed, its expired answer is served at once for this long,
    /// with at most one refresh in flight (RFC 8767's failure-recheck timer).
    pub stale_recheck: Duration,
}

/// The defaults are the daemon's flag defaults; this is the one place they are written.
impl Default for Settings {
    fn default() -> Settings {
        Settings {
            // Well below a stub's 5 s timeout so one dead server costs a client one second, not
            // its whole attempt.
            upstream_timeout: Duration::from_secs(1),
            // Under Node Problem Detector's 3 s probe timeout, so its probe sees SERVFAIL, not
            // silence.
            query_timeout: Duration::from_millis(2500),
            max_inflight: 4096,
            udp_sockets_per_upstream: 8,
            // Serve-stale's client-response timer (RFC 8767 suggests 1.8 s): under the 2.5 s
            // query budget and well under a stub's 5 s timeout.
            stale_after: Duration::from_millis(1800),
            // Serve-stale's failure-recheck timer (RFC 8767 suggests 30 s).
            stale_recheck: Duration::from_secs(30),
        }
    }
}

/// An identifier the TCP shell gives each client connection.
pub type ConnId = u64;

/// Who asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    Udp(SocketAddr),
    Tcp(ConnId),
}

impl Client {
    pub fn transport(self) -> Transport {
        match self {
            Client::Udp(_) => Transport::Udp,
            Client::Tcp(_) => Transport::Tcp,
        }
    }
}

/// How a try travels to its upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Via {
    /// Through UDP socket number `socket` of the shell's sockets connected to the upstream.
    Udp { socket: usize },
    /// Over TCP (the shell picks or opens the connection).
    Tcp,
}

/// One try at one upstream: what the shell hands back with a reply or a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Leg {
    pub via: Via,
    pub to: SocketAddr,
    /// The query ID of this try (a fresh one per try, from the CSPRNG).
    pub id: u16,
}

/// Where a transmit goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    Client(Client),
    Upstream(Leg),
}

/// Bytes to send, borrowed from the engine until the next call.
#[derive(Debug)]
pub struct Transmit<'a> {
    pub dest: Dest,
    pub bytes: &'a [u8],
}

/// Why a try ended without an acceptable reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    TimedOut,
    /// The network said no: ICMP unreachable, connection refused or reset, a stream that closed
    /// before the reply.
    Network(io::ErrorKind),
    /// The shell holds no socket for the try (none could be made for the upstream's address,
    /// or it keeps none for that upstream): ours, not the upstream's.
    NoSocket,
    /// The upstream answered, but with SERVFAIL, REFUSED or NOTIMP (the RCODE), or with an
    /// error and no question: it cannot resolve this now, another upstream may.
    ErrorReply(u8),
    /// The try never left this host: our resources ran out (descriptors, buffers, query IDs) or
    /// the kernel refused the send itself (no such address family, source address or route).
    Local(io::ErrorKind),
}

impl Failure {
    /// Sorts an IO error into a network failure or one of our own.
    pub fn from_io(e: &io::Error) -> Failure {
        match e.raw_os_error() {
            Some(libc_errno) if LOCAL_ERRNOS.contains(&libc_errno) => Failure::Local(e.kind()),
            _ => Failure::Network(e.kind()),
        }
    }
}

/// EMFILE, ENFILE, ENOBUFS, ENOMEM: the process or the host ran out of something.
/// EAFNOSUPPORT, EADDRNOTAVAIL, ENETUNREACH: the kernel refused the send before anything left,
/// for want of the family, a source address or a route on this host (an upstream beyond a
/// router that cannot be reached shows as silence or as ICMP, read from the socket).
const LOCAL_ERRNOS: [i32; 7] = [24, 23, 105, 12, 97, 99, 101];

/// Something worth telling the operator; the shells turn these into log lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A healthy upstream failed a try and is now tried after the others.
    UpstreamSuspect {
        group: UpstreamGroup,
        upstream: SocketAddr,
        failure: Failure,
    },
    /// A suspect upstream answered again.
    UpstreamRecovered {
        group: UpstreamGroup,
        upstream: SocketAddr,
    },
    /// A try never left this host (a [`Failure::Local`] or [`Failure::NoSocket`]); the upstream's
    /// health is untouched.
    NotSent {
        group: UpstreamGroup,
        upstream: SocketAddr,
        failure: Failure,
    },
    /// Every try for a name failed and this many clients got the expired cached answer.
    ServedStale { answers: usize },
}

/// What became of a client's packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Dropped unanswered: it will never get a reply.
    Dropped,
    /// Answered already (a transmit is queued).
    Answered,
    /// Waiting for an upstream; exactly one reply will follow.
    Waiting,
}
