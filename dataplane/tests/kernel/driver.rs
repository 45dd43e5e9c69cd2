//! The I/O loop around the sans-IO engine: frames from the raw socket go
//! to `Interface::handle_frame`, timers run on a real clock, and whatever
//! `Interface::poll_frame` produces goes back out. Optional seeded loss
//! drops TCP frames on the way in and out, to exercise recovery against
//! the kernel, and optional seeded reordering holds some back for a while
//! (what netem's `reorder` does on a real path) while later ones pass.

use std::collections::VecDeque;
use std::io;
use std::time::Duration;

use tcp_offload::iface::{Interface, InterfaceConfig};
use tcp_offload::tcp::Config;
use tcp_offload::time::Instant;
use tcp_offload::wire::{
    Checksum, EtherType, EthernetAddress, EthernetFrame, IpProtocol, Ipv4Packet, TcpPacket, TcpRepr,
};

use super::raw::RawSocket;
use crate::netns_common::Netns;

/// Frames read per turn before timers, the application and transmission
/// get their turn: bounds how long our ACKs wait behind a burst.
pub const RX_BURST: usize = 64;

/// Longest sleep when idle. The clock is real, so oversleeping delays
/// timers; a millisecond is below any TCP timer's resolution.
pub const MAX_IDLE: Duration = Duration::from_millis(1);

/// Largest frame on the veth (MTU 1500 + Ethernet header), with room for a
/// VLAN tag.
pub const FRAME_BUF: usize = 1536;

/// A splitmix64 generator: tiny, seeded, reproducible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        // 53 random bits as a fraction in [0, 1).
        ((self.next_u64() >> 11) as f64) / ((1u64 << 53) as f64) < p
    }
}

/// Loss injected on our side. Only TCP frames are dropped: ARP and ICMP
/// pass, so that the test measures TCP recovery and not ARP retries.
#[derive(Debug, Clone, Copy)]
pub struct Loss {
    /// Probability of dropping a received TCP frame.
    pub rx: f64,
    /// Probability of dropping a TCP frame we send.
    pub tx: f64,
    pub seed: u64,
    /// Probability of holding a TCP frame back (either way) for `hold`
    /// while later frames pass; 0 in the raw-socket driver's plain loss
    /// runs. Only the raw-socket driver reorders.
    pub reorder: f64,
    /// How long a held frame waits.
    pub hold: Duration,
}

/// Counters of the driver itself (the interface and connections keep
/// their own).
#[derive(Debug, Clone, Copy, Default)]
pub struct DriverStats {
    pub rx_frames: u64,
    pub tx_frames: u64,
    /// Received TCP frames held back by injected reordering.
    pub rx_reordered: u64,
    /// Of those, the ones whose timestamp was two ticks or more behind
    /// the newest passed on before them when they were passed on: the
    /// only ones a PAWS check with Linux's one-tick window may drop (how
    /// many there are depends on how long this thread was kept from
    /// reading, i.e. on the machine's load).
    pub rx_held_stale: u64,
    /// Sent TCP frames held back by injected reordering.
    pub tx_reordered: u64,
    /// Received TCP frames dropped by injected loss.
    pub rx_injected_drops: u64,
    /// Sent TCP frames dropped by injected loss.
    pub tx_injected_drops: u64,
    /// Frames the kernel had no room for on transmit.
    pub tx_no_room: u64,
    /// Frames the raw socket's receive queue overflowed with (kernel
    /// PACKET_STATISTICS), i.e. real loss on our side.
    pub rx_socket_drops: u64,
}

/// The engine on the raw socket.
#[derive(Debug)]
pub struct Driver {
    pub sock: RawSocket,
    pub iface: Interface<Vec<u8>, Vec<u8>>,
    epoch: std::time::Instant,
    loss: Option<(Loss, Rng, Rng)>,
    /// Frames held back by reordering, with when they go on, in order.
    rx_held: VecDeque<(Instant, Vec<u8>)>,
    tx_held: VecDeque<(Instant, Vec<u8>)>,
    /// The newest timestamp value among the received TCP frames passed
    /// on so far.
    rx_newest_ts: Option<u32>,
    tx_buf: Vec<u8>,
    pub stats: DriverStats,
}

fn is_tcp(frame: &[u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    if eth.payload_ethertype() != EtherType::Ipv4 {
        return false;
    }
    Ipv4Packet::new_checked(eth.payload()).is_ok_and(|ip| ip.next_header() == IpProtocol::Tcp)
}

/// The timestamp value (RFC 7323) of a TCP frame that carries one.
fn tsval(frame: &[u8]) -> Option<u32> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    let repr = TcpRepr::parse(&tcp, ip.src_addr(), ip.dst_addr(), Checksum::Trusted).ok()?;
    repr.options.timestamp.map(|t| t.tsval)
}

impl Driver {
    /// An interface owning `net.our_ip` with its own MAC, on `net.host_if`.
    pub fn new(net: &Netns, tcp: Config, loss: Option<Loss>) -> io::Result<Driver> {
        let sock = RawSocket::open(&net.host_if)?;
        let mut key = [0u8; 16];
        for (i, b) in key.iter_mut().enumerate() {
            // Any fixed key will do for a test; vary it by address so that
            // ISNs differ between namespaces.
            *b = net.our_ip.octets()[2] ^ (i as u8).wrapping_mul(37);
        }
        let mut config = InterfaceConfig::new(EthernetAddress(net.our_mac()), net.our_ip, key);
        config.tcp = tcp;
        Ok(Driver {
            sock,
            iface: Interface::new(config),
            epoch: std::time::Instant::now(),
            loss: loss.map(|l| {
                (
                    l,
                    Rng::new(l.seed),
                    Rng::new(l.seed ^ 0x5555_AAAA_5555_AAAA),
                )
            }),
            rx_held: VecDeque::new(),
            tx_held: VecDeque::new(),
            rx_newest_ts: None,
            tx_buf: vec![0u8; FRAME_BUF],
            stats: DriverStats::default(),
        })
    }

    /// The engine's clock: microseconds since the driver was made.
    pub fn now(&self) -> Instant {
        Instant::from_micros(u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX))
    }

    /// Reads up to [`RX_BURST`] frames into the interface; returns how
    /// many were read.
    pub fn receive(&mut self) -> io::Result<usize> {
        let mut n = 0;
        let now = self.now();
        while self.rx_held.front().is_some_and(|(due, _)| *due <= now) {
            let (_, frame) = self.rx_held.pop_front().expect("checked");
            let ts = tsval(&frame);
            if let (Some(ts), Some(newest)) = (ts, self.rx_newest_ts) {
                if newest.wrapping_sub(ts) as i32 >= 2 {
                    self.stats.rx_held_stale += 1;
                }
            }
            self.pass_on(now, frame, ts);
            n += 1;
        }
        while n < RX_BURST {
            let mut frame = vec![0u8; FRAME_BUF];
            let Some(len) = self.sock.recv(&mut frame)? else {
                break;
            };
            frame.truncate(len);
            n += 1;
            self.stats.rx_frames += 1;
            let now = self.now();
            if let Some((loss, rng, _)) = &mut self.loss {
                if is_tcp(&frame) && rng.chance(loss.rx) {
                    self.stats.rx_injected_drops += 1;
                    continue;
                }
                if is_tcp(&frame) && rng.chance(loss.reorder) {
                    self.stats.rx_reordered += 1;
                    self.rx_held.push_back((now + loss.hold, frame));
                    continue;
                }
            }
            let ts = tsval(&frame);
            self.pass_on(now, frame, ts);
        }
        Ok(n)
    }

    /// Hands a received frame to the interface, noting its timestamp
    /// `ts` (its [`tsval`]).
    fn pass_on(&mut self, now: Instant, frame: Vec<u8>, ts: Option<u32>) {
        if let Some(ts) = ts {
            let newer = self
                .rx_newest_ts
                .is_none_or(|n| ts.wrapping_sub(n) as i32 > 0);
            if newer {
                self.rx_newest_ts = Some(ts);
            }
        }
        self.iface.handle_frame(now, frame);
    }

    /// Runs the interface's timers if one is due.
    pub fn run_timers(&mut self) {
        let now = self.now();
        if self.iface.poll_timeout().is_some_and(|t| t <= now) {
            self.iface.handle_timeout(now);
        }
    }

    /// Sends everything the interface has to send; returns how many
    /// frames it produced.
    pub fn transmit(&mut self) -> io::Result<usize> {
        let mut n = 0;
        let now = self.now();
        while self.tx_held.front().is_some_and(|(due, _)| *due <= now) {
            let (_, frame) = self.tx_held.pop_front().expect("checked");
            if self.sock.send(&frame)? {
                self.stats.tx_frames += 1;
            } else {
                self.stats.tx_no_room += 1;
            }
        }
        loop {
            let now = self.now();
            let Some(len) = self.iface.poll_frame(now, &mut self.tx_buf) else {
                break;
            };
            n += 1;
            let frame = &self.tx_buf[..len];
            if let Some((loss, _, rng)) = &mut self.loss {
                if is_tcp(frame) && rng.chance(loss.tx) {
                    self.stats.tx_injected_drops += 1;
                    continue;
                }
                if is_tcp(frame) && rng.chance(loss.reorder) {
                    self.stats.tx_reordered += 1;
                    self.tx_held.push_back((now + loss.hold, frame.to_vec()));
                    continue;
                }
            }
            if self.sock.send(frame)? {
                self.stats.tx_frames += 1;
            } else {
                self.stats.tx_no_room += 1;
            }
        }
        Ok(n)
    }

    /// Sleeps until a frame arrives, the next timer is due, or
    /// [`MAX_IDLE`] passes.
    pub fn wait(&mut self) -> io::Result<()> {
        let now = self.now();
        let held = [self.rx_held.front(), self.tx_held.front()]
            .into_iter()
            .flatten()
            .map(|(due, _)| *due)
            .min();
        let wait = match self.iface.poll_timeout().into_iter().chain(held).min() {
            Some(t) if t <= now => return Ok(()),
            Some(t) => (t - now).min(MAX_IDLE),
            None => MAX_IDLE,
        };
        self.sock.wait_readable(wait)
    }

    /// Folds the raw socket's drop counter into [`DriverStats`].
    pub fn update_socket_drops(&mut self) {
        if let Ok(drops) = self.sock.take_drops() {
            self.stats.rx_socket_drops += drops;
        }
    }
}
