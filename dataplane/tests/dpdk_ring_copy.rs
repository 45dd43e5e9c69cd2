//! A `net_ring` pair told not to attach payload (`attach_payload: false`,
//! as `iwarp demo` runs it): every frame leaves as one buffer with the
//! payload copied in, so nothing is attached on transmit and nothing needs
//! linearizing on receive, and WRITE, READ and SEND from 1 byte to 1 MiB
//! still arrive byte for byte.

mod dpdk_common;
mod runtime_common;

use std::sync::atomic::Ordering;

use dataplane::api::{Dataplane, DriveMode};
use dataplane::dpdk_link::{DpdkLink, DpdkLinkOptions};
use dataplane::link::Link;
use dpdk_common::*;
use runtime_common::*;

const SIZES: [usize; 5] = [1, 4097, 65_536, 100_003, 1 << 20];

#[test]
fn ring_pair_without_attached_payload_copies_into_single_buffers() {
    let (guard, eal) = start("dpdk-ring-copy", 256);
    {
        let opts = DpdkLinkOptions {
            attach_payload: false,
            ..DpdkLinkOptions::default()
        };
        let (la, lb) = DpdkLink::ring_pair(&eal, "cp", &opts, (Some(MAC_A), Some(MAC_B)))
            .expect("ring pair links");
        assert!(la.setup().multi_seg_tx(), "net_ring chains segments");
        assert!(
            !la.caps().multi_seg_tx,
            "the workers are told to copy payload"
        );
        let (sa, sb) = (la.stats(), lb.stats());
        let open = |ip, mac, peer, link| {
            Dataplane::open_with_link(
                &config(ip, mac, peer, 1500, 1, false),
                link,
                DriveMode::Threads,
            )
            .expect("open")
        };
        let p = Pair {
            a: open(IP_A, MAC_A, (IP_B, MAC_B), la),
            b: open(IP_B, MAC_B, (IP_A, MAC_A), lb),
        };
        let (mut a, mut b) = connect(&p);
        let mut id = 1;
        let mut total = 0;
        for op in [Op::Write, Op::Read, Op::Send] {
            for len in SIZES {
                total += exchange(&p, &mut a, &mut b, op, len, id);
                id += 1;
            }
        }
        let sent = p.a.stats()[0].tx_packets + p.b.stats()[0].tx_packets;
        let attached =
            sa.tx_attached.load(Ordering::Relaxed) + sb.tx_attached.load(Ordering::Relaxed);
        let linearized =
            sa.rx_linearized.load(Ordering::Relaxed) + sb.rx_linearized.load(Ordering::Relaxed);
        println!(
            "net_ring, payload copied: {total} bytes verified in {sent} frames, {attached} \
             attached, {linearized} linearized"
        );
        assert!(sent > 2000, "only {sent} frames went out");
        assert_eq!(attached, 0, "payload was attached");
        assert_eq!(linearized, 0, "a frame arrived as a chain");
        assert_eq!(sa.rx_dropped.load(Ordering::Relaxed), 0);
        assert_eq!(sb.rx_dropped.load(Ordering::Relaxed), 0);
        p.a.disconnect(&a.qp, true).unwrap();
        drop(p);
    }
    drop(eal);
    assert_clean(&guard);
}
