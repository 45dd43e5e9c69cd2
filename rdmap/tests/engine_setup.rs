//! Connection setup through the engine: who speaks first (RFC 5044 §7.1.1,
//! RFC 6581 §4), IRD/ORD as negotiated applied to the queue pair and
//! honoured by both sides, rejects, timeouts, and a shared receive queue
//! with its own receive CQ.

mod engine_common;

use core::time::Duration;

use engine_common::{connected, Buf, Pair, Rng, Setup, Side};
use rdmap::engine::{Endpoint, EngineEvent, Env, RecordKind, SetupFailure};
use rdmap::mpa::{Config, NegotiationError, RejectReason, RtrType};
use rdmap::verbs::{
    Access, QpInitAttr, QpState, RecvWr, SendWr, Sge, SgeList, SrqInitAttr, WcOpcode, WcStatus,
};

/// Drives `p` step by step, recording the kinds of the responder's records.
fn responder_records(p: &mut Pair, steps: usize) -> Vec<RecordKind> {
    let mut seen = Vec::new();
    for _ in 0..steps {
        let before = p.b.unacked.len();
        p.step();
        // Acknowledgements are held, so new records are at the back.
        for (r, _) in p.b.unacked.iter().skip(before) {
            seen.push(r.kind());
        }
    }
    seen
}

#[test]
fn responder_waits_for_the_first_fpdu() {
    let mut p = Pair::new(1, Setup::default(), 1460);
    let mut rng = Rng::new(1);
    let src = p.b.buffer(100, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let dst = p.a.buffer(100, 0x2000, Access::LOCAL_WRITE, None);
    // The responder has a Send ready; the initiator has posted nothing.
    p.a.ep
        .qp_mut()
        .post_recv(&RecvWr {
            wr_id: 9,
            sges: SgeList::single(Sge {
                addr: dst.va,
                length: 100,
                lkey: dst.stag,
            }),
        })
        .unwrap();
    let wr = SendWr::send(
        1,
        SgeList::single(Sge {
            addr: src.va,
            length: 100,
            lkey: src.stag,
        }),
    );
    p.b.ep.qp_mut().post_send(&wr, p.b.dev.mrs()).unwrap();
    p.b.hold_acks = true;
    let seen = responder_records(&mut p, 200);
    assert!(connected(&p.a.events) && connected(&p.b.events));
    assert_eq!(seen, [RecordKind::MpaFrame], "only the reply");
    assert!(p.a.completions.is_empty());
    // The initiator's first FPDU (a zero-length Write) lets it speak.
    let wr = SendWr::write(2, SgeList::empty(), 0, rdmap::verbs::Stag(0x100));
    p.a.ep.qp_mut().post_send(&wr, p.a.dev.mrs()).unwrap();
    p.b.hold_acks = false;
    p.run_until(500, |p| {
        p.a.completions.len() == 2 && p.b.completions.len() == 1
    });
    assert_eq!(p.a.bytes(&dst), p.b.bytes(&src));
}

#[test]
fn responder_waits_for_the_rtr_and_initiator_sends_it_first() {
    for rtr in [RtrType::Send, RtrType::Write, RtrType::Read] {
        let setup = Setup {
            rtr: Some(rtr),
            ..Setup::default()
        };
        let mut p = Pair::new(2, setup, 1460);
        let mut rng = Rng::new(2);
        let src_a = p.a.buffer(10, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
        let dst_b = p.b.buffer(10, 0x2000, Access::LOCAL_WRITE, None);
        p.b.ep
            .qp_mut()
            .post_recv(&RecvWr {
                wr_id: 3,
                sges: SgeList::single(Sge {
                    addr: dst_b.va,
                    length: 10,
                    lkey: dst_b.stag,
                }),
            })
            .unwrap();
        let wr = SendWr::send(
            1,
            SgeList::single(Sge {
                addr: src_a.va,
                length: 10,
                lkey: src_a.stag,
            }),
        );
        p.a.ep.qp_mut().post_send(&wr, p.a.dev.mrs()).unwrap();
        p.a.hold_acks = true;
        p.b.hold_acks = true;
        p.run_until(500, |p| p.b.completions.len() == 1);
        let a_kinds: Vec<_> = p.a.unacked.iter().map(|(r, _)| r.kind()).collect();
        assert_eq!(
            a_kinds,
            [RecordKind::MpaFrame, RecordKind::Rtr, RecordKind::Send],
            "{rtr:?}: the RTR goes first"
        );
        let b_kinds: Vec<_> = p.b.unacked.iter().map(|(r, _)| r.kind()).collect();
        let want: &[RecordKind] = if rtr == RtrType::Read {
            &[RecordKind::MpaFrame, RecordKind::ReadResponse]
        } else {
            &[RecordKind::MpaFrame]
        };
        assert_eq!(b_kinds, want, "{rtr:?}");
        // The Send RTR used MSN 1 and no receive; the Send used the buffer.
        assert_eq!(p.b.completions[0].wr_id, 3);
        assert_eq!(p.b.completions[0].byte_len, 10);
        assert_eq!(p.b.bytes(&dst_b), p.a.bytes(&src_a));
        p.a.hold_acks = false;
        p.b.hold_acks = false;
        p.run_until(500, |p| p.a.completions.len() == 1 && p.a.is_idle());
        assert_eq!(
            p.a.ep.stats().fpdus_out[3],
            1 + u64::from(rtr == RtrType::Send)
        );
    }
}

#[test]
fn ord_is_capped_at_the_peers_ird() {
    // The initiator asks for ORD 8; the responder offers IRD 1. Eight
    // Reads then go one at a time, and the responder never sees more
    // than its IRD (it would terminate the stream).
    let setup = Setup {
        ird: 1,
        ord: 8,
        ..Setup::default()
    };
    let mut p = Pair::new(3, setup, 1460);
    let mut rng = Rng::new(3);
    let src = p.b.buffer(
        8 * 3000,
        0x1_0000,
        Access::LOCAL_WRITE | Access::REMOTE_READ,
        Some(&mut rng),
    );
    let sink = p.a.buffer(8 * 3000, 0x2_0000, Access::LOCAL_WRITE, None);
    p.connect();
    let n = p.a.ep.negotiated().unwrap();
    assert_eq!((n.ord, p.a.ep.qp().ord()), (1, 1));
    assert_eq!(p.b.ep.qp().ird(), 1);
    for i in 0..8u64 {
        let wr = SendWr::read(
            i,
            Sge {
                addr: sink.va + i * 3000,
                length: 3000,
                lkey: sink.stag,
            },
            src.va + i * 3000,
            src.stag,
        );
        p.a.ep.qp_mut().post_send(&wr, p.a.dev.mrs()).unwrap();
    }
    let mut max_out = 0;
    p.run_until(5000, |p| {
        max_out = max_out.max(p.a.ep.qp().outstanding_reads());
        assert!(p.b.ep.qp().inbound_reads() <= 1);
        p.a.completions.len() == 8
    });
    assert_eq!(max_out, 1);
    assert_eq!(p.a.bytes(&sink), p.b.bytes(&src));
    let ids: Vec<_> = p.a.completions.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
}

#[test]
fn a_reject_reaches_the_initiator() {
    let mut p = Pair::new(4, Setup::default(), 1460);
    p.b.auto_accept = false;
    p.run_until(100, |p| p.a.events.contains(&EngineEvent::ReadyToClose));
    let rejected = p.a.events.iter().any(|e| {
        matches!(e, EngineEvent::Rejected(r) if r.reason == RejectReason::ByPeer && r.private_data == b"no")
    });
    assert!(rejected, "{:?}", p.a.events);
    assert!(p.b.events.contains(&EngineEvent::ReadyToClose));
    assert_eq!(p.a.ep.qp().state(), QpState::Error);
    assert!(!connected(&p.a.events) && !connected(&p.b.events));
}

#[test]
fn setup_times_out() {
    let mut s = engine_common::Side::new("initiator", 5, &Setup::default(), true);
    let deadline = s.ep.poll_timeout().unwrap();
    s.ep.handle_timeout(deadline - Duration::from_millis(1));
    assert_eq!(s.ep.poll_event(), None);
    s.ep.handle_timeout(deadline);
    assert_eq!(
        s.ep.poll_event(),
        Some(EngineEvent::SetupFailed(SetupFailure::Negotiation(
            NegotiationError::Timeout
        )))
    );
}

#[test]
fn bytes_before_our_reply_fail_setup() {
    let mut p = Pair::new(6, Setup::default(), 1460);
    // Deliver the request, then junk before the responder has decided.
    p.b.auto_accept = false;
    p.a.transmit(&mut p.rng, 1460, 1 << 16);
    let mut req: Vec<u8> = p.a.pipe.drain(..).collect();
    req.extend_from_slice(b"junk");
    p.b.with_env(|ep, env| ep.handle_stream(Duration::ZERO, &req, env));
    let ev: Vec<_> = std::iter::from_fn(|| p.b.ep.poll_event()).collect();
    assert_eq!(
        ev,
        [
            EngineEvent::ConnectRequest,
            EngineEvent::SetupFailed(SetupFailure::UnexpectedData),
            EngineEvent::ReadyToClose
        ]
    );
}

#[test]
fn shared_receive_queue_and_a_separate_receive_cq() {
    // The responder's QP takes receives from an SRQ and completes them on
    // its own CQ; the pair harness's single-CQ environment is bypassed.
    let mut p = Pair::new(8, Setup::default(), 1460);
    let mut rng = Rng::new(8);
    let src = p.a.buffer(300, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let b = &mut p.b;
    let dst = b.buffer(600, 0x2000, Access::LOCAL_WRITE, None);
    let mut srq = b
        .dev
        .create_srq(
            b.pd,
            SrqInitAttr {
                max_wr: 8,
                max_sge: 2,
                srq_limit: 0,
            },
        )
        .unwrap();
    let mut rcq = b.dev.create_cq(16).unwrap();
    let attr = QpInitAttr {
        srq: Some(srq.id()),
        recv_cq: rcq.id(),
        ..engine_common::qp_attr(b.pd, &b.cq)
    };
    let qp = b.dev.create_qp(attr).unwrap();
    let cfg = engine_common::config(&Setup::default());
    b.ep = Endpoint::responder(cfg, qp, Duration::ZERO).unwrap();
    for i in 0..2u64 {
        srq.post_srq_recv(&RecvWr {
            wr_id: 40 + i,
            sges: SgeList::single(Sge {
                addr: dst.va + 300 * i,
                length: 300,
                lkey: dst.stag,
            }),
        })
        .unwrap();
    }
    for i in 0..2u64 {
        let wr = SendWr::send(
            i,
            SgeList::single(Sge {
                addr: src.va,
                length: 150 + 150 * i as u32,
                lkey: src.stag,
            }),
        );
        p.a.ep.qp_mut().post_send(&wr, p.a.dev.mrs()).unwrap();
    }
    // Drive by hand: the responder's calls carry the SRQ and its CQ.
    let mut recvs = Vec::new();
    for _ in 0..500 {
        p.a.transmit(&mut p.rng, 1460, 1 << 16);
        let chunk: Vec<u8> = p.a.pipe.drain(..).collect();
        p.a.delivered += chunk.len() as u64;
        let b = &mut p.b;
        let mut env = Env {
            device: &mut b.dev,
            mem: &mut b.mem,
            send_cq: &mut b.cq,
            recv_cq: Some(&mut rcq),
            srq: Some(&mut srq),
        };
        b.ep.handle_stream(Duration::ZERO, &chunk, &mut env);
        while let Some(ev) = b.ep.poll_event() {
            if ev == EngineEvent::ConnectRequest {
                b.ep.accept(&[]).unwrap();
            }
        }
        while let Some(r) = b.ep.poll_record(1460, &mut env) {
            let bytes = r.to_vec(&*env.mem);
            b.ep.record_acked(r, &mut env);
            p.a.with_env(|ep, env| ep.handle_stream(Duration::ZERO, &bytes, env));
        }
        p.a.acks(&mut p.rng, 1_000_000);
        p.a.drain();
        while let Some(wc) = rcq.poll_one() {
            recvs.push(wc);
        }
        if recvs.len() == 2 && p.a.completions.len() == 2 {
            break;
        }
    }
    let got: Vec<_> = recvs
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.byte_len, c.status))
        .collect();
    assert_eq!(
        got,
        [
            (40, WcOpcode::Recv, 150, WcStatus::Success),
            (41, WcOpcode::Recv, 300, WcStatus::Success)
        ]
    );
    assert!(p.b.cq.is_empty(), "receives went to the receive CQ");
    assert_eq!(&p.b.bytes(&dst)[..150], &p.a.bytes(&src)[..150]);
    assert_eq!(&p.b.bytes(&dst)[300..600], p.a.bytes(&src));
    assert!(srq.is_empty());
}

/// A responder without peer-to-peer, relaxed or strict
/// (`responder_waits_for_first_fpdu`), with a Send posted before the
/// connection; the initiator never sends an FPDU and has two receives.
fn speak_first_pair(waits: bool) -> (Pair, Buf, Buf, Buf) {
    let mut p = Pair::new(7, Setup::default(), 1460);
    let cfg = Config {
        responder_waits_for_first_fpdu: waits,
        ..engine_common::config(&Setup::default())
    };
    p.b = Side::with_config("responder", 8, cfg, false);
    let mut rng = Rng::new(7);
    let src = p.b.buffer(100, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let dst1 = p.a.buffer(100, 0x2000, Access::LOCAL_WRITE, None);
    let dst2 = p.a.buffer(100, 0x3000, Access::LOCAL_WRITE, None);
    for (id, dst) in [(1, &dst1), (2, &dst2)] {
        p.a.ep
            .qp_mut()
            .post_recv(&RecvWr {
                wr_id: id,
                sges: SgeList::single(Sge {
                    addr: dst.va,
                    length: 100,
                    lkey: dst.stag,
                }),
            })
            .unwrap();
    }
    let wr = speak_first_send(1, &src);
    p.b.ep.qp_mut().post_send(&wr, p.b.dev.mrs()).unwrap();
    (p, src, dst1, dst2)
}

fn speak_first_send(id: u64, src: &Buf) -> SendWr {
    SendWr::send(
        id,
        SgeList::single(Sge {
            addr: src.va,
            length: 100,
            lkey: src.stag,
        }),
    )
}

/// Relaxed: work posted before the connection waits; work posted after it
/// goes out once the reply is acknowledged, never before, and then both
/// Sends arrive although the initiator never sent an FPDU.
#[test]
fn relaxed_responder_speaks_first_after_new_work_and_the_acked_reply() {
    let (mut p, src, dst1, dst2) = speak_first_pair(false);
    let seen = responder_records(&mut p, 200);
    assert!(connected(&p.a.events) && connected(&p.b.events));
    assert_eq!(seen, [RecordKind::MpaFrame], "work posted earlier waits");
    // The reply was acknowledged in the steps above: new work lets it speak.
    let wr = speak_first_send(2, &src);
    p.b.hold_acks = true;
    p.b.ep.qp_mut().post_send(&wr, p.b.dev.mrs()).unwrap();
    let seen = responder_records(&mut p, 200);
    assert_eq!(
        seen,
        [RecordKind::Send, RecordKind::Send],
        "both Sends, in order"
    );
    p.b.hold_acks = false;
    p.run_until(500, |p| {
        p.a.completions.len() == 2 && p.b.completions.len() == 2
    });
    assert_eq!(p.a.bytes(&dst1), p.b.bytes(&src));
    assert_eq!(p.a.bytes(&dst2), p.b.bytes(&src));
    assert_eq!(p.a.records, 1, "the initiator sent only its request");
}

/// Relaxed, but the reply not yet acknowledged: new work waits for the
/// acknowledgement.
#[test]
fn relaxed_responder_waits_for_the_reply_to_be_acknowledged() {
    let (mut p, src, _, _) = speak_first_pair(false);
    p.b.hold_acks = true;
    let seen = responder_records(&mut p, 200);
    assert!(connected(&p.b.events));
    assert_eq!(seen, [RecordKind::MpaFrame]);
    let wr = speak_first_send(2, &src);
    p.b.ep.qp_mut().post_send(&wr, p.b.dev.mrs()).unwrap();
    let seen = responder_records(&mut p, 200);
    assert!(seen.is_empty(), "an FPDU before the reply's ack: {seen:?}");
    p.b.hold_acks = false;
    p.run_until(500, |p| p.a.completions.len() == 2);
}

/// Strict (RFC 5044 §7.1.1): new work after the connection still waits
/// for the initiator's first FPDU.
#[test]
fn strict_responder_never_speaks_first() {
    let (mut p, src, _, _) = speak_first_pair(true);
    let seen = responder_records(&mut p, 200);
    assert!(connected(&p.a.events) && connected(&p.b.events));
    let wr = speak_first_send(2, &src);
    p.b.ep.qp_mut().post_send(&wr, p.b.dev.mrs()).unwrap();
    let more = responder_records(&mut p, 300);
    assert_eq!(seen, [RecordKind::MpaFrame]);
    assert!(more.is_empty(), "the strict responder spoke: {more:?}");
    assert!(p.a.completions.is_empty());
    // The initiator's first FPDU (a zero-length Write) releases both.
    let wr = SendWr::write(3, SgeList::empty(), 0, rdmap::verbs::Stag(0x100));
    p.a.ep.qp_mut().post_send(&wr, p.a.dev.mrs()).unwrap();
    p.run_until(500, |p| p.a.completions.len() == 3);
}

/// A responder made before its queue pair exists: the request is gathered
/// and reported by the endpoint, and the queue pair comes with the accept.
fn awaiting_pair(seed: u64, setup: Setup, responder: Config) -> Pair {
    let mut p = Pair::new(seed, setup, 1460);
    let qp =
        p.b.dev
            .create_qp(engine_common::qp_attr(p.b.pd, &p.b.cq))
            .unwrap();
    p.b.ep = Endpoint::awaiting_request(responder, Duration::ZERO).unwrap();
    p.b.pending_qp = Some((qp, 2, 3));
    p
}

#[test]
fn a_responder_takes_its_queue_pair_with_the_accept() {
    let setup = Setup {
        ird: 8,
        ord: 8,
        ..Setup::default()
    };
    // The configuration the listener was made with offers more than the
    // accept allows; the accept's depths win.
    let mut p = awaiting_pair(7, setup, engine_common::config(&setup));
    assert!(p.b.ep.accept(b"x").is_err(), "nothing to accept yet");
    p.connect();
    assert!(
        p.b.pending_qp.is_none(),
        "the accept handed the queue pair over"
    );
    assert!(p.b.events.contains(&EngineEvent::ConnectRequest));
    let n = p.b.ep.negotiated().unwrap();
    assert_eq!((n.ird, n.ord), (2, 3));
    assert_eq!(p.b.ep.qp().state(), QpState::Rts);
    assert_eq!((p.b.ep.qp().ird(), p.b.ep.qp().ord()), (2, 3));
    assert_eq!(p.a.ep.negotiated().unwrap().ord, 2, "capped at our IRD");
    // The accepted queue pair carries data.
    let mut rng = Rng::new(7);
    let src = p.a.buffer(300, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let dst = p.b.buffer(300, 0x2000, Access::LOCAL_WRITE, None);
    p.b.ep
        .qp_mut()
        .post_recv(&RecvWr {
            wr_id: 5,
            sges: SgeList::single(Sge {
                addr: dst.va,
                length: 300,
                lkey: dst.stag,
            }),
        })
        .unwrap();
    let wr = SendWr::send(
        1,
        SgeList::single(Sge {
            addr: src.va,
            length: 300,
            lkey: src.stag,
        }),
    );
    p.a.ep.qp_mut().post_send(&wr, p.a.dev.mrs()).unwrap();
    p.run_until(500, |p| p.b.completions.len() == 1);
    assert_eq!(p.b.completions[0].wr_id, 5);
    assert_eq!(p.b.bytes(&dst), p.a.bytes(&src));
}

#[test]
fn a_responder_refuses_what_it_cannot_take_before_asking() {
    let setup = Setup {
        markers: true,
        ..Setup::default()
    };
    let responder = Config {
        markers_accepted: false,
        ..engine_common::config(&Setup::default())
    };
    let mut p = awaiting_pair(8, setup, responder);
    p.run_until(500, |p| {
        p.b.events
            .iter()
            .any(|e| matches!(e, EngineEvent::Rejected(_)))
    });
    assert!(
        !p.b.events.contains(&EngineEvent::ConnectRequest),
        "the application is not asked about a request MPA refuses"
    );
    assert!(matches!(
        p.b.events.iter().find(|e| matches!(e, EngineEvent::Rejected(_))),
        Some(EngineEvent::Rejected(r)) if r.reason == RejectReason::MarkersRefused
    ));
    assert!(p.b.pending_qp.is_some(), "the queue pair was never taken");
    let (qp, ..) = p.b.pending_qp.take().unwrap();
    assert!(p.b.ep.accept_on(qp, 1, 1, b"late").is_err());
}
