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
//! Each child must remove its EAL runtime directory itself. In DPDK 22.11
//! net_af_xdp uses the port's mbuf pool as its packet memory and parks
//! mbufs in the fill ring, which close abandons (2049 counted in use when
//! the pool was released, before `dpdk-bindings` credited them): the pool,
//! and EAL with it, were kept and the directory stayed. The harness checks
//! that the directory is gone before its own clean-up could remove it.
//!
//! One queue per veth end (a veth has one by default; af_xdp binds queue
//! 0); libxdp loads its XDP program without a dispatcher when the
//! namespace has no bpffs, which works. Needs root (prints a skip notice
//! without it, or fails with `IWARP_REQUIRE_ROOT_TESTS=1`).

mod exchange_common;
mod netns_common;
mod runtime_common;

use dataplane::api::Dataplane;
use exchange_common::{run, total, Exchange};

/// Payload bytes one frame carries at most (MTU 1500 less the IP and TCP
/// headers): a bound on the frames any payload needs.
const MAX_PAYLOAD: usize = 1460;

/// The client's WRITE and SEND payloads and the server's READ responses
/// all went out through the copy path.
fn copied_everything(side: &str, dp: &Dataplane) {
    let stats = dp.stats();
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

#[test]
fn afxdp_two_processes_write_read_send() {
    run(&Exchange {
        test: "afxdp_two_processes_write_read_send",
        pmd: "net_af_xdp",
        device: |iface| format!("net_af_xdp0,iface={iface},start_queue=0,queue_count=1"),
        attach: None,
        configure: None,
        check: copied_everything,
    });
}
