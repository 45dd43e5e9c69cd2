//! Busy polling (`Dataplane::busy_poll`): an application thread takes its
//! dataplane's worker from the worker thread and drives it itself. While
//! it holds the worker, nothing moves unless it polls; control calls from
//! that thread fail with a clear error instead of hanging, and other
//! threads' control calls are answered by its polls. When it lets go, the
//! worker thread serves the connection again: a side that ends a
//! ping-pong first and drops its `BusyPoll` still acknowledges the peer's
//! last message, so the peer's final Send completes.

mod runtime_common;

use std::time::{Duration, Instant};

use dataplane::api::{
    Access, BusyPoll, DriveMode, Error, RecvWr, SendWr, SgeList, WcOpcode, WcStatus, WorkCompletion,
};
use runtime_common::*;

/// Round trips of the ping-pong and the message size.
const ROUNDS: u64 = 200;
const LEN: usize = 64;

/// Polls `bp` until a completion arrives on `end`'s CQ; fails the test
/// after [`PATIENCE`].
fn next_wc(bp: &mut BusyPoll<'_>, end: &End) -> WorkCompletion {
    let start = Instant::now();
    loop {
        if let Some(wc) = end.cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            return wc;
        }
        assert!(start.elapsed() < PATIENCE, "no completion");
        bp.poll();
    }
}

/// Posts the [`ROUNDS`] receives of a ping-pong on `end`, before either
/// side starts: a peer's message may come before this side sees its own
/// Send complete.
fn post_receives(end: &End, buf: &Buf) {
    for k in 0..ROUNDS {
        end.qp
            .post_recv(&RecvWr {
                wr_id: 1_000_000 + k,
                sges: SgeList::single(buf.mr.sge(LEN as u64, LEN as u32)),
            })
            .unwrap();
    }
}

/// One side of a Send ping-pong of [`ROUNDS`] round trips, driving its
/// worker itself, its receives posted. `first` sends first. Returns once
/// its own last message is done: the side that sends first ends on its
/// last receive, the other on its last Send's completion.
fn ping_pong(dp: &dataplane::api::Dataplane, end: &End, buf: &Buf, first: bool) {
    let send = |k: u64| SendWr::send(k, SgeList::single(buf.mr.sge(0, LEN as u32)));
    let mut bp = dp.busy_poll().expect("busy poll");
    assert_eq!(bp.workers(), 1);
    for k in 0..ROUNDS {
        if first {
            end.qp.post_send(&send(k)).unwrap();
        }
        // Both the receive and (for the first side) the Send complete;
        // the second side answers once the message is in.
        let mut got_recv = false;
        let mut got_send = !first;
        while !(got_recv && got_send) {
            let wc = next_wc(&mut bp, end);
            match wc.opcode {
                WcOpcode::Recv => {
                    assert_eq!((wc.wr_id, wc.byte_len), (1_000_000 + k, LEN as u32));
                    got_recv = true;
                    if !first {
                        end.qp.post_send(&send(k)).unwrap();
                        got_send = false;
                    }
                }
                WcOpcode::Send => {
                    assert_eq!(wc.wr_id, k);
                    got_send = true;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

/// Two dataplanes with worker threads, connected, and a buffer of `len`
/// bytes registered on each end.
fn connected_threads(len: usize) -> (Pair, End, End, Buf, Buf) {
    let o = PairOptions {
        mode: DriveMode::Threads,
        static_arp: true,
        ..PairOptions::default()
    };
    let p = Pair::new(&o);
    let (a, b) = connect(&p);
    let rw = Access::LOCAL_WRITE;
    let (ba, bb) = (buffer(&p.a, a.pd, len, rw), buffer(&p.b, b.pd, len, rw));
    (p, a, b, ba, bb)
}

#[test]
fn a_side_that_ends_first_still_serves_its_peer() {
    let (p, a, b, ba, bb) = connected_threads(2 * LEN);
    for _ in 0..3 {
        post_receives(&a, &ba);
        post_receives(&b, &bb);
        std::thread::scope(|s| {
            let other = s.spawn(|| ping_pong(&p.b, &b, &bb, false));
            ping_pong(&p.a, &a, &ba, true);
            // a has let go of its worker: the worker thread acknowledges
            // b's last Send, which then completes on b.
            other.join().expect("the second side");
        });
    }
    // And the worker threads carry on as before.
    let (mut a, mut b) = (a, b);
    let n = exchange(&p, &mut a, &mut b, Op::Send, 4096, 77);
    assert_eq!(n, 4096);
}

#[test]
fn only_the_polling_thread_moves_the_worker_while_it_holds_it() {
    let (p, a, b, ba, bb) = connected_threads(LEN);
    let rw = Access::LOCAL_WRITE;
    b.qp.post_recv(&RecvWr {
        wr_id: 5,
        sges: SgeList::single(bb.mr.sge(0, LEN as u32)),
    })
    .unwrap();
    let mut bp = p.a.busy_poll().expect("busy poll");
    // The same thread twice would wait for itself.
    assert_eq!(
        p.a.busy_poll().err(),
        Some(Error::InvalidArgument(
            "this thread busy-polls the dataplane already"
        ))
    );
    // A control call from this thread is refused at once.
    let t = Instant::now();
    assert_eq!(
        p.a.reg_mr(a.pd, &ba.region, 0, LEN, rw).err(),
        Some(Error::BusyPolling)
    );
    assert!(t.elapsed() < Duration::from_secs(1));
    // Posted, not polled: nothing leaves while a's worker is held here
    // (its thread would have sent it within microseconds).
    a.qp.post_send(&SendWr::send(6, SgeList::single(ba.mr.sge(0, LEN as u32))))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(b.cq.poll_one().is_none(), "the message left unpolled");
    // Another thread's control call is answered by this thread's polls.
    std::thread::scope(|s| {
        let other = s.spawn(|| p.a.reg_mr(a.pd, &ba.region, 0, LEN, rw).map(|_| ()));
        while !other.is_finished() {
            bp.poll();
        }
        other.join().unwrap().expect("reg_mr from another thread");
    });
    let wc = next_wc(&mut bp, &a);
    assert_eq!((wc.wr_id, wc.opcode), (6, WcOpcode::Send));
    drop(bp);
    // Given back: the worker thread runs it, and control calls work.
    p.a.reg_mr(a.pd, &ba.region, 0, LEN, rw)
        .expect("reg_mr after");
    let start = Instant::now();
    let wc = loop {
        if let Some(wc) = b.cq.poll_one() {
            break wc;
        }
        assert!(start.elapsed() < PATIENCE);
        std::thread::yield_now();
    };
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len),
        (5, WcOpcode::Recv, LEN as u32)
    );
}
