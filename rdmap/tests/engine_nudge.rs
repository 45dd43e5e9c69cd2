//! Connection start-up against responders that behave like Linux siw:
//!
//! - a responder that leaves the initiator's first FPDU unread until a
//!   second segment with data arrives (siw hands its socket to the queue
//!   pair only after sending its MPA reply): the initiator nudges it with
//!   one zero-length RDMA Write after `nudge_after` of silence, and not
//!   when the responder answered in time or the nudge is disabled;
//! - our receive path takes zero-length Writes, whatever their STag,
//!   without a Terminate or a completion;
//! - a responder replying IRD 16 / ORD 0 (siw's `ib_read_bw -R` server,
//!   which does no Reads itself): our ORD is capped at its IRD, not at its
//!   ORD, and 64 KiB Reads complete with the right bytes.

mod engine_common;

use core::time::Duration;

use engine_common::{qp_attr, Pair, Setup, Side};
use rdmap::engine::{Endpoint, EngineEvent};
use rdmap::mpa::rtr::nudge_ulpdu;
use rdmap::mpa::{Config, RtrSet, RtrType};
use rdmap::verbs::{Access, RecvWr, SendWr, Sge, SgeList, WcOpcode, WcStatus};
use rdmap::wire::RdmapOpcode;

const MS: Duration = Duration::from_millis(1);
const NUDGE: Duration = Duration::from_millis(200);

/// Replaces a side's endpoint by one with `config` (on a fresh queue pair
/// of the same device).
fn reconfigure(side: &mut Side, config: Config, initiator: bool) {
    let qp = side.dev.create_qp(qp_attr(side.pd, &side.cq)).unwrap();
    side.ep = if initiator {
        Endpoint::initiator(config, b"init", qp, Duration::ZERO).unwrap()
    } else {
        Endpoint::responder(config, qp, Duration::ZERO).unwrap()
    };
}

fn config(setup: &Setup, nudge_after: Duration) -> Config {
    Config {
        nudge_after,
        ..engine_common::config(setup)
    }
}

/// A connected pair whose initiator nudges after `nudge_after`; no
/// stream byte is in flight when it returns.
fn connected_pair(seed: u64, setup: Setup, nudge_after: Duration) -> Pair {
    let mut p = Pair::new(seed, setup, 1460);
    reconfigure(&mut p.a, config(&setup, nudge_after), true);
    p.connect();
    assert!(p.a.pipe.is_empty() && p.b.pipe.is_empty());
    p.a.log = Some(Vec::new());
    p
}

/// The responder's input as Linux siw as responder treats it: what
/// arrives before it hands the socket to the queue pair is acknowledged
/// but left unread, until a later segment with data makes it read all.
struct Strand {
    /// Bytes received and not processed.
    held: Vec<u8>,
    /// Data segments received while stranding.
    segments: usize,
    /// The responder reads everything from now on.
    open: bool,
    /// Initiator records already taken from its log.
    seen: usize,
}

impl Strand {
    fn new(open: bool) -> Strand {
        Strand {
            held: Vec::new(),
            segments: 0,
            open,
            seen: 0,
        }
    }
}

/// One round at time `now`: the initiator's timer, both sides transmit,
/// the initiator's segments go through `strand`, the responder's straight
/// over, acknowledgements and events.
fn step(p: &mut Pair, strand: &mut Strand, now: Duration) {
    p.step += 1;
    if p.a.ep.poll_timeout().is_some_and(|t| t <= now) {
        p.a.ep.handle_timeout(now);
    }
    let (mss, window) = (p.mss, p.window);
    p.a.transmit(&mut p.rng, mss, window);
    p.b.transmit(&mut p.rng, mss, window);
    // Initiator to responder, segment by segment.
    let log = p.a.log.as_ref().unwrap();
    let new: Vec<Vec<u8>> = log[strand.seen..].iter().map(|(_, b)| b.clone()).collect();
    strand.seen = log.len();
    p.a.delivered += p.a.pipe.len() as u64;
    p.a.pipe.clear();
    for seg in new {
        strand.held.extend_from_slice(&seg);
        strand.segments += 1;
    }
    if strand.segments >= 2 {
        strand.open = true;
    }
    if strand.open && !strand.held.is_empty() {
        let chunk = std::mem::take(&mut strand.held);
        p.b.with_env(|ep, env| ep.handle_stream(now, &chunk, env));
    }
    // Responder to initiator.
    if !p.b.pipe.is_empty() {
        let chunk: Vec<u8> = p.b.pipe.drain(..).collect();
        p.b.delivered += chunk.len() as u64;
        p.a.with_env(|ep, env| ep.handle_stream(now, &chunk, env));
    }
    let s = p.step;
    p.a.acks(&mut p.rng, s);
    p.b.acks(&mut p.rng, s);
    p.a.drain();
    p.b.drain();
}

/// Steps with the clock advancing by `tick` from `from` up to `to`.
fn run(p: &mut Pair, strand: &mut Strand, from: Duration, to: Duration, tick: Duration) {
    let mut now = from;
    while now <= to {
        step(p, strand, now);
        step(p, strand, now);
        now += tick;
    }
}

fn post_recv(side: &mut Side, wr_id: u64, buf: engine_common::Buf) {
    side.ep
        .qp_mut()
        .post_recv(&RecvWr {
            wr_id,
            sges: SgeList::single(Sge {
                addr: buf.va,
                length: buf.len as u32,
                lkey: buf.stag,
            }),
        })
        .unwrap();
}

fn post_send(side: &mut Side, wr_id: u64, buf: engine_common::Buf, len: u32) {
    let wr = SendWr::send(
        wr_id,
        SgeList::single(Sge {
            addr: buf.va,
            length: len,
            lkey: buf.stag,
        }),
    );
    side.ep.qp_mut().post_send(&wr, side.dev.mrs()).unwrap();
}

fn no_terminate(side: &Side) {
    assert!(
        !side
            .events
            .iter()
            .any(|e| matches!(e, EngineEvent::Terminated { .. })),
        "{}: {:?}",
        side.name,
        side.events
    );
}

/// The ULPDU of a logged record (CRC on, no markers: length field, ULPDU,
/// pad, CRC).
fn ulpdu(record: &[u8]) -> &[u8] {
    let len = usize::from(u16::from_be_bytes([record[0], record[1]]));
    &record[2..2 + len]
}

#[test]
fn stranded_first_send_is_nudged_after_the_delay() {
    let setup = Setup::default();
    let mut p = connected_pair(1, setup, NUDGE);
    let mut rng = engine_common::Rng::new(1);
    let src = p.a.buffer(40, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let dst = p.b.buffer(64, 0x2000, Access::LOCAL_WRITE, None);
    let back_src = p.b.buffer(16, 0x3000, Access::LOCAL_WRITE, Some(&mut rng));
    let back_dst = p.a.buffer(64, 0x4000, Access::LOCAL_WRITE, None);
    post_recv(&mut p.b, 10, dst);
    post_recv(&mut p.a, 20, back_dst);
    // rping's client: one Send of its buffer advertisement, then it waits.
    post_send(&mut p.a, 1, src, 40);
    let mut strand = Strand::new(false);
    let t0 = Duration::from_millis(1000);
    run(&mut p, &mut strand, t0, t0 + NUDGE - 10 * MS, 10 * MS);
    assert_eq!(strand.segments, 1, "the Send went out alone");
    assert!(!p.a.ep.nudge_sent(), "nudged before the delay");
    assert!(
        p.b.completions.is_empty(),
        "the responder read a stranded FPDU"
    );
    run(
        &mut p,
        &mut strand,
        t0 + NUDGE,
        t0 + NUDGE + 20 * MS,
        10 * MS,
    );
    assert!(p.a.ep.nudge_sent(), "no nudge after {NUDGE:?} of silence");
    let log = p.a.log.as_ref().unwrap();
    assert_eq!(log.len(), 2, "the Send and the nudge");
    assert_eq!(ulpdu(&log[1].1), nudge_ulpdu().as_bytes());
    // The nudge's arrival made the responder read both: the Send
    // completed there, the zero-length Write did nothing.
    assert_eq!(p.b.completions.len(), 1, "{:?}", p.b.completions);
    assert_eq!(p.b.completions[0].wr_id, 10);
    assert_eq!(p.b.completions[0].byte_len, 40);
    assert_eq!(p.b.bytes(&dst)[..40], p.a.bytes(&src)[..]);
    let write = RdmapOpcode::RdmaWrite as usize;
    assert_eq!(p.b.ep.stats().fpdus_in[write], 1);
    assert_eq!(p.b.ep.stats().bytes_placed, 40);
    no_terminate(&p.b);
    // The conversation goes on; there is never a second nudge.
    post_send(&mut p.b, 2, back_src, 16);
    run(&mut p, &mut strand, t0 + 300 * MS, t0 + 2000 * MS, 50 * MS);
    assert!(p
        .a
        .completions
        .iter()
        .any(|c| c.wr_id == 20 && c.opcode == WcOpcode::Recv && c.byte_len == 16));
    assert!(p
        .a
        .completions
        .iter()
        .any(|c| c.wr_id == 1 && c.status == WcStatus::Success));
    assert_eq!(p.a.ep.stats().nudges, 1);
    assert_eq!(p.a.ep.poll_timeout(), None);
    no_terminate(&p.a);
    no_terminate(&p.b);
    eprintln!(
        "nudge after {NUDGE:?}: {} initiator records, responder completions {}",
        p.a.log.as_ref().unwrap().len(),
        p.b.completions.len()
    );
}

#[test]
fn no_nudge_when_the_responder_answers_in_time() {
    let setup = Setup::default();
    let mut p = connected_pair(2, setup, NUDGE);
    let mut rng = engine_common::Rng::new(2);
    let src = p.a.buffer(40, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let dst = p.b.buffer(64, 0x2000, Access::LOCAL_WRITE, None);
    let back_src = p.b.buffer(16, 0x3000, Access::LOCAL_WRITE, Some(&mut rng));
    let back_dst = p.a.buffer(64, 0x4000, Access::LOCAL_WRITE, None);
    post_recv(&mut p.b, 10, dst);
    post_recv(&mut p.a, 20, back_dst);
    post_send(&mut p.a, 1, src, 40);
    let mut strand = Strand::new(true);
    let t0 = Duration::from_millis(5);
    run(&mut p, &mut strand, t0, t0 + 50 * MS, 10 * MS);
    assert_eq!(p.b.completions.len(), 1);
    // The responder answers after 60 ms, well within the delay.
    post_send(&mut p.b, 2, back_src, 16);
    run(&mut p, &mut strand, t0 + 60 * MS, t0 + 3000 * MS, 20 * MS);
    assert!(p.a.completions.iter().any(|c| c.wr_id == 20));
    assert!(!p.a.ep.nudge_sent());
    assert_eq!(p.a.log.as_ref().unwrap().len(), 1, "only the Send");
    assert_eq!(p.a.ep.poll_timeout(), None, "no timer left");
}

#[test]
fn disabled_nudge_leaves_the_stranded_send_unread() {
    let setup = Setup::default();
    let mut p = connected_pair(3, setup, Duration::ZERO);
    let mut rng = engine_common::Rng::new(3);
    let src = p.a.buffer(40, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let dst = p.b.buffer(64, 0x2000, Access::LOCAL_WRITE, None);
    post_recv(&mut p.b, 10, dst);
    post_send(&mut p.a, 1, src, 40);
    let mut strand = Strand::new(false);
    run(&mut p, &mut strand, Duration::ZERO, 3000 * MS, 50 * MS);
    assert!(!p.a.ep.nudge_sent());
    assert_eq!(p.a.ep.poll_timeout(), None);
    assert_eq!(strand.segments, 1);
    assert!(
        p.b.completions.is_empty(),
        "the stall this nudge exists for"
    );
}

#[test]
fn stranded_read_rtr_is_nudged_and_answered() {
    // The F3 case: a Read RTR alone, and the initiator rightly waits for
    // its Read Response before anything else.
    let setup = Setup {
        rtr: Some(RtrType::Read),
        ..Setup::default()
    };
    let mut p = connected_pair(4, setup, NUDGE);
    let mut rng = engine_common::Rng::new(4);
    let src = p.a.buffer(100, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let dst = p.b.buffer(128, 0x2000, Access::LOCAL_WRITE, None);
    post_recv(&mut p.b, 10, dst);
    post_send(&mut p.a, 1, src, 100);
    let mut strand = Strand::new(false);
    run(&mut p, &mut strand, Duration::ZERO, 150 * MS, 10 * MS);
    assert_eq!(
        strand.segments, 1,
        "the Read RTR alone (the Send waits for its Response)"
    );
    assert!(p.b.completions.is_empty());
    run(&mut p, &mut strand, 160 * MS, 1000 * MS, 10 * MS);
    assert!(p.a.ep.nudge_sent());
    let log = p.a.log.as_ref().unwrap();
    assert_eq!(ulpdu(&log[1].1), nudge_ulpdu().as_bytes());
    // The responder took the RTR, answered it, and the Send followed.
    assert_eq!(p.b.completions.len(), 1, "{:?}", p.b.completions);
    assert_eq!(p.b.completions[0].byte_len, 100);
    assert_eq!(p.b.bytes(&dst)[..100], p.a.bytes(&src)[..]);
    assert_eq!(p.a.ep.stats().nudges, 1);
    no_terminate(&p.a);
    no_terminate(&p.b);
}

#[test]
fn zero_length_writes_are_taken_without_a_terminate() {
    // CRC off so that FPDUs can be written by hand: length, ULPDU, no pad
    // (14 + 2 octets), a CRC field of zeros.
    let setup = Setup {
        crc: false,
        ..Setup::default()
    };
    let mut p = connected_pair(5, setup, Duration::ZERO);
    let mut rng = engine_common::Rng::new(5);
    let src = p.a.buffer(40, 0x1000, Access::LOCAL_WRITE, Some(&mut rng));
    let dst =
        p.b.buffer(64, 0x2000, Access::LOCAL_WRITE | Access::REMOTE_WRITE, None);
    post_recv(&mut p.b, 10, dst);
    // The initiator's first FPDU, so that the responder is in FPDU mode.
    post_send(&mut p.a, 1, src, 40);
    p.run_until(100, |p| p.b.completions.len() == 1);
    // Zero-length last Writes: the nudge's STag 1, STag 0, a STag that
    // names nothing at a TO far out, and one of the responder's own
    // regions, which must stay untouched.
    let before = p.b.bytes(&dst).to_vec();
    for (stag, to) in [
        (1u32, 0u64),
        (0, 0),
        (0xdead_beef, u64::MAX),
        (dst.stag.0, dst.va + 8),
    ] {
        let mut fpdu = vec![0u8, 14, 0xc1, 0x40];
        fpdu.extend_from_slice(&stag.to_be_bytes());
        fpdu.extend_from_slice(&to.to_be_bytes());
        fpdu.extend_from_slice(&[0; 4]);
        p.b.with_env(|ep, env| ep.handle_stream(Duration::ZERO, &fpdu, env));
        p.b.drain();
    }
    no_terminate(&p.b);
    assert!(!p.b.ep.is_terminated());
    assert_eq!(
        p.b.completions.len(),
        1,
        "a zero-length Write completes nothing"
    );
    assert_eq!(p.b.bytes(&dst), &before[..]);
    assert_eq!(p.b.ep.stats().fpdus_in[RdmapOpcode::RdmaWrite as usize], 4);
}

/// siw's `ib_read_bw -R` server replies IRD 16 / ORD 0: it answers up to
/// 16 Reads and issues none. Our ORD is capped at its IRD (16).
fn reads_against_ird16_ord0(rtr: Option<RtrType>, seed: u64) {
    let setup = Setup {
        rtr,
        ird: 16,
        ord: 16,
        ..Setup::default()
    };
    let mut p = Pair::new(seed, setup, 1460);
    let responder = Config {
        ird: 16,
        ord: 0,
        ..engine_common::config(&setup)
    };
    reconfigure(&mut p.b, responder, false);
    p.b.log = Some(Vec::new());
    p.connect();
    // The reply's IRD/ORD words after the 20-octet frame header, the P
    // bit and RTR flags aside: IRD 16, ORD 0.
    let reply = p.b.log.as_ref().unwrap()[0].1.clone();
    assert_eq!(&reply[..16], b"MPA ID Rep Frame");
    let words = [reply[20] & 0x3f, reply[21], reply[22] & 0x3f, reply[23]];
    assert_eq!(words, [0x00, 0x10, 0x00, 0x00]);
    let n = p.a.ep.negotiated().unwrap().clone();
    assert_eq!((n.peer_ird, n.peer_ord), (Some(16), Some(0)));
    assert_eq!(n.ord, 16, "our ORD capped at the peer's IRD, not its ORD");
    assert_eq!(p.a.ep.qp().ord(), 16);
    assert_eq!(p.b.ep.negotiated().unwrap().ird, 16);

    const SIZE: usize = 64 * 1024;
    const READS: usize = 40;
    let mut rng = engine_common::Rng::new(seed);
    let src = p.b.buffer(
        2 * SIZE,
        0x10_0000,
        Access::LOCAL_WRITE | Access::REMOTE_READ,
        Some(&mut rng),
    );
    let sink =
        p.a.buffer(READS * SIZE, 0x100_0000, Access::LOCAL_WRITE, None);
    for i in 0..READS {
        // perftest reads the same remote buffer over and over; here two
        // halves alternate.
        let off = (i % 2) * SIZE;
        let wr = SendWr::read(
            i as u64,
            Sge {
                addr: sink.addr(i * SIZE),
                length: SIZE as u32,
                lkey: sink.stag,
            },
            src.addr(off),
            src.stag,
        );
        p.a.ep.qp_mut().post_send(&wr, p.a.dev.mrs()).unwrap();
    }
    p.run_until(200_000, |p| p.a.completions.len() == READS);
    for (i, c) in p.a.completions.iter().enumerate() {
        assert_eq!(
            (c.wr_id, c.opcode, c.status, c.byte_len as usize),
            (i as u64, WcOpcode::RdmaRead, WcStatus::Success, SIZE)
        );
    }
    let src_bytes = p.b.bytes(&src).to_vec();
    let sink_bytes = p.a.bytes(&sink);
    for i in 0..READS {
        let off = (i % 2) * SIZE;
        assert!(
            sink_bytes[i * SIZE..(i + 1) * SIZE] == src_bytes[off..off + SIZE],
            "Read {i}: wrong bytes"
        );
    }
    no_terminate(&p.a);
    no_terminate(&p.b);
    p.a.check_guards();
    let rreq = RdmapOpcode::ReadRequest as usize;
    assert_eq!(p.b.ep.stats().fpdus_in[rreq], READS as u64);
    eprintln!(
        "IRD 16 / ORD 0 responder, rtr {rtr:?}: {READS} Reads of {SIZE} B verified, \
         our ORD {}",
        p.a.ep.qp().ord()
    );
}

#[test]
fn reads_of_64k_against_a_responder_with_ord_0() {
    reads_against_ird16_ord0(None, 6);
}

#[test]
fn reads_of_64k_against_a_responder_with_ord_0_peer_to_peer() {
    reads_against_ird16_ord0(Some(RtrType::Write), 7);
}

#[test]
fn default_config_nudges_after_200_ms() {
    assert_eq!(Config::default().nudge_after, NUDGE);
    assert_eq!(
        Config {
            rtr_offer: RtrSet::NONE,
            ..Config::default()
        }
        .nudge_after,
        NUDGE
    );
}
