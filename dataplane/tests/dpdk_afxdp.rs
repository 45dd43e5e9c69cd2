//! Two dataplane processes over DPDK's `net_af_xdp` on a veth pair whose
//! ends sit in two network namespaces: RDMA WRITE, READ and SEND of up to
//! 4 MiB between them, verified byte for byte (the exchange of
//! `exchange_common`).
//!
//! DPDK 22.11's af_xdp sends only the first segment of an mbuf chain and
//! does not offer multi-segment transmit, so the runtime copies each
//! frame's payload into one mbuf instead of attaching registered memory
//! by reference. This is the only test on such a port: it checks that
//! the copy path carried the data (the workers' `tx_copied_frames`), with
//! at least one copied frame per MTU of payload each side sent.
//!
//! Each child ends with its EAL runtime directory still there (see
//! [`EAL_KEPT`]); the harness removes it and checks that it did.
//!
//! One queue per veth end (a veth has one by default; af_xdp binds queue
//! 0); libxdp loads its XDP program without a dispatcher when the
//! namespace has no bpffs, which works. Needs root (prints a skip notice
//! without it, or fails with `IWARP_REQUIRE_ROOT_TESTS=1`).

mod exchange_common;
mod netns_common;

use dataplane::worker::WorkerStats;
use exchange_common::{run, total, Exchange};

/// Payload bytes one frame carries at most (MTU 1500 less the IP and TCP
/// headers): a bound on the frames any payload needs.
const MAX_PAYLOAD: usize = 1460;

/// The client's WRITE and SEND payloads and the server's READ responses
/// all went out through the copy path.
fn copied_everything(side: &str, stats: &[WorkerStats]) {
    let copied: u64 = stats.iter().map(|s| s.tx_copied_frames).sum();
    let sent: u64 = stats.iter().map(|s| s.tx_packets).sum();
    // The client sends WRITE and SEND payloads, the server READ responses.
    let payload = if side == "client" {
        2 * total()
    } else {
        total()
    };
    let least = payload.div_ceil(MAX_PAYLOAD) as u64;
    println!(
        "{side}: {copied} of {sent} frames sent with their payload copied into one mbuf \
         (at least {least} needed for {payload} payload bytes)"
    );
    assert!(
        copied >= least,
        "{side}: {copied} frames copied, {payload} bytes of payload need at least {least}"
    );
    assert!(copied <= sent, "{side}: more frames copied than sent");
}

/// Why each child leaves its EAL runtime directory behind. In DPDK
/// 22.11, with a kernel that takes unaligned UMEM chunks, net_af_xdp uses
/// the port's mbuf pool as its UMEM and parks mbufs in the fill ring; on
/// close it deletes the socket and the UMEM but never returns those mbufs
/// to the pool (2049 mbufs still counted in use when the port's pool is
/// released, measured here). `dpdk-bindings` then finds the pool in use and keeps
/// it, and EAL under it, for the rest of the process (freeing it could
/// leave an outstanding mbuf pointing into freed memory), so EAL is never
/// cleaned up and its runtime directory stays.
const EAL_KEPT: &str = "net_af_xdp never returns its fill-ring mbufs to the pool at close, \
                        so the pool and EAL are kept";

#[test]
fn afxdp_two_processes_write_read_send() {
    run(&Exchange {
        test: "afxdp_two_processes_write_read_send",
        pmd: "net_af_xdp",
        device: |iface| format!("net_af_xdp0,iface={iface},start_queue=0,queue_count=1"),
        check: copied_everything,
        eal_kept: Some(EAL_KEPT),
    });
}
