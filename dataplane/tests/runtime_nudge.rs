//! The MPA initiator's nudge through the runtime: two dataplanes over the
//! in-memory link, the active side configured with `mpa.nudge_ms`. After
//! the connection is up its only FPDU is the Write RTR and the passive
//! side's application says nothing, so the peer stays silent: with the
//! nudge on, exactly one zero-length RDMA Write (20 octets on the stream
//! with CRC) reaches the passive side after the delay and nothing else,
//! and the connection carries a Send afterwards; with the nudge
//! off (0), nothing follows the RTR. (Linux siw as responder can leave an
//! FPDU that arrives right after its MPA reply unread; the nudge wakes it.
//! The engine tests in `rdmap/tests/engine_nudge.rs` model that peer.)

mod runtime_common;

use std::time::{Duration, Instant};

use dataplane::api::{Dataplane, DriveMode, QpStatus};
use dataplane::link::{MemLink, MemLinkConfig};
use runtime_common::*;

/// Length field, 14-octet tagged header, CRC.
const NUDGE_FPDU: u64 = 2 + 14 + 4;

fn pair(nudge_ms: u64) -> Pair {
    let (la, lb) = MemLink::pair(&MemLinkConfig::default(), MAC_A, MAC_B);
    let config = |ip, mac| {
        let mut c = dataplane::config::Config::single("mem:test", ip, mac);
        c.idle.spin = 200;
        c.idle.sleep_us = 20;
        c.mpa.nudge_ms = nudge_ms;
        c
    };
    let a = Dataplane::open_with_link(&config(IP_A, MAC_A), la, DriveMode::Inline).expect("open a");
    let b = Dataplane::open_with_link(&config(IP_B, MAC_B), lb, DriveMode::Inline).expect("open b");
    Pair { a, b }
}

/// Pumps both sides for `d`.
fn pump_for(p: &Pair, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        p.pump();
    }
}

fn received(dp: &Dataplane, end: &End) -> u64 {
    dp.qp_snapshots()
        .iter()
        .find(|s| s.qpn == end.qp.num())
        .map(|s| s.bytes_received)
        .expect("the QP's snapshot")
}

#[test]
fn a_silent_peer_is_nudged_once_after_the_delay() {
    let p = pair(400);
    let (mut ea, mut eb) = connect(&p);
    let t0 = Instant::now();
    pump_for(&p, Duration::from_millis(60));
    let before = received(&p.b, &eb);
    assert!(
        t0.elapsed() < Duration::from_millis(390),
        "the machine is too slow for this test's timing"
    );
    pump_for(&p, Duration::from_millis(800));
    let after = received(&p.b, &eb);
    assert_eq!(after - before, NUDGE_FPDU, "one zero-length Write");
    pump_for(&p, Duration::from_millis(500));
    assert_eq!(received(&p.b, &eb), after, "never a second nudge");
    // The zero-length Write was taken without a Terminate: both ends are
    // connected and a Send goes through.
    assert_eq!(ea.qp.status(), QpStatus::Connected);
    assert_eq!(eb.qp.status(), QpStatus::Connected);
    let n = exchange(&p, &mut ea, &mut eb, Op::Send, 3000, 1);
    println!(
        "nudge: {NUDGE_FPDU} octets once in {} ms of silence after the RTR; then a Send of {n} bytes verified",
        t0.elapsed().as_millis()
    );
}

#[test]
fn no_nudge_when_disabled() {
    let p = pair(0);
    let (mut ea, mut eb) = connect(&p);
    pump_for(&p, Duration::from_millis(50));
    let before = received(&p.b, &eb);
    pump_for(&p, Duration::from_millis(600));
    assert_eq!(received(&p.b, &eb), before, "nothing after the RTR");
    assert_eq!(exchange(&p, &mut ea, &mut eb, Op::Send, 100, 1), 100);
}
