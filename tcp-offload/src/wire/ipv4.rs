//! IPv4 (RFC 791 §3.1) header: validated on receive, written on transmit.
//!
//! Sits between Ethernet and TCP/ICMP. Options are skipped (never emitted),
//! the header checksum is verified unless the NIC already did, and
//! fragments are refused with [`WireError::Fragmented`] so that the host
//! can count them: iWARP peers set DF and size segments to the path MTU, so
//! a fragment means a misconfigured path rather than traffic to reassemble.

use core::net::Ipv4Addr;

use super::checksum;
use super::{Checksum, Result, WireError};

/// The protocol field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpProtocol {
    /// 1.
    Icmp,
    /// 6.
    Tcp,
    /// 17.
    Udp,
    /// Anything else, kept as on the wire.
    Unknown(u8),
}

impl From<u8> for IpProtocol {
    fn from(v: u8) -> IpProtocol {
        match v {
            1 => IpProtocol::Icmp,
            6 => IpProtocol::Tcp,
            17 => IpProtocol::Udp,
            other => IpProtocol::Unknown(other),
        }
    }
}

impl From<IpProtocol> for u8 {
    fn from(v: IpProtocol) -> u8 {
        match v {
            IpProtocol::Icmp => 1,
            IpProtocol::Tcp => 6,
            IpProtocol::Udp => 17,
            IpProtocol::Unknown(other) => other,
        }
    }
}

mod field {
    use core::ops::Range;

    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
}

/// Length of a header without options, the only kind emitted.
pub const HEADER_LEN: usize = 20;

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps a buffer without checking it. Accessors may panic until
    /// [`Ipv4Packet::check_len`] has succeeded.
    pub const fn new_unchecked(buffer: T) -> Ipv4Packet<T> {
        Ipv4Packet { buffer }
    }

    /// Wraps a buffer after checking the version and that the header and
    /// the total length fit. The buffer may be longer than the total length
    /// (Ethernet pads short frames); [`Ipv4Packet::payload`] stops at the
    /// total length.
    pub fn new_checked(buffer: T) -> Result<Ipv4Packet<T>> {
        let p = Ipv4Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validates, in order: a 20-byte fixed header is present
    /// ([`WireError::Truncated`]), the version is 4
    /// ([`WireError::BadVersion`]), the IHL is at least 5
    /// ([`WireError::BadLength`]), the header fits in the buffer
    /// (`Truncated`), the total length covers the header (`BadLength`) and
    /// fits in the buffer (`Truncated`).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if self.version() != 4 {
            return Err(WireError::BadVersion);
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(WireError::BadLength);
        }
        if len < hl {
            return Err(WireError::Truncated);
        }
        let total = usize::from(self.total_len());
        if total < hl {
            return Err(WireError::BadLength);
        }
        if total > len {
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

    /// Version field.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL × 4), options included.
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// The type-of-service octet (DSCP and ECN).
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[field::TOS]
    }

    /// Total length, header and payload.
    pub fn total_len(&self) -> u16 {
        self.u16_at(field::LENGTH)
    }

    /// Identification.
    pub fn ident(&self) -> u16 {
        self.u16_at(field::IDENT)
    }

    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_DF != 0
    }

    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_MF != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (self.u16_at(field::FLG_OFF) & OFFSET_MASK) << 3
    }

    /// Time to live.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// Protocol of the payload.
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::PROTOCOL])
    }

    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::SRC];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::DST];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// Whether the header checksum verifies (options included).
    pub fn verify_checksum(&self) -> bool {
        checksum::verifies(checksum::sum(&self.buffer.as_ref()[..self.header_len()]))
    }

    /// The payload: from the end of the header (after any options) to the
    /// total length. Link-layer padding beyond the total length is not part
    /// of it.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    fn set_u16_at(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets version 4 and the header length in bytes (a multiple of 4).
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        // IHL is a 4-bit field; larger values are a caller bug and are
        // masked rather than allowed to spill into the version.
        let ihl = ((header_len / 4) & 0x0f) as u8;
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ihl;
    }

    /// Sets the type-of-service octet.
    pub fn set_tos(&mut self, v: u8) {
        self.buffer.as_mut()[field::TOS] = v;
    }

    /// Sets the total length.
    pub fn set_total_len(&mut self, v: u16) {
        self.set_u16_at(field::LENGTH, v);
    }

    /// Sets the identification.
    pub fn set_ident(&mut self, v: u16) {
        self.set_u16_at(field::IDENT, v);
    }

    /// Sets the flags and fragment offset (in bytes, a multiple of 8).
    pub fn set_frag(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let mut v = (offset >> 3) & OFFSET_MASK;
        if dont_frag {
            v |= FLAG_DF;
        }
        if more_frags {
            v |= FLAG_MF;
        }
        self.set_u16_at(field::FLG_OFF, v);
    }

    /// Sets the time to live.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }

    /// Sets the protocol.
    pub fn set_next_header(&mut self, v: IpProtocol) {
        self.buffer.as_mut()[field::PROTOCOL] = u8::from(v);
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16_at(field::CHECKSUM, v);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.octets());
    }

    /// Computes and stores the header checksum.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let c = checksum::finish(checksum::sum(&self.buffer.as_ref()[..hl]));
        self.set_checksum(c);
    }

    /// The payload, mutable (see [`Ipv4Packet::payload`]).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let range = self.header_len()..usize::from(self.total_len());
        &mut self.buffer.as_mut()[range]
    }
}

/// A validated IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    pub src_addr: Ipv4Addr,
    pub dst_addr: Ipv4Addr,
    pub next_header: IpProtocol,
    /// Bytes after the header: total length minus header length.
    pub payload_len: usize,
    /// Time to live.
    pub hop_limit: u8,
    /// Type of service (DSCP and ECN).
    pub tos: u8,
    /// Identification. Meaningless with DF set, but echoed as received so
    /// that emit ∘ parse is the identity.
    pub ident: u16,
    pub dont_frag: bool,
}

impl Ipv4Repr {
    /// Parses and validates a header: the checks of
    /// [`Ipv4Packet::check_len`], then the header checksum unless
    /// `checksum` is [`Checksum::Trusted`] ([`WireError::BadChecksum`]),
    /// then fragments ([`WireError::Fragmented`] for MF set or a non-zero
    /// offset).
    ///
    /// Always inlined: see [`TcpRepr::parse_with`](super::TcpRepr::parse_with).
    #[inline(always)]
    pub fn parse<T: AsRef<[u8]>>(packet: &Ipv4Packet<T>, checksum: Checksum) -> Result<Ipv4Repr> {
        packet.check_len()?;
        if checksum == Checksum::Verify && !packet.verify_checksum() {
            return Err(WireError::BadChecksum);
        }
        if packet.more_frags() || packet.frag_offset() != 0 {
            return Err(WireError::Fragmented);
        }
        Ok(Ipv4Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            next_header: packet.next_header(),
            payload_len: usize::from(packet.total_len()) - packet.header_len(),
            hop_limit: packet.hop_limit(),
            tos: packet.tos(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
        })
    }

    /// Length of the header this representation emits (no options).
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Length of header plus payload, the total-length field.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload_len
    }

    /// Writes a 20-byte header with its checksum into `buf[..20]`. The
    /// payload is not touched.
    ///
    /// # Panics
    /// If `buf` is shorter than 20 bytes or `payload_len` exceeds
    /// 65515, both caller bugs.
    pub fn emit(&self, buf: &mut [u8]) {
        let total = match u16::try_from(self.buffer_len()) {
            Ok(t) => t,
            Err(_) => panic!("IPv4 payload of {} bytes", self.payload_len),
        };
        // The header is assembled in a local array and its checksum
        // summed from the field values, then stored in one copy: summing
        // the bytes back out of the frame just after writing them field
        // by field made wide loads wait on narrow stores, on every frame
        // sent.
        let flags = if self.dont_frag { FLAG_DF } else { 0 };
        let (src, dst) = (self.src_addr.octets(), self.dst_addr.octets());
        let word = |hi: u8, lo: u8| u32::from(u16::from_be_bytes([hi, lo]));
        let sum = word(0x45, self.tos)
            + u32::from(total)
            + u32::from(self.ident)
            + u32::from(flags)
            + word(self.hop_limit, u8::from(self.next_header))
            + word(src[0], src[1])
            + word(src[2], src[3])
            + word(dst[0], dst[1])
            + word(dst[2], dst[3]);
        let c = checksum::finish(sum).to_be_bytes();
        let t = total.to_be_bytes();
        let id = self.ident.to_be_bytes();
        let f = flags.to_be_bytes();
        let header: [u8; HEADER_LEN] = [
            0x45,
            self.tos,
            t[0],
            t[1],
            id[0],
            id[1],
            f[0],
            f[1],
            self.hop_limit,
            u8::from(self.next_header),
            c[0],
            c[1],
            src[0],
            src[1],
            src[2],
            src[3],
            dst[0],
            dst[1],
            dst[2],
            dst[3],
        ];
        buf[..HEADER_LEN].copy_from_slice(&header);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A SYN's IPv4 header: 10.77.0.12 → 10.77.0.11, total length 60,
    /// DF, TTL 64, TCP.
    const HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x3c, 0x5a, 0x1b, 0x40, 0x00, 0x40, 0x06, 0xcc, 0x3b, 0x0a, 0x4d, 0x00,
        0x0c, 0x0a, 0x4d, 0x00, 0x0b,
    ];

    fn packet(payload: usize) -> Vec<u8> {
        let mut b = HDR.to_vec();
        b.resize(20 + payload, 0xa5);
        let total = (20 + payload) as u16;
        b[2..4].copy_from_slice(&total.to_be_bytes());
        let mut p = Ipv4Packet::new_unchecked(&mut b[..]);
        p.fill_checksum();
        b
    }

    #[test]
    fn parse_and_emit() {
        let b = packet(40);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        let r = Ipv4Repr::parse(&p, Checksum::Verify).unwrap();
        assert_eq!(
            r,
            Ipv4Repr {
                src_addr: Ipv4Addr::new(10, 77, 0, 12),
                dst_addr: Ipv4Addr::new(10, 77, 0, 11),
                next_header: IpProtocol::Tcp,
                payload_len: 40,
                hop_limit: 64,
                tos: 0,
                ident: 0x5a1b,
                dont_frag: true,
            }
        );
        let mut out = [0u8; 20];
        r.emit(&mut out);
        assert_eq!(&out[..], &b[..20]);
    }

    #[test]
    fn truncated_at_every_length() {
        let b = packet(40);
        for n in 0..b.len() {
            assert_eq!(
                Ipv4Repr::parse(&Ipv4Packet::new_unchecked(&b[..n]), Checksum::Verify),
                Err(WireError::Truncated),
                "len {n}"
            );
        }
    }

    #[test]
    fn padding_is_not_payload() {
        let mut b = packet(6);
        b.extend_from_slice(&[0; 20]);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.payload(), &[0xa5; 6]);
        assert_eq!(
            Ipv4Repr::parse(&p, Checksum::Verify).unwrap().payload_len,
            6
        );
    }

    #[test]
    fn options_are_skipped() {
        // IHL 6 with a 4-byte option (NOP NOP NOP EOL).
        let mut b = HDR.to_vec();
        b[0] = 0x46;
        b.extend_from_slice(&[1, 1, 1, 0]);
        b.extend_from_slice(&[7, 8, 9]);
        b[2..4].copy_from_slice(&27u16.to_be_bytes());
        Ipv4Packet::new_unchecked(&mut b[..]).fill_checksum();
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.payload(), &[7, 8, 9]);
        assert_eq!(
            Ipv4Repr::parse(&p, Checksum::Verify).unwrap().payload_len,
            3
        );
    }

    #[test]
    fn bad_version() {
        let mut b = packet(0);
        b[0] = 0x65;
        assert_eq!(
            Ipv4Packet::new_checked(&b[..]).err(),
            Some(WireError::BadVersion)
        );
    }

    #[test]
    fn bad_ihl() {
        for ihl in 0..5u8 {
            let mut b = packet(20);
            b[0] = 0x40 | ihl;
            assert_eq!(
                Ipv4Packet::new_checked(&b[..]).err(),
                Some(WireError::BadLength),
                "ihl {ihl}"
            );
        }
        // IHL 15 (60 bytes) in a 40-byte buffer.
        let mut b = packet(20);
        b[0] = 0x4f;
        assert_eq!(
            Ipv4Packet::new_checked(&b[..]).err(),
            Some(WireError::Truncated)
        );
    }

    #[test]
    fn bad_total_length() {
        let mut b = packet(10);
        b[2..4].copy_from_slice(&19u16.to_be_bytes());
        assert_eq!(
            Ipv4Packet::new_checked(&b[..]).err(),
            Some(WireError::BadLength)
        );
        b[2..4].copy_from_slice(&31u16.to_be_bytes());
        assert_eq!(
            Ipv4Packet::new_checked(&b[..]).err(),
            Some(WireError::Truncated)
        );
    }

    #[test]
    fn bad_checksum_every_bit() {
        let b = packet(4);
        for bit in 0..160 {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            let p = Ipv4Packet::new_unchecked(&c[..]);
            let r = Ipv4Repr::parse(&p, Checksum::Verify);
            // A flipped bit in a length or version field may be caught
            // earlier; everything else must be a checksum failure.
            assert!(
                matches!(
                    r,
                    Err(WireError::BadChecksum
                        | WireError::BadLength
                        | WireError::BadVersion
                        | WireError::Truncated)
                ),
                "bit {bit}: {r:?}"
            );
            if !(0..4).contains(&(bit / 8)) {
                assert_eq!(r, Err(WireError::BadChecksum), "bit {bit}");
            }
        }
        // Trusted skips the check.
        let mut c = b.clone();
        c[10] ^= 0xff;
        let p = Ipv4Packet::new_unchecked(&c[..]);
        assert_eq!(
            Ipv4Repr::parse(&p, Checksum::Verify),
            Err(WireError::BadChecksum)
        );
        assert!(Ipv4Repr::parse(&p, Checksum::Trusted).is_ok());
    }

    #[test]
    fn fragments_refused() {
        for (mf, off) in [(true, 0u16), (false, 8), (true, 1480), (false, 0xfff8)] {
            let mut b = packet(8);
            let mut p = Ipv4Packet::new_unchecked(&mut b[..]);
            p.set_frag(false, mf, off);
            p.fill_checksum();
            let p = Ipv4Packet::new_checked(&b[..]).unwrap();
            assert_eq!(p.more_frags(), mf);
            assert_eq!(p.frag_offset(), off);
            assert_eq!(
                Ipv4Repr::parse(&p, Checksum::Verify),
                Err(WireError::Fragmented),
                "mf {mf} off {off}"
            );
        }
    }

    fn arb_repr() -> impl Strategy<Value = Ipv4Repr> {
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u8>(),
            0usize..=(65535 - 20),
            any::<u8>(),
            any::<u8>(),
            any::<u16>(),
            any::<bool>(),
        )
            .prop_map(|(s, d, proto, len, ttl, tos, ident, df)| Ipv4Repr {
                src_addr: Ipv4Addr::from(s),
                dst_addr: Ipv4Addr::from(d),
                next_header: IpProtocol::from(proto),
                payload_len: len,
                hop_limit: ttl,
                tos,
                ident,
                dont_frag: df,
            })
    }

    proptest! {
        /// The header emit assembles, its checksum summed from the
        /// fields, is byte for byte the one the packet's setters and
        /// `fill_checksum` write.
        #[test]
        fn emit_equals_the_field_by_field_header(r in arb_repr()) {
            let mut fast = vec![0u8; r.buffer_len()];
            r.emit(&mut fast);
            let mut slow = vec![0u8; r.buffer_len()];
            let mut p = Ipv4Packet::new_unchecked(&mut slow[..HEADER_LEN]);
            p.set_version_and_header_len(HEADER_LEN);
            p.set_tos(r.tos);
            p.set_total_len(r.buffer_len() as u16);
            p.set_ident(r.ident);
            p.set_frag(r.dont_frag, false, 0);
            p.set_hop_limit(r.hop_limit);
            p.set_next_header(r.next_header);
            p.set_src_addr(r.src_addr);
            p.set_dst_addr(r.dst_addr);
            p.fill_checksum();
            prop_assert_eq!(fast, slow);
        }

        #[test]
        fn emit_parse_identity(r in arb_repr()) {
            let mut buf = vec![0u8; r.buffer_len()];
            r.emit(&mut buf);
            let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(p.payload().len(), r.payload_len);
            prop_assert_eq!(Ipv4Repr::parse(&p, Checksum::Verify), Ok(r));
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            mut data in proptest::collection::vec(any::<u8>(), 0..80),
            fix_version in any::<bool>(),
        ) {
            if fix_version && !data.is_empty() {
                data[0] = 0x40 | (data[0] & 0x0f);
            }
            let p = Ipv4Packet::new_unchecked(&data[..]);
            for c in [Checksum::Verify, Checksum::Trusted] {
                if let Ok(r) = Ipv4Repr::parse(&p, c) {
                    prop_assert_eq!(p.payload().len(), r.payload_len);
                    prop_assert!(p.header_len() + r.payload_len <= data.len());
                }
            }
        }
    }
}
