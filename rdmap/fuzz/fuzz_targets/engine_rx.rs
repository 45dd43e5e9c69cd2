//! The whole receive path of the QP engine (MPA deframing, DDP placement,
//! RDMAP, RFC 5040/5041/5044) fed whatever a peer might send once the
//! connection is up.
//!
//! Setup: an endpoint negotiated against an in-process MPA peer, with
//! three regions registered in a `VecMemory`, each span fenced by canary
//! bytes — two at dense STags (0x100: remote write and read; 0x200: local
//! write only, holding the posted receives and the sink of our own RDMA
//! Read) and one at siw's STag 0x2b9d4f00 through `reg_mr_at` (remote
//! write). Four receives and one RDMA Read (sink 0x200 at TO 0x2200, 256
//! octets) are posted, so Sends, Writes, Read Requests and Read Responses
//! all find something to land on.
//!
//! Input: byte 0 chooses the connection — bit 0 CRC, bit 1 markers in what
//! we receive, bit 2 peer-to-peer with a Write RTR (the peer's first FPDU
//! must be the RTR), bit 3 our role (0 responder, 1 initiator), bit 4 we
//! start an orderly close before the input, bit 5 the peer's FIN follows
//! the input, bit 6 no RDMA Read of ours is posted (with one outstanding,
//! the peer's FIN is an error). Byte 1
//! chooses the chunking (0: one chunk; n: pseudo-random chunks of 1..=8n
//! octets). The rest is the peer's byte stream after the MPA frames.
//! After every chunk the endpoint's output is taken and acknowledged.
//!
//! Asserted: no panic; no byte outside the registered spans changes; at
//! most one Terminated event, and none with Closed; at most one Terminate
//! in our output, it parses and is the last FPDU, and only when we ended
//! the stream — always then, unless an orderly close had already
//! reported ReadyToClose (our FIN is out; nothing may follow it).
#![no_main]

use core::time::Duration;

use libfuzzer_sys::fuzz_target;
use rdmap::engine::{Endpoint, EngineEvent, Env, RecordKind, TerminateOrigin};
use rdmap::mpa::{Config, DeframeEvent, Deframer, Event, Negotiator, RtrSet, RtrType};
use rdmap::placement::{RegionHandle, VecMemory};
use rdmap::verbs::{
    Access, CompletionQueue, Device, DeviceLimits, QpInitAttr, RecvWr, SendFlags, SendWr, Sge,
    SgeList, Stag,
};
use rdmap::wire::TerminateMessage;

/// Octets of each registered span.
const SPAN: usize = 1024;
/// Canary octets before and after each span.
const GUARD: usize = 64;
const CANARY: u8 = 0xA5;
/// Tagged offset of each region's first octet.
const VA: [u64; 3] = [0x1000, 0x2000, 0x7f00_0000_3000];
/// siw's STag from rping.pcap: an index far beyond the dense table.
const IMPORTED: Stag = Stag(0x2b9d_4f00);
/// Largest record the engine may build (a 1460-octet MSS).
const MSS: usize = 1460;

struct World {
    dev: Device,
    mem: VecMemory,
    cq: CompletionQueue,
    ep: Endpoint,
    /// Deframes our output as the peer would.
    peer_rx: Deframer,
    out_ulpdus: Vec<Vec<u8>>,
}

impl World {
    fn feed(&mut self, bytes: &[u8]) {
        let mut env = Env::new(&mut self.dev, &mut self.mem, &mut self.cq);
        self.ep.handle_stream(Duration::ZERO, bytes, &mut env);
    }

    /// Takes every record, acknowledging it, and returns the MPA frame
    /// octets; FPDUs go through the peer's deframer.
    fn drain(&mut self) -> Vec<u8> {
        let mut frames = Vec::new();
        let mut fpdus = Vec::new();
        loop {
            let mut env = Env::new(&mut self.dev, &mut self.mem, &mut self.cq);
            let Some(r) = self.ep.poll_record(MSS, &mut env) else {
                break;
            };
            assert!(r.len() <= MSS, "record larger than the segment offered");
            let bytes = r.to_vec(env.mem);
            if r.kind() == RecordKind::MpaFrame {
                frames.extend(bytes);
            } else {
                fpdus.extend(bytes);
            }
            self.ep.record_acked(r, &mut env);
        }
        let mut input = &fpdus[..];
        while let Some(ev) = self
            .peer_rx
            .next_event(&mut input)
            .expect("our output deframes")
        {
            match ev {
                DeframeEvent::UlpduStart { .. } => self.out_ulpdus.push(Vec::new()),
                DeframeEvent::Bytes(b) => self.out_ulpdus.last_mut().unwrap().extend_from_slice(b),
                DeframeEvent::UlpduEnd { crc_ok } => assert!(crc_ok, "our CRC"),
            }
        }
        while self.cq.poll_one().is_some() {}
        frames
    }
}

fn setup(flags: u8) -> Option<World> {
    let crc = flags & 1 != 0;
    let markers = flags & 2 != 0;
    let p2p = flags & 4 != 0;
    let initiator = flags & 8 != 0;
    let mut dev = Device::new(DeviceLimits {
        max_mr: 8,
        ..DeviceLimits::default()
    });
    let pd = dev.alloc_pd().ok()?;
    let cq = dev.create_cq(256).ok()?;
    let qp = dev
        .create_qp(QpInitAttr {
            pd,
            send_cq: cq.id(),
            recv_cq: cq.id(),
            srq: None,
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_ord: 4,
            max_ird: 4,
            sq_sig_all: false,
        })
        .ok()?;
    let mut mem = VecMemory::new();
    let lw = Access::LOCAL_WRITE;
    let rights = [
        lw | Access::REMOTE_WRITE | Access::REMOTE_READ,
        lw,
        lw | Access::REMOTE_WRITE,
    ];
    let mut stags = [Stag(0); 3];
    for (i, stag) in stags.iter_mut().enumerate() {
        let region = mem.add_region_with(vec![CANARY; SPAN + 2 * GUARD]);
        let span = mem.span(region, GUARD as u64, SPAN as u64)?;
        *stag = if i == 2 {
            dev.reg_mr_at(IMPORTED, pd, span, VA[i], rights[i]).ok()?
        } else {
            dev.reg_mr(pd, span, VA[i], rights[i]).ok()?
        };
        // The spans start zeroed, so that placement shows.
        mem.bytes_mut(region)?[GUARD..GUARD + SPAN].fill(0);
    }
    let ours = Config {
        crc: crc.into(),
        markers_wanted: markers,
        ird: 2,
        ord: 2,
        rtr_offer: if p2p {
            RtrSet::only(RtrType::Write)
        } else {
            RtrSet::NONE
        },
        ..Config::default()
    };
    let theirs = Config {
        crc: crc.into(),
        ird: 2,
        ord: 2,
        rtr_offer: ours.rtr_offer,
        ..Config::default()
    };
    let ep = if initiator {
        Endpoint::initiator(ours, &[], qp, Duration::ZERO).ok()?
    } else {
        Endpoint::responder(ours, qp, Duration::ZERO).ok()?
    };
    let mut w = World {
        dev,
        mem,
        cq,
        ep,
        peer_rx: Deframer::new(false, false, u16::MAX),
        out_ulpdus: Vec::new(),
    };
    for id in 0..4u64 {
        let sge = Sge {
            addr: VA[1] + 128 * id,
            length: 128,
            lkey: stags[1],
        };
        w.ep.qp_mut()
            .post_recv(&RecvWr {
                wr_id: id,
                sges: SgeList::single(sge),
            })
            .ok()?;
    }
    let sink = Sge {
        addr: VA[1] + 512,
        length: 256,
        lkey: stags[1],
    };
    if flags & 0x40 == 0 {
        let read = SendWr::read(9, sink, 0x9000, Stag(0x0400)).with_flags(SendFlags::SIGNALED);
        let mrs = w.dev.mrs();
        w.ep.qp_mut().post_send(&read, mrs).ok()?;
    }

    // MPA with an in-process peer.
    let negotiated = if initiator {
        let mut peer = Negotiator::responder(theirs, Duration::ZERO).ok()?;
        let request = w.drain();
        peer.handle_input(&request, Duration::ZERO);
        while peer.poll_event().is_some() {}
        peer.accept(&[]).ok()?;
        let reply = peer.poll_transmit()?.to_vec();
        w.feed(&reply);
        match peer.poll_event() {
            Some(Event::Negotiated(n)) => n,
            _ => return None,
        }
    } else {
        let mut peer = Negotiator::initiator(theirs, &[], Duration::ZERO).ok()?;
        let request = peer.poll_transmit()?.to_vec();
        w.feed(&request);
        if w.ep.poll_event() != Some(EngineEvent::ConnectRequest) {
            return None;
        }
        w.ep.accept(&[]).ok()?;
        let reply = w.drain();
        peer.handle_input(&reply, Duration::ZERO);
        match peer.poll_event() {
            Some(Event::Negotiated(n)) => n,
            _ => return None,
        }
    };
    // The peer receives with our transmit framing.
    w.peer_rx = Deframer::new(
        negotiated.framing.crc,
        negotiated.framing.markers_rx,
        u16::MAX,
    );
    w.drain();
    while let Some(ev) = w.ep.poll_event() {
        assert!(matches!(ev, EngineEvent::Connected(_)), "setup: {ev:?}");
    }
    Some(w)
}

/// The endings the endpoint reported.
#[derive(Default)]
struct Endings {
    terminated: u32,
    origin: Option<TerminateOrigin>,
    closed: u32,
    /// ReadyToClose came before any Terminated: an orderly close had
    /// drained, so our FIN was out and no Terminate could follow it.
    ready_first: bool,
}

impl Endings {
    fn take(&mut self, w: &mut World) {
        while let Some(ev) = w.ep.poll_event() {
            match ev {
                EngineEvent::Terminated { origin, .. } => {
                    self.terminated += 1;
                    self.origin = Some(origin);
                }
                EngineEvent::Closed => self.closed += 1,
                EngineEvent::ReadyToClose if self.terminated == 0 => self.ready_first = true,
                _ => {}
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [flags, chunking, stream @ ..] = data else {
        return;
    };
    let Some(mut w) = setup(*flags) else {
        panic!("setup failed for flags {flags:#04x}");
    };
    if flags & 0x10 != 0 {
        let mut env = Env::new(&mut w.dev, &mut w.mem, &mut w.cq);
        w.ep.disconnect(&mut env).expect("a healthy stream closes");
        w.drain();
    }
    let mut state = u32::from(*chunking) | 0x5eed_0000;
    let mut rest = stream;
    let mut endings = Endings::default();
    while !rest.is_empty() {
        let n = if *chunking == 0 {
            rest.len()
        } else {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            1 + (state >> 16) as usize % (8 * usize::from(*chunking))
        }
        .min(rest.len());
        w.feed(&rest[..n]);
        rest = &rest[n..];
        w.drain();
        endings.take(&mut w);
    }
    if flags & 0x20 != 0 {
        let mut env = Env::new(&mut w.dev, &mut w.mem, &mut w.cq);
        w.ep.handle_peer_closed(&mut env);
        w.drain();
    }
    endings.take(&mut w);
    let Endings {
        terminated,
        origin,
        closed,
        ready_first,
    } = endings;
    assert!(terminated <= 1, "{terminated} Terminated events");
    assert!(
        closed <= 1 && closed + terminated <= 1,
        "closed {closed}, terminated {terminated}"
    );
    assert_eq!(w.ep.is_closed(), closed == 1);
    assert_eq!(w.ep.is_terminated(), terminated == 1);

    // At most one Terminate, parsable, last, and only when we ended it.
    let terminates: Vec<usize> = (0..w.out_ulpdus.len())
        .filter(|&i| TerminateMessage::parse(&w.out_ulpdus[i]).is_ok())
        .collect();
    assert!(
        terminates.len() <= 1,
        "{} Terminates sent",
        terminates.len()
    );
    if let Some(&i) = terminates.first() {
        assert_eq!(
            origin,
            Some(TerminateOrigin::Local),
            "a Terminate we did not mean"
        );
        assert_eq!(i + 1, w.out_ulpdus.len(), "FPDUs after our Terminate");
    }
    if origin == Some(TerminateOrigin::Local) {
        assert_eq!(
            terminates.len(),
            usize::from(!ready_first),
            "our fault report went out, unless our FIN had"
        );
    }

    // Nothing outside a registered span was written.
    for h in 0..3u64 {
        let b = w.mem.bytes(RegionHandle(h)).unwrap();
        assert!(b[..GUARD].iter().all(|&x| x == CANARY), "below span {h}");
        assert!(
            b[GUARD + SPAN..].iter().all(|&x| x == CANARY),
            "above span {h}"
        );
    }
});
