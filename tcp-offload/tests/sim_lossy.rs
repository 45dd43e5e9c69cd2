//! Heavy loss, and throughput under loss.
//!
//! A transfer must still complete at 10 % loss. And the TCP of hardware
//! iWARP NICs (MSS and window scale only: NewReno recovery without SACK or
//! timestamps) must keep a sane share of a bottleneck's bandwidth at 1 %
//! loss, measured against the same profile on the same link without loss;
//! the SACK profile is measured alongside for comparison.

use std::time::Duration;

use tcp_offload::tcp::Config;
use tcp_offload::Instant;
use tcp_sim::bulk::{Transfer, TransferSpec};
use tcp_sim::LinkConfig;

const MIB: u64 = 1 << 20;

fn describe(t: &Transfer) -> String {
    format!(
        "client {:?}\nserver {:?}\nup {:?}\ndown {:?}",
        t.apps.client_app,
        t.apps.server_app,
        t.net.link_stats(t.link.forward),
        t.net.link_stats(t.link.backward)
    )
}

fn ten_percent_loss(tcp: Config, seed: u64) {
    let link = LinkConfig::lossy(0.10).with_latency(Duration::from_millis(1));
    let spec = TransferSpec::symmetric(seed, tcp, link, MIB);
    let mut t = Transfer::new(&spec).unwrap();
    let end = t.run(Instant::from_millis(3_600_000));
    let end = end.unwrap_or_else(|e| panic!("{e}\n{}", describe(&t)));
    assert_eq!(t.apps.client_app.received, MIB);
    assert_eq!(t.apps.server_app.received, MIB);
    let up = t.net.link_stats(t.link.forward);
    let lost = up.dropped_loss as f64 / up.sent as f64;
    assert!(lost > 0.08, "the link lost only {lost}");
    let s = t.apps.client_app.conn_stats;
    println!(
        "10% loss, sack={}: finished at {end}, uplink lost {}/{} frames, client retransmits {} \
         (fast {}, RTO {})",
        spec.client.sack,
        up.dropped_loss,
        up.sent,
        s.retransmits,
        s.fast_retransmits,
        s.rto_expirations
    );
    assert!(s.retransmits >= up.dropped_loss / 2, "{s:?}");
}

#[test]
fn completes_at_ten_percent_loss() {
    ten_percent_loss(Config::default(), 10);
}

#[test]
fn completes_at_ten_percent_loss_without_sack() {
    ten_percent_loss(Config::iwarp_hardware(), 11);
}

/// The bottleneck of the throughput test: 100 Mbit/s, 1 ms each way, a
/// 64 KiB drop-tail queue (about two bandwidth-delay products).
fn bottleneck(loss: f64) -> LinkConfig {
    LinkConfig::bottleneck(100_000_000, 64 * 1024)
        .with_latency(Duration::from_millis(1))
        .with_loss(loss)
}

const BOTTLENECK_BPS: f64 = 100e6;

/// Sends `bytes` from client to server over the bottleneck with loss
/// `loss` (the ACK path is lossless) and returns the goodput in bit/s,
/// from the active open to the last byte acknowledged.
fn goodput(tcp: &Config, loss: f64, bytes: u64, seed: u64) -> f64 {
    let spec = TransferSpec {
        seed,
        client: tcp.clone(),
        server: tcp.clone(),
        uplink: bottleneck(loss),
        downlink: bottleneck(0.0),
        client_bytes: bytes,
        server_bytes: 0,
        verify: true,
        static_arp: true,
    };
    let mut t = Transfer::new(&spec).unwrap();
    let done = t.run_until(Instant::from_millis(600_000), |_, apps| apps.data_done());
    let done = done.unwrap_or_else(|e| panic!("loss {loss}: {e}\n{}", describe(&t)));
    assert_eq!(t.apps.server_app.received, bytes);
    let secs = done.total_micros() as f64 / 1e6;
    let bps = bytes as f64 * 8.0 / secs;
    let s = t.apps.client_app.conn_stats;
    let up = t.net.link_stats(t.link.forward);
    println!(
        "  sack={:<5} loss {:>4.1}%: {:>6.1} Mbit/s ({:.0}% of the link), {secs:.3} s, \
         {} lost, {} queue drops, {} retransmits (fast {}, RTO {})",
        tcp.sack,
        loss * 100.0,
        bps / 1e6,
        100.0 * bps / BOTTLENECK_BPS,
        up.dropped_loss,
        up.dropped_queue,
        s.retransmits,
        s.fast_retransmits,
        s.rto_expirations
    );
    // The bottleneck is never beaten.
    assert!(bps <= BOTTLENECK_BPS * 1.001, "{bps}");
    bps
}

/// Goodput of a profile at 1 % loss relative to no loss, averaged over a
/// few seeds so that one unlucky burst of losses does not decide it.
fn loss_ratio(name: &str, tcp: &Config) -> f64 {
    const BYTES: u64 = 8 * MIB;
    println!("{name}:");
    let clean = goodput(tcp, 0.0, BYTES, 1);
    let lossy: f64 = (0..4)
        .map(|seed| goodput(tcp, 0.01, BYTES, 100 + seed))
        .sum::<f64>()
        / 4.0;
    let ratio = lossy / clean;
    println!(
        "  {name}: 1% loss keeps {:.0}% of the loss-free goodput",
        ratio * 100.0
    );
    // Without loss the flow fills most of the bottleneck.
    assert!(
        clean > 0.8 * BOTTLENECK_BPS,
        "{name}: {clean} bit/s without loss"
    );
    ratio
}

#[test]
fn hardware_iwarp_profile_keeps_its_throughput_under_loss() {
    let hw = loss_ratio(
        "iWARP hardware profile (NewReno, no SACK, no timestamps)",
        &Config::iwarp_hardware(),
    );
    let sack = loss_ratio("default profile (SACK, timestamps)", &Config::default());
    println!("goodput ratio at 1% loss: hardware profile {hw:.2}, SACK profile {sack:.2}");
    assert!(
        hw > 0.2,
        "hardware profile keeps only {hw:.2} of its goodput at 1% loss"
    );
    assert!(
        sack > 0.2,
        "SACK profile keeps only {sack:.2} of its goodput at 1% loss"
    );
}
