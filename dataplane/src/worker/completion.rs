//! Delivery of completions: the end of a connection's service in each
//! iteration, moving work completions from the QP engine's queues into
//! the application's CQ rings, holding those that report an STag change
//! until the replica mesh has it.

use rdmap::verbs::{WcOpcode, WcStatus};
use tcp_offload::room::room_at_first_use;

use crate::ctl::MrOp;

use super::conn::Conn;
use super::stag_mesh::{Hold, MrSyncLinks};

impl Conn {
    /// Moves completions into the application's CQ rings. A completion
    /// that reports an STag change (a fast registration, a local
    /// invalidation, a Send that invalidated one of our STags) first sends
    /// the change to the other workers, then waits with everything behind
    /// it until they have applied it (see the module documentation).
    pub(super) fn deliver(&mut self, sync: &mut MrSyncLinks) -> bool {
        let Some(shared) = &self.shared else {
            while self.cq.poll_one().is_some() || self.rcq.poll_one().is_some() {}
            return false;
        };
        let mut n = 0;
        loop {
            if let Some(h) = self.hold {
                if !sync.acked(h.seq) {
                    while let Some(wc) = self.cq.poll_one() {
                        room_at_first_use(&mut self.unexamined, self.room.unexamined);
                        self.unexamined.push_back((wc, false));
                    }
                    while let Some(wc) = self.rcq.poll_one() {
                        room_at_first_use(&mut self.unexamined, self.room.unexamined);
                        self.unexamined.push_back((wc, true));
                    }
                    break;
                }
                self.hold = None;
                n += 1;
                if let Some(entry) = h.wc {
                    room_at_first_use(&mut self.backlog, self.room.backlog);
                    self.backlog.push_front(entry);
                }
            }
            // The backlog was examined before it went there.
            let (next, fresh) = match self.backlog.pop_front() {
                Some(e) => (Some(e), false),
                None => (
                    self.unexamined
                        .pop_front()
                        .or_else(|| self.cq.poll_one().map(|wc| (wc, false)))
                        .or_else(|| self.rcq.poll_one().map(|wc| (wc, true))),
                    true,
                ),
            };
            let Some((wc, recv)) = next else {
                break;
            };
            if fresh {
                let ok = wc.status == WcStatus::Success;
                let (change, deliver) = match wc.opcode {
                    WcOpcode::FastRegister | WcOpcode::LocalInvalidate if !recv => {
                        // One per local operation, in send-queue order.
                        let op = self.local_ops.pop_front();
                        debug_assert!(op.is_none_or(|o| o.wr_id == wc.wr_id));
                        let signalled = op.is_none_or(|o| o.signalled);
                        (op.filter(|_| ok).map(|o| o.op), signalled || !ok)
                    }
                    WcOpcode::Recv if ok => (
                        wc.invalidated_stag.map(|stag| MrOp::Invalidate {
                            stag,
                            pd: shared.attr.pd,
                        }),
                        true,
                    ),
                    _ => (None, true),
                };
                if let Some(op) = change {
                    let seq = sync.broadcast(op);
                    if !sync.acked(seq) {
                        self.hold = Some(Hold {
                            seq,
                            wc: deliver.then_some((wc, recv)),
                        });
                        continue;
                    }
                }
                if !deliver {
                    continue;
                }
            }
            let ring = if recv {
                &shared.recv_cq
            } else {
                &shared.send_cq
            };
            if let Err(wc) = ring.push(wc) {
                room_at_first_use(&mut self.backlog, self.room.backlog);
                self.backlog.push_front((wc, recv));
                break;
            }
            n += 1;
        }
        n > 0
    }
}
