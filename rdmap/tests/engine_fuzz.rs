//! Whatever a peer sends after connection setup, the QP engine never
//! panics, never writes outside the spans registered with it (the guards
//! around every span keep their canary), and either stays up or ends the
//! stream with exactly one Terminate that parses, moving the queue pair to
//! Error. Inputs: well-framed ULPDUs whose headers are built from a small
//! alphabet of plausible fields (so that placement, MSN/MO and Read Request
//! paths are reached), and raw byte streams with and without CRCs.

mod engine_common;

use core::time::Duration;

use engine_common::{Rng, CANARY, GUARD};
use proptest::prelude::*;
use rdmap::engine::{Endpoint, EngineEvent, Env, RecordKind, TerminateOrigin};
use rdmap::mpa::{Config, DeframeEvent, Deframer, Event, Framer, Negotiator, RtrSet};
use rdmap::placement::{Placement, VecMemory};
use rdmap::verbs::{
    Access, CompletionQueue, Device, DeviceLimits, QpState, RecvWr, RegOptions, Sge, SgeList, Stag,
};
use rdmap::wire::{DdpRepr, RdmapOpcode, ReadRequest, TerminateMessage};

const SPAN: usize = 512;
const VA: [u64; 3] = [0x1000, 0x2000, 0x3000];

struct World {
    dev: Device,
    mem: VecMemory,
    cq: CompletionQueue,
    ep: Endpoint,
    stags: [Stag; 3],
    framer: Framer,
    deframer: Deframer,
}

fn world(crc: bool, markers: bool) -> World {
    let mut dev = Device::new(DeviceLimits {
        max_mr: 16,
        ..DeviceLimits::default()
    });
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(512).unwrap();
    let qp = dev.create_qp(engine_common::qp_attr(pd, &cq)).unwrap();
    let mut mem = VecMemory::new();
    let lw = Access::LOCAL_WRITE;
    let rights = [
        lw | Access::REMOTE_WRITE | Access::REMOTE_READ,
        lw,
        lw | Access::REMOTE_WRITE,
    ];
    let mut stags = [Stag(0); 3];
    for i in 0..3 {
        let region = mem.add_region_with(vec![CANARY; SPAN + 2 * GUARD]);
        let span = mem.span(region, GUARD as u64, SPAN as u64).unwrap();
        stags[i] = dev
            .reg_mr_with(
                pd,
                span,
                VA[i],
                rights[i],
                RegOptions {
                    invalidatable: i == 2,
                },
            )
            .unwrap();
    }
    let cfg = Config {
        crc: crc.into(),
        markers_wanted: markers,
        ird: 2,
        ..Config::default()
    };
    let mut ep = Endpoint::responder(cfg, qp, Duration::ZERO).unwrap();
    for id in 0..4 {
        ep.qp_mut()
            .post_recv(&RecvWr {
                wr_id: id,
                sges: SgeList::single(Sge {
                    addr: VA[1] + 64 * id,
                    length: 64,
                    lkey: stags[1],
                }),
            })
            .unwrap();
    }
    let peer_cfg = Config {
        crc: crc.into(),
        rtr_offer: RtrSet::NONE,
        ..Config::default()
    };
    let mut neg = Negotiator::initiator(peer_cfg, &[], Duration::ZERO).unwrap();
    let req = neg.poll_transmit().unwrap().to_vec();
    let mut w = World {
        dev,
        mem,
        cq,
        ep,
        stags,
        framer: Framer::new(false, false),
        deframer: Deframer::new(false, false, u16::MAX),
    };
    w.feed(&req, 7);
    assert_eq!(w.ep.poll_event(), Some(EngineEvent::ConnectRequest));
    w.ep.accept(&[]).unwrap();
    let (reply, _) = w.output();
    neg.handle_input(&reply, Duration::ZERO);
    let Some(Event::Negotiated(n)) = neg.poll_event() else {
        panic!("no setup");
    };
    w.framer = Framer::from_framing(&n.framing);
    w.deframer = Deframer::new(n.framing.crc, n.framing.markers_rx, u16::MAX);
    while w.ep.poll_event().is_some() {}
    w
}

impl World {
    fn feed(&mut self, bytes: &[u8], seed: u64) {
        let mut rng = Rng::new(seed);
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = rng.range(1, 700).min(rest.len());
            let mut env = Env::new(&mut self.dev, &mut self.mem, &mut self.cq);
            self.ep.handle_stream(Duration::ZERO, &rest[..n], &mut env);
            rest = &rest[n..];
        }
    }

    fn output(&mut self) -> (Vec<u8>, Vec<u8>) {
        let (mut setup, mut fpdus) = (Vec::new(), Vec::new());
        loop {
            let mut env = Env::new(&mut self.dev, &mut self.mem, &mut self.cq);
            let Some(r) = self.ep.poll_record(1460, &mut env) else {
                break;
            };
            assert!(r.len() <= 1460);
            let bytes = r.to_vec(&self.mem);
            // An FPDU without markers is its three parts, as the walk
            // yields them.
            match r.plain_parts() {
                Some(p) => {
                    let mut whole = p.head.to_vec();
                    if let Some(range) = p.payload {
                        let mut body = vec![0; range.len() as usize];
                        self.mem.read(range, &mut body);
                        whole.extend(body);
                    }
                    whole.extend(p.trailer);
                    assert_eq!(whole, bytes, "plain parts of a {:?} record", r.kind());
                }
                None => assert!(
                    r.kind() == RecordKind::MpaFrame
                        || r.layout().is_some_and(|l| l.marker_count() > 0),
                    "an FPDU without markers has plain parts"
                ),
            }
            if r.kind() == RecordKind::MpaFrame {
                setup.extend(bytes);
            } else {
                fpdus.extend(bytes);
            }
            let mut env = Env::new(&mut self.dev, &mut self.mem, &mut self.cq);
            self.ep.record_acked(r, &mut env);
        }
        (setup, fpdus)
    }

    /// Runs the output through the peer's deframer and checks the rules.
    fn check(&mut self) {
        let (_, out) = self.output();
        let mut ulpdus = Vec::new();
        let mut cur = Vec::new();
        for ev in self.deframer.feed(&out) {
            match ev.expect("the engine's output deframes") {
                DeframeEvent::UlpduStart { .. } => cur.clear(),
                DeframeEvent::Bytes(b) => cur.extend_from_slice(b),
                DeframeEvent::UlpduEnd { crc_ok } => {
                    assert!(crc_ok);
                    ulpdus.push(cur.clone());
                }
            }
        }
        let terminates: Vec<_> = ulpdus
            .iter()
            .filter_map(|u| TerminateMessage::parse(u).ok())
            .collect();
        let mut origin = None;
        while let Some(ev) = self.ep.poll_event() {
            if let EngineEvent::Terminated { origin: o, .. } = ev {
                assert!(origin.is_none(), "one Terminated event");
                origin = Some(o);
            }
        }
        assert_eq!(origin.is_some(), self.ep.is_terminated());
        if origin == Some(TerminateOrigin::Peer) {
            assert!(terminates.is_empty(), "no Terminate answers a Terminate");
            assert_eq!(self.ep.qp().state(), QpState::Error);
        } else if self.ep.is_terminated() {
            assert_eq!(terminates.len(), 1, "one Terminate");
            assert!(
                ulpdus
                    .last()
                    .and_then(|u| TerminateMessage::parse(u).ok())
                    .is_some(),
                "nothing after the Terminate"
            );
            assert_eq!(self.ep.qp().state(), QpState::Error);
            assert_eq!(self.ep.qp().inbound_reads(), 0);
        } else {
            assert!(terminates.is_empty());
            assert_eq!(self.ep.qp().state(), QpState::Rts);
        }
        for h in 0..3u64 {
            let b = self.mem.bytes(rdmap::placement::RegionHandle(h)).unwrap();
            assert!(b[..GUARD].iter().all(|&x| x == CANARY), "below region {h}");
            assert!(
                b[GUARD + SPAN..].iter().all(|&x| x == CANARY),
                "above region {h}"
            );
        }
        // Once acknowledged, no pin is left behind.
        for s in self.stags {
            if let Some(info) = self.dev.mrs().query_mr(s) {
                assert_eq!(info.pins, 0);
            }
        }
    }
}

/// One plausible ULPDU, from generated fields. By default it follows the
/// stream's rules (the opcode's own queue, the next MSN, the running MO)
/// so that the deeper checks are reached; each field deviates now and then.
#[derive(Debug, Clone)]
struct Spec {
    opcode: u8,
    tagged_flip: bool,
    last: bool,
    version_bad: bool,
    stag_pick: u8,
    to_off: i64,
    /// `None`: the opcode's own queue.
    qn: Option<u32>,
    /// `None`: the next MSN of the queue.
    msn: Option<u32>,
    /// `None`: the running message offset.
    mo: Option<u32>,
    payload: usize,
    rr: (u8, i64, u32),
    truncate: Option<usize>,
}

/// What the generator assumes the receiver expects next.
#[derive(Debug, Default)]
struct Cursor {
    send_msn: u32,
    send_mo: u32,
    read_msn: u32,
}

fn spec() -> impl Strategy<Value = Spec> {
    let opcode = prop_oneof![
        6 => Just(0u8),
        1 => Just(1u8),
        1 => Just(2u8),
        6 => Just(3u8),
        2 => Just(4u8),
        2 => Just(5u8),
        1 => Just(6u8),
        1 => 7u8..16,
    ];
    (
        (
            opcode,
            prop::bool::weighted(0.05),
            prop::bool::weighted(0.7),
            prop::bool::weighted(0.03),
        ),
        (
            0u8..5,
            -40i64..600,
            prop::option::weighted(0.1, 0u32..4),
            prop::option::weighted(0.1, 0u32..4),
            prop::option::weighted(0.1, 0u32..300),
        ),
        (
            prop_oneof![4 => 0usize..64, 1 => 0usize..600],
            (0u8..5, -40i64..600, 0u32..700),
        ),
        prop::option::weighted(0.03, 0usize..50),
    )
        .prop_map(
            |(
                (opcode, tagged_flip, last, version_bad),
                (stag_pick, to_off, qn, msn, mo),
                (payload, rr),
                truncate,
            )| Spec {
                opcode,
                tagged_flip,
                last,
                version_bad,
                stag_pick,
                to_off,
                qn,
                msn,
                mo,
                payload,
                rr,
                truncate,
            },
        )
}

impl Spec {
    fn build(&self, stags: &[Stag; 3], cur: &mut Cursor) -> Vec<u8> {
        let pick = |p: u8| match p {
            0..=2 => (stags[p as usize].0, VA[p as usize]),
            3 => (0x00de_ad00, 0x1000),
            _ => (stags[0].0 ^ 1, VA[0]),
        };
        let (stag, base) = pick(self.stag_pick);
        let to = base.wrapping_add_signed(self.to_off);
        let op = RdmapOpcode::from_u4(self.opcode.min(7)).unwrap_or(RdmapOpcode::Send);
        let tagged = op.is_tagged() != self.tagged_flip;
        let ctrl = 0x40 | (self.opcode & 0x0f);
        let mut out;
        if tagged {
            out = vec![0x5a; 14 + self.payload];
            DdpRepr::tagged(RdmapOpcode::RdmaWrite, self.last, stag, to).emit(&mut out);
            out[1] = ctrl;
        } else {
            let is_rr = op == RdmapOpcode::ReadRequest;
            let own_qn = op.queue_number().unwrap_or(0);
            let qn = self.qn.unwrap_or(own_qn);
            let (msn, mo) = if is_rr {
                cur.read_msn += 1;
                (self.msn.unwrap_or(cur.read_msn), 0)
            } else {
                let msn = self.msn.unwrap_or(cur.send_msn + 1);
                let mo = self.mo.unwrap_or(cur.send_mo);
                if self.last {
                    cur.send_msn += 1;
                    cur.send_mo = 0;
                } else {
                    cur.send_mo += self.payload as u32;
                }
                (msn, mo)
            };
            let payload = if is_rr { 28 } else { self.payload };
            out = vec![0x3c; 18 + payload];
            let inv = op.carries_invalidate_stag().then_some(stag);
            DdpRepr::Untagged {
                opcode: RdmapOpcode::Send,
                last: self.last || is_rr,
                qn: 0,
                msn,
                mo,
                inv_stag: inv,
            }
            .emit(&mut out);
            out[0] &= !0x80;
            out[1] = ctrl;
            out[6..10].copy_from_slice(&qn.to_be_bytes());
            if is_rr {
                let (s, b) = pick(self.rr.0);
                ReadRequest {
                    sink_stag: 0x77_0000,
                    sink_to: 0,
                    size: self.rr.2,
                    source_stag: s,
                    source_to: b.wrapping_add_signed(self.rr.1),
                }
                .emit(&mut out[18..]);
            }
        }
        if self.version_bad {
            out[0] ^= 0x03;
        }
        if let Some(t) = self.truncate {
            out.truncate(t);
        }
        out
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn framed_ulpdus_never_escape(specs in prop::collection::vec(spec(), 1..12), seed in any::<u64>(), crc in any::<bool>(), markers in any::<bool>()) {
        let mut w = world(crc, markers);
        let mut wire = Vec::new();
        let mut cur = Cursor::default();
        for s in &specs {
            let u = s.build(&w.stags, &mut cur);
            wire.extend(w.framer.build_fpdu(&u, &[]).unwrap());
        }
        w.feed(&wire, seed);
        w.check();
    }

    #[test]
    fn raw_bytes_never_escape(bytes in prop::collection::vec(any::<u8>(), 0..3000), seed in any::<u64>(), crc in any::<bool>()) {
        let mut w = world(crc, false);
        w.feed(&bytes, seed);
        w.check();
    }

    #[test]
    fn corrupted_valid_stream_never_escapes(
        specs in prop::collection::vec(spec(), 1..8),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
        seed in any::<u64>(),
    ) {
        let mut w = world(true, false);
        let mut wire = Vec::new();
        let mut cur = Cursor::default();
        for s in &specs {
            let u = s.build(&w.stags, &mut cur);
            wire.extend(w.framer.build_fpdu(&u, &[]).unwrap());
        }
        for (i, x) in flips {
            let at = i.index(wire.len());
            wire[at] ^= x;
        }
        w.feed(&wire, seed);
        w.check();
    }
}
