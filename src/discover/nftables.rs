//! kube-proxy in nftables mode (Kubernetes >= 1.29): kube-dns backends from
//! `nft -j list table ip kube-proxy` and `nft -j list table ip6 kube-proxy`.
//!
//! The shapes, as kube-proxy writes them (kubernetes `pkg/proxy/nftables/proxier.go`):
//! - a service port's chain is `service-<HASH>-<namespace>/<name>/<proto>/<portname>`, e.g.
//!   `service-FY5PMXPG-kube-system/kube-dns/udp/dns` (HASH: 8 base32 characters, never a `-`);
//! - it spreads over its endpoints with `numgen random mod N vmap { 0 : goto endpoint-..., ... }`,
//!   preceded by one `ip saddr @affinity-... goto endpoint-...` rule per endpoint when the service
//!   has ClientIP session affinity;
//! - an endpoint's chain is `endpoint-<HASH>-<namespace>/<name>/<proto>/<portname>__<ip>/<port>`
//!   (an IPv6 address has its `:` replaced by `.`) and ends in `meta l4proto udp dnat to IP:PORT`
//!   (`[IP]:PORT` for IPv6);
//! - the `service-ips` map holds `10.0.0.10 . udp . 53 : goto service-...`.
//!
//! kube-proxy only flushes the chains of removed endpoints and deletes them a sync later, so the
//! backends are the endpoint chains the service chain *references*, not every endpoint chain.

use super::tool;

/// `nft` reads the whole ruleset whatever is asked (measured here: 10,000 services take about 5 s
/// and 12 MB of JSON), so it gets more time than other tools; discovery runs off the serving
/// path and paces itself by how long a look takes.
const NFT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
use super::{KubeDns, ServiceName};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Reads both kube-proxy tables and returns their kube-dns backends, IPv4 first (see
/// [`super::both_families`]).
pub fn discover(service: &ServiceName) -> Result<KubeDns, String> {
    super::both_families(|ipv6| {
        let family = if ipv6 { "ip6" } else { "ip" };
        match tool::run(
            "nft",
            &["-j", "list", "table", family, "kube-proxy"],
            NFT_TIMEOUT,
        ) {
            Ok(json) => parse(&json, service),
            // nft's only word for a missing table (ENOENT from netlink). The same sentence for
            // both families, so a node with neither says it once.
            Err(e) if e.contains("No such file or directory") => {
                Err("no nftables table kube-proxy: kube-proxy is not in nftables mode".into())
            }
            Err(e) => Err(e),
        }
    })
}

/// Parses one kube-proxy table as `nft -j` prints it. `Err` when the text is not nft's JSON;
/// `Ok` with empty lists when the table has no such service.
///
/// A big cluster's table is tens of megabytes of JSON; a full `Value` tree of it takes about 20
/// times that. So the first pass keeps every rule's expression as a borrowed slice of the text,
/// and only the few rules on kube-dns's path are parsed into values.
pub fn parse(json: &str, service: &ServiceName) -> Result<KubeDns, String> {
    let doc: Doc = serde_json::from_str(json)
        .map_err(|e| format!("nft printed JSON that cannot be read: {e}"))?;
    let raw = doc.nftables.ok_or("nft's JSON has no \"nftables\" list")?;
    // Item by item, so an entry of a shape we do not know is skipped rather than fatal.
    let items: Vec<Item> = raw
        .iter()
        .filter_map(|r| serde_json::from_str(r.get()).ok())
        .collect();
    let table = Table::new(&items);
    let udp_chain = table.service_chain(service, "udp", "dns");
    let tcp_chain = table.service_chain(service, "tcp", "dns-tcp");
    let backends = |chain: Option<&str>| chain.map(|c| table.backends(c)).unwrap_or_default();
    Ok(KubeDns {
        udp: backends(udp_chain),
        tcp: backends(tcp_chain),
        cluster_ip: udp_chain
            .and_then(|c| table.cluster_ip(c))
            .or_else(|| tcp_chain.and_then(|c| table.cluster_ip(c))),
    })
}

/// `{"nftables": [ {"chain": {...}} | {"rule": {...}} | {"map": {...}} | anything else ]}`.
#[derive(Deserialize)]
struct Doc<'a> {
    #[serde(borrow)]
    nftables: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Item<'a> {
    Chain(#[serde(borrow)] Named<'a>),
    Rule(#[serde(borrow)] Rule<'a>),
    Map(#[serde(borrow)] Map<'a>),
}

#[derive(Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
}

#[derive(Deserialize)]
struct Rule<'a> {
    #[serde(borrow)]
    chain: Cow<'a, str>,
    #[serde(borrow)]
    expr: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Map<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    elem: Option<&'a RawValue>,
}

/// Parses a borrowed JSON fragment; a fragment that does not parse counts as absent.
fn value(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

/// The parts of one table that lead from the service to its backends.
#[derive(Default)]
struct Table<'a> {
    /// Chain names in the order nft lists them.
    chains: Vec<&'a str>,
    /// Each chain's rules (their `expr` lists, unparsed), in rule order.
    rules: HashMap<&'a str, Vec<&'a RawValue>>,
    /// Elements of the `service-ips` map: `[{"concat": [ip, proto, port]}, verdict]`, unparsed.
    service_ips: Option<&'a RawValue>,
}

impl<'a> Table<'a> {
    fn new(items: &'a [Item<'a>]) -> Table<'a> {
        let mut table = Table::default();
        for item in items {
            match item {
                Item::Chain(chain) => table.chains.push(&chain.name),
                Item::Rule(Rule {
                    chain,
                    expr: Some(expr),
                }) => table.rules.entry(chain).or_default().push(expr),
                Item::Map(map) if map.name == "service-ips" => table.service_ips = map.elem,
                _ => {}
            }
        }
        table
    }

    /// `service-<HASH>-<namespace>/<name>/<proto>/<port>`, if this table has it.
    fn service_chain(&self, service: &ServiceName, proto: &str, port: &str) -> Option<&'a str> {
        let wanted = format!("{}/{}/{proto}/{port}", service.namespace, service.name);
        self.chains.iter().copied().find(|chain| {
            chain
                .strip_prefix("service-")
                .and_then(|rest| rest.split_once('-'))
                .is_some_and(|(_hash, base)| base == wanted)
        })
    }

    /// The endpoints the service chain sends traffic to, in vmap order, without repeats.
    fn backends(&self, service_chain: &str) -> Vec<SocketAddr> {
        let mut backends = Vec::new();
        for expr in self.rules.get(service_chain).into_iter().flatten() {
            let expr = value(expr);
            let mut targets = Vec::new();
            verdict_targets(&expr, &mut targets);
            let endpoints = targets.into_iter().filter(|t| t.starts_with("endpoint-"));
            backends.extend(endpoints.filter_map(|t| self.endpoint(t)));
        }
        // A chain named twice (affinity rule and vmap), or two endpoint chains naming the same
        // pod: an upstream is listed once.
        super::unique(backends)
    }

    /// An endpoint chain's address: its `dnat` rule, or failing that its name.
    fn endpoint(&self, chain: &str) -> Option<SocketAddr> {
        let dnat = self
            .rules
            .get(chain)
            .into_iter()
            .flatten()
            .find_map(|expr| dnat_target(&value(expr)));
        dnat.or_else(|| endpoint_from_name(chain))
    }

    /// The address whose `service-ips` element jumps to `service_chain`.
    fn cluster_ip(&self, service_chain: &str) -> Option<IpAddr> {
        let elems = value(self.service_ips?);
        elems.as_array()?.iter().find_map(|elem| {
            let target = elem.get(1).and_then(|verdict| {
                verdict
                    .pointer("/goto/target")
                    .or_else(|| verdict.pointer("/jump/target"))
            });
            if target.and_then(Value::as_str) != Some(service_chain) {
                return None;
            }
            elem.pointer("/0/concat/0")
                .and_then(Value::as_str)?
                .parse()
                .ok()
        })
    }
}

/// Collects the `goto`/`jump` targets anywhere in a rule, in the order a packet could take them.
fn verdict_targets<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::Array(items) => items.iter().for_each(|item| verdict_targets(item, out)),
        Value::Object(fields) => {
            for verdict in ["goto", "jump"] {
                if let Some(target) = fields.get(verdict).and_then(|v| v["target"].as_str()) {
                    out.push(target);
                }
            }
            // The kernel may list an anonymous set in any order; the numgen index is the order.
            if let Some(set) = value.pointer("/vmap/data/set").and_then(Value::as_array) {
                let mut entries: Vec<(u64, &Value)> = set
                    .iter()
                    .enumerate()
                    .map(|(position, entry)| (vmap_index(entry).unwrap_or(position as u64), entry))
                    .collect();
                entries.sort_by_key(|(index, _)| *index);
                entries
                    .into_iter()
                    .for_each(|(_, entry)| verdict_targets(entry, out));
                return;
            }
            fields
                .values()
                .for_each(|field| verdict_targets(field, out));
        }
        _ => {}
    }
}

/// The key of a vmap entry `[0, {"goto": ...}]`; newer nft may wrap it as `{"elem": {"val": 0}}`.
fn vmap_index(entry: &Value) -> Option<u64> {
    let key = entry.get(0)?;
    key.as_u64()
        .or_else(|| key.pointer("/elem/val").and_then(Value::as_u64))
}

/// `{"dnat": {"addr": "10.244.0.5", "port": 53}}` anywhere in a rule.
fn dnat_target(value: &Value) -> Option<SocketAddr> {
    match value {
        Value::Array(items) => items.iter().find_map(dnat_target),
        Value::Object(fields) => {
            if let Some(dnat) = fields.get("dnat") {
                let ip: IpAddr = dnat["addr"].as_str()?.parse().ok()?;
                let port = u16::try_from(dnat["port"].as_u64()?).ok()?;
                return Some(SocketAddr::new(ip, port));
            }
            fields.values().find_map(dnat_target)
        }
        _ => None,
    }
}

/// `endpoint-HASH-ns/name/udp/dns__10.244.0.5/53` or `...__fd00.10.244..5/53` (IPv6 with `:`
/// written as `.`, since nft chain names cannot hold `:`). A name kube-proxy had to truncate
/// (it then ends in `...`) does not parse, and the dnat rule is the only source.
fn endpoint_from_name(chain: &str) -> Option<SocketAddr> {
    let (_, endpoint) = chain.rsplit_once("__")?;
    let (ip, port) = endpoint.rsplit_once('/')?;
    let ip = match ip.parse::<Ipv4Addr>() {
        Ok(v4) => IpAddr::V4(v4),
        Err(_) => IpAddr::V6(ip.replace('.', ":").parse::<Ipv6Addr>().ok()?),
    };
    Some(SocketAddr::new(ip, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kube_dns() -> ServiceName {
        ServiceName::default()
    }

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn one_endpoint_among_unrelated_services() {
        let json = include_str!("../../tests/fixtures/nftables/one-endpoint.json");
        let found = parse(json, &kube_dns()).unwrap();
        assert_eq!(found.udp, addrs(&["10.244.0.5:53"]));
        assert_eq!(found.tcp, addrs(&["10.244.0.5:53"]));
        assert_eq!(found.cluster_ip, Some("10.0.0.10".parse().unwrap()));
    }

    #[test]
    fn two_endpoints_in_vmap_order() {
        let json = include_str!("../../tests/fixtures/nftables/two-endpoints.json");
        let found = parse(json, &kube_dns()).unwrap();
        assert_eq!(found.udp, addrs(&["10.244.0.5:53", "10.244.1.7:53"]));
        assert_eq!(found.tcp, addrs(&["10.244.0.5:53", "10.244.1.7:53"]));
    }

    #[test]
    fn three_endpoints_with_affinity_ignore_the_stale_chain() {
        let json = include_str!("../../tests/fixtures/nftables/three-endpoints-stale.json");
        assert!(
            json.contains("10.244.3.99"),
            "the fixture must hold the stale chain"
        );
        let found = parse(json, &kube_dns()).unwrap();
        let want = addrs(&["10.244.0.5:53", "10.244.1.7:53", "10.244.2.11:53"]);
        assert_eq!(found.udp, want);
        assert_eq!(found.tcp, want);
        assert_eq!(found.cluster_ip, Some("10.0.0.10".parse().unwrap()));
    }

    #[test]
    fn ipv6_table() {
        let json = include_str!("../../tests/fixtures/nftables/ipv6.json");
        let found = parse(json, &kube_dns()).unwrap();
        let want = addrs(&["[fd00:10:244::5]:53", "[fd00:10:244:1::7]:53"]);
        assert_eq!(found.udp, want);
        assert_eq!(found.tcp, want);
        assert_eq!(found.cluster_ip, Some("fd00:10:96::a".parse().unwrap()));
    }

    #[test]
    fn other_service_names_are_not_kube_dns() {
        let json = include_str!("../../tests/fixtures/nftables/no-kube-dns.json");
        // The fixture holds apps/kube-dns and kube-system/kube-dns-extra, both with a `dns` port.
        assert_eq!(parse(json, &kube_dns()).unwrap(), KubeDns::default());
        let apps = ServiceName {
            namespace: "apps".into(),
            name: "kube-dns".into(),
        };
        let found = parse(json, &apps).unwrap();
        assert_eq!(found.udp, addrs(&["10.244.8.8:53"]));
        assert_eq!(found.cluster_ip, Some("10.0.88.8".parse().unwrap()));
    }

    /// A minimal table in nft's JSON shape: the service chain lists its vmap out of order, one
    /// endpoint chain has no dnat rule (flushed) and one is IPv6, so both come from the name.
    #[test]
    fn vmap_index_order_and_addresses_from_chain_names() {
        let json = r#"{"nftables": [
          {"chain": {"family": "ip", "table": "kube-proxy", "name": "service-AAAAAAAA-kube-system/kube-dns/udp/dns"}},
          {"rule": {"chain": "service-AAAAAAAA-kube-system/kube-dns/udp/dns", "expr": [{"vmap": {
            "key": {"numgen": {"mode": "random", "mod": 3, "offset": 0}},
            "data": {"set": [
              [2, {"goto": {"target": "endpoint-CCCCCCCC-kube-system/kube-dns/udp/dns__fd00.10.244..5/5353"}}],
              [{"elem": {"val": 0}}, {"goto": {"target": "endpoint-AAAAAAAA-kube-system/kube-dns/udp/dns__10.244.0.5/53"}}],
              [1, {"goto": {"target": "endpoint-BBBBBBBB-kube-system/kube-dns/udp/dns__10.244.1.7/53"}}]]}}}]}},
          {"rule": {"chain": "endpoint-BBBBBBBB-kube-system/kube-dns/udp/dns__10.244.1.7/53",
                    "expr": [{"dnat": {"addr": "10.244.1.8", "port": 5300}}]}}
        ]}"#;
        let found = parse(json, &kube_dns()).unwrap();
        assert_eq!(
            found.udp,
            addrs(&["10.244.0.5:53", "10.244.1.8:5300", "[fd00:10:244::5]:5353"])
        );
        assert_eq!(found.tcp, vec![]);
        assert_eq!(found.cluster_ip, None);
    }

    #[test]
    fn garbage_is_an_error_or_empty_never_a_panic() {
        for bad in [
            "",
            "   ",
            "not json",
            "{",
            "[]",
            "{}",
            "{\"nftables\": 7}",
            "null",
        ] {
            assert!(parse(bad, &kube_dns()).is_err(), "{bad:?}");
        }
        let odd = [
            r#"{"nftables": []}"#,
            r#"{"nftables": [1, "x", null, {"chain": 5}, {"rule": {"chain": 3}}, {"map": {"name": "service-ips", "elem": 9}}]}"#,
            r#"{"nftables": [{"chain": {"name": "service-kube-system/kube-dns/udp/dns"}}]}"#,
            r#"{"nftables": [{"chain": {"name": "service-X-kube-system/kube-dns/udp/dns"}},
                {"rule": {"chain": "service-X-kube-system/kube-dns/udp/dns", "expr": [{"goto": {"target": "endpoint-Y-x__nonsense"}},
                 {"goto": {"target": "endpoint-Z-x__10.0.0.1/99999"}}, {"vmap": {"data": {"set": [[1], 7, [null, {"goto": 3}]]}}}]}},
                {"rule": {"chain": "endpoint-Y-x__nonsense", "expr": [{"dnat": {"addr": "10.0.0.1", "port": -1}}]}}]}"#,
        ];
        for json in odd {
            assert_eq!(
                parse(json, &kube_dns()).unwrap(),
                KubeDns::default(),
                "{json}"
            );
        }
    }

    #[test]
    fn endpoint_names() {
        let parsed = |name| endpoint_from_name(name).map(|a| a.to_string());
        assert_eq!(
            parsed("endpoint-H-ns/s/udp/dns__10.1.2.3/53").as_deref(),
            Some("10.1.2.3:53")
        );
        assert_eq!(
            parsed("endpoint-H-ns/s/udp/dns__fd00.1..2/53").as_deref(),
            Some("[fd00:1::2]:53")
        );
        assert_eq!(
            parsed("endpoint-H-ns/s/udp/dns__fd00.10.244.0.0.0.0.5/5").as_deref(),
            Some("[fd00:10:244::5]:5")
        );
        assert_eq!(
            parsed("endpoint-H-ns/s/udp/dns__fd00.10.244.0.0.0.0.5/..."),
            None
        );
        assert_eq!(parsed("endpoint-H-ns/s/udp/dns"), None);
    }
}
