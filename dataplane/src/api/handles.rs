//! The application's handles on verbs objects: completion queues,
//! shared receive queues, queue pairs, protection domains, memory
//! registrations and fast-register regions. Posting and polling happen
//! here, on the application's threads, through the rings of
//! `crate::ctl` that the workers drain and fill.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdmap::placement::MemSpan;
use rdmap::verbs::MAX_SGE;

use rdmap::verbs::{
    Access, FastReg, PdId, PostError, QpNum, RecvWr, SendFlags, SendOp, SendWr, Sge, SgeList, Stag,
    WorkCompletion,
};

use crate::memory::Region;

use crate::ctl::{CqShared, PollPop, QpShared, SrqShared, UNBOUND};
use crate::ctl::{Error, QpStatus};
use crate::memory::MemoryError;

/// A completion queue: a bounded ring that workers push completions into
/// (release) and the application polls (acquire). Clone it freely; every
/// clone is the same queue.
#[derive(Debug, Clone)]
pub struct Cq {
    pub(super) inner: Arc<CqShared>,
}

impl Cq {
    /// Moves up to `out.len()` completions into `out`, oldest first per
    /// queue pair; returns how many (`ibv_poll_cq`).
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.inner.ring.poll_pop() {
                Some(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    /// The oldest completion, if any.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        self.inner.ring.poll_pop()
    }

    /// Entries it holds at most.
    pub fn capacity(&self) -> usize {
        self.inner.ring.capacity()
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.inner.ring.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.inner.ring.is_empty()
    }

    /// Its number.
    pub fn id(&self) -> u32 {
        self.inner.id
    }
}

/// A shared receive queue (`ibv_srq`): receive buffers for every queue
/// pair created on it, whichever worker runs them. Clone it freely; every
/// clone is the same queue.
#[derive(Debug, Clone)]
pub struct Srq {
    pub(super) inner: Arc<SrqShared>,
}

impl Srq {
    /// Posts a receive (`ibv_post_srq_recv`): a push into the shared ring
    /// (any thread; no lock). Its SGEs are checked when a Send lands in
    /// them. A full ring is [`PostError::QueueFull`]; a destroyed queue
    /// ([`Dataplane::destroy_srq`](super::Dataplane::destroy_srq)) is [`PostError::InvalidState`].
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        if self.inner.destroyed.load(Ordering::Acquire) {
            return Err(PostError::InvalidState);
        }
        if wr.sges.len() > self.inner.max_sge as usize {
            return Err(PostError::TooManySges);
        }
        if wr.sges.total_len().is_none() {
            return Err(PostError::InvalidWr);
        }
        self.inner.ring.push(wr).map_err(|_| PostError::QueueFull)
    }

    /// Its number.
    pub fn id(&self) -> u32 {
        self.inner.id.0
    }

    /// Its protection domain.
    pub fn pd(&self) -> PdId {
        self.inner.pd
    }

    /// Receives posted and not taken yet.
    pub fn len(&self) -> usize {
        self.inner.ring.len()
    }

    /// Whether none is posted.
    pub fn is_empty(&self) -> bool {
        self.inner.ring.is_empty()
    }

    /// Receives it holds at most.
    pub fn capacity(&self) -> usize {
        self.inner.ring.capacity()
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): once a
    /// worker takes a buffer and fewer than `limit` remain,
    /// [`Srq::limit_reached`] turns true and the limit disarms. 0 disarms.
    pub fn arm_limit(&self, limit: u32) {
        self.inner.limit_reached.store(false, Ordering::Relaxed);
        self.inner.limit.store(limit, Ordering::Release);
    }

    /// Whether the armed limit was reached since it was armed; reading it
    /// clears it.
    pub fn limit_reached(&self) -> bool {
        self.inner.limit_reached.swap(false, Ordering::AcqRel)
    }
}

/// Sizes of a queue pair (`ibv_qp_cap` and the IRD/ORD limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpOptions {
    /// Send-queue depth.
    pub max_send_wr: u32,
    /// Receive-queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send request (at most 6).
    pub max_send_sge: u32,
    /// SGEs per receive request (at most 6).
    pub max_recv_sge: u32,
    /// Largest ORD the connection may negotiate.
    pub max_ord: u32,
    /// Largest IRD the connection may negotiate.
    pub max_ird: u32,
    /// Signal every send request.
    pub sq_sig_all: bool,
}

/// The most RDMA Reads a queue pair may have outstanding each way
/// ([`QpOptions::max_ord`], [`QpOptions::max_ird`]): the device's
/// `max_qp_rd_atom`, what perftest's read tests ask for by default.
pub const MAX_RD_ATOM: u32 = 128;

impl Default for QpOptions {
    fn default() -> QpOptions {
        QpOptions {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: MAX_SGE as u32,
            max_recv_sge: MAX_SGE as u32,
            max_ord: 16,
            max_ird: 16,
            sq_sig_all: false,
        }
    }
}

/// A queue pair: the application's end of a connection. Clone it freely;
/// every clone is the same queue pair.
#[derive(Debug, Clone)]
pub struct Qp {
    pub(super) inner: Arc<QpShared>,
}

impl Qp {
    /// Its number (in completions).
    pub fn num(&self) -> QpNum {
        self.inner.qpn
    }

    /// Where it stands.
    pub fn status(&self) -> QpStatus {
        QpStatus::from_u8(self.inner.status.load(Ordering::Acquire))
    }

    /// The worker that owns its connection, once bound.
    pub fn worker(&self) -> Option<usize> {
        Some(self.inner.worker.load(Ordering::Acquire)).filter(|&w| w != UNBOUND)
    }

    /// Posts a send work request (`ibv_post_send`): a push into the
    /// submission ring, checked for shape here; its memory is checked by
    /// the worker (a failure completes with a local protection error).
    /// The ring holds `max_send_wr` requests; a full ring is
    /// [`PostError::QueueFull`].
    pub fn post_send(&self, wr: &SendWr) -> Result<(), PostError> {
        self.push_send(wr)?;
        self.inner.wake_worker();
        Ok(())
    }

    /// Posts a list of send work requests in order, as `ibv_post_send`
    /// with a chain of them does: one wake-up of the worker for the whole
    /// list. On the first request refused (its shape, or a full ring),
    /// stops and returns its index with the reason; the requests before it
    /// are posted.
    pub fn post_send_list(&self, wrs: &[SendWr]) -> Result<(), (usize, PostError)> {
        self.post_list(wrs, Qp::check_send, |wrs| self.inner.sq.push_list(wrs))
    }

    /// Checks `wrs` in order with `check` up to the first refused, pushes
    /// those before it with `push_list` (one reservation of the ring for a
    /// run of them), then rings the doorbell once if any went in.
    fn post_list<W>(
        &self,
        wrs: &[W],
        check: impl Fn(&Qp, &W) -> Result<(), PostError>,
        push_list: impl FnOnce(&[W]) -> usize,
    ) -> Result<(), (usize, PostError)> {
        let mut r = Ok(());
        let mut ok = wrs.len();
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = check(self, wr) {
                r = Err((i, e));
                ok = i;
                break;
            }
        }
        let pushed = push_list(&wrs[..ok]);
        if pushed < ok {
            r = Err((pushed, PostError::QueueFull));
        }
        if pushed > 0 {
            self.inner.wake_worker();
        }
        r
    }

    fn push_send(&self, wr: &SendWr) -> Result<(), PostError> {
        self.check_send(wr)?;
        self.inner.sq.push(wr).map_err(|_| PostError::QueueFull)
    }

    /// Whether `wr` may be posted: the queue pair's state and limits, the
    /// request's shape.
    fn check_send(&self, wr: &SendWr) -> Result<(), PostError> {
        let a = &self.inner.attr;
        if self.status() == QpStatus::Disconnected {
            return Err(PostError::InvalidState);
        }
        if wr.sges.len() > a.max_send_sge as usize {
            return Err(PostError::TooManySges);
        }
        match wr.op {
            SendOp::RdmaRead { .. } if wr.sges.len() != 1 => return Err(PostError::InvalidWr),
            // Local memory operations carry no data (see the module docs
            // for how their STag change reaches every worker).
            SendOp::LocalInvalidate { .. } | SendOp::FastRegister(_) if !wr.sges.is_empty() => {
                return Err(PostError::InvalidWr)
            }
            _ => {}
        }
        if wr.sges.total_len().is_none() {
            return Err(PostError::InvalidWr);
        }
        Ok(())
    }

    /// Posts a receive (`ibv_post_recv`) for one incoming Send. A queue
    /// pair on a shared receive queue takes none
    /// ([`PostError::SrqAttached`]): post to the [`Srq`].
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        self.push_recv(wr)?;
        self.inner.wake_worker();
        Ok(())
    }

    /// Posts a list of receives in order with one wake-up of the worker
    /// (`ibv_post_recv` with a chain); like [`Qp::post_send_list`], the
    /// first refused stops the list and its index is returned.
    pub fn post_recv_list(&self, wrs: &[RecvWr]) -> Result<(), (usize, PostError)> {
        self.post_list(wrs, Qp::check_recv, |wrs| self.inner.rq.push_list(wrs))
    }

    fn push_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        self.check_recv(wr)?;
        self.inner.rq.push(wr).map_err(|_| PostError::QueueFull)
    }

    /// Whether `wr` may be posted to the queue pair's own receive queue.
    fn check_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        if self.inner.srq.is_some() {
            return Err(PostError::SrqAttached);
        }
        if self.status() == QpStatus::Disconnected {
            return Err(PostError::InvalidState);
        }
        if wr.sges.len() > self.inner.attr.max_recv_sge as usize {
            return Err(PostError::TooManySges);
        }
        if wr.sges.total_len().is_none() {
            return Err(PostError::InvalidWr);
        }
        Ok(())
    }
}

/// A protection domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProtectionDomain {
    pub(super) id: PdId,
}

impl ProtectionDomain {
    /// Its id.
    pub fn id(&self) -> PdId {
        self.id
    }
}

/// A memory registration: an STag naming `len` bytes of a [`Region`] at
/// tagged offsets `[addr, addr + len)` (the virtual address, as rping and
/// perftest expect).
#[derive(Debug, Clone)]
pub struct MemoryRegistration {
    pub(super) stag: Stag,
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) region: Region,
    pub(super) offset: usize,
}

impl MemoryRegistration {
    /// The STag, as local key.
    pub fn lkey(&self) -> Stag {
        self.stag
    }

    /// The STag, as remote key (the same value in iWARP).
    pub fn rkey(&self) -> Stag {
        self.stag
    }

    /// Tagged offset of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty (never: registration refuses it).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The registered memory.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Offset of the first registered byte in the region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// A scatter/gather entry for `len` bytes at `offset` of the
    /// registration.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + offset,
            length: len,
            lkey: self.stag,
        }
    }
}

/// A fast-register memory region (`ib_alloc_mr`): an STag, invalid until a
/// `FastRegister` work request binds it to up to `max_len` bytes of its
/// [`Region`] ([`FastRegMr::fast_reg_wr`]) with a key of the consumer's
/// choice; a `LocalInvalidate` work request, or a peer's Send with
/// Invalidate, makes it invalid again. See the module documentation for
/// how every worker learns of each change.
#[derive(Debug, Clone)]
pub struct FastRegMr {
    pub(super) stag: Stag,
    pub(super) pd: PdId,
    pub(super) max_len: u64,
    pub(super) region: Region,
}

impl FastRegMr {
    /// The STag as allocated (its index; fast registration picks the key).
    pub fn stag(&self) -> Stag {
        self.stag
    }

    /// The STag with `key`, as a fast registration with `key` names it.
    pub fn stag_with_key(&self, key: u8) -> Stag {
        self.stag.with_key(key)
    }

    /// Longest binding.
    pub fn max_len(&self) -> u64 {
        self.max_len
    }

    /// The memory it binds.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Its protection domain.
    pub fn pd(&self) -> PdId {
        self.pd
    }

    /// A fast registration binding `len` bytes of the region from `offset`
    /// with `access`, under the STag with `key`; tagged offsets are virtual
    /// addresses, as for [`Dataplane::reg_mr`](super::Dataplane::reg_mr).
    pub fn fast_reg(
        &self,
        key: u8,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<FastReg, Error> {
        match offset.checked_add(len) {
            Some(end) if len > 0 && end <= self.region.len() && len as u64 <= self.max_len => {}
            _ => return Err(Error::Memory(MemoryError::OutOfBounds)),
        }
        Ok(FastReg {
            stag: self.stag.with_key(key),
            mem: MemSpan::new(self.region.handle(), offset as u64, len as u64),
            iova: self.region.addr() + offset as u64,
            access,
        })
    }

    /// [`FastRegMr::fast_reg`] as a signalled work request.
    pub fn fast_reg_wr(
        &self,
        wr_id: u64,
        key: u8,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<SendWr, Error> {
        Ok(SendWr {
            wr_id,
            op: SendOp::FastRegister(self.fast_reg(key, offset, len, access)?),
            sges: SgeList::empty(),
            flags: SendFlags::SIGNALED,
        })
    }
}

/// A signalled local invalidation of `stag` (`IBV_WR_LOCAL_INV`).
pub fn local_invalidate_wr(wr_id: u64, stag: Stag) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::LocalInvalidate { stag },
        sges: SgeList::empty(),
        flags: SendFlags::SIGNALED,
    }
}
