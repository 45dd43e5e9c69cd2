//! Packet capture of a running dataplane: two dataplanes over an
//! in-memory link, a capture started on one before the connection, RDMA
//! WRITE, READ and SEND with the MPA CRC on, then the file checked two
//! ways: read back with `tcp_offload::pcap` (the TCP handshake, the MPA
//! request and reply, well-formed FPDUs in both directions, every frame
//! the worker counted) and, where `tshark` is installed, decoded by
//! Wireshark as iWARP with no malformed frame and no bad CRC. A capture
//! with a tiny ring drops frames (counted) while the transfer completes.

mod runtime_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use dataplane::api::{DriveMode, Error};
use dataplane::capture::{CaptureError, CaptureOptions, CaptureSummary};
use runtime_common::*;
use tcp_offload::pcap::{Reader, Reassembler, Stream};

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "iwarp-runtime-capture-{}-{name}.pcap",
        std::process::id()
    ))
}

/// Sizes of each operation: one byte, a few segments, many segments.
const SIZES: [usize; 3] = [1, 4097, 256 * 1024];

fn frames_counted(p: &Pair) -> u64 {
    p.a.stats()
        .iter()
        .map(|s| s.rx_packets + s.tx_packets)
        .sum()
}

/// Connects, runs every operation at every size, stops the capture.
fn run_captured(p: &Pair, path: &Path, opts: &CaptureOptions) -> (CaptureSummary, u64) {
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
fn count_fpdus(s: &Stream, key: &[u8; 16]) -> usize {
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
fn check_file(path: &Path, summary: &CaptureSummary) -> usize {
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

fn tshark() -> Option<&'static str> {
    let ok = Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some("tshark")
}

/// Lines tshark prints for `args` on `path`.
fn tshark_lines(path: &Path, args: &[&str]) -> Vec<String> {
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
fn check_tshark(path: &Path, label: &str) -> Option<usize> {
    let Some(_) = tshark() else {
        // deploy/test.sh as root installs it (deploy/install-deps.sh):
        // there, a missing tshark is a broken setup, not a reason to skip.
        assert!(
            std::env::var("IWARP_REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
            "tshark is not installed (deploy/install-deps.sh installs it)"
        );
        println!("{label}: tshark not installed: Wireshark decoding not checked");
        return None;
    };
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

fn capture_and_decode(o: &PairOptions, label: &str) {
    let p = Pair::new(o);
    let path = temp(label);
    let opts = CaptureOptions {
        ring_slots: 8192,
        ..CaptureOptions::default()
    };
    let (summary, counted) = run_captured(&p, &path, &opts);
    println!(
        "{label}: captured {} frames ({} bytes of file), dropped {}, per worker {:?}; \
         the workers counted {counted} frames meanwhile",
        summary.captured(),
        summary.bytes,
        summary.dropped(),
        summary.workers
    );
    assert_eq!(summary.workers.len(), o.workers);
    assert_eq!(summary.dropped(), 0, "a ring of 8192 slots kept up");
    if o.mode == DriveMode::Inline {
        // A capture starts and stops on a burst's edge, and the loops
        // run only when called: every frame counted is in the file.
        assert_eq!(summary.captured(), counted);
    } else {
        assert!(
            summary.captured() <= counted + 64,
            "{summary:?} / {counted}"
        );
    }
    check_file(&path, &summary);
    check_tshark(&path, label);
    // A second stop has nothing to stop; a new capture may start.
    assert!(matches!(
        p.a.capture_stop(),
        Err(Error::Capture(CaptureError::NotRunning))
    ));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn inline_capture_decodes_as_iwarp() {
    capture_and_decode(&PairOptions::default(), "inline");
}

#[test]
fn threads_two_workers_capture_decodes_as_iwarp() {
    capture_and_decode(
        &PairOptions {
            workers: 2,
            mode: DriveMode::Threads,
            ..PairOptions::default()
        },
        "threads",
    );
}

#[test]
fn a_tiny_ring_drops_and_counts_while_the_transfer_completes() {
    let p = Pair::new(&PairOptions {
        workers: 2,
        mode: DriveMode::Threads,
        ..PairOptions::default()
    });
    let path = temp("tiny");
    let opts = CaptureOptions {
        ring_slots: 2,
        ..CaptureOptions::default()
    };
    p.a.capture_start(&path, &opts).unwrap();
    let (mut a, mut b) = connect(&p);
    let mut verified = 0;
    for (i, op) in [Op::Write, Op::Read].into_iter().enumerate() {
        verified += exchange(&p, &mut a, &mut b, op, 4 << 20, i as u64 + 1);
    }
    let s = p.a.capture_stop().unwrap();
    println!(
        "tiny ring: {verified} bytes verified; captured {} frames, dropped {}, per worker {:?}",
        s.captured(),
        s.dropped(),
        s.workers
    );
    assert_eq!(verified, 8 << 20);
    assert!(s.dropped() > 0, "{s:?}");
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(Reader::read_all(&bytes).unwrap().len() as u64, s.captured());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_path_that_cannot_be_created_is_one_clear_error() {
    let p = Pair::new(&PairOptions::default());
    let e =
        p.a.capture_start(
            Path::new("/nonexistent-capture-dir/x.pcap"),
            &CaptureOptions::default(),
        )
        .unwrap_err();
    println!("{e}");
    assert!(
        e.to_string()
            .starts_with("cannot create capture file /nonexistent-capture-dir/x.pcap: "),
        "{e}"
    );
    assert!(!p.a.capturing());
}
