//! Binding a listener: UDP and TCP on one address and port, IP_FREEBIND, SO_REUSEPORT shared
//! with LocalDNS, and a bounded retry while the port is busy. Our place in each port's group is
//! read at bind time, and flows are steered from the bind on: to our sockets, or, standing by
//! beside a LocalDNS that answers, to its (see `steer`).

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

use super::steer::{Held, Place, steer_at_join};
use crate::netlink::{Proto, group_members};

/// Socket buffers asked for on listener and upstream sockets: a burst of queries arriving while
/// the worker is busy waits in the kernel instead of being dropped, and a burst of answers (a
/// thousand clients waiting on one coalesced query) fits in the send queue. The kernel may grant
/// less (net.core.rmem_max, wmem_max); what it granted is logged.
pub const RECV_BUFFER: usize = 4 << 20;
pub const SEND_BUFFER: usize = 4 << 20;
/// Pending TCP connections the kernel queues for us.
const TCP_BACKLOG: i32 = 1024;
/// Pause between bind attempts while the address is busy.
const BIND_RETRY: Duration = Duration::from_millis(100);

/// Both sockets of one listener.
pub struct Bound {
    /// The address bound: the one asked for, with the port the kernel chose if it was 0.
    pub addr: SocketAddr,
    /// Non-blocking; served by a thread of its own, not by the async runtime (see `relay`).
    pub udp: std::net::UdpSocket,
    /// Non-blocking; registered with the serving runtime by `serve` (it is bound before that
    /// runtime exists).
    pub tcp: std::net::TcpListener,
    /// Where our sockets sit in their SO_REUSEPORT groups, with descriptors of both sockets of
    /// its own; flows are steered from bind on.
    pub held: Held,
}

/// Binds UDP and TCP on `addr`, retrying while the port is busy for at most `patience`: an
/// orphaned CoreDNS can hold it for a moment after a crash. New flows go to us if `to_us`, else
/// to the other members, from the instant each socket joins its group.
pub async fn bind_listener(
    addr: SocketAddr,
    patience: Duration,
    to_us: bool,
) -> Result<Bound, String> {
    let started = Instant::now();
    loop {
        match bind_pair(addr, to_us) {
            Ok((udp, tcp, bound, places)) => {
                let udp: std::net::UdpSocket = udp.into();
                let tcp: std::net::TcpListener = tcp.into();
                let held = Held::new(bound, places, udp.as_fd(), tcp.as_fd())
                    .map_err(|e| format!("cannot keep the sockets of {addr}: {e}"))?;
                let first = held.udp.index() == Some(0) && held.tcp.index() == Some(0);
                if to_us && !first {
                    // A LocalDNS that is starting (or an orphaned CoreDNS).
                    tracing::info!(
                        %addr,
                        udp_slot = ?held.udp.index(),
                        tcp_slot = ?held.tcp.index(),
                        "sharing the port with sockets bound before ours; they get no flows while we serve"
                    );
                }
                return Ok(Bound {
                    addr: bound,
                    udp,
                    tcp,
                    held,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && started.elapsed() < patience => {
                tracing::debug!(%addr, "listener address busy, retrying");
                tokio::time::sleep(BIND_RETRY).await;
            }
            Err(e) => {
                return Err(format!(
                    "cannot bind {addr} (UDP and TCP) after {:.1}s: {e}",
                    started.elapsed().as_secs_f64()
                ));
            }
        }
    }
}

/// Binds UDP, then TCP on the same port. Port 0 (tests) means the port the kernel gives the UDP
/// socket; should TCP find that port taken, another pair is tried.
fn bind_pair(
    addr: SocketAddr,
    to_us: bool,
) -> io::Result<(Socket, Socket, SocketAddr, (Place, Place))> {
    for _ in 0..16 {
        match bind_pair_once(addr, to_us) {
            Err(e) if addr.port() == 0 && e.kind() == io::ErrorKind::AddrInUse => continue,
            other => return other,
        }
    }
    bind_pair_once(addr, to_us)
}

fn bind_pair_once(
    addr: SocketAddr,
    to_us: bool,
) -> io::Result<(Socket, Socket, SocketAddr, (Place, Place))> {
    let (udp, udp_slot) = join(addr, Proto::Udp, to_us)?;
    let addr = udp
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("a UDP socket bound to a non-IP address"))?;
    let (tcp, tcp_slot) = join(addr, Proto::Tcp, to_us)?;
    Ok((udp, tcp, addr, (udp_slot, tcp_slot)))
}

/// A socket of `proto` bound to `addr` (a TCP one listening), its group steered from the
/// instant it joined, and its place there.
fn join(addr: SocketAddr, proto: Proto, to_us: bool) -> io::Result<(Socket, Place)> {
    // Members already in the group come first; we join at the end. (A process binding at the
    // same instant could take our index; LocalDNS does not start while we start.)
    // Port 0 (tests) is not shared: the kernel may pick an ephemeral port that another socket of
    // ours already holds with SO_REUSEPORT, and the two would share it.
    let share = addr.port() != 0;
    let before = members_before(addr, proto, share);
    let ty = match proto {
        Proto::Udp => Type::DGRAM,
        Proto::Tcp => Type::STREAM,
    };
    // No protocol: the family's own for the type, UDP or TCP.
    let socket = Socket::new(Domain::for_address(addr), ty, None)?;
    // The listener addresses may not be on the interface yet (the link is being recreated); with
    // IP_FREEBIND the bind does not depend on the order in which addresses appear.
    if addr.is_ipv4() {
        socket.set_freebind_v4(true)?;
    } else {
        socket.set_only_v6(true)?;
        socket.set_freebind_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    // Share the port with LocalDNS's CoreDNS (same user, SO_REUSEPORT): see the module docs.
    socket.set_reuse_port(share)?;
    if proto == Proto::Udp {
        let _ = socket.set_recv_buffer_size(RECV_BUFFER);
        let _ = socket.set_send_buffer_size(SEND_BUFFER);
        socket.bind(&addr.into())?;
    } else {
        // Lets a restart bind while connections of the previous run sit in TIME_WAIT.
        socket.set_reuse_address(true)?;
        socket.bind(&addr.into())?;
        // A TCP socket joins its group when it starts listening; the program goes on after that.
        socket.listen(TCP_BACKLOG)?;
    }
    // Nothing between the join and the steering: see `steer_at_join`.
    if let (true, Some(before)) = (share, &before) {
        steer_at_join(socket.as_fd(), before.len() as u32, to_us, addr);
    }
    // Our socket's inode, the number sock_diag names it by.
    let ours = nix::sys::stat::fstat(socket.as_fd())?.st_ino;
    let place = before.map_or(Place::unknown(ours), |b| Place::joined(ours, &b));
    Ok((socket, place))
}

/// The members already in `addr`'s group, or None where the kernel will not list them (sock_diag
/// missing: a kernel without udp_diag, or qemu-user, which emulates none): then the port's flows
/// are shared unsteered rather than steered by a guess, and serving goes on. A port that is not
/// shared (0, in tests) has none to ask for.
fn members_before(addr: SocketAddr, proto: Proto, share: bool) -> Option<Vec<u64>> {
    if !share {
        return Some(Vec::new());
    }
    group_members(addr, proto)
        .inspect_err(|e| {
            tracing::warn!(%addr, ?proto, error = %e, "cannot list the port's group; sharing flows with any other member")
        })
        .ok()
}

/// The receive and send buffers the kernel actually granted, for the start-up log.
pub fn buffers(socket: &std::net::UdpSocket) -> (usize, usize) {
    let s = socket2::SockRef::from(socket);
    (
        s.recv_buffer_size().unwrap_or(0),
        s.send_buffer_size().unwrap_or(0),
    )
}
