//! The send queue: records handed over by the upper layer, in sequence
//! order, from the oldest unacknowledged to the newest not yet sent. It is
//! also the sender's scoreboard (RFC 6675 §3): each record carries whether
//! it has been SACKed, whether it is deemed lost, and whether the loss has
//! been repaired by a retransmission, and the queue keeps byte totals of
//! those marks so that the pipe estimate costs nothing per segment.
//!
//! A record is one segment. Because the boundaries are the records', the
//! scoreboard is record-granular: a record counts as SACKed only when a
//! block covers all of it.
//!
//! Besides repairs of records deemed lost, a record may be resent while it
//! is not deemed lost (RFC 6675 `NextSeg` rules 3 and 4): such a
//! *speculative* copy and the original may both be in flight, so the queue
//! counts its bytes apart and `pipe` adds them (RFC 6675 §4, `SetPipe`
//! counts an octet once for the original and once for a retransmission).

use std::collections::VecDeque;

use crate::seq::SeqNumber;
use crate::time::Instant;

/// One record and its scoreboard marks.
#[derive(Debug)]
pub(super) struct SentRecord<R> {
    pub(super) record: R,
    /// Sequence number of its first byte, fixed when it is queued.
    pub(super) seq: SeqNumber,
    pub(super) len: usize,
    /// Covered entirely by a SACK block.
    pub(super) sacked: bool,
    /// Deemed lost (by RTO, three duplicate ACKs, a partial ACK or the SACK
    /// `IsLost` rule) and due for retransmission.
    pub(super) lost: bool,
    /// Retransmitted since it was last marked lost: the repair is in flight.
    pub(super) rexmit: bool,
    /// Resent while not deemed lost: original and copy may both be in
    /// flight. Cleared when the record is SACKed or deemed lost.
    pub(super) spec: bool,
    /// Ever retransmitted. Karn's algorithm takes no RTT sample from it.
    pub(super) ever_rexmit: bool,
    /// Offset of the next piece of a retransmission that is sent in pieces
    /// (only after the MSS shrank below the record's length).
    pub(super) rtx_off: usize,
    /// Time of its latest (re)transmission, for RTT samples.
    pub(super) sent_at: Instant,
    /// Already counted in `records_split`.
    pub(super) split_counted: bool,
}

impl<R> SentRecord<R> {
    pub(super) fn end(&self) -> SeqNumber {
        self.seq + self.len
    }

    /// Lost and not yet repaired.
    fn pending(&self) -> bool {
        self.lost && !self.rexmit && !self.sacked
    }
}

/// Records from `snd.una` on, with the scoreboard totals.
#[derive(Debug)]
pub(super) struct SendQueue<R> {
    recs: VecDeque<SentRecord<R>>,
    /// Sequence number after the last queued record.
    end: SeqNumber,
    /// Index of the first record not yet entirely sent.
    next_new: usize,
    /// Bytes of records marked SACKed.
    sacked_bytes: usize,
    /// Bytes of records lost and not yet retransmitted.
    pending_bytes: usize,
    /// Bytes of records with a speculative copy in flight.
    spec_bytes: usize,
    /// One past the highest sequence number a SACK block covered in a
    /// record still queued, if any.
    high_sacked: Option<SeqNumber>,
    /// No record below this index is pending retransmission.
    rtx_hint: usize,
    /// No record below this index is a candidate of `next_unlost_hole`.
    hole_hint: usize,
}

impl<R> SendQueue<R> {
    /// An empty queue whose first record will start at `start`, with room
    /// for `capacity` records allocated now.
    pub(super) fn new(start: SeqNumber, capacity: usize) -> SendQueue<R> {
        SendQueue {
            recs: VecDeque::with_capacity(capacity),
            end: start,
            next_new: 0,
            sacked_bytes: 0,
            pending_bytes: 0,
            spec_bytes: 0,
            high_sacked: None,
            rtx_hint: 0,
            hole_hint: 0,
        }
    }

    /// Moves the (empty) queue's start, once the ISN is settled.
    pub(super) fn restart(&mut self, start: SeqNumber) {
        debug_assert!(self.recs.is_empty());
        self.end = start;
    }

    pub(super) fn push(&mut self, record: R, len: usize, now: Instant) {
        let seq = self.end;
        self.end += len;
        self.recs.push_back(SentRecord {
            record,
            seq,
            len,
            sacked: false,
            lost: false,
            rexmit: false,
            spec: false,
            ever_rexmit: false,
            rtx_off: 0,
            sent_at: now,
            split_counted: false,
        });
    }

    pub(super) fn end(&self) -> SeqNumber {
        self.end
    }

    pub(super) fn len(&self) -> usize {
        self.recs.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.recs.is_empty()
    }

    pub(super) fn get(&self, i: usize) -> &SentRecord<R> {
        &self.recs[i]
    }

    pub(super) fn get_mut(&mut self, i: usize) -> &mut SentRecord<R> {
        &mut self.recs[i]
    }

    pub(super) fn front(&self) -> Option<&SentRecord<R>> {
        self.recs.front()
    }

    /// Index of the first record not yet entirely sent.
    pub(super) fn next_new(&self) -> usize {
        self.next_new
    }

    /// The record at `next_new` has been sent to its end.
    pub(super) fn advance_new(&mut self) {
        self.next_new += 1;
    }

    /// Number of records of which at least one byte has been sent.
    pub(super) fn sent_count(&self, snd_nxt: SeqNumber) -> usize {
        match self.recs.get(self.next_new) {
            Some(r) if r.seq < snd_nxt => self.next_new + 1,
            _ => self.next_new,
        }
    }

    /// Bytes queued but not yet sent.
    pub(super) fn unsent_bytes(&self, snd_nxt: SeqNumber) -> usize {
        self.end - snd_nxt
    }

    pub(super) fn sacked_bytes(&self) -> usize {
        self.sacked_bytes
    }

    pub(super) fn pending_bytes(&self) -> usize {
        self.pending_bytes
    }

    pub(super) fn spec_bytes(&self) -> usize {
        self.spec_bytes
    }

    /// Removes the oldest record if `snd_una` covers all of it.
    pub(super) fn pop_acked(&mut self, snd_una: SeqNumber) -> Option<SentRecord<R>> {
        let front = self.recs.front()?;
        if front.end() > snd_una {
            return None;
        }
        let r = self.recs.pop_front()?;
        if r.sacked {
            self.sacked_bytes -= r.len;
        }
        if r.pending() {
            self.pending_bytes -= r.len;
        }
        if r.spec {
            self.spec_bytes -= r.len;
        }
        if self.recs.is_empty() {
            self.high_sacked = None;
        }
        self.next_new = self.next_new.saturating_sub(1);
        self.rtx_hint = self.rtx_hint.saturating_sub(1);
        self.hole_hint = self.hole_hint.saturating_sub(1);
        Some(r)
    }

    /// Marks record `i` SACKed; returns whether it was not already.
    pub(super) fn mark_sacked(&mut self, i: usize) -> bool {
        let r = &mut self.recs[i];
        if r.sacked {
            return false;
        }
        if r.pending() {
            self.pending_bytes -= r.len;
        }
        if r.spec {
            r.spec = false;
            self.spec_bytes -= r.len;
        }
        r.sacked = true;
        self.sacked_bytes += r.len;
        let end = r.end();
        if !self.high_sacked.is_some_and(|h| h >= end) {
            self.high_sacked = Some(end);
        }
        true
    }

    /// Marks record `i` lost unless it is SACKed or already lost (a lost
    /// record whose repair is in flight stays as it is). A record with a
    /// speculative copy in flight becomes a lost record whose repair is in
    /// flight: that copy is the repair. Returns whether a repair is now due.
    pub(super) fn mark_lost(&mut self, i: usize) -> bool {
        let r = &mut self.recs[i];
        if r.sacked || r.lost {
            return false;
        }
        if r.spec {
            r.spec = false;
            r.lost = true;
            r.rexmit = true;
            self.spec_bytes -= r.len;
            return false;
        }
        r.lost = true;
        r.rexmit = false;
        r.rtx_off = 0;
        self.pending_bytes += r.len;
        self.rtx_hint = self.rtx_hint.min(i);
        true
    }

    /// After a retransmission timeout: every sent record that is not SACKed
    /// is lost again, repairs in flight included (RFC 6298 §5.4, RFC 6675
    /// §5.1).
    pub(super) fn mark_all_lost(&mut self, snd_nxt: SeqNumber) {
        let n = self.sent_count(snd_nxt);
        for i in 0..n {
            let r = &mut self.recs[i];
            if r.sacked || r.pending() {
                continue;
            }
            if r.spec {
                r.spec = false;
                self.spec_bytes -= r.len;
            }
            r.lost = true;
            r.rexmit = false;
            r.rtx_off = 0;
            self.pending_bytes += r.len;
        }
        self.rtx_hint = 0;
    }

    /// Forgets every SACK mark: the receiver reneged (RFC 2018 §8 allows
    /// it to discard SACKed data), so SACKed records must be sent again.
    pub(super) fn clear_sacks(&mut self) {
        for r in self.recs.iter_mut().filter(|r| r.sacked) {
            r.sacked = false;
            if r.pending() {
                self.pending_bytes += r.len;
            }
        }
        self.sacked_bytes = 0;
        self.high_sacked = None;
        self.rtx_hint = 0;
        self.hole_hint = 0;
    }

    /// Whether the oldest record is SACKed although the cumulative ACK
    /// stops at it: the receiver discarded data it had SACKed.
    pub(super) fn reneged(&self) -> bool {
        self.recs.front().is_some_and(|r| r.sacked)
    }

    /// The retransmission of record `i` is complete.
    pub(super) fn mark_repaired(&mut self, i: usize) {
        let r = &mut self.recs[i];
        if r.pending() {
            self.pending_bytes -= r.len;
        }
        r.rexmit = true;
        r.ever_rexmit = true;
        r.rtx_off = 0;
    }

    /// Record `i` is resent although it is not deemed lost (RFC 6675
    /// `NextSeg` rule 3 or 4): its copy counts in `pipe` besides the
    /// original until one of them is SACKed or acknowledged, or the record
    /// is deemed lost (then the copy is its repair).
    pub(super) fn mark_speculative(&mut self, i: usize, now: Instant) {
        let r = &mut self.recs[i];
        r.ever_rexmit = true;
        r.sent_at = now;
        r.rtx_off = 0;
        if !r.spec && !r.lost && !r.sacked {
            r.spec = true;
            self.spec_bytes += r.len;
        }
    }

    /// RFC 6675 `NextSeg` rule 3: the lowest record among the first `limit`
    /// that is neither SACKed nor deemed lost nor already resent, and lies
    /// below the highest SACKed byte. (The RFC also asks that it lie above
    /// `HighRxt`; the per-record marks keep any record from being resent
    /// twice this way, which is what that bound is for.)
    pub(super) fn next_unlost_hole(&mut self, limit: usize) -> Option<usize> {
        let high = self.high_sacked?;
        let limit = limit.min(self.recs.len());
        let mut i = self.hole_hint;
        while i < limit {
            let r = &self.recs[i];
            if r.end() > high {
                break;
            }
            if !r.sacked && !r.lost && !r.spec && !r.ever_rexmit {
                self.hole_hint = i;
                return Some(i);
            }
            i += 1;
        }
        self.hole_hint = i;
        None
    }

    /// RFC 6675 `NextSeg` rule 4: the highest record among the first
    /// `limit` that is not SACKed, the one a rescue retransmission resends.
    pub(super) fn highest_unsacked(&self, limit: usize) -> Option<usize> {
        let limit = limit.min(self.recs.len());
        (0..limit).rev().find(|&i| !self.recs[i].sacked)
    }

    /// The lowest record due for retransmission (RFC 6675 `NextSeg` rule
    /// 1: lowest lost, unSACKed, unrepaired), among the first `limit`.
    pub(super) fn next_pending(&mut self, limit: usize) -> Option<usize> {
        if self.pending_bytes == 0 {
            return None;
        }
        let limit = limit.min(self.recs.len());
        let mut i = self.rtx_hint;
        while i < limit {
            if self.recs[i].pending() {
                self.rtx_hint = i;
                return Some(i);
            }
            i += 1;
        }
        self.rtx_hint = limit;
        None
    }

    /// Marks SACKed every sent record that `[left, right)` covers entirely.
    /// Returns whether any record was newly marked.
    pub(super) fn sack_block(
        &mut self,
        left: SeqNumber,
        right: SeqNumber,
        snd_nxt: SeqNumber,
    ) -> bool {
        let n = self.sent_count(snd_nxt);
        let mut i = self.recs.partition_point(|r| r.seq.diff(left) < 0);
        let mut any = false;
        while i < n {
            let r = &self.recs[i];
            if r.end() > right || r.end() > snd_nxt {
                break;
            }
            any |= self.mark_sacked(i);
            i += 1;
        }
        any
    }

    /// The SACK `IsLost` rule (RFC 6675 §4) over the whole scoreboard: a
    /// record is lost when `dup_thresh` SACKed records, or more than
    /// `(dup_thresh − 1) × mss` SACKed bytes, lie above it. A repair in
    /// flight is lost in turn when `dup_thresh` records sent after it have
    /// been SACKed (the same rule in time rather than sequence order, as
    /// RACK reasons), so that a lost retransmission need not wait for the
    /// RTO. Returns whether any record was newly marked lost.
    pub(super) fn mark_lost_by_sack(
        &mut self,
        snd_nxt: SeqNumber,
        mss: usize,
        dup_thresh: usize,
    ) -> bool {
        if self.sacked_bytes == 0 {
            return false;
        }
        let n = self.sent_count(snd_nxt);
        let mut count = 0usize;
        let mut bytes = 0usize;
        // The latest send times among the SACKed records seen so far,
        // latest first.
        let mut latest = [None::<Instant>; 3];
        let k = dup_thresh.clamp(1, latest.len());
        let mut any = false;
        let mut i = n;
        while i > 0 {
            i -= 1;
            let r = &self.recs[i];
            if r.sacked {
                count += 1;
                bytes += r.len;
                let mut t = Some(r.sent_at);
                for slot in latest.iter_mut().take(k) {
                    if t > *slot {
                        core::mem::swap(slot, &mut t);
                    }
                }
            } else if !r.lost {
                if count >= dup_thresh || bytes > (dup_thresh - 1) * mss {
                    any |= self.mark_lost(i);
                }
            } else if r.rexmit && latest[k - 1].is_some_and(|t| t > r.sent_at) {
                let r = &mut self.recs[i];
                r.rexmit = false;
                r.rtx_off = 0;
                self.pending_bytes += r.len;
                self.rtx_hint = self.rtx_hint.min(i);
                any = true;
            }
        }
        any
    }

    /// Drops every record (on reset or timeout); their `Drop` runs.
    pub(super) fn clear(&mut self) {
        self.recs.clear();
        self.next_new = 0;
        self.sacked_bytes = 0;
        self.pending_bytes = 0;
        self.spec_bytes = 0;
        self.high_sacked = None;
        self.rtx_hint = 0;
        self.hole_hint = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(lens: &[usize]) -> SendQueue<usize> {
        let mut q = SendQueue::new(SeqNumber(1000), 8);
        for (i, &l) in lens.iter().enumerate() {
            q.push(i, l, Instant::ZERO);
        }
        for _ in lens {
            q.advance_new();
        }
        q
    }

    #[test]
    fn sack_marks_only_whole_records() {
        let mut q = queue(&[100, 100, 100, 100]);
        let nxt = q.end();
        // Covers record 1 fully and record 2 half.
        assert!(q.sack_block(SeqNumber(1100), SeqNumber(1250), nxt));
        assert!(q.get(1).sacked);
        assert!(!q.get(2).sacked);
        assert_eq!(q.sacked_bytes(), 100);
        assert!(!q.sack_block(SeqNumber(1100), SeqNumber(1200), nxt));
    }

    #[test]
    fn is_lost_needs_three_sacked_records_above() {
        let mut q = queue(&[100, 100, 100, 100, 100]);
        let nxt = q.end();
        q.sack_block(SeqNumber(1100), SeqNumber(1300), nxt);
        assert!(!q.mark_lost_by_sack(nxt, 1000, 3));
        q.sack_block(SeqNumber(1300), SeqNumber(1400), nxt);
        assert!(q.mark_lost_by_sack(nxt, 1000, 3));
        assert!(q.get(0).lost);
        assert!(!q.get(4).lost);
        assert_eq!(q.pending_bytes(), 100);
        assert_eq!(q.next_pending(5), Some(0));
        q.mark_repaired(0);
        assert_eq!(q.pending_bytes(), 0);
        assert_eq!(q.next_pending(5), None);
    }

    #[test]
    fn a_repair_overtaken_by_later_sacked_records_is_lost_again() {
        let mut q = queue(&[100; 8]);
        let nxt = q.end();
        // Record 0 is lost and repaired at t = 10 ms.
        q.sack_block(SeqNumber(1100), SeqNumber(1400), nxt);
        assert!(q.mark_lost_by_sack(nxt, 1000, 3));
        q.mark_repaired(0);
        q.get_mut(0).sent_at = Instant::from_millis(10);
        // Records sent before the repair being SACKed proves nothing.
        q.sack_block(SeqNumber(1400), SeqNumber(1500), nxt);
        assert!(!q.mark_lost_by_sack(nxt, 1000, 3));
        // Three sent after it are SACKed: the repair was lost too.
        for i in 5..8 {
            q.get_mut(i).sent_at = Instant::from_millis(20);
        }
        q.sack_block(SeqNumber(1500), SeqNumber(1800), nxt);
        assert!(q.mark_lost_by_sack(nxt, 1000, 3));
        assert_eq!(q.next_pending(8), Some(0));
        assert_eq!(q.pending_bytes(), 100);
    }

    #[test]
    fn speculative_copies_count_until_sacked_or_lost() {
        let mut q = queue(&[100; 6]);
        let nxt = q.end();
        let t = Instant::from_millis(5);
        assert_eq!(q.next_unlost_hole(6), None, "nothing SACKed yet");
        q.sack_block(SeqNumber(1500), SeqNumber(1600), nxt);
        assert_eq!(q.next_unlost_hole(6), Some(0));
        q.mark_speculative(0, t);
        assert_eq!(q.spec_bytes(), 100);
        assert_eq!(q.next_unlost_hole(6), Some(1));
        // Deemed lost later: the copy in flight is its repair.
        assert!(!q.mark_lost(0));
        assert!(q.get(0).lost && q.get(0).rexmit);
        assert_eq!((q.spec_bytes(), q.pending_bytes()), (0, 0));
        // SACKed: neither copy is in flight any more.
        q.mark_speculative(1, t);
        q.sack_block(SeqNumber(1100), SeqNumber(1200), nxt);
        assert_eq!(q.spec_bytes(), 0);
        assert_eq!(q.highest_unsacked(6), Some(4));
        assert_eq!(q.next_unlost_hole(6), Some(2));
        // A timeout makes every unSACKed record a pending repair.
        q.mark_speculative(2, t);
        q.mark_all_lost(nxt);
        assert_eq!((q.spec_bytes(), q.pending_bytes()), (0, 400));
        assert_eq!(q.next_unlost_hole(6), None);
        // Acknowledged: the totals follow.
        q.mark_speculative(5, t);
        while q.pop_acked(nxt).is_some() {}
        assert_eq!(
            (q.spec_bytes(), q.pending_bytes(), q.sacked_bytes()),
            (0, 0, 0)
        );
    }

    #[test]
    fn totals_follow_pops_and_timeouts() {
        let mut q = queue(&[100, 100, 100]);
        let nxt = q.end();
        q.sack_block(SeqNumber(1200), SeqNumber(1300), nxt);
        q.mark_all_lost(nxt);
        assert_eq!(q.pending_bytes(), 200);
        assert_eq!(q.sacked_bytes(), 100);
        let r = q.pop_acked(SeqNumber(1100)).map(|r| r.record);
        assert_eq!(r, Some(0));
        assert_eq!(q.pending_bytes(), 100);
        assert!(q.pop_acked(SeqNumber(1150)).is_none());
        q.pop_acked(SeqNumber(1300));
        q.pop_acked(SeqNumber(1300));
        assert!(q.is_empty());
        assert_eq!((q.pending_bytes(), q.sacked_bytes()), (0, 0));
    }
}
