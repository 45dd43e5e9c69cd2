//! Random interleavings of posting, engine progress (taking work,
//! transmitting, TCP acknowledgements, Read Responses, failures) and error
//! transitions on one queue pair. Whatever happens, completions come out in
//! send-queue order, each signalled request exactly once, unsignalled ones
//! only when they fail; no Send or Write succeeds before its last byte was
//! acknowledged, no Read before its Response; after the first failure
//! everything flushes; and at the end nothing is left behind.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rdmap::placement::VecMemory;
use rdmap::verbs::{
    Access, Device, DeviceLimits, QpInitAttr, QpModify, QpState, SendFlags, SendOp, SendWr, Sge,
    SgeList, Stag, WcOpcode, WcStatus, WireOp,
};

#[derive(Clone, Debug)]
enum Step {
    Post {
        kind: u8,
        len: u32,
        signalled: bool,
        bad: bool,
        fence: bool,
    },
    Take,
    Ack {
        back: u64,
    },
    /// Acknowledge up to exactly the next unacknowledged end, or one byte
    /// short of it: where off-by-one errors live.
    AckEdge {
        short: bool,
    },
    ReadResponse {
        ok: bool,
    },
    EngineFails,
    Error,
    Deliver,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..3, 0u32..5000, any::<bool>(), prop::bool::weighted(0.05), prop::bool::weighted(0.1))
            .prop_map(|(kind, len, signalled, bad, fence)| Step::Post { kind, len, signalled, bad, fence }),
        4 => Just(Step::Take),
        3 => (0u64..3000).prop_map(|back| Step::Ack { back }),
        2 => any::<bool>().prop_map(|short| Step::AckEdge { short }),
        2 => prop::bool::weighted(0.95).prop_map(|ok| Step::ReadResponse { ok }),
        1 => Just(Step::EngineFails),
        1 => Just(Step::Error),
        3 => Just(Step::Deliver),
    ]
}

#[derive(Clone, Copy, Debug)]
struct Posted {
    is_read: bool,
    signalled: bool,
    bad: bool,
    fence: bool,
    end: Option<u64>,
    read_done: Option<WcStatus>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn completions_keep_the_promises(
        steps in prop::collection::vec(step(), 1..150),
        ord in 0u32..4,
    ) {
        let mut dev = Device::new(DeviceLimits { max_mr: 4, ..DeviceLimits::default() });
        let mut mem = VecMemory::new();
        let region = mem.add_region(8192);
        let pd = dev.alloc_pd().unwrap();
        let mut cq = dev.create_cq(4096).unwrap();
        let stag = dev.reg_mr(pd, mem.whole(region).unwrap(), 0, Access::LOCAL_WRITE).unwrap();
        let mut qp = dev.create_qp(QpInitAttr {
            pd, send_cq: cq.id(), recv_cq: cq.id(), srq: None,
            max_send_wr: 32, max_recv_wr: 0, max_send_sge: 2, max_recv_sge: 0,
            max_ord: 4, max_ird: 0, sq_sig_all: false,
        }).unwrap();
        qp.modify_qp(QpModify { state: Some(QpState::Rts), ord: Some(ord), ird: None }).unwrap();

        let mut posted: Vec<Posted> = Vec::new();
        let mut offset = 0u64;
        let mut acked = 0u64;
        let mut taken: Vec<u64> = Vec::new();
        let mut delivered: Vec<(u64, WcStatus, WcOpcode)> = Vec::new();
        let mut outstanding_reads: Vec<u64> = Vec::new();

        let check_delivery = |cq: &mut rdmap::verbs::CompletionQueue,
                                  posted: &[Posted],
                                  acked: u64,
                                  delivered: &mut Vec<(u64, WcStatus, WcOpcode)>|
         -> Result<(), TestCaseError> {
            while let Some(wc) = cq.poll_one() {
                let p = posted[wc.wr_id as usize];
                if let Some(&(last, _, _)) = delivered.last() {
                    prop_assert!(wc.wr_id > last, "order: {} after {}", wc.wr_id, last);
                }
                prop_assert!(p.signalled || wc.status != WcStatus::Success, "unsignalled success reported");
                if wc.status == WcStatus::Success {
                    prop_assert!(!p.bad);
                    if p.is_read {
                        prop_assert_eq!(p.read_done, Some(WcStatus::Success));
                    } else {
                        prop_assert!(p.end.is_some_and(|e| e <= acked), "completed before acknowledged");
                    }
                }
                if delivered.iter().any(|d| d.1 != WcStatus::Success) {
                    prop_assert_eq!(wc.status, WcStatus::WrFlushError, "not flushed after a failure");
                }
                delivered.push((wc.wr_id, wc.status, wc.opcode));
            }
            Ok(())
        };

        for s in steps {
            match s {
                Step::Post { kind, len, signalled, bad, fence } => {
                    // A zero-length SGE names no memory: its key is not
                    // checked (as Linux siw skips it), so a bad key there
                    // is no failure.
                    let bad = bad && len.min(4096) > 0;
                    let wr_id = posted.len() as u64;
                    let lkey = if bad { Stag(stag.0 ^ 0x80) } else { stag };
                    let sge = Sge { addr: u64::from(len % 4096), length: len.min(4096), lkey };
                    let mut flags = if signalled { SendFlags::SIGNALED } else { SendFlags::NONE };
                    if fence {
                        flags = flags | SendFlags::FENCE;
                    }
                    let op = match kind {
                        0 => SendOp::Send,
                        1 => SendOp::RdmaWrite { remote_addr: 0, rkey: Stag(0x100) },
                        _ => SendOp::RdmaRead { remote_addr: 0, rkey: Stag(0x100) },
                    };
                    let wr = SendWr { wr_id, op, sges: SgeList::single(sge), flags };
                    if qp.post_send(&wr, dev.mrs()).is_ok() {
                        posted.push(Posted { is_read: kind == 2, signalled, bad, fence, end: None, read_done: None });
                    }
                }
                Step::Take => {
                    if let Some(work) = qp.next_work(dev.mrs_mut()) {
                        let p = &mut posted[work.wr_id as usize];
                        prop_assert!(!p.bad, "a request failing its checks went on the wire");
                        prop_assert!(!p.fence || outstanding_reads.is_empty(), "fence ignored");
                        if let WireOp::RdmaRead { .. } = work.op {
                            outstanding_reads.push(work.wr_id);
                            prop_assert!(outstanding_reads.len() as u32 <= ord, "ORD exceeded");
                        }
                        offset += u64::from(work.len) + 20;
                        if !p.is_read {
                            p.end = Some(offset);
                        }
                        qp.transmitted(work.seq, offset).unwrap();
                        taken.push(work.wr_id);
                    }
                }
                Step::Ack { back } => {
                    acked = acked.max(offset.saturating_sub(back));
                    qp.acked(acked);
                }
                Step::AckEdge { short } => {
                    let next = posted.iter().filter_map(|p| p.end).filter(|&e| e > acked).min();
                    if let Some(end) = next {
                        acked = if short { end - 1 } else { end };
                        qp.acked(acked);
                    }
                }
                Step::ReadResponse { ok } => {
                    let status = if ok { WcStatus::Success } else { WcStatus::RemoteAccessError };
                    match qp.oldest_read() {
                        Some((_, wr)) => {
                            let id = wr.wr_id;
                            prop_assert_eq!(outstanding_reads.first(), Some(&id));
                            qp.complete_read(status).unwrap();
                            outstanding_reads.remove(0);
                            posted[id as usize].read_done = Some(status);
                        }
                        None => prop_assert!(qp.complete_read(status).is_err()),
                    }
                }
                Step::EngineFails => {
                    if let Some(&id) = taken.last() {
                        let seq = rdmap::verbs::WrSeq(id);
                        if qp.complete(seq, WcStatus::GeneralError).is_ok() {
                            outstanding_reads.retain(|&r| r != id);
                            posted[id as usize].read_done = Some(WcStatus::GeneralError);
                            posted[id as usize].end = None;
                        }
                    }
                }
                Step::Error => {
                    qp.modify_qp(QpModify::state(QpState::Error)).unwrap();
                    outstanding_reads.clear();
                }
                Step::Deliver => {
                    qp.deliver_completions(&mut cq).unwrap();
                    check_delivery(&mut cq, &posted, acked, &mut delivered)?;
                }
            }
            if qp.state() == QpState::Error {
                outstanding_reads.clear();
            }
        }
        // Teardown: everything left flushes.
        qp.modify_qp(QpModify::state(QpState::Error)).unwrap();
        qp.deliver_completions(&mut cq).unwrap();
        check_delivery(&mut cq, &posted, acked, &mut delivered)?;
        prop_assert_eq!(qp.sq_len(), 0);

        let seen: BTreeMap<u64, WcStatus> = delivered.iter().map(|d| (d.0, d.1)).collect();
        prop_assert_eq!(seen.len(), delivered.len(), "a request completed twice");
        for (id, p) in posted.iter().enumerate() {
            match seen.get(&(id as u64)) {
                Some(_) => {}
                None => prop_assert!(!p.signalled, "signalled request {} never completed", id),
            }
            if p.bad {
                // A request that failed its checks never succeeds; it is
                // reported (as itself or flushed), signalled or not.
                prop_assert!(seen.get(&(id as u64)).is_some_and(|s| *s != WcStatus::Success));
            }
        }
    }
}
