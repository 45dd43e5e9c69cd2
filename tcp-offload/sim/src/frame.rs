//! Reading and crafting Ethernet/IPv4/TCP frames in tests.
//!
//! Deliberately a separate, minimal implementation rather than the
//! [`wire`](tcp_offload::wire) layer: scenario tests use it to watch the wire
//! (which segment is a retransmission, what a window probe carries) and to
//! inject raw segments (a SYN flood), and a check that shares code with
//! what it checks proves less. It reads fixed offsets and verifies
//! nothing; everything returns `None` rather than panicking on frames it
//! does not understand.

use core::net::{Ipv4Addr, SocketAddrV4};

use tcp_offload::seq::SeqNumber;
use tcp_offload::wire::TcpFlags;

const ETHERTYPE_IPV4: u16 = 0x0800;
const PROTO_TCP: u8 = 6;

/// The TCP header fields of a frame, as read off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpView {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub seq: SeqNumber,
    pub ack: SeqNumber,
    pub flags: TcpFlags,
    /// The window field as on the wire, unscaled.
    pub window: u16,
    /// Offset of the TCP payload in the frame.
    pub payload_offset: usize,
    /// Payload length (from the IPv4 total length, so Ethernet padding is
    /// not counted).
    pub payload_len: usize,
}

impl TcpView {
    /// Whether the segment carries payload.
    pub fn has_data(&self) -> bool {
        self.payload_len > 0
    }

    /// Whether every flag of `f` is set.
    pub fn has(&self, f: TcpFlags) -> bool {
        self.flags.contains(f)
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn ipv4_at(b: &[u8], at: usize) -> Option<Ipv4Addr> {
    let o: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(Ipv4Addr::from(o))
}

/// Reads the TCP header of an Ethernet II / IPv4 / TCP frame.
pub fn peek_tcp(frame: &[u8]) -> Option<TcpView> {
    if be16(frame, 12)? != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = 14;
    let ver_ihl = *frame.get(ip)?;
    if ver_ihl >> 4 != 4 || *frame.get(ip + 9)? != PROTO_TCP {
        return None;
    }
    let ihl = usize::from(ver_ihl & 0x0f) * 4;
    let total = usize::from(be16(frame, ip + 2)?);
    let tcp = ip + ihl;
    let data_offset = usize::from(*frame.get(tcp + 12)? >> 4) * 4;
    if ihl < 20 || data_offset < 20 || total < ihl + data_offset || ip + total > frame.len() {
        return None;
    }
    let src_ip = ipv4_at(frame, ip + 12)?;
    let dst_ip = ipv4_at(frame, ip + 16)?;
    Some(TcpView {
        dst_mac: frame.get(0..6)?.try_into().ok()?,
        src_mac: frame.get(6..12)?.try_into().ok()?,
        src: SocketAddrV4::new(src_ip, be16(frame, tcp)?),
        dst: SocketAddrV4::new(dst_ip, be16(frame, tcp + 2)?),
        seq: SeqNumber(be32(frame, tcp + 4)?),
        ack: SeqNumber(be32(frame, tcp + 8)?),
        flags: TcpFlags(be16(frame, tcp + 12)? & 0x01ff),
        window: be16(frame, tcp + 14)?,
        payload_offset: tcp + data_offset,
        payload_len: total - ihl - data_offset,
    })
}

/// A raw TCP segment to craft with [`build_tcp_frame`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawSegment<'a> {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub seq: SeqNumber,
    pub ack: SeqNumber,
    pub flags: TcpFlags,
    pub window: u16,
    /// MSS option, for SYNs.
    pub mss: Option<u16>,
    pub payload: &'a [u8],
}

/// The Internet checksum (RFC 1071) of `data` added to `initial`, folded
/// but not complemented.
fn ones_complement_sum(initial: u32, data: &[u8]) -> u32 {
    let mut sum = initial;
    let mut chunks = data.chunks_exact(2);
    for pair in &mut chunks {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

fn finish_checksum(sum: u32) -> u16 {
    // `sum` is folded to 16 bits by `ones_complement_sum`.
    !(u16::try_from(sum & 0xffff).unwrap_or(0))
}

/// Builds a complete Ethernet II / IPv4 (DF, TTL 64) / TCP frame with
/// valid checksums.
pub fn build_tcp_frame(seg: &RawSegment<'_>) -> Vec<u8> {
    let opt_len = if seg.mss.is_some() { 4 } else { 0 };
    let tcp_len = 20 + opt_len + seg.payload.len();
    let total = 20 + tcp_len;
    let mut f = vec![0u8; 14 + total];
    f[0..6].copy_from_slice(&seg.dst_mac);
    f[6..12].copy_from_slice(&seg.src_mac);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());

    let ip = 14;
    f[ip] = 0x45;
    let total16 = u16::try_from(total).unwrap_or(u16::MAX);
    f[ip + 2..ip + 4].copy_from_slice(&total16.to_be_bytes());
    f[ip + 6] = 0x40; // DF
    f[ip + 8] = 64;
    f[ip + 9] = PROTO_TCP;
    f[ip + 12..ip + 16].copy_from_slice(&seg.src.ip().octets());
    f[ip + 16..ip + 20].copy_from_slice(&seg.dst.ip().octets());
    let ip_sum = finish_checksum(ones_complement_sum(0, &f[ip..ip + 20]));
    f[ip + 10..ip + 12].copy_from_slice(&ip_sum.to_be_bytes());

    let t = ip + 20;
    f[t..t + 2].copy_from_slice(&seg.src.port().to_be_bytes());
    f[t + 2..t + 4].copy_from_slice(&seg.dst.port().to_be_bytes());
    f[t + 4..t + 8].copy_from_slice(&seg.seq.0.to_be_bytes());
    f[t + 8..t + 12].copy_from_slice(&seg.ack.0.to_be_bytes());
    let offset_words = u16::try_from((20 + opt_len) / 4).unwrap_or(5);
    let off_flags = (offset_words << 12) | (seg.flags.0 & 0x01ff);
    f[t + 12..t + 14].copy_from_slice(&off_flags.to_be_bytes());
    f[t + 14..t + 16].copy_from_slice(&seg.window.to_be_bytes());
    if let Some(mss) = seg.mss {
        f[t + 20] = 2;
        f[t + 21] = 4;
        f[t + 22..t + 24].copy_from_slice(&mss.to_be_bytes());
    }
    f[t + 20 + opt_len..].copy_from_slice(seg.payload);

    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&seg.src.ip().octets());
    pseudo[4..8].copy_from_slice(&seg.dst.ip().octets());
    pseudo[9] = PROTO_TCP;
    let tcp_len16 = u16::try_from(tcp_len).unwrap_or(u16::MAX);
    pseudo[10..12].copy_from_slice(&tcp_len16.to_be_bytes());
    let sum = ones_complement_sum(ones_complement_sum(0, &pseudo), &f[t..]);
    f[t + 16..t + 18].copy_from_slice(&finish_checksum(sum).to_be_bytes());
    f
}

/// Whether the IPv4 header checksum and the TCP checksum of a frame
/// verify.
pub fn tcp_checksums_ok(frame: &[u8]) -> bool {
    let Some(v) = peek_tcp(frame) else {
        return false;
    };
    let ip = 14;
    let ihl = usize::from(frame[ip] & 0x0f) * 4;
    if ones_complement_sum(0, &frame[ip..ip + ihl]) != 0xffff {
        return false;
    }
    let tcp_start = ip + ihl;
    let tcp_end = v.payload_offset + v.payload_len;
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&v.src.ip().octets());
    pseudo[4..8].copy_from_slice(&v.dst.ip().octets());
    pseudo[9] = PROTO_TCP;
    let tcp_len = u16::try_from(tcp_end - tcp_start).unwrap_or(u16::MAX);
    pseudo[10..12].copy_from_slice(&tcp_len.to_be_bytes());
    ones_complement_sum(ones_complement_sum(0, &pseudo), &frame[tcp_start..tcp_end]) == 0xffff
}

/// A drop filter that drops the TCP data segments (segments with payload)
/// whose index, counted from zero over every data segment seen on the
/// direction (retransmissions included), is in `indices`.
pub fn drop_data_segments(indices: &[u64]) -> super::DropFilter {
    let indices = indices.to_vec();
    let mut seen = 0u64;
    Box::new(move |_now, frame| {
        let Some(v) = peek_tcp(frame) else {
            return false;
        };
        if !v.has_data() {
            return false;
        }
        let i = seen;
        seen += 1;
        indices.contains(&i)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(payload: &[u8]) -> Vec<u8> {
        build_tcp_frame(&RawSegment {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 4000),
            dst: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 80),
            seq: SeqNumber(1000),
            ack: SeqNumber(77),
            flags: TcpFlags::SYN | TcpFlags::ACK,
            window: 512,
            mss: Some(1460),
            payload,
        })
    }

    #[test]
    fn crafted_frames_read_back() {
        let f = sample(b"hello");
        assert_eq!(f.len(), 14 + 20 + 24 + 5);
        let v = peek_tcp(&f).unwrap();
        assert_eq!(v.src.port(), 4000);
        assert_eq!(v.dst, SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 80));
        assert_eq!(v.seq, SeqNumber(1000));
        assert_eq!(v.ack, SeqNumber(77));
        assert!(v.has(TcpFlags::SYN) && v.has(TcpFlags::ACK) && !v.has(TcpFlags::FIN));
        assert_eq!(v.window, 512);
        assert_eq!(
            &f[v.payload_offset..v.payload_offset + v.payload_len],
            b"hello"
        );
        assert!(tcp_checksums_ok(&f));
        assert!(tcp_checksums_ok(&sample(b"odd")));
    }

    #[test]
    fn flipped_bits_fail_the_checksums() {
        let f = sample(b"payload bytes");
        for i in 14..f.len() {
            let mut g = f.clone();
            g[i] ^= 0x10;
            assert!(!tcp_checksums_ok(&g), "flip at {i} went unnoticed");
        }
    }

    #[test]
    fn garbage_is_not_tcp() {
        assert_eq!(peek_tcp(&[]), None);
        assert_eq!(peek_tcp(&[0u8; 13]), None);
        let mut f = sample(b"");
        f.truncate(40);
        assert_eq!(peek_tcp(&f), None);
        let mut arp = sample(b"");
        arp[13] = 0x06;
        assert_eq!(peek_tcp(&arp), None);
    }

    #[test]
    fn drop_filter_counts_data_segments_only() {
        let mut filter = drop_data_segments(&[1]);
        let t = tcp_offload::time::Instant::ZERO;
        assert!(!filter(t, &sample(b"")));
        assert!(!filter(t, &sample(b"a")));
        assert!(filter(t, &sample(b"b")));
        assert!(!filter(t, &sample(b"c")));
    }
}
