//! The engine as a state machine under fuzz: client queries over UDP and TCP, upstream replies
//! (honest, mangled, forged), send failures and the passing of time, in any order, through
//! `engine::Engine` (which owns no socket and no clock, so the fuzzer can drive all of it).
//!
//! What must hold whatever the order:
//! - every client packet that is not dropped gets exactly one reply, within the query deadline
//!   (checked by running the clock 10 s past the last event), and nothing stays in flight;
//! - a reply to a client carries its ID and its own spelling of the question, and is never larger
//!   than the client may take (its EDNS size, 512 bytes without EDNS, over UDP): no amplification;
//! - what goes upstream is a client's query unchanged but for the ID, to an upstream of the
//!   right group, over the client's own transport (or TCP after a truncated UDP answer);
//!   never a response;
//! - a reply from the wrong address or port, or through the wrong socket, produces nothing.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use localdns_fallback::cache::Limits;
use localdns_fallback::engine::{Client, Dest, Failure, Leg, Via};
use localdns_fallback::roles::ListenerRole;
use localdns_fallback::wire;
use localdns_fallback_core::rig::{self, SOCKETS, Setup};

use crate::{Input, NAMES, build_query, shape_reply, upstream_addr};

struct ClientQuery {
    packet: Vec<u8>,
    parsed: Option<wire::Query>,
    expects_reply: bool,
    replies: usize,
}

pub struct Rig {
    rig: rig::Rig,
    max_inflight: usize,
    node: Vec<SocketAddr>,
    cluster: Vec<SocketAddr>,
    clients: HashMap<Client, ClientQuery>,
    next_client: u16,
    sends: Vec<(Leg, Vec<u8>)>,
}

fn v6_upstream(k: u16) -> SocketAddr {
    SocketAddr::from((std::net::Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, k), 53))
}

impl Rig {
    pub fn new(input: &mut Input) -> Rig {
        let flags = input.u8();
        // Small caps so shedding and eviction happen within a short input.
        let max_inflight = 1 + usize::from(input.u8() % 16);
        let defaults = Limits::default();
        let cache = match flags & 3 {
            0 => None,
            1 => Some(defaults),
            _ => Some(Limits {
                entries: 1 + usize::from(input.u8() % 8),
                bytes: 256 + usize::from(input.u16() % 8192),
                ..defaults
            }),
        };
        let role = if flags & 4 == 0 {
            ListenerRole::Node
        } else {
            ListenerRole::Cluster
        };
        let node = vec![upstream_addr(1)];
        let cluster = match (flags >> 4) & 3 {
            0 => vec![upstream_addr(2), upstream_addr(3)],
            1 => vec![upstream_addr(2), v6_upstream(2)],
            2 => vec![v6_upstream(2)],
            _ => vec![],
        };
        let mut setup = Setup::new(role, node.clone(), cluster.clone());
        setup.settings.max_inflight = max_inflight;
        setup.cache = cache;
        setup.seed = [flags; 32];
        Rig {
            rig: setup.start(Instant::now()),
            max_inflight,
            node,
            cluster,
            clients: HashMap::new(),
            next_client: 1,
            sends: Vec::new(),
        }
    }

    /// Checks and records everything the engine asked to send after one input.
    fn absorb(&mut self) -> usize {
        let out = std::mem::take(&mut self.rig.sent);
        self.rig.events.clear();
        let n = out.len();
        for (dest, bytes) in out {
            match dest {
                Dest::Client(client) => self.check_client_reply(client, &bytes),
                Dest::Upstream(leg) => self.check_upstream_send(leg, bytes),
            }
        }
        n
    }

    fn check_client_reply(&mut self, client: Client, bytes: &[u8]) {
        let c = self
            .clients
            .get_mut(&client)
            .unwrap_or_else(|| panic!("a reply to {client:?}, which never asked"));
        c.replies += 1;
        assert_eq!(c.replies, 1, "one reply per query");
        assert!(c.expects_reply, "a dropped packet was answered");
        assert!(bytes.len() >= wire::HEADER_LEN);
        assert!(wire::is_response(bytes), "replies have QR set");
        assert_eq!(wire::id(bytes), wire::id(&c.packet), "the client's own ID");
        if let Some(q) = &c.parsed {
            let limit = match client {
                Client::Udp(_) => usize::from(q.udp_size),
                Client::Tcp(_) => usize::from(u16::MAX),
            };
            assert!(
                bytes.len() <= limit,
                "a reply of {} bytes to a client that takes {limit}",
                bytes.len()
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

    fn check_upstream_send(&mut self, leg: Leg, bytes: Vec<u8>) {
        if let Via::Udp { socket } = leg.via {
            assert!(socket < SOCKETS, "socket {socket} of {SOCKETS}");
        }
        assert!(
            self.node.contains(&leg.to) || self.cluster.contains(&leg.to),
            "sent to {}, not an upstream",
            leg.to
        );
        assert!(!wire::is_response(&bytes), "a response was forwarded");
        assert_eq!(wire::id(&bytes), leg.id, "the leg names the ID sent");
        // Over UDP only a UDP client's query; over TCP a TCP client's, or a UDP client's whose
        // UDP answer came back truncated (fetched whole over TCP). Each as
        // `wire::upstream_query` makes it: the try's ID, 1232 bytes advertised, no COOKIE.
        let udp = matches!(leg.via, Via::Udp { .. });
        let mut expected = Vec::new();
        assert!(
            self.clients.iter().any(|(client, c)| {
                let Some(q) = &c.parsed else { return false };
                localdns_fallback::wire::upstream_query(&c.packet, q, leg.id, &mut expected);
                (!udp || matches!(client, Client::Udp(_))) && expected == bytes
            }),
            "what goes upstream is a client's query as upstream_query makes it, on its transport"
        );
        if let Ok(q) = wire::parse_query(&bytes) {
            assert!(!q.cookie, "a client's cookie went upstream");
            assert!(!q.edns || q.udp_size == wire::UPSTREAM_EDNS_SIZE);
        }
        self.sends.push((leg, bytes));
    }

    fn query(&mut self, packet: Vec<u8>, tcp: bool) {
        let n = self.next_client;
        self.next_client = self.next_client.wrapping_add(1).max(1);
        let client = if tcp {
            Client::Tcp(u64::from(n))
        } else {
            Client::Udp(SocketAddr::from(([10, 1, 0, 1], n)))
        };
        let parsed = wire::parse_query(&packet);
        self.clients.insert(
            client,
            ClientQuery {
                expects_reply: parsed != Err(wire::Reject::Drop),
                parsed: parsed.ok(),
                packet: packet.clone(),
                replies: 0,
            },
        );
        let now = self.rig.now();
        self.rig.handle_query(now, client, &packet);
        self.absorb();
    }

    /// An upstream message. `forged` says it cannot be the awaited reply (wrong address or
    /// socket), so nothing may come of it.
    fn reply(&mut self, via: Via, packet: Vec<u8>, from: SocketAddr, forged: bool) {
        // The same (via, ID, address) may have been used by another try: then it is not forged.
        let forged = forged
            && packet.len() >= 2
            && !self
                .sends
                .iter()
                .any(|(leg, b)| leg.via == via && leg.to == from && b[..2] == packet[..2]);
        let now = self.rig.now();
        self.rig.handle_reply(now, via, from, &packet);
        let produced = self.absorb();
        if forged {
            assert_eq!(produced, 0, "a forged reply produced transmits");
        }
    }

    fn advance(&mut self, ms: u64) {
        self.rig.advance(ms);
        self.absorb();
    }

    pub fn step(&mut self, input: &mut Input) {
        let sockets = SOCKETS;
        match input.u8() % 8 {
            0 => {
                let raw = input.blob().to_vec();
                let tcp = input.u8() & 1 == 1;
                self.query(raw, tcp);
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
                let tcp = input.u8() % 4 == 0;
                self.query(build_query(id, name, case, qtype, edns), tcp);
            }
            3 | 4 => {
                if self.sends.is_empty() {
                    return;
                }
                let pick = usize::from(input.u16()) % self.sends.len();
                let (leg, sent) = self.sends[pick].clone();
                let reply = shape_reply(&sent, input);
                match (input.u8() % 8, leg.via) {
                    // The wrong port of the right address.
                    (0, _) => self.reply(leg.via, reply, SocketAddr::new(leg.to.ip(), 5353), true),
                    // Through another socket.
                    (1, Via::Udp { socket }) if sockets > 1 => {
                        let other =
                            (socket + 1 + usize::from(input.u8()) % (sockets - 1)) % sockets;
                        self.reply(Via::Udp { socket: other }, reply, leg.to, true)
                    }
                    _ => self.reply(leg.via, reply, leg.to, false),
                }
            }
            5 => {
                let via = match input.u8() % 4 {
                    0 => Via::Tcp,
                    n => Via::Udp {
                        socket: usize::from(n) % sockets,
                    },
                };
                let from = match input.u8() % 3 {
                    0 => upstream_addr(1),
                    1 => upstream_addr(2),
                    _ => v6_upstream(2),
                };
                let raw = input.blob().to_vec();
                self.reply(via, raw, from, false);
            }
            6 => {
                // A send or exchange that failed, of the network's or of our own making.
                if self.sends.is_empty() {
                    return;
                }
                let pick = usize::from(input.u16()) % self.sends.len();
                let leg = self.sends[pick].0;
                let failure = match input.u8() % 4 {
                    0 => Failure::Network(io::ErrorKind::ConnectionRefused),
                    1 => Failure::from_io(&io::Error::from_raw_os_error(24)),
                    2 => Failure::NoSocket,
                    _ => Failure::Network(io::ErrorKind::UnexpectedEof),
                };
                let now = self.rig.now();
                if input.u8() % 4 == 0 {
                    // An ICMP error on a socket connected to the upstream.
                    self.rig.handle_unreachable(now, leg.to);
                } else {
                    self.rig.handle_failure(now, leg, failure);
                }
                self.absorb();
            }
            _ => self.advance(u64::from(input.u16() % 3000)),
        }
        assert!(self.rig.engine.inflight() <= self.max_inflight);
    }

    /// Runs the clock past every deadline: each query that deserved a reply has had exactly one,
    /// and nothing is left in flight.
    pub fn finish(mut self) {
        for _ in 0..20 {
            self.advance(500);
        }
        assert_eq!(self.rig.engine.inflight(), 0, "queries left in flight");
        for (client, c) in &self.clients {
            assert_eq!(
                c.replies,
                usize::from(c.expects_reply),
                "client {client:?} sent {:02x?}",
                c.packet
            );
        }
    }
}
