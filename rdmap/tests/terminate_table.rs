//! Golden Terminate bytes for every row of the cause table.
//!
//! For each (layer, etype, ecode) that RFC 5040, 5041, 5044 and 6581
//! define, the Terminate ULPDU we send for it is written out below by hand
//! from the RFC 5040 §4.8 layout, with the parts the cause calls for
//! (M/D for an offending segment, R for an RDMA Read Request), and checked
//! against `emit`; the bytes must also parse back to the same message.
//!
//! Every ULPDU starts with the Terminate's untagged DDP header:
//! `41` (L, DV 1) `47` (RV 1, opcode 7), four zero bytes, QN 2, MSN 1,
//! MO 0. Then byte 0 = Layer << 4 | EType, byte 1 = Error Code, byte 2 =
//! M 0x80 | D 0x40 | R 0x20, byte 3 = 0, and the included parts.

use rdmap::error::{Layer, TerminateCause as C, ALL};
use rdmap::wire::{
    TerminateLayout, TerminateMessage, TerminateRepr, TerminatedDdpHeader, WireError,
};

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert_eq!(digits.len() & 1, 0, "odd hex length");
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

/// The Terminate message's own DDP header, MSN 1.
macro_rules! term {
    ($($part:expr),* $(,)?) => {
        concat!("41 47 00000000 00000002 00000001 00000000 ", $($part, " "),*)
    };
}

// Offending segment headers (the parts a Terminate includes).

/// rping's RDMA Read Request (rping.pcap frame 29): untagged, QN 1, MSN 1.
macro_rules! rr_ddp {
    () => {
        "41 41 00000000 00000001 00000001 00000000"
    };
}
/// Its 28-byte RDMA Read Request header.
macro_rules! rr_rdma {
    () => {
        "2b9d4f00 00005557c0ebedc0 00000064 f52e2400 0000564378b75460"
    };
}
/// A Send with Invalidate of STag 0x0f28aa00, MSN 3.
macro_rules! send_inv {
    () => {
        "41 44 0f28aa00 00000000 00000003 00000000"
    };
}
/// A Send with RV = 2.
macro_rules! send_rv2 {
    () => {
        "41 83 00000000 00000000 00000002 00000000"
    };
}
/// An untagged opcode 0xA (RFC 7306's Atomic Request, unsupported).
macro_rules! op_a {
    () => {
        "41 4a 00000000 00000000 00000004 00000000"
    };
}
/// rping's first Send (rping.pcap frame 28): QN 0, MSN 1.
macro_rules! send {
    () => {
        "41 43 00000000 00000000 00000001 00000000"
    };
}
/// A Send on queue 5.
macro_rules! send_qn5 {
    () => {
        "41 43 00000000 00000005 00000001 00000000"
    };
}
/// A Send with MSN 16.
macro_rules! send_msn16 {
    () => {
        "41 43 00000000 00000000 00000010 00000000"
    };
}
/// A Send segment at MO 4096.
macro_rules! send_mo4k {
    () => {
        "41 43 00000000 00000000 00000001 00001000"
    };
}
/// ib_write_bw's first RDMA Write segment (write_bw.pcap frame 51).
macro_rules! write {
    () => {
        "81 40 2e11bf00 00007ff39f764000"
    };
}

/// A ULPDU: header bytes, then `payload` zero bytes.
fn segment(header: &str, payload: usize) -> Vec<u8> {
    let mut v = hex(header);
    v.resize(v.len() + payload, 0);
    v
}

struct Row {
    cause: C,
    /// The offending ULPDU, if the cause reports one.
    offending: Option<Vec<u8>>,
    golden: &'static str,
}

fn rows() -> Vec<Row> {
    let rr = || {
        let mut v = hex(rr_ddp!());
        v.extend(hex(rr_rdma!()));
        Some(v)
    };
    let untagged = |h: &str| Some(segment(h, 16)); // ULPDU 34 = 0x22
    let write = || Some(segment(write!(), 1428)); // ULPDU 1442 = 0x05a2
    vec![
        // ---- RDMAP ----
        Row {
            cause: C::RDMAP_LOCAL_CATASTROPHIC,
            offending: None,
            golden: term!("00 00 00 00"),
        },
        Row {
            cause: C::RDMAP_PROT_INVALID_STAG,
            offending: rr(),
            golden: term!("01 00 e0 00", "002e", rr_ddp!(), rr_rdma!()),
        },
        Row {
            cause: C::RDMAP_PROT_BASE_BOUNDS,
            offending: rr(),
            golden: term!("01 01 e0 00", "002e", rr_ddp!(), rr_rdma!()),
        },
        Row {
            cause: C::RDMAP_PROT_ACCESS_RIGHTS,
            offending: rr(),
            golden: term!("01 02 e0 00", "002e", rr_ddp!(), rr_rdma!()),
        },
        Row {
            cause: C::RDMAP_PROT_STAG_NOT_ASSOCIATED,
            offending: rr(),
            golden: term!("01 03 e0 00", "002e", rr_ddp!(), rr_rdma!()),
        },
        Row {
            cause: C::RDMAP_PROT_TO_WRAP,
            offending: rr(),
            golden: term!("01 04 e0 00", "002e", rr_ddp!(), rr_rdma!()),
        },
        Row {
            cause: C::RDMAP_PROT_CANNOT_INVALIDATE,
            offending: untagged(send_inv!()),
            golden: term!("01 09 c0 00", "0022", send_inv!()),
        },
        Row {
            cause: C::RDMAP_PROT_UNSPECIFIED,
            offending: rr(),
            golden: term!("01 ff e0 00", "002e", rr_ddp!(), rr_rdma!()),
        },
        Row {
            cause: C::RDMAP_OP_INVALID_VERSION,
            offending: untagged(send_rv2!()),
            golden: term!("02 05 c0 00", "0022", send_rv2!()),
        },
        Row {
            cause: C::RDMAP_OP_UNEXPECTED_OPCODE,
            offending: untagged(op_a!()),
            golden: term!("02 06 c0 00", "0022", op_a!()),
        },
        Row {
            // A Read Request cut short after 30 bytes: M and D, no R.
            cause: C::RDMAP_OP_CATASTROPHIC_STREAM,
            offending: rr().map(|mut v| {
                v.truncate(30);
                v
            }),
            golden: term!("02 07 c0 00", "001e", rr_ddp!()),
        },
        Row {
            cause: C::RDMAP_OP_CATASTROPHIC_GLOBAL,
            offending: None,
            golden: term!("02 08 00 00"),
        },
        Row {
            cause: C::RDMAP_OP_CANNOT_INVALIDATE,
            offending: untagged(send_inv!()),
            golden: term!("02 09 c0 00", "0022", send_inv!()),
        },
        Row {
            cause: C::RDMAP_OP_UNSPECIFIED,
            offending: untagged(send!()),
            golden: term!("02 ff c0 00", "0022", send!()),
        },
        // ---- DDP ----
        Row {
            cause: C::DDP_LOCAL_CATASTROPHIC,
            offending: None,
            golden: term!("10 00 00 00"),
        },
        Row {
            cause: C::DDP_TAGGED_INVALID_STAG,
            offending: write(),
            golden: term!("11 00 c0 00", "05a2", write!()),
        },
        Row {
            cause: C::DDP_TAGGED_BASE_BOUNDS,
            offending: write(),
            golden: term!("11 01 c0 00", "05a2", write!()),
        },
        Row {
            cause: C::DDP_TAGGED_STAG_NOT_ASSOCIATED,
            offending: write(),
            golden: term!("11 02 c0 00", "05a2", write!()),
        },
        Row {
            cause: C::DDP_TAGGED_TO_WRAP,
            offending: write(),
            golden: term!("11 03 c0 00", "05a2", write!()),
        },
        Row {
            // The header of a segment with an unknown DDP version has no
            // known layout: nothing is included.
            cause: C::DDP_TAGGED_INVALID_VERSION,
            offending: Some(segment("82 40 2e11bf00 00007ff39f764000", 16)),
            golden: term!("11 04 00 00"),
        },
        Row {
            cause: C::DDP_UNTAGGED_INVALID_QN,
            offending: untagged(send_qn5!()),
            golden: term!("12 01 c0 00", "0022", send_qn5!()),
        },
        Row {
            cause: C::DDP_UNTAGGED_NO_BUFFER,
            offending: untagged(send!()),
            golden: term!("12 02 c0 00", "0022", send!()),
        },
        Row {
            cause: C::DDP_UNTAGGED_MSN_RANGE,
            offending: untagged(send_msn16!()),
            golden: term!("12 03 c0 00", "0022", send_msn16!()),
        },
        Row {
            cause: C::DDP_UNTAGGED_INVALID_MO,
            offending: untagged(send_mo4k!()),
            golden: term!("12 04 c0 00", "0022", send_mo4k!()),
        },
        Row {
            cause: C::DDP_UNTAGGED_TOO_LONG,
            offending: untagged(send!()),
            golden: term!("12 05 c0 00", "0022", send!()),
        },
        Row {
            cause: C::DDP_UNTAGGED_INVALID_VERSION,
            offending: Some(segment("42 43 00000000 00000000 00000001 00000000", 16)),
            golden: term!("12 06 00 00"),
        },
        // ---- MPA: never a segment (untrustworthy, or none) ----
        Row {
            cause: C::MPA_TCP_CLOSED,
            offending: None,
            golden: term!("20 01 00 00"),
        },
        Row {
            cause: C::MPA_CRC,
            offending: untagged(send!()),
            golden: term!("20 02 00 00"),
        },
        Row {
            cause: C::MPA_MARKER_MISMATCH,
            offending: None,
            golden: term!("20 03 00 00"),
        },
        Row {
            cause: C::MPA_INVALID_REQUEST_REPLY,
            offending: None,
            golden: term!("20 04 00 00"),
        },
        Row {
            cause: C::MPA_LOCAL_CATASTROPHIC,
            offending: None,
            golden: term!("20 05 00 00"),
        },
        Row {
            cause: C::MPA_INSUFFICIENT_IRD,
            offending: None,
            golden: term!("20 06 00 00"),
        },
        Row {
            cause: C::MPA_NO_MATCHING_RTR,
            offending: None,
            golden: term!("20 07 00 00"),
        },
    ]
}

#[test]
fn rows_cover_the_cause_table_in_order() {
    let rows = rows();
    assert_eq!(rows.len(), ALL.len());
    for (row, (cause, _)) in rows.iter().zip(ALL) {
        assert_eq!(row.cause, *cause);
    }
}

#[test]
fn every_row_emits_its_golden_bytes() {
    for row in rows() {
        let golden = hex(row.golden);
        let msg = TerminateMessage {
            msn: 1,
            header: TerminateRepr::for_segment(row.cause, row.offending.as_deref()),
        };
        assert_eq!(msg.buffer_len(), golden.len(), "{}", row.cause);
        let mut buf = vec![0xEEu8; golden.len() + 8];
        assert_eq!(msg.emit(&mut buf), golden.len());
        assert_eq!(&buf[..golden.len()], &golden[..], "{}", row.cause);
        // The control word carries the triple in the RFC layout.
        let c = &golden[18..22];
        assert_eq!(c[0] >> 4, row.cause.layer.as_u4());
        assert_eq!(c[0] & 0x0F, row.cause.etype);
        assert_eq!(c[1], row.cause.ecode);
        assert_eq!(c[2] & 0x1F, 0);
        assert_eq!(c[3], 0);
    }
}

#[test]
fn every_row_parses_back() {
    for row in rows() {
        let golden = hex(row.golden);
        let (msg, layout) = TerminateMessage::parse(&golden).unwrap();
        assert_eq!(layout, TerminateLayout::Rfc, "{}", row.cause);
        assert_eq!(msg.msn, 1);
        assert_eq!(msg.header.cause, row.cause);
        assert_eq!(
            msg.header,
            TerminateRepr::for_segment(row.cause, row.offending.as_deref())
        );
        // The included DDP header is the offending segment's own.
        if let (Some(h), Some(seg)) = (msg.header.ddp_header, &row.offending) {
            assert_eq!(h.as_bytes(), &seg[..h.header_len()]);
        }
        // Headers are included exactly for the causes that report segments.
        assert_eq!(
            msg.header.ddp_header.is_some(),
            row.cause.reports_segment() && row.offending.is_some(),
            "{}",
            row.cause
        );
    }
}

#[test]
fn included_headers_decode() {
    let rows = rows();
    // The Read Request rows carry rping's Read Request.
    let bounds = rows
        .iter()
        .find(|r| r.cause == C::RDMAP_PROT_BASE_BOUNDS)
        .unwrap();
    let (msg, _) = TerminateMessage::parse(&hex(bounds.golden)).unwrap();
    let rr = msg.header.rdma_header.unwrap();
    assert_eq!(
        (rr.sink_stag, rr.size, rr.source_stag),
        (0x2b9d_4f00, 100, 0xf52e_2400)
    );
    let ddp = msg.header.ddp_header.unwrap().parse().unwrap();
    assert_eq!(ddp.opcode(), rdmap::wire::RdmapOpcode::ReadRequest);
    // The RDMAP-version row's header is kept though it does not parse.
    let rv = rows
        .iter()
        .find(|r| r.cause == C::RDMAP_OP_INVALID_VERSION)
        .unwrap();
    let (msg, _) = TerminateMessage::parse(&hex(rv.golden)).unwrap();
    let h = msg.header.ddp_header.unwrap();
    assert!(matches!(h, TerminatedDdpHeader::Untagged(_)));
    assert_eq!(h.parse(), Err(WireError::RdmapVersion(2)));
    assert_eq!(
        WireError::RdmapVersion(2).terminate_cause(),
        Some(C::RDMAP_OP_INVALID_VERSION)
    );
}

#[test]
fn layers_in_table_order() {
    let layers: Vec<Layer> = rows().iter().map(|r| r.cause.layer).collect();
    let mut sorted = layers.clone();
    sorted.sort();
    assert_eq!(layers, sorted);
}
