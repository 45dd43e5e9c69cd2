//! The connection table of one endpoint: connections keyed by 4-tuple with
//! a flow hash, listeners with a bounded backlog, SYN cookies when it
//! overflows (RFC 4987 §3.6), and RSTs for segments that match nothing
//! (RFC 9293 §3.10.7.1). It sits between the IP layer (the interface hands
//! it parsed TCP headers and payload) and the per-connection state machine.
//!
//! Order of calls for a driver, as for a single connection (see
//! [`crate::tcp`]):
//!
//! 1. for each received segment, [`Stack::handle_segment`];
//! 2. [`Stack::handle_timeout`] when `now >= poll_timeout()`;
//! 3. [`Stack::accept`] new connections on each listening port; for each
//!    connection, drain [`Stack::poll_event`], [`Stack::poll_dropped`]
//!    and `recv()` (through [`Stack::conn_mut`]) and offer records;
//! 4. drain [`Stack::poll_transmit`] and put each segment on the wire.
//!
//! Lifetime of a connection. One created by [`Stack::connect`] or returned
//! by [`Stack::accept`] belongs to the user: it stays in the table, even
//! CLOSED, until the user has received its terminal event (`Closed`,
//! `Reset` or `TimedOut`) through [`Stack::poll_event`], after which the
//! next [`Stack::handle_timeout`] (or [`Stack::reap`]) removes it; or until
//! the user calls [`Stack::remove`]. A user who drains events through
//! `conn_mut(id).poll_event()` instead must call `remove`. Passive
//! connections the user has not accepted yet belong to the stack: when they
//! close (a half-open one that times out or is reset, an established one
//! reset before `accept`) they are removed at once and skipped by `accept`.
//! A CLOSED connection leaves the 4-tuple map immediately, so that a new
//! connection may reuse its tuple; whatever it still had to send (a RST)
//! is moved to the stateless queue when it is removed.
//!
//! SYN flood defence. A listener holds at most `backlog` half-open
//! (SYN-RECEIVED) connections and at most `backlog` established ones
//! waiting for `accept`. A SYN that finds the half-open quota or the table
//! full is answered statelessly with a SYN cookie; one that finds the
//! accept queue full is dropped (the peer retransmits, as Linux does). A
//! flood therefore costs at most `backlog` connections per listener, and a
//! genuine client still completes through a cookie.

use core::cmp::Reverse;
use core::hash::{BuildHasher, Hash, Hasher};
use core::net::{Ipv4Addr, SocketAddrV4};
use std::collections::{BinaryHeap, VecDeque};

use super::config::Config;
use super::connection::Connection;
use super::cookie::{SynCookies, MAX_AGE_SLOTS, SLOT};
use super::isn::{siphash24, IsnGenerator};
use super::{Event, Payload, Record, Segment, State};
use crate::seq::SeqNumber;
use crate::time::Instant;
use crate::wire::{TcpFlags, TcpOptions, TcpRepr};

/// Budget of the stateless queue: RSTs and cookie SYN-ACKs waiting for
/// `poll_transmit`. A flood that outruns the driver costs this much memory
/// and no more; the excess is dropped and counted.
pub const STATELESS_QUEUE: usize = 64;

/// The ephemeral port range of RFC 6335 §6 (IANA dynamic ports), also
/// what the dataplane narrows by RSS hash.
pub const EPHEMERAL_PORTS: core::ops::RangeInclusive<u16> = 49152..=65535;

/// A connection's 4-tuple, from our side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FourTuple {
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
}

impl FourTuple {
    /// The tuple packed into 96 bits: both addresses, then both ports.
    fn words(&self) -> (u64, u32) {
        let ips =
            u64::from(u32::from(*self.local.ip())) << 32 | u64::from(u32::from(*self.remote.ip()));
        let ports = u32::from(self.local.port()) << 16 | u32::from(self.remote.port());
        (ips, ports)
    }
}

impl Hash for FourTuple {
    /// Feeds the tuple as two words, so that [`FlowHasher`] sees it whole
    /// rather than field by field.
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (ips, ports) = self.words();
        state.write_u64(ips);
        state.write_u32(ports);
    }
}

/// A 64-bit finalizer (multiply, xor-shift, twice): every input bit affects
/// every output bit, which is what the table's bucket index (low bits) and
/// control bytes (high bits) both need.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
    x = (x ^ (x >> 32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
    x ^ (x >> 32)
}

/// The flow hash of a tuple: a multiply-xorshift mix of its 96 bits.
/// Chosen over CRC or Toeplitz because it is a few multiplies in software
/// and spreads sequential ports evenly; it is not the NIC's RSS hash (the
/// dataplane uses Toeplitz where it must match the NIC). The table itself
/// hashes with a seed drawn from the stack key ([`FlowHasherBuilder`]), so
/// that a peer choosing its ports cannot aim its tuples at one bucket.
pub fn flow_hash(tuple: &FourTuple) -> u32 {
    FlowHasherBuilder { seed: 0 }.hash_one(tuple) as u32
}

/// Hasher state of [`FlowHasherBuilder`]: words are folded in through
/// a multiply-xorshift mix; allocation-free.
#[derive(Debug, Clone)]
pub struct FlowHasher {
    state: u64,
}

impl Hasher for FlowHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Not used by `FourTuple`; kept correct for any other key.
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.state = mix(self.state ^ x).wrapping_add(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn finish(&self) -> u64 {
        mix(self.state)
    }
}

/// Builds [`FlowHasher`]s with a per-stack seed.
#[derive(Debug, Clone, Copy)]
pub struct FlowHasherBuilder {
    seed: u64,
}

impl BuildHasher for FlowHasherBuilder {
    type Hasher = FlowHasher;
    fn build_hasher(&self) -> FlowHasher {
        FlowHasher { state: self.seed }
    }
}

/// Handle to a connection in a [`Stack`]. Stale handles (of a connection
/// since removed) are detected by a generation count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId {
    pub index: u32,
    pub generation: u32,
}

/// The turn [`Stack::turn`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The connection whose turn it is.
    pub id: ConnId,
    /// Its records queued and not yet sent.
    pub unsent_records: usize,
    /// Their payload bytes.
    pub unsent_bytes: usize,
    /// The largest record a segment of it carries
    /// ([`Connection::max_record_len`](super::Connection::max_record_len)):
    /// unsent bytes fewer than that leave the next segment short.
    pub max_record: usize,
    /// Payload bytes left of its turn ([`Config::turn_bytes`]); once
    /// those are sent, left of twice them.
    pub bytes_left: usize,
    /// The turn has sent its `turn_bytes` and goes on only to the end of
    /// the message under way ([`Record::ends_message`]).
    pub to_message_end: bool,
}

/// Errors of table operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackError {
    /// A listener already exists on the port, or the 4-tuple of an active
    /// open is taken.
    PortInUse,
    /// No free local port for an active open.
    NoFreePort,
    /// The table holds its configured maximum of connections.
    TableFull,
    /// The handle names no live connection, or the port no listener.
    NoSuchConnection,
}

impl StackError {
    /// Every variant, for the tests that walk each message.
    pub const ALL: &'static [StackError] = &[
        StackError::PortInUse,
        StackError::NoFreePort,
        StackError::TableFull,
        StackError::NoSuchConnection,
    ];
}

/// A clause about the table, for the caller to say which call it was.
impl core::fmt::Display for StackError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            StackError::PortInUse => "the port or the connection's addresses are in use",
            StackError::NoFreePort => "no local port is free for another connection",
            StackError::TableFull => "the connection table is full",
            StackError::NoSuchConnection => "no such connection or listener",
        })
    }
}

impl std::error::Error for StackError {}

/// Counters of the table (per-connection counters are in
/// [`super::ConnStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackStats {
    /// Segments handed to `handle_segment`.
    pub segments_in: u64,
    /// SYNs received for a listener.
    pub syns_received: u64,
    /// SYN-ACKs sent statelessly with a cookie.
    pub cookies_sent: u64,
    /// Connections created from a valid cookie.
    pub cookies_accepted: u64,
    /// ACKs to a listener that did not validate as a cookie.
    pub cookies_rejected: u64,
    /// RSTs queued for segments that matched nothing.
    pub rsts_sent: u64,
    /// Segments that matched no connection (answered with RST, a cookie,
    /// or dropped).
    pub no_connection: u64,
    /// SYNs (or cookie ACKs) dropped because a listener's accept queue, or
    /// the table, was full.
    pub backlog_drops: u64,
    /// Stateless segments dropped because [`STATELESS_QUEUE`] was full.
    pub stateless_drops: u64,
    /// Half-open connections that closed before completing (timeout, RST).
    pub half_open_failed: u64,
    /// Connections handed to the user by `accept`.
    pub accepted: u64,
    /// Times `poll_transmit` asked a connection for a segment: how the
    /// send path's work grows with the connections that have output.
    pub transmit_asks: u64,
    /// Timer entries `handle_timeout` examined: how the timer path's work
    /// grows with the deadlines that come due.
    pub timer_checks: u64,
    /// Timer heap tops `poll_timeout` checked against their slot (the
    /// slot's line read): how often the deadline it remembers was lost.
    pub top_checks: u64,
    /// Bare ACKs sent ahead of their connection's turn to send data
    /// (`Stack::acking`).
    pub acks_out_of_turn: u64,
}

/// Who a connection belongs to, and for passive ones where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// SYN-RECEIVED, counted against the listener on this port.
    HalfOpen(u16),
    /// Established, in the accept queue of the listener on this port.
    Queued(u16),
    /// Returned by `connect` or `accept`.
    User,
}

#[derive(Debug)]
struct Entry<B, R> {
    conn: Connection<B, R>,
    tuple: FourTuple,
    owner: Owner,
    /// In the 4-tuple map (false once CLOSED).
    mapped: bool,
    /// The user has received the terminal event.
    terminal_seen: bool,
}

#[derive(Debug)]
struct Slot<B, R> {
    generation: u32,
    entry: Option<Entry<B, R>>,
    /// In [`Stack::take_touched`]'s list.
    touched: bool,
    /// What the next [`Stack::settle`] must do for it ([`RECHECK_TX`],
    /// [`RECHECK_TIMER`]); non-zero while it is in `Stack::pending`.
    recheck: u8,
    /// In `Stack::sending`.
    sending: bool,
    /// In `Stack::acking`.
    acking: bool,
    /// In `Stack::reapable`.
    reap_listed: bool,
}

/// [`Slot::recheck`]: the connection may have a segment to send.
const RECHECK_TX: u8 = 1;
/// [`Slot::recheck`]: the connection's next timer may have moved earlier.
const RECHECK_TIMER: u8 = 2;

/// An entry of the timer heap: deadline, slot, the slot's generation.
type TimerEntry = Reverse<(Instant, u32, u32)>;

/// The connection map. Its hasher is [`FlowHasherBuilder`], seeded from
/// the stack key, so the map never touches `RandomState` and its layout is
/// a function of the key: the one `HashMap` the pure crates allow.
#[allow(
    clippy::disallowed_types,
    reason = "hashed by FlowHasherBuilder, seeded from the stack key, not from OS entropy"
)]
type FlowMap = std::collections::HashMap<FourTuple, u32, FlowHasherBuilder>;

#[derive(Debug)]
struct Listener {
    local: SocketAddrV4,
    backlog: usize,
    half_open: usize,
    accept_queue: VecDeque<ConnId>,
}

impl Listener {
    fn matches(&self, ip: Ipv4Addr) -> bool {
        self.local.ip().is_unspecified() || *self.local.ip() == ip
    }
}

/// The TCP stack of one endpoint (one worker, in the dataplane).
#[derive(Debug)]
pub struct Stack<B, R> {
    config: Config,
    key: [u8; 16],
    isn: IsnGenerator,
    cookies: SynCookies,
    max_connections: usize,
    slots: Vec<Slot<B, R>>,
    free: Vec<u32>,
    live: usize,
    map: FlowMap,
    /// The tuple last found in `map` and its slot: the segments of one
    /// connection come in runs (a burst of data, its ACKs), and the next
    /// one then skips the hash. Cleared whenever `map` changes.
    recent: Option<(FourTuple, u32)>,
    listeners: Vec<Listener>,
    stateless: VecDeque<(FourTuple, TcpRepr)>,
    /// Slots with a [`Slot::recheck`] to do, each once.
    pending: Vec<u32>,
    /// Slots that may have a segment to send, in the order
    /// `poll_transmit` serves them (round robin), each once.
    sending: VecDeque<u32>,
    /// Slots that owe an ACK, in the order they came due, each once:
    /// `poll_transmit` sends each a bare ACK before the turn under way
    /// goes on (the one whose turn it is sends the ACK as that turn's
    /// next segment). With thousands of busy connections a turn comes
    /// round only after every other connection's `turn_bytes`; an ACK
    /// that waited for it would reach its peer after the peer's
    /// retransmission timeout.
    acking: VecDeque<u32>,
    /// Payload bytes the connection at the front of `sending` has sent in
    /// its current turn ([`Config::turn_bytes`]).
    turn_used: usize,
    /// Connection deadlines, earliest first. Lazy: a slot's entry is
    /// current while it equals the slot's `queued` deadline and
    /// generation; others are skipped when they surface and swept out
    /// when the heap fills its capacity.
    timers: BinaryHeap<TimerEntry>,
    /// By slot index: the deadline and generation of the slot's current
    /// entry in `timers` (the earliest, a lower bound of the connection's
    /// next timer), if it has one. Kept apart from the slots, which hold
    /// whole connections: deciding whether a heap entry is current, which
    /// every entry that surfaces takes, reads this compact array (24
    /// bytes a slot, 240 KB for 10,000 connections) and not the slot's
    /// own line, which with thousands of connections is a miss each time.
    queued: Vec<Option<(Instant, u32)>>,
    /// The heap's top entry as [`Stack::poll_timeout`] last found it
    /// current (or as `settle` pushed it), while nothing that could make
    /// it stale has happened since (a slot freed, an entry popped, the
    /// heap swept): the driver asks every iteration.
    top_current: Option<TimerEntry>,
    /// Slots whose user has received the terminal event: what `reap`
    /// looks at.
    reapable: Vec<u32>,
    /// Slots whose connection a segment or a timer changed since the last
    /// [`Stack::take_touched`], each once.
    touched: Vec<u32>,
    /// Advances the ephemeral port search (RFC 6056 §3.3.3).
    port_counter: u16,
    /// When a cookie was last sent: cookie ACKs are only checked while a
    /// cookie could still be valid, which narrows blind guessing.
    last_cookie: Option<Instant>,
    stats: StackStats,
}

fn rst_for(repr: &TcpRepr, payload_len: usize) -> TcpRepr {
    // RFC 9293 §3.10.7.1: with ACK, <SEQ=SEG.ACK><CTL=RST>; without,
    // <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>.
    let (seq, ack_number, flags) = match repr.ack() {
        Some(ack) => (ack, SeqNumber(0), TcpFlags::RST),
        None => (
            SeqNumber(0),
            repr.seq + repr.segment_len(payload_len),
            TcpFlags::RST | TcpFlags::ACK,
        ),
    };
    TcpRepr {
        src_port: repr.dst_port,
        dst_port: repr.src_port,
        seq,
        ack_number,
        flags,
        window: 0,
        urgent: 0,
        options: TcpOptions::default(),
    }
}

impl<B: AsRef<[u8]>, R: Record> Stack<B, R> {
    /// A stack whose connections use `config`, with a secret `key` for ISNs
    /// (RFC 6528), SYN cookies, ephemeral ports and the table hash, holding
    /// at most `max_connections` connections (half-open ones included).
    pub fn new(config: Config, key: [u8; 16], max_connections: usize) -> Stack<B, R> {
        let seed = siphash24(&key, b"flow-hash-seed");
        Stack {
            config,
            key,
            isn: IsnGenerator::new(key),
            cookies: SynCookies::new(key),
            max_connections,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            map: FlowMap::with_capacity_and_hasher(max_connections, FlowHasherBuilder { seed }),
            recent: None,
            listeners: Vec::new(),
            stateless: VecDeque::with_capacity(STATELESS_QUEUE),
            pending: Vec::with_capacity(max_connections),
            sending: VecDeque::with_capacity(max_connections),
            acking: VecDeque::with_capacity(max_connections),
            turn_used: 0,
            timers: BinaryHeap::with_capacity(2 * max_connections + 64),
            queued: Vec::with_capacity(max_connections),
            top_current: None,
            reapable: Vec::with_capacity(max_connections),
            touched: Vec::with_capacity(max_connections),
            port_counter: 0,
            last_cookie: None,
            stats: StackStats::default(),
        }
    }

    /// The per-connection configuration new connections get.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Table counters.
    pub fn stats(&self) -> &StackStats {
        &self.stats
    }

    /// Live connections (half-open and CLOSED-but-not-reaped included).
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether the table holds no connection.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Handles of every live connection, stack-owned ones included.
    pub fn connections(&self) -> impl Iterator<Item = ConnId> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.entry.as_ref().map(|_| ConnId {
                index: i as u32,
                generation: s.generation,
            })
        })
    }

    /// Listens on `local` (an unspecified address listens on every local
    /// address) with at most `backlog` half-open and `backlog` unaccepted
    /// connections.
    pub fn listen(&mut self, local: SocketAddrV4, backlog: usize) -> Result<(), StackError> {
        if self
            .listeners
            .iter()
            .any(|l| l.local.port() == local.port())
        {
            return Err(StackError::PortInUse);
        }
        self.listeners.push(Listener {
            local,
            backlog,
            half_open: 0,
            accept_queue: VecDeque::with_capacity(backlog),
        });
        Ok(())
    }

    /// Stops listening on `port`. Connections not yet accepted are reset.
    pub fn unlisten(&mut self, now: Instant, port: u16) -> Result<(), StackError> {
        let pos = self
            .listeners
            .iter()
            .position(|l| l.local.port() == port)
            .ok_or(StackError::NoSuchConnection)?;
        self.listeners.swap_remove(pos);
        for i in 0..self.slots.len() {
            let owned = matches!(
                self.slots[i].entry.as_ref().map(|e| e.owner),
                Some(Owner::HalfOpen(p) | Owner::Queued(p)) if p == port
            );
            if owned {
                if let Some(e) = self.slots[i].entry.as_mut() {
                    e.conn.abort(now);
                }
                self.free_slot(now, i);
            }
        }
        Ok(())
    }

    /// Active open from `local_ip` to `remote`, on an ephemeral port
    /// chosen per RFC 6056 §3.3.3 (a keyed hash of the addresses, plus a
    /// counter) among those not in use towards `remote`.
    pub fn connect(
        &mut self,
        now: Instant,
        local_ip: Ipv4Addr,
        remote: SocketAddrV4,
    ) -> Result<ConnId, StackError> {
        let mut m = [0u8; 11];
        m[0] = b'P';
        m[1..5].copy_from_slice(&local_ip.octets());
        m[5..9].copy_from_slice(&remote.ip().octets());
        m[9..11].copy_from_slice(&remote.port().to_be_bytes());
        let n = u32::from(EPHEMERAL_PORTS.end() - EPHEMERAL_PORTS.start()) + 1;
        let offset = (siphash24(&self.key, &m) as u32).wrapping_add(u32::from(self.port_counter));
        for i in 0..n {
            let port = EPHEMERAL_PORTS.start() + ((offset.wrapping_add(i)) % n) as u16;
            let local = SocketAddrV4::new(local_ip, port);
            let tuple = FourTuple { local, remote };
            if self.map.contains_key(&tuple)
                || self.listeners.iter().any(|l| l.local.port() == port)
            {
                continue;
            }
            self.port_counter = self.port_counter.wrapping_add(i as u16 + 1);
            return self.connect_from(now, local, remote);
        }
        Err(StackError::NoFreePort)
    }

    /// Active open from a fixed `local` address and port (the dataplane
    /// picks the port whose RSS hash lands on the calling worker).
    pub fn connect_from(
        &mut self,
        now: Instant,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    ) -> Result<ConnId, StackError> {
        let tuple = FourTuple { local, remote };
        if self.map.contains_key(&tuple) {
            return Err(StackError::PortInUse);
        }
        self.make_room(now)?;
        let iss = self.isn.isn(now, local, remote);
        let conn = Connection::connect(now, self.config.clone(), local, remote, iss);
        Ok(self.insert(conn, tuple, Owner::User))
    }

    /// The next established connection on the listener on `port`, now the
    /// user's.
    pub fn accept(&mut self, port: u16) -> Option<ConnId> {
        let l = self.listeners.iter_mut().find(|l| l.local.port() == port)?;
        while let Some(id) = l.accept_queue.pop_front() {
            let Some(slot) = self.slots.get_mut(id.index as usize) else {
                continue;
            };
            if slot.generation != id.generation {
                continue;
            }
            if let Some(e) = slot.entry.as_mut() {
                e.owner = Owner::User;
                self.stats.accepted += 1;
                return Some(id);
            }
        }
        None
    }

    /// The connection `id`, if it is still in the table.
    pub fn conn(&self, id: ConnId) -> Option<&Connection<B, R>> {
        let s = self.slots.get(id.index as usize)?;
        if s.generation != id.generation {
            return None;
        }
        s.entry.as_ref().map(|e| &e.conn)
    }

    /// The connection `id`, mutably (to send records, `recv`, `close`).
    /// Whatever the caller does with it, the table looks at the
    /// connection's output and timers again at the next `poll_transmit`,
    /// `poll_timeout` or `handle_timeout`.
    pub fn conn_mut(&mut self, id: ConnId) -> Option<&mut Connection<B, R>> {
        let i = id.index as usize;
        let s = self.slots.get(i)?;
        if s.generation != id.generation || s.entry.is_none() {
            return None;
        }
        self.mark(i, RECHECK_TX | RECHECK_TIMER);
        self.slots[i].entry.as_mut().map(|e| &mut e.conn)
    }

    /// The 4-tuple of connection `id`.
    pub fn tuple(&self, id: ConnId) -> Option<FourTuple> {
        let s = self.slots.get(id.index as usize)?;
        if s.generation != id.generation {
            return None;
        }
        s.entry.as_ref().map(|e| e.tuple)
    }

    /// The next event of connection `id`. Receiving its terminal event
    /// (`Closed`, `Reset`, `TimedOut`) here lets the stack reap it.
    pub fn poll_event(&mut self, id: ConnId) -> Option<Event<R>> {
        let s = self.slots.get_mut(id.index as usize)?;
        if s.generation != id.generation {
            return None;
        }
        let e = s.entry.as_mut()?;
        let ev = e.conn.poll_event()?;
        if matches!(ev, Event::Closed | Event::Reset | Event::TimedOut) {
            e.terminal_seen = true;
            if !s.reap_listed {
                s.reap_listed = true;
                self.reapable.push(id.index);
            }
        }
        Some(ev)
    }

    /// The next record connection `id` gave up unacknowledged (see
    /// [`Connection::poll_dropped`]). Drain it after the events and before
    /// the connection is removed, by [`Stack::remove`] or by reaping after
    /// its terminal event: records still held then are dropped with it.
    pub fn poll_dropped(&mut self, id: ConnId) -> Option<R> {
        self.conn_mut(id)?.poll_dropped()
    }

    /// Removes connection `id` now, resetting it first if it is not
    /// CLOSED (the RST goes out through the stateless queue).
    pub fn remove(&mut self, now: Instant, id: ConnId) -> Result<(), StackError> {
        let s = self
            .slots
            .get_mut(id.index as usize)
            .ok_or(StackError::NoSuchConnection)?;
        if s.generation != id.generation {
            return Err(StackError::NoSuchConnection);
        }
        let e = s.entry.as_mut().ok_or(StackError::NoSuchConnection)?;
        if e.conn.state() != State::Closed {
            e.conn.abort(now);
        }
        self.free_slot(now, id.index as usize);
        Ok(())
    }

    /// The slot of `tuple`'s connection, if it is in the map.
    fn find(&mut self, tuple: &FourTuple) -> Option<u32> {
        match self.recent {
            Some((t, index)) if t == *tuple => Some(index),
            _ => {
                let index = *self.map.get(tuple)?;
                self.recent = Some((*tuple, index));
                Some(index)
            }
        }
    }

    /// Processes one received segment: `src_ip`/`dst_ip` from the IPv4
    /// header, `payload` by reference to the frame (`None` when empty).
    pub fn handle_segment(
        &mut self,
        now: Instant,
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
        repr: &TcpRepr,
        payload: Option<Payload<B>>,
    ) {
        self.stats.segments_in += 1;
        let tuple = FourTuple {
            local: SocketAddrV4::new(dst_ip, repr.dst_port),
            remote: SocketAddrV4::new(src_ip, repr.src_port),
        };
        if let Some(index) = self.find(&tuple) {
            let i = index as usize;
            if let Some(e) = self.slots.get_mut(i).and_then(|s| s.entry.as_mut()) {
                if e.conn.state() != State::Closed {
                    e.conn.handle_segment(now, repr, payload);
                    self.after_update(now, i);
                    return;
                }
            }
            // CLOSED (by the user, between calls): no longer addressable.
            self.after_update(now, i);
        }
        self.stats.no_connection += 1;
        let payload_len = payload.as_ref().map_or(0, Payload::len);
        let flags = repr.flags;
        if flags.contains(TcpFlags::RST) {
            return; // never answer a RST
        }
        let listener = self
            .listeners
            .iter()
            .position(|l| l.local.port() == repr.dst_port && l.matches(dst_ip));
        let Some(li) = listener else {
            self.queue_stateless(tuple, rst_for(repr, payload_len), true);
            return;
        };
        if flags.contains(TcpFlags::SYN) && !flags.contains(TcpFlags::ACK) {
            self.handle_syn(now, li, tuple, repr);
        } else if flags.contains(TcpFlags::ACK) {
            if !flags.contains(TcpFlags::SYN)
                && self.handle_cookie_ack(now, li, tuple, repr, payload)
            {
                return;
            }
            // LISTEN, an ACK: <SEQ=SEG.ACK><CTL=RST> (RFC 9293 §3.10.7.2).
            self.queue_stateless(tuple, rst_for(repr, payload_len), true);
        }
        // LISTEN, neither SYN nor ACK nor RST: dropped.
    }

    fn handle_syn(&mut self, now: Instant, li: usize, tuple: FourTuple, syn: &TcpRepr) {
        self.stats.syns_received += 1;
        let l = &self.listeners[li];
        if l.accept_queue.len() >= l.backlog {
            self.stats.backlog_drops += 1;
            return;
        }
        let (port, quota_left) = (l.local.port(), l.half_open < l.backlog);
        if quota_left && self.make_room(now).is_ok() {
            self.listeners[li].half_open += 1;
            let iss = self.isn.isn(now, tuple.local, tuple.remote);
            let conn = Connection::accept(
                now,
                self.config.clone(),
                tuple.local,
                tuple.remote,
                syn,
                iss,
            );
            let id = self.insert(conn, tuple, Owner::HalfOpen(port));
            self.after_update(now, id.index as usize);
            return;
        }
        // Stateless answer: the cookie is our ISN, and only the MSS is
        // offered (see `cookie`).
        let (cookie, _) =
            self.cookies
                .generate(now, tuple.local, tuple.remote, syn.seq, syn.options.mss);
        let synack = TcpRepr {
            src_port: tuple.local.port(),
            dst_port: tuple.remote.port(),
            seq: cookie,
            ack_number: syn.seq + 1,
            flags: TcpFlags::SYN | TcpFlags::ACK,
            // Unscaled: the cookie connection has no window scaling.
            window: self.config.recv_buffer.min(usize::from(u16::MAX)) as u16,
            urgent: 0,
            options: TcpOptions {
                mss: Some(self.config.mss),
                ..TcpOptions::default()
            },
        };
        if self.queue_stateless(tuple, synack, false) {
            self.stats.cookies_sent += 1;
            self.last_cookie = Some(now);
        }
    }

    /// A bare ACK to a listener: a cookie handshake completing? Returns
    /// whether the segment was consumed (a connection made, or dropped for
    /// lack of room); `false` means answer with RST.
    fn handle_cookie_ack(
        &mut self,
        now: Instant,
        li: usize,
        tuple: FourTuple,
        ack: &TcpRepr,
        payload: Option<Payload<B>>,
    ) -> bool {
        let recent = self
            .last_cookie
            .is_some_and(|t| now - t <= SLOT * (MAX_AGE_SLOTS as u32 + 1));
        if !recent {
            return false;
        }
        let iss = ack.ack_number - 1;
        let irs = ack.seq - 1;
        let Some(info) = self
            .cookies
            .validate(now, tuple.local, tuple.remote, irs, iss)
        else {
            self.stats.cookies_rejected += 1;
            return false;
        };
        let l = &self.listeners[li];
        let (port, queue_full) = (l.local.port(), l.accept_queue.len() >= l.backlog);
        if queue_full || self.make_room(now).is_err() {
            // Silently dropped: the peer retransmits, and its ACK stays
            // valid for the cookie's lifetime.
            self.stats.backlog_drops += 1;
            return true;
        }
        let config = Config {
            window_scaling: false,
            timestamps: false,
            sack: false,
            ..self.config.clone()
        };
        let conn = Connection::from_cookie(
            now,
            config,
            tuple.local,
            tuple.remote,
            ack,
            iss,
            irs,
            info.peer_mss,
        );
        self.stats.cookies_accepted += 1;
        let id = self.insert(conn, tuple, Owner::HalfOpen(port));
        self.listeners[li].half_open += 1;
        let i = id.index as usize;
        // Data or FIN on the completing ACK: process it as a segment of
        // the new connection (its ACK is then a duplicate).
        let has_payload = payload.as_ref().is_some_and(|p| !p.is_empty());
        if has_payload || ack.flags.contains(TcpFlags::FIN) {
            if let Some(e) = self.slots[i].entry.as_mut() {
                e.conn.handle_segment(now, ack, payload);
            }
        }
        self.after_update(now, i);
        true
    }

    /// Queues a stateless segment; `false` if the queue was full.
    fn queue_stateless(&mut self, tuple: FourTuple, repr: TcpRepr, is_rst: bool) -> bool {
        if self.stateless.len() >= STATELESS_QUEUE {
            self.stats.stateless_drops += 1;
            return false;
        }
        self.stateless.push_back((tuple, repr));
        if is_rst {
            self.stats.rsts_sent += 1;
        }
        true
    }

    /// Fails with `TableFull` when no slot is free even after reaping.
    fn make_room(&mut self, now: Instant) -> Result<(), StackError> {
        if self.live >= self.max_connections {
            self.reap(now);
        }
        if self.live >= self.max_connections {
            return Err(StackError::TableFull);
        }
        Ok(())
    }

    fn insert(&mut self, conn: Connection<B, R>, tuple: FourTuple, owner: Owner) -> ConnId {
        let entry = Entry {
            conn,
            tuple,
            owner,
            mapped: true,
            terminal_seen: false,
        };
        let index = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize].entry = Some(entry);
                i
            }
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    entry: Some(entry),
                    touched: false,
                    recheck: 0,
                    sending: false,
                    acking: false,
                    reap_listed: false,
                });
                self.queued.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        self.map.insert(tuple, index);
        // The map changed: the next lookup goes to it.
        self.recent = None;
        self.live += 1;
        self.mark(index as usize, RECHECK_TX | RECHECK_TIMER);
        ConnId {
            index,
            generation: self.slots[index as usize].generation,
        }
    }

    /// Bookkeeping after a connection may have changed state: unmap it
    /// when CLOSED, move a passive one from half-open to the accept queue
    /// when it completes, remove a stack-owned one that closed.
    fn after_update(&mut self, now: Instant, i: usize) {
        if let Some(s) = self.slots.get_mut(i) {
            if !s.touched {
                s.touched = true;
                self.touched.push(i as u32);
            }
        }
        self.mark(i, RECHECK_TX | RECHECK_TIMER);
        let Some(e) = self.slots.get_mut(i).and_then(|s| s.entry.as_mut()) else {
            return;
        };
        let state = e.conn.state();
        let closed = state == State::Closed;
        if closed && e.mapped {
            e.mapped = false;
            self.map.remove(&e.tuple);
            self.recent = None;
        }
        match e.owner {
            Owner::HalfOpen(_) if closed => {
                self.stats.half_open_failed += 1;
                self.free_slot(now, i); // gives back the half-open quota
            }
            Owner::HalfOpen(port) if state != State::SynReceived => {
                // Completed: from the half-open quota to the accept queue.
                e.owner = Owner::Queued(port);
                let id = ConnId {
                    index: i as u32,
                    generation: self.slots[i].generation,
                };
                let l = self.listeners.iter_mut().find(|l| l.local.port() == port);
                let queued = match l {
                    Some(l) => {
                        l.half_open = l.half_open.saturating_sub(1);
                        l.accept_queue.len() < l.backlog && {
                            l.accept_queue.push_back(id);
                            true
                        }
                    }
                    None => false,
                };
                if !queued {
                    self.stats.backlog_drops += 1;
                    if let Some(e) = self.slots[i].entry.as_mut() {
                        e.conn.abort(now);
                    }
                    self.free_slot(now, i);
                }
            }
            Owner::Queued(_) if closed => self.free_slot(now, i),
            _ => {}
        }
    }

    /// Removes the connection in slot `i`; what it still has to send
    /// (after an abort, its RST) goes to the stateless queue.
    fn free_slot(&mut self, now: Instant, i: usize) {
        let Some(slot) = self.slots.get_mut(i) else {
            return;
        };
        let Some(mut e) = slot.entry.take() else {
            return;
        };
        slot.generation = slot.generation.wrapping_add(1);
        // Its heap entries are stale now; the lists skip the empty slot.
        self.queued[i] = None;
        self.top_current = None;
        if e.mapped {
            self.map.remove(&e.tuple);
            self.recent = None;
        }
        if let Owner::HalfOpen(port) = e.owner {
            if let Some(l) = self.listeners.iter_mut().find(|l| l.local.port() == port) {
                l.half_open = l.half_open.saturating_sub(1);
            }
        }
        // A CLOSED connection has at most a RST left; the bound guards
        // against one that keeps producing segments.
        for _ in 0..4 {
            let Some(seg) = e.conn.poll_transmit(now) else {
                break;
            };
            if seg.payload.is_none() && seg.repr.flags.contains(TcpFlags::RST) {
                let repr = seg.repr;
                if self.stateless.len() < STATELESS_QUEUE {
                    self.stateless.push_back((e.tuple, repr));
                } else {
                    self.stats.stateless_drops += 1;
                }
            }
        }
        self.free.push(i as u32);
        self.live -= 1;
    }

    /// Removes user-owned connections that are CLOSED and whose terminal
    /// event the user has received (see the module documentation). Looks
    /// only at connections whose terminal event was taken.
    pub fn reap(&mut self, now: Instant) {
        let mut k = 0;
        while k < self.reapable.len() {
            let i = self.reapable[k] as usize;
            let (done, gone) = match self.slots[i].entry.as_ref() {
                Some(e) => (
                    e.owner == Owner::User && e.terminal_seen && e.conn.state() == State::Closed,
                    false,
                ),
                None => (false, true),
            };
            if done || gone {
                self.reapable.swap_remove(k);
                self.slots[i].reap_listed = false;
                if done {
                    self.free_slot(now, i);
                }
            } else {
                k += 1;
            }
        }
    }

    /// Notes that slot `i` needs `what` rechecked at the next settle.
    fn mark(&mut self, i: usize, what: u8) {
        if let Some(s) = self.slots.get_mut(i) {
            if s.recheck == 0 {
                self.pending.push(i as u32);
            }
            s.recheck |= what;
        }
    }

    /// Does the rechecks marked since the last settle: a connection that
    /// may have output joins the send list, and one whose next deadline
    /// is earlier than its entry in the timer heap gets a new entry. The
    /// cost is proportional to the connections touched, not to those that
    /// exist.
    fn settle(&mut self) {
        if self.timers.len() + self.pending.len() > self.timers.capacity() {
            self.sweep_timers();
        }
        let Stack {
            slots,
            pending,
            sending,
            acking,
            timers,
            queued,
            top_current,
            ..
        } = self;
        for &i in pending.iter() {
            let s = &mut slots[i as usize];
            let what = core::mem::take(&mut s.recheck);
            let Some(e) = s.entry.as_ref() else {
                continue;
            };
            if what & RECHECK_TX != 0 && !s.sending {
                s.sending = true;
                sending.push_back(i);
            }
            if what & RECHECK_TX != 0 && !s.acking && e.conn.owes_ack() {
                s.acking = true;
                acking.push_back(i);
            }
            if what & RECHECK_TIMER != 0 {
                if let Some(d) = e.conn.poll_timeout() {
                    let q = &mut queued[i as usize];
                    if !q.is_some_and(|(q, _)| d >= q) {
                        *q = Some((d, s.generation));
                        let entry = Reverse((d, i, s.generation));
                        timers.push(entry);
                        // What `poll_timeout` remembers stays true: the
                        // new entry is current, and it puts the remembered
                        // top out of date only when that is this slot's,
                        // whose earlier deadline then sorts ahead of it.
                        // (Forgetting it here had every iteration that
                        // armed a timer check the top again.)
                        if timers.peek() == Some(&entry) {
                            *top_current = Some(entry);
                        }
                    }
                }
            }
        }
        pending.clear();
    }

    /// Drops the heap entries that are no longer any slot's current one.
    fn sweep_timers(&mut self) {
        self.top_current = None;
        let queued = &self.queued;
        self.timers
            .retain(|&Reverse((t, i, g))| queued[i as usize] == Some((t, g)));
    }

    /// Whether a heap entry is its slot's current one (a slot has one
    /// only while it holds a connection: freeing it forgets it).
    fn current(&self, &Reverse((t, i, g)): &TimerEntry) -> bool {
        self.queued[i as usize] == Some((t, g))
    }

    /// Whether a connection owes an ACK now (for the segments handled
    /// since the last transmit), so that a driver can send it before
    /// other work of its loop.
    pub fn owes_acks(&mut self) -> bool {
        self.settle();
        !self.acking.is_empty()
    }

    /// The next segment to send: stateless RSTs and cookie SYN-ACKs first,
    /// then the connections' segments, round robin. The tuple says where
    /// it goes (`remote`) and from which address (`local`). Only
    /// connections that a segment, a timer or the user touched since they
    /// last had nothing to send are asked.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<(FourTuple, Segment<'_, R>)> {
        if let Some((tuple, repr)) = self.stateless.pop_front() {
            return Some((tuple, Segment::bare(repr)));
        }
        self.settle();
        // Owed ACKs, in the order they came due, go ahead of the turn
        // under way. One owed by the connection whose turn it is goes as
        // that turn's next segment (on its data, if it has any).
        while let Some(i) = self.acking.pop_front() {
            let s = &mut self.slots[i as usize];
            s.acking = false;
            if self.sending.front() == Some(&i) {
                break;
            }
            let Some(e) = s.entry.as_mut() else {
                continue;
            };
            let Some(plan) = e.conn.plan_ack(now) else {
                continue;
            };
            if e.conn.owes_ack() {
                // More snapshots queued: one at a time, behind the others.
                s.acking = true;
                self.acking.push_back(i);
            }
            let e = self.slots[i as usize].entry.as_ref()?;
            self.stats.acks_out_of_turn += 1;
            return Some((e.tuple, e.conn.planned_segment(plan)));
        }
        while let Some(&i) = self.sending.front() {
            let s = &mut self.slots[i as usize];
            // Sending arms timers: look at them at the next settle.
            if s.recheck == 0 {
                self.pending.push(i);
            }
            s.recheck |= RECHECK_TIMER;
            let Some(e) = s.entry.as_mut() else {
                self.leave_sending();
                continue;
            };
            self.stats.transmit_asks += 1;
            match e.conn.plan_segment(now) {
                Some(plan) => {
                    let e = self.slots[i as usize].entry.as_ref()?;
                    let seg = e.conn.planned_segment(plan);
                    // The connection keeps its turn until it has sent
                    // `turn_bytes` (a segment without payload counts a
                    // byte, so that no run of them holds it) and the
                    // message under way, at most twice `turn_bytes`; then
                    // to the back of the list, so that each gets a turn.
                    // It leaves the list when it has nothing left.
                    self.turn_used += seg.payload_len().max(1);
                    let budget = self.config.turn_bytes;
                    if self.turn_used >= budget
                        && (seg.ends_message() || self.turn_used >= budget.saturating_mul(2))
                    {
                        self.turn_used = 0;
                        self.sending.pop_front();
                        self.sending.push_back(i);
                    }
                    return Some((e.tuple, seg));
                }
                None => self.leave_sending(),
            }
        }
        None
    }

    /// The connection whose turn to send it is, as `poll_transmit` will
    /// next serve it, after the ACKs owed ahead of it. A user that builds
    /// its records late (at most one queued ahead of the turn, so that
    /// thousands of connections waiting for theirs hold one each) tops
    /// this one up before asking for the next segment.
    pub fn turn(&mut self) -> Option<Turn> {
        self.settle();
        let &i = self.sending.front()?;
        let s = &self.slots[i as usize];
        let e = s.entry.as_ref()?;
        let budget = self.config.turn_bytes;
        let past = self.turn_used >= budget;
        Some(Turn {
            id: ConnId {
                index: i,
                generation: s.generation,
            },
            unsent_records: e.conn.unsent_records(),
            unsent_bytes: e.conn.unsent_bytes(),
            max_record: e.conn.max_record_len(),
            bytes_left: if past {
                budget.saturating_mul(2).saturating_sub(self.turn_used)
            } else {
                budget - self.turn_used
            },
            to_message_end: past,
        })
    }

    /// Where slot `index`'s state lives and how long it is, read from
    /// nothing but the table's base address: a user that will look at
    /// the connection soon (the next one of its ready list) hints the
    /// CPU to load those lines while it works on another. The pointer is
    /// only an address; whether the slot holds a connection is not
    /// looked at.
    pub fn slot_lines(&self, index: u32) -> (*const u8, usize) {
        (
            self.slots.as_ptr().wrapping_add(index as usize).cast(),
            core::mem::size_of::<Slot<B, R>>(),
        )
    }

    /// The connection whose turn comes after the one under way, if one
    /// waits. With thousands of connections its state is out of cache
    /// by the time its turn comes round: a user may bring it in while
    /// the turn under way sends. A connection that has sent its all
    /// stays in line until its turn comes, so the one named may turn out
    /// to have nothing to send.
    pub fn next_turn(&self) -> Option<ConnId> {
        let &i = self.sending.get(1)?;
        let s = &self.slots[i as usize];
        s.entry.as_ref()?;
        Some(ConnId {
            index: i,
            generation: s.generation,
        })
    }

    /// The connection at the front of `sending` has nothing to send: it
    /// leaves the list, and the next one's turn starts.
    fn leave_sending(&mut self) {
        if let Some(i) = self.sending.pop_front() {
            self.slots[i as usize].sending = false;
        }
        self.turn_used = 0;
    }

    /// Hands `f` the slot index ([`ConnId::index`]) of each connection a
    /// received segment or a timer changed since the last call, each
    /// once, and forgets them: how the user finds the connections with
    /// new events, data or send room without looking at every one. What
    /// the user does itself through [`Stack::conn_mut`] is not recorded.
    pub fn take_touched(&mut self, mut f: impl FnMut(u32)) {
        for i in self.touched.drain(..) {
            if let Some(s) = self.slots.get_mut(i as usize) {
                s.touched = false;
            }
            f(i);
        }
    }

    /// When `handle_timeout` must next be called, if ever. It may be
    /// earlier than needed (a timer that moved later is found so when it
    /// comes due), never later.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.settle();
        while let Some(&top) = self.timers.peek() {
            if self.top_current == Some(top) {
                return Some(top.0 .0);
            }
            self.stats.top_checks += 1;
            if self.current(&top) {
                self.top_current = Some(top);
                return Some(top.0 .0);
            }
            self.timers.pop();
        }
        None
    }

    /// Runs every connection timer due at `now` and removes connections
    /// that are finished (half-open ones that timed out; user-owned ones
    /// per the module documentation). Looks only at the connections whose
    /// deadline has come.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.reap(now);
        self.settle();
        while let Some(&top) = self.timers.peek() {
            let Reverse((t, i, _)) = top;
            if t > now {
                break;
            }
            self.timers.pop();
            self.top_current = None;
            self.stats.timer_checks += 1;
            if !self.current(&top) {
                continue;
            }
            let i = i as usize;
            self.queued[i] = None;
            // The heap's time is a lower bound: the timer may have moved.
            let due = self.slots[i]
                .entry
                .as_ref()
                .and_then(|e| e.conn.poll_timeout())
                .is_some_and(|d| d <= now);
            if due {
                if let Some(e) = self.slots[i].entry.as_mut() {
                    e.conn.handle_timeout(now);
                }
                self.after_update(now, i);
            } else {
                self.mark(i, RECHECK_TIMER);
            }
        }
        self.settle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::RecordBytes;
    use core::time::Duration;

    type TestStack = Stack<Vec<u8>, Vec<u8>>;

    fn secs(n: u64) -> Instant {
        Instant::from_millis(n * 1000)
    }

    const KEY: [u8; 16] = [0x42; 16];
    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn repr(src_port: u16, dst_port: u16, seq: u32, ack: Option<u32>, flags: TcpFlags) -> TcpRepr {
        TcpRepr {
            src_port,
            dst_port,
            seq: SeqNumber(seq),
            ack_number: SeqNumber(ack.unwrap_or(0)),
            flags: if ack.is_some() {
                flags | TcpFlags::ACK
            } else {
                flags
            },
            window: 1000,
            urgent: 0,
            options: TcpOptions::default(),
        }
    }

    fn syn(src_port: u16, dst_port: u16, seq: u32) -> TcpRepr {
        let mut r = repr(src_port, dst_port, seq, None, TcpFlags::SYN);
        r.options.mss = Some(1460);
        r
    }

    #[test]
    fn segments_touch_their_connection_once() {
        let mut s = TestStack::new(Config::default(), KEY, 8);
        s.listen(SocketAddrV4::new(SERVER, 80), 4).unwrap();
        s.handle_segment(secs(1), CLIENT, SERVER, &syn(1000, 80, 7), None);
        s.handle_segment(secs(1), CLIENT, SERVER, &syn(1000, 80, 7), None);
        let mut seen = Vec::new();
        s.take_touched(|i| seen.push(i));
        assert_eq!(seen.len(), 1, "{seen:?}");
        seen.clear();
        s.take_touched(|i| seen.push(i));
        assert!(seen.is_empty(), "{seen:?}");
    }

    #[test]
    fn a_removed_connection_takes_no_more_segments_even_just_after_one() {
        let mut s = TestStack::new(Config::default(), KEY, 8);
        let now = secs(1);
        let first = s
            .connect(now, CLIENT, SocketAddrV4::new(SERVER, 80))
            .unwrap();
        let t = s.tuple(first).unwrap();
        // A segment of its tuple, so that the lookup has just found it.
        let stray = repr(80, t.local.port(), 5, Some(1), TcpFlags::NONE);
        s.handle_segment(now, SERVER, CLIENT, &stray, None);
        assert_eq!(s.stats().no_connection, 0);
        s.remove(now, first).unwrap();
        // The next connection gets the same slot under another tuple.
        let second = s
            .connect(now, CLIENT, SocketAddrV4::new(SERVER, 81))
            .unwrap();
        assert_eq!(second.index, first.index, "the test needs the slot reused");
        let before = s.conn(second).unwrap().stats().segments_in;
        s.handle_segment(now, SERVER, CLIENT, &stray, None);
        assert_eq!(s.stats().no_connection, 1);
        assert_eq!(s.conn(second).unwrap().stats().segments_in, before);
    }

    /// Drains the stateless queue (safe while no connection exists).
    fn drain(s: &mut TestStack, now: Instant) -> Vec<(FourTuple, TcpRepr)> {
        let mut out = Vec::new();
        while let Some((t, seg)) = s.poll_transmit(now) {
            assert!(seg.payload.is_none());
            out.push((t, seg.repr));
        }
        out
    }

    #[test]
    fn rst_for_segments_matching_nothing() {
        let mut s = TestStack::new(Config::default(), KEY, 16);
        let now = Instant::from_millis(1);
        // SYN to a closed port: <SEQ=0><ACK=SEG.SEQ+1><CTL=RST,ACK>.
        s.handle_segment(now, CLIENT, SERVER, &syn(40000, 80, 1000), None);
        // ACK (with data) to a closed port: <SEQ=SEG.ACK><CTL=RST>.
        let data = Payload::whole(vec![1u8; 10]);
        let ack = repr(40000, 80, 2000, Some(777), TcpFlags::PSH);
        s.handle_segment(now, CLIENT, SERVER, &ack, Some(data));
        // FIN with data and no ACK: the ACK covers data and FIN.
        let fin = repr(40000, 80, 3000, None, TcpFlags::FIN);
        s.handle_segment(now, CLIENT, SERVER, &fin, Some(Payload::whole(vec![0; 5])));
        // RST: never answered.
        let rst = repr(40000, 80, 1, Some(2), TcpFlags::RST);
        s.handle_segment(now, CLIENT, SERVER, &rst, None);
        let out = drain(&mut s, now);
        assert_eq!(out.len(), 3);
        let tuple = FourTuple {
            local: SocketAddrV4::new(SERVER, 80),
            remote: SocketAddrV4::new(CLIENT, 40000),
        };
        assert!(out.iter().all(|(t, _)| *t == tuple));
        let (_, r0) = out[0];
        assert_eq!((r0.src_port, r0.dst_port), (80, 40000));
        assert_eq!(r0.flags, TcpFlags::RST | TcpFlags::ACK);
        assert_eq!((r0.seq, r0.ack_number), (SeqNumber(0), SeqNumber(1001)));
        let (_, r1) = out[1];
        assert_eq!(r1.flags, TcpFlags::RST);
        assert_eq!(r1.seq, SeqNumber(777));
        let (_, r2) = out[2];
        assert_eq!(r2.flags, TcpFlags::RST | TcpFlags::ACK);
        assert_eq!(r2.ack_number, SeqNumber(3006));
        assert_eq!(s.stats().rsts_sent, 3);
        assert_eq!(s.stats().no_connection, 4);
        assert_eq!(s.stats().segments_in, 4);
        assert!(s.is_empty());
    }

    #[test]
    fn listener_answers_stray_ack_with_rst_and_drops_bare_segments() {
        let mut s = TestStack::new(Config::default(), KEY, 16);
        s.listen(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 80), 4)
            .unwrap();
        assert_eq!(
            s.listen(SocketAddrV4::new(SERVER, 80), 4),
            Err(StackError::PortInUse)
        );
        let now = Instant::from_millis(5);
        s.handle_segment(
            now,
            CLIENT,
            SERVER,
            &repr(1, 80, 5, Some(99), TcpFlags::NONE),
            None,
        );
        s.handle_segment(
            now,
            CLIENT,
            SERVER,
            &repr(1, 80, 5, None, TcpFlags::NONE),
            None,
        );
        let synack = repr(1, 80, 5, Some(50), TcpFlags::SYN);
        s.handle_segment(now, CLIENT, SERVER, &synack, None);
        let out = drain(&mut s, now);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|(_, r)| r.flags == TcpFlags::RST));
        assert_eq!(out[0].1.seq, SeqNumber(99));
        assert_eq!(out[1].1.seq, SeqNumber(50));
        assert_eq!(s.unlisten(now, 81), Err(StackError::NoSuchConnection));
        s.unlisten(now, 80).unwrap();
        s.listen(SocketAddrV4::new(SERVER, 80), 4).unwrap();
    }

    #[test]
    fn cookie_synack_when_full_and_ack_validation() {
        // No room for any connection: every SYN is answered with a cookie.
        let mut s = TestStack::new(Config::default(), KEY, 0);
        s.listen(SocketAddrV4::new(SERVER, 80), 4).unwrap();
        let now = secs(1000);
        s.handle_segment(now, CLIENT, SERVER, &syn(40000, 80, 5000), None);
        let out = drain(&mut s, now);
        assert_eq!(out.len(), 1);
        let (t, sa) = out[0];
        assert_eq!(t.remote, SocketAddrV4::new(CLIENT, 40000));
        assert_eq!(sa.flags, TcpFlags::SYN | TcpFlags::ACK);
        assert_eq!(sa.ack_number, SeqNumber(5001));
        // The cookie offers the MSS only.
        assert_eq!(sa.options.mss, Some(1460));
        assert_eq!(sa.options.window_scale, None);
        assert!(!sa.options.sack_permitted);
        assert_eq!(sa.options.timestamp, None);
        assert_eq!(sa.window, u16::MAX);
        let cookies = SynCookies::new(KEY);
        let info = cookies.validate(now, t.local, t.remote, SeqNumber(5000), sa.seq);
        assert_eq!(info.map(|i| i.peer_mss), Some(1460));
        assert_eq!(s.stats().cookies_sent, 1);
        assert_eq!(s.stats().syns_received, 1);

        // A forged ACK: RST.
        let bad = repr(
            40000,
            80,
            5001,
            Some(sa.seq.0.wrapping_add(2)),
            TcpFlags::NONE,
        );
        s.handle_segment(now, CLIENT, SERVER, &bad, None);
        let out = drain(&mut s, now);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.flags, TcpFlags::RST);
        assert_eq!(s.stats().cookies_rejected, 1);
        // The right ACK validates but finds the table full: dropped
        // silently, so that a retransmission can still complete.
        let good = repr(
            40000,
            80,
            5001,
            Some(sa.seq.0.wrapping_add(1)),
            TcpFlags::NONE,
        );
        s.handle_segment(now, CLIENT, SERVER, &good, None);
        assert!(drain(&mut s, now).is_empty());
        assert_eq!(s.stats().backlog_drops, 1);
        assert_eq!(s.stats().cookies_accepted, 0);
        assert!(s.is_empty());
        // Long after the last cookie, ACKs are not even checked.
        let later = now + Duration::from_secs(3600);
        s.handle_segment(later, CLIENT, SERVER, &good, None);
        assert_eq!(drain(&mut s, later)[0].1.flags, TcpFlags::RST);
        assert_eq!(s.stats().cookies_rejected, 1);
    }

    #[test]
    fn stateless_queue_is_bounded() {
        let mut s = TestStack::new(Config::default(), KEY, 0);
        let now = Instant::from_millis(1);
        for i in 0..1000u16 {
            s.handle_segment(now, CLIENT, SERVER, &syn(1024 + i, 9, u32::from(i)), None);
        }
        assert_eq!(s.stateless.len(), STATELESS_QUEUE);
        assert_eq!(s.stats().stateless_drops, 1000 - STATELESS_QUEUE as u64);
        assert_eq!(drain(&mut s, now).len(), STATELESS_QUEUE);
    }

    #[test]
    fn flow_hash_spreads_and_is_seeded() {
        let tuple = |port: u16| FourTuple {
            local: SocketAddrV4::new(SERVER, 80),
            remote: SocketAddrV4::new(CLIENT, port),
        };
        // 64 Ki sequential ports into 1024 buckets: 64 each on average.
        let mut buckets = vec![0u32; 1024];
        for p in 0..=u16::MAX {
            buckets[(flow_hash(&tuple(p)) % 1024) as usize] += 1;
        }
        let max = buckets.iter().copied().max().unwrap_or(0);
        let min = buckets.iter().copied().min().unwrap_or(0);
        assert!(max < 110 && min > 25, "min {min} max {max}");
        // Swapping the ends gives another hash.
        let t = tuple(5);
        let swapped = FourTuple {
            local: t.remote,
            remote: t.local,
        };
        assert_ne!(flow_hash(&t), flow_hash(&swapped));
        // Another seed, another hash.
        let h = |seed| FlowHasherBuilder { seed }.hash_one(t);
        assert_ne!(h(1), h(2));
        assert_eq!(h(0) as u32, flow_hash(&t));
    }

    #[test]
    fn stale_handles_are_rejected() {
        let mut s = TestStack::new(Config::default(), KEY, 4);
        let id = ConnId {
            index: 0,
            generation: 0,
        };
        assert!(s.conn(id).is_none());
        assert!(s.conn_mut(id).is_none());
        assert!(s.poll_event(id).is_none());
        assert_eq!(
            s.remove(Instant::ZERO, id),
            Err(StackError::NoSuchConnection)
        );
        assert!(s.accept(80).is_none());
        assert_eq!(s.poll_timeout(), None);
        assert_eq!(s.connections().count(), 0);
    }

    // ---- Tests that run real connections through two stacks ----

    /// Moves every pending segment between `a` (at `a_ip`) and `b`,
    /// copying payload into fresh buffers as a wire would, until both are
    /// quiet. Returns the number of segments moved.
    fn exchange<RA: RecordBytes, RB: RecordBytes>(
        a: &mut Stack<Vec<u8>, RA>,
        b: &mut Stack<Vec<u8>, RB>,
        now: Instant,
    ) -> usize {
        let mut moved = 0;
        loop {
            let n = deliver(a, b, now) + deliver(b, a, now);
            if n == 0 {
                return moved;
            }
            moved += n;
        }
    }

    /// Hands every segment `from` has to send now to `to`, payload copied
    /// into fresh buffers; the number moved.
    fn deliver<RA: RecordBytes, RB: RecordBytes>(
        from: &mut Stack<Vec<u8>, RA>,
        to: &mut Stack<Vec<u8>, RB>,
        now: Instant,
    ) -> usize {
        let mut batch = Vec::new();
        while let Some((t, seg)) = from.poll_transmit(now) {
            let bytes = seg.payload.as_ref().map(|(r, range)| {
                let mut v = vec![0u8; range.len()];
                r.copy_to(range.start, &mut v);
                v
            });
            batch.push((t, seg.repr, bytes));
        }
        let n = batch.len();
        for (t, r, bytes) in batch {
            let p = bytes.map(Payload::whole);
            to.handle_segment(now, *t.local.ip(), *t.remote.ip(), &r, p);
        }
        n
    }

    /// Runs both stacks' timers and exchanges until `until`.
    fn run<RA: RecordBytes, RB: RecordBytes>(
        a: &mut Stack<Vec<u8>, RA>,
        b: &mut Stack<Vec<u8>, RB>,
        now: &mut Instant,
        until: Instant,
    ) {
        exchange(a, b, *now);
        while *now < until {
            let next = [a.poll_timeout(), b.poll_timeout()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(until)
                .min(until)
                .max(*now + Duration::from_micros(1));
            *now = next;
            a.handle_timeout(*now);
            b.handle_timeout(*now);
            exchange(a, b, *now);
        }
    }

    fn pair(backlog: usize) -> (TestStack, TestStack) {
        let mut server = TestStack::new(Config::default(), KEY, 64);
        server
            .listen(SocketAddrV4::new(SERVER, 5000), backlog)
            .unwrap();
        let client = TestStack::new(Config::default(), [9; 16], 64);
        (server, client)
    }

    #[test]
    fn connect_accept_transfer_close_and_reap() {
        let (mut server, mut client) = pair(4);
        let mut now = Instant::from_millis(10);
        let cid = client
            .connect(now, CLIENT, SocketAddrV4::new(SERVER, 5000))
            .unwrap();
        let port = client.tuple(cid).unwrap().local.port();
        assert!(EPHEMERAL_PORTS.contains(&port));
        exchange(&mut server, &mut client, now);
        let sid = server.accept(5000).expect("accepted");
        assert!(server.accept(5000).is_none());
        assert_eq!(server.conn(sid).unwrap().state(), State::Established);
        assert_eq!(client.conn(cid).unwrap().state(), State::Established);
        assert!(matches!(client.poll_event(cid), Some(Event::Connected)));

        let msg = b"hello through the table".to_vec();
        client
            .conn_mut(cid)
            .unwrap()
            .send_record(now, msg.clone())
            .unwrap();
        run(
            &mut server,
            &mut client,
            &mut now,
            Instant::from_millis(500),
        );
        let mut got = Vec::new();
        while let Some(p) = server.conn_mut(sid).unwrap().recv() {
            got.extend_from_slice(p.bytes());
        }
        assert_eq!(got, msg);

        client.conn_mut(cid).unwrap().close(now);
        server.conn_mut(sid).unwrap().close(now);
        run(&mut server, &mut client, &mut now, secs(200));
        for (s, id) in [(&mut server, sid), (&mut client, cid)] {
            let mut terminal = false;
            while let Some(ev) = s.poll_event(id) {
                terminal |= matches!(ev, Event::Closed);
            }
            assert!(terminal);
            s.handle_timeout(now);
            assert!(s.conn(id).is_none(), "reaped");
            assert!(s.is_empty());
        }
    }

    /// Many idle connections cost nothing per call: sending on one asks
    /// that one only, and timers are examined only when they come due.
    #[test]
    fn work_follows_the_connections_that_have_it() {
        const N: usize = 1000;
        let mut server = TestStack::new(Config::default(), KEY, N);
        server.listen(SocketAddrV4::new(SERVER, 5000), N).unwrap();
        let mut client = TestStack::new(Config::default(), [9; 16], N);
        let mut now = Instant::from_millis(10);
        let ids: Vec<ConnId> = (0..N)
            .map(|_| {
                client
                    .connect(now, CLIENT, SocketAddrV4::new(SERVER, 5000))
                    .unwrap()
            })
            .collect();
        exchange(&mut server, &mut client, now);
        let mut sids = Vec::new();
        while let Some(id) = server.accept(5000) {
            sids.push(id);
        }
        assert_eq!(sids.len(), N);
        run(&mut server, &mut client, &mut now, Instant::from_millis(50));
        // Idle now: nothing to send, nothing due for a long while.
        let (asks, checks) = (client.stats().transmit_asks, client.stats().timer_checks);
        for _ in 0..100 {
            assert!(client.poll_transmit(now).is_none());
            assert!(client.poll_timeout().is_none_or(|t| t > now));
            client.handle_timeout(now);
        }
        assert_eq!(client.stats().transmit_asks, asks);
        assert_eq!(client.stats().timer_checks, checks);
        // One record on one connection: that connection alone is asked.
        let one = ids[N / 2];
        client
            .conn_mut(one)
            .unwrap()
            .send_record(now, b"only this one".to_vec())
            .unwrap();
        let asks = client.stats().transmit_asks;
        let (_, seg) = client.poll_transmit(now).expect("the record");
        assert_eq!(
            seg.payload.map(|(r, _)| r.clone()),
            Some(b"only this one".to_vec())
        );
        assert!(client.poll_transmit(now).is_none());
        assert!(client.stats().transmit_asks - asks <= 2);
        // Its retransmission timer is armed, and found without a scan: the
        // record was not delivered, so the timeout retransmits it.
        let rto = client.poll_timeout().expect("an armed timer");
        assert!(rto > now);
        let checks = client.stats().timer_checks;
        client.handle_timeout(rto);
        assert!(client.stats().timer_checks - checks <= 4);
        let tuple = client.tuple(one).unwrap();
        let (t, seg) = client.poll_transmit(rto).expect("the retransmission");
        assert!(seg.payload.is_some());
        assert_eq!(t, tuple);
        assert_eq!(client.conn(one).unwrap().stats().retransmits, 1);
    }

    /// Which of `ids` (by position) sent each segment with payload that
    /// `client` has to send now, in order.
    fn senders<R: Record>(
        client: &mut Stack<Vec<u8>, R>,
        ids: &[ConnId],
        now: Instant,
    ) -> Vec<usize> {
        let ports: Vec<u16> = ids
            .iter()
            .map(|&id| client.tuple(id).unwrap().local.port())
            .collect();
        let mut order = Vec::new();
        while let Some((t, seg)) = client.poll_transmit(now) {
            if seg.payload.is_some() {
                order.push(ports.iter().position(|&p| p == t.local.port()).unwrap());
            }
        }
        order
    }

    /// Connections with data to send take turns of `turn_bytes` each (at
    /// least a segment): with 0 they alternate segment by segment, with
    /// three records' worth each sends three before the other's turn.
    #[test]
    fn connections_send_in_turns_of_turn_bytes() {
        const REC: usize = 1000;
        for (turn, run) in [(0, 1), (3 * REC, 3), (3 * REC - 1, 3)] {
            let config = Config {
                turn_bytes: turn,
                ..Config::default()
            };
            let (_server, mut client, ids, now) = two_connections(config);
            for &id in &ids {
                for k in 0..6u8 {
                    client
                        .conn_mut(id)
                        .unwrap()
                        .send_record(now, vec![k; REC])
                        .unwrap();
                }
            }
            let order = senders(&mut client, &ids, now);
            assert_eq!(order.len(), 12, "turn {turn}");
            let expect: Vec<usize> = (0..12).map(|k| (k / run) % 2).collect();
            assert_eq!(order, expect, "turn {turn}");
        }
    }

    /// A record that may end a message (an FPDU and its L bit).
    #[derive(Debug)]
    struct Part(Vec<u8>, bool);

    impl Record for Part {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn ends_message(&self) -> bool {
            self.1
        }
    }

    impl RecordBytes for Part {
        fn copy_to(&self, offset: usize, dst: &mut [u8]) {
            self.0.copy_to(offset, dst);
        }
    }

    /// A turn that has sent its `turn_bytes` in the middle of a message
    /// goes on to the message's end, so that the message's last segments
    /// do not wait a round of the other connections' turns; a message
    /// longer than twice `turn_bytes` is cut there all the same.
    #[test]
    fn a_turn_goes_on_to_the_end_of_its_message() {
        // Small enough that both connections' records fit the initial
        // window.
        const REC: usize = 500;
        // (records per message, turn_bytes, records sent per turn)
        for (per_msg, turn, per_turn) in
            [(4, 3 * REC, 4), (3, 3 * REC, 3), (8, 3 * REC, 6), (1, 0, 1)]
        {
            let config = Config {
                turn_bytes: turn,
                ..Config::default()
            };
            let (_server, mut client, ids, now) = two_connections::<Part>(config);
            for &id in &ids {
                for k in 0..2 * per_msg {
                    let last = (k + 1) % per_msg == 0;
                    client
                        .conn_mut(id)
                        .unwrap()
                        .send_record(now, Part(vec![k as u8; REC], last))
                        .unwrap();
                }
            }
            let order = senders(&mut client, &ids, now);
            let n = 4 * per_msg;
            assert_eq!(order.len(), n, "{per_msg} records a message, turn {turn}");
            // Turns of `per_turn` records, alternating, until one
            // connection has sent all of its own.
            let mut expect = Vec::new();
            let mut left = [2 * per_msg, 2 * per_msg];
            let mut who = 0;
            while left != [0, 0] {
                let k = per_turn.min(left[who]);
                expect.extend(std::iter::repeat_n(who, k));
                left[who] -= k;
                if left[1 - who] > 0 {
                    who = 1 - who;
                }
            }
            assert_eq!(order, expect, "{per_msg} records a message, turn {turn}");
        }
    }

    /// What `turn` tells the builder of records: the bytes left of the
    /// turn, and once those are sent, that it goes on only to the end of
    /// the message under way, at most to twice `turn_bytes`.
    #[test]
    fn the_turn_says_when_it_goes_on_to_a_message_end() {
        const REC: usize = 500;
        let config = Config {
            turn_bytes: 3 * REC,
            ..Config::default()
        };
        let (_server, mut client, ids, now) = two_connections::<Part>(config);
        for k in 0..8 {
            client
                .conn_mut(ids[0])
                .unwrap()
                .send_record(now, Part(vec![k; REC], k == 7))
                .unwrap();
        }
        let t = client.turn().unwrap();
        assert_eq!(
            (t.id, t.bytes_left, t.to_message_end),
            (ids[0], 3 * REC, false)
        );
        client.poll_transmit(now).unwrap();
        let t = client.turn().unwrap();
        assert_eq!((t.bytes_left, t.to_message_end), (2 * REC, false));
        client.poll_transmit(now).unwrap();
        client.poll_transmit(now).unwrap();
        let t = client.turn().unwrap();
        assert_eq!(
            (t.id, t.bytes_left, t.to_message_end),
            (ids[0], 3 * REC, true)
        );
    }

    /// `next_turn` names the connection in line after the turn under
    /// way, and nothing while only one is in line;
    /// `slot_lines` gives each slot its own address range.
    #[test]
    fn the_next_turn_is_the_one_in_line_after_this_one() {
        const REC: usize = 500;
        let config = Config {
            turn_bytes: REC,
            ..Config::default()
        };
        let (_server, mut client, ids, now) = two_connections::<Part>(config);
        let send = |client: &mut Stack<Vec<u8>, Part>, id: ConnId| {
            client
                .conn_mut(id)
                .unwrap()
                .send_record(now, Part(vec![1; REC], true))
                .unwrap();
        };
        send(&mut client, ids[0]);
        assert_eq!(client.turn().map(|t| t.id), Some(ids[0]));
        assert_eq!(client.next_turn(), None, "only one has bytes to send");
        send(&mut client, ids[1]);
        assert_eq!(client.turn().map(|t| t.id), Some(ids[0]));
        assert_eq!(client.next_turn(), Some(ids[1]));
        client.poll_transmit(now).unwrap();
        assert_eq!(client.turn().map(|t| t.id), Some(ids[1]));

        let (a, len) = client.slot_lines(ids[0].index);
        let (b, _) = client.slot_lines(ids[1].index);
        let gap = (b as usize).abs_diff(a as usize);
        assert!(
            len > 0 && gap >= len,
            "slots {a:?} and {b:?}, {len} bytes each"
        );
    }

    /// A connection that owes an ACK while another has the turn to send
    /// data sends a bare ACK before that turn goes on.
    #[test]
    fn an_ack_owed_goes_out_ahead_of_another_connections_turn() {
        const REC: usize = 1000;
        let (mut server, mut client, cids, now) = two_connections(Config::default());
        let sids = [server.accept(5000).unwrap(), server.accept(5000).unwrap()];
        // The server's end of the client's first connection is the busy
        // one; the client's second connection sends to the other.
        let first_port = client.tuple(cids[0]).unwrap().local.port();
        let busy = if server.tuple(sids[0]).unwrap().remote.port() == first_port {
            sids[0]
        } else {
            sids[1]
        };
        let busy_port = server.tuple(busy).unwrap().remote.port();
        // The busy connection has its turn: five records queued, one sent.
        for k in 0..5u8 {
            server
                .conn_mut(busy)
                .unwrap()
                .send_record(now, vec![k; REC])
                .unwrap();
        }
        let first = server
            .poll_transmit(now)
            .map(|(t, s)| (t.remote.port(), s.payload.is_some()));
        assert_eq!(first, Some((busy_port, true)));
        // Two full segments arrive on the other connection: it owes an
        // ACK now (two segments' worth unacknowledged).
        for k in 0..2u8 {
            client
                .conn_mut(cids[1])
                .unwrap()
                .send_record(now, vec![k; REC])
                .unwrap();
        }
        assert_eq!(deliver(&mut client, &mut server, now), 2);
        let mut order = Vec::new();
        while let Some((t, s)) = server.poll_transmit(now) {
            order.push((t.remote.port() == busy_port, s.payload.is_some()));
        }
        // The other connection's bare ACK first (behind the busy one's
        // four remaining segments without the ACK lane), then the rest
        // of the turn; nothing else.
        let mut want = vec![(false, false)];
        want.extend([(true, true); 4]);
        assert_eq!(order, want);
        assert_eq!(server.stats().acks_out_of_turn, 1);
    }

    /// A server listening on port 5000 and a client with `config` that
    /// has opened two connections to it, handshakes done; and the time.
    fn two_connections<R: RecordBytes>(
        config: Config,
    ) -> (TestStack, Stack<Vec<u8>, R>, Vec<ConnId>, Instant) {
        let mut server = TestStack::new(Config::default(), KEY, 4);
        server.listen(SocketAddrV4::new(SERVER, 5000), 4).unwrap();
        let mut client = Stack::new(config, [9; 16], 4);
        let mut now = Instant::from_millis(10);
        let ids: Vec<ConnId> = (0..2)
            .map(|_| {
                client
                    .connect(now, CLIENT, SocketAddrV4::new(SERVER, 5000))
                    .unwrap()
            })
            .collect();
        run_until_quiet(&mut server, &mut client, &mut now);
        (server, client, ids, now)
    }

    fn run_until_quiet<RA: RecordBytes, RB: RecordBytes>(
        a: &mut Stack<Vec<u8>, RA>,
        b: &mut Stack<Vec<u8>, RB>,
        now: &mut Instant,
    ) {
        let until = *now + Duration::from_millis(50);
        run(a, b, now, until);
    }

    /// Timers moved earlier and later by the user are honoured: the heap
    /// holds a lower bound and finds the true deadline when it surfaces.
    #[test]
    fn timers_that_move_are_found() {
        let (mut server, mut client) = pair(4);
        let mut now = Instant::from_millis(10);
        let cid = client
            .connect(now, CLIENT, SocketAddrV4::new(SERVER, 5000))
            .unwrap();
        exchange(&mut server, &mut client, now);
        let sid = server.accept(5000).unwrap();
        run(&mut server, &mut client, &mut now, Instant::from_millis(50));
        // The handshake's timer is still the heap's lower bound; once it
        // surfaces, an idle connection has no deadline (keepalive is off by
        // default).
        let stale = client.poll_timeout().expect("the SYN's timer");
        now = now.max(stale);
        client.handle_timeout(now);
        assert_eq!(client.conn(cid).unwrap().stats().retransmits, 0);
        assert_eq!(client.poll_timeout(), None);
        // Data lost on the way arms the RTO; each later send that is lost
        // as well keeps one deadline, and it fires once per expiry.
        for k in 0..3u8 {
            client
                .conn_mut(cid)
                .unwrap()
                .send_record(now, vec![k; 10])
                .unwrap();
            while client.poll_transmit(now).is_some() {}
            now += Duration::from_millis(5);
        }
        let first = client.poll_timeout().expect("armed");
        let mut fired = 0;
        let until = first + Duration::from_secs(2);
        while let Some(t) = client.poll_timeout() {
            if t > until {
                break;
            }
            now = now.max(t);
            client.handle_timeout(now);
            while client.poll_transmit(now).is_some() {}
            fired = client.conn(cid).unwrap().stats().retransmits;
        }
        assert!(fired >= 1, "the RTO fired");
        // Now let the segments through: everything is acknowledged and
        // the deadline goes away.
        run(
            &mut server,
            &mut client,
            &mut now,
            until + Duration::from_secs(5),
        );
        let mut got = Vec::new();
        while let Some(p) = server.conn_mut(sid).unwrap().recv() {
            got.extend_from_slice(p.bytes());
        }
        assert_eq!(got.len(), 30);
        assert_eq!(client.poll_timeout(), None);
    }

    /// The deadline `poll_timeout` found current last time is not
    /// reported again once its connection is gone, nor once a later one
    /// takes the heap's top, nor after it ran.
    #[test]
    fn a_remembered_deadline_goes_with_its_connection() {
        let mut c = TestStack::new(Config::default(), KEY, 64);
        let now = Instant::from_millis(10);
        let first = c
            .connect(now, CLIENT, SocketAddrV4::new(SERVER, 5000))
            .unwrap();
        while c.poll_transmit(now).is_some() {}
        let syn = c.poll_timeout().expect("the SYN's timer");
        assert_eq!(c.poll_timeout(), Some(syn), "asked twice, same answer");
        c.remove(now, first).unwrap();
        assert_eq!(c.poll_timeout(), None, "the removed connection's timer");
        // A second connection's timer, then an earlier third one's.
        let later = now + Duration::from_millis(5);
        let second = c
            .connect(later, CLIENT, SocketAddrV4::new(SERVER, 5001))
            .unwrap();
        while c.poll_transmit(later).is_some() {}
        let t2 = c.poll_timeout().expect("the second SYN's timer");
        assert!(t2 > syn);
        let third = c
            .connect(now, CLIENT, SocketAddrV4::new(SERVER, 5002))
            .unwrap();
        while c.poll_transmit(now).is_some() {}
        let t3 = c.poll_timeout().expect("the third SYN's timer");
        assert!(t3 < t2, "the earlier deadline comes first");
        c.remove(now, third).unwrap();
        assert_eq!(c.poll_timeout(), Some(t2));
        // Run it: the SYN goes again and the timer moves on.
        c.handle_timeout(t2);
        while c.poll_transmit(t2).is_some() {}
        let next = c.poll_timeout().expect("the retransmitted SYN's timer");
        assert!(next > t2);
        assert_eq!(c.conn(second).unwrap().stats().retransmits, 1);
    }

    #[test]
    fn a_later_timer_elsewhere_keeps_the_remembered_deadline() {
        let mut c = TestStack::new(Config::default(), KEY, 64);
        let now = Instant::from_millis(10);
        c.connect(now, CLIENT, SocketAddrV4::new(SERVER, 5000))
            .unwrap();
        while c.poll_transmit(now).is_some() {}
        let first = c.poll_timeout().expect("the SYN's timer");
        let checks = c.stats().top_checks;
        // Another connection arms a later timer: the top stands, and its
        // slot is not read again.
        let later = now + Duration::from_millis(5);
        c.connect(later, CLIENT, SocketAddrV4::new(SERVER, 5001))
            .unwrap();
        while c.poll_transmit(later).is_some() {}
        assert_eq!(c.poll_timeout(), Some(first));
        assert_eq!(c.stats().top_checks, checks, "the top was read again");
        // An earlier one takes the top, and is known current.
        let third = c
            .connect(now, CLIENT, SocketAddrV4::new(SERVER, 5002))
            .unwrap();
        while c.poll_transmit(now).is_some() {}
        let t3 = c.poll_timeout().expect("the third SYN's timer");
        assert!(t3 <= first);
        assert_eq!(c.stats().top_checks, checks);
        // Removed, its entry is stale: the next top is checked.
        c.remove(now, third).unwrap();
        assert_eq!(c.poll_timeout(), Some(first));
        assert!(c.stats().top_checks > checks);
    }

    #[test]
    fn ephemeral_ports_differ() {
        let mut c = TestStack::new(Config::default(), KEY, 64);
        let now = Instant::from_millis(1);
        let remote = SocketAddrV4::new(SERVER, 80);
        let mut ports = Vec::new();
        for _ in 0..20 {
            let id = c.connect(now, CLIENT, remote).unwrap();
            ports.push(c.tuple(id).unwrap().local.port());
        }
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 20);
        let fixed = SocketAddrV4::new(CLIENT, ports[0]);
        assert_eq!(
            c.connect_from(now, fixed, remote),
            Err(StackError::PortInUse)
        );
        assert_eq!(c.len(), 20);
    }

    #[test]
    fn table_full_refuses_active_open() {
        let mut c = TestStack::new(Config::default(), KEY, 2);
        let now = Instant::from_millis(1);
        let remote = SocketAddrV4::new(SERVER, 80);
        c.connect(now, CLIENT, remote).unwrap();
        let id = c.connect(now, CLIENT, remote).unwrap();
        assert_eq!(c.connect(now, CLIENT, remote), Err(StackError::TableFull));
        c.remove(now, id).unwrap();
        assert!(c.conn(id).is_none());
        c.connect(now, CLIENT, remote).unwrap();
    }

    #[test]
    fn accept_queue_is_bounded_and_drains() {
        let (mut server, mut client) = pair(2);
        let mut now = secs(1);
        let remote = SocketAddrV4::new(SERVER, 5000);
        let ids: Vec<ConnId> = (0..3)
            .map(|_| client.connect(now, CLIENT, remote).unwrap())
            .collect();
        run(&mut server, &mut client, &mut now, secs(2));
        // Two fill the half-open quota and then the accept queue; the
        // third got a cookie, and its ACK found the queue full and was
        // dropped. Its client believes it is connected.
        assert_eq!(server.len(), 2);
        assert_eq!(server.stats().cookies_sent, 1);
        assert_eq!(server.stats().backlog_drops, 1);
        assert_eq!(client.conn(ids[2]).unwrap().state(), State::Established);
        let first = server.accept(5000).unwrap();
        // The client speaks first (as an MPA initiator does): its data
        // segment carries the cookie ACK again, which now finds room, and
        // the data arrives with it.
        let req = b"MPA ID Req Frame".to_vec();
        client
            .conn_mut(ids[2])
            .unwrap()
            .send_record(now, req.clone())
            .unwrap();
        run(&mut server, &mut client, &mut now, secs(10));
        assert_eq!(server.stats().cookies_accepted, 1);
        let second = server.accept(5000).unwrap();
        let third = server.accept(5000).unwrap();
        assert!(server.accept(5000).is_none());
        assert_eq!(server.stats().accepted, 3);
        let port_of = |s: &TestStack, id: ConnId, remote: bool| {
            let t = s.tuple(id).unwrap();
            if remote {
                t.remote.port()
            } else {
                t.local.port()
            }
        };
        assert_eq!(
            port_of(&server, third, true),
            port_of(&client, ids[2], false)
        );
        let mut got = Vec::new();
        while let Some(p) = server.conn_mut(third).unwrap().recv() {
            got.extend_from_slice(p.bytes());
        }
        assert_eq!(got, req);
        let mut ports = [first, second].map(|id| port_of(&server, id, true));
        ports.sort_unstable();
        let mut want = [ids[0], ids[1]].map(|id| port_of(&client, id, false));
        want.sort_unstable();
        assert_eq!(ports, want);
    }

    #[test]
    fn unlisten_resets_unaccepted_connections() {
        let (mut server, mut client) = pair(4);
        let mut now = secs(1);
        let cid = client
            .connect(now, CLIENT, SocketAddrV4::new(SERVER, 5000))
            .unwrap();
        run(&mut server, &mut client, &mut now, secs(2));
        assert_eq!(server.len(), 1);
        server.unlisten(now, 5000).unwrap();
        assert!(server.is_empty());
        exchange(&mut server, &mut client, now);
        assert!(matches!(client.poll_event(cid), Some(Event::Connected)));
        assert!(matches!(client.poll_event(cid), Some(Event::Reset)));
        assert_eq!(client.conn(cid).unwrap().state(), State::Closed);
        // The terminal event was seen: the next timeout reaps it.
        client.handle_timeout(now);
        assert!(client.is_empty());
    }

    #[test]
    fn syn_flood_does_not_stop_accept() {
        let backlog = 8;
        let (mut server, mut client) = pair(backlog);
        let mut now = secs(100);
        // Thousands of SYNs from random addresses and ports, never
        // completed; the driver drains what the server sends (into the
        // void) as it goes.
        let mut x: u32 = 0x9e37_79b9;
        for i in 0..5000u32 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let src = Ipv4Addr::from(0x0a01_0000 | (x & 0xffff));
            let s = syn((x >> 16) as u16 | 1024, 5000, x);
            server.handle_segment(now, src, SERVER, &s, None);
            if i % 32 == 0 {
                while server.poll_transmit(now).is_some() {}
            }
            // Memory stays bounded by the backlog throughout.
            assert!(server.len() <= backlog);
        }
        while server.poll_transmit(now).is_some() {}
        assert_eq!(server.len(), backlog);
        assert!(server.stats().cookies_sent > 4000);

        // A genuine client still gets in (through a cookie).
        let cid = client
            .connect(now, CLIENT, SocketAddrV4::new(SERVER, 5000))
            .unwrap();
        run(&mut server, &mut client, &mut now, secs(101));
        let sid = server.accept(5000).expect("genuine client accepted");
        assert_eq!(server.stats().cookies_accepted, 1);
        assert_eq!(client.conn(cid).unwrap().state(), State::Established);
        assert_eq!(server.conn(sid).unwrap().state(), State::Established);
        // The cookie SYN-ACK offered the MSS alone: both ends agree that
        // no other option is in use.
        for c in [client.conn(cid).unwrap(), server.conn(sid).unwrap()] {
            assert!(!c.sack_enabled());
            assert!(!c.timestamps_enabled());
            assert_eq!(c.window_shifts(), (0, 0));
        }

        // Data flows on the cookie connection.
        let msg = vec![7u8; 1000];
        client
            .conn_mut(cid)
            .unwrap()
            .send_record(now, msg.clone())
            .unwrap();
        run(&mut server, &mut client, &mut now, secs(102));
        let mut got = Vec::new();
        while let Some(p) = server.conn_mut(sid).unwrap().recv() {
            got.extend_from_slice(p.bytes());
        }
        assert_eq!(got, msg);

        // The half-open flood entries time out and are removed; their
        // SYN-ACK retransmissions go nowhere.
        let mut t = now;
        while t < secs(600) {
            t = server
                .poll_timeout()
                .unwrap_or(secs(600))
                .max(t + Duration::from_millis(1));
            server.handle_timeout(t);
            while server.poll_transmit(t).is_some() {}
        }
        assert_eq!(server.stats().half_open_failed, backlog as u64);
        assert!(server.conn(sid).is_some());
        assert_eq!(server.len(), 1);
    }
}
