//! Shared receive queues, fast registration, local invalidation and
//! remote invalidation through the application API, between two
//! dataplanes over an in-memory link, each with two workers — driven
//! inline (deterministic) and by worker threads.
//!
//! Every case opens two connections, one per worker, so that the work
//! request that changes an STag runs on one worker while the peer uses the
//! STag through the other: what is checked is that the STag replicas of
//! both workers agree (see the API's module documentation, "STags on
//! several workers").

mod runtime_common;

use std::net::SocketAddrV4;

use dataplane::api::{
    local_invalidate_wr, Access, CmEvent, ConnectParams, Cq, Dataplane, DriveMode, FastRegMr,
    ProtectionDomain, Qp, QpOptions, RecvWr, Region, SendFlags, SendOp, SendWr, SgeList, Srq, Stag,
    TerminateCause, WcOpcode, WcStatus, WorkCompletion,
};
use runtime_common::*;

const OPTS: QpOptions = QpOptions {
    max_send_wr: 64,
    max_recv_wr: 64,
    max_send_sge: 6,
    max_recv_sge: 6,
    max_ord: 16,
    max_ird: 16,
    sq_sig_all: false,
};

fn pair(mode: DriveMode) -> Pair {
    Pair::new(&PairOptions {
        workers: 2,
        mode,
        ..PairOptions::default()
    })
}

/// One side: a protection domain, one CQ for everything, and two queue
/// pairs (on `srq` if given).
struct Side {
    pd: ProtectionDomain,
    cq: Cq,
    qps: [Qp; 2],
}

impl Side {
    fn new(dp: &Dataplane, srq: impl Fn(ProtectionDomain) -> Option<Srq>) -> (Side, Option<Srq>) {
        let pd = dp.alloc_pd().unwrap();
        let cq = dp.create_cq(1024).unwrap();
        let srq = srq(pd);
        let qp = || {
            dp.create_qp_with_srq(pd, &cq, &cq, srq.as_ref(), OPTS)
                .unwrap()
        };
        let qps = [qp(), qp()];
        (Side { pd, cq, qps }, srq)
    }

    /// Waits for the completion of `wr_id` (other completions are kept in
    /// `seen`).
    fn wait(&self, p: &Pair, seen: &mut Vec<WorkCompletion>, wr_id: u64) -> WorkCompletion {
        p.until(&format!("completion {wr_id}"), |_| {
            while let Some(wc) = self.cq.poll_one() {
                seen.push(wc);
            }
            let i = seen.iter().position(|wc| wc.wr_id == wr_id)?;
            Some(seen.remove(i))
        })
    }
}

/// Connects b's queue pair `i` to a's queue pair `i`, for both; b is the
/// active side, so its two queue pairs go to its two workers in turn (the
/// passive side's land wherever the link steers them). The request names
/// its index in the private data. Returns the worker of each connection
/// on each side.
fn connect_both(p: &Pair, a: &Side, b: &Side) -> [(usize, usize); 2] {
    p.a.listen(PORT, 16).unwrap();
    for (i, qp) in b.qps.iter().enumerate() {
        let params = ConnectParams {
            private_data: vec![i as u8],
            ..ConnectParams::default()
        };
        p.b.connect(qp, SocketAddrV4::new(IP_A, PORT), &params)
            .unwrap();
    }
    let mut up = 0;
    p.until("both connections established", |p| {
        while let Some(e) = p.a.poll_event() {
            match e {
                CmEvent::ConnectRequest(req) => {
                    let i = usize::from(req.private_data[0]);
                    p.a.accept(&req, &a.qps[i], &ConnectParams::default())
                        .unwrap();
                }
                CmEvent::Established { .. } => up += 1,
                other => panic!("a: unexpected {other:?}"),
            }
        }
        while let Some(e) = p.b.poll_event() {
            match e {
                CmEvent::Established { .. } => up += 1,
                other => panic!("b: unexpected {other:?}"),
            }
        }
        (up == 4).then_some(())
    });
    let w = |qp: &Qp| qp.worker().expect("bound");
    let workers = [(w(&a.qps[0]), w(&b.qps[0])), (w(&a.qps[1]), w(&b.qps[1]))];
    assert_ne!(workers[0].1, workers[1].1, "b's queue pairs share a worker");
    workers
}

fn rw() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
}

// ---------------------------------------------------------------------
// Shared receive queue.
// ---------------------------------------------------------------------

const SLOT: usize = 8192;
/// Sends through the SRQ: the first 24 of up to 8 KiB, then 40 of a few
/// bytes that arrive many to a segment.
const MSGS: usize = 64;
/// The SRQ limit armed: the event fires when fewer receives are left.
const LIMIT: usize = 4;

fn srq_shared_by_two_qps(mode: DriveMode, label: &str) {
    let p = pair(mode);
    let (a, _) = Side::new(&p.a, |_| None);
    let (b, srq) = Side::new(&p.b, |pd| Some(p.b.create_srq(pd, MSGS as u32, 2).unwrap()));
    let srq = srq.unwrap();
    let workers = connect_both(&p, &a, &b);
    println!("{label}: connections on workers (a, b): {workers:?}");

    // A receive queue pair refuses its own receives.
    let none = RecvWr {
        wr_id: 0,
        sges: SgeList::empty(),
    };
    assert_eq!(
        b.qps[0].post_recv(&none),
        Err(dataplane::api::PostError::SrqAttached)
    );

    // b: one region cut in slots, one SRQ receive per slot (two SGEs each,
    // to check scatter), posted from two threads at once.
    let dst = Region::new(MSGS * SLOT).unwrap();
    dst.fill(0, dst.len(), 0xa5).unwrap();
    let dst_mr = p.b.reg_mr(b.pd, &dst, 0, dst.len(), rw()).unwrap();
    std::thread::scope(|s| {
        for half in 0..2 {
            let (srq, dst_mr) = (&srq, &dst_mr);
            s.spawn(move || {
                for i in (half..MSGS).step_by(2) {
                    let at = (i * SLOT) as u64;
                    let sges = SgeList::new(&[
                        dst_mr.sge(at, 100),
                        dst_mr.sge(at + 100, (SLOT - 100) as u32),
                    ])
                    .unwrap();
                    srq.post_recv(&RecvWr {
                        wr_id: i as u64,
                        sges,
                    })
                    .unwrap();
                }
            });
        }
    });
    assert_eq!(srq.len(), MSGS);
    assert_eq!(
        srq.post_recv(&none),
        Err(dataplane::api::PostError::QueueFull)
    );
    srq.arm_limit(LIMIT as u32);

    // a: MSGS Sends, alternating between the two connections; message k
    // is `len(k)` bytes of pattern k.
    let src = Region::new(MSGS * SLOT).unwrap();
    let src_mr = p.a.reg_mr(a.pd, &src, 0, src.len(), rw()).unwrap();
    let len = |k: usize| {
        if k < 24 {
            1 + (k * 977) % (SLOT - 1)
        } else {
            4 + k - 24
        }
    };
    // Every message has its own length: the receiver tells them apart by it.
    let mut lens: Vec<usize> = (0..MSGS).map(len).collect();
    lens.sort_unstable();
    lens.dedup();
    assert_eq!(lens.len(), MSGS);
    for k in 0..MSGS {
        src.write(k * SLOT, &pattern(k as u64, len(k))).unwrap();
    }
    // Sent in three rounds, each until b has completed its receives: down
    // to LIMIT receives left the event has not fired; the one receive
    // that leaves fewer than LIMIT fires it; the rest find it disarmed.
    let mut sent = 0;
    let mut seen = Vec::new();
    let mut recvs = Vec::new();
    let mut send_round = |ks: std::ops::Range<usize>| {
        for k in ks.clone() {
            let wr = SendWr::send(
                1000 + k as u64,
                SgeList::single(src_mr.sge((k * SLOT) as u64, len(k) as u32)),
            );
            a.qps[k % 2].post_send(&wr).unwrap();
            sent += len(k);
        }
        for k in ks.clone() {
            let wc = a.wait(&p, &mut seen, 1000 + k as u64);
            assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Send));
        }
        p.until("the round's SRQ receives", |_| {
            while let Some(wc) = b.cq.poll_one() {
                recvs.push(wc);
            }
            (recvs.len() >= ks.end).then_some(())
        });
    };
    send_round(0..MSGS - LIMIT);
    assert_eq!(srq.len(), LIMIT);
    assert!(
        !srq.limit_reached(),
        "{LIMIT} receives left, limit {LIMIT}: not reached yet"
    );
    send_round(MSGS - LIMIT..MSGS - LIMIT + 1);
    assert_eq!(srq.len(), LIMIT - 1);
    assert!(
        srq.limit_reached(),
        "{} receives left, limit {LIMIT}: reached",
        LIMIT - 1
    );
    send_round(MSGS - LIMIT + 1..MSGS);

    // b: every receive completes once, on the queue pair the message came
    // through, with its bytes in the slot of the receive that took it.
    let mut slots_used = [false; MSGS];
    let mut msgs_seen = [false; MSGS];
    let mut per_qp = [0usize; 2];
    let mut verified = 0;
    for wc in &recvs {
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
        let slot = wc.wr_id as usize;
        assert!(!slots_used[slot], "receive {slot} completed twice");
        slots_used[slot] = true;
        let q = b
            .qps
            .iter()
            .position(|q| q.num() == wc.qp_num)
            .expect("our qp");
        per_qp[q] += 1;
        // Which message: the one of this connection's sequence whose
        // length and pattern match.
        let got = dst.to_vec(slot * SLOT, wc.byte_len as usize).unwrap();
        let k = (0..MSGS)
            .filter(|k| k % 2 == q && len(*k) == wc.byte_len as usize)
            .find(|&k| got == pattern(k as u64, len(k)))
            .unwrap_or_else(|| panic!("slot {slot}: bytes of no message sent on qp {q}"));
        assert!(!msgs_seen[k], "message {k} received twice");
        msgs_seen[k] = true;
        // Nothing written past the message.
        let tail = dst.to_vec(slot * SLOT + len(k), SLOT - len(k)).unwrap();
        assert!(
            tail.iter().all(|&x| x == 0xa5),
            "slot {slot}: written past the end"
        );
        verified += got.len();
    }
    assert_eq!(per_qp, [MSGS / 2, MSGS / 2]);
    assert_eq!(verified, sent);
    assert!(srq.is_empty());
    assert!(
        !srq.limit_reached(),
        "the limit fired once, then disarmed itself"
    );
    println!(
        "{label}: SRQ shared by two queue pairs on workers {} and {}: {MSGS} Sends \
         ({} per queue pair) landed in {MSGS} distinct SRQ buffers, {verified} bytes verified, \
         limit event seen",
        workers[0].1, workers[1].1, per_qp[0]
    );
}

#[test]
fn srq_inline_two_workers() {
    srq_shared_by_two_qps(DriveMode::Inline, "srq/inline");
}

#[test]
fn srq_threads_two_workers() {
    srq_shared_by_two_qps(DriveMode::Threads, "srq/threads");
}

// ---------------------------------------------------------------------
// Fast registration and invalidation.
// ---------------------------------------------------------------------

const FR_LEN: usize = 16 * 1024;
const FR_OFF: usize = 4096;
const KEY: u8 = 0x5a;

/// b's fast-register region over a region with guard bytes around the
/// bound part.
struct Target {
    region: Region,
    fr: FastRegMr,
}

impl Target {
    fn new(dp: &Dataplane, pd: ProtectionDomain) -> Target {
        let region = Region::new(FR_OFF + FR_LEN + 4096).unwrap();
        region.fill(0, region.len(), 0xa5).unwrap();
        let fr = dp.alloc_mr(pd, &region, FR_LEN as u64).unwrap();
        Target { region, fr }
    }

    fn addr(&self) -> u64 {
        self.region.addr() + FR_OFF as u64
    }

    fn guards_intact(&self) -> bool {
        let before = self.region.to_vec(0, FR_OFF).unwrap();
        let after = self.region.to_vec(FR_OFF + FR_LEN, 4096).unwrap();
        before.iter().chain(after.iter()).all(|&x| x == 0xa5)
    }
}

/// b fast-registers `t` through its queue pair `qp` and waits for the
/// completion.
fn fast_register(p: &Pair, b: &Side, qp: usize, t: &Target, seen: &mut Vec<WorkCompletion>) {
    let wr = t.fr.fast_reg_wr(7, KEY, FR_OFF, FR_LEN, rw()).unwrap();
    b.qps[qp].post_send(&wr).unwrap();
    let wc = b.wait(p, seen, 7);
    assert_eq!(
        (wc.status, wc.opcode, wc.qp_num),
        (WcStatus::Success, WcOpcode::FastRegister, b.qps[qp].num()),
        "{wc:?}"
    );
}

/// a writes `data` through `qp` into the fast-registered STag.
fn write(p: &Pair, a: &Side, qp: usize, src: &Buf, t: &Target, stag: Stag, id: u64) -> WcStatus {
    let wr = SendWr::write(
        id,
        SgeList::single(src.mr.sge(0, FR_LEN as u32)),
        t.addr(),
        stag,
    );
    a.qps[qp].post_send(&wr).unwrap();
    a.wait(p, &mut Vec::new(), id).status
}

/// a reads the fast-registered STag through `qp` into `sink`.
fn read(p: &Pair, a: &Side, qp: usize, sink: &Buf, t: &Target, stag: Stag, id: u64) -> WcStatus {
    let wr = SendWr::read(id, sink.mr.sge(0, FR_LEN as u32), t.addr(), stag);
    a.qps[qp].post_send(&wr).unwrap();
    a.wait(p, &mut Vec::new(), id).status
}

fn fast_register_then_invalidate(mode: DriveMode, label: &str) {
    let p = pair(mode);
    let (a, _) = Side::new(&p.a, |_| None);
    let (b, _) = Side::new(&p.b, |_| None);
    let workers = connect_both(&p, &a, &b);
    let t = Target::new(&p.b, b.pd);
    let src = buffer(&p.a, a.pd, FR_LEN, rw());
    let sink = buffer(&p.a, a.pd, FR_LEN, rw());
    let stag = t.fr.stag_with_key(KEY);
    let mut seen = Vec::new();

    // Fast registration on b's queue pair 0.
    fast_register(&p, &b, 0, &t, &mut seen);

    // a writes through connection 1: b's other worker.
    let data = src.fill_pattern(11);
    assert_eq!(write(&p, &a, 1, &src, &t, stag, 100), WcStatus::Success);
    wait_placed(
        &p,
        "the Write through the fast-registered STag",
        &data,
        || t.region.to_vec(FR_OFF, FR_LEN).unwrap(),
    );
    let placed = t.region.to_vec(FR_OFF, FR_LEN).unwrap();
    assert!(placed == data, "Write through the fast-registered STag");
    assert!(t.guards_intact());
    // ... and reads back through connection 0 after b changes the bytes.
    let fresh = pattern(12, FR_LEN);
    t.region.write(FR_OFF, &fresh).unwrap();
    assert_eq!(read(&p, &a, 0, &sink, &t, stag, 101), WcStatus::Success);
    assert!(
        sink.bytes() == fresh,
        "Read through the fast-registered STag"
    );
    println!(
        "{label}: fast-registered STag {stag} on b's worker {}; RDMA Write of {FR_LEN} B \
         through b's worker {} and Read of {FR_LEN} B through worker {}: bytes verified",
        workers[0].1, workers[1].1, workers[0].1
    );

    // Local invalidation on b's queue pair 0, unsignalled, then a
    // signalled request behind it: its completion means the invalidation
    // reached every worker.
    let inv = SendWr {
        flags: SendFlags::NONE,
        ..local_invalidate_wr(8, stag)
    };
    b.qps[0].post_send(&inv).unwrap();
    let again = local_invalidate_wr(9, stag);
    b.qps[0].post_send(&again).unwrap();
    let wc = b.wait(&p, &mut seen, 9);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::LocalInvalidate)
    );
    assert!(
        seen.iter().all(|wc| wc.wr_id != 8),
        "unsignalled: no completion"
    );

    // The old STag through the other worker: a Write is refused with DDP's
    // Terminate, nothing placed.
    let before = t.region.to_vec(0, t.region.len()).unwrap();
    src.fill_pattern(13);
    // (A Write completes when TCP has it acknowledged: the Terminate may
    // come after its completion.)
    let st = write(&p, &a, 1, &src, &t, stag, 102);
    assert!(
        matches!(st, WcStatus::Success | WcStatus::RemoteAccessError),
        "{st:?}"
    );
    expect_terminated(
        &p,
        [a.qps[1].num(), b.qps[1].num()],
        TerminateCause::DDP_TAGGED_INVALID_STAG,
    );
    assert!(
        t.region.to_vec(0, t.region.len()).unwrap() == before,
        "memory changed"
    );
    // A Read through the worker that invalidated it: RDMAP's Terminate.
    let st = read(&p, &a, 0, &sink, &t, stag, 103);
    assert_eq!(st, WcStatus::RemoteAccessError);
    expect_terminated(
        &p,
        [a.qps[0].num(), b.qps[0].num()],
        TerminateCause::RDMAP_PROT_INVALID_STAG,
    );
    println!(
        "{label}: after LocalInvalidate on b's worker {}: Write with the old STag through \
         worker {} -> Terminate (DDP invalid STag) on both sides, Read through worker {} -> \
         RemoteAccessError and Terminate (RDMAP invalid STag) on both sides; {} bytes of \
         b's region unchanged",
        workers[0].1,
        workers[1].1,
        workers[0].1,
        before.len()
    );
}

#[test]
fn fast_register_invalidate_inline_two_workers() {
    fast_register_then_invalidate(DriveMode::Inline, "fr/inline");
}

#[test]
fn fast_register_invalidate_threads_two_workers() {
    fast_register_then_invalidate(DriveMode::Threads, "fr/threads");
}

fn send_with_invalidate(mode: DriveMode, label: &str) {
    let p = pair(mode);
    let (a, _) = Side::new(&p.a, |_| None);
    let (b, _) = Side::new(&p.b, |_| None);
    let workers = connect_both(&p, &a, &b);
    let t = Target::new(&p.b, b.pd);
    let src = buffer(&p.a, a.pd, FR_LEN, rw());
    let stag = t.fr.stag_with_key(KEY);
    let mut seen = Vec::new();
    fast_register(&p, &b, 0, &t, &mut seen);
    src.fill_pattern(21);
    assert_eq!(write(&p, &a, 0, &src, &t, stag, 200), WcStatus::Success);

    // a's Send with Invalidate arrives on b's queue pair 1 (the other
    // worker): its receive reports the STag invalidated.
    let rbuf = buffer(&p.b, b.pd, 64, rw());
    b.qps[1]
        .post_recv(&RecvWr {
            wr_id: 300,
            sges: SgeList::single(rbuf.mr.sge(0, 64)),
        })
        .unwrap();
    let msg = SendWr {
        op: SendOp::SendWithInvalidate { invalidate: stag },
        ..SendWr::send(201, SgeList::single(src.mr.sge(0, 64)))
    };
    a.qps[1].post_send(&msg).unwrap();
    assert_eq!(a.wait(&p, &mut Vec::new(), 201).status, WcStatus::Success);
    let wc = b.wait(&p, &mut seen, 300);
    assert_eq!(
        (
            wc.status,
            wc.opcode,
            wc.byte_len,
            wc.invalidated_stag,
            wc.qp_num
        ),
        (
            WcStatus::Success,
            WcOpcode::Recv,
            64,
            Some(stag),
            b.qps[1].num()
        )
    );
    assert!(rbuf.bytes() == src.bytes()[..64], "Send payload");

    // The STag is dead on the worker that registered it too.
    let before = t.region.to_vec(0, t.region.len()).unwrap();
    src.fill_pattern(22);
    let st = write(&p, &a, 0, &src, &t, stag, 202);
    assert!(
        matches!(st, WcStatus::Success | WcStatus::RemoteAccessError),
        "{st:?}"
    );
    expect_terminated(
        &p,
        [a.qps[0].num(), b.qps[0].num()],
        TerminateCause::DDP_TAGGED_INVALID_STAG,
    );
    assert!(
        t.region.to_vec(0, t.region.len()).unwrap() == before,
        "memory changed"
    );
    println!(
        "{label}: Send with Invalidate of {stag} through b's worker {} completed its receive \
         with the STag reported; a Write through b's worker {} (where it was registered) then \
         ended in a Terminate (DDP invalid STag), {} bytes of b's region unchanged",
        workers[1].1,
        workers[0].1,
        before.len()
    );
}

#[test]
fn send_with_invalidate_inline_two_workers() {
    send_with_invalidate(DriveMode::Inline, "inv/inline");
}

#[test]
fn send_with_invalidate_threads_two_workers() {
    send_with_invalidate(DriveMode::Threads, "inv/threads");
}

/// The queue-pair limit counts the queue pairs alive, not those ever
/// made; numbers are not given twice while in use; snapshots list the
/// live ones in order of creation.
#[test]
fn queue_pair_limit_counts_the_live_ones() {
    let p = Pair::with_configs(&PairOptions::default(), |c, _| c.limits.max_qp = 3);
    let dp = &p.a;
    let pd = dp.alloc_pd().unwrap();
    let cq = dp.create_cq(64).unwrap();
    let make = || dp.create_qp_with_srq(pd, &cq, &cq, None, OPTS);
    let mut held: Vec<Qp> = (0..3).map(|_| make().unwrap()).collect();
    assert!(matches!(
        make(),
        Err(dataplane::api::Error::Verbs(
            rdmap::verbs::VerbsError::TableFull
        ))
    ));
    // Many made and dropped one at a time: the limit never bites, and no
    // number is given twice while its queue pair lives.
    for _ in 0..50 {
        let gone = held.remove(1);
        let gone_qpn = gone.num();
        drop(gone);
        let q = make().expect("room again once one is gone");
        assert!(held.iter().all(|h| h.num() != q.num()));
        assert_ne!(
            q.num(),
            gone_qpn,
            "numbers are not reused while the counter lasts"
        );
        held.push(q);
    }
    let snap: Vec<_> = dp.qp_snapshots().iter().map(|s| s.qpn).collect();
    let mut want: Vec<_> = held.iter().map(Qp::num).collect();
    want.sort_by_key(|q| q.0);
    assert_eq!(snap, want);
}
