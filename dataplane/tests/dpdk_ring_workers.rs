//! Two workers per dataplane over a two-queue `net_ring` pair (queue `q`
//! of one port feeds queue `q` of the other, so each connection stays on
//! the worker pair that opened it): WRITE, READ and SEND verified byte for
//! byte, each worker thread registered as an EAL lcore; then nothing left
//! in the EAL runtime directory.

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
        p.a.disconnect(&a.qp, true).unwrap();
        drop(p);
    }
    drop(eal);
    assert_clean(&guard);
}
