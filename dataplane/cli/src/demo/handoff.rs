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
//! use two, so that the figure never comes from one core taking turns
//! with itself. Where those cores sit decides it: on a two-vCPU virtual
//! machine it measured 32 to 37 GB/s while a cache line went from one
//! vCPU to the other and back in about 60 ns (cores sharing a cache) and
//! 1.8 to 2.3 GB/s while that took about 320 ns, the host having moved
//! the vCPUs apart; [`line_round_trip_ns`] measures that distance.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{PageBuf, MB};

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

/// Starts a thread named `name` that runs `f` on `core` (anywhere when
/// `None`). Every thread of these baselines is its own, so that pinning
/// it leaves the caller's CPU set, which later threads inherit, as it
/// was.
fn spawn_pinned<T: Send + 'static>(
    name: &str,
    core: Option<core_affinity::CoreId>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<std::thread::JoinHandle<T>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Some(c) = core {
                core_affinity::set_for_current(c);
            }
            f()
        })
        .ok()
}

fn handoff(size: usize, limit: Duration) -> Option<f64> {
    let cores = two_cores();
    let (writer, reader) = (cores.map(|c| c.0), cores.map(|c| c.1));
    spawn_pinned("demo-handoff-rx", reader, move || {
        handoff_on(size, limit, writer)
    })?
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
    let (full_tx, full_rx) = sync_channel::<PageBuf>(depth);
    let (empty_tx, empty_rx) = sync_channel::<PageBuf>(depth);
    for _ in 0..depth {
        empty_tx.send(PageBuf::new(size)).ok()?;
    }
    let writer = spawn_pinned("demo-handoff", writer_core, move || {
        let src = PageBuf::patterned(size);
        while let Ok(mut buf) = empty_rx.recv() {
            buf.bytes_mut().copy_from_slice(src.bytes());
            if full_tx.send(buf).is_err() {
                break;
            }
        }
    })?;
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut sum = 0u32;
    while start.elapsed() < limit {
        let Ok(buf) = full_rx.recv() else {
            break;
        };
        sum = tcp_offload::wire::checksum::combine(
            sum,
            tcp_offload::wire::checksum::sum(std::hint::black_box(buf.bytes())),
        );
        bytes += buf.bytes().len() as u64;
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

/// Round trips timed together in [`line_round_trip_ns`].
const ROUND_TRIPS_PER_BATCH: u64 = 1000;

/// The value that tells the answering thread to end.
const STOP: u64 = u64::MAX;

/// The shortest wait for the other thread before the round trips end:
/// on a loaded machine a batch may take many scheduler slices.
const GIVE_UP_AT_LEAST: Duration = Duration::from_secs(1);

/// Nanoseconds for one cache line to go from one core to the other and
/// back: two threads pinned to two cores take turns writing one word,
/// each waiting for the other's write, for about `limit`; the median of
/// batches of [`ROUND_TRIPS_PER_BATCH`]. It says how near each other the
/// two cores are (on a virtual machine, where the host put its vCPUs at
/// the time): tens of nanoseconds for cores sharing a cache, hundreds
/// across dies or sockets, and every figure of the ring demo follows it.
/// `None` where the process may use only one core, or when the other
/// thread answered not once within four times `limit` (a second at
/// least); a batch cut short by that wait counts with the round trips it
/// made.
pub fn line_round_trip_ns(limit: Duration) -> Option<f64> {
    let (a, b) = two_cores()?;
    let line = Arc::new(AtomicU64::new(0));
    let answer = Arc::clone(&line);
    let answerer = spawn_pinned("demo-rtt", Some(b), move || {
        let mut expect = 1u64;
        loop {
            match answer.load(Ordering::Acquire) {
                STOP => break,
                v if v == expect => {
                    answer.store(v + 1, Ordering::Release);
                    expect += 2;
                }
                _ => std::hint::spin_loop(),
            }
        }
    })?;
    let asker = spawn_pinned("demo-rtt-ask", Some(a), move || {
        let start = Instant::now();
        let give_up = (limit * 4).max(GIVE_UP_AT_LEAST);
        let mut v = 0u64;
        let mut batches = Vec::new();
        'run: while start.elapsed() < limit {
            let t = Instant::now();
            for done in 0..ROUND_TRIPS_PER_BATCH {
                line.store(v + 1, Ordering::Release);
                let mut spins = 0u32;
                while line.load(Ordering::Acquire) != v + 2 {
                    spins = spins.wrapping_add(1);
                    if spins % 4096 == 0 && start.elapsed() > give_up {
                        // A loaded machine may leave the other thread
                        // waiting for its core for a long while: the
                        // round trips made so far still count, at
                        // what they took.
                        if done > 0 {
                            batches.push(t.elapsed().as_nanos() as f64 / done as f64);
                        }
                        break 'run;
                    }
                    std::hint::spin_loop();
                }
                v += 2;
            }
            batches.push(t.elapsed().as_nanos() as f64 / ROUND_TRIPS_PER_BATCH as f64);
        }
        line.store(STOP, Ordering::Release);
        batches.sort_by(f64::total_cmp);
        batches.get(batches.len() / 2).copied()
    })?;
    let r = asker.join().ok()?;
    answerer.join().ok()?;
    r
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
    fn a_line_round_trip_takes_a_positive_time_or_needs_two_cores() {
        let t = Instant::now();
        match line_round_trip_ns(Duration::from_millis(20)) {
            Some(ns) => assert!(ns > 0.0 && ns < 1e7, "{ns} ns"),
            None => assert!(two_cores().is_none(), "two cores, but no figure"),
        }
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_line_round_trip_is_measured_on_a_loaded_machine() {
        let Some((a, b)) = two_cores() else { return };
        // Threads spinning on both cores, as other processes would: the
        // two measuring threads get their cores only part of the time.
        let stop = Arc::new(AtomicU64::new(0));
        let load: Vec<_> = [a, b, a, b, a, b, a, b]
            .into_iter()
            .map(|core| {
                let stop = Arc::clone(&stop);
                spawn_pinned("load", Some(core), move || {
                    while stop.load(Ordering::Relaxed) == 0 {
                        std::hint::spin_loop();
                    }
                })
                .expect("load thread")
            })
            .collect();
        let r = line_round_trip_ns(Duration::from_millis(20));
        stop.store(1, Ordering::Relaxed);
        for t in load {
            t.join().expect("load thread ends");
        }
        assert!(r.is_some_and(|ns| ns > 0.0), "{r:?}");
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
