//! Orderly close of the QP engine (RFC 5040 §6.2's graceful termination,
//! the verbs' Closing state) over the pair harness, with TCP's FIN
//! modelled: a side's FIN reaches the peer once it has reported
//! ReadyToClose and every byte it sent before has been delivered.
//!
//! Checked: work posted before `disconnect` still goes out and completes,
//! new posts are refused, Read Requests the peer already sent are
//! answered, ReadyToClose comes only after every record is acknowledged,
//! the peer's FIN while closing is a normal close (no Terminate on the
//! wire, no Terminated event), receives left are flushed with
//! `WrFlushError`, the queue pairs end in Idle and every pin comes back;
//! and the abortive cases: a stream lost before the drain, the peer's
//! stream ending with our Read unanswered or inside a message.

mod engine_common;

use engine_common::{terminated, Buf, Pair, Rng, Setup, Side};
use rdmap::engine::{EngineEvent, TerminateOrigin};
use rdmap::error::TerminateCause;
use rdmap::mpa::RtrType;
use rdmap::verbs::{
    Access, PostError, QpState, RecvWr, SendFlags, SendWr, Sge, SgeList, VerbsError, WcOpcode,
    WcStatus, WorkCompletion,
};
use rdmap::wire::RdmapOpcode;

const MSS: usize = 1460;

fn sge(b: &Buf, off: usize, len: usize) -> SgeList {
    SgeList::single(Sge {
        addr: b.addr(off),
        length: len as u32,
        lkey: b.stag,
    })
}

fn recv(side: &mut Side, id: u64, b: &Buf, off: usize, len: usize) {
    side.ep
        .qp_mut()
        .post_recv(&RecvWr {
            wr_id: id,
            sges: sge(b, off, len),
        })
        .unwrap();
}

fn post(side: &mut Side, wr: SendWr) {
    let mrs = side.dev.mrs();
    side.ep.qp_mut().post_send(&wr, mrs).unwrap();
}

fn disconnect(side: &mut Side) -> Result<(), VerbsError> {
    let r = side.with_env(|ep, env| ep.disconnect(env));
    side.drain();
    r
}

/// Whether `side`'s FIN may go: it reported ReadyToClose and its stream
/// has been delivered.
fn fin_ready(side: &Side) -> bool {
    side.events.contains(&EngineEvent::ReadyToClose) && side.pipe.is_empty()
}

/// The FIN of `from` reaches `to`.
fn deliver_fin(to: &mut Side) {
    to.with_env(|ep, env| ep.handle_peer_closed(env));
    to.drain();
}

/// Steps, delivering each FIN when it may go, until both sides have
/// closed; then TCP reports the connection gone on both sides.
fn run_close(p: &mut Pair, fins: &mut [bool; 2], limit: u64) {
    for _ in 0..limit {
        if !fins[0] && fin_ready(&p.a) {
            fins[0] = true;
            deliver_fin(&mut p.b);
        }
        if !fins[1] && fin_ready(&p.b) {
            fins[1] = true;
            deliver_fin(&mut p.a);
        }
        if p.a.ep.is_closed() && p.b.ep.is_closed() && p.a.is_idle() && p.b.is_idle() {
            for s in [&mut p.a, &mut p.b] {
                s.with_env(|ep, env| ep.handle_stream_closed(env));
                s.drain();
            }
            return;
        }
        p.step();
    }
    panic!(
        "no orderly close after {limit} steps: {:?} / {:?}",
        p.a.events, p.b.events
    );
}

/// The normal end on one side: no Terminated event, ReadyToClose before
/// Closed, each once, the queue pair back in Idle, nothing more to send,
/// every pin returned.
fn assert_closed_in_order(s: &mut Side) {
    assert!(!terminated(&s.events), "{}: {:?}", s.name, s.events);
    let ready: Vec<_> = s
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| **e == EngineEvent::ReadyToClose)
        .map(|(i, _)| i)
        .collect();
    let closed: Vec<_> = s
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| **e == EngineEvent::Closed)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        (ready.len(), closed.len()),
        (1, 1),
        "{}: {:?}",
        s.name,
        s.events
    );
    assert!(ready[0] < closed[0], "{}", s.name);
    assert!(
        s.ep.is_closed() && !s.ep.is_closing() && !s.ep.is_terminated(),
        "{}",
        s.name
    );
    assert_eq!(s.ep.qp().state(), QpState::Idle, "{}", s.name);
    assert!(s.with_env(|ep, env| ep.poll_record(MSS, env)).is_none());
    assert_eq!(s.pins(), 0, "{}: pins", s.name);
    s.check_guards();
}

fn no_terminate_on_the_wire(s: &Side) {
    let terminate = usize::from(RdmapOpcode::Terminate.as_u4());
    assert_eq!(
        s.ep.stats().fpdus_out[terminate],
        0,
        "{}: a Terminate was sent",
        s.name
    );
}

fn statuses(c: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    c.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn pair(seed: u64, setup: Setup) -> Pair {
    let mut p = Pair::new(seed, setup, MSS);
    p.a.log = Some(Vec::new());
    p.b.log = Some(Vec::new());
    p.connect();
    p
}

#[test]
fn work_posted_before_disconnect_completes_then_both_sides_close() {
    for seed in 0..20u64 {
        let setup = Setup {
            crc: seed % 2 == 0,
            rtr: [None, Some(RtrType::Write), Some(RtrType::Read)][seed as usize % 3],
            ..Setup::default()
        };
        let mut p = pair(seed, setup);
        let mut rng = Rng::new(seed);
        let lw = Access::LOCAL_WRITE;
        let src =
            p.a.buffer(200_000, 0x10_0000, lw | Access::REMOTE_READ, Some(&mut rng));
        let sink = p.a.buffer(100_000, 0x20_0000, lw, None);
        let recv_a = p.a.buffer(4096, 0x30_0000, lw, None);
        let wbuf =
            p.b.buffer(100_000, 0x40_0000, lw | Access::REMOTE_WRITE, None);
        let rsrc =
            p.b.buffer(100_000, 0x50_0000, lw | Access::REMOTE_READ, Some(&mut rng));
        let recv_b = p.b.buffer(200_000, 0x60_0000, lw, None);
        // b: two receives for a's Sends, three more that stay unused.
        for i in 0..5 {
            recv(&mut p.b, 100 + i, &recv_b, 40_000 * i as usize, 40_000);
        }
        // a: two unused receives.
        recv(&mut p.a, 200, &recv_a, 0, 2048);
        recv(&mut p.a, 201, &recv_a, 2048, 2048);
        post(
            &mut p.a,
            SendWr::send(1, sge(&src, 0, 30_000)).with_flags(SendFlags::SIGNALED),
        );
        post(
            &mut p.a,
            SendWr::write(2, sge(&src, 30_000, 100_000), wbuf.va, wbuf.stag)
                .with_flags(SendFlags::SIGNALED),
        );
        post(
            &mut p.a,
            SendWr::read(
                3,
                Sge {
                    addr: sink.va,
                    length: 100_000,
                    lkey: sink.stag,
                },
                rsrc.va,
                rsrc.stag,
            )
            .with_flags(SendFlags::SIGNALED),
        );
        // Unsignalled: completes silently.
        post(
            &mut p.a,
            SendWr::send(4, sge(&src, 130_000, 1000)).with_flags(SendFlags::NONE),
        );
        post(
            &mut p.a,
            SendWr::send(5, sge(&src, 131_000, 0)).with_flags(SendFlags::SIGNALED),
        );
        // Let some of it go out, then close with the rest still queued.
        for _ in 0..(seed % 4) {
            p.step();
        }
        disconnect(&mut p.a).unwrap();
        assert_eq!(p.a.ep.qp().state(), QpState::Closing);
        assert!(p.a.ep.is_closing());
        let late = SendWr::send(9, sge(&src, 0, 8)).with_flags(SendFlags::SIGNALED);
        assert_eq!(
            p.a.ep.qp_mut().post_send(&late, p.a.dev.mrs()),
            Err(PostError::InvalidState),
            "no new work while closing"
        );
        disconnect(&mut p.a).unwrap(); // again: nothing changes

        let mut fins = [false, false];
        // Up to a's ReadyToClose, every request completed and every record
        // was acknowledged.
        p.run_until(20_000, |p| p.a.events.contains(&EngineEvent::ReadyToClose));
        assert_eq!(
            statuses(&p.a.completions),
            [
                (1, WcStatus::Success),
                (2, WcStatus::Success),
                (3, WcStatus::Success),
                (5, WcStatus::Success)
            ],
            "seed {seed}"
        );
        assert!(
            p.a.unacked.is_empty(),
            "seed {seed}: ReadyToClose with records in flight"
        );
        assert_eq!(p.a.ep.qp().sq_len(), 0);
        run_close(&mut p, &mut fins, 20_000);

        // The data arrived.
        let (a, b) = (&p.a, &p.b);
        assert!(b.bytes(&recv_b)[..30_000] == a.bytes(&src)[..30_000]);
        assert!(b.bytes(&recv_b)[40_000..41_000] == a.bytes(&src)[130_000..131_000]);
        assert!(b.bytes(&wbuf) == &a.bytes(&src)[30_000..130_000]);
        assert!(a.bytes(&sink) == b.bytes(&rsrc));
        // Receives: b's three filled, two flushed; a's both flushed.
        let b_recv: Vec<_> =
            p.b.completions
                .iter()
                .filter(|w| w.opcode == WcOpcode::Recv)
                .map(|w| (w.wr_id, w.status, w.byte_len))
                .collect();
        assert_eq!(
            b_recv,
            [
                (100, WcStatus::Success, 30_000),
                (101, WcStatus::Success, 1000),
                (102, WcStatus::Success, 0),
                (103, WcStatus::WrFlushError, 0),
                (104, WcStatus::WrFlushError, 0)
            ],
            "seed {seed}"
        );
        assert_eq!(
            statuses(&p.a.completions[4..]),
            [(200, WcStatus::WrFlushError), (201, WcStatus::WrFlushError)]
        );
        for s in [&mut p.a, &mut p.b] {
            assert_closed_in_order(s);
            no_terminate_on_the_wire(s);
        }
    }
}

#[test]
fn inbound_reads_are_answered_before_the_close() {
    // The responder closes while the initiator's Reads of it are queued.
    for seed in 0..10u64 {
        let mut p = pair(100 + seed, Setup::default());
        let mut rng = Rng::new(seed);
        let lw = Access::LOCAL_WRITE;
        let src = p.b.buffer(
            64 * 1024,
            0x1000_0000,
            lw | Access::REMOTE_READ,
            Some(&mut rng),
        );
        let sink = p.a.buffer(64 * 1024, 0x2000_0000, lw, None);
        for i in 0..4u64 {
            let off = 16 * 1024 * i as usize;
            post(
                &mut p.a,
                SendWr::read(
                    i,
                    Sge {
                        addr: sink.addr(off),
                        length: 16 * 1024,
                        lkey: sink.stag,
                    },
                    src.addr(off),
                    src.stag,
                ),
            );
        }
        p.run_until(5_000, |p| p.b.ep.qp().inbound_reads() > 0);
        disconnect(&mut p.b).unwrap();
        let mut fins = [false, false];
        p.run_until(20_000, |p| p.b.events.contains(&EngineEvent::ReadyToClose));
        assert_eq!(p.b.ep.qp().inbound_reads(), 0);
        run_close(&mut p, &mut fins, 20_000);
        assert_eq!(
            statuses(&p.a.completions),
            (0..4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(),
            "seed {seed}"
        );
        assert_eq!(p.a.bytes(&sink), p.b.bytes(&src));
        for s in [&mut p.a, &mut p.b] {
            assert_closed_in_order(s);
            no_terminate_on_the_wire(s);
        }
    }
}

#[test]
fn both_sides_closing_at_once_is_normal() {
    for seed in 0..10u64 {
        let mut p = pair(200 + seed, Setup::default());
        let mut rng = Rng::new(seed);
        let lw = Access::LOCAL_WRITE;
        let sa = p.a.buffer(50_000, 0x1000, lw, Some(&mut rng));
        let sb = p.b.buffer(50_000, 0x1000, lw, Some(&mut rng));
        let ra = p.a.buffer(50_000, 0x9000_0000, lw, None);
        let rb = p.b.buffer(50_000, 0x9000_0000, lw, None);
        recv(&mut p.a, 10, &ra, 0, 50_000);
        recv(&mut p.b, 10, &rb, 0, 50_000);
        post(
            &mut p.a,
            SendWr::send(1, sge(&sa, 0, 50_000)).with_flags(SendFlags::SIGNALED),
        );
        post(
            &mut p.b,
            SendWr::send(1, sge(&sb, 0, 50_000)).with_flags(SendFlags::SIGNALED),
        );
        disconnect(&mut p.a).unwrap();
        disconnect(&mut p.b).unwrap();
        let mut fins = [false, false];
        run_close(&mut p, &mut fins, 20_000);
        assert_eq!(p.b.bytes(&rb), p.a.bytes(&sa));
        assert_eq!(p.a.bytes(&ra), p.b.bytes(&sb));
        for s in [&mut p.a, &mut p.b] {
            let mut st = statuses(&s.completions);
            st.sort_unstable_by_key(|c| c.0);
            assert_eq!(
                st,
                [(1, WcStatus::Success), (10, WcStatus::Success)],
                "seed {seed}: {}",
                s.name
            );
            assert_closed_in_order(s);
            no_terminate_on_the_wire(s);
        }
    }
}

#[test]
fn connection_gone_after_the_drain_is_the_normal_end() {
    // A driver that reports the peer's FIN and the connection's end as one
    // event: handle_stream_closed once ReadyToClose was reported.
    let mut p = pair(300, Setup::default());
    let lw = Access::LOCAL_WRITE;
    let r = p.a.buffer(1000, 0x1000, lw, None);
    recv(&mut p.a, 7, &r, 0, 1000);
    disconnect(&mut p.a).unwrap();
    p.run_until(100, |p| p.a.events.contains(&EngineEvent::ReadyToClose));
    p.a.with_env(|ep, env| ep.handle_stream_closed(env));
    p.a.drain();
    assert_closed_in_order(&mut p.a);
    assert_eq!(statuses(&p.a.completions), [(7, WcStatus::WrFlushError)]);
    // Calls after the close change nothing.
    p.a.with_env(|ep, env| {
        ep.handle_peer_closed(env);
        ep.handle_stream_closed(env);
        ep.abort(TerminateCause::RDMAP_OP_CATASTROPHIC_GLOBAL, env);
        assert_eq!(ep.disconnect(env), Err(VerbsError::InvalidTransition));
    });
    p.a.drain();
    assert_eq!(
        p.a.events
            .iter()
            .filter(|e| !matches!(e, EngineEvent::Connected(_)))
            .count(),
        2,
        "{:?}",
        p.a.events
    );
    assert!(!p.a.ep.is_terminated());
}

#[test]
fn connection_gone_before_the_drain_is_abortive() {
    let mut p = pair(400, Setup::default());
    let lw = Access::LOCAL_WRITE;
    let src = p.a.buffer(100_000, 0x1000, lw, None);
    let dst = p.b.buffer(100_000, 0x8000, lw | Access::REMOTE_WRITE, None);
    post(
        &mut p.a,
        SendWr::write(1, sge(&src, 0, 100_000), dst.va, dst.stag).with_flags(SendFlags::SIGNALED),
    );
    p.a.hold_acks = true;
    p.step();
    disconnect(&mut p.a).unwrap();
    for _ in 0..20 {
        p.step();
    }
    assert!(
        !p.a.events.contains(&EngineEvent::ReadyToClose),
        "records unacknowledged"
    );
    p.a.drop_records();
    p.a.with_env(|ep, env| ep.handle_stream_closed(env));
    p.a.drain();
    assert!(p.a.events.contains(&EngineEvent::Terminated {
        cause: Some(TerminateCause::MPA_TCP_CLOSED),
        origin: TerminateOrigin::Stream
    }));
    assert!(!p.a.events.contains(&EngineEvent::Closed));
    assert_eq!(statuses(&p.a.completions), [(1, WcStatus::WrFlushError)]);
    assert_eq!(p.a.ep.qp().state(), QpState::Error);
    assert_eq!(p.a.pins(), 0);
}

#[test]
fn peer_fin_with_our_read_unanswered_is_an_error() {
    let mut p = pair(500, Setup::default());
    let lw = Access::LOCAL_WRITE;
    let sink = p.a.buffer(4096, 0x1000, lw, None);
    let src = p.b.buffer(4096, 0x8000, lw | Access::REMOTE_READ, None);
    post(
        &mut p.a,
        SendWr::read(
            1,
            Sge {
                addr: sink.va,
                length: 4096,
                lkey: sink.stag,
            },
            src.va,
            src.stag,
        )
        .with_flags(SendFlags::SIGNALED),
    );
    p.b.hold_output = true;
    p.run_until(100, |p| {
        p.a.ep.qp().outstanding_reads() == 1 && p.a.pipe.is_empty()
    });
    // The peer's FIN before its Read Response: the Read can never finish.
    deliver_fin(&mut p.a);
    assert!(p.a.events.contains(&EngineEvent::Terminated {
        cause: Some(TerminateCause::MPA_TCP_CLOSED),
        origin: TerminateOrigin::Stream
    }));
    assert_eq!(statuses(&p.a.completions), [(1, WcStatus::WrFlushError)]);
    assert!(!p.a.ep.is_closing());
}

#[test]
fn peer_fin_inside_a_message_is_an_error() {
    let mut p = pair(600, Setup::default());
    let lw = Access::LOCAL_WRITE;
    let src = p.a.buffer(10_000, 0x1000, lw, None);
    let r = p.b.buffer(10_000, 0x8000, lw, None);
    recv(&mut p.b, 1, &r, 0, 10_000);
    post(
        &mut p.a,
        SendWr::send(1, sge(&src, 0, 10_000)).with_flags(SendFlags::SIGNALED),
    );
    // Hand b the first FPDU of the Send only, then a's FIN.
    p.a.transmit(&mut p.rng, MSS, 64 * 1024);
    let delivered = p.a.delivered;
    let first =
        p.a.log
            .as_ref()
            .unwrap()
            .iter()
            .find(|(end, _)| *end > delivered)
            .unwrap()
            .1
            .len();
    assert!(p.a.pipe.len() > first);
    let head: Vec<u8> = p.a.pipe.drain(..first).collect();
    p.b.with_env(|ep, env| ep.handle_stream(core::time::Duration::ZERO, &head, env));
    deliver_fin(&mut p.b);
    assert!(p.b.events.contains(&EngineEvent::Terminated {
        cause: Some(TerminateCause::MPA_TCP_CLOSED),
        origin: TerminateOrigin::Stream
    }));
    assert_eq!(statuses(&p.b.completions), [(1, WcStatus::WrFlushError)]);
}

#[test]
fn disconnect_needs_a_healthy_stream() {
    // Before setup finished.
    let mut p = Pair::new(700, Setup::default(), MSS);
    assert_eq!(disconnect(&mut p.a), Err(VerbsError::InvalidTransition));
    assert_eq!(disconnect(&mut p.b), Err(VerbsError::InvalidTransition));
    p.connect();
    // After the stream ended abnormally.
    p.a.with_env(|ep, env| ep.abort(TerminateCause::RDMAP_OP_CATASTROPHIC_GLOBAL, env));
    p.a.drain();
    assert_eq!(disconnect(&mut p.a), Err(VerbsError::InvalidTransition));
    // A Terminate during the close makes it abortive: no Closed.
    let mut q = pair(701, Setup::default());
    disconnect(&mut q.b).unwrap();
    q.a.with_env(|ep, env| ep.abort(TerminateCause::RDMAP_OP_CATASTROPHIC_GLOBAL, env));
    q.run_until(100, |q| terminated(&q.b.events));
    assert!(!q.b.ep.is_closing());
    assert!(q.b.events.contains(&EngineEvent::Terminated {
        cause: Some(TerminateCause::RDMAP_OP_CATASTROPHIC_GLOBAL),
        origin: TerminateOrigin::Peer
    }));
    assert!(!q.b.events.contains(&EngineEvent::Closed));
}

#[test]
fn nothing_follows_ready_to_close() {
    // After ReadyToClose our FIN is on its way: a Read Request the peer
    // sent meanwhile is dropped at the close, never answered.
    let mut p = pair(800, Setup::default());
    let lw = Access::LOCAL_WRITE;
    let src = p.b.buffer(4096, 0x1000, lw | Access::REMOTE_READ, None);
    let sink = p.a.buffer(4096, 0x8000, lw, None);
    disconnect(&mut p.b).unwrap();
    p.run_until(100, |p| p.b.events.contains(&EngineEvent::ReadyToClose));
    let records = p.b.records;
    post(
        &mut p.a,
        SendWr::read(
            1,
            Sge {
                addr: sink.va,
                length: 4096,
                lkey: sink.stag,
            },
            src.va,
            src.stag,
        ),
    );
    p.run_until(100, |p| p.b.ep.qp().inbound_reads() == 1);
    for _ in 0..10 {
        p.step();
    }
    assert_eq!(p.b.records, records, "b sent after ReadyToClose");
    // b's FIN reaches a with a's Read unanswered: a's error, not b's.
    deliver_fin(&mut p.a);
    assert!(p.a.events.contains(&EngineEvent::Terminated {
        cause: Some(TerminateCause::MPA_TCP_CLOSED),
        origin: TerminateOrigin::Stream
    }));
    assert_eq!(statuses(&p.a.completions), [(1, WcStatus::WrFlushError)]);
    p.b.with_env(|ep, env| ep.handle_stream_closed(env));
    p.b.drain();
    assert!(p.b.events.contains(&EngineEvent::Closed));
    assert!(!terminated(&p.b.events));
    assert_eq!(p.b.ep.qp().inbound_reads(), 0);
    assert_eq!(p.b.pins(), 0, "the dropped Read's pin came back");
    assert_eq!(p.b.ep.qp().state(), QpState::Idle);
}

#[test]
fn fault_after_ready_to_close_sends_no_terminate() {
    // The responder drained and reported ReadyToClose; then a corrupted
    // FPDU arrives. The stream ends abnormally, but our FIN is out: no
    // Terminate follows it.
    let mut p = pair(900, Setup::default());
    disconnect(&mut p.b).unwrap();
    p.run_until(100, |p| p.b.events.contains(&EngineEvent::ReadyToClose));
    let records = p.b.records;
    // A 2-octet ULPDU (no pad) with a CRC that cannot match.
    let bad = [0x00, 0x02, 0x41, 0x43, 0xde, 0xad, 0xbe, 0xef];
    p.b.with_env(|ep, env| ep.handle_stream(core::time::Duration::ZERO, &bad, env));
    p.b.drain();
    assert!(p.b.events.contains(&EngineEvent::Terminated {
        cause: Some(TerminateCause::MPA_CRC),
        origin: TerminateOrigin::Local
    }));
    for _ in 0..10 {
        p.step();
    }
    assert_eq!(p.b.records, records);
    no_terminate_on_the_wire(&p.b);
    assert!(!p.b.ep.is_closing() && !p.b.ep.is_closed());
    assert_eq!(p.b.ep.qp().state(), QpState::Error);
}
