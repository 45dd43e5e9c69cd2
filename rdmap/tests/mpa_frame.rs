//! MPA request/reply/reject frames: golden bytes from the siw captures,
//! emit∘parse identity and arbitrary input (RFC 5044 §7.1, RFC 6581 §3).
#![allow(
    clippy::disallowed_methods,
    reason = "reads a capture fixture from disk"
)]

mod captures_common;

use proptest::prelude::*;
use rdmap::mpa::frame::{
    self, frame_len, Frame, FrameError, FrameKind, FrameRepr, IrdOrd, RtrSet, RtrType,
};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

const REQ_KEY: &str = "4d504120494420526571204672616d65";
const REP_KEY: &str = "4d504120494420526570204672616d65";

struct Golden {
    what: &'static str,
    bytes: String,
    expect: FrameRepr<'static>,
}

fn v2(ird: u16, ord: u16, peer_to_peer: bool, rtr: RtrSet) -> Option<IrdOrd> {
    Some(IrdOrd {
        ird,
        ord,
        peer_to_peer,
        rtr,
    })
}

fn goldens() -> Vec<Golden> {
    let base = FrameRepr {
        kind: FrameKind::Request,
        markers: false,
        crc: false,
        revision: 2,
        ird_ord: None,
        private_data: &[],
    };
    vec![
        Golden {
            what: "rping.pcap frame 24: request, IRD/ORD 1/1",
            bytes: format!("{REQ_KEY} 10 02 0004 00010001"),
            expect: FrameRepr {
                ird_ord: v2(1, 1, false, RtrSet::NONE),
                ..base
            },
        },
        Golden {
            what: "rping.pcap frame 26: reply, IRD/ORD 1/1",
            bytes: format!("{REP_KEY} 10 02 0004 00010001"),
            expect: FrameRepr {
                kind: FrameKind::Reply,
                ird_ord: v2(1, 1, false, RtrSet::NONE),
                ..base
            },
        },
        Golden {
            what: "read_bw.pcap frame 38: data QP request, IRD/ORD 128/128",
            bytes: format!("{REQ_KEY} 10 02 0004 00800080"),
            expect: FrameRepr {
                ird_ord: v2(128, 128, false, RtrSet::NONE),
                ..base
            },
        },
        Golden {
            what: "read_bw.pcap frame 21: control connection request, 0/0",
            bytes: format!("{REQ_KEY} 10 02 0004 00000000"),
            expect: FrameRepr {
                ird_ord: v2(0, 0, false, RtrSet::NONE),
                ..base
            },
        },
        Golden {
            what: "host-probe.pcap frame 142: peer-to-peer request with READ RTR",
            bytes: format!("{REQ_KEY} 10 02 0004 80044004"),
            expect: FrameRepr {
                ird_ord: v2(4, 4, true, RtrSet::only(RtrType::Read)),
                ..base
            },
        },
        Golden {
            what: "host-probe.pcap frame 144: siw echoes P and READ RTR",
            bytes: format!("{REP_KEY} 10 02 0004 80044004"),
            expect: FrameRepr {
                kind: FrameKind::Reply,
                ird_ord: v2(4, 4, true, RtrSet::only(RtrType::Read)),
                ..base
            },
        },
        Golden {
            what: "host-probe.pcap frame 163: request with C=1",
            bytes: format!("{REQ_KEY} 50 02 0004 00010001"),
            expect: FrameRepr {
                crc: true,
                ird_ord: v2(1, 1, false, RtrSet::NONE),
                ..base
            },
        },
        Golden {
            what: "host-probe.pcap frame 165: siw honours C=1",
            bytes: format!("{REP_KEY} 50 02 0004 00010001"),
            expect: FrameRepr {
                kind: FrameKind::Reply,
                crc: true,
                ird_ord: v2(1, 1, false, RtrSet::NONE),
                ..base
            },
        },
        Golden {
            what: "host-probe.pcap frame 239: revision 1 request, no private data",
            bytes: format!("{REQ_KEY} 00 01 0000"),
            expect: FrameRepr {
                revision: 1,
                ..base
            },
        },
        Golden {
            what: "host-probe.pcap frame 241: revision 1 reply",
            bytes: format!("{REP_KEY} 00 01 0000"),
            expect: FrameRepr {
                kind: FrameKind::Reply,
                revision: 1,
                ..base
            },
        },
        Golden {
            what: "host-probe.pcap frame 281: request for markers (M=1)",
            bytes: format!("{REQ_KEY} 90 02 0004 00010001"),
            expect: FrameRepr {
                markers: true,
                ird_ord: v2(1, 1, false, RtrSet::NONE),
                ..base
            },
        },
        Golden {
            what: "host-probe.pcap frame 283: siw rejects markers, byte 16 = 0x30",
            bytes: format!("{REP_KEY} 30 02 0004 00000000"),
            expect: FrameRepr {
                kind: FrameKind::Reject,
                ird_ord: v2(0, 0, false, RtrSet::NONE),
                ..base
            },
        },
    ]
}

#[test]
fn golden_frames_parse_and_reemit() {
    for g in goldens() {
        let bytes = hex(&g.bytes);
        let frame = Frame::new_checked(&bytes[..]).expect(g.what);
        assert_eq!(frame.total_len(), bytes.len(), "{}", g.what);
        let repr = FrameRepr::parse(&frame).expect(g.what);
        assert_eq!(repr, g.expect, "{}", g.what);
        assert_eq!(repr.to_vec().expect(g.what), bytes, "{}", g.what);
        // The same through parse_prefix with the start of an FPDU behind it.
        let mut more = bytes.clone();
        more.extend_from_slice(&[0x00, 0x22, 0x41, 0x43]);
        let (r2, used) = FrameRepr::parse_prefix(&more).expect(g.what);
        assert_eq!((r2, used), (g.expect, bytes.len()), "{}", g.what);
    }
}

#[test]
fn captures_hold_the_golden_frames() {
    // The embedded constants are what they say: every MPA frame in
    // host-probe.pcap is among them.
    let path = captures_common::capture("host-probe.pcap");
    let pcap = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let all: Vec<Vec<u8>> = goldens().iter().map(|g| hex(&g.bytes)).collect();
    let key = b"MPA ID R";
    let mut found = 0;
    let mut i = 0;
    while i + 8 <= pcap.len() {
        if &pcap[i..i + 8] == key {
            let len = frame_len(&pcap[i..]).unwrap().unwrap();
            let f = &pcap[i..i + len];
            assert!(all.iter().any(|g| g == f), "unexpected frame {f:02x?}");
            found += 1;
        }
        i += 1;
    }
    assert_eq!(found, 16, "host-probe.pcap has eight request/reply pairs");
}

#[test]
fn enhanced_flag_rules() {
    // Revision 2 without 0x10: no IRD/ORD words, all private data is the
    // application's (how siw, cxgb4 and irdma read it).
    let b = hex(&format!("{REQ_KEY} 00 02 0004 80044004"));
    let r = FrameRepr::parse(&Frame::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(r.ird_ord, None);
    assert_eq!(r.private_data, &[0x80, 0x04, 0x40, 0x04]);
    // 0x10 in revision 1 is reserved: ignored.
    let b = hex(&format!("{REQ_KEY} 10 01 0002 abcd"));
    let r = FrameRepr::parse(&Frame::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(
        (r.revision, r.ird_ord, r.private_data),
        (1, None, &[0xab, 0xcd][..])
    );
    // 0x10 in revision 2 with fewer than 4 bytes of private data.
    let b = hex(&format!("{REQ_KEY} 10 02 0002 0001"));
    assert_eq!(
        FrameRepr::parse(&Frame::new_checked(&b[..]).unwrap()),
        Err(FrameError::MissingIrdOrd)
    );
    // Reserved bits are ignored.
    let b = hex(&format!("{REP_KEY} 1f 02 0004 00010001"));
    let r = FrameRepr::parse(&Frame::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(r.kind, FrameKind::Reply);
    assert!(!r.markers && !r.crc);
}

#[test]
fn bad_key_and_revision() {
    let b = hex(&format!("{REQ_KEY} 10 02 0004 00010001"));
    let mut bad = b.clone();
    bad[3] = b'x';
    assert_eq!(
        FrameRepr::parse(&Frame::new_checked(&bad[..]).unwrap()),
        Err(FrameError::BadKey)
    );
    for rev in [0u8, 3, 0xff] {
        let mut bad = b.clone();
        bad[17] = rev;
        assert_eq!(
            FrameRepr::parse(&Frame::new_checked(&bad[..]).unwrap()),
            Err(FrameError::BadRevision(rev))
        );
    }
}

#[test]
fn private_data_limits() {
    // Parse: up to 512 bytes.
    let mut b = hex(&format!("{REP_KEY} 00 01 0200"));
    b.extend(std::iter::repeat(0x5a).take(512));
    let r = FrameRepr::parse(&Frame::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(r.private_data.len(), 512);
    // Emit: 256 in all, so 252 application bytes with IRD/ORD words.
    let pd = [7u8; 256];
    let mut repr = FrameRepr {
        kind: FrameKind::Request,
        markers: false,
        crc: true,
        revision: 2,
        ird_ord: v2(1, 1, false, RtrSet::NONE),
        private_data: &pd[..252],
    };
    assert_eq!(repr.to_vec().unwrap().len(), 20 + 256);
    repr.private_data = &pd[..253];
    assert_eq!(repr.to_vec(), Err(FrameError::TooMuchPrivateData(257)));
    repr.ird_ord = None;
    repr.revision = 1;
    repr.private_data = &pd[..];
    assert_eq!(repr.to_vec().unwrap().len(), 20 + 256);
    // IRD/ORD words only in revision 2.
    repr.ird_ord = v2(1, 1, false, RtrSet::NONE);
    repr.private_data = &[];
    assert_eq!(repr.to_vec(), Err(FrameError::BadIrdOrd));
    let mut out = [0u8; 10];
    repr.revision = 2;
    assert_eq!(repr.emit(&mut out), Err(FrameError::BufferTooShort));
}

fn arb_ird_ord() -> impl Strategy<Value = IrdOrd> {
    (
        0..=frame::IRD_ORD_MAX,
        0..=frame::IRD_ORD_MAX,
        any::<bool>(),
        any::<[bool; 3]>(),
    )
        .prop_map(|(ird, ord, p, r)| IrdOrd {
            ird,
            ord,
            peer_to_peer: p,
            rtr: RtrSet {
                send: r[0],
                write: r[1],
                read: r[2],
            },
        })
}

proptest! {
    #[test]
    fn emit_parse_identity(
        kind in prop_oneof![Just(FrameKind::Request), Just(FrameKind::Reply), Just(FrameKind::Reject)],
        markers in any::<bool>(),
        crc in any::<bool>(),
        words in proptest::option::of(arb_ird_ord()),
        rev1 in any::<bool>(),
        pd in proptest::collection::vec(any::<u8>(), 0..=252),
    ) {
        let revision = if rev1 && words.is_none() { 1 } else { 2 };
        let repr = FrameRepr { kind, markers, crc, revision, ird_ord: words, private_data: &pd };
        let bytes = repr.to_vec().unwrap();
        prop_assert_eq!(bytes.len(), repr.buffer_len());
        let frame = Frame::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(FrameRepr::parse(&frame).unwrap(), repr);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = frame_len(&bytes);
        if let Ok(frame) = Frame::new_checked(&bytes[..]) {
            if let Ok(repr) = FrameRepr::parse(&frame) {
                // Whatever parses and fits the send limit re-emits to the
                // same meaning.
                if let Ok(again) = repr.to_vec() {
                    let f2 = Frame::new_checked(&again[..]).unwrap();
                    prop_assert_eq!(FrameRepr::parse(&f2).unwrap(), repr);
                }
            }
        }
        let _ = FrameRepr::parse_prefix(&bytes);
    }

    #[test]
    fn near_miss_frames_never_panic(
        flags in any::<u8>(), rev in 0u8..4, pd_len in 0u16..600, body in proptest::collection::vec(any::<u8>(), 0..600),
        reply in any::<bool>(),
    ) {
        let mut b = if reply { frame::REPLY_KEY.to_vec() } else { frame::REQUEST_KEY.to_vec() };
        b.push(flags);
        b.push(rev);
        b.extend_from_slice(&pd_len.to_be_bytes());
        b.extend_from_slice(&body);
        match FrameRepr::parse_prefix(&b) {
            Ok((repr, used)) => {
                prop_assert_eq!(used, 20 + usize::from(pd_len));
                prop_assert!(rev == 1 || rev == 2);
                prop_assert_eq!(repr.markers, flags & 0x80 != 0);
            }
            Err(e) => prop_assert!(matches!(
                e,
                FrameError::Truncated | FrameError::BadRevision(_) | FrameError::TooMuchPrivateData(_) | FrameError::MissingIrdOrd
            )),
        }
    }
}
