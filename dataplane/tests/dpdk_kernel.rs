//! The Linux kernel's TCP against our TCP engine on a DPDK port: a
//! `net_af_packet` port on our end of a veth pair (root namespace, no
//! address), the kernel's address on the other end inside a network
//! namespace with its offloads off. The engine runs below the RDMA layer
//! (the dataplane's application API carries RDMA, not plain TCP streams),
//! driven over the dataplane's own `DpdkLink` queue, so that these tests
//! prove the DPDK port and the TCP engine against a real third-party TCP.
//!
//! Each test runs in a process of its own (one EAL per process: run with
//! cargo-nextest), needs root (prints a skip notice without it, or fails
//! with `IWARP_REQUIRE_ROOT_TESTS=1`), and checks at the end that the EAL
//! runtime directory and the namespace are gone; guards remove both on
//! failure too.

#[path = "kernel/dpdk_driver.rs"]
mod dpdk_driver;
#[allow(dead_code, reason = "shared plumbing; this file uses part of it")]
mod kernel;
mod netns_common;

use std::path::PathBuf;
use std::time::Duration;

use dpdk_driver::{DpdkDriver, RuntimeDirGuard};
use kernel::driver::Loss;
use kernel::transfer::{counter, drive, ping, Open, Outcome, Transfer};
use netns_common::{require_root, Netns};
use tcp_offload::tcp::{Config, State};

/// Bytes each way in the bulk tests.
const BULK_BYTES: u64 = 10 << 20;

/// Wall-clock limit of each transfer.
const TIMEOUT: Duration = Duration::from_secs(120);

/// Builds the namespace and the DPDK port, runs `f`, tears everything
/// down and checks that nothing is left: the EAL runtime directory, the
/// namespace and our veth end.
fn with_port<T>(
    test: &str,
    tcp: Config,
    loss: Option<Loss>,
    f: impl FnOnce(&Netns, &mut DpdkDriver) -> T,
) -> Option<T> {
    if !require_root() {
        return None;
    }
    let net = Netns::create().expect("creating the namespace and veth pair");
    let (ns, host_if) = (net.ns.clone(), net.host_if.clone());
    let prefix = format!("iwarp-{test}-{}", std::process::id());
    let guard = RuntimeDirGuard(PathBuf::from("/var/run/dpdk").join(&prefix));
    let (mut driver, eal) =
        DpdkDriver::new(&net, &prefix, tcp, loss).expect("EAL and the net_af_packet port");
    println!(
        "net_af_packet on {} (kernel {} in {}), our {} {:02x?}; setup {:?}",
        net.host_if,
        net.kernel_ip,
        net.ns,
        net.our_ip,
        net.our_mac(),
        driver.link().setup()
    );
    let out = f(&net, &mut driver);
    drop(driver);
    drop(eal);
    assert!(!guard.0.exists(), "EAL left {} behind", guard.0.display());
    net.remove_and_check();
    println!(
        "cleanup: {} removed, namespace {ns} and {host_if} removed",
        guard.0.display()
    );
    Some(out)
}

/// Both ways at once, `bytes` each, verified on both sides, then FINs
/// both ways: the raw-socket tests' transfer, over the DPDK port.
fn transfer(
    net: &Netns,
    driver: &mut DpdkDriver,
    name: &'static str,
    open: Open,
    bytes: u64,
) -> Outcome {
    drive(
        net,
        driver,
        &Transfer {
            name,
            open,
            bytes,
            // Already given to the driver by `with_port`.
            config: Config::default(),
            loss: driver.loss(),
            timeout: TIMEOUT,
        },
    )
}

fn assert_complete(out: &Outcome) {
    assert_eq!(out.received, BULK_BYTES, "bytes we received");
    assert_eq!(out.acked, BULK_BYTES, "bytes of ours acknowledged");
    assert_eq!(out.kernel_sent, BULK_BYTES, "bytes the kernel sent");
    assert_eq!(out.kernel_received, BULK_BYTES, "bytes the kernel received");
    assert!(
        matches!(out.final_state, State::TimeWait | State::Closed),
        "our connection ended in {}",
        out.final_state.name()
    );
    // The kernel's counters (resets, checksum errors, and RSTs, which
    // with loss injected may answer a late duplicate after its close) are
    // checked by `drive`, one rule for every kernel test.
    let c = &out.kernel_counters;
    assert_eq!(counter(c, "TcpEstabResets"), 0, "the kernel saw a reset");
}

/// The dataplane's TCP as client of a kernel TCP server.
#[test]
fn dpdk_active_open_to_kernel_server() {
    let Some(out) = with_port("kact", Config::default(), None, |net, d| {
        transfer(
            net,
            d,
            "DPDK client, kernel server",
            Open::Active,
            BULK_BYTES,
        )
    }) else {
        return;
    };
    assert_complete(&out);
}

/// The dataplane's TCP as server for a kernel TCP client.
#[test]
fn dpdk_passive_open_from_kernel_client() {
    let Some(out) = with_port("kpas", Config::default(), None, |net, d| {
        transfer(
            net,
            d,
            "kernel client, DPDK server",
            Open::Passive,
            BULK_BYTES,
        )
    }) else {
        return;
    };
    assert_complete(&out);
}

/// The client transfer with 2 % of the TCP frames we receive and 2 % of
/// those we send dropped on our side (seeded): recovery against the
/// kernel's TCP still delivers every byte, both ways.
#[test]
fn dpdk_active_open_with_loss() {
    let loss = Loss {
        rx: 0.02,
        tx: 0.02,
        seed: 0xd9d4,
        reorder: 0.0,
        hold: Duration::ZERO,
    };
    let Some((out, rx_drops, tx_drops)) =
        with_port("kloss", Config::default(), Some(loss), |net, d| {
            let out = transfer(
                net,
                d,
                "DPDK client, 2 % loss each way",
                Open::Active,
                BULK_BYTES,
            );
            (out, d.stats.rx_injected_drops, d.stats.tx_injected_drops)
        })
    else {
        return;
    };
    assert_complete(&out);
    assert!(rx_drops > 0 && tx_drops > 0, "loss was injected");
    assert!(out.conn.retransmits > 0, "loss without retransmissions");
    println!(
        "injected drops: {rx_drops} received, {tx_drops} sent; our retransmits {}, fast \
         retransmits {}, RTO expirations {}; kernel retransmitted {} segments",
        out.conn.retransmits,
        out.conn.fast_retransmits,
        out.conn.rto_expirations,
        counter(&out.kernel_counters, "TcpRetransSegs")
    );
}

/// `ping` in the namespace: the kernel's ARP request for our address and
/// its echo requests are answered through the DPDK port.
#[test]
fn dpdk_answers_kernel_arp_and_ping() {
    let Some((status, text, stats)) =
        with_port("kping", Config::default(), None, |net, d| ping(net, d, 5))
    else {
        return;
    };
    print!("{text}");
    println!("interface {stats:?}");
    assert!(status.success(), "ping failed ({status}): {text}");
    assert!(text.contains("5 received"), "ping output: {text}");
    assert!(
        stats.icmp_in >= 5 && stats.icmp_out >= 5,
        "echo requests and replies counted"
    );
    assert!(
        stats.arp_in >= 1 && stats.arp_out >= 1,
        "the kernel's ARP request answered"
    );
}
