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
//!    Then, if TCP owes ACKs for the burst, a TX pass (step 6) sends
//!    them before step 5 places the payload: a peer that completes its
//!    requests on our ACKs gets them a placement sooner (64-byte WRITE
//!    rate at perftest's depth of 128: +12 %).
//! 3. TCP and ARP timers.
//! 4. New passive connections ([`ACCEPT_PER_POLL`]): their MPA request is
//!    gathered and reported to the application, which accepts or rejects.
//! 5. Each connection on the ready list (`ready`: those a segment, a
//!    TCP timer, a post, a control message or a due setup timer reached,
//!    and those with work left; idle connections are not looked at): TCP
//!    events (an acknowledged record goes back to the engine where it
//!    lies in the records table, `Endpoint::note_acked` returning its pin;
//!    one `Endpoint::service` after them completes Sends and Writes);
//!    in-order payload to `Endpoint::handle_stream` (at
//!    most [`MAX_CHUNKS_PER_POLL`] chunks); work requests from the QP's
//!    submission rings ([`MAX_POSTS_PER_POLL`]); records from
//!    `Endpoint::poll_record_into(send_room)`, built in the records
//!    table, into TCP
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
//! reset, an abort or a timeout come out of the TCP engine's
//! `poll_dropped` and return their pins to the QP engine.
//! Without checksum offload a retransmission sums its payload again from
//! the region rather than reuse the record's stored sum, so that a buffer
//! the application changed before its completion reaches the peer's MPA
//! CRC check instead of stalling in its TCP (`Sendable::tx_sum`).
//!
//! # Files
//!
//! This file holds the loop and its budgets; each stage has its own
//! file: `control` (step 1, and the deregistrations after step 5),
//! `rx` (step 2), `conn` (steps 4 and 5: connection lifecycle and
//! service), `completion` (the end of step 5), `tx` (records into TCP in
//! step 5, and step 6), `stag_mesh` (the STag replicas below), `idle`
//! (the back-off below), `clock` and `counters`.
//!
//! # STag replicas
//!
//! Every worker checks peers' STags against its own copy of the STag table
//! (no lock on the data path); the control path's table (the API's
//! control plane) allocates the STags and the workers mirror its
//! registrations (`RegMr` control messages) before `reg_mr` returns. Fast registration and local
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
//! A worker thread also checks, once per iteration, whether an
//! application thread wants to drive the worker itself (busy polling,
//! `crate::api::BusyPoll`); it then stops its loop, hands the worker over
//! and waits until it comes back, so that a post, its transmission and its
//! completion run on one thread with no hand-off.
//!
//! Allocation happens at connection setup and on the slow path (control
//! messages, connection requests, ARP holds, ARP frames forwarded from
//! another worker), never per packet of a connection: received buffers
//! come from the port's pool, frames are reused, records carry their
//! headers inline. A connection's queues for the rare cases (completions
//! a full CQ ring refused or held for the STag replicas, local
//! operations) are allocated at their first use, once, at the size that
//! setup used to give them.

use core::time::Duration;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use crossbeam_queue::ArrayQueue;
use rdmap::mpa::RtrType;
use rdmap::placement::RegionHandle;
use rdmap::verbs::{Device, DeviceLimits, Stag};
use tcp_offload::iface::{Interface, InterfaceConfig};
use tcp_offload::tcp;
use tcp_offload::Instant;

use crate::config::Config;
pub use crate::ctl::SmallFrame;
use crate::ctl::{Ctl, DispatchRings, IdleWake, WorkerMsg};
use crate::link::{LinkCaps, LinkQueue};
use crate::memory::MemoryTable;
use crate::steer::Rss;

mod clock;
mod completion;
mod conn;
mod control;
mod counters;
mod deadlines;
mod idle;
mod ready;
mod records;
mod rx;
mod rx_pass;
mod stag_mesh;
mod tx;

use self::conn::{is_open, Conn};
use self::counters::bump;
use self::records::Records;
use clock::ClockReader;
pub use clock::{Clock, ManualTime};
pub use counters::{WorkerCounters, WorkerStats};
pub use records::RecordRef;
pub use rx::RxFrame;
pub(crate) use stag_mesh::MrSyncLinks;
pub use tx::{fpdu_records_leaked, FpduRecord};

/// Frames taken from the RX queue per iteration: DPDK's customary burst,
/// enough to amortise the ring access, small enough that the burst's
/// buffers stay in L1/L2 while the pipeline runs over them.
pub const RX_BURST: usize = 32;

/// Frames built per iteration before one TX burst: the same reasoning as
/// [`RX_BURST`], and it bounds how long RX waits behind a sending
/// connection.
pub const TX_BURST: usize = 32;

/// Most records in a train the worker cuts itself, on a port without
/// TCP segmentation offload: one TCP output decision and one header
/// template for up to this many segments, each a frame of its own (the
/// transmit batch has room for one such train past [`TX_BURST`]).
pub const SOFT_TRAIN_RECORDS: usize = 16;

/// Most payload bytes in a train the worker cuts itself: what the IPv4
/// length field of the train's header template leaves after the largest
/// IPv4 and TCP headers.
const SOFT_TRAIN_BYTES: usize = 0xffff - 60 - 60;

/// Records (FPDUs, one TCP segment each) one connection may queue each
/// time it is offered room (twice an iteration: before and after the
/// engine's events): about 90 KB at a 1500-byte MTU, so one bulk sender
/// cannot keep the worker from its other connections and its RX queue.
pub const MAX_FPDUS_PER_POLL: usize = 64;

/// Records one connection may queue at a time once they are small
/// (under [`SMALL_FPDU`] bytes, many to a segment): they cost little per
/// poll to cut short, and a small-message sender is paced by its
/// completions, which come sooner when its first segments go out sooner
/// (64-byte rate rounds: about 15 % more messages a second than with 64,
/// while 64 large records a poll keep bulk transfers' bursts full).
pub const MAX_SMALL_FPDUS_PER_POLL: usize = 32;

/// Records under this many bytes count as small
/// ([`MAX_SMALL_FPDUS_PER_POLL`]).
pub const SMALL_FPDU: usize = 512;

/// In-order payload chunks handed to one connection's endpoint per
/// iteration (each chunk is one received segment's payload). What is left
/// waits in TCP, whose window then closes: back-pressure, not loss.
pub const MAX_CHUNKS_PER_POLL: usize = 128;

/// Work requests drained from one QP's submission rings per iteration.
pub const MAX_POSTS_PER_POLL: usize = 64;

/// Most FPDUs one TCP segment carries with `tcp.pack_fpdus`: 17 FPDUs of
/// a 64-byte WRITE fill a 1448-byte MSS. On a port that takes chains,
/// fewer: an attached payload adds two pieces to the chain.
pub const PACK_MAX_FPDUS: usize = 16;

/// How late a TCP or ARP timer may be found on a real clock. The
/// interface's next deadline (the timer heap's top, the ARP entries') is
/// asked once per this, or at that deadline, rather than in every
/// iteration: busy-polled, that question was some 5 % of a sending
/// thread's time. TCP's shortest timers (probe timeouts, RACK's reorder
/// window) are a round trip or more; 10 µs is far below them.
pub const TIMER_SLACK: Duration = Duration::from_micros(10);

/// Control messages handled per iteration: the control path never stalls
/// the data path for long.
pub const CTL_PER_POLL: usize = 8;

/// New passive connections taken per listening port per iteration.
pub const ACCEPT_PER_POLL: usize = 16;

/// The pause between polls of a stopping worker with nothing to do while
/// it waits for its connections' FIN exchanges to finish.
const SHUTDOWN_NAP: Duration = Duration::from_micros(50);

/// Records in flight a worker has room for before its table first grows
/// (a window of 64 KiB in 1448-byte FPDUs on each of 32 connections).
const RECORDS_AT_START: usize = 1536;

/// How often the counters that are sums over connections (retransmits,
/// drops) are published, with up to [`STATS_CONNS_PER_PERIOD`]
/// connections.
pub const STATS_PERIOD: Duration = Duration::from_millis(1);

/// Connections whose figures one [`STATS_PERIOD`] pays for: with more, the
/// period grows in proportion (10 000 connections, 157 ms), so that
/// publishing costs a worker the same share of its time however many
/// connections it holds, rather than a visit of each every millisecond.
/// With thousands of busy connections every visit misses the cache (the
/// TCB, the queue pair's shared counters): at 256 a period, publishing
/// took 5 % of the sending thread of a 10,000-QP write-bw round.
pub const STATS_CONNS_PER_PERIOD: usize = 64;

/// STag changes from other workers applied per iteration (the ring is
/// drained in a few iterations even when full).
pub const MR_SYNC_PER_POLL: usize = 64;

/// Handed-over frames a worker takes from its dispatch ring per
/// iteration: two bursts, so that one other worker receiving everything
/// (a port delivering on queue 0 only) cannot outrun it.
pub const DISPATCH_PER_POLL: usize = 2 * RX_BURST;

// The dispatch rings (`crate::ctl`) hold thirty-two receive bursts.
const _: () = assert!(crate::ctl::DISPATCH_RING == 32 * RX_BURST);

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
    /// Declared (so dropped) before `queue`: buffers still in the rings
    /// go back to the port's pool while a queue still holds it (the last
    /// worker to go frees what is left).
    dispatch: Arc<DispatchRings<Q::RxBuf>>,
    queue: Q,
    caps: LinkCaps,
    /// TCP hands out trains that the worker cuts into frames itself
    /// (segmentation offload on, and the port without it).
    cut_trains: bool,
    iface: Interface<RxFrame<Q::RxBuf>, RecordRef>,
    /// The records TCP holds handles on (see [`records`]).
    records: Records,
    device: Device,
    mem: MemoryTable,
    conns: Vec<Option<Conn>>,
    /// The slot of the connection whose turn to send was seen last
    /// ([`Worker::top_up_turn`]).
    turn_seen: u32,
    /// The connections to service next (see [`ready`]).
    ready: ready::ReadyList,
    /// The connections' setup deadlines (see [`Conn::next_due`]).
    timed: deadlines::Deadlines,
    /// Connections serviced in this iteration, for
    /// [`WorkerCounters::conn_visits`].
    visits: u64,
    listening: Vec<u16>,
    ctl: Receiver<Ctl>,
    out: Sender<WorkerMsg>,
    counters: Arc<WorkerCounters>,
    clock: ClockReader,
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
    /// When the TCP and ARP timers are next looked at (see [`TIMER_SLACK`]).
    timers_at: Instant,
    local_drops: u64,
    /// Iterations of [`Worker::poll`] so far.
    epoch: u64,
    /// The FPDU CRCs the receive pass took in this burst.
    rx_crcs: rx_pass::RxCrcs,
    /// Frames whose TCP checksum the receive pass verified: the interface
    /// counts them as trusted, which `rx_cksum_trusted` (the port's
    /// verdicts) leaves out.
    rx_pass_verified: u64,
    stopping: bool,
    /// The running capture's ring, refreshed once per receive burst.
    capture: crate::capture::TapState,
}

impl<Q: LinkQueue> Worker<Q> {
    pub(crate) fn new(s: WorkerSetup<Q>) -> Worker<Q> {
        let port = &s.config.ports[0];
        let mac = port.mac.map_or(s.caps.mac, |m| m.0);
        let mut ic = InterfaceConfig::new(mac, port.ip, s.key);
        ic.mtu = port.mtu.min(s.caps.mtu);
        ic.sum = crate::checksum::sum;
        ic.tcp = tcp::Config {
            // The MSS follows the port's MTU (jumbo frames included); the
            // interface clamps it to `mtu - 40` as well.
            mss: u16::try_from(ic.mtu.saturating_sub(40)).unwrap_or(u16::MAX),
            sack: s.config.tcp.sack,
            timestamps: s.config.tcp.timestamps,
            recv_buffer: s.config.tcp.recv_buffer,
            ..tcp::Config::default()
        };
        // Attached payload is a piece of the chain of its own.
        let odd_payload_solo = s.caps.multi_seg_tx
            && s.config.tcp.segmentation_offload
            && s.caps.tso.is_some_and(|t| t.even_pieces);
        // Trains: cut by the port where it has TCP segmentation offload,
        // by the worker (`cut_train`) where it has not.
        let cut_trains = s.config.tcp.segmentation_offload && s.caps.tso.is_none();
        if let Some(tso) = s.caps.tso.filter(|_| s.config.tcp.segmentation_offload) {
            ic.tcp.train_bytes = tso.max_bytes;
            ic.tcp.train_records = tso.max_segments;
            ic.tcp.train_shortfall = tso.shortfall;
        } else if cut_trains {
            ic.tcp.train_bytes = SOFT_TRAIN_BYTES;
            ic.tcp.train_records = SOFT_TRAIN_RECORDS;
        }
        if s.config.tcp.pack_fpdus {
            // An attached payload starts a piece of the frame's chain, and
            // the bytes after it (its trailer, the next FPDU's header)
            // another: a pack stays within the port's chain.
            ic.tcp.pack_records = if s.caps.multi_seg_tx {
                PACK_MAX_FPDUS.min(s.caps.max_tx_segments.saturating_sub(1) / 2)
            } else {
                PACK_MAX_FPDUS
            };
        }
        ic.max_connections = s.config.tcp.max_connections;
        ic.tcp.turn_bytes = s.config.tcp.turn_bytes;
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
        let mut mem = MemoryTable::with_sum_with_crc(sum_with_crc);
        // Where the payload is copied into each frame anyway, that copy is
        // the CRC's pass too.
        mem.set_crc_at_transmit(!s.caps.multi_seg_tx);
        Worker {
            index: s.index,
            caps: s.caps,
            cut_trains,
            queue: s.queue,
            iface,
            device,
            mem,
            conns: Vec::new(),
            turn_seen: u32::MAX,
            records: {
                let mut r = Records::with_capacity(RECORDS_AT_START);
                r.odd_payload_solo = odd_payload_solo;
                r
            },
            ready: ready::ReadyList::new(s.config.tcp.max_connections),
            timed: deadlines::Deadlines::new(s.config.tcp.max_connections),
            visits: 0,
            listening: Vec::new(),
            ctl: s.ctl,
            out: s.out,
            counters: s.counters,
            clock: ClockReader::new(Clock::new()),
            rx_batch: Vec::with_capacity(RX_BURST),
            tx_batch: Vec::with_capacity(TX_BURST + SOFT_TRAIN_RECORDS),
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
            timers_at: Instant::ZERO,
            local_drops: 0,
            epoch: 0,
            rx_crcs: rx_pass::RxCrcs::new(),
            rx_pass_verified: 0,
            stopping: false,
            capture: crate::capture::TapState::default(),
        }
    }

    /// Uses `clock` (shared by the workers of one dataplane).
    pub(crate) fn set_clock(&mut self, clock: Clock) {
        self.clock = ClockReader::new(clock);
    }

    /// Prepares the calling thread to run this worker's loop (the port's
    /// [`LinkQueue::on_worker_thread`]); the guard lives as long as the
    /// thread drives it.
    pub(crate) fn enter_thread(&self) -> Result<Option<Box<dyn core::any::Any>>, String> {
        self.queue.on_worker_thread()
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
        self.epoch += 1;
        bump(&self.counters.loops, 1);
        let mut work = self.control(now);
        if self.receive(now) {
            work = true;
            // The ACKs TCP owes for the burst (every second segment) go
            // now, before the engine places the payload: the peer's
            // sender completes its requests on our ACKs, and with a
            // burst of small messages placement is most of this
            // iteration. A pure sender (that received only ACKs) owes
            // none and keeps one TX pass.
            if self.iface.stack_mut().owes_acks() {
                bump(&self.counters.tx_ack_passes, 1);
                self.transmit(now);
            }
        }
        if now >= self.timers_at {
            let next = self.iface.poll_timeout();
            if next.is_some_and(|t| t <= now) {
                self.iface.handle_timeout(now);
                work = true;
            }
            // Looked at again when the next deadline comes, and no later
            // than TIMER_SLACK from now: a deadline set meanwhile (a
            // retransmission or probe timer armed by this iteration's
            // sends) is found at most that late. A simulation's clock
            // jumps, so there every iteration looks.
            self.timers_at = match (self.clock.clock().is_manual(), next) {
                (true, _) => now,
                (false, Some(t)) if t > now => t.min(now + TIMER_SLACK),
                (false, _) => now + TIMER_SLACK,
            };
        }
        work |= self.accept_new(now);
        work |= self.service_conns(now);
        self.mr_events();
        work |= self.transmit(now);
        if now.saturating_duration_since(self.last_publish) >= self.stats_period() {
            self.publish(now);
        }
        work
    }

    /// [`STATS_PERIOD`], stretched for many connections.
    fn stats_period(&self) -> Duration {
        let n = self
            .iface
            .stack()
            .len()
            .div_ceil(STATS_CONNS_PER_PERIOD)
            .max(1);
        STATS_PERIOD * u32::try_from(n).unwrap_or(u32::MAX)
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
        for c in self.conns.iter_mut().flatten() {
            let stack = self.iface.stack_mut();
            if let Some(t) = stack.conn_mut(c.tcp) {
                if is_open(t.state()) {
                    reset += 1;
                }
                t.abort(now);
            }
            // The records the aborts gave up return their pins now: the
            // connections are not serviced again.
            tx::return_dropped(
                stack,
                &mut self.records,
                &mut self.device,
                c.tcp,
                c.ep.as_mut(),
            );
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
        self.ready.mark_all(self.conns.len());
        if self.clock.clock().is_manual() {
            // Virtual time stands still while the program that moves it
            // waits here: send the FINs and go, as after a zero linger.
            self.poll();
            return;
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

    fn publish(&mut self, now: Instant) {
        self.last_publish = now;
        let stack = self.iface.stack();
        // The worker's sums and each queue pair's figures (for the
        // control path's snapshots) in one walk: with thousands of
        // connections each visit of a slot and its TCB is a miss.
        let (mut live, mut live_paws) = (0, 0);
        for c in self.conns.iter().flatten() {
            let Some(t) = stack.conn(c.tcp) else {
                continue;
            };
            let st = t.stats();
            live += st.retransmits;
            live_paws += st.paws_dropped;
            if let Some(q) = &c.shared {
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
        self.counters.arp_in.store(s.arp_in, Ordering::Relaxed);
        self.counters.arp_out.store(s.arp_out, Ordering::Relaxed);
        self.counters.rx_cksum_trusted.store(
            s.rx_cksum_trusted.saturating_sub(self.rx_pass_verified),
            Ordering::Relaxed,
        );
    }
}

/// The room a frame needs at `mtu`.
fn ic_frame_len(mtu: usize) -> usize {
    mtu + crate::link::FRAME_OVERHEAD
}
