//! The engine driven with plain bytes and instants. Every behaviour is checked for a UDP client
//! and for a TCP client, since one engine decides for both. The rig and the packet builders are
//! here; the tests are in `relaying`, `tries` and `caching`.

mod caching;
mod histories;
mod relaying;
mod tries;

use super::*;
use super::{HEDGE_BURST, HEDGE_COST};
use crate::rig::{self, Setup};
use std::io;
use std::ops::{Deref, DerefMut};

const UDP_CLIENT: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::new(10, 1, 1, 1),
    40000,
));
const TCP_CLIENT: ConnId = 7;

const BOTH: [Transport; 2] = [Transport::Udp, Transport::Tcp];

fn up(last: u8) -> SocketAddr {
    SocketAddr::from(([198, 18, 0, last], 53))
}

fn query(id: u16, name: &str, edns: Option<u16>) -> Vec<u8> {
    let mut p = id.to_be_bytes().to_vec();
    p.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, u8::from(edns.is_some())]);
    p.extend_from_slice(&wire::encode_name(name).unwrap());
    // keep the caller's case: encode_name lowercases, so patch the letters back
    let mut at = 12;
    for label in name.split('.') {
        p[at + 1..at + 1 + label.len()].copy_from_slice(label.as_bytes());
        at += 1 + label.len();
    }
    p.extend_from_slice(&[0, 1, 0, 1]);
    if let Some(size) = edns {
        p.extend_from_slice(&[0, 0, 41]);
        p.extend_from_slice(&size.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    }
    p
}

/// An upstream's reply to `sent`: QR set, an RR of `extra` bytes of padding appended.
fn reply(sent: &[u8], lowercase: bool, extra: usize) -> Vec<u8> {
    let mut r = sent.to_vec();
    r[2] |= 0x80;
    if lowercase {
        r[12..].make_ascii_lowercase();
    }
    if extra > 0 {
        r[7] = 1;
        r.extend_from_slice(&[0xc0, 12, 0, 16, 0, 1, 0, 0, 0, 60]);
        r.extend_from_slice(&(extra as u16).to_be_bytes());
        r.extend(std::iter::repeat_n(b'x', extra));
    }
    r
}

/// A reply to `sent` carrying one A record with this TTL.
fn answer(sent: &[u8], ttl: u32) -> Vec<u8> {
    let mut r = sent.to_vec();
    r[2] |= 0x80;
    r[7] = 1;
    r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
    r.extend_from_slice(&ttl.to_be_bytes());
    r.extend_from_slice(&[0, 4, 10, 0, 0, 1]);
    r
}

fn with_rcode(sent: &[u8], code: u8) -> Vec<u8> {
    let mut r = sent.to_vec();
    r[2] |= 0x80;
    r[3] = code;
    r
}

/// The shared rig, playing one client of one transport.
struct Rig {
    rig: rig::Rig,
    /// The transport of the client this rig plays.
    transport: Transport,
}

impl Deref for Rig {
    type Target = rig::Rig;
    fn deref(&self) -> &rig::Rig {
        &self.rig
    }
}

impl DerefMut for Rig {
    fn deref_mut(&mut self) -> &mut rig::Rig {
        &mut self.rig
    }
}

impl Rig {
    fn new(
        transport: Transport,
        role: ListenerRole,
        vnet: Vec<SocketAddr>,
        kube: Vec<SocketAddr>,
    ) -> Rig {
        Rig::with(transport, role, vnet, kube, |_| {})
    }

    fn with(
        transport: Transport,
        role: ListenerRole,
        vnet: Vec<SocketAddr>,
        kube: Vec<SocketAddr>,
        tweak: impl FnOnce(&mut Setup),
    ) -> Rig {
        let mut setup = Setup::new(role, vnet, kube);
        tweak(&mut setup);
        Rig {
            rig: setup.start(Instant::now()),
            transport,
        }
    }

    fn client(&self) -> Client {
        match self.transport {
            Transport::Udp => Client::Udp(UDP_CLIENT),
            Transport::Tcp => Client::Tcp(TCP_CLIENT),
        }
    }

    fn query(&mut self, packet: &[u8], ms: u64) -> Outcome {
        let (now, client) = (self.at(ms), self.client());
        self.rig.handle_query(now, client, packet)
    }

    fn reply_at(&mut self, leg: Leg, packet: Vec<u8>, from: SocketAddr, ms: u64) {
        let now = self.at(ms);
        self.rig.handle_reply(now, leg.via, from, &packet);
    }

    fn reply(&mut self, leg: Leg, packet: Vec<u8>) {
        self.reply_at(leg, packet, leg.to, 0);
    }

    fn tick(&mut self, ms: u64) {
        let now = self.at(ms);
        self.rig.handle_timeout(now);
    }

    fn fail(&mut self, leg: Leg, failure: Failure, ms: u64) {
        let now = self.at(ms);
        self.rig.handle_failure(now, leg, failure);
    }

    fn to_client(&self) -> Vec<Vec<u8>> {
        self.sent_to(self.client())
    }
}
