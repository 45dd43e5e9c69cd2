//! Small FPDUs packed several to a TCP segment (`tcp.pack_fpdus`): bursts
//! of 64-byte WRITEs and SENDs posted back to back leave in segments of
//! several whole FPDUs, none split, over a clean link and one that loses
//! frames each way, with payload copied into the frame or attached. Every
//! byte arrives where it belongs, every request completes once, and the
//! receiver never sees a segment end inside an FPDU. With the switch off,
//! every FPDU has a segment of its own. The bursts also hold the worker
//! to the verbs contract on receives: all 300 posted before the first
//! Send leaves must be in the queue pair when the Sends arrive, packed
//! 16 to a segment.

mod runtime_common;

use dataplane::api::{Access, DriveMode, RecvWr, SendWr, SgeList, WcOpcode, WcStatus};
use dataplane::link::MemLinkConfig;
use runtime_common::*;

/// Messages per burst and their size.
const N: usize = 300;
const LEN: usize = 64;

/// Posts `N` WRITEs and `N` SENDs of `LEN` bytes from a to b without
/// waiting, then checks every completion and every byte; returns the
/// bytes verified. Work request ids start at `base`.
fn burst(p: &Pair, a: &mut End, b: &mut End, base: u64) -> usize {
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let src = buffer(&p.a, a.pd, 2 * N * LEN, rw);
    let dst = buffer(&p.b, b.pd, 2 * N * LEN, rw);
    let data = src.fill_pattern(0x9ac4);
    dst.region.fill(4096, 2 * N * LEN, 0).unwrap();
    for k in 0..N {
        let off = (N + k) * LEN;
        b.qp.post_recv(&RecvWr {
            wr_id: base + 10_000 + k as u64,
            sges: SgeList::single(dst.mr.sge(off as u64, LEN as u32)),
        })
        .unwrap();
    }
    for k in 0..N {
        let off = (k * LEN) as u64;
        let wr = SendWr::write(
            base + k as u64,
            SgeList::single(src.mr.sge(off, LEN as u32)),
            dst.mr.addr() + off,
            dst.mr.rkey(),
        );
        post_when_room(p, a, &wr);
        let soff = ((N + k) * LEN) as u64;
        let wr = SendWr::send(
            base + 10_000 + k as u64,
            SgeList::single(src.mr.sge(soff, LEN as u32)),
        );
        post_when_room(p, a, &wr);
    }
    for k in base..base + N as u64 {
        let w = wait_wc(p, a, k);
        assert_eq!(
            (w.status, w.opcode),
            (WcStatus::Success, WcOpcode::RdmaWrite)
        );
        let s = wait_wc(p, a, 10_000 + k);
        assert_eq!((s.status, s.opcode), (WcStatus::Success, WcOpcode::Send));
        let r = wait_wc(p, b, 10_000 + k);
        assert_eq!(
            (r.status, r.opcode, r.byte_len),
            (WcStatus::Success, WcOpcode::Recv, LEN as u32)
        );
    }
    let got = dst.bytes();
    if let Some(i) = (0..got.len()).find(|&i| got[i] != data[i]) {
        panic!(
            "the messages' bytes differ from byte {i} (message {}): got {:?}, want {:?}",
            i / LEN,
            &got[i..(i + 16).min(got.len())],
            &data[i..(i + 16).min(got.len())]
        );
    }
    assert!(dst.guards_intact(), "wrote outside the span");
    p.a.dereg_mr(&src.mr).unwrap();
    p.b.dereg_mr(&dst.mr).unwrap();
    2 * N * LEN
}

/// Polls both ends until no setup traffic is left.
fn settle(p: &Pair) {
    for _ in 0..50 {
        p.a.poll();
        p.b.poll();
    }
}

/// Posts `n` WRITEs of `LEN` bytes from `src` to the same offsets of
/// `dst`, work request ids `0..n`, without waiting.
fn post_writes(a: &End, src: &Buf, dst: &Buf, n: usize) {
    for k in 0..n {
        let off = (k * LEN) as u64;
        let wr = SendWr::write(
            k as u64,
            SgeList::single(src.mr.sge(off, LEN as u32)),
            dst.mr.addr() + off,
            dst.mr.rkey(),
        );
        a.qp.post_send(&wr).unwrap();
    }
}

/// A connected pair with `n` WRITEs of `LEN` bytes ready to post from a's
/// `src` (filled with pattern `seed`) to b's `dst`, setup traffic settled.
struct Writes {
    p: Pair,
    a: End,
    b: End,
    src: Buf,
    dst: Buf,
    data: Vec<u8>,
    n: usize,
}

impl Writes {
    fn new(n: usize, seed: u64) -> Writes {
        let p = Pair::new(&PairOptions::default());
        let (a, b) = connect(&p);
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let src = buffer(&p.a, a.pd, n * LEN, rw);
        let dst = buffer(&p.b, b.pd, n * LEN, rw);
        let data = src.fill_pattern(seed);
        settle(&p);
        Writes {
            p,
            a,
            b,
            src,
            dst,
            data,
            n,
        }
    }

    /// Posts the WRITEs ([`post_writes`]).
    fn post(&self) {
        post_writes(&self.a, &self.src, &self.dst, self.n);
    }

    /// Waits for every WRITE's completion and checks every byte.
    fn finish(&mut self) {
        for k in 0..self.n as u64 {
            let w = wait_wc(&self.p, &mut self.a, k);
            assert_eq!(w.status, WcStatus::Success);
        }
        let len = self.n * LEN;
        assert_eq!(self.dst.bytes()[..len], self.data[..len]);
        self.b.drain();
    }
}

/// Posts `wr`, waiting for room in the send queue.
fn post_when_room(p: &Pair, a: &mut End, wr: &SendWr) {
    p.until("room in the send queue", |_| {
        a.drain();
        a.qp.post_send(wr).ok()
    });
}

#[test]
fn small_fpdus_are_packed_whole_with_and_without_loss() {
    for (loss, attach, pack) in [
        (0.0, true, true),
        (0.0, false, false),
        (0.0, false, true),
        (0.02, false, true),
        (0.02, true, true),
    ] {
        let o = PairOptions {
            link: MemLinkConfig {
                loss,
                seed: 0x9ac4,
                multi_seg_tx: attach,
                ..MemLinkConfig::default()
            },
            mode: DriveMode::Threads,
            static_arp: true,
            ..PairOptions::default()
        };
        let p = Pair::with_configs(&o, |c, _| c.tcp.pack_fpdus = pack);
        let (mut a, mut b) = connect(&p);
        let mut total = 0;
        for round in 0..3 {
            total += burst(&p, &mut a, &mut b, round * 100_000);
        }
        // Counters are published every millisecond.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (sa, sb) = (p.a.stats()[0], p.b.stats()[0]);
        let (segs, fpdus) = (sa.tx_packed_segments, sa.tx_packed_fpdus);
        let retransmits = sa.retransmits + sb.retransmits;
        println!(
            "loss {loss}, attach {attach}, pack {pack}: {total} bytes verified; {segs} packed \
             segments carried {fpdus} FPDUs; {} data segments received mid-FPDU; retransmits \
             {retransmits}",
            sb.rx_segments_mid_fpdu
        );
        if pack {
            assert!(segs > 20, "{segs} packed segments");
            assert!(fpdus >= 3 * segs, "{fpdus} FPDUs in {segs} segments");
        } else {
            assert_eq!((segs, fpdus), (0, 0), "packing is off");
        }
        assert_eq!(sb.rx_segments_mid_fpdu + sa.rx_segments_mid_fpdu, 0);
        assert_eq!(sa.terminates + sb.terminates, 0);
        if loss > 0.0 {
            assert!(retransmits > 0, "the link lost nothing?");
        }
    }
}

/// A connection builds its records as it sends them: one queued ahead of
/// its turn, then, at its turn, at most `MAX_SMALL_FPDUS_PER_POLL` small
/// ones at a time, each batch sent before the next is built. Once the
/// sender's window is filled with part of a run of small messages, what
/// is built and not sent is at most a batch or two, not the rest of the
/// run (which TCP would hold for as long as the window stays shut). The
/// connections' turns are `runtime_turns`.
#[test]
fn small_records_are_built_a_batch_at_a_time_as_they_are_sent() {
    let n = 400;
    // Everything settled: no setup traffic left in the iteration below.
    let mut w = Writes::new(n, 0x51ee);
    let p = &w.p;
    w.post();
    let fpdus = |p: &Pair| p.a.stats()[0].tx_packed_fpdus;
    let before = fpdus(p);
    // Only the sender runs: no acknowledgement opens its window, which
    // its first iterations fill.
    for _ in 0..10 {
        p.a.poll();
    }
    let sent = fpdus(p) - before;
    let built = p.a.stats()[0].tx_records;
    println!("{sent} small FPDUs sent in ten iterations, {built} records in flight");
    let cap = dataplane::worker::MAX_SMALL_FPDUS_PER_POLL as u64;
    // Counted in packed segments: a record that ends up alone in one is
    // not, hence the slack of one batch.
    assert!(
        sent >= cap,
        "{sent} FPDUs sent: not even one batch of {cap}"
    );
    assert!(
        sent < n as u64,
        "the whole run went out: the window did not shut, nothing to show"
    );
    assert!(
        built <= sent + 2 * cap,
        "{built} records built after {sent} were sent: built ahead of sending, \
         not {cap} at a time"
    );
    w.finish();
}

/// A receiver sends the ACKs a burst of segments earns before it places
/// the burst's payload: its iteration makes a TX pass for them right
/// after the receive. The sender's completions wait on those ACKs, so
/// for a run of small messages that pass is a placement sooner. A pure
/// sender, which receives only ACKs, owes none and makes no such pass.
#[test]
fn a_receiver_acknowledges_a_burst_before_placing_it() {
    let mut w = Writes::new(200, 0x7ac0);
    let p = &w.p;
    let passes = |p: &Pair| (p.a.stats()[0].tx_ack_passes, p.b.stats()[0].tx_ack_passes);
    let (a0, b0) = passes(p);
    w.post();
    // Several packed segments out, then one iteration of the receiver.
    for _ in 0..3 {
        p.a.poll();
    }
    let sent = p.a.stats()[0].tx_packed_segments;
    assert!(sent >= 2, "{sent} segments: not a burst");
    let tx_before = p.b.stats()[0].tx_packets;
    p.b.poll();
    let (_, b1) = passes(p);
    assert_eq!(
        b1,
        b0 + 1,
        "no TX pass for the burst's ACKs before its placement"
    );
    assert!(
        p.b.stats()[0].tx_packets > tx_before,
        "the receiver sent nothing for the burst"
    );
    w.finish();
    let (a2, _) = passes(&w.p);
    assert_eq!(a2, a0, "the sender received only ACKs and owed none");
}
