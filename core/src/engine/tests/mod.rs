//! The engine driven with plain bytes and instants. Every behaviour is checked for a UDP client
//! and for a TCP client, since one engine decides for both. The rig and the packet builders are
//! here; the tests are in `relaying`, `tries` and `caching`.

mod caching;
mod relaying;
mod tries;

use super::*;
use super::{HEDGE_BURST, HEDGE_COST};
use crate::cache::{KeyHasher, Limits};
use crate::stats::ListenerStats;
use std::io;
use std::time::Duration;

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

struct Rig {
    engine: Engine,
    sent: Vec<(Dest, Vec<u8>)>,
    events: Vec<Event>,
    t0: Instant,
    /// The transport of the client this rig plays.
    transport: Transport,
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
        tweak: impl FnOnce(&mut Settings),
    ) -> Rig {
        let mut settings = Settings {
            udp_sockets_per_upstream: 2,
            ..Settings::default()
        };
        tweak(&mut settings);
        let cache =
            Cache::new(Limits::default(), KeyHasher::new(7)).map(|c| Arc::new(Mutex::new(c)));
        let sets = Arc::new(UpstreamSets::uncounted(vnet, kube, Instant::now()));
        Rig {
            engine: Engine::new(
                role,
                settings,
                sets,
                cache,
                Arc::new(ListenerStats::default()),
                [7; 32],
            ),
            sent: Vec::new(),
            events: Vec::new(),
            t0: Instant::now(),
            transport,
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn client(&self) -> Client {
        match self.transport {
            Transport::Udp => Client::Udp(UDP_CLIENT),
            Transport::Tcp => Client::Tcp(TCP_CLIENT),
        }
    }

    fn drain(&mut self) {
        while let Some(t) = self.engine.poll_transmit() {
            self.sent.push((t.dest, t.bytes.to_vec()));
        }
        while let Some(e) = self.engine.poll_event() {
            self.events.push(e);
        }
    }

    fn query(&mut self, packet: &[u8], ms: u64) -> Outcome {
        let (now, client) = (self.at(ms), self.client());
        let outcome = self.engine.handle_query(now, client, packet);
        self.drain();
        outcome
    }

    fn reply_at(&mut self, leg: Leg, packet: Vec<u8>, from: SocketAddr, ms: u64) {
        let now = self.at(ms);
        self.engine.handle_reply(now, leg.via, from, &packet);
        self.drain();
    }

    fn reply(&mut self, leg: Leg, packet: Vec<u8>) {
        self.reply_at(leg, packet, leg.to, 0);
    }

    fn tick(&mut self, ms: u64) {
        let now = self.at(ms);
        self.engine.handle_timeout(now);
        self.drain();
    }

    fn fail(&mut self, leg: Leg, failure: Failure, ms: u64) {
        let now = self.at(ms);
        self.engine.handle_failure(now, leg, failure);
        self.drain();
    }

    /// The last upstream send: its leg and bytes.
    fn last_upstream(&self) -> (Leg, Vec<u8>) {
        self.sent
            .iter()
            .rev()
            .find_map(|(d, b)| match d {
                Dest::Upstream(leg) => Some((*leg, b.clone())),
                _ => None,
            })
            .expect("something was sent upstream")
    }

    fn upstream_sends(&self) -> usize {
        self.sent
            .iter()
            .filter(|(d, _)| matches!(d, Dest::Upstream(_)))
            .count()
    }

    fn to_client(&self) -> Vec<Vec<u8>> {
        let me = Dest::Client(self.client());
        self.sent
            .iter()
            .filter(|(d, _)| *d == me)
            .map(|(_, b)| b.clone())
            .collect()
    }
}
