//! A stopping dataplane closes its connections as a host's TCP does when
//! its application exits: a FIN, then the FIN exchange runs to its end
//! (bounded by `tcp.close_linger_ms`), and only what is still open then is
//! reset and counted. Two dataplanes on an in-memory link, each with its
//! own worker threads, so that the peer keeps answering while one stops.

mod runtime_common;

use std::time::{Duration, Instant};

use dataplane::api::{CmEvent, Dataplane, DisconnectReason, DriveMode};
use dataplane::link::{MemLink, MemLinkConfig, MemLinkStatsHandle};
use runtime_common::*;

/// Two dataplanes on their own threads, `linger_ms` for both, and the
/// link's ends (a's, b's).
fn rig(linger_ms: u64) -> (Pair, MemLinkStatsHandle, MemLinkStatsHandle) {
    let (la, lb) = MemLink::pair(&MemLinkConfig::default(), MAC_A, MAC_B);
    let handles = (la.stats_handle(), lb.stats_handle());
    let config = |ip, mac| {
        let mut c = dataplane::config::Config::single("mem:test", ip, mac);
        c.idle.spin = 200;
        c.idle.sleep_us = 20;
        c.tcp.close_linger_ms = linger_ms;
        c
    };
    let a = Dataplane::open_with_link(&config(IP_A, MAC_A), la, DriveMode::Threads).expect("a");
    let b = Dataplane::open_with_link(&config(IP_B, MAC_B), lb, DriveMode::Threads).expect("b");
    (Pair { a, b }, handles.0, handles.1)
}

/// Waits for `dp`'s next disconnect event and returns its reason.
fn disconnected(dp: &Dataplane) -> DisconnectReason {
    let start = Instant::now();
    loop {
        match dp.poll_event() {
            Some(CmEvent::Disconnected { reason, .. }) => return reason,
            Some(_) => {}
            None => {
                assert!(start.elapsed() < PATIENCE, "no disconnect event");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// The tool's end of a run: the dataplane is stopped with its connection
/// still up. The peer sees an orderly close (our FIN), not a reset, and
/// nothing had to be reset.
#[test]
fn stopping_closes_open_connections_with_a_fin() {
    let (p, _, _) = rig(2000);
    let (_ea, _eb) = connect(&p);
    let Pair { a, b } = p;
    let start = Instant::now();
    let stats = a.stop();
    let took = start.elapsed();
    let resets: u64 = stats.iter().map(|s| s.shutdown_resets).sum();
    assert_eq!(resets, 0, "{stats:?}");
    assert_eq!(disconnected(&b), DisconnectReason::Closed);
    assert!(
        took < Duration::from_millis(1500),
        "the close took {took:?}"
    );
    println!("stopped with one connection up in {took:?}, no reset");
}

/// The peer closes first: our side answers with its own FIN (LAST-ACK),
/// and stopping right then waits for the peer's ACK of it instead of
/// resetting the connection.
#[test]
fn stopping_after_the_peer_closed_waits_for_its_last_ack() {
    let (p, _, _) = rig(2000);
    let (_ea, eb) = connect(&p);
    p.b.disconnect(&eb.qp, false).unwrap();
    assert_eq!(disconnected(&p.a), DisconnectReason::Closed);
    let Pair { a, b } = p;
    let stats = a.stop();
    let resets: u64 = stats.iter().map(|s| s.shutdown_resets).sum();
    assert_eq!(resets, 0, "{stats:?}");
    assert_eq!(disconnected(&b), DisconnectReason::Closed);
}

/// A peer that no longer answers: the FIN exchange cannot finish, so the
/// connection is reset once `tcp.close_linger_ms` has passed, and counted.
#[test]
fn an_unanswered_close_is_reset_after_the_linger_and_counted() {
    let (p, _, lb) = rig(300);
    let (_ea, _eb) = connect(&p);
    // Everything b sends from now on is lost.
    lb.lose_next(u64::MAX, 0);
    let Pair { a, b } = p;
    let start = Instant::now();
    let stats = a.stop();
    let took = start.elapsed();
    let resets: u64 = stats.iter().map(|s| s.shutdown_resets).sum();
    assert_eq!(resets, 1, "{stats:?}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(2000),
        "stopped after {took:?} with a 300 ms linger"
    );
    // b got our FIN, then our RST.
    assert!(
        matches!(
            disconnected(&b),
            DisconnectReason::Reset | DisconnectReason::Closed
        ),
        "b's connection ended"
    );
}

/// `tcp.close_linger_ms = 0` resets at once, as a stop without linger
/// asks.
#[test]
fn no_linger_resets_at_once() {
    let (p, _, _) = rig(0);
    let (_ea, _eb) = connect(&p);
    let Pair { a, b } = p;
    let stats = a.stop();
    let resets: u64 = stats.iter().map(|s| s.shutdown_resets).sum();
    assert_eq!(resets, 1, "{stats:?}");
    assert_eq!(disconnected(&b), DisconnectReason::Reset);
}
