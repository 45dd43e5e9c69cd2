//! DDP/RDMAP headers from real siw traffic, embedded as bytes, and a scan
//! of every capture in the repository's `deploy/interop/captures/`.
//!
//! The constants were read from the captures named next to them (frame
//! numbers as tshark counts them); the scan re-reads the captures, walks
//! every FPDU of every MPA connection in both directions and requires each
//! DDP header, Read Request and Terminate in them to parse.
#![allow(
    clippy::disallowed_methods,
    reason = "reads the capture fixtures from disk"
)]

mod captures_common;

use std::collections::BTreeMap;
use std::path::Path;

use pcap_kit::{Reader, Reassembler};
use rdmap::error::TerminateCause;
use rdmap::wire::{
    DdpPacket, DdpRepr, RdmapOpcode, ReadRequest, TerminateLayout, TerminateMessage, WireError,
    READ_REQUEST_LEN,
};

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert_eq!(digits.len() & 1, 0, "odd hex length");
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

/// rping.pcap frame 28: the client's first Send, a whole FPDU (ULPDU
/// length 0x22, 18-byte header, 16 bytes of rping's buffer advertisement,
/// CRC field zero as CRC is off).
const RPING_SEND_FPDU: &str = "0022 \
    41 43 00000000 00000000 00000001 00000000 \
    0000564378b75460 f52e2400 00000064 \
    00000000";

/// rping.pcap frame 29: the server's RDMA Read Request, a whole FPDU.
const RPING_READ_REQUEST_FPDU: &str = "002e \
    41 41 00000000 00000001 00000001 00000000 \
    2b9d4f00 00005557c0ebedc0 00000064 f52e2400 0000564378b75460 \
    00000000";

/// rping.pcap frame 30: the Read Response header (last segment).
const RPING_READ_RESPONSE: &str = "c1 42 2b9d4f00 00005557c0ebedc0";

/// rping.pcap frame 33: the server's RDMA Write header (last segment).
const RPING_WRITE: &str = "c1 40 0f28aa00 0000564378b72dc0";

/// write_bw.pcap frame 51: ib_write_bw's first RDMA Write segment (L = 0),
/// ULPDU length 0x5a2 = 14 + 1428 payload bytes.
const WRITE_BW_FIRST: &str = "81 40 2e11bf00 00007ff39f764000";

/// write_bw.pcap frame 117: the last segment of a 64 KiB Write.
const WRITE_BW_LAST: &str = "c1 40 2e11bf00 00007ff39f773b04";

/// host-probe.pcap frame 147: siw's zero-length Read Response to a
/// peer-to-peer RTR (STag 0, TO 0).
const P2P_READ_RESPONSE: &str = "c1 42 00000000 0000000000000000";

/// host-probe.pcap frame 95: a Read Response segment that is not the last.
const READ_RESPONSE_MIDDLE: &str = "81 42 b0954700 00007f33f4003f30";

fn parse(bytes: &[u8]) -> (DdpRepr, usize) {
    DdpRepr::parse_ulpdu(bytes).expect("capture header parses")
}

fn reemit(repr: &DdpRepr) -> Vec<u8> {
    let mut b = vec![0u8; repr.header_len()];
    repr.emit(&mut b);
    b
}

#[test]
fn rping_send() {
    let fpdu = hex(RPING_SEND_FPDU);
    let len = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
    let ulpdu = &fpdu[2..2 + len];
    let (repr, hl) = parse(ulpdu);
    assert_eq!(hl, 18);
    assert_eq!(
        repr,
        DdpRepr::Untagged {
            opcode: RdmapOpcode::Send,
            last: true,
            qn: 0,
            msn: 1,
            mo: 0,
            inv_stag: None,
        }
    );
    let p = DdpPacket::new_checked(ulpdu).unwrap();
    assert_eq!(p.payload(), &hex("0000564378b75460 f52e2400 00000064")[..]);
    assert_eq!(reemit(&repr), &ulpdu[..18]);
}

#[test]
fn rping_read_request() {
    let fpdu = hex(RPING_READ_REQUEST_FPDU);
    let len = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
    assert_eq!(len, 18 + READ_REQUEST_LEN);
    let ulpdu = &fpdu[2..2 + len];
    let (repr, hl) = parse(ulpdu);
    assert_eq!(
        repr,
        DdpRepr::untagged(RdmapOpcode::ReadRequest, true, 1, 0)
    );
    let rr = ReadRequest::parse_bytes(&ulpdu[hl..]).unwrap();
    assert_eq!(
        rr,
        ReadRequest {
            sink_stag: 0x2b9d_4f00,
            sink_to: 0x5557_c0eb_edc0,
            size: 100,
            source_stag: 0xf52e_2400,
            source_to: 0x5643_78b7_5460,
        }
    );
    // The Read Response that answers it targets the Read Request's sink.
    let (resp, _) = parse(&hex(RPING_READ_RESPONSE));
    assert_eq!(
        resp,
        DdpRepr::tagged(RdmapOpcode::ReadResponse, true, rr.sink_stag, rr.sink_to)
    );
    let mut out = vec![0u8; len];
    repr.emit(&mut out);
    rr.emit(&mut out[hl..]);
    assert_eq!(out, ulpdu);
}

#[test]
fn tagged_headers() {
    let cases = [
        (
            RPING_WRITE,
            DdpRepr::tagged(RdmapOpcode::RdmaWrite, true, 0x0f28_aa00, 0x5643_78b7_2dc0),
        ),
        (
            WRITE_BW_FIRST,
            DdpRepr::tagged(RdmapOpcode::RdmaWrite, false, 0x2e11_bf00, 0x7ff3_9f76_4000),
        ),
        (
            WRITE_BW_LAST,
            DdpRepr::tagged(RdmapOpcode::RdmaWrite, true, 0x2e11_bf00, 0x7ff3_9f77_3b04),
        ),
        (
            P2P_READ_RESPONSE,
            DdpRepr::tagged(RdmapOpcode::ReadResponse, true, 0, 0),
        ),
        (
            READ_RESPONSE_MIDDLE,
            DdpRepr::tagged(
                RdmapOpcode::ReadResponse,
                false,
                0xb095_4700,
                0x7f33_f400_3f30,
            ),
        ),
    ];
    for (bytes, want) in cases {
        let b = hex(bytes);
        assert_eq!(parse(&b), (want, 14), "{bytes}");
        assert_eq!(reemit(&want), b);
    }
    // 64 KiB in 1428-byte segments: the last one starts 45 segments in.
    let first = 0x7ff3_9f76_4000u64;
    let last = 0x7ff3_9f77_3b04u64;
    assert_eq!(last - first, 45 * 1428);
}

// ---------------------------------------------------------------------------
// Capture scan.

#[derive(Default, Debug)]
struct Tally {
    by_opcode: BTreeMap<String, usize>,
    terminates: Vec<(TerminateLayout, TerminateCause)>,
    errors: Vec<String>,
}

/// Walks the FPDUs after an MPA request or reply at the start of `s`.
fn walk(name: &str, s: &[u8], tally: &mut Tally) {
    let key_req = b"MPA ID Req Frame";
    let key_rep = b"MPA ID Rep Frame";
    if s.len() < 20 || (&s[..16] != key_req && &s[..16] != key_rep) {
        return;
    }
    let flags = s[16];
    // Markers (0x80) or a reject (0x20): no FPDUs this walk can read.
    if flags & 0xA0 != 0 {
        return;
    }
    let pd = usize::from(u16::from_be_bytes([s[18], s[19]]));
    let mut at = 20 + pd;
    while at + 2 <= s.len() {
        let len = usize::from(u16::from_be_bytes([s[at], s[at + 1]]));
        let fpdu = (2 + len).div_ceil(4) * 4 + 4;
        if at + fpdu > s.len() {
            break;
        }
        let ulpdu = &s[at + 2..at + 2 + len];
        match DdpRepr::parse_ulpdu(ulpdu) {
            Ok((repr, hl)) => {
                *tally
                    .by_opcode
                    .entry(format!("{:?}", repr.opcode()))
                    .or_default() += 1;
                match repr.opcode() {
                    RdmapOpcode::ReadRequest => {
                        if let Err(e) = ReadRequest::parse_bytes(&ulpdu[hl..]) {
                            tally.errors.push(format!("{name}@{at}: read request {e}"));
                        }
                    }
                    RdmapOpcode::Terminate => match TerminateMessage::parse(ulpdu) {
                        Ok((m, layout)) => tally.terminates.push((layout, m.header.cause)),
                        Err(e) => tally.errors.push(format!("{name}@{at}: terminate {e}")),
                    },
                    _ => {}
                }
            }
            Err(e) => tally.errors.push(format!("{name}@{at}: {e}")),
        }
        at += fpdu;
    }
}

/// Walks the in-order prefix of both directions of every TCP connection
/// (up to the first octet the capture lacks).
fn scan(path: &Path) -> Tally {
    let data = std::fs::read(path).unwrap();
    let records = Reader::read_all(&data).expect("capture reads");
    let mut tally = Tally::default();
    for conn in Reassembler::from_records(records) {
        for s in &conn.streams {
            let name = format!("{}:{}>{}", path.display(), s.src, s.dst);
            walk(&name, s.prefix(), &mut tally);
        }
    }
    tally
}

#[test]
fn every_capture_parses() {
    let dir = captures_common::captures_dir();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty());
    let mut total = 0;
    for p in &paths {
        let t = scan(p);
        let n: usize = t.by_opcode.values().sum();
        eprintln!(
            "{}: {n} FPDUs {:?}",
            p.file_name().unwrap().to_string_lossy(),
            t.by_opcode
        );
        assert!(t.errors.is_empty(), "{:#?}", t.errors);
        total += n;
        let name = p.file_name().unwrap().to_string_lossy();
        if name == "rping.pcap" {
            for op in ["Send", "ReadRequest", "ReadResponse", "RdmaWrite"] {
                assert!(t.by_opcode.get(op).copied().unwrap_or(0) > 0, "{op}");
            }
        }
        if name == "host-probe.pcap" {
            // siw's two Terminates, in its own layout.
            assert_eq!(
                t.terminates,
                vec![
                    (TerminateLayout::SiwSwapped, TerminateCause::MPA_CRC),
                    (
                        TerminateLayout::SiwSwapped,
                        TerminateCause::DDP_TAGGED_BASE_BOUNDS
                    ),
                ]
            );
        }
    }
    assert!(total > 1000, "only {total} FPDUs found");
}

#[test]
fn truncated_and_wrong_headers_are_errors_not_panics() {
    let b = hex(RPING_READ_REQUEST_FPDU);
    let ulpdu = &b[2..48];
    for cut in 0..18 {
        assert_eq!(
            DdpRepr::parse_ulpdu(&ulpdu[..cut]).map(|r| r.0),
            Err(WireError::Truncated)
        );
    }
    let (_, hl) = parse(ulpdu);
    for cut in 0..READ_REQUEST_LEN {
        assert_eq!(
            ReadRequest::parse_bytes(&ulpdu[hl..hl + cut]),
            Err(WireError::Truncated)
        );
    }
}
