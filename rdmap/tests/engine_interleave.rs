//! Interleaved messages on the receive path, and the peer's Terminate about
//! a request that has already completed.
//!
//! A peer may put whole Sends, or segments of other messages, between the
//! segments of a tagged message (Chelsio's adapters do), and DDP places
//! each tagged segment on its own, so RDMA Write segments may arrive with
//! their tagged offsets in any order (RFC 5041 §5, data transfer).
//! The engine keeps the untagged Send being reassembled into a receive
//! buffer apart from the tagged state (the Read Response being placed into
//! its sink; Writes carry none). Each test connects the engine, as
//! responder, to a raw peer (an MPA negotiator and a framer driven by
//! hand), feeds crafted FPDUs whole, an octet at a time and in random
//! chunks, with and without markers, and checks every byte of every
//! region, the completions, and that no Terminate is sent.
//!
//! The last tests cover the blame rule of a peer's Terminate (RFC 5040
//! §4.8): headers that name one of our Writes (or Reads) exactly never
//! fall back to the next request of the same kind when the named one has
//! already completed.

mod engine_common;

use core::time::Duration;

use engine_common::{terminated, Buf, Rng, Setup, Side};
use rdmap::engine::{EngineEvent, OutRecord, RecordKind, TerminateOrigin};
use rdmap::error::TerminateCause as C;
use rdmap::mpa::{Config, DeframeEvent, Deframer, Event, Framer, Negotiator, RtrSet};
use rdmap::verbs::{
    Access, QpState, RecvWr, SendWr, Sge, SgeList, Stag, WcOpcode, WcStatus, WorkCompletion,
};
use rdmap::wire::{DdpRepr, RdmapOpcode, ReadRequest, TerminateMessage, TerminateRepr};

const VA_W1: u64 = 0x1000_0000;
const VA_W2: u64 = 0x2000_0000;
const VA_RB: u64 = 0x3000_0000;
const VA_RB2: u64 = 0x3800_0000;
const VA_SRC: u64 = 0x4000_0000;
const VA_SINK: u64 = 0x5000_0000;
const LEN: usize = 1024;

/// The engine under test (the responder) and its registered buffers.
struct Target {
    side: Side,
    /// Remote write.
    w1: Buf,
    /// Remote write, a second region.
    w2: Buf,
    /// Receive buffer (local write).
    rb: Buf,
    /// A second receive buffer, for two-SGE receives.
    rb2: Buf,
    /// Source of our Writes (random contents).
    src: Buf,
    /// Sink of our Reads (local write).
    sink: Buf,
}

/// The peer: MPA setup by a negotiator, then FPDUs framed by hand.
struct Peer {
    framer: Framer,
    /// Reads what the target sends.
    deframer: Deframer,
}

/// How the wire bytes are handed to the engine.
#[derive(Debug, Clone, Copy)]
enum Chunks {
    Whole,
    Octets,
    Random(u64),
}

/// Every way each case is fed: markers off and on, in several chunkings.
fn variants() -> Vec<(bool, Chunks)> {
    let mut v = Vec::new();
    for markers in [false, true] {
        v.push((markers, Chunks::Whole));
        v.push((markers, Chunks::Octets));
        for seed in 0..4 {
            v.push((markers, Chunks::Random(seed)));
        }
    }
    v
}

fn connect(markers: bool) -> (Target, Peer) {
    let setup = Setup {
        markers,
        ..Setup::default()
    };
    let mut side = Side::new("target", 11, &setup, false);
    let mut rng = Rng::new(5);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let w1 = side.buffer(LEN, VA_W1, rw, None);
    let w2 = side.buffer(LEN, VA_W2, rw, None);
    let rb = side.buffer(LEN, VA_RB, Access::LOCAL_WRITE, None);
    let rb2 = side.buffer(LEN, VA_RB2, Access::LOCAL_WRITE, None);
    let src = side.buffer(LEN, VA_SRC, Access::LOCAL_WRITE, Some(&mut rng));
    let sink = side.buffer(LEN, VA_SINK, Access::LOCAL_WRITE, None);

    let peer_cfg = Config {
        rtr_offer: RtrSet::NONE,
        markers_wanted: markers,
        ..Config::default()
    };
    let mut neg = Negotiator::initiator(peer_cfg, &[], Duration::ZERO).unwrap();
    let req = neg.poll_transmit().unwrap().to_vec();
    side.with_env(|ep, env| ep.handle_stream(Duration::ZERO, &req, env));
    side.drain();
    assert_eq!(side.events[0], EngineEvent::ConnectRequest);
    let mut t = Target {
        side,
        w1,
        w2,
        rb,
        rb2,
        src,
        sink,
    };
    let mut reply = Vec::new();
    for r in t.records() {
        assert_eq!(
            r.kind(),
            RecordKind::MpaFrame,
            "nothing before the first FPDU"
        );
        reply.extend(r.to_vec(&t.side.mem));
        t.side.with_env(|ep, env| ep.record_acked(r, env));
    }
    assert_eq!(neg.handle_input(&reply, Duration::ZERO), reply.len());
    let Some(Event::Negotiated(n)) = neg.poll_event() else {
        panic!("peer did not negotiate");
    };
    assert_eq!(n.framing.markers_rx, markers);
    t.side.drain();
    assert!(engine_common::connected(&t.side.events));
    assert_eq!(t.side.ep.qp().state(), QpState::Rts);
    let peer = Peer {
        framer: Framer::from_framing(&n.framing),
        deframer: Deframer::new(n.framing.crc, n.framing.markers_rx, u16::MAX),
    };
    (t, peer)
}

impl Target {
    /// Every record the engine has to send now, unacknowledged.
    fn records(&mut self) -> Vec<OutRecord> {
        let mut out = Vec::new();
        while let Some(r) = self.side.with_env(|ep, env| ep.poll_record(1460, env)) {
            out.push(r);
        }
        out
    }

    fn feed(&mut self, bytes: &[u8], chunks: Chunks) {
        let mut rng = Rng::new(match chunks {
            Chunks::Random(s) => s,
            _ => 0,
        });
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = match chunks {
                Chunks::Whole => rest.len(),
                Chunks::Octets => 1,
                Chunks::Random(_) => rng.range(1, 97),
            }
            .min(rest.len());
            self.side
                .with_env(|ep, env| ep.handle_stream(Duration::ZERO, &rest[..n], env));
            rest = &rest[n..];
        }
        self.side.drain();
    }

    fn post_recv(&mut self, wr_id: u64, sges: &[(Buf, u32)]) {
        let sges: Vec<Sge> = sges
            .iter()
            .map(|&(b, length)| Sge {
                addr: b.va,
                length,
                lkey: b.stag,
            })
            .collect();
        let wr = RecvWr {
            wr_id,
            sges: SgeList::new(&sges).unwrap(),
        };
        self.side.ep.qp_mut().post_recv(&wr).unwrap();
    }

    fn post_send(&mut self, wr: SendWr) {
        self.side
            .ep
            .qp_mut()
            .post_send(&wr, self.side.dev.mrs())
            .unwrap();
    }

    /// The peer's first FPDU (an empty Write) lets the responder speak.
    fn let_speak(&mut self, peer: &mut Peer) {
        let w = tagged(RdmapOpcode::RdmaWrite, true, self.w1.stag, VA_W1, &[]);
        let fpdu = peer.framer.build_fpdu(&w, &[]).unwrap();
        self.feed(&fpdu, Chunks::Whole);
    }

    /// The connection is still up: no Terminate either way, nothing to
    /// send, the queue pair in Rts, every guard intact, no pin left.
    fn assert_healthy(&mut self, what: &str) {
        assert!(
            !terminated(&self.side.events),
            "{what}: {:?}",
            self.side.events
        );
        let out = self.records();
        assert!(
            out.is_empty(),
            "{what}: the engine sent {} records",
            out.len()
        );
        assert_eq!(self.side.ep.qp().state(), QpState::Rts, "{what}");
        self.side.check_guards();
        assert_eq!(self.side.pins(), 0, "{what}");
    }

    fn completion(&self, wr_id: u64) -> &WorkCompletion {
        let found: Vec<_> = self
            .side
            .completions
            .iter()
            .filter(|c| c.wr_id == wr_id)
            .collect();
        assert_eq!(found.len(), 1, "{wr_id}: {:?}", self.side.completions);
        found[0]
    }
}

fn tagged(opcode: RdmapOpcode, last: bool, stag: Stag, to: u64, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0; 14 + payload.len()];
    DdpRepr::tagged(opcode, last, stag.0, to).emit(&mut b);
    b[14..].copy_from_slice(payload);
    b
}

fn write(last: bool, buf: &Buf, off: usize, payload: &[u8]) -> Vec<u8> {
    tagged(
        RdmapOpcode::RdmaWrite,
        last,
        buf.stag,
        buf.addr(off),
        payload,
    )
}

fn send(msn: u32, mo: u32, last: bool, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0; 18 + payload.len()];
    DdpRepr::untagged(RdmapOpcode::Send, last, msn, mo).emit(&mut b);
    b[18..].copy_from_slice(payload);
    b
}

fn wire(peer: &mut Peer, ulpdus: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for u in ulpdus {
        out.extend(peer.framer.build_fpdu(u, &[]).unwrap());
    }
    out
}

/// ULPDUs in `bytes` (the target's output).
fn deframe(d: &mut Deframer, bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for ev in d.feed(bytes) {
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

fn random(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    Rng::new(seed).fill(&mut v);
    v
}

/// What a buffer's `LEN` octets should hold: zeros, with `parts`
/// (offset, bytes) laid in, later parts over earlier ones.
fn image(parts: &[(usize, &[u8])]) -> Vec<u8> {
    let mut v = vec![0; LEN];
    for &(at, b) in parts {
        v[at..at + b.len()].copy_from_slice(b);
    }
    v
}

#[test]
fn a_send_between_the_segments_of_a_write() {
    let data = random(1, 250);
    let msg = random(2, 50);
    for (markers, chunks) in variants() {
        let what = format!("markers {markers}, {chunks:?}");
        let (mut t, mut peer) = connect(markers);
        t.post_recv(1, &[(t.rb, 256)]);
        let w1 = t.w1;
        let bytes = wire(
            &mut peer,
            &[
                write(false, &w1, 0, &data[..100]),
                send(1, 0, true, &msg),
                write(true, &w1, 100, &data[100..]),
            ],
        );
        t.feed(&bytes, chunks);
        assert_eq!(t.side.bytes(&t.w1), image(&[(0, &data)]), "{what}");
        assert_eq!(t.side.bytes(&t.rb), image(&[(0, &msg)]), "{what}");
        let c = *t.completion(1);
        assert_eq!(
            (c.opcode, c.status, c.byte_len),
            (WcOpcode::Recv, WcStatus::Success, 50),
            "{what}"
        );
        assert_eq!(t.side.completions.len(), 1, "{what}");
        assert_eq!(t.side.ep.stats().bytes_placed, 300, "{what}");
        // Chunks that ended inside an FPDU: none when the three FPDUs came
        // whole, all but the three that ended one when octet by octet.
        let split = t.side.ep.stats().chunks_mid_fpdu;
        match chunks {
            Chunks::Whole => assert_eq!(split, 0, "{what}"),
            Chunks::Octets => assert_eq!(split as usize, bytes.len() - 3, "{what}"),
            Chunks::Random(_) => assert!(split > 0, "{what}"),
        }
        t.assert_healthy(&what);
    }
}

#[test]
fn a_multi_segment_send_interleaved_with_writes_to_two_stags() {
    let a = random(3, 300);
    let b = random(4, 200);
    let msg = random(5, 180);
    let after = random(6, 10);
    for (markers, chunks) in variants() {
        let what = format!("markers {markers}, {chunks:?}");
        let (mut t, mut peer) = connect(markers);
        // The message crosses from one SGE into the next (at 100).
        t.post_recv(1, &[(t.rb, 100), (t.rb2, 100)]);
        t.post_recv(2, &[(t.rb, 64)]);
        let (w1, w2) = (t.w1, t.w2);
        let bytes = wire(
            &mut peer,
            &[
                write(false, &w1, 0, &a[..100]),
                send(1, 0, false, &msg[..60]),
                write(false, &w2, 0, &b[..80]),
                write(false, &w1, 100, &a[100..200]),
                send(1, 60, false, &msg[60..130]),
                write(true, &w2, 80, &b[80..]),
                send(1, 130, true, &msg[130..]),
                write(true, &w1, 200, &a[200..]),
                // The next Send takes the next buffer.
                send(2, 0, true, &after),
            ],
        );
        t.feed(&bytes, chunks);
        assert_eq!(t.side.bytes(&t.w1), image(&[(0, &a)]), "{what}");
        assert_eq!(t.side.bytes(&t.w2), image(&[(0, &b)]), "{what}");
        // The second receive overwrote the first one's opening octets.
        assert_eq!(
            t.side.bytes(&t.rb),
            image(&[(0, &msg[..100]), (0, &after)]),
            "{what}"
        );
        assert_eq!(t.side.bytes(&t.rb2), image(&[(0, &msg[100..])]), "{what}");
        let c = *t.completion(1);
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 180), "{what}");
        let c = *t.completion(2);
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 10), "{what}");
        assert_eq!(
            t.side
                .completions
                .iter()
                .map(|c| c.wr_id)
                .collect::<Vec<_>>(),
            [1, 2],
            "{what}"
        );
        t.assert_healthy(&what);
    }
}

/// Posts a Read of `len` into the sink, lets it out, and returns the
/// Read Request the peer sees.
fn post_read(t: &mut Target, peer: &mut Peer, wr_id: u64, len: u32) -> ReadRequest {
    let sink = Sge {
        addr: t.sink.va,
        length: len,
        lkey: t.sink.stag,
    };
    t.post_send(SendWr::read(wr_id, sink, 0x9900_0000, Stag(0x0042_4200)));
    let mut ulpdus = Vec::new();
    for r in t.records() {
        let bytes = r.to_vec(&t.side.mem);
        ulpdus.extend(deframe(&mut peer.deframer, &bytes));
        t.side.with_env(|ep, env| ep.record_acked(r, env));
    }
    assert_eq!(ulpdus.len(), 1);
    let rr = ReadRequest::parse_bytes(&ulpdus[0][18..]).unwrap();
    assert_eq!((rr.sink_to, rr.size), (t.sink.va, len));
    rr
}

fn read_response(last: bool, rr: &ReadRequest, off: usize, payload: &[u8]) -> Vec<u8> {
    tagged(
        RdmapOpcode::ReadResponse,
        last,
        Stag(rr.sink_stag),
        rr.sink_to + off as u64,
        payload,
    )
}

#[test]
fn a_read_response_interleaved_with_sends() {
    let data = random(7, 300);
    let m1 = random(8, 70);
    let m2 = random(9, 20);
    for (markers, chunks) in variants() {
        let what = format!("markers {markers}, {chunks:?}");
        let (mut t, mut peer) = connect(markers);
        t.let_speak(&mut peer);
        t.post_recv(1, &[(t.rb, 128)]);
        t.post_recv(2, &[(t.rb2, 128)]);
        let rr = post_read(&mut t, &mut peer, 30, 300);
        let bytes = wire(
            &mut peer,
            &[
                read_response(false, &rr, 0, &data[..100]),
                send(1, 0, false, &m1[..40]),
                read_response(false, &rr, 100, &data[100..200]),
                // A whole Send inside the other one's gap and the Response.
                send(1, 40, true, &m1[40..]),
                send(2, 0, true, &m2),
                read_response(true, &rr, 200, &data[200..]),
            ],
        );
        t.feed(&bytes, chunks);
        assert_eq!(t.side.bytes(&t.sink), image(&[(0, &data)]), "{what}");
        assert_eq!(t.side.bytes(&t.rb), image(&[(0, &m1)]), "{what}");
        assert_eq!(t.side.bytes(&t.rb2), image(&[(0, &m2)]), "{what}");
        let c = *t.completion(30);
        assert_eq!(
            (c.opcode, c.status, c.byte_len),
            (WcOpcode::RdmaRead, WcStatus::Success, 300),
            "{what}"
        );
        let c = *t.completion(1);
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 70), "{what}");
        let c = *t.completion(2);
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 20), "{what}");
        assert_eq!(t.side.completions.len(), 3, "{what}");
        t.assert_healthy(&what);
    }
}

#[test]
fn a_read_response_interleaved_with_a_send_and_writes() {
    let data = random(10, 256);
    let msg = random(11, 90);
    let wd = random(12, 64);
    for (markers, chunks) in variants() {
        let what = format!("markers {markers}, {chunks:?}");
        let (mut t, mut peer) = connect(markers);
        t.let_speak(&mut peer);
        t.post_recv(1, &[(t.rb, 128)]);
        let rr = post_read(&mut t, &mut peer, 31, 256);
        let w2 = t.w2;
        let bytes = wire(
            &mut peer,
            &[
                send(1, 0, false, &msg[..30]),
                read_response(false, &rr, 0, &data[..128]),
                write(false, &w2, 32, &wd[32..]),
                send(1, 30, false, &msg[30..60]),
                write(true, &w2, 0, &wd[..32]),
                read_response(true, &rr, 128, &data[128..]),
                send(1, 60, true, &msg[60..]),
            ],
        );
        t.feed(&bytes, chunks);
        assert_eq!(t.side.bytes(&t.sink), image(&[(0, &data)]), "{what}");
        assert_eq!(t.side.bytes(&t.rb), image(&[(0, &msg)]), "{what}");
        assert_eq!(t.side.bytes(&t.w2), image(&[(0, &wd)]), "{what}");
        let c = *t.completion(31);
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 256), "{what}");
        let c = *t.completion(1);
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 90), "{what}");
        assert_eq!(t.side.completions.len(), 2, "{what}");
        t.assert_healthy(&what);
    }
}

#[test]
fn write_segments_out_of_offset_order() {
    let a = random(13, 400);
    let b = random(14, 300);
    let msg = random(15, 33);
    for (markers, chunks) in variants() {
        let what = format!("markers {markers}, {chunks:?}");
        let (mut t, mut peer) = connect(markers);
        t.post_recv(1, &[(t.rb, 64)]);
        let (w1, w2) = (t.w1, t.w2);
        let bytes = wire(
            &mut peer,
            &[
                // Message a in the order 2, 0, 3 (last), 1.
                write(false, &w1, 200, &a[200..300]),
                write(false, &w1, 0, &a[..100]),
                write(true, &w1, 300, &a[300..]),
                // Message b backwards, its last segment first, with a
                // Send among them.
                write(true, &w2, 200, &b[200..]),
                write(false, &w2, 100, &b[100..200]),
                send(1, 0, true, &msg),
                write(false, &w2, 0, &b[..100]),
                write(false, &w1, 100, &a[100..200]),
            ],
        );
        t.feed(&bytes, chunks);
        assert_eq!(t.side.bytes(&t.w1), image(&[(0, &a)]), "{what}");
        assert_eq!(t.side.bytes(&t.w2), image(&[(0, &b)]), "{what}");
        assert_eq!(t.side.bytes(&t.rb), image(&[(0, &msg)]), "{what}");
        let c = *t.completion(1);
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 33), "{what}");
        assert_eq!(t.side.completions.len(), 1, "{what}");
        assert_eq!(t.side.ep.stats().bytes_placed, 733, "{what}");
        t.assert_healthy(&what);
    }
}

// ---- The blame rule of a peer's Terminate ------------------------------

/// The peer's Terminate for `cause`, reporting the segment `offending`.
fn terminate_fpdu(peer: &mut Peer, cause: C, offending: &[u8]) -> Vec<u8> {
    let term = TerminateMessage {
        msn: 1,
        header: TerminateRepr::for_segment(cause, Some(offending)),
    };
    assert!(
        term.header.ddp_header.is_some(),
        "the report names a segment"
    );
    let mut buf = [0u8; 96];
    let n = term.emit(&mut buf);
    peer.framer.build_fpdu(&buf[..n], &[]).unwrap()
}

/// Write A (to an STag the peer does not know) completes before the peer's
/// Terminate about it arrives; Write B, valid and still in flight, is
/// flushed, not blamed.
#[test]
fn a_terminate_about_a_completed_write_spares_the_next_write() {
    for (markers, chunks) in variants() {
        let what = format!("markers {markers}, {chunks:?}");
        let (mut t, mut peer) = connect(markers);
        t.let_speak(&mut peer);
        let src = |off: u64| {
            SgeList::single(Sge {
                addr: VA_SRC + off,
                length: 100,
                lkey: t.src.stag,
            })
        };
        let (sa, sb) = (src(0), src(100));
        t.post_send(SendWr::write(40, sa, 0x6600_0000, Stag(0x00de_ad00)));
        t.post_send(SendWr::write(41, sb, 0x7700_0000, Stag(0x0011_2200)));
        let mut held = t.records();
        assert_eq!(held.len(), 2, "{what}: one record per Write");
        let a_bytes = held[0].to_vec(&t.side.mem);
        let a_ulpdus = deframe(&mut peer.deframer, &a_bytes);
        assert_eq!(a_ulpdus.len(), 1, "{what}");
        let a_first = &a_ulpdus[0];
        assert_eq!(
            DdpRepr::parse_ulpdu(a_first).unwrap().0,
            DdpRepr::tagged(RdmapOpcode::RdmaWrite, true, 0x00de_ad00, 0x6600_0000),
            "{what}"
        );
        // A's record is acknowledged: A completes.
        let a = held.remove(0);
        t.side.with_env(|ep, env| ep.record_acked(a, env));
        t.side.drain();
        assert_eq!(
            t.side
                .completions
                .iter()
                .map(|c| (c.wr_id, c.status))
                .collect::<Vec<_>>(),
            [(40, WcStatus::Success)],
            "{what}"
        );

        let term = terminate_fpdu(&mut peer, C::DDP_TAGGED_INVALID_STAG, a_first);
        t.feed(&term, chunks);
        for r in held {
            t.side.ep.record_dropped(r, &mut t.side.dev);
        }
        t.side.drain();
        assert_eq!(
            t.side.events[t.side.events.len() - 2..],
            [
                EngineEvent::Terminated {
                    cause: Some(C::DDP_TAGGED_INVALID_STAG),
                    origin: TerminateOrigin::Peer
                },
                EngineEvent::ReadyToClose
            ],
            "{what}"
        );
        assert_eq!(t.side.ep.qp().state(), QpState::Error, "{what}");
        assert_eq!(
            t.side
                .completions
                .iter()
                .map(|c| (c.wr_id, c.status))
                .collect::<Vec<_>>(),
            [(40, WcStatus::Success), (41, WcStatus::WrFlushError)],
            "{what}: the innocent Write was blamed"
        );
        assert!(t.records().is_empty(), "{what}: no Terminate answers one");
        assert_eq!(t.side.pins(), 0, "{what}");
    }
}

/// While the faulty Write is still in flight, the same Terminate does name
/// it, and the Write after it is flushed.
#[test]
fn a_terminate_about_a_write_in_flight_blames_that_write() {
    let (mut t, mut peer) = connect(false);
    t.let_speak(&mut peer);
    for (id, off, rkey) in [(40, 0, 0x00de_ad00), (41, 100, 0x0011_2200)] {
        let sges = SgeList::single(Sge {
            addr: VA_SRC + off,
            length: 100,
            lkey: t.src.stag,
        });
        t.post_send(SendWr::write(id, sges, 0x6600_0000 + off, Stag(rkey)));
    }
    let held = t.records();
    assert_eq!(held.len(), 2);
    let a_ulpdus = deframe(&mut peer.deframer, &held[0].to_vec(&t.side.mem));
    let term = terminate_fpdu(&mut peer, C::DDP_TAGGED_INVALID_STAG, &a_ulpdus[0]);
    t.feed(&term, Chunks::Whole);
    for r in held {
        t.side.ep.record_dropped(r, &mut t.side.dev);
    }
    t.side.drain();
    assert_eq!(
        t.side
            .completions
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect::<Vec<_>>(),
        [
            (40, WcStatus::from_terminate(C::DDP_TAGGED_INVALID_STAG)),
            (41, WcStatus::WrFlushError)
        ]
    );
    assert_ne!(
        WcStatus::from_terminate(C::DDP_TAGGED_INVALID_STAG),
        WcStatus::WrFlushError
    );
    assert_eq!(t.side.pins(), 0);
}

/// Read A's Response arrived (A completed) before the peer's Terminate
/// reporting A's Read Request; Read B, still outstanding, is flushed.
#[test]
fn a_terminate_about_a_completed_read_spares_the_next_read() {
    let data = random(16, 64);
    let (mut t, mut peer) = connect(false);
    t.let_speak(&mut peer);
    let sink = |off: u64| Sge {
        addr: VA_SINK + off,
        length: 64,
        lkey: t.sink.stag,
    };
    let (ka, kb) = (sink(0), sink(64));
    t.post_send(SendWr::read(50, ka, 0x6600_0000, Stag(0x0033_4400)));
    t.post_send(SendWr::read(51, kb, 0x6600_0000, Stag(0x0055_6600)));
    let mut requests = Vec::new();
    for r in t.records() {
        requests.extend(deframe(&mut peer.deframer, &r.to_vec(&t.side.mem)));
        t.side.with_env(|ep, env| ep.record_acked(r, env));
    }
    assert_eq!(requests.len(), 2);
    let rr_a = ReadRequest::parse_bytes(&requests[0][18..]).unwrap();
    assert_eq!(rr_a.source_stag, 0x0033_4400);
    let resp = wire(&mut peer, &[read_response(true, &rr_a, 0, &data)]);
    t.feed(&resp, Chunks::Whole);
    assert_eq!(
        t.side
            .completions
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect::<Vec<_>>(),
        [(50, WcStatus::Success)]
    );
    let term = terminate_fpdu(&mut peer, C::RDMAP_PROT_INVALID_STAG, &requests[0]);
    t.feed(&term, Chunks::Whole);
    assert!(t.side.events.contains(&EngineEvent::Terminated {
        cause: Some(C::RDMAP_PROT_INVALID_STAG),
        origin: TerminateOrigin::Peer
    }));
    assert_eq!(
        t.side
            .completions
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect::<Vec<_>>(),
        [(50, WcStatus::Success), (51, WcStatus::WrFlushError)],
        "the innocent Read was blamed"
    );
    assert_eq!(&t.side.bytes(&t.sink)[..64], &data[..]);
    assert_eq!(t.side.pins(), 0);
}
