//! One test per Terminate cause the QP engine raises, with
//! `rdmap::error::ALL` as the checklist ([`every_cause_is_covered`]).
//!
//! Each test sets up a connection between the engine and a raw peer (an MPA
//! negotiator and framer driven by hand), lets the peer send crafted ULPDUs
//! cut at random points, and checks what comes back: one Terminate in the
//! RFC 5040 layout with the cause's layer, error type and code, the
//! offending segment's length, DDP header and Read Request header where
//! the cause reports them, nothing after it; the queue pair in Error; every
//! outstanding request and posted receive flushed; and memory unchanged
//! (for the CRC case, whose payload is placed before its CRC arrives,
//! unchanged outside the region written).
//!
//! Causes not provoked through the receive path:
//! - `RDMAP_LOCAL_CATASTROPHIC`: no fault of the peer; raised when a work
//!   request's memory disappears under the send path (tested here through
//!   that path).
//! - `RDMAP_OP_CATASTROPHIC_GLOBAL`: sent only through `Endpoint::abort`
//!   when the worker shuts down (tested through it).
//! - `MPA_TCP_CLOSED`: reported locally when TCP goes away; no Terminate
//!   can be sent (tested: the event and no bytes).
//! - `MPA_INVALID_REQUEST_REPLY`, `MPA_INSUFFICIENT_IRD` and one form of
//!   `MPA_NO_MATCHING_RTR`: raised by connection setup on the initiator
//!   (tested with crafted replies).
//! - `RDMAP_PROT_UNSPECIFIED`, `RDMAP_OP_UNSPECIFIED` and
//!   `MPA_LOCAL_CATASTROPHIC`: never raised: every condition the engine
//!   detects has a more specific code, and MPA setup has no local failure
//!   mode that is not reported otherwise.

mod engine_common;

use core::time::Duration;

use engine_common::Rng;
use rdmap::engine::{Endpoint, EngineEvent, Env, RecordKind, TerminateOrigin};
use rdmap::error::{TerminateCause as C, ALL};
use rdmap::mpa::{
    Config, DeframeEvent, Deframer, Event, FrameKind, FrameRepr, Framer, Framing, IrdOrd,
    Negotiator, RtrSet, RtrType,
};
use rdmap::placement::VecMemory;
use rdmap::verbs::{
    Access, CompletionQueue, Device, DeviceLimits, PdId, QpState, RecvWr, RegOptions, SendWr, Sge,
    SgeList, Stag, WcOpcode, WcStatus,
};
use rdmap::wire::{
    DdpRepr, RdmapOpcode, ReadRequest, TerminateLayout, TerminateMessage, TerminatedDdpHeader,
};

const VA_W: u64 = 0x7000_0000;
const VA_R: u64 = 0x8000_0000;
const VA_N: u64 = 0x9000_0000;
const VA_O: u64 = 0xa000_0000;
const VA_RB: u64 = 0xb000_0000;
const VA_INV: u64 = 0xc000_0000;
const LEN: usize = 4096;
const RB_LEN: u32 = 256;

/// The engine under test with its objects.
struct Target {
    dev: Device,
    mem: VecMemory,
    cq: CompletionQueue,
    ep: Endpoint,
    pd: PdId,
    /// Remote write.
    w: Stag,
    /// Remote read, random contents.
    r: Stag,
    /// Local write only.
    n: Stag,
    /// Remote read and write, in another protection domain.
    o: Stag,
    /// Receive buffers (local write).
    rb: Stag,
    /// Remote write, invalidatable.
    inv: Stag,
    recvs_posted: u32,
}

impl Target {
    fn new(config: Config, initiator: bool) -> Target {
        let mut dev = Device::new(DeviceLimits {
            max_mr: 32,
            ..DeviceLimits::default()
        });
        let pd = dev.alloc_pd().unwrap();
        let other = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(256).unwrap();
        let qp = dev.create_qp(engine_common::qp_attr(pd, &cq)).unwrap();
        let mut mem = VecMemory::new();
        let mut rng = Rng::new(3);
        let mut reg = |dev: &mut Device, pd, va, access, inv: bool, random: bool| {
            let mut bytes = vec![engine_common::CANARY; LEN + 2 * engine_common::GUARD];
            if random {
                rng.fill(&mut bytes[engine_common::GUARD..engine_common::GUARD + LEN]);
            }
            let region = mem.add_region_with(bytes);
            let span = mem
                .span(region, engine_common::GUARD as u64, LEN as u64)
                .unwrap();
            let options = RegOptions { invalidatable: inv };
            dev.reg_mr_with(pd, span, va, access, options).unwrap()
        };
        let lw = Access::LOCAL_WRITE;
        let w = reg(&mut dev, pd, VA_W, lw | Access::REMOTE_WRITE, false, false);
        let r = reg(&mut dev, pd, VA_R, Access::REMOTE_READ, false, true);
        let n = reg(&mut dev, pd, VA_N, lw, false, false);
        let o = reg(
            &mut dev,
            other,
            VA_O,
            lw | Access::REMOTE_WRITE | Access::REMOTE_READ,
            false,
            false,
        );
        let rb = reg(&mut dev, pd, VA_RB, lw, false, false);
        let inv = reg(&mut dev, pd, VA_INV, lw | Access::REMOTE_WRITE, true, false);
        let ep = if initiator {
            Endpoint::initiator(config, &[], qp, Duration::ZERO).unwrap()
        } else {
            Endpoint::responder(config, qp, Duration::ZERO).unwrap()
        };
        Target {
            dev,
            mem,
            cq,
            ep,
            pd,
            w,
            r,
            n,
            o,
            rb,
            inv,
            recvs_posted: 0,
        }
    }

    fn env(&mut self) -> (&mut Endpoint, Env<'_, VecMemory>) {
        (
            &mut self.ep,
            Env::new(&mut self.dev, &mut self.mem, &mut self.cq),
        )
    }

    fn feed(&mut self, bytes: &[u8], rng: &mut Rng) {
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = rng.range(1, 300).min(rest.len());
            let (ep, mut env) = self.env();
            ep.handle_stream(Duration::ZERO, &rest[..n], &mut env);
            rest = &rest[n..];
        }
    }

    /// Everything the engine has to send: (MPA frame bytes, FPDU bytes).
    fn output(&mut self) -> (Vec<u8>, Vec<u8>) {
        let (mut setup, mut fpdus) = (Vec::new(), Vec::new());
        loop {
            let (ep, mut env) = self.env();
            let Some(r) = ep.poll_record(1460, &mut env) else {
                break;
            };
            let bytes = r.to_vec(&self.mem);
            if r.kind() == RecordKind::MpaFrame {
                setup.extend(bytes);
            } else {
                fpdus.extend(bytes);
            }
            let (ep, mut env) = self.env();
            ep.record_acked(r, &mut env);
        }
        (setup, fpdus)
    }

    fn post_recv(&mut self, wr_id: u64, lkey: Stag, len: u32) {
        let wr = RecvWr {
            wr_id,
            sges: SgeList::single(Sge {
                addr: VA_RB,
                length: len,
                lkey,
            }),
        };
        self.ep.qp_mut().post_recv(&wr).unwrap();
        self.recvs_posted += 1;
    }

    fn events(&mut self) -> Vec<EngineEvent> {
        let mut v = Vec::new();
        while let Some(e) = self.ep.poll_event() {
            v.push(e);
        }
        v
    }
}

/// The peer: MPA setup by a negotiator, then FPDUs framed by hand.
struct Peer {
    framer: Framer,
    /// Reads what the target sends.
    deframer: Deframer,
}

fn peer_config() -> Config {
    Config {
        rtr_offer: RtrSet::NONE,
        ..Config::default()
    }
}

/// The engine as responder, connected to a raw initiator.
fn connect(target_cfg: Config, peer_cfg: Config) -> (Target, Peer) {
    let mut t = Target::new(target_cfg, false);
    let mut neg = Negotiator::initiator(peer_cfg, &[], Duration::ZERO).unwrap();
    let req = neg.poll_transmit().unwrap().to_vec();
    t.feed(&req, &mut Rng::new(1));
    assert_eq!(t.events(), [EngineEvent::ConnectRequest]);
    t.ep.accept(&[]).unwrap();
    let (reply, fpdus) = t.output();
    assert!(
        fpdus.is_empty(),
        "the responder spoke before the first FPDU"
    );
    assert_eq!(neg.handle_input(&reply, Duration::ZERO), reply.len());
    let Some(Event::Negotiated(n)) = neg.poll_event() else {
        panic!("peer did not negotiate");
    };
    assert!(matches!(t.events()[..], [EngineEvent::Connected(_)]));
    assert_eq!(t.ep.qp().state(), QpState::Rts);
    let peer = Peer {
        framer: Framer::from_framing(&n.framing),
        deframer: Deframer::new(n.framing.crc, n.framing.markers_rx, u16::MAX),
    };
    (t, peer)
}

/// ULPDUs in `fpdus` (the target's output after setup).
fn deframe(d: &mut Deframer, fpdus: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for ev in d.feed(fpdus) {
        match ev.expect("the engine's FPDUs deframe") {
            DeframeEvent::UlpduStart { .. } => cur.clear(),
            DeframeEvent::Bytes(b) => cur.extend_from_slice(b),
            DeframeEvent::UlpduEnd { crc_ok } => {
                assert!(crc_ok, "the engine's CRC");
                out.push(cur.clone());
            }
        }
    }
    out
}

fn tagged(opcode: RdmapOpcode, stag: Stag, to: u64, payload: usize) -> Vec<u8> {
    let mut b = vec![0x77; 14 + payload];
    DdpRepr::tagged(opcode, true, stag.0, to).emit(&mut b);
    b
}

fn write(stag: Stag, to: u64, payload: usize) -> Vec<u8> {
    tagged(RdmapOpcode::RdmaWrite, stag, to, payload)
}

fn send(msn: u32, mo: u32, last: bool, payload: usize) -> Vec<u8> {
    let mut b = vec![0x66; 18 + payload];
    DdpRepr::untagged(RdmapOpcode::Send, last, msn, mo).emit(&mut b);
    b
}

fn send_inv(msn: u32, inv: Stag, payload: usize) -> Vec<u8> {
    let mut b = vec![0x66; 18 + payload];
    DdpRepr::Untagged {
        opcode: RdmapOpcode::SendInvalidate,
        last: true,
        qn: 0,
        msn,
        mo: 0,
        inv_stag: Some(inv.0),
    }
    .emit(&mut b);
    b
}

fn read_request(msn: u32, rr: ReadRequest) -> Vec<u8> {
    let mut b = vec![0; 46];
    DdpRepr::untagged(RdmapOpcode::ReadRequest, true, msn, 0).emit(&mut b);
    rr.emit(&mut b[18..]);
    b
}

fn rr_from(stag: Stag, to: u64, size: u32) -> ReadRequest {
    ReadRequest {
        sink_stag: 0x1234_5600,
        sink_to: 0x10_0000,
        size,
        source_stag: stag.0,
        source_to: to,
    }
}

/// How a case corrupts the wire bytes before they are fed.
#[derive(Clone, Copy)]
enum Corrupt {
    None,
    /// Flip a bit of the last octet (the last FPDU's CRC field).
    LastCrc,
    /// Make the leading marker's FPDUPTR non-zero.
    LeadingMarker,
}

/// A receive to post: wr_id, which buffer's STag, length.
type RecvSpec = (u64, fn(&Target) -> Stag, u32);

struct Case {
    cause: C,
    /// The target's and the peer's MPA configuration.
    target_cfg: Config,
    peer_cfg: Config,
    /// Receives to post: (wr_id, lkey selector, length).
    recvs: &'static [RecvSpec],
    ulpdus: fn(&Target) -> Vec<Vec<u8>>,
    /// Which ULPDU is at fault.
    bad: usize,
    corrupt: Corrupt,
    /// Memory that may change: none, or the region written before the
    /// fault was known (the CRC case).
    may_write: Option<fn(&Target) -> Stag>,
    /// A region whose placements fail ([`VecMemory::refuse_writes`]).
    refuse: Option<fn(&Target) -> Stag>,
}

impl Case {
    fn new(cause: C, ulpdus: fn(&Target) -> Vec<Vec<u8>>) -> Case {
        Case {
            cause,
            target_cfg: Config::default(),
            peer_cfg: peer_config(),
            recvs: &[],
            ulpdus,
            bad: 0,
            corrupt: Corrupt::None,
            may_write: None,
            refuse: None,
        }
    }

    /// The memory behind `stag` is gone from under the engine: every
    /// placement into it fails.
    fn refuse(self, stag: fn(&Target) -> Stag) -> Case {
        Case {
            refuse: Some(stag),
            ..self
        }
    }

    fn recvs(self, recvs: &'static [RecvSpec]) -> Case {
        Case { recvs, ..self }
    }

    fn bad(self, bad: usize) -> Case {
        Case { bad, ..self }
    }

    /// Earlier segments (or the payload of a Send whose fault shows only at
    /// its end) were placed into the receive buffer: a registered region.
    fn writes_recv_buffer(self) -> Case {
        Case {
            may_write: Some(rb),
            ..self
        }
    }
}

fn rb(t: &Target) -> Stag {
    t.rb
}

fn r(t: &Target) -> Stag {
    t.r
}

fn w(t: &Target) -> Stag {
    t.w
}

const ONE_RECV: &[RecvSpec] = &[(500, rb, RB_LEN)];

/// Runs a case; returns the Terminate the engine sent.
fn provoke(case: Case) -> TerminateMessage {
    let (mut t, mut peer) = connect(case.target_cfg.clone(), case.peer_cfg.clone());
    for &(id, lkey, len) in case.recvs {
        let k = lkey(&t);
        t.post_recv(id, k, len);
    }
    // A request of ours waiting to go out; it must be flushed.
    let wr = SendWr::send(
        900,
        SgeList::single(Sge {
            addr: VA_R,
            length: 10,
            lkey: t.r,
        }),
    );
    t.ep.qp_mut().post_send(&wr, t.dev.mrs()).unwrap();

    let ulpdus = (case.ulpdus)(&t);
    let mut wire = Vec::new();
    for u in &ulpdus {
        wire.extend(peer.framer.build_fpdu(u, &[]).unwrap());
    }
    match case.corrupt {
        Corrupt::None => {}
        Corrupt::LastCrc => *wire.last_mut().unwrap() ^= 0x01,
        Corrupt::LeadingMarker => wire[3] = 0x40,
    }
    if let Some(stag) = case.refuse {
        let region = t.dev.mrs().query_mr(stag(&t)).unwrap().mem.region;
        t.mem.refuse_writes(region);
    }
    let before = t.mem.clone();
    t.feed(&wire, &mut Rng::new(case.cause.ecode as u64 + 17));
    let (_, out) = t.output();

    let what = format!("{}", case.cause);
    let ulpdus_out = deframe(&mut peer.deframer, &out);
    assert_eq!(
        ulpdus_out.len(),
        1,
        "{what}: exactly one FPDU, the Terminate"
    );
    let (msg, layout) = TerminateMessage::parse(&ulpdus_out[0]).expect("a Terminate");
    assert_eq!(layout, TerminateLayout::Rfc, "{what}");
    assert_eq!(msg.msn, 1, "{what}");
    assert_eq!(msg.header.cause, case.cause, "{what}");
    // The Terminate's own DDP header: untagged, last, queue 2, MO 0.
    assert_eq!(
        DdpRepr::parse_ulpdu(&ulpdus_out[0]).unwrap().0,
        DdpRepr::untagged(RdmapOpcode::Terminate, true, 1, 0)
    );
    let offending = &ulpdus[case.bad];
    if case.cause.reports_segment() {
        assert_eq!(
            msg.header.segment_length,
            Some(offending.len() as u16),
            "{what}: segment length"
        );
        let hdr = TerminatedDdpHeader::from_bytes(offending).ok();
        assert_eq!(msg.header.ddp_header, hdr, "{what}: DDP header");
        let is_rr =
            hdr.and_then(|h| h.parse().ok()).map(|h| h.opcode()) == Some(RdmapOpcode::ReadRequest);
        if is_rr && offending.len() >= 46 {
            assert_eq!(
                msg.header.rdma_header,
                Some(ReadRequest::parse_bytes(&offending[18..]).unwrap()),
                "{what}: RDMA header"
            );
        } else {
            assert_eq!(msg.header.rdma_header, None, "{what}");
        }
    } else {
        assert_eq!(msg.header.segment_length, None, "{what}");
        assert_eq!(msg.header.ddp_header, None, "{what}");
    }

    // The events, the state, the flush.
    let events = t.events();
    assert_eq!(
        events,
        [
            EngineEvent::Terminated {
                cause: Some(case.cause),
                origin: TerminateOrigin::Local
            },
            EngineEvent::ReadyToClose
        ],
        "{what}"
    );
    assert_eq!(t.ep.qp().state(), QpState::Error, "{what}");
    let mut wcs = Vec::new();
    while let Some(wc) = t.cq.poll_one() {
        wcs.push(wc);
    }
    let sends: Vec<_> = wcs.iter().filter(|c| c.opcode != WcOpcode::Recv).collect();
    assert_eq!(sends.len(), 1, "{what}: {wcs:?}");
    assert_eq!(
        (sends[0].wr_id, sends[0].status),
        (900, WcStatus::WrFlushError)
    );
    let recvs: Vec<_> = wcs.iter().filter(|c| c.opcode == WcOpcode::Recv).collect();
    assert_eq!(recvs.len() as u32, t.recvs_posted, "{what}: {wcs:?}");
    if case.refuse.is_some() {
        // Nothing was placed: no receive may say it got its bytes.
        assert!(
            recvs.iter().all(|c| c.status != WcStatus::Success),
            "{what}: {wcs:?}"
        );
    }
    for c in recvs {
        assert!(
            matches!(
                c.status,
                WcStatus::Success | WcStatus::WrFlushError | WcStatus::LocalProtectionError
            ),
            "{what}: {c:?}"
        );
    }
    assert_eq!(t.ep.qp().inbound_reads(), 0, "{what}");
    for s in [t.w, t.r, t.n, t.rb, t.inv] {
        assert_eq!(t.dev.mrs().query_mr(s).map(|i| i.pins), Some(0), "{what}");
    }

    // Memory: untouched, except (CRC case) the region written.
    let may = case.may_write.map(|f| f(&t));
    for h in 0..6u64 {
        let region = rdmap::placement::RegionHandle(h);
        let (a, b) = (before.bytes(region).unwrap(), t.mem.bytes(region).unwrap());
        let g = engine_common::GUARD;
        let written = may.is_some_and(|s| t.dev.mrs().query_mr(s).unwrap().mem.region == region);
        if written {
            assert_eq!(a[..g], b[..g], "{what}: before the region");
            assert_eq!(a[g + LEN..], b[g + LEN..], "{what}: after the region");
        } else {
            assert!(a == b, "{what}: region {h} changed");
        }
    }
    msg
}

// ---- DDP tagged buffer errors (RFC 5041 §7.2) --------------------------

#[test]
fn ddp_tagged_invalid_stag() {
    provoke(Case::new(C::DDP_TAGGED_INVALID_STAG, |_| {
        vec![write(Stag(0x00de_ad00), VA_W, 100)]
    }));
    // The right index with the wrong key.
    provoke(Case::new(C::DDP_TAGGED_INVALID_STAG, |t| {
        vec![write(t.w.with_key(t.w.key().wrapping_add(1)), VA_W, 100)]
    }));
    // A Read Response naming another STag than the Read's sink is refused
    // as invalid too (see rdmap_op_unexpected_opcode for one with no Read).
}

#[test]
fn ddp_tagged_base_bounds() {
    provoke(Case::new(C::DDP_TAGGED_BASE_BOUNDS, |t| {
        vec![write(t.w, VA_W + LEN as u64 - 10, 100)]
    }));
    provoke(Case::new(C::DDP_TAGGED_BASE_BOUNDS, |t| {
        vec![write(t.w, VA_W - 1, 10)]
    }));
}

#[test]
fn ddp_tagged_stag_not_associated() {
    provoke(Case::new(C::DDP_TAGGED_STAG_NOT_ASSOCIATED, |t| {
        vec![write(t.o, VA_O, 100)]
    }));
}

#[test]
fn ddp_tagged_to_wrap() {
    provoke(Case::new(C::DDP_TAGGED_TO_WRAP, |t| {
        vec![write(t.w, u64::MAX - 10, 100)]
    }));
}

#[test]
fn ddp_tagged_invalid_version() {
    provoke(Case::new(C::DDP_TAGGED_INVALID_VERSION, |t| {
        let mut b = write(t.w, VA_W, 10);
        b[0] = (b[0] & !0x03) | 0x02;
        vec![b]
    }));
}

// ---- DDP untagged buffer errors ----------------------------------------

#[test]
fn ddp_untagged_invalid_version() {
    provoke(
        Case::new(C::DDP_UNTAGGED_INVALID_VERSION, |_| {
            let mut b = send(1, 0, true, 10);
            b[0] &= !0x03;
            vec![b]
        })
        .recvs(ONE_RECV),
    );
}

#[test]
fn ddp_untagged_invalid_qn() {
    provoke(
        Case::new(C::DDP_UNTAGGED_INVALID_QN, |_| {
            let mut b = send(1, 0, true, 10);
            b[6..10].copy_from_slice(&3u32.to_be_bytes());
            vec![b]
        })
        .recvs(ONE_RECV),
    );
}

#[test]
fn ddp_untagged_no_buffer() {
    // A Send with no receive posted.
    provoke(Case::new(C::DDP_UNTAGGED_NO_BUFFER, |_| {
        vec![send(1, 0, true, 10)]
    }));
    // A second Send after the only receive was used.
    provoke(
        Case::new(C::DDP_UNTAGGED_NO_BUFFER, |_| {
            vec![send(1, 0, true, 10), send(2, 0, true, 10)]
        })
        .recvs(ONE_RECV)
        .bad(1)
        .writes_recv_buffer(),
    );
}

#[test]
fn ird_exceeded_is_no_buffer() {
    // IRD 1: a second Read Request before the first one's Response is sent.
    let mut case = Case::new(rdmap::verbs::IRD_EXCEEDED, |t| {
        vec![
            read_request(1, rr_from(t.r, VA_R, 100)),
            read_request(2, rr_from(t.r, VA_R, 100)),
        ]
    })
    .bad(1);
    case.target_cfg.ird = 1;
    assert_eq!(provoke(case).header.cause, C::DDP_UNTAGGED_NO_BUFFER);
}

#[test]
fn ddp_untagged_msn_range() {
    provoke(Case::new(C::DDP_UNTAGGED_MSN_RANGE, |_| vec![send(5, 0, true, 10)]).recvs(ONE_RECV));
    // A repeat of a completed message.
    provoke(
        Case::new(C::DDP_UNTAGGED_MSN_RANGE, |_| {
            vec![send(1, 0, true, 10), send(1, 0, true, 10)]
        })
        .recvs(&[(500, rb, RB_LEN), (501, rb, RB_LEN)])
        .bad(1)
        .writes_recv_buffer(),
    );
    // Read Requests have their own queue and MSNs.
    provoke(Case::new(C::DDP_UNTAGGED_MSN_RANGE, |t| {
        vec![read_request(2, rr_from(t.r, VA_R, 10))]
    }));
}

#[test]
fn ddp_untagged_invalid_mo() {
    provoke(
        Case::new(C::DDP_UNTAGGED_INVALID_MO, |_| {
            vec![send(1, 1000, true, 10)]
        })
        .recvs(ONE_RECV),
    );
    // A gap: the second segment does not continue where the first ended.
    provoke(
        Case::new(C::DDP_UNTAGGED_INVALID_MO, |_| {
            vec![send(1, 0, false, 10), send(1, 20, true, 10)]
        })
        .recvs(ONE_RECV)
        .bad(1)
        .writes_recv_buffer(),
    );
}

#[test]
fn ddp_untagged_too_long() {
    provoke(
        Case::new(C::DDP_UNTAGGED_TOO_LONG, |_| {
            vec![send(1, 0, true, RB_LEN as usize + 1)]
        })
        .recvs(ONE_RECV),
    );
    // Two segments that together overflow.
    provoke(
        Case::new(C::DDP_UNTAGGED_TOO_LONG, |_| {
            vec![send(1, 0, false, 200), send(1, 200, true, 100)]
        })
        .recvs(ONE_RECV)
        .bad(1)
        .writes_recv_buffer(),
    );
}

#[test]
fn ddp_local_catastrophic() {
    // Our own receive buffer names memory we may not write.
    provoke(
        Case::new(C::DDP_LOCAL_CATASTROPHIC, |_| vec![send(1, 0, true, 10)])
            .recvs(&[(500, r, RB_LEN)]),
    );
}

#[test]
fn memory_that_cannot_be_placed_into_is_a_local_catastrophe() {
    // The STag checks pass but the memory behind it is not there: the
    // stream ends, and no receive completes with bytes it never got.
    provoke(Case::new(C::DDP_LOCAL_CATASTROPHIC, |t| vec![write(t.w, VA_W, 100)]).refuse(w));
    provoke(
        Case::new(C::DDP_LOCAL_CATASTROPHIC, |_| vec![send(1, 0, true, 10)])
            .recvs(ONE_RECV)
            .refuse(rb),
    );
}

// ---- RDMAP remote protection errors (RFC 5040 §4.8) --------------------

#[test]
fn rdmap_prot_invalid_stag() {
    provoke(Case::new(C::RDMAP_PROT_INVALID_STAG, |_| {
        vec![read_request(1, rr_from(Stag(0x00be_ef00), VA_R, 10))]
    }));
}

#[test]
fn rdmap_prot_base_bounds() {
    provoke(Case::new(C::RDMAP_PROT_BASE_BOUNDS, |t| {
        vec![read_request(1, rr_from(t.r, VA_R + 10, LEN as u32))]
    }));
}

#[test]
fn rdmap_prot_access_rights() {
    // A Read Request from a region without remote read.
    provoke(Case::new(C::RDMAP_PROT_ACCESS_RIGHTS, |t| {
        vec![read_request(1, rr_from(t.w, VA_W, 10))]
    }));
    // A Write into a region without remote write.
    provoke(Case::new(C::RDMAP_PROT_ACCESS_RIGHTS, |t| {
        vec![write(t.n, VA_N, 10)]
    }));
}

#[test]
fn rdmap_prot_stag_not_associated() {
    provoke(Case::new(C::RDMAP_PROT_STAG_NOT_ASSOCIATED, |t| {
        vec![read_request(1, rr_from(t.o, VA_O, 10))]
    }));
}

#[test]
fn rdmap_prot_to_wrap() {
    provoke(Case::new(C::RDMAP_PROT_TO_WRAP, |t| {
        vec![read_request(1, rr_from(t.r, u64::MAX - 10, 100))]
    }));
}

#[test]
fn rdmap_prot_cannot_invalidate() {
    provoke(
        Case::new(C::RDMAP_PROT_CANNOT_INVALIDATE, |_| {
            vec![send_inv(1, Stag(0x00ab_cd00), 10)]
        })
        .recvs(ONE_RECV)
        .writes_recv_buffer(),
    );
    // Another protection domain's STag.
    provoke(
        Case::new(C::RDMAP_PROT_CANNOT_INVALIDATE, |t| {
            vec![send_inv(1, t.o, 10)]
        })
        .recvs(ONE_RECV)
        .writes_recv_buffer(),
    );
}

// ---- RDMAP remote operation errors -------------------------------------

#[test]
fn rdmap_op_invalid_version() {
    provoke(
        Case::new(C::RDMAP_OP_INVALID_VERSION, |_| {
            let mut b = send(1, 0, true, 10);
            b[1] = (b[1] & 0x3f) | 0x80;
            vec![b]
        })
        .recvs(ONE_RECV),
    );
}

#[test]
fn rdmap_op_unexpected_opcode() {
    // An opcode RFC 5040 does not define.
    provoke(
        Case::new(C::RDMAP_OP_UNEXPECTED_OPCODE, |_| {
            let mut b = send(1, 0, true, 10);
            b[1] = (b[1] & 0xf0) | 0x08;
            vec![b]
        })
        .recvs(ONE_RECV),
    );
    // A Send on the Read Request queue.
    provoke(
        Case::new(C::RDMAP_OP_UNEXPECTED_OPCODE, |_| {
            let mut b = send(1, 0, true, 10);
            b[6..10].copy_from_slice(&1u32.to_be_bytes());
            vec![b]
        })
        .recvs(ONE_RECV),
    );
    // A Read Response with no Read outstanding.
    provoke(Case::new(C::RDMAP_OP_UNEXPECTED_OPCODE, |t| {
        vec![tagged(RdmapOpcode::ReadResponse, t.w, VA_W, 10)]
    }));
}

#[test]
fn rdmap_op_catastrophic_stream() {
    // A ULPDU shorter than the untagged header its first octet announces.
    provoke(
        Case::new(C::RDMAP_OP_CATASTROPHIC_STREAM, |_| {
            vec![send(1, 0, true, 0)[..10].to_vec()]
        })
        .recvs(ONE_RECV),
    );
    // A Read Request cut short.
    provoke(Case::new(C::RDMAP_OP_CATASTROPHIC_STREAM, |t| {
        vec![read_request(1, rr_from(t.r, VA_R, 10))[..30].to_vec()]
    }));
    // An empty ULPDU.
    provoke(Case::new(C::RDMAP_OP_CATASTROPHIC_STREAM, |_| {
        vec![Vec::new()]
    }));
}

#[test]
fn rdmap_op_cannot_invalidate() {
    // A valid STag of ours registered without remote invalidation.
    provoke(
        Case::new(C::RDMAP_OP_CANNOT_INVALIDATE, |t| {
            vec![send_inv(1, t.w, 10)]
        })
        .recvs(ONE_RECV)
        .writes_recv_buffer(),
    );
}

// ---- MPA (RFC 5044 §8, RFC 6581) ---------------------------------------

#[test]
fn mpa_crc() {
    let mut case = Case::new(C::MPA_CRC, |t| vec![write(t.w, VA_W, 500)]);
    case.corrupt = Corrupt::LastCrc;
    case.may_write = Some(w);
    provoke(case);
    // A corrupted header: the CRC error is what is reported, not the
    // header's nonsense, and nothing is written.
    let mut case = Case::new(C::MPA_CRC, |t| {
        let mut b = write(t.w, VA_W, 8);
        b[2] ^= 0xff;
        vec![b]
    });
    case.corrupt = Corrupt::LastCrc;
    provoke(case);
}

#[test]
fn mpa_marker_mismatch() {
    let mut case = Case::new(C::MPA_MARKER_MISMATCH, |t| vec![write(t.w, VA_W, 700)]);
    case.target_cfg.markers_wanted = true;
    case.corrupt = Corrupt::LeadingMarker;
    provoke(case);
}

#[test]
fn mpa_no_matching_rtr_on_the_responder() {
    // Peer-to-peer with a Write RTR agreed; the first FPDU is a Send.
    let mut case = Case::new(C::MPA_NO_MATCHING_RTR, |_| vec![send(1, 0, true, 0)]).recvs(ONE_RECV);
    case.peer_cfg.rtr_offer = RtrSet::only(RtrType::Write);
    provoke(case);
}

/// The engine as initiator against a crafted reply; returns the Terminate
/// it sends in the framing the reply set up.
fn initiator_against(target_cfg: Config, reply: FrameRepr<'_>) -> TerminateMessage {
    let mut t = Target::new(target_cfg, true);
    let (request, fpdus) = t.output();
    assert!(!request.is_empty() && fpdus.is_empty());
    let reply_bytes = reply.to_vec().unwrap();
    t.feed(&reply_bytes, &mut Rng::new(5));
    let (setup, out) = t.output();
    assert!(setup.is_empty());
    let framing = Framing {
        crc: reply.crc || t.ep.negotiated().is_none(),
        markers_rx: reply.markers,
        markers_tx: false,
    };
    let mut d = Deframer::new(framing.crc, framing.markers_rx, u16::MAX);
    let ulpdus = deframe(&mut d, &out);
    assert_eq!(ulpdus.len(), 1);
    let (msg, layout) = TerminateMessage::parse(&ulpdus[0]).unwrap();
    assert_eq!(layout, TerminateLayout::Rfc);
    let events = t.events();
    assert!(
        matches!(
            events[..],
            [EngineEvent::SetupFailed(_), EngineEvent::ReadyToClose]
        ),
        "{events:?}"
    );
    assert_eq!(t.ep.qp().state(), QpState::Error);
    msg
}

fn reply(markers: bool, ird: u16, ord: u16, rtr: RtrSet) -> FrameRepr<'static> {
    FrameRepr {
        kind: FrameKind::Reply,
        markers,
        crc: true,
        revision: 2,
        ird_ord: Some(IrdOrd {
            ird,
            ord,
            peer_to_peer: !rtr.is_empty(),
            rtr,
        }),
        private_data: &[],
    }
}

#[test]
fn mpa_invalid_request_reply() {
    // The reply asks for markers, which this initiator does not accept.
    let cfg = Config {
        markers_accepted: false,
        ..Config::default()
    };
    let m = initiator_against(cfg, reply(true, 4, 4, RtrSet::only(RtrType::Write)));
    assert_eq!(
        m.header,
        rdmap::wire::TerminateRepr::bare(C::MPA_INVALID_REQUEST_REPLY)
    );
}

#[test]
fn mpa_insufficient_ird() {
    // The responder's ORD (8) exceeds our IRD (2).
    let cfg = Config {
        ird: 2,
        ..Config::default()
    };
    let m = initiator_against(cfg, reply(false, 4, 8, RtrSet::only(RtrType::Write)));
    assert_eq!(
        m.header,
        rdmap::wire::TerminateRepr::bare(C::MPA_INSUFFICIENT_IRD)
    );
}

#[test]
fn mpa_no_matching_rtr_on_the_initiator() {
    // We offered a Write RTR only; the reply picks Send.
    let cfg = Config {
        rtr_offer: RtrSet::only(RtrType::Write),
        ..Config::default()
    };
    let m = initiator_against(cfg, reply(false, 4, 4, RtrSet::only(RtrType::Send)));
    assert_eq!(
        m.header,
        rdmap::wire::TerminateRepr::bare(C::MPA_NO_MATCHING_RTR)
    );
}

#[test]
fn mpa_tcp_closed_is_reported_locally() {
    let (mut t, _peer) = connect(Config::default(), peer_config());
    t.post_recv(1, t.rb, RB_LEN);
    let (ep, mut env) = t.env();
    ep.handle_stream_closed(&mut env);
    assert_eq!(
        t.events(),
        [
            EngineEvent::Terminated {
                cause: Some(C::MPA_TCP_CLOSED),
                origin: TerminateOrigin::Stream
            },
            EngineEvent::ReadyToClose
        ]
    );
    let (_, out) = t.output();
    assert!(out.is_empty(), "nothing can be sent on a closed stream");
    assert_eq!(t.ep.qp().state(), QpState::Error);
    assert_eq!(
        t.cq.poll_one().map(|c| c.status),
        Some(WcStatus::WrFlushError)
    );
}

// ---- Local failures --------------------------------------------------

#[test]
fn rdmap_local_catastrophic_when_a_source_goes_away() {
    let (mut t, mut peer) = connect(Config::default(), peer_config());
    // Let the responder speak: a zero-length Write is the first FPDU.
    let first = peer.framer.build_fpdu(&write(t.w, VA_W, 0), &[]).unwrap();
    t.feed(&first, &mut Rng::new(1));
    // A Send whose source is deregistered after the post.
    let lw = Access::LOCAL_WRITE;
    let mut mem_span = None;
    for h in 0..6 {
        let region = rdmap::placement::RegionHandle(h);
        if t.dev.mrs().query_mr(t.rb).unwrap().mem.region == region {
            mem_span = t.mem.span(region, 64, 100);
        }
    }
    let src = t.dev.reg_mr(t.pd, mem_span.unwrap(), 0x1000, lw).unwrap();
    let wr = SendWr::send(
        7,
        SgeList::single(Sge {
            addr: 0x1000,
            length: 100,
            lkey: src,
        }),
    );
    t.ep.qp_mut().post_send(&wr, t.dev.mrs()).unwrap();
    t.dev.dereg_mr(src).unwrap();
    let (_, out) = t.output();
    let ulpdus = deframe(&mut peer.deframer, &out);
    assert_eq!(ulpdus.len(), 1);
    let (msg, _) = TerminateMessage::parse(&ulpdus[0]).unwrap();
    assert_eq!(
        msg.header,
        rdmap::wire::TerminateRepr::bare(C::RDMAP_LOCAL_CATASTROPHIC)
    );
    let wc = t.cq.poll_one().unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::LocalProtectionError));
    assert_eq!(t.ep.qp().state(), QpState::Error);
}

#[test]
fn rdmap_op_catastrophic_global_through_abort() {
    let (mut t, mut peer) = connect(Config::default(), peer_config());
    let (ep, mut env) = t.env();
    ep.abort(C::RDMAP_OP_CATASTROPHIC_GLOBAL, &mut env);
    let (_, out) = t.output();
    let ulpdus = deframe(&mut peer.deframer, &out);
    let (msg, _) = TerminateMessage::parse(&ulpdus[0]).unwrap();
    assert_eq!(
        msg.header,
        rdmap::wire::TerminateRepr::bare(C::RDMAP_OP_CATASTROPHIC_GLOBAL)
    );
    assert_eq!(t.ep.qp().state(), QpState::Error);
}

// ---- After the fault ---------------------------------------------------

#[test]
fn first_fault_wins_and_the_rest_is_ignored() {
    // A bad STag, then a valid Write in the same chunk: nothing is placed,
    // one Terminate is sent.
    let m = provoke(
        Case::new(C::DDP_TAGGED_INVALID_STAG, |t| {
            vec![
                write(Stag(0x00de_ad00), VA_W, 10),
                write(t.w, VA_W, 100),
                send(9, 0, true, 0),
            ]
        })
        .bad(0),
    );
    assert_eq!(m.header.cause, C::DDP_TAGGED_INVALID_STAG);
}

#[test]
fn a_terminate_from_the_peer_flushes_with_its_cause() {
    let (mut t, mut peer) = connect(Config::default(), peer_config());
    // Let the responder speak, and let our Send go out.
    let first = peer.framer.build_fpdu(&write(t.w, VA_W, 0), &[]).unwrap();
    t.feed(&first, &mut Rng::new(1));
    t.post_recv(1, t.rb, RB_LEN);
    for id in [10, 11] {
        let wr = SendWr::send(
            id,
            SgeList::single(Sge {
                addr: VA_R,
                length: 10,
                lkey: t.r,
            }),
        );
        t.ep.qp_mut().post_send(&wr, t.dev.mrs()).unwrap();
    }
    let mut held = Vec::new();
    let (ep, mut env) = t.env();
    while let Some(r) = ep.poll_record(1460, &mut env) {
        held.push(r);
    }
    assert_eq!(held.len(), 2);
    // The peer refuses our first Send.
    let mut hdr = [0u8; 18];
    DdpRepr::untagged(RdmapOpcode::Send, true, 1, 0).emit(&mut hdr);
    let term = TerminateMessage {
        msn: 1,
        header: rdmap::wire::TerminateRepr::for_segment(C::DDP_UNTAGGED_NO_BUFFER, Some(&hdr)),
    };
    let mut buf = [0u8; 64];
    let n = term.emit(&mut buf);
    let fpdu = peer.framer.build_fpdu(&buf[..n], &[]).unwrap();
    t.feed(&fpdu, &mut Rng::new(2));
    for r in held {
        t.ep.record_dropped(r, &mut t.dev);
    }
    let events = t.events();
    assert_eq!(
        events,
        [
            EngineEvent::Terminated {
                cause: Some(C::DDP_UNTAGGED_NO_BUFFER),
                origin: TerminateOrigin::Peer
            },
            EngineEvent::ReadyToClose
        ]
    );
    assert_eq!(t.ep.qp().state(), QpState::Error);
    let wcs: Vec<_> = std::iter::from_fn(|| t.cq.poll_one())
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        wcs,
        [
            (10, WcStatus::from_terminate(C::DDP_UNTAGGED_NO_BUFFER)),
            (11, WcStatus::WrFlushError),
            (1, WcStatus::WrFlushError),
        ]
    );
    let (_, out) = t.output();
    assert!(out.is_empty(), "no Terminate answers a Terminate");
    assert_eq!(t.dev.mrs().query_mr(t.r).unwrap().pins, 0);
}

/// The checklist: every row of `ALL` is provoked above or listed in the
/// module documentation as not raised.
#[test]
fn every_cause_is_covered() {
    let provoked = [
        C::RDMAP_LOCAL_CATASTROPHIC,
        C::RDMAP_PROT_INVALID_STAG,
        C::RDMAP_PROT_BASE_BOUNDS,
        C::RDMAP_PROT_ACCESS_RIGHTS,
        C::RDMAP_PROT_STAG_NOT_ASSOCIATED,
        C::RDMAP_PROT_TO_WRAP,
        C::RDMAP_PROT_CANNOT_INVALIDATE,
        C::RDMAP_OP_INVALID_VERSION,
        C::RDMAP_OP_UNEXPECTED_OPCODE,
        C::RDMAP_OP_CATASTROPHIC_STREAM,
        C::RDMAP_OP_CATASTROPHIC_GLOBAL,
        C::RDMAP_OP_CANNOT_INVALIDATE,
        C::DDP_LOCAL_CATASTROPHIC,
        C::DDP_TAGGED_INVALID_STAG,
        C::DDP_TAGGED_BASE_BOUNDS,
        C::DDP_TAGGED_STAG_NOT_ASSOCIATED,
        C::DDP_TAGGED_TO_WRAP,
        C::DDP_TAGGED_INVALID_VERSION,
        C::DDP_UNTAGGED_INVALID_QN,
        C::DDP_UNTAGGED_NO_BUFFER,
        C::DDP_UNTAGGED_MSN_RANGE,
        C::DDP_UNTAGGED_INVALID_MO,
        C::DDP_UNTAGGED_TOO_LONG,
        C::DDP_UNTAGGED_INVALID_VERSION,
        C::MPA_TCP_CLOSED,
        C::MPA_CRC,
        C::MPA_MARKER_MISMATCH,
        C::MPA_INVALID_REQUEST_REPLY,
        C::MPA_INSUFFICIENT_IRD,
        C::MPA_NO_MATCHING_RTR,
    ];
    let never = [
        C::RDMAP_PROT_UNSPECIFIED,
        C::RDMAP_OP_UNSPECIFIED,
        C::MPA_LOCAL_CATASTROPHIC,
    ];
    for (cause, _) in ALL {
        assert!(
            provoked.contains(cause) ^ never.contains(cause),
            "{cause} is neither provoked nor documented as never raised"
        );
    }
    assert_eq!(provoked.len() + never.len(), ALL.len());
}
