//! Bug reproductions of the real-time runtime tests, in virtual time on
//! the simulator: an application that changes a buffer before its
//! operation completes while TCP must resend it, the MPA initiator's nudge
//! of a silent responder, and a port whose transmit takes only part of
//! each burst. Each runs the real dataplanes, so a regression in the
//! worker's glue shows here exactly, every run the same.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use dataplane::api::{
    Access, CmEvent, ConnectParams, Cq, DisconnectReason, MemoryRegistration, ProtectionDomain, Qp,
    QpOptions, RecvWr, Region, SendWr, SgeList, TerminateCause, TerminateOrigin, WcStatus,
    WorkCompletion,
};
use dataplane::Dataplane;
use dataplane_sim::world::PORT;
use dataplane_sim::{Scenario, World, WorldSpec};
use rdmap::mpa::CrcPolicy;
use tcp_sim::frame::peek_tcp;

/// Bytes of the operations: one FPDU in one segment.
const LEN: usize = 1000;

struct End {
    pd: ProtectionDomain,
    cq: Cq,
    qp: Qp,
}

fn end(dp: &Dataplane) -> End {
    let pd = dp.alloc_pd().unwrap();
    let cq = dp.create_cq(256).unwrap();
    let qp = dp.create_qp(pd, &cq, &cq, QpOptions::default()).unwrap();
    End { pd, cq, qp }
}

fn buffer(dp: &Dataplane, pd: ProtectionDomain, fill: u8) -> (Region, MemoryRegistration) {
    let region = Region::from_vec(vec![fill; LEN]).unwrap();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = dp.reg_mr(pd, &region, 0, LEN, rw).unwrap();
    (region, mr)
}

fn connected(spec: &WorldSpec) -> (World, [End; 2]) {
    let mut w = World::new(spec).unwrap();
    let ends = [end(w.dp(0)), end(w.dp(1))];
    w.dp(1).listen(PORT, 4).unwrap();
    w.connect([&ends[0].qp, &ends[1].qp], &ConnectParams::default())
        .unwrap();
    (w, ends)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Read,
    Send,
}

struct Changed {
    status: WcStatus,
    ended: [Option<DisconnectReason>; 2],
    got: Vec<u8>,
    after: Duration,
    source_changed: u64,
}

/// Posts `op` of [`LEN`] bytes from side A, drops the first frame that
/// carries its data, changes the source bytes, and runs until the
/// operation has completed and (when `expect_end`) both sides reported
/// the end of the connection.
fn changed_buffer(crc: CrcPolicy, op: Op, expect_end: bool) -> Changed {
    changed_buffer_on(crc, op, expect_end, false)
}

/// [`changed_buffer`]; with `copy_tx`, both ports copy payload into their
/// frames (the CRC computed in the copy's pass at transmit).
fn changed_buffer_on(crc: CrcPolicy, op: Op, expect_end: bool, copy_tx: bool) -> Changed {
    let mut spec = WorldSpec::new(3);
    spec.copy_tx = [copy_tx, copy_tx];
    spec.mpa[0].crc = crc;
    spec.mpa[1].crc = crc;
    let (mut w, ends) = connected(&spec);
    let source_side = if op == Op::Read { 1 } else { 0 };
    let (src, src_mr) = buffer(w.dp(source_side), ends[source_side].pd, 0x11);
    let (dst, dst_mr) = buffer(w.dp(1 - source_side), ends[1 - source_side].pd, 0);
    let dropped = Rc::new(Cell::new(0u32));
    let d = dropped.clone();
    let dir = if source_side == 0 {
        w.link().forward
    } else {
        w.link().backward
    };
    w.net().set_drop_filter(
        dir,
        Some(Box::new(move |_, frame: &[u8]| {
            let data = frame.len() >= LEN && d.get() == 0;
            if data {
                d.set(1);
            }
            data
        })),
    );
    let wr = match op {
        Op::Write => SendWr::write(
            1,
            SgeList::single(src_mr.sge(0, LEN as u32)),
            dst_mr.addr(),
            dst_mr.rkey(),
        ),
        Op::Read => SendWr::read(1, dst_mr.sge(0, LEN as u32), src_mr.addr(), src_mr.rkey()),
        Op::Send => {
            ends[1]
                .qp
                .post_recv(&RecvWr {
                    wr_id: 1,
                    sges: SgeList::single(dst_mr.sge(0, LEN as u32)),
                })
                .unwrap();
            SendWr::send(1, SgeList::single(src_mr.sge(0, LEN as u32)))
        }
    };
    ends[0].qp.post_send(&wr).unwrap();
    w.run_until(
        "the first transmission dropped",
        Duration::from_secs(5),
        |_, _, _| Ok(dropped.get() == 1),
    )
    .unwrap();
    // The application breaks the verbs' contract: the source changes
    // while its segment waits for retransmission.
    src.write(0, &[0x99; LEN]).unwrap();
    let changed_at = w.now();
    let mut status = None;
    let mut recv_done = op != Op::Send;
    let mut ended = [None, None];
    let cqs = [&ends[0].cq, &ends[1].cq];
    w.run_until(
        "the operation to finish",
        Duration::from_secs(60),
        |a, b, _| {
            for (i, dp) in [a, b].into_iter().enumerate() {
                while let Some(wc) = cqs[i].poll_one() {
                    let wc: WorkCompletion = wc;
                    if i == 0 {
                        status = Some(wc.status);
                    } else {
                        recv_done = true;
                    }
                }
                while let Some(e) = dp.poll_event() {
                    match e {
                        CmEvent::Disconnected { reason, .. } => ended[i] = Some(reason),
                        CmEvent::MrDeregistered(_) => {}
                        other => return Err(format!("side {i}: {other:?}")),
                    }
                }
            }
            Ok(status.is_some()
                && recv_done
                && (!expect_end || (ended[0].is_some() && ended[1].is_some())))
        },
    )
    .unwrap();
    let after = w.now() - changed_at;
    let source_changed = w.dp(source_side).stats()[0].tx_payload_changed;
    Changed {
        status: status.unwrap(),
        ended,
        got: dst.to_vec(0, LEN).unwrap(),
        after,
        source_changed,
    }
}

fn crc_terminate(detector: usize) -> [Option<DisconnectReason>; 2] {
    let t = |origin| {
        Some(DisconnectReason::Terminated {
            cause: Some(TerminateCause::MPA_CRC),
            origin,
        })
    };
    let mut out = [t(TerminateOrigin::Peer), t(TerminateOrigin::Peer)];
    out[detector] = t(TerminateOrigin::Local);
    out
}

#[test]
fn a_changed_write_ends_in_the_crc_terminate() {
    let c = changed_buffer(CrcPolicy::Requested, Op::Write, true);
    assert_eq!(c.ended, crc_terminate(1));
    assert!(c.source_changed >= 1);
    assert!(matches!(
        c.status,
        WcStatus::Success | WcStatus::WrFlushError
    ));
    assert!(c.after < Duration::from_secs(2), "{:?}", c.after);
    // After a Terminate the sink's bytes are undefined, but never torn.
    assert!(c.got == vec![0x99; LEN] || c.got == vec![0x11; LEN]);
}

#[test]
fn a_changed_write_ends_in_the_crc_terminate_on_a_copying_port() {
    // The first transmission's CRC goes out again with the changed bytes.
    let c = changed_buffer_on(CrcPolicy::Requested, Op::Write, true, true);
    assert_eq!(c.ended, crc_terminate(1));
    assert!(c.source_changed >= 1);
    assert!(c.got == vec![0x99; LEN] || c.got == vec![0x11; LEN]);
}

#[test]
fn a_changed_send_ends_in_the_crc_terminate() {
    let c = changed_buffer(CrcPolicy::Requested, Op::Send, true);
    assert_eq!(c.ended, crc_terminate(1));
    assert!(c.source_changed >= 1);
    assert!(c.after < Duration::from_secs(2), "{:?}", c.after);
}

#[test]
fn a_changed_read_source_ends_in_the_crc_terminate() {
    let c = changed_buffer(CrcPolicy::Requested, Op::Read, true);
    // The responder's Read Response carried the change: A detects it.
    assert_eq!(c.ended, crc_terminate(0));
    assert_eq!(c.status, WcStatus::WrFlushError);
    assert!(c.source_changed >= 1);
    assert!(c.after < Duration::from_secs(2), "{:?}", c.after);
}

#[test]
fn without_the_crc_a_changed_buffer_completes() {
    for op in [Op::Write, Op::Send, Op::Read] {
        let c = changed_buffer(CrcPolicy::Off, op, false);
        assert_eq!(c.status, WcStatus::Success, "{op:?}");
        assert_eq!(c.ended, [None, None], "{op:?}");
        // TCP resent what the buffer held then.
        assert_eq!(c.got, vec![0x99; LEN], "{op:?}");
    }
}

/// TCP payload lengths of the frames from A to B after `from`.
fn payloads_a_to_b(w: &mut World, from: usize) -> Vec<usize> {
    let dir = w.link().forward;
    w.net().captured()[from..]
        .iter()
        .filter(|c| c.dir == dir)
        .filter_map(|c| peek_tcp(&c.frame))
        .map(|t| t.payload_len)
        .filter(|&n| n > 0)
        .collect()
}

fn nudge(nudge_ms: u64) -> Vec<usize> {
    let mut spec = WorldSpec::new(5);
    spec.mpa[0].nudge_ms = nudge_ms;
    let mut w = World::new(&spec).unwrap();
    w.net().enable_capture();
    let ends = [end(w.dp(0)), end(w.dp(1))];
    w.dp(1).listen(PORT, 4).unwrap();
    w.connect([&ends[0].qp, &ends[1].qp], &ConnectParams::default())
        .unwrap();
    let up = w.net().captured().len();
    w.idle(Duration::from_secs(2)).unwrap();
    let after = payloads_a_to_b(&mut w, up);
    // The connection still carries a Send from B.
    let (_src, src_mr) = buffer(w.dp(1), ends[1].pd, 0x42);
    let (dst, dst_mr) = buffer(w.dp(0), ends[0].pd, 0);
    ends[0]
        .qp
        .post_recv(&RecvWr {
            wr_id: 9,
            sges: SgeList::single(dst_mr.sge(0, LEN as u32)),
        })
        .unwrap();
    ends[1]
        .qp
        .post_send(&SendWr::send(9, SgeList::single(src_mr.sge(0, LEN as u32))))
        .unwrap();
    let mut got = 0;
    w.run_until("the Send", Duration::from_secs(5), |_, _, _| {
        while let Some(wc) = ends[0].cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success);
            got += 1;
        }
        Ok(got == 1)
    })
    .unwrap();
    assert_eq!(dst.to_vec(0, LEN).unwrap(), vec![0x42; LEN]);
    after
}

#[test]
fn the_nudge_is_one_zero_length_write_after_the_delay() {
    // Length field, 14-octet tagged header, CRC.
    assert_eq!(nudge(200), vec![2 + 14 + 4], "A's FPDUs after the RTR");
    assert_eq!(
        nudge(0),
        Vec::<usize>::new(),
        "nothing follows the RTR without the nudge"
    );
}

#[test]
fn a_port_taking_part_of_each_burst_still_carries_everything() {
    let mut ok = 0;
    for seed in 1000..1010 {
        let mut s = Scenario::from_seed(seed);
        s.world.tx_burst_max = 1 + (seed % 3) as usize;
        let o = s
            .run()
            .unwrap_or_else(|e| panic!("seed {seed}, burst {}: {e}", s.world.tx_burst_max));
        assert!(o.bytes_verified > 0);
        ok += 1;
    }
    assert_eq!(ok, 10);
}

/// A list of work requests longer than one iteration drains
/// (`Qp::post_send_list`, one doorbell for all of it): the worker takes
/// what one iteration takes and comes back for the rest by itself, all
/// within a few round trips of the link.
#[test]
fn a_long_posted_list_drains_in_a_few_round_trips() {
    const N: usize = 300;
    const SIZE: usize = 64;
    let (mut w, ends) = connected(&WorldSpec::new(5));
    let (_src, src_mr) = buffer(w.dp(0), ends[0].pd, 0x5a);
    let (dst, dst_mr) = buffer(w.dp(1), ends[1].pd, 0);
    let wrs: Vec<SendWr> = (0..N)
        .map(|k| {
            let off = ((k % (LEN / SIZE)) * SIZE) as u64;
            let mut wr = SendWr::write(
                k as u64,
                SgeList::single(src_mr.sge(off, SIZE as u32)),
                dst_mr.addr() + off,
                dst_mr.rkey(),
            );
            if k + 1 < N {
                wr.flags = dataplane::api::SendFlags::NONE;
            }
            wr
        })
        .collect();
    // The queue takes 256: post in two lists.
    ends[0].qp.post_send_list(&wrs[..200]).unwrap();
    let start = w.now();
    let mut posted = 200;
    let mut done = None;
    w.run_until(
        "the last WRITE's completion",
        Duration::from_secs(5),
        |_, _, now| {
            if posted < N && ends[0].qp.post_send_list(&wrs[posted..]).is_ok() {
                posted = N;
            }
            if let Some(wc) = ends[0].cq.poll_one() {
                assert_eq!((wc.wr_id, wc.status), (N as u64 - 1, WcStatus::Success));
                done = Some(now - start);
            }
            Ok(done.is_some())
        },
    )
    .unwrap();
    let took = done.unwrap();
    let mut got = vec![0u8; LEN];
    dst.read(0, &mut got).unwrap();
    assert!(got[..SIZE * (LEN / SIZE)].iter().all(|&b| b == 0x5a));
    // A few round trips of the link, far less than one delayed ACK.
    assert!(
        took < Duration::from_millis(10),
        "{N} WRITEs took {took:?} of virtual time"
    );
}
