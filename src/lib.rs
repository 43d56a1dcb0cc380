//! localdns-fallback: a DNS forwarder of last resort for AKS nodes whose LocalDNS has failed.
//!
//! # Layout
//! Modules import one another one way only (`tests/module_graph.rs` fails on a cycle): the pure
//! parts import nothing outside themselves, the shells import the pure parts, start-up imports
//! everything.
//!
//! The vocabulary and the pure parts (no socket, no clock, no log):
//! - [`roles`]: listener roles, upstream groups, transports.
//! - [`wire`]: DNS wire-format checks and edits on packet bytes, without a full parse.
//! - [`frame`]: DNS-over-TCP length-prefix framing, a pure decoder.
//! - [`stats`]: plain counters the serving loops bump and `/metrics` reads.
//! - [`upstream`]: the upstream sets of both groups and their passive health.
//! - [`cache`]: the answer cache with serve-stale.
//! - [`answer`]: each asker's own answer made from a shared reply, and the query sent upstream.
//! - [`engine`]: every decision about a query, for UDP and TCP alike: local answers, routing,
//!   cache, coalescing, tries and deadlines, shedding, health. Inputs in, transmits and events out.
//! - [`handoff`]: leaving without a gap when LocalDNS is back: the sequence, and when the drain
//!   after the hand-over is done.
//!
//! The shells, which move bytes in and out of engines:
//! - [`mmsg`]: batches of datagrams per system call (`recvmmsg`, `sendmmsg`).
//! - [`mailbox`]: how TCP tasks hand queries and upstream replies to a relay thread.
//! - [`tcp`]: TCP client connections (tokio tasks).
//! - [`tcp_pool`]: pooled, pipelined upstream TCP connections (tokio tasks).
//! - [`relay`]: a relay thread: one engine, the UDP sockets, the mailbox, epoll.
//!
//! The node, start-up and reporting:
//! - [`discover`]: upstreams from the node's own state, one file per source, and following them.
//! - [`listen`]: socket binding (IP_FREEBIND, SO_REUSEPORT shared with LocalDNS, a steering
//!   program that keeps flows on our sockets, bounded retry while a port is busy).
//! - [`link`]: the listener addresses on `lo`, over rtnetlink.
//! - [`privilege`]: dropping capabilities once start-up is done.
//! - [`confine`]: no writes to the node's files, from the first instant (Landlock).
//! - [`systemd`]: sd_notify readiness, status and the watchdog fed by the serving loops.
//! - [`metrics`]: `/metrics` in Prometheus text format over the counters.
//! - [`cli`]: the flags, which are the whole configuration (no config file by design).
//! - [`report`]: `localdns-fallback discover`, what the daemon would use.
//! - [`server`]: start-up (link, bind, privileges) and serving until the stop signal.
//!
//! The unit tests of the pure modules run without a network; `tests/loopback.rs` runs the real
//! binary on loopback without root; the other integration tests in `tests/` run it in network
//! namespaces against real DNS servers and real clients, and under a real systemd.

pub mod answer;
pub mod cache;
pub mod cli;
pub mod confine;
pub mod discover;
pub mod engine;
pub mod frame;
pub mod handoff;
pub mod link;
pub mod listen;
pub mod mailbox;
pub mod metrics;
pub mod mmsg;
pub mod privilege;
pub mod relay;
pub mod report;
pub mod roles;
pub mod server;
pub mod stats;
pub mod systemd;
pub mod tcp;
pub mod tcp_pool;
pub mod upstream;
pub mod wire;
