//! The application API: a verbs-like interface to the dataplane, the way
//! an application talks to an RNIC (RDMAC verbs and rdma_cm, with
//! libibverbs' names where they fit).
//!
//! # Objects
//!
//! - [`Dataplane`]: the device. [`Dataplane::open`] reads a configuration
//!   and starts the workers (one thread per worker, pinned when cores are
//!   configured); [`Dataplane::open_with_link`] takes a port directly, and
//!   [`DriveMode::Inline`] lets the caller run the workers' loops itself
//!   ([`Dataplane::poll`]) for deterministic tests.
//! - [`ProtectionDomain`] ([`Dataplane::alloc_pd`]).
//! - [`Region`] (from [`crate::memory`]): memory the application owns;
//!   [`Dataplane::reg_mr`] registers part of it under an STag, valid on
//!   every worker, and returns a [`MemoryRegistration`].
//! - [`Cq`] ([`Dataplane::create_cq`]): a completion ring the workers push
//!   into and the application polls ([`Cq::poll`]). Multi-producer: one CQ
//!   may serve QPs on several workers.
//! - [`Qp`] ([`Dataplane::create_qp`]): send and receive submission rings
//!   ([`Qp::post_send`], [`Qp::post_recv`]) drained by the worker that owns
//!   the connection. Work may be posted before the connection exists.
//! - [`Srq`] ([`Dataplane::create_srq`]): a shared receive queue, one ring
//!   that any application thread posts to ([`Srq::post_recv`]) and the
//!   workers of every queue pair created on it
//!   ([`Dataplane::create_qp_with_srq`]) take buffers from.
//! - [`FastRegMr`] ([`Dataplane::alloc_mr`]): a fast-register region, an
//!   STag that `FastRegister` work requests bind to memory and
//!   `LocalInvalidate` work requests (or a peer's Send with Invalidate)
//!   invalidate.
//! - Connections: [`Dataplane::listen`], [`Dataplane::connect`], then
//!   [`CmEvent`]s from [`Dataplane::poll_event`] / [`Dataplane::wait_event`]:
//!   a [`CmEvent::ConnectRequest`] is answered with [`Dataplane::accept`]
//!   (binding a QP to the worker that received the request) or
//!   [`Dataplane::reject`], with private data either way.
//!
//! # Registering application memory
//!
//! Memory the dataplane allocates ([`Region::new`],
//! [`Region::new_hugepage`]) and memory the application already owns are
//! registered the same way, with [`Dataplane::reg_mr`]:
//!
//! - a buffer the program allocated: [`Region::from_vec`] takes the
//!   `Vec<u8>` ([`Region::from_boxed_slice`] a `Box<[u8]>`) without
//!   copying;
//!   [`Region::into_inner`] gives it back once no registration, queue pair
//!   or frame in flight refers to it (deregister, drop the
//!   [`MemoryRegistration`], and wait for [`CmEvent::MrDeregistered`] if
//!   the deregistration was pending; it returns the region unchanged while
//!   something still does, so try again);
//! - memory the program mapped (a file, shared memory):
//!   `unsafe` [`Region::from_raw_parts`] with a pointer, a length and a
//!   release callback (`munmap`) that runs once the dataplane is done
//!   with it; its documentation has the contract.
//!
//! While registered, the program reaches the bytes through the region
//! ([`Region::read`], [`Region::write`]), never through a `&[u8]` of its
//! own: a peer's Write or a Read Response may land at any time.
//! Over a DPDK port the memory is also registered with EAL (and mapped
//! for the device); buffers that share a page share that page's
//! registration (see [`crate::memory`]).
//!
//! ```no_run
//! # use dataplane::api::{Access, Dataplane, Error, Region};
//! # fn demo(dp: &Dataplane) -> Result<(), Error> {
//! let pd = dp.alloc_pd()?;
//! let region = Region::from_vec(vec![0u8; 1 << 20])?;
//! let mr = dp.reg_mr(pd, &region, 0, region.len(), Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! // ... post work naming mr.sge(..), give mr.rkey() and mr.addr() to the peer ...
//! dp.dereg_mr(&mr)?;
//! drop(mr);
//! let buf: Vec<u8> = region.into_inner().expect("nothing else holds it");
//! # drop(buf);
//! # Ok(())
//! # }
//! ```
//!
//! # Giving objects back
//!
//! A long-running program gives back what it creates: [`Dataplane::dereg_mr`]
//! and [`Dataplane::dealloc_mr`] for registrations,
//! [`Dataplane::destroy_srq`] for shared receive queues (refused while a
//! queue pair uses one), [`Dataplane::dealloc_pd`] or
//! [`Dataplane::release_pd`] for protection domains. Queue pairs and
//! completion queues hold no table slot: they go with their last handle
//! (a queue pair once its connection is over too).
//!
//! # Several users of one dataplane
//!
//! Connection-management events are the dataplane's, not a thread's: any
//! [`Dataplane::poll_event`] may return any event. A program that runs
//! several independent users on threads (a service with one responder per
//! port) gives each thread an [`EventScope`]: the thread's `poll_event` /
//! `wait_event` then return only the events of the ports it names and of
//! the queue pairs and registrations it created, and leave the others
//! queued for their threads. [`Dataplane::poll_event_where`] and
//! [`Dataplane::wait_event_where`] take an explicit filter instead.
//! Listening again on a port the dataplane listens on already is not an
//! error, so that such a user can take one client after another.
//!
//! # Observing a running dataplane
//!
//! [`Dataplane::stats`] reads each worker's counters and
//! [`Dataplane::qp_snapshots`] each queue pair's (bytes, retransmits,
//! outstanding Reads, what its connection negotiated): the workers publish
//! them into atomics every [`crate::worker::STATS_PERIOD`], so reading
//! takes no lock that a worker could wait on.
//!
//! # Data path and control path
//!
//! Posting work and polling completions touch only lock-free rings
//! (`crossbeam` `ArrayQueue`): no lock, no system call. The control path
//! (open, registration, connection management) uses channels to the
//! workers and waits for their answers, so that, for example, an STag is
//! known to every worker before `reg_mr` returns.
//!
//! # Ordering and memory
//!
//! A completion popped from a [`Cq`] happens-after everything the worker
//! did for it (the bytes of a received Send, Write or Read Response are in
//! the region); a work request pushed by [`Qp::post_send`] happens-before
//! the worker reads its buffers. See [`crate::memory`] for why region
//! accesses are atomic words. The buffer of a Send or Write must not
//! change until its completion (TCP may retransmit from it).
//!
//! # STags on several workers
//!
//! Each worker checks peers' STags against its own replica of the STag
//! table, so no lock sits on the data path; the control path's table here
//! allocates every STag, and `reg_mr` / `alloc_mr` return only once every
//! worker has the region. Fast registration, local invalidation and remote
//! invalidation (a peer's Send with Invalidate) change an STag on the
//! worker that runs them, the one that owns the queue pair; that worker
//! sends the change to every other worker's replica through a ring and
//! holds the completion reporting it, and every later completion of the
//! queue pair, until all of them have applied it. So when a
//! `LocalInvalidate` completes (or a later completion shows that an
//! unsignalled one ran), or a receive completion reports
//! `invalidated_stag`, no worker will place a byte or answer a Read through
//! that STag any more: a peer gets RDMAP's Terminate for an invalid STag
//! whichever connection it tries. A freshly fast-registered STag is usable
//! through every connection once its `FastRegister` completes; before that,
//! only through the worker that ran it. Ordering across workers beyond
//! this is the application's (as RDMAP orders nothing across streams):
//! changing one STag from queue pairs on two workers at once leaves each
//! replica with the change it received last. The worker module's
//! documentation has the mechanism.
//!
//! # Shared receive queues
//!
//! The SRQ's ring (`crossbeam`'s `ArrayQueue`) is multi-producer for the
//! application and multi-consumer for the workers: a worker pops one
//! buffer only when a Send begins on one of its queue pairs, and that
//! buffer is then that queue pair's (completed, or flushed if the
//! connection fails). No worker holds buffers it does not use, so a Send
//! finds no buffer (and its stream ends with DDP's Terminate) only when
//! the ring is empty. [`Srq::arm_limit`] arms the limit event
//! (`IBV_EVENT_SRQ_LIMIT_REACHED`), read with [`Srq::limit_reached`].
//!
//! # Not yet
//!
//! Graceful MPA close (disconnect closes TCP; the peer sees the stream
//! end), memory windows, more than one port.

use core::net::{Ipv4Addr, SocketAddrV4};
use core::time::Duration;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use crossbeam_queue::ArrayQueue;
use rdmap::placement::MemSpan;
use rdmap::verbs::{CqId, Device, DeviceLimits, QpInitAttr, SrqInitAttr, VerbsError, MAX_SGE};
use tcp_offload::wire::EthernetAddress;

pub use rdmap::engine::{SetupFailure, TerminateOrigin};
pub use rdmap::error::TerminateCause;
pub use rdmap::mpa::{NegotiationError, RejectReason, RtrType};
pub use rdmap::verbs::{
    Access, DeregStatus, FastReg, PdId, PostError, QpNum, RecvWr, SendFlags, SendOp, SendWr, Sge,
    SgeList, Stag, WcOpcode, WcStatus, WorkCompletion,
};

pub use crate::memory::Region;

use crate::config::Config;
pub use crate::ctl::{
    printable, CmEvent, ConnectFailure, ConnectRequest, ConnectionInfo, DisconnectReason, Error,
    QpStatus,
};
use crate::ctl::{
    ConnParams, CqShared, Ctl, CtlReply, DispatchRings, IdleWake, QpCounters, QpShared, SmallFrame,
    SrqShared, WorkerMsg, FORWARD_RING, UNBOUND,
};
use crate::link::{Link, LinkQueue, MemLink, MemLinkConfig};
use crate::memory::MemoryError;
use crate::worker::{Clock, MrSyncLinks, Worker, WorkerCounters, WorkerSetup, WorkerStats};

/// How long the control path waits for a worker's answer.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Private data an application may send in an MPA request, reply or
/// reject (revision 2: 256 bytes in all, less the IRD/ORD words).
pub const MAX_PRIVATE_DATA: usize = 252;

// ---------------------------------------------------------------------
// Completion queues.
// ---------------------------------------------------------------------

/// A completion queue: a bounded ring that workers push completions into
/// (release) and the application polls (acquire). Clone it freely; every
/// clone is the same queue.
#[derive(Debug, Clone)]
pub struct Cq {
    inner: Arc<CqShared>,
}

impl Cq {
    /// Moves up to `out.len()` completions into `out`, oldest first per
    /// queue pair; returns how many (`ibv_poll_cq`).
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.inner.ring.pop() {
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
        self.inner.ring.pop()
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

// ---------------------------------------------------------------------
// Shared receive queues.
// ---------------------------------------------------------------------

/// A shared receive queue (`ibv_srq`): receive buffers for every queue
/// pair created on it, whichever worker runs them. Clone it freely; every
/// clone is the same queue.
#[derive(Debug, Clone)]
pub struct Srq {
    inner: Arc<SrqShared>,
}

impl Srq {
    /// Posts a receive (`ibv_post_srq_recv`): a push into the shared ring
    /// (any thread; no lock). Its SGEs are checked when a Send lands in
    /// them. A full ring is [`PostError::QueueFull`]; a destroyed queue
    /// ([`Dataplane::destroy_srq`]) is [`PostError::InvalidState`].
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
        self.inner.ring.push(*wr).map_err(|_| PostError::QueueFull)
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

// ---------------------------------------------------------------------
// Queue pairs.
// ---------------------------------------------------------------------

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

/// A queue pair as the control path sees it, from
/// [`Dataplane::qp_snapshots`]: the figures are the owning worker's last
/// publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpSnapshot {
    /// Its number.
    pub qpn: QpNum,
    /// The worker that owns its connection, once bound.
    pub worker: Option<usize>,
    /// Where it stands.
    pub status: QpStatus,
    /// What its connection negotiated, once established.
    pub connection: Option<ConnectionInfo>,
    /// TCP payload bytes sent (MPA framing included).
    pub bytes_sent: u64,
    /// TCP payload bytes received.
    pub bytes_received: u64,
    /// TCP segments retransmitted.
    pub retransmits: u64,
    /// RDMA Reads sent whose Response has not completed.
    pub outstanding_reads: u64,
}

/// A queue pair: the application's end of a connection. Clone it freely;
/// every clone is the same queue pair.
#[derive(Debug, Clone)]
pub struct Qp {
    inner: Arc<QpShared>,
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
        self.inner.sq.push(*wr).map_err(|_| PostError::QueueFull)?;
        self.inner.wake_worker();
        Ok(())
    }

    /// Posts a receive (`ibv_post_recv`) for one incoming Send. A queue
    /// pair on a shared receive queue takes none
    /// ([`PostError::SrqAttached`]): post to the [`Srq`].
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
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
        self.inner.rq.push(*wr).map_err(|_| PostError::QueueFull)?;
        self.inner.wake_worker();
        Ok(())
    }
}

// ---------------------------------------------------------------------
// Other objects and events.
// ---------------------------------------------------------------------

/// A protection domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProtectionDomain {
    id: PdId,
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
    stag: Stag,
    addr: u64,
    len: u64,
    region: Region,
    offset: usize,
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
    stag: Stag,
    pd: PdId,
    max_len: u64,
    region: Region,
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
    /// addresses, as for [`Dataplane::reg_mr`].
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

/// Parameters of [`Dataplane::connect`] and [`Dataplane::accept`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// Inbound RDMA Read depth asked for (capped at the QP's).
    pub ird: u16,
    /// Outbound RDMA Read depth asked for (capped at the QP's).
    pub ord: u16,
    /// Private data for the peer (at most [`MAX_PRIVATE_DATA`]).
    pub private_data: Vec<u8>,
}

impl Default for ConnectParams {
    fn default() -> ConnectParams {
        ConnectParams {
            ird: 16,
            ord: 16,
            private_data: Vec::new(),
        }
    }
}

/// Who runs the workers' loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriveMode {
    /// One thread per worker (pinned if cores are configured).
    Threads,
    /// The caller, through [`Dataplane::poll`] (and while a control call
    /// waits for a worker): deterministic, single-threaded.
    Inline,
}

// ---------------------------------------------------------------------
// The dataplane.
// ---------------------------------------------------------------------

trait Pollable: Send {
    fn poll(&mut self) -> bool;
    fn shutdown(&mut self);
}

impl<Q: LinkQueue> Pollable for Worker<Q> {
    fn poll(&mut self) -> bool {
        Worker::poll(self)
    }

    fn shutdown(&mut self) {
        Worker::shutdown(self)
    }
}

#[derive(Debug)]
struct WorkerHandle {
    ctl: Sender<Ctl>,
    counters: Arc<WorkerCounters>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Control {
    /// The authoritative protection domains and STag allocation; workers
    /// mirror the registrations under the same STags.
    device: Device,
    pds: Vec<PdId>,
    /// Domains given back with [`Dataplane::release_pd`] while something
    /// still belonged to them.
    pd_release: Vec<PdId>,
    next_qpn: u32,
    next_cq: u32,
    /// Deregistrations waiting for workers: STag → workers still pinning.
    deregs: HashMap<u32, usize>,
    events: VecDeque<CmEvent>,
    /// Ports listened on (a second `listen` on one of them is a no-op).
    listening: Vec<u16>,
}

/// A running dataplane: its workers and the control path to them. See the
/// module documentation.
pub struct Dataplane {
    workers: Vec<WorkerHandle>,
    /// Each worker's idle state: control messages and posts wake a
    /// sleeping worker.
    wake: Arc<[IdleWake]>,
    inline: Option<Mutex<Vec<Box<dyn Pollable>>>>,
    events: Receiver<WorkerMsg>,
    control: Mutex<Control>,
    ip: Ipv4Addr,
    mac: EthernetAddress,
    limits: crate::config::LimitsConfig,
    next_connect: AtomicUsize,
    /// Every queue pair created, for the control path's snapshots (locked
    /// on creation and when read, never by a worker).
    qps: Mutex<Vec<Weak<QpShared>>>,
    /// The port's own counters, when [`Dataplane::open`] made the link.
    link_counters: Option<LinkCounters>,
    /// The DPDK device under the link, if any ([`Dataplane::port_stats`]).
    dev_port: Option<crate::dpdk_link::DevicePort>,
    /// The packet capture, when one runs ([`Dataplane::capture_start`]).
    capture: crate::capture::Capture,
}

impl core::fmt::Debug for Dataplane {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Dataplane")
            .field("ip", &self.ip)
            .field("workers", &self.workers.len())
            .field("inline", &self.inline.is_some())
            .finish()
    }
}

/// 16 bytes from the operating system's randomness (through the standard
/// library's hash seeds) and the clock: the secret of ISNs and SYN cookies.
fn random_key() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut key = [0u8; 16];
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    for (i, chunk) in key.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        h.write_u128(t);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    key
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a panic on another application thread; the
    // state behind it is updated in single statements and stays usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Dataplane {
    /// Opens the dataplane `config` describes, with worker threads. Ports
    /// named `mem:NAME` are in-memory links joined by name within the
    /// process (two dataplanes naming the same link are connected); any
    /// other device string is a DPDK device (a vdev such as `net_ring0` or
    /// `net_af_packet0,iface=veth0`, or a PCI address) on the process's EAL,
    /// started from `eal.args` by the first dataplane that needs it (see
    /// [`crate::dpdk_link::eal_args_for`]).
    pub fn open(config: &Config) -> Result<Dataplane, Error> {
        config.validate()?;
        let port = &config.ports[0];
        let Some(name) = port.device.strip_prefix("mem:") else {
            let args = crate::dpdk_link::eal_args_for(&config.eal.args, &port.device);
            let eal =
                crate::dpdk_link::start_eal(&args).map_err(|e| Error::Device(e.to_string()))?;
            let opts = crate::dpdk_link::DpdkLinkOptions {
                queues: config.workers.count as u16,
                mtu: port.mtu,
                mac: port.mac.map(|m| m.0),
                ..Default::default()
            };
            let link = crate::dpdk_link::DpdkLink::open(&eal, &port.device, &opts)
                .map_err(|e| Error::Device(e.to_string()))?;
            let counters = LinkCounters::Dpdk(link.stats());
            let mut dp = Dataplane::open_with_link(config, link, DriveMode::Threads)?;
            dp.link_counters = Some(counters);
            return Ok(dp);
        };
        let mac = port
            .mac
            .map_or(EthernetAddress([2, 0, 0, 0, 0, 1]), |m| m.0);
        let link_cfg = MemLinkConfig {
            queues: config.workers.count as u16,
            mtu: port.mtu,
            ..MemLinkConfig::default()
        };
        let link = MemLink::named(name, &link_cfg, mac);
        let counters = LinkCounters::Mem(link.stats_handle());
        let mut dp = Dataplane::open_with_link(config, link, DriveMode::Threads)?;
        dp.link_counters = Some(counters);
        Ok(dp)
    }

    /// Opens a dataplane on `link` (its first port), its workers run as
    /// `mode` says.
    pub fn open_with_link<L: Link>(
        config: &Config,
        mut link: L,
        mode: DriveMode,
    ) -> Result<Dataplane, Error> {
        config.validate()?;
        let caps = link.caps().clone();
        let dev_port = link.device();
        let count = config.workers.count;
        if usize::from(caps.queues) < count {
            return Err(Error::InvalidArgument(
                "the port has fewer queues than workers",
            ));
        }
        let port = &config.ports[0];
        let key = random_key();
        let (out_tx, out_rx) = crossbeam_channel::unbounded();
        let forward: Vec<Arc<ArrayQueue<SmallFrame>>> = (0..count)
            .map(|_| Arc::new(ArrayQueue::new(FORWARD_RING)))
            .collect();
        let dispatch = Arc::new(DispatchRings::new(count));
        let wake = IdleWake::set(count);
        let mut mr_sync = MrSyncLinks::mesh(count).into_iter();
        let clock = Clock::new();
        let mut workers = Vec::with_capacity(count);
        let mut inline: Vec<Box<dyn Pollable>> = Vec::new();
        for i in 0..count {
            let queue = link
                .take_queue(i as u16)
                .ok_or(Error::InvalidArgument("port queue unavailable"))?;
            let (ctl_tx, ctl_rx) = crossbeam_channel::unbounded();
            let counters = Arc::new(WorkerCounters::default());
            let setup = WorkerSetup {
                index: i,
                queue,
                caps: caps.clone(),
                config: config.clone(),
                key,
                ctl: ctl_rx,
                out: out_tx.clone(),
                counters: counters.clone(),
                mr_sync: mr_sync
                    .next()
                    .ok_or(Error::InvalidArgument("worker count"))?,
                forward_in: forward[i].clone(),
                forward_out: forward
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .map(|(_, q)| q.clone())
                    .collect(),
                dispatch: dispatch.clone(),
                wake: wake.clone(),
            };
            let thread = match mode {
                DriveMode::Inline => {
                    let mut w = Worker::new(setup);
                    w.set_clock(clock);
                    inline.push(Box::new(w));
                    None
                }
                DriveMode::Threads => {
                    let core = config.workers.cores.get(i).copied();
                    let idle = config.idle;
                    let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
                    let handle = std::thread::Builder::new()
                        .name(format!("iwarp-worker-{i}"))
                        .spawn(move || {
                            if let Some(id) = core {
                                if !core_affinity::set_for_current(core_affinity::CoreId { id }) {
                                    let _ = ready_tx.send(Err(format!("cannot pin to core {id}")));
                                    return;
                                }
                            }
                            let _lcore = match setup.queue.on_worker_thread() {
                                Ok(guard) => guard,
                                Err(m) => {
                                    let _ = ready_tx.send(Err(m));
                                    return;
                                }
                            };
                            let mut w = Worker::new(setup);
                            w.set_clock(clock);
                            let _ = ready_tx.send(Ok(()));
                            // `run` consumes the worker (and its queue)
                            // before the thread's lcore registration goes.
                            w.run(&idle);
                        })
                        .map_err(|e| Error::Thread(e.to_string()))?;
                    match ready_rx.recv_timeout(CONTROL_TIMEOUT) {
                        Ok(Ok(())) => {}
                        Ok(Err(m)) => return Err(Error::Thread(m)),
                        Err(_) => return Err(Error::Thread("worker did not start".into())),
                    }
                    Some(handle)
                }
            };
            workers.push(WorkerHandle {
                ctl: ctl_tx,
                counters,
                thread,
            });
        }
        let l = &config.limits;
        let device = Device::new(DeviceLimits {
            max_mr: l.max_mr,
            max_qp: 1,
            max_cq: 1,
            ..DeviceLimits::default()
        });
        Ok(Dataplane {
            workers,
            wake,
            inline: (mode == DriveMode::Inline).then(|| Mutex::new(inline)),
            events: out_rx,
            control: Mutex::new(Control {
                device,
                pds: Vec::new(),
                pd_release: Vec::new(),
                next_qpn: 1,
                next_cq: 1,
                deregs: HashMap::new(),
                events: VecDeque::new(),
                listening: Vec::new(),
            }),
            ip: port.ip,
            mac: port.mac.map_or(caps.mac, |m| m.0),
            limits: *l,
            next_connect: AtomicUsize::new(0),
            qps: Mutex::new(Vec::new()),
            link_counters: None,
            dev_port,
            capture: crate::capture::Capture::default(),
        })
    }

    /// Our IPv4 address.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// Our MAC address.
    pub fn mac(&self) -> EthernetAddress {
        self.mac
    }

    /// How many workers run.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Memory registrations alive (valid, invalidated, or deregistering
    /// while data in flight still refers to them): what shows that a
    /// long-running service's failed sessions give their buffers back.
    pub fn mr_count(&self) -> u32 {
        lock(&self.control).device.mrs().len()
    }

    /// Each worker's counters, read while it runs.
    pub fn stats(&self) -> Vec<WorkerStats> {
        self.workers.iter().map(|w| w.counters.snapshot()).collect()
    }

    /// [`DriveMode::Inline`]: runs one iteration of every worker's loop;
    /// whether any did work. Does nothing with worker threads.
    pub fn poll(&self) -> bool {
        let Some(inline) = &self.inline else {
            return false;
        };
        let mut ws = lock(inline);
        let mut work = false;
        for w in ws.iter_mut() {
            work |= w.poll();
        }
        work
    }

    fn wait(&self, rx: &Receiver<CtlReply>) -> Result<CtlReply, Error> {
        let deadline = std::time::Instant::now() + CONTROL_TIMEOUT;
        loop {
            match rx.try_recv() {
                Ok(r) => return Ok(r),
                Err(TryRecvError::Disconnected) => return Err(Error::WorkerGone),
                Err(TryRecvError::Empty) => {}
            }
            if self.inline.is_some() {
                self.poll();
            } else {
                match rx.recv_timeout(Duration::from_millis(20)) {
                    Ok(r) => return Ok(r),
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        return Err(Error::WorkerGone)
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                }
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
        }
    }

    /// Wakes worker `w` if it sleeps: a control message was sent to it.
    fn wake_worker(&self, w: usize) {
        if let Some(k) = self.wake.get(w) {
            k.wake();
        }
    }

    /// Sends one control message to worker `w` and waits for its answer.
    fn call(
        &self,
        w: usize,
        make: impl FnOnce(Sender<CtlReply>) -> Ctl,
    ) -> Result<CtlReply, Error> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let h = self.workers.get(w).ok_or(Error::WorkerGone)?;
        h.ctl.send(make(tx)).map_err(|_| Error::WorkerGone)?;
        self.wake_worker(w);
        match self.wait(&rx)? {
            CtlReply::Failed(e) => Err(e),
            r => Ok(r),
        }
    }

    /// Sends a control message to every worker, then waits for every
    /// answer.
    fn broadcast(&self, make: impl Fn(Sender<CtlReply>) -> Ctl) -> Vec<Result<CtlReply, Error>> {
        let rxs: Vec<_> = self
            .workers
            .iter()
            .enumerate()
            .map(|(w, h)| {
                let (tx, rx) = crossbeam_channel::bounded(1);
                let sent = h.ctl.send(make(tx));
                self.wake_worker(w);
                sent.map(|()| rx).map_err(|_| Error::WorkerGone)
            })
            .collect();
        rxs.into_iter()
            .map(|rx| match self.wait(&rx?)? {
                CtlReply::Failed(e) => Err(e),
                r => Ok(r),
            })
            .collect()
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, Error> {
        let mut c = lock(&self.control);
        // Domains released while still in use go now if they can.
        for id in c.pd_release.clone() {
            let _ = self.dealloc_pd_locked(&mut c, ProtectionDomain { id });
        }
        let id = c.device.alloc_pd()?;
        c.pds.push(id);
        Ok(ProtectionDomain { id })
    }

    /// Frees a protection domain (`ibv_dealloc_pd`): refused with
    /// `Busy` while a memory registration, a shared receive queue or a
    /// queue pair still alive (held by the application or by a worker's
    /// connection) belongs to it. A long-running service makes a domain
    /// per session and gives it back here, so the table never fills.
    pub fn dealloc_pd(&self, pd: ProtectionDomain) -> Result<(), Error> {
        let mut c = lock(&self.control);
        self.dealloc_pd_locked(&mut c, pd)
    }

    /// Frees `pd` as soon as nothing belongs to it any more: now if
    /// possible, otherwise at a later [`Dataplane::alloc_pd`] (queue
    /// pairs held by connections that are still closing, and
    /// deregistrations waiting for data in flight, end on their own). What
    /// a session that is over calls instead of waiting for its objects.
    pub fn release_pd(&self, pd: ProtectionDomain) {
        let mut c = lock(&self.control);
        if !c.pds.contains(&pd.id) || c.pd_release.contains(&pd.id) {
            return;
        }
        if self.dealloc_pd_locked(&mut c, pd).is_err() {
            c.pd_release.push(pd.id);
        }
    }

    fn dealloc_pd_locked(&self, c: &mut Control, pd: ProtectionDomain) -> Result<(), Error> {
        if !c.pds.contains(&pd.id) {
            return Err(Error::Verbs(VerbsError::InvalidPd));
        }
        {
            let mut reg = lock(&self.qps);
            reg.retain(|w| w.strong_count() > 0);
            if reg
                .iter()
                .any(|w| w.upgrade().is_some_and(|q| q.attr.pd == pd.id))
            {
                return Err(Error::Verbs(VerbsError::Busy));
            }
        }
        // Memory registrations and SRQs are counted by the device.
        c.device.dealloc_pd(pd.id)?;
        c.pds.retain(|&p| p != pd.id);
        c.pd_release.retain(|&p| p != pd.id);
        Ok(())
    }

    /// Creates a completion queue of `cqe` entries (`ibv_create_cq`).
    pub fn create_cq(&self, cqe: u32) -> Result<Cq, Error> {
        if cqe == 0 || cqe > self.limits.max_cqe {
            return Err(Error::InvalidArgument("cqe"));
        }
        let mut c = lock(&self.control);
        let id = c.next_cq;
        c.next_cq += 1;
        Ok(Cq {
            inner: Arc::new(CqShared {
                ring: ArrayQueue::new(cqe as usize),
                id,
            }),
        })
    }

    /// Creates a queue pair in `pd` whose completions go to `send_cq` and
    /// `recv_cq` (`ibv_create_qp`). It is bound to a worker by
    /// [`Dataplane::connect`] or [`Dataplane::accept`].
    pub fn create_qp(
        &self,
        pd: ProtectionDomain,
        send_cq: &Cq,
        recv_cq: &Cq,
        opts: QpOptions,
    ) -> Result<Qp, Error> {
        self.create_qp_with_srq(pd, send_cq, recv_cq, None, opts)
    }

    /// [`Dataplane::create_qp`] whose receives come from `srq` (of the
    /// same protection domain) when given: the queue pair then takes no
    /// receives of its own, and `max_recv_wr` / `max_recv_sge` are
    /// ignored.
    pub fn create_qp_with_srq(
        &self,
        pd: ProtectionDomain,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        opts: QpOptions,
    ) -> Result<Qp, Error> {
        let opts = match srq {
            Some(s) => QpOptions {
                max_recv_wr: 0,
                max_recv_sge: s.inner.max_sge,
                ..opts
            },
            None => opts,
        };
        let l = &self.limits;
        let sge_ok = |n: u32| n <= MAX_SGE as u32;
        if opts.max_send_wr == 0
            || opts.max_send_wr > l.max_qp_wr
            || opts.max_recv_wr > l.max_qp_wr
            || !sge_ok(opts.max_send_sge)
            || !sge_ok(opts.max_recv_sge)
            || opts.max_ord > 128
            || opts.max_ird > 128
        {
            return Err(Error::Verbs(VerbsError::InvalidValue));
        }
        let mut c = lock(&self.control);
        if !c.pds.contains(&pd.id) {
            return Err(Error::Verbs(VerbsError::InvalidPd));
        }
        if srq.is_some_and(|s| s.inner.pd != pd.id || s.inner.destroyed.load(Ordering::Acquire)) {
            return Err(Error::Verbs(VerbsError::InvalidSrq));
        }
        // The limit is on queue pairs alive at once (held by the
        // application or by a worker's connection), not on how many were
        // ever made: a service makes new ones for every client.
        let mut reg = lock(&self.qps);
        reg.retain(|w| w.strong_count() > 0);
        if reg.len() >= l.max_qp as usize {
            return Err(Error::Verbs(VerbsError::TableFull));
        }
        // Numbers are not reused while the counter lasts; after it wraps,
        // one still in use is skipped (0 is never given).
        let in_use = |n: u32| {
            reg.iter()
                .any(|w| w.upgrade().is_some_and(|q| q.qpn.0 == n))
        };
        let mut n = c.next_qpn.max(1);
        while in_use(n) {
            n = n.checked_add(1).unwrap_or(1);
        }
        c.next_qpn = n.checked_add(1).unwrap_or(1);
        let qpn = QpNum(n);
        let attr = QpInitAttr {
            pd: pd.id,
            send_cq: CqId(send_cq.id()),
            recv_cq: CqId(recv_cq.id()),
            srq: srq.map(|s| s.inner.id),
            max_send_wr: opts.max_send_wr,
            max_recv_wr: opts.max_recv_wr,
            max_send_sge: opts.max_send_sge,
            max_recv_sge: opts.max_recv_sge,
            max_ord: opts.max_ord,
            max_ird: opts.max_ird,
            sq_sig_all: opts.sq_sig_all,
        };
        let qp = Qp {
            inner: Arc::new(QpShared {
                qpn,
                attr,
                sq: ArrayQueue::new(opts.max_send_wr as usize),
                rq: ArrayQueue::new(opts.max_recv_wr.max(1) as usize),
                send_cq: send_cq.inner.clone(),
                recv_cq: recv_cq.inner.clone(),
                srq: srq.map(|s| s.inner.clone()),
                status: AtomicU8::new(QpStatus::Idle as u8),
                worker: AtomicUsize::new(UNBOUND),
                wake: self.wake.clone(),
                counters: QpCounters::default(),
                connection: Mutex::new(None),
            }),
        };
        reg.push(Arc::downgrade(&qp.inner));
        if EventScope::scope_qps() > 2 * reg.len() + 64 {
            let alive: HashSet<u32> = reg
                .iter()
                .filter_map(Weak::upgrade)
                .map(|q| q.qpn.0)
                .collect();
            EventScope::forget_qps(|n| alive.contains(&n));
        }
        drop(reg);
        drop(c);
        EventScope::claim_qp(qpn);
        Ok(qp)
    }

    /// Registers `len` bytes of `region` from `offset` in `pd` with
    /// `access` (`ibv_reg_mr`): the STag is valid on every worker when
    /// this returns. Tagged offsets are virtual addresses.
    pub fn reg_mr(
        &self,
        pd: ProtectionDomain,
        region: &Region,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegistration, Error> {
        match offset.checked_add(len) {
            Some(end) if len > 0 && end <= region.len() => {}
            _ => return Err(Error::Memory(MemoryError::OutOfBounds)),
        }
        let mut c = lock(&self.control);
        if !c.pds.contains(&pd.id) {
            return Err(Error::Verbs(VerbsError::InvalidPd));
        }
        let span = MemSpan::new(region.handle(), offset as u64, len as u64);
        let iova = region.addr() + offset as u64;
        let stag = c.device.reg_mr(pd.id, span, iova, access)?;
        let results = self.broadcast(|reply| Ctl::RegMr {
            stag,
            pd: pd.id,
            region: region.clone(),
            offset: offset as u64,
            len: len as u64,
            iova,
            access,
            reply,
        });
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            // Undo on the workers that took it (none pins it yet).
            let _ = self.broadcast(|reply| Ctl::DeregMr { stag, reply });
            let _ = c.device.dereg_mr(stag);
            return Err(e);
        }
        EventScope::claim_stag(stag);
        Ok(MemoryRegistration {
            stag,
            addr: iova,
            len: len as u64,
            region: region.clone(),
            offset,
        })
    }

    /// Deregisters (`ibv_dereg_mr`). [`DeregStatus::Pending`] while data
    /// in flight (an unacknowledged FPDU, a Read Response) still refers to
    /// the memory: the STag is dead at once, and
    /// [`CmEvent::MrDeregistered`] says when the memory is free.
    pub fn dereg_mr(&self, mr: &MemoryRegistration) -> Result<DeregStatus, Error> {
        let mut c = lock(&self.control);
        let stag = mr.stag;
        let mut pending = 0;
        for r in self.broadcast(|reply| Ctl::DeregMr { stag, reply }) {
            if let CtlReply::Dereg(DeregStatus::Pending) = r? {
                pending += 1;
            }
        }
        if pending == 0 {
            c.device.dereg_mr(stag)?;
            Ok(DeregStatus::Done)
        } else {
            c.deregs.insert(stag.0, pending);
            Ok(DeregStatus::Pending)
        }
    }

    /// Creates a shared receive queue of `max_wr` receives of up to
    /// `max_sge` SGEs in `pd` (`ibv_create_srq`); queue pairs use it through
    /// [`Dataplane::create_qp_with_srq`], on any worker.
    pub fn create_srq(
        &self,
        pd: ProtectionDomain,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Srq, Error> {
        let mut c = lock(&self.control);
        if !c.pds.contains(&pd.id) {
            return Err(Error::Verbs(VerbsError::InvalidPd));
        }
        let attr = SrqInitAttr {
            max_wr,
            max_sge,
            srq_limit: 0,
        };
        // The control path's device checks the limits and numbers it; the
        // buffers live in the ring below.
        let id = c.device.create_srq(pd.id, attr)?.id();
        Ok(Srq {
            inner: Arc::new(SrqShared {
                id,
                pd: pd.id,
                max_sge,
                ring: ArrayQueue::new(max_wr as usize),
                limit: AtomicU32::new(0),
                limit_reached: AtomicBool::new(false),
                destroyed: AtomicBool::new(false),
            }),
        })
    }

    /// Destroys a shared receive queue (`ibv_destroy_srq`): refused with
    /// `Busy` while a queue pair created on it is alive (held by the
    /// application or by a worker's connection that is still closing), as
    /// [`Dataplane::dealloc_pd`] is. Receives still posted are dropped
    /// without completions, later posts fail with
    /// [`PostError::InvalidState`], and its slot in the device's table
    /// (and its hold on the protection domain) is given back, so that a
    /// service that makes one per session never runs out.
    pub fn destroy_srq(&self, srq: &Srq) -> Result<(), Error> {
        let mut c = lock(&self.control);
        if srq.inner.destroyed.load(Ordering::Acquire) {
            return Err(Error::Verbs(VerbsError::InvalidSrq));
        }
        {
            let mut reg = lock(&self.qps);
            reg.retain(|w| w.strong_count() > 0);
            if reg.iter().any(|w| {
                w.upgrade()
                    .is_some_and(|q| q.attr.srq == Some(srq.inner.id))
            }) {
                return Err(Error::Verbs(VerbsError::Busy));
            }
        }
        c.device.destroy_srq(srq.inner.id).map_err(|e| match e {
            VerbsError::Busy => VerbsError::Busy,
            _ => VerbsError::InvalidSrq,
        })?;
        srq.inner.destroyed.store(true, Ordering::Release);
        while srq.inner.ring.pop().is_some() {}
        // A domain released while the queue held it may go now.
        for id in c.pd_release.clone() {
            let _ = self.dealloc_pd_locked(&mut c, ProtectionDomain { id });
        }
        Ok(())
    }

    /// Allocates a fast-register region of up to `max_len` bytes of
    /// `region` in `pd` (`ib_alloc_mr`): its STag is known, invalid, to
    /// every worker when this returns.
    pub fn alloc_mr(
        &self,
        pd: ProtectionDomain,
        region: &Region,
        max_len: u64,
    ) -> Result<FastRegMr, Error> {
        if max_len == 0 || max_len > region.len() as u64 {
            return Err(Error::Memory(MemoryError::OutOfBounds));
        }
        let mut c = lock(&self.control);
        if !c.pds.contains(&pd.id) {
            return Err(Error::Verbs(VerbsError::InvalidPd));
        }
        let stag = c.device.alloc_mr(pd.id, max_len)?;
        let results = self.broadcast(|reply| Ctl::AllocMr {
            stag,
            pd: pd.id,
            max_len,
            region: region.clone(),
            reply,
        });
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            let handle = region.handle();
            let _ = self.broadcast(|reply| Ctl::DeallocMr {
                stag,
                region: handle,
                reply,
            });
            let _ = c.device.dereg_mr(stag);
            return Err(e);
        }
        EventScope::claim_stag(stag);
        Ok(FastRegMr {
            stag,
            pd: pd.id,
            max_len,
            region: region.clone(),
        })
    }

    /// Frees a fast-register region (`ib_dereg_mr`), whatever its state:
    /// as [`Dataplane::dereg_mr`], [`DeregStatus::Pending`] while data in
    /// flight still refers to its memory, then
    /// [`CmEvent::MrDeregistered`].
    pub fn dealloc_mr(&self, mr: &FastRegMr) -> Result<DeregStatus, Error> {
        let mut c = lock(&self.control);
        let (stag, handle) = (mr.stag, mr.region.handle());
        let mut pending = 0;
        for r in self.broadcast(|reply| Ctl::DeallocMr {
            stag,
            region: handle,
            reply,
        }) {
            if let CtlReply::Dereg(DeregStatus::Pending) = r? {
                pending += 1;
            }
        }
        if pending == 0 {
            c.device.dereg_mr(stag)?;
            Ok(DeregStatus::Done)
        } else {
            c.deregs.insert(stag.0, pending);
            Ok(DeregStatus::Pending)
        }
    }

    /// Listens for connections on `port` on every worker (the passive
    /// side's connection lands on the worker its packets reach). Listening
    /// on a port this dataplane listens on already changes nothing and is
    /// not an error: a server that takes one client after another may call
    /// it before each (requests that arrive in between stay queued).
    pub fn listen(&self, port: u16, backlog: usize) -> Result<(), Error> {
        let mut c = lock(&self.control);
        if c.listening.contains(&port) {
            return Ok(());
        }
        for r in self.broadcast(|reply| Ctl::Listen {
            port,
            backlog,
            reply,
        }) {
            r?;
        }
        c.listening.push(port);
        Ok(())
    }

    fn check_params(p: &ConnectParams) -> Result<(), Error> {
        if p.private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::InvalidArgument("private data longer than 252 bytes"));
        }
        Ok(())
    }

    fn conn_params(p: &ConnectParams) -> ConnParams {
        ConnParams {
            ird: p.ird,
            ord: p.ord,
            private_data: p.private_data.clone(),
        }
    }

    /// Opens a connection from `qp` to `remote` (`rdma_connect`). The QP
    /// goes to the next worker in turn; [`CmEvent::Established`],
    /// [`CmEvent::Rejected`] or [`CmEvent::ConnectFailed`] follows.
    pub fn connect(
        &self,
        qp: &Qp,
        remote: SocketAddrV4,
        params: &ConnectParams,
    ) -> Result<(), Error> {
        Dataplane::check_params(params)?;
        if qp.status() != QpStatus::Idle || qp.worker().is_some() {
            return Err(Error::QpInUse);
        }
        let w = self.next_connect.fetch_add(1, Ordering::Relaxed) % self.workers.len();
        let _c = lock(&self.control);
        self.call(w, |reply| Ctl::Connect {
            qp: qp.inner.clone(),
            remote,
            params: Dataplane::conn_params(params),
            reply,
        })?;
        Ok(())
    }

    /// Accepts `req` on `qp` (`rdma_accept`): the QP is bound to the
    /// worker that owns the connection, and [`CmEvent::Established`]
    /// follows.
    pub fn accept(
        &self,
        req: &ConnectRequest,
        qp: &Qp,
        params: &ConnectParams,
    ) -> Result<(), Error> {
        Dataplane::check_params(params)?;
        if qp.status() != QpStatus::Idle || qp.worker().is_some() {
            return Err(Error::QpInUse);
        }
        let _c = lock(&self.control);
        self.call(req.worker, |reply| Ctl::Accept {
            conn: req.conn,
            qp: qp.inner.clone(),
            params: Dataplane::conn_params(params),
            reply,
        })?;
        Ok(())
    }

    /// Refuses `req` with `private_data` (`rdma_reject`).
    pub fn reject(&self, req: &ConnectRequest, private_data: &[u8]) -> Result<(), Error> {
        if private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::InvalidArgument("private data longer than 252 bytes"));
        }
        let _c = lock(&self.control);
        self.call(req.worker, |reply| Ctl::Reject {
            conn: req.conn,
            private_data: private_data.to_vec(),
            reply,
        })?;
        Ok(())
    }

    /// Ends `qp`'s connection: TCP is closed after what is queued
    /// (`abort`: reset at once). [`CmEvent::Disconnected`] follows.
    pub fn disconnect(&self, qp: &Qp, abort: bool) -> Result<(), Error> {
        let w = qp
            .worker()
            .ok_or(Error::InvalidArgument("queue pair not connected"))?;
        let h = self.workers.get(w).ok_or(Error::WorkerGone)?;
        h.ctl
            .send(Ctl::Disconnect {
                qpn: qp.num(),
                abort,
            })
            .map_err(|_| Error::WorkerGone)
    }

    fn take_msg(&self, c: &mut Control, msg: WorkerMsg) {
        match msg {
            WorkerMsg::Event(e) => {
                if let CmEvent::Established { qp, info } = &e {
                    self.record_connection(*qp, info);
                }
                c.events.push_back(e)
            }
            WorkerMsg::MrReleased { stag } => {
                let left = c.deregs.get_mut(&stag.0).map(|n| {
                    *n -= 1;
                    *n
                });
                if left == Some(0) {
                    c.deregs.remove(&stag.0);
                    let _ = c.device.dereg_mr(stag);
                    c.events.push_back(CmEvent::MrDeregistered(stag));
                }
            }
        }
    }

    /// The next connection-management event, if any (within the calling
    /// thread's [`EventScope`], if it has one).
    pub fn poll_event(&self) -> Option<CmEvent> {
        if EventScope::active() {
            return self.poll_event_where(EventScope::claims);
        }
        let mut c = lock(&self.control);
        while let Ok(msg) = self.events.try_recv() {
            self.take_msg(&mut c, msg);
        }
        c.events.pop_front()
    }

    /// The first queued event `want` takes, if any; the others stay queued
    /// in their order.
    pub fn poll_event_where(&self, want: impl Fn(&CmEvent) -> bool) -> Option<CmEvent> {
        let mut c = lock(&self.control);
        while let Ok(msg) = self.events.try_recv() {
            self.take_msg(&mut c, msg);
        }
        let i = c.events.iter().position(want)?;
        c.events.remove(i)
    }

    /// Waits up to `timeout` for the next event (running the workers in
    /// [`DriveMode::Inline`]), within the calling thread's
    /// [`EventScope`], if it has one.
    pub fn wait_event(&self, timeout: Duration) -> Option<CmEvent> {
        self.wait_event_where(timeout, |e| !EventScope::active() || EventScope::claims(e))
    }

    /// Waits up to `timeout` until an event `want` takes is queued, and
    /// leaves it there (for a caller that hands the event to code that
    /// waits for it itself); whether one is.
    pub fn await_event_where(&self, timeout: Duration, want: impl Fn(&CmEvent) -> bool) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            {
                let mut c = lock(&self.control);
                while let Ok(msg) = self.events.try_recv() {
                    self.take_msg(&mut c, msg);
                }
                if c.events.iter().any(&want) {
                    return true;
                }
            }
            if !self.wait_for_events(deadline) {
                return false;
            }
        }
    }

    /// One step of an event wait: false once `deadline` has passed;
    /// otherwise drives an inline worker once, or takes the next event
    /// message if one arrives within 20 ms (or by the deadline).
    fn wait_for_events(&self, deadline: std::time::Instant) -> bool {
        let now = std::time::Instant::now();
        if now >= deadline {
            return false;
        }
        if self.inline.is_some() {
            self.poll();
        } else if let Ok(msg) = self
            .events
            .recv_timeout((deadline - now).min(Duration::from_millis(20)))
        {
            let mut c = lock(&self.control);
            self.take_msg(&mut c, msg);
        }
        true
    }

    /// Waits up to `timeout` for the first event `want` takes; the others
    /// stay queued.
    pub fn wait_event_where(
        &self,
        timeout: Duration,
        want: impl Fn(&CmEvent) -> bool,
    ) -> Option<CmEvent> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.poll_event_where(&want) {
                return Some(e);
            }
            if !self.wait_for_events(deadline) {
                return None;
            }
        }
    }
}

impl Dataplane {
    fn record_connection(&self, qpn: QpNum, info: &ConnectionInfo) {
        let reg = lock(&self.qps);
        if let Some(q) = reg.iter().filter_map(Weak::upgrade).find(|q| q.qpn == qpn) {
            *lock(&q.connection) = Some(info.clone());
        }
    }

    /// The port's own counters (the link's, below the workers), as name
    /// and value, where the link keeps any: a DPDK port's receive drops,
    /// linearized chains and zero-copy attachments, an in-memory link's
    /// frames and drops. Empty for a link given to
    /// [`Dataplane::open_with_link`].
    pub fn link_stats(&self) -> Vec<(&'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        match &self.link_counters {
            None => Vec::new(),
            Some(LinkCounters::Dpdk(s)) => vec![
                ("rx_linearized", g(&s.rx_linearized)),
                ("rx_dropped", g(&s.rx_dropped)),
                ("tx_attached", g(&s.tx_attached)),
                ("tx_copied", g(&s.tx_copied)),
                ("tx_cksum_offloaded", g(&s.tx_cksum_offloaded)),
                ("tx_split", g(&s.tx_split)),
                ("mem_registered", g(&s.mem_registered)),
                ("mem_dma_mapped", g(&s.mem_dma_mapped)),
                ("mem_register_failed", g(&s.mem_register_failed)),
                ("mem_not_registered", g(&s.mem_not_registered)),
            ],
            Some(LinkCounters::Mem(h)) => {
                let s = h.get();
                vec![
                    ("tx_frames", g(&s.tx_frames)),
                    ("tx_bytes", g(&s.tx_bytes)),
                    ("lost", g(&s.lost)),
                    ("rx_no_buffer", g(&s.rx_no_buffer)),
                    ("rx_ring_full", g(&s.rx_ring_full)),
                ]
            }
        }
    }

    /// The device counters of each DPDK port under the dataplane (its
    /// first and only port today), read now: what the NIC or its driver
    /// counted, including frames dropped before any worker saw them
    /// (`rx_missed`, `rx_nombuf`, errors). Empty for an in-memory link,
    /// which has no device; its software counters are in
    /// [`Dataplane::link_stats`]. Called from the control path (a control
    /// socket, a metrics scrape): it takes nothing a worker waits on.
    pub fn port_stats(&self) -> Vec<crate::dpdk_link::DevicePortStats> {
        self.dev_port.iter().map(|d| d.read()).collect()
    }

    /// Every live queue pair (one the application still holds), in order
    /// of creation, with the figures its worker last published.
    pub fn qp_snapshots(&self) -> Vec<QpSnapshot> {
        let live: Vec<Arc<QpShared>> = lock(&self.qps).iter().filter_map(Weak::upgrade).collect();
        live.iter()
            .map(|q| {
                let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
                let worker = q.worker.load(Ordering::Acquire);
                QpSnapshot {
                    qpn: q.qpn,
                    worker: (worker != UNBOUND).then_some(worker),
                    status: QpStatus::from_u8(q.status.load(Ordering::Acquire)),
                    connection: lock(&q.connection).clone(),
                    bytes_sent: g(&q.counters.bytes_sent),
                    bytes_received: g(&q.counters.bytes_received),
                    retransmits: g(&q.counters.retransmits),
                    outstanding_reads: g(&q.counters.outstanding_reads),
                }
            })
            .collect()
    }

    /// Resets the connections of the live queue pairs the calling thread
    /// created in its [`EventScope`] (none without one): what a server
    /// thread does after a failed session whose objects it no longer
    /// holds, so that no connection it made stays up; how many it reset.
    pub fn abort_scope_connections(&self) -> usize {
        let live: Vec<Arc<QpShared>> = lock(&self.qps).iter().filter_map(Weak::upgrade).collect();
        live.into_iter()
            .filter(|q| EventScope::owns_qp(q.qpn))
            .map(|inner| Qp { inner })
            .filter(|q| matches!(q.status(), QpStatus::Connected | QpStatus::Connecting))
            .filter(|q| self.disconnect(q, true).is_ok())
            .count()
    }

    /// Ends the connection of every live queue pair that has one or is
    /// setting one up (`abort`: reset at once), as a service does before
    /// it stops; how many it asked to end.
    pub fn disconnect_all(&self, abort: bool) -> usize {
        let live: Vec<Arc<QpShared>> = lock(&self.qps).iter().filter_map(Weak::upgrade).collect();
        live.into_iter()
            .map(|inner| Qp { inner })
            .filter(|q| matches!(q.status(), QpStatus::Connected | QpStatus::Connecting))
            .filter(|q| self.disconnect(q, abort).is_ok())
            .count()
    }
}

/// Where [`Dataplane::link_stats`] reads.
#[derive(Debug)]
enum LinkCounters {
    Dpdk(Arc<crate::dpdk_link::DpdkLinkStats>),
    Mem(crate::link::MemLinkStatsHandle),
}

// ---------------------------------------------------------------------
// Event scopes.
// ---------------------------------------------------------------------

/// What the calling thread's scope claims.
#[derive(Debug, Default)]
struct ScopeState {
    ports: Vec<u16>,
    qps: HashSet<u32>,
    stags: HashSet<u32>,
}

thread_local! {
    static EVENT_SCOPE: RefCell<Option<ScopeState>> = const { RefCell::new(None) };
}

/// While alive, the calling thread's [`Dataplane::poll_event`] and
/// [`Dataplane::wait_event`] return only the events it claims: connection
/// requests to its ports, events of the queue pairs it created and
/// deregistrations of the memory it registered (STag index), on this
/// thread while the scope lives. Other events stay queued for the threads
/// they belong to. Scopes do not nest: a new one replaces the thread's
/// current one until it is dropped.
#[derive(Debug)]
pub struct EventScope {
    previous: Option<ScopeState>,
    /// Tied to its thread.
    _thread: core::marker::PhantomData<*const ()>,
}

impl EventScope {
    /// A scope on this thread claiming connection requests to `ports`.
    pub fn enter(ports: &[u16]) -> EventScope {
        let state = ScopeState {
            ports: ports.to_vec(),
            ..ScopeState::default()
        };
        let previous = EVENT_SCOPE.with(|s| s.borrow_mut().replace(state));
        EventScope {
            previous,
            _thread: core::marker::PhantomData,
        }
    }

    fn active() -> bool {
        EVENT_SCOPE.with(|s| s.borrow().is_some())
    }

    /// Whether the calling thread's scope (if any) claims `e`.
    fn claims(e: &CmEvent) -> bool {
        EVENT_SCOPE.with(|s| {
            let s = s.borrow();
            let Some(s) = s.as_ref() else {
                return true;
            };
            match e {
                CmEvent::ConnectRequest(r) => s.ports.contains(&r.local_port),
                CmEvent::Established { qp, .. }
                | CmEvent::Rejected { qp, .. }
                | CmEvent::ConnectFailed { qp, .. }
                | CmEvent::Disconnected { qp, .. } => s.qps.contains(&qp.0),
                CmEvent::MrDeregistered(stag) => s.stags.contains(&(stag.0 >> 8)),
            }
        })
    }

    fn owns_qp(qpn: QpNum) -> bool {
        EVENT_SCOPE.with(|s| s.borrow().as_ref().is_some_and(|s| s.qps.contains(&qpn.0)))
    }

    /// Forgets the numbers of queue pairs that are gone, so that a
    /// long-lived scope stays small.
    fn forget_qps(alive: impl Fn(u32) -> bool) {
        EVENT_SCOPE.with(|s| {
            if let Some(s) = s.borrow_mut().as_mut() {
                s.qps.retain(|&n| alive(n));
            }
        });
    }

    fn scope_qps() -> usize {
        EVENT_SCOPE.with(|s| s.borrow().as_ref().map_or(0, |s| s.qps.len()))
    }

    fn claim_qp(qpn: QpNum) {
        EVENT_SCOPE.with(|s| {
            if let Some(s) = s.borrow_mut().as_mut() {
                s.qps.insert(qpn.0);
            }
        });
    }

    fn claim_stag(stag: Stag) {
        EVENT_SCOPE.with(|s| {
            if let Some(s) = s.borrow_mut().as_mut() {
                // By index: a fast-register STag's key may change.
                s.stags.insert(stag.0 >> 8);
            }
        });
    }
}

impl Drop for EventScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        EVENT_SCOPE.with(|s| *s.borrow_mut() = previous);
    }
}

impl Dataplane {
    /// Stops the dataplane as dropping it does, and returns the workers'
    /// final counters: connections still up are closed with a FIN and
    /// their FIN exchanges run to the end for at most
    /// `tcp.close_linger_ms` before what is still open is reset
    /// ([`WorkerStats::shutdown_resets`] counts those).
    pub fn stop(mut self) -> Vec<WorkerStats> {
        self.stop_workers();
        self.stats()
    }

    /// Asks every worker to stop and waits until each has closed its
    /// connections (see [`Dataplane::stop`]); a second call finds nothing
    /// left to do.
    fn stop_workers(&mut self) {
        for (i, w) in self.workers.iter().enumerate() {
            let _ = w.ctl.send(Ctl::Shutdown);
            self.wake_worker(i);
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
        if let Some(inline) = &self.inline {
            for w in lock(inline).iter_mut() {
                w.shutdown();
            }
        }
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        self.stop_workers();
    }
}

// ---------------------------------------------------------------------
// Packet capture.
// ---------------------------------------------------------------------

impl Dataplane {
    /// Starts capturing every frame each worker receives and transmits
    /// into the pcap file `path` (created, or truncated), written by a
    /// thread of its own off the workers' path (see [`crate::capture`]).
    /// Start it before the connections to look at: Wireshark recognises
    /// MPA from the connection's MPA request. One capture at a time.
    pub fn capture_start(
        &self,
        path: &std::path::Path,
        opts: &crate::capture::CaptureOptions,
    ) -> Result<(), Error> {
        let taps: Vec<&crate::capture::CaptureTap> =
            self.workers.iter().map(|w| &w.counters.capture).collect();
        self.capture
            .start(&taps, path, opts)
            .map_err(Error::Capture)
    }

    /// Stops the capture: waits for each worker to let go of its ring
    /// (running the loops meanwhile in [`DriveMode::Inline`]), writes what
    /// the rings hold, closes the file, and says per worker how many
    /// frames were written and how many were dropped for want of a slot.
    pub fn capture_stop(&self) -> Result<crate::capture::CaptureSummary, Error> {
        let taps: Vec<&crate::capture::CaptureTap> =
            self.workers.iter().map(|w| &w.counters.capture).collect();
        self.capture
            .stop(&taps, || {
                self.poll();
            })
            .map_err(Error::Capture)
    }

    /// Whether a capture runs.
    pub fn capturing(&self) -> bool {
        self.capture.running()
    }
}
