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

mod dpdk_common;
mod runtime_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dataplane::api::{
    Access, Dataplane, DriveMode, RecvWr, SendWr, SgeList, WcStatus, WorkCompletion,
};
use dataplane::dpdk_link::{DpdkLink, DpdkLinkOptions};
use dpdk_bindings::ExtMem;
use dpdk_common::*;
use runtime_common::*;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static TRACE: AtomicBool = AtomicBool::new(false);

// SAFETY: forwards every call to the system allocator unchanged; the
// counters are atomics and allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        if TRACE.swap(false, Ordering::Relaxed) {
            // One backtrace per measured run, to say where (the capture
            // itself allocates, hence the flag is cleared first).
            eprintln!(
                "allocation of {} bytes at:\n{}",
                layout.size(),
                std::backtrace::Backtrace::force_capture()
            );
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const LEN: usize = 256 * 1024;

/// Posts one WRITE, READ and SEND of `LEN` bytes and pumps until all four
/// completions arrived, with no allocation of its own.
fn round(p: &Pair, a: &End, b: &End, bufs: &[Buf; 4], id: u64) -> u64 {
    let [src, dst, rsrc, rsink] = bufs;
    let n = LEN as u32;
    let w = SendWr::write(
        id,
        SgeList::single(src.mr.sge(0, n)),
        dst.mr.addr(),
        dst.mr.rkey(),
    );
    let r = SendWr::read(id + 1, rsink.mr.sge(0, n), rsrc.mr.addr(), rsrc.mr.rkey());
    let recv = RecvWr {
        wr_id: id + 2,
        sges: SgeList::single(dst.mr.sge(0, n)),
    };
    let s = SendWr::send(id + 2, SgeList::single(src.mr.sge(0, n)));
    b.qp.post_recv(&recv).unwrap();
    a.qp.post_send(&w).unwrap();
    a.qp.post_send(&r).unwrap();
    a.qp.post_send(&s).unwrap();
    let mut got = 0;
    let mut wcs = [WorkCompletion {
        wr_id: 0,
        status: WcStatus::GeneralError,
        opcode: dataplane::api::WcOpcode::Send,
        byte_len: 0,
        qp_num: a.qp.num(),
        solicited: false,
        invalidated_stag: None,
    }; 8];
    let start = std::time::Instant::now();
    while got < 4 {
        assert!(start.elapsed() < PATIENCE, "round {id} stalled");
        p.pump();
        for cq in [&a.cq, &b.cq] {
            let k = cq.poll(&mut wcs);
            for wc in &wcs[..k] {
                assert_eq!(wc.status, WcStatus::Success);
                assert_eq!(wc.byte_len, n);
            }
            got += k;
        }
    }
    3 * LEN as u64
}

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
