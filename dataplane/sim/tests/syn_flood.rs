//! A SYN flood at a listener while a thousand queue pairs move data.
//!
//! Side A connects [`QPS`] queue pairs to side B's listener and keeps
//! [`DEPTH`] RDMA WRITEs of [`MSG`] bytes in flight on each, over a
//! 1 Gb/s link. The same run is made twice from the same seed: once
//! quiet, once with SYNs from forged sources injected on the link into B
//! at [`FLOOD_PER_SECOND`], half from a few addresses B can answer
//! (static neighbours: its SYN-ACKs go out, SYN cookies once the backlog
//! is full) and half from thousands it cannot (ARP requests nobody
//! answers). The flooded run must keep at least 0.9 of the quiet run's
//! WRITE bandwidth, connect a genuine new queue pair in the midst of the
//! flood at once (no SYN retransmission), answer more SYNs than its
//! backlog holds (cookies), and hold its heap: a counting allocator
//! measures what the flood adds.
//!
//! Virtual time: the figures are the protocol's (what the flood takes of
//! the link, whether a connection stalls or a frame is lost to it), not
//! the CPU time a flood costs a worker.

use core::net::{Ipv4Addr, SocketAddrV4};
use core::time::Duration;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, Ordering};

use dataplane::api::{
    Access, CmEvent, ConnectParams, Cq, Qp, QpOptions, Region, SendWr, SgeList, WcStatus,
};
use dataplane::config::{MacAddr, Neighbor};
use dataplane_sim::world::{IP, MAC, PORT};
use dataplane_sim::{World, WorldSpec};
use tcp_offload::seq::SeqNumber;
use tcp_offload::wire::TcpFlags;
use tcp_offload::Instant;
use tcp_sim::frame::{build_tcp_frame, peek_tcp, RawSegment};
use tcp_sim::{LinkConfig, Rng};

/// Live heap bytes of the process (one thread: the simulator's).
static LIVE: AtomicI64 = AtomicI64::new(0);

struct Counting;

// SAFETY: every call goes to the system allocator unchanged; the counter
// only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; `new` is the caller's checked size.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const SEED: u64 = 0x5f100d;
/// Queue pairs moving data.
const QPS: usize = 1000;
/// WRITEs in flight on each.
const DEPTH: usize = 1;
/// Bytes of each WRITE.
const MSG: usize = 1024;
/// The listener's backlog.
const BACKLOG: usize = 64;
/// SYNs the flood injects per second of virtual time.
const FLOOD_PER_SECOND: u64 = 100_000;
/// From the last connection up to the end of the measured window.
const WARM_UP: Duration = Duration::from_millis(10);
const MEASURED: Duration = Duration::from_millis(60);
/// When, after the last connection, the flood starts.
const FLOOD_AT: Duration = Duration::from_millis(2);
/// When, after the last connection, the genuine queue pair connects.
const GENUINE_AT: Duration = Duration::from_millis(20);
/// The MAC address the forged sources answer to.
const FORGED_MAC: [u8; 6] = [2, 0xee, 0, 0, 0, 1];
/// Forged sources B has a neighbour entry for.
const RESOLVED: u8 = 8;

/// What one run measured.
#[derive(Debug)]
struct Figures {
    /// WRITE bytes completed in the measured window.
    bytes: u64,
    /// SYNs injected.
    syns: u64,
    /// SYN-ACKs B sent to forged sources.
    syn_acks: u64,
    /// Time from the genuine queue pair's connect to both ends up.
    genuine: Option<Duration>,
    /// Live heap bytes added from the flood's start to the window's end.
    heap_growth: i64,
    /// Of them, those added over the window's second half.
    heap_late_growth: i64,
}

fn spec() -> WorldSpec {
    let mut w = WorldSpec::new(SEED);
    w.link = LinkConfig::perfect().with_latency(Duration::from_micros(500));
    w.static_arp = true;
    w.tcp.max_connections = QPS + 4 * BACKLOG + 16;
    w.limits.max_qp = (QPS + 16) as u32;
    w.neighbors[1] = (1..=RESOLVED)
        .map(|i| Neighbor {
            ip: Ipv4Addr::new(10, 88, 1, i),
            mac: MacAddr(tcp_offload::wire::EthernetAddress(FORGED_MAC)),
        })
        .collect();
    w
}

/// One side's objects.
struct Side {
    _region: Region,
    mr: dataplane::api::MemoryRegistration,
    cq: Cq,
    qps: Vec<Qp>,
}

fn side(dp: &dataplane::Dataplane, n: usize, fill: u8) -> Side {
    let len = (QPS + 1) * DEPTH * MSG;
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ fill)
        .collect();
    let region = Region::from_vec(bytes).expect("region");
    let pd = dp.alloc_pd().expect("pd");
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = dp.reg_mr(pd, &region, 0, len, rw).expect("reg_mr");
    let cq = dp.create_cq((n * DEPTH + 64) as u32).expect("cq");
    let opts = QpOptions {
        max_send_wr: 8,
        max_recv_wr: 8,
        ..QpOptions::default()
    };
    let qps = (0..n)
        .map(|_| dp.create_qp(pd, &cq, &cq, opts).expect("qp"))
        .collect();
    Side {
        _region: region,
        mr,
        cq,
        qps,
    }
}

fn params(i: usize) -> ConnectParams {
    ConnectParams {
        ird: 1,
        ord: 1,
        private_data: (i as u32).to_le_bytes().to_vec(),
    }
}

/// B's side of the connection manager: accepts each request on its QP of
/// the index the request names; counts B's established QPs.
fn serve(b: &dataplane::Dataplane, sb: &Side, up: &mut usize) -> Result<(), String> {
    while let Some(e) = b.poll_event() {
        match e {
            CmEvent::ConnectRequest(req) => {
                let i = <[u8; 4]>::try_from(req.private_data.as_slice())
                    .map(u32::from_le_bytes)
                    .map_err(|_| format!("a request without an index: {req:?}"))?
                    as usize;
                let qp = sb.qps.get(i).ok_or("an index out of range")?;
                b.accept(&req, qp, &params(i))
                    .map_err(|e| format!("accept: {e}"))?;
            }
            CmEvent::Established { .. } => *up += 1,
            CmEvent::MrDeregistered(_) => {}
            other => return Err(format!("side B: {other:?}")),
        }
    }
    Ok(())
}

/// Posts WRITE `slot` of QP `i`: its own slice of A's region into the same
/// slice of B's.
fn post(sa: &Side, sb: &Side, i: usize, slot: usize) -> Result<(), String> {
    let off = ((i * DEPTH + slot) * MSG) as u64;
    let wr = SendWr::write(
        ((i as u64) << 16) | slot as u64,
        SgeList::single(sa.mr.sge(off, MSG as u32)),
        sb.mr.addr() + off,
        sb.mr.rkey(),
    );
    sa.qps[i]
        .post_send(&wr)
        .map_err(|e| format!("post_send on QP {i}: {e:?}"))
}

/// A SYN from a forged source: every other one from an address B
/// resolves, the rest from 10.88.128.0/17, which nobody answers for.
fn forged_syn(rng: &mut Rng, n: u64) -> Vec<u8> {
    let ip = if n % 2 == 0 {
        Ipv4Addr::new(10, 88, 1, 1 + rng.below(u64::from(RESOLVED)) as u8)
    } else {
        let x = rng.below(1 << 15) as u16;
        Ipv4Addr::new(10, 88, 128 | (x >> 8) as u8, x as u8)
    };
    build_tcp_frame(&RawSegment {
        src_mac: FORGED_MAC,
        dst_mac: MAC[1].0,
        src: SocketAddrV4::new(ip, 1024 + rng.below(60_000) as u16),
        dst: SocketAddrV4::new(IP[1], PORT),
        seq: SeqNumber(rng.next_u64() as u32),
        ack: SeqNumber(0),
        flags: TcpFlags::SYN,
        window: 65535,
        mss: Some(1460),
        payload: &[],
    })
}

fn run(flood: bool) -> Result<Figures, String> {
    let mut w = World::new(&spec())?;
    let sa = side(w.dp(0), QPS + 1, 0);
    let sb = side(w.dp(1), QPS + 1, 0x5a);
    w.dp(1)
        .listen(PORT, BACKLOG)
        .map_err(|e| format!("listen: {e}"))?;
    let index: HashMap<_, usize> = sa
        .qps
        .iter()
        .enumerate()
        .map(|(i, q)| (q.num(), i))
        .collect();

    // Connect the thousand, 64 at a time.
    let (mut next, mut up_a, mut up_b) = (0, 0, 0);
    w.run_until(
        "a thousand connections",
        Duration::from_secs(30),
        |a, b, _| {
            while next < QPS && next - up_a.min(up_b) < 64 {
                a.connect(&sa.qps[next], SocketAddrV4::new(IP[1], PORT), &params(next))
                    .map_err(|e| format!("connect: {e}"))?;
                next += 1;
            }
            serve(b, &sb, &mut up_b)?;
            while let Some(e) = a.poll_event() {
                match e {
                    CmEvent::Established { .. } => up_a += 1,
                    CmEvent::MrDeregistered(_) => {}
                    other => return Err(format!("side A while connecting: {other:?}")),
                }
            }
            Ok(up_a == QPS && up_b == QPS)
        },
    )?;

    // SYN-ACKs to forged sources reach the flooder, not A: counted and
    // taken off the link.
    let syn_acks = Rc::new(Cell::new(0u64));
    let counter = syn_acks.clone();
    let link = w.link();
    w.net().set_drop_filter(
        link.backward,
        Some(Box::new(move |_, f: &[u8]| {
            if f.len() < 6 || f[..6] != FORGED_MAC {
                return false;
            }
            if peek_tcp(f).is_some_and(|v| v.has(TcpFlags::SYN | TcpFlags::ACK)) {
                counter.set(counter.get() + 1);
            }
            true
        })),
    );

    let t0 = w.now();
    let (flood_at, genuine_at) = (t0 + FLOOD_AT, t0 + GENUINE_AT);
    let (start, end) = (t0 + WARM_UP, t0 + WARM_UP + MEASURED);
    let interval = Duration::from_nanos(1_000_000_000 / FLOOD_PER_SECOND);
    let mut rng = Rng::new(SEED);
    let mut next_syn = flood_at;
    let mut syns = 0u64;
    let mut bytes = 0u64;
    let mut heap_at_flood = None;
    let mut heap_at_half = None;
    let half = start + MEASURED / 2;
    let mut genuine_posted: Option<Instant> = None;
    let mut genuine_up: Option<Duration> = None;
    let (mut genuine_a, mut genuine_b) = (false, 0usize);
    let mut error = None;
    for i in 0..QPS {
        for slot in 0..DEPTH {
            post(&sa, &sb, i, slot)?;
        }
    }
    let ids = w.node_ids();
    let r = w.net().run_until(end, |net| {
        let now = net.now();
        if heap_at_flood.is_none() && now >= flood_at {
            heap_at_flood = Some(LIVE.load(Ordering::Relaxed));
        }
        if heap_at_half.is_none() && now >= half {
            heap_at_half = Some(LIVE.load(Ordering::Relaxed));
        }
        while flood && now >= next_syn && next_syn < end {
            let f = forged_syn(&mut rng, syns);
            net.inject(link.forward, f);
            syns += 1;
            next_syn += interval;
        }
        let (a, b) = (net.endpoint(ids[0]).dp(), net.endpoint(ids[1]).dp());
        let mut step = || -> Result<(), String> {
            while let Some(wc) = sa.cq.poll_one() {
                if wc.status != WcStatus::Success {
                    return Err(format!("side A: {wc:?}"));
                }
                let i = *index.get(&wc.qp_num).ok_or("a completion of no QP")?;
                if now >= start {
                    bytes += MSG as u64;
                }
                post(&sa, &sb, i, (wc.wr_id & 0xffff) as usize)?;
            }
            if genuine_posted.is_none() && now >= genuine_at {
                a.connect(&sa.qps[QPS], SocketAddrV4::new(IP[1], PORT), &params(QPS))
                    .map_err(|e| format!("genuine connect: {e}"))?;
                genuine_posted = Some(now);
            }
            while let Some(e) = a.poll_event() {
                match e {
                    CmEvent::Established { qp, .. } if qp == sa.qps[QPS].num() => genuine_a = true,
                    CmEvent::MrDeregistered(_) => {}
                    other => return Err(format!("side A: {other:?}")),
                }
            }
            serve(b, &sb, &mut genuine_b)?;
            if let (Some(at), None, true, 1) = (genuine_posted, genuine_up, genuine_a, genuine_b) {
                genuine_up = Some(now - at);
            }
            Ok(())
        };
        if let Err(e) = step() {
            error = Some(e);
            return true;
        }
        false
    });
    if let Some(e) = error {
        return Err(e);
    }
    match r {
        Err(tcp_sim::SimError::Deadline { .. }) => {}
        Err(e) => return Err(format!("{e}")),
        Ok(_) => return Err("stopped early".into()),
    }
    let heap_now = LIVE.load(Ordering::Relaxed);
    let heap_growth = heap_now - heap_at_flood.unwrap_or(0);
    let heap_late_growth = heap_now - heap_at_half.unwrap_or(0);
    if std::env::var_os("FLOOD_DEBUG").is_some() {
        eprintln!(
            "A {:?}\nB {:?}\nposted {genuine_posted:?} a {genuine_a} b {genuine_b}",
            w.dp(0).stats(),
            w.dp(1).stats()
        );
    }
    Ok(Figures {
        bytes,
        syns,
        syn_acks: syn_acks.get(),
        genuine: genuine_up,
        heap_growth,
        heap_late_growth,
    })
}

#[test]
fn a_syn_flood_leaves_a_thousand_queue_pairs_their_bandwidth() {
    let quiet = run(false).unwrap_or_else(|e| panic!("quiet run: {e}"));
    let flooded = run(true).unwrap_or_else(|e| panic!("flooded run: {e}"));
    let ratio = flooded.bytes as f64 / quiet.bytes as f64;
    let mbps = |b: u64| b as f64 / MEASURED.as_secs_f64() / 1e6;
    println!(
        "{QPS} QPs, {MSG}-byte WRITEs, {DEPTH} in flight each, 1 ms round trips: quiet {:.1} \
         MB/s, under {} SYNs ({} SYN-ACKs to forged sources) {:.1} MB/s, ratio {ratio:.3}; \
         genuine connect {:?} (quiet {:?}); heap growth over the window {} bytes, {} in its \
         second half (quiet {}, {})",
        mbps(quiet.bytes),
        flooded.syns,
        flooded.syn_acks,
        mbps(flooded.bytes),
        flooded.genuine,
        quiet.genuine,
        flooded.heap_growth,
        flooded.heap_late_growth,
        quiet.heap_growth,
        quiet.heap_late_growth,
    );
    assert!(quiet.bytes > 0, "{quiet:?}");
    assert_eq!(quiet.syns, 0);
    assert!(
        flooded.syns >= FLOOD_PER_SECOND * MEASURED.as_millis() as u64 / 1000,
        "{flooded:?}"
    );
    assert!(
        ratio >= 0.9,
        "the flood took {ratio:.3} of the bandwidth left: {flooded:?}"
    );
    // More SYN-ACKs than the backlog holds: cookies answered the rest.
    assert!(
        flooded.syn_acks > 2 * BACKLOG as u64,
        "{} SYN-ACKs",
        flooded.syn_acks
    );
    // The genuine queue pair came up in round trips, not after a SYN
    // retransmission (the first comes after a second).
    let genuine = flooded.genuine.expect("the genuine QP never connected");
    assert!(genuine < Duration::from_millis(20), "{genuine:?}");
    // Bounded: the flood adds what a full backlog of half-open
    // connections holds, taken in its first moments, and nothing after,
    // however long it goes on.
    let extra = flooded.heap_growth - quiet.heap_growth;
    assert!(
        extra < (BACKLOG as i64) * 64 * 1024,
        "the flood grew the heap by {extra} bytes more than the quiet run"
    );
    assert!(
        flooded.heap_late_growth - quiet.heap_late_growth < 64 * 1024,
        "the heap still grew in the flood's second half: {flooded:?}, quiet {quiet:?}"
    );
}
