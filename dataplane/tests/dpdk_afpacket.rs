//! Two dataplane processes over `net_af_packet` on a veth pair whose ends
//! sit in two network namespaces: RDMA WRITE, READ and SEND between them,
//! verified byte for byte (the exchange of `exchange_common`). The port
//! takes mbuf chains, so payload goes by reference and nothing is copied
//! for want of multi-segment transmit.

mod exchange_common;
mod netns_common;
mod runtime_common;

use dataplane::api::Dataplane;
use exchange_common::{run, Exchange};

fn nothing_copied(side: &str, dp: &Dataplane) {
    let stats = dp.stats();
    let copied: u64 = stats.iter().map(|s| s.tx_copied_frames).sum();
    assert_eq!(copied, 0, "{side}: frames copied on a multi-segment port");
}

#[test]
fn afpacket_two_processes_write_read_send() {
    run(&Exchange {
        test: "afpacket_two_processes_write_read_send",
        pmd: "net_af_packet",
        device: |iface| format!("net_af_packet0,iface={iface}"),
        attach: None,
        configure: None,
        check: nothing_copied,
    });
}
