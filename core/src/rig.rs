//! An engine under test: built from a [`Setup`], driven with instants on a fake clock, every
//! transmit and event kept for the caller to check. Core's unit tests and the relay fuzz target
//! share it, so both drive the engine built the same way.
//!
//! The rig reads no clock: its caller passes the starting instant, and every later instant is
//! that plus time the caller says has passed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cache::{Cache, KeyHasher, Limits};
use crate::engine::route::Routes;
use crate::engine::{Client, Dest, Engine, Event, Failure, Leg, Outcome, Settings, Via};
use crate::roles::ListenerRole;
use crate::stats::ListenerStats;
use crate::upstream::UpstreamSets;

/// UDP sockets per upstream: more than one, so a reply through the wrong socket is a real case.
pub const SOCKETS: usize = 2;

/// What the engine is built from. [`Setup::new`] gives the usual rig; change any field first.
pub struct Setup {
    pub role: ListenerRole,
    pub vnet: Vec<SocketAddr>,
    pub kube: Vec<SocketAddr>,
    pub settings: Settings,
    pub routes: Routes,
    /// `None` runs the engine without a cache.
    pub cache: Option<Limits>,
    pub seed: [u8; 32],
}

impl Setup {
    pub fn new(role: ListenerRole, vnet: Vec<SocketAddr>, kube: Vec<SocketAddr>) -> Setup {
        Setup {
            role,
            vnet,
            kube,
            settings: Settings {
                udp_sockets_per_upstream: SOCKETS,
                ..Settings::default()
            },
            routes: Routes::defaults(b"\x07cluster\x05local\x00"),
            cache: Some(Limits::default()),
            seed: [7; 32],
        }
    }

    /// The engine, its clock starting at `t0`.
    pub fn start(self, t0: Instant) -> Rig {
        let cache = self
            .cache
            .and_then(|limits| Cache::new(limits, KeyHasher::new(7)))
            .map(|c| Arc::new(Mutex::new(c)));
        let sets = Arc::new(UpstreamSets::uncounted(self.vnet, self.kube, t0));
        Rig {
            engine: Engine::new(
                self.role,
                self.settings,
                self.routes,
                sets,
                cache,
                Arc::new(ListenerStats::default()),
                self.seed,
            ),
            sent: Vec::new(),
            events: Vec::new(),
            t0,
            now_ms: 0,
        }
    }
}

pub struct Rig {
    pub engine: Engine,
    /// What the engine asked to send, in order, since the caller last emptied it.
    pub sent: Vec<(Dest, Vec<u8>)>,
    /// The engine's events, in order, since the caller last emptied it.
    pub events: Vec<Event>,
    t0: Instant,
    now_ms: u64,
}

impl Rig {
    /// `ms` after the start.
    pub fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// The fake clock: the start plus all [`Rig::advance`] has added.
    pub fn now(&self) -> Instant {
        self.at(self.now_ms)
    }

    /// Moves the fake clock on and lets the engine's timers fire.
    pub fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
        self.handle_timeout(self.now());
    }

    // Each input as the engine takes it, drained at once as a shell drains it, so a caller sees
    // what that one input produced.

    pub fn handle_query(&mut self, now: Instant, client: Client, packet: &[u8]) -> Outcome {
        let outcome = self.engine.handle_query(now, client, packet);
        self.drain();
        outcome
    }

    pub fn handle_reply(&mut self, now: Instant, via: Via, from: SocketAddr, packet: &[u8]) {
        self.engine.handle_reply(now, via, from, packet);
        self.drain();
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.engine.handle_timeout(now);
        self.drain();
    }

    pub fn handle_failure(&mut self, now: Instant, leg: Leg, failure: Failure) {
        self.engine.handle_failure(now, leg, failure);
        self.drain();
    }

    pub fn handle_unreachable(&mut self, now: Instant, upstream: SocketAddr) {
        self.engine.handle_unreachable(now, upstream);
        self.drain();
    }

    /// Collects what the engine produced; for a caller that fed [`Rig::engine`] directly.
    pub fn drain(&mut self) {
        while let Some(t) = self.engine.poll_transmit() {
            self.sent.push((t.dest, t.bytes.to_vec()));
        }
        while let Some(e) = self.engine.poll_event() {
            self.events.push(e);
        }
    }

    /// The last upstream send: its leg and bytes.
    pub fn last_upstream(&self) -> (Leg, Vec<u8>) {
        self.sent
            .iter()
            .rev()
            .find_map(|(d, b)| match d {
                Dest::Upstream(leg) => Some((*leg, b.clone())),
                _ => None,
            })
            .expect("something was sent upstream")
    }

    /// The legs of every upstream send, in order.
    pub fn upstream_legs(&self) -> Vec<Leg> {
        let leg = |(d, _): &(Dest, Vec<u8>)| match d {
            Dest::Upstream(leg) => Some(*leg),
            _ => None,
        };
        self.sent.iter().filter_map(leg).collect()
    }

    pub fn upstream_sends(&self) -> usize {
        self.sent
            .iter()
            .filter(|(d, _)| matches!(d, Dest::Upstream(_)))
            .count()
    }

    pub fn sent_to(&self, client: Client) -> Vec<Vec<u8>> {
        let me = Dest::Client(client);
        self.sent
            .iter()
            .filter(|(d, _)| *d == me)
            .map(|(_, b)| b.clone())
            .collect()
    }
}
