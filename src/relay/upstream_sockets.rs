//! A relay thread's UDP sockets to its upstreams: for each upstream, a few sockets connected
//! from random source ports (an off-path spoofer must guess the port as well as the query ID),
//! each watched by the thread's epoll. Connected, so the route is looked up once and the
//! upstream's ICMP errors come back on the socket.

use std::io;
use std::net::{SocketAddr, UdpSocket};

use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use socket2::{Domain, Protocol, Socket, Type};

use crate::listen::{RECV_BUFFER, SEND_BUFFER};

/// A UDP socket connected to one upstream.
pub(super) struct UpstreamSocket {
    pub socket: UdpSocket,
    pub to: SocketAddr,
    /// Its number among the sockets of that upstream: the engine's `Via::Udp { socket }`.
    pub slot: usize,
}

pub(super) struct UpstreamSockets {
    /// By index (their epoll token); `None` for sockets closed since.
    sockets: Vec<Option<UpstreamSocket>>,
    /// Each upstream's sockets, by slot (indices into `sockets`, all open: a socket is closed
    /// only with its upstream's entry); empty when none could be made. Looked up on every query
    /// sent: a scan of the few upstreams, as `UpstreamSet` does, is cheaper than hashing the
    /// address.
    by_upstream: Vec<(SocketAddr, Vec<usize>)>,
    per_upstream: usize,
}

impl UpstreamSockets {
    pub fn new(per_upstream: usize) -> UpstreamSockets {
        UpstreamSockets {
            sockets: Vec::new(),
            by_upstream: Vec::new(),
            per_upstream,
        }
    }

    /// Keeps `per_upstream` connected sockets for every upstream in `wanted`, each in `epoll`
    /// with its index as token, and closes those of upstreams not in it.
    pub fn connect(&mut self, wanted: &[SocketAddr], epoll: &Epoll) {
        let sockets = &mut self.sockets;
        self.by_upstream.retain(|(addr, slots)| {
            let keep = wanted.contains(addr);
            if !keep {
                for &index in slots {
                    if let Some(up) = sockets[index].take() {
                        let _ = epoll.delete(&up.socket);
                    }
                }
            }
            keep
        });
        for &addr in wanted {
            if self.by_upstream.iter().any(|(a, _)| *a == addr) {
                continue;
            }
            let mut slots = Vec::new();
            for slot in 0..self.per_upstream {
                let socket = match connected_upstream_socket(addr) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(upstream = %addr, error = %e, "cannot open a UDP socket to this upstream");
                        break;
                    }
                };
                let index = self
                    .sockets
                    .iter()
                    .position(Option::is_none)
                    .unwrap_or(self.sockets.len());
                let event = EpollEvent::new(EpollFlags::EPOLLIN, index as u64);
                if let Err(e) = epoll.add(&socket, event) {
                    tracing::warn!(upstream = %addr, error = %e, "cannot watch a UDP socket to this upstream");
                    break;
                }
                let up = UpstreamSocket {
                    socket,
                    to: addr,
                    slot,
                };
                if index == self.sockets.len() {
                    self.sockets.push(None);
                }
                self.sockets[index] = Some(up);
                slots.push(index);
            }
            // Fewer sockets than slots: the engine's tries on missing slots fail as NoSocket.
            self.by_upstream.push((addr, slots));
        }
    }

    /// The open socket at `index`.
    pub fn get(&self, index: usize) -> Option<&UpstreamSocket> {
        self.sockets.get(index)?.as_ref()
    }

    /// The index of the open socket numbered `slot` among those of upstream `to`.
    pub fn index_of(&self, to: SocketAddr, slot: usize) -> Option<usize> {
        let (_, slots) = self.by_upstream.iter().find(|(addr, _)| *addr == to)?;
        slots.get(slot).copied()
    }
}

/// A UDP socket connected to one upstream, on a port picked at random by the kernel. Connected,
/// the kernel routes each send without a lookup, drops datagrams from anyone else before we see
/// them, and reports the upstream's ICMP errors (port unreachable) as errors on the socket.
fn connected_upstream_socket(to: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(to), Type::DGRAM, Some(Protocol::UDP))?;
    if to.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    let _ = socket.set_recv_buffer_size(RECV_BUFFER);
    let _ = socket.set_send_buffer_size(SEND_BUFFER);
    // An unbound socket is bound by connect, to a random free port and the route's source.
    socket.connect(&to.into())?;
    Ok(socket.into())
}
