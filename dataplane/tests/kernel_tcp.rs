//! The Linux kernel as the reference TCP peer: our sans-IO engine, behind
//! `tcp_offload::iface::Interface`, drives an AF_PACKET socket on one end
//! of a veth pair; the kernel's TCP sits on the other end, in a network
//! namespace of its own. Each test builds and removes its own namespace,
//! and needs root (without it the tests print a skip notice, or fail when
//! `IWARP_REQUIRE_ROOT_TESTS=1`).

mod kernel;
mod netns_common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use kernel::driver::{Driver, Loss, FRAME_BUF};
use kernel::raw::RawSocket;
use kernel::transfer::{ping, run, Open, Transfer};
use netns_common::{require_root, Netns};
use tcp_offload::tcp::{Config, State};
use tcp_offload::wire::{ArpOperation, ArpPacket, ArpRepr, EtherType, EthernetFrame};

/// An ARP request for `target`, as `(sender MAC, sender IP)`, if `frame` is
/// one.
fn arp_request_for(frame: &[u8], target: Ipv4Addr) -> Option<([u8; 6], Ipv4Addr)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.payload_ethertype() != EtherType::Arp {
        return None;
    }
    let arp = ArpPacket::new_checked(eth.payload()).ok()?;
    match ArpRepr::parse(&arp).ok()? {
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr,
            source_protocol_addr,
            target_protocol_addr,
            ..
        } if target_protocol_addr == target => Some((source_hardware_addr.0, source_protocol_addr)),
        _ => None,
    }
}

/// Plumbing check, and a diagnostic when the TCP tests fail: a connect
/// attempt from inside the namespace makes the kernel ARP for our address,
/// and the request must reach the raw socket with the kernel's MAC and IP.
#[test]
fn kernel_arp_request_reaches_raw_socket() {
    if !require_root() {
        return;
    }
    let net = Netns::create().expect("creating the namespace and veth pair");
    let sock = RawSocket::open(&net.host_if).expect("opening the AF_PACKET socket");
    let target = SocketAddrV4::new(net.our_ip, 9);
    // Nobody answers the ARP, so the connect fails; it only has to ask.
    let prober = kernel::peer::spawn_in_netns(&net.ns_path(), move || {
        let r = std::net::TcpStream::connect_timeout(&target.into(), Duration::from_secs(1));
        Ok(r.is_ok())
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = vec![0u8; FRAME_BUF];
    let mut seen = 0usize;
    let found = loop {
        assert!(
            Instant::now() < deadline,
            "no ARP request for {} within 5 s ({seen} other frames seen on {})",
            net.our_ip,
            net.host_if
        );
        match sock.recv(&mut buf).expect("recv on the raw socket") {
            Some(n) => {
                seen += 1;
                if let Some(found) = arp_request_for(&buf[..n], net.our_ip) {
                    break found;
                }
            }
            None => sock
                .wait_readable(Duration::from_millis(10))
                .expect("poll on the raw socket"),
        }
    };
    assert_eq!(
        found,
        (net.kernel_mac, net.kernel_ip),
        "ARP sender MAC and IP"
    );
    println!(
        "ARP request for {} from {} ({:02x?}) seen after {seen} other frames",
        net.our_ip, net.kernel_ip, net.kernel_mac
    );
    let connected = prober.join().expect("prober thread").expect("prober");
    assert!(!connected, "nothing should answer for {} yet", net.our_ip);
    drop(sock);
    net.remove_and_check();
}

/// Bytes each way in the bulk tests.
const BULK_BYTES: u64 = 4 << 20;

/// Wall-clock limit of each transfer test.
const TIMEOUT: Duration = Duration::from_secs(60);

fn assert_closed_cleanly(state: State) {
    assert!(
        matches!(state, State::TimeWait | State::Closed),
        "our connection ended in {}",
        state.name()
    );
}

/// Our engine connects to the kernel's listener; 4 MB each way at once,
/// verified on both sides, then FINs both ways.
#[test]
fn kernel_active_open_bulk_both_ways() {
    let Some(out) = run(&Transfer {
        name: "active open",
        open: Open::Active,
        bytes: BULK_BYTES,
        config: Config::default(),
        loss: None,
        timeout: TIMEOUT,
    }) else {
        return;
    };
    assert_eq!(out.received, BULK_BYTES);
    assert_eq!(out.acked, BULK_BYTES);
    assert_closed_cleanly(out.final_state);
}

/// The kernel connects to our listener; the same transfer.
#[test]
fn kernel_passive_open_bulk_both_ways() {
    let Some(out) = run(&Transfer {
        name: "passive open",
        open: Open::Passive,
        bytes: BULK_BYTES,
        config: Config::default(),
        loss: None,
        timeout: TIMEOUT,
    }) else {
        return;
    };
    assert_eq!(out.received, BULK_BYTES);
    assert_eq!(out.acked, BULK_BYTES);
    assert_closed_cleanly(out.final_state);
}

/// The active-open transfer with 3 % of the TCP frames we receive and 3 %
/// of those we send dropped (seeded): recovery against the kernel's TCP
/// still delivers every byte, in order, both ways.
#[test]
fn kernel_active_open_bulk_with_loss() {
    let Some(out) = run(&Transfer {
        name: "active open, 3 % loss each way",
        open: Open::Active,
        bytes: BULK_BYTES,
        config: Config::default(),
        loss: Some(Loss {
            rx: 0.03,
            tx: 0.03,
            seed: 0x1057,
            reorder: 0.0,
            hold: Duration::ZERO,
        }),
        timeout: TIMEOUT,
    }) else {
        return;
    };
    assert_eq!(out.received, BULK_BYTES);
    assert_eq!(out.acked, BULK_BYTES);
    assert_closed_cleanly(out.final_state);
    assert!(out.driver.rx_injected_drops > 0 && out.driver.tx_injected_drops > 0);
    assert!(out.conn.retransmits > 0, "loss without retransmissions");
    println!(
        "retransmits {}, fast retransmits {}, RTO expirations {}; injected drops: {} received, {} sent",
        out.conn.retransmits,
        out.conn.fast_retransmits,
        out.conn.rto_expirations,
        out.driver.rx_injected_drops,
        out.driver.tx_injected_drops
    );
}

/// Our side with the TCP of a hardware iWARP NIC (MSS and window scale
/// only: no SACK, no timestamps) against the kernel's full-featured TCP.
#[test]
fn kernel_iwarp_hardware_profile() {
    let Some(out) = run(&Transfer {
        name: "iWARP hardware profile",
        open: Open::Passive,
        bytes: BULK_BYTES,
        config: Config::iwarp_hardware(),
        loss: None,
        timeout: TIMEOUT,
    }) else {
        return;
    };
    assert_eq!(out.received, BULK_BYTES);
    assert_eq!(out.acked, BULK_BYTES);
    assert_closed_cleanly(out.final_state);
}

/// The hardware profile under 2 % loss each way: without SACK, recovery is
/// NewReno's (RFC 6582), on both sides.
#[test]
fn kernel_iwarp_hardware_profile_with_loss() {
    let Some(out) = run(&Transfer {
        name: "iWARP hardware profile, 2 % loss each way",
        open: Open::Active,
        bytes: BULK_BYTES,
        config: Config::iwarp_hardware(),
        loss: Some(Loss {
            rx: 0.02,
            tx: 0.02,
            seed: 0x2bad,
            reorder: 0.0,
            hold: Duration::ZERO,
        }),
        timeout: TIMEOUT,
    }) else {
        return;
    };
    assert_eq!(out.received, BULK_BYTES);
    assert_eq!(out.acked, BULK_BYTES);
    assert_closed_cleanly(out.final_state);
    assert!(out.conn.retransmits > 0, "loss without retransmissions");
    println!(
        "retransmits {}, fast retransmits {}, RTO expirations {}",
        out.conn.retransmits, out.conn.fast_retransmits, out.conn.rto_expirations
    );
}

/// ICMP echo: `ping` in the namespace is answered by our engine (after it
/// has answered the kernel's ARP request for our address).
#[test]
fn kernel_ping_answered_by_engine() {
    if !require_root() {
        return;
    }
    let net = Netns::create().expect("creating the namespace and veth pair");
    let mut driver = Driver::new(&net, Config::default(), None).expect("opening the raw socket");
    let (status, out, stats) = ping(&net, &mut driver, 3);
    drop(driver);
    net.remove_and_check();
    print!("{out}");
    println!("interface {stats:?}");
    assert!(status.success(), "ping failed ({status}): {out}");
    assert!(out.contains("3 received"), "ping output: {out}");
    assert!(
        stats.icmp_in >= 3 && stats.icmp_out >= 3,
        "echo requests and replies counted"
    );
    assert!(
        stats.arp_in >= 1 && stats.arp_out >= 1,
        "the kernel's ARP request answered"
    );
}

/// Reordering both ways, as netem's `reorder` makes it (a quarter of the
/// TCP frames held back 0.5 ms while the others pass), with 1 % loss so
/// that retransmissions overtake held originals. Both sides' timestamp
/// clocks tick every millisecond, so an overtaking retransmission is
/// mostly one tick newer than the originals behind it: Linux's PAWS takes
/// those (its one-tick window), and so must ours. Strict RFC 7323 would
/// drop every segment counted as tolerated; with the window only those a
/// delay pushed two ticks behind are dropped, on our side as on the
/// kernel's (`TcpExtPAWSEstab`, printed beside ours).
#[test]
fn kernel_reordering_paws_as_linux() {
    let Some(out) = run(&Transfer {
        name: "active open, reordering and 1 % loss each way",
        open: Open::Active,
        bytes: BULK_BYTES,
        config: Config::default(),
        loss: Some(Loss {
            rx: 0.01,
            tx: 0.01,
            seed: 0x9a45,
            reorder: 0.25,
            hold: Duration::from_micros(500),
        }),
        timeout: TIMEOUT,
    }) else {
        return;
    };
    assert_eq!(out.received, BULK_BYTES);
    assert_eq!(out.acked, BULK_BYTES);
    assert_closed_cleanly(out.final_state);
    assert!(out.driver.rx_reordered > 0 && out.driver.tx_reordered > 0);
    let kernel = |name: &str| {
        out.kernel_counters
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no {name} in the kernel's counters"))
    };
    let c = &out.conn;
    println!(
        "held back: {} received ({} of them two ticks late), {} sent; PAWS drops: ours {}, the \
         kernel's {}; segments only the one-tick window let through (strict RFC 7323 would drop \
         them): {}; retransmits: ours {}, the kernel's {}",
        out.driver.rx_reordered,
        out.driver.rx_held_stale,
        out.driver.tx_reordered,
        c.paws_dropped,
        kernel("TcpExtPAWSEstab"),
        c.paws_tolerated,
        c.retransmits,
        kernel("TcpRetransSegs"),
    );
    assert!(
        c.paws_tolerated > 0,
        "no retransmission overtook a held original: {c:?}"
    );
    // How many held segments come out two ticks behind depends on how
    // long the load of the machine kept this thread from reading; the
    // driver counts them as it passes them on. With Linux's window no
    // other segment may be dropped.
    assert!(
        c.paws_dropped <= out.driver.rx_held_stale,
        "PAWS dropped {} segments, only {} came two ticks late: {c:?}",
        c.paws_dropped,
        out.driver.rx_held_stale
    );
}
