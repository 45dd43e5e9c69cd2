//! The ready-to-receive (RTR) messages of peer-to-peer start-up
//! (RFC 6581 §4): building them (initiator) and recognising them
//! (responder).
//!
//! In peer-to-peer mode the initiator's first FPDU is a zero-length
//! message of the kind the MPA reply chose: a Send (untagged, queue 0), an
//! RDMA Write (tagged) or an RDMA Read Request (untagged, queue 1) for zero
//! bytes. It tells the responder that the initiator is in RTS, so the
//! responder may start sending; a Read RTR also makes the responder answer
//! with a zero-length Read Response. The RTR is an ordinary DDP message:
//! it takes MSN 1 on its queue, so the application's first Send (after a
//! Send RTR) or first Read Request (after a Read RTR) carries MSN 2.
//!
//! Division of work with the QP engine: the engine frames the ULPDUs built
//! here like any other (see [`super::fpdu::Framer`]), and on the responder
//! side passes the first ULPDU it deframes to [`recognize_rtr`]; it must
//! not complete a receive for a Send RTR nor place anything for a Write
//! RTR, and for a Read RTR it sends [`read_response_ulpdu`] for the sink
//! STag and TO found by [`read_rtr_sink`]. On the initiator side it passes
//! the zero-length Read Response that answers a Read RTR to
//! [`is_rtr_read_response`] and drops it.
//!
//! The headers are built and read with [`crate::wire`] (RFC 5041 §4,
//! RFC 5040 §4).

use super::frame::RtrType;
use crate::wire::{
    DdpRepr, RdmapOpcode, ReadRequest, READ_REQUEST_LEN, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN,
};

/// The sink STag of our Write and Read RTRs. It must be non-zero (hardware
/// may treat STag 0 as special); siw uses 1 in its own RTR, and peers have
/// interoperated with that for years, so we do the same. It names no
/// region: a zero-length message places nothing.
pub const RTR_STAG: u32 = 1;

/// Longest RTR: an untagged header and a Read Request header.
const MAX_RTR_LEN: usize = UNTAGGED_HEADER_LEN + READ_REQUEST_LEN;

/// A built RTR ULPDU (no allocation: at most 46 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrUlpdu {
    bytes: [u8; MAX_RTR_LEN],
    len: usize,
}

impl RtrUlpdu {
    /// The ULPDU bytes, to be framed as an FPDU.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The Read Request of a Read RTR: zero bytes into [`RTR_STAG`] at TO 0,
/// from source STag 0 at TO 0.
const READ_RTR: ReadRequest = ReadRequest {
    sink_stag: RTR_STAG,
    sink_to: 0,
    size: 0,
    source_stag: 0,
    source_to: 0,
};

/// The initiator's RTR of kind `rtr`: a zero-length Send on queue 0 with
/// MSN 1; a zero-length last Write to [`RTR_STAG`] at TO 0; or a Read
/// Request on queue 1 with MSN 1 for zero bytes (see `READ_RTR`).
pub fn rtr_ulpdu(rtr: RtrType) -> RtrUlpdu {
    let mut bytes = [0u8; MAX_RTR_LEN];
    let header = match rtr {
        RtrType::Send => DdpRepr::untagged(RdmapOpcode::Send, true, 1, 0),
        RtrType::Write => DdpRepr::tagged(RdmapOpcode::RdmaWrite, true, RTR_STAG, 0),
        RtrType::Read => DdpRepr::untagged(RdmapOpcode::ReadRequest, true, 1, 0),
    };
    header.emit(&mut bytes);
    let mut len = header.header_len();
    if rtr == RtrType::Read {
        READ_RTR.emit(&mut bytes[len..]);
        len += READ_REQUEST_LEN;
    }
    RtrUlpdu { bytes, len }
}

/// The initiator's nudge (see [`crate::engine`], "Waking a responder"):
/// the same bytes as a Write RTR, a zero-length last RDMA Write to
/// [`RTR_STAG`] at TO 0. Sent after the stream is up, it is an ordinary
/// zero-length Write: the Data Sink places nothing and completes nothing
/// (no STag is resolved for zero bytes; siw's receive path returns early
/// for it as well), so any peer may take it at any time.
pub fn nudge_ulpdu() -> RtrUlpdu {
    rtr_ulpdu(RtrType::Write)
}

/// Responder: whether a ULPDU is a zero-length RTR, and which kind. Only
/// the exact forms count: a last untagged Send on queue 0 with MSN 1, MO 0
/// and no payload; a last tagged Write with no payload (any STag and TO);
/// a last untagged Read Request on queue 1 with MSN 1, MO 0 and size 0.
pub fn recognize_rtr(ulpdu: &[u8]) -> Option<RtrType> {
    let (header, len) = DdpRepr::parse_ulpdu(ulpdu).ok()?;
    let rest = ulpdu.get(len..)?;
    match header {
        DdpRepr::Tagged {
            opcode: RdmapOpcode::RdmaWrite,
            last: true,
            ..
        } if rest.is_empty() => Some(RtrType::Write),
        DdpRepr::Untagged {
            opcode: RdmapOpcode::Send,
            last: true,
            msn: 1,
            mo: 0,
            ..
        } if rest.is_empty() => Some(RtrType::Send),
        DdpRepr::Untagged {
            opcode: RdmapOpcode::ReadRequest,
            last: true,
            msn: 1,
            mo: 0,
            ..
        } if rest.len() == READ_REQUEST_LEN => {
            let rr = ReadRequest::parse_bytes(rest).ok()?;
            (rr.size == 0).then_some(RtrType::Read)
        }
        _ => None,
    }
}

/// Responder: the sink STag and sink TO of a Read RTR, for its Read
/// Response.
pub fn read_rtr_sink(ulpdu: &[u8]) -> Option<(u32, u64)> {
    if recognize_rtr(ulpdu) != Some(RtrType::Read) {
        return None;
    }
    let rr = ReadRequest::parse_bytes(ulpdu.get(UNTAGGED_HEADER_LEN..)?).ok()?;
    Some((rr.sink_stag, rr.sink_to))
}

/// Responder: the zero-length Read Response that answers a Read RTR.
pub fn read_response_ulpdu(sink_stag: u32, sink_to: u64) -> [u8; TAGGED_HEADER_LEN] {
    let mut b = [0u8; TAGGED_HEADER_LEN];
    DdpRepr::tagged(RdmapOpcode::ReadResponse, true, sink_stag, sink_to).emit(&mut b);
    b
}

/// Initiator: whether a ULPDU is the zero-length Read Response answering
/// our Read RTR (tagged, last, no payload, to [`RTR_STAG`] at TO 0).
pub fn is_rtr_read_response(ulpdu: &[u8]) -> bool {
    ulpdu.len() == TAGGED_HEADER_LEN
        && DdpRepr::parse_ulpdu(ulpdu).ok().map(|(h, _)| h)
            == Some(DdpRepr::tagged(
                RdmapOpcode::ReadResponse,
                true,
                RTR_STAG,
                0,
            ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rtr_is_recognised() {
        for rtr in [RtrType::Send, RtrType::Write, RtrType::Read] {
            let u = rtr_ulpdu(rtr);
            assert_eq!(recognize_rtr(u.as_bytes()), Some(rtr));
        }
        assert_eq!(rtr_ulpdu(RtrType::Send).as_bytes().len(), 18);
        assert_eq!(rtr_ulpdu(RtrType::Write).as_bytes().len(), 14);
        assert_eq!(rtr_ulpdu(RtrType::Read).as_bytes().len(), 46);
    }

    #[test]
    fn golden_nudge() {
        // DDP control: tagged, last, version 1 (0xc1); RDMAP: version 1,
        // RDMA Write (0x40); STag 1; TO 0.
        assert_eq!(
            nudge_ulpdu().as_bytes(),
            [0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn read_rtr_round_trip() {
        let u = rtr_ulpdu(RtrType::Read);
        let (stag, to) = read_rtr_sink(u.as_bytes()).unwrap();
        assert_eq!((stag, to), (RTR_STAG, 0));
        let resp = read_response_ulpdu(stag, to);
        assert!(is_rtr_read_response(&resp));
        assert_eq!(resp, [0xc1, 0x42, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn golden_siw_probe_read_rtr() {
        // host-probe.pcap frame 146: the probe's Read RTR (ULPDU of the
        // 52-byte FPDU, all STags and TOs zero) is recognised too.
        let mut u = [0u8; 46];
        u[..18].copy_from_slice(&[0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(recognize_rtr(&u), Some(RtrType::Read));
        assert_eq!(read_rtr_sink(&u), Some((0, 0)));
    }

    #[test]
    fn non_rtr_messages_are_not_rtrs() {
        // A Send with payload, a non-last Write, a Read Request for bytes.
        let mut send = [0u8; 20];
        send[..18].copy_from_slice(rtr_ulpdu(RtrType::Send).as_bytes());
        assert_eq!(recognize_rtr(&send), None);
        let mut w = [0u8; 14];
        w.copy_from_slice(rtr_ulpdu(RtrType::Write).as_bytes());
        w[0] = 0x81;
        assert_eq!(recognize_rtr(&w), None);
        let mut r = [0u8; 46];
        r.copy_from_slice(rtr_ulpdu(RtrType::Read).as_bytes());
        r[18 + 15] = 1;
        assert_eq!(recognize_rtr(&r), None);
        assert_eq!(recognize_rtr(&[]), None);
        assert_eq!(recognize_rtr(&[0x41]), None);
    }
}
