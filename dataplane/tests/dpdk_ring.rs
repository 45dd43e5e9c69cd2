//! Two dataplanes in one process over a `net_ring` pair (DPDK, no
//! hugepages): RDMA WRITE, READ and SEND from 1 byte to 4 MiB, each
//! verified byte for byte, payload sent as external buffers attached from
//! the registered regions; then nothing left in the EAL runtime directory.

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
        p.a.disconnect(&a.qp, true).unwrap();
        drop(p);
    }
    // Links, queues and pools are gone: the last holder of EAL cleans up.
    drop(eal);
    assert_clean(&guard);
}
