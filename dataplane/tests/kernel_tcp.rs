//! The Linux kernel as the reference TCP peer: our sans-IO engine, behind
//! `tcp_offload::iface::Interface`, drives an AF_PACKET socket on one end
//! of a veth pair; the kernel's TCP sits on the other end, in a network
//! namespace of its own. Each test builds and removes its own namespace,
//! and needs root (without it the tests print a skip notice, or fail when
//! `IWARP_REQUIRE_ROOT_TESTS=1`).

// The transfer helpers are used by the TCP tests, which need the engine.
#[allow(dead_code)]
mod kernel;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use kernel::netns::{require_root, Netns};
use kernel::raw::RawSocket;

/// Largest frame the veth carries with offloads off: MTU 1500 plus the
/// Ethernet header, with room to spare for a VLAN tag.
const FRAME_BUF: usize = 1536;

/// An ARP request for `target`, as `(sender MAC, sender IP)`, if `frame` is
/// one.
fn arp_request_for(frame: &[u8], target: Ipv4Addr) -> Option<([u8; 6], Ipv4Addr)> {
    // Ethernet II (14) + ARP for Ethernet/IPv4 (28).
    let eth_type = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let arp = frame.get(14..42)?;
    let is_request = eth_type == 0x0806
        && arp[0..2] == [0, 1]
        && arp[2..4] == [0x08, 0x00]
        && arp[4] == 6
        && arp[5] == 4
        && arp[6..8] == [0, 1];
    let tpa = Ipv4Addr::new(arp[24], arp[25], arp[26], arp[27]);
    if !is_request || tpa != target {
        return None;
    }
    let mut sha = [0u8; 6];
    sha.copy_from_slice(&arp[8..14]);
    Some((sha, Ipv4Addr::new(arp[14], arp[15], arp[16], arp[17])))
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
}
