//! The listener addresses, over rtnetlink.
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
use std::os::fd::OwnedFd;

use nix::errno::Errno;
use nix::libc::{
    AF_INET, AF_INET6, IFA_ADDRESS, IFA_F_NODAD, IFA_LOCAL, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST, RTM_DELADDR, RTM_GETADDR, RTM_NEWADDR, RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR,
};
use nix::sys::socket::{SockFlag, SockProtocol};

use super::{Netlink, attributes, push_attr, push_header};

/// The loopback interface, which LocalDNS never deletes.
pub const LOOPBACK: &str = "lo";

/// What [`claim_on_loopback`] found and did, for the start-up log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub added: Vec<IpAddr>,
    pub present: Vec<IpAddr>,
}

/// A NETLINK_ROUTE socket for requests, and the index of `lo`.
fn route_and_loopback() -> Result<(Netlink, u32), String> {
    let nl = route()?;
    let index = nix::net::if_::if_nametoindex(LOOPBACK)
        .map_err(|e| format!("no loopback interface: {e}"))?;
    Ok((nl, index))
}

fn route() -> Result<Netlink, String> {
    Netlink::open(SockProtocol::NetlinkRoute, 0, SockFlag::empty())
        .map_err(|e| format!("cannot open a netlink socket: {e}"))
}

/// Puts each of `addrs` on `lo` as a host address unless it is there already.
pub fn claim_on_loopback(addrs: &[IpAddr]) -> Result<Outcome, String> {
    let (nl, index) = route_and_loopback()?;
    let mut outcome = Outcome::default();
    for &addr in addrs {
        let msg = address_msg(index, addr);
        match nl.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &msg) {
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
    let (nl, index) = route_and_loopback()?;
    for &addr in addrs {
        match nl.request(RTM_DELADDR, 0, &address_msg(index, addr)) {
            Ok(()) | Err(Errno::EADDRNOTAVAIL) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(format!("cannot remove {addr} from {LOOPBACK}: {e}")),
        }
    }
    Ok(())
}

/// The interfaces (by index) that carry each of `addrs`, from one dump of the host's addresses:
/// an address on none is missing from the answer.
pub fn interfaces_of(addrs: &[IpAddr]) -> Result<Vec<(IpAddr, u32)>, String> {
    let mut msg = Vec::with_capacity(24);
    // An ifaddrmsg of family AF_UNSPEC: every family.
    push_header(&mut msg, 8, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, 2);
    msg.extend_from_slice(&[0; 8]);
    let mut found = Vec::new();
    route()?
        .dump(&msg, |m| {
            if m.ty != RTM_NEWADDR || m.payload.len() < 8 {
                return;
            }
            let index = u32::from_ne_bytes(m.payload[4..8].try_into().expect("4 bytes"));
            // IFA_LOCAL is the address itself where it differs from IFA_ADDRESS (the peer's, on
            // point-to-point links); IPv6 has IFA_ADDRESS alone.
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
        })
        .map_err(|e| format!("cannot read the addresses: {e}"))?;
    Ok(found)
}

/// The kernel's announcements of addresses added or removed anywhere on this host (rtnetlink
/// groups RTMGRP_IPV4_IFADDR and RTMGRP_IPV6_IFADDR), on a non-blocking socket: readable whenever
/// one came. What they say is not parsed; the reader looks at the addresses it cares about.
pub fn address_changes() -> nix::Result<OwnedFd> {
    let groups = RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
    Netlink::open(SockProtocol::NetlinkRoute, groups, SockFlag::SOCK_NONBLOCK).map(|nl| nl.0)
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

#[cfg(test)]
mod tests {
    use super::*;

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
