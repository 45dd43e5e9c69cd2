//! Two QP engines over a byte stream cut at random points: SEND, RDMA
//! WRITE and RDMA READ of 0 B to 1 MiB in both directions, with 1448- and
//! 1460-octet segments, CRC on and off, markers on and off, and each
//! peer-to-peer RTR. Every byte of every region is checked, guards around
//! the regions stay untouched, every signalled request completes exactly
//! once and in order, unsignalled ones never do, and every pin comes back.

mod engine_common;

use engine_common::{connected, terminated, Buf, Pair, Setup, Side};
use rdmap::engine::{EngineEvent, RecordKind};
use rdmap::mpa::RtrType;
use rdmap::verbs::{
    Access, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge, SgeList, WcOpcode, WcStatus,
};

const SIZES: [usize; 6] = [0, 1, 1000, 1448, 65536, 1 << 20];

/// What one side asks of the other, and what must come of it.
struct Plan {
    /// Signalled requests, in posting order: (wr_id, opcode, length).
    expect_send_cq: Vec<(u64, WcOpcode, u32)>,
    /// Receives at the peer, in order: (wr_id, length).
    expect_recv: Vec<(u64, u32)>,
    /// (source side buffer, offset, destination buffer, offset, length):
    /// bytes that must be equal at the end. `true` = source is on the
    /// requesting side.
    copies: Vec<(bool, Buf, usize, Buf, usize, usize)>,
}

struct Bufs {
    src: Buf,
    recv: Buf,
    write: Buf,
    read: Buf,
}

fn layout(sizes: &[usize]) -> (Vec<usize>, usize) {
    let mut offs = Vec::new();
    let mut at = 0;
    for (i, s) in sizes.iter().enumerate() {
        offs.push(at);
        at += s + 3 * i + 1;
    }
    (offs, at)
}

fn make_bufs(side: &mut Side, rng: &mut engine_common::Rng, total: usize, base: u64) -> Bufs {
    let lw = Access::LOCAL_WRITE;
    Bufs {
        src: side.buffer(3 * total, base, lw | Access::REMOTE_READ, Some(rng)),
        recv: side.buffer(total, base + 0x1000_0000, lw, None),
        write: side.buffer(total, base + 0x2000_0000, lw | Access::REMOTE_WRITE, None),
        read: side.buffer(total, base + 0x3000_0000, lw, None),
    }
}

/// Posts, on `x`, a SEND, WRITE and READ per size towards `y`, and the
/// receives on `y`. Every fourth request is unsignalled; large Sends and
/// receives are split over two SGEs.
fn post_plan(
    x: &mut Side,
    xb: &Bufs,
    y: &mut Side,
    yb: &Bufs,
    sizes: &[usize],
    id_base: u64,
) -> Plan {
    let (offs, total) = layout(sizes);
    let mut plan = Plan {
        expect_send_cq: Vec::new(),
        expect_recv: Vec::new(),
        copies: Vec::new(),
    };
    let mut n = 0u64;
    for (i, &size) in sizes.iter().enumerate() {
        let off = offs[i];
        let len = size as u32;
        // SEND from src[off], into y.recv[off].
        let s_src = off;
        let sges = split(xb.src, s_src, size, i % 2 == 1);
        let rsges = split(yb.recv, off, size, i % 2 == 0);
        let rid = id_base + 1000 + i as u64;
        y.ep.qp_mut()
            .post_recv(&RecvWr {
                wr_id: rid,
                sges: rsges,
            })
            .unwrap();
        plan.expect_recv.push((rid, len));
        let wid = id_base + n;
        let flags = if n % 4 == 3 {
            SendFlags::NONE
        } else {
            SendFlags::SIGNALED
        };
        let wr = SendWr {
            wr_id: wid,
            op: SendOp::Send,
            sges,
            flags,
        };
        x.ep.qp_mut().post_send(&wr, x.dev.mrs()).unwrap();
        if flags == SendFlags::SIGNALED {
            plan.expect_send_cq.push((wid, WcOpcode::Send, len));
        }
        plan.copies.push((true, xb.src, s_src, yb.recv, off, size));
        n += 1;

        // WRITE from src[total + off] into y.write[off].
        let w_src = total + off;
        let wid = id_base + n;
        let flags = if n % 4 == 3 {
            SendFlags::NONE
        } else {
            SendFlags::SIGNALED
        };
        let wr = SendWr::write(
            wid,
            split(xb.src, w_src, size, false),
            yb.write.addr(off),
            yb.write.stag,
        )
        .with_flags(flags);
        x.ep.qp_mut().post_send(&wr, x.dev.mrs()).unwrap();
        if flags == SendFlags::SIGNALED {
            plan.expect_send_cq.push((wid, WcOpcode::RdmaWrite, len));
        }
        plan.copies.push((true, xb.src, w_src, yb.write, off, size));
        n += 1;

        // READ y.src[2 * total + off] into x.read[off].
        let r_src = 2 * total + off;
        let wid = id_base + n;
        let flags = if n % 4 == 3 {
            SendFlags::NONE
        } else {
            SendFlags::SIGNALED
        };
        let sink = Sge {
            addr: xb.read.addr(off),
            length: len,
            lkey: xb.read.stag,
        };
        let wr = SendWr::read(wid, sink, yb.src.addr(r_src), yb.src.stag).with_flags(flags);
        x.ep.qp_mut().post_send(&wr, x.dev.mrs()).unwrap();
        if flags == SendFlags::SIGNALED {
            plan.expect_send_cq.push((wid, WcOpcode::RdmaRead, len));
        }
        plan.copies.push((false, yb.src, r_src, xb.read, off, size));
        n += 1;
    }
    plan
}

/// One SGE, or two when `two` and there are at least two bytes.
fn split(buf: Buf, off: usize, len: usize, two: bool) -> SgeList {
    let sge = |o: usize, l: usize| Sge {
        addr: buf.addr(o),
        length: l as u32,
        lkey: buf.stag,
    };
    if two && len >= 2 {
        let h = len / 3;
        SgeList::new(&[sge(off, h), sge(off + h, len - h)]).unwrap()
    } else {
        SgeList::single(sge(off, len))
    }
}

fn check_plan(x: &Side, y: &Side, plan: &Plan, what: &str) {
    let send: Vec<_> = x
        .completions
        .iter()
        .filter(|c| c.opcode != WcOpcode::Recv)
        .map(|c| (c.wr_id, c.opcode, c.byte_len))
        .collect();
    for c in &x.completions {
        assert_eq!(c.status, WcStatus::Success, "{what}: {c:?}");
    }
    assert_eq!(
        send, plan.expect_send_cq,
        "{what}: send completions of {}",
        x.name
    );
    let recv: Vec<_> = y
        .completions
        .iter()
        .filter(|c| c.opcode == WcOpcode::Recv)
        .map(|c| (c.wr_id, c.byte_len))
        .collect();
    assert_eq!(recv, plan.expect_recv, "{what}: receives of {}", y.name);
    for &(src_is_x, src, soff, dst, doff, len) in &plan.copies {
        let (s, d) = if src_is_x { (x, y) } else { (y, x) };
        let a = &s.bytes(&src)[soff..soff + len];
        let b = &d.bytes(&dst)[doff..doff + len];
        assert!(
            a == b,
            "{what}: {len} bytes from {} to {} differ",
            s.name,
            d.name
        );
    }
}

fn run(seed: u64, setup: Setup, mss: usize, sizes: &[usize]) -> Pair {
    run_with(seed, setup, mss, sizes, false)
}

/// [`run`], with both sides' memory saying whether the driver computes
/// the CRC of FPDUs ([`Placement::crc_at_transmit`]).
fn run_with(seed: u64, setup: Setup, mss: usize, sizes: &[usize], crc_at_transmit: bool) -> Pair {
    let what = format!("seed {seed} mss {mss} {setup:?} crc at transmit {crc_at_transmit}");
    let mut p = Pair::new(seed, setup, mss);
    p.a.mem.set_crc_at_transmit(crc_at_transmit);
    p.b.mem.set_crc_at_transmit(crc_at_transmit);
    let (_, total) = layout(sizes);
    let mut rng = engine_common::Rng::new(seed * 7 + 1);
    let ab = make_bufs(&mut p.a, &mut rng, total, 0x7f00_0000_0000);
    let bb = make_bufs(&mut p.b, &mut rng, total, 0x5500_0000_0000);
    // Work is posted before the connection exists; it starts once it is.
    let plan_a = post_plan(&mut p.a, &ab, &mut p.b, &bb, sizes, 1);
    let plan_b = post_plan(&mut p.b, &bb, &mut p.a, &ab, sizes, 1 << 32);
    let want_a = plan_a.expect_send_cq.len() + plan_b.expect_recv.len();
    let want_b = plan_b.expect_send_cq.len() + plan_a.expect_recv.len();
    p.run_until(200_000, |p| {
        assert!(!terminated(&p.a.events), "{what}: {:?}", p.a.events);
        assert!(!terminated(&p.b.events), "{what}: {:?}", p.b.events);
        p.a.completions.len() >= want_a
            && p.b.completions.len() >= want_b
            && p.a.is_idle()
            && p.b.is_idle()
    });
    // A few idle rounds: nothing more may complete.
    for _ in 0..20 {
        p.step();
    }
    assert!(connected(&p.a.events) && connected(&p.b.events));
    let n = p.a.ep.negotiated().unwrap();
    assert_eq!(n.rtr, setup.rtr, "{what}");
    assert_eq!(n.framing.crc, setup.crc, "{what}");
    assert_eq!(n.framing.markers_tx, setup.markers, "{what}");
    check_plan(&p.a, &p.b, &plan_a, &what);
    check_plan(&p.b, &p.a, &plan_b, &what);
    assert_eq!(p.a.completions.len(), want_a, "{what}: extra completions");
    assert_eq!(p.b.completions.len(), want_b, "{what}: extra completions");
    for s in [&p.a, &p.b] {
        s.check_guards();
        assert_eq!(s.pins(), 0, "{what}: {} holds pins", s.name);
        assert_eq!(s.ep.qp().state(), QpState::Rts);
        assert_eq!(s.ep.qp().sq_len(), 0);
        assert_eq!(s.ep.qp().inbound_reads(), 0);
    }
    p
}

#[test]
fn every_framing_and_rtr_every_size() {
    let mut seed = 1;
    for mss in [1448, 1460] {
        for crc in [true, false] {
            for markers in [false, true] {
                for rtr in [
                    None,
                    Some(RtrType::Send),
                    Some(RtrType::Write),
                    Some(RtrType::Read),
                ] {
                    let setup = Setup {
                        crc,
                        markers,
                        rtr,
                        ..Setup::default()
                    };
                    let p = run(seed, setup, mss, &SIZES);
                    // FPDUs are cut to the segment: three mebibytes and
                    // more each way take at least that many records.
                    assert!(p.a.records > (3 << 20) / mss as u64);
                    assert!(p.b.records > (3 << 20) / mss as u64);
                    // With the CRC on, the payload's checksum sum comes from
                    // its pass (checked against the bytes by the harness);
                    // a marker inside the payload leaves it to the driver.
                    for s in [&p.a, &p.b] {
                        if crc && !markers {
                            assert!(s.payload_sums > (3 << 20) / mss as u64);
                        } else if !crc {
                            assert_eq!(s.payload_sums, 0);
                        }
                    }
                    seed += 1;
                }
            }
        }
    }
}

#[test]
fn a_crc_left_to_the_driver_is_checked_by_the_peer() {
    // The engine leaves the CRC of FPDUs with payload to the driver where
    // the memory says so; the harness computes it over the octets before
    // the field, and the peer's deframer checks every one (a wrong CRC
    // would end the run in a Terminate). An FPDU with a marker inside
    // keeps it in the engine (most of them, with markers on).
    for (seed, markers) in [(41, false), (42, true)] {
        let setup = Setup {
            markers,
            ..Setup::default()
        };
        let p = run_with(seed, setup, 1448, &SIZES, true);
        for s in [&p.a, &p.b] {
            if markers {
                // FPDUs a marker cuts keep the engine's CRC pass (the
                // others are left to the driver).
                assert!(
                    s.payload_sums > 0 && s.crcs_at_transmit > 0,
                    "markers: {} engine CRCs with a payload sum, {} at transmit",
                    s.payload_sums,
                    s.crcs_at_transmit
                );
            } else {
                assert!(
                    s.crcs_at_transmit > (3 << 20) / 1448,
                    "{}",
                    s.crcs_at_transmit
                );
                assert_eq!(s.payload_sums, 0, "no CRC pass in the engine");
            }
        }
    }
}

#[test]
fn records_fill_the_offered_segment() {
    // A 64 KiB Write with markers and CRC: every FPDU but the last fills
    // the segment it was built for to within the 4-octet FPDU alignment.
    let setup = Setup {
        markers: true,
        ..Setup::default()
    };
    let mut p = Pair::new(9, setup, 1460);
    let mut rng = engine_common::Rng::new(9);
    let src =
        p.a.buffer(65536, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let dst = p.b.buffer(
        65536,
        0x9000_0000,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        None,
    );
    p.connect();
    let wr = SendWr::write(
        5,
        SgeList::single(Sge {
            addr: src.va,
            length: 65536,
            lkey: src.stag,
        }),
        dst.va,
        dst.stag,
    );
    p.a.ep.qp_mut().post_send(&wr, p.a.dev.mrs()).unwrap();
    let mut sizes = Vec::new();
    loop {
        let r = p.a.with_env(|ep, env| ep.poll_record(1460, env));
        let Some(r) = r else { break };
        assert_eq!(r.kind(), RecordKind::RdmaWrite);
        sizes.push(r.len());
        p.a.pipe.extend(r.to_vec(&p.a.mem));
        p.a.unacked.push_back((r, None));
    }
    let (last, full) = sizes.split_last().unwrap();
    assert!(*last <= 1460);
    for s in full {
        assert!((1457..=1460).contains(s), "FPDU of {s} octets");
    }
    p.run_until(10_000, |p| p.a.completions.len() == 1 && p.a.is_idle());
    assert_eq!(p.b.bytes(&dst), p.a.bytes(&src));
}

#[test]
fn write_completion_waits_for_an_earlier_read() {
    let mut p = Pair::new(42, Setup::default(), 1460);
    let mut rng = engine_common::Rng::new(42);
    let lw = Access::LOCAL_WRITE;
    let src_b =
        p.b.buffer(4096, 0x4000, lw | Access::REMOTE_READ, Some(&mut rng));
    let sink_a = p.a.buffer(4096, 0x8000, lw, None);
    let src_a = p.a.buffer(4096, 0xc000, lw, Some(&mut rng));
    let dst_b = p.b.buffer(4096, 0x10000, lw | Access::REMOTE_WRITE, None);
    p.connect();
    p.run_until(100, |p| p.a.is_idle() && p.b.is_idle());
    let read = SendWr::read(
        1,
        Sge {
            addr: sink_a.va,
            length: 4096,
            lkey: sink_a.stag,
        },
        src_b.va,
        src_b.stag,
    );
    let write = SendWr::write(
        2,
        SgeList::single(Sge {
            addr: src_a.va,
            length: 4096,
            lkey: src_a.stag,
        }),
        dst_b.va,
        dst_b.stag,
    );
    p.a.ep.qp_mut().post_send(&read, p.a.dev.mrs()).unwrap();
    p.a.ep.qp_mut().post_send(&write, p.a.dev.mrs()).unwrap();
    // The responder places the Write but its Read Responses are held back.
    p.b.hold_output = true;
    p.run_until(1000, |p| {
        p.a.is_idle() && p.b.bytes(&dst_b) == p.a.bytes(&src_a)
    });
    for _ in 0..50 {
        p.step();
    }
    // The Write's last byte is acknowledged, yet it has not completed.
    assert!(p.a.unacked.is_empty());
    assert!(p.a.completions.is_empty(), "{:?}", p.a.completions);
    p.b.hold_output = false;
    p.run_until(1000, |p| p.a.completions.len() == 2);
    let order: Vec<_> =
        p.a.completions
            .iter()
            .map(|c| (c.wr_id, c.opcode))
            .collect();
    assert_eq!(order, [(1, WcOpcode::RdmaRead), (2, WcOpcode::RdmaWrite)]);
    assert_eq!(p.a.bytes(&sink_a), p.b.bytes(&src_b));
}

#[test]
fn send_completes_only_when_acknowledged() {
    let mut p = Pair::new(7, Setup::default(), 1460);
    let mut rng = engine_common::Rng::new(7);
    let src =
        p.a.buffer(3000, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let dst = p.b.buffer(3000, 0x2000, Access::LOCAL_WRITE, None);
    p.connect();
    p.b.ep
        .qp_mut()
        .post_recv(&RecvWr {
            wr_id: 77,
            sges: SgeList::single(Sge {
                addr: dst.va,
                length: 3000,
                lkey: dst.stag,
            }),
        })
        .unwrap();
    let wr = SendWr::send(
        3,
        SgeList::single(Sge {
            addr: src.va,
            length: 3000,
            lkey: src.stag,
        }),
    );
    p.a.ep.qp_mut().post_send(&wr, p.a.dev.mrs()).unwrap();
    p.a.hold_acks = true;
    p.run_until(1000, |p| p.b.completions.len() == 1 && p.a.pipe.is_empty());
    for _ in 0..20 {
        p.step();
    }
    assert!(p.a.completions.is_empty(), "completed before its ACK");
    assert!(p.a.pins() > 0, "unacknowledged FPDUs keep their pins");
    p.a.hold_acks = false;
    p.run_until(100, |p| p.a.completions.len() == 1);
    assert_eq!(p.a.completions[0].wr_id, 3);
    assert_eq!(p.a.pins(), 0);
    assert_eq!(p.b.completions[0].byte_len, 3000);
    assert_eq!(p.b.bytes(&dst), p.a.bytes(&src));
}

#[test]
fn solicited_and_invalidate_sends_are_reported() {
    let mut p = Pair::new(11, Setup::default(), 1448);
    let mut rng = engine_common::Rng::new(11);
    let src = p.a.buffer(100, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let dst = p.b.buffer(200, 0x2000, Access::LOCAL_WRITE, None);
    let target = p.b.buffer_with(
        64,
        0x3000,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        rdmap::verbs::RegOptions {
            invalidatable: true,
        },
        None,
    );
    p.connect();
    for id in [1, 2, 3, 4] {
        p.b.ep
            .qp_mut()
            .post_recv(&RecvWr {
                wr_id: 100 + id,
                sges: SgeList::single(Sge {
                    addr: dst.va,
                    length: 200,
                    lkey: dst.stag,
                }),
            })
            .unwrap();
    }
    let sges = SgeList::single(Sge {
        addr: src.va,
        length: 100,
        lkey: src.stag,
    });
    let inv = SendOp::SendWithInvalidate {
        invalidate: target.stag,
    };
    for (id, op, flags) in [
        (1, SendOp::Send, SendFlags::SIGNALED),
        (2, SendOp::Send, SendFlags::SIGNALED | SendFlags::SOLICITED),
        (3, inv, SendFlags::SIGNALED),
    ] {
        let wr = SendWr {
            wr_id: id,
            op,
            sges,
            flags,
        };
        p.a.ep.qp_mut().post_send(&wr, p.a.dev.mrs()).unwrap();
    }
    p.run_until(1000, |p| {
        p.a.completions.len() == 3 && p.b.completions.len() == 3
    });
    let recv: Vec<_> =
        p.b.completions
            .iter()
            .map(|c| (c.wr_id, c.byte_len, c.solicited, c.invalidated_stag))
            .collect();
    assert_eq!(
        recv,
        [
            (101, 100, false, None),
            (102, 100, true, None),
            (103, 100, false, Some(target.stag)),
        ]
    );
    let info = p.b.dev.mrs().query_mr(target.stag).unwrap();
    assert_eq!(info.state, rdmap::verbs::MrState::Invalid);
    assert_eq!(p.a.ep.stats().fpdus_out[4], 1, "one Send with Invalidate");
    assert_eq!(p.b.ep.stats().fpdus_in[5], 1, "one Send with SE");
    assert!(!p
        .b
        .events
        .iter()
        .any(|e| matches!(e, EngineEvent::Terminated { .. })));
}
