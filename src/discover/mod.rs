//! Upstream discovery from the node's own state (CONTEXT §3). Never resolves a name, never asks the
//! Kubernetes API, never reads LocalDNS's own configuration.
//!
//! Each source is one file with a pure parser (node text in, upstreams out) and a thin reader that
//! fetches that text. A source answers `Err(reason)` when it cannot be used on this node (tool
//! missing, socket absent, command failed) and `Ok` with empty lists when it works but knows no
//! kube-dns.

pub mod tool;

use std::net::{IpAddr, SocketAddr};

/// The Kubernetes service whose backends are the cluster upstreams (`--kube-dns-service`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceName {
    pub namespace: String,
    pub name: String,
}

impl Default for ServiceName {
    fn default() -> ServiceName {
        ServiceName { namespace: "kube-system".into(), name: "kube-dns".into() }
    }
}

impl std::fmt::Display for ServiceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What one source knows about the kube-dns service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeDns {
    /// Backends of the UDP port named `dns`, in the order the source lists them.
    pub udp: Vec<SocketAddr>,
    /// Backends of the TCP port named `dns-tcp`.
    pub tcp: Vec<SocketAddr>,
    /// The service's ClusterIP, when the source shows it (the last-resort upstream).
    pub cluster_ip: Option<IpAddr>,
}
