//! `/proc/net/ip_vs` and `ipvsadm -Ln` output through the ipvs parsers, with and without a
//! known ClusterIP.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use localdns_fallback::discover::ipvs;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let cluster_ip: IpAddr = [10, 0, 0, 10].into();
    for ip in [None, Some(cluster_ip)] {
        for found in [ipvs::parse_proc(&text, ip), ipvs::parse_ipvsadm(&text, ip)] {
            if let (Some(want), Some(got)) = (ip, found.cluster_ip) {
                assert_eq!(want, got, "a given ClusterIP is the one reported");
            }
            fuzz_support::check_kube_dns(&found);
        }
    }
});
