//! The kernel's own view of a listener's port (sock_diag, NETLINK_SOCK_DIAG): each member of its
//! SO_REUSEPORT groups by inode, with what waits unread in it (a UDP socket's receive queue in
//! bytes, a TCP listener's accept queue in connections).
//!
//! The request is one fixed 72-byte inet_diag_req_v2 plus a 16-byte port filter and the reply one
//! fixed 72-byte inet_diag_msg. One dump per protocol filtered in the kernel to the port, in the
//! calling thread's network namespace; unlike /proc/net it never formats the node's other sockets
//! as text.

use std::io;
use std::net::{IpAddr, SocketAddr};

use nix::libc::{self, NLM_F_DUMP, NLM_F_REQUEST};
use nix::sys::socket::{MsgFlags, SockFlag, SockProtocol};

use super::{Netlink, attributes, messages, push_header};
use crate::flows::Queue;

/// Which of a port's two SO_REUSEPORT groups: UDP sockets or TCP listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Udp,
    Tcp,
}

/// A member of a group on one port: local address, inode and what waits unread in it, and the id
/// of the cgroup (v2) of the process that made the socket.
pub type Entry = (IpAddr, Queue, u64);

/// Sockets seen in a look, each with its cgroup id.
pub type Looked = Vec<(Queue, u64)>;

/// A sock_diag socket, kept by a reader that looks often, and what it learned of the groups it
/// read (see [`Diag::theirs`]).
pub struct Diag {
    nl: Netlink,
    keyed: Vec<Keyed>,
}

/// One group's other members as last dumped and, once found, for each a peer port that the
/// kernel's SO_REUSEPORT hash maps to it (`None`: not found, or not a stable choice).
struct Keyed {
    group: (SocketAddr, Proto),
    theirs: Looked,
    keys: Option<Vec<u16>>,
    /// Reads by key since the last dump.
    reads: u32,
}

/// Reads by key between two dumps of a group: a member that joins moves no other, so until a
/// dump it may go unseen (it takes no flow from the steering until then either); 40 idle looks
/// of 30 ms are 1.2 s.
const DUMP_EVERY: u32 = 40;
/// Peer ports tried to find one for each member, in messages of `KEYS_AT_ONCE` requests (each
/// reply takes about 1 KiB of the socket's 208 KiB receive buffer). A group of n members misses
/// one after 128 tries with a chance of (1 - 1/n)^128: 10^-25 for 5, 1 % for 30.
const KEY_TRIES: u16 = 128;
const KEYS_AT_ONCE: u16 = 32;

// The netlink constants libc lacks (linux/sock_diag.h, linux/inet_diag.h, the kernel's TCP
// states).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_REQ_BYTECODE: u16 = 1;
const INET_DIAG_BC_S_COND: u8 = 7;
const INET_DIAG_CGROUP_ID: u16 = 21;
/// An unconnected UDP socket is in TCP_CLOSE; a connected one (a client) is no member.
const TCP_CLOSE: u32 = 7;
const TCP_LISTEN: u32 = 10;

impl Diag {
    pub fn open() -> io::Result<Diag> {
        Ok(Diag {
            nl: Netlink::open(SockProtocol::NetlinkSockDiag, 0, SockFlag::empty())?,
            keyed: Vec::new(),
        })
    }

    /// LocalDNS's sockets in each group `(addr, proto, ours)`: every member but ours, with what
    /// waits in it and its cgroup.
    ///
    /// A dump walks the kernel's whole UDP socket table (16,384 slots on a 24 GiB machine: about
    /// 80 µs of CPU when cold, as after each sleep), most of what the standby cost. A request
    /// for one socket is a hash lookup instead: the kernel answers a request that names a peer
    /// with the member its SO_REUSEPORT hash picks for that peer (the group's program runs only
    /// for a packet), so a peer port found to pick a member reads that member alone. Groups
    /// whose members all have one are read one request a member, in one message; they are
    /// dumped afresh when `dump` says so, every `DUMP_EVERY` reads, and when a port picks some
    /// other socket than its member: a member that left is seen at once, since its port can no
    /// longer pick it.
    pub fn theirs(
        &mut self,
        groups: &[(SocketAddr, Proto, u64)],
        dump: bool,
    ) -> io::Result<Vec<Looked>> {
        if !dump {
            if let Some(read) = self.by_keys(groups)? {
                return Ok(read);
            }
        }
        let mut dumps: Vec<((u16, bool, Proto), Vec<Entry>)> = Vec::new();
        let mut read = Vec::with_capacity(groups.len());
        for &(addr, proto, ours) in groups {
            let key = (addr.port(), addr.is_ipv6(), proto);
            if !dumps.iter().any(|(k, _)| *k == key) {
                dumps.push((key, self.port(key.0, key.1, proto)?));
            }
            let (_, dump) = dumps.iter().find(|(k, _)| *k == key).expect("dumped above");
            let theirs: Looked = dump
                .iter()
                .filter(|(ip, m, _)| *ip == addr.ip() && m.inode != ours)
                .map(|&(_, m, cgroup)| (m, cgroup))
                .collect();
            self.learn((addr, proto), &theirs)?;
            read.push(theirs);
        }
        Ok(read)
    }

    /// Keeps a group's members as dumped; finds their ports afresh if they changed.
    fn learn(&mut self, group: (SocketAddr, Proto), theirs: &Looked) -> io::Result<()> {
        let inodes = |l: &Looked| {
            let mut v: Vec<u64> = l.iter().map(|(m, _)| m.inode).collect();
            v.sort_unstable();
            v
        };
        let at = self.keyed.iter().position(|k| k.group == group);
        let at = at.unwrap_or_else(|| {
            self.keyed.push(Keyed {
                group,
                theirs: Vec::new(),
                keys: None,
                reads: 0,
            });
            self.keyed.len() - 1
        });
        // The same members whose ports stopped picking them: the kernel does not choose by
        // the hash alone there (SO_INCOMING_CPU), so this group is dumped until they change.
        let same = !theirs.is_empty() && inodes(&self.keyed[at].theirs) == inodes(theirs);
        if !same {
            // Nobody to read by key in a group without LocalDNS: dumped until it joins.
            self.keyed[at].keys = match theirs.is_empty() {
                true => None,
                false => self.find_keys(group, theirs)?,
            };
        }
        self.keyed[at].theirs = theirs.clone();
        self.keyed[at].reads = 0;
        Ok(())
    }

    /// A peer port for each of `theirs`, if `KEY_TRIES` ports find one for every member.
    fn find_keys(
        &self,
        group: (SocketAddr, Proto),
        theirs: &Looked,
    ) -> io::Result<Option<Vec<u16>>> {
        let mut keys: Vec<Option<u16>> = vec![None; theirs.len()];
        let mut first = 1;
        while first <= KEY_TRIES && keys.iter().any(Option::is_none) {
            // Request `seq` asks for peer port `first + seq`.
            let mut reqs = Vec::new();
            for seq in 0..KEYS_AT_ONCE {
                one_request(&mut reqs, group, first + seq, u32::from(seq));
            }
            for (seq, found) in self.exchange(&reqs, usize::from(KEYS_AT_ONCE))? {
                let Some(m) = found else { continue };
                if let Some(at) = theirs.iter().position(|(t, _)| t.inode == m.1.inode) {
                    keys[at].get_or_insert(first + seq as u16);
                }
            }
            first += KEYS_AT_ONCE;
        }
        Ok(keys.into_iter().collect())
    }

    /// Every group's members read by their ports, in one message; `None` where a group has
    /// none yet, is due a dump, or a port picked another socket than its member.
    fn by_keys(&mut self, groups: &[(SocketAddr, Proto, u64)]) -> io::Result<Option<Vec<Looked>>> {
        let mut reqs = Vec::new();
        let mut n = 0;
        for &(addr, proto, _) in groups {
            let keyed = self.keyed.iter().find(|k| k.group == (addr, proto));
            let Some(keys) = keyed
                .filter(|k| k.reads < DUMP_EVERY)
                .and_then(|k| k.keys.as_ref())
            else {
                return Ok(None);
            };
            for &key in keys {
                one_request(&mut reqs, (addr, proto), key, n as u32);
                n += 1;
            }
        }
        let replies = self.exchange(&reqs, n)?;
        let (mut read, mut whole, mut seq) = (Vec::with_capacity(groups.len()), true, 0);
        for &(addr, proto, _) in groups {
            let keyed = self
                .keyed
                .iter_mut()
                .find(|k| k.group == (addr, proto))
                .expect("checked above");
            keyed.reads += 1;
            let mut theirs = Looked::with_capacity(keyed.theirs.len());
            for &(m, _) in &keyed.theirs {
                match replies.iter().find(|(s, _)| *s == seq) {
                    Some((_, Some((_, now, cgroup)))) if now.inode == m.inode => {
                        theirs.push((*now, *cgroup));
                    }
                    _ => {
                        keyed.keys = None;
                        whole = false;
                    }
                }
                seq += 1;
            }
            read.push(theirs);
        }
        Ok(whole.then_some(read))
    }

    /// Sends `reqs` (`n` requests for single sockets, numbered from 0) and reads the `n`
    /// answers, each with its number: the socket, or `None` for an error (none there). The
    /// kernel answers within the send, so nothing is waited for; an answer it could not queue
    /// is missing.
    fn exchange(&self, reqs: &[u8], n: usize) -> io::Result<Vec<(u32, Option<Entry>)>> {
        self.nl.send(reqs)?;
        let mut replies = Vec::with_capacity(n);
        let mut buf = vec![0u8; 8 << 10];
        while replies.len() < n {
            let got = match self.nl.recv(&mut buf, MsgFlags::MSG_DONTWAIT) {
                Ok(got) => got,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(e) => return Err(e.into()),
            };
            for m in messages(&buf[..got]) {
                let m = m?;
                let found = (m.ty == SOCK_DIAG_BY_FAMILY).then(|| member(m.payload));
                replies.push((m.seq, found.flatten()));
            }
        }
        Ok(replies)
    }

    /// The sockets bound to exactly `addr` that are members of its group: unconnected UDP
    /// sockets, or TCP listeners.
    pub fn members(&self, addr: SocketAddr, proto: Proto) -> io::Result<Vec<Queue>> {
        let all = self.port(addr.port(), addr.is_ipv6(), proto)?;
        Ok(all
            .into_iter()
            .filter(|e| e.0 == addr.ip())
            .map(|e| e.1)
            .collect())
    }

    /// The members of every group on `port` (of IPv6 addresses if `v6`), by local address: one
    /// dump serves both listeners.
    pub fn port(&self, port: u16, v6: bool, proto: Proto) -> io::Result<Vec<Entry>> {
        let mut members = Vec::new();
        let each = |m: &super::Message| members.extend(member(m.payload));
        self.nl.dump(&request(port, v6, proto), each)?;
        Ok(members)
    }
}

/// The sockets of `addr`'s group, with a sock_diag socket of their own.
pub fn group_members(addr: SocketAddr, proto: Proto) -> io::Result<Vec<u64>> {
    let members = Diag::open()?.members(addr, proto)?;
    Ok(members.iter().map(|m| m.inode).collect())
}

/// An inet_diag_req_v2 (56 bytes) for `proto` sockets of the family `v6` says, in `states`, with
/// socket id `id` (sport, dport, src, dst, interface, cookie).
fn push_req_v2(m: &mut Vec<u8>, v6: bool, proto: Proto, states: u32, id: &[u8; 48]) {
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET } as u8;
    let protocol = match proto {
        Proto::Udp => libc::IPPROTO_UDP,
        Proto::Tcp => libc::IPPROTO_TCP,
    } as u8;
    m.extend_from_slice(&[family, protocol, 0, 0]);
    m.extend_from_slice(&states.to_ne_bytes());
    m.extend_from_slice(id);
}

/// A dump of `proto`'s members on `port` (the socket id is not a filter in a dump) with a
/// bytecode filter: source port equal to `port`.
fn request(port: u16, v6: bool, proto: Proto) -> Vec<u8> {
    let state = match proto {
        Proto::Udp => TCP_CLOSE,
        Proto::Tcp => TCP_LISTEN,
    };
    let mut m = Vec::with_capacity(16 + 56 + 16);
    push_header(
        &mut m,
        56 + 16,
        SOCK_DIAG_BY_FAMILY,
        NLM_F_REQUEST | NLM_F_DUMP,
        0,
    );
    push_req_v2(&mut m, v6, proto, 1 << state, &[0; 48]);
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

/// A request for the one member of `group` that its SO_REUSEPORT hash picks for a peer on
/// `key` (address 0), without a cookie to match. The kernel reads a UDP request's source as
/// the peer and a TCP request's destination.
fn one_request(m: &mut Vec<u8>, (addr, proto): (SocketAddr, Proto), key: u16, seq: u32) {
    // A v4 address is the first 4 bytes of the 16.
    let mut local = [0u8; 16];
    match addr.ip() {
        IpAddr::V4(ip) => local[..4].copy_from_slice(&ip.octets()),
        IpAddr::V6(ip) => local = ip.octets(),
    }
    let (peer, port) = ([0u8; 16], addr.port());
    let (sport, dport, src, dst) = match proto {
        Proto::Tcp => (port, key, local, peer),
        Proto::Udp => (key, port, peer, local),
    };
    let mut id = [0u8; 48];
    id[..2].copy_from_slice(&sport.to_be_bytes());
    id[2..4].copy_from_slice(&dport.to_be_bytes());
    id[4..20].copy_from_slice(&src);
    id[20..36].copy_from_slice(&dst);
    id[40..].copy_from_slice(&[0xff; 8]);
    push_header(m, 56, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq);
    push_req_v2(m, addr.is_ipv6(), proto, u32::MAX, &id);
}

/// An inet_diag_msg and its attributes: its local address, the member it names if it is
/// unconnected, and its cgroup. (A dump's filter and a request by key give only the port
/// asked.)
fn member(msg: &[u8]) -> Option<Entry> {
    if msg.len() < 72 || msg[6..8] != [0, 0] {
        return None;
    }
    let u32_at = |at: usize| u32::from_ne_bytes(msg[at..at + 4].try_into().expect("4"));
    let ip = if msg[0] == libc::AF_INET6 as u8 {
        IpAddr::from(<[u8; 16]>::try_from(&msg[8..24]).expect("16"))
    } else {
        IpAddr::from(<[u8; 4]>::try_from(&msg[8..12]).expect("4"))
    };
    let m = Queue {
        inode: u64::from(u32_at(68)),
        queued: u32_at(56),
    };
    let cgroup = attributes(&msg[72..])
        .find(|(ty, data)| *ty == INET_DIAG_CGROUP_ID && data.len() >= 8)
        .map_or(0, |(_, d)| {
            u64::from_ne_bytes(d[..8].try_into().expect("8"))
        });
    Some((ip, m, cgroup))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_the_kernel_layout() {
        let r = request(53, false, Proto::Tcp);
        assert_eq!(r.len(), 88);
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 88);
        assert_eq!(r[16..18], [libc::AF_INET as u8, 6]);
        assert_eq!(u32::from_ne_bytes(r[20..24].try_into().unwrap()), 1 << 10);
        assert_eq!(i32::from_ne_bytes(r[84..88].try_into().unwrap()), 53);
    }

    use socket2::{Domain, Socket, Type};
    use std::os::fd::AsFd;

    /// A socket of `ty` with SO_REUSEPORT, bound to `addr`.
    fn shared(ty: Type, addr: SocketAddr) -> Socket {
        let s = Socket::new(Domain::IPV4, ty, None).unwrap();
        s.set_reuse_port(true).unwrap();
        s.bind(&addr.into()).unwrap();
        s
    }

    fn inode(s: &Socket) -> u64 {
        nix::sys::stat::fstat(s.as_fd()).unwrap().st_ino
    }

    /// Reads by key see what a dump sees: the members, what waits in them (UDP and TCP), and a
    /// member that leaves, at once.
    #[test]
    fn reads_by_key_see_what_a_dump_sees() {
        let ours = shared(Type::DGRAM, "127.0.0.1:0".parse().unwrap());
        let addr = ours.local_addr().unwrap().as_socket().unwrap();
        let mut theirs: Vec<Socket> = (0..4).map(|_| shared(Type::DGRAM, addr)).collect();
        let ours_tcp = shared(Type::STREAM, addr);
        ours_tcp.listen(8).unwrap();
        let tcp: Vec<Socket> = (0..2).map(|_| shared(Type::STREAM, addr)).collect();
        tcp.iter().for_each(|l| l.listen(8).unwrap());
        let groups = [
            (addr, Proto::Udp, inode(&ours)),
            (addr, Proto::Tcp, inode(&ours_tcp)),
        ];
        let sorted = |read: &[Looked]| -> Vec<Vec<(u64, u32)>> {
            read.iter()
                .map(|l| {
                    let mut v: Vec<_> = l.iter().map(|(m, _)| (m.inode, m.queued)).collect();
                    v.sort();
                    v
                })
                .collect()
        };
        let mut diag = Diag::open().unwrap();
        let dumped = sorted(&diag.theirs(&groups, true).unwrap());
        let mut want: Vec<(u64, u32)> = theirs.iter().map(|s| (inode(s), 0)).collect();
        want.sort();
        assert_eq!(dumped[0], want);
        assert_eq!(dumped[1].len(), 2);
        assert_eq!(sorted(&diag.theirs(&groups, false).unwrap()), dumped);
        assert_eq!(diag.keyed[0].reads, 1, "read by key, not dumped");
        // A client's flow and a connection each go to one member, ours among them: eight all go
        // to ours once in 390,625 (UDP) and 6,561 (TCP) runs.
        for _ in 0..8 {
            let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            client.send_to(b"twelve bytes", addr).unwrap();
        }
        let _c: Vec<_> = (0..8)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let by_key = sorted(&diag.theirs(&groups, false).unwrap());
        assert_eq!(diag.keyed[0].reads, 2);
        assert_eq!(by_key, sorted(&diag.theirs(&groups, true).unwrap()));
        assert!(
            by_key[0].iter().map(|m| m.1).sum::<u32>() >= 12,
            "{by_key:?}"
        );
        assert!(
            by_key[1].iter().map(|m| m.1).sum::<u32>() >= 1,
            "{by_key:?}"
        );
        diag.theirs(&groups, false).unwrap();
        assert_eq!(diag.keyed[0].reads, 1);
        let gone = inode(&theirs.remove(1));
        let after = sorted(&diag.theirs(&groups, false).unwrap());
        assert_eq!(
            diag.keyed[0].reads, 0,
            "dumped when a port picked another socket"
        );
        assert!(!after[0].iter().any(|m| m.0 == gone));
        assert_eq!(after[0].len(), 3);
        diag.theirs(&groups, false).unwrap();
        assert_eq!(diag.keyed[0].reads, 1, "the members left found new ports");
        for _ in 1..DUMP_EVERY {
            diag.theirs(&groups, false).unwrap();
        }
        assert_eq!(diag.keyed[0].reads, DUMP_EVERY);
        diag.theirs(&groups, false).unwrap();
        assert_eq!(diag.keyed[0].reads, 0, "dumped every DUMP_EVERY reads");
    }

    /// On loopback, in whatever namespace the test runs: members of a shared port, what waits in
    /// a UDP socket nobody reads and in a TCP listener nobody accepts on, and nobody else.
    #[test]
    fn members_and_their_queues_as_the_kernel_sees_them() {
        let a = shared(Type::DGRAM, "127.0.0.1:0".parse().unwrap());
        let addr = a.local_addr().unwrap().as_socket().unwrap();
        let b = shared(Type::DGRAM, addr);
        let diag = Diag::open().unwrap();
        let inodes = |m: Vec<Queue>| {
            let mut v: Vec<u64> = m.iter().map(|m| m.inode).collect();
            v.sort();
            v
        };
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
