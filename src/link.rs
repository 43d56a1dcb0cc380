//! The listener addresses, over rtnetlink from the process itself (no `ip` to exec, so no
//! dependency on iproute2 being intact).
//!
//! LocalDNS deletes and recreates link `localdns` on every start and deletes it on a clean stop;
//! after a crash the link and both addresses survive. Our sockets are bound with IP_FREEBIND and
//! survive all of that, but receive nothing while no interface carries their address. So the
//! fallback puts the listener /32s on `lo` as well (Linux lets the same address sit on two
//! interfaces), which LocalDNS never touches: it keeps answering while LocalDNS deletes and
//! recreates its link beside it. It never creates link `localdns` or adds addresses to it: that
//! would make LocalDNS's own `ip link add` / `ip addr add` fail while it starts. When it leaves it
//! removes what it put on `lo` ([`release_from_loopback`]); the unit's ExecStopPost does the same
//! after a kill.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::libc::{
    self, AF_INET, AF_INET6, IFA_ADDRESS, IFA_F_NODAD, IFA_LOCAL, NLM_F_ACK, NLM_F_CREATE,
    NLM_F_EXCL, NLM_F_REQUEST, RTM_DELADDR, RTM_NEWADDR, c_int,
};
use nix::sys::socket::{
    self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

/// The loopback interface, which LocalDNS never deletes.
pub const LOOPBACK: &str = "lo";

/// What [`claim_on_loopback`] found and did, for the start-up log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub added: Vec<IpAddr>,
    pub present: Vec<IpAddr>,
}

/// Puts each of `addrs` on `lo` as a host address unless it is there already.
pub fn claim_on_loopback(addrs: &[IpAddr]) -> Result<Outcome, String> {
    let nl = Netlink::open().map_err(|e| format!("cannot open a netlink socket: {e}"))?;
    let index = nix::net::if_::if_nametoindex(LOOPBACK)
        .map_err(|e| format!("no loopback interface: {e}"))?;
    let mut outcome = Outcome::default();
    for &addr in addrs {
        match nl.add_address(index, addr) {
            Ok(()) => outcome.added.push(addr),
            Err(Errno::EEXIST) => outcome.present.push(addr),
            Err(e) => return Err(format!("cannot add {addr} to {LOOPBACK}: {e}")),
        }
    }
    Ok(outcome)
}

/// Removes each of `addrs` from `lo`; one that is not there is fine. Nobody but the fallback
/// puts the listener addresses on `lo`, so whatever is there is ours to remove.
pub fn release_from_loopback(addrs: &[IpAddr]) -> Result<(), String> {
    let nl = Netlink::open().map_err(|e| format!("cannot open a netlink socket: {e}"))?;
    let index = nix::net::if_::if_nametoindex(LOOPBACK)
        .map_err(|e| format!("no loopback interface: {e}"))?;
    for &addr in addrs {
        match nl.delete_address(index, addr) {
            Ok(()) | Err(Errno::EADDRNOTAVAIL) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(format!("cannot remove {addr} from {LOOPBACK}: {e}")),
        }
    }
    Ok(())
}

/// The interfaces (by index) that carry each of `addrs`, from one dump of the host's addresses:
/// an address on none is missing from the answer.
pub fn interfaces_of(addrs: &[IpAddr]) -> Result<Vec<(IpAddr, u32)>, String> {
    const SEQ: u32 = 2;
    let nl = Netlink::open().map_err(|e| format!("cannot open a netlink socket: {e}"))?;
    let mut msg = Vec::with_capacity(24);
    // An ifaddrmsg of family AF_UNSPEC: every family.
    push_header(
        &mut msg,
        8,
        libc::RTM_GETADDR,
        NLM_F_REQUEST | libc::NLM_F_DUMP,
        SEQ,
    );
    msg.extend_from_slice(&[0; 8]);
    let fd = nl.fd.as_raw_fd();
    socket::send(fd, &msg, MsgFlags::empty())
        .map_err(|e| format!("cannot ask for the addresses: {e}"))?;
    let mut found = Vec::new();
    let mut buf = vec![0u8; 32768];
    loop {
        let n = socket::recv(fd, &mut buf, MsgFlags::empty())
            .map_err(|e| format!("cannot read the addresses: {e}"))?;
        for m in messages(&buf[..n]) {
            let m = m.map_err(|e| format!("cannot read the addresses: {e}"))?;
            match m.ty {
                _ if m.seq != SEQ => {}
                _ if m.ty == libc::NLMSG_DONE as u16 => return Ok(found),
                _ if m.error().is_some() => {
                    return Err(format!("the address dump failed: {:?}", m.error()));
                }
                RTM_NEWADDR if m.payload.len() >= 8 => {
                    let index = u32::from_ne_bytes(m.payload[4..8].try_into().expect("4 bytes"));
                    // IFA_LOCAL is the address itself where it differs from IFA_ADDRESS (the
                    // peer's, on point-to-point links); IPv6 has IFA_ADDRESS alone.
                    let mut local = None;
                    for (ty, data) in attributes(&m.payload[8..]) {
                        let a = match data.len() {
                            4 => IpAddr::from(<[u8; 4]>::try_from(data).expect("4 bytes")),
                            16 => IpAddr::from(<[u8; 16]>::try_from(data).expect("16 bytes")),
                            _ => continue,
                        };
                        if ty == IFA_LOCAL || (ty == IFA_ADDRESS && local.is_none()) {
                            local = Some(a);
                        }
                    }
                    found.extend(local.filter(|a| addrs.contains(a)).map(|a| (a, index)));
                }
                _ => {}
            }
        }
    }
}

/// The (type, data) of each netlink attribute in `buf`.
fn attributes(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_ne_bytes(buf.get(..2)?.try_into().ok()?));
        let ty = u16::from_ne_bytes(buf.get(2..4)?.try_into().ok()?);
        let data = buf.get(4..len.max(4))?;
        buf = buf.get((len + 3) & !3..).unwrap_or(&[]);
        Some((ty, data))
    })
}

/// A NETLINK_ROUTE socket that sends one request at a time and waits for its acknowledgement.
struct Netlink {
    fd: OwnedFd,
}

/// The kernel's announcements of addresses added or removed anywhere on this host (rtnetlink
/// groups RTMGRP_IPV4_IFADDR and RTMGRP_IPV6_IFADDR), on a non-blocking socket: readable whenever
/// one came. What they say is not parsed; the reader looks at the addresses it cares about.
pub fn address_changes() -> nix::Result<OwnedFd> {
    let fd = socket::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        SockProtocol::NetlinkRoute,
    )?;
    socket::bind(
        fd.as_raw_fd(),
        &NetlinkAddr::new(
            0,
            (libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32,
        ),
    )?;
    Ok(fd)
}

impl Netlink {
    fn open() -> nix::Result<Netlink> {
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        Ok(Netlink { fd })
    }

    fn add_address(&self, index: u32, addr: IpAddr) -> nix::Result<()> {
        self.request(
            RTM_NEWADDR,
            NLM_F_CREATE | NLM_F_EXCL,
            &address_msg(index, addr),
        )
    }

    fn delete_address(&self, index: u32, addr: IpAddr) -> nix::Result<()> {
        self.request(RTM_DELADDR, 0, &address_msg(index, addr))
    }

    /// Sends one request and returns the kernel's verdict from its acknowledgement.
    fn request(&self, kind: u16, flags: c_int, payload: &[u8]) -> nix::Result<()> {
        const SEQ: u32 = 1;
        let mut msg = Vec::with_capacity(16 + payload.len());
        push_header(
            &mut msg,
            payload.len(),
            kind,
            flags | NLM_F_REQUEST | NLM_F_ACK,
            SEQ,
        );
        msg.extend_from_slice(payload);
        socket::send(self.fd.as_raw_fd(), &msg, MsgFlags::empty())?;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = socket::recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            for m in messages(&buf[..n]) {
                let m = m?;
                if let (SEQ, Some(code)) = (m.seq, m.error()) {
                    return if code == 0 {
                        Ok(())
                    } else {
                        Err(Errno::from_raw(-code))
                    };
                }
            }
        }
    }
}

/// Appends a netlink message header (nlmsghdr) for a payload of `payload` bytes.
pub fn push_header(m: &mut Vec<u8>, payload: usize, ty: u16, flags: c_int, seq: u32) {
    m.extend_from_slice(&((16 + payload) as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&(flags as u16).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
}

/// One netlink message of what a `recv` read.
pub struct Message<'a> {
    pub ty: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

impl Message<'_> {
    /// An NLMSG_ERROR's code: 0 for an acknowledgement, else a negative errno.
    pub fn error(&self) -> Option<i32> {
        let code = self
            .payload
            .get(..4)
            .filter(|_| self.ty == libc::NLMSG_ERROR as u16)?;
        Some(i32::from_ne_bytes(code.try_into().expect("4 bytes")))
    }
}

/// The messages in `buf`, one `recv`'s worth; an error (and nothing after it) where a length
/// does not fit.
pub fn messages(buf: &[u8]) -> impl Iterator<Item = Result<Message<'_>, Errno>> {
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

/// An ifaddrmsg for `addr` as a host address on interface `index`.
fn address_msg(index: u32, addr: IpAddr) -> Vec<u8> {
    let (family, prefix, bytes, flags) = match addr {
        IpAddr::V4(a) => (AF_INET as u8, 32, a.octets().to_vec(), 0),
        // No duplicate address detection: the address is ours alone and must work at once.
        IpAddr::V6(a) => (AF_INET6 as u8, 128, a.octets().to_vec(), IFA_F_NODAD as u8),
    };
    let mut msg = vec![family, prefix, flags, 0];
    msg.extend_from_slice(&index.to_ne_bytes());
    push_attr(&mut msg, IFA_LOCAL, &bytes);
    push_attr(&mut msg, IFA_ADDRESS, &bytes);
    msg
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

    #[test]
    fn address_messages_carry_a_host_prefix() {
        let v4 = address_msg(1, "169.254.10.10".parse().unwrap());
        assert_eq!(&v4[..4], &[AF_INET as u8, 32, 0, 0]);
        assert_eq!(&v4[4..8], &1u32.to_ne_bytes());
        // IFA_LOCAL then IFA_ADDRESS, 4 + 4 bytes each.
        assert_eq!(v4.len(), 8 + 2 * 8);
        assert!(v4.windows(4).any(|w| w == [169, 254, 10, 10]));
        let v6 = address_msg(1, "fd00::a".parse().unwrap());
        assert_eq!(&v6[..4], &[AF_INET6 as u8, 128, IFA_F_NODAD as u8, 0]);
        assert_eq!(v6.len(), 8 + 2 * 20);
    }
}
