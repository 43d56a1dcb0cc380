//! `nft -j list table ip kube-proxy` output through the nftables parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use localdns_fallback::discover::{ServiceName, nftables};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(found) = nftables::parse(text, &ServiceName::default()) {
        fuzz_support::check_kube_dns(&found);
    }
});
