//! Where a query goes, by LocalDNS's own routing, and which queries never leave the process.

use crate::roles::{ListenerRole, UpstreamGroup};
use crate::wire::{self, Reject, rcode};

/// Names LocalDNS answers itself, in lower-case wire form: its probe and watchdog name (any
/// reply counts as alive), and search-path junk that nothing real answers.
pub const HEALTH_CHECK: &[u8] = b"\x0chealth-check\x08localdns\x05local\x00";
pub const REDDOG: &[u8] = b"\x06reddog\x09microsoft\x03com\x00";
pub const CLOUDAPP_INTERNAL: &[u8] = b"\x08internal\x08cloudapp\x03net\x00";

/// Where a query goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Answered by us with this RCODE and no records.
    Local(u8),
    Upstream(UpstreamGroup),
}

/// LocalDNS's routing: the health-check name and search-path junk are answered locally; the
/// cluster listener sends everything to kube-dns; the node listener sends the cluster domain to
/// kube-dns and the rest to the VNet DNS.
pub fn route(listener: ListenerRole, name: &[u8], cluster_domain: &[u8]) -> Route {
    if name.eq_ignore_ascii_case(HEALTH_CHECK) {
        return Route::Local(rcode::NOERROR);
    }
    // Search-path expansion of names like `a.b.c.d` on Azure produces these; nothing real lives
    // there and the VNet DNS would be asked for each of them.
    if wire::labels_below(name, REDDOG).is_some()
        || wire::labels_below(name, CLOUDAPP_INTERNAL).is_some_and(|n| n >= 4)
    {
        return Route::Local(rcode::NXDOMAIN);
    }
    match listener {
        ListenerRole::Cluster => Route::Upstream(UpstreamGroup::KubeDns),
        ListenerRole::Node if wire::labels_below(name, cluster_domain).is_some() => {
            Route::Upstream(UpstreamGroup::KubeDns)
        }
        ListenerRole::Node => Route::Upstream(UpstreamGroup::VnetDns),
    }
}

/// What to do with a client's packet before any upstream or cache is involved.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not worth a reply (too short for an ID, or response-shaped).
    Drop,
    /// A reply of our own has been written to the output buffer.
    Answered,
    Forward(wire::Query, UpstreamGroup),
}

pub fn decide(
    listener: ListenerRole,
    packet: &[u8],
    cluster_domain: &[u8],
    out: &mut Vec<u8>,
) -> Decision {
    match wire::parse_query(packet) {
        Err(Reject::Drop) => Decision::Drop,
        Err(Reject::Reply(code)) => {
            wire::header_only_reply(packet, code, out);
            Decision::Answered
        }
        Ok(q) => match route(listener, q.name(packet), cluster_domain) {
            Route::Local(code) => {
                wire::local_reply(packet, &q, code, out);
                Decision::Answered
            }
            Route::Upstream(group) => Decision::Forward(q, group),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_as_localdns_does() {
        let cd = wire::encode_name("cluster.local").unwrap();
        let name = |s: &str| wire::encode_name(s).unwrap();
        let (node, cluster) = (ListenerRole::Node, ListenerRole::Cluster);
        let kube = Route::Upstream(UpstreamGroup::KubeDns);
        let vnet = Route::Upstream(UpstreamGroup::VnetDns);
        assert_eq!(route(cluster, &name("example.com"), &cd), kube);
        assert_eq!(route(node, &name("example.com"), &cd), vnet);
        let svc = name("kube-dns.kube-system.svc.cluster.local");
        assert_eq!(route(node, &svc, &cd), kube);
        let probe = name("Health-Check.LocalDNS.local");
        assert_eq!(route(node, &probe, &cd), Route::Local(0));
        assert_eq!(route(cluster, &probe, &cd), Route::Local(0));
        assert_eq!(
            route(node, &name("x.reddog.microsoft.com"), &cd),
            Route::Local(3)
        );
        let junk = name("a.b.c.d.internal.cloudapp.net");
        assert_eq!(route(node, &junk, &cd), Route::Local(3));
        assert_eq!(route(node, &name("vm1.internal.cloudapp.net"), &cd), vnet);
        assert_eq!(HEALTH_CHECK, name("health-check.localdns.local").as_slice());
        assert_eq!(REDDOG, name("reddog.microsoft.com").as_slice());
        assert_eq!(CLOUDAPP_INTERNAL, name("internal.cloudapp.net").as_slice());
    }
}
