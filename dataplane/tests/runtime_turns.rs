//! Connections build their records at their turn to send, not as far
//! ahead as their windows allow: with several busy connections, those
//! waiting for their turn hold one record queued each, and only the one
//! whose turn it is builds more (`WorkerStats::tx_records`, records built
//! and not yet acknowledged). Building every window's worth at once put
//! hundreds of thousands of records in flight with thousands of
//! connections.

mod runtime_common;

use dataplane::api::{Access, WcStatus};
use dataplane::worker::MAX_FPDUS_PER_POLL;
use runtime_common::*;

const CONNS: usize = 8;
const LEN: usize = 1 << 20;

#[test]
fn records_are_built_at_each_connections_turn() {
    let p = Pair::new(&PairOptions::default());
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut ends: Vec<(End, End, Buf, Buf)> = (0..CONNS)
        .map(|_| {
            let (a, b) = connect(&p);
            let src = buffer(&p.a, a.pd, LEN, rw);
            let dst = buffer(&p.b, b.pd, LEN, rw);
            (a, b, src, dst)
        })
        .collect();
    for (k, (_, _, src, _)) in ends.iter().enumerate() {
        src.fill_pattern(k as u64 + 1);
    }
    // Warm-up: every connection's congestion window opens far beyond a
    // turn's worth.
    for round in 0..2u64 {
        for (a, b, src, dst) in &ends {
            post_op(a, b, Op::Write, src, dst, LEN as u32, round);
        }
        for (a, _, _, _) in &mut ends {
            assert_eq!(wait_wc(&p, a, round).status, WcStatus::Success);
        }
    }
    for _ in 0..300 {
        p.pump();
    }
    assert_eq!(p.a.stats()[0].tx_records, 0, "all acknowledged");
    // Every connection has a megabyte to send; only the sender runs, for
    // two iterations. The sinks are cleared first: they hold the warm-up's
    // bytes, the same as these, and the check at the end must see these
    // placed (a Write completes on the ACK, maybe before placement).
    for (a, b, src, dst) in &ends {
        dst.region.fill(4096, LEN, 0).unwrap();
        post_op(a, b, Op::Write, src, dst, LEN as u32, 9);
    }
    let sent0 = p.a.stats()[0].tx_packets;
    p.a.poll();
    p.a.poll();
    let sent = p.a.stats()[0].tx_packets - sent0;
    let built = p.a.stats()[0].tx_records;
    println!("{CONNS} connections: {sent} frames sent, {built} records in flight");
    assert!(sent > 0, "nothing sent");
    // What was sent, one record each waiting for its turn, and the
    // current turn's building.
    let bound = sent + CONNS as u64 + MAX_FPDUS_PER_POLL as u64;
    assert!(
        built <= bound,
        "{built} records in flight after {sent} frames: built ahead of the turns (at most {bound})"
    );
    for (a, b, src, dst) in &mut ends {
        assert_eq!(wait_wc(&p, a, 9).status, WcStatus::Success);
        let want = src.bytes();
        wait_placed(&p, "the Writes", &want, || dst.bytes());
        assert!(dst.bytes() == want);
        b.drain();
    }
}
