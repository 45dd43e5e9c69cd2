//! One direction of a simulated link: what happens to a frame between the
//! moment an endpoint (or a switch port) hands it over and the moment it
//! arrives at the far end.
//!
//! The stages, in order, each drawing from the direction's own [`Rng`]:
//!
//! 1. **MTU**: a frame longer than `mtu + 14` (the Ethernet header) is
//!    dropped, as a real port would refuse it.
//! 2. **Drop filter**: an optional test hook that drops chosen frames.
//! 3. **Queue and bandwidth**: with a bandwidth, frames are serialized one
//!    after another at that rate; a frame that would make the bytes waiting
//!    or in transmission exceed `queue_limit_bytes` is dropped (drop-tail).
//! 4. **Loss** on the wire (the frame has used its share of bandwidth).
//! 5. **Corruption**: 1–3 bits flipped (see [`LinkConfig::corrupt`]).
//! 6. **Delay**: propagation latency plus uniform jitter. Jitter never
//!    reorders frames on its own (a real link is FIFO); a frame chosen for
//!    **reordering** gets `reorder_delay` on top and lets later frames pass.
//! 7. **Duplication**: a copy arrives shortly after the original.

use core::time::Duration;

use super::rng::Rng;
use tcp_offload::time::Instant;

/// Length of an Ethernet II header, which the MTU does not count.
pub const ETHERNET_HEADER_LEN: usize = 14;

/// EtherType of ARP. ARP carries no checksum, so corruption spares it (see
/// [`LinkConfig::corrupt`]).
const ETHERTYPE_ARP: u16 = 0x0806;

/// EtherType of an 802.1Q tag, which adds 4 bytes to the header.
const ETHERTYPE_VLAN: u16 = 0x8100;

/// The Ethernet header length of `frame` (14, or 18 with a VLAN tag) and
/// the EtherType of its payload; `None` for a runt.
fn ethernet_header(frame: &[u8]) -> Option<(usize, u16)> {
    let outer = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    if outer == ETHERTYPE_VLAN {
        Some((18, u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?])))
    } else {
        Some((ETHERNET_HEADER_LEN, outer))
    }
}

/// How one link direction treats frames. Probabilities are per frame and
/// independent; a value outside `[0, 1]` acts as the nearest bound.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Propagation delay added to every frame.
    pub latency: Duration,
    /// Extra delay drawn uniformly from `[0, jitter]` per frame. Jitter
    /// alone keeps frames in order.
    pub jitter: Duration,
    /// Serialization rate in bits per second (frame bytes only; preamble
    /// and inter-frame gap are not modelled). `None`: infinitely fast, and
    /// then there is no queue either.
    pub bandwidth_bps: Option<u64>,
    /// Drop-tail limit on the bytes waiting for or in serialization.
    /// `None`: unbounded. Only meaningful with a bandwidth.
    pub queue_limit_bytes: Option<usize>,
    /// The IP MTU: frames longer than `mtu + 14` bytes (`mtu + 18` with a
    /// VLAN tag) are dropped and counted in [`LinkStats::dropped_mtu`].
    pub mtu: usize,
    /// Probability that a frame is lost on the wire.
    pub loss: f64,
    /// Probability that a frame is held back by `reorder_delay`, so that
    /// frames sent after it can overtake it.
    pub reorder: f64,
    /// The extra delay of a reordered frame.
    pub reorder_delay: Duration,
    /// Probability that a frame is delivered twice.
    pub duplicate: f64,
    /// Probability that 1–3 bits of a frame are flipped.
    ///
    /// The flips are placed where the checksums of IPv4, TCP and ICMP are
    /// certain to notice them: after the Ethernet header, and in distinct
    /// bit positions of the 16-bit words the Internet checksum adds up.
    /// Distinct positions matter because a ones'-complement sum misses two
    /// flips that cancel (a 0→1 and a 1→0 in the same bit of two words);
    /// with at most three flips in distinct positions the sum always
    /// changes. On real links the Ethernet FCS catches what hits the
    /// Ethernet header or an ARP frame (ARP has no checksum of its own), so
    /// those are spared. What is left is exactly what the engine must catch
    /// itself, and tests can then demand byte-exact delivery.
    pub corrupt: f64,
}

impl LinkConfig {
    /// No impairment: 100 µs of latency, no bandwidth limit, MTU 1500.
    pub fn perfect() -> LinkConfig {
        LinkConfig {
            latency: Duration::from_micros(100),
            jitter: Duration::ZERO,
            bandwidth_bps: None,
            queue_limit_bytes: None,
            mtu: 1500,
            loss: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(300),
            duplicate: 0.0,
            corrupt: 0.0,
        }
    }

    /// A perfect link that loses a fraction `loss` of frames.
    pub fn lossy(loss: f64) -> LinkConfig {
        LinkConfig {
            loss,
            ..LinkConfig::perfect()
        }
    }

    /// Every impairment at once, scaled by `loss`: reordering and
    /// duplication at half the loss rate, corruption at a quarter, plus
    /// jitter. The profile of the seed tests.
    pub fn impaired(loss: f64) -> LinkConfig {
        LinkConfig {
            jitter: Duration::from_micros(50),
            loss,
            reorder: loss / 2.0,
            duplicate: loss / 2.0,
            corrupt: loss / 4.0,
            ..LinkConfig::perfect()
        }
    }

    /// A link that delivers nothing.
    pub fn black_hole() -> LinkConfig {
        LinkConfig::lossy(1.0)
    }

    /// A bandwidth-limited link with a drop-tail queue of `queue_bytes`.
    pub fn bottleneck(bandwidth_bps: u64, queue_bytes: usize) -> LinkConfig {
        LinkConfig {
            bandwidth_bps: Some(bandwidth_bps),
            queue_limit_bytes: Some(queue_bytes),
            ..LinkConfig::perfect()
        }
    }

    /// This configuration with another latency.
    pub fn with_latency(self, latency: Duration) -> LinkConfig {
        LinkConfig { latency, ..self }
    }

    /// This configuration with another jitter.
    pub fn with_jitter(self, jitter: Duration) -> LinkConfig {
        LinkConfig { jitter, ..self }
    }

    /// This configuration with a bandwidth limit.
    pub fn with_bandwidth(self, bps: u64) -> LinkConfig {
        LinkConfig {
            bandwidth_bps: Some(bps),
            ..self
        }
    }

    /// This configuration with a drop-tail queue limit.
    pub fn with_queue_limit(self, bytes: usize) -> LinkConfig {
        LinkConfig {
            queue_limit_bytes: Some(bytes),
            ..self
        }
    }

    /// This configuration with another MTU.
    pub fn with_mtu(self, mtu: usize) -> LinkConfig {
        LinkConfig { mtu, ..self }
    }

    /// This configuration with another loss probability.
    pub fn with_loss(self, loss: f64) -> LinkConfig {
        LinkConfig { loss, ..self }
    }

    /// This configuration with another reordering probability and delay.
    pub fn with_reorder(self, reorder: f64, delay: Duration) -> LinkConfig {
        LinkConfig {
            reorder,
            reorder_delay: delay,
            ..self
        }
    }

    /// This configuration with another duplication probability.
    pub fn with_duplicate(self, duplicate: f64) -> LinkConfig {
        LinkConfig { duplicate, ..self }
    }

    /// This configuration with another corruption probability.
    pub fn with_corrupt(self, corrupt: f64) -> LinkConfig {
        LinkConfig { corrupt, ..self }
    }
}

impl Default for LinkConfig {
    fn default() -> LinkConfig {
        LinkConfig::perfect()
    }
}

/// Counters of one link direction. Every frame offered is counted in
/// `sent` and then either in exactly one `dropped_*` counter or delivered
/// (once, or twice when duplicated).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames offered to the link.
    pub sent: u64,
    /// Bytes of the frames offered.
    pub sent_bytes: u64,
    /// Frames handed to the far end, duplicates included.
    pub delivered: u64,
    /// Bytes of the frames delivered.
    pub delivered_bytes: u64,
    /// Frames lost on the wire.
    pub dropped_loss: u64,
    /// Frames dropped because the queue was full.
    pub dropped_queue: u64,
    /// Frames dropped for exceeding the MTU.
    pub dropped_mtu: u64,
    /// Frames dropped by the test's drop filter.
    pub dropped_filter: u64,
    /// Frames delivered a second time.
    pub duplicated: u64,
    /// Frames held back so that later ones overtook them.
    pub reordered: u64,
    /// Frames with flipped bits.
    pub corrupted: u64,
    /// The most bytes the queue ever held.
    pub max_queue_bytes: u64,
}

impl LinkStats {
    /// Frames dropped for any reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_loss + self.dropped_queue + self.dropped_mtu + self.dropped_filter
    }
}

/// Why a frame did not arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Longer than the MTU allows.
    Mtu,
    /// Chosen by the test's drop filter.
    Filter,
    /// The drop-tail queue was full.
    Queue,
    /// Lost on the wire at random.
    Loss,
}

/// What became of a frame offered to a link direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Dropped before arrival.
    Dropped(DropReason),
    /// Arrives at `at` (and, when duplicated, again at `duplicate_at`).
    Delivered {
        at: Instant,
        duplicate_at: Option<Instant>,
        corrupted: bool,
        reordered: bool,
    },
}

/// The state of one direction: its configuration, generator, serializer
/// and counters.
#[derive(Debug)]
pub(crate) struct LinkDirection {
    pub(crate) config: LinkConfig,
    pub(crate) stats: LinkStats,
    rng: Rng,
    /// When the serializer is next free, in nanoseconds of virtual time
    /// (a 1500-byte frame at 10 Gbit/s takes 1.2 µs, finer than
    /// [`Instant`]'s microsecond).
    busy_until_ns: u128,
    /// Frames waiting for or in serialization: (finish time in ns, bytes).
    queue: std::collections::VecDeque<(u128, usize)>,
    queued_bytes: usize,
    /// Arrival time of the last frame that was not reordered, which later
    /// frames may not precede (the link is FIFO apart from reordering).
    last_in_order_ns: u128,
}

fn duration_ns(d: Duration) -> u128 {
    d.as_nanos()
}

fn instant_ns(t: Instant) -> u128 {
    u128::from(t.total_micros()) * 1000
}

/// Rounds up to the microsecond: a frame never arrives before its time.
fn ns_to_instant(ns: u128) -> Instant {
    Instant::from_micros(u64::try_from(ns.div_ceil(1000)).unwrap_or(u64::MAX))
}

fn uniform_duration(rng: &mut Rng, max: Duration) -> u128 {
    let max_ns = u64::try_from(duration_ns(max)).unwrap_or(u64::MAX);
    u128::from(rng.range_inclusive(0, max_ns))
}

impl LinkDirection {
    pub(crate) fn new(config: LinkConfig, rng: Rng) -> LinkDirection {
        LinkDirection {
            config,
            stats: LinkStats::default(),
            rng,
            busy_until_ns: 0,
            queue: std::collections::VecDeque::new(),
            queued_bytes: 0,
            last_in_order_ns: 0,
        }
    }

    /// Runs `frame` through the stages of the module documentation.
    /// `filter` is the test's drop hook. On delivery the frame (possibly
    /// corrupted) is left in `frame` for the caller to schedule.
    pub(crate) fn offer(
        &mut self,
        now: Instant,
        frame: &mut [u8],
        filter: Option<&mut super::DropFilter>,
    ) -> Fate {
        let len = frame.len();
        self.stats.sent += 1;
        self.stats.sent_bytes += len as u64;

        let header = ethernet_header(frame).map_or(ETHERNET_HEADER_LEN, |(h, _)| h);
        if len > self.config.mtu.saturating_add(header) {
            self.stats.dropped_mtu += 1;
            return Fate::Dropped(DropReason::Mtu);
        }
        if let Some(f) = filter {
            if f(now, frame) {
                self.stats.dropped_filter += 1;
                return Fate::Dropped(DropReason::Filter);
            }
        }

        let now_ns = instant_ns(now);
        let depart_ns = match self.config.bandwidth_bps {
            Some(bps) if bps > 0 => {
                while let Some(&(finish, bytes)) = self.queue.front() {
                    if finish > now_ns {
                        break;
                    }
                    self.queue.pop_front();
                    self.queued_bytes -= bytes;
                }
                if let Some(limit) = self.config.queue_limit_bytes {
                    if self.queued_bytes + len > limit {
                        self.stats.dropped_queue += 1;
                        return Fate::Dropped(DropReason::Queue);
                    }
                }
                let start = now_ns.max(self.busy_until_ns);
                let bits = (len as u128) * 8;
                let finish = start + (bits * 1_000_000_000).div_ceil(u128::from(bps));
                self.busy_until_ns = finish;
                self.queue.push_back((finish, len));
                self.queued_bytes += len;
                self.stats.max_queue_bytes =
                    self.stats.max_queue_bytes.max(self.queued_bytes as u64);
                finish
            }
            _ => now_ns,
        };

        if self.rng.chance(self.config.loss) {
            self.stats.dropped_loss += 1;
            return Fate::Dropped(DropReason::Loss);
        }

        let corrupted = self.rng.chance(self.config.corrupt) && corrupt_frame(&mut self.rng, frame);
        if corrupted {
            self.stats.corrupted += 1;
        }

        let mut at_ns = depart_ns
            + duration_ns(self.config.latency)
            + uniform_duration(&mut self.rng, self.config.jitter);
        let reordered = self.rng.chance(self.config.reorder);
        if reordered {
            at_ns += duration_ns(self.config.reorder_delay);
            self.stats.reordered += 1;
        } else {
            at_ns = at_ns.max(self.last_in_order_ns);
            self.last_in_order_ns = at_ns;
        }
        let at = ns_to_instant(at_ns);

        let duplicate_at = if self.rng.chance(self.config.duplicate) {
            self.stats.duplicated += 1;
            // The copy trails the original by up to 100 µs.
            Some(at + Duration::from_micros(1 + self.rng.below(100)))
        } else {
            None
        };

        Fate::Delivered {
            at,
            duplicate_at,
            corrupted,
            reordered,
        }
    }
}

/// Flips 1–3 bits of `frame` where the Internet checksum must see them
/// (see [`LinkConfig::corrupt`]). Returns whether anything was flipped.
pub(crate) fn corrupt_frame(rng: &mut Rng, frame: &mut [u8]) -> bool {
    let Some((header, ethertype)) = ethernet_header(frame) else {
        return false;
    };
    if frame.len() <= header || ethertype == ETHERTYPE_ARP {
        return false;
    }
    // The IPv4 header starts at an even offset of the frame and the TCP or
    // ICMP header at an even offset after it, so a byte's offset parity in
    // the frame is its half of the checksum's 16-bit word: the word bit
    // ("lane") of bit `b` of byte `i` is `(1 - i % 2) * 8 + b`.
    let body = frame.len() - header;
    let parities: &[usize] = if body >= 2 { &[0, 1] } else { &[0] };
    let mut lanes = [usize::MAX; 3];
    let flips = 1 + usize::try_from(rng.below(3)).unwrap_or(0);
    let lane_count = parities.len() * 8;
    for k in 0..flips.min(lane_count) {
        let lane = loop {
            let l = usize::try_from(rng.below(lane_count as u64)).unwrap_or(0);
            if !lanes[..k].contains(&l) {
                break l;
            }
        };
        lanes[k] = lane;
        let parity = parities[lane / 8];
        let bit = lane % 8;
        // A byte offset of the frame, past the Ethernet header, whose
        // parity is `parity` (the header length is even).
        let slots = (body - parity).div_ceil(2);
        let index = header + parity + 2 * usize::try_from(rng.below(slots as u64)).unwrap_or(0);
        frame[index] ^= 1 << bit;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Internet checksum of `data` (RFC 1071), for checking that the
    /// corruption is always visible to it.
    fn internet_sum(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for pair in data.chunks(2) {
            let w = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
            sum += u32::from(w);
            sum = (sum & 0xffff) + (sum >> 16);
        }
        u16::try_from(sum).unwrap()
    }

    #[test]
    fn corruption_always_changes_the_internet_checksum() {
        let mut rng = Rng::new(3);
        for len in [15usize, 16, 17, 60, 61, 1514] {
            for _ in 0..2000 {
                let mut frame = vec![0u8; len];
                rng.fill_bytes(&mut frame);
                frame[12] = 0x08;
                frame[13] = 0x00;
                let before = frame.clone();
                assert!(corrupt_frame(&mut rng, &mut frame));
                assert_eq!(frame[..14], before[..14], "Ethernet header touched");
                let flipped: u32 = frame
                    .iter()
                    .zip(&before)
                    .map(|(a, b)| (a ^ b).count_ones())
                    .sum();
                assert!((1..=3).contains(&flipped), "{flipped} bits flipped");
                // The checksum region starts at the (even) IPv4 header.
                let a = internet_sum(&before[14..]);
                let b = internet_sum(&frame[14..]);
                // 0x0000 and 0xffff are the same number in ones' complement.
                let norm = |x: u16| if x == 0xffff { 0 } else { x };
                assert_ne!(norm(a), norm(b), "undetectable corruption, len {len}");
            }
        }
    }

    #[test]
    fn tagged_frames_are_corrupted_after_the_tag_and_tagged_arp_is_spared() {
        let mut rng = Rng::new(5);
        for _ in 0..500 {
            let mut frame = vec![0u8; 100];
            frame[12..14].copy_from_slice(&[0x81, 0x00]);
            frame[16..18].copy_from_slice(&[0x08, 0x00]);
            let before = frame.clone();
            assert!(corrupt_frame(&mut rng, &mut frame));
            assert_eq!(frame[..18], before[..18], "tagged header touched");
            assert!(frame[18..].iter().any(|&b| b != 0));
        }
        let mut arp = vec![0u8; 64];
        arp[12..14].copy_from_slice(&[0x81, 0x00]);
        arp[16..18].copy_from_slice(&[0x08, 0x06]);
        assert!(!corrupt_frame(&mut rng, &mut arp));
    }

    #[test]
    fn arp_and_runt_frames_are_spared() {
        let mut rng = Rng::new(4);
        let mut arp = vec![0u8; 42];
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert!(!corrupt_frame(&mut rng, &mut arp));
        assert!(arp[14..].iter().all(|&b| b == 0));
        let mut runt = vec![0u8; 14];
        assert!(!corrupt_frame(&mut rng, &mut runt));
    }
}
