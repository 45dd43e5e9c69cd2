//! A counting global allocator shows that the steady state of the loop —
//! posting work, RX and TX bursts, TCP, MPA framing and deframing, DDP
//! placement, completions — allocates nothing per packet.
//!
//! Both dataplanes run inline on this thread (the only test in this
//! binary, so nothing else allocates meanwhile). After a warm-up that
//! lets every pool, ring and queue reach its working size, RDMA WRITEs,
//! READs and SENDs of 256 KiB run while allocations are counted. Then the
//! same with two workers per side over a link that delivers every frame
//! on queue 0, so that the software dispatcher hands most frames from one
//! worker to the other.

mod runtime_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dataplane::api::{Access, RecvWr, SendWr, SgeList, WcStatus, WorkCompletion};
use dataplane::link::{MemLinkConfig, Steering};
use dataplane::worker::WorkerStats;
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
fn steady_state_allocates_nothing_per_packet() {
    measure(
        "one worker",
        &PairOptions {
            static_arp: true,
            ..PairOptions::default()
        },
    );
    let dispatched = measure(
        "two workers, all frames on queue 0",
        &PairOptions {
            static_arp: true,
            workers: 2,
            link: MemLinkConfig {
                steering: Steering::Queue0,
                ..MemLinkConfig::default()
            },
            ..PairOptions::default()
        },
    );
    assert!(dispatched > 1000, "only {dispatched} frames dispatched");
}

/// Frames received, and frames handed from one worker to another, over
/// both sides' workers.
fn frames(p: &Pair) -> (u64, u64) {
    let all: Vec<WorkerStats> = p.a.stats().into_iter().chain(p.b.stats()).collect();
    (
        all.iter().map(|w| w.rx_packets).sum(),
        all.iter().map(|w| w.dispatched_out).sum(),
    )
}

/// Runs the measured rounds over a pair made with `o`; returns the frames
/// dispatched while measuring.
fn measure(label: &str, o: &PairOptions) -> u64 {
    let p = Pair::new(o);
    let (a, b) = if o.workers > 1 {
        // Connections go to a's workers in turn: the second is worker 1's,
        // whose frames all arrive on queue 0 when the link does not steer,
        // so every one of them goes through the dispatcher.
        p.a.listen(PORT, 4).unwrap();
        p.b.listen(PORT, 4).unwrap();
        let _first = open_conn(&p, true);
        open_conn(&p, true)
    } else {
        connect(&p)
    };
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let bufs = [
        buffer(&p.a, a.pd, LEN, rw),
        buffer(&p.b, b.pd, LEN, rw),
        buffer(&p.b, b.pd, LEN, rw),
        buffer(&p.a, a.pd, LEN, rw),
    ];
    bufs[0].fill_pattern(1);
    bufs[2].fill_pattern(2);
    // Warm-up: windows open, pools and queues reach their working size.
    let mut id = 1;
    for _ in 0..20 {
        round(&p, &a, &b, &bufs, id);
        id += 3;
    }
    let before = frames(&p);
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
    let after = frames(&p);
    let (packets, dispatched) = (after.0 - before.0, after.1 - before.1);
    println!(
        "steady state, {label}: {moved} bytes moved in {packets} frames ({dispatched} dispatched); {allocs} allocations ({bytes} bytes)"
    );
    assert!(packets > 1000, "only {packets} frames");
    assert!(bufs[1].bytes() == bufs[0].bytes() && bufs[3].bytes() == bufs[2].bytes());
    assert_eq!(
        allocs, 0,
        "{label}: allocations in the steady state (ALLOC_TRACE=1 shows where)"
    );
    dispatched
}
