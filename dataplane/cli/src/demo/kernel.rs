//! The demo's same-run kernel baselines: what the kernel's own TCP does
//! over loopback on this machine at the same moment, through `std::net`.
//! The bandwidth baseline is one stream of messages of the demo's size,
//! the receiver reading every byte into a buffer; both threads' CPU time
//! is counted (on loopback, the kernel's TCP work runs in them).
//! [`median_stream`] runs a few and keeps the median one. The latency
//! baseline, [`ping_pong`], bounces one message of the latency rounds'
//! size back and forth with `TCP_NODELAY` and reports half of each round
//! trip, as perftest and sockperf do.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Instant;

use super::cpu::{self, CpuUse};
use crate::runner::{LatencySummary, MB};

/// One kernel stream's figures.
#[derive(Debug, Clone, Copy)]
pub struct KernelStream {
    /// Bytes the receiver read.
    pub bytes: u64,
    /// From the first write to the receiver's last byte, seconds.
    pub seconds: f64,
    /// MiB/s.
    pub mbps: f64,
    /// The sending thread.
    pub sender: CpuUse,
    /// The receiving thread.
    pub receiver: CpuUse,
}

/// How long a stream runs.
#[derive(Debug, Clone, Copy)]
pub enum Limit {
    /// This many bytes (rounded up to whole messages, at least one).
    Bytes(u64),
    /// Messages are written until this many seconds have passed.
    Seconds(f64),
}

/// Sends messages of `size` bytes for `limit` over one loopback TCP
/// connection, and reads them all on another thread.
pub fn stream(size: usize, limit: Limit) -> std::io::Result<KernelStream> {
    let size = size.max(1);
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    let addr = listener.local_addr()?;
    let receiver = std::thread::Builder::new()
        .name("kernel-tcp-rx".into())
        .spawn(move || -> std::io::Result<(u64, Instant, Option<u64>)> {
            let (mut s, _) = listener.accept()?;
            let cpu0 = cpu::own_ns();
            let mut buf = vec![0u8; size.max(64 << 10)];
            let mut got = 0u64;
            let mut fold = 0u8;
            loop {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                // Every byte lands in our buffer; one of each read is
                // looked at so that the reads cannot be elided.
                fold ^= buf[n - 1];
                got += n as u64;
            }
            std::hint::black_box(fold);
            let end = Instant::now();
            let cpu = cpu0.zip(cpu::own_ns()).map(|(a, b)| b.saturating_sub(a));
            Ok((got, end, cpu))
        })?;
    let mut s = TcpStream::connect(addr)?;
    let msg: Vec<u8> = (0..size).map(|i| (i * 131 + 7) as u8).collect();
    let cpu0 = cpu::own_ns();
    let start = Instant::now();
    let mut sent = 0u64;
    match limit {
        Limit::Bytes(n) => {
            for _ in 0..n.div_ceil(size as u64).max(1) {
                s.write_all(&msg)?;
                sent += size as u64;
            }
        }
        Limit::Seconds(t) => {
            let until = start + std::time::Duration::from_secs_f64(t);
            // The clock is read once per 64 KiB or so.
            let per_check = (65536 / size).max(1);
            loop {
                for _ in 0..per_check {
                    s.write_all(&msg)?;
                }
                sent += (per_check * size) as u64;
                if Instant::now() >= until {
                    break;
                }
            }
        }
    }
    s.shutdown(std::net::Shutdown::Write)?;
    let sender_cpu = cpu0.zip(cpu::own_ns()).map(|(a, b)| b.saturating_sub(a));
    let (got, end, receiver_cpu) = receiver
        .join()
        .map_err(|_| std::io::Error::other("the kernel TCP receiver panicked"))??;
    if got != sent {
        return Err(std::io::Error::other(format!(
            "the kernel TCP receiver read {got} of {sent} bytes"
        )));
    }
    let seconds = end.duration_since(start).as_secs_f64().max(1e-9);
    Ok(KernelStream {
        bytes: got,
        seconds,
        mbps: got as f64 / seconds / MB,
        sender: CpuUse::new(sender_cpu, got, seconds),
        receiver: CpuUse::new(receiver_cpu, got, seconds),
    })
}

/// Runs `n` streams (at least one) and returns the one with the median
/// bandwidth.
pub fn median_stream(size: usize, limit: Limit, n: usize) -> std::io::Result<KernelStream> {
    let mut all = (0..n.max(1))
        .map(|_| stream(size, limit))
        .collect::<std::io::Result<Vec<_>>>()?;
    all.sort_by(|a, b| a.mbps.total_cmp(&b.mbps));
    Ok(all[all.len() / 2])
}

/// Round trips a ping-pong makes before it measures: the connection's
/// buffers and the threads' caches settle first.
const PING_PONG_WARMUP: u64 = 100;

/// Bounces a message of `size` bytes over one loopback TCP connection
/// (`TCP_NODELAY` on both ends) `iterations` times after a short warm-up;
/// the echo runs on a thread of its own, reading each message whole
/// before it writes it back. Each sample is half a round trip.
pub fn ping_pong(size: usize, iterations: u64) -> std::io::Result<LatencySummary> {
    let size = size.max(1);
    let rounds = iterations.max(1) + PING_PONG_WARMUP;
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    let addr = listener.local_addr()?;
    let echo = std::thread::Builder::new()
        .name("kernel-tcp-echo".into())
        .spawn(move || -> std::io::Result<()> {
            let (mut s, _) = listener.accept()?;
            s.set_nodelay(true)?;
            let mut buf = vec![0u8; size];
            for _ in 0..rounds {
                s.read_exact(&mut buf)?;
                s.write_all(&buf)?;
            }
            Ok(())
        })?;
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let msg: Vec<u8> = (0..size).map(|i| (i * 131 + 7) as u8).collect();
    let mut back = vec![0u8; size];
    let mut samples = Vec::with_capacity(iterations as usize);
    for k in 0..rounds {
        let t0 = Instant::now();
        s.write_all(&msg)?;
        s.read_exact(&mut back)?;
        let rtt = t0.elapsed();
        if back != msg {
            return Err(std::io::Error::other(
                "the kernel TCP echo came back changed",
            ));
        }
        if k >= PING_PONG_WARMUP {
            samples.push(u64::try_from(rtt.as_nanos() / 2).unwrap_or(u64::MAX));
        }
    }
    echo.join()
        .map_err(|_| std::io::Error::other("the kernel TCP echo panicked"))??;
    LatencySummary::from_nanos(&samples)
        .ok_or_else(|| std::io::Error::other("the kernel TCP ping-pong took no samples"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_arrives_and_is_timed() {
        let k = stream(1000, Limit::Bytes(10_500)).unwrap();
        assert_eq!(k.bytes, 11_000, "whole messages");
        assert!(k.mbps > 0.0 && k.seconds > 0.0);
        let k = stream(1 << 20, Limit::Seconds(0.05)).unwrap();
        assert!(k.bytes >= 1 << 20 && k.bytes % (1 << 20) == 0);
        assert!(k.seconds >= 0.05, "{}", k.seconds);
    }

    #[test]
    fn ping_pong_takes_a_sample_per_round_trip() {
        let l = ping_pong(64, 200).unwrap();
        assert_eq!(l.histogram.count(), 200);
        assert!(l.min_us > 0.0 && l.min_us <= l.p50_us && l.p50_us <= l.p99_us);
    }
}
