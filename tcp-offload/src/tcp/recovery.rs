//! Congestion control and loss recovery: slow start and congestion
//! avoidance with appropriate byte counting (RFC 5681 §3.1, RFC 3465,
//! L = 2), fast retransmit on three duplicate ACKs (with limited transmit,
//! RFC 3042, on the first two), NewReno recovery when
//! SACK is off (RFC 6582 §3.2), and SACK-based recovery when it is on
//! (RFC 6675 §5: the scoreboard lives in `sendq`, `IsLost` with DupThresh
//! = 3, pipe, RecoveryPoint), with RACK's time-based detection (RFC 8985,
//! in `rack`) alongside `IsLost`; RACK also finds lost repairs. After an
//! RTO the loss window is one segment (RFC 5681 §3.1) and every unSACKed
//! record is retransmitted in order as the window allows, unless the first
//! ACK to advance afterwards echoes a timestamp older than the timeout:
//! the timeout was then spurious (RFC 3522 Eifel detection: the round trip
//! outgrew the RTO, as behind a receiver that stalls with a deep queue in
//! front of it) and is undone (RFC 4015 in spirit, as Linux does it).
//!
//! The window during and after recovery. With SACK, Proportional Rate
//! Reduction (RFC 6937, with the slow-start reduction bound) sets cwnd on
//! every ACK of the episode: while `pipe` exceeds ssthresh, one byte goes
//! out for every ssthresh/RecoverFS byte the receiver reports delivered,
//! so the flight shrinks smoothly to ssthresh rather than the sender
//! falling silent for half a round trip and then bursting; below it, the
//! sender catches up towards ssthresh, at most one segment ahead of what
//! was delivered. Without SACK, RFC 6582's inflation and deflation stand.
//! Either way the episode ends with cwnd = ssthresh: RFC 6582 step 3 allows
//! it (its second alternative), RFC 6937 ends there, and so does Linux.
//! The first alternative, min(ssthresh, FlightSize + SMSS), collapsed the
//! window to two segments whenever the full ACK left little in flight (a
//! receive-window-limited sender, or repairs acknowledged last), after
//! which one lost ACK cost an RTO.
//!
//! Retransmission is driven by marks: a record judged lost is queued for
//! repair on the scoreboard, and `poll_transmit` sends repairs before new
//! records while `pipe` (RFC 6675 §4) is below `cwnd`. In SACK recovery,
//! when there is neither a repair nor a new record to send, `NextSeg`
//! rules 3 and 4 (RFC 6675 §4) still use the window: a record below the
//! highest SACKed one that is not yet deemed lost is resent, and, once per
//! recovery episode, the highest unSACKed record (the rescue
//! retransmission), so that losses at the tail of a flight draw the ACKs
//! that reveal them instead of waiting for a partial ACK or the RTO. One
//! departure from the letter of rule 4: the rescue is skipped when the
//! highest unSACKed record already went out during this episode (as a
//! repair, a rule-3 copy or new data), or less than RACK's round trip ago,
//! since it is then most likely still in flight: a copy would be a
//! duplicate on the wire in the common case (a lone hole whose repair just
//! left, or a driver that polls for output before its application has
//! queued more, so that rule 2 finds nothing for a moment) rather than a
//! rescue.

use super::connection::Connection;
use super::Record;
use crate::seq::SeqNumber;
use crate::time::Instant;

/// RFC 6675 DupThresh, and the RFC 5681 duplicate-ACK count.
pub(super) const DUP_THRESH: u32 = 3;

/// Appropriate byte counting limit L (RFC 3465 §2.2).
const ABC_LIMIT: usize = 2;

/// Congestion state of one connection.
#[derive(Debug, Clone)]
pub(super) struct Congestion {
    /// Sender MSS, kept equal to the connection's effective MSS.
    pub(super) mss: usize,
    pub(super) cwnd: usize,
    pub(super) ssthresh: usize,
    /// Duplicate ACKs in a row.
    pub(super) dupacks: u32,
    /// In fast recovery (NewReno or SACK).
    pub(super) in_recovery: bool,
    /// RFC 6582 `recover` / RFC 6675 RecoveryPoint, as one past the
    /// highest byte sent when recovery (or the last RTO) began; a new
    /// recovery may start only once `snd.una` reaches it.
    pub(super) recover: SeqNumber,
    /// Bytes acknowledged in congestion avoidance since cwnd last grew.
    pub(super) abc_acked: usize,
    /// One retransmission may be sent whatever the window (the fast
    /// retransmit itself, and NewReno's partial-ACK retransmission).
    pub(super) force_rtx: bool,
    /// The rescue retransmission of this recovery episode went out
    /// (RFC 6675 `RescueRxt`: one per episode).
    pub(super) rescue_sent: bool,
    /// Rank of the first transmission of the current recovery episode
    /// (see `SendQueue::next_xmit`).
    pub(super) recovery_start: u64,
    /// `snd.una` when the last RTO fired.
    pub(super) rto_una: SeqNumber,
    /// PRR (RFC 6937): bytes the receiver reported delivered since the
    /// episode began (`prr_delivered`), bytes sent since (`prr_out`), and
    /// the flight when it began (`RecoverFS`).
    pub(super) prr_delivered: usize,
    pub(super) prr_out: usize,
    pub(super) recover_fs: usize,
    /// What the first of a run of RTOs changed, kept until the first ACK
    /// that advances `snd.una` shows whether it was spurious (timestamps
    /// only).
    pub(super) undo: Option<RtoUndo>,
}

/// The congestion state as it was before a retransmission timeout, and
/// the timestamp clock when it fired (RFC 3522 Eifel detection, RFC 4015
/// response).
#[derive(Debug, Clone, Copy)]
pub(super) struct RtoUndo {
    cwnd: usize,
    ssthresh: usize,
    in_recovery: bool,
    recover: SeqNumber,
    /// Our timestamp clock at the timeout: every retransmission it caused
    /// carries this TSval or a later one.
    ts: u32,
}

impl Congestion {
    pub(super) fn new(mss: usize, iw_segments: u32, iss: SeqNumber) -> Congestion {
        let iw = usize::try_from(iw_segments).unwrap_or(10).max(1);
        Congestion {
            mss,
            cwnd: iw * mss,
            ssthresh: usize::MAX / 2,
            dupacks: 0,
            in_recovery: false,
            recover: iss,
            abc_acked: 0,
            force_rtx: false,
            rescue_sent: false,
            recovery_start: 0,
            rto_una: iss,
            prr_delivered: 0,
            prr_out: 0,
            recover_fs: 0,
            undo: None,
        }
    }

    /// Growth on an ACK of `acked` new bytes outside recovery.
    fn grow(&mut self, acked: usize) {
        if self.cwnd < self.ssthresh {
            self.cwnd += acked.min(ABC_LIMIT * self.mss);
        } else {
            self.abc_acked += acked;
            if self.abc_acked >= self.cwnd {
                self.abc_acked -= self.cwnd;
                self.cwnd += self.mss;
            }
        }
        self.cwnd = self.cwnd.min(usize::MAX / 4);
    }
}

impl<B: AsRef<[u8]>, R: Record> Connection<B, R> {
    /// Bytes outstanding between `snd.una` and `snd.nxt`.
    pub(super) fn flight(&self) -> usize {
        self.snd_nxt - self.snd_una
    }

    /// RFC 6675 pipe: bytes in flight that are neither SACKed nor lost
    /// awaiting repair (a repair in flight counts once), plus the
    /// speculative copies of records not deemed lost, which are in flight
    /// besides their originals.
    pub(super) fn pipe(&self) -> usize {
        (self.flight() + self.sendq.spec_bytes())
            .saturating_sub(self.sendq.sacked_bytes() + self.sendq.pending_bytes())
    }

    /// Congestion response to an acceptable ACK, after the scoreboard and
    /// `snd.una` were updated. `acked` is the number of newly acknowledged
    /// bytes, `delivered` the bytes newly acknowledged or SACKed less those
    /// SACKed before and acknowledged now (RFC 6937 `DeliveredData`), `dup`
    /// whether the ACK is a duplicate (RFC 5681 §2), `new_sack` whether it
    /// SACKed a record not SACKed before.
    pub(super) fn on_ack_cc(
        &mut self,
        now: Instant,
        acked: usize,
        delivered: usize,
        dup: bool,
        new_sack: bool,
    ) {
        let mss = self.eff_mss;
        if acked > 0 {
            self.cc.dupacks = 0;
            if self.cc.in_recovery {
                if self.snd_una >= self.cc.recover {
                    // Full ACK: the episode ends at ssthresh (RFC 6582
                    // step 3, second alternative; RFC 6937).
                    self.cc.cwnd = self.cc.ssthresh;
                    self.cc.in_recovery = false;
                    self.cc.abc_acked = 0;
                    self.rack_recovery_ended();
                } else {
                    // Partial ACK: the next hole is lost too.
                    if self.mark_head_lost() {
                        self.cc.force_rtx = true;
                    }
                    if !self.opts.sack {
                        // Deflate by what was acknowledged, add back one
                        // segment if at least one was (RFC 6582 step 3).
                        self.cc.cwnd = self.cc.cwnd.saturating_sub(acked);
                        if acked >= mss {
                            self.cc.cwnd += mss;
                        }
                        self.cc.cwnd = self.cc.cwnd.max(mss);
                    }
                }
            } else {
                self.cc.grow(acked);
            }
        } else if dup {
            self.cc.dupacks += 1;
            if self.cc.in_recovery && !self.opts.sack {
                // Window inflation: a segment left the network.
                self.cc.cwnd += mss;
            }
        }
        if self.opts.sack {
            if new_sack {
                self.sendq
                    .mark_lost_by_sack(self.snd_nxt, mss, DUP_THRESH as usize);
            }
            self.rack_detect(now);
        }
        self.maybe_enter_recovery(dup);
        if self.cc.in_recovery && self.opts.sack {
            self.prr_update(delivered);
        }
    }

    /// RFC 6937 on an ACK of a SACK recovery episode (the one that began
    /// it included): cwnd becomes `pipe` plus what PRR allows to send now.
    fn prr_update(&mut self, delivered: usize) {
        let mss = self.eff_mss;
        self.cc.prr_delivered += delivered;
        let pipe = self.pipe();
        let cc = &mut self.cc;
        let sndcnt = if pipe > cc.ssthresh {
            // Proportional: send ssthresh/RecoverFS of what was delivered.
            let due = (cc.prr_delivered as u128 * cc.ssthresh as u128)
                .div_ceil(cc.recover_fs.max(1) as u128);
            usize::try_from(due)
                .unwrap_or(usize::MAX)
                .saturating_sub(cc.prr_out)
        } else {
            // Slow-start reduction bound: catch up towards ssthresh, at
            // most one segment beyond what was delivered.
            let limit = cc.prr_delivered.saturating_sub(cc.prr_out).max(delivered) + mss;
            (cc.ssthresh - pipe).min(limit)
        };
        cc.cwnd = pipe + sndcnt;
    }

    /// Starts recovery if loss is evident and none is under way: three
    /// duplicate ACKs (`dup` says this ACK was one), a record deemed lost
    /// by SACK or RACK, or, without SACK, an answer to a tail loss probe
    /// that stops short of it (see `rack`).
    pub(super) fn maybe_enter_recovery(&mut self, dup: bool) {
        if self.cc.in_recovery || self.snd_una < self.cc.recover || self.snd_una == self.snd_nxt {
            return;
        }
        let dupthresh = dup && self.cc.dupacks >= DUP_THRESH;
        let lost = self.opts.sack && self.sendq.pending_bytes() > 0;
        let probe_answered = !self.opts.sack && self.tlp.hole_below;
        if dupthresh || lost || probe_answered {
            self.enter_recovery();
        }
    }

    /// Fast retransmit (RFC 5681 §3.2 steps 2-3, RFC 6582 step 2, RFC 6675
    /// §5 step 4). With SACK, the first repair is of the lowest record
    /// deemed lost; when none is yet (three duplicate ACKs alone), of the
    /// oldest.
    fn enter_recovery(&mut self) {
        let mss = self.eff_mss;
        let flight = self.flight();
        self.cc.ssthresh = (flight / 2).max(2 * mss);
        self.cc.recover = self.snd_nxt;
        self.cc.in_recovery = true;
        self.cc.abc_acked = 0;
        self.cc.rescue_sent = false;
        self.cc.recovery_start = self.sendq.next_xmit();
        self.cc.prr_delivered = 0;
        self.cc.prr_out = 0;
        self.cc.recover_fs = flight;
        self.cc.cwnd = if self.opts.sack {
            self.cc.ssthresh
        } else {
            self.cc.ssthresh + DUP_THRESH as usize * mss
        };
        if !(self.opts.sack && self.sendq.pending_bytes() > 0) {
            self.mark_head_lost();
        }
        self.cc.force_rtx = true;
        self.reset_tlp();
        self.stats.fast_retransmits += 1;
    }

    /// Marks the oldest unacknowledged record (or the FIN, when only it is
    /// outstanding) for retransmission.
    /// Returns whether anything was newly marked.
    fn mark_head_lost(&mut self) -> bool {
        match self.sendq.front() {
            Some(r) if r.seq < self.snd_nxt => self.sendq.mark_lost(0),
            _ => {
                let fin_out = self.fin_sent && self.fin_seq.is_some_and(|f| self.snd_una <= f);
                if fin_out {
                    self.fin_rtx = true;
                }
                fin_out
            }
        }
    }

    /// Congestion response to a retransmission timeout (RFC 5681 §3.1
    /// eq. 4 and the loss window; RFC 6582 §3.2 step 4 for `recover`).
    /// With timestamps, the state before the first timeout of a run is
    /// kept so that a spurious one can be undone (`rto_undo_check`).
    pub(super) fn on_rto_loss(&mut self, now: Instant) {
        let mss = self.eff_mss;
        if self.opts.timestamps && self.cc.undo.is_none() {
            self.cc.undo = Some(RtoUndo {
                cwnd: self.cc.cwnd,
                ssthresh: self.cc.ssthresh,
                in_recovery: self.cc.in_recovery,
                recover: self.cc.recover,
                ts: self.ts_now(now),
            });
        }
        if self.timers.retries <= 1 {
            // The first expiry halves; later ones of the same segment hold
            // ssthresh (RFC 5681 §3.1, after eq. 4).
            self.cc.ssthresh = (self.flight() / 2).max(2 * mss);
        }
        self.cc.cwnd = mss;
        self.cc.in_recovery = false;
        self.cc.dupacks = 0;
        self.cc.abc_acked = 0;
        self.cc.recover = self.snd_nxt;
        self.cc.rto_una = self.snd_una;
        self.cc.force_rtx = true;
        self.reset_tlp();
        self.timers.reo = None;
        if self.sendq.reneged() {
            // RFC 2018 §8: after a timeout, SACK marks are not to be
            // trusted once the receiver has shown it discards SACKed data.
            self.sendq.clear_sacks();
        }
        self.sendq.mark_all_lost(self.snd_nxt);
        if self.fin_sent && self.fin_seq.is_some_and(|f| self.snd_una <= f) {
            self.fin_rtx = true;
        }
    }

    /// RFC 3522 Eifel detection, on an ACK that advanced `snd.una` by
    /// `acked` bytes and echoed `tsecr`, after the scoreboard took it: if
    /// it is the first such ACK since a run of RTOs and it echoes a
    /// timestamp older than the first of them, what it acknowledges had
    /// arrived before any retransmission the timeouts caused, so they
    /// fired because the round trip grew (a receiver that stalled, a queue
    /// that filled), not because data was lost. The response is Linux's
    /// (and RFC 4015's in spirit): the window and threshold come back, the
    /// fast recovery the timeout cut short resumes, and the marks that
    /// would resend the whole flight go back to what SACK and RACK say is
    /// lost, instead of a go-back-N of data still on its way (under a
    /// queue of hundreds of milliseconds, most of a window resent twice).
    pub(super) fn rto_undo_check(&mut self, acked: usize, tsecr: Option<u32>) {
        if acked == 0 {
            return;
        }
        let Some(u) = self.cc.undo.take() else {
            return;
        };
        // TSecr 0 may mean the peer echoes nothing (RFC 7323 §3.2).
        let Some(tsecr) = tsecr.filter(|&t| t != 0) else {
            return;
        };
        if (tsecr.wrapping_sub(u.ts) as i32) >= 0 {
            return;
        }
        self.stats.spurious_rtos += 1;
        self.cc.cwnd = self.cc.cwnd.max(u.cwnd);
        self.cc.ssthresh = self.cc.ssthresh.max(u.ssthresh);
        self.cc.in_recovery = u.in_recovery;
        self.cc.recover = u.recover;
        self.cc.rto_una = self.snd_una;
        self.cc.force_rtx = false;
        self.sendq.undo_rto_marks(self.snd_nxt);
        if self.opts.sack {
            self.sendq
                .mark_lost_by_sack(self.snd_nxt, self.eff_mss, DUP_THRESH as usize);
        }
    }

    /// The congestion window plus the limited-transmit allowance (RFC 3042
    /// §2): on each of the first two duplicate ACKs one more segment may go
    /// out, so that a small window still produces the third duplicate ACK.
    pub(super) fn send_window(&self) -> usize {
        let extra = if !self.cc.in_recovery && self.cc.dupacks < DUP_THRESH {
            self.cc.dupacks as usize * self.eff_mss
        } else {
            0
        };
        self.cc.cwnd + extra
    }

    /// Whether a segment of `len` bytes fits the congestion window now.
    pub(super) fn cwnd_allows(&self, len: usize) -> bool {
        let pipe = self.pipe();
        pipe == 0 || pipe + len <= self.send_window()
    }
}
