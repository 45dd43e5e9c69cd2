//! What the send path hands to TCP: one record per FPDU (RFC 5044 §4),
//! header bytes inline, payload by reference into a pinned region, pad and
//! CRC after, markers where the layout puts them (RFC 5044 §5–§6); or, during
//! connection setup, a piece of an MPA request, reply or reject frame.
//!
//! A record is sent as exactly one TCP segment (the engine sizes it to the
//! capacity TCP offered, so FPDUs stay aligned with segments, as hardware
//! peers need). It owns the pin of its payload: the region cannot finish
//! deregistering while TCP may still retransmit the record. The driver gives
//! it back with [`Endpoint::record_acked`](super::Endpoint::record_acked) once
//! TCP reports it acknowledged (or
//! [`Endpoint::record_dropped`](super::Endpoint::record_dropped) when the
//! connection went away with it unacknowledged).
//!
//! A zero-copy driver walks [`OutRecord::pieces`]: small byte pieces (length
//! and DDP header, markers, pad and CRC) go into a header buffer, payload
//! pieces are attached from the region. A copying driver (the simulator,
//! ports without multi-segment transmit) uses [`OutRecord::copy_to`].

use crate::mpa::fpdu::MarkerSlots;
use crate::mpa::fpdu::{FpduLayout, Trailer};
use crate::mpa::markers::MARKER_LEN;
use crate::placement::{CheckedRange, Placement, RegionRef};
use crate::wire::rdmap::READ_REQUEST_LEN;
use crate::wire::terminate::{CONTROL_LEN, SEGMENT_LENGTH_LEN};
use crate::wire::UNTAGGED_HEADER_LEN;

/// Bytes of an FPDU before its payload, at most: the 2-byte ULPDU length,
/// an untagged DDP header and the longest RDMAP header after it (a
/// Terminate reporting an RDMA Read Request: control, segment length, the
/// DDP header and the Read Request header).
pub const MAX_HEAD_LEN: usize = 2
    + UNTAGGED_HEADER_LEN
    + CONTROL_LEN
    + SEGMENT_LENGTH_LEN
    + UNTAGGED_HEADER_LEN
    + READ_REQUEST_LEN;

/// What a record carries, for statistics and for the driver's logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// Bytes of an MPA request, reply or reject frame.
    MpaFrame,
    /// The peer-to-peer ready-to-receive message.
    Rtr,
    /// A Send (any variant).
    Send,
    /// An RDMA Write.
    RdmaWrite,
    /// An RDMA Read Request.
    ReadRequest,
    /// An RDMA Read Response (the zero-length answer to a Read RTR
    /// included).
    ReadResponse,
    /// Our Terminate.
    Terminate,
}

/// One piece of a record in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'r> {
    /// Bytes held by the record: length field and headers, pad and CRC,
    /// or MPA frame bytes.
    Bytes(&'r [u8]),
    /// A marker (RFC 5044 §5).
    Marker([u8; MARKER_LEN]),
    /// Payload in registered memory, pinned by the record.
    Payload(CheckedRange<'r>),
}

impl Piece<'_> {
    /// Octets on the wire.
    pub fn len(&self) -> usize {
        match self {
            Piece::Bytes(b) => b.len(),
            Piece::Marker(_) => MARKER_LEN,
            Piece::Payload(r) => r.len() as usize,
        }
    }

    /// Whether the piece is empty (never, from [`OutRecord::pieces`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One TCP record produced by [`Endpoint::poll_record`](super::Endpoint::poll_record).
///
/// Not `Clone`: it accounts for one pin of its payload's region. Dropping
/// it without giving it back leaks that pin (the region then never
/// finishes deregistering).
#[derive(Debug)]
#[must_use = "give the record back with Endpoint::record_acked or record_dropped"]
pub struct OutRecord {
    pub(super) kind: RecordKind,
    /// Stream offset just past this record (bytes sent on the connection
    /// since it started, MPA frames included).
    pub(super) end: u64,
    pub(super) body: Body,
}

#[derive(Debug)]
pub(super) enum Body {
    /// A slice of an MPA frame (connection setup; allocated once per
    /// connection).
    Setup(Box<[u8]>),
    /// An FPDU.
    Fpdu(Fpdu),
}

#[derive(Debug)]
pub(super) struct Fpdu {
    pub(super) layout: FpduLayout,
    /// Length field, DDP header and any RDMAP header after it.
    pub(super) head: [u8; MAX_HEAD_LEN],
    pub(super) head_len: u8,
    pub(super) payload: Option<RegionRef>,
    pub(super) trailer: Trailer,
    /// The payload's Internet checksum partial sum, when the CRC pass
    /// computed it (see [`OutRecord::payload_sum`]).
    pub(super) payload_sum: Option<u32>,
    /// The CRC is the driver's to compute ([`OutRecord::crc_pending`]).
    pub(super) crc_pending: bool,
}

impl OutRecord {
    /// Whether it ends a message: an FPDU whose DDP segment is the last of
    /// its DDP message (the L bit), or a piece of connection setup. TCP
    /// pushes such a record, and the receiver then acknowledges it at
    /// once rather than after its delayed-ACK time.
    pub fn ends_message(&self) -> bool {
        match &self.body {
            Body::Setup(_) => true,
            Body::Fpdu(f) => {
                f.head_len as usize > crate::mpa::fpdu::LENGTH_LEN
                    && f.head[crate::mpa::fpdu::LENGTH_LEN] & crate::wire::ddp::ddp_ctrl::LAST != 0
            }
        }
    }

    /// What it carries.
    pub fn kind(&self) -> RecordKind {
        self.kind
    }

    /// Octets on the wire (what TCP's sequence space advances by).
    pub fn len(&self) -> usize {
        match &self.body {
            Body::Setup(b) => b.len(),
            Body::Fpdu(f) => f.layout.wire_len(),
        }
    }

    /// Whether it is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stream offset just past this record: the engine's count of
    /// bytes sent on the connection, MPA frames included.
    pub fn end_offset(&self) -> u64 {
        self.end
    }

    /// The FPDU's layout (stream position, markers), `None` for setup bytes.
    pub fn layout(&self) -> Option<&FpduLayout> {
        match &self.body {
            Body::Setup(_) => None,
            Body::Fpdu(f) => Some(&f.layout),
        }
    }

    /// The payload's pinned region, if the FPDU carries payload.
    pub fn payload(&self) -> Option<&RegionRef> {
        match &self.body {
            Body::Setup(_) => None,
            Body::Fpdu(f) => f.payload.as_ref(),
        }
    }

    /// The Internet checksum's partial sum (RFC 1071, as
    /// [`crate::placement::internet_sum`]) of the payload bytes, taken as if
    /// they started at an even offset, if the CRC pass computed it.
    ///
    /// It is computed in the same pass over the payload as the MPA CRC
    /// ([`Placement::crc32c_and_sum`]), so a driver whose port cannot
    /// offload the TCP checksum need not sum the payload again when the
    /// segment is first sent. It describes the bytes as they were at that
    /// pass: a driver that reads the payload from the application's memory
    /// again on retransmission should sum those bytes again too, lest an
    /// application that changed the buffer before its completion (against
    /// the verbs) make every resent copy fail the peer's TCP checksum
    /// instead of the peer's MPA CRC check. `None` with the
    /// CRC off, without payload, when markers cut the payload into pieces
    /// (the driver then sums the pieces itself), or when the memory said
    /// the sum is not wanted ([`Placement::sum_with_crc`]: the port
    /// offloads the checksum).
    pub fn payload_sum(&self) -> Option<u32> {
        match &self.body {
            Body::Setup(_) => None,
            Body::Fpdu(f) => f.payload_sum,
        }
    }

    /// Whether the record's CRC field is left for the driver
    /// ([`Placement::crc_at_transmit`]): the pieces then end in the pad and
    /// a zero CRC, and the driver computes the CRC over the octets before
    /// it as it copies the payload into the frame, and sends
    /// [`OutRecord::trailer_with`] that CRC. Only FPDUs without markers
    /// are left so (with payload or without: a Read Request's CRC is then
    /// taken in the same short pass as its copy into the frame).
    pub fn crc_pending(&self) -> bool {
        match &self.body {
            Body::Setup(_) => false,
            Body::Fpdu(f) => f.crc_pending,
        }
    }

    /// The FPDU's pad and CRC field with `crc` in it (for a record whose
    /// CRC is pending); `None` for setup bytes.
    pub fn trailer_with(&self, crc: u32) -> Option<Trailer> {
        match &self.body {
            Body::Setup(_) => None,
            Body::Fpdu(f) => Some(f.layout.trailer(crc)),
        }
    }

    /// An FPDU without markers, in its three parts (what
    /// [`OutRecord::pieces`] walks for it); `None` for setup bytes and for
    /// an FPDU with markers. The payload is `None` when empty; the trailer
    /// holds the pad and the CRC field as the pieces end (a zero CRC
    /// while [`OutRecord::crc_pending`]).
    pub fn plain_parts(&self) -> Option<PlainParts<'_>> {
        match &self.body {
            Body::Fpdu(f) if f.layout.marker_count() == 0 => Some(PlainParts {
                head: f.head.get(..usize::from(f.head_len))?,
                payload: f
                    .payload
                    .as_ref()
                    .filter(|p| !p.is_empty())
                    .map(RegionRef::range),
                trailer: f.trailer.as_bytes(),
            }),
            _ => None,
        }
    }

    /// The pieces in wire order, markers inserted.
    pub fn pieces(&self) -> Pieces<'_> {
        Pieces::new(self, false)
    }

    /// Copies `dst.len()` octets of the record, starting at `offset`, into
    /// `dst`, reading payload through `mem`. Fails (copying nothing) if the
    /// range is not inside the record.
    pub fn copy_to<M: Placement + ?Sized>(
        &self,
        mem: &M,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), RangeError> {
        let end = offset.checked_add(dst.len()).ok_or(RangeError)?;
        if end > self.len() {
            return Err(RangeError);
        }
        let mut at = 0usize;
        for piece in self.pieces() {
            let len = piece.len();
            let (lo, hi) = (at.max(offset), (at + len).min(end));
            if lo < hi {
                let out = &mut dst[lo - offset..hi - offset];
                let (from, n) = (lo - at, hi - lo);
                match piece {
                    Piece::Bytes(b) => out.copy_from_slice(&b[from..from + n]),
                    Piece::Marker(m) => out.copy_from_slice(&m[from..from + n]),
                    Piece::Payload(r) => {
                        // from + n <= r.len(), which fits u32.
                        if let Some(sub) = r.sub(from as u32, n as u32) {
                            mem.read(sub, out);
                        }
                    }
                }
            }
            at += len;
            if at >= end {
                break;
            }
        }
        Ok(())
    }

    /// The whole record as a vector (tests and copying drivers).
    pub fn to_vec<M: Placement + ?Sized>(&self, mem: &M) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        // Cannot fail: the range is the whole record.
        let _ = self.copy_to(mem, 0, &mut v);
        v
    }

    /// Takes the payload pin out (to return it to the table).
    pub(super) fn take_pin(&mut self) -> Option<RegionRef> {
        match &mut self.body {
            Body::Setup(_) => None,
            Body::Fpdu(f) => f.payload.take(),
        }
    }
}

/// The parts of an FPDU without markers ([`OutRecord::plain_parts`]), in
/// wire order: what [`OutRecord::pieces`] yields for it.
#[derive(Debug, Clone, Copy)]
pub struct PlainParts<'r> {
    /// Length field, DDP header and any RDMAP header after it.
    pub head: &'r [u8],
    /// The payload in registered memory, if any.
    pub payload: Option<CheckedRange<'r>>,
    /// Pad and CRC field.
    pub trailer: &'r [u8],
}

/// A range outside the record was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RangeError;

impl core::fmt::Display for RangeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("range outside the record")
    }
}

impl std::error::Error for RangeError {}

/// The pieces of a record; see [`OutRecord::pieces`].
///
/// In "CRC mode" (used while building the FPDU) the walk stops at the CRC
/// field, after a marker that sits right before it: exactly the octets the
/// CRC covers (RFC 5044 §4.4 with markers, as [`FpduLayout::crc`] counts
/// them).
#[derive(Debug, Clone)]
pub struct Pieces<'r> {
    record: &'r OutRecord,
    /// Logical offset (markers not counted) of the next octet.
    logical: u32,
    /// Where the walk ends, logically.
    total: u32,
    crc_mode: bool,
    /// The FPDU's markers still to come (`None` for setup bytes).
    markers: Option<core::iter::Peekable<MarkerSlots>>,
    /// Setup records: already yielded.
    done: bool,
    /// An FPDU without markers walked whole (not in CRC mode): its parts
    /// in turn, by `stage`, without the offset arithmetic markers need
    /// (the send path walks every record).
    plain: Option<PlainParts<'r>>,
    stage: u8,
}

impl<'r> Pieces<'r> {
    pub(super) fn new(record: &'r OutRecord, crc_mode: bool) -> Pieces<'r> {
        let (total, markers) = match &record.body {
            Body::Setup(b) => (b.len() as u32, None),
            Body::Fpdu(f) => {
                let total = if crc_mode {
                    f.layout.crc_offset()
                } else {
                    f.layout.logical_len()
                };
                (total as u32, Some(f.layout.markers().peekable()))
            }
        };
        let plain = if crc_mode { None } else { record.plain_parts() };
        Pieces {
            record,
            logical: 0,
            total,
            crc_mode,
            markers,
            done: false,
            plain,
            stage: 0,
        }
    }
}

impl<'r> Iterator for Pieces<'r> {
    type Item = Piece<'r>;

    fn next(&mut self) -> Option<Piece<'r>> {
        let f = match &self.record.body {
            Body::Setup(b) => {
                if self.done || b.is_empty() {
                    return None;
                }
                self.done = true;
                return Some(Piece::Bytes(b));
            }
            Body::Fpdu(f) => f,
        };
        if let Some(p) = self.plain {
            loop {
                self.stage += 1;
                match self.stage {
                    1 if !p.head.is_empty() => return Some(Piece::Bytes(p.head)),
                    2 => {
                        if let Some(r) = p.payload {
                            return Some(Piece::Payload(r));
                        }
                    }
                    3 => return Some(Piece::Bytes(p.trailer)),
                    1 => {}
                    _ => return None,
                }
            }
        }
        // A marker due before the next octet (or, in CRC mode, right
        // before the CRC field).
        let logical = self.logical;
        let total = self.total;
        let crc_mode = self.crc_mode;
        let markers = self.markers.as_mut()?;
        if let Some(m) = markers.next_if(|m| {
            m.logical_offset == logical && (logical < total || (crc_mode && logical == total))
        }) {
            return Some(Piece::Marker(m.bytes));
        }
        let next_marker = markers.peek().map(|m| m.logical_offset);
        if self.logical >= self.total {
            return None;
        }
        let head = u32::from(f.head_len);
        let plen = f.payload.as_ref().map_or(0, RegionRef::len);
        let (seg_start, seg_end) = if self.logical < head {
            (0, head)
        } else if self.logical < head + plen {
            (head, head + plen)
        } else {
            (head + plen, self.total)
        };
        let mut end = seg_end.min(self.total);
        if let Some(m) = next_marker.filter(|&m| m > self.logical) {
            end = end.min(m);
        }
        let from = (self.logical - seg_start) as usize;
        let n = (end - self.logical) as usize;
        self.logical = end;
        Some(if seg_start == 0 && head > 0 {
            Piece::Bytes(&f.head[from..from + n])
        } else if seg_start == head && plen > 0 {
            let range = f.payload.as_ref().map(RegionRef::range)?;
            Piece::Payload(range.sub(from as u32, n as u32)?)
        } else {
            let t = f.trailer.as_bytes();
            Piece::Bytes(&t[from..(from + n).min(t.len())])
        })
    }
}

/// CRC32c of an FPDU record over its covered octets (length field, ULPDU,
/// pad, and markers before the CRC field), payload read through `mem`;
/// and, from the same pass over the payload, the payload's Internet
/// checksum partial sum when `mem` asks for it
/// ([`Placement::sum_with_crc`]) and the payload is one piece (no marker
/// inside it), for [`OutRecord::payload_sum`].
pub(super) fn fpdu_crc<M: Placement + ?Sized>(record: &OutRecord, mem: &M) -> (u32, Option<u32>) {
    let mut crc = 0u32;
    let mut sum = None;
    let mut payload_pieces = 0u32;
    let want_sum = mem.sum_with_crc();
    for piece in Pieces::new(record, true) {
        crc = match piece {
            Piece::Bytes(b) => crate::crc::append(crc, b),
            Piece::Marker(m) => crate::crc::append(crc, &m),
            Piece::Payload(r) if want_sum => {
                payload_pieces += 1;
                let (c, s) = mem.crc32c_and_sum(crc, r);
                sum = Some(s);
                c
            }
            Piece::Payload(r) => mem.crc32c_append(crc, r),
        };
    }
    (crc, sum.filter(|_| payload_pieces == 1))
}
