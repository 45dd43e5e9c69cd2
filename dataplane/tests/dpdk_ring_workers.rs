//! Two workers per dataplane over a two-queue `net_ring` pair (queue `q`
//! of one port feeds queue `q` of the other; the port does not steer, so
//! frames reaching a worker that does not own their connection go to the
//! owner through the software dispatcher, counted): WRITE, READ and SEND
//! verified byte for byte, each worker thread registered as an EAL lcore;
//! then nothing left in the EAL runtime directory.

mod dpdk_common;
mod runtime_common;

use dpdk_common::*;
use runtime_common::*;

#[test]
fn two_workers_each_over_a_two_queue_ring_pair() {
    let (guard, eal) = start("dpdk-ring-workers", 256);
    {
        let (p, _, _) = ring_pair(&eal, 1500, 2);
        let (mut a, mut b) = connect(&p);
        for (i, op) in [Op::Write, Op::Read, Op::Send].into_iter().enumerate() {
            for (j, len) in [1usize, 100_003, 1 << 20].into_iter().enumerate() {
                let n = exchange(&p, &mut a, &mut b, op, len, (10 * i + j) as u64 + 1);
                println!("net_ring, 2 workers: {op:?} {len} B: {n} bytes verified");
            }
        }
        println!("a: {:?}", p.a.stats());
        // net_ring does not steer (no RSS): replies reach whichever queue
        // the peer's owning worker sent them on, and the software
        // dispatcher hands them to the worker that owns the connection.
        let counts = || {
            let all: Vec<_> = p.a.stats().into_iter().chain(p.b.stats()).collect();
            let sum =
                |f: fn(&dataplane::worker::WorkerStats) -> u64| -> u64 { all.iter().map(f).sum() };
            (
                sum(|w| w.dispatched_out),
                sum(|w| w.dispatched_in),
                sum(|w| w.dispatch_drops),
            )
        };
        // The last frames (ACKs) may still sit in a ring for a moment.
        let mut tries = 0;
        while counts().0 != counts().1 && tries < 100 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            tries += 1;
        }
        let (out, taken, dropped) = counts();
        println!("net_ring, 2 workers: {out} frames handed to their owner, {taken} taken, {dropped} dropped");
        assert!(out > 0, "nothing dispatched");
        assert_eq!(out, taken);
        assert_eq!(dropped, 0);
        p.a.disconnect(&a.qp, true).unwrap();
        drop(p);
    }
    drop(eal);
    assert_clean(&guard);
}
