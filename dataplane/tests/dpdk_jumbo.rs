//! Jumbo frames (MTU 9000) between two dataplanes over a `net_ring` pair:
//! WRITE, READ and SEND verified byte for byte, with segments far above
//! 1500 bytes on the wire (mbufs sized for a whole 9018-byte frame); then
//! nothing left in the EAL runtime directory.

mod dpdk_common;
mod runtime_common;

use std::sync::atomic::Ordering;

use dpdk_common::*;
use runtime_common::*;

const SIZES: [usize; 5] = [1, 8_961, 65_536, 1 << 20, 4 << 20];

#[test]
fn jumbo_frames_over_net_ring() {
    // Two pools of 8191 mbufs of 9 KiB each.
    let (guard, eal) = start("dpdk-jumbo", 512);
    {
        let (p, sa, _sb) = ring_pair(&eal, 9000, 1);
        let (mut a, mut b) = connect(&p);
        let mut id = 1;
        for op in [Op::Write, Op::Read, Op::Send] {
            for len in SIZES {
                let n = exchange(&p, &mut a, &mut b, op, len, id);
                println!("net_ring MTU 9000: {op:?} {len} B: {n} bytes verified");
                id += 1;
            }
        }
        let s = p.a.stats()[0];
        let avg = s.tx_bytes / s.tx_packets.max(1);
        println!(
            "net_ring MTU 9000: a sent {} frames, {} bytes, {avg} B on average; {} attached",
            s.tx_packets,
            s.tx_bytes,
            sa.tx_attached.load(Ordering::Relaxed)
        );
        assert!(avg > 4000, "jumbo segments on the wire ({avg} B average)");
        p.a.disconnect(&a.qp, true).unwrap();
        drop(p);
    }
    drop(eal);
    assert_clean(&guard);
}
