//! Wire formats: zero-copy views over bytes and validated representations.
//!
//! Each header has two levels, as in smoltcp: a `…Packet<T: AsRef<[u8]>>`
//! view whose `new_checked` validates lengths once so that no accessor can
//! panic afterwards, and a `…Repr` holding the validated meaning with
//! `parse` and `emit`. Malformed input is rejected with a [`WireError`],
//! never a panic.

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod icmp;
pub mod ipv4;
pub mod tcp;

pub use arp::{ArpOperation, ArpPacket, ArpRepr};
pub use ethernet::{EtherType, EthernetAddress, EthernetFrame, EthernetRepr};
pub use icmp::{Icmpv4Packet, Icmpv4Repr};
pub use ipv4::{IpProtocol, Ipv4Packet, Ipv4Repr};
pub use tcp::{SackBlocks, TcpFlags, TcpOptions, TcpPacket, TcpRepr, TcpTimestamp};

/// Why a frame or header was rejected. One small `Copy` enum for the whole
/// wire layer, so that drop counters can be indexed by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireError {
    /// The buffer is shorter than the fixed header or than a length field
    /// says it is.
    Truncated,
    /// A length field is impossible (an IPv4 IHL under 5, a TCP data offset
    /// under 5, a total length shorter than the header, …).
    BadLength,
    /// A header or pseudo-header checksum does not verify.
    BadChecksum,
    /// A TCP option has a length that is too short, too long, or runs past
    /// the header.
    BadOption,
    /// A version field other than the one this parser handles.
    BadVersion,
    /// An IPv4 fragment. The engine refuses fragments: iWARP peers set DF
    /// and size their segments to the path MTU.
    Fragmented,
    /// A well-formed header of a kind this stack does not handle (another
    /// EtherType, ARP for another hardware type, an ICMP type other than
    /// echo).
    Unsupported,
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            WireError::Truncated => "truncated",
            WireError::BadLength => "bad length field",
            WireError::BadChecksum => "bad checksum",
            WireError::BadOption => "bad option",
            WireError::BadVersion => "bad version",
            WireError::Fragmented => "fragmented",
            WireError::Unsupported => "unsupported",
        };
        f.write_str(s)
    }
}

impl std::error::Error for WireError {}

/// Result of a wire-layer parse.
pub type Result<T> = core::result::Result<T, WireError>;

/// Whether `parse` verifies checksums. The dataplane skips verification
/// when the NIC has already flagged the checksum good; everything else
/// verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Checksum {
    /// Verify on parse; compute on emit.
    #[default]
    Verify,
    /// Trust the checksum on parse (the NIC checked it); still compute on
    /// emit.
    Trusted,
}
