//! Batches of datagrams, one system call each way: `recvmmsg` reads every datagram a socket has
//! queued (up to a batch) where `recv_from` in a loop costs a call per datagram and one more that
//! finds the queue empty; `sendmmsg` sends what a flush has for one socket at once: the replies to
//! many clients, the queries to one upstream.
//!
//! The message headers point into the batch's own heap buffers (never where the batch itself
//! lives, so moving it is safe).

use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

use nix::libc;
use socket2::{SockAddr, SockAddrStorage};

/// Room for the largest datagram UDP can carry: nothing is ever cut. The buffer is allocated
/// zeroed and untouched, so memory is used only for the bytes that really arrive. Slots start
/// 65,600 bytes apart, not 64 KiB: at a power-of-two stride every datagram's first bytes would
/// fall into the same few CPU cache sets.
pub const RECV_SLOT: usize = 65600;

/// Datagrams read by one `recvmmsg`.
pub struct RecvBatch {
    buf: Vec<u8>,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    n: usize,
}

impl RecvBatch {
    pub fn new(slots: usize) -> RecvBatch {
        // SAFETY: all-zero is a valid value of these plain C structs.
        let (addrs, iovs, hdrs) = unsafe { (zeroed(), zeroed(), zeroed()) };
        let mut b = RecvBatch {
            buf: vec![0; slots * RECV_SLOT],
            addrs: vec![addrs; slots],
            iovs: vec![iovs; slots],
            hdrs: vec![hdrs; slots],
            n: 0,
        };
        // The headers point into the batch's own heap buffers, which never move or resize, so
        // they are set once here; a read resets only what the kernel wrote back.
        let base = b.buf.as_mut_ptr();
        for i in 0..slots {
            b.iovs[i] = libc::iovec {
                // Slot i lies inside `buf` (slots * RECV_SLOT bytes).
                iov_base: base.wrapping_add(i * RECV_SLOT).cast(),
                iov_len: RECV_SLOT,
            };
            let h = &mut b.hdrs[i].msg_hdr;
            h.msg_name = (&mut b.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut b.iovs[i];
            h.msg_iovlen = 1;
        }
        b
    }

    /// Reads what `socket` has queued, without waiting. `Ok(0)` when nothing is queued; an
    /// error only when nothing was read (the kernel reports a later one on the next call).
    pub fn recv(&mut self, socket: &impl AsRawFd) -> io::Result<usize> {
        for h in &mut self.hdrs[..self.n] {
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        }
        self.n = 0;
        // SAFETY: `hdrs` holds `hdrs.len()` headers, each pointing at heap memory of this batch
        // that outlives the call.
        let got = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                self.hdrs.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(0),
                _ => Err(e),
            };
        }
        self.n = got as usize;
        Ok(self.n)
    }

    /// The datagrams of the last read (from a connected socket, whose sender is known).
    pub fn datagrams(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.n).map(|i| &self.buf[i * RECV_SLOT..][..self.hdrs[i].msg_len as usize])
    }

    /// The datagrams of the last read, each with its sender when the kernel gave one.
    pub fn with_senders(&self) -> impl Iterator<Item = (&[u8], Option<SocketAddr>)> {
        self.datagrams().enumerate().map(|(i, d)| {
            let mut storage = SockAddrStorage::zeroed();
            // SAFETY: a sockaddr_storage viewed as one; the kernel wrote `msg_namelen` bytes of
            // it and `SockAddr` reads no more than that (and only by the family it finds).
            let from = unsafe {
                *storage.view_as::<libc::sockaddr_storage>() = self.addrs[i];
                SockAddr::new(storage, self.hdrs[i].msg_hdr.msg_namelen)
            };
            (d, from.as_socket())
        })
    }
}

/// Datagrams queued to go out together, packed one after another in one buffer (which keeps its
/// size between flushes, up to `KEEP_BYTES`): each with a tag that names the socket it leaves
/// from, an address unless that socket is connected, and a value of the caller's (`T`) handed
/// back if the kernel refuses it. `send` makes one `sendmmsg` per socket.
pub struct SendBatch<T> {
    buf: Vec<u8>,
    msgs: Vec<Queued<T>>,
    /// Message indices in the order they are sent: grouped by tag, in queue order within.
    order: Vec<usize>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

struct Queued<T> {
    start: usize,
    len: usize,
    tag: usize,
    to: Option<SockAddr>,
    value: T,
}

/// Bytes the buffer keeps between flushes; a burst of 64 KiB answers gives the rest back.
const KEEP_BYTES: usize = 256 << 10;

impl<T: Copy> SendBatch<T> {
    pub fn new(slots: usize) -> SendBatch<T> {
        // SAFETY: all-zero is a valid value of these plain C structs.
        let (iovs, hdrs) = unsafe { (zeroed(), zeroed()) };
        SendBatch {
            buf: Vec::new(),
            msgs: Vec::with_capacity(slots),
            order: Vec::with_capacity(slots),
            iovs: vec![iovs; slots],
            hdrs: vec![hdrs; slots],
        }
    }

    /// Queues a copy of `bytes` to leave from the socket tagged `tag`, for `to` (`None`: the
    /// socket is connected). Call `send` first when the batch `is_full`.
    pub fn push(&mut self, bytes: &[u8], to: Option<SocketAddr>, tag: usize, value: T) {
        debug_assert!(!self.is_full());
        let start = self.buf.len();
        self.buf.extend_from_slice(bytes);
        self.msgs.push(Queued {
            start,
            len: bytes.len(),
            tag,
            to: to.map(SockAddr::from),
            value,
        });
    }

    pub fn is_full(&self) -> bool {
        self.msgs.len() == self.hdrs.len()
    }

    /// Sends everything queued and empties the batch, from socket `socket(tag)`. A datagram the
    /// kernel refuses (a full send buffer, an ICMP error reported now, a tag with no socket) is
    /// skipped and its value given to `refused` with the error; the rest still go.
    pub fn send(
        &mut self,
        socket: impl Fn(usize) -> Option<RawFd>,
        mut refused: impl FnMut(T, io::Error),
    ) {
        let n = self.msgs.len();
        self.order.clear();
        self.order.extend(0..n);
        let msgs = &mut self.msgs;
        self.order.sort_by_key(|&i| msgs[i].tag);
        // The buffer no longer grows from here on, so pointers into it stay valid.
        let base = self.buf.as_mut_ptr();
        for (k, &i) in self.order.iter().enumerate() {
            let m = &mut msgs[i];
            self.iovs[k] = libc::iovec {
                // The message's bytes lie inside `buf`.
                iov_base: base.wrapping_add(m.start).cast(),
                iov_len: m.len,
            };
            let h = &mut self.hdrs[k].msg_hdr;
            // The kernel only reads a send's address.
            (h.msg_name, h.msg_namelen) = match &m.to {
                Some(to) => (to.as_ptr().cast_mut().cast(), to.len()),
                None => (std::ptr::null_mut(), 0),
            };
            // No control data, no flags: left zero from `new`, as a send writes back only
            // `msg_len`.
            h.msg_iov = &mut self.iovs[k];
            h.msg_iovlen = 1;
        }
        let mut k = 0;
        for group in self.order.chunk_by(|&a, &b| msgs[a].tag == msgs[b].tag) {
            let end = k + group.len();
            let Some(fd) = socket(msgs[group[0]].tag) else {
                for &i in group {
                    refused(msgs[i].value, io::Error::from(io::ErrorKind::NotConnected));
                }
                k = end;
                continue;
            };
            while k < end {
                // SAFETY: headers k..end point at memory of this batch that outlives the call.
                let sent = unsafe {
                    libc::sendmmsg(
                        fd,
                        self.hdrs.as_mut_ptr().add(k),
                        (end - k) as libc::c_uint,
                        libc::MSG_DONTWAIT,
                    )
                };
                if sent < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        // The first remaining datagram failed: skip it, send the rest.
                        refused(msgs[self.order[k]].value, e);
                        k += 1;
                    }
                } else {
                    k += sent as usize;
                }
            }
        }
        self.msgs.clear();
        self.buf.clear();
        if self.buf.capacity() > KEEP_BYTES {
            self.buf = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn a_batch_reads_every_queued_datagram_and_sends_to_each_address() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("[::1]:0").unwrap();
        let mut recv = RecvBatch::new(4);
        assert_eq!(recv.recv(&rx).unwrap(), 0, "nothing queued yet");
        for i in 0..6u8 {
            a.send_to(&vec![i; 100 + i as usize], rx.local_addr().unwrap())
                .unwrap();
        }
        assert_eq!(recv.recv(&rx).unwrap(), 4);
        let got: Vec<_> = recv.with_senders().map(|(d, f)| (d.to_vec(), f)).collect();
        for (i, (d, from)) in got.iter().enumerate() {
            assert_eq!(d, &vec![i as u8; 100 + i]);
            assert_eq!(*from, Some(a.local_addr().unwrap()));
        }
        assert_eq!(recv.recv(&rx).unwrap(), 2);

        // Grouped by socket, in queue order within each; a connected socket needs no address.
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        c.connect(a.local_addr().unwrap()).unwrap();
        let mut send = SendBatch::new(4);
        let to_a = Some(a.local_addr().unwrap());
        send.push(b"one", to_a, 0, 'a');
        send.push(b"uno", None, 1, 'b');
        send.push(&[7; 9000], to_a, 0, 'c');
        send.push(b"lost", None, 2, 'd');
        assert!(send.is_full());
        let mut refused = Vec::new();
        let fds = [rx.as_raw_fd(), c.as_raw_fd()];
        send.send(|tag| fds.get(tag).copied(), |v, _| refused.push(v));
        assert_eq!(refused, ['d'], "tag 2 has no socket");
        assert!(!send.is_full());
        let mut buf = [0u8; 9100];
        let mut got = Vec::new();
        for _ in 0..3 {
            let (n, from) = a.recv_from(&mut buf).unwrap();
            got.push((buf[..n].to_vec(), from));
        }
        let (rx_at, c_at) = (rx.local_addr().unwrap(), c.local_addr().unwrap());
        assert_eq!(
            got,
            [
                (b"one".to_vec(), rx_at),
                (vec![7; 9000], rx_at),
                (b"uno".to_vec(), c_at)
            ]
        );

        // Loopback delivers within the send, so the datagram is already queued.
        let rx6 = UdpSocket::bind("[::1]:0").unwrap();
        b.send_to(b"six", rx6.local_addr().unwrap()).unwrap();
        assert_eq!(recv.recv(&rx6).unwrap(), 1);
        let (d, from) = recv.with_senders().next().unwrap();
        assert_eq!(d, b"six");
        assert_eq!(from, Some(b.local_addr().unwrap()));
    }
}
