//! A client's datagram, as it arrives on either listener: parsed, routed, answered locally or
//! refused, with hickory-proto's parser as the reference for what the packet means.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fuzz_support::client_packet(data);
    fuzz_support::hickory_accepts_so_must_we(data);
});
