//! The whole UDP relay of one listener as a state machine: queries, honest and forged upstream
//! replies and the passing of time in any order (see `fuzz_support::relay` for what must hold).
#![no_main]

use fuzz_support::Input;
use fuzz_support::relay::Rig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let mut rig = Rig::new(&mut input);
    // Bounded: a long input cannot make one run slow.
    for _ in 0..200 {
        if input.is_empty() {
            break;
        }
        rig.step(&mut input);
    }
    rig.finish();
});
