//! The I/O loop around the sans-IO engine over a DPDK port instead of a
//! raw socket: `net_af_packet` on our end of the veth, frames taken with
//! `rx_burst` into `Interface::handle_frame`, and whatever
//! `Interface::poll_frame` produces copied into an mbuf and sent with
//! `tx_burst`. This is the dataplane's port and queue code under the TCP
//! engine, below the RDMA layer, so that the kernel's plain TCP can be
//! the peer. Seeded loss drops TCP frames on our side, both ways.
//!
//! Included from the test file with `#[path]` (not from `kernel/mod.rs`),
//! so the raw-socket tests do not build it.
//!
//! EAL starts once per process: each test using this runs in a process of
//! its own (cargo-nextest).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dataplane::dpdk_link::{
    default_eal_args, start_eal, DpdkFrame, DpdkLink, DpdkLinkOptions, DpdkQueue, DpdkRxBuf,
};
use dataplane::link::{Link, LinkQueue, TxFrame};
use dpdk_bindings::Eal;
use tcp_offload::iface::{Interface, InterfaceConfig};
use tcp_offload::tcp::Config;
use tcp_offload::time::Instant;
use tcp_offload::wire::EthernetAddress;

use tcp_offload::wire::{EtherType, EthernetFrame, IpProtocol, Ipv4Packet};

use crate::kernel::driver::{DriverStats, Loss, Rng, FRAME_BUF, RX_BURST};
use crate::kernel::transfer::Engine;
use crate::netns_common::Netns;

/// Longest sleep when idle: DPDK has no descriptor to wait on, so an idle
/// loop naps briefly instead of spinning a core the kernel peer needs.
pub const IDLE_NAP: Duration = Duration::from_micros(50);

/// Whether `frame` carries TCP: only TCP is dropped by injected loss, so
/// that ARP and ICMP pass and the test measures TCP recovery.
fn is_tcp_frame(frame: &[u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    eth.payload_ethertype() == EtherType::Ipv4
        && Ipv4Packet::new_checked(eth.payload())
            .is_ok_and(|ip| ip.next_header() == IpProtocol::Tcp)
}

/// The EAL runtime directory of `prefix` (we are root:
/// `/var/run/dpdk/<prefix>`), removed on drop in case a failing test never
/// let EAL clean up after itself.
#[derive(Debug)]
pub struct RuntimeDirGuard(pub PathBuf);

impl Drop for RuntimeDirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The engine on a DPDK `net_af_packet` port over `net.host_if`.
#[derive(Debug)]
pub struct DpdkDriver {
    /// Declared first: the queue goes before the link, the link before
    /// EAL.
    queue: DpdkQueue,
    link: DpdkLink,
    pub iface: Interface<Vec<u8>, Vec<u8>>,
    epoch: std::time::Instant,
    loss: Option<(Loss, Rng, Rng)>,
    rx: Vec<DpdkRxBuf>,
    tx: Vec<DpdkFrame>,
    tx_buf: Vec<u8>,
    pub stats: DriverStats,
}

impl DpdkDriver {
    /// Starts EAL (runtime files under `prefix`) with one `net_af_packet`
    /// port on `net.host_if`, and an interface owning `net.our_ip` with
    /// [`Netns::our_mac`] on it.
    pub fn new(
        net: &Netns,
        prefix: &str,
        tcp: Config,
        loss: Option<Loss>,
    ) -> Result<(DpdkDriver, Arc<Eal>), String> {
        let vdev = format!("net_af_packet0,iface={},qpairs=1", net.host_if);
        let args = default_eal_args(prefix, &[&vdev]);
        let eal = start_eal(&args).map_err(|e| format!("EAL {args:?}: {e}"))?;
        let opts = DpdkLinkOptions {
            mac: Some(EthernetAddress(net.our_mac())),
            ..DpdkLinkOptions::default()
        };
        let mut link = DpdkLink::open(&eal, &vdev, &opts).map_err(|e| format!("port: {e}"))?;
        let queue = link.take_queue(0).ok_or("no queue 0")?;
        let mut key = [0u8; 16];
        for (i, b) in key.iter_mut().enumerate() {
            *b = net.our_ip.octets()[2] ^ (i as u8).wrapping_mul(41);
        }
        let mut config = InterfaceConfig::new(EthernetAddress(net.our_mac()), net.our_ip, key);
        config.tcp = tcp;
        let driver = DpdkDriver {
            queue,
            link,
            iface: Interface::new(config),
            epoch: std::time::Instant::now(),
            loss: loss.map(|l| {
                assert!(
                    l.reorder == 0.0,
                    "the DPDK driver injects loss only, not reordering"
                );
                (
                    l,
                    Rng::new(l.seed),
                    Rng::new(l.seed ^ 0x5555_AAAA_5555_AAAA),
                )
            }),
            rx: Vec::with_capacity(RX_BURST),
            tx: Vec::with_capacity(RX_BURST),
            tx_buf: vec![0u8; FRAME_BUF],
            stats: DriverStats::default(),
        };
        Ok((driver, eal))
    }

    /// The loss it injects, if any.
    pub fn loss(&self) -> Option<Loss> {
        self.loss.as_ref().map(|(l, _, _)| *l)
    }

    /// The DPDK link (its setup and counters).
    pub fn link(&self) -> &DpdkLink {
        &self.link
    }

    /// The engine's clock: microseconds since the driver was made.
    pub fn now(&self) -> Instant {
        Instant::from_micros(u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX))
    }

    /// One RX burst into the interface; returns how many frames came.
    pub fn receive(&mut self) -> usize {
        let n = self.queue.rx_burst(&mut self.rx, RX_BURST);
        for m in self.rx.drain(..) {
            self.stats.rx_frames += 1;
            let bytes = m.as_ref();
            if let Some((loss, rng, _)) = &mut self.loss {
                if is_tcp_frame(bytes) && rng.chance(loss.rx) {
                    self.stats.rx_injected_drops += 1;
                    continue;
                }
            }
            // The mbuf goes back to the pool at once; the engine keeps
            // its own copy for as long as reassembly needs it.
            let frame = bytes.to_vec();
            drop(m);
            let now = Instant::from_micros(
                u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX),
            );
            self.iface.handle_frame(now, frame);
        }
        n
    }

    /// Runs the interface's timers if one is due.
    pub fn run_timers(&mut self) {
        let now = self.now();
        if self.iface.poll_timeout().is_some_and(|t| t <= now) {
            self.iface.handle_timeout(now);
        }
    }

    /// Sends what the interface has to send, a burst at a time; returns
    /// how many frames it produced.
    pub fn transmit(&mut self) -> usize {
        let mut n = 0;
        loop {
            let now = self.now();
            let Some(len) = self.iface.poll_frame(now, &mut self.tx_buf) else {
                break;
            };
            n += 1;
            let frame = &self.tx_buf[..len];
            if let Some((loss, _, rng)) = &mut self.loss {
                if is_tcp_frame(frame) && rng.chance(loss.tx) {
                    self.stats.tx_injected_drops += 1;
                    continue;
                }
            }
            let Some(mut m) = self.queue.alloc_tx() else {
                self.stats.tx_no_room += 1;
                continue;
            };
            if m.append(frame).is_err() {
                self.stats.tx_no_room += 1;
                continue;
            }
            self.tx.push(m);
            if self.tx.len() >= RX_BURST {
                self.flush();
            }
        }
        self.flush();
        n
    }

    /// Hands the pending frames to the device; what it refuses is dropped
    /// (TCP retransmits), as a full NIC queue would.
    fn flush(&mut self) {
        if self.tx.is_empty() {
            return;
        }
        let sent = self.queue.tx_burst(&mut self.tx);
        self.stats.tx_frames += sent as u64;
        self.stats.tx_no_room += self.tx.len() as u64;
        self.tx.clear();
    }

    /// Naps until the next timer or [`IDLE_NAP`], whichever comes first.
    pub fn wait(&mut self) {
        let now = self.now();
        let nap = match self.iface.poll_timeout() {
            Some(t) if t <= now => return,
            Some(t) => (t - now).min(IDLE_NAP),
            None => IDLE_NAP,
        };
        std::thread::sleep(nap);
    }
}

impl Engine for DpdkDriver {
    fn iface(&self) -> &Interface<Vec<u8>, Vec<u8>> {
        &self.iface
    }
    fn iface_mut(&mut self) -> &mut Interface<Vec<u8>, Vec<u8>> {
        &mut self.iface
    }
    fn now(&self) -> Instant {
        DpdkDriver::now(self)
    }
    fn receive(&mut self) -> Result<usize, String> {
        Ok(DpdkDriver::receive(self))
    }
    fn run_timers(&mut self) {
        DpdkDriver::run_timers(self);
    }
    fn transmit(&mut self) -> Result<usize, String> {
        Ok(DpdkDriver::transmit(self))
    }
    fn wait(&mut self) -> Result<(), String> {
        DpdkDriver::wait(self);
        Ok(())
    }
    fn stats(&mut self) -> DriverStats {
        self.stats
    }
}
