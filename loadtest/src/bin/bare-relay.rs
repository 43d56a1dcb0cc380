//! bare-relay: a yardstick, not a product. The least a UDP DNS relay can do on this machine.
//!
//! ```text
//! bare-relay --listen IP:PORT --upstream IP:PORT
//! ```
//!
//! One thread, one listening socket, one upstream socket connected to the upstream (a cached
//! route on send, early demux on receive). Each turn drains the client socket with `recvmmsg`,
//! rewrites each query's ID to the next free one (a table maps it back to the client's address
//! and ID) and sends the batch upstream with one `sendmmsg`; then drains the upstream socket the
//! same way back. It polls only when both sockets are empty. No parsing, no checks, no cache, no
//! timeouts (an entry is overwritten when its ID comes round again): the load test measures how
//! close the forwarder comes to this.

use loadtest::net::{self, Batch};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::process::ExitCode;

const BATCH: usize = 64;

fn main() -> ExitCode {
    let mut listen: Option<SocketAddr> = None;
    let mut upstream: Option<SocketAddr> = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next().and_then(|v| v.parse().ok());
        match a.as_str() {
            "--listen" => listen = v,
            "--upstream" => upstream = v,
            _ => listen = None,
        }
    }
    let (Some(listen), Some(upstream)) = (listen, upstream) else {
        eprintln!("usage: bare-relay --listen IP:PORT --upstream IP:PORT");
        return ExitCode::from(2);
    };
    match relay(listen, upstream) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bare-relay: {e}");
            ExitCode::FAILURE
        }
    }
}

fn relay(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<()> {
    let client = net::udp_bound(listen, false, true)?;
    let up = net::udp_connected(upstream)?;
    // Upstream ID -> (client address, its length, the client's ID).
    let mut table = vec![(unsafe_zeroed(), 0 as libc::socklen_t, 0u16); 1 << 16];
    let mut next_id: u16 = 0;
    let (mut rx, mut tx) = (Batch::new(BATCH), Batch::new(BATCH));
    let mut pfds = [client.as_raw_fd(), up.as_raw_fd()].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    loop {
        let mut busy = false;
        // Queries: client -> upstream.
        let n = rx.recv(client.as_raw_fd(), libc::MSG_DONTWAIT)?;
        let mut k = 0;
        for i in 0..n {
            let len = rx.lens[i];
            if len < 12 {
                continue;
            }
            let (addr, addr_len) = (rx.addrs[i], rx.addr_len(i));
            let q = rx.slot_mut(i);
            table[next_id as usize] = (addr, addr_len, u16::from_be_bytes([q[0], q[1]]));
            q[..2].copy_from_slice(&next_id.to_be_bytes());
            next_id = next_id.wrapping_add(1);
            let q = &rx.buf(i)[..len];
            tx.slot_mut(k)[..len].copy_from_slice(q);
            tx.lens[k] = len;
            k += 1;
        }
        busy |= n > 0;
        let _ = tx.send(up.as_raw_fd(), 0, k, false);
        // Replies: upstream -> client.
        let n = match rx.recv(up.as_raw_fd(), libc::MSG_DONTWAIT) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => 0,
            Err(e) => return Err(e),
        };
        let mut k = 0;
        for i in 0..n {
            let len = rx.lens[i];
            if len < 12 {
                continue;
            }
            let r = rx.buf(i);
            let (addr, addr_len, id) = table[u16::from_be_bytes([r[0], r[1]]) as usize];
            let out = tx.slot_mut(k);
            out[..len].copy_from_slice(r);
            out[..2].copy_from_slice(&id.to_be_bytes());
            tx.lens[k] = len;
            tx.set_addr(k, addr, addr_len);
            k += 1;
        }
        busy |= n > 0;
        let _ = tx.send(client.as_raw_fd(), 0, k, true);
        if !busy {
            net::wait(&mut pfds, 1_000_000_000);
        }
    }
}

fn unsafe_zeroed() -> libc::sockaddr_storage {
    // SAFETY: an all-zero sockaddr_storage is a valid value.
    unsafe { std::mem::zeroed() }
}
