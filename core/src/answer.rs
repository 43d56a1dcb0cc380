//! What each asker is sent: an upstream's (or the cache's) reply made into the answer to that
//! asker's own query. Pure functions over bytes, used by the engine for every delivery (fresh
//! replies, cache hits, stale answers, coalesced followers); the query sent upstream is
//! [`wire::upstream_query`]'s.
//!
//! A reply may have been fetched for another client (coalescing) or long ago (the cache), so
//! everything in it that belongs to the asker rather than to the answer is the asker's own:
//! - its ID and spelling of the question;
//! - RD and CD as it asked; AD only if the upstream vouched and the asker showed it understands
//!   AD (AD or DO in its query, RFC 6840 §5.8);
//! - an OPT record only if it sent one, with its own DO bit (RFC 3225), the upstream's size,
//!   extended RCODE and version, never a COOKIE (RFC 7873: one client's secret with one server),
//!   ECS only for a query that carried ECS (those are never shared, see `cache::Key::new`), and
//!   our NSID, never the upstream's, only for a query that asked (RFC 5001);
//! - at most as many bytes as it can take, cut at record boundaries (TC set when answer or
//!   authority records had to go), never to an empty TC reply when records fit.

use crate::wire::{self, Query};

/// Writes into `out` the answer to the asker's `query` (parsed as `q`) built from `reply`, at
/// most `limit` bytes.
pub fn for_asker(reply: &[u8], query: &[u8], q: &Query, limit: usize, out: &mut Vec<u8>) {
    let question = q.question(query);
    let question_end = wire::HEADER_LEN + question.len();
    out.clear();
    let counts = wire::counts(reply);
    // The common shape, no additional records (nor an OPT record): nothing to walk unless it
    // must be cut, or the asker wants our NSID.
    if counts[0] == 1 && counts[3] == 0 && reply.len() >= question_end && !q.nsid {
        out.extend_from_slice(&reply[..wire::HEADER_LEN]);
        out.extend_from_slice(question);
        out.extend_from_slice(&reply[question_end..]);
        finish(out, query, q, limit, question_end);
        return;
    }
    match wire::layout(reply) {
        Some(layout) if counts[0] != 1 || layout.question_end == question_end => {
            out.extend_from_slice(&reply[..wire::HEADER_LEN]);
            if counts[0] == 1 {
                out.extend_from_slice(question);
            } else {
                out.extend_from_slice(&reply[wire::HEADER_LEN..layout.question_end]);
            }
            // Records after the OPT record are left out: only TSIG and SIG(0) go there, and
            // they sign the upstream's exchange, not the asker's.
            let body_end = layout.opt.map_or(layout.records_end, |opt| opt.start);
            out.extend_from_slice(&reply[layout.question_end..body_end]);
            let mut additional = layout.additional_before_opt;
            let mut opt_start = None;
            if q.edns && (layout.opt.is_some() || q.nsid) {
                opt_start = Some(out.len());
                match &layout.opt {
                    Some(opt) => wire::push_reply_opt(reply, opt, q.dnssec_ok, q.ecs, q.nsid, out),
                    None => wire::push_opt(out, q),
                }
                additional += 1;
            }
            out[10..12].copy_from_slice(&additional.to_be_bytes());
            wire::set_id(out, q.id);
            wire::set_asker_flags(out, query, q);
            wire::cut_records(out, limit, layout.question_end, opt_start, true);
        }
        _ => {
            // A reply that cannot be walked goes on as it came but for the asker's header
            // fields; cut to fit, nothing of it is kept.
            out.extend_from_slice(reply);
            if out.len() < wire::HEADER_LEN {
                return;
            }
            wire::restore_for_client(out, q.id, question);
            wire::set_asker_flags(out, query, q);
            wire::truncate(out, limit);
        }
    }
}

/// The asker's header bits, then the cut to its limit, for an answer without an OPT record.
fn finish(out: &mut Vec<u8>, query: &[u8], q: &Query, limit: usize, question_end: usize) {
    wire::set_id(out, q.id);
    wire::set_asker_flags(out, query, q);
    if out.len() > limit {
        wire::cut_records(out, limit, question_end, None, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::option;
    use crate::wire::tests::{a_records, hickory, opt, query_with, reply_with};
    use hickory_proto::rr::rdata::opt::EdnsCode;

    fn answer(reply: &[u8], query: &[u8], limit: usize) -> Vec<u8> {
        let q = wire::parse_query(query).unwrap();
        let mut out = Vec::new();
        for_asker(reply, query, &q, limit, &mut out);
        out
    }

    #[test]
    fn a_shared_reply_gets_the_askers_id_spelling_and_flags() {
        // Filled by a DO, RD=0 asker with a cookie; the upstream set AD and sent ECS and COOKIE.
        let cookie: &[u8] = &[9; 24];
        let ecs: &[u8] = &[0, 1, 24, 24, 192, 0, 2];
        let first = query_with("www.example", 1, [0, 0], Some(&opt(1232, true, &[])));
        let upstream_opt = opt(1232, true, &[(option::COOKIE, cookie), (option::ECS, ecs)]);
        let reply = reply_with(&first, 0x80 | 0x20, &a_records(3), Some(&upstream_opt));
        // A later asker: RD=1, CD=1, no AD, no DO, another spelling.
        let later = query_with("WWW.Example", 1, [1, 0x10], Some(&opt(4096, false, &[])));
        let a = answer(&reply, &later, 4096);
        let m = hickory(&a);
        assert_eq!(m.id(), 0x4242);
        assert_eq!(&a[12..29], &later[12..29], "its spelling");
        assert!(m.recursion_desired() && m.checking_disabled());
        assert!(!m.authentic_data(), "it showed no sign of understanding AD");
        let edns = m.extensions().as_ref().unwrap();
        assert!(!edns.flags().dnssec_ok, "its own DO");
        assert!(edns.option(EdnsCode::Cookie).is_none());
        assert!(edns.option(EdnsCode::Subnet).is_none());
        assert_eq!(m.answers().len(), 3);
        // The same reply to an asker without EDNS: no OPT at all.
        let plain = query_with("www.example", 1, [1, 0x20], None);
        let a = answer(&reply, &plain, 512);
        let m = hickory(&a);
        assert!(m.extensions().is_none() && m.additionals().is_empty());
        assert!(m.authentic_data(), "AD in its query");
        assert_eq!(m.answers().len(), 3);
    }

    #[test]
    fn an_ecs_asker_keeps_its_ecs_and_the_edns_version_comes_from_the_upstream() {
        let ecs: &[u8] = &[0, 1, 24, 24, 192, 0, 2];
        let asker = query_with(
            "a.example",
            1,
            [1, 0],
            Some(&opt(1232, false, &[(option::ECS, ecs)])),
        );
        let reply = reply_with(
            &asker,
            0x80,
            &a_records(1),
            Some(&opt(1232, false, &[(option::ECS, ecs)])),
        );
        let m = hickory(&answer(&reply, &asker, 1232));
        assert!(
            m.extensions()
                .as_ref()
                .unwrap()
                .option(EdnsCode::Subnet)
                .is_some()
        );
        // BADVERS to a version 1 query: extended RCODE and version as the upstream sent them.
        let mut v1 = opt(1232, false, &[]);
        v1.version = 1;
        let asker = query_with("a.example", 1, [1, 0], Some(&v1));
        let mut badvers = opt(1232, false, &[]);
        badvers.ext_rcode = 1;
        let reply = reply_with(&asker, 0x80, &[], Some(&badvers));
        let a = answer(&reply, &asker, 1232);
        let m = hickory(&a);
        let edns = m.extensions().as_ref().unwrap();
        assert_eq!((edns.rcode_high(), edns.version()), (1, 0));
    }

    #[test]
    fn a_big_cached_answer_is_cut_to_records_not_emptied() {
        // Filled over TCP: 40 A records; now asked over UDP without EDNS (musl, glibc).
        let tcp = query_with("svc.example", 1, [1, 0], None);
        let full = reply_with(&tcp, 0x80, &a_records(40), None);
        let udp = query_with("SVC.example", 1, [1, 0], None);
        let a = answer(&full, &udp, 512);
        assert!(a.len() <= 512);
        let m = hickory(&a);
        assert!(m.truncated());
        assert_eq!(m.answers().len(), (512 - 12 - 17) / 16);
        // Over TCP (limit 65535) it goes whole.
        let m = hickory(&answer(&full, &udp, 65535));
        assert!(!m.truncated() && m.answers().len() == 40);
    }

    #[test]
    fn records_after_the_opt_are_left_out_and_bad_replies_still_get_the_askers_header() {
        let asker = query_with("a.example", 1, [1, 0], Some(&opt(1232, false, &[])));
        let mut reply = reply_with(&asker, 0x80, &a_records(1), Some(&opt(1232, false, &[])));
        // A TSIG-like record after the OPT.
        reply[11] = 2;
        reply.extend_from_slice(&[0, 0, 250, 0, 255, 0, 0, 0, 0, 0, 2, 1, 2]);
        let m = hickory(&answer(&reply, &asker, 1232));
        assert_eq!((m.answers().len(), m.additionals().len()), (1, 0));
        assert!(m.extensions().is_some());
        // A reply whose records do not parse: passed on with the asker's ID and question.
        let mut bad = reply_with(&asker, 0x80, &a_records(1), None);
        bad[7] = 5;
        let a = answer(&bad, &asker, 1232);
        assert_eq!(wire::id(&a), 0x4242);
        assert_eq!(a.len(), bad.len());
        // ... and cut to the records that parse if too big.
        bad.extend_from_slice(&[0; 600]);
        bad[6] = 1; // 261 records: more than the bytes hold
        let a = answer(&bad, &asker, 512);
        assert!(wire::is_truncated(&a) && a.len() <= 512);
        hickory(&a);
    }
}
