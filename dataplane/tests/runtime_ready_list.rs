//! A worker services only the connections that have work: with fifteen
//! idle connections beside a busy one, an iteration's connection stage
//! runs about as many connection services as with the busy one alone
//! (counted by `WorkerStats::conn_visits`), instead of one per
//! connection per iteration.

mod runtime_common;

use dataplane::api::DriveMode;
use runtime_common::*;

/// Both workers' connection services so far.
fn visits(p: &Pair) -> u64 {
    p.a.stats()[0].conn_visits + p.b.stats()[0].conn_visits
}

/// Lets what is in flight settle, then counts the connection services of
/// `polls` iterations of both loops with nothing posted.
fn quiet_visits(p: &Pair, polls: u64) -> u64 {
    for _ in 0..300 {
        p.pump();
    }
    let before = visits(p);
    for _ in 0..polls {
        p.a.poll();
        p.b.poll();
    }
    visits(p) - before
}

#[test]
fn idle_connections_cost_no_service() {
    let p = Pair::new(&PairOptions {
        mode: DriveMode::Inline,
        ..PairOptions::default()
    });
    let (mut a, mut b) = connect(&p);
    let polls = 500;
    let alone = quiet_visits(&p, polls);
    let idle: Vec<(End, End)> = (0..15).map(|_| connect(&p)).collect();
    let with_idle = quiet_visits(&p, polls);
    println!("visits in {polls} quiet iterations: {alone} alone, {with_idle} with 15 idle");
    // A scan of every slot would be 2 sides x 16 connections x 500
    // iterations = 16000 services; an idle connection may still see a
    // timer or two of its TCP in the window.
    assert!(
        with_idle <= alone + 2 * 15 * 3,
        "idle connections were serviced: {with_idle} services in {polls} iterations \
         ({alone} with one connection)"
    );
    // The busy connection is still found: a Write completes beside the
    // idle ones, and services happen for it.
    let before = visits(&p);
    let n = exchange(&p, &mut a, &mut b, Op::Write, 65_536, 1);
    assert_eq!(n, 65_536);
    assert!(visits(&p) > before, "the busy connection was not serviced");
    drop(idle);
}
