//! Packet capture on a DPDK port: two dataplanes of two workers each over
//! a two-queue `net_ring` pair (no steering, so a connection's frames
//! cross two workers through the software dispatcher, and the capture
//! merges both workers' rings), a capture on one started before the
//! connection, WRITE, READ and SEND with the MPA CRC on (payload attached
//! to the mbuf chains from registered memory, read back through the
//! records for the capture); the file read back and decoded by tshark as
//! iWARP with nothing malformed. (Whether EAL cleans up after itself is
//! the business of the other DPDK tests; the guard removes its runtime
//! directory here either way.)

mod capture_common;
mod dpdk_common;
mod runtime_common;

use capture_common::*;
use dataplane::capture::CaptureOptions;
use dpdk_common::*;

#[test]
fn capture_over_a_net_ring_pair_decodes_as_iwarp() {
    let (guard, eal) = start("dpdk-capture", 256);
    {
        let (p, _, _) = ring_pair(&eal, 1500, 2);
        let path = temp("net-ring");
        let (summary, counted) = run_captured(&p, &path, &CaptureOptions::default());
        println!(
            "net_ring: captured {} frames ({} bytes of file), dropped {}, per worker {:?}; \
             the workers counted {counted} frames meanwhile",
            summary.captured(),
            summary.bytes,
            summary.dropped(),
            summary.workers
        );
        assert_eq!(summary.dropped(), 0);
        assert!(
            summary.workers.iter().all(|w| w.captured > 0),
            "both workers saw the connection's frames: {summary:?}"
        );
        let frames = check_file(&path, &summary);
        let iwarp = check_tshark(&path, "net_ring");
        println!("net_ring: {frames} frames in the file, {iwarp:?} decoded as iWARP");
        let _ = std::fs::remove_file(&path);
        drop(p);
    }
    drop(eal);
    drop(guard);
}
