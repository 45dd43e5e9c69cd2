//! The verbs object model: protection domains, memory regions and STags,
//! completion queues, shared receive queues, queue-pair states and work
//! requests — the consumer-facing side of an RNIC (RDMAC verbs, with
//! libibverbs' names where they fit), for RDMAP (RFC 5040) and DDP (RFC 5041).
//!
//! It sits between the application API of the dataplane and the QP engine
//! that runs DDP/RDMAP on the wire: the dataplane creates objects through a
//! [`Device`], the application posts work to [`QueuePair`]s and polls
//! [`CompletionQueue`]s, and the engine asks the [`MrTable`] to check every
//! STag a peer names before it touches memory through
//! [`Placement`](crate::placement::Placement).
//!
//! Everything is bounded and allocated at creation; nothing here allocates
//! per message. Objects are plain owned structs: the dataplane decides
//! where they live (a worker owns its queue pairs; shared CQs and SRQs sit
//! behind its rings).
//!
//! - [`pd`]: protection domains.
//! - [`mr`]: STags, access rights, registration, fast registration,
//!   invalidation, the placement checks, pins and asynchronous
//!   deregistration.
//! - [`cq`]: completion queues, statuses and opcodes.
//! - [`srq`]: shared receive queues.
//! - [`wr`]: work requests.
//! - [`qp`]: queue-pair states, send/receive queues, completion ordering,
//!   ORD/IRD.

pub mod cq;
pub mod mr;
pub mod pd;
pub mod qp;
pub mod srq;
pub mod wr;

pub use cq::{CompletionQueue, CqEvent, CqFull, CqId, WcOpcode, WcStatus, WorkCompletion};
pub use mr::{
    Access, AccessError, DeregStatus, FastReg, MrEvent, MrInfo, MrKind, MrState, MrTable,
    RegOptions, Stag, MAX_STAG_INDEX,
};
pub use pd::{PdId, PdTable};
pub use qp::{
    InboundRead, QpError, QpEvent, QpInitAttr, QpModify, QpNum, QpState, QueuePair, RecvDone,
    SendWork, WireOp, WrSeq, IRD_EXCEEDED,
};
pub use srq::{RecvSupply, SharedReceiveQueue, SrqEvent, SrqId, SrqInitAttr};
pub use wr::{PostError, RecvWr, SendFlags, SendOp, SendWr, Sge, SgeList, MAX_SGE};

use std::collections::VecDeque;

use crate::placement::MemSpan;

/// Why a control-path verb failed (the errno of libibverbs, as a small enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VerbsError {
    /// No such protection domain.
    InvalidPd,
    /// No such completion queue.
    InvalidCq,
    /// No such shared receive queue (or one in another protection domain).
    InvalidSrq,
    /// No such STag, or a key that does not match.
    InvalidStag,
    /// The object is still used (EBUSY).
    Busy,
    /// The table for this kind of object is full (ENOMEM).
    TableFull,
    /// Inconsistent access rights (remote write or atomic without local
    /// write).
    InvalidAccess,
    /// A zero length where a length is needed.
    InvalidLength,
    /// The region's end does not fit in 64 bits.
    AddressOverflow,
    /// A value beyond the device's or object's limits.
    InvalidValue,
    /// A state change the queue pair's state machine does not allow.
    InvalidTransition,
}

impl VerbsError {
    /// Every variant, for the tests that walk each message.
    pub const ALL: &'static [VerbsError] = &[
        VerbsError::InvalidPd,
        VerbsError::InvalidCq,
        VerbsError::InvalidSrq,
        VerbsError::InvalidStag,
        VerbsError::Busy,
        VerbsError::TableFull,
        VerbsError::InvalidAccess,
        VerbsError::InvalidLength,
        VerbsError::AddressOverflow,
        VerbsError::InvalidValue,
        VerbsError::InvalidTransition,
    ];
}

/// A clause about the object, as libibverbs' errno would say it.
impl core::fmt::Display for VerbsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            VerbsError::InvalidPd => "no such protection domain",
            VerbsError::InvalidCq => "no such completion queue",
            VerbsError::InvalidSrq => "no such shared receive queue in this protection domain",
            VerbsError::InvalidStag => "no such STag, or its key does not match",
            VerbsError::Busy => "the object is still in use",
            VerbsError::TableFull => "the table for this kind of object is full",
            VerbsError::InvalidAccess => {
                "remote write or atomic access asked for without local write"
            }
            VerbsError::InvalidLength => "a length of zero where one is needed",
            VerbsError::AddressOverflow => "the region ends beyond 64-bit addresses",
            VerbsError::InvalidValue => "a value beyond the device's or the object's limits",
            VerbsError::InvalidTransition => {
                "a queue pair state change its state machine does not allow"
            }
        })
    }
}

impl std::error::Error for VerbsError {}

/// Limits of a [`Device`] (`ibv_device_attr`), and the sizes of its tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Protection domains.
    pub max_pd: u32,
    /// Memory regions (STag table size).
    pub max_mr: u32,
    /// Completion queues.
    pub max_cq: u32,
    /// Entries per completion queue.
    pub max_cqe: u32,
    /// Shared receive queues.
    pub max_srq: u32,
    /// Receives per shared receive queue.
    pub max_srq_wr: u32,
    /// Queue pairs.
    pub max_qp: u32,
    /// Requests per send or receive queue.
    pub max_qp_wr: u32,
    /// SGEs per request (at most [`MAX_SGE`]).
    pub max_sge: u32,
    /// Outstanding outbound Reads per queue pair.
    pub max_ord: u32,
    /// Queued inbound Read Requests per queue pair.
    pub max_ird: u32,
}

impl Default for DeviceLimits {
    fn default() -> DeviceLimits {
        DeviceLimits {
            max_pd: 1024,
            max_mr: 16 * 1024,
            max_cq: 1024,
            max_cqe: 64 * 1024,
            max_srq: 256,
            max_srq_wr: 16 * 1024,
            max_qp: 1024,
            max_qp_wr: 4096,
            max_sge: MAX_SGE as u32,
            max_ord: 128,
            max_ird: 128,
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    live: bool,
    pd: Option<PdId>,
    users: u32,
}

#[derive(Clone, Copy, Debug, Default)]
struct QpSlot {
    live: bool,
    pd: Option<PdId>,
    send_cq: Option<CqId>,
    recv_cq: Option<CqId>,
    srq: Option<SrqId>,
}

/// A device context (`ibv_context`): creates the objects and keeps count
/// of who uses what, so nothing is destroyed under its users.
///
/// Queue pairs, completion queues and shared receive queues are returned
/// as owned objects (the dataplane places them on its workers) and
/// destroyed by id or by value; protection domains and memory regions stay
/// in the device's tables.
#[derive(Debug)]
pub struct Device {
    limits: DeviceLimits,
    pds: PdTable,
    mrs: MrTable,
    cqs: Vec<Slot>,
    srqs: Vec<Slot>,
    qps: Vec<QpSlot>,
}

impl Device {
    /// A device with `limits`, its tables allocated now.
    pub fn new(limits: DeviceLimits) -> Device {
        Device::with_seed(limits, 0)
    }

    /// Like [`Device::new`], seeding the STag keys (see
    /// [`MrTable::with_seed`]).
    pub fn with_seed(limits: DeviceLimits, seed: u64) -> Device {
        let limits = DeviceLimits {
            max_sge: limits.max_sge.min(MAX_SGE as u32),
            ..limits
        };
        Device {
            limits,
            pds: PdTable::new(limits.max_pd),
            mrs: MrTable::with_seed(limits.max_mr, seed),
            cqs: vec![Slot::default(); limits.max_cq as usize],
            srqs: vec![Slot::default(); limits.max_srq as usize],
            qps: vec![QpSlot::default(); limits.max_qp as usize],
        }
    }

    /// Its limits.
    pub fn limits(&self) -> &DeviceLimits {
        &self.limits
    }

    /// The STag table, for the checks of the QP engine.
    pub fn mrs(&self) -> &MrTable {
        &self.mrs
    }

    /// The STag table, for pins, invalidation and fast registration.
    pub fn mrs_mut(&mut self) -> &mut MrTable {
        &mut self.mrs
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&mut self) -> Result<PdId, VerbsError> {
        self.pds.alloc_pd()
    }

    /// Frees a protection domain no object uses (`ibv_dealloc_pd`).
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        if !self.pds.is_live(pd) {
            return Err(VerbsError::InvalidPd);
        }
        if self.mrs.pd_in_use(pd) {
            return Err(VerbsError::Busy);
        }
        self.pds.dealloc_pd(pd)
    }

    /// Registers memory (`ibv_reg_mr_iova`); see [`MrTable::reg_mr`].
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        mem: MemSpan,
        iova: u64,
        access: Access,
    ) -> Result<Stag, VerbsError> {
        self.reg_mr_with(pd, mem, iova, access, RegOptions::default())
    }

    /// Registers memory with options; see [`MrTable::reg_mr_with`].
    pub fn reg_mr_with(
        &mut self,
        pd: PdId,
        mem: MemSpan,
        iova: u64,
        access: Access,
        options: RegOptions,
    ) -> Result<Stag, VerbsError> {
        if !self.pds.is_live(pd) {
            return Err(VerbsError::InvalidPd);
        }
        self.mrs.reg_mr_with(pd, mem, iova, access, options)
    }

    /// Registers memory under a caller-chosen STag; see
    /// [`MrTable::reg_mr_at`].
    pub fn reg_mr_at(
        &mut self,
        stag: Stag,
        pd: PdId,
        mem: MemSpan,
        iova: u64,
        access: Access,
    ) -> Result<Stag, VerbsError> {
        self.reg_mr_at_with(stag, pd, mem, iova, access, RegOptions::default())
    }

    /// [`Device::reg_mr_at`] with options; see [`MrTable::reg_mr_at_with`].
    pub fn reg_mr_at_with(
        &mut self,
        stag: Stag,
        pd: PdId,
        mem: MemSpan,
        iova: u64,
        access: Access,
        options: RegOptions,
    ) -> Result<Stag, VerbsError> {
        if !self.pds.is_live(pd) {
            return Err(VerbsError::InvalidPd);
        }
        self.mrs
            .reg_mr_at_with(stag, pd, mem, iova, access, options)
    }

    /// Allocates a fast-register region (`ib_alloc_mr`); see
    /// [`MrTable::alloc_mr`].
    pub fn alloc_mr(&mut self, pd: PdId, max_len: u64) -> Result<Stag, VerbsError> {
        if !self.pds.is_live(pd) {
            return Err(VerbsError::InvalidPd);
        }
        self.mrs.alloc_mr(pd, max_len)
    }

    /// Deregisters a region (`ibv_dereg_mr`); see [`MrTable::dereg_mr`].
    pub fn dereg_mr(&mut self, stag: Stag) -> Result<DeregStatus, VerbsError> {
        self.mrs.dereg_mr(stag)
    }

    /// Creates a completion queue of `cqe` entries (`ibv_create_cq`).
    pub fn create_cq(&mut self, cqe: u32) -> Result<CompletionQueue, VerbsError> {
        if cqe == 0 || cqe > self.limits.max_cqe {
            return Err(VerbsError::InvalidValue);
        }
        let id = alloc_slot(&mut self.cqs, None)?;
        Ok(CompletionQueue::new(CqId(id), cqe))
    }

    /// Destroys a completion queue no queue pair uses (`ibv_destroy_cq`);
    /// the caller drops the object.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        free_slot(&mut self.cqs, cq.0).map_err(|e| match e {
            VerbsError::Busy => VerbsError::Busy,
            _ => VerbsError::InvalidCq,
        })
    }

    /// Creates a shared receive queue in `pd` (`ibv_create_srq`).
    pub fn create_srq(
        &mut self,
        pd: PdId,
        attr: SrqInitAttr,
    ) -> Result<SharedReceiveQueue, VerbsError> {
        if attr.max_wr == 0
            || attr.max_wr > self.limits.max_srq_wr
            || attr.max_sge > self.limits.max_sge
        {
            return Err(VerbsError::InvalidValue);
        }
        if !self.pds.is_live(pd) {
            return Err(VerbsError::InvalidPd);
        }
        let id = alloc_slot(&mut self.srqs, Some(pd))?;
        self.pds.acquire(pd)?;
        Ok(SharedReceiveQueue::new(SrqId(id), pd, attr))
    }

    /// Destroys a shared receive queue no queue pair uses
    /// (`ibv_destroy_srq`); the caller drops the object.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<(), VerbsError> {
        let pd = slot_of(&self.srqs, srq.0)
            .and_then(|s| s.pd)
            .ok_or(VerbsError::InvalidSrq)?;
        free_slot(&mut self.srqs, srq.0)?;
        self.pds.release(pd);
        Ok(())
    }

    /// Creates a queue pair (`ibv_create_qp`). Its CQs and SRQ must exist,
    /// the SRQ in the same protection domain.
    pub fn create_qp(&mut self, attr: QpInitAttr) -> Result<QueuePair, VerbsError> {
        let l = &self.limits;
        if attr.max_send_wr == 0
            || attr.max_send_wr > l.max_qp_wr
            || attr.max_recv_wr > l.max_qp_wr
            || attr.max_send_sge > l.max_sge
            || attr.max_recv_sge > l.max_sge
            || attr.max_ord > l.max_ord
            || attr.max_ird > l.max_ird
        {
            return Err(VerbsError::InvalidValue);
        }
        if !self.pds.is_live(attr.pd) {
            return Err(VerbsError::InvalidPd);
        }
        for cq in [attr.send_cq, attr.recv_cq] {
            if slot_of(&self.cqs, cq.0).is_none() {
                return Err(VerbsError::InvalidCq);
            }
        }
        if let Some(srq) = attr.srq {
            let slot = slot_of(&self.srqs, srq.0).ok_or(VerbsError::InvalidSrq)?;
            if slot.pd != Some(attr.pd) {
                return Err(VerbsError::InvalidSrq);
            }
        }
        let index = self
            .qps
            .iter()
            .position(|s| !s.live)
            .ok_or(VerbsError::TableFull)?;
        self.pds.acquire(attr.pd)?;
        use_slot(&mut self.cqs, attr.send_cq.0, 1);
        use_slot(&mut self.cqs, attr.recv_cq.0, 1);
        if let Some(srq) = attr.srq {
            use_slot(&mut self.srqs, srq.0, 1);
        }
        self.qps[index] = QpSlot {
            live: true,
            pd: Some(attr.pd),
            send_cq: Some(attr.send_cq),
            recv_cq: Some(attr.recv_cq),
            srq: attr.srq,
        };
        Ok(QueuePair::new(QpNum(index as u32 + 1), attr))
    }

    /// Destroys a queue pair (`ibv_destroy_qp`), returning the pins of its
    /// queued inbound Read Requests. Pins the engine holds for FPDUs in
    /// flight are the engine's to return.
    pub fn destroy_qp(&mut self, mut qp: QueuePair) -> Result<(), VerbsError> {
        let index = qp
            .qp_num()
            .0
            .checked_sub(1)
            .map(|i| i as usize)
            .filter(|&i| self.qps.get(i).is_some_and(|s| s.live))
            .ok_or(VerbsError::InvalidValue)?;
        qp.drain_inbound_reads(&mut self.mrs);
        let slot = core::mem::take(&mut self.qps[index]);
        if let Some(pd) = slot.pd {
            self.pds.release(pd);
        }
        for cq in [slot.send_cq, slot.recv_cq].into_iter().flatten() {
            use_slot(&mut self.cqs, cq.0, -1);
        }
        if let Some(srq) = slot.srq {
            use_slot(&mut self.srqs, srq.0, -1);
        }
        Ok(())
    }
}

/// Gives `q` room for `n` entries the first time it is used, once, so
/// that it never grows after: a queue pair that is never used (most of
/// them, in a server holding thousands) costs nothing for its queues.
/// (`tcp_offload::room` has its twin; this crate does not depend on that
/// one.)
pub(crate) fn room_at_first_use<T>(q: &mut VecDeque<T>, n: usize) {
    if q.capacity() == 0 {
        q.reserve_exact(n);
    }
}

fn alloc_slot(slots: &mut [Slot], pd: Option<PdId>) -> Result<u32, VerbsError> {
    let index = slots
        .iter()
        .position(|s| !s.live)
        .ok_or(VerbsError::TableFull)?;
    slots[index] = Slot {
        live: true,
        pd,
        users: 0,
    };
    Ok(index as u32 + 1)
}

fn slot_of(slots: &[Slot], id: u32) -> Option<&Slot> {
    slots.get(id.checked_sub(1)? as usize).filter(|s| s.live)
}

fn free_slot(slots: &mut [Slot], id: u32) -> Result<(), VerbsError> {
    let index = id.checked_sub(1).ok_or(VerbsError::InvalidValue)? as usize;
    let slot = slots
        .get_mut(index)
        .filter(|s| s.live)
        .ok_or(VerbsError::InvalidValue)?;
    if slot.users > 0 {
        return Err(VerbsError::Busy);
    }
    *slot = Slot::default();
    Ok(())
}

fn use_slot(slots: &mut [Slot], id: u32, delta: i32) {
    if let Some(slot) = id.checked_sub(1).and_then(|i| slots.get_mut(i as usize)) {
        slot.users = slot.users.saturating_add_signed(delta);
    }
}
