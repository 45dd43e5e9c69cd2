//! perftest's control exchange in `-R` (rdma_cm) mode, byte for byte, so
//! that `iwarp perf` and perftest's `ib_*_bw -R` / `ib_*_lat -R` run
//! against each other in either role. Sits between the `perf` command
//! (which opens the dataplane and builds the data QPs with
//! [`super::runner`]) and the measured loop: a [`Session`] makes the
//! control connection, exchanges what perftest exchanges, connects the
//! data QPs the way perftest does, and after the loop does perftest's
//! closing exchanges.
//!
//! Facts from perftest's public source (tag v4.5-0.18, version string
//! "6.06", as packaged in Debian 12: `perftest_communication.c`,
//! `perftest_resources.h`, the `main` of each test) and the siw↔siw
//! captures in `deploy/interop/captures/`; no code of perftest is used.
//!
//! # Connections
//!
//! All on one TCP port (perftest's 18515 by default), the client always
//! the active side:
//!
//! 1. the control connection (IRD/ORD 0/0, no private data). perftest
//!    keeps one receive posted on it and re-posts it after each message,
//!    so the exchange is strict ping-pong;
//! 2. after the fifth exchange, `-q N` data connections (IRD = ORD =
//!    perftest's `out_reads` in the read tests, 0/0 otherwise), accepted
//!    by the server in arrival order.
//!
//! # Messages
//!
//! Each is one Send, client first, server answering with its own message
//! of the same kind (lengths in bytes, integers big-endian; see [`wire`]):
//!
//! | # | message | bytes |
//! |---|---|---|
//! | 1 | version string, NUL-padded ("6.06") | 16 |
//! | 2 | cycle buffer (page size, 4096) | 4 |
//! | 3 | cache line (64) | 4 |
//! | 4 | IB MTU code as a digit and a NUL ("3" = 1024) | 2 |
//! | 5 | zeroed `pingpong_dest` (sync) — then the data connections | 56 |
//! | 6 | zeroed `pingpong_dest` (sync) | 56 |
//! | … | `pingpong_dest` rounds and syncs, per test (below) | 56 |
//!
//! `pingpong_dest` is lid, out_reads, qpn, psn, rkey (32 bits each), four
//! bytes of padding (stack garbage in the captures), vaddr (64), gid (16
//! bytes), srqn, gid_index (32). perftest 6.29 (26.04) adds
//! `tail_markers_vaddr` (64) after vaddr, 64 bytes in all, without
//! negotiating it: the layout follows the peer's version string. perftest
//! 6.28 adds a parameter negotiation, but only with a peer of 6.28 or
//! later; we say "6.06", so it is skipped.
//!
//! After message 6 (`dI` = each QP's dest in QP order, `d0` = QP 0's):
//!
//! - `write_bw`, `read_bw`: dI…, dI…, d0 — run — d0 (the client is done),
//!   the report (five 8-byte messages: size, iterations of all QPs, peak
//!   and average bandwidth and message rate as big-endian doubles; the
//!   server prints the client's), d0 (close);
//! - `send_bw`: dI…, d0, dI…, d0 (the server's receives are posted) — run
//!   — d0 (close); with `-a` a d0 after each size and before the next;
//! - `write_lat`: d0, dI…, dI…, d0 — run — nothing;
//! - `read_lat`: the same, then d0 (close; perftest's server sends it
//!   without running, and it is answered after the client's run);
//! - `send_lat`: dI…, d0, dI…, d0 (receives posted) — run — d0 (close);
//!   with `-a` a d0 before each further size.
//!
//! The order above is the same in perftest up to 26.04 (version 6.29)
//! for these six tests (newer ones add syncs only for Write with
//! Immediate, which `iwarp perf` does not run).
//!
//! In the send tests on iWARP the dest's rkey/vaddr name the sender's
//! 4-byte credit counter of that QP, not a data buffer: the receiver
//! RDMA-Writes its count of receives there every `rx_depth / 3` receives.
//! The runner owns that, and must post the server's receives (or both
//! sides', `send_lat`) before [`Session::server`] / [`Session::client`]
//! return, since the session's last exchange tells the peer to start.

pub mod exchange;
pub mod text;
pub mod wire;

use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use dataplane::api::{
    Access, CmEvent, ConnectFailure, ConnectParams, ConnectRequest, Cq, Dataplane,
    DisconnectReason, MemoryRegistration, PostError, Qp, QpOptions, QpStatus, RecvWr, Region,
    SendWr, SgeList, WcOpcode, WcStatus,
};

use super::runner::{RemoteBuf, TestKind};
use super::ToolError;

use exchange::{Action, Exchange, Local, Side, ALL_SIZES};
use wire::Dest;

/// What both sides are started with (perftest sends none of it: the two
/// command lines must agree).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionParams {
    /// Which test.
    pub test: TestKind,
    /// Bytes per message (`-s`).
    pub size: usize,
    /// Messages (`-n`).
    pub iterations: u64,
    /// Data connections (`-q`).
    pub qps: usize,
    /// Run for this long instead (`-D`).
    pub duration: Option<Duration>,
    /// Every size from 2 B to 8 MiB (`-a`).
    pub all_sizes: bool,
    /// The read tests' IRD and ORD on the data connections (perftest's
    /// `out_reads`); ignored by the other tests.
    pub outstanding_reads: u32,
    /// The port's MTU in bytes: sent as perftest's IB MTU code.
    pub link_mtu: usize,
    /// Negotiate `outstanding_reads` as IRD and ORD on the data
    /// connections of the other tests too (perftest: 0 and 0), so that a
    /// data check of `write-bw` between two `iwarp`s may read the
    /// destination back.
    pub read_back: bool,
}

impl SessionParams {
    /// `test` with one QP, a 1500-byte link, perftest's other defaults
    /// (size, iterations: the caller's to set).
    pub fn new(test: TestKind, size: usize, iterations: u64) -> SessionParams {
        SessionParams {
            test,
            size,
            iterations,
            qps: 1,
            duration: None,
            all_sizes: false,
            outstanding_reads: 16,
            link_mtu: 1500,
            read_back: false,
        }
    }

    fn is_read(&self) -> bool {
        matches!(self.test, TestKind::ReadBw | TestKind::ReadLat)
    }

    fn sizes(&self) -> usize {
        if self.all_sizes {
            ALL_SIZES
        } else {
            1
        }
    }
}

/// One side's bandwidth report (perftest's `bw_report_data`, the part it
/// exchanges): bandwidths in MiB/s (2^20 bytes per second, perftest's
/// default unit; Gb/s when run with `--report_gbits`), message rate in
/// millions per second.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwFigures {
    /// Bytes per message.
    pub size: u64,
    /// Messages, all queue pairs together.
    pub iters: u64,
    /// Peak bandwidth.
    pub bw_peak: f64,
    /// Average bandwidth.
    pub bw_avg: f64,
    /// Average message rate.
    pub msg_rate: f64,
}

/// How long the client waits after the sync that precedes the data
/// connections before it connects: perftest's server only starts
/// listening for them after answering that sync, and a refused connect
/// leaves the caller's QP unusable (perftest's own client retries
/// instead, with fresh QPs).
const DATA_CONNECT_DELAY: Duration = Duration::from_millis(200);

/// How long the client waits between the control connection coming up
/// and its first message. Linux siw (6.1) as the passive side hands the
/// socket to the QP only after sending its MPA reply
/// (`siw_accept`: reply, then `siw_qp_socket_assoc`); an FPDU that lands
/// in between is left in the socket until more data arrives, which in
/// this ping-pong never happens (seen against a QEMU guest: the version
/// message acknowledged by TCP, never answered). perftest's own client
/// is slower to speak, and `ib_write_bw` sleeps a second there.
const FIRST_MESSAGE_DELAY: Duration = Duration::from_millis(500);

/// How long [`Session::finish`] waits for the peer to close its side.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Whether our client waits for the server to close the control
/// connection before closing its own: in every test whose close begins
/// with an exchange in which the server's Send comes last (all but
/// write_lat). Linux siw (6.1) checks after putting an FPDU on the wire
/// whether the peer's FIN arrived meanwhile (`siw_tx_hdt`, then
/// `tx_suspend`, which the socket's move to CLOSE_WAIT sets) and then
/// fails a Send that went out whole with a local QP operation error;
/// perftest's server reports it ("Bad wc status 2") and exits 1. A client
/// that answers that Send's arrival with its FIN within a few hundred
/// microseconds meets that window now and then (seen in send_bw, where
/// perftest's own slower client closes the control connection first:
/// siw↔siw captures in `deploy/interop/captures/`). Waiting for the
/// server's FIN, bounded by `CLOSE_WAIT` (2 s), leaves no window.
pub fn client_awaits_server_close(test: TestKind) -> bool {
    !matches!(test, TestKind::WriteLat)
}

/// Receive buffers kept posted on the control connection.
const RECV_SLOTS: usize = 8;
/// Bytes per control buffer: the longest message is 64.
const SLOT: usize = 256;
/// Work request id of our control Sends (receives use their slot index).
const SEND_ID: u64 = u64::MAX;

/// The control connection's verbs objects.
#[derive(Debug)]
struct Control {
    pd: dataplane::api::ProtectionDomain,
    cq: Cq,
    qp: Qp,
    mr: MemoryRegistration,
    received: VecDeque<Vec<u8>>,
}

/// A perftest session: the control connection and the data connections
/// it set up. See the module documentation.
#[derive(Debug)]
pub struct Session<'dp> {
    dp: &'dp Dataplane,
    test: TestKind,
    side: Side,
    x: Exchange,
    ctrl: Control,
    data: Vec<Qp>,
    /// CM events taken from the dataplane that were not ours to act on
    /// yet (a data connection request during an exchange).
    events: Vec<CmEvent>,
    timeout: Duration,
    peer_version: String,
    /// Where the data connections go (client) or come to (server).
    peer: Option<SocketAddrV4>,
    port: u16,
    data_params: ConnectParams,
}

/// A session that ends, finished or failed, gives its control buffer's
/// registration back: a service serves one session after another for
/// days, and a failed one (a client that went away mid-exchange, a
/// timeout) must not leave a registration behind each time. The control
/// connection itself is closed by [`Session::finish`], or reset by the
/// caller of a failed session; a registration still referred to by data
/// in flight is freed once that data has left
/// ([`dataplane::api::DeregStatus::Pending`]).
impl Drop for Session<'_> {
    fn drop(&mut self) {
        let _ = self.dp.dereg_mr(&self.ctrl.mr);
        // Freed once the control QP and the registration are gone.
        self.dp.release_pd(self.ctrl.pd);
    }
}

fn peer_err(m: impl Into<String>) -> ToolError {
    ToolError::Peer(m.into())
}

/// A 24-bit PSN, random per run as perftest's (`lrand48`): unused on
/// iWARP, but a constant would look like a bug to whoever reads a trace.
fn random_psn(salt: u64) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(salt);
    (h.finish() & 0xff_ffff) as u32
}

impl<'dp> Session<'dp> {
    /// Server: listen on `port`, accept perftest's control connection, do
    /// the exchange, then accept the `qps.len()` data connections on the
    /// same port, binding them to `qps`.
    pub fn server(
        dp: &'dp Dataplane,
        port: u16,
        p: &SessionParams,
        qps: &[Qp],
        local: &[RemoteBuf],
        timeout: Duration,
    ) -> Result<Session<'dp>, ToolError> {
        let mut s = Session::new(dp, Side::Server, None, port, p, qps, local, timeout)?;
        dp.listen(port, qps.len() + 1)?;
        let deadline = Some(s.deadline());
        let req = s.wait_request("the control connection request", port, deadline)?;
        dp.accept(&req, &s.ctrl.qp, &control_params())?;
        s.wait_established(&s.ctrl.qp.clone(), "the control connection")?;
        s.setup()?;
        Ok(s)
    }

    /// Client: connect the control connection to `peer`, exchange, connect
    /// the data QPs.
    pub fn client(
        dp: &'dp Dataplane,
        peer: SocketAddrV4,
        p: &SessionParams,
        qps: &[Qp],
        local: &[RemoteBuf],
        timeout: Duration,
    ) -> Result<Session<'dp>, ToolError> {
        let mut s = Session::new(
            dp,
            Side::Client,
            Some(peer),
            peer.port(),
            p,
            qps,
            local,
            timeout,
        )?;
        dp.connect(&s.ctrl.qp, peer, &control_params())?;
        s.wait_established(&s.ctrl.qp.clone(), "the control connection")?;
        std::thread::sleep(FIRST_MESSAGE_DELAY);
        s.setup()?;
        Ok(s)
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "the two public constructors' arguments, gathered once"
    )]
    fn new(
        dp: &'dp Dataplane,
        side: Side,
        peer: Option<SocketAddrV4>,
        port: u16,
        p: &SessionParams,
        qps: &[Qp],
        local: &[RemoteBuf],
        timeout: Duration,
    ) -> Result<Session<'dp>, ToolError> {
        if qps.is_empty() || qps.len() != local.len() || qps.len() != p.qps {
            return Err(ToolError::Usage(format!(
                "perftest session: {} QPs, {} buffers, -q {}",
                qps.len(),
                local.len(),
                p.qps
            )));
        }
        let out_reads = if p.is_read() { p.outstanding_reads } else { 1 };
        let mut gid = [0u8; 16];
        gid[..6].copy_from_slice(&dp.mac().0);
        let dests = qps
            .iter()
            .zip(local)
            .map(|(qp, b)| Dest {
                out_reads,
                qpn: qp.num().0,
                psn: random_psn(u64::from(qp.num().0)),
                rkey: b.rkey,
                vaddr: b.addr,
                gid,
                ..Dest::default()
            })
            .collect();
        let x = Exchange::new(
            side,
            exchange::script(p.test, qps.len(), p.sizes()),
            Local {
                dests,
                mtu_code: wire::ib_mtu_code(p.link_mtu),
            },
        );
        let pd = dp.alloc_pd()?;
        let cq = dp.create_cq(64)?;
        let qp = dp.create_qp(
            pd,
            &cq,
            &cq,
            QpOptions {
                max_send_wr: 8,
                max_recv_wr: RECV_SLOTS as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_ord: 0,
                max_ird: 0,
                sq_sig_all: false,
            },
        )?;
        let region = Region::new((RECV_SLOTS + 1) * SLOT).map_err(dataplane::api::Error::from)?;
        let mr = dp.reg_mr(pd, &region, 0, region.len(), Access::LOCAL_WRITE)?;
        let ctrl = Control {
            pd,
            cq,
            qp,
            mr,
            received: VecDeque::new(),
        };
        let rd = if p.is_read() || p.read_back {
            u16::try_from(p.outstanding_reads).unwrap_or(u16::MAX)
        } else {
            0
        };
        // From here the session owns the registration: dropped on any
        // error below or in the constructors, it deregisters it.
        let s = Session {
            dp,
            test: p.test,
            side,
            x,
            ctrl,
            data: qps.to_vec(),
            events: Vec::new(),
            timeout,
            peer_version: String::new(),
            peer,
            port,
            data_params: ConnectParams {
                ird: rd,
                ord: rd,
                private_data: Vec::new(),
            },
        };
        for slot in 0..RECV_SLOTS {
            post_slot(&s.ctrl, slot)?;
        }
        Ok(s)
    }

    /// The peer's buffers, per data QP.
    pub fn remote(&self) -> Vec<RemoteBuf> {
        self.x
            .peer()
            .dests
            .iter()
            .map(|d| {
                let d = d.unwrap_or_default();
                RemoteBuf {
                    addr: d.vaddr,
                    rkey: d.rkey,
                }
            })
            .collect()
    }

    /// The data QPs' `pingpong_dest`s, ours and the peer's (the last it
    /// sent; zeros where it sent none), in QP order: what perftest prints
    /// as its local and remote address lines.
    pub fn dests(&self) -> (Vec<Dest>, Vec<Dest>) {
        let remote = self
            .x
            .peer()
            .dests
            .iter()
            .map(|d| d.unwrap_or_default())
            .collect();
        (self.x.local().dests.clone(), remote)
    }

    /// The peer's perftest version string.
    pub fn peer_version(&self) -> &str {
        &self.peer_version
    }

    /// The larger of the two sides' cycle buffers: perftest lays out its
    /// buffers and cycles its remote addresses in units of
    /// `max(size, cycle buffer)`.
    pub fn cycle_buffer(&self) -> u32 {
        self.x.peer().cycle_buffer.max(wire::CYCLE_BUFFER)
    }

    /// Between two sizes of an `-a` run: the syncs perftest's send tests
    /// make there (none for the others). Call it after the previous size's
    /// loop and, for the send tests, once the receives of the next size
    /// are posted; it returns when the next size may run.
    pub fn next_size(&mut self) -> Result<(), ToolError> {
        if self.x.action() != Action::Run || self.x.runs_after() == 0 {
            return Err(ToolError::Usage(format!(
                "perftest session: no next size at {}",
                self.x.step()
            )));
        }
        self.x.proceed();
        self.drive(true)?;
        match self.x.action() {
            Action::Run => Ok(()),
            _ => Err(peer_err(format!(
                "perftest exchange stopped at {}",
                self.x.step()
            ))),
        }
    }

    /// After the measured loop: perftest's closing sync / report exchange,
    /// then every connection of the session is closed. The client's report
    /// goes to the server, which gets it back here (`write_bw`, `read_bw`;
    /// `None` otherwise and on the client).
    pub fn finish(mut self, local: Option<&BwFigures>) -> Result<Option<BwFigures>, ToolError> {
        if self.side == Side::Client {
            if let Some(r) = local {
                self.x.set_report(*r);
            }
        }
        match self.x.action() {
            // After the measured loop of the only size, or of the last
            // size of an `-a` run.
            Action::Run if self.x.runs_after() == 0 => self.x.proceed(),
            Action::Done => {}
            _ => {
                return Err(ToolError::Usage(format!(
                    "perftest session finished at {}",
                    self.x.step()
                )))
            }
        }
        self.drive(true)?;
        if self.x.action() != Action::Done {
            return Err(ToolError::Usage(format!(
                "perftest session finished before its last size ({})",
                self.x.step()
            )));
        }
        if self.side == Side::Client && client_awaits_server_close(self.test) {
            self.client_close_data_then_await_control();
        }
        self.close();
        // The control buffer is deregistered when `self` drops, below.
        let report =
            matches!(self.test, TestKind::WriteBw | TestKind::ReadBw) && self.side == Side::Server;
        Ok(report.then(|| self.x.peer().report))
    }

    /// The client's close where the server's Send ends the closing
    /// exchange ([`client_awaits_server_close`]): the data connections
    /// first, then (bounded by [`CLOSE_WAIT`]) the server's close of the
    /// control connection before ours. Closing the control connection at
    /// once, right after the server's last Send, made Linux siw's server
    /// report that Send as failed (`Bad wc status 2`) and exit 1.
    fn client_close_data_then_await_control(&mut self) {
        for qp in self
            .data
            .iter()
            .filter(|q| q.status() == QpStatus::Connected)
        {
            let _ = self.dp.disconnect(qp, false);
        }
        let deadline = Instant::now() + self.timeout.min(CLOSE_WAIT);
        while self.ctrl.qp.status() == QpStatus::Connected && Instant::now() < deadline {
            self.take_events();
            if !self.dp.poll() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Closes every connection of the session and waits (a little) for
    /// the peer's side of each close, as perftest waits for its
    /// disconnect events: a process that exits at once would reset
    /// connections the peer is still closing.
    fn close(&mut self) {
        let qps: Vec<Qp> = self
            .data
            .iter()
            .chain([&self.ctrl.qp])
            .filter(|q| q.status() == QpStatus::Connected)
            .cloned()
            .collect();
        for qp in &qps {
            let _ = self.dp.disconnect(qp, false);
        }
        let deadline = Instant::now() + self.timeout.min(CLOSE_WAIT);
        while qps.iter().any(|q| q.status() != QpStatus::Disconnected) && Instant::now() < deadline
        {
            self.take_events();
            if !self.dp.poll() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Setup: every step up to the measured run.
    fn setup(&mut self) -> Result<(), ToolError> {
        self.drive(false)?;
        if self.x.action() != Action::Run {
            return Err(peer_err(format!(
                "perftest exchange stopped at {}",
                self.x.step()
            )));
        }
        self.peer_version = self
            .x
            .peer()
            .version
            .as_ref()
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        Ok(())
    }

    /// Runs the exchange up to the next point where the caller acts. With
    /// `patient`, the first message from the peer may take as long as the
    /// peer's run (perftest waits without a limit there too), as long as
    /// the control connection stands.
    fn drive(&mut self, patient: bool) -> Result<(), ToolError> {
        let mut patient = patient;
        loop {
            match self.x.action() {
                Action::Send(bytes) => self.send(&bytes)?,
                Action::Receive(what) => {
                    let deadline = (!patient).then(|| self.deadline());
                    let msg = self.receive(what, deadline)?;
                    patient = false;
                    self.x.received(&msg).map_err(|e| peer_err(e.to_string()))?;
                }
                Action::ConnectData => {
                    self.connect_data()?;
                    self.x.proceed();
                }
                Action::Run | Action::Done => return Ok(()),
            }
        }
    }

    /// Sends one control message and waits for its completion (as
    /// perftest does: the buffer is reused at once).
    fn send(&mut self, bytes: &[u8]) -> Result<(), ToolError> {
        let what = self.x.step();
        let at = RECV_SLOTS * SLOT;
        self.ctrl
            .mr
            .region()
            .write(at, bytes)
            .map_err(dataplane::api::Error::from)?;
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        let wr = SendWr::send(SEND_ID, SgeList::single(self.ctrl.mr.sge(at as u64, len)));
        self.ctrl
            .qp
            .post_send(&wr)
            .map_err(|e| peer_err(format!("perftest control connection, {what}: post {e:?}")))?;
        let deadline = self.deadline();
        loop {
            if self.poll_ctrl(what)? {
                return Ok(());
            }
            if let Err(e) = self.idle(what, Some(deadline)) {
                // The worker completes the Send before it reports the
                // peer's close; both may land between our CQ poll and the
                // event check, so look at the CQ once more.
                if self.poll_ctrl(what)? {
                    return Ok(());
                }
                // Our last message answers the peer's last: a peer that
                // then closes in order has read it (it waits for it before
                // it closes), whether or not its acknowledgement was
                // reported before the close.
                let ctrl = self.ctrl.qp.num();
                let closed_in_order = self.events.iter().any(|e| {
                    matches!(e, CmEvent::Disconnected { qp, reason: DisconnectReason::Closed }
                        if *qp == ctrl)
                });
                return if self.x.is_done() && self.side == Side::Server && closed_in_order {
                    Ok(())
                } else {
                    Err(e)
                };
            }
        }
    }

    /// The peer's next control message.
    fn receive(
        &mut self,
        what: &'static str,
        deadline: Option<Instant>,
    ) -> Result<Vec<u8>, ToolError> {
        loop {
            if let Some(m) = self.ctrl.received.pop_front() {
                return Ok(m);
            }
            self.poll_ctrl(what)?;
            if let Some(m) = self.ctrl.received.pop_front() {
                return Ok(m);
            }
            if let Err(e) = self.idle(what, deadline) {
                // A message that came just before the close still counts.
                self.poll_ctrl(what)?;
                return self.ctrl.received.pop_front().ok_or(e);
            }
        }
    }

    /// Takes the control CQ's completions; whether our Send completed.
    fn poll_ctrl(&mut self, what: &'static str) -> Result<bool, ToolError> {
        let mut sent = false;
        while let Some(wc) = self.ctrl.cq.poll_one() {
            // Receives still posted when the connection ends are flushed:
            // the end itself is reported by its event, where it matters.
            if wc.opcode == WcOpcode::Recv && wc.status == WcStatus::WrFlushError {
                continue;
            }
            // Our last message may be flushed when the peer, having read
            // it, closes before the stream is acknowledged (perftest
            // destroys its connections at once): nothing is missing then.
            if wc.wr_id == SEND_ID && wc.status == WcStatus::WrFlushError && self.x.is_done() {
                sent = true;
                continue;
            }
            if wc.status != WcStatus::Success {
                return Err(peer_err(format!(
                    "perftest control connection failed at {what}: {:?}",
                    wc.status
                )));
            }
            match wc.opcode {
                WcOpcode::Recv => {
                    let slot = usize::try_from(wc.wr_id).unwrap_or(usize::MAX);
                    if slot >= RECV_SLOTS {
                        return Err(peer_err("perftest control connection: stray receive"));
                    }
                    let len = (wc.byte_len as usize).min(SLOT);
                    let bytes = self
                        .ctrl
                        .mr
                        .region()
                        .to_vec(slot * SLOT, len)
                        .map_err(dataplane::api::Error::from)?;
                    self.ctrl.received.push_back(bytes);
                    // The peer may close right after its last message
                    // (perftest does): its slot cannot be posted again on
                    // a connection that has ended, and needs not be. A
                    // wait for a further message hears of the close.
                    match recv_slot(&self.ctrl, slot) {
                        Ok(()) | Err(PostError::InvalidState) => {}
                        Err(e) => return Err(post_recv_err(e)),
                    }
                }
                _ => sent |= wc.wr_id == SEND_ID,
            }
        }
        Ok(sent)
    }

    /// Runs the workers (inline mode) or naps; fails past `deadline` or
    /// when the control connection is gone.
    fn idle(&mut self, what: &'static str, deadline: Option<Instant>) -> Result<(), ToolError> {
        self.take_events();
        let ctrl = self.ctrl.qp.num();
        if let Some(reason) = self.events.iter().find_map(|e| match e {
            CmEvent::Disconnected { qp, reason } if *qp == ctrl => Some(*reason),
            _ => None,
        }) {
            return Err(peer_err(format!(
                "perftest peer closed the control connection at {what}: {reason}"
            )));
        }
        if let Some(d) = deadline {
            if Instant::now() >= d {
                return Err(peer_err(format!(
                    "perftest peer: no answer within {} s at {what}",
                    self.timeout.as_secs_f64()
                )));
            }
        }
        if !self.dp.poll() {
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    fn take_events(&mut self) {
        while let Some(e) = self.dp.poll_event() {
            self.events.push(e);
        }
    }

    /// Waits for the first event `want` takes and removes it.
    fn wait_event(
        &mut self,
        what: &'static str,
        deadline: Option<Instant>,
        want: impl Fn(&CmEvent) -> bool,
    ) -> Result<CmEvent, ToolError> {
        loop {
            self.take_events();
            if let Some(i) = self.events.iter().position(&want) {
                return Ok(self.events.remove(i));
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Err(peer_err(format!(
                        "perftest peer: nothing within {} s at {what}",
                        self.timeout.as_secs_f64()
                    )));
                }
            }
            if !self.dp.poll() {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Waits for a connection request to `port`; a request MPA setup
    /// refused by itself ends the wait with its reason.
    fn wait_request(
        &mut self,
        what: &'static str,
        port: u16,
        deadline: Option<Instant>,
    ) -> Result<ConnectRequest, ToolError> {
        let e = self.wait_event(what, deadline, |e| match e {
            CmEvent::ConnectRequest(r) => r.local_port == port,
            CmEvent::RequestRefused(r) => r.local_port == port,
            _ => false,
        })?;
        match e {
            CmEvent::ConnectRequest(r) => Ok(r),
            CmEvent::RequestRefused(r) => Err(peer_err(r.to_string())),
            _ => unreachable!("matched above"),
        }
    }

    /// Waits until `qp` is connected, or says why not.
    fn wait_established(&mut self, qp: &Qp, what: &'static str) -> Result<(), ToolError> {
        let n = qp.num();
        let e = self.wait_event(what, Some(self.deadline()), |e| match e {
            CmEvent::Established { qp, .. }
            | CmEvent::Rejected { qp, .. }
            | CmEvent::ConnectFailed { qp, .. }
            | CmEvent::Disconnected { qp, .. } => *qp == n,
            _ => false,
        })?;
        match e {
            CmEvent::Established { .. } => Ok(()),
            CmEvent::Rejected { .. } => Err(peer_err(format!(
                "perftest peer rejected {what}; check that both sides run the same test \
                 with the same options"
            ))),
            CmEvent::ConnectFailed { reason, .. } => Err(peer_err(match (reason, self.peer) {
                (ConnectFailure::Refused, Some(p)) => format!(
                    "{what}: {p} refused the TCP connection; start the perftest server there first"
                ),
                (ConnectFailure::TimedOut, Some(p)) => {
                    format!("{what}: {p} is unreachable; check its address and that it is up")
                }
                (r, _) => format!("{what} failed: {r}"),
            })),
            _ => Err(peer_err(format!("{what} closed while being set up"))),
        }
    }

    /// The data connections, perftest's way: the client connects each QP
    /// in turn (so the server's i-th accepted connection is our QP i), the
    /// server accepts the first `qps` requests to its port in arrival order.
    fn connect_data(&mut self) -> Result<(), ToolError> {
        let data = self.data.clone();
        match self.peer {
            Some(peer) => {
                std::thread::sleep(DATA_CONNECT_DELAY);
                for qp in &data {
                    self.dp.connect(qp, peer, &self.data_params)?;
                    self.wait_established(qp, "a data connection")?;
                }
            }
            None => {
                let port = self.port;
                for qp in &data {
                    let deadline = Some(self.deadline());
                    let req = self.wait_request("a data connection request", port, deadline)?;
                    self.dp.accept(&req, qp, &self.data_params)?;
                }
                for qp in &data {
                    self.wait_established(qp, "a data connection")?;
                }
            }
        }
        Ok(())
    }
}

fn post_slot(ctrl: &Control, slot: usize) -> Result<(), ToolError> {
    recv_slot(ctrl, slot).map_err(post_recv_err)
}

/// Posts receive slot `slot` of the control connection.
fn recv_slot(ctrl: &Control, slot: usize) -> Result<(), PostError> {
    let wr = RecvWr {
        wr_id: slot as u64,
        sges: SgeList::single(ctrl.mr.sge((slot * SLOT) as u64, SLOT as u32)),
    };
    ctrl.qp.post_recv(&wr)
}

fn post_recv_err(e: PostError) -> ToolError {
    peer_err(format!("perftest control connection: post receive {e:?}"))
}

/// The control connection's parameters: IRD/ORD 0/0, no private data,
/// as perftest's (its control QP is a Send QP).
fn control_params() -> ConnectParams {
    ConnectParams {
        ird: 0,
        ord: 0,
        private_data: Vec::new(),
    }
}
