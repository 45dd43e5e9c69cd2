//! A link whose transmit takes only part of each burst, as a device with
//! a full ring does (`net_ring` returns fewer sent than given): the frames
//! it leaves stay with the worker, in order, and go out on later
//! iterations even when no new work arrives, with worker threads and the
//! idle back-off on. A window of Writes is posted and then nothing more:
//! every one of them completes; then WRITE, READ and SEND of up to 1 MiB
//! each way verified byte for byte, and another window after the workers
//! have gone idle.

mod runtime_common;

use std::time::Duration;

use dataplane::api::{Access, DriveMode, SendWr, SgeList};
use dataplane::link::MemLinkConfig;
use runtime_common::*;

/// Posts `n` Writes of `len` bytes from a to b back to back, then waits
/// for every completion; returns how many completed.
fn window(p: &Pair, a: &mut End, b: &End, n: u64, len: usize, first_id: u64) -> u64 {
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let src = buffer(&p.a, a.pd, len, rw);
    let dst = buffer(&p.b, b.pd, len, rw);
    let data = src.fill_pattern(first_id);
    for id in first_id..first_id + n {
        let wr = SendWr::write(
            id,
            SgeList::single(src.mr.sge(0, len as u32)),
            dst.mr.addr(),
            dst.mr.rkey(),
        );
        a.qp.post_send(&wr).unwrap();
    }
    // Nothing more is posted: the tail must still get out.
    for id in first_id..first_id + n {
        let wc = wait_wc(p, a, id);
        assert_eq!(
            wc.status,
            dataplane::api::WcStatus::Success,
            "write {id}: {wc:?}"
        );
    }
    wait_placed(p, "the Writes", &data, || dst.bytes());
    assert_eq!(dst.bytes(), data, "destination after the window");
    assert!(dst.guards_intact());
    n
}

#[test]
fn partial_tx_bursts_are_retried_until_sent() {
    for max in [1usize, 3] {
        let p = Pair::new(&PairOptions {
            link: MemLinkConfig {
                tx_burst_max: max,
                ..MemLinkConfig::default()
            },
            mode: DriveMode::Threads,
            static_arp: true,
            ..PairOptions::default()
        });
        let (mut a, mut b) = connect(&p);
        let done = window(&p, &mut a, &b, 32, 64 * 1024, 1000);
        println!("{max} frame(s) per burst: a window of {done} Writes of 64 KiB completed");
        let mut id = 1;
        for op in [Op::Write, Op::Read, Op::Send] {
            for len in [1, 5000, 1 << 20] {
                let n = exchange(&p, &mut a, &mut b, op, len, id);
                println!("{max} frame(s) per burst: {op:?} {len} B: {n} bytes verified");
                id += 1;
            }
        }
        // Until the worker has backed off into its idle sleep (a few
        // milliseconds when it has a core; a loaded machine may take
        // longer to schedule it).
        let t0 = std::time::Instant::now();
        while p.a.stats()[0].idle_sleeps == 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let slept = p.a.stats()[0].idle_sleeps;
        assert!(slept > 0, "the idle back-off never slept in 10 s");
        let done = window(&p, &mut a, &b, 16, 64 * 1024, 2000);
        println!(
            "{max} frame(s) per burst: after idling ({slept} sleeps), {done} more Writes completed"
        );
        // Each burst took at most `max` frames, yet everything went out:
        // far more frames than one burst's worth were sent.
        let tx = p.a.stats()[0].tx_packets;
        assert!(tx > 48 * 45, "a sent only {tx} frames");
        p.a.disconnect(&a.qp, true).unwrap();
    }
}
