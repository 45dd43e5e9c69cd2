//! One TCP connection (a TCB, RFC 9293 §3.3.1): the public face of the state
//! machine whose transitions live in the sibling sub-machine modules.
//!
//! - `handshake`: constructors, option negotiation, SYN-SENT and
//!   SYN-RECEIVED (RFC 9293 §3.5, RFC 7323 §2.2, §3.2, RFC 2018 §2).
//! - `established`: the synchronized-state receive path: acceptability,
//!   PAWS, ACK processing, window updates, segment text, receive window.
//! - `close`: FIN, RST, CLOSING, LAST-ACK, TIME-WAIT, `close` and `abort`.
//! - `timers`: RTO, delayed ACK, persist, keepalive, TIME-WAIT.
//! - `recovery`: congestion control, fast retransmit, NewReno and SACK
//!   loss recovery, spurious timeouts (Eifel detection, F-RTO); `rack`:
//!   RACK-TLP loss detection and tail loss probes.
//! - `output`: what `poll_transmit` sends next and the headers it builds.
//! - `sendq` and `rtt`: the record queue with its scoreboard, and the RTT
//!   estimator.
//!
//! # Records and the MSS
//!
//! A record handed to [`Connection::send_record`] is sent as exactly one
//! segment and retransmitted with the same boundaries. Zero-window probes
//! carry no data (they use `seq = snd.una − 1`, as Linux does), so they
//! never cut a record. The one exception is a shrinking MSS
//! ([`Connection::set_path_mtu_mss`]): a record queued or sent before the
//! decrease that no longer fits is (re)sent in pieces of the new MSS, each
//! piece a segment, and `records_split` counts it. The receiver sees an
//! FPDU spanning segments, which RFC 5044 §8.1 requires MPA receivers to
//! reassemble; new records are sized to the new MSS, so the split is
//! confined to records in flight at the time of the decrease.
//!
//! # Terminal events
//!
//! Exactly one of [`Event::Closed`], [`Event::Reset`] and
//! [`Event::TimedOut`] is reported, once, when the connection reaches
//! CLOSED. A connection in TIME-WAIT has not reported it yet: it still
//! answers retransmitted FINs until the 2·MSL timer expires.

use core::net::SocketAddrV4;
use std::collections::VecDeque;

use super::assembler::Assembler;
use super::config::Config;
use super::output::{AckSnapshot, TS_OPTION_LEN};
use super::rack::{Rack, Tlp};
use super::recovery::Congestion;
use super::rtt::RttEstimator;
use super::sendq::SendQueue;
use super::timers::Timers;
use super::{Event, Payload, Record, Segment, State};
use crate::seq::SeqNumber;
use crate::time::Instant;
use crate::wire::TcpRepr;

/// Counters kept per connection, readable at any time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnStats {
    pub segments_in: u64,
    pub segments_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Segments retransmitted, for any reason.
    pub retransmits: u64,
    /// Retransmission timeouts that fired.
    pub rto_expirations: u64,
    /// Fast retransmits (three duplicate ACKs or SACK loss detection).
    pub fast_retransmits: u64,
    /// Segments dropped: out of window, PAWS, or out-of-order beyond the
    /// configured bounds.
    pub dropped: u64,
    /// Of those, segments dropped by PAWS (RFC 7323 §5.3): their TSval
    /// lagged TS.Recent by more than
    /// [`PAWS_WINDOW`](super::PAWS_WINDOW) ticks.
    pub paws_dropped: u64,
    /// Segments PAWS let through only thanks to its one-tick window: a
    /// TSval behind TS.Recent, by no more than
    /// [`PAWS_WINDOW`](super::PAWS_WINDOW). Strict RFC 7323 would have
    /// dropped them.
    pub paws_tolerated: u64,
    /// Zero-window probes sent.
    pub window_probes: u64,
    /// Segments of new data that carried several whole records
    /// ([`Config::pack_records`]).
    pub packed_segments: u64,
    /// Records those segments carried.
    pub packed_records: u64,
    /// Records resent in more than one segment because the MSS shrank.
    pub records_split: u64,
    /// Owed ACKs merged into a later one because more than
    /// [`MAX_PENDING_ACKS`] piled up between two drains of
    /// `poll_transmit`.
    pub acks_coalesced: u64,
    /// Probes sent because no ACK came for about two round trips while
    /// data was outstanding: RFC 8985 §7 tail loss probes (a new record,
    /// or the last one again), and the same timeout in recovery, where the
    /// probe is a repair or the oldest record.
    pub tail_loss_probes: u64,
    /// Retransmission timeouts found spurious afterwards and undone: with
    /// timestamps, the first ACK to advance after the timeout echoed a
    /// timestamp older than the timeout (RFC 3522); without them, an ACK
    /// acknowledged data sent before the timeout and never resent while
    /// new data went out in place of retransmissions (F-RTO, RFC 5682).
    /// Either way the data had arrived, only late.
    pub spurious_rtos: u64,
    /// Segments taken by the receive path's prediction (in-order data
    /// with nothing else to process; `established.rs`).
    pub predicted: u64,
}

/// Pure ACKs a connection owes at most between two drains of
/// `poll_transmit`. Every out-of-order segment, every segment that fills
/// (part of) a hole and every duplicate is acknowledged by its own ACK
/// (RFC 5681 §4.2), so a driver handing a receive burst to the engine
/// before polling still produces one duplicate ACK per segment for the
/// sender to count. The bound covers a receive burst of this many frames;
/// beyond it the oldest owed ACKs give way to newer ones, which carry a
/// later state.
pub const MAX_PENDING_ACKS: usize = 64;

/// Events a connection has room for before it first sees a record
/// acknowledged: state changes. Room for one event per record is added
/// then.
pub(super) const EVENTS_AT_OPEN: usize = 8;

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// Longer than [`Connection::send_capacity`] allows right now.
    TooLarge,
    /// Empty records carry nothing and would confuse acknowledgment.
    Empty,
    /// The connection cannot send (not yet established, or closing).
    InvalidState,
}

/// Options agreed in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Negotiated {
    /// The MSS the peer announced (536 when it announced none).
    pub(super) peer_mss: u16,
    /// Window scaling is in use (both SYNs carried the option).
    pub(super) wscale: bool,
    /// Shift applied to the peer's window field.
    pub(super) snd_shift: u8,
    /// Shift applied to the window we advertise.
    pub(super) rcv_shift: u8,
    pub(super) sack: bool,
    pub(super) timestamps: bool,
}

/// A reset to send, built when the segment provoking it is processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PendingRst {
    pub(super) seq: SeqNumber,
    /// The acknowledgment to carry, if the RST has ACK set.
    pub(super) ack: Option<SeqNumber>,
}

/// A TCP connection. `B` is the receive buffer type (payload stays in it),
/// `R` the record type of the sender.
#[derive(Debug)]
pub struct Connection<B, R> {
    pub(super) config: Config,
    pub(super) local: SocketAddrV4,
    pub(super) remote: SocketAddrV4,
    pub(super) state: State,
    pub(super) stats: ConnStats,
    pub(super) opts: Negotiated,

    // Send sequence space (RFC 9293 §3.3.1).
    pub(super) iss: SeqNumber,
    pub(super) snd_una: SeqNumber,
    /// One past the highest sequence number sent; never moves back (a
    /// retransmission is tracked on the scoreboard instead).
    pub(super) snd_nxt: SeqNumber,
    /// The peer's window in bytes, scaled.
    pub(super) snd_wnd: usize,
    pub(super) max_snd_wnd: usize,
    pub(super) snd_wl1: SeqNumber,
    pub(super) snd_wl2: SeqNumber,
    pub(super) sendq: SendQueue<R>,
    /// Our FIN's sequence number once `close` was called.
    pub(super) fin_seq: Option<SeqNumber>,
    pub(super) fin_sent: bool,
    /// The FIN must be sent again (after an RTO, or as a fast retransmit).
    pub(super) fin_rtx: bool,
    /// Effective send MSS: what a segment's payload may be, options
    /// accounted for.
    pub(super) eff_mss: usize,
    /// MSS of the path (interface or path-MTU limit).
    pub(super) path_mss: u16,

    // Receive sequence space.
    pub(super) irs: SeqNumber,
    pub(super) rcv_nxt: SeqNumber,
    /// Right edge of the window last advertised; never moves left.
    pub(super) rcv_adv: SeqNumber,
    pub(super) rx_queue: VecDeque<Payload<B>>,
    /// Bytes in `rx_queue`.
    pub(super) rx_bytes: usize,
    /// Most payloads `rx_queue` holds (its preallocated capacity).
    pub(super) rx_max_segments: usize,
    pub(super) assembler: Assembler<B>,
    /// Sequence number of a FIN received ahead of `rcv_nxt`.
    pub(super) rx_fin: Option<SeqNumber>,

    // Timestamps (RFC 7323 §3-§5).
    pub(super) ts_offset: u32,
    pub(super) ts_recent: u32,
    pub(super) ts_recent_at: Instant,
    pub(super) last_ack_sent: SeqNumber,

    // ACK generation.
    /// An ACK of the latest state must go out at the next `poll_transmit`.
    pub(super) ack_now: bool,
    /// ACKs owed one per arriving segment (out of order, filling a hole,
    /// or duplicate), oldest first, each as it stood when its segment
    /// arrived; at most [`MAX_PENDING_ACKS`], allocated once.
    pub(super) ack_queue: VecDeque<AckSnapshot>,
    /// Payload bytes received since the last ACK sent.
    pub(super) rcv_unacked: usize,
    /// A segment received since the last ACK sent carried PSH: its
    /// sender had nothing more queued (see [`Connection::recv`]).
    pub(super) rcv_pushed: bool,
    /// Largest payload received: what a "full-sized segment" is.
    pub(super) rcv_mss: usize,

    // One-shot transmissions.
    pub(super) syn_pending: bool,
    pub(super) syn_sent_at: Option<Instant>,
    /// SYNs (or SYN-ACKs) sent so far.
    pub(super) syn_sends: u32,
    pub(super) rst_pending: Option<PendingRst>,
    pub(super) probe_pending: bool,
    pub(super) keepalive_pending: bool,
    /// Start of the current one-second window of challenge ACKs.
    pub(super) challenge_since: Instant,
    /// Challenge ACKs owed in that window.
    pub(super) challenge_count: u32,

    pub(super) cc: Congestion,
    pub(super) rack: Rack,
    pub(super) tlp: Tlp,
    pub(super) rtt: RttEstimator,
    pub(super) timers: Timers,
    pub(super) events: VecDeque<Event<R>>,
    /// The latest `now` seen, for work triggered by calls that take no
    /// time (`recv`).
    pub(super) last_now: Instant,
}

/// Records the send queue can hold before it has to grow: a window of
/// minimum-size segments, within bounds.
fn record_capacity(config: &Config) -> usize {
    (config.recv_buffer / 536).clamp(64, 2048)
}

/// Room for one record on a connection, from [`Connection::send_room`].
#[must_use = "a room is for sending a record into"]
pub struct SendRoom<'c, B, R> {
    conn: &'c mut Connection<B, R>,
    cap: usize,
}

impl<B, R> core::fmt::Debug for SendRoom<'_, B, R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SendRoom").field("cap", &self.cap).finish()
    }
}

impl<B, R> SendRoom<'_, B, R> {
    /// The largest record [`SendRoom::send`] takes: what
    /// [`Connection::send_capacity`] answered.
    pub fn len(&self) -> usize {
        self.cap
    }

    /// Whether no record fits (nothing may be sent now).
    pub fn is_empty(&self) -> bool {
        self.cap == 0
    }
}

impl<B: AsRef<[u8]>, R: Record> SendRoom<'_, B, R> {
    /// Queues `record`, checked against the room already worked out
    /// (the one way records are queued; [`Connection::send_record`] asks
    /// for a room and sends into it): [`SendError::Empty`] for an
    /// empty record, [`SendError::InvalidState`] where nothing may be
    /// sent, [`SendError::TooLarge`] for one longer than the room.
    pub fn send(self, now: Instant, record: R) -> Result<(), (SendError, R)> {
        let len = record.len();
        if len == 0 {
            return Err((SendError::Empty, record));
        }
        if self.cap == 0 && !self.conn.may_send() {
            return Err((SendError::InvalidState, record));
        }
        if len > self.cap {
            return Err((SendError::TooLarge, record));
        }
        // A room is zero unless the state allows sending (see
        // `send_capacity`), so a record that fits one may be queued.
        self.conn.sendq.push(record, len, now);
        Ok(())
    }
}

impl<B: AsRef<[u8]>, R: Record> Connection<B, R> {
    /// A TCB in `state` with nothing negotiated yet. The handshake
    /// constructors fill in the rest.
    pub(super) fn new_tcb(
        now: Instant,
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: SeqNumber,
        state: State,
    ) -> Connection<B, R> {
        let records = record_capacity(&config);
        let rx_max_segments = (config.recv_buffer / 256).clamp(64, 4096);
        let rtt = RttEstimator::new(config.rto_initial, config.rto_min, config.rto_max);
        let assembler = Assembler::new(config.recv_buffer, config.max_ooo_segments);
        let mss = usize::from(config.mss).max(64);
        let cc = Congestion::new(mss, config.initial_window_segments, iss);
        Connection {
            local,
            remote,
            state,
            stats: ConnStats::default(),
            opts: Negotiated {
                peer_mss: 536,
                wscale: false,
                snd_shift: 0,
                rcv_shift: 0,
                sack: false,
                timestamps: false,
            },
            iss,
            snd_una: iss,
            snd_nxt: iss + 1,
            snd_wnd: 0,
            max_snd_wnd: 0,
            snd_wl1: SeqNumber(0),
            snd_wl2: iss,
            sendq: SendQueue::new(iss + 1, records),
            fin_seq: None,
            fin_sent: false,
            fin_rtx: false,
            eff_mss: mss,
            path_mss: config.mss,
            irs: SeqNumber(0),
            rcv_nxt: SeqNumber(0),
            rcv_adv: SeqNumber(0),
            rx_queue: VecDeque::new(),
            rx_bytes: 0,
            rx_max_segments,
            assembler,
            rx_fin: None,
            ts_offset: iss.0.rotate_left(13),
            ts_recent: 0,
            ts_recent_at: now,
            last_ack_sent: SeqNumber(0),
            ack_now: false,
            ack_queue: VecDeque::new(),
            rcv_unacked: 0,
            rcv_pushed: false,
            rcv_mss: 536.min(mss),
            syn_pending: false,
            syn_sent_at: None,
            syn_sends: 0,
            rst_pending: None,
            probe_pending: false,
            keepalive_pending: false,
            challenge_since: now,
            challenge_count: 0,
            cc,
            rack: Rack::default(),
            tlp: Tlp::default(),
            rtt,
            timers: Timers::default(),
            events: VecDeque::with_capacity(EVENTS_AT_OPEN),
            last_now: now,
            config,
        }
    }

    /// Starts an active open: the connection is in SYN-SENT and its SYN is
    /// ready in `poll_transmit`.
    pub fn connect(
        now: Instant,
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: SeqNumber,
    ) -> Connection<B, R> {
        Self::open_active(now, config, local, remote, iss)
    }

    /// Starts a passive open from a received SYN: the connection is in
    /// SYN-RECEIVED and its SYN-ACK is ready in `poll_transmit`.
    pub fn accept(
        now: Instant,
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        syn: &TcpRepr,
        iss: SeqNumber,
    ) -> Connection<B, R> {
        Self::open_passive(now, config, local, remote, syn, iss)
    }

    /// Creates an ESTABLISHED connection from the final ACK of a handshake
    /// whose SYN was answered statelessly with a SYN cookie. `iss` is our
    /// ISN (the cookie), `irs` the peer's, and the options are those the
    /// cookie encoded: the MSS only, so window scaling, SACK and timestamps
    /// are off (the cookie SYN-ACK must not have offered them). The ACK's
    /// payload or FIN, if any, is not consumed here: pass the same segment
    /// to [`Connection::handle_segment`] next.
    #[allow(clippy::too_many_arguments)] // mirrors the fields a cookie carries
    pub fn from_cookie(
        now: Instant,
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        ack: &TcpRepr,
        iss: SeqNumber,
        irs: SeqNumber,
        peer_mss: u16,
    ) -> Connection<B, R> {
        Self::open_from_cookie(now, config, local, remote, ack, iss, irs, peer_mss)
    }

    /// Current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Local address and port.
    pub fn local(&self) -> SocketAddrV4 {
        self.local
    }

    /// Remote address and port.
    pub fn remote(&self) -> SocketAddrV4 {
        self.remote
    }

    /// Counters.
    pub fn stats(&self) -> &ConnStats {
        &self.stats
    }

    /// The congestion window in bytes (for tests and monitoring).
    pub fn cwnd(&self) -> usize {
        self.cc.cwnd
    }

    /// The slow-start threshold in bytes.
    pub fn ssthresh(&self) -> usize {
        self.cc.ssthresh
    }

    /// The current retransmission timeout, backoff included.
    pub fn rto(&self) -> core::time::Duration {
        self.rtt.rto()
    }

    /// The smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<core::time::Duration> {
        self.rtt.srtt()
    }

    /// The peer's receive window, in bytes (scaled).
    pub fn peer_window(&self) -> usize {
        self.snd_wnd
    }

    /// Whether SACK was negotiated.
    pub fn sack_enabled(&self) -> bool {
        self.opts.sack
    }

    /// Whether timestamps were negotiated.
    pub fn timestamps_enabled(&self) -> bool {
        self.opts.timestamps
    }

    /// The window scale shifts in use: (applied to the peer's window,
    /// applied to ours). Both zero when scaling was not negotiated.
    pub fn window_shifts(&self) -> (u8, u8) {
        (self.opts.snd_shift, self.opts.rcv_shift)
    }

    /// Sequence number of the oldest unacknowledged byte.
    pub fn snd_una(&self) -> SeqNumber {
        self.snd_una
    }

    /// Next sequence number expected from the peer.
    pub fn rcv_nxt(&self) -> SeqNumber {
        self.rcv_nxt
    }

    /// Records queued and not yet entirely acknowledged.
    pub fn records_queued(&self) -> usize {
        self.sendq.len()
    }

    /// Records queued of which no byte has been sent yet.
    pub fn unsent_records(&self) -> usize {
        self.sendq.len() - self.sendq.next_new()
    }

    /// Payload bytes queued and not yet sent.
    pub fn unsent_bytes(&self) -> usize {
        self.sendq.unsent_bytes(self.snd_nxt)
    }

    /// Payload bytes received in order and not yet read with `recv`.
    pub fn recv_queued(&self) -> usize {
        self.rx_bytes
    }

    /// Processes one received segment addressed to this connection.
    /// `payload` is the segment's payload by reference (`None` when empty).
    pub fn handle_segment(&mut self, now: Instant, repr: &TcpRepr, payload: Option<Payload<B>>) {
        self.last_now = now;
        self.stats.segments_in += 1;
        let payload = payload.filter(|p| !p.is_empty());
        self.stats.bytes_in += payload.as_ref().map_or(0, |p| p.len() as u64);
        match self.state {
            State::Closed | State::Listen => {
                self.on_segment_closed(repr, payload.as_ref().map_or(0, Payload::len))
            }
            State::SynSent => self.on_segment_syn_sent(now, repr, payload),
            _ => self.on_segment_synchronized(now, repr, payload),
        }
        self.update_persist(now);
    }

    /// The next segment to send, if any: SYN, SYN-ACK, a new or
    /// retransmitted record, a pure ACK, a window probe, FIN or RST.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Segment<'_, R>> {
        let plan = self.plan_segment(now)?;
        Some(self.planned_segment(plan))
    }

    /// When `handle_timeout` must next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Runs the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_now = now;
        self.on_timeout(now);
        self.update_persist(now);
    }

    /// The next event for the upper layer.
    pub fn poll_event(&mut self) -> Option<Event<R>> {
        self.events.pop_front()
    }

    /// The next record the connection gave up unacknowledged, oldest
    /// first, each exactly once. Records are given up when the send queue
    /// is abandoned: on a reset (the peer's or [`Connection::abort`]), a
    /// timeout, or an end of the connection with data still unacknowledged
    /// (see [`Event`]). The upper layer drains this after the events, and
    /// before the connection is removed: records still here then are
    /// dropped with it.
    pub fn poll_dropped(&mut self) -> Option<R> {
        self.sendq.pop_dropped()
    }

    /// The largest record [`Connection::send_record`] accepts now: the
    /// effective MSS, limited by the peer's window and the congestion
    /// window. Zero when nothing may be sent.
    ///
    /// Sender silly-window avoidance (RFC 9293 §3.8.6.2.1) is applied here,
    /// since the upper layer sizes its records to the answer: while data is
    /// outstanding, less than a full segment is offered only when it is at
    /// least half the largest window the peer ever offered.
    pub fn send_capacity(&self) -> usize {
        if !self.may_send() {
            return 0;
        }
        let mss = self.record_mss();
        let end = self.sendq.end();
        let wnd_room = (self.snd_una + self.snd_wnd) - end;
        let used = (end - self.snd_una + self.sendq.spec_bytes())
            .saturating_sub(self.sendq.sacked_bytes());
        let cwnd_room = self
            .send_window()
            .saturating_sub(used)
            .max(self.frto_room());
        let cap = mss.min(wnd_room).min(cwnd_room);
        if cap < mss && end != self.snd_una {
            if cwnd_room < mss {
                return 0;
            }
            if cap < self.max_snd_wnd / 2 {
                return 0;
            }
        }
        cap
    }

    /// Whether the state lets new records be queued: ESTABLISHED or
    /// CLOSE-WAIT, before our FIN.
    fn may_send(&self) -> bool {
        matches!(self.state, State::Established | State::CloseWait) && self.fin_seq.is_none()
    }

    /// The largest record a segment can ever carry on this connection,
    /// whatever the windows: the effective MSS, less
    /// [`Config::train_shortfall`] while trains are on.
    pub fn max_record_len(&self) -> usize {
        self.record_mss()
    }

    /// [`Connection::max_record_len`].
    pub(super) fn record_mss(&self) -> usize {
        if self.config.train_bytes > 0 {
            self.eff_mss
                .saturating_sub(self.config.train_shortfall)
                .max(64)
        } else {
            self.eff_mss
        }
    }

    /// Queues one record, sent as exactly one segment. Its length must be
    /// at most [`Connection::send_capacity`]: a room is asked for and the
    /// record sent into it, with [`SendRoom::send`]'s checks and errors.
    pub fn send_record(&mut self, now: Instant, record: R) -> Result<(), (SendError, R)> {
        self.send_room().send(now, record)
    }

    /// [`Connection::send_capacity`], held for one record: the room is
    /// worked out once, and [`SendRoom::send`] queues a record within it
    /// without working it out again.
    /// The room borrows the connection, so nothing can change it in
    /// between. For an upper layer that builds each record to the room it
    /// is offered: asked with `send_capacity` and then checked again by
    /// `send_record`, the room was worked out twice a record (some 150
    /// instructions each time, on every data frame).
    pub fn send_room(&mut self) -> SendRoom<'_, B, R> {
        let cap = self.send_capacity();
        SendRoom { conn: self, cap }
    }

    /// Lowers the effective MSS (a path MTU decrease, RFC 1191). New
    /// records are sized to it. A record already sent that no longer fits
    /// is, when retransmitted, resent in segments of the new MSS; the
    /// receiver reassembles it (RFC 5044 §8.1 requires MPA receivers to
    /// handle FPDUs that span segments) and `records_split` counts it.
    /// A value above what the peer and the interface allow is capped.
    pub fn set_path_mtu_mss(&mut self, mss: u16) {
        self.path_mss = mss;
        self.update_eff_mss();
    }

    /// The next in-order payload received, if any. Reading frees receive
    /// buffer space, which opens the advertised window.
    pub fn recv(&mut self) -> Option<Payload<B>> {
        let p = self.rx_queue.pop_front()?;
        self.rx_bytes -= p.len();
        if !self.assembler.is_empty() {
            self.pull_assembler();
        }
        if self.window_update_due() {
            self.ack_now = true;
        }
        // The upper layer has taken every byte, the last of them pushed
        // (their sender had nothing more queued), while an ACK was being
        // delayed: acknowledge now rather than at the timer. A sender
        // waiting for its acknowledgements (an RDMA sender's completions
        // are its ACKs) would otherwise sit out the delay whenever its
        // last segment was an odd one. Linux acknowledges at the same
        // point, when a read empties the receive queue after pushed data.
        if self.rx_queue.is_empty() && self.rcv_pushed && self.timers.delack.is_some() {
            self.ack_now = true;
        }
        Some(p)
    }

    /// Closes the sending direction: FIN after every queued record.
    pub fn close(&mut self, now: Instant) {
        self.start_close(now);
    }

    /// Resets the connection: RST to the peer, CLOSED here.
    pub fn abort(&mut self, now: Instant) {
        self.reset_local(now);
    }

    /// Recomputes the effective send MSS from the peer's MSS, the path
    /// MSS and the options every segment carries (RFC 6691).
    pub(super) fn update_eff_mss(&mut self) {
        let base = self.opts.peer_mss.min(self.config.mss).min(self.path_mss);
        let opts = if self.opts.timestamps {
            TS_OPTION_LEN
        } else {
            0
        };
        self.eff_mss = usize::from(base).saturating_sub(opts).max(64);
        self.cc.mss = self.eff_mss;
        if self.sendq.is_empty() && self.snd_una == self.iss {
            // Still in the handshake: the initial window is counted in
            // segments of the negotiated size (RFC 5681 §3.1).
            let iw = usize::try_from(self.config.initial_window_segments).unwrap_or(10);
            self.cc.cwnd = iw.max(1) * self.eff_mss;
        }
    }

    /// The segment time for timestamps: milliseconds since the epoch plus
    /// a per-connection offset derived from the ISN (RFC 7323 §5.4
    /// recommends not exposing the raw clock).
    pub(super) fn ts_now(&self, now: Instant) -> u32 {
        // Truncating to 32 bits is the timestamp clock's intended wrap.
        (now.total_millis() as u32).wrapping_add(self.ts_offset)
    }

    /// Records the terminal event and drops everything held; queued
    /// records move to the dropped list ([`Connection::poll_dropped`]).
    pub(super) fn terminate(&mut self, event: Event<R>) {
        self.state = State::Closed;
        self.sendq.drop_all();
        self.assembler.clear();
        self.timers.clear();
        self.syn_pending = false;
        self.probe_pending = false;
        self.keepalive_pending = false;
        self.fin_rtx = false;
        self.ack_now = false;
        self.ack_queue.clear();
        self.events.push_back(event);
    }
}
