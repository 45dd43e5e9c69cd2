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
//!
//! Each record also keeps the time of its latest transmission and a stamp
//! of its place in the order of transmissions, which is what RACK (RFC 8985
//! §6) reasons with: [`Delivered`] gathers what one ACK newly delivered,
//! and `rack_detect_loss` deems lost every record sent sufficiently earlier
//! than the latest one delivered. (RFC 8985 orders transmissions of equal
//! timestamps by sequence number; many go out at the same `now` here, a
//! repair after new records among them, so the order is kept exactly.)

use core::time::Duration;
use std::collections::VecDeque;

use crate::seq::SeqNumber;
use crate::time::Instant;

/// A transmission: its time, and its rank in the order of transmissions.
pub(super) type Xmit = (Instant, u64);

/// Whether transmission `a` came after `b` (RFC 8985 `RACK_sent_after`).
pub(super) fn sent_after(a: Xmit, b: Xmit) -> bool {
    a.1 > b.1
}

/// What one ACK newly delivered, cumulatively or by SACK, as RACK reads it
/// (RFC 8985 §6.2 steps 2 and 3).
#[derive(Debug, Clone, Copy)]
pub(super) struct Delivered {
    now: Instant,
    min_rtt: Option<Duration>,
    /// The ACK's echoed timestamp and our timestamp clock's offset, to
    /// tell whether it answers a retransmission or the original.
    echo: Option<(u32, u32)>,
    /// The latest transmission among the records delivered whose delivery
    /// is unambiguous.
    pub(super) latest: Option<Xmit>,
    /// End of the highest record delivered.
    pub(super) high_end: Option<SeqNumber>,
    /// End of the lowest record delivered that was never retransmitted.
    pub(super) low_original_end: Option<SeqNumber>,
}

impl Delivered {
    pub(super) fn new(now: Instant, min_rtt: Option<Duration>, echo: Option<(u32, u32)>) -> Self {
        Delivered {
            now,
            min_rtt,
            echo,
            latest: None,
            high_end: None,
            low_original_end: None,
        }
    }

    /// Record `r` was newly acknowledged (`cumulative`) or SACKed.
    pub(super) fn note<R>(&mut self, r: &SentRecord<R>, cumulative: bool) {
        let end = r.end();
        if !self.high_end.is_some_and(|h| h >= end) {
            self.high_end = Some(end);
        }
        if r.ever_rexmit {
            // RFC 8985 §6.2 step 2: the ACK may be for the original. It is
            // if it came sooner after the retransmission than any round
            // trip ever took, or, for a cumulative ACK, if it echoes a
            // timestamp older than the retransmission. (A SACK echoes the
            // timestamp of the last segment that arrived in order, RFC
            // 7323 §4.3, never that of the out-of-order one it reports.)
            // Nor can it be told apart when the retransmission followed
            // the copy before it by less than a round trip (a rescue of a
            // record just sent): the earlier copy may be what arrived, and
            // taking the later one's time would deem lost everything sent
            // in between.
            if let (true, Some((tsecr, offset))) = (cumulative, self.echo) {
                // The timestamp clock's intended 32-bit wrap.
                let ts = (r.sent_at.total_millis() as u32).wrapping_add(offset);
                if (tsecr.wrapping_sub(ts) as i32) < 0 {
                    return;
                }
            }
            if self
                .min_rtt
                .is_some_and(|m| self.now - r.sent_at < m || r.sent_at - r.prev_sent_at < m)
            {
                return;
            }
        } else if !self.low_original_end.is_some_and(|l| l <= end) {
            self.low_original_end = Some(end);
        }
        let x = (r.sent_at, r.xmit_id);
        if !self.latest.is_some_and(|l| !sent_after(x, l)) {
            self.latest = Some(x);
        }
    }
}

/// The records a segment carries after its first one. In a train, for a
/// port that cuts the segment into segments of [`Train::seg_len`] payload
/// bytes each (TCP segmentation offload), every record but the last of
/// the run is exactly that long and the last at most, so that each
/// segment the port cuts holds exactly one whole record. In a pack
/// ([`Train::is_pack`]) the records, of any lengths, travel in this one
/// segment, uncut.
pub struct Train<'a, R> {
    recs: &'a VecDeque<SentRecord<R>>,
    first: usize,
    count: usize,
    seg_len: usize,
    bytes: usize,
    pack: bool,
}

impl<'a, R> Train<'a, R> {
    /// Payload bytes of each segment the port cuts (the first record's
    /// length); the last may be shorter. For a pack, the first record's
    /// length.
    pub fn seg_len(&self) -> usize {
        self.seg_len
    }

    /// Whether the records are packed into the one segment rather than
    /// cut apart by the port.
    pub fn is_pack(&self) -> bool {
        self.pack
    }

    /// Records after the first.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes of those records.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Those records, in sequence order.
    pub fn records(&self) -> impl Iterator<Item = &'a R> + Clone + '_ {
        self.recs
            .range(self.first..self.first + self.count)
            .map(|r| &r.record)
    }
}

impl<R> core::fmt::Debug for Train<'_, R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Train")
            .field("seg_len", &self.seg_len)
            .field("count", &self.count)
            .field("bytes", &self.bytes)
            .field("pack", &self.pack)
            .finish()
    }
}

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
    /// Time of its latest (re)transmission, for RTT samples and RACK.
    pub(super) sent_at: Instant,
    /// Time of the transmission before the latest one.
    pub(super) prev_sent_at: Instant,
    /// Rank of its latest (re)transmission among all transmissions.
    pub(super) xmit_id: u64,
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
    /// Records queued, oldest first; room is taken as they first need it,
    /// up to `capacity` ([`crate::room::room_as_needed`]).
    recs: VecDeque<SentRecord<R>>,
    /// Most records queued at once.
    capacity: usize,
    /// Records given up unacknowledged (`drop_all`), oldest first, until
    /// the upper layer takes them back (`pop_dropped`).
    dropped: VecDeque<SentRecord<R>>,
    /// Sequence number after the last queued record.
    end: SeqNumber,
    /// Index of the first record not yet entirely sent.
    next_new: usize,
    /// Bytes of records marked SACKed.
    sacked_bytes: usize,
    /// Records marked SACKed.
    sacked_count: usize,
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
    /// Rank the next transmission gets.
    next_xmit: u64,
}

impl<R> SendQueue<R> {
    /// An empty queue whose first record will start at `start`, for at
    /// most `capacity` records; their storage is allocated as they first
    /// need it.
    pub(super) fn new(start: SeqNumber, capacity: usize) -> SendQueue<R> {
        SendQueue {
            recs: VecDeque::new(),
            capacity,
            dropped: VecDeque::new(),
            end: start,
            next_new: 0,
            sacked_bytes: 0,
            sacked_count: 0,
            pending_bytes: 0,
            spec_bytes: 0,
            high_sacked: None,
            rtx_hint: 0,
            hole_hint: 0,
            next_xmit: 1,
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
        crate::room::room_as_needed(&mut self.recs, self.capacity);
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
            prev_sent_at: now,
            xmit_id: 0,
            split_counted: false,
        });
    }

    pub(super) fn end(&self) -> SeqNumber {
        self.end
    }

    pub(super) fn capacity(&self) -> usize {
        self.capacity
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

    /// The `count` records from index `first`, `bytes` long together,
    /// that a segment carries after its first record of `seg_len` bytes:
    /// cut by the port, or packed (`pack`).
    pub(super) fn train(
        &self,
        first: usize,
        count: usize,
        seg_len: usize,
        bytes: usize,
        pack: bool,
    ) -> Train<'_, R> {
        Train {
            recs: &self.recs,
            first,
            count,
            seg_len,
            bytes,
            pack,
        }
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

    pub(super) fn sacked_count(&self) -> usize {
        self.sacked_count
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
            self.sacked_count -= 1;
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
        self.sacked_count += 1;
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

    /// A retransmission timeout was spurious (see `recovery`): takes back
    /// the marks of `mark_all_lost` that no retransmission has acted on
    /// yet. A record resent before the timeout gets its repair back in
    /// flight (RACK judges it by that transmission, as before the
    /// timeout); one never resent is again presumed in flight, for the
    /// SACK `IsLost` rule and RACK to judge anew. Returns the bytes
    /// unmarked.
    pub(super) fn undo_rto_marks(&mut self, snd_nxt: SeqNumber) -> usize {
        let n = self.sent_count(snd_nxt);
        let mut undone = 0;
        for r in self.recs.iter_mut().take(n) {
            if !r.pending() || r.rtx_off != 0 {
                continue;
            }
            if r.ever_rexmit {
                r.rexmit = true;
            } else {
                r.lost = false;
            }
            undone += r.len;
        }
        self.pending_bytes -= undone;
        undone
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
        self.sacked_count = 0;
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

    /// Record `i` (or a piece of it) goes out now.
    pub(super) fn stamp(&mut self, i: usize, now: Instant) {
        let r = &mut self.recs[i];
        r.prev_sent_at = r.sent_at;
        r.sent_at = now;
        r.xmit_id = self.next_xmit;
        self.next_xmit += 1;
    }

    /// The rank the next transmission will get: every transmission from
    /// now on ranks at least this.
    pub(super) fn next_xmit(&self) -> u64 {
        self.next_xmit
    }

    /// Record `i` is resent although it is not deemed lost (RFC 6675
    /// `NextSeg` rule 3 or 4): its copy counts in `pipe` besides the
    /// original until one of them is SACKed or acknowledged, or the record
    /// is deemed lost (then the copy is its repair).
    pub(super) fn mark_speculative(&mut self, i: usize, now: Instant) {
        self.stamp(i, now);
        let r = &mut self.recs[i];
        r.ever_rexmit = true;
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

    /// Marks SACKed every sent record that `[left, right)` covers entirely,
    /// noting each newly marked one in `delivered`. Returns whether any
    /// record was newly marked.
    pub(super) fn sack_block(
        &mut self,
        left: SeqNumber,
        right: SeqNumber,
        snd_nxt: SeqNumber,
        delivered: &mut Delivered,
    ) -> bool {
        let n = self.sent_count(snd_nxt);
        let mut i = self.recs.partition_point(|r| r.seq.diff(left) < 0);
        let mut any = false;
        while i < n {
            let r = &self.recs[i];
            if r.end() > right || r.end() > snd_nxt {
                break;
            }
            if self.mark_sacked(i) {
                delivered.note(&self.recs[i], false);
                any = true;
            }
            i += 1;
        }
        any
    }

    /// The SACK `IsLost` rule (RFC 6675 §4) over the whole scoreboard: a
    /// record is lost when `dup_thresh` SACKed records, or more than
    /// `(dup_thresh − 1) × mss` SACKed bytes, lie above it. Returns whether
    /// any record was newly marked lost. (A lost repair is RACK's to find:
    /// see `rack_detect_loss`.)
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
        let mut any = false;
        let mut i = n;
        while i > 0 {
            i -= 1;
            let r = &self.recs[i];
            if r.sacked {
                count += 1;
                bytes += r.len;
            } else if !r.lost && (count >= dup_thresh || bytes > (dup_thresh - 1) * mss) {
                any |= self.mark_lost(i);
            }
        }
        any
    }

    /// RACK's loss detection (RFC 8985 §6.2 step 5): a record not SACKed
    /// whose latest transmission came before `latest` (the latest
    /// transmission delivered) is lost once `rtt + reo_wnd` have passed
    /// since it went out; `rtt` is RACK.rtt, the round trip of that
    /// delivered transmission. A repair or a speculative copy is judged by
    /// its own transmission time, so a lost retransmission is found as soon
    /// as something sent after it is delivered. Returns whether a repair is
    /// newly due, and the earliest time at which the records not yet deemed
    /// lost would be (RFC 8985 arms its reordering timer for the latest of
    /// them; the earliest lets each go as soon as it is due).
    pub(super) fn rack_detect_loss(
        &mut self,
        snd_nxt: SeqNumber,
        latest: Xmit,
        rtt: Duration,
        reo_wnd: Duration,
        now: Instant,
    ) -> (bool, Option<Instant>) {
        let n = self.sent_count(snd_nxt);
        let mut any = false;
        let mut next: Option<Instant> = None;
        for i in 0..n {
            let r = &self.recs[i];
            if r.sacked || r.pending() {
                continue;
            }
            if !sent_after(latest, (r.sent_at, r.xmit_id)) {
                if !r.ever_rexmit {
                    // Every later record was first sent later still.
                    break;
                }
                continue;
            }
            let due = r.sent_at + rtt + reo_wnd;
            if due <= now {
                any |= self.rack_mark_lost(i);
            } else {
                next = Some(next.map_or(due, |t| t.min(due)));
            }
        }
        (any, next)
    }

    /// Record `i`, and any copy of it in flight, is lost: a repair is due.
    fn rack_mark_lost(&mut self, i: usize) -> bool {
        let r = &mut self.recs[i];
        if r.sacked || r.pending() {
            return false;
        }
        if r.spec {
            r.spec = false;
            self.spec_bytes -= r.len;
        }
        r.lost = true;
        r.rexmit = false;
        r.rtx_off = 0;
        self.pending_bytes += r.len;
        self.rtx_hint = self.rtx_hint.min(i);
        true
    }

    /// Gives up every record (on reset, timeout or close): they leave the
    /// scoreboard and wait in the dropped list for `pop_dropped`. The
    /// queue's storage becomes the list's (the two buffers swap), so
    /// nothing is allocated unless records given up earlier are still
    /// waiting.
    pub(super) fn drop_all(&mut self) {
        if self.dropped.is_empty() {
            core::mem::swap(&mut self.recs, &mut self.dropped);
        } else {
            self.dropped.extend(self.recs.drain(..));
        }
        self.next_new = 0;
        self.sacked_bytes = 0;
        self.sacked_count = 0;
        self.pending_bytes = 0;
        self.spec_bytes = 0;
        self.high_sacked = None;
        self.rtx_hint = 0;
        self.hole_hint = 0;
    }

    /// The oldest record given up by `drop_all` and not yet taken back.
    pub(super) fn pop_dropped(&mut self) -> Option<R> {
        self.dropped.pop_front().map(|r| r.record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SACKs `[left, right)`, with nothing sent beyond the queue.
    fn sack(q: &mut SendQueue<usize>, left: u32, right: u32) -> bool {
        let mut d = Delivered::new(Instant::ZERO, None, None);
        let nxt = q.end();
        q.sack_block(SeqNumber(left), SeqNumber(right), nxt, &mut d)
    }

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
        // Covers record 1 fully and record 2 half.
        assert!(sack(&mut q, 1100, 1250));
        assert!(q.get(1).sacked);
        assert!(!q.get(2).sacked);
        assert_eq!(q.sacked_bytes(), 100);
        assert!(!sack(&mut q, 1100, 1200));
    }

    #[test]
    fn is_lost_needs_three_sacked_records_above() {
        let mut q = queue(&[100, 100, 100, 100, 100]);
        let nxt = q.end();
        sack(&mut q, 1100, 1300);
        assert!(!q.mark_lost_by_sack(nxt, 1000, 3));
        sack(&mut q, 1300, 1400);
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
    fn delivered_keeps_the_latest_unambiguous_transmission() {
        let mut q = queue(&[100; 4]);
        for i in 0..4 {
            q.stamp(i, Instant::from_millis(10));
        }
        // Record 3 was resent at 20 ms; an ACK 2 ms later cannot be for the
        // copy when no round trip ever took less than 5 ms.
        q.mark_speculative(3, Instant::from_millis(20));
        let mut d = Delivered::new(
            Instant::from_millis(22),
            Some(Duration::from_millis(5)),
            None,
        );
        let nxt = q.end();
        assert!(q.sack_block(SeqNumber(1100), SeqNumber(1400), nxt, &mut d));
        // Same send time: the order of transmission decides.
        assert_eq!(d.latest, Some((Instant::from_millis(10), 3)));
        assert_eq!(d.high_end, Some(SeqNumber(1400)));
        assert_eq!(d.low_original_end, Some(SeqNumber(1200)));
        // Later, the copy's delivery is unambiguous.
        let mut d = Delivered::new(
            Instant::from_millis(40),
            Some(Duration::from_millis(5)),
            None,
        );
        d.note(q.get(3), false);
        assert_eq!(d.latest, Some((Instant::from_millis(20), 5)));
        // An echoed timestamp older than the copy says a cumulative ACK is
        // for the original; a SACK's echo says nothing of it.
        let mut d = Delivered::new(Instant::from_millis(40), None, Some((15, 0)));
        d.note(q.get(3), true);
        assert_eq!(d.latest, None);
        d.note(q.get(3), false);
        assert_eq!(d.latest, Some((Instant::from_millis(20), 5)));
        // A copy sent 2 ms after the one before it: either may be what
        // arrived, however late the ACK.
        q.mark_speculative(2, Instant::from_millis(12));
        let mut d = Delivered::new(
            Instant::from_millis(40),
            Some(Duration::from_millis(5)),
            None,
        );
        d.note(q.get(2), false);
        assert_eq!(d.latest, None);
    }

    #[test]
    fn rack_deems_lost_what_was_sent_a_round_trip_before_a_delivery() {
        let mut q = queue(&[100; 6]);
        for i in 0..6 {
            q.stamp(i, Instant::from_millis(i as u64));
        }
        let nxt = q.end();
        let rtt = Duration::from_millis(10);
        // Record 4 (sent at 4 ms) delivered at 14 ms, reordering window
        // 2 ms: record i is lost at i + 12 ms.
        let latest = (Instant::from_millis(4), 5);
        sack(&mut q, 1400, 1500);
        let wnd = Duration::from_millis(2);
        let (any, next) = q.rack_detect_loss(nxt, latest, rtt, wnd, Instant::from_millis(13));
        assert!(any);
        assert!(q.get(0).lost && q.get(1).lost && !q.get(2).lost);
        assert_eq!(next, Some(Instant::from_millis(14)));
        assert_eq!(q.pending_bytes(), 200);
        let (any, next) = q.rack_detect_loss(nxt, latest, rtt, wnd, Instant::from_millis(14));
        assert!(any && q.get(2).lost && !q.get(3).lost);
        assert_eq!(next, Some(Instant::from_millis(15)));
        // Record 0 is repaired at 20 ms; the repair is lost in turn once
        // something sent after it is delivered, a round trip on.
        q.mark_repaired(0);
        q.stamp(0, Instant::from_millis(20));
        let (any, _) = q.rack_detect_loss(nxt, latest, rtt, wnd, Instant::from_millis(30));
        assert!(any && q.get(3).lost, "record 3's time came");
        assert!(
            q.get(0).rexmit,
            "nothing sent after the repair is delivered"
        );
        q.mark_speculative(5, Instant::from_millis(21));
        let latest = (Instant::from_millis(21), 8);
        sack(&mut q, 1500, 1600);
        let (any, _) =
            q.rack_detect_loss(nxt, latest, rtt, Duration::ZERO, Instant::from_millis(31));
        assert!(any && q.get(0).lost && !q.get(0).rexmit);
        assert_eq!(q.next_pending(6), Some(0));
        // Record 1 is still pending its first repair: untouched.
        assert_eq!(q.pending_bytes(), 100 + 100 + 100 + 100);
    }

    #[test]
    fn speculative_copies_count_until_sacked_or_lost() {
        let mut q = queue(&[100; 6]);
        let nxt = q.end();
        let t = Instant::from_millis(5);
        assert_eq!(q.next_unlost_hole(6), None, "nothing SACKed yet");
        sack(&mut q, 1500, 1600);
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
        sack(&mut q, 1100, 1200);
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
    fn dropping_all_hands_each_unacknowledged_record_back_once() {
        let mut q = queue(&[100, 100, 100, 100]);
        let nxt = q.end();
        sack(&mut q, 1300, 1400);
        q.mark_all_lost(nxt);
        assert_eq!(q.pop_acked(SeqNumber(1100)).map(|r| r.record), Some(0));
        let storage = q.recs.capacity();
        q.drop_all();
        assert!(q.is_empty());
        assert_eq!(
            (
                q.pending_bytes(),
                q.sacked_bytes(),
                q.spec_bytes(),
                q.next_new()
            ),
            (0, 0, 0, 0)
        );
        // The queue's own storage holds them: nothing was allocated.
        assert_eq!(q.dropped.capacity(), storage);
        assert_eq!(q.pop_dropped(), Some(1));
        // Given up again with one still waiting: it keeps its place.
        q.drop_all();
        assert_eq!(q.pop_dropped(), Some(2));
        assert_eq!(q.pop_dropped(), Some(3));
        assert_eq!(q.pop_dropped(), None);
        q.drop_all();
        assert_eq!(q.pop_dropped(), None);
    }

    #[test]
    fn totals_follow_pops_and_timeouts() {
        let mut q = queue(&[100, 100, 100]);
        let nxt = q.end();
        sack(&mut q, 1200, 1300);
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

    #[test]
    fn a_spurious_timeout_gives_back_what_no_retransmission_used() {
        // Record 0 was repaired before the timeout, 1 never resent, 2
        // SACKed, 3 resent after the timeout.
        let mut q = queue(&[100, 100, 100, 100]);
        let nxt = q.end();
        q.mark_lost(0);
        q.mark_repaired(0);
        sack(&mut q, 1200, 1300);
        q.mark_all_lost(nxt);
        assert_eq!(q.pending_bytes(), 300);
        q.mark_repaired(3);
        assert_eq!(q.undo_rto_marks(nxt), 200);
        assert_eq!(q.pending_bytes(), 0);
        // The repair of 0 is in flight again; 1 is presumed in flight.
        assert!(q.get(0).lost && q.get(0).rexmit);
        assert!(!q.get(1).lost);
        assert!(q.get(2).sacked && q.get(3).rexmit);
        assert_eq!(q.next_pending(4), None);
        // SACK can still deem 1 lost afterwards.
        sack(&mut q, 1300, 1400);
        assert!(!q.mark_lost_by_sack(nxt, 1000, 3));
        while q.pop_acked(nxt).is_some() {}
        assert_eq!((q.pending_bytes(), q.sacked_bytes()), (0, 0));
    }
}
