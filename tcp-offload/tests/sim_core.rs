//! The simulator on its own, with trivial endpoints: a pinger that sends
//! numbered frames on a timer (or in one burst) and records what arrives.
//! Checks determinism, each impairment's rate and shape, the switch and the
//! run loop's error reporting.

use std::collections::VecDeque;
use std::time::Duration;

use tcp_offload::Instant;
use tcp_sim::{DirId, DropReason, Endpoint, Fate, LinkConfig, Network, NodeId, SimError};

const ETHERTYPE_TEST: [u8; 2] = [0x88, 0xb5]; // IEEE local experimental

/// Sends `count` frames of `size` bytes to `peer`, one every `interval`
/// (all at once when `interval` is zero), and records arrivals.
#[derive(Debug)]
struct Pinger {
    mac: [u8; 6],
    peer: [u8; 6],
    size: usize,
    interval: Duration,
    count: u64,
    sent: u64,
    next: Option<Instant>,
    outbox: VecDeque<Vec<u8>>,
    arrivals: Vec<(Instant, Vec<u8>)>,
}

impl Pinger {
    fn new(id: u8, peer: u8, count: u64, size: usize, interval: Duration) -> Pinger {
        Pinger {
            mac: [2, 0, 0, 0, 0, id],
            peer: [2, 0, 0, 0, 0, peer],
            size,
            interval,
            count,
            sent: 0,
            next: (count > 0).then_some(Instant::ZERO),
            outbox: VecDeque::new(),
            arrivals: Vec::new(),
        }
    }

    fn silent(id: u8) -> Pinger {
        Pinger::new(id, 0, 0, 0, Duration::ZERO)
    }

    fn frame(&self, n: u64) -> Vec<u8> {
        let mut f = vec![0u8; self.size.max(22)];
        f[0..6].copy_from_slice(&self.peer);
        f[6..12].copy_from_slice(&self.mac);
        f[12..14].copy_from_slice(&ETHERTYPE_TEST);
        f[14..22].copy_from_slice(&n.to_be_bytes());
        for (i, b) in f[22..].iter_mut().enumerate() {
            *b = (n as u8).wrapping_add(i as u8);
        }
        f
    }

    /// Frame numbers in arrival order.
    fn numbers(&self) -> Vec<u64> {
        self.arrivals
            .iter()
            .map(|(_, f)| u64::from_be_bytes(f[14..22].try_into().unwrap()))
            .collect()
    }
}

impl Endpoint for Pinger {
    fn handle_frame(&mut self, now: Instant, frame: Vec<u8>) {
        self.arrivals.push((now, frame));
    }
    fn poll_frame(&mut self, _now: Instant) -> Option<Vec<u8>> {
        self.outbox.pop_front()
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        self.next
    }
    fn handle_timeout(&mut self, now: Instant) {
        while self.sent < self.count {
            let f = self.frame(self.sent);
            self.outbox.push_back(f);
            self.sent += 1;
            if !self.interval.is_zero() {
                break;
            }
        }
        self.next = (self.sent < self.count).then(|| now + self.interval);
    }
}

/// Two pingers sending to each other over one link; runs until idle.
fn pair(
    seed: u64,
    config: LinkConfig,
    count: u64,
    size: usize,
    interval: Duration,
) -> Network<Pinger> {
    let mut net = Network::new(seed);
    let a = net.add_endpoint(Pinger::new(1, 2, count, size, interval));
    let b = net.add_endpoint(Pinger::new(2, 1, count, size, interval));
    net.connect(a, b, config);
    let end = net.run_until(Instant::from_millis(3_600_000), |_| false);
    assert!(matches!(end, Err(SimError::Idle { .. })), "{end:?}");
    net
}

const A: NodeId = NodeId(0);
const B: NodeId = NodeId(1);

fn every_impairment() -> LinkConfig {
    LinkConfig::perfect()
        .with_loss(0.1)
        .with_jitter(Duration::from_micros(80))
        .with_reorder(0.1, Duration::from_micros(500))
        .with_duplicate(0.1)
        .with_corrupt(0.1)
        .with_bandwidth(100_000_000)
        .with_queue_limit(20_000)
}

/// Everything observable about a run, for comparing runs.
fn trace(net: &Network<Pinger>) -> Vec<(u64, Vec<u8>)> {
    [A, B]
        .iter()
        .flat_map(|&id| net.endpoint(id).arrivals.iter())
        .map(|(t, f)| (t.total_micros(), f.clone()))
        .collect()
}

#[test]
fn same_seed_same_run_different_seed_different_run() {
    let run = |seed| {
        pair(
            seed,
            every_impairment(),
            2000,
            300,
            Duration::from_micros(20),
        )
    };
    let (x, y, z) = (run(11), run(11), run(12));
    assert_eq!(trace(&x), trace(&y));
    for d in 0..2 {
        let dir = DirId(d);
        assert_eq!(x.link_stats(dir), y.link_stats(dir));
    }
    assert_ne!(trace(&x), trace(&z));
    // Both directions drew their own numbers.
    let (f, b) = (x.link_stats(DirId(0)), x.link_stats(DirId(1)));
    assert_ne!(f, b);
}

#[test]
fn perfect_link_delivers_everything_in_order_after_the_latency() {
    let net = pair(1, LinkConfig::perfect(), 100, 64, Duration::from_millis(1));
    let b = net.endpoint(B);
    assert_eq!(b.numbers(), (0..100).collect::<Vec<_>>());
    for (n, (t, f)) in b.arrivals.iter().enumerate() {
        assert_eq!(*t, Instant::from_micros(n as u64 * 1000 + 100));
        assert_eq!(*f, net.endpoint(A).frame(n as u64));
        assert_eq!(f[..6], [2, 0, 0, 0, 0, 2]);
    }
    let s = net.link_stats(DirId(0));
    assert_eq!((s.sent, s.delivered, s.dropped()), (100, 100, 0));
    assert_eq!(s.sent_bytes, 6400);
}

#[test]
fn loss_rate_matches_configuration() {
    let net = pair(
        5,
        LinkConfig::lossy(0.05),
        100_000,
        60,
        Duration::from_micros(10),
    );
    for d in 0..2 {
        let s = *net.link_stats(DirId(d));
        assert_eq!(s.sent, 100_000);
        assert_eq!(s.delivered + s.dropped_loss, s.sent);
        let rate = s.dropped_loss as f64 / s.sent as f64;
        // σ = sqrt(0.05 · 0.95 / 10^5) ≈ 0.0007: this is over 5σ.
        assert!((rate - 0.05).abs() < 0.004, "loss rate {rate}");
    }
    assert_eq!(
        net.endpoint(B).arrivals.len() as u64,
        net.link_stats(DirId(0)).delivered
    );
}

#[test]
fn bandwidth_spaces_arrivals_and_the_queue_drops_its_tail() {
    // 1250-byte frames at 10 Mbit/s: 1 ms each. A burst of 50 at t = 0.
    let unbounded = LinkConfig::perfect().with_bandwidth(10_000_000);
    let net = pair(2, unbounded, 50, 1250, Duration::ZERO);
    let times: Vec<u64> = net
        .endpoint(B)
        .arrivals
        .iter()
        .map(|(t, _)| t.total_micros())
        .collect();
    let expected: Vec<u64> = (1..=50).map(|k| k * 1000 + 100).collect();
    assert_eq!(times, expected);
    assert_eq!(net.link_stats(DirId(0)).max_queue_bytes, 50 * 1250);

    // Room for ten frames: the other forty are dropped at the tail.
    let bounded = LinkConfig::bottleneck(10_000_000, 10 * 1250);
    let net = pair(2, bounded, 50, 1250, Duration::ZERO);
    let s = net.link_stats(DirId(0));
    assert_eq!((s.delivered, s.dropped_queue), (10, 40));
    assert_eq!(net.endpoint(B).numbers(), (0..10).collect::<Vec<_>>());

    // Frames offered as fast as the link drains them never queue up.
    let net = pair(
        2,
        LinkConfig::bottleneck(10_000_000, 1250),
        30,
        1250,
        Duration::from_millis(1),
    );
    assert_eq!(net.link_stats(DirId(0)).dropped_queue, 0);
    assert_eq!(net.endpoint(B).arrivals.len(), 30);
}

#[test]
fn frames_over_the_mtu_are_dropped_and_counted() {
    let fits = pair(
        3,
        LinkConfig::perfect().with_mtu(1500),
        10,
        1514,
        Duration::from_micros(50),
    );
    assert_eq!(fits.endpoint(B).arrivals.len(), 10);
    let big = pair(
        3,
        LinkConfig::perfect().with_mtu(1500),
        10,
        1515,
        Duration::from_micros(50),
    );
    assert!(big.endpoint(B).arrivals.is_empty());
    assert_eq!(big.link_stats(DirId(0)).dropped_mtu, 10);
}

#[test]
fn corruption_flips_one_to_three_bits_after_the_ethernet_header() {
    let net = pair(
        4,
        LinkConfig::perfect().with_corrupt(0.3),
        5000,
        200,
        Duration::from_micros(5),
    );
    let (a, b) = (net.endpoint(A), net.endpoint(B));
    // Nothing else impairs the link, so the k-th arrival is frame k.
    assert_eq!(b.arrivals.len(), 5000);
    let mut damaged = 0;
    for (k, (_, f)) in b.arrivals.iter().enumerate() {
        let original = a.frame(k as u64);
        assert_eq!(f[..14], original[..14], "Ethernet header touched");
        let flips: u32 = f
            .iter()
            .zip(&original)
            .map(|(x, y)| (x ^ y).count_ones())
            .sum();
        assert!(flips <= 3, "{flips} flips");
        damaged += u64::from(flips > 0);
    }
    let s = net.link_stats(DirId(0));
    assert_eq!(s.corrupted, damaged);
    assert!(s.corrupted > 1350 && s.corrupted < 1650, "{}", s.corrupted);
}

#[test]
fn reordering_lets_later_frames_overtake_and_jitter_alone_does_not() {
    let reorder = LinkConfig::perfect().with_reorder(0.1, Duration::from_micros(500));
    let net = pair(6, reorder, 2000, 64, Duration::from_micros(20));
    let numbers = net.endpoint(B).numbers();
    let inversions = numbers.windows(2).filter(|w| w[0] > w[1]).count();
    let s = net.link_stats(DirId(0));
    assert!(s.reordered > 150 && s.reordered < 250, "{}", s.reordered);
    assert!(inversions > 150, "{inversions}");
    let mut sorted = numbers.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..2000).collect::<Vec<_>>());

    let jitter = LinkConfig::perfect().with_jitter(Duration::from_micros(500));
    let net = pair(6, jitter, 2000, 64, Duration::from_micros(20));
    assert_eq!(net.endpoint(B).numbers(), (0..2000).collect::<Vec<_>>());
}

#[test]
fn duplicates_arrive_after_their_original() {
    let net = pair(
        7,
        LinkConfig::perfect().with_duplicate(0.2),
        3000,
        64,
        Duration::from_micros(500),
    );
    let numbers = net.endpoint(B).numbers();
    let s = net.link_stats(DirId(0));
    assert_eq!(numbers.len() as u64, 3000 + s.duplicated);
    assert_eq!(s.delivered, 3000 + s.duplicated);
    assert!(s.duplicated > 500 && s.duplicated < 700, "{}", s.duplicated);
    // Frames are 500 µs apart and copies trail by at most 100 µs, so a
    // copy comes right after its original.
    let mut seen = std::collections::BTreeSet::new();
    let mut previous = None;
    for &n in &numbers {
        if !seen.insert(n) {
            assert_eq!(previous, Some(n));
        }
        previous = Some(n);
    }
    assert_eq!(seen.len(), 3000);
}

#[test]
fn drop_filter_and_capture_record_each_fate() {
    let mut net: Network<Pinger> = Network::new(8);
    let a = net.add_endpoint(Pinger::new(1, 2, 10, 64, Duration::from_micros(10)));
    let b = net.add_endpoint(Pinger::silent(2));
    let link = net.connect(a, b, LinkConfig::perfect());
    net.enable_capture();
    net.set_drop_filter(link.forward, Some(Box::new(|_, f: &[u8]| f[21] % 3 == 0)));
    let _ = net.run_until(Instant::from_millis(100), |_| false);
    assert_eq!(net.endpoint(b).numbers(), vec![1, 2, 4, 5, 7, 8]);
    assert_eq!(net.link_stats(link.forward).dropped_filter, 4);
    assert_eq!(net.captured().len(), 10);
    assert_eq!(net.captured_drops(link.forward, DropReason::Filter), 4);
    let delivered = net
        .captured()
        .iter()
        .filter(|c| matches!(c.fate, Fate::Delivered { .. }))
        .count();
    assert_eq!(delivered, 6);
}

#[test]
fn learning_switch_forwards_by_destination_mac() {
    let mut net: Network<Pinger> = Network::new(9);
    let sw = net.add_switch();
    // 1 → 2 unicast; 3 broadcasts; 2 and 4 are silent.
    let one = net.add_endpoint(Pinger::new(1, 2, 5, 64, Duration::from_millis(1)));
    let two = net.add_endpoint(Pinger::silent(2));
    let three = net.add_endpoint(Pinger::new(3, 0xff, 1, 64, Duration::ZERO));
    let four = net.add_endpoint(Pinger::silent(4));
    for n in [one, two, three, four] {
        net.connect(n, sw, LinkConfig::perfect());
    }
    net.endpoint_mut(three).peer = [0xff; 6];
    // Let 2 announce itself first, so that the switch has learned it.
    net.endpoint_mut(two).peer = [0xff; 6];
    net.endpoint_mut(two).count = 1;
    net.endpoint_mut(two).next = Some(Instant::ZERO);
    let _ = net.run_until(Instant::from_millis(1000), |_| false);
    // 2's broadcast reached 1, 3 and 4; 3's reached 1, 2 and 4. 1's first
    // frame, sent at 0 before the switch knew 2, was flooded to 2, 3 and
    // 4; its next four went to 2 alone.
    assert_eq!(net.endpoint(one).arrivals.len(), 2);
    assert_eq!(net.endpoint(two).arrivals.len(), 5 + 1);
    assert_eq!(net.endpoint(three).arrivals.len(), 1 + 1);
    assert_eq!(net.endpoint(four).arrivals.len(), 1 + 2);
}

/// An endpoint whose timer never clears: a bug the loop must report.
#[derive(Debug)]
struct Stuck;

impl Endpoint for Stuck {
    fn handle_frame(&mut self, _: Instant, _: Vec<u8>) {}
    fn poll_frame(&mut self, _: Instant) -> Option<Vec<u8>> {
        None
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        Some(Instant::ZERO)
    }
    fn handle_timeout(&mut self, _: Instant) {}
}

#[test]
fn run_loop_reports_deadline_idle_and_livelock() {
    let mut net: Network<Pinger> = Network::new(10);
    let a = net.add_endpoint(Pinger::new(1, 2, 1000, 64, Duration::from_millis(1)));
    let b = net.add_endpoint(Pinger::silent(2));
    net.connect(a, b, LinkConfig::perfect());
    let r = net.run_until(Instant::from_millis(10), |_| false);
    assert_eq!(
        r,
        Err(SimError::Deadline {
            now: Instant::from_millis(10)
        })
    );
    let got = net.endpoint(b).arrivals.len();
    assert_eq!(got, 10, "frames 0–9 arrive by 9.1 ms");
    let done = net.run_until(Instant::from_millis(100), |n| {
        n.endpoint(b).arrivals.len() >= 20
    });
    assert_eq!(done, Ok(Instant::from_micros(19_100)));

    let mut idle: Network<Pinger> = Network::new(10);
    idle.add_endpoint(Pinger::silent(1));
    assert_eq!(
        idle.run_until(Instant::from_millis(10), |_| false),
        Err(SimError::Idle { now: Instant::ZERO })
    );

    let mut stuck: Network<Box<dyn Endpoint>> = Network::new(10);
    stuck.add_endpoint(Box::new(Stuck));
    assert!(matches!(
        stuck.run_until(Instant::from_millis(10), |_| false),
        Err(SimError::Livelock { .. })
    ));
}

#[test]
fn wakeups_run_the_application_at_the_requested_time() {
    let mut net: Network<Pinger> = Network::new(11);
    net.add_endpoint(Pinger::silent(1));
    net.schedule_wakeup(Instant::from_millis(7));
    let mut calls = Vec::new();
    let r = net.run_until(Instant::from_millis(100), |n| {
        calls.push(n.now());
        n.now() >= Instant::from_millis(7)
    });
    assert_eq!(r, Ok(Instant::from_millis(7)));
    assert_eq!(calls, vec![Instant::ZERO, Instant::from_millis(7)]);
}

#[test]
fn stepping_by_hand_and_injecting_frames() {
    let mut net: Network<Pinger> = Network::new(12);
    let a = net.add_endpoint(Pinger::silent(1));
    let b = net.add_endpoint(Pinger::silent(2));
    let link = net.connect(a, b, LinkConfig::perfect());
    let frame = Pinger::new(1, 2, 1, 64, Duration::ZERO).frame(7);
    net.inject(link.forward, frame.clone());
    // The injected frame is in flight: the next event is its arrival.
    assert_eq!(net.next_event_time(), Some(Instant::from_micros(100)));
    assert_eq!(net.step(), Some(Instant::from_micros(100)));
    assert!(net.endpoint(b).arrivals.is_empty());
    assert_eq!(net.step(), None);
    assert_eq!(
        net.endpoint(b).arrivals,
        vec![(Instant::from_micros(100), frame)]
    );
    assert_eq!(net.link_stats(link.forward).delivered, 1);
}
