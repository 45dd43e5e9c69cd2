//! Out-of-order receive queue (RFC 9293 §3.10.7.4, "segment text"; SACK
//! block generation per RFC 2018 §4). Segments that arrive ahead of
//! `rcv.nxt` are kept by reference to the buffer they arrived in (no copy),
//! with overlaps trimmed, and handed back in order once the gap fills.
//! Memory is bounded by bytes and by segment count, both configurable per
//! connection; the segment list is allocated once, at construction.
//!
//! The connection inserts every segment that starts above `rcv.nxt` and,
//! after each advance of `rcv.nxt`, pops until [`Assembler::pop`] returns
//! `None`. Held payloads never overlap one another and are kept sorted by
//! sequence number.
//!
//! Overlap policy. A new segment keeps only bytes that are not already
//! held; bytes it shares with held data are trimmed from the new segment,
//! not from the held one (the held copy arrived first and is as good).
//! Held segments that the new one covers entirely are released (their
//! buffers dropped), so that a large retransmission replaces the small
//! pieces it spans, and the one held segment that may reach past the new
//! one's end cuts it short. A payload is one contiguous range of one buffer
//! and is not `Clone`, so it could not be split into two pieces around a
//! held segment; releasing covered segments means it never has to be, and
//! no new byte is lost to overlap handling.
//!
//! Bounds policy. When keeping a segment would exceed the byte or segment
//! bound, held segments *above* it are evicted, highest first: data nearer
//! `rcv.nxt` is worth more, and this guarantees that the segment filling the
//! first hole always fits. Evicting SACKed data is reneging, which RFC 2018
//! §8 allows (the sender keeps SACKed data until it is cumulatively
//! acknowledged). A segment that still does not fit is truncated to the
//! bytes that do, or rejected with [`Rejected::Full`] when none do.

use std::collections::VecDeque;

use super::Payload;
use crate::seq::SeqNumber;
use crate::wire::SackBlocks;

/// Why `insert` did not keep a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Every byte is already held or already delivered.
    Duplicate,
    /// Keeping it would exceed the byte or segment bound, and nothing held
    /// above it could be evicted to make room.
    Full,
}

/// One held payload: its first sequence number, the payload, and the
/// insertion stamp that orders SACK blocks by recency.
#[derive(Debug)]
struct Held<B> {
    seq: SeqNumber,
    payload: Payload<B>,
    stamp: u64,
}

impl<B: AsRef<[u8]>> Held<B> {
    fn end(&self) -> SeqNumber {
        self.seq + self.payload.len()
    }
}

/// The out-of-order assembler.
#[derive(Debug)]
pub struct Assembler<B> {
    held: VecDeque<Held<B>>,
    bytes: usize,
    max_bytes: usize,
    max_segments: usize,
    /// Incremented on every accepted insert (and on a duplicate that lands
    /// inside held data), so the most recent segment has the largest stamp.
    next_stamp: u64,
    /// Held segments dropped to make room for lower ones.
    evicted: u64,
}

impl<B: AsRef<[u8]>> Assembler<B> {
    /// An empty assembler holding at most `max_bytes` of payload in at most
    /// `max_segments` buffers. Storage for the segment list is allocated
    /// at the first insert, once.
    pub fn new(max_bytes: usize, max_segments: usize) -> Assembler<B> {
        Assembler {
            held: VecDeque::new(),
            bytes: 0,
            max_bytes,
            max_segments,
            next_stamp: 0,
            evicted: 0,
        }
    }

    /// Keeps `payload`, which starts at sequence number `seq`, trimming
    /// what is below `rcv_nxt` or already held. Part of a segment may be
    /// kept when only part of it is new (see the module documentation for
    /// the overlap and bounds policies).
    pub fn insert(
        &mut self,
        seq: SeqNumber,
        mut payload: Payload<B>,
        rcv_nxt: SeqNumber,
    ) -> Result<(), Rejected> {
        self.discard_below(rcv_nxt);
        let mut start = seq;
        let end = seq + payload.len();
        if payload.is_empty() || end.diff(rcv_nxt) <= 0 {
            return Err(Rejected::Duplicate);
        }
        if start.diff(rcv_nxt) < 0 {
            payload.trim_front(rcv_nxt - start);
            start = rcv_nxt;
        }

        // Skip held segments entirely below the new one; trim the front of
        // the new one where held segments cover it.
        let mut i = self.held.partition_point(|h| h.end().diff(start) <= 0);
        while let Some(h) = self.held.get_mut(i) {
            if h.seq.diff(start) > 0 {
                break;
            }
            if h.end().diff(end) >= 0 {
                // Entirely inside held data: report it as the most recent
                // block (RFC 2018 §4: the first block names the segment that
                // triggered the ACK).
                h.stamp = self.next_stamp;
                self.next_stamp += 1;
                return Err(Rejected::Duplicate);
            }
            payload.trim_front(h.end() - start);
            start = h.end();
            i += 1;
        }

        // Held segments the new one covers entirely are released; the first
        // that reaches past its end cuts the new one short.
        let mut j = i;
        let mut freed = 0;
        while let Some(h) = self.held.get(j) {
            if h.seq.diff(end) >= 0 {
                break;
            }
            if h.end().diff(end) > 0 {
                payload.truncate(h.seq - start);
                break;
            }
            freed += h.payload.len();
            j += 1;
        }
        let covered = j - i;
        // Room needed after releasing the covered segments.
        let mut bytes_after = self.bytes - freed;
        let mut segments_after = self.held.len() - covered;
        // Make room from the top, only above the new segment (indices from
        // `j` up): whole segments for the segment bound; for the byte bound,
        // whole segments while they are smaller than the excess, then the
        // tail of the next one.
        let mut top = self.held.len();
        let mut trim_top = 0;
        while top > j {
            let hl = self.held[top - 1].payload.len();
            let excess = (bytes_after + payload.len()).saturating_sub(self.max_bytes);
            if segments_after + 1 > self.max_segments || excess >= hl {
                top -= 1;
                bytes_after -= hl;
                segments_after -= 1;
            } else {
                trim_top = excess;
                break;
            }
        }
        if segments_after + 1 > self.max_segments || bytes_after - trim_top >= self.max_bytes {
            return Err(Rejected::Full);
        }
        // Commit: evict, trim, release the covered segments, then insert.
        while self.held.len() > top {
            if let Some(h) = self.held.pop_back() {
                self.bytes -= h.payload.len();
                self.evicted += 1;
            }
        }
        if trim_top > 0 {
            let h = &mut self.held[top - 1];
            let keep = h.payload.len() - trim_top;
            h.payload.truncate(keep);
            self.bytes -= trim_top;
        }
        for h in self.held.drain(i..j) {
            self.bytes -= h.payload.len();
        }
        payload.truncate(self.max_bytes - self.bytes);
        self.bytes += payload.len();
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        crate::room::room_for(&mut self.held, self.max_segments);
        self.held.insert(
            i,
            Held {
                seq: start,
                payload,
                stamp,
            },
        );
        Ok(())
    }

    /// Removes and returns the held payload that starts at `rcv_nxt` (after
    /// trimming anything below it), if any. Payloads wholly below `rcv_nxt`
    /// are discarded.
    pub fn pop(&mut self, rcv_nxt: SeqNumber) -> Option<Payload<B>> {
        self.discard_below(rcv_nxt);
        if self.held.front()?.seq != rcv_nxt {
            return None;
        }
        let h = self.held.pop_front()?;
        self.bytes -= h.payload.len();
        Some(h.payload)
    }

    /// Drops held payloads entirely below `rcv_nxt` and trims the front of
    /// one that straddles it.
    fn discard_below(&mut self, rcv_nxt: SeqNumber) {
        while let Some(h) = self.held.front_mut() {
            if h.end().diff(rcv_nxt) <= 0 {
                self.bytes -= h.payload.len();
                self.held.pop_front();
            } else {
                if h.seq.diff(rcv_nxt) < 0 {
                    let n = rcv_nxt - h.seq;
                    h.payload.trim_front(n);
                    h.seq = rcv_nxt;
                    self.bytes -= n;
                }
                break;
            }
        }
    }

    /// SACK blocks describing what is held, at most `max` (and at most
    /// [`SackBlocks::MAX`]). Adjacent payloads merge into one block. The
    /// block containing the most recently inserted segment comes first
    /// (RFC 2018 §4); the others follow in descending order of their most
    /// recent insertion, which approximates the RFC's "repeat the most
    /// recently reported blocks" without keeping a report history.
    ///
    /// Costs `O(max × segments)` and allocates nothing.
    pub fn sack_blocks(&self, max: usize) -> SackBlocks {
        let mut out = SackBlocks::new();
        let max = max.min(SackBlocks::MAX);
        // Stamps are unique, so each pass picks the block whose latest
        // insertion is the most recent below the previous pick.
        let mut below = u64::MAX;
        while out.len() < max {
            let mut best: Option<(u64, SeqNumber, SeqNumber)> = None;
            for (left, right, stamp) in self.blocks() {
                if stamp < below && best.map_or(true, |(s, _, _)| stamp > s) {
                    best = Some((stamp, left, right));
                }
            }
            match best {
                Some((stamp, left, right)) => {
                    out.push(left, right);
                    below = stamp;
                }
                None => break,
            }
        }
        out
    }

    /// Contiguous blocks `(left, right, latest stamp)` in sequence order.
    fn blocks(&self) -> impl Iterator<Item = (SeqNumber, SeqNumber, u64)> + '_ {
        let mut k = 0;
        core::iter::from_fn(move || {
            let first = self.held.get(k)?;
            let (left, mut right, mut stamp) = (first.seq, first.end(), first.stamp);
            k += 1;
            while let Some(h) = self.held.get(k) {
                if h.seq != right {
                    break;
                }
                right = h.end();
                stamp = stamp.max(h.stamp);
                k += 1;
            }
            Some((left, right, stamp))
        })
    }

    /// The held ranges `[start, end)`, one per buffer, in sequence order.
    pub fn ranges(&self) -> impl Iterator<Item = (SeqNumber, SeqNumber)> + '_ {
        self.held.iter().map(|h| (h.seq, h.end()))
    }

    /// The end of the highest held byte, if anything is held.
    pub fn highest_end(&self) -> Option<SeqNumber> {
        self.held.back().map(Held::end)
    }

    /// Payload bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of buffers held.
    pub fn segments(&self) -> usize {
        self.held.len()
    }

    /// Held segments evicted so far to make room for lower ones.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.segments() == 0
    }

    /// Drops everything held (on reset).
    pub fn clear(&mut self) {
        self.held.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A payload of `len` bytes holding the stream bytes from `off`, in a
    /// buffer with junk around it so offsets are exercised.
    fn seg(stream: &[u8], off: usize, len: usize) -> Payload<Vec<u8>> {
        let mut buf = vec![0xEE; 3];
        buf.extend_from_slice(&stream[off..off + len]);
        buf.extend_from_slice(&[0xDD; 2]);
        Payload::new(buf, 3..3 + len).expect("range inside buffer")
    }

    fn stream(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn ranges(a: &Assembler<Vec<u8>>) -> Vec<(u32, u32)> {
        a.ranges().map(|(s, e)| (s.0, e.0)).collect()
    }

    #[test]
    fn in_order_pop_and_gap() {
        let s = stream(100);
        let mut a = Assembler::new(1000, 8);
        let base = SeqNumber(1000);
        a.insert(base + 20, seg(&s, 20, 10), base).unwrap();
        assert!(a.pop(base).is_none());
        a.insert(base, seg(&s, 0, 20), base).unwrap();
        let p = a.pop(base).unwrap();
        assert_eq!(p.bytes(), &s[0..20]);
        let p = a.pop(base + 20).unwrap();
        assert_eq!(p.bytes(), &s[20..30]);
        assert!(a.is_empty());
        assert_eq!(a.bytes(), 0);
    }

    #[test]
    fn trims_overlaps_and_rejects_duplicates() {
        let s = stream(200);
        let mut a = Assembler::new(1000, 8);
        let b = SeqNumber(0);
        a.insert(b + 50, seg(&s, 50, 20), b).unwrap(); // [50,70)
        assert_eq!(
            a.insert(b + 55, seg(&s, 55, 10), b),
            Err(Rejected::Duplicate)
        );
        assert_eq!(
            a.insert(b + 5, seg(&s, 5, 5), b + 20),
            Err(Rejected::Duplicate)
        );
        // Overlaps the tail: only [70,80) is new.
        a.insert(b + 60, seg(&s, 60, 20), b).unwrap();
        assert_eq!(ranges(&a), vec![(50, 70), (70, 80)]);
        // Overlaps the head: only [40,50) is new.
        a.insert(b + 40, seg(&s, 40, 15), b).unwrap();
        assert_eq!(ranges(&a), vec![(40, 50), (50, 70), (70, 80)]);
        // Reaches into [100,110) from below: cut at 100.
        a.insert(b + 100, seg(&s, 100, 10), b).unwrap();
        a.insert(b + 95, seg(&s, 95, 10), b).unwrap();
        assert_eq!(
            ranges(&a),
            vec![(40, 50), (50, 70), (70, 80), (95, 100), (100, 110)]
        );
        assert_eq!(a.bytes(), 10 + 20 + 10 + 5 + 10);
        // Starts below rcv_nxt: trimmed.
        let p = {
            a.insert(b + 30, seg(&s, 30, 15), b + 35).unwrap();
            a.pop(b + 35).unwrap()
        };
        assert_eq!(p.bytes(), &s[35..40]);
        assert_eq!(p.offset(), 3 + 5);
    }

    #[test]
    fn covering_segment_replaces_held_pieces() {
        let s = stream(200);
        let mut a = Assembler::new(1000, 8);
        let b = SeqNumber(0);
        a.insert(b + 20, seg(&s, 20, 5), b).unwrap();
        a.insert(b + 30, seg(&s, 30, 5), b).unwrap();
        a.insert(b + 10, seg(&s, 10, 40), b).unwrap();
        assert_eq!(ranges(&a), vec![(10, 50)]);
        assert_eq!(a.bytes(), 40);
    }

    #[test]
    fn pop_trims_and_discards_below() {
        let s = stream(100);
        let mut a = Assembler::new(1000, 8);
        let b = SeqNumber(u32::MAX - 5); // wraps
        a.insert(b + 10, seg(&s, 10, 10), b).unwrap();
        a.insert(b + 30, seg(&s, 30, 10), b).unwrap();
        // rcv_nxt moved past the first one entirely, into the second.
        let p = a.pop(b + 35).unwrap();
        assert_eq!(p.bytes(), &s[35..40]);
        assert!(a.is_empty());
        assert_eq!(a.bytes(), 0);
    }

    #[test]
    fn bounds_evict_from_the_top() {
        let s = stream(400);
        let b = SeqNumber(7);
        // Segment bound.
        let mut a = Assembler::new(10_000, 2);
        a.insert(b + 100, seg(&s, 100, 10), b).unwrap();
        a.insert(b + 200, seg(&s, 200, 10), b).unwrap();
        assert_eq!(a.insert(b + 300, seg(&s, 300, 10), b), Err(Rejected::Full));
        a.insert(b + 50, seg(&s, 50, 10), b).unwrap();
        assert_eq!(ranges(&a), vec![(57, 67), (107, 117)]);
        assert_eq!(a.evicted(), 1);
        // Byte bound: truncation, then eviction.
        let mut a = Assembler::new(25, 8);
        a.insert(b + 100, seg(&s, 100, 20), b).unwrap();
        a.insert(b + 200, seg(&s, 200, 20), b).unwrap();
        assert_eq!(ranges(&a), vec![(107, 127), (207, 212)]);
        assert_eq!(a.insert(b + 300, seg(&s, 300, 10), b), Err(Rejected::Full));
        a.insert(b + 10, seg(&s, 10, 10), b).unwrap();
        assert_eq!(ranges(&a), vec![(17, 27), (107, 122)]);
        assert!(a.bytes() <= 25);
        // The first hole always fits.
        a.insert(b, seg(&s, 0, 25), b).unwrap();
        assert_eq!(ranges(&a), vec![(7, 32)]);
    }

    #[test]
    fn sack_blocks_most_recent_first() {
        let s = stream(300);
        let mut a = Assembler::new(10_000, 16);
        let b = SeqNumber(0);
        a.insert(b + 100, seg(&s, 100, 10), b).unwrap();
        a.insert(b + 200, seg(&s, 200, 10), b).unwrap();
        a.insert(b + 110, seg(&s, 110, 10), b).unwrap(); // merges with 100
        a.insert(b + 50, seg(&s, 50, 10), b).unwrap();
        let blocks = a.sack_blocks(4);
        let got: Vec<(u32, u32)> = blocks.as_slice().iter().map(|(l, r)| (l.0, r.0)).collect();
        assert_eq!(got, vec![(50, 60), (100, 120), (200, 210)]);
        assert_eq!(a.sack_blocks(2).len(), 2);
        // A duplicate inside a held block makes it the most recent.
        assert_eq!(
            a.insert(b + 202, seg(&s, 202, 3), b),
            Err(Rejected::Duplicate)
        );
        assert_eq!(a.sack_blocks(1).as_slice(), &[(b + 200, b + 210)]);
        assert!(Assembler::<Vec<u8>>::new(10, 2).sack_blocks(4).is_empty());
        a.clear();
        assert!(a.is_empty());
        assert_eq!(a.bytes(), 0);
    }

    /// Invariants: bounds hold, held ranges are non-empty, sorted, disjoint,
    /// above `rcv_nxt`, and add up to `bytes()`.
    fn check(
        a: &Assembler<Vec<u8>>,
        rcv_nxt: SeqNumber,
        max_bytes: usize,
        max_segments: usize,
    ) -> Result<(), TestCaseError> {
        prop_assert!(a.bytes() <= max_bytes);
        prop_assert!(a.segments() <= max_segments);
        let mut bytes = 0;
        let mut prev: Option<SeqNumber> = None;
        for (st, en) in a.ranges() {
            prop_assert!(en.diff(st) > 0);
            prop_assert!(st.diff(rcv_nxt) >= 0);
            if let Some(p) = prev {
                prop_assert!(st.diff(p) >= 0);
            }
            bytes += en - st;
            prev = Some(en);
        }
        prop_assert_eq!(bytes, a.bytes());
        Ok(())
    }

    proptest! {
        /// Random pieces of a stream in random order, with duplicates and
        /// overlaps and `rcv_nxt` advancing as pieces are popped, then a
        /// full in-order "retransmission": the popped bytes are the stream,
        /// exactly, and the bounds hold after every operation.
        #[test]
        fn reassembles_stream(
            len in 1usize..3000,
            isn in prop_oneof![Just(u32::MAX - 1000), any::<u32>()],
            cuts in proptest::collection::vec((0usize..3000, 1usize..400), 1..80),
            max_bytes in 1usize..4000,
            max_segments in 1usize..20,
        ) {
            let s = stream(len);
            let base = SeqNumber(isn);
            let mut a = Assembler::new(max_bytes, max_segments);
            let mut out: Vec<u8> = Vec::new();
            let pieces: Vec<(usize, usize)> = cuts
                .iter()
                .map(|&(o, l)| (o % len, l.min(len - o % len)))
                .collect();
            for (off, l) in pieces {
                let rcv_nxt = base + out.len();
                let r = a.insert(base + off, seg(&s, off, l), rcv_nxt);
                check(&a, base + out.len(), max_bytes, max_segments)?;
                if r.is_ok() {
                    // The block of the newest segment is reported first.
                    let first = a.sack_blocks(4).as_slice()[0];
                    let (s0, e0) = (base + off, base + off + l);
                    prop_assert!(first.0.diff(e0) < 0 && first.1.diff(s0) > 0);
                }
                while let Some(p) = a.pop(base + out.len()) {
                    out.extend_from_slice(p.bytes());
                }
            }
            // Then retransmit from rcv_nxt, in order, until complete: each
            // round fills the first hole with at least one byte.
            while out.len() < len {
                let off = out.len();
                let r = a.insert(base + off, seg(&s, off, 97.min(len - off)), base + off);
                prop_assert_eq!(r, Ok(()));
                check(&a, base + out.len(), max_bytes, max_segments)?;
                while let Some(p) = a.pop(base + out.len()) {
                    out.extend_from_slice(p.bytes());
                }
                prop_assert!(out.len() > off);
            }
            prop_assert_eq!(&out[..], &s[..]);
            prop_assert!(a.is_empty());
        }
    }
}
