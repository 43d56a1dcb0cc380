//! The Cilium agent's `GET /v1/service` body through the Cilium parser. (The HTTP response
//! parser in front of it is private to the module, so it is not reached from here.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use localdns_fallback::discover::{ServiceName, cilium};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(found) = cilium::parse(text, &ServiceName::default()) {
        fuzz_support::check_kube_dns(&found);
    }
});
