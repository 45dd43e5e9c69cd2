//! Shared harness of the QP engine tests: two endpoints, each with its own
//! device, memory, CQ and queue pair, over a pair of byte pipes that are cut
//! at random points, with records acknowledged after a random delay.

#![allow(dead_code, reason = "each test file uses part of the harness")]

use std::collections::VecDeque;

use rdmap::engine::{Endpoint, EngineEvent, Env, OutRecord};
use rdmap::mpa::{Config, RtrSet, RtrType};
use rdmap::placement::{Placement, RegionHandle, VecMemory};
use rdmap::verbs::{
    Access, CompletionQueue, Device, DeviceLimits, PdId, QpInitAttr, QueuePair, RegOptions, Stag,
    WorkCompletion,
};

/// A small deterministic generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x005e_ed0f_1ea5_e000)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_u64() as u8;
        }
    }
}

/// Octets before and after every registered span, filled with
/// [`CANARY`] and checked untouched at the end.
pub const GUARD: usize = 64;
pub const CANARY: u8 = 0xA5;

/// A registered buffer: `len` bytes at `GUARD` of its own region, whose
/// tagged offsets start at `va`.
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

/// One endpoint with everything it owns.
pub struct Side {
    pub name: &'static str,
    pub dev: Device,
    pub mem: VecMemory,
    pub cq: CompletionQueue,
    pub ep: Endpoint,
    pub pd: PdId,
    /// Bytes put on the stream and not yet delivered.
    pub pipe: VecDeque<u8>,
    /// Stream offset of `pipe`'s first byte.
    pub delivered: u64,
    /// Records in flight, with the step their ACK is due once delivered.
    pub unacked: VecDeque<(OutRecord, Option<u64>)>,
    pub events: Vec<EngineEvent>,
    pub completions: Vec<WorkCompletion>,
    /// Whether the driver still delivers this side's output (tests hold
    /// it back to reorder events).
    pub hold_output: bool,
    /// Whether to hand out acknowledgements.
    pub hold_acks: bool,
    /// Records' lengths and the segment size they were built for.
    pub records: u64,
    pub bufs: Vec<Buf>,
    /// When set, a copy of every record sent: (end offset, bytes).
    pub log: Option<Vec<(u64, Vec<u8>)>>,
    /// Accept connection requests as they come (else reject them).
    pub auto_accept: bool,
    /// Records whose stored payload checksum sum was checked.
    pub payload_sums: u64,
    /// A responder made with [`Endpoint::awaiting_request`]: the queue
    /// pair its acceptance hands over, with the IRD and ORD to offer.
    pub pending_qp: Option<(QueuePair, u16, u16)>,
    /// Records whose CRC this side's "driver" computed
    /// ([`OutRecord::crc_pending`]).
    pub crcs_at_transmit: u64,
}

pub fn qp_attr(pd: PdId, cq: &CompletionQueue) -> QpInitAttr {
    QpInitAttr {
        pd,
        send_cq: cq.id(),
        recv_cq: cq.id(),
        srq: None,
        max_send_wr: 128,
        max_recv_wr: 128,
        max_send_sge: 6,
        max_recv_sge: 6,
        max_ord: 16,
        max_ird: 16,
        sq_sig_all: false,
    }
}

/// Knobs of one connection.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub crc: bool,
    pub markers: bool,
    pub rtr: Option<RtrType>,
    pub ird: u16,
    pub ord: u16,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            crc: true,
            markers: false,
            rtr: None,
            ird: 4,
            ord: 4,
        }
    }
}

pub fn config(s: &Setup) -> Config {
    Config {
        crc: s.crc.into(),
        markers_wanted: s.markers,
        ird: s.ird,
        ord: s.ord,
        rtr_offer: s.rtr.map_or(RtrSet::NONE, RtrSet::only),
        rtr_accept: RtrSet::ALL,
        ..Config::default()
    }
}

impl Side {
    pub fn new(name: &'static str, seed: u64, setup: &Setup, initiator: bool) -> Side {
        Side::with_config(name, seed, config(setup), initiator)
    }

    /// [`Side::new`] with an MPA configuration of the test's own.
    pub fn with_config(name: &'static str, seed: u64, cfg: Config, initiator: bool) -> Side {
        let mut dev = Device::with_seed(
            DeviceLimits {
                max_mr: 64,
                ..DeviceLimits::default()
            },
            seed,
        );
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(1024).unwrap();
        let qp = dev.create_qp(qp_attr(pd, &cq)).unwrap();
        let ep = if initiator {
            Endpoint::initiator(cfg, b"init", qp, core::time::Duration::ZERO).unwrap()
        } else {
            Endpoint::responder(cfg, qp, core::time::Duration::ZERO).unwrap()
        };
        Side {
            name,
            dev,
            mem: VecMemory::new(),
            cq,
            ep,
            pd,
            pipe: VecDeque::new(),
            delivered: 0,
            unacked: VecDeque::new(),
            events: Vec::new(),
            completions: Vec::new(),
            hold_output: false,
            hold_acks: false,
            records: 0,
            bufs: Vec::new(),
            log: None,
            auto_accept: true,
            payload_sums: 0,
            pending_qp: None,
            crcs_at_transmit: 0,
        }
    }

    /// Registers `len` bytes (filled from `rng` if `random`, else zero)
    /// with guards of canary around them.
    pub fn buffer(&mut self, len: usize, va: u64, access: Access, random: Option<&mut Rng>) -> Buf {
        self.buffer_with(len, va, access, RegOptions::default(), random)
    }

    pub fn buffer_with(
        &mut self,
        len: usize,
        va: u64,
        access: Access,
        options: RegOptions,
        random: Option<&mut Rng>,
    ) -> Buf {
        let mut bytes = vec![CANARY; len + 2 * GUARD];
        match random {
            Some(rng) => rng.fill(&mut bytes[GUARD..GUARD + len]),
            None => bytes[GUARD..GUARD + len].fill(0),
        }
        let region = self.mem.add_region_with(bytes);
        let span = self
            .mem
            .span(region, GUARD as u64, len.max(1) as u64)
            .unwrap();
        let stag = self
            .dev
            .reg_mr_with(self.pd, span, va, access, options)
            .unwrap();
        let buf = Buf {
            region,
            stag,
            va,
            len,
        };
        self.bufs.push(buf);
        buf
    }

    /// The bytes of a registered buffer.
    pub fn bytes(&self, buf: &Buf) -> &[u8] {
        &self.mem.bytes(buf.region).unwrap()[GUARD..GUARD + buf.len]
    }

    /// Asserts the guards of every buffer hold only canary.
    pub fn check_guards(&self) {
        for b in &self.bufs {
            let all = self.mem.bytes(b.region).unwrap();
            let span_end = GUARD + b.len.max(1);
            assert!(
                all[..GUARD].iter().all(|&x| x == CANARY),
                "{}: bytes before region {:?} touched",
                self.name,
                b.region
            );
            assert!(
                all[span_end..].iter().all(|&x| x == CANARY),
                "{}: bytes after region {:?} touched",
                self.name,
                b.region
            );
        }
    }

    pub fn with_env<T>(
        &mut self,
        f: impl FnOnce(&mut Endpoint, &mut Env<'_, VecMemory>) -> T,
    ) -> T {
        let mut env = Env::new(&mut self.dev, &mut self.mem, &mut self.cq);
        f(&mut self.ep, &mut env)
    }

    /// Hands out records while the window has room; records larger than
    /// the segment offered fail the test.
    pub fn transmit(&mut self, rng: &mut Rng, mss: usize, window: usize) {
        loop {
            let in_flight: usize = self.unacked.iter().map(|(r, _)| r.len()).sum();
            if in_flight + mss > window {
                break;
            }
            let seg = if rng.chance(10) {
                rng.range(64, mss)
            } else {
                mss
            };
            // Both ways of taking a record, in turn: returned, or built in
            // place.
            let r = if self.unacked.len() % 2 == 0 {
                self.with_env(|ep, env| ep.poll_record(seg, env))
            } else {
                let mut out = None;
                let got = self.with_env(|ep, env| ep.poll_record_into(seg, env, &mut out));
                assert_eq!(
                    got,
                    out.is_some(),
                    "{}: poll_record_into's answer",
                    self.name
                );
                out
            };
            let Some(r) = r else {
                break;
            };
            assert!(
                r.len() <= seg,
                "{}: record of {} octets for a {seg}-octet segment",
                self.name,
                r.len()
            );
            assert!(!r.is_empty());
            let mut bytes = r.to_vec(&self.mem);
            if r.crc_pending() {
                // The driver's part: the CRC over every octet before the
                // CRC field, the field left zero until then.
                let n = bytes.len();
                assert_eq!(
                    bytes[n - 4..],
                    [0; 4],
                    "{}: a pending CRC is zero",
                    self.name
                );
                assert_eq!(r.payload_sum(), None, "no CRC pass, no stored sum");
                let crc = rdmap::crc::append(0, &bytes[..n - 4]);
                let t = r.trailer_with(crc).expect("an FPDU");
                let t = t.as_bytes();
                bytes[n - t.len()..].copy_from_slice(t);
                self.crcs_at_transmit += 1;
            }
            // The payload's checksum sum kept from the CRC pass is the
            // sum of the payload bytes.
            if let (Some(p), Some(sum)) = (r.payload(), r.payload_sum()) {
                let mut payload = vec![0u8; p.len() as usize];
                self.mem.read(p.range(), &mut payload);
                assert_eq!(
                    sum,
                    rdmap::placement::internet_sum(&payload),
                    "{}: stored payload sum",
                    self.name
                );
                self.payload_sums += 1;
            }
            if let Some(log) = self.log.as_mut() {
                log.push((r.end_offset(), bytes.clone()));
            }
            self.pipe.extend(bytes);
            assert_eq!(
                self.delivered + self.pipe.len() as u64,
                r.end_offset(),
                "{}: record end offset",
                self.name
            );
            self.records += 1;
            self.unacked.push_back((r, None));
        }
    }

    /// Acknowledges delivered records once their delay has passed.
    pub fn acks(&mut self, rng: &mut Rng, step: u64) {
        if self.hold_acks {
            return;
        }
        for (r, due) in self.unacked.iter_mut() {
            if due.is_none() && r.end_offset() <= self.delivered {
                *due = Some(step + rng.range(0, 6) as u64);
            }
        }
        while let Some((_, Some(due))) = self.unacked.front() {
            if *due > step {
                break;
            }
            let (r, _) = self.unacked.pop_front().unwrap();
            self.with_env(|ep, env| ep.record_acked(r, env));
        }
    }

    pub fn drain(&mut self) {
        while let Some(ev) = self.ep.poll_event() {
            if ev == EngineEvent::ConnectRequest {
                if let (true, Some((qp, ird, ord))) = (self.auto_accept, self.pending_qp.take()) {
                    self.ep.accept_on(qp, ird, ord, b"resp").unwrap();
                } else if self.auto_accept {
                    self.ep.accept(b"resp").unwrap();
                } else {
                    self.ep.reject(b"no").unwrap();
                }
            }
            self.events.push(ev);
        }
        while let Some(wc) = self.cq.poll_one() {
            self.completions.push(wc);
        }
    }

    pub fn is_idle(&self) -> bool {
        self.pipe.is_empty() && self.unacked.is_empty()
    }

    /// Returns every record still held (the connection is going away).
    pub fn drop_records(&mut self) {
        while let Some((r, _)) = self.unacked.pop_front() {
            self.ep.record_dropped(r, &mut self.dev);
        }
    }

    /// Pins left on any registered buffer.
    pub fn pins(&self) -> u32 {
        self.bufs
            .iter()
            .filter_map(|b| self.dev.mrs().query_mr(b.stag))
            .map(|i| i.pins)
            .sum()
    }
}

/// Two endpoints and the pipes between them.
pub struct Pair {
    pub a: Side,
    pub b: Side,
    pub rng: Rng,
    pub step: u64,
    pub mss: usize,
    pub window: usize,
    /// Largest chunk the "TCP" hands over at once.
    pub max_chunk: usize,
}

impl Pair {
    /// `a` is the initiator, `b` the responder.
    pub fn new(seed: u64, setup: Setup, mss: usize) -> Pair {
        Pair {
            a: Side::new("initiator", seed, &setup, true),
            b: Side::new("responder", seed.wrapping_add(1), &setup, false),
            rng: Rng::new(seed),
            step: 0,
            mss,
            window: 64 * 1024,
            max_chunk: 4000,
        }
    }

    fn deliver(rng: &mut Rng, from: &mut Side, to: &mut Side, max_chunk: usize) {
        if from.hold_output || from.pipe.is_empty() {
            return;
        }
        let n = if rng.chance(20) {
            rng.range(1, 16)
        } else {
            rng.range(1, max_chunk)
        }
        .min(from.pipe.len());
        let chunk: Vec<u8> = from.pipe.drain(..n).collect();
        from.delivered += n as u64;
        to.with_env(|ep, env| ep.handle_stream(core::time::Duration::ZERO, &chunk, env));
    }

    /// One round: both sides transmit, some bytes cross each way, due
    /// acknowledgements are given, events and completions drained.
    pub fn step(&mut self) {
        self.step += 1;
        let (mss, window, max_chunk) = (self.mss, self.window, self.max_chunk);
        self.a.transmit(&mut self.rng, mss, window);
        self.b.transmit(&mut self.rng, mss, window);
        Pair::deliver(&mut self.rng, &mut self.a, &mut self.b, max_chunk);
        Pair::deliver(&mut self.rng, &mut self.b, &mut self.a, max_chunk);
        self.a.acks(&mut self.rng, self.step);
        self.b.acks(&mut self.rng, self.step);
        self.a.drain();
        self.b.drain();
    }

    /// Steps until `done` holds, at most `limit` steps.
    pub fn run_until(&mut self, limit: u64, mut done: impl FnMut(&Pair) -> bool) {
        for _ in 0..limit {
            if done(self) {
                return;
            }
            self.step();
        }
        panic!(
            "no progress after {limit} steps: initiator events {:?}, responder events {:?}, \
             completions {} / {}",
            self.a.events,
            self.b.events,
            self.a.completions.len(),
            self.b.completions.len()
        );
    }

    /// Steps until both sides are connected.
    pub fn connect(&mut self) {
        self.run_until(1000, |p| connected(&p.a.events) && connected(&p.b.events));
    }
}

pub fn connected(events: &[EngineEvent]) -> bool {
    events
        .iter()
        .any(|e| matches!(e, EngineEvent::Connected(_)))
}

pub fn terminated(events: &[EngineEvent]) -> bool {
    events
        .iter()
        .any(|e| matches!(e, EngineEvent::Terminated { .. }))
}
