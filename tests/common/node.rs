//! The node most end-to-end tests need: the listeners, one upstream namespace whose responder
//! serves both groups, and the forwarder started against it, ready on both listeners.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Forwarder, Mode, Responder, Topology, Upstream, require_root_and_tools};

/// Fields drop in this order: the forwarder first, the namespaces last.
pub struct OneUpstream {
    pub fwd: Forwarder,
    /// `None` once a test took the upstream away.
    pub resp: Option<Responder>,
    pub up: Upstream,
    pub topo: Topology,
}

impl OneUpstream {
    /// `extra` are more forwarder flags.
    pub fn start(mode: Mode, extra: &[&str]) -> OneUpstream {
        require_root_and_tools(&["ip", "dig"]);
        let topo = Topology::new();
        let up = topo.add_upstream_ns(true, false);
        let resp = Responder::start(&up.ns, up.sock_v4(), mode);
        let fwd = forwarder_for(&topo, up.sock_v4(), extra);
        OneUpstream {
            fwd,
            resp: Some(resp),
            up,
            topo,
        }
    }

    /// Queries the responder has received so far (0 once it was taken away).
    pub fn upstream_queries(&self) -> usize {
        self.resp.as_ref().map_or(0, Responder::queries)
    }
}

/// The forwarder in `topo`'s node namespace with `upstream` as both the VNet DNS and kube-dns
/// (and `extra` flags), ready on both listeners.
pub fn forwarder_for(topo: &Topology, upstream: SocketAddr, extra: &[&str]) -> Forwarder {
    let upstream = upstream.to_string();
    let mut args: Vec<String> = [
        "--node-upstream",
        &upstream,
        "--cluster-upstream",
        &upstream,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let fwd = Forwarder::spawn(&topo.node, &args);
    for listener in ["169.254.10.10:53", "169.254.10.11:53"] {
        let addr: SocketAddr = listener.parse().expect("literal");
        fwd.wait_ready(&topo.node, addr, Duration::from_secs(10));
    }
    fwd
}
