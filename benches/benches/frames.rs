//! The dataplane's cost per frame on one core, free of the other core.
//!
//! Two dataplanes in this process, joined by a DPDK `net_ring` pair as in
//! `iwarp demo` (ports that copy every payload into the frame, the
//! copy in the pass that computes the CRC and the checksum), both driven
//! by this one thread through busy polling: side A WRITEs 64 KiB messages
//! into side B's region, a few in flight, for a fixed number of bytes
//! after a warm-up. The thread's CPU time over that, divided by the data
//! frames sent, is what one frame costs the sender and the receiver
//! together: everything `iwarp demo` pays per frame but the moves of
//! cache lines between two cores and the scheduling of two threads,
//! which make the demo's per-frame figures swing by half from one run to
//! the next on a shared machine. The copy+CRC32c baseline of the same
//! bytes (the demo's own) is measured in the same run.
//!
//! `perf record -g` on this bench shows where those nanoseconds go, stage
//! by stage, both sides in one profile. Arguments: the MTUs to run
//! (default 1500 and 9000); `FRAMES_MIB` sets the measured volume (MiB,
//! default 512), `FRAMES_RUNS` the repetitions (default 5, medians
//! printed, and the cheapest run's cost beside the median: a noisy
//! neighbour only ever adds time). The time spent in side A's polls and
//! in side B's, per frame, splits the cost between the sender and the
//! receiver (the rest is the application's posting and completions).
//! Each side's data frames per connection service (`conn_visits`) say
//! how far the cost of visiting a connection is spread. `FRAMES_QPS`
//! spreads the messages over that many queue pairs, each its own
//! connection with two messages in flight and its own 128 KiB of each
//! region, posted in turn (the demo's `--qps`): the cost per frame of
//! many connections, without the second core.
//! `FRAMES_SLOTS` sets how many 64 KiB slots of each region the messages
//! cycle over (default: each QP its own, as many as it has in flight):
//! one QP over 20,000 slots has the payload footprint of 10,000 QPs
//! (1.25 GiB a side, out of cache), and 10,000 QPs over 16 slots keep
//! their payload in cache, which tells the cost of many connections'
//! state apart from that of their buffers. Needs no NIC and no
//! hugepages.

use core::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::api::{
    Access, CmEvent, ConnectParams, Cq, MemoryRegistration, Qp, QpOptions, Region, SendWr, SgeList,
    WcStatus,
};
use dataplane::dpdk_link::{default_eal_args, start_eal, DpdkLink, DpdkLinkOptions};
use dataplane::{Config, Dataplane, DriveMode};
use tcp_offload::wire::EthernetAddress;

/// Message size.
const MSG: usize = 64 << 10;
/// Messages posted and not yet completed, with one queue pair.
const DEPTH: usize = 8;
/// Messages in flight per queue pair when there are several (the demo's
/// share of its depth with many QPs).
const DEPTH_MANY: usize = 2;
/// Bytes moved before the measured ones (connection warm, queues grown).
const WARMUP: u64 = 32 << 20;
/// Longest a connection setup or a transfer may take.
const PATIENCE: Duration = Duration::from_secs(120);
/// Connections asked for before their answers are awaited.
const CONNECT_BATCH: usize = 256;
const IP: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 98, 0, 1), Ipv4Addr::new(10, 98, 0, 2)];
const MAC: [EthernetAddress; 2] = [
    EthernetAddress([2, 0, 0, 0x98, 0, 1]),
    EthernetAddress([2, 0, 0, 0x98, 0, 2]),
];
const PORT: u16 = 7471;

/// One side's verbs objects: its queue pairs, their one CQ and one
/// region holding each QP's messages in turn.
struct Side {
    qps: Vec<Qp>,
    /// 64 KiB slots of the region the messages cycle over.
    slots: usize,
    cq: Cq,
    mr: MemoryRegistration,
    _region: Region,
}

/// Messages in flight per queue pair with `qps` of them.
fn depth(qps: usize) -> usize {
    if qps == 1 {
        DEPTH
    } else {
        DEPTH_MANY
    }
}

fn side(dp: &Dataplane, qps: usize, slots: usize) -> Result<Side, String> {
    let len = MSG * slots;
    let region = Region::new(len).map_err(|e| format!("region: {e}"))?;
    let pd = dp.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = dp
        .reg_mr(pd, &region, 0, len, access)
        .map_err(|e| format!("reg_mr: {e}"))?;
    let cqe = u32::try_from(qps * depth(qps) + 256).map_err(|_| "too many QPs")?;
    let cq = dp.create_cq(cqe).map_err(|e| format!("create_cq: {e}"))?;
    let opts = QpOptions {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpOptions::default()
    };
    let qps = (0..qps)
        .map(|_| dp.create_qp(pd, &cq, &cq, opts))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("create_qp: {e}"))?;
    Ok(Side {
        qps,
        slots,
        cq,
        mr,
        _region: region,
    })
}

/// Two dataplanes at `mtu` over a fresh `net_ring` pair, `qps` QPs of
/// theirs connected (by their worker threads, which busy polling then
/// stops).
fn pair(
    eal: &Arc<dpdk_bindings::Eal>,
    mtu: usize,
    qps: usize,
    slots: usize,
) -> Result<([Dataplane; 2], [Side; 2]), String> {
    let opts = DpdkLinkOptions {
        queues: 1,
        mtu,
        attach_payload: false,
        ..DpdkLinkOptions::default()
    };
    // Ring names are unique in the process.
    static PAIRS: AtomicUsize = AtomicUsize::new(0);
    let name = format!("frames{}", PAIRS.fetch_add(1, Ordering::Relaxed));
    let (la, lb) = DpdkLink::ring_pair(eal, &name, &opts, (Some(MAC[0]), Some(MAC[1])))
        .map_err(|e| format!("net_ring pair: {e}"))?;
    let config = |i: usize| {
        let mut c = Config::single("net_ring_frames", IP[i], MAC[i]);
        c.workers.count = 1;
        c.ports[0].mtu = mtu;
        let q = u32::try_from(qps).unwrap_or(u32::MAX);
        c.limits.max_qp = c.limits.max_qp.max(q.saturating_add(16));
        c.limits.max_cqe = c.limits.max_cqe.max(q.saturating_mul(16)).min(1 << 22);
        c.tcp.max_connections = c.tcp.max_connections.max(qps + 64);
        c
    };
    let a = Dataplane::open_with_link(&config(0), la, DriveMode::Threads)
        .map_err(|e| format!("side A: {e}"))?;
    let b = Dataplane::open_with_link(&config(1), lb, DriveMode::Threads)
        .map_err(|e| format!("side B: {e}"))?;
    let sides = [side(&a, qps, slots)?, side(&b, qps, slots)?];
    b.listen(PORT, CONNECT_BATCH)
        .map_err(|e| format!("listen: {e}"))?;
    let t0 = Instant::now();
    let mut accepted = 0;
    for batch in sides[0].qps.chunks(CONNECT_BATCH) {
        for qp in batch {
            a.connect(
                qp,
                SocketAddrV4::new(IP[1], PORT),
                &ConnectParams::default(),
            )
            .map_err(|e| format!("connect: {e}"))?;
        }
        let mut up = [0, 0];
        while up[0] < batch.len() || up[1] < batch.len() {
            if t0.elapsed() > PATIENCE {
                return Err(format!("{accepted} of {qps} connections up"));
            }
            while let Some(e) = b.poll_event() {
                match e {
                    CmEvent::ConnectRequest(req) => {
                        let qp = sides[1].qps.get(accepted).ok_or("a request too many")?;
                        b.accept(&req, qp, &ConnectParams::default())
                            .map_err(|e| format!("accept: {e}"))?;
                        accepted += 1;
                    }
                    CmEvent::Established { .. } => up[1] += 1,
                    _ => {}
                }
            }
            while let Some(e) = a.poll_event() {
                if let CmEvent::Established { .. } = e {
                    up[0] += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(([a, b], sides))
}

/// WRITEs `bytes` (whole messages) from A to B, each QP's messages to
/// the same place in B's region as from A's, the QPs in turn with at
/// most `depth` in flight each, both dataplanes driven by this thread.
/// Returns the time spent in each side's polls (A's, B's); the rest is
/// the application's posting and completion handling.
fn transfer(dps: &[Dataplane; 2], s: &[Side; 2], bytes: u64) -> Result<[Duration; 2], String> {
    let mut in_poll = [Duration::ZERO; 2];
    let busy = |i: usize| dps[i].busy_poll().map_err(|e| format!("busy_poll: {e}"));
    let (mut pa, mut pb) = (busy(0)?, busy(1)?);
    let total = bytes.div_ceil(MSG as u64);
    let (src, dst) = (&s[0], &s[1]);
    let n = src.qps.len();
    let d = depth(n);
    // Per QP: messages posted, and completed.
    let mut posted = vec![0u64; n];
    let mut completed = vec![0u64; n];
    let (mut sent, mut done) = (0u64, 0u64);
    // QPs with room to post, in turn.
    let mut ready: std::collections::VecDeque<usize> = (0..n).collect();
    let t0 = Instant::now();
    while done < total {
        while sent < total {
            let Some(i) = ready.pop_front() else {
                break;
            };
            // The QP's own slots in turn, or with `FRAMES_SLOTS` the
            // region's, wrapped: one QP walks all of them, many share.
            let k = if n == 1 {
                posted[i]
            } else {
                (i * d) as u64 + posted[i] % d as u64
            };
            let slot = (k % src.slots as u64) * MSG as u64;
            let wr = SendWr::write(
                i as u64,
                SgeList::single(src.mr.sge(slot, MSG as u32)),
                dst.mr.addr() + slot,
                dst.mr.rkey(),
            );
            src.qps[i]
                .post_send(&wr)
                .map_err(|e| format!("post_send: {e:?}"))?;
            posted[i] += 1;
            sent += 1;
            if posted[i] - completed[i] < d as u64 {
                ready.push_back(i);
            }
        }
        let t = Instant::now();
        pa.poll();
        let u = Instant::now();
        // Side B takes all that came before A sends more, as a receiver
        // on a core of its own keeps up: otherwise frames queue in the
        // ring by the thousand with many QPs, and each is out of cache by
        // the time B reads it, which the demo does not see.
        while pb.poll() {}
        let v = Instant::now();
        in_poll[0] += u - t;
        in_poll[1] += v - u;
        while let Some(wc) = src.cq.poll_one() {
            if wc.status != WcStatus::Success {
                return Err(format!("completion: {wc:?}"));
            }
            let i = wc.wr_id as usize;
            if posted[i] - completed[i] == d as u64 {
                ready.push_back(i);
            }
            completed[i] += 1;
            done += 1;
        }
        if t0.elapsed() > PATIENCE {
            return Err(format!("{done} of {total} messages after {PATIENCE:?}"));
        }
    }
    Ok(in_poll)
}

/// What the two sides' counters say so far.
#[derive(Clone, Copy)]
struct Counts {
    /// Data frames side A has sent.
    frames: u64,
    /// Bytes side B has received.
    bytes: u64,
    /// Frames (ACKs) side B has sent.
    acks: u64,
    /// Connection services each side ran.
    visits: [u64; 2],
}

fn counts(dps: &[Dataplane; 2]) -> Counts {
    let visits = |dp: &Dataplane| dp.stats().iter().map(|s| s.conn_visits).sum();
    Counts {
        frames: dps[0].stats().iter().map(|s| s.tx_packets).sum(),
        bytes: dps[1].stats().iter().map(|s| s.rx_bytes).sum(),
        acks: dps[1].stats().iter().map(|s| s.tx_packets).sum(),
        visits: [visits(&dps[0]), visits(&dps[1])],
    }
}

/// What one measured transfer cost.
struct Measured {
    /// Nanoseconds of this thread's CPU per data frame.
    ns_per_frame: f64,
    /// Bytes moved per second of that CPU.
    rate: f64,
    /// Data frames per frame side B sent back (its ACKs).
    frames_per_ack: f64,
    /// Data frames per connection service, side A's and side B's: how
    /// far the cost of visiting a connection is spread.
    frames_per_visit: [f64; 2],
    /// Nanoseconds per data frame in side A's polls and in side B's
    /// (wall time: one thread, busy throughout).
    ns_in_polls: [f64; 2],
}

/// One measured transfer on a warm pair.
fn run(dps: &[Dataplane; 2], s: &[Side; 2], bytes: u64) -> Result<Measured, String> {
    let c0 = counts(dps);
    let t0 = benches::thread_cpu();
    let polls = transfer(dps, s, bytes)?;
    let t1 = benches::thread_cpu();
    let c1 = counts(dps);
    let cpu = (t1 - t0).as_secs_f64();
    let frames = (c1.frames - c0.frames).max(1) as f64;
    if c1.bytes - c0.bytes < bytes {
        return Err(format!(
            "side B received {} of {bytes} bytes",
            c1.bytes - c0.bytes
        ));
    }
    let per_visit = |i: usize| frames / (c1.visits[i] - c0.visits[i]).max(1) as f64;
    Ok(Measured {
        ns_per_frame: cpu * 1e9 / frames,
        rate: bytes as f64 / cpu,
        frames_per_ack: frames / (c1.acks - c0.acks).max(1) as f64,
        frames_per_visit: [per_visit(0), per_visit(1)],
        ns_in_polls: polls.map(|d| d.as_secs_f64() * 1e9 / frames),
    })
}

fn main() {
    let mtus: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .filter_map(|a| a.parse().ok())
        .collect();
    let mtus = if mtus.is_empty() {
        vec![1500, 9000]
    } else {
        mtus
    };
    let prefix = format!("iwarp-frames-{}", std::process::id());
    let dir = iwarp::common::eal_prefix_dir(&prefix);
    let r = start_eal(&default_eal_args(&prefix, &[]))
        .map_err(|e| format!("EAL: {e}"))
        .and_then(|eal| bench(&eal, &mtus));
    let _ = std::fs::remove_dir_all(dir);
    if let Err(e) = r {
        eprintln!("frames: {e}");
        std::process::exit(1);
    }
}

fn bench(eal: &Arc<dpdk_bindings::Eal>, mtus: &[usize]) -> Result<(), String> {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let bytes = env("FRAMES_MIB", 512) << 20;
    let runs = env("FRAMES_RUNS", 5).max(1);
    let qps = usize::try_from(env("FRAMES_QPS", 1).clamp(1, 16_384)).unwrap_or(1);
    let own = (qps * depth(qps)) as u64;
    // At most 4 GiB a region.
    let slots = usize::try_from(env("FRAMES_SLOTS", own).clamp(1, 1 << 16)).unwrap_or(1);
    println!(
        "frames: WRITE {} KiB, {qps} QP(s) x {} in flight over {slots} slots, {} MiB a run, \
         {runs} runs, one thread",
        MSG >> 10,
        depth(qps),
        bytes >> 20
    );
    println!(
        "{:>6} {:>12} {:>12} {:>13} {:>12} {:>14} {:>10} {:>12} {:>17}",
        "MTU",
        "ns/frame",
        "best ns",
        "in polls A B",
        "MiB/s of CPU",
        "copy+CRC MiB/s",
        "x copy+CRC",
        "frames/ACK",
        "frames/visit A B"
    );
    for &mtu in mtus {
        let (dps, s) = pair(eal, mtu, qps, slots).map_err(|e| format!("MTU {mtu}: {e}"))?;
        // Every QP's buffers and queues in use once before the measure.
        let warmup = WARMUP.max((qps * depth(qps) * MSG) as u64);
        transfer(&dps, &s, warmup).map_err(|e| format!("MTU {mtu}: warm-up: {e}"))?;
        // Each run's figures, and the demo's baseline beside it (MiB/s,
        // as the demo counts).
        let mut measured = Vec::new();
        for _ in 0..runs {
            let m = run(&dps, &s, bytes).map_err(|e| format!("MTU {mtu}: {e}"))?;
            measured.push((m, iwarp::demo::copy_crc_rate(MSG, bytes).0));
        }
        for qp in &s[0].qps {
            let _ = dps[0].disconnect(qp, false);
        }
        let median = |f: &dyn Fn(&(Measured, f64)) -> f64| {
            benches::median(&mut measured.iter().map(f).collect::<Vec<_>>())
        };
        let ns = median(&|(m, _)| m.ns_per_frame);
        // The cheapest run: a neighbour's burst only ever adds time.
        let best = measured
            .iter()
            .map(|(m, _)| m.ns_per_frame)
            .fold(f64::INFINITY, f64::min);
        let rate = median(&|(m, _)| m.rate / iwarp::runner::MB);
        let base = median(&|&(_, b)| b);
        let per_ack = median(&|(m, _)| m.frames_per_ack);
        let [visit_a, visit_b] = [0, 1].map(|i| median(&|(m, _)| m.frames_per_visit[i]));
        let [poll_a, poll_b] = [0, 1].map(|i| median(&|(m, _)| m.ns_in_polls[i]));
        println!(
            "{mtu:>6} {ns:>12.0} {best:>12.0} {poll_a:>6.0} {poll_b:>6.0} {rate:>12.0} {base:>14.0} {:>10.3} {per_ack:>12.1} \
             {visit_a:>8.1} {visit_b:>8.1}",
            rate / base
        );
    }
    Ok(())
}
