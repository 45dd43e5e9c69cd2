//! What the connection sends next, and the headers it builds.
//!
//! `poll_transmit` yields at most one segment per call, in this order: a
//! pending RST; the SYN or SYN-ACK; the pure ACKs owed one per arrived
//! segment (below); repairs of records judged lost (RFC
//! 6675 `NextSeg` rule 1, or go-back-N after an RTO) while the congestion
//! window allows; a retransmitted FIN; new records in order while both the
//! peer's window (RFC 9293 §3.8.6) and the congestion window allow
//! (`NextSeg` rule 2); the FIN; in SACK recovery, a record not yet deemed
//! lost below the highest SACKed one (`NextSeg` rule 3), then the rescue
//! retransmission (rule 4); a tail loss probe (RFC 8985 §7.3) when its
//! timeout fired; a zero-window probe or keepalive probe; a pure ACK if one
//! is owed.
//! Every segment but the first SYN carries the current ACK and window (so
//! it discharges any delayed ACK), timestamps when negotiated (RFC 7323
//! §3.2), and SACK blocks while out-of-order data is held (RFC 2018 §4).
//!
//! Owed ACKs. RFC 5681 §4.2 asks for an immediate ACK of every
//! out-of-order segment and of every segment that fills a hole, and a
//! sender counts duplicate ACKs (RFC 5681 §2: no data, same ACK number,
//! same window) to detect loss, or reads the succession of SACK blocks
//! (RFC 2018 §4, RFC 6675). A driver hands the engine a whole receive
//! burst before it polls, so a flag would fold a burst of such segments
//! into one ACK. Instead each of them queues an [`AckSnapshot`]: the ACK
//! number, window, echoed timestamp and SACK blocks as they stood once that
//! segment was processed. The snapshots go out first, in order, as pure
//! ACKs (data would disqualify them as duplicates); any later obligation
//! (delayed ACK, window update) is met by a segment carrying the latest
//! state after them. A received segment that is wholly or partly a
//! duplicate is reported by a D-SACK block first in its snapshot (RFC 2883
//! §4) when SACK is in use.

use super::connection::{Connection, PendingRst, MAX_PENDING_ACKS};
use super::{Record, Segment, State};
use crate::seq::SeqNumber;
use crate::time::Instant;
use crate::wire::{SackBlocks, TcpFlags, TcpOptions, TcpRepr, TcpTimestamp};

/// One owed pure ACK, as it stood when the segment that called for it had
/// been processed (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub(super) struct AckSnapshot {
    ack: SeqNumber,
    /// The window field, already scaled: duplicates must repeat it.
    window: u16,
    tsecr: u32,
    sack: SackBlocks,
}

/// Bytes of a timestamps option as emitted (with its two NOPs).
pub(super) const TS_OPTION_LEN: usize = 12;

/// Why a record's bytes are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Send {
    /// For the first time.
    New,
    /// As the repair of a record deemed lost.
    Repair,
    /// Again although not deemed lost (RFC 6675 `NextSeg` rule 3).
    Speculative,
    /// The rescue retransmission (RFC 6675 `NextSeg` rule 4).
    Rescue,
    /// A tail loss probe of new data (RFC 8985 §7.3), whatever the
    /// congestion window.
    ProbeNew,
    /// A tail loss probe resending the last record sent.
    Probe,
    /// A tail loss probe in recovery: a repair the window held back.
    ProbeRepair,
}

/// What to send next.
#[derive(Debug, Clone, Copy)]
enum Tx {
    /// Bytes `off..off + len` of record `idx`.
    Data {
        idx: usize,
        off: usize,
        len: usize,
        why: Send,
    },
    Fin {
        rtx: bool,
        /// Sent as a tail loss probe.
        probe: bool,
    },
    Probe,
    Keepalive,
    Ack,
}

/// The next segment as [`Connection::plan_segment`] decided it: the
/// header, and which records it carries (indices into the send queue).
#[derive(Debug, Clone, Copy)]
pub(super) struct Planned {
    repr: TcpRepr,
    data: Option<PlannedData>,
}

#[derive(Debug, Clone, Copy)]
struct PlannedData {
    /// The first record, and the part of it sent.
    idx: usize,
    off: usize,
    len: usize,
    /// Whole records after it (a train or a pack), their bytes, and which.
    count: usize,
    bytes: usize,
    pack: bool,
}

impl Planned {
    fn bare(repr: TcpRepr) -> Planned {
        Planned { repr, data: None }
    }
}

impl<B: AsRef<[u8]>, R: Record> Connection<B, R> {
    /// Decides the next segment and updates the connection's state as if
    /// it were sent; [`Connection::planned_segment`] then builds it. Split
    /// in two so that a caller can look for a connection with something to
    /// send and borrow its send queue only once it has found one.
    pub(super) fn plan_segment(&mut self, now: Instant) -> Option<Planned> {
        if let Some(rst) = self.rst_pending.take() {
            let repr = self.rst_repr(rst);
            return Some(Planned::bare(repr));
        }
        match self.state {
            State::Closed | State::Listen => return None,
            State::SynSent => {
                if !self.syn_pending {
                    return None;
                }
                let repr = self.syn_repr(now);
                return Some(Planned::bare(repr));
            }
            State::SynReceived => {
                if !self.syn_pending && !self.ack_now {
                    return None;
                }
                let repr = self.syn_repr(now);
                return Some(Planned::bare(repr));
            }
            _ => {}
        }
        if let Some(ack) = self.queued_ack(now) {
            return Some(ack);
        }
        let tx = self.pick(now)?;
        match tx {
            Tx::Data { idx, off, len, why } => {
                let whole = off == 0 && len == self.sendq.get(idx).len;
                let (count, bytes, pack) = if why == Send::New && whole {
                    match self.train_extent(idx, len) {
                        (0, _) => {
                            let (c, b) = self.pack_extent(idx, len);
                            (c, b, true)
                        }
                        (c, b) => (c, b, false),
                    }
                } else {
                    (0, 0, false)
                };
                let (seq, mut flags) = self.note_data(now, idx, off, len, why);
                // A train's or a pack's records: one header for all, which
                // carries the last one's flags; each segment the port cuts
                // from a train counts as one sent.
                if count > 0 {
                    flags = self.note_train(now, idx + 1, count);
                }
                if !pack {
                    self.stats.segments_out += count as u64;
                } else if count > 0 {
                    self.stats.packed_segments += 1;
                    self.stats.packed_records += count as u64 + 1;
                }
                let repr = self.header(now, seq, flags, len);
                Some(Planned {
                    repr,
                    data: Some(PlannedData {
                        idx,
                        off,
                        len,
                        count,
                        bytes,
                        pack,
                    }),
                })
            }
            Tx::Fin { rtx, probe } => {
                let fin = self.fin_seq.unwrap_or(self.snd_nxt);
                if rtx {
                    self.fin_rtx = false;
                    self.stats.retransmits += 1;
                } else {
                    self.fin_sent = true;
                    self.snd_nxt = fin + 1;
                }
                self.cc.force_rtx = false;
                self.arm_rto(now);
                if probe {
                    self.note_probe(now, Some((fin, fin + 1)));
                }
                let repr = self.header(now, fin, TcpFlags::FIN | TcpFlags::ACK, 0);
                Some(Planned::bare(repr))
            }
            Tx::Probe => {
                self.probe_pending = false;
                self.stats.window_probes += 1;
                self.timers.persist_backoff += 1;
                let repr = self.header(now, self.snd_una - 1, TcpFlags::ACK, 0);
                self.update_persist(now);
                Some(Planned::bare(repr))
            }
            Tx::Keepalive => {
                self.keepalive_pending = false;
                let repr = self.header(now, self.snd_nxt - 1, TcpFlags::ACK, 0);
                Some(Planned::bare(repr))
            }
            Tx::Ack => Some(self.current_ack(now)),
        }
    }

    /// Whether an ACK is owed now (a snapshot queued, or `ack_now`) in a
    /// state whose segments [`Connection::plan_segment`] builds from the
    /// send queue: what [`Connection::plan_ack`] would send.
    pub(super) fn owes_ack(&self) -> bool {
        !matches!(
            self.state,
            State::Closed | State::Listen | State::SynSent | State::SynReceived
        ) && self.rst_pending.is_none()
            && (self.ack_now || !self.ack_queue.is_empty())
    }

    /// A bare ACK of what is owed, out of the connection's turn to send
    /// data: the first queued snapshot, else the state as it is now.
    /// `None` when nothing is owed ([`Connection::owes_ack`]).
    pub(super) fn plan_ack(&mut self, now: Instant) -> Option<Planned> {
        if !self.owes_ack() {
            return None;
        }
        Some(match self.queued_ack(now) {
            Some(ack) => ack,
            None => self.current_ack(now),
        })
    }

    /// The oldest owed ACK snapshot, as a bare ACK, if one is queued.
    fn queued_ack(&mut self, now: Instant) -> Option<Planned> {
        let snap = self.ack_queue.pop_front()?;
        let repr = self.snapshot_repr(now, snap);
        Some(Planned::bare(repr))
    }

    /// A bare ACK of the state as it is now.
    fn current_ack(&mut self, now: Instant) -> Planned {
        Planned::bare(self.header(now, self.snd_nxt, TcpFlags::ACK, 0))
    }

    /// The segment `plan` decided on, borrowing the records it carries.
    pub(super) fn planned_segment(&self, plan: Planned) -> Segment<'_, R> {
        let Some(d) = plan.data else {
            return Segment::bare(plan.repr);
        };
        let more =
            (d.count > 0).then(|| self.sendq.train(d.idx + 1, d.count, d.len, d.bytes, d.pack));
        let rec = &self.sendq.get(d.idx).record;
        Segment {
            repr: plan.repr,
            more,
            payload: Some((rec, d.off..d.off + d.len)),
        }
    }

    fn pick(&mut self, now: Instant) -> Option<Tx> {
        let mss = self.eff_mss;
        let mut cwnd_blocked = false;
        let sent = self.sendq.sent_count(self.snd_nxt);
        // While F-RTO runs, the go-back-N waits: only the timeout's own
        // retransmission and step 2 b's new segments go out (`recovery`).
        let frto_holds = self.frto_holds();
        let frto_new = self.frto_new_allowed();
        if let Some(idx) = self.sendq.next_pending(sent) {
            let r = self.sendq.get(idx);
            let sent_len = r.len.min(self.snd_nxt - r.seq);
            let off = r.rtx_off.min(sent_len);
            let len = (sent_len - off).min(mss);
            if len > 0 && (self.cc.force_rtx || (!frto_holds && self.cwnd_allows(len))) {
                return Some(Tx::Data {
                    idx,
                    off,
                    len,
                    why: Send::Repair,
                });
            }
            cwnd_blocked = len > 0 && !frto_new;
        }
        if self.fin_rtx && self.sendq.pending_bytes() == 0 {
            return Some(Tx::Fin {
                rtx: true,
                probe: false,
            });
        }
        if !cwnd_blocked {
            if let Some((idx, off, len)) = self.next_new_segment() {
                if frto_new || (!frto_holds && self.cwnd_allows(len)) {
                    return Some(Tx::Data {
                        idx,
                        off,
                        len,
                        why: Send::New,
                    });
                }
            }
        }
        if frto_new {
            self.frto_starved(now);
        }
        if let Some(fin) = self.fin_seq {
            let room = (self.snd_una + self.snd_wnd) - self.snd_nxt;
            if !self.fin_sent && !frto_holds && self.snd_nxt == fin && room > 0 {
                return Some(Tx::Fin {
                    rtx: false,
                    probe: false,
                });
            }
        }
        if !cwnd_blocked && self.cc.in_recovery && self.opts.sack {
            if let Some(tx) = self.pick_rule_3_4(now, sent) {
                return Some(tx);
            }
        }
        if self.tlp.pending {
            if let Some(tx) = self.pick_probe(sent) {
                return Some(tx);
            }
            self.tlp.pending = false;
        }
        if self.probe_pending {
            return Some(Tx::Probe);
        }
        if self.keepalive_pending {
            return Some(Tx::Keepalive);
        }
        if self.ack_now {
            return Some(Tx::Ack);
        }
        None
    }

    /// The next piece of new data (record index, offset, length), if one
    /// is queued and the peer's window takes it.
    fn next_new_segment(&self) -> Option<(usize, usize, usize)> {
        let idx = self.sendq.next_new();
        if idx >= self.sendq.len() {
            return None;
        }
        let r = self.sendq.get(idx);
        let off = self.snd_nxt - r.seq;
        let len = (r.len - off.min(r.len)).min(self.eff_mss);
        let wnd_ok = self.snd_nxt + len <= self.snd_una + self.snd_wnd;
        (len > 0 && wnd_ok).then_some((idx, off, len))
    }

    /// Whether new data is queued that the peer's window takes.
    pub(super) fn new_segment_ready(&self) -> bool {
        self.next_new_segment().is_some()
    }

    /// RFC 6675 `NextSeg` rules 3 and 4, when rules 1 and 2 found nothing
    /// to send. Only a record that fits one segment is resent this way, and
    /// only when the window has room for a full segment: with less, new
    /// records are held back by sender silly-window avoidance (see
    /// `send_capacity`), which is not rule 2 failing for want of data.
    fn pick_rule_3_4(&mut self, now: Instant, sent: usize) -> Option<Tx> {
        let mss = self.eff_mss;
        if self.send_window().saturating_sub(self.pipe()) < mss {
            return None;
        }
        if let Some(idx) = self.sendq.next_unlost_hole(sent) {
            let len = self.sendq.get(idx).len;
            if len <= mss && self.cwnd_allows(len) {
                return Some(Tx::Data {
                    idx,
                    off: 0,
                    len,
                    why: Send::Speculative,
                });
            }
            return None;
        }
        if self.cc.rescue_sent {
            return None;
        }
        let idx = self.sendq.highest_unsacked(sent)?;
        let r = self.sendq.get(idx);
        let len = r.len;
        // A repair still waiting to go out is rule 1's, and a record that
        // went out during this episode, or less than a round trip ago, is
        // in flight still (see the `recovery` module).
        if (r.lost && !r.rexmit)
            || r.xmit_id >= self.cc.recovery_start
            || now < r.sent_at + self.rack_rtt()
        {
            return None;
        }
        if len <= mss && self.cwnd_allows(len) {
            return Some(Tx::Data {
                idx,
                off: 0,
                len,
                why: Send::Rescue,
            });
        }
        None
    }

    /// The tail loss probe (RFC 8985 §7.3): in NewReno recovery and after
    /// an RTO the oldest record; in SACK recovery a repair the window held
    /// back, if any; the next new record if the peer's window takes it;
    /// else the FIN when it was the last thing sent, or the highest record
    /// not SACKed (the last one sent, outside recovery), whole.
    fn pick_probe(&mut self, sent: usize) -> Option<Tx> {
        let mss = self.eff_mss;
        let after_rto = !self.cc.in_recovery && self.snd_una < self.cc.recover;
        if (self.cc.in_recovery && !self.opts.sack) || after_rto {
            // All NewReno, or the go-back-N after an RTO, knows is that the
            // oldest record is missing: its repair, or the ACK of it, was
            // lost. Either way, resend it.
            let r = self.sendq.front()?;
            let whole = r.end() <= self.snd_nxt && r.len <= mss;
            let why = if r.lost && !r.rexmit && !r.sacked {
                Send::ProbeRepair
            } else {
                Send::Probe
            };
            return whole.then_some(Tx::Data {
                idx: 0,
                off: 0,
                len: r.len,
                why,
            });
        }
        if let Some(idx) = self.sendq.next_pending(sent) {
            let r = self.sendq.get(idx);
            let sent_len = r.len.min(self.snd_nxt - r.seq);
            let off = r.rtx_off.min(sent_len);
            let len = (sent_len - off).min(mss);
            if len > 0 {
                return Some(Tx::Data {
                    idx,
                    off,
                    len,
                    why: Send::ProbeRepair,
                });
            }
        }
        let idx = self.sendq.next_new();
        if idx < self.sendq.len() {
            let r = self.sendq.get(idx);
            let off = self.snd_nxt - r.seq;
            let len = (r.len - off.min(r.len)).min(mss);
            if len > 0 && self.snd_nxt + len <= self.snd_una + self.snd_wnd {
                return Some(Tx::Data {
                    idx,
                    off,
                    len,
                    why: Send::ProbeNew,
                });
            }
        }
        if self.fin_sent && self.fin_seq.is_some_and(|f| self.snd_una <= f) {
            return Some(Tx::Fin {
                rtx: true,
                probe: true,
            });
        }
        let idx = self.sendq.highest_unsacked(sent)?;
        let r = self.sendq.get(idx);
        let whole = r.end() <= self.snd_nxt && r.len <= mss;
        if !whole || (r.lost && !r.rexmit) {
            return None;
        }
        Some(Tx::Data {
            idx,
            off: 0,
            len: r.len,
            why: Send::Probe,
        })
    }

    /// How many whole new records after record `idx` (sent whole, `seg_len`
    /// bytes) can go out in the same segment for the port to cut
    /// ([`Segment::more`]), and their bytes: each as long as the first (the
    /// last at most), within the train limits of the configuration, the
    /// peer's window and the congestion window; none during loss recovery
    /// or F-RTO. Records short enough for two to share a segment are
    /// packed instead where packing is on ([`Connection::pack_extent`]):
    /// a train still puts each on the wire in a segment of its own.
    fn train_extent(&self, idx: usize, seg_len: usize) -> (usize, usize) {
        let (max_bytes, max_records) = (self.config.train_bytes, self.config.train_records);
        if max_bytes < 2 * seg_len || !self.may_join(idx, max_records) {
            return (0, 0);
        }
        if self.config.pack_records >= 2 && 2 * seg_len <= self.eff_mss {
            return (0, 0);
        }
        let wnd_end = self.snd_una + self.snd_wnd;
        let cwnd_room = self.send_window().saturating_sub(self.pipe());
        let (mut count, mut total) = (0usize, seg_len);
        let mut j = idx + 1;
        while j < self.sendq.len() && count + 1 < max_records {
            let r = self.sendq.get(j);
            let end = total + r.len;
            if r.len > seg_len
                || end > max_bytes
                || end > cwnd_room
                || self.snd_nxt + end > wnd_end
                || !r.record.joins_train()
            {
                break;
            }
            count += 1;
            total = end;
            j += 1;
            if r.len < seg_len {
                break;
            }
        }
        (count, total - seg_len)
    }

    /// Whether record `idx` may lead a segment of up to `max_records`
    /// records (a train or a pack): at least two allowed, no loss
    /// recovery or F-RTO under way, and the record willing to share.
    fn may_join(&self, idx: usize, max_records: usize) -> bool {
        max_records >= 2
            && !self.cc.in_recovery
            && !self.frto_holds()
            && !self.frto_new_allowed()
            && self.sendq.get(idx).record.joins_train()
    }

    /// How many whole new records after record `idx` (`len` bytes, whole
    /// and new) can be packed into its segment ([`Segment::more`] as a
    /// pack), and their bytes: as many as follow it, within
    /// [`Config::pack_records`](super::Config::pack_records), the MSS, the
    /// peer's window and the congestion window; none during loss recovery
    /// or F-RTO. Only records already queued are packed: nothing waits for
    /// more to come.
    fn pack_extent(&self, idx: usize, len: usize) -> (usize, usize) {
        let max_records = self.config.pack_records;
        if !self.may_join(idx, max_records) {
            return (0, 0);
        }
        let wnd_end = self.snd_una + self.snd_wnd;
        let cwnd_room = self.send_window().saturating_sub(self.pipe());
        let limit = self.eff_mss.min(cwnd_room);
        let (mut count, mut total) = (0usize, len);
        let mut j = idx + 1;
        while j < self.sendq.len() && count + 1 < max_records {
            let r = self.sendq.get(j);
            let end = total + r.len;
            if end > limit || self.snd_nxt + end > wnd_end || !r.record.joins_train() {
                break;
            }
            count += 1;
            total = end;
            j += 1;
        }
        (count, total - len)
    }

    /// [`Connection::note_data`] for the `count` records of a train or a
    /// pack after its first (from `first` on): each new and whole, sent
    /// right after the one before. Each changes what `note_data` changes
    /// for it; the timers, which `note_data` would re-arm for each in
    /// turn at the same `now` (the retransmission timer running already,
    /// the probe timeout set from the flight after the last), are armed
    /// once, after the last. Returns the last one's flags, which the
    /// train's header carries.
    fn note_train(&mut self, now: Instant, first: usize, count: usize) -> TcpFlags {
        let mut bytes = 0;
        for j in first..first + count {
            let (seq, len) = {
                let r = self.sendq.get(j);
                (r.seq, r.len)
            };
            self.sendq.stamp(j, now);
            self.frto_sent_new();
            self.snd_nxt = seq + len;
            self.sendq.advance_new();
            bytes += len;
        }
        self.stats.bytes_out += bytes as u64;
        if self.cc.in_recovery {
            self.cc.prr_out += bytes;
        }
        self.arm_rto(now);
        self.arm_pto(now);
        self.whole_record_flags(first + count - 1)
    }

    /// The flags of a segment that ends record `idx`. PSH ends what the
    /// sender has to send (RFC 9293 §3.9.1.2): a record that ends a
    /// message, or the last record queued, not every record. The
    /// receiver acknowledges a pushed segment as soon as it is read; on
    /// every record, that would be an ACK per segment whenever segments
    /// of many connections arrive interleaved.
    fn whole_record_flags(&self, idx: usize) -> TcpFlags {
        if idx + 1 == self.sendq.len() || self.sendq.get(idx).record.ends_message() {
            TcpFlags::ACK | TcpFlags::PSH
        } else {
            TcpFlags::ACK
        }
    }

    /// The bookkeeping of sending bytes `off..off + len` of record `idx`:
    /// their sequence number and the flags their segment carries.
    fn note_data(
        &mut self,
        now: Instant,
        idx: usize,
        off: usize,
        len: usize,
        why: Send,
    ) -> (SeqNumber, TcpFlags) {
        let (seq, rec_len) = {
            let r = self.sendq.get(idx);
            (r.seq + off, r.len)
        };
        let flags = if off + len == rec_len {
            self.whole_record_flags(idx)
        } else {
            TcpFlags::ACK
        };
        if matches!(why, Send::Speculative | Send::Rescue | Send::Probe) {
            self.sendq.mark_speculative(idx, now);
            if why == Send::Rescue {
                self.cc.rescue_sent = true;
            }
            self.stats.retransmits += 1;
        } else if matches!(why, Send::Repair | Send::ProbeRepair) {
            let sent_len = rec_len.min(self.snd_nxt - self.sendq.get(idx).seq);
            self.sendq.stamp(idx, now);
            self.sendq.get_mut(idx).rtx_off = off + len;
            if off + len >= sent_len {
                self.sendq.mark_repaired(idx);
            }
            self.stats.retransmits += 1;
            self.cc.force_rtx = false;
        } else {
            if off == 0 {
                self.sendq.stamp(idx, now);
            }
            if why == Send::New {
                self.frto_sent_new();
            }
            self.snd_nxt = seq + len;
            if off + len == rec_len {
                self.sendq.advance_new();
            }
        }
        if len < rec_len {
            let r = self.sendq.get_mut(idx);
            if !r.split_counted {
                r.split_counted = true;
                self.stats.records_split += 1;
            }
        }
        self.stats.bytes_out += len as u64;
        if self.cc.in_recovery {
            self.cc.prr_out += len;
        }
        self.arm_rto(now);
        match why {
            Send::New | Send::Repair | Send::Speculative | Send::Rescue => self.arm_pto(now),
            Send::ProbeNew => self.note_probe(now, None),
            Send::Probe | Send::ProbeRepair => self.note_probe(now, Some((seq, seq + len))),
        }
        (seq, flags)
    }

    /// Starts the retransmission timer if it is not running (RFC 6298 §5.1).
    pub(super) fn arm_rto(&mut self, now: Instant) {
        if self.timers.rto.is_none() {
            self.timers.rto = Some(now + self.rtt.rto());
        }
    }

    /// A header carrying the current ACK, window and options. Sending it
    /// discharges the ACK obligation.
    pub(super) fn header(
        &mut self,
        now: Instant,
        seq: SeqNumber,
        flags: TcpFlags,
        payload_len: usize,
    ) -> TcpRepr {
        let mut options = TcpOptions::default();
        if self.opts.timestamps {
            options.timestamp = Some(TcpTimestamp {
                tsval: self.ts_now(now),
                tsecr: self.ts_recent,
            });
        }
        let mut sack_incomplete = false;
        if self.opts.sack && !self.assembler.is_empty() {
            let max = if self.opts.timestamps { 3 } else { 4 };
            // A SACK option takes 2 + 8n bytes plus two NOPs of padding;
            // it must not push a full segment past the MTU.
            let fit = if payload_len == 0 {
                max
            } else {
                (self.eff_mss.saturating_sub(payload_len).saturating_sub(4) / 8).min(max)
            };
            if fit > 0 {
                options.sack = self.assembler.sack_blocks(fit);
            }
            sack_incomplete = fit < max;
        }
        let window = self.advertise_window();
        self.ack_now = sack_incomplete;
        self.timers.delack = None;
        self.rcv_unacked = 0;
        self.rcv_pushed = false;
        self.last_ack_sent = self.rcv_nxt;
        self.stats.segments_out += 1;
        TcpRepr {
            src_port: self.local.port(),
            dst_port: self.remote.port(),
            seq,
            ack_number: self.rcv_nxt,
            flags,
            window,
            urgent: 0,
            options,
        }
    }

    /// Owes an ACK of the state as it is now, the received range `dsack`
    /// (a duplicate) reported first when SACK is in use. The snapshot meets
    /// every ACK obligation so far: the delayed ACK and `ack_now` are
    /// cleared. When [`MAX_PENDING_ACKS`] are owed already, the oldest is
    /// dropped: the ones after it report a later state.
    pub(super) fn queue_ack(&mut self, dsack: Option<(SeqNumber, SeqNumber)>) {
        let mut sack = SackBlocks::new();
        if self.opts.sack {
            let mut room = if self.opts.timestamps { 3 } else { 4 };
            if let Some((left, right)) = dsack {
                sack.push(left, right);
                room -= 1;
            }
            for &(left, right) in self.assembler.sack_blocks(room).as_slice() {
                sack.push(left, right);
            }
        }
        let window = self.advertise_window();
        if self.ack_queue.len() >= MAX_PENDING_ACKS {
            self.ack_queue.pop_front();
            self.stats.acks_coalesced += 1;
        }
        crate::room::room_for(&mut self.ack_queue, MAX_PENDING_ACKS);
        self.ack_queue.push_back(AckSnapshot {
            ack: self.rcv_nxt,
            window,
            tsecr: self.ts_recent,
            sack,
        });
        self.ack_now = false;
        self.timers.delack = None;
        self.rcv_unacked = 0;
        self.rcv_pushed = false;
    }

    /// The pure ACK of an owed snapshot.
    fn snapshot_repr(&mut self, now: Instant, snap: AckSnapshot) -> TcpRepr {
        let mut options = TcpOptions::default();
        if self.opts.timestamps {
            options.timestamp = Some(TcpTimestamp {
                tsval: self.ts_now(now),
                tsecr: snap.tsecr,
            });
        }
        options.sack = snap.sack;
        self.last_ack_sent = snap.ack;
        self.stats.segments_out += 1;
        TcpRepr {
            src_port: self.local.port(),
            dst_port: self.remote.port(),
            seq: self.snd_nxt,
            ack_number: snap.ack,
            flags: TcpFlags::ACK,
            window: snap.window,
            urgent: 0,
            options,
        }
    }

    /// The SYN (SYN-SENT) or SYN-ACK (SYN-RECEIVED), original or again.
    fn syn_repr(&mut self, now: Instant) -> TcpRepr {
        let passive = self.state == State::SynReceived;
        let mut options = TcpOptions {
            mss: Some(self.config.mss),
            ..TcpOptions::default()
        };
        if passive {
            if self.opts.wscale {
                options.window_scale = Some(self.opts.rcv_shift);
            }
            options.sack_permitted = self.opts.sack;
            if self.opts.timestamps {
                options.timestamp = Some(TcpTimestamp {
                    tsval: self.ts_now(now),
                    tsecr: self.ts_recent,
                });
            }
        } else {
            if self.config.window_scaling {
                options.window_scale = Some(self.opts.rcv_shift);
            }
            options.sack_permitted = self.config.sack;
            if self.config.timestamps {
                options.timestamp = Some(TcpTimestamp {
                    tsval: self.ts_now(now),
                    tsecr: 0,
                });
            }
        }
        if self.syn_sends == 0 {
            self.syn_sent_at = Some(now);
        } else {
            // Karn: an answer to a repeated SYN is no RTT sample.
            self.syn_sent_at = None;
            self.stats.retransmits += 1;
        }
        self.syn_sends += 1;
        self.syn_pending = false;
        self.arm_rto(now);
        self.stats.segments_out += 1;
        let mut flags = TcpFlags::SYN;
        let mut ack_number = SeqNumber(0);
        if passive {
            flags |= TcpFlags::ACK;
            ack_number = self.rcv_nxt;
            self.ack_now = false;
            self.last_ack_sent = self.rcv_nxt;
        }
        TcpRepr {
            src_port: self.local.port(),
            dst_port: self.remote.port(),
            seq: self.iss,
            ack_number,
            flags,
            // RFC 7323 §2.2: the window of a SYN is never scaled.
            window: u16::try_from(self.config.recv_buffer).unwrap_or(u16::MAX),
            urgent: 0,
            options,
        }
    }

    fn rst_repr(&mut self, rst: PendingRst) -> TcpRepr {
        self.stats.segments_out += 1;
        let mut flags = TcpFlags::RST;
        if rst.ack.is_some() {
            flags |= TcpFlags::ACK;
        }
        TcpRepr {
            src_port: self.local.port(),
            dst_port: self.remote.port(),
            seq: rst.seq,
            ack_number: rst.ack.unwrap_or(SeqNumber(0)),
            flags,
            window: 0,
            urgent: 0,
            options: TcpOptions::default(),
        }
    }
}
