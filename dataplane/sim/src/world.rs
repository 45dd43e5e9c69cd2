//! Two real dataplanes joined by one simulated link, and the means to
//! play their applications in virtual time: waiting for a condition,
//! opening connections between them.

use core::net::{Ipv4Addr, SocketAddrV4};
use core::time::Duration;

use dataplane::api::{CmEvent, ConnectParams, ManualTime, Qp};
use dataplane::config::{Config, LimitsConfig, MacAddr, MpaConfig, Neighbor, TcpConfig};
use dataplane::link::{MemLink, MemLinkConfig};
use dataplane::Dataplane;
use tcp_offload::wire::EthernetAddress;
use tcp_offload::Instant;
use tcp_sim::{Link, LinkConfig, Network, NodeId, SimError};

use crate::node::Node;

/// The two sides' addresses.
pub const MAC: [EthernetAddress; 2] = [
    EthernetAddress([2, 0, 0, 0, 0, 0xa]),
    EthernetAddress([2, 0, 0, 0, 0, 0xb]),
];
/// The two sides' IPv4 addresses.
pub const IP: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 88, 0, 1), Ipv4Addr::new(10, 88, 0, 2)];
/// The port side B listens on.
pub const PORT: u16 = 4791;

/// How a [`World`] is built.
#[derive(Debug, Clone)]
pub struct WorldSpec {
    /// Seeds the links' generators and the dataplanes' ISN secrets.
    pub seed: u64,
    /// Workers of side A and side B.
    pub workers: [usize; 2],
    /// The IP MTU of both ports and of the link.
    pub mtu: usize,
    /// TCP options of both sides.
    pub tcp: TcpConfig,
    /// MPA options of side A and side B.
    pub mpa: [MpaConfig; 2],
    /// The link, both directions (its MTU is set from [`WorldSpec::mtu`]).
    pub link: LinkConfig,
    /// Static neighbour entries instead of ARP.
    pub static_arp: bool,
    /// Frames one transmit burst of a port takes at most (0: all), the
    /// rest left with the worker as a device with a full ring leaves them.
    pub tx_burst_max: usize,
    /// Side A's and side B's ports copy every payload into the frame (no
    /// multi-segment transmit): the MPA CRC and the TCP checksum are then
    /// computed in that copy's pass.
    pub copy_tx: [bool; 2],
    /// Both sides' resource limits (queue pairs, completion queue sizes).
    pub limits: LimitsConfig,
    /// Static neighbour entries of side A and side B besides the peer's.
    pub neighbors: [Vec<Neighbor>; 2],
}

impl WorldSpec {
    /// One worker a side, default options, a perfect link.
    pub fn new(seed: u64) -> WorldSpec {
        WorldSpec {
            seed,
            workers: [1, 1],
            mtu: 1500,
            tcp: TcpConfig::default(),
            mpa: [MpaConfig::default(), MpaConfig::default()],
            link: LinkConfig::perfect(),
            static_arp: false,
            tx_burst_max: 0,
            copy_tx: [false, false],
            limits: LimitsConfig::default(),
            neighbors: [Vec::new(), Vec::new()],
        }
    }
}

/// Two dataplanes, side A (index 0) and side B (index 1), on one link.
#[derive(Debug)]
pub struct World {
    net: Network<Node>,
    nodes: [NodeId; 2],
    link: Link,
}

fn config(spec: &WorldSpec, side: usize) -> Config {
    let mut c = Config::single("mem:sim", IP[side], MAC[side]);
    c.workers.count = spec.workers[side];
    c.ports[0].mtu = spec.mtu;
    c.tcp = spec.tcp;
    c.mpa = spec.mpa[side].clone();
    c.limits = spec.limits;
    c.ports[0]
        .neighbors
        .extend(spec.neighbors[side].iter().copied());
    if spec.static_arp {
        c.ports[0].neighbors.push(Neighbor {
            ip: IP[1 - side],
            mac: MacAddr(MAC[1 - side]),
        });
    }
    c
}

impl World {
    /// Opens both dataplanes and connects them.
    ///
    /// # Errors
    /// A dataplane refused its configuration.
    pub fn new(spec: &WorldSpec) -> Result<World, String> {
        let mut net = Network::new(spec.seed);
        let mut nodes = Vec::new();
        for (side, &mac) in MAC.iter().enumerate() {
            let link = MemLinkConfig {
                queues: spec.workers[side] as u16,
                mtu: spec.mtu,
                tx_burst_max: spec.tx_burst_max,
                multi_seg_tx: !spec.copy_tx[side],
                ..MemLinkConfig::default()
            };
            let (link, port) = MemLink::external(&link, mac);
            let time = ManualTime::new();
            let mut secret = [0u8; 16];
            secret[..8].copy_from_slice(&spec.seed.to_le_bytes());
            secret[8] = side as u8;
            let dp = Dataplane::open_simulated(&config(spec, side), link, &time, secret)
                .map_err(|e| format!("side {side}: {e}"))?;
            nodes.push(net.add_endpoint(Node::new(dp, port, time)));
        }
        let link = net.connect(nodes[0], nodes[1], spec.link.clone().with_mtu(spec.mtu));
        Ok(World {
            net,
            nodes: [nodes[0], nodes[1]],
            link,
        })
    }

    /// Side `side`'s dataplane.
    pub fn dp(&self, side: usize) -> &Dataplane {
        self.net.endpoint(self.nodes[side]).dp()
    }

    /// Side `side`'s node.
    pub fn node(&self, side: usize) -> &Node {
        self.net.endpoint(self.nodes[side])
    }

    /// The network (link statistics, capture).
    pub fn net(&mut self) -> &mut Network<Node> {
        &mut self.net
    }

    /// Side A's and side B's nodes in [`World::net`].
    pub fn node_ids(&self) -> [NodeId; 2] {
        self.nodes
    }

    /// The link between the two sides.
    pub fn link(&self) -> Link {
        self.link
    }

    /// Virtual time now.
    pub fn now(&self) -> Instant {
        self.net.now()
    }

    /// Runs the network until `done(a, b, now)` says `Ok(true)`, at most
    /// `limit` of virtual time. `done` plays both applications once per
    /// round.
    ///
    /// # Errors
    /// What `done` returned, or that `what` did not happen in time.
    pub fn run_until(
        &mut self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&Dataplane, &Dataplane, Instant) -> Result<bool, String>,
    ) -> Result<(), String> {
        let deadline = self.net.now() + limit;
        let [a, b] = self.nodes;
        let mut failure = None;
        let r = self.net.run_until(deadline, |net| {
            let now = net.now();
            match done(net.endpoint(a).dp(), net.endpoint(b).dp(), now) {
                Ok(d) => d,
                Err(e) => {
                    failure = Some(e);
                    true
                }
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        match r {
            Ok(_) => Ok(()),
            Err(SimError::Deadline { now }) => Err(format!(
                "{what}: not done after {limit:?} of virtual time (now {now})"
            )),
            Err(e) => Err(format!("{what}: {e}")),
        }
    }

    /// Runs `d` of virtual time with nothing to play.
    pub fn idle(&mut self, d: Duration) -> Result<(), String> {
        let end = self.net.now() + d;
        match self.run_until("idle", d + Duration::from_millis(1), |_, _, now| {
            Ok(now >= end)
        }) {
            Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Connects `qps[0]` on side A to `qps[1]` on side B, which listens on
    /// [`PORT`] (call [`Dataplane::listen`] first); both ends established.
    ///
    /// # Errors
    /// An unexpected event, a refused call, or no connection within a
    /// minute of virtual time.
    pub fn connect(&mut self, qps: [&Qp; 2], params: &ConnectParams) -> Result<(), String> {
        self.dp(0)
            .connect(qps[0], SocketAddrV4::new(IP[1], PORT), params)
            .map_err(|e| format!("connect: {e}"))?;
        let mut up = [false, false];
        self.run_until(
            "both ends established",
            Duration::from_secs(60),
            |a, b, _| {
                while let Some(e) = b.poll_event() {
                    match e {
                        CmEvent::ConnectRequest(req) => b
                            .accept(&req, qps[1], params)
                            .map_err(|e| format!("accept: {e}"))?,
                        CmEvent::Established { qp, .. } if qp == qps[1].num() => up[1] = true,
                        CmEvent::MrDeregistered(_) => {}
                        other => return Err(format!("side B while connecting: {other:?}")),
                    }
                }
                while let Some(e) = a.poll_event() {
                    match e {
                        CmEvent::Established { qp, .. } if qp == qps[0].num() => up[0] = true,
                        CmEvent::MrDeregistered(_) => {}
                        other => return Err(format!("side A while connecting: {other:?}")),
                    }
                }
                Ok(up[0] && up[1])
            },
        )
    }
}
