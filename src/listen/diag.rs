//! The kernel's own view of a listener's port (sock_diag, NETLINK_SOCK_DIAG): each member of its
//! SO_REUSEPORT groups by inode, with what waits unread in it (a UDP socket's receive queue in
//! bytes, a TCP listener's accept queue in connections).
//!
//! Hand-written rather than netlink-packet-sock-diag and netlink-sys: the request is one fixed
//! 72-byte struct plus a 16-byte port filter and the reply one fixed 72-byte struct, where the
//! crates would add four dependencies for the same two structs (`link` talks rtnetlink the same
//! way). One dump per protocol filtered in the kernel to the port, in the calling thread's
//! network namespace; unlike /proc/net it never formats the node's other sockets as text.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Udp,
    Tcp,
}

use crate::flows::Owners;
/// A member of a port's SO_REUSEPORT group: its inode and what waits unread in it (a UDP
/// socket's receive queue in bytes, a TCP listener's accept queue in connections).
pub use crate::flows::Queue as Member;

/// The members of the groups on one port: local address, member, and the id of the cgroup
/// (v2) of the process that made the socket.
pub type Dump = Vec<(IpAddr, Member, u64)>;

/// A sock_diag socket, kept by a reader that looks often.
pub struct Diag {
    fd: OwnedFd,
}

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const INET_DIAG_REQ_BYTECODE: u16 = 1;
const INET_DIAG_BC_S_COND: u8 = 7;
/// An unconnected UDP socket is in TCP_CLOSE; a connected one (a client) is no member.
const TCP_CLOSE: u32 = 7;
const TCP_LISTEN: u32 = 10;

impl Diag {
    pub fn open() -> io::Result<Diag> {
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkSockDiag,
        )?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        Ok(Diag { fd })
    }

    /// The sockets bound to exactly `addr` that are members of its group: unconnected UDP
    /// sockets, or TCP listeners.
    pub fn members(&self, addr: SocketAddr, proto: Proto) -> io::Result<Vec<Member>> {
        let all = self.port(addr.port(), addr.is_ipv6(), proto)?;
        Ok(all
            .into_iter()
            .filter(|e| e.0 == addr.ip())
            .map(|e| e.1)
            .collect())
    }

    /// The members of every group on `port` (of IPv6 addresses if `v6`), by local address: one
    /// dump serves both listeners.
    pub fn port(&self, port: u16, v6: bool, proto: Proto) -> io::Result<Dump> {
        socket::send(
            self.fd.as_raw_fd(),
            &request(port, v6, proto),
            MsgFlags::empty(),
        )?;
        let mut members = Vec::new();
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let n = socket::recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            let mut at = 0;
            while at + 16 <= n {
                let len = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4")) as usize;
                let ty = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
                if len < 16 || at + len > n {
                    return Err(io::Error::other("a truncated sock_diag message"));
                }
                match ty {
                    NLMSG_DONE => return Ok(members),
                    NLMSG_ERROR => {
                        let code = buf
                            .get(at + 16..at + 20)
                            .map_or(0, |c| i32::from_ne_bytes(c.try_into().expect("4")));
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                    _ => members.extend(member(&buf[at + 16..at + len], port, v6)),
                }
                at += (len + 3) & !3;
            }
        }
    }
}

/// The sockets of `addr`'s group, with a sock_diag socket of their own.
pub fn group_members(addr: SocketAddr, proto: Proto) -> io::Result<Vec<u64>> {
    let members = Diag::open()?.members(addr, proto)?;
    Ok(members.into_iter().map(|m| m.inode).collect())
}

/// nlmsghdr, inet_diag_req_v2 (the family, protocol and states; the socket id is not a filter in
/// a dump) and a bytecode filter: source port equal to `addr`'s.
fn request(port: u16, v6: bool, proto: Proto) -> Vec<u8> {
    let (protocol, state) = match proto {
        Proto::Udp => (nix::libc::IPPROTO_UDP as u8, TCP_CLOSE),
        Proto::Tcp => (nix::libc::IPPROTO_TCP as u8, TCP_LISTEN),
    };
    let family = if v6 {
        nix::libc::AF_INET6
    } else {
        nix::libc::AF_INET
    } as u8;
    const LEN: usize = 16 + 56 + 4 + 12;
    let mut m = Vec::with_capacity(LEN);
    m.extend_from_slice(&(LEN as u32).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m.extend_from_slice(&[0; 8]);
    m.extend_from_slice(&[family, protocol, 0, 0]);
    m.extend_from_slice(&(1u32 << state).to_ne_bytes());
    m.extend_from_slice(&[0; 48]);
    // One S_COND op (code, yes, no) then its inet_diag_hostcond (any family, prefix 0, port):
    // a match jumps to the end (accept), a miss one word past it (reject).
    m.extend_from_slice(&16u16.to_ne_bytes());
    m.extend_from_slice(&INET_DIAG_REQ_BYTECODE.to_ne_bytes());
    m.extend_from_slice(&[INET_DIAG_BC_S_COND, 12]);
    m.extend_from_slice(&16u16.to_ne_bytes());
    m.extend_from_slice(&[0, 0, 0, 0]);
    m.extend_from_slice(&i32::from(port).to_ne_bytes());
    m
}

const INET_DIAG_CGROUP_ID: u16 = 21;

/// An inet_diag_msg and its attributes: its local address, the member it names if it is
/// unconnected, and its cgroup.
fn member(msg: &[u8], port: u16, v6: bool) -> Option<(IpAddr, Member, u64)> {
    if msg.len() < 72 || u16::from_be_bytes([msg[4], msg[5]]) != port || msg[6..8] != [0, 0] {
        return None;
    }
    let u32_at = |at: usize| u32::from_ne_bytes(msg[at..at + 4].try_into().expect("4"));
    let ip = if v6 {
        IpAddr::from(<[u8; 16]>::try_from(&msg[8..24]).expect("16"))
    } else {
        IpAddr::from(<[u8; 4]>::try_from(&msg[8..12]).expect("4"))
    };
    let m = Member {
        inode: u64::from(u32_at(68)),
        queued: u32_at(56),
    };
    let (mut at, mut cgroup) = (72, 0);
    while at + 4 <= msg.len() {
        let len = usize::from(u16::from_ne_bytes([msg[at], msg[at + 1]]));
        let ty = u16::from_ne_bytes([msg[at + 2], msg[at + 3]]);
        if len < 4 || at + len > msg.len() {
            break;
        }
        if ty == INET_DIAG_CGROUP_ID && len >= 12 {
            cgroup = u64::from_ne_bytes(msg[at + 4..at + 12].try_into().expect("8"));
        }
        at += (len + 3) & !3;
    }
    Some((ip, m, cgroup))
}

/// What the processes that made sockets of `cgroups` do: a thread running or waiting for a CPU
/// (state R: its unread queue is starvation or its slice's CPU quota, not a hang), every thread
/// stopped (T: SIGSTOP), or else asleep. Found through the sockets' cgroups (v2; a cgroup id is
/// its directory's inode number), whose threads anyone may list and whose states anyone may
/// read: the standby keeps no capability to look into another process's descriptors. `paths`
/// keeps the directories found, by id. The root cgroup, or one not found (no cgroup mount, as
/// under `ip netns exec`), counts as asleep: the queue alone decides.
pub fn owners(cgroups: &[u64], paths: &mut Vec<(u64, std::path::PathBuf)>) -> Owners {
    let root = cgroup_root();
    let mut states = Vec::new();
    for &id in cgroups {
        if !paths.iter().any(|(i, _)| *i == id) {
            if let Some(p) = find_cgroup(&root, id) {
                paths.push((id, p));
            }
        }
        let Some((_, path)) = paths.iter().find(|(i, p)| *i == id && *p != root) else {
            return Owners::Asleep;
        };
        let threads = std::fs::read_to_string(path.join("cgroup.threads")).unwrap_or_default();
        for tid in threads.lines() {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", tid.trim()));
            if let Some(state) = stat
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.chars().next()))
            {
                states.extend(state);
            }
        }
    }
    if states.contains(&'R') {
        Owners::Runnable
    } else if !states.is_empty() && states.iter().all(|&c| c == 'T' || c == 't') {
        Owners::Stopped
    } else {
        Owners::Asleep
    }
}

fn cgroup_root() -> std::path::PathBuf {
    let v2 = std::path::Path::new("/sys/fs/cgroup");
    if v2.join("cgroup.controllers").exists() {
        v2.to_path_buf()
    } else {
        v2.join("unified")
    }
}

fn find_cgroup(dir: &std::path::Path, id: u64) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata(dir).ok()?.ino() == id {
        return Some(dir.to_path_buf());
    }
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .find_map(|e| find_cgroup(&e.path(), id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_the_kernel_layout() {
        let r = request(53, false, Proto::Tcp);
        assert_eq!(r.len(), 88);
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 88);
        assert_eq!(r[16..18], [nix::libc::AF_INET as u8, 6]);
        assert_eq!(u32::from_ne_bytes(r[20..24].try_into().unwrap()), 1 << 10);
        assert_eq!(i32::from_ne_bytes(r[84..88].try_into().unwrap()), 53);
    }

    /// On loopback, in whatever namespace the test runs: members of a shared port, what waits in
    /// a UDP socket nobody reads and in a TCP listener nobody accepts on, and nobody else.
    #[test]
    fn members_and_their_queues_as_the_kernel_sees_them() {
        use socket2::{Domain, Socket, Type};
        use std::os::fd::AsFd;
        let shared = |ty, addr: SocketAddr| {
            let s = Socket::new(Domain::IPV4, ty, None).unwrap();
            s.set_reuse_port(true).unwrap();
            s.bind(&addr.into()).unwrap();
            s
        };
        let a = shared(Type::DGRAM, "127.0.0.1:0".parse().unwrap());
        let addr = a.local_addr().unwrap().as_socket().unwrap();
        let b = shared(Type::DGRAM, addr);
        let diag = Diag::open().unwrap();
        let inodes = |m: Vec<Member>| {
            let mut v: Vec<u64> = m.iter().map(|m| m.inode).collect();
            v.sort();
            v
        };
        let inode = |s: &Socket| nix::sys::stat::fstat(s.as_fd()).unwrap().st_ino;
        let mut want = vec![inode(&a), inode(&b)];
        want.sort();
        assert_eq!(inodes(diag.members(addr, Proto::Udp).unwrap()), want);
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..3 {
            client.send_to(b"twelve bytes", addr).unwrap();
        }
        let queued: u32 = diag
            .members(addr, Proto::Udp)
            .unwrap()
            .iter()
            .map(|m| m.queued)
            .sum();
        assert!(queued >= 36, "{queued} bytes queued");
        let l = shared(Type::STREAM, addr);
        l.listen(8).unwrap();
        let _c = std::net::TcpStream::connect(addr).unwrap();
        let tcp = diag.members(addr, Proto::Tcp).unwrap();
        assert_eq!(tcp.len(), 1, "{tcp:?}");
        assert_eq!(tcp[0].queued, 1, "one connection waits to be accepted");
        let other: SocketAddr = format!("127.0.0.2:{}", addr.port()).parse().unwrap();
        assert!(diag.members(other, Proto::Udp).unwrap().is_empty());
    }
}
