//! A bulk-transfer application for simulated hosts: each side of a
//! connection sends a known byte stream as records of
//! [`send_capacity`](tcp_offload::tcp::Connection::send_capacity) size and
//! checks, byte for byte, what it receives. Shared by the seed tests, the
//! scenario tests and the bulk-transfer benchmark.

use core::net::SocketAddrV4;

use super::host::Host;
use super::link::LinkConfig;
use super::network::{Link, Network, NodeId, SimError};
use tcp_offload::tcp::{Config, ConnId, ConnStats, Event, Record, Stack, StackError, State};
use tcp_offload::time::Instant;

/// A deterministic pseudo-random byte stream: the byte at offset `o` of
/// stream `key` is a fixed function of both, so either side can produce or
/// check any part of it without storing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern {
    key: u64,
}

impl Pattern {
    /// The stream named `key` (a test combines the seed and the direction).
    pub const fn new(key: u64) -> Pattern {
        Pattern { key }
    }

    /// The 8 bytes starting at offset `8 * index`: the SplitMix64
    /// finaliser of the key and the index.
    fn word(&self, index: u64) -> [u8; 8] {
        let mut z = self
            .key
            .wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)).to_le_bytes()
    }

    /// Calls `f(chunk_of_pattern, position_in_dst)` over the stream from
    /// `offset` for `len` bytes, a word-aligned piece at a time.
    fn for_each_piece(&self, offset: u64, len: usize, mut f: impl FnMut(&[u8], usize) -> bool) {
        let mut done = 0usize;
        let mut o = offset;
        while done < len {
            let word = self.word(o / 8);
            // `o % 8` is below 8.
            let start = (o % 8) as usize;
            let n = (8 - start).min(len - done);
            if !f(&word[start..start + n], done) {
                return;
            }
            done += n;
            o += n as u64;
        }
    }

    /// Writes the stream from `offset` into `dst`.
    pub fn fill(&self, offset: u64, dst: &mut [u8]) {
        let len = dst.len();
        self.for_each_piece(offset, len, |piece, at| {
            dst[at..at + piece.len()].copy_from_slice(piece);
            true
        });
    }

    /// The stream from `offset`, `len` bytes of it.
    pub fn bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.fill(offset, &mut v);
        v
    }

    /// The stream offset of the first byte of `data` that differs from
    /// the stream (read from `offset`), if any.
    pub fn first_mismatch(&self, offset: u64, data: &[u8]) -> Option<u64> {
        let mut bad = None;
        self.for_each_piece(offset, data.len(), |piece, at| {
            let got = &data[at..at + piece.len()];
            if got == piece {
                return true;
            }
            let i = got.iter().zip(piece).position(|(a, b)| a != b).unwrap_or(0);
            bad = Some(offset + (at + i) as u64);
            false
        });
        bad
    }
}

/// What went wrong in a transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BulkError {
    /// Received bytes differ from the stream at this offset.
    Corrupt { offset: u64 },
    /// More bytes arrived than were sent.
    TooMuch { received: u64 },
    /// A record came back acknowledged out of order or twice: its bytes
    /// are not the stream at the acknowledged offset.
    AckedOutOfOrder { offset: u64 },
    /// The connection was reset or timed out, or vanished.
    Failed {
        state: Option<State>,
        event: &'static str,
    },
    /// A record was refused although it fitted `send_capacity`.
    Refused,
}

impl core::fmt::Display for BulkError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for BulkError {}

/// One side of a bulk transfer over one connection: it sends `to_send`
/// bytes of `out`, expects `to_receive` bytes of `inp`, then closes.
#[derive(Debug)]
pub struct BulkPeer {
    out: Pattern,
    inp: Pattern,
    to_send: u64,
    to_receive: u64,
    /// Bytes handed to the engine as records.
    pub queued: u64,
    /// Bytes whose records came back acknowledged.
    pub acked: u64,
    /// Bytes received in order and verified.
    pub received: u64,
    /// Records sent.
    pub records: u64,
    /// Whether to check the bytes of every received payload (the benchmark
    /// turns it off to time the engine alone, and checks afterwards).
    pub verify: bool,
    /// Whether to close once everything is sent.
    pub close_when_done: bool,
    closed: bool,
    /// The peer's FIN arrived.
    pub peer_closed: bool,
    /// The connection reached its end (`Event::Closed`).
    pub finished: bool,
    /// Whether the application is reading (a test may stop it to let the
    /// receive window fill).
    pub reading: bool,
    /// Largest record size used (0: as large as `send_capacity` allows).
    pub max_record: usize,
    /// The connection's counters as last seen (they outlive the
    /// connection, which the stack removes once it has ended).
    pub conn_stats: ConnStats,
}

impl BulkPeer {
    /// A peer that sends `to_send` bytes of `out` and expects `to_receive`
    /// bytes of `inp`.
    pub fn new(out: Pattern, to_send: u64, inp: Pattern, to_receive: u64) -> BulkPeer {
        BulkPeer {
            out,
            inp,
            to_send,
            to_receive,
            queued: 0,
            acked: 0,
            received: 0,
            records: 0,
            verify: true,
            close_when_done: true,
            closed: false,
            peer_closed: false,
            finished: false,
            reading: true,
            max_record: 0,
            conn_stats: ConnStats::default(),
        }
    }

    /// Everything sent is acknowledged and everything expected received.
    pub fn data_done(&self) -> bool {
        self.acked == self.to_send && self.received == self.to_receive
    }

    /// Whether this side has called `close`.
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Plays the application on connection `id` of `stack` at `now`:
    /// handles events, reads and verifies, offers records, closes.
    ///
    /// # Errors
    /// A [`BulkError`] at the first misbehaviour seen.
    pub fn step(
        &mut self,
        now: Instant,
        stack: &mut Stack<Vec<u8>, Vec<u8>>,
        id: ConnId,
    ) -> Result<(), BulkError> {
        if let Some(c) = stack.conn(id) {
            self.conn_stats = *c.stats();
        }
        while let Some(ev) = stack.poll_event(id) {
            match ev {
                Event::Connected => {}
                Event::RecordAcked(r) => {
                    if self.verify && self.out.first_mismatch(self.acked, &r).is_some() {
                        return Err(BulkError::AckedOutOfOrder { offset: self.acked });
                    }
                    self.acked += Record::len(&r) as u64;
                }
                Event::PeerClosed => self.peer_closed = true,
                Event::Closed => self.finished = true,
                Event::Reset => return Err(self.failed(stack, id, "reset")),
                Event::TimedOut => return Err(self.failed(stack, id, "timed out")),
            }
        }
        if self.finished {
            return Ok(());
        }
        let Some(conn) = stack.conn_mut(id) else {
            return Err(BulkError::Failed {
                state: None,
                event: "connection vanished",
            });
        };
        if self.reading {
            while let Some(p) = conn.recv() {
                let data = p.bytes();
                if self.verify {
                    if let Some(offset) = self.inp.first_mismatch(self.received, data) {
                        return Err(BulkError::Corrupt { offset });
                    }
                }
                self.received += data.len() as u64;
                if self.received > self.to_receive {
                    return Err(BulkError::TooMuch {
                        received: self.received,
                    });
                }
            }
        }
        while self.queued < self.to_send {
            let mut cap = conn.send_capacity();
            if self.max_record > 0 {
                cap = cap.min(self.max_record);
            }
            if cap == 0 {
                break;
            }
            let left = usize::try_from(self.to_send - self.queued).unwrap_or(usize::MAX);
            let record = self.out.bytes(self.queued, cap.min(left));
            let n = record.len() as u64;
            if conn.send_record(now, record).is_err() {
                return Err(BulkError::Refused);
            }
            self.queued += n;
            self.records += 1;
        }
        if self.close_when_done && !self.closed && self.queued == self.to_send {
            conn.close(now);
            self.closed = true;
        }
        Ok(())
    }

    fn failed(
        &self,
        stack: &Stack<Vec<u8>, Vec<u8>>,
        id: ConnId,
        event: &'static str,
    ) -> BulkError {
        BulkError::Failed {
            state: stack.conn(id).map(|c| c.state()),
            event,
        }
    }
}

/// A two-host bulk transfer: host 1 (the client) connects to a listener
/// on host 2 (the server), and each sends its stream to the other.
#[derive(Debug, Clone)]
pub struct TransferSpec {
    /// Seed of the network (and, mixed with the direction, of the streams).
    pub seed: u64,
    /// TCP configuration of the client.
    pub client: Config,
    /// TCP configuration of the server.
    pub server: Config,
    /// The link from client to server.
    pub uplink: LinkConfig,
    /// The link from server to client.
    pub downlink: LinkConfig,
    /// Bytes the client sends.
    pub client_bytes: u64,
    /// Bytes the server sends.
    pub server_bytes: u64,
    /// Whether each side checks what it receives as it arrives.
    pub verify: bool,
    /// Whether the hosts start with each other's MAC address in their ARP
    /// caches. Without it the connection starts with an ARP exchange over
    /// the (possibly lossy) link; with it, timing measurements start at the
    /// first SYN.
    pub static_arp: bool,
}

impl TransferSpec {
    /// `bytes` each way over a symmetric `link`, both sides with `tcp`.
    pub fn symmetric(seed: u64, tcp: Config, link: LinkConfig, bytes: u64) -> TransferSpec {
        TransferSpec {
            seed,
            client: tcp.clone(),
            server: tcp,
            uplink: link.clone(),
            downlink: link,
            client_bytes: bytes,
            server_bytes: bytes,
            verify: true,
            static_arp: false,
        }
    }
}

/// Why a transfer did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferError {
    /// The network stopped (deadline, idle, livelock) before the end.
    Sim(SimError),
    /// The application saw a misbehaviour on the client (`true`) or the
    /// server side.
    App { client: bool, error: BulkError },
    /// The active open could not start.
    Connect(StackError),
}

impl core::fmt::Display for TransferError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for TransferError {}

/// The port the server listens on.
pub const SERVER_PORT: u16 = 5001;

/// The two applications of a [`Transfer`] and the connections they use.
#[derive(Debug)]
pub struct Apps {
    pub client: NodeId,
    pub server: NodeId,
    pub client_conn: ConnId,
    /// The server's connection, once accepted.
    pub server_conn: Option<ConnId>,
    pub client_app: BulkPeer,
    pub server_app: BulkPeer,
}

impl Apps {
    /// The applications of `spec` on hosts `client` and `server`, the
    /// client using connection `client_conn`.
    pub fn new(spec: &TransferSpec, client: NodeId, server: NodeId, client_conn: ConnId) -> Apps {
        let up = Pattern::new(spec.seed.rotate_left(1) ^ 0xC11E);
        let down = Pattern::new(spec.seed.rotate_left(1) ^ 0x5E7E);
        let mut client_app = BulkPeer::new(up, spec.client_bytes, down, spec.server_bytes);
        let mut server_app = BulkPeer::new(down, spec.server_bytes, up, spec.client_bytes);
        client_app.verify = spec.verify;
        server_app.verify = spec.verify;
        Apps {
            client,
            server,
            client_conn,
            server_conn: None,
            client_app,
            server_app,
        }
    }

    /// Plays both applications once at the current time: the server
    /// accepts if it has not yet, then each side handles events, reads and
    /// sends.
    ///
    /// # Errors
    /// The first misbehaviour either application saw.
    pub fn step(&mut self, net: &mut Network<Host>) -> Result<(), TransferError> {
        let now = net.now();
        let (client, server) = net.endpoint_pair_mut(self.client, self.server);
        self.step_stacks(
            now,
            client.iface_mut().stack_mut(),
            server.iface_mut().stack_mut(),
        )
    }

    /// [`Apps::step`] for hosts in a network of another endpoint type.
    ///
    /// # Errors
    /// As [`Apps::step`].
    pub fn step_stacks(
        &mut self,
        now: Instant,
        client: &mut Stack<Vec<u8>, Vec<u8>>,
        server: &mut Stack<Vec<u8>, Vec<u8>>,
    ) -> Result<(), TransferError> {
        self.client_app
            .step(now, client, self.client_conn)
            .map_err(|error| TransferError::App {
                client: true,
                error,
            })?;
        if self.server_conn.is_none() {
            self.server_conn = server.accept(SERVER_PORT);
        }
        if let Some(id) = self.server_conn {
            self.server_app
                .step(now, server, id)
                .map_err(|error| TransferError::App {
                    client: false,
                    error,
                })?;
        }
        Ok(())
    }

    /// Whether all data arrived and was acknowledged both ways (the
    /// connections may still be closing).
    pub fn data_done(&self) -> bool {
        self.server_conn.is_some() && self.client_app.data_done() && self.server_app.data_done()
    }

    /// Whether, besides, both sides saw the other's FIN and their
    /// connection's end (`Event::Closed`, after TIME-WAIT for an active
    /// closer).
    pub fn finished(&self) -> bool {
        self.data_done()
            && [&self.client_app, &self.server_app]
                .iter()
                .all(|a| a.peer_closed && a.finished)
    }

    /// Bytes verified on arrival, both ways.
    pub fn bytes_received(&self) -> u64 {
        self.client_app.received + self.server_app.received
    }
}

/// A running two-host transfer (see [`TransferSpec`]). Its fields are open
/// so that scenario tests can reach into the network, the hosts and the
/// applications between rounds.
#[derive(Debug)]
pub struct Transfer {
    pub net: Network<Host>,
    pub link: Link,
    pub apps: Apps,
}

impl Transfer {
    /// Builds the network, starts the listener and the active open.
    ///
    /// # Errors
    /// [`TransferError::Connect`] if the stack refuses the open.
    pub fn new(spec: &TransferSpec) -> Result<Transfer, TransferError> {
        let mut net = Network::new(spec.seed);
        let client = net.add_endpoint(Host::numbered(1, spec.client.clone(), spec.seed));
        let server = net.add_endpoint(Host::numbered(2, spec.server.clone(), spec.seed));
        let link =
            net.connect_asymmetric(client, server, spec.uplink.clone(), spec.downlink.clone());
        if spec.static_arp {
            net.endpoint_mut(client)
                .iface_mut()
                .add_static_arp(Host::ip_of(2), Host::mac_of(2));
            net.endpoint_mut(server)
                .iface_mut()
                .add_static_arp(Host::ip_of(1), Host::mac_of(1));
        }
        let server_addr = SocketAddrV4::new(Host::ip_of(2), SERVER_PORT);
        net.endpoint_mut(server)
            .iface_mut()
            .stack_mut()
            .listen(server_addr, 16)
            .map_err(TransferError::Connect)?;
        let now = net.now();
        let client_conn = net
            .endpoint_mut(client)
            .iface_mut()
            .stack_mut()
            .connect(now, Host::ip_of(1), server_addr)
            .map_err(TransferError::Connect)?;
        Ok(Transfer {
            net,
            link,
            apps: Apps::new(spec, client, server, client_conn),
        })
    }

    /// Runs until both connections have finished ([`Apps::finished`]);
    /// returns when they did.
    ///
    /// # Errors
    /// The application's misbehaviour, or why the network stopped (its
    /// deadline is `deadline`, in virtual time).
    pub fn run(&mut self, deadline: Instant) -> Result<Instant, TransferError> {
        self.run_until(deadline, |_, apps| apps.finished())
    }

    /// Runs, playing both applications every round, until `done` holds.
    /// `done` may also act: stop a reader, change a link, inject a frame.
    ///
    /// # Errors
    /// As [`Transfer::run`].
    pub fn run_until(
        &mut self,
        deadline: Instant,
        mut done: impl FnMut(&mut Network<Host>, &mut Apps) -> bool,
    ) -> Result<Instant, TransferError> {
        let apps = &mut self.apps;
        let mut app_error = None;
        let r = self.net.run_until(deadline, |net| match apps.step(net) {
            Ok(()) => done(net, apps),
            Err(e) => {
                app_error = Some(e);
                true
            }
        });
        match app_error {
            Some(e) => Err(e),
            None => r.map_err(TransferError::Sim),
        }
    }

    /// The client host.
    pub fn client_host(&self) -> &Host {
        self.net.endpoint(self.apps.client)
    }

    /// The server host.
    pub fn server_host(&self) -> &Host {
        self.net.endpoint(self.apps.server)
    }

    /// The client's connection.
    pub fn client_conn(&self) -> Option<&tcp_offload::tcp::Connection<Vec<u8>, Vec<u8>>> {
        self.client_host()
            .iface()
            .stack()
            .conn(self.apps.client_conn)
    }

    /// The server's connection, once accepted.
    pub fn server_conn(&self) -> Option<&tcp_offload::tcp::Connection<Vec<u8>, Vec<u8>>> {
        let id = self.apps.server_conn?;
        self.server_host().iface().stack().conn(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_a_function_of_key_and_offset() {
        let p = Pattern::new(42);
        let whole = p.bytes(0, 1000);
        for start in [0u64, 1, 7, 8, 9, 500, 983] {
            for len in [0usize, 1, 3, 8, 17] {
                let s = usize::try_from(start).unwrap();
                assert_eq!(p.bytes(start, len), whole[s..s + len]);
            }
        }
        assert_ne!(Pattern::new(43).bytes(0, 64), whole[..64]);
        assert_eq!(p.first_mismatch(100, &whole[100..400]), None);
        let mut bad = whole[100..400].to_vec();
        bad[123] ^= 4;
        assert_eq!(p.first_mismatch(100, &bad), Some(223));
    }
}
