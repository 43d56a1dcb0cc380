//! `iptables -S` output (KUBE-SERVICES, a KUBE-SVC-* chain, a KUBE-SEP-* chain) through the
//! three iptables parsers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use localdns_fallback::discover::ServiceName;
use localdns_fallback::discover::iptables;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let service = ServiceName::default();
    for port in ["dns", "dns-tcp"] {
        if let Some(rule) = iptables::parse_services(&text, &service, port) {
            assert!(rule.chain.starts_with("KUBE-SVC-"));
        }
    }
    for chain in iptables::parse_service_chain(&text) {
        assert!(chain.starts_with("KUBE-SEP-"));
    }
    let _ = iptables::parse_endpoint_chain(&text);
});
