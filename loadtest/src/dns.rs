//! DNS wire format, only as much as a load generator and a synthetic server need: build a query,
//! read a reply's header and question, turn a query into an answer in place.

/// Header length.
pub const HEADER: usize = 12;
/// Record types the harness uses.
pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
/// Response codes counted separately.
pub const RCODE_NOERROR: u8 = 0;
pub const RCODE_SERVFAIL: u8 = 2;
pub const RCODE_NXDOMAIN: u8 = 3;
pub const RCODE_REFUSED: u8 = 5;

/// Writes a recursive query (RD set, no EDNS, like glibc's stub resolver) for the wire-format
/// `qname` into `out`; returns its length, or None when `out` is too small.
pub fn write_query(out: &mut [u8], id: u16, qname: &[u8], qtype: u16) -> Option<usize> {
    let len = HEADER + qname.len() + 4;
    if out.len() < len {
        return None;
    }
    out[..HEADER].copy_from_slice(&[0, 0, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    out[..2].copy_from_slice(&id.to_be_bytes());
    out[HEADER..HEADER + qname.len()].copy_from_slice(qname);
    let q = HEADER + qname.len();
    out[q..q + 2].copy_from_slice(&qtype.to_be_bytes());
    out[q + 2..q + 4].copy_from_slice(&1u16.to_be_bytes());
    Some(len)
}

/// What the generator needs from a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyHead {
    pub id: u16,
    pub rcode: u8,
    pub truncated: bool,
}

/// Reads the header of a datagram that should be a reply; None when it is not one (too short or
/// QR clear).
pub fn reply_head(msg: &[u8]) -> Option<ReplyHead> {
    if msg.len() < HEADER || msg[2] & 0x80 == 0 {
        return None;
    }
    Some(ReplyHead {
        id: u16::from_be_bytes([msg[0], msg[1]]),
        rcode: msg[3] & 0x0f,
        truncated: msg[2] & 0x02 != 0,
    })
}

/// Length of the uncompressed name starting at `msg[at]`, or None when it is malformed or
/// compressed (queries and the question of a reply never are).
pub fn name_len(msg: &[u8], at: usize) -> Option<usize> {
    let mut i = at;
    loop {
        let l = *msg.get(i)? as usize;
        if l == 0 {
            return Some(i + 1 - at);
        }
        if l > 63 {
            return None;
        }
        i += 1 + l;
        if i - at > 255 {
            return None;
        }
    }
}

/// Does the question of `msg` ask for `qname` (wire format, compared ASCII-case-insensitively)?
pub fn question_is(msg: &[u8], qname: &[u8]) -> bool {
    if msg.len() < HEADER + qname.len() || msg[4..6] != [0, 1] {
        return false;
    }
    msg[HEADER..HEADER + qname.len()].eq_ignore_ascii_case(qname)
}

/// The A record the synthetic upstream gives for a name: 10.x.y.z, the low 24 bits an FNV-1a
/// hash of the lower-cased wire-format name. The generator computes the same, so a reply counts
/// as good only when it carries the upstream's answer for *that* name (not another name's, not
/// one a forwarder made up).
pub fn derived_a(qname: &[u8]) -> [u8; 4] {
    let mut h: u32 = 0x811c_9dc5;
    for b in qname {
        h ^= u32::from(b.to_ascii_lowercase());
        h = h.wrapping_mul(0x0100_0193);
    }
    let [_, x, y, z] = h.to_be_bytes();
    [10, x, y, z]
}

/// The AAAA record of a name: 2001:db8:: with the A record's four bytes at the end.
pub fn derived_aaaa(qname: &[u8]) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    v[12..].copy_from_slice(&derived_a(qname));
    v
}

/// How the synthetic upstream answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub ttl: u32,
    /// NOERROR with the records, or this error rcode with no records (REFUSED, SERVFAIL).
    pub rcode: u8,
}

/// The end of the question of a query or reply in `msg` (the offset of the answer section),
/// or None when there is not exactly one well-formed question.
pub fn question_end(msg: &[u8]) -> Option<usize> {
    if msg.len() < HEADER || msg[4..6] != [0, 1] {
        return None;
    }
    let q_end = HEADER + name_len(msg, HEADER)? + 4;
    (q_end <= msg.len()).then_some(q_end)
}

/// The synthetic upstream's answer: turns the query in `buf[..len]` into a reply in place and
/// returns the reply's length, or None to drop the datagram (a response, not one question, a
/// malformed name). With NOERROR, A and AAAA get one record derived from the name
/// ([`derived_a`], [`derived_aaaa`]) with `ttl`, every other type no data. With an error rcode,
/// the question only. EDNS is dropped (the answer is always small).
pub fn answer_in_place(buf: &mut [u8], len: usize, how: Answer) -> Option<usize> {
    let msg = &buf[..len];
    if len < HEADER || msg[2] & 0x80 != 0 {
        return None;
    }
    let q_end = question_end(msg)?;
    let qname_end = q_end - 4;
    let qtype = u16::from_be_bytes([msg[q_end - 4], msg[q_end - 3]]);
    let mut rdata = [0u8; 16];
    let rdlen = match qtype {
        _ if how.rcode != RCODE_NOERROR => 0,
        TYPE_A => {
            rdata[..4].copy_from_slice(&derived_a(&msg[HEADER..qname_end]));
            4
        }
        TYPE_AAAA => {
            rdata = derived_aaaa(&msg[HEADER..qname_end]);
            16
        }
        _ => 0,
    };
    let out_len = q_end + if rdlen == 0 { 0 } else { 12 + rdlen };
    if out_len > buf.len() {
        return None;
    }
    let rd = buf[2] & 0x01;
    let opcode = buf[2] & 0x78;
    buf[2] = 0x80 | opcode | 0x04 | rd; // QR, AA, RD copied
    buf[3] = 0x80 | (how.rcode & 0x0f); // RA, the rcode
    buf[6..12].copy_from_slice(&[0, u8::from(rdlen != 0), 0, 0, 0, 0]);
    if rdlen != 0 {
        let rr = &mut buf[q_end..out_len];
        rr[..2].copy_from_slice(&[0xc0, 0x0c]);
        rr[2..4].copy_from_slice(&qtype.to_be_bytes());
        rr[4..6].copy_from_slice(&1u16.to_be_bytes());
        rr[6..10].copy_from_slice(&how.ttl.to_be_bytes());
        rr[10..12].copy_from_slice(&(rdlen as u16).to_be_bytes());
        rr[12..].copy_from_slice(&rdata[..rdlen]);
    }
    Some(out_len)
}

/// Skips a possibly compressed name at `msg[at]`; returns the offset after it.
fn skip_name(msg: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let l = *msg.get(at)?;
        match l {
            0 => return Some(at + 1),
            0xc0..=0xff => return (at + 2 <= msg.len()).then_some(at + 2),
            1..=63 => at += 1 + l as usize,
            _ => return None,
        }
    }
}

/// Does the answer section of the reply `msg` (whose question ends at `q_end`) hold an A record
/// with `want` as its address? Any owner name is accepted: a forwarder may compress it its own way.
pub fn has_a(msg: &[u8], q_end: usize, want: [u8; 4]) -> bool {
    let ancount = u16::from_be_bytes([msg[6], msg[7]]);
    let mut at = q_end;
    for _ in 0..ancount {
        let Some(after) = skip_name(msg, at) else {
            return false;
        };
        let Some(fixed) = msg.get(after..after + 10) else {
            return false;
        };
        let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let rdlen = u16::from_be_bytes([fixed[8], fixed[9]]) as usize;
        let Some(rdata) = msg.get(after + 10..after + 10 + rdlen) else {
            return false;
        };
        if rtype == TYPE_A && rdata == want {
            return true;
        }
        at = after + 10 + rdlen;
    }
    false
}

/// The name the synthetic upstream answers with its query counter instead of an address: asked
/// directly (never through a system under test), its A record is the number of queries the
/// responder has received, as a big-endian u32.
pub const STATS_NAME: &str = "_stats.load.test";
/// [`STATS_NAME`] in wire format.
pub const STATS_WIRE: &[u8] = b"\x06_stats\x04load\x04test\x00";

/// `example.com.` -> wire format; None for an empty label or one over 63 bytes.
pub fn encode_name(name: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(name.len() + 2);
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return None;
        }
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A300: Answer = Answer {
        ttl: 300,
        rcode: RCODE_NOERROR,
    };

    #[test]
    fn query_then_answer_then_reply_head() {
        let name = encode_name("a1.load.test.").unwrap();
        let mut buf = [0u8; 512];
        let len = write_query(&mut buf, 0x1234, &name, TYPE_A).unwrap();
        assert!(reply_head(&buf[..len]).is_none(), "a query is not a reply");
        let alen = answer_in_place(&mut buf, len, A300).unwrap();
        assert_eq!(alen, len + 16);
        let head = reply_head(&buf[..alen]).unwrap();
        assert_eq!(
            head,
            ReplyHead {
                id: 0x1234,
                rcode: RCODE_NOERROR,
                truncated: false
            }
        );
        assert!(question_is(
            &buf[..alen],
            &encode_name("A1.LOAD.test").unwrap()
        ));
        assert!(!question_is(
            &buf[..alen],
            &encode_name("a2.load.test").unwrap()
        ));
        let want = derived_a(&encode_name("a1.load.test").unwrap());
        assert_eq!(&buf[alen - 4..alen], &want);
        assert_eq!(want, derived_a(&encode_name("A1.Load.TEST").unwrap()));
        assert_ne!(want, derived_a(&encode_name("a2.load.test").unwrap()));
        let q_end = question_end(&buf[..alen]).unwrap();
        assert!(has_a(&buf[..alen], q_end, want));
        assert!(!has_a(&buf[..alen], q_end, [192, 0, 2, 1]));
        assert!(
            answer_in_place(&mut buf, alen, A300).is_none(),
            "a reply is never answered"
        );
    }

    #[test]
    fn the_stats_name_in_wire_format() {
        assert_eq!(encode_name(STATS_NAME).unwrap(), STATS_WIRE);
    }

    #[test]
    fn an_error_rcode_has_no_records() {
        let name = encode_name("r.load.test").unwrap();
        let mut buf = [0u8; 512];
        let len = write_query(&mut buf, 7, &name, TYPE_A).unwrap();
        let how = Answer {
            ttl: 300,
            rcode: RCODE_REFUSED,
        };
        let alen = answer_in_place(&mut buf, len, how).unwrap();
        assert_eq!(alen, len);
        assert_eq!(reply_head(&buf[..alen]).unwrap().rcode, RCODE_REFUSED);
        assert!(!has_a(&buf[..alen], len, derived_a(&name)));
    }

    #[test]
    fn malformed_names_are_dropped() {
        let mut buf = [0u8; 64];
        buf[..12].copy_from_slice(&[0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        buf[12] = 0xc0; // a pointer in a question
        assert!(answer_in_place(&mut buf, 20, A300).is_none());
        buf[12] = 40; // a label running past the end
        assert!(answer_in_place(&mut buf, 20, A300).is_none());
    }
}
