//! Congestion control and loss recovery: slow start and congestion
//! avoidance with appropriate byte counting (RFC 5681 §3.1, RFC 3465;
//! slow start without a per-ACK limit, see `Congestion::grow`), fast
//! retransmit on three duplicate ACKs (with limited transmit,
//! RFC 3042, on the first two), NewReno recovery when
//! SACK is off (RFC 6582 §3.2), and SACK-based recovery when it is on
//! (RFC 6675 §5: the scoreboard lives in `sendq`, `IsLost` with DupThresh
//! = 3, pipe, RecoveryPoint), with RACK's time-based detection (RFC 8985,
//! in `rack`) alongside `IsLost`; RACK also finds lost repairs. After an
//! RTO the loss window is one segment (RFC 5681 §3.1) and every unSACKed
//! record is marked for retransmission, in order as the window allows (the
//! go-back-N), unless the timeout turns out to have been spurious: the
//! round trip outgrew the RTO (a receiver that stalls with a deep queue in
//! front of it, a link that pauses and then delivers everything late)
//! while nothing was lost. A spurious timeout is undone as Linux does it
//! (RFC 4015 in spirit): window and threshold restored, and the marks not
//! yet acted on taken back, so the flight still on its way is not sent
//! twice.
//!
//! Detecting it. With timestamps, Eifel detection (RFC 3522): the first
//! ACK to advance after the timeout echoes a timestamp older than the
//! timeout. Without them (the hardware iWARP profile), F-RTO (RFC 5682),
//! which holds the go-back-N back for a round trip: the timeout resends
//! only the oldest record; if the first ACK to advance acknowledges it but
//! not everything that was outstanding, up to two new records go out
//! instead of retransmissions, and the ACK after that decides. One that
//! acknowledges more data sent before the timeout (never resent, since
//! the one retransmission was already acknowledged) shows the flight was
//! arriving: spurious. A duplicate ACK shows the new records arrived while
//! older data is still missing: the loss was real, and the go-back-N
//! resumes with a window of three segments. With SACK the section 3
//! variant runs, reading SACK blocks too: duplicate ACKs before the first
//! advance only update the scoreboard, and at the decision a SACK of the
//! new records means loss while one of older data means spurious. (Basic
//! F-RTO with SACK would give up at the first duplicate ACK, and throw away
//! what the blocks say about which data arrived. Unlike section 3 step 1,
//! the timeout keeps SACK marks unless the receiver reneged, as it does
//! without F-RTO.) An ACK that comes before the new records went out (a
//! driver handing over a burst before it polls) is judged all the same:
//! what it acknowledges was still sent before the timeout and only once.
//! F-RTO starts only on a timeout outside any loss recovery (not in fast
//! recovery, not on a later expiry for the same data) and before the FIN
//! went out; the tail loss probe rests while it runs, since a probe would
//! resend data the deciding ACK must find sent once. The new records need an
//! application that supplies them: the engine offers room for two beyond
//! the congestion window once the first ACK came, and when an output poll
//! finds none queued, a wake-up at once gives the application its turn;
//! if there is still nothing new to send (or the peer's window is full),
//! the go-back-N proceeds (RFC 5682 step 2 b).
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
    /// that advances `snd.una` (with timestamps) or F-RTO (without them)
    /// shows whether it was spurious.
    pub(super) undo: Option<RtoUndo>,
    /// Where F-RTO stands (connections without timestamps).
    pub(super) frto: Frto,
}

/// F-RTO (RFC 5682) after a retransmission timeout, on a connection
/// without timestamps: the steps that remain before the timeout is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Frto {
    /// Not running: no timeout, a timeout judged, or one that F-RTO does
    /// not judge (conventional recovery).
    Off,
    /// Step 2: the timeout resent the oldest record, which ends at
    /// `head_end`; the rest of the go-back-N waits for the first ACK that
    /// advances `snd.una`.
    Await { head_end: SeqNumber },
    /// Step 3: that ACK acknowledged the resent record and not everything
    /// sent before the timeout; `new_left` more new segments may go out in
    /// place of retransmissions (step 2 b), and the next ACK tells, against
    /// `point` (RFC 5682 `recover`, `RecoveryPoint`: `snd.nxt` at step 2),
    /// whether the timeout was spurious.
    Decide { point: SeqNumber, new_left: u8 },
}

/// New segments F-RTO step 2 b sends in place of retransmissions.
const FRTO_NEW_SEGMENTS: u8 = 2;

/// The congestion state as it was before a retransmission timeout, and
/// the timestamp clock when it fired (RFC 3522 Eifel detection, or RFC 5682
/// F-RTO, and the RFC 4015 response).
#[derive(Debug, Clone, Copy)]
pub(super) struct RtoUndo {
    cwnd: usize,
    ssthresh: usize,
    in_recovery: bool,
    recover: SeqNumber,
    /// Our timestamp clock at the timeout: every retransmission it caused
    /// carries this TSval or a later one (Eifel detection only).
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
            frto: Frto::Off,
        }
    }

    /// Growth on an ACK of `acked` new bytes outside recovery. In slow
    /// start, by the bytes acknowledged up to `ssthresh`, the rest counted
    /// towards congestion avoidance's one segment per window (byte
    /// counting, RFC 3465). Slow start takes no per-ACK limit (RFC 3465's
    /// L = 2 SMSS, RFC 5681's SMSS), as Linux's `tcp_slow_start` takes
    /// none: receivers that coalesce (ours, one ACK per receive burst of a
    /// connection; LRO and GRO hosts) send an ACK per many segments, and
    /// a limit per ACK turned slow start's doubling per round trip into a
    /// few segments more per round trip. With ten thousand connections,
    /// each sending once per round of turns, the windows stayed near 20
    /// segments for the whole of a two-second run and every turn ended
    /// there instead of at `turn_bytes`.
    fn grow(&mut self, mut acked: usize) {
        if self.cwnd < self.ssthresh {
            let step = acked.min(self.ssthresh - self.cwnd);
            self.cwnd += step;
            acked -= step;
        }
        // Whatever slow start left over reached ssthresh.
        if acked > 0 {
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
            // RACK's state moves only with what an ACK delivers (RFC 8985
            // §6.2 steps 1-4); on an ACK that delivers nothing, step 5
            // would find what the last one found, and what falls due
            // since is the reordering timer's. A data receiver whose own
            // sends are small (an RDMA Read requester, its Read Requests
            // outstanding) gets such an ACK with every data segment: the
            // walk of its send queue was 3 % of its time in read-bw.
            if acked > 0 || delivered > 0 || new_sack {
                self.rack_detect(now);
            }
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
    /// The state before the first timeout of a run is kept so that a
    /// spurious one can be undone: with timestamps for Eifel detection
    /// (`rto_undo_check`), without them for F-RTO (`frto_on_ack`), which
    /// starts here (RFC 5682 §2.1 and §3.1 step 1) unless a loss recovery
    /// is under way already: a fast recovery, or the go-back-N of an
    /// earlier timeout (a later expiry for the same data included), whose
    /// retransmissions could be what the ACKs F-RTO reads acknowledge. Nor
    /// does it start once the FIN went out, since no new data can follow.
    pub(super) fn on_rto_loss(&mut self, now: Instant) {
        let mss = self.eff_mss;
        let snapshot = RtoUndo {
            cwnd: self.cc.cwnd,
            ssthresh: self.cc.ssthresh,
            in_recovery: self.cc.in_recovery,
            recover: self.cc.recover,
            ts: self.ts_now(now),
        };
        if self.opts.timestamps {
            if self.cc.undo.is_none() {
                self.cc.undo = Some(snapshot);
            }
        } else {
            let head_end = self
                .sendq
                .front()
                .filter(|r| r.seq < self.snd_nxt)
                .map(|r| r.end().min(self.snd_nxt));
            let fresh = !self.in_loss_recovery() && !self.fin_sent;
            match head_end.filter(|_| fresh) {
                Some(head_end) => {
                    self.cc.undo = Some(snapshot);
                    self.cc.frto = Frto::Await { head_end };
                }
                None => self.frto_stop(),
            }
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
    /// (and RFC 4015's in spirit): see `undo_rto`.
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
        self.undo_rto(u);
    }

    /// The response to a spurious timeout: the window and threshold come
    /// back, the fast recovery the timeout cut short resumes, and the
    /// marks that would resend the whole flight go back to what SACK and
    /// RACK say is lost, instead of a go-back-N of data still on its way
    /// (under a queue of hundreds of milliseconds, most of a window resent
    /// twice).
    fn undo_rto(&mut self, u: RtoUndo) {
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

    /// F-RTO steps 2 and 3 (RFC 5682 §2.1 without SACK, §3.1 with it), on
    /// an ACK after the scoreboard took it and before the congestion
    /// response: `acked` bytes newly acknowledged, `dup` whether it is a
    /// duplicate ACK, `sack_high` the highest right edge of its SACK
    /// blocks, `new_sack` whether it SACKed a record not SACKed before.
    ///
    /// Step 2 waits for the first ACK that advances `snd.una`. If it
    /// leaves the record the timeout resent partly unacknowledged, or
    /// acknowledges everything sent before the timeout, F-RTO learns
    /// nothing and the go-back-N proceeds (step 2 a). Otherwise up to two
    /// new segments go out instead of retransmissions (step 2 b; see
    /// `frto_room`, and `frto_starved` when there is nothing new to send).
    /// A duplicate ACK at step 2 ends F-RTO without SACK (step 2 a); with
    /// SACK its blocks only update the scoreboard.
    ///
    /// Step 3 reads the next ACK. Without SACK, one that advances `snd.una`
    /// acknowledges data sent before the timeout and never resent (the
    /// one retransmission was acknowledged at step 2): the timeout was
    /// spurious (3 b). A duplicate ACK says the new segments arrived while
    /// older data is still missing: the loss was real (3 a). With SACK, an
    /// ACK whose cumulative point or SACK blocks reach beyond the recovery
    /// point (the new segments) means loss (3 a), as does a duplicate ACK
    /// that reports nothing new; one that acknowledges or SACKs data below
    /// it not reported before means a spurious timeout (3 b). After a loss
    /// the window is three segments (room for the two new ones and a
    /// retransmission, RFC 5682) and the go-back-N resumes.
    pub(super) fn frto_on_ack(
        &mut self,
        acked: usize,
        dup: bool,
        sack_high: Option<SeqNumber>,
        new_sack: bool,
    ) {
        match self.cc.frto {
            Frto::Off => {}
            Frto::Await { head_end } => {
                if acked > 0 {
                    if self.snd_una >= self.cc.recover || self.snd_una < head_end {
                        self.frto_stop();
                    } else {
                        self.cc.frto = Frto::Decide {
                            point: self.snd_nxt,
                            new_left: FRTO_NEW_SEGMENTS,
                        };
                        // Acknowledged before it went out: nothing else is
                        // to be resent in its place.
                        self.cc.force_rtx = false;
                    }
                } else if dup && !self.opts.sack {
                    self.frto_stop();
                }
            }
            Frto::Decide { point, .. } => {
                let spurious = if self.opts.sack {
                    if acked == 0 && !dup && !new_sack {
                        return;
                    }
                    let beyond = self.snd_una > point || sack_high.is_some_and(|h| h > point);
                    !beyond && (acked > 0 || new_sack)
                } else if acked > 0 {
                    true
                } else if dup {
                    false
                } else {
                    return;
                };
                if spurious {
                    self.cc.frto = Frto::Off;
                    if let Some(u) = self.cc.undo.take() {
                        self.undo_rto(u);
                    }
                } else {
                    self.frto_stop();
                    self.cc.cwnd = 3 * self.eff_mss;
                }
            }
        }
    }

    /// Ends F-RTO without declaring the timeout spurious: the go-back-N
    /// that `mark_all_lost` set up proceeds (conventional RTO recovery).
    fn frto_stop(&mut self) {
        self.cc.frto = Frto::Off;
        self.cc.undo = None;
        self.timers.frto = None;
    }

    /// Whether F-RTO holds back the go-back-N now: every step but the
    /// timeout's own retransmission (`force_rtx`) and step 2 b's new
    /// segments.
    pub(super) fn frto_holds(&self) -> bool {
        self.cc.frto != Frto::Off
    }

    /// Whether step 2 b may still send a new segment, whatever the
    /// congestion window (RFC 5682: two new segments in place of the two
    /// retransmissions slow start would have sent).
    pub(super) fn frto_new_allowed(&self) -> bool {
        matches!(self.cc.frto, Frto::Decide { new_left, .. } if new_left > 0)
    }

    /// A new segment went out.
    pub(super) fn frto_sent_new(&mut self) {
        if let Frto::Decide { new_left, .. } = &mut self.cc.frto {
            *new_left = new_left.saturating_sub(1);
        }
    }

    /// Room step 2 b gives the application beyond the congestion window:
    /// since `send_capacity` counts every queued byte against the window,
    /// an application that kept the window full has nothing queued unsent
    /// when the timeout fires, and would otherwise never be offered the
    /// new segments F-RTO wants to send.
    pub(super) fn frto_room(&self) -> usize {
        match self.cc.frto {
            Frto::Decide { new_left, .. } if new_left > 0 => {
                let want = usize::from(new_left) * self.eff_mss;
                want.saturating_sub(self.sendq.unsent_bytes(self.snd_nxt))
            }
            _ => 0,
        }
    }

    /// Step 2 b found nothing new to send at an output poll. The driver
    /// may have polled before the application saw the room `frto_room`
    /// offers, so the decision waits for a wake-up at once (the `frto`
    /// timer): by then the application has had its turn, and if there is
    /// still nothing new to send, or the peer's window has no room for it,
    /// F-RTO gives way to the go-back-N (RFC 5682 step 2 b: with nothing
    /// new to send, conventional recovery).
    pub(super) fn frto_starved(&mut self, now: Instant) {
        if matches!(self.cc.frto, Frto::Decide { new_left, .. } if new_left == FRTO_NEW_SEGMENTS)
            && self.timers.frto.is_none()
        {
            self.timers.frto = Some(now);
        }
    }

    /// The `frto` timer fired: see `frto_starved`.
    pub(super) fn on_frto_timeout(&mut self) {
        let starved = matches!(
            self.cc.frto,
            Frto::Decide { new_left, .. } if new_left == FRTO_NEW_SEGMENTS
        );
        if starved && !self.new_segment_ready() {
            self.frto_stop();
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
