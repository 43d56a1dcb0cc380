//! The pure parts of localdns-fallback: everything that decides, nothing that waits.
//!
//! This crate owns no socket, reads no clock and draws no randomness of its own: the shells in
//! the `localdns-fallback` crate pass in `now`, every seed and every datagram, and move the bytes
//! the engine hands back. Its Cargo.toml has no tokio, nix or socket2, and `clippy.toml` forbids
//! `Instant::now`, `SystemTime::now` and OS randomness here, so the boundary is the compiler's
//! and clippy's to hold, not a reviewer's.
//!
//! - [`roles`]: listener roles, upstream groups, transports.
//! - [`wire`]: DNS wire-format checks and edits on packet bytes, without a full parse.
//! - [`frame`]: DNS-over-TCP length-prefix framing, a pure decoder.
//! - [`stats`]: plain counters the serving loops bump and `/metrics` reads.
//! - [`hosts`]: the node's hosts file as a table, parsed from its bytes.
//! - [`upstream`]: the upstream sets of both groups and their passive health.
//! - [`cache`]: the answer cache with serve-stale.
//! - [`answer`]: each asker's own answer made from a shared reply.
//! - [`engine`]: every decision about a query, for UDP and TCP alike: local answers, routing,
//!   cache, coalescing, tries and deadlines, shedding, health. Inputs in, transmits and events out.
//! - [`flows`]: who holds LocalDNS's new flows beside it (the standby), from its probe, the
//!   kernel's view of its sockets' queues and its addresses: take, hand back, re-point.
//! - [`handoff`]: leaving without a gap when LocalDNS is back: the sequence, and when the drain
//!   after the hand-over is done.
//! - `rig` (tests, and feature `rig`): an engine on a fake clock with everything it sends kept,
//!   for the unit tests and the fuzz targets alike. The feature also brings the constructors
//!   only tests use (upstream sets without counters) to the shell crate's tests.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod answer;
pub mod cache;
pub mod engine;
pub mod flows;
pub mod frame;
pub mod handoff;
pub mod hosts;
#[cfg(any(test, feature = "rig"))]
pub mod rig;
pub mod roles;
pub mod stats;
pub mod upstream;
pub mod wire;
