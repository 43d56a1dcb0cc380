//! DNS wire-format helpers that work on packet bytes without building a message.
//!
//! The forwarder only needs a few facts about a packet (ID, flags, the question, the client's EDNS
//! size) and a few edits (ID, question case, truncation). Doing those on the bytes keeps the relay
//! free of allocations and makes every rule here a pure function that the unit tests and fuzzers
//! can hammer without a network.

mod reply;
pub use reply::{
    Layout, OptRecord, cut_records, has_private_options, layout, push_reply_opt, set_asker_flags,
    truncate, upstream_query,
};

/// A DNS header is always 12 bytes.
pub const HEADER_LEN: usize = 12;
/// What a client may receive over UDP when it does not advertise more (RFC 1035 §4.2.1).
pub const CLASSIC_UDP_SIZE: u16 = 512;
/// The largest query we take. Stub resolvers send a few hundred bytes at most (EDNS padding
/// rounds to 468); each query in flight keeps its bytes, so a cap here is what bounds that
/// memory when someone sends 64 KiB ones.
pub const MAX_QUERY: usize = 4096;
/// The UDP payload size we advertise in replies we build ourselves (the DNS flag day 2020 value).
pub const OUR_EDNS_SIZE: u16 = 1232;
/// Names are at most 255 octets on the wire, root label included (RFC 1035 §3.1).
const MAX_NAME_LEN: usize = 255;
const TYPE_OPT: u16 = 41;
/// The most a query sent upstream advertises (the DNS flag day 2020 value): larger UDP replies
/// may be fragmented, and fragments are lost or forged more easily than whole datagrams.
pub const UPSTREAM_EDNS_SIZE: u16 = 1232;

/// EDNS option codes the forwarder looks at.
pub mod option {
    /// Name Server Identifier (RFC 5001): which server answered; ours, never an upstream's.
    pub const NSID: u16 = 3;
    /// EDNS Client Subnet (RFC 7871): the answer may be for the client's subnet only.
    pub const ECS: u16 = 8;
    /// DNS COOKIE (RFC 7873): a secret between one client and one server.
    pub const COOKIE: u16 = 10;
    /// edns-tcp-keepalive (RFC 7828): about the connection, not the answer.
    pub const KEEPALIVE: u16 = 11;
    /// Padding (RFC 7830): no meaning.
    pub const PADDING: u16 = 12;
}

/// Response codes we emit or test for.
pub mod rcode {
    pub const NOERROR: u8 = 0;
    pub const FORMERR: u8 = 1;
    pub const SERVFAIL: u8 = 2;
    pub const NXDOMAIN: u8 = 3;
    pub const NOTIMP: u8 = 4;
    pub const REFUSED: u8 = 5;
}

const QR: u8 = 0x80;
const TC: u8 = 0x02;
const RD: u8 = 0x01;
const RA: u8 = 0x80;
const AD: u8 = 0x20;
const CD: u8 = 0x10;
/// The DO bit in the OPT record's flags (the high byte of its TTL's low half).
const DO: u8 = 0x80;
const AA: u8 = 0x04;
/// What a query asking for NSID gets back: who answered, as LocalDNS's `nsid localdns` says it.
pub const NSID: &[u8] = b"localdns-fallback";

pub fn id(p: &[u8]) -> u16 {
    u16::from_be_bytes([p[0], p[1]])
}

pub fn set_id(p: &mut [u8], id: u16) {
    p[..2].copy_from_slice(&id.to_be_bytes());
}

fn u16_at(p: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*p.get(at)?, *p.get(at + 1)?]))
}

pub fn is_response(p: &[u8]) -> bool {
    p[2] & QR != 0
}

pub fn is_truncated(p: &[u8]) -> bool {
    p[2] & TC != 0
}

pub fn rcode(p: &[u8]) -> u8 {
    p[3] & 0x0f
}

fn opcode(p: &[u8]) -> u8 {
    (p[2] >> 3) & 0x0f
}

/// QDCOUNT, ANCOUNT, NSCOUNT and ARCOUNT: how many records the message says each section holds.
#[inline]
pub fn counts(p: &[u8]) -> [u16; 4] {
    std::array::from_fn(|i| u16::from_be_bytes([p[4 + 2 * i], p[5 + 2 * i]]))
}

/// What the forwarder needs to know about a client's query. Offsets index the query bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// End of the question name (after its root label); the name is `12..name_end`.
    pub name_end: usize,
    /// End of the question (after QTYPE and QCLASS); the question is `12..question_end`.
    pub question_end: usize,
    pub qtype: u16,
    pub qclass: u16,
    /// Did the client send an OPT record (EDNS0)?
    pub edns: bool,
    /// The largest UDP reply the client accepts: its EDNS size, never less than 512.
    pub udp_size: u16,
    /// The DO bit of the client's OPT record (it wants DNSSEC records).
    pub dnssec_ok: bool,
    /// Where the client's OPT record lies in the query (`opt_start..opt_end`; both 0 without).
    pub opt_start: usize,
    pub opt_end: usize,
    /// The EDNS version the client asked for (0 without EDNS).
    pub edns_version: u8,
    /// The OPT record carries a COOKIE option (RFC 7873).
    pub cookie: bool,
    /// The OPT record carries ECS (RFC 7871).
    pub ecs: bool,
    /// The OPT record asks for our NSID (RFC 5001).
    pub nsid: bool,
    /// The OPT record carries an option other than COOKIE, NSID, padding and keepalive, or
    /// options that do not parse: something that may change the answer (ECS, unknown ones).
    pub answer_options: bool,
}

impl Query {
    pub fn name<'a>(&self, packet: &'a [u8]) -> &'a [u8] {
        &packet[HEADER_LEN..self.name_end]
    }

    pub fn question<'a>(&self, packet: &'a [u8]) -> &'a [u8] {
        &packet[HEADER_LEN..self.question_end]
    }
}

/// Why a client's packet is not forwarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    /// Not worth a reply: too short to carry an ID, or response-shaped (replying to a response is how
    /// forwarding loops and reflection start).
    Drop,
    /// Answer with this RCODE (FORMERR for malformed queries, NOTIMP for other opcodes).
    Reply(u8),
}

/// Checks a client's packet and finds its question and EDNS size.
pub fn parse_query(p: &[u8]) -> Result<Query, Reject> {
    if p.len() < HEADER_LEN || is_response(p) {
        return Err(Reject::Drop);
    }
    if p.len() > MAX_QUERY {
        return Err(Reject::Reply(rcode::FORMERR));
    }
    if opcode(p) != 0 {
        return Err(Reject::Reply(rcode::NOTIMP));
    }
    if counts(p)[0] != 1 {
        return Err(Reject::Reply(rcode::FORMERR));
    }
    let formerr = Reject::Reply(rcode::FORMERR);
    let name_end = question_name_end(p, HEADER_LEN).ok_or(formerr)?;
    let qtype = u16_at(p, name_end).ok_or(formerr)?;
    let qclass = u16_at(p, name_end + 2).ok_or(formerr)?;
    let question_end = name_end + 4;
    // Without an OPT record: no EDNS, no options, the classic size.
    let mut query = Query {
        id: id(p),
        name_end,
        question_end,
        qtype,
        qclass,
        udp_size: CLASSIC_UDP_SIZE,
        ..Query::default()
    };
    // Queries rarely carry answer or authority records, but they may (e.g. known-answer hints);
    // walk them so the OPT record in the additional section is found where it really is.
    walk(p, question_end, |section, at, rr| {
        if rr.rtype == TYPE_OPT {
            if section != Section::Additional || query.edns {
                return None;
            }
            query.edns = true;
            query.udp_size = rr.class.max(CLASSIC_UDP_SIZE);
            query.dnssec_ok = rr.ttl & 0x8000 != 0;
            query.edns_version = (rr.ttl >> 16) as u8;
            query.opt_start = at;
            query.opt_end = rr.end;
            // Options that do not parse are the upstream's to judge; they only keep the
            // query out of the cache.
            let parsed = for_each_option(&p[rr.rdata..rr.end], |code, _| {
                match code {
                    option::COOKIE => query.cookie = true,
                    option::NSID => query.nsid = true,
                    option::PADDING | option::KEEPALIVE => {}
                    option::ECS => {
                        query.ecs = true;
                        query.answer_options = true;
                    }
                    _ => query.answer_options = true,
                }
                true
            });
            if parsed.is_none() {
                query.answer_options = true;
            }
        }
        Some(())
    })
    .ok_or(formerr)?;
    Ok(query)
}

struct ResourceRecord {
    rtype: u16,
    class: u16,
    ttl: u32,
    ttl_offset: usize,
    /// Where the RDATA starts; it ends at `end`.
    rdata: usize,
    end: usize,
}

/// Calls `f(code, data)` for each option of an OPT record's RDATA until it returns false.
/// `None` if the options do not parse (a length running past the end).
fn for_each_option(mut rdata: &[u8], mut f: impl FnMut(u16, &[u8]) -> bool) -> Option<()> {
    while !rdata.is_empty() {
        let code = u16_at(rdata, 0)?;
        let len = usize::from(u16_at(rdata, 2)?);
        let data = rdata.get(4..4 + len)?;
        if !f(code, data) {
            return Some(());
        }
        rdata = &rdata[4 + len..];
    }
    Some(())
}

/// Calls `f(section, start, record)` for each record of message `p`, the first starting at `at`
/// (where its questions end), and gives the end of the last; `None` if a record is malformed or
/// cut short, or `f` says so. Inlined: as a call it cost every query's parse (which walks no
/// record unless the query has EDNS) about 70 instructions.
#[inline(always)]
fn walk(
    p: &[u8],
    mut at: usize,
    mut f: impl FnMut(Section, usize, &ResourceRecord) -> Option<()>,
) -> Option<usize> {
    let [_, an, ns, ar] = counts(p).map(usize::from);
    for index in 0..an + ns + ar {
        let rr = resource_record(p, at)?;
        let section = match index {
            i if i < an => Section::Answer,
            i if i < an + ns => Section::Authority,
            _ => Section::Additional,
        };
        f(section, at, &rr)?;
        at = rr.end;
    }
    Some(at)
}

/// Appends the options of an OPT record's RDATA that `keep` keeps, and sets the RDLENGTH at
/// `len_at` to all that follows it. Options that do not parse end the list: what came before them
/// is kept.
fn push_options(out: &mut Vec<u8>, rdata: &[u8], len_at: usize, keep: impl Fn(u16) -> bool) {
    let _ = for_each_option(rdata, |code, data| {
        if keep(code) {
            out.extend_from_slice(&code.to_be_bytes());
            out.extend_from_slice(&(data.len() as u16).to_be_bytes());
            out.extend_from_slice(data);
        }
        true
    });
    let len = (out.len() - len_at - 2) as u16;
    out[len_at..len_at + 2].copy_from_slice(&len.to_be_bytes());
}

fn resource_record(p: &[u8], at: usize) -> Option<ResourceRecord> {
    let fixed = skip_name(p, at)?;
    // One bounds check for the fixed part: this runs for every record of every answer.
    let f: &[u8; 10] = p.get(fixed..fixed + 10)?.try_into().ok()?;
    let rdlen = usize::from(u16::from_be_bytes([f[8], f[9]]));
    let end = fixed + 10 + rdlen;
    (end <= p.len()).then_some(ResourceRecord {
        rtype: u16::from_be_bytes([f[0], f[1]]),
        class: u16::from_be_bytes([f[2], f[3]]),
        ttl: u32::from_be_bytes([f[4], f[5], f[6], f[7]]),
        ttl_offset: fixed + 4,
        rdata: fixed + 10,
        end,
    })
}

/// Which section of a message a record is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    Answer,
    Authority,
    Additional,
}

/// What the cache needs to know of each record of a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub section: Section,
    pub rtype: u16,
    pub ttl: u32,
    /// Where the TTL sits in the message.
    pub ttl_offset: usize,
    /// For an SOA record, its MINIMUM field (the negative-caching TTL, RFC 2308).
    pub soa_minimum: Option<u32>,
}

/// Walks every record of a message; `None` if any part is malformed or cut short.
pub fn records(p: &[u8]) -> Option<Vec<Record>> {
    let question_end = questions_end(p)?;
    let mut out = Vec::with_capacity(counts(p)[1..].iter().map(|&n| usize::from(n)).sum());
    walk(p, question_end, |section, _, rr| {
        // SOA RDATA ends with SERIAL, REFRESH, RETRY, EXPIRE, MINIMUM (RFC 1035 §3.3.13).
        let soa_minimum = (rr.rtype == 6 && rr.end >= rr.ttl_offset + 6 + 20).then(|| {
            u32::from_be_bytes([p[rr.end - 4], p[rr.end - 3], p[rr.end - 2], p[rr.end - 1]])
        });
        out.push(Record {
            section,
            rtype: rr.rtype,
            ttl: rr.ttl,
            ttl_offset: rr.ttl_offset,
            soa_minimum,
        });
        Some(())
    })?;
    Some(out)
}

/// End of the question section of a message; `None` if it is cut short.
fn questions_end(p: &[u8]) -> Option<usize> {
    let mut at = HEADER_LEN;
    for _ in 0..counts(p.get(..HEADER_LEN)?)[0] {
        at = skip_name(p, at)? + 4;
    }
    (at <= p.len()).then_some(at)
}

/// End of an uncompressed name starting at `at`. Question names never need compression (nothing
/// precedes them to point at), so a pointer there marks the packet as malformed.
pub fn question_name_end(p: &[u8], mut at: usize) -> Option<usize> {
    let start = at;
    loop {
        let len = *p.get(at)? as usize;
        if len == 0 {
            return (at + 1 - start <= MAX_NAME_LEN).then_some(at + 1);
        }
        if len > 63 {
            return None;
        }
        at += 1 + len;
        if at - start >= MAX_NAME_LEN {
            return None;
        }
    }
}

/// Skips a possibly compressed name without following pointers (the pointer ends the name).
fn skip_name(p: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *p.get(at)?;
        match len & 0xc0 {
            0x00 if len == 0 => return Some(at + 1),
            0x00 => at += 1 + len as usize,
            0xc0 => return (at + 2 <= p.len()).then_some(at + 2),
            _ => return None,
        }
    }
}

/// Is `reply` an acceptable answer to the query we sent with `sent_id` and `question`?
///
/// The caller has already checked that it came from the exact upstream address the query went to.
/// The question must match case-insensitively (upstreams may change the case); an error reply with
/// no question at all (FORMERR, BADVERS from servers that choke on our query) is accepted on the ID
/// alone when it carries no records that could poison anything.
pub fn reply_matches(reply: &[u8], sent_id: u16, question: &[u8]) -> bool {
    if reply.len() < HEADER_LEN || !is_response(reply) || id(reply) != sent_id {
        return false;
    }
    let [qd, an, ns, _] = counts(reply);
    match qd {
        0 => an == 0 && ns == 0,
        1 => {
            let Some(theirs) = reply.get(HEADER_LEN..HEADER_LEN + question.len()) else {
                return false;
            };
            // Label-length octets are at most 63, so they are never ASCII letters and a
            // case-insensitive comparison of the name is exact for them; QTYPE/QCLASS must match
            // byte for byte (type 65 and 97 differ only in what would be the "case" bit).
            let name_len = question.len() - 4;
            theirs[..name_len].eq_ignore_ascii_case(&question[..name_len])
                && theirs[name_len..] == question[name_len..]
        }
        _ => false,
    }
}

/// Gives an accepted reply back the client's ID and the client's spelling of the question.
pub fn restore_for_client(reply: &mut [u8], client_id: u16, client_question: &[u8]) {
    set_id(reply, client_id);
    if counts(reply)[0] == 1 && reply.len() >= HEADER_LEN + client_question.len() {
        reply[HEADER_LEN..HEADER_LEN + client_question.len()].copy_from_slice(client_question);
    }
}

/// Appends an OPT record of our own: our UDP size, the asker's DO bit (RFC 3225: copied into
/// every reply), BADVERS for an asker that wanted an EDNS version we do not speak (RFC 6891
/// §6.1.3), and our NSID if it asked.
pub fn push_opt(out: &mut Vec<u8>, q: &Query) {
    out.push(0); // root owner name
    out.extend_from_slice(&TYPE_OPT.to_be_bytes());
    out.extend_from_slice(&OUR_EDNS_SIZE.to_be_bytes());
    let badvers = u8::from(q.edns_version != 0);
    let flags = if q.dnssec_ok { DO } else { 0 };
    out.extend_from_slice(&[badvers, 0, flags, 0, 0, 0]); // extended rcode, version, flags, rdlength
    let len_at = out.len() - 2;
    push_nsid(out, q.nsid, len_at);
}

/// Appends our NSID option to the OPT record whose RDLENGTH is at `len_at`, if `asked`.
fn push_nsid(out: &mut Vec<u8>, asked: bool, len_at: usize) {
    if asked {
        out.extend_from_slice(&option::NSID.to_be_bytes());
        out.extend_from_slice(&(NSID.len() as u16).to_be_bytes());
        out.extend_from_slice(NSID);
        let len = u16_at(out, len_at).unwrap_or(0) + 4 + NSID.len() as u16;
        out[len_at..len_at + 2].copy_from_slice(&len.to_be_bytes());
    }
}

/// Builds a reply of our own to a parsed query: its question, no records, the given RCODE, RD
/// and CD as asked, and an OPT record if it sent one (with its DO bit). To a query for an EDNS
/// version other than 0 it is BADVERS instead.
pub fn local_reply(query: &[u8], q: &Query, rcode: u8, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&query[..q.question_end]);
    out[2] = QR | (query[2] & (0x78 | RD)); // keep opcode and RD, clear AA/TC
    let rcode = if q.edns && q.edns_version != 0 {
        0
    } else {
        rcode
    };
    out[3] = RA | (query[3] & CD) | rcode;
    out[4..12].copy_from_slice(&[0, 1, 0, 0, 0, 0, 0, u8::from(q.edns)]);
    if q.edns {
        push_opt(out, q);
    }
}

/// Makes a reply of [`local_reply`] authoritative, with `count` answer records (`records`,
/// whole), cut to `limit` bytes; a BADVERS reply stays without.
pub fn add_answers(out: &mut Vec<u8>, q: &Query, records: &[u8], count: u16, limit: usize) {
    out[2] |= AA;
    if q.edns && q.edns_version != 0 {
        return;
    }
    out.splice(q.question_end..q.question_end, records.iter().copied());
    out[6..8].copy_from_slice(&count.to_be_bytes());
    let opt = q.edns.then_some(q.question_end + records.len());
    cut_records(out, limit, q.question_end, opt, true);
}

/// Builds an error reply to a packet whose question could not be parsed: header only.
pub fn header_only_reply(query: &[u8], rcode: u8, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&query[..HEADER_LEN]);
    out[2] = QR | (query[2] & (0x78 | RD));
    out[3] = RA | rcode;
    out[4..12].fill(0);
}

/// A query of our own, ID 0 (set per try), RD, one question for the wire-form `name` of type
/// `qtype` (one below 256) in class IN, no EDNS.
pub fn question(name: &[u8], qtype: u8) -> Vec<u8> {
    let header = [0, 0, RD, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    [&header[..], name, &[0, qtype, 0, 1]].concat()
}

/// Encodes a dotted name as lower-case wire labels, e.g. `cluster.local` → `\x07cluster\x05local\x00`.
pub fn encode_name(name: &str) -> Result<Vec<u8>, String> {
    let trimmed = name.trim_end_matches('.');
    let mut out = Vec::with_capacity(trimmed.len() + 2);
    if !trimmed.is_empty() {
        for label in trimmed.split('.') {
            if label.is_empty() || label.len() > 63 {
                return Err(format!(
                    "{name:?} is not a valid domain name (empty label or label over 63 bytes)"
                ));
            }
            out.push(label.len() as u8);
            out.extend(label.bytes().map(|b| b.to_ascii_lowercase()));
        }
    }
    out.push(0);
    if out.len() > MAX_NAME_LEN {
        return Err(format!("{name:?} is longer than 255 bytes on the wire"));
    }
    Ok(out)
}

/// Counts the labels of `name` in front of the lower-case wire name `zone`, if `name` is equal to
/// or below `zone` (`is_some()`: whether it is).
pub fn labels_below(name: &[u8], zone: &[u8]) -> Option<usize> {
    let mut at = 0;
    let mut labels = 0;
    loop {
        if name.len() - at == zone.len() && name[at..].eq_ignore_ascii_case(zone) {
            return Some(labels);
        }
        match name.get(at) {
            Some(&len) if len != 0 => at += 1 + len as usize,
            _ => return None,
        }
        labels += 1;
        if at > name.len() {
            return None;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A query for `name`/`qtype` as a stub resolver sends it, optionally with an OPT record.
    pub(crate) fn query(id: u16, name: &str, qtype: u16, edns: Option<u16>) -> Vec<u8> {
        let mut p = id.to_be_bytes().to_vec();
        p.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, u8::from(edns.is_some())]);
        for label in name
            .trim_end_matches('.')
            .split('.')
            .filter(|l| !l.is_empty())
        {
            p.push(label.len() as u8);
            p.extend_from_slice(label.as_bytes());
        }
        p.push(0);
        p.extend_from_slice(&qtype.to_be_bytes());
        p.extend_from_slice(&1u16.to_be_bytes());
        if let Some(size) = edns {
            p.extend_from_slice(&[0, 0, 41]);
            p.extend_from_slice(&size.to_be_bytes());
            p.extend_from_slice(&[0, 0, 0x80, 0, 0, 0]);
        }
        p
    }

    fn reply_to(q: &[u8], answers: u16) -> Vec<u8> {
        let mut r = q.to_vec();
        r[2] |= QR;
        r[7] = answers as u8;
        r
    }

    #[test]
    fn parses_a_plain_query() {
        let p = query(0x1234, "Example.COM", 1, None);
        let q = parse_query(&p).unwrap();
        assert_eq!(q.id, 0x1234);
        assert_eq!(q.qtype, 1);
        assert_eq!(q.qclass, 1);
        assert!(!q.edns);
        assert_eq!(q.udp_size, 512);
        assert_eq!(q.name(&p), b"\x07Example\x03COM\x00");
        assert_eq!(q.question_end, p.len());
    }

    #[test]
    fn reads_the_edns_size_and_never_goes_below_512() {
        let p = query(1, "a.b", 28, Some(4096));
        let q = parse_query(&p).unwrap();
        assert!(q.edns);
        assert_eq!(q.udp_size, 4096);
        let small = query(1, "a.b", 28, Some(100));
        assert_eq!(parse_query(&small).unwrap().udp_size, 512);
    }

    #[test]
    fn rejects_what_must_not_be_forwarded() {
        assert_eq!(parse_query(&[0; 11]), Err(Reject::Drop));
        let mut resp = query(1, "a.b", 1, None);
        resp[2] |= QR;
        assert_eq!(
            parse_query(&resp),
            Err(Reject::Drop),
            "responses are never forwarded"
        );
        let mut two = query(1, "a.b", 1, None);
        two[5] = 2;
        assert_eq!(parse_query(&two), Err(Reject::Reply(rcode::FORMERR)));
        let mut none = query(1, "a.b", 1, None);
        none[5] = 0;
        assert_eq!(parse_query(&none), Err(Reject::Reply(rcode::FORMERR)));
        let mut notify = query(1, "a.b", 1, None);
        notify[2] = 4 << 3;
        assert_eq!(parse_query(&notify), Err(Reject::Reply(rcode::NOTIMP)));
        let mut cut = query(1, "a.b", 1, None);
        cut.truncate(cut.len() - 1);
        assert_eq!(parse_query(&cut), Err(Reject::Reply(rcode::FORMERR)));
        let mut pointer = query(1, "a.b", 1, None);
        pointer[12] = 0xc0;
        assert_eq!(parse_query(&pointer), Err(Reject::Reply(rcode::FORMERR)));
        let mut double_opt = query(1, "a.b", 1, Some(1232));
        let opt = double_opt[double_opt.len() - 11..].to_vec();
        double_opt.extend_from_slice(&opt);
        double_opt[11] = 2;
        assert_eq!(parse_query(&double_opt), Err(Reject::Reply(rcode::FORMERR)));
    }

    #[test]
    fn rejects_oversized_queries() {
        let mut p = query(1, "a.b", 1, Some(1232));
        p.resize(MAX_QUERY + 1, 0);
        assert_eq!(parse_query(&p), Err(Reject::Reply(rcode::FORMERR)));
    }

    #[test]
    fn rejects_names_over_255_bytes() {
        let long = vec!["a".repeat(63); 4].join(".");
        assert!(encode_name(&long).is_err());
        let p = query(1, &long, 1, None);
        assert_eq!(parse_query(&p), Err(Reject::Reply(rcode::FORMERR)));
        let fits = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61),
        ]
        .join(".");
        assert!(parse_query(&query(1, &fits, 1, None)).is_ok());
    }

    #[test]
    fn accepts_only_the_matching_reply() {
        let q = query(7, "www.example.com", 1, None);
        let question = &q[12..];
        let good = reply_to(&q, 0);
        assert!(reply_matches(&good, 7, question));
        assert!(!reply_matches(&good, 8, question), "wrong ID");
        assert!(!reply_matches(&q, 7, question), "a query is not a reply");
        let other = reply_to(&query(7, "www.example.org", 1, None), 0);
        assert!(!reply_matches(&other, 7, question), "wrong name");
        let aaaa = reply_to(&query(7, "www.example.com", 28, None), 0);
        assert!(!reply_matches(&aaaa, 7, question), "wrong type");
        let upper = reply_to(&query(7, "WWW.Example.COM", 1, None), 0);
        assert!(reply_matches(&upper, 7, question), "case differs only");
        // QTYPE 65 (HTTPS) and 97 must not be confused by a case-insensitive compare.
        let t65 = query(7, "a.b", 65, None);
        let t97 = reply_to(&query(7, "a.b", 97, None), 0);
        assert!(!reply_matches(&t97, 7, &t65[12..]));
        assert!(!reply_matches(&good[..20], 7, question), "cut short");
    }

    #[test]
    fn accepts_empty_error_replies_without_a_question() {
        let q = query(7, "a.b", 1, None);
        let mut formerr = q[..12].to_vec();
        formerr[2] |= QR;
        formerr[3] = rcode::FORMERR;
        formerr[5] = 0;
        assert!(reply_matches(&formerr, 7, &q[12..]));
        formerr[7] = 1;
        assert!(
            !reply_matches(&formerr, 7, &q[12..]),
            "records without a question"
        );
    }

    #[test]
    fn restores_id_and_case() {
        let client = query(0xbeef, "WwW.ExAmPle.com", 1, None);
        let mut reply = reply_to(&query(0x1111, "www.example.com", 1, None), 0);
        restore_for_client(&mut reply, 0xbeef, &client[12..]);
        assert_eq!(id(&reply), 0xbeef);
        assert_eq!(&reply[12..], &client[12..]);
    }

    #[test]
    fn local_reply_echoes_question_and_edns() {
        let p = query(9, "health-check.localdns.local", 1, Some(1232));
        let q = parse_query(&p).unwrap();
        let mut out = Vec::new();
        local_reply(&p, &q, rcode::NOERROR, &mut out);
        let r = parse_reply_for_test(&out);
        assert_eq!(
            (r.id, r.qr, r.rcode, r.qd, r.an, r.ar),
            (9, true, 0, 1, 0, 1)
        );
    }

    /// What a test reply is made of: records after the question, section by section.
    pub(crate) struct Rr {
        pub section: Section,
        pub rtype: u16,
        pub ttl: u32,
        pub rdata: Vec<u8>,
    }

    pub(crate) fn rr(section: Section, rtype: u16, ttl: u32, rdata: &[u8]) -> Rr {
        Rr {
            section,
            rtype,
            ttl,
            rdata: rdata.to_vec(),
        }
    }

    /// `count` A records in the answer section, 10.0.i.j.
    pub(crate) fn a_records(count: usize) -> Vec<Rr> {
        (0..count)
            .map(|i| rr(Section::Answer, 1, 60, &[10, 0, (i >> 8) as u8, i as u8]))
            .collect()
    }

    /// An OPT record's parts: UDP size, extended RCODE, version, DO, options (code, data).
    pub(crate) struct Opt {
        pub size: u16,
        pub ext_rcode: u8,
        pub version: u8,
        pub dnssec_ok: bool,
        pub options: Vec<(u16, Vec<u8>)>,
    }

    pub(crate) fn opt(size: u16, dnssec_ok: bool, options: &[(u16, &[u8])]) -> Opt {
        Opt {
            size,
            ext_rcode: 0,
            version: 0,
            dnssec_ok,
            options: options.iter().map(|(c, d)| (*c, d.to_vec())).collect(),
        }
    }

    pub(crate) fn push_test_opt(m: &mut Vec<u8>, o: &Opt) {
        m.extend_from_slice(&[0, 0, 41]);
        m.extend_from_slice(&o.size.to_be_bytes());
        m.extend_from_slice(&[
            o.ext_rcode,
            o.version,
            if o.dnssec_ok { 0x80 } else { 0 },
            0,
        ]);
        let len: usize = o.options.iter().map(|(_, d)| 4 + d.len()).sum();
        m.extend_from_slice(&(len as u16).to_be_bytes());
        for (code, data) in &o.options {
            m.extend_from_slice(&code.to_be_bytes());
            m.extend_from_slice(&(data.len() as u16).to_be_bytes());
            m.extend_from_slice(data);
        }
    }

    /// A query with the given header flag bytes and OPT record.
    pub(crate) fn query_with(name: &str, qtype: u16, flags: [u8; 2], o: Option<&Opt>) -> Vec<u8> {
        let mut p = query(0x4242, name, qtype, None);
        p[2..4].copy_from_slice(&flags);
        if let Some(o) = o {
            p[11] = 1;
            push_test_opt(&mut p, o);
        }
        p
    }

    /// An upstream's reply to `query`: its header and question, QR and RA set, then `records`
    /// (owner names compressed to the question) and `o` last.
    pub(crate) fn reply_with(query: &[u8], flags3: u8, records: &[Rr], o: Option<&Opt>) -> Vec<u8> {
        let q = parse_query(query).unwrap();
        let mut m = query[..q.question_end].to_vec();
        m[2] |= QR;
        m[3] = flags3;
        let count = |s| records.iter().filter(|r| r.section == s).count() as u16;
        let additional = count(Section::Additional) + u16::from(o.is_some());
        m[6..8].copy_from_slice(&count(Section::Answer).to_be_bytes());
        m[8..10].copy_from_slice(&count(Section::Authority).to_be_bytes());
        m[10..12].copy_from_slice(&additional.to_be_bytes());
        for section in [Section::Answer, Section::Authority, Section::Additional] {
            for r in records.iter().filter(|r| r.section == section) {
                m.extend_from_slice(&[0xc0, 12]);
                m.extend_from_slice(&r.rtype.to_be_bytes());
                m.extend_from_slice(&[0, 1]);
                m.extend_from_slice(&r.ttl.to_be_bytes());
                m.extend_from_slice(&(r.rdata.len() as u16).to_be_bytes());
                m.extend_from_slice(&r.rdata);
            }
        }
        if let Some(o) = o {
            push_test_opt(&mut m, o);
        }
        m
    }

    /// The reply read back by hickory-proto, which must accept it.
    pub(crate) fn hickory(p: &[u8]) -> hickory_proto::op::Message {
        hickory_proto::op::Message::from_vec(p)
            .unwrap_or_else(|e| panic!("hickory cannot read {p:02x?}: {e}"))
    }

    #[test]
    fn truncation_keeps_as_many_whole_records_as_fit_and_the_opt() {
        let q = query_with("big.example", 1, [1, 0], Some(&opt(512, true, &[])));
        let mut r = reply_with(
            &q,
            0x80,
            &a_records(40),
            Some(&opt(1232, true, &[(3, b"ns1")])),
        );
        assert!(r.len() > 512);
        truncate(&mut r, 512);
        assert!(r.len() <= 512);
        let m = hickory(&r);
        assert!(m.truncated());
        // 12 header + 17 question + 18 OPT leaves 465 bytes: 29 records of 16.
        assert_eq!(m.answers().len(), 29);
        for (i, a) in m.answers().iter().enumerate() {
            assert_eq!(a.data().to_string(), format!("10.0.0.{i}"), "in order");
        }
        let edns = m.extensions().as_ref().expect("OPT kept");
        assert!(edns.flags().dnssec_ok);
        assert_eq!(edns.max_payload(), 1232);
        assert!(
            edns.option(hickory_proto::rr::rdata::opt::EdnsCode::NSID)
                .is_some()
        );
    }

    #[test]
    fn truncation_drops_additional_then_authority_then_trailing_answers() {
        let q = query_with("x.example", 1, [1, 0], None);
        let big = [7u8; 100];
        let mut records = vec![
            rr(Section::Answer, 65280, 60, &big),
            rr(Section::Answer, 65280, 60, &big),
        ];
        records.push(rr(Section::Authority, 65280, 60, &big));
        records.push(rr(Section::Authority, 65280, 60, &big));
        records.push(rr(Section::Additional, 65280, 60, &big));
        records.push(rr(Section::Additional, 65280, 60, &big));
        let full = reply_with(&q, 0x80, &records, None);
        let qend = parse_query(&q).unwrap().question_end;
        let cut_at = |n: usize| qend + n * 112;
        // Room for answers and authority: additional records go, without TC (RFC 2181 §9).
        let mut r = full.clone();
        truncate(&mut r, cut_at(4) + 50);
        assert_eq!((counts(&r), is_truncated(&r)), ([1, 2, 2, 0], false));
        assert_eq!(r.len(), cut_at(4));
        // Room for three records: the second authority record goes too, with TC.
        let mut r = full.clone();
        truncate(&mut r, cut_at(3));
        assert_eq!((counts(&r), is_truncated(&r)), ([1, 2, 1, 0], true));
        // Room for one: a trailing answer record goes.
        let mut r = full.clone();
        truncate(&mut r, cut_at(1) + 111);
        assert_eq!((counts(&r), is_truncated(&r)), ([1, 1, 0, 0], true));
        hickory(&r);
    }

    #[test]
    fn truncation_without_room_for_one_record_keeps_header_question_and_opt() {
        let q = query_with("big.example", 16, [1, 0], Some(&opt(1232, false, &[])));
        let mut r = reply_with(
            &q,
            0x80,
            &[rr(Section::Answer, 16, 60, &[b'x'; 2000])],
            Some(&opt(1232, false, &[])),
        );
        truncate(&mut r, 1232);
        let qend = parse_query(&q).unwrap().question_end;
        assert_eq!(r.len(), qend + 11);
        assert_eq!(counts(&r), [1, 0, 0, 1]);
        assert!(is_truncated(&r));
        assert_eq!(&r[12..qend], &q[12..qend]);
        // A reply that fits is left alone.
        let mut small = reply_with(&q, 0x80, &a_records(2), None);
        let before = small.clone();
        truncate(&mut small, 512);
        assert_eq!(small, before);
    }

    #[test]
    fn parses_the_edns_parts_that_decide_sharing() {
        let plain =
            parse_query(&query_with("a.b", 1, [1, 0], Some(&opt(1232, true, &[])))).unwrap();
        assert_eq!(
            (
                plain.edns_version,
                plain.cookie,
                plain.ecs,
                plain.answer_options
            ),
            (0, false, false, false)
        );
        assert!(plain.dnssec_ok);
        let cookie: &[u8] = &[1, 2, 3, 4, 5, 6, 7, 8];
        let c = parse_query(&query_with(
            "a.b",
            1,
            [1, 0],
            Some(&opt(
                1232,
                false,
                &[(option::COOKIE, cookie), (option::PADDING, &[0; 20])],
            )),
        ))
        .unwrap();
        assert!(c.cookie && !c.answer_options && !c.ecs);
        let ecs: &[u8] = &[0, 1, 24, 0, 192, 0, 2];
        let e = parse_query(&query_with(
            "a.b",
            1,
            [1, 0],
            Some(&opt(1232, false, &[(option::ECS, ecs)])),
        ))
        .unwrap();
        assert!(e.ecs && e.answer_options);
        let u = parse_query(&query_with(
            "a.b",
            1,
            [1, 0],
            Some(&opt(1232, false, &[(65001, b"x")])),
        ))
        .unwrap();
        assert!(u.answer_options && !u.ecs);
        let mut v1 = opt(1232, false, &[]);
        v1.version = 1;
        assert_eq!(
            parse_query(&query_with("a.b", 1, [1, 0], Some(&v1)))
                .unwrap()
                .edns_version,
            1
        );
        // Options that run past their record: forwarded, but never shared.
        let mut bad = query_with("a.b", 1, [1, 0], Some(&opt(1232, false, &[(65001, b"xy")])));
        let n = bad.len();
        bad[n - 3] = 9;
        assert!(parse_query(&bad).unwrap().answer_options);
    }

    #[test]
    fn the_upstream_query_advertises_1232_and_carries_no_cookie() {
        for size in [512, 1232, 4096] {
            let o = opt(
                size,
                true,
                &[(option::COOKIE, &[1, 2, 3, 4, 5, 6, 7, 8]), (65001, b"")],
            );
            let client = query_with("WwW.example", 1, [1, 0x20], Some(&o));
            let q = parse_query(&client).unwrap();
            let mut out = Vec::new();
            upstream_query(&client, &q, 0x7777, &mut out);
            let sent = parse_query(&out).unwrap();
            assert_eq!(id(&out), 0x7777);
            assert_eq!(sent.udp_size, UPSTREAM_EDNS_SIZE, "client size {size}");
            assert!(!sent.cookie, "the client's cookie stays with us");
            assert!(sent.answer_options, "other options go on");
            assert!(sent.dnssec_ok);
            assert_eq!(
                &out[2..sent.question_end],
                &client[2..q.question_end],
                "flags and spelling as asked"
            );
            let m = hickory(&out);
            assert!(
                m.extensions()
                    .as_ref()
                    .unwrap()
                    .option(hickory_proto::rr::rdata::opt::EdnsCode::Cookie)
                    .is_none()
            );
        }
        // Without EDNS the query goes as it came.
        let client = query(1, "a.b", 1, None);
        let mut out = Vec::new();
        upstream_query(&client, &parse_query(&client).unwrap(), 9, &mut out);
        assert_eq!((&out[2..], id(&out)), (&client[2..], 9));
    }

    #[test]
    fn header_bits_are_the_askers() {
        let reply_flags = |rd: bool, ad: bool| {
            let q = query_with("a.b", 1, [u8::from(rd), 0], None);
            reply_with(&q, 0x80 | if ad { AD } else { 0 }, &[], None)
        };
        for (q_rd, q_ad, q_cd, q_do, r_ad, want_ad) in [
            (true, false, false, false, true, false), // never asked about AD
            (true, true, false, false, true, true),   // AD in the query
            (false, false, false, true, true, true),  // DO in the query
            (true, true, true, false, false, false),  // the upstream did not vouch
        ] {
            let flags = [
                u8::from(q_rd),
                if q_ad { AD } else { 0 } | if q_cd { CD } else { 0 },
            ];
            let o = opt(1232, q_do, &[]);
            let query = query_with("a.b", 1, flags, q_do.then_some(&o));
            let q = parse_query(&query).unwrap();
            let mut r = reply_flags(!q_rd, r_ad);
            set_asker_flags(&mut r, &query, &q);
            assert_eq!(r[2] & RD != 0, q_rd, "RD as asked");
            assert_eq!(r[3] & CD != 0, q_cd, "CD as asked");
            assert_eq!(r[3] & AD != 0, want_ad, "AD for {flags:?} DO {q_do}");
            assert!(
                r[3] & RA != 0 && r[2] & QR != 0,
                "the rest is the upstream's"
            );
        }
    }

    #[test]
    fn the_askers_opt_has_its_do_bit_and_no_cookie_or_foreign_ecs() {
        let cookie: &[u8] = &[1; 24];
        let ecs: &[u8] = &[0, 1, 24, 24, 192, 0, 2];
        let mut o = opt(
            1232,
            false,
            &[(option::COOKIE, cookie), (option::ECS, ecs), (3, b"ns1")],
        );
        o.ext_rcode = 1;
        let q = query_with("a.b", 1, [1, 0], None);
        let r = reply_with(&q, 0x80, &[], Some(&o));
        let l = layout(&r).unwrap();
        let opt_rr = l.opt.unwrap();
        assert!(has_private_options(&r, &opt_rr));
        for (dnssec_ok, keep_ecs) in [(true, false), (false, true)] {
            let mut out = r[..opt_rr.start].to_vec();
            // The upstream's NSID never; ours to an asker that asked.
            let nsid = dnssec_ok;
            push_reply_opt(&r, &opt_rr, dnssec_ok, keep_ecs, nsid, &mut out);
            let m = hickory(&out);
            let edns = m.extensions().as_ref().unwrap();
            use hickory_proto::rr::rdata::opt::EdnsCode;
            assert_eq!(edns.flags().dnssec_ok, dnssec_ok);
            assert!(edns.option(EdnsCode::Cookie).is_none());
            assert_eq!(edns.option(EdnsCode::Subnet).is_some(), keep_ecs);
            let ours = hickory_proto::rr::rdata::opt::EdnsOption::Unknown(3, NSID.to_vec());
            assert_eq!(edns.option(EdnsCode::NSID).is_some(), nsid);
            assert!(!nsid || edns.option(EdnsCode::NSID) == Some(&ours));
            assert_eq!(edns.rcode_high(), 1, "extended RCODE kept");
        }
    }

    #[test]
    fn local_replies_copy_do_and_answer_other_edns_versions_badvers() {
        for dnssec_ok in [false, true] {
            let p = query_with(
                "health-check.localdns.local",
                1,
                [1, 0],
                Some(&opt(1232, dnssec_ok, &[])),
            );
            let q = parse_query(&p).unwrap();
            let mut out = Vec::new();
            local_reply(&p, &q, rcode::SERVFAIL, &mut out);
            let m = hickory(&out);
            assert_eq!(
                m.extensions().as_ref().unwrap().flags().dnssec_ok,
                dnssec_ok
            );
            assert_eq!(rcode(&out), rcode::SERVFAIL);
        }
        let mut v1 = opt(1232, false, &[]);
        v1.version = 1;
        let p = query_with("a.b", 1, [1, 0], Some(&v1));
        let mut out = Vec::new();
        local_reply(&p, &parse_query(&p).unwrap(), rcode::NXDOMAIN, &mut out);
        // hickory names code 16 BADSIG (it is BADVERS in an OPT record, RFC 6891 §9).
        assert_eq!(u16::from(hickory(&out).response_code()), 16);
    }

    #[test]
    fn zone_membership_is_by_whole_labels() {
        let zone = encode_name("cluster.local").unwrap();
        let name = |s: &str| encode_name(s).unwrap();
        let under = |n: &[u8], z: &[u8]| labels_below(n, z).is_some();
        assert!(under(&name("kubernetes.default.svc.cluster.local"), &zone));
        assert!(under(&name("CLUSTER.Local."), &zone));
        assert!(!under(&name("notcluster.local"), &zone));
        assert!(!under(&name("cluster.local.example.com"), &zone));
        assert!(!under(&name("local"), &zone));
        assert!(under(&name("anything"), &name(".")));
        assert_eq!(
            labels_below(
                &name("a.b.c.d.internal.cloudapp.net"),
                &name("internal.cloudapp.net")
            ),
            Some(4)
        );
        assert_eq!(
            labels_below(&name("example.com"), &name("internal.cloudapp.net")),
            None
        );
    }

    #[test]
    fn encode_name_rejects_bad_names() {
        assert!(encode_name("a..b").is_err());
        assert!(encode_name(&"x".repeat(64)).is_err());
        assert_eq!(encode_name(".").unwrap(), vec![0]);
    }

    struct Header {
        id: u16,
        qr: bool,
        rcode: u8,
        qd: u16,
        an: u16,
        ar: u16,
    }

    fn parse_reply_for_test(p: &[u8]) -> Header {
        let [qd, an, _, ar] = counts(p);
        Header {
            id: id(p),
            qr: is_response(p),
            rcode: rcode(p),
            qd,
            an,
            ar,
        }
    }
}
