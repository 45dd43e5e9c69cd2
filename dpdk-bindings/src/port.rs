//! Ethernet ports and their per-core queues.
//!
//! A [`Port`] is configured once (queues, descriptors, offloads requested
//! and masked by what the device can do, RSS), started, and then hands each
//! RX and TX queue to exactly one worker as an [`RxQueue`] / [`TxQueue`]
//! used through `&mut self`: DPDK's burst functions are not thread-safe per
//! queue, and ownership makes that a compile-time fact. The port is stopped
//! and closed when the `Port` and all its queues are gone.
//!
//! [`Port::ring_pair`] makes two ports wired back to back over rte_rings
//! (`net_ring`), for two endpoints in one process.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::eal::Eal;
use crate::error::{check, DpdkError};
use crate::mbuf::MbufBurst;
use crate::mempool::Mempool;
use crate::sys;

/// Offload and RSS flag values for [`PortConfig`], named as DPDK names them.
pub mod offload {
    use crate::sys;

    /// RX: verify IPv4 header checksums (`RTE_ETH_RX_OFFLOAD_IPV4_CKSUM`).
    pub const RX_IPV4_CKSUM: u64 = sys::SHIM_ETH_RX_OFFLOAD_IPV4_CKSUM;
    /// RX: verify TCP checksums.
    pub const RX_TCP_CKSUM: u64 = sys::SHIM_ETH_RX_OFFLOAD_TCP_CKSUM;
    /// RX: frames larger than one mbuf arrive as chains (jumbo frames).
    pub const RX_SCATTER: u64 = sys::SHIM_ETH_RX_OFFLOAD_SCATTER;
    /// RX: report the RSS hash in each mbuf.
    pub const RX_RSS_HASH: u64 = sys::SHIM_ETH_RX_OFFLOAD_RSS_HASH;
    /// TX: compute IPv4 header checksums.
    pub const TX_IPV4_CKSUM: u64 = sys::SHIM_ETH_TX_OFFLOAD_IPV4_CKSUM;
    /// TX: compute TCP checksums.
    pub const TX_TCP_CKSUM: u64 = sys::SHIM_ETH_TX_OFFLOAD_TCP_CKSUM;
    /// TX: send mbuf chains (header + external payload + trailer).
    pub const TX_MULTI_SEGS: u64 = sys::SHIM_ETH_TX_OFFLOAD_MULTI_SEGS;
    /// TX: cut one large TCP segment into segments of `tso_segsz` payload
    /// bytes (TCP segmentation offload).
    pub const TX_TCP_TSO: u64 = sys::SHIM_ETH_TX_OFFLOAD_TCP_TSO;
    /// RSS over IPv4 addresses.
    pub const RSS_IPV4: u64 = sys::SHIM_ETH_RSS_IPV4;
    /// RSS over IPv4 addresses and TCP ports.
    pub const RSS_NONFRAG_IPV4_TCP: u64 = sys::SHIM_ETH_RSS_NONFRAG_IPV4_TCP;
}

/// Port ids this process has a [`Port`] for, so that no two handles close
/// the same device (`RTE_MAX_ETHPORTS` is 32 in Debian's build).
static CLAIMED: AtomicU64 = AtomicU64::new(0);

/// Queues per direction a port may have here (the queue bitmaps' width).
const MAX_QUEUES: u16 = 64;

/// The AF_XDP driver, which (in DPDK 22.11, on a kernel that takes unaligned
/// UMEM chunks) uses the RX pool itself as the socket's packet memory: each
/// RX queue setup takes mbufs from the pool and parks them in the socket's
/// fill ring, and close deletes the socket and unregisters the memory from
/// the kernel without putting them back. See [`FillParking`].
const AF_XDP_DRIVER: &str = "net_af_xdp";

/// Mbufs the 22.11 AF_XDP driver takes per RX queue at setup for the fill
/// ring (libxdp's `XSK_RING_CONS__DEFAULT_NUM_DESCS`, whatever the queue's
/// descriptor count): a cap on what a setup is credited with.
const AF_XDP_FILL_RESERVE: u32 = 2048;

/// How long closing an AF_XDP port waits for the kernel to complete its last
/// transmissions, so that their mbufs are reaped back into the pool.
const AF_XDP_TX_REAP: std::time::Duration = std::time::Duration::from_millis(200);

/// The mbufs a port's driver parks in its RX queues and abandons at close.
///
/// They are counted in use forever, so the pool could never be freed (nor
/// EAL cleaned up, nor its runtime directory removed) once such a port has
/// been used. Queue setup records how many it took; closing the port
/// credits them to the pool as orphaned ([`Mempool::credit_orphaned`]), and
/// the pool is freed when nothing but orphans is out. The credit must never
/// exceed what the driver really abandons, which holds for 22.11's AF_XDP:
/// - setup takes exactly [`AF_XDP_FILL_RESERVE`] mbufs per RX queue (all or
///   nothing) into the fill ring; the credit is the in-use growth measured
///   around setup, capped at that figure, so an allocation by another thread
///   during setup cannot inflate it;
/// - RX keeps that set whole: a received mbuf is handed out only once its
///   replacement is allocated and put in the fill ring (which holds twice
///   the set, so putting it there cannot fail), else nothing is received;
/// - TX parks mbufs too, in the TX and completion rings, until a later burst
///   reaps the completions; they are not credited (closing first reaps them,
///   see [`reap_tx`]), so one the kernel has not completed in time keeps the
///   pool, which errs on the safe side;
/// - close (primary process only) deletes each queue's socket and the UMEM,
///   after which the kernel writes nothing more into the pool's memory and
///   the driver has freed its queue state, so no pointer to a parked mbuf is
///   left anywhere.
///
/// A port configured more than once is not credited (a second setup may
/// leave the first sockets behind, still bound), nor is any other driver or
/// DPDK version, nor a secondary process (whose close leaves the sockets).
#[derive(Debug)]
struct FillParking {
    pool: Mempool,
    parked: u32,
}

/// What to ask of a port; offloads and RSS types are masked by the device's
/// capabilities, and [`PortSetup`] says what was granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// RX queues (one per worker).
    pub rx_queues: u16,
    /// TX queues (one per worker).
    pub tx_queues: u16,
    /// RX descriptors per queue (adjusted to the device's limits).
    pub rx_desc: u16,
    /// TX descriptors per queue (adjusted to the device's limits).
    pub tx_desc: u16,
    /// Requested RX offloads ([`offload`] `RX_*`).
    pub rx_offloads: u64,
    /// Requested TX offloads ([`offload`] `TX_*`).
    pub tx_offloads: u64,
    /// Requested RSS hash types ([`offload`] `RSS_*`); RSS is off when the
    /// device supports none of them.
    pub rss_hf: u64,
    /// RSS key (the device's `hash_key_size` bytes); the device default if
    /// `None`. A symmetric key makes both directions of a flow hash alike.
    pub rss_key: Option<Vec<u8>>,
    /// MTU; the device default (1500) if `None`.
    pub mtu: Option<u16>,
    /// Receive frames for any MAC address (needed when the port answers for
    /// a MAC the device does not own, e.g. on a veth via af_packet).
    pub promiscuous: bool,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            rx_queues: 1,
            tx_queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            rx_offloads: offload::RX_IPV4_CKSUM | offload::RX_TCP_CKSUM | offload::RX_RSS_HASH,
            tx_offloads: offload::TX_MULTI_SEGS
                | offload::TX_IPV4_CKSUM
                | offload::TX_TCP_CKSUM
                | offload::TX_TCP_TSO,
            rss_hf: offload::RSS_IPV4 | offload::RSS_NONFRAG_IPV4_TCP,
            rss_key: None,
            mtu: None,
            promiscuous: false,
        }
    }
}

/// What [`Port::configure`] set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSetup {
    /// RX queues.
    pub rx_queues: u16,
    /// TX queues.
    pub tx_queues: u16,
    /// RX descriptors per queue, after adjustment.
    pub rx_desc: u16,
    /// TX descriptors per queue, after adjustment.
    pub tx_desc: u16,
    /// Granted RX offloads.
    pub rx_offloads: u64,
    /// Granted TX offloads.
    pub tx_offloads: u64,
    /// Granted RSS hash types (0: RSS off).
    pub rss_hf: u64,
}

impl PortSetup {
    /// Whether mbuf chains may be sent (else copy into one mbuf: DPDK
    /// 22.11's af_xdp sends only a chain's first segment).
    pub fn multi_seg_tx(&self) -> bool {
        self.tx_offloads & offload::TX_MULTI_SEGS != 0
    }

    /// Whether the device computes TCP checksums on transmit.
    pub fn tx_tcp_cksum(&self) -> bool {
        self.tx_offloads & offload::TX_TCP_CKSUM != 0
    }

    /// Whether TCP segmentation offload was granted (with the IPv4 and TCP
    /// checksums and chains it needs).
    pub fn tx_tso(&self) -> bool {
        let need = offload::TX_TCP_TSO
            | offload::TX_IPV4_CKSUM
            | offload::TX_TCP_CKSUM
            | offload::TX_MULTI_SEGS;
        self.tx_offloads & need == need
    }

    /// Whether the device verifies IPv4 and TCP checksums on receive.
    pub fn rx_cksum(&self) -> bool {
        self.rx_offloads & (offload::RX_IPV4_CKSUM | offload::RX_TCP_CKSUM)
            == offload::RX_IPV4_CKSUM | offload::RX_TCP_CKSUM
    }
}

/// A device's capabilities (`rte_eth_dev_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevInfo {
    /// The PMD's name, e.g. `net_ring`, `net_af_packet`.
    pub driver_name: String,
    /// Kernel interface index, 0 if none.
    pub if_index: u32,
    /// Smallest MTU.
    pub min_mtu: u16,
    /// Largest MTU.
    pub max_mtu: u16,
    /// Largest frame the device receives.
    pub max_rx_pktlen: u32,
    /// RX queues available.
    pub max_rx_queues: u16,
    /// TX queues available.
    pub max_tx_queues: u16,
    /// RX offloads supported.
    pub rx_offload_capa: u64,
    /// TX offloads supported.
    pub tx_offload_capa: u64,
    /// RSS hash types supported (0: no RSS).
    pub flow_type_rss_offloads: u64,
    /// Redirection-table entries (0: no table).
    pub reta_size: u16,
    /// RSS key bytes (0: not reported).
    pub hash_key_size: u8,
    /// Most segments (descriptors) one transmitted frame may take, TCP
    /// segmentation included (`tx_desc_lim.nb_seg_max`; 65535 where the
    /// driver sets no limit).
    pub tx_max_segs: u16,
}

impl DevInfo {
    /// Whether the device sends mbuf chains.
    pub fn multi_seg_tx(&self) -> bool {
        self.tx_offload_capa & offload::TX_MULTI_SEGS != 0
    }
}

/// The RSS configuration in force (`rte_eth_dev_rss_hash_conf_get`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RssHashConf {
    /// The Toeplitz key.
    pub key: Vec<u8>,
    /// Hash types in use.
    pub rss_hf: u64,
}

/// Port counters (`rte_eth_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received.
    pub ipackets: u64,
    /// Frames sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// Frames dropped by the device for want of RX descriptors.
    pub imissed: u64,
    /// Erroneous frames received.
    pub ierrors: u64,
    /// Failed transmissions.
    pub oerrors: u64,
    /// RX mbuf allocation failures.
    pub rx_nombuf: u64,
}

impl From<&sys::rte_eth_stats> for PortStats {
    fn from(s: &sys::rte_eth_stats) -> Self {
        PortStats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        }
    }
}

/// One of a driver's extended counters (`rte_eth_xstats_get`): what the
/// driver calls it (`rx_good_packets`, `rx_q0_errors`, a NIC's
/// `rx_crc_errors`, …) and its value. Drivers differ in what they keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XStat {
    /// The driver's name for it.
    pub name: String,
    /// Its value (almost always a count since the port started).
    pub value: u64,
}

/// An Ethernet port owned by this process.
#[derive(Debug)]
pub struct Port {
    inner: Arc<PortInner>,
}

#[derive(Debug)]
struct PortInner {
    id: u16,
    started: bool,
    nb_rx: u16,
    nb_tx: u16,
    /// Made by `ring_pair`: removed from the vdev bus on drop, so that the
    /// name can be used again.
    runtime_vdev: bool,
    rx_taken: AtomicU64,
    tx_taken: AtomicU64,
    /// Drained and freed after the port is closed (field order matters: the
    /// rings' mbufs go back to the pools below before those are released).
    _rings: Option<Arc<RingSet>>,
    /// Pools the queues receive into; released after close.
    pools: Vec<Mempool>,
    /// The AF_XDP driver's parked RX mbufs, credited to their pool at close.
    fill_parking: Option<FillParking>,
    /// RX queue setups by a driver that parks mbufs; more than one
    /// configuration withholds the credit.
    parking_setups: u32,
    _eal: Eal,
}

impl Port {
    /// The port DPDK named `name` (a vdev's name as given to `--vdev`, e.g.
    /// `net_ring0`, or a PCI address).
    pub fn by_name(eal: &Eal, name: &str) -> Result<Port, DpdkError> {
        let op = "rte_eth_dev_get_port_by_name";
        let cname = CString::new(name)
            .map_err(|_| DpdkError::with_message(op, libc::EINVAL, "name has a NUL"))?;
        let mut id = 0u16;
        // SAFETY: EAL is running; `id` is a valid out-pointer.
        let ret = unsafe { sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut id) };
        if ret != 0 {
            return Err(DpdkError::with_message(
                op,
                libc::ENODEV,
                format!("no port named {name:?}"),
            ));
        }
        Port::from_id(eal, id)
    }

    /// The port with id `id`; fails if it does not exist or this process
    /// already has a `Port` for it.
    pub fn from_id(eal: &Eal, id: u16) -> Result<Port, DpdkError> {
        Self::claim(eal, id, None)
    }

    /// Ids of every port EAL probed (from `--vdev`, PCI, or hot-plug).
    pub fn available(_eal: &Eal) -> Vec<u16> {
        let mut ids = Vec::new();
        // SAFETY: EAL is running; iterates the valid port ids.
        let mut id = unsafe { sys::rte_eth_find_next(0) };
        while u32::from(id) < sys::RTE_MAX_ETHPORTS {
            ids.push(id);
            // SAFETY: as above.
            id = unsafe { sys::rte_eth_find_next(id + 1) };
        }
        ids
    }

    /// Two ports wired back to back over `queues` pairs of rte_rings of
    /// `ring_size` mbufs (a power of two): what one sends on queue `q`, the
    /// other receives on queue `q`. Pointer passing, no copy; they advertise
    /// multi-segment TX. DPDK names them `net_ring_<name>_a` / `_b`.
    pub fn ring_pair(
        eal: &Eal,
        name: &str,
        queues: u16,
        ring_size: u32,
    ) -> Result<(Port, Port), DpdkError> {
        let op = "rte_eth_from_rings";
        if queues == 0 || queues > MAX_QUEUES {
            return Err(DpdkError::with_message(
                op,
                libc::EINVAL,
                "queues out of range",
            ));
        }
        let mut set = RingSet { rings: Vec::new() };
        let mut ab = Vec::with_capacity(usize::from(queues));
        let mut ba = Vec::with_capacity(usize::from(queues));
        for q in 0..queues {
            ab.push(set.create(&format!("{name}>{q}"), ring_size)?);
            ba.push(set.create(&format!("{name}<{q}"), ring_size)?);
        }
        let set = Arc::new(set);
        let make = |suffix: &str, rx: &[*mut sys::rte_ring], tx: &[*mut sys::rte_ring]| {
            let cname = CString::new(format!("{name}_{suffix}"))
                .map_err(|_| DpdkError::with_message(op, libc::EINVAL, "name has a NUL"))?;
            // SAFETY: the rings are valid and outlive the port (the port holds
            // `set`); DPDK copies the name and the arrays.
            let ret = unsafe {
                sys::rte_eth_from_rings(
                    cname.as_ptr(),
                    rx.as_ptr(),
                    u32::from(queues),
                    tx.as_ptr(),
                    u32::from(queues),
                    0,
                )
            };
            let id = u16::try_from(ret).map_err(|_| DpdkError::from_rte_errno(op))?;
            Self::claim(eal, id, Some(set.clone()))
        };
        let a = make("a", &ba, &ab)?;
        let b = make("b", &ab, &ba)?;
        Ok((a, b))
    }

    fn claim(eal: &Eal, id: u16, rings: Option<Arc<RingSet>>) -> Result<Port, DpdkError> {
        let op = "port";
        // SAFETY: EAL is running; any id may be asked about.
        let valid = unsafe { sys::rte_eth_dev_is_valid_port(id) } != 0;
        if u32::from(id) >= sys::RTE_MAX_ETHPORTS || !valid {
            return Err(DpdkError::with_message(
                op,
                libc::ENODEV,
                format!("no port {id}"),
            ));
        }
        let bit = 1u64 << id;
        if CLAIMED.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return Err(DpdkError::with_message(
                op,
                libc::EBUSY,
                format!("port {id} is already owned by a Port"),
            ));
        }
        Ok(Port {
            inner: Arc::new(PortInner {
                id,
                started: false,
                nb_rx: 0,
                nb_tx: 0,
                runtime_vdev: rings.is_some(),
                rx_taken: AtomicU64::new(0),
                tx_taken: AtomicU64::new(0),
                _rings: rings,
                pools: Vec::new(),
                fill_parking: None,
                parking_setups: 0,
                _eal: eal.clone(),
            }),
        })
    }

    /// The DPDK port id.
    pub fn id(&self) -> u16 {
        self.inner.id
    }

    /// The device's capabilities.
    pub fn dev_info(&self) -> Result<DevInfo, DpdkError> {
        let raw = self.raw_info()?;
        let driver_name = if raw.driver_name.is_null() {
            String::new()
        } else {
            // SAFETY: a NUL-terminated string owned by the driver.
            unsafe { CStr::from_ptr(raw.driver_name) }
                .to_string_lossy()
                .into_owned()
        };
        Ok(DevInfo {
            driver_name,
            if_index: raw.if_index,
            min_mtu: raw.min_mtu,
            max_mtu: raw.max_mtu,
            max_rx_pktlen: raw.max_rx_pktlen,
            max_rx_queues: raw.max_rx_queues,
            max_tx_queues: raw.max_tx_queues,
            rx_offload_capa: raw.rx_offload_capa,
            tx_offload_capa: raw.tx_offload_capa,
            flow_type_rss_offloads: raw.flow_type_rss_offloads,
            reta_size: raw.reta_size,
            hash_key_size: raw.hash_key_size,
            tx_max_segs: raw.tx_desc_lim.nb_seg_max,
        })
    }

    fn raw_info(&self) -> Result<sys::rte_eth_dev_info, DpdkError> {
        let mut info = sys::rte_eth_dev_info::default();
        // SAFETY: the port is valid; `info` is a valid out-pointer.
        check("rte_eth_dev_info_get", unsafe {
            sys::rte_eth_dev_info_get(self.id(), &mut info)
        })?;
        Ok(info)
    }

    /// The NUMA socket of the device (`-1`: any).
    pub fn socket_id(&self) -> i32 {
        // SAFETY: the port is valid.
        unsafe { sys::rte_eth_dev_socket_id(self.id()) }
    }

    /// The port's MAC address.
    pub fn mac_addr(&self) -> Result<[u8; 6], DpdkError> {
        let mut mac = sys::rte_ether_addr::default();
        // SAFETY: the port is valid; `mac` is a valid out-pointer.
        check("rte_eth_macaddr_get", unsafe {
            sys::rte_eth_macaddr_get(self.id(), &mut mac)
        })?;
        Ok(mac.addr_bytes)
    }

    /// Sets the port's MAC address, where the device allows it.
    pub fn set_mac_addr(&mut self, mac: [u8; 6]) -> Result<(), DpdkError> {
        let mut addr = sys::rte_ether_addr { addr_bytes: mac };
        // SAFETY: the port is valid; DPDK copies the address.
        check("rte_eth_dev_default_mac_addr_set", unsafe {
            sys::rte_eth_dev_default_mac_addr_set(self.id(), &mut addr)
        })
    }

    /// Configures queues, descriptors, offloads and RSS, with every RX queue
    /// receiving into `pool`. The port must be stopped and have no queue
    /// handles out.
    pub fn configure(&mut self, conf: &PortConfig, pool: &Mempool) -> Result<PortSetup, DpdkError> {
        let op = "rte_eth_dev_configure";
        let info = self.raw_info()?;
        let parks = parks_rx_mbufs(&info);
        let id = self.id();
        let socket = self.socket_id();
        let inner = self.exclusive(op)?;
        if inner.started {
            return Err(DpdkError::with_message(
                op,
                libc::EBUSY,
                "stop the port first",
            ));
        }
        if conf.rx_queues == 0
            || conf.tx_queues == 0
            || conf.rx_queues > MAX_QUEUES.min(info.max_rx_queues)
            || conf.tx_queues > MAX_QUEUES.min(info.max_tx_queues)
        {
            return Err(DpdkError::with_message(
                op,
                libc::EINVAL,
                format!(
                    "{} RX / {} TX queues asked, device has {} / {}",
                    conf.rx_queues, conf.tx_queues, info.max_rx_queues, info.max_tx_queues
                ),
            ));
        }
        let rx_offloads = conf.rx_offloads & info.rx_offload_capa;
        let tx_offloads = conf.tx_offloads & info.tx_offload_capa;
        let rss_hf = conf.rss_hf & info.flow_type_rss_offloads;

        let mut ec = sys::rte_eth_conf::default();
        ec.rxmode.offloads = rx_offloads;
        ec.txmode.offloads = tx_offloads;
        if let Some(mtu) = conf.mtu {
            ec.rxmode.mtu = u32::from(mtu);
        }
        let mut key = conf.rss_key.clone();
        if rss_hf != 0 {
            ec.rxmode.mq_mode = sys::RTE_ETH_MQ_RX_RSS;
            ec.rx_adv_conf.rss_conf.rss_hf = rss_hf;
            if let Some(key) = key.as_mut() {
                let want = usize::from(info.hash_key_size);
                if want != 0 && key.len() != want {
                    return Err(DpdkError::with_message(
                        op,
                        libc::EINVAL,
                        format!("RSS key of {} bytes, device wants {want}", key.len()),
                    ));
                }
                ec.rx_adv_conf.rss_conf.rss_key = key.as_mut_ptr();
                ec.rx_adv_conf.rss_conf.rss_key_len = u8::try_from(key.len())
                    .map_err(|_| DpdkError::with_message(op, libc::EINVAL, "RSS key too long"))?;
            }
        }
        // SAFETY: the port is valid and stopped; `ec` (and the key it points
        // to) lives across the call, which copies it.
        check(op, unsafe {
            sys::rte_eth_dev_configure(id, conf.rx_queues, conf.tx_queues, &ec)
        })?;
        let (mut rxd, mut txd) = (conf.rx_desc, conf.tx_desc);
        // SAFETY: the port is configured; both are valid in/out pointers.
        check("rte_eth_dev_adjust_nb_rx_tx_desc", unsafe {
            sys::rte_eth_dev_adjust_nb_rx_tx_desc(id, &mut rxd, &mut txd)
        })?;
        let socket_u = u32::try_from(socket).unwrap_or(u32::MAX);
        if parks {
            // Any setup, even one that fails half way, counts: a second one
            // voids the credit (see FillParking).
            inner.parking_setups += 1;
            inner.fill_parking = None;
        }
        let in_use_before = pool.in_use_count();
        for q in 0..conf.rx_queues {
            // SAFETY: the port is configured with this many queues; a null
            // rxconf takes the device defaults with the port's offloads; the
            // pool outlives the port (kept in `pools`).
            check("rte_eth_rx_queue_setup", unsafe {
                sys::rte_eth_rx_queue_setup(id, q, rxd, socket_u, std::ptr::null(), pool.as_ptr())
            })?;
        }
        if parks && inner.parking_setups == 1 {
            let taken = pool.in_use_count().saturating_sub(in_use_before);
            let cap = AF_XDP_FILL_RESERVE.saturating_mul(u32::from(conf.rx_queues));
            inner.fill_parking = Some(FillParking {
                pool: pool.clone(),
                parked: taken.min(cap),
            });
        }
        for q in 0..conf.tx_queues {
            // SAFETY: as above, for TX.
            check("rte_eth_tx_queue_setup", unsafe {
                sys::rte_eth_tx_queue_setup(id, q, txd, socket_u, std::ptr::null())
            })?;
        }
        if conf.promiscuous {
            // SAFETY: the port is valid.
            let ret = unsafe { sys::rte_eth_promiscuous_enable(id) };
            if ret < 0 && ret != -libc::ENOTSUP {
                return Err(DpdkError::from_ret("rte_eth_promiscuous_enable", ret));
            }
        }
        inner.nb_rx = conf.rx_queues;
        inner.nb_tx = conf.tx_queues;
        inner.pools.push(pool.clone());
        // Some drivers (net_null among them) ignore the key given at
        // configure time: set it explicitly, so that the key read back by
        // `rss_hash_conf_get` is the one asked for.
        if let (true, Some(key)) = (rss_hf != 0, key.as_deref()) {
            match self.rss_hash_update(key, rss_hf) {
                Err(e) if e.errno() != libc::ENOTSUP => return Err(e),
                _ => {}
            }
        }
        Ok(PortSetup {
            rx_queues: conf.rx_queues,
            tx_queues: conf.tx_queues,
            rx_desc: rxd,
            tx_desc: txd,
            rx_offloads,
            tx_offloads,
            rss_hf,
        })
    }

    /// Starts the port; queues can be taken afterwards.
    pub fn start(&mut self) -> Result<(), DpdkError> {
        let op = "rte_eth_dev_start";
        let id = self.id();
        let inner = self.exclusive(op)?;
        if inner.started {
            return Ok(());
        }
        // SAFETY: the port is valid and configured (DPDK checks).
        check(op, unsafe { sys::rte_eth_dev_start(id) })?;
        inner.started = true;
        Ok(())
    }

    /// Stops the port. Every queue handle must have been dropped first (a
    /// burst must not run during stop).
    pub fn stop(&mut self) -> Result<(), DpdkError> {
        let op = "rte_eth_dev_stop";
        let id = self.id();
        let inner = self.exclusive(op)?;
        if !inner.started {
            return Ok(());
        }
        reap_tx(inner);
        // SAFETY: the port is valid and no queue handle exists.
        check(op, unsafe { sys::rte_eth_dev_stop(id) })?;
        inner.started = false;
        Ok(())
    }

    /// Whether the port is started.
    pub fn is_started(&self) -> bool {
        self.inner.started
    }

    /// Whether the link is up (without waiting for negotiation).
    pub fn link_up(&self) -> bool {
        let mut link = sys::rte_eth_link::default();
        // SAFETY: the port is valid; `link` is a valid out-pointer.
        let ret = unsafe { sys::rte_eth_link_get_nowait(self.id(), &mut link) };
        ret == 0 && u32::from(link.link_status()) == sys::RTE_ETH_LINK_UP
    }

    /// The port's counters.
    pub fn stats(&self) -> Result<PortStats, DpdkError> {
        stats_of(self.id())
    }

    /// The driver's extended counters, by name.
    pub fn xstats(&self) -> Result<Vec<XStat>, DpdkError> {
        xstats_of(self.id())
    }

    /// The name DPDK gave the port (`net_ring0`, `net_af_packet0`, a PCI
    /// address).
    pub fn name(&self) -> Result<String, DpdkError> {
        name_of(self.id())
    }

    /// A handle that reads this port's counters from any thread. It does
    /// not keep the port open (reads fail with `ENODEV` once the port and
    /// its queues are gone), but while one is out the port cannot be
    /// stopped or reconfigured, as with a queue handle.
    pub fn counters(&self) -> PortCounters {
        PortCounters {
            id: self.inner.id,
            port: Arc::downgrade(&self.inner),
        }
    }

    /// The RSS key and hash types in force; `ENOTSUP` where the device has
    /// no RSS (every virtual device here).
    pub fn rss_hash_conf_get(&self) -> Result<RssHashConf, DpdkError> {
        let info = self.raw_info()?;
        // 40 bytes is the Toeplitz key of most NICs, for devices that do not
        // report a size.
        let len = if info.hash_key_size == 0 {
            40
        } else {
            info.hash_key_size
        };
        let mut key = vec![0u8; usize::from(len)];
        let mut conf = sys::rte_eth_rss_conf {
            rss_key: key.as_mut_ptr(),
            rss_key_len: len,
            rss_hf: 0,
        };
        // SAFETY: the port is valid; `conf.rss_key` points at `len` bytes.
        check("rte_eth_dev_rss_hash_conf_get", unsafe {
            sys::rte_eth_dev_rss_hash_conf_get(self.id(), &mut conf)
        })?;
        key.truncate(usize::from(conf.rss_key_len.min(len)));
        Ok(RssHashConf {
            key,
            rss_hf: conf.rss_hf,
        })
    }

    /// Sets the RSS key and hash types (RSS must have been configured).
    pub fn rss_hash_update(&mut self, key: &[u8], rss_hf: u64) -> Result<(), DpdkError> {
        let op = "rte_eth_dev_rss_hash_update";
        let mut key = key.to_vec();
        let mut conf = sys::rte_eth_rss_conf {
            rss_key: key.as_mut_ptr(),
            rss_key_len: u8::try_from(key.len())
                .map_err(|_| DpdkError::with_message(op, libc::EINVAL, "RSS key too long"))?,
            rss_hf,
        };
        // SAFETY: the port is valid; the key outlives the call, which copies
        // it.
        check(op, unsafe {
            sys::rte_eth_dev_rss_hash_update(self.id(), &mut conf)
        })
    }

    /// Replaces the redirection table (`reta.len()` must be the device's
    /// `reta_size`), e.g. with queues in turn, so that steering computed
    /// with [`crate::toeplitz::reta_queue`] matches the device.
    pub fn reta_update(&mut self, reta: &[u16]) -> Result<(), DpdkError> {
        let op = "rte_eth_dev_rss_reta_update";
        let size = u16::try_from(reta.len())
            .map_err(|_| DpdkError::with_message(op, libc::EINVAL, "table too large"))?;
        let group = sys::RTE_ETH_RETA_GROUP_SIZE as usize;
        let mut conf: Vec<sys::rte_eth_rss_reta_entry64> = reta
            .chunks(group)
            .map(|chunk| {
                let mut e = sys::rte_eth_rss_reta_entry64 {
                    mask: if chunk.len() == group {
                        u64::MAX
                    } else {
                        (1u64 << chunk.len()) - 1
                    },
                    reta: [0; 64],
                };
                e.reta[..chunk.len()].copy_from_slice(chunk);
                e
            })
            .collect();
        // SAFETY: the port is valid; `conf` covers `size` entries.
        check(op, unsafe {
            sys::rte_eth_dev_rss_reta_update(self.id(), conf.as_mut_ptr(), size)
        })
    }

    /// The RSS redirection table: entry `i` is the RX queue for hashes whose
    /// low bits are `i`; `ENOTSUP` where the device has none.
    pub fn reta_query(&self) -> Result<Vec<u16>, DpdkError> {
        let op = "rte_eth_dev_rss_reta_query";
        let size = self.raw_info()?.reta_size;
        if size == 0 {
            return Err(DpdkError::new(op, libc::ENOTSUP));
        }
        let group = sys::RTE_ETH_RETA_GROUP_SIZE as usize;
        let groups = usize::from(size).div_ceil(group);
        let mut conf = vec![
            sys::rte_eth_rss_reta_entry64 {
                mask: u64::MAX,
                reta: [0; 64],
            };
            groups
        ];
        // SAFETY: the port is valid; `conf` has one entry per 64 of `size`.
        check(op, unsafe {
            sys::rte_eth_dev_rss_reta_query(self.id(), conf.as_mut_ptr(), size)
        })?;
        Ok(conf
            .iter()
            .flat_map(|e| e.reta.iter().copied())
            .take(usize::from(size))
            .collect())
    }

    /// Takes RX queue `q` for one worker. The port must be started; each
    /// queue is handed out once until its handle drops.
    pub fn rx_queue(&mut self, q: u16) -> Result<RxQueue, DpdkError> {
        let port = self.take_queue(q, true)?;
        Ok(RxQueue { port, queue: q })
    }

    /// Takes TX queue `q` for one worker; see [`Port::rx_queue`].
    pub fn tx_queue(&mut self, q: u16) -> Result<TxQueue, DpdkError> {
        let port = self.take_queue(q, false)?;
        Ok(TxQueue { port, queue: q })
    }

    fn take_queue(&mut self, q: u16, rx: bool) -> Result<Arc<PortInner>, DpdkError> {
        let op = if rx { "rx_queue" } else { "tx_queue" };
        let inner = &self.inner;
        if !inner.started {
            return Err(DpdkError::with_message(
                op,
                libc::EINVAL,
                "start the port first",
            ));
        }
        let (n, taken) = if rx {
            (inner.nb_rx, &inner.rx_taken)
        } else {
            (inner.nb_tx, &inner.tx_taken)
        };
        if q >= n {
            return Err(DpdkError::with_message(
                op,
                libc::EINVAL,
                format!("no queue {q}"),
            ));
        }
        let bit = 1u64 << q;
        if taken.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return Err(DpdkError::with_message(
                op,
                libc::EBUSY,
                format!("queue {q} is taken"),
            ));
        }
        Ok(inner.clone())
    }

    fn exclusive(&mut self, op: &'static str) -> Result<&mut PortInner, DpdkError> {
        Arc::get_mut(&mut self.inner)
            .ok_or_else(|| DpdkError::with_message(op, libc::EBUSY, "queue handles are still out"))
    }
}

/// Reads a started port's device counters from a thread that is not one of
/// its workers (a control socket, a metrics scrape), while the workers poll
/// its queues.
///
/// This is how DPDK's own telemetry reads them: its ethdev handlers call
/// `rte_eth_stats_get` and `rte_eth_xstats_get` from the telemetry thread,
/// not an lcore, while the data path runs. The drivers read counters that
/// their burst functions or the hardware keep (per-queue software counts,
/// device registers) and take no queue, so a read neither waits for a
/// worker nor makes one wait. Each 64-bit counter is read whole, but the
/// counters are not read at one instant: `ibytes` may include a frame that
/// `ipackets` does not yet. What the handle does not do is reset the
/// counters (`rte_eth_stats_reset` races with the burst functions'
/// updates on the software drivers).
///
/// The handle holds the port weakly, so that it never decides when the port
/// closes (the last queue does, on its worker's way out): each read holds
/// it open for the length of the call only.
#[derive(Debug, Clone)]
pub struct PortCounters {
    id: u16,
    port: Weak<PortInner>,
}

impl PortCounters {
    /// The DPDK port id.
    pub fn port_id(&self) -> u16 {
        self.id
    }

    /// The port, held open for one read.
    fn open(&self, op: &'static str) -> Result<Arc<PortInner>, DpdkError> {
        self.port
            .upgrade()
            .ok_or_else(|| DpdkError::with_message(op, libc::ENODEV, "the port is closed"))
    }

    /// The name DPDK gave the port.
    pub fn name(&self) -> Result<String, DpdkError> {
        let _open = self.open("rte_eth_dev_get_name_by_port")?;
        name_of(self.id)
    }

    /// The PMD's name (`net_ring`, `net_af_packet`, `net_ixgbe`, …).
    pub fn driver_name(&self) -> Result<String, DpdkError> {
        let _open = self.open("rte_eth_dev_info_get")?;
        let mut info = sys::rte_eth_dev_info::default();
        // SAFETY: `_open` holds the port open; `info` is a valid
        // out-pointer.
        check("rte_eth_dev_info_get", unsafe {
            sys::rte_eth_dev_info_get(self.id, &mut info)
        })?;
        if info.driver_name.is_null() {
            return Ok(String::new());
        }
        // SAFETY: a NUL-terminated string owned by the driver.
        Ok(unsafe { CStr::from_ptr(info.driver_name) }
            .to_string_lossy()
            .into_owned())
    }

    /// The port's basic counters (`rte_eth_stats_get`).
    pub fn stats(&self) -> Result<PortStats, DpdkError> {
        let _open = self.open("rte_eth_stats_get")?;
        stats_of(self.id)
    }

    /// The driver's extended counters, by name (`rte_eth_xstats_get`).
    pub fn xstats(&self) -> Result<Vec<XStat>, DpdkError> {
        let _open = self.open("rte_eth_xstats_get")?;
        xstats_of(self.id)
    }
}

fn stats_of(id: u16) -> Result<PortStats, DpdkError> {
    let mut s = sys::rte_eth_stats::default();
    // SAFETY: the caller holds the port open; `s` is a valid out-pointer.
    check("rte_eth_stats_get", unsafe {
        sys::rte_eth_stats_get(id, &mut s)
    })?;
    Ok(PortStats::from(&s))
}

fn name_of(id: u16) -> Result<String, DpdkError> {
    let mut buf: [std::os::raw::c_char; sys::RTE_ETH_NAME_MAX_LEN as usize] =
        [0; sys::RTE_ETH_NAME_MAX_LEN as usize];
    // SAFETY: the caller holds the port open; `buf` has the
    // RTE_ETH_NAME_MAX_LEN bytes DPDK writes at most, NUL included.
    check("rte_eth_dev_get_name_by_port", unsafe {
        sys::rte_eth_dev_get_name_by_port(id, buf.as_mut_ptr())
    })?;
    Ok(c_name(&buf))
}

/// Attempts at reading the extended counters before giving up, should
/// their number change between the calls (a driver that adds queues).
const XSTATS_ATTEMPTS: usize = 4;

fn xstats_of(id: u16) -> Result<Vec<XStat>, DpdkError> {
    let op = "rte_eth_xstats_get";
    let count =
        |ret: i32, op: &'static str| usize::try_from(ret).map_err(|_| DpdkError::from_ret(op, ret));
    for _ in 0..XSTATS_ATTEMPTS {
        // SAFETY: the caller holds the port open; a null array of size 0
        // asks for the number of counters.
        let n = count(
            unsafe { sys::rte_eth_xstats_get_names(id, std::ptr::null_mut(), 0) },
            "rte_eth_xstats_get_names",
        )?;
        let size = u32::try_from(n).map_err(|_| DpdkError::new(op, libc::ERANGE))?;
        let mut names = vec![sys::rte_eth_xstat_name::default(); n];
        // SAFETY: `names` has room for `size` entries.
        let got = count(
            unsafe { sys::rte_eth_xstats_get_names(id, names.as_mut_ptr(), size) },
            "rte_eth_xstats_get_names",
        )?;
        if got > n {
            continue;
        }
        names.truncate(got);
        let mut values = vec![sys::rte_eth_xstat::default(); n];
        // SAFETY: `values` has room for `size` entries.
        let got = count(
            unsafe { sys::rte_eth_xstats_get(id, values.as_mut_ptr(), size) },
            op,
        )?;
        if got > n {
            continue;
        }
        values.truncate(got);
        return Ok(pair_xstats(&names, &values));
    }
    Err(DpdkError::with_message(
        op,
        libc::EAGAIN,
        "the number of extended counters kept changing",
    ))
}

/// Each value with its name: a value's `id` indexes the names (values
/// whose id has no name are left out).
fn pair_xstats(names: &[sys::rte_eth_xstat_name], values: &[sys::rte_eth_xstat]) -> Vec<XStat> {
    values
        .iter()
        .filter_map(|v| {
            let name = names.get(usize::try_from(v.id).ok()?)?;
            Some(XStat {
                name: c_name(&name.name),
                value: v.value,
            })
        })
        .collect()
}

/// A fixed-size C string: up to its first NUL (all of it without one).
fn c_name(raw: &[std::os::raw::c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Whether the port's driver parks RX mbufs that it abandons at close, in a
/// way [`FillParking`] has been checked against: 22.11's AF_XDP.
fn parks_rx_mbufs(info: &sys::rte_eth_dev_info) -> bool {
    if info.driver_name.is_null() || !crate::DPDK_VERSION.starts_with("22.11") {
        return false;
    }
    // SAFETY: a NUL-terminated string owned by the driver.
    let name = unsafe { CStr::from_ptr(info.driver_name) };
    name.to_bytes() == AF_XDP_DRIVER.as_bytes()
}

/// Before an AF_XDP port stops, returns the mbufs of its completed
/// transmissions to the pool: the driver reaps completions only at the next
/// burst, so the last frames sent stay out otherwise, and the pool would be
/// kept. An empty burst reaps; the kernel may complete a frame a little
/// later, so this retries until only the parked RX mbufs are out, or for
/// [`AF_XDP_TX_REAP`] at most (only at teardown, never on the data path).
/// Mbufs that stay out simply keep the pool, as before.
fn reap_tx(port: &PortInner) {
    let Some(p) = &port.fill_parking else {
        return;
    };
    let deadline = std::time::Instant::now() + AF_XDP_TX_REAP;
    let mut none = MbufBurst::new();
    loop {
        for q in 0..port.nb_tx {
            // SAFETY: the port is started and no queue handle exists (the
            // caller is stopping or dropping it), so nothing else bursts on
            // the queue; an empty burst hands over no mbuf.
            unsafe { sys::shim_eth_tx_burst(port.id, q, none.as_mut_ptr(), 0) };
        }
        if p.pool.in_use_count() <= p.parked || std::time::Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The generic device behind port `id`, if the port exists.
pub(crate) fn device_of(id: u16) -> Option<NonNull<sys::rte_device>> {
    // SAFETY: any id may be asked about.
    if u32::from(id) >= sys::RTE_MAX_ETHPORTS || unsafe { sys::rte_eth_dev_is_valid_port(id) } == 0
    {
        return None;
    }
    let mut info = sys::rte_eth_dev_info::default();
    // SAFETY: the port exists; `info` is a valid out-pointer.
    if unsafe { sys::rte_eth_dev_info_get(id, &mut info) } != 0 {
        return None;
    }
    NonNull::new(info.device)
}

impl Drop for PortInner {
    fn drop(&mut self) {
        let id = self.id;
        if self.started {
            reap_tx(self);
        }
        // SAFETY: the last handle on the port is gone, so no burst runs; the
        // port is valid until closed here.
        let closed = unsafe {
            if self.started {
                sys::rte_eth_dev_stop(id);
            }
            let mut device = std::ptr::null_mut();
            if self.runtime_vdev {
                let mut info = sys::rte_eth_dev_info::default();
                if sys::rte_eth_dev_info_get(id, &mut info) == 0 {
                    device = info.device;
                }
            }
            let closed = sys::rte_eth_dev_close(id) == 0;
            // A ring pair's vdevs are removed too, so that the names are free
            // again; EAL removes the --vdev ones at cleanup.
            if !device.is_null() {
                sys::rte_dev_remove(device);
            }
            closed
        };
        // SAFETY: reads EAL's process type; EAL is alive (`_eal`).
        let primary = unsafe { sys::rte_eal_process_type() } == sys::RTE_PROC_PRIMARY;
        if let (true, true, Some(p)) = (closed, primary, &self.fill_parking) {
            // The sockets and the UMEM are gone: the parked mbufs can never
            // be written or handed out again (see FillParking).
            p.pool.credit_orphaned(p.parked);
        }
        CLAIMED.fetch_and(!(1u64 << id), Ordering::AcqRel);
    }
}

/// One RX queue of a started port, owned by the worker that polls it. It
/// may move to that worker's thread; DPDK's rule that one thread at a time
/// polls a queue is `&mut self`.
#[derive(Debug)]
pub struct RxQueue {
    port: Arc<PortInner>,
    queue: u16,
}

impl RxQueue {
    /// Receives up to the burst's spare room, appending to `out`; returns how
    /// many arrived.
    #[inline]
    pub fn rx_burst(&mut self, out: &mut MbufBurst) -> usize {
        let spare = out.spare();
        if spare == 0 {
            return 0;
        }
        let slots = out.spare_ptr();
        // SAFETY: the port is started (queues exist only then) and this
        // handle is the queue's only user; `slots` has `spare` empty entries.
        let n = unsafe { sys::shim_eth_rx_burst(self.port.id, self.queue, slots, spare as u16) };
        let n = usize::from(n).min(spare);
        // SAFETY: DPDK wrote `n` owned mbufs into the spare slots.
        unsafe { out.commit(n) };
        n
    }

    /// The port id.
    pub fn port_id(&self) -> u16 {
        self.port.id
    }

    /// The queue id.
    pub fn queue_id(&self) -> u16 {
        self.queue
    }
}

impl Drop for RxQueue {
    fn drop(&mut self) {
        self.port
            .rx_taken
            .fetch_and(!(1u64 << self.queue), Ordering::AcqRel);
    }
}

/// One TX queue of a started port, owned by the worker that sends on it.
#[derive(Debug)]
pub struct TxQueue {
    port: Arc<PortInner>,
    queue: u16,
}

impl TxQueue {
    /// Hands the burst's mbufs, from the front, to the device; returns how
    /// many it took. Those it did not take stay in `pkts`, in order, owned by
    /// the caller (retry them, or drop to free).
    #[inline]
    pub fn tx_burst(&mut self, pkts: &mut MbufBurst) -> usize {
        let len = pkts.len();
        if len == 0 {
            return 0;
        }
        // SAFETY: the port is started and this handle is the queue's only
        // user; the first `len` slots hold owned mbufs, of which DPDK takes
        // the first `n`.
        let n = unsafe {
            sys::shim_eth_tx_burst(self.port.id, self.queue, pkts.as_mut_ptr(), len as u16)
        };
        let n = usize::from(n).min(len);
        // SAFETY: the device owns the first `n` mbufs now.
        unsafe { pkts.consume_front(n) };
        n
    }

    /// Lets the driver check and fix up offload metadata
    /// (`rte_eth_tx_prepare`); returns how many of the burst's mbufs, from
    /// the front, are fit to send. The rest should be dropped.
    #[inline]
    pub fn tx_prepare(&mut self, pkts: &mut MbufBurst) -> usize {
        let len = pkts.len();
        // SAFETY: as in tx_burst; prepare does not take ownership.
        let n = unsafe {
            sys::shim_eth_tx_prepare(self.port.id, self.queue, pkts.as_mut_ptr(), len as u16)
        };
        usize::from(n).min(len)
    }

    /// The port id.
    pub fn port_id(&self) -> u16 {
        self.port.id
    }

    /// The queue id.
    pub fn queue_id(&self) -> u16 {
        self.queue
    }
}

impl Drop for TxQueue {
    fn drop(&mut self) {
        self.port
            .tx_taken
            .fetch_and(!(1u64 << self.queue), Ordering::AcqRel);
    }
}

/// The rings behind a [`Port::ring_pair`], freed after both ports close.
#[derive(Debug)]
struct RingSet {
    rings: Vec<NonNull<sys::rte_ring>>,
}

// SAFETY: the rings are only freed in Drop, when no port uses them.
unsafe impl Send for RingSet {}
// SAFETY: RingSet itself has no `&self` operations.
unsafe impl Sync for RingSet {}

impl RingSet {
    fn create(&mut self, name: &str, size: u32) -> Result<*mut sys::rte_ring, DpdkError> {
        let op = "rte_ring_create";
        let cname = CString::new(name)
            .map_err(|_| DpdkError::with_message(op, libc::EINVAL, "name has a NUL"))?;
        // Single producer and consumer: each ring joins one TX queue to one
        // RX queue, each owned by one thread.
        let flags = sys::RING_F_SP_ENQ | sys::RING_F_SC_DEQ;
        // SAFETY: EAL is running (the caller holds it); DPDK copies the name.
        let r = unsafe { sys::rte_ring_create(cname.as_ptr(), size, -1, flags) };
        let r = NonNull::new(r).ok_or_else(|| DpdkError::from_rte_errno(op))?;
        self.rings.push(r);
        Ok(r.as_ptr())
    }
}

impl Drop for RingSet {
    fn drop(&mut self) {
        let mut burst = MbufBurst::new();
        for r in &self.rings {
            // SAFETY: both ports are closed, so this is the rings' only user;
            // every object in them is an mbuf some TX queue handed over.
            unsafe {
                loop {
                    let spare = burst.spare_ptr().cast();
                    let n = sys::shim_ring_dequeue_burst(r.as_ptr(), spare, 32);
                    if n == 0 {
                        break;
                    }
                    burst.commit(n as usize);
                    burst.clear();
                }
                sys::rte_ring_free(r.as_ptr());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> sys::rte_eth_xstat_name {
        let mut n = sys::rte_eth_xstat_name::default();
        for (d, s) in n.name.iter_mut().zip(text.bytes()) {
            *d = s as std::os::raw::c_char;
        }
        n
    }

    #[test]
    fn port_stats_from_the_raw_struct() {
        let raw = sys::rte_eth_stats {
            ipackets: 1,
            opackets: 2,
            ibytes: 3,
            obytes: 4,
            imissed: 5,
            ierrors: 6,
            oerrors: 7,
            rx_nombuf: 8,
            ..Default::default()
        };
        assert_eq!(
            PortStats::from(&raw),
            PortStats {
                ipackets: 1,
                opackets: 2,
                ibytes: 3,
                obytes: 4,
                imissed: 5,
                ierrors: 6,
                oerrors: 7,
                rx_nombuf: 8,
            }
        );
    }

    #[test]
    fn extended_counters_pair_by_id() {
        let names = [
            name("rx_good_packets"),
            name("tx_good_packets"),
            name("rx_q0_errors"),
        ];
        // Out of order, and one id past the names (left out).
        let values = [
            sys::rte_eth_xstat { id: 2, value: 9 },
            sys::rte_eth_xstat { id: 0, value: 41 },
            sys::rte_eth_xstat { id: 7, value: 1 },
            sys::rte_eth_xstat { id: 1, value: 40 },
        ];
        let got = pair_xstats(&names, &values);
        let got: Vec<(&str, u64)> = got.iter().map(|x| (x.name.as_str(), x.value)).collect();
        assert_eq!(
            got,
            [
                ("rx_q0_errors", 9),
                ("rx_good_packets", 41),
                ("tx_good_packets", 40)
            ]
        );
        assert!(pair_xstats(&names, &[]).is_empty());
    }

    #[test]
    fn c_names_stop_at_nul_or_the_end() {
        assert_eq!(c_name(&name("net_ring0").name), "net_ring0");
        let full = [b'a' as std::os::raw::c_char; 64];
        assert_eq!(c_name(&full).len(), 64, "no NUL: the whole array");
        assert_eq!(c_name(&[0; 4]), "");
        let odd = [
            0xffu8 as std::os::raw::c_char,
            b'x' as std::os::raw::c_char,
            0,
        ];
        assert_eq!(
            c_name(&odd),
            "\u{fffd}x",
            "invalid UTF-8 replaced, not a panic"
        );
    }
}
