//! Property tests of the Terminate codec: emit∘parse is the identity in the
//! RFC layout, siw's layout of the same message is detected and read the
//! same, everything we emit is detected as the RFC layout, and arbitrary
//! bytes never panic.

use proptest::prelude::*;
use rdmap::error::{Layer, TerminateCause, ALL};
use rdmap::wire::terminate::{hdrct, siw_hdrct};
use rdmap::wire::{
    ReadRequest, TerminateLayout, TerminateMessage, TerminateRepr, TerminatedDdpHeader, WireError,
};

fn arb_cause() -> impl Strategy<Value = TerminateCause> {
    prop_oneof![
        prop::sample::select(ALL.iter().map(|(c, _)| *c).collect::<Vec<_>>()),
        (0u8..3, 0u8..16, any::<u8>()).prop_map(|(l, e, c)| {
            let layer = Layer::from_u4(l).unwrap();
            TerminateCause::new(layer, e, c)
        }),
    ]
}

fn arb_ddp_header() -> impl Strategy<Value = TerminatedDdpHeader> {
    prop_oneof![
        any::<[u8; 14]>().prop_map(|mut h| {
            h[0] |= 0x80;
            TerminatedDdpHeader::Tagged(h)
        }),
        any::<[u8; 18]>().prop_map(|mut h| {
            h[0] &= !0x80;
            TerminatedDdpHeader::Untagged(h)
        }),
    ]
}

fn arb_read_request() -> impl Strategy<Value = ReadRequest> {
    (
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(
            |(sink_stag, sink_to, size, source_stag, source_to)| ReadRequest {
                sink_stag,
                sink_to,
                size,
                source_stag,
                source_to,
            },
        )
}

fn arb_repr() -> impl Strategy<Value = TerminateRepr> {
    (
        arb_cause(),
        prop::option::of(any::<u16>()),
        prop::option::of(arb_ddp_header()),
        prop::option::of(arb_read_request()),
    )
        .prop_map(
            |(cause, segment_length, ddp_header, rdma_header)| TerminateRepr {
                cause,
                segment_length,
                ddp_header,
                rdma_header,
            },
        )
}

fn emit(r: &TerminateRepr) -> Vec<u8> {
    let mut b = vec![0u8; r.buffer_len()];
    assert_eq!(r.emit(&mut b), b.len());
    b
}

/// The same message in siw's layout.
fn siw_bytes(r: &TerminateRepr) -> Vec<u8> {
    let mut b = emit(r);
    b[0] = (r.cause.etype << 4) | r.cause.layer.as_u4();
    let mut f = 0;
    if b[2] & hdrct::M != 0 {
        f |= siw_hdrct::M;
    }
    if b[2] & hdrct::D != 0 {
        f |= siw_hdrct::D;
    }
    if b[2] & hdrct::R != 0 {
        f |= siw_hdrct::R;
    }
    b[2] = f;
    b
}

fn has_parts(r: &TerminateRepr) -> bool {
    r.segment_length.is_some() || r.ddp_header.is_some() || r.rdma_header.is_some()
}

/// The input as a conforming RFC sender would have written the part that
/// was read: reserved bits cleared, the length slot zero without M.
fn canonical_rfc(b: &[u8], r: &TerminateRepr) -> Vec<u8> {
    let mut c = b[..r.buffer_len()].to_vec();
    c[2] &= hdrct::MASK;
    c[3] = 0;
    if r.segment_length.is_none() && r.ddp_header.is_some() {
        c[4] = 0;
        c[5] = 0;
    }
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn rfc_emit_then_parse_is_identity(r in arb_repr(), tail in prop::collection::vec(any::<u8>(), 0..8)) {
        let mut b = emit(&r);
        b.extend_from_slice(&tail);
        prop_assert_eq!(TerminateRepr::parse_as(&b, TerminateLayout::Rfc), Ok(r));
        if has_parts(&r) {
            // The RFC's flag bits give the layout away.
            prop_assert_eq!(TerminateRepr::parse(&b), Ok((r, TerminateLayout::Rfc)));
        }
    }

    #[test]
    fn siw_layout_reads_the_same(r in arb_repr()) {
        let b = siw_bytes(&r);
        prop_assert_eq!(TerminateRepr::parse_as(&b, TerminateLayout::SiwSwapped), Ok(r));
        if has_parts(&r) {
            prop_assert_eq!(TerminateRepr::parse(&b), Ok((r, TerminateLayout::SiwSwapped)));
        }
    }

    #[test]
    fn what_we_send_is_read_as_rfc(
        row in 0..ALL.len(),
        seg in prop::collection::vec(any::<u8>(), 1..80),
        msn in any::<u32>(),
    ) {
        let cause = ALL[row].0;
        let msg = TerminateMessage { msn, header: TerminateRepr::for_segment(cause, Some(&seg)) };
        let mut b = vec![0u8; msg.buffer_len()];
        msg.emit(&mut b);
        prop_assert_eq!(TerminateMessage::parse(&b), Ok((msg, TerminateLayout::Rfc)));
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..80)) {
        match TerminateRepr::parse(&b) {
            Ok((r, TerminateLayout::Rfc)) => {
                prop_assert_eq!(emit(&r), canonical_rfc(&b, &r));
            }
            Ok((r, TerminateLayout::SiwSwapped)) => {
                prop_assert_eq!(TerminateRepr::parse_as(&emit(&r), TerminateLayout::Rfc), Ok(r));
            }
            Err(e) => prop_assert!(matches!(e, WireError::Truncated | WireError::TerminateLayer), "{:?}", e),
        }
        let _ = TerminateRepr::parse_as(&b, TerminateLayout::SiwSwapped);
        let _ = TerminateMessage::parse(&b);
    }

    #[test]
    fn terminate_message_identity(r in arb_repr(), msn in any::<u32>()) {
        let msg = TerminateMessage { msn, header: r };
        let mut b = vec![0u8; msg.buffer_len()];
        msg.emit(&mut b);
        let (ddp, hl) = rdmap::wire::DdpRepr::parse_ulpdu(&b).unwrap();
        prop_assert_eq!(ddp, msg.ddp_repr());
        prop_assert_eq!(TerminateRepr::parse_as(&b[hl..], TerminateLayout::Rfc), Ok(r));
    }
}

/// Every cause as siw sends it without headers, and which ones the
/// detection cannot tell from an RFC message: the documented ambiguity.
#[test]
fn siw_bare_forms() {
    let mut misread = Vec::new();
    for (cause, _) in ALL {
        let b = siw_bytes(&TerminateRepr::bare(*cause));
        let (r, layout) = TerminateRepr::parse(&b).unwrap();
        if r.cause != *cause {
            misread.push((*cause, r.cause, layout));
        } else if cause.layer.as_u4() != cause.etype {
            assert_eq!(layout, TerminateLayout::SiwSwapped, "{cause}");
        }
    }
    use TerminateCause as C;
    assert_eq!(
        misread,
        vec![
            (
                C::RDMAP_PROT_INVALID_STAG,
                C::DDP_LOCAL_CATASTROPHIC,
                TerminateLayout::Rfc
            ),
            (
                C::RDMAP_OP_INVALID_VERSION,
                C::MPA_LOCAL_CATASTROPHIC,
                TerminateLayout::Rfc
            ),
            (
                C::RDMAP_OP_UNEXPECTED_OPCODE,
                C::MPA_INSUFFICIENT_IRD,
                TerminateLayout::Rfc
            ),
            (
                C::RDMAP_OP_CATASTROPHIC_STREAM,
                C::MPA_NO_MATCHING_RTR,
                TerminateLayout::Rfc
            ),
        ]
    );
}

/// Every cause we send bare is read back as itself.
#[test]
fn rfc_bare_forms() {
    for (cause, _) in ALL {
        let b = emit(&TerminateRepr::bare(*cause));
        let (r, layout) = TerminateRepr::parse(&b).unwrap();
        if !cause.reports_segment() {
            assert_eq!((r.cause, layout), (*cause, TerminateLayout::Rfc), "{cause}");
        }
    }
}
