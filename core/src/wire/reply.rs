//! Shaping a reply for one asker: where its records and OPT sit, the asker's header bits and
//! OPT, cutting at record boundaries, and the query sent upstream. Part of [`crate::wire`], which
//! re-exports all of it; it uses wire's private record walkers.

use super::*;

/// The OPT record of a reply: where it lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptRecord {
    pub start: usize,
    /// Start of its RDATA (the options); it ends at `end`.
    pub rdata: usize,
    pub end: usize,
}

/// Where the parts of a reply lie: what each asker's answer is cut from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// End of the question section (the header's end when there is none).
    pub question_end: usize,
    /// The first OPT record of the additional section.
    pub opt: Option<OptRecord>,
    /// Additional records before that OPT record (all of them without one).
    pub additional_before_opt: u16,
    /// End of the last record.
    pub records_end: usize,
}

/// Walks a reply's sections; `None` if any part is malformed or cut short.
pub fn layout(p: &[u8]) -> Option<Layout> {
    let question_end = questions_end(p)?;
    let (mut opt, mut additional_before_opt) = (None, 0);
    let records_end = walk(p, question_end, |section, start, rr| {
        if section == Section::Additional && opt.is_none() {
            if rr.rtype == TYPE_OPT {
                let (rdata, end) = (rr.rdata, rr.end);
                opt = Some(OptRecord { start, rdata, end });
            } else {
                additional_before_opt += 1;
            }
        }
        Some(())
    })?;
    Some(Layout {
        question_end,
        opt,
        additional_before_opt,
        records_end,
    })
}

/// Sets the header bits that are the asker's own in a reply made for it (RFC 1035 §4.1.1,
/// RFC 6840 §5.7-5.8): RD and CD as it asked, AD only if the upstream set it and the asker
/// showed it understands AD (AD or DO set in its query).
pub fn set_asker_flags(reply: &mut [u8], query: &[u8], q: &Query) {
    reply[2] = (reply[2] & !RD) | (query[2] & RD);
    let ad = reply[3] & AD != 0 && (query[3] & AD != 0 || q.dnssec_ok);
    reply[3] = (reply[3] & !(AD | CD)) | (query[3] & CD) | if ad { AD } else { 0 };
}

/// Appends the reply's OPT record as the asker is to see it: the upstream's UDP size, extended
/// RCODE, version and flags, but the asker's DO bit; its options without COOKIE (a secret
/// between one client and one server: never an upstream's to pass on), without ECS unless
/// `keep_ecs` (an ECS answer is for the subnet of the client that asked), and with our NSID
/// instead of the upstream's, if `nsid` (the asker asked).
pub fn push_reply_opt(
    p: &[u8],
    opt: &OptRecord,
    dnssec_ok: bool,
    keep_ecs: bool,
    nsid: bool,
    out: &mut Vec<u8>,
) {
    let fixed = opt.rdata - 10;
    out.push(0);
    out.extend_from_slice(&p[fixed..fixed + 6]); // type, UDP size, extended RCODE, version
    out.push((p[fixed + 6] & !DO) | if dnssec_ok { DO } else { 0 });
    out.push(p[fixed + 7]);
    let len_at = out.len();
    out.extend_from_slice(&[0, 0]);
    push_options(out, &p[opt.rdata..opt.end], len_at, |code| {
        code != option::COOKIE && code != option::NSID && (code != option::ECS || keep_ecs)
    });
    push_nsid(out, nsid, len_at);
}

/// Does the reply's OPT record carry a COOKIE or ECS option (that no other asker may see)?
pub fn has_private_options(p: &[u8], opt: &OptRecord) -> bool {
    let mut found = false;
    let _ = for_each_option(&p[opt.rdata..opt.end], |code, _| {
        found = code == option::COOKIE || code == option::ECS;
        !found
    });
    found
}

/// Cuts `reply` (an answer already made for its asker, OPT last if any) down to `limit` bytes at
/// record boundaries, as CoreDNS does (miekg/dns `Truncate`): whole records are kept in order
/// (answer, then authority, then additional) while they fit, the OPT record is kept, and TC is
/// set when an answer or authority record had to go (RFC 2181 §9: leaving out additional
/// records alone is no reason for TC). A client that never retries over TCP (musl before
/// 1.2.4) still gets every record that fits.
pub fn truncate(reply: &mut Vec<u8>, limit: usize) {
    if reply.len() <= limit || reply.len() < HEADER_LEN {
        return;
    }
    // A question that does not parse is dropped.
    let question_end = questions_end(reply).unwrap_or_else(|| {
        reply[4..6].fill(0);
        HEADER_LEN
    });
    // Find the trailing OPT record (the last record, if in the additional section); a walk that
    // fails keeps no record.
    let mut opt_start = None;
    let walked = walk(reply, question_end, |section, start, rr| {
        opt_start = (section == Section::Additional && rr.rtype == TYPE_OPT).then_some(start);
        Some(())
    });
    cut_records(reply, limit, question_end, opt_start, walked.is_some());
}

/// [`truncate`] for a caller that knows where the question ends and whether the last record
/// (ending the message) is an OPT record: `walkable` says the records parse.
pub fn cut_records(
    reply: &mut Vec<u8>,
    limit: usize,
    question_end: usize,
    opt_start: Option<usize>,
    walkable: bool,
) {
    if reply.len() <= limit {
        return;
    }
    let [_, an, ns, ar] = counts(reply);
    let (opt_start, mut opt_len) = match opt_start {
        Some(start) if walkable => (start, reply.len() - start),
        _ => (0, 0),
    };
    // An OPT whose options alone would not fit keeps its fixed part only.
    if opt_len > 0 && question_end + opt_len > limit {
        reply[opt_start + 9..opt_start + 11].fill(0);
        opt_len = 11;
    }
    let budget = limit.saturating_sub(opt_len);
    let total = usize::from(an) + usize::from(ns) + usize::from(ar);
    let records = if walkable {
        total - usize::from(opt_len > 0)
    } else {
        0
    };
    let (mut cut, mut kept) = (question_end, 0usize);
    while kept < records {
        let Some(rr) = resource_record(reply, cut) else {
            break;
        };
        if rr.end > budget {
            break;
        }
        cut = rr.end;
        kept += 1;
    }
    if opt_len > 0 {
        reply.copy_within(opt_start..opt_start + opt_len, cut);
    }
    reply.truncate(cut + opt_len);
    let kept_an = kept.min(usize::from(an));
    let kept_ns = (kept - kept_an).min(usize::from(ns));
    let kept_ar = kept - kept_an - kept_ns + usize::from(opt_len > 0);
    if kept_an < usize::from(an) || kept_ns < usize::from(ns) {
        reply[2] |= TC;
    }
    reply[6..8].copy_from_slice(&(kept_an as u16).to_be_bytes());
    reply[8..10].copy_from_slice(&(kept_ns as u16).to_be_bytes());
    reply[10..12].copy_from_slice(&(kept_ar as u16).to_be_bytes());
}

/// Writes into `out` the query to send upstream: the client's, with the try's ID; with EDNS, its
/// OPT record advertising [`UPSTREAM_EDNS_SIZE`] (the upstream leg never needs IP fragments,
/// and one answer of up to that size serves every asker of the name) and without a COOKIE
/// option (the client's cookie is for us, its server, and a coalesced query speaks for many
/// clients). Queries without EDNS go as they came: the upstream decides how to fit 512 bytes.
pub fn upstream_query(query: &[u8], q: &Query, id: u16, out: &mut Vec<u8>) {
    out.clear();
    let fixed = q.edns.then(|| skip_name(query, q.opt_start)).flatten();
    match fixed {
        Some(fixed) if q.cookie => {
            let rdata = fixed + 10;
            out.extend_from_slice(&query[..rdata]);
            let options = &query[rdata..q.opt_end];
            push_options(out, options, rdata - 2, |code| code != option::COOKIE);
            out.extend_from_slice(&query[q.opt_end..]);
        }
        _ => out.extend_from_slice(query),
    }
    if let Some(fixed) = fixed {
        out[fixed + 2..fixed + 4].copy_from_slice(&UPSTREAM_EDNS_SIZE.to_be_bytes());
    }
    set_id(out, id);
}
