//! Two workers per dataplane over a two-queue `net_ring` pair (queue `q`
//! of one port feeds queue `q` of the other; the port does not steer, so
//! frames reaching a worker that does not own their connection go to the
//! owner through the software dispatcher, counted): WRITE, READ and SEND
//! verified byte for byte, each worker thread registered as an EAL lcore;
//! then nothing left in the EAL runtime directory.
//!
//! Which worker owns a connection on each side follows from the active
//! side's ephemeral port, which starts from a random cursor: only a
//! connection whose two owners have different indices sends frames that
//! land on a non-owning queue. The test opens connections until it has
//! one like that, so that the dispatcher is exercised on every run.

mod dpdk_common;
mod runtime_common;

use std::net::SocketAddrV4;

use dataplane::api::{CmEvent, ConnectParams};
use dataplane::steer::Rss;
use dpdk_common::*;
use runtime_common::*;

/// Attempts at a connection whose owners differ; each succeeds about
/// half the time (the passive owner is the dispatcher's hash of a port
/// picked only for the active side's hash).
const ATTEMPTS: usize = 40;

/// Opens connections from `a` until one is owned by worker `i` on one
/// side and `1 - i` on the other; returns its ends, and the others
/// (kept open until the end, idle).
fn connect_across(p: &Pair) -> ((End, End), Vec<(End, End)>) {
    p.b.listen(PORT, 16).unwrap();
    let rss = Rss::round_robin(2);
    let mut same = Vec::new();
    for _ in 0..ATTEMPTS {
        let (ea, eb) = (End::new(&p.a), End::new(&p.b));
        p.a.connect(
            &ea.qp,
            SocketAddrV4::new(IP_B, PORT),
            &ConnectParams::default(),
        )
        .unwrap();
        let mut owners = None;
        let mut up = (false, false);
        p.until("both ends established", |p| {
            while let Some(e) = p.b.poll_event() {
                match e {
                    CmEvent::ConnectRequest(req) => {
                        // Replies from b reach a on the queue a's owner
                        // picked the port for; b owns what its SYN hashed to.
                        let port = req.remote.port();
                        let on_a = usize::from(rss.queue_for(IP_B, IP_A, PORT, port));
                        assert_eq!(
                            usize::from(rss.queue_for(IP_A, IP_B, port, PORT)),
                            req.worker(),
                            "b's owner is the dispatcher's hash of the SYN"
                        );
                        owners = Some((on_a, req.worker()));
                        p.b.accept(&req, &eb.qp, &ConnectParams::default()).unwrap();
                    }
                    CmEvent::Established { qp, .. } => {
                        assert_eq!(qp, eb.qp.num());
                        up.1 = true;
                    }
                    other => panic!("b: unexpected {other:?}"),
                }
            }
            while let Some(e) = p.a.poll_event() {
                match e {
                    CmEvent::Established { qp, .. } => {
                        assert_eq!(qp, ea.qp.num());
                        up.0 = true;
                    }
                    other => panic!("a: unexpected {other:?}"),
                }
            }
            (up.0 && up.1).then_some(())
        });
        let (on_a, on_b) = owners.expect("b saw the request");
        println!("connection owned by worker {on_a} on a, {on_b} on b");
        if on_a != on_b {
            return ((ea, eb), same);
        }
        same.push((ea, eb));
    }
    panic!("{ATTEMPTS} connections, each owned by workers of the same index on both sides");
}

#[test]
fn two_workers_each_over_a_two_queue_ring_pair() {
    let (guard, eal) = start("dpdk-ring-workers", 256);
    {
        let (p, _, _) = ring_pair(&eal, 1500, 2);
        let ((mut a, mut b), _others) = connect_across(&p);
        for (i, op) in [Op::Write, Op::Read, Op::Send].into_iter().enumerate() {
            for (j, len) in [1usize, 100_003, 1 << 20].into_iter().enumerate() {
                let n = exchange(&p, &mut a, &mut b, op, len, (10 * i + j) as u64 + 1);
                println!("net_ring, 2 workers: {op:?} {len} B: {n} bytes verified");
            }
        }
        println!("a: {:?}", p.a.stats());
        // Each worker thread is an EAL lcore of its own (the mempool
        // caches and DPDK's per-lcore state depend on it), none the main
        // thread's.
        let lcores: Vec<u32> =
            p.a.stats()
                .into_iter()
                .chain(p.b.stats())
                .map(|w| w.lcore.expect("a worker thread that is not an EAL lcore"))
                .collect();
        println!("worker lcores (a, then b): {lcores:?}");
        assert_eq!(lcores.len(), 4);
        let mut distinct = lcores.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "workers share an lcore: {lcores:?}");
        assert!(
            !lcores.contains(&eal.main_lcore()),
            "a worker runs as the main lcore {}: {lcores:?}",
            eal.main_lcore()
        );
        // Each worker names its own thread, one of this process's, so
        // that its CPU time can be read (the demo's per-byte figures).
        let tids: Vec<u32> =
            p.a.stats()
                .into_iter()
                .chain(p.b.stats())
                .map(|w| w.thread_id.expect("a worker thread without its thread id"))
                .collect();
        let mut distinct = tids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "workers share a thread id: {tids:?}");
        for t in &tids {
            let stat = std::path::Path::new("/proc/self/task")
                .join(t.to_string())
                .join("stat");
            assert!(stat.exists(), "thread {t} is not one of this process's");
        }
        // net_ring does not steer (no RSS): replies reach whichever queue
        // the peer's owning worker sent them on, and the software
        // dispatcher hands them to the worker that owns the connection.
        let counts = || {
            let all: Vec<_> = p.a.stats().into_iter().chain(p.b.stats()).collect();
            let sum =
                |f: fn(&dataplane::worker::WorkerStats) -> u64| -> u64 { all.iter().map(f).sum() };
            (
                sum(|w| w.dispatched_out),
                sum(|w| w.dispatched_in),
                sum(|w| w.dispatch_drops),
            )
        };
        // The last frames (ACKs) may still sit in a ring for a moment
        // (longer on a loaded machine).
        p.until("dispatch rings drained", |_| {
            let (out, taken, _) = counts();
            (out == taken).then_some(())
        });
        let (out, taken, dropped) = counts();
        println!("net_ring, 2 workers: {out} frames handed to their owner, {taken} taken, {dropped} dropped");
        assert!(out > 0, "nothing dispatched");
        assert_eq!(out, taken);
        assert_eq!(dropped, 0);
        p.a.disconnect(&a.qp, true).unwrap();
        drop(p);
    }
    drop(eal);
    assert_clean(&guard);
}
