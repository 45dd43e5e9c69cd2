//! Two dataplane processes on DPDK's `net_tap`, a port with checksum
//! offloads: RDMA WRITE, READ and SEND of up to 4 MiB between them,
//! verified byte for byte (the exchange of `exchange_common`), with the
//! TCP checksum left to the port on transmit and the port's receive
//! verdicts trusted.
//!
//! Each child's PMD creates a tap device in the child's namespace; once
//! the dataplane is open, the child bridges that tap to the namespace's
//! veth end, so frames cross tap → bridge → veth pair → bridge → tap. The
//! tap's kernel side takes another MAC than the port's: a bridge keeps
//! frames addressed to one of its ports' own MAC for the host.
//!
//! DPDK 22.11's tap PMD advertises TCP checksum offload on transmit and
//! IPv4/TCP checksum verdicts on receive (it computes both in software
//! when asked, as a NIC would in hardware). The test checks that the port
//! took the checksum of frames each side sent (`tx_cksum_offloaded` of
//! the link) and that each side trusted the port's verdicts on what it
//! received (`rx_cksum_trusted` of the workers), with at least one frame
//! per MTU of payload either way.
//!
//! It also advertises TCP segmentation offload, which it runs through
//! DPDK's software segmentation. One test turns it off (each frame one
//! segment, as above); the other leaves it on: each side must hand the
//! port trains of whole FPDUs (`tx_tso_frames`, `tx_tso_segments`) for at
//! least half its payload, and neither may receive a segment that ends
//! inside an FPDU (`rx_segments_mid_fpdu`): every segment the port cut
//! holds one whole FPDU. Needs root (prints a skip notice without it, or
//! fails with `IWARP_REQUIRE_ROOT_TESTS=1`).

mod exchange_common;
mod netns_common;
mod runtime_common;

use std::process::Command;

use dataplane::api::Dataplane;
use exchange_common::{run, total, Exchange};

/// The tap device each child's PMD creates (one per namespace).
const TAP: &str = "xtap0";

/// The bridge joining it to the namespace's veth end.
const BRIDGE: &str = "xbr0";

/// Payload bytes one frame carries at most (MTU 1500 less the IP and TCP
/// headers): a bound on the frames any payload needs.
const MAX_PAYLOAD: usize = 1460;

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running ip {args:?}: {e}"));
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Bridges the PMD's tap to the veth end `iface` (in this namespace).
fn bridge(iface: &str) {
    // A locally administered MAC that no endpoint uses.
    ip(&["link", "set", TAP, "address", "02:1a:fa:00:00:fe"]);
    ip(&["link", "add", BRIDGE, "type", "bridge"]);
    ip(&["link", "set", TAP, "master", BRIDGE]);
    ip(&["link", "set", iface, "master", BRIDGE]);
    for dev in [TAP, BRIDGE] {
        ip(&["link", "set", dev, "up"]);
    }
}

/// A link counter of `dp` by name.
fn link_counter(side: &str, dp: &Dataplane, name: &str) -> u64 {
    dp.link_stats()
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, v)| v)
        .unwrap_or_else(|| panic!("{side}: the link keeps no {name}"))
}

/// Payload bytes `side` sends and receives in the exchange.
fn payload_out_in(side: &str) -> (usize, usize) {
    // The client sends WRITE and SEND payloads and receives READ
    // responses; the server the other way round.
    if side == "client" {
        (2 * total(), total())
    } else {
        (total(), 2 * total())
    }
}

/// Checks that the port took the TCP checksum of at least `least_out`
/// segments (`offloaded`, frames and segments cut from trains) and that
/// `side` trusted its verdict on at least one frame per MTU received.
fn check_offloads(side: &str, dp: &Dataplane, offloaded: u64) {
    let stats = dp.stats();
    let trusted: u64 = stats.iter().map(|s| s.rx_cksum_trusted).sum();
    let received: u64 = stats.iter().map(|s| s.rx_packets).sum();
    let sent: u64 = stats.iter().map(|s| s.tx_packets).sum();
    let split: u64 = stats.iter().map(|s| s.rx_segments_mid_fpdu).sum();
    assert_eq!(
        split, 0,
        "{side}: {split} received segments ended inside an FPDU"
    );
    let (out, inn) = payload_out_in(side);
    let (least_out, least_in) = (
        out.div_ceil(MAX_PAYLOAD) as u64,
        inn.div_ceil(MAX_PAYLOAD) as u64,
    );
    println!(
        "{side}: {offloaded} segments sent with the TCP checksum left to the port, from \
         {sent} frames (at least {least_out} segments for {out} payload bytes); {trusted} \
         of {received} received on the port's verdict (at least {least_in} for {inn})"
    );
    assert!(
        offloaded >= least_out,
        "{side}: {offloaded} segments offloaded, fewer than the {least_out} its payload needs"
    );
    assert!(
        trusted >= least_in,
        "{side}: {trusted} frames trusted, fewer than the {least_in} its payload needs"
    );
}

fn checksums_on_the_port(side: &str, dp: &Dataplane) {
    assert_eq!(
        link_counter(side, dp, "tx_tso_frames"),
        0,
        "{side}: trains while off"
    );
    check_offloads(side, dp, link_counter(side, dp, "tx_cksum_offloaded"));
}

/// With segmentation offload: most payload leaves in trains that the port
/// cuts, every one of its segments holding one whole FPDU (the receiver
/// verifies each FPDU's CRC and placement, and `check_offloads` finds no
/// received segment that ended inside an FPDU).
fn trains_on_the_port(side: &str, dp: &Dataplane) {
    let trains = link_counter(side, dp, "tx_tso_frames");
    let cut = link_counter(side, dp, "tx_tso_segments");
    let single = link_counter(side, dp, "tx_cksum_offloaded");
    let (out, _) = payload_out_in(side);
    println!("{side}: {trains} trains cut into {cut} segments, {single} frames on their own");
    // At least half the payload in trains.
    let least_cut = (out / 2).div_ceil(MAX_PAYLOAD) as u64;
    assert!(
        trains > 0 && cut >= 2 * trains,
        "{side}: {trains} trains, {cut} segments"
    );
    assert!(
        cut >= least_cut,
        "{side}: only {cut} segments cut from trains, fewer than half its payload needs \
         ({least_cut})"
    );
    check_offloads(side, dp, single + cut);
}

fn no_segmentation(c: &mut dataplane::config::Config) {
    c.tcp.segmentation_offload = false;
}

#[test]
fn tap_two_processes_with_checksum_offload() {
    run(&Exchange {
        test: "tap_two_processes_with_checksum_offload",
        pmd: "net_tap",
        device: |_| format!("net_tap0,iface={TAP}"),
        attach: Some(bridge),
        configure: Some(no_segmentation),
        check: checksums_on_the_port,
    });
}

#[test]
fn tap_two_processes_with_segmentation_offload() {
    run(&Exchange {
        test: "tap_two_processes_with_segmentation_offload",
        pmd: "net_tap",
        device: |_| format!("net_tap0,iface={TAP}"),
        attach: Some(bridge),
        configure: None,
        check: trains_on_the_port,
    });
}
