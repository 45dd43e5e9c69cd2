//! One TCP connection (a TCB): the public face of the state machine whose
//! transitions live in the sibling sub-machine modules.

use core::net::SocketAddrV4;

use super::config::Config;
use super::{Event, Payload, Record, Segment, State};
use crate::seq::SeqNumber;
use crate::time::Instant;
use crate::wire::TcpRepr;

/// Counters kept per connection, readable at any time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnStats {
    pub segments_in: u64,
    pub segments_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Segments retransmitted, for any reason.
    pub retransmits: u64,
    /// Retransmission timeouts that fired.
    pub rto_expirations: u64,
    /// Fast retransmits (three duplicate ACKs or SACK loss detection).
    pub fast_retransmits: u64,
    /// Segments dropped: out of window, PAWS, or out-of-order beyond the
    /// configured bounds.
    pub dropped: u64,
    /// Zero-window probes sent.
    pub window_probes: u64,
    /// Records resent in more than one segment because the MSS shrank.
    pub records_split: u64,
}

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// Longer than [`Connection::send_capacity`] allows right now.
    TooLarge,
    /// Empty records carry nothing and would confuse acknowledgment.
    Empty,
    /// The connection cannot send (not yet established, or closing).
    InvalidState,
}

/// A TCP connection. `B` is the receive buffer type (payload stays in it),
/// `R` the record type of the sender.
#[derive(Debug)]
pub struct Connection<B, R> {
    _marker: core::marker::PhantomData<(B, R)>,
}

impl<B: AsRef<[u8]>, R: Record> Connection<B, R> {
    /// Starts an active open: the connection is in SYN-SENT and its SYN is
    /// ready in `poll_transmit`.
    pub fn connect(
        now: Instant,
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: SeqNumber,
    ) -> Connection<B, R> {
        let _ = (now, config, local, remote, iss);
        unimplemented!()
    }

    /// Starts a passive open from a received SYN: the connection is in
    /// SYN-RECEIVED and its SYN-ACK is ready in `poll_transmit`.
    pub fn accept(
        now: Instant,
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        syn: &TcpRepr,
        iss: SeqNumber,
    ) -> Connection<B, R> {
        let _ = (now, config, local, remote, syn, iss);
        unimplemented!()
    }

    /// Creates an ESTABLISHED connection from the final ACK of a handshake
    /// whose SYN was answered statelessly with a SYN cookie. `iss` is our
    /// ISN (the cookie), `irs` the peer's, and the options are those the
    /// cookie encoded.
    #[allow(clippy::too_many_arguments)] // mirrors the fields a cookie carries
    pub fn from_cookie(
        now: Instant,
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        ack: &TcpRepr,
        iss: SeqNumber,
        irs: SeqNumber,
        peer_mss: u16,
    ) -> Connection<B, R> {
        let _ = (now, config, local, remote, ack, iss, irs, peer_mss);
        unimplemented!()
    }

    /// Current state.
    pub fn state(&self) -> State {
        unimplemented!()
    }

    /// Local address and port.
    pub fn local(&self) -> SocketAddrV4 {
        unimplemented!()
    }

    /// Remote address and port.
    pub fn remote(&self) -> SocketAddrV4 {
        unimplemented!()
    }

    /// Counters.
    pub fn stats(&self) -> &ConnStats {
        unimplemented!()
    }

    /// Processes one received segment addressed to this connection.
    /// `payload` is the segment's payload by reference (`None` when empty).
    pub fn handle_segment(&mut self, now: Instant, repr: &TcpRepr, payload: Option<Payload<B>>) {
        let _ = (now, repr, payload);
        unimplemented!()
    }

    /// The next segment to send, if any: SYN, SYN-ACK, a new or
    /// retransmitted record, a pure ACK, a window probe, FIN or RST.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Segment<'_, R>> {
        let _ = now;
        unimplemented!()
    }

    /// When `handle_timeout` must next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        unimplemented!()
    }

    /// Runs the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = now;
        unimplemented!()
    }

    /// The next event for the upper layer.
    pub fn poll_event(&mut self) -> Option<Event<R>> {
        unimplemented!()
    }

    /// The largest record [`Connection::send_record`] accepts now: the
    /// effective MSS, limited by the peer's window and the congestion
    /// window. Zero when nothing may be sent.
    pub fn send_capacity(&self) -> usize {
        unimplemented!()
    }

    /// The effective MSS: the largest record a segment can ever carry on
    /// this connection, whatever the windows.
    pub fn max_record_len(&self) -> usize {
        unimplemented!()
    }

    /// Queues one record, sent as exactly one segment. Its length must be
    /// at most [`Connection::send_capacity`].
    pub fn send_record(&mut self, now: Instant, record: R) -> Result<(), (SendError, R)> {
        let _ = (now, record);
        unimplemented!()
    }

    /// Lowers the effective MSS (a path MTU decrease, RFC 1191). New
    /// records are sized to it. A record already sent that no longer fits
    /// is, when retransmitted, resent in segments of the new MSS; the
    /// receiver reassembles it (RFC 5044 §8.1 requires MPA receivers to
    /// handle FPDUs that span segments) and `records_split` counts it.
    pub fn set_path_mtu_mss(&mut self, mss: u16) {
        let _ = mss;
        unimplemented!()
    }

    /// The next in-order payload received, if any. Reading frees receive
    /// buffer space, which opens the advertised window.
    pub fn recv(&mut self) -> Option<Payload<B>> {
        unimplemented!()
    }

    /// Closes the sending direction: FIN after every queued record.
    pub fn close(&mut self, now: Instant) {
        let _ = now;
        unimplemented!()
    }

    /// Resets the connection: RST to the peer, CLOSED here.
    pub fn abort(&mut self, now: Instant) {
        let _ = now;
        unimplemented!()
    }
}
