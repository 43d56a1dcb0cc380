//! LocalDNS's own question, asked of both listener addresses: is LocalDNS serving?
//!
//! LocalDNS's probe and watchdog ask `health-check.localdns.local` on 169.254.10.10 and .11 and
//! count any reply as alive; so do we, so that we and LocalDNS's own unit agree on what serving
//! means. A start of the fallback (by hand, by `OnFailure=`, by a path unit) uses it to stand
//! down beside a LocalDNS that serves, and the standby mode asks it (every `flows::PROBE_EVERY`) to notice a
//! LocalDNS that is alive but silent (hung, starved, deadlocked) within half a second.
//!
//! Each address gets its own connected socket, kept for the life of the prober: an address that
//! nothing listens on answers with ICMP port unreachable, which a connected socket reports at
//! once (a dead LocalDNS is noticed in well under a millisecond); its local port is fixed, so the
//! forwarder can tell these probes apart from pods' queries and never answer them itself (while
//! we serve, LocalDNS's health must be asked of LocalDNS).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::engine::route::HEALTH_CHECK;

/// How long one round waits for both replies. LocalDNS answers its probe name from memory, in
/// well under a millisecond; a LocalDNS that has not answered in this long is not serving pods.
pub const WAIT: Duration = Duration::from_millis(120);

/// The source addresses of our own prober's questions, as the relay sees them arrive: one of its
/// ports, from an address of this host (a listener address, or loopback). A pod's query comes
/// from the pod's own address, so it is never taken for ours.
#[derive(Debug, Default)]
pub struct OwnProbes {
    ports: Vec<u16>,
    hosts: Vec<IpAddr>,
}

impl OwnProbes {
    pub fn new(ports: Vec<u16>, listeners: &[SocketAddr]) -> OwnProbes {
        OwnProbes {
            ports,
            hosts: listeners.iter().map(SocketAddr::ip).collect(),
        }
    }

    /// Did our prober send a datagram that came from `from`?
    pub fn sent(&self, from: SocketAddr) -> bool {
        !self.ports.is_empty()
            && self.ports.contains(&from.port())
            && (from.ip().is_loopback() || self.hosts.contains(&from.ip()))
    }
}

/// Asks LocalDNS's probe name of each address over a socket of its own: a round at a time,
/// its replies read as they come ([`Prober::start`], [`Prober::read`]) by a caller that polls
/// [`Prober::fds`], or a whole round at once ([`Prober::ask`]).
pub struct Prober {
    /// Each address, its socket, and whether it answered this round.
    sockets: Vec<(SocketAddr, UdpSocket, bool)>,
    id: u16,
    query: Vec<u8>,
}

/// What one round of questions found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Every address answered.
    Serving,
    /// At least one address gave no reply within the wait (or refused, or was unreachable).
    Silent,
}

impl Prober {
    /// A socket per address in `to`. Fails only when no socket can be made at all.
    pub fn new(to: &[SocketAddr], id_seed: u16) -> io::Result<Prober> {
        let mut sockets = Vec::with_capacity(to.len());
        for &addr in to {
            let any: SocketAddr = match addr.ip() {
                IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
                IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
            };
            let socket = UdpSocket::bind(any)?;
            socket.set_nonblocking(true)?;
            sockets.push((addr, socket, false));
        }
        Ok(Prober {
            sockets,
            id: id_seed,
            // The ID is set per round.
            query: crate::wire::question(HEALTH_CHECK, 1),
        })
    }

    /// The local ports our questions come from: the forwarder drops queries from these ports to
    /// its own listeners, so that a probe that reaches our socket (LocalDNS not bound at all)
    /// finds silence, not our answer.
    pub fn ports(&self) -> Vec<u16> {
        self.sockets
            .iter()
            .filter_map(|(_, s, _)| s.local_addr().ok().map(|a| a.port()))
            .collect()
    }

    /// The sockets to wait on for a round's replies (readable, or an error: refused).
    pub fn fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.sockets.iter().map(|(_, s, _)| s.as_fd())
    }

    /// Starts a round: asks every address at once. False if a question could not be sent: the
    /// round is silent already.
    pub fn start(&mut self) -> bool {
        self.id = self.id.wrapping_add(1);
        self.query[..2].copy_from_slice(&self.id.to_be_bytes());
        for (addr, socket, answered) in &mut self.sockets {
            *answered = false;
            // Connecting again each round: an address that came or went (LocalDNS deletes and
            // recreates its link) is routed afresh, and stale replies of other rounds are dropped
            // by the ID check below.
            if socket.connect(*addr).is_err() || socket.send(&self.query).is_err() {
                return false;
            }
        }
        true
    }

    /// Reads what has arrived for the round under way: `Serving` once every address replied,
    /// `Silent` if one refused (ICMP port unreachable: nothing bound there), else nothing yet.
    pub fn read(&mut self) -> Option<Seen> {
        let mut buf = [0u8; 512];
        for (_, socket, answered) in &mut self.sockets {
            while !*answered {
                match socket.recv(&mut buf) {
                    // A reply (QR set) to this round's question; any RCODE counts.
                    Ok(n) if n >= 12 && buf[..2] == self.id.to_be_bytes() && buf[2] & 0x80 != 0 => {
                        *answered = true;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => return Some(Seen::Silent),
                }
            }
        }
        self.sockets
            .iter()
            .all(|(_, _, answered)| *answered)
            .then_some(Seen::Serving)
    }

    /// One whole round: asks every address at once and waits at most `wait` for all the
    /// replies.
    pub fn ask(&mut self, wait: Duration) -> Seen {
        let deadline = Instant::now() + wait;
        if !self.start() {
            return Seen::Silent;
        }
        loop {
            if let Some(seen) = self.read() {
                return seen;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Seen::Silent;
            }
            let mut fds: Vec<PollFd> = self
                .fds()
                .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
                .collect();
            let timeout =
                PollTimeout::try_from(left.as_millis().max(1) as i32).unwrap_or(PollTimeout::MAX);
            if poll(&mut fds, timeout).is_err_and(|e| e != nix::errno::Errno::EINTR) {
                return Seen::Silent;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A responder on loopback that answers the first `answers` questions with an empty NOERROR
    /// reply carrying the question's ID, and ignores the rest.
    fn responder(answers: usize) -> SocketAddr {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            for _ in 0..answers {
                let Ok((n, from)) = s.recv_from(&mut buf) else {
                    return;
                };
                buf[2] |= 0x80;
                let _ = s.send_to(&buf[..n], from);
            }
            // Silent from now on, but still bound: a hung server, not a closed port.
            std::thread::sleep(Duration::from_secs(5));
        });
        addr
    }

    #[test]
    fn serving_needs_a_reply_from_every_address() {
        let (a, b) = (responder(10), responder(10));
        let mut p = Prober::new(&[a, b], 7).unwrap();
        assert_eq!(p.ask(Duration::from_millis(500)), Seen::Serving);
        assert_eq!(p.ask(Duration::from_millis(500)), Seen::Serving);
        let silent = responder(0);
        let mut p = Prober::new(&[a, silent], 9).unwrap();
        assert_eq!(p.ask(Duration::from_millis(200)), Seen::Silent);
    }

    #[test]
    fn a_closed_port_is_silent_at_once_and_a_hung_server_after_the_wait() {
        let closed = {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.local_addr().unwrap()
        };
        let mut p = Prober::new(&[closed], 1).unwrap();
        let started = std::time::Instant::now();
        assert_eq!(p.ask(Duration::from_secs(3)), Seen::Silent);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "a closed port waited"
        );
        let hung = responder(1);
        let mut p = Prober::new(&[hung], 1).unwrap();
        assert_eq!(p.ask(Duration::from_millis(500)), Seen::Serving);
        let started = std::time::Instant::now();
        assert_eq!(p.ask(Duration::from_millis(150)), Seen::Silent);
        assert!(started.elapsed() >= Duration::from_millis(150));
    }

    #[test]
    fn own_probes_are_told_by_port_and_a_host_address() {
        let listeners: [SocketAddr; 2] = [
            "169.254.10.10:53".parse().unwrap(),
            "169.254.10.11:53".parse().unwrap(),
        ];
        let own = OwnProbes::new(vec![40001, 40002], &listeners);
        assert!(own.sent("169.254.10.10:40001".parse().unwrap()));
        assert!(own.sent("127.0.0.1:40002".parse().unwrap()));
        // A pod that happens to use the same source port is a pod.
        assert!(!own.sent("10.244.1.7:40001".parse().unwrap()));
        assert!(!own.sent("169.254.10.11:40003".parse().unwrap()));
        assert!(!OwnProbes::default().sent("127.0.0.1:40001".parse().unwrap()));
    }

    #[test]
    fn the_question_is_localdns_own_probe_name() {
        let p = Prober::new(&["127.0.0.1:53".parse().unwrap()], 0).unwrap();
        let q = crate::wire::parse_query(&p.query).expect("a well-formed query");
        assert_eq!(q.qtype, 1);
        assert_eq!(&p.query[12..12 + HEALTH_CHECK.len()], HEALTH_CHECK);
        assert_eq!(p.ports().len(), 1);
    }
}
