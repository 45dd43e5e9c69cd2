//! The DPDK port behind the [`Link`] seam: EAL started once per process,
//! one RX and one TX queue per worker, mbufs as received frames, and
//! frames built as mbuf chains whose payload is attached from registered
//! memory as external buffers.
//!
//! It sits at both ends of each worker's pipeline: [`DpdkQueue::rx_burst`]
//! starts it and [`DpdkQueue::tx_burst`] ends it. All DPDK calls go
//! through `dpdk-bindings`; the one `unsafe` step (attaching region memory
//! to an mbuf) lives in [`crate::memory::attach_ext`].
//!
//! # EAL
//!
//! EAL starts once per process ([`start_eal`]) and is shared by every
//! [`DpdkLink`] of the process; it is cleaned up (runtime directory
//! included) when the last link, queue and in-flight mbuf are gone, and
//! cannot start again in that process. Each worker thread registers as an
//! EAL lcore ([`LinkQueue::on_worker_thread`]), so the mempool's per-lcore
//! cache serves its allocations.
//!
//! # Receive
//!
//! A received frame is a [`DpdkRxBuf`]: the mbuf itself, read through its
//! first segment. A frame that arrives as a chain (scattered RX of a jumbo
//! frame, or over `net_ring`, where the receiver gets the sender's TX chain
//! of header, external payload and trailer) is copied into one mbuf of the
//! port's pool first, whose data room holds a whole frame at the MTU; the
//! chain is freed at once (which also releases the sender's external
//! buffer).
//!
//! The device's RX checksum verdicts (the mbuf's `RX_IP_CKSUM_*` and
//! `RX_L4_CKSUM_*` flags, read from the head of the chain as received,
//! before any linearizing copy) travel with the frame
//! ([`DpdkRxBuf::checksum`]) and reach `tcp-offload` through
//! [`LinkQueue::rx_checksum`]: a checksum the device found good (or whose
//! data it vouched for, `*_CKSUM_NONE`) is not summed again, one it found
//! bad drops the frame, and one it did not check is verified in software.
//! None of the virtual devices used here set these flags; every frame
//! they deliver is verified in software.
//!
//! # Transmit
//!
//! A [`DpdkFrame`] is a chain: headers appended into the first mbuf, the
//! payload attached by reference ([`TxFrame::attach`]) as an external
//! buffer in an mbuf of its own, pad and MPA CRC in a third. Each
//! attachment takes a shared-info slot from the queue's `ExtBufPool` and
//! pins the region ([`ExtPin`]); the queue keeps the pins of sent frames
//! until the driver (or, over `net_ring`, the receiving side) frees the
//! mbuf, so a region never goes while a device may read it. Attachments
//! are copied instead when the port lacks multi-segment TX (af_xdp in
//! DPDK 22.11), when the region has no IOVA (a heap region under
//! IOVA-as-PA, see below), when the payload is small, or when no slot is
//! free.
//!
//! # Registered memory
//!
//! When a region is registered with the dataplane, each worker's queue
//! ([`LinkQueue::register_region`], on the worker's control path) makes
//! sure EAL knows it: the region's storage is registered once
//! (`rte_extmem_register`, page size and per-page IOVAs; see
//! [`crate::memory`]) and DMA-mapped for this port (`rte_dev_dma_map`,
//! which VFIO needs; the vdev bus accepts it and does nothing, and a bus
//! without the operation is counted in [`DpdkLinkStats::mem_dma_unsupported`]).
//! An attachment takes its IOVA from the registration and is split into
//! several external segments where the region's pages are not
//! IOVA-contiguous (2 MiB hugepages under IOVA-as-PA). The registration is
//! undone when the region's storage goes, after the last in-flight mbuf.
//!
//! - IOVA-as-VA (`--no-huge`, VFIO): every region is registered (4 KiB or
//!   2 MiB pages, IOVA = address). Where registration fails (EAL has a
//!   fixed number of memory segment lists) and every device is a virtual
//!   one, the failure is counted ([`DpdkLinkStats::mem_register_failed`])
//!   and the region attached by address as before; for a device that does
//!   DMA the memory registration fails.
//! - IOVA-as-PA (hugepages as root without an IOMMU): hugepage-backed
//!   regions are registered with their physical addresses; heap regions
//!   cannot be (their pages may move) and are copied
//!   ([`DpdkLinkStats::mem_not_registered`]).
//!
//! TCP checksums: where the port grants TX TCP checksum offload, the worker
//! leaves the pseudo-header sum in the field and the frame asks the device
//! to finish it (frames whose checksum is already complete, such as those
//! held for ARP, are recognised and left alone); elsewhere the worker
//! computes it while reading the payload.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use dpdk_bindings::{
    CksumStatus, DpdkError, Eal, ExtBufPool, Mbuf, MbufBurst, Mempool, Port, PortConfig,
    PortCounters, PortSetup, PortStats, RxQueue, TxQueue, BURST,
};
use tcp_offload::iface::{DeviceCksum, RxChecksum};
use tcp_offload::wire::{checksum, EthernetAddress};

pub use crate::link::{DeviceCounters, DevicePortStats};
use crate::link::{
    DeviceStats, FrameFull, Link, LinkCaps, LinkQueue, LinkStats, TcpHeaders, TsoCaps, TxFrame,
    FRAME_OVERHEAD,
};
use crate::memory::{attach_ext, ExtPin, Region, RegionSlice};
use crate::steer::Rss;

/// Headroom DPDK leaves before each mbuf's data (`RTE_PKTMBUF_HEADROOM`).
const HEADROOM: u16 = 128;

/// The smallest data room of a pool mbuf (DPDK's default 2048, plus
/// headroom).
const MIN_DATA_ROOM: usize = 2048;

/// How much of the next transmit buffer is claimed for writing while a
/// frame is filled: a standard frame whole (no more than the largest
/// frame: lines past it would be claimed for nothing); of a jumbo one the
/// start.
const TX_PREFETCH: usize = 2048;

/// Segments of one transmitted chain at most.
const MAX_SEGMENTS: usize = 16;

/// Most segments in a chain the device cuts into TCP segments: a train
/// of [`TSO_MAX_RECORDS`] records, each its header bytes, payload and
/// trailer, or 64 KiB copied into mbufs of [`MIN_DATA_ROOM`].
const TSO_MAX_SEGMENTS: usize = 128;

/// Most records in one train: what DPDK's software segmentation (as
/// `net_tap` runs it) cuts one frame into at most.
const TSO_MAX_RECORDS: usize = 64;

/// Most TCP payload in one train: what the IPv4 length field leaves
/// after the largest IPv4 and TCP headers.
const TSO_MAX_BYTES: usize = 0xffff - 60 - 60;

/// External attachments one frame holds at most (more are copied).
const MAX_PINS: usize = 32;

/// External segments one attached payload is split into at most (where
/// its pages are not IOVA-contiguous); more and it is copied.
const MAX_SPLIT: usize = 4;

/// Payload shorter than this is copied rather than attached: an mbuf and a
/// slot cost more than copying a few cache lines.
const ATTACH_MIN: usize = 256;

/// Why a DPDK port could not be brought up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DpdkLinkError {
    /// A DPDK call failed.
    Dpdk(DpdkError),
    /// EAL already ran in this process and was cleaned up: it cannot start
    /// twice.
    EalEnded,
    /// An argument the port cannot honour.
    Invalid(String),
}

impl core::fmt::Display for DpdkLinkError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DpdkLinkError::Dpdk(e) => write!(f, "{e}"),
            DpdkLinkError::EalEnded => f.write_str(
                "EAL already ran in this process and was cleaned up; it starts once per process",
            ),
            DpdkLinkError::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for DpdkLinkError {}

impl From<DpdkError> for DpdkLinkError {
    fn from(e: DpdkError) -> Self {
        DpdkLinkError::Dpdk(e)
    }
}

// ---------------------------------------------------------------------
// EAL, once per process.
// ---------------------------------------------------------------------

enum EalSlot {
    Never,
    Running(Weak<Eal>),
}

static EAL: Mutex<EalSlot> = Mutex::new(EalSlot::Never);

/// The process's EAL: started with `args` by the first caller, shared by
/// later ones (whose `args` are ignored) while any holder is alive.
/// Cleaned up when the last holder goes (links and queues hold it); after
/// that it cannot start again in this process ([`DpdkLinkError::EalEnded`]).
pub fn start_eal(args: &[String]) -> Result<Arc<Eal>, DpdkLinkError> {
    // A poisoned lock only means a panic elsewhere; the slot is written in
    // single statements.
    let mut slot = EAL.lock().unwrap_or_else(|e| e.into_inner());
    if let EalSlot::Running(weak) = &*slot {
        return weak.upgrade().ok_or(DpdkLinkError::EalEnded);
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let eal = Arc::new(Eal::init(&argv)?);
    *slot = EalSlot::Running(Arc::downgrade(&eal));
    Ok(eal)
}

/// EAL arguments for a run without hugepages or PCI (which forces
/// IOVA-as-VA), its runtime files under `prefix`, with `vdevs` as virtual
/// devices: what tests and the default configuration use.
pub fn default_eal_args(prefix: &str, vdevs: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "-l",
        "0",
        "--no-huge",
        "-m",
        "256",
        "--no-pci",
        "--no-telemetry",
        "--log-level=warning",
        "--file-prefix",
        prefix,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(vdevs.iter().map(|v| format!("--vdev={v}")));
    args
}

/// The EAL arguments for a configuration: its own `eal.args` if any (with
/// a `--file-prefix` unique to the process added when missing), the
/// defaults of [`default_eal_args`] otherwise; a vdev device string
/// (`net_…`) is added as `--vdev` unless the arguments name it already.
pub fn eal_args_for(user: &[String], device: &str) -> Vec<String> {
    let prefix = format!("iwarp-{}", std::process::id());
    let mut args = if user.is_empty() {
        default_eal_args(&prefix, &[])
    } else {
        let mut a = user.to_vec();
        if !a.iter().any(|x| x.starts_with("--file-prefix")) {
            a.push("--file-prefix".into());
            a.push(prefix);
        }
        a
    };
    let name = device_name(device);
    if name.starts_with("net_") && !args.iter().any(|a| a.contains(name)) {
        args.push(format!("--vdev={device}"));
    }
    args
}

/// The port name in a device string: what comes before the first comma
/// (`net_af_packet0,iface=veth0` → `net_af_packet0`).
pub fn device_name(device: &str) -> &str {
    device.split(',').next().unwrap_or(device)
}

// ---------------------------------------------------------------------
// The link.
// ---------------------------------------------------------------------

/// How to set a port up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkLinkOptions {
    /// Queue pairs: one per worker.
    pub queues: u16,
    /// IP MTU (68 to 9000).
    pub mtu: usize,
    /// Our MAC address; the port's own if `None`. A different one turns on
    /// promiscuous mode (the device would filter our frames otherwise).
    pub mac: Option<EthernetAddress>,
    /// Descriptors per RX / TX queue (adjusted to the device).
    pub rx_desc: u16,
    /// Descriptors per TX queue.
    pub tx_desc: u16,
    /// Mbufs in the port's pool (a power of two minus one); `None` sizes
    /// it from the MTU.
    pub pool_size: Option<u32>,
    /// External-buffer slots per queue: attachments in flight at once.
    pub ext_slots: usize,
    /// Attach payload from registered memory to frames (where the device
    /// takes segment chains) rather than copy it in. Off for a peer that
    /// copies every chain it receives into one buffer anyway (the
    /// `net_ring` pair of `iwarp demo`): there an attached payload costs
    /// two more buffers per frame and the same copy, on the other side.
    pub attach_payload: bool,
    /// Hand the port trains of whole FPDUs to cut into segments where it
    /// has TCP segmentation offload ([`LinkCaps::tso`]).
    pub tso: bool,
}

impl Default for DpdkLinkOptions {
    fn default() -> Self {
        DpdkLinkOptions {
            queues: 1,
            mtu: 1500,
            mac: None,
            rx_desc: 1024,
            tx_desc: 1024,
            pool_size: None,
            ext_slots: 8192,
            attach_payload: true,
            tso: true,
        }
    }
}

/// Counters of one DPDK port, readable while it runs.
#[derive(Debug, Default)]
pub struct DpdkLinkStats {
    /// Received chains copied into one mbuf.
    pub rx_linearized: AtomicU64,
    /// Received frames dropped (too long for one mbuf, or no mbuf to
    /// linearize into).
    pub rx_dropped: AtomicU64,
    /// Payload pieces attached as external buffers (in frames the device
    /// took; counted per burst).
    pub tx_attached: AtomicU64,
    /// Payload pieces that were to be attached but were copied (in frames
    /// the device took).
    pub tx_copied: AtomicU64,
    /// Frames handed to the device with the TCP checksum offloaded.
    pub tx_cksum_offloaded: AtomicU64,
    /// Frames handed to the device to cut into TCP segments (trains).
    pub tx_tso_frames: AtomicU64,
    /// Segments the device was to cut from them.
    pub tx_tso_segments: AtomicU64,
    /// Attached payloads split into more than one external segment at a
    /// page boundary (pages not IOVA-contiguous).
    pub tx_split: AtomicU64,
    /// Regions this port's queues registered with EAL.
    pub mem_registered: AtomicU64,
    /// Registrations of memory whose DMA mapping for this port is in place
    /// (made then, or already made for an earlier registration of the
    /// same region).
    pub mem_dma_mapped: AtomicU64,
    /// Regions whose DMA mapping this port's bus does not support (no
    /// IOMMU to program: the registered IOVAs are used as they are).
    pub mem_dma_unsupported: AtomicU64,
    /// Registrations that failed on a virtual device under IOVA-as-VA
    /// (attached by address instead).
    pub mem_register_failed: AtomicU64,
    /// Heap regions left unregistered under IOVA-as-PA (copied on TX).
    pub mem_not_registered: AtomicU64,
}

impl From<PortStats> for DeviceCounters {
    fn from(s: PortStats) -> Self {
        DeviceCounters {
            rx_packets: s.ipackets,
            tx_packets: s.opackets,
            rx_bytes: s.ibytes,
            tx_bytes: s.obytes,
            rx_missed: s.imissed,
            rx_errors: s.ierrors,
            tx_errors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        }
    }
}

/// The device behind a [`DpdkLink`], whose counters the control path reads
/// on demand from a thread of its own ([`DevicePort::read`]), never from a
/// worker: see [`dpdk_bindings::PortCounters`] for why that is safe while
/// the workers poll the port's queues (it is what DPDK's telemetry does).
#[derive(Debug, Clone)]
pub struct DevicePort {
    counters: PortCounters,
    name: String,
    driver: String,
}

impl DevicePort {
    fn new(port: &Port) -> DevicePort {
        let counters = port.counters();
        DevicePort {
            name: port.name().unwrap_or_else(|_| format!("port{}", port.id())),
            driver: counters.driver_name().unwrap_or_default(),
            counters,
        }
    }

    /// The name DPDK gave the port.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads the counters now. A read allocates (names of the extended
    /// counters) and may read device registers: the control path's work,
    /// a few times a second at most.
    pub fn read(&self) -> DevicePortStats {
        DevicePortStats {
            port_id: self.counters.port_id(),
            name: self.name.clone(),
            driver: self.driver.clone(),
            counters: self
                .counters
                .stats()
                .map(DeviceCounters::from)
                .map_err(|e| e.to_string()),
            xstats: self
                .counters
                .xstats()
                .map(|x| x.into_iter().map(|s| (s.name, s.value)).collect())
                .unwrap_or_default(),
        }
    }
}

impl DeviceStats for DevicePort {
    fn read(&self) -> DevicePortStats {
        DevicePort::read(self)
    }
}

impl LinkStats for Arc<DpdkLinkStats> {
    fn read(&self) -> Vec<(&'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("rx_linearized", g(&self.rx_linearized)),
            ("rx_dropped", g(&self.rx_dropped)),
            ("tx_attached", g(&self.tx_attached)),
            ("tx_copied", g(&self.tx_copied)),
            ("tx_cksum_offloaded", g(&self.tx_cksum_offloaded)),
            ("tx_tso_frames", g(&self.tx_tso_frames)),
            ("tx_tso_segments", g(&self.tx_tso_segments)),
            ("tx_split", g(&self.tx_split)),
            ("mem_registered", g(&self.mem_registered)),
            ("mem_dma_mapped", g(&self.mem_dma_mapped)),
            ("mem_register_failed", g(&self.mem_register_failed)),
            ("mem_not_registered", g(&self.mem_not_registered)),
        ]
    }
}

/// A DPDK port as a [`Link`]. See the module documentation.
#[derive(Debug)]
pub struct DpdkLink {
    caps: LinkCaps,
    setup: PortSetup,
    queues: Vec<Option<DpdkQueue>>,
    stats: Arc<DpdkLinkStats>,
    pool: Mempool,
    port: Port,
    eal: Arc<Eal>,
}

/// Unique pool names within the process.
static POOL_SEQ: AtomicU32 = AtomicU32::new(0);

impl DpdkLink {
    /// Configures and starts `port` as `opts` says; its queues are ready
    /// to be taken by workers.
    pub fn new(
        eal: &Arc<Eal>,
        mut port: Port,
        opts: &DpdkLinkOptions,
    ) -> Result<DpdkLink, DpdkLinkError> {
        let info = port.dev_info()?;
        if !(68..=9000).contains(&opts.mtu) {
            return Err(DpdkLinkError::Invalid(format!(
                "MTU {} out of range",
                opts.mtu
            )));
        }
        if opts.mtu > usize::from(info.max_mtu) {
            return Err(DpdkLinkError::Invalid(format!(
                "MTU {} above the device's {} ({})",
                opts.mtu, info.max_mtu, info.driver_name
            )));
        }
        let queues = opts.queues.max(1);
        let frame_cap = opts.mtu + FRAME_OVERHEAD;
        let data_room = frame_cap.max(MIN_DATA_ROOM) + usize::from(HEADROOM);
        let data_room = u16::try_from(data_room)
            .map_err(|_| DpdkLinkError::Invalid("frame too large for an mbuf".into()))?;
        let pool_size = opts.pool_size.unwrap_or(if frame_cap > MIN_DATA_ROOM {
            8191
        } else {
            16383
        });
        let name = format!("iwarp{}", POOL_SEQ.fetch_add(1, Ordering::Relaxed));
        // A LIFO pool where the driver is there: a recycled mbuf is one
        // freed lately, still in cache, instead of the least recently used
        // of thousands. Not for af_xdp, which builds its UMEM over the
        // pool's memory and stalled on the stack driver (its two-process
        // test moved nothing).
        let lifo = info.driver_name != "net_af_xdp";
        let default = || Mempool::new(eal, &name, pool_size, 256, data_room, port.socket_id());
        let pool = if lifo {
            // Where the driver is missing, DPDK's default ring.
            let stack = Some("stack");
            Mempool::with_ops(
                eal,
                &name,
                pool_size,
                256,
                data_room,
                port.socket_id(),
                stack,
            )
            .or_else(|_| default())?
        } else {
            default()?
        };
        let own_mac = EthernetAddress(port.mac_addr()?);
        let mac = opts.mac.unwrap_or(own_mac);
        let conf = PortConfig {
            rx_queues: queues,
            tx_queues: queues,
            rx_desc: opts.rx_desc,
            tx_desc: opts.tx_desc,
            mtu: (opts.mtu != 1500).then_some(opts.mtu as u16),
            promiscuous: mac != own_mac,
            ..PortConfig::default()
        };
        let setup = port.configure(&conf, &pool)?;
        port.start()?;
        let rss = if setup.rss_hf != 0 && queues > 1 {
            match (port.rss_hash_conf_get(), port.reta_query()) {
                (Ok(conf), Ok(reta)) => Some(Rss {
                    key: conf.key,
                    reta,
                }),
                _ => None,
            }
        } else {
            None
        };
        let zero_copy = setup.multi_seg_tx() && opts.attach_payload;
        // The segments a train's chain may take: ours, and the device's
        // own limit (40 on some NICs).
        let tso_segs = TSO_MAX_SEGMENTS.min(usize::from(info.tx_max_segs));
        let caps = LinkCaps {
            mac,
            mtu: opts.mtu,
            queues,
            multi_seg_tx: setup.multi_seg_tx() && opts.attach_payload,
            max_tx_segments: MAX_SEGMENTS,
            tx_checksum_offload: setup.tx_tcp_cksum(),
            rx_checksum_offload: setup.rx_cksum(),
            rss,
            tso: (opts.tso && setup.tx_tso() && tso_segs >= 8).then(|| TsoCaps {
                // Copied, a train fills mbufs of the pool's data room.
                max_bytes: if zero_copy {
                    TSO_MAX_BYTES
                } else {
                    TSO_MAX_BYTES.min((tso_segs - 1) * (frame_cap.max(MIN_DATA_ROOM) - 160))
                },
                // Attached, each record takes a pin and up to three
                // segments (its header bytes, payload, trailer).
                max_segments: if zero_copy {
                    (MAX_PINS - 2).min((tso_segs - 1) / 4)
                } else {
                    TSO_MAX_RECORDS
                },
                // DPDK 22.11's tap compares the segment it is to cut, its
                // Ethernet header included, with the IP MTU, and refuses
                // the frame (sending nothing more of the burst) when it is
                // larger: segments of a full MSS fail by 14 bytes.
                shortfall: if info.driver_name == "net_tap" { 14 } else { 0 },
                even_pieces: info.driver_name == "net_tap",
            }),
        };
        let stats = Arc::new(DpdkLinkStats::default());
        let iova_is_va = eal.iova_is_va();
        // A device off the vdev bus reads memory by DMA: its regions must be
        // registered (and mapped), whatever the IOVA mode.
        let needs_dma = dpdk_bindings::port_bus_name(port.id()).is_some_and(|b| b != "vdev");
        let mut qs = Vec::with_capacity(usize::from(queues));
        for q in 0..queues {
            let ext = ExtBufPool::new(opts.ext_slots);
            let frame_shared = Arc::new(FrameShared {
                pool: pool.clone(),
                ext: zero_copy.then(|| ext.clone()),
            });
            qs.push(Some(DpdkQueue {
                index: q,
                rx: port.rx_queue(q)?,
                tx: port.tx_queue(q)?,
                rx_burst: MbufBurst::new(),
                rx_pending: VecDeque::with_capacity(BURST),
                tx_burst: MbufBurst::new(),
                tx_cache: MbufBurst::new(),
                frame_shared,
                spare_ext: Vec::with_capacity(4 * BURST),
                in_flight: VecDeque::with_capacity(opts.ext_slots),
                ext,
                pool: pool.clone(),
                frame_cap,
                multi_seg: setup.multi_seg_tx(),
                iova_is_va,
                needs_dma,
                port_id: port.id(),
                tx_cksum: setup.tx_tcp_cksum(),
                tso_segs: tso_segs as u16,
                stats: stats.clone(),
                eal: eal.clone(),
                keep: Vec::new(),
                _reap: ReapParked,
            }));
        }
        Ok(DpdkLink {
            caps,
            setup,
            queues: qs,
            stats,
            pool,
            port,
            eal: eal.clone(),
        })
    }

    /// The port a device string names (a vdev given to EAL, e.g.
    /// `net_af_packet0,iface=veth0`, or a PCI address), set up.
    pub fn open(
        eal: &Arc<Eal>,
        device: &str,
        opts: &DpdkLinkOptions,
    ) -> Result<DpdkLink, DpdkLinkError> {
        let port = Port::by_name(eal, device_name(device))?;
        DpdkLink::new(eal, port, opts)
    }

    /// Two links wired back to back over `net_ring` in this process (what
    /// one sends on queue `q` the other receives on queue `q`), both set up
    /// with `opts` (but for the MAC addresses, each port's own unless
    /// given).
    pub fn ring_pair(
        eal: &Arc<Eal>,
        name: &str,
        opts: &DpdkLinkOptions,
        macs: (Option<EthernetAddress>, Option<EthernetAddress>),
    ) -> Result<(DpdkLink, DpdkLink), DpdkLinkError> {
        let (a, b) = Port::ring_pair(eal, name, opts.queues.max(1), 4096)?;
        let oa = DpdkLinkOptions {
            mac: macs.0,
            ..opts.clone()
        };
        let ob = DpdkLinkOptions {
            mac: macs.1,
            ..opts.clone()
        };
        let (mut a, mut b) = (DpdkLink::new(eal, a, &oa)?, DpdkLink::new(eal, b, &ob)?);
        // Each port's rings hold the other's mbufs: every queue keeps both
        // pools until its port has closed and the rings are drained.
        let pools = [a.pool.clone(), b.pool.clone()];
        for q in a.queues.iter_mut().chain(b.queues.iter_mut()).flatten() {
            q.keep.extend(pools.iter().cloned());
        }
        Ok((a, b))
    }

    /// What the device granted.
    pub fn setup(&self) -> &PortSetup {
        &self.setup
    }

    /// The DPDK port.
    pub fn port(&self) -> &Port {
        &self.port
    }

    /// The EAL the link runs on.
    pub fn eal(&self) -> &Arc<Eal> {
        &self.eal
    }

    /// The link's counters, shared with its queues.
    pub fn stats(&self) -> Arc<DpdkLinkStats> {
        self.stats.clone()
    }

    /// The driver behind the link's mbuf pool: `"stack"` (mbufs freed
    /// last are reused first, while still in cache) where DPDK has it,
    /// its default ring otherwise.
    pub fn pool_ops(&self) -> String {
        self.pool.ops_name()
    }
}

impl Link for DpdkLink {
    type Queue = DpdkQueue;

    fn caps(&self) -> &LinkCaps {
        &self.caps
    }

    fn take_queue(&mut self, index: u16) -> Option<DpdkQueue> {
        self.queues.get_mut(usize::from(index))?.take()
    }

    fn device(&self) -> Option<Box<dyn DeviceStats>> {
        Some(Box::new(DevicePort::new(&self.port)))
    }

    fn counters(&self) -> Option<Box<dyn LinkStats>> {
        Some(Box::new(self.stats()))
    }
}

// ---------------------------------------------------------------------
// Queues.
// ---------------------------------------------------------------------

/// One RX and one TX queue of a [`DpdkLink`], owned by one worker.
#[derive(Debug)]
pub struct DpdkQueue {
    index: u16,
    rx: RxQueue,
    tx: TxQueue,
    rx_burst: MbufBurst,
    /// Received and not yet handed out (when the caller asks for fewer
    /// than a burst).
    rx_pending: VecDeque<Mbuf>,
    tx_burst: MbufBurst,
    /// Mbufs taken from the pool a burst at a time, handed out one per
    /// frame ([`LinkQueue::alloc_tx`]): one pool call per burst, not per
    /// frame.
    tx_cache: MbufBurst,
    /// What every frame of this queue needs while it is built, behind one
    /// reference count (one increment per recycled frame part, at start-up).
    frame_shared: Arc<FrameShared>,
    /// Out-of-line parts of sent frames, for the next ones
    /// ([`DpdkFrame`]); boxed, as frames hold them, so that recycling one
    /// moves a pointer.
    #[allow(clippy::vec_box, reason = "the boxes move into frames and back")]
    spare_ext: Vec<Box<FrameExt>>,
    /// Pins of sent frames, oldest first, until their mbufs are freed.
    in_flight: VecDeque<ExtPin>,
    ext: ExtBufPool,
    pool: Mempool,
    frame_cap: usize,
    multi_seg: bool,
    /// EAL runs with IOVA-as-VA: an unregistered region's address is its
    /// IOVA.
    iova_is_va: bool,
    /// The device does DMA (not on the vdev bus): memory must be
    /// registered and mapped for it.
    needs_dma: bool,
    port_id: u16,
    tx_cksum: bool,
    /// Most segments in the chain of a train (ours and the device's limit).
    tso_segs: u16,
    stats: Arc<DpdkLinkStats>,
    eal: Arc<Eal>,
    /// Pools whose mbufs this queue's port may hold (a `net_ring` peer's):
    /// released after the port (declared late), so that the rings are
    /// drained into them before a pool with mbufs out would be leaked.
    keep: Vec<Mempool>,
    /// Declared last: after the port has closed (which frees the mbufs
    /// still in its rings), frees the pins parked meanwhile, whose regions
    /// may hold a registration, and through it EAL.
    _reap: ReapParked,
}

/// Frees released parked pins when dropped (see [`DpdkQueue::_reap`]).
#[derive(Debug)]
struct ReapParked;

impl Drop for ReapParked {
    fn drop(&mut self) {
        crate::memory::reap_parked();
    }
}

/// A received frame: one mbuf, read as its first (only) segment, and the
/// device's checksum verdicts on it.
#[derive(Debug)]
pub struct DpdkRxBuf {
    mbuf: Mbuf,
    cksum: RxChecksum,
}

impl AsRef<[u8]> for DpdkRxBuf {
    fn as_ref(&self) -> &[u8] {
        self.mbuf.data()
    }
}

impl DpdkRxBuf {
    /// The mbuf.
    pub fn mbuf(&self) -> &Mbuf {
        &self.mbuf
    }

    /// What the device said about the frame's IPv4 and TCP checksums when
    /// it received it (kept across the copy of a chained frame into one
    /// mbuf, which clears the flags).
    pub fn checksum(&self) -> RxChecksum {
        self.cksum
    }
}

/// A device's verdict on one checksum, as `tcp-offload` takes it. DPDK's
/// `*_CKSUM_NONE` (both flag bits: "the field is not correct, but the
/// integrity of the data is verified", as virtio devices report a
/// checksum the sending host left partial) counts as good: verifying
/// that field in software would drop intact data.
pub fn device_cksum(status: CksumStatus) -> DeviceCksum {
    match status {
        CksumStatus::Good | CksumStatus::IntegrityVerified => DeviceCksum::Good,
        CksumStatus::Bad => DeviceCksum::Bad,
        CksumStatus::Unknown => DeviceCksum::Unchecked,
    }
}

/// The verdicts the device left in a received mbuf's flags.
fn rx_checksum_of(m: &Mbuf) -> RxChecksum {
    RxChecksum {
        ip: device_cksum(m.ip_cksum()),
        l4: device_cksum(m.l4_cksum()),
    }
}

impl DpdkQueue {
    /// Drops the pins whose mbufs are gone: from the front while released
    /// (`full`: every one, when slots run short).
    fn reap(&mut self, full: bool) {
        if full {
            self.in_flight.retain(ExtPin::in_flight);
            return;
        }
        while self.in_flight.front().is_some_and(|p| !p.in_flight()) {
            self.in_flight.pop_front();
        }
    }

    /// `m` as one segment: itself, or a copy of its chain.
    fn linearize(&self, m: Mbuf) -> Option<Mbuf> {
        if m.nb_segs() == 1 {
            return Some(m);
        }
        let mut one = self.pool.alloc()?;
        let len = m.len();
        let dst = one.append(len)?;
        let n = m.read(0, dst);
        (n == len).then_some(one)
    }

    /// Asks the device to finish the TCP checksum of `m` if the field holds
    /// the pseudo-header sum (frames built in parts); a frame whose
    /// checksum is complete is left alone.
    fn offload_cksum(m: &mut Mbuf) -> bool {
        let d = m.data();
        let Some(TcpHeaders {
            ihl,
            tcp,
            tcp_hl,
            src,
            dst,
        }) = TcpHeaders::parse(d)
        else {
            return false;
        };
        let total = usize::from(u16::from_be_bytes([d[16], d[17]]));
        if total < ihl + 20 {
            return false;
        }
        let pseudo = checksum::fold(checksum::pseudo_header(src, dst, 6, total - ihl));
        let field = u16::from_be_bytes([d[tcp + 16], d[tcp + 17]]);
        if field != pseudo {
            return false;
        }
        if Self::odd_inner_segment(m) {
            // DPDK 22.11's tap sums each segment as if it began at an
            // even offset, so a segment after an odd-length one (an FPDU
            // whose payload has odd length, attached, then its trailer)
            // left to it goes out with a wrong checksum, and the peer drops
            // every copy. Such frames are rare (a message's last FPDU at
            // most): they are summed here.
            Self::finish_cksum(m, tcp);
            return false;
        }
        m.set_tx_cksum_offload(14, ihl as u16, tcp_hl as u8, false, true);
        true
    }

    /// Asks the device to cut `m`, one TCP segment of a train, into
    /// segments of `segsz` payload bytes: the checksum fields set as DPDK
    /// requires (the TCP one to the pseudo-header sum without the length,
    /// the IPv4 one to zero) and the offload flags. Returns the segments
    /// it is to cut.
    fn offload_tso(m: &mut Mbuf, segsz: u16) -> Option<u64> {
        let total = m.len();
        let d = m.data_mut()?;
        let TcpHeaders {
            ihl,
            tcp,
            tcp_hl,
            src,
            dst,
        } = TcpHeaders::parse(d).filter(|h| d.len() >= h.tcp + h.tcp_hl)?;
        let pseudo = checksum::fold(checksum::pseudo_header(src, dst, 6, 0));
        d[24..26].fill(0);
        d[tcp + 16..tcp + 18].copy_from_slice(&pseudo.to_be_bytes());
        m.set_tx_tso(14, ihl as u16, tcp_hl as u8, segsz);
        let payload = total.saturating_sub(tcp + tcp_hl);
        Some(payload.div_ceil(usize::from(segsz)) as u64)
    }

    /// Whether a segment of `m` before its last has an odd length.
    fn odd_inner_segment(m: &Mbuf) -> bool {
        let n = usize::from(m.nb_segs());
        n > 1 && m.segments().take(n - 1).any(|s| s.len() % 2 == 1)
    }

    /// Completes the TCP checksum of `m`, whose field holds the
    /// pseudo-header sum, over the TCP segment from `tcp` in every
    /// segment of the chain.
    fn finish_cksum(m: &mut Mbuf, tcp: usize) {
        let (mut sum, mut at, mut skip) = (0u32, 0usize, tcp);
        for seg in m.segments() {
            let part = seg.get(skip..).unwrap_or(&[]);
            skip = skip.saturating_sub(seg.len());
            sum = checksum::combine_at(sum, crate::checksum::sum(part), at);
            at += part.len();
        }
        if let Some(field) = m.data_mut().and_then(|d| d.get_mut(tcp + 16..tcp + 18)) {
            field.copy_from_slice(&checksum::finish(sum).to_be_bytes());
        }
    }
}

impl Drop for DpdkQueue {
    fn drop(&mut self) {
        self.rx_pending.clear();
        self.reap(true);
        // Pins still in flight park themselves (their mbufs sit in a ring
        // or a peer's queue) and are freed by a later reap.
        self.in_flight.clear();
        crate::memory::reap_parked();
    }
}

impl LinkQueue for DpdkQueue {
    type RxBuf = DpdkRxBuf;
    type TxFrame = DpdkFrame;

    fn index(&self) -> u16 {
        self.index
    }

    fn rx_burst(&mut self, out: &mut Vec<DpdkRxBuf>, max: usize) -> usize {
        // The worker calls this every iteration, and transmits only when it
        // has frames: pins of frames sent before a quiet spell are dropped
        // here, so that a region (and its registration with EAL) goes soon
        // after its last mbuf, not at the next transmission. One atomic
        // load when nothing was released.
        self.reap(false);
        if self.rx_pending.is_empty() && self.rx.rx_burst(&mut self.rx_burst) > 0 {
            self.rx_pending.extend(self.rx_burst.drain());
        }
        let mut n = 0;
        let mut linearized = 0;
        while n < max {
            let Some(m) = self.rx_pending.pop_front() else {
                break;
            };
            let chained = m.nb_segs() > 1;
            let cksum = rx_checksum_of(&m);
            match self.linearize(m) {
                Some(mbuf) => {
                    linearized += u64::from(chained);
                    out.push(DpdkRxBuf { mbuf, cksum });
                    n += 1;
                }
                None => {
                    self.stats.rx_dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if linearized > 0 {
            // Once per burst: the counter is shared by the port's queues.
            self.stats
                .rx_linearized
                .fetch_add(linearized, Ordering::Relaxed);
        }
        n
    }

    fn rx_checksum(&self, buf: &DpdkRxBuf) -> RxChecksum {
        buf.cksum
    }

    #[inline(always)]
    fn alloc_tx(&mut self) -> Option<DpdkFrame> {
        if self.in_flight.len() > self.ext.capacity() / 2 {
            self.reap(true);
        }
        if self.tx_cache.is_empty() {
            // All or nothing: near exhaustion, one at a time below.
            self.pool.alloc_bulk(&mut self.tx_cache, BURST);
        }
        let head = self.tx_cache.pop().or_else(|| self.pool.alloc())?;
        // The next frame's buffer, last used by the core that received
        // it, is claimed for writing while this one is filled.
        if let Some(next) = self.tx_cache.last() {
            crate::memory::prefetch_write(next.data_ptr(), TX_PREFETCH.min(self.frame_cap));
        }
        // A new one only while more frames are out than ever before
        // (start-up).
        let ext = self.spare_ext.pop().unwrap_or_else(|| {
            Box::new(FrameExt {
                pins: [const { None }; MAX_PINS],
                npins: 0,
                tally: [0; 3],
                tso_segs: self.tso_segs,
                shared: self.frame_shared.clone(),
                iova_is_va: self.iova_is_va,
                multi_seg: self.multi_seg,
            })
        });
        Some(DpdkFrame {
            head: Some(head),
            len: 0,
            cap: self.frame_cap,
            max_segs: MAX_SEGMENTS as u16,
            tso_segsz: 0,
            ext,
        })
    }

    fn tx_burst(&mut self, frames: &mut Vec<DpdkFrame>) -> usize {
        self.reap(false);
        let mut sent = 0;
        let mut offloaded = 0u64;
        let (mut trains, mut cut) = (0u64, 0u64);
        // The sent frames' attach tallies ([`FrameExt::tally`]).
        let mut tally = [0u64; 3];
        while !frames.is_empty() {
            let k = frames.len().min(BURST);
            let mut index = [0usize; BURST];
            let mut m = 0;
            for (i, f) in frames[..k].iter_mut().enumerate() {
                if let Some(mut head) = f.head.take() {
                    if f.tso_segsz > 0 {
                        if let Some(n) = DpdkQueue::offload_tso(&mut head, f.tso_segsz) {
                            trains += 1;
                            cut += n;
                        }
                    } else if self.tx_cksum && DpdkQueue::offload_cksum(&mut head) {
                        offloaded += 1;
                    }
                    // Room for BURST: the burst is empty here.
                    if let Err(head) = self.tx_burst.push(head) {
                        f.head = Some(head);
                        break;
                    }
                    index[m] = i;
                    m += 1;
                }
            }
            let n = self.tx.tx_burst(&mut self.tx_burst);
            for (j, head) in self.tx_burst.drain().enumerate() {
                frames[index[n + j]].head = Some(head);
            }
            // Frames without a head were taken by the device: keep their
            // pins until it frees the mbufs, and their out-of-line part for
            // the next frames. The unsent keep their order at the front.
            let mut kept = 0;
            for i in 0..frames.len() {
                if frames[i].head.is_some() {
                    frames.swap(kept, i);
                    kept += 1;
                }
            }
            for f in frames.drain(kept..) {
                let DpdkFrame { mut ext, .. } = f;
                for (total, n) in tally.iter_mut().zip(ext.tally.iter_mut()) {
                    *total += u64::from(core::mem::take(n));
                }
                let n = usize::from(ext.npins);
                ext.npins = 0;
                for p in ext.pins[..n].iter_mut().filter_map(Option::take) {
                    self.in_flight.push_back(p);
                }
                self.spare_ext.push(ext);
            }
            sent += n;
            if n < m {
                break;
            }
        }
        if offloaded > 0 {
            // Once per call, not per frame: the counter is read by other
            // threads.
            self.stats
                .tx_cksum_offloaded
                .fetch_add(offloaded, Ordering::Relaxed);
        }
        if trains > 0 {
            self.stats
                .tx_tso_frames
                .fetch_add(trains, Ordering::Relaxed);
            self.stats.tx_tso_segments.fetch_add(cut, Ordering::Relaxed);
        }
        let [attached, copied, split] = tally;
        for (counter, n) in [
            (&self.stats.tx_attached, attached),
            (&self.stats.tx_copied, copied),
            (&self.stats.tx_split, split),
        ] {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
        sent
    }

    fn register_region(&mut self, region: &Region) -> Result<(), String> {
        if !self.iova_is_va && !region.is_hugepage_backed() {
            // Heap pages have no stable physical address: copied on TX.
            self.stats
                .mem_not_registered
                .fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let mem = match region.register_with_dpdk(&self.eal) {
            Ok((mem, new)) => {
                if new {
                    self.stats.mem_registered.fetch_add(1, Ordering::Relaxed);
                }
                mem
            }
            Err(e) if self.iova_is_va && !self.needs_dma => {
                // Virtual devices read by address: attach as before.
                if self
                    .stats
                    .mem_register_failed
                    .fetch_add(1, Ordering::Relaxed)
                    == 0
                {
                    eprintln!(
                        "dpdk port {}: registering memory with EAL failed ({e}); \
                         attaching by address",
                        self.port_id
                    );
                }
                return Ok(());
            }
            Err(e) => return Err(format!("registering memory with DPDK: {e}")),
        };
        // One mapping per registration chunk (a chunk shared with another
        // region and mapped for this port already is not mapped again).
        let mut mapped = true;
        for chunk in mem.chunks() {
            match chunk.dma_map_port(self.port_id) {
                Ok(m) => mapped &= m,
                Err(e) => return Err(format!("DMA-mapping memory for port {}: {e}", self.port_id)),
            }
        }
        let counter = if mapped {
            &self.stats.mem_dma_mapped
        } else {
            &self.stats.mem_dma_unsupported
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn on_worker_thread(&self) -> Result<Option<Box<dyn core::any::Any>>, String> {
        if dpdk_bindings::lcore_id().is_some() {
            return Ok(None);
        }
        let reg = self.eal.register_thread().map_err(|e| e.to_string())?;
        Ok(Some(Box::new(reg)))
    }
}

// ---------------------------------------------------------------------
// Frames.
// ---------------------------------------------------------------------

/// A frame being built: an mbuf chain and the pins of its attachments.
/// The chain is declared first so that it is freed before the pins are
/// looked at when an unsent frame is dropped.
#[derive(Debug)]
pub struct DpdkFrame {
    head: Option<Mbuf>,
    len: usize,
    cap: usize,
    /// Most segments in the chain.
    max_segs: u16,
    /// A train the device cuts into TCP segments of this many payload
    /// bytes ([`TxFrame::segment_by`]); 0: a frame as it is.
    tso_segsz: u16,
    /// The rest, out of line: a frame moves by value (into the transmit
    /// batch) right after it is built, and a small one moves cheaply.
    /// Each queue recycles these ([`DpdkQueue::spare_ext`]), so a frame
    /// costs neither an allocation nor a reference count.
    ext: Box<FrameExt>,
}

/// The part of a [`DpdkFrame`] kept from one frame to the next.
#[derive(Debug)]
struct FrameExt {
    pins: [Option<ExtPin>; MAX_PINS],
    /// Pins taken: `pins[..npins]` (a frame sent walks only those).
    npins: u8,
    /// Payload pieces attached, pieces copied instead, and attachments
    /// split at a page boundary, in this frame: added to the link's
    /// counters once per burst when the device takes it
    /// ([`DpdkLinkStats::tx_attached`], `tx_copied`, `tx_split`), not
    /// with a shared atomic per piece.
    tally: [u32; 3],
    /// Most segments in the chain of a train.
    tso_segs: u16,
    shared: Arc<FrameShared>,
    /// An unregistered region may be attached by address.
    iova_is_va: bool,
    multi_seg: bool,
}

/// What the frames of one queue share: the pool their segments come
/// from, the queue's external-buffer slots (when payload may be
/// attached).
#[derive(Debug)]
struct FrameShared {
    pool: Mempool,
    ext: Option<ExtBufPool>,
}

impl DpdkFrame {
    /// The chain so far.
    pub fn mbuf(&self) -> Option<&Mbuf> {
        self.head.as_ref()
    }

    /// `len` more bytes in one piece of the last segment, counted in the
    /// frame's length; `None`, with nothing taken, if it lacks the room
    /// (the caller has checked the frame's capacity).
    fn take_in_last(&mut self, len: usize) -> Option<&mut [u8]> {
        let dst = self.head.as_mut()?.append(len)?;
        self.len += len;
        Some(dst)
    }

    /// Appends `len` bytes written by `fill(offset_in_run, dst)`, growing
    /// the chain by a segment when the last one is full or external.
    fn extend(
        &mut self,
        len: usize,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> Result<(), FrameFull> {
        if len == 0 {
            return Ok(());
        }
        if self.len.checked_add(len).is_none_or(|end| end > self.cap) {
            return Err(FrameFull);
        }
        // Usually the last segment takes it all: one call into DPDK.
        if let Some(dst) = self.take_in_last(len) {
            fill(0, dst);
            return Ok(());
        }
        let head = self.head.as_mut().ok_or(FrameFull)?;
        let mut done = 0;
        while done < len {
            let n = head.tailroom().min(len - done);
            if n > 0 {
                if let Some(dst) = head.append(n) {
                    fill(done, dst);
                    done += n;
                    continue;
                }
            }
            if !self.ext.multi_seg || head.nb_segs() >= self.max_segs {
                return Err(FrameFull);
            }
            let seg = self.ext.shared.pool.alloc().ok_or(FrameFull)?;
            head.chain(seg).map_err(|_| FrameFull)?;
        }
        self.len += len;
        Ok(())
    }

    /// Appends `len` bytes of `region` from `offset`, copied in one pass
    /// that also takes their CRC32c (extended from `crc`) and checksum
    /// sum, run by run as the frame's segments hold them.
    fn copy_in_pass(
        &mut self,
        region: &Region,
        offset: usize,
        len: usize,
        crc: u32,
    ) -> Result<(u32, u32), FrameFull> {
        if offset.checked_add(len).is_none_or(|end| end > region.len()) {
            return Err(FrameFull);
        }
        let (mut crc, mut sum) = (crc, 0u32);
        self.extend(len, |at, dst| {
            // In bounds: checked above.
            if let Ok((c, s)) = region.read_pass(offset + at, dst, crc) {
                crc = c;
                sum = tcp_offload::wire::checksum::combine_at(sum, s, at);
            }
        })?;
        Ok((crc, sum))
    }

    /// Attaches `slice` as external segments (one per IOVA-contiguous
    /// run, [`MAX_SPLIT`] at most); `false` if it could not (no IOVA, no
    /// slot, no pin room, no mbuf), leaving the frame unchanged.
    fn try_attach(&mut self, slice: &RegionSlice) -> bool {
        let Some(ext) = &self.ext.shared.ext else {
            return false;
        };
        // The runs, planned before anything is taken.
        let mut runs = [(0usize, 0usize, 0u64); MAX_SPLIT];
        let mut n = 0;
        let mut at = 0;
        while at < slice.len {
            if n == MAX_SPLIT {
                return false;
            }
            let Some((iova, run)) =
                slice
                    .region
                    .dma_run(slice.offset + at, slice.len - at, self.ext.iova_is_va)
            else {
                return false;
            };
            if run == 0 {
                return false;
            }
            runs[n] = (slice.offset + at, run, iova);
            n += 1;
            at += run;
        }
        let free = MAX_PINS - usize::from(self.ext.npins);
        let Some(head) = self.head.as_ref() else {
            return false;
        };
        if n == 0 || free < n || usize::from(head.nb_segs()) + n + 1 > usize::from(self.max_segs) {
            return false;
        }
        // Every segment made before any is chained: a failure drops them
        // (freeing the mbufs releases their slots) and the frame is as it
        // was.
        let mut segs: [Option<(Mbuf, ExtPin)>; MAX_SPLIT] = [const { None }; MAX_SPLIT];
        for (seg, &(offset, len, iova)) in segs.iter_mut().zip(&runs[..n]) {
            let Some(buf) = ext.acquire() else {
                return false;
            };
            let Some(mut m) = self.ext.shared.pool.alloc() else {
                return false;
            };
            let piece = RegionSlice {
                region: slice.region.clone(),
                offset,
                len,
            };
            let Ok(pin) = attach_ext(&mut m, &piece, iova, buf) else {
                return false;
            };
            *seg = Some((m, pin));
        }
        let Some(head) = self.head.as_mut() else {
            return false;
        };
        for (m, pin) in segs.iter_mut().filter_map(Option::take) {
            // Cannot fail: the segment count was checked above. Were it to,
            // the mbuf is freed on the way out, releasing its slot, and the
            // frame goes short (its length no longer matches), which the
            // receiver's checks catch; the pin goes with nothing in flight.
            if head.chain(m).is_err() {
                debug_assert!(false, "chain of a checked length failed");
                continue;
            }
            if let Some(p) = self.ext.pins.get_mut(usize::from(self.ext.npins)) {
                *p = Some(pin);
                self.ext.npins += 1;
            }
        }
        if n > 1 {
            self.ext.tally[2] += 1;
        }
        self.len += slice.len;
        true
    }
}

impl TxFrame for DpdkFrame {
    fn len(&self) -> usize {
        self.len
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(), FrameFull> {
        self.extend(bytes.len(), |at, dst| {
            dst.copy_from_slice(&bytes[at..at + dst.len()])
        })
    }

    fn append_zeros(&mut self, n: usize) -> Result<(), FrameFull> {
        self.extend(n, |_, dst| dst.fill(0))
    }

    fn append_in_place(&mut self, len: usize) -> Option<&mut [u8]> {
        if self.len.checked_add(len).is_none_or(|end| end > self.cap) {
            return None;
        }
        self.take_in_last(len)
    }

    fn append_copy(&mut self, region: &Region, offset: usize, len: usize) -> Result<(), FrameFull> {
        if offset.checked_add(len).is_none_or(|end| end > region.len()) {
            return Err(FrameFull);
        }
        self.extend(len, |at, dst| {
            // In bounds: checked above.
            let _ = region.read(offset + at, dst);
        })
    }

    fn append_copy_pass(
        &mut self,
        region: &Region,
        offset: usize,
        len: usize,
        crc: u32,
    ) -> Result<(u32, u32), FrameFull> {
        self.copy_in_pass(region, offset, len, crc)
    }

    fn patch(&mut self, at: usize, bytes: &[u8]) -> Result<(), FrameFull> {
        let head = self.head.as_mut().ok_or(FrameFull)?;
        let data = head.data_mut().ok_or(FrameFull)?;
        let end = at.checked_add(bytes.len()).ok_or(FrameFull)?;
        data.get_mut(at..end)
            .ok_or(FrameFull)?
            .copy_from_slice(bytes);
        Ok(())
    }

    fn attach(&mut self, slice: RegionSlice) -> Result<(), FrameFull> {
        if self
            .len
            .checked_add(slice.len)
            .is_none_or(|end| end > self.cap)
        {
            return Err(FrameFull);
        }
        if slice.len >= ATTACH_MIN && self.ext.shared.ext.is_some() {
            if self.try_attach(&slice) {
                self.ext.tally[0] += 1;
                return Ok(());
            }
            self.ext.tally[1] += 1;
        }
        self.append_copy(&slice.region, slice.offset, slice.len)
    }

    fn segment_by(&mut self, seg_len: usize) -> Result<(), FrameFull> {
        let segsz = u16::try_from(seg_len).map_err(|_| FrameFull)?;
        if self.len != 0 || segsz == 0 || !self.ext.multi_seg {
            return Err(FrameFull);
        }
        self.tso_segsz = segsz;
        self.cap = 14 + 60 + 60 + TSO_MAX_BYTES;
        self.max_segs = self.ext.tso_segs;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eal_arguments_add_the_device_and_a_prefix() {
        let a = eal_args_for(&[], "net_af_packet0,iface=veth0");
        assert!(a.contains(&"--no-huge".to_string()));
        assert!(a.contains(&"--vdev=net_af_packet0,iface=veth0".to_string()));
        let user = vec!["--in-memory".to_string(), "--vdev=net_ring0".to_string()];
        let a = eal_args_for(&user, "net_ring0");
        assert_eq!(a.iter().filter(|x| x.contains("net_ring0")).count(), 1);
        assert!(a.contains(&"--file-prefix".to_string()));
        let a = eal_args_for(&user, "0000:01:00.0");
        assert!(!a.iter().any(|x| x.contains("0000:01")));
        assert_eq!(device_name("net_tap0,iface=t0"), "net_tap0");
    }

    #[test]
    fn only_a_device_verdict_spares_the_software_check() {
        assert_eq!(device_cksum(CksumStatus::Good), DeviceCksum::Good);
        assert_eq!(
            device_cksum(CksumStatus::IntegrityVerified),
            DeviceCksum::Good
        );
        assert_eq!(device_cksum(CksumStatus::Bad), DeviceCksum::Bad);
        assert_eq!(device_cksum(CksumStatus::Unknown), DeviceCksum::Unchecked);
    }
}
