//! Simulated bulk transfer: bytes moved per second of CPU time, against a
//! memcpy of the same bytes measured in the same run.
//!
//! One iteration moves 16 MiB from one engine to another through the
//! deterministic simulator over a lossless link with no bandwidth limit,
//! so that the run is bound by CPU alone: building the records (the
//! application's pattern), segmenting, checksumming and framing on the
//! sender, parsing, verifying checksums and reassembling on the receiver,
//! ACK processing, and the simulator's own event queue. Received bytes are
//! counted, not compared, while timed; one untimed run first checks every
//! byte. Time is the benchmark thread's CPU time
//! ([`benches::thread_cpu`]), so that other processes on a shared machine
//! do not inflate it. After
//! criterion's own output the ratios to the memcpy baseline are printed.

use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use tcp_offload::tcp::Config;
use tcp_offload::Instant;
use tcp_sim::bulk::{Transfer, TransferSpec};
use tcp_sim::LinkConfig;

const BYTES: u64 = 16 << 20;

fn spec(tcp: Config, verify: bool) -> TransferSpec {
    TransferSpec {
        server_bytes: 0,
        static_arp: true,
        verify,
        ..TransferSpec::symmetric(1, tcp, LinkConfig::perfect(), BYTES)
    }
}

/// Runs one transfer to its clean close; returns the bytes received.
fn transfer(spec: &TransferSpec) -> u64 {
    let mut t = Transfer::new(spec).expect("connect");
    t.run(Instant::from_millis(3_600_000)).expect("transfer");
    t.apps.server_app.received
}

/// Total time and iterations seen by one benchmark, for the ratios.
#[derive(Default)]
struct Tally {
    time: Cell<Duration>,
    iters: Cell<u64>,
}

impl Tally {
    fn add(&self, d: Duration, iters: u64) {
        self.time.set(self.time.get() + d);
        self.iters.set(self.iters.get() + iters);
    }
    fn per_iter(&self) -> Option<Duration> {
        let n = u32::try_from(self.iters.get()).ok().filter(|&n| n > 0)?;
        Some(self.time.get() / n)
    }
}

fn main() {
    for tcp in [Config::default(), Config::iwarp_hardware()] {
        assert_eq!(transfer(&spec(tcp, true)), BYTES, "verified run");
    }

    let mut c = Criterion::default()
        .sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    let src: Vec<u8> = (0..BYTES).map(|i| (i * 31 + 7) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    let memcpy = Tally::default();
    let default_profile = Tally::default();
    let hw_profile = Tally::default();

    let mut g = c.benchmark_group("bulk");
    g.throughput(Throughput::Bytes(BYTES));
    g.bench_function("memcpy_16MiB", |b| {
        b.iter_custom(|iters| {
            let t0 = benches::thread_cpu();
            for _ in 0..iters {
                dst.copy_from_slice(black_box(&src));
                black_box(&mut dst);
            }
            let d = benches::thread_cpu() - t0;
            memcpy.add(d, iters);
            d
        })
    });
    for (name, tcp, tally) in [
        (
            "sim_16MiB_default_profile",
            Config::default(),
            &default_profile,
        ),
        (
            "sim_16MiB_iwarp_hardware_profile",
            Config::iwarp_hardware(),
            &hw_profile,
        ),
    ] {
        let spec = spec(tcp, false);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let t0 = benches::thread_cpu();
                for _ in 0..iters {
                    black_box(transfer(black_box(&spec)));
                }
                let d = benches::thread_cpu() - t0;
                tally.add(d, iters);
                d
            })
        });
    }
    g.finish();
    c.final_summary();

    let Some(base) = memcpy.per_iter() else {
        return;
    };
    let rate = |d: Duration| BYTES as f64 / d.as_secs_f64() / 1e9;
    println!(
        "\nbulk transfer of {} MiB, per second of thread CPU time (means over every iteration run):",
        BYTES >> 20
    );
    println!("  {:<34} {:>8.2} GB/s", "memcpy (baseline)", rate(base));
    for (name, tally) in [
        ("simulated, default profile", &default_profile),
        ("simulated, iWARP hardware profile", &hw_profile),
    ] {
        if let Some(t) = tally.per_iter() {
            println!(
                "  {name:<34} {:>8.3} GB/s  {:>7.1}x the memcpy time",
                rate(t),
                t.as_secs_f64() / base.as_secs_f64()
            );
        }
    }
}
