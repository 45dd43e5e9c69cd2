//! The counting global allocator of the zero-allocation tests and the
//! round of RDMA WRITE, READ and SEND they measure, shared by the
//! in-memory and the DPDK variants (each its own test binary, so each has
//! its own allocator and counters).

#![allow(dead_code, reason = "each test file uses part of the harness")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dataplane::api::{RecvWr, SendWr, SgeList, WcStatus, WorkCompletion};

use super::runtime_common::*;

struct Counting;

pub static ALLOCS: AtomicU64 = AtomicU64::new(0);
pub static BYTES: AtomicU64 = AtomicU64::new(0);
pub static TRACE: AtomicBool = AtomicBool::new(false);

/// Prints `what` and where it happens, once per measured run while
/// [`TRACE`] is set (the capture itself allocates, hence the flag is
/// cleared first).
fn trace(what: std::fmt::Arguments<'_>) {
    if TRACE.swap(false, Ordering::Relaxed) {
        eprintln!("{what} at:\n{}", std::backtrace::Backtrace::force_capture());
    }
}

// SAFETY: forwards every call to the system allocator unchanged; the
// counters are atomics and allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        trace(format_args!("allocation of {} bytes", layout.size()));
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
        trace(format_args!(
            "reallocation from {} to {new_size} bytes",
            layout.size()
        ));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

pub const LEN: usize = 256 * 1024;

/// Posts one WRITE, READ and SEND of `LEN` bytes and pumps until all four
/// completions arrived, with no allocation of its own.
pub fn round(p: &Pair, a: &End, b: &End, bufs: &[Buf; 4], id: u64) -> u64 {
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
