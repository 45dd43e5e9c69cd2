//! The STag replica mesh: each worker's copy of the STag table learns the
//! fast registrations and invalidations other workers ran (applied in
//! the control stage of each iteration), and a completion that reports
//! such a change waits until every other worker has applied it (see
//! "STag replicas" in the worker's module documentation).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use rdmap::verbs::{AccessError, MrTable, SendFlags, SendOp};
use rdmap::verbs::{QpInitAttr, SendWr, WorkCompletion};

use crate::ctl::{MrOp, MrSync, PollPop, MR_SYNC_RING};
use crate::memory::MemoryTable;

use super::MR_SYNC_PER_POLL;

/// How far each worker has applied each other worker's changes:
/// `applied[receiver * n + sender]`, the last sequence number applied.
#[derive(Debug)]
pub(super) struct MrAcks {
    pub(super) n: usize,
    pub(super) applied: Box<[AtomicU64]>,
}

impl MrAcks {
    pub(super) fn slot(&self, receiver: usize, sender: usize) -> &AtomicU64 {
        &self.applied[receiver * self.n + sender]
    }
}

/// A worker's links to the other workers' STag replicas: its own ring
/// (multi-producer: every other worker pushes), the others' rings, and
/// the shared table of what has been applied.
///
/// Changes from one worker reach a ring in the order that worker made
/// them (per-peer outboxes keep the order when a ring is full), so "the
/// peer applied sequence number `s`" means it applied every earlier one.
#[derive(Debug)]
pub(crate) struct MrSyncLinks {
    index: usize,
    inbox: Arc<ArrayQueue<MrSync>>,
    peers: Vec<(usize, Arc<ArrayQueue<MrSync>>)>,
    outbox: Vec<VecDeque<MrSync>>,
    acks: Arc<MrAcks>,
    next_seq: u64,
}

impl MrSyncLinks {
    /// The links of `n` workers, all allocated now.
    pub(crate) fn mesh(n: usize) -> Vec<MrSyncLinks> {
        let inboxes: Vec<_> = (0..n)
            .map(|_| Arc::new(ArrayQueue::new(MR_SYNC_RING)))
            .collect();
        let acks = Arc::new(MrAcks {
            n,
            applied: (0..n * n).map(|_| AtomicU64::new(0)).collect(),
        });
        (0..n)
            .map(|i| MrSyncLinks {
                index: i,
                inbox: inboxes[i].clone(),
                peers: (0..n)
                    .filter(|&j| j != i)
                    .map(|j| (j, inboxes[j].clone()))
                    .collect(),
                outbox: (1..n)
                    .map(|_| VecDeque::with_capacity(MR_SYNC_RING))
                    .collect(),
                acks: acks.clone(),
                next_seq: 0,
            })
            .collect()
    }

    /// Sends `op` to every other worker; returns its sequence number, to
    /// wait for with [`MrSyncLinks::acked`].
    pub(super) fn broadcast(&mut self, op: MrOp) -> u64 {
        self.next_seq += 1;
        let m = MrSync {
            from: self.index,
            seq: self.next_seq,
            op,
        };
        for q in &mut self.outbox {
            q.push_back(m);
        }
        self.flush();
        self.next_seq
    }

    /// Moves what waits in the outboxes into the peers' rings, in order,
    /// as far as they have room.
    pub(super) fn flush(&mut self) {
        for ((_, ring), q) in self.peers.iter().zip(self.outbox.iter_mut()) {
            while let Some(&m) = q.front() {
                if ring.push(m).is_err() {
                    break;
                }
                q.pop_front();
            }
        }
    }

    /// Whether every other worker has applied change `seq` of this one.
    pub(super) fn acked(&self, seq: u64) -> bool {
        self.peers
            .iter()
            .all(|&(j, _)| self.acks.slot(j, self.index).load(Ordering::Acquire) >= seq)
    }

    /// Applies the other workers' changes to this worker's table (at most
    /// [`MR_SYNC_PER_POLL`]); whether there were any.
    pub(super) fn apply_incoming(&mut self, mrs: &mut MrTable) -> bool {
        let mut n = 0;
        while n < MR_SYNC_PER_POLL {
            let Some(m) = self.inbox.poll_pop() else {
                break;
            };
            n += 1;
            match m.op {
                MrOp::FastRegister { fr, pd } => {
                    if mrs.fast_register(&fr, pd) == Err(AccessError::InvalidOperation) {
                        // Registered here meanwhile (see the module docs):
                        // the replica takes the change it received last.
                        if let Some(cur) = mrs.query_mr(fr.stag).map(|i| i.stag) {
                            let _ = mrs.invalidate_local(cur, pd);
                            let _ = mrs.fast_register(&fr, pd);
                        }
                    }
                }
                MrOp::Invalidate { stag, pd } => {
                    // It passed the stricter check where it ran; an STag
                    // already invalid here stays so.
                    let _ = mrs.invalidate_local(stag, pd);
                }
            }
            // Release: the table above is updated before the sender can
            // see the acknowledgement (and complete the work request).
            self.acks
                .slot(self.index, m.from)
                .store(m.seq, Ordering::Release);
        }
        n > 0
    }
}

/// A fast registration or local invalidation posted to a queue pair, in
/// send-queue order, until its completion comes out of the engine.
#[derive(Debug, Clone, Copy)]
pub(super) struct LocalOp {
    pub(super) wr_id: u64,
    pub(super) op: MrOp,
    /// The application asked for a completion on success.
    pub(super) signalled: bool,
}

/// A completion held until every other worker has applied STag change
/// `seq` (`None`: an unsignalled change, nothing to deliver).
#[derive(Debug, Clone, Copy)]
pub(super) struct Hold {
    pub(super) seq: u64,
    pub(super) wc: Option<(WorkCompletion, bool)>,
}

/// The request the engine runs for `wr` (`None`: `wr` itself), and what
/// to replicate when it completes: a fast registration or local invalidation is always
/// signalled to the engine (its completion is where the worker learns the
/// outcome), and a fast registration naming memory this worker does not
/// know (not registered with `Dataplane::alloc_mr` or
/// `reg_mr`) is made to fail with a local protection error.
pub(super) fn prepare_local(
    wr: &SendWr,
    attr: &QpInitAttr,
    mem: &MemoryTable,
) -> (Option<SendWr>, Option<LocalOp>) {
    let pd = attr.pd;
    let (op, mr_op) = match wr.op {
        SendOp::FastRegister(mut fr) => {
            if mem.get(fr.mem.region).is_none() {
                // Longer than any fast-register region: refused by the
                // table's own check.
                fr.mem.len = u64::MAX;
            }
            (SendOp::FastRegister(fr), MrOp::FastRegister { fr, pd })
        }
        SendOp::LocalInvalidate { stag } => (wr.op, MrOp::Invalidate { stag, pd }),
        // Posted as it is: no copy (a request is some 170 bytes).
        _ => return (None, None),
    };
    let local = LocalOp {
        wr_id: wr.wr_id,
        op: mr_op,
        signalled: attr.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
    };
    let wr = SendWr {
        op,
        flags: wr.flags | SendFlags::SIGNALED,
        ..*wr
    };
    (Some(wr), Some(local))
}
