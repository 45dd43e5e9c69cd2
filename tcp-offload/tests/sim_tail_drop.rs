//! Bulk transfer into a receiver that takes frames slower than the sender
//! sends them, behind a drop-tail queue much shorter than the flight the
//! receiver's 3 MiB window allows: the way a virtual machine's tap device
//! (a ring of 1000 frames) overflows when the guest drains it slowly. The
//! queue also stretches the round trip, so the losses come as bursts of
//! hundreds of frames at the tail of a flight, and a receiver that stalls
//! on top of it makes the retransmission timer fire while the data is only
//! late.
//!
//! What must hold: tail drops are repaired by SACK recovery (RFC 6675,
//! RACK-TLP of RFC 8985) within a round trip, without a retransmission
//! timeout and with each lost frame resent about once; a timeout that a
//! stall caused is recognised as spurious (RFC 3522) and undone instead of
//! resending the flight still on its way; a timeout after real loss is not
//! undone.

use std::time::Duration;

use tcp_offload::tcp::{Config, ConnStats};
use tcp_offload::Instant;
use tcp_sim::bulk::{Apps, Transfer, TransferSpec};
use tcp_sim::{Host, Link, LinkConfig, Network};

const MIB: u64 = 1024 * 1024;
const DEADLINE: Instant = Instant::from_millis(1_000_000);
/// A full-sized frame on the wire (1460-byte MSS).
const FRAME: usize = 1514;

/// Client → server, `bytes`, over a `bps` bottleneck with a drop-tail
/// queue of `queue_frames` full-sized frames; the receiver offers a Linux
/// bulk receiver's window (3 MiB) and holds out-of-order data like one.
fn spec(seed: u64, bps: u64, queue_frames: usize, latency: Duration, bytes: u64) -> TransferSpec {
    let receiver = Config {
        recv_buffer: 3 * MIB as usize,
        max_ooo_segments: 4096,
        ..Config::default()
    };
    let up = LinkConfig::perfect()
        .with_latency(latency)
        .with_bandwidth(bps)
        .with_queue_limit(queue_frames * FRAME);
    TransferSpec {
        seed,
        client: Config::default(),
        server: receiver,
        uplink: up,
        downlink: LinkConfig::perfect().with_latency(latency),
        client_bytes: bytes,
        server_bytes: 0,
        verify: true,
        static_arp: true,
    }
}

/// What the sender went through.
#[derive(Debug)]
struct Outcome {
    queue_drops: u64,
    stats: ConnStats,
}

/// Runs `t` to the end, calling `hook` every round (it may change the
/// links); returns the sender's counters and the bottleneck's drops.
fn run(mut t: Transfer, mut hook: impl FnMut(&mut Network<Host>, &mut Apps, &Link)) -> Outcome {
    let link = t.link;
    t.run_until(DEADLINE, |net, apps| {
        hook(net, apps, &link);
        apps.finished()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.apps.bytes_received(), t.apps.client_app.queued);
    Outcome {
        queue_drops: t.net.link_stats(t.link.forward).dropped_queue,
        stats: t.apps.client_app.conn_stats,
    }
}

#[test]
fn tail_drops_of_a_bulk_flight_are_repaired_without_a_timeout() {
    for (seed, bps, queue, latency) in [
        (1, 200_000_000, 1000, Duration::from_micros(100)),
        (2, 100_000_000, 1000, Duration::from_micros(100)),
        (3, 400_000_000, 200, Duration::from_micros(500)),
        (4, 50_000_000, 100, Duration::from_millis(1)),
    ] {
        let t = Transfer::new(&spec(seed, bps, queue, latency, 32 * MIB)).unwrap();
        let o = run(t, |_, _, _| {});
        println!("tail drops: {bps} bit/s, queue {queue} frames, {latency:?}: {o:?}");
        let s = &o.stats;
        // Slow start overshoots the queue: a burst of drops at the tail.
        assert!(o.queue_drops >= queue as u64 / 2, "{o:?}");
        assert_eq!((s.rto_expirations, s.spurious_rtos), (0, 0), "{o:?}");
        assert!(s.fast_retransmits >= 1, "{o:?}");
        // Each dropped frame resent once, give or take a probe or rescue
        // per episode.
        assert!(s.retransmits >= o.queue_drops, "{o:?}");
        assert!(
            s.retransmits <= o.queue_drops + 4 * s.fast_retransmits,
            "{o:?}"
        );
    }
}

/// The bulk transfer of `tail_drops_…`, whose return path's delay jumps
/// to `spike` (and stays) once `trigger` holds: the receiver stalls, then
/// answers everything late.
fn delay_spike(spike: Duration, trigger: impl Fn(&ConnStats, Duration) -> bool) -> Outcome {
    let t = Transfer::new(&spec(
        1,
        200_000_000,
        1000,
        Duration::from_micros(100),
        32 * MIB,
    ))
    .unwrap();
    let mut start = None;
    let mut spiked = false;
    run(t, |net, apps, link| {
        let now = net.now();
        let since = now - *start.get_or_insert(now);
        if !spiked && trigger(&apps.client_app.conn_stats, since) {
            let cfg = net.link_config(link.backward).clone().with_latency(spike);
            net.set_link_config(link.backward, cfg);
            spiked = true;
        }
    })
}

#[test]
fn a_timeout_caused_by_a_stall_in_mid_flight_is_undone() {
    let o = delay_spike(Duration::from_millis(600), |_, since| {
        since > Duration::from_millis(150)
    });
    println!("stall in mid-flight: {o:?}");
    let s = &o.stats;
    assert!(s.rto_expirations >= 1, "{o:?}");
    assert_eq!(s.spurious_rtos, 1, "{o:?}");
    // Without the undo the flight still on its way is resent (about 240
    // frames more than were dropped).
    assert!(s.retransmits <= o.queue_drops + 8, "{o:?}");
}

#[test]
fn a_timeout_caused_by_a_stall_in_recovery_is_undone() {
    for spike in [300, 600, 1500].map(Duration::from_millis) {
        let o = delay_spike(spike, |s, _| s.fast_retransmits >= 1);
        println!("stall in recovery, {spike:?}: {o:?}");
        let s = &o.stats;
        assert!(s.rto_expirations >= 1, "{o:?}");
        assert_eq!(s.spurious_rtos, 1, "{o:?}");
        assert!(s.retransmits <= o.queue_drops + 8, "{o:?}");
    }
}

#[test]
fn a_timeout_after_real_loss_is_not_undone() {
    let t = Transfer::new(&spec(
        5,
        200_000_000,
        1000,
        Duration::from_micros(100),
        8 * MIB,
    ))
    .unwrap();
    let mut start = None;
    let mut phase = 0;
    let o = run(t, |net, _, link| {
        let now = net.now();
        let since = now - *start.get_or_insert(now);
        let fwd = link.forward;
        if phase == 0 && since > Duration::from_millis(100) {
            // Everything sent from now on is lost for 700 ms.
            let cfg = net.link_config(fwd).clone().with_loss(1.0);
            net.set_link_config(fwd, cfg);
            phase = 1;
        } else if phase == 1 && since > Duration::from_millis(800) {
            let cfg = net.link_config(fwd).clone().with_loss(0.0);
            net.set_link_config(fwd, cfg);
            phase = 2;
        }
    });
    println!("outage: {o:?}");
    let s = &o.stats;
    assert!(s.rto_expirations >= 1, "{o:?}");
    assert_eq!(s.spurious_rtos, 0, "{o:?}");
}
