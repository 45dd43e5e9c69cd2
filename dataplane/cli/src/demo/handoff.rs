//! The demo's cross-core baseline: one thread writes each message into a
//! buffer and hands it over, another reads every byte of it once (the
//! Internet checksum's sum, the sink's first pass) and hands it back.
//! Over the demo's ring ports every payload byte is written on the
//! source's core and first read on the sink's, so this is the most two
//! endpoints on two cores can move: a ceiling set by the machine, not by
//! the protocol. Measured before the endpoints start, never on the data
//! path.
//!
//! The two threads are pinned to two different cores when the process may
//! use two. Left to the scheduler, a blocking hand-off often runs both on
//! one core in turn, the bytes never leave its cache, and the figure is a
//! one-core copy (measured on a two-vCPU machine: 33 GB/s unpinned against
//! 2.5 to 8 GB/s pinned apart, depending on where the host placed the two
//! vCPUs).

use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

use super::MB;

/// Buffers in flight between the two threads, each of the message size:
/// at most 64 MiB in all, but never fewer than two.
const DEPTH: usize = 64;

/// MiB/s of messages of `size` bytes handed from one thread to another
/// for `limit`, each written whole by the first and read whole by the
/// second; the median of `runs`. `None` if a thread could not be started.
pub fn handoff_median(size: usize, limit: Duration, runs: usize) -> Option<f64> {
    let mut rates: Vec<f64> = (0..runs.max(1))
        .map(|_| handoff(size, limit))
        .collect::<Option<_>>()?;
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied()
}

/// Two different cores of the ones this process may use, for the writer
/// and the reader; `None` when it may use fewer than two.
fn two_cores() -> Option<(core_affinity::CoreId, core_affinity::CoreId)> {
    let cores = core_affinity::get_core_ids()?;
    match cores.as_slice() {
        [a, b, ..] => Some((*a, *b)),
        _ => None,
    }
}

fn handoff(size: usize, limit: Duration) -> Option<f64> {
    let cores = two_cores();
    // The reader runs on a thread of its own, so that pinning it leaves
    // the caller's CPU set (which later threads inherit) as it was.
    std::thread::Builder::new()
        .name("demo-handoff-rx".into())
        .spawn(move || {
            if let Some((_, reader)) = cores {
                core_affinity::set_for_current(reader);
            }
            handoff_on(size, limit, cores.map(|(writer, _)| writer))
        })
        .ok()?
        .join()
        .ok()?
}

fn handoff_on(
    size: usize,
    limit: Duration,
    writer_core: Option<core_affinity::CoreId>,
) -> Option<f64> {
    let size = size.max(1);
    let depth = DEPTH.min((64 << 20) / size).max(2);
    let (full_tx, full_rx) = sync_channel::<Vec<u8>>(depth);
    let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(depth);
    for _ in 0..depth {
        empty_tx.send(vec![0u8; size]).ok()?;
    }
    let writer = std::thread::Builder::new()
        .name("demo-handoff".into())
        .spawn(move || {
            if let Some(c) = writer_core {
                core_affinity::set_for_current(c);
            }
            let src: Vec<u8> = (0..size).map(|i| (i * 131 + 7) as u8).collect();
            while let Ok(mut buf) = empty_rx.recv() {
                buf.copy_from_slice(&src);
                if full_tx.send(buf).is_err() {
                    break;
                }
            }
        })
        .ok()?;
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut sum = 0u32;
    while start.elapsed() < limit {
        let Ok(buf) = full_rx.recv() else {
            break;
        };
        sum = tcp_offload::wire::checksum::combine(
            sum,
            tcp_offload::wire::checksum::sum(std::hint::black_box(&buf)),
        );
        bytes += buf.len() as u64;
        if empty_tx.send(buf).is_err() {
            break;
        }
    }
    let t = start.elapsed();
    std::hint::black_box(sum);
    // The writer ends once both channels are gone.
    drop((empty_tx, full_rx));
    writer.join().ok()?;
    Some(bytes as f64 / t.as_secs_f64().max(1e-9) / MB)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_bytes_and_takes_about_its_limit() {
        let t = Instant::now();
        let r = handoff_median(4096, Duration::from_millis(30), 3).expect("threads");
        assert!(r > 0.0, "{r}");
        assert!(t.elapsed() < Duration::from_secs(5));
        // A message larger than the in-flight cap still moves.
        assert!(handoff(48 << 20, Duration::from_millis(10)).is_some_and(|r| r > 0.0));
    }

    #[test]
    fn writer_and_reader_get_two_different_cores() {
        let cpus = core_affinity::get_core_ids().map_or(0, |c| c.len());
        match two_cores() {
            Some((a, b)) => assert_ne!(a.id, b.id),
            None => assert!(cpus < 2, "{cpus} CPUs allowed but no pair chosen"),
        }
    }
}
