//! Queue pairs: the consumer's side of an RDMAP stream — its state, its
//! send and receive queues of work requests, and the bookkeeping the QP
//! engine needs to complete them in the order the verbs promise.
//!
//! **States** are those of the RDMAC verbs that RFC 5040 §6 (stream
//! initialisation and teardown) refers to: [`QpState::Idle`] (no stream yet;
//! work may be posted), [`QpState::Rts`] (ready to send: the stream is up),
//! [`QpState::Closing`] (graceful teardown started), [`QpState::Terminate`]
//! (an error was detected and a Terminate message is being sent, RFC 5040
//! §6.2 abnormal termination) and [`QpState::Error`] (everything outstanding
//! completes with [`WcStatus::WrFlushError`]). [`QueuePair::modify_qp`]
//! takes the transitions in the table there and refuses the others.
//!
//! **Ordering** (RFC 5040 §5.5 and the verbs): each signalled work request
//! yields exactly one completion and unsignalled ones none unless they fail,
//! all in send-queue order. A Send or Write is done when TCP has
//! acknowledged its last byte; a Read when its Response has been placed. A
//! request that is done waits behind earlier ones that are not (a Write
//! acknowledged before an earlier Read's Response arrived completes after
//! that Read). The first unsuccessful completion moves the queue pair to
//! Error, and everything after it is flushed.
//!
//! **Reads.** At most ORD RDMA Reads are outstanding: the send queue stops
//! at a Read beyond ORD (not an error; it waits, and so does everything
//! behind it). Inbound Read Requests queue up to IRD; one more is the
//! peer's protocol error and the QP engine terminates the stream.
//!
//! **How the QP engine drives it.** Send side: [`QueuePair::next_work`]
//! hands out the next request to put on the wire (local memory operations
//! execute inside it); [`QueuePair::transmitted`] records the stream offset
//! just past a Send's or Write's last byte; [`QueuePair::acked`] reports
//! TCP's acknowledged stream offset; [`QueuePair::complete_read`] ends the
//! oldest outstanding Read; [`QueuePair::deliver_completions`] moves what is
//! done into the send CQ (and, in Error, flushes). Receive side:
//! [`QueuePair::begin_recv`] takes a buffer for an incoming Send,
//! [`QueuePair::finish_recv`] completes it, [`QueuePair::flush_rq`] flushes
//! in Error. Inbound Reads: [`QueuePair::push_inbound_read`] and the
//! accessors after it. Stream offsets are 64-bit byte counts of the TCP
//! byte stream since the connection started (never wrapping), so "acked up
//! to X" compares without sequence-number arithmetic.

use std::collections::VecDeque;

use super::cq::{CompletionQueue, CqId, WcOpcode, WcStatus, WorkCompletion};
use super::mr::{Access, MrTable, Stag};
use super::pd::PdId;
use super::srq::{RecvQueue, SharedReceiveQueue, SrqId};
use super::wr::{PostError, RecvWr, SendFlags, SendOp, SendWr, SgeList};
use super::VerbsError;
use crate::error::TerminateCause;
use crate::placement::RegionRef;

/// A queue pair's number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QpNum(pub u32);

/// The position of a work request in its send queue: 0 for the first ever
/// posted, counting up. How the QP engine names a request it is working on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WrSeq(pub u64);

/// Queue-pair states (RDMAC verbs, as RFC 5040 §6 uses them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created or reset; no stream. Work requests may be posted and wait.
    Idle,
    /// Ready to send: the stream is established.
    Rts,
    /// Graceful close in progress; no new send work is accepted.
    Closing,
    /// An error was detected locally; the Terminate message is on its way.
    Terminate,
    /// The stream is dead; outstanding work completes with flush errors.
    Error,
}

/// Creation attributes (`ibv_qp_init_attr`, plus the IRD/ORD capacities).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInitAttr {
    /// Protection domain.
    pub pd: PdId,
    /// CQ for send-queue completions.
    pub send_cq: CqId,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// Shared receive queue, if receives come from one.
    pub srq: Option<SrqId>,
    /// Send-queue depth.
    pub max_send_wr: u32,
    /// Receive-queue depth (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send request.
    pub max_send_sge: u32,
    /// SGEs per receive request.
    pub max_recv_sge: u32,
    /// Largest ORD (outstanding outbound Reads) this QP may negotiate.
    pub max_ord: u32,
    /// Largest IRD (queued inbound Read Requests) this QP may negotiate.
    pub max_ird: u32,
    /// Signal every send request, whatever its flags (`sq_sig_all`).
    pub sq_sig_all: bool,
}

/// A `modify_qp` request (`ibv_qp_attr` subset). Fields left `None` stay.
/// IRD and ORD may change only in Idle (they are negotiated by MPA before
/// the stream starts, RFC 6581) and are applied before the state change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpModify {
    /// New state.
    pub state: Option<QpState>,
    /// New ORD (`max_rd_atomic`).
    pub ord: Option<u32>,
    /// New IRD (`max_dest_rd_atomic`).
    pub ird: Option<u32>,
}

impl QpModify {
    /// Only a state change.
    pub fn state(state: QpState) -> QpModify {
        QpModify {
            state: Some(state),
            ..QpModify::default()
        }
    }
}

/// Asynchronous events of a queue pair (`ibv_async_event`); the first one
/// recorded is kept until taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpEvent {
    /// A work request completed unsuccessfully and moved the queue pair to
    /// Error (`IBV_EVENT_QP_FATAL`, or `QP_ACCESS_ERR` for protection).
    WorkRequestError(WcStatus),
    /// One of its completion queues was full; the queue pair moved to
    /// Error and keeps the completion until there is room.
    CqOverrun,
}

/// A request handed to the QP engine to put on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWork {
    /// Its position in the send queue.
    pub seq: WrSeq,
    /// The consumer's id.
    pub wr_id: u64,
    /// The RDMAP operation.
    pub op: WireOp,
    /// Message length (sum of the SGEs). The SGEs themselves (the Send's
    /// or Write's source, or the Read's sink) stay in the send queue:
    /// [`QueuePair::work_sges`] reads them in place, and the engine pins
    /// each piece with [`MrTable::pin_local`] as it builds FPDUs (the
    /// region may have gone since).
    pub len: u32,
}

/// The RDMAP operation of a [`SendWork`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireOp {
    /// Send, with the Solicited Event and Invalidate variants (RFC 5040 §5.3).
    Send {
        /// Send with Solicited Event.
        solicited: bool,
        /// Send with Invalidate of this peer STag.
        invalidate: Option<Stag>,
    },
    /// RDMA Write (RFC 5040 §5.1).
    RdmaWrite {
        /// Data Sink tagged offset.
        remote_addr: u64,
        /// Data Sink STag.
        rkey: Stag,
    },
    /// RDMA Read Request (RFC 5040 §5.2).
    RdmaRead {
        /// Data Source tagged offset.
        remote_addr: u64,
        /// Data Source STag.
        rkey: Stag,
    },
}

/// How a receive ended, for [`QueuePair::finish_recv`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvDone {
    /// Outcome.
    pub status: WcStatus,
    /// Bytes placed.
    pub byte_len: u32,
    /// The Send carried the Solicited Event flag.
    pub solicited: bool,
    /// The Send with Invalidate invalidated this STag (after
    /// [`MrTable::invalidate_remote`] succeeded).
    pub invalidated_stag: Option<Stag>,
}

/// An inbound RDMA Read Request waiting for (or in the middle of) its
/// Read Response.
#[derive(Debug, PartialEq, Eq)]
pub struct InboundRead {
    /// The peer's Data Sink STag (goes into the Read Response header).
    pub sink_stag: Stag,
    /// The peer's Data Sink tagged offset.
    pub sink_to: u64,
    /// Read Message Size.
    pub len: u32,
    /// The checked, pinned source; `None` for a zero-length Read.
    pub source: Option<RegionRef>,
    /// Bytes of the response the engine has put on the wire so far.
    pub sent: u32,
}

/// Misuse of the engine-side interface, or a condition the engine turns
/// into a Terminate or an error state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpError {
    /// The completion queue was full (see [`QpEvent::CqOverrun`]).
    CqFull,
    /// The completion queue passed is not this queue pair's.
    WrongCq,
    /// No such work request in the send queue.
    UnknownWr,
    /// The work request is not in a phase that allows the call.
    WrongPhase,
    /// A Read Response arrived with no Read outstanding.
    NoOutstandingRead,
    /// No receive is in progress.
    NoReceiveInProgress,
    /// A receive is already in progress.
    ReceiveInProgress,
    /// No receive buffer is posted (DDP: "no buffer available").
    NoReceiveBuffer,
    /// The shared receive queue passed is not this queue pair's (or one was
    /// passed to a queue pair without one).
    WrongSrq,
    /// The queue pair's state does not allow the call.
    InvalidState,
}

impl QpError {
    /// The Terminate cause when the condition is the peer's doing: no
    /// receive buffer for its Send, or a Read Response nobody asked for.
    pub fn terminate_cause(self) -> Option<TerminateCause> {
        match self {
            QpError::NoReceiveBuffer => Some(TerminateCause::DDP_UNTAGGED_NO_BUFFER),
            QpError::NoOutstandingRead => Some(TerminateCause::RDMAP_OP_UNEXPECTED_OPCODE),
            _ => None,
        }
    }
}

/// The Terminate cause for an inbound RDMA Read Request beyond the
/// negotiated IRD: the Read Request queue is DDP untagged queue 1, and a
/// request beyond IRD finds no buffer there (RFC 5041's "Invalid MSN - no
/// buffer available"). siw reports RDMAP's "catastrophic error, localized
/// to RDMAP Stream" instead; both end the stream.
pub const IRD_EXCEEDED: TerminateCause = TerminateCause::DDP_UNTAGGED_NO_BUFFER;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Posted, not handed to the engine.
    Posted,
    /// Failed its post-time checks; fails when the engine reaches it.
    PreFailed(WcStatus),
    /// Handed to the engine, not fully on the wire.
    Active,
    /// A Send or Write whose last byte ends at this stream offset.
    Transmitted { end: u64 },
    /// A Read whose request is out; waiting for its Response.
    AwaitingResponse,
    /// Finished; waits for earlier requests before its completion.
    Done(WcStatus),
}

#[derive(Clone, Copy, Debug)]
struct SqEntry {
    wr: SendWr,
    len: u32,
    signalled: bool,
    phase: Phase,
}

/// A queue pair.
#[derive(Debug)]
pub struct QueuePair {
    qp_num: QpNum,
    attr: QpInitAttr,
    state: QpState,
    sq: VecDeque<SqEntry>,
    /// Sequence number of `sq.front()`.
    head_seq: u64,
    /// Next request to hand to the engine.
    exec_seq: u64,
    /// Lowest request that may still wait for TCP's acknowledgement.
    ack_seq: u64,
    /// Highest acknowledged stream offset reported.
    acked_offset: u64,
    /// A failed request stopped the engine's cursor.
    sq_halted: bool,
    /// An unsuccessful completion was delivered: flush the rest.
    sq_error_delivered: bool,
    /// Outstanding Reads, oldest first (at most `max_ord`).
    outstanding_reads: VecDeque<u64>,
    ord: u32,
    ird: u32,
    rq: RecvQueue,
    recv_current: Option<RecvWr>,
    /// A receive completion that found the CQ full.
    recv_stalled: Option<WorkCompletion>,
    inbound: VecDeque<InboundRead>,
    event: Option<QpEvent>,
}

impl QueuePair {
    /// A queue pair for `attr`, with every queue allocated now; ORD and IRD
    /// start at their maxima. Normally created through
    /// [`Device::create_qp`](super::Device::create_qp), which checks the
    /// attributes against the device.
    pub fn new(qp_num: QpNum, attr: QpInitAttr) -> QueuePair {
        let rq_depth = if attr.srq.is_some() {
            0
        } else {
            attr.max_recv_wr
        };
        QueuePair {
            qp_num,
            attr,
            state: QpState::Idle,
            sq: VecDeque::new(),
            head_seq: 0,
            exec_seq: 0,
            ack_seq: 0,
            acked_offset: 0,
            sq_halted: false,
            sq_error_delivered: false,
            outstanding_reads: VecDeque::with_capacity(attr.max_ord as usize),
            ord: attr.max_ord,
            ird: attr.max_ird,
            rq: RecvQueue::new(rq_depth, attr.max_recv_sge),
            recv_current: None,
            recv_stalled: None,
            inbound: VecDeque::with_capacity(attr.max_ird as usize),
            event: None,
        }
    }

    /// Its number.
    pub fn qp_num(&self) -> QpNum {
        self.qp_num
    }

    /// Its protection domain.
    pub fn pd(&self) -> PdId {
        self.attr.pd
    }

    /// Its creation attributes.
    pub fn attr(&self) -> &QpInitAttr {
        &self.attr
    }

    /// Its state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Current ORD.
    pub fn ord(&self) -> u32 {
        self.ord
    }

    /// Current IRD.
    pub fn ird(&self) -> u32 {
        self.ird
    }

    /// Send requests not yet completed (delivered or silently retired).
    pub fn sq_len(&self) -> usize {
        self.sq.len()
    }

    /// Receives posted to this queue pair's own queue.
    pub fn rq_len(&self) -> usize {
        self.rq.len()
    }

    /// The position of the oldest request still in the send queue (not yet
    /// retired by [`QueuePair::deliver_completions`]); the next one posted
    /// gets `head_seq() + sq_len()`. The QP engine walks from here to find
    /// the request a Terminate from the peer is about.
    pub fn head_seq(&self) -> WrSeq {
        WrSeq(self.head_seq)
    }

    /// The request at position `seq`, if it is still in the send queue.
    pub fn send_wr(&self, seq: WrSeq) -> Option<&SendWr> {
        self.entry(seq.0).map(|e| &e.wr)
    }

    /// Reads whose Response has not completed.
    pub fn outstanding_reads(&self) -> usize {
        self.outstanding_reads.len()
    }

    /// Whether the next request is a Read held back by ORD (or a fenced
    /// request held back by outstanding Reads).
    pub fn is_read_blocked(&self) -> bool {
        let Some(e) = self.entry(self.exec_seq) else {
            return false;
        };
        let fenced = e.wr.flags.contains(SendFlags::FENCE) && !self.outstanding_reads.is_empty();
        let over_ord = matches!(e.wr.op, SendOp::RdmaRead { .. })
            && self.outstanding_reads.len() >= self.ord as usize;
        e.phase == Phase::Posted && (fenced || over_ord)
    }

    /// Whether, in Error, completions or receive buffers still wait to be
    /// flushed (call [`QueuePair::deliver_completions`] and
    /// [`QueuePair::flush_rq`]).
    pub fn needs_flush(&self) -> bool {
        self.state == QpState::Error
            && (!self.sq.is_empty()
                || self.rq.len() > 0
                || self.recv_current.is_some()
                || self.recv_stalled.is_some())
    }

    /// Takes the pending asynchronous event.
    pub fn take_event(&mut self) -> Option<QpEvent> {
        self.event.take()
    }

    /// Changes state, ORD and IRD (`ibv_modify_qp`). Transitions:
    ///
    /// | from      | to                                  |
    /// |-----------|-------------------------------------|
    /// | Idle      | Rts, Error                          |
    /// | Rts       | Closing, Terminate, Error           |
    /// | Closing   | Idle (nothing outstanding), Error   |
    /// | Terminate | Error                               |
    /// | Error     | Idle (everything flushed)           |
    ///
    /// A "transition" to the current state changes nothing.
    pub fn modify_qp(&mut self, m: QpModify) -> Result<(), VerbsError> {
        if m.ord.is_some() || m.ird.is_some() {
            if self.state != QpState::Idle {
                return Err(VerbsError::InvalidTransition);
            }
            if m.ord.is_some_and(|o| o > self.attr.max_ord)
                || m.ird.is_some_and(|i| i > self.attr.max_ird)
            {
                return Err(VerbsError::InvalidValue);
            }
        }
        if let Some(to) = m.state {
            self.check_transition(to)?;
        }
        if let Some(ord) = m.ord {
            self.ord = ord;
        }
        if let Some(ird) = m.ird {
            self.ird = ird;
        }
        match m.state {
            Some(QpState::Error) => self.enter_error(),
            Some(QpState::Idle) if self.state == QpState::Error => {
                self.sq_halted = false;
                self.sq_error_delivered = false;
                self.state = QpState::Idle;
            }
            Some(to) => self.state = to,
            None => {}
        }
        Ok(())
    }

    fn check_transition(&self, to: QpState) -> Result<(), VerbsError> {
        use QpState::*;
        let ok = match (self.state, to) {
            (a, b) if a == b => true,
            (_, Error) => true,
            (Idle, Rts) | (Rts, Closing) | (Rts, Terminate) => true,
            (Closing, Idle) => {
                self.sq.is_empty() && self.inbound.is_empty() && self.recv_current.is_none()
            }
            (Error, Idle) => !self.needs_flush() && self.inbound.is_empty(),
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(VerbsError::InvalidTransition)
        }
    }

    /// Posts a send work request (`ibv_post_send`). Its local SGEs are
    /// checked against `mrs` now: one that fails is still queued and ends
    /// with [`WcStatus::LocalProtectionError`] (always reported, signalled
    /// or not) when the send queue reaches it, which then moves the queue
    /// pair to Error. In Error the request is queued to be flushed.
    pub fn post_send(&mut self, wr: &SendWr, mrs: &MrTable) -> Result<WrSeq, PostError> {
        match self.state {
            QpState::Idle | QpState::Rts | QpState::Error => {}
            QpState::Closing | QpState::Terminate => return Err(PostError::InvalidState),
        }
        if self.sq.len() >= self.attr.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sges.len() > self.attr.max_send_sge as usize {
            return Err(PostError::TooManySges);
        }
        let need = match wr.op {
            SendOp::RdmaRead { .. } if wr.sges.len() > 1 => return Err(PostError::InvalidWr),
            SendOp::LocalInvalidate { .. } | SendOp::FastRegister(_) if !wr.sges.is_empty() => {
                return Err(PostError::InvalidWr)
            }
            SendOp::RdmaRead { .. } => Access::LOCAL_WRITE,
            _ => Access::NONE,
        };
        let len = wr.sges.total_len().ok_or(PostError::InvalidWr)?;
        let mut phase = Phase::Posted;
        for sge in wr.sges.as_slice() {
            if let Err(e) = mrs.check_local(sge.lkey, sge.addr, sge.length, self.attr.pd, need) {
                phase = Phase::PreFailed(e.wc_status());
                break;
            }
        }
        let seq = self.head_seq + self.sq.len() as u64;
        super::room_at_first_use(&mut self.sq, self.attr.max_send_wr as usize);
        self.sq.push_back(SqEntry {
            wr: *wr,
            len,
            signalled: self.attr.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
            phase,
        });
        Ok(WrSeq(seq))
    }

    /// Posts a receive (`ibv_post_recv`). Its SGEs are checked when a
    /// message is placed into them. Refused when the queue pair uses a
    /// shared receive queue.
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        if self.attr.srq.is_some() {
            return Err(PostError::SrqAttached);
        }
        self.rq.push(wr)
    }

    /// The next request to put on the wire, if the queue pair is in Rts
    /// (or Closing: an orderly close lets posted work finish) and the send
    /// queue is not held back (ORD, fence, a failed request).
    /// Local invalidation and fast registration run here, against `mrs`, in
    /// queue order, and are not returned.
    pub fn next_work(&mut self, mrs: &mut MrTable) -> Option<SendWork> {
        // Closing refuses new posts; what was posted before still runs.
        if !matches!(self.state, QpState::Rts | QpState::Closing) || self.sq_halted {
            return None;
        }
        loop {
            let seq = self.exec_seq;
            let pd = self.attr.pd;
            let reads = self.outstanding_reads.len();
            let ord = self.ord as usize;
            let index = (seq - self.head_seq) as usize;
            let e = self.sq.get_mut(index)?;
            match e.phase {
                Phase::Posted => {}
                Phase::PreFailed(status) => {
                    e.phase = Phase::Done(status);
                    self.exec_seq += 1;
                    self.sq_halted = true;
                    return None;
                }
                _ => return None,
            }
            if e.wr.flags.contains(SendFlags::FENCE) && reads > 0 {
                return None;
            }
            let op = match e.wr.op {
                SendOp::Send => WireOp::Send {
                    solicited: e.wr.flags.contains(SendFlags::SOLICITED),
                    invalidate: None,
                },
                SendOp::SendWithInvalidate { invalidate } => WireOp::Send {
                    solicited: e.wr.flags.contains(SendFlags::SOLICITED),
                    invalidate: Some(invalidate),
                },
                SendOp::RdmaWrite { remote_addr, rkey } => WireOp::RdmaWrite { remote_addr, rkey },
                SendOp::RdmaRead { remote_addr, rkey } => {
                    if reads >= ord {
                        return None;
                    }
                    WireOp::RdmaRead { remote_addr, rkey }
                }
                SendOp::LocalInvalidate { stag } => {
                    let result = mrs.invalidate_local(stag, pd);
                    if self.finish_local(result.map_err(|e| e.wc_status())) {
                        continue;
                    }
                    return None;
                }
                SendOp::FastRegister(fr) => {
                    let result = mrs.fast_register(&fr, pd);
                    if self.finish_local(result.map_err(|e| e.wc_status())) {
                        continue;
                    }
                    return None;
                }
            };
            e.phase = Phase::Active;
            let work = SendWork {
                seq: WrSeq(seq),
                wr_id: e.wr.wr_id,
                op,
                len: e.len,
            };
            if matches!(op, WireOp::RdmaRead { .. }) {
                self.outstanding_reads.push_back(seq);
            }
            self.exec_seq += 1;
            return Some(work);
        }
    }

    /// The SGEs of request `seq`, where they lie in the send queue (a
    /// request stays there until it completes).
    pub fn work_sges(&self, seq: WrSeq) -> Option<&SgeList> {
        self.entry(seq.0).map(|e| &e.wr.sges)
    }

    /// Records the outcome of the local operation at the cursor; whether the
    /// send queue may go on.
    fn finish_local(&mut self, result: Result<(), WcStatus>) -> bool {
        let index = (self.exec_seq - self.head_seq) as usize;
        let ok = result.is_ok();
        if let Some(e) = self.sq.get_mut(index) {
            e.phase = Phase::Done(result.err().unwrap_or(WcStatus::Success));
        }
        self.exec_seq += 1;
        if !ok {
            self.sq_halted = true;
        }
        ok
    }

    /// The engine has put the whole of request `seq` on the wire. For a Send
    /// or Write, `end` is the stream offset just past its last byte; it
    /// completes when [`QueuePair::acked`] reaches `end`. For a Read, `end`
    /// is ignored: it completes with [`QueuePair::complete_read`].
    pub fn transmitted(&mut self, seq: WrSeq, end: u64) -> Result<(), QpError> {
        let acked = self.acked_offset;
        let e = self.entry_mut(seq.0).ok_or(QpError::UnknownWr)?;
        if e.phase != Phase::Active {
            return Err(QpError::WrongPhase);
        }
        e.phase = match e.wr.op {
            SendOp::RdmaRead { .. } => Phase::AwaitingResponse,
            _ if end <= acked => Phase::Done(WcStatus::Success),
            _ => Phase::Transmitted { end },
        };
        Ok(())
    }

    /// TCP has acknowledged the stream up to `offset`: every transmitted
    /// Send and Write ending at or before it is done.
    pub fn acked(&mut self, offset: u64) {
        self.acked_offset = self.acked_offset.max(offset);
        self.ack_seq = self.ack_seq.max(self.head_seq);
        while self.ack_seq < self.exec_seq {
            let index = (self.ack_seq - self.head_seq) as usize;
            let Some(e) = self.sq.get_mut(index) else {
                break;
            };
            match e.phase {
                Phase::Transmitted { end } if end <= self.acked_offset => {
                    e.phase = Phase::Done(WcStatus::Success);
                }
                Phase::Transmitted { .. } => break,
                Phase::Active if !matches!(e.wr.op, SendOp::RdmaRead { .. }) => break,
                Phase::Posted | Phase::PreFailed(_) => break,
                Phase::Active | Phase::AwaitingResponse | Phase::Done(_) => {}
            }
            self.ack_seq += 1;
        }
    }

    /// The oldest outstanding Read: the one the next Read Response belongs
    /// to (Responses come back in request order, RFC 5040 §5.5), with its
    /// request for the sink SGE.
    pub fn oldest_read(&self) -> Option<(WrSeq, &SendWr)> {
        let seq = *self.outstanding_reads.front()?;
        Some((WrSeq(seq), &self.entry(seq)?.wr))
    }

    /// The oldest outstanding Read has ended with `status` (its Response
    /// was fully placed, or failed). Returns its position.
    pub fn complete_read(&mut self, status: WcStatus) -> Result<WrSeq, QpError> {
        let seq = self
            .outstanding_reads
            .pop_front()
            .ok_or(QpError::NoOutstandingRead)?;
        let e = self.entry_mut(seq).ok_or(QpError::UnknownWr)?;
        e.phase = Phase::Done(status);
        if status != WcStatus::Success {
            self.sq_halted = true;
        }
        Ok(WrSeq(seq))
    }

    /// Ends request `seq` (handed out, not yet completed) with `status` —
    /// for failures the engine detects itself, such as a source SGE whose
    /// region went away before its FPDUs were built, or a Terminate from the
    /// peer naming it.
    pub fn complete(&mut self, seq: WrSeq, status: WcStatus) -> Result<(), QpError> {
        let e = self.entry_mut(seq.0).ok_or(QpError::UnknownWr)?;
        match e.phase {
            Phase::Active | Phase::Transmitted { .. } | Phase::AwaitingResponse => {}
            _ => return Err(QpError::WrongPhase),
        }
        e.phase = Phase::Done(status);
        self.outstanding_reads.retain(|&s| s != seq.0);
        if status != WcStatus::Success {
            self.sq_halted = true;
        }
        Ok(())
    }

    /// Moves finished requests, in send-queue order, into the send CQ; in
    /// Error, flushes every request left. Returns how many requests were
    /// retired (signalled or not).
    ///
    /// The first unsuccessful completion moves the queue pair to Error and
    /// records [`QpEvent::WorkRequestError`]; every later request then
    /// completes with [`WcStatus::WrFlushError`]. If the CQ is full the
    /// completion stays here, the queue pair moves to Error with
    /// [`QpEvent::CqOverrun`], and a later call delivers it.
    pub fn deliver_completions(&mut self, cq: &mut CompletionQueue) -> Result<usize, QpError> {
        if cq.id() != self.attr.send_cq {
            return Err(QpError::WrongCq);
        }
        let mut retired = 0;
        while let Some(front) = self.sq.front() {
            let status = match front.phase {
                Phase::Done(_) if self.sq_error_delivered => WcStatus::WrFlushError,
                Phase::Done(status) => status,
                _ if self.state == QpState::Error => WcStatus::WrFlushError,
                _ => break,
            };
            if front.signalled || status != WcStatus::Success {
                let wc = WorkCompletion {
                    wr_id: front.wr.wr_id,
                    status,
                    opcode: send_opcode(&front.wr.op),
                    byte_len: if status == WcStatus::Success {
                        front.len
                    } else {
                        0
                    },
                    qp_num: self.qp_num,
                    solicited: false,
                    invalidated_stag: None,
                };
                if cq.push(wc).is_err() {
                    self.record_event(QpEvent::CqOverrun);
                    self.enter_error();
                    return Err(QpError::CqFull);
                }
            }
            self.sq.pop_front();
            self.head_seq += 1;
            self.exec_seq = self.exec_seq.max(self.head_seq);
            self.ack_seq = self.ack_seq.max(self.head_seq);
            retired += 1;
            if status != WcStatus::Success {
                self.sq_error_delivered = true;
                if self.state != QpState::Error {
                    self.record_event(QpEvent::WorkRequestError(status));
                    self.enter_error();
                }
            }
        }
        Ok(retired)
    }

    /// Takes a receive buffer for an incoming Send: from the shared receive
    /// queue if this queue pair has one (pass it), else from its own queue.
    /// [`QpError::NoReceiveBuffer`] is DDP's "no buffer available" for the
    /// engine to terminate with.
    pub fn begin_recv(&mut self, srq: Option<&mut SharedReceiveQueue>) -> Result<(), QpError> {
        if !matches!(self.state, QpState::Rts | QpState::Closing) {
            return Err(QpError::InvalidState);
        }
        if self.recv_current.is_some() {
            return Err(QpError::ReceiveInProgress);
        }
        let wr = match (self.attr.srq, srq) {
            (Some(id), Some(srq)) if srq.id() == id => srq.take(),
            (None, None) => self.rq.pop(),
            _ => return Err(QpError::WrongSrq),
        };
        self.recv_current = Some(wr.ok_or(QpError::NoReceiveBuffer)?);
        Ok(())
    }

    /// The receive in progress: its SGEs are where the Send's bytes go, in
    /// order (check each piece with [`MrTable::check_local`] and
    /// [`Access::LOCAL_WRITE`], against [`QueuePair::pd`]).
    pub fn current_recv(&self) -> Option<&RecvWr> {
        self.recv_current.as_ref()
    }

    /// Completes the receive in progress into the receive CQ. An
    /// unsuccessful one moves the queue pair to Error.
    pub fn finish_recv(&mut self, cq: &mut CompletionQueue, done: RecvDone) -> Result<(), QpError> {
        if cq.id() != self.attr.recv_cq {
            return Err(QpError::WrongCq);
        }
        let wr = self
            .recv_current
            .take()
            .ok_or(QpError::NoReceiveInProgress)?;
        let wc = WorkCompletion {
            wr_id: wr.wr_id,
            status: done.status,
            opcode: WcOpcode::Recv,
            byte_len: done.byte_len,
            qp_num: self.qp_num,
            solicited: done.solicited,
            invalidated_stag: done.invalidated_stag,
        };
        if cq.push(wc).is_err() {
            self.recv_stalled = Some(wc);
            self.record_event(QpEvent::CqOverrun);
            self.enter_error();
            return Err(QpError::CqFull);
        }
        if done.status != WcStatus::Success && self.state != QpState::Error {
            self.record_event(QpEvent::WorkRequestError(done.status));
            self.enter_error();
        }
        Ok(())
    }

    /// In Error, completes every receive of this queue pair with
    /// [`WcStatus::WrFlushError`], oldest first (a stalled completion and
    /// the one in progress before the posted ones). Receives still in a
    /// shared receive queue stay there. Returns how many were completed.
    pub fn flush_rq(&mut self, cq: &mut CompletionQueue) -> Result<usize, QpError> {
        if cq.id() != self.attr.recv_cq {
            return Err(QpError::WrongCq);
        }
        if self.state != QpState::Error {
            return Ok(0);
        }
        let mut n = 0;
        if let Some(wc) = self.recv_stalled {
            cq.push(wc).map_err(|_| QpError::CqFull)?;
            self.recv_stalled = None;
            n += 1;
        }
        if let Some(wr) = self.recv_current {
            cq.push(self.flush_wc(wr.wr_id))
                .map_err(|_| QpError::CqFull)?;
            self.recv_current = None;
            n += 1;
        }
        while let Some(wr) = self.rq.front() {
            cq.push(self.flush_wc(wr.wr_id))
                .map_err(|_| QpError::CqFull)?;
            self.rq.pop();
            n += 1;
        }
        Ok(n)
    }

    fn flush_wc(&self, wr_id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status: WcStatus::WrFlushError,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            qp_num: self.qp_num,
            solicited: false,
            invalidated_stag: None,
        }
    }

    /// Queues an inbound Read Request (already checked, its source pinned
    /// with [`MrTable::pin_remote_read`]). If IRD requests are queued
    /// already, the request is handed back (so its pin can be returned) and
    /// the engine terminates the stream with [`IRD_EXCEEDED`]: the peer
    /// exceeded the IRD it negotiated.
    pub fn push_inbound_read(&mut self, read: InboundRead) -> Result<(), InboundRead> {
        if self.inbound.len() >= self.ird as usize {
            return Err(read);
        }
        self.inbound.push_back(read);
        Ok(())
    }

    /// Inbound Read Requests queued (each counts against IRD until its
    /// Response is fully on the wire and it is popped).
    pub fn inbound_reads(&self) -> usize {
        self.inbound.len()
    }

    /// The Read Request whose Response goes out next.
    pub fn inbound_read_front(&mut self) -> Option<&mut InboundRead> {
        self.inbound.front_mut()
    }

    /// Removes the front Read Request once its Response is fully on the
    /// wire. Its pin goes with it: keep it with the Response's FPDUs until
    /// TCP acknowledges them, then return it with [`MrTable::unpin`].
    pub fn pop_inbound_read(&mut self) -> Option<InboundRead> {
        self.inbound.pop_front()
    }

    /// Drops every queued inbound Read Request, returning their pins to
    /// `mrs` (stream teardown). Returns how many were dropped.
    pub fn drain_inbound_reads(&mut self, mrs: &mut MrTable) -> usize {
        let n = self.inbound.len();
        for read in self.inbound.drain(..) {
            if let Some(pin) = read.source {
                mrs.unpin(pin);
            }
        }
        n
    }

    fn enter_error(&mut self) {
        self.state = QpState::Error;
        self.outstanding_reads.clear();
    }

    fn record_event(&mut self, event: QpEvent) {
        if self.event.is_none() {
            self.event = Some(event);
        }
    }

    fn entry(&self, seq: u64) -> Option<&SqEntry> {
        let index = seq.checked_sub(self.head_seq)?;
        self.sq.get(usize::try_from(index).ok()?)
    }

    fn entry_mut(&mut self, seq: u64) -> Option<&mut SqEntry> {
        let index = seq.checked_sub(self.head_seq)?;
        self.sq.get_mut(usize::try_from(index).ok()?)
    }
}

fn send_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithInvalidate { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::LocalInvalidate { .. } => WcOpcode::LocalInvalidate,
        SendOp::FastRegister(_) => WcOpcode::FastRegister,
    }
}
