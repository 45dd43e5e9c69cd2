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
//! printed). Needs no NIC and no hugepages.

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
/// Messages posted and not yet completed.
const DEPTH: usize = 8;
/// Bytes moved before the measured ones (connection warm, queues grown).
const WARMUP: u64 = 32 << 20;
/// Longest a connection setup or a transfer may take.
const PATIENCE: Duration = Duration::from_secs(120);
const IP: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 98, 0, 1), Ipv4Addr::new(10, 98, 0, 2)];
const MAC: [EthernetAddress; 2] = [
    EthernetAddress([2, 0, 0, 0x98, 0, 1]),
    EthernetAddress([2, 0, 0, 0x98, 0, 2]),
];
const PORT: u16 = 7471;

/// One side's verbs objects.
struct Side {
    qp: Qp,
    cq: Cq,
    mr: MemoryRegistration,
    _region: Region,
}

fn side(dp: &Dataplane) -> Result<Side, String> {
    let len = MSG * DEPTH;
    let region = Region::new(len).map_err(|e| format!("region: {e}"))?;
    let pd = dp.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = dp
        .reg_mr(pd, &region, 0, len, access)
        .map_err(|e| format!("reg_mr: {e}"))?;
    let cq = dp.create_cq(256).map_err(|e| format!("create_cq: {e}"))?;
    let qp = dp
        .create_qp(pd, &cq, &cq, QpOptions::default())
        .map_err(|e| format!("create_qp: {e}"))?;
    Ok(Side {
        qp,
        cq,
        mr,
        _region: region,
    })
}

/// Two dataplanes at `mtu` over a fresh `net_ring` pair, their QPs
/// connected (by their worker threads, which busy polling then stops).
fn pair(eal: &Arc<dpdk_bindings::Eal>, mtu: usize) -> Result<([Dataplane; 2], [Side; 2]), String> {
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
        c
    };
    let a = Dataplane::open_with_link(&config(0), la, DriveMode::Threads)
        .map_err(|e| format!("side A: {e}"))?;
    let b = Dataplane::open_with_link(&config(1), lb, DriveMode::Threads)
        .map_err(|e| format!("side B: {e}"))?;
    let sides = [side(&a)?, side(&b)?];
    b.listen(PORT, 16).map_err(|e| format!("listen: {e}"))?;
    a.connect(
        &sides[0].qp,
        SocketAddrV4::new(IP[1], PORT),
        &ConnectParams::default(),
    )
    .map_err(|e| format!("connect: {e}"))?;
    let t0 = Instant::now();
    let mut up = [false, false];
    while !(up[0] && up[1]) {
        if t0.elapsed() > PATIENCE {
            return Err("no connection".into());
        }
        while let Some(e) = b.poll_event() {
            match e {
                CmEvent::ConnectRequest(req) => b
                    .accept(&req, &sides[1].qp, &ConnectParams::default())
                    .map_err(|e| format!("accept: {e}"))?,
                CmEvent::Established { .. } => up[1] = true,
                _ => {}
            }
        }
        while let Some(e) = a.poll_event() {
            if let CmEvent::Established { .. } = e {
                up[0] = true;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(([a, b], sides))
}

/// WRITEs `bytes` (whole messages) from A to B, `DEPTH` in flight, both
/// dataplanes driven by this thread.
fn transfer(dps: &[Dataplane; 2], s: &[Side; 2], bytes: u64) -> Result<(), String> {
    let busy = |i: usize| dps[i].busy_poll().map_err(|e| format!("busy_poll: {e}"));
    let (mut pa, mut pb) = (busy(0)?, busy(1)?);
    let total = bytes.div_ceil(MSG as u64);
    let (mut posted, mut done) = (0u64, 0u64);
    let (src, dst) = (&s[0], &s[1]);
    let t0 = Instant::now();
    while done < total {
        while posted < total && posted - done < DEPTH as u64 {
            let slot = (posted % DEPTH as u64) * MSG as u64;
            let wr = SendWr::write(
                posted,
                SgeList::single(src.mr.sge(slot, MSG as u32)),
                dst.mr.addr() + slot,
                dst.mr.rkey(),
            );
            src.qp
                .post_send(&wr)
                .map_err(|e| format!("post_send: {e:?}"))?;
            posted += 1;
        }
        pa.poll();
        pb.poll();
        while let Some(wc) = src.cq.poll_one() {
            if wc.status != WcStatus::Success {
                return Err(format!("completion: {wc:?}"));
            }
            done += 1;
        }
        if t0.elapsed() > PATIENCE {
            return Err(format!("{done} of {total} messages after {PATIENCE:?}"));
        }
    }
    Ok(())
}

/// Data frames side A has sent and bytes side B has received so far.
fn counts(dps: &[Dataplane; 2]) -> (u64, u64) {
    let tx = dps[0].stats().iter().map(|s| s.tx_packets).sum();
    let rx = dps[1].stats().iter().map(|s| s.rx_bytes).sum();
    (tx, rx)
}

/// One measured transfer on a warm pair: nanoseconds of this thread's
/// CPU per frame, and bytes moved per second of it.
fn run(dps: &[Dataplane; 2], s: &[Side; 2], bytes: u64) -> Result<(f64, f64), String> {
    let (f0, b0) = counts(dps);
    let t0 = benches::thread_cpu();
    transfer(dps, s, bytes)?;
    let t1 = benches::thread_cpu();
    let (f1, b1) = counts(dps);
    let cpu = (t1 - t0).as_secs_f64();
    let frames = (f1 - f0).max(1) as f64;
    if b1 - b0 < bytes {
        return Err(format!("side B received {} of {bytes} bytes", b1 - b0));
    }
    Ok((cpu * 1e9 / frames, bytes as f64 / cpu))
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
    println!(
        "frames: WRITE {} KiB x {DEPTH} in flight, {} MiB a run, {runs} runs, one thread",
        MSG >> 10,
        bytes >> 20
    );
    println!(
        "{:>6} {:>12} {:>12} {:>14} {:>10}",
        "MTU", "ns/frame", "MiB/s of CPU", "copy+CRC MiB/s", "x copy+CRC"
    );
    for &mtu in mtus {
        let (mut ns, mut rate, mut base) = (Vec::new(), Vec::new(), Vec::new());
        let (dps, s) = pair(eal, mtu).map_err(|e| format!("MTU {mtu}: {e}"))?;
        transfer(&dps, &s, WARMUP).map_err(|e| format!("MTU {mtu}: warm-up: {e}"))?;
        for _ in 0..runs {
            let (n, r) = run(&dps, &s, bytes).map_err(|e| format!("MTU {mtu}: {e}"))?;
            ns.push(n);
            rate.push(r / iwarp::runner::MB);
            // The demo's baseline, in MiB/s as the demo counts.
            base.push(iwarp::demo::copy_crc_rate(MSG, bytes).0);
        }
        let _ = dps[0].disconnect(&s[0].qp, false);
        let (ns, rate, base) = (
            benches::median(&mut ns),
            benches::median(&mut rate),
            benches::median(&mut base),
        );
        println!(
            "{mtu:>6} {ns:>12.0} {rate:>12.0} {base:>14.0} {:>10.3}",
            rate / base
        );
    }
    Ok(())
}
