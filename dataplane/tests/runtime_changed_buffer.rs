//! An application that changes the source buffer of a posted Write, Send
//! or (on the responder) of a Read before the operation completes, while
//! the link loses the first transmission so that TCP resends the segment
//! from the changed buffer. The verbs leave the data undefined; the
//! product must not hang.
//!
//! The in-memory port offloads no checksum, so the sender sums each
//! segment's payload itself. The first transmission uses the sum folded
//! into the record's MPA CRC pass; a retransmission sums the bytes again.
//! With the MPA CRC on, the resent segment passes the peer's TCP and fails
//! its CRC check: the peer sends a Terminate (MPA CRC error), both sides
//! report it and the connection ends, within a bounded wait; the sender's
//! counters show the bytes summed again and the change. With the CRC off,
//! the operation completes.

mod runtime_common;

use std::time::Instant;

use dataplane::api::{
    Access, CmEvent, Dataplane, DisconnectReason, DriveMode, QpStatus, TerminateCause,
    TerminateOrigin, WcStatus,
};
use dataplane::link::{MemLink, MemLinkConfig, MemLinkStatsHandle};
use dataplane::worker::WorkerStats;
use runtime_common::*;

/// One FPDU in one segment.
const LEN: usize = 1000;

/// Frames at least this long carry the operation's payload; acknowledgements
/// and Terminates are shorter.
const DATA_FRAME: usize = LEN;

struct Rig {
    p: Pair,
    /// a's and b's ends of the link.
    links: (MemLinkStatsHandle, MemLinkStatsHandle),
}

/// Two dataplanes asking for the MPA CRC or not, over a link with
/// multi-segment transmit (payload attached) or without (copied).
fn rig(crc: bool, multi_seg_tx: bool) -> Rig {
    let link = MemLinkConfig {
        multi_seg_tx,
        ..MemLinkConfig::default()
    };
    let (la, lb) = MemLink::pair(&link, MAC_A, MAC_B);
    let links = (la.stats_handle(), lb.stats_handle());
    let config = |ip, mac| {
        let mut c = dataplane::config::Config::single("mem:test", ip, mac);
        c.idle.spin = 200;
        c.idle.sleep_us = 20;
        c.mpa.crc = crc.into();
        c
    };
    let a = Dataplane::open_with_link(&config(IP_A, MAC_A), la, DriveMode::Inline).expect("open a");
    let b = Dataplane::open_with_link(&config(IP_B, MAC_B), lb, DriveMode::Inline).expect("open b");
    Rig {
        p: Pair { a, b },
        links,
    }
}

/// How a run ended.
struct Outcome {
    /// The initiator's completion of the operation.
    status: WcStatus,
    /// b's receive completion (a Send).
    recv: Option<WcStatus>,
    /// The data source's worker counters (a for Write and Send, b for
    /// Read).
    source: WorkerStats,
    /// Each side's Disconnected reason, if the connection ended.
    ended: (Option<DisconnectReason>, Option<DisconnectReason>),
    /// The destination's bytes, and the source's before and after the
    /// change.
    got: Vec<u8>,
    old: Vec<u8>,
    new: Vec<u8>,
}

/// Posts `op` of [`LEN`] bytes from a, loses the first transmission of
/// its data, overwrites the source, and pumps until the operation has
/// completed on a (and b for a Send) and, when `expect_end`, both sides
/// have reported the end of the connection.
fn run(crc: bool, op: Op, expect_end: bool) -> Outcome {
    run_on(crc, true, op, expect_end)
}

/// [`run`] over a link with or without multi-segment transmit.
fn run_on(crc: bool, multi_seg_tx: bool, op: Op, expect_end: bool) -> Outcome {
    run_sized(crc, multi_seg_tx, op, expect_end, LEN)
}

/// [`run_on`] with an operation of `len` bytes (its data frame at least
/// `len` long, longer than any acknowledgement).
fn run_sized(crc: bool, multi_seg_tx: bool, op: Op, expect_end: bool, len: usize) -> Outcome {
    let Rig { p, links } = rig(crc, multi_seg_tx);
    let (mut a, mut b) = connect_crc(&p, crc);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (src_dp, src_pd, dst_dp, dst_pd) = match op {
        Op::Read => (&p.b, b.pd, &p.a, a.pd),
        _ => (&p.a, a.pd, &p.b, b.pd),
    };
    let src = buffer(src_dp, src_pd, len, rw);
    let dst = buffer(dst_dp, dst_pd, len, rw);
    let old = src.fill_pattern(7);
    dst.region.fill(4096, len, 0).unwrap();
    let src_link = if op == Op::Read { &links.1 } else { &links.0 };
    src_link.lose_next(1, len);
    let len32 = len as u32;
    let id = 1;
    post_op(&a, &b, op, &src, &dst, len32, id);
    p.until("the first transmission lost", |_| {
        (src_link
            .get()
            .lost
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1)
            .then_some(())
    });
    // The application breaks the contract: the buffer changes while the
    // operation is outstanding and its segment waits for retransmission.
    let new = src.fill_pattern(0x0bad);
    assert_ne!(old, new);
    let start = Instant::now();
    let mut ended = (None, None);
    let (status, recv) = p.until("the operation to finish", |p| {
        a.drain();
        b.drain();
        for (dp, slot) in [(&p.a, &mut ended.0), (&p.b, &mut ended.1)] {
            while let Some(e) = dp.poll_event() {
                match e {
                    CmEvent::Disconnected { reason, .. } => *slot = Some(reason),
                    CmEvent::MrDeregistered(_) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        let done = a.seen.get(&id).map(|wc| wc.status);
        let recv = b.seen.get(&id).map(|wc| wc.status);
        let all = done.is_some()
            && (op != Op::Send || recv.is_some())
            && (!expect_end || (ended.0.is_some() && ended.1.is_some()));
        all.then(|| (done.unwrap(), recv))
    });
    println!(
        "{op:?} crc {crc}: finished {} ms after the change",
        start.elapsed().as_millis()
    );
    let source = src_dp.stats()[0];
    Outcome {
        status,
        recv,
        source,
        ended,
        got: dst.bytes(),
        old,
        new,
    }
}

/// The run ended with b's (`detector`'s) Terminate for the MPA CRC error,
/// on both sides.
fn assert_crc_terminate(o: &Outcome, detector_is_b: bool) {
    let crc = |origin| {
        Some(DisconnectReason::Terminated {
            cause: Some(TerminateCause::MPA_CRC),
            origin,
        })
    };
    let (on_a, on_b) = if detector_is_b {
        (TerminateOrigin::Peer, TerminateOrigin::Local)
    } else {
        (TerminateOrigin::Local, TerminateOrigin::Peer)
    };
    assert_eq!(o.ended.0, crc(on_a), "a's end");
    assert_eq!(o.ended.1, crc(on_b), "b's end");
}

/// The source re-summed the resent payload and saw it changed; the sums
/// folded into the CRC pass covered every first transmission.
fn assert_resummed(o: &Outcome) {
    assert_resummed_len(o, LEN);
}

/// [`assert_resummed`] for an operation of `len` bytes.
fn assert_resummed_len(o: &Outcome, len: usize) {
    let s = &o.source;
    println!(
        "source: tx_summed_bytes {}, tx_resummed_bytes {}, tx_payload_changed {}, terminates {}",
        s.tx_summed_bytes, s.tx_resummed_bytes, s.tx_payload_changed, s.terminates
    );
    assert!(s.tx_resummed_bytes >= len as u64, "{s:?}");
    assert!(s.tx_payload_changed >= 1, "{s:?}");
    assert_eq!(s.tx_summed_bytes, 0, "{s:?}");
    assert!(s.terminates >= 1, "{s:?}");
}

#[test]
fn a_write_changed_before_completion_ends_in_a_crc_terminate() {
    let o = run(true, Op::Write, true);
    assert_crc_terminate(&o, true);
    assert_resummed(&o);
    // A Write completes when TCP has it acknowledged, which the resent
    // segment was before b's MPA layer found the CRC wrong: the status may
    // be either.
    assert!(
        matches!(o.status, WcStatus::Success | WcStatus::WrFlushError),
        "{:?}",
        o.status
    );
    // The target's bytes are undefined: payload is placed before the CRC
    // that covers it arrives, and nothing completes on b.
    println!("write: completion {:?}", o.status);
}

/// A port without multi-segment transmit copies the payload into the
/// frame on each transmission instead of attaching it: the same.
#[test]
fn a_write_changed_on_a_copying_port_ends_in_a_crc_terminate() {
    let o = run_on(true, false, Op::Write, true);
    assert_crc_terminate(&o, true);
    assert_resummed(&o);
    println!("write on a copying port: completion {:?}", o.status);
}

/// The same with a small Write, whose record a copying port assembles
/// whole before it goes into the frame.
#[test]
fn a_small_write_changed_on_a_copying_port_ends_in_a_crc_terminate() {
    let o = run_sized(true, false, Op::Write, true, 100);
    assert_crc_terminate(&o, true);
    assert_resummed_len(&o, 100);
    println!("small write on a copying port: completion {:?}", o.status);
}

#[test]
fn a_send_changed_before_completion_ends_in_a_crc_terminate() {
    let o = run(true, Op::Send, true);
    assert_crc_terminate(&o, true);
    assert_resummed(&o);
    assert!(
        matches!(o.status, WcStatus::Success | WcStatus::WrFlushError),
        "{:?}",
        o.status
    );
    // The receive never completes with the damaged message.
    let recv = o.recv.expect("b's receive completion");
    assert_ne!(recv, WcStatus::Success);
    println!("send: completion {:?}, receive {recv:?}", o.status);
}

#[test]
fn a_read_source_changed_before_completion_ends_in_a_crc_terminate() {
    let o = run(true, Op::Read, true);
    // a, the requester, checks the Read Response's CRC.
    assert_crc_terminate(&o, false);
    assert_resummed(&o);
    // A Read completes only when its response has arrived: an error here.
    assert_ne!(o.status, WcStatus::Success);
    println!("read: completion {:?}", o.status);
}

/// Without the CRC nothing detects the change: the resent bytes are
/// placed and the operation completes (the data is undefined by the
/// verbs; here the loss took the whole first transmission, so the peer
/// holds one whole version of the buffer).
fn completes_without_crc(op: Op) {
    let o = run(false, op, false);
    assert_eq!(o.status, WcStatus::Success);
    if op == Op::Send {
        assert_eq!(o.recv, Some(WcStatus::Success));
    }
    assert!(o.got == o.new || o.got == o.old, "{op:?}: torn data");
    assert_eq!(o.ended, (None, None));
    // No sum was folded into a CRC pass: every transmission summed the
    // bytes it sent.
    let s = &o.source;
    println!(
        "{op:?} without CRC: tx_summed_bytes {}, tx_resummed_bytes {}, tx_payload_changed {}; \
         peer holds the {} bytes",
        s.tx_summed_bytes,
        s.tx_resummed_bytes,
        s.tx_payload_changed,
        if o.got == o.new { "new" } else { "old" }
    );
    assert!(s.tx_summed_bytes >= 2 * LEN as u64, "{s:?}");
    assert_eq!((s.tx_resummed_bytes, s.tx_payload_changed), (0, 0));
    assert_eq!(s.terminates, 0);
}

#[test]
fn without_crc_a_changed_write_completes() {
    completes_without_crc(Op::Write);
}

#[test]
fn without_crc_a_changed_send_completes() {
    completes_without_crc(Op::Send);
}

#[test]
fn without_crc_a_changed_read_source_completes() {
    completes_without_crc(Op::Read);
}

/// The connection stays usable when the application keeps its buffers
/// while a segment is lost: the resent segment's fresh sum matches.
#[test]
fn an_unchanged_buffer_resent_is_not_reported() {
    let Rig { p, links } = rig(true, true);
    let (mut a, mut b) = connect_crc(&p, true);
    links.0.lose_next(1, DATA_FRAME);
    let n = exchange(&p, &mut a, &mut b, Op::Write, LEN, 1);
    let s = p.a.stats()[0];
    println!(
        "unchanged: {n} bytes verified; tx_resummed_bytes {}, tx_payload_changed {}",
        s.tx_resummed_bytes, s.tx_payload_changed
    );
    assert_eq!(
        links
            .0
            .get()
            .lost
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert!(s.tx_resummed_bytes >= LEN as u64, "{s:?}");
    assert_eq!(s.tx_payload_changed, 0);
    assert_eq!(a.qp.status(), QpStatus::Connected);
}
