//! The control layer: the rings and messages the application's side
//! (`crate::api`) and the workers (`crate::worker`) share, so that
//! neither reaches into the other. The API sends [`Ctl`] messages down
//! and receives [`WorkerMsg`]s back; queue pairs, CQs and SRQs are shared
//! through the rings of [`shared`]; a sleeping worker is woken through
//! its [`IdleWake`]; STag changes travel between workers as [`MrSync`]
//! messages; frames move between workers over [`DispatchRings`] and the
//! forwarding rings of [`SmallFrame`]s.

use core::net::SocketAddrV4;
use std::sync::Arc;

use crossbeam_channel::Sender;
use crossbeam_queue::ArrayQueue;
use rdmap::placement::RegionHandle;
use rdmap::verbs::{Access, DeregStatus, FastReg, PdId, QpNum, Stag};
use tcp_offload::iface::RxChecksum;
use tcp_offload::tcp::ConnId;

use crate::memory::Region;

pub(crate) mod cm;
pub(crate) mod error;
pub(crate) mod poll;
pub(crate) mod shared;
pub(crate) mod slots;
pub(crate) mod wake;
pub(crate) mod wr_ring;

pub use cm::{
    printable, CmEvent, ConnectFailure, ConnectRequest, ConnectionInfo, DisconnectReason,
    RefusedRequest,
};
pub use error::Error;
pub(crate) use poll::PollPop;
pub use shared::QpStatus;
pub(crate) use shared::{CqShared, QpCounters, QpShared, SrqShared, SrqSupply, UNBOUND};
pub(crate) use wake::IdleWake;

/// STag changes waiting in one worker's replica ring at most: far more
/// than the fast registrations and invalidations of one iteration.
pub(crate) const MR_SYNC_RING: usize = 256;

/// Frames forwarded between workers at most (ARP), per worker.
pub(crate) const FORWARD_RING: usize = 64;

/// Received frames waiting in one worker's dispatch ring at most: what
/// other workers handed it on a port that cannot steer. Thirty-two
/// receive bursts ([`crate::worker::RX_BURST`] frames each): a worker
/// drains [`crate::worker::DISPATCH_PER_POLL`] per iteration, so the ring
/// absorbs the other workers' bursts while it is busy with a long
/// iteration; a full ring drops (counted) and TCP recovers.
pub(crate) const DISPATCH_RING: usize = 32 * 32;

/// The answer to a control message.
#[derive(Debug)]
pub(crate) enum CtlReply {
    Done,
    Dereg(DeregStatus),
    Failed(Error),
}

impl From<Result<(), Error>> for CtlReply {
    fn from(r: Result<(), Error>) -> CtlReply {
        r.map_or_else(CtlReply::Failed, |()| CtlReply::Done)
    }
}

/// Per-connection MPA parameters chosen by the application.
#[derive(Debug, Clone)]
pub(crate) struct ConnParams {
    pub ird: u16,
    pub ord: u16,
    pub private_data: Vec<u8>,
}

/// A message from the control path to one worker.
#[derive(Debug)]
pub(crate) enum Ctl {
    Listen {
        port: u16,
        backlog: usize,
        reply: Sender<CtlReply>,
    },
    Connect {
        qp: Arc<QpShared>,
        remote: SocketAddrV4,
        params: ConnParams,
        reply: Sender<CtlReply>,
    },
    Accept {
        conn: ConnId,
        qp: Arc<QpShared>,
        params: ConnParams,
        reply: Sender<CtlReply>,
    },
    Reject {
        conn: ConnId,
        private_data: Vec<u8>,
        reply: Sender<CtlReply>,
    },
    RegMr {
        stag: Stag,
        pd: PdId,
        region: Region,
        offset: u64,
        len: u64,
        iova: u64,
        access: Access,
        reply: Sender<CtlReply>,
    },
    DeregMr {
        stag: Stag,
        reply: Sender<CtlReply>,
    },
    /// A fast-register region: `stag` allocated (invalid) by the control
    /// path, over memory of `region`.
    AllocMr {
        stag: Stag,
        pd: PdId,
        max_len: u64,
        region: Region,
        reply: Sender<CtlReply>,
    },
    /// Frees a fast-register region whatever its current key.
    DeallocMr {
        stag: Stag,
        region: RegionHandle,
        reply: Sender<CtlReply>,
    },
    Disconnect {
        qpn: QpNum,
        /// The queue pair's connection slot on the worker, as bound
        /// ([`QpShared::slot`]).
        slot: u32,
        abort: bool,
    },
    Shutdown,
}

/// A message from a worker to the control path.
#[derive(Debug)]
pub(crate) enum WorkerMsg {
    /// For the application.
    Event(CmEvent),
    /// A deregistration that waited for pins finished on this worker.
    MrReleased { stag: Stag },
}

/// A change of an STag's state that one worker made and the others apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MrOp {
    /// A fast registration of a queue pair in `pd`.
    FastRegister { fr: FastReg, pd: PdId },
    /// A local or remote invalidation on a queue pair in `pd`.
    Invalidate { stag: Stag, pd: PdId },
}

/// One change on its way to a replica: who made it and its sequence
/// number among that worker's changes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MrSync {
    pub(crate) from: usize,
    pub(crate) seq: u64,
    pub(crate) op: MrOp,
}

/// A frame another worker forwarded (ARP): small, copied by value.
#[derive(Debug, Clone, Copy)]
pub struct SmallFrame {
    pub(crate) len: u8,
    pub(crate) bytes: [u8; 64],
}

impl SmallFrame {
    pub(crate) fn of(frame: &[u8]) -> Option<SmallFrame> {
        let len = u8::try_from(frame.len()).ok().filter(|&l| l <= 64)?;
        let mut bytes = [0u8; 64];
        bytes[..frame.len()].copy_from_slice(frame);
        Some(SmallFrame { len, bytes })
    }
}

/// The software dispatcher's rings, one per worker: received frames (the
/// buffers themselves, with the device's checksum verdicts) that another
/// worker took from its queue for a connection this worker owns.
/// Allocated once, when the dataplane opens.
#[derive(Debug)]
pub(crate) struct DispatchRings<B> {
    pub(crate) rings: Vec<ArrayQueue<(B, RxChecksum)>>,
}

impl<B> DispatchRings<B> {
    /// Rings for `workers` workers, [`DISPATCH_RING`] frames each.
    pub(crate) fn new(workers: usize) -> DispatchRings<B> {
        DispatchRings {
            rings: (0..workers)
                .map(|_| ArrayQueue::new(DISPATCH_RING))
                .collect(),
        }
    }
}
