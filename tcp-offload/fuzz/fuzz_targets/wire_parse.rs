//! Feeds arbitrary bytes to every wire parser, and checks that whatever
//! parses re-emits to bytes that parse back to the same representation
//! (with checksums now verified) and carry the same payload.
//!
//! The first input byte picks the entry point, so that the fuzzer reaches
//! the inner parsers without first having to forge valid checksums:
//! 0 = Ethernet frame with checksums verified, 1 = Ethernet frame with
//! checksums trusted, 2 = bare IPv4 packet (trusted), 3 = bare TCP segment
//! (trusted).
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use tcp_offload::wire::{
    ArpPacket, ArpRepr, Checksum, EtherType, EthernetFrame, EthernetRepr, Icmpv4Packet, Icmpv4Repr,
    IpProtocol, Ipv4Packet, Ipv4Repr, TcpPacket, TcpRepr,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => ethernet(rest, Checksum::Verify),
        1 => ethernet(rest, Checksum::Trusted),
        2 => ipv4(rest, Checksum::Trusted),
        _ => tcp(
            rest,
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            Checksum::Trusted,
        ),
    }
});

fn ethernet(data: &[u8], cs: Checksum) {
    let Ok(frame) = EthernetFrame::new_checked(data) else {
        return;
    };
    let Ok(repr) = EthernetRepr::parse(&frame) else {
        return;
    };
    let mut hdr = [0u8; 18];
    repr.emit(&mut hdr);
    let again = EthernetFrame::new_checked(&hdr[..repr.header_len()]).expect("re-emitted frame");
    assert_eq!(EthernetRepr::parse(&again), Ok(repr));
    match repr.ethertype {
        EtherType::Arp => arp(frame.payload()),
        EtherType::Ipv4 => ipv4(frame.payload(), cs),
        _ => {}
    }
}

fn arp(data: &[u8]) {
    let Ok(repr) = ArpRepr::parse(&ArpPacket::new_unchecked(data)) else {
        return;
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf);
    assert_eq!(
        ArpRepr::parse(&ArpPacket::new_unchecked(&buf[..])),
        Ok(repr)
    );
}

fn ipv4(data: &[u8], cs: Checksum) {
    let packet = Ipv4Packet::new_unchecked(data);
    let Ok(repr) = Ipv4Repr::parse(&packet, cs) else {
        return;
    };
    let payload = packet.payload();
    assert_eq!(payload.len(), repr.payload_len);
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf);
    buf[repr.header_len()..].copy_from_slice(payload);
    let again = Ipv4Packet::new_unchecked(&buf[..]);
    assert_eq!(Ipv4Repr::parse(&again, Checksum::Verify), Ok(repr));
    assert_eq!(again.payload(), payload);
    match repr.next_header {
        IpProtocol::Tcp => tcp(payload, repr.src_addr, repr.dst_addr, cs),
        IpProtocol::Icmp => icmp(payload, cs),
        _ => {}
    }
}

fn icmp(data: &[u8], cs: Checksum) {
    let packet = Icmpv4Packet::new_unchecked(data);
    let Ok(repr) = Icmpv4Repr::parse(&packet, cs) else {
        return;
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    let (h, d) = buf.split_at_mut(repr.header_len());
    d.copy_from_slice(packet.data());
    repr.emit(h, d);
    let again = Icmpv4Packet::new_unchecked(&buf[..]);
    assert_eq!(Icmpv4Repr::parse(&again, Checksum::Verify), Ok(repr));
    assert_eq!(again.data(), packet.data());
}

fn tcp(data: &[u8], src: Ipv4Addr, dst: Ipv4Addr, cs: Checksum) {
    let packet = TcpPacket::new_unchecked(data);
    let Ok(repr) = TcpRepr::parse(&packet, src, dst, cs) else {
        return;
    };
    // Whatever arrived in at most 40 option bytes fits again.
    assert_eq!(repr.emitted_sack_blocks(), repr.options.sack.len());
    let payload = packet.payload();
    let mut buf = vec![0u8; repr.header_len() + payload.len()];
    let (h, p) = buf.split_at_mut(repr.header_len());
    p.copy_from_slice(payload);
    repr.emit(h, src, dst, p);
    let again = TcpPacket::new_unchecked(&buf[..]);
    assert_eq!(TcpRepr::parse(&again, src, dst, Checksum::Verify), Ok(repr));
    assert_eq!(again.payload(), payload);
}
