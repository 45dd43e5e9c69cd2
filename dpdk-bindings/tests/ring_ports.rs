//! Ports over `net_ring`: a looped-back vdev and a back-to-back pair in one
//! process, bursts received byte for byte, a multi-segment chain whose
//! payload is attached from registered user memory, and the release of that
//! memory observed when the receiver frees the chain.

mod common;

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use dpdk_bindings::{
    AttachError, Eal, ExtBufPool, ExtMem, MbufBurst, Mempool, Port, PortConfig, RxQueue, TxQueue,
    BURST,
};

#[test]
fn ring_ports_bursts_and_external_buffers() {
    let (guard, eal) = common::start("ring", &["net_ring0"]);
    let pool = Mempool::new(&eal, "ring_pool", 2047, 64, 2176, -1).expect("pool");

    loopback_vdev(&eal, &pool);
    counters_after_close(&eal, &pool);
    let (mut a, mut b) = Port::ring_pair(&eal, "rp", 2, 256).expect("ring pair");
    let info = a.dev_info().unwrap();
    assert_eq!(info.driver_name, "net_ring");
    assert!(info.multi_seg_tx(), "net_ring advertises multi-segment TX");
    let conf = PortConfig {
        rx_queues: 2,
        tx_queues: 2,
        ..PortConfig::default()
    };
    let conf = PortConfig {
        mtu: Some(9000),
        ..conf
    };
    let setup_a = a.configure(&conf, &pool).expect("configure a");
    b.configure(&conf, &pool).expect("configure b");
    assert!(setup_a.multi_seg_tx());
    assert_eq!(setup_a.rss_hf, 0, "net_ring has no RSS: none granted");
    assert!(!setup_a.tx_tcp_cksum());
    assert!(a.reta_query().is_err(), "no redirection table on net_ring");
    let err = a.rss_hash_conf_get().unwrap_err();
    assert_eq!(err.errno(), libc::ENOTSUP, "no RSS on net_ring: {err}");
    a.start().unwrap();
    b.start().unwrap();
    assert!(a.link_up() && b.link_up());
    // A ring pair's ports have an all-zero MAC and refuse another: the
    // dataplane answers for the MAC its configuration gives.
    assert_eq!(a.mac_addr().unwrap(), [0; 6]);
    let err = a.set_mac_addr([2, 0, 0, 0, 0, 0xa]).unwrap_err();
    assert_eq!(err.errno(), libc::ENOTSUP);

    let mut a_rx: Vec<RxQueue> = (0..2).map(|q| a.rx_queue(q).unwrap()).collect();
    let mut a_tx: Vec<TxQueue> = (0..2).map(|q| a.tx_queue(q).unwrap()).collect();
    let mut b_rx: Vec<RxQueue> = (0..2).map(|q| b.rx_queue(q).unwrap()).collect();
    let mut b_tx: Vec<TxQueue> = (0..2).map(|q| b.tx_queue(q).unwrap()).collect();
    assert!(a.rx_queue(0).is_err(), "a queue is handed out once");
    assert!(a.stop().is_err(), "no stop while queues are out");

    // A → B on queue 0, B → A on queue 1: byte for byte, in order.
    let mut bytes = exchange(&pool, &mut a_tx[0], &mut b_rx[0], 0xa0);
    bytes += exchange(&pool, &mut b_tx[1], &mut a_rx[1], 0xb1);
    let mut empty = MbufBurst::new();
    assert_eq!(
        a_rx[0].rx_burst(&mut empty) + b_rx[1].rx_burst(&mut empty),
        0
    );
    println!("ring pair: verified {bytes} bytes in bursts of {BURST}");

    external_payload_chain(&eal, &pool, &mut a, &mut a_tx[0], &mut b_rx[0]);
    jumbo_chain(&pool, &mut b_tx[0], &mut a_rx[0]);
    tx_backpressure(&pool, &mut a_tx[1], &mut b_rx[1]);

    let stats = a.stats().unwrap();
    assert!(stats.opackets >= 2 * BURST as u64, "{stats:?}");
    device_counters(&mut a, &b);

    drop((a_rx, a_tx, b_rx, b_tx));
    a.stop().unwrap();
    drop((a, b));
    assert_eq!(pool.in_use_count(), 0, "no mbuf leaked");
    // The pair's vdevs were removed: the name can be used again.
    let again = Port::ring_pair(&eal, "rp", 1, 64).expect("ring pair again");
    drop(again);

    let runtime_dir = guard.0.clone();
    drop(pool);
    drop(eal);
    assert!(!runtime_dir.exists(), "EAL cleanup removes its runtime dir");
}

/// The ports' counters read from another thread through a
/// [`dpdk_bindings::PortCounters`]: what A sent, B received, nothing was
/// missed or in error, and the extended counters agree with the basic ones.
fn device_counters(a: &mut Port, b: &Port) {
    let (ca, cb) = (a.counters(), b.counters());
    assert!(a.stop().is_err(), "no stop while a counters handle is out");
    let (sa, sb, xa, name, driver) = std::thread::spawn(move || {
        (
            ca.stats().unwrap(),
            cb.stats().unwrap(),
            ca.xstats().unwrap(),
            ca.name().unwrap(),
            ca.driver_name().unwrap(),
        )
    })
    .join()
    .expect("reader thread");
    println!("ring pair: {name} ({driver}) {sa:?}; peer {sb:?}");
    assert_eq!(name, a.name().unwrap());
    assert_eq!(name, "net_ring_rp_a");
    assert_eq!(driver, "net_ring");
    assert!(sa.opackets > 0 && sa.ipackets > 0, "{sa:?}");
    // Over a ring pair each frame one port sends, the other receives
    // (the rings were large enough for every burst but the backpressure
    // one, whose refused frames neither port counts).
    assert_eq!(sa.opackets, sb.ipackets, "a {sa:?} b {sb:?}");
    assert_eq!(sb.opackets, sa.ipackets, "a {sa:?} b {sb:?}");
    assert_eq!(
        (sa.imissed, sa.ierrors, sa.rx_nombuf, sb.imissed, sb.ierrors),
        (0, 0, 0, 0, 0)
    );
    let x = |n: &str| {
        xa.iter()
            .find(|s| s.name == n)
            .map(|s| s.value)
            .unwrap_or_else(|| panic!("no xstat {n}: {xa:?}"))
    };
    assert_eq!(x("rx_good_packets"), sa.ipackets);
    assert_eq!(x("tx_good_packets"), sa.opackets);
    assert_eq!(x("rx_q0_packets") + x("rx_q1_packets"), sa.ipackets);
    println!("ring pair: {} extended counters, all named", xa.len());
    assert!(xa.iter().all(|s| !s.name.is_empty()));
}

/// A counters handle outlives its port without keeping it open: reads
/// then fail with `ENODEV`.
fn counters_after_close(eal: &Eal, pool: &Mempool) {
    let (mut c, d) = Port::ring_pair(eal, "rc", 1, 64).expect("ring pair");
    c.configure(&PortConfig::default(), pool).unwrap();
    c.start().unwrap();
    let counters = c.counters();
    assert_eq!(
        counters.stats().unwrap(),
        Default::default(),
        "nothing sent yet"
    );
    assert!(counters.xstats().is_ok());
    drop((c, d));
    let e = counters.stats().unwrap_err();
    assert_eq!(e.errno(), libc::ENODEV, "{e}");
    assert_eq!(counters.xstats().unwrap_err().errno(), libc::ENODEV);
}

/// A `--vdev=net_ring0` port loops back: what it sends, it receives.
fn loopback_vdev(eal: &Eal, pool: &Mempool) {
    let mut port = Port::by_name(eal, "net_ring0").expect("net_ring0 from --vdev");
    assert!(Port::from_id(eal, port.id()).is_err(), "one owner per port");
    assert!(Port::available(eal).contains(&port.id()));
    port.configure(&PortConfig::default(), pool).unwrap();
    port.start().unwrap();
    let mut rx = port.rx_queue(0).unwrap();
    let mut tx = port.tx_queue(0).unwrap();
    let bytes = exchange(pool, &mut tx, &mut rx, 0x10);
    println!("net_ring0 loopback: verified {bytes} bytes");
}

/// An Ethernet frame whose every byte depends on `seed` and `i`.
fn frame(seed: u8, i: usize) -> Vec<u8> {
    let len = 60 + (i * 37) % 1400;
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    for (k, b) in f[14..].iter_mut().enumerate() {
        *b = seed ^ (k as u8).wrapping_mul(31) ^ i as u8;
    }
    f
}

/// Sends a full burst of distinct frames and checks that they arrive
/// intact and in order; returns the bytes verified.
fn exchange(pool: &Mempool, tx: &mut TxQueue, rx: &mut RxQueue, seed: u8) -> usize {
    let mut out = MbufBurst::new();
    for i in 0..BURST {
        let mut m = pool.alloc().unwrap();
        let f = frame(seed, i);
        m.append(f.len()).unwrap().copy_from_slice(&f);
        out.push(m).unwrap();
    }
    assert_eq!(tx.tx_burst(&mut out), BURST);
    assert!(out.is_empty());
    let mut got = MbufBurst::new();
    assert_eq!(rx.rx_burst(&mut got), BURST);
    let mut bytes = 0;
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.data(), frame(seed, i), "frame {i}");
        bytes += m.len();
    }
    bytes
}

/// Header mbuf + payload attached from registered user memory + trailer
/// mbuf, sent as one chain; the receiver sees the bytes, and the slot's
/// release is observed only once the receiver frees the chain.
fn external_payload_chain(
    eal: &Eal,
    pool: &Mempool,
    port: &mut Port,
    tx: &mut TxQueue,
    rx: &mut RxQueue,
) {
    const PAGE: usize = 4096;
    const REGION: usize = 4 * PAGE;
    let layout = Layout::from_size_align(REGION, PAGE).unwrap();
    // SAFETY: non-zero size; freed below after the registration is gone.
    let base = NonNull::new(unsafe { alloc_zeroed(layout) }).expect("region");
    // SAFETY: `base` is REGION bytes we own.
    let region = unsafe { std::slice::from_raw_parts_mut(base.as_ptr(), REGION) };
    for (i, b) in region.iter_mut().enumerate() {
        *b = (i * 7 + i / 251) as u8;
    }

    // SAFETY: page-aligned, a whole number of pages, alive until `mem` drops.
    let mem = unsafe { ExtMem::register(eal, base, REGION, PAGE) }.expect("extmem");
    assert!(dpdk_bindings::is_external_memory(eal, base.as_ptr()));
    assert_eq!(ExtMem::live(), 1);
    // The vdev bus accepts the mapping as a no-op.
    assert!(mem.dma_map(port).expect("dma map"));
    let third = base.as_ptr().wrapping_add(2 * PAGE + 5);
    assert_eq!(
        dpdk_bindings::iova_of(eal, third),
        Some(third as u64),
        "EAL's IOVA for the memory is the one registered"
    );
    assert_eq!(
        mem.contiguous(third, REGION),
        Some((third as u64, REGION - 2 * PAGE - 5)),
        "contiguous to the region's end"
    );
    let shinfos = ExtBufPool::new(4);

    // A payload that crosses a page boundary (IOVA-contiguous with VA).
    let (off, len) = (PAGE - 1000, 3000usize);
    let payload = NonNull::new(base.as_ptr().wrapping_add(off)).unwrap();
    let iova = mem.iova(payload.as_ptr(), len).expect("contiguous");
    assert_eq!(iova, payload.as_ptr() as u64, "IOVA-as-VA");
    assert!(
        mem.iova(base.as_ptr(), REGION + 1).is_none(),
        "outside the region"
    );

    let header: Vec<u8> = frame(0x55, 0)[..54].to_vec();
    let trailer = [0xde, 0xad, 0xbe, 0xef];
    let slot = shinfos.acquire().expect("slot");
    let mut head = pool.alloc().unwrap();
    head.append(header.len()).unwrap().copy_from_slice(&header);
    let mut body = pool.alloc().unwrap();
    // SAFETY: the range is inside the registered region, which is neither
    // written nor freed until the slot reports its release below.
    unsafe { body.attach_extbuf(payload, iova, len as u16, &slot) }.expect("attach");
    assert!(body.has_extbuf());
    assert!(body.append(4).is_none(), "external data is never written");
    assert!(body.data_mut().is_none());
    assert!(slot.is_in_flight());
    // One attachment per slot at a time.
    let mut other = pool.alloc().unwrap();
    // SAFETY: as above (and the call fails before touching anything).
    let busy = unsafe { other.attach_extbuf(payload, iova, 16, &slot) };
    assert_eq!(busy, Err(AttachError::SlotBusy));
    // Only an empty mbuf takes an external buffer.
    let slot2 = shinfos.acquire().unwrap();
    // SAFETY: as above.
    let not_empty = unsafe { head.attach_extbuf(payload, iova, 16, &slot2) };
    assert_eq!(not_empty, Err(AttachError::NotEmpty));
    assert!(!slot2.is_in_flight());
    drop(other);

    let mut tail = pool.alloc().unwrap();
    tail.append(4).unwrap().copy_from_slice(&trailer);
    head.chain(body).unwrap();
    head.chain(tail).unwrap();
    assert_eq!(head.nb_segs(), 3);

    let mut expected = header.clone();
    expected.extend_from_slice(&region[off..off + len]);
    expected.extend_from_slice(&trailer);
    assert_eq!(head.len(), expected.len());

    let mut burst = MbufBurst::new();
    burst.push(head).unwrap();
    assert_eq!(tx.tx_burst(&mut burst), 1);
    assert!(slot.is_in_flight(), "sent, but not yet freed by anyone");

    let mut got = MbufBurst::new();
    assert_eq!(rx.rx_burst(&mut got), 1);
    let m = got.pop().unwrap();
    assert_eq!(m.nb_segs(), 3);
    let mut received = vec![0u8; m.len()];
    assert_eq!(m.read(0, &mut received), expected.len());
    assert_eq!(received, expected, "chain received byte for byte");
    let segs: Vec<usize> = m.segments().map(<[u8]>::len).collect();
    assert_eq!(segs, [54, len, 4]);
    assert!(slot.is_in_flight());
    assert_eq!(slot.releases(), 0);

    drop(m);
    assert!(!slot.is_in_flight(), "released when the chain was freed");
    assert_eq!(slot.releases(), 1);
    assert_eq!(shinfos.released_total(), 1);
    println!(
        "external buffer: verified {} bytes (54 header + {len} attached + 4 trailer), release observed",
        expected.len()
    );

    // The slot can carry the next attachment.
    let mut again = pool.alloc().unwrap();
    // SAFETY: as above.
    unsafe { again.attach_extbuf(payload, iova, 100, &slot) }.expect("slot reusable");
    // A handle dropped while its attachment is in flight: the pool lives on
    // until the release, which is still counted.
    drop(slot);
    drop(slot2);
    assert_eq!(again.data(), &region[off..off + 100]);
    drop(again);
    assert_eq!(shinfos.released_total(), 2);
    let held: Vec<_> = std::iter::from_fn(|| shinfos.acquire()).collect();
    assert_eq!(held.len(), 4, "every slot free again");
    drop(held);

    drop(mem);
    assert!(!dpdk_bindings::is_external_memory(eal, base.as_ptr()));
    assert_eq!(ExtMem::live(), 0, "unregistered on drop");
    // SAFETY: allocated above with `layout`; no mbuf refers to it any more.
    unsafe { dealloc(base.as_ptr(), layout) };
}

/// A 9014-byte frame (MTU 9000) as a chain of 2048-byte mbufs arrives
/// whole: what the jumbo-frame tests over net_ring rely on.
fn jumbo_chain(pool: &Mempool, tx: &mut TxQueue, rx: &mut RxQueue) {
    let frame: Vec<u8> = (0..9014usize).map(|i| (i ^ (i >> 8)) as u8).collect();
    let mut chunks = frame.chunks(2048);
    let mut head = pool.alloc().unwrap();
    let first = chunks.next().unwrap();
    head.append(first.len()).unwrap().copy_from_slice(first);
    for chunk in chunks {
        let mut seg = pool.alloc().unwrap();
        seg.append(chunk.len()).unwrap().copy_from_slice(chunk);
        head.chain(seg).unwrap();
    }
    assert_eq!(head.nb_segs(), 5);
    let mut burst = MbufBurst::new();
    burst.push(head).unwrap();
    assert_eq!(tx.tx_burst(&mut burst), 1);
    assert_eq!(rx.rx_burst(&mut burst), 1);
    let m = burst.get(0).unwrap();
    let mut got = vec![0u8; m.len()];
    m.read(0, &mut got);
    assert_eq!(got, frame);
    println!(
        "jumbo: verified {} bytes in {} segments",
        got.len(),
        m.nb_segs()
    );
}

/// A TX ring with room for fewer than a burst: the device takes what fits,
/// the rest stays in the caller's burst, in order, and is freed with it.
fn tx_backpressure(pool: &Mempool, tx: &mut TxQueue, rx: &mut RxQueue) {
    // The 256-slot ring holds 255: eight bursts of 32 offered, without
    // receiving in between.
    let mut seq = 0u32;
    let mut sent = 0;
    let mut out = MbufBurst::new();
    for _ in 0..8 {
        while !out.is_full() {
            let mut m = pool.alloc().unwrap();
            m.append(60).unwrap()[..4].copy_from_slice(&seq.to_be_bytes());
            seq += 1;
            out.push(m).unwrap();
        }
        sent += tx.tx_burst(&mut out);
    }
    assert_eq!(sent, 255, "a ring of 256 holds 255");
    assert_eq!(out.len(), 1, "the unsent mbuf stays with the caller");
    assert_eq!(out.get(0).unwrap().data()[..4], 255u32.to_be_bytes());
    // Retrying after the receiver drained the ring sends it.
    let mut got = MbufBurst::new();
    let mut received = 0u32;
    while rx.rx_burst(&mut got) > 0 {
        for m in got.drain() {
            assert_eq!(m.data()[..4], received.to_be_bytes(), "in order");
            received += 1;
        }
    }
    assert_eq!(received, 255);
    assert_eq!(tx.tx_burst(&mut out), 1);
    assert_eq!(rx.rx_burst(&mut got), 1);
    assert_eq!(got.get(0).unwrap().data()[..4], 255u32.to_be_bytes());
    println!("TX backpressure: 255 of 256 taken, the last kept by the caller and sent on retry");
}
