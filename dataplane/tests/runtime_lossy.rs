//! The same exchanges over a link that loses frames in both directions:
//! TCP recovers, the engines see an intact stream, every byte arrives and
//! every work request completes exactly once.

mod runtime_common;

use dataplane::api::DriveMode;
use dataplane::link::MemLinkConfig;
use runtime_common::*;

#[test]
fn two_percent_loss_each_way() {
    let p = Pair::new(&PairOptions {
        link: MemLinkConfig {
            loss: 0.02,
            seed: 0x5eed,
            ..MemLinkConfig::default()
        },
        mode: DriveMode::Threads,
        static_arp: true,
        ..PairOptions::default()
    });
    let (mut a, mut b) = connect(&p);
    let mut id = 1;
    let mut total = 0;
    for op in [Op::Write, Op::Read, Op::Send] {
        for len in [1, 5000, 1 << 20] {
            let n = exchange(&p, &mut a, &mut b, op, len, id);
            println!("lossy: {op:?} {len} B: {n} bytes verified");
            total += n;
            id += 1;
        }
    }
    a.drain();
    b.drain();
    assert_eq!(a.seen.len(), 9);
    assert_eq!(b.seen.len(), 3);
    let (sa, sb) = (p.a.stats()[0], p.b.stats()[0]);
    // Counters are published every millisecond.
    std::thread::sleep(std::time::Duration::from_millis(5));
    let retransmits = p.a.stats()[0].retransmits + p.b.stats()[0].retransmits;
    println!("lossy: {total} bytes verified; retransmits {retransmits}; a {sa:?}; b {sb:?}");
    assert!(retransmits > 0, "the link lost nothing?");
    assert_eq!(p.a.stats()[0].terminates + p.b.stats()[0].terminates, 0);
    // First transmissions took their TCP checksum's payload sum from the
    // record's CRC pass (the port offloads no checksum, the MPA CRC is on):
    // no payload byte was summed apart from it for them.
    let (sa, sb) = (p.a.stats()[0], p.b.stats()[0]);
    let summed = sa.tx_summed_bytes + sb.tx_summed_bytes;
    println!("lossy: payload bytes summed apart from the CRC pass: {summed}");
    assert_eq!(summed, 0);
    // Retransmissions summed their payload again from memory (a buffer
    // the application changed meanwhile must not go out under the old
    // sum); the buffers were left alone, so no sum differed.
    let resummed = sa.tx_resummed_bytes + sb.tx_resummed_bytes;
    let changed = sa.tx_payload_changed + sb.tx_payload_changed;
    println!(
        "lossy: payload bytes summed again for retransmissions: {resummed}; changed: {changed}"
    );
    assert!(resummed > 0, "retransmissions re-summed nothing");
    assert_eq!(changed, 0);
    // Received FPDUs had their CRC taken in the read that verified the
    // TCP checksum (each arrives whole in its segment; those that came
    // out of order were read again, as before). The port gives no
    // checksum verdicts, and the pass's own are not counted as the
    // port's.
    let in_pass = sa.rx_crc_in_pass + sb.rx_crc_in_pass;
    println!("lossy: FPDU CRCs taken with the checksum: {in_pass}");
    assert!(
        in_pass > total as u64 / 2 / 1500,
        "{in_pass} FPDU CRCs in the receive pass for {total} bytes"
    );
    assert_eq!(sa.rx_cksum_trusted + sb.rx_cksum_trusted, 0);
}

/// The named counter of one end of the link.
fn link_counter(l: &dataplane::link::MemLinkStatsHandle, name: &str) -> u64 {
    use dataplane::link::LinkStats;
    l.read()
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |&(_, v)| v)
}

/// Trains of whole FPDUs (TCP segmentation offload) over a link that cuts
/// them as a NIC does and then loses segments of them: the lost records
/// go again one per segment, every byte arrives, every request completes
/// once, and no segment either side received ended inside an FPDU.
/// Payload attached (the port takes chains) and copied (it does not: the
/// copy is the pass that computes the MPA CRC).
#[test]
fn trains_cut_by_the_port_with_loss_each_way() {
    for (loss, attach) in [(0.0, true), (0.02, true), (0.02, false)] {
        let o = PairOptions {
            link: MemLinkConfig {
                loss,
                seed: 0x75e0,
                tso: true,
                multi_seg_tx: attach,
                ..MemLinkConfig::default()
            },
            mode: DriveMode::Threads,
            static_arp: true,
            ..PairOptions::default()
        };
        let (p, links) = Pair::with_link_counters(&o, |_, _| {});
        let (mut a, mut b) = connect(&p);
        let mut id = 1;
        let mut total = 0;
        for op in [Op::Write, Op::Read, Op::Send] {
            for len in [1, 5000, 1 << 20] {
                total += exchange(&p, &mut a, &mut b, op, len, id);
                id += 1;
            }
        }
        a.drain();
        b.drain();
        assert_eq!(a.seen.len(), 9, "loss {loss}, attach {attach}");
        assert_eq!(b.seen.len(), 3, "loss {loss}, attach {attach}");
        // Counters are published every millisecond.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (sa, sb) = (p.a.stats()[0], p.b.stats()[0]);
        let sum = |name| link_counter(&links[0], name) + link_counter(&links[1], name);
        let (trains, cut) = (sum("tso_frames"), sum("tso_segments"));
        let retransmits = sa.retransmits + sb.retransmits;
        let fused = sa.tx_fused_frames + sb.tx_fused_frames;
        println!(
            "loss {loss}, attach {attach}: {total} bytes verified; {trains} trains cut into \
             {cut} segments; {fused} records copied in the CRC pass; retransmits {retransmits}"
        );
        if !attach {
            assert!(fused > cut / 2, "{fused} records fused of {cut} segments");
        }
        assert!(
            trains > 50 && cut > 4 * trains,
            "{trains} trains, {cut} segments"
        );
        assert_eq!(sa.rx_segments_mid_fpdu + sb.rx_segments_mid_fpdu, 0);
        assert_eq!(sa.terminates + sb.terminates, 0);
        if loss > 0.0 {
            assert!(retransmits > 0, "the link lost nothing?");
        }
    }
}
