//! Where the siw captures are: the repository's test fixtures in
//! `deploy/interop/captures/` (see the README there). The capture tests
//! take their paths from here; a missing fixture fails the test that
//! needs it, naming the path.

#![allow(dead_code, reason = "each test file uses part of the helpers")]

use std::path::PathBuf;

/// The capture files the repository holds.
pub const CAPTURES: [&str; 10] = [
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
];

/// The capture folder; panics unless every file of [`CAPTURES`] is in it.
pub fn captures_dir() -> PathBuf {
    for name in CAPTURES {
        capture(name);
    }
    fixture_dir()
}

/// The path of capture `name`; panics if the file is not there.
pub fn capture(name: &str) -> PathBuf {
    let path = fixture_dir().join(name);
    assert!(
        path.is_file(),
        "siw capture fixture missing: {} (the repository's deploy/interop/captures)",
        path.display()
    );
    path
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/interop/captures")
}
