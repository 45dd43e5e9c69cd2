//! The receive path of the synchronized states (RFC 9293 §3.10.7.4, in
//! its order): PAWS (RFC 7323 §5.3), the sequence-number acceptability
//! test, RST and SYN checks with RFC 5961 challenge ACKs, TS.Recent and
//! RTTM (RFC 7323 §4.3), ACK processing with the SND.WL1/WL2 window update
//! rule, the SACK scoreboard, and the segment text: trimmed to the window,
//! in-order payload queued for `recv`, out-of-order payload handed to the
//! assembler by reference. It also computes the receive window we
//! advertise: never shrinking its right edge (RFC 7323 §2.4) and applying
//! receiver silly-window avoidance (RFC 9293 §3.8.6.2.2).

use core::time::Duration;

use super::assembler::Rejected;
use super::connection::{Connection, EVENTS_AT_OPEN};
use super::sendq::Delivered;
use super::{Event, Payload, Record, State};
use crate::seq::SeqNumber;
use crate::time::Instant;
use crate::wire::{TcpFlags, TcpRepr};

/// RFC 5961 §7: challenge ACKs per connection per second, at most, so
/// that a blind attacker cannot use them as an amplifier.
const CHALLENGE_ACK_LIMIT: u32 = 100;

/// RFC 7323 §5.5: TS.Recent older than 24 days is no basis for PAWS.
const TS_RECENT_LIFETIME: Duration = Duration::from_secs(24 * 24 * 3600);

/// How far a TSval may lag TS.Recent and still pass PAWS: one tick of the
/// peer's timestamp clock, as Linux allows (its `TCP_PAWS_WINDOW`). A
/// retransmission that overtakes originals held back on a reordering path
/// carries a TSval one tick newer than theirs, and because it is in
/// sequence it sets TS.Recent; strict RFC 7323 §5.3 would then drop the
/// originals right after it, although they are no duplicates from a
/// previous wrap, and the peer would have to send them again. Every peer
/// we meet runs Linux TCP or hardware that accepts them, so we do too. A
/// segment from an earlier wrap of the sequence space is older than that
/// by far: at a 1 ms tick a wrap takes at least 34 s even at 1 Gbit/s.
pub const PAWS_WINDOW: u32 = 1;

/// The PAWS verdict on one segment.
enum Paws {
    /// Not older than TS.Recent, or no basis for the test.
    Pass,
    /// Older, but within [`PAWS_WINDOW`].
    Tolerated,
    /// Older by more than the window: dropped.
    Reject,
}

/// Whether `tsval` lags `ts_recent` by more than [`PAWS_WINDOW`] ticks, in
/// the modular arithmetic of RFC 7323 §5.2.
fn paws_too_old(tsval: u32, ts_recent: u32) -> bool {
    (ts_recent.wrapping_sub(tsval) as i32) > PAWS_WINDOW as i32
}

impl<B: AsRef<[u8]>, R: Record> Connection<B, R> {
    /// Every state from SYN-RECEIVED to TIME-WAIT.
    pub(super) fn on_segment_synchronized(
        &mut self,
        now: Instant,
        repr: &TcpRepr,
        payload: Option<Payload<B>>,
    ) {
        let payload = match self.in_order_data(now, repr, payload) {
            Ok(()) => return,
            Err(p) => p,
        };
        let plen = payload.as_ref().map_or(0, Payload::len);
        let rst = repr.flags.contains(TcpFlags::RST);
        let syn = repr.flags.contains(TcpFlags::SYN);
        let fin = repr.flags.contains(TcpFlags::FIN);

        if self.state == State::SynReceived && syn && !rst && repr.seq == self.irs {
            let a = repr.ack_number;
            if repr.ack().is_some() && self.snd_una < a && a <= self.snd_nxt {
                // Simultaneous open: the peer's SYN-ACK acknowledges our SYN.
                self.ack_syn_received(now, repr);
                self.ack_now = true;
            } else {
                // The peer repeated its SYN: our SYN-ACK was lost.
                self.syn_pending = true;
            }
            return;
        }

        match self.paws(now, repr) {
            Paws::Pass => {}
            Paws::Tolerated => self.stats.paws_tolerated += 1,
            Paws::Reject => {
                self.stats.dropped += 1;
                self.stats.paws_dropped += 1;
                self.ack_now = true;
                return;
            }
        }

        if !self.acceptable(repr.seq, repr.segment_len(plen)) {
            if !rst {
                let end = repr.seq + plen;
                if plen > 0 && end <= self.rcv_nxt && self.state != State::SynReceived {
                    // Old data again: our ACK of it was lost, or the peer
                    // retransmitted too soon. ACK this very segment, and
                    // tell which one it was (RFC 2883 §4.1).
                    self.queue_ack(Some((repr.seq, end)));
                } else {
                    self.ack_now = true;
                }
                if self.state == State::TimeWait && fin {
                    // A repeated FIN: our ACK was lost. Re-ACK and wait the
                    // full 2·MSL again (RFC 9293 §3.10.7.4, TIME-WAIT).
                    self.timers.time_wait = Some(now + self.config.time_wait);
                }
            }
            self.stats.dropped += 1;
            return;
        }

        if rst {
            if repr.seq == self.rcv_nxt && self.state == State::TimeWait {
                // Both FINs were exchanged and acknowledged: the close was
                // orderly, and a RST (typically the peer answering a stray
                // duplicate after it closed) only ends TIME-WAIT early, as
                // Linux does.
                self.terminate(Event::Closed);
            } else if repr.seq == self.rcv_nxt {
                self.terminate(Event::Reset);
            } else {
                // RFC 5961 §3.2: in the window but not exact.
                self.challenge_ack(now);
            }
            return;
        }

        if syn {
            // RFC 5961 §4.2: challenge ACK, drop.
            self.challenge_ack(now);
            self.stats.dropped += 1;
            return;
        }

        if repr.ack().is_none() {
            self.stats.dropped += 1;
            return;
        }

        self.update_ts_recent(now, repr);
        self.restart_keepalive(now);

        if self.state == State::SynReceived && !self.ack_syn_received(now, repr) {
            return;
        }
        if !self.on_ack(now, repr, plen) || self.state == State::Closed {
            return;
        }

        let whole = match payload {
            Some(p)
                if matches!(
                    self.state,
                    State::Established | State::FinWait1 | State::FinWait2
                ) =>
            {
                if repr.flags.contains(TcpFlags::PSH) {
                    self.rcv_pushed = true;
                }
                self.on_text(now, repr.seq, p)
            }
            Some(_) => {
                // Payload after the peer's FIN: nothing more can be accepted.
                self.ack_now = true;
                false
            }
            None => true,
        };
        if fin && whole {
            self.on_fin_flag(now, repr.seq + plen);
        }
    }

    /// The common segment of a stream's receiving end, taken the short
    /// way (RFC 9293's processing, predicted as in Van Jacobson's header
    /// prediction): in ESTABLISHED, only ACK (and PSH), payload starting
    /// at RCV.NXT, the ACK and window of the last segment, no SACK
    /// blocks, PAWS's plain pass (not its tolerance), and nothing of ours
    /// in flight, no recovery, F-RTO, undo, D-SACK round or probe under
    /// way. For such a segment every step of the full path but these is a
    /// no-op: TS.Recent, the keepalive, SND.WL1/WL2 (the window is the
    /// same), PSH, and the text. Anything else, or `Err` with the
    /// payload, goes the full way.
    fn in_order_data(
        &mut self,
        now: Instant,
        repr: &TcpRepr,
        payload: Option<Payload<B>>,
    ) -> Result<(), Option<Payload<B>>> {
        let predicted = self.state == State::Established
            && self.fin_seq.is_none()
            && (repr.flags == TcpFlags::ACK || repr.flags == TcpFlags::ACK | TcpFlags::PSH)
            && repr.seq == self.rcv_nxt
            && repr.ack_number == self.snd_una
            && self.snd_una == self.snd_nxt
            && usize::from(repr.window) << self.opts.snd_shift == self.snd_wnd
            && repr.options.sack.as_slice().is_empty()
            && !self.cc.in_recovery
            && !self.frto_holds()
            && self.cc.undo.is_none()
            && self.rack_idle()
            && self.takes_send_window(repr)
            && matches!(self.paws(now, repr), Paws::Pass);
        let p = match payload {
            Some(p) if predicted => p,
            other => return Err(other),
        };
        self.stats.predicted += 1;
        self.update_ts_recent(now, repr);
        self.restart_keepalive(now);
        self.snd_wl1 = repr.seq;
        self.snd_wl2 = repr.ack_number;
        if repr.flags.contains(TcpFlags::PSH) {
            self.rcv_pushed = true;
        }
        self.on_text(now, repr.seq, p);
        Ok(())
    }

    /// RFC 9293's SND.WL1/WL2 rule: whether `repr` is no older than the
    /// segment that last set the send window.
    fn takes_send_window(&self, repr: &TcpRepr) -> bool {
        self.snd_wl1 < repr.seq || (self.snd_wl1 == repr.seq && self.snd_wl2 <= repr.ack_number)
    }

    /// Owes a challenge ACK, within the rate limit.
    fn challenge_ack(&mut self, now: Instant) {
        if now - self.challenge_since >= Duration::from_secs(1) {
            self.challenge_since = now;
            self.challenge_count = 0;
        }
        if self.challenge_count < CHALLENGE_ACK_LIMIT {
            self.challenge_count += 1;
            self.ack_now = true;
        }
    }

    /// RFC 7323 §5.3 R1: a segment whose TSval is older than TS.Recent is a
    /// duplicate from a previous wrap of the sequence space; older by more
    /// than [`PAWS_WINDOW`], that is.
    fn paws(&self, now: Instant, repr: &TcpRepr) -> Paws {
        if !self.opts.timestamps || repr.flags.contains(TcpFlags::RST) {
            return Paws::Pass;
        }
        let Some(ts) = repr.options.timestamp else {
            return Paws::Pass;
        };
        if (ts.tsval.wrapping_sub(self.ts_recent) as i32) >= 0
            || now - self.ts_recent_at > TS_RECENT_LIFETIME
        {
            Paws::Pass
        } else if paws_too_old(ts.tsval, self.ts_recent) {
            Paws::Reject
        } else {
            Paws::Tolerated
        }
    }

    /// RFC 7323 §4.3: remember the peer's TSval of a segment that is not
    /// later than the last ACK we sent.
    fn update_ts_recent(&mut self, now: Instant, repr: &TcpRepr) {
        if !self.opts.timestamps {
            return;
        }
        if let Some(ts) = repr.options.timestamp {
            if (ts.tsval.wrapping_sub(self.ts_recent) as i32) >= 0 && repr.seq <= self.last_ack_sent
            {
                self.ts_recent = ts.tsval;
                self.ts_recent_at = now;
            }
        }
    }

    /// The acceptability test of RFC 9293 §3.10.7.4. With a zero window, a
    /// segment starting exactly at RCV.NXT is accepted for its ACK (and a
    /// bare FIN) while its payload is trimmed away, which RFC 9293 asks for
    /// ("special allowance should be made to accept valid ACKs"). In the
    /// same spirit an empty segment at the right edge itself is accepted,
    /// as Linux accepts it: that is where a peer that filled our window
    /// sends its ACKs from, and refusing them would lose what they
    /// acknowledge until the window opens.
    fn acceptable(&self, seq: SeqNumber, len: usize) -> bool {
        let wnd = self.rcv_adv - self.rcv_nxt;
        let nxt = self.rcv_nxt;
        if wnd == 0 {
            return seq == nxt;
        }
        let end = nxt + wnd;
        if len == 0 {
            return seq.in_range(nxt, end) || seq == end;
        }
        seq.in_range(nxt, end) || (seq + (len - 1)).in_range(nxt, end)
    }

    /// ACK processing. Returns whether the segment is processed further.
    fn on_ack(&mut self, now: Instant, repr: &TcpRepr, plen: usize) -> bool {
        let ack = repr.ack_number;
        if ack > self.snd_nxt {
            // Acknowledges something not yet sent.
            self.ack_now = true;
            self.stats.dropped += 1;
            return false;
        }
        if ack < self.snd_una {
            // RFC 5961 §5.2: a very old ACK is suspicious; a merely old one
            // is ignored while the rest of the segment is processed.
            if self.snd_una - ack > self.max_snd_wnd.max(usize::from(u16::MAX)) {
                self.challenge_ack(now);
                self.stats.dropped += 1;
                return false;
            }
            return true;
        }

        let wnd = usize::from(repr.window) << self.opts.snd_shift;
        let window_changed = wnd != self.snd_wnd;
        // RFC 9293's SND.WL1/WL2 rule, and also any ACK that acknowledges
        // new data, as Linux does: a retransmission from the peer carries
        // an old sequence number but its current ACK and window, and
        // moving SND.UNA without taking that window would move the right
        // edge past what the peer offered (then the peer finds our
        // segments, pure ACKs included, outside its window and drops them).
        if self.snd_una < ack || self.takes_send_window(repr) {
            self.snd_wnd = wnd;
            self.snd_wl1 = repr.seq;
            self.snd_wl2 = ack;
            self.max_snd_wnd = self.max_snd_wnd.max(wnd);
        }

        let echo = match (self.opts.timestamps, repr.options.timestamp) {
            (true, Some(ts)) => Some((ts.tsecr, self.ts_offset)),
            _ => None,
        };
        let mut delivered = Delivered::new(now, self.rtt.min_rtt(), echo);
        let sacked_before = self.sendq.sacked_bytes();
        let acked = ack - self.snd_una;
        if acked > 0 {
            self.snd_una = ack;
            self.on_data_acked(now, repr, &mut delivered);
        }

        let mut new_sack = false;
        let mut dsack = None;
        let mut sack_above_probe = false;
        let mut sack_high: Option<SeqNumber> = None;
        if self.opts.sack {
            let blocks = repr.options.sack.as_slice();
            dsack = dsack_block(blocks, ack);
            for &(left, right) in blocks {
                if let Some(end) = self.tlp.end {
                    sack_above_probe |= right > end;
                }
                // Blocks at or below the cumulative ACK (D-SACK) or beyond
                // what was sent are ignored (RFC 2018 §4, RFC 6675 §5).
                if left >= right || left < self.snd_una || right > self.snd_nxt {
                    continue;
                }
                if !sack_high.is_some_and(|h| h >= right) {
                    sack_high = Some(right);
                }
                new_sack |= self
                    .sendq
                    .sack_block(left, right, self.snd_nxt, &mut delivered);
            }
        }
        self.rack_update(&delivered, dsack.is_some(), now);

        // A duplicate ACK in the RFC 5681 §2 sense, whether or not anything
        // is still outstanding.
        let dup_like =
            acked == 0 && plen == 0 && !repr.flags.contains(TcpFlags::FIN) && !window_changed;
        let dup = dup_like && self.snd_una != self.snd_nxt;
        // Was a timeout spurious? Eifel detection with timestamps, F-RTO
        // without them (see `recovery`).
        if self.opts.timestamps {
            self.rto_undo_check(acked, echo.map(|(tsecr, _)| tsecr));
        } else {
            self.frto_on_ack(acked, dup, sack_high, new_sack);
        }
        self.tlp_on_ack(now, ack, dup_like, dsack, sack_above_probe);
        // RFC 6937 DeliveredData: what the cumulative ACK and the SACK
        // blocks newly cover, less what was SACKed before and is now
        // acknowledged.
        let delivered_bytes = (acked + self.sendq.sacked_bytes()).saturating_sub(sacked_before);
        self.on_ack_cc(now, acked, delivered_bytes, dup, new_sack);
        if acked > 0 || (self.cc.in_recovery && delivered_bytes > 0) {
            self.arm_pto(now);
        }

        if let Some(f) = self.fin_seq {
            if self.fin_sent && self.snd_una > f {
                self.on_fin_acked(now);
            }
        }
        true
    }

    /// `snd.una` advanced: release acknowledged records (noting those not
    /// SACKed before in `delivered`), sample the RTT, and restart or stop
    /// the retransmission timer (RFC 6298 §5.2, §5.3).
    fn on_data_acked(&mut self, now: Instant, repr: &TcpRepr, delivered: &mut Delivered) {
        let mut sample = None;
        let mut ambiguous = false;
        while let Some(r) = self.sendq.pop_acked(self.snd_una) {
            if r.ever_rexmit {
                ambiguous = true;
            } else {
                sample = Some(now - r.sent_at);
            }
            if !r.sacked {
                delivered.note(&r, true);
            }
            crate::room::room_for(&mut self.events, self.sendq.capacity() + EVENTS_AT_OPEN);
            self.events.push_back(Event::RecordAcked(r.record));
        }
        if ambiguous {
            sample = None;
        }
        match (sample, self.opts.timestamps, repr.options.timestamp) {
            (Some(s), _, _) => self.rtt.sample(s),
            (None, true, Some(ts)) if ts.tsecr != 0 => self.rtt_sample_ts(now, ts.tsecr),
            _ => {}
        }
        self.timers.retries = 0;
        self.timers.rto = if self.snd_una == self.snd_nxt {
            None
        } else {
            Some(now + self.rtt.rto())
        };
    }

    /// RTTM (RFC 7323 §4.1): the echoed timestamp dates the segment the
    /// ACK answers, even a retransmitted one.
    pub(super) fn rtt_sample_ts(&mut self, now: Instant, tsecr: u32) {
        let ms = self.ts_now(now).wrapping_sub(tsecr);
        if (ms as i32) >= 0 {
            self.rtt.sample(Duration::from_millis(u64::from(ms)));
        }
    }

    /// The segment text. Returns whether all of it fitted the window (a
    /// FIN after trimmed-away payload is not acceptable yet).
    ///
    /// Out-of-order payload, payload that fills (part of) a hole, and
    /// payload that repeats bytes already received are each acknowledged
    /// by an ACK of their own (`queue_ack`); in-order payload follows the
    /// delayed-ACK rule.
    pub(super) fn on_text(&mut self, now: Instant, seq: SeqNumber, mut p: Payload<B>) -> bool {
        let mut seq = seq;
        // Bytes this segment repeats, for a D-SACK block.
        let mut dsack = None;
        if seq < self.rcv_nxt {
            let dup = self.rcv_nxt - seq;
            if dup >= p.len() {
                self.queue_ack(Some((seq, seq + p.len())));
                return true;
            }
            dsack = Some((seq, self.rcv_nxt));
            p.trim_front(dup);
            seq = self.rcv_nxt;
        }
        let edge = self.rcv_adv.max(self.rcv_nxt);
        let room = edge - seq;
        let mut whole = true;
        if p.len() > room {
            p.truncate(room);
            whole = false;
            self.ack_now = true;
            if p.is_empty() {
                self.stats.dropped += 1;
                return false;
            }
        }
        if seq == self.rcv_nxt {
            if self.rx_queue.len() >= self.rx_max_segments {
                self.stats.dropped += 1;
                self.ack_now = true;
                return false;
            }
            let filled_hole = !self.assembler.is_empty();
            let len = p.len();
            self.rcv_nxt += len;
            self.rx_bytes += len;
            crate::room::room_for(&mut self.rx_queue, self.rx_max_segments);
            self.rx_queue.push_back(p);
            self.schedule_ack(now, len);
            // Only held payload or a held FIN can have come in order: the
            // common segment of a stream in order has neither to pull.
            if filled_hole || self.rx_fin.is_some() {
                self.pull_assembler();
            }
            if filled_hole || dsack.is_some() {
                // RFC 5681 §4.2: ACK at once when a gap is (partly) filled.
                self.queue_ack(dsack);
            }
        } else {
            let end = seq + p.len();
            let dup = match self.assembler.insert(seq, p, self.rcv_nxt) {
                Ok(()) => None,
                // Every byte is held already: its block leads the SACK
                // blocks, preceded by the D-SACK block (RFC 2883 §4.1).
                Err(Rejected::Duplicate) => Some((seq, end)),
                Err(Rejected::Full) => {
                    self.stats.dropped += 1;
                    None
                }
            };
            // Out of order: ACK at once so the sender sees the duplicate
            // ACK and the SACK blocks (RFC 5681 §4.2).
            self.queue_ack(dup);
        }
        whole
    }

    /// Moves payload that became in order from the assembler to the
    /// in-order queue, as far as the queue's bound allows, then takes a FIN
    /// that was waiting for it.
    pub(super) fn pull_assembler(&mut self) {
        while self.rx_queue.len() < self.rx_max_segments {
            let Some(q) = self.assembler.pop(self.rcv_nxt) else {
                break;
            };
            self.rcv_nxt += q.len();
            self.rx_bytes += q.len();
            crate::room::room_for(&mut self.rx_queue, self.rx_max_segments);
            self.rx_queue.push_back(q);
        }
        if self.rx_fin == Some(self.rcv_nxt) {
            let now = self.last_now;
            self.consume_fin(now);
        }
    }

    /// The window we would advertise now: what is left of the receive
    /// buffer, except that an increase smaller than min(buffer / 2, MSS) is
    /// held back (receiver SWS avoidance) and the right edge never moves
    /// left.
    fn rcv_window_candidate(&self) -> usize {
        let held = self.rx_bytes + self.assembler.bytes();
        let max = usize::from(u16::MAX) << self.opts.rcv_shift;
        let avail = self.config.recv_buffer.saturating_sub(held).min(max);
        let cur = self.rcv_adv - self.rcv_nxt;
        if avail >= cur + self.sws_threshold() {
            avail
        } else {
            cur
        }
    }

    fn sws_threshold(&self) -> usize {
        (self.config.recv_buffer / 2)
            .min(usize::from(self.config.mss))
            .max(1)
    }

    /// Whether reading opened the window enough to tell the peer at once:
    /// the new window is at least twice the one last advertised and grew
    /// by the SWS threshold (this is what reopens a zero window).
    pub(super) fn window_update_due(&self) -> bool {
        if !matches!(
            self.state,
            State::Established | State::FinWait1 | State::FinWait2
        ) {
            return false;
        }
        let cur = self.rcv_adv - self.rcv_nxt;
        let want = self.rcv_window_candidate();
        want > cur && want >= 2 * cur
    }

    /// The window field to send, and the new right edge it sets.
    pub(super) fn advertise_window(&mut self) -> u16 {
        let s = self.opts.rcv_shift;
        let want = self.rcv_window_candidate();
        let cur = self.rcv_adv - self.rcv_nxt;
        let unit = 1usize << s;
        let wire = (want >> s)
            .max(cur.div_ceil(unit))
            .min(usize::from(u16::MAX));
        let edge = self.rcv_nxt + (wire << s);
        if edge > self.rcv_adv {
            self.rcv_adv = edge;
        }
        u16::try_from(wire).unwrap_or(u16::MAX)
    }
}

/// The D-SACK block of an ACK, if it carries one (RFC 2883 §4): the first
/// block, when it lies below the cumulative ACK or within the second block.
fn dsack_block(
    blocks: &[(SeqNumber, SeqNumber)],
    ack: SeqNumber,
) -> Option<(SeqNumber, SeqNumber)> {
    let &(left, right) = blocks.first()?;
    if left >= right {
        return None;
    }
    let inside_second = blocks.get(1).is_some_and(|&(l, r)| l <= left && right <= r);
    (left < ack || inside_second).then_some((left, right))
}

#[cfg(test)]
mod tests {
    use super::paws_too_old;

    #[test]
    fn paws_window_is_one_tick_in_modular_time() {
        assert!(!paws_too_old(100, 100));
        assert!(!paws_too_old(101, 100), "newer");
        assert!(!paws_too_old(99, 100), "one tick behind");
        assert!(paws_too_old(98, 100), "two ticks behind");
        // Across the wrap of the 32-bit clock.
        assert!(!paws_too_old(u32::MAX, 0), "one tick behind, wrapped");
        assert!(paws_too_old(u32::MAX - 1, 0), "two ticks behind, wrapped");
        assert!(!paws_too_old(1, u32::MAX), "newer, wrapped");
        // Almost half the space behind is the far past (RFC 7323 §5.2).
        assert!(paws_too_old(0, (1 << 31) - 5));
    }
}
