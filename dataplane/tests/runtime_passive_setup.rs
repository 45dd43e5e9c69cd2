//! The passive side's MPA setup, as the endpoint runs it, against a
//! scripted initiator (a TCP engine of its own on the other end of the
//! in-memory link): a peer that opens TCP and never sends its request is
//! closed when the MPA timer runs out; one that sends bytes that are not
//! a request is closed at once; a request split into one-byte segments is
//! reported whole, and the application's reject reaches the peer before
//! a FIN. No connection the application never took is reported to it,
//! and a peer that failed setup is reset, leaving nothing on the worker.

mod runtime_common;
mod scripted_common;

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use dataplane::api::{CmEvent, Dataplane, DriveMode};
use dataplane::config::{Config, Neighbor};
use dataplane::link::{Link, MemLink, MemLinkConfig};
use runtime_common::*;
use scripted_common::ScriptedEnd;
use tcp_offload::iface::{Interface, InterfaceConfig};
use tcp_offload::tcp::{ConnId, Event};
use tcp_offload::time::Instant as TcpInstant;
use tcp_sim::host::SimInterface;

/// How the scripted initiator's connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The dataplane closed with a FIN.
    Fin,
    /// The dataplane reset it.
    Reset,
}

/// The initiator: connects to the dataplane's listener and sends what the
/// test scripts, in segments of at most `chunk` bytes.
struct ScriptedInitiator {
    engine: ScriptedEnd,
    start: Instant,
    conn: ConnId,
    to_send: Vec<u8>,
    chunk: usize,
    rx: Vec<u8>,
    end: Option<End>,
}

impl ScriptedInitiator {
    fn new(mut link: MemLink, to_send: Vec<u8>, chunk: usize) -> ScriptedInitiator {
        let queue = link.take_queue(0).expect("queue 0 of the peer's end");
        let mut iface: SimInterface = Interface::new(InterfaceConfig::new(MAC_B, IP_B, [9; 16]));
        iface.add_static_arp(IP_A, MAC_A);
        let start = Instant::now();
        let conn = iface
            .stack_mut()
            .connect(
                TcpInstant::from_micros(0),
                IP_B,
                SocketAddrV4::new(IP_A, PORT),
            )
            .expect("connect");
        ScriptedInitiator {
            engine: ScriptedEnd { iface, queue },
            start,
            conn,
            to_send,
            chunk,
            rx: Vec::new(),
            end: None,
        }
    }

    fn now(&self) -> TcpInstant {
        TcpInstant::from_micros(self.start.elapsed().as_micros() as u64)
    }

    fn pump(&mut self) {
        let now = self.now();
        self.engine.receive(now);
        let id = self.conn;
        let mut connected = false;
        while let Some(e) = self.engine.iface.stack_mut().poll_event(id) {
            match e {
                Event::Connected => connected = true,
                Event::PeerClosed => {
                    self.end.get_or_insert(End::Fin);
                    if let Some(c) = self.engine.iface.stack_mut().conn_mut(id) {
                        c.close(now);
                    }
                }
                Event::Reset => self.end = Some(End::Reset),
                _ => {}
            }
        }
        if let Some(c) = self.engine.iface.stack_mut().conn_mut(id) {
            if connected || c.state() == tcp_offload::tcp::State::Established {
                while !self.to_send.is_empty() {
                    let n = self.chunk.min(self.to_send.len());
                    if c.send_record(now, self.to_send[..n].to_vec()).is_err() {
                        break;
                    }
                    self.to_send.drain(..n);
                }
            }
            while let Some(p) = c.recv() {
                self.rx.extend_from_slice(p.bytes());
            }
        }
        self.engine.transmit(now);
    }
}

/// A listening dataplane at A and the scripted initiator at B.
fn listener(to_send: Vec<u8>, chunk: usize) -> (Dataplane, ScriptedInitiator) {
    let (la, lb) = MemLink::pair(&MemLinkConfig::default(), MAC_A, MAC_B);
    let mut c = Config::single("mem:passive", IP_A, MAC_A);
    c.idle.spin = 200;
    c.idle.sleep_us = 20;
    c.mpa.timeout_s = 1;
    c.ports[0].neighbors.push(Neighbor {
        ip: IP_B,
        mac: dataplane::config::MacAddr(MAC_B),
    });
    let dp = Dataplane::open_with_link(&c, la, DriveMode::Inline).expect("open");
    dp.listen(PORT, 4).unwrap();
    let peer = ScriptedInitiator::new(lb, to_send, chunk);
    (dp, peer)
}

fn connections(dp: &Dataplane) -> u64 {
    dp.stats().iter().map(|w| w.connections).sum()
}

/// Runs both until `done`, handing each CM event to `on_event`.
fn run(
    dp: &Dataplane,
    peer: &mut ScriptedInitiator,
    what: &str,
    mut on_event: impl FnMut(&Dataplane, CmEvent),
    done: impl Fn(&Dataplane, &ScriptedInitiator) -> bool,
) -> Duration {
    let t0 = Instant::now();
    while !done(dp, peer) {
        assert!(
            t0.elapsed() < PATIENCE,
            "{what}: not within {PATIENCE:?} (peer end {:?}, {} connections)",
            peer.end,
            connections(dp)
        );
        dp.poll();
        peer.pump();
        while let Some(e) = dp.poll_event() {
            on_event(dp, e);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    t0.elapsed()
}

#[test]
fn a_peer_that_never_sends_its_request_is_closed_when_the_mpa_timer_runs_out() {
    let (dp, mut peer) = listener(Vec::new(), 1);
    let took = run(
        &dp,
        &mut peer,
        "the close of a silent peer",
        |_, e| panic!("the application heard of a request never made: {e}"),
        |dp, p| p.end.is_some() && connections(dp) == 0,
    );
    println!("reset after {took:?}: {:?}", peer.end);
    assert_eq!(peer.end, Some(End::Reset));
    assert!(
        took >= Duration::from_millis(900),
        "before the timer: {took:?}"
    );
    assert!(peer.rx.is_empty(), "nothing was said to it");
}

#[test]
fn bytes_that_are_not_an_mpa_request_close_the_connection_at_once() {
    let (dp, mut peer) = listener(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 64);
    let took = run(
        &dp,
        &mut peer,
        "the close of a peer that does not speak MPA",
        |_, e| panic!("the application heard of a request never made: {e}"),
        |dp, p| p.end.is_some() && connections(dp) == 0,
    );
    println!("reset after {took:?}: {:?}", peer.end);
    assert_eq!(peer.end, Some(End::Reset));
    assert!(
        took < Duration::from_millis(900),
        "not left to the timer: {took:?}"
    );
}

#[test]
fn a_request_in_one_byte_segments_is_reported_whole_and_a_reject_reaches_the_peer() {
    // The key, no flags, revision 1, 5 bytes of private data (RFC 5044
    // §7.1).
    let mut req = b"MPA ID Req Frame".to_vec();
    req.extend_from_slice(&[0x00, 0x01, 0x00, 0x05]);
    req.extend_from_slice(b"hello");
    let (dp, mut peer) = listener(req, 1);
    let mut asked = None;
    run(
        &dp,
        &mut peer,
        "the request, the reject and the close",
        |dp, e| match e {
            CmEvent::ConnectRequest(r) => {
                asked = Some(r.private_data.clone());
                dp.reject(&r, b"not today").unwrap();
            }
            other => panic!("unexpected {other}"),
        },
        |_, p| p.rx.len() >= 20 + 9 && p.end.is_some(),
    );
    // The reject, then an orderly close (our side holds TIME-WAIT).
    assert_eq!(peer.end, Some(End::Fin));
    assert_eq!(asked.as_deref(), Some(&b"hello"[..]));
    assert_eq!(&peer.rx[..16], b"MPA ID Rep Frame");
    assert_eq!(peer.rx[16] & 0x20, 0x20, "the reject flag");
    assert_eq!(&peer.rx[20..29], b"not today");
}
