//! The heap a connected, idle queue pair costs, on each side of the
//! connection, without the application's registered buffers (none is
//! registered here).
//!
//! A counting global allocator (the approach of `alloc_common`, with live
//! bytes: what is allocated less what is freed) measures two dataplanes
//! joined by the in-memory link, both driven inline on this thread (the
//! only test in this binary, so nothing else allocates meanwhile). Every
//! call into one side (its loop, its control path) is charged to that
//! side. After a warm-up of a few connections, [`QPS`] more are connected
//! with the default configuration and the default queue pair options,
//! each with a completion queue of its own, and left idle; the figure is
//! the live bytes they added, per queue pair, on the active side and on
//! the passive one. The application's objects (completion queue, queue
//! pair and its posting rings) and the worker's state (TCP connection,
//! the rdmap endpoint and its queue pair, the worker's per-connection
//! glue) are reported apart, then the largest allocations one more
//! connection leaves behind, and the same figure with smaller TCP
//! receive buffers and shallower queues, which shows what scales with
//! which knob. Last, the tables sized at bring-up from
//! `tcp.max_connections`, per configured connection.
//!
//! The worker's share is what the dataplane decides: TCP's queues and
//! assembler, the rdmap queue pair's and the worker's own take storage at
//! first use and grow with traffic, so an idle queue pair holds little
//! ([`MAX_CONN_PER_QP`]). The application's share is what it asked for:
//! its posting rings and completion queue are taken whole at creation,
//! as a hardware RNIC takes its work queues, so they follow the queue
//! depths. The rings hold requests in a packed form (40 bytes a send, 24
//! a receive, where a work request is 168 and 112; a request with more
//! than one SGE or a fast registration goes to a spill area the ring
//! makes when the first one comes), so with the default queues 256 deep
//! the whole queue pair, its own completion queue included, holds to
//! 64 KiB ([`MAX_PER_QP`]); the other bounds guard against regressions
//! ([`MAX_AT_DEPTH_128`], [`MAX_CONN_PER_QP`], [`MAX_PER_SLOT`],
//! [`MAX_PAYLOAD`]).
//! `QP_MEMORY_TRACE=1` prints where each large allocation of the traced
//! connection comes from (the backtraces themselves allocate: the
//! figures of such a run are not the ones to read).

mod runtime_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

use dataplane::api::{CmEvent, ConnectParams, Cq, Dataplane, ProtectionDomain, Qp, QpOptions};
use dataplane::link::MemBuf;
use dataplane::worker::{RecordRef, RxFrame};
use runtime_common::*;

/// Live heap bytes charged to each side: `a` (active) and `b`
/// (passive); index 2 takes what happens outside either.
static LIVE: [AtomicI64; 3] = [AtomicI64::new(0), AtomicI64::new(0), AtomicI64::new(0)];
/// The side allocations are charged to now.
static SIDE: AtomicUsize = AtomicUsize::new(2);
/// Allocations are recorded in [`RECORDED`] while set.
static RECORD: AtomicBool = AtomicBool::new(false);
/// Recorded allocations also print their backtrace, from this size on.
static TRACE_FROM: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Allocations made while [`RECORD`] is set and not yet freed: address,
/// size and side (0 for a free entry).
const RECORDS: usize = 4096;
static RECORDED: [[AtomicUsize; 3]; RECORDS] = [const {
    [
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    ]
}; RECORDS];

thread_local! {
    /// In the allocator's own bookkeeping (a backtrace being printed):
    /// allocations are counted but not recorded.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

struct Counting;

fn charge(side: usize, bytes: i64) {
    LIVE[side].fetch_add(bytes, Ordering::Relaxed);
}

fn record(ptr: *mut u8, size: usize) {
    if ptr.is_null() || !RECORD.load(Ordering::Relaxed) || BUSY.with(Cell::get) {
        return;
    }
    let side = SIDE.load(Ordering::Relaxed);
    for r in &RECORDED {
        if r[0]
            .compare_exchange(0, ptr as usize, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            r[1].store(size, Ordering::Relaxed);
            r[2].store(side, Ordering::Relaxed);
            break;
        }
    }
    if size >= TRACE_FROM.load(Ordering::Relaxed) {
        BUSY.with(|b| b.set(true));
        eprintln!(
            "side {side}: {size} bytes at {ptr:p}:\n{}",
            std::backtrace::Backtrace::force_capture()
        );
        BUSY.with(|b| b.set(false));
    }
}

fn forget(ptr: *mut u8) {
    if !RECORD.load(Ordering::Relaxed) {
        return;
    }
    for r in &RECORDED {
        if r[0].load(Ordering::Relaxed) == ptr as usize {
            r[0].store(0, Ordering::Relaxed);
            break;
        }
    }
}

// SAFETY: forwards every call to the system allocator unchanged; the
// bookkeeping is atomics and a thread-local flag, and allocates nothing
// but the backtraces of the tracing mode, made with the flag set.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            charge(SIDE.load(Ordering::Relaxed), layout.size() as i64);
        }
        record(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            charge(SIDE.load(Ordering::Relaxed), layout.size() as i64);
        }
        record(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        charge(SIDE.load(Ordering::Relaxed), -(layout.size() as i64));
        forget(ptr);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            charge(
                SIDE.load(Ordering::Relaxed),
                new_size as i64 - layout.size() as i64,
            );
            forget(ptr);
            record(p, new_size);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Queue pairs measured, after [`WARM_UP`] connections.
const QPS: usize = 64;
const WARM_UP: usize = 4;

/// Most live bytes one connected idle queue pair may cost on either side
/// with the default configuration and queues 256 deep (application
/// objects, its completion queue of 512 entries among them, and worker
/// state together; some 52 KiB today).
const MAX_PER_QP: i64 = 64 * 1024;

/// Most live bytes the worker's share of one connected idle queue pair
/// may cost (some 9.3 KiB today).
const MAX_CONN_PER_QP: i64 = 16 * 1024;

/// Most live bytes one connected idle queue pair with queues 128 deep
/// may cost, all told (some 31.6 KiB today).
const MAX_AT_DEPTH_128: i64 = 40 * 1024;

/// Most bytes a dataplane may set aside at bring-up per connection of
/// `tcp.max_connections` (today 67).
const MAX_PER_SLOT: i64 = 256;

/// Largest received payload handle TCP may keep: its in-order queue and
/// out-of-order assembler have room for thousands per connection.
const MAX_PAYLOAD: usize = 48;

/// Bytes one queue pair costs, on the active side and on the passive one.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    /// Completion queue, queue pair and its posting rings, as the
    /// application creates them.
    app: [i64; 2],
    /// What connecting adds: the worker's state and the messages in
    /// flight between it and the application (none once idle).
    conn: [i64; 2],
}

impl Cost {
    fn total(&self, side: usize) -> i64 {
        self.app[side] + self.conn[side]
    }
}

fn live(side: usize) -> i64 {
    LIVE[side].load(Ordering::Relaxed)
}

/// Runs `f` with its allocations charged to `side`; returns its result
/// and the live bytes it added.
fn on<T>(side: usize, f: impl FnOnce() -> T) -> (T, i64) {
    let before = live(side);
    SIDE.store(side, Ordering::Relaxed);
    let t = f();
    SIDE.store(2, Ordering::Relaxed);
    (t, live(side) - before)
}

/// One side's objects of one queue pair.
struct Objects {
    _cq: Cq,
    qp: Qp,
}

fn objects(dp: &Dataplane, pd: ProtectionDomain, opts: QpOptions) -> Objects {
    // A completion queue of its own, deep enough for both queues.
    let cq = dp.create_cq(opts.max_send_wr + opts.max_recv_wr).unwrap();
    let qp = dp.create_qp(pd, &cq, &cq, opts).unwrap();
    Objects { _cq: cq, qp }
}

/// One round of both loops, each charged to its side.
fn pump(p: &Pair) -> bool {
    on(0, || p.a.poll()).0 | on(1, || p.b.poll()).0
}

/// Connects `a`'s queue pair to `b`'s and pumps until both ends are
/// established; returns the live bytes each side gained meanwhile.
fn connect(p: &Pair, a: &Objects, b: &Objects) -> [i64; 2] {
    let mut added = [0; 2];
    let (r, d) = on(0, || {
        p.a.connect(
            &a.qp,
            SocketAddrV4::new(IP_B, PORT),
            &ConnectParams::default(),
        )
    });
    r.unwrap();
    added[0] += d;
    let mut up = [false; 2];
    let start = std::time::Instant::now();
    while !(up[0] && up[1]) {
        assert!(start.elapsed() < PATIENCE, "connection stalled");
        let before = [live(0), live(1)];
        pump(p);
        while let (Some(e), _) = on(1, || p.b.poll_event()) {
            match e {
                CmEvent::ConnectRequest(req) => {
                    on(1, || p.b.accept(&req, &b.qp, &ConnectParams::default()))
                        .0
                        .unwrap();
                }
                CmEvent::Established { .. } => up[1] = true,
                other => panic!("passive side: unexpected {other:?}"),
            }
        }
        while let (Some(e), _) = on(0, || p.a.poll_event()) {
            match e {
                CmEvent::Established { .. } => up[0] = true,
                other => panic!("active side: unexpected {other:?}"),
            }
        }
        added[0] += live(0) - before[0];
        added[1] += live(1) - before[1];
    }
    // Idle: whatever the last steps left to do (ACKs, setup timers) runs.
    for _ in 0..50 {
        let before = [live(0), live(1)];
        pump(p);
        added[0] += live(0) - before[0];
        added[1] += live(1) - before[1];
    }
    added
}

/// Opens a pair with `tweak` applied to both configurations, connects
/// [`WARM_UP`] then `n` queue pairs made with `opts`, and returns the
/// cost of one of the `n`, with the objects kept alive until the pair is
/// dropped.
fn measure(label: &str, n: usize, opts: QpOptions, tweak: impl Fn(&mut dataplane::Config)) -> Cost {
    let p = Pair::with_configs(
        &PairOptions {
            static_arp: true,
            ..PairOptions::default()
        },
        |c, _| {
            c.limits.max_qp = 4096;
            tweak(c);
        },
    );
    p.a.listen(PORT, 1024).unwrap();
    p.b.listen(PORT, 1024).unwrap();
    let pds = [p.a.alloc_pd().unwrap(), p.b.alloc_pd().unwrap()];
    let mut keep = Vec::with_capacity(WARM_UP + n);
    for _ in 0..WARM_UP {
        let a = objects(&p.a, pds[0], opts);
        let b = objects(&p.b, pds[1], opts);
        connect(&p, &a, &b);
        keep.push((a, b));
    }
    let mut cost = Cost::default();
    for _ in 0..n {
        let (a, da) = on(0, || objects(&p.a, pds[0], opts));
        let (b, db) = on(1, || objects(&p.b, pds[1], opts));
        let added = connect(&p, &a, &b);
        cost.app[0] += da;
        cost.app[1] += db;
        cost.conn[0] += added[0];
        cost.conn[1] += added[1];
        keep.push((a, b));
    }
    let per = |x: i64| x / n as i64;
    let cost = Cost {
        app: [per(cost.app[0]), per(cost.app[1])],
        conn: [per(cost.conn[0]), per(cost.conn[1])],
    };
    println!(
        "{label}: per idle QP, active side {} bytes ({} application objects, {} connection), \
         passive side {} bytes ({} + {})",
        cost.total(0),
        cost.app[0],
        cost.conn[0],
        cost.total(1),
        cost.app[1],
        cost.conn[1],
    );
    cost
}

/// Connects one more queue pair on a fresh pair with the default
/// configuration and prints the allocations it leaves live, largest
/// first, by side.
fn largest_allocations() {
    let p = Pair::with_configs(
        &PairOptions {
            static_arp: true,
            ..PairOptions::default()
        },
        |_, _| {},
    );
    p.a.listen(PORT, 16).unwrap();
    p.b.listen(PORT, 16).unwrap();
    let pds = [p.a.alloc_pd().unwrap(), p.b.alloc_pd().unwrap()];
    let opts = QpOptions::default();
    let mut keep = Vec::new();
    for _ in 0..WARM_UP {
        let a = objects(&p.a, pds[0], opts);
        let b = objects(&p.b, pds[1], opts);
        connect(&p, &a, &b);
        keep.push((a, b));
    }
    // Read before recording starts: reading the variable allocates.
    if std::env::var_os("QP_MEMORY_TRACE").is_some() {
        TRACE_FROM.store(1024, Ordering::Relaxed);
    }
    RECORD.store(true, Ordering::Relaxed);
    let a = on(0, || objects(&p.a, pds[0], opts)).0;
    let b = on(1, || objects(&p.b, pds[1], opts)).0;
    connect(&p, &a, &b);
    RECORD.store(false, Ordering::Relaxed);
    TRACE_FROM.store(usize::MAX, Ordering::Relaxed);
    let mut got: Vec<(usize, usize, usize)> = RECORDED
        .iter()
        .filter(|r| r[0].load(Ordering::Relaxed) != 0)
        .map(|r| {
            (
                r[2].load(Ordering::Relaxed),
                r[1].load(Ordering::Relaxed),
                r[0].swap(0, Ordering::Relaxed),
            )
        })
        .collect();
    got.sort_by(|x, y| x.0.cmp(&y.0).then(y.1.cmp(&x.1)));
    for side in 0..2 {
        let name = ["active", "passive"][side];
        let mine: Vec<_> = got.iter().filter(|g| g.0 == side).collect();
        let total: usize = mine.iter().map(|g| g.1).sum();
        let small: Vec<_> = mine.iter().filter(|g| g.1 < 1024).collect();
        println!(
            "{name} side: {} allocations live, {total} bytes; from 1 KiB up:",
            mine.len()
        );
        for g in mine.iter().filter(|g| g.1 >= 1024) {
            println!("  {:>8} bytes at {:#x}", g.1, g.2);
        }
        println!(
            "  {:>8} bytes in {} smaller allocations",
            small.iter().map(|g| g.1).sum::<usize>(),
            small.len()
        );
    }
    drop(keep);
}

/// Bytes a dataplane sets aside at bring-up per connection of
/// `tcp.max_connections` (measured between two values of it).
fn per_slot() -> i64 {
    let open = |conns: usize| {
        on(2, || {
            Pair::with_configs(&PairOptions::default(), |c, _| {
                c.tcp.max_connections = conns;
            })
        })
    };
    let (small, at_small) = open(64);
    drop(small);
    let (large, at_large) = open(4096);
    drop(large);
    // Two dataplanes each time.
    let per = (at_large - at_small) / 2 / (4096 - 64);
    println!(
        "bring-up: {} bytes with tcp.max_connections = 64, {} with 4096 (two dataplanes): \
         {per} bytes per configured connection",
        at_small, at_large
    );
    per
}

#[test]
fn idle_queue_pair_memory() {
    type Conn = tcp_offload::tcp::Connection<RxFrame<MemBuf>, RecordRef>;
    let payload = [
        size_of::<tcp_offload::tcp::Payload<RxFrame<MemBuf>>>(),
        size_of::<tcp_offload::tcp::Payload<RxFrame<dataplane::dpdk_link::DpdkRxBuf>>>(),
    ];
    println!(
        "sizes: TCP Connection {}, its payload {} (on a DPDK port {}), its event {}, \
         rdmap Endpoint {}, QueuePair {}, SendWr {}, RecvWr {}, WorkCompletion {}",
        size_of::<Conn>(),
        payload[0],
        payload[1],
        size_of::<tcp_offload::tcp::Event<RecordRef>>(),
        size_of::<rdmap::engine::Endpoint>(),
        size_of::<rdmap::verbs::QueuePair>(),
        size_of::<rdmap::verbs::SendWr>(),
        size_of::<rdmap::verbs::RecvWr>(),
        size_of::<rdmap::verbs::WorkCompletion>(),
    );
    assert!(
        payload.iter().all(|&p| p <= MAX_PAYLOAD),
        "payload handles of {payload:?} bytes (at most {MAX_PAYLOAD})"
    );
    let default = measure("default configuration", QPS, QpOptions::default(), |_| {});
    let small_buffer = measure(
        "tcp.recv_buffer = 64 KiB",
        QPS / 4,
        QpOptions::default(),
        |c| c.tcp.recv_buffer = 64 * 1024,
    );
    let shallow = QpOptions {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpOptions::default()
    };
    let both = measure(
        "tcp.recv_buffer = 64 KiB, 16 send and 16 receive work requests",
        QPS / 4,
        shallow,
        |c| c.tcp.recv_buffer = 64 * 1024,
    );
    for side in 0..2 {
        println!(
            "{} side: {} bytes per idle QP; of them {} follow tcp.recv_buffer (1 MiB to \
             64 KiB), {} the queue depths (256 to 16)",
            ["active", "passive"][side],
            default.total(side),
            default.total(side) - small_buffer.total(side),
            small_buffer.total(side) - both.total(side),
        );
    }
    let depth_128 = measure(
        "128 send and 128 receive work requests",
        QPS / 4,
        QpOptions {
            max_send_wr: 128,
            max_recv_wr: 128,
            ..QpOptions::default()
        },
        |_| {},
    );
    largest_allocations();
    let slot = per_slot();
    for side in 0..2 {
        let got = default.total(side);
        assert!(
            got > 0 && got <= MAX_PER_QP,
            "{} side: {got} bytes per idle QP (at most {MAX_PER_QP})",
            ["active", "passive"][side]
        );
        let conn = default.conn[side];
        assert!(
            conn > 0 && conn <= MAX_CONN_PER_QP,
            "{} side: the worker's share of an idle QP is {conn} bytes (at most \
             {MAX_CONN_PER_QP})",
            ["active", "passive"][side]
        );
        let got = depth_128.total(side);
        assert!(
            got > 0 && got <= MAX_AT_DEPTH_128,
            "{} side: {got} bytes per idle QP with queues 128 deep (at most \
             {MAX_AT_DEPTH_128})",
            ["active", "passive"][side]
        );
    }
    assert!(
        slot <= MAX_PER_SLOT,
        "{slot} bytes per configured connection at bring-up (at most {MAX_PER_SLOT})"
    );
}
