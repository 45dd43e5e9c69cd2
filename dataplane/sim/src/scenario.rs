//! A random mix of RDMA WRITE, READ and SEND between two real dataplanes,
//! drawn from one seed, and the checks every run makes: every byte of
//! every region as expected (what landed and what must not have changed),
//! every signalled work request completed exactly once and in order,
//! every receive completed with its length, and at the end, after both
//! sides closed, no region still pinned by a queue, a frame or a
//! registration.

use core::time::Duration;
use std::collections::VecDeque;

use dataplane::api::{
    Access, CmEvent, ConnectParams, Cq, MemoryRegistration, Qp, QpOptions, RecvWr, Region,
    SendFlags, SendWr, SgeList, WcOpcode, WcStatus,
};
use dataplane::config::{MpaConfig, TcpConfig};
use dataplane::Dataplane;
use rdmap::mpa::CrcPolicy;
use tcp_sim::{LinkConfig, Rng};

use crate::world::{World, WorldSpec, PORT};

/// The largest message a scenario moves.
pub const MAX_LEN: usize = 4 << 20;

/// Bytes one scenario moves at most, all operations together.
const MAX_TOTAL: usize = 10 << 20;

/// Each side's source region: room for the largest message at any offset
/// up to a page.
const OUT_LEN: usize = MAX_LEN + 4096;

/// Virtual time a scenario may take before it counts as stuck.
const PATIENCE: Duration = Duration::from_secs(600);

/// An RDMA operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The initiator's bytes into the peer's region.
    Write,
    /// The peer's bytes into the initiator's region.
    Read,
    /// The initiator's bytes into a receive the peer posted.
    Send,
}

/// One operation of a scenario.
#[derive(Debug, Clone)]
pub struct OpSpec {
    /// Which connection carries it.
    pub conn: usize,
    /// The side that posts it (0: A, 1: B).
    pub from: usize,
    /// What it is.
    pub op: Op,
    /// Bytes moved.
    pub len: usize,
    /// Where the bytes come from in the source side's source region.
    pub src_off: usize,
    /// Where they land in the sink side's sink region.
    pub dst_off: usize,
    /// Whether it asks for a completion.
    pub signaled: bool,
    /// When it is posted, after both ends are established.
    pub at: Duration,
}

impl OpSpec {
    /// The side whose sink region the bytes land in.
    pub fn sink(&self) -> usize {
        match self.op {
            Op::Read => self.from,
            Op::Write | Op::Send => 1 - self.from,
        }
    }

    /// The side whose source region the bytes come from.
    pub fn source(&self) -> usize {
        1 - self.sink()
    }
}

/// A whole run: the two dataplanes, the link, the connections and the
/// operations.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The dataplanes and the link.
    pub world: WorldSpec,
    /// Connections between them, each with a queue pair per side.
    pub conns: usize,
    /// The operations, in posting order.
    pub ops: Vec<OpSpec>,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Bytes of the regions compared with what they must hold.
    pub bytes_verified: u64,
    /// Bytes the operations moved.
    pub bytes_moved: u64,
    /// Work completions checked (sends and receives).
    pub completions: u64,
    /// Virtual time from start to the last completion.
    pub virtual_time: Duration,
    /// Frames offered to the link, both directions.
    pub frames: u64,
    /// Frames the link dropped, both directions.
    pub dropped: u64,
    /// Retransmissions of both sides' workers.
    pub retransmits: u64,
    /// A digest of everything above and of the link's counters: equal for
    /// two runs of the same seed.
    pub digest: u64,
}

fn draw_len(r: &mut Rng) -> usize {
    let (lo, hi) = match r.below(100) {
        0..=29 => (0, 64),
        30..=59 => (65, 4096),
        60..=84 => (4097, 256 << 10),
        85..=94 => ((256 << 10) + 1, 1 << 20),
        _ => ((1 << 20) + 1, MAX_LEN as u64),
    };
    r.range_inclusive(lo, hi) as usize
}

fn draw_crc(r: &mut Rng) -> CrcPolicy {
    match r.below(3) {
        0 => CrcPolicy::Off,
        1 => CrcPolicy::Requested,
        _ => CrcPolicy::Required,
    }
}

impl Scenario {
    /// The scenario of `seed`.
    pub fn from_seed(seed: u64) -> Scenario {
        let mut r = Rng::new(seed);
        let mut world = WorldSpec::new(seed);
        world.workers = [1 + r.below(2) as usize, 1 + r.below(2) as usize];
        world.mtu = [1500, 1500, 9000, 1280][r.below(4) as usize];
        let full = r.chance(0.5);
        world.tcp = TcpConfig {
            sack: full,
            timestamps: full,
            ..TcpConfig::default()
        };
        let mut crc = [draw_crc(&mut r), draw_crc(&mut r)];
        for i in 0..2 {
            // Required against Off is a refusal by design, not a transfer.
            if crc[i] == CrcPolicy::Required && crc[1 - i] == CrcPolicy::Off {
                crc[1 - i] = CrcPolicy::Requested;
            }
        }
        for (side, policy) in crc.into_iter().enumerate() {
            world.mpa[side] = MpaConfig {
                crc: policy,
                markers: r.chance(0.3),
                ..MpaConfig::default()
            };
        }
        let loss = [0.0, 0.0, 0.002, 0.01, 0.03][r.below(5) as usize];
        let mut link = LinkConfig::perfect()
            .with_latency(Duration::from_micros(r.range_inclusive(5, 200)))
            .with_jitter(Duration::from_micros(r.below(40)))
            .with_loss(loss);
        if r.chance(0.5) {
            link = link.with_reorder(loss.max(0.005), Duration::from_micros(300));
        }
        if r.chance(0.4) {
            link = link.with_duplicate(loss.max(0.005));
        }
        if r.chance(0.4) {
            link = link.with_corrupt(loss.max(0.002) / 2.0);
        }
        match r.below(3) {
            0 => {}
            1 => {
                link = link
                    .with_bandwidth(1_000_000_000)
                    .with_queue_limit(r.range_inclusive(64 << 10, 1 << 20) as usize)
            }
            _ => {
                link = link
                    .with_bandwidth(10_000_000_000)
                    .with_queue_limit(r.range_inclusive(256 << 10, 4 << 20) as usize)
            }
        }
        world.link = link;
        world.static_arp = r.chance(0.5);
        // From the seed, not the generator, so that the rest of the
        // scenario stays as it was: every mix of copying and attaching
        // ports.
        world.copy_tx = [seed % 2 == 1, seed % 4 >= 2];
        if r.chance(0.2) {
            world.tx_burst_max = r.range_inclusive(1, 4) as usize;
        }
        let conns = 1 + r.below(2) as usize;
        let n = 2 + r.below(10) as usize;
        let mut ops = Vec::with_capacity(n);
        let mut sink_used = [0usize; 2];
        let mut total = 0;
        for _ in 0..n {
            let op = [Op::Write, Op::Read, Op::Send][r.below(3) as usize];
            let mut len = draw_len(&mut r);
            if total + len > MAX_TOTAL {
                len = r.below(4097) as usize;
            }
            total += len;
            let mut spec = OpSpec {
                conn: r.below(conns as u64) as usize,
                from: r.below(2) as usize,
                op,
                len,
                src_off: r.below((OUT_LEN - len) as u64 + 1) as usize,
                dst_off: 0,
                signaled: r.chance(0.7),
                at: Duration::from_micros(r.below(3000)),
            };
            // Sinks do not overlap, a few bytes apart so that odd offsets
            // come up.
            let sink = spec.sink();
            spec.dst_off = sink_used[sink] + r.below(8) as usize;
            sink_used[sink] = spec.dst_off + len;
            ops.push(spec);
        }
        ops.sort_by_key(|o| o.at);
        // The last request of each send queue is signalled: its completion
        // says the queue is done.
        for conn in 0..conns {
            for from in 0..2 {
                if let Some(o) = ops
                    .iter_mut()
                    .rev()
                    .find(|o| o.conn == conn && o.from == from)
                {
                    o.signaled = true;
                }
            }
        }
        Scenario { world, conns, ops }
    }

    /// Runs the scenario.
    ///
    /// # Errors
    /// The first check that failed, with what was expected and found.
    pub fn run(&self) -> Result<Outcome, String> {
        let mut world = World::new(&self.world)?;
        let sources = [
            pattern(self.world.seed ^ 0x5eed, OUT_LEN),
            pattern(self.world.seed ^ (0x5eed << 1), OUT_LEN),
        ];
        let mut sides = [
            Side::new(world.dp(0), self, 0, &sources)?,
            Side::new(world.dp(1), self, 1, &sources)?,
        ];
        world
            .dp(1)
            .listen(PORT, 16)
            .map_err(|e| format!("listen: {e}"))?;
        for conn in 0..self.conns {
            let params = ConnectParams::default();
            world.connect([&sides[0].qps[conn], &sides[1].qps[conn]], &params)?;
        }
        let start = world.now();
        let mut next = 0;
        let mut completions = 0u64;
        world.run_until("every completion", PATIENCE, |a, b, now| {
            let dps = [a, b];
            while let Some(o) = self.ops.get(next) {
                if now < start + o.at {
                    break;
                }
                let [x, y] = &mut sides;
                let (me, peer) = if o.from == 0 { (x, &*y) } else { (y, &*x) };
                me.post(o, next, peer)?;
                next += 1;
            }
            for (i, s) in sides.iter_mut().enumerate() {
                completions += s.reap(i)?;
                while let Some(e) = dps[i].poll_event() {
                    match e {
                        CmEvent::MrDeregistered(_) => {}
                        other => return Err(format!("side {i} during the transfers: {other:?}")),
                    }
                }
            }
            Ok(next == self.ops.len() && sides.iter().all(Side::done))
        })?;
        let virtual_time = world.now() - start;
        let mut bytes_verified = 0;
        for (i, s) in sides.iter().enumerate() {
            bytes_verified += s.verify(i)?;
        }
        let stats: u64 = (0..2)
            .flat_map(|i| world.dp(i).stats())
            .map(|w| w.retransmits)
            .sum();
        close(&mut world, &sides)?;
        let link = world.link();
        let (f, b) = (
            *world.net().link_stats(link.forward),
            *world.net().link_stats(link.backward),
        );
        for (i, s) in sides.iter_mut().enumerate() {
            s.release(world.dp(i), i)?;
        }
        let [a, b_side] = sides;
        a.give_back(&mut world, 0)?;
        b_side.give_back(&mut world, 1)?;
        let mut out = Outcome {
            bytes_verified,
            bytes_moved: self.ops.iter().map(|o| o.len as u64).sum(),
            completions,
            virtual_time,
            frames: f.sent + b.sent,
            dropped: f.dropped() + b.dropped(),
            retransmits: stats,
            digest: 0,
        };
        let mut h = Fnv::new();
        for v in [
            out.bytes_verified,
            out.completions,
            u64::try_from(virtual_time.as_micros()).unwrap_or(u64::MAX),
            out.retransmits,
            f.sent,
            f.sent_bytes,
            f.delivered,
            f.dropped(),
            b.sent,
            b.sent_bytes,
            b.delivered,
            b.dropped(),
        ] {
            h.add(v);
        }
        out.digest = h.0;
        Ok(out)
    }
}

/// Disconnects every connection from side A and waits until both sides
/// report every queue pair's end.
fn close(world: &mut World, sides: &[Side; 2]) -> Result<(), String> {
    for qp in &sides[0].qps {
        world
            .dp(0)
            .disconnect(qp, false)
            .map_err(|e| format!("disconnect: {e}"))?;
    }
    let want = sides[0].qps.len();
    let mut ended = [0usize; 2];
    world.run_until("both sides disconnected", PATIENCE, |a, b, _| {
        for (i, dp) in [a, b].into_iter().enumerate() {
            while let Some(e) = dp.poll_event() {
                match e {
                    CmEvent::Disconnected { .. } => ended[i] += 1,
                    CmEvent::MrDeregistered(_) => {}
                    other => return Err(format!("side {i} while closing: {other:?}")),
                }
            }
        }
        Ok(ended[0] == want && ended[1] == want)
    })
}

/// One side's objects and what it expects.
struct Side {
    source: Region,
    sink: Region,
    source_mr: Option<MemoryRegistration>,
    sink_mr: Option<MemoryRegistration>,
    cq: Option<Cq>,
    qps: Vec<Qp>,
    /// Per connection: signalled send requests in posting order.
    sends: Vec<VecDeque<u64>>,
    /// Per connection: receives in posting order, with their lengths.
    recvs: Vec<VecDeque<(u64, u32)>>,
    /// What the sink region must hold at the end.
    sink_image: Vec<u8>,
    /// What the source region holds (and must still hold).
    source_image: Vec<u8>,
}

const RECV_BIT: u64 = 1 << 63;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = vec![0u8; len];
    r.fill_bytes(&mut v);
    v
}

impl Side {
    /// Side `side`'s objects; `sources` are both sides' source images.
    fn new(
        dp: &Dataplane,
        s: &Scenario,
        side: usize,
        sources: &[Vec<u8>; 2],
    ) -> Result<Side, String> {
        let err = |what: &str, e: dataplane::api::Error| format!("side {side}: {what}: {e}");
        let sink_len = s
            .ops
            .iter()
            .filter(|o| o.sink() == side)
            .map(|o| o.dst_off + o.len)
            .max()
            .unwrap_or(0)
            .max(1);
        let source_image = sources[side].clone();
        // The sink starts as a pattern too, so that bytes written where
        // none should land show.
        let sink_image = pattern(!s.world.seed ^ (0xacc << side), sink_len);
        let source = Region::from_vec(source_image.clone()).map_err(|e| format!("{e}"))?;
        let sink = Region::from_vec(sink_image.clone()).map_err(|e| format!("{e}"))?;
        let pd = dp.alloc_pd().map_err(|e| err("alloc_pd", e))?;
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let source_mr = dp
            .reg_mr(pd, &source, 0, OUT_LEN, rw)
            .map_err(|e| err("reg_mr", e))?;
        let sink_mr = dp
            .reg_mr(pd, &sink, 0, sink_len, rw)
            .map_err(|e| err("reg_mr", e))?;
        let cq = dp.create_cq(4096).map_err(|e| err("create_cq", e))?;
        let mut qps = Vec::new();
        let mut recvs = Vec::new();
        for conn in 0..s.conns {
            let qp = dp
                .create_qp(pd, &cq, &cq, QpOptions::default())
                .map_err(|e| err("create_qp", e))?;
            // Every receive a Send will need is posted before connecting.
            let mut want = VecDeque::new();
            for (i, o) in s.ops.iter().enumerate() {
                if o.op == Op::Send && o.conn == conn && o.sink() == side {
                    let id = RECV_BIT | i as u64;
                    let wr = RecvWr {
                        wr_id: id,
                        sges: SgeList::single(sink_mr.sge(o.dst_off as u64, o.len as u32)),
                    };
                    qp.post_recv(&wr)
                        .map_err(|e| format!("side {side}: post_recv: {e:?}"))?;
                    want.push_back((id, o.len as u32));
                }
            }
            recvs.push(want);
            qps.push(qp);
        }
        let mut img = sink_image;
        for o in s.ops.iter().filter(|o| o.sink() == side) {
            let src = &sources[o.source()];
            img[o.dst_off..o.dst_off + o.len].copy_from_slice(&src[o.src_off..o.src_off + o.len]);
        }
        Ok(Side {
            source,
            sink,
            source_mr: Some(source_mr),
            sink_mr: Some(sink_mr),
            cq: Some(cq),
            sends: vec![VecDeque::new(); s.conns],
            recvs,
            qps,
            sink_image: img,
            source_image,
        })
    }

    fn post(&mut self, o: &OpSpec, index: usize, peer: &Side) -> Result<(), String> {
        let id = index as u64;
        let (Some(src), Some(dst), Some(peer_src), Some(peer_dst)) = (
            &self.source_mr,
            &self.sink_mr,
            &peer.source_mr,
            &peer.sink_mr,
        ) else {
            return Err("registrations gone".into());
        };
        let len = o.len as u32;
        let wr = match o.op {
            Op::Write => SendWr::write(
                id,
                SgeList::single(src.sge(o.src_off as u64, len)),
                peer_dst.addr() + o.dst_off as u64,
                peer_dst.rkey(),
            ),
            Op::Read => SendWr::read(
                id,
                dst.sge(o.dst_off as u64, len),
                peer_src.addr() + o.src_off as u64,
                peer_src.rkey(),
            ),
            Op::Send => SendWr::send(id, SgeList::single(src.sge(o.src_off as u64, len))),
        };
        let wr = if o.signaled {
            wr
        } else {
            wr.with_flags(SendFlags::NONE)
        };
        self.qps[o.conn]
            .post_send(&wr)
            .map_err(|e| format!("post_send of op {index} ({o:?}): {e:?}"))?;
        if o.signaled {
            self.sends[o.conn].push_back(id);
        }
        Ok(())
    }

    /// Checks every completion waiting; returns how many.
    fn reap(&mut self, side: usize) -> Result<u64, String> {
        let Some(cq) = &self.cq else { return Ok(0) };
        let mut n = 0;
        while let Some(wc) = cq.poll_one() {
            n += 1;
            if wc.status != WcStatus::Success {
                return Err(format!("side {side}: {wc:?}"));
            }
            let conn = self
                .qps
                .iter()
                .position(|q| q.num() == wc.qp_num)
                .ok_or_else(|| format!("side {side}: completion of an unknown QP: {wc:?}"))?;
            if wc.opcode == WcOpcode::Recv {
                let want = self.recvs[conn].pop_front();
                if want != Some((wc.wr_id, wc.byte_len)) {
                    return Err(format!(
                        "side {side}, connection {conn}: receive {want:?} expected, got {wc:?}"
                    ));
                }
            } else {
                let want = self.sends[conn].pop_front();
                if want != Some(wc.wr_id) {
                    return Err(format!(
                        "side {side}, connection {conn}: completion of request {want:?} \
                         expected (each signalled request once, in order), got {wc:?}"
                    ));
                }
            }
        }
        Ok(n)
    }

    fn done(&self) -> bool {
        self.sends.iter().all(VecDeque::is_empty) && self.recvs.iter().all(VecDeque::is_empty)
    }

    /// Compares both regions with what they must hold; returns the bytes
    /// compared.
    fn verify(&self, side: usize) -> Result<u64, String> {
        for (name, region, want) in [
            ("sink", &self.sink, &self.sink_image),
            ("source", &self.source, &self.source_image),
        ] {
            let got = region
                .to_vec(0, want.len())
                .map_err(|e| format!("side {side}: {e}"))?;
            if let Some(at) = got.iter().zip(want.iter()).position(|(g, w)| g != w) {
                return Err(format!(
                    "side {side}: {name} region differs at byte {at} of {}: {:#04x}, expected {:#04x}",
                    want.len(),
                    got[at],
                    want[at]
                ));
            }
        }
        Ok((self.sink_image.len() + self.source_image.len()) as u64)
    }

    /// Deregisters and drops every verbs object, leaving the regions.
    fn release(&mut self, dp: &Dataplane, side: usize) -> Result<(), String> {
        self.qps.clear();
        self.cq = None;
        for mr in [self.source_mr.take(), self.sink_mr.take()]
            .into_iter()
            .flatten()
        {
            dp.dereg_mr(&mr)
                .map_err(|e| format!("side {side}: dereg_mr: {e}"))?;
        }
        Ok(())
    }

    /// Gets both buffers back: nothing (queue, frame, registration) may
    /// still hold them once the workers have run a little, and no record
    /// TCP gave up may have been dropped without its pin given back.
    fn give_back(self, world: &mut World, side: usize) -> Result<(), String> {
        let leaked = dataplane::worker::fpdu_records_leaked();
        if leaked != 0 {
            return Err(format!(
                "side {side}: {leaked} records dropped without their pins given back"
            ));
        }
        for (name, mut region) in [("source", self.source), ("sink", self.sink)] {
            let mut tries = 0;
            loop {
                match region.into_inner() {
                    Ok(_) => break,
                    Err(r) if tries < 50 => {
                        region = r;
                        tries += 1;
                        world.idle(Duration::from_millis(10))?;
                    }
                    Err(_) => {
                        return Err(format!(
                            "side {side}: the {name} region is still pinned after the close"
                        ))
                    }
                }
            }
        }
        Ok(())
    }
}

/// FNV-1a over 64-bit words.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn add(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
