//! The whole stack in the network simulator: two simulated hosts, each a
//! `tcp-offload` [`Interface`] whose one connection carries an rdmap
//! [`Endpoint`] (the TCP client is the MPA initiator, the server the
//! responder), glued the way the dataplane glues them:
//!
//! - in-order TCP payload (`Connection::recv`) goes to
//!   [`Endpoint::handle_stream`] as it arrives, chunk by chunk;
//! - while TCP offers room (`send_capacity() > 0`), [`Endpoint::poll_record`]
//!   is asked for a record of at most that size, and each record returned
//!   is queued at once (it is part of the MPA stream already);
//! - `Event::RecordAcked` gives the record back with
//!   [`Endpoint::record_acked`]; records TCP gives up on a reset come back
//!   through `Stack::poll_dropped` and go to [`Endpoint::record_dropped`]
//!   (as do any dropped elsewhere, which [`SimRecord`]'s `Drop` catches);
//!   the peer's FIN, a reset or the connection's end becomes
//!   [`Endpoint::handle_stream_closed`], and `ReadyToClose` closes TCP.
//!
//! A record reaches TCP as a [`SimRecord`]: the [`OutRecord`] itself (its
//! payload by reference, pinned) and a handle on the host's memory, so the
//! payload bytes are read from the registered region each time the
//! simulator builds a frame, a retransmission included, as a zero-copy
//! transmit path reads them; the simulator then copies them into its
//! frame (the dataplane would attach them instead).

use std::cell::RefCell;
use std::rc::Rc;

use core::net::SocketAddrV4;
use core::time::Duration;

use rdmap::engine::{Endpoint, EngineEvent, Env, OutRecord, RecordKind};
use rdmap::mpa::Config as MpaConfig;
use rdmap::placement::{RegionHandle, VecMemory};
use rdmap::verbs::{
    Access, CompletionQueue, Device, DeviceLimits, PdId, PostError, QpInitAttr, QueuePair,
    RegOptions, SendWr, Stag, WorkCompletion, WrSeq,
};
use tcp_offload::iface::{Interface, InterfaceConfig};
use tcp_offload::tcp::{Config as TcpConfig, ConnId, Event, Record, RecordBytes, Stack, State};
use tcp_offload::Instant;
use tcp_sim::{self as sim, Host, Link, LinkConfig, Network, NodeId, SimError};

/// The port the responder listens on.
pub const PORT: u16 = 3260;

/// Octets of canary before and after every registered span.
pub const GUARD: usize = 64;
/// The canary.
pub const CANARY: u8 = 0xA5;

/// Room a transmit buffer keeps beyond the IP MTU (Ethernet header, VLAN).
const FRAME_OVERHEAD: usize = 18;

/// One host's memory, shared by the driver (through [`Env`]) and the
/// records queued in TCP (which read their payload from it), and the
/// records TCP dropped without acknowledging them.
#[derive(Debug, Default)]
pub struct Shared {
    pub mem: RefCell<VecMemory>,
    pub dropped: RefCell<Vec<OutRecord>>,
}

/// An [`OutRecord`] as a TCP record.
#[derive(Debug)]
pub struct SimRecord {
    inner: Option<OutRecord>,
    len: usize,
    shared: Rc<Shared>,
}

impl SimRecord {
    fn new(record: OutRecord, shared: Rc<Shared>) -> SimRecord {
        SimRecord {
            len: record.len(),
            inner: Some(record),
            shared,
        }
    }

    /// The record, to give back to the engine.
    fn into_inner(mut self) -> OutRecord {
        self.inner.take().expect("a record is given back once")
    }
}

impl Record for SimRecord {
    fn len(&self) -> usize {
        self.len
    }
}

impl RecordBytes for SimRecord {
    fn copy_to(&self, offset: usize, dst: &mut [u8]) {
        let record = self.inner.as_ref().expect("record still held");
        let mem = self.shared.mem.borrow();
        record
            .copy_to(&*mem, offset, dst)
            .expect("TCP asks for bytes inside the record");
    }
}

impl Drop for SimRecord {
    /// TCP dropped the record unacknowledged (reset, timeout): its pin
    /// must still go back to the STag table.
    fn drop(&mut self) {
        if let Some(r) = self.inner.take() {
            self.shared.dropped.borrow_mut().push(r);
        }
    }
}

/// The interface type of the stack simulation.
pub type RdmaIface = Interface<Vec<u8>, SimRecord>;

/// An [`RdmaIface`] plugged into the network (as [`Host`] plugs in the
/// byte-record interface).
#[derive(Debug)]
pub struct RdmaHost {
    pub iface: RdmaIface,
    spare: Vec<u8>,
}

impl RdmaHost {
    /// Host `n` with the addresses of [`Host::numbered`].
    pub fn numbered(n: u8, tcp: TcpConfig, seed: u64) -> RdmaHost {
        let mut key = [0u8; 16];
        sim::Rng::derive(seed, 0x4b45_5900 | u64::from(n)).fill_bytes(&mut key);
        let mut config = InterfaceConfig::new(Host::mac_of(n), Host::ip_of(n), key);
        config.tcp = tcp;
        RdmaHost {
            iface: Interface::new(config),
            spare: Vec::new(),
        }
    }
}

impl sim::Endpoint for RdmaHost {
    fn handle_frame(&mut self, now: Instant, frame: Vec<u8>) {
        self.iface.handle_frame(now, frame);
    }

    fn poll_frame(&mut self, now: Instant) -> Option<Vec<u8>> {
        let size = self.iface.config().mtu + FRAME_OVERHEAD;
        let mut buf = core::mem::take(&mut self.spare);
        buf.resize(size, 0);
        match self.iface.poll_frame(now, &mut buf) {
            Some(n) => {
                buf.truncate(n);
                Some(buf)
            }
            None => {
                self.spare = buf;
                None
            }
        }
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        self.iface.poll_timeout()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.iface.handle_timeout(now);
    }
}

/// A registered buffer: `len` octets at [`GUARD`] of its own region, its
/// tagged offsets starting at `va`.
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    pub region: RegionHandle,
    pub stag: Stag,
    pub va: u64,
    pub len: usize,
}

impl Buf {
    pub fn addr(&self, off: usize) -> u64 {
        self.va + off as u64
    }
}

/// Counts of what one side sent.
#[derive(Debug, Default, Clone, Copy)]
pub struct SideStats {
    pub records: u64,
    pub fpdus: u64,
    pub mpa_records: u64,
}

/// One RDMA host: its verbs objects, its endpoint once TCP is up, and
/// what it has seen.
#[derive(Debug)]
pub struct Side {
    pub name: &'static str,
    pub initiator: bool,
    pub node: NodeId,
    pub dev: Device,
    pub pd: PdId,
    pub cq: CompletionQueue,
    pub shared: Rc<Shared>,
    /// The queue pair until TCP is up (work is posted to it before).
    qp: Option<QueuePair>,
    pub ep: Option<Endpoint>,
    pub mpa: MpaConfig,
    pub conn: Option<ConnId>,
    pub events: Vec<EngineEvent>,
    pub completions: Vec<WorkCompletion>,
    pub bufs: Vec<Buf>,
    pub stats: SideStats,
    /// The peer's FIN arrived.
    pub peer_closed: bool,
    /// The connection ended (`Closed`), or was reset or timed out.
    pub tcp_closed: bool,
    pub tcp_reset: bool,
    /// `close` was called on the connection.
    pub closing: bool,
    /// [`Endpoint::handle_stream_closed`] was called.
    pub stream_closed: bool,
    /// Records TCP dropped unacknowledged.
    pub records_dropped: u64,
    /// When the engine's setup timer was last scheduled as a wake-up.
    wakeup: Option<Instant>,
}

/// Verbs limits of a simulated host.
pub fn qp_attr(pd: PdId, cq: &CompletionQueue) -> QpInitAttr {
    QpInitAttr {
        pd,
        send_cq: cq.id(),
        recv_cq: cq.id(),
        srq: None,
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 6,
        max_recv_sge: 6,
        max_ord: 16,
        max_ird: 16,
        sq_sig_all: false,
    }
}

fn micros(t: Instant) -> Duration {
    Duration::from_micros(t.total_micros())
}

impl Side {
    pub fn new(name: &'static str, initiator: bool, mpa: MpaConfig, seed: u64) -> Side {
        let mut dev = Device::with_seed(
            DeviceLimits {
                max_mr: 64,
                ..DeviceLimits::default()
            },
            seed,
        );
        let pd = dev.alloc_pd().expect("a PD");
        let cq = dev.create_cq(4096).expect("a CQ");
        let qp = dev.create_qp(qp_attr(pd, &cq)).expect("a QP");
        Side {
            name,
            initiator,
            node: NodeId(usize::MAX),
            dev,
            pd,
            cq,
            shared: Rc::new(Shared::default()),
            qp: Some(qp),
            ep: None,
            mpa,
            conn: None,
            events: Vec::new(),
            completions: Vec::new(),
            bufs: Vec::new(),
            stats: SideStats::default(),
            peer_closed: false,
            tcp_closed: false,
            tcp_reset: false,
            closing: false,
            stream_closed: false,
            records_dropped: 0,
            wakeup: None,
        }
    }

    /// Registers `bytes.len()` octets holding `bytes`, with canary guards.
    pub fn register(&mut self, bytes: &[u8], va: u64, access: Access) -> Buf {
        let len = bytes.len();
        let mut all = vec![CANARY; len + 2 * GUARD];
        all[GUARD..GUARD + len].copy_from_slice(bytes);
        let mut mem = self.shared.mem.borrow_mut();
        let region = mem.add_region_with(all);
        let span = mem
            .span(region, GUARD as u64, len.max(1) as u64)
            .expect("span inside the region");
        let stag = self
            .dev
            .reg_mr_with(self.pd, span, va, access, RegOptions::default())
            .expect("registration");
        let buf = Buf {
            region,
            stag,
            va,
            len,
        };
        self.bufs.push(buf);
        buf
    }

    /// The whole region of `buf`, guards included.
    pub fn region_bytes(&self, buf: &Buf) -> Vec<u8> {
        self.shared
            .mem
            .borrow()
            .bytes(buf.region)
            .expect("region")
            .to_vec()
    }

    /// The queue pair, before or after the connection is up.
    pub fn qp_mut(&mut self) -> &mut QueuePair {
        match (&mut self.ep, &mut self.qp) {
            (Some(ep), _) => ep.qp_mut(),
            (None, Some(qp)) => qp,
            (None, None) => unreachable!("the queue pair lives in one place"),
        }
    }

    /// Posts a send work request, checked against this host's STag table.
    pub fn post_send(&mut self, wr: &SendWr) -> Result<WrSeq, PostError> {
        let qp = match (&mut self.ep, &mut self.qp) {
            (Some(ep), _) => ep.qp_mut(),
            (None, Some(qp)) => qp,
            (None, None) => unreachable!("the queue pair lives in one place"),
        };
        qp.post_send(wr, self.dev.mrs())
    }

    pub fn qp(&self) -> &QueuePair {
        match (&self.ep, &self.qp) {
            (Some(ep), _) => ep.qp(),
            (None, Some(qp)) => qp,
            (None, None) => unreachable!("the queue pair lives in one place"),
        }
    }

    /// Pins held on any registered buffer.
    pub fn pins(&self) -> u32 {
        self.bufs
            .iter()
            .filter_map(|b| self.dev.mrs().query_mr(b.stag))
            .map(|i| i.pins)
            .sum()
    }

    fn start_endpoint(&mut self, now: Instant) {
        let qp = self.qp.take().expect("the endpoint starts once");
        let ep = if self.initiator {
            Endpoint::initiator(self.mpa.clone(), b"simrdma initiator", qp, micros(now))
        } else {
            Endpoint::responder(self.mpa.clone(), qp, micros(now))
        };
        self.ep = Some(ep.expect("MPA configuration"));
    }

    fn with_env<T>(
        &mut self,
        f: impl FnOnce(&mut Endpoint, &mut Env<'_, VecMemory>) -> T,
    ) -> Option<T> {
        let ep = self.ep.as_mut()?;
        let mut mem = self.shared.mem.borrow_mut();
        let mut env = Env::new(&mut self.dev, &mut *mem, &mut self.cq);
        Some(f(ep, &mut env))
    }

    /// Plays this host's driver once at `now`: connection events, received
    /// payload, engine events, records while TCP has room, dropped records,
    /// completions. Returns when the engine's setup timer is due, if it
    /// runs.
    pub fn step(&mut self, now: Instant, stack: &mut Stack<Vec<u8>, SimRecord>) -> Option<Instant> {
        let t = micros(now);
        if self.conn.is_none() && !self.initiator {
            self.conn = stack.accept(PORT);
            if self.conn.is_some() {
                self.start_endpoint(now);
            }
        }
        let id = self.conn?;
        let mut ended = false;
        while let Some(ev) = stack.poll_event(id) {
            match ev {
                Event::Connected => {
                    if self.initiator && self.ep.is_none() {
                        self.start_endpoint(now);
                    }
                }
                Event::RecordAcked(r) => {
                    let r = r.into_inner();
                    self.with_env(|ep, env| ep.record_acked(r, env))
                        .expect("records come from the endpoint");
                }
                Event::PeerClosed => self.peer_closed = true,
                Event::Closed => {
                    self.tcp_closed = true;
                    ended = true;
                }
                Event::Reset | Event::TimedOut => {
                    self.tcp_reset = true;
                    ended = true;
                }
            }
        }
        if let Some(conn) = stack.conn_mut(id) {
            while let Some(p) = conn.recv() {
                self.with_env(|ep, env| ep.handle_stream(t, p.bytes(), env));
            }
        }
        self.return_dropped(stack, id);
        if (self.peer_closed || ended) && !self.stream_closed && self.ep.is_some() {
            self.stream_closed = true;
            self.with_env(|ep, env| ep.handle_stream_closed(env));
        }
        if let Some(ep) = self.ep.as_mut() {
            if ep.poll_timeout().is_some_and(|due| due <= t) {
                ep.handle_timeout(t);
            }
        }
        loop {
            let events = self.drain_engine_events(now, stack, id);
            let sent = self.transmit(now, stack, id);
            if !events && sent == 0 {
                break;
            }
        }
        self.return_dropped(stack, id);
        while let Some(wc) = self.cq.poll_one() {
            self.completions.push(wc);
        }
        let due = self.ep.as_ref()?.poll_timeout()?;
        let due = Instant::from_micros(u64::try_from(due.as_micros()).unwrap_or(u64::MAX));
        (self.wakeup != Some(due)).then(|| {
            self.wakeup = Some(due);
            due
        })
    }

    fn return_dropped(&mut self, stack: &mut Stack<Vec<u8>, SimRecord>, id: ConnId) {
        let mut dropped: Vec<OutRecord> = self.shared.dropped.borrow_mut().drain(..).collect();
        while let Some(r) = stack.poll_dropped(id) {
            dropped.push(r.into_inner());
        }
        for r in dropped {
            self.records_dropped += 1;
            match self.ep.as_mut() {
                Some(ep) => ep.record_dropped(r, &mut self.dev),
                None => unreachable!("records come from the endpoint"),
            }
        }
    }

    fn drain_engine_events(
        &mut self,
        now: Instant,
        stack: &mut Stack<Vec<u8>, SimRecord>,
        id: ConnId,
    ) -> bool {
        let mut any = false;
        while let Some(ev) = self.ep.as_mut().and_then(Endpoint::poll_event) {
            any = true;
            match ev {
                EngineEvent::ConnectRequest => {
                    if let Some(ep) = self.ep.as_mut() {
                        ep.accept(b"simrdma responder").expect("accept");
                    }
                }
                EngineEvent::ReadyToClose => {
                    if let Some(conn) = stack.conn_mut(id) {
                        if matches!(conn.state(), State::Established | State::CloseWait) {
                            conn.close(now);
                            self.closing = true;
                        }
                    }
                }
                _ => {}
            }
            self.events.push(ev);
        }
        any
    }

    fn transmit(
        &mut self,
        now: Instant,
        stack: &mut Stack<Vec<u8>, SimRecord>,
        id: ConnId,
    ) -> usize {
        let Some(conn) = stack.conn_mut(id) else {
            return 0;
        };
        let mut n = 0;
        loop {
            let cap = conn.send_capacity();
            if cap == 0 {
                break;
            }
            let Some(record) = self.with_env(|ep, env| ep.poll_record(cap, env)).flatten() else {
                break;
            };
            assert!(
                !record.is_empty() && record.len() <= cap,
                "{}: a record of {} octets for {cap} offered",
                self.name,
                record.len()
            );
            self.stats.records += 1;
            match record.kind() {
                RecordKind::MpaFrame => self.stats.mpa_records += 1,
                _ => self.stats.fpdus += 1,
            }
            let r = SimRecord::new(record, Rc::clone(&self.shared));
            if let Err((e, _)) = conn.send_record(now, r) {
                panic!(
                    "{}: TCP refused a record within its capacity: {e:?}",
                    self.name
                );
            }
            n += 1;
        }
        n
    }

    pub fn terminated(&self) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e, EngineEvent::Terminated { .. }))
    }

    pub fn connected(&self) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e, EngineEvent::Connected(_)))
    }
}

/// Two RDMA hosts on one link: `a` (host 1) connects to `b` (host 2).
pub struct World {
    pub net: Network<RdmaHost>,
    pub link: Link,
    pub a: Side,
    pub b: Side,
}

impl World {
    /// Builds the network and starts the TCP active open from `a` to `b`.
    pub fn new(
        seed: u64,
        mut a: Side,
        mut b: Side,
        tcp: (TcpConfig, TcpConfig),
        link: LinkConfig,
        static_arp: bool,
    ) -> World {
        assert!(a.initiator && !b.initiator);
        let mut net = Network::new(seed);
        a.node = net.add_endpoint(RdmaHost::numbered(1, tcp.0, seed));
        b.node = net.add_endpoint(RdmaHost::numbered(2, tcp.1, seed));
        let link = net.connect(a.node, b.node, link);
        if static_arp {
            net.endpoint_mut(a.node)
                .iface
                .add_static_arp(Host::ip_of(2), Host::mac_of(2));
            net.endpoint_mut(b.node)
                .iface
                .add_static_arp(Host::ip_of(1), Host::mac_of(1));
        }
        let server = SocketAddrV4::new(Host::ip_of(2), PORT);
        net.endpoint_mut(b.node)
            .iface
            .stack_mut()
            .listen(server, 4)
            .expect("listen");
        let now = net.now();
        a.conn = Some(
            net.endpoint_mut(a.node)
                .iface
                .stack_mut()
                .connect(now, Host::ip_of(1), server)
                .expect("connect"),
        );
        World { net, link, a, b }
    }

    /// Runs the network, playing both drivers every round, until `done`
    /// holds or virtual time reaches `deadline`. `done` may also act on the
    /// network (inject a frame, change a link).
    pub fn run_until(
        &mut self,
        deadline: Instant,
        mut done: impl FnMut(&mut Network<RdmaHost>, &Side, &Side) -> bool,
    ) -> Result<Instant, SimError> {
        let (a, b) = (&mut self.a, &mut self.b);
        self.net.run_until(deadline, |net| {
            let now = net.now();
            for side in [&mut *a, &mut *b] {
                let stack = net.endpoint_mut(side.node).iface.stack_mut();
                if let Some(at) = side.step(now, stack) {
                    if at > now {
                        net.schedule_wakeup(at);
                    }
                }
            }
            done(net, a, b)
        })
    }

    /// The connection of `side`, while it exists.
    pub fn conn<'n>(
        net: &'n Network<RdmaHost>,
        side: &Side,
    ) -> Option<&'n tcp_offload::tcp::Connection<Vec<u8>, SimRecord>> {
        net.endpoint(side.node).iface.stack().conn(side.conn?)
    }
}
