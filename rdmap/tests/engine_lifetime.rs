//! A region stays alive while an unacknowledged FPDU refers to it (RFC 5040
//! §5.3 remote invalidation, with the memory-lifetime rule of the design):
//! Read Response FPDUs still unacknowledged (retransmittable) after their
//! source was invalidated by the peer's Send with Invalidate keep it
//! pinned, can be rebuilt byte for byte, new Read Requests naming the STag
//! are refused with a Terminate, and deregistration completes only when
//! TCP has acknowledged them.

mod engine_common;

use engine_common::{Pair, Rng, Setup};
use rdmap::engine::{EngineEvent, RecordKind, TerminateOrigin};
use rdmap::error::TerminateCause;
use rdmap::verbs::{
    Access, DeregStatus, MrEvent, MrState, RecvWr, RegOptions, SendOp, SendWr, Sge, SgeList,
    WcOpcode, WcStatus,
};

const LEN: usize = 8000;

#[test]
fn read_response_outlives_remote_invalidation() {
    let mut p = Pair::new(77, Setup::default(), 1460);
    let mut rng = Rng::new(77);
    let lw = Access::LOCAL_WRITE;
    let x = p.b.buffer_with(
        LEN,
        0x4000_0000,
        lw | Access::REMOTE_READ,
        RegOptions {
            invalidatable: true,
        },
        Some(&mut rng),
    );
    let rbuf = p.b.buffer(64, 0x5000_0000, lw, None);
    let sink = p.a.buffer(LEN, 0x6000_0000, lw, None);
    let sink2 = p.a.buffer(LEN, 0x6800_0000, lw, None);
    let msg = p.a.buffer(16, 0x7000_0000, lw, Some(&mut rng));
    p.connect();
    p.run_until(100, |p| p.a.is_idle() && p.b.is_idle());

    // The responder's Read Response FPDUs stay unacknowledged.
    p.b.hold_acks = true;
    p.b.log = Some(Vec::new());
    let read = SendWr::read(
        1,
        Sge {
            addr: sink.va,
            length: LEN as u32,
            lkey: sink.stag,
        },
        x.va,
        x.stag,
    );
    p.a.ep.qp_mut().post_send(&read, p.a.dev.mrs()).unwrap();
    p.run_until(1000, |p| p.a.completions.len() == 1);
    assert_eq!(p.a.completions[0].opcode, WcOpcode::RdmaRead);
    assert_eq!(p.a.bytes(&sink), p.b.bytes(&x));
    let responses =
        p.b.unacked
            .iter()
            .filter(|(r, _)| r.kind() == RecordKind::ReadResponse)
            .count();
    assert!(
        responses >= LEN / 1460,
        "{responses} Read Response FPDUs held"
    );

    // The peer invalidates the source with a Send with Invalidate.
    p.b.ep
        .qp_mut()
        .post_recv(&RecvWr {
            wr_id: 50,
            sges: SgeList::single(Sge {
                addr: rbuf.va,
                length: 64,
                lkey: rbuf.stag,
            }),
        })
        .unwrap();
    let inv = SendWr {
        wr_id: 2,
        op: SendOp::SendWithInvalidate { invalidate: x.stag },
        sges: SgeList::single(Sge {
            addr: msg.va,
            length: 16,
            lkey: msg.stag,
        }),
        flags: rdmap::verbs::SendFlags::SIGNALED,
    };
    p.a.ep.qp_mut().post_send(&inv, p.a.dev.mrs()).unwrap();
    p.run_until(1000, |p| {
        !p.b.completions.is_empty() && p.a.completions.len() == 2
    });
    let wc = p.b.completions[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.invalidated_stag),
        (50, WcStatus::Success, Some(x.stag))
    );
    let info = p.b.dev.mrs().query_mr(x.stag).unwrap();
    assert_eq!(info.state, MrState::Invalid);
    assert_eq!(
        info.pins as usize, responses,
        "one pin per unacknowledged FPDU"
    );

    // Each unacknowledged Read Response can be rebuilt (retransmitted)
    // from the invalidated region, byte for byte.
    let log = p.b.log.take().unwrap();
    for (r, _) in p.b.unacked.iter() {
        if r.kind() != RecordKind::ReadResponse {
            continue;
        }
        let again = r.to_vec(&p.b.mem);
        let first = log
            .iter()
            .find(|(end, _)| *end == r.end_offset())
            .map(|(_, b)| b)
            .unwrap();
        assert_eq!(&again, first);
    }

    // The application deregisters: pending while the FPDUs pin it.
    assert_eq!(p.b.dev.dereg_mr(x.stag), Ok(DeregStatus::Pending));
    assert_eq!(
        p.b.dev.mrs().query_mr(x.stag).unwrap().state,
        MrState::Deregistering
    );
    assert_eq!(p.b.dev.mrs_mut().poll_event(), None);

    // A new Read of the STag is refused: the stream ends with the cause.
    let read2 = SendWr::read(
        3,
        Sge {
            addr: sink2.va,
            length: 100,
            lkey: sink2.stag,
        },
        x.va,
        x.stag,
    );
    p.a.ep.qp_mut().post_send(&read2, p.a.dev.mrs()).unwrap();
    p.run_until(1000, |p| {
        p.a.events
            .iter()
            .any(|e| matches!(e, EngineEvent::Terminated { .. }))
    });
    assert!(p.b.events.contains(&EngineEvent::Terminated {
        cause: Some(TerminateCause::RDMAP_PROT_INVALID_STAG),
        origin: TerminateOrigin::Local
    }));
    assert!(p.a.events.contains(&EngineEvent::Terminated {
        cause: Some(TerminateCause::RDMAP_PROT_INVALID_STAG),
        origin: TerminateOrigin::Peer
    }));
    let failed = p.a.completions.iter().find(|c| c.wr_id == 3).unwrap();
    assert_eq!(failed.status, WcStatus::RemoteAccessError);
    assert!(p.a.bytes(&sink2).iter().all(|&b| b == 0));
    // Still pinned: the Read Responses are not acknowledged yet.
    assert_eq!(p.b.dev.mrs_mut().poll_event(), None);
    assert!(p.b.dev.mrs().query_mr(x.stag).is_some());

    // TCP acknowledges them: the deregistration completes.
    p.b.hold_acks = false;
    p.run_until(100, |p| p.b.unacked.is_empty());
    assert_eq!(
        p.b.dev.mrs_mut().poll_event(),
        Some(MrEvent::Deregistered(x.stag))
    );
    assert!(p.b.dev.mrs().query_mr(x.stag).is_none());
    p.b.check_guards();
}

#[test]
fn dropped_records_return_their_pins() {
    // The connection dies with FPDUs unacknowledged: the driver returns
    // them, and a pending deregistration completes.
    let mut p = Pair::new(78, Setup::default(), 1460);
    let mut rng = Rng::new(78);
    let lw = Access::LOCAL_WRITE;
    let src = p.a.buffer(LEN, 0x1000, lw, Some(&mut rng));
    let dst = p.b.buffer(LEN, 0x2000, lw | Access::REMOTE_WRITE, None);
    p.connect();
    p.a.hold_acks = true;
    let wr = SendWr::write(
        1,
        SgeList::single(Sge {
            addr: src.va,
            length: LEN as u32,
            lkey: src.stag,
        }),
        dst.va,
        dst.stag,
    );
    p.a.ep.qp_mut().post_send(&wr, p.a.dev.mrs()).unwrap();
    p.run_until(1000, |p| {
        p.a.pipe.is_empty() && p.b.bytes(&dst) == p.a.bytes(&src)
    });
    assert!(p.a.pins() > 0);
    assert_eq!(p.a.dev.dereg_mr(src.stag), Ok(DeregStatus::Pending));
    p.a.with_env(|ep, env| ep.handle_stream_closed(env));
    p.a.drop_records();
    assert_eq!(
        p.a.dev.mrs_mut().poll_event(),
        Some(MrEvent::Deregistered(src.stag))
    );
    p.a.drain();
    assert_eq!(p.a.completions.len(), 1);
    assert_eq!(p.a.completions[0].status, WcStatus::WrFlushError);
}
