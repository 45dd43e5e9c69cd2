//! The control plane: the authoritative protection domains, STag and
//! queue-pair number allocation, and the calls that create and destroy
//! verbs objects, sending the workers the control messages that mirror
//! them and waiting for their answers.

use core::time::Duration;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use crossbeam_queue::ArrayQueue;
use rdmap::placement::MemSpan;
use rdmap::verbs::{CqId, Device, QpInitAttr, SrqInitAttr, VerbsError, MAX_SGE};

use rdmap::verbs::{Access, DeregStatus, PdId, QpNum};

use crate::ctl::wr_ring::WrRing;
use crate::memory::Region;

use crate::ctl::{CmEvent, Error, QpStatus};
use crate::ctl::{CqShared, Ctl, CtlReply, QpCounters, QpShared, SrqShared, UNBOUND};
use crate::memory::MemoryError;

use super::cm::EventScope;
use super::handles::{Cq, FastRegMr, MemoryRegistration, ProtectionDomain, Qp, QpOptions, Srq};
use super::{Dataplane, CONTROL_TIMEOUT};

#[derive(Debug)]
pub(super) struct Control {
    /// The authoritative protection domains and STag allocation; workers
    /// mirror the registrations under the same STags.
    pub(super) device: Device,
    pub(super) pds: Vec<PdId>,
    /// Domains given back with [`Dataplane::release_pd`] while something
    /// still belonged to them.
    pub(super) pd_release: Vec<PdId>,
    pub(super) next_qpn: u32,
    pub(super) next_cq: u32,
    /// Deregistrations waiting for workers: STag → workers still pinning.
    pub(super) deregs: HashMap<u32, usize>,
    pub(super) events: VecDeque<CmEvent>,
    /// Ports listened on (a second `listen` on one of them is a no-op).
    pub(super) listening: Vec<u16>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a panic on another application thread; the
    // state behind it is updated in single statements and stays usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Dataplane {
    pub(super) fn wait(&self, rx: &Receiver<CtlReply>) -> Result<CtlReply, Error> {
        let deadline = std::time::Instant::now() + CONTROL_TIMEOUT;
        loop {
            match rx.try_recv() {
                Ok(r) => return Ok(r),
                Err(TryRecvError::Disconnected) => return Err(Error::WorkerGone),
                Err(TryRecvError::Empty) => {}
            }
            if self.inline.is_some() {
                self.poll();
            } else {
                match rx.recv_timeout(Duration::from_millis(20)) {
                    Ok(r) => return Ok(r),
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        return Err(Error::WorkerGone)
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                }
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
        }
    }

    /// Refuses a control call that would wait for workers only the
    /// calling thread runs ([`super::BusyPoll`]).
    fn control_allowed(&self) -> Result<(), Error> {
        if self.inline.is_none() && self.busy_here() {
            return Err(Error::BusyPolling);
        }
        Ok(())
    }

    /// Wakes worker `w` if it sleeps: a control message was sent to it.
    pub(super) fn wake_worker(&self, w: usize) {
        if let Some(k) = self.wake.get(w) {
            k.wake();
        }
    }

    /// Sends one control message to worker `w` and waits for its answer.
    pub(super) fn call(
        &self,
        w: usize,
        make: impl FnOnce(Sender<CtlReply>) -> Ctl,
    ) -> Result<CtlReply, Error> {
        self.control_allowed()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let h = self.workers.get(w).ok_or(Error::WorkerGone)?;
        h.ctl.send(make(tx)).map_err(|_| Error::WorkerGone)?;
        self.wake_worker(w);
        match self.wait(&rx)? {
            CtlReply::Failed(e) => Err(e),
            r => Ok(r),
        }
    }

    /// Sends a control message to every worker, then waits for every
    /// answer.
    pub(super) fn broadcast(
        &self,
        make: impl Fn(Sender<CtlReply>) -> Ctl,
    ) -> Vec<Result<CtlReply, Error>> {
        if let Err(e) = self.control_allowed() {
            return self.workers.iter().map(|_| Err(e.clone())).collect();
        }
        let rxs: Vec<_> = self
            .workers
            .iter()
            .enumerate()
            .map(|(w, h)| {
                let (tx, rx) = crossbeam_channel::bounded(1);
                let sent = h.ctl.send(make(tx));
                self.wake_worker(w);
                sent.map(|()| rx).map_err(|_| Error::WorkerGone)
            })
            .collect();
        rxs.into_iter()
            .map(|rx| match self.wait(&rx?)? {
                CtlReply::Failed(e) => Err(e),
                r => Ok(r),
            })
            .collect()
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, Error> {
        let mut c = lock(&self.control);
        // Domains released while still in use go now if they can.
        for id in c.pd_release.clone() {
            let _ = self.dealloc_pd_locked(&mut c, ProtectionDomain { id });
        }
        let id = c.device.alloc_pd()?;
        c.pds.push(id);
        Ok(ProtectionDomain { id })
    }

    /// Frees a protection domain (`ibv_dealloc_pd`): refused with
    /// `Busy` while a memory registration, a shared receive queue or a
    /// queue pair still alive (held by the application or by a worker's
    /// connection) belongs to it. A long-running service makes a domain
    /// per session and gives it back here, so the table never fills.
    pub fn dealloc_pd(&self, pd: ProtectionDomain) -> Result<(), Error> {
        let mut c = lock(&self.control);
        self.dealloc_pd_locked(&mut c, pd)
    }

    /// Frees `pd` as soon as nothing belongs to it any more: now if
    /// possible, otherwise at a later [`Dataplane::alloc_pd`] (queue
    /// pairs held by connections that are still closing, and
    /// deregistrations waiting for data in flight, end on their own). What
    /// a session that is over calls instead of waiting for its objects.
    pub fn release_pd(&self, pd: ProtectionDomain) {
        let mut c = lock(&self.control);
        if !c.pds.contains(&pd.id) || c.pd_release.contains(&pd.id) {
            return;
        }
        if self.dealloc_pd_locked(&mut c, pd).is_err() {
            c.pd_release.push(pd.id);
        }
    }

    pub(super) fn dealloc_pd_locked(
        &self,
        c: &mut Control,
        pd: ProtectionDomain,
    ) -> Result<(), Error> {
        if !c.pds.contains(&pd.id) {
            return Err(Error::Verbs(VerbsError::InvalidPd));
        }
        {
            if lock(&self.qps).any(|q| q.attr.pd == pd.id) {
                return Err(Error::Verbs(VerbsError::Busy));
            }
        }
        // Memory registrations and SRQs are counted by the device.
        c.device.dealloc_pd(pd.id)?;
        c.pds.retain(|&p| p != pd.id);
        c.pd_release.retain(|&p| p != pd.id);
        Ok(())
    }

    /// Creates a completion queue of `cqe` entries (`ibv_create_cq`).
    pub fn create_cq(&self, cqe: u32) -> Result<Cq, Error> {
        if cqe == 0 || cqe > self.limits.max_cqe {
            return Err(Error::InvalidArgument("cqe"));
        }
        let mut c = lock(&self.control);
        let id = c.next_cq;
        c.next_cq += 1;
        Ok(Cq {
            inner: Arc::new(CqShared {
                ring: ArrayQueue::new(cqe as usize),
                id,
            }),
        })
    }

    /// Creates a queue pair in `pd` whose completions go to `send_cq` and
    /// `recv_cq` (`ibv_create_qp`). It is bound to a worker by
    /// [`Dataplane::connect`] or [`Dataplane::accept`].
    pub fn create_qp(
        &self,
        pd: ProtectionDomain,
        send_cq: &Cq,
        recv_cq: &Cq,
        opts: QpOptions,
    ) -> Result<Qp, Error> {
        self.create_qp_with_srq(pd, send_cq, recv_cq, None, opts)
    }

    /// [`Dataplane::create_qp`] whose receives come from `srq` (of the
    /// same protection domain) when given: the queue pair then takes no
    /// receives of its own, and `max_recv_wr` / `max_recv_sge` are
    /// ignored.
    pub fn create_qp_with_srq(
        &self,
        pd: ProtectionDomain,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        opts: QpOptions,
    ) -> Result<Qp, Error> {
        let opts = match srq {
            Some(s) => QpOptions {
                max_recv_wr: 0,
                max_recv_sge: s.inner.max_sge,
                ..opts
            },
            None => opts,
        };
        let l = &self.limits;
        let sge_ok = |n: u32| n <= MAX_SGE as u32;
        if opts.max_send_wr == 0
            || opts.max_send_wr > l.max_qp_wr
            || opts.max_recv_wr > l.max_qp_wr
            || !sge_ok(opts.max_send_sge)
            || !sge_ok(opts.max_recv_sge)
            || opts.max_ord > super::handles::MAX_RD_ATOM
            || opts.max_ird > super::handles::MAX_RD_ATOM
        {
            return Err(Error::Verbs(VerbsError::InvalidValue));
        }
        let mut c = lock(&self.control);
        if !c.pds.contains(&pd.id) {
            return Err(Error::Verbs(VerbsError::InvalidPd));
        }
        if srq.is_some_and(|s| s.inner.pd != pd.id || s.inner.destroyed.load(Ordering::Acquire)) {
            return Err(Error::Verbs(VerbsError::InvalidSrq));
        }
        // The limit is on queue pairs alive at once (held by the
        // application or by a worker's connection), not on how many were
        // ever made: a service makes new ones for every client.
        let mut reg = lock(&self.qps);
        if reg.full(l.max_qp as usize) {
            return Err(Error::Verbs(VerbsError::TableFull));
        }
        // Numbers are not reused while the counter lasts; after it wraps,
        // one still in use is skipped (0 is never given).
        let mut n = c.next_qpn.max(1);
        while reg.in_use(n) {
            n = n.checked_add(1).unwrap_or(1);
        }
        c.next_qpn = n.checked_add(1).unwrap_or(1);
        let qpn = QpNum(n);
        let attr = QpInitAttr {
            pd: pd.id,
            send_cq: CqId(send_cq.id()),
            recv_cq: CqId(recv_cq.id()),
            srq: srq.map(|s| s.inner.id),
            max_send_wr: opts.max_send_wr,
            max_recv_wr: opts.max_recv_wr,
            max_send_sge: opts.max_send_sge,
            max_recv_sge: opts.max_recv_sge,
            max_ord: opts.max_ord,
            max_ird: opts.max_ird,
            sq_sig_all: opts.sq_sig_all,
        };
        let qp = Qp {
            inner: Arc::new(QpShared {
                qpn,
                attr,
                sq: WrRing::new(opts.max_send_wr as usize),
                rq: WrRing::new(opts.max_recv_wr.max(1) as usize),
                send_cq: send_cq.inner.clone(),
                recv_cq: recv_cq.inner.clone(),
                srq: srq.map(|s| s.inner.clone()),
                status: AtomicU8::new(QpStatus::Idle as u8),
                worker: AtomicUsize::new(UNBOUND),
                doorbell: AtomicBool::new(false),
                slot: AtomicU32::new(u32::MAX),
                wake: self.wake.clone(),
                counters: QpCounters::default(),
                connection: Mutex::new(None),
            }),
        };
        reg.insert(&qp.inner);
        if EventScope::scope_qps() > 2 * reg.len() + 64 {
            EventScope::forget_qps(|n| reg.in_use(n));
        }
        drop(reg);
        drop(c);
        EventScope::claim_qp(qpn);
        Ok(qp)
    }

    /// Registers `len` bytes of `region` from `offset` in `pd` with
    /// `access` (`ibv_reg_mr`): the STag is valid on every worker when
    /// this returns. Tagged offsets are virtual addresses.
    pub fn reg_mr(
        &self,
        pd: ProtectionDomain,
        region: &Region,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegistration, Error> {
        match offset.checked_add(len) {
            Some(end) if len > 0 && end <= region.len() => {}
            _ => return Err(Error::Memory(MemoryError::OutOfBounds)),
        }
        let mut c = lock(&self.control);
        if !c.pds.contains(&pd.id) {
            return Err(Error::Verbs(VerbsError::InvalidPd));
        }
        let span = MemSpan::new(region.handle(), offset as u64, len as u64);
        let iova = region.addr() + offset as u64;
        let stag = c.device.reg_mr(pd.id, span, iova, access)?;
        let results = self.broadcast(|reply| Ctl::RegMr {
            stag,
            pd: pd.id,
            region: region.clone(),
            offset: offset as u64,
            len: len as u64,
            iova,
            access,
            reply,
        });
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            // Undo on the workers that took it (none pins it yet).
            let _ = self.broadcast(|reply| Ctl::DeregMr { stag, reply });
            let _ = c.device.dereg_mr(stag);
            return Err(e);
        }
        EventScope::claim_stag(stag);
        Ok(MemoryRegistration {
            stag,
            addr: iova,
            len: len as u64,
            region: region.clone(),
            offset,
        })
    }

    /// Deregisters (`ibv_dereg_mr`). [`DeregStatus::Pending`] while data
    /// in flight (an unacknowledged FPDU, a Read Response) still refers to
    /// the memory: the STag is dead at once, and
    /// [`CmEvent::MrDeregistered`] says when the memory is free.
    pub fn dereg_mr(&self, mr: &MemoryRegistration) -> Result<DeregStatus, Error> {
        let mut c = lock(&self.control);
        let stag = mr.stag;
        let mut pending = 0;
        for r in self.broadcast(|reply| Ctl::DeregMr { stag, reply }) {
            if let CtlReply::Dereg(DeregStatus::Pending) = r? {
                pending += 1;
            }
        }
        if pending == 0 {
            c.device.dereg_mr(stag)?;
            Ok(DeregStatus::Done)
        } else {
            c.deregs.insert(stag.0, pending);
            Ok(DeregStatus::Pending)
        }
    }

    /// Creates a shared receive queue of `max_wr` receives of up to
    /// `max_sge` SGEs in `pd` (`ibv_create_srq`); queue pairs use it through
    /// [`Dataplane::create_qp_with_srq`], on any worker.
    pub fn create_srq(
        &self,
        pd: ProtectionDomain,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Srq, Error> {
        let mut c = lock(&self.control);
        if !c.pds.contains(&pd.id) {
            return Err(Error::Verbs(VerbsError::InvalidPd));
        }
        let attr = SrqInitAttr {
            max_wr,
            max_sge,
            srq_limit: 0,
        };
        // The control path's device checks the limits and numbers it; the
        // buffers live in the ring below.
        let id = c.device.create_srq(pd.id, attr)?.id();
        Ok(Srq {
            inner: Arc::new(SrqShared {
                id,
                pd: pd.id,
                max_sge,
                ring: WrRing::shared(max_wr as usize),
                limit: AtomicU32::new(0),
                limit_reached: AtomicBool::new(false),
                destroyed: AtomicBool::new(false),
            }),
        })
    }

    /// Destroys a shared receive queue (`ibv_destroy_srq`): refused with
    /// `Busy` while a queue pair created on it is alive (held by the
    /// application or by a worker's connection that is still closing), as
    /// [`Dataplane::dealloc_pd`] is. Receives still posted are dropped
    /// without completions, later posts fail with
    /// [`PostError::InvalidState`](super::PostError::InvalidState), and its slot in the device's table
    /// (and its hold on the protection domain) is given back, so that a
    /// service that makes one per session never runs out.
    pub fn destroy_srq(&self, srq: &Srq) -> Result<(), Error> {
        let mut c = lock(&self.control);
        if srq.inner.destroyed.load(Ordering::Acquire) {
            return Err(Error::Verbs(VerbsError::InvalidSrq));
        }
        {
            if lock(&self.qps).any(|q| q.attr.srq == Some(srq.inner.id)) {
                return Err(Error::Verbs(VerbsError::Busy));
            }
        }
        c.device.destroy_srq(srq.inner.id).map_err(|e| match e {
            VerbsError::Busy => VerbsError::Busy,
            _ => VerbsError::InvalidSrq,
        })?;
        srq.inner.destroyed.store(true, Ordering::Release);
        while srq.inner.ring.pop().is_some() {}
        // A domain released while the queue held it may go now.
        for id in c.pd_release.clone() {
            let _ = self.dealloc_pd_locked(&mut c, ProtectionDomain { id });
        }
        Ok(())
    }

    /// Allocates a fast-register region of up to `max_len` bytes of
    /// `region` in `pd` (`ib_alloc_mr`): its STag is known, invalid, to
    /// every worker when this returns.
    pub fn alloc_mr(
        &self,
        pd: ProtectionDomain,
        region: &Region,
        max_len: u64,
    ) -> Result<FastRegMr, Error> {
        if max_len == 0 || max_len > region.len() as u64 {
            return Err(Error::Memory(MemoryError::OutOfBounds));
        }
        let mut c = lock(&self.control);
        if !c.pds.contains(&pd.id) {
            return Err(Error::Verbs(VerbsError::InvalidPd));
        }
        let stag = c.device.alloc_mr(pd.id, max_len)?;
        let results = self.broadcast(|reply| Ctl::AllocMr {
            stag,
            pd: pd.id,
            max_len,
            region: region.clone(),
            reply,
        });
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            let handle = region.handle();
            let _ = self.broadcast(|reply| Ctl::DeallocMr {
                stag,
                region: handle,
                reply,
            });
            let _ = c.device.dereg_mr(stag);
            return Err(e);
        }
        EventScope::claim_stag(stag);
        Ok(FastRegMr {
            stag,
            pd: pd.id,
            max_len,
            region: region.clone(),
        })
    }

    /// Frees a fast-register region (`ib_dereg_mr`), whatever its state:
    /// as [`Dataplane::dereg_mr`], [`DeregStatus::Pending`] while data in
    /// flight still refers to its memory, then
    /// [`CmEvent::MrDeregistered`].
    pub fn dealloc_mr(&self, mr: &FastRegMr) -> Result<DeregStatus, Error> {
        let mut c = lock(&self.control);
        let (stag, handle) = (mr.stag, mr.region.handle());
        let mut pending = 0;
        for r in self.broadcast(|reply| Ctl::DeallocMr {
            stag,
            region: handle,
            reply,
        }) {
            if let CtlReply::Dereg(DeregStatus::Pending) = r? {
                pending += 1;
            }
        }
        if pending == 0 {
            c.device.dereg_mr(stag)?;
            Ok(DeregStatus::Done)
        } else {
            c.deregs.insert(stag.0, pending);
            Ok(DeregStatus::Pending)
        }
    }
}
