//! The QP engine: one iWARP endpoint per connection, tying MPA (RFC 5044,
//! RFC 6581), DDP (RFC 5041) and RDMAP (RFC 5040) to the verbs objects,
//! sans-IO, over an in-order byte stream.
//!
//! It sits between the TCP engine (which hands it in-order payload and
//! takes records sized to one segment) and the verbs model (the queue pair
//! it owns, the STag table, completion queues, shared receive queues, and
//! memory through [`Placement`]). The stream is abstract: in the dataplane
//! it is `tcp-offload`'s connection; in tests a plain byte pipe.
//!
//! # Call order (the driver's side)
//!
//! 1. [`Endpoint::initiator`] (the active side, after TCP's handshake) or
//!    [`Endpoint::responder`] (the passive side), with an MPA
//!    [`Config`] and the [`QueuePair`] the connection will carry (created
//!    in Idle; work may already be posted to it). A passive side whose
//!    queue pair comes with the application's answer to the request
//!    starts with [`Endpoint::awaiting_request`] instead.
//! 2. Whenever TCP can take a record: [`Endpoint::poll_record`] with the
//!    size TCP offers (`send_capacity`), repeatedly until it returns
//!    `None`; queue each [`OutRecord`] as one TCP record. MPA frames come
//!    out first, then (in peer-to-peer mode) the RTR, then FPDUs.
//! 3. In-order payload from TCP: [`Endpoint::handle_stream`], in whatever
//!    chunks it arrives. The MPA negotiator consumes exactly its frame;
//!    what follows in the same chunk goes to the deframer and the receive
//!    path.
//! 4. When TCP reports a record acknowledged: [`Endpoint::record_acked`]
//!    (returns its pin, completes Sends and Writes whose last byte it
//!    carried). When the connection goes away with records unacknowledged:
//!    [`Endpoint::record_dropped`] for each, and
//!    [`Endpoint::handle_stream_closed`].
//! 5. [`Endpoint::poll_timeout`] / [`Endpoint::handle_timeout`] while MPA
//!    setup runs.
//! 6. Drain [`Endpoint::poll_event`] after each call. A responder answers
//!    [`EngineEvent::ConnectRequest`] with [`Endpoint::accept`] (or
//!    [`Endpoint::accept_on`]) or [`Endpoint::reject`]. On [`EngineEvent::ReadyToClose`] the driver
//!    closes TCP (after the records already queued).
//! 7. Orderly close: the application calls [`Endpoint::disconnect`]; the
//!    driver reports the peer's FIN with [`Endpoint::handle_peer_closed`]
//!    (and the end of the connection with
//!    [`Endpoint::handle_stream_closed`]); [`EngineEvent::Closed`] ends it.
//!
//! After posting work to the queue pair ([`Endpoint::qp_mut`]), call
//! [`Endpoint::poll_record`] again; after polling the CQs, nothing is
//! needed. Completions are written to the CQs in [`Env`] by every call.
//!
//! # Receive path
//!
//! Each ULPDU's header is gathered into a small array (it may be split
//! across chunks and markers), parsed, and checked before a byte is
//! placed: tagged segments against the STag table (RDMA Write: STag, key,
//! protection domain, remote write right, TO wrap, base and bounds; Read
//! Response: the sink of the oldest outstanding Read, in order), untagged
//! Sends against the queue's MSN and the posted receive buffer (MO, length).
//! Payload is then written piece by piece through [`Placement`], each piece
//! re-checked. Tagged and untagged reassembly are kept apart, so a Send
//! may sit between the segments of a Read Response. Payload is placed
//! before the CRC that covers it arrives (the deframer's design); nothing
//! completes until the CRC has matched. Read Requests (queue 1) are checked
//! (source STag, rights, bounds, pinned) and queued against IRD; their
//! Responses go out from the pinned source. A Terminate (queue 2) from the
//! peer moves the queue pair to Error.
//!
//! Any fault the peer causes — a framing, CRC, header or placement error —
//! is answered with one Terminate (RFC 5040 §4.8 layout, reporting the
//! offending segment's header where the cause calls for it). The first
//! fault wins; the rest of the stream is ignored. The queue pair moves to
//! Terminate, then to Error once the Terminate has been handed to TCP,
//! and outstanding work is flushed. A local failure (a work request's
//! memory gone, a full CQ) moves the queue pair to Error and is reported
//! to the peer as an RDMAP local catastrophic error.
//!
//! # Send path
//!
//! Work comes from [`QueuePair::next_work`] (ORD and fences are its
//! business). Every FPDU is built to fit the segment TCP offers (MULPDU at
//! the current stream position, markers and CRC counted): its header in a
//! fixed array, its payload by reference (a pin on the source region, one
//! per FPDU, carried by the record), pad and CRC after. An FPDU's payload
//! never spans two scatter/gather entries. The CRC is computed through
//! [`Placement::crc32c_append`], which implementations with direct access
//! to their memory run over the bytes in place. A Send or Write is
//! reported transmitted when its last FPDU is built, and completes when
//! the record that carried it is acknowledged — after any earlier Read
//! ([`QueuePair`] orders completions). Read Responses alternate FPDU by
//! FPDU with the send queue's own work.
//!
//! # Waking a responder
//!
//! Linux siw as MPA responder sends its reply before it hands the socket
//! to the queue pair; an FPDU that reaches it in between stays unread in
//! its socket until the next segment with data arrives. An initiator that
//! answers the reply at once with a single FPDU (a Send, or an RTR) and
//! then waits for the responder stalls: the responder never saw it, and
//! with a Read RTR siw's MPA timer later tears the connection down. So, as
//! initiator, once per connection: if nothing has arrived from the peer
//! [`Config::nudge_after`] after our first FPDU, we send one zero-length
//! RDMA Write ([`crate::mpa::rtr::nudge_ulpdu`]), which places and
//! completes nothing at the peer, only between our messages and only
//! before the peer's first FPDU. The engine has no clock: the first FPDU
//! makes [`Endpoint::poll_timeout`] due at once, and the driver's next
//! [`Endpoint::handle_timeout`] stamps the deadline from its `now`.
//!
//! # Who speaks first
//!
//! A responder holds its FPDUs until the initiator's first one (RFC 5044
//! §7.1.1; in peer-to-peer mode the RTR). With
//! [`Config::responder_waits_for_first_fpdu`] off and no peer-to-peer, it
//! may also speak once both hold: TCP has acknowledged the whole MPA reply
//! (so no FPDU can share a segment with it: Linux siw as initiator treats
//! bytes behind the reply as a protocol error), and the application has
//! posted work after the connection was established (work posted earlier
//! waits with it). Linux siw's responder does not wait at all; ULPs whose
//! passive side speaks first (perftest's write_lat) depend on that.
//!
//! Nothing here allocates per FPDU: headers and trailers are fixed arrays,
//! queues were sized when the objects were created. MPA frames are copied
//! into one allocation per connection.

mod close;
mod record;
mod rx;
mod tx;

use std::collections::VecDeque;

use core::time::Duration;

pub use record::{OutRecord, Piece, Pieces, PlainParts, RangeError, RecordKind, MAX_HEAD_LEN};

use crate::error::TerminateCause;
use crate::mpa::{
    Config, Deframer, Event as MpaEvent, Framer, Negotiated, NegotiationError, Negotiator,
    PeerRequest, Rejection, Role, RtrType, SetupError,
};
use crate::placement::Placement;
use crate::verbs::{
    CompletionQueue, CqId, Device, PdId, QpInitAttr, QpModify, QpNum, QpState, QueuePair, SendOp,
    SendWr, SharedReceiveQueue, VerbsError, WcStatus, WrSeq,
};
use crate::wire::{DdpRepr, RdmapOpcode, ReadRequest, TerminateRepr};

/// What the engine needs from its surroundings for one call: the device
/// (STag table), memory, and the shared objects the queue pair uses.
///
/// `recv_cq: None` means the receive CQ is `send_cq` (one CQ for both, as
/// rping and perftest create them).
#[derive(Debug)]
pub struct Env<'a, M: Placement + ?Sized> {
    /// The device whose STag table checks every access.
    pub device: &'a mut Device,
    /// Registered memory.
    pub mem: &'a mut M,
    /// The queue pair's send CQ.
    pub send_cq: &'a mut CompletionQueue,
    /// Its receive CQ, if not the same as `send_cq`.
    pub recv_cq: Option<&'a mut CompletionQueue>,
    /// Its shared receive queue, if it was created with one.
    pub srq: Option<&'a mut SharedReceiveQueue>,
}

impl<'a, M: Placement + ?Sized> Env<'a, M> {
    /// An environment with one CQ for sends and receives and no SRQ.
    pub fn new(device: &'a mut Device, mem: &'a mut M, cq: &'a mut CompletionQueue) -> Self {
        Env {
            device,
            mem,
            send_cq: cq,
            recv_cq: None,
            srq: None,
        }
    }

    fn recv_cq(&mut self) -> &mut CompletionQueue {
        match self.recv_cq {
            Some(ref mut cq) => cq,
            None => self.send_cq,
        }
    }
}

/// Who ended the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TerminateOrigin {
    /// We found a fault (or failed locally) and sent a Terminate.
    Local,
    /// The peer sent a Terminate.
    Peer,
    /// TCP went away under the stream; nothing could be sent.
    Stream,
}

/// Why connection setup did not produce a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetupFailure {
    /// The MPA negotiation failed (a Terminate follows when RFC 6581 §8
    /// asks for one).
    Negotiation(NegotiationError),
    /// Bytes arrived where the protocol allows none (after the request,
    /// before our reply).
    UnexpectedData,
    /// The queue pair refused the negotiated state (not in Idle, or IRD/ORD
    /// beyond its limits).
    QueuePair(VerbsError),
    /// TCP closed before setup finished.
    StreamClosed,
}

impl SetupFailure {
    /// Whether the peer (or the path to it) did something the operator
    /// must change; a queue pair refusing the negotiated state is ours.
    pub fn peer_at_fault(&self) -> bool {
        !matches!(self, SetupFailure::QueuePair(_))
    }

    /// One value of every variant (every negotiation error among them),
    /// for the tests that walk each message.
    pub fn all() -> Vec<SetupFailure> {
        let mut all: Vec<SetupFailure> = NegotiationError::ALL
            .iter()
            .map(|e| SetupFailure::Negotiation(*e))
            .collect();
        all.push(SetupFailure::UnexpectedData);
        all.extend(VerbsError::ALL.iter().map(|e| SetupFailure::QueuePair(*e)));
        all.push(SetupFailure::StreamClosed);
        all
    }
}

/// One sentence: what the peer did and what to change (see
/// `rdmap_testkit::message`).
impl core::fmt::Display for SetupFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SetupFailure::Negotiation(e) => write!(f, "{e}"),
            SetupFailure::UnexpectedData => f.write_str(
                "the peer sent data before our MPA reply, which MPA forbids; \
                 fix the peer, which must wait for the reply",
            ),
            SetupFailure::QueuePair(e) => write!(
                f,
                "the queue pair could not take the negotiated IRD, ORD or state: {e}"
            ),
            SetupFailure::StreamClosed => f.write_str(
                "the TCP connection closed during MPA setup; \
                 check the peer's logs for why it gave up",
            ),
        }
    }
}

impl std::error::Error for SetupFailure {}

/// What the driver and the application learn from the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    /// Responder: an MPA request arrived; read [`Endpoint::peer_request`]
    /// and call [`Endpoint::accept`] or [`Endpoint::reject`].
    ConnectRequest,
    /// The stream is up; the queue pair is in Rts.
    Connected(Negotiated),
    /// The connection was refused (by the peer, or by us with a reject).
    Rejected(Rejection),
    /// Setup failed.
    SetupFailed(SetupFailure),
    /// The stream ended abnormally. `cause` is `None` when the peer's
    /// Terminate could not be read.
    Terminated {
        /// The Terminate cause.
        cause: Option<TerminateCause>,
        /// Who ended it.
        origin: TerminateOrigin,
    },
    /// Nothing more will come out of [`Endpoint::poll_record`]: close TCP
    /// once the records already queued have been sent.
    ReadyToClose,
    /// The stream closed in order (both sides closed, see
    /// [`Endpoint::disconnect`]): every request posted before the close
    /// completed, the receives left were flushed, and the queue pair is
    /// back in Idle.
    Closed,
}

/// Counters of one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// FPDUs received, by RDMAP opcode (index = opcode value); those whose
    /// header could not be parsed are not counted here.
    pub fpdus_in: [u64; 8],
    /// FPDUs sent, by RDMAP opcode.
    pub fpdus_out: [u64; 8],
    /// Payload bytes placed into registered memory.
    pub bytes_placed: u64,
    /// Payload bytes sent by reference.
    pub bytes_sent: u64,
    /// Zero-length Writes sent to wake a silent responder (0 or 1; counted
    /// in `fpdus_out` too).
    pub nudges: u64,
    /// In-order chunks of the stream (one per TCP segment) that ended
    /// inside an FPDU: FPDUs the peer's segments split.
    pub chunks_mid_fpdu: u64,
    /// FPDUs whose CRC the caller took while reading the chunk for its TCP
    /// checksum ([`Endpoint::handle_stream_with_crc`]), not read again.
    pub fpdu_crcs_given: u64,
}

/// The initiator's nudge of a silent responder (module documentation,
/// "Waking a responder").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nudge {
    /// Not for this connection, or over (sent, or the peer spoke).
    Off,
    /// Connected; our first FPDU has not left.
    Armed,
    /// Our first FPDU left; the deadline is stamped at the next
    /// [`Endpoint::handle_timeout`].
    Stamp,
    /// Due at this time unless the peer speaks first.
    At(Duration),
    /// The time came: the next record between our messages is the nudge.
    Due,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fatal {
    origin: TerminateOrigin,
}

/// One iWARP connection endpoint. See the module documentation for the
/// order of calls.
#[derive(Debug)]
pub struct Endpoint {
    role: Role,
    qp: QueuePair,
    negotiator: Negotiator,
    negotiated: Option<Negotiated>,
    /// MPA frame bytes still to hand out, and how many went already.
    setup_tx: Option<(Box<[u8]>, usize)>,
    framer: Framer,
    /// The framer is configured (FPDU mode in our sending direction).
    framing_ready: bool,
    deframer: Deframer,
    /// Input goes to the deframer.
    rx_running: bool,
    /// The queue pair reached Rts through setup.
    connected: bool,
    /// Responder: the initiator's first FPDU (or RTR) has arrived.
    may_send_fpdus: bool,
    /// Responder allowed to speak first (module documentation, "Who
    /// speaks first"): the send queue position of the first request
    /// posted after the connection was established.
    speak_first_after: Option<u64>,
    /// [`Config::responder_waits_for_first_fpdu`].
    responder_waits: bool,
    /// Initiator: the RTR still to send.
    rtr_to_send: Option<RtrType>,
    /// Responder: the RTR the first FPDU must be.
    rtr_expected: Option<RtrType>,
    /// Initiator: our Read RTR's zero-length Response has not arrived.
    rtr_read_pending: bool,
    /// Responder: the zero-length Read Response owed for a Read RTR.
    rtr_read_response: Option<(u32, u64)>,
    /// Initiator: [`Config::nudge_after`] (zero: no nudge).
    nudge_after: Duration,
    nudge: Nudge,
    rx: rx::RxState,
    tx: tx::TxState,
    /// Bytes handed out on the stream so far (MPA frames included).
    tx_offset: u64,
    fatal: Option<Fatal>,
    /// Our Terminate, waiting for room in a segment.
    terminate_tx: Option<TerminateRepr>,
    close_pending: bool,
    close_reported: bool,
    /// TCP's end was reported ([`Endpoint::handle_stream_closed`]).
    stream_ended: bool,
    /// An orderly close in progress or done.
    closing: Option<close::Closing>,
    /// Stream offset TCP has acknowledged up to.
    acked_offset: u64,
    events: VecDeque<EngineEvent>,
    stats: Stats,
}

impl Endpoint {
    /// The active side: builds the MPA request at once (it is the first
    /// record [`Endpoint::poll_record`] yields). The IRD and ORD offered
    /// are the configuration's, capped at the queue pair's limits.
    pub fn initiator(
        config: Config,
        private_data: &[u8],
        qp: QueuePair,
        now: Duration,
    ) -> Result<Endpoint, SetupError> {
        let config = cap_config(config, &qp);
        let nudge_after = config.nudge_after;
        let negotiator = Negotiator::initiator(config, private_data, now)?;
        let mut ep = Endpoint::new(Role::Initiator, negotiator, qp);
        ep.nudge_after = nudge_after;
        ep.take_setup_bytes();
        Ok(ep)
    }

    /// The passive side: waits for the MPA request.
    pub fn responder(config: Config, qp: QueuePair, now: Duration) -> Result<Endpoint, SetupError> {
        let config = cap_config(config, &qp);
        let responder_waits = config.responder_waits_for_first_fpdu;
        let negotiator = Negotiator::responder(config, now)?;
        let mut ep = Endpoint::new(Role::Responder, negotiator, qp);
        ep.responder_waits = responder_waits;
        Ok(ep)
    }

    /// The passive side before its queue pair exists (a listener's new
    /// connection): the endpoint gathers the MPA request, refuses by
    /// itself what the configuration cannot take (markers, no RTR in
    /// common, no CRC where CRCs are required: [`EngineEvent::Rejected`]),
    /// and reports the rest ([`EngineEvent::ConnectRequest`]). The
    /// application then hands over the queue pair with
    /// [`Endpoint::accept_on`], or refuses with [`Endpoint::reject`].
    pub fn awaiting_request(config: Config, now: Duration) -> Result<Endpoint, SetupError> {
        let responder_waits = config.responder_waits_for_first_fpdu;
        let negotiator = Negotiator::responder(config, now)?;
        let mut ep = Endpoint::new(Role::Responder, negotiator, unbound_qp());
        ep.responder_waits = responder_waits;
        Ok(ep)
    }

    fn new(role: Role, negotiator: Negotiator, qp: QueuePair) -> Endpoint {
        Endpoint {
            role,
            qp,
            negotiator,
            negotiated: None,
            setup_tx: None,
            framer: Framer::new(false, false),
            framing_ready: false,
            deframer: Deframer::new(false, false, u16::MAX),
            rx_running: false,
            connected: false,
            may_send_fpdus: false,
            speak_first_after: None,
            responder_waits: true,
            rtr_to_send: None,
            rtr_expected: None,
            rtr_read_pending: false,
            rtr_read_response: None,
            nudge_after: Duration::ZERO,
            nudge: Nudge::Off,
            rx: rx::RxState::new(),
            tx: tx::TxState::new(),
            tx_offset: 0,
            fatal: None,
            terminate_tx: None,
            close_pending: false,
            close_reported: false,
            stream_ended: false,
            closing: None,
            acked_offset: 0,
            events: VecDeque::with_capacity(8),
            stats: Stats::default(),
        }
    }

    /// Our role in connection setup.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The queue pair.
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// The queue pair, to post work (`post_send`, `post_recv`) or change
    /// its state.
    pub fn qp_mut(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    /// Gives the queue pair back (to destroy it). Pins held by records the
    /// driver still has must be returned to the STag table first
    /// ([`Endpoint::record_dropped`]).
    pub fn into_qp(self) -> QueuePair {
        self.qp
    }

    /// What setup agreed on, once connected.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    /// Responder: the request awaiting [`Endpoint::accept`] or
    /// [`Endpoint::reject`].
    pub fn peer_request(&self) -> Option<&PeerRequest> {
        self.negotiator.peer_request()
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Bytes handed out on the stream so far, MPA frames included.
    pub fn stream_offset(&self) -> u64 {
        self.tx_offset
    }

    /// Whether the stream has ended (a Terminate sent or received, or TCP
    /// gone).
    pub fn is_terminated(&self) -> bool {
        self.fatal.is_some()
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<EngineEvent> {
        self.events.pop_front()
    }

    /// When [`Endpoint::handle_timeout`] is due: MPA setup's timer, and
    /// on the initiator the nudge's (`Duration::ZERO` when our first FPDU
    /// has just left and the deadline waits for the driver's clock).
    pub fn poll_timeout(&self) -> Option<Duration> {
        let nudge = match self.nudge {
            Nudge::Stamp => Some(Duration::ZERO),
            Nudge::At(t) => Some(t),
            Nudge::Off | Nudge::Armed | Nudge::Due => None,
        };
        match (self.negotiator.poll_timeout(), nudge) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the MPA setup timer and the nudge's. After this, call
    /// [`Endpoint::poll_record`]: a nudge that came due is the next record.
    pub fn handle_timeout(&mut self, now: Duration) {
        self.negotiator.handle_timeout(now);
        self.drain_negotiator();
        match self.nudge {
            Nudge::Stamp => self.nudge = Nudge::At(now.saturating_add(self.nudge_after)),
            Nudge::At(t) if now >= t => self.nudge = Nudge::Due,
            _ => {}
        }
    }

    /// Whether the nudge of a silent responder went out on this
    /// connection (module documentation, "Waking a responder").
    pub fn nudge_sent(&self) -> bool {
        self.stats.nudges > 0
    }

    /// Responder: accepts the pending request with `private_data` for the
    /// initiator. The reply is the next record; the stream is up at once
    /// ([`EngineEvent::Connected`]), though no FPDU leaves before the
    /// initiator's first one.
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(), SetupError> {
        self.negotiator.accept(private_data)?;
        self.drain_negotiator();
        Ok(())
    }

    /// Responder made by [`Endpoint::awaiting_request`]: accepts the
    /// pending request on `qp` (in Idle; work may be posted to it), with
    /// `private_data` for the initiator. The reply offers at most `ird`
    /// and `ord`, and at most the queue pair's limits. Otherwise as
    /// [`Endpoint::accept`].
    pub fn accept_on(
        &mut self,
        qp: QueuePair,
        ird: u16,
        ord: u16,
        private_data: &[u8],
    ) -> Result<(), SetupError> {
        if self.role != Role::Responder || self.negotiator.peer_request().is_none() {
            return Err(SetupError::NoPendingRequest);
        }
        let (ird, ord) = cap_depths(ird, ord, &qp);
        self.negotiator.set_depths(ird, ord);
        self.qp = qp;
        self.accept(private_data)
    }

    /// Responder: refuses the pending request with a reject frame.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), SetupError> {
        self.negotiator.reject(private_data)?;
        self.drain_negotiator();
        Ok(())
    }

    /// Ends the stream from our side with a Terminate for `cause` (for
    /// example [`TerminateCause::RDMAP_OP_CATASTROPHIC_GLOBAL`] when the
    /// worker shuts down on an internal error). Nothing happens if the
    /// stream has ended already.
    pub fn abort<M: Placement + ?Sized>(&mut self, cause: TerminateCause, env: &mut Env<'_, M>) {
        self.fail(cause, None);
        self.service(env);
    }

    /// TCP has closed or reset the connection. A stream still up ends with
    /// [`TerminateCause::MPA_TCP_CLOSED`], reported locally — unless it was
    /// closing in order and our side had drained, which is the normal end
    /// of the close ([`EngineEvent::Closed`]).
    /// Only the first report counts; later ones only service the queue
    /// pair.
    pub fn handle_stream_closed<M: Placement + ?Sized>(&mut self, env: &mut Env<'_, M>) {
        if core::mem::replace(&mut self.stream_ended, true) {
            self.service(env);
            return;
        }
        if self.stream_closed_in_order(env) {
            return;
        }
        if !self.connected && self.fatal.is_none() && !self.close_pending {
            self.events
                .push_back(EngineEvent::SetupFailed(SetupFailure::StreamClosed));
        } else if self.fatal.is_none() && self.connected {
            self.fatal = Some(Fatal {
                origin: TerminateOrigin::Stream,
            });
            self.events.push_back(EngineEvent::Terminated {
                cause: Some(TerminateCause::MPA_TCP_CLOSED),
                origin: TerminateOrigin::Stream,
            });
        }
        self.rx_running = false;
        self.terminate_tx = None;
        self.setup_tx = None;
        self.tx.abandon();
        self.enter_error();
        self.close_pending = true;
        self.service(env);
    }

    /// Takes in-order bytes from the stream. Never fails: a fault of the
    /// peer becomes a Terminate and an event.
    pub fn handle_stream<M: Placement + ?Sized>(
        &mut self,
        now: Duration,
        chunk: &[u8],
        env: &mut Env<'_, M>,
    ) {
        self.handle_stream_with_crc(now, chunk, None, env);
    }

    /// [`Endpoint::handle_stream`] for a chunk whose CRC the caller may
    /// have taken already: `fpdu_crc` is the CRC32c of all of `chunk` but
    /// its last four octets, computed while the receive path read the
    /// bytes for the TCP checksum. Where `chunk` is exactly one FPDU (its
    /// length field says so) and the stream sits between FPDUs, the
    /// deframer compares that with the CRC field instead of reading the
    /// payload again; otherwise it is ignored.
    pub fn handle_stream_with_crc<M: Placement + ?Sized>(
        &mut self,
        now: Duration,
        chunk: &[u8],
        fpdu_crc: Option<u32>,
        env: &mut Env<'_, M>,
    ) {
        let mut rest = chunk;
        if !self.negotiator.is_done() {
            let used = self.negotiator.handle_input(rest, now);
            rest = rest.get(used..).unwrap_or(&[]);
            self.drain_negotiator();
        }
        if !rest.is_empty() {
            if self.rx_running {
                // The peer spoke: it needs no nudge.
                self.nudge = Nudge::Off;
                let whole = rest.len() == chunk.len();
                self.rx_feed(rest, fpdu_crc.filter(|_| whole), env);
            } else if !self.negotiator.is_done() {
                // The peer spoke out of turn (a request's private data is
                // counted exactly, so these bytes belong to nobody).
                self.setup_failed(SetupFailure::UnexpectedData);
            }
        }
        self.service(env);
    }

    /// TCP acknowledged `record`: returns its pin and advances the
    /// acknowledged stream offset, completing the Sends and Writes it
    /// finishes (in send-queue order).
    pub fn record_acked<M: Placement + ?Sized>(
        &mut self,
        mut record: OutRecord,
        env: &mut Env<'_, M>,
    ) {
        self.note_acked(&mut record, env.device);
        self.service(env);
    }

    /// [`Endpoint::record_acked`] for a record the driver keeps in place
    /// (no move of its some 160 bytes), without the service: `record`'s
    /// pin goes back (it may then be dropped), and the work it ends
    /// completes at the next [`Endpoint::service`], which the driver calls
    /// once after a run of acknowledgements.
    pub fn note_acked(&mut self, record: &mut OutRecord, device: &mut Device) {
        if let Some(pin) = record.take_pin() {
            device.mrs_mut().unpin(pin);
        }
        self.acked_offset = self.acked_offset.max(record.end_offset());
        self.qp.acked(record.end_offset());
    }

    /// The connection went away with `record` unacknowledged: returns its
    /// pin only.
    pub fn record_dropped(&mut self, mut record: OutRecord, device: &mut Device) {
        if let Some(pin) = record.take_pin() {
            device.mrs_mut().unpin(pin);
        }
    }

    /// Moves finished work into the CQs (flushing in Error), returns the
    /// pins of queued inbound Reads once in Error, and notices a queue pair
    /// that failed locally. Every other call ends with this.
    pub fn service<M: Placement + ?Sized>(&mut self, env: &mut Env<'_, M>) {
        if self.qp.state() == QpState::Error {
            self.qp.drain_inbound_reads(env.device.mrs_mut());
        }
        // A full CQ is recorded by the queue pair (it moves to Error and
        // keeps the completion for a later call).
        let _ = self.qp.deliver_completions(env.send_cq);
        if self.qp.state() == QpState::Error {
            let _ = self.qp.flush_rq(env.recv_cq());
            if self.connected && self.fatal.is_none() && !self.is_closed() {
                // A work request failed locally (its memory went away, a
                // CQ overflowed) or the application forced Error.
                self.fail(TerminateCause::RDMAP_LOCAL_CATASTROPHIC, None);
                self.qp.drain_inbound_reads(env.device.mrs_mut());
            }
        }
        self.service_close(env);
        self.check_close();
    }

    fn take_setup_bytes(&mut self) {
        if let Some(bytes) = self.negotiator.poll_transmit() {
            if !bytes.is_empty() {
                self.setup_tx = Some((bytes.into(), 0));
            }
        }
    }

    fn drain_negotiator(&mut self) {
        // The reply or reject goes out before anything the event leads to.
        self.take_setup_bytes();
        while let Some(ev) = self.negotiator.poll_event() {
            self.take_setup_bytes();
            match ev {
                MpaEvent::RequestReceived => self.events.push_back(EngineEvent::ConnectRequest),
                MpaEvent::Negotiated(n) => self.on_negotiated(n),
                MpaEvent::Rejected(r) => {
                    self.events.push_back(EngineEvent::Rejected(r));
                    self.close_pending = true;
                    self.enter_error();
                }
                MpaEvent::Failed(e) => {
                    self.setup_failed(SetupFailure::Negotiation(e));
                    if let Some((cause, framing)) = e.terminate_cause() {
                        // RFC 6581 §8: the reply switched both sides to
                        // FPDU mode, so say why in a Terminate.
                        self.framer = Framer::from_framing(&framing);
                        self.framing_ready = true;
                        self.terminate_tx = Some(TerminateRepr::bare(cause));
                    }
                }
            }
        }
    }

    fn setup_failed(&mut self, why: SetupFailure) {
        if self.close_pending {
            return;
        }
        self.events.push_back(EngineEvent::SetupFailed(why));
        self.close_pending = true;
        self.rx_running = false;
        self.enter_error();
    }

    fn on_negotiated(&mut self, n: Negotiated) {
        let attr = *self.qp.attr();
        let m = QpModify {
            state: Some(QpState::Rts),
            ord: Some(u32::from(n.ord).min(attr.max_ord)),
            ird: Some(u32::from(n.ird).min(attr.max_ird)),
        };
        if let Err(e) = self.qp.modify_qp(m) {
            self.setup_failed(SetupFailure::QueuePair(e));
            return;
        }
        self.framer = Framer::from_framing(&n.framing);
        self.framing_ready = true;
        self.deframer = Deframer::from_framing(&n.framing, u16::MAX);
        self.rx_running = true;
        self.connected = true;
        self.may_send_fpdus = !n.must_wait_for_first_fpdu;
        if !self.may_send_fpdus && !self.responder_waits && !n.peer_to_peer {
            self.speak_first_after = Some(self.qp.head_seq().0 + self.qp.sq_len() as u64);
        }
        self.rtr_to_send = n.send_rtr();
        self.rtr_expected = n.expect_rtr();
        if self.role == Role::Initiator && !self.nudge_after.is_zero() {
            self.nudge = Nudge::Armed;
        }
        self.events.push_back(EngineEvent::Connected(n.clone()));
        self.negotiated = Some(n);
    }

    /// We end the stream: queue a Terminate for `cause` reporting
    /// `offending` (the ULPDU bytes gathered, and its full length), move
    /// the queue pair towards Error. The first fault wins.
    fn fail(&mut self, cause: TerminateCause, offending: Option<(&[u8], u16)>) {
        if self.fatal.is_some() || self.is_closed() {
            return;
        }
        self.fatal = Some(Fatal {
            origin: TerminateOrigin::Local,
        });
        self.events.push_back(EngineEvent::Terminated {
            cause: Some(cause),
            origin: TerminateOrigin::Local,
        });
        self.rx_running = false;
        self.close_pending = true;
        self.tx.abandon();
        if self.framing_ready {
            let mut repr = TerminateRepr::for_segment(cause, offending.map(|(b, _)| b));
            if cause.reports_segment() {
                // The whole ULPDU's length (only its head was kept), even
                // for an empty one: M also keeps a headerless Terminate
                // from reading as siw's swapped layout.
                repr.segment_length = offending.map(|(_, len)| len);
            }
            self.terminate_tx = Some(repr);
            if self
                .qp
                .modify_qp(QpModify::state(QpState::Terminate))
                .is_err()
            {
                self.enter_error();
            }
        } else {
            self.enter_error();
        }
    }

    /// The peer's Terminate: its cause (`None` if unreadable) and the
    /// headers of our message it reports, if it included them.
    fn peer_terminated(&mut self, cause: Option<TerminateCause>, about: Option<Blamed>) {
        if self.fatal.is_some() {
            return;
        }
        self.fatal = Some(Fatal {
            origin: TerminateOrigin::Peer,
        });
        self.events.push_back(EngineEvent::Terminated {
            cause,
            origin: TerminateOrigin::Peer,
        });
        self.rx_running = false;
        self.close_pending = true;
        self.tx.abandon();
        // The request the Terminate is about takes the status its cause
        // maps to; everything else is flushed. It is found by the reported
        // headers when the peer included them, else it is the oldest
        // request in flight. A Terminate about a Read Response (or one
        // that blames nothing of ours) fails no request. Requests before it
        // that had not finished are flushed ahead of it, and then, by the
        // queue pair's rule, so is it: the status reaches the application
        // when the request at fault is the oldest one outstanding.
        let status = cause.map_or(WcStatus::RemoteOperationError, WcStatus::from_terminate);
        let head = self.qp.head_seq().0;
        let seqs = head..head + self.qp.sq_len() as u64;
        let blamed = match about {
            Some(Blamed::Nothing) => None,
            Some(b) => seqs
                .clone()
                .find(|&s| self.qp.send_wr(WrSeq(s)).is_some_and(|wr| b.matches(wr)))
                .or_else(|| {
                    // A Write (or a Read whose header came back) is always
                    // found exactly while it is in flight; when it is not,
                    // it has already completed, and blaming the next
                    // request of its kind would fail an innocent one.
                    if b.exactly_identified() {
                        return None;
                    }
                    seqs.clone()
                        .find(|&s| self.qp.send_wr(WrSeq(s)).is_some_and(|wr| b.same_kind(wr)))
                }),
            None => None,
        };
        match blamed {
            Some(seq) => {
                // Fails (harmlessly) if the request had already finished.
                let _ = self.qp.complete(WrSeq(seq), status);
            }
            None if about.is_none() => {
                for seq in seqs {
                    if self.qp.complete(WrSeq(seq), status).is_ok() {
                        break;
                    }
                }
            }
            None => {}
        }
        self.enter_error();
    }

    fn enter_error(&mut self) {
        // Any state may go to Error.
        let _ = self.qp.modify_qp(QpModify::state(QpState::Error));
    }

    fn check_close(&mut self) {
        if self.close_pending
            && !self.close_reported
            && self.setup_tx.is_none()
            && self.terminate_tx.is_none()
        {
            self.close_reported = true;
            self.events.push_back(EngineEvent::ReadyToClose);
        }
    }
}

/// Which of our messages a peer's Terminate reports, from its DDP header
/// (and the Read Request header for a Read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blamed {
    /// A Send of any kind.
    Send,
    /// An RDMA Write to this STag and TO.
    Write { stag: u32, to: u64 },
    /// An RDMA Read Request, with its header if included.
    Read(Option<ReadRequest>),
    /// A Read Response or a Terminate: no request of ours.
    Nothing,
}

impl Blamed {
    fn from_report(ddp: Option<DdpRepr>, rdma: Option<ReadRequest>) -> Option<Blamed> {
        Some(match ddp? {
            DdpRepr::Tagged {
                opcode: RdmapOpcode::RdmaWrite,
                stag,
                to,
                ..
            } => Blamed::Write { stag, to },
            DdpRepr::Tagged { .. } => Blamed::Nothing,
            DdpRepr::Untagged {
                opcode: RdmapOpcode::ReadRequest,
                ..
            } => Blamed::Read(rdma),
            DdpRepr::Untagged {
                opcode: RdmapOpcode::Terminate,
                ..
            } => Blamed::Nothing,
            DdpRepr::Untagged { .. } => Blamed::Send,
        })
    }

    /// Whether the reported headers name exactly one request of ours.
    fn exactly_identified(&self) -> bool {
        matches!(self, Blamed::Write { .. } | Blamed::Read(Some(_)))
    }

    fn same_kind(&self, wr: &SendWr) -> bool {
        matches!(
            (self, wr.op),
            (
                Blamed::Send,
                SendOp::Send | SendOp::SendWithInvalidate { .. }
            ) | (Blamed::Write { .. }, SendOp::RdmaWrite { .. })
                | (Blamed::Read(_), SendOp::RdmaRead { .. })
        )
    }

    fn matches(&self, wr: &SendWr) -> bool {
        match (*self, wr.op) {
            (Blamed::Write { stag, to }, SendOp::RdmaWrite { remote_addr, rkey }) => {
                let len = wr.sges.total_len().unwrap_or(0);
                rkey.0 == stag && to >= remote_addr && to - remote_addr <= u64::from(len)
            }
            (Blamed::Read(Some(rr)), SendOp::RdmaRead { remote_addr, rkey }) => {
                rkey.0 == rr.source_stag && remote_addr == rr.source_to
            }
            _ => false,
        }
    }
}

/// The IRD/ORD we offer never exceed what the queue pair can hold.
/// The queue pair of a responder whose application has not answered yet,
/// or has refused: it never carries work.
fn unbound_qp() -> QueuePair {
    QueuePair::new(
        QpNum(0),
        QpInitAttr {
            pd: PdId(0),
            send_cq: CqId(0),
            recv_cq: CqId(0),
            srq: None,
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_ord: 0,
            max_ird: 0,
            sq_sig_all: false,
        },
    )
}

fn cap_config(mut config: Config, qp: &QueuePair) -> Config {
    (config.ird, config.ord) = cap_depths(config.ird, config.ord, qp);
    config
}

/// `ird` and `ord` capped at the queue pair's limits.
fn cap_depths(ird: u16, ord: u16, qp: &QueuePair) -> (u16, u16) {
    let attr = qp.attr();
    let cap = |v: u16, max: u32| v.min(u16::try_from(max).unwrap_or(u16::MAX));
    (cap(ird, attr.max_ird), cap(ord, attr.max_ord))
}
