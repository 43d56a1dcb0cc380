//! What each asker is sent: an upstream's (or the cache's) reply made into the answer to that
//! asker's own query. Pure functions over bytes, used by the engine for every delivery and for
//! every query it forwards.

use crate::wire::{self, Query};

/// Writes into `out` the answer to the asker's `query` (parsed as `q`) built from `reply`: the
/// asker's ID and spelling of the question, cut to fit `limit` bytes. `scratch` is working
/// space.
pub fn for_asker(
    reply: &[u8],
    query: &[u8],
    q: &Query,
    limit: usize,
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) {
    let question = q.question(query);
    out.clear();
    out.extend_from_slice(reply);
    wire::restore_for_client(out, q.id, question);
    if out.len() > limit {
        std::mem::swap(out, scratch);
        wire::truncate_reply(scratch, question.len(), q.edns, out);
    }
}

/// Writes into `out` the query to send upstream for the asker's `query`, with the try's `id`.
pub fn upstream_query(query: &[u8], _q: &Query, id: u16, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(query);
    wire::set_id(out, id);
}
