//! What the capture tests share: run WRITE, READ and SEND under a
//! capture, read the file back with `pcap_kit` (handshake, MPA
//! request and reply, FPDUs both ways), and decode it with `tshark`
//! where installed (iWARP frames, none malformed, no bad CRC).
#![allow(dead_code, reason = "each test file uses part of the harness")]

use std::path::{Path, PathBuf};
use std::process::Command;

use dataplane::capture::{CaptureOptions, CaptureSummary};
use pcap_kit::{Reader, Reassembler, Stream};

use super::runtime_common::*;

pub fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "iwarp-runtime-capture-{}-{name}.pcap",
        std::process::id()
    ))
}

/// Sizes of each operation: one byte, a few segments, many segments.
pub const SIZES: [usize; 3] = [1, 4097, 256 * 1024];

pub fn frames_counted(p: &Pair) -> u64 {
    p.a.stats()
        .iter()
        .map(|s| s.rx_packets + s.tx_packets)
        .sum()
}

/// Connects, runs every operation at every size, stops the capture.
pub fn run_captured(p: &Pair, path: &Path, opts: &CaptureOptions) -> (CaptureSummary, u64) {
    let before = frames_counted(p);
    p.a.capture_start(path, opts).expect("capture starts");
    assert!(p.a.capturing());
    let (mut a, mut b) = connect(p);
    let mut id = 1;
    for op in [Op::Write, Op::Read, Op::Send] {
        for len in SIZES {
            exchange(p, &mut a, &mut b, op, len, id);
            id += 1;
        }
    }
    // Let the last acknowledgements cross.
    for _ in 0..50 {
        p.pump();
    }
    let counted = frames_counted(p) - before;
    let summary = p.a.capture_stop().expect("capture stops");
    assert!(!p.a.capturing());
    (summary, counted)
}

/// Walks one direction of an MPA connection: the MPA request or reply
/// (`key`) with its private data, then FPDUs (length, ULPDU, pad, CRC)
/// to the end; how many FPDUs.
pub fn count_fpdus(s: &Stream, key: &[u8; 16]) -> usize {
    assert!(s.is_complete(), "{}: gaps {:?}", s.src, s.gaps);
    let d = &s.data;
    assert_eq!(
        &d[..16],
        key,
        "{}: the stream starts with its MPA frame",
        s.src
    );
    let private = usize::from(u16::from_be_bytes([d[18], d[19]]));
    let mut at = 20 + private;
    let mut n = 0;
    while at < d.len() {
        let ulpdu = usize::from(u16::from_be_bytes([d[at], d[at + 1]]));
        let fpdu = (2 + ulpdu).next_multiple_of(4) + 4;
        assert!(at + fpdu <= d.len(), "{}: FPDU {n} cut short", s.src);
        at += fpdu;
        n += 1;
    }
    assert_eq!(at, d.len());
    n
}

/// Reads the file back and checks what it holds; returns the frames.
pub fn check_file(path: &Path, summary: &CaptureSummary) -> usize {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes.len() as u64, summary.bytes);
    let records = Reader::read_all(&bytes).expect("the capture parses");
    assert_eq!(records.len() as u64, summary.captured());
    assert!(records.iter().all(|r| !r.is_truncated()));
    let conns = Reassembler::from_records(records.iter().copied());
    let c = conns
        .iter()
        .find(|c| c.streams.iter().any(|s| s.dst.port() == PORT))
        .expect("the iWARP connection is in the capture");
    let client = &c.streams[0];
    let server = &c.streams[1];
    assert_eq!((*client.src.ip(), *server.src.ip()), (IP_A, IP_B));
    assert!(
        client.isn.is_some() && server.isn.is_some(),
        "the SYN and the SYN-ACK are in the capture"
    );
    let out = count_fpdus(client, b"MPA ID Req Frame");
    let back = count_fpdus(server, b"MPA ID Rep Frame");
    println!(
        "pcap: {} frames, {} FPDUs from a, {} FPDUs from b",
        records.len(),
        out,
        back
    );
    // Writes and Sends go out, Read Responses come back, each in
    // segments of one MSS.
    let bulk = SIZES.iter().sum::<usize>() / 1460;
    assert!(out > 2 * bulk && back > bulk, "{out} / {back}");
    records.len()
}

/// Whether tshark is installed. deploy/test.sh as root installs it
/// (deploy/install-deps.sh): with IWARP_REQUIRE_ROOT_TESTS=1 a missing
/// tshark is a broken setup, not a reason to skip, and fails.
pub fn have_tshark() -> bool {
    let ok = Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok || std::env::var("IWARP_REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
        "tshark is not installed (deploy/install-deps.sh installs it)"
    );
    ok
}

/// Lines `tshark -r path --disable-protocol rpcordma <args…>` prints
/// (RPC-over-RDMA would claim some of the RDMAP frames).
pub fn tshark_lines(path: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args(["--disable-protocol", "rpcordma"])
        .args(args)
        .output()
        .expect("tshark runs");
    assert!(
        out.status.success(),
        "tshark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Decodes the file with Wireshark: iWARP frames present, nothing
/// malformed, no bad CRC; returns the iWARP frames decoded.
pub fn check_tshark(path: &Path, label: &str) -> Option<usize> {
    if !have_tshark() {
        println!("{label}: tshark not installed: Wireshark decoding not checked");
        return None;
    }
    let fields = ["-T", "fields", "-e", "frame.number"];
    let iwarp = tshark_lines(path, &[&["-Y", "iwarp_ddp_rdmap"][..], &fields].concat()).len();
    let bad = tshark_lines(
        path,
        &[
            &["-Y", "_ws.malformed || _ws.expert.severity >= error"][..],
            &fields,
        ]
        .concat(),
    );
    let verbose = tshark_lines(path, &["-V"]);
    let bad_crc = verbose.iter().filter(|l| l.contains("Bad CRC32")).count();
    let good_crc = verbose.iter().filter(|l| l.contains("Good CRC32")).count();
    println!(
        "{label}: tshark: {iwarp} iWARP (DDP/RDMAP) frames, {} malformed or in error, \
         MPA CRCs {good_crc} good and {bad_crc} bad",
        bad.len()
    );
    assert!(iwarp > 0, "Wireshark decoded no iWARP frame");
    assert!(bad.is_empty(), "malformed frames: {bad:?}");
    assert_eq!(bad_crc, 0);
    // Wireshark checked the CRC of every FPDU it decoded.
    assert!(good_crc >= iwarp, "{good_crc} CRCs checked, {iwarp} frames");
    Some(iwarp)
}
