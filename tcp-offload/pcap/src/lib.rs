//! Packet captures for tests: reading classic pcap and pcapng files, and
//! putting the TCP byte streams in a capture back together.
//!
//! This crate is test support, beside the pipeline rather than in it, and
//! kept out of the protocol crates' public API: their tests and the
//! dataplane's take it as a dev-dependency. Tests replay real captures
//! (Linux soft-iWARP on the wire) through the wire parsers, the MPA
//! negotiator and the DDP/RDMAP decoders, and read back the dataplane's
//! own packet captures. The format's definition and its writer live in
//! `pcap-format`, which the dataplane's capture uses; this crate re-exports
//! them, so a test writes and reads through one import. Like the protocol
//! crates it does no I/O and reads no clock: the reader parses bytes the
//! caller read from a file, and timestamps are values the caller supplies.
//!
//! - [`Reader`]: classic pcap (both byte orders, microsecond and
//!   nanosecond timestamps) and pcapng (section header, interface
//!   description, enhanced, simple and obsolete packet blocks, both byte
//!   orders, a link type and timestamp resolution per interface), as in
//!   the IETF OPSAWG pcap and pcapng drafts. A malformed file is a
//!   [`PcapError`], never a panic.
//! - [`Writer`]: classic pcap, little-endian (from `pcap-format`).
//! - [`Reassembler`]: each direction of each TCP connection (RFC 9293
//!   §3.4 sequence numbering, from the SYN) as one byte stream, with the
//!   holes the capture left reported as [`Gap`]s instead of filled.
//!
//! None of this is on the data path: the reassembler allocates per
//! segment, which is fine for a capture of a test run and wrong for a
//! line-rate receive path (that is [`tcp_offload::tcp`]'s assembler).
#![forbid(unsafe_code)]

use core::fmt;
use core::net::SocketAddrV4;
use std::collections::BTreeMap;

use pcap_format::{HEADER_LEN, MAGIC_MICROS, MAGIC_MICROS_SWAPPED, MAGIC_NANOS};
use pcap_format::{MAGIC_NANOS_SWAPPED, RECORD_HEADER_LEN};
use tcp_offload::seq::SeqNumber;
use tcp_offload::time::Instant;
use tcp_offload::wire::{ipv4, WireError};
use tcp_offload::wire::{EtherType, EthernetFrame, IpProtocol, Ipv4Packet, TcpFlags, TcpPacket};

pub use pcap_format::{LinkType, Precision, Writer, DEFAULT_SNAPLEN};

// ---------------------------------------------------------------------------
// Common definitions.

/// Which format a [`Reader`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Classic pcap; `nanos` when the magic number announced nanosecond
    /// timestamps, `big_endian` when the file was written big-endian.
    Pcap {
        /// Timestamp fractions are nanoseconds rather than microseconds.
        nanos: bool,
        /// The header and record fields are big-endian.
        big_endian: bool,
    },
    /// pcapng; each section carries its own byte order.
    PcapNg,
}

/// One captured packet, borrowing its bytes from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Nanoseconds since the Unix epoch (after the interface's timestamp
    /// offset), or `None` for a pcapng simple packet block, which carries
    /// no timestamp.
    pub timestamp_ns: Option<u64>,
    /// The link type of the interface the packet was captured on.
    pub link_type: LinkType,
    /// The pcapng interface index (0 in classic pcap).
    pub interface: u32,
    /// The bytes captured: possibly fewer than were on the wire.
    pub data: &'a [u8],
    /// The packet's length on the wire.
    pub orig_len: u32,
}

impl Record<'_> {
    /// The timestamp in the engine's time type (microseconds, truncated),
    /// for replaying a capture into something that takes `now`.
    pub fn timestamp(&self) -> Option<Instant> {
        self.timestamp_ns.map(|ns| Instant::from_micros(ns / 1000))
    }

    /// Whether the snap length cut the packet short.
    pub fn is_truncated(&self) -> bool {
        (self.data.len() as u64) < u64::from(self.orig_len)
    }
}

/// Why a capture file could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PcapErrorKind {
    /// Neither a classic pcap magic number (in either byte order) nor a
    /// pcapng section header.
    UnknownMagic,
    /// A pcapng section header whose byte-order magic is not 0x1a2b3c4d
    /// in either byte order.
    BadByteOrderMagic,
    /// A major version this reader does not know (classic 2, pcapng 1).
    UnsupportedVersion,
    /// The file ends inside a header, a record or a block: a capture cut
    /// short, or one still being written.
    Truncated,
    /// A pcapng block whose total length is under 12, not a multiple of
    /// 4, or differs from the copy at the block's end.
    BadBlockLength,
    /// A pcapng block too short for its own fixed fields, or a packet
    /// longer than the block that holds it.
    BadBlock,
    /// A pcapng option running past its block, or a timestamp resolution
    /// finer than this reader can scale.
    BadOption,
    /// A packet block naming an interface no description block declared
    /// in its section.
    UnknownInterface,
}

/// A [`PcapErrorKind`] and the file offset of the header, record or
/// block where it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PcapError {
    /// What is wrong.
    pub kind: PcapErrorKind,
    /// Byte offset in the file of the structure that is wrong.
    pub offset: usize,
}

impl fmt::Display for PcapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            PcapErrorKind::UnknownMagic => "not a pcap or pcapng file",
            PcapErrorKind::BadByteOrderMagic => "bad pcapng byte-order magic",
            PcapErrorKind::UnsupportedVersion => "unsupported format version",
            PcapErrorKind::Truncated => "file ends inside a record",
            PcapErrorKind::BadBlockLength => "bad pcapng block length",
            PcapErrorKind::BadBlock => "pcapng block too short for its fields",
            PcapErrorKind::BadOption => "bad pcapng option",
            PcapErrorKind::UnknownInterface => "packet on an undeclared interface",
        };
        write!(f, "{what} at offset {}", self.offset)
    }
}

impl std::error::Error for PcapError {}

fn err(kind: PcapErrorKind, offset: usize) -> PcapError {
    PcapError { kind, offset }
}

/// Byte order of the structure being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Little,
    Big,
}

impl Order {
    fn u16(self, b: &[u8], at: usize) -> Option<u16> {
        let a: [u8; 2] = b.get(at..at.checked_add(2)?)?.try_into().ok()?;
        Some(match self {
            Order::Little => u16::from_le_bytes(a),
            Order::Big => u16::from_be_bytes(a),
        })
    }

    fn u32(self, b: &[u8], at: usize) -> Option<u32> {
        let a: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(match self {
            Order::Little => u32::from_le_bytes(a),
            Order::Big => u32::from_be_bytes(a),
        })
    }

    fn u64(self, b: &[u8], at: usize) -> Option<u64> {
        let a: [u8; 8] = b.get(at..at.checked_add(8)?)?.try_into().ok()?;
        Some(match self {
            Order::Little => u64::from_le_bytes(a),
            Order::Big => u64::from_be_bytes(a),
        })
    }
}

// ---------------------------------------------------------------------------
// Reader.

/// pcapng block types. The section header's type reads the same in both
/// byte orders, which is how a reader finds it before it knows the order.
const BLOCK_SECTION_HEADER: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
const BLOCK_INTERFACE: u32 = 1;
const BLOCK_PACKET_OBSOLETE: u32 = 2;
const BLOCK_SIMPLE_PACKET: u32 = 3;
const BLOCK_ENHANCED_PACKET: u32 = 6;
/// Block type, total length, and the trailing copy of the total length.
const BLOCK_OVERHEAD: usize = 12;
/// Interface description options this reader uses.
const OPT_END: u16 = 0;
const OPT_IF_TSRESOL: u16 = 9;
const OPT_IF_TSOFFSET: u16 = 14;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// What a pcapng interface description says about the packets that name
/// it.
#[derive(Debug, Clone, Copy)]
struct Interface {
    link_type: LinkType,
    /// 0 when unlimited.
    snaplen: u32,
    /// Timestamp units per second (`if_tsresol`; a million by default).
    units_per_sec: u128,
    /// Seconds added to every timestamp (`if_tsoffset`).
    offset_secs: i64,
}

impl Interface {
    fn timestamp_ns(&self, raw: u64) -> u64 {
        let ns = i128::try_from(u128::from(raw) * u128::from(NANOS_PER_SEC) / self.units_per_sec)
            .unwrap_or(i128::MAX);
        let ns = ns.saturating_add(i128::from(self.offset_secs) * i128::from(NANOS_PER_SEC));
        u64::try_from(ns.max(0)).unwrap_or(u64::MAX)
    }
}

#[derive(Debug)]
enum State {
    Pcap {
        order: Order,
        nanos: bool,
        link_type: LinkType,
    },
    PcapNg {
        order: Order,
        /// The current section's interfaces, in declaration order.
        interfaces: Vec<Interface>,
    },
}

/// An iterator over the records of a capture file held in memory.
///
/// Yields `Ok` records in file order; the first malformed structure ends
/// the iteration with one `Err` (nothing after it can be trusted). A file
/// cut inside its last record, as a capture still being written is, so
/// yields every whole record and then [`PcapErrorKind::Truncated`].
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    state: State,
    format: Format,
    done: bool,
}

impl<'a> Reader<'a> {
    /// Recognises the format and reads the file header (classic) or the
    /// first section header (pcapng).
    pub fn new(bytes: &'a [u8]) -> Result<Reader<'a>, PcapError> {
        let magic = bytes.get(..4).ok_or(err(PcapErrorKind::Truncated, 0))?;
        if magic == BLOCK_SECTION_HEADER {
            let mut r = Reader {
                bytes,
                at: 0,
                state: State::PcapNg {
                    order: Order::Little,
                    interfaces: Vec::new(),
                },
                format: Format::PcapNg,
                done: false,
            };
            r.section_header()?;
            return Ok(r);
        }
        let (order, nanos) = match Order::Little.u32(magic, 0) {
            Some(MAGIC_MICROS) => (Order::Little, false),
            Some(MAGIC_NANOS) => (Order::Little, true),
            Some(MAGIC_MICROS_SWAPPED) => (Order::Big, false),
            Some(MAGIC_NANOS_SWAPPED) => (Order::Big, true),
            _ => return Err(err(PcapErrorKind::UnknownMagic, 0)),
        };
        let header = bytes
            .get(..HEADER_LEN)
            .ok_or(err(PcapErrorKind::Truncated, 0))?;
        let truncated = err(PcapErrorKind::Truncated, 0);
        if order.u16(header, 4).ok_or(truncated)? != 2 {
            return Err(err(PcapErrorKind::UnsupportedVersion, 0));
        }
        // The upper bits hold the FCS length; the link type is the low 16.
        let link_type = LinkType((order.u32(header, 20).ok_or(truncated)? & 0xffff) as u16);
        Ok(Reader {
            bytes,
            at: HEADER_LEN,
            state: State::Pcap {
                order,
                nanos,
                link_type,
            },
            format: Format::Pcap {
                nanos,
                big_endian: order == Order::Big,
            },
            done: false,
        })
    }

    /// The format found.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Reads every record, stopping at the first error.
    pub fn read_all(bytes: &'a [u8]) -> Result<Vec<Record<'a>>, PcapError> {
        Reader::new(bytes)?.collect()
    }

    /// Reads one section header block at `self.at`: sets the byte order
    /// and forgets the previous section's interfaces.
    fn section_header(&mut self) -> Result<(), PcapError> {
        let (bytes, at) = (self.bytes, self.at);
        let rest = &bytes[at.min(bytes.len())..];
        let order = match rest.get(8..12) {
            Some([0x4d, 0x3c, 0x2b, 0x1a]) => Order::Little,
            Some([0x1a, 0x2b, 0x3c, 0x4d]) => Order::Big,
            Some(_) => return Err(err(PcapErrorKind::BadByteOrderMagic, at)),
            None => return Err(err(PcapErrorKind::Truncated, at)),
        };
        let body = block_body(rest, order, at)?;
        // Byte-order magic (4), major and minor version (2 + 2), section
        // length (8).
        if body.len() < 16 {
            return Err(err(PcapErrorKind::BadBlock, at));
        }
        if order.u16(body, 4) != Some(1) {
            return Err(err(PcapErrorKind::UnsupportedVersion, at));
        }
        self.state = State::PcapNg {
            order,
            interfaces: Vec::new(),
        };
        self.at = at + body.len() + BLOCK_OVERHEAD;
        Ok(())
    }

    fn next_pcap(
        &mut self,
        order: Order,
        nanos: bool,
        link_type: LinkType,
    ) -> Option<Result<Record<'a>, PcapError>> {
        let (bytes, at) = (self.bytes, self.at);
        let rest = &bytes[at.min(bytes.len())..];
        if rest.is_empty() {
            return None;
        }
        let truncated = err(PcapErrorKind::Truncated, at);
        let Some(h) = rest.get(..RECORD_HEADER_LEN) else {
            return Some(Err(truncated));
        };
        let field = |i| order.u32(h, i).unwrap_or(0);
        let (secs, frac, incl, orig) = (field(0), field(4), field(8), field(12));
        let Some(data) = usize::try_from(incl)
            .ok()
            .and_then(|n| rest.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN.checked_add(n)?))
        else {
            return Some(Err(truncated));
        };
        self.at = at + RECORD_HEADER_LEN + data.len();
        let frac_ns = if nanos {
            u64::from(frac)
        } else {
            u64::from(frac) * 1000
        };
        Some(Ok(Record {
            timestamp_ns: Some(u64::from(secs) * NANOS_PER_SEC + frac_ns),
            link_type,
            interface: 0,
            data,
            orig_len: orig,
        }))
    }

    fn next_pcapng(&mut self) -> Option<Result<Record<'a>, PcapError>> {
        loop {
            let (bytes, at) = (self.bytes, self.at);
            let rest = &bytes[at.min(bytes.len())..];
            if rest.is_empty() {
                return None;
            }
            if rest.starts_with(&BLOCK_SECTION_HEADER) {
                if let Err(e) = self.section_header() {
                    return Some(Err(e));
                }
                continue;
            }
            let State::PcapNg { order, interfaces } = &mut self.state else {
                return None;
            };
            let order = *order;
            let body = match block_body(rest, order, at) {
                Ok(b) => b,
                Err(e) => return Some(Err(e)),
            };
            self.at = at + body.len() + BLOCK_OVERHEAD;
            let Some(kind) = order.u32(rest, 0) else {
                return Some(Err(err(PcapErrorKind::Truncated, at)));
            };
            let bad = err(PcapErrorKind::BadBlock, at);
            match kind {
                BLOCK_INTERFACE => match interface(body, order, at) {
                    Ok(i) => interfaces.push(i),
                    Err(e) => return Some(Err(e)),
                },
                BLOCK_ENHANCED_PACKET | BLOCK_PACKET_OBSOLETE => {
                    // The obsolete block has a 16-bit interface id and a
                    // drop count where the enhanced one has a 32-bit id;
                    // the rest of the layout is the same.
                    let id = if kind == BLOCK_ENHANCED_PACKET {
                        order.u32(body, 0)
                    } else {
                        order.u16(body, 0).map(u32::from)
                    };
                    let fields = (|| {
                        Some((
                            id?,
                            order.u32(body, 4)?,
                            order.u32(body, 8)?,
                            order.u32(body, 12)?,
                            order.u32(body, 16)?,
                        ))
                    })();
                    let Some((id, hi, lo, cap, orig)) = fields else {
                        return Some(Err(bad));
                    };
                    let Some(iface) = usize::try_from(id).ok().and_then(|i| interfaces.get(i))
                    else {
                        return Some(Err(err(PcapErrorKind::UnknownInterface, at)));
                    };
                    let Some(data) = usize::try_from(cap)
                        .ok()
                        .and_then(|n| body.get(20..20usize.checked_add(n)?))
                    else {
                        return Some(Err(bad));
                    };
                    let raw = (u64::from(hi) << 32) | u64::from(lo);
                    return Some(Ok(Record {
                        timestamp_ns: Some(iface.timestamp_ns(raw)),
                        link_type: iface.link_type,
                        interface: id,
                        data,
                        orig_len: orig,
                    }));
                }
                BLOCK_SIMPLE_PACKET => {
                    // Always interface 0; the captured length is implied
                    // by its snap length.
                    let Some(iface) = interfaces.first() else {
                        return Some(Err(err(PcapErrorKind::UnknownInterface, at)));
                    };
                    let Some(orig) = order.u32(body, 0) else {
                        return Some(Err(bad));
                    };
                    let cap = match iface.snaplen {
                        0 => orig,
                        s => orig.min(s),
                    };
                    let Some(data) = usize::try_from(cap)
                        .ok()
                        .and_then(|n| body.get(4..4usize.checked_add(n)?))
                    else {
                        return Some(Err(bad));
                    };
                    return Some(Ok(Record {
                        timestamp_ns: None,
                        link_type: iface.link_type,
                        interface: 0,
                        data,
                        orig_len: orig,
                    }));
                }
                // Name resolution, statistics, decryption secrets, custom
                // blocks: nothing a packet reader needs.
                _ => {}
            }
        }
    }
}

impl<'a> Iterator for Reader<'a> {
    type Item = Result<Record<'a>, PcapError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = match self.state {
            State::Pcap {
                order,
                nanos,
                link_type,
            } => self.next_pcap(order, nanos, link_type),
            State::PcapNg { .. } => self.next_pcapng(),
        };
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
        }
        item
    }
}

impl core::iter::FusedIterator for Reader<'_> {}

/// Checks a pcapng block's framing at the start of `rest` (file offset
/// `at`) and returns its body, between the length and its trailing copy.
fn block_body(rest: &[u8], order: Order, at: usize) -> Result<&[u8], PcapError> {
    let total = order
        .u32(rest, 4)
        .ok_or(err(PcapErrorKind::Truncated, at))?;
    let total = usize::try_from(total).map_err(|_| err(PcapErrorKind::BadBlockLength, at))?;
    if total < BLOCK_OVERHEAD || total % 4 != 0 {
        return Err(err(PcapErrorKind::BadBlockLength, at));
    }
    let block = rest.get(..total).ok_or(err(PcapErrorKind::Truncated, at))?;
    if order
        .u32(block, total - 4)
        .and_then(|t| usize::try_from(t).ok())
        != Some(total)
    {
        return Err(err(PcapErrorKind::BadBlockLength, at));
    }
    Ok(&block[8..total - 4])
}

/// Parses an interface description block's body.
fn interface(body: &[u8], order: Order, at: usize) -> Result<Interface, PcapError> {
    let (Some(link), Some(snaplen)) = (order.u16(body, 0), order.u32(body, 4)) else {
        return Err(err(PcapErrorKind::BadBlock, at));
    };
    let mut iface = Interface {
        link_type: LinkType(link),
        snaplen,
        units_per_sec: 1_000_000,
        offset_secs: 0,
    };
    let bad = err(PcapErrorKind::BadOption, at);
    let mut opts = &body[8.min(body.len())..];
    while !opts.is_empty() {
        let (Some(code), Some(len)) = (order.u16(opts, 0), order.u16(opts, 2)) else {
            return Err(bad);
        };
        if code == OPT_END {
            break;
        }
        let len = usize::from(len);
        let value = opts.get(4..4 + len).ok_or(bad)?;
        match (code, value) {
            (OPT_IF_TSRESOL, &[r]) => {
                iface.units_per_sec = if r & 0x80 != 0 {
                    1u128 << (r & 0x7f)
                } else {
                    10u128.checked_pow(u32::from(r)).ok_or(bad)?
                };
            }
            (OPT_IF_TSOFFSET, v) if v.len() == 8 => {
                let raw = order.u64(v, 0).ok_or(bad)?;
                iface.offset_secs = i64::from_ne_bytes(raw.to_ne_bytes());
            }
            (OPT_IF_TSRESOL | OPT_IF_TSOFFSET, _) => return Err(bad),
            _ => {}
        }
        // Values are padded to 32 bits; a last option may omit the pad.
        let next = 4 + len.next_multiple_of(4);
        opts = opts.get(next..).unwrap_or(&[]);
    }
    Ok(iface)
}

// ---------------------------------------------------------------------------
// TCP stream reassembly.

/// A range of stream octets the capture does not hold: segments that were
/// never captured, or the tails the snap length cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gap {
    /// Stream offset of the first missing octet (0 is the octet after the
    /// SYN).
    pub start: u64,
    /// Number of missing octets.
    pub len: u64,
}

impl Gap {
    /// Offset one past the last missing octet.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// One payload-carrying segment as it arrived, for checks on how a sender
/// cut its stream into segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Stream offset of its first octet; negative for a segment that
    /// starts before the SYN's successor (a keep-alive probe).
    pub offset: i64,
    /// Payload length the IPv4 header declares.
    pub len: usize,
    /// Payload octets the capture holds (fewer when the snap length cut
    /// the frame).
    pub captured: usize,
}

/// One direction of a connection: the octets the capture holds, in
/// sequence order, and where it holds none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    /// Sender.
    pub src: SocketAddrV4,
    /// Receiver.
    pub dst: SocketAddrV4,
    /// Initial sequence number, from this direction's SYN; `None` when
    /// the capture holds no SYN from this side (then no payload is placed:
    /// there is no origin to place it from).
    pub isn: Option<SeqNumber>,
    /// Every captured octet, in stream order, with the gaps left out (not
    /// filled): `data.len()` plus the gaps' lengths is [`Stream::end`].
    pub data: Vec<u8>,
    /// Missing ranges, ascending and disjoint.
    pub gaps: Vec<Gap>,
    /// Payload-carrying segments after the SYN, in arrival order, copies
    /// included.
    pub segments: Vec<SegmentInfo>,
    /// Stream offset of the FIN, if one was seen.
    pub fin: Option<u64>,
    /// Whether this side sent a RST.
    pub reset: bool,
    /// TCP segments seen from this side, whatever they carried.
    pub frames: usize,
    /// Payload-carrying segments seen before this side's SYN.
    pub before_syn: usize,
    /// Octets a later copy carried differently from the first copy,
    /// which is the one kept. Zero in a sound capture.
    pub mismatched: u64,
    end: u64,
}

impl Stream {
    /// Offset one past the last octet any segment declared.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Whether the capture holds every octet up to [`Stream::end`].
    pub fn is_complete(&self) -> bool {
        self.gaps.is_empty()
    }

    /// The octets from the start of the stream up to the first gap: what
    /// a receiver could have delivered in order.
    pub fn prefix(&self) -> &[u8] {
        let n = self
            .gaps
            .first()
            .and_then(|g| usize::try_from(g.start).ok())
            .unwrap_or(self.data.len());
        &self.data[..n.min(self.data.len())]
    }

    /// The captured runs between the gaps, each with its stream offset.
    pub fn pieces(&self) -> Vec<(u64, &[u8])> {
        let mut out = Vec::with_capacity(self.gaps.len() + 1);
        let (mut offset, mut index) = (0u64, 0usize);
        for g in &self.gaps {
            let n = usize::try_from(g.start - offset).unwrap_or(usize::MAX);
            let n = n.min(self.data.len() - index);
            if n > 0 {
                out.push((offset, &self.data[index..index + n]));
            }
            index += n;
            offset = g.end();
        }
        if index < self.data.len() {
            out.push((offset, &self.data[index..]));
        }
        out
    }
}

/// Both directions of one TCP connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// `streams[0]` is from the endpoint that sent the first segment the
    /// capture holds (the client, when the capture starts before the
    /// handshake); `streams[1]` is the other way.
    pub streams: [Stream; 2],
}

impl Connection {
    /// The direction sent by `src`, if it is one of the two endpoints.
    pub fn from(&self, src: SocketAddrV4) -> Option<&Stream> {
        self.streams.iter().find(|s| s.src == src)
    }
}

/// What [`Reassembler::push_frame`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// A TCP segment, counted in its direction; `payload` octets of it
    /// were captured.
    Tcp {
        /// Captured payload octets.
        payload: usize,
    },
    /// Not an IPv4 TCP segment (ARP, IPv6, ICMP, another link type).
    NotTcp,
    /// An IPv4 fragment: not reassembled, as iWARP peers set DF.
    Fragment,
    /// Headers that do not parse, or were cut by the snap length before
    /// the end of the TCP header.
    Malformed(WireError),
}

/// Counts of what [`Reassembler`] was given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReassemblyStats {
    /// Frames pushed.
    pub frames: usize,
    /// TCP segments among them.
    pub tcp: usize,
    /// Frames that were not IPv4 TCP.
    pub not_tcp: usize,
    /// IPv4 fragments.
    pub fragments: usize,
    /// Frames whose headers did not parse.
    pub malformed: usize,
}

/// Groups the TCP segments of a capture by connection and lays each
/// direction's payload out by sequence number.
///
/// A connection is a 4-tuple seen from either side; a SYN with a new ISN
/// on a known 4-tuple starts a new connection (port reuse). Offsets count
/// from the SYN's sequence number plus one, and are unwrapped past 2^32
/// relative to the furthest octet seen. Retransmissions and overlaps keep
/// the first captured copy of each octet. Checksums are not verified:
/// captures taken with offloads on hold partial checksums, and a frame
/// cut by the snap length cannot be summed.
#[derive(Debug, Default)]
pub struct Reassembler {
    connections: Vec<ConnectionState>,
    /// Newest connection on each 4-tuple, keyed with the lower endpoint
    /// first (a BTreeMap: no hasher seeded from OS entropy).
    index: BTreeMap<(SocketAddrV4, SocketAddrV4), usize>,
    stats: ReassemblyStats,
}

#[derive(Debug)]
struct ConnectionState {
    dirs: [DirectionState; 2],
}

#[derive(Debug)]
struct DirectionState {
    src: SocketAddrV4,
    dst: SocketAddrV4,
    isn: Option<SeqNumber>,
    /// Disjoint, non-adjacent runs of captured octets by stream offset.
    runs: BTreeMap<u64, Vec<u8>>,
    end: u64,
    fin: Option<u64>,
    reset: bool,
    frames: usize,
    before_syn: usize,
    mismatched: u64,
    segments: Vec<SegmentInfo>,
}

impl DirectionState {
    fn new(src: SocketAddrV4, dst: SocketAddrV4) -> DirectionState {
        DirectionState {
            src,
            dst,
            isn: None,
            runs: BTreeMap::new(),
            end: 0,
            fin: None,
            reset: false,
            frames: 0,
            before_syn: 0,
            mismatched: 0,
            segments: Vec::new(),
        }
    }

    /// Stream offset of sequence number `seq`: the 64-bit value nearest
    /// to the furthest octet seen whose low 32 bits match.
    fn offset(&self, isn: SeqNumber, seq: SeqNumber) -> i64 {
        let rel = seq.0.wrapping_sub(isn.0.wrapping_add(1));
        let reference = self.end;
        // Reinterpreting the wrapped difference as signed is the point.
        let delta = rel.wrapping_sub(reference as u32) as i32;
        i64::try_from(reference)
            .unwrap_or(i64::MAX)
            .saturating_add(i64::from(delta))
    }

    /// Stores the octets of `bytes` (at stream offset `start`) that no
    /// earlier copy supplied, and counts the ones that disagree with it.
    fn place(&mut self, start: u64, bytes: &[u8]) {
        let end = start + bytes.len() as u64;
        let mut fresh: Vec<(u64, u64)> = Vec::new();
        let mut cursor = start;
        let first = self
            .runs
            .range(..=start)
            .next_back()
            .map_or(start, |(&k, _)| k);
        for (&k, run) in self.runs.range(first..end) {
            let run_end = k + run.len() as u64;
            if run_end <= cursor {
                continue;
            }
            if k > cursor {
                fresh.push((cursor, k));
            }
            let (lo, hi) = (k.max(cursor), run_end.min(end));
            let old = &run[(lo - k) as usize..(hi - k) as usize];
            let new = &bytes[(lo - start) as usize..(hi - start) as usize];
            self.mismatched += old.iter().zip(new).filter(|(a, b)| a != b).count() as u64;
            cursor = hi;
        }
        if cursor < end {
            fresh.push((cursor, end));
        }
        for (lo, hi) in fresh {
            let piece = &bytes[(lo - start) as usize..(hi - start) as usize];
            // Append to a run that ends where this piece starts, so that an
            // in-order stream stays one growing buffer.
            let before = self
                .runs
                .range(..lo)
                .next_back()
                .filter(|(&k, r)| k + r.len() as u64 == lo)
                .map(|(&k, _)| k);
            let key = match before {
                Some(k) => {
                    if let Some(r) = self.runs.get_mut(&k) {
                        r.extend_from_slice(piece);
                    }
                    k
                }
                None => {
                    self.runs.insert(lo, piece.to_vec());
                    lo
                }
            };
            // And absorb a run that starts where it now ends.
            if let Some(next) = self.runs.remove(&hi) {
                if let Some(r) = self.runs.get_mut(&key) {
                    r.extend_from_slice(&next);
                }
            }
        }
    }

    fn finish(self) -> Stream {
        let mut data = Vec::with_capacity(self.runs.values().map(Vec::len).sum());
        let mut gaps = Vec::new();
        let mut at = 0u64;
        for (k, run) in self.runs {
            if k > at {
                gaps.push(Gap {
                    start: at,
                    len: k - at,
                });
            }
            at = k + run.len() as u64;
            if data.is_empty() {
                data = run;
            } else {
                data.extend_from_slice(&run);
            }
        }
        if self.end > at {
            gaps.push(Gap {
                start: at,
                len: self.end - at,
            });
        }
        Stream {
            src: self.src,
            dst: self.dst,
            isn: self.isn,
            data,
            gaps,
            segments: self.segments,
            fin: self.fin,
            reset: self.reset,
            frames: self.frames,
            before_syn: self.before_syn,
            mismatched: self.mismatched,
            end: self.end.max(at),
        }
    }
}

impl Reassembler {
    /// An empty reassembler.
    pub fn new() -> Reassembler {
        Reassembler::default()
    }

    /// Reassembles every TCP segment of a capture's records.
    pub fn from_records<'a, I>(records: I) -> Vec<Connection>
    where
        I: IntoIterator<Item = Record<'a>>,
    {
        let mut r = Reassembler::new();
        for rec in records {
            r.push_record(&rec);
        }
        r.finish()
    }

    /// Counts of the frames pushed so far.
    pub fn stats(&self) -> ReassemblyStats {
        self.stats
    }

    /// Pushes a captured packet of any link type; Ethernet frames and
    /// bare IPv4 packets are looked at.
    pub fn push_record(&mut self, record: &Record<'_>) -> Pushed {
        match record.link_type {
            LinkType::ETHERNET => self.push_frame(record.data),
            LinkType::RAW | LinkType::IPV4 => {
                self.stats.frames += 1;
                let pushed = self.push_ipv4(record.data);
                self.count(pushed);
                pushed
            }
            _ => {
                self.stats.frames += 1;
                self.stats.not_tcp += 1;
                Pushed::NotTcp
            }
        }
    }

    /// Pushes an Ethernet II frame (802.1Q-tagged or not), as captured:
    /// possibly cut short by the snap length.
    pub fn push_frame(&mut self, frame: &[u8]) -> Pushed {
        self.stats.frames += 1;
        let pushed = match EthernetFrame::new_checked(frame) {
            Err(e) => Pushed::Malformed(e),
            Ok(f) if f.payload_ethertype() != EtherType::Ipv4 => Pushed::NotTcp,
            Ok(f) => self.push_ipv4(f.payload()),
        };
        self.count(pushed);
        pushed
    }

    fn count(&mut self, pushed: Pushed) {
        match pushed {
            Pushed::Tcp { .. } => self.stats.tcp += 1,
            Pushed::NotTcp => self.stats.not_tcp += 1,
            Pushed::Fragment => self.stats.fragments += 1,
            Pushed::Malformed(_) => self.stats.malformed += 1,
        }
    }

    /// Parses an IPv4 packet whose tail may be missing. The wire layer's
    /// `new_checked` rightly refuses such a packet, so the lengths are
    /// checked here, field by field, before the view's accessors are used.
    fn push_ipv4(&mut self, ip: &[u8]) -> Pushed {
        if ip.len() < ipv4::HEADER_LEN {
            return Pushed::Malformed(WireError::Truncated);
        }
        let p = Ipv4Packet::new_unchecked(ip);
        if p.version() != 4 {
            return Pushed::Malformed(WireError::BadVersion);
        }
        let hl = p.header_len();
        if hl < ipv4::HEADER_LEN {
            return Pushed::Malformed(WireError::BadLength);
        }
        if ip.len() < hl {
            return Pushed::Malformed(WireError::Truncated);
        }
        if p.next_header() != IpProtocol::Tcp {
            return Pushed::NotTcp;
        }
        if p.more_frags() || p.frag_offset() != 0 {
            return Pushed::Fragment;
        }
        let total = match usize::from(p.total_len()) {
            // A segmentation-offload packet too large for the field:
            // whatever was captured is all there is to know.
            0 => ip.len(),
            t if t < hl => return Pushed::Malformed(WireError::BadLength),
            t => t,
        };
        let Some(seg) = ip.get(hl..total.min(ip.len())) else {
            return Pushed::Malformed(WireError::Truncated);
        };
        let tp = match TcpPacket::new_checked(seg) {
            Ok(tp) => tp,
            Err(e) => return Pushed::Malformed(e),
        };
        let Some(declared) = (total - hl).checked_sub(tp.header_len()) else {
            return Pushed::Malformed(WireError::BadLength);
        };
        let src = SocketAddrV4::new(p.src_addr(), tp.src_port());
        let dst = SocketAddrV4::new(p.dst_addr(), tp.dst_port());
        let payload = tp.payload();
        self.segment(src, dst, &tp, declared, payload);
        Pushed::Tcp {
            payload: payload.len(),
        }
    }

    fn connection(&mut self, src: SocketAddrV4, dst: SocketAddrV4, new: bool) -> usize {
        let key = if src <= dst { (src, dst) } else { (dst, src) };
        match self.index.get(&key) {
            Some(&i) if !new => i,
            _ => {
                let i = self.connections.len();
                self.connections.push(ConnectionState {
                    dirs: [DirectionState::new(src, dst), DirectionState::new(dst, src)],
                });
                self.index.insert(key, i);
                i
            }
        }
    }

    fn segment(
        &mut self,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        tp: &TcpPacket<&[u8]>,
        declared: usize,
        payload: &[u8],
    ) {
        let flags = tp.flags();
        let seq = tp.seq_number();
        let syn = flags.contains(TcpFlags::SYN);
        let mut ci = self.connection(src, dst, false);
        let side = |c: &ConnectionState| usize::from(c.dirs[0].src != src);
        if syn {
            let c = &self.connections[ci];
            if c.dirs[side(c)].isn.is_some_and(|isn| isn != seq) {
                ci = self.connection(src, dst, true);
            }
        }
        let c = &mut self.connections[ci];
        let d = &mut c.dirs[side(c)];
        d.frames += 1;
        d.reset |= flags.contains(TcpFlags::RST);
        if syn {
            d.isn = Some(seq);
        }
        let Some(isn) = d.isn else {
            d.before_syn += usize::from(declared > 0);
            return;
        };
        // A SYN's own sequence number is not a data octet's.
        let first = if syn { seq + 1 } else { seq };
        let offset = d.offset(isn, first);
        let declared_i = i64::try_from(declared).unwrap_or(i64::MAX);
        let end = offset.saturating_add(declared_i);
        if declared > 0 {
            d.segments.push(SegmentInfo {
                offset,
                len: declared,
                captured: payload.len(),
            });
            if let Ok(end) = u64::try_from(end) {
                d.end = d.end.max(end);
            }
            // Octets before the origin (keep-alive probes) are dropped.
            let skip = usize::try_from(offset.saturating_neg()).unwrap_or(0);
            if let Some(rest) = payload.get(skip..).filter(|r| !r.is_empty()) {
                d.place(u64::try_from(offset.max(0)).unwrap_or(0), rest);
            }
        }
        if flags.contains(TcpFlags::FIN) {
            d.fin = u64::try_from(end).ok();
        }
    }

    /// The connections in the order their first segment was pushed, each
    /// direction laid out as a [`Stream`].
    pub fn finish(self) -> Vec<Connection> {
        self.connections
            .into_iter()
            .map(|c| {
                let [a, b] = c.dirs;
                Connection {
                    streams: [a.finish(), b.finish()],
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;
    use tcp_offload::wire::{EthernetAddress, EthernetRepr, Ipv4Repr, TcpOptions, TcpRepr};

    // ----------------------------------------------------------- builders

    fn put16(o: Order, v: u16) -> [u8; 2] {
        match o {
            Order::Little => v.to_le_bytes(),
            Order::Big => v.to_be_bytes(),
        }
    }

    fn put32(o: Order, v: u32) -> [u8; 4] {
        match o {
            Order::Little => v.to_le_bytes(),
            Order::Big => v.to_be_bytes(),
        }
    }

    fn put64(o: Order, v: u64) -> [u8; 8] {
        match o {
            Order::Little => v.to_le_bytes(),
            Order::Big => v.to_be_bytes(),
        }
    }

    /// A classic pcap file: (seconds, fraction, captured bytes, original
    /// length) per record.
    fn classic(o: Order, nanos: bool, link: u32, recs: &[(u32, u32, &[u8], u32)]) -> Vec<u8> {
        let magic = if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 };
        let mut b = Vec::new();
        b.extend_from_slice(&put32(o, magic));
        b.extend_from_slice(&put16(o, 2));
        b.extend_from_slice(&put16(o, 4));
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&put32(o, 65535));
        b.extend_from_slice(&put32(o, link));
        for &(secs, frac, data, orig) in recs {
            b.extend_from_slice(&put32(o, secs));
            b.extend_from_slice(&put32(o, frac));
            b.extend_from_slice(&put32(o, data.len() as u32));
            b.extend_from_slice(&put32(o, orig));
            b.extend_from_slice(data);
        }
        b
    }

    fn block(o: Order, kind: u32, body: &[u8]) -> Vec<u8> {
        let mut body = body.to_vec();
        body.resize(body.len().next_multiple_of(4), 0);
        let total = put32(o, body.len() as u32 + 12);
        let mut b = put32(o, kind).to_vec();
        b.extend_from_slice(&total);
        b.extend_from_slice(&body);
        b.extend_from_slice(&total);
        b
    }

    fn shb(o: Order) -> Vec<u8> {
        let mut body = put32(o, 0x1a2b_3c4d).to_vec();
        body.extend_from_slice(&put16(o, 1));
        body.extend_from_slice(&put16(o, 0));
        body.extend_from_slice(&put64(o, u64::MAX));
        block(o, 0x0a0d_0d0a, &body)
    }

    fn options(o: Order, opts: &[(u16, &[u8])]) -> Vec<u8> {
        let mut b = Vec::new();
        for &(code, value) in opts {
            b.extend_from_slice(&put16(o, code));
            b.extend_from_slice(&put16(o, value.len() as u16));
            b.extend_from_slice(value);
            b.resize(b.len().next_multiple_of(4), 0);
        }
        if !opts.is_empty() {
            b.extend_from_slice(&[0; 4]);
        }
        b
    }

    fn idb(o: Order, link: u16, snaplen: u32, opts: &[(u16, &[u8])]) -> Vec<u8> {
        let mut body = put16(o, link).to_vec();
        body.extend_from_slice(&[0; 2]);
        body.extend_from_slice(&put32(o, snaplen));
        body.extend_from_slice(&options(o, opts));
        block(o, 1, &body)
    }

    /// An enhanced packet block, or with `obsolete` the old packet block
    /// (16-bit interface id and a drop count).
    fn packet_block(
        o: Order,
        obsolete: bool,
        iface: u32,
        ts: u64,
        data: &[u8],
        orig: u32,
    ) -> Vec<u8> {
        let mut body = if obsolete {
            let mut b = put16(o, iface as u16).to_vec();
            b.extend_from_slice(&put16(o, 0));
            b
        } else {
            put32(o, iface).to_vec()
        };
        body.extend_from_slice(&put32(o, (ts >> 32) as u32));
        body.extend_from_slice(&put32(o, ts as u32));
        body.extend_from_slice(&put32(o, data.len() as u32));
        body.extend_from_slice(&put32(o, orig));
        body.extend_from_slice(data);
        body.resize(body.len().next_multiple_of(4), 0);
        // An epb_flags option after the data, which the reader skips.
        body.extend_from_slice(&options(o, &[(2, &put32(o, 1))]));
        block(o, if obsolete { 2 } else { 6 }, &body)
    }

    fn epb(o: Order, iface: u32, ts: u64, data: &[u8], orig: u32) -> Vec<u8> {
        packet_block(o, false, iface, ts, data, orig)
    }

    fn spb(o: Order, orig: u32, data: &[u8]) -> Vec<u8> {
        let mut body = put32(o, orig).to_vec();
        body.extend_from_slice(data);
        block(o, 3, &body)
    }

    fn read(bytes: &[u8]) -> (Vec<Record<'_>>, Option<PcapError>) {
        let mut recs = Vec::new();
        match Reader::new(bytes) {
            Err(e) => (recs, Some(e)),
            Ok(r) => {
                for item in r {
                    match item {
                        Ok(rec) => recs.push(rec),
                        Err(e) => return (recs, Some(e)),
                    }
                }
                (recs, None)
            }
        }
    }

    fn kind_at(bytes: &[u8]) -> Option<(PcapErrorKind, usize)> {
        read(bytes).1.map(|e| (e.kind, e.offset))
    }

    // ------------------------------------------------------ classic pcap

    #[test]
    fn writer_round_trip_both_precisions() {
        let frame: Vec<u8> = (0..100u8).collect();
        let ts = 1_700_000_000_123_456_789u64;
        for precision in [Precision::Micros, Precision::Nanos] {
            let w = Writer::new(LinkType::ETHERNET, 64, precision);
            let mut out = Vec::new();
            w.write_header(&mut out);
            w.write_record(&mut out, ts, &frame[..60]);
            w.write_record(&mut out, ts + 1_000, &frame);
            w.write_record(&mut out, 0, &[]);
            w.write_record_at(&mut out, Instant::from_micros(2_500_001), &frame[..10]);
            // A frame in pieces is stored as the same record as whole.
            let mut whole = Vec::new();
            let mut parts = Vec::new();
            w.write_record(&mut whole, 7, &frame);
            w.write_record_parts(
                &mut parts,
                7,
                &[&frame[..14], &[], &frame[14..70], &frame[70..]],
            );
            assert_eq!(whole, parts);
            out.extend_from_slice(&parts);

            let r = Reader::new(&out).unwrap();
            let nanos = precision == Precision::Nanos;
            assert_eq!(
                r.format(),
                Format::Pcap {
                    nanos,
                    big_endian: false
                }
            );
            let recs: Vec<Record<'_>> = r.map(Result::unwrap).collect();
            assert_eq!(recs.len(), 5);
            let scale = |ns: u64| if nanos { ns } else { ns / 1000 * 1000 };
            assert_eq!(recs[0].timestamp_ns, Some(scale(ts)));
            assert_eq!(recs[0].data, &frame[..60]);
            assert_eq!(recs[0].orig_len, 60);
            assert!(!recs[0].is_truncated());
            assert_eq!(recs[1].timestamp_ns, Some(scale(ts + 1_000)));
            assert_eq!(recs[1].data, &frame[..64], "cut to the snap length");
            assert_eq!(recs[1].orig_len, 100);
            assert!(recs[1].is_truncated());
            assert_eq!((recs[2].data, recs[2].orig_len), (&[][..], 0));
            assert_eq!(recs[2].timestamp(), Some(Instant::ZERO));
            assert_eq!(recs[3].timestamp(), Some(Instant::from_micros(2_500_001)));
            assert_eq!(recs[4].timestamp_ns, Some(scale(7)));
            for rec in &recs {
                assert_eq!((rec.link_type, rec.interface), (LinkType::ETHERNET, 0));
            }
        }
    }

    #[test]
    fn writer_saturates_seconds_past_the_field() {
        let w = Writer::ethernet();
        let mut out = Vec::new();
        w.write_header(&mut out);
        w.write_record(&mut out, u64::MAX, b"x");
        let rec = Reader::read_all(&out).unwrap()[0];
        assert_eq!(
            rec.timestamp_ns,
            Some(u64::from(u32::MAX) * NANOS_PER_SEC + u64::MAX % NANOS_PER_SEC)
        );
    }

    #[test]
    fn classic_both_byte_orders_read_alike() {
        let a = [0xaa; 42];
        let b = [0xbb; 7];
        let recs: &[(u32, u32, &[u8], u32)] = &[(10, 999_999, &a, 42), (11, 5, &b, 1500)];
        for nanos in [false, true] {
            let le = classic(Order::Little, nanos, 1, recs);
            let be = classic(Order::Big, nanos, 1, recs);
            let (rl, el) = read(&le);
            let (rb, eb) = read(&be);
            assert_eq!((el, eb), (None, None));
            assert_eq!(rl, rb);
            let frac = if nanos { 999_999 } else { 999_999_000 };
            assert_eq!(rl[0].timestamp_ns, Some(10 * NANOS_PER_SEC + frac));
            assert_eq!((rl[1].data, rl[1].orig_len), (&b[..], 1500));
            assert_eq!(
                Reader::new(&be).unwrap().format(),
                Format::Pcap {
                    nanos,
                    big_endian: true
                }
            );
        }
        // The link-type field's upper bits (FCS length) are not part of
        // the link type.
        let f = classic(Order::Big, false, 0x2000_0001, recs);
        assert_eq!(read(&f).0[0].link_type, LinkType::ETHERNET);
    }

    #[test]
    fn classic_malformed_headers() {
        use PcapErrorKind::*;
        let good = classic(Order::Little, false, 1, &[(1, 2, b"abcd", 4)]);
        assert_eq!(kind_at(&[]), Some((Truncated, 0)));
        assert_eq!(kind_at(&good[..3]), Some((Truncated, 0)));
        assert_eq!(
            kind_at(b"GIF89a, not a capture at all"),
            Some((UnknownMagic, 0))
        );
        for n in 4..24 {
            assert_eq!(kind_at(&good[..n]), Some((Truncated, 0)), "{n}");
        }
        let mut v3 = good.clone();
        v3[4] = 3;
        assert_eq!(kind_at(&v3), Some((UnsupportedVersion, 0)));
        // A captured length past the end of the file, however large.
        for incl in [5u32, 0x7fff_ffff, u32::MAX] {
            let mut f = good.clone();
            f[24 + 8..24 + 12].copy_from_slice(&incl.to_le_bytes());
            assert_eq!(kind_at(&f), Some((Truncated, 24)), "{incl}");
        }
    }

    #[test]
    fn classic_cut_anywhere_yields_whole_records_then_truncated() {
        let recs: &[(u32, u32, &[u8], u32)] =
            &[(1, 0, b"first", 5), (2, 0, b"", 0), (3, 0, b"third!", 6)];
        let f = classic(Order::Big, true, 1, recs);
        // Record starts: 24, 24 + 16 + 5, then + 16.
        let starts = [24usize, 45, 61, f.len()];
        for n in 24..=f.len() {
            let (got, e) = read(&f[..n]);
            let whole = starts.iter().filter(|&&s| s <= n).count() - 1;
            assert_eq!(got.len(), whole, "{n} bytes");
            if starts.contains(&n) {
                assert_eq!(e, None, "{n} bytes");
            } else {
                assert_eq!(e, Some(err(PcapErrorKind::Truncated, starts[whole])), "{n}");
            }
        }
    }

    // ------------------------------------------------------------ pcapng

    /// Three interfaces (Ethernet in microseconds, bare IP in nanoseconds
    /// with an offset, Ethernet in 1/1024 s), and packets on each between
    /// blocks the reader skips.
    fn two_interface_file(o: Order) -> Vec<u8> {
        let mut f = shb(o);
        f.extend(idb(o, 1, 0, &[(2, b"eth0")]));
        f.extend(block(o, 4, &[0; 8])); // name resolution
        f.extend(idb(o, 101, 128, &[(9, &[9]), (14, &put64(o, 100))]));
        f.extend(idb(o, 1, 0, &[(9, &[0x8a])]));
        f.extend(epb(o, 0, 1_700_000_000_000_001, b"frame on eth0", 60));
        f.extend(block(o, 0x0bad, b"custom block")); // unknown type
        f.extend(epb(o, 1, 5, b"raw ip", 6));
        f.extend(spb(o, 5, b"short"));
        f.extend(packet_block(o, true, 1, 7, b"old", 3));
        f.extend(epb(o, 2, 2048, b"", 0));
        f.extend(block(o, 5, &[0; 20])); // interface statistics
        f
    }

    #[test]
    fn pcapng_two_interfaces_both_byte_orders() {
        let le = two_interface_file(Order::Little);
        let be = two_interface_file(Order::Big);
        let (rl, el) = read(&le);
        let (rb, eb) = read(&be);
        assert_eq!((el, eb), (None, None));
        assert_eq!(rl, rb);
        assert_eq!(Reader::new(&be).unwrap().format(), Format::PcapNg);
        let summary: Vec<_> = rl
            .iter()
            .map(|r| (r.interface, r.link_type, r.timestamp_ns, r.data, r.orig_len))
            .collect();
        let eth = LinkType::ETHERNET;
        assert_eq!(
            summary,
            vec![
                (
                    0,
                    eth,
                    Some(1_700_000_000_000_001_000),
                    &b"frame on eth0"[..],
                    60
                ),
                (
                    1,
                    LinkType::RAW,
                    Some(100 * NANOS_PER_SEC + 5),
                    &b"raw ip"[..],
                    6
                ),
                (0, eth, None, &b"short"[..], 5),
                (
                    1,
                    LinkType::RAW,
                    Some(100 * NANOS_PER_SEC + 7),
                    &b"old"[..],
                    3
                ),
                (2, eth, Some(2 * NANOS_PER_SEC), &b""[..], 0),
            ]
        );
        assert!(rl[0].is_truncated());
        assert_eq!(rl[2].timestamp(), None);
    }

    #[test]
    fn pcapng_sections_each_declare_their_interfaces() {
        let mut f = shb(Order::Little);
        f.extend(idb(Order::Little, 1, 0, &[]));
        f.extend(epb(Order::Little, 0, 1, b"a", 1));
        let second = f.len();
        f.extend(shb(Order::Big));
        f.extend(idb(Order::Big, 228, 0, &[]));
        f.extend(epb(Order::Big, 0, 2, b"b", 1));
        let (recs, e) = read(&f);
        assert_eq!(e, None);
        assert_eq!(
            recs.iter().map(|r| r.link_type).collect::<Vec<_>>(),
            [LinkType::ETHERNET, LinkType::IPV4]
        );
        // Without its own description, the second section's packet names
        // an interface that does not exist there.
        let mut g = f[..second].to_vec();
        g.extend(shb(Order::Big));
        let at = g.len();
        g.extend(epb(Order::Big, 0, 2, b"b", 1));
        let (recs, e) = read(&g);
        assert_eq!(recs.len(), 1);
        assert_eq!(e, Some(err(PcapErrorKind::UnknownInterface, at)));
    }

    #[test]
    fn pcapng_simple_packets_take_interface_zero_snap_length() {
        let o = Order::Little;
        let mut f = shb(o);
        f.extend(idb(o, 1, 8, &[]));
        f.extend(spb(o, 20, b"12345678"));
        let (recs, e) = read(&f);
        assert_eq!(e, None);
        assert_eq!((recs[0].data, recs[0].orig_len), (&b"12345678"[..], 20));
        assert!(recs[0].is_truncated());
        // Snap length 0 is no limit: the block must then hold all 20.
        let mut g = shb(o);
        g.extend(idb(o, 1, 0, &[]));
        let at = g.len();
        g.extend(spb(o, 20, b"12345678"));
        assert_eq!(kind_at(&g), Some((PcapErrorKind::BadBlock, at)));
        // No interface at all.
        let mut h = shb(o);
        h.extend(spb(o, 2, b"ab"));
        assert_eq!(kind_at(&h), Some((PcapErrorKind::UnknownInterface, 28)));
    }

    #[test]
    fn pcapng_malformed_blocks() {
        use PcapErrorKind::*;
        let o = Order::Little;
        let head = {
            let mut f = shb(o);
            f.extend(idb(o, 1, 0, &[]));
            f
        };
        let n = head.len();
        let with = |extra: &[u8]| {
            let mut f = head.clone();
            f.extend_from_slice(extra);
            f
        };
        let mut cases: Vec<(&str, Vec<u8>, PcapErrorKind, usize)> = Vec::new();
        let mut f = shb(o);
        f[8] = 0x4e;
        cases.push(("byte-order magic", f, BadByteOrderMagic, 0));
        let mut f = shb(o);
        f[12] = 2;
        cases.push(("major version 2", f, UnsupportedVersion, 0));
        let mut f = shb(o);
        f[4] = 8;
        cases.push(("SHB length under 12", f, BadBlockLength, 0));
        let mut f = shb(o);
        f[4] = 30;
        cases.push(("SHB length not a multiple of 4", f, BadBlockLength, 0));
        let mut f = shb(o);
        let last = f.len() - 4;
        f[last] = 0;
        cases.push(("SHB trailing length differs", f, BadBlockLength, 0));
        let mut f = shb(o);
        f[4] = 200;
        cases.push(("SHB past the end", f, Truncated, 0));
        cases.push((
            "SHB body too short",
            block(o, 0x0a0d_0d0a, &put32(o, 0x1a2b_3c4d)),
            BadBlock,
            0,
        ));
        cases.push((
            "stray bytes after a block",
            with(&[6, 0, 0, 0, 0, 0]),
            Truncated,
            n,
        ));
        cases.push((
            "EPB body too short",
            with(&block(o, 6, &[0; 16])),
            BadBlock,
            n,
        ));
        let mut e = epb(o, 0, 0, b"abcd", 4);
        e[8 + 12] = 200;
        cases.push(("EPB captured length past the block", with(&e), BadBlock, n));
        cases.push((
            "EPB unknown interface",
            with(&epb(o, 5, 0, b"", 0)),
            UnknownInterface,
            n,
        ));
        cases.push((
            "obsolete PB unknown interface",
            with(&packet_block(o, true, 1, 0, b"", 0)),
            UnknownInterface,
            n,
        ));
        cases.push(("SPB body empty", with(&block(o, 3, &[])), BadBlock, n));
        cases.push((
            "IDB body too short",
            with(&block(o, 1, &[1, 0])),
            BadBlock,
            n,
        ));
        cases.push((
            "if_tsresol 10^-39",
            with(&idb(o, 1, 0, &[(9, &[39])])),
            BadOption,
            n,
        ));
        cases.push((
            "if_tsresol of 2 bytes",
            with(&idb(o, 1, 0, &[(9, &[6, 0])])),
            BadOption,
            n,
        ));
        cases.push((
            "if_tsoffset of 4 bytes",
            with(&idb(o, 1, 0, &[(14, &[0; 4])])),
            BadOption,
            n,
        ));
        let mut body = put16(o, 1).to_vec();
        body.extend_from_slice(&[0; 6]);
        body.extend_from_slice(&put16(o, 2));
        body.extend_from_slice(&put16(o, 40));
        cases.push((
            "option past the block",
            with(&block(o, 1, &body)),
            BadOption,
            n,
        ));
        for (what, file, kind, offset) in cases {
            assert_eq!(kind_at(&file), Some((kind, offset)), "{what}");
        }
        // 10^-38 still scales, and binary resolutions up to 2^-127 do.
        for r in [38u8, 0xff] {
            let mut f = with(&idb(o, 1, 0, &[(9, &[r])]));
            f.extend(epb(o, 1, 1 << 40, b"", 0));
            assert_eq!(read(&f), (read(&f).0, None));
            assert_eq!(read(&f).0[0].timestamp_ns, Some(0), "{r}");
        }
    }

    /// No prefix and no single-byte change of a valid file panics, and
    /// every read ends.
    #[test]
    fn damaged_files_never_panic() {
        let mut pcapng = two_interface_file(Order::Big);
        pcapng.extend(two_interface_file(Order::Little));
        let recs: &[(u32, u32, &[u8], u32)] = &[(1, 2, b"hello", 5), (3, 4, b"x", 70)];
        let files = [pcapng, classic(Order::Little, true, 1, recs)];
        for f in &files {
            for n in 0..f.len() {
                let _ = read(&f[..n]);
            }
            for at in 0..f.len() {
                for v in [0x00, 0xff, 0x7f, 0x80, 0x0c, f[at] ^ 1] {
                    let mut g = f.clone();
                    g[at] = v;
                    let (got, _) = read(&g);
                    assert!(got.len() <= 16);
                }
            }
        }
    }

    // -------------------------------------------------------- reassembly

    const CLIENT: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
    const SERVER: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 5000);
    const SYN: TcpFlags = TcpFlags::SYN;
    const ACK: TcpFlags = TcpFlags::ACK;

    fn frame_with(
        src: SocketAddrV4,
        dst: SocketAddrV4,
        seq: u32,
        flags: TcpFlags,
        payload: &[u8],
        vlan: Option<u16>,
    ) -> Vec<u8> {
        let tcp = TcpRepr {
            src_port: src.port(),
            dst_port: dst.port(),
            seq: SeqNumber(seq),
            ack_number: SeqNumber(0),
            flags,
            window: 1000,
            urgent: 0,
            options: TcpOptions::default(),
        };
        let ip = Ipv4Repr {
            src_addr: *src.ip(),
            dst_addr: *dst.ip(),
            next_header: IpProtocol::Tcp,
            payload_len: tcp.header_len() + payload.len(),
            hop_limit: 64,
            tos: 0,
            ident: 0,
            dont_frag: true,
        };
        let eth = EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: EtherType::Ipv4,
            vlan,
        };
        let hl = eth.header_len();
        let mut out = vec![0u8; hl + ip.buffer_len()];
        eth.emit(&mut out);
        ip.emit(&mut out[hl..]);
        let seg = &mut out[hl + ip.header_len()..];
        let (h, p) = seg.split_at_mut(tcp.header_len());
        p.copy_from_slice(payload);
        tcp.emit(h, *src.ip(), *dst.ip(), p);
        out
    }

    fn frame(
        src: SocketAddrV4,
        dst: SocketAddrV4,
        seq: u32,
        flags: TcpFlags,
        payload: &[u8],
    ) -> Vec<u8> {
        frame_with(src, dst, seq, flags, payload, None)
    }

    fn message(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 3) as u8).collect()
    }

    fn check_invariants(s: &Stream) {
        let missing: u64 = s.gaps.iter().map(|g| g.len).sum();
        assert_eq!(s.data.len() as u64 + missing, s.end());
        let pieces = s.pieces();
        let glued: Vec<u8> = pieces.iter().flat_map(|p| p.1.to_vec()).collect();
        assert_eq!(glued, s.data);
        for w in s.gaps.windows(2) {
            assert!(w[0].end() < w[1].start);
        }
    }

    #[test]
    fn reorders_retransmissions_and_overlaps_across_the_wrap() {
        let isn_c = 0xffff_fff0u32;
        let isn_s = 5000u32;
        let msg = message(40);
        let at = |off: u32| isn_c.wrapping_add(1).wrapping_add(off);
        let mut corrupt = msg[5..25].to_vec();
        corrupt[2] ^= 0xff; // offset 7, already held: the first copy stays
        let frames = [
            frame(CLIENT, SERVER, isn_c, SYN, &[]),
            frame(SERVER, CLIENT, isn_s, SYN | ACK, &[]),
            frame(CLIENT, SERVER, at(0), ACK, &[]),
            frame(CLIENT, SERVER, at(20), ACK, &msg[20..30]),
            frame(CLIENT, SERVER, at(0), ACK, &msg[..10]),
            frame(CLIENT, SERVER, at(5), ACK, &corrupt),
            frame(SERVER, CLIENT, isn_s + 1, ACK, b"ok!"),
            frame(CLIENT, SERVER, at(30), ACK, &msg[30..]),
            frame(CLIENT, SERVER, at(30), ACK, &msg[30..]),
            frame(CLIENT, SERVER, at(40), ACK | TcpFlags::FIN, &[]),
            // A retransmitted SYN-ACK changes nothing.
            frame(SERVER, CLIENT, isn_s, SYN | ACK, &[]),
        ];
        let mut r = Reassembler::new();
        for f in &frames {
            assert!(matches!(r.push_frame(f), Pushed::Tcp { .. }));
        }
        assert_eq!(r.stats().tcp, frames.len());
        let conns = r.finish();
        assert_eq!(conns.len(), 1);
        let [up, down] = &conns[0].streams;
        assert_eq!((up.src, up.dst), (CLIENT, SERVER));
        assert_eq!(up.isn, Some(SeqNumber(isn_c)));
        assert_eq!(up.data, msg);
        assert!(up.is_complete());
        assert_eq!(up.prefix(), &msg[..]);
        assert_eq!(up.fin, Some(40));
        assert_eq!(up.mismatched, 1);
        assert_eq!(up.frames, 8);
        let lens: Vec<_> = up.segments.iter().map(|s| (s.offset, s.len)).collect();
        assert_eq!(lens, [(20, 10), (0, 10), (5, 20), (30, 10), (30, 10)]);
        assert_eq!(down.data, b"ok!");
        assert_eq!((down.fin, down.reset), (None, false));
        assert_eq!(conns[0].from(SERVER), Some(down));
        check_invariants(up);
        check_invariants(down);
    }

    #[test]
    fn reports_gaps_instead_of_inventing_bytes() {
        let msg = message(50);
        let isn = 100u32;
        let at = |off: u32| isn + 1 + off;
        let mut w = Vec::new();
        let writer = Writer::ethernet();
        writer.write_header(&mut w);
        let snapped = frame(CLIENT, SERVER, at(30), ACK, &msg[30..40]);
        for f in [
            frame(CLIENT, SERVER, isn, SYN, &[]),
            frame(CLIENT, SERVER, at(0), ACK, &msg[..10]),
            // [10, 20) never captured.
            frame(CLIENT, SERVER, at(20), ACK, &msg[20..30]),
            frame(CLIENT, SERVER, at(40), ACK, &msg[40..]),
        ] {
            writer.write_record(&mut w, 0, &f);
        }
        // The snap length kept the headers and 4 octets of [30, 40).
        let cut = Writer::new(
            LinkType::ETHERNET,
            snapped.len() as u32 - 6,
            Precision::Nanos,
        );
        cut.write_record(&mut w, 0, &snapped);
        let recs = Reader::read_all(&w).unwrap();
        assert!(recs[4].is_truncated());
        let conns = Reassembler::from_records(recs);
        let s = &conns[0].streams[0];
        assert_eq!(
            s.gaps,
            [Gap { start: 10, len: 10 }, Gap { start: 34, len: 6 }]
        );
        assert_eq!(s.end(), 50);
        assert!(!s.is_complete());
        assert_eq!(s.prefix(), &msg[..10]);
        let pieces = s.pieces();
        assert_eq!(
            pieces,
            [(0, &msg[..10]), (20, &msg[20..34]), (40, &msg[40..])]
        );
        assert_eq!(
            s.segments[3],
            SegmentInfo {
                offset: 30,
                len: 10,
                captured: 4
            }
        );
        check_invariants(s);
        // A later whole copy fills the snapped tail.
        let mut r = Reassembler::new();
        for rec in Reader::read_all(&w).unwrap() {
            r.push_record(&rec);
        }
        r.push_frame(&snapped);
        let s = &r.finish()[0].streams[0];
        assert_eq!(s.gaps, [Gap { start: 10, len: 10 }]);
        check_invariants(s);
    }

    #[test]
    fn a_new_isn_on_a_known_four_tuple_is_a_new_connection() {
        let mut r = Reassembler::new();
        for (isn, data) in [(1000u32, &b"first"[..]), (9000, b"second")] {
            r.push_frame(&frame(CLIENT, SERVER, isn, SYN, &[]));
            r.push_frame(&frame(CLIENT, SERVER, isn, SYN, &[])); // retransmitted
            r.push_frame(&frame(SERVER, CLIENT, 77, SYN | ACK, &[]));
            r.push_frame(&frame(CLIENT, SERVER, isn + 1, ACK, data));
            r.push_frame(&frame(SERVER, CLIENT, 78, TcpFlags::RST, &[]));
        }
        let conns = r.finish();
        assert_eq!(conns.len(), 2);
        assert_eq!(conns[0].streams[0].data, b"first");
        assert_eq!(conns[1].streams[0].data, b"second");
        for c in &conns {
            assert_eq!(c.streams[0].frames, 3);
            assert!(c.streams[1].reset);
        }
    }

    #[test]
    fn payload_without_a_syn_is_counted_not_placed() {
        let mut r = Reassembler::new();
        // The capture started mid-connection: the server's side never
        // shows a SYN, the client's shows one only later (a new one).
        r.push_frame(&frame(SERVER, CLIENT, 500, ACK, b"mid-stream"));
        r.push_frame(&frame(CLIENT, SERVER, 40, ACK, b"also"));
        r.push_frame(&frame(CLIENT, SERVER, 99, SYN, b"syn data"));
        let conns = r.finish();
        assert_eq!(conns.len(), 1);
        let [srv, cli] = &conns[0].streams;
        assert_eq!((srv.src, srv.isn, srv.before_syn), (SERVER, None, 1));
        assert!(srv.data.is_empty() && srv.segments.is_empty());
        assert_eq!(cli.before_syn, 1);
        assert_eq!(cli.data, b"syn data", "data on a SYN starts at offset 0");
    }

    #[test]
    fn octets_before_the_origin_are_dropped() {
        let mut r = Reassembler::new();
        r.push_frame(&frame(CLIENT, SERVER, 10, SYN, &[]));
        r.push_frame(&frame(CLIENT, SERVER, 11, ACK, b"abc"));
        // A keep-alive probe: one garbage octet just before the next one
        // expected. Then a segment starting three octets before the
        // origin: those go, the rest overlaps and extends the stream.
        r.push_frame(&frame(CLIENT, SERVER, 13, ACK, b"Z"));
        r.push_frame(&frame(CLIENT, SERVER, 8, ACK, b"xyzabcde"));
        let s = &r.finish()[0].streams[0];
        assert_eq!(s.data, b"abcde");
        assert_eq!(s.mismatched, 1, "Z over c");
        assert_eq!(s.segments[1].offset, 2);
        assert_eq!(s.segments[2].offset, -3);
        check_invariants(s);
    }

    #[test]
    fn offsets_unwrap_past_four_gigabytes() {
        let mut d = DirectionState::new(CLIENT, SERVER);
        let isn = SeqNumber(7);
        d.end = 5_000_000_000;
        let seq = |off: u64| SeqNumber((off as u32).wrapping_add(8));
        assert_eq!(d.offset(isn, seq(5_000_000_100)), 5_000_000_100);
        assert_eq!(d.offset(isn, seq(4_999_999_000)), 4_999_999_000);
        d.end = 0;
        assert_eq!(d.offset(isn, SeqNumber(7)), -1);
    }

    #[test]
    fn other_frames_are_sorted_and_counted() {
        let mut r = Reassembler::new();
        let good = frame(CLIENT, SERVER, 1, SYN, &[]);
        assert_eq!(r.push_frame(&good), Pushed::Tcp { payload: 0 });
        let tagged = frame_with(CLIENT, SERVER, 2, ACK, b"v", Some(42));
        assert_eq!(r.push_frame(&tagged), Pushed::Tcp { payload: 1 });
        let mut arp = good.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(r.push_frame(&arp), Pushed::NotTcp);
        let mut udp = good.clone();
        udp[14 + 9] = 17;
        assert_eq!(r.push_frame(&udp), Pushed::NotTcp);
        let mut frag = good.clone();
        frag[14 + 6] = 0x20; // more fragments
        assert_eq!(r.push_frame(&frag), Pushed::Fragment);
        assert_eq!(
            r.push_frame(&good[..10]),
            Pushed::Malformed(WireError::Truncated)
        );
        assert_eq!(
            r.push_frame(&good[..14 + 19]),
            Pushed::Malformed(WireError::Truncated)
        );
        let mut v6 = good.clone();
        v6[14] = 0x65;
        assert_eq!(r.push_frame(&v6), Pushed::Malformed(WireError::BadVersion));
        let mut ihl = good.clone();
        ihl[14] = 0x44;
        assert_eq!(r.push_frame(&ihl), Pushed::Malformed(WireError::BadLength));
        let mut total = good.clone();
        total[14 + 2..14 + 4].copy_from_slice(&10u16.to_be_bytes());
        assert_eq!(
            r.push_frame(&total),
            Pushed::Malformed(WireError::BadLength)
        );
        assert_eq!(
            r.push_frame(&good[..14 + 20 + 12]),
            Pushed::Malformed(WireError::Truncated),
            "TCP header cut"
        );
        let mut doff = good.clone();
        doff[14 + 20 + 12] = 0x40;
        assert_eq!(r.push_frame(&doff), Pushed::Malformed(WireError::BadLength));
        let other_link = Record {
            timestamp_ns: None,
            link_type: LinkType(113),
            interface: 0,
            data: &good,
            orig_len: good.len() as u32,
        };
        assert_eq!(r.push_record(&other_link), Pushed::NotTcp);
        let raw = Record {
            link_type: LinkType::RAW,
            data: &good[14..],
            ..other_link
        };
        assert_eq!(r.push_record(&raw), Pushed::Tcp { payload: 0 });
        assert_eq!(
            r.stats(),
            ReassemblyStats {
                frames: 14,
                tcp: 3,
                not_tcp: 3,
                fragments: 1,
                malformed: 7,
            }
        );
        let conns = r.finish();
        assert_eq!(conns.len(), 1);
        assert_eq!(conns[0].streams[0].frames, 3);
        assert_eq!(conns[0].streams[0].isn, Some(SeqNumber(1)));
        assert_eq!(conns[0].streams[0].data, b"v");
    }
}
