//! EAL start-up and shutdown, pools and mbufs, lcore registration and mbuf
//! rings, in one process (EAL starts once per process; see common/mod.rs).

mod common;

use dpdk_bindings::{
    lcore_id, toeplitz, tsc, Eal, Mbuf, MbufBurst, MbufRing, Mempool, Port, PortConfig, BURST,
};

#[test]
fn eal_pool_mbuf_ring_lifecycle() {
    let cpus_before = allowed_cpus();
    let (guard, eal) = common::start("lifecycle", &["net_null0"]);
    // EAL pins the thread that starts it to lcore 0 ("-l 0"); the thread
    // gets its CPUs back, or every thread it starts would share one core.
    assert_eq!(
        allowed_cpus(),
        cpus_before,
        "the thread that started EAL keeps the CPUs it had"
    );
    let runtime_dir = eal
        .runtime_dir()
        .expect("EAL reports its runtime dir")
        .to_owned();
    assert_eq!(runtime_dir, guard.0, "runtime dir where DPDK documents it");
    assert!(runtime_dir.exists());

    // Once per process.
    let err = Eal::init(&["--no-huge"]).expect_err("a second start fails");
    assert_eq!(err.errno(), libc::EALREADY);
    println!("second Eal::init: {err}");

    // --no-huge forces IOVA-as-VA.
    assert!(eal.iova_is_va());
    assert!(!eal.has_hugepages());
    assert_eq!(eal.main_lcore(), 0);
    assert_eq!(
        lcore_id(),
        Some(0),
        "the thread that started EAL is lcore 0"
    );
    assert!(eal.tsc_hz() > 1_000_000, "TSC at {} Hz", eal.tsc_hz());
    let t0 = tsc();
    assert!(tsc() >= t0);

    pools_and_mbufs(&eal);
    mbuf_editing(&eal);
    registered_thread(&eal);
    ring_between_threads(&eal);
    null_port_plugin(&eal);

    let mut left: Vec<String> = std::fs::read_dir(&runtime_dir)
        .expect("runtime dir")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    println!("runtime files before cleanup: {left:?}");
    drop(eal);
    assert!(
        !runtime_dir.exists(),
        "EAL cleanup left {} behind",
        runtime_dir.display()
    );
    println!("runtime dir {} removed at cleanup", runtime_dir.display());
}

/// The calling thread's CPU list as the kernel prints it ("0-1").
fn allowed_cpus() -> String {
    let status = std::fs::read_to_string("/proc/thread-self/status").expect("thread status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/thread-self/status")
        .trim()
        .to_string()
}

/// A pool on the stack driver hands out the mbuf freed last; a driver
/// nobody loaded is an error.
fn stack_pool(eal: &Eal) {
    // No per-lcore cache: the driver itself answers every call.
    let pool = Mempool::with_ops(eal, "lc_stack", 63, 0, 2176, -1, Some("stack")).expect("stack");
    assert_eq!(pool.ops_name(), "stack");
    let (a, b) = (pool.alloc().unwrap(), pool.alloc().unwrap());
    let last = b.as_ptr();
    drop(a);
    drop(b);
    assert_eq!(
        pool.alloc().unwrap().as_ptr(),
        last,
        "the last freed comes first"
    );
    let err = Mempool::with_ops(eal, "lc_none", 63, 0, 2176, -1, Some("no-such-driver"))
        .expect_err("an unknown driver");
    println!("unknown mempool driver: {err}");
}

fn pools_and_mbufs(eal: &Eal) {
    let pool = Mempool::new(eal, "lc_pool", 1023, 32, 2176, -1).expect("pool");
    assert_eq!(pool.size(), 1023);
    assert_eq!(pool.avail_count(), 1023);
    assert_eq!(pool.data_room(), 2176);
    assert_eq!(pool.ops_name(), "ring_mp_mc", "DPDK's default driver");
    stack_pool(eal);

    let mut held: Vec<Mbuf> = (0..300).map(|_| pool.alloc().expect("mbuf")).collect();
    assert_eq!(pool.in_use_count(), 300);
    let m = &held[0];
    assert!(m.is_empty());
    assert_eq!(m.nb_segs(), 1);
    assert_eq!(m.headroom(), 128, "RTE_PKTMBUF_HEADROOM");
    assert_eq!(m.tailroom(), 2048);
    assert!(m.is_writable());
    assert_eq!(m.refcnt(), 1);
    // The data start of a fresh mbuf is where appended bytes go.
    let fresh = held[1].data_ptr();
    let got = held[1].append(16).expect("room for 16 bytes").as_ptr();
    assert_eq!(fresh, got);
    assert_eq!(held[1].data().as_ptr(), fresh);
    held.clear();
    assert_eq!(pool.avail_count(), 1023, "every mbuf back in the pool");

    let mut burst = MbufBurst::new();
    assert!(pool.alloc_bulk(&mut burst, BURST));
    assert!(burst.is_full());
    assert_eq!(pool.in_use_count(), BURST as u32);
    let extra = pool.alloc().unwrap();
    let extra = burst
        .push(extra)
        .expect_err("a full burst gives the mbuf back");
    drop(extra);
    let next = burst.last().map(Mbuf::as_ptr);
    let last = burst.pop().unwrap();
    assert_eq!(next, Some(last.as_ptr()), "last() is what pop() takes");
    assert_eq!(burst.len(), BURST - 1);
    drop(last);
    // A drain stopped early frees the rest.
    let first_two: Vec<Mbuf> = burst.drain().take(2).collect();
    assert!(burst.is_empty());
    assert_eq!(pool.in_use_count(), 2);
    drop(first_two);
    assert_eq!(pool.in_use_count(), 0);

    // Exhaustion is a None, not a crash; everything comes back.
    let all: Vec<Mbuf> = std::iter::from_fn(|| pool.alloc()).collect();
    assert_eq!(all.len(), 1023);
    assert!(pool.alloc().is_none());
    assert!(!pool.alloc_bulk(&mut burst, 4));
    drop(all);
    assert_eq!(pool.avail_count(), 1023);
    println!("pool: 1023 mbufs out and back, no leak");
}

fn mbuf_editing(eal: &Eal) {
    let pool = Mempool::new(eal, "edit_pool", 255, 0, 2176, -1).expect("pool");
    let mut m = pool.alloc().unwrap();
    m.append(10).unwrap().copy_from_slice(b"0123456789");
    assert_eq!(m.data(), b"0123456789");
    m.prepend(3).unwrap().copy_from_slice(b"abc");
    assert_eq!(m.data(), b"abc0123456789");
    assert!(m.adj(2));
    assert!(m.trim(4));
    assert_eq!(m.data(), b"c012345");
    m.data_mut().unwrap()[0] = b'C';
    assert!(!m.adj(100), "removing more than there is fails");
    assert!(m.append(4000).is_none(), "more than the tailroom");
    assert!(m.prepend(200).is_none(), "more than the headroom");
    assert_eq!(m.data(), b"C012345");

    let mut tail = pool.alloc().unwrap();
    tail.append(5).unwrap().copy_from_slice(b"WXYZ!");
    m.chain(tail).unwrap();
    assert_eq!(m.nb_segs(), 2);
    assert_eq!(m.len(), 12);
    assert_eq!(m.data_len(), 7);
    // append goes to the last segment.
    m.append(1).unwrap()[0] = b'?';
    let segs: Vec<&[u8]> = m.segments().collect();
    assert_eq!(segs, [&b"C012345"[..], &b"WXYZ!?"[..]]);
    let mut out = [0u8; 8];
    assert_eq!(m.read(4, &mut out), 8);
    assert_eq!(&out, b"345WXYZ!");
    assert_eq!(m.read(11, &mut out), 2);
    assert_eq!(&out[..2], b"!?");
    assert_eq!(m.read(13, &mut out), 0);
    assert_eq!(pool.in_use_count(), 2);

    // Raw round trip.
    let raw = m.into_raw();
    // SAFETY: `raw` came from into_raw and nothing else owns it.
    let m = unsafe { Mbuf::from_raw(raw) };
    assert_eq!(m.len(), 13);
    drop(m);
    assert_eq!(pool.in_use_count(), 0, "a chain frees all its segments");

    // RX offload flags of a fresh mbuf: nothing known.
    let m = pool.alloc().unwrap();
    assert_eq!(m.ip_cksum(), dpdk_bindings::CksumStatus::Unknown);
    assert_eq!(m.l4_cksum(), dpdk_bindings::CksumStatus::Unknown);
    assert_eq!(m.rss_hash(), None);
    println!("mbuf editing: append/prepend/adj/trim/chain/read verified");
}

fn registered_thread(eal: &Eal) {
    let pool = Mempool::new(eal, "thr_pool", 511, 32, 2176, -1).expect("pool");
    let eal2 = eal.clone();
    let pool2 = pool.clone();
    let lcore = std::thread::spawn(move || {
        assert_eq!(lcore_id(), None, "a new thread is not an lcore");
        let reg = eal2.register_thread().expect("rte_thread_register");
        let id = reg.lcore_id();
        assert_eq!(lcore_id(), Some(id));
        assert!(eal2.register_thread().is_err(), "registering twice fails");
        let ms: Vec<Mbuf> = (0..64).map(|_| pool2.alloc().unwrap()).collect();
        drop(ms);
        drop(reg);
        assert_eq!(lcore_id(), None, "unregistered on drop");
        id
    })
    .join()
    .expect("thread");
    assert_ne!(lcore, 0);
    assert_eq!(pool.in_use_count(), 0);
    println!("worker thread registered as lcore {lcore}");
}

fn ring_between_threads(eal: &Eal) {
    let pool = Mempool::new(eal, "ring_pool", 511, 0, 2176, -1).expect("pool");
    let ring = std::sync::Arc::new(MbufRing::new(eal, "lc_ring", 64).expect("ring"));
    let producer = {
        let ring = ring.clone();
        let pool = pool.clone();
        std::thread::spawn(move || {
            let mut sent = 0u32;
            let mut burst = MbufBurst::new();
            while sent < 1000 {
                while !burst.is_full() && sent + (burst.len() as u32) < 1000 {
                    let mut m = pool.alloc().expect("mbuf");
                    let seq = sent + burst.len() as u32;
                    m.append(4).unwrap().copy_from_slice(&seq.to_be_bytes());
                    burst.push(m).unwrap();
                }
                sent += ring.enqueue_burst(&mut burst) as u32;
            }
        })
    };
    let mut next = 0u32;
    let mut burst = MbufBurst::new();
    while next < 1000 {
        ring.dequeue_burst(&mut burst);
        for m in burst.drain() {
            assert_eq!(m.data(), next.to_be_bytes(), "order kept");
            next += 1;
        }
    }
    producer.join().unwrap();
    assert!(ring.is_empty());
    // Mbufs left in a ring are freed with it.
    let mut b = MbufBurst::new();
    assert!(pool.alloc_bulk(&mut b, 10));
    assert_eq!(ring.enqueue_burst(&mut b), 10);
    assert_eq!(ring.len(), 10);
    drop(ring);
    assert_eq!(pool.in_use_count(), 0);
    println!("mbuf ring: 1000 mbufs across threads, in order");
}

/// `net_null` is not linked into the binary: EAL loads it as a plugin from
/// the system's PMD directory. Its RX makes 64-byte frames from the pool,
/// its TX frees what it is given.
fn null_port_plugin(eal: &Eal) {
    let pool = Mempool::new(eal, "null_pool", 511, 32, 2176, -1).expect("pool");
    let mut port = Port::by_name(eal, "net_null0").expect("net_null0 probed");
    let info = port.dev_info().unwrap();
    assert_eq!(info.driver_name, "net_null");
    let setup = port.configure(&PortConfig::default(), &pool).unwrap();
    println!(
        "net_null offloads granted: rx {:#x} tx {:#x}",
        setup.rx_offloads, setup.tx_offloads
    );
    port.start().unwrap();
    let mut rx = port.rx_queue(0).unwrap();
    let mut tx = port.tx_queue(0).unwrap();
    let mut burst = MbufBurst::new();
    assert_eq!(rx.rx_burst(&mut burst), BURST);
    assert!(burst.iter().all(|m| m.len() == 64));
    assert_eq!(pool.in_use_count(), BURST as u32);
    assert_eq!(tx.tx_burst(&mut burst), BURST);
    assert_eq!(pool.in_use_count(), 0, "net_null frees what it sends");
    drop((rx, tx));
    println!("net_null plugin: {BURST} frames received and sent");

    // net_null keeps an RSS key and a 128-entry redirection table: the
    // calls steering depends on, on a real table.
    port.stop().unwrap();
    let conf = PortConfig {
        rx_queues: 2,
        tx_queues: 2,
        rss_key: Some(toeplitz::SYMMETRIC_KEY.to_vec()),
        ..PortConfig::default()
    };
    let setup = port.configure(&conf, &pool).unwrap();
    assert_ne!(setup.rss_hf, 0, "net_null grants IPv4/TCP RSS");
    let rss = port.rss_hash_conf_get().unwrap();
    assert_eq!(
        rss.key,
        toeplitz::SYMMETRIC_KEY,
        "the key asked for is in force"
    );
    let reta: Vec<u16> = (0..128).map(|i| i % 2).collect();
    port.reta_update(&reta).unwrap();
    assert_eq!(port.reta_query().unwrap(), reta);
    // A source port for which the reply (server → us) lands on queue 1.
    let (us, server) = ([10, 0, 0, 1], [10, 0, 0, 2]);
    let sport = (49152u16..)
        .find(|&p| {
            let h = toeplitz::hash(&rss.key, &toeplitz::ipv4_tcp_input(server, us, 4791, p));
            toeplitz::reta_queue(h, &reta) == Some(1)
        })
        .unwrap();
    let h = toeplitz::hash(&rss.key, &toeplitz::ipv4_tcp_input(server, us, 4791, sport));
    assert_eq!(h % 2, 1);
    println!(
        "net_null RSS: key and 128-entry table read back; source port {sport} steers to queue 1"
    );
    drop(port);
    // Only a driver known to abandon parked mbufs at close (net_af_xdp)
    // credits any: a closed net_null port leaves the pool's rule as it was.
    assert_eq!(pool.orphaned_count(), 0, "nothing orphaned by net_null");
}
