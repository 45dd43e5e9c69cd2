//! A worker asleep in its idle back-off is woken by the application thread
//! that hands it work, instead of leaving the work until its sleep ends:
//! with sleeps of a tenth of a second, a memory registration (a control
//! message) and a posted Write each wake the sleeping worker, which counts
//! it; the Write completes and its bytes arrive. The workers run with
//! `idle.yield_cpu` off (the other runtime tests run with it on).

mod runtime_common;

use std::time::Duration;

use dataplane::api::{Access, Dataplane, DriveMode, SendWr, SgeList, WcOpcode, WcStatus};
use dataplane::config::{Config, MacAddr, Neighbor};
use dataplane::link::{MemLink, MemLinkConfig};
use runtime_common::*;
use tcp_offload::wire::EthernetAddress;

const SLEEP_US: u64 = 100_000;

fn config(ip: std::net::Ipv4Addr, peer: (std::net::Ipv4Addr, EthernetAddress)) -> Config {
    let mac = if ip == IP_A { MAC_A } else { MAC_B };
    let mut c = Config::single("mem:test", ip, mac);
    c.idle.spin = 10;
    c.idle.sleep_us = SLEEP_US;
    c.idle.yield_cpu = false;
    c.ports[0].neighbors.push(Neighbor {
        ip: peer.0,
        mac: MacAddr(peer.1),
    });
    c
}

/// Waits until worker 0 of `dp` has begun a sleep after this call, then
/// a little longer so that it is parked in it.
fn asleep(p: &Pair, dp: &Dataplane) {
    let before = dp.stats()[0].idle_sleeps;
    p.until("the worker to go to sleep", |_| {
        (dp.stats()[0].idle_sleeps > before).then_some(())
    });
    std::thread::sleep(Duration::from_millis(5));
}

#[test]
fn work_handed_to_a_sleeping_worker_wakes_it() {
    let (la, lb) = MemLink::pair(&MemLinkConfig::default(), MAC_A, MAC_B);
    let p = Pair {
        a: Dataplane::open_with_link(&config(IP_A, (IP_B, MAC_B)), la, DriveMode::Threads)
            .expect("open a"),
        b: Dataplane::open_with_link(&config(IP_B, (IP_A, MAC_A)), lb, DriveMode::Threads)
            .expect("open b"),
    };
    let (mut a, b) = connect(&p);
    let len = 8192;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;

    // A registration is a control message to every worker.
    asleep(&p, &p.a);
    let woken = p.a.stats()[0].idle_wakeups;
    let src = buffer(&p.a, a.pd, len, rw);
    let after_reg = p.a.stats()[0].idle_wakeups;
    assert!(
        after_reg > woken,
        "registering memory did not wake the sleeping worker ({woken} wake-ups before, \
         {after_reg} after)"
    );
    let dst = buffer(&p.b, b.pd, len, rw);
    let data = src.fill_pattern(7);

    // A posted Write.
    asleep(&p, &p.a);
    let woken = p.a.stats()[0].idle_wakeups;
    let wr = SendWr::write(
        1,
        SgeList::single(src.mr.sge(0, len as u32)),
        dst.mr.addr(),
        dst.mr.rkey(),
    );
    a.qp.post_send(&wr).unwrap();
    let wc = wait_wc(&p, &mut a, 1);
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaWrite, len as u32)
    );
    wait_placed(&p, "the Write", &data, || dst.bytes());
    assert_eq!(dst.bytes(), data, "the Write's destination");
    assert!(dst.guards_intact());
    let after_post = p.a.stats()[0].idle_wakeups;
    assert!(
        after_post > woken,
        "posting a Write did not wake the sleeping worker ({woken} wake-ups before, \
         {after_post} after)"
    );
    println!(
        "a: {} sleeps, {after_post} cut short by the application; b: {} sleeps",
        p.a.stats()[0].idle_sleeps,
        p.b.stats()[0].idle_sleeps
    );
}
