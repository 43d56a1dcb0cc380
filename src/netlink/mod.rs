//! Netlink, spoken by the process itself: rtnetlink for the listener addresses on `lo` (`route`:
//! no `ip` to exec, so no dependency on iproute2 being intact) and sock_diag for the kernel's
//! view of a listener's port (`diag`).
//!
//! Hand-written rather than netlink-sys and the netlink-packet crates: each request is a fixed
//! struct or two and each reply is read for a few fields, where the crates would add four
//! dependencies for the same structs. The constants are `libc`'s, but for the sock_diag ones it
//! lacks (in `diag`).

mod diag;
mod route;

pub use diag::{Diag, Entry, Looked, Proto, group_members};
pub use route::{
    LOOPBACK, Outcome, address_changes, claim_on_loopback, interfaces_of, release_from_loopback,
};

use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::libc::{NLM_F_ACK, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, c_int};
use nix::sys::socket::{
    self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

/// A netlink socket of one protocol (NETLINK_ROUTE or NETLINK_SOCK_DIAG).
struct Netlink(OwnedFd);

impl Netlink {
    /// A socket of `protocol` that hears the multicast `groups` (none for requests alone).
    fn open(protocol: SockProtocol, groups: c_int, flags: SockFlag) -> nix::Result<Netlink> {
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC | flags,
            protocol,
        )?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups as u32))?;
        Ok(Netlink(fd))
    }

    fn send(&self, msg: &[u8]) -> nix::Result<usize> {
        socket::send(self.0.as_raw_fd(), msg, MsgFlags::empty())
    }

    fn recv(&self, buf: &mut [u8], flags: MsgFlags) -> nix::Result<usize> {
        socket::recv(self.0.as_raw_fd(), buf, flags)
    }

    /// Sends one request and returns the kernel's verdict from its acknowledgement.
    fn request(&self, kind: u16, flags: c_int, payload: &[u8]) -> nix::Result<()> {
        let mut msg = Vec::with_capacity(16 + payload.len());
        let flags = flags | NLM_F_REQUEST | NLM_F_ACK;
        push_header(&mut msg, payload.len(), kind, flags, 1);
        msg.extend_from_slice(payload);
        self.dump(&msg, |_| {})
    }

    /// Sends the request `msg` and hands `each` every message of the answer (those of the
    /// request's sequence number) up to NLMSG_DONE or an acknowledgement; an NLMSG_ERROR with
    /// an errno is the request's failure.
    fn dump(&self, msg: &[u8], mut each: impl FnMut(&Message)) -> nix::Result<()> {
        let seq = u32::from_ne_bytes(msg[8..12].try_into().expect("a header"));
        self.send(msg)?;
        // The kernel fills a dump's messages up to 32 KiB where the reader takes that much.
        let mut buf = vec![0u8; 32 << 10];
        loop {
            let n = self.recv(&mut buf, MsgFlags::empty())?;
            for m in messages(&buf[..n]) {
                let m = m?;
                match m.error() {
                    _ if m.seq != seq => {}
                    Some(0) => return Ok(()),
                    Some(code) => return Err(Errno::from_raw(-code)),
                    None if m.ty == NLMSG_DONE as u16 => return Ok(()),
                    None => each(&m),
                }
            }
        }
    }
}

/// Appends a netlink message header (nlmsghdr) for a payload of `payload` bytes.
fn push_header(m: &mut Vec<u8>, payload: usize, ty: u16, flags: c_int, seq: u32) {
    m.extend_from_slice(&((16 + payload) as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&(flags as u16).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
}

/// One netlink message of what a `recv` read.
struct Message<'a> {
    ty: u16,
    seq: u32,
    payload: &'a [u8],
}

impl Message<'_> {
    /// An NLMSG_ERROR's code: 0 for an acknowledgement, else a negative errno.
    fn error(&self) -> Option<i32> {
        let code = self
            .payload
            .get(..4)
            .filter(|_| self.ty == NLMSG_ERROR as u16)?;
        Some(i32::from_ne_bytes(code.try_into().expect("4 bytes")))
    }
}

/// The messages in `buf`, one `recv`'s worth; an error (and nothing after it) where a length
/// does not fit.
fn messages(buf: &[u8]) -> impl Iterator<Item = Result<Message<'_>, Errno>> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at + 16 > buf.len() {
            return None;
        }
        let len = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len < 16 || at + len > buf.len() {
            at = buf.len();
            return Some(Err(Errno::EBADMSG));
        }
        let m = Message {
            ty: u16::from_ne_bytes([buf[at + 4], buf[at + 5]]),
            seq: u32::from_ne_bytes(buf[at + 8..at + 12].try_into().expect("4 bytes")),
            payload: &buf[at + 16..at + len],
        };
        at += (len + 3) & !3;
        Some(Ok(m))
    })
}

/// The (type, data) of each netlink attribute in `buf`, up to one whose length does not fit.
fn attributes(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_ne_bytes(buf.get(..2)?.try_into().ok()?));
        let ty = u16::from_ne_bytes(buf.get(2..4)?.try_into().ok()?);
        let data = buf.get(4..len)?;
        buf = buf.get((len + 3) & !3..).unwrap_or(&[]);
        Some((ty, data))
    })
}

/// Appends a netlink attribute, padded to 4 bytes.
fn push_attr(out: &mut Vec<u8>, ty: u16, data: &[u8]) {
    out.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(data);
    while out.len() % 4 != 0 {
        out.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded() {
        let mut out = Vec::new();
        push_attr(&mut out, 3, b"lo\0");
        assert_eq!(out, [7, 0, 3, 0, b'l', b'o', 0, 0]);
    }
}
