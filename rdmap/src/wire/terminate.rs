//! The Terminate message (RFC 5040 §4.8): what a stream's last message says
//! about why it died.
//!
//! A Terminate is an untagged DDP message on queue 2 (one segment, MO 0)
//! whose payload is the Terminate header:
//!
//! ```text
//! byte 0      byte 1        byte 2              byte 3
//! Layer|EType Error Code    M D R + 5 reserved  reserved
//! [DDP Segment Length, 2 bytes]      when M or D is set
//! [Terminated DDP header, 14 or 18]  when D is set (length from its T flag)
//! [Terminated RDMA header, 28]       when R is set (the RDMA Read Request header)
//! ```
//!
//! Layer and EType are the high and low nibble of byte 0, M/D/R the top
//! three bits of byte 2 (0x80, 0x40, 0x20). The length slot sits in front
//! of the DDP header whenever one is included, and carries a meaningful
//! value only with M; every implementation seen (siw, nes/i40iw/irdma)
//! sets M whenever it sets D, and so do we. The segment length we report is
//! the offending ULPDU's length, header included, which is what RFC 5041
//! calls a DDP Segment and what Intel's RNICs send; siw sends the payload
//! length alone (1440 for a 1454-byte ULPDU), which a receiver only reads.
//!
//! # Two layouts on receipt
//!
//! We always send the RFC layout. Linux siw (checked on 6.1) declares the
//! control word as a little-endian bitfield, so on x86 it sends byte 0 as
//! `etype << 4 | layer` (nibbles swapped) and M/D/R as 0x01/0x02/0x04 of
//! byte 2. [`TerminateLayout::detect`] tells the two apart from the four
//! control bytes, in this order:
//!
//! 1. a reading whose Layer is not 0, 1 or 2 is impossible;
//! 2. header flags present in only one reading's bit positions (0xE0 for
//!    the RFC, 0x07 for siw) pick that reading;
//! 3. a reading whose triple is one the RFCs define (or Intel's MPA form
//!    with EType 3, see [`TerminateCause::is_recognised`]) beats one whose
//!    triple is not;
//! 4. with no flags at all, a reading whose cause is normally sent without
//!    headers beats one whose cause normally reports the offending
//!    segment ([`TerminateCause::reports_segment`]);
//! 5. otherwise the RFC reading.
//!
//! siw's two Terminates in the captures are decided by rules 2 and 3:
//! `11 01 03 00` has flags 0x03 (siw's M+D): DDP / tagged buffer / base or
//! bounds. `02 02 00 00` has no flags; the RFC reading is RDMAP / remote
//! operation / 0x02, which no RFC defines, while the siw reading is
//! LLP / MPA / CRC error, so siw's wins. The remaining ambiguity: a
//! headerless siw Terminate with byte 0 = 0x20 and code 5, 6 or 7 (RDMAP
//! remote operation: invalid version, unexpected opcode, catastrophic
//! stream error) reads by rule 4 as the RFC's MPA error with the same code.
//! Either way the stream is dead; only the reported reason differs.

use super::ddp::{header_len_for_ctrl, DdpRepr, UNTAGGED_HEADER_LEN};
use super::rdmap::{RdmapOpcode, ReadRequest, READ_REQUEST_LEN};
use super::{Result, WireError};
use crate::error::{Layer, TerminateCause};

/// Length of the Terminate Control field plus its reserved bits.
pub const CONTROL_LEN: usize = 4;
/// Length of the DDP Segment Length field.
pub const SEGMENT_LENGTH_LEN: usize = 2;

/// The header-control bits of byte 2, RFC layout (RFC 5040 §4.8).
pub mod hdrct {
    /// M: the DDP Segment Length field is valid.
    pub const M: u8 = 0x80;
    /// D: the DDP header of the offending segment is included.
    pub const D: u8 = 0x40;
    /// R: the RDMA header (an RDMA Read Request's) is included.
    pub const R: u8 = 0x20;
    /// All three.
    pub const MASK: u8 = 0xE0;
}

/// The header-control bits of byte 2 as siw sends them.
pub mod siw_hdrct {
    /// M.
    pub const M: u8 = 0x01;
    /// D.
    pub const D: u8 = 0x02;
    /// R.
    pub const R: u8 = 0x04;
    /// All three.
    pub const MASK: u8 = 0x07;
}

/// Where the fields of a received Terminate Control word are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TerminateLayout {
    /// RFC 5040 §4.8: byte 0 = Layer << 4 | EType, M/D/R = 0x80/0x40/0x20.
    Rfc,
    /// Linux siw on little-endian hosts: byte 0 = EType << 4 | Layer,
    /// M/D/R = 0x01/0x02/0x04.
    SiwSwapped,
}

/// The three header-control flags, wherever they were on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
struct Flags {
    m: bool,
    d: bool,
    r: bool,
}

impl TerminateLayout {
    /// The cause and flags this layout reads from a control word, or `None`
    /// if its Layer is not 0, 1 or 2.
    fn read(self, control: [u8; 4]) -> Option<(TerminateCause, Flags)> {
        let (layer, etype, flags) = match self {
            TerminateLayout::Rfc => (
                control[0] >> 4,
                control[0] & 0x0F,
                Flags {
                    m: control[2] & hdrct::M != 0,
                    d: control[2] & hdrct::D != 0,
                    r: control[2] & hdrct::R != 0,
                },
            ),
            TerminateLayout::SiwSwapped => (
                control[0] & 0x0F,
                control[0] >> 4,
                Flags {
                    m: control[2] & siw_hdrct::M != 0,
                    d: control[2] & siw_hdrct::D != 0,
                    r: control[2] & siw_hdrct::R != 0,
                },
            ),
        };
        let layer = Layer::from_u4(layer)?;
        Some((TerminateCause::new(layer, etype, control[1]), flags))
    }

    /// Decides which layout a Terminate Control word was sent in; see the
    /// module documentation for the rules. Fails with
    /// [`WireError::TerminateLayer`] if neither reading has a Layer of 0, 1
    /// or 2.
    pub fn detect(control: [u8; 4]) -> Result<TerminateLayout> {
        use TerminateLayout::{Rfc, SiwSwapped};
        let pick = |rfc: bool| if rfc { Rfc } else { SiwSwapped };
        let (rfc, siw) = match (Rfc.read(control), SiwSwapped.read(control)) {
            (None, None) => return Err(WireError::TerminateLayer),
            (Some(_), None) => return Ok(Rfc),
            (None, Some(_)) => return Ok(SiwSwapped),
            (Some((rfc, _)), Some((siw, _))) => (rfc, siw),
        };
        let rfc_flags = control[2] & hdrct::MASK != 0;
        let siw_flags = control[2] & siw_hdrct::MASK != 0;
        if rfc_flags != siw_flags {
            return Ok(pick(rfc_flags));
        }
        let (rfc_known, siw_known) = (rfc.is_recognised(), siw.is_recognised());
        if rfc_known != siw_known {
            return Ok(pick(rfc_known));
        }
        if !rfc_flags && rfc_known && rfc != siw {
            let (rfc_bare, siw_bare) = (!rfc.reports_segment(), !siw.reports_segment());
            if rfc_bare != siw_bare {
                return Ok(pick(rfc_bare));
            }
        }
        Ok(Rfc)
    }
}

/// The DDP header of the segment a Terminate reports, kept as the bytes
/// that arrived: it may be the very header that broke a rule, so it is not
/// validated. Its length comes from its T flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TerminatedDdpHeader {
    /// A 14-byte tagged header.
    Tagged([u8; 14]),
    /// An 18-byte untagged header.
    Untagged([u8; 18]),
}

impl TerminatedDdpHeader {
    /// Takes the header at the start of `bytes`; what follows it is
    /// ignored.
    pub fn from_bytes(bytes: &[u8]) -> Result<TerminatedDdpHeader> {
        let first = *bytes.first().ok_or(WireError::Truncated)?;
        let len = header_len_for_ctrl(first);
        let src = bytes.get(..len).ok_or(WireError::Truncated)?;
        if len == UNTAGGED_HEADER_LEN {
            let mut h = [0u8; 18];
            h.copy_from_slice(src);
            Ok(TerminatedDdpHeader::Untagged(h))
        } else {
            let mut h = [0u8; 14];
            h.copy_from_slice(src);
            Ok(TerminatedDdpHeader::Tagged(h))
        }
    }

    /// The header bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            TerminatedDdpHeader::Tagged(h) => h,
            TerminatedDdpHeader::Untagged(h) => h,
        }
    }

    /// 14 or 18.
    pub fn header_len(&self) -> usize {
        self.as_bytes().len()
    }

    /// The header's meaning, if it is a valid one.
    pub fn parse(&self) -> Result<DdpRepr> {
        DdpRepr::parse_ulpdu(self.as_bytes()).map(|(r, _)| r)
    }
}

/// A view of a Terminate header: the payload of a Terminate message.
#[derive(Debug, Clone)]
pub struct TerminateHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TerminateHeader<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> TerminateHeader<T> {
        TerminateHeader { buffer }
    }

    /// Wraps a buffer holding at least the 4-byte control word.
    pub fn new_checked(buffer: T) -> Result<TerminateHeader<T>> {
        let h = TerminateHeader::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// Fails with [`WireError::Truncated`] if the control word is cut short.
    /// What the flags promise after it is checked by
    /// [`TerminateRepr::parse_as`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < CONTROL_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The four control bytes as received.
    pub fn control(&self) -> [u8; 4] {
        let mut c = [0u8; 4];
        c.copy_from_slice(&self.buffer.as_ref()[..CONTROL_LEN]);
        c
    }

    /// The layout the control word was sent in ([`TerminateLayout::detect`]).
    pub fn layout(&self) -> Result<TerminateLayout> {
        TerminateLayout::detect(self.control())
    }

    /// The bytes after the control word.
    pub fn rest(&self) -> &[u8] {
        self.buffer.as_ref().get(CONTROL_LEN..).unwrap_or(&[])
    }
}

/// The meaning of a Terminate header.
///
/// The M, D and R flags are the `Some`-ness of the three optional parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateRepr {
    /// Why the peer (or we) terminated.
    pub cause: TerminateCause,
    /// M: the DDP Segment Length of the offending segment.
    pub segment_length: Option<u16>,
    /// D: the offending segment's DDP header.
    pub ddp_header: Option<TerminatedDdpHeader>,
    /// R: the RDMA Read Request header of the offending segment.
    pub rdma_header: Option<ReadRequest>,
}

impl TerminateRepr {
    /// A Terminate that reports no segment.
    pub const fn bare(cause: TerminateCause) -> TerminateRepr {
        TerminateRepr {
            cause,
            segment_length: None,
            ddp_header: None,
            rdma_header: None,
        }
    }

    /// The Terminate for `cause` found in the incoming ULPDU `offending`
    /// (starting at its DDP Control Field), with the parts RFC 5040 §4.8
    /// asks for: if the cause reports a segment
    /// ([`TerminateCause::reports_segment`]), its length (M), its DDP
    /// header if the ULPDU holds one (D), and for an RDMA Read Request its
    /// 28-byte header (R). Lengths over 65535 (impossible from MPA) are
    /// reported as 65535.
    pub fn for_segment(cause: TerminateCause, offending: Option<&[u8]>) -> TerminateRepr {
        let mut repr = TerminateRepr::bare(cause);
        let Some(seg) = offending.filter(|s| !s.is_empty() && cause.reports_segment()) else {
            return repr;
        };
        repr.segment_length = Some(u16::try_from(seg.len()).unwrap_or(u16::MAX));
        let Ok(header) = TerminatedDdpHeader::from_bytes(seg) else {
            return repr;
        };
        repr.ddp_header = Some(header);
        if let TerminatedDdpHeader::Untagged(h) = header {
            if RdmapOpcode::from_u4(h[1] & 0x0F) == Some(RdmapOpcode::ReadRequest) {
                repr.rdma_header = seg
                    .get(UNTAGGED_HEADER_LEN..)
                    .and_then(|b| ReadRequest::parse_bytes(b).ok());
            }
        }
        repr
    }

    /// Parses a Terminate header, detecting its layout
    /// ([`TerminateLayout::detect`]). Bytes after the parts the flags
    /// announce are ignored.
    pub fn parse(bytes: &[u8]) -> Result<(TerminateRepr, TerminateLayout)> {
        let header = TerminateHeader::new_checked(bytes)?;
        let layout = header.layout()?;
        Ok((TerminateRepr::parse_as(bytes, layout)?, layout))
    }

    /// Parses a Terminate header in a known layout.
    ///
    /// In the RFC layout a flag whose part is missing is an error
    /// ([`WireError::Truncated`]). In siw's, R with fewer than 28 bytes
    /// left is accepted without an RDMA header: siw sets R for Send-type
    /// messages too and then includes only their DDP header.
    pub fn parse_as(bytes: &[u8], layout: TerminateLayout) -> Result<TerminateRepr> {
        let header = TerminateHeader::new_checked(bytes)?;
        let (cause, flags) = layout
            .read(header.control())
            .ok_or(WireError::TerminateLayer)?;
        let mut rest = header.rest();
        let mut repr = TerminateRepr::bare(cause);
        if flags.m || flags.d {
            let len = rest.get(..SEGMENT_LENGTH_LEN).ok_or(WireError::Truncated)?;
            if flags.m {
                repr.segment_length = Some(u16::from_be_bytes([len[0], len[1]]));
            }
            rest = &rest[SEGMENT_LENGTH_LEN..];
        }
        if flags.d {
            let h = TerminatedDdpHeader::from_bytes(rest)?;
            rest = &rest[h.header_len()..];
            repr.ddp_header = Some(h);
        }
        if flags.r {
            match ReadRequest::parse_bytes(rest) {
                Ok(rr) => repr.rdma_header = Some(rr),
                Err(_) if layout == TerminateLayout::SiwSwapped => {}
                Err(e) => return Err(e),
            }
        }
        Ok(repr)
    }

    /// Length of the emitted header.
    pub fn buffer_len(&self) -> usize {
        let mut len = CONTROL_LEN;
        if self.segment_length.is_some() || self.ddp_header.is_some() {
            len += SEGMENT_LENGTH_LEN;
        }
        if let Some(h) = &self.ddp_header {
            len += h.header_len();
        }
        if self.rdma_header.is_some() {
            len += READ_REQUEST_LEN;
        }
        len
    }

    /// Writes the header in the RFC 5040 layout into
    /// `buf[..self.buffer_len()]` and returns that length. Reserved bits
    /// are zero; the length slot in front of a DDP header is zero when no
    /// segment length is set (M clear).
    ///
    /// # Panics
    /// If `buf` is shorter than [`TerminateRepr::buffer_len`], a caller bug.
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        let len = self.buffer_len();
        let b = &mut buf[..len];
        b[0] = (self.cause.layer.as_u4() << 4) | (self.cause.etype & 0x0F);
        b[1] = self.cause.ecode;
        let mut flags = 0;
        if self.segment_length.is_some() {
            flags |= hdrct::M;
        }
        if self.ddp_header.is_some() {
            flags |= hdrct::D;
        }
        if self.rdma_header.is_some() {
            flags |= hdrct::R;
        }
        b[2] = flags;
        b[3] = 0;
        let mut at = CONTROL_LEN;
        if self.segment_length.is_some() || self.ddp_header.is_some() {
            let l = self.segment_length.unwrap_or(0);
            b[at..at + SEGMENT_LENGTH_LEN].copy_from_slice(&l.to_be_bytes());
            at += SEGMENT_LENGTH_LEN;
        }
        if let Some(h) = &self.ddp_header {
            let h = h.as_bytes();
            b[at..at + h.len()].copy_from_slice(h);
            at += h.len();
        }
        if let Some(rr) = &self.rdma_header {
            rr.emit(&mut b[at..]);
        }
        len
    }
}

/// A whole Terminate ULPDU: the untagged DDP header (queue 2, last, MO 0)
/// and the Terminate header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateMessage {
    /// MSN on queue 2: 1 for the first (and normally only) Terminate.
    pub msn: u32,
    /// The Terminate header.
    pub header: TerminateRepr,
}

impl TerminateMessage {
    /// The DDP header the message goes out with.
    pub const fn ddp_repr(&self) -> DdpRepr {
        DdpRepr::untagged(RdmapOpcode::Terminate, true, self.msn, 0)
    }

    /// Length of the ULPDU.
    pub fn buffer_len(&self) -> usize {
        UNTAGGED_HEADER_LEN + self.header.buffer_len()
    }

    /// Writes the ULPDU into `buf[..self.buffer_len()]` and returns that
    /// length.
    ///
    /// # Panics
    /// If `buf` is shorter than [`TerminateMessage::buffer_len`].
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        let len = self.buffer_len();
        self.ddp_repr().emit(buf);
        self.header.emit(&mut buf[UNTAGGED_HEADER_LEN..len]);
        len
    }

    /// Parses a Terminate ULPDU. A valid DDP header of another message is
    /// [`WireError::NotTerminate`].
    pub fn parse(ulpdu: &[u8]) -> Result<(TerminateMessage, TerminateLayout)> {
        let (ddp, hl) = DdpRepr::parse_ulpdu(ulpdu)?;
        let DdpRepr::Untagged {
            opcode: RdmapOpcode::Terminate,
            msn,
            ..
        } = ddp
        else {
            return Err(WireError::NotTerminate(ddp.opcode()));
        };
        let (header, layout) = TerminateRepr::parse(&ulpdu[hl..])?;
        Ok((TerminateMessage { msn, header }, layout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TerminateLayout::{Rfc, SiwSwapped};

    fn detect(c: [u8; 4]) -> TerminateLayout {
        TerminateLayout::detect(c).unwrap()
    }

    #[test]
    fn siw_captures_detected() {
        assert_eq!(detect([0x02, 0x02, 0x00, 0x00]), SiwSwapped);
        assert_eq!(detect([0x11, 0x01, 0x03, 0x00]), SiwSwapped);
        let (r, l) = TerminateRepr::parse(&[0x02, 0x02, 0, 0]).unwrap();
        assert_eq!(l, SiwSwapped);
        assert_eq!(r, TerminateRepr::bare(TerminateCause::MPA_CRC));
    }

    #[test]
    fn rfc_forms_detected() {
        // MPA CRC error, RFC layout.
        assert_eq!(detect([0x20, 0x02, 0x00, 0x00]), Rfc);
        // Intel's MPA CRC error (EType 3): siw reading has Layer 3.
        assert_eq!(detect([0x23, 0x02, 0x00, 0x00]), Rfc);
        // DDP tagged base/bounds with M+D.
        assert_eq!(detect([0x11, 0x01, 0xC0, 0x00]), Rfc);
        // Both readings defined, no flags: the headerless one wins. RFC:
        // DDP local catastrophic; siw: RDMAP invalid STag (reports segments).
        assert_eq!(detect([0x10, 0x00, 0x00, 0x00]), Rfc);
        // Mirror image: RFC RDMAP invalid STag without headers is less
        // plausible than siw's DDP local catastrophic.
        assert_eq!(detect([0x01, 0x00, 0x00, 0x00]), SiwSwapped);
        // The documented ambiguity: MPA Insufficient IRD wins over siw's
        // headerless unexpected opcode.
        assert_eq!(detect([0x20, 0x06, 0x00, 0x00]), Rfc);
        // Codes only RDMAP has: siw's reading.
        assert_eq!(detect([0x20, 0x08, 0x00, 0x00]), SiwSwapped);
        // Equal nibbles, no evidence: RFC.
        assert_eq!(detect([0x00, 0xFF, 0x00, 0x00]), Rfc);
        assert_eq!(
            TerminateLayout::detect([0x33, 0x00, 0x00, 0x00]),
            Err(WireError::TerminateLayer)
        );
        // Layer 5 in the RFC reading, 0 (RDMAP) in siw's.
        assert_eq!(detect([0x50, 0x00, 0x00, 0x00]), SiwSwapped);
    }

    #[test]
    fn flags_missing_parts_are_truncation_in_rfc_layout() {
        assert_eq!(
            TerminateRepr::parse_as(&[0x11, 0x01, 0xC0, 0x00, 0x00], Rfc),
            Err(WireError::Truncated)
        );
        assert_eq!(
            TerminateRepr::parse_as(&[0x11, 0x01, 0xC0, 0x00, 0x00, 0x10, 0x81], Rfc),
            Err(WireError::Truncated)
        );
        assert_eq!(
            TerminateRepr::parse_as(&[0x01, 0x00, 0x20, 0x00], Rfc),
            Err(WireError::Truncated)
        );
        // siw: R without room for a Read Request header is accepted.
        let r = TerminateRepr::parse_as(&[0x10, 0x00, 0x04, 0x00], SiwSwapped).unwrap();
        assert_eq!(
            r,
            TerminateRepr::bare(TerminateCause::RDMAP_PROT_INVALID_STAG)
        );
    }

    #[test]
    fn d_without_m_keeps_the_length_slot() {
        let mut hdr = [0u8; 14];
        hdr[0] = 0xC1;
        hdr[1] = 0x40;
        let repr = TerminateRepr {
            cause: TerminateCause::DDP_TAGGED_INVALID_STAG,
            segment_length: None,
            ddp_header: Some(TerminatedDdpHeader::Tagged(hdr)),
            rdma_header: None,
        };
        let mut buf = [0xAAu8; 64];
        let n = repr.emit(&mut buf);
        assert_eq!(n, 20);
        assert_eq!(&buf[..6], &[0x11, 0x00, 0x40, 0x00, 0x00, 0x00]);
        assert_eq!(&buf[6..20], &hdr);
        assert_eq!(TerminateRepr::parse(&buf[..n]), Ok((repr, Rfc)));
    }

    #[test]
    fn for_segment_follows_the_cause() {
        let mut rr = [0u8; 46];
        rr[0] = 0x41;
        rr[1] = 0x41;
        rr[9] = 1;
        rr[18..22].copy_from_slice(&[0xAB; 4]);
        let t = TerminateRepr::for_segment(TerminateCause::RDMAP_PROT_BASE_BOUNDS, Some(&rr));
        assert_eq!(t.segment_length, Some(46));
        assert!(t.ddp_header.is_some());
        assert_eq!(t.rdma_header.map(|r| r.sink_stag), Some(0xABAB_ABAB));
        // A cut-short Read Request: no R.
        let t = TerminateRepr::for_segment(
            TerminateCause::RDMAP_OP_CATASTROPHIC_STREAM,
            Some(&rr[..30]),
        );
        assert_eq!(t.segment_length, Some(30));
        assert!(t.ddp_header.is_some() && t.rdma_header.is_none());
        // Shorter than a DDP header: M only.
        let t = TerminateRepr::for_segment(
            TerminateCause::RDMAP_OP_CATASTROPHIC_STREAM,
            Some(&rr[..10]),
        );
        assert_eq!((t.segment_length, t.ddp_header), (Some(10), None));
        // Causes that report nothing ignore the segment.
        let t = TerminateRepr::for_segment(TerminateCause::MPA_CRC, Some(&rr));
        assert_eq!(t, TerminateRepr::bare(TerminateCause::MPA_CRC));
    }

    #[test]
    fn message_round_trip_and_wrong_message() {
        let m = TerminateMessage {
            msn: 1,
            header: TerminateRepr::bare(TerminateCause::RDMAP_OP_CATASTROPHIC_GLOBAL),
        };
        let mut buf = [0u8; 22];
        assert_eq!(m.emit(&mut buf), 22);
        assert_eq!(TerminateMessage::parse(&buf), Ok((m, Rfc)));
        buf[1] = 0x43;
        buf[9] = 0;
        assert_eq!(
            TerminateMessage::parse(&buf),
            Err(WireError::NotTerminate(RdmapOpcode::Send))
        );
    }
}
