//! ARP (RFC 826) for IPv4 over Ethernet.
//!
//! Carried directly in Ethernet frames (EtherType 0x0806). The host
//! interface answers requests for its own address and resolves next hops
//! with it; other hardware or protocol types are well-formed but
//! [`WireError::Unsupported`].

use core::net::Ipv4Addr;

use super::ethernet::EthernetAddress;
use super::{Result, WireError};

/// The ARP opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOperation {
    /// 1.
    Request,
    /// 2.
    Reply,
    /// Anything else, kept as on the wire.
    Unknown(u16),
}

impl From<u16> for ArpOperation {
    fn from(v: u16) -> ArpOperation {
        match v {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            other => ArpOperation::Unknown(other),
        }
    }
}

impl From<ArpOperation> for u16 {
    fn from(v: ArpOperation) -> u16 {
        match v {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
            ArpOperation::Unknown(other) => other,
        }
    }
}

mod field {
    use core::ops::Range;

    pub const HTYPE: Range<usize> = 0..2;
    pub const PTYPE: Range<usize> = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Range<usize> = 6..8;
    /// Start of the variable-length address fields.
    pub const ADDRS: usize = 8;
}

/// Hardware type of Ethernet.
const HTYPE_ETHERNET: u16 = 1;
/// Protocol type of IPv4 (its EtherType).
const PTYPE_IPV4: u16 = 0x0800;

/// Length of an Ethernet/IPv4 ARP packet.
pub const ETHERNET_IPV4_LEN: usize = 28;

/// A view of an ARP packet of any hardware and protocol type.
#[derive(Debug, Clone)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Wraps a buffer without checking it. Accessors may panic until
    /// [`ArpPacket::check_len`] has succeeded.
    pub const fn new_unchecked(buffer: T) -> ArpPacket<T> {
        ArpPacket { buffer }
    }

    /// Wraps a buffer after checking that the fixed part and the four
    /// addresses, as long as the length fields say, fit.
    pub fn new_checked(buffer: T) -> Result<ArpPacket<T>> {
        let p = ArpPacket::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validates the lengths. See [`ArpPacket::new_checked`].
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < field::ADDRS {
            return Err(WireError::Truncated);
        }
        if b.len() < field::ADDRS + 2 * (self.hardware_len() + self.protocol_len()) {
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

    /// Hardware type (1 for Ethernet).
    pub fn hardware_type(&self) -> u16 {
        self.u16_at(field::HTYPE)
    }

    /// Protocol type (0x0800 for IPv4).
    pub fn protocol_type(&self) -> u16 {
        self.u16_at(field::PTYPE)
    }

    /// Length of a hardware address.
    pub fn hardware_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::HLEN])
    }

    /// Length of a protocol address.
    pub fn protocol_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::PLEN])
    }

    /// Operation.
    pub fn operation(&self) -> ArpOperation {
        ArpOperation::from(self.u16_at(field::OPER))
    }

    fn addr(&self, start: usize, len: usize) -> &[u8] {
        &self.buffer.as_ref()[start..start + len]
    }

    /// Sender hardware address bytes.
    pub fn source_hardware_addr(&self) -> &[u8] {
        self.addr(field::ADDRS, self.hardware_len())
    }

    /// Sender protocol address bytes.
    pub fn source_protocol_addr(&self) -> &[u8] {
        self.addr(field::ADDRS + self.hardware_len(), self.protocol_len())
    }

    /// Target hardware address bytes.
    pub fn target_hardware_addr(&self) -> &[u8] {
        self.addr(
            field::ADDRS + self.hardware_len() + self.protocol_len(),
            self.hardware_len(),
        )
    }

    /// Target protocol address bytes.
    pub fn target_protocol_addr(&self) -> &[u8] {
        self.addr(
            field::ADDRS + 2 * self.hardware_len() + self.protocol_len(),
            self.protocol_len(),
        )
    }
}

/// A validated ARP packet. Only Ethernet/IPv4 is meaningful to this stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpRepr {
    /// ARP for IPv4 over Ethernet.
    EthernetIpv4 {
        operation: ArpOperation,
        source_hardware_addr: EthernetAddress,
        source_protocol_addr: Ipv4Addr,
        target_hardware_addr: EthernetAddress,
        target_protocol_addr: Ipv4Addr,
    },
}

fn ipv4_from(b: &[u8]) -> Option<Ipv4Addr> {
    let o: [u8; 4] = b.try_into().ok()?;
    Some(Ipv4Addr::from(o))
}

impl ArpRepr {
    /// Parses an ARP packet. Trailing bytes (Ethernet padding) are ignored.
    pub fn parse<T: AsRef<[u8]>>(packet: &ArpPacket<T>) -> Result<ArpRepr> {
        packet.check_len()?;
        if packet.hardware_type() != HTYPE_ETHERNET
            || packet.protocol_type() != PTYPE_IPV4
            || packet.hardware_len() != 6
            || packet.protocol_len() != 4
        {
            return Err(WireError::Unsupported);
        }
        // The lengths were just checked, so these conversions succeed; the
        // error arm keeps the parser free of panics regardless.
        let sha = EthernetAddress::from_bytes(packet.source_hardware_addr());
        let spa = ipv4_from(packet.source_protocol_addr());
        let tha = EthernetAddress::from_bytes(packet.target_hardware_addr());
        let tpa = ipv4_from(packet.target_protocol_addr());
        match (sha, spa, tha, tpa) {
            (Some(sha), Some(spa), Some(tha), Some(tpa)) => Ok(ArpRepr::EthernetIpv4 {
                operation: packet.operation(),
                source_hardware_addr: sha,
                source_protocol_addr: spa,
                target_hardware_addr: tha,
                target_protocol_addr: tpa,
            }),
            _ => Err(WireError::Truncated),
        }
    }

    /// Length of the packet this representation emits.
    pub const fn buffer_len(&self) -> usize {
        match self {
            ArpRepr::EthernetIpv4 { .. } => ETHERNET_IPV4_LEN,
        }
    }

    /// Writes the packet into `buf[..self.buffer_len()]`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`ArpRepr::buffer_len`].
    pub fn emit(&self, buf: &mut [u8]) {
        match *self {
            ArpRepr::EthernetIpv4 {
                operation,
                source_hardware_addr,
                source_protocol_addr,
                target_hardware_addr,
                target_protocol_addr,
            } => {
                let buf = &mut buf[..ETHERNET_IPV4_LEN];
                buf[field::HTYPE].copy_from_slice(&HTYPE_ETHERNET.to_be_bytes());
                buf[field::PTYPE].copy_from_slice(&PTYPE_IPV4.to_be_bytes());
                buf[field::HLEN] = 6;
                buf[field::PLEN] = 4;
                buf[field::OPER].copy_from_slice(&u16::from(operation).to_be_bytes());
                buf[8..14].copy_from_slice(&source_hardware_addr.0);
                buf[14..18].copy_from_slice(&source_protocol_addr.octets());
                buf[18..24].copy_from_slice(&target_hardware_addr.0);
                buf[24..28].copy_from_slice(&target_protocol_addr.octets());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A request "who has 10.77.0.11, tell 10.77.0.12".
    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0x00, 0x00, 0x0c, 10, 77,
        0, 12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 10, 77, 0, 11,
    ];

    #[test]
    fn parse_request() {
        let p = ArpPacket::new_checked(&REQUEST[..]).unwrap();
        let r = ArpRepr::parse(&p).unwrap();
        assert_eq!(
            r,
            ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Request,
                source_hardware_addr: EthernetAddress([0x52, 0x54, 0, 0, 0, 0x0c]),
                source_protocol_addr: Ipv4Addr::new(10, 77, 0, 12),
                target_hardware_addr: EthernetAddress([0; 6]),
                target_protocol_addr: Ipv4Addr::new(10, 77, 0, 11),
            }
        );
        let mut out = [0u8; 28];
        r.emit(&mut out);
        assert_eq!(out, REQUEST);
    }

    #[test]
    fn truncated_at_every_length() {
        for n in 0..REQUEST.len() {
            assert_eq!(
                ArpRepr::parse(&ArpPacket::new_unchecked(&REQUEST[..n])),
                Err(WireError::Truncated),
                "len {n}"
            );
        }
    }

    #[test]
    fn other_types_unsupported() {
        for (i, v) in [(1usize, 6u8), (3, 0xdd), (4, 8), (5, 16)] {
            let mut b = REQUEST.to_vec();
            b.extend_from_slice(&[0; 40]);
            b[i] = v;
            assert_eq!(
                ArpRepr::parse(&ArpPacket::new_unchecked(&b[..])),
                Err(WireError::Unsupported),
                "byte {i}"
            );
        }
    }

    #[test]
    fn padding_ignored() {
        let mut b = REQUEST.to_vec();
        b.extend_from_slice(&[0; 18]);
        assert!(ArpRepr::parse(&ArpPacket::new_unchecked(&b[..])).is_ok());
    }

    proptest! {
        #[test]
        fn emit_parse_identity(
            op in any::<u16>(),
            sha in any::<[u8; 6]>(),
            spa in any::<[u8; 4]>(),
            tha in any::<[u8; 6]>(),
            tpa in any::<[u8; 4]>(),
        ) {
            let r = ArpRepr::EthernetIpv4 {
                operation: ArpOperation::from(op),
                source_hardware_addr: EthernetAddress(sha),
                source_protocol_addr: Ipv4Addr::from(spa),
                target_hardware_addr: EthernetAddress(tha),
                target_protocol_addr: Ipv4Addr::from(tpa),
            };
            let mut buf = [0u8; 28];
            r.emit(&mut buf);
            prop_assert_eq!(ArpRepr::parse(&ArpPacket::new_checked(&buf[..]).unwrap()), Ok(r));
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let p = ArpPacket::new_unchecked(&data[..]);
            match ArpRepr::parse(&p) {
                Ok(r) => prop_assert!(data.len() >= r.buffer_len()),
                Err(e) => prop_assert!(matches!(e, WireError::Truncated | WireError::Unsupported)),
            }
        }
    }
}
