//! The `localdns` interface: make sure it exists, is up and carries the listener addresses, over
//! rtnetlink from the process itself (no `ip` to exec, so no dependency on iproute2 being intact).
//!
//! LocalDNS deletes and recreates the link on every start and deletes it on a clean stop; after a
//! crash the link and both addresses survive. So anything may be there already:
//! only what is missing is added, a link of another kind is accepted, and nothing is removed when
//! we stop (a link that stays up with nothing listening makes clients fail over at once).

use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

pub const LINK_NAME: &str = "localdns";
/// Peer of the veth stand-in used when the kernel has no `dummy` link type.
const VETH_PEER: &str = "localdns-peer";

const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFF_UP: u32 = 0x1;
const IFA_F_NODAD: u8 = 0x02;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// What `ensure` found and did, for the start-up log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The link kind we created, if the link was missing.
    pub created: Option<&'static str>,
    pub added: Vec<IpAddr>,
    pub present: Vec<IpAddr>,
}

/// Ensures link `name` exists and is up with each of `addrs` as a host address (/32 or /128).
pub fn ensure(name: &str, addrs: &[IpAddr]) -> Result<Outcome, String> {
    let nl = Netlink::open().map_err(|e| format!("cannot open a netlink socket: {e}"))?;
    let mut outcome = Outcome::default();
    if nix::net::if_::if_nametoindex(name).is_err() {
        outcome.created = Some(nl.create(name)?);
    }
    let index = nix::net::if_::if_nametoindex(name)
        .map_err(|e| format!("link {name} is missing right after it was made: {e}"))?;
    nl.set_up(index)
        .map_err(|e| format!("cannot bring link {name} up: {e}"))?;
    if outcome.created == Some("veth") {
        if let Ok(peer) = nix::net::if_::if_nametoindex(VETH_PEER) {
            nl.set_up(peer)
                .map_err(|e| format!("cannot bring link {VETH_PEER} up: {e}"))?;
        }
    }
    for &addr in addrs {
        match nl.add_address(index, addr) {
            Ok(()) => outcome.added.push(addr),
            Err(Errno::EEXIST) => outcome.present.push(addr),
            Err(e) => return Err(format!("cannot add {addr} to link {name}: {e}")),
        }
    }
    Ok(outcome)
}

/// A NETLINK_ROUTE socket that sends one request at a time and waits for its acknowledgement.
struct Netlink {
    fd: OwnedFd,
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

    /// Creates a `dummy` link, or a veth pair where the kernel has no dummy type.
    fn create(&self, name: &str) -> Result<&'static str, String> {
        let dummy = link_request(name, "dummy", None);
        match self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &dummy) {
            Ok(()) | Err(Errno::EEXIST) => return Ok("dummy"),
            Err(Errno::EOPNOTSUPP) => {}
            Err(e) => return Err(format!("cannot create link {name} (dummy): {e}")),
        }
        tracing::warn!(
            "the kernel has no dummy link type; making {name} a veth with peer {VETH_PEER}"
        );
        let veth = link_request(name, "veth", Some(VETH_PEER));
        match self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &veth) {
            Ok(()) => Ok("veth"),
            // Someone else made `name` meanwhile; but EEXIST may also mean the peer name is taken.
            Err(Errno::EEXIST) if nix::net::if_::if_nametoindex(name).is_ok() => Ok("veth"),
            Err(e) => Err(format!(
                "cannot create link {name}: the kernel has no dummy link type and a veth failed too ({e})"
            )),
        }
    }

    fn set_up(&self, index: u32) -> nix::Result<()> {
        self.request(RTM_NEWLINK, 0, &ifinfomsg(index, IFF_UP, IFF_UP))
    }

    fn add_address(&self, index: u32, addr: IpAddr) -> nix::Result<()> {
        let (family, prefix, bytes, flags) = match addr {
            IpAddr::V4(a) => (AF_INET, 32, a.octets().to_vec(), 0),
            // No duplicate address detection: the address is ours alone and must work at once.
            IpAddr::V6(a) => (AF_INET6, 128, a.octets().to_vec(), IFA_F_NODAD),
        };
        let mut msg = vec![family, prefix, flags, 0];
        msg.extend_from_slice(&index.to_ne_bytes());
        push_attr(&mut msg, IFA_LOCAL, &bytes);
        push_attr(&mut msg, IFA_ADDRESS, &bytes);
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &msg)
    }

    /// Sends one request and returns the kernel's verdict from its acknowledgement.
    fn request(&self, kind: u16, flags: u16, payload: &[u8]) -> nix::Result<()> {
        const SEQ: u32 = 1;
        let mut msg = Vec::with_capacity(16 + payload.len());
        msg.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        msg.extend_from_slice(&SEQ.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(payload);
        socket::send(self.fd.as_raw_fd(), &msg, MsgFlags::empty())?;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = socket::recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            let mut at = 0;
            while at + 16 <= n {
                let len = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
                let ty = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
                let seq = u32::from_ne_bytes(buf[at + 8..at + 12].try_into().expect("4 bytes"));
                if len < 16 || at + len > n {
                    return Err(Errno::EBADMSG);
                }
                if ty == NLMSG_ERROR && seq == SEQ && len >= 20 {
                    let code =
                        i32::from_ne_bytes(buf[at + 16..at + 20].try_into().expect("4 bytes"));
                    return if code == 0 {
                        Ok(())
                    } else {
                        Err(Errno::from_raw(-code))
                    };
                }
                at += (len + 3) & !3;
            }
        }
    }
}

fn ifinfomsg(index: u32, flags: u32, change: u32) -> Vec<u8> {
    let mut msg = vec![0u8; 4]; // family AF_UNSPEC, padding, device type
    msg.extend_from_slice(&(index as i32).to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&change.to_ne_bytes());
    msg
}

/// An RTM_NEWLINK body: name and kind (and for a veth, its peer's name).
fn link_request(name: &str, kind: &str, veth_peer: Option<&str>) -> Vec<u8> {
    let mut msg = ifinfomsg(0, 0, 0);
    push_attr(&mut msg, IFLA_IFNAME, &c_string(name));
    let mut info = Vec::new();
    push_attr(&mut info, IFLA_INFO_KIND, kind.as_bytes());
    if let Some(peer) = veth_peer {
        let mut peer_msg = ifinfomsg(0, 0, 0);
        push_attr(&mut peer_msg, IFLA_IFNAME, &c_string(peer));
        let mut data = Vec::new();
        push_attr(&mut data, VETH_INFO_PEER, &peer_msg);
        push_attr(&mut info, IFLA_INFO_DATA, &data);
    }
    push_attr(&mut msg, IFLA_LINKINFO, &info);
    msg
}

fn c_string(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
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
    fn attributes_are_padded_and_nested() {
        let mut out = Vec::new();
        push_attr(&mut out, IFLA_IFNAME, b"lo\0");
        assert_eq!(out, [7, 0, 3, 0, b'l', b'o', 0, 0]);
        let msg = link_request("localdns", "dummy", None);
        assert_eq!(msg.len() % 4, 0);
        assert!(msg.windows(6).any(|w| w == b"dummy\0"));
        let veth = link_request("localdns", "veth", Some("localdns-peer"));
        assert!(veth.windows(13).any(|w| w == b"localdns-peer"));
    }
}
