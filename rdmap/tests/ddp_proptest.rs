//! Property tests of the DDP/RDMAP header and Read Request codecs:
//! emit∘parse is the identity on every representation, and arbitrary bytes
//! never panic; whatever parses re-emits to the input with the fields the
//! RFCs tell receivers to ignore cleared.

use proptest::prelude::*;
use rdmap::wire::ddp::{ddp_ctrl, rdmap_ctrl};
use rdmap::wire::{DdpPacket, DdpRepr, RdmapOpcode, ReadRequest, WireError, READ_REQUEST_LEN};

fn arb_opcode() -> impl Strategy<Value = RdmapOpcode> {
    prop::sample::select(RdmapOpcode::ALL.to_vec())
}

/// Every representation `parse` can return: tagged opcodes tagged,
/// untagged ones on their own queue, an Invalidate STag exactly where RDMAP
/// carries one.
fn arb_repr() -> impl Strategy<Value = DdpRepr> {
    (
        arb_opcode(),
        any::<bool>(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(opcode, last, a, to, msn, mo)| {
            if opcode.is_tagged() {
                DdpRepr::tagged(opcode, last, a, to)
            } else {
                match DdpRepr::untagged(opcode, last, msn, mo) {
                    DdpRepr::Untagged {
                        opcode,
                        last,
                        qn,
                        msn,
                        mo,
                        ..
                    } => DdpRepr::Untagged {
                        opcode,
                        last,
                        qn,
                        msn,
                        mo,
                        inv_stag: opcode.carries_invalidate_stag().then_some(a),
                    },
                    t => t,
                }
            }
        })
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

/// A header whose bytes are random but whose versions, opcode and queue
/// are valid, so that the interesting paths are reached often.
fn nearly_valid() -> impl Strategy<Value = Vec<u8>> {
    (arb_opcode(), prop::collection::vec(any::<u8>(), 18..64)).prop_map(|(op, mut b)| {
        let tagged = op.is_tagged();
        b[0] = (b[0] & (ddp_ctrl::LAST | ddp_ctrl::RESERVED))
            | if tagged { ddp_ctrl::TAGGED } else { 0 }
            | 1;
        b[1] = (b[1] & rdmap_ctrl::RESERVED) | 0x40 | op.as_u4();
        if let Some(qn) = op.queue_number() {
            b[6..10].copy_from_slice(&qn.to_be_bytes());
        }
        b
    })
}

/// The input as a conforming sender would have written it: reserved bits
/// and the reserved Invalidate STag field of other opcodes cleared.
fn canonical(b: &[u8], repr: &DdpRepr) -> Vec<u8> {
    let mut c = b[..repr.header_len()].to_vec();
    c[0] &= !ddp_ctrl::RESERVED;
    c[1] &= !rdmap_ctrl::RESERVED;
    if !repr.is_tagged() && !repr.opcode().carries_invalidate_stag() {
        c[2..6].fill(0);
    }
    c
}

fn check_bytes(b: &[u8]) {
    match DdpRepr::parse_ulpdu(b) {
        Ok((repr, hl)) => {
            assert_eq!(hl, repr.header_len());
            let mut out = vec![0u8; hl];
            repr.emit(&mut out);
            assert_eq!(out, canonical(b, &repr));
            let p = DdpPacket::new_checked(b).unwrap();
            assert_eq!(p.payload(), &b[hl..]);
            assert_eq!(DdpRepr::parse(&p), Ok(repr));
        }
        Err(e) => {
            // Every rejection of a DDP header names a Terminate cause.
            assert!(e.terminate_cause().is_some(), "{e:?}");
        }
    }
    // The view never panics once checked.
    if let Ok(p) = DdpPacket::new_checked(b) {
        let _ = (
            p.tagged(),
            p.last(),
            p.ddp_reserved(),
            p.ddp_version(),
            p.rdmap_version(),
            p.rdmap_reserved(),
            p.opcode_bits(),
            p.stag(),
            p.tagged_offset(),
            p.invalidate_stag_field(),
            p.queue_number(),
            p.msn(),
            p.message_offset(),
            p.payload().len(),
        );
        assert_eq!(p.stag().is_some(), p.tagged());
        assert_eq!(p.msn().is_some(), !p.tagged());
    }
    let _ = ReadRequest::parse_bytes(b);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn emit_then_parse_is_identity(repr in arb_repr(), payload in prop::collection::vec(any::<u8>(), 0..40)) {
        let mut b = vec![0xA5u8; repr.header_len()];
        repr.emit(&mut b);
        b.extend_from_slice(&payload);
        prop_assert_eq!(DdpRepr::parse_ulpdu(&b), Ok((repr, repr.header_len())));
        let p = DdpPacket::new_checked(&b[..]).unwrap();
        prop_assert_eq!(p.payload(), &payload[..]);
        prop_assert_eq!(p.last(), repr.last());
        prop_assert_eq!(p.tagged(), repr.is_tagged());
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..64)) {
        check_bytes(&b);
    }

    #[test]
    fn nearly_valid_headers_parse_or_name_a_cause(b in nearly_valid()) {
        check_bytes(&b);
        // With valid versions, opcode and queue, only the length can fail.
        let r = DdpRepr::parse_ulpdu(&b);
        prop_assert!(r.is_ok() || r == Err(WireError::Truncated));
    }

    #[test]
    fn read_request_identity(rr in arb_read_request(), tail in prop::collection::vec(any::<u8>(), 0..8)) {
        let mut b = rr.to_bytes().to_vec();
        b.extend_from_slice(&tail);
        prop_assert_eq!(ReadRequest::parse_bytes(&b), Ok(rr));
        prop_assert_eq!(&rr.to_bytes()[..], &b[..READ_REQUEST_LEN]);
    }

    #[test]
    fn any_28_bytes_are_a_read_request(b in prop::collection::vec(any::<u8>(), READ_REQUEST_LEN)) {
        let rr = ReadRequest::parse_bytes(&b).unwrap();
        prop_assert_eq!(&rr.to_bytes()[..], &b[..]);
    }
}
