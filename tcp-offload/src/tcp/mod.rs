//! The TCP engine: one [`Connection`] per TCB, and a [`Stack`] that owns a
//! connection table keyed by 4-tuple, listeners and SYN cookies.
//!
//! Sans-IO, in the quinn-proto style. Inputs are `handle_*` calls, outputs
//! are `poll_*` calls, and `now` is always an argument. The order of calls
//! for a driver is:
//!
//! 1. for each received segment, `handle_segment(now, …)`;
//! 2. `handle_timeout(now)` when `now >= poll_timeout()`;
//! 3. drain `poll_event()` (acknowledged records, state changes),
//!    `poll_dropped()` (records given up unacknowledged after a reset or
//!    timeout) and `recv()` (in-order payload);
//! 4. offer new records while `send_capacity()` is non-zero (or, building
//!    each record to the room offered, through `send_room()`);
//! 5. drain `poll_transmit(now)` and put each segment on the wire.
//!
//! Shaped for iWARP: a *record* (an MPA FPDU) is sent as exactly one
//! segment, never split and never merged with another, a retransmission
//! resends the same boundaries, and the acknowledgment of each record is
//! reported upward as [`Event::RecordAcked`] so that a zero-copy sender
//! knows when its buffer is free. Received payload is handed up as
//! [`Payload`]s that borrow the buffer it arrived in (an mbuf, in the
//! dataplane), in order, without a copy.
//!
//! The state machine is split by sub-machine: `handshake` (RFC 9293
//! §3.5, SYN-SENT and SYN-RECEIVED), `established` (data, flow control,
//! RFC 7323 window scaling, timestamps and PAWS), `close` (FIN, RST,
//! TIME-WAIT), `timers` (RFC 6298 RTO, delayed ACK, persist, keepalive) and
//! `recovery` (fast retransmit and NewReno, RFC 6582; the SACK scoreboard
//! and loss recovery of RFC 2018 and RFC 6675), with `rack` (RACK-TLP,
//! RFC 8985: time-based loss detection and the tail loss probe).

pub mod assembler;
mod close;
pub mod config;
pub mod connection;
pub mod cookie;
mod established;
mod handshake;
pub mod isn;
mod output;
mod rack;
mod recovery;
mod rtt;
mod sendq;
pub mod table;
mod timers;

pub use assembler::Assembler;
pub use config::Config;
pub use connection::{ConnStats, Connection, SendRoom};
pub use established::PAWS_WINDOW;
pub use sendq::Train;
pub use table::{ConnId, FourTuple, Stack, StackError, Turn};

use crate::wire::TcpRepr;
use core::ops::Range;

/// Connection states, named as RFC 9293 §3.3.2 names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    Closed,
    Listen,
    SynSent,
    SynReceived,
    Established,
    FinWait1,
    FinWait2,
    CloseWait,
    Closing,
    LastAck,
    TimeWait,
}

impl State {
    /// The RFC's name for the state, as `ss` and `netstat` print it.
    pub fn name(self) -> &'static str {
        match self {
            State::Closed => "CLOSED",
            State::Listen => "LISTEN",
            State::SynSent => "SYN-SENT",
            State::SynReceived => "SYN-RECEIVED",
            State::Established => "ESTABLISHED",
            State::FinWait1 => "FIN-WAIT-1",
            State::FinWait2 => "FIN-WAIT-2",
            State::CloseWait => "CLOSE-WAIT",
            State::Closing => "CLOSING",
            State::LastAck => "LAST-ACK",
            State::TimeWait => "TIME-WAIT",
        }
    }
}

/// Received payload, kept by reference to the buffer it arrived in.
///
/// `buf` is the whole received frame (or any buffer); the payload is
/// `buf.as_ref()[start..start + len]`. Trimming an overlap moves `start` or
/// shrinks `len`; the bytes are never copied.
#[derive(Debug, Clone)]
pub struct Payload<B> {
    buf: B,
    start: usize,
    len: usize,
}

impl<B: AsRef<[u8]>> Payload<B> {
    /// The payload `range` of `buf`, or `None` if the range lies outside it.
    pub fn new(buf: B, range: Range<usize>) -> Option<Payload<B>> {
        if range.start > range.end || range.end > buf.as_ref().len() {
            return None;
        }
        Some(Payload {
            buf,
            start: range.start,
            len: range.end - range.start,
        })
    }

    /// The whole of `buf`.
    pub fn whole(buf: B) -> Payload<B> {
        let len = buf.as_ref().len();
        Payload { buf, start: 0, len }
    }

    /// The payload bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf.as_ref()[self.start..self.start + self.len]
    }

    /// Payload length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops the first `n` bytes (all of them if `n` exceeds the length).
    pub fn trim_front(&mut self, n: usize) {
        let n = n.min(self.len);
        self.start += n;
        self.len -= n;
    }

    /// Keeps only the first `n` bytes.
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }

    /// Offset of the payload within the buffer.
    pub fn offset(&self) -> usize {
        self.start
    }

    /// The buffer the payload lives in.
    pub fn buffer(&self) -> &B {
        &self.buf
    }

    /// Gives the buffer back (for an mbuf: to free it).
    pub fn into_buffer(self) -> B {
        self.buf
    }
}

/// One record handed to [`Connection::send_record`]: in iWARP, one MPA FPDU.
/// The engine does not need the bytes themselves, only the length; it keeps
/// the record until it is acknowledged and hands it back then, so that a
/// zero-copy sender can keep its memory referenced for retransmissions. A
/// record may be a small handle on bytes the driver keeps elsewhere (the
/// dataplane's records stay in place in a table of its own while TCP moves
/// only the handle); drivers that build whole frames from the record itself
/// use [`RecordBytes`].
pub trait Record {
    /// Length of the record in bytes (sequence space it occupies).
    fn len(&self) -> usize;

    /// Whether the record may share a frame with others: ride in a train
    /// for the port to cut apart, or be packed with other whole records
    /// into one segment ([`Segment::more`]); a record that must have a
    /// frame of its own says no.
    fn joins_train(&self) -> bool {
        true
    }

    /// Whether the record ends a message of the layer above: its segment
    /// then carries PSH, which the receiver acknowledges as soon as it
    /// has read it. The last record queued is pushed whatever this says.
    fn ends_message(&self) -> bool {
        true
    }

    /// Whether the record is empty (never true for a record the engine
    /// accepts).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A record that holds its bytes, for drivers that build whole frames
/// from it ([`crate::iface::Interface::poll_frame`]: the simulator, the
/// kernel-interop test).
pub trait RecordBytes: Record {
    /// Copies `dst.len()` bytes of the record, starting at `offset`, into
    /// `dst`.
    fn copy_to(&self, offset: usize, dst: &mut [u8]);
}

impl Record for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

impl RecordBytes for Vec<u8> {
    fn copy_to(&self, offset: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self[offset..offset + dst.len()]);
    }
}

impl Record for Box<[u8]> {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

impl RecordBytes for Box<[u8]> {
    fn copy_to(&self, offset: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self[offset..offset + dst.len()]);
    }
}

impl Record for &'static [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

impl RecordBytes for &'static [u8] {
    fn copy_to(&self, offset: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self[offset..offset + dst.len()]);
    }
}

/// A segment to transmit: the header, and the part of a record it carries.
#[derive(Debug)]
pub struct Segment<'a, R> {
    /// The header. Its options are final; the window is already scaled.
    pub repr: TcpRepr,
    /// The record bytes this segment carries, if any. Normally the whole
    /// record (`range == 0..record.len()`); only a retransmission after the
    /// MSS shrank below the record's length carries a part (see
    /// [`Connection::send_record`]).
    pub payload: Option<(&'a R, Range<usize>)>,
    /// Whole records after `payload` that the segment also carries: for a
    /// port that cuts it into segments of one record each (a train, TCP
    /// segmentation offload, [`Config::train_bytes`]), or packed into this
    /// one segment, which is at most an MSS long ([`Train::is_pack`],
    /// [`Config::pack_records`]); only new data, and only when `payload`
    /// is a whole record.
    pub more: Option<Train<'a, R>>,
}

impl<'a, R: Record> Segment<'a, R> {
    /// A segment with no payload.
    pub fn bare(repr: TcpRepr) -> Segment<'a, R> {
        Segment {
            repr,
            payload: None,
            more: None,
        }
    }

    /// Bytes of payload the segment carries (with a train, all of it).
    pub fn payload_len(&self) -> usize {
        self.payload.as_ref().map_or(0, |(_, r)| r.end - r.start)
            + self.more.as_ref().map_or(0, Train::bytes)
    }

    /// Whether the segment's payload ends with the last byte of a record
    /// that ends a message ([`Record::ends_message`]).
    pub fn ends_message(&self) -> bool {
        if let Some(t) = &self.more {
            return t.records().last().is_some_and(Record::ends_message);
        }
        self.payload
            .as_ref()
            .is_some_and(|(r, range)| range.end == r.len() && r.ends_message())
    }
}

/// What a connection reports upward, drained with
/// [`Connection::poll_event`].
#[derive(Debug)]
pub enum Event<R> {
    /// The three-way handshake completed (ESTABLISHED).
    Connected,
    /// Every byte of this record is acknowledged. Records are reported in
    /// the order they were sent, each exactly once.
    RecordAcked(R),
    /// The peer sent FIN: no more payload will arrive.
    PeerClosed,
    /// The connection is gone (both FINs exchanged and acknowledged, or
    /// TIME-WAIT expired).
    Closed,
    /// The connection was reset: by the peer (RST), or locally.
    Reset,
    /// Retransmissions (or keepalive probes, or the handshake) gave up.
    ///
    /// After `Reset` or `TimedOut` (or any end with records still
    /// unacknowledged), those records are handed back, oldest first and
    /// each exactly once, through [`Connection::poll_dropped`].
    TimedOut,
}
