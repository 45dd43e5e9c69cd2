//! The network: endpoints, learning switches and the links between them,
//! driven on virtual time by an event queue.
//!
//! Time jumps from one event to the next: a frame arrival, an endpoint
//! timer, or a wake-up the test asked for. Events at the same instant run
//! in the order they were scheduled (the queue is ordered by time, then by
//! a sequence number), so a run is a pure function of the seed, the
//! topology and what the endpoints do.

use core::cmp::Ordering;
use core::fmt;
use std::collections::{BTreeMap, BinaryHeap};

use super::link::{DropReason, Fate, LinkConfig, LinkDirection, LinkStats};
use super::rng::Rng;
use tcp_offload::time::Instant;

/// A network endpoint: a host with one Ethernet port. Frames are owned
/// buffers; the simulator moves them, it never looks inside except for
/// the switch's MAC learning and the link's corruption rules.
///
/// The same shape as the engine's own interfaces: inputs are `handle_*`,
/// outputs `poll_*`, and time is an argument.
pub trait Endpoint {
    /// A frame arrived.
    fn handle_frame(&mut self, now: Instant, frame: Vec<u8>);
    /// The next frame to put on the wire, if any.
    fn poll_frame(&mut self, now: Instant) -> Option<Vec<u8>>;
    /// When [`Endpoint::handle_timeout`] must next be called, if ever.
    fn poll_timeout(&mut self) -> Option<Instant>;
    /// Runs the timers due at `now`.
    fn handle_timeout(&mut self, now: Instant);
}

impl<E: Endpoint + ?Sized> Endpoint for Box<E> {
    fn handle_frame(&mut self, now: Instant, frame: Vec<u8>) {
        (**self).handle_frame(now, frame);
    }
    fn poll_frame(&mut self, now: Instant) -> Option<Vec<u8>> {
        (**self).poll_frame(now)
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        (**self).poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant) {
        (**self).handle_timeout(now);
    }
}

/// A test's hook to drop chosen frames on one link direction: called with
/// the time and the frame as sent; `true` drops it.
pub type DropFilter = Box<dyn FnMut(Instant, &[u8]) -> bool>;

/// An endpoint or a switch of a [`Network`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

/// One direction of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DirId(pub usize);

/// The two directions of a link made by [`Network::connect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Link {
    /// From the first node given to `connect` to the second.
    pub forward: DirId,
    /// From the second node to the first.
    pub backward: DirId,
}

/// Why a run stopped before its condition held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimError {
    /// The next event lies after the deadline; time stopped at the
    /// deadline.
    Deadline { now: Instant },
    /// Nothing is scheduled any more: no frame in flight, no timer, no
    /// wake-up. The condition can never become true.
    Idle { now: Instant },
    /// Time stopped advancing: an endpoint kept asking for a timeout at or
    /// before `now` after it was run, or kept emitting frames. A bug in
    /// the endpoint.
    Livelock { now: Instant },
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Deadline { now } => write!(f, "deadline reached at {now}"),
            SimError::Idle { now } => write!(f, "network idle at {now}"),
            SimError::Livelock { now } => write!(f, "time stopped advancing at {now}"),
        }
    }
}

impl std::error::Error for SimError {}

/// A frame as it was offered to a link, and what became of it. Recorded
/// when capture is on ([`Network::enable_capture`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// When the frame was offered.
    pub at: Instant,
    /// The direction it was offered to.
    pub dir: DirId,
    /// The frame as sent (before any corruption).
    pub frame: Vec<u8>,
    /// What the link did with it.
    pub fate: Fate,
}

/// Rounds at one instant after which time is declared stuck. Far above
/// what any protocol exchange needs at a single instant (a zero-latency
/// link bounces frames back and forth, each bounce one round).
const LIVELOCK_ROUNDS: u32 = 100_000;

/// Frames one endpoint may emit in one drain before it is declared stuck:
/// far more than any window of frames, finite so that a bug shows up as a
/// [`SimError::Livelock`] instead of a hang.
const MAX_FRAMES_PER_DRAIN: usize = 1 << 20;

#[derive(Debug, Default)]
struct Switch {
    /// Outgoing direction of each port.
    ports: Vec<DirId>,
    /// Learned MAC → port.
    table: BTreeMap<[u8; 6], usize>,
}

#[derive(Debug)]
enum Node<E> {
    Endpoint { endpoint: E, port: Option<DirId> },
    Switch(Switch),
}

struct Direction {
    to: NodeId,
    /// The port index at `to` when `to` is a switch.
    to_port: usize,
    link: LinkDirection,
    filter: Option<DropFilter>,
}

impl fmt::Debug for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Direction")
            .field("to", &self.to)
            .field("link", &self.link)
            .field("filter", &self.filter.is_some())
            .finish()
    }
}

#[derive(Debug)]
enum EventKind {
    Arrival { dir: DirId, frame: Vec<u8> },
    Wakeup,
}

#[derive(Debug)]
struct Event {
    at: Instant,
    seq: u64,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Event) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Event {}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Event) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Event {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest.
    fn cmp(&self, other: &Event) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// A simulated Ethernet network of endpoints of type `E`.
///
/// Build it with [`Network::add_endpoint`], [`Network::add_switch`] and
/// [`Network::connect`]; drive it with [`Network::run_until`] (or
/// [`Network::poll`] and [`Network::advance`] by hand). Between rounds the
/// test may reach into its endpoints through [`Network::endpoint_mut`] to
/// play the application.
///
/// Misuse of the builder (connecting an endpoint twice, a node id from
/// another network) panics: this is test infrastructure, and such a test
/// is wrong.
pub struct Network<E = Box<dyn Endpoint>> {
    seed: u64,
    now: Instant,
    nodes: Vec<Node<E>>,
    dirs: Vec<Direction>,
    events: BinaryHeap<Event>,
    next_seq: u64,
    capture: Option<Vec<Captured>>,
    livelocked: bool,
    /// Frames an endpoint emitted while it had no link.
    unconnected_drops: u64,
}

impl<E: fmt::Debug> fmt::Debug for Network<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Network")
            .field("seed", &self.seed)
            .field("now", &self.now)
            .field("nodes", &self.nodes)
            .field("dirs", &self.dirs)
            .field("pending_events", &self.events.len())
            .finish_non_exhaustive()
    }
}

impl<E: Endpoint> Network<E> {
    /// An empty network at time zero whose link generators derive from
    /// `seed`.
    pub fn new(seed: u64) -> Network<E> {
        Network {
            seed,
            now: Instant::ZERO,
            nodes: Vec::new(),
            dirs: Vec::new(),
            events: BinaryHeap::new(),
            next_seq: 0,
            capture: None,
            livelocked: false,
            unconnected_drops: 0,
        }
    }

    /// The master seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Adds an endpoint; connect it with [`Network::connect`].
    pub fn add_endpoint(&mut self, endpoint: E) -> NodeId {
        self.nodes.push(Node::Endpoint {
            endpoint,
            port: None,
        });
        NodeId(self.nodes.len() - 1)
    }

    /// Adds a learning switch: it forwards a frame to the port where the
    /// destination MAC was last seen as a source, and floods broadcast,
    /// multicast and unknown destinations to every other port.
    pub fn add_switch(&mut self) -> NodeId {
        self.nodes.push(Node::Switch(Switch::default()));
        NodeId(self.nodes.len() - 1)
    }

    /// Connects two nodes with a link whose two directions both use
    /// `config` (each with its own generator).
    ///
    /// # Panics
    /// If an endpoint is already connected, or `a == b`.
    pub fn connect(&mut self, a: NodeId, b: NodeId, config: LinkConfig) -> Link {
        self.connect_asymmetric(a, b, config.clone(), config)
    }

    /// Connects two nodes; `a_to_b` applies from `a` to `b`, `b_to_a` back.
    ///
    /// # Panics
    /// As [`Network::connect`].
    pub fn connect_asymmetric(
        &mut self,
        a: NodeId,
        b: NodeId,
        a_to_b: LinkConfig,
        b_to_a: LinkConfig,
    ) -> Link {
        assert_ne!(a, b, "a link needs two distinct nodes");
        let forward = self.new_direction(b, a_to_b);
        let backward = self.new_direction(a, b_to_a);
        self.attach(a, forward);
        self.attach(b, backward);
        Link { forward, backward }
    }

    fn new_direction(&mut self, to: NodeId, config: LinkConfig) -> DirId {
        let id = self.dirs.len();
        let to_port = match &self.nodes[to.0] {
            Node::Switch(s) => s.ports.len(),
            Node::Endpoint { .. } => 0,
        };
        self.dirs.push(Direction {
            to,
            to_port,
            link: LinkDirection::new(config, Rng::derive(self.seed, id as u64)),
            filter: None,
        });
        DirId(id)
    }

    /// Makes `out` the (next) outgoing port of `node`.
    fn attach(&mut self, node: NodeId, out: DirId) {
        match &mut self.nodes[node.0] {
            Node::Endpoint { port, .. } => {
                assert!(port.is_none(), "endpoint {node:?} is already connected");
                *port = Some(out);
            }
            Node::Switch(s) => s.ports.push(out),
        }
    }

    /// The endpoint `id`.
    ///
    /// # Panics
    /// If `id` is a switch.
    pub fn endpoint(&self, id: NodeId) -> &E {
        match &self.nodes[id.0] {
            Node::Endpoint { endpoint, .. } => endpoint,
            Node::Switch(_) => panic!("{id:?} is a switch"),
        }
    }

    /// The endpoint `id`, to play its application.
    ///
    /// # Panics
    /// If `id` is a switch.
    pub fn endpoint_mut(&mut self, id: NodeId) -> &mut E {
        match &mut self.nodes[id.0] {
            Node::Endpoint { endpoint, .. } => endpoint,
            Node::Switch(_) => panic!("{id:?} is a switch"),
        }
    }

    /// Two endpoints at once, for tests that move data between them.
    ///
    /// # Panics
    /// If `a == b` or either is a switch.
    pub fn endpoint_pair_mut(&mut self, a: NodeId, b: NodeId) -> (&mut E, &mut E) {
        assert_ne!(a, b, "two distinct endpoints");
        let (lo, hi, swap) = if a.0 < b.0 {
            (a.0, b.0, false)
        } else {
            (b.0, a.0, true)
        };
        let (left, right) = self.nodes.split_at_mut(hi);
        let first = match &mut left[lo] {
            Node::Endpoint { endpoint, .. } => endpoint,
            Node::Switch(_) => panic!("node {lo} is a switch"),
        };
        let second = match &mut right[0] {
            Node::Endpoint { endpoint, .. } => endpoint,
            Node::Switch(_) => panic!("node {hi} is a switch"),
        };
        if swap {
            (second, first)
        } else {
            (first, second)
        }
    }

    /// Counters of one link direction.
    pub fn link_stats(&self, dir: DirId) -> &LinkStats {
        &self.dirs[dir.0].link.stats
    }

    /// The configuration of one link direction.
    pub fn link_config(&self, dir: DirId) -> &LinkConfig {
        &self.dirs[dir.0].link.config
    }

    /// Changes a direction's configuration from now on (frames already in
    /// flight keep their fate). The generator and the queue carry on.
    pub fn set_link_config(&mut self, dir: DirId, config: LinkConfig) {
        self.dirs[dir.0].link.config = config;
    }

    /// Installs (or, with `None`, removes) a drop filter on a direction.
    pub fn set_drop_filter(&mut self, dir: DirId, filter: Option<DropFilter>) {
        self.dirs[dir.0].filter = filter;
    }

    /// Starts recording every frame offered to every link (see
    /// [`Captured`]), for tests that inspect the wire.
    pub fn enable_capture(&mut self) {
        if self.capture.is_none() {
            self.capture = Some(Vec::new());
        }
    }

    /// The frames recorded so far, in the order they were offered.
    pub fn captured(&self) -> &[Captured] {
        self.capture.as_deref().unwrap_or(&[])
    }

    /// Takes the recorded frames, leaving capture on with an empty record.
    pub fn take_captured(&mut self) -> Vec<Captured> {
        match &mut self.capture {
            Some(c) => core::mem::take(c),
            None => Vec::new(),
        }
    }

    /// Frames emitted by endpoints that had no link.
    pub fn unconnected_drops(&self) -> u64 {
        self.unconnected_drops
    }

    /// Asks to be woken at `at`, so that a test's application logic runs
    /// then even if no frame or timer is due.
    pub fn schedule_wakeup(&mut self, at: Instant) {
        self.push_event(at, EventKind::Wakeup);
    }

    /// Puts `frame` on `dir` as if its source node had sent it now: for
    /// tests that inject raw frames without an endpoint of their own.
    pub fn inject(&mut self, dir: DirId, frame: Vec<u8>) {
        self.offer(dir, frame);
    }

    fn push_event(&mut self, at: Instant, kind: EventKind) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.events.push(Event { at, seq, kind });
    }

    /// Offers a frame to a link direction and schedules its arrival.
    fn offer(&mut self, dir: DirId, mut frame: Vec<u8>) {
        let now = self.now;
        let d = &mut self.dirs[dir.0];
        let original = self.capture.is_some().then(|| frame.clone());
        let fate = d.link.offer(now, &mut frame, d.filter.as_mut());
        if let Fate::Delivered {
            at, duplicate_at, ..
        } = fate
        {
            if let Some(dup_at) = duplicate_at {
                let copy = frame.clone();
                self.push_event(dup_at, EventKind::Arrival { dir, frame: copy });
            }
            self.push_event(at, EventKind::Arrival { dir, frame });
        }
        if let (Some(capture), Some(frame)) = (&mut self.capture, original) {
            capture.push(Captured {
                at: now,
                dir,
                frame,
                fate,
            });
        }
    }

    /// Hands an arrived frame to its node.
    fn arrive(&mut self, dir: DirId, frame: Vec<u8>) {
        let now = self.now;
        let d = &mut self.dirs[dir.0];
        d.link.stats.delivered += 1;
        d.link.stats.delivered_bytes += frame.len() as u64;
        let (to, in_port) = (d.to, d.to_port);
        match &mut self.nodes[to.0] {
            Node::Endpoint { endpoint, .. } => endpoint.handle_frame(now, frame),
            Node::Switch(switch) => {
                let outs = switch_forward(switch, in_port, &frame);
                match outs {
                    Forward::None => {}
                    Forward::One(out) => self.offer(out, frame),
                    Forward::Flood => {
                        let ports: Vec<DirId> = match &self.nodes[to.0] {
                            Node::Switch(s) => s
                                .ports
                                .iter()
                                .enumerate()
                                .filter(|&(i, _)| i != in_port)
                                .map(|(_, &p)| p)
                                .collect(),
                            Node::Endpoint { .. } => Vec::new(),
                        };
                        for out in ports {
                            self.offer(out, frame.clone());
                        }
                    }
                }
            }
        }
    }

    /// Drains every endpoint's output onto its link. Returns whether any
    /// frame was sent.
    pub fn drain(&mut self) -> bool {
        let now = self.now;
        let mut any = false;
        for i in 0..self.nodes.len() {
            let mut count = 0;
            while let Node::Endpoint { endpoint, port } = &mut self.nodes[i] {
                let port = *port;
                let Some(frame) = endpoint.poll_frame(now) else {
                    break;
                };
                any = true;
                match port {
                    Some(dir) => self.offer(dir, frame),
                    None => self.unconnected_drops += 1,
                }
                count += 1;
                if count >= MAX_FRAMES_PER_DRAIN {
                    self.livelocked = true;
                    break;
                }
            }
        }
        any
    }

    /// Runs everything due at the current time: arrivals and wake-ups,
    /// then endpoint timers, then the endpoints' output. Returns whether
    /// anything happened.
    pub fn poll(&mut self) -> bool {
        let mut any = false;
        while self.events.peek().is_some_and(|e| e.at <= self.now) {
            let Some(event) = self.events.pop() else {
                break;
            };
            any = true;
            match event.kind {
                EventKind::Arrival { dir, frame } => self.arrive(dir, frame),
                EventKind::Wakeup => {}
            }
        }
        let now = self.now;
        for node in &mut self.nodes {
            if let Node::Endpoint { endpoint, .. } = node {
                if endpoint.poll_timeout().is_some_and(|t| t <= now) {
                    endpoint.handle_timeout(now);
                    any = true;
                }
            }
        }
        self.drain() || any
    }

    /// The time of the next event: an arrival, a wake-up or an endpoint
    /// timer. It may be `now` (or even earlier, for an endpoint whose timer
    /// is overdue).
    pub fn next_event_time(&mut self) -> Option<Instant> {
        let mut next = self.events.peek().map(|e| e.at);
        for node in &mut self.nodes {
            if let Node::Endpoint { endpoint, .. } = node {
                if let Some(t) = endpoint.poll_timeout() {
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            }
        }
        next
    }

    /// Moves time to the next event (never backwards). Returns the new
    /// time, or `None` when nothing is scheduled.
    pub fn advance(&mut self) -> Option<Instant> {
        let next = self.next_event_time()?;
        if next > self.now {
            self.now = next;
        }
        Some(self.now)
    }

    /// One round by hand: runs what is due now ([`Network::poll`]), then
    /// moves time to the next event ([`Network::advance`]). Returns the new
    /// time, or `None` when nothing is scheduled any more.
    pub fn step(&mut self) -> Option<Instant> {
        self.poll();
        self.advance()
    }

    /// Runs the network until `done` returns `true`, and returns the time
    /// it did. `done` is called once per round, after the round's events,
    /// timers and output: it plays the application (reading, sending) and
    /// says whether the test's goal is reached. Frames it causes are sent
    /// in the same round.
    ///
    /// # Errors
    /// [`SimError::Deadline`] when the next event is after `deadline`,
    /// [`SimError::Idle`] when nothing is scheduled, and
    /// [`SimError::Livelock`] when time stops advancing.
    pub fn run_until<F>(&mut self, deadline: Instant, mut done: F) -> Result<Instant, SimError>
    where
        F: FnMut(&mut Network<E>) -> bool,
    {
        let mut rounds_at_now = 0u32;
        loop {
            self.poll();
            if done(self) {
                return Ok(self.now);
            }
            self.drain();
            if self.livelocked {
                return Err(SimError::Livelock { now: self.now });
            }
            match self.next_event_time() {
                None => return Err(SimError::Idle { now: self.now }),
                Some(t) if t > deadline => {
                    self.now = self.now.max(deadline);
                    return Err(SimError::Deadline { now: self.now });
                }
                Some(t) if t <= self.now => {
                    rounds_at_now += 1;
                    if rounds_at_now > LIVELOCK_ROUNDS {
                        return Err(SimError::Livelock { now: self.now });
                    }
                }
                Some(t) => {
                    rounds_at_now = 0;
                    self.now = t;
                }
            }
        }
    }

    /// Runs the network for `duration` of virtual time (or until nothing
    /// is scheduled), calling `app` once per round.
    ///
    /// # Errors
    /// [`SimError::Livelock`] when time stops advancing.
    pub fn run_for<F>(&mut self, duration: core::time::Duration, mut app: F) -> Result<(), SimError>
    where
        F: FnMut(&mut Network<E>),
    {
        let deadline = self.now + duration;
        match self.run_until(deadline, |net| {
            app(net);
            false
        }) {
            Ok(_) | Err(SimError::Deadline { .. }) => {
                self.now = deadline;
                Ok(())
            }
            Err(SimError::Idle { .. }) => {
                self.now = deadline;
                Ok(())
            }
            Err(e @ SimError::Livelock { .. }) => Err(e),
        }
    }

    /// How many frames were recorded as dropped for `reason` on `dir`
    /// (capture must be on): a convenience for scenario tests.
    pub fn captured_drops(&self, dir: DirId, reason: DropReason) -> usize {
        self.captured()
            .iter()
            .filter(|c| c.dir == dir && c.fate == Fate::Dropped(reason))
            .count()
    }
}

enum Forward {
    None,
    One(DirId),
    Flood,
}

/// The switch's decision for a frame that arrived on `in_port`.
fn switch_forward(switch: &mut Switch, in_port: usize, frame: &[u8]) -> Forward {
    let (Some(dst), Some(src)) = (mac_at(frame, 0), mac_at(frame, 6)) else {
        return Forward::None;
    };
    // A group address (the I/G bit) is never a source: don't learn it.
    if src[0] & 1 == 0 {
        switch.table.insert(src, in_port);
    }
    if dst[0] & 1 == 1 {
        return Forward::Flood;
    }
    match switch.table.get(&dst) {
        Some(&port) if port == in_port => Forward::None,
        Some(&port) => Forward::One(switch.ports[port]),
        None => Forward::Flood,
    }
}

fn mac_at(frame: &[u8], offset: usize) -> Option<[u8; 6]> {
    frame.get(offset..offset + 6)?.try_into().ok()
}
