//! DNS wire-format helpers that work on packet bytes without building a message.
//!
//! The forwarder only needs a few facts about a packet (ID, flags, the question, the client's EDNS
//! size) and a few edits (ID, question case, truncation). Doing those on the bytes keeps the relay
//! free of allocations and makes every rule here a pure function that the unit tests and fuzzers
//! can hammer without a network.

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
const CD: u8 = 0x10;

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

fn counts(p: &[u8]) -> [u16; 4] {
    [
        u16::from_be_bytes([p[4], p[5]]),
        u16::from_be_bytes([p[6], p[7]]),
        u16::from_be_bytes([p[8], p[9]]),
        u16::from_be_bytes([p[10], p[11]]),
    ]
}

/// What the forwarder needs to know about a client's query. Offsets index the query bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    let [qd, an, ns, ar] = counts(p);
    if qd != 1 {
        return Err(Reject::Reply(rcode::FORMERR));
    }
    let formerr = Reject::Reply(rcode::FORMERR);
    let name_end = question_name_end(p, HEADER_LEN).ok_or(formerr)?;
    let qtype = u16_at(p, name_end).ok_or(formerr)?;
    let qclass = u16_at(p, name_end + 2).ok_or(formerr)?;
    let question_end = name_end + 4;
    let mut query = Query {
        id: id(p),
        name_end,
        question_end,
        qtype,
        qclass,
        edns: false,
        udp_size: CLASSIC_UDP_SIZE,
        dnssec_ok: false,
    };
    // Queries rarely carry answer or authority records, but they may (e.g. known-answer hints);
    // walk them so the OPT record in the additional section is found where it really is.
    let mut at = question_end;
    for index in 0..(an as usize + ns as usize + ar as usize) {
        let rr = resource_record(p, at).ok_or(formerr)?;
        let in_additional = index >= an as usize + ns as usize;
        if rr.rtype == TYPE_OPT {
            if !in_additional || query.edns {
                return Err(formerr);
            }
            query.edns = true;
            query.udp_size = rr.class.max(CLASSIC_UDP_SIZE);
            query.dnssec_ok = rr.ttl & 0x8000 != 0;
        }
        at = rr.end;
    }
    Ok(query)
}

struct ResourceRecord {
    rtype: u16,
    class: u16,
    ttl: u32,
    ttl_offset: usize,
    end: usize,
}

fn resource_record(p: &[u8], at: usize) -> Option<ResourceRecord> {
    let fixed = skip_name(p, at)?;
    let rtype = u16_at(p, fixed)?;
    let class = u16_at(p, fixed + 2)?;
    let ttl = u32::from(u16_at(p, fixed + 4)?) << 16 | u32::from(u16_at(p, fixed + 6)?);
    let rdlen = u16_at(p, fixed + 8)? as usize;
    let end = fixed + 10 + rdlen;
    (end <= p.len()).then_some(ResourceRecord {
        rtype,
        class,
        ttl,
        ttl_offset: fixed + 4,
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
    if p.len() < HEADER_LEN {
        return None;
    }
    let [qd, an, ns, ar] = counts(p);
    let mut at = HEADER_LEN;
    for _ in 0..qd {
        at = skip_name(p, at)? + 4;
    }
    if at > p.len() {
        return None;
    }
    let mut out = Vec::with_capacity(usize::from(an) + usize::from(ns) + usize::from(ar));
    for index in 0..(usize::from(an) + usize::from(ns) + usize::from(ar)) {
        let rr = resource_record(p, at)?;
        let section = if index < usize::from(an) {
            Section::Answer
        } else if index < usize::from(an) + usize::from(ns) {
            Section::Authority
        } else {
            Section::Additional
        };
        // SOA RDATA ends with SERIAL, REFRESH, RETRY, EXPIRE, MINIMUM (RFC 1035 §3.3.13).
        let soa_minimum = (rr.rtype == 6 && rr.end >= rr.ttl_offset + 6 + 20).then(|| {
            u32::from(u16_at(p, rr.end - 4).unwrap_or(0)) << 16
                | u32::from(u16_at(p, rr.end - 2).unwrap_or(0))
        });
        out.push(Record {
            section,
            rtype: rr.rtype,
            ttl: rr.ttl,
            ttl_offset: rr.ttl_offset,
            soa_minimum,
        });
        at = rr.end;
    }
    Some(out)
}

/// The CD (checking disabled) bit of a query.
pub fn checking_disabled(p: &[u8]) -> bool {
    p[3] & CD != 0
}

/// End of an uncompressed name starting at `at`. Question names never need compression (nothing
/// precedes them to point at), so a pointer there marks the packet as malformed.
fn question_name_end(p: &[u8], mut at: usize) -> Option<usize> {
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
    if counts(reply)[0] == 1 {
        reply[HEADER_LEN..HEADER_LEN + client_question.len()].copy_from_slice(client_question);
    }
}

/// Appends an empty OPT record advertising our UDP size (RFC 6891: answer EDNS with EDNS).
fn push_opt(out: &mut Vec<u8>) {
    out.push(0); // root owner name
    out.extend_from_slice(&TYPE_OPT.to_be_bytes());
    out.extend_from_slice(&OUR_EDNS_SIZE.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0]); // extended rcode, version, flags, rdlength
}

/// Builds a reply of our own to a parsed query: its question, no records, the given RCODE.
pub fn local_reply(query: &[u8], q: &Query, rcode: u8, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&query[..q.question_end]);
    out[2] = QR | (query[2] & (0x78 | RD)); // keep opcode and RD, clear AA/TC
    out[3] = RA | (query[3] & CD) | rcode;
    out[4..12].copy_from_slice(&[0, 1, 0, 0, 0, 0, 0, u8::from(q.edns)]);
    if q.edns {
        push_opt(out);
    }
}

/// Builds an error reply to a packet whose question could not be parsed: header only.
pub fn header_only_reply(query: &[u8], rcode: u8, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&query[..HEADER_LEN]);
    out[2] = QR | (query[2] & (0x78 | RD));
    out[3] = RA | rcode;
    out[4..12].fill(0);
}

/// Cuts a reply that is too big for the client down to header and question with TC set, so the
/// client retries over TCP (RFC 1035 §4.2.1, RFC 7766). The question is taken from the reply,
/// which the caller has already restored for the client.
pub fn truncate_reply(reply: &[u8], question_len: usize, client_edns: bool, out: &mut Vec<u8>) {
    out.clear();
    let has_question = counts(reply)[0] == 1;
    let end = if has_question {
        HEADER_LEN + question_len
    } else {
        HEADER_LEN
    };
    out.extend_from_slice(&reply[..end]);
    out[2] |= TC;
    out[4..12].copy_from_slice(&[
        0,
        u8::from(has_question),
        0,
        0,
        0,
        0,
        0,
        u8::from(client_edns),
    ]);
    if client_edns {
        push_opt(out);
    }
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

/// Is the wire name `name` equal to or below the lower-case wire name `zone`?
pub fn name_is_under(name: &[u8], zone: &[u8]) -> bool {
    let mut at = 0;
    loop {
        if name.len() - at == zone.len() && name[at..].eq_ignore_ascii_case(zone) {
            return true;
        }
        match name.get(at) {
            Some(&len) if len != 0 => at += 1 + len as usize,
            _ => return false,
        }
        if at > name.len() {
            return false;
        }
    }
}

/// Counts the labels of `name` in front of `zone`, if `name` is below `zone`.
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
mod tests {
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

    #[test]
    fn truncation_keeps_the_question_and_sets_tc() {
        let p = query(5, "big.example", 16, None);
        let mut reply = reply_to(&p, 3);
        reply.extend_from_slice(&[0u8; 2000]);
        let mut out = Vec::new();
        truncate_reply(&reply, p.len() - 12, false, &mut out);
        assert_eq!(&out[12..], &p[12..]);
        assert!(is_truncated(&out) && is_response(&out));
        assert_eq!(&out[4..12], &[0, 1, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn zone_membership_is_by_whole_labels() {
        let zone = encode_name("cluster.local").unwrap();
        let name = |s: &str| encode_name(s).unwrap();
        assert!(name_is_under(
            &name("kubernetes.default.svc.cluster.local"),
            &zone
        ));
        assert!(name_is_under(&name("CLUSTER.Local."), &zone));
        assert!(!name_is_under(&name("notcluster.local"), &zone));
        assert!(!name_is_under(&name("cluster.local.example.com"), &zone));
        assert!(!name_is_under(&name("local"), &zone));
        assert!(name_is_under(&name("anything"), &name(".")));
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
