//! What a queue pair, a completion queue and a shared receive queue
//! share between the application's threads and the worker that runs
//! them: submission rings, completion rings, the status word, the
//! published counters. The API's handles wrap these; workers drain and
//! fill them.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_queue::ArrayQueue;
use rdmap::verbs::{PdId, QpInitAttr, QpNum, RecvSupply, RecvWr, SendWr, SrqId, WorkCompletion};

use super::cm::ConnectionInfo;
use super::wake::IdleWake;
use super::wr_ring::WrRing;

/// A completion queue's ring: workers push completions into it (release)
/// and the application polls it (acquire).
#[derive(Debug)]
pub(crate) struct CqShared {
    pub(crate) ring: ArrayQueue<WorkCompletion>,
    pub(crate) id: u32,
}

impl CqShared {
    /// A completion from a worker; a full ring gives it back.
    pub(crate) fn push(&self, wc: WorkCompletion) -> Result<(), WorkCompletion> {
        self.ring.push(wc)
    }
}

/// A shared receive queue's ring and limit state.
#[derive(Debug)]
pub(crate) struct SrqShared {
    pub(crate) id: SrqId,
    pub(crate) pd: PdId,
    pub(crate) max_sge: u32,
    pub(crate) ring: WrRing<RecvWr>,
    /// Armed limit (0: disarmed).
    pub(crate) limit: AtomicU32,
    pub(crate) limit_reached: AtomicBool,
    /// Set by [`crate::api::Dataplane::destroy_srq`]: no more receives, no new queue
    /// pairs.
    pub(crate) destroyed: AtomicBool,
}

/// A worker's way into an SRQ's ring, for the queue pair engine (see
/// `rdmap::verbs::RecvSupply`): one buffer per Send that begins.
#[derive(Debug)]
pub(crate) struct SrqSupply(Arc<SrqShared>);

impl SrqSupply {
    pub(crate) fn new(srq: Arc<SrqShared>) -> SrqSupply {
        SrqSupply(srq)
    }
}

impl SrqShared {
    /// Receives it holds at most.
    pub(crate) fn capacity(&self) -> usize {
        self.ring.capacity()
    }
}

impl RecvSupply for SrqSupply {
    fn take(&mut self) -> Option<RecvWr> {
        let s = &*self.0;
        let wr = s.ring.pop()?;
        let limit = s.limit.load(Ordering::Relaxed);
        if limit > 0
            && s.ring.len() < limit as usize
            && s.limit
                .compare_exchange(limit, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            s.limit_reached.store(true, Ordering::Release);
        }
        Some(wr)
    }
}

/// Where a queue pair stands, as the application sees it: the owning
/// worker's lifecycle of its connection, published (the worker writes it
/// in one place, when that lifecycle moves on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpStatus {
    /// Created; work may be posted.
    Idle,
    /// Bound to a connection being set up.
    Connecting,
    /// The stream is up.
    Connected,
    /// The connection is gone (or never came up); outstanding work was
    /// flushed.
    Disconnected,
}

impl QpStatus {
    pub(crate) fn from_u8(v: u8) -> QpStatus {
        match v {
            0 => QpStatus::Idle,
            1 => QpStatus::Connecting,
            2 => QpStatus::Connected,
            _ => QpStatus::Disconnected,
        }
    }
}

/// What a queue pair shares between the application and its worker.
#[derive(Debug)]
pub(crate) struct QpShared {
    pub qpn: QpNum,
    pub attr: QpInitAttr,
    pub sq: WrRing<SendWr>,
    pub rq: WrRing<RecvWr>,
    pub send_cq: Arc<CqShared>,
    pub recv_cq: Arc<CqShared>,
    /// Its shared receive queue, if created with one.
    pub srq: Option<Arc<SrqShared>>,
    pub(crate) status: AtomicU8,
    pub(crate) worker: AtomicUsize,
    /// Every worker's idle state: a post wakes the owner if it sleeps.
    pub(crate) wake: Arc<[IdleWake]>,
    /// Published by the owning worker (see [`QpCounters`]).
    pub counters: QpCounters,
    /// What the connection negotiated, recorded by the control path when
    /// its `Established` event passes (never touched by a worker).
    pub(crate) connection: Mutex<Option<ConnectionInfo>>,
    /// Set by the first post since the owning worker last drained the
    /// submission rings, which then put [`QpShared::slot`] in the
    /// worker's posted ring (`IdleWake::ring`).
    pub(crate) doorbell: AtomicBool,
    /// The connection's slot on the owning worker.
    pub(crate) slot: AtomicU32,
}

/// Per-queue-pair figures the owning worker publishes every
/// [`crate::worker::STATS_PERIOD`] (plain stores of relaxed atomics: the
/// data path takes no lock and no locked instruction for them).
#[derive(Debug, Default)]
pub(crate) struct QpCounters {
    /// TCP payload bytes sent on the connection (MPA framing included).
    pub bytes_sent: AtomicU64,
    /// TCP payload bytes received.
    pub bytes_received: AtomicU64,
    /// TCP segments retransmitted.
    pub retransmits: AtomicU64,
    /// RDMA Reads sent whose Response has not completed.
    pub outstanding_reads: AtomicU64,
}

impl QpCounters {
    /// The owning worker's publication.
    pub(crate) fn publish(&self, sent: u64, received: u64, retransmits: u64, reads: u64) {
        self.bytes_sent.store(sent, Ordering::Relaxed);
        self.bytes_received.store(received, Ordering::Relaxed);
        self.retransmits.store(retransmits, Ordering::Relaxed);
        self.outstanding_reads.store(reads, Ordering::Relaxed);
    }
}

pub(crate) const UNBOUND: usize = usize::MAX;

impl QpShared {
    pub(crate) fn set_status(&self, s: QpStatus) {
        self.status.store(s as u8, Ordering::Release);
    }

    pub(crate) fn bind_worker(&self, w: usize) {
        self.worker.store(w, Ordering::Release);
    }

    /// After a post: the owning worker, if bound and asleep, wakes up
    /// for it (an unbound queue pair's posts wait for the binding).
    pub(crate) fn wake_worker(&self) {
        // Acquire: the slot was stored before the worker index.
        if let Some(w) = self.wake.get(self.worker.load(Ordering::Acquire)) {
            // SeqCst: the post above is visible to the worker before it
            // can see the doorbell set, and it clears the doorbell before
            // it drains the rings (`QpShared::take_doorbell`).
            if !self.doorbell.swap(true, Ordering::SeqCst) {
                w.ring(self.slot.load(Ordering::Relaxed));
            }
            w.wake();
        }
    }

    /// The owning worker's side, before it drains the submission rings:
    /// the next post rings the doorbell again.
    pub(crate) fn take_doorbell(&self) {
        if self.doorbell.load(Ordering::Relaxed) {
            self.doorbell.store(false, Ordering::SeqCst);
        }
    }

    /// The owning worker's connection slot, stored before
    /// [`QpShared::bind_worker`].
    pub(crate) fn set_slot(&self, slot: u32) {
        self.slot.store(slot, Ordering::Relaxed);
    }

    /// The owning worker's connection slot, for a caller that has seen
    /// the binding ([`QpShared::worker`] loaded with Acquire).
    pub(crate) fn slot(&self) -> u32 {
        self.slot.load(Ordering::Relaxed)
    }
}
