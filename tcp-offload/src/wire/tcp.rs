//! TCP header (RFC 9293 §3.1) with the options seen in practice: MSS,
//! window scale and timestamps (RFC 7323), SACK-permitted and SACK blocks
//! (RFC 2018), NOP and EOL. The checksum covers the IPv4 pseudo-header.

use core::net::Ipv4Addr;

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

    /// Validates the lengths. See [`TcpPacket::new_checked`].
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < 20 {
            return Err(WireError::Truncated);
        }
        let hl = usize::from(b[12] >> 4) * 4;
        if hl < 20 {
            return Err(WireError::BadLength);
        }
        if b.len() < hl {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// Header length in bytes, options included.
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[12] >> 4) * 4
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl TcpRepr {
    /// Parses and validates a TCP header. `src` and `dst` are the IPv4
    /// addresses for the pseudo-header checksum; the packet must span
    /// exactly the TCP header and payload (the IPv4 payload).
    pub fn parse<T: AsRef<[u8]>>(
        packet: &TcpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        checksum: Checksum,
    ) -> Result<TcpRepr> {
        let _ = (packet, src, dst, checksum);
        Err(WireError::Unsupported)
    }

    /// Length of the header this representation emits, options and padding
    /// included.
    pub fn header_len(&self) -> usize {
        20
    }

    /// Writes the header into `buf[..self.header_len()]` and the checksum
    /// over the pseudo-header, the header and `payload`. The payload itself
    /// is not copied: callers place it after the header (or attach it, in
    /// the zero-copy path).
    pub fn emit(&self, buf: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) {
        let _ = (buf, src, dst, payload);
    }
}
