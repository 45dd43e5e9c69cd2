//! Transmit: the records a connection queues into TCP (FPDUs from the
//! QP engine, [`FpduRecord`]), their TCP checksum sums, and the last
//! stage of each iteration, which builds frames from TCP's segments
//! (headers written, payload attached from registered memory or copied)
//! and hands them to the link in one burst. Records TCP gives up
//! unacknowledged (a reset, a timeout) come back from the TCP engine's
//! `poll_dropped` and return their pins to the QP engine
//! ([`return_dropped`]).

use core::cell::Cell;
use core::ops::Range;
use core::sync::atomic::{AtomicU64, Ordering};

use rdmap::engine::{Endpoint, OutRecord, Piece, PlainParts};
use rdmap::mpa::fpdu::CRC_LEN;
use tcp_offload::iface::FrameParts;
use tcp_offload::tcp::{ConnId, Record, RecordBytes, Stack};
use tcp_offload::wire::checksum;
use tcp_offload::Instant;

use crate::link::{FrameFull, LinkQueue, TxFrame};
use crate::memory::{MemoryTable, Region, RegionSlice};

use super::conn::{env, worker_cx, Conn, Cx};
use super::counters::{bump, WorkerCounters};
use super::records::{RecordRef, Records};
use super::{Worker, MAX_FPDUS_PER_POLL, MAX_SMALL_FPDUS_PER_POLL, SMALL_FPDU, TX_BURST};

/// Room for the Ethernet, IPv4 and TCP headers of one segment (14 + 60 +
/// 60, rounded up).
pub(super) const HDR_BUF: usize = 160;

/// Whether two partial sums of the same bytes' positions fold to the same
/// one's-complement value (0 and 0xffff are both zero).
pub(super) fn same_sum(a: u32, b: u32) -> bool {
    let norm = |s: u32| match checksum::fold(s) {
        0xffff => 0,
        v => v,
    };
    norm(a) == norm(b)
}

/// Records dropped while still holding the QP engine's record: neither
/// acknowledged nor handed back by TCP's `poll_dropped`, so their pins
/// were never returned. Every path gives records back explicitly; this
/// counts a leak should one be missed ([`fpdu_records_leaked`]).
static LEAKED: AtomicU64 = AtomicU64::new(0);

/// Records dropped without their pin given back, in this process, since
/// it started (zero unless a record leaked; see [`FpduRecord`]).
pub fn fpdu_records_leaked() -> u64 {
    LEAKED.load(Ordering::Relaxed)
}

/// An FPDU (or MPA frame bytes) as a TCP record: the engine's
/// [`OutRecord`], whose payload is a pinned range of a region, and what
/// the transmit path needs to know of it. The region itself is looked up
/// when the record is sent (`Sendable`): no reference count is taken
/// per record.
///
/// It leaves TCP acknowledged (`Event::RecordAcked`) or given up
/// (`poll_dropped`), and the worker hands the engine's record back either
/// way; dropping one that still holds it counts a leak
/// ([`fpdu_records_leaked`]).
#[derive(Debug)]
pub struct FpduRecord {
    rec: Option<OutRecord>,
    len: usize,
    markers: bool,
    /// The record's stored payload sum ([`OutRecord::payload_sum`]) went
    /// into a segment's checksum once; later segments sum the payload
    /// from memory ([`Sendable::tx_sum`]).
    stored_sum_spent: Cell<bool>,
    /// The engine left the MPA CRC to us ([`OutRecord::crc_pending`]):
    /// the first transmission computes it over the bytes it copies into
    /// the frame ([`Sendable::emit_fused`]) and keeps it here.
    crc_pending: bool,
    crc: Cell<Option<u32>>,
}

/// Records up to this long are sent by [`Sendable::emit_small`].
const SMALL_RECORD: usize = 256;

/// Bytes of the next record's source hinted while a record is copied.
const NEXT_RECORD_PREFETCH: usize = 2048;

/// What [`Sendable::emit_fused`] found in its pass over the record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct FusedSum {
    /// The Internet checksum's partial sum of the record's bytes.
    pub(super) sum: u32,
    /// Payload bytes copied (and summed) again for a record sent before:
    /// a retransmission ([`WorkerCounters::tx_resummed_bytes`]).
    ///
    /// [`WorkerCounters::tx_resummed_bytes`]: super::counters::WorkerCounters::tx_resummed_bytes
    pub(super) resummed: usize,
    /// The bytes copied again no longer have the CRC of the first
    /// transmission, which the segment carries all the same (the peer's
    /// CRC check then ends the stream).
    pub(super) changed: bool,
}

/// The payload sum of one TCP segment cut from a record, and where it came
/// from ([`Sendable::tx_sum`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct SegmentSum {
    /// The Internet checksum's partial sum of the segment's record bytes.
    pub(super) sum: u32,
    /// Payload bytes read from memory because no stored sum covered them
    /// ([`WorkerCounters::tx_summed_bytes`]).
    pub(super) read: usize,
    /// Payload bytes read from memory although the stored sum covered
    /// them, because it was already spent
    /// ([`WorkerCounters::tx_resummed_bytes`]).
    pub(super) resummed: usize,
    /// The bytes summed again no longer match the stored sum
    /// ([`WorkerCounters::tx_payload_changed`]).
    pub(super) changed: bool,
    /// The stored sum went into this segment.
    pub(super) used_stored: bool,
}

impl SegmentSum {
    /// Takes in what another sum of the same segment read (its bytes
    /// and whether they changed; not its sum).
    fn add(&mut self, other: &SegmentSum) {
        self.read += other.read;
        self.resummed += other.resummed;
        self.changed |= other.changed;
    }

    /// Takes in what a fused pass over part of the segment read again.
    fn add_fused(&mut self, f: &FusedSum) {
        self.resummed += f.resummed;
        self.changed |= f.changed;
    }

    /// Adds what the segment's sum read to the worker's counters.
    fn count(&self, counters: &WorkerCounters) {
        if self.read > 0 {
            bump(&counters.tx_summed_bytes, self.read as u64);
        }
        if self.resummed > 0 {
            bump(&counters.tx_resummed_bytes, self.resummed as u64);
            if self.changed {
                bump(&counters.tx_payload_changed, 1);
            }
        }
    }
}

/// A piece of a record within a range: bytes it holds, or payload at an
/// offset of its region.
pub(super) enum Chunk<'a> {
    Bytes(&'a [u8]),
    Payload { offset: usize, len: usize },
}

impl FpduRecord {
    /// A record not built yet: the engine writes its record into
    /// [`FpduRecord::engine_slot`], then [`FpduRecord::settle`] finishes it.
    #[inline]
    pub(super) fn vacant() -> FpduRecord {
        FpduRecord {
            rec: None,
            len: 0,
            markers: false,
            stored_sum_spent: Cell::new(false),
            crc_pending: false,
            crc: Cell::new(None),
        }
    }

    /// Where the engine builds its record.
    #[inline]
    pub(super) fn engine_slot(&mut self) -> &mut Option<OutRecord> {
        &mut self.rec
    }

    /// Takes in what the engine's record says: its length, its CRC left
    /// to us, its markers.
    #[inline]
    pub(super) fn settle(&mut self) {
        let Some(rec) = &self.rec else {
            return;
        };
        self.markers = rec.layout().is_some_and(|l| l.markers().next().is_some());
        self.len = rec.len();
        self.crc_pending = rec.crc_pending();
    }

    /// A record of `len` bytes holding no engine record (the records
    /// table's tests).
    #[cfg(test)]
    pub(super) fn empty_for_test(len: usize) -> FpduRecord {
        FpduRecord {
            rec: None,
            len,
            markers: false,
            stored_sum_spent: Cell::new(false),
            crc_pending: false,
            crc: Cell::new(None),
        }
    }

    /// Whether the record's payload has an odd length.
    /// Whether the record ends a message ([`OutRecord::ends_message`]);
    /// a record without the engine's (a test's) does.
    pub(super) fn ends_message(&self) -> bool {
        self.rec.as_ref().is_none_or(|r| r.ends_message())
    }

    pub(super) fn odd_payload(&self) -> bool {
        self.rec
            .as_ref()
            .and_then(OutRecord::payload)
            .is_some_and(|p| p.range().len() % 2 == 1)
    }

    /// The engine's record, to give back.
    pub(super) fn take(mut self) -> Option<OutRecord> {
        self.rec.take()
    }

    /// Hands the engine's record to `f` where it lies (to give its pin
    /// back), then drops it there.
    pub(super) fn release_with(&mut self, f: impl FnOnce(&mut OutRecord)) {
        if let Some(rec) = self.rec.as_mut() {
            f(rec);
        }
        self.rec = None;
    }

    /// The CRC a transmission sends: the first transmission's (`crc`, now
    /// kept); a later one's `crc` only says whether the bytes changed
    /// since, in `changed`.
    fn first_crc(&self, crc: u32, changed: &mut bool) -> u32 {
        match self.crc.get() {
            Some(first) => {
                *changed = first != crc;
                first
            }
            None => {
                self.crc.set(Some(crc));
                crc
            }
        }
    }
}

/// A record and the region its payload lies in, as the transmit path
/// reads it: the region is looked up in the worker's [`MemoryTable`]
/// when the record is sent, not cloned into the record when it is built.
/// The record's pin keeps the table's entry (see [`crate::memory`]): a
/// region is not dropped while an FPDU built from it is in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sendable<'a> {
    record: &'a FpduRecord,
    region: Option<&'a Region>,
}

impl core::ops::Deref for Sendable<'_> {
    type Target = FpduRecord;
    fn deref(&self) -> &FpduRecord {
        self.record
    }
}

impl<'a> Sendable<'a> {
    /// `record`, its payload read from `mem`.
    pub(super) fn new(record: &'a FpduRecord, mem: &'a MemoryTable) -> Sendable<'a> {
        let region = record
            .rec
            .as_ref()
            .and_then(OutRecord::payload)
            .and_then(|p| mem.get(p.range().region()));
        Sendable { record, region }
    }

    /// Calls `f` with each piece of the record inside `range`, and the
    /// piece's offset from `range.start`.
    pub(super) fn walk<E>(
        &self,
        range: Range<usize>,
        mut f: impl FnMut(usize, Chunk<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let Some(rec) = &self.rec else {
            return Ok(());
        };
        let mut at = 0usize;
        for piece in rec.pieces() {
            let len = piece.len();
            let (lo, hi) = (at.max(range.start), (at + len).min(range.end));
            if lo < hi {
                let (from, n, rel) = (lo - at, hi - lo, lo - range.start);
                match piece {
                    // The pad and CRC of a record whose CRC is ours: with
                    // the CRC in it.
                    Piece::Bytes(b) if self.crc_pending && at + len == self.len => {
                        match rec.trailer_with(self.crc_value()) {
                            Some(t) if t.as_bytes().len() == b.len() => {
                                f(rel, Chunk::Bytes(&t.as_bytes()[from..from + n]))?
                            }
                            _ => f(rel, Chunk::Bytes(&b[from..from + n]))?,
                        }
                    }
                    Piece::Bytes(b) => f(rel, Chunk::Bytes(&b[from..from + n]))?,
                    Piece::Marker(m) => f(rel, Chunk::Bytes(&m[from..from + n]))?,
                    Piece::Payload(r) => f(
                        rel,
                        Chunk::Payload {
                            offset: r.offset() as usize + from,
                            len: n,
                        },
                    )?,
                }
            }
            at += len;
            if at >= range.end {
                break;
            }
        }
        Ok(())
    }

    /// The MPA CRC of a record whose CRC is ours: the one its first
    /// transmission computed, or (should the record be read before it is
    /// sent, as a frame held for an address is) computed now from the
    /// region and kept.
    fn crc_value(&self) -> u32 {
        if let Some(c) = self.crc.get() {
            return c;
        }
        let Some(rec) = &self.rec else {
            return 0;
        };
        let mut crc = 0u32;
        let mut at = 0usize;
        for piece in rec.pieces() {
            let len = piece.len();
            crc = match piece {
                // The trailer: its pad only.
                Piece::Bytes(b) if at + len == self.len => {
                    rdmap::crc::append(crc, &b[..b.len().saturating_sub(CRC_LEN)])
                }
                Piece::Bytes(b) => rdmap::crc::append(crc, b),
                Piece::Marker(m) => rdmap::crc::append(crc, &m),
                Piece::Payload(r) => self.region.as_ref().map_or(crc, |region| {
                    region.crc32c_append(crc, r.offset() as usize, r.len() as usize)
                }),
            };
            at += len;
        }
        self.crc.set(Some(crc));
        crc
    }

    /// Whether [`Sendable::emit_fused`] can send the record bytes in
    /// `range`: the whole record, its CRC ours, its payload (if any) in a
    /// region.
    pub(super) fn fusable(&self, range: &Range<usize>) -> bool {
        self.crc_pending
            && *range == (0..self.len)
            && (self.region.is_some() || self.rec.as_ref().is_some_and(|r| r.payload().is_none()))
    }

    /// Appends `header_len` zero bytes (the headers, patched in later) and
    /// the whole record to `frame` in one pass over the payload: copied
    /// from the region into the frame, and the MPA CRC and (with
    /// `want_sum`) the TCP checksum's partial sum computed over the copy.
    /// The first transmission keeps the CRC; a retransmission sends that
    /// one, whatever the buffer holds now (see [`Sendable::tx_sum`] for
    /// why: the peer's CRC check ends the stream), and says whether the
    /// bytes still match it.
    pub(super) fn emit_fused<F: TxFrame>(
        &self,
        frame: &mut F,
        header_len: usize,
        want_sum: bool,
    ) -> Result<FusedSum, FrameFull> {
        let Some(rec) = &self.rec else {
            return Err(FrameFull);
        };
        let region = self.region;
        if self.len <= SMALL_RECORD {
            return self.emit_small(rec, region, frame, header_len, want_sum);
        }
        // An FPDU without markers (one with them is not fusable): its
        // head, payload and trailer in turn.
        let parts = rec.plain_parts().ok_or(FrameFull)?;
        // Where the frame holds the headers and the whole record in one
        // piece of its buffer, room taken once and each part written
        // there (one call into the port, not four); else appended part
        // by part.
        if let Some(buf) = frame.append_in_place(header_len + self.len) {
            // The headers' room holds zeros until they are written, as
            // `append_zeros` leaves it.
            let (headers, buf) = buf.split_at_mut_checked(header_len).ok_or(FrameFull)?;
            headers.fill(0);
            let mut room = InPlace(buf);
            let out = self.fuse_parts(rec, &parts, region, &mut room, want_sum)?;
            // The room was the record's length: all of it written.
            return if room.0.is_empty() {
                Ok(out)
            } else {
                Err(FrameFull)
            };
        }
        frame.append_zeros(header_len)?;
        self.fuse_parts(rec, &parts, region, &mut Appending(frame), want_sum)
    }

    /// The parts of an FPDU without markers into `dst`: the length
    /// field and the DDP header, the payload copied from the region in
    /// the pass that takes its CRC and sum, the pad and the CRC field;
    /// the CRC and sum taken from the record's bytes, never read back
    /// from the frame. Inlined into `emit_fused` (once per destination
    /// kind): called, its result came back through memory and was read
    /// back wider than it was written, a load the CPU cannot forward
    /// from the stores (30 % of `emit_fused`'s samples).
    #[inline(always)]
    fn fuse_parts(
        &self,
        rec: &OutRecord,
        parts: &PlainParts<'_>,
        region: Option<&Region>,
        dst: &mut impl FusedDst,
        want_sum: bool,
    ) -> Result<FusedSum, FrameFull> {
        let mut out = FusedSum::default();
        dst.bytes(parts.head)?;
        let (mut crc, s) = crate::pass::crc_sum(0, parts.head);
        let mut sum = checksum::combine_at(0, s, 0);
        let mut at = parts.head.len();
        if let Some(r) = parts.payload {
            let (offset, len) = (r.offset() as usize, r.len() as usize);
            let region = region.ok_or(FrameFull)?;
            // The next record of a message is most often the bytes that
            // follow: under way while these are copied. Their start only:
            // the CPU's own prefetcher follows the stream from there.
            region.prefetch(offset + len, len.min(NEXT_RECORD_PREFETCH));
            let (c, s) = dst.payload(region, offset, len, crc)?;
            crc = c;
            sum = checksum::combine_at(sum, s, at);
            at += len;
            if self.crc.get().is_some() {
                out.resummed += len;
            }
        }
        // The pad is covered; the CRC field follows.
        let pad = parts.trailer.len().checked_sub(CRC_LEN).ok_or(FrameFull)?;
        crc = crate::pass::crc_sum(crc, &parts.trailer[..pad]).0;
        let crc = self.first_crc(crc, &mut out.changed);
        let t = rec.trailer_with(crc).ok_or(FrameFull)?;
        dst.bytes(t.as_bytes())?;
        if want_sum {
            out.sum = checksum::combine_at(sum, crate::checksum::sum(t.as_bytes()), at);
        }
        Ok(out)
    }

    /// [`Sendable::emit_fused`] for a record of at most
    /// [`SMALL_RECORD`] bytes: assembled whole (header, payload copied
    /// from the region, pad) where the frame gives it room in one piece,
    /// else on the stack and appended, so that its CRC and sum are one
    /// pass and its append one call rather than one per piece; for small
    /// messages the calls, not the bytes, are the cost.
    fn emit_small<F: TxFrame>(
        &self,
        rec: &OutRecord,
        region: Option<&Region>,
        frame: &mut F,
        header_len: usize,
        want_sum: bool,
    ) -> Result<FusedSum, FrameFull> {
        if let Some(dst) = frame.append_in_place(header_len + self.len) {
            // The headers' room (patched in later) zeroed as
            // `append_zeros` would; a failure below leaves the frame
            // partly written, and a frame that fails is not sent.
            let (head, body) = dst.split_at_mut(header_len);
            head.fill(0);
            return self.assemble_small(rec, region, body, want_sum);
        }
        let mut buf = [0u8; SMALL_RECORD];
        let body = buf.get_mut(..self.len).ok_or(FrameFull)?;
        let out = self.assemble_small(rec, region, body, want_sum)?;
        frame.append_zeros(header_len)?;
        frame.append(body)?;
        Ok(out)
    }

    /// Writes the whole record into `buf` (exactly its length) with its
    /// CRC, and returns what [`Sendable::emit_fused`] reports.
    fn assemble_small(
        &self,
        rec: &OutRecord,
        region: Option<&Region>,
        buf: &mut [u8],
        want_sum: bool,
    ) -> Result<FusedSum, FrameFull> {
        let mut out = FusedSum::default();
        // A fusable record is an FPDU without markers (its CRC is ours to
        // compute): head, payload, trailer, copied without a walk.
        let p = rec.plain_parts().ok_or(FrameFull)?;
        if buf.len() != self.len {
            return Err(FrameFull);
        }
        let (head, rest) = buf.split_at_mut_checked(p.head.len()).ok_or(FrameFull)?;
        head.copy_from_slice(p.head);
        let plen = p.payload.map_or(0, |r| r.len() as usize);
        let (body, trailer) = rest.split_at_mut_checked(plen).ok_or(FrameFull)?;
        if let Some(r) = p.payload {
            region
                .ok_or(FrameFull)?
                .read(r.offset() as usize, body)
                .map_err(|_| FrameFull)?;
            if self.crc.get().is_some() {
                out.resummed += plen;
            }
        }
        if trailer.len() != p.trailer.len() {
            return Err(FrameFull);
        }
        trailer.copy_from_slice(p.trailer);
        let t_at = p.head.len() + plen;
        // Everything up to the CRC field (the trailer's pad included), its
        // CRC and its sum in one pass.
        let crc_at = self.len.saturating_sub(CRC_LEN);
        let (crc, head_sum) = crate::pass::crc_sum(0, &buf[..crc_at]);
        let crc = self.first_crc(crc, &mut out.changed);
        let t = rec.trailer_with(crc).ok_or(FrameFull)?;
        let t = t.as_bytes();
        buf.get_mut(t_at..t_at + t.len())
            .ok_or(FrameFull)?
            .copy_from_slice(t);
        if want_sum {
            let crc_sum = crate::checksum::sum(&buf[crc_at..]);
            out.sum = checksum::combine_at(head_sum, crc_sum, crc_at);
        }
        Ok(out)
    }

    /// The payload sum for the TCP checksum of the segment the transmit
    /// path is building now: the stored sum at most once, then the bytes
    /// themselves.
    ///
    /// The payload is attached from (or copied out of) the application's
    /// registered region each time the segment goes out, so a
    /// retransmission carries whatever the buffer holds then. An
    /// application that changes the buffer of a posted Send or Write
    /// before its completion, or the source of a Read the peer has not yet
    /// seen complete, breaks the verbs contract, but the stream must still
    /// end cleanly: with the stored
    /// sum, the resent bytes would carry a checksum of the old ones, the
    /// peer's TCP would drop every copy as corrupt and the connection
    /// would stall until TCP gave up. Summed afresh, the segment passes
    /// the peer's TCP, and with the MPA CRC on (computed over the old
    /// bytes) the peer's CRC check fails and ends the stream with a
    /// Terminate (RFC 5044 §8, MPA CRC error) that both applications see;
    /// with the CRC off the peer places the new bytes, which the verbs
    /// leave undefined. The first transmission keeps the folded sum (the
    /// fast path): should the buffer have changed between the record's
    /// CRC pass and that transmission, only that one segment is lost.
    ///
    /// A change is counted ([`SegmentSum::changed`]) and nothing else: the
    /// sender does not end the stream itself. RFC 5040 has no Terminate
    /// for a sender's own buffer changing under it, the 16-bit sum misses
    /// some changes (so any action would depend on which loss happened to
    /// force a retransmission), and the peer's CRC check already detects
    /// every change the CRC covers, on every transmission. A buffer
    /// rewritten while its segment is summed and sent can still go out
    /// with a mismatching checksum; the next retransmission sums it again.
    pub(super) fn tx_sum(&self, range: Range<usize>) -> SegmentSum {
        let s = self.sum_range(range, !self.stored_sum_spent.get());
        if s.used_stored {
            self.stored_sum_spent.set(true);
        }
        s
    }

    /// The Internet checksum's partial sum of the record bytes in `range`
    /// (the payload of a TCP segment sent in parts), read from the pieces:
    /// header bytes in place, payload from the sum the CRC pass stored
    /// when the segment carries all of it and `trust_stored` (otherwise
    /// the payload it covers is summed again and compared with it), from
    /// the region for any other part.
    pub(super) fn sum_range(&self, range: Range<usize>, trust_stored: bool) -> SegmentSum {
        // The payload as one range of its region, and the sum of it the
        // CRC pass computed (`OutRecord::payload_sum`).
        let stored = self.rec.as_ref().and_then(|rec| {
            let p = rec.payload()?.range();
            Some((p.offset() as usize, p.len() as usize, rec.payload_sum()?))
        });
        let from_region = |offset, len| {
            self.region
                .map_or(0, |r: &Region| r.checksum_sum(offset, len))
        };
        let mut out = SegmentSum::default();
        let _ = self.walk::<()>(range, |rel, c| {
            let s = match c {
                Chunk::Bytes(b) => crate::checksum::sum(b),
                Chunk::Payload { offset, len } => match stored {
                    Some((o, l, sum)) if (o, l) == (offset, len) && trust_stored => {
                        out.used_stored = true;
                        sum
                    }
                    Some((o, l, sum)) if (o, l) == (offset, len) => {
                        out.resummed += len;
                        let fresh = from_region(offset, len);
                        out.changed |= !same_sum(fresh, sum);
                        fresh
                    }
                    _ => {
                        out.read += len;
                        from_region(offset, len)
                    }
                },
            };
            out.sum = checksum::combine_at(out.sum, s, rel);
            Ok(())
        });
        out
    }

    /// Appends the record bytes in `range` to `frame`: bytes copied,
    /// payload attached when `attach` (and no markers cut it up), copied
    /// otherwise.
    pub(super) fn emit<F: TxFrame>(
        &self,
        frame: &mut F,
        range: Range<usize>,
        attach: bool,
    ) -> Result<(), FrameFull> {
        let attach = attach && !self.markers;
        self.walk(range, |_, c| match c {
            Chunk::Bytes(b) => frame.append(b),
            Chunk::Payload { offset, len } => match self.region {
                Some(region) if attach => frame.attach(RegionSlice {
                    region: region.clone(),
                    offset,
                    len,
                }),
                Some(region) => frame.append_copy(region, offset, len),
                None => frame.append_zeros(len),
            },
        })
    }
}

impl Record for FpduRecord {
    fn len(&self) -> usize {
        self.len
    }
}

impl Record for Sendable<'_> {
    fn len(&self) -> usize {
        self.len
    }
}

impl RecordBytes for Sendable<'_> {
    fn copy_to(&self, offset: usize, dst: &mut [u8]) {
        let end = offset.saturating_add(dst.len());
        let _ = self.walk::<()>(offset..end, |rel, c| {
            match c {
                Chunk::Bytes(b) => dst[rel..rel + b.len()].copy_from_slice(b),
                Chunk::Payload { offset, len } => match self.region {
                    Some(r) => r.copy_out(offset, &mut dst[rel..rel + len]),
                    None => dst[rel..rel + len].fill(0),
                },
            }
            Ok(())
        });
    }
}

impl Drop for FpduRecord {
    /// A safety net, not the way back: a record still holding the
    /// engine's record was neither acknowledged nor handed back by TCP,
    /// and its pin stays taken. It is counted ([`fpdu_records_leaked`]).
    fn drop(&mut self) {
        if self.rec.is_some() {
            LEAKED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Where [`Sendable::fuse_parts`] puts a record's parts.
trait FusedDst {
    /// Appends `b`.
    fn bytes(&mut self, b: &[u8]) -> Result<(), FrameFull>;
    /// Appends `len` bytes of `region` from `offset`, copied in the pass
    /// that returns their CRC (extended from `crc`) and sum.
    fn payload(
        &mut self,
        region: &Region,
        offset: usize,
        len: usize,
        crc: u32,
    ) -> Result<(u32, u32), FrameFull>;
}

/// The room a frame gave in one piece, filled from its start.
struct InPlace<'b>(&'b mut [u8]);

impl InPlace<'_> {
    /// The next `n` bytes of the room, taken.
    fn take(&mut self, n: usize) -> Result<&mut [u8], FrameFull> {
        let room = core::mem::take(&mut self.0);
        let (dst, rest) = room.split_at_mut_checked(n).ok_or(FrameFull)?;
        self.0 = rest;
        Ok(dst)
    }
}

impl FusedDst for InPlace<'_> {
    fn bytes(&mut self, b: &[u8]) -> Result<(), FrameFull> {
        self.take(b.len())?.copy_from_slice(b);
        Ok(())
    }

    fn payload(
        &mut self,
        region: &Region,
        offset: usize,
        len: usize,
        crc: u32,
    ) -> Result<(u32, u32), FrameFull> {
        region
            .read_pass(offset, self.take(len)?, crc)
            .map_err(|_| FrameFull)
    }
}

/// A frame appended to part by part.
struct Appending<'f, F>(&'f mut F);

impl<F: TxFrame> FusedDst for Appending<'_, F> {
    fn bytes(&mut self, b: &[u8]) -> Result<(), FrameFull> {
        self.0.append(b)
    }

    fn payload(
        &mut self,
        region: &Region,
        offset: usize,
        len: usize,
        crc: u32,
    ) -> Result<(u32, u32), FrameFull> {
        self.0.append_copy_pass(region, offset, len, crc)
    }
}

/// Gives the pins of the records TCP gave up on connection `tcp` (a
/// reset, an abort, a timeout) back to its endpoint. Without an endpoint
/// they stay in TCP until there is one.
pub(super) fn return_dropped<B: AsRef<[u8]>>(
    stack: &mut Stack<B, RecordRef>,
    records: &mut Records,
    device: &mut rdmap::verbs::Device,
    tcp: ConnId,
    ep: Option<&mut Endpoint>,
) {
    let Some(ep) = ep else {
        return;
    };
    while let Some(r) = stack.poll_dropped(tcp) {
        if let Some(rec) = records.remove(r).and_then(FpduRecord::take) {
            ep.record_dropped(rec, device);
        }
    }
}

/// How far [`Conn::send_records`] builds a connection's records.
///
/// Records are built late: a connection keeps one queued ahead of its
/// turn, which is what puts it in TCP's round of turns, and the rest are
/// built when its turn comes ([`Worker::top_up_turn`]). With thousands of
/// busy connections, building all that their windows allowed at once put
/// hundreds of thousands of records in flight, most of them waiting a
/// whole round of turns, and their first use of the records table's and
/// the send queues' pages was a third of the sending thread's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fill {
    /// Until the connection has [`AHEAD`] records unsent.
    Ahead,
    /// At least one record, then until `left` payload bytes (what is
    /// left of the connection's turn) or, with `to_end`, until a record
    /// ends a message: the turn has sent its bytes and goes on only to
    /// the end of the message under way (`tcp::Turn::to_message_end`),
    /// so that nothing of the next message waits a round built.
    Turn { left: usize, to_end: bool },
}

/// Records a connection keeps queued ahead of its turn.
pub(super) const AHEAD: usize = 1;

/// Small records ([`SMALL_FPDU`]) one connection builds in an iteration,
/// however many times it is offered room. A small-message sender is
/// paced by its completions: a window of them sent in one iteration
/// leaves it idle for the round trip, while part of it sent now and the
/// rest in the next iteration (after the acknowledgements that came
/// meanwhile) keeps it going. Building at the turn without this limit
/// sent every small record the queue pair had at once: the 64-byte rate
/// rounds fell from 2.3 to 1.9 M messages a second.
pub(crate) const MAX_SMALL_FPDUS_PER_ITERATION: usize = 2 * MAX_SMALL_FPDUS_PER_POLL;

impl Conn {
    /// Queues records while TCP has room, as far as `fill` says.
    pub(super) fn send_records<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>, fill: Fill) -> bool {
        let Some(ep) = self.ep.as_mut() else {
            return false;
        };
        let mut n = 0;
        let mut bytes = 0;
        let mut ended = false;
        while n < MAX_FPDUS_PER_POLL {
            let Some(conn) = cx.stack.conn_mut(self.tcp) else {
                break;
            };
            let full = match fill {
                Fill::Ahead => conn.unsent_records() >= AHEAD,
                Fill::Turn { left, to_end } => n > 0 && (bytes >= left || (to_end && ended)),
            };
            if self.small_built.0 != cx.epoch {
                self.small_built = (cx.epoch, 0);
            }
            if full || self.small_built.1 >= MAX_SMALL_FPDUS_PER_ITERATION {
                self.more = true;
                break;
            }
            let room = conn.send_room();
            let cap = room.len();
            if cap == 0 {
                break;
            }
            let (device, mem, cq, rcq) =
                (&mut *cx.device, &mut *cx.mem, &mut self.cq, &mut self.rcq);
            let Some(b) = cx
                .records
                .build(|out| ep.poll_record_into(cap, &mut env(device, mem, cq, rcq), out))
            else {
                self.more = false;
                break;
            };
            n += 1;
            let r = cx.records.settle(b);
            let len = Record::len(&r);
            bytes += len;
            ended = Record::ends_message(&r);
            if let Err((_, r)) = room.send(cx.now, r) {
                // Cannot happen (the record fits the capacity asked for);
                // its pin goes back all the same.
                if let Some(r) = cx.records.remove(r).and_then(FpduRecord::take) {
                    ep.record_dropped(r, cx.device);
                }
                break;
            }
            if len < SMALL_FPDU {
                self.small_built.1 += 1;
                if n >= MAX_SMALL_FPDUS_PER_POLL {
                    self.more = true;
                    break;
                }
            }
        }
        if n == MAX_FPDUS_PER_POLL {
            self.more = true;
        }
        n > 0
    }
}

/// Builds the frame of a train (TCP segmentation offload): `head`, the
/// train's headers, then each record whole, payload attached or copied
/// (the copy in the pass that computes the MPA CRC, where the CRC is
/// ours); the port cuts it into segments of `seg_len` payload bytes, one
/// record each. Returns how many records went in by that fused pass.
fn emit_train<'a, F: TxFrame>(
    frame: &mut F,
    head: &[u8],
    seg_len: usize,
    first: Option<Sendable<'a>>,
    rest: impl Iterator<Item = Option<Sendable<'a>>>,
    attach: bool,
) -> Result<u64, FrameFull> {
    frame.segment_by(seg_len)?;
    frame.append(head)?;
    let mut fused = 0;
    for rec in core::iter::once(first).chain(rest) {
        let rec = rec.ok_or(FrameFull)?;
        let whole = 0..rec.len;
        if !attach && rec.fusable(&whole) {
            rec.emit_fused(frame, 0, false)?;
            fused += 1;
        } else {
            rec.emit(frame, whole, attach)?;
        }
    }
    Ok(fused)
}

/// Captures a train as the port puts it on the wire: `n` segments of one
/// record each, headers as the port writes them.
fn capture_train<'a>(
    ring: &crate::capture::Ring,
    ts: u64,
    head: &[u8],
    n: usize,
    recs: impl Iterator<Item = Sendable<'a>>,
) {
    let mut cut = [0u8; HDR_BUF];
    let mut offset = 0;
    for (k, rec) in recs.enumerate() {
        let len = rec.len;
        tcp_offload::iface::cut_header(head, k, offset, len, k + 1 == n, &mut cut);
        ring.record_segment(ts, &cut[..head.len()], Some((rec, 0..len)).into_iter(), 0);
        offset += len;
    }
}

/// What [`cut_train`] did.
#[derive(Debug, Default)]
struct Cut {
    /// Records sent by the fused pass (copied, CRC and sum computed over
    /// the copy).
    fused: u64,
    /// Frames that carry a copied payload.
    copied: u64,
    /// Records that found no frame, or did not fit theirs.
    dropped: u64,
    /// Payload bytes read for a checksum, and whether any had changed, as
    /// the other segments count them ([`SegmentSum`]).
    summed: SegmentSum,
}

/// Cuts a train into frames itself, where the port has no segmentation
/// offload: record `k` goes out in a frame of its own, behind the
/// train's headers as a port would cut them (`cut_header`: length,
/// identifier, IPv4 checksum, sequence number, PSH and FIN on the last),
/// its TCP checksum completed here unless the port computes it. TCP made
/// one output decision and one header for all of them. The first frame
/// is `frame`; the others come from the queue (a train has at most
/// [`super::SOFT_TRAIN_RECORDS`] records, `n` here, which `batch` has
/// room for).
#[allow(clippy::too_many_arguments)]
fn cut_train<'a, Q: LinkQueue>(
    queue: &mut Q,
    batch: &mut Vec<Q::TxFrame>,
    frame: Q::TxFrame,
    head: &[u8],
    recs: impl Iterator<Item = Option<Sendable<'a>>>,
    n: usize,
    offload: bool,
    attach: bool,
    capture: Option<(&crate::capture::Ring, u64)>,
) -> Cut {
    let mut out = Cut::default();
    let tcp_at = head
        .get(14)
        .map_or(usize::MAX, |b| 14 + usize::from(b & 0x0f) * 4);
    if tcp_at + 20 > head.len() || head.len() > HDR_BUF {
        out.dropped = n as u64;
        return out;
    }
    let mut cut = [0u8; HDR_BUF];
    let mut next = Some(frame);
    let mut offset = 0usize;
    for (k, rec) in recs.enumerate() {
        let Some(mut f) = next.take().or_else(|| queue.alloc_tx()) else {
            out.dropped += (n - k) as u64;
            break;
        };
        let Some(rec) = rec else {
            out.dropped += 1;
            next = Some(f);
            continue;
        };
        let len = rec.len;
        tcp_offload::iface::cut_header(head, k, offset, len, k + 1 == n, &mut cut);
        offset += len;
        let h = &mut cut[..head.len()];
        let whole = 0..len;
        let fused = !attach && rec.fusable(&whole);
        let summed = &mut out.summed;
        let sum = if fused {
            rec.emit_fused(&mut f, h.len(), !offload).map(|s| {
                summed.add_fused(&s);
                s.sum
            })
        } else {
            f.append_zeros(h.len())
                .and_then(|()| rec.emit(&mut f, whole.clone(), attach))
                .map(|()| {
                    if offload {
                        return 0;
                    }
                    let s = rec.tx_sum(whole);
                    summed.add(&s);
                    s.sum
                })
        };
        let Ok(sum) = sum else {
            out.dropped += 1;
            continue;
        };
        if !offload {
            // The field holds the pseudo-header sum: the header's sum
            // and the record's make the whole.
            let tcp = &h[tcp_at..];
            let total = checksum::combine_at(crate::checksum::sum(tcp), sum, tcp.len());
            h[tcp_at + 16..tcp_at + 18].copy_from_slice(&checksum::finish(total).to_be_bytes());
        }
        if f.patch(0, h).is_err() {
            out.dropped += 1;
            continue;
        }
        if let Some((ring, ts)) = capture {
            ring.record_segment(ts, h, Some((rec, 0..len)).into_iter(), 0);
        }
        out.fused += u64::from(fused);
        out.copied += u64::from(!attach);
        batch.push(f);
    }
    // A frame a missing record left unused goes back to the pool.
    drop(next);
    out
}

impl<Q: LinkQueue> Worker<Q> {
    /// Hints the CPU to load the connection whose turn comes next: its
    /// TCP control block and its `Conn` (engine inline). With thousands
    /// of busy connections each turn comes round after every other's, so
    /// those lines are out of cache by then, and a turn's first segment
    /// waited on them one miss after another; a turn sends for several
    /// microseconds, long enough for the loads to land.
    fn prefetch_next_turn(&self) {
        let stack = self.iface.stack();
        let Some(next) = stack.next_turn() else {
            return;
        };
        super::conn::prefetch_conn(stack, &self.conns, next.index);
    }

    /// Builds the records of the connection whose turn to send it is,
    /// once it has no more than the one queued ahead ([`Fill`]) or less
    /// than a full segment: as many as what is left of its turn.
    fn top_up_turn(&mut self, now: Instant) {
        let Some(t) = self.iface.stack_mut().turn() else {
            return;
        };
        if t.id.index != self.turn_seen {
            // A new turn: bring the state of the connection after it
            // into cache while this one sends.
            self.turn_seen = t.id.index;
            self.prefetch_next_turn();
        }
        // More than the one ahead, and enough for a full segment (packed
        // small records would otherwise leave a short one).
        if t.unsent_records > AHEAD && t.unsent_bytes >= t.max_record {
            return;
        }
        let Some(Some(conn)) = self.conns.get_mut(t.id.index as usize) else {
            return;
        };
        if !conn.more || conn.tcp != t.id {
            return;
        }
        let mut cx = worker_cx!(self, now);
        let fill = Fill::Turn {
            left: t.bytes_left,
            to_end: t.to_message_end,
        };
        if conn.send_records(&mut cx, fill) {
            // Building may have completed work or raised events (a
            // local protection error): the connection is serviced.
            self.ready.mark(t.id.index);
        }
    }

    pub(super) fn transmit(&mut self, now: Instant) -> bool {
        let offload = self.caps.tx_checksum_offload;
        let attach = self.caps.multi_seg_tx;
        let capture_ts = self.capture.ring().map(crate::capture::Ring::now_ns);
        let mut copied = 0u64;
        while self.tx_batch.len() < TX_BURST {
            let frame = match self.spare_frame.take() {
                Some(f) => f,
                None => match self.queue.alloc_tx() {
                    Some(f) => f,
                    None => {
                        self.local_drops += 1;
                        break;
                    }
                },
            };
            let mut frame = frame;
            if let Some(n) = self.iface.poll_slow_frame(now, &mut self.scratch) {
                match frame.append(&self.scratch[..n]) {
                    Ok(()) => {
                        if let (Some(ring), Some(ts)) = (self.capture.ring(), capture_ts) {
                            ring.record_bytes(ts, &self.scratch[..n]);
                        }
                        self.tx_batch.push(frame)
                    }
                    Err(_) => self.local_drops += 1,
                }
                continue;
            }
            self.top_up_turn(now);
            let mut hdr = [0u8; HDR_BUF];
            let mut seg = SegmentSum::default();
            // The record went into the frame in the checksum's pass
            // (`Some`): copied, its CRC and sum computed over the copy. A
            // pack's later records then follow it into the frame there.
            let mut fused: Option<Result<FusedSum, FrameFull>> = None;
            let mut calls = 0usize;
            let records = &self.records;
            let mem = &self.mem;
            let parts = self.iface.poll_frame_parts(
                now,
                &mut hdr,
                |r, range, at| {
                    let rec = records.sendable(r, mem);
                    match &mut fused {
                        // A pack's record after a fused one.
                        Some(Ok(f)) => {
                            let Some(rec) = rec else {
                                fused = Some(Err(FrameFull));
                                return Some(0);
                            };
                            let s = if rec.fusable(&range) {
                                rec.emit_fused(&mut frame, 0, !offload)
                            } else {
                                rec.emit(&mut frame, range.clone(), false)
                                    .map(|()| FusedSum {
                                        sum: if offload { 0 } else { rec.tx_sum(range).sum },
                                        ..FusedSum::default()
                                    })
                            };
                            match s {
                                Ok(s) => {
                                    f.resummed += s.resummed;
                                    f.changed |= s.changed;
                                    return (!offload).then_some(s.sum);
                                }
                                Err(e) => {
                                    fused = Some(Err(e));
                                    return Some(0);
                                }
                            }
                        }
                        Some(Err(_)) => return Some(0),
                        None => {}
                    }
                    let first = calls == 0;
                    calls += 1;
                    if first {
                        if let Some(rec) = rec.filter(|rec| rec.fusable(&range)) {
                            let f = rec.emit_fused(&mut frame, at, !offload);
                            let sum = f.as_ref().map_or(0, |f| f.sum);
                            fused = Some(f);
                            return (!offload).then_some(sum);
                        }
                    }
                    (!offload).then(|| {
                        let s = rec.map(|r| r.tx_sum(range)).unwrap_or_default();
                        seg.add(&s);
                        s.sum
                    })
                },
                |r, at, dst| match records.sendable(r, mem) {
                    Some(rec) => rec.copy_to(at, dst),
                    None => dst.fill(0),
                },
            );
            if let Some(Ok(f)) = &fused {
                bump(&self.counters.tx_fused_frames, 1);
                if f.resummed > 0 {
                    bump(&self.counters.tx_resummed_bytes, f.resummed as u64);
                    if f.changed {
                        bump(&self.counters.tx_payload_changed, 1);
                    }
                }
            }
            seg.count(&self.counters);
            match parts {
                None => {
                    self.spare_frame = Some(frame);
                    break;
                }
                Some(FrameParts::Consumed) => self.spare_frame = Some(frame),
                Some(FrameParts::Segment {
                    header_len,
                    payload,
                    more: Some(train),
                    ..
                }) if !train.is_pack() && self.cut_trains => {
                    let first = payload.and_then(|(r, _)| records.sendable(r, mem));
                    let rest = train.records().map(|r| records.sendable(r, mem));
                    let recs = core::iter::once(first).chain(rest);
                    let n = train.count() + 1;
                    let capture = self.capture.ring().zip(capture_ts);
                    let cut = cut_train(
                        &mut self.queue,
                        &mut self.tx_batch,
                        frame,
                        &hdr[..header_len],
                        recs,
                        n,
                        offload,
                        attach,
                        capture,
                    );
                    bump(&self.counters.tx_fused_frames, cut.fused);
                    bump(&self.counters.tx_cut_trains, 1);
                    cut.summed.count(&self.counters);
                    copied += cut.copied;
                    self.local_drops += cut.dropped;
                }
                Some(FrameParts::Segment {
                    header_len,
                    payload,
                    more: Some(train),
                    ..
                }) if !train.is_pack() => {
                    let first = payload.and_then(|(r, _)| records.sendable(r, mem));
                    let rest = train.records().map(|r| records.sendable(r, mem));
                    let head = &hdr[..header_len];
                    match emit_train(&mut frame, head, train.seg_len(), first, rest, attach) {
                        Ok(fused) => {
                            if let Some(ring) = self.capture.ring() {
                                let ts = capture_ts.unwrap_or(0);
                                let recs = first.into_iter().chain(
                                    train.records().filter_map(|r| records.sendable(r, mem)),
                                );
                                capture_train(ring, ts, head, train.count() + 1, recs);
                            }
                            bump(&self.counters.tx_fused_frames, fused);
                            self.tx_batch.push(frame);
                            copied += u64::from(!attach);
                        }
                        Err(FrameFull) => self.local_drops += 1,
                    }
                }
                Some(FrameParts::Segment {
                    header_len,
                    payload,
                    more,
                    pad,
                    ..
                }) => {
                    // The records behind TCP's handles, in place: one, or a
                    // pack's (several whole FPDUs in the segment).
                    let has_payload = payload.is_some();
                    let recs = payload.into_iter().chain(
                        more.iter()
                            .flat_map(|t| t.records().map(|r| (r, 0..r.len()))),
                    );
                    let ok = match fused {
                        // Headers in front of the records already there.
                        Some(f) => {
                            f.is_ok()
                                && frame.patch(0, &hdr[..header_len]).is_ok()
                                && frame.append_zeros(pad).is_ok()
                        }
                        None => {
                            frame.append(&hdr[..header_len]).is_ok()
                                && recs.clone().all(|(r, range)| {
                                    records
                                        .sendable(r, mem)
                                        .is_some_and(|r| r.emit(&mut frame, range, attach).is_ok())
                                })
                                && frame.append_zeros(pad).is_ok()
                        }
                    };
                    if ok {
                        if let (Some(ring), Some(ts)) = (self.capture.ring(), capture_ts) {
                            let all = recs.filter_map(|(r, range)| {
                                records.sendable(r, mem).map(|r| (r, range))
                            });
                            ring.record_segment(ts, &hdr[..header_len], all, pad);
                        }
                        if let Some(t) = &more {
                            bump(&self.counters.tx_packed_segments, 1);
                            bump(&self.counters.tx_packed_fpdus, t.count() as u64 + 1);
                        }
                        self.tx_batch.push(frame);
                        copied += u64::from(has_payload && !attach);
                    } else {
                        self.local_drops += 1;
                    }
                }
            }
        }
        if copied > 0 {
            bump(&self.counters.tx_copied_frames, copied);
        }
        let in_flight = self.records.in_flight() as u64;
        if self.counters.tx_records.load(Ordering::Relaxed) != in_flight {
            self.counters.tx_records.store(in_flight, Ordering::Relaxed);
        }
        if self.tx_batch.is_empty() {
            return false;
        }
        let bytes: usize = self.tx_batch.iter().map(TxFrame::len).sum();
        let before = self.tx_batch.len();
        let sent = self.queue.tx_burst(&mut self.tx_batch);
        let left: usize = self.tx_batch.iter().map(TxFrame::len).sum();
        bump(&self.counters.tx_packets, sent as u64);
        bump(&self.counters.tx_bytes, (bytes - left) as u64);
        before > 0
    }
}
