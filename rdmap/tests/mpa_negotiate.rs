//! The MPA negotiator's mechanics (RFC 5044 §7.1, RFC 6581): exact
//! consumption over arbitrary chunks, timeouts, malformed and unexpected
//! frames, revisions, private data limits and call order.

use std::time::Duration;

use proptest::prelude::*;
use rdmap::mpa::frame::{FrameError, FrameKind, RtrSet, RtrType};
use rdmap::mpa::negotiate::{Config, Event, NegotiationError, Negotiator, SetupError};

const T0: Duration = Duration::ZERO;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

const REQ_KEY: &str = "4d504120494420526571204672616d65";
const REP_KEY: &str = "4d504120494420526570204672616d65";

fn failed(n: &mut Negotiator) -> NegotiationError {
    match n.poll_event() {
        Some(Event::Failed(e)) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn reply_and_first_fpdu_byte_by_byte() {
    let mut init = Negotiator::initiator(Config::default(), &[], T0).unwrap();
    init.poll_transmit().unwrap();
    let mut stream = hex(&format!("{REP_KEY} 50 02 0006 80104010 abcd"));
    let reply_len = stream.len();
    stream.extend_from_slice(&[0, 0x0e, 0xc1, 0x40, 0, 0, 0, 1]);
    let mut used = 0;
    for (i, b) in stream.iter().enumerate() {
        let n = init.handle_input(std::slice::from_ref(b), T0);
        used += n;
        assert_eq!(n, usize::from(i < reply_len), "byte {i}");
        if i + 1 < reply_len {
            assert_eq!(init.poll_event(), None);
        }
    }
    assert_eq!(used, reply_len);
    match init.poll_event() {
        Some(Event::Negotiated(n)) => {
            assert_eq!(n.private_data, vec![0xab, 0xcd]);
            assert_eq!(n.rtr, Some(RtrType::Read));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn initiator_timeout() {
    let cfg = Config {
        timeout: Duration::from_secs(3),
        ..Config::default()
    };
    let start = Duration::from_secs(100);
    let mut init = Negotiator::initiator(cfg, &[], start).unwrap();
    assert_eq!(init.poll_timeout(), Some(Duration::from_secs(103)));
    init.handle_timeout(Duration::from_millis(102_999));
    assert_eq!(init.poll_event(), None);
    // Half a reply, then silence.
    let reply = hex(&format!("{REP_KEY} 50 02 0004 00010001"));
    assert_eq!(
        init.handle_input(&reply[..10], Duration::from_secs(101)),
        10
    );
    init.handle_timeout(Duration::from_secs(103));
    assert_eq!(failed(&mut init), NegotiationError::Timeout);
    assert_eq!(init.poll_timeout(), None);
    assert_eq!(init.handle_input(&reply[10..], Duration::from_secs(104)), 0);
}

#[test]
fn responder_timeout_and_no_timeout_while_deciding() {
    let cfg = Config {
        timeout: Duration::from_secs(1),
        ..Config::default()
    };
    let mut r = Negotiator::responder(cfg.clone(), T0).unwrap();
    assert_eq!(r.handle_input(&[], Duration::from_secs(2)), 0);
    assert_eq!(failed(&mut r), NegotiationError::Timeout);
    let mut r = Negotiator::responder(cfg, T0).unwrap();
    let req = hex(&format!("{REQ_KEY} 10 02 0004 00010001"));
    r.handle_input(&req, Duration::from_millis(500));
    assert_eq!(r.poll_event(), Some(Event::RequestReceived));
    assert_eq!(r.poll_timeout(), None);
    r.handle_timeout(Duration::from_secs(60));
    assert_eq!(r.poll_event(), None);
    r.accept(&[]).unwrap();
    assert!(matches!(r.poll_event(), Some(Event::Negotiated(_))));
}

#[test]
fn malformed_frames() {
    // Bad key.
    let mut r = Negotiator::responder(Config::default(), T0).unwrap();
    let mut req = hex(&format!("{REQ_KEY} 10 02 0004 00010001"));
    req[0] = b'X';
    r.handle_input(&req, T0);
    assert_eq!(failed(&mut r), NegotiationError::Frame(FrameError::BadKey));
    assert_eq!(
        r.poll_transmit(),
        None,
        "nothing is sent to a malformed request"
    );
    // Private data above 512: refused as soon as the header is in.
    let mut r = Negotiator::responder(Config::default(), T0).unwrap();
    let req = hex(&format!("{REQ_KEY} 10 02 0201"));
    assert_eq!(r.handle_input(&req, T0), 20);
    assert_eq!(
        failed(&mut r),
        NegotiationError::Frame(FrameError::TooMuchPrivateData(513))
    );
    // Revision 3.
    let mut r = Negotiator::responder(Config::default(), T0).unwrap();
    r.handle_input(&hex(&format!("{REQ_KEY} 10 03 0004 00010001")), T0);
    assert_eq!(
        failed(&mut r),
        NegotiationError::Frame(FrameError::BadRevision(3))
    );
    // Enhanced flag with too little private data.
    let mut r = Negotiator::responder(Config::default(), T0).unwrap();
    r.handle_input(&hex(&format!("{REQ_KEY} 10 02 0002 0001")), T0);
    assert_eq!(
        failed(&mut r),
        NegotiationError::Frame(FrameError::MissingIrdOrd)
    );
}

#[test]
fn unexpected_frames() {
    let mut r = Negotiator::responder(Config::default(), T0).unwrap();
    r.handle_input(&hex(&format!("{REP_KEY} 10 02 0004 00010001")), T0);
    assert_eq!(
        failed(&mut r),
        NegotiationError::UnexpectedFrame(FrameKind::Reply)
    );
    let mut i = Negotiator::initiator(Config::default(), &[], T0).unwrap();
    i.handle_input(&hex(&format!("{REQ_KEY} 10 02 0004 00010001")), T0);
    assert_eq!(
        failed(&mut i),
        NegotiationError::UnexpectedFrame(FrameKind::Request)
    );
}

#[test]
fn revisions() {
    // A reply above our revision.
    let cfg = Config {
        revision: 1,
        ..Config::default()
    };
    let mut i = Negotiator::initiator(cfg.clone(), &[], T0).unwrap();
    assert_eq!(
        i.poll_transmit().unwrap(),
        &hex(&format!("{REQ_KEY} 40 01 0000"))[..]
    );
    i.handle_input(&hex(&format!("{REP_KEY} 50 02 0004 00010001")), T0);
    assert_eq!(
        failed(&mut i),
        NegotiationError::RevisionMismatch {
            sent: 1,
            received: 2
        }
    );
    // A rev 2 initiator accepts a rev 1 reply (no IRD/ORD, no P2P).
    let mut i = Negotiator::initiator(Config::default(), &[], T0).unwrap();
    i.handle_input(&hex(&format!("{REP_KEY} 40 01 0000")), T0);
    match i.poll_event() {
        Some(Event::Negotiated(n)) => {
            assert_eq!(
                (n.revision, n.enhanced, n.rtr, n.ird, n.ord),
                (1, false, None, 16, 16)
            );
        }
        other => panic!("{other:?}"),
    }
    // A rev 1 responder answers a rev 2 request in rev 1, without words.
    let mut r = Negotiator::responder(cfg, T0).unwrap();
    r.handle_input(&hex(&format!("{REQ_KEY} 10 02 0006 80044004 abcd")), T0);
    assert_eq!(r.poll_event(), Some(Event::RequestReceived));
    assert_eq!(r.peer_request().unwrap().rtr, None);
    assert_eq!(r.peer_request().unwrap().private_data, vec![0xab, 0xcd]);
    r.accept(&[1, 2, 3]).unwrap();
    assert_eq!(
        r.poll_transmit().unwrap(),
        &hex(&format!("{REP_KEY} 40 01 0003 010203"))[..]
    );
    // Bad configured revision.
    let bad = Config {
        revision: 3,
        ..Config::default()
    };
    assert_eq!(
        Negotiator::responder(bad.clone(), T0).err(),
        Some(SetupError::BadRevision(3))
    );
    assert_eq!(
        Negotiator::initiator(bad, &[], T0).err(),
        Some(SetupError::BadRevision(3))
    );
}

#[test]
fn private_data_limits() {
    let pd = [9u8; 257];
    assert!(Negotiator::initiator(Config::default(), &pd[..252], T0).is_ok());
    assert_eq!(
        Negotiator::initiator(Config::default(), &pd[..253], T0).err(),
        Some(SetupError::PrivateDataTooLong { len: 253, max: 252 })
    );
    let rev1 = Config {
        revision: 1,
        ..Config::default()
    };
    let mut i = Negotiator::initiator(rev1, &pd[..256], T0).unwrap();
    assert_eq!(i.poll_transmit().unwrap().len(), 276);
    // The responder's accept is limited the same way, and a failed accept
    // leaves the request pending.
    let mut r = Negotiator::responder(Config::default(), T0).unwrap();
    r.handle_input(&hex(&format!("{REQ_KEY} 10 02 0004 00010001")), T0);
    r.poll_event();
    assert_eq!(
        r.accept(&pd[..253]),
        Err(SetupError::PrivateDataTooLong { len: 253, max: 252 })
    );
    assert_eq!(
        r.reject(&pd[..253]),
        Err(SetupError::PrivateDataTooLong { len: 253, max: 252 })
    );
    r.accept(&pd[..252]).unwrap();
    assert_eq!(r.poll_transmit().unwrap().len(), 276);
    // A peer may send up to 512.
    let mut i = Negotiator::initiator(Config::default(), &[], T0).unwrap();
    let mut reply = hex(&format!("{REP_KEY} 50 02 0200 80104010"));
    reply.extend(std::iter::repeat(7).take(508));
    assert_eq!(i.handle_input(&reply, T0), 532);
    match i.poll_event() {
        Some(Event::Negotiated(n)) => assert_eq!(n.private_data.len(), 508),
        other => panic!("{other:?}"),
    }
}

#[test]
fn call_order() {
    let mut r = Negotiator::responder(Config::default(), T0).unwrap();
    assert_eq!(r.accept(&[]), Err(SetupError::NoPendingRequest));
    assert_eq!(r.poll_transmit(), None);
    r.handle_input(&hex(&format!("{REQ_KEY} 10 02 0004 00010001")), T0);
    assert_eq!(r.poll_event(), Some(Event::RequestReceived));
    r.accept(&[]).unwrap();
    assert_eq!(r.accept(&[]), Err(SetupError::NoPendingRequest));
    assert_eq!(r.reject(&[]), Err(SetupError::NoPendingRequest));
    assert!(r.poll_transmit().is_some());
    assert_eq!(r.poll_transmit(), None);
    assert!(r.is_done());
}

#[test]
fn read_rtr_raises_initiator_ord() {
    let cfg = Config {
        ord: 0,
        rtr_offer: RtrSet::only(RtrType::Read),
        ..Config::default()
    };
    let mut i = Negotiator::initiator(cfg, &[], T0).unwrap();
    let req = i.poll_transmit().unwrap();
    assert_eq!(&req[20..24], &[0x80, 16, 0x40, 1]);
}

proptest! {
    /// Our initiator and responder agree over a stream cut anywhere, for
    /// any combination of options, and neither consumes a byte beyond its
    /// frame.
    #[test]
    fn pair_agrees_over_any_cut(
        rev in 1u8..=2, crc_i in any::<bool>(), crc_r in any::<bool>(),
        m_i in any::<bool>(), m_r in any::<bool>(),
        ird_i in 0u16..200, ord_i in 0u16..200, ird_r in 0u16..200, ord_r in 0u16..200,
        offer in any::<[bool; 3]>(), accept in any::<[bool; 3]>(),
        pd in proptest::collection::vec(any::<u8>(), 0..=252),
        cut in 0usize..600, cut2 in 0usize..600,
    ) {
        let ci = Config { revision: rev, crc: crc_i.into(), markers_wanted: m_i, ird: ird_i, ord: ord_i,
            rtr_offer: RtrSet { send: offer[0], write: offer[1], read: offer[2] }, ..Config::default() };
        let cr = Config { revision: 2, crc: crc_r.into(), markers_wanted: m_r, ird: ird_r, ord: ord_r,
            rtr_accept: RtrSet { send: accept[0], write: accept[1], read: accept[2] }, ..Config::default() };
        let mut i = Negotiator::initiator(ci, &pd, T0).unwrap();
        let mut r = Negotiator::responder(cr, T0).unwrap();
        let mut req = i.poll_transmit().unwrap().to_vec();
        let req_len = req.len();
        req.extend_from_slice(b"FPDU");
        let c = cut.min(req.len());
        let used = r.handle_input(&req[..c], T0) + r.handle_input(&req[c..], T0);
        prop_assert_eq!(used, req_len);
        let decision = r.poll_event();
        let reply_expected = match decision {
            Some(Event::RequestReceived) => { r.accept(&pd).unwrap(); true }
            Some(Event::Rejected(_)) => false,
            other => { prop_assert!(false, "{:?}", other); false }
        };
        let mut rep = r.poll_transmit().unwrap().to_vec();
        let rep_len = rep.len();
        rep.extend_from_slice(b"FPDU");
        let c = cut2.min(rep.len());
        let used = i.handle_input(&rep[..c], T0) + i.handle_input(&rep[c..], T0);
        prop_assert_eq!(used, rep_len);
        match (reply_expected, r.poll_event(), i.poll_event()) {
            (true, Some(Event::Negotiated(rn)), Some(Event::Negotiated(inn))) => {
                prop_assert_eq!(inn.framing.crc, crc_i || crc_r);
                prop_assert_eq!(rn.framing.crc, inn.framing.crc);
                prop_assert_eq!(inn.framing.markers_tx, rn.framing.markers_rx);
                prop_assert_eq!(inn.framing.markers_rx, rn.framing.markers_tx);
                prop_assert_eq!(inn.rtr, rn.rtr);
                prop_assert_eq!(inn.revision, rev);
                prop_assert_eq!(&inn.private_data, &pd);
                prop_assert_eq!(&rn.private_data, &pd);
                if rev == 2 {
                    // Each side's ORD fits the other's IRD.
                    prop_assert!(inn.ord <= rn.ird || inn.rtr == Some(RtrType::Read) && inn.ord == 1);
                    prop_assert!(rn.ord <= inn.ird);
                    if inn.rtr == Some(RtrType::Read) {
                        prop_assert!(inn.ord >= 1 && rn.ird >= 1);
                    }
                }
                prop_assert!(rn.must_wait_for_first_fpdu && !inn.must_wait_for_first_fpdu);
            }
            (false, None, Some(Event::Rejected(_))) => {}
            (_, a, b) => prop_assert!(false, "responder {:?} initiator {:?}", a, b),
        }
    }

    #[test]
    fn arbitrary_input_never_panics(data in proptest::collection::vec(any::<u8>(), 0..700), cut in 0usize..700, resp in any::<bool>()) {
        let mut n = if resp {
            Negotiator::responder(Config::default(), T0).unwrap()
        } else {
            Negotiator::initiator(Config::default(), &[], T0).unwrap()
        };
        let c = cut.min(data.len());
        let used = n.handle_input(&data[..c], T0) + n.handle_input(&data[c..], T0);
        prop_assert!(used <= data.len());
        while let Some(ev) = n.poll_event() {
            if ev == Event::RequestReceived {
                prop_assert!(n.peer_request().is_some());
                n.accept(&[]).unwrap();
            }
        }
    }
}
