//! Golden-byte tests of the wire layer against real frames.
//!
//! The constants below are frames captured from Linux soft-iWARP and a
//! raw-frame client (`deploy/interop/captures/`, frame numbers 1-based as
//! Wireshark counts them), embedded here so that each test names its
//! bytes. Each must parse to the exact field values a decoder reads from
//! it, and the parsed representations must emit the very same bytes.
//!
//! A further test runs every frame of every capture through the parsers;
//! the captures are fixtures of the repository, and a missing one fails.
#![allow(
    clippy::disallowed_methods,
    reason = "reads the capture fixtures from disk"
)]

use std::net::Ipv4Addr;
use std::path::PathBuf;

use pcap_kit::{LinkType, Reader, Record};
use tcp_offload::wire::checksum;
use tcp_offload::wire::{
    ArpOperation, ArpPacket, ArpRepr, Checksum, EtherType, EthernetAddress, EthernetFrame,
    EthernetRepr, Icmpv4Packet, Icmpv4Repr, IpProtocol, Ipv4Packet, Ipv4Repr, SackBlocks, TcpFlags,
    TcpOptions, TcpPacket, TcpRepr, TcpTimestamp, WireError,
};
use tcp_offload::SeqNumber;

/// ARP request, 10.77.0.12 asks for 10.77.0.11 (42 bytes, unpadded as captured on the sender's
/// tap) (rping.pcap, frame 19).
const RPING_ARP_REQUEST: &str = "\
    ffffffffffff52540077000c0806000108000604000152540077000c0a4d000c0000000000000a4d000b";

/// ARP reply from 10.77.0.11 (rping.pcap, frame 20).
const RPING_ARP_REPLY: &str = "\
    52540077000c52540077000b0806000108000604000252540077000b0a4d000b52540077000c0a4d000c";

/// ARP request from a raw-frame client, padded to the 60-byte minimum (host-probe.pcap, frame
/// 25).
const PROBE_ARP_REQUEST_PADDED: &str = "\
    ffffffffffff020000770003080600010800060400010200007700030a4d00030000000000000a4d000b000000000000\
    000000000000000000000000";

/// Linux SYN: MSS, SACK-permitted, timestamps, NOP, window scale (rping.pcap, frame 21).
const RPING_SYN: &str = "\
    52540077000b52540077000c08004500003c608740004006c5840a4d000c0a4d000bb9cc1c0620f2f4f600000000a002\
    faf053ab0000020405b40402080a2770d1870000000001030307";

/// Linux SYN-ACK with the same options (rping.pcap, frame 22).
const RPING_SYN_ACK: &str = "\
    52540077000c52540077000b08004500003c000040004006260c0a4d000b0a4d000c1c06b9cc22f915bd20f2f4f7a012\
    fe88a8c20000020405b40402080ae2628c262770d18701030307";

/// data segment: the 24-byte MPA request, with NOP NOP timestamps (rping.pcap, frame 24).
const RPING_MPA_REQUEST: &str = "\
    52540077000b52540077000c08004500004c608940004006c5720a4d000c0a4d000bb9cc1c0620f2f4f722f915be8018\
    01f6666100000101080a2770d19ae2628c264d504120494420526571204672616d651002000400010001";

/// full-sized data segment: 1448 bytes of payload with timestamps (write_bw.pcap, frame 51).
const WRITE_BW_FULL_SEGMENT: &str = "\
    52540077000b52540077000c0800450005dc35af40004006eabc0a4d000c0a4d000b8c314853feeebe94a4627ecc8018\
    01f6497700000101080afa421db5c1b0704605a281402e11bf0000007ff39f7640009ea3918d4062bdbdd2fead4e2e27\
    51d52ca8049b0d6fcb31ad395e5ef95a5197fde2253d44e2fb17e0a8650ed0b7e3fc5fe8986c57639e059cfc639657b4\
    2d54965292db348df214355722050e06026dee9ada45fd784a9974ae2fcb625d20f9afb2d4e43fc6f8741d1b7a2c217c\
    990f16735413eb9fac604ddc2baf394ba8e8fd7ccc3c42c5b160e02b8c01a72510bd9964d084037ce450581000915ba8\
    7a59254695670b46c7eb7153ec1879fcd51261a59664227bb57a8bb50ce65d863f82ccd5ead81bb1c38d05b0a57eac7b\
    900d20267242a127bd2cdcc913394f52bc1b27a6f34357b7d05c6775da13f06a211191935332ba105f96d972cf28c48b\
    44ec31372f89eeffe55574c069652a8a76bb1dc9eed7da4d6db3bf3cdc83c8206ff9579e82469d689b12280477528eed\
    0eabb6fc829049ef44082c208bf440fbed979970dd37d87949007dc0520cad60b7635c3af4a52938ad55583949983437\
    2fcda70d047f864d7f030dd10fba32c71e8e0112342a4ae180a21ac93a4e00691ca7762026fc6ea5007b770f36a9d654\
    37d7666b02b04d8252674b8cb64cf5d2f36cf21a6860bf68dc367812df4e661726cc82287ccfaace37f55aed414fbf35\
    bbb14f24120e8cee4504002453663b7932bea1ae8d4b7cc440d6b1822570b7e1220605341491225996227ee988b962ba\
    770368054ee4c98eba7b10dfebc7c00dcdc541e257633bed85b9d60d7338c7ea3b2fef8913b917cd3428ad1fef6d2dbd\
    336e9f8ad2da7757944d6507852cf1c05ce1496f9a603dce88eaed78571a358a89d4145bae8bb242d817495d443b1da0\
    1c660fb6c74c844f3671c78e8cfc1815d02d707fb822c1913a0bee7e460c1e62722d18397a9c89b00d503e994d57ae1d\
    841e9c3c415ecd7b69bcf9afc817113a442974bec5fd6fd24dad6c9a041ab8883954c57ab292f51b4eeeca1605db5149\
    04c508c9c2779c0f2408aa292262b15bb676d56909ca8457b84f6ebd2abf072f840ff846869455aa9cffd3bf61851a18\
    fbf08104ba055c7354ca307f8937ae0d46a653cc3ba877d7a84a9609cfb121cba1a2cf5ba82bcefcf5ff7b7e36298b7d\
    d0de490b87c0e22f0b7938da2a5aa5cbfc7526a4a0f5a196f41c142a46a0a7167ef12105b10334bc7c6d97a6c73c71c3\
    b19868528d09e88125fcab6b9c53811b44a220f5a655b222c249c989853a4c37d2b4895fbd71e0e36d8c4e0adfd02523\
    724518189aca3b5c1304e5993e32d011e65970a4ca518737ddd541bca566df18acf73046c26ba3d56f886eaeba3ebfa1\
    972f456180cc995da1da194741f85fedf08f33b2fbd6876a5ff6181934d7bacc07ff2d87cbc6e56da1feb4e2f713cfe7\
    a202999dd92008381620514bf80c17ff0b4486d70b6b44ac6af88e610b5d48ad5fe14b380153701873c2636bce7a6ad9\
    bef1b0c95cf475c6ec0327f7606fa5c050f0f85243696ab62bcd22f9478cd2057d83cfda7744a06448c85ba837006888\
    f061da33ca44eaf5110cee5898c05d16432cf0bb71901fb9587a61907bca186b2bf29ff53689ea4795d89f2d98fc43dc\
    2933979ac4b6531c30b4acab7ec417a9b6b69eec3f8833d460d201f9cf45d5f8786c923c22e559529905fe18ca15c180\
    cb606d0ae8a0de4973df424224173a9d83ccd9a5b132f74a38f562020a2482d584efdf6c90bdb5039df745c10e7f5e91\
    4b3836fc6a2e46a223a9a42ecd27035116e3bda6a073a93d6aeeff796d5d0ab89541b4006ffba292a447c0716ec4c284\
    a77f2b47f2d4855dc384d630e1e0e977219d77909819233c60e3adcea76f534eef7e96e1521b3e159f144680f52ff716\
    cc6ea76588caa1e8ad4fb755be0aa3ad88398fda54cdf0f3e23674d7656bed31da9496625e384a0c870161450b04f393\
    3e826e924f5e863194fa08f965f62a3f8ac1a1e9f9ecf580ed56c5f95ab88c983afa2b8a58b1bbecabc4e510ba105044\
    d1f12dcadd224acb780fc4d3c8506b024b968ca3474800000000";

/// FIN|ACK with timestamps (rping.pcap, frame 108).
const RPING_FIN: &str = "\
    52540077000b52540077000c08004500003460b340004006c5600a4d000c0a4d000bb9cc1c0620f2fcdf22f91fae8011\
    01f5c18800000101080a2770d1efe2628c7f";

/// SYN with only the MSS option (the hardware-NIC-like profile) (host-probe.pcap, frame 33).
const PROBE_SYN_MSS_ONLY: &str = "\
    52540077000b02000077000308004500002c4f4340004006d6e10a4d00030a4d000b9e751c06892a7336000000006002\
    ffffcca20000020405b4";

/// siw's SYN-ACK to it, MSS only (host-probe.pcap, frame 34).
const PROBE_SYN_ACK_MSS_ONLY: &str = "\
    02000077000352540077000b08004500002c00004000400626250a4d000b0a4d00031c069e75a772c49f892a73376012\
    faf0658e0000020405b4";

/// RST|ACK from siw (host-probe.pcap, frame 273).
const PROBE_RST_ACK: &str = "\
    02000077000352540077000b080045000028e1844000400644a40a4d000b0a4d00031c06e58d6c37df42470b5dce5014\
    f53cb4040000";

/// bare RST (ACK clear, window 0) (host-probe.pcap, frame 275).
const PROBE_RST: &str = "\
    02000077000352540077000b08004500002800004000400626290a4d000b0a4d00031c06e58d6c37df42000000005004\
    00004e2b0000";

/// ICMP echo request, 56 data bytes (host-probe.pcap, frame 9).
const PROBE_ECHO_REQUEST: &str = "\
    52540077000b9e329a281d55080045000054c7a0400040015e620a4d00020a4d000b080052a9493e0001743b0c6b0000\
    0000119e0b0000000000101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435\
    3637";

/// ICMP echo reply (DF clear) (host-probe.pcap, frame 12).
const PROBE_ECHO_REPLY: &str = "\
    9e329a281d5552540077000b080045000054ab0900004001baf90a4d000b0a4d000200005aa9493e0001743b0c6b0000\
    0000119e0b0000000000101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435\
    3637";

const MAC_11: EthernetAddress = EthernetAddress([0x52, 0x54, 0x00, 0x77, 0x00, 0x0b]);
const MAC_12: EthernetAddress = EthernetAddress([0x52, 0x54, 0x00, 0x77, 0x00, 0x0c]);
const MAC_PROBE_3: EthernetAddress = EthernetAddress([0x02, 0x00, 0x00, 0x77, 0x00, 0x03]);
const MAC_PROBE_2: EthernetAddress = EthernetAddress([0x9e, 0x32, 0x9a, 0x28, 0x1d, 0x55]);
const IP_2: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const IP_3: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
const IP_11: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 11);
const IP_12: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 12);

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s
        .bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .map(|b| match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => panic!("not a hex digit: {b}"),
        })
        .collect();
    assert!(digits.len() % 2 == 0, "odd number of hex digits");
    digits.chunks(2).map(|d| (d[0] << 4) | d[1]).collect()
}

/// A parsed Ethernet/IPv4/TCP frame.
struct TcpFrame {
    eth: EthernetRepr,
    ip: Ipv4Repr,
    tcp: TcpRepr,
    payload: Vec<u8>,
}

/// Parses a TCP frame with every checksum verified, and checks that the
/// three representations emit the frame again byte for byte.
fn tcp_frame(bytes: &[u8]) -> TcpFrame {
    let frame = EthernetFrame::new_checked(bytes).expect("ethernet");
    let eth = EthernetRepr::parse(&frame).expect("ethernet repr");
    assert_eq!(eth.ethertype, EtherType::Ipv4);
    let ipp = Ipv4Packet::new_checked(frame.payload()).expect("ipv4");
    let ip = Ipv4Repr::parse(&ipp, Checksum::Verify).expect("ipv4 repr");
    assert_eq!(ip.next_header, IpProtocol::Tcp);
    let tp = TcpPacket::new_checked(ipp.payload()).expect("tcp");
    let tcp = TcpRepr::parse(&tp, ip.src_addr, ip.dst_addr, Checksum::Verify).expect("tcp repr");
    let payload = tp.payload().to_vec();

    let mut out = vec![0u8; eth.header_len() + ip.buffer_len()];
    assert_eq!(out.len(), bytes.len(), "no link padding in these frames");
    eth.emit(&mut out);
    ip.emit(&mut out[eth.header_len()..]);
    let seg = &mut out[eth.header_len() + ip.header_len()..];
    let (h, p) = seg.split_at_mut(tcp.header_len());
    p.copy_from_slice(&payload);
    tcp.emit(h, ip.src_addr, ip.dst_addr, p);
    assert_eq!(hex_string(&out), hex_string(bytes), "re-emitted frame");
    TcpFrame {
        eth,
        ip,
        tcp,
        payload,
    }
}

fn hex_string(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, ident: u16, payload_len: usize) -> Ipv4Repr {
    Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Tcp,
        payload_len,
        hop_limit: 64,
        tos: 0,
        ident,
        dont_frag: true,
    }
}

fn ts(tsval: u32, tsecr: u32) -> Option<TcpTimestamp> {
    Some(TcpTimestamp { tsval, tsecr })
}

#[test]
fn linux_syn() {
    let f = tcp_frame(&hex(RPING_SYN));
    assert_eq!(
        f.eth,
        EthernetRepr {
            src_addr: MAC_12,
            dst_addr: MAC_11,
            ethertype: EtherType::Ipv4,
            vlan: None,
        }
    );
    assert_eq!(f.ip, ipv4(IP_12, IP_11, 24711, 40));
    assert_eq!(
        f.tcp,
        TcpRepr {
            src_port: 47564,
            dst_port: 7174,
            seq: SeqNumber(552_793_334),
            ack_number: SeqNumber(0),
            flags: TcpFlags::SYN,
            window: 64240,
            urgent: 0,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                sack: SackBlocks::new(),
                timestamp: ts(0x2770_d187, 0),
            },
        }
    );
    assert_eq!(f.tcp.ack(), None);
    assert_eq!(f.tcp.segment_len(f.payload.len()), 1);
    assert!(f.payload.is_empty());
}

#[test]
fn linux_syn_ack() {
    let f = tcp_frame(&hex(RPING_SYN_ACK));
    assert_eq!((f.eth.src_addr, f.eth.dst_addr), (MAC_11, MAC_12));
    assert_eq!(f.ip, ipv4(IP_11, IP_12, 0, 40));
    assert_eq!(
        f.tcp,
        TcpRepr {
            src_port: 7174,
            dst_port: 47564,
            seq: SeqNumber(586_749_373),
            ack_number: SeqNumber(552_793_335),
            flags: TcpFlags::SYN | TcpFlags::ACK,
            window: 65160,
            urgent: 0,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                sack: SackBlocks::new(),
                timestamp: ts(0xe262_8c26, 0x2770_d187),
            },
        }
    );
    assert_eq!(f.tcp.ack(), Some(SeqNumber(552_793_335)));
}

#[test]
fn mpa_request_data_segment() {
    let f = tcp_frame(&hex(RPING_MPA_REQUEST));
    assert_eq!(f.ip, ipv4(IP_12, IP_11, 24713, 56));
    assert_eq!(
        f.tcp,
        TcpRepr {
            src_port: 47564,
            dst_port: 7174,
            seq: SeqNumber(552_793_335),
            ack_number: SeqNumber(586_749_374),
            flags: TcpFlags::PSH | TcpFlags::ACK,
            window: 502,
            urgent: 0,
            options: TcpOptions {
                timestamp: ts(0x2770_d19a, 0xe262_8c26),
                ..TcpOptions::default()
            },
        }
    );
    assert_eq!(f.tcp.header_len(), 32);
    assert_eq!(&f.payload[..16], b"MPA ID Req Frame");
    assert_eq!(&f.payload[16..], &[0x10, 0x02, 0x00, 0x04, 0, 1, 0, 1]);
}

#[test]
fn full_sized_data_segment() {
    let bytes = hex(WRITE_BW_FULL_SEGMENT);
    assert_eq!(bytes.len(), 1514);
    let f = tcp_frame(&bytes);
    assert_eq!(f.ip, ipv4(IP_12, IP_11, 13743, 1480));
    assert_eq!(
        f.tcp,
        TcpRepr {
            src_port: 35889,
            dst_port: 18515,
            seq: SeqNumber(4_277_059_220),
            ack_number: SeqNumber(2_757_918_412),
            flags: TcpFlags::PSH | TcpFlags::ACK,
            window: 502,
            urgent: 0,
            options: TcpOptions {
                timestamp: ts(0xfa42_1db5, 0xc1b0_7046),
                ..TcpOptions::default()
            },
        }
    );
    assert_eq!(f.payload.len(), 1448);
    assert_eq!(f.tcp.segment_len(f.payload.len()), 1448);

    // The zero-copy path: the payload summed in two scattered pieces, the
    // second starting at an odd offset, gives the same header bytes.
    let cut = 1001;
    let sum = checksum::combine_at(
        checksum::sum(&f.payload[..cut]),
        checksum::sum(&f.payload[cut..]),
        cut,
    );
    let mut h = [0u8; 32];
    f.tcp
        .emit_with_payload_sum(&mut h, IP_12, IP_11, f.payload.len(), sum);
    assert_eq!(&h[..], &bytes[34..66]);
}

#[test]
fn fin() {
    let f = tcp_frame(&hex(RPING_FIN));
    assert_eq!(f.ip, ipv4(IP_12, IP_11, 24755, 32));
    assert_eq!(
        f.tcp,
        TcpRepr {
            src_port: 47564,
            dst_port: 7174,
            seq: SeqNumber(552_795_359),
            ack_number: SeqNumber(586_751_918),
            flags: TcpFlags::FIN | TcpFlags::ACK,
            window: 501,
            urgent: 0,
            options: TcpOptions {
                timestamp: ts(0x2770_d1ef, 0xe262_8c7f),
                ..TcpOptions::default()
            },
        }
    );
    assert_eq!(f.tcp.segment_len(0), 1);
}

#[test]
fn syn_and_syn_ack_with_mss_only() {
    let syn = tcp_frame(&hex(PROBE_SYN_MSS_ONLY));
    assert_eq!((syn.eth.src_addr, syn.eth.dst_addr), (MAC_PROBE_3, MAC_11));
    assert_eq!(syn.ip, ipv4(IP_3, IP_11, 20291, 24));
    let only_mss = TcpOptions {
        mss: Some(1460),
        ..TcpOptions::default()
    };
    assert_eq!(
        syn.tcp,
        TcpRepr {
            src_port: 40565,
            dst_port: 7174,
            seq: SeqNumber(2_301_260_598),
            ack_number: SeqNumber(0),
            flags: TcpFlags::SYN,
            window: 65535,
            urgent: 0,
            options: only_mss,
        }
    );
    let syn_ack = tcp_frame(&hex(PROBE_SYN_ACK_MSS_ONLY));
    assert_eq!(syn_ack.ip, ipv4(IP_11, IP_3, 0, 24));
    assert_eq!(
        syn_ack.tcp,
        TcpRepr {
            src_port: 7174,
            dst_port: 40565,
            seq: SeqNumber(2_809_316_511),
            ack_number: SeqNumber(2_301_260_599),
            flags: TcpFlags::SYN | TcpFlags::ACK,
            window: 64240,
            urgent: 0,
            options: only_mss,
        }
    );
}

#[test]
fn rst_and_rst_ack() {
    let ra = tcp_frame(&hex(PROBE_RST_ACK));
    assert_eq!(ra.ip, ipv4(IP_11, IP_3, 57732, 20));
    assert_eq!(
        ra.tcp,
        TcpRepr {
            src_port: 7174,
            dst_port: 58765,
            seq: SeqNumber(1_815_600_962),
            ack_number: SeqNumber(1_191_927_246),
            flags: TcpFlags::RST | TcpFlags::ACK,
            window: 62780,
            urgent: 0,
            options: TcpOptions::default(),
        }
    );
    let r = tcp_frame(&hex(PROBE_RST));
    assert_eq!(r.ip, ipv4(IP_11, IP_3, 0, 20));
    assert_eq!(
        r.tcp,
        TcpRepr {
            src_port: 7174,
            dst_port: 58765,
            seq: SeqNumber(1_815_600_962),
            ack_number: SeqNumber(0),
            flags: TcpFlags::RST,
            window: 0,
            urgent: 0,
            options: TcpOptions::default(),
        }
    );
    assert_eq!(r.tcp.ack(), None);
    assert_eq!(r.tcp.segment_len(0), 0);
}

fn arp(bytes: &[u8]) -> (EthernetRepr, ArpRepr) {
    let frame = EthernetFrame::new_checked(bytes).expect("ethernet");
    let eth = EthernetRepr::parse(&frame).expect("ethernet repr");
    assert_eq!(eth.ethertype, EtherType::Arp);
    let arp = ArpRepr::parse(&ArpPacket::new_checked(frame.payload()).expect("arp")).expect("repr");
    let mut out = vec![0u8; eth.header_len() + arp.buffer_len()];
    eth.emit(&mut out);
    arp.emit(&mut out[eth.header_len()..]);
    assert_eq!(hex_string(&out), hex_string(&bytes[..out.len()]));
    (eth, arp)
}

#[test]
fn arp_request_and_reply() {
    let (eth, req) = arp(&hex(RPING_ARP_REQUEST));
    assert_eq!(eth.dst_addr, EthernetAddress::BROADCAST);
    assert_eq!(eth.src_addr, MAC_12);
    assert_eq!(
        req,
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: MAC_12,
            source_protocol_addr: IP_12,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: IP_11,
        }
    );
    let (eth, rep) = arp(&hex(RPING_ARP_REPLY));
    assert_eq!((eth.src_addr, eth.dst_addr), (MAC_11, MAC_12));
    assert_eq!(
        rep,
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: MAC_11,
            source_protocol_addr: IP_11,
            target_hardware_addr: MAC_12,
            target_protocol_addr: IP_12,
        }
    );
}

#[test]
fn arp_request_with_link_padding() {
    let bytes = hex(PROBE_ARP_REQUEST_PADDED);
    assert_eq!(bytes.len(), 60);
    let (_, req) = arp(&bytes);
    assert_eq!(
        req,
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: MAC_PROBE_3,
            source_protocol_addr: IP_3,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: IP_11,
        }
    );
}

fn icmp(bytes: &[u8]) -> (Ipv4Repr, Icmpv4Repr, Vec<u8>) {
    let frame = EthernetFrame::new_checked(bytes).expect("ethernet");
    let ipp = Ipv4Packet::new_checked(frame.payload()).expect("ipv4");
    let ip = Ipv4Repr::parse(&ipp, Checksum::Verify).expect("ipv4 repr");
    assert_eq!(ip.next_header, IpProtocol::Icmp);
    let ic = Icmpv4Packet::new_checked(ipp.payload()).expect("icmp");
    let repr = Icmpv4Repr::parse(&ic, Checksum::Verify).expect("icmp repr");
    let data = ic.data().to_vec();
    let mut out = vec![0u8; ip.buffer_len()];
    ip.emit(&mut out);
    let (h, d) = out[20..].split_at_mut(repr.header_len());
    d.copy_from_slice(&data);
    repr.emit(h, d);
    assert_eq!(hex_string(&out), hex_string(&bytes[14..]));
    (ip, repr, data)
}

#[test]
fn icmp_echo_request_and_reply() {
    let (ip, req, req_data) = icmp(&hex(PROBE_ECHO_REQUEST));
    assert_eq!(
        ip,
        Ipv4Repr {
            src_addr: IP_2,
            dst_addr: IP_11,
            next_header: IpProtocol::Icmp,
            payload_len: 64,
            hop_limit: 64,
            tos: 0,
            ident: 51104,
            dont_frag: true,
        }
    );
    assert_eq!(
        req,
        Icmpv4Repr::EchoRequest {
            ident: 18750,
            seq_no: 1,
            data_len: 56
        }
    );
    let (ip, rep, rep_data) = icmp(&hex(PROBE_ECHO_REPLY));
    assert_eq!((ip.src_addr, ip.dst_addr), (IP_11, IP_2));
    assert_eq!((ip.ident, ip.dont_frag), (43785, false));
    assert_eq!(
        rep,
        Icmpv4Repr::EchoReply {
            ident: 18750,
            seq_no: 1,
            data_len: 56
        }
    );
    assert_eq!(req_data, rep_data, "the reply echoes the data");
    let frame = hex(PROBE_ECHO_REPLY);
    assert_eq!(
        EthernetRepr::parse(&EthernetFrame::new_checked(&frame[..]).unwrap())
            .unwrap()
            .dst_addr,
        MAC_PROBE_2
    );
}

/// Damages the options of the real SYN (MSS at 54, SACK-permitted at 58,
/// timestamps at 60, NOP and window scale at 70), fixes the checksum, and
/// expects the given rejection.
#[test]
fn real_syn_with_damaged_options() {
    let good = hex(RPING_SYN);
    let cases: &[(&str, usize, u8, WireError)] = &[
        ("MSS length 0", 55, 0, WireError::BadOption),
        ("MSS length 1", 55, 1, WireError::BadOption),
        ("MSS length 3", 55, 3, WireError::BadOption),
        ("SACK-permitted length 3", 59, 3, WireError::BadOption),
        ("timestamps length 9", 61, 9, WireError::BadOption),
        ("timestamps past the header", 61, 20, WireError::BadOption),
        ("window scale length 2", 72, 2, WireError::BadOption),
        (
            "window scale made SACK of length 3",
            71,
            5,
            WireError::BadOption,
        ),
        ("data offset 4", 46, 0x40, WireError::BadLength),
        (
            "data offset beyond the segment",
            46,
            0xf0,
            WireError::Truncated,
        ),
    ];
    for &(what, at, value, want) in cases {
        let mut b = good.clone();
        b[at] = value;
        let seg = &mut b[34..];
        if at != 46 {
            TcpPacket::new_unchecked(&mut *seg).fill_checksum(IP_12, IP_11);
        }
        let got = TcpRepr::parse(
            &TcpPacket::new_unchecked(&*seg),
            IP_12,
            IP_11,
            Checksum::Verify,
        );
        assert_eq!(got, Err(want), "{what}");
    }
    // The same bytes without the checksum fixed are a checksum failure.
    let mut b = good.clone();
    b[55] = 3;
    assert_eq!(
        TcpRepr::parse(
            &TcpPacket::new_unchecked(&b[34..]),
            IP_12,
            IP_11,
            Checksum::Verify
        ),
        Err(WireError::BadChecksum)
    );
    // An unknown option of valid length in place of SACK-permitted is
    // skipped.
    let mut b = good.clone();
    b[58] = 30;
    TcpPacket::new_unchecked(&mut b[34..]).fill_checksum(IP_12, IP_11);
    let r = TcpRepr::parse(
        &TcpPacket::new_unchecked(&b[34..]),
        IP_12,
        IP_11,
        Checksum::Verify,
    )
    .unwrap();
    assert!(!r.options.sack_permitted);
    assert_eq!(r.options.mss, Some(1460));
    assert_eq!(r.options.window_scale, Some(7));
}

/// Real frames cut short at every length are rejected as truncated at the
/// first layer that misses bytes.
#[test]
fn real_frames_truncated_everywhere() {
    let b = hex(RPING_SYN);
    for n in 0..b.len() {
        let cut = &b[..n];
        let err = EthernetFrame::new_checked(cut)
            .and_then(|f| Ipv4Packet::new_checked(f.payload()).map(|_| ()));
        assert_eq!(err, Err(WireError::Truncated), "{n} bytes");
    }
    // With the IPv4 total length fixed up to the cut, the TCP header is the
    // one found truncated.
    for n in 34..b.len() {
        let mut cut = b[..n].to_vec();
        let total = (n - 14) as u16;
        let mut ip = Ipv4Packet::new_unchecked(&mut cut[14..]);
        ip.set_total_len(total);
        ip.fill_checksum();
        let ipp = Ipv4Packet::new_checked(&cut[14..]).unwrap();
        let ip = Ipv4Repr::parse(&ipp, Checksum::Verify).unwrap();
        let got = TcpRepr::parse(
            &TcpPacket::new_unchecked(ipp.payload()),
            ip.src_addr,
            ip.dst_addr,
            Checksum::Trusted,
        );
        assert_eq!(got, Err(WireError::Truncated), "{n} bytes");
    }
}

// ---------------------------------------------------------------------------
// Every frame of every capture.

/// The records of a capture file, all of which must be Ethernet.
fn read_capture(file: &[u8]) -> Result<Vec<Record<'_>>, String> {
    let records = Reader::read_all(file).map_err(|e| e.to_string())?;
    match records.iter().find(|r| r.link_type != LinkType::ETHERNET) {
        Some(r) => Err(format!("link type {} is not Ethernet", r.link_type.0)),
        None => Ok(records),
    }
}

#[derive(Debug, Default)]
struct Tally {
    frames: usize,
    arp: usize,
    icmp: usize,
    /// TCP segments parsed with checksums verified and re-emitted byte for
    /// byte.
    tcp_verified: usize,
    /// TCP segments from the offload capture, whose checksums are partial.
    tcp_trusted: usize,
    /// Frames cut by the snap length: IPv4 says Truncated; their TCP header
    /// alone still parses.
    snap_truncated: usize,
    /// Other EtherTypes (IPv6 neighbour discovery).
    other: usize,
}

/// Maps a parse error to a failure message naming the layer.
fn e(layer: &'static str) -> impl Fn(WireError) -> String {
    move |err| format!("{layer}: {err}")
}

/// Runs one frame through Ethernet → ARP/IPv4 → ICMP/TCP.
fn check_frame(rec: &Record<'_>, offload: bool, t: &mut Tally) -> Result<(), String> {
    let frame = EthernetFrame::new_checked(rec.data).map_err(e("ethernet"))?;
    let eth = EthernetRepr::parse(&frame).map_err(e("ethernet"))?;
    let mut hdr = [0u8; 18];
    eth.emit(&mut hdr);
    if hdr[..eth.header_len()] != rec.data[..eth.header_len()] {
        return Err("ethernet header re-emitted differently".into());
    }
    match eth.ethertype {
        EtherType::Arp => {
            let p = ArpPacket::new_checked(frame.payload()).map_err(e("arp"))?;
            ArpRepr::parse(&p).map_err(e("arp"))?;
            t.arp += 1;
        }
        EtherType::Ipv4 => {
            let truncated = rec.is_truncated();
            let ipp = Ipv4Packet::new_unchecked(frame.payload());
            let ip = match Ipv4Repr::parse(&ipp, Checksum::Verify) {
                Err(WireError::Truncated) if truncated => {
                    // The header itself is intact: its TCP header parses
                    // from the bytes that were kept.
                    let rest = frame
                        .payload()
                        .get(ipp.header_len()..)
                        .ok_or("ipv4 header itself truncated")?;
                    let tp = TcpPacket::new_checked(rest).map_err(e("tcp in snapped frame"))?;
                    TcpRepr::parse(&tp, ipp.src_addr(), ipp.dst_addr(), Checksum::Trusted)
                        .map_err(e("tcp in snapped frame"))?;
                    t.snap_truncated += 1;
                    return Ok(());
                }
                other => other.map_err(e("ipv4"))?,
            };
            let mut iph = [0u8; 20];
            ip.emit(&mut iph);
            if ipp.header_len() == 20 && iph[..] != frame.payload()[..20] {
                return Err("ipv4 header re-emitted differently".into());
            }
            match ip.next_header {
                IpProtocol::Tcp => {
                    let tp = TcpPacket::new_checked(ipp.payload()).map_err(e("tcp"))?;
                    let verified = TcpRepr::parse(&tp, ip.src_addr, ip.dst_addr, Checksum::Verify);
                    let repr = if offload {
                        // Guest offloads leave partial checksums: either
                        // verdict is fine, but the header must parse.
                        match verified {
                            Ok(_) | Err(WireError::BadChecksum) => {}
                            Err(err) => return Err(format!("tcp: {err}")),
                        }
                        t.tcp_trusted += 1;
                        TcpRepr::parse(&tp, ip.src_addr, ip.dst_addr, Checksum::Trusted)
                            .map_err(e("tcp"))?
                    } else {
                        let r = verified.map_err(e("tcp"))?;
                        t.tcp_verified += 1;
                        r
                    };
                    let mut h = vec![0u8; repr.header_len()];
                    repr.emit(&mut h, ip.src_addr, ip.dst_addr, tp.payload());
                    let orig = &ipp.payload()[..tp.header_len()];
                    let same = if offload {
                        // Everything but the checksum field.
                        h.len() == orig.len() && h[..16] == orig[..16] && h[18..] == orig[18..]
                    } else {
                        h[..] == *orig
                    };
                    if !same {
                        return Err(format!(
                            "tcp header re-emitted differently: {} vs {}",
                            hex_string(&h),
                            hex_string(orig)
                        ));
                    }
                }
                IpProtocol::Icmp => {
                    let p = Icmpv4Packet::new_checked(ipp.payload()).map_err(e("icmp"))?;
                    Icmpv4Repr::parse(&p, Checksum::Verify).map_err(e("icmp"))?;
                    t.icmp += 1;
                }
                other => return Err(format!("unexpected IP protocol {other:?}")),
            }
        }
        _ => t.other += 1,
    }
    Ok(())
}

/// The siw captures: the repository's test fixtures in
/// `deploy/interop/captures/`. Panics, naming the path, unless the folder
/// holds each of them.
fn capture_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/interop/captures");
    for name in [
        "host-probe.pcap",
        "read_bw.pcap",
        "read_bw_n5000.pcap",
        "read_lat.pcap",
        "rping.pcap",
        "send_bw.pcap",
        "send_lat.pcap",
        "write_bw.pcap",
        "write_bw_offload.pcap",
        "write_lat.pcap",
    ] {
        let path = dir.join(name);
        assert!(
            path.is_file(),
            "siw capture fixture missing: {} (the repository's deploy/interop/captures)",
            path.display()
        );
    }
    dir
}

#[test]
fn every_captured_frame_parses() {
    let dir = capture_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read capture dir")
        .filter_map(|d| d.ok().map(|d| d.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no captures in {}", dir.display());
    let mut failures = Vec::new();
    let mut total = Tally::default();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(path).expect("read capture");
        let records = read_capture(&bytes).unwrap_or_else(|err| panic!("{name}: {err}"));
        let offload = name.contains("offload");
        let mut t = Tally::default();
        for (i, rec) in records.iter().enumerate() {
            t.frames += 1;
            if let Err(err) = check_frame(rec, offload, &mut t) {
                failures.push(format!("{name} frame {}: {err}", i + 1));
            }
        }
        println!("{name}: {t:?}");
        total.frames += t.frames;
        total.arp += t.arp;
        total.icmp += t.icmp;
        total.tcp_verified += t.tcp_verified;
        total.tcp_trusted += t.tcp_trusted;
        total.snap_truncated += t.snap_truncated;
        total.other += t.other;
    }
    println!("all {} captures: {total:?}", files.len());
    assert!(
        failures.is_empty(),
        "{} failures, first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(20)]
    );
    assert!(total.tcp_verified > 10_000, "{total:?}");
    assert!(total.snap_truncated > 0 && total.tcp_trusted > 0 && total.icmp > 0);
}
