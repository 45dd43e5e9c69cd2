//! Per-connection lifecycle: connections come into being here (an active
//! open from a control message, a passive one from a listener's accept
//! queue), are serviced once per iteration (TCP events, in-order payload
//! to the QP engine, posted work requests, engine events, CM events for
//! the application) and are removed once TCP has ended.

use core::net::{Ipv4Addr, SocketAddrV4};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::Sender;
use rdmap::engine::{Endpoint, EngineEvent, Env, SetupFailure};
use rdmap::mpa::RtrSet;
use rdmap::verbs::{
    CompletionQueue, CqId, Device, QpNum, QueuePair, RecvWr, SendWr, WorkCompletion,
};
use rdmap::verbs::{MrTable, QpInitAttr, SendOp, SharedReceiveQueue, SrqInitAttr};
use tcp_offload::room::room_at_first_use;
use tcp_offload::tcp::{self, ConnId, Event, Stack, StackError};
use tcp_offload::Instant;

use crate::ctl::{
    CmEvent, ConnParams, ConnectFailure, ConnectRequest, ConnectionInfo, DisconnectReason, Error,
    QpShared, QpStatus, RefusedRequest, SrqSupply, WorkerMsg,
};
use crate::link::LinkQueue;
use crate::memory::MemoryTable;

use super::clock::engine_time;
use super::counters::{bump, WorkerCounters};
use super::records::{RecordRef, Records};
use super::rx::RxFrame;
use super::stag_mesh::{prepare_local, Hold, LocalOp, MrSyncLinks};
use super::tx::{return_dropped, Fill};
use super::{Worker, ACCEPT_PER_POLL, MAX_CHUNKS_PER_POLL, MAX_POSTS_PER_POLL};

/// Whether a connection in `state` still has a close to finish: TIME-WAIT
/// has exchanged and acknowledged both FINs.
pub(super) fn is_open(state: tcp::State) -> bool {
    !matches!(state, tcp::State::Closed | tcp::State::TimeWait)
}

/// Where a connection stands: its one lifecycle. A queue pair's status,
/// as the application reads it ([`QpStatus`]), is this state published
/// ([`Life::status`]); it is written nowhere else. The endpoint keeps
/// the protocol's own state (MPA setup, the RFC 5040 queue pair states)
/// and reports its changes as events, which move the lifecycle on.
#[derive(Debug)]
pub(super) enum Life {
    /// Passive: the endpoint gathers the MPA request (its setup timer
    /// runs), and refuses by itself what the configuration cannot take.
    Request,
    /// Passive: the application has heard of the request; its accept or
    /// reject has not come.
    Decision,
    /// Active: TCP's handshake runs; the endpoint starts when it is done.
    TcpConnecting {
        qp: Box<QueuePair>,
        config: rdmap::mpa::Config,
        private_data: Vec<u8>,
    },
    /// MPA setup runs in the endpoint (active: our request went out;
    /// passive: the application accepted).
    Setup,
    /// The stream is up; the application heard so.
    Up,
    /// Up, and the endpoint asked for TCP to be closed (an orderly close,
    /// or a Terminate under way).
    Closing,
    /// Nothing is left to tell the application (it heard how the
    /// connection ended, or never had a queue pair on it): only TCP's end
    /// remains.
    Down,
}

impl Life {
    /// The queue pair's status in this state (`None` before the
    /// application has given one).
    pub(super) fn status(&self) -> Option<QpStatus> {
        match self {
            Life::Request | Life::Decision => None,
            Life::TcpConnecting { .. } | Life::Setup => Some(QpStatus::Connecting),
            Life::Up | Life::Closing => Some(QpStatus::Connected),
            Life::Down => Some(QpStatus::Disconnected),
        }
    }

    /// Whether the application heard that the stream is up and has not
    /// heard of its end.
    fn is_up(&self) -> bool {
        matches!(self, Life::Up | Life::Closing)
    }
}

/// How TCP ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TcpEnd {
    Closed,
    Reset,
    TimedOut,
}

/// How far TCP's byte stream has gone, as TCP reported it. The endpoint
/// learns each step once it has taken every in-order byte before it (its
/// handlers take a repeated report as a no-op).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stream {
    Open,
    /// The peer's FIN arrived.
    PeerClosed,
    /// The connection is gone.
    Ended(TcpEnd),
}

#[derive(Debug)]
pub(super) struct Conn {
    pub(super) tcp: ConnId,
    pub(super) remote: SocketAddrV4,
    pub(super) local_port: u16,
    pub(super) life: Life,
    pub(super) stream: Stream,
    pub(super) ep: Option<Endpoint>,
    /// The application's QP (none for a connection being rejected or not
    /// accepted yet).
    pub(super) shared: Option<Arc<QpShared>>,
    /// Send-queue completions staged between the engine and the CQ ring
    /// (its id is the QP's send CQ's, as the queue pair checks).
    pub(super) cq: CompletionQueue,
    /// Receive completions, likewise.
    pub(super) rcq: CompletionQueue,
    /// Completions a full CQ ring refused; delivered first next time
    /// (with whether they are receive completions). Allocated at its
    /// first use, like `local_ops` and `unexamined` ([`Room`]).
    pub(super) backlog: VecDeque<(WorkCompletion, bool)>,
    /// Why the stream is ending, once known before TCP's end says it: a
    /// Terminate, or our abort.
    pub(super) ending: Option<DisconnectReason>,
    /// A send work request the QP could not take yet.
    pub(super) stash_send: Option<SendWr>,
    pub(super) stash_recv: Option<RecvWr>,
    /// This worker's end of the QP's shared receive queue: takes each
    /// buffer from the application's ring when a Send begins.
    pub(super) srq: Option<SharedReceiveQueue>,
    /// Fast registrations and local invalidations in the engine, oldest
    /// first.
    pub(super) local_ops: VecDeque<LocalOp>,
    /// A completion waiting for the other workers' STag replicas.
    pub(super) hold: Option<Hold>,
    /// Completions taken out of the engine's bounded CQs while one is
    /// held (so that those cannot overflow meanwhile), not examined yet.
    pub(super) unexamined: VecDeque<(WorkCompletion, bool)>,
    /// Service again next iteration (an abort this one).
    pub(super) kick: bool,
    /// The deadline of this connection's current entry in the worker's
    /// setup deadlines (`deadlines.rs`; a lower bound of
    /// [`Conn::next_due`]), if it has one.
    pub(super) timed: Option<Instant>,
    /// The engine may have records beyond the one queued ahead of the
    /// connection's turn ([`Fill`]): the turn tops the queue up.
    pub(super) more: bool,
    /// The application may have posted to the queue pair's submission
    /// rings since they were last seen empty: set when the slot comes
    /// out of the worker's posted ring (the doorbell), on a ring
    /// overflow, at binding and on entering `Life::Up`; cleared only when
    /// a drain of a connection that is up finds both rings empty, so it
    /// stays set while a drain leaves work behind. A visit for traffic alone then reads
    /// nothing of the shared state (doorbell, ring indices): with
    /// thousands of connections those lines are cold at every visit.
    pub(super) posted: bool,
    /// Small records built in an iteration: the iteration and how many
    /// ([`MAX_SMALL_FPDUS_PER_ITERATION`](super::tx::MAX_SMALL_FPDUS_PER_ITERATION)).
    pub(super) small_built: (u64, usize),
    /// What `backlog`, `local_ops` and `unexamined` can hold at most.
    pub(super) room: Room,
}

/// The most entries each of a connection's queues for the rare cases
/// ever holds: completions a full CQ ring refused, local operations in
/// the engine, completions taken out while one is held. Each queue gets
/// this room at its first use, once, so that it never grows after; a
/// connection that never meets the case (most, and every idle one) pays
/// nothing for it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Room {
    pub(super) backlog: usize,
    pub(super) local_ops: usize,
    pub(super) unexamined: usize,
}

impl Conn {
    pub(super) fn new(
        tcp: ConnId,
        remote: SocketAddrV4,
        local_port: u16,
        life: Life,
        ep: Option<Endpoint>,
    ) -> Conn {
        Conn {
            tcp,
            remote,
            local_port,
            life,
            stream: Stream::Open,
            ep,
            shared: None,
            cq: CompletionQueue::new(CqId(0), 1),
            rcq: CompletionQueue::new(CqId(0), 1),
            backlog: VecDeque::new(),
            ending: None,
            stash_send: None,
            stash_recv: None,
            srq: None,
            local_ops: VecDeque::new(),
            hold: None,
            unexamined: VecDeque::new(),
            kick: false,
            timed: None,
            more: false,
            posted: true,
            small_built: (0, 0),
            room: Room::default(),
        }
    }

    /// Moves the lifecycle on, and publishes the queue pair's status.
    pub(super) fn enter(&mut self, life: Life) {
        if let (Some(q), Some(s)) = (&self.shared, life.status()) {
            q.set_status(s);
        }
        // Posts made while the connection came up are looked for once
        // more, whatever rang for them.
        self.posted |= matches!(life, Life::Up);
        self.life = life;
    }

    pub(super) fn bind(&mut self, shared: Arc<QpShared>) {
        let a = shared.attr;
        // Receives that can complete between two deliveries: those posted
        // to the queue pair, or to its shared receive queue.
        let recvs = shared
            .srq
            .as_ref()
            .map_or(a.max_recv_wr, |s| s.capacity() as u32);
        self.cq = CompletionQueue::new(a.send_cq, a.max_send_wr + 8);
        self.rcq = CompletionQueue::new(a.recv_cq, recvs + 8);
        self.room = Room {
            backlog: (a.max_send_wr + a.max_recv_wr) as usize + 16,
            // Sends stop draining while a completion is held, so at most
            // two send queues' worth of local operations are ever tracked.
            local_ops: 2 * a.max_send_wr as usize + 8,
            unexamined: (a.max_send_wr + recvs) as usize + 16,
        };
        self.srq = match (&shared.srq, a.srq) {
            (Some(srq), Some(id)) => Some(SharedReceiveQueue::with_supply(
                id,
                a.pd,
                SrqInitAttr {
                    max_wr: 1,
                    max_sge: a.max_recv_sge,
                    srq_limit: 0,
                },
                Box::new(SrqSupply::new(srq.clone())),
            )),
            _ => None,
        };
        self.shared = Some(shared);
        self.posted = true;
    }

    /// Whether the connection needs another service though nothing new
    /// reached it (see [`super::ready`]): a completion held for the STag
    /// replicas or refused by a full CQ ring, a work request the QP could
    /// not take yet, an abort whose events are pending,
    /// TCP's end not yet acted on.
    pub(super) fn wants_service(&self) -> bool {
        self.kick
            || self.hold.is_some()
            || !self.backlog.is_empty()
            || !self.unexamined.is_empty()
            || self.stash_send.is_some()
            || self.stash_recv.is_some()
            || matches!(self.stream, Stream::Ended(_))
    }

    /// When a setup timer of the connection comes due, if it has one: the
    /// engine's MPA setup timer (the request's, the reply's) and nudge.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.ep
            .as_ref()
            .and_then(Endpoint::poll_timeout)
            .map(|d| Instant::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX)))
    }

    pub(super) fn qpn(&self) -> QpNum {
        self.shared.as_ref().map_or(QpNum(0), |q| q.qpn)
    }
}

/// The [`Cx`] of worker `$w` at `$now`: its fields borrowed one by one, so
/// that the worker's connection table stays free to borrow beside it.
macro_rules! worker_cx {
    ($w:expr, $now:expr) => {
        Cx {
            now: $now,
            stack: $w.iface.stack_mut(),
            records: &mut $w.records,
            device: &mut $w.device,
            mem: &mut $w.mem,
            counters: &$w.counters,
            out: &$w.out,
            index: $w.index,
            sync: &mut $w.mr_sync,
            epoch: $w.epoch,
            rx_crcs: &$w.rx_crcs,
        }
    };
}
pub(super) use worker_cx;

/// What a connection's service needs from its worker.
pub(super) struct Cx<'a, B> {
    pub(super) now: Instant,
    pub(super) stack: &'a mut Stack<RxFrame<B>, RecordRef>,
    pub(super) records: &'a mut Records,
    pub(super) device: &'a mut Device,
    pub(super) mem: &'a mut MemoryTable,
    pub(super) counters: &'a WorkerCounters,
    pub(super) out: &'a Sender<WorkerMsg>,
    pub(super) index: usize,
    pub(super) sync: &'a mut MrSyncLinks,
    /// The worker's iteration ([`Worker::poll`]), for what is limited
    /// per iteration.
    pub(super) epoch: u64,
    /// The FPDU CRCs the receive pass took in this burst.
    pub(super) rx_crcs: &'a super::rx_pass::RxCrcs,
}

impl<B: AsRef<[u8]>> Cx<'_, B> {
    pub(super) fn event(&self, ev: CmEvent) {
        // The control side has gone only when the dataplane is dropped.
        let _ = self.out.send(WorkerMsg::Event(ev));
    }
}

/// [`env`] for the receive path of a queue pair with a shared receive
/// queue (`srq`): only an incoming Send takes a receive buffer.
pub(super) fn env_srq<'e>(
    device: &'e mut Device,
    mem: &'e mut MemoryTable,
    cq: &'e mut CompletionQueue,
    rcq: &'e mut CompletionQueue,
    srq: Option<&'e mut SharedReceiveQueue>,
) -> Env<'e, MemoryTable> {
    Env {
        srq,
        ..env(device, mem, cq, rcq)
    }
}

pub(super) fn env<'e>(
    device: &'e mut Device,
    mem: &'e mut MemoryTable,
    cq: &'e mut CompletionQueue,
    rcq: &'e mut CompletionQueue,
) -> Env<'e, MemoryTable> {
    Env {
        device,
        mem,
        send_cq: cq,
        recv_cq: Some(rcq),
        srq: None,
    }
}

impl Conn {
    /// One pass over the connection; whether it did anything. Sets
    /// `finished` when it can be removed.
    pub(super) fn service<B: AsRef<[u8]>>(
        &mut self,
        cx: &mut Cx<'_, B>,
        finished: &mut bool,
    ) -> bool {
        self.kick = false;
        // The doorbell is cleared before every drain that reads the
        // rings; while `posted` is clear it is too (a post since the last
        // clear rang, and its slot sets `posted` on the way here).
        if let (true, Some(q)) = (self.posted, &self.shared) {
            q.take_doorbell();
        }
        let mut work = false;
        let mut acked = false;
        // TCP events.
        while let Some(ev) = cx.stack.poll_event(self.tcp) {
            work = true;
            match ev {
                Event::Connected => self.tcp_connected(cx),
                Event::RecordAcked(r) => {
                    // In place; the engine's service follows the events.
                    let device = &mut *cx.device;
                    match self.ep.as_mut() {
                        Some(ep) => {
                            acked |= cx.records.release(r, |rec| ep.note_acked(rec, device))
                        }
                        None => {
                            let _ = cx.records.remove(r);
                        }
                    }
                }
                Event::PeerClosed => {
                    if self.stream == Stream::Open {
                        self.stream = Stream::PeerClosed;
                    }
                }
                Event::Closed => self.stream = Stream::Ended(TcpEnd::Closed),
                Event::Reset => self.stream = Stream::Ended(TcpEnd::Reset),
                Event::TimedOut => self.stream = Stream::Ended(TcpEnd::TimedOut),
            }
        }
        if let (true, Some(ep)) = (acked, self.ep.as_mut()) {
            // What the acknowledgements completed, once for all of them.
            ep.service(&mut env(cx.device, cx.mem, &mut self.cq, &mut self.rcq));
        }
        // Receives posted before the data arrived must be in the QP before
        // the data is placed: the submission rings are drained first.
        work |= self.drain_posts(cx);
        // In-order payload, to the endpoint (MPA setup takes the request
        // or the reply, FPDUs follow).
        let now_e = engine_time(cx.now);
        let mut drained = false;
        let (mut mid_fpdu, mut crcs_given) = (0, 0);
        for _ in 0..MAX_CHUNKS_PER_POLL {
            let Some(p) = cx.stack.conn_mut(self.tcp).and_then(|c| c.recv()) else {
                drained = true;
                break;
            };
            work = true;
            if let Some(ep) = self.ep.as_mut() {
                let before = (ep.stats().chunks_mid_fpdu, ep.stats().fpdu_crcs_given);
                let chunk = p.bytes();
                ep.handle_stream_with_crc(
                    now_e,
                    chunk,
                    cx.rx_crcs.of(chunk),
                    &mut env_srq(
                        cx.device,
                        cx.mem,
                        &mut self.cq,
                        &mut self.rcq,
                        self.srq.as_mut(),
                    ),
                );
                mid_fpdu += ep.stats().chunks_mid_fpdu - before.0;
                crcs_given += ep.stats().fpdu_crcs_given - before.1;
            }
        }
        if mid_fpdu > 0 {
            bump(&cx.counters.rx_segments_mid_fpdu, mid_fpdu);
        }
        if crcs_given > 0 {
            bump(&cx.counters.rx_crc_in_pass, crcs_given);
        }
        // Records TCP gave up (a reset or timeout among the events above)
        // give their pins back before the engine learns the stream ended.
        return_dropped(cx.stack, cx.records, cx.device, self.tcp, self.ep.as_mut());
        if let Some(ep) = self.ep.as_mut() {
            // The stream's end, once the bytes before it are taken (a
            // reset has nothing more to give).
            let e = &mut env(cx.device, cx.mem, &mut self.cq, &mut self.rcq);
            match self.stream {
                Stream::Open => {}
                Stream::PeerClosed if drained => ep.handle_peer_closed(e),
                Stream::PeerClosed => {}
                Stream::Ended(TcpEnd::Closed) => {
                    ep.handle_peer_closed(e);
                    ep.handle_stream_closed(e);
                }
                Stream::Ended(_) => ep.handle_stream_closed(e),
            }
            if ep.poll_timeout().is_some_and(|t| t <= now_e) {
                ep.handle_timeout(now_e);
            }
        }
        work |= self.drain_posts(cx);
        work |= self.send_records(cx, Fill::Ahead);
        work |= self.engine_events(cx);
        // Events may have queued more (an accept's reply, a Terminate).
        work |= self.send_records(cx, Fill::Ahead);
        work |= self.deliver(cx.sync);
        if let (Life::Closing, Some(reason)) = (&self.life, self.ending) {
            // A Terminate ended the stream and went out (or came in): the
            // queue pair is in Error, and the application learns it now
            // rather than after TCP's close (TIME-WAIT may last).
            self.report_down(cx, reason);
        }
        if let Stream::Ended(end) = self.stream {
            match self.life {
                Life::TcpConnecting { .. } => {
                    cx.event(CmEvent::ConnectFailed {
                        qp: self.qpn(),
                        reason: match end {
                            TcpEnd::TimedOut => ConnectFailure::TimedOut,
                            _ => ConnectFailure::Refused,
                        },
                    });
                    self.enter(Life::Down);
                }
                Life::Up | Life::Closing => {
                    let reason = self.ending.unwrap_or(match end {
                        TcpEnd::Closed => DisconnectReason::Closed,
                        TcpEnd::Reset => DisconnectReason::Reset,
                        TcpEnd::TimedOut => DisconnectReason::TimedOut,
                    });
                    self.report_down(cx, reason);
                }
                // Setup heard the end above and said so (an event); a
                // request nobody took goes unreported.
                Life::Request | Life::Decision | Life::Setup | Life::Down => {}
            }
            // A completion still waiting for the other workers' STag
            // replicas keeps the connection until it is delivered.
            *finished = self.hold.is_none();
        }
        work
    }

    /// Tells the application that the stream is over.
    fn report_down<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>, reason: DisconnectReason) {
        self.enter(Life::Down);
        cx.event(CmEvent::Disconnected {
            qp: self.qpn(),
            reason,
        });
    }

    pub(super) fn tcp_connected<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>) {
        let life = core::mem::replace(&mut self.life, Life::Setup);
        let Life::TcpConnecting {
            qp,
            config,
            private_data,
        } = life
        else {
            self.life = life;
            return;
        };
        match Endpoint::initiator(config, &private_data, *qp, engine_time(cx.now)) {
            Ok(ep) => self.ep = Some(ep),
            Err(_) => {
                cx.event(CmEvent::ConnectFailed {
                    qp: self.qpn(),
                    reason: ConnectFailure::Setup(SetupFailure::StreamClosed),
                });
                self.enter(Life::Down);
                self.abort_tcp(cx);
            }
        }
    }

    pub(super) fn abort_tcp<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>) {
        // The reset's events come next iteration, untouched by the stack.
        self.kick = true;
        if let Some(c) = cx.stack.conn_mut(self.tcp) {
            c.abort(cx.now);
        }
    }

    /// Moves work requests from the submission rings into the QP.
    ///
    /// The connection's fields are borrowed apart rather than taken out
    /// and put back: a send request is some 170 bytes, and moving the
    /// stash (and each request through it) cost more than the post.
    pub(super) fn drain_posts<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>) -> bool {
        let Conn {
            shared,
            stash_send,
            stash_recv,
            hold,
            local_ops,
            room,
            kick,
            ep,
            life,
            posted,
            ..
        } = self;
        let Some(shared) = shared.as_deref() else {
            return false;
        };
        let stashed = stash_recv.is_some() || stash_send.is_some();
        // Nothing rang since the rings were last seen empty, nothing held
        // back: the common case of a connection serviced for its traffic,
        // decided without reading the shared state.
        if !*posted && !stashed {
            return false;
        }
        // Nothing posted after all (checked before any of the setup
        // below: it runs twice per service).
        if !stashed && shared.rq.is_empty() && shared.sq.is_empty() {
            *posted = !matches!(life, Life::Up);
            return false;
        }
        let attr = &shared.attr;
        let mrs = cx.device.mrs();
        let mem = &*cx.mem;
        // While a completion waits for the other workers' replicas, no
        // new send work starts (it bounds what completes behind it).
        let held = hold.is_some();
        let Some(qp) = qp_of(ep, life) else {
            return false;
        };
        let mut n = 0;
        // Every receive posted so far, whatever the batch limit: the
        // application posted it before the peer's Send can have left, and
        // a Send that found it missing would end the connection (a DDP
        // "no buffer" Terminate). The queue's depth bounds the work.
        while qp.rq_len() < attr.max_recv_wr as usize {
            let Some(wr) = stash_recv.take().or_else(|| shared.rq.pop()) else {
                break;
            };
            n += 1;
            if qp.post_recv(&wr).is_err() {
                *stash_recv = Some(wr);
                break;
            }
        }
        let mut sends = 0;
        while !held && sends < MAX_POSTS_PER_POLL && qp.sq_len() < attr.max_send_wr as usize {
            // A request the queue pair does not take now stays in the
            // stash, or goes there.
            let taken = match stash_send {
                Some(wr) => post_one(qp, wr, attr, mem, mrs, local_ops, room.local_ops),
                None => match shared.sq.pop() {
                    Some(wr) => {
                        let taken = post_one(qp, &wr, attr, mem, mrs, local_ops, room.local_ops);
                        if !taken {
                            *stash_send = Some(wr);
                        }
                        taken
                    }
                    None => break,
                },
            };
            n += 1;
            sends += 1;
            if !taken {
                break;
            }
            *stash_send = None;
        }
        // Stopped at the batch limit with more posted: the rest is for
        // the next iteration, whether or not what was taken makes traffic
        // whose answer would bring the connection back (local operations
        // make none, and the doorbell rang once for the whole list).
        *kick |= sends == MAX_POSTS_PER_POLL && !shared.sq.is_empty();
        n > 0
    }

    pub(super) fn engine_events<B: AsRef<[u8]>>(&mut self, cx: &mut Cx<'_, B>) -> bool {
        let mut work = false;
        while let Some(ev) = self.ep.as_mut().and_then(Endpoint::poll_event) {
            work = true;
            match ev {
                EngineEvent::ConnectRequest => {
                    let Some(req) = self.ep.as_ref().and_then(Endpoint::peer_request) else {
                        continue;
                    };
                    cx.event(CmEvent::ConnectRequest(ConnectRequest {
                        worker: cx.index,
                        conn: self.tcp,
                        remote: self.remote,
                        local_port: self.local_port,
                        private_data: req.private_data.clone(),
                        ird: req.ird_ord.map(|x| x.ird),
                        ord: req.ird_ord.map(|x| x.ord),
                    }));
                    self.enter(Life::Decision);
                }
                EngineEvent::Connected(n) => {
                    self.enter(Life::Up);
                    cx.event(CmEvent::Established {
                        qp: self.qpn(),
                        info: ConnectionInfo {
                            remote: self.remote,
                            ird: n.ird,
                            ord: n.ord,
                            revision: n.revision,
                            crc: n.framing.crc,
                            markers_rx: n.framing.markers_rx,
                            markers_tx: n.framing.markers_tx,
                            rtr: n.rtr,
                            private_data: n.private_data,
                        },
                    });
                }
                EngineEvent::Rejected(r) => match self.life {
                    // The endpoint refused the request by itself: the
                    // listening application learns why.
                    Life::Request => {
                        cx.event(CmEvent::RequestRefused(RefusedRequest {
                            remote: self.remote,
                            local_port: self.local_port,
                            reason: r.reason,
                        }));
                        self.enter(Life::Down);
                    }
                    // The peer refused our request.
                    Life::Setup => {
                        self.enter(Life::Down);
                        cx.event(CmEvent::Rejected {
                            qp: self.qpn(),
                            private_data: r.private_data,
                        });
                    }
                    // Our application's reject went out.
                    _ => self.enter(Life::Down),
                },
                EngineEvent::SetupFailed(f) => {
                    if matches!(self.life, Life::Setup) {
                        self.enter(Life::Down);
                        cx.event(CmEvent::ConnectFailed {
                            qp: self.qpn(),
                            reason: ConnectFailure::Setup(f),
                        });
                    } else if matches!(self.life, Life::Request | Life::Decision) {
                        // A request that never came whole, was not one,
                        // or came with more behind it: nobody has a queue
                        // pair on it, and the peer is reset (it holds no
                        // slot in TIME-WAIT).
                        self.enter(Life::Down);
                        self.abort_tcp(cx);
                    }
                }
                EngineEvent::Terminated { cause, origin } => {
                    bump(&cx.counters.terminates, 1);
                    if !matches!(origin, rdmap::engine::TerminateOrigin::Stream) {
                        self.ending = Some(DisconnectReason::Terminated { cause, origin });
                    }
                }
                EngineEvent::Closed => {
                    if self.life.is_up() {
                        // An orderly close is complete for the application
                        // now; TCP may still linger in TIME-WAIT, and the
                        // connection stays here until it ends.
                        self.report_down(cx, DisconnectReason::Closed);
                    }
                }
                EngineEvent::ReadyToClose => {
                    if matches!(self.life, Life::Up) {
                        self.enter(Life::Closing);
                    }
                    if let Some(c) = cx.stack.conn_mut(self.tcp).filter(|c| is_open(c.state())) {
                        c.close(cx.now);
                    }
                }
            }
        }
        work
    }
}

impl<Q: LinkQueue> Worker<Q> {
    pub(super) fn mpa_config(&self, ird: u16, ord: u16) -> rdmap::mpa::Config {
        rdmap::mpa::Config {
            crc: self.mpa.crc,
            markers_wanted: self.mpa.markers,
            ird,
            ord,
            rtr_offer: self.mpa.rtr.map_or(RtrSet::NONE, RtrSet::only),
            rtr_accept: RtrSet::ALL,
            timeout: self.mpa.timeout,
            nudge_after: self.mpa.nudge_after,
            responder_waits_for_first_fpdu: self.mpa.responder_waits,
            ..rdmap::mpa::Config::default()
        }
    }

    pub(super) fn slot(&mut self, id: ConnId) -> Result<&mut Option<Conn>, Error> {
        let i = id.index as usize;
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, || None);
        }
        self.ready.ensure(i + 1);
        self.ready.mark(id.index);
        Ok(&mut self.conns[i])
    }

    pub(super) fn connect(
        &mut self,
        now: Instant,
        shared: Arc<QpShared>,
        remote: SocketAddrV4,
        params: ConnParams,
    ) -> Result<(), Error> {
        let local_ip = self.iface.ip();
        // The port's RSS where it steers; where it cannot, the software
        // dispatcher's function, which names this worker by its index.
        let steer = match &self.dispatch_rss {
            Some(rss) => Some((rss.clone(), self.index as u16)),
            None => self
                .caps
                .rss
                .clone()
                .filter(|_| self.caps.queues > 1 && self.queue.index() < self.caps.queues)
                .map(|rss| (rss, self.queue.index())),
        };
        let id = match steer {
            None => self.iface.stack_mut().connect(now, local_ip, remote)?,
            Some((rss, queue)) => {
                let mut tries = 0;
                loop {
                    let port = rss
                        .pick_port(
                            local_ip,
                            *remote.ip(),
                            remote.port(),
                            queue,
                            self.port_cursor,
                            |p| self.listening.contains(&p),
                        )
                        .ok_or(Error::Stack(StackError::NoFreePort))?;
                    self.port_cursor = port.wrapping_add(1);
                    let local = SocketAddrV4::new(local_ip, port);
                    match self.iface.stack_mut().connect_from(now, local, remote) {
                        Ok(id) => break id,
                        Err(StackError::PortInUse) if tries < 64 => tries += 1,
                        Err(e) => return Err(Error::Stack(e)),
                    }
                }
            }
        };
        let qp = QueuePair::new(shared.qpn, shared.attr);
        let config = self.mpa_config(params.ird, params.ord);
        let local_port = self.iface.stack().tuple(id).map_or(0, |t| t.local.port());
        let mut conn = Conn::new(id, remote, local_port, Life::Setup, None);
        shared.set_slot(id.index);
        shared.bind_worker(self.index);
        conn.bind(shared);
        conn.enter(Life::TcpConnecting {
            qp: Box::new(qp),
            config,
            private_data: params.private_data,
        });
        *self.slot(id)? = Some(conn);
        bump(&self.counters.connections, 1);
        Ok(())
    }

    pub(super) fn pending(&mut self, id: ConnId) -> Result<&mut Conn, Error> {
        match self.conns.get_mut(id.index as usize) {
            Some(Some(c)) if c.tcp == id && matches!(c.life, Life::Decision) => Ok(c),
            _ => Err(Error::NoSuchRequest),
        }
    }

    /// The application accepts a request: the endpoint answers on its
    /// queue pair.
    pub(super) fn accept(
        &mut self,
        now: Instant,
        id: ConnId,
        shared: Arc<QpShared>,
        params: ConnParams,
    ) -> Result<(), Error> {
        let index = self.index;
        let conn = self.pending(id)?;
        let qp = QueuePair::new(shared.qpn, shared.attr);
        let ep = conn.ep.as_mut().ok_or(Error::NoSuchRequest)?;
        ep.accept_on(qp, params.ird, params.ord, &params.private_data)
            .map_err(|_| Error::InvalidArgument("private data longer than MPA allows"))?;
        shared.set_slot(id.index);
        shared.bind_worker(index);
        conn.bind(shared);
        conn.enter(Life::Setup);
        self.after_decision(now, id);
        Ok(())
    }

    /// The application rejects a request: the endpoint sends the reject,
    /// then closes.
    pub(super) fn reject(
        &mut self,
        now: Instant,
        id: ConnId,
        private_data: Vec<u8>,
    ) -> Result<(), Error> {
        let conn = self.pending(id)?;
        let ep = conn.ep.as_mut().ok_or(Error::NoSuchRequest)?;
        ep.reject(&private_data)
            .map_err(|_| Error::InvalidArgument("private data longer than MPA allows"))?;
        conn.enter(Life::Down);
        self.after_decision(now, id);
        Ok(())
    }

    /// After the application's answer: receives posted before an accept
    /// go into the queue pair at once (the initiator's first Send may
    /// follow the reply closely), and the connection is serviced.
    fn after_decision(&mut self, now: Instant, id: ConnId) {
        if let Some(Some(conn)) = self.conns.get_mut(id.index as usize) {
            let mut cx = worker_cx!(self, now);
            conn.drain_posts(&mut cx);
        }
        self.ready.mark(id.index);
    }

    pub(super) fn accept_new(&mut self, now: Instant) -> bool {
        let mut n = 0;
        let now_e = engine_time(now);
        for i in 0..self.listening.len() {
            let port = self.listening[i];
            for _ in 0..ACCEPT_PER_POLL {
                let Some(id) = self.iface.stack_mut().accept(port) else {
                    break;
                };
                n += 1;
                let remote = self
                    .iface
                    .stack()
                    .tuple(id)
                    .map_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), |t| t.remote);
                // The depths are the application's, given with its accept.
                let Ok(ep) = Endpoint::awaiting_request(self.mpa_config(0, 0), now_e) else {
                    // The configuration was checked when the dataplane
                    // started; a connection it cannot serve is reset.
                    if let Some(c) = self.iface.stack_mut().conn_mut(id) {
                        c.abort(now);
                    }
                    continue;
                };
                let conn = Conn::new(id, remote, port, Life::Request, Some(ep));
                if let Ok(slot) = self.slot(id) {
                    *slot = Some(conn);
                    bump(&self.counters.connections, 1);
                }
            }
        }
        n > 0
    }

    /// Services the connections on the ready list (see [`super::ready`]).
    pub(super) fn service_conns(&mut self, now: Instant) -> bool {
        self.collect_ready(now);
        let mut work = false;
        let mut cx = worker_cx!(self, now);
        let ready = self.ready.begin();
        for (k, &i) in ready.iter().enumerate() {
            if let Some(&n) = ready.get(k + 1) {
                // With thousands of connections the next one's state is
                // out of cache: its loads start while this one is served.
                prefetch_conn(cx.stack, &self.conns, n);
            }
            let Some(slot) = self.conns.get_mut(i as usize) else {
                continue;
            };
            let Some(conn) = slot.as_mut() else {
                continue;
            };
            self.visits += 1;
            let mut finished = false;
            let did = conn.service(&mut cx, &mut finished);
            work |= did;
            if !finished {
                if did || conn.wants_service() {
                    self.ready.mark(i);
                }
                if let Some(due) = conn.next_due() {
                    self.timed.arm(i, due, &mut conn.timed);
                }
            } else {
                let mut conn = slot.take().expect("checked above");
                // Anything TCP still holds goes back before it forgets the
                // connection: after an abort here (a connection removed
                // before it closed), and what an earlier pass left.
                if let Some(t) = cx.stack.conn_mut(conn.tcp) {
                    if t.state() != tcp::State::Closed {
                        t.abort(now);
                    }
                }
                return_dropped(cx.stack, cx.records, cx.device, conn.tcp, conn.ep.as_mut());
                let _ = cx.stack.remove(now, conn.tcp);
                if let Some(c) = cx.stack.conn(conn.tcp) {
                    self.retransmits_closed += c.stats().retransmits;
                    self.paws_drops_closed += c.stats().paws_dropped;
                }
                if let Some(ep) = conn.ep.take() {
                    let mut qp = ep.into_qp();
                    qp.drain_inbound_reads(cx.device.mrs_mut());
                }
                let c = &cx.counters.connections;
                c.store(
                    c.load(Ordering::Relaxed).saturating_sub(1),
                    Ordering::Relaxed,
                );
            }
        }
        self.ready.end(ready);
        bump(&cx.counters.conn_visits, core::mem::take(&mut self.visits));
        work
    }

    /// Marks the connections that received something or whose TCP timers
    /// ran (the stack's touched slots), those with newly posted work (the
    /// worker's posted ring; all of them if it overflowed), and those
    /// whose setup deadline has come (`deadlines.rs`: only those are
    /// looked at).
    fn collect_ready(&mut self, now: Instant) {
        let ready = &mut self.ready;
        let conns = &mut self.conns;
        self.timed.make_room(|t, i| {
            conns
                .get(i as usize)
                .and_then(Option::as_ref)
                .is_some_and(|c| c.timed == Some(t))
        });
        while let Some((t, i)) = self.timed.pop_due(now) {
            let Some(c) = conns.get_mut(i as usize).and_then(Option::as_mut) else {
                continue;
            };
            if c.timed != Some(t) {
                continue;
            }
            c.timed = None;
            // The entry's time is a lower bound: the deadline may have
            // moved later, or gone. A due one is run by the service, after
            // which the connection is armed again if it still has one.
            match c.next_due() {
                Some(due) if due <= now => ready.mark(i),
                Some(due) => self.timed.arm(i, due, &mut c.timed),
                None => {}
            }
        }
        self.iface.stack_mut().take_touched(|i| ready.mark(i));
        if let Some(w) = self.wake.get(self.index) {
            while let Some(slot) = w.take_posted() {
                ready.mark(slot);
                if let Some(c) = conns.get_mut(slot as usize).and_then(Option::as_mut) {
                    c.posted = true;
                }
            }
            if w.take_overflow() {
                ready.mark_all(conns.len());
                for c in conns.iter_mut().flatten() {
                    c.posted = true;
                }
            }
        }
    }
}

/// Hints the CPU to load the state of connection slot `i`, its TCP slot
/// and its `Conn` (engine inline), by address alone: nothing of them is
/// read, so the loads go on while the caller works on another
/// connection. With thousands of busy connections a connection's lines
/// leave the cache between two visits, and a visit that began cold
/// waited on them one miss after another.
pub(super) fn prefetch_conn<B: AsRef<[u8]>>(
    stack: &Stack<RxFrame<B>, RecordRef>,
    conns: &[Option<Conn>],
    i: u32,
) {
    let (tcb, len) = stack.slot_lines(i);
    crate::memory::prefetch(tcb, len);
    crate::memory::prefetch(
        conns.as_ptr().wrapping_add(i as usize).cast(),
        core::mem::size_of::<Option<Conn>>(),
    );
}

/// The queue pair of a connection with engine `ep` in `life`, if it has
/// one yet.
fn qp_of<'a>(ep: &'a mut Option<Endpoint>, life: &'a mut Life) -> Option<&'a mut QueuePair> {
    match (ep, life) {
        (_, Life::Request | Life::Decision) => None,
        (Some(ep), _) => Some(ep.qp_mut()),
        (None, Life::TcpConnecting { qp, .. }) => Some(&mut **qp),
        _ => None,
    }
}

/// Posts one send request to the queue pair, with the local memory
/// operation it carries recorded in `local_ops`: whether the queue pair
/// took it (not now, in its state or with its queue full).
fn post_one(
    qp: &mut QueuePair,
    wr: &SendWr,
    attr: &QpInitAttr,
    mem: &MemoryTable,
    mrs: &MrTable,
    local_ops: &mut VecDeque<LocalOp>,
    room: usize,
) -> bool {
    let (changed, local) = match wr.op {
        SendOp::FastRegister(_) | SendOp::LocalInvalidate { .. } => prepare_local(wr, attr, mem),
        _ => (None, None),
    };
    match qp.post_send(changed.as_ref().unwrap_or(wr), mrs) {
        Ok(_) => {
            if local.is_some() {
                room_at_first_use(local_ops, room);
            }
            local_ops.extend(local);
            true
        }
        Err(rdmap::verbs::PostError::InvalidState | rdmap::verbs::PostError::QueueFull) => false,
        // Checked when posted to the ring; cannot happen.
        Err(_) => true,
    }
}
