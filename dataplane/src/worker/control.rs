//! Control messages: the first stage of each iteration. Messages from
//! the application's control path (listen, connect, accept, reject,
//! memory registration, disconnect, shutdown), the STag changes other
//! workers made, and deregistrations that finished waiting for pins.

use core::net::SocketAddrV4;

use rdmap::placement::MemSpan;
use rdmap::verbs::VerbsError;
use rdmap::verbs::{DeregStatus, MrEvent};
use tcp_offload::Instant;

use crate::ctl::{Ctl, CtlReply, DisconnectReason, Error, PollPop, WorkerMsg};
use crate::link::LinkQueue;

use super::conn::{env, Conn};
use super::{Worker, CTL_PER_POLL};

impl<Q: LinkQueue> Worker<Q> {
    pub(super) fn control(&mut self, now: Instant) -> bool {
        let synced = self.mr_sync.apply_incoming(self.device.mrs_mut());
        self.mr_sync.flush();
        let mut n = usize::from(synced);
        while n < CTL_PER_POLL + usize::from(synced) {
            let Some(msg) = self.ctl.poll_pop() else {
                break;
            };
            n += 1;
            self.handle_ctl(now, msg);
        }
        n > 0
    }

    pub(super) fn handle_ctl(&mut self, now: Instant, msg: Ctl) {
        match msg {
            Ctl::Shutdown => self.stopping = true,
            Ctl::Listen {
                port,
                backlog,
                reply,
            } => {
                let addr = SocketAddrV4::new(self.iface.ip(), port);
                let r = match self.iface.stack_mut().listen(addr, backlog) {
                    Ok(()) => {
                        self.listening.push(port);
                        CtlReply::Done
                    }
                    Err(e) => CtlReply::Failed(Error::Stack(e)),
                };
                let _ = reply.send(r);
            }
            Ctl::Connect {
                qp,
                remote,
                params,
                reply,
            } => {
                let _ = reply.send(CtlReply::from(self.connect(now, qp, remote, params)));
            }
            Ctl::Accept {
                conn,
                qp,
                params,
                reply,
            } => {
                let _ = reply.send(CtlReply::from(self.accept(now, conn, qp, params)));
            }
            Ctl::Reject {
                conn,
                private_data,
                reply,
            } => {
                let _ = reply.send(CtlReply::from(self.reject(now, conn, private_data)));
            }
            Ctl::RegMr {
                stag,
                pd,
                region,
                offset,
                len,
                iova,
                access,
                reply,
            } => {
                let span = MemSpan::new(region.handle(), offset, len);
                // The port learns the memory first (DPDK: registered with
                // EAL and DMA-mapped); a failure fails the registration.
                if let Err(m) = self.queue.register_region(&region) {
                    let _ = reply.send(CtlReply::Failed(Error::Device(m)));
                    return;
                }
                let r = match self
                    .device
                    .mrs_mut()
                    .reg_mr_at(stag, pd, span, iova, access)
                {
                    Ok(_) => {
                        self.mem.insert(&region);
                        CtlReply::Done
                    }
                    Err(e) => CtlReply::Failed(Error::Verbs(e)),
                };
                let _ = reply.send(r);
            }
            Ctl::AllocMr {
                stag,
                pd,
                max_len,
                region,
                reply,
            } => {
                let r = match self.device.mrs_mut().alloc_mr_at(stag, pd, max_len) {
                    Ok(_) => {
                        self.mem.insert(&region);
                        CtlReply::Done
                    }
                    Err(e) => CtlReply::Failed(Error::Verbs(e)),
                };
                let _ = reply.send(r);
            }
            Ctl::DeallocMr {
                stag,
                region,
                reply,
            } => {
                // Whatever key fast registration gave it since.
                let current = self.device.mrs().query_mr(stag).map(|i| i.stag);
                let r = match current.map(|s| self.device.dereg_mr(s)) {
                    Some(Ok(DeregStatus::Done)) => {
                        self.mem.release(region);
                        CtlReply::Dereg(DeregStatus::Done)
                    }
                    Some(Ok(DeregStatus::Pending)) => {
                        self.dereg_pending.push((stag, region));
                        CtlReply::Dereg(DeregStatus::Pending)
                    }
                    Some(Err(e)) => CtlReply::Failed(Error::Verbs(e)),
                    None => CtlReply::Failed(Error::Verbs(VerbsError::InvalidStag)),
                };
                let _ = reply.send(r);
            }
            Ctl::DeregMr { stag, reply } => {
                let handle = self.device.mrs().query_mr(stag).map(|i| i.mem.region);
                let r = match (self.device.dereg_mr(stag), handle) {
                    (Ok(DeregStatus::Done), Some(h)) => {
                        self.mem.release(h);
                        CtlReply::Dereg(DeregStatus::Done)
                    }
                    (Ok(DeregStatus::Pending), Some(h)) => {
                        self.dereg_pending.push((stag, h));
                        CtlReply::Dereg(DeregStatus::Pending)
                    }
                    (Ok(s), None) => CtlReply::Dereg(s),
                    (Err(e), _) => CtlReply::Failed(Error::Verbs(e)),
                };
                let _ = reply.send(r);
            }
            Ctl::Disconnect { qpn, slot, abort } => {
                // The slot the queue pair was bound to, checked: a scan
                // of every connection per disconnect made ending N
                // connections take time in N².
                let is_qp = |c: &Conn| c.shared.as_ref().is_some_and(|s| s.qpn == qpn);
                let at = usize::try_from(slot).ok().filter(|&i| {
                    self.conns
                        .get(i)
                        .and_then(Option::as_ref)
                        .is_some_and(is_qp)
                });
                let c = match at {
                    Some(i) => self.conns.get_mut(i).and_then(Option::as_mut),
                    None => self.conns.iter_mut().flatten().find(|c| is_qp(c)),
                };
                let Some(c) = c else {
                    return;
                };
                // An orderly close goes through the engine (queued work
                // completes first); anything else resets TCP.
                let orderly = !abort
                    && c.ep.as_mut().is_some_and(|ep| {
                        ep.disconnect(&mut env(
                            &mut self.device,
                            &mut self.mem,
                            &mut c.cq,
                            &mut c.rcq,
                        ))
                        .is_ok()
                    });
                self.ready.mark(c.tcp.index);
                if !orderly {
                    if let Some(t) = self.iface.stack_mut().conn_mut(c.tcp) {
                        c.ending.get_or_insert(DisconnectReason::LocalAbort);
                        t.abort(now);
                    }
                }
            }
        }
    }

    /// Deregistrations that waited for pins and have now finished.
    pub(super) fn mr_events(&mut self) {
        while let Some(MrEvent::Deregistered(stag)) = self.device.mrs_mut().poll_event() {
            // By index: a fast-register region's key may have changed.
            let mut pending = self.dereg_pending.iter();
            if let Some(i) = pending.position(|(s, _)| s.index() == stag.index()) {
                let (stag, h) = self.dereg_pending.swap_remove(i);
                self.mem.release(h);
                let _ = self.out.send(WorkerMsg::MrReleased { stag });
            }
        }
    }
}
