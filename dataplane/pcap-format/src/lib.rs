//! The classic pcap file format and its writer: the one definition of the
//! format shared by the dataplane's packet capture and the test-support
//! reader.
//!
//! The dataplane's capture ([`Writer`] through its writer thread) writes
//! what each worker sends and receives in this format so that tcpdump and
//! Wireshark read it; the `pcap-kit` test-support crate builds its reader
//! (classic pcap and pcapng) and TCP stream reassembler on the constants
//! and types here. Like the protocol crates it does no I/O and reads no
//! clock: the writer appends to a buffer the caller owns and later writes
//! to a file, and timestamps are values the caller supplies.
//!
//! The format is the classic pcap of the IETF OPSAWG pcap draft: a 24-byte
//! file header whose magic number gives the byte order and the timestamp
//! precision, then records of a 16-byte header and the captured bytes.
#![forbid(unsafe_code)]

use tcp_offload::Instant;

/// Classic pcap magic number of a microsecond file, as read little-endian
/// from its first four bytes when it was written little-endian.
pub const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
/// Classic pcap magic number of a nanosecond file, likewise.
pub const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// [`MAGIC_MICROS`] as read little-endian from a big-endian file.
pub const MAGIC_MICROS_SWAPPED: u32 = MAGIC_MICROS.swap_bytes();
/// [`MAGIC_NANOS`] as read little-endian from a big-endian file.
pub const MAGIC_NANOS_SWAPPED: u32 = MAGIC_NANOS.swap_bytes();
/// Length of the classic pcap file header.
pub const HEADER_LEN: usize = 24;
/// Length of the header before each record's bytes.
pub const RECORD_HEADER_LEN: usize = 16;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A link-layer header type from the tcpdump.org registry, as both
/// formats store it (16 bits in pcapng; the low 16 bits of the classic
/// header's field, whose upper bits say whether frames carry an FCS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkType(pub u16);

impl LinkType {
    /// `LINKTYPE_ETHERNET`: Ethernet II and 802.3 frames without FCS.
    pub const ETHERNET: LinkType = LinkType(1);
    /// `LINKTYPE_RAW`: an IPv4 or IPv6 packet with no link header.
    pub const RAW: LinkType = LinkType(101);
    /// `LINKTYPE_IPV4`: an IPv4 packet with no link header.
    pub const IPV4: LinkType = LinkType(228);
}

/// Timestamp precision of a classic pcap file, which its magic number
/// announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Magic 0xa1b2c3d4: the fraction field counts microseconds.
    Micros,
    /// Magic 0xa1b23c4d: the fraction field counts nanoseconds. The
    /// default, as the dataplane's clock is finer than a microsecond.
    #[default]
    Nanos,
}

// ---------------------------------------------------------------------------
// Writer.

/// The snap length a [`Writer`] made with [`Writer::ethernet`] announces:
/// libpcap's own maximum, larger than any frame the dataplane handles.
pub const DEFAULT_SNAPLEN: u32 = 262_144;

/// Writes classic pcap, little-endian, into a buffer the caller owns and
/// later writes to a file (the dataplane does so off its fast path).
///
/// The writer holds no state besides its settings: the header goes first,
/// then any number of records, into the same buffer or into successive
/// buffers of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writer {
    link_type: LinkType,
    snaplen: u32,
    precision: Precision,
}

impl Writer {
    /// A writer for frames of `link_type`, keeping at most `snaplen` bytes
    /// of each (0 is taken as [`DEFAULT_SNAPLEN`]).
    pub const fn new(link_type: LinkType, snaplen: u32, precision: Precision) -> Writer {
        Writer {
            link_type,
            snaplen: if snaplen == 0 {
                DEFAULT_SNAPLEN
            } else {
                snaplen
            },
            precision,
        }
    }

    /// Whole Ethernet frames with nanosecond timestamps.
    pub const fn ethernet() -> Writer {
        Writer::new(LinkType::ETHERNET, DEFAULT_SNAPLEN, Precision::Nanos)
    }

    /// The snap length records are cut to.
    pub const fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// Appends the 24-byte file header.
    pub fn write_header(&self, out: &mut Vec<u8>) {
        let magic = match self.precision {
            Precision::Micros => MAGIC_MICROS,
            Precision::Nanos => MAGIC_NANOS,
        };
        out.extend_from_slice(&magic.to_le_bytes());
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&4u16.to_le_bytes());
        // Time zone offset and timestamp accuracy: always zero.
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&self.snaplen.to_le_bytes());
        out.extend_from_slice(&u32::from(self.link_type.0).to_le_bytes());
    }

    /// Appends one record holding `frame`, cut to the snap length.
    /// `timestamp_ns` counts from the Unix epoch; seconds past 2106 (the
    /// field's 32 bits) are stored as the last representable second.
    pub fn write_record(&self, out: &mut Vec<u8>, timestamp_ns: u64, frame: &[u8]) {
        self.write_record_parts(out, timestamp_ns, &[frame]);
    }

    /// As [`Writer::write_record`] for a frame held in pieces (a header
    /// built apart from the payload it describes, a chained buffer),
    /// without gathering it first.
    pub fn write_record_parts(&self, out: &mut Vec<u8>, timestamp_ns: u64, parts: &[&[u8]]) {
        let orig: usize = parts.iter().map(|p| p.len()).sum();
        let orig = u32::try_from(orig).unwrap_or(u32::MAX);
        let incl = orig.min(self.snaplen);
        let secs = u32::try_from(timestamp_ns / NANOS_PER_SEC).unwrap_or(u32::MAX);
        let frac = timestamp_ns % NANOS_PER_SEC;
        let frac = match self.precision {
            Precision::Micros => frac / 1000,
            Precision::Nanos => frac,
        };
        out.extend_from_slice(&secs.to_le_bytes());
        // Under a billion: fits.
        out.extend_from_slice(&(frac as u32).to_le_bytes());
        out.extend_from_slice(&incl.to_le_bytes());
        out.extend_from_slice(&orig.to_le_bytes());
        let mut left = incl as usize;
        for p in parts {
            let n = p.len().min(left);
            out.extend_from_slice(&p[..n]);
            left -= n;
        }
    }

    /// As [`Writer::write_record`] with the engine's time type, counted
    /// from whatever epoch the caller's [`Instant`]s use.
    pub fn write_record_at(&self, out: &mut Vec<u8>, now: Instant, frame: &[u8]) {
        self.write_record(out, now.total_micros().saturating_mul(1000), frame);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_header_golden_bytes() {
        let mut out = Vec::new();
        Writer::ethernet().write_header(&mut out);
        assert_eq!(
            out,
            [
                0x4d, 0x3c, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x04, 0x00,
                1, 0, 0, 0
            ]
        );
        let mut out = Vec::new();
        Writer::new(LinkType::RAW, 0, Precision::Micros).write_header(&mut out);
        assert_eq!(&out[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(&out[16..], &[0x00, 0x00, 0x04, 0x00, 101, 0, 0, 0]);
    }

    #[test]
    fn swapped_magics_are_the_big_endian_bytes() {
        assert_eq!(MAGIC_MICROS_SWAPPED, 0xd4c3_b2a1);
        assert_eq!(MAGIC_NANOS_SWAPPED, 0x4d3c_b2a1);
    }
}
