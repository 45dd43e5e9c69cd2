//! TCP header (RFC 9293 §3.1) with the options seen in practice: MSS,
//! window scale and timestamps (RFC 7323), SACK-permitted and SACK blocks
//! (RFC 2018), NOP and EOL. The checksum covers the IPv4 pseudo-header.
//!
//! Parsed from the IPv4 payload of every received segment and written for
//! every transmitted one. Options are written in the order and alignment
//! Linux uses, so that captures of our traffic read like a kernel's; when
//! that aligned layout would exceed the 40 option bytes, a packed layout
//! without NOPs is used instead, and only then are SACK blocks dropped.

use core::net::Ipv4Addr;

use super::checksum;
use super::{Checksum, Result, WireError};
use crate::seq::SeqNumber;

/// TCP header flags, as the 9 low bits of the 13th–14th octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TcpFlags(pub u16);

impl TcpFlags {
    pub const FIN: TcpFlags = TcpFlags(0x001);
    pub const SYN: TcpFlags = TcpFlags(0x002);
    pub const RST: TcpFlags = TcpFlags(0x004);
    pub const PSH: TcpFlags = TcpFlags(0x008);
    pub const ACK: TcpFlags = TcpFlags(0x010);
    pub const URG: TcpFlags = TcpFlags(0x020);
    pub const ECE: TcpFlags = TcpFlags(0x040);
    pub const CWR: TcpFlags = TcpFlags(0x080);
    pub const NS: TcpFlags = TcpFlags(0x100);
    /// No flags.
    pub const NONE: TcpFlags = TcpFlags(0);

    /// Whether every flag in `other` is set in `self`.
    pub const fn contains(self, other: TcpFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for TcpFlags {
    type Output = TcpFlags;
    fn bitor(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 | rhs.0)
    }
}

impl core::ops::BitOrAssign for TcpFlags {
    fn bitor_assign(&mut self, rhs: TcpFlags) {
        self.0 |= rhs.0;
    }
}

/// The timestamps option (RFC 7323 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TcpTimestamp {
    pub tsval: u32,
    pub tsecr: u32,
}

/// Up to four SACK blocks `[left, right)`, in the order they appear on the
/// wire (the first is the most recently changed, RFC 2018 §4). A fixed
/// array, so that building an ACK allocates nothing. With timestamps on, at
/// most three fit in the 40 option bytes; `emit` writes as many as fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SackBlocks {
    blocks: [(SeqNumber, SeqNumber); 4],
    len: u8,
}

impl SackBlocks {
    /// Maximum number of blocks a header can carry.
    pub const MAX: usize = 4;

    /// No blocks.
    pub const fn new() -> SackBlocks {
        SackBlocks {
            blocks: [(SeqNumber(0), SeqNumber(0)); 4],
            len: 0,
        }
    }

    /// Appends a block; returns `false` (and keeps the list) when full.
    pub fn push(&mut self, left: SeqNumber, right: SeqNumber) -> bool {
        if usize::from(self.len) == Self::MAX {
            return false;
        }
        self.blocks[usize::from(self.len)] = (left, right);
        self.len += 1;
        true
    }

    /// The blocks, first on the wire first.
    pub fn as_slice(&self) -> &[(SeqNumber, SeqNumber)] {
        &self.blocks[..usize::from(self.len)]
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The options of one segment. Unknown options are skipped on parse and
/// never emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TcpOptions {
    /// Maximum segment size (kind 2), SYN only.
    pub mss: Option<u16>,
    /// Window scale shift (kind 3), SYN only. Values above 14 are kept as
    /// received; the engine clamps them (RFC 7323 §2.3).
    pub window_scale: Option<u8>,
    /// SACK permitted (kind 4), SYN only.
    pub sack_permitted: bool,
    /// SACK blocks (kind 5).
    pub sack: SackBlocks,
    /// Timestamps (kind 8).
    pub timestamp: Option<TcpTimestamp>,
}

/// A validated TCP header. The payload is not part of the representation:
/// it stays in the buffer it arrived in (see [`TcpPacket::payload`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TcpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: SeqNumber,
    /// The acknowledgment field as on the wire; meaningful only when
    /// `flags` has ACK (see [`TcpRepr::ack`]).
    pub ack_number: SeqNumber,
    pub flags: TcpFlags,
    /// The window field as on the wire, before scaling.
    pub window: u16,
    pub urgent: u16,
    pub options: TcpOptions,
}

impl TcpRepr {
    /// The acknowledgment number if the ACK flag is set.
    pub fn ack(&self) -> Option<SeqNumber> {
        if self.flags.contains(TcpFlags::ACK) {
            Some(self.ack_number)
        } else {
            None
        }
    }

    /// Sequence space the segment occupies: payload plus one for SYN and
    /// one for FIN.
    pub fn segment_len(&self, payload_len: usize) -> usize {
        payload_len
            + usize::from(self.flags.contains(TcpFlags::SYN))
            + usize::from(self.flags.contains(TcpFlags::FIN))
    }
}

mod field {
    use core::ops::Range;

    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const SEQ: Range<usize> = 4..8;
    pub const ACK: Range<usize> = 8..12;
    /// Data offset (high nibble) and the NS flag (bit 0).
    pub const OFF_NS: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WINDOW: Range<usize> = 14..16;
    pub const CHECKSUM: Range<usize> = 16..18;
    pub const URGENT: Range<usize> = 18..20;
}

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;
/// Most option bytes a header can carry (data offset 15).
pub const MAX_OPTIONS_LEN: usize = 40;

/// Option kinds (IANA "TCP Option Kind Numbers").
mod kind {
    pub const EOL: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WINDOW_SCALE: u8 = 3;
    pub const SACK_PERMITTED: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TIMESTAMP: u8 = 8;
}

/// A read-only or read-write view of a TCP header and its payload.
#[derive(Debug, Clone)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Wraps a buffer without checking it. Accessors may panic until
    /// [`TcpPacket::check_len`] has succeeded; use `new_checked`.
    pub const fn new_unchecked(buffer: T) -> TcpPacket<T> {
        TcpPacket { buffer }
    }

    /// Wraps a buffer after checking that the fixed header and the header
    /// length given by the data offset fit.
    pub fn new_checked(buffer: T) -> Result<TcpPacket<T>> {
        let p = TcpPacket::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validates the lengths: a 20-byte fixed header
    /// ([`WireError::Truncated`]), a data offset of at least 5
    /// ([`WireError::BadLength`]), and the whole header in the buffer
    /// (`Truncated`). See [`TcpPacket::new_checked`].
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let hl = usize::from(b[field::OFF_NS] >> 4) * 4;
        if hl < HEADER_LEN {
            return Err(WireError::BadLength);
        }
        if b.len() < hl {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    fn u32_at(&self, r: core::ops::Range<usize>) -> u32 {
        let b = &self.buffer.as_ref()[r];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC_PORT)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST_PORT)
    }

    /// Sequence number.
    pub fn seq_number(&self) -> SeqNumber {
        SeqNumber(self.u32_at(field::SEQ))
    }

    /// Acknowledgment number field, whether or not ACK is set.
    pub fn ack_number(&self) -> SeqNumber {
        SeqNumber(self.u32_at(field::ACK))
    }

    /// Header length in bytes, options included.
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::OFF_NS] >> 4) * 4
    }

    /// The nine flag bits. The three reserved bits are not included.
    pub fn flags(&self) -> TcpFlags {
        let b = self.buffer.as_ref();
        TcpFlags((u16::from(b[field::OFF_NS] & 0x01) << 8) | u16::from(b[field::FLAGS]))
    }

    /// Window field, before scaling.
    pub fn window_len(&self) -> u16 {
        self.u16_at(field::WINDOW)
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Urgent pointer.
    pub fn urgent_at(&self) -> u16 {
        self.u16_at(field::URGENT)
    }

    /// The option bytes, between the fixed header and the payload.
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// Whether the checksum over the pseudo-header and the whole buffer
    /// (header and payload) verifies.
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        self.verify_checksum_with(src, dst, checksum::sum)
    }

    /// [`TcpPacket::verify_checksum`] with the bytes summed by `sum`, a
    /// function with [`checksum::sum`]'s result.
    pub fn verify_checksum_with(
        &self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        sum: fn(&[u8]) -> u32,
    ) -> bool {
        let b = self.buffer.as_ref();
        let s = checksum::combine(
            checksum::pseudo_header(src, dst, PROTOCOL_TCP, b.len()),
            sum(b),
        );
        checksum::verifies(s)
    }
}

/// The IPv4 protocol number of TCP, for the pseudo-header.
const PROTOCOL_TCP: u8 = 6;

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    fn set_u16_at(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        self.set_u16_at(field::SRC_PORT, v);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        self.set_u16_at(field::DST_PORT, v);
    }

    /// Sets the sequence number.
    pub fn set_seq_number(&mut self, v: SeqNumber) {
        self.buffer.as_mut()[field::SEQ].copy_from_slice(&v.0.to_be_bytes());
    }

    /// Sets the acknowledgment number field.
    pub fn set_ack_number(&mut self, v: SeqNumber) {
        self.buffer.as_mut()[field::ACK].copy_from_slice(&v.0.to_be_bytes());
    }

    /// Sets the header length in bytes (a multiple of 4, at most 60),
    /// keeping the NS flag and clearing the reserved bits.
    pub fn set_header_len(&mut self, len: usize) {
        // The data offset is a 4-bit field; larger values are a caller bug
        // and are masked rather than spilling into the flags.
        let off = ((len / 4) & 0x0f) as u8;
        let b = self.buffer.as_mut();
        b[field::OFF_NS] = (off << 4) | (b[field::OFF_NS] & 0x01);
    }

    /// Sets the nine flag bits, keeping the data offset.
    pub fn set_flags(&mut self, flags: TcpFlags) {
        let b = self.buffer.as_mut();
        // NS is bit 8 and lives in the data-offset octet; the low eight
        // flags fill the next octet. Truncations are the field split.
        b[field::OFF_NS] = (b[field::OFF_NS] & 0xf0) | ((flags.0 >> 8) & 0x01) as u8;
        b[field::FLAGS] = (flags.0 & 0xff) as u8;
    }

    /// Sets the window field.
    pub fn set_window_len(&mut self, v: u16) {
        self.set_u16_at(field::WINDOW, v);
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16_at(field::CHECKSUM, v);
    }

    /// Sets the urgent pointer.
    pub fn set_urgent_at(&mut self, v: u16) {
        self.set_u16_at(field::URGENT, v);
    }

    /// The option bytes, mutable.
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[HEADER_LEN..hl]
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[hl..]
    }

    /// Computes and stores the checksum over the pseudo-header and the whole
    /// buffer, which must then hold exactly the segment.
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let b = self.buffer.as_ref();
        let s = checksum::combine(
            checksum::pseudo_header(src, dst, PROTOCOL_TCP, b.len()),
            checksum::sum(b),
        );
        self.set_checksum(checksum::finish(s));
    }
}

/// Parses the option bytes of a header (RFC 9293 §3.2). Parsing stops at
/// EOL; unknown kinds with a sane length are skipped; a length under 2, one
/// that runs past the header, or one that is wrong for a known kind is
/// [`WireError::BadOption`]. A repeated option replaces the earlier one.
/// Always inlined into [`TcpRepr::parse_with`], for the reason given there.
#[inline(always)]
fn parse_options(opts: &[u8]) -> Result<TcpOptions> {
    // The options of every segment after the handshake between peers
    // that use timestamps (RFC 7323 Appendix A's layout): taken whole,
    // without the general loop.
    if let [kind::NOP, kind::NOP, kind::TIMESTAMP, 10, a, b, c, d, e, f, g, h] = *opts {
        return Ok(TcpOptions {
            timestamp: Some(TcpTimestamp {
                tsval: u32::from_be_bytes([a, b, c, d]),
                tsecr: u32::from_be_bytes([e, f, g, h]),
            }),
            ..TcpOptions::default()
        });
    }
    parse_options_in_turn(opts)
}

/// [`parse_options`] for any layout: option by option.
fn parse_options_in_turn(mut opts: &[u8]) -> Result<TcpOptions> {
    let mut o = TcpOptions::default();
    while let Some(&k) = opts.first() {
        match k {
            kind::EOL => break,
            kind::NOP => {
                opts = &opts[1..];
                continue;
            }
            _ => {}
        }
        let len = match opts.get(1) {
            Some(&l) => usize::from(l),
            None => return Err(WireError::BadOption),
        };
        if len < 2 || len > opts.len() {
            return Err(WireError::BadOption);
        }
        let data = &opts[2..len];
        match k {
            kind::MSS => match *data {
                [a, b] => o.mss = Some(u16::from_be_bytes([a, b])),
                _ => return Err(WireError::BadOption),
            },
            kind::WINDOW_SCALE => match *data {
                [shift] => o.window_scale = Some(shift),
                _ => return Err(WireError::BadOption),
            },
            kind::SACK_PERMITTED => {
                if !data.is_empty() {
                    return Err(WireError::BadOption);
                }
                o.sack_permitted = true;
            }
            kind::SACK => {
                if data.is_empty() || data.len() % 8 != 0 || data.len() / 8 > SackBlocks::MAX {
                    return Err(WireError::BadOption);
                }
                let mut sack = SackBlocks::new();
                for b in data.chunks_exact(8) {
                    let left = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                    let right = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
                    sack.push(SeqNumber(left), SeqNumber(right));
                }
                o.sack = sack;
            }
            kind::TIMESTAMP => match *data {
                [a, b, c, d, e, f, g, h] => {
                    o.timestamp = Some(TcpTimestamp {
                        tsval: u32::from_be_bytes([a, b, c, d]),
                        tsecr: u32::from_be_bytes([e, f, g, h]),
                    });
                }
                _ => return Err(WireError::BadOption),
            },
            _ => {}
        }
        opts = &opts[len..];
    }
    Ok(o)
}

/// How the options of one header are laid out on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OptionLayout {
    /// Without NOP alignment; only when the aligned layout would have to
    /// drop more SACK blocks.
    packed: bool,
    /// SACK blocks written.
    sack_blocks: usize,
    /// Option bytes, padded to a multiple of 4.
    len: usize,
}

impl TcpOptions {
    /// Option bytes in Linux's aligned layout with `n` SACK blocks: MSS,
    /// then SACK-permitted and timestamps (the SACK-permitted option fills
    /// the NOPs that would otherwise align the timestamps), then NOP and
    /// window scale, then NOP NOP and the SACK blocks. Always a multiple of
    /// 4.
    fn aligned_len(&self, n: usize) -> usize {
        let mut len = 0;
        if self.mss.is_some() {
            len += 4;
        }
        if self.timestamp.is_some() {
            len += 12;
        } else if self.sack_permitted {
            len += 4;
        }
        if self.window_scale.is_some() {
            len += 4;
        }
        if n > 0 {
            len += 4 + 8 * n;
        }
        len
    }

    /// Option bytes with each option at its bare size and `n` SACK blocks,
    /// padded to a multiple of 4.
    fn packed_len(&self, n: usize) -> usize {
        let mut len = 0;
        if self.mss.is_some() {
            len += 4;
        }
        if self.sack_permitted {
            len += 2;
        }
        if self.timestamp.is_some() {
            len += 10;
        }
        if self.window_scale.is_some() {
            len += 3;
        }
        if n > 0 {
            len += 2 + 8 * n;
        }
        len.next_multiple_of(4)
    }

    fn layout(&self) -> OptionLayout {
        let n = self.sack.len();
        let aligned = |n| OptionLayout {
            packed: false,
            sack_blocks: n,
            len: self.aligned_len(n),
        };
        if self.aligned_len(n) <= MAX_OPTIONS_LEN {
            return aligned(n);
        }
        // Without SACK blocks the aligned layout takes at most 20 bytes, so
        // both searches end at a fitting count.
        let fits_aligned = (0..=n)
            .rev()
            .find(|&k| self.aligned_len(k) <= MAX_OPTIONS_LEN)
            .unwrap_or(0);
        let fits_packed = (0..=n)
            .rev()
            .find(|&k| self.packed_len(k) <= MAX_OPTIONS_LEN)
            .unwrap_or(0);
        if fits_packed > fits_aligned {
            OptionLayout {
                packed: true,
                sack_blocks: fits_packed,
                len: self.packed_len(fits_packed),
            }
        } else {
            aligned(fits_aligned)
        }
    }

    /// Writes the options into `buf[..layout.len]`.
    fn emit(&self, layout: OptionLayout, buf: &mut [u8]) {
        let buf = &mut buf[..layout.len];
        let mut w = OptionWriter { buf, at: 0 };
        if let Some(mss) = self.mss {
            w.put(&[kind::MSS, 4]);
            w.put(&mss.to_be_bytes());
        }
        if layout.packed {
            if self.sack_permitted {
                w.put(&[kind::SACK_PERMITTED, 2]);
            }
            if let Some(ts) = self.timestamp {
                w.timestamp(ts);
            }
            if let Some(shift) = self.window_scale {
                w.put(&[kind::WINDOW_SCALE, 3, shift]);
            }
            w.sack(&self.sack.as_slice()[..layout.sack_blocks]);
            // Pad with EOL (zero bytes) to the 32-bit boundary.
            while w.at < layout.len {
                w.put(&[kind::EOL]);
            }
        } else {
            match (self.timestamp, self.sack_permitted) {
                (Some(ts), true) => {
                    w.put(&[kind::SACK_PERMITTED, 2]);
                    w.timestamp(ts);
                }
                (Some(ts), false) => {
                    w.put(&[kind::NOP, kind::NOP]);
                    w.timestamp(ts);
                }
                (None, true) => w.put(&[kind::NOP, kind::NOP, kind::SACK_PERMITTED, 2]),
                (None, false) => {}
            }
            if let Some(shift) = self.window_scale {
                w.put(&[kind::NOP, kind::WINDOW_SCALE, 3, shift]);
            }
            if layout.sack_blocks > 0 {
                w.put(&[kind::NOP, kind::NOP]);
                w.sack(&self.sack.as_slice()[..layout.sack_blocks]);
            }
        }
        debug_assert_eq!(w.at, layout.len);
    }
}

/// Sequential writer over the option area.
struct OptionWriter<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl OptionWriter<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }

    fn timestamp(&mut self, ts: TcpTimestamp) {
        self.put(&[kind::TIMESTAMP, 10]);
        self.put(&ts.tsval.to_be_bytes());
        self.put(&ts.tsecr.to_be_bytes());
    }

    fn sack(&mut self, blocks: &[(SeqNumber, SeqNumber)]) {
        if blocks.is_empty() {
            return;
        }
        // At most four blocks are ever written: 2 + 32 fits in a u8.
        self.put(&[kind::SACK, (2 + 8 * blocks.len()) as u8]);
        for &(l, r) in blocks {
            self.put(&l.0.to_be_bytes());
            self.put(&r.0.to_be_bytes());
        }
    }
}

impl TcpRepr {
    /// Parses and validates a TCP header. `src` and `dst` are the IPv4
    /// addresses for the pseudo-header checksum; the packet must span
    /// exactly the TCP header and payload (the IPv4 payload).
    ///
    /// Checked in order: the lengths of [`TcpPacket::check_len`], the
    /// checksum unless `checksum` is [`Checksum::Trusted`]
    /// ([`WireError::BadChecksum`]), then the options
    /// ([`WireError::BadOption`]).
    pub fn parse<T: AsRef<[u8]>>(
        packet: &TcpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        checksum: Checksum,
    ) -> Result<TcpRepr> {
        TcpRepr::parse_with(packet, src, dst, checksum, checksum::sum)
    }

    /// [`TcpRepr::parse`] with the checksum's bytes summed by `sum`, a
    /// function with [`checksum::sum`]'s result.
    ///
    /// Always inlined, as [`Ipv4Repr::parse`](super::Ipv4Repr::parse):
    /// called, it returned its `Result` through memory, which the caller
    /// read back in wider words than the stores that wrote it. Such a
    /// load cannot take its bytes from the store buffer and waits until
    /// the stores reach the cache, once per received frame: the two
    /// waits (IPv4 and TCP) were half of the receive path's samples in
    /// `Interface::handle_frame_with`, and the bandwidth rounds at MTU
    /// 1500, receiver-bound, gained 1-8 % without them.
    #[inline(always)]
    pub fn parse_with<T: AsRef<[u8]>>(
        packet: &TcpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        checksum: Checksum,
        sum: fn(&[u8]) -> u32,
    ) -> Result<TcpRepr> {
        packet.check_len()?;
        if checksum == Checksum::Verify && !packet.verify_checksum_with(src, dst, sum) {
            return Err(WireError::BadChecksum);
        }
        let options = parse_options(packet.options())?;
        Ok(TcpRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            seq: packet.seq_number(),
            ack_number: packet.ack_number(),
            flags: packet.flags(),
            window: packet.window_len(),
            urgent: packet.urgent_at(),
            options,
        })
    }

    /// Length of the header this representation emits, options and padding
    /// included.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.options.layout().len
    }

    /// How many of `options.sack` blocks [`TcpRepr::emit`] writes: all of
    /// them unless, with the other options, they exceed the 40 option
    /// bytes (with timestamps, at most three fit).
    pub fn emitted_sack_blocks(&self) -> usize {
        self.options.layout().sack_blocks
    }

    /// Writes the header into `buf[..self.header_len()]` and the checksum
    /// over the pseudo-header, the header and `payload`. The payload itself
    /// is not copied: callers place it after the header (or attach it, in
    /// the zero-copy path).
    ///
    /// # Panics
    /// If `buf` is shorter than [`TcpRepr::header_len`].
    pub fn emit(&self, buf: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) {
        self.emit_with_payload_sum(buf, src, dst, payload.len(), checksum::sum(payload));
    }

    /// Like [`TcpRepr::emit`], for a payload that is not at hand as one
    /// slice: `payload_sum` is its partial sum ([`checksum::sum`], or
    /// several combined with [`checksum::combine_at`]) taken as if it
    /// started at offset 0. The header length is a multiple of 4, so the
    /// payload's alignment in the segment is even and the sum combines as
    /// is.
    ///
    /// # Panics
    /// If `buf` is shorter than [`TcpRepr::header_len`].
    pub fn emit_with_payload_sum(
        &self,
        buf: &mut [u8],
        src: Ipv4Addr,
        dst: Ipv4Addr,
        payload_len: usize,
        payload_sum: u32,
    ) {
        let layout = self.options.layout();
        let hl = HEADER_LEN + layout.len;
        let buf = &mut buf[..hl];
        // The fixed header is assembled in a local array and summed from
        // the field values (as `Ipv4Repr::emit` does, and for the same
        // reason: summing bytes just stored field by field stalls on
        // every frame); only the options are summed from the buffer.
        // The data offset is a 4-bit field, the flags nine bits (NS in
        // the offset's octet).
        let off_flags = ((((hl / 4) & 0x0f) as u16) << 12) | (self.flags.0 & 0x01ff);
        let (seq, ack) = (self.seq.0, self.ack_number.0);
        let fixed_sum = u32::from(self.src_port)
            + u32::from(self.dst_port)
            + (seq >> 16)
            + (seq & 0xffff)
            + (ack >> 16)
            + (ack & 0xffff)
            + u32::from(off_flags)
            + u32::from(self.window)
            + u32::from(self.urgent);
        let (sp, dp) = (self.src_port.to_be_bytes(), self.dst_port.to_be_bytes());
        let (sq, ak) = (seq.to_be_bytes(), ack.to_be_bytes());
        let (of, w, u) = (
            off_flags.to_be_bytes(),
            self.window.to_be_bytes(),
            self.urgent.to_be_bytes(),
        );
        let fixed: [u8; HEADER_LEN] = [
            sp[0], sp[1], dp[0], dp[1], sq[0], sq[1], sq[2], sq[3], ak[0], ak[1], ak[2], ak[3],
            of[0], of[1], w[0], w[1], 0, 0, u[0], u[1],
        ];
        buf[..HEADER_LEN].copy_from_slice(&fixed);
        let options = &mut buf[HEADER_LEN..];
        self.options.emit(layout, options);
        let header_sum = checksum::combine(fixed_sum, checksum::sum(options));
        let s = checksum::combine(
            checksum::combine(
                checksum::pseudo_header(src, dst, PROTOCOL_TCP, hl + payload_len),
                header_sum,
            ),
            payload_sum,
        );
        buf[field::CHECKSUM].copy_from_slice(&checksum::finish(s).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SRC: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 12);
    const DST: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 11);

    fn syn() -> TcpRepr {
        TcpRepr {
            src_port: 47564,
            dst_port: 7174,
            seq: SeqNumber(0x1234_5678),
            ack_number: SeqNumber(0),
            flags: TcpFlags::SYN,
            window: 64240,
            urgent: 0,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                sack: SackBlocks::new(),
                timestamp: Some(TcpTimestamp {
                    tsval: 0xdead_beef,
                    tsecr: 0,
                }),
            },
        }
    }

    fn blocks(n: usize) -> SackBlocks {
        let mut s = SackBlocks::new();
        for i in 0..n {
            let base = 1000 * (i as u32 + 1);
            s.push(SeqNumber(base), SeqNumber(base + 500));
        }
        s
    }

    /// A segment with the given option bytes (padded with EOL) and payload,
    /// with a correct checksum.
    fn segment(opts: &[u8], payload: &[u8]) -> Vec<u8> {
        let ol = opts.len().next_multiple_of(4);
        let mut b = vec![0u8; HEADER_LEN + ol];
        b[HEADER_LEN..HEADER_LEN + opts.len()].copy_from_slice(opts);
        b.extend_from_slice(payload);
        let mut p = TcpPacket::new_unchecked(&mut b[..]);
        p.set_src_port(1);
        p.set_dst_port(2);
        p.set_header_len(HEADER_LEN + ol);
        p.set_flags(TcpFlags::ACK);
        p.fill_checksum(SRC, DST);
        b
    }

    fn parse(b: &[u8]) -> Result<TcpRepr> {
        TcpRepr::parse(&TcpPacket::new_unchecked(b), SRC, DST, Checksum::Verify)
    }

    fn emit(r: &TcpRepr, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; r.header_len() + payload.len()];
        let (h, p) = b.split_at_mut(r.header_len());
        p.copy_from_slice(payload);
        r.emit(h, SRC, DST, p);
        b
    }

    #[test]
    fn linux_syn_layout() {
        let b = emit(&syn(), &[]);
        assert_eq!(b.len(), 40);
        assert_eq!(
            &b[20..],
            &[2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 1, 3, 3, 7]
        );
        assert_eq!(parse(&b), Ok(syn()));
    }

    #[test]
    fn aligned_layouts() {
        let mut r = syn();
        r.options.sack_permitted = false;
        assert_eq!(&emit(&r, &[])[20..28], &[2, 4, 0x05, 0xb4, 1, 1, 8, 10]);
        r.options.timestamp = None;
        r.options.sack_permitted = true;
        assert_eq!(
            &emit(&r, &[])[20..],
            &[2, 4, 0x05, 0xb4, 1, 1, 4, 2, 1, 3, 3, 7]
        );
        // An ACK with timestamps and SACK blocks.
        let mut r = syn();
        r.flags = TcpFlags::ACK;
        r.options = TcpOptions {
            timestamp: Some(TcpTimestamp { tsval: 1, tsecr: 2 }),
            sack: blocks(1),
            ..TcpOptions::default()
        };
        let b = emit(&r, &[]);
        assert_eq!(
            &b[20..],
            &[
                1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 1, 5, 10, 0, 0, 0x03, 0xe8, 0, 0, 0x05,
                0xdc
            ]
        );
        assert_eq!(parse(&b), Ok(r));
    }

    #[test]
    fn sack_blocks_within_budget() {
        let mut r = syn();
        r.flags = TcpFlags::ACK;
        r.options = TcpOptions {
            timestamp: Some(TcpTimestamp { tsval: 1, tsecr: 2 }),
            sack: blocks(4),
            ..TcpOptions::default()
        };
        // Timestamps and four blocks: three fit, aligned, in exactly 40.
        assert_eq!(r.emitted_sack_blocks(), 3);
        assert_eq!(r.header_len(), 60);
        let got = parse(&emit(&r, &[])).unwrap();
        assert_eq!(got.options.sack.as_slice(), &r.options.sack.as_slice()[..3]);
        // Without timestamps all four fit.
        r.options.timestamp = None;
        assert_eq!(r.emitted_sack_blocks(), 4);
        assert_eq!(parse(&emit(&r, &[])), Ok(r));
        // MSS, timestamps and three blocks take 40 bytes only when packed.
        r.options.mss = Some(1460);
        r.options.timestamp = Some(TcpTimestamp { tsval: 1, tsecr: 2 });
        r.options.sack = blocks(3);
        assert_eq!(r.emitted_sack_blocks(), 3);
        let b = emit(&r, &[]);
        assert_eq!(b.len(), 60);
        assert_eq!(&b[20..26], &[2, 4, 0x05, 0xb4, 8, 10]);
        assert_eq!(parse(&b), Ok(r));
        // Everything at once: the packed layout keeps two blocks.
        r.options.window_scale = Some(14);
        r.options.sack_permitted = true;
        r.options.sack = blocks(4);
        assert_eq!(r.emitted_sack_blocks(), 2);
        assert!(r.header_len() <= 60);
    }

    #[test]
    fn payload_sum_matches_emit() {
        let payload: Vec<u8> = (0..1449u32).map(|i| (i * 7) as u8).collect();
        let r = syn();
        let a = emit(&r, &payload);
        let mut h = vec![0u8; r.header_len()];
        // The payload summed in two pieces, the second at an odd offset.
        let s = checksum::combine_at(
            checksum::sum(&payload[..333]),
            checksum::sum(&payload[333..]),
            333,
        );
        r.emit_with_payload_sum(&mut h, SRC, DST, payload.len(), s);
        assert_eq!(&a[..r.header_len()], &h[..]);
        let p = TcpPacket::new_checked(&a[..]).unwrap();
        assert!(p.verify_checksum(SRC, DST));
        assert_eq!(p.payload(), &payload[..]);
    }

    #[test]
    fn accessors_and_flags() {
        let mut r = syn();
        r.flags = TcpFlags::SYN | TcpFlags::ACK | TcpFlags::ECE | TcpFlags::CWR | TcpFlags::NS;
        r.ack_number = SeqNumber(77);
        r.urgent = 9;
        let b = emit(&r, b"xy");
        let p = TcpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(p.src_port(), 47564);
        assert_eq!(p.dst_port(), 7174);
        assert_eq!(p.seq_number(), SeqNumber(0x1234_5678));
        assert_eq!(p.ack_number(), SeqNumber(77));
        assert_eq!(p.flags(), r.flags);
        assert_eq!(b[12], 0xa1);
        assert_eq!(p.window_len(), 64240);
        assert_eq!(p.urgent_at(), 9);
        assert_eq!(p.options().len(), 20);
        assert_eq!(p.payload(), b"xy");
        let got = parse(&b).unwrap();
        assert_eq!(got.ack(), Some(SeqNumber(77)));
        assert_eq!(got.segment_len(2), 3);
    }

    #[test]
    fn truncated_at_every_length() {
        let b = emit(&syn(), &[]);
        for n in 0..b.len() {
            assert_eq!(parse(&b[..n]), Err(WireError::Truncated), "len {n}");
        }
    }

    #[test]
    fn bad_data_offset() {
        for off in 0..5u8 {
            let mut b = segment(&[], b"abcd");
            b[12] = off << 4;
            assert_eq!(parse(&b), Err(WireError::BadLength), "offset {off}");
        }
    }

    #[test]
    fn bad_checksum_every_bit() {
        let b = emit(&syn(), b"hello");
        for bit in 0..b.len() * 8 {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            let r = parse(&c);
            if bit / 8 == 12 && bit % 8 >= 4 {
                // The data offset: a length error, or a checksum error.
                assert!(
                    matches!(
                        r,
                        Err(WireError::BadLength | WireError::Truncated | WireError::BadChecksum)
                    ),
                    "bit {bit}: {r:?}"
                );
            } else {
                assert_eq!(r, Err(WireError::BadChecksum), "bit {bit}");
            }
        }
        let mut c = b.clone();
        c[30] ^= 0x10;
        assert!(TcpRepr::parse(
            &TcpPacket::new_unchecked(&c[..]),
            SRC,
            DST,
            Checksum::Trusted
        )
        .is_ok());
        // A checksum for other addresses does not verify.
        assert_eq!(
            TcpRepr::parse(
                &TcpPacket::new_unchecked(&b[..]),
                DST,
                SRC,
                Checksum::Verify
            )
            .map(|_| ()),
            Ok(()),
            "swapping the addresses keeps the one's-complement sum"
        );
        assert_eq!(
            TcpRepr::parse(
                &TcpPacket::new_unchecked(&b[..]),
                Ipv4Addr::new(10, 77, 0, 13),
                DST,
                Checksum::Verify
            ),
            Err(WireError::BadChecksum)
        );
    }

    #[test]
    fn bad_option_lengths() {
        let cases: &[(&str, &[u8])] = &[
            ("length 0", &[kind::MSS, 0, 5, 0xb4]),
            ("length 1", &[99, 1, 0, 0]),
            ("unknown kind too long", &[99, 9, 0, 0]),
            (
                "kind without length",
                &[kind::NOP, kind::NOP, kind::NOP, kind::MSS],
            ),
            ("MSS length 3", &[kind::MSS, 3, 5, 0]),
            ("MSS length 5", &[kind::MSS, 5, 5, 0xb4, 0, 0, 0, 0]),
            ("window scale length 4", &[kind::WINDOW_SCALE, 4, 7, 0]),
            ("SACK-permitted length 3", &[kind::SACK_PERMITTED, 3, 0, 0]),
            ("SACK length 7", &[kind::SACK, 7, 0, 0, 0, 1, 0, 0]),
            ("SACK length 2", &[kind::SACK, 2, 0, 0]),
            (
                "timestamps length 8",
                &[kind::TIMESTAMP, 8, 0, 0, 0, 1, 0, 0],
            ),
            (
                "timestamps past header",
                &[1, 1, kind::TIMESTAMP, 10, 0, 0, 0, 1],
            ),
        ];
        for (what, opts) in cases {
            assert_eq!(
                parse(&segment(opts, b"")),
                Err(WireError::BadOption),
                "{what}"
            );
        }
        // A SACK option claiming five blocks (42 bytes) runs past the
        // largest possible option area.
        let mut opts = vec![kind::SACK, 42];
        opts.extend_from_slice(&[0; 38]);
        assert_eq!(parse(&segment(&opts, b"")), Err(WireError::BadOption));
    }

    #[test]
    fn the_timestamp_layout_parses_as_the_general_loop_does() {
        let ts = [1, 1, 8, 10, 0x80, 2, 3, 4, 5, 6, 7, 0xff];
        let fast = parse_options(&ts).unwrap();
        assert_eq!(
            fast.timestamp,
            Some(TcpTimestamp {
                tsval: 0x8002_0304,
                tsecr: 0x0506_07ff
            })
        );
        assert_eq!(fast, parse_options_in_turn(&ts).unwrap());
        // Every one-byte change of the layout gives what the general
        // loop gives, an error included.
        for at in 0..ts.len() {
            for v in [0, 1, 2, 4, 5, 8, 9, 10, 11, 0xff] {
                let mut o = ts;
                o[at] = v;
                assert_eq!(parse_options(&o), parse_options_in_turn(&o), "{o:?}");
            }
        }
        assert_eq!(parse_options(&ts[..11]), parse_options_in_turn(&ts[..11]));
    }

    #[test]
    fn option_parsing_rules() {
        // Unknown kinds with a valid length are skipped; EOL stops parsing
        // even if garbage follows.
        let b = segment(
            &[
                30,
                4,
                0xff,
                0xff,
                kind::MSS,
                4,
                0x05,
                0xb4,
                kind::EOL,
                0xff,
                0,
                0,
            ],
            b"",
        );
        let r = parse(&b).unwrap();
        assert_eq!(r.options.mss, Some(1460));
        assert_eq!(r.options.timestamp, None);
        // Packed options without NOPs, as some stacks send.
        let b = segment(
            &[
                kind::MSS,
                4,
                0x23,
                0x28,
                kind::WINDOW_SCALE,
                3,
                14,
                kind::SACK_PERMITTED,
                2,
            ],
            b"",
        );
        let o = parse(&b).unwrap().options;
        assert_eq!(
            (o.mss, o.window_scale, o.sack_permitted),
            (Some(9000), Some(14), true)
        );
        // A SACK option carries up to four blocks.
        let mut opts = vec![kind::NOP, kind::NOP, kind::SACK, 34];
        for i in 0..8u8 {
            opts.extend_from_slice(&[0, 0, 0, i]);
        }
        let o = parse(&segment(&opts, b"")).unwrap().options;
        assert_eq!(o.sack.len(), 4);
        assert_eq!(o.sack.as_slice()[3], (SeqNumber(6), SeqNumber(7)));
    }

    fn arb_options() -> impl Strategy<Value = TcpOptions> {
        (
            proptest::option::of(any::<u16>()),
            proptest::option::of(any::<u8>()),
            any::<bool>(),
            proptest::collection::vec((any::<u32>(), any::<u32>()), 0..=4),
            proptest::option::of((any::<u32>(), any::<u32>())),
        )
            .prop_map(|(mss, window_scale, sack_permitted, blocks, ts)| {
                let mut sack = SackBlocks::new();
                for (l, r) in blocks {
                    sack.push(SeqNumber(l), SeqNumber(r));
                }
                TcpOptions {
                    mss,
                    window_scale,
                    sack_permitted,
                    sack,
                    timestamp: ts.map(|(tsval, tsecr)| TcpTimestamp { tsval, tsecr }),
                }
            })
    }

    fn arb_repr() -> impl Strategy<Value = TcpRepr> {
        (
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            any::<u32>(),
            0u16..0x200,
            any::<u16>(),
            any::<u16>(),
            arb_options(),
        )
            .prop_map(
                |(src_port, dst_port, seq, ack, flags, window, urgent, options)| TcpRepr {
                    src_port,
                    dst_port,
                    seq: SeqNumber(seq),
                    ack_number: SeqNumber(ack),
                    flags: TcpFlags(flags),
                    window,
                    urgent,
                    options,
                },
            )
    }

    proptest! {
        #[test]
        fn emit_parse_identity(
            r in arb_repr(),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let b = emit(&r, &payload);
            prop_assert!(r.header_len() <= 60 && r.header_len() % 4 == 0);
            let p = TcpPacket::new_checked(&b[..]).unwrap();
            prop_assert_eq!(p.payload(), &payload[..]);
            let got = TcpRepr::parse(&p, SRC, DST, Checksum::Verify).unwrap();
            // Whatever fits is kept exactly; only SACK blocks beyond the
            // 40-byte budget are dropped, from the end.
            let mut want = r;
            let mut kept = SackBlocks::new();
            for &(l, rr) in &r.options.sack.as_slice()[..r.emitted_sack_blocks()] {
                kept.push(l, rr);
            }
            want.options.sack = kept;
            prop_assert_eq!(got, want);
            if r.options.packed_len(r.options.sack.len()) <= MAX_OPTIONS_LEN {
                prop_assert_eq!(got, r);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            mut data in proptest::collection::vec(any::<u8>(), 0..80),
            off in 5u8..16,
        ) {
            // Half the time, a plausible data offset, so that option
            // parsing is reached.
            if data.len() > 12 && off % 2 == 0 {
                data[12] = off << 4;
            }
            let p = TcpPacket::new_unchecked(&data[..]);
            match TcpRepr::parse(&p, SRC, DST, Checksum::Trusted) {
                Ok(r) => {
                    // A parsed header always re-emits to itself: the
                    // packed layout fits whatever arrived in 40 bytes.
                    prop_assert_eq!(r.emitted_sack_blocks(), r.options.sack.len());
                    let b = emit(&r, p.payload());
                    prop_assert_eq!(parse(&b), Ok(r));
                }
                Err(e) => prop_assert!(matches!(
                    e,
                    WireError::Truncated | WireError::BadLength | WireError::BadOption
                )),
            }
            prop_assert!(matches!(
                TcpRepr::parse(&p, SRC, DST, Checksum::Verify),
                Ok(_) | Err(WireError::Truncated | WireError::BadLength | WireError::BadChecksum | WireError::BadOption)
            ));
        }
    }
}
