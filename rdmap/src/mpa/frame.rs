//! MPA request, reply and reject frames (RFC 5044 §7.1) and the revision 2
//! IRD/ORD words that open their private data (RFC 6581 §3).
//!
//! These frames are the only bytes on an iWARP connection that are not
//! FPDUs: right after the TCP handshake the initiator sends a request, the
//! responder answers with a reply (or a reject, which is a reply with the R
//! flag), and from then on both directions carry FPDUs. The negotiator in
//! [`super::negotiate`] drives the exchange; this module only knows the
//! bytes.
//!
//! Layout (all multi-byte fields big-endian):
//!
//! ```text
//!  0..16  key: "MPA ID Req Frame" or "MPA ID Rep Frame"
//!  16     flags: M 0x80 | C 0x40 | R 0x20 | enhanced 0x10 | reserved 0x0f
//!  17     revision
//!  18..20 private data length
//!  20..   private data; in revision 2 with the enhanced flag its first four
//!         bytes are the IRD word and the ORD word
//! ```
//!
//! The 0x10 flag is not in RFC 6581's text, but every implementation in the
//! field (siw, cxgb4, irdma) sets it in revision 2 and parses the IRD/ORD
//! words only when it is set; a revision 2 frame without it carries no
//! IRD/ORD words, and that is how this module reads it too.
//!
//! The IRD/ORD control bits (RFC 6581 §3, "A"–"D" there; named as the
//! Linux drivers name them):
//!
//! ```text
//!  IRD word: bit 15 P  peer-to-peer mode
//!            bit 14 L  zero-length Send (a zero-length FULPDU) as RTR
//!            bits 0..14 IRD
//!  ORD word: bit 15 W  zero-length RDMA Write as RTR
//!            bit 14 R  zero-length RDMA Read as RTR
//!            bits 0..14 ORD
//! ```
//!
//! The Send RTR has its own bit (L): it is *not* "P with neither W nor R".
//! In a request the initiator sets every RTR kind it is able to send; in the
//! reply the responder sets exactly the one it chose. irdma and the older
//! nes/i40iw drivers name L "zero-length FULPDU" and stopped setting it
//! when they dropped Send RTR support; siw never sets it.
//!
//! Private data: a receiver accepts up to 512 bytes (RFC 5044's limit); a
//! sender never emits more than 256 bytes in all, because siw and cxgb4
//! refuse anything larger — 252 application bytes in revision 2.

use core::fmt;

/// Length of the key at the start of every frame.
pub const KEY_LEN: usize = 16;
/// Length of the fixed part: key, flags, revision, private data length.
pub const HEADER_LEN: usize = 20;
/// Key of the MPA request frame.
pub const REQUEST_KEY: &[u8; KEY_LEN] = b"MPA ID Req Frame";
/// Key of the MPA reply frame (also used by a reject).
pub const REPLY_KEY: &[u8; KEY_LEN] = b"MPA ID Rep Frame";
/// Largest private data length accepted on receive (RFC 5044 §7.1).
pub const MAX_PRIVATE_DATA_RECV: usize = 512;
/// Largest private data length ever emitted, IRD/ORD words included: siw
/// and cxgb4 reject frames carrying more.
pub const MAX_PRIVATE_DATA_SEND: usize = 256;
/// Length of the IRD and ORD words in revision 2.
pub const IRD_ORD_LEN: usize = 4;
/// Largest IRD or ORD value: the words keep 14 bits for it.
pub const IRD_ORD_MAX: u16 = 0x3fff;

/// Bits of byte 16.
pub mod flags {
    /// The sender wants to *receive* markers (RFC 5044 §7.1: "declares a
    /// receiver's requirement for markers").
    pub const MARKERS: u8 = 0x80;
    /// The sender wants CRCs; CRCs are used if either frame sets it.
    pub const CRC: u8 = 0x40;
    /// Reply only: the responder rejects the connection.
    pub const REJECT: u8 = 0x20;
    /// Revision 2: the private data starts with the IRD/ORD words.
    pub const ENHANCED: u8 = 0x10;
    /// Reserved: zero on transmit, ignored on receive.
    pub const RESERVED: u8 = 0x0f;
}

/// IRD word bit 15: peer-to-peer mode.
const P2P_BIT: u16 = 0x8000;
/// IRD word bit 14: zero-length Send RTR.
const SEND_RTR_BIT: u16 = 0x4000;
/// ORD word bit 15: zero-length RDMA Write RTR.
const WRITE_RTR_BIT: u16 = 0x8000;
/// ORD word bit 14: zero-length RDMA Read RTR.
const READ_RTR_BIT: u16 = 0x4000;

/// Why a frame was refused, on parse or on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameError {
    /// Fewer bytes than the header, or than the private data length says.
    Truncated,
    /// The first 16 bytes are neither key.
    BadKey,
    /// A revision other than 1 or 2.
    BadRevision(u8),
    /// The private data length field exceeds 512 (on parse) or the private
    /// data would exceed 256 bytes in all (on emit).
    TooMuchPrivateData(u16),
    /// A revision 2 frame announces IRD/ORD words (the 0x10 flag) but its
    /// private data is shorter than four bytes.
    MissingIrdOrd,
    /// Emit only: IRD/ORD words in a frame that is not revision 2, or an
    /// IRD or ORD above 0x3fff.
    BadIrdOrd,
    /// Emit only: the output buffer is too short.
    BufferTooShort,
}

impl FrameError {
    /// One value of every variant, for the tests that walk each message
    /// (see `rdmap_testkit::message`).
    pub const ALL: &'static [FrameError] = &[
        FrameError::Truncated,
        FrameError::BadKey,
        FrameError::BadRevision(3),
        FrameError::TooMuchPrivateData(600),
        FrameError::MissingIrdOrd,
        FrameError::BadIrdOrd,
        FrameError::BufferTooShort,
    ];

    /// What is wrong with the frame, as a clause completing "the MPA
    /// frame …" or "the peer sent an MPA frame that …".
    pub(crate) fn clause(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Truncated => {
                f.write_str("is shorter than its header or its private data length")
            }
            FrameError::BadKey => {
                f.write_str("starts with neither the request key nor the reply key")
            }
            FrameError::BadRevision(r) => {
                write!(f, "has revision {r}, where only revisions 1 and 2 exist")
            }
            FrameError::TooMuchPrivateData(n) => write!(
                f,
                "announces {n} bytes of private data, more than the 512 a frame may carry \
                 or the 256 we send"
            ),
            FrameError::MissingIrdOrd => {
                f.write_str("sets the enhanced flag but has no room for the IRD and ORD words")
            }
            FrameError::BadIrdOrd => {
                f.write_str("has IRD and ORD words outside revision 2 or above 16383")
            }
            FrameError::BufferTooShort => f.write_str("does not fit the buffer given for it"),
        }
    }

    /// What a peer sending such a frame should change.
    pub(crate) fn remedy(&self) -> &'static str {
        match self {
            FrameError::BadRevision(_) => "set the peer to MPA revision 1 or 2",
            FrameError::TooMuchPrivateData(_) => "have the peer send less private data",
            FrameError::MissingIrdOrd | FrameError::BadIrdOrd => {
                "check the peer's iWARP driver, which breaks RFC 6581 here"
            }
            FrameError::Truncated | FrameError::BadKey | FrameError::BufferTooShort => {
                "check that the peer is an iWARP endpoint and not another TCP service"
            }
        }
    }
}

/// A clause with its subject: "the MPA frame is shorter than …". Whose
/// frame it is (the peer's or ours) is for the caller to say.
impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the MPA frame ")?;
        self.clause(f)
    }
}

impl std::error::Error for FrameError {}

/// Which frame this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// The initiator's MPA request.
    Request,
    /// The responder's MPA reply accepting the connection.
    Reply,
    /// The responder's MPA reply with the R flag: the connection is refused.
    Reject,
}

/// Zero-copy view of an MPA request or reply.
///
/// [`Frame::new_checked`] validates the lengths once; afterwards no accessor
/// can panic.
#[derive(Debug, Clone, Copy)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking it. Accessors may panic unless
    /// [`Frame::check_len`] succeeds.
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps a buffer holding at least the header and the private data it
    /// announces.
    pub fn new_checked(buffer: T) -> Result<Frame<T>, FrameError> {
        let frame = Frame::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    /// Checks that the buffer holds the header and all the private data,
    /// and that the private data length is at most 512.
    pub fn check_len(&self) -> Result<(), FrameError> {
        let len = frame_len(self.buffer.as_ref())?.ok_or(FrameError::Truncated)?;
        if self.buffer.as_ref().len() < len {
            return Err(FrameError::Truncated);
        }
        Ok(())
    }

    /// Releases the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The 16-byte key.
    pub fn key(&self) -> &[u8] {
        &self.buffer.as_ref()[..KEY_LEN]
    }

    /// The frame kind, from the key and the R flag. A request carrying the
    /// R flag is still a request (the bit means nothing there).
    pub fn kind(&self) -> Result<FrameKind, FrameError> {
        let key = self.key();
        if key == REQUEST_KEY {
            Ok(FrameKind::Request)
        } else if key == REPLY_KEY {
            if self.reject() {
                Ok(FrameKind::Reject)
            } else {
                Ok(FrameKind::Reply)
            }
        } else {
            Err(FrameError::BadKey)
        }
    }

    /// Byte 16, all bits.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[KEY_LEN]
    }

    /// M: the sender wants to receive markers.
    pub fn markers(&self) -> bool {
        self.flags() & flags::MARKERS != 0
    }

    /// C: the sender wants CRCs.
    pub fn crc(&self) -> bool {
        self.flags() & flags::CRC != 0
    }

    /// R: the connection is rejected (replies only).
    pub fn reject(&self) -> bool {
        self.flags() & flags::REJECT != 0
    }

    /// The 0x10 enhanced-setup flag.
    pub fn enhanced(&self) -> bool {
        self.flags() & flags::ENHANCED != 0
    }

    /// Byte 17.
    pub fn revision(&self) -> u8 {
        self.buffer.as_ref()[KEY_LEN + 1]
    }

    /// The private data length field.
    pub fn private_data_len(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[18], b[19]])
    }

    /// All private data, IRD/ORD words included.
    pub fn private_data(&self) -> &[u8] {
        let end = HEADER_LEN + usize::from(self.private_data_len());
        &self.buffer.as_ref()[HEADER_LEN..end]
    }

    /// Header plus private data: how many bytes of the stream this frame
    /// occupies.
    pub fn total_len(&self) -> usize {
        HEADER_LEN + usize::from(self.private_data_len())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Writes the key.
    pub fn set_key(&mut self, key: &[u8; KEY_LEN]) {
        self.buffer.as_mut()[..KEY_LEN].copy_from_slice(key);
    }

    /// Writes byte 16.
    pub fn set_flags(&mut self, value: u8) {
        self.buffer.as_mut()[KEY_LEN] = value;
    }

    /// Writes byte 17.
    pub fn set_revision(&mut self, value: u8) {
        self.buffer.as_mut()[KEY_LEN + 1] = value;
    }

    /// Writes the private data length field.
    pub fn set_private_data_len(&mut self, value: u16) {
        self.buffer.as_mut()[18..20].copy_from_slice(&value.to_be_bytes());
    }

    /// The private data, writable (length from the length field).
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.private_data_len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// How many bytes the frame starting at `prefix` occupies, once its header
/// has arrived: `Ok(None)` while fewer than 20 bytes are at hand, an error
/// if the private data length exceeds 512. The key is not checked here.
pub fn frame_len(prefix: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(len_field) = prefix.get(18..20) else {
        return Ok(None);
    };
    let pd_len = u16::from_be_bytes([len_field[0], len_field[1]]);
    if usize::from(pd_len) > MAX_PRIVATE_DATA_RECV {
        return Err(FrameError::TooMuchPrivateData(pd_len));
    }
    Ok(Some(HEADER_LEN + usize::from(pd_len)))
}

/// One of the three zero-length messages that may serve as the
/// ready-to-receive message in peer-to-peer mode (RFC 6581 §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RtrType {
    /// Zero-length Send (IRD word bit 14, "L").
    Send,
    /// Zero-length RDMA Write (ORD word bit 15, "W").
    Write,
    /// Zero-length RDMA Read Request (ORD word bit 14, "R").
    Read,
}

/// A set of RTR kinds: the ones an initiator offers, or a responder accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtrSet {
    /// Zero-length Send.
    pub send: bool,
    /// Zero-length RDMA Write.
    pub write: bool,
    /// Zero-length RDMA Read.
    pub read: bool,
}

impl RtrSet {
    /// No RTR kind at all.
    pub const NONE: RtrSet = RtrSet {
        send: false,
        write: false,
        read: false,
    };
    /// All three kinds.
    pub const ALL: RtrSet = RtrSet {
        send: true,
        write: true,
        read: true,
    };

    /// The set holding exactly `rtr`.
    pub const fn only(rtr: RtrType) -> RtrSet {
        RtrSet {
            send: matches!(rtr, RtrType::Send),
            write: matches!(rtr, RtrType::Write),
            read: matches!(rtr, RtrType::Read),
        }
    }

    /// Whether `rtr` is in the set.
    pub const fn contains(self, rtr: RtrType) -> bool {
        match rtr {
            RtrType::Send => self.send,
            RtrType::Write => self.write,
            RtrType::Read => self.read,
        }
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        !(self.send || self.write || self.read)
    }

    /// The kinds in both sets.
    pub const fn intersection(self, other: RtrSet) -> RtrSet {
        RtrSet {
            send: self.send && other.send,
            write: self.write && other.write,
            read: self.read && other.read,
        }
    }

    /// How many kinds the set holds.
    pub const fn len(self) -> usize {
        self.send as usize + self.write as usize + self.read as usize
    }
}

/// The revision 2 IRD and ORD words with their control bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IrdOrd {
    /// Inbound RDMA Read queue depth (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth (14 bits).
    pub ord: u16,
    /// P: peer-to-peer mode requested (request) or accepted (reply).
    pub peer_to_peer: bool,
    /// L, W, R: the RTR kinds offered (request) or the one chosen (reply).
    pub rtr: RtrSet,
}

impl IrdOrd {
    /// Reads the four bytes.
    pub fn parse(bytes: [u8; IRD_ORD_LEN]) -> IrdOrd {
        let ird_word = u16::from_be_bytes([bytes[0], bytes[1]]);
        let ord_word = u16::from_be_bytes([bytes[2], bytes[3]]);
        IrdOrd {
            ird: ird_word & IRD_ORD_MAX,
            ord: ord_word & IRD_ORD_MAX,
            peer_to_peer: ird_word & P2P_BIT != 0,
            rtr: RtrSet {
                send: ird_word & SEND_RTR_BIT != 0,
                write: ord_word & WRITE_RTR_BIT != 0,
                read: ord_word & READ_RTR_BIT != 0,
            },
        }
    }

    /// Writes the four bytes; `None` if IRD or ORD exceeds 14 bits.
    pub fn emit(&self) -> Option<[u8; IRD_ORD_LEN]> {
        if self.ird > IRD_ORD_MAX || self.ord > IRD_ORD_MAX {
            return None;
        }
        let mut ird_word = self.ird;
        let mut ord_word = self.ord;
        if self.peer_to_peer {
            ird_word |= P2P_BIT;
        }
        if self.rtr.send {
            ird_word |= SEND_RTR_BIT;
        }
        if self.rtr.write {
            ord_word |= WRITE_RTR_BIT;
        }
        if self.rtr.read {
            ord_word |= READ_RTR_BIT;
        }
        let i = ird_word.to_be_bytes();
        let o = ord_word.to_be_bytes();
        Some([i[0], i[1], o[0], o[1]])
    }
}

/// The validated meaning of an MPA request, reply or reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr<'a> {
    /// Request, reply or reject.
    pub kind: FrameKind,
    /// M: the sender wants to receive markers.
    pub markers: bool,
    /// C: the sender wants CRCs.
    pub crc: bool,
    /// 1 or 2.
    pub revision: u8,
    /// Revision 2 with the 0x10 flag: the IRD/ORD words. Their presence is
    /// what the 0x10 flag says on the wire.
    pub ird_ord: Option<IrdOrd>,
    /// The application's private data (after the IRD/ORD words, if any).
    pub private_data: &'a [u8],
}

impl<'a> FrameRepr<'a> {
    /// Validates a frame. Reserved flag bits are ignored, as RFC 5044 asks;
    /// so is the 0x10 flag in revision 1 and the R flag in a request.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        frame: &Frame<&'a T>,
    ) -> Result<FrameRepr<'a>, FrameError> {
        frame.check_len()?;
        let kind = frame.kind()?;
        let revision = frame.revision();
        if revision != 1 && revision != 2 {
            return Err(FrameError::BadRevision(revision));
        }
        let bytes: &'a [u8] = frame.buffer.as_ref();
        let end = HEADER_LEN + usize::from(frame.private_data_len());
        let all_pd = bytes.get(HEADER_LEN..end).ok_or(FrameError::Truncated)?;
        let (ird_ord, private_data) = if revision == 2 && frame.enhanced() {
            let (words, rest) = all_pd
                .split_first_chunk::<IRD_ORD_LEN>()
                .ok_or(FrameError::MissingIrdOrd)?;
            (Some(IrdOrd::parse(*words)), rest)
        } else {
            (None, all_pd)
        };
        Ok(FrameRepr {
            kind,
            markers: frame.markers(),
            crc: frame.crc(),
            revision,
            ird_ord,
            private_data,
        })
    }

    /// Parses a frame from the start of `bytes` (which may hold more after
    /// it), returning the meaning and the frame's length.
    pub fn parse_prefix(bytes: &'a [u8]) -> Result<(FrameRepr<'a>, usize), FrameError> {
        let len = frame_len(bytes)?.ok_or(FrameError::Truncated)?;
        let frame_bytes = bytes.get(..len).ok_or(FrameError::Truncated)?;
        let repr = FrameRepr::parse(&Frame::new_checked(frame_bytes)?)?;
        Ok((repr, len))
    }

    /// Length of the private data field, IRD/ORD words included.
    pub fn private_data_field_len(&self) -> usize {
        self.private_data.len()
            + if self.ird_ord.is_some() {
                IRD_ORD_LEN
            } else {
                0
            }
    }

    /// Bytes [`FrameRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.private_data_field_len()
    }

    /// Writes the frame to the start of `buf`. Refuses more than 256 bytes
    /// of private data in all, IRD/ORD words outside revision 2, and
    /// revisions other than 1 and 2.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, FrameError> {
        let pd_len = self.private_data_field_len();
        if pd_len > MAX_PRIVATE_DATA_SEND {
            return Err(FrameError::TooMuchPrivateData(
                u16::try_from(pd_len).unwrap_or(u16::MAX),
            ));
        }
        if self.revision != 1 && self.revision != 2 {
            return Err(FrameError::BadRevision(self.revision));
        }
        let words = match self.ird_ord {
            Some(w) if self.revision == 2 => Some(w.emit().ok_or(FrameError::BadIrdOrd)?),
            Some(_) => return Err(FrameError::BadIrdOrd),
            None => None,
        };
        let total = HEADER_LEN + pd_len;
        let out = buf.get_mut(..total).ok_or(FrameError::BufferTooShort)?;
        let mut frame = Frame::new_unchecked(out);
        frame.set_key(match self.kind {
            FrameKind::Request => REQUEST_KEY,
            FrameKind::Reply | FrameKind::Reject => REPLY_KEY,
        });
        let mut f = 0;
        if self.markers {
            f |= flags::MARKERS;
        }
        if self.crc {
            f |= flags::CRC;
        }
        if self.kind == FrameKind::Reject {
            f |= flags::REJECT;
        }
        if words.is_some() {
            f |= flags::ENHANCED;
        }
        frame.set_flags(f);
        frame.set_revision(self.revision);
        // pd_len <= 256 was checked above.
        frame.set_private_data_len(pd_len as u16);
        let pd = frame.private_data_mut();
        let app = match words {
            Some(w) => {
                pd[..IRD_ORD_LEN].copy_from_slice(&w);
                &mut pd[IRD_ORD_LEN..]
            }
            None => pd,
        };
        app.copy_from_slice(self.private_data);
        Ok(total)
    }

    /// Convenience: emits into a new vector (connection setup only).
    pub fn to_vec(&self) -> Result<Vec<u8>, FrameError> {
        let mut v = vec![0; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// rping's MPA request (rping.pcap, client to server): revision 2,
    /// enhanced flag, IRD 1 / ORD 1.
    const RPING_REQUEST: &str = "4d504120494420526571204672616d65 10 02 0004 00010001";

    #[test]
    fn golden_rping_request() {
        let bytes = hex(RPING_REQUEST);
        let frame = Frame::new_checked(&bytes[..]).unwrap();
        assert_eq!(frame.kind(), Ok(FrameKind::Request));
        assert_eq!(frame.flags(), 0x10);
        let repr = FrameRepr::parse(&frame).unwrap();
        assert_eq!(
            repr,
            FrameRepr {
                kind: FrameKind::Request,
                markers: false,
                crc: false,
                revision: 2,
                ird_ord: Some(IrdOrd {
                    ird: 1,
                    ord: 1,
                    peer_to_peer: false,
                    rtr: RtrSet::NONE
                }),
                private_data: &[],
            }
        );
        assert_eq!(repr.to_vec().unwrap(), bytes);
    }

    #[test]
    fn ird_ord_bits() {
        // host-probe.pcap: peer-to-peer, IRD 4, ORD 4, READ RTR.
        let w = IrdOrd::parse([0x80, 0x04, 0x40, 0x04]);
        assert!(w.peer_to_peer);
        assert_eq!(w.rtr, RtrSet::only(RtrType::Read));
        assert_eq!((w.ird, w.ord), (4, 4));
        assert_eq!(w.emit(), Some([0x80, 0x04, 0x40, 0x04]));
        let send = IrdOrd {
            rtr: RtrSet::only(RtrType::Send),
            ..IrdOrd::default()
        };
        assert_eq!(send.emit(), Some([0x40, 0, 0, 0]));
        let write = IrdOrd {
            rtr: RtrSet::only(RtrType::Write),
            ..IrdOrd::default()
        };
        assert_eq!(write.emit(), Some([0, 0, 0x80, 0]));
        assert_eq!(
            IrdOrd {
                ird: 0x4000,
                ..IrdOrd::default()
            }
            .emit(),
            None
        );
    }

    #[test]
    fn short_and_oversized() {
        let bytes = hex(RPING_REQUEST);
        for n in 0..bytes.len() {
            assert_eq!(
                Frame::new_checked(&bytes[..n]).err(),
                Some(FrameError::Truncated)
            );
        }
        let mut big = bytes.clone();
        big[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert_eq!(
            Frame::new_checked(&big[..]).err(),
            Some(FrameError::TooMuchPrivateData(513))
        );
    }
}
