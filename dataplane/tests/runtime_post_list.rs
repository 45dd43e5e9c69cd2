//! Posting lists of work requests (`Qp::post_send_list`,
//! `Qp::post_recv_list`), as `ibv_post_send` and `ibv_post_recv` take a
//! chain: the requests go in order, a refused one stops the list and is
//! named by its index with the reason, the ones before it are posted and
//! complete, and unsignalled ones complete silently (a later signalled
//! completion covers them).

mod runtime_common;

use dataplane::api::{
    Access, PostError, RecvWr, SendFlags, SendOp, SendWr, Sge, SgeList, WcOpcode, WcStatus,
};
use runtime_common::*;

const LEN: usize = 64;
const N: usize = 40;

#[test]
fn lists_post_in_order_and_stop_at_the_first_refused() {
    let p = Pair::new(&PairOptions::default());
    let (mut a, mut b) = connect(&p);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let src = buffer(&p.a, a.pd, 2 * N * LEN, rw);
    let dst = buffer(&p.b, b.pd, 2 * N * LEN, rw);
    let data = src.fill_pattern(0x11);
    dst.region.fill(4096, 2 * N * LEN, 0).unwrap();

    // Receives for N Sends, as one list.
    let recvs: Vec<RecvWr> = (0..N)
        .map(|k| RecvWr {
            wr_id: 1000 + k as u64,
            sges: SgeList::single(dst.mr.sge(((N + k) * LEN) as u64, LEN as u32)),
        })
        .collect();
    b.qp.post_recv_list(&recvs).expect("receive list");

    // N WRITEs, only the last signalled, then N Sends, as one list.
    let mut wrs: Vec<SendWr> = (0..N)
        .map(|k| {
            let off = (k * LEN) as u64;
            let mut wr = SendWr::write(
                k as u64,
                SgeList::single(src.mr.sge(off, LEN as u32)),
                dst.mr.addr() + off,
                dst.mr.rkey(),
            );
            if k + 1 < N {
                wr.flags = SendFlags::NONE;
            }
            wr
        })
        .collect();
    wrs.extend((0..N).map(|k| {
        SendWr::send(
            1000 + k as u64,
            SgeList::single(src.mr.sge(((N + k) * LEN) as u64, LEN as u32)),
        )
    }));
    a.qp.post_send_list(&wrs).expect("send list");
    let w = wait_wc(&p, &mut a, N as u64 - 1);
    assert_eq!(
        (w.status, w.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    for k in 0..N as u64 {
        let s = wait_wc(&p, &mut a, 1000 + k);
        assert_eq!((s.status, s.opcode), (WcStatus::Success, WcOpcode::Send));
        let r = wait_wc(&p, &mut b, 1000 + k);
        assert_eq!(
            (r.status, r.opcode, r.byte_len),
            (WcStatus::Success, WcOpcode::Recv, LEN as u32)
        );
    }
    // The unsignalled WRITEs made no completion of their own.
    a.drain();
    for k in 0..N as u64 - 1 {
        assert!(!a.seen.contains_key(&k), "unsignalled WRITE {k} completed");
    }
    assert_eq!(dst.bytes(), data, "every byte where it belongs");

    // A bad request in the middle: the two before it go, it and the rest
    // do not.
    let good = |id: u64| {
        SendWr::write(
            id,
            SgeList::single(src.mr.sge(0, LEN as u32)),
            dst.mr.addr(),
            dst.mr.rkey(),
        )
    };
    let bad = SendWr {
        wr_id: 99,
        op: SendOp::RdmaRead {
            remote_addr: dst.mr.addr(),
            rkey: dst.mr.rkey(),
        },
        // A Read has exactly one SGE.
        sges: SgeList::empty(),
        flags: SendFlags::SIGNALED,
    };
    assert_eq!(
        a.qp.post_send_list(&[good(200), good(201), bad, good(202)]),
        Err((2, PostError::InvalidWr))
    );
    wait_wc(&p, &mut a, 200);
    wait_wc(&p, &mut a, 201);
    for _ in 0..200 {
        p.pump();
    }
    a.drain();
    assert!(!a.seen.contains_key(&99) && !a.seen.contains_key(&202));

    // A receive list longer than the queue: what fits goes in, the first
    // that does not is named.
    let sge = Sge {
        addr: dst.mr.addr(),
        length: LEN as u32,
        lkey: dst.mr.lkey(),
    };
    let many: Vec<RecvWr> = (0..600)
        .map(|k| RecvWr {
            wr_id: 5000 + k,
            sges: SgeList::single(sge),
        })
        .collect();
    match b.qp.post_recv_list(&many) {
        Err((k, PostError::QueueFull)) => assert!(k > 0 && k <= 512, "stopped at {k}"),
        other => panic!("expected a full queue, got {other:?}"),
    }
}
