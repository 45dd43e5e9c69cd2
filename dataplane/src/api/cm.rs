//! Connection management for the application: listen, connect, accept,
//! reject and disconnect as control messages to the workers, and the
//! event channel the workers' CM events arrive on ([`EventScope`]
//! narrows it to one thread's connections).

use core::net::SocketAddrV4;
use core::time::Duration;
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdmap::verbs::{QpNum, Stag};

use crate::ctl::{CmEvent, ConnectRequest, ConnectionInfo, Error, QpStatus};
use crate::ctl::{ConnParams, Ctl, QpShared, WorkerMsg};

use super::control::{lock, Control};
use super::handles::Qp;
use super::{Dataplane, MAX_PRIVATE_DATA};

/// Parameters of [`Dataplane::connect`] and [`Dataplane::accept`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// Inbound RDMA Read depth asked for (capped at the QP's).
    pub ird: u16,
    /// Outbound RDMA Read depth asked for (capped at the QP's).
    pub ord: u16,
    /// Private data for the peer (at most [`MAX_PRIVATE_DATA`]).
    pub private_data: Vec<u8>,
}

impl Default for ConnectParams {
    fn default() -> ConnectParams {
        ConnectParams {
            ird: 16,
            ord: 16,
            private_data: Vec::new(),
        }
    }
}

impl Dataplane {
    /// Listens for connections on `port` on every worker (the passive
    /// side's connection lands on the worker its packets reach). Listening
    /// on a port this dataplane listens on already changes nothing and is
    /// not an error: a server that takes one client after another may call
    /// it before each (requests that arrive in between stay queued).
    pub fn listen(&self, port: u16, backlog: usize) -> Result<(), Error> {
        let mut c = lock(&self.control);
        if c.listening.contains(&port) {
            return Ok(());
        }
        for r in self.broadcast(|reply| Ctl::Listen {
            port,
            backlog,
            reply,
        }) {
            r?;
        }
        c.listening.push(port);
        Ok(())
    }

    pub(super) fn check_params(p: &ConnectParams) -> Result<(), Error> {
        if p.private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::InvalidArgument("private data longer than 252 bytes"));
        }
        Ok(())
    }

    pub(super) fn conn_params(p: &ConnectParams) -> ConnParams {
        ConnParams {
            ird: p.ird,
            ord: p.ord,
            private_data: p.private_data.clone(),
        }
    }

    /// Opens a connection from `qp` to `remote` (`rdma_connect`). The QP
    /// goes to the next worker in turn; [`CmEvent::Established`],
    /// [`CmEvent::Rejected`] or [`CmEvent::ConnectFailed`] follows.
    pub fn connect(
        &self,
        qp: &Qp,
        remote: SocketAddrV4,
        params: &ConnectParams,
    ) -> Result<(), Error> {
        Dataplane::check_params(params)?;
        if qp.status() != QpStatus::Idle || qp.worker().is_some() {
            return Err(Error::QpInUse);
        }
        let w = self.next_connect.fetch_add(1, Ordering::Relaxed) % self.workers.len();
        let _c = lock(&self.control);
        self.call(w, |reply| Ctl::Connect {
            qp: qp.inner.clone(),
            remote,
            params: Dataplane::conn_params(params),
            reply,
        })?;
        Ok(())
    }

    /// Accepts `req` on `qp` (`rdma_accept`): the QP is bound to the
    /// worker that owns the connection, and [`CmEvent::Established`]
    /// follows.
    pub fn accept(
        &self,
        req: &ConnectRequest,
        qp: &Qp,
        params: &ConnectParams,
    ) -> Result<(), Error> {
        Dataplane::check_params(params)?;
        if qp.status() != QpStatus::Idle || qp.worker().is_some() {
            return Err(Error::QpInUse);
        }
        let _c = lock(&self.control);
        self.call(req.worker, |reply| Ctl::Accept {
            conn: req.conn,
            qp: qp.inner.clone(),
            params: Dataplane::conn_params(params),
            reply,
        })?;
        Ok(())
    }

    /// Refuses `req` with `private_data` (`rdma_reject`).
    pub fn reject(&self, req: &ConnectRequest, private_data: &[u8]) -> Result<(), Error> {
        if private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::InvalidArgument("private data longer than 252 bytes"));
        }
        let _c = lock(&self.control);
        self.call(req.worker, |reply| Ctl::Reject {
            conn: req.conn,
            private_data: private_data.to_vec(),
            reply,
        })?;
        Ok(())
    }

    /// Ends `qp`'s connection: TCP is closed after what is queued
    /// (`abort`: reset at once). [`CmEvent::Disconnected`] follows.
    pub fn disconnect(&self, qp: &Qp, abort: bool) -> Result<(), Error> {
        let w = qp
            .worker()
            .ok_or(Error::InvalidArgument("queue pair not connected"))?;
        let h = self.workers.get(w).ok_or(Error::WorkerGone)?;
        h.ctl
            .send(Ctl::Disconnect {
                qpn: qp.num(),
                slot: qp.inner.slot(),
                abort,
            })
            .map_err(|_| Error::WorkerGone)
    }

    pub(super) fn take_msg(&self, c: &mut Control, msg: WorkerMsg) {
        match msg {
            WorkerMsg::Event(e) => {
                if let CmEvent::Established { qp, info } = &e {
                    self.record_connection(*qp, info);
                }
                c.events.push_back(e)
            }
            WorkerMsg::MrReleased { stag } => {
                let left = c.deregs.get_mut(&stag.0).map(|n| {
                    *n -= 1;
                    *n
                });
                if left == Some(0) {
                    c.deregs.remove(&stag.0);
                    let _ = c.device.dereg_mr(stag);
                    c.events.push_back(CmEvent::MrDeregistered(stag));
                }
            }
        }
    }

    /// The next connection-management event, if any (within the calling
    /// thread's [`EventScope`], if it has one).
    pub fn poll_event(&self) -> Option<CmEvent> {
        if EventScope::active() {
            return self.poll_event_where(EventScope::claims);
        }
        let mut c = lock(&self.control);
        while let Ok(msg) = self.events.try_recv() {
            self.take_msg(&mut c, msg);
        }
        c.events.pop_front()
    }

    /// The first queued event `want` takes, if any; the others stay queued
    /// in their order.
    pub fn poll_event_where(&self, want: impl Fn(&CmEvent) -> bool) -> Option<CmEvent> {
        let mut c = lock(&self.control);
        while let Ok(msg) = self.events.try_recv() {
            self.take_msg(&mut c, msg);
        }
        let i = c.events.iter().position(want)?;
        c.events.remove(i)
    }

    /// Waits up to `timeout` for the next event (running the workers in
    /// [`DriveMode::Inline`](super::DriveMode::Inline)), within the calling thread's
    /// [`EventScope`], if it has one.
    pub fn wait_event(&self, timeout: Duration) -> Option<CmEvent> {
        self.wait_event_where(timeout, |e| !EventScope::active() || EventScope::claims(e))
    }

    /// Waits up to `timeout` until an event `want` takes is queued, and
    /// leaves it there (for a caller that hands the event to code that
    /// waits for it itself); whether one is.
    pub fn await_event_where(&self, timeout: Duration, want: impl Fn(&CmEvent) -> bool) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            {
                let mut c = lock(&self.control);
                while let Ok(msg) = self.events.try_recv() {
                    self.take_msg(&mut c, msg);
                }
                if c.events.iter().any(&want) {
                    return true;
                }
            }
            if !self.wait_for_events(deadline) {
                return false;
            }
        }
    }

    /// One step of an event wait: false once `deadline` has passed;
    /// otherwise drives an inline worker once, or takes the next event
    /// message if one arrives within 20 ms (or by the deadline).
    pub(super) fn wait_for_events(&self, deadline: std::time::Instant) -> bool {
        let now = std::time::Instant::now();
        if now >= deadline {
            return false;
        }
        if self.inline.is_some() {
            self.poll();
        } else if let Ok(msg) = self
            .events
            .recv_timeout((deadline - now).min(Duration::from_millis(20)))
        {
            let mut c = lock(&self.control);
            self.take_msg(&mut c, msg);
        }
        true
    }

    /// Waits up to `timeout` for the first event `want` takes; the others
    /// stay queued.
    pub fn wait_event_where(
        &self,
        timeout: Duration,
        want: impl Fn(&CmEvent) -> bool,
    ) -> Option<CmEvent> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.poll_event_where(&want) {
                return Some(e);
            }
            if !self.wait_for_events(deadline) {
                return None;
            }
        }
    }

    pub(super) fn record_connection(&self, qpn: QpNum, info: &ConnectionInfo) {
        let q = lock(&self.qps).get(qpn);
        if let Some(q) = q {
            *lock(&q.connection) = Some(info.clone());
        }
    }

    /// Resets the connections of the live queue pairs the calling thread
    /// created in its [`EventScope`] (none without one): what a server
    /// thread does after a failed session whose objects it no longer
    /// holds, so that no connection it made stays up; how many it reset.
    pub fn abort_scope_connections(&self) -> usize {
        let live: Vec<Arc<QpShared>> = lock(&self.qps).live();
        live.into_iter()
            .filter(|q| EventScope::owns_qp(q.qpn))
            .map(|inner| Qp { inner })
            .filter(|q| matches!(q.status(), QpStatus::Connected | QpStatus::Connecting))
            .filter(|q| self.disconnect(q, true).is_ok())
            .count()
    }

    /// Ends the connection of every live queue pair that has one or is
    /// setting one up (`abort`: reset at once), as a service does before
    /// it stops; how many it asked to end.
    pub fn disconnect_all(&self, abort: bool) -> usize {
        let live: Vec<Arc<QpShared>> = lock(&self.qps).live();
        live.into_iter()
            .map(|inner| Qp { inner })
            .filter(|q| matches!(q.status(), QpStatus::Connected | QpStatus::Connecting))
            .filter(|q| self.disconnect(q, abort).is_ok())
            .count()
    }
}

/// What the calling thread's scope claims.
#[derive(Debug, Default)]
pub(super) struct ScopeState {
    pub(super) ports: Vec<u16>,
    pub(super) qps: HashSet<u32>,
    pub(super) stags: HashSet<u32>,
}

thread_local! {
    static EVENT_SCOPE: RefCell<Option<ScopeState>> = const { RefCell::new(None) };
}

/// While alive, the calling thread's [`Dataplane::poll_event`] and
/// [`Dataplane::wait_event`] return only the events it claims: connection
/// requests to its ports, events of the queue pairs it created and
/// deregistrations of the memory it registered (STag index), on this
/// thread while the scope lives. Other events stay queued for the threads
/// they belong to. Scopes do not nest: a new one replaces the thread's
/// current one until it is dropped.
#[derive(Debug)]
pub struct EventScope {
    previous: Option<ScopeState>,
    /// Tied to its thread.
    _thread: core::marker::PhantomData<*const ()>,
}

impl EventScope {
    /// A scope on this thread claiming connection requests to `ports`.
    pub fn enter(ports: &[u16]) -> EventScope {
        let state = ScopeState {
            ports: ports.to_vec(),
            ..ScopeState::default()
        };
        let previous = EVENT_SCOPE.with(|s| s.borrow_mut().replace(state));
        EventScope {
            previous,
            _thread: core::marker::PhantomData,
        }
    }

    pub(super) fn active() -> bool {
        EVENT_SCOPE.with(|s| s.borrow().is_some())
    }

    /// Whether the calling thread's scope (if any) claims `e`.
    pub(super) fn claims(e: &CmEvent) -> bool {
        EVENT_SCOPE.with(|s| {
            let s = s.borrow();
            let Some(s) = s.as_ref() else {
                return true;
            };
            match e {
                CmEvent::ConnectRequest(r) => s.ports.contains(&r.local_port),
                CmEvent::RequestRefused(r) => s.ports.contains(&r.local_port),
                CmEvent::Established { qp, .. }
                | CmEvent::Rejected { qp, .. }
                | CmEvent::ConnectFailed { qp, .. }
                | CmEvent::Disconnected { qp, .. } => s.qps.contains(&qp.0),
                CmEvent::MrDeregistered(stag) => s.stags.contains(&(stag.0 >> 8)),
            }
        })
    }

    pub(super) fn owns_qp(qpn: QpNum) -> bool {
        EVENT_SCOPE.with(|s| s.borrow().as_ref().is_some_and(|s| s.qps.contains(&qpn.0)))
    }

    /// Forgets the numbers of queue pairs that are gone, so that a
    /// long-lived scope stays small.
    pub(super) fn forget_qps(alive: impl Fn(u32) -> bool) {
        EVENT_SCOPE.with(|s| {
            if let Some(s) = s.borrow_mut().as_mut() {
                s.qps.retain(|&n| alive(n));
            }
        });
    }

    pub(super) fn scope_qps() -> usize {
        EVENT_SCOPE.with(|s| s.borrow().as_ref().map_or(0, |s| s.qps.len()))
    }

    pub(super) fn claim_qp(qpn: QpNum) {
        EVENT_SCOPE.with(|s| {
            if let Some(s) = s.borrow_mut().as_mut() {
                s.qps.insert(qpn.0);
            }
        });
    }

    pub(super) fn claim_stag(stag: Stag) {
        EVENT_SCOPE.with(|s| {
            if let Some(s) = s.borrow_mut().as_mut() {
                // By index: a fast-register STag's key may change.
                s.stags.insert(stag.0 >> 8);
            }
        });
    }
}

impl Drop for EventScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        EVENT_SCOPE.with(|s| *s.borrow_mut() = previous);
    }
}
