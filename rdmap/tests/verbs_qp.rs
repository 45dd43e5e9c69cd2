//! Queue pairs: the state machine, posting rules, completion ordering (one
//! completion per signalled request, in send-queue order, a Write never
//! overtaking an earlier Read), flushing, ORD and IRD, the CQ overrun rule,
//! local memory operations on the send queue, and a shared receive queue
//! used by two queue pairs.

use rdmap::error::TerminateCause;
use rdmap::placement::{RegionHandle, VecMemory};
use rdmap::verbs::{
    Access, CompletionQueue, CqEvent, Device, DeviceLimits, FastReg, InboundRead, MrState, PdId,
    PostError, QpError, QpEvent, QpInitAttr, QpModify, QpState, QueuePair, RecvDone, RecvWr,
    RegOptions, SendFlags, SendOp, SendWork, SendWr, Sge, SgeList, SrqEvent, SrqInitAttr, Stag,
    VerbsError, WcOpcode, WcStatus, WireOp, WorkCompletion, WrSeq, IRD_EXCEEDED,
};

const VA: u64 = 0x5555_0000_0000;

struct H {
    dev: Device,
    mem: VecMemory,
    region: RegionHandle,
    pd: PdId,
    cq: CompletionQueue,
    qp: QueuePair,
    /// Local and remote rights on the whole region.
    stag: Stag,
    /// The engine's stream offset: the end of the last FPDU it queued.
    offset: u64,
}

fn attr(pd: PdId, cq: &CompletionQueue) -> QpInitAttr {
    QpInitAttr {
        pd,
        send_cq: cq.id(),
        recv_cq: cq.id(),
        srq: None,
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_ord: 4,
        max_ird: 4,
        sq_sig_all: false,
    }
}

fn harness_with(cqe: u32) -> H {
    let mut dev = Device::new(DeviceLimits {
        max_mr: 32,
        ..DeviceLimits::default()
    });
    let mut mem = VecMemory::new();
    let region = mem.add_region(1 << 16);
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(cqe).unwrap();
    let qp = dev.create_qp(attr(pd, &cq)).unwrap();
    let stag = dev
        .reg_mr(
            pd,
            mem.whole(region).unwrap(),
            VA,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    H {
        dev,
        mem,
        region,
        pd,
        cq,
        qp,
        stag,
        offset: 0,
    }
}

fn harness() -> H {
    let mut h = harness_with(64);
    h.qp.modify_qp(QpModify::state(QpState::Rts)).unwrap();
    h
}

impl H {
    fn sge(&self, at: u64, len: u32) -> Sge {
        Sge {
            addr: VA + at,
            length: len,
            lkey: self.stag,
        }
    }

    fn send(&mut self, wr_id: u64, len: u32, flags: SendFlags) -> WrSeq {
        let wr = SendWr {
            wr_id,
            op: SendOp::Send,
            sges: SgeList::single(self.sge(0, len)),
            flags,
        };
        self.qp.post_send(&wr, self.dev.mrs()).unwrap()
    }

    fn write(&mut self, wr_id: u64, len: u32) -> WrSeq {
        let wr = SendWr::write(wr_id, SgeList::single(self.sge(0, len)), 0x99, Stag(0x4400));
        self.qp.post_send(&wr, self.dev.mrs()).unwrap()
    }

    fn read(&mut self, wr_id: u64, len: u32) -> WrSeq {
        let wr = SendWr::read(wr_id, self.sge(1024, len), 0x77, Stag(0x4500));
        self.qp.post_send(&wr, self.dev.mrs()).unwrap()
    }

    /// Takes the next request and "transmits" it whole: returns it and the
    /// stream offset its last byte ends at.
    fn transmit_next(&mut self) -> Option<(SendWork, u64)> {
        let work = self.qp.next_work(self.dev.mrs_mut())?;
        self.offset += u64::from(work.len) + 16;
        self.qp.transmitted(work.seq, self.offset).unwrap();
        Some((work, self.offset))
    }

    fn deliver(&mut self) -> Vec<WorkCompletion> {
        self.qp.deliver_completions(&mut self.cq).unwrap();
        self.drain_cq()
    }

    fn drain_cq(&mut self) -> Vec<WorkCompletion> {
        std::iter::from_fn(|| self.cq.poll_one()).collect()
    }
}

fn ids(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn qp_in(state: QpState) -> H {
    let mut h = harness_with(64);
    let path: &[QpState] = match state {
        QpState::Idle => &[],
        QpState::Rts => &[QpState::Rts],
        QpState::Closing => &[QpState::Rts, QpState::Closing],
        QpState::Terminate => &[QpState::Rts, QpState::Terminate],
        QpState::Error => &[QpState::Error],
    };
    for s in path {
        h.qp.modify_qp(QpModify::state(*s)).unwrap();
    }
    assert_eq!(h.qp.state(), state);
    h
}

#[test]
fn state_transition_table() {
    use QpState::*;
    let all = [Idle, Rts, Closing, Terminate, Error];
    let allowed = |from: QpState, to: QpState| {
        from == to
            || to == Error
            || matches!(
                (from, to),
                (Idle, Rts) | (Rts, Closing) | (Rts, Terminate) | (Closing, Idle) | (Error, Idle)
            )
    };
    for from in all {
        for to in all {
            let mut h = qp_in(from);
            let r = h.qp.modify_qp(QpModify::state(to));
            if allowed(from, to) {
                assert_eq!(r, Ok(()), "{from:?} -> {to:?}");
                assert_eq!(h.qp.state(), to);
            } else {
                assert_eq!(r, Err(VerbsError::InvalidTransition), "{from:?} -> {to:?}");
                assert_eq!(h.qp.state(), from);
            }
        }
    }
}

#[test]
fn closing_and_error_return_to_idle_only_when_drained() {
    let mut h = harness();
    h.send(1, 8, SendFlags::SIGNALED);
    h.qp.modify_qp(QpModify::state(QpState::Closing)).unwrap();
    assert_eq!(
        h.qp.modify_qp(QpModify::state(QpState::Idle)),
        Err(VerbsError::InvalidTransition),
        "a Send is still outstanding"
    );
    h.qp.modify_qp(QpModify::state(QpState::Error)).unwrap();
    assert!(h.qp.needs_flush());
    assert_eq!(
        h.qp.modify_qp(QpModify::state(QpState::Idle)),
        Err(VerbsError::InvalidTransition),
        "not flushed yet"
    );
    assert_eq!(ids(&h.deliver()), vec![(1, WcStatus::WrFlushError)]);
    assert!(!h.qp.needs_flush());
    h.qp.modify_qp(QpModify::state(QpState::Idle)).unwrap();
    // Reusable: a new stream works from scratch.
    h.qp.modify_qp(QpModify::state(QpState::Rts)).unwrap();
    h.send(2, 8, SendFlags::SIGNALED);
    let (_, end) = h.transmit_next().unwrap();
    h.qp.acked(end);
    assert_eq!(ids(&h.deliver()), vec![(2, WcStatus::Success)]);
}

#[test]
fn ird_and_ord_change_only_in_idle_and_within_limits() {
    let mut h = harness_with(8);
    assert_eq!(
        h.qp.modify_qp(QpModify {
            ord: Some(5),
            ..QpModify::default()
        }),
        Err(VerbsError::InvalidValue)
    );
    h.qp.modify_qp(QpModify {
        state: Some(QpState::Rts),
        ord: Some(1),
        ird: Some(0),
    })
    .unwrap();
    assert_eq!((h.qp.ord(), h.qp.ird()), (1, 0));
    assert_eq!(
        h.qp.modify_qp(QpModify {
            ird: Some(2),
            ..QpModify::default()
        }),
        Err(VerbsError::InvalidTransition)
    );
}

#[test]
fn post_send_refusals() {
    let mut h = harness();
    let sge = h.sge(0, 8);
    let too_many = SendWr::send(1, SgeList::new(&[sge; 5]).unwrap());
    assert_eq!(
        h.qp.post_send(&too_many, h.dev.mrs()),
        Err(PostError::TooManySges)
    );
    let read_two = SendWr {
        sges: SgeList::new(&[sge, sge]).unwrap(),
        ..SendWr::read(1, sge, 0, Stag(0x100))
    };
    assert_eq!(
        h.qp.post_send(&read_two, h.dev.mrs()),
        Err(PostError::InvalidWr)
    );
    let inval_with_data = SendWr {
        wr_id: 1,
        op: SendOp::LocalInvalidate { stag: h.stag },
        sges: SgeList::single(sge),
        flags: SendFlags::NONE,
    };
    assert_eq!(
        h.qp.post_send(&inval_with_data, h.dev.mrs()),
        Err(PostError::InvalidWr)
    );
    let huge = Sge {
        length: u32::MAX,
        ..sge
    };
    let overflow = SendWr::send(1, SgeList::new(&[huge, sge]).unwrap());
    assert_eq!(
        h.qp.post_send(&overflow, h.dev.mrs()),
        Err(PostError::InvalidWr)
    );
    for i in 0..16 {
        h.send(i, 1, SendFlags::NONE);
    }
    assert_eq!(
        h.qp.post_send(&SendWr::send(99, SgeList::empty()), h.dev.mrs()),
        Err(PostError::QueueFull)
    );
    for state in [QpState::Closing, QpState::Terminate] {
        let mut h = qp_in(state);
        assert_eq!(
            h.qp.post_send(&SendWr::send(1, SgeList::empty()), h.dev.mrs()),
            Err(PostError::InvalidState)
        );
        assert_eq!(
            h.qp.post_recv(&RecvWr {
                wr_id: 1,
                sges: SgeList::empty()
            }),
            Ok(())
        );
    }
}

#[test]
fn work_posted_in_idle_waits_for_rts() {
    let mut h = harness_with(8);
    h.send(1, 8, SendFlags::SIGNALED);
    assert!(h.qp.next_work(h.dev.mrs_mut()).is_none());
    h.qp.modify_qp(QpModify::state(QpState::Rts)).unwrap();
    let work = h.qp.next_work(h.dev.mrs_mut()).unwrap();
    assert_eq!((work.wr_id, work.len), (1, 8));
    assert_eq!(
        work.op,
        WireOp::Send {
            solicited: false,
            invalidate: None
        }
    );
}

#[test]
fn sends_and_writes_complete_when_acknowledged_exactly_once() {
    let mut h = harness();
    h.send(1, 100, SendFlags::SIGNALED);
    h.write(2, 200);
    h.send(3, 0, SendFlags::NONE); // unsignalled: no completion
    h.send(4, 50, SendFlags::SIGNALED | SendFlags::SOLICITED);
    let mut ends = Vec::new();
    while let Some((work, end)) = h.transmit_next() {
        ends.push(end);
        if work.wr_id == 4 {
            assert_eq!(
                work.op,
                WireOp::Send {
                    solicited: true,
                    invalidate: None
                }
            );
        }
    }
    assert_eq!(ends.len(), 4);
    assert!(h.deliver().is_empty(), "nothing acknowledged yet");
    h.qp.acked(ends[0] - 1);
    assert!(h.deliver().is_empty(), "one byte short");
    h.qp.acked(ends[0]);
    let wcs = h.deliver();
    assert_eq!(ids(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!((wcs[0].opcode, wcs[0].byte_len), (WcOpcode::Send, 100));
    h.qp.acked(ends[0]);
    assert!(h.deliver().is_empty(), "no duplicate");
    h.qp.acked(ends[3]);
    let wcs = h.deliver();
    assert_eq!(
        ids(&wcs),
        vec![(2, WcStatus::Success), (4, WcStatus::Success)]
    );
    assert_eq!((wcs[0].opcode, wcs[0].byte_len), (WcOpcode::RdmaWrite, 200));
    assert_eq!(h.qp.sq_len(), 0);
    h.qp.acked(u64::MAX);
    assert!(h.deliver().is_empty());
}

#[test]
fn acknowledgement_reported_before_the_transmitted_call() {
    let mut h = harness();
    h.send(1, 10, SendFlags::SIGNALED);
    let work = h.qp.next_work(h.dev.mrs_mut()).unwrap();
    h.qp.acked(1000);
    h.qp.transmitted(work.seq, 26).unwrap();
    assert_eq!(ids(&h.deliver()), vec![(1, WcStatus::Success)]);
    assert_eq!(h.qp.transmitted(work.seq, 26), Err(QpError::UnknownWr));
}

#[test]
fn write_acknowledged_before_an_earlier_read_waits_for_it() {
    let mut h = harness();
    h.read(1, 64);
    h.write(2, 32);
    h.read(3, 16);
    h.write(4, 8);
    let mut ends = Vec::new();
    while let Some((work, end)) = h.transmit_next() {
        ends.push((work.wr_id, end));
    }
    assert_eq!(h.qp.outstanding_reads(), 2);
    // Every Write is acknowledged; no Read Response has come back.
    h.qp.acked(h.offset);
    assert!(
        h.deliver().is_empty(),
        "the Writes must not overtake Read 1"
    );

    // Read 1's Response arrives: the engine finds its sink...
    let (seq, wr) = h.qp.oldest_read().unwrap();
    assert_eq!(wr.wr_id, 1);
    assert_eq!(wr.sges.as_slice()[0].addr, VA + 1024);
    assert_eq!(h.qp.complete_read(WcStatus::Success), Ok(seq));
    let wcs = h.deliver();
    assert_eq!(
        ids(&wcs),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)],
        "Read 1, then the Write behind it; Write 4 waits for Read 3"
    );
    assert_eq!((wcs[0].opcode, wcs[0].byte_len), (WcOpcode::RdmaRead, 64));

    assert_eq!(h.qp.oldest_read().unwrap().1.wr_id, 3);
    h.qp.complete_read(WcStatus::Success).unwrap();
    assert_eq!(
        ids(&h.deliver()),
        vec![(3, WcStatus::Success), (4, WcStatus::Success)]
    );
    assert_eq!(
        h.qp.complete_read(WcStatus::Success),
        Err(QpError::NoOutstandingRead)
    );
    assert_eq!(
        QpError::NoOutstandingRead.terminate_cause(),
        Some(TerminateCause::RDMAP_OP_UNEXPECTED_OPCODE)
    );
}

#[test]
fn ord_bounds_outstanding_reads_without_error() {
    let mut h = harness_with(64);
    h.qp.modify_qp(QpModify {
        state: Some(QpState::Rts),
        ord: Some(2),
        ird: None,
    })
    .unwrap();
    for id in 1..=3 {
        h.read(id, 8);
    }
    h.send(4, 8, SendFlags::SIGNALED);
    assert_eq!(h.transmit_next().unwrap().0.wr_id, 1);
    assert_eq!(h.transmit_next().unwrap().0.wr_id, 2);
    assert!(h.transmit_next().is_none(), "Read 3 waits for ORD");
    assert!(h.qp.is_read_blocked());
    assert_eq!(h.qp.state(), QpState::Rts);
    h.qp.complete_read(WcStatus::Success).unwrap();
    assert!(!h.qp.is_read_blocked());
    let (work, _) = h.transmit_next().unwrap();
    assert_eq!(work.wr_id, 3);
    assert!(matches!(
        work.op,
        WireOp::RdmaRead {
            rkey: Stag(0x4500),
            remote_addr: 0x77
        }
    ));
    assert_eq!(
        h.transmit_next().unwrap().0.wr_id,
        4,
        "a Send is not bound by ORD"
    );
    h.qp.complete_read(WcStatus::Success).unwrap();
    h.qp.complete_read(WcStatus::Success).unwrap();
    h.qp.acked(h.offset);
    assert_eq!(
        ids(&h.deliver()),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
}

#[test]
fn fence_waits_for_earlier_reads() {
    let mut h = harness();
    h.read(1, 8);
    h.send(2, 8, SendFlags::SIGNALED | SendFlags::FENCE);
    assert_eq!(h.transmit_next().unwrap().0.wr_id, 1);
    assert!(h.transmit_next().is_none());
    assert!(h.qp.is_read_blocked());
    h.qp.complete_read(WcStatus::Success).unwrap();
    assert_eq!(h.transmit_next().unwrap().0.wr_id, 2);
}

#[test]
fn ird_bounds_inbound_read_requests() {
    let mut h = harness_with(8);
    h.qp.modify_qp(QpModify {
        state: Some(QpState::Rts),
        ord: None,
        ird: Some(2),
    })
    .unwrap();
    let pd = h.pd;
    let stag = h.stag;
    let inbound = |mrs: &mut rdmap::verbs::MrTable, len: u32| InboundRead {
        sink_stag: Stag(0x100),
        sink_to: 0,
        len,
        source: mrs.pin_remote_read(stag, VA, len, pd).unwrap(),
        sent: 0,
    };
    let a = inbound(h.dev.mrs_mut(), 64);
    let b = inbound(h.dev.mrs_mut(), 0);
    assert!(b.source.is_none(), "a zero-length Read pins nothing");
    h.qp.push_inbound_read(a).unwrap();
    h.qp.push_inbound_read(b).unwrap();
    let c = inbound(h.dev.mrs_mut(), 32);
    let refused = h.qp.push_inbound_read(c).unwrap_err();
    assert_eq!(IRD_EXCEEDED, TerminateCause::DDP_UNTAGGED_NO_BUFFER);
    assert_eq!(h.dev.mrs().query_mr(stag).unwrap().pins, 2);
    h.dev.mrs_mut().unpin(refused.source.unwrap());

    // The front's response goes out; the slot frees when it is popped,
    // while its pin stays with the FPDUs until they are acknowledged.
    h.qp.inbound_read_front().unwrap().sent = 64;
    let done = h.qp.pop_inbound_read().unwrap();
    assert_eq!(h.qp.inbound_reads(), 1);
    let d = inbound(h.dev.mrs_mut(), 16);
    h.qp.push_inbound_read(d).unwrap();
    assert_eq!(h.dev.mrs().query_mr(stag).unwrap().pins, 2);
    h.dev.mrs_mut().unpin(done.source.unwrap());
    assert_eq!(h.qp.drain_inbound_reads(h.dev.mrs_mut()), 2);
    assert_eq!(h.dev.mrs().query_mr(stag).unwrap().pins, 0);
}

#[test]
fn error_flushes_everything_in_order() {
    let mut h = harness();
    for (id, flags) in [
        (1, SendFlags::SIGNALED),
        (2, SendFlags::NONE),
        (3, SendFlags::SIGNALED),
    ] {
        h.send(id, 8, flags);
    }
    h.read(4, 8);
    h.write(5, 8);
    for i in 0..3 {
        h.qp.post_recv(&RecvWr {
            wr_id: 100 + i,
            sges: SgeList::single(h.sge(4096, 64)),
        })
        .unwrap();
    }
    h.transmit_next().unwrap(); // Send 1 on the wire
    h.transmit_next().unwrap(); // Send 2 on the wire
    h.qp.acked(h.offset); // both acknowledged
    h.transmit_next().unwrap(); // Send 3 on the wire, not acknowledged
    h.qp.begin_recv(None).unwrap(); // a Send is arriving into receive 100

    h.qp.modify_qp(QpModify::state(QpState::Error)).unwrap();
    assert!(h.qp.next_work(h.dev.mrs_mut()).is_none());
    // A request posted in Error is flushed too.
    h.send(6, 8, SendFlags::NONE);
    let wcs = h.deliver();
    assert_eq!(
        ids(&wcs),
        vec![
            (1, WcStatus::Success),
            (3, WcStatus::WrFlushError),
            (4, WcStatus::WrFlushError),
            (5, WcStatus::WrFlushError),
            (6, WcStatus::WrFlushError),
        ],
        "acknowledged work completes, the rest flushes, unsignalled included"
    );
    assert_eq!(wcs[2].opcode, WcOpcode::RdmaRead);
    assert!(wcs[1..].iter().all(|w| w.byte_len == 0));
    assert_eq!(h.qp.flush_rq(&mut h.cq), Ok(3));
    let rq = h.drain_cq();
    assert_eq!(
        ids(&rq),
        vec![
            (100, WcStatus::WrFlushError),
            (101, WcStatus::WrFlushError),
            (102, WcStatus::WrFlushError)
        ]
    );
    assert!(rq.iter().all(|w| w.opcode == WcOpcode::Recv));
    assert!(!h.qp.needs_flush());
    // Posting a receive in Error: flushed by the next flush.
    h.qp.post_recv(&RecvWr {
        wr_id: 103,
        sges: SgeList::empty(),
    })
    .unwrap();
    assert!(h.qp.needs_flush());
    assert_eq!(h.qp.flush_rq(&mut h.cq), Ok(1));
}

#[test]
fn local_protection_error_at_post_time() {
    let mut h = harness();
    h.send(1, 8, SendFlags::SIGNALED);
    let bad = SendWr {
        wr_id: 2,
        op: SendOp::Send,
        sges: SgeList::single(Sge {
            addr: VA,
            length: 8,
            lkey: h.stag.with_key(h.stag.key() ^ 0x80),
        }),
        flags: SendFlags::NONE,
    };
    h.qp.post_send(&bad, h.dev.mrs()).unwrap();
    // A Read into memory without local write is refused too.
    let ro = h
        .dev
        .reg_mr(h.pd, h.mem.whole(h.region).unwrap(), 0, Access::REMOTE_READ)
        .unwrap();
    let read_sink_ro = SendWr::read(
        3,
        Sge {
            addr: 0,
            length: 8,
            lkey: ro,
        },
        0,
        Stag(0x100),
    );
    h.qp.post_send(&read_sink_ro, h.dev.mrs()).unwrap();
    h.send(4, 8, SendFlags::SIGNALED);

    let (_, end) = h.transmit_next().unwrap();
    assert!(
        h.transmit_next().is_none(),
        "the send queue stops at the bad request"
    );
    assert_eq!(h.qp.state(), QpState::Rts, "earlier work still completes");
    h.qp.acked(end);
    let wcs = h.deliver();
    assert_eq!(
        ids(&wcs),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::LocalProtectionError),
            (3, WcStatus::WrFlushError),
            (4, WcStatus::WrFlushError),
        ],
        "the unsignalled failure is reported, then everything after it flushes"
    );
    assert_eq!(h.qp.state(), QpState::Error);
    assert_eq!(
        h.qp.take_event(),
        Some(QpEvent::WorkRequestError(WcStatus::LocalProtectionError))
    );
}

#[test]
fn failure_detected_by_the_engine() {
    let mut h = harness();
    h.write(1, 8);
    h.write(2, 8);
    let (w1, _) = h.transmit_next().unwrap();
    // The peer's Terminate says our Write hit a bad STag.
    h.qp.complete(
        w1.seq,
        WcStatus::from_terminate(TerminateCause::DDP_TAGGED_INVALID_STAG),
    )
    .unwrap();
    assert!(h.transmit_next().is_none());
    assert_eq!(
        h.qp.complete(w1.seq, WcStatus::Success),
        Err(QpError::WrongPhase)
    );
    assert_eq!(
        ids(&h.deliver()),
        vec![
            (1, WcStatus::RemoteAccessError),
            (2, WcStatus::WrFlushError)
        ]
    );
    assert_eq!(h.qp.state(), QpState::Error);
}

#[test]
fn completion_queue_overrun_loses_nothing() {
    let mut h = harness_with(2);
    h.qp.modify_qp(QpModify::state(QpState::Rts)).unwrap();
    for id in 1..=4 {
        h.send(id, 8, SendFlags::SIGNALED);
    }
    while h.transmit_next().is_some() {}
    h.qp.acked(h.offset);
    assert_eq!(h.qp.deliver_completions(&mut h.cq), Err(QpError::CqFull));
    assert_eq!(h.cq.len(), 2);
    assert_eq!(h.cq.take_event(), Some(CqEvent::Overrun));
    assert_eq!(h.qp.state(), QpState::Error);
    assert_eq!(h.qp.take_event(), Some(QpEvent::CqOverrun));
    // The application makes room: the rest arrives, in order, as it was.
    let mut all = h.drain_cq();
    while h.qp.deliver_completions(&mut h.cq).is_err() {
        all.extend(h.drain_cq());
    }
    all.extend(h.drain_cq());
    assert_eq!(
        ids(&all),
        (1..=4)
            .map(|id| (id, WcStatus::Success))
            .collect::<Vec<_>>()
    );
}

#[test]
fn receive_completion_into_a_full_cq_is_kept() {
    let mut h = harness_with(1);
    h.qp.modify_qp(QpModify::state(QpState::Rts)).unwrap();
    for i in 0..2 {
        h.qp.post_recv(&RecvWr {
            wr_id: 10 + i,
            sges: SgeList::single(h.sge(0, 8)),
        })
        .unwrap();
    }
    let done = RecvDone {
        status: WcStatus::Success,
        byte_len: 8,
        solicited: false,
        invalidated_stag: None,
    };
    h.qp.begin_recv(None).unwrap();
    h.qp.finish_recv(&mut h.cq, done).unwrap();
    h.qp.begin_recv(None).unwrap();
    assert_eq!(h.qp.finish_recv(&mut h.cq, done), Err(QpError::CqFull));
    assert_eq!(h.qp.state(), QpState::Error);
    assert_eq!(h.qp.flush_rq(&mut h.cq), Err(QpError::CqFull));
    assert_eq!(ids(&h.drain_cq()), vec![(10, WcStatus::Success)]);
    assert_eq!(h.qp.flush_rq(&mut h.cq), Ok(1));
    let wc = h.cq.poll_one().unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (11, WcStatus::Success, 8)
    );
}

#[test]
fn receive_completion_carries_invalidate_and_solicited() {
    let mut h = harness();
    h.qp.post_recv(&RecvWr {
        wr_id: 7,
        sges: SgeList::single(h.sge(0, 128)),
    })
    .unwrap();
    assert_eq!(
        h.qp.finish_recv(
            &mut h.cq,
            RecvDone {
                status: WcStatus::Success,
                byte_len: 0,
                solicited: false,
                invalidated_stag: None,
            }
        ),
        Err(QpError::NoReceiveInProgress)
    );
    h.qp.begin_recv(None).unwrap();
    assert_eq!(h.qp.begin_recv(None), Err(QpError::ReceiveInProgress));
    let buf = h.qp.current_recv().unwrap().sges.as_slice()[0];
    // The engine places a 5-byte Send with Invalidate into the buffer.
    let dst = h
        .dev
        .mrs()
        .check_local(buf.lkey, buf.addr, 5, h.qp.pd(), Access::LOCAL_WRITE)
        .unwrap()
        .unwrap();
    rdmap::placement::Placement::write(&mut h.mem, dst, b"hello").unwrap();
    let victim = h
        .dev
        .reg_mr_with(
            h.pd,
            h.mem.span(h.region, 0, 16).unwrap(),
            0,
            Access::REMOTE_READ,
            RegOptions {
                invalidatable: true,
            },
        )
        .unwrap();
    h.dev
        .mrs_mut()
        .invalidate_remote(victim, h.qp.pd())
        .unwrap();
    h.qp.finish_recv(
        &mut h.cq,
        RecvDone {
            status: WcStatus::Success,
            byte_len: 5,
            solicited: true,
            invalidated_stag: Some(victim),
        },
    )
    .unwrap();
    let wc = h.cq.poll_one().unwrap();
    assert_eq!((wc.wr_id, wc.opcode, wc.byte_len), (7, WcOpcode::Recv, 5));
    assert!(wc.solicited && wc.with_invalidate());
    assert_eq!(wc.invalidated_stag, Some(victim));
    assert_eq!(&h.mem.bytes(h.region).unwrap()[..5], b"hello");
    assert_eq!(h.qp.begin_recv(None), Err(QpError::NoReceiveBuffer));
    assert_eq!(
        QpError::NoReceiveBuffer.terminate_cause(),
        Some(TerminateCause::DDP_UNTAGGED_NO_BUFFER)
    );
}

#[test]
fn local_memory_operations_run_in_queue_order() {
    let mut h = harness();
    let frmr = h.dev.alloc_mr(h.pd, 4096).unwrap();
    let new = frmr.with_key(0x5a);
    let fr = SendWr {
        wr_id: 1,
        op: SendOp::FastRegister(FastReg {
            stag: new,
            mem: h.mem.span(h.region, 8192, 4096).unwrap(),
            iova: 0,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        }),
        sges: SgeList::empty(),
        flags: SendFlags::SIGNALED,
    };
    h.qp.post_send(&fr, h.dev.mrs()).unwrap();
    h.write(2, 8);
    let inv = SendWr {
        wr_id: 3,
        op: SendOp::LocalInvalidate { stag: new },
        sges: SgeList::empty(),
        flags: SendFlags::SIGNALED,
    };
    h.qp.post_send(&inv, h.dev.mrs()).unwrap();
    assert_eq!(
        h.dev.mrs().query_mr(frmr).unwrap().state,
        MrState::Invalid,
        "nothing runs before the engine pulls work"
    );

    // The fast registration runs when the engine pulls the next work.
    let (write, _) = h.transmit_next().unwrap();
    assert_eq!(write.wr_id, 2);
    assert!(h
        .dev
        .mrs()
        .check_remote_write(new, 0, 16, h.pd)
        .unwrap()
        .is_some());
    // The invalidation behind the Write runs on the next pull.
    assert!(h.transmit_next().is_none());
    assert_eq!(h.dev.mrs().query_mr(frmr).unwrap().state, MrState::Invalid);
    let wcs = h.deliver();
    assert_eq!(
        ids(&wcs),
        vec![(1, WcStatus::Success)],
        "3 waits for the Write"
    );
    assert_eq!(wcs[0].opcode, WcOpcode::FastRegister);
    h.qp.acked(h.offset);
    let wcs = h.deliver();
    assert_eq!(
        ids(&wcs),
        vec![(2, WcStatus::Success), (3, WcStatus::Success)]
    );
    assert_eq!(wcs[1].opcode, WcOpcode::LocalInvalidate);

    // A local invalidation that fails ends the stream.
    let plain = h.stag;
    let bad = SendWr {
        op: SendOp::LocalInvalidate { stag: plain },
        wr_id: 4,
        flags: SendFlags::NONE,
        ..inv
    };
    h.qp.post_send(&bad, h.dev.mrs()).unwrap();
    h.send(5, 1, SendFlags::NONE);
    assert!(h.transmit_next().is_none());
    assert_eq!(
        ids(&h.deliver()),
        vec![
            (4, WcStatus::LocalProtectionError),
            (5, WcStatus::WrFlushError)
        ]
    );
    assert_eq!(h.qp.state(), QpState::Error);
}

#[test]
fn shared_receive_queue_serves_two_queue_pairs() {
    let mut h = harness();
    let mut srq = h
        .dev
        .create_srq(
            h.pd,
            SrqInitAttr {
                max_wr: 4,
                max_sge: 2,
                srq_limit: 0,
            },
        )
        .unwrap();
    let mut rcq = h.dev.create_cq(16).unwrap();
    let mk = |dev: &mut Device, cq: &CompletionQueue, rcq: &CompletionQueue| {
        let mut a = attr(h.pd, cq);
        a.recv_cq = rcq.id();
        a.srq = Some(srq.id());
        let mut qp = dev.create_qp(a).unwrap();
        qp.modify_qp(QpModify::state(QpState::Rts)).unwrap();
        qp
    };
    let mut qp1 = mk(&mut h.dev, &h.cq, &rcq);
    let mut qp2 = mk(&mut h.dev, &h.cq, &rcq);
    let recv = |wr_id| RecvWr {
        wr_id,
        sges: SgeList::single(Sge {
            addr: VA,
            length: 64,
            lkey: h.stag,
        }),
    };
    assert_eq!(qp1.post_recv(&recv(1)), Err(PostError::SrqAttached));
    for id in 1..=4 {
        srq.post_srq_recv(&recv(id)).unwrap();
    }
    assert_eq!(srq.post_srq_recv(&recv(5)), Err(PostError::QueueFull));
    srq.modify_srq(2);

    assert_eq!(qp1.begin_recv(None), Err(QpError::WrongSrq));
    qp1.begin_recv(Some(&mut srq)).unwrap();
    qp2.begin_recv(Some(&mut srq)).unwrap();
    assert_eq!(qp1.current_recv().unwrap().wr_id, 1);
    assert_eq!(qp2.current_recv().unwrap().wr_id, 2);
    assert_eq!(srq.take_event(), None, "two left, limit 2");
    let ok = |n| RecvDone {
        status: WcStatus::Success,
        byte_len: n,
        solicited: false,
        invalidated_stag: None,
    };
    assert_eq!(qp2.finish_recv(&mut h.cq, ok(3)), Err(QpError::WrongCq));
    qp2.finish_recv(&mut rcq, ok(3)).unwrap();
    qp1.finish_recv(&mut rcq, ok(9)).unwrap();
    qp2.begin_recv(Some(&mut srq)).unwrap();
    assert_eq!(srq.take_event(), Some(SrqEvent::LimitReached));
    assert_eq!(srq.srq_limit(), 0, "disarmed");
    qp1.begin_recv(Some(&mut srq)).unwrap();
    assert_eq!(qp2.current_recv().unwrap().wr_id, 3);
    assert_eq!(qp1.current_recv().unwrap().wr_id, 4);

    // qp1 fails: it flushes the receive it holds; the SRQ is untouched.
    srq.post_srq_recv(&recv(6)).unwrap();
    qp1.modify_qp(QpModify::state(QpState::Error)).unwrap();
    assert_eq!(qp1.flush_rq(&mut rcq), Ok(1));
    assert_eq!(srq.len(), 1);
    qp2.finish_recv(&mut rcq, ok(1)).unwrap();
    let wcs: Vec<_> = std::iter::from_fn(|| rcq.poll_one()).collect();
    assert_eq!(
        wcs.iter()
            .map(|w| (w.qp_num, w.wr_id, w.status))
            .collect::<Vec<_>>(),
        vec![
            (qp2.qp_num(), 2, WcStatus::Success),
            (qp1.qp_num(), 1, WcStatus::Success),
            (qp1.qp_num(), 4, WcStatus::WrFlushError),
            (qp2.qp_num(), 3, WcStatus::Success),
        ]
    );
    qp2.begin_recv(Some(&mut srq)).unwrap();
    assert_eq!(qp2.current_recv().unwrap().wr_id, 6);
    assert_eq!(
        qp2.begin_recv(Some(&mut srq)),
        Err(QpError::ReceiveInProgress)
    );

    // Lifetime: the SRQ and CQs stay while queue pairs use them.
    assert_eq!(h.dev.destroy_srq(srq.id()), Err(VerbsError::Busy));
    assert_eq!(h.dev.destroy_cq(rcq.id()), Err(VerbsError::Busy));
    h.dev.destroy_qp(qp1).unwrap();
    h.dev.destroy_qp(qp2).unwrap();
    assert_eq!(h.dev.destroy_srq(srq.id()), Ok(()));
    assert_eq!(h.dev.destroy_cq(rcq.id()), Ok(()));
}

#[test]
fn device_checks_objects_and_their_users() {
    let mut h = harness();
    let other = h.dev.alloc_pd().unwrap();
    let srq = h
        .dev
        .create_srq(
            other,
            SrqInitAttr {
                max_wr: 2,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let mut a = attr(h.pd, &h.cq);
    a.srq = Some(srq.id());
    assert_eq!(h.dev.create_qp(a).unwrap_err(), VerbsError::InvalidSrq);
    a.srq = None;
    a.max_send_sge = 7;
    assert_eq!(h.dev.create_qp(a).unwrap_err(), VerbsError::InvalidValue);
    a.max_send_sge = 1;
    a.send_cq = rdmap::verbs::CqId(999);
    assert_eq!(h.dev.create_qp(a).unwrap_err(), VerbsError::InvalidCq);
    assert_eq!(h.dev.create_cq(0).unwrap_err(), VerbsError::InvalidValue);
    assert_eq!(
        h.dev.dealloc_pd(other),
        Err(VerbsError::Busy),
        "the SRQ uses it"
    );
    h.dev.destroy_srq(srq.id()).unwrap();
    h.dev.dealloc_pd(other).unwrap();

    // The harness QP holds its PD and CQ; the PD also has a region.
    assert_eq!(h.dev.destroy_cq(h.cq.id()), Err(VerbsError::Busy));
    h.dev.dereg_mr(h.stag).unwrap();
    assert_eq!(h.dev.dealloc_pd(h.pd), Err(VerbsError::Busy));
    let qp = std::mem::replace(
        &mut h.qp,
        QueuePair::new(rdmap::verbs::QpNum(0), attr(h.pd, &h.cq)),
    );
    h.dev.destroy_qp(qp).unwrap();
    h.dev.destroy_cq(h.cq.id()).unwrap();
    h.dev.dealloc_pd(h.pd).unwrap();
}
