//! The words every other module shares: which listener a query arrived on, which group of
//! upstreams it goes to, and over which transport. A leaf: it imports nothing of ours.

/// Which of the two listeners a query arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListenerRole {
    /// 169.254.10.10: the host, hostNetwork and dnsPolicy=Default pods (CoreDNS itself among them).
    Node,
    /// 169.254.10.11: every ClusterFirst pod (kubelet's `--cluster-dns`).
    Cluster,
}

impl ListenerRole {
    pub const BOTH: [ListenerRole; 2] = [ListenerRole::Node, ListenerRole::Cluster];

    /// The label value in logs and `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            ListenerRole::Node => "node",
            ListenerRole::Cluster => "cluster",
        }
    }
}

/// The two groups of interchangeable upstream servers a query can be sent to, as LocalDNS routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UpstreamGroup {
    /// The VNet DNS servers: every name asked on the node listener outside the cluster domain.
    VnetDns,
    /// The kube-dns backends: everything on the cluster listener, and the cluster domain on the
    /// node listener.
    KubeDns,
}

impl UpstreamGroup {
    pub const BOTH: [UpstreamGroup; 2] = [UpstreamGroup::VnetDns, UpstreamGroup::KubeDns];

    /// The label value in `/metrics` (`group="node"` for the VNet DNS, `group="cluster"` for
    /// kube-dns: named after the listener each group chiefly serves, as the metrics always were).
    pub fn name(self) -> &'static str {
        match self {
            UpstreamGroup::VnetDns => "node",
            UpstreamGroup::KubeDns => "cluster",
        }
    }
}

/// How a message travels, between a client and us or between us and an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}
