//! Two dataplanes in one process over a `net_ring` pair (DPDK, no
//! hugepages): RDMA WRITE, READ and SEND from 1 byte to 4 MiB, each
//! verified byte for byte, payload sent as external buffers attached from
//! the registered regions; the ports' device counters, read from the test's
//! thread while the workers run, agree with what the workers counted; then
//! nothing left in the EAL runtime directory.

mod dpdk_common;
mod runtime_common;

use std::sync::atomic::Ordering;

use dpdk_common::*;
use runtime_common::*;

const SIZES: [usize; 8] = [1, 3, 4096, 4097, 65_536, 100_003, 1 << 20, 4 << 20];

#[test]
fn ring_pair_write_read_send_then_clean_up() {
    let (guard, eal) = start("dpdk-ring", 256);
    {
        let (p, sa, sb) = ring_pair(&eal, 1500, 1);
        let (mut a, mut b) = connect(&p);
        let mut id = 1;
        let mut total = 0;
        for op in [Op::Write, Op::Read, Op::Send] {
            for len in SIZES {
                let n = exchange(&p, &mut a, &mut b, op, len, id);
                println!("net_ring: {op:?} {len} B: {n} bytes verified");
                total += n;
                id += 1;
            }
        }
        println!("net_ring: {total} bytes verified in all");
        for _ in 0..100 {
            p.pump();
        }
        a.drain();
        b.drain();
        assert_eq!(a.seen.len(), 3 * SIZES.len());
        assert_eq!(b.seen.len(), SIZES.len(), "one receive per Send");
        let attached =
            sa.tx_attached.load(Ordering::Relaxed) + sb.tx_attached.load(Ordering::Relaxed);
        let linearized =
            sa.rx_linearized.load(Ordering::Relaxed) + sb.rx_linearized.load(Ordering::Relaxed);
        println!(
            "net_ring: {attached} payloads attached as external buffers, {linearized} chains \
             linearized on receive, a: {:?}",
            p.a.stats()[0]
        );
        assert!(attached > 1000, "payload went by reference");
        assert!(linearized > 0);
        assert_eq!(sa.rx_dropped.load(Ordering::Relaxed), 0);
        assert_eq!(sb.rx_dropped.load(Ordering::Relaxed), 0);
        device_counters(&p);
        p.a.disconnect(&a.qp, true).unwrap();
        drop(p);
    }
    // Links, queues and pools are gone: the last holder of EAL cleans up.
    drop(eal);
    assert_clean(&guard);
}

/// Each side's device counters, read from this (non-worker) thread while
/// both workers poll: the NIC received at least every frame its worker
/// did (it counts first), each side received no more than the other sent
/// (read in that order, as the counters only grow), and nothing was
/// missed or in error.
fn device_counters(p: &Pair) {
    let workers_rx: Vec<u64> = [&p.a, &p.b]
        .iter()
        .map(|d| d.stats().iter().map(|s| s.rx_packets).sum())
        .collect();
    let b_first = p.b.port_stats();
    let a = p.a.port_stats();
    let b = p.b.port_stats();
    assert_eq!((a.len(), b.len()), (1, 1), "one DPDK port each");
    let (a, b, b_first) = (&a[0], &b[0], &b_first[0]);
    println!("device counters: a {a:?}");
    println!("device counters: b {b:?}");
    assert_eq!(
        (a.name.as_str(), b.name.as_str()),
        ("net_ring_dp_a", "net_ring_dp_b")
    );
    assert_eq!(a.driver, "net_ring");
    let (ca, cb, cb_first) = (
        a.counters.clone().expect("a's counters"),
        b.counters.clone().expect("b's counters"),
        b_first.counters.clone().expect("b's counters"),
    );
    assert!(
        ca.rx_packets >= workers_rx[0],
        "a: device {ca:?}, workers {}",
        workers_rx[0]
    );
    assert!(
        cb.rx_packets >= workers_rx[1],
        "b: device {cb:?}, workers {}",
        workers_rx[1]
    );
    // Each way carried one op's sizes (5.4 MB: WRITE and SEND to b, READ
    // responses to a) at 1460 payload bytes a frame at most.
    let least = SIZES.iter().sum::<usize>() as u64 / 1460;
    assert!(
        ca.rx_packets > least && cb.rx_packets > least,
        "a {ca:?} b {cb:?}, at least {least} each"
    );
    assert!(
        cb_first.rx_packets <= ca.tx_packets,
        "a {ca:?} b {cb_first:?}"
    );
    assert!(ca.rx_packets <= cb.tx_packets, "a {ca:?} b {cb:?}");
    for c in [&ca, &cb] {
        assert_eq!(
            (c.rx_missed, c.rx_errors, c.tx_errors, c.rx_nombuf),
            (0, 0, 0, 0),
            "{c:?}"
        );
    }
    let good = a
        .xstats
        .iter()
        .find(|(n, _)| n == "rx_good_packets")
        .map(|x| x.1);
    assert!(
        good.is_some_and(|g| g >= ca.rx_packets),
        "extended counters read after the basic ones: {:?}",
        a.xstats
    );
    println!(
        "device counters: a rx {} tx {}, b rx {} tx {} frames (workers received {} and {}), \
         {} extended counters each, no drops or errors",
        ca.rx_packets,
        ca.tx_packets,
        cb.rx_packets,
        cb.tx_packets,
        workers_rx[0],
        workers_rx[1],
        a.xstats.len()
    );
}
