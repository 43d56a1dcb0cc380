//! The UDP relay as a state machine under fuzz: client datagrams, upstream replies (honest,
//! mangled, forged) and the passing of time, in any order, through `forward::UdpRelay` (which owns
//! no socket and no clock, so the fuzzer can drive all of it).
//!
//! What must hold whatever the order:
//! - every client packet that is not dropped gets exactly one reply, within the query deadline
//!   (checked by running the clock 10 s past the last event), and nothing stays in flight;
//! - a reply to a client carries its ID and its own spelling of the question, and is never larger
//!   than the client advertised (512 bytes without EDNS): no amplification;
//! - what goes upstream is a client's query unchanged but for the ID, to an upstream of the
//!   right group, through a socket of the right address family; never a response;
//! - a reply from the wrong address or port, or through the wrong socket, produces nothing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use localdns_fallback::cache::{Cache, Limits};
use localdns_fallback::cli::Config;
use localdns_fallback::forward::{Dest, Groups, Listener, UdpRelay};
use localdns_fallback::metrics::Metrics;
use localdns_fallback::upstream::Upstreams;
use localdns_fallback::wire;

use crate::{Input, NAMES, build_query, shape_reply, upstream_addr};

/// Upstream sockets per family in the rig: enough to make "wrong socket" a real case.
const V4_SOCKETS: usize = 2;

struct ClientQuery {
    packet: Vec<u8>,
    parsed: Option<wire::Query>,
    expects_reply: bool,
    replies: usize,
}

struct UpstreamSend {
    socket: usize,
    to: SocketAddr,
    bytes: Vec<u8>,
}

pub struct Rig {
    relay: UdpRelay,
    t0: Instant,
    now_ms: u64,
    v6_sockets: usize,
    max_inflight: usize,
    node: Vec<SocketAddr>,
    cluster: Vec<SocketAddr>,
    clients: HashMap<SocketAddr, ClientQuery>,
    next_port: u16,
    sends: Vec<UpstreamSend>,
}

fn v6_upstream(k: u16) -> SocketAddr {
    SocketAddr::from((std::net::Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, k), 53))
}

impl Rig {
    pub fn new(input: &mut Input) -> Rig {
        let flags = input.u8();
        // Small caps so shedding and eviction happen within a short input.
        let config = Config {
            max_inflight: 1 + usize::from(input.u8() % 16),
            ..Config::default()
        };
        let cache = match flags & 3 {
            0 => None,
            1 => Cache::new(config.cache),
            _ => Cache::new(Limits {
                entries: 1 + usize::from(input.u8() % 8),
                bytes: 256 + usize::from(input.u16() % 8192),
                ..config.cache
            }),
        };
        let listener = if flags & 4 == 0 {
            Listener::Node
        } else {
            Listener::Cluster
        };
        let v6_sockets = usize::from(flags & 8 != 0);
        let node = vec![upstream_addr(1)];
        let cluster = match (flags >> 4) & 3 {
            0 => vec![upstream_addr(2), upstream_addr(3)],
            1 => vec![upstream_addr(2), v6_upstream(2)],
            2 => vec![v6_upstream(2)],
            _ => vec![],
        };
        let groups = Arc::new(Groups {
            node: Arc::new(Upstreams::new(node.clone())),
            cluster: Arc::new(Upstreams::new(cluster.clone())),
        });
        let relay = UdpRelay::new(
            listener,
            &config,
            groups,
            cache.map(|c| Arc::new(Mutex::new(c))),
            Metrics::new(),
            (V4_SOCKETS, v6_sockets),
        );
        Rig {
            relay,
            t0: Instant::now(),
            now_ms: 0,
            v6_sockets,
            max_inflight: config.max_inflight,
            node,
            cluster,
            clients: HashMap::new(),
            next_port: 1,
            sends: Vec::new(),
        }
    }

    fn now(&self) -> Instant {
        self.t0 + Duration::from_millis(self.now_ms)
    }

    /// Checks and records everything the relay asked to send during one call.
    fn absorb(&mut self, out: Vec<(Dest, Vec<u8>)>) {
        for (dest, bytes) in out {
            match dest {
                Dest::Client(addr) => self.check_client_reply(addr, &bytes),
                Dest::Upstream { socket, to } => self.check_upstream_send(socket, to, bytes),
            }
        }
    }

    fn check_client_reply(&mut self, addr: SocketAddr, bytes: &[u8]) {
        let c = self
            .clients
            .get_mut(&addr)
            .unwrap_or_else(|| panic!("a reply to {addr}, which never asked"));
        c.replies += 1;
        assert_eq!(c.replies, 1, "one reply per query");
        assert!(c.expects_reply, "a dropped packet was answered");
        assert!(bytes.len() >= wire::HEADER_LEN);
        assert!(wire::is_response(bytes), "replies have QR set");
        assert_eq!(wire::id(bytes), wire::id(&c.packet), "the client's own ID");
        if let Some(q) = &c.parsed {
            assert!(
                bytes.len() <= usize::from(q.udp_size),
                "a UDP reply of {} bytes to a client that takes {}",
                bytes.len(),
                q.udp_size
            );
            let qd = u16::from_be_bytes([bytes[4], bytes[5]]);
            if qd == 1 {
                let question = q.question(&c.packet);
                assert_eq!(
                    bytes.get(wire::HEADER_LEN..q.question_end),
                    Some(question),
                    "the client's own spelling of the question"
                );
            }
        }
    }

    fn check_upstream_send(&mut self, socket: usize, to: SocketAddr, bytes: Vec<u8>) {
        assert!(socket < V4_SOCKETS + self.v6_sockets);
        assert_eq!(to.is_ipv4(), socket < V4_SOCKETS, "socket family");
        assert!(
            self.node.contains(&to) || self.cluster.contains(&to),
            "sent to {to}, not an upstream"
        );
        assert!(!wire::is_response(&bytes), "a response was forwarded");
        assert!(
            self.clients
                .values()
                .any(|c| c.packet.len() == bytes.len() && c.packet[2..] == bytes[2..]),
            "what goes upstream is a client's query, unchanged but for the ID"
        );
        self.sends.push(UpstreamSend { socket, to, bytes });
    }

    fn query(&mut self, packet: Vec<u8>) {
        let addr = SocketAddr::from(([10, 1, 0, 1], self.next_port));
        self.next_port = self.next_port.wrapping_add(1).max(1);
        let parsed = wire::parse_query(&packet);
        self.clients.insert(
            addr,
            ClientQuery {
                expects_reply: parsed != Err(wire::Reject::Drop),
                parsed: parsed.ok(),
                packet: packet.clone(),
                replies: 0,
            },
        );
        let mut out = Vec::new();
        let now = self.now();
        self.relay.on_query(&packet, addr, now, &mut |d, b| {
            out.push((d, b.to_vec()));
            Ok(())
        });
        self.absorb(out);
    }

    /// An upstream datagram. `forged` says it cannot be the awaited reply (wrong address or
    /// socket), so nothing may come of it.
    fn reply(&mut self, socket: usize, mut packet: Vec<u8>, from: SocketAddr, forged: bool) {
        // The same (socket, ID, address) may have been used by another try: then it is not forged.
        let forged = forged
            && packet.len() >= 2
            && !self
                .sends
                .iter()
                .any(|s| s.socket == socket && s.to == from && s.bytes[..2] == packet[..2]);
        let mut out = Vec::new();
        let now = self.now();
        self.relay
            .on_reply(socket, &mut packet, from, now, &mut |d, b| {
                out.push((d, b.to_vec()));
                Ok(())
            });
        if forged {
            assert!(
                out.is_empty(),
                "a forged reply produced {} datagrams",
                out.len()
            );
        }
        self.absorb(out);
    }

    fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
        let mut out = Vec::new();
        let now = self.now();
        self.relay.on_timers(now, &mut |d, b| {
            out.push((d, b.to_vec()));
            Ok(())
        });
        self.absorb(out);
    }

    pub fn step(&mut self, input: &mut Input) {
        let sockets = V4_SOCKETS + self.v6_sockets;
        match input.u8() % 7 {
            0 => {
                let raw = input.blob().to_vec();
                self.query(raw);
            }
            1 | 2 => {
                let name = NAMES[usize::from(input.u8()) % NAMES.len()];
                let case = input.u32();
                let qtype = match input.u8() % 4 {
                    0 => 1,
                    1 => 28,
                    2 => 16,
                    _ => input.u16(),
                };
                let edns = match input.u8() % 3 {
                    0 => None,
                    _ => Some((input.u16(), input.u8() & 1 == 1)),
                };
                let id = input.u16();
                self.query(build_query(id, name, case, qtype, edns));
            }
            3 | 4 => {
                if self.sends.is_empty() {
                    return;
                }
                let pick = usize::from(input.u16()) % self.sends.len();
                let (socket, to, sent) = {
                    let s = &self.sends[pick];
                    (s.socket, s.to, s.bytes.clone())
                };
                let reply = shape_reply(&sent, input);
                match input.u8() % 8 {
                    // The wrong port of the right address.
                    0 => self.reply(socket, reply, SocketAddr::new(to.ip(), 5353), true),
                    // Through another socket.
                    1 if sockets > 1 => {
                        let other =
                            (socket + 1 + usize::from(input.u8()) % (sockets - 1)) % sockets;
                        self.reply(other, reply, to, true)
                    }
                    _ => self.reply(socket, reply, to, false),
                }
            }
            5 => {
                let socket = usize::from(input.u8()) % sockets;
                let from = match input.u8() % 3 {
                    0 => upstream_addr(1),
                    1 => upstream_addr(2),
                    _ => v6_upstream(2),
                };
                let raw = input.blob().to_vec();
                self.reply(socket, raw, from, false);
            }
            _ => self.advance(u64::from(input.u16() % 3000)),
        }
        assert!(self.relay.inflight() <= self.max_inflight);
    }

    /// Runs the clock past every deadline: each query that deserved a reply has had exactly one,
    /// and nothing is left in flight.
    pub fn finish(mut self) {
        for _ in 0..20 {
            self.advance(500);
        }
        assert_eq!(self.relay.inflight(), 0, "queries left in flight");
        for (addr, c) in &self.clients {
            assert_eq!(
                c.replies,
                usize::from(c.expects_reply),
                "client {addr} sent {:02x?}",
                c.packet
            );
        }
    }
}
