//! Steering flows within a port's SO_REUSEPORT group: a classic BPF program on the group picks
//! our socket while we serve, any other member once we hand over, and is detached before we
//! close. Our index in the group is followed by inode through sock_diag as members come and go.

use std::io;
use std::net::SocketAddr;

use crate::netlink::{Diag, Looked, Proto};
use nix::errno::Errno;
use nix::libc::{
    self, BPF_A, BPF_ABS, BPF_ADD, BPF_ALU, BPF_B, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_K, BPF_LD,
    BPF_LEN, BPF_MOD, BPF_RET, BPF_W, SKF_AD_OFF,
};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// One listener's place in the SO_REUSEPORT groups of its address (UDP and TCP have a group
/// each) and a descriptor of each of its sockets, kept past the serving loops' own for the
/// hand-over (see `handoff`): the steering is re-pointed as members come and go and when the flows
/// move, and, if we could not hand over, detached right before the sockets close, which is when
/// this is dropped (the serving loops' own descriptors are closed by then). A port that is not
/// shared (port 0, tests) has nothing to steer.
pub struct Held {
    pub addr: SocketAddr,
    pub udp: Place,
    pub tcp: Place,
    udp_fd: OwnedFd,
    tcp_fd: OwnedFd,
}

impl Held {
    /// Keeps our places with descriptors of the two sockets of their own.
    pub fn new(
        addr: SocketAddr,
        (udp, tcp): (Place, Place),
        udp_fd: BorrowedFd<'_>,
        tcp_fd: BorrowedFd<'_>,
    ) -> io::Result<Held> {
        Ok(Held {
            addr,
            udp,
            tcp,
            udp_fd: udp_fd.try_clone_to_owned()?,
            tcp_fd: tcp_fd.try_clone_to_owned()?,
        })
    }

    /// Reads every group of `held` afresh (one sock_diag dump per port and protocol, however
    /// many listeners) and moves our places as members came and went. Without sock_diag they stay
    /// as they were at the bind.
    pub fn read_places(diag: Option<&mut Diag>, held: &mut [Held]) {
        let Some(diag) = diag else { return };
        for proto in [Proto::Udp, Proto::Tcp] {
            let read = match Held::theirs(diag, held, proto, true) {
                Ok(read) => read,
                Err(e) => {
                    return tracing::warn!(error = %e, "cannot read our places in the ports' groups");
                }
            };
            for (h, theirs) in held.iter_mut().zip(read) {
                let place = match proto {
                    Proto::Udp => &mut h.udp,
                    Proto::Tcp => &mut h.tcp,
                };
                let before = place.index();
                place.update(&theirs.iter().map(|(m, _)| m.inode).collect::<Vec<_>>());
                if place.index() != before {
                    tracing::info!(addr = %h.addr, ?proto, index = ?place.index(), "our place in the port's group moved");
                }
            }
        }
    }

    /// New flows to LocalDNS on every listener (none skipped when one fails); true if all of
    /// them were handed over. Read the places first.
    pub fn hand_over_all(held: &mut [Held]) -> bool {
        held.iter_mut().fold(true, |all, h| h.stand_aside() & all)
    }

    /// New flows to us again, except LocalDNS's probe questions over UDP, which go on reaching
    /// LocalDNS's own sockets (the standby's loop asks them to learn when to hand back). Read the
    /// places first: members came and went while we stood by. False if the steering could not
    /// be set (we then share flows with the other members).
    pub fn steer_to_us(&mut self) -> bool {
        if self.addr.port() == 0 {
            return true;
        }
        let udp = match self.udp.index() {
            Some(ours) => attach(
                self.udp_fd.as_fd(),
                &program_to_except_probes(ours, self.udp.members()),
            ),
            None => unsteer(self.udp_fd.as_fd()),
        };
        let tcp = match self.tcp.index() {
            Some(ours) => attach(self.tcp_fd.as_fd(), &program_to(ours)),
            None => unsteer(self.tcp_fd.as_fd()),
        };
        match udp.and(tcp) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(addr = %self.addr, error = %e, "cannot take the flows back");
                false
            }
        }
    }

    /// Sends new flows to the other members of each group (LocalDNS, once it is ready) and no
    /// longer to us, to hand over or to stand by, so that what we still have can be answered
    /// before we close; true if both groups have another member to take them. Read the places
    /// right before: a LocalDNS restart (its socket closes, a new one joins) moves us into the
    /// index its closed socket left. Alone in a group, the program points at the next member to
    /// join (the kernel hashes to us until one does). Where our place is no longer known the
    /// program is left as it is.
    pub fn stand_aside(&mut self) -> bool {
        if self.addr.port() == 0 {
            return false;
        }
        let mut handed = true;
        for (place, fd, proto) in [
            (&self.udp, &self.udp_fd, Proto::Udp),
            (&self.tcp, &self.tcp_fd, Proto::Tcp),
        ] {
            let members = place.members();
            handed &= members > 1 && place.index().is_some();
            let steered = match place.index() {
                Some(ours) => attach(
                    fd.as_fd(),
                    &program_away(ours, members.max(ours + 1).max(2)),
                ),
                None => Err(io::Error::other(
                    "our place in the port's group is no longer known; steering left as it is",
                )),
            };
            if let Err(e) = steered {
                tracing::warn!(addr = %self.addr, ?proto, error = %e, "cannot point the flows away from us");
                handed = false;
            }
        }
        handed
    }

    /// LocalDNS's sockets in the `proto` groups of every listener in `held` (each member but
    /// ours), with what waits in them and their cgroup, and whether it has one in each group.
    /// Dumped when `dump` (see [`Diag::theirs`]).
    pub fn look(
        diag: &mut Diag,
        held: &[Held],
        proto: Proto,
        dump: bool,
    ) -> io::Result<(Looked, bool)> {
        let read = Held::theirs(diag, held, proto, dump)?;
        let complete = read.iter().all(|theirs| !theirs.is_empty());
        Ok((read.concat(), complete))
    }

    /// The members but ours of the `proto` group of each listener in `held`, in its order.
    fn theirs(diag: &mut Diag, held: &[Held], proto: Proto, dump: bool) -> io::Result<Vec<Looked>> {
        let ours = |h: &Held| match proto {
            Proto::Udp => h.udp.ours,
            Proto::Tcp => h.tcp.ours,
        };
        let groups: Vec<_> = held.iter().map(|h| (h.addr, proto, ours(h))).collect();
        diag.theirs(&groups, dump)
    }

    /// Detaches the steering programs (plain SO_REUSEPORT sharing again) right before our
    /// sockets close (the program belongs to the group and would outlive us, picking whichever
    /// socket then holds our index); they close when this returns, if nothing else holds them.
    pub fn release(self) {
        if let Err(e) = unsteer(self.udp_fd.as_fd()).and(unsteer(self.tcp_fd.as_fd())) {
            tracing::warn!(addr = %self.addr, error = %e, "cannot detach the steering program");
        }
    }
}

/// Where one of our sockets sits in its SO_REUSEPORT group. The kernel numbers members in the
/// order they joined and, when one leaves, moves the last member into the freed index; following
/// the members by inode tells where that puts us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// Our socket's inode, as sock_diag names it.
    ours: u64,
    /// Members with a lower index than ours (their order among themselves is not known).
    below: std::collections::BTreeSet<u64>,
    /// Members with a higher index, in index order.
    above: Vec<u64>,
    /// False once a member below us left while we were the last: we took its index, which is
    /// somewhere among theirs.
    known: bool,
}

impl Place {
    /// We just joined a group whose other members are `before`.
    pub fn joined(ours: u64, before: &[u64]) -> Place {
        Place {
            ours,
            below: before.iter().copied().filter(|&m| m != ours).collect(),
            above: Vec::new(),
            known: true,
        }
    }

    /// Our socket in a group whose members could not be listed: no index to steer by.
    pub fn unknown(ours: u64) -> Place {
        Place {
            known: false,
            ..Place::joined(ours, &[])
        }
    }

    pub fn index(&self) -> Option<u32> {
        self.known.then_some(self.below.len() as u32)
    }

    /// Members of the group, ours among them, as far as they are known.
    pub fn members(&self) -> u32 {
        (self.below.len() + self.above.len() + 1) as u32
    }

    /// Takes the members present now (ours among them or not).
    pub fn update(&mut self, now: &[u64]) {
        let present = |m: &u64| now.contains(m);
        let gone: Vec<u64> = self
            .below
            .iter()
            .chain(&self.above)
            .copied()
            .filter(|m| !present(m))
            .collect();
        for m in gone {
            if let Some(at) = self.above.iter().position(|&a| a == m) {
                // The last member (above us) fills the freed index.
                let last = self.above.pop().expect("holds m");
                if last != m {
                    self.above[at] = last;
                }
            } else {
                self.below.remove(&m);
                match self.above.pop() {
                    // The last member moves below us.
                    Some(last) => {
                        self.below.insert(last);
                    }
                    // We were the last: we move into the freed index.
                    None => self.known &= self.below.is_empty(),
                }
            }
        }
        for &m in now {
            if m != self.ours && !self.below.contains(&m) && !self.above.contains(&m) {
                self.above.push(m);
            }
        }
        if self.below.is_empty() {
            // Nobody below us: index 0, whatever happened before.
            self.known = true;
        }
    }
}

/// Classic BPF opcodes (linux/filter.h) and the ancillary offset of a random number.
const BPF_LD_W_ABS: u16 = (BPF_LD | BPF_W | BPF_ABS) as u16;
const BPF_ALU_MOD_K: u16 = (BPF_ALU | BPF_MOD | BPF_K) as u16;
const BPF_ALU_ADD_K: u16 = (BPF_ALU | BPF_ADD | BPF_K) as u16;
const BPF_JMP_JGE_K: u16 = (BPF_JMP | BPF_JGE | BPF_K) as u16;
const BPF_RET_K: u16 = (BPF_RET | BPF_K) as u16;
const BPF_RET_A: u16 = (BPF_RET | BPF_A) as u16;
const SKF_AD_RANDOM: u32 = (SKF_AD_OFF + libc::SKF_AD_RANDOM) as u32;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// A program that puts every flow on the member at `slot`.
fn program_to(slot: u32) -> Vec<libc::sock_filter> {
    vec![insn(BPF_RET_K, 0, 0, slot)]
}

/// A program that spreads flows at random over the `members` of a group except the one at `ours`.
fn program_away(ours: u32, members: u32) -> Vec<libc::sock_filter> {
    debug_assert!(members > 1 && ours < members);
    vec![
        insn(BPF_LD_W_ABS, 0, 0, SKF_AD_RANDOM), // A = a random number
        insn(BPF_ALU_MOD_K, 0, 0, members - 1),  // A %= members - 1
        insn(BPF_JMP_JGE_K, 0, 1, ours),         // A >= ours ?
        insn(BPF_ALU_ADD_K, 0, 0, 1),            //   then A += 1 (skip ours)
        insn(BPF_RET_A, 0, 0, 0),
    ]
}

/// LocalDNS's probe name as the question of a query: the DNS header (12 bytes) and then the name
/// in lower-case wire form, as LocalDNS's own probe and ours send it.
const PROBE_QUESTION_END: u32 = 12 + crate::engine::route::HEALTH_CHECK.len() as u32;
const BPF_LD_W_LEN: u16 = (BPF_LD | BPF_W | BPF_LEN) as u16;
const BPF_LD_B_ABS: u16 = (BPF_LD | BPF_B | BPF_ABS) as u16;
const BPF_JMP_JEQ_K: u16 = (BPF_JMP | BPF_JEQ | BPF_K) as u16;

/// A program that puts every flow on the member at `ours`, except queries for LocalDNS's probe
/// name, which go to any other member (a UDP program sees the datagram's payload from offset 0).
/// With no other member they come to us too; the relay drops our own probes then.
fn program_to_except_probes(ours: u32, members: u32) -> Vec<libc::sock_filter> {
    let name = crate::engine::route::HEALTH_CHECK;
    // Each check jumps to the last instruction (`ret ours`) on a mismatch; jf is filled in below.
    let mut p = vec![
        insn(BPF_LD_W_LEN, 0, 0, 0),
        insn(BPF_JMP_JGE_K, 0, 0, PROBE_QUESTION_END),
    ];
    let mut at = 0;
    while at + 4 <= name.len() {
        let word = u32::from_be_bytes(name[at..at + 4].try_into().expect("4 bytes"));
        p.push(insn(BPF_LD_W_ABS, 0, 0, 12 + at as u32));
        p.push(insn(BPF_JMP_JEQ_K, 0, 0, word));
        at += 4;
    }
    for (i, &byte) in name[at..].iter().enumerate() {
        p.push(insn(BPF_LD_B_ABS, 0, 0, 12 + (at + i) as u32));
        p.push(insn(BPF_JMP_JEQ_K, 0, 0, u32::from(byte)));
    }
    let checks = p.len();
    if members > 1 && ours < members {
        p.extend(program_away(ours, members));
    } else {
        p.push(insn(BPF_RET_K, 0, 0, ours));
    }
    p.push(insn(BPF_RET_K, 0, 0, ours));
    let last = p.len() - 1;
    for (i, ins) in p[..checks].iter_mut().enumerate() {
        if ins.code == BPF_JMP_JEQ_K || ins.code == BPF_JMP_JGE_K {
            ins.jf = u8::try_from(last - i - 1).expect("a short program");
        }
    }
    p
}

/// What the kernel runs for an index (a slot past the last member means: hash as usual). For
/// the unit tests: the same arithmetic as [`program_away`] with `random` for the random number.
#[cfg(test)]
fn away_pick(ours: u32, members: u32, random: u32) -> u32 {
    let a = random % (members - 1);
    if a >= ours { a + 1 } else { a }
}

fn attach(fd: BorrowedFd<'_>, program: &[libc::sock_filter]) -> io::Result<()> {
    // The kernel copies the program during the call.
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr().cast_mut(),
    };
    Ok(nix::sys::socket::setsockopt(
        &fd,
        nix::sys::socket::sockopt::AttachReusePortCbpf,
        &prog,
    )?)
}

/// Steers `fd`'s group the moment `fd` has joined it at index `ours` (the last one), in the
/// same breath as the bind or listen: a program attached before the bind would be dropped with
/// the group of one the kernel makes for it, so until this call the group's old program (or
/// plain hashing) decides, for a few microseconds. Steering is worth having, not worth failing
/// for: without it we still serve, sharing flows.
pub(super) fn steer_at_join(fd: BorrowedFd<'_>, ours: u32, to_us: bool, addr: SocketAddr) {
    let steered = match to_us {
        true => attach(fd, &program_to(ours)),
        // Alone (`ours` 0), the program picks index 1: nobody until LocalDNS joins (the kernel
        // then hashes, to us), and LocalDNS from the moment it does.
        false => attach(fd, &program_away(ours, (ours + 1).max(2))),
    };
    if let Err(e) = steered {
        tracing::warn!(%addr, to_us, error = %e, "cannot steer flows; sharing them with any other member");
    }
}

/// Removes the steering program from `fd`'s group; a group without one is left as it is.
pub fn unsteer(fd: BorrowedFd<'_>) -> io::Result<()> {
    let zero: libc::c_int = 0;
    // SAFETY: a plain setsockopt with an int the kernel ignores.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_DETACH_REUSEPORT_BPF,
            (&zero as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match Errno::result(rc) {
        Ok(_) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_members_that_come_and_go() {
        // Alone: index 0; a LocalDNS joins above us; it leaves again.
        let mut s = Place::joined(9, &[]);
        s.update(&[9, 20]);
        assert_eq!((s.index(), s.above.clone()), (Some(0), vec![20]));
        s.update(&[9]);
        assert_eq!(s.index(), Some(0));
        // An orphan (1) was there first; a starting LocalDNS (20) joins after us.
        let mut s = Place::joined(9, &[1]);
        s.update(&[1, 9, 20]);
        assert_eq!(s.index(), Some(1));
        // The orphan exits: the last member (20) fills index 0, we stay at 1.
        s.update(&[9, 20]);
        assert_eq!((s.index(), s.below.len()), (Some(1), 1));
        // An orphan exits while we are the last member: we take its index, 0.
        let mut s = Place::joined(9, &[1]);
        s.update(&[9]);
        assert_eq!(s.index(), Some(0));
        s.update(&[9, 30]);
        assert_eq!(s.index(), Some(0), "a new member goes above us");
        // Two below us, one leaves while we are last: our index is one of theirs, not known.
        let mut s = Place::joined(9, &[1, 2]);
        s.update(&[2, 9]);
        assert_eq!(s.index(), None);
        // Once nobody is below us it is 0 again.
        s.update(&[9]);
        assert_eq!(s.index(), Some(0));
        // A member above us that is not the last leaves: the last takes its place.
        let mut s = Place::joined(9, &[]);
        s.update(&[9, 20, 21, 22]);
        s.update(&[9, 20, 22]);
        assert_eq!((s.index(), s.above.clone()), (Some(0), vec![20, 22]));
    }

    /// The classic BPF the programs above use, run as the kernel runs a reuseport program over a
    /// UDP payload; a load past the end ends the program with 0, as the kernel's does.
    fn run(program: &[libc::sock_filter], packet: &[u8], random: u32) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = program[pc];
            pc += 1;
            match i.code {
                BPF_LD_W_LEN => a = packet.len() as u32,
                BPF_LD_W_ABS if i.k == SKF_AD_RANDOM => a = random,
                BPF_LD_W_ABS => match packet.get(i.k as usize..i.k as usize + 4) {
                    Some(w) => a = u32::from_be_bytes(w.try_into().unwrap()),
                    None => return 0,
                },
                BPF_LD_B_ABS => match packet.get(i.k as usize) {
                    Some(&b) => a = u32::from(b),
                    None => return 0,
                },
                BPF_ALU_MOD_K => a %= i.k,
                BPF_ALU_ADD_K => a += i.k,
                BPF_JMP_JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                BPF_JMP_JGE_K => pc += usize::from(if a >= i.k { i.jt } else { i.jf }),
                BPF_RET_K => return i.k,
                BPF_RET_A => return a,
                code => panic!("opcode {code:#x} not modelled"),
            }
        }
    }

    fn query(name: &[&str]) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        q
    }

    #[test]
    fn only_localdns_probe_questions_leave_our_socket_while_we_serve() {
        let probe = query(&["health-check", "localdns", "local"]);
        let others = [
            query(&["health-check", "localdns", "locals"]),
            query(&["Health-check", "localdns", "local"]),
            query(&["kubernetes", "default", "svc", "cluster", "local"]),
            probe[..40].to_vec(),
            vec![1, 2, 3],
            Vec::new(),
        ];
        for (ours, members) in [(0, 2), (1, 2), (2, 3), (0, 4)] {
            let program = program_to_except_probes(ours, members);
            for random in [0, 1, 2, 7, u32::MAX] {
                let pick = run(&program, &probe, random);
                assert!(
                    pick != ours && pick < members,
                    "probe to {pick} (ours {ours} of {members})"
                );
                for other in &others {
                    assert_eq!(run(&program, other, random), ours, "{other:?}");
                }
            }
        }
        // Alone in the group: everything is ours (the relay drops our own probes).
        let alone = program_to_except_probes(0, 1);
        assert_eq!(run(&alone, &probe, 5), 0);
        assert_eq!(run(&alone, &others[2], 5), 0);
    }

    #[test]
    fn the_away_program_never_picks_our_slot_and_reaches_every_other() {
        for members in 2..6u32 {
            for ours in 0..members {
                let picked: std::collections::BTreeSet<u32> =
                    (0..64).map(|r| away_pick(ours, members, r)).collect();
                let others: std::collections::BTreeSet<u32> =
                    (0..members).filter(|&m| m != ours).collect();
                assert_eq!(picked, others, "ours {ours} of {members}");
            }
        }
        let p = program_away(1, 3);
        assert_eq!((p[0].code, p[0].k), (BPF_LD_W_ABS, 0xFFFF_F038));
        assert_eq!((p[1].k, p[2].k, p[2].jf), (2, 1, 1));
        assert_eq!(program_to(3)[0].k, 3);
    }
}
