//! Trains cut by the worker (`tcp.segmentation_offload` on a port without
//! the offload): TCP hands out runs of whole FPDUs under one header and
//! the worker cuts them into one frame per FPDU, headers and TCP
//! checksums its own. Large WRITEs, READs and SENDs over an in-memory
//! link without segmentation offload, payload copied into the frame or
//! attached, over a clean link and one that loses frames each way: every
//! byte arrives where it belongs, trains were cut, no segment ends inside
//! an FPDU (hardware peers stay aligned), and on the clean link nothing
//! is dropped and next to nothing retransmitted (a wrong checksum would
//! have the receiver drop the segment). With the switch off, no train is
//! cut.

mod runtime_common;

use dataplane::api::DriveMode;
use dataplane::link::MemLinkConfig;
use runtime_common::*;

#[test]
fn trains_are_cut_into_whole_fpdus_with_and_without_loss() {
    for (loss, attach, trains) in [
        (0.0, false, true),
        (0.0, true, true),
        (0.0, false, false),
        (0.02, false, true),
        (0.02, true, true),
    ] {
        let o = PairOptions {
            link: MemLinkConfig {
                loss,
                seed: 0x7a11,
                multi_seg_tx: attach,
                tso: false,
                ..MemLinkConfig::default()
            },
            mode: DriveMode::Threads,
            static_arp: true,
            ..PairOptions::default()
        };
        let p = Pair::with_configs(&o, |c, _| c.tcp.segmentation_offload = trains);
        let (mut a, mut b) = connect(&p);
        let mut total = 0;
        for (k, op) in [Op::Write, Op::Read, Op::Send].into_iter().enumerate() {
            for i in 0..4u64 {
                let len = 256 * 1024 + 1000 * i as usize + 3;
                total += exchange(&p, &mut a, &mut b, op, len, 1 + 10 * k as u64 + i);
            }
        }
        // Counters are published every millisecond.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (sa, sb) = (p.a.stats()[0], p.b.stats()[0]);
        let cut = sa.tx_cut_trains + sb.tx_cut_trains;
        let retransmits = sa.retransmits + sb.retransmits;
        println!(
            "loss {loss}, attach {attach}, trains {trains}: {total} bytes verified; {cut} \
             trains cut into {} + {} frames; retransmits {retransmits}",
            sa.tx_packets, sb.tx_packets
        );
        if trains {
            // Both directions carry data (READ responses come from b).
            assert!(sa.tx_cut_trains > 10, "{} trains from a", sa.tx_cut_trains);
            assert!(sb.tx_cut_trains > 2, "{} trains from b", sb.tx_cut_trains);
        } else {
            assert_eq!(cut, 0, "segmentation offload is off");
        }
        assert_eq!(sa.rx_segments_mid_fpdu + sb.rx_segments_mid_fpdu, 0);
        assert_eq!(sa.terminates + sb.terminates, 0);
        if loss > 0.0 {
            assert!(retransmits > 0, "the link lost nothing?");
        } else {
            // A wrong checksum or sequence number in cut frames would have
            // the receiver drop them, and most would be sent again. A
            // probe or timeout fired while a thread waited for a core on
            // a loaded machine resends one or two: allowed, rarely.
            assert_eq!(sa.drops + sb.drops, 0, "a clean link drops nothing");
            let frames = sa.tx_packets + sb.tx_packets;
            assert!(
                retransmits * 100 <= frames,
                "{retransmits} retransmissions of {frames} frames on a clean link"
            );
        }
    }
}
