//! A TCP client's byte stream: length-prefixed frames, each through the same decision path as a
//! datagram; a stream that ends mid-frame is one the idle timeout must close.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fuzz_support::tcp_stream(data);
});
