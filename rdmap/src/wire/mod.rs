//! DDP (RFC 5041) and RDMAP (RFC 5040) headers, the Read Request payload
//! and the Terminate message.
//!
//! These are the bytes of one ULPDU, after the MPA deframer has removed the
//! FPDU length, markers, pad and CRC: a DDP header whose second byte is the
//! RDMAP Control Field ([`ddp`]), then for an RDMA Read Request a 28-byte
//! header ([`rdmap`]) and for a Terminate the Terminate header
//! ([`terminate`]). The receive path parses them here and places payload by
//! what they say; the send path emits them in front of payload it never
//! copies.
//!
//! As in `tcp-offload`'s wire layer, each header has a zero-copy view
//! (`…Packet<T: AsRef<[u8]>>`, length checked once by `new_checked`) and a
//! validated `Repr` with `parse` and `emit`. Malformed input never panics;
//! it is a [`WireError`], and every error that a peer can cause maps to the
//! [`TerminateCause`] the receiver reports for it.

pub mod ddp;
pub mod rdmap;
pub mod terminate;

pub use ddp::{DdpPacket, DdpRepr, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
pub use rdmap::{RdmapOpcode, ReadRequest, ReadRequestPacket, READ_REQUEST_LEN};
pub use terminate::{
    TerminateHeader, TerminateLayout, TerminateMessage, TerminateRepr, TerminatedDdpHeader,
};

use crate::error::TerminateCause;

/// Why a DDP segment, RDMAP header or Terminate message was rejected. A
/// small `Copy` enum so that drop and error counters can be indexed by
/// reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireError {
    /// The ULPDU is shorter than the header it announces (DDP header, Read
    /// Request header, or a part of a Terminate header its flags promise).
    Truncated,
    /// The DDP Control Field's version (DV) is not 1. `tagged` is the T
    /// flag as received, which picks the tagged or untagged error code.
    DdpVersion {
        /// T flag of the offending segment.
        tagged: bool,
        /// The version received.
        version: u8,
    },
    /// The RDMAP Control Field's version (RV) is not 1.
    RdmapVersion(u8),
    /// An opcode outside RFC 5040's eight (0x8–0xF, which includes the
    /// RFC 7306 extensions this implementation does not support).
    UnknownOpcode(u8),
    /// A known opcode in the wrong DDP buffer model: an RDMA Write or Read
    /// Response without the T flag, or any other message with it.
    WrongBufferModel(RdmapOpcode),
    /// An untagged segment for a queue number RDMAP does not define (not 0,
    /// 1 or 2).
    InvalidQueueNumber(u32),
    /// An untagged opcode on one of RDMAP's queues, but not its own (a Send
    /// on queue 1, a Read Request on queue 0, …).
    WrongQueueNumber {
        /// The opcode received.
        opcode: RdmapOpcode,
        /// The queue number it came on.
        qn: u32,
    },
    /// A Terminate Control field whose Layer is not 0, 1 or 2 in either of
    /// the layouts a receiver accepts ([`TerminateLayout`]).
    TerminateLayer,
    /// [`TerminateMessage::parse`] was given a valid ULPDU of another
    /// message.
    NotTerminate(RdmapOpcode),
}

impl WireError {
    /// The Terminate cause a receiver reports for a segment rejected with
    /// this error (RFC 5040 §4.8, RFC 5041 §7.2), or `None` for errors
    /// that are no fault of the segment's sender.
    ///
    /// `Truncated` has no dedicated code in either RFC; it is reported as a
    /// catastrophic error localized to the stream, since framing that
    /// disagrees with its own contents leaves nothing to trust in what
    /// follows. `TerminateLayer` (and any error in a received Terminate)
    /// maps to `None`: the peer has already given up on the stream, so
    /// there is nobody to tell.
    pub const fn terminate_cause(self) -> Option<TerminateCause> {
        Some(match self {
            WireError::Truncated => TerminateCause::RDMAP_OP_CATASTROPHIC_STREAM,
            WireError::DdpVersion { tagged: true, .. } => {
                TerminateCause::DDP_TAGGED_INVALID_VERSION
            }
            WireError::DdpVersion { tagged: false, .. } => {
                TerminateCause::DDP_UNTAGGED_INVALID_VERSION
            }
            WireError::RdmapVersion(_) => TerminateCause::RDMAP_OP_INVALID_VERSION,
            WireError::UnknownOpcode(_)
            | WireError::WrongBufferModel(_)
            | WireError::WrongQueueNumber { .. } => TerminateCause::RDMAP_OP_UNEXPECTED_OPCODE,
            WireError::InvalidQueueNumber(_) => TerminateCause::DDP_UNTAGGED_INVALID_QN,
            WireError::TerminateLayer | WireError::NotTerminate(_) => return None,
        })
    }
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WireError::Truncated => f.write_str("truncated"),
            WireError::DdpVersion { tagged, version } => write!(
                f,
                "DDP version {version} in a{} segment",
                if *tagged { " tagged" } else { "n untagged" }
            ),
            WireError::RdmapVersion(v) => write!(f, "RDMAP version {v}"),
            WireError::UnknownOpcode(op) => write!(f, "unknown RDMAP opcode {op:#x}"),
            WireError::WrongBufferModel(op) => {
                write!(f, "{op:?} in the wrong DDP buffer model")
            }
            WireError::InvalidQueueNumber(qn) => write!(f, "invalid DDP queue number {qn}"),
            WireError::WrongQueueNumber { opcode, qn } => {
                write!(f, "{opcode:?} on DDP queue {qn}")
            }
            WireError::TerminateLayer => f.write_str("Terminate with an undefined layer"),
            WireError::NotTerminate(op) => write!(f, "{op:?} where a Terminate was expected"),
        }
    }
}

impl std::error::Error for WireError {}

/// Result of a parse in this module.
pub type Result<T> = core::result::Result<T, WireError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_terminate_causes() {
        use TerminateCause as C;
        let cases = [
            (WireError::Truncated, Some(C::RDMAP_OP_CATASTROPHIC_STREAM)),
            (
                WireError::DdpVersion {
                    tagged: true,
                    version: 2,
                },
                Some(C::DDP_TAGGED_INVALID_VERSION),
            ),
            (
                WireError::DdpVersion {
                    tagged: false,
                    version: 0,
                },
                Some(C::DDP_UNTAGGED_INVALID_VERSION),
            ),
            (
                WireError::RdmapVersion(0),
                Some(C::RDMAP_OP_INVALID_VERSION),
            ),
            (
                WireError::UnknownOpcode(0xA),
                Some(C::RDMAP_OP_UNEXPECTED_OPCODE),
            ),
            (
                WireError::WrongBufferModel(RdmapOpcode::Send),
                Some(C::RDMAP_OP_UNEXPECTED_OPCODE),
            ),
            (
                WireError::WrongQueueNumber {
                    opcode: RdmapOpcode::Send,
                    qn: 1,
                },
                Some(C::RDMAP_OP_UNEXPECTED_OPCODE),
            ),
            (
                WireError::InvalidQueueNumber(7),
                Some(C::DDP_UNTAGGED_INVALID_QN),
            ),
            (WireError::TerminateLayer, None),
            (WireError::NotTerminate(RdmapOpcode::Send), None),
        ];
        for (e, c) in cases {
            assert_eq!(e.terminate_cause(), c, "{e}");
        }
    }
}
