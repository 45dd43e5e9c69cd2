//! Receive-side scaling as the NIC computes it: the Toeplitz hash over a
//! flow's addresses and ports, and the redirection table that maps it to a
//! queue (Microsoft's RSS specification, which DPDK's `rte_softrss` and
//! every NIC here follow).
//!
//! The dataplane needs it on the active side of a connection: it picks the
//! local port so that the *reply's* hash lands on the queue of the worker
//! that opens the connection, so every connection is owned by one worker
//! with no dispatching. The in-memory link uses it to steer like a NIC.
//!
//! Where the port cannot steer (no RSS: `net_ring`, `net_af_packet`,
//! `net_memif`, or a device told to deliver everything to one queue),
//! the same function names a connection's owner in software: the active
//! side picks its port with [`Rss::round_robin`] over the workers, and
//! every worker computes [`Rss::queue_of_frame`] for each TCP frame it
//! receives and hands the frame over a ring to the worker it names (the
//! software dispatcher of ARCHITECTURE.md, "Workers, queues and
//! connections").
//! The hash itself is `dpdk_bindings::toeplitz` (pure Rust, usable without
//! EAL); this module keeps the flow's input order and the port search.

use core::net::Ipv4Addr;

use tcp_offload::wire::{EtherType, EthernetFrame, IpProtocol, Ipv4Packet, TcpFlags, TcpPacket};

/// The 40-byte key of Microsoft's RSS verification suite, which is also
/// the default of many drivers: used where a port does not say its own.
pub const DEFAULT_RSS_KEY: [u8; 40] = dpdk_bindings::toeplitz::MICROSOFT_KEY;

/// The Toeplitz hash of `input` under `key` (the implementation in
/// `dpdk-bindings`, pure Rust, no EAL needed).
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    dpdk_bindings::toeplitz::hash(key, input)
}

/// The hash input of an IPv4/TCP packet, in the order the specification
/// fixes: source address, destination address, source port, destination
/// port — all as they appear in the packet being received.
pub fn ipv4_tcp_input(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> [u8; 12] {
    dpdk_bindings::toeplitz::ipv4_tcp_input(src.octets(), dst.octets(), sport, dport)
}

/// What the receive path needs of a received frame, read once through
/// the wire views (untagged, or with one 802.1Q tag, the same rule the
/// interface applies): whether it is ARP, and the TCP flow and control
/// flags of an IPv4/TCP frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxSummary {
    /// An ARP frame (every worker keeps its own neighbour table).
    pub arp: bool,
    /// An IPv4/TCP frame's flow, as [`Rss::queue_for`] takes it.
    pub flow: Option<(Ipv4Addr, Ipv4Addr, u16, u16)>,
    /// The TCP segment carries SYN, FIN or RST.
    pub tcp_control: bool,
}

impl RxSummary {
    /// Reads `frame`.
    pub fn of(frame: &[u8]) -> RxSummary {
        let mut s = RxSummary {
            arp: false,
            flow: None,
            tcp_control: false,
        };
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return s;
        };
        match eth.payload_ethertype() {
            EtherType::Arp => s.arp = true,
            EtherType::Ipv4 => {
                // Lengths are the interface's to check (it counts what it
                // drops); this reads no further than the ports and flags.
                let l3 = eth.payload();
                if l3.len() < 20 {
                    return s;
                }
                let ip = Ipv4Packet::new_unchecked(l3);
                let ihl = ip.header_len();
                if ip.next_header() != IpProtocol::Tcp || ihl < 20 || l3.len() < ihl + 4 {
                    return s;
                }
                let l4 = &l3[ihl..];
                let tcp = TcpPacket::new_unchecked(l4);
                s.flow = Some((ip.src_addr(), ip.dst_addr(), tcp.src_port(), tcp.dst_port()));
                if l4.len() >= 14 {
                    let f = tcp.flags();
                    s.tcp_control = [TcpFlags::SYN, TcpFlags::FIN, TcpFlags::RST]
                        .iter()
                        .any(|&c| f.contains(c));
                }
            }
            _ => {}
        }
        s
    }

    /// Whether the frame takes the slow path: ARP, ICMP, TCP with SYN,
    /// FIN or RST, anything not TCP.
    pub fn punt(&self) -> bool {
        self.flow.is_none() || self.tcp_control
    }
}

/// Source and destination address and port of an IPv4/TCP frame,
/// untagged or with one 802.1Q tag, as [`Rss::queue_for`] takes them;
/// `None` for anything else (ARP, other protocols, truncated frames),
/// which the receiving worker keeps. See [`RxSummary`].
pub fn ipv4_tcp_flow(frame: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr, u16, u16)> {
    RxSummary::of(frame).flow
}

/// A port's RSS configuration: key and redirection table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rss {
    /// The hash key (40 bytes on most NICs, 52 on some).
    pub key: Vec<u8>,
    /// Queue for each hash value modulo the table's length.
    pub reta: Vec<u16>,
}

impl Rss {
    /// The default key with a table spreading over `queues` queues round
    /// robin (what a driver sets up when told nothing else).
    pub fn round_robin(queues: u16) -> Rss {
        let queues = queues.max(1);
        Rss {
            key: DEFAULT_RSS_KEY.to_vec(),
            reta: (0..128u16).map(|i| i % queues).collect(),
        }
    }

    /// The queue a received IPv4/TCP packet with these fields lands on.
    pub fn queue_for(&self, src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> u16 {
        if self.reta.is_empty() {
            return 0;
        }
        let h = toeplitz(&self.key, &ipv4_tcp_input(src, dst, sport, dport));
        dpdk_bindings::toeplitz::reta_queue(h, &self.reta).unwrap_or(0)
    }

    /// The queue a received frame lands on if it is IPv4/TCP
    /// ([`ipv4_tcp_flow`]), `None` otherwise.
    pub fn queue_of_frame(&self, frame: &[u8]) -> Option<u16> {
        let (src, dst, sport, dport) = ipv4_tcp_flow(frame)?;
        Some(self.queue_for(src, dst, sport, dport))
    }

    /// A local port for an active open from `local_ip` to
    /// `remote_ip:remote_port` whose replies land on `queue`, searching
    /// from `start` through the ephemeral range; `None` if no port of the
    /// range qualifies (the table never names `queue`).
    pub fn pick_port(
        &self,
        local_ip: Ipv4Addr,
        remote_ip: Ipv4Addr,
        remote_port: u16,
        queue: u16,
        start: u16,
        mut in_use: impl FnMut(u16) -> bool,
    ) -> Option<u16> {
        let range = tcp_offload::tcp::table::EPHEMERAL_PORTS;
        let (lo, hi) = (*range.start(), *range.end());
        let n = u32::from(hi - lo) + 1;
        let first = u32::from(start.saturating_sub(lo)) % n;
        (0..n).map(|i| lo + ((first + i) % n) as u16).find(|&port| {
            // The reply travels from the remote to us.
            self.queue_for(remote_ip, local_ip, remote_port, port) == queue && !in_use(port)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An address and a port.
    type Endpoint = ([u8; 4], u16);

    /// Microsoft's RSS verification vectors: (destination, source, hash of
    /// IPv4 only, hash of IPv4 with TCP ports).
    const VECTORS: [(Endpoint, Endpoint, u32, u32); 5] = [
        (
            ([161, 142, 100, 80], 1766),
            ([66, 9, 149, 187], 2794),
            0x323e8fc2,
            0x51ccc178,
        ),
        (
            ([65, 69, 140, 83], 4739),
            ([199, 92, 111, 2], 14230),
            0xd718262a,
            0xc626b0ea,
        ),
        (
            ([12, 22, 207, 184], 38024),
            ([24, 19, 198, 95], 12898),
            0xd2d0a5de,
            0x5c2b394a,
        ),
        (
            ([209, 142, 163, 6], 2217),
            ([38, 27, 205, 30], 48228),
            0x82989176,
            0xafc7327f,
        ),
        (
            ([202, 188, 127, 2], 1303),
            ([153, 39, 163, 191], 44251),
            0x5d1809c5,
            0x10e828a2,
        ),
    ];

    #[test]
    fn microsoft_verification_vectors() {
        for ((dst, dport), (src, sport), h_ip, h_tcp) in VECTORS {
            let (src, dst) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
            let input = ipv4_tcp_input(src, dst, sport, dport);
            assert_eq!(
                toeplitz(&DEFAULT_RSS_KEY, &input[..8]),
                h_ip,
                "{src} -> {dst}"
            );
            assert_eq!(toeplitz(&DEFAULT_RSS_KEY, &input), h_tcp, "{src} -> {dst}");
        }
    }

    #[test]
    fn picked_port_steers_replies_to_the_queue() {
        let rss = Rss::round_robin(4);
        let (us, them) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        for q in 0..4 {
            let p = rss.pick_port(us, them, 4791, q, 50_000, |_| false).unwrap();
            assert_eq!(rss.queue_for(them, us, 4791, p), q);
            // Skipping a port in use finds another one for the same queue.
            let p2 = rss
                .pick_port(us, them, 4791, q, 50_000, |x| x == p)
                .unwrap();
            assert_ne!(p, p2);
            assert_eq!(rss.queue_for(them, us, 4791, p2), q);
        }
        let one = Rss {
            key: DEFAULT_RSS_KEY.to_vec(),
            reta: vec![0; 8],
        };
        assert_eq!(one.pick_port(us, them, 1, 1, 0, |_| false), None);
    }

    /// An Ethernet/IPv4/TCP frame from `src:sport` to `dst:dport`.
    fn tcp_frame(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 54];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[23] = 6;
        f[26..30].copy_from_slice(&src.octets());
        f[30..34].copy_from_slice(&dst.octets());
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    #[test]
    fn a_frame_to_a_picked_port_names_the_opener() {
        let rss = Rss::round_robin(3);
        let (us, them) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        for q in 0..3 {
            let p = rss.pick_port(us, them, 4791, q, 49_152, |_| false).unwrap();
            // The peer's reply, as the receiving worker parses it.
            let f = tcp_frame(them, us, 4791, p);
            assert_eq!(ipv4_tcp_flow(&f), Some((them, us, 4791, p)));
            assert_eq!(rss.queue_of_frame(&f), Some(q));
        }
        // Not TCP, not IPv4, truncated: nobody's in particular.
        let mut udp = tcp_frame(them, us, 1, 2);
        udp[23] = 17;
        assert_eq!(rss.queue_of_frame(&udp), None);
        let mut arp = tcp_frame(them, us, 1, 2);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(rss.queue_of_frame(&arp), None);
        assert_eq!(rss.queue_of_frame(&tcp_frame(them, us, 1, 2)[..36]), None);
        let mut bad_ihl = tcp_frame(them, us, 1, 2);
        bad_ihl[14] = 0x42;
        assert_eq!(ipv4_tcp_flow(&bad_ihl), None);
        // One 802.1Q tag (VLAN 5) before the IPv4 header.
        let plain = tcp_frame(them, us, 4791, 50_000);
        let mut tagged = plain[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        tagged.extend_from_slice(&plain[12..]);
        assert_eq!(ipv4_tcp_flow(&tagged), Some((them, us, 4791, 50_000)));
        tagged[16] = 0x86;
        assert_eq!(ipv4_tcp_flow(&tagged), None);
    }

    /// The receive path's reading of a frame: the slow path for ARP,
    /// control segments and anything not TCP, with or without a VLAN tag.
    #[test]
    fn summary_reads_tagged_and_untagged_frames_alike() {
        let (us, them) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let tag = |f: &[u8]| {
            let mut t = f[..12].to_vec();
            t.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
            t.extend_from_slice(&f[12..]);
            t
        };
        let mut ack = tcp_frame(them, us, 4791, 50_000);
        ack[46] = 0x50;
        ack[47] = 0x10;
        let mut syn = ack.clone();
        syn[47] = 0x02;
        let mut fin = ack.clone();
        fin[47] = 0x11;
        let mut arp = ack.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        let mut udp = ack.clone();
        udp[23] = 17;
        for f in [ack.clone(), tag(&ack)] {
            let v = RxSummary::of(&f);
            assert_eq!(v.flow, Some((them, us, 4791, 50_000)));
            assert!(!v.punt() && !v.arp, "{v:?}");
        }
        for f in [syn.clone(), tag(&syn), fin.clone(), tag(&fin)] {
            let v = RxSummary::of(&f);
            assert!(v.punt() && v.flow.is_some(), "{v:?}");
        }
        for f in [arp.clone(), tag(&arp)] {
            let v = RxSummary::of(&f);
            assert!(v.punt() && v.arp && v.flow.is_none(), "{v:?}");
        }
        for f in [udp.clone(), tag(&udp), ack[..13].to_vec()] {
            let v = RxSummary::of(&f);
            assert!(v.punt() && !v.arp && v.flow.is_none(), "{v:?}");
        }
    }
}
