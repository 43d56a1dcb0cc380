//! The engine's queue of transmits. Buffers are kept and reused, so a steady stream of queries
//! costs no allocation per packet; a burst (a reply for hundreds of coalesced askers) may leave
//! a few more behind, but never more than `KEEP`.

use super::{Dest, Transmit};

/// Buffers kept between bursts.
const KEEP: usize = 64;
/// A kept buffer larger than this (a 64 KiB TCP answer) is given back to the allocator.
const KEEP_BYTES: usize = 8192;

#[derive(Default)]
pub struct Outbox {
    items: Vec<(Dest, Vec<u8>)>,
    /// Items `next..len` are queued; `len..` are spare buffers.
    len: usize,
    next: usize,
}

impl Outbox {
    pub fn push(&mut self, dest: Dest, bytes: &[u8]) {
        self.push_with(dest, |out| out.extend_from_slice(bytes));
    }

    /// Queues a transmit whose bytes `fill` writes into an empty buffer.
    pub fn push_with(&mut self, dest: Dest, fill: impl FnOnce(&mut Vec<u8>)) {
        if self.len == self.items.len() {
            self.items.push((dest, Vec::new()));
        }
        let item = &mut self.items[self.len];
        item.0 = dest;
        item.1.clear();
        fill(&mut item.1);
        self.len += 1;
    }

    pub fn pop(&mut self) -> Option<Transmit<'_>> {
        if self.next < self.len {
            let i = self.next;
            self.next += 1;
            let (dest, bytes) = &self.items[i];
            return Some(Transmit { dest: *dest, bytes });
        }
        if self.len == 0 {
            return None;
        }
        self.next = 0;
        self.len = 0;
        self.items.truncate(KEEP);
        for (_, buf) in &mut self.items {
            if buf.capacity() > KEEP_BYTES {
                *buf = Vec::new();
            }
        }
        None
    }
}
