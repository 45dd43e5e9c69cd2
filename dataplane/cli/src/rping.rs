//! `iwarp rping`: the ping-pong of rdmacm-utils' `rping` (Send, RDMA Read,
//! RDMA Write, data checked), as client or server, interoperable with it on
//! the wire.
//!
//! It sits on the application API ([`dataplane::api`]) like any RDMA program:
//! [`server`] and [`client`] take an open [`Dataplane`] and run one
//! connection, so tests drive them in-process; [`run`] is the command line
//! around them. The protocol follows rdma-core's
//! `librdmacm/examples/rping.c` and was checked against a siw↔siw capture
//! (`rping -C 10 -S 100`):
//!
//! - Connection: the client connects with IRD = ORD = 1 and no private data
//!   (MPA revision 2 carries just the IRD/ORD words); rping's server accepts
//!   with what the client asked for, which is 1/1 again.
//! - Control messages: a 16-byte `rping_rdma_info` in network byte order
//!   (buffer address u64, rkey u32, size u32), sent by Send ([`RpingInfo`]).
//! - One ping: the client fills its start buffer ([`ping_data`]) and
//!   advertises it; the server RDMA Reads it and answers with a go-ahead
//!   Send (16 zero bytes: rping's server never fills its send buffer); the
//!   client advertises its sink buffer; the server RDMA Writes the string it
//!   read (up to and including its NUL) into it and sends a second
//!   go-ahead; the client compares the sink with what it sent (`-V`).
//! - End: the client disconnects after `-C` pings; the server ends when the
//!   connection does, between pings. Under [`run`], SIGINT or SIGTERM ends
//!   either side between pings too, with its summary.
//!
//! Where it differs from rping without a difference on the wire: the
//! server sends its second go-ahead right behind the RDMA Write instead of
//! after the Write's completion (RDMAP delivers them in order; our Write
//! completes only when TCP has acknowledged it, which would cost a delayed
//! ACK per ping); the server takes any ping size up to [`MAX_SIZE`]
//! whatever its own `-S`; rping's `-P` (persistent server) serves its
//! clients one after another, not at once ([`persistent_server`]); `-I`
//! (the client's source address) is the endpoint's own address, so it
//! stands for `--ip` or must agree with it; rping's `-q` (a queue pair the
//! program creates and moves through its states itself) is refused, as the
//! connection manager always moves ours, and the quiet summary is
//! `--quiet`.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4, ToSocketAddrs};
use std::time::{Duration, Instant};

use clap::Args;

use super::common::{catch_interrupts, interrupted, EndpointArgs};
use super::ToolError;
use dataplane::api::{
    Access, CmEvent, ConnectParams, ConnectRequest, Cq, Dataplane, DisconnectReason,
    MemoryRegistration, ProtectionDomain, Qp, QpOptions, QpStatus, RecvWr, Region, SendWr, SgeList,
    Stag, TerminateOrigin, WcOpcode, WcStatus, WorkCompletion,
};

/// rping's default port.
pub const DEFAULT_PORT: u16 = 7174;
/// Length of an `rping_rdma_info` message.
pub const INFO_LEN: usize = 16;
/// rping's smallest ping: room for `"rdma-ping-%d: "` and the digits of
/// `INT_MAX`, both with their NULs (as rping computes it).
pub const MIN_SIZE: usize = 26;
/// rping's largest ping (its 64 KiB buffer less one).
pub const MAX_SIZE: usize = 65_535;
/// rping's default ping size.
pub const DEFAULT_SIZE: usize = 64;
/// How long a step waits for the peer unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// rping's IRD and ORD (`responder_resources`, `initiator_depth` of its
/// `rdma_conn_param`), on both sides of the connection.
pub const CONN_DEPTH: u16 = 1;
/// Send queue depth, as rping's.
const SQ_DEPTH: u32 = 16;
/// Receive queue depth, as rping's.
const RQ_DEPTH: u32 = 2;
/// How long the client lets the server settle between the MPA reply and
/// its first Send. Linux siw as responder sends its reply before it hands
/// the socket to the queue pair (`siw_accept`); bytes arriving in between
/// are left in the socket unread until more bytes come, and rping's server
/// sends nothing until it has the first advertisement: the run stalls. An
/// rping client takes milliseconds to get there (about 10 ms in the siw
/// capture); a dataplane answers within microseconds, seen to hit the
/// window against a siw guest. The margin covers a guest whose CPU is
/// descheduled in the window. Once per run.
const FIRST_SEND_DELAY: Duration = Duration::from_millis(100);

/// The buffer one side advertises to the other: rping's
/// `struct rping_rdma_info`, 16 bytes in network byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpingInfo {
    /// Tagged offset of the buffer (its virtual address, as rping sends).
    pub addr: u64,
    /// Its STag.
    pub rkey: u32,
    /// Its length in bytes (the sender's `-S`).
    pub size: u32,
}

impl RpingInfo {
    /// The message as rping sends it.
    pub fn encode(&self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// Reads a received message; rping accepts exactly 16 bytes.
    pub fn decode(b: &[u8]) -> Result<RpingInfo, ToolError> {
        let b: &[u8; INFO_LEN] = b.try_into().map_err(|_| {
            ToolError::Peer(format!(
                "received a {}-byte message where rping sends {INFO_LEN} bytes",
                b.len()
            ))
        })?;
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[..8]);
        let mut rkey = [0u8; 4];
        rkey.copy_from_slice(&b[8..12]);
        let mut size = [0u8; 4];
        size.copy_from_slice(&b[12..]);
        Ok(RpingInfo {
            addr: u64::from_be_bytes(addr),
            rkey: u32::from_be_bytes(rkey),
            size: u32::from_be_bytes(size),
        })
    }
}

/// What rping's client puts in its start buffer for ping number `ping`:
/// `"rdma-ping-<ping>: "`, then printable characters from `'A'` to `'z'`
/// in turn (starting one further along at each ping), the last byte NUL.
/// A prefix longer than the buffer is cut as `snprintf` cuts it.
pub fn ping_data(ping: u64, size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; size];
    let prefix = format!("rdma-ping-{ping}: ");
    let written = prefix.len().min(size.saturating_sub(1));
    buf[..written].copy_from_slice(&prefix.as_bytes()[..written]);
    // 58 characters from 'A' to 'z'; each ping starts one further on.
    let mut c = b'A' + (ping % 58) as u8;
    for b in buf.iter_mut().skip(prefix.len()) {
        *b = c;
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    if let Some(last) = buf.last_mut() {
        *last = 0;
    }
    buf
}

/// The bytes up to the first NUL, as rping prints them with `%s`.
fn as_c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Which end of the ping-pong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpingRole {
    /// `-c`: advertises buffers and checks the echo.
    Client,
    /// `-s`: RDMA Reads the ping and RDMA Writes it back.
    Server,
}

/// How a run goes: rping's options, already checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpingOptions {
    /// TCP port the server listens on and the client connects to.
    pub port: u16,
    /// Pings the client sends (`None`: until stopped, rping's `-C 0`).
    /// The server, like rping's, runs until the client disconnects.
    pub count: Option<u64>,
    /// Bytes per ping (the client's buffers; the server takes any size up
    /// to [`MAX_SIZE`] the client advertises).
    pub size: usize,
    /// Print each ping's data (`-v`).
    pub verbose: bool,
    /// Check each ping's data (`-V`): the client compares the echo with
    /// what it sent; the server compares what it read with rping's pattern.
    pub validate: bool,
    /// Print each step on stderr (`-d`).
    pub debug: bool,
    /// How long any one step may wait for the peer.
    pub timeout: Duration,
    /// How long the server waits for a client (`None`: for ever, as rping).
    pub accept_timeout: Option<Duration>,
    /// Fault injection for tests: the server flips a byte of the echo in
    /// this ping, so that a validating client must report a mismatch.
    pub corrupt_ping: Option<u64>,
}

impl Default for RpingOptions {
    fn default() -> RpingOptions {
        RpingOptions {
            port: DEFAULT_PORT,
            count: None,
            size: DEFAULT_SIZE,
            verbose: false,
            validate: false,
            debug: false,
            timeout: DEFAULT_TIMEOUT,
            accept_timeout: None,
            corrupt_ping: None,
        }
    }
}

impl RpingOptions {
    fn check(&self) -> Result<(), ToolError> {
        if !(MIN_SIZE..=MAX_SIZE).contains(&self.size) {
            return Err(ToolError::Usage(format!(
                "invalid size {} (valid range is {MIN_SIZE} to {MAX_SIZE})",
                self.size
            )));
        }
        if self.timeout.is_zero() {
            return Err(ToolError::Usage("the timeout must be positive".into()));
        }
        Ok(())
    }
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpingSummary {
    /// Which end this was.
    pub role: RpingRole,
    /// The other end.
    pub peer: SocketAddrV4,
    /// Pings completed (both RDMA operations done, both go-aheads sent or
    /// received).
    pub iterations: u64,
    /// Bytes per ping (the client's size; on the server, the last size the
    /// client advertised).
    pub size: usize,
    /// Bytes carried by RDMA Read and RDMA Write together.
    pub bytes_moved: u64,
    /// Bytes compared and found right (with `-V`).
    pub bytes_verified: u64,
    /// From the connection's establishment to its end.
    pub elapsed: Duration,
    /// A signal stopped the run between two pings ([`run`] catches SIGINT
    /// and SIGTERM).
    pub interrupted: bool,
}

impl core::fmt::Display for RpingSummary {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (role, dir) = match self.role {
            RpingRole::Client => ("client", "with"),
            RpingRole::Server => ("server", "from"),
        };
        let per = if self.iterations > 0 {
            self.elapsed.as_secs_f64() * 1e6 / self.iterations as f64
        } else {
            0.0
        };
        write!(
            f,
            "rping {role}: {} pings of {} bytes {dir} {} in {:.3} ms ({per:.1} us per ping), \
             {} bytes moved, {} bytes verified",
            self.iterations,
            self.size,
            self.peer,
            self.elapsed.as_secs_f64() * 1e3,
            self.bytes_moved,
            self.bytes_verified
        )?;
        if self.interrupted {
            f.write_str(", stopped by a signal")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------
// Resources and waiting.
// ---------------------------------------------------------------------

/// A registered buffer of its own region.
struct Buf {
    region: Region,
    mr: MemoryRegistration,
}

impl Buf {
    fn new(
        dp: &Dataplane,
        pd: ProtectionDomain,
        len: usize,
        access: Access,
    ) -> Result<Buf, ToolError> {
        let region = Region::new(len).map_err(|e| ToolError::Dataplane(e.into()))?;
        let mr = dp.reg_mr(pd, &region, 0, len, access)?;
        Ok(Buf { region, mr })
    }

    fn info(&self, size: usize) -> RpingInfo {
        RpingInfo {
            addr: self.mr.addr(),
            rkey: self.mr.rkey().0,
            size: size as u32,
        }
    }

    fn read(&self, len: usize) -> Vec<u8> {
        // In range by construction: callers pass at most the registered length.
        self.region.to_vec(0, len).unwrap_or_default()
    }
}

/// Why a wait ended without what it waited for.
enum Stop {
    /// The connection ended.
    Gone(DisconnectReason),
    /// A signal arrived during an interruptible wait.
    Interrupted,
    /// Anything else: the run fails with this.
    Fail(ToolError),
}

impl From<ToolError> for Stop {
    fn from(e: ToolError) -> Stop {
        Stop::Fail(e)
    }
}

/// One side's connection: the queue pair, its completion queue and the
/// receive it keeps posted.
struct Conn<'a> {
    dp: &'a Dataplane,
    pd: ProtectionDomain,
    cq: Cq,
    qp: Qp,
    recv: Buf,
    peer: SocketAddrV4,
    timeout: Duration,
    debug: bool,
    next_id: u64,
    /// RDMA Writes completed so far.
    writes_done: u64,
    /// Our connection's end was reported (its `Disconnected` event).
    gone: bool,
    /// A client that asked to connect once ours had ended: the next one a
    /// server that goes on serves, rather than refusing it.
    next: Option<ConnectRequest>,
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        // A service answers one client after another: give back what this
        // connection registered, and its domain once nothing is left in it.
        let _ = self.dp.dereg_mr(&self.recv.mr);
        self.dp.release_pd(self.pd);
    }
}

impl<'a> Conn<'a> {
    fn new(dp: &'a Dataplane, peer: SocketAddrV4, o: &RpingOptions) -> Result<Conn<'a>, ToolError> {
        let pd = dp.alloc_pd()?;
        let cq = dp.create_cq(2 * SQ_DEPTH)?;
        let qp = dp.create_qp(
            pd,
            &cq,
            &cq,
            QpOptions {
                max_send_wr: SQ_DEPTH,
                max_recv_wr: RQ_DEPTH,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_ord: u32::from(CONN_DEPTH),
                max_ird: u32::from(CONN_DEPTH),
                sq_sig_all: false,
            },
        )?;
        let recv = Buf::new(dp, pd, INFO_LEN, Access::LOCAL_WRITE)?;
        Ok(Conn {
            dp,
            pd,
            cq,
            qp,
            recv,
            peer,
            timeout: o.timeout,
            debug: o.debug,
            next_id: 1,
            writes_done: 0,
            gone: false,
            next: None,
        })
    }

    /// A registered buffer in the connection's protection domain.
    fn buf(&self, len: usize, access: Access) -> Result<Buf, ToolError> {
        Buf::new(self.dp, self.pd, len, access)
    }

    fn debug(&self, what: impl FnOnce() -> String) {
        if self.debug {
            eprintln!("rping: {}", what());
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn post_recv(&mut self) -> Result<(), ToolError> {
        let wr = RecvWr {
            wr_id: 0,
            sges: SgeList::single(self.recv.mr.sge(0, INFO_LEN as u32)),
        };
        self.qp
            .post_recv(&wr)
            .map_err(|e| ToolError::Peer(format!("cannot post a receive: {e:?}")))
    }

    fn post(&mut self, wr: &SendWr, what: &str) -> Result<(), Stop> {
        match self.qp.post_send(wr) {
            Ok(()) => Ok(()),
            Err(e) if self.qp.status() == QpStatus::Disconnected => {
                // The connection went; its event says why.
                self.debug(|| format!("posting {what}: {e:?}"));
                Err(self.wait_gone())
            }
            Err(e) => Err(Stop::Fail(ToolError::Peer(format!(
                "cannot post {what}: {e:?}"
            )))),
        }
    }

    fn send(&mut self, buf: &Buf, what: &str) -> Result<(), Stop> {
        let wr = SendWr::send(self.id(), SgeList::single(buf.mr.sge(0, INFO_LEN as u32)));
        self.debug(|| format!("send {what}"));
        self.post(&wr, what)
    }

    /// After a failed post on a dead queue pair: the reason, from the
    /// event that must follow.
    fn wait_gone(&mut self) -> Stop {
        let deadline = Instant::now() + self.timeout;
        while Instant::now() < deadline {
            if let Some(reason) = self.take_events() {
                return Stop::Gone(reason);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Stop::Gone(DisconnectReason::TimedOut)
    }

    /// Handles waiting CM events; the reason if our connection ended.
    fn take_events(&mut self) -> Option<DisconnectReason> {
        while let Some(ev) = self.dp.poll_event() {
            match ev {
                CmEvent::Disconnected { qp, reason } if qp == self.qp.num() => {
                    self.debug(|| format!("disconnected: {reason}"));
                    self.gone = true;
                    return Some(reason);
                }
                // A client that comes as ours leaves (its close may end
                // before ours does) is the next one, not a second one.
                CmEvent::ConnectRequest(req) if self.gone && self.next.is_none() => {
                    self.debug(|| format!("holding the next client, {}", req.remote));
                    self.next = Some(req);
                }
                CmEvent::ConnectRequest(req) => {
                    // Like rping's server: one client at a time.
                    self.debug(|| format!("refusing a second client, {}", req.remote));
                    let _ = self.dp.reject(&req, &[]);
                }
                other => self.debug(|| format!("event: {other}")),
            }
        }
        None
    }

    /// Looks at one completion: `Some` if it is the awaited one.
    fn take_wc(
        &mut self,
        wc: WorkCompletion,
        want: WcOpcode,
        what: &str,
    ) -> Result<Option<WorkCompletion>, Stop> {
        match wc.status {
            WcStatus::Success => {}
            // Flushed work follows a disconnect, whose event says why.
            WcStatus::WrFlushError => return Ok(None),
            s => {
                let hint = match (wc.opcode, s) {
                    (WcOpcode::Recv, WcStatus::LocalLengthError) => {
                        " (a message longer than rping's 16 bytes: is the peer rping?)"
                    }
                    (_, WcStatus::RemoteAccessError) => " (the peer refused access to its buffer)",
                    _ => "",
                };
                return Err(Stop::Fail(ToolError::Peer(format!(
                    "{:?} failed while waiting for {what}: {s:?}{hint}",
                    wc.opcode
                ))));
            }
        }
        if wc.opcode == WcOpcode::RdmaWrite {
            self.writes_done += 1;
        }
        if wc.opcode == want {
            return Ok(Some(wc));
        }
        match wc.opcode {
            WcOpcode::Send | WcOpcode::RdmaWrite => Ok(None),
            op => Err(Stop::Fail(ToolError::Peer(format!(
                "unexpected {op:?} completion while waiting for {what}"
            )))),
        }
    }

    /// Waits for the completion `want`, taking send completions and CM
    /// events on the way; fails after the timeout.
    fn wait(&mut self, want: WcOpcode, what: &str) -> Result<WorkCompletion, Stop> {
        self.wait_for(want, what, false)
    }

    /// [`Conn::wait`], which a signal may end if `interruptible`.
    fn wait_for(
        &mut self,
        want: WcOpcode,
        what: &str,
        interruptible: bool,
    ) -> Result<WorkCompletion, Stop> {
        let deadline = Instant::now() + self.timeout;
        let mut idle = 0u32;
        loop {
            let mut any = false;
            while let Some(wc) = self.cq.poll_one() {
                any = true;
                if let Some(wc) = self.take_wc(wc, want, what)? {
                    self.debug(|| format!("{what}: {:?} of {} bytes", wc.opcode, wc.byte_len));
                    return Ok(wc);
                }
            }
            if let Some(reason) = self.take_events() {
                // What completed before the end still counts.
                while let Some(wc) = self.cq.poll_one() {
                    if let Ok(Some(wc)) = self.take_wc(wc, want, what) {
                        return Ok(wc);
                    }
                }
                return Err(Stop::Gone(reason));
            }
            if any {
                idle = 0;
                continue;
            }
            if interruptible && interrupted() {
                return Err(Stop::Interrupted);
            }
            if Instant::now() >= deadline {
                return Err(Stop::Fail(ToolError::Peer(format!(
                    "no {what} from {} within {:?}: the peer stopped answering",
                    self.peer, self.timeout
                ))));
            }
            idle += 1;
            if idle < 200 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Waits until `n` RDMA Writes have completed.
    fn wait_writes(&mut self, n: u64) -> Result<(), Stop> {
        while self.writes_done < n {
            self.wait(WcOpcode::RdmaWrite, "an RDMA Write's completion")?;
        }
        Ok(())
    }

    /// Waits for a 16-byte message and re-posts the receive for the next.
    fn recv_info(&mut self, what: &str) -> Result<RpingInfo, Stop> {
        self.recv_info_for(what, false)
    }

    /// [`Conn::recv_info`], which a signal may end if `interruptible`.
    fn recv_info_for(&mut self, what: &str, interruptible: bool) -> Result<RpingInfo, Stop> {
        let wc = self.wait_for(WcOpcode::Recv, what, interruptible)?;
        let bytes = self.recv.read(wc.byte_len.min(INFO_LEN as u32) as usize);
        if wc.byte_len as usize != INFO_LEN {
            return Err(Stop::Fail(ToolError::Peer(format!(
                "{what}: received {} bytes where rping sends {INFO_LEN} (is the peer rping?)",
                wc.byte_len
            ))));
        }
        self.post_recv()?;
        Ok(RpingInfo::decode(&bytes)?)
    }

    /// Waits for the connection to come up (or not).
    fn wait_established(&mut self, deadline: Instant) -> Result<(), ToolError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ToolError::Peer(format!(
                    "no answer from {} within {:?}: the peer is unreachable; \
                     check its address and that it is up",
                    self.peer, self.timeout
                )));
            }
            if interrupted() {
                return Err(ToolError::Peer(format!(
                    "interrupted while connecting with {}",
                    self.peer
                )));
            }
            let Some(ev) = self.dp.wait_event(left.min(Duration::from_millis(50))) else {
                continue;
            };
            let me = self.qp.num();
            match ev {
                CmEvent::Established { qp, info } if qp == me => {
                    self.debug(|| {
                        format!(
                            "connected to {}: IRD {} ORD {}, CRC {}",
                            info.remote, info.ird, info.ord, info.crc
                        )
                    });
                    return Ok(());
                }
                CmEvent::Rejected { qp, private_data } if qp == me => {
                    return Err(ToolError::Peer(format!(
                        "connection to {} rejected{}",
                        self.peer,
                        if private_data.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", as_c_string(&private_data))
                        }
                    )))
                }
                CmEvent::ConnectFailed { qp, reason } if qp == me => {
                    return Err(ToolError::Peer(format!(
                        "connection with {} failed: {reason}",
                        self.peer
                    )))
                }
                CmEvent::Disconnected { qp, reason } if qp == me => {
                    return Err(ToolError::Peer(format!(
                        "connection with {} ended during setup: {reason}",
                        self.peer
                    )))
                }
                other => self.debug(|| format!("event: {other}")),
            }
        }
    }

    /// Ends the connection (if still up) and waits for the end, briefly.
    fn close(&mut self) {
        if self.gone {
            return;
        }
        if self.qp.worker().is_none() || self.qp.status() == QpStatus::Disconnected {
            let _ = self.take_events();
            return;
        }
        self.debug(|| "disconnecting".into());
        if self.dp.disconnect(&self.qp, false).is_err() {
            return;
        }
        let deadline = Instant::now() + self.timeout;
        while Instant::now() < deadline {
            if self.take_events().is_some() {
                return;
            }
            while self.cq.poll_one().is_some() {}
            std::thread::sleep(Duration::from_micros(200));
        }
        // The peer did not finish the close: reset.
        let _ = self.dp.disconnect(&self.qp, true);
    }
}

fn gone(peer: SocketAddrV4, ping: u64, what: &str, reason: DisconnectReason) -> ToolError {
    ToolError::Peer(format!(
        "{peer} went away in ping {ping} while we waited for {what}: {reason}"
    ))
}

fn write_line(out: &mut dyn Write, line: &str) -> Result<(), ToolError> {
    writeln!(out, "{line}")?;
    Ok(())
}

// ---------------------------------------------------------------------
// The server.
// ---------------------------------------------------------------------

/// Runs rping's server on `dp`: listens on `opts.port`, takes one client,
/// answers its pings until it disconnects. `-v` lines go to `out`.
pub fn server(
    dp: &Dataplane,
    opts: &RpingOptions,
    out: &mut dyn Write,
) -> Result<RpingSummary, ToolError> {
    server_with(dp, opts, out, &mut |_| {})
}

/// [`server`], calling `accepted` with the client's address once its
/// connection is established, before the first ping: a service logs the
/// client it serves then, not only when the run ends.
pub fn server_with(
    dp: &Dataplane,
    opts: &RpingOptions,
    out: &mut dyn Write,
    accepted: &mut dyn FnMut(SocketAddrV4),
) -> Result<RpingSummary, ToolError> {
    // This server ends with its client: one that came as it left is
    // refused when `NextClient` drops.
    server_next(dp, opts, out, accepted, &mut NextClient::new(dp))
}

/// A client that asked to connect as the previous one left, held for the
/// next [`server_next`] of a server that goes on serving (the previous
/// client's close may end before the server's, so its successor's request
/// can come while the server still closes). Dropped with a client still
/// held, it refuses that client rather than leave it waiting.
pub struct NextClient<'a> {
    dp: &'a Dataplane,
    req: Option<ConnectRequest>,
}

impl<'a> NextClient<'a> {
    /// None held yet, for a server on `dp`.
    pub fn new(dp: &'a Dataplane) -> NextClient<'a> {
        NextClient { dp, req: None }
    }
}

impl std::fmt::Debug for NextClient<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NextClient")
            .field("req", &self.req)
            .finish()
    }
}

impl Drop for NextClient<'_> {
    fn drop(&mut self) {
        if let Some(req) = self.req.take() {
            let _ = self.dp.reject(&req, &[]);
        }
    }
}

/// [`server_with`] for a server that goes on serving, one client after
/// another: serves the client `next` holds, if any, else waits for one,
/// and leaves in `next` a client that came as this one left.
pub fn server_next(
    dp: &Dataplane,
    opts: &RpingOptions,
    out: &mut dyn Write,
    accepted: &mut dyn FnMut(SocketAddrV4),
    next: &mut NextClient<'_>,
) -> Result<RpingSummary, ToolError> {
    opts.check()?;
    let me = SocketAddrV4::new(dp.ip(), opts.port);
    dp.listen(opts.port, 3)
        .map_err(|e| ToolError::Peer(format!("cannot listen on {me}: {e}")))?;
    if opts.debug {
        eprintln!("rping: listening on {me}");
    }
    let start = Instant::now();
    let req = match next.req.take() {
        Some(req) => req,
        None => wait_client(dp, opts, me, start)?,
    };
    let mut c = match Conn::new(dp, req.remote, opts) {
        Ok(c) => c,
        Err(e) => {
            // Not left hanging: the client hears a reject.
            let _ = dp.reject(&req, &[]);
            return Err(e);
        }
    };
    c.debug(|| {
        format!(
            "connection request from {}: IRD {} ORD {}, {} bytes of private data",
            req.remote,
            req.ird.map_or_else(|| "none".into(), |v| v.to_string()),
            req.ord.map_or_else(|| "none".into(), |v| v.to_string()),
            req.private_data.len()
        )
    });
    let result = serve(&mut c, &req, opts, out, accepted);
    c.close();
    next.req = c.next.take();
    result
}

/// Waits for a client's connection request on `me`.
fn wait_client(
    dp: &Dataplane,
    opts: &RpingOptions,
    me: SocketAddrV4,
    start: Instant,
) -> Result<ConnectRequest, ToolError> {
    loop {
        let left = match opts.accept_timeout {
            Some(t) => t.saturating_sub(start.elapsed()),
            None => Duration::from_millis(500),
        };
        if left.is_zero() {
            return Err(ToolError::Peer(format!(
                "no client connected to {me} within {:?}",
                opts.accept_timeout.unwrap_or_default()
            )));
        }
        if interrupted() {
            return Err(ToolError::Peer(format!(
                "interrupted while waiting for a client on {me}"
            )));
        }
        match dp.wait_event(left.min(Duration::from_millis(500))) {
            Some(CmEvent::ConnectRequest(r)) if r.local_port == opts.port => return Ok(r),
            // MPA setup refused the client by itself (it heard a reject).
            Some(CmEvent::RequestRefused(r)) if r.local_port == opts.port => {
                return Err(ToolError::Peer(r.to_string()))
            }
            Some(other) if opts.debug => eprintln!("rping: event: {other}"),
            _ => {}
        }
    }
}

/// A wait's end as the run's error: the peer leaving mid-ping is a failure.
fn lift<T>(peer: SocketAddrV4, ping: u64, what: &str, r: Result<T, Stop>) -> Result<T, ToolError> {
    match r {
        Ok(t) => Ok(t),
        Err(Stop::Gone(reason)) => Err(gone(peer, ping, what, reason)),
        Err(Stop::Interrupted) => Err(ToolError::Peer(format!(
            "interrupted in ping {ping} while we waited for {what}"
        ))),
        Err(Stop::Fail(e)) => Err(e),
    }
}

fn serve(
    c: &mut Conn<'_>,
    req: &ConnectRequest,
    opts: &RpingOptions,
    out: &mut dyn Write,
    accepted: &mut dyn FnMut(SocketAddrV4),
) -> Result<RpingSummary, ToolError> {
    let dp = c.dp;
    // rping's server registers its own -S; taking any size a client may
    // advertise costs 64 KiB and spares a failed Read.
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let rdma = c.buf(MAX_SIZE, rw)?;
    // rping's server sends its go-ahead from a buffer it never fills.
    let go = c.buf(INFO_LEN, Access::NONE)?;
    c.post_recv()?;
    let params = ConnectParams {
        ird: CONN_DEPTH,
        ord: CONN_DEPTH,
        private_data: Vec::new(),
    };
    dp.accept(req, &c.qp, &params)
        .map_err(|e| ToolError::Peer(format!("cannot accept {}: {e}", req.remote)))?;
    c.wait_established(Instant::now() + c.timeout)?;
    accepted(req.remote);
    let started = Instant::now();
    let mut s = RpingSummary {
        role: RpingRole::Server,
        peer: req.remote,
        iterations: 0,
        size: 0,
        bytes_moved: 0,
        bytes_verified: 0,
        elapsed: Duration::ZERO,
        interrupted: false,
    };
    let peer = c.peer;
    let mut writes = 0u64;
    loop {
        let ping = s.iterations;
        let src = match c.recv_info_for("the client's start buffer advertisement", true) {
            Ok(i) => i,
            // Between pings, the end of the connection is the end of the run.
            Err(Stop::Gone(DisconnectReason::Closed | DisconnectReason::Reset)) => break,
            Err(Stop::Interrupted) => {
                s.interrupted = true;
                break;
            }
            r => lift(peer, ping, "the next ping", r)?,
        };
        let len = src.size as usize;
        if len == 0 || len > MAX_SIZE {
            return Err(ToolError::Peer(format!(
                "ping {ping}: the client advertised {len} bytes \
                 (rping sends {MIN_SIZE} to {MAX_SIZE})"
            )));
        }
        s.size = len;
        // The next Read lands where the last Write was sent from.
        let r = c.wait_writes(writes);
        lift(peer, ping, "the previous RDMA Write's completion", r)?;
        let wr = SendWr::read(c.id(), rdma.mr.sge(0, len as u32), src.addr, Stag(src.rkey));
        c.debug(|| {
            format!(
                "RDMA Read of {len} bytes from {:#x} rkey {:#x}",
                src.addr, src.rkey
            )
        });
        let r = c
            .post(&wr, "the RDMA Read")
            .and_then(|()| c.wait(WcOpcode::RdmaRead, "the RDMA Read"));
        lift(peer, ping, "the RDMA Read", r)?;
        s.bytes_moved += len as u64;
        let data = rdma.read(len);
        if opts.verbose {
            write_line(out, &format!("server ping data: {}", as_c_string(&data)))?;
        }
        if opts.validate {
            let want = ping_data(ping, len);
            if let Some(at) = data.iter().zip(&want).position(|(a, b)| a != b) {
                return Err(ToolError::DataMismatch(format!(
                    "ping {ping}: byte {at} of the {len} read from the client is {:#04x}, \
                     rping's pattern has {:#04x}",
                    data[at], want[at]
                )));
            }
            s.bytes_verified += len as u64;
        }
        let r = c.send(&go, "the go-ahead after the RDMA Read");
        lift(peer, ping, "the go-ahead", r)?;
        let r = c.recv_info("the client's sink buffer advertisement");
        let sink = lift(peer, ping, "the sink buffer advertisement", r)?;
        // rping echoes the string it read, its NUL included.
        let strlen = data.iter().position(|&b| b == 0).map_or(len, |n| n + 1);
        let wlen = strlen.min(sink.size as usize);
        if opts.corrupt_ping == Some(ping) && wlen > 0 {
            let at = wlen / 2;
            rdma.region
                .write(at, &[data[at] ^ 0x20])
                .map_err(|e| ToolError::Dataplane(e.into()))?;
        }
        let wr = SendWr::write(
            c.id(),
            SgeList::single(rdma.mr.sge(0, wlen as u32)),
            sink.addr,
            Stag(sink.rkey),
        );
        c.debug(|| {
            format!(
                "RDMA Write of {wlen} bytes to {:#x} rkey {:#x}",
                sink.addr, sink.rkey
            )
        });
        // The go-ahead follows the Write at once: the peer sees the Send only
        // after the Write is placed (RDMAP orders them), which is all
        // rping's wait for the Write's completion buys. Waiting here
        // instead would hold the go-ahead until TCP acknowledges the Write
        // (our completions wait for that, the Write being sent from the
        // buffer itself): a delayed ACK per ping.
        let r = c.post(&wr, "the RDMA Write");
        lift(peer, ping, "the RDMA Write", r)?;
        writes += 1;
        s.bytes_moved += wlen as u64;
        let r = c.send(&go, "the go-ahead after the RDMA Write");
        lift(peer, ping, "the go-ahead", r)?;
        s.iterations += 1;
    }
    s.elapsed = started.elapsed();
    let _ = dp.dereg_mr(&rdma.mr);
    let _ = dp.dereg_mr(&go.mr);
    Ok(s)
}

/// How a persistent server ([`persistent_server`]) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersistentEnd {
    /// SIGINT or SIGTERM (caught by [`catch_interrupts`]).
    Interrupted,
    /// No client came within [`RpingOptions::accept_timeout`] of the
    /// previous one's end (or of the start).
    Idle,
}

/// rping's `-P`: serves one client after another on `opts.port` until a
/// signal stops it or, with [`RpingOptions::accept_timeout`], until no
/// client comes for that long. rdma-core's persistent server serves its
/// clients at once, a thread each; this one serves them in turn (a
/// client that connects while another is served is refused, as by the
/// one-client server, and may try again; one that connects as the
/// previous one leaves is served next). A client that fails does not end the
/// server: `each` gets every client's outcome, good or not. Fails only
/// when it cannot listen or its options are wrong.
pub fn persistent_server(
    dp: &Dataplane,
    opts: &RpingOptions,
    out: &mut dyn Write,
    each: &mut dyn FnMut(Result<&RpingSummary, &ToolError>),
) -> Result<PersistentEnd, ToolError> {
    opts.check()?;
    let me = SocketAddrV4::new(dp.ip(), opts.port);
    // Listening is kept from one client to the next (listen is idempotent,
    // so each serve below finds it in place).
    dp.listen(opts.port, 3)
        .map_err(|e| ToolError::Peer(format!("cannot listen on {me}: {e}")))?;
    // A client that came as the last one left is refused when this
    // drops, not left waiting.
    let mut next = NextClient::new(dp);
    loop {
        let started = Instant::now();
        let mut connected = false;
        let r = server_next(dp, opts, out, &mut |_| connected = true, &mut next);
        match r {
            Ok(s) => {
                each(Ok(&s));
                if s.interrupted {
                    return Ok(PersistentEnd::Interrupted);
                }
            }
            // Before a client was connected, the wait itself ended.
            Err(_) if !connected && interrupted() => return Ok(PersistentEnd::Interrupted),
            Err(_) if !connected && opts.accept_timeout.is_some_and(|t| started.elapsed() >= t) => {
                return Ok(PersistentEnd::Idle)
            }
            Err(e) => each(Err(&e)),
        }
        if interrupted() {
            return Ok(PersistentEnd::Interrupted);
        }
    }
}

// ---------------------------------------------------------------------
// The client.
// ---------------------------------------------------------------------

/// Runs rping's client on `dp`: connects to `server`, sends
/// `opts.count` pings (checking each with `opts.validate`), disconnects.
/// `-v` lines go to `out`.
pub fn client(
    dp: &Dataplane,
    server: SocketAddrV4,
    opts: &RpingOptions,
    out: &mut dyn Write,
) -> Result<RpingSummary, ToolError> {
    opts.check()?;
    let mut c = Conn::new(dp, server, opts)?;
    let result = ping(&mut c, opts, out);
    c.close();
    result
}

fn ping(
    c: &mut Conn<'_>,
    opts: &RpingOptions,
    out: &mut dyn Write,
) -> Result<RpingSummary, ToolError> {
    let dp = c.dp;
    let size = opts.size;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let start = c.buf(size, rw)?;
    let sink = c.buf(size, rw)?;
    // The two advertisements never change: each has a buffer of its own,
    // so that neither is rewritten while TCP may still resend it.
    let adv_start = c.buf(INFO_LEN, Access::NONE)?;
    adv_start
        .region
        .write(0, &start.info(size).encode())
        .map_err(|e| ToolError::Dataplane(e.into()))?;
    let adv_sink = c.buf(INFO_LEN, Access::NONE)?;
    adv_sink
        .region
        .write(0, &sink.info(size).encode())
        .map_err(|e| ToolError::Dataplane(e.into()))?;
    c.post_recv()?;
    let params = ConnectParams {
        ird: CONN_DEPTH,
        ord: CONN_DEPTH,
        private_data: Vec::new(),
    };
    c.debug(|| format!("connecting to {}", c.peer));
    dp.connect(&c.qp, c.peer, &params)
        .map_err(|e| ToolError::Peer(format!("cannot connect to {}: {e}", c.peer)))?;
    c.wait_established(Instant::now() + c.timeout)?;
    std::thread::sleep(FIRST_SEND_DELAY);
    let started = Instant::now();
    let mut s = RpingSummary {
        role: RpingRole::Client,
        peer: c.peer,
        iterations: 0,
        size,
        bytes_moved: 0,
        bytes_verified: 0,
        elapsed: Duration::ZERO,
        interrupted: false,
    };
    let peer = c.peer;
    let mut ping = 0u64;
    while opts.count.map_or(true, |n| ping < n) {
        // A signal ends the run between pings, as if the count were
        // reached there.
        if interrupted() {
            s.interrupted = true;
            break;
        }
        let data = ping_data(ping, size);
        start
            .region
            .write(0, &data)
            .map_err(|e| ToolError::Dataplane(e.into()))?;
        let r = c.send(&adv_start, "the start buffer advertisement");
        lift(peer, ping, "the start buffer advertisement", r)?;
        let what = "the go-ahead after the RDMA Read";
        match c.recv_info(what) {
            // rping's server registers only its own -S, and terminates a
            // Read of more.
            Err(Stop::Gone(
                reason @ DisconnectReason::Terminated {
                    origin: TerminateOrigin::Peer,
                    ..
                },
            )) => {
                return Err(ToolError::Peer(format!(
                    "{} (a server started with a smaller -S than {size} refuses the ping)",
                    gone(peer, ping, what, reason)
                )))
            }
            r => lift(peer, ping, what, r)?,
        };
        // A sink holding last ping's echo would hide a missing Write.
        sink.region
            .fill(0, size, 0)
            .map_err(|e| ToolError::Dataplane(e.into()))?;
        let r = c.send(&adv_sink, "the sink buffer advertisement");
        lift(peer, ping, "the sink buffer advertisement", r)?;
        let r = c.recv_info("the go-ahead after the RDMA Write");
        lift(peer, ping, "the go-ahead after the RDMA Write", r)?;
        s.bytes_moved += 2 * size as u64;
        let echo = sink.read(size);
        if opts.validate {
            if let Some(at) = echo.iter().zip(&data).position(|(a, b)| a != b) {
                return Err(ToolError::DataMismatch(format!(
                    "ping {ping}: byte {at} of {size} came back as {:#04x}, {:#04x} was sent",
                    echo[at], data[at]
                )));
            }
            s.bytes_verified += size as u64;
        }
        if opts.verbose {
            write_line(out, &format!("ping data: {}", as_c_string(&echo)))?;
        }
        ping += 1;
        s.iterations = ping;
    }
    s.elapsed = started.elapsed();
    Ok(s)
}

// ---------------------------------------------------------------------
// The command line.
// ---------------------------------------------------------------------

/// Options of `iwarp rping`: rping's own letters, then the endpoint's.
#[derive(Debug, Clone, Args)]
pub struct RpingArgs {
    /// Server side: wait for one client, answer its pings until it
    /// disconnects.
    #[arg(short = 's', conflicts_with = "client")]
    pub server: bool,
    /// Client side: connect to the server given by -a and ping it.
    #[arg(short = 'c')]
    pub client: bool,
    /// Server: the address to listen on (this endpoint's --ip, which it
    /// gives when --ip is absent). Client: the server's address.
    #[arg(short = 'a', value_name = "ADDR")]
    pub addr: Option<String>,
    /// Client: the source address to connect from (rping binds it before
    /// resolving the server). Here it is this endpoint's IPv4 address:
    /// given without --ip it becomes the endpoint's --ip; given with one,
    /// the two must agree.
    #[arg(short = 'I', value_name = "ADDR")]
    pub source: Option<String>,
    /// Server: persistent, serving one client after another until SIGINT
    /// or SIGTERM ends it (status 0), each client's summary printed as it
    /// leaves. A client that connects while another is served is refused.
    #[arg(short = 'P')]
    pub persistent: bool,
    /// TCP port.
    #[arg(short = 'p', value_name = "PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Pings to send (client), 0 for no limit (the default). The server
    /// runs until the client disconnects.
    #[arg(short = 'C', value_name = "COUNT", default_value_t = 0)]
    pub count: u64,
    /// Bytes per ping, 26 to 65535.
    #[arg(short = 'S', value_name = "SIZE", default_value_t = DEFAULT_SIZE)]
    pub size: usize,
    /// Print each ping's data.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Check each ping's data: the client compares the echo with what it
    /// sent, the server what it read with rping's pattern. A difference
    /// fails the run.
    #[arg(short = 'V')]
    pub validate: bool,
    /// Print each step on stderr.
    #[arg(short = 'd')]
    pub debug: bool,
    /// Refused: rdma-core's rping -q creates the queue pair itself and
    /// moves it through its states (ibv_modify_qp); here the connection
    /// manager always does that, so there is nothing to choose. For no
    /// summary, see --quiet.
    #[arg(short = 'q')]
    pub self_created_qp: bool,
    /// No summary at the end (errors are still printed).
    #[arg(long)]
    pub quiet: bool,
    /// Seconds any one step waits for the peer (connection setup, each
    /// message) before the run fails.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_TIMEOUT.as_secs_f64())]
    pub timeout: f64,
    /// Server: seconds to wait for a client before giving up (default:
    /// wait for ever, as rping). With -P: for the next client, the server
    /// ending with status 0 when none comes in time after the first.
    #[arg(long, value_name = "SECS")]
    pub wait: Option<f64>,
    #[command(flatten)]
    pub endpoint: EndpointArgs,
}

fn seconds(what: &str, v: f64) -> Result<Duration, ToolError> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| ToolError::Usage(format!("{what}: {v} is not a positive number of seconds")))
}

/// An IPv4 address, or a host name that resolves to one.
fn resolve(addr: &str) -> Result<Ipv4Addr, ToolError> {
    if let Ok(ip) = addr.parse::<Ipv4Addr>() {
        return Ok(ip);
    }
    let bad = || {
        ToolError::Usage(format!(
            "-a {addr}: not an IPv4 address or a host name with one"
        ))
    };
    (addr, 0)
        .to_socket_addrs()
        .map_err(|_| bad())?
        .find_map(|a| match a {
            std::net::SocketAddr::V4(v4) => Some(*v4.ip()),
            std::net::SocketAddr::V6(_) => None,
        })
        .ok_or_else(bad)
}

/// Why `-q` is refused, in one line.
pub const SELF_QP_REFUSAL: &str = "-q: rping's self-created QP (moved through its states \
     with ibv_modify_qp) does not apply here: the connection manager always moves this \
     dataplane's QPs; for no summary use --quiet";

impl RpingArgs {
    /// The run's options.
    pub fn options(&self) -> Result<RpingOptions, ToolError> {
        if self.self_created_qp {
            return Err(ToolError::Usage(SELF_QP_REFUSAL.into()));
        }
        if self.persistent && !self.server {
            return Err(ToolError::Usage(
                "-P makes a persistent server: give it with -s".into(),
            ));
        }
        if self.source.is_some() && !self.client {
            return Err(ToolError::Usage(
                "-I is the client's source address; a server listens on -a".into(),
            ));
        }
        let o = RpingOptions {
            port: self.port,
            count: (self.count > 0).then_some(self.count),
            size: self.size,
            verbose: self.verbose,
            validate: self.validate,
            debug: self.debug,
            timeout: seconds("--timeout", self.timeout)?,
            accept_timeout: self.wait.map(|w| seconds("--wait", w)).transpose()?,
            corrupt_ping: None,
        };
        o.check()?;
        Ok(o)
    }
}

/// Runs `iwarp rping`.
pub fn run(args: &RpingArgs) -> Result<(), ToolError> {
    let opts = args.options()?;
    catch_interrupts();
    let addr = args.addr.as_deref().map(resolve).transpose()?;
    let source = args
        .source
        .as_deref()
        .map(|s| {
            s.parse::<Ipv4Addr>()
                .map_err(|_| ToolError::Usage(format!("-I {s}: not an IPv4 address")))
        })
        .transpose()?;
    let mut endpoint = args.endpoint.clone();
    if let Some(ip) = source {
        match endpoint.ip {
            Some(given) if given != ip => {
                return Err(ToolError::Usage(format!(
                    "-I {ip} and --ip {given} disagree: the source address is the endpoint's"
                )))
            }
            _ => endpoint.ip = Some(ip),
        }
    }
    let role = match (args.server, args.client) {
        (true, _) => RpingRole::Server,
        (false, true) => RpingRole::Client,
        (false, false) => {
            return Err(ToolError::Usage(
                "give -s (server) or -c (client); see iwarp rping --help".into(),
            ))
        }
    };
    let peer = match role {
        RpingRole::Server => {
            if let Some(ip) = addr.filter(|ip| !ip.is_unspecified()) {
                if endpoint.ip.is_none() && endpoint.config.is_none() {
                    endpoint.ip = Some(ip);
                }
            }
            None
        }
        RpingRole::Client => Some(SocketAddrV4::new(
            addr.ok_or_else(|| ToolError::Usage("the client needs -a SERVER_ADDRESS".into()))?,
            opts.port,
        )),
    };
    let dp = endpoint.open()?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let summary = match peer {
        None => {
            if let Some(ip) = addr.filter(|ip| !ip.is_unspecified() && *ip != dp.ip()) {
                return Err(ToolError::Usage(format!(
                    "-a {ip} is not this endpoint's address ({})",
                    dp.ip()
                )));
            }
            if args.persistent {
                return run_persistent(&dp, &opts, args.quiet, &mut out);
            }
            server(&dp, &opts, &mut out)?
        }
        Some(peer) => {
            // A --config file names the address; -I must be it.
            if let Some(ip) = source.filter(|ip| *ip != dp.ip()) {
                return Err(ToolError::Usage(format!(
                    "-I {ip} is not this endpoint's address ({})",
                    dp.ip()
                )));
            }
            client(&dp, peer, &opts, &mut out)?
        }
    };
    if !args.quiet {
        write_line(&mut out, &summary.to_string())?;
    }
    Ok(())
}

/// `-s -P`: every client's summary on stdout as it leaves (its failure on
/// stderr, `iwarp: ` first, as `main` prints errors), then a last line
/// with the count when a signal (or `--wait`) ends the server, which
/// exits 0.
fn run_persistent(
    dp: &Dataplane,
    opts: &RpingOptions,
    quiet: bool,
    out: &mut dyn Write,
) -> Result<(), ToolError> {
    let (mut served, mut failed) = (0u64, 0u64);
    let end = persistent_server(dp, opts, out, &mut |r| match r {
        Ok(s) => {
            served += 1;
            if !quiet {
                // The same stdout as `out`: its lock is re-entrant, and
                // the lines keep their order.
                let _ = writeln!(std::io::stdout(), "{s}");
            }
        }
        Err(e) => {
            failed += 1;
            eprintln!("iwarp: rping server: a client failed: {e}");
        }
    });
    let end = end?;
    if !quiet {
        write_line(
            out,
            &format!(
                "rping server: {served} clients served, {failed} failed; {}",
                match end {
                    PersistentEnd::Interrupted => "stopped by a signal",
                    PersistentEnd::Idle => "no client within --wait",
                }
            ),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: RpingArgs,
    }

    fn parse(line: &str) -> Result<RpingArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("rping").chain(line.split_whitespace())).map(|c| c.args)
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn advertisement_is_rpings_16_bytes_big_endian() {
        // The client's first Send in rping.pcap (`rping -C 10 -S 100`).
        let wire = unhex("0000564378b75460f52e240000000064");
        let info = RpingInfo::decode(&wire).unwrap();
        assert_eq!(
            info,
            RpingInfo {
                addr: 0x0000_5643_78b7_5460,
                rkey: 0xf52e_2400,
                size: 100
            }
        );
        assert_eq!(info.encode().as_slice(), wire.as_slice());
        for bad in [&wire[..15], &[0u8; 17][..], &[][..]] {
            let e = RpingInfo::decode(bad).unwrap_err();
            assert!(e.to_string().contains("rping sends 16 bytes"), "{e}");
        }
    }

    #[test]
    fn ping_data_is_rpings_pattern() {
        // The Read Response of ping 0 in rping.pcap.
        let d = ping_data(0, 100);
        assert_eq!(&d[..16], b"rdma-ping-0: ABC");
        assert_eq!(&d[64..75], b"tuvwxyzABCD");
        assert_eq!(&d[96..], b"Z[\\\0");
        // Each ping starts one letter further; 58 letters from 'A' to 'z'.
        assert_eq!(&ping_data(1, 64)[..16], b"rdma-ping-1: BCD");
        assert_eq!(&ping_data(57, 64)[..17], b"rdma-ping-57: zAB");
        assert_eq!(&ping_data(58, 64)[..17], b"rdma-ping-58: ABC");
        // The smallest size with the longest number rping can count to.
        let d = ping_data(2_147_483_647, MIN_SIZE);
        assert_eq!(d, b"rdma-ping-2147483647: HIJ\0");
        assert!(d[..MIN_SIZE - 1].iter().all(|b| (32..127).contains(b)));
        assert_eq!(
            as_c_string(&ping_data(3, 30)),
            "rdma-ping-3: DEFGHIJKLMNOPQRS"
        );
    }

    #[test]
    fn command_line_is_rpings() {
        let a = parse("-c -a 10.0.0.1 -p 9999 -C 10 -S 100 -v -V -d --quiet").unwrap();
        assert!(a.client && !a.server && a.verbose && a.validate && a.debug && a.quiet);
        let o = a.options().unwrap();
        assert_eq!((o.port, o.count, o.size), (9999, Some(10), 100));
        let o = parse("-s").unwrap().options().unwrap();
        assert_eq!(
            (o.port, o.count, o.size),
            (DEFAULT_PORT, None, DEFAULT_SIZE)
        );
        assert_eq!(parse("-s -C 0").unwrap().options().unwrap().count, None);
        let a = parse("-s --device net_ring0 --ip 10.1.1.1 --cores 2,3").unwrap();
        assert_eq!(a.endpoint.ip, Some(Ipv4Addr::new(10, 1, 1, 1)));
        assert_eq!(a.endpoint.cores, vec![2, 3]);
        assert!(parse("-s -c").is_err(), "one side only");
        assert!(parse("-s -C -1").is_err());
        for size in ["25", "65536"] {
            let e = parse(&format!("-c -S {size}"))
                .unwrap()
                .options()
                .unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("invalid size {size} (valid range is 26 to 65535)")
            );
        }
        let e = parse("-s --timeout 0").unwrap().options().unwrap_err();
        assert!(e.to_string().contains("--timeout"), "{e}");
    }

    /// rping's -P, -I and -q: a persistent server, the client's source
    /// address, and a self-created QP, which is refused in one line that
    /// names --quiet.
    #[test]
    fn persistent_source_and_q_options() {
        let a = parse("-s -P -a 10.0.0.1").unwrap();
        assert!(a.persistent && a.server);
        assert!(a.options().is_ok());
        let e = parse("-c -P -a 10.0.0.1").unwrap().options().unwrap_err();
        assert!(e.to_string().contains("with -s"), "{e}");
        let a = parse("-c -a 10.0.0.1 -I 10.0.0.2").unwrap();
        assert_eq!(a.source.as_deref(), Some("10.0.0.2"));
        assert!(a.options().is_ok());
        let e = parse("-s -I 10.0.0.2").unwrap().options().unwrap_err();
        assert!(e.to_string().contains("client's source address"), "{e}");
        let e = parse("-c -a 10.0.0.1 -q").unwrap().options().unwrap_err();
        assert!(matches!(e, ToolError::Usage(_)), "{e:?}");
        let line = e.to_string();
        assert!(!line.contains('\n'), "one line: {line}");
        assert!(line.contains("--quiet") && line.contains("-q"), "{line}");
        assert_eq!(line, SELF_QP_REFUSAL);
        assert!(parse("-c -a 10.0.0.1 --quiet").unwrap().quiet);
        // Before any device: a bad -I, and -I against --ip.
        let e = run(&parse("-c -a 10.0.0.1 -I nowhere").unwrap()).unwrap_err();
        assert!(e.to_string().contains("-I nowhere"), "{e}");
        let e = run(&parse("-c -a 10.0.0.1 -I 10.0.0.2 --ip 10.0.0.3").unwrap()).unwrap_err();
        assert!(e.to_string().contains("disagree"), "{e}");
    }

    #[test]
    fn usage_errors_come_before_any_device() {
        let e = run(&parse("-a 10.0.0.1").unwrap()).unwrap_err();
        assert!(
            e.to_string().contains("give -s (server) or -c (client)"),
            "{e}"
        );
        let e = run(&parse("-c").unwrap()).unwrap_err();
        assert!(e.to_string().contains("-a SERVER_ADDRESS"), "{e}");
        let e = run(&parse("-c -a no.such.host.invalid").unwrap()).unwrap_err();
        assert!(e.to_string().contains("not an IPv4 address"), "{e}");
        let e = run(&parse("-c -a 10.0.0.1").unwrap()).unwrap_err();
        assert!(matches!(e, ToolError::Usage(_)), "no device: {e}");
    }

    #[test]
    fn summary_reads_well() {
        let s = RpingSummary {
            role: RpingRole::Client,
            peer: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 7174),
            iterations: 10,
            size: 100,
            bytes_moved: 2000,
            bytes_verified: 1000,
            elapsed: Duration::from_millis(20),
            interrupted: false,
        };
        assert_eq!(
            s.to_string(),
            "rping client: 10 pings of 100 bytes with 10.0.0.1:7174 in 20.000 ms \
             (2000.0 us per ping), 2000 bytes moved, 1000 bytes verified"
        );
    }
}
