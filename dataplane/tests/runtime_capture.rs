//! Packet capture of a running dataplane: two dataplanes over an
//! in-memory link, a capture started on one before the connection, RDMA
//! WRITE, READ and SEND with the MPA CRC on, then the file checked two
//! ways: read back with `pcap_kit` (the TCP handshake, the MPA
//! request and reply, well-formed FPDUs in both directions, every frame
//! the worker counted) and, where `tshark` is installed, decoded by
//! Wireshark as iWARP with no malformed frame and no bad CRC. A capture
//! with a tiny ring drops frames (counted) while the transfer completes.

mod capture_common;
mod runtime_common;

use std::path::Path;

use capture_common::*;
use dataplane::api::{DriveMode, Error};
use dataplane::capture::{CaptureError, CaptureOptions};
use pcap_kit::Reader;
use runtime_common::*;

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
