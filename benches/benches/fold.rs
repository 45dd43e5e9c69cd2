//! The TCP checksum folded into the MPA CRC32c pass (ARCHITECTURE.md,
//! "Checksums"): what the send path pays per FPDU payload on a port that
//! cannot offload the TCP checksum, against a memcpy of the same bytes
//! measured in the same run.
//!
//! The payload stays in a registered region (`dataplane::memory::Region`,
//! read through its word-wise loads, as the worker reads it):
//! - `crc_only`: the MPA CRC pass alone (`Region::crc32c_append`), what a
//!   port with checksum offload pays;
//! - `separate`: the CRC pass, then a second pass for the Internet
//!   checksum's partial sum (`Region::checksum_sum`), as the transmit path
//!   did before the sum was kept in the record;
//! - `folded`: one pass feeding each chunk to both
//!   (`Region::crc32c_and_sum`), what the record now carries.
//!
//! Sizes from one FPDU's payload at MTU 1500 (1,428 bytes, where the
//! pass's start and end weigh most) to 64 KiB (a jumbo-frame FPDU is
//! about 9 KiB; the larger sizes show the trend once the payload leaves
//! L1). The baseline `memcpy` copies the same number of bytes between
//! two vectors. Time is
//! the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so other
//! processes on a shared machine do not inflate one figure and not its
//! baseline. After criterion's own output the ratios are printed.

use std::hint::black_box;

use benches::Estimates;
use criterion::{Bencher, Criterion, Throughput};
use dataplane::memory::Region;

const SIZES: [usize; 5] = [1428, 4 << 10, 16 << 10, 32 << 10, 64 << 10];

/// Offset of the payload in its region: odd, as a payload after a
/// 14-octet tagged header at an arbitrary application address may be.
const OFFSET: usize = 3;

/// Times `f` in thread CPU time.
fn cpu_iter<O>(b: &mut Bencher<'_>, mut f: impl FnMut() -> O) {
    b.iter_custom(|iters| {
        let t0 = benches::thread_cpu();
        for _ in 0..iters {
            black_box(f());
        }
        benches::thread_cpu() - t0
    })
}

fn bench(c: &mut Criterion) {
    for len in SIZES {
        let region = Region::new(OFFSET + len).expect("region");
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + i / 257) as u8).collect();
        region.write(OFFSET, &data).expect("write");
        // The folded pass computes what the two passes compute.
        let (crc, sum) = region.crc32c_and_sum(0, OFFSET, len);
        assert_eq!(crc, region.crc32c_append(0, OFFSET, len));
        assert_eq!(crc, crc32c::crc32c(&data));
        let fold = tcp_offload::wire::checksum::fold;
        assert_eq!(fold(sum), fold(region.checksum_sum(OFFSET, len)));
        assert_eq!(fold(sum), fold(tcp_offload::wire::checksum::sum(&data)));

        let mut g = c.benchmark_group(format!("fold_{len}"));
        g.throughput(Throughput::Bytes(len as u64));
        let mut out = vec![0u8; len];
        g.bench_function("memcpy", |b| {
            cpu_iter(b, || {
                out.copy_from_slice(black_box(&data));
                black_box(&out);
            })
        });
        g.bench_function("crc_only", |b| {
            cpu_iter(b, || region.crc32c_append(0, black_box(OFFSET), len))
        });
        g.bench_function("separate", |b| {
            cpu_iter(b, || {
                let crc = region.crc32c_append(0, black_box(OFFSET), len);
                (crc, region.checksum_sum(black_box(OFFSET), len))
            })
        });
        g.bench_function("folded", |b| {
            cpu_iter(b, || region.crc32c_and_sum(0, black_box(OFFSET), len))
        });
        g.finish();
    }
}

fn main() {
    let est = Estimates::new(env!("CARGO_TARGET_TMPDIR"));
    let mut c = Criterion::default()
        .output_directory(est.dir())
        .configure_from_args();
    bench(&mut c);
    c.final_summary();

    println!("\nCRC32c and TCP checksum over registered memory (thread CPU time)");
    println!(
        "  {:>6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>16}",
        "bytes", "memcpy ns", "crc_only", "separate", "folded", "GB/s", "folded/separate"
    );
    for len in SIZES {
        let group = format!("fold_{len}");
        let get = |name: &str| est.ns(&group, name);
        let (Some(copy), Some(crc), Some(sep), Some(fold)) = (
            get("memcpy"),
            get("crc_only"),
            get("separate"),
            get("folded"),
        ) else {
            continue;
        };
        // Each figure as a multiple of the memcpy of the same bytes.
        println!(
            "  {len:>6} {copy:>10.1} {:>8.2}x {:>8.2}x {:>8.2}x {:>9.2} {:>16.2}",
            crc / copy,
            sep / copy,
            fold / copy,
            len as f64 / fold,
            fold / sep
        );
    }
}
