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
//!   ([`Dataplane::poll`]) for deterministic tests, and
//!   [`Dataplane::busy_poll`] lets an application thread take the workers
//!   from their threads for a while and drive them itself ([`BusyPoll`]:
//!   run to completion, no hand-off between threads).
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
//! (`crossbeam` `ArrayQueue`): no lock, no system call.
//! [`Qp::post_send_list`] and [`Qp::post_recv_list`] post a list with one
//! wake-up of the worker, [`Cq::poll`] takes completions in batches, and
//! unsignalled requests that succeed make no completion at all. The control path
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
//!
//! # Files
//!
//! This file holds [`Dataplane`] itself; `handles` the objects' handles
//! and their posting and polling, `control` the control plane's
//! allocation of protection domains, STags and queue-pair numbers and the
//! calls that create objects, `cm` connection management and the event
//! channel ([`EventScope`]), `bringup` opening and stopping, `observe`
//! counters, snapshots and packet capture, `busy` busy polling. What the API shares with the
//! workers (messages, CM events, queue pairs' rings) is in `crate::ctl`.

use core::net::Ipv4Addr;
use core::time::Duration;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use crossbeam_channel::Receiver;
use tcp_offload::wire::EthernetAddress;

pub use rdmap::engine::{SetupFailure, TerminateOrigin};
pub use rdmap::error::TerminateCause;
pub use rdmap::mpa::{NegotiationError, RejectReason, RtrType};
pub use rdmap::verbs::{
    Access, DeregStatus, FastReg, PdId, PostError, QpNum, RecvWr, SendFlags, SendOp, SendWr, Sge,
    SgeList, Stag, WcOpcode, WcStatus, WorkCompletion,
};

pub use crate::memory::Region;
pub use crate::worker::{Clock, ManualTime};

pub use crate::ctl::{
    printable, CmEvent, ConnectFailure, ConnectRequest, ConnectionInfo, DisconnectReason, Error,
    QpStatus, RefusedRequest,
};
use crate::ctl::{IdleWake, WorkerMsg};

mod bringup;
mod busy;
mod cm;
mod control;
mod handles;
mod observe;
mod registry;

use bringup::{Pollable, WorkerHandle};
pub use busy::BusyPoll;
pub use cm::{ConnectParams, EventScope};
use control::{lock, Control};
pub use handles::{
    local_invalidate_wr, Cq, FastRegMr, MemoryRegistration, ProtectionDomain, Qp, QpOptions, Srq,
    MAX_RD_ATOM,
};
pub use observe::QpSnapshot;

/// How long the control path waits for a worker's answer.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Private data an application may send in an MPA request, reply or
/// reject (revision 2: 256 bytes in all, less the IRD/ORD words).
pub const MAX_PRIVATE_DATA: usize = 252;

/// Who runs the workers' loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriveMode {
    /// One thread per worker (pinned if cores are configured).
    Threads,
    /// The caller, through [`Dataplane::poll`] (and while a control call
    /// waits for a worker): deterministic, single-threaded.
    Inline,
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
    /// `tcp.max_connections`: each worker's connection table.
    max_connections: usize,
    next_connect: AtomicUsize,
    /// Every queue pair created, for the control path's snapshots (locked
    /// on creation and when read, never by a worker).
    qps: Mutex<registry::QpRegistry>,
    /// Threads that hold a [`BusyPoll`] (locked when one is taken or
    /// dropped and by control calls, never on the data path).
    busy_threads: Mutex<Vec<std::thread::ThreadId>>,
    /// The port's own counters, when [`Dataplane::open`] made the link.
    link_counters: Option<Box<dyn crate::link::LinkStats>>,
    /// The device under the link, if any ([`Dataplane::port_stats`]).
    dev_port: Option<Box<dyn crate::link::DeviceStats>>,
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

impl Dataplane {
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

    /// The sizes of the verbs tables (the configuration's `limits`).
    pub fn limits(&self) -> &crate::config::LimitsConfig {
        &self.limits
    }

    /// Connections each worker's table holds (`tcp.max_connections`),
    /// half-open ones and those in TIME-WAIT included.
    pub fn max_connections(&self) -> usize {
        self.max_connections
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
}
