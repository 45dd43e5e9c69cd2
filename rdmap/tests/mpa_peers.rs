//! Connection setup against each peer described in ARCHITECTURE.md
//! ("Interop facts"): siw, cxgb4 (Chelsio) and irdma (Intel), in both
//! roles where the peer plays both.
//!
//! Each peer is a scripted counterpart: as initiator, the request bytes it
//! sends; as responder, a function from our request to the reply bytes it
//! would send, following the facts listed there (and, where the facts are
//! silent, the peer's public source, as noted). The test asserts our
//! negotiator's result and the exact bytes we put on the wire.

use std::time::Duration;

use rdmap::mpa::frame::{Frame, FrameKind, FrameRepr, IrdOrd, RtrSet, RtrType};
use rdmap::mpa::negotiate::{
    Config, CrcPolicy, Event, Framing, Negotiated, NegotiationError, Negotiator, RejectReason,
    Role, CRC_REQUIRED_REJECT_DATA,
};
use rdmap::mpa::rtr;

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

fn request_bytes(flags: u8, words: [u8; 4]) -> Vec<u8> {
    let mut b = hex(REQ_KEY);
    b.extend_from_slice(&[flags, 2, 0, 4]);
    b.extend_from_slice(&words);
    b
}

fn reply_bytes(flags: u8, words: [u8; 4]) -> Vec<u8> {
    let mut b = hex(REP_KEY);
    b.extend_from_slice(&[flags, 2, 0, 4]);
    b.extend_from_slice(&words);
    b
}

fn words(w: IrdOrd) -> [u8; 4] {
    w.emit().expect("14-bit values")
}

fn parse(bytes: &[u8]) -> FrameRepr<'_> {
    FrameRepr::parse(&Frame::new_checked(bytes).expect("frame")).expect("repr")
}

/// A peer playing responder: our request in, its reply out.
type ScriptedResponder = fn(&FrameRepr<'_>) -> Vec<u8>;

/// Runs our initiator against a scripted responder. Returns our request
/// bytes and the final event. A first FPDU behind the reply in the same
/// segment must stay unconsumed.
fn initiate(config: Config, peer: ScriptedResponder) -> (Vec<u8>, Event) {
    let mut us = Negotiator::initiator(config, &[], T0).expect("config");
    let request = us.poll_transmit().expect("request").to_vec();
    assert_eq!(us.poll_transmit(), None, "the request goes out once");
    let mut segment = peer(&parse(&request));
    let reply_len = segment.len();
    segment.extend_from_slice(&[0x00, 0x0e, 0xc1, 0x40]);
    assert_eq!(us.handle_input(&segment, T0), reply_len);
    assert_eq!(us.handle_input(&segment[reply_len..], T0), 0);
    let event = us.poll_event().expect("an outcome");
    assert_eq!(us.poll_event(), None);
    assert!(us.is_done());
    (request, event)
}

/// Runs our responder against a peer's request bytes; `accept` decides.
/// Returns our reply bytes (if any) and the final event.
fn respond(config: Config, request: &[u8], accept: bool) -> (Option<Vec<u8>>, Event) {
    let mut us = Negotiator::responder(config, T0).expect("config");
    // The request arrives in two pieces, with the start of a (premature)
    // FPDU behind it: only the frame is consumed.
    let mut stream = request.to_vec();
    stream.extend_from_slice(&[0x00, 0x12, 0x41, 0x43]);
    let used = us.handle_input(&stream[..7], T0) + us.handle_input(&stream[7..], T0);
    assert_eq!(used, request.len());
    let event = match us.poll_event().expect("an event") {
        Event::RequestReceived => {
            assert!(us.peer_request().is_some());
            if accept {
                us.accept(&[]).expect("accept");
            } else {
                us.reject(&[]).expect("reject");
            }
            us.poll_event().expect("an outcome")
        }
        other => other,
    };
    let reply = us.poll_transmit().map(<[u8]>::to_vec);
    (reply, event)
}

fn negotiated(event: Event) -> Negotiated {
    match event {
        Event::Negotiated(n) => n,
        other => panic!("expected Negotiated, got {other:?}"),
    }
}

fn ours(ird: u16, ord: u16, rtr_offer: RtrSet) -> Config {
    Config {
        ird,
        ord,
        rtr_offer,
        ..Config::default()
    }
}

// ---------------------------------------------------------------- siw ----

/// siw as responder (siw_cm.c, siw_proc_mpareq and siw_accept): echoes C,
/// rejects markers (R, 0x10, zero IRD/ORD words), echoes P and picks WRITE
/// if offered, else READ, else WRITE; never SEND. Its ORD is capped at
/// our IRD and its IRD raised to our ORD ("relaxed" IRD negotiation).
fn siw_responder(req: &FrameRepr<'_>) -> Vec<u8> {
    let flags = 0x10 | if req.crc { 0x40 } else { 0 };
    if req.markers {
        return reply_bytes(0x30, [0; 4]);
    }
    let w = req.ird_ord.expect("siw is talked to in revision 2");
    let (app_ird, app_ord) = (1, 1);
    let rtr = if w.peer_to_peer {
        if w.rtr.write {
            RtrSet::only(RtrType::Write)
        } else if w.rtr.read {
            RtrSet::only(RtrType::Read)
        } else {
            RtrSet::only(RtrType::Write)
        }
    } else {
        RtrSet::NONE
    };
    reply_bytes(
        flags,
        words(IrdOrd {
            ird: app_ird.max(w.ord),
            ord: app_ord.min(w.ird),
            peer_to_peer: w.peer_to_peer,
            rtr,
        }),
    )
}

#[test]
fn siw_initiator_rping() {
    // rping.pcap frame 24: rev 2, 0x10, no CRC, no markers, IRD/ORD 1/1.
    let request = hex(&format!("{REQ_KEY} 10 02 0004 00010001"));
    let (reply, event) = respond(ours(1, 1, RtrSet::NONE), &request, true);
    // We ask for CRC (siw honours it), keep IRD/ORD 1/1, no P2P.
    assert_eq!(reply.unwrap(), reply_bytes(0x50, [0, 1, 0, 1]));
    let n = negotiated(event);
    assert_eq!(n.role, Role::Responder);
    assert_eq!(
        n.framing,
        Framing {
            crc: true,
            markers_rx: false,
            markers_tx: false
        }
    );
    assert_eq!(
        (n.ird, n.ord, n.peer_ird, n.peer_ord),
        (1, 1, Some(1), Some(1))
    );
    assert!(!n.peer_to_peer && n.rtr.is_none());
    assert!(n.must_wait_for_first_fpdu, "siw speaks first: we wait");
}

#[test]
fn siw_initiator_perftest_read_and_write() {
    // read_bw.pcap frame 38: IRD/ORD 128/128; our application asks 16/16.
    let request = hex(&format!("{REQ_KEY} 10 02 0004 00800080"));
    let (reply, event) = respond(ours(16, 16, RtrSet::NONE), &request, true);
    assert_eq!(reply.unwrap(), reply_bytes(0x50, [0, 16, 0, 16]));
    let n = negotiated(event);
    assert_eq!((n.ird, n.ord), (16, 16));
    // write_bw's data QP: 0/0; our ORD is capped at siw's IRD 0.
    let request = hex(&format!("{REQ_KEY} 10 02 0004 00000000"));
    let (reply, event) = respond(ours(16, 16, RtrSet::NONE), &request, true);
    assert_eq!(reply.unwrap(), reply_bytes(0x50, [0, 16, 0, 0]));
    assert_eq!(negotiated(event).ord, 0);
}

#[test]
fn siw_initiator_without_crc_when_we_do_not_ask() {
    let request = hex(&format!("{REQ_KEY} 10 02 0004 00010001"));
    let cfg = Config {
        crc: CrcPolicy::Off,
        ..ours(1, 1, RtrSet::NONE)
    };
    let (reply, event) = respond(cfg, &request, true);
    assert_eq!(reply.unwrap(), reply_bytes(0x10, [0, 1, 0, 1]));
    assert!(!negotiated(event).framing.crc);
}

#[test]
fn crc_required_rejects_siws_request_without_c() {
    // siw as initiator never sets C (its mpa_crc_required is a constant
    // false): with CRC required we reject, saying why in the private data.
    let request = hex(&format!("{REQ_KEY} 10 02 0004 00010001"));
    let cfg = Config {
        crc: CrcPolicy::Required,
        ..ours(1, 1, RtrSet::NONE)
    };
    let mut us = Negotiator::responder(cfg.clone(), T0).unwrap();
    assert_eq!(us.handle_input(&request, T0), request.len());
    // Refused before the application is asked: no RequestReceived.
    let event = us.poll_event().expect("an outcome");
    let reply = us.poll_transmit().expect("a reject").to_vec();
    let mut want = hex(&format!("{REP_KEY} 30 02 0014 00000000"));
    want.extend_from_slice(CRC_REQUIRED_REJECT_DATA);
    assert_eq!(
        reply, want,
        "R set, neither M nor C, zero IRD/ORD words, then the text"
    );
    assert_eq!(parse(&reply).kind, FrameKind::Reject);
    match event {
        Event::Rejected(r) => {
            assert_eq!(r.reason, RejectReason::CrcRequired);
            assert_eq!(r.private_data, CRC_REQUIRED_REJECT_DATA);
            assert_eq!(
                r.reason.to_string(),
                "the peer did not ask for MPA CRCs, and CRCs are required here; \
                 have the peer ask for CRCs, or stop requiring them here"
            );
        }
        other => panic!("expected a reject, got {other:?}"),
    }
    // The same request with C set is taken, and so is the one without C
    // when CRCs are only requested (our reply's C turns them on).
    let with_c = hex(&format!("{REQ_KEY} 50 02 0004 00010001"));
    let (reply, event) = respond(cfg, &with_c, true);
    assert_eq!(reply.unwrap(), reply_bytes(0x50, [0, 1, 0, 1]));
    assert!(negotiated(event).framing.crc);
    let (reply, event) = respond(ours(1, 1, RtrSet::NONE), &request, true);
    assert_eq!(reply.unwrap(), reply_bytes(0x50, [0, 1, 0, 1]));
    assert!(negotiated(event).framing.crc);
}

#[test]
fn crc_required_initiator_takes_siws_c_and_fails_a_reply_without_it() {
    let cfg = Config {
        crc: CrcPolicy::Required,
        ..ours(1, 1, RtrSet::only(RtrType::Write))
    };
    // siw honours C=1: the reply sets C, CRCs on.
    let (request, event) = initiate(cfg.clone(), siw_responder);
    assert_eq!(request, request_bytes(0x50, [0x80, 1, 0x80, 1]));
    let n = negotiated(event);
    assert!(n.framing.crc);
    assert_eq!(n.rtr, Some(RtrType::Write));
    // A non-conforming responder answers C=0: refused, with a Terminate
    // (the reply switched both sides to FPDU mode, CRCs on as RFC 5044
    // has it when either side asks).
    let (_, event) = initiate(cfg.clone(), |_| reply_bytes(0x10, [0x80, 1, 0x80, 1]));
    match event {
        Event::Failed(e @ NegotiationError::CrcNotHonoured(_)) => {
            let (cause, framing) = e.terminate_cause().unwrap();
            assert_eq!(
                cause,
                rdmap::error::TerminateCause::MPA_INVALID_REQUEST_REPLY
            );
            assert!(framing.crc);
            assert!(
                e.to_string()
                    .starts_with("the peer replied without MPA CRCs"),
                "{e}"
            );
        }
        other => panic!("expected a CRC failure, got {other:?}"),
    }
    // Only requested: the same reply is taken, CRCs on all the same.
    let (_, event) = initiate(
        Config {
            crc: CrcPolicy::Requested,
            ..cfg.clone()
        },
        |_| reply_bytes(0x10, [0x80, 1, 0x80, 1]),
    );
    assert!(negotiated(event).framing.crc);
    // A reject is a reject, whatever its C.
    let (_, event) = initiate(cfg, |_| reply_bytes(0x30, [0; 4]));
    assert!(matches!(event, Event::Rejected(r) if r.reason == RejectReason::ByPeer));
}

#[test]
fn siw_initiator_revision_1() {
    // host-probe.pcap frames 239/241: rev 1, no private data; we answer
    // rev 1 without IRD/ORD words, the application's values stand.
    let request = hex(&format!("{REQ_KEY} 00 01 0000"));
    let cfg = Config {
        crc: CrcPolicy::Off,
        ..ours(4, 4, RtrSet::NONE)
    };
    let (reply, event) = respond(cfg, &request, true);
    assert_eq!(reply.unwrap(), hex(&format!("{REP_KEY} 00 01 0000")));
    let n = negotiated(event);
    assert_eq!((n.revision, n.enhanced, n.ird, n.ord), (1, false, 4, 4));
    assert_eq!((n.peer_ird, n.peer_ord), (None, None));
}

#[test]
fn siw_responder_default_p2p_picks_write() {
    // Our default: rev 2, CRC, P2P offering WRITE and READ.
    let (request, event) = initiate(
        ours(
            4,
            4,
            RtrSet {
                send: false,
                write: true,
                read: true,
            },
        ),
        siw_responder,
    );
    assert_eq!(request, request_bytes(0x50, [0x80, 4, 0xc0, 4]));
    let n = negotiated(event);
    assert_eq!(n.rtr, Some(RtrType::Write));
    assert_eq!(n.send_rtr(), Some(RtrType::Write));
    assert!(n.peer_to_peer && !n.must_wait_for_first_fpdu);
    assert!(n.framing.crc);
    // siw raises its IRD to our ORD 4, so our ORD stays 4.
    assert_eq!(
        (n.ird, n.ord, n.peer_ird, n.peer_ord),
        (4, 4, Some(4), Some(1))
    );
}

#[test]
fn siw_responder_read_rtr_like_the_probe() {
    // host-probe.pcap frames 142/144: P2P with READ RTR, IRD/ORD 4/4;
    // siw echoes 80 04 40 04.
    let cfg = Config {
        crc: CrcPolicy::Off,
        ..ours(4, 4, RtrSet::only(RtrType::Read))
    };
    let (request, event) = initiate(cfg, siw_responder);
    assert_eq!(request, hex(&format!("{REQ_KEY} 10 02 0004 80044004")));
    let n = negotiated(event);
    assert_eq!(n.rtr, Some(RtrType::Read));
    assert_eq!((n.ird, n.ord), (4, 4));
    assert!(!n.framing.crc);
}

#[test]
fn siw_responder_has_no_send_rtr() {
    // Offering only SEND: siw answers WRITE, which we did not offer.
    let (_, event) = initiate(ours(4, 4, RtrSet::only(RtrType::Send)), siw_responder);
    match event {
        Event::Failed(e @ NegotiationError::NoMatchingRtr { .. }) => {
            let (cause, framing) = e.terminate_cause().unwrap();
            assert_eq!(cause, rdmap::error::TerminateCause::MPA_NO_MATCHING_RTR);
            assert!(framing.crc);
            // What the operator reads: what siw did, what to change.
            assert_eq!(
                e.to_string(),
                "the peer chose a Write RTR, which was not offered; offer a Write RTR as well, \
                 or turn peer-to-peer off"
            );
        }
        other => panic!("expected NoMatchingRtr, got {other:?}"),
    }
}

#[test]
fn siw_responder_rejects_markers() {
    // host-probe.pcap frames 281/283: M=1 gets a reject, byte 16 0x30.
    let cfg = Config {
        markers_wanted: true,
        crc: CrcPolicy::Off,
        ..ours(1, 1, RtrSet::NONE)
    };
    let (request, event) = initiate(cfg, siw_responder);
    assert_eq!(request, hex(&format!("{REQ_KEY} 90 02 0004 00010001")));
    match event {
        Event::Rejected(r) => {
            assert_eq!(r.reason, RejectReason::ByPeer);
            assert!(r.private_data.is_empty());
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
}

#[test]
fn siw_responder_without_p2p() {
    let (request, event) = initiate(ours(1, 1, RtrSet::NONE), siw_responder);
    assert_eq!(request, request_bytes(0x50, [0, 1, 0, 1]));
    let n = negotiated(event);
    assert!(!n.peer_to_peer && n.send_rtr().is_none());
    assert_eq!((n.ird, n.ord), (1, 1));
}

#[test]
fn we_reject_markers_like_siw_when_configured_to() {
    // host-probe.pcap frame 281 sent to us with markers refused: the same
    // reject siw sends (frame 283).
    let request = hex(&format!("{REQ_KEY} 90 02 0004 00010001"));
    let cfg = Config {
        markers_accepted: false,
        ..Config::default()
    };
    let (reply, event) = respond(cfg, &request, true);
    assert_eq!(
        reply.unwrap(),
        hex(&format!("{REP_KEY} 30 02 0004 00000000"))
    );
    assert!(matches!(event, Event::Rejected(r) if r.reason == RejectReason::MarkersRefused));
}

// -------------------------------------------------------------- cxgb4 ----

/// cxgb4 as responder for an application asking for `app_ird`/`app_ord`:
/// CRC always, markers off, IRD/ORD at most 32, echoes P and picks WRITE
/// before READ (the order its MPA parser tests the bits in), raising its
/// IRD to 1 for a READ RTR.
fn cxgb4_reply(req: &FrameRepr<'_>, app_ird: u16, app_ord: u16) -> Vec<u8> {
    const LIMIT: u16 = 32;
    let w = req.ird_ord.expect("rev 2");
    let rtr = if !w.peer_to_peer {
        RtrSet::NONE
    } else if w.rtr.write {
        RtrSet::only(RtrType::Write)
    } else if w.rtr.read {
        RtrSet::only(RtrType::Read)
    } else {
        RtrSet::NONE
    };
    let mut ird = app_ird.min(LIMIT);
    if rtr.read {
        ird = ird.max(1);
    }
    reply_bytes(
        0x50,
        words(IrdOrd {
            ird,
            ord: app_ord.min(LIMIT).min(w.ird),
            peer_to_peer: w.peer_to_peer,
            rtr,
        }),
    )
}

/// cxgb4 whose application asks for 64/64 (above its limit).
fn cxgb4_responder(req: &FrameRepr<'_>) -> Vec<u8> {
    cxgb4_reply(req, 64, 64)
}

/// cxgb4 whose application asks for no RDMA Reads at all.
fn cxgb4_responder_no_reads(req: &FrameRepr<'_>) -> Vec<u8> {
    cxgb4_reply(req, 0, 0)
}

#[test]
fn cxgb4_initiator_read_rtr() {
    // cxgb4's request: CRC, P2P with READ RTR, IRD/ORD capped at 32.
    let request = request_bytes(0x50, [0x80, 32, 0x40, 32]);
    let (reply, event) = respond(ours(16, 64, RtrSet::NONE), &request, true);
    // We pick READ (the only kind offered), cap our ORD at its IRD 32,
    // keep our IRD 16, echo P and CRC.
    assert_eq!(reply.unwrap(), reply_bytes(0x50, [0x80, 16, 0x40, 32]));
    let n = negotiated(event);
    assert_eq!(n.expect_rtr(), Some(RtrType::Read));
    assert_eq!((n.ird, n.ord), (16, 32));
    assert!(n.framing.crc && !n.framing.markers_rx && !n.framing.markers_tx);
    assert!(n.must_wait_for_first_fpdu);
}

#[test]
fn cxgb4_initiator_with_zero_ird_ord() {
    // An application asking for no reads: cxgb4 raises its ORD to 1 for its
    // READ RTR; we raise our IRD to 1 to take it.
    let request = request_bytes(0x50, [0x80, 0, 0x40, 1]);
    let (reply, event) = respond(ours(0, 0, RtrSet::NONE), &request, true);
    assert_eq!(reply.unwrap(), reply_bytes(0x50, [0x80, 1, 0x40, 0]));
    let n = negotiated(event);
    assert_eq!((n.ird, n.ord), (1, 0));
}

#[test]
fn cxgb4_as_responder() {
    // Offering READ only (as cxgb4 itself does): READ, with cxgb4's IRD
    // raised to at least 1 and its limit of 32.
    let (request, event) = initiate(ours(64, 64, RtrSet::only(RtrType::Read)), cxgb4_responder);
    assert_eq!(request, request_bytes(0x50, [0x80, 64, 0x40, 64]));
    let n = negotiated(event);
    assert_eq!(n.send_rtr(), Some(RtrType::Read));
    assert_eq!((n.ird, n.ord), (64, 32), "ORD capped at cxgb4's IRD 32");
    // An application with ORD 0 still gets the one ORD slot its READ RTR
    // needs, in the request and after.
    let (request, event) = initiate(ours(0, 0, RtrSet::only(RtrType::Read)), cxgb4_responder);
    assert_eq!(request, request_bytes(0x50, [0x80, 0, 0x40, 1]));
    assert_eq!(negotiated(event).ord, 1);
    // Our default offer (WRITE and READ): whichever it picks, we follow.
    let (_, event) = initiate(
        ours(
            8,
            8,
            RtrSet {
                send: false,
                write: true,
                read: true,
            },
        ),
        cxgb4_responder,
    );
    assert_eq!(negotiated(event).rtr, Some(RtrType::Write));
    // cxgb4 with no reads configured still raises its IRD to 1 for our
    // READ RTR, and our ORD follows it down to 1.
    let (_, event) = initiate(
        ours(4, 4, RtrSet::only(RtrType::Read)),
        cxgb4_responder_no_reads,
    );
    let n = negotiated(event);
    assert_eq!((n.ord, n.peer_ird, n.peer_ord), (1, Some(1), Some(0)));
}

#[test]
fn cxgb4_responder_insufficient_ird() {
    // Our IRD 8 is below the ORD 32 cxgb4 answers with when we ask it for
    // IRD 64: RFC 6581 "insufficient IRD".
    let (_, event) = initiate(ours(8, 64, RtrSet::only(RtrType::Read)), |req| {
        let w = req.ird_ord.unwrap();
        reply_bytes(0x50, [0x80, 32, 0x40, 32.min(w.ord as u8)])
    });
    match event {
        Event::Failed(e @ NegotiationError::InsufficientIrd { .. }) => {
            assert_eq!(
                e.terminate_cause().unwrap().0,
                rdmap::error::TerminateCause::MPA_INSUFFICIENT_IRD
            );
        }
        other => panic!("expected InsufficientIrd, got {other:?}"),
    }
}

// -------------------------------------------------------------- irdma ----

/// irdma's request: CRC always, P2P offering WRITE and READ (no SEND);
/// with its out-of-order mode, M=1.
fn irdma_request(ird: u16, ord: u16, out_of_order: bool) -> Vec<u8> {
    let flags = 0x50 | if out_of_order { 0x80 } else { 0 };
    request_bytes(
        flags,
        words(IrdOrd {
            ird,
            ord,
            peer_to_peer: true,
            rtr: RtrSet {
                send: false,
                write: true,
                read: true,
            },
        }),
    )
}

/// What irdma checks in a reply before going on: P must be set, the
/// responder's ORD must not exceed irdma's IRD, and a READ RTR needs a
/// responder IRD of at least 1.
fn irdma_accepts_reply(request: &[u8], reply: &[u8]) -> bool {
    let req = parse(request).ird_ord.unwrap();
    let rep = parse(reply);
    let Some(w) = rep.ird_ord else { return false };
    rep.kind == FrameKind::Reply
        && w.peer_to_peer
        && w.ord <= req.ird
        && !(w.rtr.read && w.ird == 0)
}

/// irdma as responder: rejects a frame whose IRD word lacks P; picks READ;
/// sets M itself in out-of-order mode.
fn irdma_responder(req: &FrameRepr<'_>) -> Vec<u8> {
    match req.ird_ord {
        Some(w) if w.peer_to_peer => {
            let rtr = if w.rtr.read {
                RtrSet::only(RtrType::Read)
            } else {
                RtrSet::only(RtrType::Write)
            };
            reply_bytes(
                0x50,
                words(IrdOrd {
                    ird: 8.max(w.ord),
                    ord: 8.min(w.ird),
                    peer_to_peer: true,
                    rtr,
                }),
            )
        }
        _ => reply_bytes(0x30, [0; 4]),
    }
}

fn irdma_responder_out_of_order(req: &FrameRepr<'_>) -> Vec<u8> {
    let mut b = irdma_responder(req);
    b[16] |= 0x80;
    b
}

#[test]
fn irdma_initiator_our_preference() {
    let request = irdma_request(8, 8, false);
    let (reply, event) = respond(ours(8, 8, RtrSet::NONE), &request, true);
    let reply = reply.unwrap();
    // Default preference: WRITE.
    assert_eq!(reply, reply_bytes(0x50, [0x80, 8, 0x80, 8]));
    assert!(irdma_accepts_reply(&request, &reply));
    let n = negotiated(event);
    assert_eq!(n.expect_rtr(), Some(RtrType::Write));
}

#[test]
fn irdma_initiator_read_rtr_with_zero_ird() {
    // Our application wants IRD 0 and we prefer READ: irdma would abort on
    // IRD 0, so ours is raised to 1; our ORD is capped at irdma's IRD 0.
    let request = irdma_request(0, 4, false);
    let cfg = Config {
        rtr_preference: [RtrType::Read, RtrType::Write, RtrType::Send],
        ..ours(0, 16, RtrSet::NONE)
    };
    let (reply, event) = respond(cfg, &request, true);
    let reply = reply.unwrap();
    assert_eq!(reply, reply_bytes(0x50, [0x80, 1, 0x40, 0]));
    assert!(irdma_accepts_reply(&request, &reply));
    let n = negotiated(event);
    assert_eq!((n.rtr, n.ird, n.ord), (Some(RtrType::Read), 1, 0));
}

#[test]
fn irdma_initiator_out_of_order_asks_for_markers() {
    let request = irdma_request(8, 8, true);
    let (reply, event) = respond(ours(8, 8, RtrSet::NONE), &request, true);
    let reply = reply.unwrap();
    // We do not ask for markers ourselves (M clear in our reply) but must
    // send them.
    assert_eq!(reply[16], 0x50);
    assert!(irdma_accepts_reply(&request, &reply));
    let n = negotiated(event);
    assert_eq!(
        n.framing,
        Framing {
            crc: true,
            markers_rx: false,
            markers_tx: true
        }
    );
}

#[test]
fn irdma_responder_picks_read() {
    let (request, event) = initiate(
        ours(
            8,
            8,
            RtrSet {
                send: false,
                write: true,
                read: true,
            },
        ),
        irdma_responder,
    );
    assert!(parse(&request).ird_ord.unwrap().peer_to_peer);
    let n = negotiated(event);
    assert_eq!(n.send_rtr(), Some(RtrType::Read));
    assert_eq!((n.ird, n.ord), (8, 8));
    assert!(n.framing.crc);
}

#[test]
fn irdma_responder_rejects_us_without_p2p() {
    let (request, event) = initiate(ours(8, 8, RtrSet::NONE), irdma_responder);
    assert!(!parse(&request).ird_ord.unwrap().peer_to_peer);
    assert!(matches!(event, Event::Rejected(r) if r.reason == RejectReason::ByPeer));
}

#[test]
fn irdma_responder_out_of_order_mode_gets_markers() {
    let (_, event) = initiate(
        ours(8, 8, RtrSet::only(RtrType::Read)),
        irdma_responder_out_of_order,
    );
    let n = negotiated(event);
    assert!(n.framing.markers_tx && !n.framing.markers_rx);
    // Configured not to send markers, we fail instead (RFC 5044: we cannot
    // honour the reply), with a Terminate in FPDU mode.
    let cfg = Config {
        markers_accepted: false,
        ..ours(8, 8, RtrSet::only(RtrType::Read))
    };
    let (_, event) = initiate(cfg, irdma_responder_out_of_order);
    assert!(matches!(event, Event::Failed(NegotiationError::MarkersRefused(f)) if f.markers_tx));
}

// ------------------------------------------- every RTR kind, both roles ----

#[test]
fn every_rtr_kind_both_roles_flags_echoed() {
    for rtr_kind in [RtrType::Send, RtrType::Write, RtrType::Read] {
        // Our initiator offering only this kind, our responder accepting
        // all: the reply echoes P and sets exactly this kind's bit.
        let mut init =
            Negotiator::initiator(ours(4, 4, RtrSet::only(rtr_kind)), b"hi", T0).unwrap();
        let mut resp = Negotiator::responder(Config::default(), T0).unwrap();
        let request = init.poll_transmit().unwrap().to_vec();
        assert_eq!(resp.handle_input(&request, T0), request.len());
        assert_eq!(resp.poll_event(), Some(Event::RequestReceived));
        let pr = resp.peer_request().unwrap();
        assert_eq!(
            (pr.rtr, pr.private_data.as_slice()),
            (Some(rtr_kind), &b"hi"[..])
        );
        resp.accept(b"ok").unwrap();
        let reply = resp.poll_transmit().unwrap().to_vec();
        let rw = parse(&reply).ird_ord.unwrap();
        assert!(rw.peer_to_peer);
        assert_eq!(rw.rtr, RtrSet::only(rtr_kind));
        let r = negotiated(resp.poll_event().unwrap());
        assert_eq!(init.handle_input(&reply, T0), reply.len());
        let i = negotiated(init.poll_event().unwrap());
        assert_eq!(i.send_rtr(), Some(rtr_kind));
        assert_eq!(r.expect_rtr(), Some(rtr_kind));
        assert_eq!(
            (i.private_data.as_slice(), r.private_data.as_slice()),
            (&b"ok"[..], &b"hi"[..])
        );
        // The RTR the initiator builds is the one the responder recognises.
        assert_eq!(
            rtr::recognize_rtr(rtr::rtr_ulpdu(rtr_kind).as_bytes()),
            Some(rtr_kind)
        );
        // Scripted initiator offering all three, responder preferring this
        // kind first: it is chosen.
        let request = request_bytes(0x50, [0xc0, 4, 0xc0, 4]);
        let mut pref = [RtrType::Send, RtrType::Write, RtrType::Read];
        pref.sort_by_key(|t| *t != rtr_kind);
        let cfg = Config {
            rtr_preference: pref,
            ..Config::default()
        };
        let (reply, event) = respond(cfg, &request, true);
        let rw = parse(&reply.unwrap()).ird_ord.unwrap();
        assert_eq!(rw.rtr, RtrSet::only(rtr_kind));
        assert_eq!(negotiated(event).rtr, Some(rtr_kind));
    }
}

#[test]
fn responder_rejects_when_no_rtr_matches() {
    // Offered SEND only; we accept WRITE and READ only.
    let request = request_bytes(0x50, [0xc0, 4, 0x00, 4]);
    let cfg = Config {
        rtr_accept: RtrSet {
            send: false,
            write: true,
            read: true,
        },
        ..Config::default()
    };
    let (reply, event) = respond(cfg, &request, true);
    assert_eq!(reply.unwrap(), reply_bytes(0x30, [0; 4]));
    assert!(matches!(
        event,
        Event::Rejected(r) if r.reason == RejectReason::NoMatchingRtr {
            offered: RtrSet::only(RtrType::Send)
        }
    ));
}

#[test]
fn initiator_refuses_two_rtr_kinds_in_a_reply() {
    let (_, event) = initiate(ours(4, 4, RtrSet::ALL), |_| {
        reply_bytes(0x50, [0x80, 4, 0xc0, 4])
    });
    assert!(matches!(
        event,
        Event::Failed(NegotiationError::NoMatchingRtr { .. })
    ));
}

#[test]
fn application_reject_with_private_data() {
    let request = hex(&format!("{REQ_KEY} 10 02 0004 00010001"));
    let mut us = Negotiator::responder(Config::default(), T0).unwrap();
    us.handle_input(&request, T0);
    assert_eq!(us.poll_event(), Some(Event::RequestReceived));
    us.reject(b"busy").unwrap();
    let reply = us.poll_transmit().unwrap().to_vec();
    assert_eq!(
        reply,
        hex(&format!("{REP_KEY} 30 02 0008 00000000 62757379"))
    );
    match us.poll_event() {
        Some(Event::Rejected(r)) => assert_eq!(
            (r.reason, r.private_data.as_slice()),
            (RejectReason::ByApplication, &b"busy"[..])
        ),
        other => panic!("{other:?}"),
    }
    // And the initiator side of a reject with private data.
    let (_, event) = initiate(Config::default(), |_| {
        hex(&format!("{REP_KEY} 30 02 0008 00000000 62757379"))
    });
    match event {
        Event::Rejected(r) => assert_eq!(
            (r.reason, r.private_data.as_slice()),
            (RejectReason::ByPeer, &b"busy"[..])
        ),
        other => panic!("{other:?}"),
    }
}
