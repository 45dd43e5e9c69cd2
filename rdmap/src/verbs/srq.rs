//! Receive queues: the buffers untagged Sends are placed into (RFC 5041's
//! untagged buffer model, queue 0: one posted buffer per incoming Send, in
//! order), either one queue pair's own or a shared receive queue that
//! several queue pairs of the same protection domain draw from
//! (`ibv_create_srq`).
//!
//! Both are bounded rings allocated at creation. A shared receive queue can
//! be armed with a limit (`ibv_modify_srq` with `srq_limit`): when taking a
//! buffer leaves fewer than the limit posted, it raises
//! [`SrqEvent::LimitReached`] once and disarms. Buffers of a shared queue
//! are not flushed when one of its queue pairs fails; only the buffer that
//! queue pair had already taken is.
//!
//! **Buffers posted elsewhere.** A shared receive queue may also draw its
//! buffers from a [`RecvSupply`] ([`SharedReceiveQueue::with_supply`]):
//! when the queue pairs that share it run on different threads, the
//! buffers live in a structure they all reach (the dataplane's
//! multi-consumer ring), and each thread's copy of this object takes one
//! only when a Send actually begins, so no thread holds buffers another
//! one needs.

use std::collections::VecDeque;

use super::pd::PdId;
use super::wr::{PostError, RecvWr};

/// A shared receive queue's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId(pub u32);

/// Creation attributes of a shared receive queue (`ibv_srq_init_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqInitAttr {
    /// Posted receives it holds at most.
    pub max_wr: u32,
    /// SGEs per receive at most.
    pub max_sge: u32,
    /// Initial limit (0: not armed).
    pub srq_limit: u32,
}

/// Asynchronous events of a shared receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SrqEvent {
    /// Fewer buffers than the armed limit remain (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    LimitReached,
}

/// A bounded FIFO of posted receives, used as a queue pair's own receive
/// queue and inside a shared receive queue.
#[derive(Debug)]
pub(crate) struct RecvQueue {
    ring: VecDeque<RecvWr>,
    capacity: usize,
    max_sge: usize,
}

impl RecvQueue {
    pub(crate) fn new(capacity: u32, max_sge: u32) -> RecvQueue {
        RecvQueue {
            ring: VecDeque::new(),
            capacity: capacity as usize,
            max_sge: max_sge as usize,
        }
    }

    pub(crate) fn push(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        if wr.sges.len() > self.max_sge {
            return Err(PostError::TooManySges);
        }
        if wr.sges.total_len().is_none() {
            return Err(PostError::InvalidWr);
        }
        if self.ring.len() >= self.capacity {
            return Err(PostError::QueueFull);
        }
        super::room_at_first_use(&mut self.ring, self.capacity);
        self.ring.push_back(*wr);
        Ok(())
    }

    pub(crate) fn pop(&mut self) -> Option<RecvWr> {
        self.ring.pop_front()
    }

    pub(crate) fn front(&self) -> Option<&RecvWr> {
        self.ring.front()
    }

    pub(crate) fn len(&self) -> usize {
        self.ring.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

/// A source of posted receives kept outside a [`SharedReceiveQueue`]
/// (see the module documentation). `take` is called once per incoming
/// Send, when the queue's own buffers are used up; whoever implements it
/// hands the buffer over for good.
pub trait RecvSupply: Send + core::fmt::Debug {
    /// The oldest posted receive, taken, if any.
    fn take(&mut self) -> Option<RecvWr>;
}

/// A shared receive queue.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    id: SrqId,
    pd: PdId,
    rq: RecvQueue,
    limit: u32,
    event_pending: bool,
    supply: Option<Box<dyn RecvSupply>>,
}

impl SharedReceiveQueue {
    /// A queue for `attr`, allocated now. Normally created through
    /// [`Device::create_srq`](super::Device::create_srq).
    pub fn new(id: SrqId, pd: PdId, attr: SrqInitAttr) -> SharedReceiveQueue {
        SharedReceiveQueue {
            id,
            pd,
            rq: RecvQueue::new(attr.max_wr, attr.max_sge),
            limit: attr.srq_limit,
            event_pending: false,
            supply: None,
        }
    }

    /// A queue that takes its buffers from `supply` once those posted to it
    /// are used up (its limit event concerns only the latter). Allocates the
    /// queue now, never per message.
    pub fn with_supply(
        id: SrqId,
        pd: PdId,
        attr: SrqInitAttr,
        supply: Box<dyn RecvSupply>,
    ) -> SharedReceiveQueue {
        SharedReceiveQueue {
            supply: Some(supply),
            ..SharedReceiveQueue::new(id, pd, attr)
        }
    }

    /// Its id.
    pub fn id(&self) -> SrqId {
        self.id
    }

    /// Its protection domain (receive buffers are checked against it).
    pub fn pd(&self) -> PdId {
        self.pd
    }

    /// Posted receives waiting.
    pub fn len(&self) -> usize {
        self.rq.len()
    }

    /// Whether none is posted.
    pub fn is_empty(&self) -> bool {
        self.rq.len() == 0
    }

    /// Posted receives it can hold.
    pub fn capacity(&self) -> usize {
        self.rq.capacity()
    }

    /// Posts a receive (`ibv_post_srq_recv`). SGEs are checked when a
    /// message is placed into them.
    pub fn post_srq_recv(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        self.rq.push(wr)
    }

    /// Arms the limit event at `limit` posted receives (0 disarms)
    /// (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    pub fn modify_srq(&mut self, limit: u32) {
        self.limit = limit;
    }

    /// The armed limit (0 when disarmed).
    pub fn srq_limit(&self) -> u32 {
        self.limit
    }

    /// Takes the oldest posted receive for an incoming Send (the queue
    /// pair's engine does this, through
    /// [`QueuePair::begin_recv`](super::qp::QueuePair::begin_recv)).
    pub fn take(&mut self) -> Option<RecvWr> {
        let Some(wr) = self.rq.pop() else {
            return self.supply.as_mut()?.take();
        };
        if self.limit > 0 && (self.rq.len() as u64) < u64::from(self.limit) {
            self.limit = 0;
            self.event_pending = true;
        }
        Some(wr)
    }

    /// The oldest posted receive, without taking it.
    pub fn peek(&self) -> Option<&RecvWr> {
        self.rq.front()
    }

    /// The next asynchronous event, if any.
    pub fn take_event(&mut self) -> Option<SrqEvent> {
        core::mem::take(&mut self.event_pending).then_some(SrqEvent::LimitReached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::wr::SgeList;

    #[derive(Debug)]
    struct Counter(u64);

    impl RecvSupply for Counter {
        fn take(&mut self) -> Option<RecvWr> {
            self.0 = self.0.checked_sub(1)?;
            Some(RecvWr {
                wr_id: 100 + self.0,
                sges: SgeList::empty(),
            })
        }
    }

    #[test]
    fn own_buffers_first_then_the_supply_one_at_a_time() {
        let attr = SrqInitAttr {
            max_wr: 2,
            max_sge: 1,
            srq_limit: 0,
        };
        let mut q = SharedReceiveQueue::with_supply(SrqId(1), PdId(1), attr, Box::new(Counter(2)));
        let own = RecvWr {
            wr_id: 7,
            sges: SgeList::empty(),
        };
        q.post_srq_recv(&own).unwrap();
        assert_eq!(q.take().map(|w| w.wr_id), Some(7));
        assert_eq!(q.take().map(|w| w.wr_id), Some(101));
        assert_eq!(q.take().map(|w| w.wr_id), Some(100));
        assert_eq!(q.take(), None);
        assert!(q.is_empty());
    }
}
