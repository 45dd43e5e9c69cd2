//! Drives the FPDU deframer (RFC 5044 §4–§6) with arbitrary bytes, and the
//! framer/deframer pair with ULPDUs the input describes.
//!
//! First byte: bit 0 = CRC, bit 1 = markers, bit 2 = mode (0: the rest is a
//! raw stream; 1: the rest is cut into ULPDUs that are framed, then
//! deframed and compared). Second byte: chunk size for feeding. Raw input
//! must never panic, and pieces must borrow the input; framed input must
//! come back unchanged with every CRC good.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmap::mpa::deframe::{DeframeEvent, Deframer};
use rdmap::mpa::fpdu::Framer;

fuzz_target!(|data: &[u8]| {
    let [flags, chunk, rest @ ..] = data else {
        return;
    };
    let crc = flags & 1 != 0;
    let markers = flags & 2 != 0;
    let chunk = usize::from(*chunk).max(1);
    if flags & 4 == 0 {
        let mut d = Deframer::new(crc, markers, u16::from(*flags) << 4 | 0xf);
        for piece in rest.chunks(chunk) {
            let range = piece.as_ptr_range();
            let mut input = piece;
            loop {
                match d.next_event(&mut input) {
                    Ok(Some(DeframeEvent::Bytes(b))) => {
                        assert!(range.start <= b.as_ptr() && b.as_ptr_range().end <= range.end)
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        // Sticky: the stream has lost FPDU alignment.
                        assert_eq!(d.error(), Some(e));
                        assert_eq!(d.next_event(&mut &[0u8; 8][..]), Err(e));
                        return;
                    }
                }
            }
        }
        return;
    }
    // Each ULPDU: one length byte (scaled), then that many input bytes.
    let mut ulpdus = Vec::new();
    let mut input = rest;
    while let Some((&n, tail)) = input.split_first() {
        let n = (usize::from(n) * 7).min(tail.len());
        ulpdus.push(&tail[..n]);
        input = &tail[n..];
    }
    let mut f = Framer::new(crc, markers);
    let mut stream = Vec::new();
    for u in &ulpdus {
        stream.extend_from_slice(&f.build_fpdu(u, &[]).unwrap());
    }
    let mut d = Deframer::new(crc, markers, u16::MAX);
    let mut got: Vec<Vec<u8>> = Vec::new();
    for piece in stream.chunks(chunk) {
        for ev in d.feed(piece) {
            match ev.unwrap() {
                DeframeEvent::UlpduStart { .. } => got.push(Vec::new()),
                DeframeEvent::Bytes(b) => got.last_mut().unwrap().extend_from_slice(b),
                DeframeEvent::UlpduEnd { crc_ok } => assert!(crc_ok),
            }
        }
    }
    assert!(d.at_boundary());
    assert_eq!(got.len(), ulpdus.len());
    for (a, b) in got.iter().zip(&ulpdus) {
        assert_eq!(&a[..], *b);
    }
});
