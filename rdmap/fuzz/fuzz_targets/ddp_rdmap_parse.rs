//! Feeds arbitrary bytes to the DDP/RDMAP header, Read Request and
//! Terminate parsers, and checks that whatever parses re-emits to the same
//! bytes, up to the fields the RFCs tell a receiver to ignore (reserved
//! bits, the Invalidate STag slot of opcodes that carry none, the DDP
//! Segment Length slot of a Terminate without M). A Terminate read in
//! siw's layout is re-emitted in the RFC's and must read back the same.
//!
//! The first input byte picks the entry point, so that the fuzzer reaches
//! the Terminate header without first forging a DDP header: even = a whole
//! ULPDU (DDP header, then a Read Request or Terminate header when the
//! opcode says so), odd = a bare Terminate header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmap::wire::ddp::{ddp_ctrl, rdmap_ctrl};
use rdmap::wire::terminate::hdrct;
use rdmap::wire::{
    DdpPacket, DdpRepr, RdmapOpcode, ReadRequest, TerminateLayout, TerminateMessage, TerminateRepr,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        ulpdu(rest);
    } else {
        terminate(rest);
    }
});

fn ulpdu(b: &[u8]) {
    let Ok((repr, hl)) = DdpRepr::parse_ulpdu(b) else {
        return;
    };
    let mut out = vec![0u8; hl];
    repr.emit(&mut out);
    let mut want = b[..hl].to_vec();
    want[0] &= !ddp_ctrl::RESERVED;
    want[1] &= !rdmap_ctrl::RESERVED;
    if !repr.is_tagged() && !repr.opcode().carries_invalidate_stag() {
        want[2..6].fill(0);
    }
    assert_eq!(out, want);
    let view = DdpPacket::new_checked(b).expect("parsed header is long enough");
    assert_eq!(DdpRepr::parse(&view), Ok(repr));
    assert_eq!(view.payload(), &b[hl..]);

    match repr.opcode() {
        RdmapOpcode::ReadRequest => {
            if let Ok(rr) = ReadRequest::parse_bytes(&b[hl..]) {
                assert_eq!(&rr.to_bytes()[..], &b[hl..hl + 28]);
            }
        }
        RdmapOpcode::Terminate => {
            terminate(&b[hl..]);
            let whole = TerminateMessage::parse(b).map(|(m, l)| (m.header, l));
            assert_eq!(whole, TerminateRepr::parse(&b[hl..]));
        }
        _ => {}
    }
}

fn terminate(b: &[u8]) {
    let _ = TerminateRepr::parse_as(b, TerminateLayout::SiwSwapped);
    let Ok((repr, layout)) = TerminateRepr::parse(b) else {
        return;
    };
    let mut out = vec![0u8; repr.buffer_len()];
    assert_eq!(repr.emit(&mut out), out.len());
    assert_eq!(
        TerminateRepr::parse_as(&out, TerminateLayout::Rfc),
        Ok(repr)
    );
    if layout == TerminateLayout::Rfc {
        let mut want = b[..out.len()].to_vec();
        want[2] &= hdrct::MASK;
        want[3] = 0;
        if repr.segment_length.is_none() && repr.ddp_header.is_some() {
            want[4] = 0;
            want[5] = 0;
        }
        assert_eq!(out, want);
    }
}
