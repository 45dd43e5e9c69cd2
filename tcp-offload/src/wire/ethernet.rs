//! Ethernet II framing (IEEE 802.3 clause 3.2.6, the "DIX" layout) with an
//! optional single IEEE 802.1Q VLAN tag.
//!
//! The first header of every received frame and the last one written on
//! transmit. The frame check sequence is the NIC's business and never
//! appears here; padding of short frames is left to the layers above, whose
//! own length fields say where their data ends.

use core::fmt;

use super::{Result, WireError};

/// A 48-bit MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// The all-ones broadcast address, where ARP requests go.
    pub const BROADCAST: EthernetAddress = EthernetAddress([0xff; 6]);

    /// Reads an address from the first six bytes of `data`, or `None` when
    /// it is shorter.
    pub fn from_bytes(data: &[u8]) -> Option<EthernetAddress> {
        let b: [u8; 6] = data.get(..6)?.try_into().ok()?;
        Some(EthernetAddress(b))
    }

    /// The six octets, first on the wire first.
    pub const fn as_bytes(&self) -> &[u8; 6] {
        &self.0
    }

    /// Whether this is the broadcast address.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Whether the group bit (least significant bit of the first octet) is
    /// set; broadcast is a multicast address too.
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// Whether this names a single station.
    pub const fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// The EtherType field: what the frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtherType {
    /// 0x0800.
    Ipv4,
    /// 0x0806.
    Arp,
    /// 0x8100, an IEEE 802.1Q tag follows.
    Vlan,
    /// 0x86DD. Recognised only so that it can be counted and dropped.
    Ipv6,
    /// Anything else, kept as on the wire.
    Unknown(u16),
}

impl From<u16> for EtherType {
    fn from(v: u16) -> EtherType {
        match v {
            0x0800 => EtherType::Ipv4,
            0x0806 => EtherType::Arp,
            0x8100 => EtherType::Vlan,
            0x86dd => EtherType::Ipv6,
            other => EtherType::Unknown(other),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(v: EtherType) -> u16 {
        match v {
            EtherType::Ipv4 => 0x0800,
            EtherType::Arp => 0x0806,
            EtherType::Vlan => 0x8100,
            EtherType::Ipv6 => 0x86dd,
            EtherType::Unknown(other) => other,
        }
    }
}

mod field {
    use core::ops::Range;

    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const TCI: Range<usize> = 14..16;
    pub const INNER_ETHERTYPE: Range<usize> = 16..18;
}

/// Length of an untagged Ethernet II header.
pub const HEADER_LEN: usize = 14;
/// Length of a header with one 802.1Q tag.
pub const VLAN_HEADER_LEN: usize = 18;

/// A view of an Ethernet II frame (without FCS).
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a buffer without checking it. Accessors may panic until
    /// [`EthernetFrame::check_len`] has succeeded; use `new_checked` on
    /// received data.
    pub const fn new_unchecked(buffer: T) -> EthernetFrame<T> {
        EthernetFrame { buffer }
    }

    /// Wraps a buffer after checking that the header, including a VLAN tag
    /// if the EtherType announces one, fits.
    pub fn new_checked(buffer: T) -> Result<EthernetFrame<T>> {
        let f = EthernetFrame::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Validates the lengths. See [`EthernetFrame::new_checked`].
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if self.ethertype() == EtherType::Vlan && len < VLAN_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination address.
    pub fn dst_addr(&self) -> EthernetAddress {
        let b = &self.buffer.as_ref()[field::DST];
        EthernetAddress([b[0], b[1], b[2], b[3], b[4], b[5]])
    }

    /// Source address.
    pub fn src_addr(&self) -> EthernetAddress {
        let b = &self.buffer.as_ref()[field::SRC];
        EthernetAddress([b[0], b[1], b[2], b[3], b[4], b[5]])
    }

    /// The EtherType field at offset 12, which is [`EtherType::Vlan`] for a
    /// tagged frame.
    pub fn ethertype(&self) -> EtherType {
        let b = &self.buffer.as_ref()[field::ETHERTYPE];
        EtherType::from(u16::from_be_bytes([b[0], b[1]]))
    }

    /// The 802.1Q tag control information (priority, DEI, VLAN id) of a
    /// tagged frame.
    pub fn vlan_tci(&self) -> Option<u16> {
        if self.ethertype() == EtherType::Vlan {
            let b = &self.buffer.as_ref()[field::TCI];
            Some(u16::from_be_bytes([b[0], b[1]]))
        } else {
            None
        }
    }

    /// The EtherType of the payload: the one after the tag when tagged.
    pub fn payload_ethertype(&self) -> EtherType {
        if self.ethertype() == EtherType::Vlan {
            let b = &self.buffer.as_ref()[field::INNER_ETHERTYPE];
            EtherType::from(u16::from_be_bytes([b[0], b[1]]))
        } else {
            self.ethertype()
        }
    }

    /// Header length: 14, or 18 with a VLAN tag.
    pub fn header_len(&self) -> usize {
        if self.ethertype() == EtherType::Vlan {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Everything after the header, Ethernet padding included.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, addr: EthernetAddress) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&addr.0);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, addr: EthernetAddress) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&addr.0);
    }

    /// Sets the EtherType field at offset 12.
    pub fn set_ethertype(&mut self, ty: EtherType) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&u16::from(ty).to_be_bytes());
    }

    /// Everything after the header, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[hl..]
    }
}

/// A validated Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    pub src_addr: EthernetAddress,
    pub dst_addr: EthernetAddress,
    /// The payload's EtherType (the inner one when tagged). Never
    /// [`EtherType::Vlan`] after a parse: double tags are refused.
    pub ethertype: EtherType,
    /// The 802.1Q tag control information, when the frame carries a tag.
    pub vlan: Option<u16>,
}

impl EthernetRepr {
    /// Parses the header of a frame. A second VLAN tag (QinQ) is
    /// [`WireError::Unsupported`].
    pub fn parse<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> Result<EthernetRepr> {
        frame.check_len()?;
        let ethertype = frame.payload_ethertype();
        if frame.vlan_tci().is_some() && ethertype == EtherType::Vlan {
            return Err(WireError::Unsupported);
        }
        Ok(EthernetRepr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            ethertype,
            vlan: frame.vlan_tci(),
        })
    }

    /// Length of the header this representation emits.
    pub const fn header_len(&self) -> usize {
        if self.vlan.is_some() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Length of a frame carrying `payload_len` bytes, before padding to the
    /// 60-byte minimum.
    pub const fn buffer_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len
    }

    /// Writes the header into `buf[..self.header_len()]`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`EthernetRepr::header_len`].
    pub fn emit(&self, buf: &mut [u8]) {
        let buf = &mut buf[..self.header_len()];
        buf[field::DST].copy_from_slice(&self.dst_addr.0);
        buf[field::SRC].copy_from_slice(&self.src_addr.0);
        match self.vlan {
            Some(tci) => {
                buf[field::ETHERTYPE].copy_from_slice(&u16::from(EtherType::Vlan).to_be_bytes());
                buf[field::TCI].copy_from_slice(&tci.to_be_bytes());
                buf[field::INNER_ETHERTYPE]
                    .copy_from_slice(&u16::from(self.ethertype).to_be_bytes());
            }
            None => {
                buf[field::ETHERTYPE].copy_from_slice(&u16::from(self.ethertype).to_be_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ARP_FRAME_HDR: [u8; 14] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x06,
    ];

    #[test]
    fn addresses() {
        let a = EthernetAddress([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
        assert_eq!(a.to_string(), "52:54:00:12:34:56");
        assert!(a.is_unicast() && !a.is_multicast() && !a.is_broadcast());
        assert!(EthernetAddress::BROADCAST.is_broadcast());
        assert!(EthernetAddress::BROADCAST.is_multicast());
        assert!(EthernetAddress([0x01, 0, 0x5e, 0, 0, 1]).is_multicast());
        assert_eq!(EthernetAddress::from_bytes(&[1, 2, 3, 4, 5]), None);
        assert_eq!(
            EthernetAddress::from_bytes(&[1, 2, 3, 4, 5, 6, 7]),
            Some(EthernetAddress([1, 2, 3, 4, 5, 6]))
        );
    }

    #[test]
    fn parse_untagged() {
        let mut bytes = ARP_FRAME_HDR.to_vec();
        bytes.extend_from_slice(&[0xaa; 46]);
        let f = EthernetFrame::new_checked(&bytes[..]).unwrap();
        let r = EthernetRepr::parse(&f).unwrap();
        assert_eq!(r.dst_addr, EthernetAddress::BROADCAST);
        assert_eq!(
            r.src_addr,
            EthernetAddress([0x52, 0x54, 0, 0x12, 0x34, 0x56])
        );
        assert_eq!(r.ethertype, EtherType::Arp);
        assert_eq!(r.vlan, None);
        assert_eq!(f.payload().len(), 46);
        let mut out = [0u8; 14];
        r.emit(&mut out);
        assert_eq!(out, ARP_FRAME_HDR);
    }

    #[test]
    fn parse_tagged() {
        let mut bytes = ARP_FRAME_HDR[..12].to_vec();
        bytes.extend_from_slice(&[0x81, 0x00, 0x20, 0x64, 0x08, 0x00, 0x45]);
        let f = EthernetFrame::new_checked(&bytes[..]).unwrap();
        assert_eq!(f.header_len(), 18);
        assert_eq!(f.payload(), &[0x45]);
        let r = EthernetRepr::parse(&f).unwrap();
        assert_eq!(r.vlan, Some(0x2064));
        assert_eq!(r.ethertype, EtherType::Ipv4);
        let mut out = [0u8; 18];
        r.emit(&mut out);
        assert_eq!(&out[..], &bytes[..18]);
    }

    #[test]
    fn truncated_at_every_length() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                EthernetFrame::new_checked(&ARP_FRAME_HDR[..n]).err(),
                Some(WireError::Truncated),
                "len {n}"
            );
        }
        let mut tagged = ARP_FRAME_HDR;
        tagged[12] = 0x81;
        tagged[13] = 0x00;
        let mut long = tagged.to_vec();
        long.extend_from_slice(&[0, 1, 8]);
        for n in HEADER_LEN..VLAN_HEADER_LEN {
            assert_eq!(
                EthernetFrame::new_checked(&long[..n]).err(),
                Some(WireError::Truncated),
                "len {n}"
            );
        }
    }

    #[test]
    fn double_tag_unsupported() {
        let mut bytes = ARP_FRAME_HDR[..12].to_vec();
        bytes.extend_from_slice(&[0x81, 0x00, 0x00, 0x01, 0x81, 0x00, 0x00, 0x02]);
        let f = EthernetFrame::new_checked(&bytes[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&f), Err(WireError::Unsupported));
    }

    #[test]
    fn setters() {
        let mut buf = [0u8; 20];
        let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
        f.set_dst_addr(EthernetAddress::BROADCAST);
        f.set_src_addr(EthernetAddress([2, 0, 0, 0, 0, 1]));
        f.set_ethertype(EtherType::Ipv4);
        f.payload_mut()[0] = 0x45;
        assert_eq!(f.ethertype(), EtherType::Ipv4);
        assert_eq!(f.src_addr(), EthernetAddress([2, 0, 0, 0, 0, 1]));
        assert_eq!(buf[14], 0x45);
        assert_eq!(&buf[12..14], &[0x08, 0x00]);
    }

    fn arb_repr() -> impl Strategy<Value = EthernetRepr> {
        (
            any::<[u8; 6]>(),
            any::<[u8; 6]>(),
            any::<u16>().prop_filter("inner tag", |t| *t != 0x8100),
            proptest::option::of(any::<u16>()),
        )
            .prop_map(|(s, d, t, vlan)| EthernetRepr {
                src_addr: EthernetAddress(s),
                dst_addr: EthernetAddress(d),
                ethertype: EtherType::from(t),
                vlan,
            })
    }

    proptest! {
        #[test]
        fn emit_parse_identity(r in arb_repr(), extra in 0usize..8) {
            let mut buf = vec![0u8; r.buffer_len(extra)];
            r.emit(&mut buf);
            let f = EthernetFrame::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(f.header_len(), r.header_len());
            prop_assert_eq!(f.payload().len(), extra);
            prop_assert_eq!(EthernetRepr::parse(&f), Ok(r));
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..40)) {
            let f = EthernetFrame::new_unchecked(&data[..]);
            if let Ok(r) = EthernetRepr::parse(&f) {
                prop_assert!(f.payload().len() + r.header_len() == data.len());
            }
            if let Ok(f) = EthernetFrame::new_checked(&data[..]) {
                prop_assert_eq!(f.vlan_tci().is_some(), f.header_len() == VLAN_HEADER_LEN);
                prop_assert_eq!(&f.dst_addr().0[..], &data[..6]);
            } else {
                prop_assert!(data.len() < VLAN_HEADER_LEN);
            }
        }
    }
}
