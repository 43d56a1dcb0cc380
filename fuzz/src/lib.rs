//! What the fuzz targets check, shared between them.
//!
//! Every function here takes bytes an outsider controls (a client's datagram, a TCP stream, an
//! upstream's reply, a tool's output) through the library's public API and asserts the
//! properties the forwarder relies on: no panic, no reply larger than the client may receive, the
//! client's ID and spelling restored, the cache under its byte cap. Where a full DNS parser
//! (hickory-proto) can cheaply say what the right answer is, the result is compared with it
//! (differential checks); every known difference is written down next to the check that
//! tolerates it.

use std::net::SocketAddr;

use hickory_proto::op::{Message, MessageType, OpCode};
use hickory_proto::rr::RecordType;
use localdns_fallback::cache::{Key, KeyHasher};
use localdns_fallback::engine::route::{Route, Routes, route};
use localdns_fallback::frame::FrameDecoder;
use localdns_fallback::roles::{ListenerRole, UpstreamGroup};
use localdns_fallback::wire::{self, Reject, rcode};

pub mod relay;

/// `cluster.local` in lower-case wire form, the default cluster domain.
pub const CLUSTER_DOMAIN: &[u8] = b"\x07cluster\x05local\x00";

/// The header fields the checks read, straight from the bytes.
pub struct Header {
    pub id: u16,
    pub flags: u16,
    pub qd: u16,
    pub an: u16,
    pub ns: u16,
    pub ar: u16,
}

pub fn header(p: &[u8]) -> Option<Header> {
    let at = |i: usize| u16::from_be_bytes([p[i], p[i + 1]]);
    (p.len() >= wire::HEADER_LEN).then(|| Header {
        id: at(0),
        flags: at(2),
        qd: at(4),
        an: at(6),
        ns: at(8),
        ar: at(10),
    })
}

/// One client datagram (UDP) or frame (TCP) through the decision path the forwarder runs on it:
/// `parse_query`, then either the error reply, or the routing and the locally built replies.
/// Returns the parsed query when the packet would be forwarded or answered locally.
pub fn client_packet(packet: &[u8]) -> Option<wire::Query> {
    let mut out = Vec::new();
    match wire::parse_query(packet) {
        Err(Reject::Drop) => {
            // Only packets too short for an ID or shaped like a response are dropped unanswered.
            assert!(packet.len() < wire::HEADER_LEN || packet[2] & 0x80 != 0);
            None
        }
        Err(Reject::Reply(code)) => {
            assert!(packet.len() >= wire::HEADER_LEN && packet[2] & 0x80 == 0);
            assert!(
                code == rcode::FORMERR || code == rcode::NOTIMP,
                "rcode {code}"
            );
            wire::header_only_reply(packet, code, &mut out);
            let h = header(&out).expect("an error reply has a header");
            assert_eq!(
                out.len(),
                wire::HEADER_LEN,
                "an error reply is a bare header"
            );
            assert_eq!(h.id, wire::id(packet));
            assert!(wire::is_response(&out) && !wire::is_truncated(&out));
            assert_eq!(wire::rcode(&out), code);
            assert_eq!((h.qd, h.an, h.ns, h.ar), (0, 0, 0, 0));
            None
        }
        Ok(q) => {
            check_parsed_query(packet, &q);
            differential_query(packet, &q);
            let name = q.name(packet);
            for listener in ListenerRole::BOTH {
                let routes = Routes::defaults(CLUSTER_DOMAIN);
                if let Route::Local(code) = route(listener, name, &routes) {
                    assert!(code == rcode::NOERROR || code == rcode::NXDOMAIN);
                }
            }
            for code in [
                rcode::NOERROR,
                rcode::NXDOMAIN,
                rcode::SERVFAIL,
                rcode::REFUSED,
            ] {
                wire::local_reply(packet, &q, code, &mut out);
                check_local_reply(packet, &q, code, &out);
            }
            for group in UpstreamGroup::BOTH {
                let _ = Key::new(&KeyHasher::new(7), group, packet, &q);
            }
            Some(q)
        }
    }
}

fn check_parsed_query(packet: &[u8], q: &wire::Query) {
    assert!(
        wire::HEADER_LEN < q.name_end,
        "a name has at least its root label"
    );
    assert_eq!(q.question_end, q.name_end + 4);
    assert!(q.question_end <= packet.len());
    assert!(q.name(packet).len() <= 255, "names are at most 255 bytes");
    assert_eq!(
        *q.name(packet).last().unwrap(),
        0,
        "the name ends in the root label"
    );
    assert!(q.udp_size >= wire::CLASSIC_UDP_SIZE);
    assert!(!q.dnssec_ok || q.edns, "DO lives in the OPT record");
    assert_eq!(q.id, wire::id(packet));
    // Walk the labels: each at most 63 bytes, no compression pointer.
    let name = q.name(packet);
    let mut at = 0;
    while name[at] != 0 {
        assert!(name[at] <= 63, "label length byte {:#x}", name[at]);
        at += 1 + usize::from(name[at]);
    }
    assert_eq!(at + 1, name.len());
}

/// A reply we build ourselves: the query's question, the client's ID, the RCODE asked for, an OPT
/// record only if the client sent one, and never larger than the query (no amplification).
fn check_local_reply(packet: &[u8], q: &wire::Query, code: u8, out: &[u8]) {
    let h = header(out).expect("a local reply has a header");
    assert_eq!(h.id, q.id);
    assert!(wire::is_response(out) && !wire::is_truncated(out));
    // An EDNS version we do not speak is answered BADVERS (extended RCODE 1, low bits 0).
    let badvers = q.edns && q.edns_version != 0;
    assert_eq!(wire::rcode(out), if badvers { 0 } else { code });
    assert_eq!((h.qd, h.an, h.ns), (1, 0, 0));
    assert_eq!(h.ar, u16::from(q.edns));
    assert_eq!(&out[wire::HEADER_LEN..q.question_end], q.question(packet));
    // Our NSID, to a query that asked for it, is the one thing a reply adds (RFC 5001).
    let nsid = if q.nsid { wire::NSID.len() } else { 0 };
    assert!(
        out.len() <= packet.len() + nsid,
        "a local reply of {} bytes to a query of {} bytes amplifies",
        out.len(),
        packet.len()
    );
    assert!(out.len() <= usize::from(q.udp_size));
    let msg = Message::from_vec(out)
        .unwrap_or_else(|e| panic!("our own reply does not parse ({e}): {out:02x?}"));
    assert_eq!(msg.message_type(), MessageType::Response);
    assert_eq!(msg.queries().len(), 1);
    assert_eq!(msg.extensions().is_some(), q.edns);
    if let Some(edns) = msg.extensions() {
        assert_eq!(
            edns.flags().dnssec_ok,
            q.dnssec_ok,
            "the asker's DO (RFC 3225)"
        );
        assert_eq!(edns.rcode_high(), u8::from(badvers));
    }
}

/// Does the question name of `packet` (starting at the header's end) use a compression pointer?
fn question_has_pointer(packet: &[u8]) -> bool {
    let mut at = wire::HEADER_LEN;
    while let Some(&len) = packet.get(at) {
        match len {
            0 => return false,
            l if l & 0xc0 == 0xc0 => return true,
            l if l > 63 => return false,
            l => at += 1 + usize::from(l),
        }
    }
    false
}

/// `parse_query` against hickory-proto's full parser.
///
/// Known and intended differences, each tolerated below:
/// - we do not look inside RDATA of records in a query (only the OPT record's fixed fields), so
///   a query whose other records hickory cannot decode is still ours to forward: the upstream
///   judges it. For those the question alone is compared (rebuilt as a one-question message).
/// - a compression pointer in the question name: hickory follows it, we answer FORMERR
///   (nothing precedes the first question, so a pointer there is never needed).
/// - an OPT record outside the additional section: hickory keeps it as a plain record, we
///   answer FORMERR (RFC 6891 §6.1.1 allows it only in the additional section).
pub fn differential_query(packet: &[u8], q: &wire::Query) {
    // The question alone must always parse, and mean what we took it to mean.
    let mut alone = packet[..wire::HEADER_LEN].to_vec();
    alone[4..12].copy_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    alone.extend_from_slice(q.question(packet));
    let msg = Message::from_vec(&alone).unwrap_or_else(|e| {
        panic!("hickory cannot parse a question parse_query accepted ({e}): {alone:02x?}")
    });
    let theirs = &msg.queries()[0];
    assert_eq!(u16::from(theirs.query_type()), q.qtype);
    assert_eq!(u16::from(theirs.query_class()), q.qclass);
    assert_eq!(
        theirs.name().num_labels() as usize + usize::from(theirs.name().is_wildcard()),
        label_count(q.name(packet)),
        "label count of {:02x?}",
        q.name(packet)
    );
    // The whole message: when hickory reads it, EDNS must agree.
    if let Ok(full) = Message::from_vec(packet) {
        assert_eq!(full.extensions().is_some(), q.edns, "EDNS presence");
        if let Some(edns) = full.extensions() {
            assert_eq!(q.udp_size, edns.max_payload().max(512), "EDNS UDP size");
            assert_eq!(q.dnssec_ok, edns.flags().dnssec_ok, "DO bit");
        }
    }
}

fn label_count(name: &[u8]) -> usize {
    let (mut at, mut n) = (0, 0);
    while name[at] != 0 {
        n += 1;
        at += 1 + usize::from(name[at]);
    }
    n
}

/// The other direction: a packet hickory reads as one plain query must be accepted by us, unless
/// it falls under one of the differences listed at [`differential_query`].
pub fn hickory_accepts_so_must_we(packet: &[u8]) {
    let Ok(msg) = Message::from_vec(packet) else {
        return;
    };
    if msg.message_type() != MessageType::Query
        || msg.op_code() != OpCode::Query
        || msg.queries().len() != 1
        || question_has_pointer(packet)
        || msg
            .answers()
            .iter()
            .chain(msg.name_servers())
            .any(|r| r.record_type() == RecordType::OPT)
    {
        return;
    }
    // hickory checks the OPCODE field only through its enum: opcodes it does not know fail to
    // parse, the ones it knows compare above. The header's count must be exactly 1 as well.
    assert!(
        wire::parse_query(packet).is_ok(),
        "hickory reads one plain query but parse_query rejects it: {:?}: {packet:02x?}",
        wire::parse_query(packet)
    );
}

/// A TCP client's byte stream through the forwarder's own frame decoder (`frame::FrameDecoder`),
/// fed in pieces whose sizes the input picks, each frame through the same decision path as a
/// datagram. A frame the stream ends in the middle of is where a real connection would stall
/// until the idle timeout closes it. Returns the frames handled.
pub fn tcp_stream(stream: &[u8]) -> usize {
    let Some((&piece, stream)) = stream.split_first() else {
        return 0;
    };
    let piece = usize::from(piece).max(1);
    let mut decoder = FrameDecoder::new(wire::MAX_QUERY);
    let mut frames = 0;
    let mut expected = 0;
    // What a plain reading of the stream says the frames are, to hold the decoder against.
    let mut rest = stream;
    while let [hi, lo, tail @ ..] = rest {
        let len = usize::from(u16::from_be_bytes([*hi, *lo]));
        if len > wire::MAX_QUERY || tail.len() < len {
            break;
        }
        expected += 1;
        rest = &tail[len..];
    }
    'feed: for chunk in stream.chunks(piece) {
        decoder.feed(chunk);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    let frame = frame.to_vec();
                    if let Some(q) = client_packet(&frame) {
                        // Over TCP the reply is framed with a 16-bit length: what we build must fit it.
                        let mut out = Vec::new();
                        wire::local_reply(&frame, &q, rcode::SERVFAIL, &mut out);
                        assert!(out.len() <= usize::from(u16::MAX));
                    }
                    frames += 1;
                }
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
    }
    assert_eq!(frames, expected, "the decoder and a plain reading disagree");
    frames
}

/// A small cursor over fuzz input: every read succeeds (zeros once the input runs out), so a
/// target never has to handle "not enough bytes" and short inputs still do something.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) << 16 | u32::from(self.u16())
    }

    /// Up to `n` bytes.
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// A length-prefixed byte string (16-bit length).
    pub fn blob(&mut self) -> &'a [u8] {
        let n = usize::from(self.u16());
        self.bytes(n)
    }

    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }
}

/// Names the structured targets build queries for: few, so caching and coalescing get hits,
/// and covering each routing case (cluster domain, health check, local junk, external).
pub const NAMES: [&str; 8] = [
    "kubernetes.default.svc.cluster.local",
    "www.example.com",
    "health-check.localdns.local",
    "a.reddog.microsoft.com",
    "a.b.c.d.internal.cloudapp.net",
    "big.example",
    "nx.example",
    "x",
];

/// A query as a stub resolver sends it: `name` with the case flipped where `case_bits` says,
/// optionally with an OPT record of `edns` size and the DO bit.
pub fn build_query(
    id: u16,
    name: &str,
    case_bits: u32,
    qtype: u16,
    edns: Option<(u16, bool)>,
) -> Vec<u8> {
    let mut p = id.to_be_bytes().to_vec();
    p.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, u8::from(edns.is_some())]);
    let mut wire_name = wire::encode_name(name).expect("NAMES are valid");
    let mut letter = 0;
    for b in wire_name.iter_mut() {
        if b.is_ascii_lowercase() {
            if case_bits >> (letter % 32) & 1 == 1 {
                b.make_ascii_uppercase();
            }
            letter += 1;
        }
    }
    p.extend_from_slice(&wire_name);
    p.extend_from_slice(&qtype.to_be_bytes());
    p.extend_from_slice(&1u16.to_be_bytes());
    if let Some((size, dnssec_ok)) = edns {
        p.extend_from_slice(&[0, 0, 41]);
        p.extend_from_slice(&size.to_be_bytes());
        p.extend_from_slice(&[0, 0, if dnssec_ok { 0x80 } else { 0 }, 0, 0, 0]);
    }
    p
}

/// An upstream's reply shaped from fuzz input around the query it answers: QR set, the RCODE,
/// the question in any case, then records (A, SOA, OPT, or raw bytes), possibly cut short.
pub fn shape_reply(sent: &[u8], input: &mut Input) -> Vec<u8> {
    let mut r = sent.to_vec();
    if r.len() < wire::HEADER_LEN {
        return r;
    }
    r[2] |= 0x80;
    r[3] = (r[3] & 0xf0) | (input.u8() & 0x0f);
    if input.u8() & 1 == 1 {
        r[2] |= 0x02; // TC
    }
    // Recase the question as upstreams may (0x20 encoding).
    let flips = input.u32();
    for (i, b) in r.iter_mut().skip(wire::HEADER_LEN).enumerate() {
        if b.is_ascii_alphabetic() && flips >> (i % 32) & 1 == 1 {
            *b ^= 0x20;
        }
    }
    // Drop the query's own additional records (its OPT) and write new sections.
    if let Ok(q) = wire::parse_query(sent) {
        r.truncate(q.question_end);
        r[6..12].fill(0);
    }
    let (mut an, mut ns, mut ar) = (0u16, 0u16, 0u16);
    for _ in 0..input.u8() % 8 {
        let ttl = input.u32();
        match input.u8() % 5 {
            0 => {
                r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
                r.extend_from_slice(&ttl.to_be_bytes());
                r.extend_from_slice(&[0, 4, 10, 0, 0, input.u8()]);
                an += 1;
            }
            1 => {
                // SOA in the authority section, MINIMUM from the input.
                r.extend_from_slice(&[0xc0, 12, 0, 6, 0, 1]);
                r.extend_from_slice(&ttl.to_be_bytes());
                r.extend_from_slice(&[0, 2 + 2 + 20, 0xc0, 12, 0xc0, 12]);
                for v in [1u32, 3600, 600, 86400, input.u32()] {
                    r.extend_from_slice(&v.to_be_bytes());
                }
                ns += 1;
            }
            2 => {
                r.extend_from_slice(&[0, 0, 41]);
                r.extend_from_slice(&input.u16().to_be_bytes());
                r.extend_from_slice(&ttl.to_be_bytes());
                r.extend_from_slice(&[0, 0]);
                ar += 1;
            }
            3 => {
                // A big TXT record, to cross the client's UDP size.
                let len = input.u16() % 4000;
                r.extend_from_slice(&[0xc0, 12, 0, 16, 0, 1]);
                r.extend_from_slice(&ttl.to_be_bytes());
                r.extend_from_slice(&len.to_be_bytes());
                r.extend(std::iter::repeat_n(b'x', usize::from(len)));
                an += 1;
            }
            _ => {
                r.extend_from_slice(input.blob());
                an = an.wrapping_add(u16::from(input.u8() % 3));
            }
        }
    }
    if r.len() >= wire::HEADER_LEN {
        r[6..8].copy_from_slice(&an.to_be_bytes());
        r[8..10].copy_from_slice(&ns.to_be_bytes());
        r[10..12].copy_from_slice(&ar.to_be_bytes());
    }
    let cut = usize::from(input.u16());
    if cut != 0 && cut < r.len() {
        r.truncate(cut);
    }
    r
}

/// An upstream's reply to the query we sent with `sent_id` and `question`, through what the
/// relay does with it: the acceptance check, then (if accepted) the client's ID and spelling put
/// back, the TC cut for a client that cannot take it, and the record walk the cache does.
pub fn upstream_reply(
    reply: &[u8],
    sent_id: u16,
    question: &[u8],
    client: &[u8],
    client_edns: bool,
) {
    assert_eq!(question.len(), client.len());
    let records = wire::records(reply);
    if let Some(records) = &records {
        let h = header(reply).expect("records() needs a header");
        assert_eq!(
            records.len(),
            usize::from(h.an) + usize::from(h.ns) + usize::from(h.ar)
        );
        for rr in records {
            assert!(rr.ttl_offset + 4 <= reply.len(), "TTL inside the message");
            let at = rr.ttl_offset;
            assert_eq!(
                rr.ttl,
                u32::from_be_bytes([reply[at], reply[at + 1], reply[at + 2], reply[at + 3]])
            );
        }
    }
    // Differential: hickory reads every record, so whatever it reads we must be able to walk.
    if let Ok(msg) = Message::from_vec(reply) {
        let h = header(reply).expect("hickory read a header");
        assert!(
            records.is_some(),
            "hickory reads this reply but records() does not: {reply:02x?}"
        );
        let _ = (msg, h);
    }
    if !wire::reply_matches(reply, sent_id, question) {
        return;
    }
    let h = header(reply).expect("an accepted reply has a header");
    assert_eq!(h.id, sent_id);
    assert!(wire::is_response(reply));
    assert!(h.qd <= 1);
    if h.qd == 0 {
        assert_eq!(
            (h.an, h.ns),
            (0, 0),
            "records without a question are never accepted"
        );
    } else {
        let theirs = &reply[wire::HEADER_LEN..wire::HEADER_LEN + question.len()];
        assert!(theirs.eq_ignore_ascii_case(question));
    }
    let mut restored = reply.to_vec();
    let client_id = client_id_of(sent_id);
    wire::restore_for_client(&mut restored, client_id, client);
    assert_eq!(restored.len(), reply.len(), "restoring keeps the length");
    assert_eq!(wire::id(&restored), client_id);
    assert_eq!(&restored[2..wire::HEADER_LEN], &reply[2..wire::HEADER_LEN]);
    let q_end = if h.qd == 1 {
        assert_eq!(
            &restored[wire::HEADER_LEN..wire::HEADER_LEN + client.len()],
            client
        );
        wire::HEADER_LEN + client.len()
    } else {
        wire::HEADER_LEN
    };
    assert_eq!(
        &restored[q_end..],
        &reply[q_end..],
        "only ID and question change"
    );

    // The answer each kind of asker gets from it: within its limit, its own ID and question,
    // an OPT record only if it sent one (with its DO bit, no COOKIE, no ECS), and every record
    // that fits when it has to be cut.
    let client_query = client_query_for(client, client_edns, sent_id);
    let q = wire::parse_query(&client_query).expect("built queries parse");
    for limit in [512usize, 1232, 65535] {
        let mut out = Vec::new();
        localdns_fallback::answer::for_asker(reply, &client_query, &q, limit, &mut out);
        assert!(out.len() <= limit.max(reply.len().min(wire::HEADER_LEN)));
        let o = header(&out).expect("an answer has a header");
        assert_eq!(o.id, client_id_of(sent_id));
        assert_eq!(
            o.flags & 0x0100,
            u16::from(client_query[2] & 1) << 8,
            "RD as asked"
        );
        assert_eq!(wire::rcode(&out), wire::rcode(reply));
        if h.qd == 1 {
            assert_eq!(&out[wire::HEADER_LEN..q_end], client);
        }
        // Whatever hickory reads of the reply, it must read of the answer too, and the answer
        // keeps a prefix of the reply's records.
        let (Ok(theirs), Ok(ours)) = (Message::from_vec(reply), Message::from_vec(&out)) else {
            continue;
        };
        assert!(ours.answers().len() <= theirs.answers().len());
        assert_eq!(&theirs.answers()[..ours.answers().len()], ours.answers());
        if ours.answers().len() < theirs.answers().len() {
            assert!(ours.truncated(), "answer records left out without TC");
        }
        assert_eq!(
            ours.extensions().is_some(),
            client_edns && theirs.extensions().is_some()
        );
        if let Some(edns) = ours.extensions() {
            use hickory_proto::rr::rdata::opt::EdnsCode;
            assert!(!edns.flags().dnssec_ok, "the asker's DO (it sent none)");
            assert!(edns.option(EdnsCode::Cookie).is_none());
            assert!(edns.option(EdnsCode::Subnet).is_none());
        }
    }
    let _ = restored;
}

/// The ID the asker of [`upstream_reply`] used.
fn client_id_of(sent_id: u16) -> u16 {
    sent_id ^ 0x5555
}

/// A whole query with the asker's `question` (the header of a plain RD=1 query).
fn client_query_for(question: &[u8], edns: bool, sent_id: u16) -> Vec<u8> {
    let mut p = client_id_of(sent_id).to_be_bytes().to_vec();
    p.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, u8::from(edns)]);
    p.extend_from_slice(question);
    if edns {
        p.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 0]);
    }
    p
}

/// An address in the documentation range for upstream `k`.
pub fn upstream_addr(k: u8) -> SocketAddr {
    SocketAddr::from(([198, 18, 0, k], 53))
}

/// What every discovery source promises about the backends it found.
pub fn check_kube_dns(found: &localdns_fallback::discover::KubeDns) {
    for list in [&found.udp, &found.tcp] {
        for (i, addr) in list.iter().enumerate() {
            assert!(!list[..i].contains(addr), "{addr} listed twice in {list:?}");
        }
    }
}
