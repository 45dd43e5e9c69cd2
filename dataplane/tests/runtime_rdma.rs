//! Two dataplanes in one process over an in-memory link: connect, then
//! RDMA WRITE, READ and SEND from 1 byte to 4 MiB, each verified byte for
//! byte, each signalled work request completed exactly once.

mod runtime_common;

use dataplane::api::{CmEvent, DisconnectReason, DriveMode};
use dataplane::link::MemLinkConfig;
use runtime_common::*;

const SIZES: [usize; 8] = [1, 3, 4096, 4097, 65_536, 100_003, 1 << 20, 4 << 20];

fn run_all(p: &Pair, label: &str) {
    let (mut a, mut b) = connect(p);
    let mut id = 1;
    for op in [Op::Write, Op::Read, Op::Send] {
        for len in SIZES {
            let n = exchange(p, &mut a, &mut b, op, len, id);
            println!("{label}: {op:?} {len} B: {n} bytes verified");
            id += 1;
        }
    }
    // Nothing completes twice, nothing extra appears.
    for _ in 0..200 {
        p.pump();
    }
    a.drain();
    b.drain();
    assert_eq!(a.seen.len(), 3 * SIZES.len());
    assert_eq!(b.seen.len(), SIZES.len(), "one receive per Send");
    // Orderly close: both sides see the connection end.
    p.a.disconnect(&a.qp, false).unwrap();
    let mut down = (false, false);
    p.until("both ends disconnected", |p| {
        for (dp, flag) in [(&p.a, &mut down.0), (&p.b, &mut down.1)] {
            while let Some(e) = dp.poll_event() {
                match e {
                    CmEvent::Disconnected { reason, .. } => {
                        assert!(
                            matches!(reason, DisconnectReason::Closed | DisconnectReason::Reset),
                            "{reason:?}"
                        );
                        *flag = true;
                    }
                    CmEvent::MrDeregistered(_) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        (down.0 && down.1).then_some(())
    });
    let s = p.a.stats()[0];
    println!("{label}: a's worker: {s:?}");
    assert!(s.tx_packets > 0 && s.rx_packets > 0);
}

#[test]
fn inline_one_worker_each() {
    let p = Pair::new(&PairOptions::default());
    run_all(&p, "inline");
    // The in-memory port offloads no checksum and the MPA CRC is on: every
    // segment's TCP checksum took its payload's sum from the CRC pass, so
    // the transmit path read no payload byte a second time.
    for (side, dp) in [("a", &p.a), ("b", &p.b)] {
        let s = dp.stats()[0];
        println!(
            "inline: {side}: {} bytes sent, {} payload bytes summed apart from the CRC pass",
            s.tx_bytes, s.tx_summed_bytes
        );
        assert!(s.tx_bytes > 4 << 20);
        assert_eq!(s.tx_summed_bytes, 0, "{side}: payload summed twice");
    }
}

#[test]
fn threads_two_workers_each_with_rss_and_arp() {
    let p = Pair::new(&PairOptions {
        workers: 2,
        mode: DriveMode::Threads,
        ..PairOptions::default()
    });
    run_all(&p, "threads");
}

#[test]
fn copying_port_without_multi_segment_transmit() {
    let p = Pair::new(&PairOptions {
        link: MemLinkConfig {
            multi_seg_tx: false,
            ..MemLinkConfig::default()
        },
        static_arp: true,
        ..PairOptions::default()
    });
    let (mut a, mut b) = connect(&p);
    for (i, op) in [Op::Write, Op::Read, Op::Send].into_iter().enumerate() {
        let n = exchange(&p, &mut a, &mut b, op, 300_001, 100 + i as u64);
        println!("copying port: {op:?}: {n} bytes verified");
    }
}
