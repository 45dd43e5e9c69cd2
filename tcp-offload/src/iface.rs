//! A sans-IO host interface: Ethernet II, ARP (RFC 826 resolver and
//! responder), IPv4 (RFC 791; fragments refused and counted) and ICMP echo
//! (RFC 792) around a TCP [`Stack`]. It turns received frames into stack
//! input and stack output into frames; the simulator and the kernel-interop
//! test drive it, and the dataplane's slow path follows the same logic.
//!
//! Order of calls for a driver:
//!
//! 1. for each received frame, [`Interface::handle_frame`] (or
//!    [`Interface::handle_frame_with`], passing what the device's receive
//!    checksum offload said about it);
//! 2. [`Interface::handle_timeout`] when `now >= poll_timeout()`;
//! 3. work with connections through [`Interface::stack_mut`] (accept,
//!    events, `recv`, records);
//! 4. call [`Interface::poll_frame`] until it returns `None`, putting each
//!    frame on the wire.
//!
//! Received TCP payload stays in the frame it arrived in: the stack gets a
//! [`Payload`] over the frame buffer `B`. Outgoing frames are built into a
//! buffer the driver lends, with the record bytes copied in by
//! [`RecordBytes::copy_to`] (the dataplane's transmit path builds frames in
//! parts instead, attaching or copying payload from its own records).
//!
//! A device that verifies checksums on receive spares the software check:
//! a checksum it found good is trusted, one it found bad drops the frame
//! before any parsing, and one it did not look at is verified here. The
//! device's verdict covers the IPv4 header and the TCP segment; ICMP is
//! always verified here (devices report on TCP and UDP only).
//!
//! Everything is on-link: the next hop of every destination is the
//! destination itself (one subnet, no gateway). When its MAC address is
//! unknown, an ARP request goes out, at most once per [`ARP_RETRY`] per
//! address, and the frame is held until the reply comes (as a host's
//! neighbour table does), so that the first SYN to a new peer does not
//! wait for the retransmission timer. Resolution is the slow path: held
//! frames are copies, at most [`ARP_HOLD_PER_ADDR`] per address and
//! [`ARP_HOLD`] in all, in buffers allocated once and reused. Frames held
//! past the last unanswered request are dropped and counted.
//!
//! Learned entries age, after RFC 1122's unicast poll (section 2.3.2.1):
//!
//! - an entry confirmed by an ARP packet from its address (a reply, or a
//!   request for anyone) within [`ARP_REACHABLE`] is used as it is;
//! - an older one is still used, and the first TCP frame sent with it
//!   starts a refresh: an ARP request to the cached MAC address, sent
//!   again every [`ARP_RETRY`] by [`Interface::handle_timeout`] up to
//!   [`ARP_MAX_TRIES`] in all. An answer confirms the entry and ends it;
//! - an entry whose refresh goes unanswered is removed one retry interval
//!   after the last request, and the next frame to its address is
//!   resolved afresh (broadcast request, frame held);
//! - an entry neither confirmed nor refreshed for [`ARP_FORGET`] was not
//!   used since it aged (use would have refreshed or removed it), and is
//!   removed.
//!
//! Static entries ([`Interface::add_static_arp`]) never age.
//! [`Interface::poll_timeout`] includes every refresh and removal time.

use core::net::Ipv4Addr;
use core::ops::Range;
use core::time::Duration;
use std::collections::VecDeque;

use crate::tcp::{Config, FourTuple, Payload, Record, RecordBytes, Segment, Stack, Train};
use crate::time::Instant;
use crate::wire::{
    checksum, ArpOperation, ArpPacket, ArpRepr, Checksum, EtherType, EthernetAddress,
    EthernetFrame, EthernetRepr, Icmpv4Packet, Icmpv4Repr, IpProtocol, Ipv4Packet, Ipv4Repr,
    TcpPacket, TcpRepr, WireError,
};

/// Entries in the ARP cache. A host talks to few neighbours; the cache is
/// a small array searched linearly, the least recently learned entry
/// replaced when full (static entries never are).
pub const ARP_CACHE_SIZE: usize = 64;

/// Addresses being resolved at once; more unresolved destinations wait for
/// a free entry (their segments are dropped and retransmitted meanwhile).
pub const ARP_PENDING: usize = 16;

/// Minimum interval between ARP requests for one address.
pub const ARP_RETRY: Duration = Duration::from_secs(1);

/// How long a learned entry is used without question after an ARP packet
/// from its address confirmed it; afterwards its next use refreshes it.
/// Linux's base reachable time: a neighbour that changed its MAC address
/// is found out within this (and a refresh) of a connection's traffic,
/// and a busy neighbour costs one unicast request per period.
pub const ARP_REACHABLE: Duration = Duration::from_secs(30);

/// An entry neither confirmed nor used for this long after it aged is
/// removed, so that the cache keeps no dead neighbours. Four reachable
/// periods: long enough that a connection pausing for a while still
/// finds its neighbour, short enough to free the slot of one gone.
pub const ARP_FORGET: Duration = Duration::from_secs(4 * ARP_REACHABLE.as_secs());

/// Frames held for one address while it is resolved; the oldest gives way
/// to a newer one. A handshake needs one; a few more cover a connection
/// whose neighbour entry was replaced while it was sending.
pub const ARP_HOLD_PER_ADDR: usize = 4;

/// Frames held in all while addresses are resolved; past it, frames to
/// unresolved addresses are dropped (TCP retransmits them).
pub const ARP_HOLD: usize = 32;

/// Requests sent for one address before giving up until traffic asks
/// again; also the requests of one refresh of an aged entry.
pub const ARP_MAX_TRIES: u32 = 3;

/// Budget of the slow-path queue (ARP replies and requests, ICMP echo
/// replies): a ping flood costs this many buffered replies, no more.
pub const SLOW_QUEUE: usize = 32;

/// Time to live of every datagram we send (Linux's default).
pub const TTL: u8 = 64;

/// The Ethernet minimum frame length without FCS; shorter frames are
/// padded with zeros.
pub const MIN_FRAME: usize = 60;

/// Every [`WireError`], in the order of [`IfaceStats::drops`].
pub const WIRE_ERRORS: [WireError; 7] = [
    WireError::Truncated,
    WireError::BadLength,
    WireError::BadChecksum,
    WireError::BadOption,
    WireError::BadVersion,
    WireError::Fragmented,
    WireError::Unsupported,
];

fn reason_index(e: WireError) -> usize {
    match e {
        WireError::Truncated => 0,
        WireError::BadLength => 1,
        WireError::BadChecksum => 2,
        WireError::BadOption => 3,
        WireError::BadVersion => 4,
        WireError::Fragmented => 5,
        WireError::Unsupported => 6,
    }
}

/// What the receiving device said about one checksum of a frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DeviceCksum {
    /// The device did not check it (or cannot say): verify in software.
    #[default]
    Unchecked,
    /// The device checked it and found it right: trust it.
    Good,
    /// The device checked it and found it wrong: the frame is dropped and
    /// counted as [`WireError::BadChecksum`] without being parsed.
    Bad,
}

impl DeviceCksum {
    /// How the wire parser treats the field.
    fn parse_mode(self) -> Checksum {
        match self {
            DeviceCksum::Good => Checksum::Trusted,
            DeviceCksum::Unchecked | DeviceCksum::Bad => Checksum::Verify,
        }
    }
}

/// The device's verdicts on a received frame's checksums, for
/// [`Interface::handle_frame_with`]. The default checks both in software,
/// as [`Interface::handle_frame`] does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RxChecksum {
    /// The IPv4 header checksum.
    pub ip: DeviceCksum,
    /// The TCP checksum (ICMP's is always verified in software).
    pub l4: DeviceCksum,
}

impl RxChecksum {
    /// Nothing known: both verified in software.
    pub const VERIFY: RxChecksum = RxChecksum {
        ip: DeviceCksum::Unchecked,
        l4: DeviceCksum::Unchecked,
    };

    /// Whether the device found either checksum wrong.
    pub fn any_bad(self) -> bool {
        self.ip == DeviceCksum::Bad || self.l4 == DeviceCksum::Bad
    }

    /// Whether the device vouched for either checksum: such a frame is
    /// counted as trusted (`IfaceStats::rx_cksum_trusted`).
    pub fn any_good(self) -> bool {
        self.ip == DeviceCksum::Good || self.l4 == DeviceCksum::Good
    }
}

/// Configuration of an [`Interface`].
#[derive(Debug, Clone)]
pub struct InterfaceConfig {
    /// Our MAC address.
    pub mac: EthernetAddress,
    /// Our IPv4 address.
    pub ip: Ipv4Addr,
    /// IP MTU: the largest datagram, headers included (1500 on Ethernet).
    /// The TCP MSS is clamped to `mtu − 40`.
    pub mtu: usize,
    /// Configuration of every TCP connection.
    pub tcp: Config,
    /// Secret for ISNs, SYN cookies and hashing; draw it from the OS.
    pub key: [u8; 16],
    /// Most TCP connections held at once (half-open included).
    pub max_connections: usize,
    /// How the bytes of a received TCP segment are summed to verify its
    /// checksum where the device did not: [`checksum::sum`] unless the
    /// caller has a faster function with the same result (the dataplane's
    /// vector sum); every received payload byte goes through it.
    ///
    /// [`checksum::sum`]: crate::wire::checksum::sum
    pub sum: fn(&[u8]) -> u32,
}

impl InterfaceConfig {
    /// A configuration with an Ethernet MTU, the default TCP
    /// configuration and room for 1024 connections.
    pub fn new(mac: EthernetAddress, ip: Ipv4Addr, key: [u8; 16]) -> InterfaceConfig {
        InterfaceConfig {
            mac,
            ip,
            mtu: 1500,
            tcp: Config::default(),
            key,
            max_connections: 1024,
            sum: crate::wire::checksum::sum,
        }
    }
}

/// Counters of an [`Interface`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IfaceStats {
    pub rx_frames: u64,
    pub tx_frames: u64,
    /// Frames dropped for a wire-format reason, indexed like
    /// [`WIRE_ERRORS`] (see [`IfaceStats::drops_for`]).
    pub drops: [u64; 7],
    /// Well-formed frames addressed to another host (MAC or IP), or to a
    /// broadcast or multicast address above ARP.
    pub not_for_us: u64,
    /// Frames carrying a VLAN tag (this host is untagged).
    pub vlan_drops: u64,
    pub arp_in: u64,
    pub arp_out: u64,
    pub icmp_in: u64,
    pub icmp_out: u64,
    pub tcp_in: u64,
    pub tcp_out: u64,
    /// TCP segments held while the next hop's MAC address was resolved.
    pub arp_held: u64,
    /// TCP segments dropped because the next hop's MAC was unknown: the
    /// hold bounds were reached, no resolution could be started, or it
    /// failed.
    pub arp_miss_drops: u64,
    /// Slow-path frames dropped because [`SLOW_QUEUE`] was full.
    pub slow_queue_drops: u64,
    /// Outgoing frames dropped because they exceed the MTU or the buffer
    /// `poll_frame` was given.
    pub tx_too_large: u64,
    /// Received frames whose IPv4 or TCP checksum was trusted to the
    /// device rather than verified here ([`Interface::handle_frame_with`]).
    pub rx_cksum_trusted: u64,
    /// Received frames the device found a bad checksum in (also counted
    /// in [`IfaceStats::drops`] as [`WireError::BadChecksum`]).
    pub rx_cksum_device_bad: u64,
    /// ARP requests queued to the cached MAC address of an entry past
    /// [`ARP_REACHABLE`] to refresh it, every try counted (also counted
    /// in [`IfaceStats::arp_out`] when sent).
    pub arp_refreshes: u64,
    /// Learned entries removed from the cache: their refresh went
    /// unanswered, or they went unused for [`ARP_FORGET`].
    pub arp_expired: u64,
}

impl IfaceStats {
    /// Frames dropped for reason `e`.
    pub fn drops_for(&self, e: WireError) -> u64 {
        self.drops[reason_index(e)]
    }
}

#[derive(Debug, Clone, Copy)]
struct ArpEntry {
    ip: Ipv4Addr,
    mac: EthernetAddress,
    /// When an ARP packet from `ip` last confirmed it.
    learned: Instant,
    is_static: bool,
    /// Refresh requests sent since the entry was last confirmed; zero
    /// while it is not being refreshed.
    probes: u32,
    /// While refreshing: when the next request is due, or, after the
    /// last, when the entry is given up.
    probe_at: Instant,
}

impl ArpEntry {
    /// When [`Interface::handle_timeout`] has work on the entry: the next
    /// step of its refresh, or its removal as unused.
    fn deadline(&self) -> Option<Instant> {
        match (self.is_static, self.probes) {
            (true, _) => None,
            (false, 0) => Some(self.learned + ARP_FORGET),
            (false, _) => Some(self.probe_at),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    ip: Ipv4Addr,
    next: Instant,
    tries: u32,
}

/// A whole frame built for an address being resolved; its destination MAC
/// is filled in when it is known.
#[derive(Debug)]
struct HeldFrame {
    ip: Ipv4Addr,
    /// Known once the address is resolved: the frame may go.
    mac: Option<EthernetAddress>,
    frame: Vec<u8>,
}

/// The MAC address a TCP frame to `ip` sent at `now` goes to, if known.
/// The first use of an entry past [`ARP_REACHABLE`] starts its refresh
/// with a request to the cached address.
fn next_hop(
    config: &InterfaceConfig,
    cache: &mut [ArpEntry],
    slow: &mut VecDeque<SlowFrame>,
    stats: &mut IfaceStats,
    now: Instant,
    ip: Ipv4Addr,
) -> Option<EthernetAddress> {
    let e = cache.iter_mut().find(|e| e.ip == ip)?;
    if !e.is_static && e.probes == 0 && now >= e.learned + ARP_REACHABLE {
        e.probes = 1;
        e.probe_at = now + ARP_RETRY;
        if push_slow(slow, stats, SlowFrame::request(config, e.mac, ip)) {
            stats.arp_refreshes += 1;
        }
    }
    Some(e.mac)
}

/// Queues `f` on the slow path unless [`SLOW_QUEUE`] frames wait
/// already (counted); whether it was queued.
fn push_slow(slow: &mut VecDeque<SlowFrame>, stats: &mut IfaceStats, f: SlowFrame) -> bool {
    if slow.len() >= SLOW_QUEUE {
        stats.slow_queue_drops += 1;
        false
    } else {
        slow.push_back(f);
        true
    }
}

impl SlowFrame {
    /// An ARP request from us for `ip`, to `dst_mac`: broadcast to
    /// resolve it, the cached address to refresh its entry.
    fn request(config: &InterfaceConfig, dst_mac: EthernetAddress, ip: Ipv4Addr) -> SlowFrame {
        SlowFrame::Arp {
            dst_mac,
            repr: ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Request,
                source_hardware_addr: config.mac,
                source_protocol_addr: config.ip,
                target_hardware_addr: EthernetAddress([0; 6]),
                target_protocol_addr: ip,
            },
        }
    }
}

/// A frame waiting in the slow-path queue.
#[derive(Debug)]
enum SlowFrame {
    Arp {
        dst_mac: EthernetAddress,
        repr: ArpRepr,
    },
    EchoReply {
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Addr,
        ident: u16,
        seq_no: u16,
        data: Vec<u8>,
    },
}

/// One IPv4 host on one Ethernet port.
#[derive(Debug)]
pub struct Interface<B, R> {
    config: InterfaceConfig,
    stack: Stack<B, R>,
    arp_cache: Vec<ArpEntry>,
    pending: Vec<Pending>,
    /// Frames waiting for an address, oldest first.
    held: VecDeque<HeldFrame>,
    /// Buffers of frames no longer held, for reuse: together with `held`
    /// never more than [`ARP_HOLD`].
    spare: Vec<Vec<u8>>,
    slow: VecDeque<SlowFrame>,
    ident: u16,
    stats: IfaceStats,
    /// [`Interface::poll_frame_parts`]: a whole frame built for an address
    /// not yet resolved, handed to the hold queue on the next call (the
    /// segment's borrow of the stack prevents doing it at once).
    pending_hold: Option<Ipv4Addr>,
    /// The buffer of that frame, allocated once.
    hold_scratch: Vec<u8>,
}

/// A TCP segment's frame in parts, from [`Interface::poll_frame_parts`]:
/// headers in the driver's buffer, the record by reference.
#[derive(Debug)]
pub enum FrameParts<'a, R> {
    /// Send `header_len` bytes of the header buffer, then the record bytes
    /// `payload` names (attached or copied), then `pad` zero bytes (the
    /// Ethernet minimum).
    Segment {
        /// Ethernet, IPv4 and TCP headers at the start of the buffer.
        header_len: usize,
        /// The record and the range of it this segment carries.
        payload: Option<(&'a R, Range<usize>)>,
        /// Whole records after it ([`crate::tcp::Segment::more`]). A
        /// train, for the port to cut into segments of one record each:
        /// the headers describe the whole train, the checksum is always
        /// left to the device, and `pad` is zero. A pack
        /// ([`Train::is_pack`]): the records follow the first in this one
        /// segment, summed like it.
        more: Option<Train<'a, R>>,
        /// Zero bytes after the payload.
        pad: usize,
        /// The checksum field holds the pseudo-header sum for the device
        /// to complete (the driver's closure returned `None`).
        checksum_offloaded: bool,
    },
    /// The segment did not become a frame here: it was held while its
    /// next hop is resolved, or dropped as larger than the MTU or the
    /// header buffer (counted). Call again.
    Consumed,
}

impl<B: AsRef<[u8]>, R: Record> Interface<B, R> {
    /// An interface and its TCP stack.
    pub fn new(mut config: InterfaceConfig) -> Interface<B, R> {
        let max_mss = u16::try_from(config.mtu.saturating_sub(40)).unwrap_or(u16::MAX);
        config.tcp.mss = config.tcp.mss.min(max_mss);
        let stack = Stack::new(config.tcp.clone(), config.key, config.max_connections);
        Interface {
            config,
            stack,
            arp_cache: Vec::with_capacity(ARP_CACHE_SIZE),
            pending: Vec::with_capacity(ARP_PENDING),
            held: VecDeque::with_capacity(ARP_HOLD),
            spare: Vec::with_capacity(ARP_HOLD),
            slow: VecDeque::with_capacity(SLOW_QUEUE),
            ident: 0,
            stats: IfaceStats::default(),
            pending_hold: None,
            hold_scratch: Vec::new(),
        }
    }

    /// The configuration (with the MSS as clamped to the MTU).
    pub fn config(&self) -> &InterfaceConfig {
        &self.config
    }

    /// Our IPv4 address.
    pub fn ip(&self) -> Ipv4Addr {
        self.config.ip
    }

    /// Our MAC address.
    pub fn mac(&self) -> EthernetAddress {
        self.config.mac
    }

    /// The TCP stack.
    pub fn stack(&self) -> &Stack<B, R> {
        &self.stack
    }

    /// The TCP stack, to listen, connect, accept and use connections.
    pub fn stack_mut(&mut self) -> &mut Stack<B, R> {
        &mut self.stack
    }

    /// Counters.
    pub fn stats(&self) -> &IfaceStats {
        &self.stats
    }

    /// Adds a permanent ARP entry (simulations, static neighbours).
    pub fn add_static_arp(&mut self, ip: Ipv4Addr, mac: EthernetAddress) {
        self.learn(Instant::ZERO, ip, mac, true, true);
    }

    /// The MAC address cached for `ip`.
    pub fn arp_lookup(&self, ip: Ipv4Addr) -> Option<EthernetAddress> {
        self.arp_cache.iter().find(|e| e.ip == ip).map(|e| e.mac)
    }

    fn drop_frame(&mut self, e: WireError) {
        self.stats.drops[reason_index(e)] += 1;
    }

    /// Records `ip → mac`. An existing entry is always updated (RFC 826's
    /// merge); a new one is added only when `create` (the packet was for
    /// us) or when we are resolving `ip`, replacing the oldest dynamic
    /// entry when full. Frames held for `ip` are released.
    fn learn(&mut self, now: Instant, ip: Ipv4Addr, mac: EthernetAddress, create: bool, st: bool) {
        if ip.is_unspecified() || !mac.is_unicast() {
            return;
        }
        let create = create || self.pending.iter().any(|p| p.ip == ip);
        if let Some(e) = self.arp_cache.iter_mut().find(|e| e.ip == ip) {
            if !e.is_static || st {
                // Confirmed: a refresh under way ends.
                e.mac = mac;
                e.learned = now;
                e.is_static |= st;
                e.probes = 0;
            }
            let mac = e.mac;
            self.resolved(ip, mac);
            return;
        }
        if !create {
            return;
        }
        self.resolved(ip, mac);
        let entry = ArpEntry {
            ip,
            mac,
            learned: now,
            is_static: st,
            probes: 0,
            probe_at: now,
        };
        if self.arp_cache.len() < ARP_CACHE_SIZE {
            self.arp_cache.push(entry);
        } else if let Some(oldest) = self
            .arp_cache
            .iter_mut()
            .filter(|e| !e.is_static)
            .min_by_key(|e| e.learned)
        {
            *oldest = entry;
        }
    }

    /// `ip` is at `mac`: its resolution ends and the frames held for it
    /// may go.
    fn resolved(&mut self, ip: Ipv4Addr, mac: EthernetAddress) {
        self.pending.retain(|p| p.ip != ip);
        for h in self.held.iter_mut().filter(|h| h.ip == ip) {
            h.mac = Some(mac);
        }
    }

    /// Keeps a copy of `frame`, bound for `ip` whose MAC address is
    /// unknown, and starts or continues its resolution.
    fn hold(&mut self, now: Instant, ip: Ipv4Addr, frame: &[u8]) {
        if !self.resolve(now, ip) {
            // No room to resolve another address now.
            self.stats.arp_miss_drops += 1;
            return;
        }
        let waiting = self.held.iter().filter(|h| h.ip == ip).count();
        if waiting >= ARP_HOLD_PER_ADDR {
            // The oldest gives way: a newer segment carries later state.
            if let Some(i) = self.held.iter().position(|h| h.ip == ip) {
                self.release(i);
            }
            self.stats.arp_miss_drops += 1;
        } else if self.held.len() >= ARP_HOLD {
            self.stats.arp_miss_drops += 1;
            return;
        }
        // Buffers are allocated only until ARP_HOLD exist, then reused.
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        self.held.push_back(HeldFrame {
            ip,
            mac: None,
            frame: buf,
        });
        self.stats.arp_held += 1;
    }

    /// Stops holding frame `i`, keeping its buffer for reuse.
    fn release(&mut self, i: usize) {
        if let Some(h) = self.held.remove(i) {
            self.spare.push(h.frame);
        }
    }

    /// Drops the frames held for addresses whose last request went
    /// unanswered for [`ARP_RETRY`].
    fn expire_held(&mut self, now: Instant) {
        let mut i = 0;
        while let Some(h) = self.held.get(i) {
            let failed = h.mac.is_none()
                && self
                    .pending
                    .iter()
                    .any(|p| p.ip == h.ip && p.tries >= ARP_MAX_TRIES && p.next <= now);
            if failed {
                self.release(i);
                self.stats.arp_miss_drops += 1;
            } else {
                i += 1;
            }
        }
    }

    /// Writes the oldest held frame whose address is now resolved into
    /// `buf`; its length, or `None` if none is ready.
    fn emit_held(&mut self, buf: &mut [u8]) -> Option<usize> {
        while let Some(i) = self.held.iter().position(|h| h.mac.is_some()) {
            let h = &self.held[i];
            let n = h.frame.len();
            let fits = n <= buf.len();
            if fits {
                buf[..n].copy_from_slice(&h.frame);
                if let Some(mac) = h.mac {
                    EthernetFrame::new_unchecked(&mut buf[..n]).set_dst_addr(mac);
                }
            }
            self.release(i);
            if fits {
                self.stats.tcp_out += 1;
                self.stats.tx_frames += 1;
                return Some(n);
            }
            self.stats.tx_too_large += 1;
        }
        None
    }

    fn queue_slow(&mut self, f: SlowFrame) {
        push_slow(&mut self.slow, &mut self.stats, f);
    }

    /// Processes one received frame (without FCS), verifying its
    /// checksums in software.
    pub fn handle_frame(&mut self, now: Instant, frame: B) {
        self.handle_frame_with(now, frame, RxChecksum::VERIFY);
    }

    /// Processes one received frame (without FCS) whose checksums the
    /// device may have checked already: a checksum it found good is not
    /// summed again, and a frame it found a bad checksum in is dropped
    /// before parsing. Pass [`DeviceCksum::Good`] only on the device's
    /// positive word (DPDK's `RX_*_CKSUM_GOOD`), never for "not checked".
    pub fn handle_frame_with(&mut self, now: Instant, frame: B, cksum: RxChecksum) {
        self.stats.rx_frames += 1;
        if cksum.any_bad() {
            self.stats.rx_cksum_device_bad += 1;
            self.drop_frame(WireError::BadChecksum);
            return;
        }
        if cksum.any_good() {
            self.stats.rx_cksum_trusted += 1;
        }
        match self.classify(now, frame.as_ref(), cksum) {
            Err(e) => self.drop_frame(e),
            Ok(None) => {}
            Ok(Some(tcp)) => {
                self.stats.tcp_in += 1;
                let payload = if tcp.payload.is_empty() {
                    None
                } else {
                    Payload::new(frame, tcp.payload)
                };
                self.stack
                    .handle_segment(now, tcp.src, self.config.ip, &tcp.repr, payload);
            }
        }
    }

    /// Parses a frame and handles everything but TCP, which it returns
    /// (the frame is still borrowed here).
    fn classify(
        &mut self,
        now: Instant,
        frame: &[u8],
        cksum: RxChecksum,
    ) -> Result<Option<TcpIn>, WireError> {
        let eth_frame = EthernetFrame::new_checked(frame)?;
        let eth = EthernetRepr::parse(&eth_frame)?;
        if eth.dst_addr != self.config.mac && !eth.dst_addr.is_broadcast() {
            self.stats.not_for_us += 1;
            return Ok(None);
        }
        if eth.vlan.is_some() {
            self.stats.vlan_drops += 1;
            return Ok(None);
        }
        let eth_hl = eth.header_len();
        match eth.ethertype {
            EtherType::Arp => {
                let repr = ArpRepr::parse(&ArpPacket::new_checked(eth_frame.payload())?)?;
                self.stats.arp_in += 1;
                self.handle_arp(now, eth.src_addr, repr);
                Ok(None)
            }
            EtherType::Ipv4 => {
                let ip_packet = Ipv4Packet::new_checked(eth_frame.payload())?;
                let ip = Ipv4Repr::parse(&ip_packet, cksum.ip.parse_mode())?;
                if ip.dst_addr != self.config.ip || !eth.dst_addr.is_unicast() {
                    self.stats.not_for_us += 1;
                    return Ok(None);
                }
                let ip_hl = ip_packet.header_len();
                match ip.next_header {
                    IpProtocol::Icmp => {
                        let p = Icmpv4Packet::new_checked(ip_packet.payload())?;
                        let repr = Icmpv4Repr::parse(&p, Checksum::Verify)?;
                        self.stats.icmp_in += 1;
                        if let Icmpv4Repr::EchoRequest { ident, seq_no, .. } = repr {
                            // The slow path: the data is copied.
                            self.queue_slow(SlowFrame::EchoReply {
                                dst_mac: eth.src_addr,
                                dst_ip: ip.src_addr,
                                ident,
                                seq_no,
                                data: p.data().to_vec(),
                            });
                        }
                        Ok(None)
                    }
                    IpProtocol::Tcp => {
                        let p = TcpPacket::new_checked(ip_packet.payload())?;
                        let repr = TcpRepr::parse_with(
                            &p,
                            ip.src_addr,
                            ip.dst_addr,
                            cksum.l4.parse_mode(),
                            self.config.sum,
                        )?;
                        let start = eth_hl + ip_hl + p.header_len();
                        let end = eth_hl + ip_hl + ip.payload_len;
                        Ok(Some(TcpIn {
                            src: ip.src_addr,
                            repr,
                            payload: start..end,
                        }))
                    }
                    _ => Err(WireError::Unsupported),
                }
            }
            _ => Err(WireError::Unsupported),
        }
    }

    fn handle_arp(&mut self, now: Instant, from: EthernetAddress, repr: ArpRepr) {
        let ArpRepr::EthernetIpv4 {
            operation,
            source_hardware_addr,
            source_protocol_addr,
            target_protocol_addr,
            ..
        } = repr;
        let for_us = target_protocol_addr == self.config.ip;
        self.learn(
            now,
            source_protocol_addr,
            source_hardware_addr,
            for_us,
            false,
        );
        if operation == ArpOperation::Request && for_us {
            self.queue_slow(SlowFrame::Arp {
                dst_mac: from,
                repr: ArpRepr::EthernetIpv4 {
                    operation: ArpOperation::Reply,
                    source_hardware_addr: self.config.mac,
                    source_protocol_addr: self.config.ip,
                    target_hardware_addr: source_hardware_addr,
                    target_protocol_addr: source_protocol_addr,
                },
            });
        }
    }

    /// Queues an ARP request for `ip` unless one went out less than
    /// [`ARP_RETRY`] ago. Returns whether `ip` is being resolved (false
    /// when [`ARP_PENDING`] other addresses are).
    fn resolve(&mut self, now: Instant, ip: Ipv4Addr) -> bool {
        let room = self.pending.len() < ARP_PENDING;
        let due = match self.pending.iter_mut().find(|p| p.ip == ip) {
            Some(p) if now < p.next => false,
            Some(p) => {
                // Traffic asks again: a fresh round of tries.
                p.tries = p.tries.min(ARP_MAX_TRIES - 1) + 1;
                p.next = now + ARP_RETRY;
                true
            }
            None if room => {
                self.pending.push(Pending {
                    ip,
                    next: now + ARP_RETRY,
                    tries: 1,
                });
                true
            }
            None => false,
        };
        if due {
            self.queue_arp_request(ip);
        }
        self.pending.iter().any(|p| p.ip == ip)
    }

    fn queue_arp_request(&mut self, ip: Ipv4Addr) {
        let f = SlowFrame::request(&self.config, EthernetAddress::BROADCAST, ip);
        self.queue_slow(f);
    }

    /// When `handle_timeout` must next be called: the stack's timers, ARP
    /// retries, the end of resolutions that frames wait for, and the
    /// refresh and removal times of learned entries.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let pending = self
            .pending
            .iter()
            .filter(|p| {
                p.tries < ARP_MAX_TRIES || self.held.iter().any(|h| h.ip == p.ip && h.mac.is_none())
            })
            .map(|p| p.next)
            .min();
        let aging = self.arp_cache.iter().filter_map(ArpEntry::deadline).min();
        [self.stack.poll_timeout(), pending, aging]
            .into_iter()
            .flatten()
            .min()
    }

    /// Moves the refreshes of aged entries on: a request again, or, after
    /// the last went unanswered, the entry's removal; and removes entries
    /// unused for [`ARP_FORGET`].
    fn age_arp(&mut self, now: Instant) {
        let mut i = 0;
        while let Some(e) = self.arp_cache.get_mut(i) {
            if e.deadline().map_or(true, |t| t > now) {
                i += 1;
            } else if (1..ARP_MAX_TRIES).contains(&e.probes) {
                e.probes += 1;
                e.probe_at = now + ARP_RETRY;
                let f = SlowFrame::request(&self.config, e.mac, e.ip);
                if push_slow(&mut self.slow, &mut self.stats, f) {
                    self.stats.arp_refreshes += 1;
                }
                i += 1;
            } else {
                // The refresh went unanswered, or the entry went unused:
                // gone. The order of the cache does not matter.
                self.arp_cache.swap_remove(i);
                self.stats.arp_expired += 1;
            }
        }
    }

    /// Runs the stack's timers, retries ARP requests that are due, drops
    /// the frames held for addresses that did not answer, and ages the
    /// ARP cache.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.stack.handle_timeout(now);
        self.expire_held(now);
        self.age_arp(now);
        let mut due = [Ipv4Addr::UNSPECIFIED; ARP_PENDING];
        let mut n = 0;
        for p in &mut self.pending {
            if p.tries < ARP_MAX_TRIES && p.next <= now {
                p.tries += 1;
                p.next = now + ARP_RETRY;
                due[n] = p.ip;
                n += 1;
            }
        }
        for &ip in &due[..n] {
            self.queue_arp_request(ip);
        }
    }

    fn next_ident(&mut self) -> u16 {
        self.ident = self.ident.wrapping_add(1);
        self.ident
    }

    /// Writes the next outgoing frame into `buf` and returns its length:
    /// ARP and ICMP first, then frames held for an address just resolved,
    /// then TCP segments. A segment whose frame would exceed the MTU or
    /// `buf` is dropped and counted; one to an address not yet resolved is
    /// held (see the module documentation) and the next one is tried.
    pub fn poll_frame(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize>
    where
        R: RecordBytes,
    {
        loop {
            if let Some(f) = self.slow.pop_front() {
                match self.emit_slow(f, buf) {
                    Some(n) => {
                        self.stats.tx_frames += 1;
                        return Some(n);
                    }
                    None => {
                        self.stats.tx_too_large += 1;
                        continue;
                    }
                }
            }
            if let Some(n) = self.emit_held(buf) {
                return Some(n);
            }
            let ident = self.ident.wrapping_add(1);
            let (tuple, seg) = self.stack.poll_transmit(now)?;
            let dst_mac = next_hop(
                &self.config,
                &mut self.arp_cache,
                &mut self.slow,
                &mut self.stats,
                now,
                *tuple.remote.ip(),
            );
            let frame = TcpFrame::new(self.config.mac, dst_mac, &tuple, &seg, ident);
            let len = frame.len();
            if frame.ip.buffer_len() > self.config.mtu || len.max(MIN_FRAME) > buf.len() {
                self.stats.tx_too_large += 1;
                continue;
            }
            frame.emit_whole(&seg, buf, |r, at, dst| r.copy_to(at, dst));
            buf[len..len.max(MIN_FRAME)].fill(0);
            self.ident = ident;
            if frame.dst_mac.is_none() {
                self.hold(now, frame.ip.dst_addr, &buf[..len.max(MIN_FRAME)]);
                continue;
            }
            self.stats.tcp_out += 1;
            self.stats.tx_frames += 1;
            return Some(len.max(MIN_FRAME));
        }
    }

    /// The slow path of a driver that sends TCP segments in parts: writes
    /// the next ARP, ICMP or held frame (a held frame whose address was
    /// just resolved) into `buf` and returns its length; `None` when there
    /// is none. Drain it before [`Interface::poll_frame_parts`].
    pub fn poll_slow_frame(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.flush_pending_hold(now);
        while let Some(f) = self.slow.pop_front() {
            if let Some(n) = self.emit_slow(f, buf) {
                self.stats.tx_frames += 1;
                return Some(n);
            }
            self.stats.tx_too_large += 1;
        }
        self.emit_held(buf)
    }

    /// The zero-copy transmit path: the next TCP segment with its
    /// Ethernet, IPv4 and TCP headers written into `hdr` (54 to 134 bytes)
    /// and its record handed out by reference, so that the driver attaches
    /// the payload from registered memory instead of copying it.
    ///
    /// The TCP checksum covers the payload, which is not at hand here:
    /// `payload_sum(record, range, header_len)` returns the Internet
    /// checksum's partial sum of the record bytes in the range (see
    /// [`crate::wire::checksum`]), or `None` when the device computes the
    /// checksum, in which case the field holds the pseudo-header sum as
    /// devices with transmit checksum offload expect. The last argument is
    /// where the bytes start in the frame (for the first record, the
    /// length the headers will have): a driver that copies the payload into its frame can do so
    /// right there, summing the bytes as it copies them, and write the
    /// headers in front afterwards. It is called once per record of the
    /// segment, in order (a pack has several, [`Segment::more`]; a
    /// train's are never summed: the port computes each checksum), and
    /// only for a segment that is then returned as
    /// [`FrameParts::Segment`]. A segment whose next hop is not resolved is built whole
    /// (its record bytes written by `copy(record, offset, dst)`) and held
    /// as [`Interface::poll_frame`] holds it.
    pub fn poll_frame_parts<F, C>(
        &mut self,
        now: Instant,
        hdr: &mut [u8],
        mut payload_sum: F,
        copy: C,
    ) -> Option<FrameParts<'_, R>>
    where
        F: FnMut(&R, Range<usize>, usize) -> Option<u32>,
        C: FnMut(&R, usize, &mut [u8]),
    {
        self.flush_pending_hold(now);
        let ident = self.ident.wrapping_add(1);
        let (tuple, seg) = self.stack.poll_transmit(now)?;
        let dst_mac = next_hop(
            &self.config,
            &mut self.arp_cache,
            &mut self.slow,
            &mut self.stats,
            now,
            *tuple.remote.ip(),
        );
        let frame = TcpFrame::new(self.config.mac, dst_mac, &tuple, &seg, ident);
        let ip = frame.ip;
        let tcp_hl = seg.repr.header_len();
        let payload_len = seg.payload_len();
        let tcp_at = frame.tcp_at();
        let header_len = tcp_at + tcp_hl;
        let frame_len = frame.len();
        // A train's segments are each a record long; the whole of it must
        // fit the IPv4 length field.
        let train = seg.more.as_ref().filter(|t| !t.is_pack());
        let cut_len = match train {
            Some(t) => ip.header_len() + tcp_hl + t.seg_len(),
            None => ip.buffer_len(),
        };
        if cut_len > self.config.mtu || ip.buffer_len() > 0xffff || header_len > hdr.len() {
            self.stats.tx_too_large += 1;
            return Some(FrameParts::Consumed);
        }
        // The port numbers the segments it cuts one after another.
        let cuts = train.map_or(0, |t| t.count() as u16);
        let is_train = train.is_some();
        self.ident = ident.wrapping_add(cuts);
        frame.emit_headers(hdr);
        if frame.dst_mac.is_none() && is_train {
            // A train cannot wait whole for an address (it is larger than
            // the MTU). Its records are not acknowledged and go again
            // one per segment; new data only follows an exchange with the
            // peer, so its address is known by then.
            self.stats.tx_too_large += 1;
            return Some(FrameParts::Consumed);
        }
        if frame.dst_mac.is_none() {
            // The slow path: the whole frame, record copied, waits for the
            // address in the hold queue (on the next call).
            let buf = &mut self.hold_scratch;
            buf.clear();
            buf.resize(frame_len.max(MIN_FRAME), 0);
            frame.emit_whole(&seg, buf, copy);
            self.pending_hold = Some(ip.dst_addr);
            return Some(FrameParts::Consumed);
        }
        let sum = match &seg.payload {
            Some(_) if is_train => None,
            Some((record, range)) => {
                let first = payload_sum(record, range.clone(), header_len);
                // A pack's records follow the first in the frame, each
                // summed where it lands.
                let mut at = range.len();
                let rest = seg.more.iter().flat_map(|t| t.records());
                rest.fold(first, |acc, r| {
                    let s = payload_sum(r, 0..r.len(), header_len + at);
                    let acc = acc
                        .zip(s)
                        .map(|(a, s)| crate::wire::checksum::combine_at(a, s, at));
                    at += r.len();
                    acc
                })
            }
            None => Some(0),
        };
        let head = &mut hdr[tcp_at..header_len];
        seg.repr.emit_with_payload_sum(
            head,
            ip.src_addr,
            ip.dst_addr,
            payload_len,
            sum.unwrap_or(0),
        );
        if sum.is_none() {
            let pseudo = crate::wire::checksum::pseudo_header(
                ip.src_addr,
                ip.dst_addr,
                6,
                tcp_hl + payload_len,
            );
            TcpPacket::new_unchecked(head).set_checksum(crate::wire::checksum::fold(pseudo));
        }
        self.stats.tcp_out += 1;
        self.stats.tx_frames += 1;
        Some(FrameParts::Segment {
            header_len,
            pad: if is_train {
                0
            } else {
                MIN_FRAME.saturating_sub(frame_len)
            },
            payload: seg.payload,
            more: seg.more,
            checksum_offloaded: sum.is_none(),
        })
    }

    /// Moves the frame [`Interface::poll_frame_parts`] built for an
    /// unresolved address into the hold queue.
    fn flush_pending_hold(&mut self, now: Instant) {
        if let Some(ip) = self.pending_hold.take() {
            let frame = core::mem::take(&mut self.hold_scratch);
            self.hold(now, ip, &frame);
            self.hold_scratch = frame;
        }
    }

    /// Builds a slow-path frame; `None` if `buf` is too small.
    fn emit_slow(&mut self, f: SlowFrame, buf: &mut [u8]) -> Option<usize> {
        let (dst_mac, ethertype) = match &f {
            SlowFrame::Arp { dst_mac, .. } => (*dst_mac, EtherType::Arp),
            SlowFrame::EchoReply { dst_mac, .. } => (*dst_mac, EtherType::Ipv4),
        };
        let eth = EthernetRepr {
            src_addr: self.config.mac,
            dst_addr: dst_mac,
            ethertype,
            vlan: None,
        };
        let hl = eth.header_len();
        let len = match &f {
            SlowFrame::Arp { repr, .. } => hl + repr.buffer_len(),
            SlowFrame::EchoReply { data, .. } => hl + 20 + 8 + data.len(),
        };
        if len.max(MIN_FRAME) > buf.len() || len - hl > self.config.mtu {
            return None;
        }
        eth.emit(buf);
        match f {
            SlowFrame::Arp { repr, .. } => {
                repr.emit(&mut buf[hl..]);
                self.stats.arp_out += 1;
            }
            SlowFrame::EchoReply {
                dst_ip,
                ident,
                seq_no,
                data,
                ..
            } => {
                let icmp = Icmpv4Repr::EchoReply {
                    ident,
                    seq_no,
                    data_len: data.len(),
                };
                let ip = Ipv4Repr {
                    src_addr: self.config.ip,
                    dst_addr: dst_ip,
                    next_header: IpProtocol::Icmp,
                    payload_len: icmp.buffer_len(),
                    hop_limit: TTL,
                    tos: 0,
                    ident: self.next_ident(),
                    dont_frag: true,
                };
                ip.emit(&mut buf[hl..]);
                let at = hl + ip.header_len();
                let (head, rest) = buf[at..len].split_at_mut(icmp.header_len());
                rest.copy_from_slice(&data);
                icmp.emit(head, rest);
                self.stats.icmp_out += 1;
            }
        }
        buf[len..len.max(MIN_FRAME)].fill(0);
        Some(len.max(MIN_FRAME))
    }
}

/// The headers of segment `k` of a train ([`FrameParts::Segment`] with
/// `more`), as the port cuts it: `train` holds the train's Ethernet, IPv4
/// and TCP headers, and the segment carries `len` payload bytes from
/// `offset` of the train's payload. Written into `dst` (as long as
/// `train`): the IPv4 length, identifier and checksum, the sequence
/// number, PSH and FIN on the last segment only, and the TCP checksum
/// field holding the pseudo-header sum for the device to complete. For
/// whoever must show or check what the port puts on the wire (a capture,
/// a test).
pub fn cut_header(train: &[u8], k: usize, offset: usize, len: usize, last: bool, dst: &mut [u8]) {
    let n = train.len().min(dst.len());
    dst[..n].copy_from_slice(&train[..n]);
    if n < 14 + 20 {
        return;
    }
    let ihl = usize::from(dst[14] & 0x0f) * 4;
    let tcp_at = 14 + ihl;
    if n < tcp_at + 20 {
        return;
    }
    let tcp_len = n - tcp_at + len;
    // Every field is read from `train`, none back from `dst`: a load of
    // bytes just stored there would wait for the stores to complete.
    let ip_train = Ipv4Packet::new_unchecked(&train[14..tcp_at]);
    let total_len = (ihl + tcp_len) as u16;
    let ident = ip_train.ident().wrapping_add(k as u16);
    // The header's sum with the train's length, identifier and checksum
    // taken out (adding a 16-bit word's complement subtracts it) and this
    // segment's length and identifier put in.
    let out = [ip_train.total_len(), ip_train.ident(), ip_train.checksum()]
        .iter()
        .map(|&w| u64::from(!w))
        .sum::<u64>();
    let sum = u64::from(checksum::sum(&train[14..tcp_at]))
        + out
        + u64::from(total_len)
        + u64::from(ident);
    let (src, dst_ip) = (ip_train.src_addr(), ip_train.dst_addr());
    let mut ip = Ipv4Packet::new_unchecked(&mut dst[14..tcp_at]);
    ip.set_total_len(total_len);
    ip.set_ident(ident);
    ip.set_checksum(!checksum::fold64(sum));
    let t_train = TcpPacket::new_unchecked(&train[tcp_at..n]);
    let (seq, flags) = (t_train.seq_number(), t_train.flags());
    let mut t = TcpPacket::new_unchecked(&mut dst[tcp_at..n]);
    t.set_seq_number(seq + offset);
    if !last {
        t.set_flags(crate::wire::TcpFlags(
            flags.0 & !(crate::wire::TcpFlags::PSH.0 | crate::wire::TcpFlags::FIN.0),
        ));
    }
    let pseudo = checksum::pseudo_header(src, dst_ip, 6, tcp_len);
    t.set_checksum(checksum::fold(pseudo));
}

/// The Ethernet and IPv4 headers of an outgoing TCP segment, built alike
/// by [`Interface::poll_frame`] and [`Interface::poll_frame_parts`].
#[derive(Debug)]
struct TcpFrame {
    /// `None` while the next hop is unresolved: the frame is then held,
    /// and its destination filled in when it is released.
    dst_mac: Option<EthernetAddress>,
    eth: EthernetRepr,
    ip: Ipv4Repr,
}

impl TcpFrame {
    fn new<R: Record>(
        src_mac: EthernetAddress,
        dst_mac: Option<EthernetAddress>,
        tuple: &FourTuple,
        seg: &Segment<'_, R>,
        ident: u16,
    ) -> TcpFrame {
        let dst_ip = *tuple.remote.ip();
        TcpFrame {
            dst_mac,
            eth: EthernetRepr {
                src_addr: src_mac,
                dst_addr: dst_mac.unwrap_or(EthernetAddress([0; 6])),
                ethertype: EtherType::Ipv4,
                vlan: None,
            },
            ip: Ipv4Repr {
                src_addr: *tuple.local.ip(),
                dst_addr: dst_ip,
                next_header: IpProtocol::Tcp,
                payload_len: seg.repr.header_len() + seg.payload_len(),
                hop_limit: TTL,
                tos: 0,
                ident,
                dont_frag: true,
            },
        }
    }

    /// Where the TCP header starts.
    fn tcp_at(&self) -> usize {
        self.eth.header_len() + self.ip.header_len()
    }

    /// The frame's length before any padding to the Ethernet minimum.
    fn len(&self) -> usize {
        self.eth.header_len() + self.ip.buffer_len()
    }

    /// Writes the Ethernet and IPv4 headers at the start of `buf`, which
    /// holds at least [`TcpFrame::tcp_at`] bytes.
    fn emit_headers(&self, buf: &mut [u8]) {
        self.eth.emit(buf);
        self.ip.emit(&mut buf[self.eth.header_len()..]);
    }

    /// Writes the whole frame, record copied by `copy(record, offset,
    /// dst)`, into the first [`TcpFrame::len`] bytes of `buf`.
    fn emit_whole<R: Record>(
        &self,
        seg: &Segment<'_, R>,
        buf: &mut [u8],
        mut copy: impl FnMut(&R, usize, &mut [u8]),
    ) {
        self.emit_headers(buf);
        let (head, rest) = buf[self.tcp_at()..self.len()].split_at_mut(seg.repr.header_len());
        if let Some((record, range)) = &seg.payload {
            let (first, mut tail) = rest.split_at_mut(range.len().min(rest.len()));
            copy(record, range.start, first);
            // A pack's records follow (a train is never built whole).
            for r in seg.more.iter().flat_map(|t| t.records()) {
                let (this, next) = tail.split_at_mut(r.len().min(tail.len()));
                copy(r, 0, this);
                tail = next;
            }
        }
        seg.repr
            .emit(head, self.ip.src_addr, self.ip.dst_addr, rest);
    }
}

/// A received TCP segment, parsed, whose payload is `payload` of the frame.
#[derive(Debug)]
struct TcpIn {
    src: Ipv4Addr,
    repr: TcpRepr,
    payload: core::ops::Range<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seq::SeqNumber;
    use crate::tcp::{ConnId, Event};
    use crate::wire::{TcpFlags, TcpOptions};
    use core::net::SocketAddrV4;

    type Iface = Interface<Vec<u8>, Vec<u8>>;

    const MAC_A: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0a]);
    const MAC_B: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0b]);
    const IP_A: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
    const IP_B: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);

    fn iface(mac: EthernetAddress, ip: Ipv4Addr) -> Iface {
        Interface::new(InterfaceConfig::new(mac, ip, [3; 16]))
    }

    fn eth(src: EthernetAddress, dst: EthernetAddress, ty: EtherType, payload: &[u8]) -> Vec<u8> {
        let e = EthernetRepr {
            src_addr: src,
            dst_addr: dst,
            ethertype: ty,
            vlan: None,
        };
        let mut b = vec![0u8; e.buffer_len(payload.len())];
        e.emit(&mut b);
        b[e.header_len()..].copy_from_slice(payload);
        b
    }

    fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: IpProtocol, payload: &[u8]) -> Vec<u8> {
        let r = Ipv4Repr {
            src_addr: src,
            dst_addr: dst,
            next_header: proto,
            payload_len: payload.len(),
            hop_limit: 64,
            tos: 0,
            ident: 7,
            dont_frag: true,
        };
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b);
        b[20..].copy_from_slice(payload);
        b
    }

    fn tcp_frame(repr: &TcpRepr, payload: &[u8]) -> Vec<u8> {
        let mut t = vec![0u8; repr.header_len() + payload.len()];
        let (h, p) = t.split_at_mut(repr.header_len());
        p.copy_from_slice(payload);
        repr.emit(h, IP_B, IP_A, p);
        eth(
            MAC_B,
            MAC_A,
            EtherType::Ipv4,
            &ipv4(IP_B, IP_A, IpProtocol::Tcp, &t),
        )
    }

    fn syn_to(port: u16) -> TcpRepr {
        TcpRepr {
            src_port: 40000,
            dst_port: port,
            seq: SeqNumber(1000),
            ack_number: SeqNumber(0),
            flags: TcpFlags::SYN,
            window: 1000,
            urgent: 0,
            options: TcpOptions {
                mss: Some(1460),
                ..TcpOptions::default()
            },
        }
    }

    fn poll_all(i: &mut Iface, now: Instant) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = [0u8; 2048];
        while let Some(n) = i.poll_frame(now, &mut buf) {
            out.push(buf[..n].to_vec());
        }
        out
    }

    fn arp_of(frame: &[u8]) -> (EthernetRepr, ArpRepr) {
        let f = EthernetFrame::new_checked(frame).unwrap();
        let e = EthernetRepr::parse(&f).unwrap();
        assert_eq!(e.ethertype, EtherType::Arp);
        (
            e,
            ArpRepr::parse(&ArpPacket::new_checked(f.payload()).unwrap()).unwrap(),
        )
    }

    #[test]
    fn arp_request_answered_and_sender_learned() {
        let mut a = iface(MAC_A, IP_A);
        let now = Instant::from_millis(1);
        let req = |target| ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: MAC_B,
            source_protocol_addr: IP_B,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: target,
        };
        // For another host: neither answered nor learned.
        let mut p = [0u8; 28];
        req(Ipv4Addr::new(10, 9, 0, 77)).emit(&mut p);
        a.handle_frame(
            now,
            eth(MAC_B, EthernetAddress::BROADCAST, EtherType::Arp, &p),
        );
        assert!(poll_all(&mut a, now).is_empty());
        assert_eq!(a.arp_lookup(IP_B), None);
        // For us.
        req(IP_A).emit(&mut p);
        a.handle_frame(
            now,
            eth(MAC_B, EthernetAddress::BROADCAST, EtherType::Arp, &p),
        );
        let out = poll_all(&mut a, now);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].len(), MIN_FRAME);
        let (e, r) = arp_of(&out[0]);
        assert_eq!((e.src_addr, e.dst_addr), (MAC_A, MAC_B));
        assert_eq!(
            r,
            ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Reply,
                source_hardware_addr: MAC_A,
                source_protocol_addr: IP_A,
                target_hardware_addr: MAC_B,
                target_protocol_addr: IP_B,
            }
        );
        assert_eq!(a.arp_lookup(IP_B), Some(MAC_B));
        assert_eq!((a.stats().arp_in, a.stats().arp_out), (2, 1));
    }

    #[test]
    fn icmp_echo_answered_with_valid_checksum() {
        let mut a = iface(MAC_A, IP_A);
        let now = Instant::from_millis(1);
        let data: Vec<u8> = (0..100u8).collect();
        let req = Icmpv4Repr::EchoRequest {
            ident: 0x1234,
            seq_no: 9,
            data_len: data.len(),
        };
        let mut m = vec![0u8; req.buffer_len()];
        let (h, d) = m.split_at_mut(8);
        d.copy_from_slice(&data);
        req.emit(h, d);
        a.handle_frame(
            now,
            eth(
                MAC_B,
                MAC_A,
                EtherType::Ipv4,
                &ipv4(IP_B, IP_A, IpProtocol::Icmp, &m),
            ),
        );
        let out = poll_all(&mut a, now);
        assert_eq!(out.len(), 1);
        let f = EthernetFrame::new_checked(&out[0][..]).unwrap();
        assert_eq!(f.dst_addr(), MAC_B);
        let ipp = Ipv4Packet::new_checked(f.payload()).unwrap();
        let ip = Ipv4Repr::parse(&ipp, Checksum::Verify).unwrap();
        assert_eq!((ip.src_addr, ip.dst_addr), (IP_A, IP_B));
        assert!(ip.dont_frag);
        let icmp = Icmpv4Packet::new_checked(ipp.payload()).unwrap();
        let r = Icmpv4Repr::parse(&icmp, Checksum::Verify).unwrap();
        assert_eq!(
            r,
            Icmpv4Repr::EchoReply {
                ident: 0x1234,
                seq_no: 9,
                data_len: 100
            }
        );
        assert_eq!(icmp.data(), &data[..]);
        assert_eq!((a.stats().icmp_in, a.stats().icmp_out), (1, 1));
    }

    #[test]
    fn fragments_bad_checksums_and_strangers_are_counted() {
        let mut a = iface(MAC_A, IP_A);
        let now = Instant::from_millis(1);
        // A first fragment (MF set).
        let mut ip = ipv4(IP_B, IP_A, IpProtocol::Tcp, &[0u8; 40]);
        {
            let mut p = Ipv4Packet::new_unchecked(&mut ip[..]);
            p.set_frag(false, true, 0);
            p.fill_checksum();
        }
        a.handle_frame(now, eth(MAC_B, MAC_A, EtherType::Ipv4, &ip));
        assert_eq!(a.stats().drops_for(WireError::Fragmented), 1);
        // A bad IPv4 header checksum.
        let mut ip = ipv4(IP_B, IP_A, IpProtocol::Tcp, &[0u8; 40]);
        ip[10] ^= 0x40;
        a.handle_frame(now, eth(MAC_B, MAC_A, EtherType::Ipv4, &ip));
        assert_eq!(a.stats().drops_for(WireError::BadChecksum), 1);
        // A bad TCP checksum: counted, never reaches the stack.
        let mut f = tcp_frame(&syn_to(80), b"data");
        let last = f.len() - 1;
        f[last] ^= 0x01;
        a.handle_frame(now, f);
        assert_eq!(a.stats().drops_for(WireError::BadChecksum), 2);
        assert_eq!(a.stack().stats().segments_in, 0);
        // Truncated frame, another host's MAC, another host's IP, IPv6.
        a.handle_frame(now, vec![0u8; 10]);
        assert_eq!(a.stats().drops_for(WireError::Truncated), 1);
        a.handle_frame(now, eth(MAC_B, MAC_B, EtherType::Ipv4, &ip));
        let other = ipv4(IP_B, Ipv4Addr::new(10, 9, 0, 99), IpProtocol::Tcp, &[0; 20]);
        a.handle_frame(now, eth(MAC_B, MAC_A, EtherType::Ipv4, &other));
        assert_eq!(a.stats().not_for_us, 2);
        a.handle_frame(now, eth(MAC_B, MAC_A, EtherType::Ipv6, &[0u8; 40]));
        assert_eq!(a.stats().drops_for(WireError::Unsupported), 1);
        assert_eq!(a.stats().rx_frames, 7);
        assert!(poll_all(&mut a, now).is_empty());
    }

    /// A SYN whose TCP checksum is wrong (the last payload byte flipped
    /// after it was computed).
    fn syn_with_bad_tcp_checksum(port: u16) -> Vec<u8> {
        let mut f = tcp_frame(&syn_to(port), b"data");
        let last = f.len() - 1;
        f[last] ^= 0x01;
        f
    }

    const L4_GOOD: RxChecksum = RxChecksum {
        ip: DeviceCksum::Unchecked,
        l4: DeviceCksum::Good,
    };

    #[test]
    fn device_good_tcp_checksum_is_trusted() {
        let mut a = iface(MAC_A, IP_A);
        let now = Instant::from_millis(1);
        a.handle_frame_with(now, syn_with_bad_tcp_checksum(80), L4_GOOD);
        assert_eq!(a.stats().drops_for(WireError::BadChecksum), 0);
        assert_eq!(a.stats().tcp_in, 1);
        assert_eq!(a.stats().rx_cksum_trusted, 1);
        assert_eq!(a.stack().stats().segments_in, 1);
        // The same frame with no verdict is verified and dropped.
        a.handle_frame_with(now, syn_with_bad_tcp_checksum(80), RxChecksum::VERIFY);
        assert_eq!(a.stats().drops_for(WireError::BadChecksum), 1);
        assert_eq!(a.stats().tcp_in, 1);
        assert_eq!(a.stack().stats().segments_in, 1);
        assert_eq!(a.stats().rx_cksum_trusted, 1);
        assert_eq!(a.stats().rx_frames, 2);
    }

    #[test]
    fn received_segments_are_summed_by_the_configured_function() {
        // A summing function that is wrong for every input: a segment it
        // verifies is dropped, whatever its bytes, so the interface can
        // only have used it.
        fn off_by_one(b: &[u8]) -> u32 {
            u32::from(crate::wire::checksum::fold(
                crate::wire::checksum::sum(b) + 1,
            ))
        }
        let mut config = InterfaceConfig::new(MAC_A, IP_A, [3; 16]);
        config.sum = off_by_one;
        let mut a: Iface = Interface::new(config);
        let now = Instant::from_millis(1);
        a.handle_frame(now, tcp_frame(&syn_to(80), b"data"));
        assert_eq!(a.stats().drops_for(WireError::BadChecksum), 1);
        assert_eq!(a.stats().tcp_in, 0);
        // The default function passes the same frame.
        let mut b = iface(MAC_A, IP_A);
        b.handle_frame(now, tcp_frame(&syn_to(80), b"data"));
        assert_eq!(b.stats().drops_for(WireError::BadChecksum), 0);
        assert_eq!(b.stats().tcp_in, 1);
    }

    #[test]
    fn device_bad_checksum_drops_before_parsing() {
        let mut a = iface(MAC_A, IP_A);
        let now = Instant::from_millis(1);
        let bad_l4 = RxChecksum {
            ip: DeviceCksum::Good,
            l4: DeviceCksum::Bad,
        };
        // The device's word wins over the bytes: a frame whose checksums
        // are right is still dropped, and so is one the parser would
        // refuse for another reason (truncated), without being parsed.
        a.handle_frame_with(now, tcp_frame(&syn_to(80), b"data"), bad_l4);
        a.handle_frame_with(now, syn_with_bad_tcp_checksum(80), bad_l4);
        a.handle_frame_with(now, vec![0u8; 10], bad_l4);
        let bad_ip = RxChecksum {
            ip: DeviceCksum::Bad,
            l4: DeviceCksum::Unchecked,
        };
        a.handle_frame_with(now, tcp_frame(&syn_to(80), &[]), bad_ip);
        assert_eq!(a.stats().drops_for(WireError::BadChecksum), 4);
        assert_eq!(a.stats().drops_for(WireError::Truncated), 0);
        assert_eq!(a.stats().rx_cksum_device_bad, 4);
        assert_eq!(a.stats().rx_cksum_trusted, 0);
        assert_eq!((a.stats().rx_frames, a.stats().tcp_in), (4, 0));
        assert_eq!(a.stack().stats().segments_in, 0);
        assert!(poll_all(&mut a, now).is_empty());
    }

    #[test]
    fn device_verdicts_apply_to_their_own_layer_only() {
        let mut a = iface(MAC_A, IP_A);
        let now = Instant::from_millis(1);
        // A wrong IPv4 header checksum the device vouched for: accepted,
        // and the TCP checksum (right) is still verified here.
        let mut t = vec![0u8; syn_to(80).header_len()];
        syn_to(80).emit(&mut t, IP_B, IP_A, &[]);
        let mut ip = ipv4(IP_B, IP_A, IpProtocol::Tcp, &t);
        ip[10] ^= 0x40;
        let ip_good = RxChecksum {
            ip: DeviceCksum::Good,
            l4: DeviceCksum::Unchecked,
        };
        a.handle_frame_with(now, eth(MAC_B, MAC_A, EtherType::Ipv4, &ip), ip_good);
        assert_eq!(a.stack().stats().segments_in, 1);
        // The IP header vouched for does not cover a wrong TCP checksum.
        a.handle_frame_with(now, syn_with_bad_tcp_checksum(81), ip_good);
        assert_eq!(a.stats().drops_for(WireError::BadChecksum), 1);
        // A good TCP verdict does not cover a wrong IPv4 header checksum.
        a.handle_frame_with(now, eth(MAC_B, MAC_A, EtherType::Ipv4, &ip), L4_GOOD);
        assert_eq!(a.stats().drops_for(WireError::BadChecksum), 2);
        // Nor an ICMP checksum: devices report on TCP and UDP only.
        let mut echo = [0u8; 8];
        echo[0] = 8;
        echo[2] = 0x12;
        let icmp = ipv4(IP_B, IP_A, IpProtocol::Icmp, &echo);
        a.handle_frame_with(now, eth(MAC_B, MAC_A, EtherType::Ipv4, &icmp), L4_GOOD);
        assert_eq!(a.stats().drops_for(WireError::BadChecksum), 3);
        assert_eq!(a.stats().icmp_in, 0);
        assert_eq!(a.stack().stats().segments_in, 1);
    }

    /// The TCP header of a frame, if it is a valid TCP frame.
    fn tcp_of(frame: &[u8]) -> (EthernetAddress, Ipv4Repr, TcpRepr) {
        let f = EthernetFrame::new_checked(frame).unwrap();
        let ipp = Ipv4Packet::new_checked(f.payload()).unwrap();
        let ip = Ipv4Repr::parse(&ipp, Checksum::Verify).unwrap();
        let tp = TcpPacket::new_checked(ipp.payload()).unwrap();
        let r = TcpRepr::parse(&tp, ip.src_addr, ip.dst_addr, Checksum::Verify).unwrap();
        (f.dst_addr(), ip, r)
    }

    /// An ARP packet from `ip` at `mac`, as a broadcast frame.
    fn arp_from(op: ArpOperation, mac: EthernetAddress, ip: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
        let mut p = [0u8; 28];
        ArpRepr::EthernetIpv4 {
            operation: op,
            source_hardware_addr: mac,
            source_protocol_addr: ip,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: target,
        }
        .emit(&mut p);
        eth(mac, EthernetAddress::BROADCAST, EtherType::Arp, &p)
    }

    #[test]
    fn unresolved_next_hop_holds_frames_until_resolution_fails() {
        let mut a = iface(MAC_A, IP_A);
        let now = Instant::from_millis(1);
        // A SYN to a closed port: the stack answers RST, but B's MAC is
        // unknown, so an ARP request goes out and the RST is held.
        a.handle_frame(now, tcp_frame(&syn_to(80), &[]));
        assert_eq!(a.stack().stats().segments_in, 1);
        assert_eq!(a.stats().tcp_in, 1);
        let out = poll_all(&mut a, now);
        assert_eq!(out.len(), 1);
        let (e, r) = arp_of(&out[0]);
        assert_eq!(e.dst_addr, EthernetAddress::BROADCAST);
        assert!(matches!(
            r,
            ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Request,
                target_protocol_addr: IP_B,
                ..
            }
        ));
        assert_eq!((a.stats().arp_held, a.stats().arp_miss_drops), (1, 0));
        // Rate limited: a second miss within a second sends nothing.
        a.handle_frame(now, tcp_frame(&syn_to(81), &[]));
        assert!(poll_all(&mut a, now).is_empty());
        assert_eq!((a.stats().arp_held, a.stats().arp_miss_drops), (2, 0));
        // Retried by the timer, up to the limit; then the held frames are
        // dropped, one retry interval after the last request.
        let mut t = now;
        let mut requests = 1;
        while let Some(next) = a.poll_timeout() {
            t = next;
            a.handle_timeout(t);
            let out = poll_all(&mut a, t);
            assert!(out.iter().all(|f| arp_of(f).0.dst_addr.is_broadcast()));
            requests += out.len();
        }
        assert_eq!(requests, ARP_MAX_TRIES as usize);
        assert_eq!(t, now + ARP_RETRY * ARP_MAX_TRIES);
        assert_eq!(a.stats().arp_miss_drops, 2);
        assert_eq!(a.stats().tcp_out, 0);
        // Once resolved, a new RST goes out as a proper frame, alone.
        a.add_static_arp(IP_B, MAC_B);
        a.handle_frame(t, tcp_frame(&syn_to(82), b"xyz"));
        let out = poll_all(&mut a, t);
        assert_eq!(out.len(), 1);
        let (dst, ip, r) = tcp_of(&out[0]);
        assert_eq!(dst, MAC_B);
        assert_eq!(ip.hop_limit, TTL);
        assert_eq!(r.flags, TcpFlags::RST | TcpFlags::ACK);
        assert_eq!(r.ack_number, SeqNumber(1000 + 1 + 3));
        assert_eq!((r.src_port, r.dst_port), (82, 40000));
        assert_eq!(a.stats().tcp_out, 1);
    }

    /// The first SYN to a peer whose MAC address is unknown leaves as soon
    /// as the ARP reply arrives, not when the SYN is retransmitted.
    #[test]
    fn first_syn_to_unresolved_peer_leaves_on_arp_reply() {
        let mut a = iface(MAC_A, IP_A);
        let t0 = Instant::from_millis(1);
        let cid = a
            .stack_mut()
            .connect(t0, IP_A, SocketAddrV4::new(IP_B, 7000))
            .unwrap();
        let out = poll_all(&mut a, t0);
        assert_eq!(out.len(), 1, "only the ARP request");
        let (_, r) = arp_of(&out[0]);
        assert!(matches!(
            r,
            ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Request,
                target_protocol_addr: IP_B,
                ..
            }
        ));
        assert_eq!(a.stats().arp_held, 1);
        // The reply, 2 ms later.
        let t1 = t0 + Duration::from_millis(2);
        let mut p = [0u8; 28];
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: MAC_B,
            source_protocol_addr: IP_B,
            target_hardware_addr: MAC_A,
            target_protocol_addr: IP_A,
        }
        .emit(&mut p);
        a.handle_frame(t1, eth(MAC_B, MAC_A, EtherType::Arp, &p));
        let out = poll_all(&mut a, t1);
        assert_eq!(out.len(), 1, "the held SYN");
        let (dst, ip, r) = tcp_of(&out[0]);
        assert_eq!(dst, MAC_B);
        assert_eq!((ip.src_addr, ip.dst_addr), (IP_A, IP_B));
        assert_eq!(r.flags, TcpFlags::SYN);
        assert_eq!(r.dst_port, 7000);
        assert_eq!(r.options.mss, Some(1460));
        let conn = a.stack().conn(cid).unwrap();
        assert_eq!(
            conn.stats().retransmits,
            0,
            "the original SYN, not a retransmission"
        );
        assert_eq!(conn.stats().rto_expirations, 0);
        assert_eq!((a.stats().tcp_out, a.stats().arp_miss_drops), (1, 0));
        assert!(poll_all(&mut a, t1).is_empty());
    }

    const MAC_C: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0c]);

    /// An interface at A that learned B from B's request for
    /// A at `t`; the reply it answered with is sent.
    fn learned_b(t: Instant) -> Iface {
        let mut a = iface(MAC_A, IP_A);
        a.handle_frame(t, arp_from(ArpOperation::Request, MAC_B, IP_B, IP_A));
        assert_eq!(poll_all(&mut a, t).len(), 1, "the reply");
        assert_eq!(a.arp_lookup(IP_B), Some(MAC_B));
        a
    }

    /// B's ARP reply to A, from `mac`.
    fn reply_from_b(mac: EthernetAddress) -> Vec<u8> {
        let mut p = [0u8; 28];
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: mac,
            source_protocol_addr: IP_B,
            target_hardware_addr: MAC_A,
            target_protocol_addr: IP_A,
        }
        .emit(&mut p);
        eth(mac, MAC_A, EtherType::Arp, &p)
    }

    /// B's SYN to closed `port` at `t` and what A sends then: its ARP
    /// packets, and the destination of each TCP frame (the RSTs).
    #[allow(clippy::type_complexity)]
    fn rst_to_b(
        a: &mut Iface,
        t: Instant,
        port: u16,
    ) -> (Vec<(EthernetRepr, ArpRepr)>, Vec<EthernetAddress>) {
        a.handle_frame(t, tcp_frame(&syn_to(port), &[]));
        split(&poll_all(a, t))
    }

    /// Frames as ARP packets and TCP frames' destinations.
    #[allow(clippy::type_complexity)]
    fn split(frames: &[Vec<u8>]) -> (Vec<(EthernetRepr, ArpRepr)>, Vec<EthernetAddress>) {
        let (mut arps, mut tcp) = (Vec::new(), Vec::new());
        for f in frames {
            match EthernetFrame::new_checked(&f[..]).unwrap().ethertype() {
                EtherType::Arp => arps.push(arp_of(f)),
                _ => tcp.push(tcp_of(f).0),
            }
        }
        (arps, tcp)
    }

    /// A's request for B's address, sent to `dst`.
    fn request_for_b(dst: EthernetAddress) -> (EthernetRepr, ArpRepr) {
        (
            EthernetRepr {
                src_addr: MAC_A,
                dst_addr: dst,
                ethertype: EtherType::Arp,
                vlan: None,
            },
            ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Request,
                source_hardware_addr: MAC_A,
                source_protocol_addr: IP_A,
                target_hardware_addr: EthernetAddress([0; 6]),
                target_protocol_addr: IP_B,
            },
        )
    }

    #[test]
    fn fresh_entry_is_used_without_request() {
        let t0 = Instant::from_millis(1);
        let mut a = learned_b(t0);
        assert_eq!(a.poll_timeout(), Some(t0 + ARP_FORGET));
        let t = t0 + ARP_REACHABLE - Duration::from_micros(1);
        a.handle_timeout(t);
        assert_eq!(rst_to_b(&mut a, t, 80), (vec![], vec![MAC_B]));
        assert_eq!(a.poll_timeout(), Some(t0 + ARP_FORGET));
        // Any ARP packet from B confirms the entry, even a request for
        // another host: past the first period, still no request.
        let t1 = t0 + ARP_REACHABLE / 2;
        let other = Ipv4Addr::new(10, 9, 0, 77);
        a.handle_frame(t1, arp_from(ArpOperation::Request, MAC_B, IP_B, other));
        assert!(poll_all(&mut a, t1).is_empty());
        let t = t0 + ARP_REACHABLE + Duration::from_secs(1);
        assert_eq!(rst_to_b(&mut a, t, 81), (vec![], vec![MAC_B]));
        assert_eq!(a.poll_timeout(), Some(t1 + ARP_FORGET));
        assert_eq!((a.stats().arp_refreshes, a.stats().arp_expired), (0, 0));
    }

    #[test]
    fn aged_entry_in_use_is_refreshed_by_unicast_request() {
        let t0 = Instant::from_millis(1);
        let mut a = learned_b(t0);
        // Past the reachable period, frames still go to the cached
        // address at once, and the first of them sends one request, to
        // that address rather than broadcast.
        let t1 = t0 + ARP_REACHABLE;
        a.handle_frame(t1, tcp_frame(&syn_to(80), &[]));
        a.handle_frame(t1, tcp_frame(&syn_to(81), &[]));
        let (arps, tcp) = split(&poll_all(&mut a, t1));
        assert_eq!(tcp, [MAC_B, MAC_B]);
        assert_eq!(arps, [request_for_b(MAC_B)]);
        assert_eq!((a.stats().arp_refreshes, a.stats().arp_held), (1, 0));
        assert_eq!(a.poll_timeout(), Some(t1 + ARP_RETRY));
        // B answers: the entry is confirmed and the refresh ends.
        let t2 = t1 + Duration::from_millis(3);
        a.handle_frame(t2, reply_from_b(MAC_B));
        assert_eq!(a.poll_timeout(), Some(t2 + ARP_FORGET));
        // Nothing follows for longer than the refresh would have taken:
        // no retry, no broadcast, the entry kept.
        let end = t1 + ARP_RETRY * (ARP_MAX_TRIES + 1);
        let mut t = t2;
        while t < end {
            t += Duration::from_millis(100);
            a.handle_timeout(t);
            assert!(poll_all(&mut a, t).is_empty(), "at {t}");
        }
        assert_eq!(a.arp_lookup(IP_B), Some(MAC_B));
        // Traffic within the new period sends no request.
        assert_eq!(rst_to_b(&mut a, end, 82), (vec![], vec![MAC_B]));
        assert_eq!((a.stats().arp_refreshes, a.stats().arp_expired), (1, 0));
    }

    #[test]
    fn unanswered_refresh_removes_entry_and_resolution_starts_over() {
        let t0 = Instant::from_millis(1);
        let mut a = learned_b(t0);
        let t1 = t0 + ARP_REACHABLE + Duration::from_secs(5);
        let (arps, tcp) = rst_to_b(&mut a, t1, 80);
        assert_eq!(tcp, [MAC_B]);
        assert_eq!(arps, [request_for_b(MAC_B)]);
        // Retried by the timer, always to the cached address, up to the
        // limit; the entry goes one retry interval after the last.
        let (mut t, mut requests) = (t1, 1);
        while let Some(next) = a.poll_timeout() {
            t = next;
            a.handle_timeout(t);
            let (arps, tcp) = split(&poll_all(&mut a, t));
            assert!(tcp.is_empty());
            assert!(arps.iter().all(|r| *r == request_for_b(MAC_B)), "{arps:?}");
            requests += arps.len();
        }
        assert_eq!(requests, ARP_MAX_TRIES as usize);
        assert_eq!(t, t1 + ARP_RETRY * ARP_MAX_TRIES);
        assert_eq!(a.arp_lookup(IP_B), None);
        let s = *a.stats();
        assert_eq!(
            (s.arp_refreshes, s.arp_expired),
            (u64::from(ARP_MAX_TRIES), 1)
        );
        // The next frame to B is resolved afresh: a broadcast request,
        // the RST held...
        let (arps, tcp) = rst_to_b(&mut a, t, 81);
        assert!(tcp.is_empty());
        assert_eq!(arps, [request_for_b(EthernetAddress::BROADCAST)]);
        assert_eq!((a.stats().arp_held, a.stats().tcp_out), (1, 1));
        // ...and released by the reply, from B's new address.
        let t2 = t + Duration::from_millis(2);
        a.handle_frame(t2, reply_from_b(MAC_C));
        assert_eq!(split(&poll_all(&mut a, t2)), (vec![], vec![MAC_C]));
        assert_eq!(a.arp_lookup(IP_B), Some(MAC_C));
        assert_eq!((a.stats().tcp_out, a.stats().arp_miss_drops), (2, 0));
    }

    #[test]
    fn unused_entry_is_forgotten() {
        let t0 = Instant::from_millis(1);
        let mut a = learned_b(t0);
        let end = t0 + ARP_FORGET;
        assert_eq!(a.poll_timeout(), Some(end));
        a.handle_timeout(end - Duration::from_micros(1));
        assert_eq!(a.arp_lookup(IP_B), Some(MAC_B));
        a.handle_timeout(end);
        assert_eq!(a.arp_lookup(IP_B), None);
        assert!(poll_all(&mut a, end).is_empty(), "removed without a word");
        assert_eq!(a.poll_timeout(), None);
        assert_eq!((a.stats().arp_refreshes, a.stats().arp_expired), (0, 1));
    }

    #[test]
    fn static_entries_never_age() {
        let mut a = iface(MAC_A, IP_A);
        a.add_static_arp(IP_B, MAC_B);
        assert_eq!(a.poll_timeout(), None);
        let t = Instant::ZERO + ARP_FORGET * 10;
        a.handle_timeout(t);
        assert_eq!(rst_to_b(&mut a, t, 80), (vec![], vec![MAC_B]));
        assert_eq!(a.poll_timeout(), None);
        let t = t + ARP_RETRY * (ARP_MAX_TRIES + 1);
        a.handle_timeout(t);
        assert_eq!(rst_to_b(&mut a, t, 81), (vec![], vec![MAC_B]));
        assert_eq!(a.arp_lookup(IP_B), Some(MAC_B));
        assert_eq!((a.stats().arp_refreshes, a.stats().arp_expired), (0, 0));
        assert_eq!(a.stats().arp_out, 0);
    }

    #[test]
    fn held_frames_are_bounded_per_address_and_in_all() {
        let mut a = iface(MAC_A, IP_A);
        let now = Instant::from_millis(1);
        // Six RSTs for B: the two oldest give way.
        for port in 80..86 {
            a.handle_frame(now, tcp_frame(&syn_to(port), &[]));
        }
        assert_eq!(poll_all(&mut a, now).len(), 1, "one ARP request");
        assert_eq!(a.stats().arp_held, 6);
        assert_eq!(a.stats().arp_miss_drops, 2);
        // Any ARP packet from B resolves it, even one asking for another
        // host: the four newest go, in order.
        a.handle_frame(
            now,
            arp_from(
                ArpOperation::Request,
                MAC_B,
                IP_B,
                Ipv4Addr::new(10, 9, 0, 77),
            ),
        );
        assert_eq!(a.arp_lookup(IP_B), Some(MAC_B));
        let ports: Vec<u16> = poll_all(&mut a, now)
            .iter()
            .map(|f| {
                let (dst, _, r) = tcp_of(f);
                assert_eq!(dst, MAC_B);
                r.src_port
            })
            .collect();
        assert_eq!(ports, [82, 83, 84, 85]);
        // Their buffers wait for reuse; no more were allocated.
        assert!(a.held.is_empty());
        assert_eq!(a.spare.len(), ARP_HOLD_PER_ADDR);

        // In all: ten addresses with four frames each overflow the bound.
        let mut a = iface(MAC_A, IP_A);
        for host in 0..10u8 {
            let src = Ipv4Addr::new(10, 9, 0, 100 + host);
            for port in 0..4 {
                let mut t = vec![0u8; 20 + 4];
                let repr = syn_to(90 + port);
                let (h, p) = t.split_at_mut(repr.header_len());
                repr.emit(h, src, IP_A, p);
                let f = eth(
                    MAC_B,
                    MAC_A,
                    EtherType::Ipv4,
                    &ipv4(src, IP_A, IpProtocol::Tcp, &t),
                );
                a.handle_frame(now, f);
            }
        }
        assert_eq!(poll_all(&mut a, now).len(), 10, "ten ARP requests");
        assert_eq!(a.held.len(), ARP_HOLD);
        assert_eq!(a.stats().arp_held, ARP_HOLD as u64);
        assert_eq!(a.stats().arp_miss_drops, 40 - ARP_HOLD as u64);
        assert!(a.held.len() + a.spare.len() <= ARP_HOLD);
    }

    /// Moves frames between two interfaces until both are quiet, running
    /// timers in virtual time up to `until`.
    fn run(a: &mut Iface, b: &mut Iface, now: &mut Instant, until: Instant) {
        let mut buf = vec![0u8; 2048];
        loop {
            let mut moved = false;
            while let Some(n) = a.poll_frame(*now, &mut buf) {
                b.handle_frame(*now, buf[..n].to_vec());
                moved = true;
            }
            while let Some(n) = b.poll_frame(*now, &mut buf) {
                a.handle_frame(*now, buf[..n].to_vec());
                moved = true;
            }
            if moved {
                continue;
            }
            let next = [a.poll_timeout(), b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= until => {
                    *now = t.max(*now);
                    a.handle_timeout(*now);
                    b.handle_timeout(*now);
                }
                _ => return,
            }
        }
    }

    #[test]
    fn back_to_back_handshake_and_100k_transfer() {
        let mut a = iface(MAC_A, IP_A);
        let mut b = iface(MAC_B, IP_B);
        let mut now = Instant::from_millis(1);
        a.stack_mut()
            .listen(SocketAddrV4::new(IP_A, 7000), 8)
            .unwrap();
        // B resolves A through ARP on its own.
        let cid = b
            .stack_mut()
            .connect(now, IP_B, SocketAddrV4::new(IP_A, 7000))
            .unwrap();
        run(&mut a, &mut b, &mut now, Instant::from_millis(10_000));
        let sid = a.stack_mut().accept(7000).expect("accepted");
        assert!(matches!(
            b.stack_mut().poll_event(cid),
            Some(Event::Connected)
        ));
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 31 + i / 977) as u8).collect();
        let mut sent = 0;
        let mut got = Vec::new();
        let deadline = Instant::from_millis(60_000);
        while got.len() < data.len() && now < deadline {
            loop {
                let conn = b.stack_mut().conn_mut(cid).unwrap();
                let cap = conn.send_capacity().min(data.len() - sent);
                if cap == 0 {
                    break;
                }
                let rec = data[sent..sent + cap].to_vec();
                conn.send_record(now, rec).unwrap();
                sent += cap;
            }
            run(&mut a, &mut b, &mut now, deadline);
            while let Some(p) = a.stack_mut().conn_mut(sid).unwrap().recv() {
                got.extend_from_slice(p.bytes());
            }
            now += Duration::from_millis(1);
            a.handle_timeout(now);
            b.handle_timeout(now);
        }
        assert_eq!(got.len(), data.len());
        assert!(got == data, "byte-exact");
        assert!(a.stats().tcp_in > 60);
        // Each side learned the other through ARP.
        assert_eq!(a.arp_lookup(IP_B), Some(MAC_B));
        assert_eq!(b.arp_lookup(IP_A), Some(MAC_A));
        assert!(b.stats().arp_out >= 1 && a.stats().arp_out >= 1);
        assert_eq!(a.stats().drops, [0; 7]);
    }

    /// How a driver whose records hold their bytes copies them.
    fn copy_vec(r: &Vec<u8>, at: usize, dst: &mut [u8]) {
        r.copy_to(at, dst)
    }

    /// Assembles what `poll_frame_parts` hands out into one frame, the way
    /// a copying driver would; `offload` asks for the device's checksum.
    fn parts_frame(i: &mut Iface, now: Instant, offload: bool) -> Option<Vec<u8>> {
        let mut hdr = [0u8; 160];
        loop {
            let sum = |r: &Vec<u8>, range: core::ops::Range<usize>, _| {
                (!offload).then(|| crate::wire::checksum::sum(&r[range]))
            };
            match i.poll_frame_parts(now, &mut hdr, sum, copy_vec)? {
                FrameParts::Consumed => continue,
                FrameParts::Segment {
                    header_len,
                    payload,
                    pad,
                    checksum_offloaded,
                    ..
                } => {
                    assert_eq!(checksum_offloaded, offload);
                    let mut f = hdr[..header_len].to_vec();
                    if let Some((r, range)) = payload {
                        f.extend_from_slice(&r[range]);
                    }
                    f.resize(f.len() + pad, 0);
                    return Some(f);
                }
            }
        }
    }

    #[test]
    fn frame_parts_assemble_to_the_frame_poll_frame_builds() {
        // Two identical clients (same key, same inputs) against one
        // server: one drives `poll_frame`, the other `poll_frame_parts`.
        let mut whole = iface(MAC_B, IP_B);
        let mut parts = iface(MAC_B, IP_B);
        let mut server = iface(MAC_A, IP_A);
        let now = Instant::from_millis(5);
        for i in [&mut whole, &mut parts] {
            i.add_static_arp(IP_A, MAC_A);
        }
        server.add_static_arp(IP_B, MAC_B);
        server
            .stack_mut()
            .listen(SocketAddrV4::new(IP_A, 7000), 8)
            .unwrap();
        let remote = SocketAddrV4::new(IP_A, 7000);
        let c1 = whole.stack_mut().connect(now, IP_B, remote).unwrap();
        let c2 = parts.stack_mut().connect(now, IP_B, remote).unwrap();
        let syn = poll_all(&mut whole, now);
        assert_eq!(vec![parts_frame(&mut parts, now, false).unwrap()], syn);
        server.handle_frame(now, syn[0].clone());
        let syn_ack = poll_all(&mut server, now);
        whole.handle_frame(now, syn_ack[0].clone());
        parts.handle_frame(now, syn_ack[0].clone());
        let ack = poll_all(&mut whole, now);
        assert_eq!(vec![parts_frame(&mut parts, now, false).unwrap()], ack);
        // Records of an odd length (payload at an odd end) and a short one
        // (padded to the Ethernet minimum).
        for len in [1001usize, 3] {
            let rec: Vec<u8> = (0..len).map(|k| (k * 7 + len) as u8).collect();
            for (i, c) in [(&mut whole, c1), (&mut parts, c2)] {
                i.stack_mut()
                    .conn_mut(c)
                    .unwrap()
                    .send_record(now, rec.clone())
                    .unwrap();
            }
            let w = poll_all(&mut whole, now);
            assert_eq!(w.len(), 1);
            assert_eq!(parts_frame(&mut parts, now, false).unwrap(), w[0]);
            // The frame verifies as the receiver checks it.
            tcp_of(&w[0]);
        }
        // With offload, the field holds the pseudo-header sum.
        let rec = vec![9u8; 40];
        for (i, c) in [(&mut whole, c1), (&mut parts, c2)] {
            i.stack_mut()
                .conn_mut(c)
                .unwrap()
                .send_record(now, rec.clone())
                .unwrap();
        }
        let w = poll_all(&mut whole, now).remove(0);
        let p = parts_frame(&mut parts, now, true).unwrap();
        let tcp_at = 14 + 20;
        let tcp_len = w.len() - tcp_at;
        let pseudo = crate::wire::checksum::pseudo_header(IP_B, IP_A, 6, tcp_len);
        assert_eq!(
            u16::from_be_bytes([p[tcp_at + 16], p[tcp_at + 17]]),
            crate::wire::checksum::fold(pseudo)
        );
        assert_eq!(p[..tcp_at + 16], w[..tcp_at + 16]);
        assert_eq!(p[tcp_at + 18..], w[tcp_at + 18..]);
        assert!(poll_all(&mut whole, now).is_empty());
        assert!(parts_frame(&mut parts, now, false).is_none());
    }

    /// The server's frames to the client, what it received read into
    /// `got`, then a millisecond on for both; the new time.
    fn answer_and_read(
        server: &mut Iface,
        client: &mut Iface,
        sid: ConnId,
        now: Instant,
        got: &mut Vec<u8>,
    ) -> Instant {
        let mut buf = vec![0u8; 2048];
        while let Some(n) = server.poll_frame(now, &mut buf) {
            client.handle_frame(now, buf[..n].to_vec());
        }
        while let Some(p) = server.stack_mut().conn_mut(sid).unwrap().recv() {
            got.extend_from_slice(p.bytes());
        }
        let now = now + Duration::from_millis(1);
        server.handle_timeout(now);
        client.handle_timeout(now);
        now
    }

    /// A server at IP_A:7000 and a client configured by `cfg` (at IP_B),
    /// connected: (server, client, client's connection, server's, now).
    fn connected(cfg: InterfaceConfig) -> (Iface, Iface, ConnId, ConnId, Instant) {
        let mut server = iface(MAC_A, IP_A);
        let mut client: Iface = Interface::new(cfg);
        let mut now = Instant::from_millis(1);
        client.add_static_arp(IP_A, MAC_A);
        server.add_static_arp(IP_B, MAC_B);
        server
            .stack_mut()
            .listen(SocketAddrV4::new(IP_A, 7000), 8)
            .unwrap();
        let cid = client
            .stack_mut()
            .connect(now, IP_B, SocketAddrV4::new(IP_A, 7000))
            .unwrap();
        run(
            &mut server,
            &mut client,
            &mut now,
            Instant::from_millis(100),
        );
        let sid = server.stack_mut().accept(7000).expect("accepted");
        (server, client, cid, sid, now)
    }

    /// Cuts a train as a port with segmentation offload does: one frame
    /// per `seg_len` bytes of payload, headers from [`cut_header`], the
    /// TCP checksum completed.
    fn cut_train(hdr: &[u8], payload: &[u8], seg_len: usize) -> Vec<Vec<u8>> {
        let pieces: Vec<&[u8]> = payload.chunks(seg_len).collect();
        let last = pieces.len() - 1;
        let mut out = Vec::new();
        for (k, piece) in pieces.into_iter().enumerate() {
            let mut f = vec![0u8; hdr.len()];
            cut_header(hdr, k, k * seg_len, piece.len(), k == last, &mut f);
            f.extend_from_slice(piece);
            TcpPacket::new_unchecked(&mut f[14 + 20..]).fill_checksum(IP_B, IP_A);
            out.push(f);
        }
        out
    }

    #[test]
    fn trains_of_whole_records_are_cut_into_one_record_per_segment() {
        let mut cfg = InterfaceConfig::new(MAC_B, IP_B, [3; 16]);
        cfg.tcp.train_bytes = 8 * 1448;
        cfg.tcp.train_records = 8;
        cfg.tcp.train_shortfall = 14;
        let (mut server, mut client, cid, sid, mut now) = connected(cfg);
        let conn = client.stack_mut().conn_mut(cid).unwrap();
        // The shortfall comes off the records, not the MSS.
        let rec_len = conn.max_record_len();
        assert_eq!(rec_len, 1448 - 14);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13 + i / 251) as u8).collect();
        let (mut sent, mut got) = (0usize, Vec::new());
        let (mut trains, mut cut, mut singles) = (0usize, 0usize, 0usize);
        let mut hdr = [0u8; 160];
        let deadline = Instant::from_millis(30_000);
        while got.len() < data.len() && now < deadline {
            loop {
                let conn = client.stack_mut().conn_mut(cid).unwrap();
                let cap = conn.send_capacity().min(data.len() - sent);
                if cap == 0 {
                    break;
                }
                assert!(cap <= rec_len);
                conn.send_record(now, data[sent..sent + cap].to_vec())
                    .unwrap();
                sent += cap;
            }
            let mut frames = Vec::new();
            while let Some(p) = client.poll_frame_parts(now, &mut hdr, |_, _, _| None, copy_vec) {
                let FrameParts::Segment {
                    header_len,
                    payload,
                    more,
                    pad,
                    checksum_offloaded,
                } = p
                else {
                    continue;
                };
                assert!(checksum_offloaded);
                let mut body = Vec::new();
                if let Some((r, range)) = payload {
                    body.extend_from_slice(&r[range]);
                }
                match more {
                    Some(t) => {
                        assert_eq!(pad, 0);
                        assert_eq!(t.seg_len(), body.len(), "cut at the first record");
                        let recs: Vec<&Vec<u8>> = t.records().collect();
                        assert_eq!(recs.len(), t.count());
                        assert!(t.count() < 8 && body.len() + t.bytes() <= 8 * 1448);
                        for (k, r) in recs.iter().enumerate() {
                            // Every record but the last is a segment's worth.
                            assert!(r.len() <= t.seg_len());
                            assert!(k + 1 == recs.len() || r.len() == t.seg_len());
                            body.extend_from_slice(r);
                        }
                        let seg_len = t.seg_len();
                        let pieces = cut_train(&hdr[..header_len], &body, seg_len);
                        assert_eq!(pieces.len(), t.count() + 1);
                        trains += 1;
                        cut += pieces.len();
                        frames.extend(pieces);
                    }
                    None => {
                        let mut f = hdr[..header_len].to_vec();
                        f.extend_from_slice(&body);
                        f.resize(f.len() + pad, 0);
                        TcpPacket::new_unchecked(&mut f[14 + 20..]).fill_checksum(IP_B, IP_A);
                        singles += 1;
                        frames.push(f);
                    }
                }
            }
            for f in frames {
                // Each cut segment verifies as the receiver checks it.
                tcp_of(&f);
                server.handle_frame(now, f);
            }
            now = answer_and_read(&mut server, &mut client, sid, now, &mut got);
        }
        assert!(got == data, "byte-exact");
        assert!(trains > 10, "{trains} trains");
        assert!(cut > 4 * trains, "{cut} segments cut from {trains} trains");
        let c = client.stack().conn(cid).unwrap().stats();
        assert_eq!(c.retransmits, 0);
        // Every segment cut counts as sent, and the ident moved past them;
        // every byte of the trains' records counts once.
        assert!(c.segments_out as usize >= cut + singles);
        assert_eq!(c.bytes_out, data.len() as u64);
        assert_eq!(server.stats().drops, [0; 7]);
    }

    /// With trains and packs both on, records short enough for two to
    /// share a segment are packed (fewer segments on the wire), and
    /// segment-long ones leave as a train.
    #[test]
    fn short_records_are_packed_rather_than_trained() {
        let mut cfg = InterfaceConfig::new(MAC_B, IP_B, [3; 16]);
        cfg.tcp.train_bytes = 16 * 1448;
        cfg.tcp.train_records = 16;
        cfg.tcp.pack_records = 16;
        let (_server, mut client, cid, _sid, now) = connected(cfg);
        let conn = client.stack_mut().conn_mut(cid).unwrap();
        let full = conn.max_record_len();
        for len in [100, 100, 100, 100, full, full, full] {
            conn.send_record(now, vec![7u8; len]).unwrap();
        }
        let mut hdr = [0u8; 160];
        let mut segs = Vec::new();
        while let Some(p) = client.poll_frame_parts(now, &mut hdr, |_, _, _| None, copy_vec) {
            if let FrameParts::Segment { more, .. } = p {
                segs.push(more.map(|t| (t.is_pack(), t.count() + 1)));
            }
        }
        assert_eq!(segs, [Some((true, 4)), Some((false, 3))]);
    }

    /// Small records packed several to a segment: each segment holds
    /// whole records only and stays within the MSS, the software checksum
    /// covers them all (summed record by record where each lands), and
    /// with every seventh data frame lost the records go again one by one
    /// and arrive byte-exact. Built in parts (`whole == false`) and whole.
    fn packs_of_small_records(whole: bool) {
        let mut cfg = InterfaceConfig::new(MAC_B, IP_B, [3; 16]);
        cfg.tcp.pack_records = 16;
        let (mut server, mut client, cid, sid, mut now) = connected(cfg);
        let sizes = |k: usize| 20 + (k * 37) % 180;
        let total: usize = (0..3000).map(sizes).sum();
        let data: Vec<u8> = (0..total as u32).map(|i| (i * 7 + i / 253) as u8).collect();
        let (mut sent, mut k, mut got) = (0usize, 0usize, Vec::new());
        let (mut frames_out, mut packs, mut dropped) = (0usize, 0usize, 0usize);
        let mut hdr = [0u8; 160];
        let deadline = Instant::from_millis(60_000);
        while got.len() < data.len() && now < deadline {
            loop {
                let conn = client.stack_mut().conn_mut(cid).unwrap();
                let len = sizes(k).min(data.len() - sent);
                if len == 0 || conn.send_capacity() < len {
                    break;
                }
                conn.send_record(now, data[sent..sent + len].to_vec())
                    .unwrap();
                sent += len;
                k += 1;
            }
            let mut frames = Vec::new();
            if whole {
                frames = poll_all(&mut client, now);
            } else {
                while let Some(p) = client.poll_frame_parts(
                    now,
                    &mut hdr,
                    |r: &Vec<u8>, range, _| Some(crate::wire::checksum::sum(&r[range])),
                    copy_vec,
                ) {
                    let FrameParts::Segment {
                        header_len,
                        payload,
                        more,
                        pad,
                        checksum_offloaded,
                    } = p
                    else {
                        continue;
                    };
                    assert!(!checksum_offloaded);
                    let mut f = hdr[..header_len].to_vec();
                    if let Some((r, range)) = payload {
                        f.extend_from_slice(&r[range]);
                    }
                    if let Some(t) = more {
                        assert!(t.is_pack() && t.count() > 0 && t.count() < 16);
                        packs += 1;
                        for r in t.records() {
                            f.extend_from_slice(r);
                        }
                    }
                    f.resize(f.len() + pad, 0);
                    frames.push(f);
                }
            }
            for f in frames {
                // The checksum verifies as sent.
                let (_, ip, _) = tcp_of(&f);
                assert!(ip.payload_len - 20 - 12 <= 1448, "within the MSS");
                frames_out += 1;
                if ip.payload_len > 40 && frames_out % 7 == 0 {
                    dropped += 1;
                    continue;
                }
                server.handle_frame(now, f);
            }
            now = answer_and_read(&mut server, &mut client, sid, now, &mut got);
        }
        assert!(got == data, "byte-exact");
        let c = client.stack().conn(cid).unwrap().stats();
        assert!(c.packed_segments > 50, "{c:?}");
        assert!(c.packed_records >= 2 * c.packed_segments, "{c:?}");
        assert!(whole || packs as u64 == c.packed_segments, "{packs} {c:?}");
        assert!(dropped > 10 && c.retransmits > 0, "{dropped} {c:?}");
        // Fewer segments than records: the packs saved frames.
        assert!(
            (c.segments_out as usize) < k,
            "{} segments for {k} records",
            c.segments_out
        );
        assert_eq!(server.stats().drops, [0; 7]);
    }

    #[test]
    fn small_records_are_packed_whole_into_segments_in_parts() {
        packs_of_small_records(false);
    }

    #[test]
    fn small_records_are_packed_whole_into_whole_frames() {
        packs_of_small_records(true);
    }

    #[test]
    fn frame_parts_hold_segments_for_unresolved_addresses() {
        let mut a = iface(MAC_B, IP_B);
        let now = Instant::from_millis(1);
        a.stack_mut()
            .connect(now, IP_B, SocketAddrV4::new(IP_A, 7000))
            .unwrap();
        let mut hdr = [0u8; 160];
        let first = a.poll_frame_parts(now, &mut hdr, |_: &Vec<u8>, _, _| Some(0), copy_vec);
        assert!(matches!(first, Some(FrameParts::Consumed)));
        assert!(a
            .poll_frame_parts(now, &mut hdr, |_, _, _| Some(0), copy_vec)
            .is_none());
        let mut buf = [0u8; 1600];
        let n = a.poll_slow_frame(now, &mut buf).unwrap();
        let (e, _) = arp_of(&buf[..n]);
        assert!(e.dst_addr.is_broadcast());
        assert_eq!(a.stats().arp_held, 1);
        // The reply releases the SYN through the slow path, whole.
        a.handle_frame(now, arp_from(ArpOperation::Reply, MAC_A, IP_A, IP_B));
        let n = a.poll_slow_frame(now, &mut buf).unwrap();
        let (dst, _, r) = tcp_of(&buf[..n]);
        assert_eq!((dst, r.flags), (MAC_A, TcpFlags::SYN));
        assert!(a.poll_slow_frame(now, &mut buf).is_none());
    }
}
