//! The measured loops of `iwarp perf` and `iwarp demo`: perftest's six
//! tests on the dataplane's verbs API ([`dataplane::api`]), behaving on the
//! wire as perftest 4.5 does (`src/perftest_resources.c`: `run_iter_bw`,
//! `run_iter_bw_server`, `run_iter_lat_write`, `run_iter_lat_send`,
//! `run_iter_lat`), so that a peer running `ib_*_bw -R` / `ib_*_lat -R`
//! sees the same operations, addresses and credits as from perftest.
//!
//! It sits between the control exchange ([`super::perftest`], which
//! connects the queue pairs and trades the [`RemoteBuf`]s) and the
//! reports ([`super::report`]). What perftest does, and so what this does:
//!
//! - **Buffers.** One registered buffer holds, per QP, a send half and a
//!   receive half of `max(size, 4096)` bytes (rounded up to a cache line);
//!   a QP advertises the start of its receive half. Messages of at most
//!   2 KiB cycle over 4 KiB in cache-line steps, at both ends.
//! - **Bandwidth.** Only the client posts (Write, Read or Send), at most
//!   `tx_depth` outstanding per QP, one work request in `cq_mod` (100)
//!   signalled. In `send-bw` the server keeps `rx_depth` receives posted
//!   and, as iWARP has no receiver-not-ready retry, writes its receive
//!   count into the client's credit word by RDMA Write every `rx_depth/3`
//!   receives; the client keeps fewer than `rx_depth` Sends beyond it.
//! - **Latency.** `write-lat` is a ping-pong of Writes whose last byte
//!   carries the iteration number (each side polls the last byte of its
//!   receive half; the server writes first); `send-lat` alternates Send
//!   and receive (the client sends first); `read-lat` is the client's
//!   Reads alone. Half the round trip (the full Read) is one sample.
//!
//! With [`RunSpec::verify`], sources carry a pattern and destinations are
//! compared: every message of the latency tests; the final contents of
//! the destination slots of `write-bw` (read back by RDMA Read after the
//! run), of `read-bw` and of `send-bw` (whose receives cycle through the
//! slots in step with the sender's patterns, so each slot only ever holds
//! one pattern; the length of every Send is checked as it completes).
//! The bandwidth tests thus compare after the measured loop, as the
//! kernel's TCP baseline (which only reads what it receives) does not
//! compare at all; a send-bw receiver that compared each 64 KiB message
//! spent a third of its time doing so.

use core::time::Duration;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use hdrhistogram::Histogram;

use dataplane::api::{
    Access, BusyPoll, Cq, Dataplane, MemoryRegistration, PostError, ProtectionDomain, Qp,
    QpOptions, QpStatus, RecvWr, Region, SendFlags, SendOp, SendWr, SgeList, Stag, WcOpcode,
    WcStatus, WorkCompletion,
};

use super::ToolError;

/// The six perftest tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TestKind {
    /// RDMA Write bandwidth (`ib_write_bw`).
    WriteBw,
    /// RDMA Read bandwidth (`ib_read_bw`).
    ReadBw,
    /// Send bandwidth (`ib_send_bw`).
    SendBw,
    /// RDMA Write latency (`ib_write_lat`).
    WriteLat,
    /// RDMA Read latency (`ib_read_lat`).
    ReadLat,
    /// Send latency (`ib_send_lat`).
    SendLat,
}

impl TestKind {
    /// Every test, in perftest's order (write, read, send; bandwidth, then
    /// latency).
    pub const ALL: [TestKind; 6] = [
        TestKind::WriteBw,
        TestKind::ReadBw,
        TestKind::SendBw,
        TestKind::WriteLat,
        TestKind::ReadLat,
        TestKind::SendLat,
    ];

    /// Whether it measures latency (a ping-pong) rather than bandwidth.
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            TestKind::WriteLat | TestKind::ReadLat | TestKind::SendLat
        )
    }

    /// Whether the peer's memory is read (IRD/ORD are negotiated).
    pub fn is_read(self) -> bool {
        matches!(self, TestKind::ReadBw | TestKind::ReadLat)
    }

    /// Whether messages are Sends (receives are posted).
    pub fn is_send(self) -> bool {
        matches!(self, TestKind::SendBw | TestKind::SendLat)
    }

    /// perftest's program name for it.
    pub fn perftest_name(self) -> &'static str {
        match self {
            TestKind::WriteBw => "ib_write_bw",
            TestKind::ReadBw => "ib_read_bw",
            TestKind::SendBw => "ib_send_bw",
            TestKind::WriteLat => "ib_write_lat",
            TestKind::ReadLat => "ib_read_lat",
            TestKind::SendLat => "ib_send_lat",
        }
    }
}

impl core::fmt::Display for TestKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            TestKind::WriteBw => "write-bw",
            TestKind::ReadBw => "read-bw",
            TestKind::SendBw => "send-bw",
            TestKind::WriteLat => "write-lat",
            TestKind::ReadLat => "read-lat",
            TestKind::SendLat => "send-lat",
        })
    }
}

/// Which end of a test this side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The side given a peer address (perftest's client).
    Client,
    /// The side waiting for one (perftest's server).
    Server,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSpec {
    /// Which test.
    pub test: TestKind,
    /// Which side.
    pub role: Role,
    /// Bytes per message (`-s`).
    pub size: usize,
    /// Messages per QP (`-n`).
    pub iterations: u64,
    /// Run for this long instead (`-D`).
    pub duration: Option<Duration>,
    /// Data connections (`-q`).
    pub qps: usize,
    /// Send-queue depth (`-t`).
    pub tx_depth: u32,
    /// Receive-queue depth (`-r`).
    pub rx_depth: u32,
    /// Outstanding RDMA Reads (`-o`).
    pub outstanding_reads: u32,
    /// Fill a pattern and check the received bytes.
    pub verify: bool,
    /// Every size from 2 bytes to 8 MiB (`-a`): buffers are sized for the
    /// largest, and [`Resources::run`] is called once per size.
    pub all_sizes: bool,
    /// The run's thread drives the dataplane's workers itself while it
    /// measures ([`Dataplane::busy_poll`]): a post, its transmission and
    /// its completion on one core, no hand-off between threads.
    pub busy_poll: bool,
}

/// Most queue pairs of one run (perftest's limit).
pub const MAX_QPS: usize = 16_384;

/// The largest message of `-a` (perftest's 2^23).
pub const MAX_ALL_SIZES: usize = 8 << 20;

/// perftest's cycle buffer: small messages go round 4 KiB (a page).
const CYCLE_BUFFER: usize = 4096;
/// perftest's cache-line step between small messages.
const CACHE_LINE: usize = 64;
/// perftest's default completion moderation of bandwidth tests.
const CQ_MOD: u64 = 100;
/// perftest's `MSG_SIZE_CQ_MOD_LIMIT`: above this message size every work
/// request is signalled (the completions are few anyway, and a moderated
/// run of large messages would report its first completion only after
/// `cq_mod` messages).
const CQ_MOD_SIZE_LIMIT: usize = 8192;

/// The completion moderation of a bandwidth run, as perftest 4.5 sets it
/// (`force_dependecies`): one work request in 100 signalled, every one
/// for messages over 8 KiB unless all sizes run (`-a` keeps one setting
/// for every size), and never more than the send queue's depth.
pub fn cq_moderation(size: usize, all_sizes: bool, tx_depth: u32) -> u64 {
    let m = if size > CQ_MOD_SIZE_LIMIT && !all_sizes {
        1
    } else {
        CQ_MOD
    };
    m.min(u64::from(tx_depth.max(1)))
}
/// No completion and no traffic on the run's connections for this long:
/// the peer is gone.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How close to this side's own end of a duration-mode latency run the
/// peer may end it (see `Runner::lat_end`): the two clocks start a control
/// exchange apart, far less than this.
const PEER_END_GRACE: Duration = Duration::from_millis(500);
/// How often the stall watch looks at the connections' byte counters.
const WIRE_CHECK_EVERY: Duration = Duration::from_secs(1);
/// How often an idle measured loop looks for a QP the peer disconnected:
/// often enough to end a run at once, seldom enough that thousands of QPs
/// cost the loop nothing.
const STATUS_EVERY: Duration = Duration::from_millis(5);
/// The most QPs one such look reads, the next look going on from there:
/// each read is a cache miss once there are thousands, and 10,000 read
/// every 5 ms took 4 % of the sending core in the demo's 10,000-QP
/// write-bw round. Every QP is still looked at within 100 ms.
const STATUS_PER_LOOK: usize = 512;
/// How often the progress callback runs: twice a second, and every 10 ms
/// in this crate's unit tests, whose memory links move a run of large
/// messages in well under a second.
const PROGRESS_EVERY: Duration = if cfg!(test) {
    Duration::from_millis(10)
} else {
    Duration::from_millis(500)
};
/// Completions taken from the CQ at a time.
const POLL_BATCH: usize = 32;

/// Queue pairs held back by credits that a turn of the bandwidth client's
/// loop looks at again (see `bw_client`).
const HELD_PER_TURN: usize = 64;

/// The bandwidth loops read the clock once per this many turns: a turn
/// takes a fraction of a microsecond when the dataplane is busy, so the
/// time they act on is at most a few microseconds old, against rounds of
/// seconds and samples a millisecond apart, and a clock read each turn
/// was a few percent of a busy loop's time.
const CLOCK_EVERY: u32 = 8;

/// The time as the bandwidth loops see it: read afresh every
/// [`CLOCK_EVERY`] turns, the last reading in between.
struct TurnClock {
    last: Instant,
    turns: u32,
}

impl TurnClock {
    fn new(now: Instant) -> TurnClock {
        TurnClock {
            last: now,
            turns: 0,
        }
    }

    /// The time for this turn.
    fn turn(&mut self) -> Instant {
        self.turns += 1;
        if self.turns >= CLOCK_EVERY {
            self.turns = 0;
            self.last = Instant::now();
        }
        self.last
    }
}

const QP_SHIFT: u32 = 48;
const RECV_FLAG: u64 = 1 << 47;
const CREDIT_FLAG: u64 = 1 << 46;
const VERIFY_FLAG: u64 = 1 << 45;
const COUNT_MASK: u64 = (1 << 45) - 1;

/// perftest's `INC`: a message's step, at least a cache line.
fn step(size: usize) -> usize {
    if size > CACHE_LINE {
        size.div_ceil(CACHE_LINE) * CACHE_LINE
    } else {
        CACHE_LINE
    }
}

/// perftest's `BUFF_SIZE`.
fn buff_size(size: usize) -> usize {
    size.max(CYCLE_BUFFER)
}

/// How many slots messages of `size` cycle over (perftest cycles when the
/// size is at most half the cycle buffer).
fn slots(size: usize) -> u64 {
    if size <= CYCLE_BUFFER / 2 {
        (CYCLE_BUFFER / step(size)) as u64
    } else {
        1
    }
}

fn wr_id(qp: usize, flags: u64, n: u64) -> u64 {
    (qp as u64) << QP_SHIFT | flags | (n & COUNT_MASK)
}

fn wr_qp(id: u64) -> usize {
    (id >> QP_SHIFT) as usize
}

/// The bytes of the message (or slot) `seed` names: a splitmix64 stream,
/// so that neighbouring slots, QPs, iterations and tests all differ.
fn pattern(seed: u64, len: usize, out: &mut Vec<u8>) {
    // Sized once and overwritten in place: a buffer kept at the message
    // size is neither cleared nor zeroed again.
    out.resize(len.next_multiple_of(8), 0);
    fill_pattern(seed, out);
    out.truncate(len);
}

/// Word `i` (from 0) of splitmix64's stream from state `seed`: its state
/// after `i + 1` steps, mixed.
#[inline(always)]
fn pattern_word(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `out` (a multiple of eight bytes) with the stream of `seed`,
/// little-endian words. Each word is computed from its index alone, so
/// the loop vectorizes; where the CPU has AVX-512 (its 64-bit multiply)
/// or AVX2, a copy compiled for it runs (`multiversion` picks it once, at
/// the first call). A receiver checking 64 KiB messages of ten thousand
/// QPs cannot keep their patterns cached and makes one per message:
/// about 11 µs each on the baseline instruction set, 2 µs with AVX-512.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx2+fma+bmi1+bmi2+lzcnt+popcnt",
    "x86_64+avx2+fma+bmi1+bmi2+lzcnt+popcnt",
))]
fn fill_pattern(seed: u64, out: &mut [u8]) {
    for (i, w) in out.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&pattern_word(seed, i as u64).to_le_bytes());
    }
}

/// Whether `got` is `expect` with its last byte replaced by `last` (when
/// given); otherwise names the first byte that differs. One whole-slice
/// comparison (memcmp) when they agree; the byte-wise search runs only
/// to name a difference.
fn check_bytes(got: &[u8], expect: &[u8], last: Option<u8>) -> Result<(), String> {
    let size = got.len();
    let body = size.saturating_sub(usize::from(last.is_some()));
    let want = |p: usize| match last {
        Some(b) if p == body => Some(b),
        _ => expect.get(p).copied(),
    };
    if expect.len() == size
        && got[..body] == expect[..body]
        && (body == size || Some(got[body]) == want(body))
    {
        return Ok(());
    }
    match (0..size).find(|&p| Some(got[p]) != want(p)) {
        Some(p) => Err(format!(
            "byte {p} of {size} is {:#04x}, expected {}",
            got[p],
            want(p).map_or("nothing".to_string(), |b| format!("{b:#04x}"))
        )),
        None => Err(format!("{size} bytes where {} were expected", expect.len())),
    }
}

fn seed(test: TestKind, qp: usize, n: u64) -> u64 {
    ((test as u64) + 1) << 56 ^ (qp as u64) << 40 ^ n
}

/// A peer's buffer: what goes into perftest's `pingpong_dest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuf {
    /// Tagged offset of its first byte.
    pub addr: u64,
    /// Its STag.
    pub rkey: u32,
}

/// Receives posted and taken on one QP, across runs.
#[derive(Debug, Default, Clone, Copy)]
struct RecvState {
    posted: u64,
    taken: u64,
}

/// The send-credit words of `send-bw` (perftest's `ctrl_buf`): per QP, the
/// count this side writes to the peer, then the count the peer writes here.
#[derive(Debug)]
struct Credits {
    region: Region,
    mr: MemoryRegistration,
}

/// The verbs objects of a run: the protection domain, one CQ shared by
/// every QP (as perftest), one registered buffer laid out as perftest lays
/// it out (so that the addresses the peer computes land in it), and the
/// QPs, unconnected.
#[derive(Debug)]
pub struct Resources {
    /// The protection domain.
    pub pd: ProtectionDomain,
    /// The one completion queue all QPs share.
    pub cq: Cq,
    /// The data queue pairs (unconnected).
    pub qps: Vec<Qp>,
    /// The registered buffer of each QP (one registration, as perftest's
    /// default: every entry names the same buffer).
    pub mrs: Vec<MemoryRegistration>,
    region: Region,
    /// Bytes per half (perftest's `send_qp_buff_size`).
    stride: usize,
    /// perftest's `BUFF_SIZE` of the size the buffer was made for: the
    /// spacing of the advertised receive halves.
    adv_stride: usize,
    /// Size the buffers were made for.
    alloc_size: usize,
    credits: Option<Credits>,
    recv: Mutex<Vec<RecvState>>,
    test: TestKind,
    role: Role,
}

impl Resources {
    /// Allocates what `spec` needs on `dp`. Receives a Send test needs are
    /// posted here, before any connection exists, so that none of the
    /// peer's first messages finds an empty receive queue; for `read-*`
    /// with [`RunSpec::verify`] the server's data is filled here too.
    pub fn new(dp: &Dataplane, spec: &RunSpec) -> Result<Resources, ToolError> {
        check_spec(spec)?;
        let q = spec.qps;
        let alloc_size = if spec.all_sizes {
            MAX_ALL_SIZES
        } else {
            spec.size
        };
        let stride = step(buff_size(alloc_size));
        let len = stride
            .checked_mul(2 * q)
            .ok_or_else(|| ToolError::Usage("buffers too large".into()))?;
        let region = Region::new(len).map_err(|e| ToolError::Dataplane(e.into()))?;
        let pd = dp.alloc_pd()?;
        let tx = spec.tx_depth.max(1);
        let rx = spec.rx_depth.max(1);
        let cqe = cq_entries(spec).clamp(64, dp.limits().max_cqe.max(64));
        let cq = dp.create_cq(cqe)?;
        let opts = QpOptions {
            // The engine keeps unsignalled requests until they are done:
            // a little room beyond the depth keeps a full pipeline postable.
            max_send_wr: tx.saturating_add(16).min(4096),
            max_recv_wr: rx.saturating_add(16).min(4096),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_ord: spec.outstanding_reads.clamp(1, dataplane::api::MAX_RD_ATOM),
            max_ird: spec.outstanding_reads.clamp(1, dataplane::api::MAX_RD_ATOM),
            sq_sig_all: false,
        };
        let qps = (0..q)
            .map(|_| dp.create_qp(pd, &cq, &cq, opts))
            .collect::<Result<Vec<_>, _>>()?;
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mr = dp.reg_mr(pd, &region, 0, len, access)?;
        let credits = if spec.test == TestKind::SendBw {
            // The two words per QP, then one staging slot per credit Write
            // that may be in flight on each QP: a Write's source must not
            // change before it completes (TCP may send it again, and its
            // CRC and checksum were computed from it), so each Write sends
            // a copy of the count rather than the live word.
            let staging = q * spec.tx_depth.max(1) as usize;
            let len = 8 * q + 4 * staging;
            let region = Region::new(len).map_err(|e| ToolError::Dataplane(e.into()))?;
            let mr = dp.reg_mr(
                pd,
                &region,
                0,
                len,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )?;
            Some(Credits { region, mr })
        } else {
            None
        };
        let res = Resources {
            pd,
            cq,
            mrs: vec![mr; q],
            qps,
            region,
            stride,
            adv_stride: buff_size(alloc_size),
            alloc_size,
            credits,
            recv: Mutex::new(vec![RecvState::default(); q]),
            test: spec.test,
            role: spec.role,
        };
        if spec.verify && spec.test.is_read() && spec.role == Role::Server {
            let mut buf = Vec::new();
            for i in 0..q {
                for k in 0..slots(spec.size) {
                    pattern(seed(spec.test, i, k), spec.size, &mut buf);
                    res.write(res.adv_off(i) + k as usize * step(spec.size), &buf)?;
                }
            }
        }
        if res.receives_needed() {
            let mut st = res.recv_state();
            for (i, s) in st.iter_mut().enumerate() {
                res.top_up(i, s, spec.rx_depth.max(1))?;
            }
        }
        Ok(res)
    }

    /// What this side advertises for QP `i` (perftest's `pingpong_dest`
    /// vaddr and rkey): its receive half, or in `send-bw` its credit word.
    pub fn local_buf(&self, i: usize) -> RemoteBuf {
        match &self.credits {
            Some(c) => RemoteBuf {
                addr: c.mr.addr() + (4 * (self.qps.len() + i)) as u64,
                rkey: c.mr.rkey().0,
            },
            None => RemoteBuf {
                addr: self.mrs[i].addr() + self.adv_off(i) as u64,
                rkey: self.mrs[i].rkey().0,
            },
        }
    }

    /// Ends the connections (gracefully) and deregisters the buffers.
    pub fn close(&self, dp: &Dataplane) {
        for qp in &self.qps {
            if qp.status() == QpStatus::Connected {
                let _ = dp.disconnect(qp, false);
            }
        }
        if let Some(mr) = self.mrs.first() {
            let _ = dp.dereg_mr(mr);
        }
        if let Some(c) = &self.credits {
            let _ = dp.dereg_mr(&c.mr);
        }
        // Freed once the QPs (still held here) and the registrations go.
        dp.release_pd(self.pd);
    }

    /// Runs the measured loop on the connected QPs; `remote[i]` is what
    /// the peer advertised for QP `i`. `progress` is called about every
    /// half second. Sides that only wait in perftest (the server of
    /// `write-bw`, `read-bw` and `read-lat`) return at once with no
    /// figures: the client's come over the control connection.
    pub fn run(
        &self,
        dp: &Dataplane,
        spec: &RunSpec,
        remote: &[RemoteBuf],
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<RunResult, ToolError> {
        check_spec(spec)?;
        if spec.test != self.test || spec.role != self.role || spec.qps != self.qps.len() {
            return Err(ToolError::Usage(
                "run: the test, role or QP count differs from the resources'".into(),
            ));
        }
        if spec.size > self.alloc_size {
            return Err(ToolError::Usage(format!(
                "run: {} bytes do not fit buffers made for {}",
                spec.size, self.alloc_size
            )));
        }
        if remote.len() < self.qps.len() {
            return Err(ToolError::Usage(
                "run: fewer remote buffers than QPs".into(),
            ));
        }
        let passive = matches!(
            (spec.test, spec.role),
            (
                TestKind::WriteBw | TestKind::ReadBw | TestKind::ReadLat,
                Role::Server
            )
        );
        let busy = if spec.busy_poll && !passive {
            Some(dp.busy_poll()?)
        } else {
            None
        };
        let mut r = Runner::new(dp, busy, self, spec, remote, progress);
        match (spec.test, spec.role) {
            (TestKind::WriteBw | TestKind::ReadBw | TestKind::SendBw, Role::Client) => {
                r.bw_client()
            }
            (TestKind::SendBw, Role::Server) => r.bw_server(),
            (TestKind::WriteLat, _) => r.write_lat(),
            (TestKind::SendLat, _) => r.send_lat(),
            (TestKind::ReadLat, Role::Client) => r.read_lat(),
            (TestKind::WriteBw | TestKind::ReadBw | TestKind::ReadLat, Role::Server) => {
                Ok(RunResult::empty(spec.size))
            }
        }
    }

    fn adv_off(&self, i: usize) -> usize {
        (self.qps.len() + i) * self.adv_stride
    }

    fn send_off(&self, i: usize) -> usize {
        i * self.stride
    }

    fn recv_off(&self, i: usize) -> usize {
        (self.qps.len() + i) * self.stride
    }

    /// Receive slots of QP `i`: their count and length. Fixed by the size
    /// the buffers were made for, so that receives posted for one `-a`
    /// round fit any later one.
    fn recv_geometry(&self) -> (u64, usize) {
        let n = slots(self.alloc_size);
        if n > 1 {
            (n, step(self.alloc_size))
        } else {
            (1, self.stride)
        }
    }

    fn receives_needed(&self) -> bool {
        match self.test {
            TestKind::SendBw => self.role == Role::Server,
            TestKind::SendLat => true,
            _ => false,
        }
    }

    fn recv_state(&self) -> std::sync::MutexGuard<'_, Vec<RecvState>> {
        // Poisoned only by a panic in another run; the counters stay usable.
        self.recv.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn post_recv(&self, i: usize, s: &mut RecvState) -> Result<(), ToolError> {
        let (n, len) = self.recv_geometry();
        let slot = s.posted % n;
        let sge = self.mrs[i].sge((self.recv_off(i) + slot as usize * len) as u64, len as u32);
        let wr = RecvWr {
            wr_id: wr_id(i, RECV_FLAG, slot),
            sges: SgeList::single(sge),
        };
        self.qps[i].post_recv(&wr).map_err(post_error)?;
        s.posted += 1;
        Ok(())
    }

    /// Posts receives until `depth` are outstanding on QP `i`.
    fn top_up(&self, i: usize, s: &mut RecvState, depth: u32) -> Result<(), ToolError> {
        while s.posted - s.taken < u64::from(depth) {
            self.post_recv(i, s)?;
        }
        Ok(())
    }

    fn write(&self, off: usize, bytes: &[u8]) -> Result<(), ToolError> {
        self.region
            .write(off, bytes)
            .map_err(|e| ToolError::Dataplane(e.into()))
    }

    fn read(&self, off: usize, out: &mut [u8]) -> Result<(), ToolError> {
        self.region
            .read(off, out)
            .map_err(|e| ToolError::Dataplane(e.into()))
    }

    fn credit_word(&self, idx: usize) -> u32 {
        let mut w = [0u8; 4];
        if let Some(c) = &self.credits {
            let _ = c.region.read(4 * idx, &mut w);
        }
        // Host order, as perftest writes it (little-endian hosts).
        u32::from_le_bytes(w)
    }

    fn set_credit_word(&self, idx: usize, v: u32) {
        if let Some(c) = &self.credits {
            let _ = c.region.write(4 * idx, &v.to_le_bytes());
        }
    }

    /// Offset of staging slot `seq % tx_depth` of QP `i` in the credit
    /// region, holding `v`: the source of one credit Write. With fewer than
    /// `tx_depth` credit Writes in flight (in all) and completions in order
    /// per QP, a slot is written again only after the Write that last used
    /// it has completed.
    fn stage_credit(&self, i: usize, seq: u64, tx: u64, v: u32) -> usize {
        let q = self.qps.len();
        let off = 8 * q + 4 * (i * tx as usize + (seq % tx) as usize);
        if let Some(c) = &self.credits {
            let _ = c.region.write(off, &v.to_le_bytes());
        }
        off
    }
}

/// Connects the client's QPs to the server's, QP *i* to QP *i*, with the
/// connection manager alone (`listen`, `connect`, `accept`), without
/// perftest's control exchange: the demo and tests, where both ends are
/// in one process. `port` must be free on the server; read tests pass
/// their depth as `ord` (IRD and ORD). Up to [`CONNECT_WINDOW`]
/// connections are being set up at once, each naming its index in its
/// private data so that the server pairs it with its own QP of that
/// index whatever order the requests arrive in: thousands of QPs are
/// connected in a few round trips' time each, not one after another.
pub fn connect_direct(
    client: &Dataplane,
    client_res: &Resources,
    server: &Dataplane,
    server_res: &Resources,
    server_addr: std::net::SocketAddrV4,
    ord: u16,
) -> Result<(), ToolError> {
    use dataplane::api::{CmEvent, ConnectParams};
    let n = client_res.qps.len();
    if server_res.qps.len() < n {
        return Err(ToolError::Usage(
            "the server has fewer QPs than the client".into(),
        ));
    }
    server.listen(server_addr.port(), CONNECT_WINDOW)?;
    let params = |i: usize| ConnectParams {
        ird: ord,
        ord,
        private_data: (i as u32).to_le_bytes().to_vec(),
    };
    let client_qps: std::collections::HashSet<_> = client_res.qps.iter().map(Qp::num).collect();
    let server_qps: std::collections::HashSet<_> =
        server_res.qps[..n].iter().map(Qp::num).collect();
    let (mut next, mut up_c, mut up_s) = (0, 0, 0);
    let mut last_progress = Instant::now();
    while up_c < n || up_s < n {
        while next < n && next - up_c.min(up_s) < CONNECT_WINDOW {
            client.connect(&client_res.qps[next], server_addr, &params(next))?;
            next += 1;
        }
        let mut moved = false;
        while let Some(e) = server.poll_event() {
            moved = true;
            match e {
                CmEvent::ConnectRequest(req) => {
                    let i = match <[u8; 4]>::try_from(req.private_data.as_slice()) {
                        Ok(b) if (u32::from_le_bytes(b) as usize) < n => {
                            u32::from_le_bytes(b) as usize
                        }
                        _ => {
                            return Err(ToolError::Peer(format!(
                                "a connection request from {} names no QP of this run",
                                req.remote
                            )))
                        }
                    };
                    server.accept(&req, &server_res.qps[i], &params(i))?;
                }
                CmEvent::Established { qp, .. } if server_qps.contains(&qp) => up_s += 1,
                CmEvent::Disconnected { qp, reason } if server_qps.contains(&qp) => {
                    return Err(ToolError::Peer(format!("connection ended: {reason}")))
                }
                _ => {}
            }
        }
        let wait = if moved {
            Duration::ZERO
        } else {
            Duration::from_millis(1)
        };
        match client.wait_event(wait) {
            Some(CmEvent::Established { qp, .. }) if client_qps.contains(&qp) => {
                up_c += 1;
                moved = true;
            }
            Some(CmEvent::ConnectFailed { reason, .. }) => {
                return Err(ToolError::Peer(format!(
                    "connection to {server_addr} failed: {reason}"
                )))
            }
            Some(CmEvent::Rejected { .. }) => {
                return Err(ToolError::Peer(format!(
                    "{server_addr} rejected the connection"
                )))
            }
            _ => {}
        }
        if moved {
            last_progress = Instant::now();
        } else if last_progress.elapsed() >= STALL_TIMEOUT {
            return Err(ToolError::Peer(format!(
                "{up_c} of {n} connections to {server_addr} established; none more within {} s",
                STALL_TIMEOUT.as_secs()
            )));
        }
    }
    Ok(())
}

/// Connections [`connect_direct`] has being set up at once (and the
/// server's listen backlog).
pub const CONNECT_WINDOW: usize = 64;

/// Completion-queue entries a run's QPs need: room for every completion
/// that can be outstanding at once, signalled sends (credit writes
/// included) and receives.
fn cq_entries(spec: &RunSpec) -> u32 {
    cq_entries_of(spec.qps, spec.tx_depth, spec.rx_depth)
}

/// The entries of the CQ that `qps` queue pairs with send and receive
/// queue depths `tx` and `rx` share: each QP's two queues and a few
/// more (credit Writes, a final Read).
pub(crate) fn cq_entries_of(qps: usize, tx: u32, rx: u32) -> u32 {
    let (tx, rx) = (tx.max(1), rx.max(1));
    u32::try_from(qps)
        .unwrap_or(u32::MAX)
        .saturating_mul(tx.saturating_add(rx).saturating_add(8))
}

fn check_spec(spec: &RunSpec) -> Result<(), ToolError> {
    if spec.size == 0 || spec.size > u32::MAX as usize {
        return Err(ToolError::Usage(format!("bad message size {}", spec.size)));
    }
    if spec.qps == 0 || spec.qps > MAX_QPS {
        return Err(ToolError::Usage(format!("bad QP count {}", spec.qps)));
    }
    if spec.test.is_latency() && spec.qps != 1 {
        return Err(ToolError::Usage("latency tests run on one QP".into()));
    }
    if spec.iterations == 0 && spec.duration.is_none() {
        return Err(ToolError::Usage("no iterations".into()));
    }
    if spec.verify && spec.all_sizes {
        return Err(ToolError::Usage(
            "data verification checks one size per run, not -a".into(),
        ));
    }
    if spec.test == TestKind::WriteLat && spec.size < 1 {
        return Err(ToolError::Usage("write-lat needs at least one byte".into()));
    }
    Ok(())
}

fn post_error(e: PostError) -> ToolError {
    match e {
        PostError::InvalidState => {
            ToolError::Peer("the connection to the peer ended during the test".into())
        }
        e => ToolError::Peer(format!("a work request was refused: {e:?}")),
    }
}

fn wc_error(wc: &WorkCompletion) -> ToolError {
    match wc.status {
        WcStatus::WrFlushError => {
            ToolError::Peer("the connection to the peer ended during the test".into())
        }
        s => ToolError::Peer(format!(
            "{:?} completed with {s:?} on QP {}",
            wc.opcode, wc.qp_num.0
        )),
    }
}

/// Where a run stands.
///
/// Completions alone say little about a run of large messages: with
/// perftest's completion moderation, or a single 4 MiB message in flight
/// over a slow link, no message may complete for many seconds while data
/// flows. So progress also counts bytes on the run's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Messages done.
    pub done: u64,
    /// Messages in all (0 in duration mode).
    pub total: u64,
    /// TCP payload bytes (MPA framing included) the run's connections
    /// carried since the run began, in the busier direction: the data's,
    /// in a bandwidth test.
    pub bytes: u64,
    /// Message bytes the run moves in that direction in all (0 in duration
    /// mode).
    pub total_bytes: u64,
    /// Time since the start.
    pub elapsed: Duration,
    /// How long the run lasts, in duration mode (`-D`).
    pub duration: Option<Duration>,
}

/// Latency figures, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    /// Fastest.
    pub min_us: f64,
    /// Median (perftest's "typical").
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest.
    pub max_us: f64,
    /// Mean.
    pub avg_us: f64,
    /// Standard deviation.
    pub stdev_us: f64,
    /// Every sample in fixed buckets, for the service's metrics (not part
    /// of the JSON report).
    #[serde(skip)]
    pub histogram: LatencyHistogram,
}

/// Upper bounds of the latency histogram's buckets, in nanoseconds: 1, 2
/// and 5 of each decade from 1 µs to 10 s. Fixed, so that runs add up and
/// a scraper sees the same `le` labels every time.
pub const LATENCY_BOUNDS_NS: [u64; 22] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
    200_000_000,
    500_000_000,
    1_000_000_000,
    2_000_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Latency samples counted in the buckets of [`LATENCY_BOUNDS_NS`]: the
/// shape of a Prometheus histogram, which needs exact counts per bound
/// rather than the quantiles of [`LatencySummary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencyHistogram {
    /// Samples per bucket, not cumulative: `counts[i]` holds those at most
    /// `LATENCY_BOUNDS_NS[i]` and above the bound before; the last entry
    /// those above the largest bound.
    pub counts: [u64; LATENCY_BOUNDS_NS.len() + 1],
    /// The samples' sum, in nanoseconds.
    pub sum_ns: u128,
}

impl LatencyHistogram {
    /// Counts one sample (bounds are inclusive, as Prometheus' `le`).
    pub fn record(&mut self, ns: u64) {
        let i = LATENCY_BOUNDS_NS.partition_point(|&b| b < ns);
        self.counts[i] += 1;
        self.sum_ns += u128::from(ns);
    }

    /// Adds another histogram's samples.
    pub fn add(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a = a.saturating_add(b);
        }
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }

    /// Samples counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().fold(0u64, |n, &c| n.saturating_add(c))
    }
}

impl LatencySummary {
    /// Summarises samples in nanoseconds (`None` without any).
    pub fn from_nanos(samples: &[u64]) -> Option<LatencySummary> {
        if samples.is_empty() {
            return None;
        }
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).ok()?;
        let (mut sum, mut sq) = (0f64, 0f64);
        let mut histogram = LatencyHistogram::default();
        for &s in samples {
            histogram.record(s);
            let s = s.max(1);
            h.saturating_record(s);
            let f = s as f64;
            sum += f;
            sq += f * f;
        }
        let n = samples.len() as f64;
        let avg = sum / n;
        let var = (sq / n - avg * avg).max(0.0);
        let us = |ns: f64| ns / 1000.0;
        Some(LatencySummary {
            min_us: us(h.min() as f64),
            p50_us: us(h.value_at_quantile(0.5) as f64),
            p99_us: us(h.value_at_quantile(0.99) as f64),
            p999_us: us(h.value_at_quantile(0.999) as f64),
            max_us: us(h.max() as f64),
            avg_us: us(avg),
            stdev_us: us(var.sqrt()),
            histogram,
        })
    }
}

/// What a run measured. Bandwidth is in perftest's MB (2^20 bytes) per
/// second.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunResult {
    /// Bytes per message.
    pub size: usize,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Messages completed.
    pub iterations: u64,
    /// Measured time.
    #[serde(rename = "seconds", serialize_with = "ser_secs")]
    pub elapsed: Duration,
    /// Peak bandwidth, MB/s.
    pub bw_peak_mbps: f64,
    /// Average bandwidth, MB/s.
    pub bw_avg_mbps: f64,
    /// In duration mode, the bandwidth between the margins, MB/s: from a
    /// quarter of the duration in to a quarter before its end, the window
    /// perftest reports with `-D` (its default `--margin`). A run whose
    /// connections start cold (thousands of QPs take their first buffers
    /// as their first messages go) reaches its steady rate inside the
    /// first margin; [`RunResult::bw_avg_mbps`] counts that start too.
    /// `None` in iteration mode and for latency tests.
    pub bw_steady_mbps: Option<f64>,
    /// Message rate, millions per second.
    pub msg_rate_mpps: f64,
    /// Latency test figures.
    pub latency: Option<LatencySummary>,
    /// Bytes whose content was checked.
    pub verified_bytes: u64,
}

impl RunResult {
    fn empty(size: usize) -> RunResult {
        RunResult {
            size,
            bytes: 0,
            iterations: 0,
            elapsed: Duration::ZERO,
            bw_peak_mbps: 0.0,
            bw_avg_mbps: 0.0,
            bw_steady_mbps: None,
            msg_rate_mpps: 0.0,
            latency: None,
            verified_bytes: 0,
        }
    }
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// perftest's MB.
pub const MB: f64 = 1_048_576.0;

/// The traffic half of the stall watch. Only one work request in
/// `cq_mod` is signalled, so against a slow peer (a loaded Linux siw answers
/// a few Reads a second) no completion may come for longer than
/// [`STALL_TIMEOUT`] while data flows: bytes received on the run's
/// connections, or bytes sent with no segment retransmitted meanwhile
/// (the peer acknowledged something to open the window), count as
/// progress too. Retransmissions alone do not: a dead peer gets those.
#[derive(Debug, Clone, Copy)]
struct WireWatch {
    checked: Instant,
    sent: u64,
    received: u64,
    retransmits: u64,
}

impl WireWatch {
    fn new(now: Instant, (sent, received, retransmits): (u64, u64, u64)) -> WireWatch {
        WireWatch {
            checked: now,
            sent,
            received,
            retransmits,
        }
    }

    fn due(&self, now: Instant) -> bool {
        now.duration_since(self.checked) >= WIRE_CHECK_EVERY
    }

    /// Takes the counters (sent, received, retransmitted segments) at
    /// `now`: whether the connections made progress since the last look.
    fn moved(&mut self, now: Instant, counters: (u64, u64, u64)) -> bool {
        let (sent, received, retransmits) = counters;
        let moved =
            received > self.received || (sent > self.sent && retransmits == self.retransmits);
        *self = WireWatch::new(now, counters);
        moved
    }
}

/// Sums of (bytes sent, bytes received, segments retransmitted) over the
/// connections of `qps`.
fn wire_counters(dp: &Dataplane, qps: &[Qp]) -> (u64, u64, u64) {
    let ours: std::collections::HashSet<_> = qps.iter().map(Qp::num).collect();
    dp.qp_snapshots()
        .iter()
        .filter(|s| ours.contains(&s.qpn))
        .fold((0, 0, 0), |(a, b, c), s| {
            (a + s.bytes_sent, b + s.bytes_received, c + s.retransmits)
        })
}

/// One run's state: counters, clocks, progress and stall watch.
struct Runner<'a> {
    dp: &'a Dataplane,
    /// The workers, while this thread drives them ([`RunSpec::busy_poll`]).
    busy: Option<BusyPoll<'a>>,
    wire: WireWatch,
    /// The connections' (sent, received) byte counters when the run began:
    /// progress counts from there.
    wire_base: (u64, u64),
    res: &'a Resources,
    spec: &'a RunSpec,
    remote: &'a [RemoteBuf],
    progress: &'a mut dyn FnMut(&Progress),
    start: Instant,
    last_progress: Instant,
    /// When the QPs' states were last looked at ([`STATUS_EVERY`]).
    status_checked: Instant,
    /// The QP the next look starts at ([`STATUS_PER_LOOK`]).
    status_next: usize,
    last_activity: Instant,
    /// A poll found completions since the last tick.
    polled_some: bool,
    deadline: Option<Instant>,
    wcs: [WorkCompletion; POLL_BATCH],
    scratch: Vec<u8>,
    expect: Vec<u8>,
    /// Expected patterns already made, by seed: a run checks the same
    /// few slots' patterns over and over, and making one costs more than
    /// comparing it. Bounded by [`EXPECT_CACHE_BYTES`]; past that each
    /// is made again into `expect`.
    expect_cache: HashMap<u64, Vec<u8>>,
    expect_cached: usize,
    verified: u64,
}

/// Bytes of expected patterns a runner keeps made.
const EXPECT_CACHE_BYTES: usize = 64 << 20;

impl<'a> Runner<'a> {
    fn new(
        dp: &'a Dataplane,
        busy: Option<BusyPoll<'a>>,
        res: &'a Resources,
        spec: &'a RunSpec,
        remote: &'a [RemoteBuf],
        progress: &'a mut dyn FnMut(&Progress),
    ) -> Runner<'a> {
        let now = Instant::now();
        let counters = wire_counters(dp, &res.qps);
        let wire = WireWatch::new(now, counters);
        let blank = WorkCompletion {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            qp_num: res.qps[0].num(),
            solicited: false,
            invalidated_stag: None,
        };
        Runner {
            dp,
            busy,
            wire,
            wire_base: (counters.0, counters.1),
            res,
            spec,
            remote,
            progress,
            start: now,
            last_progress: now,
            status_checked: now,
            status_next: 0,
            last_activity: now,
            polled_some: false,
            deadline: spec.duration.map(|d| now + d),
            wcs: [blank; POLL_BATCH],
            scratch: Vec::new(),
            expect: Vec::new(),
            expect_cache: HashMap::new(),
            expect_cached: 0,
            verified: 0,
        }
    }

    /// Nothing to do yet: drive the workers if this thread has them,
    /// otherwise let them run (the machine may have fewer cores than busy
    /// threads).
    fn idle(&mut self) {
        match &mut self.busy {
            Some(b) => {
                b.poll();
            }
            None => std::thread::yield_now(),
        }
    }

    fn limit(&self) -> u64 {
        if self.spec.duration.is_some() {
            u64::MAX
        } else {
            self.spec.iterations
        }
    }

    fn time_up(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// Progress report and stall watch; called in every wait. The
    /// connections' counters are read at most once per progress report
    /// and once per stall check (each read takes the dataplane's QP list).
    fn tick(&mut self, done: u64, total: u64) -> Result<Instant, ToolError> {
        self.tick_at(Instant::now(), done, total)
    }

    /// The stall watch of a wait after the measured loop (a verifying
    /// read-back): no progress line, whose message count would read 0
    /// after the round's own lines.
    fn watch(&mut self) -> Result<(), ToolError> {
        let now = Instant::now();
        self.last_progress = now;
        self.tick_at(now, 0, 0).map(|_| ())
    }

    /// [`Runner::tick`] at `now`, a time the caller has read (the
    /// bandwidth loops' `TurnClock`).
    fn tick_at(&mut self, now: Instant, done: u64, total: u64) -> Result<Instant, ToolError> {
        if std::mem::take(&mut self.polled_some) {
            self.last_activity = now;
        }
        if now.duration_since(self.last_progress) >= PROGRESS_EVERY {
            self.last_progress = now;
            let (sent, received, _) = wire_counters(self.dp, &self.res.qps);
            let bytes = sent
                .saturating_sub(self.wire_base.0)
                .max(received.saturating_sub(self.wire_base.1));
            (self.progress)(&Progress {
                done,
                total,
                bytes,
                total_bytes: total.saturating_mul(self.spec.size as u64),
                elapsed: now - self.start,
                duration: self.spec.duration,
            });
        }
        if self.wire.due(now) && self.wire.moved(now, wire_counters(self.dp, &self.res.qps)) {
            self.last_activity = now;
        }
        if now.duration_since(self.last_activity) >= STALL_TIMEOUT {
            return Err(ToolError::Peer(format!(
                "no progress for {} s ({done} of {} messages done): is the peer still running?",
                STALL_TIMEOUT.as_secs(),
                if total == 0 {
                    "?".to_string()
                } else {
                    total.to_string()
                }
            )));
        }
        let look = now.duration_since(self.status_checked) >= STATUS_EVERY;
        if look {
            self.status_checked = now;
        }
        if look && self.some_qp_disconnected() {
            return Err(ToolError::Peer(
                "the connection to the peer ended during the test".into(),
            ));
        }
        Ok(now)
    }

    fn poll(&mut self) -> usize {
        if let Some(b) = &mut self.busy {
            b.poll();
        }
        let n = self.res.cq.poll(&mut self.wcs);
        // Noted here, stamped by the next tick: no clock read per poll.
        self.polled_some |= n > 0;
        n
    }

    fn send(&self, i: usize, wr: &SendWr) -> Result<bool, ToolError> {
        match self.res.qps[i].post_send(wr) {
            Ok(()) => Ok(true),
            Err(PostError::QueueFull) => Ok(false),
            Err(e) => Err(post_error(e)),
        }
    }

    /// Posts `wrs` on QP `i` as one list; how many went in (the rest
    /// found the send queue full).
    fn send_list(&self, i: usize, wrs: &[SendWr]) -> Result<usize, ToolError> {
        match self.res.qps[i].post_send_list(wrs) {
            Ok(()) => Ok(wrs.len()),
            Err((k, PostError::QueueFull)) => Ok(k),
            Err((_, e)) => Err(post_error(e)),
        }
    }

    fn remote_stag(&self, i: usize) -> Stag {
        Stag(self.remote[i].rkey)
    }

    fn compare(
        &mut self,
        what: &str,
        off: usize,
        expect_seed: u64,
        last: Option<u8>,
    ) -> Result<(), ToolError> {
        let size = self.spec.size;
        if !self.expect_cache.contains_key(&expect_seed)
            && self.expect_cached + size <= EXPECT_CACHE_BYTES
        {
            let mut p = Vec::new();
            pattern(expect_seed, size, &mut p);
            self.expect_cached += size;
            self.expect_cache.insert(expect_seed, p);
        }
        let expect = match self.expect_cache.get(&expect_seed) {
            Some(p) => &p[..],
            None => {
                pattern(expect_seed, size, &mut self.expect);
                &self.expect[..]
            }
        };
        // The common case read in place; a mismatch (or a last byte that
        // differs by design) is read out whole to say where.
        let body = size.saturating_sub(usize::from(last.is_some()));
        let same = expect.len() == size
            && self
                .res
                .region
                .equals(off, &expect[..body])
                .map_err(|e| ToolError::Dataplane(e.into()))?;
        if !same || last.is_some() {
            self.scratch.resize(size, 0);
            self.res.read(off, &mut self.scratch)?;
            check_bytes(&self.scratch, expect, last)
                .map_err(|m| ToolError::DataMismatch(format!("{what}: {m}")))?;
        }
        self.verified += size as u64;
        Ok(())
    }

    // -----------------------------------------------------------------
    // Bandwidth.
    // -----------------------------------------------------------------

    fn bw_client(&mut self) -> Result<RunResult, ToolError> {
        let spec = self.spec;
        let res = self.res;
        let q = res.qps.len();
        let size = spec.size;
        let n = self.limit();
        let tx = u64::from(spec.tx_depth.max(1));
        let rx = spec.rx_depth.max(1);
        let cq_mod = cq_moderation(size, spec.all_sizes, spec.tx_depth);
        let nslots = slots(size);
        let st = step(size);
        let credits = spec.test == TestKind::SendBw;
        let total = if spec.duration.is_some() {
            0
        } else {
            n * q as u64
        };
        if spec.verify && spec.test != TestKind::ReadBw {
            let mut buf = Vec::new();
            for i in 0..q {
                for k in 0..nslots {
                    pattern(seed(spec.test, i, k), size, &mut buf);
                    res.write(res.send_off(i) + k as usize * st, &buf)?;
                }
            }
        }
        if credits {
            for i in 0..q {
                res.set_credit_word(q + i, 0);
            }
        }
        let mut scnt = vec![0u64; q];
        let mut ccnt = vec![0u64; q];
        let mut signalled = vec![0u64; q];
        let mut batch: Vec<SendWr> = Vec::with_capacity(tx as usize);
        let mut samples: Vec<(Duration, u64)> = Vec::with_capacity(4096);
        let mut done = 0u64;
        // The QPs that may have something to post: all at first, then
        // those a completion gave room (or that credits or a full queue
        // held back), so that an iteration costs what it does, not a visit
        // of every QP.
        let mut ready: Vec<usize> = (0..q).collect();
        let mut visiting: Vec<usize> = Vec::with_capacity(q);
        let mut listed = vec![true; q];
        // QPs that credits held back: no completion says when the peer's
        // update comes, so they are looked at again, up to
        // `HELD_PER_TURN` a turn in order, so that a turn costs the same
        // with ten thousand of them.
        let mut held_back: VecDeque<usize> = VecDeque::with_capacity(q);
        // QPs whose every message completed (runs of a number of them).
        let mut complete = 0;
        self.start = Instant::now();
        self.deadline = spec.duration.map(|d| self.start + d);
        self.last_activity = self.start;
        let mut last_sample = self.start;
        samples.push((Duration::ZERO, 0));
        // The time after each turn's poll (read afresh every
        // `CLOCK_EVERY` turns); the next turn's posting decision uses it.
        let mut now = self.start;
        let mut clock = TurnClock::new(now);
        loop {
            let posting = !self.time_up(now);
            core::mem::swap(&mut ready, &mut visiting);
            visiting.extend(held_back.drain(..HELD_PER_TURN.min(held_back.len())));
            for &i in &visiting {
                // Everything there is room for goes as one list: one
                // wake-up of the worker for all of it.
                batch.clear();
                let mut s = scnt[i];
                let mut held = false;
                while posting && s < n && s < tx + ccnt[i] {
                    if credits {
                        let c = res.credit_word(q + i);
                        if ((s + 1) as u32).wrapping_sub(c) >= rx {
                            // Credits come in the peer's Writes, with no
                            // completion here: look again next time.
                            held = true;
                            break;
                        }
                    }
                    let slot = (s % nslots) as usize;
                    let sig = s % cq_mod == cq_mod - 1 || (spec.duration.is_none() && s == n - 1);
                    let raddr = self.remote[i].addr + (slot * st) as u64;
                    let op = match spec.test {
                        TestKind::WriteBw => SendOp::RdmaWrite {
                            remote_addr: raddr,
                            rkey: self.remote_stag(i),
                        },
                        TestKind::ReadBw => SendOp::RdmaRead {
                            remote_addr: raddr,
                            rkey: self.remote_stag(i),
                        },
                        _ => SendOp::Send,
                    };
                    let wr = SendWr {
                        wr_id: wr_id(i, 0, s),
                        op,
                        sges: SgeList::single(
                            res.mrs[i].sge((res.send_off(i) + slot * st) as u64, size as u32),
                        ),
                        flags: if sig {
                            SendFlags::SIGNALED
                        } else {
                            SendFlags::NONE
                        },
                    };
                    batch.push(wr);
                    s += 1;
                }
                let posted = if batch.is_empty() {
                    0
                } else {
                    self.send_list(i, &batch)?
                };
                for (k, wr) in batch[..posted].iter().enumerate() {
                    if wr.flags.contains(SendFlags::SIGNALED) {
                        signalled[i] = scnt[i] + k as u64 + 1;
                    }
                }
                scnt[i] += posted as u64;
                // A queue that took less than offered is full: look again.
                if posting && held && posted == batch.len() {
                    held_back.push_back(i);
                } else if posting && (held || posted < batch.len()) {
                    ready.push(i);
                } else {
                    listed[i] = false;
                }
            }
            visiting.clear();
            let got = self.poll();
            for k in 0..got {
                let wc = self.wcs[k];
                if wc.status != WcStatus::Success {
                    return Err(wc_error(&wc));
                }
                let i = wr_qp(wc.wr_id);
                if i < q {
                    let c = (wc.wr_id & COUNT_MASK) + 1;
                    if c > ccnt[i] {
                        done += c - ccnt[i];
                        if ccnt[i] < n && c >= n {
                            complete += 1;
                        }
                        ccnt[i] = c;
                        if !listed[i] {
                            listed[i] = true;
                            ready.push(i);
                        }
                    }
                }
            }
            now = clock.turn();
            if got > 0 && now.duration_since(last_sample) >= Duration::from_millis(1) {
                last_sample = now;
                samples.push((now - self.start, done));
            }
            let finished = if spec.duration.is_some() {
                !posting && (0..q).all(|i| ccnt[i] >= signalled[i])
            } else {
                complete == q
            };
            if finished {
                break;
            }
            if got == 0 {
                self.tick_at(now, done, total)?;
                self.idle();
            }
        }
        let elapsed = self.start.elapsed();
        samples.push((elapsed, done));
        if spec.verify {
            self.bw_verify(&scnt)?;
        }
        Ok(bw_result(size, &samples, spec.duration, self.verified))
    }

    /// After a `write-bw` or `read-bw` run: the destination slots hold the
    /// last message that went to each. `write-bw` reads them back from the
    /// peer into the receive half first (the peer is passive).
    fn bw_verify(&mut self, scnt: &[u64]) -> Result<(), ToolError> {
        let spec = self.spec;
        let res = self.res;
        let size = spec.size;
        let st = step(size);
        let nslots = slots(size);
        match spec.test {
            TestKind::WriteBw => {
                for (i, &sent) in scnt.iter().enumerate() {
                    let used = nslots.min(sent);
                    for k in 0..used {
                        let off = (k as usize) * st;
                        let wr = SendWr {
                            wr_id: wr_id(i, VERIFY_FLAG, k),
                            op: SendOp::RdmaRead {
                                remote_addr: self.remote[i].addr + off as u64,
                                rkey: self.remote_stag(i),
                            },
                            sges: SgeList::single(
                                res.mrs[i].sge((res.recv_off(i) + off) as u64, size as u32),
                            ),
                            flags: SendFlags::SIGNALED,
                        };
                        self.last_activity = Instant::now();
                        while !self.send(i, &wr)? {
                            self.watch()?;
                            std::thread::yield_now();
                        }
                        self.drain_until(wr.wr_id)?;
                        self.compare(
                            "RDMA Write destination",
                            res.recv_off(i) + off,
                            seed(spec.test, i, k),
                            None,
                        )?;
                    }
                }
            }
            TestKind::ReadBw => {
                self.compare_slots("RDMA Read sink", scnt, nslots, |i| res.send_off(i), st)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Compares the slots that received something with their patterns:
    /// for each QP `i`, the first `nslots.min(counts[i])` slots, at
    /// `base(i) + k * step`, against pattern `k`.
    fn compare_slots(
        &mut self,
        what: &str,
        counts: &[u64],
        nslots: u64,
        base: impl Fn(usize) -> usize,
        step: usize,
    ) -> Result<(), ToolError> {
        let test = self.spec.test;
        for (i, &n) in counts.iter().enumerate() {
            for k in 0..nslots.min(n) {
                self.compare(what, base(i) + k as usize * step, seed(test, i, k), None)?;
            }
        }
        Ok(())
    }

    /// Takes completions until `id` completes.
    fn drain_until(&mut self, id: u64) -> Result<(), ToolError> {
        self.last_activity = Instant::now();
        loop {
            let got = self.poll();
            for k in 0..got {
                let wc = self.wcs[k];
                if wc.status != WcStatus::Success {
                    return Err(wc_error(&wc));
                }
                if wc.wr_id == id {
                    return Ok(());
                }
            }
            if got == 0 {
                self.watch()?;
                std::thread::yield_now();
            }
        }
    }

    fn bw_server(&mut self) -> Result<RunResult, ToolError> {
        let spec = self.spec;
        let res = self.res;
        let q = res.qps.len();
        let size = spec.size;
        let n = self.limit();
        let tx = u64::from(spec.tx_depth.max(1));
        let rx = spec.rx_depth.max(1);
        let credit_every = u64::from((rx / 3).max(1));
        let total = if spec.duration.is_some() {
            0
        } else {
            n * q as u64
        };
        let send_slots = slots(size);
        let (recv_slots, rlen) = res.recv_geometry();
        // Message `m` lands in slot `m % recv_slots` and carries pattern
        // `m % send_slots`: where the two counts agree a slot always holds
        // the same pattern, and its final contents are compared after the
        // loop (the module's opening).
        let after = recv_slots == send_slots;
        let mut guard = res.recv_state();
        let st: &mut Vec<RecvState> = &mut guard;
        let mut rcnt = vec![0u64; q];
        // A QP owes its peer a credit update (`pending_credit`); those that
        // owe one and have a staging slot free wait in `owing`, each once.
        // A QP's updates in flight are at most `tx` (its send queue, and
        // the staging slots its updates are read from).
        let mut pending_credit = vec![false; q];
        let mut owing: Vec<usize> = Vec::with_capacity(q);
        let mut credit_seq = vec![0u64; q];
        let mut credit_flight = vec![0u64; q];
        let mut scredit = 0u64;
        let mut done = 0u64;
        let mut first: Option<Instant> = None;
        let mut samples: Vec<(Duration, u64)> = Vec::with_capacity(4096);
        let mut last_sample = Instant::now();
        self.start = Instant::now();
        self.last_activity = self.start;
        let mut all_in = 0usize;
        let mut clock = TurnClock::new(self.start);
        loop {
            let got = self.poll();
            for k in 0..got {
                let wc = self.wcs[k];
                if wc.status != WcStatus::Success {
                    return Err(wc_error(&wc));
                }
                let i = wr_qp(wc.wr_id);
                if i >= q {
                    continue;
                }
                if wc.wr_id & CREDIT_FLAG != 0 {
                    scredit = scredit.saturating_sub(1);
                    credit_flight[i] = credit_flight[i].saturating_sub(1);
                    // A slot is free again: an update it held back goes.
                    if pending_credit[i] && credit_flight[i] + 1 == tx {
                        owing.push(i);
                    }
                    continue;
                }
                if wc.opcode != WcOpcode::Recv {
                    continue;
                }
                if first.is_none() {
                    // The clock starts at the first message, as perftest's
                    // server does.
                    let t = Instant::now();
                    clock = TurnClock::new(t);
                    first = Some(t);
                    self.start = t;
                    self.deadline = spec.duration.map(|d| t + d);
                    samples.push((Duration::ZERO, 0));
                }
                let m = rcnt[i];
                rcnt[i] += 1;
                if rcnt[i] == n {
                    all_in += 1;
                }
                done += 1;
                st[i].taken += 1;
                if wc.byte_len as usize != size {
                    return Err(ToolError::DataMismatch(format!(
                        "a received Send carried {} bytes, expected {size}",
                        wc.byte_len
                    )));
                }
                if spec.verify && !after {
                    let slot = (wc.wr_id & COUNT_MASK) as usize;
                    self.compare(
                        "received Send",
                        res.recv_off(i) + slot * rlen,
                        seed(spec.test, i, m % send_slots),
                        None,
                    )?;
                }
                if spec.duration.is_some() || st[i].posted < n {
                    res.post_recv(i, &mut st[i])?;
                }
                if (rcnt[i] % u64::from(rx)) % credit_every == 0 && !pending_credit[i] {
                    pending_credit[i] = true;
                    if credit_flight[i] < tx {
                        owing.push(i);
                    }
                }
            }
            let mut k = 0;
            while k < owing.len() {
                let i = owing[k];
                res.set_credit_word(i, rcnt[i] as u32);
                let off = res.stage_credit(i, credit_seq[i], tx, rcnt[i] as u32);
                let c = res.credits.as_ref().map(|c| c.mr.sge(off as u64, 4));
                let Some(sge) = c else { break };
                let wr = SendWr {
                    wr_id: wr_id(i, CREDIT_FLAG, rcnt[i]),
                    op: SendOp::RdmaWrite {
                        remote_addr: self.remote[i].addr,
                        rkey: self.remote_stag(i),
                    },
                    sges: SgeList::single(sge),
                    flags: SendFlags::SIGNALED,
                };
                if self.send(i, &wr)? {
                    credit_seq[i] += 1;
                    credit_flight[i] += 1;
                    pending_credit[i] = false;
                    scredit += 1;
                    owing.swap_remove(k);
                } else {
                    // Its send queue is full: look again next time.
                    k += 1;
                }
            }
            let now = clock.turn();
            if got > 0
                && first.is_some()
                && now.duration_since(last_sample) >= Duration::from_millis(1)
            {
                last_sample = now;
                samples.push((now - self.start, done));
            }
            let received_all = if spec.duration.is_some() {
                first.is_some() && self.time_up(now)
            } else {
                all_in == q
            };
            // With no update in flight every slot is free, so a QP that
            // owes one is in `owing`.
            if received_all && scredit == 0 && owing.is_empty() {
                break;
            }
            if got == 0 {
                if let Err(e) = self.tick_at(now, done, total) {
                    return Err(match e {
                        ToolError::Peer(m) => ToolError::Peer(format!(
                            "{m} (receives per QP {rcnt:?}, credit writes in flight {scredit}, \
                             credits waiting {pending_credit:?})"
                        )),
                        e => e,
                    });
                }
                self.idle();
            }
        }
        let elapsed = self.start.elapsed();
        samples.push((elapsed, done));
        if spec.verify && after {
            self.compare_slots(
                "received Send",
                &rcnt,
                recv_slots,
                |i| res.recv_off(i),
                rlen,
            )?;
        }
        for (i, s) in st.iter_mut().enumerate() {
            res.top_up(i, s, rx)?;
        }
        Ok(bw_result(size, &samples, spec.duration, self.verified))
    }

    // -----------------------------------------------------------------
    // Latency.
    // -----------------------------------------------------------------

    fn write_lat(&mut self) -> Result<RunResult, ToolError> {
        let size = self.spec.size;
        let mut posts: Vec<Instant> = Vec::with_capacity(self.limit().min(1 << 20) as usize);
        let r = self.write_lat_loop(&mut posts);
        self.lat_end(r)?;
        // Ready for another round: the peer writes nothing more in this one.
        self.res.write(self.res.adv_off(0) + size - 1, &[0])?;
        Ok(lat_result(
            size,
            &posts,
            2,
            self.start.elapsed(),
            self.verified,
        ))
    }

    /// A latency loop's outcome. In duration mode each side keeps its own
    /// clock, as perftest's do, and they started up to a control message
    /// apart: the side whose time is up first ends and closes, and the
    /// other then finds the connection gone in its last moments. That is
    /// the run's end, not a failure, when it comes within
    /// [`PEER_END_GRACE`] of this side's own end.
    fn lat_end(&self, r: Result<(), ToolError>) -> Result<(), ToolError> {
        match (r, self.spec.duration) {
            (Ok(()), _) => Ok(()),
            (Err(ToolError::Peer(_)), Some(d))
                if self.peer_gone() && self.start.elapsed() + PEER_END_GRACE >= d =>
            {
                Ok(())
            }
            (Err(e), _) => Err(e),
        }
    }

    /// Whether one of the next [`STATUS_PER_LOOK`] QPs (all of them,
    /// when there are no more) is disconnected.
    fn some_qp_disconnected(&mut self) -> bool {
        let qps = &self.res.qps;
        let (start, n) = status_window(self.status_next, qps.len());
        self.status_next = start + n;
        qps.iter()
            .cycle()
            .skip(start)
            .take(n)
            .any(|q| q.status() == QpStatus::Disconnected)
    }

    /// Whether a data connection is no longer connected.
    fn peer_gone(&self) -> bool {
        self.res
            .qps
            .iter()
            .any(|q| q.status() != QpStatus::Connected)
    }

    fn write_lat_loop(&mut self, posts: &mut Vec<Instant>) -> Result<(), ToolError> {
        let spec = self.spec;
        let res = self.res;
        let size = spec.size;
        let n = self.limit();
        let total = if spec.duration.is_some() { 0 } else { n };
        let poll_off = res.adv_off(0) + size - 1;
        let (mut scnt, mut rcnt, mut ccnt) = (0u64, 0u64, 0u64);
        let mut byte = [0u8; 1];
        self.start = Instant::now();
        self.deadline = spec.duration.map(|d| self.start + d);
        self.last_activity = self.start;
        let mut src = Vec::new();
        loop {
            let now = Instant::now();
            let stop = self.time_up(now);
            if stop || (scnt >= n && rcnt >= n && ccnt >= n) {
                break;
            }
            // Wait for the peer's message (the server sends first).
            if rcnt < n && !(scnt < 1 && spec.role == Role::Server) {
                let want = (rcnt + 1) as u8;
                loop {
                    res.read(poll_off, &mut byte)?;
                    if byte[0] == want {
                        break;
                    }
                    let now = self.tick(rcnt, total)?;
                    if self.time_up(now) {
                        break;
                    }
                    self.reap_sends(&mut ccnt)?;
                    self.idle();
                }
                if byte[0] != want {
                    break;
                }
                rcnt += 1;
                self.last_activity = Instant::now();
                if spec.verify {
                    self.compare(
                        "RDMA Write destination",
                        res.adv_off(0),
                        seed(spec.test, 0, rcnt),
                        Some(rcnt as u8),
                    )?;
                }
            }
            if scnt < n {
                scnt += 1;
                if spec.verify {
                    pattern(seed(spec.test, 0, scnt), size, &mut src);
                    if let Some(l) = src.last_mut() {
                        *l = scnt as u8;
                    }
                    res.write(res.send_off(0), &src)?;
                } else {
                    res.write(res.send_off(0) + size - 1, &[scnt as u8])?;
                }
                posts.push(Instant::now());
                let wr = SendWr {
                    wr_id: wr_id(0, 0, scnt),
                    op: SendOp::RdmaWrite {
                        remote_addr: self.remote[0].addr,
                        rkey: self.remote_stag(0),
                    },
                    sges: SgeList::single(res.mrs[0].sge(res.send_off(0) as u64, size as u32)),
                    flags: SendFlags::SIGNALED,
                };
                while !self.send(0, &wr)? {
                    self.reap_sends(&mut ccnt)?;
                    self.tick(rcnt, total)?;
                }
            }
            self.reap_sends(&mut ccnt)?;
        }
        // The last Writes' completions (the peer may be done already).
        while ccnt < scnt {
            self.reap_sends(&mut ccnt)?;
            self.tick(rcnt, total)?;
        }
        Ok(())
    }

    /// Takes send completions (latency tests), failing on an error.
    fn reap_sends(&mut self, ccnt: &mut u64) -> Result<usize, ToolError> {
        let got = self.poll();
        let mut recvs = 0;
        for k in 0..got {
            let wc = self.wcs[k];
            if wc.status != WcStatus::Success {
                return Err(wc_error(&wc));
            }
            if wc.opcode == WcOpcode::Recv {
                recvs += 1;
            } else {
                *ccnt += 1;
            }
        }
        Ok(recvs)
    }

    fn send_lat(&mut self) -> Result<RunResult, ToolError> {
        let size = self.spec.size;
        let rx = self.spec.rx_depth.max(1);
        let res = self.res;
        let mut guard = res.recv_state();
        let st: &mut Vec<RecvState> = &mut guard;
        let mut posts: Vec<Instant> = Vec::with_capacity(self.limit().min(1 << 20) as usize);
        let r = self.send_lat_loop(&mut posts, st);
        self.lat_end(r)?;
        let elapsed = self.start.elapsed();
        if !self.peer_gone() {
            for (i, s) in st.iter_mut().enumerate() {
                res.top_up(i, s, rx)?;
            }
        }
        Ok(lat_result(size, &posts, 2, elapsed, self.verified))
    }

    fn send_lat_loop(
        &mut self,
        posts: &mut Vec<Instant>,
        st: &mut [RecvState],
    ) -> Result<(), ToolError> {
        let spec = self.spec;
        let res = self.res;
        let size = spec.size;
        let n = self.limit();
        let total = if spec.duration.is_some() { 0 } else { n };
        let rx = u64::from(spec.rx_depth.max(1));
        let (_, rlen) = res.recv_geometry();
        let (mut scnt, mut rcnt) = (0u64, 0u64);
        let mut src = Vec::new();
        self.start = Instant::now();
        self.deadline = spec.duration.map(|d| self.start + d);
        self.last_activity = self.start;
        'outer: loop {
            if self.time_up(Instant::now()) || (scnt >= n && rcnt >= n) {
                break;
            }
            // The server waits for the client's first message.
            if rcnt < n && !(scnt < 1 && spec.role == Role::Client) {
                let wc = loop {
                    let got = self.poll();
                    let mut recv = None;
                    for k in 0..got {
                        let wc = self.wcs[k];
                        if wc.status != WcStatus::Success {
                            return Err(wc_error(&wc));
                        }
                        if wc.opcode == WcOpcode::Recv {
                            recv = Some(wc);
                        }
                    }
                    if let Some(wc) = recv {
                        break wc;
                    }
                    let now = self.tick(rcnt, total)?;
                    if self.time_up(now) {
                        break 'outer;
                    }
                    self.idle();
                };
                rcnt += 1;
                st[0].taken += 1;
                if wc.byte_len as usize != size {
                    return Err(ToolError::DataMismatch(format!(
                        "a received Send carried {} bytes, expected {size}",
                        wc.byte_len
                    )));
                }
                if spec.verify {
                    let slot = (wc.wr_id & COUNT_MASK) as usize;
                    self.compare(
                        "received Send",
                        res.recv_off(0) + slot * rlen,
                        seed(spec.test, 0, rcnt),
                        None,
                    )?;
                }
                if spec.duration.is_some() || rcnt + rx <= n {
                    res.post_recv(0, &mut st[0])?;
                }
            }
            if scnt < n {
                scnt += 1;
                if spec.verify {
                    pattern(seed(spec.test, 0, scnt), size, &mut src);
                    res.write(res.send_off(0), &src)?;
                }
                // Signalled now and then so that the send queue drains.
                let sig = scnt % CQ_MOD == 0 || scnt == n;
                posts.push(Instant::now());
                let wr = SendWr {
                    wr_id: wr_id(0, 0, scnt),
                    op: SendOp::Send,
                    sges: SgeList::single(res.mrs[0].sge(res.send_off(0) as u64, size as u32)),
                    flags: if sig {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    },
                };
                while !self.send(0, &wr)? {
                    self.tick(rcnt, total)?;
                    std::thread::yield_now();
                }
            }
        }
        Ok(())
    }

    fn read_lat(&mut self) -> Result<RunResult, ToolError> {
        let size = self.spec.size;
        let mut posts: Vec<Instant> = Vec::with_capacity(self.limit().min(1 << 20) as usize);
        let r = self.read_lat_loop(&mut posts);
        self.lat_end(r)?;
        posts.push(Instant::now());
        Ok(lat_result(
            size,
            &posts,
            1,
            self.start.elapsed(),
            self.verified,
        ))
    }

    fn read_lat_loop(&mut self, posts: &mut Vec<Instant>) -> Result<(), ToolError> {
        let spec = self.spec;
        let res = self.res;
        let size = spec.size;
        let n = self.limit();
        let total = if spec.duration.is_some() { 0 } else { n };
        let mut poison = Vec::new();
        self.start = Instant::now();
        self.deadline = spec.duration.map(|d| self.start + d);
        self.last_activity = self.start;
        let mut scnt = 0u64;
        while scnt < n && !self.time_up(Instant::now()) {
            if spec.verify {
                // A sink that did not change would pass: spoil it first.
                pattern(!seed(spec.test, 0, scnt), size, &mut poison);
                res.write(res.send_off(0), &poison)?;
            }
            posts.push(Instant::now());
            let wr = SendWr {
                wr_id: wr_id(0, 0, scnt),
                op: SendOp::RdmaRead {
                    remote_addr: self.remote[0].addr,
                    rkey: self.remote_stag(0),
                },
                sges: SgeList::single(res.mrs[0].sge(res.send_off(0) as u64, size as u32)),
                flags: SendFlags::SIGNALED,
            };
            while !self.send(0, &wr)? {
                self.tick(scnt, total)?;
            }
            'wait: loop {
                let got = self.poll();
                for k in 0..got {
                    let wc = self.wcs[k];
                    if wc.status != WcStatus::Success {
                        return Err(wc_error(&wc));
                    }
                    if wc.wr_id == wr.wr_id {
                        break 'wait;
                    }
                }
                self.tick(scnt, total)?;
                self.idle();
            }
            scnt += 1;
            if spec.verify {
                self.compare(
                    "RDMA Read sink",
                    res.send_off(0),
                    seed(spec.test, 0, 0),
                    None,
                )?;
            }
        }
        Ok(())
    }
}

/// Bandwidth figures from `(elapsed, messages done)` samples, the last
/// taken at the run's end: the average over the run, the peak over the
/// best window of a tenth of it (at least 10 ms).
fn bw_result(
    size: usize,
    samples: &[(Duration, u64)],
    duration: Option<Duration>,
    verified: u64,
) -> RunResult {
    let (elapsed, done) = samples.last().copied().unwrap_or_default();
    let secs = elapsed.as_secs_f64().max(1e-9);
    let bytes = done * size as u64;
    let avg = bytes as f64 / secs / MB;
    let window = (elapsed / 10).max(Duration::from_millis(10)).min(elapsed);
    let mut peak = avg;
    let mut j = 0;
    for i in 0..samples.len() {
        while j < samples.len() && samples[j].0 < samples[i].0 + window {
            j += 1;
        }
        if j == samples.len() {
            break;
        }
        let dt = (samples[j].0 - samples[i].0).as_secs_f64();
        if dt > 0.0 {
            let bw = (samples[j].1 - samples[i].1) as f64 * size as f64 / dt / MB;
            peak = peak.max(bw);
        }
    }
    RunResult {
        size,
        bytes,
        iterations: done,
        elapsed,
        bw_peak_mbps: peak,
        bw_avg_mbps: avg,
        bw_steady_mbps: duration.and_then(|d| steady_rate(samples, d, size)),
        msg_rate_mpps: done as f64 / secs / 1e6,
        latency: None,
        verified_bytes: verified,
    }
}

/// perftest's default margin in duration mode: this fraction of the
/// duration at each end stays out of the figure it reports.
const MARGIN_DIVISOR: u32 = 4;

/// The bandwidth, MB/s, between the margins of a run of `duration` (see
/// [`RunResult::bw_steady_mbps`]), from the run's `(time, messages done)`
/// samples; `None` when the samples do not reach past the window's end.
fn steady_rate(samples: &[(Duration, u64)], duration: Duration, size: usize) -> Option<f64> {
    let (from, to) = steady_window(duration)?;
    let done = done_at(samples, to)? - done_at(samples, from)?;
    Some(done * size as f64 / (to - from).as_secs_f64() / MB)
}

/// The window of a run of `duration` between perftest's margins: from a
/// margin in to a margin before the end (`None` when that is empty).
pub(crate) fn steady_window(duration: Duration) -> Option<(Duration, Duration)> {
    let margin = duration / MARGIN_DIVISOR;
    let (from, to) = (margin, duration.checked_sub(margin)?);
    (to > from).then_some((from, to))
}

impl RunResult {
    /// The figures perftest prints for this run: in duration mode, those
    /// of the window between the margins (messages, average bandwidth
    /// and message rate over it, as perftest counts only the messages
    /// done in that window); else the whole run's. The peak stays the
    /// run's.
    pub fn as_perftest_reports(&self, duration: Option<Duration>) -> RunResult {
        let window = duration.and_then(steady_window);
        match (self.bw_steady_mbps, window) {
            (Some(bw), Some((from, to))) if self.size > 0 => {
                let messages = bw * MB / self.size as f64;
                let secs = (to - from).as_secs_f64();
                RunResult {
                    iterations: (messages * secs).round() as u64,
                    bw_avg_mbps: bw,
                    msg_rate_mpps: messages / 1e6,
                    ..self.clone()
                }
            }
            _ => self.clone(),
        }
    }
}

/// Messages done `at` into a run, interpolated between the samples on
/// either side; `None` past the last sample.
fn done_at(samples: &[(Duration, u64)], at: Duration) -> Option<f64> {
    let j = samples.partition_point(|s| s.0 < at);
    let &(t1, n1) = samples.get(j)?;
    let Some(&(t0, n0)) = j.checked_sub(1).and_then(|i| samples.get(i)) else {
        return Some(n1 as f64);
    };
    let span = (t1 - t0).as_secs_f64();
    let part = if span > 0.0 {
        (at - t0).as_secs_f64() / span
    } else {
        1.0
    };
    Some(n0 as f64 + (n1 - n0) as f64 * part)
}

/// Latency figures from the times messages were posted: one sample per
/// round trip, divided by `factor` (2 for the ping-pongs, 1 for Reads).
fn lat_result(
    size: usize,
    posts: &[Instant],
    factor: u32,
    elapsed: Duration,
    verified: u64,
) -> RunResult {
    let samples: Vec<u64> = posts
        .windows(2)
        .map(|w| ((w[1] - w[0]).as_nanos() / u128::from(factor)) as u64)
        .collect();
    let iterations = samples.len() as u64;
    let secs = elapsed.as_secs_f64().max(1e-9);
    let bytes = iterations * size as u64;
    RunResult {
        size,
        bytes,
        iterations,
        elapsed,
        bw_peak_mbps: 0.0,
        bw_avg_mbps: bytes as f64 / secs / MB,
        bw_steady_mbps: None,
        msg_rate_mpps: iterations as f64 / secs / 1e6,
        latency: LatencySummary::from_nanos(&samples),
        verified_bytes: verified,
    }
}

/// The QPs a status look reads, of `len`, when the last one ended before
/// `next`: from `next` (wrapped) on, at most [`STATUS_PER_LOOK`] of them,
/// wrapping past the last.
fn status_window(next: usize, len: usize) -> (usize, usize) {
    (next % len.max(1), len.min(STATUS_PER_LOOK))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::api::DriveMode;
    use dataplane::config::Config;
    use dataplane::link::{MemLink, MemLinkConfig};
    use std::net::{Ipv4Addr, SocketAddrV4};
    use tcp_offload::wire::EthernetAddress;

    #[test]
    fn status_looks_cover_every_qp_within_a_round_of_looks() {
        for len in [0, 1, 7, STATUS_PER_LOOK, STATUS_PER_LOOK + 1, 10_000] {
            let looks = len.div_ceil(STATUS_PER_LOOK).max(1);
            // From wherever the looks stand.
            for first in [0, 5, len.saturating_sub(1), 3 * len + 2] {
                let mut seen = vec![false; len];
                let mut next = first;
                for _ in 0..looks {
                    let (start, n) = status_window(next, len);
                    assert!(n <= STATUS_PER_LOOK);
                    for i in start..start + n {
                        seen[i % len] = true;
                    }
                    next = start + n;
                }
                assert!(seen.iter().all(|&s| s), "len {len} from {first}");
            }
        }
    }

    /// F11: a slow peer whose data trickles in keeps the stall watch quiet
    /// for far longer than [`STALL_TIMEOUT`] without a single completion;
    /// once the bytes stop (or only retransmissions leave), it fires after
    /// [`STALL_TIMEOUT`].
    #[test]
    fn traffic_without_completions_is_not_a_stall() {
        let t0 = Instant::now();
        let mut w = WireWatch::new(t0, (1000, 500, 0));
        let mut last_activity = t0;
        let mut stalled_at = None;
        let mut counters = (1000u64, 500u64, 0u64);
        // 40 s of 100 ms ticks: a Read Response segment every 2 s until
        // 30 s; from 30 s on only retransmissions of our last segment.
        for tick in 1..=400u64 {
            let now = t0 + Duration::from_millis(100 * tick);
            if tick % 20 == 0 && tick <= 300 {
                counters.1 += 1448;
            }
            if tick > 300 && tick % 15 == 0 {
                counters.0 += 100;
                counters.2 += 1;
            }
            if w.due(now) && w.moved(now, counters) {
                last_activity = now;
            }
            if now.duration_since(last_activity) >= STALL_TIMEOUT {
                stalled_at = Some(tick);
                break;
            }
        }
        // The last received byte was seen at 30 s (the look at 30 s),
        // so the stall is declared 10 s later, not before.
        assert_eq!(stalled_at, Some(400));
        // New data sent without a retransmission (acknowledged) counts.
        let mut w = WireWatch::new(t0, (0, 0, 0));
        assert!(!w.due(t0 + Duration::from_millis(999)));
        assert!(w.moved(t0 + WIRE_CHECK_EVERY, (10, 0, 0)));
        assert!(!w.moved(t0 + 2 * WIRE_CHECK_EVERY, (10, 0, 0)));
        assert!(!w.moved(t0 + 3 * WIRE_CHECK_EVERY, (20, 0, 1)));
    }

    #[test]
    fn perftest_geometry() {
        assert_eq!(step(2), 64);
        assert_eq!(step(65), 128);
        assert_eq!(slots(2), 64);
        assert_eq!(slots(2048), 2);
        assert_eq!(slots(2049), 1);
        assert_eq!(slots(65536), 1);
        assert_eq!(buff_size(100), 4096);
        assert_eq!(buff_size(65536), 65536);
    }

    #[test]
    fn a_changed_byte_is_named_and_the_last_may_be_replaced() {
        let mut expect = Vec::new();
        pattern(seed(TestKind::SendBw, 0, 3), 1000, &mut expect);
        let mut got = expect.clone();
        assert_eq!(check_bytes(&got, &expect, None), Ok(()));
        got[417] ^= 0x10;
        let e = check_bytes(&got, &expect, None).unwrap_err();
        assert!(e.starts_with("byte 417 of 1000 is"), "{e}");
        got[417] ^= 0x10;
        // The last byte replaced (a latency round's stamp): only that
        // value passes there.
        got[999] = expect[999].wrapping_add(1);
        assert_eq!(check_bytes(&got, &expect, Some(got[999])), Ok(()));
        let e = check_bytes(&got, &expect, None).unwrap_err();
        assert!(e.starts_with("byte 999 of 1000"), "{e}");
        let e = check_bytes(&got, &expect, Some(got[999].wrapping_add(1))).unwrap_err();
        assert!(e.starts_with("byte 999 of 1000"), "{e}");
        assert_eq!(check_bytes(&[], &[], None), Ok(()));
        assert_eq!(check_bytes(&[], &[], Some(7)), Ok(()));
    }

    #[test]
    fn patterns_are_the_splitmix64_stream_at_every_length() {
        // The stream stepped one word at a time, as it is defined.
        let reference = |seed: u64, len: usize| -> Vec<u8> {
            let mut x = seed;
            let mut out = Vec::new();
            while out.len() < len {
                x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
            }
            out.truncate(len);
            out
        };
        let mut got = Vec::new();
        for seed in [0, 1, u64::MAX, seed(TestKind::SendBw, 9999, 3)] {
            for len in (0..200).chain([4095, 4096, 65535, 65536]) {
                // The same buffer each time, longer and shorter: nothing
                // of an earlier pattern may remain.
                pattern(seed, len, &mut got);
                assert_eq!(got, reference(seed, len), "seed {seed:#x}, {len} bytes");
            }
        }
    }

    #[test]
    fn patterns_differ_by_slot_qp_and_test() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        pattern(seed(TestKind::WriteBw, 0, 0), 100, &mut a);
        pattern(seed(TestKind::WriteBw, 0, 1), 100, &mut b);
        assert_eq!(a.len(), 100);
        assert_ne!(a, b);
        pattern(seed(TestKind::WriteBw, 1, 0), 100, &mut b);
        assert_ne!(a, b);
        pattern(seed(TestKind::ReadBw, 0, 0), 100, &mut b);
        assert_ne!(a, b);
        pattern(seed(TestKind::WriteBw, 0, 0), 100, &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn latency_summary_percentiles() {
        let samples: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let s = LatencySummary::from_nanos(&samples).unwrap();
        assert!((s.min_us - 1.0).abs() < 0.01);
        assert!((s.p50_us - 500.0).abs() < 1.0, "{s:?}");
        assert!((s.p99_us - 990.0).abs() < 1.0, "{s:?}");
        assert!((s.max_us - 1000.0).abs() < 1.0, "{s:?}");
        assert!((s.avg_us - 500.5).abs() < 0.01);
        assert!(s.stdev_us > 288.0 && s.stdev_us < 289.0, "{s:?}");
        assert!(LatencySummary::from_nanos(&[]).is_none());
        // 1..=1000 µs: 1 in the 1 µs bucket, 1 in 2 µs, 3 in 5 µs, 5 in
        // 10 µs, ... 500 in 1 ms.
        let h = s.histogram;
        assert_eq!(h.count(), 1000);
        assert_eq!(&h.counts[..10], &[1, 1, 3, 5, 10, 30, 50, 100, 300, 500]);
        assert!(h.counts[10..].iter().all(|&c| c == 0));
        assert_eq!(h.sum_ns, 500_500_000);
    }

    #[test]
    fn latency_histogram_bounds_and_sums() {
        let mut h = LatencyHistogram::default();
        for ns in [0, 1_000, 1_001, 10_000_000_000, 10_000_000_001, u64::MAX] {
            h.record(ns);
        }
        assert_eq!(h.counts[0], 2, "at most 1 µs, the bound included");
        assert_eq!(h.counts[1], 1);
        assert_eq!(h.counts[LATENCY_BOUNDS_NS.len() - 1], 1, "10 s itself");
        assert_eq!(h.counts[LATENCY_BOUNDS_NS.len()], 2, "above 10 s");
        assert_eq!(h.count(), 6);
        let mut t = h;
        t.add(&h);
        assert_eq!(t.count(), 12);
        assert_eq!(t.sum_ns, 2 * h.sum_ns);
        assert!(LATENCY_BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
    }

    const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 1, 0xa]);
    const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 1, 0xb]);
    const IP_A: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
    const IP_B: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);

    fn pair() -> (Dataplane, Dataplane) {
        let (la, lb) = MemLink::pair(&MemLinkConfig::default(), MAC_A, MAC_B);
        let cfg = |ip, mac| {
            let mut c = Config::single("mem:runner", ip, mac);
            c.idle.spin = 200;
            c.idle.sleep_us = 20;
            c
        };
        let a = Dataplane::open_with_link(&cfg(IP_A, MAC_A), la, DriveMode::Threads).unwrap();
        let b = Dataplane::open_with_link(&cfg(IP_B, MAC_B), lb, DriveMode::Threads).unwrap();
        (a, b)
    }

    /// Both sides of a round: two dataplanes on memory links, the
    /// client's resources for `sc` and the server's for the same spec but
    /// for the role, connected on `port` with `ord` Reads in flight.
    struct Sides {
        a: Dataplane,
        b: Dataplane,
        rc: Resources,
        rs: Resources,
        ss: RunSpec,
    }

    fn connected(sc: &RunSpec, port: u16, ord: u16) -> Sides {
        let (a, b) = pair();
        let ss = RunSpec {
            role: Role::Server,
            ..sc.clone()
        };
        let rc = Resources::new(&a, sc).unwrap();
        let rs = Resources::new(&b, &ss).unwrap();
        connect_direct(&a, &rc, &b, &rs, SocketAddrV4::new(IP_B, port), ord).unwrap();
        Sides { a, b, rc, rs, ss }
    }

    fn spec(test: TestKind, role: Role, size: usize, iterations: u64, qps: usize) -> RunSpec {
        let lat = test.is_latency();
        RunSpec {
            test,
            role,
            size,
            iterations,
            duration: None,
            qps,
            tx_depth: if lat { 1 } else { 128 },
            rx_depth: if test.is_send() {
                512.min(iterations as u32)
            } else {
                1
            },
            outstanding_reads: 16,
            verify: true,
            all_sizes: false,
            busy_poll: false,
        }
    }

    fn round(
        test: TestKind,
        size: usize,
        iterations: u64,
        qps: usize,
        port: u16,
    ) -> (RunResult, RunResult) {
        round_with(spec(test, Role::Client, size, iterations, qps), port)
    }

    /// A round with the client's `sc` (the server's is the same but for
    /// the role).
    fn round_with(sc: RunSpec, port: u16) -> (RunResult, RunResult) {
        let qps = sc.qps;
        let Sides { a, b, rc, rs, ss } = connected(&sc, port, 16);
        let remote_of_server: Vec<RemoteBuf> = (0..qps).map(|i| rs.local_buf(i)).collect();
        let remote_of_client: Vec<RemoteBuf> = (0..qps).map(|i| rc.local_buf(i)).collect();
        let (c, s) = std::thread::scope(|sc_| {
            let server = sc_.spawn(|| rs.run(&b, &ss, &remote_of_client, &mut |_| {}));
            let client = rc.run(&a, &sc, &remote_of_server, &mut |_| {});
            (client, server.join().unwrap())
        });
        let (c, s) = (c.unwrap(), s.unwrap());
        rc.close(&a);
        rs.close(&b);
        (c, s)
    }

    #[test]
    fn the_steady_figure_leaves_out_a_quarter_at_each_end() {
        // 4 s of 1 MB messages: 100 in the first second (a cold start),
        // then 1000 a second; a sample every 100 ms.
        let samples: Vec<(Duration, u64)> = (0..=40u64)
            .map(|i| {
                let n = if i <= 10 {
                    10 * i
                } else {
                    100 + 100 * (i - 10)
                };
                (Duration::from_millis(100 * i), n)
            })
            .collect();
        let size = 1 << 20;
        let four = Duration::from_secs(4);
        let r = bw_result(size, &samples, Some(four), 0);
        // From 1 s to 3 s: 2000 messages in 2 s.
        let steady = r.bw_steady_mbps.expect("a duration run");
        assert!((steady - 1000.0).abs() < 1e-6, "{r:?}");
        assert!((r.bw_avg_mbps - 775.0).abs() < 1e-6, "{r:?}");
        // Between samples, interpolated: a window of 0.25 s to 0.75 s in a
        // 1 s run (the first second's 100 a second).
        let one = Duration::from_secs(1);
        let r = bw_result(size, &samples[..=10], Some(one), 0);
        assert!((r.bw_steady_mbps.unwrap() - 100.0).abs() < 1e-6, "{r:?}");
        // No samples past the window's end, or iteration mode: none.
        assert_eq!(
            bw_result(size, &samples[..=1], Some(four), 0).bw_steady_mbps,
            None
        );
        assert_eq!(bw_result(size, &samples, None, 0).bw_steady_mbps, None);
    }

    #[test]
    fn write_bw_verified_over_memory_links() {
        let (c, s) = round(TestKind::WriteBw, 1000, 300, 2, 5001);
        assert_eq!(c.iterations, 600);
        assert_eq!(c.bytes, 600_000);
        // Both QPs' four slots of 1000 bytes (step 1024), read back.
        assert_eq!(c.verified_bytes, 2 * 4 * 1000);
        assert!(c.bw_avg_mbps > 0.0 && c.bw_peak_mbps >= c.bw_avg_mbps * 0.99);
        assert_eq!(s.iterations, 0);
    }

    #[test]
    fn read_bw_verified_over_memory_links() {
        let (c, _) = round(TestKind::ReadBw, 8192, 200, 1, 5002);
        assert_eq!(c.iterations, 200);
        assert_eq!(c.verified_bytes, 8192);
    }

    #[test]
    fn send_bw_with_credits_verified_over_memory_links() {
        // More messages than receives: the credits must flow.
        let (c, s) = round(TestKind::SendBw, 300, 2000, 1, 5003);
        assert_eq!(c.iterations, 2000);
        assert_eq!(s.iterations, 2000);
        // The final contents of each of the twelve receive slots (300
        // bytes, step 320, in 4096), compared after the loop.
        assert_eq!(s.verified_bytes, 12 * 300);
    }

    /// A send-bw receiver's check after the loop finds bytes that are not
    /// the sender's pattern: here a sender that never wrote its pattern.
    #[test]
    fn send_bw_check_finds_wrong_bytes() {
        for (size, port) in [(300, 5012), (65536, 5013)] {
            let sc = spec(TestKind::SendBw, Role::Client, size, 40, 1);
            let Sides { a, b, rc, rs, ss } = connected(&sc, port, 0);
            let to_s = [rs.local_buf(0)];
            let to_c = [rc.local_buf(0)];
            let blind = RunSpec {
                verify: false,
                ..sc.clone()
            };
            let (c, s) = std::thread::scope(|t| {
                let server = t.spawn(|| rs.run(&b, &ss, &to_c, &mut |_| {}));
                let c = rc.run(&a, &blind, &to_s, &mut |_| {});
                (c, server.join().unwrap())
            });
            assert_eq!(c.unwrap().iterations, 40);
            match s {
                Err(ToolError::DataMismatch(m)) => assert!(m.contains("received Send"), "{m}"),
                other => panic!("size {size}: expected a data mismatch, got {other:?}"),
            }
            rc.close(&a);
            rs.close(&b);
        }
    }

    /// More QPs than a turn looks at again, each with two receives and
    /// many more Sends: most are held back by credits at any time, and
    /// every one's credits still flow (each QP has a credit update in
    /// flight on the server side, not a few for all).
    #[test]
    fn send_bw_with_credits_on_many_qps() {
        let qps = 3 * HELD_PER_TURN;
        let mut sc = spec(TestKind::SendBw, Role::Client, 512, 12, qps);
        sc.tx_depth = 4;
        sc.rx_depth = 2;
        let (c, s) = round_with(sc, 5011);
        assert_eq!(c.iterations, 12 * qps as u64);
        assert_eq!(s.iterations, 12 * qps as u64);
        // Each QP's eight receive slots of 512 bytes.
        assert_eq!(s.verified_bytes, 8 * qps as u64 * 512);
    }

    #[test]
    fn send_bw_for_a_duration_on_two_qps() {
        let mut sc = spec(TestKind::SendBw, Role::Client, 4096, 0, 2);
        sc.duration = Some(Duration::from_millis(300));
        sc.rx_depth = 64;
        // Completions every 16 Sends: counts close to what was sent.
        sc.tx_depth = 16;
        let Sides { a, b, rc, rs, ss } = connected(&sc, 5007, 0);
        let to_s: Vec<RemoteBuf> = (0..2).map(|i| rs.local_buf(i)).collect();
        let to_c: Vec<RemoteBuf> = (0..2).map(|i| rc.local_buf(i)).collect();
        // Each side advertises its credit words, not its data buffer.
        assert_eq!(to_c[1].addr, to_c[0].addr + 4);
        let mut calls = 0;
        let (c, s) = std::thread::scope(|t| {
            let server = t.spawn(|| rs.run(&b, &ss, &to_c, &mut |_| {}));
            let c = rc.run(&a, &sc, &to_s, &mut |_| calls += 1);
            (c.unwrap(), server.join().unwrap().unwrap())
        });
        assert!(c.iterations > 0, "{c:?}");
        // The server wrote its receive counts into both of the client's
        // credit words (every 21 receives of 64).
        for i in 0..2 {
            assert!(
                rc.credit_word(2 + i) >= 21,
                "QP {i}: {}",
                rc.credit_word(2 + i)
            );
        }
        assert!(c.elapsed >= Duration::from_millis(300));
        // A duration run has its middle-half figure, and the iteration
        // runs above have none.
        assert!(c.bw_steady_mbps.is_some_and(|b| b > 0.0), "{c:?}");
        assert!(
            // One 4 KiB receive slot a QP, its final contents compared.
            s.iterations > 0 && s.verified_bytes == 2 * 4096,
            "{s:?}"
        );
        let _ = calls;
        rc.close(&a);
        rs.close(&b);
    }

    #[test]
    fn write_lat_verified_over_memory_links() {
        let (c, s) = round(TestKind::WriteLat, 100, 200, 1, 5004);
        assert_eq!(c.verified_bytes, 200 * 100);
        assert_eq!(s.verified_bytes, 200 * 100);
        let l = c.latency.unwrap();
        assert!(l.min_us > 0.0 && l.min_us <= l.p50_us && l.p50_us <= l.max_us);
        assert_eq!(c.iterations, 199);
    }

    #[test]
    fn send_lat_verified_over_memory_links() {
        let (c, s) = round(TestKind::SendLat, 64, 300, 1, 5005);
        assert_eq!(c.verified_bytes, 300 * 64);
        assert_eq!(s.verified_bytes, 300 * 64);
        assert!(c.latency.is_some() && s.latency.is_some());
    }

    #[test]
    fn read_lat_verified_over_memory_links() {
        let (c, s) = round(TestKind::ReadLat, 32, 150, 1, 5006);
        assert_eq!(c.verified_bytes, 150 * 32);
        assert_eq!(c.iterations, 150);
        assert!(c.latency.unwrap().p99_us > 0.0);
        assert_eq!(s.verified_bytes, 0);
    }

    #[test]
    fn cq_moderation_follows_perftest() {
        assert_eq!(
            cq_moderation(65_536, false, 128),
            1,
            "over 8 KiB: every one"
        );
        assert_eq!(cq_moderation(8192, false, 128), 100);
        assert_eq!(cq_moderation(65_536, true, 128), 100, "-a keeps 100");
        assert_eq!(cq_moderation(4096, false, 20), 20, "at most tx depth");
        assert_eq!(cq_moderation(4096, false, 0), 1);
    }

    /// A run of a few large messages reports bytes while its first message
    /// is still in flight: the byte counts grow from report to report
    /// while no message has completed, and never pass what the run moves
    /// by more than its framing.
    #[test]
    fn progress_counts_bytes_before_the_first_message_completes() {
        let size = 32 << 20;
        let mut sc = spec(TestKind::WriteBw, Role::Client, size, 5, 1);
        sc.verify = false;
        sc.tx_depth = 5;
        let Sides { a, b, rc, rs, .. } = connected(&sc, 5010, 0);
        let to_s: Vec<RemoteBuf> = (0..1).map(|i| rs.local_buf(i)).collect();
        let mut seen: Vec<Progress> = Vec::new();
        let c = rc.run(&a, &sc, &to_s, &mut |p| seen.push(*p)).unwrap();
        assert_eq!(c.iterations, 5);
        for p in &seen {
            println!(
                "{:.2} s: {} of {} messages, {} of {} bytes",
                p.elapsed.as_secs_f64(),
                p.done,
                p.total,
                p.bytes,
                p.total_bytes
            );
        }
        let total = 5 * size as u64;
        assert!(seen.iter().all(|p| p.total == 5 && p.total_bytes == total));
        assert!(seen.iter().all(|p| p.duration.is_none()));
        assert!(seen.windows(2).all(|w| w[0].bytes <= w[1].bytes));
        // Framing (MPA, DDP, RDMAP headers and CRCs) is a few percent.
        assert!(seen.iter().all(|p| p.bytes <= total + total / 20));
        let early: Vec<&Progress> = seen.iter().filter(|p| p.done == 0 && p.bytes > 0).collect();
        assert!(
            !early.is_empty(),
            "no report counted bytes before the first completion: {seen:?}"
        );
        assert!(
            seen.iter().any(|p| p.done < 5 && p.bytes > early[0].bytes),
            "the byte count did not grow while messages were in flight: {seen:?}"
        );
        rc.close(&a);
        rs.close(&b);
    }

    /// The read-back that verifies a write-bw round reports no progress
    /// of its own: the message count a round shows never goes down.
    #[test]
    fn verification_adds_no_progress_lines() {
        let size = 8 << 20;
        let sc = spec(TestKind::WriteBw, Role::Client, size, 8, 1);
        let Sides { a, b, rc, rs, .. } = connected(&sc, 5011, 16);
        let to_s: Vec<RemoteBuf> = (0..1).map(|i| rs.local_buf(i)).collect();
        let mut seen: Vec<(u64, Duration)> = Vec::new();
        let c = rc
            .run(&a, &sc, &to_s, &mut |p| seen.push((p.done, p.elapsed)))
            .unwrap();
        assert_eq!(c.iterations, 8);
        // Every slot the round wrote, read back and compared.
        assert_eq!(c.verified_bytes, slots(size).min(8) * size as u64);
        assert!(!seen.is_empty(), "no progress at all");
        assert!(
            seen.windows(2).all(|w| w[0].0 <= w[1].0),
            "the message count went down: {seen:?}"
        );
        rc.close(&a);
        rs.close(&b);
    }

    #[test]
    fn specs_refused_before_any_work() {
        let (a, _b) = pair();
        let mut s = spec(TestKind::WriteLat, Role::Client, 8, 10, 2);
        assert!(matches!(Resources::new(&a, &s), Err(ToolError::Usage(_))));
        s.qps = 1;
        s.size = 0;
        assert!(matches!(Resources::new(&a, &s), Err(ToolError::Usage(_))));
        s.size = 8;
        s.all_sizes = true;
        assert!(matches!(Resources::new(&a, &s), Err(ToolError::Usage(_))));
    }
}
