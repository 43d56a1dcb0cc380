//! What each asker is sent: an upstream's (or the cache's) reply made into the answer to that
//! asker's own query, and the query sent upstream. Pure functions over bytes, used by the engine
//! for every delivery (fresh replies, cache hits, stale answers, coalesced followers) and for
//! every query it forwards.
//!
//! A reply may have been fetched for another client (coalescing) or long ago (the cache), so
//! everything in it that belongs to the asker rather than to the answer is the asker's own:
//! - its ID and spelling of the question;
//! - RD and CD as it asked; AD only if the upstream vouched and the asker showed it understands
//!   AD (AD or DO in its query, RFC 6840 §5.8);
//! - an OPT record only if it sent one, with its own DO bit (RFC 3225), the upstream's size,
//!   extended RCODE and version, never a COOKIE (RFC 7873: one client's secret with one server)
//!   and ECS only for a query that carried ECS (those are never shared, see `cache::Key::new`);
//! - at most as many bytes as it can take, cut at record boundaries (TC set when answer or
//!   authority records had to go), never to an empty TC reply when records fit.

use crate::wire::{self, Query};

/// Writes into `out` the answer to the asker's `query` (parsed as `q`) built from `reply`, at
/// most `limit` bytes. `_scratch` is working space the caller keeps for reuse.
pub fn for_asker(
    reply: &[u8],
    query: &[u8],
    q: &Query,
    limit: usize,
    out: &mut Vec<u8>,
    _scratch: &mut Vec<u8>,
) {
    let question = q.question(query);
    out.clear();
    match wire::layout(reply) {
        Some(layout)
            if layout.counts[0] != 1
                || layout.question_end == wire::HEADER_LEN + question.len() =>
        {
            out.extend_from_slice(&reply[..wire::HEADER_LEN]);
            if layout.counts[0] == 1 {
                out.extend_from_slice(question);
            } else {
                out.extend_from_slice(&reply[wire::HEADER_LEN..layout.question_end]);
            }
            // Records after the OPT record are left out: only TSIG and SIG(0) go there, and
            // they sign the upstream's exchange, not the asker's.
            let body_end = layout.opt.map_or(layout.records_end, |opt| opt.start);
            out.extend_from_slice(&reply[layout.question_end..body_end]);
            let mut additional = layout.additional_before_opt;
            if let (true, Some(opt)) = (q.edns, &layout.opt) {
                wire::push_reply_opt(reply, opt, q.dnssec_ok, q.ecs, out);
                additional += 1;
            }
            out[10..12].copy_from_slice(&additional.to_be_bytes());
        }
        _ => {
            // A reply that cannot be walked goes on as it came but for the asker's header
            // fields; cut to fit, nothing of it is kept.
            out.extend_from_slice(reply);
            if out.len() < wire::HEADER_LEN {
                return;
            }
            wire::restore_for_client(out, q.id, question);
        }
    }
    wire::set_id(out, q.id);
    wire::set_asker_flags(out, query, q);
    wire::truncate(out, limit);
}

/// Writes into `out` the query to send upstream for the asker's `query`, with the try's `id`:
/// see [`wire::upstream_query`].
pub fn upstream_query(query: &[u8], q: &Query, id: u16, out: &mut Vec<u8>) {
    wire::upstream_query(query, q, id, out);
}
