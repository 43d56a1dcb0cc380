//! An upstream's reply to a query we sent: acceptance (exact ID and question, case aside), the
//! client's ID and spelling put back, the TC cut, and the record walk the cache relies on.
//!
//! Input: a query (name, case, type, EDNS) from the first bytes, then either raw reply bytes or a
//! reply shaped around the query (so the fuzzer reaches the accepted path often).
#![no_main]

use fuzz_support::{Input, NAMES, build_query, shape_reply, upstream_reply};
use libfuzzer_sys::fuzz_target;
use localdns_fallback::wire;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let name = NAMES[usize::from(input.u8()) % NAMES.len()];
    let (ours, theirs) = (input.u32(), input.u32());
    let qtype = input.u16();
    let edns = input.u8() & 1 == 1;
    let sent_id = input.u16();
    let sent = build_query(sent_id, name, ours, qtype, edns.then_some((1232, false)));
    let client = build_query(!sent_id, name, theirs, qtype, edns.then_some((1232, false)));
    let q = wire::parse_query(&sent).expect("built queries parse");
    let reply = if input.u8() & 1 == 0 {
        input.rest().to_vec()
    } else {
        shape_reply(&sent, &mut input)
    };
    upstream_reply(
        &reply,
        sent_id,
        q.question(&sent),
        q.question(&client),
        edns,
    );
});
