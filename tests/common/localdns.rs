//! LocalDNS's server as the fallback meets it: sockets bound the way CoreDNS binds them, and a
//! stand-in that answers on both listeners (or, hung, answers nothing while keeping its sockets).

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use super::netns::Netns;

/// UDP and TCP sockets on `addr` with SO_REUSEPORT, as CoreDNS binds its listeners, in the
/// namespace the calling thread is in; blocking, as the socket calls make them.
pub fn bind_like_coredns(addr: SocketAddr, backlog: i32) -> (UdpSocket, TcpListener) {
    let udp = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    udp.set_reuse_port(true).unwrap();
    udp.bind(&addr.into()).unwrap();
    let tcp = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
    tcp.set_reuse_port(true).unwrap();
    tcp.set_reuse_address(true).unwrap();
    tcp.bind(&addr.into()).unwrap();
    tcp.listen(backlog).unwrap();
    (udp.into(), tcp.into())
}

/// A LocalDNS stand-in in a namespace: UDP and TCP on 169.254.10.10 and .11 port 53 with
/// SO_REUSEPORT, answering every UDP query at once with an empty NOERROR reply (no record: a
/// reply says who gave it), unless `hung`, when it reads nothing and its sockets fill, as a
/// stopped CoreDNS's do. Stops and joins its threads when dropped.
pub struct LocalDnsStandIn {
    pub hung: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl LocalDnsStandIn {
    pub fn start(ns: &Netns) -> LocalDnsStandIn {
        let stop = Arc::new(AtomicBool::new(false));
        let hung = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for l in ["169.254.10.10:53", "169.254.10.11:53"] {
            let addr: SocketAddr = l.parse().unwrap();
            let (udp, tcp) = ns.enter(|| bind_like_coredns(addr, 16));
            let (stop, hung) = (stop.clone(), hung.clone());
            threads.push(std::thread::spawn(move || {
                let _tcp = tcp;
                udp.set_read_timeout(Some(Duration::from_millis(5)))
                    .unwrap();
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    if hung.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    if let Ok((n, from)) = udp.recv_from(&mut buf) {
                        if n >= 12 {
                            buf[2] |= 0x80;
                            let _ = udp.send_to(&buf[..n], from);
                        }
                    }
                }
            }));
        }
        LocalDnsStandIn {
            hung,
            stop,
            threads,
        }
    }
}

impl Drop for LocalDnsStandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
