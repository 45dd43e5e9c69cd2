//! ICMPv4 echo request and reply (RFC 792), so that the host answers ping.
//!
//! Parsed from an IPv4 payload whose protocol is ICMP. Only echo is
//! handled; every other type is well-formed but
//! [`WireError::Unsupported`]. The echo data stays in the buffer it arrived
//! in: the representation carries only its length.

use super::checksum;
use super::{Checksum, Result, WireError};

mod field {
    use core::ops::Range;

    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    pub const ECHO_IDENT: Range<usize> = 4..6;
    pub const ECHO_SEQNO: Range<usize> = 6..8;
}

/// Length of an echo header.
pub const HEADER_LEN: usize = 8;

const TYPE_ECHO_REPLY: u8 = 0;
const TYPE_ECHO_REQUEST: u8 = 8;

/// A view of an ICMPv4 message. The buffer must span exactly the message
/// (the IPv4 payload): the checksum covers all of it.
#[derive(Debug, Clone)]
pub struct Icmpv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Icmpv4Packet<T> {
    /// Wraps a buffer without checking it. Accessors may panic until
    /// [`Icmpv4Packet::check_len`] has succeeded.
    pub const fn new_unchecked(buffer: T) -> Icmpv4Packet<T> {
        Icmpv4Packet { buffer }
    }

    /// Wraps a buffer after checking that the 8-byte header fits.
    pub fn new_checked(buffer: T) -> Result<Icmpv4Packet<T>> {
        let p = Icmpv4Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validates the length. See [`Icmpv4Packet::new_checked`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// Message type.
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }

    /// Message code.
    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Echo identifier.
    pub fn echo_ident(&self) -> u16 {
        self.u16_at(field::ECHO_IDENT)
    }

    /// Echo sequence number.
    pub fn echo_seq_no(&self) -> u16 {
        self.u16_at(field::ECHO_SEQNO)
    }

    /// The echo data: everything after the 8-byte header.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// Whether the checksum over the whole message verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::verifies(checksum::sum(self.buffer.as_ref()))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv4Packet<T> {
    /// The echo data, mutable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }

    /// Computes and stores the checksum over the whole buffer.
    pub fn fill_checksum(&mut self) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&[0, 0]);
        let c = checksum::finish(checksum::sum(self.buffer.as_ref()));
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    }
}

/// A validated echo message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv4Repr {
    /// Type 8, code 0.
    EchoRequest {
        ident: u16,
        seq_no: u16,
        data_len: usize,
    },
    /// Type 0, code 0.
    EchoReply {
        ident: u16,
        seq_no: u16,
        data_len: usize,
    },
}

impl Icmpv4Repr {
    /// Parses a message: the checksum first (unless trusted), then the type.
    pub fn parse<T: AsRef<[u8]>>(
        packet: &Icmpv4Packet<T>,
        checksum: Checksum,
    ) -> Result<Icmpv4Repr> {
        packet.check_len()?;
        if checksum == Checksum::Verify && !packet.verify_checksum() {
            return Err(WireError::BadChecksum);
        }
        let (ident, seq_no, data_len) = (
            packet.echo_ident(),
            packet.echo_seq_no(),
            packet.data().len(),
        );
        match (packet.msg_type(), packet.msg_code()) {
            (TYPE_ECHO_REQUEST, 0) => Ok(Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data_len,
            }),
            (TYPE_ECHO_REPLY, 0) => Ok(Icmpv4Repr::EchoReply {
                ident,
                seq_no,
                data_len,
            }),
            _ => Err(WireError::Unsupported),
        }
    }

    /// Length of the header.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Length of header plus data.
    pub const fn buffer_len(&self) -> usize {
        match *self {
            Icmpv4Repr::EchoRequest { data_len, .. } | Icmpv4Repr::EchoReply { data_len, .. } => {
                HEADER_LEN + data_len
            }
        }
    }

    /// Writes the 8-byte header into `buf[..8]`, with the checksum over the
    /// header and `data`. The data is not copied: the caller places it after
    /// the header (for a reply, it usually already is there; split the
    /// buffer with `split_at_mut`).
    ///
    /// # Panics
    /// If `buf` is shorter than 8 bytes. `data.len()` should equal the
    /// representation's `data_len`.
    pub fn emit(&self, buf: &mut [u8], data: &[u8]) {
        debug_assert_eq!(self.buffer_len(), HEADER_LEN + data.len());
        let (ty, ident, seq_no) = match *self {
            Icmpv4Repr::EchoRequest { ident, seq_no, .. } => (TYPE_ECHO_REQUEST, ident, seq_no),
            Icmpv4Repr::EchoReply { ident, seq_no, .. } => (TYPE_ECHO_REPLY, ident, seq_no),
        };
        let h = &mut buf[..HEADER_LEN];
        h[field::TYPE] = ty;
        h[field::CODE] = 0;
        h[field::CHECKSUM].copy_from_slice(&[0, 0]);
        h[field::ECHO_IDENT].copy_from_slice(&ident.to_be_bytes());
        h[field::ECHO_SEQNO].copy_from_slice(&seq_no.to_be_bytes());
        // The header is 8 bytes long, so the data starts at an even offset.
        let c = checksum::finish(checksum::combine(checksum::sum(h), checksum::sum(data)));
        h[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An echo request as Linux ping sends it: ident 0x1c46, seq 1, 8 data
    /// bytes.
    fn request() -> Vec<u8> {
        let mut b = vec![8, 0, 0, 0, 0x1c, 0x46, 0x00, 0x01];
        b.extend_from_slice(b"abcdefgh");
        Icmpv4Packet::new_unchecked(&mut b[..]).fill_checksum();
        b
    }

    #[test]
    fn parse_and_emit() {
        let b = request();
        let p = Icmpv4Packet::new_checked(&b[..]).unwrap();
        let r = Icmpv4Repr::parse(&p, Checksum::Verify).unwrap();
        assert_eq!(
            r,
            Icmpv4Repr::EchoRequest {
                ident: 0x1c46,
                seq_no: 1,
                data_len: 8
            }
        );
        let mut out = [0u8; 8];
        r.emit(&mut out, p.data());
        assert_eq!(&out[..], &b[..8]);
    }

    #[test]
    fn truncated() {
        let b = request();
        for n in 0..HEADER_LEN {
            assert_eq!(
                Icmpv4Repr::parse(&Icmpv4Packet::new_unchecked(&b[..n]), Checksum::Trusted),
                Err(WireError::Truncated)
            );
        }
    }

    #[test]
    fn bad_checksum() {
        let b = request();
        for bit in 0..b.len() * 8 {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(
                Icmpv4Repr::parse(&Icmpv4Packet::new_unchecked(&c[..]), Checksum::Verify),
                Err(WireError::BadChecksum),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn other_types_unsupported() {
        // Destination unreachable, and an echo request with a non-zero code.
        for (t, c) in [(3u8, 1u8), (8, 1), (11, 0)] {
            let mut b = request();
            b[0] = t;
            b[1] = c;
            Icmpv4Packet::new_unchecked(&mut b[..]).fill_checksum();
            assert_eq!(
                Icmpv4Repr::parse(&Icmpv4Packet::new_unchecked(&b[..]), Checksum::Verify),
                Err(WireError::Unsupported)
            );
        }
    }

    proptest! {
        #[test]
        fn emit_parse_identity(
            reply in any::<bool>(),
            ident in any::<u16>(),
            seq_no in any::<u16>(),
            data in proptest::collection::vec(any::<u8>(), 0..100),
        ) {
            let data_len = data.len();
            let r = if reply {
                Icmpv4Repr::EchoReply { ident, seq_no, data_len }
            } else {
                Icmpv4Repr::EchoRequest { ident, seq_no, data_len }
            };
            let mut buf = vec![0u8; r.buffer_len()];
            let (h, d) = buf.split_at_mut(HEADER_LEN);
            d.copy_from_slice(&data);
            r.emit(h, d);
            let p = Icmpv4Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(p.data(), &data[..]);
            prop_assert_eq!(Icmpv4Repr::parse(&p, Checksum::Verify), Ok(r));
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..40)) {
            let p = Icmpv4Packet::new_unchecked(&data[..]);
            for c in [Checksum::Verify, Checksum::Trusted] {
                if let Ok(r) = Icmpv4Repr::parse(&p, c) {
                    prop_assert_eq!(r.buffer_len(), data.len());
                }
            }
        }
    }
}
