//! Connection setups that fail, end to end, and what each side is told:
//! the reason of the CM event reads as one sentence naming what the peer
//! did and what to change.
//!
//! - Against a scripted responder that answers as Linux siw does (picks a
//!   Write RTR whatever was offered; a TCP engine of its own on the other
//!   end of the in-memory link): an initiator offering only a Send RTR
//!   fails with that sentence, sends a Terminate and closes. The same
//!   scripted peer answering without C fails an initiator that requires
//!   CRC.
//! - Between two dataplanes: a responder with `mpa.crc = "required"`
//!   refuses an initiator that does not ask for CRC with a reject saying
//!   so, and both applications hear why; an initiator that requires CRC
//!   connects to a responder with CRC off (it must honour C).
//!
//! Every message of every failure variant is checked against the rules
//! of `rdmap_testkit::message` at the end.

mod runtime_common;
mod scripted_common;

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use dataplane::api::{
    CmEvent, ConnectFailure, ConnectParams, Dataplane, DisconnectReason, DriveMode, Error,
    QpStatus, RefusedRequest, RejectReason,
};
use dataplane::config::{Config, CrcPolicy, Neighbor};
use dataplane::link::{Link, MemLink, MemLinkConfig};
use rdmap::verbs::VerbsError;
use rdmap_testkit::message::rule_broken;
use runtime_common::*;
use scripted_common::ScriptedEnd;
use tcp_offload::iface::{Interface, InterfaceConfig};
use tcp_offload::tcp::{ConnId, Event, StackError};
use tcp_offload::time::Instant as TcpInstant;
use tcp_sim::host::SimInterface;

/// MPA request and reply keys (RFC 5044 §7.1).
const REQ_KEY: &[u8; 16] = b"MPA ID Req Frame";
const REP_KEY: &[u8; 16] = b"MPA ID Rep Frame";

/// The other end of the link: a TCP engine of its own that answers an MPA
/// request with a scripted reply, then records what comes back.
struct ScriptedResponder {
    engine: ScriptedEnd,
    start: Instant,
    conn: Option<ConnId>,
    /// The request as it arrived, then everything after it.
    rx: Vec<u8>,
    request: Option<Vec<u8>>,
    peer_closed: bool,
}

impl ScriptedResponder {
    fn new(mut link: MemLink) -> ScriptedResponder {
        let queue = link.take_queue(0).expect("queue 0 of the peer's end");
        let mut iface: SimInterface = Interface::new(InterfaceConfig::new(MAC_B, IP_B, [7; 16]));
        iface.add_static_arp(IP_A, MAC_A);
        iface
            .stack_mut()
            .listen(SocketAddrV4::new(IP_B, PORT), 4)
            .expect("listen");
        ScriptedResponder {
            engine: ScriptedEnd { iface, queue },
            start: Instant::now(),
            conn: None,
            rx: Vec::new(),
            request: None,
            peer_closed: false,
        }
    }

    fn now(&self) -> TcpInstant {
        TcpInstant::from_micros(self.start.elapsed().as_micros() as u64)
    }

    /// One round: frames in, the script, timers, frames out. `reply`
    /// builds the reply from the request.
    fn pump(&mut self, reply: &dyn Fn(&[u8]) -> Vec<u8>) {
        let now = self.now();
        self.engine.receive(now);
        if self.conn.is_none() {
            self.conn = self.engine.iface.stack_mut().accept(PORT);
        }
        if let Some(id) = self.conn {
            while let Some(e) = self.engine.iface.stack_mut().poll_event(id) {
                if matches!(e, Event::PeerClosed) && !self.peer_closed {
                    self.peer_closed = true;
                    // Close our half too, as siw does after a Terminate.
                    if let Some(c) = self.engine.iface.stack_mut().conn_mut(id) {
                        c.close(now);
                    }
                }
            }
            if let Some(c) = self.engine.iface.stack_mut().conn_mut(id) {
                while let Some(p) = c.recv() {
                    self.rx.extend_from_slice(p.bytes());
                }
                if self.request.is_none() && self.rx.len() >= 20 {
                    let len = 20 + usize::from(u16::from_be_bytes([self.rx[18], self.rx[19]]));
                    if self.rx.len() >= len {
                        let req: Vec<u8> = self.rx.drain(..len).collect();
                        c.send_record(now, reply(&req)).expect("room for the reply");
                        self.request = Some(req);
                    }
                }
            }
        }
        self.engine.transmit(now);
    }
}

/// siw's reply to a revision 2 request (siw_cm.c): C echoed, the 0x10
/// flag, P echoed and a Write RTR picked whatever was offered, its IRD and
/// ORD those of the request. `crc_flag` overrides the C flag (a
/// non-conforming peer).
fn siw_like_reply(req: &[u8], crc_flag: Option<bool>) -> Vec<u8> {
    assert_eq!(&req[..16], REQ_KEY);
    let c = crc_flag.unwrap_or(req[16] & 0x40 != 0);
    let ird = u16::from_be_bytes([req[20], req[21]]) & 0x3fff;
    let ord = u16::from_be_bytes([req[22], req[23]]) & 0x3fff;
    let mut rep = REP_KEY.to_vec();
    rep.extend_from_slice(&[0x10 | if c { 0x40 } else { 0 }, 2, 0, 4]);
    rep.extend_from_slice(&(0x8000 | ird).to_be_bytes());
    rep.extend_from_slice(&(0x8000 | ord).to_be_bytes());
    rep
}

/// Our dataplane on one end (`tweak` sets its MPA options), the scripted
/// responder on the other; connects and returns the connection failure
/// with the peer as it ended.
fn against_scripted(
    tweak: impl Fn(&mut Config),
    reply: &dyn Fn(&[u8]) -> Vec<u8>,
) -> (ConnectFailure, ScriptedResponder) {
    let (la, lb) = MemLink::pair(&MemLinkConfig::default(), MAC_A, MAC_B);
    let mut c = Config::single("mem:scripted", IP_A, MAC_A);
    c.idle.spin = 200;
    c.idle.sleep_us = 20;
    c.ports[0].neighbors.push(Neighbor {
        ip: IP_B,
        mac: dataplane::config::MacAddr(MAC_B),
    });
    tweak(&mut c);
    let dp = Dataplane::open_with_link(&c, la, DriveMode::Inline).expect("open");
    let mut peer = ScriptedResponder::new(lb);
    let end = End::new(&dp);
    dp.connect(
        &end.qp,
        SocketAddrV4::new(IP_B, PORT),
        &ConnectParams {
            ird: 1,
            ord: 1,
            private_data: Vec::new(),
        },
    )
    .unwrap();
    let t0 = Instant::now();
    let mut failure = None;
    // Until the failure is reported and the peer has seen our FIN.
    while failure.is_none() || !peer.peer_closed {
        assert!(
            t0.elapsed() < PATIENCE,
            "no failure and close: {failure:?}, peer closed {}",
            peer.peer_closed
        );
        dp.poll();
        peer.pump(reply);
        while let Some(e) = dp.poll_event() {
            match e {
                CmEvent::ConnectFailed { qp, reason } if qp == end.qp.num() => {
                    println!("event: {}", CmEvent::ConnectFailed { qp, reason });
                    failure = Some(reason);
                }
                other => panic!("unexpected {other}"),
            }
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    assert_eq!(end.qp.status(), QpStatus::Disconnected);
    (failure.unwrap(), peer)
}

/// The Terminate the peer received after the reply: an untagged FPDU on
/// queue 2 whose Terminate control names layer 2 (LLP), error type 0 (MPA)
/// and `ecode`.
fn assert_terminate(rx: &[u8], ecode: u8) {
    // MPA length (2), DDP control, RDMAP control, reserved (4), QN, MSN,
    // MO (4 each), then the Terminate control (layer/etype, ecode).
    assert!(
        rx.len() >= 2 + 18 + 4,
        "no Terminate after the reply: {rx:02x?}"
    );
    assert_eq!(rx[3] & 0x0f, 0x07, "RDMAP opcode Terminate: {rx:02x?}");
    assert_eq!(
        u32::from_be_bytes([rx[8], rx[9], rx[10], rx[11]]),
        2,
        "QN 2"
    );
    assert_eq!(
        (rx[20], rx[21]),
        (0x20, ecode),
        "layer LLP, etype MPA, code"
    );
}

#[test]
fn send_rtr_offer_against_a_siw_like_write_pick_fails_in_one_sentence() {
    let (failure, peer) = against_scripted(|c| c.mpa.rtr = "send".into(), &|req| {
        siw_like_reply(req, None)
    });
    let req = peer
        .request
        .as_deref()
        .expect("the request reached the peer");
    // Our request offered the Send RTR only (P and L in the IRD word).
    assert_eq!(&req[20..24], &[0xc0, 0x01, 0x00, 0x01]);
    assert_eq!(
        failure.to_string(),
        "the peer chose a Write RTR, which was not offered; offer a Write RTR as well, \
         or turn peer-to-peer off (see mpa.rtr)"
    );
    assert_eq!(rule_broken(&failure.to_string(), true), None);
    // RFC 6581 §8: the reply switched to FPDU mode, so a Terminate (No
    // Matching RTR Model, 0x07) went out before the FIN.
    assert_terminate(&peer.rx, 0x07);
    assert!(peer.peer_closed);
}

#[test]
fn crc_required_initiator_refuses_a_reply_without_c() {
    let (failure, peer) = against_scripted(
        |c| {
            c.mpa.rtr = "write".into();
            c.mpa.crc = CrcPolicy::Required;
        },
        &|req| siw_like_reply(req, Some(false)),
    );
    let req = peer.request.as_deref().unwrap();
    assert_eq!(req[16] & 0x40, 0x40, "we asked for CRC");
    let m = failure.to_string();
    println!("{m}");
    assert!(
        m.starts_with("the peer replied without MPA CRCs") && m.ends_with("(see mpa.crc)"),
        "{m}"
    );
    assert_eq!(rule_broken(&m, true), None);
    // Invalid request or reply frame (0x04).
    assert_terminate(&peer.rx, 0x04);
}

#[test]
fn crc_required_responder_rejects_a_request_without_c_and_both_sides_hear_why() {
    let p = Pair::with_configs(&PairOptions::default(), |c, is_a| {
        c.mpa.crc = if is_a {
            CrcPolicy::Off
        } else {
            CrcPolicy::Required
        };
    });
    p.b.listen(PORT, 4).unwrap();
    let ea = End::new(&p.a);
    let eb = End::new(&p.b);
    p.a.connect(
        &ea.qp,
        SocketAddrV4::new(IP_B, PORT),
        &ConnectParams::default(),
    )
    .unwrap();
    let (mut refused, mut rejected) = (None, None);
    p.until("a reject and its reason on both sides", |p| {
        while let Some(e) = p.b.poll_event() {
            println!("b: {e}");
            match e {
                // MPA setup refuses the request by itself, before the
                // application is asked, and says why.
                CmEvent::RequestRefused(r) if r.local_port == PORT => refused = Some(r),
                other => panic!("b: unexpected {other}"),
            }
        }
        while let Some(e) = p.a.poll_event() {
            println!("a: {e}");
            match e {
                CmEvent::Rejected { qp, private_data } if qp == ea.qp.num() => {
                    rejected = Some(private_data)
                }
                other => panic!("a: unexpected {other}"),
            }
        }
        (refused.is_some() && rejected.is_some()).then_some(())
    });
    let refused = refused.unwrap();
    assert_eq!(refused.reason, RejectReason::CrcRequired);
    assert_eq!(*refused.remote.ip(), IP_A);
    assert_eq!(
        refused.to_string(),
        format!(
            "we refused the MPA request from {} to port {PORT}: the peer did not ask for MPA \
             CRCs, and CRCs are required here; have the peer ask for CRCs, or stop requiring \
             them here (see mpa.crc)",
            refused.remote
        )
    );
    assert_eq!(rejected.as_deref(), Some(&b"MPA CRC required"[..]));
    assert_eq!(
        CmEvent::Rejected {
            qp: ea.qp.num(),
            private_data: rejected.unwrap(),
        }
        .to_string(),
        format!(
            "the peer rejected the connection of queue pair {}, saying MPA CRC required",
            ea.qp.num().0
        )
    );
    assert_eq!(ea.qp.status(), QpStatus::Disconnected);
    assert_eq!(
        eb.qp.status(),
        QpStatus::Idle,
        "never handed to the connection"
    );
}

#[test]
fn crc_required_initiator_connects_to_a_responder_with_crc_off() {
    let p = Pair::with_configs(&PairOptions::default(), |c, is_a| {
        c.mpa.crc = if is_a {
            CrcPolicy::Required
        } else {
            CrcPolicy::Off
        };
    });
    // The responder honours our C: both ends up, CRC on.
    let (mut a, mut b) = connect_crc(&p, true);
    let n = exchange(&p, &mut a, &mut b, Op::Write, 4096, 1);
    assert!(n > 0);
}

#[test]
fn every_connection_failure_and_end_reads_as_one_sentence() {
    let mut n = 0;
    for f in ConnectFailure::all() {
        let m = f.to_string();
        if let Some(why) = rule_broken(&m, f.peer_at_fault()) {
            panic!("{why}: {m:?}");
        }
        n += 1;
    }
    for d in DisconnectReason::all() {
        let m = d.to_string();
        if let Some(why) = rule_broken(&m, d.peer_at_fault()) {
            panic!("{why}: {m:?}");
        }
        n += 1;
    }
    // The API's errors that name a verbs or TCP refusal.
    for e in VerbsError::ALL
        .iter()
        .map(|v| Error::Verbs(*v))
        .chain(StackError::ALL.iter().map(|s| Error::Stack(*s)))
    {
        let m = e.to_string();
        assert_eq!(rule_broken(&m, false), None, "{m}");
        n += 1;
    }
    // The CM events that carry a failure, as the tools log them.
    let qp = dataplane::api::QpNum(7);
    for reason in ConnectFailure::all() {
        let m = CmEvent::ConnectFailed { qp, reason }.to_string();
        assert_eq!(rule_broken(&m, reason.peer_at_fault()), None, "{m}");
        n += 1;
    }
    for reason in DisconnectReason::all() {
        let m = CmEvent::Disconnected { qp, reason }.to_string();
        assert_eq!(rule_broken(&m, reason.peer_at_fault()), None, "{m}");
        n += 1;
    }
    let refusals = RefusedRequest::all();
    assert_eq!(refusals.len(), 3, "markers, no RTR in common, CRC required");
    for r in refusals {
        let m = CmEvent::RequestRefused(r).to_string();
        assert_eq!(rule_broken(&m, r.reason.peer_at_fault()), None, "{m}");
        n += 1;
    }
    println!("{n} messages, each one sentence");
    // Every variant is in the lists: a new one fails to compile here
    // until it is counted.
    let mut seen = [false; 3];
    for f in ConnectFailure::all() {
        seen[match f {
            ConnectFailure::Refused => 0,
            ConnectFailure::TimedOut => 1,
            ConnectFailure::Setup(_) => 2,
        }] = true;
    }
    assert!(seen.iter().all(|s| *s), "{seen:?}");
    let mut seen = [false; 5];
    for d in DisconnectReason::all() {
        seen[match d {
            DisconnectReason::Closed => 0,
            DisconnectReason::Reset => 1,
            DisconnectReason::TimedOut => 2,
            DisconnectReason::LocalAbort => 3,
            DisconnectReason::Terminated { .. } => 4,
        }] = true;
    }
    assert!(seen.iter().all(|s| *s), "{seen:?}");
}
