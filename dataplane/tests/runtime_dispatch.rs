//! The software dispatcher: two dataplanes of two workers each over an
//! in-memory link that does not steer TCP flows to queues (everything on
//! queue 0, or frame after frame round robin), so frames reach workers
//! that do not own their connection and must be handed to the owner.
//! Connections opened from both sides; RDMA WRITE, READ and SEND on each,
//! verified byte for byte; every handed-over frame counted, none dropped.

mod runtime_common;

use dataplane::api::DriveMode;
use dataplane::link::{MemLinkConfig, Steering};
use dataplane::worker::WorkerStats;
use runtime_common::*;

const SIZES: [usize; 4] = [1, 4097, 100_003, 1 << 20];

fn total(stats: &[WorkerStats], f: impl Fn(&WorkerStats) -> u64) -> u64 {
    stats.iter().map(f).sum()
}

fn run(steering: Steering, mode: DriveMode, label: &str) {
    let p = Pair::new(&PairOptions {
        link: MemLinkConfig {
            steering,
            ..MemLinkConfig::default()
        },
        workers: 2,
        mode,
        ..PairOptions::default()
    });
    p.a.listen(PORT, 16).unwrap();
    p.b.listen(PORT, 16).unwrap();
    let mut verified = 0usize;
    let mut id = 1u64;
    // Four connections: two opened by each side, so that each side's
    // two workers open one each (connections go to workers in turn).
    let mut conns = Vec::new();
    for from_a in [true, false, true, false] {
        conns.push((from_a, open_conn(&p, from_a)));
    }
    for (from_a, (a, b)) in conns.iter_mut() {
        for op in [Op::Write, Op::Read, Op::Send] {
            for len in SIZES {
                verified += exchange(&p, a, b, op, len, id);
                id += 1;
            }
        }
        let opener = if *from_a { "a" } else { "b" };
        println!(
            "{label}: connection opened by {opener}: WRITE, READ, SEND of {SIZES:?} B verified"
        );
    }
    // The last frames (ACKs) may still sit in a ring for a moment.
    p.until("dispatch rings drained", |p| {
        let s: Vec<WorkerStats> = p.a.stats().into_iter().chain(p.b.stats()).collect();
        (total(&s, |w| w.dispatched_out) == total(&s, |w| w.dispatched_in)).then_some(())
    });
    let (sa, sb) = (p.a.stats(), p.b.stats());
    for (side, s) in [("a", &sa), ("b", &sb)] {
        for (i, w) in s.iter().enumerate() {
            println!(
                "{label}: {side} worker {i}: {} connections, rx {} frames, dispatched out {}, in {}, dropped {}",
                w.connections, w.rx_packets, w.dispatched_out, w.dispatched_in, w.dispatch_drops
            );
        }
    }
    let all: Vec<WorkerStats> = sa.iter().chain(sb.iter()).copied().collect();
    let (out, inn) = (
        total(&all, |w| w.dispatched_out),
        total(&all, |w| w.dispatched_in),
    );
    println!("{label}: {verified} bytes verified; {out} frames handed over, {inn} taken");
    assert!(out > 0 && inn > 0, "nothing was dispatched");
    assert_eq!(out, inn, "every frame handed over was taken");
    assert_eq!(total(&all, |w| w.dispatch_drops), 0, "dispatch ring full");
    // Both workers of each side own connections: the dispatcher, not the
    // queue a frame arrived on, decided where each connection lives.
    for (side, s) in [("a", &sa), ("b", &sb)] {
        assert_eq!(total(s, |w| w.connections), 4, "{side}");
    }
    assert!(sa.iter().all(|w| w.connections > 0), "a: {sa:?}");
    if steering == Steering::Queue0 {
        // Only queue 0 receives, yet worker 1 owns connections: all its
        // frames came through the dispatcher.
        for s in [&sa, &sb] {
            assert_eq!(s[1].rx_packets, 0);
        }
    }
}

#[test]
fn everything_on_queue_zero_threads() {
    run(Steering::Queue0, DriveMode::Threads, "queue 0, threads");
}

#[test]
fn round_robin_over_queues_inline() {
    run(
        Steering::RoundRobin,
        DriveMode::Inline,
        "round robin, inline",
    );
}
