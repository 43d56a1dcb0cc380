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

/// The synthetic upstream's answer: turns the query in `buf[..len]` into a reply in place and
/// returns the reply's length, or None to drop the datagram (a response, not one question, a
/// malformed name). A and AAAA get one record with `ttl` (192.0.2.1 / 2001:db8::1), every other
/// type NOERROR with no data. EDNS is dropped (the answer is always small).
pub fn answer_in_place(buf: &mut [u8], len: usize, ttl: u32) -> Option<usize> {
    let msg = &buf[..len];
    if len < HEADER || msg[2] & 0x80 != 0 || msg[4..6] != [0, 1] {
        return None;
    }
    let q_end = HEADER + name_len(msg, HEADER)? + 4;
    if q_end > len {
        return None;
    }
    let qtype = u16::from_be_bytes([msg[q_end - 4], msg[q_end - 3]]);
    let rdata: &[u8] = match qtype {
        TYPE_A => &[192, 0, 2, 1],
        TYPE_AAAA => &[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        _ => &[],
    };
    let out_len = q_end
        + if rdata.is_empty() {
            0
        } else {
            12 + rdata.len()
        };
    if out_len > buf.len() {
        return None;
    }
    let rd = buf[2] & 0x01;
    let opcode = buf[2] & 0x78;
    buf[2] = 0x80 | opcode | 0x04 | rd; // QR, AA, RD copied
    buf[3] = 0x80; // RA, NOERROR
    buf[6..12].copy_from_slice(&[0, u8::from(!rdata.is_empty()), 0, 0, 0, 0]);
    if !rdata.is_empty() {
        let rr = &mut buf[q_end..out_len];
        rr[..2].copy_from_slice(&[0xc0, 0x0c]);
        rr[2..4].copy_from_slice(&qtype.to_be_bytes());
        rr[4..6].copy_from_slice(&1u16.to_be_bytes());
        rr[6..10].copy_from_slice(&ttl.to_be_bytes());
        rr[10..12].copy_from_slice(&(rdata.len() as u16).to_be_bytes());
        rr[12..].copy_from_slice(rdata);
    }
    Some(out_len)
}

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

    #[test]
    fn query_then_answer_then_reply_head() {
        let name = encode_name("a1.load.test.").unwrap();
        let mut buf = [0u8; 512];
        let len = write_query(&mut buf, 0x1234, &name, TYPE_A).unwrap();
        assert!(reply_head(&buf[..len]).is_none(), "a query is not a reply");
        let alen = answer_in_place(&mut buf, len, 300).unwrap();
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
        assert_eq!(&buf[alen - 4..alen], &[192, 0, 2, 1]);
        assert!(
            answer_in_place(&mut buf, alen, 300).is_none(),
            "a reply is never answered"
        );
    }

    #[test]
    fn malformed_names_are_dropped() {
        let mut buf = [0u8; 64];
        buf[..12].copy_from_slice(&[0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        buf[12] = 0xc0; // a pointer in a question
        assert!(answer_in_place(&mut buf, 20, 1).is_none());
        buf[12] = 40; // a label running past the end
        assert!(answer_in_place(&mut buf, 20, 1).is_none());
    }
}
