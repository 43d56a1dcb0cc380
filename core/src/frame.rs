//! DNS over TCP framing (RFC 1035 §4.2.2, RFC 7766): every message is preceded by its length in
//! two octets. A pure decoder: the TCP tasks feed it what they read, the fuzz targets feed it
//! anything, and neither can make it hold more than one read plus one message.

/// Why a stream cannot be decoded further.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// A length prefix over the limit: not worth reading, since every byte read is held.
    TooLong(usize),
}

/// Splits a byte stream into messages.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Where the next frame starts in `buf`; consumed bytes are dropped lazily.
    start: usize,
    max: usize,
}

impl FrameDecoder {
    /// A decoder that refuses messages longer than `max` bytes.
    pub fn new(max: usize) -> FrameDecoder {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
            max,
        }
    }

    /// Adds bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.start == self.buf.len() || self.start > 4096 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole message, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, FrameError> {
        let rest = &self.buf[self.start..];
        let [hi, lo, ..] = *rest else {
            return Ok(None);
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if len > self.max {
            return Err(FrameError::TooLong(len));
        }
        if rest.len() < 2 + len {
            return Ok(None);
        }
        let at = self.start + 2;
        self.start = at + len;
        Ok(Some(&self.buf[at..at + len]))
    }

    /// Bytes of an unfinished message are waiting: a stream that ends now ended mid-message.
    pub fn mid_frame(&self) -> bool {
        self.start < self.buf.len()
    }
}

/// Appends `message` with its length prefix. Messages over 65,535 bytes cannot be framed; the
/// callers never build one (replies come from 16-bit-framed or datagram sources).
pub fn encode(message: &[u8], out: &mut Vec<u8>) {
    let len = u16::try_from(message.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&message[..usize::from(len)]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_pipelined_messages_fed_in_any_pieces() {
        let mut stream = Vec::new();
        for m in [&b"abc"[..], b"", b"hello world"] {
            encode(m, &mut stream);
        }
        for chunk in [1, 2, 3, 7, stream.len()] {
            let mut d = FrameDecoder::new(100);
            let mut got: Vec<Vec<u8>> = Vec::new();
            for piece in stream.chunks(chunk) {
                d.feed(piece);
                while let Some(m) = d.next_frame().unwrap() {
                    got.push(m.to_vec());
                }
            }
            assert_eq!(got, [b"abc".to_vec(), vec![], b"hello world".to_vec()]);
            assert!(!d.mid_frame());
        }
    }

    #[test]
    fn a_partial_message_is_reported_and_an_oversized_one_refused() {
        let mut d = FrameDecoder::new(10);
        d.feed(&[0, 5, 1, 2]);
        assert_eq!(d.next_frame(), Ok(None));
        assert!(d.mid_frame());
        let mut d = FrameDecoder::new(10);
        d.feed(&[0, 11]);
        assert_eq!(d.next_frame(), Err(FrameError::TooLong(11)));
    }
}
