//! What the DPDK runtime tests share: EAL without hugepages under a file
//! prefix of their own (removed also when a test fails), two dataplanes
//! over a `net_ring` pair, and a check that nothing is left in the runtime
//! directory afterwards.
//!
//! EAL starts once per process: each test file holds one `#[test]`
//! (cargo-nextest runs every test in a process of its own, plain
//! `cargo test` each file as its own binary).
#![allow(dead_code, reason = "each test file uses part of the harness")]

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use dataplane::api::{Dataplane, DriveMode};
use dataplane::config::{Config, MacAddr, Neighbor};
use dataplane::dpdk_link::{default_eal_args, start_eal, DpdkLink, DpdkLinkOptions};
use dpdk_bindings::Eal;
use tcp_offload::wire::EthernetAddress;

use super::runtime_common::{Pair, IP_A, IP_B, MAC_A, MAC_B};

/// The runtime directory EAL makes for `prefix` (as root:
/// `/var/run/dpdk/<prefix>`).
pub fn runtime_dir(prefix: &str) -> PathBuf {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    let base = if root {
        PathBuf::from("/var/run")
    } else {
        std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"))
    };
    base.join("dpdk").join(prefix)
}

/// Removes the runtime directory on drop, for a test that failed before
/// EAL could clean up after itself.
pub struct RuntimeDir(pub PathBuf);

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the process's EAL without hugepages; `mem_mb` of memory.
pub fn start(test: &str, mem_mb: u32) -> (RuntimeDir, Arc<Eal>) {
    let prefix = format!("iwarp-{test}-{}", std::process::id());
    let guard = RuntimeDir(runtime_dir(&prefix));
    let mut args = default_eal_args(&prefix, &[]);
    if let Some(i) = args.iter().position(|a| a == "-m") {
        args[i + 1] = mem_mb.to_string();
    }
    let eal = start_eal(&args).expect("EAL starts without hugepages");
    assert!(eal.iova_is_va(), "--no-huge runs with IOVA-as-VA");
    (guard, eal)
}

/// The configuration of one end.
pub fn config(
    ip: Ipv4Addr,
    mac: EthernetAddress,
    peer: (Ipv4Addr, EthernetAddress),
    mtu: usize,
    workers: usize,
    static_arp: bool,
) -> Config {
    let mut c = Config::single("ring", ip, mac);
    c.workers.count = workers;
    c.ports[0].mtu = mtu;
    c.idle.spin = 200;
    c.idle.sleep_us = 20;
    c.tcp.recv_buffer = c.tcp.recv_buffer.max(4 * mtu);
    if static_arp {
        c.ports[0].neighbors.push(Neighbor {
            ip: peer.0,
            mac: MacAddr(peer.1),
        });
    }
    c
}

/// Two dataplanes over a `net_ring` pair, with worker threads registered
/// as EAL lcores; also the links' counters.
pub fn ring_pair(
    eal: &Arc<Eal>,
    mtu: usize,
    workers: usize,
) -> (
    Pair,
    Arc<dataplane::dpdk_link::DpdkLinkStats>,
    Arc<dataplane::dpdk_link::DpdkLinkStats>,
) {
    let opts = DpdkLinkOptions {
        queues: workers as u16,
        mtu,
        ..DpdkLinkOptions::default()
    };
    let (la, lb) =
        DpdkLink::ring_pair(eal, "dp", &opts, (Some(MAC_A), Some(MAC_B))).expect("ring pair links");
    assert!(la.setup().multi_seg_tx(), "net_ring chains segments");
    let (sa, sb) = (la.stats(), lb.stats());
    let a = Dataplane::open_with_link(
        &config(IP_A, MAC_A, (IP_B, MAC_B), mtu, workers, false),
        la,
        DriveMode::Threads,
    )
    .expect("open a");
    let b = Dataplane::open_with_link(
        &config(IP_B, MAC_B, (IP_A, MAC_A), mtu, workers, false),
        lb,
        DriveMode::Threads,
    )
    .expect("open b");
    (Pair { a, b }, sa, sb)
}

/// After everything DPDK was dropped: EAL cleaned up its runtime
/// directory.
pub fn assert_clean(guard: &RuntimeDir) {
    assert!(
        !guard.0.exists(),
        "{} left behind: {:?}",
        guard.0.display(),
        std::fs::read_dir(&guard.0).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    println!("cleanup: {} removed", guard.0.display());
}
