//! Binding the listeners and the upstream sockets.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

/// Socket buffers asked for on listener and upstream sockets: a burst of queries arriving while
/// the worker is busy waits in the kernel instead of being dropped, and a burst of answers (a
/// thousand clients waiting on one coalesced query) fits in the send queue. The kernel may grant
/// less (net.core.rmem_max, wmem_max); what it granted is logged.
const RECV_BUFFER: usize = 4 << 20;
const SEND_BUFFER: usize = 4 << 20;
/// Pending TCP connections the kernel queues for us.
const TCP_BACKLOG: i32 = 1024;
/// Pause between bind attempts while the address is busy.
const BIND_RETRY: Duration = Duration::from_millis(100);

/// Both sockets of one listener.
pub struct Bound {
    /// The address bound: the one asked for, with the port the kernel chose if it was 0.
    pub addr: SocketAddr,
    /// Non-blocking; served by a thread of its own, not by the async runtime (see `forward`).
    pub udp: std::net::UdpSocket,
    pub tcp: tokio::net::TcpListener,
}

/// Binds UDP and TCP on `addr`, retrying while the port is busy for at most `patience`: an
/// orphaned CoreDNS can hold it for a moment after a crash.
pub async fn bind_listener(addr: SocketAddr, patience: Duration) -> Result<Bound, String> {
    let started = Instant::now();
    loop {
        match bind_pair(addr) {
            Ok((udp, tcp, bound)) => {
                let udp = udp.into();
                let tcp = tokio::net::TcpListener::from_std(tcp.into())
                    .map_err(|e| format!("cannot register TCP socket {addr}: {e}"))?;
                return Ok(Bound {
                    addr: bound,
                    udp,
                    tcp,
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
fn bind_pair(addr: SocketAddr) -> io::Result<(Socket, Socket, SocketAddr)> {
    for _ in 0..16 {
        match bind_pair_once(addr) {
            Err(e) if addr.port() == 0 && e.kind() == io::ErrorKind::AddrInUse => continue,
            other => return other,
        }
    }
    bind_pair_once(addr)
}

fn bind_pair_once(addr: SocketAddr) -> io::Result<(Socket, Socket, SocketAddr)> {
    let udp = new_socket(addr, Type::DGRAM, Protocol::UDP)?;
    udp.bind(&addr.into())?;
    let addr = udp
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("a UDP socket bound to a non-IP address"))?;
    let tcp = new_socket(addr, Type::STREAM, Protocol::TCP)?;
    // Lets a restart bind while connections of the previous run sit in TIME_WAIT; it does not let
    // two listeners share the port (that would be SO_REUSEPORT, which we leave off so a busy port
    // is noticed rather than silently shared with an orphaned CoreDNS).
    tcp.set_reuse_address(true)?;
    tcp.bind(&addr.into())?;
    tcp.listen(TCP_BACKLOG)?;
    Ok((udp, tcp, addr))
}

fn new_socket(addr: SocketAddr, ty: Type, proto: Protocol) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), ty, Some(proto))?;
    // The listener addresses may not be on the interface yet (the link is being recreated); with
    // IP_FREEBIND the bind does not depend on the order in which addresses appear.
    if addr.is_ipv4() {
        socket.set_freebind_v4(true)?;
    } else {
        socket.set_only_v6(true)?;
        socket.set_freebind_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    if ty == Type::DGRAM {
        let _ = socket.set_recv_buffer_size(RECV_BUFFER);
        let _ = socket.set_send_buffer_size(SEND_BUFFER);
    }
    Ok(socket)
}

/// A UDP socket for talking to upstreams: wildcard address, a port picked at random by the kernel.
pub fn upstream_socket(ipv6: bool) -> io::Result<std::net::UdpSocket> {
    let any: SocketAddr = if ipv6 { "[::]:0" } else { "0.0.0.0:0" }
        .parse()
        .expect("literal");
    let socket = Socket::new(Domain::for_address(any), Type::DGRAM, Some(Protocol::UDP))?;
    if ipv6 {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    let _ = socket.set_recv_buffer_size(RECV_BUFFER);
    let _ = socket.set_send_buffer_size(SEND_BUFFER);
    socket.bind(&any.into())?;
    Ok(socket.into())
}

/// The receive and send buffers the kernel actually granted, for the start-up log.
pub fn buffers(socket: &std::net::UdpSocket) -> (usize, usize) {
    let s = socket2::SockRef::from(socket);
    (
        s.recv_buffer_size().unwrap_or(0),
        s.send_buffer_size().unwrap_or(0),
    )
}

/// A UDP socket connected to one upstream, on a port picked at random by the kernel. Connected,
/// the kernel routes each send without a lookup, drops datagrams from anyone else before we see
/// them, and reports the upstream's ICMP errors (port unreachable) as errors on the socket.
pub fn connected_upstream_socket(to: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let any: SocketAddr = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }
        .parse()
        .expect("literal");
    let socket = Socket::new(Domain::for_address(to), Type::DGRAM, Some(Protocol::UDP))?;
    if to.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    let _ = socket.set_recv_buffer_size(RECV_BUFFER);
    let _ = socket.set_send_buffer_size(SEND_BUFFER);
    socket.bind(&any.into())?;
    socket.connect(&to.into())?;
    Ok(socket.into())
}
