//! siw's Terminates as captured, and how their layout is told apart from
//! the RFC's.
//!
//! Linux siw 6.1 sends the Terminate Control word as a little-endian
//! bitfield: byte 0 = EType << 4 | Layer, M/D/R in the low bits of byte 2.
//! Both messages below are whole FPDUs from host-probe.pcap.

use rdmap::error::{Layer, TerminateCause};
use rdmap::wire::{
    DdpRepr, RdmapOpcode, TerminateHeader, TerminateLayout, TerminateMessage, TerminateRepr,
    TerminatedDdpHeader, WireError,
};

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert_eq!(digits.len() & 1, 0, "odd hex length");
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

/// host-probe.pcap frame 222: siw's answer to an FPDU whose CRC the client
/// stored big-endian. CRC was negotiated, so the trailer is a real CRC.
/// siw means LLP (2) / MPA (0) / CRC error (0x02); no headers.
const SIW_BAD_CRC: &str = "0016 \
    41 47 00000000 00000002 00000001 00000000 \
    02 02 00 00 \
    75d367ed";

/// host-probe.pcap frame 271: siw's answer to a Read Response running past
/// the sink region. DDP (1) / tagged buffer (1) / base or bounds (0x01),
/// siw's M+D (0x03), DDP Segment Length 0x5a0 = 1440 (siw reports the
/// payload length of the 1454-byte ULPDU of frame 267), then that
/// segment's tagged header. CRC off, so the trailer is zero.
const SIW_BASE_BOUNDS: &str = "0026 \
    41 47 00000000 00000002 00000001 00000000 \
    11 01 03 00 \
    05a0 \
    81 42 be285d00 00007f33f4003f30 \
    00000000";

/// host-probe.pcap frame 267, the offending Read Response's header.
const OFFENDING_READ_RESPONSE: &str = "81 42 be285d00 00007f33f4003f30";

fn ulpdu(fpdu: &[u8]) -> &[u8] {
    let len = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
    &fpdu[2..2 + len]
}

#[test]
fn bad_crc_terminate() {
    let fpdu = hex(SIW_BAD_CRC);
    let u = ulpdu(&fpdu);
    assert_eq!(u.len(), 22);
    let (ddp, hl) = DdpRepr::parse_ulpdu(u).unwrap();
    assert_eq!(ddp, DdpRepr::untagged(RdmapOpcode::Terminate, true, 1, 0));
    let view = TerminateHeader::new_checked(&u[hl..]).unwrap();
    assert_eq!(view.control(), [0x02, 0x02, 0x00, 0x00]);
    assert_eq!(view.layout(), Ok(TerminateLayout::SiwSwapped));

    let (msg, layout) = TerminateMessage::parse(u).unwrap();
    assert_eq!(layout, TerminateLayout::SiwSwapped);
    assert_eq!(msg.msn, 1);
    assert_eq!(msg.header, TerminateRepr::bare(TerminateCause::MPA_CRC));

    // Read as the RFC lays it out, the same bytes are RDMAP / remote
    // operation / 0x02: a triple no RFC defines, which is what gives the
    // layout away.
    let rfc = TerminateRepr::parse_as(&u[hl..], TerminateLayout::Rfc).unwrap();
    assert_eq!(rfc.cause, TerminateCause::new(Layer::Rdmap, 2, 0x02),);
    assert!(!rfc.cause.is_defined());
}

#[test]
fn base_bounds_terminate() {
    let fpdu = hex(SIW_BASE_BOUNDS);
    let u = ulpdu(&fpdu);
    assert_eq!(u.len(), 38);
    let (msg, layout) = TerminateMessage::parse(u).unwrap();
    assert_eq!(layout, TerminateLayout::SiwSwapped);
    let offending = hex(OFFENDING_READ_RESPONSE);
    let mut hdr = [0u8; 14];
    hdr.copy_from_slice(&offending);
    assert_eq!(
        msg.header,
        TerminateRepr {
            cause: TerminateCause::DDP_TAGGED_BASE_BOUNDS,
            segment_length: Some(1440),
            ddp_header: Some(TerminatedDdpHeader::Tagged(hdr)),
            rdma_header: None,
        }
    );
    assert_eq!(
        msg.header.ddp_header.unwrap().parse(),
        Ok(DdpRepr::tagged(
            RdmapOpcode::ReadResponse,
            false,
            0xbe28_5d00,
            0x7f33_f400_3f30
        ))
    );
    // In the RFC layout byte 2 = 0x03 has no flag set, so the reading
    // stops after the control word, with the same triple (equal nibbles).
    let rfc = TerminateRepr::parse_as(&u[18..], TerminateLayout::Rfc).unwrap();
    assert_eq!(
        rfc,
        TerminateRepr::bare(TerminateCause::DDP_TAGGED_BASE_BOUNDS)
    );
}

#[test]
fn we_answer_the_same_fault_in_the_rfc_layout() {
    // What we send for siw's second fault: the same triple, M and D in the
    // RFC's bit positions, and the ULPDU length (14 + 1440) as the DDP
    // Segment Length.
    let mut offending = hex(OFFENDING_READ_RESPONSE);
    offending.resize(1454, 0);
    let msg = TerminateMessage {
        msn: 1,
        header: TerminateRepr::for_segment(
            TerminateCause::DDP_TAGGED_BASE_BOUNDS,
            Some(&offending),
        ),
    };
    let mut buf = [0u8; 38];
    assert_eq!(msg.emit(&mut buf), 38);
    assert_eq!(
        buf.to_vec(),
        hex("41 47 00000000 00000002 00000001 00000000 \
             11 01 c0 00 \
             05ae \
             81 42 be285d00 00007f33f4003f30")
    );
    // And what we send for a CRC error differs from siw's in byte 0 only.
    let msg = TerminateMessage {
        msn: 1,
        header: TerminateRepr::bare(TerminateCause::MPA_CRC),
    };
    let mut buf = [0u8; 22];
    msg.emit(&mut buf);
    assert_eq!(&buf[18..], &[0x20, 0x02, 0x00, 0x00]);
    assert_eq!(
        TerminateMessage::parse(&buf),
        Ok((msg, TerminateLayout::Rfc))
    );
}

#[test]
fn siw_read_request_protection_error_with_rdma_header() {
    // siw's form for a protection error on an inbound RDMA Read Request:
    // RDMAP (0) / remote protection (1) nibble-swapped = 0x10, M+D+R =
    // 0x07, then length, the Read Request's DDP header and its 28 bytes.
    let bytes = hex("10 02 07 00 \
         001c \
         41 41 00000000 00000001 00000001 00000000 \
         2b9d4f00 00005557c0ebedc0 00000064 f52e2400 0000564378b75460");
    let (r, layout) = TerminateRepr::parse(&bytes).unwrap();
    assert_eq!(layout, TerminateLayout::SiwSwapped);
    assert_eq!(r.cause, TerminateCause::RDMAP_PROT_ACCESS_RIGHTS);
    assert_eq!(r.segment_length, Some(0x1c));
    assert_eq!(r.rdma_header.map(|rr| rr.source_stag), Some(0xf52e_2400));
    // siw sets R for Send-type messages too while including only their DDP
    // header; accepted in its layout, an error in the RFC's.
    let send = hex("10 09 07 00 \
         0010 \
         41 44 0f28aa00 00000000 00000003 00000000");
    let (r, _) = TerminateRepr::parse(&send).unwrap();
    assert_eq!(r.cause, TerminateCause::RDMAP_PROT_CANNOT_INVALIDATE);
    assert!(r.ddp_header.is_some() && r.rdma_header.is_none());
    let mut rfc = send.clone();
    rfc[0] = 0x01;
    rfc[2] = 0xE0;
    assert_eq!(TerminateRepr::parse(&rfc), Err(WireError::Truncated));
}
