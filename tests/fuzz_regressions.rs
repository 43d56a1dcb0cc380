//! Findings of the fuzz targets in `fuzz/`, each reduced to a test through the public API.
//!
//! Each test names the target that found it and the property it broke.

use std::net::{IpAddr, SocketAddr};

use localdns_fallback::discover::{ServiceName, ipvs, nftables};
use localdns_fallback::upstream::UpstreamSet;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Found by `fuzz/` target `nftables` (property: no backend listed twice). Two endpoint chains
/// with different names that lead to the same pod (here both named after it, so the address is
/// read from the name) make the same backend appear twice. The iptables and Cilium sources and
/// resolv.conf de-duplicate by address; nftables de-duplicates by chain name only.
///
#[test]
fn nftables_lists_each_backend_once() {
    let ep = |hash: &str| format!("endpoint-{hash}-kube-system/kube-dns/udp/dns__10.244.0.5/53");
    let json = format!(
        r#"{{"nftables": [
  {{"chain": {{"family": "ip", "table": "kube-proxy", "name": "service-FY5PMXPG-kube-system/kube-dns/udp/dns"}}}},
  {{"chain": {{"family": "ip", "table": "kube-proxy", "name": "{a}"}}}},
  {{"chain": {{"family": "ip", "table": "kube-proxy", "name": "{b}"}}}},
  {{"rule": {{"family": "ip", "table": "kube-proxy", "chain": "service-FY5PMXPG-kube-system/kube-dns/udp/dns",
    "expr": [{{"vmap": {{"key": {{"numgen": {{"mode": "random", "mod": 2, "offset": 0}}}},
      "data": {{"set": [[0, {{"goto": {{"target": "{a}"}}}}], [1, {{"goto": {{"target": "{b}"}}}}]]}}}}}}]}}}}
]}}"#,
        a = ep("AAAAAAAA"),
        b = ep("BBBBBBBB"),
    );
    let found = nftables::parse(&json, &ServiceName::default()).expect("valid nft JSON");
    assert_eq!(found.udp, vec![addr("10.244.0.5:53")]);
}

/// Found by `fuzz/` target `ipvs` (property: no backend listed twice). The kube-dns virtual
/// service listed twice (as a text that was read while kube-proxy rewrote it might show) gives
/// its real server twice.
///
#[test]
fn ipvs_lists_each_backend_once() {
    let text = "IP Virtual Server version 1.2.1 (size=4096)\n\
                Prot LocalAddress:Port Scheduler Flags\n  \
                -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n\
                UDP  0A00000A:0035 rr\n  \
                -> 0AF40005:0035      Masq    1      0          0\n\
                UDP  0A00000A:0035 rr\n  \
                -> 0AF40005:0035      Masq    1      0          0\n";
    let cluster_ip: IpAddr = "10.0.0.10".parse().unwrap();
    for found in [
        ipvs::parse_proc(text, Some(cluster_ip)),
        ipvs::parse_proc(text, None),
    ] {
        assert_eq!(found.udp, vec![addr("10.244.0.5:53")]);
    }
}

/// Why the two findings above matter: health is kept per position, and a failure is recorded at
/// the first position of the address only. A server listed twice that stops answering stays
/// "healthy" through its second copy, so queries keep going to it first and lose a whole
/// `--upstream-timeout` each.
///
#[test]
fn a_duplicated_upstream_that_times_out_is_tried_after_the_others() {
    let (dead, alive) = (addr("10.244.0.5:53"), addr("10.244.1.7:53"));
    let now = std::time::Instant::now();
    let group = UpstreamSet::new(vec![dead, alive, dead], now);
    group.note_failure(dead, true, now, now);
    // The dead one gets one probe per half second; every other query goes to the live one.
    let mut to_dead = 0;
    for start in 0..30 {
        let choice = group.choose(start, &[], &[], now).expect("a server");
        if choice.addr == dead {
            assert!(
                choice.probe,
                "rotation start {start}: the server that timed out is tried first"
            );
            to_dead += 1;
        }
    }
    assert_eq!(to_dead, 1, "one probe, not a share of the rotation");
}

/// This process's peak resident memory, in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// How much memory parsing one discovery answer may take: the daemon runs in LocalDNS's
/// 128 MiB slice (`MemoryMax=128M`) next to its 32 MiB cache and its socket buffers.
const PARSE_BUDGET_KIB: u64 = 64 * 1024;

/// A kube-proxy nftables table of about 10,000 services as `nft -j` prints it (about 12 MB, the
/// size measured for 10,000 services; see src/discover/nftables.rs): the fixture's table with the
/// chains and rules of its metrics-server service repeated under other names.
fn big_nft_table(min_bytes: usize) -> String {
    let fixture = include_str!("fixtures/nftables/one-endpoint.json");
    let doc: serde_json::Value = serde_json::from_str(fixture).unwrap();
    let items = doc["nftables"].as_array().unwrap();
    let template: Vec<String> = items
        .iter()
        .map(|i| i.to_string())
        .filter(|s| s.contains("metrics-server") && !s.contains("\"map\""))
        .collect();
    let mut out: Vec<String> = items.iter().map(|i| i.to_string()).collect();
    let mut total: usize = out.iter().map(String::len).sum();
    let mut n = 0;
    while total < min_bytes {
        for t in &template {
            let item = t.replace("metrics-server", &format!("service{n}"));
            total += item.len() + 2;
            out.push(item);
        }
        n += 1;
    }
    format!("{{\"nftables\": [{}]}}", out.join(", "))
}

/// Found while fuzzing the discovery parsers with large inputs (libFuzzer's -rss_limit_mb): the
/// nftables source parses the whole table into a `serde_json::Value`, which takes about 20 times
/// the JSON's size. On a cluster of 10,000 services (12 MB of JSON) that is about 240 MB for one
/// discovery run, twice the slice the daemon runs in, and glibc keeps most of it resident after
/// the parse. Discovery runs again every --rediscover-interval while serving.
///
#[test]
fn nftables_parse_of_a_big_table_fits_the_slice() {
    let json = big_nft_table(12 << 20);
    let before = peak_rss_kib();
    let found = nftables::parse(&json, &ServiceName::default()).expect("valid nft JSON");
    let used = peak_rss_kib().saturating_sub(before);
    assert_eq!(
        found.udp,
        vec![addr("10.244.0.5:53")],
        "the kube-dns backend is found"
    );
    assert!(
        used < PARSE_BUDGET_KIB,
        "parsing {} MB of nft JSON took {used} KiB of memory (budget {PARSE_BUDGET_KIB} KiB)",
        json.len() >> 20
    );
}
