//! A counting global allocator shows that the steady state of the loop on
//! a DPDK port — posting work, RX and TX bursts of mbufs, TCP, MPA framing
//! and deframing, DDP placement, payload attached from registered memory
//! as external buffers, their release, completions — allocates nothing per
//! packet.
//!
//! Two dataplanes over a `net_ring` pair (EAL without hugepages) run inline
//! on this thread, which started EAL and so is its main lcore (the mempool
//! cache serves it); this is the only test in the binary, so nothing else
//! allocates meanwhile. After a warm-up that lets every pool, ring and
//! queue reach its working size, RDMA WRITEs, READs and SENDs of 256 KiB
//! run while allocations are counted.

mod alloc_common;
mod dpdk_common;
mod runtime_common;

use std::sync::atomic::Ordering;

use alloc_common::*;
use dataplane::api::{Access, Dataplane, DriveMode};
use dataplane::dpdk_link::{DpdkLink, DpdkLinkOptions};
use dpdk_bindings::ExtMem;
use dpdk_common::*;
use runtime_common::*;

#[test]
fn dpdk_steady_state_allocates_nothing_per_packet() {
    let (guard, eal) = start("dpdk-alloc", 256);
    {
        let (la, lb) = DpdkLink::ring_pair(
            &eal,
            "al",
            &DpdkLinkOptions::default(),
            (Some(MAC_A), Some(MAC_B)),
        )
        .expect("ring pair links");
        // Debian's DPDK 22.11 ships the stack driver: the pool reuses the
        // mbufs freed last (a FIFO ring cycles through all 16k of them).
        assert_eq!(la.pool_ops(), "stack");
        assert_eq!(lb.pool_ops(), "stack");
        let (sa, sb) = (la.stats(), lb.stats());
        let open = |ip, mac, peer, link| {
            Dataplane::open_with_link(
                &config(ip, mac, peer, 1500, 1, true),
                link,
                DriveMode::Inline,
            )
            .expect("open")
        };
        let p = Pair {
            a: open(IP_A, MAC_A, (IP_B, MAC_B), la),
            b: open(IP_B, MAC_B, (IP_A, MAC_A), lb),
        };
        let (a, b) = connect(&p);
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let bufs = [
            buffer(&p.a, a.pd, LEN, rw),
            buffer(&p.b, b.pd, LEN, rw),
            buffer(&p.b, b.pd, LEN, rw),
            buffer(&p.a, a.pd, LEN, rw),
        ];
        assert!(
            bufs.iter().all(|b| b.region.dpdk_registration().is_some()),
            "every region registered with EAL"
        );
        bufs[0].fill_pattern(1);
        bufs[2].fill_pattern(2);
        // Warm-up: windows open, pools and queues reach their working size.
        let mut id = 1;
        for _ in 0..20 {
            round(&p, &a, &b, &bufs, id);
            id += 3;
        }
        let attached0 =
            sa.tx_attached.load(Ordering::Relaxed) + sb.tx_attached.load(Ordering::Relaxed);
        let before = p.a.stats()[0].rx_packets + p.b.stats()[0].rx_packets;
        let (allocs0, bytes0) = (
            ALLOCS.load(Ordering::Relaxed),
            BYTES.load(Ordering::Relaxed),
        );
        TRACE.store(std::env::var_os("ALLOC_TRACE").is_some(), Ordering::Relaxed);
        let mut moved = 0;
        for _ in 0..20 {
            moved += round(&p, &a, &b, &bufs, id);
            id += 3;
        }
        TRACE.store(false, Ordering::Relaxed);
        let allocs = ALLOCS.load(Ordering::Relaxed) - allocs0;
        let bytes = BYTES.load(Ordering::Relaxed) - bytes0;
        let packets = p.a.stats()[0].rx_packets + p.b.stats()[0].rx_packets - before;
        let attached = sa.tx_attached.load(Ordering::Relaxed)
            + sb.tx_attached.load(Ordering::Relaxed)
            - attached0;
        println!(
            "net_ring steady state: {moved} bytes moved in {packets} frames, {attached} payloads \
             attached from registered memory; {allocs} allocations ({bytes} bytes)"
        );
        assert!(packets > 1000, "only {packets} frames");
        assert!(attached > 1000, "payload went by reference");
        assert!(bufs[1].bytes() == bufs[0].bytes() && bufs[3].bytes() == bufs[2].bytes());
        assert_eq!(
            allocs, 0,
            "allocations in the steady state (ALLOC_TRACE=1 shows where)"
        );
        p.a.disconnect(&a.qp, true).unwrap();
        for _ in 0..50 {
            p.pump();
        }
        for (dp, buf) in [(&p.a, &bufs[0]), (&p.b, &bufs[1]), (&p.b, &bufs[2])]
            .into_iter()
            .chain([(&p.a, &bufs[3])])
        {
            dp.dereg_mr(&buf.mr).unwrap();
        }
        drop(bufs);
        drop(p);
    }
    assert_eq!(ExtMem::live(), 0, "a registration outlived its region");
    drop(eal);
    assert_clean(&guard);
}
