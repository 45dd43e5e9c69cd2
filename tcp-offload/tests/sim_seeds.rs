//! Many seeds of a bidirectional bulk transfer over an impaired link.
//!
//! Each seed draws a loss rate in 0–5 %, reordering, duplication and
//! corruption rates, a latency and a pair of peer profiles (the Linux-like
//! default and the hardware iWARP profile without SACK or timestamps),
//! then moves 1 MiB each way as records of `send_capacity()` bytes, checks
//! every byte on arrival, and requires both connections to close cleanly
//! within a virtual-time deadline. `SIM_SEEDS` sets the number of seeds
//! (default 200); they are split over several tests so that the test
//! runner can use every core.
#![allow(
    clippy::disallowed_methods,
    reason = "the seed counts come from the environment"
)]

use std::time::Duration;

use tcp_offload::tcp::{Config, State};
use tcp_offload::wire::WireError;
use tcp_offload::Instant;
use tcp_sim::bulk::{Transfer, TransferSpec};
use tcp_sim::{LinkConfig, Rng};

const BYTES_EACH_WAY: u64 = 1 << 20;
const SHARDS: u64 = 4;
/// Virtual time a seed may take, handshake to TIME-WAIT's end.
const DEADLINE: Duration = Duration::from_secs(900);
/// The same for the harsh seeds: at 12 % loss each way, a sender without
/// timestamps (whose RTO stays backed off until a segment that was never
/// retransmitted is acknowledged, RFC 6298 §5 with Karn's rule) facing a
/// receiver that keeps two out-of-order segments moves 1 MiB in some
/// twenty minutes.
const HARSH_DEADLINE: Duration = Duration::from_secs(3600);

fn seed_count() -> u64 {
    std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

fn profile(hardware: bool) -> Config {
    if hardware {
        Config::iwarp_hardware()
    } else {
        Config::default()
    }
}

/// The spec of seed `seed`: every parameter is drawn from it.
fn spec(seed: u64) -> TransferSpec {
    let mut r = Rng::derive(seed, 0x5eed);
    let loss = 0.05 * r.next_f64();
    let link = LinkConfig::perfect()
        .with_latency(Duration::from_micros(r.range_inclusive(20, 5_000)))
        .with_jitter(Duration::from_micros(r.range_inclusive(0, 200)))
        .with_loss(loss)
        .with_reorder(
            0.03 * r.next_f64(),
            Duration::from_micros(r.range_inclusive(100, 3_000)),
        )
        .with_duplicate(0.01 * r.next_f64())
        .with_corrupt(0.01 * r.next_f64());
    // A quarter of the seeds also squeeze through a bottleneck with a
    // drop-tail queue, so that congestion losses join the random ones.
    let link = if r.below(4) == 0 {
        let bps = r.range_inclusive(50, 1_000) * 1_000_000;
        link.with_bandwidth(bps)
            .with_queue_limit(r.range_inclusive(8, 96) as usize * 1024)
    } else {
        link
    };
    let (client_hw, server_hw) = (seed & 1 == 1, seed & 2 == 2);
    TransferSpec {
        seed,
        client: profile(client_hw),
        server: profile(server_hw),
        uplink: link.clone(),
        downlink: link,
        client_bytes: BYTES_EACH_WAY,
        server_bytes: BYTES_EACH_WAY,
        verify: true,
        // Half the seeds resolve ARP over the impaired link first.
        static_arp: seed & 4 == 4,
    }
}

/// What a set of seeds went through, summed.
#[derive(Debug, Default)]
struct Totals {
    seeds: u64,
    bytes_verified: u64,
    frames: u64,
    lost: u64,
    queue_drops: u64,
    corrupted: u64,
    reordered: u64,
    duplicated: u64,
    checksum_drops: u64,
    retransmits: u64,
    fast_retransmits: u64,
    rto_expirations: u64,
    spurious_rtos: u64,
    tail_loss_probes: u64,
    virtual_ms: u64,
}

/// A harsher spec: up to 12 % loss and 10 % reordering, and engine
/// configurations off the beaten track (small buffers, few out-of-order
/// slots, small MSS, no delayed ACK), so that the bounds and corner paths
/// of the engine are exercised too.
fn harsh_spec(seed: u64) -> TransferSpec {
    let mut r = Rng::derive(seed, 0x4a25);
    let loss = 0.12 * r.next_f64();
    let link = LinkConfig::perfect()
        .with_latency(Duration::from_micros(r.range_inclusive(10, 20_000)))
        .with_jitter(Duration::from_micros(r.range_inclusive(0, 2_000)))
        .with_loss(loss)
        .with_reorder(
            0.10 * r.next_f64(),
            Duration::from_micros(r.range_inclusive(50, 10_000)),
        )
        .with_duplicate(0.05 * r.next_f64())
        .with_corrupt(0.03 * r.next_f64());
    let config = |r: &mut Rng| {
        let mut c = profile(r.below(2) == 0);
        c.recv_buffer = r.range_inclusive(16, 512) as usize * 1024;
        c.max_ooo_segments = r.range_inclusive(2, 64) as usize;
        c.mss = r.range_inclusive(536, 1460) as u16;
        if r.below(3) == 0 {
            c.delayed_ack = Duration::ZERO;
        }
        c.initial_window_segments = r.range_inclusive(1, 10) as u32;
        c
    };
    let client = config(&mut r);
    let server = config(&mut r);
    TransferSpec {
        seed,
        client,
        server,
        uplink: link.clone(),
        downlink: link,
        client_bytes: BYTES_EACH_WAY,
        server_bytes: BYTES_EACH_WAY,
        verify: true,
        static_arp: r.below(2) == 0,
    }
}

/// Runs one seed and adds what it did to `totals`.
fn run_seed(seed: u64, totals: &mut Totals) {
    run_spec(seed, spec(seed), DEADLINE, totals);
}

fn run_spec(seed: u64, spec: TransferSpec, deadline: Duration, totals: &mut Totals) {
    let mut t = Transfer::new(&spec).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let deadline = Instant::ZERO + deadline;
    let result = t.run(deadline);
    let describe = |t: &Transfer| {
        format!(
            "seed {seed}: link {:?}\n client {:?} {:?}\n server {:?} {:?}\n up {:?}\n down {:?}",
            spec.uplink,
            t.client_conn().map(|c| (c.state(), *c.stats())),
            t.apps.client_app,
            t.server_conn().map(|c| (c.state(), *c.stats())),
            t.apps.server_app,
            t.net.link_stats(t.link.forward),
            t.net.link_stats(t.link.backward),
        )
    };
    let finished_at = match result {
        Ok(at) => at,
        Err(e) => panic!("{e}\n{}", describe(&t)),
    };
    let apps = &t.apps;
    assert_eq!(apps.client_app.received, BYTES_EACH_WAY, "{}", describe(&t));
    assert_eq!(apps.server_app.received, BYTES_EACH_WAY, "{}", describe(&t));
    assert_eq!(apps.client_app.acked, BYTES_EACH_WAY);
    assert_eq!(apps.server_app.acked, BYTES_EACH_WAY);
    // Both ends are gone from their tables: closed, not reset.
    for conn in [t.client_conn(), t.server_conn()].into_iter().flatten() {
        assert_eq!(conn.state(), State::Closed, "{}", describe(&t));
    }
    totals.seeds += 1;
    totals.bytes_verified += apps.bytes_received();
    totals.virtual_ms += finished_at.total_millis();
    for dir in [t.link.forward, t.link.backward] {
        let l = t.net.link_stats(dir);
        totals.frames += l.sent;
        totals.lost += l.dropped_loss;
        totals.queue_drops += l.dropped_queue;
        totals.corrupted += l.corrupted;
        totals.reordered += l.reordered;
        totals.duplicated += l.duplicated;
    }
    for host in [t.client_host(), t.server_host()] {
        totals.checksum_drops += host.iface().stats().drops_for(WireError::BadChecksum);
    }
    for app in [&apps.client_app, &apps.server_app] {
        totals.retransmits += app.conn_stats.retransmits;
        totals.fast_retransmits += app.conn_stats.fast_retransmits;
        totals.rto_expirations += app.conn_stats.rto_expirations;
        totals.spurious_rtos += app.conn_stats.spurious_rtos;
        totals.tail_loss_probes += app.conn_stats.tail_loss_probes;
    }
}

fn shard(k: u64) {
    let n = seed_count();
    let mut t = Totals::default();
    for seed in (0..n).filter(|s| s % SHARDS == k) {
        run_seed(seed, &mut t);
    }
    println!(
        "sim seeds: shard {k}/{SHARDS}: {} seeds of {n}, {} bytes verified ({} MiB each way per seed)",
        t.seeds,
        t.bytes_verified,
        BYTES_EACH_WAY >> 20
    );
    println!("sim seeds: shard {k}/{SHARDS}: {t:?}");
    assert_eq!(t.seeds, (0..n).filter(|s| s % SHARDS == k).count() as u64);
    assert_eq!(t.bytes_verified, t.seeds * 2 * BYTES_EACH_WAY);
    if t.seeds >= 10 {
        // The impairments did happen, and checksums caught the corruption:
        // a corrupted frame fails a checksum unless the flips all landed
        // in Ethernet padding (short frames only), or it was lost later.
        assert!(
            t.lost > 0 && t.reordered > 0 && t.duplicated > 0 && t.corrupted > 0,
            "{t:?}"
        );
        assert!(t.checksum_drops * 10 >= t.corrupted * 8, "{t:?}");
        assert!(t.checksum_drops <= t.corrupted, "{t:?}");
        assert!(t.fast_retransmits > 0 && t.rto_expirations > 0, "{t:?}");
    }
}

#[test]
fn seeds_shard_0() {
    shard(0);
}

#[test]
fn seeds_shard_1() {
    shard(1);
}

#[test]
fn seeds_shard_2() {
    shard(2);
}

#[test]
fn seeds_shard_3() {
    shard(3);
}

/// Seeds of [`harsh_spec`]; `SIM_HARSH_SEEDS` sets how many (default 50).
#[test]
fn harsh_seeds() {
    let n = std::env::var("SIM_HARSH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50u64);
    let mut t = Totals::default();
    for seed in 0..n {
        run_spec(seed, harsh_spec(seed), HARSH_DEADLINE, &mut t);
    }
    println!(
        "sim harsh seeds: {} seeds, {} bytes verified",
        t.seeds, t.bytes_verified
    );
    println!("sim harsh seeds: {t:?}");
    assert_eq!(t.bytes_verified, n * 2 * BYTES_EACH_WAY);
}
