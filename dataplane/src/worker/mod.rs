//! The poll-mode worker: one per core, owning one queue of the port and
//! every connection whose packets arrive on it, running the whole
//! pipeline to completion with no lock and no system call.
//!
//! # One iteration of the loop ([`Worker::poll`])
//!
//! 1. Control messages from the application's control path (listen,
//!    connect, accept, reject, memory registration), at most
//!    [`CTL_PER_POLL`], and the STag changes other workers made (fast
//!    registration, local and remote invalidation), at most
//!    [`MR_SYNC_PER_POLL`]: see "STag replicas" below.
//! 2. RX burst of at most [`RX_BURST`] frames; each goes to
//!    `tcp-offload`'s [`Interface::handle_frame_with`] by reference (the
//!    TCP engine keeps out-of-order data in the received buffers), with the
//!    device's checksum verdicts ([`LinkQueue::rx_checksum`]): checksums
//!    the device found good are not summed again. ARP frames
//!    are also forwarded to the other workers (a NIC steers them to queue
//!    0 only, and every worker keeps its own neighbour table). On a port
//!    that cannot steer TCP flows to queues ([`LinkCaps::rss`] is `None`)
//!    with several workers, each TCP frame whose connection another worker
//!    owns is handed to it over that worker's dispatch ring (the buffer
//!    itself moves, nothing is copied; counted, and dropped when the ring
//!    is full); then the frames other workers handed over, at most
//!    [`DISPATCH_PER_POLL`]. The owner is [`Rss::queue_of_frame`] under
//!    [`Rss::round_robin`] over the workers, the function the active side
//!    picks its local port with, so each connection stays on its opener,
//!    and a passive one on the worker its SYN names (whose listener takes
//!    it, and whose QP is bound there at accept).
//! 3. TCP and ARP timers.
//! 4. New passive connections ([`ACCEPT_PER_POLL`]): their MPA request is
//!    gathered and reported to the application, which accepts or rejects.
//! 5. Each connection: TCP events (an acknowledged record goes back to
//!    the engine with `record_acked`, returning its pin and completing
//!    Sends and Writes); in-order payload to `Endpoint::handle_stream` (at
//!    most [`MAX_CHUNKS_PER_POLL`] chunks); work requests from the QP's
//!    submission rings ([`MAX_POSTS_PER_POLL`]); records from
//!    `Endpoint::poll_record(send_capacity)` into TCP
//!    ([`MAX_FPDUS_PER_POLL`]); engine events; completions to the CQ
//!    rings.
//! 6. TX: ARP and ICMP frames, then TCP segments built in parts — headers
//!    written into the frame, the FPDU's length field and DDP/RDMAP
//!    headers appended, the payload *attached* from the registered region
//!    (copied on ports without multi-segment transmit, or when markers cut
//!    it up), pad and CRC appended; the TCP checksum summed from the
//!    record's pieces unless the port offloads it. At most [`TX_BURST`]
//!    frames, then one TX burst.
//!
//! A record is queued in TCP until acknowledged; retransmissions rebuild
//! their frames from it (the region stays pinned). Records TCP drops on a
//! reset come back through [`FpduRecord`]'s `Drop` and return their pins.
//! Without checksum offload a retransmission sums its payload again from
//! the region rather than reuse the record's stored sum, so that a buffer
//! the application changed before its completion reaches the peer's MPA
//! CRC check instead of stalling in its TCP (`FpduRecord::tx_sum`).
//!
//! # STag replicas
//!
//! Every worker checks peers' STags against its own copy of the STag table
//! (no lock on the data path); the control path's table in
//! `crate::api` allocates the STags and the workers mirror its
//! registrations before `reg_mr` returns. Fast registration and local
//! invalidation are work requests, and a Send with Invalidate arrives on a
//! connection: all three change an STag's state on the one worker that
//! runs them. That worker then sends the change to every other worker's
//! replica ring (`MrSyncLinks`) and holds the completion that reports
//! it (and every later completion of that queue pair) until each of them
//! has applied it, so once the application sees an invalidation complete,
//! no worker will place a byte or answer a Read through the old
//! registration. A fast registration or local invalidation the application
//! did not signal is signalled to the engine all the same, and its
//! completion dropped once the others have it. Two workers changing the
//! same STag at once (concurrent work requests on one STag through queue
//! pairs on different workers, which the verbs leave to the consumer to
//! order) end with the change each worker received last.
//!
//! Shared receive queues: a queue pair attached to one takes each receive
//! buffer from the application's multi-consumer ring when a Send begins
//! (`rdmap::verbs::RecvSupply`), so the worker that pops a buffer owns it
//! and no worker holds buffers another one needs.
//!
//! # Idle back-off
//!
//! A worker that finds nothing to do for `idle.spin` iterations in a row
//! sleeps `idle.sleep_us` between polls until work comes back; with
//! `idle.yield_cpu` each empty iteration before that gives the processor
//! to any other runnable thread (where workers share cores with each
//! other or with the application, a spinning worker otherwise holds the
//! core that the thread it waits for needs). Workers ask the kernel for a
//! fine timer slack, so that a sleep of 20 µs is not one of 70. A
//! sleeping worker says so in a flag it shares with the application: the
//! thread that posts it a work request or a control message wakes it (one
//! system call, and only when it sleeps); frames arriving from the
//! network cannot, so they wait for the sleep to end.
//!
//! Allocation happens at connection setup and on the slow path (control
//! messages, connection requests, ARP holds), never per packet: received
//! buffers come from the port's pool, frames are reused, records carry
//! their headers inline.

use core::cell::{Cell, RefCell};
use core::net::{Ipv4Addr, SocketAddrV4};
use core::ops::Range;
use core::time::Duration;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use crossbeam_queue::ArrayQueue;
use rdmap::engine::{Endpoint, EngineEvent, Env, OutRecord, Piece, SetupFailure};
use rdmap::mpa::{FrameKind, FrameRepr, RtrSet, RtrType};
use rdmap::placement::{MemSpan, RegionHandle};
use rdmap::verbs::{
    AccessError, MrTable, SendFlags, SendOp, SharedReceiveQueue, SrqInitAttr, VerbsError, WcOpcode,
    WcStatus,
};
use rdmap::verbs::{
    CompletionQueue, CqId, DeregStatus, Device, DeviceLimits, MrEvent, PdId, QpInitAttr, QpNum,
    QueuePair, RecvWr, SendWr, Stag, WorkCompletion,
};
use tcp_offload::iface::{FrameParts, Interface, InterfaceConfig};
use tcp_offload::tcp::{self, ConnId, Event, Record, Stack, StackError};
use tcp_offload::wire::checksum;
use tcp_offload::Instant;

use crate::config::{Config, IdleConfig};
pub use crate::ctl::SmallFrame;
use crate::ctl::{
    CmEvent, ConnParams, ConnectFailure, ConnectRequest, ConnectionInfo, Ctl, CtlReply,
    DisconnectReason, DispatchRings, Error, IdleWake, MrOp, MrSync, QpShared, QpStatus, SrqSupply,
    WorkerMsg, MR_SYNC_RING,
};
use crate::link::{FrameFull, LinkCaps, LinkQueue, TxFrame};
use crate::memory::{MemoryTable, Region, RegionSlice};
use crate::steer::Rss;

/// Frames taken from the RX queue per iteration: DPDK's customary burst,
/// enough to amortise the ring access, small enough that the burst's
/// buffers stay in L1/L2 while the pipeline runs over them.
pub const RX_BURST: usize = 32;

/// Frames built per iteration before one TX burst: the same reasoning as
/// [`RX_BURST`], and it bounds how long RX waits behind a sending
/// connection.
pub const TX_BURST: usize = 32;

/// Records (FPDUs, one TCP segment each) one connection may queue per
/// iteration: about 90 KB at a 1500-byte MTU, so one bulk sender cannot
/// keep the worker from its other connections and its RX queue.
pub const MAX_FPDUS_PER_POLL: usize = 64;

/// In-order payload chunks handed to one connection's endpoint per
/// iteration (each chunk is one received segment's payload). What is left
/// waits in TCP, whose window then closes: back-pressure, not loss.
pub const MAX_CHUNKS_PER_POLL: usize = 128;

/// Work requests drained from one QP's submission rings per iteration.
pub const MAX_POSTS_PER_POLL: usize = 64;

/// Control messages handled per iteration: the control path never stalls
/// the data path for long.
pub const CTL_PER_POLL: usize = 8;

/// New passive connections taken per listening port per iteration.
pub const ACCEPT_PER_POLL: usize = 16;

/// The pause between polls of a stopping worker with nothing to do while
/// it waits for its connections' FIN exchanges to finish.
const SHUTDOWN_NAP: Duration = Duration::from_micros(50);

/// How often the counters that are sums over connections (retransmits,
/// drops) are published.
pub const STATS_PERIOD: Duration = Duration::from_millis(1);

/// Room for the Ethernet, IPv4 and TCP headers of one segment (14 + 60 +
/// 60, rounded up).
const HDR_BUF: usize = 160;

/// Longest MPA request kept while it is gathered: the header and the
/// largest private data a peer may send (RFC 5044 §7.1, 512 bytes).
const MAX_REQUEST: usize = rdmap::mpa::frame::HEADER_LEN + rdmap::mpa::frame::MAX_PRIVATE_DATA_RECV;

/// STag changes from other workers applied per iteration (the ring is
/// drained in a few iterations even when full).
pub const MR_SYNC_PER_POLL: usize = 64;

/// Handed-over frames a worker takes from its dispatch ring per
/// iteration: two bursts, so that one other worker receiving everything
/// (a port delivering on queue 0 only) cannot outrun it.
pub const DISPATCH_PER_POLL: usize = 2 * RX_BURST;

// The dispatch ring holds thirty-two receive bursts.
const _: () = assert!(crate::ctl::DISPATCH_RING == 32 * RX_BURST);

// ---------------------------------------------------------------------
// Time.
// ---------------------------------------------------------------------

/// The worker's clock: microseconds since the dataplane started, as the
/// sans-IO engines take time. `std::time::Instant` reads the vDSO clock
/// (no system call); a TSC-based clock can replace it behind this type.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: std::time::Instant,
}

impl Clock {
    /// A clock whose epoch is now.
    pub fn new() -> Clock {
        Clock {
            origin: std::time::Instant::now(),
        }
    }

    /// Time since the epoch.
    pub fn now(&self) -> Instant {
        Instant::from_micros(u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX))
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

/// The QP engine's time is a `Duration` since the same epoch.
fn engine_time(now: Instant) -> Duration {
    Duration::from_micros(now.total_micros())
}

// ---------------------------------------------------------------------
// Counters.
// ---------------------------------------------------------------------

/// Counters of one worker, written by it alone and readable by anyone
/// while it runs (relaxed atomics: each value is exact, values are not
/// mutually consistent snapshots).
#[derive(Debug, Default)]
pub struct WorkerCounters {
    /// Frames received.
    pub rx_packets: AtomicU64,
    /// Bytes of those frames.
    pub rx_bytes: AtomicU64,
    /// Frames transmitted.
    pub tx_packets: AtomicU64,
    /// Bytes of those frames.
    pub tx_bytes: AtomicU64,
    /// Frames that took the slow path: ARP, ICMP, TCP with SYN, FIN or
    /// RST, anything not TCP.
    pub punts: AtomicU64,
    /// TCP segments retransmitted (summed over connections every
    /// [`STATS_PERIOD`]).
    pub retransmits: AtomicU64,
    /// TCP segments dropped by PAWS (RFC 7323 §5.3; TSval more than one
    /// tick behind TS.Recent, see [`tcp_offload::tcp::PAWS_WINDOW`]),
    /// summed over connections every [`STATS_PERIOD`]. A steady rise on a
    /// path that reorders means the peer's timestamps run backwards.
    pub paws_drops: AtomicU64,
    /// Connections reset when the dataplane stopped because their FIN
    /// exchange had not finished within `tcp.close_linger_ms` (the peer
    /// did not acknowledge our FIN, or did not close its side).
    pub shutdown_resets: AtomicU64,
    /// Frames dropped: malformed or not for us on receive, no buffer or no
    /// room on transmit, unresolved neighbours (published every
    /// [`STATS_PERIOD`]).
    pub drops: AtomicU64,
    /// Streams ended by a Terminate, sent or received.
    pub terminates: AtomicU64,
    /// ARP frames forwarded to other workers.
    pub forwarded: AtomicU64,
    /// Connections currently owned.
    pub connections: AtomicU64,
    /// Loop iterations.
    pub loops: AtomicU64,
    /// Times the idle back-off slept.
    pub idle_sleeps: AtomicU64,
    /// Sleeps an application thread cut short by posting work or a
    /// control message (see "Idle back-off" in the module documentation).
    pub idle_wakeups: AtomicU64,
    /// Payload bytes the TX path read from registered memory to sum a TCP
    /// checksum (ports without checksum offload) because no sum from the
    /// record's CRC pass covered them: with the MPA CRC on this stays at
    /// zero unless the CRC is off, markers cut the payload, or a record
    /// no longer fits one segment (after an MSS shrink).
    pub tx_summed_bytes: AtomicU64,
    /// Payload bytes summed again from registered memory for a segment
    /// that the record's stored sum would have covered, because that sum
    /// was already used once: a retransmission, which carries whatever the
    /// application's buffer holds by then and must be summed from it (see
    /// the module documentation). Zero on ports that offload the checksum.
    pub tx_resummed_bytes: AtomicU64,
    /// Retransmissions whose payload, summed again, no longer matched the
    /// sum taken when the record was built: the application changed the
    /// buffer of a posted Send or Write before its completion, or the
    /// source of a Read being answered. A lower bound (a change that keeps the 16-bit sum goes
    /// unseen); the peer's MPA CRC check is what ends such a stream.
    pub tx_payload_changed: AtomicU64,
    /// Frames queued for transmit whose payload was copied into the frame
    /// because the link lacks multi-segment transmit ([`LinkCaps::multi_seg_tx`]:
    /// af_xdp in DPDK 22.11): zero on links that take payload by reference.
    ///
    /// [`LinkCaps::multi_seg_tx`]: crate::link::LinkCaps::multi_seg_tx
    pub tx_copied_frames: AtomicU64,
    /// Received TCP frames handed to the worker that owns their connection
    /// (on a port that cannot steer flows to queues, the software
    /// dispatcher).
    pub dispatched_out: AtomicU64,
    /// Frames other workers handed to this one.
    pub dispatched_in: AtomicU64,
    /// Frames dropped because the owner's dispatch ring was full.
    pub dispatch_drops: AtomicU64,
    /// The worker's packet-capture point, armed by the control path
    /// ([`crate::capture`]); it rides here as the other state a worker
    /// shares with the control path.
    pub capture: crate::capture::CaptureTap,
}

/// A copy of [`WorkerCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// See [`WorkerCounters::rx_packets`].
    pub rx_packets: u64,
    /// See [`WorkerCounters::rx_bytes`].
    pub rx_bytes: u64,
    /// See [`WorkerCounters::tx_packets`].
    pub tx_packets: u64,
    /// See [`WorkerCounters::tx_bytes`].
    pub tx_bytes: u64,
    /// See [`WorkerCounters::punts`].
    pub punts: u64,
    /// See [`WorkerCounters::retransmits`].
    pub retransmits: u64,
    /// See [`WorkerCounters::paws_drops`].
    pub paws_drops: u64,
    /// See [`WorkerCounters::shutdown_resets`].
    pub shutdown_resets: u64,
    /// See [`WorkerCounters::drops`].
    pub drops: u64,
    /// See [`WorkerCounters::terminates`].
    pub terminates: u64,
    /// See [`WorkerCounters::forwarded`].
    pub forwarded: u64,
    /// See [`WorkerCounters::connections`].
    pub connections: u64,
    /// See [`WorkerCounters::loops`].
    pub loops: u64,
    /// See [`WorkerCounters::idle_sleeps`].
    pub idle_sleeps: u64,
    /// See [`WorkerCounters::idle_wakeups`].
    pub idle_wakeups: u64,
    /// See [`WorkerCounters::tx_summed_bytes`].
    pub tx_summed_bytes: u64,
    /// See [`WorkerCounters::tx_resummed_bytes`].
    pub tx_resummed_bytes: u64,
    /// See [`WorkerCounters::tx_payload_changed`].
    pub tx_payload_changed: u64,
    /// See [`WorkerCounters::tx_copied_frames`].
    pub tx_copied_frames: u64,
    /// See [`WorkerCounters::dispatched_out`].
    pub dispatched_out: u64,
    /// See [`WorkerCounters::dispatched_in`].
    pub dispatched_in: u64,
    /// See [`WorkerCounters::dispatch_drops`].
    pub dispatch_drops: u64,
}

impl WorkerCounters {
    /// The current values.
    pub fn snapshot(&self) -> WorkerStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerStats {
            rx_packets: g(&self.rx_packets),
            rx_bytes: g(&self.rx_bytes),
            tx_packets: g(&self.tx_packets),
            tx_bytes: g(&self.tx_bytes),
            punts: g(&self.punts),
            retransmits: g(&self.retransmits),
            paws_drops: g(&self.paws_drops),
            shutdown_resets: g(&self.shutdown_resets),
            drops: g(&self.drops),
            terminates: g(&self.terminates),
            forwarded: g(&self.forwarded),
            connections: g(&self.connections),
            loops: g(&self.loops),
            idle_sleeps: g(&self.idle_sleeps),
            idle_wakeups: g(&self.idle_wakeups),
            tx_summed_bytes: g(&self.tx_summed_bytes),
            tx_resummed_bytes: g(&self.tx_resummed_bytes),
            tx_payload_changed: g(&self.tx_payload_changed),
            tx_copied_frames: g(&self.tx_copied_frames),
            dispatched_out: g(&self.dispatched_out),
            dispatched_in: g(&self.dispatched_in),
            dispatch_drops: g(&self.dispatch_drops),
        }
    }
}

/// Whether two partial sums of the same bytes' positions fold to the same
/// one's-complement value (0 and 0xffff are both zero).
fn same_sum(a: u32, b: u32) -> bool {
    let norm = |s: u32| match checksum::fold(s) {
        0xffff => 0,
        v => v,
    };
    norm(a) == norm(b)
}

/// Whether a connection in `state` still has a close to finish: TIME-WAIT
/// has exchanged and acknowledged both FINs.
fn is_open(state: tcp::State) -> bool {
    !matches!(state, tcp::State::Closed | tcp::State::TimeWait)
}

/// Adds to a counter only this worker writes: a plain load and store
/// (no locked instruction on the data path).
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

// ---------------------------------------------------------------------
// Control path messages.
// ---------------------------------------------------------------------

// ---------------------------------------------------------------------
// STag replicas (see the module documentation).
// ---------------------------------------------------------------------

/// `applied[receiver * n + sender]`, the last sequence number applied.
#[derive(Debug)]
struct MrAcks {
    n: usize,
    applied: Box<[AtomicU64]>,
}

impl MrAcks {
    fn slot(&self, receiver: usize, sender: usize) -> &AtomicU64 {
        &self.applied[receiver * self.n + sender]
    }
}

/// A worker's links to the other workers' STag replicas: its own ring
/// (multi-producer: every other worker pushes), the others' rings, and
/// the shared table of what has been applied.
///
/// Changes from one worker reach a ring in the order that worker made
/// them (per-peer outboxes keep the order when a ring is full), so "the
/// peer applied sequence number `s`" means it applied every earlier one.
#[derive(Debug)]
pub(crate) struct MrSyncLinks {
    index: usize,
    inbox: Arc<ArrayQueue<MrSync>>,
    peers: Vec<(usize, Arc<ArrayQueue<MrSync>>)>,
    outbox: Vec<VecDeque<MrSync>>,
    acks: Arc<MrAcks>,
    next_seq: u64,
}

impl MrSyncLinks {
    /// The links of `n` workers, all allocated now.
    pub(crate) fn mesh(n: usize) -> Vec<MrSyncLinks> {
        let inboxes: Vec<_> = (0..n)
            .map(|_| Arc::new(ArrayQueue::new(MR_SYNC_RING)))
            .collect();
        let acks = Arc::new(MrAcks {
            n,
            applied: (0..n * n).map(|_| AtomicU64::new(0)).collect(),
        });
        (0..n)
            .map(|i| MrSyncLinks {
                index: i,
                inbox: inboxes[i].clone(),
                peers: (0..n)
                    .filter(|&j| j != i)
                    .map(|j| (j, inboxes[j].clone()))
                    .collect(),
                outbox: (1..n)
                    .map(|_| VecDeque::with_capacity(MR_SYNC_RING))
                    .collect(),
                acks: acks.clone(),
                next_seq: 0,
            })
            .collect()
    }

    /// Sends `op` to every other worker; returns its sequence number, to
    /// wait for with [`MrSyncLinks::acked`].
    fn broadcast(&mut self, op: MrOp) -> u64 {
        self.next_seq += 1;
        let m = MrSync {
            from: self.index,
            seq: self.next_seq,
            op,
        };
        for q in &mut self.outbox {
            q.push_back(m);
        }
        self.flush();
        self.next_seq
    }

    /// Moves what waits in the outboxes into the peers' rings, in order,
    /// as far as they have room.
    fn flush(&mut self) {
        for ((_, ring), q) in self.peers.iter().zip(self.outbox.iter_mut()) {
            while let Some(&m) = q.front() {
                if ring.push(m).is_err() {
                    break;
                }
                q.pop_front();
            }
        }
    }

    /// Whether every other worker has applied change `seq` of this one.
    fn acked(&self, seq: u64) -> bool {
        self.peers
            .iter()
            .all(|&(j, _)| self.acks.slot(j, self.index).load(Ordering::Acquire) >= seq)
    }

    /// Applies the other workers' changes to this worker's table (at most
    /// [`MR_SYNC_PER_POLL`]); whether there were any.
    fn apply_incoming(&mut self, mrs: &mut MrTable) -> bool {
        let mut n = 0;
        while n < MR_SYNC_PER_POLL {
            let Some(m) = self.inbox.pop() else {
                break;
            };
            n += 1;
            match m.op {
                MrOp::FastRegister { fr, pd } => {
                    if mrs.fast_register(&fr, pd) == Err(AccessError::InvalidOperation) {
                        // Registered here meanwhile (see the module docs):
                        // the replica takes the change it received last.
                        if let Some(cur) = mrs.query_mr(fr.stag).map(|i| i.stag) {
                            let _ = mrs.invalidate_local(cur, pd);
                            let _ = mrs.fast_register(&fr, pd);
                        }
                    }
                }
                MrOp::Invalidate { stag, pd } => {
                    // It passed the stricter check where it ran; an STag
                    // already invalid here stays so.
                    let _ = mrs.invalidate_local(stag, pd);
                }
            }
            // Release: the table above is updated before the sender can
            // see the acknowledgement (and complete the work request).
            self.acks
                .slot(self.index, m.from)
                .store(m.seq, Ordering::Release);
        }
        n > 0
    }
}

/// A fast registration or local invalidation posted to a queue pair, in
/// send-queue order, until its completion comes out of the engine.
#[derive(Debug, Clone, Copy)]
struct LocalOp {
    wr_id: u64,
    op: MrOp,
    /// The application asked for a completion on success.
    signalled: bool,
}

/// A completion held until every other worker has applied STag change
/// `seq` (`None`: an unsignalled change, nothing to deliver).
#[derive(Debug, Clone, Copy)]
struct Hold {
    seq: u64,
    wc: Option<(WorkCompletion, bool)>,
}

/// The request the engine runs for `wr`, and what to replicate when it
/// completes: a fast registration or local invalidation is always
/// signalled to the engine (its completion is where the worker learns the
/// outcome), and a fast registration naming memory this worker does not
/// know (not registered with `Dataplane::alloc_mr` or
/// `reg_mr`) is made to fail with a local protection error.
fn prepare_local(wr: &SendWr, attr: &QpInitAttr, mem: &MemoryTable) -> (SendWr, Option<LocalOp>) {
    let pd = attr.pd;
    let (op, mr_op) = match wr.op {
        SendOp::FastRegister(mut fr) => {
            if mem.get(fr.mem.region).is_none() {
                // Longer than any fast-register region: refused by the
                // table's own check.
                fr.mem.len = u64::MAX;
            }
            (SendOp::FastRegister(fr), MrOp::FastRegister { fr, pd })
        }
        SendOp::LocalInvalidate { stag } => (wr.op, MrOp::Invalidate { stag, pd }),
        _ => return (*wr, None),
    };
    let local = LocalOp {
        wr_id: wr.wr_id,
        op: mr_op,
        signalled: attr.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
    };
    let wr = SendWr {
        op,
        flags: wr.flags | SendFlags::SIGNALED,
        ..*wr
    };
    (wr, Some(local))
}

// ---------------------------------------------------------------------
// Records and frames.
// ---------------------------------------------------------------------

/// A record TCP dropped unacknowledged, waiting to return its pin.
#[derive(Debug)]
struct Dropped {
    owner: Owner,
    record: OutRecord,
}

/// Which worker and connection a record belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    worker: u64,
    conn: ConnId,
}

thread_local! {
    /// Records dropped by TCP on this thread (a reset or timeout clears
    /// the send queue). Workers on the thread take theirs back each
    /// iteration. Touched only on teardown.
    static DROPPED: RefCell<Vec<Dropped>> = const { RefCell::new(Vec::new()) };
}

/// An FPDU (or MPA frame bytes) as a TCP record: the engine's
/// [`OutRecord`], whose payload is a pinned range of a region, and a
/// handle on that region so that frames can attach or copy it.
#[derive(Debug)]
pub struct FpduRecord {
    rec: Option<OutRecord>,
    len: usize,
    region: Option<Region>,
    markers: bool,
    owner: Owner,
    /// The record's stored payload sum ([`OutRecord::payload_sum`]) went
    /// into a segment's checksum once; later segments sum the payload
    /// from memory ([`FpduRecord::tx_sum`]).
    stored_sum_spent: Cell<bool>,
}

/// The payload sum of one TCP segment cut from a record, and where it came
/// from ([`FpduRecord::tx_sum`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct SegmentSum {
    /// The Internet checksum's partial sum of the segment's record bytes.
    sum: u32,
    /// Payload bytes read from memory because no stored sum covered them
    /// ([`WorkerCounters::tx_summed_bytes`]).
    read: usize,
    /// Payload bytes read from memory although the stored sum covered
    /// them, because it was already spent
    /// ([`WorkerCounters::tx_resummed_bytes`]).
    resummed: usize,
    /// The bytes summed again no longer match the stored sum
    /// ([`WorkerCounters::tx_payload_changed`]).
    changed: bool,
    /// The stored sum went into this segment.
    used_stored: bool,
}

/// A piece of a record within a range: bytes it holds, or payload at an
/// offset of its region.
enum Chunk<'a> {
    Bytes(&'a [u8]),
    Payload { offset: usize, len: usize },
}

impl FpduRecord {
    fn new(rec: OutRecord, mem: &MemoryTable, owner: Owner) -> FpduRecord {
        let region = rec
            .payload()
            .and_then(|p| mem.get(p.range().region()))
            .cloned();
        let markers = rec.layout().is_some_and(|l| l.markers().next().is_some());
        FpduRecord {
            len: rec.len(),
            rec: Some(rec),
            region,
            markers,
            owner,
            stored_sum_spent: Cell::new(false),
        }
    }

    /// The engine's record, to give back.
    fn take(mut self) -> Option<OutRecord> {
        self.rec.take()
    }

    /// Calls `f` with each piece of the record inside `range`, and the
    /// piece's offset from `range.start`.
    fn walk<E>(
        &self,
        range: Range<usize>,
        mut f: impl FnMut(usize, Chunk<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let Some(rec) = &self.rec else {
            return Ok(());
        };
        let mut at = 0usize;
        for piece in rec.pieces() {
            let len = piece.len();
            let (lo, hi) = (at.max(range.start), (at + len).min(range.end));
            if lo < hi {
                let (from, n, rel) = (lo - at, hi - lo, lo - range.start);
                match piece {
                    Piece::Bytes(b) => f(rel, Chunk::Bytes(&b[from..from + n]))?,
                    Piece::Marker(m) => f(rel, Chunk::Bytes(&m[from..from + n]))?,
                    Piece::Payload(r) => f(
                        rel,
                        Chunk::Payload {
                            offset: r.offset() as usize + from,
                            len: n,
                        },
                    )?,
                }
            }
            at += len;
            if at >= range.end {
                break;
            }
        }
        Ok(())
    }

    /// The Internet checksum's partial sum of the record bytes in `range`
    /// (the payload of a TCP segment sent in parts), read from the pieces:
    /// header bytes in place, payload from the sum the CRC pass stored
    /// when the segment carries all of it, from the region otherwise.
    pub fn checksum_sum(&self, range: Range<usize>) -> u32 {
        self.sum_range(range, true).sum
    }

    /// The payload sum for the TCP checksum of the segment the transmit
    /// path is building now: the stored sum at most once, then the bytes
    /// themselves.
    ///
    /// The payload is attached from (or copied out of) the application's
    /// registered region each time the segment goes out, so a
    /// retransmission carries whatever the buffer holds then. An
    /// application that changes the buffer of a posted Send or Write
    /// before its completion, or the source of a Read the peer has not yet
    /// seen complete, breaks the verbs contract, but the stream must still
    /// end cleanly: with the stored
    /// sum, the resent bytes would carry a checksum of the old ones, the
    /// peer's TCP would drop every copy as corrupt and the connection
    /// would stall until TCP gave up. Summed afresh, the segment passes
    /// the peer's TCP, and with the MPA CRC on (computed over the old
    /// bytes) the peer's CRC check fails and ends the stream with a
    /// Terminate (RFC 5044 §8, MPA CRC error) that both applications see;
    /// with the CRC off the peer places the new bytes, which the verbs
    /// leave undefined. The first transmission keeps the folded sum (the
    /// fast path): should the buffer have changed between the record's
    /// CRC pass and that transmission, only that one segment is lost.
    ///
    /// A change is counted ([`SegmentSum::changed`]) and nothing else: the
    /// sender does not end the stream itself. RFC 5040 has no Terminate
    /// for a sender's own buffer changing under it, the 16-bit sum misses
    /// some changes (so any action would depend on which loss happened to
    /// force a retransmission), and the peer's CRC check already detects
    /// every change the CRC covers, on every transmission. A buffer
    /// rewritten while its segment is summed and sent can still go out
    /// with a mismatching checksum; the next retransmission sums it again.
    fn tx_sum(&self, range: Range<usize>) -> SegmentSum {
        let s = self.sum_range(range, !self.stored_sum_spent.get());
        if s.used_stored {
            self.stored_sum_spent.set(true);
        }
        s
    }

    /// [`FpduRecord::checksum_sum`] with its sources: the stored sum is
    /// used only when `trust_stored`; otherwise the payload it covers is
    /// summed again and compared with it.
    fn sum_range(&self, range: Range<usize>, trust_stored: bool) -> SegmentSum {
        // The payload as one range of its region, and the sum of it the
        // CRC pass computed (`OutRecord::payload_sum`).
        let stored = self.rec.as_ref().and_then(|rec| {
            let p = rec.payload()?.range();
            Some((p.offset() as usize, p.len() as usize, rec.payload_sum()?))
        });
        let from_region = |offset, len| {
            self.region
                .as_ref()
                .map_or(0, |r: &Region| r.checksum_sum(offset, len))
        };
        let mut out = SegmentSum::default();
        let _ = self.walk::<()>(range, |rel, c| {
            let s = match c {
                Chunk::Bytes(b) => checksum::sum(b),
                Chunk::Payload { offset, len } => match stored {
                    Some((o, l, sum)) if (o, l) == (offset, len) && trust_stored => {
                        out.used_stored = true;
                        sum
                    }
                    Some((o, l, sum)) if (o, l) == (offset, len) => {
                        out.resummed += len;
                        let fresh = from_region(offset, len);
                        out.changed |= !same_sum(fresh, sum);
                        fresh
                    }
                    _ => {
                        out.read += len;
                        from_region(offset, len)
                    }
                },
            };
            out.sum = checksum::combine_at(out.sum, s, rel);
            Ok(())
        });
        out
    }

    /// Appends the record bytes in `range` to `frame`: bytes copied,
    /// payload attached when `attach` (and no markers cut it up), copied
    /// otherwise.
    fn emit<F: TxFrame>(
        &self,
        frame: &mut F,
        range: Range<usize>,
        attach: bool,
    ) -> Result<(), FrameFull> {
        let attach = attach && !self.markers;
        self.walk(range, |_, c| match c {
            Chunk::Bytes(b) => frame.append(b),
            Chunk::Payload { offset, len } => match &self.region {
                Some(region) if attach => frame.attach(RegionSlice {
                    region: region.clone(),
                    offset,
                    len,
                }),
                Some(region) => frame.append_copy(region, offset, len),
                None => frame.append_zeros(len),
            },
        })
    }
}

impl Record for FpduRecord {
    fn len(&self) -> usize {
        self.len
    }

    fn copy_to(&self, offset: usize, dst: &mut [u8]) {
        let end = offset.saturating_add(dst.len());
        let _ = self.walk::<()>(offset..end, |rel, c| {
            match c {
                Chunk::Bytes(b) => dst[rel..rel + b.len()].copy_from_slice(b),
                Chunk::Payload { offset, len } => match &self.region {
                    Some(r) => r.copy_out(offset, &mut dst[rel..rel + len]),
                    None => dst[rel..rel + len].fill(0),
                },
            }
            Ok(())
        });
    }
}

impl Drop for FpduRecord {
    /// TCP dropped the record unacknowledged: its pin goes back through
    /// the worker (a per-thread list it drains each iteration).
    fn drop(&mut self) {
        if let Some(record) = self.rec.take() {
            let owner = self.owner;
            let _ = DROPPED.try_with(|d| d.borrow_mut().push(Dropped { owner, record }));
        }
    }
}

/// What the worker's interface receives: a frame of its own queue, or one
/// forwarded by another worker.
#[derive(Debug)]
pub enum RxFrame<B> {
    /// From the port.
    Nic(B),
    /// From another worker.
    Forwarded(SmallFrame),
}

impl<B: AsRef<[u8]>> AsRef<[u8]> for RxFrame<B> {
    fn as_ref(&self) -> &[u8] {
        match self {
            RxFrame::Nic(b) => b.as_ref(),
            RxFrame::Forwarded(f) => &f.bytes[..usize::from(f.len)],
        }
    }
}

/// Whether a received frame takes the slow path (for the punt counter),
/// and whether it is ARP (to forward it).
fn classify(frame: &[u8]) -> (bool, bool) {
    match frame.get(12..14) {
        Some([0x08, 0x06]) => (true, true),
        Some([0x08, 0x00]) => {
            let Some(&vihl) = frame.get(14) else {
                return (true, false);
            };
            let ihl = usize::from(vihl & 0x0f) * 4;
            if frame.get(23) != Some(&6) {
                return (true, false);
            }
            // SYN, RST or FIN.
            let flags = frame.get(14 + ihl + 13).copied().unwrap_or(0);
            (flags & 0x07 != 0, false)
        }
        _ => (true, false),
    }
}

// ---------------------------------------------------------------------
// Connections.
// ---------------------------------------------------------------------

/// Where a connection stands on the worker.
#[derive(Debug)]
enum Phase {
    /// Passive: gathering the MPA request, until `deadline`.
    AwaitRequest { deadline: Instant },
    /// Passive: reported to the application, waiting for accept or
    /// reject.
    AwaitDecision,
    /// Active: TCP's handshake runs; the endpoint starts when it is done.
    TcpConnecting {
        qp: Box<QueuePair>,
        config: rdmap::mpa::Config,
        private_data: Vec<u8>,
    },
    /// The endpoint runs (setup, data, teardown).
    Running,
}

/// How TCP ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TcpEnd {
    Closed,
    Reset,
    TimedOut,
}

#[derive(Debug)]
struct Conn {
    tcp: ConnId,
    remote: SocketAddrV4,
    local_port: u16,
    phase: Phase,
    ep: Option<Endpoint>,
    /// The application's QP (none for a connection being rejected or not
    /// accepted yet).
    shared: Option<Arc<QpShared>>,
    /// Send-queue completions staged between the engine and the CQ ring
    /// (its id is the QP's send CQ's, as the queue pair checks).
    cq: CompletionQueue,
    /// Receive completions, likewise.
    rcq: CompletionQueue,
    /// Completions a full CQ ring refused; delivered first next time
    /// (with whether they are receive completions).
    backlog: VecDeque<(WorkCompletion, bool)>,
    /// Passive: the MPA request's bytes.
    request: Vec<u8>,
    /// Passive: the application's answer, applied when the engine asks.
    decision: Option<(bool, Vec<u8>)>,
    active: bool,
    established: bool,
    peer_closed: bool,
    peer_close_seen: bool,
    tcp_end: Option<TcpEnd>,
    stream_closed: bool,
    /// The engine reported an orderly close.
    closed_in_order: bool,
    /// The engine asked for TCP to be closed (after an orderly close or a
    /// Terminate).
    close_requested: bool,
    /// The application was told the connection is gone.
    reported_down: bool,
    terminated: Option<DisconnectReason>,
    local_abort: bool,
    /// A send work request the QP could not take yet.
    stash_send: Option<SendWr>,
    stash_recv: Option<RecvWr>,
    /// This worker's end of the QP's shared receive queue: takes each
    /// buffer from the application's ring when a Send begins.
    srq: Option<SharedReceiveQueue>,
    /// Fast registrations and local invalidations in the engine, oldest
    /// first.
    local_ops: VecDeque<LocalOp>,
    /// A completion waiting for the other workers' STag replicas.
    hold: Option<Hold>,
    /// Completions taken out of the engine's bounded CQs while one is
    /// held (so that those cannot overflow meanwhile), not examined yet.
    unexamined: VecDeque<(WorkCompletion, bool)>,
}

impl Conn {
    fn new(tcp: ConnId, remote: SocketAddrV4, local_port: u16, phase: Phase) -> Conn {
        Conn {
            tcp,
            remote,
            local_port,
            phase,
            ep: None,
            shared: None,
            cq: CompletionQueue::new(CqId(0), 1),
            rcq: CompletionQueue::new(CqId(0), 1),
            backlog: VecDeque::new(),
            request: Vec::new(),
            decision: None,
            active: false,
            established: false,
            peer_closed: false,
            peer_close_seen: false,
            tcp_end: None,
            stream_closed: false,
            closed_in_order: false,
            close_requested: false,
            reported_down: false,
            terminated: None,
            local_abort: false,
            stash_send: None,
            stash_recv: None,
            srq: None,
            local_ops: VecDeque::new(),
            hold: None,
            unexamined: VecDeque::new(),
        }
    }

    fn bind(&mut self, shared: Arc<QpShared>) {
        let a = shared.attr;
        // Receives that can complete between two deliveries: those posted
        // to the queue pair, or to its shared receive queue.
        let recvs = shared
            .srq
            .as_ref()
            .map_or(a.max_recv_wr, |s| s.capacity() as u32);
        self.cq = CompletionQueue::new(a.send_cq, a.max_send_wr + 8);
        self.rcq = CompletionQueue::new(a.recv_cq, recvs + 8);
        self.backlog = VecDeque::with_capacity((a.max_send_wr + a.max_recv_wr) as usize + 16);
        // Sends stop draining while a completion is held, so at most two
        // send queues' worth of local operations are ever tracked.
        self.local_ops = VecDeque::with_capacity(2 * a.max_send_wr as usize + 8);
        self.unexamined = VecDeque::with_capacity((a.max_send_wr + recvs) as usize + 16);
        self.srq = match (&shared.srq, a.srq) {
            (Some(srq), Some(id)) => Some(SharedReceiveQueue::with_supply(
                id,
                a.pd,
                SrqInitAttr {
                    max_wr: 1,
                    max_sge: a.max_recv_sge,
                    srq_limit: 0,
                },
                Box::new(SrqSupply::new(srq.clone())),
            )),
            _ => None,
        };
        self.shared = Some(shared);
    }

    fn qp_mut(&mut self) -> Option<&mut QueuePair> {
        match (&mut self.ep, &mut self.phase) {
            (Some(ep), _) => Some(ep.qp_mut()),
            (None, Phase::TcpConnecting { qp, .. }) => Some(&mut **qp),
            _ => None,
        }
    }

    fn set_status(&self, s: QpStatus) {
        if let Some(q) = &self.shared {
            q.set_status(s);
        }
    }

    fn qpn(&self) -> QpNum {
        self.shared.as_ref().map_or(QpNum(0), |q| q.qpn)
    }
}

/// What a connection's service needs from its worker.
struct Cx<'a, B> {
    now: Instant,
    stack: &'a mut Stack<RxFrame<B>, FpduRecord>,
    device: &'a mut Device,
    mem: &'a mut MemoryTable,
    counters: &'a WorkerCounters,
    out: &'a Sender<WorkerMsg>,
    worker: u64,
    index: usize,
    sync: &'a mut MrSyncLinks,
}

impl<B: AsRef<[u8]>> Cx<'_, B> {
    fn event(&self, ev: CmEvent) {
        // The control side has gone only when the dataplane is dropped.
        let _ = self.out.send(WorkerMsg::Event(ev));
    }
}

/// [`env`] for the receive path of a queue pair with a shared receive
/// queue (`srq`): only an incoming Send takes a receive buffer.
fn env_srq<'e>(
    device: &'e mut Device,
    mem: &'e mut MemoryTable,
    cq: &'e mut CompletionQueue,
    rcq: &'e mut CompletionQueue,
    srq: Option<&'e mut SharedReceiveQueue>,
) -> Env<'e, MemoryTable> {
    Env {
        srq,
        ..env(device, mem, cq, rcq)
    }
}

fn env<'e>(
    device: &'e mut Device,
    mem: &'e mut MemoryTable,
    cq: &'e mut CompletionQueue,
    rcq: &'e mut CompletionQueue,
) -> Env<'e, MemoryTable> {
    Env {
        device,
        mem,
        send_cq: cq,
        recv_cq: Some(rcq),
        srq: None,
    }
}

impl Conn {
    /// One pass over the connection; whether it did anything. Sets
    /// `finished` when it can be removed.
    fn service<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>, finished: &mut bool) -> bool {
        let mut work = false;
        let owner = Owner {
            worker: cx.worker,
            conn: self.tcp,
        };
        // TCP events.
        while let Some(ev) = cx.stack.poll_event(self.tcp) {
            work = true;
            match ev {
                Event::Connected => self.tcp_connected(cx),
                Event::RecordAcked(r) => {
                    if let (Some(rec), Some(ep)) = (r.take(), self.ep.as_mut()) {
                        ep.record_acked(
                            rec,
                            &mut env(cx.device, cx.mem, &mut self.cq, &mut self.rcq),
                        );
                    }
                }
                Event::PeerClosed => self.peer_closed = true,
                Event::Closed => self.tcp_end = Some(TcpEnd::Closed),
                Event::Reset => self.tcp_end = Some(TcpEnd::Reset),
                Event::TimedOut => self.tcp_end = Some(TcpEnd::TimedOut),
            }
        }
        // Receives posted before the data arrived must be in the QP before
        // the data is placed: the submission rings are drained first.
        work |= self.drain_posts(cx);
        // In-order payload.
        let now_e = engine_time(cx.now);
        for _ in 0..MAX_CHUNKS_PER_POLL {
            let Some(p) = cx.stack.conn_mut(self.tcp).and_then(|c| c.recv()) else {
                break;
            };
            work = true;
            match (&self.phase, self.ep.as_mut()) {
                (Phase::Running, Some(ep)) => ep.handle_stream(
                    now_e,
                    p.bytes(),
                    &mut env_srq(
                        cx.device,
                        cx.mem,
                        &mut self.cq,
                        &mut self.rcq,
                        self.srq.as_mut(),
                    ),
                ),
                (Phase::AwaitRequest { .. } | Phase::AwaitDecision, _) => {
                    if self.request.len() + p.len() > MAX_REQUEST + 64 {
                        // More than a request: a peer speaking out of turn.
                        self.abort_tcp(cx);
                        break;
                    }
                    self.request.extend_from_slice(p.bytes());
                }
                _ => {}
            }
        }
        if let Phase::AwaitRequest { deadline } = self.phase {
            self.check_request(cx, deadline);
        }
        return_dropped(cx, owner, self.ep.as_mut());
        if let Some(ep) = self.ep.as_mut() {
            if self.peer_closed && !self.peer_close_seen {
                self.peer_close_seen = true;
                ep.handle_peer_closed(&mut env(cx.device, cx.mem, &mut self.cq, &mut self.rcq));
            }
            if self.tcp_end.is_some() && !self.stream_closed {
                self.stream_closed = true;
                ep.handle_stream_closed(&mut env(cx.device, cx.mem, &mut self.cq, &mut self.rcq));
            }
        }
        if let Some(ep) = self.ep.as_mut() {
            if ep.poll_timeout().is_some_and(|t| t <= now_e) {
                ep.handle_timeout(now_e);
            }
        }
        work |= self.drain_posts(cx);
        work |= self.send_records(cx, owner);
        work |= self.engine_events(cx);
        // Events may have queued more (an accept's reply, a Terminate).
        work |= self.send_records(cx, owner);
        work |= self.deliver(cx.sync);
        if self.closed_in_order && !self.reported_down {
            // An orderly close is complete for the application now; TCP
            // may still linger in TIME-WAIT, and the connection stays here
            // until it ends.
            self.reported_down = true;
            self.set_status(QpStatus::Disconnected);
            cx.event(CmEvent::Disconnected {
                qp: self.qpn(),
                reason: DisconnectReason::Closed,
            });
        }
        if let Some(reason) = self.terminated {
            if self.close_requested && self.established && !self.reported_down {
                // A Terminate ended the stream and went out (or came in):
                // the queue pair is in Error, and the application learns it
                // now rather than after TCP's close (TIME-WAIT may last).
                self.reported_down = true;
                self.set_status(QpStatus::Disconnected);
                cx.event(CmEvent::Disconnected {
                    qp: self.qpn(),
                    reason,
                });
            }
        }
        if let Some(end) = self.tcp_end {
            if matches!(self.phase, Phase::TcpConnecting { .. }) {
                cx.event(CmEvent::ConnectFailed {
                    qp: self.qpn(),
                    reason: match end {
                        TcpEnd::TimedOut => ConnectFailure::TimedOut,
                        _ => ConnectFailure::Refused,
                    },
                });
                self.set_status(QpStatus::Disconnected);
            } else if self.established && !self.reported_down {
                let reason = match (self.terminated, end) {
                    (Some(t), _) => t,
                    (None, _) if self.closed_in_order => DisconnectReason::Closed,
                    (None, _) if self.local_abort => DisconnectReason::LocalAbort,
                    (None, TcpEnd::Closed) => DisconnectReason::Closed,
                    (None, TcpEnd::Reset) => DisconnectReason::Reset,
                    (None, TcpEnd::TimedOut) => DisconnectReason::TimedOut,
                };
                self.reported_down = true;
                self.set_status(QpStatus::Disconnected);
                cx.event(CmEvent::Disconnected {
                    qp: self.qpn(),
                    reason,
                });
            }
            // A completion still waiting for the other workers' STag
            // replicas keeps the connection until it is delivered.
            *finished = self.hold.is_none();
        }
        work
    }

    fn tcp_connected<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>) {
        let phase = core::mem::replace(&mut self.phase, Phase::Running);
        let Phase::TcpConnecting {
            qp,
            config,
            private_data,
        } = phase
        else {
            self.phase = phase;
            return;
        };
        match Endpoint::initiator(config, &private_data, *qp, engine_time(cx.now)) {
            Ok(ep) => self.ep = Some(ep),
            Err(_) => {
                cx.event(CmEvent::ConnectFailed {
                    qp: self.qpn(),
                    reason: ConnectFailure::Setup(SetupFailure::StreamClosed),
                });
                self.abort_tcp(cx);
            }
        }
    }

    fn abort_tcp<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>) {
        if let Some(c) = cx.stack.conn_mut(self.tcp) {
            c.abort(cx.now);
        }
    }

    /// Passive: once the request is complete, tell the application; past
    /// the deadline, give up on the peer.
    fn check_request<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>, deadline: Instant) {
        match rdmap::mpa::frame::frame_len(&self.request) {
            Ok(Some(n)) if self.request.len() >= n => {
                match FrameRepr::parse_prefix(&self.request) {
                    Ok((repr, _)) if repr.kind == FrameKind::Request => {
                        cx.event(CmEvent::ConnectRequest(ConnectRequest {
                            worker: cx.index,
                            conn: self.tcp,
                            remote: self.remote,
                            local_port: self.local_port,
                            private_data: repr.private_data.to_vec(),
                            ird: repr.ird_ord.map(|x| x.ird),
                            ord: repr.ird_ord.map(|x| x.ord),
                        }));
                        self.phase = Phase::AwaitDecision;
                    }
                    _ => self.abort_tcp(cx),
                }
            }
            Err(_) => self.abort_tcp(cx),
            _ if cx.now >= deadline => self.abort_tcp(cx),
            _ => {}
        }
    }

    /// Moves work requests from the submission rings into the QP.
    fn drain_posts<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>) -> bool {
        let Some(shared) = self.shared.clone() else {
            return false;
        };
        let attr = shared.attr;
        let mrs = cx.device.mrs();
        let mem = &*cx.mem;
        let mut stash_recv = self.stash_recv.take();
        let mut stash_send = self.stash_send.take();
        // While a completion waits for the other workers' replicas, no
        // new send work starts (it bounds what completes behind it).
        let held = self.hold.is_some();
        let mut local_ops = core::mem::take(&mut self.local_ops);
        let Some(qp) = self.qp_mut() else {
            self.stash_recv = stash_recv;
            self.stash_send = stash_send;
            self.local_ops = local_ops;
            return false;
        };
        let mut n = 0;
        while n < MAX_POSTS_PER_POLL && qp.rq_len() < attr.max_recv_wr as usize {
            let Some(wr) = stash_recv.take().or_else(|| shared.rq.pop()) else {
                break;
            };
            n += 1;
            if qp.post_recv(&wr).is_err() {
                stash_recv = Some(wr);
                break;
            }
        }
        while !held && n < MAX_POSTS_PER_POLL && qp.sq_len() < attr.max_send_wr as usize {
            let Some(wr) = stash_send.take().or_else(|| shared.sq.pop()) else {
                break;
            };
            n += 1;
            let (run, local) = prepare_local(&wr, &attr, mem);
            match qp.post_send(&run, mrs) {
                Ok(_) => local_ops.extend(local),
                Err(rdmap::verbs::PostError::InvalidState | rdmap::verbs::PostError::QueueFull) => {
                    stash_send = Some(wr);
                    break;
                }
                // Checked when posted to the ring; cannot happen.
                Err(_) => {}
            }
        }
        self.stash_recv = stash_recv;
        self.stash_send = stash_send;
        self.local_ops = local_ops;
        n > 0
    }

    /// Queues records while TCP has room.
    fn send_records<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>, owner: Owner) -> bool {
        let Some(ep) = self.ep.as_mut() else {
            return false;
        };
        let mut n = 0;
        while n < MAX_FPDUS_PER_POLL {
            let Some(conn) = cx.stack.conn_mut(self.tcp) else {
                break;
            };
            let cap = conn.send_capacity();
            if cap == 0 {
                break;
            }
            let mut e = env(cx.device, cx.mem, &mut self.cq, &mut self.rcq);
            let Some(rec) = ep.poll_record(cap, &mut e) else {
                break;
            };
            n += 1;
            let rec = FpduRecord::new(rec, cx.mem, owner);
            if let Err((_, rec)) = conn.send_record(cx.now, rec) {
                // Cannot happen (the record fits the capacity asked for);
                // its pin goes back all the same.
                if let Some(r) = rec.take() {
                    ep.record_dropped(r, cx.device);
                }
                break;
            }
        }
        n > 0
    }

    fn engine_events<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>) -> bool {
        let mut work = false;
        while let Some(ev) = self.ep.as_mut().and_then(Endpoint::poll_event) {
            work = true;
            match ev {
                EngineEvent::ConnectRequest => {
                    if let (Some((accept, pd)), Some(ep)) = (self.decision.take(), self.ep.as_mut())
                    {
                        let r = if accept {
                            ep.accept(&pd)
                        } else {
                            ep.reject(&pd)
                        };
                        if r.is_err() {
                            self.abort_tcp(cx);
                        }
                    }
                }
                EngineEvent::Connected(n) => {
                    self.established = true;
                    self.set_status(QpStatus::Connected);
                    cx.event(CmEvent::Established {
                        qp: self.qpn(),
                        info: ConnectionInfo {
                            remote: self.remote,
                            ird: n.ird,
                            ord: n.ord,
                            revision: n.revision,
                            crc: n.framing.crc,
                            markers_rx: n.framing.markers_rx,
                            markers_tx: n.framing.markers_tx,
                            rtr: n.rtr,
                            private_data: n.private_data,
                        },
                    });
                }
                EngineEvent::Rejected(r) => {
                    if self.active {
                        self.set_status(QpStatus::Disconnected);
                        cx.event(CmEvent::Rejected {
                            qp: self.qpn(),
                            private_data: r.private_data,
                        });
                    } else if self.shared.is_some() {
                        // The application accepted, and the negotiator
                        // refused the request all the same (markers, no
                        // RTR in common, CRC required): it learns why.
                        self.set_status(QpStatus::Disconnected);
                        cx.event(CmEvent::ConnectFailed {
                            qp: self.qpn(),
                            reason: ConnectFailure::RequestRefused(r.reason),
                        });
                    }
                }
                EngineEvent::SetupFailed(f) => {
                    if self.shared.is_some() && !self.established {
                        self.set_status(QpStatus::Disconnected);
                        cx.event(CmEvent::ConnectFailed {
                            qp: self.qpn(),
                            reason: ConnectFailure::Setup(f),
                        });
                    }
                }
                EngineEvent::Terminated { cause, origin } => {
                    bump(&cx.counters.terminates, 1);
                    if !matches!(origin, rdmap::engine::TerminateOrigin::Stream) {
                        self.terminated = Some(DisconnectReason::Terminated { cause, origin });
                    }
                }
                EngineEvent::Closed => self.closed_in_order = true,
                EngineEvent::ReadyToClose => {
                    self.close_requested = true;
                    if let Some(c) = cx.stack.conn_mut(self.tcp) {
                        c.close(cx.now);
                    }
                }
            }
        }
        work
    }

    /// Moves completions into the application's CQ rings. A completion
    /// that reports an STag change (a fast registration, a local
    /// invalidation, a Send that invalidated one of our STags) first sends
    /// the change to the other workers, then waits with everything behind
    /// it until they have applied it (see the module documentation).
    fn deliver(&mut self, sync: &mut MrSyncLinks) -> bool {
        let Some(shared) = &self.shared else {
            while self.cq.poll_one().is_some() || self.rcq.poll_one().is_some() {}
            return false;
        };
        let mut n = 0;
        loop {
            if let Some(h) = self.hold {
                if !sync.acked(h.seq) {
                    while let Some(wc) = self.cq.poll_one() {
                        self.unexamined.push_back((wc, false));
                    }
                    while let Some(wc) = self.rcq.poll_one() {
                        self.unexamined.push_back((wc, true));
                    }
                    break;
                }
                self.hold = None;
                n += 1;
                if let Some(entry) = h.wc {
                    self.backlog.push_front(entry);
                }
            }
            // The backlog was examined before it went there.
            let (next, fresh) = match self.backlog.pop_front() {
                Some(e) => (Some(e), false),
                None => (
                    self.unexamined
                        .pop_front()
                        .or_else(|| self.cq.poll_one().map(|wc| (wc, false)))
                        .or_else(|| self.rcq.poll_one().map(|wc| (wc, true))),
                    true,
                ),
            };
            let Some((wc, recv)) = next else {
                break;
            };
            if fresh {
                let ok = wc.status == WcStatus::Success;
                let (change, deliver) = match wc.opcode {
                    WcOpcode::FastRegister | WcOpcode::LocalInvalidate if !recv => {
                        // One per local operation, in send-queue order.
                        let op = self.local_ops.pop_front();
                        debug_assert!(op.map_or(true, |o| o.wr_id == wc.wr_id));
                        let signalled = op.map_or(true, |o| o.signalled);
                        (op.filter(|_| ok).map(|o| o.op), signalled || !ok)
                    }
                    WcOpcode::Recv if ok => (
                        wc.invalidated_stag.map(|stag| MrOp::Invalidate {
                            stag,
                            pd: shared.attr.pd,
                        }),
                        true,
                    ),
                    _ => (None, true),
                };
                if let Some(op) = change {
                    let seq = sync.broadcast(op);
                    if !sync.acked(seq) {
                        self.hold = Some(Hold {
                            seq,
                            wc: deliver.then_some((wc, recv)),
                        });
                        continue;
                    }
                }
                if !deliver {
                    continue;
                }
            }
            let ring = if recv {
                &shared.recv_cq
            } else {
                &shared.send_cq
            };
            if let Err(wc) = ring.push(wc) {
                self.backlog.push_front((wc, recv));
                break;
            }
            n += 1;
        }
        n > 0
    }
}

/// Gives the pins of records TCP dropped for `owner` back to its
/// endpoint (or, if it has none, keeps them until it does).
fn return_dropped<B: AsRef<[u8]>>(cx: &mut Cx<'_, B>, owner: Owner, ep: Option<&mut Endpoint>) {
    let Some(ep) = ep else {
        return;
    };
    let _ = DROPPED.try_with(|d| {
        let mut d = d.borrow_mut();
        if d.is_empty() {
            return;
        }
        let mut i = 0;
        while i < d.len() {
            if d[i].owner == owner {
                let rec = d.swap_remove(i).record;
                ep.record_dropped(rec, cx.device);
            } else {
                i += 1;
            }
        }
    });
}

// ---------------------------------------------------------------------
// The worker.
// ---------------------------------------------------------------------

/// Asks the kernel to wake this thread within a microsecond of a timed
/// sleep's end instead of the default 50 µs, which would more than
/// double the idle back-off's short sleeps. Once per worker thread.
#[cfg(target_os = "linux")]
fn fine_timer_slack() {
    const SLACK_NS: libc::c_ulong = 1_000;
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and changes only
    // the calling thread's timer slack; no memory is passed.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, SLACK_NS, 0, 0, 0) };
}

#[cfg(not(target_os = "linux"))]
fn fine_timer_slack() {}

/// Everything a worker is built from.
#[derive(Debug)]
pub(crate) struct WorkerSetup<Q: LinkQueue> {
    pub index: usize,
    pub queue: Q,
    pub caps: LinkCaps,
    pub config: Config,
    pub key: [u8; 16],
    pub ctl: Receiver<Ctl>,
    pub out: Sender<WorkerMsg>,
    pub counters: Arc<WorkerCounters>,
    pub mr_sync: MrSyncLinks,
    pub forward_in: Arc<ArrayQueue<SmallFrame>>,
    pub forward_out: Vec<Arc<ArrayQueue<SmallFrame>>>,
    pub dispatch: Arc<DispatchRings<Q::RxBuf>>,
    /// Every worker's idle state (this one's at `index`).
    pub wake: Arc<[IdleWake]>,
}

/// MPA defaults of the dataplane.
#[derive(Debug, Clone, Copy)]
struct MpaDefaults {
    crc: rdmap::mpa::CrcPolicy,
    markers: bool,
    rtr: Option<RtrType>,
    timeout: Duration,
    nudge_after: Duration,
    responder_waits: bool,
}

/// One poll-mode worker. See the module documentation.
#[derive(Debug)]
pub struct Worker<Q: LinkQueue> {
    index: usize,
    tag: u64,
    /// Declared (so dropped) before `queue`: buffers still in the rings
    /// go back to the port's pool while a queue still holds it (the last
    /// worker to go frees what is left).
    dispatch: Arc<DispatchRings<Q::RxBuf>>,
    queue: Q,
    caps: LinkCaps,
    iface: Interface<RxFrame<Q::RxBuf>, FpduRecord>,
    device: Device,
    mem: MemoryTable,
    conns: Vec<Option<Conn>>,
    listening: Vec<u16>,
    ctl: Receiver<Ctl>,
    out: Sender<WorkerMsg>,
    counters: Arc<WorkerCounters>,
    clock: Clock,
    rx_batch: Vec<Q::RxBuf>,
    tx_batch: Vec<Q::TxFrame>,
    spare_frame: Option<Q::TxFrame>,
    scratch: Vec<u8>,
    forward_in: Arc<ArrayQueue<SmallFrame>>,
    forward_out: Vec<Arc<ArrayQueue<SmallFrame>>>,
    wake: Arc<[IdleWake]>,
    /// Where the port cannot steer and there are several workers: the
    /// function naming each TCP frame's owner (see the module
    /// documentation).
    dispatch_rss: Option<Rss>,
    /// Deregistrations waiting for pins: the STag (as the control path
    /// names it; a fast-register region's key may have changed since) and
    /// its region.
    dereg_pending: Vec<(Stag, RegionHandle)>,
    /// This worker's links to the other workers' STag replicas.
    mr_sync: MrSyncLinks,
    mpa: MpaDefaults,
    port_cursor: u16,
    retransmits_closed: u64,
    paws_drops_closed: u64,
    /// `tcp.close_linger_ms`: how long [`Worker::shutdown`] lets FIN
    /// exchanges run.
    close_linger: Duration,
    last_publish: Instant,
    local_drops: u64,
    stopping: bool,
    /// The running capture's ring, refreshed once per receive burst.
    capture: crate::capture::TapState,
}

/// Unique tags of workers in this process (records name their owner).
static NEXT_TAG: AtomicU64 = AtomicU64::new(1);

impl<Q: LinkQueue> Worker<Q> {
    pub(crate) fn new(s: WorkerSetup<Q>) -> Worker<Q> {
        let port = &s.config.ports[0];
        let mac = port.mac.map_or(s.caps.mac, |m| m.0);
        let mut ic = InterfaceConfig::new(mac, port.ip, s.key);
        ic.mtu = port.mtu.min(s.caps.mtu);
        ic.tcp = tcp::Config {
            // The MSS follows the port's MTU (jumbo frames included); the
            // interface clamps it to `mtu - 40` as well.
            mss: u16::try_from(ic.mtu.saturating_sub(40)).unwrap_or(u16::MAX),
            sack: s.config.tcp.sack,
            timestamps: s.config.tcp.timestamps,
            recv_buffer: s.config.tcp.recv_buffer,
            ..tcp::Config::default()
        };
        ic.max_connections = s.config.tcp.max_connections;
        let mut iface = Interface::new(ic);
        for n in &port.neighbors {
            iface.add_static_arp(n.ip, n.mac.0);
        }
        let device = Device::new(DeviceLimits {
            max_mr: s.config.limits.max_mr,
            max_qp: 1,
            max_cq: 1,
            max_srq: 1,
            ..DeviceLimits::default()
        });
        let rtr = s.config.mpa_rtr().ok().flatten();
        let frame_len = ic_frame_len(port.mtu);
        let tag = NEXT_TAG.fetch_add(1, Ordering::Relaxed);
        let port_cursor = u16::from_le_bytes([s.key[0], s.key[1]]) ^ (s.index as u16);
        let workers = s.dispatch.rings.len();
        let dispatch_rss = (s.caps.rss.is_none() && workers > 1)
            .then(|| Rss::round_robin(u16::try_from(workers).unwrap_or(u16::MAX)));
        s.counters
            .capture
            .set_frame_cap(ic_frame_len(port.mtu.max(s.caps.mtu)));
        // The TCP checksum's payload sum rides on the CRC pass only where
        // the port cannot compute the checksum itself.
        let sum_with_crc = !s.caps.tx_checksum_offload;
        Worker {
            index: s.index,
            tag,
            caps: s.caps,
            queue: s.queue,
            iface,
            device,
            mem: MemoryTable::with_sum_with_crc(sum_with_crc),
            conns: Vec::new(),
            listening: Vec::new(),
            ctl: s.ctl,
            out: s.out,
            counters: s.counters,
            clock: Clock::new(),
            rx_batch: Vec::with_capacity(RX_BURST),
            tx_batch: Vec::with_capacity(TX_BURST),
            spare_frame: None,
            scratch: vec![0; frame_len],
            forward_in: s.forward_in,
            forward_out: s.forward_out,
            dispatch: s.dispatch,
            wake: s.wake,
            dispatch_rss,
            dereg_pending: Vec::new(),
            mr_sync: s.mr_sync,
            mpa: MpaDefaults {
                crc: s.config.mpa.crc,
                markers: s.config.mpa.markers,
                rtr,
                timeout: Duration::from_secs(s.config.mpa.timeout_s),
                nudge_after: Duration::from_millis(s.config.mpa.nudge_ms),
                responder_waits: s.config.mpa.responder_waits_for_first_fpdu,
            },
            port_cursor,
            retransmits_closed: 0,
            paws_drops_closed: 0,
            close_linger: Duration::from_millis(s.config.tcp.close_linger_ms),
            last_publish: Instant::ZERO,
            local_drops: 0,
            stopping: false,
            capture: crate::capture::TapState::default(),
        }
    }

    /// Uses `clock` (shared by the workers of one dataplane).
    pub(crate) fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    /// Whether a shutdown was requested.
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// Its counters.
    pub fn counters(&self) -> &WorkerCounters {
        &self.counters
    }

    /// One iteration of the loop (see the module documentation). Returns
    /// whether it did any work, for the idle back-off.
    pub fn poll(&mut self) -> bool {
        let now = self.clock.now();
        bump(&self.counters.loops, 1);
        let mut work = self.control(now);
        work |= self.receive(now);
        if self.iface.poll_timeout().is_some_and(|t| t <= now) {
            self.iface.handle_timeout(now);
            work = true;
        }
        work |= self.accept_new(now);
        work |= self.service_conns(now);
        self.mr_events();
        work |= self.transmit(now);
        if now.saturating_duration_since(self.last_publish) >= STATS_PERIOD {
            self.publish(now);
        }
        work
    }

    /// Runs on its own thread until a shutdown message arrives, backing
    /// off when idle as `idle` says (see "Idle back-off" in the module
    /// documentation).
    pub(crate) fn run(mut self, idle: &IdleConfig) {
        fine_timer_slack();
        let wake = self.wake.clone();
        let me = wake.get(self.index);
        if let Some(w) = me {
            let _ = w.thread.set(std::thread::current());
        }
        let nap = Duration::from_micros(idle.sleep_us);
        let mut empty = 0u32;
        while !self.stopping {
            if self.poll() {
                empty = 0;
                continue;
            }
            empty = empty.saturating_add(1);
            if idle.sleep_us > 0 && empty >= idle.spin {
                bump(&self.counters.idle_sleeps, 1);
                let woken = match me {
                    Some(w) => w.sleep(nap),
                    None => {
                        std::thread::sleep(nap);
                        false
                    }
                };
                if woken {
                    bump(&self.counters.idle_wakeups, 1);
                }
            } else if idle.yield_cpu {
                std::thread::yield_now();
            }
        }
        self.shutdown();
    }

    /// Ends every connection the way a host's TCP does when its
    /// application exits: a FIN after what is queued, then the FIN
    /// exchange runs to its end (the peer's ACK of our FIN, and its own
    /// FIN when we closed first) for at most `tcp.close_linger_ms`. Only
    /// the connections still open then are reset, and counted
    /// ([`WorkerCounters::shutdown_resets`]); a connection in TIME-WAIT
    /// has finished its close and goes without a word. Resetting at once,
    /// as this did before, sent a RST right behind our FIN, which hardware
    /// peers log as an error.
    pub(crate) fn shutdown(&mut self) {
        if !self.close_linger.is_zero() {
            self.linger();
        }
        let now = self.clock.now();
        let mut reset = 0;
        for c in self.conns.iter().flatten() {
            if let Some(t) = self.iface.stack_mut().conn_mut(c.tcp) {
                if is_open(t.state()) {
                    reset += 1;
                }
                t.abort(now);
            }
        }
        bump(&self.counters.shutdown_resets, reset);
        self.transmit(now);
        self.publish(now);
    }

    /// Closes every connection with a FIN and polls until each close has
    /// finished or `tcp.close_linger_ms` has passed.
    fn linger(&mut self) {
        let start = self.clock.now();
        for c in self.conns.iter().flatten() {
            if let Some(t) = self.iface.stack_mut().conn_mut(c.tcp) {
                t.close(start);
            }
        }
        let deadline = start + self.close_linger;
        loop {
            let work = self.poll();
            if self.open_connections() == 0 || self.clock.now() >= deadline {
                return;
            }
            if !work {
                // Shared cores: the peer's answer takes a while, and the
                // thread waiting for it need not take the core meanwhile.
                std::thread::sleep(SHUTDOWN_NAP);
            }
        }
    }

    /// Connections whose close has not finished (neither CLOSED nor in
    /// TIME-WAIT).
    fn open_connections(&self) -> usize {
        let stack = self.iface.stack();
        self.conns
            .iter()
            .flatten()
            .filter_map(|c| stack.conn(c.tcp))
            .filter(|t| is_open(t.state()))
            .count()
    }

    fn control(&mut self, now: Instant) -> bool {
        let synced = self.mr_sync.apply_incoming(self.device.mrs_mut());
        self.mr_sync.flush();
        let mut n = usize::from(synced);
        while n < CTL_PER_POLL + usize::from(synced) {
            let Ok(msg) = self.ctl.try_recv() else {
                break;
            };
            n += 1;
            self.handle_ctl(now, msg);
        }
        n > 0
    }

    fn handle_ctl(&mut self, now: Instant, msg: Ctl) {
        match msg {
            Ctl::Shutdown => self.stopping = true,
            Ctl::Listen {
                port,
                backlog,
                reply,
            } => {
                let addr = SocketAddrV4::new(self.iface.ip(), port);
                let r = match self.iface.stack_mut().listen(addr, backlog) {
                    Ok(()) => {
                        self.listening.push(port);
                        CtlReply::Done
                    }
                    Err(e) => CtlReply::Failed(Error::Stack(e)),
                };
                let _ = reply.send(r);
            }
            Ctl::Connect {
                qp,
                remote,
                params,
                reply,
            } => {
                let _ = reply.send(CtlReply::from(self.connect(now, qp, remote, params)));
            }
            Ctl::Accept {
                conn,
                qp,
                params,
                reply,
            } => {
                let _ = reply.send(CtlReply::from(self.accept(now, conn, qp, params)));
            }
            Ctl::Reject {
                conn,
                private_data,
                reply,
            } => {
                let _ = reply.send(CtlReply::from(self.reject(now, conn, private_data)));
            }
            Ctl::RegMr {
                stag,
                pd,
                region,
                offset,
                len,
                iova,
                access,
                reply,
            } => {
                let span = MemSpan::new(region.handle(), offset, len);
                // The port learns the memory first (DPDK: registered with
                // EAL and DMA-mapped); a failure fails the registration.
                if let Err(m) = self.queue.register_region(&region) {
                    let _ = reply.send(CtlReply::Failed(Error::Device(m)));
                    return;
                }
                let r = match self
                    .device
                    .mrs_mut()
                    .reg_mr_at(stag, pd, span, iova, access)
                {
                    Ok(_) => {
                        self.mem.insert(&region);
                        CtlReply::Done
                    }
                    Err(e) => CtlReply::Failed(Error::Verbs(e)),
                };
                let _ = reply.send(r);
            }
            Ctl::AllocMr {
                stag,
                pd,
                max_len,
                region,
                reply,
            } => {
                let r = match self.device.mrs_mut().alloc_mr_at(stag, pd, max_len) {
                    Ok(_) => {
                        self.mem.insert(&region);
                        CtlReply::Done
                    }
                    Err(e) => CtlReply::Failed(Error::Verbs(e)),
                };
                let _ = reply.send(r);
            }
            Ctl::DeallocMr {
                stag,
                region,
                reply,
            } => {
                // Whatever key fast registration gave it since.
                let current = self.device.mrs().query_mr(stag).map(|i| i.stag);
                let r = match current.map(|s| self.device.dereg_mr(s)) {
                    Some(Ok(DeregStatus::Done)) => {
                        self.mem.release(region);
                        CtlReply::Dereg(DeregStatus::Done)
                    }
                    Some(Ok(DeregStatus::Pending)) => {
                        self.dereg_pending.push((stag, region));
                        CtlReply::Dereg(DeregStatus::Pending)
                    }
                    Some(Err(e)) => CtlReply::Failed(Error::Verbs(e)),
                    None => CtlReply::Failed(Error::Verbs(VerbsError::InvalidStag)),
                };
                let _ = reply.send(r);
            }
            Ctl::DeregMr { stag, reply } => {
                let handle = self.device.mrs().query_mr(stag).map(|i| i.mem.region);
                let r = match (self.device.dereg_mr(stag), handle) {
                    (Ok(DeregStatus::Done), Some(h)) => {
                        self.mem.release(h);
                        CtlReply::Dereg(DeregStatus::Done)
                    }
                    (Ok(DeregStatus::Pending), Some(h)) => {
                        self.dereg_pending.push((stag, h));
                        CtlReply::Dereg(DeregStatus::Pending)
                    }
                    (Ok(s), None) => CtlReply::Dereg(s),
                    (Err(e), _) => CtlReply::Failed(Error::Verbs(e)),
                };
                let _ = reply.send(r);
            }
            Ctl::Disconnect { qpn, abort } => {
                let Some(c) = self
                    .conns
                    .iter_mut()
                    .flatten()
                    .find(|c| c.shared.as_ref().is_some_and(|s| s.qpn == qpn))
                else {
                    return;
                };
                // An orderly close goes through the engine (queued work
                // completes first); anything else resets TCP.
                let orderly = !abort
                    && c.ep.as_mut().is_some_and(|ep| {
                        ep.disconnect(&mut env(
                            &mut self.device,
                            &mut self.mem,
                            &mut c.cq,
                            &mut c.rcq,
                        ))
                        .is_ok()
                    });
                if !orderly {
                    if let Some(t) = self.iface.stack_mut().conn_mut(c.tcp) {
                        c.local_abort = true;
                        t.abort(now);
                    }
                }
            }
        }
    }

    fn mpa_config(&self, ird: u16, ord: u16) -> rdmap::mpa::Config {
        rdmap::mpa::Config {
            crc: self.mpa.crc,
            markers_wanted: self.mpa.markers,
            ird,
            ord,
            rtr_offer: self.mpa.rtr.map_or(RtrSet::NONE, RtrSet::only),
            rtr_accept: RtrSet::ALL,
            timeout: self.mpa.timeout,
            nudge_after: self.mpa.nudge_after,
            responder_waits_for_first_fpdu: self.mpa.responder_waits,
            ..rdmap::mpa::Config::default()
        }
    }

    fn slot(&mut self, id: ConnId) -> Result<&mut Option<Conn>, Error> {
        let i = id.index as usize;
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, || None);
        }
        Ok(&mut self.conns[i])
    }

    fn connect(
        &mut self,
        now: Instant,
        shared: Arc<QpShared>,
        remote: SocketAddrV4,
        params: ConnParams,
    ) -> Result<(), Error> {
        let local_ip = self.iface.ip();
        // The port's RSS where it steers; where it cannot, the software
        // dispatcher's function, which names this worker by its index.
        let steer = match &self.dispatch_rss {
            Some(rss) => Some((rss.clone(), self.index as u16)),
            None => self
                .caps
                .rss
                .clone()
                .filter(|_| self.caps.queues > 1 && self.queue.index() < self.caps.queues)
                .map(|rss| (rss, self.queue.index())),
        };
        let id = match steer {
            None => self.iface.stack_mut().connect(now, local_ip, remote)?,
            Some((rss, queue)) => {
                let mut tries = 0;
                loop {
                    let port = rss
                        .pick_port(
                            local_ip,
                            *remote.ip(),
                            remote.port(),
                            queue,
                            self.port_cursor,
                            |p| self.listening.contains(&p),
                        )
                        .ok_or(Error::Stack(StackError::NoFreePort))?;
                    self.port_cursor = port.wrapping_add(1);
                    let local = SocketAddrV4::new(local_ip, port);
                    match self.iface.stack_mut().connect_from(now, local, remote) {
                        Ok(id) => break id,
                        Err(StackError::PortInUse) if tries < 64 => tries += 1,
                        Err(e) => return Err(Error::Stack(e)),
                    }
                }
            }
        };
        let qp = QueuePair::new(shared.qpn, shared.attr);
        let config = self.mpa_config(params.ird, params.ord);
        let local_port = self.iface.stack().tuple(id).map_or(0, |t| t.local.port());
        let mut conn = Conn::new(
            id,
            remote,
            local_port,
            Phase::TcpConnecting {
                qp: Box::new(qp),
                config,
                private_data: params.private_data,
            },
        );
        conn.active = true;
        shared.bind_worker(self.index);
        shared.set_status(QpStatus::Connecting);
        conn.bind(shared);
        *self.slot(id)? = Some(conn);
        bump(&self.counters.connections, 1);
        Ok(())
    }

    fn pending(&mut self, id: ConnId) -> Result<&mut Conn, Error> {
        match self.conns.get_mut(id.index as usize) {
            Some(Some(c)) if c.tcp == id && matches!(c.phase, Phase::AwaitDecision) => Ok(c),
            _ => Err(Error::NoSuchRequest),
        }
    }

    fn accept(
        &mut self,
        now: Instant,
        id: ConnId,
        shared: Arc<QpShared>,
        params: ConnParams,
    ) -> Result<(), Error> {
        let config = self.mpa_config(params.ird, params.ord);
        let index = self.index;
        let conn = self.pending(id)?;
        let qp = QueuePair::new(shared.qpn, shared.attr);
        let ep = Endpoint::responder(config, qp, engine_time(now))
            .map_err(|_| Error::InvalidArgument("MPA configuration"))?;
        shared.bind_worker(index);
        shared.set_status(QpStatus::Connecting);
        conn.bind(shared);
        conn.decision = Some((true, params.private_data));
        conn.ep = Some(ep);
        conn.phase = Phase::Running;
        // Receives posted before accept go in before the request is fed,
        // so the initiator's first Send finds them.
        self.feed_request(now, id);
        Ok(())
    }

    fn reject(&mut self, now: Instant, id: ConnId, private_data: Vec<u8>) -> Result<(), Error> {
        let config = self.mpa_config(0, 0);
        let conn = self.pending(id)?;
        let qp = QueuePair::new(QpNum(0), placeholder_attr());
        let ep = Endpoint::responder(config, qp, engine_time(now))
            .map_err(|_| Error::InvalidArgument("MPA configuration"))?;
        conn.decision = Some((false, private_data));
        conn.ep = Some(ep);
        conn.phase = Phase::Running;
        self.feed_request(now, id);
        Ok(())
    }

    /// Hands the gathered request to the new endpoint (after the posted
    /// receives).
    fn feed_request(&mut self, now: Instant, id: ConnId) {
        let Some(Some(conn)) = self.conns.get_mut(id.index as usize) else {
            return;
        };
        let mut cx = Cx {
            now,
            stack: self.iface.stack_mut(),
            device: &mut self.device,
            mem: &mut self.mem,
            counters: &self.counters,
            out: &self.out,
            worker: self.tag,
            index: self.index,
            sync: &mut self.mr_sync,
        };
        conn.drain_posts(&mut cx);
        let request = core::mem::take(&mut conn.request);
        if let Some(ep) = conn.ep.as_mut() {
            ep.handle_stream(
                engine_time(now),
                &request,
                &mut env_srq(
                    cx.device,
                    cx.mem,
                    &mut conn.cq,
                    &mut conn.rcq,
                    conn.srq.as_mut(),
                ),
            );
        }
    }

    fn accept_new(&mut self, now: Instant) -> bool {
        let mut n = 0;
        let deadline = now + self.mpa.timeout;
        for i in 0..self.listening.len() {
            let port = self.listening[i];
            for _ in 0..ACCEPT_PER_POLL {
                let Some(id) = self.iface.stack_mut().accept(port) else {
                    break;
                };
                n += 1;
                let remote = self
                    .iface
                    .stack()
                    .tuple(id)
                    .map_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), |t| t.remote);
                let conn = Conn::new(id, remote, port, Phase::AwaitRequest { deadline });
                if let Ok(slot) = self.slot(id) {
                    *slot = Some(conn);
                    bump(&self.counters.connections, 1);
                }
            }
        }
        n > 0
    }

    fn service_conns(&mut self, now: Instant) -> bool {
        let mut work = false;
        let mut cx = Cx {
            now,
            stack: self.iface.stack_mut(),
            device: &mut self.device,
            mem: &mut self.mem,
            counters: &self.counters,
            out: &self.out,
            worker: self.tag,
            index: self.index,
            sync: &mut self.mr_sync,
        };
        for slot in self.conns.iter_mut() {
            let Some(conn) = slot.as_mut() else {
                continue;
            };
            let mut finished = false;
            work |= conn.service(&mut cx, &mut finished);
            if finished {
                let mut conn = slot.take().expect("checked above");
                let _ = cx.stack.remove(now, conn.tcp);
                let owner = Owner {
                    worker: cx.worker,
                    conn: conn.tcp,
                };
                return_dropped(&mut cx, owner, conn.ep.as_mut());
                if let Some(c) = cx.stack.conn(conn.tcp) {
                    self.retransmits_closed += c.stats().retransmits;
                    self.paws_drops_closed += c.stats().paws_dropped;
                }
                if let Some(ep) = conn.ep.take() {
                    let mut qp = ep.into_qp();
                    qp.drain_inbound_reads(cx.device.mrs_mut());
                }
                let c = &cx.counters.connections;
                c.store(
                    c.load(Ordering::Relaxed).saturating_sub(1),
                    Ordering::Relaxed,
                );
            }
        }
        work
    }

    /// Deregistrations that waited for pins and have now finished.
    fn mr_events(&mut self) {
        while let Some(MrEvent::Deregistered(stag)) = self.device.mrs_mut().poll_event() {
            // By index: a fast-register region's key may have changed.
            let mut pending = self.dereg_pending.iter();
            if let Some(i) = pending.position(|(s, _)| s.index() == stag.index()) {
                let (stag, h) = self.dereg_pending.swap_remove(i);
                self.mem.release(h);
                let _ = self.out.send(WorkerMsg::MrReleased { stag });
            }
        }
    }

    fn receive(&mut self, now: Instant) -> bool {
        // Before the burst: a capture starts or stops on a burst's edge.
        self.capture.refresh(&self.counters.capture);
        let n = self.queue.rx_burst(&mut self.rx_batch, RX_BURST);
        if let Some(ring) = self.capture.ring() {
            let ts = ring.now_ns();
            for buf in &self.rx_batch {
                ring.record_bytes(ts, buf.as_ref());
            }
        }
        let mut bytes = 0u64;
        let mut punts = 0u64;
        let (mut dispatched, mut dispatch_drops) = (0u64, 0u64);
        for buf in self.rx_batch.drain(..) {
            let f = buf.as_ref();
            bytes += f.len() as u64;
            let (punt, arp) = classify(f);
            if punt {
                punts += 1;
            }
            if arp {
                if let Some(sf) = SmallFrame::of(f) {
                    for q in &self.forward_out {
                        if q.push(sf).is_ok() {
                            bump(&self.counters.forwarded, 1);
                        }
                    }
                }
            }
            let cksum = self.queue.rx_checksum(&buf);
            let owner = self
                .dispatch_rss
                .as_ref()
                .and_then(|rss| rss.queue_of_frame(f))
                .map(usize::from)
                .filter(|&o| o != self.index);
            if let Some(ring) = owner.and_then(|o| self.dispatch.rings.get(o)) {
                // The buffer moves to its owner; a full ring drops it (the
                // buffer goes back to the pool) and TCP recovers.
                if ring.push((buf, cksum)).is_ok() {
                    dispatched += 1;
                } else {
                    dispatch_drops += 1;
                }
                continue;
            }
            self.iface.handle_frame_with(now, RxFrame::Nic(buf), cksum);
        }
        let mut fwd = 0;
        while let Some(sf) = self.forward_in.pop() {
            fwd += 1;
            self.iface.handle_frame(now, RxFrame::Forwarded(sf));
        }
        let mut handed = 0;
        if self.dispatch_rss.is_some() {
            if let Some(ring) = self.dispatch.rings.get(self.index) {
                while handed < DISPATCH_PER_POLL {
                    let Some((buf, cksum)) = ring.pop() else {
                        break;
                    };
                    handed += 1;
                    self.iface.handle_frame_with(now, RxFrame::Nic(buf), cksum);
                }
            }
        }
        if n > 0 {
            bump(&self.counters.rx_packets, n as u64);
            bump(&self.counters.rx_bytes, bytes);
            bump(&self.counters.punts, punts);
            if dispatched > 0 {
                bump(&self.counters.dispatched_out, dispatched);
            }
            if dispatch_drops > 0 {
                bump(&self.counters.dispatch_drops, dispatch_drops);
            }
        }
        if handed > 0 {
            bump(&self.counters.dispatched_in, handed as u64);
        }
        n + fwd + handed > 0
    }

    fn transmit(&mut self, now: Instant) -> bool {
        let offload = self.caps.tx_checksum_offload;
        let attach = self.caps.multi_seg_tx;
        let capture_ts = self.capture.ring().map(crate::capture::Ring::now_ns);
        let mut copied = 0u64;
        while self.tx_batch.len() < TX_BURST {
            let frame = match self.spare_frame.take() {
                Some(f) => f,
                None => match self.queue.alloc_tx() {
                    Some(f) => f,
                    None => {
                        self.local_drops += 1;
                        break;
                    }
                },
            };
            let mut frame = frame;
            if let Some(n) = self.iface.poll_slow_frame(now, &mut self.scratch) {
                match frame.append(&self.scratch[..n]) {
                    Ok(()) => {
                        if let (Some(ring), Some(ts)) = (self.capture.ring(), capture_ts) {
                            ring.record_bytes(ts, &self.scratch[..n]);
                        }
                        self.tx_batch.push(frame)
                    }
                    Err(_) => self.local_drops += 1,
                }
                continue;
            }
            let mut hdr = [0u8; HDR_BUF];
            let mut seg = SegmentSum::default();
            let parts = self.iface.poll_frame_parts(now, &mut hdr, |r, range| {
                (!offload).then(|| {
                    seg = r.tx_sum(range);
                    seg.sum
                })
            });
            if seg.read > 0 {
                bump(&self.counters.tx_summed_bytes, seg.read as u64);
            }
            if seg.resummed > 0 {
                bump(&self.counters.tx_resummed_bytes, seg.resummed as u64);
                if seg.changed {
                    bump(&self.counters.tx_payload_changed, 1);
                }
            }
            match parts {
                None => {
                    self.spare_frame = Some(frame);
                    break;
                }
                Some(FrameParts::Consumed) => self.spare_frame = Some(frame),
                Some(FrameParts::Segment {
                    header_len,
                    payload,
                    pad,
                    ..
                }) => {
                    let captured = capture_ts.map(|ts| (ts, payload.clone()));
                    let has_payload = payload.is_some();
                    let ok = frame.append(&hdr[..header_len]).is_ok()
                        && payload
                            .map_or(true, |(r, range)| r.emit(&mut frame, range, attach).is_ok())
                        && frame.append_zeros(pad).is_ok();
                    if ok {
                        if let (Some(ring), Some((ts, p))) = (self.capture.ring(), captured) {
                            ring.record_segment(ts, &hdr[..header_len], p, pad);
                        }
                        self.tx_batch.push(frame);
                        copied += u64::from(has_payload && !attach);
                    } else {
                        self.local_drops += 1;
                    }
                }
            }
        }
        if copied > 0 {
            bump(&self.counters.tx_copied_frames, copied);
        }
        if self.tx_batch.is_empty() {
            return false;
        }
        let bytes: usize = self.tx_batch.iter().map(TxFrame::len).sum();
        let before = self.tx_batch.len();
        let sent = self.queue.tx_burst(&mut self.tx_batch);
        let left: usize = self.tx_batch.iter().map(TxFrame::len).sum();
        bump(&self.counters.tx_packets, sent as u64);
        bump(&self.counters.tx_bytes, (bytes - left) as u64);
        before > 0
    }

    fn publish(&mut self, now: Instant) {
        self.last_publish = now;
        let stack = self.iface.stack();
        let (live, live_paws) = self
            .conns
            .iter()
            .flatten()
            .filter_map(|c| stack.conn(c.tcp))
            .fold((0, 0), |(r, p), c| {
                (r + c.stats().retransmits, p + c.stats().paws_dropped)
            });
        // Each queue pair's figures, for the control path's snapshots.
        for c in self.conns.iter().flatten() {
            if let (Some(q), Some(t)) = (&c.shared, stack.conn(c.tcp)) {
                let st = t.stats();
                let reads =
                    c.ep.as_ref()
                        .map_or(0, |e| e.qp().outstanding_reads() as u64);
                q.counters
                    .publish(st.bytes_out, st.bytes_in, st.retransmits, reads);
            }
        }
        self.counters
            .retransmits
            .store(self.retransmits_closed + live, Ordering::Relaxed);
        self.counters
            .paws_drops
            .store(self.paws_drops_closed + live_paws, Ordering::Relaxed);
        let s = self.iface.stats();
        let drops = s.drops.iter().sum::<u64>()
            + s.not_for_us
            + s.vlan_drops
            + s.arp_miss_drops
            + s.slow_queue_drops
            + s.tx_too_large
            + self.local_drops
            + self.counters.dispatch_drops.load(Ordering::Relaxed)
            + self.mem.misses();
        self.counters.drops.store(drops, Ordering::Relaxed);
    }
}

/// The room a frame needs at `mtu`.
fn ic_frame_len(mtu: usize) -> usize {
    mtu + crate::link::FRAME_OVERHEAD
}

/// The queue pair of a connection being rejected: it never carries work.
fn placeholder_attr() -> QpInitAttr {
    QpInitAttr {
        pd: PdId(0),
        send_cq: CqId(0),
        recv_cq: CqId(0),
        srq: None,
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_ord: 0,
        max_ird: 0,
        sq_sig_all: false,
    }
}
