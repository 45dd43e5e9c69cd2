//! The DDP header with the RDMAP Control Field in it (RFC 5041 §4, RFC 5040
//! §4.1).
//!
//! Every ULPDU starts with this header. Byte 0 is DDP's Control Field
//! (T = tagged, L = last segment of the message, 4 reserved bits, DV = DDP
//! version 1); byte 1 is the first byte DDP reserves for its upper layer,
//! which RDMAP uses as its own Control Field (RV = RDMAP version 1 in the
//! top two bits, two reserved bits, the opcode in the low four). Then:
//!
//! ```text
//! tagged (14 bytes):   ctrl | rdmap | STag (4) | TO (8)
//! untagged (18 bytes): ctrl | rdmap | Inv-STag (4) | QN (4) | MSN (4) | MO (4)
//! ```
//!
//! The four bytes after the RDMAP Control Field of an untagged header are
//! the rest of DDP's reserved-for-ULP field; RDMAP puts the STag to
//! invalidate there for Send with Invalidate and Send with SE and
//! Invalidate, and leaves them zero otherwise (RFC 5040 §4.1).
//!
//! Parsing validates in the order the layers would: DDP's version, then
//! (untagged) the queue number, then RDMAP's version, opcode and whether
//! the opcode matches the buffer model and queue. Each failure is a
//! [`WireError`] that names the Terminate cause to report. Reserved bits
//! are written as zero and, as RFC 5041 §4 and RFC 5040 §4.1 ask, not
//! checked on receipt.

use super::rdmap::{RdmapOpcode, QN_TERMINATE, RDMAP_VERSION};
use super::{Result, WireError};

/// The DDP version this implementation speaks (RFC 5041 §4.1: DV = 01b).
pub const DDP_VERSION: u8 = 1;
/// Length of a tagged DDP header, both control bytes included.
pub const TAGGED_HEADER_LEN: usize = 14;
/// Length of an untagged DDP header, both control bytes included.
pub const UNTAGGED_HEADER_LEN: usize = 18;

/// Bits of the DDP Control Field (byte 0).
pub mod ddp_ctrl {
    /// T: the segment uses the tagged buffer model.
    pub const TAGGED: u8 = 0x80;
    /// L: last segment of its DDP message.
    pub const LAST: u8 = 0x40;
    /// Reserved, zero on send, ignored on receipt.
    pub const RESERVED: u8 = 0x3C;
    /// DV: DDP version.
    pub const VERSION: u8 = 0x03;
}

/// Bits of the RDMAP Control Field (byte 1).
pub mod rdmap_ctrl {
    /// RV: RDMAP version, in the top two bits.
    pub const VERSION: u8 = 0xC0;
    /// Shift of RV.
    pub const VERSION_SHIFT: u32 = 6;
    /// Reserved, zero on send, ignored on receipt.
    pub const RESERVED: u8 = 0x30;
    /// Opcode.
    pub const OPCODE: u8 = 0x0F;
}

mod field {
    use core::ops::Range;
    pub const DDP_CTRL: usize = 0;
    pub const RDMAP_CTRL: usize = 1;
    pub const STAG: Range<usize> = 2..6;
    pub const TO: Range<usize> = 6..14;
    pub const INV_STAG: Range<usize> = 2..6;
    pub const QN: Range<usize> = 6..10;
    pub const MSN: Range<usize> = 10..14;
    pub const MO: Range<usize> = 14..18;
}

/// Header length announced by a DDP Control Field.
pub const fn header_len_for_ctrl(ddp_ctrl_byte: u8) -> usize {
    if ddp_ctrl_byte & ddp_ctrl::TAGGED != 0 {
        TAGGED_HEADER_LEN
    } else {
        UNTAGGED_HEADER_LEN
    }
}

fn read_u32(b: &[u8], r: core::ops::Range<usize>) -> Option<u32> {
    let s = b.get(r)?;
    let mut a = [0u8; 4];
    a.copy_from_slice(s);
    Some(u32::from_be_bytes(a))
}

fn read_u64(b: &[u8], r: core::ops::Range<usize>) -> Option<u64> {
    let s = b.get(r)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_be_bytes(a))
}

/// A zero-copy view of a ULPDU starting with a DDP header.
///
/// After [`DdpPacket::new_checked`] the buffer holds the whole header its T
/// flag announces, so no accessor panics. Fields of one buffer model read
/// as `None` on a segment of the other.
#[derive(Debug, Clone)]
pub struct DdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> DdpPacket<T> {
    /// Wraps a buffer without checking its length; the control-field
    /// accessors panic on an empty one.
    pub const fn new_unchecked(buffer: T) -> DdpPacket<T> {
        DdpPacket { buffer }
    }

    /// Wraps a buffer that holds at least the header its T flag announces.
    pub fn new_checked(buffer: T) -> Result<DdpPacket<T>> {
        let p = DdpPacket::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Fails with [`WireError::Truncated`] if the buffer is shorter than the
    /// header.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        match b.first() {
            Some(&c) if b.len() >= header_len_for_ctrl(c) => Ok(()),
            _ => Err(WireError::Truncated),
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The DDP Control Field.
    pub fn ddp_control(&self) -> u8 {
        self.buffer.as_ref()[field::DDP_CTRL]
    }

    /// The RDMAP Control Field.
    pub fn rdmap_control(&self) -> u8 {
        self.buffer.as_ref()[field::RDMAP_CTRL]
    }

    /// T flag: tagged buffer model.
    pub fn tagged(&self) -> bool {
        self.ddp_control() & ddp_ctrl::TAGGED != 0
    }

    /// L flag: last segment of the DDP message.
    pub fn last(&self) -> bool {
        self.ddp_control() & ddp_ctrl::LAST != 0
    }

    /// The DDP Control Field's reserved bits, shifted down.
    pub fn ddp_reserved(&self) -> u8 {
        (self.ddp_control() & ddp_ctrl::RESERVED) >> 2
    }

    /// DV: the DDP version.
    pub fn ddp_version(&self) -> u8 {
        self.ddp_control() & ddp_ctrl::VERSION
    }

    /// RV: the RDMAP version.
    pub fn rdmap_version(&self) -> u8 {
        self.rdmap_control() >> rdmap_ctrl::VERSION_SHIFT
    }

    /// The RDMAP Control Field's reserved bits, shifted down.
    pub fn rdmap_reserved(&self) -> u8 {
        (self.rdmap_control() & rdmap_ctrl::RESERVED) >> 4
    }

    /// The 4-bit opcode as received (it may be one RFC 5040 does not
    /// define).
    pub fn opcode_bits(&self) -> u8 {
        self.rdmap_control() & rdmap_ctrl::OPCODE
    }

    /// Length of the header, from the T flag.
    pub fn header_len(&self) -> usize {
        header_len_for_ctrl(self.ddp_control())
    }

    /// Tagged: the Data Sink STag.
    pub fn stag(&self) -> Option<u32> {
        if !self.tagged() {
            return None;
        }
        read_u32(self.buffer.as_ref(), field::STAG)
    }

    /// Tagged: the Tagged Offset.
    pub fn tagged_offset(&self) -> Option<u64> {
        if !self.tagged() {
            return None;
        }
        read_u64(self.buffer.as_ref(), field::TO)
    }

    /// Untagged: the four reserved-for-ULP bytes after the RDMAP Control
    /// Field, RDMAP's Invalidate STag for the two Send with Invalidate
    /// opcodes.
    pub fn invalidate_stag_field(&self) -> Option<u32> {
        if self.tagged() {
            return None;
        }
        read_u32(self.buffer.as_ref(), field::INV_STAG)
    }

    /// Untagged: the Queue Number.
    pub fn queue_number(&self) -> Option<u32> {
        if self.tagged() {
            return None;
        }
        read_u32(self.buffer.as_ref(), field::QN)
    }

    /// Untagged: the Message Sequence Number.
    pub fn msn(&self) -> Option<u32> {
        if self.tagged() {
            return None;
        }
        read_u32(self.buffer.as_ref(), field::MSN)
    }

    /// Untagged: the Message Offset.
    pub fn message_offset(&self) -> Option<u32> {
        if self.tagged() {
            return None;
        }
        read_u32(self.buffer.as_ref(), field::MO)
    }

    /// The bytes after the header: the ULP payload, or for a Read Request
    /// or Terminate the RDMAP header that follows.
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        b.get(self.header_len()..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DdpPacket<T> {
    /// The bytes after the header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        let b = self.buffer.as_mut();
        let start = hl.min(b.len());
        &mut b[start..]
    }
}

/// The validated meaning of a DDP header and the RDMAP Control Field in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DdpRepr {
    /// A tagged segment: RDMA Write or RDMA Read Response.
    Tagged {
        /// The RDMA message (always a tagged opcode after `parse`).
        opcode: RdmapOpcode,
        /// L flag.
        last: bool,
        /// Data Sink STag.
        stag: u32,
        /// Tagged Offset of this segment's first payload byte.
        to: u64,
    },
    /// An untagged segment: the Send family, RDMA Read Request, Terminate.
    Untagged {
        /// The RDMA message (always an untagged opcode after `parse`).
        opcode: RdmapOpcode,
        /// L flag.
        last: bool,
        /// Queue Number (after `parse`, the one the opcode belongs to).
        qn: u32,
        /// Message Sequence Number.
        msn: u32,
        /// Message Offset of this segment's first payload byte.
        mo: u32,
        /// The STag to invalidate: `Some` exactly for Send with Invalidate
        /// and Send with SE and Invalidate. For other opcodes the field is
        /// reserved: sent as zero, ignored on receipt.
        inv_stag: Option<u32>,
    },
}

impl DdpRepr {
    /// A tagged header.
    pub const fn tagged(opcode: RdmapOpcode, last: bool, stag: u32, to: u64) -> DdpRepr {
        DdpRepr::Tagged {
            opcode,
            last,
            stag,
            to,
        }
    }

    /// An untagged header on the queue the opcode belongs to, without an
    /// Invalidate STag. A tagged opcode here is a caller bug; it gets queue
    /// 0.
    pub const fn untagged(opcode: RdmapOpcode, last: bool, msn: u32, mo: u32) -> DdpRepr {
        let qn = match opcode.queue_number() {
            Some(qn) => qn,
            None => 0,
        };
        DdpRepr::Untagged {
            opcode,
            last,
            qn,
            msn,
            mo,
            inv_stag: None,
        }
    }

    /// Parses and validates a checked view; see [`DdpRepr::parse_ulpdu`]
    /// for the order of checks.
    pub fn parse<T: AsRef<[u8]>>(packet: &DdpPacket<T>) -> Result<DdpRepr> {
        DdpRepr::parse_ulpdu(packet.buffer.as_ref()).map(|(r, _)| r)
    }

    /// Parses the header at the start of a ULPDU and returns it with its
    /// length, in the order the layers validate: the DDP version (from
    /// byte 0 alone, so that a segment with an unknown layout is reported
    /// as such rather than as truncated), the header length, the queue
    /// number of an untagged segment, then the RDMAP version, the opcode,
    /// the opcode's buffer model and its queue.
    pub fn parse_ulpdu(ulpdu: &[u8]) -> Result<(DdpRepr, usize)> {
        DdpRepr::parse_ulpdu_inline(ulpdu)
    }

    /// [`DdpRepr::parse_ulpdu`], always inlined: the receive path parses
    /// every FPDU's header with it. Called, it returned the header
    /// through memory, and the caller read it back in words wider than
    /// the stores that had just written it, a load the store buffer
    /// cannot serve (39 % of the receive path's `rx_header` samples on
    /// that one load).
    #[inline(always)]
    pub(crate) fn parse_ulpdu_inline(ulpdu: &[u8]) -> Result<(DdpRepr, usize)> {
        let Some(&ctrl) = ulpdu.first() else {
            return Err(WireError::Truncated);
        };
        let tagged = ctrl & ddp_ctrl::TAGGED != 0;
        let dv = ctrl & ddp_ctrl::VERSION;
        if dv != DDP_VERSION {
            return Err(WireError::DdpVersion {
                tagged,
                version: dv,
            });
        }
        let packet = DdpPacket::new_checked(ulpdu)?;
        let qn = packet.queue_number();
        if let Some(qn) = qn {
            if qn > QN_TERMINATE {
                return Err(WireError::InvalidQueueNumber(qn));
            }
        }
        let rv = packet.rdmap_version();
        if rv != RDMAP_VERSION {
            return Err(WireError::RdmapVersion(rv));
        }
        let bits = packet.opcode_bits();
        let opcode = RdmapOpcode::from_u4(bits).ok_or(WireError::UnknownOpcode(bits))?;
        if opcode.is_tagged() != tagged {
            return Err(WireError::WrongBufferModel(opcode));
        }
        let last = packet.last();
        let repr = match (
            packet.stag(),
            packet.tagged_offset(),
            qn,
            packet.msn(),
            packet.message_offset(),
            packet.invalidate_stag_field(),
        ) {
            (Some(stag), Some(to), ..) => DdpRepr::Tagged {
                opcode,
                last,
                stag,
                to,
            },
            (_, _, Some(qn), Some(msn), Some(mo), Some(inv)) => {
                if opcode.queue_number() != Some(qn) {
                    return Err(WireError::WrongQueueNumber { opcode, qn });
                }
                DdpRepr::Untagged {
                    opcode,
                    last,
                    qn,
                    msn,
                    mo,
                    inv_stag: opcode.carries_invalidate_stag().then_some(inv),
                }
            }
            // new_checked guaranteed the header of the model T announces.
            _ => return Err(WireError::Truncated),
        };
        Ok((repr, packet.header_len()))
    }

    /// The RDMA message.
    pub const fn opcode(&self) -> RdmapOpcode {
        match *self {
            DdpRepr::Tagged { opcode, .. } | DdpRepr::Untagged { opcode, .. } => opcode,
        }
    }

    /// L flag.
    pub const fn last(&self) -> bool {
        match *self {
            DdpRepr::Tagged { last, .. } | DdpRepr::Untagged { last, .. } => last,
        }
    }

    /// T flag.
    pub const fn is_tagged(&self) -> bool {
        matches!(self, DdpRepr::Tagged { .. })
    }

    /// Length of the emitted header.
    pub const fn header_len(&self) -> usize {
        match self {
            DdpRepr::Tagged { .. } => TAGGED_HEADER_LEN,
            DdpRepr::Untagged { .. } => UNTAGGED_HEADER_LEN,
        }
    }

    /// Writes the header into `buf[..self.header_len()]`, reserved bits
    /// zero. The payload is not touched.
    ///
    /// # Panics
    /// If `buf` is shorter than [`DdpRepr::header_len`], a caller bug.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = &mut buf[..self.header_len()];
        let mut ctrl = DDP_VERSION;
        if self.is_tagged() {
            ctrl |= ddp_ctrl::TAGGED;
        }
        if self.last() {
            ctrl |= ddp_ctrl::LAST;
        }
        b[field::DDP_CTRL] = ctrl;
        b[field::RDMAP_CTRL] = (RDMAP_VERSION << rdmap_ctrl::VERSION_SHIFT) | self.opcode().as_u4();
        match *self {
            DdpRepr::Tagged { stag, to, .. } => {
                b[field::STAG].copy_from_slice(&stag.to_be_bytes());
                b[field::TO].copy_from_slice(&to.to_be_bytes());
            }
            DdpRepr::Untagged {
                qn,
                msn,
                mo,
                inv_stag,
                ..
            } => {
                b[field::INV_STAG].copy_from_slice(&inv_stag.unwrap_or(0).to_be_bytes());
                b[field::QN].copy_from_slice(&qn.to_be_bytes());
                b[field::MSN].copy_from_slice(&msn.to_be_bytes());
                b[field::MO].copy_from_slice(&mo.to_be_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEND: [u8; 18] = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
    const WRITE: [u8; 14] = [
        0x81, 0x40, 0x2e, 0x11, 0xbf, 0x00, 0x00, 0x00, 0x7f, 0xf3, 0x9f, 0x76, 0x40, 0x00,
    ];

    fn parse(b: &[u8]) -> Result<DdpRepr> {
        DdpRepr::parse_ulpdu(b).map(|(r, _)| r)
    }

    #[test]
    fn send_and_write() {
        assert_eq!(
            parse(&SEND),
            Ok(DdpRepr::untagged(RdmapOpcode::Send, true, 1, 0))
        );
        assert_eq!(
            parse(&WRITE),
            Ok(DdpRepr::tagged(
                RdmapOpcode::RdmaWrite,
                false,
                0x2e11_bf00,
                0x7ff3_9f76_4000
            ))
        );
        let p = DdpPacket::new_checked(&WRITE[..]).unwrap();
        assert_eq!(p.queue_number(), None);
        assert_eq!(p.stag(), Some(0x2e11_bf00));
        assert_eq!(p.payload(), &[] as &[u8]);
        let p = DdpPacket::new_checked(&SEND[..]).unwrap();
        assert_eq!(p.stag(), None);
        assert_eq!(p.msn(), Some(1));
    }

    #[test]
    fn validation_order_and_errors() {
        // DV checked on a lone byte, before length.
        assert_eq!(
            parse(&[0x82]),
            Err(WireError::DdpVersion {
                tagged: true,
                version: 2
            })
        );
        assert_eq!(parse(&[]), Err(WireError::Truncated));
        assert_eq!(parse(&SEND[..17]), Err(WireError::Truncated));
        assert_eq!(parse(&WRITE[..13]), Err(WireError::Truncated));
        // QN before RV.
        let mut b = SEND;
        b[1] = 0x83;
        b[9] = 3;
        assert_eq!(parse(&b), Err(WireError::InvalidQueueNumber(3)));
        b[9] = 0;
        assert_eq!(parse(&b), Err(WireError::RdmapVersion(2)));
        b[1] = 0x48;
        assert_eq!(parse(&b), Err(WireError::UnknownOpcode(8)));
        b[1] = 0x40;
        assert_eq!(
            parse(&b),
            Err(WireError::WrongBufferModel(RdmapOpcode::RdmaWrite))
        );
        b[1] = 0x41;
        assert_eq!(
            parse(&b),
            Err(WireError::WrongQueueNumber {
                opcode: RdmapOpcode::ReadRequest,
                qn: 0
            })
        );
        let mut w = WRITE;
        w[1] = 0x43;
        assert_eq!(
            parse(&w),
            Err(WireError::WrongBufferModel(RdmapOpcode::Send))
        );
    }

    #[test]
    fn reserved_bits_ignored_and_cleared() {
        let mut b = SEND;
        b[0] |= ddp_ctrl::RESERVED;
        b[1] |= rdmap_ctrl::RESERVED;
        b[2..6].copy_from_slice(&[1, 2, 3, 4]);
        let r = parse(&b).unwrap();
        assert_eq!(r, DdpRepr::untagged(RdmapOpcode::Send, true, 1, 0));
        let mut out = [0xFFu8; 18];
        r.emit(&mut out);
        assert_eq!(out, SEND);
    }

    #[test]
    fn invalidate_stag_kept_for_invalidate_opcodes() {
        let mut b = SEND;
        b[1] = 0x46; // Send with SE and Invalidate
        b[2..6].copy_from_slice(&0x1234_5600u32.to_be_bytes());
        let r = parse(&b).unwrap();
        match r {
            DdpRepr::Untagged { inv_stag, .. } => assert_eq!(inv_stag, Some(0x1234_5600)),
            DdpRepr::Tagged { .. } => panic!("tagged"),
        }
        let mut out = [0u8; 18];
        r.emit(&mut out);
        assert_eq!(out, b);
    }
}
