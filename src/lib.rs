//! localdns-fallback: a DNS forwarder of last resort for AKS nodes whose LocalDNS has failed.
//!
//! # Layout
//! - [`cli`]: the flags, which are the whole configuration (no config file by design).
//! - [`server`]: start-up and shutdown; binds the listeners and starts the workers.
//! - [`listen`]: socket binding (IP_FREEBIND, bounded retry while a port is busy).
//! - [`link`]: the `localdns` interface and its addresses, over rtnetlink.
//! - [`metrics`]: counters, `/metrics` in Prometheus text format.
//! - [`privilege`]: dropping capabilities once start-up is done.
//! - [`systemd`]: sd_notify readiness, status and the watchdog fed by the serving loops.
//! - [`forward`]: the forwarding path, UDP and TCP: routing, relaying, retries, SERVFAIL.
//! - [`cache`]: the answer cache with serve-stale.
//! - [`upstream`]: upstream groups and their passive health (who is tried next).
//! - [`wire`]: DNS wire-format checks and edits on packet bytes, without a full parse.
//! - [`discover`]: upstreams from the node's own state, one file per source, and following them.
//!
//! `forward`, `upstream`, `wire` and the discovery parsers decide; they own no sockets and read no
//! clock, so their unit tests run without a network. The integration tests in `tests/` run the real binary in network
//! namespaces against real DNS servers and real clients.

pub mod cache;
pub mod cli;
pub mod discover;
pub mod forward;
pub mod link;
pub mod listen;
pub mod metrics;
pub mod privilege;
pub mod server;
pub mod systemd;
pub mod upstream;
pub mod wire;
