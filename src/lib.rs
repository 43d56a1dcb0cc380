//! localdns-fallback: a DNS forwarder of last resort for AKS nodes whose LocalDNS has failed.
//!
//! # Layout
//! A Cargo workspace of two crates. `core/` (`localdns-fallback-core`) holds every decision about
//! a query and owns no socket, clock or randomness; this crate holds the shells that move bytes in
//! and out of it and everything that touches the node. The core's modules are re-exported here
//! under their own names (`crate::engine`, `crate::wire`, ...), so the shells read the same either
//! way. Modules of this crate import one another one way only (`tests/module_graph.rs` fails on
//! a cycle): the shells import the core, start-up imports everything.
//!
//! The pure parts, in `core/` (see its `lib.rs`): [`roles`], [`wire`], [`frame`], [`stats`],
//! [`upstream`], [`cache`], [`answer`], [`engine`], [`flows`], [`handoff`].
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
//! - [`listen`]: socket binding (IP_FREEBIND, SO_REUSEPORT shared with LocalDNS, bounded retry
//!   while a port is busy) and the steering programs that put flows on our sockets or LocalDNS's.
//! - [`standby`]: who holds LocalDNS's flows, carried out: the loop every daemon runs, the probe
//!   (LocalDNS's own question on both listeners), what the processes behind its sockets do.
//! - [`stop`]: the one way every thread and task is told to stop.
//! - [`netlink`]: the kernel over netlink: the listener addresses on `lo` (rtnetlink), and the
//!   members of a listener's port with what waits unread in them (sock_diag).
//! - [`privilege`]: dropping capabilities once start-up is done.
//! - [`confine`]: no writes to the node's files, from the first instant (Landlock).
//! - [`systemd`]: sd_notify readiness, status and the watchdog fed by the serving loops.
//! - [`metrics`]: `/metrics` in Prometheus text format over the counters, and `/ready` (could
//!   it serve each upstream group now, or why not).
//! - [`cli`]: the flags, which are the whole configuration (no config file by design).
//! - [`report`]: `localdns-fallback discover`, what the daemon would use.
//! - [`status`]: `localdns-fallback status`, who answers the listeners (LocalDNS, a fallback, or
//!   nothing), and `status --ready`, whether the standby could serve, for node-problem-detector.
//! - [`server`]: start-up (the guard beside a serving LocalDNS, link, bind, privileges) and
//!   serving until the stop signal.
//!
//! The unit tests of the pure modules run without a network; the integration tests in `tests/`
//! run the real binary on loopback without root where the node's namespaces are not needed (the
//! kit in `tests/common`, `Rig::loopback`), and otherwise in network namespaces against real DNS
//! servers and real clients, and under a real systemd.

pub use localdns_fallback_core::{
    answer, cache, engine, flows, frame, handoff, hosts, roles, stats, upstream, wire,
};

pub mod cli;
pub mod confine;
pub mod discover;
pub mod listen;
pub mod mailbox;
pub mod metrics;
pub mod mmsg;
pub mod netlink;
pub mod privilege;
pub mod relay;
pub mod report;
pub mod server;
pub mod standby;
pub mod status;
pub mod stop;
pub mod systemd;
pub mod tcp;
pub mod tcp_pool;
