//! MPA markers (RFC 5044 §5 and §6): where they go and what they hold.
//!
//! When a receiver asked for them (the M flag of its MPA frame), its peer
//! inserts a 4-byte marker at every 512th octet of the TCP stream, counted
//! from the first octet after the MPA frames in that direction: the first
//! marker sits right before the first FPDU (RFC 5044 §6.1), then one every
//! 512 octets, markers included. The framer ([`super::fpdu`]) inserts them
//! and the deframer ([`super::deframe`]) removes them; both track the
//! stream position as a `u32` offset from that first octet, which may wrap
//! (2^32 is a multiple of 512).
//!
//! A marker is 16 reserved bits (zero on transmit, ignored on receipt but
//! covered by the CRC) and the 16-bit FPDUPTR: how many octets back from
//! the marker the ULPDU length field of the FPDU it sits in starts. Two
//! conventions meet here:
//!
//! - A marker that falls exactly where an FPDU starts belongs to that FPDU
//!   (it is its first four octets, covered by its CRC) and has FPDUPTR 0 —
//!   RFC 5044 §6.1 says so of the very first marker, and irdma's receive
//!   path insists on four zero octets there.
//! - Any other marker points back to the length field, as RFC 5044 §5
//!   defines FPDUPTR. In an FPDU that started with a marker, the length
//!   field sits four octets after the FPDU's start; some implementations
//!   may count from the FPDU's start instead, so the deframer accepts both,
//!   and the framer sends the RFC's value.
//!
//! Markers are part of the FPDU they fall in and covered by its CRC when
//! they precede the CRC field (RFC 5044 §5: the reserved field is "ignored
//! on receive (except for CRC calculation)"); Wireshark's MPA dissector
//! computes the CRC the same way.

/// Distance between markers in the TCP stream, markers included.
pub const MARKER_INTERVAL: u32 = 512;
/// Length of a marker.
pub const MARKER_LEN: usize = 4;

/// The bytes of a marker with the given FPDUPTR (reserved field zero).
pub const fn marker_bytes(fpduptr: u16) -> [u8; MARKER_LEN] {
    let p = fpduptr.to_be_bytes();
    [0, 0, p[0], p[1]]
}

/// The FPDUPTR of a received marker, with its low two bits cleared as RFC
/// 5044 §5 tells receivers to.
pub const fn marker_fpduptr(bytes: [u8; MARKER_LEN]) -> u16 {
    u16::from_be_bytes([bytes[2], bytes[3]]) & !3
}

/// Octets from stream position `pos` to the next marker position: 0 if a
/// marker starts at `pos`.
pub const fn distance_to_marker(pos: u32) -> u32 {
    (MARKER_INTERVAL - pos % MARKER_INTERVAL) % MARKER_INTERVAL
}

/// How many marker positions fall in the `len` octets starting at `pos`.
pub const fn markers_in(pos: u32, len: u32) -> u32 {
    let first = distance_to_marker(pos);
    if first >= len {
        0
    } else {
        1 + (len - 1 - first) / MARKER_INTERVAL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions() {
        assert_eq!(distance_to_marker(0), 0);
        assert_eq!(distance_to_marker(1), 511);
        assert_eq!(distance_to_marker(512), 0);
        assert_eq!(distance_to_marker(u32::MAX), 1);
        assert_eq!(markers_in(0, 0), 0);
        assert_eq!(markers_in(0, 1), 1);
        assert_eq!(markers_in(0, 512), 1);
        assert_eq!(markers_in(0, 513), 2);
        assert_eq!(markers_in(4, 508), 0);
        assert_eq!(markers_in(4, 509), 1);
        assert_eq!(markers_in(u32::MAX - 3, 8), 1);
    }

    #[test]
    fn bytes() {
        assert_eq!(marker_bytes(0x1fc), [0, 0, 0x01, 0xfc]);
        assert_eq!(marker_fpduptr([0xff, 0xff, 0x01, 0xff]), 0x1fc);
    }
}
