//! Where a query goes, by LocalDNS's own routing, and which queries never leave the process.

use std::net::IpAddr;

use crate::hosts::{self, Hosts};
use crate::roles::{ListenerRole, UpstreamGroup};
use crate::wire::{self, Reject, rcode};

/// Names LocalDNS answers itself, in lower-case wire form: its probe and watchdog name (any
/// reply counts as alive), and search-path junk that nothing real answers.
pub const HEALTH_CHECK: &[u8] = b"\x0chealth-check\x08localdns\x05local\x00";
pub const REDDOG: &[u8] = b"\x06reddog\x09microsoft\x03com\x00";
pub const CLOUDAPP_INTERNAL: &[u8] = b"\x08internal\x08cloudapp\x03net\x00";
/// The TTL of answers from the hosts file (LocalDNS's `ttl 5`).
pub const HOSTS_TTL: u32 = 5;
const TYPE_A: u16 = 1;
const TYPE_PTR: u16 = 12;
const TYPE_AAAA: u16 = 28;

/// Where a query goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Answered by us with this RCODE and no records.
    Local(u8),
    Upstream(UpstreamGroup),
}

/// Where each listener sends each name, as LocalDNS's profile routes it (`vnetDNSOverrides` for the
/// node listener, `kubeDNSOverrides` for the cluster listener): per listener, domains with the
/// group they go to; the longest suffix of whole labels wins, case-insensitive, and the root
/// (`.`) always matches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routes {
    /// Node listener's, then the cluster listener's: (domain in lower-case wire form, group),
    /// longest domain first, so the first match is the longest.
    by_listener: [Vec<(Vec<u8>, UpstreamGroup)>; 2],
    /// The name of our own question to kube-dns (see [`crate::engine::Engine::ask_if_due`]), a
    /// name every cluster has, under the defaults' cluster domain.
    pub kubernetes: Vec<u8>,
}

impl Routes {
    /// LocalDNS's defaults with this cluster domain: the node listener sends it to kube-dns and
    /// the rest to the VNet DNS; the cluster listener sends everything to kube-dns.
    pub fn defaults(cluster_domain: &[u8]) -> Routes {
        let mut routes = Routes::default();
        let roots = [UpstreamGroup::VnetDns, UpstreamGroup::KubeDns];
        for (listener, root) in ListenerRole::BOTH.into_iter().zip(roots) {
            routes.set(listener, b"\0", root);
            routes.set(listener, cluster_domain, UpstreamGroup::KubeDns);
        }
        routes.kubernetes = [b"\x0akubernetes\x07default\x03svc", cluster_domain].concat();
        routes
    }

    /// Sends `domain` (wire form) and the names under it, on `listener`, to `group`; a route
    /// for the same domain is replaced.
    pub fn set(&mut self, listener: ListenerRole, domain: &[u8], group: UpstreamGroup) {
        let list = &mut self.by_listener[listener as usize];
        let domain = domain.to_ascii_lowercase();
        list.retain(|(d, _)| *d != domain);
        let at = list.partition_point(|(d, _)| d.len() >= domain.len());
        list.insert(at, (domain, group));
    }

    /// Per query: a listener whose routes all go one way (the cluster listener's defaults) walks
    /// no name, and the root, last, matches without a walk.
    pub fn group(&self, listener: ListenerRole, name: &[u8]) -> UpstreamGroup {
        let routes = &self.by_listener[listener as usize];
        let Some(&(_, first)) = routes.first() else {
            return UpstreamGroup::KubeDns;
        };
        if routes.iter().all(|&(_, g)| g == first) {
            return first;
        }
        self.find(listener, name)
            .map_or(UpstreamGroup::KubeDns, |&(_, group)| group)
    }

    /// The route `name` takes on `listener`: the first (longest) that matches.
    fn find(&self, listener: ListenerRole, name: &[u8]) -> Option<&(Vec<u8>, UpstreamGroup)> {
        self.by_listener[listener as usize]
            .iter()
            .find(|(domain, _)| domain == b"\0" || wire::labels_below(name, domain).is_some())
    }

    /// Does `name` take the root route on `listener` (no domain of its own matches)? LocalDNS's
    /// root blocks are the only ones with the hosts file.
    pub fn at_root(&self, listener: ListenerRole, name: &[u8]) -> bool {
        self.find(listener, name).is_none_or(|(d, _)| d == b"\0")
    }

    /// Whether some name on `listener` goes to `group`: the groups its relays must reach.
    pub fn reaches(&self, listener: ListenerRole, group: UpstreamGroup) -> bool {
        let routes = &self.by_listener[listener as usize];
        routes.iter().any(|&(_, g)| g == group)
            || (routes.is_empty() && group == UpstreamGroup::KubeDns)
    }

    /// The routes of `listener`, longest domain first.
    pub fn of(&self, listener: ListenerRole) -> &[(Vec<u8>, UpstreamGroup)] {
        &self.by_listener[listener as usize]
    }
}

/// LocalDNS's routing: the health-check name and search-path junk are answered locally; every
/// other name goes where `routes` sends it on this listener.
pub fn route(listener: ListenerRole, name: &[u8], routes: &Routes) -> Route {
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
    Route::Upstream(routes.group(listener, name))
}

/// What to do with a client's packet.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not worth a reply (too short for an ID, or response-shaped).
    Drop,
    /// A reply of our own has been written to the output buffer.
    Answered,
    Forward(wire::Query, UpstreamGroup),
}

/// The hosts file's answer, written to `out`, as CoreDNS's hosts plugin (`fallthrough`, in
/// LocalDNS's root blocks) gives it: A or AAAA for a name in the file, PTR for an address in it,
/// authoritative; NODATA for a name in the file without an address of the asked type or for
/// any other type. False (forward it) for anything else, and for names under a domain routed
/// on its own (`cluster.local`, the profile's overrides), whose blocks have no hosts plugin.
fn from_hosts(
    listener: ListenerRole,
    packet: &[u8],
    q: &wire::Query,
    (routes, hosts): (&Routes, &Hosts),
    limit: usize,
    out: &mut Vec<u8>,
) -> bool {
    let name = q.name(packet);
    let mut records = Vec::new();
    let mut count = 0u16;
    let mut push = |rtype: u16, rdata: &[u8]| {
        // Past what any reply can hold, the rest would be cut anyway.
        if records.len() < usize::from(u16::MAX) {
            records.extend_from_slice(&[0xc0, 12]); // the question's name, in its spelling
            records.extend_from_slice(&rtype.to_be_bytes());
            records.extend_from_slice(&[0, 1]);
            records.extend_from_slice(&HOSTS_TTL.to_be_bytes());
            records.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            records.extend_from_slice(rdata);
            count += 1;
        }
    };
    if q.qtype == TYPE_PTR {
        hosts::reverse(name)
            .into_iter()
            .flat_map(|addr| hosts.names(addr))
            .for_each(|target| push(TYPE_PTR, target));
        if count == 0 {
            return false;
        }
    } else {
        let mut known = false;
        for addr in hosts.addrs(name) {
            known = true;
            match (addr, q.qtype) {
                (IpAddr::V4(a), TYPE_A) => push(TYPE_A, &a.octets()),
                (IpAddr::V6(a), TYPE_AAAA) => push(TYPE_AAAA, &a.octets()),
                _ => {}
            }
        }
        if !known {
            return false;
        }
    }
    if !routes.at_root(listener, name) {
        return false;
    }
    wire::local_reply(packet, q, rcode::NOERROR, out);
    wire::add_answers(out, q, &records, count, limit);
    true
}

/// What to do with a client's packet (over TCP if `tcp`) before any upstream or cache is
/// involved.
pub fn decide(
    listener: ListenerRole,
    packet: &[u8],
    (routes, hosts): (&Routes, &Hosts),
    tcp: bool,
    out: &mut Vec<u8>,
) -> Decision {
    match wire::parse_query(packet) {
        Err(Reject::Drop) => Decision::Drop,
        Err(Reject::Reply(code)) => {
            wire::header_only_reply(packet, code, out);
            Decision::Answered
        }
        Ok(q) => match route(listener, q.name(packet), routes) {
            Route::Local(code) => {
                wire::local_reply(packet, &q, code, out);
                Decision::Answered
            }
            Route::Upstream(group) => {
                let limit = if tcp {
                    usize::from(u16::MAX)
                } else {
                    usize::from(q.udp_size)
                };
                if !hosts.is_empty()
                    && from_hosts(listener, packet, &q, (routes, hosts), limit, out)
                {
                    return Decision::Answered;
                }
                Decision::Forward(q, group)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_as_localdns_does() {
        let cd = Routes::defaults(&wire::encode_name("cluster.local").unwrap());
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
        let reaches = |l| UpstreamGroup::BOTH.map(|g| cd.reaches(l, g));
        assert_eq!(
            (reaches(node), reaches(cluster)),
            ([true, true], [false, true])
        );
    }

    /// The hosts file in the root blocks only: A, AAAA and PTR from it, NODATA for its names'
    /// other types, authoritative with TTL 5 and the question's spelling; our NSID if asked.
    #[test]
    fn the_hosts_file_as_the_plugin_answers() {
        use crate::wire::tests::{hickory, opt, query_with};
        use hickory_proto::rr::RData;
        let mut routes = Routes::defaults(&wire::encode_name("cluster.local").unwrap());
        let corp = wire::encode_name("corp.example").unwrap();
        routes.set(ListenerRole::Node, &corp, UpstreamGroup::KubeDns);
        let hosts = Hosts::parse(
            b"10.0.0.1 mcr.example a.svc.cluster.local b.corp.example\n2001:db8::1 MCR.example\n",
        );
        let ask = |listener, name: &str, qtype: u16, nsid: bool| {
            let o = opt(1232, false, if nsid { &[(3, b"")] } else { &[] });
            let query = query_with(name, qtype, [1, 0], Some(&o));
            let mut out = Vec::new();
            match decide(listener, &query, (&routes, &hosts), false, &mut out) {
                Decision::Answered => Some((out[12..12 + name.len() + 2].to_vec(), hickory(&out))),
                _ => None,
            }
        };
        let node = ListenerRole::Node;
        let (spelled, m) = ask(ListenerRole::Cluster, "Mcr.Example", 1, false).unwrap();
        assert_eq!(spelled, b"\x03Mcr\x07Example\0");
        assert!(m.authoritative() && m.answers().len() == 1 && m.answers()[0].ttl() == 5);
        assert_eq!(
            m.answers()[0].data(),
            &RData::A("10.0.0.1".parse().unwrap())
        );
        let (_, m) = ask(node, "mcr.example", 28, true).unwrap();
        assert_eq!(
            m.answers()[0].data(),
            &RData::AAAA("2001:db8::1".parse().unwrap())
        );
        let nsid = m
            .extensions()
            .as_ref()
            .unwrap()
            .option(hickory_proto::rr::rdata::opt::EdnsCode::NSID);
        assert!(nsid.is_some());
        let (_, m) = ask(node, "mcr.example", 15, false).unwrap();
        assert!(m.answers().is_empty() && m.response_code() == 0.into() && m.authoritative());
        let (_, m) = ask(node, "1.0.0.10.in-addr.arpa", 12, false).unwrap();
        assert_eq!(m.answers().len(), 3, "every name of the address");
        assert!(ask(node, "2.0.0.10.in-addr.arpa", 12, false).is_none());
        assert!(
            ask(node, "mcr.example", 12, false).is_none(),
            "PTR of a name: forwarded"
        );
        assert!(ask(node, "other.example", 1, false).is_none());
        assert!(
            ask(node, "a.svc.cluster.local", 1, false).is_none(),
            "cluster.local"
        );
        assert!(
            ask(node, "b.corp.example", 1, false).is_none(),
            "an override"
        );
        assert!(ask(ListenerRole::Cluster, "b.corp.example", 1, false).is_some());
    }

    /// The profile's overrides: the longest suffix of whole labels wins, case-insensitive, per
    /// listener; a route set again replaces the first.
    #[test]
    fn overrides_take_the_longest_whole_label_suffix() {
        let name = |s: &str| wire::encode_name(s).unwrap();
        let (node, cluster) = (ListenerRole::Node, ListenerRole::Cluster);
        let kube = Route::Upstream(UpstreamGroup::KubeDns);
        let vnet = Route::Upstream(UpstreamGroup::VnetDns);
        let mut r = Routes::defaults(&name("cluster.local"));
        r.set(node, &name("Contoso.Internal"), UpstreamGroup::KubeDns);
        r.set(node, &name("pub.contoso.internal"), UpstreamGroup::VnetDns);
        r.set(cluster, &name("corp.example"), UpstreamGroup::VnetDns);
        assert_eq!(route(node, &name("db.CONTOSO.internal"), &r), kube);
        assert_eq!(route(node, &name("www.pub.contoso.internal"), &r), vnet);
        assert_eq!(
            route(node, &name("xcontoso.internal"), &r),
            vnet,
            "whole labels"
        );
        assert_eq!(route(node, &name("contoso.internal"), &r), kube);
        assert_eq!(route(cluster, &name("contoso.internal"), &r), kube);
        assert_eq!(route(cluster, &name("a.corp.example"), &r), vnet);
        assert!(
            r.reaches(cluster, UpstreamGroup::VnetDns),
            "the relay must reach it"
        );
        assert_eq!(route(node, &name("a.corp.example"), &r), vnet);
        assert_eq!(route(cluster, &name("svc.cluster.local"), &r), kube);
        r.set(node, &name("contoso.internal"), UpstreamGroup::VnetDns);
        assert_eq!(route(node, &name("db.contoso.internal"), &r), vnet);
        r.set(cluster, b"\0", UpstreamGroup::VnetDns);
        assert_eq!(route(cluster, &name("example.com"), &r), vnet);
        assert_eq!(
            route(cluster, &name("kubernetes.default.svc.cluster.local"), &r),
            kube
        );
        assert_eq!(
            r.of(node).last().map(|(d, _)| d.as_slice()),
            Some(&b"\0"[..])
        );
    }
}
