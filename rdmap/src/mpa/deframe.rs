//! The FPDU deframer (RFC 5044 §4 framing, §5–§6 markers, CRC): the receive
//! side of MPA's full-operation phase.
//!
//! TCP hands over in-order payload in whatever chunks the segments made;
//! FPDUs do not respect them (siw splits an FPDU before its CRC, coalesces
//! 27 small ones into one segment). The deframer is a push-based state
//! machine (length, data, pad, CRC) over those chunks that yields, per
//! FPDU, [`DeframeEvent::UlpduStart`], the ULPDU as one or more
//! [`DeframeEvent::Bytes`] pieces borrowed from the chunk (markers removed,
//! nothing copied; their concatenation is exactly the ULPDU), and
//! [`DeframeEvent::UlpduEnd`] saying whether the CRC matched. It never
//! allocates; the CRC runs over the pieces as they pass
//! ([`crc32c::crc32c_append`]).
//!
//! A DDP header may be split across pieces (a segment boundary, a marker):
//! the QP engine gathers the first header-length octets of a ULPDU into a
//! small buffer of its own when the first piece is shorter.
//!
//! Payload is handed out before the CRC that covers it has arrived, so
//! that it can be placed in one pass; a ULPDU ending with `crc_ok: false`
//! must not complete anything, and the connection is then terminated with
//! [`crate::error::TerminateCause::MPA_CRC`] (RFC 5044 §8). With CRCs off
//! the CRC field is skipped and every FPDU ends with `crc_ok: true`.
//!
//! Framing errors ([`DeframeError`]) are fatal: the stream has lost FPDU
//! alignment, the deframer stops, and every later call returns the same
//! error.

use core::fmt;

use super::fpdu::{pad_len, CRC_LEN, LENGTH_LEN};
use super::markers::{distance_to_marker, marker_fpduptr, MARKER_LEN};
use super::negotiate::Framing;
use crate::error::TerminateCause;

/// One step of deframing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeframeEvent<'a> {
    /// A new FPDU carrying a ULPDU of `len` octets.
    UlpduStart {
        /// ULPDU length from the FPDU's length field.
        len: u16,
    },
    /// The next octets of the ULPDU, borrowed from the input chunk.
    Bytes(&'a [u8]),
    /// The FPDU is complete.
    UlpduEnd {
        /// The CRC matched (always true with CRCs off).
        crc_ok: bool,
    },
}

/// A framing error: FPDU alignment is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeframeError {
    /// A marker's FPDUPTR does not point at the FPDU it sits in.
    Marker {
        /// What it should say (low two bits clear).
        expected: u16,
        /// What it says (low two bits cleared).
        found: u16,
    },
    /// A ULPDU length above the receiver's limit.
    UlpduTooLong {
        /// The length field.
        len: u16,
        /// The limit.
        max: u16,
    },
}

impl DeframeError {
    /// The Terminate to send: both are RFC 5044 §8's "MPA Marker and ULPDU
    /// Length field mismatch".
    pub const fn terminate_cause(&self) -> TerminateCause {
        TerminateCause::MPA_MARKER_MISMATCH
    }
}

impl fmt::Display for DeframeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeframeError::Marker { expected, found } => {
                write!(f, "marker FPDUPTR {found}, expected {expected}")
            }
            DeframeError::UlpduTooLong { len, max } => {
                write!(f, "ULPDU of {len} octets, limit {max}")
            }
        }
    }
}

impl std::error::Error for DeframeError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length,
    Data,
    Pad,
    Crc,
}

/// The receive-side FPDU state machine for one connection.
#[derive(Debug, Clone)]
pub struct Deframer {
    crc_enabled: bool,
    markers: bool,
    max_ulpdu: u16,
    /// Stream position of the next input octet (see [`super::markers`]).
    pos: u32,
    state: State,
    /// Some octet of the current FPDU (marker or length) has been read.
    fpdu_open: bool,
    /// Position of the current FPDU's first octet.
    fpdu_start: u32,
    /// Position of its length field.
    len_pos: u32,
    len_buf: [u8; LENGTH_LEN],
    len_have: u8,
    remaining: u16,
    pad_left: u8,
    crc_buf: [u8; CRC_LEN],
    crc_have: u8,
    crc: u32,
    /// The CRC of the FPDU now open was computed by the caller
    /// ([`Deframer::next_fpdu_crc`]): the pieces are not summed again.
    crc_given: bool,
    /// What [`Deframer::next_fpdu_crc`] said of the next FPDU.
    next_crc: Option<u32>,
    marker_buf: [u8; MARKER_LEN],
    marker_have: u8,
    marker_pos: u32,
    /// The marker being read opened its FPDU.
    marker_leading: bool,
    error: Option<DeframeError>,
}

/// The `N` octets of a field taken whole from `input` (`n == N`: an FPDU
/// that lies in one segment), read from there. Read back from the
/// buffer they are also copied into (for a field split across
/// segments), they waited for the copy's byte stores to reach the cache.
fn whole_field<const N: usize>(input: &[u8], n: usize) -> Option<[u8; N]> {
    if n == N {
        input.get(..N)?.try_into().ok()
    } else {
        None
    }
}

impl Deframer {
    /// A deframer for the first octet after the MPA frames. `max_ulpdu`
    /// bounds the length field (65535 for no limit).
    pub const fn new(crc: bool, markers: bool, max_ulpdu: u16) -> Deframer {
        Deframer {
            crc_enabled: crc,
            markers,
            max_ulpdu,
            pos: 0,
            state: State::Length,
            fpdu_open: false,
            fpdu_start: 0,
            len_pos: 0,
            len_buf: [0; LENGTH_LEN],
            len_have: 0,
            remaining: 0,
            pad_left: 0,
            crc_buf: [0; CRC_LEN],
            crc_have: 0,
            crc: 0,
            crc_given: false,
            next_crc: None,
            marker_buf: [0; MARKER_LEN],
            marker_have: 0,
            marker_pos: 0,
            marker_leading: false,
            error: None,
        }
    }

    /// A deframer whose next octet sits at stream position `pos`, between
    /// FPDUs.
    pub const fn with_position(crc: bool, markers: bool, max_ulpdu: u16, pos: u32) -> Deframer {
        let mut d = Deframer::new(crc, markers, max_ulpdu);
        d.pos = pos;
        d
    }

    /// A deframer configured by connection setup: markers if we asked for
    /// them.
    pub const fn from_framing(framing: &Framing, max_ulpdu: u16) -> Deframer {
        Deframer::new(framing.crc, framing.markers_rx, max_ulpdu)
    }

    /// Stream position of the next octet expected.
    pub const fn position(&self) -> u32 {
        self.pos
    }

    /// Whether the deframer sits between FPDUs (no partial FPDU held).
    pub const fn at_boundary(&self) -> bool {
        !self.fpdu_open && self.error.is_none()
    }

    /// The CRC field received and the CRC computed for the last FPDU, for
    /// diagnostics after a [`DeframeEvent::UlpduEnd`] with `crc_ok: false`
    /// (valid until the next FPDU starts; the computed value is 0 with CRCs
    /// off).
    pub const fn last_crc(&self) -> (u32, u32) {
        (u32::from_le_bytes(self.crc_buf), self.crc)
    }

    /// Says that the next FPDU, which starts with the next octet fed, has
    /// the CRC32c `crc` over the octets its CRC covers: a receive path
    /// that read the bytes anyway (verifying the TCP checksum) computed it
    /// there, and the deframer then compares it with the CRC field
    /// instead of reading the bytes again. Only for an FPDU that arrives
    /// whole in the next chunk fed, at a boundary, without markers (where
    /// the caller can tell the covered octets from the length field); the
    /// word is dropped when the FPDU does not start at the next octet.
    /// Returns whether it was taken (false: mid-FPDU, markers, CRCs off,
    /// or stopped on an error).
    pub fn next_fpdu_crc(&mut self, crc: u32) -> bool {
        let take = self.at_boundary() && !self.markers && self.crc_enabled;
        if take {
            self.next_crc = Some(crc);
        }
        take
    }

    /// Drops what [`Deframer::next_fpdu_crc`] said if no FPDU opened since.
    pub fn forget_next_crc(&mut self) {
        self.next_crc = None;
    }

    /// The framing error that stopped the deframer, if any.
    pub const fn error(&self) -> Option<DeframeError> {
        self.error
    }

    /// Iterates over the events in `chunk`.
    pub fn feed<'d, 'a>(&'d mut self, chunk: &'a [u8]) -> Feed<'d, 'a> {
        Feed {
            deframer: self,
            input: chunk,
        }
    }

    /// The next event from `input`, advancing it past what was consumed.
    /// `Ok(None)` once `input` is exhausted without completing an event.
    pub fn next_event<'a>(
        &mut self,
        input: &mut &'a [u8],
    ) -> Result<Option<DeframeEvent<'a>>, DeframeError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        loop {
            if input.is_empty() {
                return Ok(None);
            }
            if self.markers
                && (self.marker_have > 0 || self.pos % super::markers::MARKER_INTERVAL == 0)
            {
                self.read_marker(input)?;
                continue;
            }
            // Octets until the next marker, which the current step must not
            // cross.
            let room = if self.markers {
                distance_to_marker(self.pos) as usize
            } else {
                usize::MAX
            };
            let avail = input.len().min(room);
            match self.state {
                State::Length => {
                    if !self.fpdu_open {
                        self.open(self.pos);
                    }
                    if self.len_have == 0 {
                        self.len_pos = self.pos;
                    }
                    let n = (LENGTH_LEN - usize::from(self.len_have)).min(avail);
                    let have = usize::from(self.len_have);
                    let whole = whole_field::<LENGTH_LEN>(input, n);
                    self.len_buf[have..have + n].copy_from_slice(&input[..n]);
                    self.len_have += n as u8;
                    self.consume(input, n, true);
                    if usize::from(self.len_have) == LENGTH_LEN {
                        let len = u16::from_be_bytes(whole.unwrap_or(self.len_buf));
                        if len > self.max_ulpdu {
                            return Err(self.fail(DeframeError::UlpduTooLong {
                                len,
                                max: self.max_ulpdu,
                            }));
                        }
                        self.remaining = len;
                        self.pad_left = pad_len(usize::from(len)) as u8;
                        self.state = if len > 0 { State::Data } else { State::Pad };
                        return Ok(Some(DeframeEvent::UlpduStart { len }));
                    }
                }
                State::Data => {
                    let n = usize::from(self.remaining).min(avail);
                    let piece = &input[..n];
                    self.consume(input, n, true);
                    // n <= remaining, a u16.
                    self.remaining -= n as u16;
                    if self.remaining == 0 {
                        self.state = State::Pad;
                    }
                    return Ok(Some(DeframeEvent::Bytes(piece)));
                }
                State::Pad => {
                    let n = usize::from(self.pad_left).min(avail);
                    self.consume(input, n, true);
                    self.pad_left -= n as u8;
                    if self.pad_left == 0 {
                        self.state = State::Crc;
                    }
                }
                State::Crc => {
                    let have = usize::from(self.crc_have);
                    let n = (CRC_LEN - have).min(avail);
                    let whole = whole_field::<CRC_LEN>(input, n);
                    self.crc_buf[have..have + n].copy_from_slice(&input[..n]);
                    self.crc_have += n as u8;
                    self.consume(input, n, false);
                    if usize::from(self.crc_have) == CRC_LEN {
                        let wire = whole.unwrap_or(self.crc_buf);
                        let crc_ok = !self.crc_enabled || u32::from_le_bytes(wire) == self.crc;
                        self.crc_given = false;
                        self.state = State::Length;
                        self.fpdu_open = false;
                        self.len_have = 0;
                        self.crc_have = 0;
                        return Ok(Some(DeframeEvent::UlpduEnd { crc_ok }));
                    }
                }
            }
        }
    }

    fn open(&mut self, at: u32) {
        self.fpdu_open = true;
        self.fpdu_start = at;
        self.crc = 0;
        if let Some(crc) = self.next_crc.take() {
            self.crc = crc;
            self.crc_given = true;
        }
    }

    /// Takes `n` octets off `input`, adding them to the CRC if `covered`.
    fn consume(&mut self, input: &mut &[u8], n: usize, covered: bool) {
        let (taken, rest) = input.split_at(n);
        if covered && self.crc_enabled && !self.crc_given {
            self.crc = crate::crc::append(self.crc, taken);
        }
        *input = rest;
        self.pos = self.pos.wrapping_add(n as u32);
    }

    fn read_marker(&mut self, input: &mut &[u8]) -> Result<(), DeframeError> {
        if self.marker_have == 0 {
            self.marker_pos = self.pos;
            self.marker_leading = !self.fpdu_open;
            if !self.fpdu_open {
                self.open(self.pos);
            }
        }
        let have = usize::from(self.marker_have);
        let n = (MARKER_LEN - have).min(input.len());
        self.marker_buf[have..have + n].copy_from_slice(&input[..n]);
        self.marker_have += n as u8;
        // A marker before the CRC field is covered by the CRC.
        let covered = !(self.state == State::Crc && self.crc_have > 0);
        self.consume(input, n, covered);
        if usize::from(self.marker_have) < MARKER_LEN {
            return Ok(());
        }
        self.marker_have = 0;
        let found = marker_fpduptr(self.marker_buf);
        if self.marker_leading {
            if found != 0 {
                return Err(self.fail(DeframeError::Marker { expected: 0, found }));
            }
            return Ok(());
        }
        // Back to the length field (RFC 5044 §5), or to the FPDU's start
        // when a marker opened it (counted by some senders).
        let to_len = self.marker_pos.wrapping_sub(self.len_pos) & !3;
        let to_start = self.marker_pos.wrapping_sub(self.fpdu_start) & !3;
        if u32::from(found) == to_len || u32::from(found) == to_start {
            Ok(())
        } else {
            Err(self.fail(DeframeError::Marker {
                expected: to_len as u16,
                found,
            }))
        }
    }

    fn fail(&mut self, e: DeframeError) -> DeframeError {
        self.error = Some(e);
        e
    }
}

/// The events of one input chunk; see [`Deframer::feed`]. Stops after the
/// first error.
#[derive(Debug)]
pub struct Feed<'d, 'a> {
    deframer: &'d mut Deframer,
    input: &'a [u8],
}

impl<'a> Feed<'_, 'a> {
    /// Input octets not consumed yet (empty once the iterator is done,
    /// unless it stopped on an error).
    pub fn remaining(&self) -> &'a [u8] {
        self.input
    }
}

impl<'a> Iterator for Feed<'_, 'a> {
    type Item = Result<DeframeEvent<'a>, DeframeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.deframer.error.is_some() && self.input.is_empty() {
            return None;
        }
        match self.deframer.next_event(&mut self.input) {
            Ok(Some(ev)) => Some(Ok(ev)),
            Ok(None) => None,
            Err(e) => {
                // Report once, then stop.
                self.input = &[];
                Some(Err(e))
            }
        }
    }
}
