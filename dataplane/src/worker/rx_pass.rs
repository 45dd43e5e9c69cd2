//! The receive pass: verifies a received segment's TCP checksum and, in
//! the same read of its payload ([`crate::pass::crc_sum`]), takes the MPA
//! CRC of the FPDU the payload carries. It runs in the receive stage
//! (`worker/rx.rs`) on every IPv4/TCP frame of the worker's own queue
//! whose device said nothing of its checksum; the verdict goes to
//! `tcp-offload` as a device's would (a bad checksum drops the segment
//! there, counted, before any parsing), and the CRC waits in
//! [`RxCrcs`] until the connection's service hands the payload to the
//! QP engine (`Endpoint::handle_stream_with_crc`), which then compares
//! it with the CRC field instead of reading the payload a second time.
//! The placement into registered memory is the one other read.
//!
//! A payload is taken for an FPDU when its first two octets, read as an
//! MPA length, make an FPDU of exactly the payload's size, as every
//! segment from a peer that keeps FPDUs aligned does; the engine checks
//! that again against its own state and ignores the CRC where it does
//! not apply (setup frames, markers, a stream not at an FPDU boundary).

use core::cell::Cell;

use rdmap::mpa::fpdu::{is_one_fpdu, CRC_LEN};
use tcp_offload::iface::{DeviceCksum, RxChecksum};
use tcp_offload::wire::{checksum, EtherType, EthernetFrame, IpProtocol, Ipv4Packet, TcpPacket};

use super::RX_BURST;

/// Payload shorter than this is verified by `tcp-offload` as it parses
/// (a header, an acknowledgement, a small record: the vector pass would
/// not pay).
const PASS_MIN: usize = crate::pass::VECTOR_MIN;

/// The CRCs the receive pass took in the current burst, by the address
/// and length of the payload they cover. Cleared at the start of each
/// burst: a payload the connection takes later is read again by the
/// deframer, as before.
#[derive(Debug)]
pub(super) struct RxCrcs {
    entries: [(usize, usize, u32); RX_BURST],
    len: usize,
    /// Where [`RxCrcs::of`] starts looking: after the entry it found
    /// last. Connections take their payloads in the order the pass
    /// noted them, so the next one asked for is most often there,
    /// where a search from the start took half a burst's comparisons.
    cursor: Cell<usize>,
}

impl RxCrcs {
    pub(super) const fn new() -> RxCrcs {
        RxCrcs {
            entries: [(0, 0, 0); RX_BURST],
            len: 0,
            cursor: Cell::new(0),
        }
    }

    pub(super) fn clear(&mut self) {
        self.len = 0;
        self.cursor.set(0);
    }

    fn note(&mut self, payload: &[u8], crc: u32) {
        if let Some(e) = self.entries.get_mut(self.len) {
            *e = (payload.as_ptr() as usize, payload.len(), crc);
            self.len += 1;
        }
    }

    /// The CRC of all of `chunk` but its last four octets, if the pass
    /// took it: `chunk` must be the very payload it read (same address,
    /// same length), which the frame holding it keeps alive.
    pub(super) fn of(&self, chunk: &[u8]) -> Option<u32> {
        let key = (chunk.as_ptr() as usize, chunk.len());
        let live = &self.entries[..self.len];
        let start = self.cursor.get().min(live.len());
        let (i, e) = (start..live.len())
            .chain(0..start)
            .map(|i| (i, &live[i]))
            .find(|(_, e)| (e.0, e.1) == key)?;
        self.cursor.set(i + 1);
        Some(e.2)
    }
}

/// Checks the TCP checksum of `frame` if it is an IPv4/TCP frame with
/// payload worth the pass, noting the FPDU CRC in `crcs`; returns
/// `cksum` with the TCP verdict filled in, or `cksum` unchanged when the
/// frame is left to `tcp-offload` (not IPv4/TCP, too short, lengths that
/// do not add up: its parser counts and drops what is malformed).
pub(super) fn verify(frame: &[u8], cksum: RxChecksum, crcs: &mut RxCrcs) -> RxChecksum {
    if cksum.l4 != DeviceCksum::Unchecked {
        return cksum;
    }
    let Some(Checked { good, fpdu }) = check(frame) else {
        return cksum;
    };
    if let (true, Some((payload, crc))) = (good, fpdu) {
        crcs.note(payload, crc);
    }
    RxChecksum {
        ip: cksum.ip,
        l4: if good {
            DeviceCksum::Good
        } else {
            DeviceCksum::Bad
        },
    }
}

/// What [`check`] found.
struct Checked<'a> {
    /// The TCP checksum verifies.
    good: bool,
    /// The payload and the CRC of all but its last four octets, where it
    /// looks like one FPDU.
    fpdu: Option<(&'a [u8], u32)>,
}

/// The TCP checksum of `frame` and the FPDU CRC of its payload; `None`
/// when the frame is not one to check here.
fn check(frame: &[u8]) -> Option<Checked<'_>> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.payload_ethertype() != EtherType::Ipv4 {
        return None;
    }
    let l3 = frame.get(eth.header_len()..)?;
    if l3.len() < 20 {
        return None;
    }
    let ip = Ipv4Packet::new_unchecked(l3);
    let (ihl, total) = (ip.header_len(), usize::from(ip.total_len()));
    if ip.next_header() != IpProtocol::Tcp || ihl < 20 || total < ihl + 20 || total > l3.len() {
        return None;
    }
    let segment = &l3[ihl..total];
    let doff = TcpPacket::new_unchecked(segment).header_len();
    if doff < 20 || doff > segment.len() || segment.len() - doff < PASS_MIN {
        return None;
    }
    let (header, payload) = segment.split_at(doff);
    let one_fpdu = is_one_fpdu(payload);
    let covered = if one_fpdu {
        payload.len() - CRC_LEN
    } else {
        payload.len()
    };
    let (crc, body) = crate::pass::crc_sum(0, &payload[..covered]);
    let mut sum = checksum::combine(
        checksum::pseudo_header(ip.src_addr(), ip.dst_addr(), 6, segment.len()),
        crate::checksum::sum(header),
    );
    // The header's length is a multiple of four: the payload starts at an
    // even offset, and so does the CRC field after `covered` (a multiple
    // of four too, when it is an FPDU).
    sum = checksum::combine(sum, body);
    sum = checksum::combine_at(sum, checksum::sum(&payload[covered..]), covered);
    let good = checksum::verifies(sum);
    Some(Checked {
        good,
        fpdu: one_fpdu.then_some((payload, crc)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;
    use tcp_offload::wire::{EthernetAddress, EthernetRepr, Ipv4Repr, TcpFlags};

    const SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    /// An Ethernet/IPv4/TCP frame around `payload`, checksums right.
    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20 + payload.len()];
        EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: EtherType::Ipv4,
            vlan: None,
        }
        .emit(&mut f[..14]);
        Ipv4Repr {
            src_addr: SRC,
            dst_addr: DST,
            next_header: IpProtocol::Tcp,
            payload_len: 20 + payload.len(),
            hop_limit: 64,
            tos: 0,
            ident: 0,
            dont_frag: true,
        }
        .emit(&mut f[14..34]);
        f[54..].copy_from_slice(payload);
        let mut p = TcpPacket::new_unchecked(&mut f[34..]);
        p.set_src_port(4000);
        p.set_dst_port(5000);
        p.set_header_len(20);
        p.set_flags(TcpFlags::ACK);
        p.fill_checksum(SRC, DST);
        f
    }

    /// An FPDU of `ulpdu` octets (pad, CRC right).
    fn fpdu(ulpdu: usize) -> Vec<u8> {
        let mut f = (ulpdu as u16).to_be_bytes().to_vec();
        f.extend((0..ulpdu).map(|i| (i * 7 + 1) as u8));
        while !f.len().is_multiple_of(4) {
            f.push(0);
        }
        let crc = crc32c::crc32c(&f);
        f.extend_from_slice(&crc.to_le_bytes());
        f
    }

    #[test]
    fn a_good_segment_verifies_and_its_fpdu_crc_is_noted() {
        for ulpdu in [300, 1441, 8950] {
            let p = fpdu(ulpdu);
            let f = frame(&p);
            let mut crcs = RxCrcs::new();
            let v = verify(&f, RxChecksum::VERIFY, &mut crcs);
            assert_eq!(v.l4, DeviceCksum::Good, "{ulpdu}");
            assert_eq!(
                v.ip,
                DeviceCksum::Unchecked,
                "the IP header is left to the parser"
            );
            let payload = &f[f.len() - p.len()..];
            let want = crc32c::crc32c(&p[..p.len() - 4]);
            assert_eq!(crcs.of(payload), Some(want));
            // Another slice of the same length elsewhere is not it.
            assert_eq!(crcs.of(&p), None);
            crcs.clear();
            assert_eq!(crcs.of(payload), None);
        }
    }

    #[test]
    fn a_corrupted_byte_anywhere_makes_the_verdict_bad() {
        let p = fpdu(1000);
        let f = frame(&p);
        for at in [14 + 20 + 3, 14 + 20 + 25, f.len() - 500, f.len() - 1] {
            let mut bad = f.clone();
            bad[at] ^= 0x10;
            let mut crcs = RxCrcs::new();
            let v = verify(&bad, RxChecksum::VERIFY, &mut crcs);
            assert_eq!(v.l4, DeviceCksum::Bad, "byte {at}");
            assert_eq!(crcs.len, 0, "no CRC noted for a bad segment");
        }
    }

    #[test]
    fn payload_that_is_not_one_fpdu_is_verified_without_a_crc() {
        let mut p = fpdu(600);
        p.extend_from_slice(&fpdu(100));
        let f = frame(&p);
        let mut crcs = RxCrcs::new();
        assert_eq!(
            verify(&f, RxChecksum::VERIFY, &mut crcs).l4,
            DeviceCksum::Good
        );
        assert_eq!(crcs.len, 0);
        // An odd-length payload sums right too.
        let f = frame(&[0xab; 333]);
        assert_eq!(
            verify(&f, RxChecksum::VERIFY, &mut crcs).l4,
            DeviceCksum::Good
        );
    }

    #[test]
    fn small_foreign_and_device_checked_frames_are_left_alone() {
        let mut crcs = RxCrcs::new();
        let small = frame(&fpdu(20));
        assert_eq!(
            verify(&small, RxChecksum::VERIFY, &mut crcs),
            RxChecksum::VERIFY
        );
        let arp = [0u8; 60];
        assert_eq!(
            verify(&arp, RxChecksum::VERIFY, &mut crcs),
            RxChecksum::VERIFY
        );
        let device = RxChecksum {
            ip: DeviceCksum::Good,
            l4: DeviceCksum::Good,
        };
        let mut bad = frame(&fpdu(1000));
        let n = bad.len();
        bad[n - 9] ^= 1;
        assert_eq!(
            verify(&bad, device, &mut crcs),
            device,
            "the device's word stands"
        );
        // Lengths that do not add up go to the parser.
        let mut short = frame(&fpdu(1000));
        short.truncate(300);
        assert_eq!(
            verify(&short, RxChecksum::VERIFY, &mut crcs),
            RxChecksum::VERIFY
        );
        assert_eq!(crcs.len, 0);
    }

    /// Payloads are found whatever order they are asked for in, each
    /// time; one the pass never noted (or noted in an earlier burst) is
    /// not.
    #[test]
    fn crcs_are_found_in_any_order() {
        let bufs: Vec<Vec<u8>> = (0..5u8).map(|k| vec![k; 100 + usize::from(k)]).collect();
        let mut crcs = RxCrcs::new();
        for (k, b) in bufs.iter().enumerate() {
            crcs.note(b, k as u32);
        }
        for order in [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 4, 1]] {
            for k in order {
                assert_eq!(crcs.of(&bufs[k]), Some(k as u32), "{order:?}");
            }
        }
        // The same address with another length is another payload.
        assert_eq!(crcs.of(&bufs[1][..50]), None);
        crcs.clear();
        assert_eq!(crcs.of(&bufs[0]), None);
        crcs.note(&bufs[3], 33);
        assert_eq!(crcs.of(&bufs[3]), Some(33));
        assert_eq!(crcs.of(&bufs[4]), None);
    }
}
