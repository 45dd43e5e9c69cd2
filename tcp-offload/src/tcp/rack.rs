//! RACK-TLP loss detection (RFC 8985), beside the DupThresh rules of
//! `recovery` and on the scoreboard of `sendq`.
//!
//! RACK (§6) reasons in time: once a record is delivered (cumulatively or
//! by SACK), every record sent sufficiently earlier and still not delivered
//! is lost, where "sufficiently" is the delivered record's round trip plus
//! a reordering window (zero while no reordering was seen and the
//! DupThresh rules would have acted anyway, a quarter of the minimum RTT
//! otherwise, widened after D-SACKs show spurious retransmissions). A
//! record not yet due arms the reordering timer. Because a repair is judged
//! by its own transmission time, a lost retransmission is found as soon as
//! something sent after it is delivered, without waiting for the RTO.
//!
//! TLP (§7) covers the tail: when no ACK has come for about two round trips
//! while data is outstanding, one probe goes out, a new record if one is
//! queued and the peer's window takes it, else the last record sent again
//! (records are never split or merged, so the probe is always a whole
//! record), or the FIN if that is the last thing sent. Its ACK, or its
//! SACK, hands RACK (or the duplicate ACK rule) what it needs to start
//! recovery in a round trip, where the alternative was the RTO. §7.4: if
//! the probe turns out to have repaired a loss on its own, the congestion
//! window is reduced as for a recovery.
//!
//! One departure from §7.2, which schedules no probe during loss recovery:
//! here the probe timeout also runs in fast recovery, restarted by every
//! transmission and by every ACK that reports something delivered, so it
//! fires only once the ACK clock has stopped: typically when the ACK that
//! would have ended the episode (or the one answering its last repair) was
//! lost, which would otherwise cost an RTO and the collapse of the window.
//! The probe then is, with SACK, a repair still waiting for the window if
//! there is one, else new data, else the highest record not SACKed; without
//! SACK, the oldest record, since all NewReno knows is that it is missing
//! (its repair, or the ACK of it, was lost). It opens no §7.4 episode (the
//! window is already reduced). The same holds during the go-back-N that
//! follows an RTO, once an ACK has acknowledged something since the RTO
//! (the probe is then the oldest record): without timestamps, Karn's
//! rule keeps the RTO backed off until a record sent only once is
//! acknowledged, which under heavy loss can be minutes, each step of the
//! go-back-N otherwise waiting that long whenever its last ACK is lost.
//! Without such an ACK, as against a black hole, the RTO and its backoff
//! rule alone.
//!
//! RACK needs SACK. TLP runs without it too: a lone lost last record is
//! repaired by the probe itself, and an ACK answering the probe that stops
//! short of it (the receiver holds the probe but misses something below
//! it) is taken as enough to start NewReno recovery, as RFC 5827 early
//! retransmit lowers the duplicate threshold when too little is
//! outstanding to produce three. An ACK counts as the probe's answer when
//! it comes at least the minimum RTT after the probe: any earlier, it was
//! sent before the probe arrived.

use core::time::Duration;

use super::connection::Connection;
use super::sendq::{sent_after, Delivered, Xmit};
use super::{Record, State};
use crate::seq::SeqNumber;
use crate::time::Instant;

/// RFC 8985 `WCDelAckT`: the longest a receiver may delay an ACK. Added to
/// the probe timeout when too little is outstanding for the receiver to
/// ACK at once (less than two full-sized segments).
pub(super) const WC_DEL_ACK: Duration = Duration::from_millis(200);

/// Least probe timeout. Timestamps tick in milliseconds, so an SRTT taken
/// from them is coarse on fast paths; a probe must not race the ACK it
/// waits for (earlier drafts of RFC 8985 used the same floor).
pub(super) const PTO_MIN: Duration = Duration::from_millis(10);

/// Recovery episodes a widened reordering window lasts (RFC 8985 §6.2
/// step 4, `RACK.reo_wnd_persist`).
const REO_WND_PERSIST: u32 = 16;

/// RACK's state (RFC 8985 §6.1).
#[derive(Debug, Clone)]
pub(super) struct Rack {
    /// `RACK.xmit_ts` and `RACK.end_seq`: the latest transmission among
    /// the records delivered.
    xmit: Option<Xmit>,
    /// `RACK.rtt`: the round trip of the last delivery that moved `xmit`.
    rtt: Duration,
    /// `RACK.fack`: end of the highest record delivered.
    fack: Option<SeqNumber>,
    /// `RACK.reordering_seen`: a record never retransmitted was delivered
    /// below one delivered before it.
    reordering_seen: bool,
    /// `RACK.reo_wnd_mult`, raised by D-SACKs.
    reo_wnd_mult: u32,
    /// `RACK.reo_wnd_persist`.
    reo_wnd_persist: u32,
    /// `RACK.dsack_round`: at most one raise per round trip.
    dsack_round: Option<SeqNumber>,
}

impl Default for Rack {
    fn default() -> Rack {
        Rack {
            xmit: None,
            rtt: Duration::ZERO,
            fack: None,
            reordering_seen: false,
            reo_wnd_mult: 1,
            reo_wnd_persist: REO_WND_PERSIST,
            dsack_round: None,
        }
    }
}

/// TLP's state (RFC 8985 §7).
#[derive(Debug, Clone, Default)]
pub(super) struct Tlp {
    /// The probe timeout fired: a probe goes out at the next
    /// `poll_transmit`.
    pub(super) pending: bool,
    /// `TLP.end_seq`: `snd.nxt` when the probe in flight went out.
    pub(super) end: Option<SeqNumber>,
    /// `TLP.is_retrans`: the probe resent data rather than sending new.
    is_retrans: bool,
    /// What the probe resent, to match a D-SACK of it.
    probe: Option<(SeqNumber, SeqNumber)>,
    /// When the probe went out.
    sent_at: Instant,
    /// Without SACK: the probe's answer stopped short of it, so something
    /// below it is missing.
    pub(super) hole_below: bool,
    /// `snd.una` when the last probe went out, if one did.
    probe_una: Option<SeqNumber>,
}

impl<B: AsRef<[u8]>, R: Record> Connection<B, R> {
    /// In fast recovery, or retransmitting after an RTO (`recover` is
    /// `snd.nxt` as it was then).
    pub(super) fn in_loss_recovery(&self) -> bool {
        self.cc.in_recovery || self.snd_una < self.cc.recover
    }

    /// RFC 8985 §6.2 steps 2 to 4, after the scoreboard took an ACK:
    /// `delivered` is what it newly delivered, `dsack` whether it carried a
    /// D-SACK block.
    pub(super) fn rack_update(&mut self, delivered: &Delivered, dsack: bool, now: Instant) {
        let rack = &mut self.rack;
        if let (Some(low), Some(fack)) = (delivered.low_original_end, rack.fack) {
            if low < fack {
                rack.reordering_seen = true;
            }
        }
        if let Some(high) = delivered.high_end {
            if !rack.fack.is_some_and(|f| f >= high) {
                rack.fack = Some(high);
            }
        }
        if let Some(latest) = delivered.latest {
            rack.rtt = now - latest.0;
            if !rack.xmit.is_some_and(|x| !sent_after(latest, x)) {
                rack.xmit = Some(latest);
            }
        }
        if rack.dsack_round.is_some_and(|r| self.snd_una >= r) {
            rack.dsack_round = None;
        }
        if dsack && rack.dsack_round.is_none() {
            rack.reo_wnd_mult = rack.reo_wnd_mult.saturating_add(1);
            rack.reo_wnd_persist = REO_WND_PERSIST;
            rack.dsack_round = Some(self.snd_nxt);
        }
    }

    /// Whether RACK and TLP have nothing to do with an ACK that delivers
    /// nothing: no D-SACK round open, no probe outstanding.
    pub(super) fn rack_idle(&self) -> bool {
        self.rack.dsack_round.is_none() && self.tlp.end.is_none()
    }

    /// `RACK.rtt`: the round trip of the latest transmission delivered.
    pub(super) fn rack_rtt(&self) -> Duration {
        self.rack.rtt
    }

    /// A fast recovery ended: a widened reordering window lasts
    /// `REO_WND_PERSIST` of them.
    pub(super) fn rack_recovery_ended(&mut self) {
        let rack = &mut self.rack;
        rack.reo_wnd_persist = rack.reo_wnd_persist.saturating_sub(1);
        if rack.reo_wnd_persist == 0 {
            rack.reo_wnd_mult = 1;
            rack.reo_wnd_persist = REO_WND_PERSIST;
        }
    }

    /// `RACK.reo_wnd` (RFC 8985 §6.2 step 4).
    fn rack_reo_wnd(&self) -> Duration {
        if !self.rack.reordering_seen
            && (self.in_loss_recovery()
                || self.sendq.sacked_count() >= super::recovery::DUP_THRESH as usize)
        {
            return Duration::ZERO;
        }
        let min_rtt = self.rtt.min_rtt().unwrap_or(Duration::ZERO);
        let wnd = min_rtt * self.rack.reo_wnd_mult / 4;
        match self.rtt.srtt() {
            Some(srtt) => wnd.min(srtt),
            None => wnd,
        }
    }

    /// RFC 8985 §6.2 step 5 and the reordering timer (§6.3): marks what
    /// RACK deems lost and arms the timer for what will be. Returns whether
    /// a repair is newly due. SACK connections only.
    pub(super) fn rack_detect(&mut self, now: Instant) -> bool {
        // Nothing outstanding (a receiver that sends only ACKs): nothing
        // to deem lost, nor to wait for.
        let outstanding = self.snd_una != self.snd_nxt;
        let Some(latest) = self.rack.xmit.filter(|_| self.opts.sack && outstanding) else {
            self.timers.reo = None;
            return false;
        };
        let reo_wnd = self.rack_reo_wnd();
        let (any, next) =
            self.sendq
                .rack_detect_loss(self.snd_nxt, latest, self.rack.rtt, reo_wnd, now);
        self.timers.reo = next;
        any
    }

    /// The reordering timer fired: what it waited for is lost now, unless
    /// delivered meanwhile.
    pub(super) fn on_rack_timeout(&mut self, now: Instant) {
        if self.rack_detect(now) {
            self.maybe_enter_recovery(false);
        }
    }

    /// Whether a probe timeout may run (RFC 8985 §7.2): data outstanding,
    /// not right after an RTO (only once an ACK acknowledged something
    /// since), nor while F-RTO waits for the ACK that judges the timeout
    /// (a probe would resend data that ACK must find sent only once) and,
    /// outside recovery and with SACK, nothing SACKed (RACK's reordering
    /// timer covers that case).
    fn pto_allowed(&self) -> bool {
        let after_rto = !self.cc.in_recovery && self.snd_una < self.cc.recover;
        matches!(
            self.state,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::Closing
                | State::LastAck
        ) && self.snd_una != self.snd_nxt
            && !(after_rto && self.snd_una == self.cc.rto_una)
            && !self.frto_holds()
            && (self.in_loss_recovery() || !(self.opts.sack && self.sendq.sacked_bytes() > 0))
    }

    /// (Re)starts the probe timeout after data went out (other than a
    /// probe) or an ACK acknowledged new data, or in fast recovery reported
    /// any delivered (RFC 8985 §7.2, and the module's departure): two
    /// smoothed round trips, plus the worst-case delayed ACK when the
    /// receiver may be holding its ACK, and never later than the RTO.
    pub(super) fn arm_pto(&mut self, now: Instant) {
        if !self.pto_allowed() {
            self.timers.pto = None;
            return;
        }
        let pto = match self.rtt.srtt() {
            Some(srtt) => {
                let mut pto = (2 * srtt).max(PTO_MIN);
                if self.flight() < 2 * self.eff_mss {
                    pto += WC_DEL_ACK;
                }
                pto
            }
            None => Duration::from_secs(1),
        };
        let mut at = now + pto;
        if let Some(rto) = self.timers.rto {
            at = at.min(rto);
        }
        self.timers.pto = Some(at);
    }

    /// The probe timeout fired (RFC 8985 §7.3): a probe is due unless one
    /// is in flight already, or nothing came back since the last one. The
    /// RFC asks for an RTT sample since; a cumulative ACK is taken as well,
    /// since without timestamps Karn's rule leaves no sample from an ACK
    /// that covers a repair, as every ACK of a recovery does, and the
    /// probe that stands in for a lost last ACK of one would be refused.
    pub(super) fn on_pto(&mut self, now: Instant) {
        let progressed = self.tlp.probe_una.is_some_and(|u| u != self.snd_una);
        if self.pto_allowed() && self.tlp.end.is_none() && (self.rtt.fresh() || progressed) {
            self.tlp.pending = true;
            self.rearm_rto_after_probe(now);
        }
    }

    /// RFC 8985 §7.3 re-arms the RTO after a probe. A deadline still ahead
    /// is kept, as Linux keeps it (the probe does not postpone the RTO of
    /// what was outstanding before it); one due now, which the probe took
    /// the place of, runs again from now, so that a probe due with the RTO
    /// goes first.
    fn rearm_rto_after_probe(&mut self, now: Instant) {
        if !self.timers.rto.is_some_and(|t| t > now) {
            self.timers.rto = Some(now + self.rtt.rto());
        }
    }

    /// Bookkeeping of a probe just sent: `probe` is the range it resent,
    /// `None` if it was new data. A probe in recovery (fast, or after an
    /// RTO) opens no §7.4 episode.
    pub(super) fn note_probe(&mut self, now: Instant, probe: Option<(SeqNumber, SeqNumber)>) {
        self.stats.tail_loss_probes += 1;
        self.tlp.pending = false;
        if !self.in_loss_recovery() {
            self.tlp.end = Some(self.snd_nxt);
            self.tlp.is_retrans = probe.is_some();
            self.tlp.probe = probe;
            self.tlp.sent_at = now;
            self.tlp.hole_below = false;
        }
        self.tlp.probe_una = Some(self.snd_una);
        self.rtt.clear_fresh();
        self.timers.pto = None;
        self.rearm_rto_after_probe(now);
    }

    /// Forgets the probe episode: recovery (fast or after an RTO) started.
    pub(super) fn reset_tlp(&mut self) {
        self.tlp = Tlp {
            probe_una: self.tlp.probe_una,
            ..Tlp::default()
        };
        self.timers.pto = None;
    }

    /// RFC 8985 §7.4.2: what an ACK says about the probe in flight. `dup`
    /// is whether it is a duplicate ACK in the RFC 5681 sense (no data, no
    /// window change, no advance), `dsack` its D-SACK block, `sack_above`
    /// whether a SACK block reaches above `TLP.end_seq`. Without SACK, an
    /// answer short of the probe is noted in `hole_below`.
    pub(super) fn tlp_on_ack(
        &mut self,
        now: Instant,
        ack: SeqNumber,
        dup: bool,
        dsack: Option<(SeqNumber, SeqNumber)>,
        sack_above: bool,
    ) {
        let Some(end) = self.tlp.end else {
            return;
        };
        if !self.opts.sack && ack < end {
            let min_rtt = self.rtt.min_rtt().unwrap_or(Duration::ZERO);
            if now - self.tlp.sent_at >= min_rtt {
                self.tlp.hole_below = true;
            }
        }
        if !self.tlp.is_retrans {
            if ack >= end {
                self.tlp.end = None;
            }
            return;
        }
        // Step 1: both the original and the probe arrived.
        let dup_of_probe = dup && ack == end && ack == self.snd_una && !sack_above;
        let dsack_of_probe = ack >= end
            && matches!((dsack, self.tlp.probe), (Some((l, r)), Some((pl, pr))) if l < pr && pl < r);
        if dup_of_probe || dsack_of_probe {
            self.tlp.end = None;
            return;
        }
        // Step 2: past the probe with no sign it was a duplicate: it
        // repaired a loss, which calls for the congestion response of a
        // recovery (entered and left at once).
        if ack > end {
            self.tlp.end = None;
            let mss = self.eff_mss;
            self.cc.ssthresh = (self.cc.cwnd / 2).max(2 * mss);
            self.cc.cwnd = self.cc.ssthresh;
            self.cc.abc_acked = 0;
        }
    }
}
