//! A `net_af_xdp` port on a veth pair: the mbufs the driver parks in its
//! fill ring at RX queue setup and abandons at close are credited to the
//! pool, exactly, so that the pool is freed, EAL cleaned up and its runtime
//! directory removed by the process itself.
//!
//! The process moves to a network namespace of its own (`unshare`) before
//! EAL starts, so the veth pair lives and dies with it: nothing is left
//! behind even when the test fails. Needs root (prints a skip notice
//! without it, or fails with `IWARP_REQUIRE_ROOT_TESTS=1`).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use dpdk_bindings::{MbufBurst, Mempool, Port, PortConfig};

/// What DPDK 22.11's af_xdp takes per RX queue for the fill ring.
const FILL_RESERVE: u32 = 2048;

/// Frames sent through the port, so that TX mbufs are in flight when it
/// closes.
const FRAMES: usize = 200;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `ip args…` in the process's (new) namespace.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// A broadcast frame of an experimental EtherType, padded to 60 bytes.
fn frame(seq: usize) -> [u8; 60] {
    let mut f = [0u8; 60];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0xaf, 0, 1]);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f[14..22].copy_from_slice(&(seq as u64).to_be_bytes());
    f
}

#[test]
fn afxdp_parked_mbufs_do_not_keep_the_pool() {
    if !is_root() {
        assert!(
            std::env::var_os("IWARP_REQUIRE_ROOT_TESTS").is_none(),
            "IWARP_REQUIRE_ROOT_TESTS is set but the test is not root"
        );
        println!("skipped: needs root (a network namespace and a veth pair)");
        return;
    }
    // SAFETY: unshare affects only this thread's (and its future
    // children's) namespace; EAL has not started.
    let ret = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(ret, 0, "unshare: {}", std::io::Error::last_os_error());
    ip(&[
        "link", "add", "afx0", "type", "veth", "peer", "name", "afx1",
    ]);
    ip(&["link", "set", "afx0", "up"]);
    ip(&["link", "set", "afx1", "up"]);

    let (guard, eal) = common::start(
        "afxdp",
        &["net_af_xdp0,iface=afx0,start_queue=0,queue_count=1"],
    );
    let runtime_dir = guard.0.clone();
    assert!(runtime_dir.exists());

    let pool = Mempool::new(&eal, "afxdp_pool", 4095, 256, 2176, -1).expect("pool");
    let mut port = Port::by_name(&eal, "net_af_xdp0").expect("the af_xdp port");
    assert_eq!(port.dev_info().expect("dev info").driver_name, "net_af_xdp");
    let before = pool.in_use_count();
    port.configure(&PortConfig::default(), &pool)
        .expect("configure");
    let parked = pool.in_use_count() - before;
    println!("RX queue setup took {parked} mbufs from the pool");
    assert_eq!(parked, FILL_RESERVE, "the fill ring's reserve");
    port.start().expect("start");

    let mut tx = port.tx_queue(0).expect("tx queue");
    let mut rx = port.rx_queue(0).expect("rx queue");
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while sent < FRAMES {
        assert!(Instant::now() < deadline, "only {sent} frames sent");
        let mut burst = MbufBurst::new();
        for i in 0..(FRAMES - sent).min(16) {
            let mut m = pool.alloc().expect("mbuf");
            m.append(60)
                .expect("room")
                .copy_from_slice(&frame(sent + i));
            burst.push(m).expect("burst room");
        }
        sent += tx.tx_burst(&mut burst);
    }
    // Anything the kernel sends on the peer (nothing, normally) is
    // received and freed: received mbufs are not the driver's any more.
    let mut got = MbufBurst::new();
    rx.rx_burst(&mut got);
    drop(got);
    let in_flight = pool.in_use_count();
    println!("{sent} frames sent; {in_flight} mbufs out before close");
    assert!(in_flight >= FILL_RESERVE);

    drop((rx, tx));
    assert_eq!(pool.orphaned_count(), 0, "nothing credited while open");
    drop(port);
    println!(
        "after close: {} mbufs out, {} credited as orphaned",
        pool.in_use_count(),
        pool.orphaned_count()
    );
    assert_eq!(pool.orphaned_count(), FILL_RESERVE, "the setup's count");
    assert_eq!(
        pool.in_use_count(),
        FILL_RESERVE,
        "the sent frames' mbufs reaped before close"
    );

    drop(pool);
    drop(eal);
    assert!(
        !runtime_dir.exists(),
        "{} left behind: the pool (and EAL) were kept",
        runtime_dir.display()
    );
    println!("runtime dir {} removed at cleanup", runtime_dir.display());
}
