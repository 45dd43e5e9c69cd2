//! Completion queues: where work requests end, as libibverbs' `ibv_poll_cq`
//! sees them.
//!
//! A bounded ring whose capacity is fixed (and allocated) at creation. A
//! completion that does not fit is never dropped silently: the push fails,
//! the queue records an overrun event (`IBV_EVENT_CQ_ERR`), and the queue
//! pair that produced it keeps the completion and moves to Error (see
//! [`QueuePair`](super::qp::QueuePair)), so it is delivered once the
//! application has made room.
//!
//! Completion semantics for iWARP come from RFC 5040 §5 (a Send, Write or
//! Read completes at the local peer; a received Send completes into a
//! posted receive buffer, with the invalidated STag for Send with
//! Invalidate and the solicited-event flag, §5.3). There is no
//! immediate data in iWARP.
//!
//! This is a plain single-owner struct. A CQ shared by queue pairs on
//! several workers (perftest `-q N` puts every QP on one CQ) is made
//! multi-producer by the dataplane, which wraps it in a ring; the ordering
//! rules here hold per queue pair.

use std::collections::VecDeque;

use super::mr::Stag;
use super::qp::QpNum;
use crate::error::{Layer, TerminateCause};

/// A completion queue's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// How a work request ended (`ibv_wc_status`, the subset iWARP produces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// Done.
    Success,
    /// A received message did not fit the receive buffer, or a work
    /// request's length was invalid.
    LocalLengthError,
    /// An internal queue-pair consistency error (for example the queue pair
    /// was in the wrong state for the operation).
    LocalQpOperationError,
    /// A local SGE or local memory operation failed the STag checks.
    LocalProtectionError,
    /// The queue pair went to Error before this request finished.
    WrFlushError,
    /// The peer reported the request invalid (Terminate: unexpected opcode,
    /// or a Send with Invalidate it could not honour).
    RemoteInvalidRequest,
    /// The peer refused access to its memory (Terminate: remote protection
    /// error: invalid STag, bounds, rights).
    RemoteAccessError,
    /// The peer failed the operation for another reason (Terminate: remote
    /// operation error).
    RemoteOperationError,
    /// Anything else (for example a connection reset).
    GeneralError,
}

impl WcStatus {
    /// The status of the request a Terminate received from the peer is
    /// about (the peer found our Send, Write or Read Request at fault).
    pub fn from_terminate(cause: TerminateCause) -> WcStatus {
        use crate::error::{ddp_etype, rdmap_etype};
        match (cause.layer, cause.etype) {
            (Layer::Rdmap, rdmap_etype::REMOTE_PROTECTION) => WcStatus::RemoteAccessError,
            (Layer::Rdmap, rdmap_etype::REMOTE_OPERATION) => match cause {
                TerminateCause::RDMAP_OP_UNEXPECTED_OPCODE
                | TerminateCause::RDMAP_OP_INVALID_VERSION
                | TerminateCause::RDMAP_OP_CANNOT_INVALIDATE => WcStatus::RemoteInvalidRequest,
                _ => WcStatus::RemoteOperationError,
            },
            (Layer::Ddp, ddp_etype::TAGGED_BUFFER) => WcStatus::RemoteAccessError,
            (Layer::Ddp, ddp_etype::UNTAGGED_BUFFER) => match cause {
                TerminateCause::DDP_UNTAGGED_NO_BUFFER => WcStatus::RemoteOperationError,
                _ => WcStatus::RemoteInvalidRequest,
            },
            (Layer::Rdmap, _) | (Layer::Ddp, _) => WcStatus::RemoteOperationError,
            (Layer::Llp, _) => WcStatus::GeneralError,
        }
    }
}

/// What a completion is for (`ibv_wc_opcode`, the iWARP subset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A Send of any kind (solicited, with invalidate).
    Send,
    /// An RDMA Write.
    RdmaWrite,
    /// An RDMA Read.
    RdmaRead,
    /// A local invalidation.
    LocalInvalidate,
    /// A fast registration.
    FastRegister,
    /// A received Send.
    Recv,
}

/// One completion (`ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The consumer's id of the work request.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// Bytes transferred: the message length for a Send, Write or Read, the
    /// bytes received for a Recv; 0 when not successful.
    pub byte_len: u32,
    /// The queue pair it belongs to.
    pub qp_num: QpNum,
    /// A received Send carried the solicited-event flag.
    pub solicited: bool,
    /// A received Send with Invalidate invalidated this STag
    /// (`IBV_WC_WITH_INV` and `invalidated_rkey`).
    pub invalidated_stag: Option<Stag>,
}

impl WorkCompletion {
    /// Whether the completion reports an invalidated STag.
    pub fn with_invalidate(&self) -> bool {
        self.invalidated_stag.is_some()
    }
}

/// The queue was full: the completion was not stored (and the overrun was
/// recorded as a [`CqEvent::Overrun`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqFull;

/// Asynchronous events of a completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqEvent {
    /// A completion found the queue full (`IBV_EVENT_CQ_ERR`).
    Overrun,
}

/// A completion queue.
#[derive(Debug)]
pub struct CompletionQueue {
    id: CqId,
    ring: VecDeque<WorkCompletion>,
    capacity: usize,
    armed: Option<bool>,
    notified: bool,
    overruns: u64,
    overrun_pending: bool,
}

impl CompletionQueue {
    /// A queue of `capacity` entries (`ibv_create_cq` with `cqe`), allocated
    /// now. Normally created through [`Device::create_cq`](super::Device::create_cq).
    pub fn new(id: CqId, capacity: u32) -> CompletionQueue {
        let capacity = capacity.max(1) as usize;
        CompletionQueue {
            id,
            ring: VecDeque::new(),
            capacity,
            armed: None,
            notified: false,
            overruns: 0,
            overrun_pending: false,
        }
    }

    /// Its id.
    pub fn id(&self) -> CqId {
        self.id
    }

    /// How many completions it holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many completions wait to be polled.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether no completion waits.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Room left.
    pub fn free(&self) -> usize {
        self.capacity - self.ring.len()
    }

    /// Stores a completion (the producer side: queue pairs call this).
    pub fn push(&mut self, wc: WorkCompletion) -> Result<(), CqFull> {
        if self.ring.len() >= self.capacity {
            self.overruns += 1;
            self.overrun_pending = true;
            return Err(CqFull);
        }
        if let Some(solicited_only) = self.armed {
            if !solicited_only || wc.solicited || wc.status != WcStatus::Success {
                self.armed = None;
                self.notified = true;
            }
        }
        super::room_at_first_use(&mut self.ring, self.capacity);
        self.ring.push_back(wc);
        Ok(())
    }

    /// Moves up to `out.len()` completions, oldest first, into `out`;
    /// returns how many (`ibv_poll_cq`).
    pub fn poll_cq(&mut self, out: &mut [WorkCompletion]) -> usize {
        let n = out.len().min(self.ring.len());
        for (slot, wc) in out.iter_mut().zip(self.ring.drain(..n)) {
            *slot = wc;
        }
        n
    }

    /// The oldest completion, if any.
    pub fn poll_one(&mut self) -> Option<WorkCompletion> {
        self.ring.pop_front()
    }

    /// Arms the notification (`ibv_req_notify_cq`): the next completion
    /// (only a solicited or unsuccessful one if `solicited_only`) raises it.
    pub fn req_notify_cq(&mut self, solicited_only: bool) {
        self.armed = Some(solicited_only);
    }

    /// Whether an armed notification fired since the last call (what the
    /// completion channel would deliver).
    pub fn take_notification(&mut self) -> bool {
        core::mem::take(&mut self.notified)
    }

    /// The next asynchronous event, if any.
    pub fn take_event(&mut self) -> Option<CqEvent> {
        core::mem::take(&mut self.overrun_pending).then_some(CqEvent::Overrun)
    }

    /// How many pushes found the queue full since creation.
    pub fn overruns(&self) -> u64 {
        self.overruns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(wr_id: u64, status: WcStatus, solicited: bool) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            qp_num: QpNum(1),
            solicited,
            invalidated_stag: None,
        }
    }

    #[test]
    fn ring_order_and_overrun() {
        let mut cq = CompletionQueue::new(CqId(1), 2);
        cq.push(wc(1, WcStatus::Success, false)).unwrap();
        cq.push(wc(2, WcStatus::Success, false)).unwrap();
        assert_eq!(cq.push(wc(3, WcStatus::Success, false)), Err(CqFull));
        assert_eq!(cq.take_event(), Some(CqEvent::Overrun));
        assert_eq!(cq.take_event(), None);
        assert_eq!(cq.overruns(), 1);
        let mut out = [wc(0, WcStatus::GeneralError, false); 4];
        assert_eq!(cq.poll_cq(&mut out), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (1, 2));
        assert!(cq.is_empty());
        cq.push(wc(3, WcStatus::Success, false)).unwrap();
        assert_eq!(cq.poll_one().map(|w| w.wr_id), Some(3));
    }

    #[test]
    fn terminate_causes_map_to_remote_statuses() {
        use WcStatus::*;
        for (cause, want) in [
            (TerminateCause::RDMAP_PROT_BASE_BOUNDS, RemoteAccessError),
            (TerminateCause::DDP_TAGGED_INVALID_STAG, RemoteAccessError),
            (
                TerminateCause::RDMAP_OP_UNEXPECTED_OPCODE,
                RemoteInvalidRequest,
            ),
            (
                TerminateCause::RDMAP_OP_CANNOT_INVALIDATE,
                RemoteInvalidRequest,
            ),
            (
                TerminateCause::RDMAP_OP_CATASTROPHIC_STREAM,
                RemoteOperationError,
            ),
            (TerminateCause::DDP_UNTAGGED_NO_BUFFER, RemoteOperationError),
            (TerminateCause::DDP_UNTAGGED_TOO_LONG, RemoteInvalidRequest),
            (
                TerminateCause::RDMAP_LOCAL_CATASTROPHIC,
                RemoteOperationError,
            ),
            (TerminateCause::MPA_CRC, GeneralError),
        ] {
            assert_eq!(WcStatus::from_terminate(cause), want, "{cause}");
        }
    }

    #[test]
    fn solicited_only_notification() {
        let mut cq = CompletionQueue::new(CqId(1), 8);
        cq.push(wc(1, WcStatus::Success, false)).unwrap();
        assert!(!cq.take_notification(), "not armed");
        cq.req_notify_cq(true);
        cq.push(wc(2, WcStatus::Success, false)).unwrap();
        assert!(!cq.take_notification());
        cq.push(wc(3, WcStatus::Success, true)).unwrap();
        assert!(cq.take_notification());
        cq.push(wc(4, WcStatus::Success, true)).unwrap();
        assert!(!cq.take_notification(), "one notification per arming");
        cq.req_notify_cq(true);
        cq.push(wc(5, WcStatus::WrFlushError, false)).unwrap();
        assert!(cq.take_notification(), "errors always notify");
        cq.req_notify_cq(false);
        cq.push(wc(6, WcStatus::Success, false)).unwrap();
        assert!(cq.take_notification());
    }
}
