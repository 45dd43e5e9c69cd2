//! Two dataplanes in one process over an in-memory link: connect, then
//! RDMA WRITE, READ and SEND from 1 byte to 4 MiB, each verified byte for
//! byte, each signalled work request completed exactly once.

mod runtime_common;

use dataplane::api::{CmEvent, DisconnectReason, DriveMode, QpStatus};
use dataplane::link::MemLinkConfig;
use dataplane::steer::Rss;
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

/// Connections opened after `run_all`'s, to have one owned by each
/// worker on each side: each lands on a worker of b by the hash of a's
/// port, so missing one after this many is a chance of 2^-15.
const SPREAD_CONNS: usize = 16;

#[test]
fn threads_two_workers_each_with_rss_and_arp() {
    let p = Pair::new(&PairOptions {
        workers: 2,
        mode: DriveMode::Threads,
        ..PairOptions::default()
    });
    run_all(&p, "threads");

    // More connections, each carrying a verified Write, so that both
    // workers on each side own some.
    let mut conns = Vec::new();
    for i in 0..SPREAD_CONNS {
        let (mut a, mut b) = open_conn(&p, true);
        exchange(&p, &mut a, &mut b, Op::Write, 4096, 1000 + i as u64);
        conns.push((a, b));
    }
    // (run_all's closed connection may still be counted while it waits
    // out TIME-WAIT.)
    p.until("every connection counted by its worker", |p| {
        let counted = |dp: &dataplane::api::Dataplane| {
            dp.stats().iter().map(|w| w.connections).sum::<u64>() >= SPREAD_CONNS as u64
        };
        (counted(&p.a) && counted(&p.b)).then_some(())
    });

    // RSS: the in-memory port steers like a NIC (`Rss::round_robin` over
    // its two queues). b's owner of each connection is the queue the hash
    // of a's segments picks; a picked its port so that the hash of b's
    // segments picks the worker that opened it.
    let rss = Rss::round_robin(2);
    let connected = |dp: &dataplane::api::Dataplane| {
        let mut v = dp.qp_snapshots();
        v.retain(|q| q.status == QpStatus::Connected);
        v
    };
    let mut a_owners_by_hash = Vec::new();
    for q in connected(&p.b) {
        let remote = q.connection.as_ref().unwrap().remote;
        assert_eq!(*remote.ip(), IP_A);
        let to_b = rss.queue_for(IP_A, IP_B, remote.port(), PORT);
        assert_eq!(
            q.worker,
            Some(usize::from(to_b)),
            "b's connection from port {}: owner against the RSS hash",
            remote.port()
        );
        a_owners_by_hash.push(usize::from(rss.queue_for(IP_B, IP_A, PORT, remote.port())));
    }
    let mut a_owners: Vec<usize> = connected(&p.a)
        .iter()
        .map(|q| q.worker.expect("a connected queue pair has a worker"))
        .collect();
    assert_eq!(a_owners_by_hash.len(), SPREAD_CONNS);
    a_owners.sort_unstable();
    a_owners_by_hash.sort_unstable();
    assert_eq!(
        a_owners, a_owners_by_hash,
        "a's owners against the RSS hash"
    );
    for (side, dp) in [("a", &p.a), ("b", &p.b)] {
        let stats = dp.stats();
        println!(
            "threads: {side}'s workers own {:?} connections, received {:?} frames",
            stats.iter().map(|w| w.connections).collect::<Vec<_>>(),
            stats.iter().map(|w| w.rx_packets).collect::<Vec<_>>()
        );
        for (i, w) in stats.iter().enumerate() {
            assert!(w.connections > 0, "{side}'s worker {i} owns no connection");
            assert!(w.rx_packets > 0, "{side}'s worker {i} received nothing");
            // The port steered every segment to its owner's queue.
            assert_eq!(w.dispatched_out, 0, "{side}'s worker {i} dispatched frames");
        }
        let owned = |i: usize| connected(dp).iter().filter(|q| q.worker == Some(i)).count() as u64;
        for (i, w) in stats.iter().enumerate() {
            assert!(
                owned(i) > 0,
                "{side}'s worker {i} owns no connected queue pair"
            );
            assert!(
                w.connections >= owned(i),
                "{side}'s worker {i}: counts {} connections, owns {}",
                w.connections,
                owned(i)
            );
        }
    }

    // ARP: no static entries, so a asked for b's address and b answered
    // (and learnt a's from the request).
    let arp = |dp: &dataplane::api::Dataplane| {
        dp.stats()
            .iter()
            .fold((0, 0), |(i, o), w| (i + w.arp_in, o + w.arp_out))
    };
    let ((a_in, a_out), (b_in, b_out)) = (arp(&p.a), arp(&p.b));
    println!("threads: ARP frames in/out: a {a_in}/{a_out}, b {b_in}/{b_out}");
    assert!(a_out >= 1 && b_in >= 1, "a's ARP request reached b");
    assert!(b_out >= 1 && a_in >= 1, "b's ARP reply reached a");
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
