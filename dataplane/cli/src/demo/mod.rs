//! `iwarp demo`: the README's first command. Two dataplane endpoints in
//! this process, joined by a DPDK `net_ring` pair (EAL without hugepages
//! or PCI, under a file prefix of its own), run WRITE, READ and SEND
//! bandwidth rounds and latency rounds with the data verified (the
//! measured loops of [`super::runner`], connected directly rather than
//! through perftest's control exchange), then print a summary.
//!
//! Next to each bandwidth figure stands what one core does with the same
//! bytes, measured in the same run: copying them from one buffer into
//! another and CRC32c-summing them (the two passes an iWARP receive path
//! cannot avoid, RFC 5044's CRC and the placement copy), and the ratio of
//! the two, so that a reader sees how close the pipeline comes. Beside it
//! stands the kernel's own TCP over loopback with the same message size,
//! measured in the same run just before the endpoints start (`demo/kernel.rs`),
//! one core handing each message to another that reads it once, the
//! machine's ceiling for two endpoints on two cores (`demo/handoff.rs`),
//! and each side's worker CPU time per byte moved (`demo/cpu.rs`), so that
//! efficiency per core shows apart from how the threads were scheduled.
//!
//! Nothing is left behind: the EAL runtime directory of the prefix is
//! gone when the command returns, whether it succeeded or not.

use core::time::Duration;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

mod cpu;
mod handoff;
mod kernel;

use clap::Args;
use serde::Serialize;
use tcp_offload::wire::EthernetAddress;

use super::common::eal_prefix_dir;
use super::report::to_json;
use super::runner::{
    connect_direct, cq_entries_of, LatencySummary, Progress, RemoteBuf, Resources, Role, RunResult,
    RunSpec, TestKind, MAX_QPS, MB,
};
use super::ToolError;
use dataplane::api::{Dataplane, DriveMode, Error};
use dataplane::config::Config;
use dataplane::dpdk_link::{default_eal_args, start_eal, DpdkLink, DpdkLinkOptions};

pub use cpu::{CpuUse, FrameWork};

const DEFAULT_SIZE: usize = 64 << 10;
const DEFAULT_LAT_SIZE: usize = 64;
const DEFAULT_RATE_SIZE: usize = 64;
const DEFAULT_SECONDS: f64 = 1.5;
const DEFAULT_LAT_ITERATIONS: u64 = 2000;
const DEFAULT_MTU: usize = 1500;
/// The least receive queue depth of a send-bw round with many QPs (see
/// where it is used).
const MIN_SEND_RX_DEPTH: u32 = 16;
/// The most CQ entries the configuration takes (`limits.max_cqe`).
const MAX_CQE: u32 = 1 << 22;

const MAC_A: EthernetAddress = EthernetAddress([2, 0x69, 0x77, 0, 0, 1]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0x69, 0x77, 0, 0, 2]);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
/// perftest's default port; each round takes the next one.
const BASE_PORT: u16 = 18515;

/// Options of `iwarp demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Print one JSON document with every figure (on stdout) instead of
    /// the table; progress still goes to stderr.
    #[arg(long)]
    pub json: bool,
    /// Message size of the bandwidth rounds, in bytes (suffixes K, M:
    /// 64K = 65536).
    #[arg(long, value_name = "BYTES", default_value = "64K", value_parser = parse_size)]
    pub size: usize,
    /// How long each bandwidth round runs, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_SECONDS,
          value_parser = parse_seconds, conflicts_with = "iterations")]
    pub seconds: f64,
    /// Run each bandwidth round for this many messages (per queue pair)
    /// instead of --seconds.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
    /// Message size of the latency rounds, in bytes.
    #[arg(long, value_name = "BYTES", default_value = "64", value_parser = parse_size)]
    pub lat_size: usize,
    /// Message size of the message-rate rounds (WRITE, READ and SEND
    /// bandwidth rounds of small messages, reported in millions of
    /// messages per second), in bytes.
    #[arg(long, value_name = "BYTES", default_value = "64", value_parser = parse_size)]
    pub rate_size: usize,
    /// Round trips of each latency round.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LAT_ITERATIONS,
          value_parser = clap::value_parser!(u64).range(2..))]
    pub lat_iterations: u64,
    /// IP MTU of the virtual link (68 to 9000).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MTU)]
    pub mtu: usize,
    /// Who drives the workers in the measured loops: their own threads
    /// (the application hands work over through the rings), the
    /// application's threads themselves (busy polling), or whichever is
    /// faster here (auto: a short trial of each before the rounds).
    #[arg(long, value_enum, default_value_t = Drive::Auto)]
    pub drive: Drive,
    /// Queue pairs of each bandwidth round, each its own connection,
    /// sharing the round's work (1 to 16384). With more than one, each
    /// QP's send queue is 128 / N deep (at least 2), a send-bw receive
    /// queue 512 / N (at least 16), and the tables are sized to hold
    /// them; the message-rate and latency rounds keep one.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_qps)]
    pub qps: usize,
    /// Which rounds to run, comma-separated: bandwidth, rate (small
    /// messages), latency.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "bandwidth,rate,latency"
    )]
    pub rounds: Vec<Rounds>,
}

/// The demo's kinds of round (`--rounds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Rounds {
    /// WRITE, READ and SEND bandwidth with `--size` messages.
    Bandwidth,
    /// The same with `--rate-size` messages, in messages per second.
    Rate,
    /// WRITE, READ and SEND latency.
    Latency,
}

/// Who drives the workers in the demo's measured loops (`--drive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Drive {
    /// Try both, keep the faster.
    Auto,
    /// Worker threads; the application hands work over.
    Threads,
    /// The application's threads (`Dataplane::busy_poll`).
    BusyPoll,
}

impl Default for DemoArgs {
    fn default() -> DemoArgs {
        DemoArgs {
            json: false,
            size: DEFAULT_SIZE,
            seconds: DEFAULT_SECONDS,
            iterations: None,
            lat_size: DEFAULT_LAT_SIZE,
            rate_size: DEFAULT_RATE_SIZE,
            lat_iterations: DEFAULT_LAT_ITERATIONS,
            mtu: DEFAULT_MTU,
            drive: Drive::Auto,
            qps: 1,
            rounds: vec![Rounds::Bandwidth, Rounds::Rate, Rounds::Latency],
        }
    }
}

/// A byte count with an optional K / M suffix (powers of two).
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1usize << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        _ => (t, 1),
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bytes, or with K or M)"))?;
    match n.checked_mul(mult) {
        Some(v) if (1..=64 << 20).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: sizes go from 1 byte to 64M")),
    }
}

/// The queue depths of one round's QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Depths {
    tx: u32,
    rx: u32,
    reads: u32,
}

impl Depths {
    /// The depths of `test` over `qps` QPs, for `iterations` messages
    /// each (`None`: a timed round). Many QPs share the depth of one: as
    /// many requests in flight in all, and no more completions than the
    /// queue holds. A send-bw receive queue keeps a floor: the server
    /// returns credits by an RDMA Write every third of it, which a depth
    /// of 2 would make one Write per Send (perftest does not shrink it
    /// with `-q`; at 10,000 QPs the floor took send-bw from about 1.6 to
    /// 2.0 GB/s).
    fn of(test: TestKind, qps: usize, iterations: Option<u64>) -> Depths {
        let share = |depth: u32| (depth / u32::try_from(qps).unwrap_or(u32::MAX)).max(2);
        let rx = if test.is_send() {
            let rx = share(512).max(MIN_SEND_RX_DEPTH);
            iterations.map_or(rx, |n| rx.min(u32::try_from(n).unwrap_or(u32::MAX)))
        } else {
            1
        };
        Depths {
            tx: if test.is_latency() { 1 } else { share(128) },
            // perftest's workaround for odd receive depths.
            rx: rx + rx % 2,
            // As many Reads in flight as a queue pair allows, as
            // perftest's read tests ask for by default (`-o`: the
            // device's max_qp_rd_atom), shared like the send queue's
            // depth among many (a Read takes a send-queue slot); write-bw
            // reads its destination back once.
            reads: share(dataplane::api::MAX_RD_ATOM),
        }
    }
}

fn parse_qps(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_QPS).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: queue pairs go from 1 to {MAX_QPS}")),
    }
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.05..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: seconds go from 0.05 to 3600")),
    }
}

/// One bandwidth round of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct BwRow {
    /// Which test.
    pub test: TestKind,
    /// Queue pairs sharing the round.
    pub qps: usize,
    /// Time to connect them all, seconds.
    pub setup_seconds: f64,
    /// Connections set up per second.
    pub connects_per_second: f64,
    /// Bytes per message.
    pub size: usize,
    /// Messages.
    pub iterations: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Measured time, seconds.
    pub seconds: f64,
    /// Average bandwidth, MiB/s.
    pub bw_avg_mbps: f64,
    /// Peak bandwidth, MiB/s.
    pub bw_peak_mbps: f64,
    /// Bandwidth between the round's margins, MiB/s: its middle half, the
    /// window perftest reports with `-D` (see
    /// [`RunResult::bw_steady_mbps`](crate::runner::RunResult::bw_steady_mbps));
    /// `None` for a round of `--iterations`.
    pub bw_steady_mbps: Option<f64>,
    /// Messages per second, millions.
    pub msg_rate_mpps: f64,
    /// One core copying and CRC32c-summing the same bytes, MiB/s.
    pub copy_crc_mbps: f64,
    /// `bw_avg_mbps / copy_crc_mbps`.
    pub ratio: f64,
    /// The kernel's TCP over loopback, one stream of messages of the same
    /// size, the receiver reading every byte, MiB/s (the same figure in
    /// every row).
    pub kernel_tcp_mbps: f64,
    /// Bytes the kernel stream moved (the median of three, measured before
    /// the endpoints started; each half a round's length, or a round's
    /// bytes with `--iterations`).
    pub kernel_tcp_bytes: u64,
    /// Seconds the kernel stream took.
    pub kernel_tcp_seconds: f64,
    /// `bw_avg_mbps / kernel_tcp_mbps`.
    pub kernel_ratio: f64,
    /// One thread writing each message of the same size and another
    /// reading every byte of it once, MiB/s (the same figure in every
    /// row): what crossing from one core to the other costs on this
    /// machine, a ceiling for two endpoints on two cores.
    pub cross_core_mbps: f64,
    /// `bw_avg_mbps / cross_core_mbps`.
    pub cross_core_ratio: f64,
    /// CPU time of the workers of the side the data leaves (the client for
    /// WRITE and SEND, the server for READ), over the whole round
    /// (connection setup and the data check included).
    pub source_workers: CpuUse,
    /// CPU time of the workers of the side the data reaches.
    pub sink_workers: CpuUse,
    /// Frames the source side's workers sent and received over the
    /// round, their loops, and the side's CPU time per frame.
    pub source_frames: FrameWork,
    /// The same for the sink side.
    pub sink_frames: FrameWork,
    /// The kernel stream's sending thread.
    pub kernel_sender: CpuUse,
    /// The kernel stream's receiving thread.
    pub kernel_receiver: CpuUse,
    /// Bytes whose content was checked (both ends).
    pub verified_bytes: u64,
}

/// One latency round of the summary (microseconds).
#[derive(Debug, Clone, Serialize)]
pub struct LatRow {
    /// Which test.
    pub test: TestKind,
    /// Bytes per message.
    pub size: usize,
    /// Samples.
    pub iterations: u64,
    /// Fastest.
    pub min_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest.
    pub max_us: f64,
    /// Mean.
    pub avg_us: f64,
    /// Standard deviation.
    pub stdev_us: f64,
    /// The kernel's TCP over loopback, a message of the same size
    /// bounced between two threads (`TCP_NODELAY`), half a round trip:
    /// the median (the same figure in every row).
    pub kernel_p50_us: f64,
    /// Its 99th percentile.
    pub kernel_p99_us: f64,
    /// `p50_us / kernel_p50_us`: below 1 is quicker than the kernel.
    pub kernel_ratio: f64,
    /// Bytes whose content was checked (both ends).
    pub verified_bytes: u64,
}

/// One message-rate round: a bandwidth round of small messages.
#[derive(Debug, Clone, Serialize)]
pub struct RateRow {
    /// Which test.
    pub test: TestKind,
    /// Bytes per message.
    pub size: usize,
    /// Messages.
    pub iterations: u64,
    /// Measured time, seconds.
    pub seconds: f64,
    /// Messages per second, millions.
    pub msg_rate_mpps: f64,
    /// Average bandwidth, MiB/s.
    pub bw_avg_mbps: f64,
    /// CPU time of the workers of the side the messages leave.
    pub source_workers: CpuUse,
    /// CPU time of the workers of the side they reach.
    pub sink_workers: CpuUse,
    /// Frames the source side's workers sent and received, their loops,
    /// and the side's CPU time per frame (several messages share a
    /// frame when small ones are packed).
    pub source_frames: FrameWork,
    /// The same for the sink side.
    pub sink_frames: FrameWork,
    /// Bytes whose content was checked (both ends).
    pub verified_bytes: u64,
}

/// The `--drive auto` trial: send-lat rounds each way, the median of
/// their typical latencies.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DriveTrial {
    /// Round trips of each trial round.
    pub round_trips: u64,
    /// Trial rounds each way.
    pub trials: u64,
    /// With worker threads, microseconds.
    pub threads_p50_us: f64,
    /// Busy polling, microseconds.
    pub busy_poll_p50_us: f64,
}

/// The demo's JSON document.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// The tool's version.
    pub version: &'static str,
    /// What joined the endpoints.
    pub link: &'static str,
    /// IP MTU of the link.
    pub mtu: usize,
    /// Workers per endpoint.
    pub workers: usize,
    /// Queue pairs of each bandwidth round.
    pub qps: usize,
    /// Who drove the workers in the measured loops: `"threads"` or
    /// `"busy-poll"` (the CPU figures then count the driving threads'
    /// time with the worker threads').
    pub drive: Drive,
    /// The `--drive auto` trial that chose it.
    pub drive_trial: Option<DriveTrial>,
    /// Bandwidth unit of every `*_mbps` figure.
    pub bw_unit: &'static str,
    /// WRITE, READ, SEND bandwidth.
    pub bandwidth: Vec<BwRow>,
    /// WRITE, READ, SEND message rate with small messages.
    pub message_rate: Vec<RateRow>,
    /// WRITE, READ, SEND latency.
    pub latency: Vec<LatRow>,
    /// Nanoseconds for a cache line to go from one of the two cores to the
    /// other and back, measured before the rounds and after them
    /// (`null` on one core): how near each other the cores the endpoints
    /// share are. On a virtual machine the host may move its vCPUs during
    /// a run; the ring demo's figures follow (see `demo/handoff.rs`).
    pub cross_core_round_trip_ns: [Option<f64>; 2],
    /// Bytes checked in all.
    pub verified_bytes: u64,
    /// `"passed"`: a failed check ends the demo with an error instead.
    pub data_check: &'static str,
}

/// Removes the EAL runtime directory when dropped: after EAL's own
/// cleanup it is already gone; after a failure it may not be.
struct RuntimeDir(PathBuf);

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn say(args: &DemoArgs, line: &str) {
    let _ = args;
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{line}");
}

/// Runs the demo.
pub fn run(args: &DemoArgs) -> Result<(), ToolError> {
    if !(68..=9000).contains(&args.mtu) {
        return Err(ToolError::Usage(format!(
            "--mtu {}: the MTU goes from 68 to 9000",
            args.mtu
        )));
    }
    let prefix = format!("iwarp-demo-{}", std::process::id());
    let guard = RuntimeDir(eal_prefix_dir(&prefix));
    let report = {
        let eal = start_eal(&default_eal_args(&prefix, &[]))
            .map_err(|e| ToolError::Dataplane(Error::Device(format!("EAL: {e}"))))?;
        let r = rounds(args, &eal);
        drop(eal);
        r
    }?;
    drop(guard);
    if args.json {
        println!("{}", to_json(&report));
    } else {
        print!("{}", table(&report));
    }
    Ok(())
}

/// The endpoints and every round; all DPDK objects are dropped before it
/// returns.
fn rounds(args: &DemoArgs, eal: &Arc<dpdk_bindings::Eal>) -> Result<DemoReport, ToolError> {
    let workers = 1;
    let opts = DpdkLinkOptions {
        queues: workers as u16,
        mtu: args.mtu,
        // Each end copies a received chain into one buffer: attaching the
        // payload on transmit would only add buffers to that copy.
        attach_payload: false,
        ..DpdkLinkOptions::default()
    };
    let (la, lb) = DpdkLink::ring_pair(eal, "demo", &opts, (Some(MAC_A), Some(MAC_B)))
        .map_err(|e| ToolError::Dataplane(Error::Device(format!("net_ring pair: {e}"))))?;
    let config = |ip, mac| {
        let mut c = Config::single("net_ring_demo", ip, mac);
        c.workers.count = workers;
        c.ports[0].mtu = args.mtu;
        // Idle workers back off: the demo shares small machines.
        c.idle.spin = 200;
        c.idle.sleep_us = 20;
        c.tcp.recv_buffer = c.tcp.recv_buffer.max(4 * args.mtu);
        // Room for the rounds' queue pairs, and for as many connections
        // again still closing from the round before.
        let q = args.qps as u32;
        c.limits.max_qp = c.limits.max_qp.max(q.saturating_mul(3).saturating_add(16));
        // The CQ of the round with the deepest queues (send-bw's, whose
        // receive queue keeps `MIN_SEND_RX_DEPTH` at least), as the
        // runner sizes it.
        let d = Depths::of(TestKind::SendBw, args.qps, None);
        let cqe = cq_entries_of(args.qps, d.tx, d.rx);
        c.limits.max_cqe = c.limits.max_cqe.max(cqe).min(MAX_CQE);
        c.tcp.max_connections = c.tcp.max_connections.max(3 * args.qps + 64);
        c
    };
    // The kernel's baseline first, while no worker of ours polls the
    // machine's cores.
    let k = kernel_baseline(args)?;
    let kl = kernel_latency_baseline(args)?;
    let cross_core = cross_core_baseline(args)?;
    let rtt_before = round_trip(args, "before the rounds");
    let a = Dataplane::open_with_link(&config(IP_A, MAC_A), la, DriveMode::Threads)?;
    let b = Dataplane::open_with_link(&config(IP_B, MAC_B), lb, DriveMode::Threads)?;
    say(
        args,
        &format!(
            "iwarp demo: two endpoints ({IP_A} and {IP_B}) over a DPDK net_ring pair in this \
             process, MTU {}, {workers} worker each, no hugepages",
            args.mtu
        ),
    );
    let mut port = BASE_PORT;
    let (busy, trial) = choose_drive(args, &a, &b, &mut port)?;
    let drive = if busy {
        Drive::BusyPoll
    } else {
        Drive::Threads
    };
    let wants = |r: Rounds| args.rounds.contains(&r);
    let mut bandwidth = Vec::new();
    for test in [TestKind::WriteBw, TestKind::ReadBw, TestKind::SendBw] {
        if !wants(Rounds::Bandwidth) {
            break;
        }
        let (c, s, (source_cpu, sink_cpu), setup, (source_frames, sink_frames)) =
            measured_round(args, &a, &b, test, (args.size, args.qps), port, busy)?;
        port += 1;
        let seconds = c.elapsed.as_secs_f64();
        let (copy_crc, _) = copy_crc_rate(args.size, c.bytes);
        let verified = c.verified_bytes + s.verified_bytes;
        let setup_seconds = setup.as_secs_f64();
        let row = BwRow {
            test,
            qps: args.qps,
            setup_seconds,
            connects_per_second: ratio(args.qps as f64, setup_seconds),
            size: c.size,
            iterations: c.iterations,
            bytes: c.bytes,
            seconds,
            bw_avg_mbps: c.bw_avg_mbps,
            bw_peak_mbps: c.bw_peak_mbps,
            bw_steady_mbps: c.bw_steady_mbps,
            msg_rate_mpps: c.msg_rate_mpps,
            copy_crc_mbps: copy_crc,
            ratio: ratio(c.bw_avg_mbps, copy_crc),
            kernel_tcp_mbps: k.mbps,
            kernel_tcp_bytes: k.bytes,
            kernel_tcp_seconds: k.seconds,
            kernel_ratio: ratio(c.bw_avg_mbps, k.mbps),
            cross_core_mbps: cross_core,
            cross_core_ratio: ratio(c.bw_avg_mbps, cross_core),
            source_workers: CpuUse::new(source_cpu, c.bytes, seconds),
            sink_workers: CpuUse::new(sink_cpu, c.bytes, seconds),
            source_frames,
            sink_frames,
            kernel_sender: k.sender,
            kernel_receiver: k.receiver,
            verified_bytes: verified,
        };
        check_nonzero(&row.test, &[row.iterations, row.bytes, row.verified_bytes])?;
        say(
            args,
            &format!(
                "  {test}: {:.1} MB/s; one core copying + CRC32c: {:.1} MB/s (ratio {:.2}); \
                 kernel TCP over loopback: {:.1} MB/s (ratio {:.2}); one core to another: \
                 {:.1} MB/s (ratio {:.2}); {} bytes verified",
                row.bw_avg_mbps,
                row.copy_crc_mbps,
                row.ratio,
                row.kernel_tcp_mbps,
                row.kernel_ratio,
                row.cross_core_mbps,
                row.cross_core_ratio,
                row.verified_bytes
            ),
        );
        bandwidth.push(row);
    }
    let mut message_rate = Vec::new();
    for test in [TestKind::WriteBw, TestKind::ReadBw, TestKind::SendBw] {
        if !wants(Rounds::Rate) {
            break;
        }
        let (c, s, (source_cpu, sink_cpu), _, (source_frames, sink_frames)) =
            measured_round(args, &a, &b, test, (args.rate_size, 1), port, busy)?;
        port += 1;
        let seconds = c.elapsed.as_secs_f64();
        let row = RateRow {
            test,
            size: c.size,
            iterations: c.iterations,
            seconds,
            msg_rate_mpps: c.msg_rate_mpps,
            bw_avg_mbps: c.bw_avg_mbps,
            source_workers: CpuUse::new(source_cpu, c.bytes, seconds),
            sink_workers: CpuUse::new(sink_cpu, c.bytes, seconds),
            source_frames,
            sink_frames,
            verified_bytes: c.verified_bytes + s.verified_bytes,
        };
        check_nonzero(&row.test, &[row.iterations, row.verified_bytes])?;
        say(
            args,
            &format!(
                "  {test} {} B: {:.3} M messages/s, {} bytes verified",
                row.size, row.msg_rate_mpps, row.verified_bytes
            ),
        );
        message_rate.push(row);
    }
    let mut latency = Vec::new();
    for test in [TestKind::WriteLat, TestKind::ReadLat, TestKind::SendLat] {
        if !wants(Rounds::Latency) {
            break;
        }
        let (c, s, _, _) = round(args, &a, &b, test, (args.lat_size, 1), port, busy)?;
        port += 1;
        let Some(l) = c.latency else {
            return Err(ToolError::Peer(format!("{test}: no latency samples")));
        };
        let row = LatRow {
            test,
            size: c.size,
            iterations: c.iterations,
            min_us: l.min_us,
            p50_us: l.p50_us,
            p99_us: l.p99_us,
            p999_us: l.p999_us,
            max_us: l.max_us,
            avg_us: l.avg_us,
            stdev_us: l.stdev_us,
            kernel_p50_us: kl.p50_us,
            kernel_p99_us: kl.p99_us,
            kernel_ratio: ratio(l.p50_us, kl.p50_us),
            verified_bytes: c.verified_bytes + s.verified_bytes,
        };
        check_nonzero(&row.test, &[row.iterations, row.verified_bytes])?;
        say(
            args,
            &format!(
                "  {test}: typical {:.2} us, 99% {:.2} us (kernel TCP ping-pong typical {:.2} us, \
                 ratio {:.2}), {} bytes verified",
                row.p50_us, row.p99_us, row.kernel_p50_us, row.kernel_ratio, row.verified_bytes
            ),
        );
        latency.push(row);
    }
    let verified_bytes = bandwidth.iter().map(|r| r.verified_bytes).sum::<u64>()
        + message_rate.iter().map(|r| r.verified_bytes).sum::<u64>()
        + latency.iter().map(|r| r.verified_bytes).sum::<u64>();
    drop(a);
    drop(b);
    Ok(DemoReport {
        version: env!("CARGO_PKG_VERSION"),
        link: "net_ring",
        mtu: args.mtu,
        workers,
        qps: args.qps,
        drive,
        drive_trial: trial,
        bw_unit: "MiB/s",
        bandwidth,
        message_rate,
        latency,
        cross_core_round_trip_ns: [rtt_before, round_trip(args, "after the rounds")],
        verified_bytes,
        data_check: "passed",
    })
}

/// [`handoff::line_round_trip_ns`] over 20 ms, said on stderr.
fn round_trip(args: &DemoArgs, when: &str) -> Option<f64> {
    let r = handoff::line_round_trip_ns(Duration::from_millis(20));
    if let Some(ns) = r {
        say(
            args,
            &format!("  a cache line from one core to the other and back, {when}: {ns:.0} ns"),
        );
    }
    r
}

/// One core handing each message to another (see [`handoff`]): the
/// median of three, each half as long as a round (a quarter second with
/// `--iterations`).
fn cross_core_baseline(args: &DemoArgs) -> Result<f64, ToolError> {
    let limit = match args.iterations {
        Some(_) => Duration::from_millis(250),
        None => Duration::from_secs_f64((args.seconds / 2.0).clamp(0.05, 30.0)),
    };
    let r = handoff::handoff_median(args.size, limit, 3).ok_or_else(|| {
        ToolError::Peer("the cross-core baseline could not start its thread".into())
    })?;
    say(
        args,
        &format!(
            "  one core to another: {r:.1} MB/s ({} bytes per message written by one \
             thread, read once by another)",
            args.size
        ),
    );
    Ok(r)
}

/// The kernel's TCP over loopback with the bandwidth rounds' message
/// size: the median of three streams, each half as long as a round.
fn kernel_baseline(args: &DemoArgs) -> Result<kernel::KernelStream, ToolError> {
    let limit = match args.iterations {
        Some(n) => kernel::Limit::Bytes(n.saturating_mul(args.size as u64)),
        None => kernel::Limit::Seconds(args.seconds / 2.0),
    };
    say(
        args,
        &format!(
            "kernel TCP over loopback: {} bytes per write, three streams",
            args.size
        ),
    );
    let k = kernel::median_stream(args.size, limit, 3).map_err(|e| {
        ToolError::Peer(format!(
            "the kernel TCP baseline over loopback failed: {e}; check that 127.0.0.1 is up"
        ))
    })?;
    say(
        args,
        &format!("  kernel TCP: {:.1} MB/s (the median stream)", k.mbps),
    );
    Ok(k)
}

/// The kernel's TCP ping-pong over loopback with the latency rounds'
/// message size and round trips.
fn kernel_latency_baseline(args: &DemoArgs) -> Result<LatencySummary, ToolError> {
    say(
        args,
        &format!(
            "kernel TCP ping-pong over loopback: {} bytes, {} round trips",
            args.lat_size, args.lat_iterations
        ),
    );
    let l = kernel::ping_pong(args.lat_size, args.lat_iterations).map_err(|e| {
        ToolError::Peer(format!(
            "the kernel TCP latency baseline over loopback failed: {e}; check that 127.0.0.1 is up"
        ))
    })?;
    say(
        args,
        &format!(
            "  kernel TCP ping-pong: typical {:.2} us, 99% {:.2} us (half a round trip)",
            l.p50_us, l.p99_us
        ),
    );
    Ok(l)
}

/// Worker CPU nanoseconds of a round's (source, sink) sides, where read.
type SideCpu = (Option<u64>, Option<u64>);

/// What the workers of a round's (source, sink) sides handled.
type SideFrames = (FrameWork, FrameWork);

/// A round's `(client, server, CPU, connection setup time)`.
type RoundOut = (RunResult, RunResult, SideCpu, Duration);

/// A measured round's `(client, server, CPU, connection setup time,
/// frames)`.
type MeasuredOut = (RunResult, RunResult, SideCpu, Duration, SideFrames);

/// Round trips of each `--drive auto` trial.
const TRIAL_ROUND_TRIPS: u64 = 300;
/// Trials each way of `--drive auto`.
const TRIAL_PAIRS: u64 = 3;

/// Whether the rounds busy-poll, and the trial that chose it: with
/// `--drive auto`, short send-lat rounds each way in turn (worker
/// threads, then busy polling, [`TRIAL_PAIRS`] times), the lower median of
/// their typical latencies winning (busy polling on a tie).
fn choose_drive(
    args: &DemoArgs,
    a: &Dataplane,
    b: &Dataplane,
    port: &mut u16,
) -> Result<(bool, Option<DriveTrial>), ToolError> {
    match args.drive {
        Drive::Threads => return Ok((false, None)),
        Drive::BusyPoll => return Ok((true, None)),
        Drive::Auto => {}
    }
    let trial_args = DemoArgs {
        lat_iterations: TRIAL_ROUND_TRIPS,
        ..args.clone()
    };
    let mut typical: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..TRIAL_PAIRS {
        for (i, busy) in [false, true].into_iter().enumerate() {
            let (c, _, _, _) = round(
                &trial_args,
                a,
                b,
                TestKind::SendLat,
                (args.lat_size, 1),
                *port,
                busy,
            )?;
            *port += 1;
            let l = c
                .latency
                .ok_or_else(|| ToolError::Peer("the drive trial took no samples".into()))?;
            typical[i].push(l.p50_us);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (threads, busy_poll) = (median(&mut typical[0]), median(&mut typical[1]));
    let busy = busy_poll <= threads;
    say(
        args,
        &format!(
            "  drive: send-lat typical {threads:.2} us with worker threads, {busy_poll:.2} us busy \
             polling (medians of {TRIAL_PAIRS}): the rounds {}",
            if busy { "busy-poll" } else { "use worker threads" }
        ),
    );
    Ok((
        busy,
        Some(DriveTrial {
            round_trips: TRIAL_ROUND_TRIPS,
            trials: TRIAL_PAIRS,
            threads_p50_us: threads,
            busy_poll_p50_us: busy_poll,
        }),
    ))
}

/// A bandwidth round with the CPU time of each side's workers over it:
/// `(client, server, (source, sink))`, the source being the side the data
/// leaves (the server for READ).
fn measured_round(
    args: &DemoArgs,
    a: &Dataplane,
    b: &Dataplane,
    test: TestKind,
    shape: (usize, usize),
    port: u16,
    busy: bool,
) -> Result<MeasuredOut, ToolError> {
    let cpu0 = (workers_cpu_ns(a), workers_cpu_ns(b));
    let counts0 = (worker_counts(a), worker_counts(b));
    let (c, s, drivers, setup) = round(args, a, b, test, shape, port, busy)?;
    let cpu1 = (workers_cpu_ns(a), workers_cpu_ns(b));
    let counts1 = (worker_counts(a), worker_counts(b));
    let grown = |x: (u64, u64, u64), y: (u64, u64, u64)| {
        (
            y.0.saturating_sub(x.0),
            y.1.saturating_sub(x.1),
            y.2.saturating_sub(x.2),
        )
    };
    let client_frames = grown(counts0.0, counts1.0);
    let server_frames = grown(counts0.1, counts1.1);
    let spent = |t0: Option<u64>, t1: Option<u64>| t0.zip(t1).map(|(x, y)| y - x.min(y));
    let plus = |w: Option<u64>, d: Option<u64>| match d {
        Some(d) => w.map(|w| w + d),
        None => w,
    };
    let client_cpu = plus(spent(cpu0.0, cpu1.0), drivers.0);
    let server_cpu = plus(spent(cpu0.1, cpu1.1), drivers.1);
    let client = FrameWork::new(client_frames, client_cpu);
    let server = FrameWork::new(server_frames, server_cpu);
    let (cpu, frames) = if test.is_read() {
        ((server_cpu, client_cpu), (server, client))
    } else {
        ((client_cpu, server_cpu), (client, server))
    };
    Ok((c, s, cpu, setup, frames))
}

/// `a / b`, 0 when `b` is not positive.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// CPU time of all of `dp`'s worker threads so far, in nanoseconds
/// (`None` when one cannot be read).
fn workers_cpu_ns(dp: &Dataplane) -> Option<u64> {
    dp.stats()
        .iter()
        .map(|w| w.thread_id.and_then(cpu::thread_ns))
        .sum()
}

/// Frames sent, frames received and loop iterations of all of `dp`'s
/// workers so far.
fn worker_counts(dp: &Dataplane) -> (u64, u64, u64) {
    dp.stats().iter().fold((0, 0, 0), |(t, r, l), w| {
        (t + w.tx_packets, r + w.rx_packets, l + w.loops)
    })
}

fn check_nonzero(test: &TestKind, figures: &[u64]) -> Result<(), ToolError> {
    if figures.contains(&0) {
        return Err(ToolError::DataMismatch(format!(
            "{test}: nothing was transferred or checked"
        )));
    }
    Ok(())
}

/// One round: fresh resources and connections on both ends, the server's
/// loop on a thread of its own, the client's here.
fn round(
    args: &DemoArgs,
    a: &Dataplane,
    b: &Dataplane,
    test: TestKind,
    (size, qps): (usize, usize),
    port: u16,
    busy_poll: bool,
) -> Result<RoundOut, ToolError> {
    let lat = test.is_latency();
    let (iterations, duration) = if lat {
        (args.lat_iterations, None)
    } else {
        match args.iterations {
            Some(n) => (n, None),
            None => (0, Some(Duration::from_secs_f64(args.seconds))),
        }
    };
    let d = Depths::of(test, qps, duration.is_none().then_some(iterations));
    let client = RunSpec {
        test,
        role: Role::Client,
        size,
        iterations,
        duration,
        qps,
        tx_depth: d.tx,
        rx_depth: d.rx,
        outstanding_reads: d.reads,
        verify: true,
        all_sizes: false,
        busy_poll,
    };
    let server = RunSpec {
        role: Role::Server,
        ..client.clone()
    };
    say(
        args,
        &format!(
            "{test}: {size} bytes, {}",
            match duration {
                Some(d) => format!("{:.1} s", d.as_secs_f64()),
                None => format!("{iterations} messages"),
            }
        ),
    );
    let rc = Resources::new(a, &client)?;
    let rs = Resources::new(b, &server)?;
    // Read tests read; write-bw reads its destination back to verify it.
    let ord = if test.is_read() || test == TestKind::WriteBw {
        u16::try_from(client.outstanding_reads).unwrap_or(u16::MAX)
    } else {
        0
    };
    // A busy-polling side's thread does its worker's work: its CPU time
    // counts with the worker threads'.
    let own = || busy_poll.then(cpu::own_ns).flatten();
    let spent = |t0: Option<u64>| t0.zip(own()).map(|(x, y)| y - x.min(y));
    let result = (|| {
        let t0 = Instant::now();
        connect_direct(a, &rc, b, &rs, SocketAddrV4::new(IP_B, port), ord)?;
        let setup = t0.elapsed();
        if qps > 1 {
            say(
                args,
                &format!(
                    "  {test}: {qps} queue pairs connected in {:.2} s ({:.0} per second)",
                    setup.as_secs_f64(),
                    qps as f64 / setup.as_secs_f64().max(1e-9)
                ),
            );
        }
        let to_server: Vec<RemoteBuf> = (0..client.qps).map(|i| rs.local_buf(i)).collect();
        let to_client: Vec<RemoteBuf> = (0..client.qps).map(|i| rc.local_buf(i)).collect();
        std::thread::scope(|scope| {
            let srv = scope.spawn(|| {
                let t0 = own();
                let r = rs.run(b, &server, &to_client, &mut |_| {});
                (r, spent(t0))
            });
            let mut show = |p: &Progress| {
                let total = if p.total > 0 {
                    format!(" of {}", p.total)
                } else {
                    String::new()
                };
                let rate = if lat || p.elapsed.is_zero() {
                    String::new()
                } else {
                    format!(
                        ", {:.1} MB/s",
                        (p.done * size as u64) as f64 / p.elapsed.as_secs_f64() / MB
                    )
                };
                say(
                    args,
                    &format!(
                        "  {test}: {:.1} s, {}{total} messages{rate}",
                        p.elapsed.as_secs_f64(),
                        p.done
                    ),
                );
            };
            let t0 = own();
            let c = rc.run(a, &client, &to_server, &mut show);
            let client_cpu = spent(t0);
            let (s, server_cpu) = srv.join().unwrap_or_else(|_| {
                (
                    Err(ToolError::Peer("the server loop panicked".into())),
                    None,
                )
            });
            Ok((c?, s?, (client_cpu, server_cpu), setup))
        })
    })();
    rc.close(a);
    rs.close(b);
    result
}

/// What one core does with `total` bytes in messages of `size`: copy each
/// from one buffer into another, then CRC32c it. Returns MiB/s and the
/// time taken.
///
/// The bytes go in eight slices, each timed, and the rate is the
/// fastest slice's: on a shared machine a neighbour's burst once halved
/// one run's whole baseline (16.7 GB/s against 37 in the runs beside
/// it) and so doubled the ratio against it; the fastest slice is what
/// the core does undisturbed.
///
/// Both buffers start on a page boundary (`PageBuf`). Left to the
/// allocator, the destination sometimes lay 1 to 31 bytes past the
/// source modulo 4096, where `rep movsb` (which the C library's memcpy
/// uses for a 64 KiB copy) runs some fifteen times slower on AMD Zen 3:
/// the baseline then fell from ~11,500 to ~2,200 MiB/s for a whole run
/// and the ratio against it read ~1.
pub fn copy_crc_rate(size: usize, total: u64) -> (f64, Duration) {
    let size = size.max(1);
    let (src, mut dst) = (PageBuf::patterned(size), PageBuf::new(size));
    let (src, dst) = (src.bytes(), dst.bytes_mut());
    let chunks = (total / size as u64).max(1);
    let slices = BASELINE_SLICES.min(chunks);
    let start = Instant::now();
    let mut crc = 0u32;
    let mut timed = [(0u64, Duration::ZERO); BASELINE_SLICES as usize];
    for (i, slot) in timed.iter_mut().enumerate().take(slices as usize) {
        // The last slice takes what does not divide evenly.
        let n = if i as u64 == slices - 1 {
            chunks - chunks / slices * (slices - 1)
        } else {
            chunks / slices
        };
        let t = Instant::now();
        for _ in 0..n {
            dst.copy_from_slice(std::hint::black_box(src));
            crc = rdmap::crc::append(crc, std::hint::black_box(&*dst));
        }
        *slot = (n * size as u64, t.elapsed());
    }
    std::hint::black_box(crc);
    (fastest_rate(&timed[..slices as usize]), start.elapsed())
}

/// Slices [`copy_crc_rate`] times apart.
const BASELINE_SLICES: u64 = 8;

/// The fastest rate, MiB/s, among slices of (bytes, time taken).
fn fastest_rate(slices: &[(u64, Duration)]) -> f64 {
    slices
        .iter()
        .map(|&(bytes, t)| bytes as f64 / t.as_secs_f64().max(1e-9) / MB)
        .fold(0.0, f64::max)
}

/// A buffer that starts on a page boundary, so that a copy between two
/// of them is between two such starts ([`copy_crc_rate`] says why; the
/// hand-off baseline copies between them too).
struct PageBuf {
    vec: Vec<u8>,
    at: usize,
    len: usize,
}

impl PageBuf {
    fn new(len: usize) -> PageBuf {
        const PAGE: usize = 4096;
        let vec = vec![0u8; len + PAGE];
        let at = vec.as_ptr().align_offset(PAGE);
        PageBuf { vec, at, len }
    }

    /// [`PageBuf::new`] holding the baselines' byte pattern.
    fn patterned(len: usize) -> PageBuf {
        let mut b = PageBuf::new(len);
        for (i, x) in b.bytes_mut().iter_mut().enumerate() {
            *x = (i * 131 + 7) as u8;
        }
        b
    }

    fn bytes(&self) -> &[u8] {
        &self.vec[self.at..self.at + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.vec[self.at..self.at + self.len]
    }
}

/// The summary table.
pub fn table(r: &DemoReport) -> String {
    let mut out = String::new();
    let rule = "-".repeat(126);
    out.push_str(&format!(
        "\niwarp demo {}: two endpoints over a DPDK {} pair, MTU {}, {} worker each, {}, data \
         verified\n",
        r.version,
        r.link,
        r.mtu,
        r.workers,
        match r.drive {
            Drive::BusyPoll => "driven by the application's threads (busy polling)",
            _ => "driven by worker threads",
        }
    ));
    out.push_str(&rule);
    out.push('\n');
    out.push_str(&format!(
        " {:<10} {:>8} {:>11} {:>10} {:>12} {:>18} {:>7} {:>17} {:>7} {:>16}\n",
        "test",
        "#bytes",
        "#iterations",
        "BW [MB/s]",
        "peak [MB/s]",
        "1-core copy+CRC",
        "ratio",
        "kernel TCP lo",
        "ratio",
        "bytes verified"
    ));
    for b in &r.bandwidth {
        out.push_str(&format!(
            " {:<10} {:>8} {:>11} {:>10.1} {:>12.1} {:>13.1} MB/s {:>7.3} {:>12.1} MB/s {:>7.3} {:>16}\n",
            b.test.to_string(),
            b.size,
            b.iterations,
            b.bw_avg_mbps,
            b.bw_peak_mbps,
            b.copy_crc_mbps,
            b.ratio,
            b.kernel_tcp_mbps,
            b.kernel_ratio,
            b.verified_bytes
        ));
    }
    out.push_str(&format!(
        " {:<10} {:>36} {:>26} {:>36}\n",
        "CPU",
        "workers, ns/byte: source  sink",
        "cores busy: source  sink",
        "kernel TCP, ns/byte: sender  receiver"
    ));
    for b in &r.bandwidth {
        out.push_str(&format!(
            " {:<10} {:>30.3} {:>5.3} {:>20.2} {:>5.2} {:>27.3} {:>8.3}\n",
            b.test.to_string(),
            b.source_workers.ns_per_byte,
            b.sink_workers.ns_per_byte,
            b.source_workers.busy,
            b.sink_workers.busy,
            b.kernel_sender.ns_per_byte,
            b.kernel_receiver.ns_per_byte,
        ));
    }
    out.push_str(&format!(
        " {:<10} {:>44} {:>44}\n",
        "frames", "source workers: out  in  CPU ns/frame", "sink workers: out  in  CPU ns/frame"
    ));
    for b in &r.bandwidth {
        let f = |w: &FrameWork| {
            format!(
                "{:>12} {:>10} {:>8.0}",
                w.frames_sent, w.frames_received, w.ns_per_frame
            )
        };
        out.push_str(&format!(
            " {:<10} {:>44} {:>44}\n",
            b.test.to_string(),
            f(&b.source_frames),
            f(&b.sink_frames)
        ));
    }
    // The cross-core figure is one per run: one line, each test's ratio.
    if let Some(first) = r.bandwidth.first() {
        let ratios: Vec<String> = r
            .bandwidth
            .iter()
            .map(|b| format!("{} {:.3}", b.test, b.cross_core_ratio))
            .collect();
        out.push_str(&format!(
            " one core to another: {:.1} MB/s; ratio {}\n",
            first.cross_core_mbps,
            ratios.join(", ")
        ));
        let ns = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.0} ns"));
        out.push_str(&format!(
            " a cache line from one core to the other and back: {} before the rounds, {} after\n",
            ns(r.cross_core_round_trip_ns[0]),
            ns(r.cross_core_round_trip_ns[1])
        ));
        if r.qps > 1 {
            let setups: Vec<String> = r
                .bandwidth
                .iter()
                .map(|b| {
                    format!(
                        "{} {:.2} s ({:.0}/s)",
                        b.test, b.setup_seconds, b.connects_per_second
                    )
                })
                .collect();
            out.push_str(&format!(
                " {} queue pairs per round, connected in: {}\n",
                r.qps,
                setups.join(", ")
            ));
        }
    }
    out.push_str(&rule);
    out.push('\n');
    if !r.message_rate.is_empty() {
        out.push_str(&format!(
            " {:<10} {:>8} {:>11} {:>14} {:>10} {:>36} {:>16}\n",
            "test",
            "#bytes",
            "#messages",
            "rate [M msg/s]",
            "BW [MB/s]",
            "workers, ns/message: source  sink",
            "bytes verified"
        ));
        for m in &r.message_rate {
            let per_msg = |c: &CpuUse| c.ns_per_byte * m.size as f64;
            out.push_str(&format!(
                " {:<10} {:>8} {:>11} {:>14.3} {:>10.1} {:>30.1} {:>5.1} {:>16}\n",
                m.test.to_string(),
                m.size,
                m.iterations,
                m.msg_rate_mpps,
                m.bw_avg_mbps,
                per_msg(&m.source_workers),
                per_msg(&m.sink_workers),
                m.verified_bytes
            ));
        }
        out.push_str(&rule);
        out.push('\n');
    }
    out.push_str(&format!(
        " {:<10} {:>8} {:>11} {:>9} {:>11} {:>9} {:>9} {:>9} {:>9} {:>12} {:>7} {:>16}\n",
        "test",
        "#bytes",
        "#iterations",
        "t_min",
        "t_typical",
        "t_avg",
        "99%",
        "99.9%",
        "t_max",
        "kernel TCP",
        "ratio",
        "bytes verified"
    ));
    for l in &r.latency {
        out.push_str(&format!(
            " {:<10} {:>8} {:>11} {:>9.2} {:>11.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>12.2} {:>7.3} {:>16}\n",
            l.test.to_string(),
            l.size,
            l.iterations,
            l.min_us,
            l.p50_us,
            l.avg_us,
            l.p99_us,
            l.p999_us,
            l.max_us,
            l.kernel_p50_us,
            l.kernel_ratio,
            l.verified_bytes
        ));
    }
    out.push_str(&format!(
        " (latency in microseconds; MB = 2^20 bytes; ratio = pipeline / one core copying and \
         CRC32c-summing the same bytes, / the kernel's TCP over loopback with the same \
         message size, and / one thread handing each message to another that reads it once, \
         the ceiling of two endpoints on two cores; CPU = worker threads' time per byte moved over the round, and the kernel \
         stream's two threads'; frames = what each side's workers sent and received over the round \
         (data and acknowledgements) and the side's CPU time per frame; latency kernel TCP = the kernel's TCP ping-pong over loopback with the same message size, \
         half a round trip, typical, and ratio = our typical / its)\n{rule}\n data check: passed ({} bytes verified)\n",
        r.verified_bytes
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes_and_refuse_nonsense() {
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("65M").is_err());
        assert!(parse_seconds("0.01").is_err());
        assert_eq!(parse_seconds("0.5"), Ok(0.5));
        assert_eq!(parse_qps("10000"), Ok(10_000));
        assert!(parse_qps("0").is_err() && parse_qps("16385").is_err());
    }

    /// One QP has perftest's depths; many share them, with floors: two
    /// requests in flight each, and a send-bw receive queue deep enough
    /// that a credit Write covers several Sends.
    #[test]
    fn many_qps_share_the_depths_above_their_floors() {
        let one = Depths::of(TestKind::SendBw, 1, None);
        assert_eq!(
            one,
            Depths {
                tx: 128,
                rx: 512,
                reads: dataplane::api::MAX_RD_ATOM.max(2)
            }
        );
        let many = Depths::of(TestKind::SendBw, 10_000, None);
        assert_eq!((many.tx, many.rx, many.reads), (2, MIN_SEND_RX_DEPTH, 2));
        // The server's credit Write goes every third of the depth.
        assert!(many.rx / 3 >= 4);
        assert_eq!(
            Depths::of(TestKind::SendBw, 100, None).rx,
            MIN_SEND_RX_DEPTH
        );
        assert_eq!(Depths::of(TestKind::SendBw, 16, None).rx, 32);
        // An iteration count caps the receive queue, kept even.
        assert_eq!(Depths::of(TestKind::SendBw, 1, Some(7)).rx, 8);
        // Only send tests use their receive queue (the others keep the
        // least even depth); latency keeps one request in flight.
        assert_eq!(Depths::of(TestKind::WriteBw, 10_000, None).rx, 2);
        assert_eq!(Depths::of(TestKind::WriteLat, 1, None).tx, 1);
    }

    /// The demo's CQ limit holds the runner's CQ for every round at the
    /// largest QP counts (a smaller limit would cut the shared CQ below
    /// its queues' depths).
    #[test]
    fn the_cq_limit_holds_every_rounds_cq() {
        for q in [1, 7, 16, 100, 1000, 10_000, MAX_QPS] {
            let need = [TestKind::SendBw, TestKind::WriteBw, TestKind::ReadBw]
                .map(|t| {
                    let d = Depths::of(t, q, None);
                    cq_entries_of(q, d.tx, d.rx)
                })
                .into_iter()
                .max()
                .unwrap();
            let d = Depths::of(TestKind::SendBw, q, None);
            assert_eq!(cq_entries_of(q, d.tx, d.rx), need, "{q} QPs");
            assert!(need <= MAX_CQE, "{q} QPs: {need}");
        }
    }

    #[test]
    fn copy_crc_baseline_moves_the_bytes() {
        let (mbps, t) = copy_crc_rate(4096, 4 << 20);
        assert!(mbps > 0.0 && t > Duration::ZERO);
        // The fastest slice is at least the whole run's average.
        let average = (4u64 << 20) as f64 / t.as_secs_f64() / MB;
        assert!(mbps >= average * 0.999, "{mbps} < {average}");
        // Fewer messages than slices: one slice each.
        let (mbps, _) = copy_crc_rate(4096, 3 * 4096);
        assert!(mbps > 0.0);
    }

    #[test]
    fn a_slow_slice_does_not_lower_the_baseline() {
        let ms = Duration::from_millis;
        let mib = 1 << 20;
        // Four slices of 100 MiB; a neighbour took the third's core away
        // for half its time.
        let slices = [
            (100 * mib, ms(10)),
            (100 * mib, ms(10)),
            (100 * mib, ms(20)),
            (100 * mib, ms(11)),
        ];
        let rate = fastest_rate(&slices);
        assert!((rate - 10_000.0).abs() < 1e-6, "{rate}");
        // The average over the same slices would have read 7,843.
        assert_eq!(fastest_rate(&[]), 0.0);
    }

    #[test]
    fn the_baseline_buffers_start_on_pages() {
        for size in [1, 64, 4095, 4096, 65_536, 100_000] {
            let (src, dst) = (PageBuf::new(size), PageBuf::new(size));
            let (src, dst) = (src.bytes(), dst.bytes());
            assert_eq!((src.len(), dst.len()), (size, size));
            assert_eq!(src.as_ptr() as usize % 4096, 0, "size {size}");
            assert_eq!(dst.as_ptr() as usize % 4096, 0, "size {size}");
        }
    }

    #[test]
    fn table_shows_every_round() {
        let r = DemoReport {
            version: "0",
            link: "net_ring",
            mtu: 1500,
            workers: 1,
            qps: 100,
            drive: Drive::BusyPoll,
            drive_trial: None,
            bw_unit: "MiB/s",
            bandwidth: vec![BwRow {
                test: TestKind::WriteBw,
                qps: 100,
                setup_seconds: 0.25,
                connects_per_second: 400.0,
                size: 65536,
                iterations: 10,
                bytes: 655_360,
                seconds: 0.1,
                bw_avg_mbps: 6.25,
                bw_peak_mbps: 7.0,
                bw_steady_mbps: None,
                msg_rate_mpps: 0.0001,
                copy_crc_mbps: 100.0,
                ratio: 0.0625,
                kernel_tcp_mbps: 50.0,
                kernel_tcp_bytes: 1 << 28,
                kernel_tcp_seconds: 5.12,
                kernel_ratio: 0.125,
                cross_core_mbps: 80.0,
                cross_core_ratio: 0.078,
                source_workers: CpuUse {
                    ns_per_byte: 1.5,
                    busy: 0.9,
                },
                sink_workers: CpuUse {
                    ns_per_byte: 2.25,
                    busy: 0.8,
                },
                source_frames: FrameWork::new((4_567, 89, 1_234), Some(1_164_000)),
                sink_frames: FrameWork::default(),
                kernel_sender: CpuUse {
                    ns_per_byte: 0.75,
                    busy: 1.0,
                },
                kernel_receiver: CpuUse {
                    ns_per_byte: 0.5,
                    busy: 0.7,
                },
                verified_bytes: 65536,
            }],
            latency: vec![LatRow {
                test: TestKind::SendLat,
                size: 64,
                iterations: 99,
                min_us: 10.0,
                p50_us: 12.0,
                p99_us: 20.0,
                p999_us: 30.0,
                max_us: 31.0,
                avg_us: 12.5,
                stdev_us: 1.0,
                kernel_p50_us: 24.0,
                kernel_p99_us: 40.0,
                kernel_ratio: 0.5,
                verified_bytes: 12800,
            }],
            message_rate: vec![RateRow {
                test: TestKind::WriteBw,
                size: 64,
                iterations: 3_000_000,
                seconds: 1.5,
                msg_rate_mpps: 2.0,
                bw_avg_mbps: 122.1,
                source_workers: CpuUse {
                    ns_per_byte: 4.0,
                    busy: 0.9,
                },
                sink_workers: CpuUse {
                    ns_per_byte: 2.0,
                    busy: 0.8,
                },
                source_frames: FrameWork::default(),
                sink_frames: FrameWork::default(),
                verified_bytes: 1000,
            }],
            cross_core_round_trip_ns: [Some(62.5), None],
            verified_bytes: 78336,
            data_check: "passed",
        };
        let t = table(&r);
        assert!(t.contains("write-bw"), "{t}");
        assert!(t.contains("6.2") && t.contains("100.0 MB/s") && t.contains("0.062"));
        assert!(t.contains("50.0 MB/s") && t.contains("0.125"), "{t}");
        assert!(
            t.contains("1.500") && t.contains("2.250") && t.contains("0.750"),
            "{t}"
        );
        assert!(t.contains("send-lat") && t.contains("12.00"));
        assert!(t.contains("data check: passed (78336 bytes verified)"));
        let j: serde_json::Value = serde_json::from_str(&to_json(&r)).unwrap();
        assert_eq!(j["data_check"], "passed");
        assert_eq!(j["bandwidth"][0]["test"], "write-bw");
        assert_eq!(j["latency"][0]["p99_us"], 20.0);
        assert_eq!(j["bandwidth"][0]["kernel_ratio"], 0.125);
        assert_eq!(j["bandwidth"][0]["cross_core_ratio"], 0.078);
        assert!(
            t.contains("and back: 62 ns before the rounds, - after"),
            "{t}"
        );
        assert_eq!(j["cross_core_round_trip_ns"][0], 62.5);
        assert!(j["cross_core_round_trip_ns"][1].is_null());
        assert!(t.contains("80.0 MB/s") && t.contains("0.078"), "{t}");
        assert_eq!(j["bandwidth"][0]["sink_workers"]["ns_per_byte"], 2.25);
        assert_eq!(j["bandwidth"][0]["kernel_sender"]["busy"], 1.0);
        // Frames each way per side, and CPU time per frame.
        assert!(t.contains("4567         89      250"), "{t}");
        assert_eq!(j["bandwidth"][0]["source_frames"]["frames_sent"], 4567);
        assert_eq!(j["bandwidth"][0]["source_frames"]["loops"], 1234);
        assert_eq!(j["bandwidth"][0]["source_frames"]["ns_per_frame"], 250.0);
        assert_eq!(j["message_rate"][0]["sink_frames"]["frames_received"], 0);
        // Message rate: millions per second and worker time per message.
        assert!(
            t.contains("2.000") && t.contains("256.0") && t.contains("128.0"),
            "{t}"
        );
        assert_eq!(j["message_rate"][0]["msg_rate_mpps"], 2.0);
        // Latency beside the kernel's ping-pong.
        assert!(t.contains("24.00") && t.contains("0.500"), "{t}");
        assert_eq!(j["latency"][0]["kernel_ratio"], 0.5);
        assert_eq!(j["latency"][0]["kernel_p50_us"], 24.0);
        // Many queue pairs: how long they took to connect.
        assert!(
            t.contains("100 queue pairs per round, connected in: write-bw 0.25 s (400/s)"),
            "{t}"
        );
        assert_eq!(j["bandwidth"][0]["qps"], 100);
        assert_eq!(j["bandwidth"][0]["connects_per_second"], 400.0);
    }
}
