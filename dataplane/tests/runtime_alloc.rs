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
//! worker to the other. Then over a link that loses 1 % of the frames:
//! retransmissions, SACK, the out-of-order assembler and loss recovery
//! allocate nothing either once they have reached their working size.
//! Last, with trains of FPDUs that the link cuts into segments (TCP
//! segmentation offload), over the same loss.

mod alloc_common;
mod runtime_common;

use std::sync::atomic::Ordering;

use alloc_common::*;
use dataplane::api::Access;
use dataplane::link::{MemLinkConfig, Steering};
use dataplane::worker::WorkerStats;
use runtime_common::*;

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
    assert!(
        dispatched.0 > 1000,
        "only {} frames dispatched",
        dispatched.0
    );
    let lossy = measure(
        "one worker, 1 % of frames lost",
        &PairOptions {
            static_arp: true,
            link: MemLinkConfig {
                loss: 0.01,
                seed: 7,
                ..MemLinkConfig::default()
            },
            ..PairOptions::default()
        },
    );
    assert!(
        lossy.1 > 20,
        "only {} retransmissions while measuring: the loss was not exercised",
        lossy.1
    );
    let trains = measure(
        "one worker, trains cut by the port, 1 % of segments lost",
        &PairOptions {
            static_arp: true,
            link: MemLinkConfig {
                loss: 0.01,
                seed: 11,
                tso: true,
                ..MemLinkConfig::default()
            },
            ..PairOptions::default()
        },
    );
    assert!(
        trains.1 > 20,
        "only {} retransmissions while measuring: the loss was not exercised",
        trains.1
    );
}

/// Rounds before counting starts. Slow start grows the window by every
/// byte acknowledged, so under loss the window keeps finding new heights
/// for a while after it first opens; TCP's send queue takes room as the
/// window needs it (doubling, once per size), and forty rounds take it to
/// its working size in every case here.
const WARM_UP: usize = 40;

/// Frames received, frames handed from one worker to another, and
/// retransmissions, over both sides' workers.
fn frames(p: &Pair) -> (u64, u64, u64) {
    let all: Vec<WorkerStats> = p.a.stats().into_iter().chain(p.b.stats()).collect();
    (
        all.iter().map(|w| w.rx_packets).sum(),
        all.iter().map(|w| w.dispatched_out).sum(),
        all.iter().map(|w| w.retransmits).sum(),
    )
}

/// Runs the measured rounds over a pair made with `o`; returns the frames
/// dispatched and the retransmissions while measuring.
fn measure(label: &str, o: &PairOptions) -> (u64, u64) {
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
    for _ in 0..WARM_UP {
        round(&p, &a, &b, &bufs, id);
        id += 3;
    }
    let before = frames(&p);
    // Read before the count starts: reading the variable allocates.
    let trace = std::env::var_os("ALLOC_TRACE").is_some();
    let (allocs0, bytes0) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    TRACE.store(trace, Ordering::Relaxed);
    let mut moved = 0;
    for _ in 0..20 {
        moved += round(&p, &a, &b, &bufs, id);
        id += 3;
    }
    TRACE.store(false, Ordering::Relaxed);
    let allocs = ALLOCS.load(Ordering::Relaxed) - allocs0;
    let bytes = BYTES.load(Ordering::Relaxed) - bytes0;
    let after = frames(&p);
    let (packets, dispatched, retransmits) =
        (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    println!(
        "steady state, {label}: {moved} bytes moved in {packets} frames ({dispatched} \
         dispatched, {retransmits} retransmitted); {allocs} allocations ({bytes} bytes)"
    );
    assert!(packets > 1000, "only {packets} frames");
    assert!(bufs[1].bytes() == bufs[0].bytes() && bufs[3].bytes() == bufs[2].bytes());
    assert_eq!(
        allocs, 0,
        "{label}: allocations in the steady state (ALLOC_TRACE=1 shows where)"
    );
    (dispatched, retransmits)
}
