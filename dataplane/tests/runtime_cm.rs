//! Connection management between two dataplanes: reject with private
//! data, an active open refused by TCP, an abortive disconnect seen by
//! both sides with outstanding work flushed, a deregistration that waits
//! for the data already in flight, and a reset that gives that data's
//! memory back at once.

mod runtime_common;

use std::net::SocketAddrV4;

use dataplane::api::{
    Access, CmEvent, ConnectFailure, ConnectParams, Dataplane, DeregStatus, DisconnectReason,
    PostError, QpStatus, RecvWr, SendWr, SgeList, WcStatus,
};
use runtime_common::*;

fn event(p: &Pair, on_a: bool, what: &str) -> CmEvent {
    p.until(what, |p| {
        if on_a {
            p.a.poll_event()
        } else {
            p.b.poll_event()
        }
    })
}

#[test]
fn reject_carries_private_data_both_ways() {
    let p = Pair::new(&PairOptions::default());
    p.b.listen(PORT, 4).unwrap();
    let a = End::new(&p.a);
    let params = ConnectParams {
        private_data: b"may I?".to_vec(),
        ..ConnectParams::default()
    };
    p.a.connect(&a.qp, SocketAddrV4::new(IP_B, PORT), &params)
        .unwrap();
    let CmEvent::ConnectRequest(req) = event(&p, false, "request") else {
        panic!("expected a request");
    };
    assert_eq!(req.private_data, b"may I?");
    assert_eq!(req.ird, Some(16));
    p.b.reject(&req, b"no, thanks").unwrap();
    match event(&p, true, "rejection") {
        CmEvent::Rejected { qp, private_data } => {
            assert_eq!(qp, a.qp.num());
            assert_eq!(private_data, b"no, thanks");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(a.qp.status(), QpStatus::Disconnected);
    // The request is answered: a second answer finds nothing.
    assert!(p.b.reject(&req, b"").is_err());
    assert!(
        p.b.reject(&req, &[0; 253]).is_err(),
        "too much private data"
    );
}

#[test]
fn connect_to_a_closed_port_fails() {
    let p = Pair::new(&PairOptions::default());
    let a = End::new(&p.a);
    p.a.connect(&a.qp, SocketAddrV4::new(IP_B, 9), &ConnectParams::default())
        .unwrap();
    match event(&p, true, "failure") {
        CmEvent::ConnectFailed { qp, reason } => {
            assert_eq!(qp, a.qp.num());
            assert_eq!(reason, ConnectFailure::Refused);
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    // A QP is bound once.
    assert!(p
        .a
        .connect(&a.qp, SocketAddrV4::new(IP_B, 9), &ConnectParams::default())
        .is_err());
}

#[test]
fn abortive_disconnect_flushes_posted_work() {
    let p = Pair::new(&PairOptions::default());
    let (mut a, mut b) = connect(&p);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let buf = buffer(&p.b, b.pd, 4096, rw);
    for i in 0..3 {
        let r = RecvWr {
            wr_id: 500 + i,
            sges: SgeList::single(buf.mr.sge(0, 4096)),
        };
        b.qp.post_recv(&r).unwrap();
    }
    p.a.disconnect(&a.qp, true).unwrap();
    let mut seen = (None, None);
    p.until("both sides down", |p| {
        if let Some(CmEvent::Disconnected { reason, .. }) = p.a.poll_event() {
            seen.0 = Some(reason);
        }
        if let Some(CmEvent::Disconnected { reason, .. }) = p.b.poll_event() {
            seen.1 = Some(reason);
        }
        (seen.0.is_some() && seen.1.is_some()).then_some(())
    });
    assert_eq!(seen.0, Some(DisconnectReason::LocalAbort));
    assert!(
        matches!(
            seen.1,
            Some(DisconnectReason::Reset | DisconnectReason::Terminated { .. })
        ),
        "{:?}",
        seen.1
    );
    // The receives posted on b come back flushed, each once.
    p.until("flushed receives", |_| {
        b.drain();
        (b.seen.len() == 3).then_some(())
    });
    assert!(b
        .seen
        .values()
        .all(|wc| wc.status == WcStatus::WrFlushError));
    assert_eq!(a.qp.status(), QpStatus::Disconnected);
    let w = SendWr::send(1, SgeList::empty());
    assert_eq!(a.qp.post_send(&w), Err(PostError::InvalidState));
    a.drain();
}

/// Posts a 1 MiB Write `id` from a to b and runs only a's side a little:
/// its FPDUs are queued in TCP (and pinned), none acknowledged yet.
/// Returns the source and the sink.
fn queued_write(p: &Pair, a: &End, b: &End, id: u64) -> (Buf, Buf) {
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let src = buffer(&p.a, a.pd, 1 << 20, rw);
    let dst = buffer(&p.b, b.pd, 1 << 20, rw);
    src.fill_pattern(id);
    let w = SendWr::write(
        id,
        SgeList::single(src.mr.sge(0, 1 << 20)),
        dst.mr.addr(),
        dst.mr.rkey(),
    );
    a.qp.post_send(&w).unwrap();
    for _ in 0..3 {
        p.a.poll();
    }
    (src, dst)
}

#[test]
fn deregistration_waits_for_unacknowledged_data() {
    let p = Pair::new(&PairOptions::default());
    let (mut a, b) = connect(&p);
    let (src, _dst) = queued_write(&p, &a, &b, 77);
    let status = p.a.dereg_mr(&src.mr).unwrap();
    println!("deregistration with data in flight: {status:?}");
    assert_eq!(status, DeregStatus::Pending);
    let mut done = false;
    p.until("write completed and memory released", |p| {
        a.drain();
        while let Some(e) = p.a.poll_event() {
            match e {
                // The failed Write ends the stream with a local Terminate,
                // reported as soon as it is out.
                CmEvent::Disconnected {
                    reason: DisconnectReason::Terminated { .. },
                    ..
                } => {}
                e => {
                    assert_eq!(e, CmEvent::MrDeregistered(src.mr.lkey()));
                    done = true;
                }
            }
        }
        (done && a.seen.contains_key(&77)).then_some(())
    });
    // The STag died at once: the rest of the Write could not be read, so
    // it fails (deregistering memory under posted work is the
    // application's error), while the FPDUs already in flight kept the
    // memory until TCP was done with them.
    assert_eq!(a.seen[&77].status, WcStatus::LocalProtectionError);
}

/// A reset with FPDUs queued and unacknowledged in TCP: TCP gives them
/// up, the worker hands every one back to the engine, and nothing stays
/// pinned. The memory deregisters at once and the region comes back.
#[test]
fn a_reset_with_data_in_flight_leaves_nothing_pinned() {
    let p = Pair::new(&PairOptions::default());
    let (mut a, b) = connect(&p);
    let leaked_before = dataplane::worker::fpdu_records_leaked();
    let (src, _dst) = queued_write(&p, &a, &b, 78);
    assert!(p.a.stats().iter().map(|s| s.tx_packets).sum::<u64>() > 0);
    p.a.disconnect(&a.qp, true).unwrap();
    let start = std::time::Instant::now();
    let reason = loop {
        p.a.poll();
        match p.a.poll_event() {
            Some(CmEvent::Disconnected { reason, .. }) => break reason,
            Some(e) => panic!("unexpected {e:?}"),
            None => assert!(start.elapsed() < PATIENCE, "no disconnect on a"),
        }
    };
    assert_eq!(reason, DisconnectReason::LocalAbort);
    // The Write never completed: it is flushed.
    p.until("the write flushed", |_| {
        a.drain();
        a.seen.get(&78).copied()
    });
    assert_ne!(a.seen[&78].status, WcStatus::Success);
    // Every pin came back with the reset: nothing waits for TCP.
    assert_eq!(p.a.dereg_mr(&src.mr).unwrap(), DeregStatus::Done);
    assert_eq!(dataplane::worker::fpdu_records_leaked(), leaked_before);
    // Nothing else holds the region once frames still in the link have
    // let it go.
    let Buf { region, mr } = src;
    drop(mr);
    drop(a);
    p.until("the source region let go", |_| {
        (region.handles() == 1).then_some(())
    });
}

/// With several connections on the worker, disconnecting one ends that
/// one only (the worker finds it by the slot it was bound to): its peer
/// sees the close, and the others still carry data both ways after.
#[test]
fn disconnecting_one_of_several_ends_only_that_one() {
    let p = Pair::new(&PairOptions::default());
    p.b.listen(PORT, 16).unwrap();
    let mut ends: Vec<(End, End)> = (0..4).map(|_| open_conn(&p, true)).collect();
    let (gone_a, gone_b) = (ends[2].0.qp.num(), ends[2].1.qp.num());
    p.a.disconnect(&ends[2].0.qp, false).unwrap();
    // The events one side reported so far: only `gone`'s disconnect.
    let take = |dp: &Dataplane, gone, side: &str, seen: &mut Option<DisconnectReason>| {
        while let Some(e) = dp.poll_event() {
            match e {
                CmEvent::Disconnected { qp, reason } => {
                    assert_eq!(qp, gone, "{side}: {reason}");
                    *seen = Some(reason);
                }
                CmEvent::MrDeregistered(_) => {}
                other => panic!("{side}: unexpected {other:?}"),
            }
        }
    };
    let mut seen = (None, None);
    p.until("the one connection closed on both sides", |p| {
        take(&p.a, gone_a, "a", &mut seen.0);
        take(&p.b, gone_b, "b", &mut seen.1);
        (seen.0.is_some() && seen.1.is_some()).then_some(())
    });
    assert_eq!(seen.0, Some(DisconnectReason::Closed));
    assert_eq!(seen.1, Some(DisconnectReason::Closed));
    for (i, (a, b)) in ends.iter_mut().enumerate() {
        if i == 2 {
            continue;
        }
        assert_eq!(exchange(&p, a, b, Op::Write, 3000, 10 + i as u64), 3000);
        assert_eq!(exchange(&p, a, b, Op::Read, 3000, 20 + i as u64), 3000);
    }
    assert!(p.a.poll_event().is_none() && p.b.poll_event().is_none());
}
