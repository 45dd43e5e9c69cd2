//! The engine's [`Interface`] as a simulated endpoint.
//!
//! The adapter owns the interface and lends it a frame buffer for each
//! transmitted frame; received frames go in as they are (`Vec<u8>`), and
//! their payload stays in them until the application reads it, as it
//! stays in an mbuf in the dataplane.

use core::net::Ipv4Addr;

use super::network::Endpoint;
use tcp_offload::iface::{Interface, InterfaceConfig};
use tcp_offload::tcp::Config;
use tcp_offload::time::Instant;
use tcp_offload::wire::EthernetAddress;

/// The interface type the simulator runs: frames and records are owned
/// byte vectors.
pub type SimInterface = Interface<Vec<u8>, Vec<u8>>;

/// Room a transmit buffer keeps beyond the IP MTU: the Ethernet header
/// and a VLAN tag.
const FRAME_OVERHEAD: usize = 18;

/// An [`Interface`] plugged into a [`Network`](super::Network).
#[derive(Debug)]
pub struct Host {
    iface: SimInterface,
    /// The next transmit buffer, kept when `poll_frame` had nothing to
    /// send so that idle polls do not allocate.
    spare: Vec<u8>,
}

impl Host {
    /// Wraps an interface.
    pub fn new(iface: SimInterface) -> Host {
        Host {
            iface,
            spare: Vec::new(),
        }
    }

    /// Host number `n` of a simulation: MAC `02:00:00:00:00:n`, IP
    /// `10.0.0.n`, MTU 1500, TCP configuration `tcp`, and a key derived
    /// from `seed` and `n`.
    pub fn numbered(n: u8, tcp: Config, seed: u64) -> Host {
        let mut key = [0u8; 16];
        super::rng::Rng::derive(seed, 0x4b45_5900 | u64::from(n)).fill_bytes(&mut key);
        let mut config = InterfaceConfig::new(Host::mac_of(n), Host::ip_of(n), key);
        config.tcp = tcp;
        Host::new(Interface::new(config))
    }

    /// The MAC address of host `n` (see [`Host::numbered`]).
    pub const fn mac_of(n: u8) -> EthernetAddress {
        EthernetAddress([0x02, 0, 0, 0, 0, n])
    }

    /// The IP address of host `n` (see [`Host::numbered`]).
    pub const fn ip_of(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, n)
    }

    /// The interface.
    pub fn iface(&self) -> &SimInterface {
        &self.iface
    }

    /// The interface, to reach its stack and connections.
    pub fn iface_mut(&mut self) -> &mut SimInterface {
        &mut self.iface
    }

    /// Gives the interface back.
    pub fn into_inner(self) -> SimInterface {
        self.iface
    }
}

impl Endpoint for Host {
    fn handle_frame(&mut self, now: Instant, frame: Vec<u8>) {
        self.iface.handle_frame(now, frame);
    }

    fn poll_frame(&mut self, now: Instant) -> Option<Vec<u8>> {
        let size = self.iface.config().mtu + FRAME_OVERHEAD;
        let mut buf = core::mem::take(&mut self.spare);
        buf.resize(size, 0);
        match self.iface.poll_frame(now, &mut buf) {
            Some(n) => {
                buf.truncate(n);
                Some(buf)
            }
            None => {
                self.spare = buf;
                None
            }
        }
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        self.iface.poll_timeout()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.iface.handle_timeout(now);
    }
}
