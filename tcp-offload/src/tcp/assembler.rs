//! Out-of-order receive queue. Segments that arrive ahead of `rcv.nxt` are
//! kept by reference to the buffer they arrived in (no copy), with overlaps
//! trimmed, and handed back in order once the gap fills. Memory is bounded
//! by bytes and by segment count, both configurable per connection.

use super::Payload;
use crate::seq::SeqNumber;
use crate::wire::SackBlocks;

/// Why `insert` did not keep a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Every byte is already held or already delivered.
    Duplicate,
    /// Keeping it would exceed the byte or segment bound.
    Full,
}

/// The out-of-order assembler.
#[derive(Debug)]
pub struct Assembler<B> {
    _marker: core::marker::PhantomData<B>,
}

impl<B: AsRef<[u8]>> Assembler<B> {
    /// An empty assembler holding at most `max_bytes` of payload in at most
    /// `max_segments` buffers. Storage for the segment list is allocated
    /// here, once.
    pub fn new(max_bytes: usize, max_segments: usize) -> Assembler<B> {
        let _ = (max_bytes, max_segments);
        unimplemented!()
    }

    /// Keeps `payload`, which starts at sequence number `seq`, trimming
    /// what is below `rcv_nxt` or already held. Part of a segment may be
    /// kept when only part of it is new.
    pub fn insert(
        &mut self,
        seq: SeqNumber,
        payload: Payload<B>,
        rcv_nxt: SeqNumber,
    ) -> Result<(), Rejected> {
        let _ = (seq, payload, rcv_nxt);
        unimplemented!()
    }

    /// Removes and returns the held payload that starts at `rcv_nxt` (after
    /// trimming anything below it), if any.
    pub fn pop(&mut self, rcv_nxt: SeqNumber) -> Option<Payload<B>> {
        let _ = rcv_nxt;
        unimplemented!()
    }

    /// SACK blocks describing what is held, the block containing the most
    /// recently inserted segment first (RFC 2018 §4), at most `max`.
    pub fn sack_blocks(&self, max: usize) -> SackBlocks {
        let _ = max;
        unimplemented!()
    }

    /// Payload bytes held.
    pub fn bytes(&self) -> usize {
        unimplemented!()
    }

    /// Number of buffers held.
    pub fn segments(&self) -> usize {
        unimplemented!()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.segments() == 0
    }

    /// Drops everything held (on reset).
    pub fn clear(&mut self) {
        unimplemented!()
    }
}
