//! MPA receive and send cost of bulk RDMA Writes, against a memcpy and a
//! CRC32c of the same bytes measured in the same run.
//!
//! The stream is what siw sends for a 64 KiB RDMA Write on a connection
//! with TCP timestamps (1448-octet segments), here with MPA CRCs on:
//! 1448-octet FPDUs, one per segment, each carrying a 1442-octet ULPDU (a
//! 14-octet tagged Write header and 1428 payload octets). Forty-six of them
//! (66,608 octets, one Write message) are fed in 1448-octet chunks, as TCP
//! would hand them over.
//!
//! Receive side (`mpa_rx`, per stream octet):
//! - `deframe_crc`: the deframer alone (length fields, payload pieces,
//!   CRC32c over every covered octet, CRC check);
//! - `deframe_crc_place`: that, plus what the QP engine does per tagged
//!   segment, written out here: gather and parse the DDP header, check the
//!   STag for the whole segment (`MrTable::check_remote_write`), then check
//!   each piece again and copy it into the registered region (`VecMemory`);
//! - `engine_rx`: the QP engine itself (`Endpoint::handle_stream`) on a
//!   connected endpoint, placing through the same `VecMemory`.
//!
//! Send side (`mpa_tx`, per FPDU): `frame` is `Framer::frame` for one
//! FPDU (header given, payload by reference): the 2-octet prefix, the
//! CRC32c over prefix, header, payload and pad, and the trailer.
//!
//! Baselines, in the same run: `memcpy_*` copies the same octets,
//! `crc32c_*` runs `crc32c::crc32c` over them. After criterion's own
//! output the ratios to both are printed. Time is the benchmark thread's
//! CPU time (`CLOCK_THREAD_CPUTIME_ID`), so that other processes on a
//! shared machine do not inflate one figure and not its baseline.

use std::hint::black_box;
use std::time::Duration;

use benches::Estimates;
use criterion::{Bencher, Criterion, Throughput};
use rdmap::engine::{Endpoint, EngineEvent, Env};
use rdmap::mpa::{Config, CrcPolicy, DeframeEvent, Deframer, Framer, RtrSet};
use rdmap::placement::{Placement, RegionHandle, VecMemory};
use rdmap::verbs::{
    Access, CompletionQueue, Device, DeviceLimits, MrTable, PdId, QpInitAttr, Stag,
};
use rdmap::wire::{DdpRepr, RdmapOpcode, TAGGED_HEADER_LEN};

/// TCP payload per segment with timestamps on a 1500-octet MTU.
const FPDU: usize = 1448;
/// ULPDU in such an FPDU: minus the length field and the CRC (no pad).
const ULPDU: usize = FPDU - 6;
/// Write payload per FPDU.
const PAYLOAD: usize = ULPDU - TAGGED_HEADER_LEN;
/// FPDUs in the stream: one Write message of a little over 64 KiB.
const FPDUS: usize = 46;
/// The Write's tagged offset of its first octet (the sink's iova).
const VA: u64 = 0x7f00_1234_0000;

/// The receiving side: a device with one registered sink and its memory.
struct Sink {
    dev: Device,
    mem: VecMemory,
    pd: PdId,
    region: RegionHandle,
    stag: Stag,
}

/// The Write message's payload.
fn payload() -> Vec<u8> {
    (0..PAYLOAD * FPDUS).map(|i| (i * 31 + 7) as u8).collect()
}

/// The tagged Write header of FPDU `i` of the message.
fn header(stag: Stag, i: usize) -> [u8; TAGGED_HEADER_LEN] {
    let last = i + 1 == FPDUS;
    let repr = DdpRepr::tagged(
        RdmapOpcode::RdmaWrite,
        last,
        stag.0,
        VA + (i * PAYLOAD) as u64,
    );
    let mut h = [0u8; TAGGED_HEADER_LEN];
    repr.emit(&mut h);
    h
}

/// The FPDU stream of the message, CRCs on, from stream position 0.
fn stream(stag: Stag, payload: &[u8]) -> Vec<u8> {
    let mut f = Framer::new(true, false);
    let mut out = Vec::with_capacity(FPDU * FPDUS);
    for (i, p) in payload.chunks(PAYLOAD).enumerate() {
        let fpdu = f.build_fpdu(&header(stag, i), p).expect("frame");
        assert_eq!(fpdu.len(), FPDU);
        out.extend_from_slice(&fpdu);
    }
    out
}

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

fn qp_attr(pd: PdId, cq: &CompletionQueue) -> QpInitAttr {
    QpInitAttr {
        pd,
        send_cq: cq.id(),
        recv_cq: cq.id(),
        srq: None,
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_ord: 4,
        max_ird: 4,
        sq_sig_all: false,
    }
}

/// Both ends of a connection (the initiator only exists to take the
/// responder through MPA setup): the responder receives the Writes.
struct Connection {
    sink: Sink,
    cq: CompletionQueue,
    ep: Endpoint,
}

fn connect() -> Connection {
    let config = Config {
        crc: CrcPolicy::Requested,
        rtr_offer: RtrSet::NONE,
        ..Config::default()
    };
    let side = || {
        let mut dev = Device::new(DeviceLimits::default());
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(64).expect("cq");
        let qp = dev.create_qp(qp_attr(pd, &cq)).expect("qp");
        (dev, pd, cq, qp)
    };
    let (mut a_dev, _, mut a_cq, a_qp) = side();
    let (mut b_dev, pd, mut b_cq, b_qp) = side();
    let mut a_mem = VecMemory::new();
    let mut b_mem = VecMemory::new();
    let mut a = Endpoint::initiator(config.clone(), b"", a_qp, Duration::ZERO).expect("initiator");
    let mut b = Endpoint::responder(config, b_qp, Duration::ZERO).expect("responder");
    let mut connected = [false; 2];
    for _ in 0..8 {
        let mut env = Env::new(&mut a_dev, &mut a_mem, &mut a_cq);
        while let Some(r) = a.poll_record(FPDU, &mut env) {
            let bytes = r.to_vec(env.mem);
            b.handle_stream(
                Duration::ZERO,
                &bytes,
                &mut Env::new(&mut b_dev, &mut b_mem, &mut b_cq),
            );
        }
        let mut env = Env::new(&mut b_dev, &mut b_mem, &mut b_cq);
        while let Some(ev) = b.poll_event() {
            match ev {
                EngineEvent::ConnectRequest => b.accept(b"").expect("accept"),
                EngineEvent::Connected(_) => connected[1] = true,
                other => panic!("responder: {other:?}"),
            }
        }
        while let Some(r) = b.poll_record(FPDU, &mut env) {
            let bytes = r.to_vec(env.mem);
            a.handle_stream(
                Duration::ZERO,
                &bytes,
                &mut Env::new(&mut a_dev, &mut a_mem, &mut a_cq),
            );
        }
        while let Some(ev) = a.poll_event() {
            match ev {
                EngineEvent::Connected(_) => connected[0] = true,
                other => panic!("initiator: {other:?}"),
            }
        }
        if connected == [true, true] {
            let region = b_mem.add_region(PAYLOAD * FPDUS);
            let span = b_mem.whole(region).expect("span");
            let stag = b_dev
                .reg_mr(pd, span, VA, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .expect("reg_mr");
            return Connection {
                sink: Sink {
                    dev: b_dev,
                    mem: b_mem,
                    pd,
                    region,
                    stag,
                },
                cq: b_cq,
                ep: b,
            };
        }
    }
    panic!("MPA setup did not finish");
}

/// Deframes `stream` in `FPDU`-octet chunks; returns the ULPDU octets seen.
/// Panics on a bad CRC.
fn deframe(stream: &[u8]) -> usize {
    let mut d = Deframer::new(true, false, u16::MAX);
    let mut n = 0;
    for chunk in stream.chunks(FPDU) {
        for ev in d.feed(chunk) {
            match ev.expect("framing") {
                DeframeEvent::Bytes(b) => n += b.len(),
                DeframeEvent::UlpduEnd { crc_ok } => assert!(crc_ok),
                DeframeEvent::UlpduStart { .. } => {}
            }
        }
    }
    n
}

/// One tagged segment being placed.
struct Segment {
    hdr: [u8; TAGGED_HEADER_LEN],
    have: usize,
    len: usize,
    /// STag and tagged offset once the header is parsed and checked.
    target: Option<(Stag, u64)>,
    placed: u32,
}

/// Deframes `stream` and places every Write segment's payload into the
/// sink, checking the header, then each piece, against the STag table.
/// Returns the payload octets placed.
fn deframe_place(stream: &[u8], mrs: &MrTable, pd: PdId, mem: &mut VecMemory) -> usize {
    let mut d = Deframer::new(true, false, u16::MAX);
    let mut seg = Segment {
        hdr: [0; TAGGED_HEADER_LEN],
        have: 0,
        len: 0,
        target: None,
        placed: 0,
    };
    let mut total = 0;
    for chunk in stream.chunks(FPDU) {
        for ev in d.feed(chunk) {
            match ev.expect("framing") {
                DeframeEvent::UlpduStart { len } => {
                    seg.have = 0;
                    seg.len = usize::from(len);
                    seg.target = None;
                    seg.placed = 0;
                }
                DeframeEvent::Bytes(mut b) => {
                    if seg.have < TAGGED_HEADER_LEN {
                        let n = (TAGGED_HEADER_LEN - seg.have).min(b.len());
                        seg.hdr[seg.have..seg.have + n].copy_from_slice(&b[..n]);
                        seg.have += n;
                        b = &b[n..];
                        if seg.have == TAGGED_HEADER_LEN {
                            let (repr, _) = DdpRepr::parse_ulpdu(&seg.hdr).expect("header");
                            let DdpRepr::Tagged {
                                opcode: RdmapOpcode::RdmaWrite,
                                stag,
                                to,
                                ..
                            } = repr
                            else {
                                panic!("not a Write: {repr:?}");
                            };
                            let plen = (seg.len - TAGGED_HEADER_LEN) as u32;
                            mrs.check_remote_write(Stag(stag), to, plen, pd)
                                .expect("segment check");
                            seg.target = Some((Stag(stag), to));
                        }
                    }
                    if b.is_empty() {
                        continue;
                    }
                    let (stag, to) = seg.target.expect("header before payload");
                    let at = to + u64::from(seg.placed);
                    let n = b.len() as u32;
                    if let Some(range) = mrs.check_remote_write(stag, at, n, pd).expect("piece") {
                        mem.write(range, b).expect("placed");
                    }
                    seg.placed += n;
                    total += b.len();
                }
                DeframeEvent::UlpduEnd { crc_ok } => assert!(crc_ok),
            }
        }
    }
    total
}

fn bench(c: &mut Criterion) {
    let payload = payload();
    let mut conn = connect();
    let stream = stream(conn.sink.stag, &payload);
    assert_eq!(stream.len(), FPDU * FPDUS);

    // Check every path once before timing it.
    assert_eq!(deframe(&stream), ULPDU * FPDUS);
    {
        let s = &mut conn.sink;
        s.mem.bytes_mut(s.region).expect("region").fill(0);
        let placed = deframe_place(&stream, s.dev.mrs(), s.pd, &mut s.mem);
        assert_eq!(placed, payload.len());
        assert_eq!(s.mem.bytes(s.region), Some(&payload[..]));
        s.mem.bytes_mut(s.region).expect("region").fill(0);
    }
    let engine_rx = |conn: &mut Connection| {
        let Connection { sink, cq, ep } = conn;
        let mut env = Env::new(&mut sink.dev, &mut sink.mem, cq);
        for chunk in stream.chunks(FPDU) {
            ep.handle_stream(Duration::ZERO, black_box(chunk), &mut env);
        }
    };
    engine_rx(&mut conn);
    assert_eq!(conn.ep.stats().bytes_placed, payload.len() as u64);
    assert_eq!(conn.sink.mem.bytes(conn.sink.region), Some(&payload[..]));
    assert_eq!(conn.ep.poll_event(), None, "the engine raised an event");

    let mut g = c.benchmark_group("mpa_rx");
    g.throughput(Throughput::Bytes(stream.len() as u64));
    let mut out = vec![0u8; stream.len()];
    g.bench_function("memcpy_stream", |b| {
        cpu_iter(b, || {
            for (d, s) in out.chunks_mut(FPDU).zip(black_box(&stream).chunks(FPDU)) {
                d.copy_from_slice(s);
            }
            black_box(&out);
        })
    });
    g.bench_function("crc32c_stream", |b| {
        cpu_iter(b, || {
            black_box(&stream)
                .chunks(FPDU)
                .fold(0, |x, s| x ^ crc32c::crc32c(s))
        })
    });
    g.bench_function("deframe_crc", |b| {
        cpu_iter(b, || deframe(black_box(&stream)))
    });
    g.bench_function("deframe_crc_place", |b| {
        let s = &mut conn.sink;
        cpu_iter(b, || {
            deframe_place(black_box(&stream), s.dev.mrs(), s.pd, &mut s.mem)
        })
    });
    g.bench_function("engine_rx", |b| cpu_iter(b, || engine_rx(&mut conn)));
    g.finish();
    assert!(!conn.ep.is_terminated());
    assert_eq!(conn.sink.mem.bytes(conn.sink.region), Some(&payload[..]));

    let mut g = c.benchmark_group("mpa_tx");
    g.throughput(Throughput::Bytes(FPDU as u64));
    let hdr = header(conn.sink.stag, 0);
    let one = &payload[..PAYLOAD];
    let fpdu = &stream[..FPDU];
    let mut out = vec![0u8; FPDU];
    g.bench_function("memcpy_1448", |b| {
        cpu_iter(b, || {
            out.copy_from_slice(black_box(fpdu));
            black_box(&out);
        })
    });
    g.bench_function("crc32c_1448", |b| {
        cpu_iter(b, || crc32c::crc32c(black_box(fpdu)))
    });
    let mut framer = Framer::new(true, false);
    let framed = framer.frame(&hdr, &[one]).expect("frame");
    assert_eq!(framed.prefix[..], fpdu[..2]);
    assert_eq!(framed.trailer.as_bytes(), &fpdu[FPDU - 4..]);
    g.bench_function("frame", |b| {
        cpu_iter(b, || {
            // A fresh framer each time: the position would otherwise walk
            // round the 32-bit stream space over a long run.
            let mut f = Framer::new(true, false);
            f.frame(black_box(&hdr), &[black_box(one)])
        })
    });
    g.finish();
}

/// Prints each of `names` against the group's memcpy and crc32c baselines.
fn ratios(est: &Estimates, group: &str, what: &str, bytes: usize, names: &[&str]) {
    let base = |prefix: &str| {
        let suffix = if group == "mpa_rx" { "stream" } else { "1448" };
        est.ns(group, &format!("{prefix}_{suffix}"))
    };
    let (Some(copy), Some(crc)) = (base("memcpy"), base("crc32c")) else {
        return;
    };
    println!("\n{what} (thread CPU time): memcpy {copy:.1} ns, crc32c {crc:.1} ns");
    println!(
        "  {:<20} {:>10} {:>8} {:>10} {:>10}",
        "", "ns", "GB/s", "x memcpy", "x crc32c"
    );
    for name in names {
        if let Some(t) = est.ns(group, name) {
            println!(
                "  {name:<20} {t:>10.1} {:>8.2} {:>9.2}x {:>9.2}x",
                bytes as f64 / t,
                t / copy,
                t / crc
            );
        }
    }
}

fn main() {
    let est = Estimates::new(env!("CARGO_TARGET_TMPDIR"));
    let mut c = Criterion::default()
        .output_directory(est.dir())
        .configure_from_args();
    bench(&mut c);
    c.final_summary();

    ratios(
        &est,
        "mpa_rx",
        &format!("receive, {FPDUS} FPDUs of {FPDU} octets per iteration"),
        FPDU * FPDUS,
        &[
            "crc32c_stream",
            "deframe_crc",
            "deframe_crc_place",
            "engine_rx",
        ],
    );
    ratios(
        &est,
        "mpa_tx",
        &format!("send, one {FPDU}-octet FPDU per iteration"),
        FPDU,
        &["crc32c_1448", "frame"],
    );
}
