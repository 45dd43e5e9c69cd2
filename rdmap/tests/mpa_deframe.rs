//! FPDU framing and deframing (RFC 5044 §4–§6): random FPDU streams with
//! and without markers and CRCs, cut into random chunks, come back as the
//! same ULPDUs; CRC and marker faults are caught; the shapes siw puts on
//! the wire (split CRC, dozens of FPDUs per segment) deframe.

use proptest::prelude::*;
use rdmap::error::TerminateCause;
use rdmap::mpa::deframe::{DeframeError, DeframeEvent, Deframer};
use rdmap::mpa::fpdu::{fpdu_len, FramedFpdu, Framer, MAX_ULPDU_LEN};
use rdmap::mpa::markers::{marker_bytes, MARKER_INTERVAL};

/// What a zero-copy sender does with a [`FramedFpdu`]: prefix, ULPDU and
/// trailer, with each marker inserted before its logical offset.
fn interleave(framed: &FramedFpdu, ulpdu: &[u8]) -> Vec<u8> {
    let logical: Vec<u8> = framed
        .prefix
        .iter()
        .chain(ulpdu)
        .chain(framed.trailer.as_bytes())
        .copied()
        .collect();
    let mut out = Vec::with_capacity(framed.layout.wire_len());
    let mut markers = framed.layout.markers().peekable();
    for (i, b) in logical.iter().enumerate() {
        while let Some(m) = markers.next_if(|m| m.logical_offset as usize == i) {
            out.extend_from_slice(&m.bytes);
        }
        out.push(*b);
    }
    assert!(markers.next().is_none());
    out
}

/// Builds a stream of FPDUs, checking the zero-copy parts against the
/// materialised FPDU.
fn build_stream(ulpdus: &[Vec<u8>], crc: bool, markers: bool) -> Vec<u8> {
    let mut f = Framer::new(crc, markers);
    let mut g = Framer::new(crc, markers);
    let mut stream = Vec::new();
    for u in ulpdus {
        let split = u.len().min(14);
        let framed = f.frame(&u[..split], &[&u[split..]]).unwrap();
        let whole = g.build_fpdu(&u[..split], &u[split..]).unwrap();
        assert_eq!(interleave(&framed, u), whole);
        assert_eq!(whole.len(), framed.layout.wire_len());
        stream.extend_from_slice(&whole);
    }
    assert_eq!(f.position() as usize, stream.len());
    stream
}

#[derive(Debug, Default, PartialEq)]
struct Deframed {
    ulpdus: Vec<Vec<u8>>,
    crc_ok: Vec<bool>,
}

/// Deframes `stream` cut at `cuts`, checking that every piece borrows the
/// chunk it came from.
fn deframe(d: &mut Deframer, stream: &[u8], cuts: &[usize]) -> Result<Deframed, DeframeError> {
    let mut out = Deframed::default();
    let mut cur: Option<(usize, Vec<u8>)> = None;
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    bounds.push(0);
    bounds.push(stream.len());
    bounds.sort_unstable();
    for w in bounds.windows(2) {
        let chunk = &stream[w[0]..w[1]];
        let range = chunk.as_ptr_range();
        for ev in d.feed(chunk) {
            match ev? {
                DeframeEvent::UlpduStart { len } => {
                    assert!(cur.is_none());
                    cur = Some((usize::from(len), Vec::new()));
                }
                DeframeEvent::Bytes(b) => {
                    assert!(!b.is_empty());
                    assert!(range.start <= b.as_ptr() && b.as_ptr_range().end <= range.end);
                    cur.as_mut().unwrap().1.extend_from_slice(b);
                }
                DeframeEvent::UlpduEnd { crc_ok } => {
                    let (len, u) = cur.take().unwrap();
                    assert_eq!(len, u.len());
                    out.ulpdus.push(u);
                    out.crc_ok.push(crc_ok);
                }
            }
        }
    }
    // A trailing partial FPDU (arbitrary input) is left in `d`.
    Ok(out)
}

fn arb_ulpdus() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let len = prop_oneof![0usize..40, 0usize..1500, Just(1442), 1400usize..3000];
    proptest::collection::vec(
        len.prop_flat_map(|n| proptest::collection::vec(any::<u8>(), n)),
        1..25,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_round_trip(
        ulpdus in arb_ulpdus(),
        crc in any::<bool>(),
        markers in any::<bool>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let stream = build_stream(&ulpdus, crc, markers);
        let mut d = Deframer::new(crc, markers, u16::MAX);
        let got = deframe(&mut d, &stream, &cuts).unwrap();
        prop_assert_eq!(&got.ulpdus, &ulpdus);
        prop_assert!(got.crc_ok.iter().all(|&ok| ok));
        prop_assert!(d.at_boundary());
        prop_assert_eq!(d.position() as usize, stream.len());
    }

    #[test]
    fn any_flipped_bit_fails_the_crc(
        ulpdus in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..700), 1..4),
        which in any::<usize>(), bit in 0u8..8, markers in any::<bool>(),
    ) {
        // Flip a bit of the first FPDU's ULPDU, pad or CRC (not its length
        // field or a marker, which would derail framing instead): map the
        // logical offset to the wire through the layout's markers.
        let layout = Framer::new(true, markers).layout(ulpdus[0].len()).unwrap();
        let logical = 2 + which % (layout.logical_len() - 2);
        let before = layout.markers().filter(|m| m.logical_offset as usize <= logical).count();
        let idx = logical + 4 * before;
        for crc in [true, false] {
            let mut bad = build_stream(&ulpdus, crc, markers);
            bad[idx] ^= 1 << bit;
            let mut d = Deframer::new(crc, markers, u16::MAX);
            let got = deframe(&mut d, &bad, &[7, 300, 1000]).unwrap();
            prop_assert_eq!(got.crc_ok[0], !crc, "CRC {}", crc);
            prop_assert!(got.crc_ok[1..].iter().all(|&ok| ok));
        }
    }

    #[test]
    fn mulpdu_is_tight(pos in (0u32..100_000).prop_map(|p| p * 4), seg in 0usize..10_000, markers in any::<bool>()) {
        let f = Framer::with_position(true, markers, pos);
        match f.max_ulpdu_len(seg) {
            None => prop_assert!(f.layout(0).unwrap().wire_len() > seg),
            Some(u) => {
                prop_assert!(f.layout(u).unwrap().wire_len() <= seg);
                if u < MAX_ULPDU_LEN {
                    prop_assert!(f.layout(u + 1).map_or(true, |l| l.wire_len() > seg));
                }
            }
        }
    }

    #[test]
    fn streams_starting_mid_interval(
        ulpdus in arb_ulpdus(), pos in (0u32..2000).prop_map(|p| p * 4),
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
    ) {
        let mut f = Framer::with_position(true, true, pos.wrapping_sub(1024));
        let mut stream = Vec::new();
        for u in &ulpdus {
            stream.extend_from_slice(&f.build_fpdu(u, &[]).unwrap());
        }
        let mut d = Deframer::with_position(true, true, u16::MAX, pos.wrapping_sub(1024));
        let got = deframe(&mut d, &stream, &cuts).unwrap();
        prop_assert_eq!(&got.ulpdus, &ulpdus);
        prop_assert!(got.crc_ok.iter().all(|&ok| ok));
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..3000),
        crc in any::<bool>(), markers in any::<bool>(), max in any::<u16>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
    ) {
        let mut d = Deframer::new(crc, markers, max);
        match deframe(&mut d, &bytes, &cuts) {
            Ok(_) => prop_assert!(d.error().is_none()),
            Err(e) => {
                prop_assert_eq!(d.error(), Some(e));
                prop_assert_eq!(e.terminate_cause(), TerminateCause::MPA_MARKER_MISMATCH);
                // Sticky.
                prop_assert_eq!(d.feed(&[0, 0, 0, 0]).next(), Some(Err(e)));
            }
        }
    }
}

#[test]
fn every_split_of_two_fpdus() {
    let ulpdus = vec![(0..46).collect::<Vec<u8>>(), vec![9; 1290]];
    for markers in [false, true] {
        let stream = build_stream(&ulpdus, true, markers);
        for cut in 0..=stream.len() {
            let mut d = Deframer::new(true, markers, u16::MAX);
            let got = deframe(&mut d, &stream, &[cut]).unwrap();
            assert_eq!(got.ulpdus, ulpdus, "cut at {cut}");
            assert_eq!(got.crc_ok, vec![true, true]);
        }
    }
}

#[test]
fn byte_at_a_time() {
    let ulpdus = vec![vec![1; 600], vec![], vec![2; 3], vec![3; 1100]];
    for markers in [false, true] {
        let stream = build_stream(&ulpdus, true, markers);
        let cuts: Vec<usize> = (0..stream.len()).collect();
        let mut d = Deframer::new(true, markers, u16::MAX);
        assert_eq!(deframe(&mut d, &stream, &cuts).unwrap().ulpdus, ulpdus);
    }
}

#[test]
fn crc_alone_in_a_segment() {
    // read_bw_n5000.pcap frames 62–73: a 1448-octet FPDU sent as 1444
    // octets and then a 4-octet segment holding only its CRC field.
    let ulpdus = vec![vec![0x5a; 1442], vec![0xa5; 1442]];
    let stream = build_stream(&ulpdus, true, false);
    let mut d = Deframer::new(true, false, u16::MAX);
    let mut ends = 0;
    for ev in d.feed(&stream[..1444]) {
        assert!(!matches!(ev.unwrap(), DeframeEvent::UlpduEnd { .. }));
    }
    assert!(!d.at_boundary());
    let evs: Vec<_> = d.feed(&stream[1444..1448]).collect();
    assert_eq!(evs, vec![Ok(DeframeEvent::UlpduEnd { crc_ok: true })]);
    for ev in d.feed(&stream[1448..]) {
        if let DeframeEvent::UlpduEnd { crc_ok } = ev.unwrap() {
            assert!(crc_ok);
            ends += 1;
        }
    }
    assert_eq!(ends, 1);
    assert!(d.at_boundary());
}

#[test]
fn twenty_seven_read_requests_in_one_segment() {
    // read_bw.pcap frame 127: 27 Read Requests (46-octet ULPDUs, 52-octet
    // FPDUs) in one 1448-octet segment, the 28th split across the next.
    let ulpdus: Vec<Vec<u8>> = (0..28u8).map(|i| vec![i; 46]).collect();
    let stream = build_stream(&ulpdus, false, false);
    let mut d = Deframer::new(false, false, u16::MAX);
    let mut starts = 0;
    for ev in d.feed(&stream[..1448]) {
        if let DeframeEvent::UlpduStart { len } = ev.unwrap() {
            assert_eq!(len, 46);
            starts += 1;
        }
    }
    assert_eq!(starts, 28, "27 whole FPDUs and the start of the 28th");
    let got = deframe(&mut Deframer::new(false, false, u16::MAX), &stream, &[1448]).unwrap();
    assert_eq!(got.ulpdus, ulpdus);
}

#[test]
fn ulpdu_above_limit() {
    let stream = build_stream(&[vec![0; 100]], true, false);
    let mut d = Deframer::new(true, false, 99);
    let evs: Vec<_> = d.feed(&stream).collect();
    assert_eq!(
        evs,
        vec![Err(DeframeError::UlpduTooLong { len: 100, max: 99 })]
    );
    assert_eq!(d.feed(&stream).collect::<Vec<_>>(), evs);
    assert!(!d.at_boundary());
    let mut d = Deframer::new(true, false, 100);
    assert!(d.feed(&stream).all(|e| e.is_ok()));
}

#[test]
fn marker_faults() {
    let ulpdus = vec![vec![7; 1000]];
    let stream = build_stream(&ulpdus, true, true);
    // Leading marker must say 0.
    let mut bad = stream.clone();
    bad[3] = 4;
    let mut d = Deframer::new(true, true, u16::MAX);
    assert_eq!(
        deframe(&mut d, &bad, &[]),
        Err(DeframeError::Marker {
            expected: 0,
            found: 4
        })
    );
    // The marker at 512 points 508 back to the length field.
    assert_eq!(&stream[512..516], &marker_bytes(508));
    let mut bad = stream.clone();
    bad[512..516].copy_from_slice(&marker_bytes(100));
    let mut d = Deframer::new(true, true, u16::MAX);
    assert_eq!(
        deframe(&mut d, &bad, &[513]),
        Err(DeframeError::Marker {
            expected: 508,
            found: 100
        })
    );
    // Counting from the FPDU's start (512) is accepted too; so are set low
    // bits and a non-zero reserved field (ignored but in the CRC, which
    // then fails).
    let mut alt = stream.clone();
    alt[512..516].copy_from_slice(&marker_bytes(512));
    let got = deframe(&mut Deframer::new(true, true, u16::MAX), &alt, &[]).unwrap();
    assert_eq!((got.ulpdus, got.crc_ok), (ulpdus.clone(), vec![false]));
    let mut low = stream.clone();
    low[515] |= 3;
    low[512] = 0xff;
    let got = deframe(&mut Deframer::new(false, true, u16::MAX), &low, &[]).unwrap();
    assert_eq!(got.ulpdus, ulpdus);
}

#[test]
fn markers_every_512_octets_from_the_first_fpdu() {
    // Two FPDUs crossing several marker positions: every 512th octet of
    // the stream is a marker pointing into its FPDU.
    let ulpdus = vec![vec![0xee; 700], vec![0xdd; 1500]];
    let stream = build_stream(&ulpdus, false, true);
    let first_len = fpdu_len(700) + 8; // leading marker and one at 512
    assert_eq!(stream.len() % 4, 0);
    for at in (0..stream.len()).step_by(MARKER_INTERVAL as usize) {
        let ptr = u16::from_be_bytes([stream[at + 2], stream[at + 3]]) as usize;
        assert_eq!(&stream[at..at + 2], &[0, 0]);
        let fpdu_start = if at < first_len { 0 } else { first_len };
        let lead = if fpdu_start % 512 == 0 { 4 } else { 0 };
        if at == fpdu_start {
            assert_eq!(ptr, 0);
        } else {
            assert_eq!(at - ptr, fpdu_start + lead, "marker at {at}");
        }
    }
}
/// read_bw.pcap frame 127: 1448 octets of TCP payload.
const READ_BW_FRAME_127: &str = concat!(
    "002e414100000000000000010000004100000000bf4d180000007f03950f900000010000cb1f200000007f9c78c69000",
    "00000000002e414100000000000000010000004200000000bf4d180000007f03950f900000010000cb1f200000007f9c",
    "78c6900000000000002e414100000000000000010000004300000000bf4d180000007f03950f900000010000cb1f2000",
    "00007f9c78c6900000000000002e414100000000000000010000004400000000bf4d180000007f03950f900000010000",
    "cb1f200000007f9c78c6900000000000002e414100000000000000010000004500000000bf4d180000007f03950f9000",
    "00010000cb1f200000007f9c78c6900000000000002e414100000000000000010000004600000000bf4d180000007f03",
    "950f900000010000cb1f200000007f9c78c6900000000000002e414100000000000000010000004700000000bf4d1800",
    "00007f03950f900000010000cb1f200000007f9c78c6900000000000002e414100000000000000010000004800000000",
    "bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e4141000000000000000100000049",
    "00000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e41410000000000000001",
    "0000004a00000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e414100000000",
    "000000010000004b00000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e4141",
    "00000000000000010000004c00000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000",
    "002e414100000000000000010000004d00000000bf4d180000007f03950f900000010000cb1f200000007f9c78c69000",
    "00000000002e414100000000000000010000004e00000000bf4d180000007f03950f900000010000cb1f200000007f9c",
    "78c6900000000000002e414100000000000000010000004f00000000bf4d180000007f03950f900000010000cb1f2000",
    "00007f9c78c6900000000000002e414100000000000000010000005000000000bf4d180000007f03950f900000010000",
    "cb1f200000007f9c78c6900000000000002e414100000000000000010000005100000000bf4d180000007f03950f9000",
    "00010000cb1f200000007f9c78c6900000000000002e414100000000000000010000005200000000bf4d180000007f03",
    "950f900000010000cb1f200000007f9c78c6900000000000002e414100000000000000010000005300000000bf4d1800",
    "00007f03950f900000010000cb1f200000007f9c78c6900000000000002e414100000000000000010000005400000000",
    "bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e4141000000000000000100000055",
    "00000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e41410000000000000001",
    "0000005600000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e414100000000",
    "000000010000005700000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e4141",
    "00000000000000010000005800000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000",
    "002e414100000000000000010000005900000000bf4d180000007f03950f900000010000cb1f200000007f9c78c69000",
    "00000000002e414100000000000000010000005a00000000bf4d180000007f03950f900000010000cb1f200000007f9c",
    "78c6900000000000002e414100000000000000010000005b00000000bf4d180000007f03950f900000010000cb1f2000",
    "00007f9c78c6900000000000002e414100000000000000010000005c00000000bf4d180000007f03950f900000010000",
    "cb1f200000007f9c",
);

/// read_bw.pcap frame 128: 840 octets of TCP payload.
const READ_BW_FRAME_128: &str = concat!(
    "78c6900000000000002e414100000000000000010000005d00000000bf4d180000007f03950f900000010000cb1f2000",
    "00007f9c78c6900000000000002e414100000000000000010000005e00000000bf4d180000007f03950f900000010000",
    "cb1f200000007f9c78c6900000000000002e414100000000000000010000005f00000000bf4d180000007f03950f9000",
    "00010000cb1f200000007f9c78c6900000000000002e414100000000000000010000006000000000bf4d180000007f03",
    "950f900000010000cb1f200000007f9c78c6900000000000002e414100000000000000010000006100000000bf4d1800",
    "00007f03950f900000010000cb1f200000007f9c78c6900000000000002e414100000000000000010000006200000000",
    "bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e4141000000000000000100000063",
    "00000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e41410000000000000001",
    "0000006400000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e414100000000",
    "000000010000006500000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000002e4141",
    "00000000000000010000006600000000bf4d180000007f03950f900000010000cb1f200000007f9c78c6900000000000",
    "002e414100000000000000010000006700000000bf4d180000007f03950f900000010000cb1f200000007f9c78c69000",
    "00000000002e414100000000000000010000006800000000bf4d180000007f03950f900000010000cb1f200000007f9c",
    "78c6900000000000002e414100000000000000010000006900000000bf4d180000007f03950f900000010000cb1f2000",
    "00007f9c78c6900000000000002e414100000000000000010000006a00000000bf4d180000007f03950f900000010000",
    "cb1f200000007f9c78c6900000000000002e414100000000000000010000006b00000000bf4d180000007f03950f9000",
    "00010000cb1f200000007f9c78c6900000000000002e414100000000000000010000006c00000000bf4d180000007f03",
    "950f900000010000cb1f200000007f9c78c6900000000000",
);

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn golden_read_bw_coalesced_read_requests() {
    // siw coalesced 27 Read Requests and most of a 28th into one segment;
    // the next segment holds the rest of the 28th and 16 more. CRCs off.
    let a = hex(READ_BW_FRAME_127);
    let b = hex(READ_BW_FRAME_128);
    assert_eq!((a.len(), b.len()), (1448, 840));
    let mut d = Deframer::new(false, false, u16::MAX);
    let mut whole = Vec::new();
    let mut cur = Vec::new();
    for chunk in [&a[..], &b[..]] {
        for ev in d.feed(chunk) {
            match ev.unwrap() {
                DeframeEvent::UlpduStart { len } => assert_eq!(len, 46),
                DeframeEvent::Bytes(p) => cur.extend_from_slice(p),
                DeframeEvent::UlpduEnd { crc_ok } => {
                    assert!(crc_ok);
                    whole.push(core::mem::take(&mut cur));
                }
            }
        }
        if chunk.len() == 1448 {
            assert_eq!(whole.len(), 27);
            assert!(!d.at_boundary());
        }
    }
    assert!(d.at_boundary());
    assert_eq!(whole.len(), 44);
    for (i, u) in whole.iter().enumerate() {
        // Untagged, last, Read Request on queue 1, consecutive MSNs.
        assert_eq!(&u[..2], &[0x41, 0x41]);
        assert_eq!(u32::from_be_bytes(u[6..10].try_into().unwrap()), 1);
        assert_eq!(
            u32::from_be_bytes(u[10..14].try_into().unwrap()),
            0x41 + i as u32
        );
    }
}

/// Deframes one whole chunk, returning the CRC verdicts.
fn verdicts(d: &mut Deframer, chunk: &[u8]) -> Vec<bool> {
    d.feed(chunk)
        .filter_map(|ev| match ev.unwrap() {
            DeframeEvent::UlpduEnd { crc_ok } => Some(crc_ok),
            _ => None,
        })
        .collect()
}

#[test]
fn a_crc_given_for_the_next_fpdu_replaces_reading_it() {
    let fpdus: Vec<Vec<u8>> = [300usize, 1441, 7]
        .iter()
        .map(|&n| build_stream(&[(0..n).map(|i| (i * 3) as u8).collect()], true, false))
        .collect();
    let mut d = Deframer::new(true, false, u16::MAX);
    for f in &fpdus {
        let covered = crc32c::crc32c(&f[..f.len() - 4]);
        // The right CRC matches the field; a wrong one fails the FPDU
        // even though its bytes are sound, which shows the bytes were not
        // read again.
        d.next_fpdu_crc(covered);
        assert_eq!(verdicts(&mut d, f), [true]);
        d.next_fpdu_crc(covered ^ 1);
        assert_eq!(verdicts(&mut d, f), [false]);
        // The word covers one FPDU only: the next is read as before.
        d.next_fpdu_crc(covered ^ 1);
        let mut two = f.clone();
        two.extend_from_slice(f);
        assert_eq!(verdicts(&mut d, &two), [false, true]);
    }
}

#[test]
fn a_crc_given_mid_fpdu_with_markers_or_without_crcs_is_ignored() {
    let f = build_stream(&[vec![9u8; 500]], true, false);
    let bogus = 0x1234_5678;
    let mut d = Deframer::new(true, false, u16::MAX);
    assert!(d.feed(&f[..100]).all(|e| e.is_ok()));
    d.next_fpdu_crc(bogus);
    assert_eq!(verdicts(&mut d, &f[100..]), [true], "mid-FPDU: ignored");
    // Forgotten when no FPDU opened.
    d.next_fpdu_crc(bogus);
    d.forget_next_crc();
    assert_eq!(verdicts(&mut d, &f), [true]);
    let m = build_stream(&[vec![9u8; 500]], true, true);
    let mut d = Deframer::new(true, true, u16::MAX);
    d.next_fpdu_crc(bogus);
    assert_eq!(verdicts(&mut d, &m), [true], "markers: ignored");
    let n = build_stream(&[vec![9u8; 500]], false, false);
    let mut d = Deframer::new(false, false, u16::MAX);
    d.next_fpdu_crc(bogus);
    assert_eq!(verdicts(&mut d, &n), [true], "CRCs off: ignored");
}
