//! Ports and queues as a worker sees them: receive a burst of frames,
//! build frames (headers copied, payload attached from registered memory
//! or copied), transmit a burst. This is the seam between the runtime and
//! the device: DPDK ports implement it with mbufs
//! ([`crate::dpdk_link::DpdkLink`]); [`MemLink`] implements it in memory for
//! tests, the simulator and the demo.
//!
//! It sits at both ends of the pipeline: the worker's RX burst starts it
//! (frames go to `tcp-offload` by reference, as `Payload<B>` over the
//! received buffer, and are freed when the engines are done with them) and
//! its TX burst ends it.
//!
//! # Buffers
//!
//! - A received frame is a [`LinkQueue::RxBuf`]: anything that reads as
//!   bytes and gives its memory back when dropped (an mbuf; a pooled
//!   buffer here). The TCP engine may keep it (out-of-order data) until it
//!   is consumed. [`LinkQueue::rx_checksum`] reports what the device
//!   found checking its checksums, if it checked them.
//! - A frame to send is a [`TxFrame`]: bytes appended (headers, MPA
//!   trailer, padding) and payload either **attached** by reference
//!   ([`TxFrame::attach`], zero-copy: the frame holds the region alive until
//!   the device has sent it) or **copied** ([`TxFrame::append_copy`]), the
//!   fallback for ports that cannot chain segments
//!   ([`LinkCaps::multi_seg_tx`]).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_queue::ArrayQueue;
use tcp_offload::iface::RxChecksum;
use tcp_offload::wire::{EthernetAddress, TcpPacket};

use crate::memory::{Region, RegionSlice};
use crate::steer::Rss;

/// Where the headers of an IPv4 TCP frame (Ethernet, untagged) lie, as a
/// link that completes or cuts a frame's headers reads them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TcpHeaders {
    /// IPv4 header length.
    pub(crate) ihl: usize,
    /// Where the TCP header starts.
    pub(crate) tcp: usize,
    /// TCP header length (options included).
    pub(crate) tcp_hl: usize,
    pub(crate) src: Ipv4Addr,
    pub(crate) dst: Ipv4Addr,
}

impl TcpHeaders {
    /// The headers at the start of `d`, if it holds an IPv4 header and at
    /// least a TCP header's fixed part.
    pub(crate) fn parse(d: &[u8]) -> Option<TcpHeaders> {
        if d.len() < 54 || d[12..14] != [0x08, 0x00] || d[23] != 6 {
            return None;
        }
        let ihl = usize::from(d[14] & 0x0f) * 4;
        let tcp = 14 + ihl;
        if ihl < 20 || d.len() < tcp + 20 {
            return None;
        }
        Some(TcpHeaders {
            ihl,
            tcp,
            tcp_hl: usize::from(d[tcp + 12] >> 4) * 4,
            src: Ipv4Addr::new(d[26], d[27], d[28], d[29]),
            dst: Ipv4Addr::new(d[30], d[31], d[32], d[33]),
        })
    }
}

/// What a port can do, as the worker needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkCaps {
    /// The port's MAC address.
    pub mac: EthernetAddress,
    /// IP MTU: the largest datagram (Ethernet payload) the port carries.
    pub mtu: usize,
    /// Queue pairs (one RX and one TX queue each), one per worker.
    pub queues: u16,
    /// Frames may be chains of segments (header, attached payload,
    /// trailer). Without it, payload is copied into one buffer.
    pub multi_seg_tx: bool,
    /// Most segments in one chained frame.
    pub max_tx_segments: usize,
    /// The device computes the TCP checksum on transmit (the driver puts
    /// the pseudo-header sum in the field).
    pub tx_checksum_offload: bool,
    /// The device verifies TCP/IP checksums on receive.
    pub rx_checksum_offload: bool,
    /// How received TCP flows are spread over queues, if the port steers
    /// (`None`: everything arrives on queue 0).
    pub rss: Option<Rss>,
    /// The port cuts large TCP segments into segments of a given payload
    /// size (TCP segmentation offload), if it can.
    pub tso: Option<TsoCaps>,
}

/// What a port's TCP segmentation offload takes ([`TxFrame::segment_by`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TsoCaps {
    /// Most TCP payload bytes in one frame handed to the port.
    pub max_bytes: usize,
    /// Most segments the port cuts from one frame (records in a train).
    pub max_segments: usize,
    /// Bytes by which the largest segment the port cuts falls short of
    /// the MTU (a driver that counts the Ethernet header in its limit).
    pub shortfall: usize,
    /// The port's segmentation sums each piece of a chain as if it began
    /// at an even offset, so a piece of odd length is only right last in
    /// the segments it cuts (DPDK 22.11's `net_tap`).
    pub even_pieces: bool,
}

/// A port whose queues are handed out to workers.
pub trait Link {
    /// One RX/TX queue pair, owned by one worker.
    type Queue: LinkQueue;

    /// The port's capabilities.
    fn caps(&self) -> &LinkCaps;

    /// Queue pair `index`, once (`None` if out of range or taken).
    fn take_queue(&mut self, index: u16) -> Option<Self::Queue>;

    /// The device under the link, whose own counters the control path
    /// reads on demand ([`crate::api::Dataplane::port_stats`]); `None` for
    /// a link with no device (the in-memory link, whose software counters
    /// are the link's own, [`Link::counters`]).
    fn device(&self) -> Option<Box<dyn DeviceStats>> {
        None
    }

    /// The link's own software counters, below the workers, that the
    /// control path reads on demand ([`crate::api::Dataplane::link_stats`]);
    /// `None` where the link keeps none.
    fn counters(&self) -> Option<Box<dyn LinkStats>> {
        None
    }
}

/// A device's counters, read on demand by the control path from a thread
/// of its own, never by a worker.
pub trait DeviceStats: Send + Sync + core::fmt::Debug {
    /// Reads the counters now (may allocate and read device registers:
    /// the control path's work, a few times a second at most).
    fn read(&self) -> DevicePortStats;
}

/// A link's own software counters, read on demand by the control path.
pub trait LinkStats: Send + Sync + core::fmt::Debug {
    /// Each counter by name, in a fixed order.
    fn read(&self) -> Vec<(&'static str, u64)>;
}

/// A port's device counters, as the device (or its driver) keeps them,
/// below the workers (on a DPDK port, what `rte_eth_stats_get` reports). The device counts
/// frames before a worker sees them, so these show drops the workers'
/// counters cannot: `rx_missed` (no free RX descriptor: the workers fell
/// behind), `rx_nombuf` (no mbuf to refill a descriptor with), and frames
/// the device found in error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Frames received (`ipackets`).
    pub rx_packets: u64,
    /// Frames sent (`opackets`).
    pub tx_packets: u64,
    /// Bytes received (`ibytes`; 0 where the driver does not count them,
    /// as `net_ring` does not).
    pub rx_bytes: u64,
    /// Bytes sent (`obytes`).
    pub tx_bytes: u64,
    /// Frames the device dropped for want of an RX descriptor (`imissed`).
    pub rx_missed: u64,
    /// Erroneous frames received (`ierrors`).
    pub rx_errors: u64,
    /// Frames the device failed to send (`oerrors`).
    pub tx_errors: u64,
    /// RX mbuf allocation failures (`rx_nombuf`).
    pub rx_nombuf: u64,
}

impl DeviceCounters {
    /// Each counter with the name the control socket and the metrics give
    /// it.
    pub fn named(&self) -> [(&'static str, u64); 8] {
        [
            ("rx_packets", self.rx_packets),
            ("tx_packets", self.tx_packets),
            ("rx_bytes", self.rx_bytes),
            ("tx_bytes", self.tx_bytes),
            ("rx_missed", self.rx_missed),
            ("rx_errors", self.rx_errors),
            ("tx_errors", self.tx_errors),
            ("rx_nombuf", self.rx_nombuf),
        ]
    }
}

/// One read of a port's device counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePortStats {
    /// The port's id on its device framework (the DPDK port id).
    pub port_id: u16,
    /// The name the device framework gave the port (`net_af_packet0`, a
    /// PCI address).
    pub name: String,
    /// The driver (`net_af_packet`, `net_ixgbe`, …).
    pub driver: String,
    /// The basic counters, or why they could not be read.
    pub counters: Result<DeviceCounters, String>,
    /// The driver's extended counters by name, in the driver's order
    /// (empty where it keeps none or they could not be read).
    pub xstats: Vec<(String, u64)>,
}

/// A frame could not take more: out of room or out of segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameFull;

impl core::fmt::Display for FrameFull {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("frame full")
    }
}

impl std::error::Error for FrameFull {}

/// A frame being built for transmission.
pub trait TxFrame: Send {
    /// Bytes so far.
    fn len(&self) -> usize;

    /// Whether nothing was added yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `bytes`, copied into the frame's own buffer.
    fn append(&mut self, bytes: &[u8]) -> Result<(), FrameFull>;

    /// Appends `n` zero bytes (Ethernet padding).
    fn append_zeros(&mut self, n: usize) -> Result<(), FrameFull>;

    /// Appends `len` bytes and hands them back to be written in place,
    /// where the frame holds them in one piece of its own buffer; `None`,
    /// with nothing appended, otherwise (the caller then appends a copy).
    /// What they hold before they are written is unspecified.
    fn append_in_place(&mut self, _len: usize) -> Option<&mut [u8]> {
        None
    }

    /// Appends `len` bytes of `region` from `offset`, copied (the path for
    /// ports without multi-segment transmit).
    fn append_copy(&mut self, region: &Region, offset: usize, len: usize) -> Result<(), FrameFull>;

    /// [`TxFrame::append_copy`] as the one pass over the payload in which
    /// the transmit path also takes the MPA CRC and the TCP checksum
    /// ([`crate::pass`]): returns the CRC32c of the copied bytes extended
    /// from `crc` and their Internet checksum partial sum (as if they
    /// started at an even offset).
    fn append_copy_pass(
        &mut self,
        region: &Region,
        offset: usize,
        len: usize,
        crc: u32,
    ) -> Result<(u32, u32), FrameFull>;

    /// Overwrites bytes already in the frame from `at` (the headers, written
    /// after the payload they checksum); they must lie in its first buffer,
    /// as the headers do.
    fn patch(&mut self, at: usize, bytes: &[u8]) -> Result<(), FrameFull>;

    /// Appends `slice` by reference (zero-copy). The frame keeps the memory
    /// alive until the device has sent it. On a port without multi-segment
    /// transmit this copies instead.
    fn attach(&mut self, slice: RegionSlice) -> Result<(), FrameFull>;

    /// Makes this (still empty) frame one the port cuts into TCP segments
    /// of `seg_len` payload bytes each ([`LinkCaps::tso`]): it may then
    /// grow to [`TsoCaps::max_bytes`] of payload. Frames of a port without
    /// the offload cannot.
    fn segment_by(&mut self, seg_len: usize) -> Result<(), FrameFull> {
        let _ = seg_len;
        Err(FrameFull)
    }
}

/// One RX and one TX queue of a port, used by exactly one worker.
pub trait LinkQueue: Send + 'static {
    /// A received frame, kept by reference until dropped.
    type RxBuf: AsRef<[u8]> + Send + 'static;
    /// A frame being built.
    type TxFrame: TxFrame;

    /// Which queue of the port this is.
    fn index(&self) -> u16;

    /// Receives up to `max` frames, appending them to `out`; returns how
    /// many. Never blocks.
    fn rx_burst(&mut self, out: &mut Vec<Self::RxBuf>, max: usize) -> usize;

    /// What the device's receive checksum offload said about `buf`: a
    /// checksum it found good is not summed again in software, a frame it
    /// found bad is dropped unparsed. The default, for devices that check
    /// nothing, leaves both checksums to software.
    fn rx_checksum(&self, _buf: &Self::RxBuf) -> RxChecksum {
        RxChecksum::VERIFY
    }

    /// A fresh frame to fill, or `None` if the port is out of buffers.
    fn alloc_tx(&mut self) -> Option<Self::TxFrame>;

    /// Sends frames from the front of `frames`, removing those the device
    /// took; returns how many. Frames left were not sent (the ring was
    /// full): the caller retries or drops them.
    fn tx_burst(&mut self, frames: &mut Vec<Self::TxFrame>) -> usize;

    /// Called on the worker (its control path) when `region` is
    /// registered with the dataplane, before any work request can use it:
    /// a device that reads memory by DMA learns it here (the DPDK port
    /// registers it with EAL and maps it). An error fails the
    /// registration. The default needs nothing.
    fn register_region(&mut self, _region: &Region) -> Result<(), String> {
        Ok(())
    }

    /// Called on the worker's own thread before its loop starts (after
    /// pinning); the guard returned lives until the loop ends, on that
    /// thread. The DPDK port registers the thread as an EAL lcore here, so
    /// that its mempool cache works.
    fn on_worker_thread(&self) -> Result<Option<Box<dyn core::any::Any>>, String> {
        Ok(None)
    }
}

// ---------------------------------------------------------------------
// The in-memory link.
// ---------------------------------------------------------------------

/// Room a frame buffer keeps beyond the IP MTU: Ethernet header and one
/// VLAN tag.
pub const FRAME_OVERHEAD: usize = 18;

/// Pieces one [`MemFrame`] holds at most (bytes runs and attachments).
const MAX_PIECES: usize = 16;

/// A [`MemLink`] train ([`MemLinkConfig::tso`]): most payload bytes,
/// records and pieces.
const MEM_TSO_BYTES: usize = 32 * 1024;
const MEM_TSO_RECORDS: usize = 24;
const MEM_TSO_PIECES: usize = 1 + 3 * MEM_TSO_RECORDS;
/// Frames a [`MemLink`] queue makes up front (at least a transmit burst
/// and a spare).
const MEM_POOL_FRAMES: usize = 64;

/// Configuration of a [`MemLink`] pair.
#[derive(Debug, Clone, PartialEq)]
pub struct MemLinkConfig {
    /// Queue pairs on each end.
    pub queues: u16,
    /// IP MTU.
    pub mtu: usize,
    /// Frames each receive queue holds before dropping.
    pub ring_size: usize,
    /// Receive buffers per end (shared by its queues). Frames the TCP
    /// engine keeps (out of order, not yet read) hold one each.
    pub pool_size: usize,
    /// Probability that a frame is lost, in each direction.
    pub loss: f64,
    /// Seed of the loss draws.
    pub seed: u64,
    /// Advertise multi-segment transmit (attachments stay references until
    /// the frame is delivered). Off: attachments are copied into the frame.
    pub multi_seg_tx: bool,
    /// How received frames are spread over each end's queues.
    pub steering: Steering,
    /// Frames one `tx_burst` takes at most (0: every frame given), the
    /// rest left with the caller as a device whose ring is full leaves
    /// them (`net_ring` does): what the worker must retry.
    pub tx_burst_max: usize,
    /// Advertise TCP segmentation offload: a train
    /// ([`TxFrame::segment_by`]) is cut into segments here as a NIC cuts
    /// it, each with its headers and checksums, and each lost or delivered
    /// on its own.
    pub tso: bool,
}

/// How a [`MemLink`] end spreads received frames over its queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Steering {
    /// TCP over IPv4 by RSS ([`Rss::round_robin`] over the queues), the
    /// rest on queue 0, as a NIC steers; advertised in [`LinkCaps::rss`].
    #[default]
    Rss,
    /// Everything on queue 0: a device with one receive queue in use (the
    /// workers' software dispatcher must hand flows to their owners).
    Queue0,
    /// Frame after frame over the queues in turn, whatever the flow: a
    /// device that spreads without looking at flows, the hardest case for
    /// the dispatcher (a flow's frames arrive on every queue).
    RoundRobin,
}

impl Default for MemLinkConfig {
    fn default() -> MemLinkConfig {
        MemLinkConfig {
            queues: 1,
            mtu: 1500,
            ring_size: 4096,
            pool_size: 16 * 1024,
            loss: 0.0,
            seed: 1,
            multi_seg_tx: true,
            steering: Steering::Rss,
            tx_burst_max: 0,
            tso: false,
        }
    }
}

/// Counters of one end of a [`MemLink`], readable while it runs.
#[derive(Debug, Default)]
pub struct MemLinkStats {
    /// Frames handed to `tx_burst` on this end.
    pub tx_frames: AtomicU64,
    /// Bytes of those frames.
    pub tx_bytes: AtomicU64,
    /// Frames from this end lost on purpose ([`MemLinkConfig::loss`]).
    pub lost: AtomicU64,
    /// Frames for this end dropped because no receive buffer was free.
    pub rx_no_buffer: AtomicU64,
    /// Frames for this end dropped because the queue's ring was full.
    pub rx_ring_full: AtomicU64,
    /// Trains this end cut into segments ([`MemLinkConfig::tso`]); each
    /// segment counts in `tx_frames`.
    pub tso_frames: AtomicU64,
    /// Segments cut from them.
    pub tso_segments: AtomicU64,
}

/// Losses a test arms on one end of a [`MemLink`] while it runs: the next
/// `n` frames from this end of at least `min_len` bytes are lost (counted
/// in [`MemLinkStats::lost`]), so that a test can drop exactly the
/// segments it means to (the first transmission of a record) and no pure
/// acknowledgement.
#[derive(Debug, Default)]
struct ArmedLoss {
    frames: AtomicU64,
    min_len: AtomicUsize,
}

/// Receive buffers of one end.
#[derive(Debug)]
struct BufPool {
    free: ArrayQueue<Vec<u8>>,
}

/// A received frame of a [`MemLink`]; its buffer returns to the pool when
/// dropped.
#[derive(Debug)]
pub struct MemBuf {
    data: Vec<u8>,
    pool: Arc<BufPool>,
}

impl AsRef<[u8]> for MemBuf {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for MemBuf {
    fn drop(&mut self) {
        let mut data = core::mem::take(&mut self.data);
        data.clear();
        // The pool has room for every buffer it ever gave out.
        let _ = self.pool.free.push(data);
    }
}

#[derive(Debug)]
struct End {
    rings: Vec<ArrayQueue<MemBuf>>,
    pool: Arc<BufPool>,
    rss: Rss,
    steering: Steering,
    /// The next queue of [`Steering::RoundRobin`].
    turn: AtomicUsize,
    stats: MemLinkStats,
    armed: ArmedLoss,
}

impl End {
    fn new(config: &MemLinkConfig) -> End {
        let queues = config.queues.max(1);
        let cap = config.mtu + FRAME_OVERHEAD;
        let pool = Arc::new(BufPool {
            free: ArrayQueue::new(config.pool_size.max(1)),
        });
        for _ in 0..config.pool_size.max(1) {
            let _ = pool.free.push(Vec::with_capacity(cap));
        }
        End {
            rings: (0..queues)
                .map(|_| ArrayQueue::new(config.ring_size.max(1)))
                .collect(),
            pool,
            rss: Rss::round_robin(queues),
            steering: config.steering,
            turn: AtomicUsize::new(0),
            stats: MemLinkStats::default(),
            armed: ArmedLoss::default(),
        }
    }

    /// Takes a frame that `fill` writes into an empty receive buffer of
    /// this end, onto the ring of the queue it steers to; `false` (and
    /// counted) when no buffer or no ring room was left.
    fn receive(&self, fill: impl FnOnce(&mut Vec<u8>)) -> bool {
        let Some(mut data) = self.pool.free.pop() else {
            add(&self.stats.rx_no_buffer, 1);
            return false;
        };
        fill(&mut data);
        let q = self.steer(&data);
        let buf = MemBuf {
            data,
            pool: self.pool.clone(),
        };
        if self.rings[q].push(buf).is_err() {
            add(&self.stats.rx_ring_full, 1);
            return false;
        }
        true
    }

    /// The queue a frame lands on, as [`End::steering`] says: by default
    /// TCP over IPv4 by RSS, the rest (ARP) on queue 0, as a NIC steers.
    fn steer(&self, frame: &[u8]) -> usize {
        if self.rings.len() == 1 {
            return 0;
        }
        match self.steering {
            Steering::Rss => self
                .rss
                .queue_of_frame(frame)
                .map_or(0, |q| usize::from(q) % self.rings.len()),
            Steering::Queue0 => 0,
            Steering::RoundRobin => self.turn.fetch_add(1, Ordering::Relaxed) % self.rings.len(),
        }
    }
}

/// One end of an in-memory Ethernet cable with multi-queue NICs at both
/// ends: what one end's queues send arrives on the other end's queues,
/// steered by RSS. Delivery is immediate; loss is optional and seeded.
/// Attached payload stays a reference until delivery, which copies it into
/// the receiver's buffer the way a NIC's DMA would read it.
#[derive(Debug)]
pub struct MemLink {
    caps: LinkCaps,
    me: Arc<End>,
    peer: Arc<End>,
    taken: Vec<bool>,
    loss_threshold: u64,
    seed: u64,
    frame_cap: usize,
    tx_burst_max: usize,
}

impl MemLink {
    /// Both ends of a new link; the ends' MAC addresses are `mac_a` and
    /// `mac_b`.
    pub fn pair(
        config: &MemLinkConfig,
        mac_a: EthernetAddress,
        mac_b: EthernetAddress,
    ) -> (MemLink, MemLink) {
        let a = Arc::new(End::new(config));
        let b = Arc::new(End::new(config));
        (
            MemLink::end(config, &a, &b, mac_a, 1),
            MemLink::end(config, &b, &a, mac_b, 2),
        )
    }

    /// The end `me` of a link whose other end is `peer`; `side` tells the
    /// ends' loss draws apart.
    fn end(
        config: &MemLinkConfig,
        me: &Arc<End>,
        peer: &Arc<End>,
        mac: EthernetAddress,
        side: u64,
    ) -> MemLink {
        MemLink {
            caps: LinkCaps {
                tso: config.tso.then_some(TsoCaps {
                    max_bytes: MEM_TSO_BYTES,
                    max_segments: MEM_TSO_RECORDS,
                    shortfall: 0,
                    even_pieces: false,
                }),
                mac,
                mtu: config.mtu,
                queues: config.queues.max(1),
                multi_seg_tx: config.multi_seg_tx,
                max_tx_segments: MAX_PIECES,
                tx_checksum_offload: false,
                rx_checksum_offload: false,
                rss: (config.steering == Steering::Rss).then(|| me.rss.clone()),
            },
            me: me.clone(),
            peer: peer.clone(),
            taken: vec![false; usize::from(config.queues.max(1))],
            // Saturating float-to-int conversion: loss 1.0 loses all.
            loss_threshold: (config.loss.clamp(0.0, 1.0) * u64::MAX as f64) as u64,
            seed: config.seed ^ side.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            frame_cap: config.mtu + FRAME_OVERHEAD,
            tx_burst_max: config.tx_burst_max,
        }
    }

    /// One end of the link named `name` in this process: the first caller
    /// creates the link with `config` and gets one end, the second gets
    /// the other (its `config` is ignored but for `mac`). How two
    /// dataplanes opened from configuration files (device `mem:NAME`) find
    /// each other.
    pub fn named(name: &str, config: &MemLinkConfig, mac: EthernetAddress) -> MemLink {
        static WAITING: Mutex<Option<HashMap<String, MemLink>>> = Mutex::new(None);
        // A poisoned registry only means a panic elsewhere; the map is
        // consistent between statements.
        let mut waiting = WAITING.lock().unwrap_or_else(|e| e.into_inner());
        let map = waiting.get_or_insert_with(HashMap::new);
        if let Some(mut other) = map.remove(name) {
            other.caps.mac = mac;
            return other;
        }
        let (a, b) = MemLink::pair(config, mac, mac);
        map.insert(name.to_owned(), b);
        a
    }

    /// Counters of this end.
    pub fn stats(&self) -> &MemLinkStats {
        &self.me.stats
    }

    /// A handle on this end's counters that outlives the link.
    pub fn stats_handle(&self) -> MemLinkStatsHandle {
        MemLinkStatsHandle(self.me.clone())
    }
}

impl MemLink {
    /// A link end whose far side a program drives by hand through the
    /// returned [`MemPort`]: what the dataplane sends waits there to be
    /// taken, and what the program injects arrives on this end's queues
    /// (steered as [`MemLinkConfig::steering`] says). How a simulation puts
    /// a network of its own between real dataplanes. The far side keeps
    /// one queue, so frames are taken in the order they were sent.
    pub fn external(config: &MemLinkConfig, mac: EthernetAddress) -> (MemLink, MemPort) {
        let near_end = Arc::new(End::new(config));
        let far_end = Arc::new(End::new(&MemLinkConfig {
            queues: 1,
            ..config.clone()
        }));
        let near = MemLink::end(config, &near_end, &far_end, mac, 1);
        let port = MemPort {
            near: near_end,
            far: far_end,
        };
        (near, port)
    }
}

/// The far side of a [`MemLink::external`] end.
#[derive(Debug)]
pub struct MemPort {
    near: Arc<End>,
    far: Arc<End>,
}

impl MemPort {
    /// The next frame the dataplane sent, oldest first.
    pub fn take(&self) -> Option<Vec<u8>> {
        self.far.rings[0].pop().map(|b| b.data.clone())
    }

    /// Delivers `frame` to the dataplane's receive queues; `false` when it
    /// was dropped for want of a receive buffer or ring room (counted in
    /// the end's [`MemLinkStats`]).
    pub fn inject(&self, frame: &[u8]) -> bool {
        self.near.receive(|d| d.extend_from_slice(frame))
    }

    /// Counters of the dataplane's end.
    pub fn stats(&self) -> &MemLinkStats {
        &self.near.stats
    }
}

/// Shared access to one end's [`MemLinkStats`].
#[derive(Debug, Clone)]
pub struct MemLinkStatsHandle(Arc<End>);

impl MemLinkStatsHandle {
    /// The counters.
    pub fn get(&self) -> &MemLinkStats {
        &self.0.stats
    }

    /// Loses the next `n` frames this end sends that are at least
    /// `min_len` bytes long (on top of [`MemLinkConfig::loss`]); a later
    /// call replaces what is left of an earlier one.
    pub fn lose_next(&self, n: u64, min_len: usize) {
        self.0.armed.min_len.store(min_len, Ordering::Relaxed);
        self.0.armed.frames.store(n, Ordering::Relaxed);
    }
}

impl Link for MemLink {
    type Queue = MemQueue;

    fn caps(&self) -> &LinkCaps {
        &self.caps
    }

    fn take_queue(&mut self, index: u16) -> Option<MemQueue> {
        let slot = self.taken.get_mut(usize::from(index))?;
        if *slot {
            return None;
        }
        *slot = true;
        let tso = self.caps.tso.is_some();
        // Made up front, as a port's pool is, for the most a worker holds
        // (its transmit burst, and one spare), not while it runs: a burst
        // larger than any before (loss and its repairs, a run of ACKs)
        // must not allocate.
        let spare = (0..MEM_POOL_FRAMES)
            .map(|_| MemFrame::new(self.frame_cap, self.caps.multi_seg_tx, tso))
            .collect();
        Some(MemQueue {
            index,
            me: self.me.clone(),
            peer: self.peer.clone(),
            spare,
            rng: (self.seed ^ u64::from(index) << 32) | 1,
            loss_threshold: self.loss_threshold,
            frame_cap: self.frame_cap,
            multi_seg: self.caps.multi_seg_tx,
            tx_burst_max: self.tx_burst_max,
            tso,
            // A train is laid out whole here before it is cut.
            scratch: Vec::with_capacity(if tso { MEM_TSO_BYTES + HDR_ROOM } else { 0 }),
        })
    }

    fn counters(&self) -> Option<Box<dyn LinkStats>> {
        Some(Box::new(self.stats_handle()))
    }
}

/// One queue pair of a [`MemLink`] end.
#[derive(Debug)]
pub struct MemQueue {
    index: u16,
    me: Arc<End>,
    peer: Arc<End>,
    /// Frames sent and ready for reuse.
    spare: Vec<MemFrame>,
    rng: u64,
    loss_threshold: u64,
    frame_cap: usize,
    multi_seg: bool,
    /// See [`MemLinkConfig::tx_burst_max`].
    tx_burst_max: usize,
    /// See [`MemLinkConfig::tso`].
    tso: bool,
    scratch: Vec<u8>,
}

impl MemQueue {
    fn lost(&mut self) -> bool {
        if self.loss_threshold == 0 {
            return false;
        }
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) < self.loss_threshold
    }

    /// Whether `frame` is one of the losses armed by
    /// [`MemLinkStatsHandle::lose_next`] (and takes it).
    fn armed_loss(&self, frame: &MemFrame) -> bool {
        let armed = &self.me.armed;
        frame.len >= armed.min_len.load(Ordering::Relaxed)
            && armed
                .frames
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
    }

    /// Cuts a train as a NIC does and delivers each segment on its own.
    fn deliver_train(&mut self, frame: &MemFrame) {
        let mut all = core::mem::take(&mut self.scratch);
        all.clear();
        frame.flatten_into(&mut all);
        let d = &all[..];
        let Some(h) = TcpHeaders::parse(d).filter(|h| h.tcp_hl >= 20 && d.len() > h.tcp + h.tcp_hl)
        else {
            self.scratch = all;
            return;
        };
        let (tcp, hdr, src, dst) = (h.tcp, h.tcp + h.tcp_hl, h.src, h.dst);
        let chunks = d[hdr..].chunks(frame.tso_segsz);
        let n = chunks.len();
        add(&self.me.stats.tso_frames, 1);
        add(&self.me.stats.tso_segments, n as u64);
        for (k, chunk) in chunks.enumerate() {
            let off = k * frame.tso_segsz;
            self.deliver_with(hdr + chunk.len(), |data| {
                data.resize(hdr, 0);
                tcp_offload::iface::cut_header(&d[..hdr], k, off, chunk.len(), k + 1 == n, data);
                data.extend_from_slice(chunk);
                TcpPacket::new_unchecked(&mut data[tcp..]).fill_checksum(src, dst);
            });
        }
        self.scratch = all;
    }

    /// Counts, loses or delivers one frame of `len` bytes that `fill`
    /// writes into an empty receive buffer.
    fn deliver_with(&mut self, len: usize, fill: impl FnOnce(&mut Vec<u8>)) {
        add(&self.me.stats.tx_frames, 1);
        add(&self.me.stats.tx_bytes, len as u64);
        if self.lost() {
            add(&self.me.stats.lost, 1);
            return;
        }
        self.peer.receive(fill);
    }

    fn deliver(&mut self, frame: &MemFrame) {
        if frame.tso_segsz > 0 {
            return self.deliver_train(frame);
        }
        add(&self.me.stats.tx_frames, 1);
        add(&self.me.stats.tx_bytes, frame.len as u64);
        if self.armed_loss(frame) || self.lost() {
            add(&self.me.stats.lost, 1);
            return;
        }
        self.peer.receive(|d| frame.flatten_into(d));
    }
}

/// Adds to a counter with one writer per end-direction or a few: a relaxed
/// read-modify-write (contention is rare: one queue per worker).
fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl LinkQueue for MemQueue {
    type RxBuf = MemBuf;
    type TxFrame = MemFrame;

    fn index(&self) -> u16 {
        self.index
    }

    fn rx_burst(&mut self, out: &mut Vec<MemBuf>, max: usize) -> usize {
        let ring = &self.me.rings[usize::from(self.index)];
        let mut n = 0;
        while n < max {
            let Some(b) = ring.pop() else { break };
            out.push(b);
            n += 1;
        }
        n
    }

    fn alloc_tx(&mut self) -> Option<MemFrame> {
        // Frames come back in tx_burst; a new one is made only while the
        // worker holds more than it ever did before (start-up).
        Some(
            self.spare
                .pop()
                .unwrap_or_else(|| MemFrame::new(self.frame_cap, self.multi_seg, self.tso)),
        )
    }

    fn tx_burst(&mut self, frames: &mut Vec<MemFrame>) -> usize {
        let n = match self.tx_burst_max {
            0 => frames.len(),
            max => frames.len().min(max),
        };
        for mut f in frames.drain(..n) {
            self.deliver(&f);
            f.reset();
            self.spare.push(f);
        }
        n
    }
}

#[derive(Debug)]
enum Piece {
    /// `bytes[start..end]` of the frame's own buffer.
    Bytes(usize, usize),
    /// Payload by reference.
    Region(RegionSlice),
}

/// A frame of a [`MemLink`] queue: its own byte buffer (sized for a whole
/// frame, allocated once) and a list of pieces.
#[derive(Debug)]
pub struct MemFrame {
    bytes: Vec<u8>,
    pieces: Vec<Piece>,
    len: usize,
    cap: usize,
    multi_seg: bool,
    /// The port segments (room for a train allocated with the frame).
    tso: bool,
    /// A train to cut into segments of this many payload bytes (0: a
    /// frame as it is).
    tso_segsz: usize,
    /// Pieces the frame may hold.
    max_pieces: usize,
    /// `cap` of a frame that is not a train.
    base_cap: usize,
}

/// Room for a train's headers (Ethernet, IPv4 and TCP with options).
const HDR_ROOM: usize = 14 + 60 + 60;

impl MemFrame {
    fn new(cap: usize, multi_seg: bool, tso: bool) -> MemFrame {
        let (bytes, pieces) = if tso {
            (cap.max(MEM_TSO_BYTES + HDR_ROOM), MEM_TSO_PIECES)
        } else {
            (cap, MAX_PIECES)
        };
        MemFrame {
            bytes: Vec::with_capacity(bytes),
            pieces: Vec::with_capacity(pieces),
            len: 0,
            cap,
            multi_seg,
            tso,
            tso_segsz: 0,
            max_pieces: MAX_PIECES,
            base_cap: cap,
        }
    }

    fn reset(&mut self) {
        self.bytes.clear();
        self.pieces.clear();
        self.len = 0;
        self.tso_segsz = 0;
        self.cap = self.base_cap;
        self.max_pieces = MAX_PIECES;
    }

    /// Appends the frame's bytes, attached payload materialised, to `out`.
    fn flatten_into(&self, out: &mut Vec<u8>) {
        for piece in &self.pieces {
            match piece {
                Piece::Bytes(s, e) => out.extend_from_slice(&self.bytes[*s..*e]),
                Piece::Region(slice) => {
                    let at = out.len();
                    out.resize(at + slice.len, 0);
                    slice.region.copy_out(slice.offset, &mut out[at..]);
                }
            }
        }
    }

    fn room(&self, n: usize) -> Result<(), FrameFull> {
        match self.len.checked_add(n) {
            Some(end) if end <= self.cap => Ok(()),
            _ => Err(FrameFull),
        }
    }

    /// Extends the last bytes piece by `n` bytes just added to `bytes`, or
    /// starts one.
    fn grew(&mut self, n: usize) -> Result<(), FrameFull> {
        let end = self.bytes.len();
        match self.pieces.last_mut() {
            Some(Piece::Bytes(_, e)) if *e == end - n => *e = end,
            _ => {
                if self.pieces.len() == self.max_pieces {
                    self.bytes.truncate(end - n);
                    return Err(FrameFull);
                }
                self.pieces.push(Piece::Bytes(end - n, end));
            }
        }
        self.len += n;
        Ok(())
    }

    /// Whether piece lists and contents agree with [`MemFrame::len`] (a
    /// test aid).
    pub fn attachments(&self) -> usize {
        self.pieces
            .iter()
            .filter(|p| matches!(p, Piece::Region(_)))
            .count()
    }
}

impl TxFrame for MemFrame {
    fn len(&self) -> usize {
        self.len
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(), FrameFull> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.room(bytes.len())?;
        self.bytes.extend_from_slice(bytes);
        self.grew(bytes.len())
    }

    fn append_zeros(&mut self, n: usize) -> Result<(), FrameFull> {
        if n == 0 {
            return Ok(());
        }
        // The room this link hands out comes zeroed.
        self.append_in_place(n).map(|_| ()).ok_or(FrameFull)
    }

    fn append_in_place(&mut self, len: usize) -> Option<&mut [u8]> {
        self.room(len).ok()?;
        let at = self.bytes.len();
        self.bytes.resize(at + len, 0);
        self.grew(len).ok()?;
        self.bytes.get_mut(at..)
    }

    fn append_copy(&mut self, region: &Region, offset: usize, len: usize) -> Result<(), FrameFull> {
        if len == 0 {
            return Ok(());
        }
        self.room(len)?;
        let at = self.bytes.len();
        self.bytes.resize(at + len, 0);
        region.copy_out(offset, &mut self.bytes[at..]);
        self.grew(len)
    }

    fn append_copy_pass(
        &mut self,
        region: &Region,
        offset: usize,
        len: usize,
        crc: u32,
    ) -> Result<(u32, u32), FrameFull> {
        if len == 0 {
            return Ok((crc, 0));
        }
        self.room(len)?;
        let at = self.bytes.len();
        self.bytes.resize(at + len, 0);
        let out = region
            .read_pass(offset, &mut self.bytes[at..], crc)
            .map_err(|_| FrameFull)?;
        self.grew(len)?;
        Ok(out)
    }

    fn patch(&mut self, at: usize, bytes: &[u8]) -> Result<(), FrameFull> {
        // The first piece holds the bytes appended first.
        match self.pieces.first() {
            Some(Piece::Bytes(start, end))
                if at
                    .checked_add(bytes.len())
                    .is_some_and(|e| start + e <= *end) =>
            {
                let from = start + at;
                self.bytes[from..from + bytes.len()].copy_from_slice(bytes);
                Ok(())
            }
            _ => Err(FrameFull),
        }
    }

    fn attach(&mut self, slice: RegionSlice) -> Result<(), FrameFull> {
        if !self.multi_seg {
            return self.append_copy(&slice.region, slice.offset, slice.len);
        }
        if slice.len == 0 {
            return Ok(());
        }
        self.room(slice.len)?;
        if self.pieces.len() == self.max_pieces {
            return Err(FrameFull);
        }
        self.len += slice.len;
        self.pieces.push(Piece::Region(slice));
        Ok(())
    }

    fn segment_by(&mut self, seg_len: usize) -> Result<(), FrameFull> {
        if !self.tso || self.len != 0 || seg_len == 0 {
            return Err(FrameFull);
        }
        self.tso_segsz = seg_len;
        self.cap = MEM_TSO_BYTES + HDR_ROOM;
        self.max_pieces = MEM_TSO_PIECES;
        Ok(())
    }
}

impl LinkStats for MemLinkStatsHandle {
    fn read(&self) -> Vec<(&'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let s = self.get();
        vec![
            ("tx_frames", g(&s.tx_frames)),
            ("tx_bytes", g(&s.tx_bytes)),
            ("lost", g(&s.lost)),
            ("rx_no_buffer", g(&s.rx_no_buffer)),
            ("rx_ring_full", g(&s.rx_ring_full)),
            ("tso_frames", g(&s.tso_frames)),
            ("tso_segments", g(&s.tso_segments)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steer::ipv4_tcp_flow;

    const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
    const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);

    fn tcp_frame(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 54];
        f[12] = 0x08;
        f[14] = 0x45;
        f[23] = 6;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    #[test]
    fn frames_cross_with_attached_payload_materialised() {
        let (mut a, mut b) = MemLink::pair(&MemLinkConfig::default(), MAC_A, MAC_B);
        assert_eq!(a.caps().mac, MAC_A);
        let mut qa = a.take_queue(0).unwrap();
        assert!(a.take_queue(0).is_none());
        let mut qb = b.take_queue(0).unwrap();
        let region = Region::new(4096).unwrap();
        region.write(100, b"payload!").unwrap();
        let mut f = qa.alloc_tx().unwrap();
        f.append(b"head").unwrap();
        f.attach(RegionSlice {
            region: region.clone(),
            offset: 100,
            len: 8,
        })
        .unwrap();
        f.append(b"tail").unwrap();
        f.append_zeros(2).unwrap();
        assert_eq!((f.len(), f.attachments()), (18, 1));
        let mut out = vec![f];
        assert_eq!(qa.tx_burst(&mut out), 1);
        assert!(out.is_empty());
        let mut rx = Vec::new();
        assert_eq!(qb.rx_burst(&mut rx, 32), 1);
        assert_eq!(rx[0].as_ref(), b"headpayload!tail\0\0");
        assert_eq!(a.stats().tx_frames.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn without_multi_seg_attachments_are_copied_and_frames_are_bounded() {
        let cfg = MemLinkConfig {
            multi_seg_tx: false,
            mtu: 100,
            ..MemLinkConfig::default()
        };
        let (mut a, _b) = MemLink::pair(&cfg, MAC_A, MAC_B);
        let mut q = a.take_queue(0).unwrap();
        let region = Region::new(4096).unwrap();
        let mut f = q.alloc_tx().unwrap();
        f.attach(RegionSlice {
            region: region.clone(),
            offset: 0,
            len: 100,
        })
        .unwrap();
        assert_eq!(f.attachments(), 0);
        assert_eq!(f.append(&[0; 19]), Err(FrameFull));
        f.append(&[0; 18]).unwrap();
        assert_eq!(f.len(), 118);
    }

    #[test]
    fn rss_steers_tcp_and_sends_the_rest_to_queue_zero() {
        let cfg = MemLinkConfig {
            queues: 4,
            ..MemLinkConfig::default()
        };
        let (mut a, mut b) = MemLink::pair(&cfg, MAC_A, MAC_B);
        let rss = b.caps().rss.clone().unwrap();
        let mut qa = a.take_queue(2).unwrap();
        let mut qbs: Vec<MemQueue> = (0..4).map(|i| b.take_queue(i).unwrap()).collect();
        let mut frames = Vec::new();
        for sport in 50_000..50_040u16 {
            let mut f = qa.alloc_tx().unwrap();
            f.append(&tcp_frame([10, 0, 0, 1], [10, 0, 0, 2], sport, 4791))
                .unwrap();
            frames.push(f);
        }
        let mut arp = qa.alloc_tx().unwrap();
        arp.append(&[0xff; 12]).unwrap();
        arp.append(&[0x08, 0x06]).unwrap();
        arp.append(&[0; 46]).unwrap();
        frames.push(arp);
        qa.tx_burst(&mut frames);
        let mut seen = 0;
        for (q, qb) in qbs.iter_mut().enumerate() {
            let mut rx = Vec::new();
            qb.rx_burst(&mut rx, 64);
            for f in &rx {
                match ipv4_tcp_flow(f.as_ref()) {
                    Some((s, d, sp, dp)) => {
                        assert_eq!(usize::from(rss.queue_for(s, d, sp, dp)), q);
                        seen += 1;
                    }
                    None => assert_eq!(q, 0, "ARP lands on queue 0"),
                }
            }
        }
        assert_eq!(seen, 40);
    }

    #[test]
    fn a_link_that_does_not_steer_says_so_and_spreads_as_configured() {
        for steering in [Steering::Queue0, Steering::RoundRobin] {
            let cfg = MemLinkConfig {
                queues: 2,
                steering,
                ..MemLinkConfig::default()
            };
            let (mut a, mut b) = MemLink::pair(&cfg, MAC_A, MAC_B);
            assert_eq!(b.caps().rss, None, "{steering:?}");
            let mut qa = a.take_queue(1).unwrap();
            let mut qbs: Vec<MemQueue> = (0..2).map(|i| b.take_queue(i).unwrap()).collect();
            let mut frames = Vec::new();
            for _ in 0..10 {
                let mut f = qa.alloc_tx().unwrap();
                // One flow: RSS would put every frame on one queue.
                f.append(&tcp_frame([10, 0, 0, 1], [10, 0, 0, 2], 50_000, 4791))
                    .unwrap();
                frames.push(f);
            }
            qa.tx_burst(&mut frames);
            let counts: Vec<usize> = qbs
                .iter_mut()
                .map(|q| q.rx_burst(&mut Vec::new(), 64))
                .collect();
            let want = match steering {
                Steering::Queue0 => vec![10, 0],
                _ => vec![5, 5],
            };
            assert_eq!(counts, want, "{steering:?}");
        }
    }

    #[test]
    fn loss_drops_about_the_configured_share_and_buffers_return() {
        let cfg = MemLinkConfig {
            loss: 0.25,
            pool_size: 8,
            ..MemLinkConfig::default()
        };
        let (mut a, mut b) = MemLink::pair(&cfg, MAC_A, MAC_B);
        let mut qa = a.take_queue(0).unwrap();
        let mut qb = b.take_queue(0).unwrap();
        let mut got = 0;
        for _ in 0..1000 {
            let mut f = qa.alloc_tx().unwrap();
            f.append(&[1; 60]).unwrap();
            qa.tx_burst(&mut vec![f]);
            let mut rx = Vec::new();
            got += qb.rx_burst(&mut rx, 8);
            // Dropping the buffers gives them back to the pool of 8.
        }
        let lost = a.stats().lost.load(Ordering::Relaxed);
        assert_eq!(got as u64 + lost, 1000);
        assert!((150..350).contains(&lost), "lost {lost}");
        assert_eq!(b.stats().rx_no_buffer.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn armed_losses_take_exactly_the_next_long_frames() {
        let (mut a, mut b) = MemLink::pair(&MemLinkConfig::default(), MAC_A, MAC_B);
        let (mut qa, mut qb) = (a.take_queue(0).unwrap(), b.take_queue(0).unwrap());
        a.stats_handle().lose_next(2, 100);
        let mut arrived = Vec::new();
        for len in [60, 200, 60, 100, 300, 60] {
            let mut f = qa.alloc_tx().unwrap();
            f.append(&vec![len as u8; len]).unwrap();
            qa.tx_burst(&mut vec![f]);
            let mut rx = Vec::new();
            qb.rx_burst(&mut rx, 4);
            arrived.extend(rx.iter().map(|r| r.as_ref().len()));
        }
        // The 200- and 100-byte frames were lost, the short ones and the
        // long one after the armed count ran out arrived.
        assert_eq!(arrived, [60, 60, 300, 60]);
        assert_eq!(a.stats().lost.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn named_links_join_two_openers() {
        let cfg = MemLinkConfig::default();
        let mut a = MemLink::named("link-test-join", &cfg, MAC_A);
        let mut b = MemLink::named("link-test-join", &cfg, MAC_B);
        assert_eq!((a.caps().mac, b.caps().mac), (MAC_A, MAC_B));
        let (mut qa, mut qb) = (a.take_queue(0).unwrap(), b.take_queue(0).unwrap());
        let mut f = qb.alloc_tx().unwrap();
        f.append(b"hello").unwrap();
        qb.tx_burst(&mut vec![f]);
        let mut rx = Vec::new();
        assert_eq!(qa.rx_burst(&mut rx, 4), 1);
        assert_eq!(rx[0].as_ref(), b"hello");
    }
}
