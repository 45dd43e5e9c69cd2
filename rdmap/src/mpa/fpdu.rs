//! The FPDU and its framer (RFC 5044 §4, markers §5–§6): the send side of
//! MPA's full-operation phase.
//!
//! ```text
//!  ULPDU length (2, big-endian) | ULPDU | pad (0–3 zero octets) | CRC (4)
//! ```
//!
//! The pad brings length + ULPDU to a multiple of four. The CRC is CRC32c
//! (Castagnoli, reflected, initial value and final XOR all ones — what
//! [`crc32c::crc32c`] computes) over the length, the ULPDU, the pad and any
//! markers among them, stored least significant octet first, as siw and the
//! hardware RNICs store it: a CRC of `0x8c34cd18` goes on the wire as
//! `18 cd 34 8c` (host-probe.pcap; a big-endian CRC earns a Terminate).
//! With CRCs off the field is still there, and zero.
//!
//! The QP engine asks the [`Framer`] how large a ULPDU fits the segment TCP
//! offers ([`Framer::max_ulpdu_len`], MULPDU at the current stream
//! position, markers and CRC included), writes the DDP header, and gets
//! back the 2-byte prefix, the pad+CRC trailer and, with markers, where to
//! insert which marker ([`FpduLayout::markers`]), so that the payload can
//! stay in the registered region and never be copied. [`FpduLayout::write`]
//! and [`Framer::build_fpdu`] materialise a whole FPDU for copying senders
//! and tests.
//!
//! Every position here is relative to the first octet of the first FPDU in
//! this direction, as in [`super::markers`]; a retransmission rebuilds an
//! FPDU from its [`FpduLayout`], whose markers depend on where it starts.

use core::fmt;

use super::markers::{distance_to_marker, marker_bytes, markers_in, MARKER_INTERVAL, MARKER_LEN};
use super::negotiate::Framing;

/// Length of the ULPDU length field.
pub const LENGTH_LEN: usize = 2;
/// Length of the CRC field.
pub const CRC_LEN: usize = 4;
/// Largest ULPDU the 16-bit length field can describe.
pub const MAX_ULPDU_LEN: usize = u16::MAX as usize;
/// Smallest FPDU: an empty ULPDU, two octets of pad and the CRC.
pub const MIN_FPDU_LEN: usize = 8;

/// Pad octets after a ULPDU of `ulpdu_len` octets.
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (LENGTH_LEN + ulpdu_len) % 4) % 4
}

/// Octets of an FPDU carrying `ulpdu_len` octets, without markers.
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    LENGTH_LEN + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// Whether `bytes` is exactly one FPDU without markers, by its length
/// field: length, ULPDU, pad and CRC, nothing more (a receive path that
/// met it whole in one segment can take its CRC in the same read).
pub fn is_one_fpdu(bytes: &[u8]) -> bool {
    match *bytes {
        [a, b, ..] => fpdu_len(usize::from(u16::from_be_bytes([a, b]))) == bytes.len(),
        _ => false,
    }
}

/// Longest FPDU on the wire: with markers, a marker near the end of a
/// longer one could not point back to its length field in 16 bits.
const MAX_WIRE_LEN: u32 = u16::MAX as u32 + MARKER_LEN as u32;

/// Why an FPDU cannot be framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FramerError {
    /// The ULPDU exceeds 65535 octets.
    UlpduTooLong(usize),
    /// The ULPDU pieces do not add up to the length of the layout.
    LengthMismatch,
    /// The output buffer is shorter than the FPDU.
    BufferTooShort,
}

impl fmt::Display for FramerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FramerError::UlpduTooLong(n) => write!(f, "ULPDU of {n} octets"),
            FramerError::LengthMismatch => f.write_str("ULPDU pieces do not match the layout"),
            FramerError::BufferTooShort => f.write_str("buffer too short"),
        }
    }
}

impl std::error::Error for FramerError {}

/// Where one FPDU sits in the stream and what surrounds its ULPDU.
///
/// "Logical" offsets count the FPDU without markers (length, ULPDU, pad,
/// CRC); "wire" offsets count it as sent, markers included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FpduLayout {
    start: u32,
    ulpdu_len: u16,
    markers: bool,
    wire_len: u32,
}

/// One marker inside an FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MarkerSlot {
    /// Offset of the marker from the FPDU's first octet, as sent.
    pub wire_offset: u32,
    /// The marker goes right before this octet of the marker-free FPDU
    /// (length field at 0, ULPDU at 2, then pad and CRC).
    pub logical_offset: u32,
    /// The four octets to send.
    pub bytes: [u8; MARKER_LEN],
}

/// The markers of one FPDU, in order.
#[derive(Debug, Clone)]
pub struct MarkerSlots {
    next_wire: u32,
    index: u32,
    wire_len: u32,
    leading: bool,
}

impl Iterator for MarkerSlots {
    type Item = MarkerSlot;

    fn next(&mut self) -> Option<MarkerSlot> {
        if self.next_wire >= self.wire_len {
            return None;
        }
        let wire_offset = self.next_wire;
        // FPDUPTR: 0 for a marker opening the FPDU, else the distance back
        // to the length field (4 octets in when a marker opened the FPDU).
        let fpduptr = if wire_offset == 0 {
            0
        } else if self.leading {
            wire_offset - MARKER_LEN as u32
        } else {
            wire_offset
        };
        let slot = MarkerSlot {
            wire_offset,
            logical_offset: wire_offset - self.index * MARKER_LEN as u32,
            // FpduLayout::new keeps wire_len within 65539, so a marker's
            // distance back (below wire_len - 4) fits in 16 bits.
            bytes: marker_bytes(fpduptr as u16),
        };
        self.index += 1;
        self.next_wire = self.next_wire.saturating_add(MARKER_INTERVAL);
        Some(slot)
    }
}

impl FpduLayout {
    /// The layout of an FPDU carrying `ulpdu_len` octets that starts at
    /// stream position `start`, with markers if `markers`.
    pub fn new(start: u32, ulpdu_len: usize, markers: bool) -> Result<FpduLayout, FramerError> {
        let len = u16::try_from(ulpdu_len).map_err(|_| FramerError::UlpduTooLong(ulpdu_len))?;
        let logical = fpdu_len(ulpdu_len) as u32;
        let wire_len = wire_len(start, logical, markers);
        if markers && wire_len > MAX_WIRE_LEN {
            return Err(FramerError::UlpduTooLong(ulpdu_len));
        }
        Ok(FpduLayout {
            start,
            ulpdu_len: len,
            markers,
            wire_len,
        })
    }

    /// Stream position of the FPDU's first octet.
    pub const fn start(&self) -> u32 {
        self.start
    }

    /// Stream position just past the FPDU: where the next one starts.
    pub const fn end(&self) -> u32 {
        self.start.wrapping_add(self.wire_len)
    }

    /// ULPDU octets.
    pub const fn ulpdu_len(&self) -> usize {
        self.ulpdu_len as usize
    }

    /// Pad octets.
    pub const fn pad_len(&self) -> usize {
        pad_len(self.ulpdu_len as usize)
    }

    /// Octets without markers: length, ULPDU, pad, CRC.
    pub const fn logical_len(&self) -> usize {
        fpdu_len(self.ulpdu_len as usize)
    }

    /// Octets on the wire, markers included.
    pub const fn wire_len(&self) -> usize {
        self.wire_len as usize
    }

    /// Logical offset of the CRC field.
    pub const fn crc_offset(&self) -> usize {
        self.logical_len() - CRC_LEN
    }

    /// Number of markers inside this FPDU.
    pub const fn marker_count(&self) -> usize {
        (self.wire_len as usize - self.logical_len()) / MARKER_LEN
    }

    /// The markers to insert, in order (none without markers).
    pub fn markers(&self) -> MarkerSlots {
        let first = if self.markers {
            distance_to_marker(self.start)
        } else {
            u32::MAX
        };
        MarkerSlots {
            next_wire: first,
            index: 0,
            wire_len: self.wire_len,
            leading: first == 0,
        }
    }

    /// The ULPDU length field.
    pub const fn prefix(&self) -> [u8; LENGTH_LEN] {
        self.ulpdu_len.to_be_bytes()
    }

    /// Pad and CRC field, given the CRC (0 when CRCs are off).
    pub const fn trailer(&self, crc: u32) -> Trailer {
        let pad = self.pad_len();
        let mut bytes = [0u8; 3 + CRC_LEN];
        let c = crc.to_le_bytes();
        bytes[pad] = c[0];
        bytes[pad + 1] = c[1];
        bytes[pad + 2] = c[2];
        bytes[pad + 3] = c[3];
        Trailer {
            bytes,
            len: (pad + CRC_LEN) as u8,
        }
    }

    /// The CRC32c of the FPDU whose ULPDU is the concatenation of
    /// `ulpdu`: over the length field, the ULPDU, the pad and every marker
    /// before the CRC field.
    pub fn crc(&self, ulpdu: &[&[u8]]) -> Result<u32, FramerError> {
        let mut crc = 0u32;
        let prefix = self.prefix();
        let pad = [0u8; 3];
        self.walk(&prefix, ulpdu, &pad[..self.pad_len()], None, &mut |bytes| {
            crc = crate::crc::append(crc, bytes)
        })?;
        Ok(crc)
    }

    /// Writes the whole FPDU, markers included, into `out[..wire_len]`.
    /// `crc` says whether to compute the CRC (else the field is zero).
    pub fn write(&self, ulpdu: &[&[u8]], crc: bool, out: &mut [u8]) -> Result<usize, FramerError> {
        let out = out
            .get_mut(..self.wire_len())
            .ok_or(FramerError::BufferTooShort)?;
        let value = if crc { self.crc(ulpdu)? } else { 0 };
        let prefix = self.prefix();
        let trailer = self.trailer(value);
        let (pad, crc_field) = trailer.as_bytes().split_at(self.pad_len());
        let mut at = 0;
        self.walk(&prefix, ulpdu, pad, Some(crc_field), &mut |bytes| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        })?;
        Ok(at)
    }

    /// Feeds `sink` the FPDU in wire order: prefix, ULPDU pieces and pad
    /// with markers inserted, then (if given) the CRC field, with any
    /// marker that falls inside it. Without `crc_field` it stops at the CRC
    /// field, after a marker that sits right before it.
    fn walk(
        &self,
        prefix: &[u8],
        ulpdu: &[&[u8]],
        pad: &[u8],
        crc_field: Option<&[u8]>,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<(), FramerError> {
        if ulpdu.iter().map(|p| p.len()).sum::<usize>() != self.ulpdu_len() {
            return Err(FramerError::LengthMismatch);
        }
        let mut markers = self.markers().peekable();
        let mut logical = 0u32;
        let pieces = core::iter::once(prefix)
            .chain(ulpdu.iter().copied())
            .chain(core::iter::once(pad))
            .chain(crc_field);
        for mut piece in pieces {
            while !piece.is_empty() {
                while let Some(m) = markers.next_if(|m| m.logical_offset == logical) {
                    sink(&m.bytes);
                }
                let take = match markers.peek() {
                    Some(m) => ((m.logical_offset - logical) as usize).min(piece.len()),
                    None => piece.len(),
                };
                sink(&piece[..take]);
                piece = &piece[take..];
                logical += take as u32;
            }
        }
        // A marker right after the pad (before the CRC field), or, with
        // the CRC field written, none (it would belong to the next FPDU).
        if crc_field.is_none() {
            while let Some(m) = markers.next_if(|m| m.logical_offset == logical) {
                sink(&m.bytes);
            }
        }
        Ok(())
    }
}

/// Octets on the wire of an FPDU of `logical` octets starting at `start`.
fn wire_len(start: u32, logical: u32, markers: bool) -> u32 {
    if !markers {
        return logical;
    }
    // Each marker lengthens the FPDU, which may bring in another: iterate
    // to the fixed point (at most a couple of rounds).
    let mut count = 0;
    loop {
        let total = logical + count * MARKER_LEN as u32;
        let n = markers_in(start, total);
        if n == count {
            return total;
        }
        count = n;
    }
}

/// The pad and CRC field of an FPDU (at most 7 octets, no allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Trailer {
    bytes: [u8; 3 + CRC_LEN],
    len: u8,
}

impl Trailer {
    /// The octets to send after the ULPDU.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// One framed FPDU for a zero-copy sender: send `prefix`, the ULPDU
/// (header and payload by reference), then `trailer`, inserting the
/// markers of `layout` at their logical offsets if it has any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramedFpdu {
    /// Where it sits and its markers.
    pub layout: FpduLayout,
    /// The ULPDU length field.
    pub prefix: [u8; LENGTH_LEN],
    /// Pad and CRC.
    pub trailer: Trailer,
}

/// The FPDU builder for one direction of one connection: remembers the
/// stream position (for markers) and whether to compute CRCs.
#[derive(Debug, Clone)]
pub struct Framer {
    crc: bool,
    markers: bool,
    pos: u32,
}

impl Framer {
    /// A framer for the first FPDU of the stream.
    pub const fn new(crc: bool, markers: bool) -> Framer {
        Framer {
            crc,
            markers,
            pos: 0,
        }
    }

    /// A framer whose next FPDU starts at stream position `pos` (a
    /// multiple of 4 octets past the first FPDU).
    pub const fn with_position(crc: bool, markers: bool, pos: u32) -> Framer {
        Framer { crc, markers, pos }
    }

    /// A framer configured by connection setup: markers if the peer asked
    /// for them.
    pub const fn from_framing(framing: &Framing) -> Framer {
        Framer::new(framing.crc, framing.markers_tx)
    }

    /// Whether CRCs are computed.
    pub const fn crc_enabled(&self) -> bool {
        self.crc
    }

    /// Whether markers are inserted.
    pub const fn markers_enabled(&self) -> bool {
        self.markers
    }

    /// Stream position of the next FPDU.
    pub const fn position(&self) -> u32 {
        self.pos
    }

    /// The largest ULPDU whose FPDU, starting at the current position,
    /// fits in `max_segment` octets (MULPDU, with this position's markers
    /// and the CRC counted); `None` if not even an empty FPDU fits.
    pub fn max_ulpdu_len(&self, max_segment: usize) -> Option<usize> {
        // Logical lengths are multiples of 4; the largest ULPDU of a
        // logical length L is L - 6. Walk down from the largest that could
        // fit; each step drops at most one marker, so this takes a few
        // rounds.
        let mut logical = max_segment.min(fpdu_len(MAX_ULPDU_LEN)) & !3;
        while logical >= MIN_FPDU_LEN {
            let wire = wire_len(self.pos, logical as u32, self.markers);
            if wire as usize <= max_segment && (!self.markers || wire <= MAX_WIRE_LEN) {
                return Some((logical - LENGTH_LEN - CRC_LEN).min(MAX_ULPDU_LEN));
            }
            logical -= 4;
        }
        None
    }

    /// How much payload fits behind a `header_len`-octet DDP header in one
    /// FPDU of at most `max_segment` octets.
    pub fn max_payload_len(&self, header_len: usize, max_segment: usize) -> usize {
        self.max_ulpdu_len(max_segment)
            .map_or(0, |u| u.saturating_sub(header_len))
    }

    /// The layout of an FPDU of `ulpdu_len` octets at the current
    /// position, without advancing.
    pub fn layout(&self, ulpdu_len: usize) -> Result<FpduLayout, FramerError> {
        FpduLayout::new(self.pos, ulpdu_len, self.markers)
    }

    /// Frames the FPDU whose ULPDU is `header` then the `payload` pieces,
    /// at the current position, computing the CRC over them, and advances
    /// past it.
    pub fn frame(&mut self, header: &[u8], payload: &[&[u8]]) -> Result<FramedFpdu, FramerError> {
        let ulpdu_len = header.len() + payload.iter().map(|p| p.len()).sum::<usize>();
        let layout = self.layout(ulpdu_len)?;
        let crc = if self.crc {
            let mut crc = 0u32;
            let prefix = layout.prefix();
            let pad = [0u8; 3];
            let pieces = core::iter::once(header).chain(payload.iter().copied());
            if layout.marker_count() == 0 {
                crc = crate::crc::append(crc, &prefix);
                for p in pieces {
                    crc = crate::crc::append(crc, p);
                }
                crate::crc::append(crc, &pad[..layout.pad_len()])
            } else {
                // Rare (markers): gather the piece list on the stack.
                let mut list: [&[u8]; 17] = [&[]; 17];
                let mut n = 0;
                let mut overflow = false;
                for p in pieces {
                    if n == list.len() {
                        overflow = true;
                        break;
                    }
                    list[n] = p;
                    n += 1;
                }
                if overflow {
                    let all: Vec<&[u8]> = core::iter::once(header)
                        .chain(payload.iter().copied())
                        .collect();
                    layout.crc(&all)?
                } else {
                    layout.crc(&list[..n])?
                }
            }
        } else {
            0
        };
        self.pos = layout.end();
        Ok(FramedFpdu {
            layout,
            prefix: layout.prefix(),
            trailer: layout.trailer(crc),
        })
    }

    /// Advances past an FPDU framed elsewhere from [`Framer::layout`].
    pub fn advance(&mut self, layout: &FpduLayout) {
        self.pos = layout.end();
    }

    /// Convenience for tests and setup-time messages: the whole FPDU as
    /// one vector, markers included.
    pub fn build_fpdu(&mut self, header: &[u8], payload: &[u8]) -> Result<Vec<u8>, FramerError> {
        let layout = self.layout(header.len() + payload.len())?;
        let mut out = vec![0; layout.wire_len()];
        layout.write(&[header, payload], self.crc, &mut out)?;
        self.pos = layout.end();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(fpdu_len(0), 8);
        assert_eq!(fpdu_len(34), 40);
        assert_eq!(fpdu_len(46), 52);
        assert_eq!(fpdu_len(1442), 1448);
        assert_eq!(fpdu_len(1290), 1296);
        assert_eq!(pad_len(20), 2);
        assert_eq!(pad_len(22), 0);
    }

    #[test]
    fn mulpdu_without_markers() {
        let f = Framer::new(true, false);
        // siw with timestamps: 1448-octet FPDUs carry 1442-octet ULPDUs.
        assert_eq!(f.max_ulpdu_len(1448), Some(1442));
        assert_eq!(f.max_ulpdu_len(1460), Some(1454));
        assert_eq!(f.max_ulpdu_len(1451), Some(1442));
        assert_eq!(f.max_ulpdu_len(8), Some(2));
        assert_eq!(f.max_ulpdu_len(7), None);
        assert_eq!(f.max_ulpdu_len(1 << 20), Some(MAX_ULPDU_LEN));
        assert_eq!(f.max_payload_len(14, 1448), 1428);
        assert_eq!(f.max_payload_len(18, 1448), 1424);
    }

    #[test]
    fn mulpdu_for_huge_segments() {
        for markers in [false, true] {
            for pos in [0, 4, 508, 1000] {
                let f = Framer::with_position(true, markers, pos);
                let u = f.max_ulpdu_len(1 << 20).unwrap();
                assert!(f.layout(u).is_ok(), "markers {markers} pos {pos}");
                assert!(u == MAX_ULPDU_LEN || f.layout(u + 1).is_err());
            }
        }
    }

    #[test]
    fn mulpdu_with_markers() {
        let mut f = Framer::new(true, true);
        // At position 0: a leading marker plus markers at 512 and 1024.
        let u = f.max_ulpdu_len(1460).unwrap();
        let l = f.layout(u).unwrap();
        assert!(l.wire_len() <= 1460);
        assert!(f.layout(u + 1).unwrap().wire_len() > 1460);
        assert_eq!(l.marker_count(), 3);
        // Mid-interval.
        f.pos = 100;
        let u = f.max_ulpdu_len(1460).unwrap();
        assert!(f.layout(u).unwrap().wire_len() <= 1460);
        assert!(f.layout(u + 1).unwrap().wire_len() > 1460);
    }

    /// host-probe.pcap frame 167: a 40-octet FPDU carrying a Send, CRC on
    /// (value 0x8c34cd18, stored least significant octet first).
    const CRC_FPDU: &str =
        "0022 41430000000000000000000000010000000000007000000010001111000000000bb8 18cd348c";

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn golden_siw_crc() {
        let fpdu = hex(CRC_FPDU);
        let ulpdu = &fpdu[2..36];
        let mut f = Framer::new(true, false);
        let framed = f.frame(&ulpdu[..18], &[&ulpdu[18..]]).unwrap();
        assert_eq!(framed.prefix, [0, 34]);
        assert_eq!(framed.trailer.as_bytes(), &[0x18, 0xcd, 0x34, 0x8c]);
        assert_eq!(f.position(), 40);
        let mut g = Framer::new(true, false);
        assert_eq!(g.build_fpdu(&ulpdu[..18], &ulpdu[18..]).unwrap(), fpdu);
        // With CRCs off the field is zero.
        let mut h = Framer::new(false, false);
        let plain = h.build_fpdu(ulpdu, &[]).unwrap();
        assert_eq!(&plain[..36], &fpdu[..36]);
        assert_eq!(&plain[36..], &[0; 4]);
    }

    #[test]
    fn leading_marker_layout() {
        let l = FpduLayout::new(0, 1000, true).unwrap();
        let m: Vec<_> = l.markers().collect();
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].wire_offset, m[0].logical_offset, m[0].bytes),
            (0, 0, [0; 4])
        );
        // The second marker points back to the length field at wire 4.
        assert_eq!((m[1].wire_offset, m[1].logical_offset), (512, 508));
        assert_eq!(m[1].bytes, marker_bytes(508));
        assert_eq!(l.wire_len(), fpdu_len(1000) + 8);
    }
}
