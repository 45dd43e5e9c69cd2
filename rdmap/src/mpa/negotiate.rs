//! MPA connection setup, both roles, revisions 1 and 2 (RFC 5044 §7.1,
//! RFC 6581 §3–§5), sans-IO.
//!
//! Runs once per connection, between the TCP handshake and the first FPDU.
//! The initiator sends a request and waits for the reply; the responder
//! waits for the request, shows it to the application, and sends the reply
//! (or a reject) the application chose. What comes out is a [`Negotiated`]
//! that configures the framer and the deframer (CRC, markers in each
//! direction), the RDMA Read queues (IRD/ORD) and peer-to-peer start-up
//! (which RTR message, who speaks first).
//!
//! Order of calls (the QP engine's side):
//!
//! 1. [`Negotiator::initiator`] or [`Negotiator::responder`].
//! 2. Loop: [`Negotiator::poll_transmit`] (bytes to hand to TCP), feed
//!    received bytes to [`Negotiator::handle_input`] (it returns how many
//!    it consumed: exactly the frame and its private data, never a byte of
//!    the FPDUs behind it, which go to the deframer), call
//!    [`Negotiator::handle_timeout`] when [`Negotiator::poll_timeout`] is
//!    due, and drain [`Negotiator::poll_event`].
//! 3. Responder only: on [`Event::RequestReceived`], read
//!    [`Negotiator::peer_request`], then call [`Negotiator::accept`] or
//!    [`Negotiator::reject`] with the application's private data; transmit
//!    the reply with [`Negotiator::poll_transmit`] *before* acting on the
//!    [`Event::Negotiated`] that follows.
//!
//! The rules applied:
//!
//! - **CRC** is used in both directions if either frame sets C (RFC 5044
//!   §7.1); a responder echoes the request's C. [`CrcPolicy::Required`]
//!   refuses a peer that does not ask for CRC itself: a responder rejects a
//!   request without C, and an initiator fails on a reply without C (which
//!   a conforming responder never sends when the request set C).
//! - **Markers** are per direction: M in a frame means its sender wants to
//!   *receive* markers. So M in the request asks the responder to insert
//!   them, M in the reply asks the initiator to. We insert markers whenever
//!   the peer asks, unless configured not to ([`Config::markers_accepted`]),
//!   in which case a responder rejects and an initiator fails.
//! - **Revision**: a responder answers with the lower of the two revisions;
//!   an initiator accepts a reply with a revision no higher than its own.
//!   IRD/ORD words are exchanged only in revision 2 with the 0x10 flag.
//! - **IRD/ORD** (revision 2): take the application's values, cap our ORD
//!   at the peer's IRD, and raise to at least 1 whatever a READ RTR needs
//!   (the initiator's ORD, the responder's IRD). An initiator whose IRD is
//!   below the responder's ORD fails with "insufficient IRD" (RFC 6581
//!   §8, as irdma does). Revision 1 carries no IRD/ORD: the application's
//!   values stand.
//! - **Peer-to-peer** (RFC 6581 §4): the initiator sets P and every RTR
//!   kind it offers; the responder echoes P and sets exactly the one kind
//!   it chose, by its preference order among those it accepts, or rejects
//!   with "no matching RTR" when none is left. An initiator fails if the
//!   reply picks a kind it did not offer, or more than one; a reply
//!   without P means the responder declined peer-to-peer, and the
//!   connection proceeds without an RTR (the initiator's application must
//!   then speak first).
//! - **Who speaks first**: a responder sends no FPDU before it has received
//!   the initiator's first FPDU (the RTR in peer-to-peer mode):
//!   [`Negotiated::must_wait_for_first_fpdu`]. An initiator in
//!   peer-to-peer mode sends the RTR before anything else:
//!   [`Negotiated::send_rtr`], built with [`super::rtr`].
//! - **Timeouts**: an initiator gives up if no reply has arrived within
//!   [`Config::timeout`] of its creation, a responder if no request has.
//!   Time spent by the application deciding is not limited here.
//!
//! Time is an argument: `now` is a [`Duration`] since any epoch the caller
//! keeps fixed for the connection.

use core::fmt;
use core::time::Duration;

use super::frame::{
    frame_len, Frame, FrameError, FrameKind, FrameRepr, IrdOrd, RtrSet, RtrType, HEADER_LEN,
    IRD_ORD_LEN, IRD_ORD_MAX, MAX_PRIVATE_DATA_RECV, MAX_PRIVATE_DATA_SEND,
};
use crate::error::TerminateCause;

/// How long to wait for the peer's frame unless configured otherwise. siw
/// and the hardware drivers all give up after some seconds; ten is within
/// their range and long enough for a loaded peer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which end of the connection setup we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sent the request (the active side).
    Initiator,
    /// Received the request (the passive side).
    Responder,
}

/// What we want from connection setup. Every field is an operator option;
/// the defaults are the ones in ARCHITECTURE.md ("Our defaults").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// MPA revision to offer (initiator) or the highest to accept
    /// (responder): 1 or 2.
    pub revision: u8,
    /// Whether to ask for CRCs (C flag; hardware peers always do), and
    /// whether to refuse a peer that does not.
    pub crc: CrcPolicy,
    /// Ask the peer to insert markers in what it sends us (M flag).
    pub markers_wanted: bool,
    /// Insert markers when the peer asks for them. If false, a peer asking
    /// for markers is rejected (responder) or the setup fails (initiator),
    /// the way siw behaves.
    pub markers_accepted: bool,
    /// Inbound RDMA Read queue depth the application asked for.
    pub ird: u16,
    /// Outbound RDMA Read queue depth the application asked for.
    pub ord: u16,
    /// Initiator: the RTR kinds to offer; empty means no peer-to-peer mode
    /// (not accepted by irdma, which insists on P).
    pub rtr_offer: RtrSet,
    /// Responder: the RTR kinds accepted from a peer-to-peer initiator;
    /// a peer-to-peer request offering none of them is rejected ("no
    /// matching RTR").
    pub rtr_accept: RtrSet,
    /// Responder: which accepted kind to pick first, second, third.
    pub rtr_preference: [RtrType; 3],
    /// How long to wait for the peer's request or reply.
    pub timeout: Duration,
    /// Initiator: how long after our first FPDU without a byte from the
    /// peer before one zero-length RDMA Write nudges it (once per
    /// connection; zero disables). Linux siw as responder can leave an
    /// FPDU that arrives right after its reply unread until the next
    /// segment with data comes; see [`crate::engine`], "Waking a
    /// responder".
    pub nudge_after: Duration,
    /// Responder without peer-to-peer: hold every FPDU until the
    /// initiator's first one has arrived (RFC 5044 §7.1.1; true, the
    /// default here), or (false) let the application speak first once the
    /// initiator has acknowledged our reply and the application has posted
    /// work after the connection was established. Linux siw as responder
    /// does not wait, and ULPs whose passive side speaks first (perftest's
    /// write_lat) rely on that; their own synchronisation guarantees the
    /// initiator is in FPDU mode by then. Never relaxed in peer-to-peer
    /// mode: there the RTR is the initiator's first FPDU. See
    /// [`crate::engine`], "Who speaks first".
    pub responder_waits_for_first_fpdu: bool,
}

/// Default of [`Config::nudge_after`]: well above a loaded peer's
/// answer time, well below any application or MPA timeout.
pub const DEFAULT_NUDGE_AFTER: Duration = Duration::from_millis(200);

/// What we ask of the CRC (RFC 5044 §7.1: CRCs are used in both directions
/// when either the request or the reply sets C, and a responder must honour
/// a request's C).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CrcPolicy {
    /// Do not ask; CRCs are still used when the peer asks.
    Off,
    /// Ask (set C). With a conforming peer CRCs are then always used.
    #[default]
    Requested,
    /// Ask, and refuse a peer that does not set C itself: as responder,
    /// reject its request ([`RejectReason::CrcRequired`]); as initiator,
    /// fail on its reply ([`NegotiationError::CrcNotHonoured`]). For
    /// operators whose data integrity rests on the CRC, so that a peer
    /// configured without it is refused at setup rather than found out by
    /// the first FPDU whose CRC field is zero.
    Required,
}

impl CrcPolicy {
    /// Whether our frame sets C.
    pub const fn asks(self) -> bool {
        !matches!(self, CrcPolicy::Off)
    }
}

/// What the boolean this policy replaced meant: `true` asks, `false` does
/// not.
impl From<bool> for CrcPolicy {
    fn from(ask: bool) -> CrcPolicy {
        if ask {
            CrcPolicy::Requested
        } else {
            CrcPolicy::Off
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            revision: 2,
            crc: CrcPolicy::Requested,
            markers_wanted: false,
            markers_accepted: true,
            ird: 16,
            ord: 16,
            rtr_offer: RtrSet {
                send: false,
                write: true,
                read: true,
            },
            rtr_accept: RtrSet::ALL,
            // A Write RTR costs the responder nothing; a Read RTR costs it a
            // Read Response; a Send RTR consumes a posted receive.
            rtr_preference: [RtrType::Write, RtrType::Read, RtrType::Send],
            timeout: DEFAULT_TIMEOUT,
            nudge_after: DEFAULT_NUDGE_AFTER,
            responder_waits_for_first_fpdu: true,
        }
    }
}

/// The FPDU format in each direction: what the framer and deframer need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Framing {
    /// CRC32c generated and checked in both directions.
    pub crc: bool,
    /// The peer inserts markers in what we receive.
    pub markers_rx: bool,
    /// We insert markers in what we send.
    pub markers_tx: bool,
}

impl Framing {
    /// CRCs on, no markers: what a reply to our request sets up with
    /// hardware peers and with siw.
    pub const CRC_ONLY: Framing = Framing {
        crc: true,
        markers_rx: false,
        markers_tx: false,
    };
}

/// A completed connection setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Our role.
    pub role: Role,
    /// The revision in use (the reply's).
    pub revision: u8,
    /// IRD/ORD words were exchanged (revision 2 with the 0x10 flag).
    pub enhanced: bool,
    /// CRC and markers.
    pub framing: Framing,
    /// Peer-to-peer mode is in effect, with [`Negotiated::rtr`] as RTR.
    pub peer_to_peer: bool,
    /// The RTR kind both sides agreed on, in peer-to-peer mode.
    pub rtr: Option<RtrType>,
    /// Our inbound RDMA Read queue depth: how many Read Requests the peer
    /// may have outstanding at us.
    pub ird: u16,
    /// Our outbound RDMA Read queue depth: how many Read Requests we may
    /// have outstanding at the peer.
    pub ord: u16,
    /// The IRD the peer announced, if any.
    pub peer_ird: Option<u16>,
    /// The ORD the peer announced, if any.
    pub peer_ord: Option<u16>,
    /// The peer's application private data (IRD/ORD words removed).
    pub private_data: Vec<u8>,
    /// Responder: send no FPDU until the initiator's first FPDU (its RTR in
    /// peer-to-peer mode) has arrived (RFC 5044 §7.1.1, RFC 6581 §4).
    pub must_wait_for_first_fpdu: bool,
}

impl Negotiated {
    /// Initiator in peer-to-peer mode: the RTR to send as the very first
    /// FPDU, before any application message.
    pub fn send_rtr(&self) -> Option<RtrType> {
        match self.role {
            Role::Initiator => self.rtr,
            Role::Responder => None,
        }
    }

    /// Responder in peer-to-peer mode: the RTR expected as the initiator's
    /// first FPDU.
    pub fn expect_rtr(&self) -> Option<RtrType> {
        match self.role {
            Role::Responder => self.rtr,
            Role::Initiator => None,
        }
    }
}

/// Why a connection was refused. Its [`fmt::Display`] is one sentence
/// (see `rdmap_testkit::message`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// Initiator: the responder sent a reject.
    ByPeer,
    /// Responder: the application called [`Negotiator::reject`].
    ByApplication,
    /// Responder: the initiator asked for markers and
    /// [`Config::markers_accepted`] is off.
    MarkersRefused,
    /// Responder: peer-to-peer mode with no RTR kind both sides support.
    NoMatchingRtr {
        /// The kinds the initiator offered.
        offered: RtrSet,
    },
    /// Responder: the request does not set C and [`Config::crc`] is
    /// [`CrcPolicy::Required`]. The reject carries
    /// [`CRC_REQUIRED_REJECT_DATA`] as private data.
    CrcRequired,
}

/// The private data of our reject when we require CRC and the request did
/// not ask for it: words for the peer's operator, who sees a reject's
/// private data through rdma_cm.
pub const CRC_REQUIRED_REJECT_DATA: &[u8] = b"MPA CRC required";

impl RejectReason {
    /// One value of every variant, for the tests that walk each message.
    pub const ALL: &'static [RejectReason] = &[
        RejectReason::ByPeer,
        RejectReason::ByApplication,
        RejectReason::MarkersRefused,
        RejectReason::NoMatchingRtr {
            offered: RtrSet {
                send: true,
                write: false,
                read: false,
            },
        },
        RejectReason::CrcRequired,
    ];

    /// Whether the peer did something the operator must change (our
    /// application's own reject is not).
    pub const fn peer_at_fault(&self) -> bool {
        !matches!(self, RejectReason::ByApplication)
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::ByPeer => f.write_str(
                "the peer rejected the connection; check the peer's logs for why, \
                 or what its application expects",
            ),
            RejectReason::ByApplication => {
                f.write_str("our application rejected the connection request")
            }
            RejectReason::MarkersRefused => f.write_str(
                "the peer asked for MPA markers, which are turned off here; \
                 turn markers off on the peer, or accept markers here",
            ),
            RejectReason::NoMatchingRtr { offered } => write!(
                f,
                "the peer offered {} in peer-to-peer mode, and we accept none of that; \
                 have the peer offer another RTR kind, or turn peer-to-peer off on the peer",
                RtrList(*offered, "or")
            ),
            RejectReason::CrcRequired => f.write_str(
                "the peer did not ask for MPA CRCs, and CRCs are required here; \
                 have the peer ask for CRCs, or stop requiring them here",
            ),
        }
    }
}

/// RTR kinds in words, joined by the conjunction: "a Send RTR", "a Write
/// or a Read RTR", "no RTR".
struct RtrList(RtrSet, &'static str);

impl fmt::Display for RtrList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kinds: Vec<&str> = [
            (RtrType::Send, "Send"),
            (RtrType::Write, "Write"),
            (RtrType::Read, "Read"),
        ]
        .into_iter()
        .filter(|(t, _)| self.0.contains(*t))
        .map(|(_, name)| name)
        .collect();
        match kinds.as_slice() {
            [] => f.write_str("no RTR"),
            [one] => write!(f, "a {one} RTR"),
            [a, b] => write!(f, "a {a} {} a {b} RTR", self.1),
            [a, b, c] => write!(f, "a {a}, a {b} {} a {c} RTR", self.1),
            _ => f.write_str("an RTR"),
        }
    }
}

/// A refused connection, with the private data that came with the reject
/// (initiator) or went with it (responder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Why.
    pub reason: RejectReason,
    /// Private data of the reject frame (IRD/ORD words removed).
    pub private_data: Vec<u8>,
}

/// Why connection setup failed. After a failure the engine closes the TCP
/// connection; for the errors that carry a [`Framing`], the reply had
/// already switched both sides to FPDU mode and RFC 6581 §8 asks for a
/// Terminate first ([`NegotiationError::terminate_cause`]). Its
/// [`fmt::Display`] is one sentence naming what the peer did and what to
/// change (see `rdmap_testkit::message`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NegotiationError {
    /// No request (responder) or reply (initiator) in time.
    Timeout,
    /// The peer's frame is malformed: bad key, revision, private data
    /// length, IRD/ORD words.
    Frame(FrameError),
    /// A request where a reply was due, or the reverse.
    UnexpectedFrame(FrameKind),
    /// Initiator: the reply's revision is higher than the request's.
    RevisionMismatch {
        /// What we sent.
        sent: u8,
        /// What came back.
        received: u8,
    },
    /// Initiator: the responder wants markers and
    /// [`Config::markers_accepted`] is off.
    MarkersRefused(Framing),
    /// Initiator: the responder's ORD exceeds our IRD.
    InsufficientIrd {
        /// The framing the reply set up.
        framing: Framing,
        /// Our IRD, as the request announced it.
        ird: u16,
        /// The ORD the reply announced.
        peer_ord: u16,
    },
    /// Initiator: the reply picks an RTR kind we did not offer, several,
    /// or none while keeping peer-to-peer mode.
    NoMatchingRtr {
        /// The framing the reply set up.
        framing: Framing,
        /// The kinds our request offered.
        offered: RtrSet,
        /// The kinds the reply set.
        chosen: RtrSet,
    },
    /// Initiator: the reply does not set C although our request did and
    /// [`Config::crc`] is [`CrcPolicy::Required`]. A conforming responder
    /// cannot do this (RFC 5044 §7.1): the peer would most likely send no
    /// CRCs, so the connection is refused here rather than by the first
    /// FPDU's CRC check.
    CrcNotHonoured(Framing),
}

impl NegotiationError {
    /// One value of every variant, for the tests that walk each message.
    pub const ALL: &'static [NegotiationError] = &[
        NegotiationError::Timeout,
        NegotiationError::Frame(FrameError::BadKey),
        NegotiationError::Frame(FrameError::BadRevision(3)),
        NegotiationError::Frame(FrameError::TooMuchPrivateData(600)),
        NegotiationError::Frame(FrameError::MissingIrdOrd),
        NegotiationError::Frame(FrameError::Truncated),
        NegotiationError::UnexpectedFrame(FrameKind::Request),
        NegotiationError::UnexpectedFrame(FrameKind::Reply),
        NegotiationError::UnexpectedFrame(FrameKind::Reject),
        NegotiationError::RevisionMismatch {
            sent: 1,
            received: 2,
        },
        NegotiationError::MarkersRefused(Framing::CRC_ONLY),
        NegotiationError::InsufficientIrd {
            framing: Framing::CRC_ONLY,
            ird: 8,
            peer_ord: 32,
        },
        // siw's answer to a Send-only offer: a Write RTR.
        NegotiationError::NoMatchingRtr {
            framing: Framing::CRC_ONLY,
            offered: RtrSet::only(RtrType::Send),
            chosen: RtrSet::only(RtrType::Write),
        },
        NegotiationError::NoMatchingRtr {
            framing: Framing::CRC_ONLY,
            offered: RtrSet::ALL,
            chosen: RtrSet {
                send: false,
                write: true,
                read: true,
            },
        },
        NegotiationError::NoMatchingRtr {
            framing: Framing::CRC_ONLY,
            offered: RtrSet::only(RtrType::Write),
            chosen: RtrSet::NONE,
        },
        NegotiationError::CrcNotHonoured(Framing::CRC_ONLY),
    ];

    /// The Terminate to send before closing, when the setup failed after
    /// FPDU mode began (RFC 6581 §8); `None` when there is nothing to send
    /// (the stream is not in FPDU mode, or the peer is gone).
    pub fn terminate_cause(&self) -> Option<(TerminateCause, Framing)> {
        match *self {
            NegotiationError::MarkersRefused(f) | NegotiationError::CrcNotHonoured(f) => {
                Some((TerminateCause::MPA_INVALID_REQUEST_REPLY, f))
            }
            NegotiationError::InsufficientIrd { framing, .. } => {
                Some((TerminateCause::MPA_INSUFFICIENT_IRD, framing))
            }
            NegotiationError::NoMatchingRtr { framing, .. } => {
                Some((TerminateCause::MPA_NO_MATCHING_RTR, framing))
            }
            _ => None,
        }
    }
}

impl fmt::Display for NegotiationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NegotiationError::Timeout => f.write_str(
                "no MPA request or reply came from the peer within the MPA timeout; \
                 check that the peer runs iWARP on that port and is reachable, \
                 or raise the MPA timeout",
            ),
            NegotiationError::Frame(e) => {
                f.write_str("the peer sent an MPA frame that ")?;
                e.clause(f)?;
                write!(f, "; {}", e.remedy())
            }
            NegotiationError::UnexpectedFrame(FrameKind::Request) => f.write_str(
                "the peer answered our MPA request with a request of its own; \
                 make one side listen and the other connect",
            ),
            NegotiationError::UnexpectedFrame(kind) => write!(
                f,
                "the peer sent an MPA {} where its request was due; \
                 make one side listen and the other connect",
                if *kind == FrameKind::Reject {
                    "reject"
                } else {
                    "reply"
                }
            ),
            NegotiationError::RevisionMismatch { sent, received } => write!(
                f,
                "the peer replied with MPA revision {received}, above the revision {sent} \
                 we asked for; check the peer's MPA revision setting, which breaks RFC 5044 here"
            ),
            NegotiationError::MarkersRefused(_) => f.write_str(
                "the peer asked for MPA markers, which are turned off here; \
                 turn markers off on the peer, or accept markers here",
            ),
            NegotiationError::InsufficientIrd { ird, peer_ord, .. } => write!(
                f,
                "the peer answered with ORD {peer_ord}, above the IRD of {ird} we offered; \
                 raise the IRD we connect with to {peer_ord}, or lower the peer's ORD"
            ),
            NegotiationError::NoMatchingRtr {
                offered, chosen, ..
            } => match chosen.len() {
                0 => write!(
                    f,
                    "the peer kept peer-to-peer mode but chose no RTR, where we offered {}; \
                     offer a Write or Read RTR, or turn peer-to-peer off",
                    RtrList(*offered, "or")
                ),
                1 => write!(
                    f,
                    "the peer chose {}, which was not offered; offer {} as well, \
                     or turn peer-to-peer off",
                    RtrList(*chosen, "or"),
                    RtrList(*chosen, "or")
                ),
                _ => write!(
                    f,
                    "the peer chose {} at once, where exactly one is allowed; \
                     offer a single RTR kind, or turn peer-to-peer off",
                    RtrList(*chosen, "and")
                ),
            },
            NegotiationError::CrcNotHonoured(_) => f.write_str(
                "the peer replied without MPA CRCs although we asked for them, \
                 and CRCs are required here; fix the peer, which must use CRCs when asked, \
                 or stop requiring them here",
            ),
        }
    }
}

impl std::error::Error for NegotiationError {}

/// A call the negotiator cannot honour: bad configuration or a call out of
/// order. Nothing was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetupError {
    /// [`Config::revision`] is neither 1 nor 2.
    BadRevision(u8),
    /// More application private data than fits in 256 bytes in all (252
    /// in revision 2).
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes allowed.
        max: usize,
    },
    /// [`Negotiator::accept`] or [`Negotiator::reject`] without a pending
    /// request.
    NoPendingRequest,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::BadRevision(r) => write!(
                f,
                "MPA revision {r} is configured, which does not exist; set revision 1 or 2"
            ),
            SetupError::PrivateDataTooLong { len, max } => write!(
                f,
                "the application gave {len} bytes of private data, more than the {max} \
                 a frame takes; send at most {max} bytes"
            ),
            SetupError::NoPendingRequest => f.write_str(
                "no MPA request is waiting for a decision; accept or reject only a \
                 pending connection request",
            ),
        }
    }
}

impl std::error::Error for SetupError {}

impl SetupError {
    /// One value of every variant, for the tests that walk each message.
    pub const ALL: &'static [SetupError] = &[
        SetupError::BadRevision(3),
        SetupError::PrivateDataTooLong { len: 300, max: 252 },
        SetupError::NoPendingRequest,
    ];
}

/// What a responder learns from the request, for the application to decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRequest {
    /// The request's revision.
    pub revision: u8,
    /// The initiator wants to receive markers.
    pub markers: bool,
    /// The initiator wants CRCs.
    pub crc: bool,
    /// The IRD/ORD words, if the request carried them.
    pub ird_ord: Option<IrdOrd>,
    /// The RTR kind we will choose if the application accepts (peer-to-peer
    /// requests only).
    pub rtr: Option<RtrType>,
    /// The initiator's application private data.
    pub private_data: Vec<u8>,
}

/// Something that happened, for the engine to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Responder: a request arrived; see [`Negotiator::peer_request`], then
    /// accept or reject.
    RequestReceived,
    /// Setup is complete: switch to FPDU mode with these parameters.
    Negotiated(Negotiated),
    /// The connection was refused (by either side); close it once any
    /// reject frame has been transmitted.
    Rejected(Rejection),
    /// Setup failed; close the connection (after a Terminate, see
    /// [`NegotiationError::terminate_cause`]).
    Failed(NegotiationError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Initiator: request queued or sent, waiting for the reply.
    AwaitingReply,
    /// Responder: waiting for the request.
    AwaitingRequest,
    /// Responder: request received, waiting for accept or reject.
    AwaitingDecision,
    /// Finished one way or another; consumes nothing more.
    Done,
}

/// The connection-setup state machine for one connection.
#[derive(Debug, Clone)]
pub struct Negotiator {
    role: Role,
    config: Config,
    state: State,
    /// The peer's frame as it arrives (header, then private data).
    rx: Vec<u8>,
    /// Our frame, once built.
    tx: Vec<u8>,
    tx_pending: bool,
    deadline: Option<Duration>,
    /// Initiator: what our request announced.
    sent: Option<FrameSummary>,
    /// Responder: the request awaiting the application.
    request: Option<PeerRequest>,
    /// Responder: the revision and enhanced flag the reply will use.
    reply_revision: u8,
    reply_enhanced: bool,
    events: Vec<Event>,
}

/// What the initiator put in its request, to check the reply against.
#[derive(Debug, Clone, Copy)]
struct FrameSummary {
    revision: u8,
    crc: bool,
    markers: bool,
    ird: u16,
    ord: u16,
    rtr_offer: RtrSet,
}

fn max_app_private_data(enhanced: bool) -> usize {
    if enhanced {
        MAX_PRIVATE_DATA_SEND - IRD_ORD_LEN
    } else {
        MAX_PRIVATE_DATA_SEND
    }
}

fn check_private_data(enhanced: bool, private_data: &[u8]) -> Result<(), SetupError> {
    let max = max_app_private_data(enhanced);
    if private_data.len() > max {
        return Err(SetupError::PrivateDataTooLong {
            len: private_data.len(),
            max,
        });
    }
    Ok(())
}

fn clamp(v: u16) -> u16 {
    v.min(IRD_ORD_MAX)
}

impl Negotiator {
    /// Starts the active side: builds the request at once (fetch it with
    /// [`Negotiator::poll_transmit`]).
    pub fn initiator(
        config: Config,
        private_data: &[u8],
        now: Duration,
    ) -> Result<Negotiator, SetupError> {
        if config.revision != 1 && config.revision != 2 {
            return Err(SetupError::BadRevision(config.revision));
        }
        let enhanced = config.revision == 2;
        check_private_data(enhanced, private_data)?;
        let peer_to_peer = enhanced && !config.rtr_offer.is_empty();
        let rtr_offer = if peer_to_peer {
            config.rtr_offer
        } else {
            RtrSet::NONE
        };
        let ird = clamp(config.ird);
        let mut ord = clamp(config.ord);
        if rtr_offer.read {
            // Our Read RTR is a Read Request: it needs an ORD slot.
            ord = ord.max(1);
        }
        let repr = FrameRepr {
            kind: FrameKind::Request,
            markers: config.markers_wanted,
            crc: config.crc.asks(),
            revision: config.revision,
            ird_ord: enhanced.then_some(IrdOrd {
                ird,
                ord,
                peer_to_peer,
                rtr: rtr_offer,
            }),
            private_data,
        };
        // Cannot fail: revision, IRD/ORD and length were checked above.
        let tx = repr
            .to_vec()
            .map_err(|_| SetupError::BadRevision(config.revision))?;
        let sent = FrameSummary {
            revision: config.revision,
            crc: config.crc.asks(),
            markers: config.markers_wanted,
            ird,
            ord,
            rtr_offer,
        };
        let deadline = now.checked_add(config.timeout);
        Ok(Negotiator {
            role: Role::Initiator,
            config,
            state: State::AwaitingReply,
            rx: Vec::with_capacity(HEADER_LEN + MAX_PRIVATE_DATA_RECV),
            tx,
            tx_pending: true,
            deadline,
            sent: Some(sent),
            request: None,
            reply_revision: 0,
            reply_enhanced: false,
            events: Vec::with_capacity(2),
        })
    }

    /// Starts the passive side: waits for the request.
    pub fn responder(config: Config, now: Duration) -> Result<Negotiator, SetupError> {
        if config.revision != 1 && config.revision != 2 {
            return Err(SetupError::BadRevision(config.revision));
        }
        let deadline = now.checked_add(config.timeout);
        Ok(Negotiator {
            role: Role::Responder,
            config,
            state: State::AwaitingRequest,
            rx: Vec::with_capacity(HEADER_LEN + MAX_PRIVATE_DATA_RECV),
            tx: Vec::new(),
            tx_pending: false,
            deadline,
            sent: None,
            request: None,
            reply_revision: 0,
            reply_enhanced: false,
            events: Vec::with_capacity(2),
        })
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether setup has finished (negotiated, rejected or failed).
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Bytes to send, once: the request (initiator) or the reply or reject
    /// (responder, after the decision). The caller copies them into the TCP
    /// send buffer; they count as sent when this returns.
    pub fn poll_transmit(&mut self) -> Option<&[u8]> {
        if self.tx_pending {
            self.tx_pending = false;
            Some(&self.tx)
        } else {
            None
        }
    }

    /// When [`Negotiator::handle_timeout`] should be called next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        match self.state {
            State::AwaitingReply | State::AwaitingRequest => self.deadline,
            State::AwaitingDecision | State::Done => None,
        }
    }

    /// Fails the setup if the deadline has passed.
    pub fn handle_timeout(&mut self, now: Duration) {
        if let Some(deadline) = self.poll_timeout() {
            if now >= deadline {
                self.fail(NegotiationError::Timeout);
            }
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        if self.events.is_empty() {
            None
        } else {
            Some(self.events.remove(0))
        }
    }

    /// Responder: the request awaiting the application's decision.
    pub fn peer_request(&self) -> Option<&PeerRequest> {
        match self.state {
            State::AwaitingDecision => self.request.as_ref(),
            _ => None,
        }
    }

    /// Takes bytes from the TCP stream. Returns how many it consumed: at
    /// most the rest of the peer's frame, so that whatever follows in the
    /// chunk (the first FPDUs) stays with the caller. Consumes nothing once
    /// the frame is complete. `now` is checked against the deadline first.
    pub fn handle_input(&mut self, chunk: &[u8], now: Duration) -> usize {
        self.handle_timeout(now);
        if !matches!(self.state, State::AwaitingReply | State::AwaitingRequest) {
            return 0;
        }
        let mut used = 0;
        // Header first, then exactly the private data it announces.
        if self.rx.len() < HEADER_LEN {
            let take = (HEADER_LEN - self.rx.len()).min(chunk.len());
            self.rx.extend_from_slice(&chunk[..take]);
            used += take;
            if self.rx.len() < HEADER_LEN {
                return used;
            }
        }
        let total = match frame_len(&self.rx) {
            Ok(Some(total)) => total,
            Ok(None) => return used,
            Err(e) => {
                self.fail(NegotiationError::Frame(e));
                return used;
            }
        };
        let rest = &chunk[used..];
        let take = (total - self.rx.len()).min(rest.len());
        self.rx.extend_from_slice(&rest[..take]);
        used += take;
        if self.rx.len() == total {
            let frame = core::mem::take(&mut self.rx);
            match self.role {
                Role::Initiator => self.on_reply(&frame),
                Role::Responder => self.on_request(&frame),
            }
        }
        used
    }

    /// Responder, before [`Negotiator::accept`]: the IRD and ORD the reply
    /// offers (in place of the configuration's), once the queue pair that
    /// will carry the connection, and so its limits, is known.
    pub fn set_depths(&mut self, ird: u16, ord: u16) {
        self.config.ird = ird;
        self.config.ord = ord;
    }

    /// Responder: accepts the pending request, sending `private_data` to
    /// the initiator (at most 252 bytes in revision 2, 256 in revision 1).
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(), SetupError> {
        let request = match (self.state, self.request.as_ref()) {
            (State::AwaitingDecision, Some(r)) => r,
            _ => return Err(SetupError::NoPendingRequest),
        };
        check_private_data(self.reply_enhanced, private_data)?;
        let framing = Framing {
            crc: self.config.crc.asks() || request.crc,
            markers_rx: self.config.markers_wanted,
            markers_tx: request.markers,
        };
        let rtr = request.rtr;
        let (ird, ord, words) = match request.ird_ord.filter(|_| self.reply_enhanced) {
            Some(peer) => {
                let mut ird = clamp(self.config.ird);
                if rtr == Some(RtrType::Read) {
                    // The initiator's Read RTR lands in our inbound queue.
                    ird = ird.max(1);
                }
                let ord = clamp(self.config.ord).min(peer.ird);
                let words = IrdOrd {
                    ird,
                    ord,
                    peer_to_peer: rtr.is_some(),
                    rtr: rtr.map_or(RtrSet::NONE, RtrSet::only),
                };
                (ird, ord, Some(words))
            }
            None => (self.config.ird, self.config.ord, None),
        };
        let repr = FrameRepr {
            kind: FrameKind::Reply,
            markers: self.config.markers_wanted,
            crc: framing.crc,
            revision: self.reply_revision,
            ird_ord: words,
            private_data,
        };
        self.tx = repr.to_vec().map_err(|_| SetupError::PrivateDataTooLong {
            len: private_data.len(),
            max: max_app_private_data(self.reply_enhanced),
        })?;
        self.tx_pending = true;
        let negotiated = Negotiated {
            role: Role::Responder,
            revision: self.reply_revision,
            enhanced: words.is_some(),
            framing,
            peer_to_peer: rtr.is_some(),
            rtr,
            ird,
            ord,
            peer_ird: request.ird_ord.map(|w| w.ird),
            peer_ord: request.ird_ord.map(|w| w.ord),
            private_data: request.private_data.clone(),
            must_wait_for_first_fpdu: true,
        };
        self.finish(Event::Negotiated(negotiated));
        Ok(())
    }

    /// Responder: refuses the pending request with a reject frame carrying
    /// `private_data`.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), SetupError> {
        if self.state != State::AwaitingDecision || self.request.is_none() {
            return Err(SetupError::NoPendingRequest);
        }
        check_private_data(self.reply_enhanced, private_data)?;
        self.send_reject(RejectReason::ByApplication, private_data);
        Ok(())
    }

    fn send_reject(&mut self, reason: RejectReason, private_data: &[u8]) {
        // As siw does: the 0x10 flag and zero IRD/ORD words when the
        // request had them, and neither M nor C.
        let repr = FrameRepr {
            kind: FrameKind::Reject,
            markers: false,
            crc: false,
            revision: self.reply_revision,
            ird_ord: self.reply_enhanced.then_some(IrdOrd::default()),
            private_data,
        };
        match repr.to_vec() {
            Ok(tx) => {
                self.tx = tx;
                self.tx_pending = true;
                self.finish(Event::Rejected(Rejection {
                    reason,
                    private_data: private_data.to_vec(),
                }));
            }
            // Unreachable: the length was checked by the callers.
            Err(e) => self.fail(NegotiationError::Frame(e)),
        }
    }

    fn finish(&mut self, event: Event) {
        self.state = State::Done;
        self.events.push(event);
    }

    fn fail(&mut self, error: NegotiationError) {
        if self.state != State::Done {
            self.finish(Event::Failed(error));
        }
    }

    fn on_request(&mut self, bytes: &[u8]) {
        let repr = match Frame::new_checked(bytes).and_then(|f| FrameRepr::parse(&f)) {
            Ok(r) => r,
            Err(e) => return self.fail(NegotiationError::Frame(e)),
        };
        if repr.kind != FrameKind::Request {
            return self.fail(NegotiationError::UnexpectedFrame(repr.kind));
        }
        self.reply_revision = repr.revision.min(self.config.revision);
        self.reply_enhanced = self.reply_revision == 2 && repr.ird_ord.is_some();
        let p2p = repr
            .ird_ord
            .filter(|w| self.reply_enhanced && w.peer_to_peer);
        let rtr = p2p.and_then(|w| {
            let usable = w.rtr.intersection(self.config.rtr_accept);
            self.config
                .rtr_preference
                .into_iter()
                .find(|t| usable.contains(*t))
        });
        self.request = Some(PeerRequest {
            revision: repr.revision,
            markers: repr.markers,
            crc: repr.crc,
            ird_ord: repr.ird_ord,
            rtr,
            private_data: repr.private_data.to_vec(),
        });
        if repr.markers && !self.config.markers_accepted {
            return self.send_reject(RejectReason::MarkersRefused, &[]);
        }
        if let (Some(w), None) = (p2p, rtr) {
            return self.send_reject(RejectReason::NoMatchingRtr { offered: w.rtr }, &[]);
        }
        if !repr.crc && self.config.crc == CrcPolicy::Required {
            return self.send_reject(RejectReason::CrcRequired, CRC_REQUIRED_REJECT_DATA);
        }
        self.state = State::AwaitingDecision;
        self.events.push(Event::RequestReceived);
    }

    fn on_reply(&mut self, bytes: &[u8]) {
        let Some(sent) = self.sent else {
            return self.fail(NegotiationError::UnexpectedFrame(FrameKind::Reply));
        };
        let repr = match Frame::new_checked(bytes).and_then(|f| FrameRepr::parse(&f)) {
            Ok(r) => r,
            Err(e) => return self.fail(NegotiationError::Frame(e)),
        };
        match repr.kind {
            FrameKind::Request => {
                return self.fail(NegotiationError::UnexpectedFrame(FrameKind::Request))
            }
            FrameKind::Reject => {
                return self.finish(Event::Rejected(Rejection {
                    reason: RejectReason::ByPeer,
                    private_data: repr.private_data.to_vec(),
                }))
            }
            FrameKind::Reply => {}
        }
        if repr.revision > sent.revision {
            return self.fail(NegotiationError::RevisionMismatch {
                sent: sent.revision,
                received: repr.revision,
            });
        }
        let framing = Framing {
            crc: sent.crc || repr.crc,
            markers_rx: sent.markers,
            markers_tx: repr.markers,
        };
        if repr.markers && !self.config.markers_accepted {
            return self.fail(NegotiationError::MarkersRefused(framing));
        }
        if !repr.crc && self.config.crc == CrcPolicy::Required {
            return self.fail(NegotiationError::CrcNotHonoured(framing));
        }
        let (ird, ord, rtr) = match repr.ird_ord {
            Some(peer) => {
                if peer.ord > sent.ird {
                    return self.fail(NegotiationError::InsufficientIrd {
                        framing,
                        ird: sent.ird,
                        peer_ord: peer.ord,
                    });
                }
                let rtr = if sent.rtr_offer.is_empty() || !peer.peer_to_peer {
                    // We did not ask, or the responder declined.
                    None
                } else {
                    let chosen = peer.rtr;
                    let pick = [RtrType::Send, RtrType::Write, RtrType::Read]
                        .into_iter()
                        .find(|t| chosen.contains(*t));
                    match pick {
                        Some(t) if chosen.len() == 1 && sent.rtr_offer.contains(t) => Some(t),
                        _ => {
                            return self.fail(NegotiationError::NoMatchingRtr {
                                framing,
                                offered: sent.rtr_offer,
                                chosen,
                            })
                        }
                    }
                };
                let mut ord = sent.ord.min(peer.ird);
                if rtr == Some(RtrType::Read) {
                    ord = ord.max(1);
                }
                (sent.ird, ord, rtr)
            }
            None => (self.config.ird, self.config.ord, None),
        };
        let negotiated = Negotiated {
            role: Role::Initiator,
            revision: repr.revision,
            enhanced: repr.ird_ord.is_some(),
            framing,
            peer_to_peer: rtr.is_some(),
            rtr,
            ird,
            ord,
            peer_ird: repr.ird_ord.map(|w| w.ird),
            peer_ord: repr.ird_ord.map(|w| w.ord),
            private_data: repr.private_data.to_vec(),
            must_wait_for_first_fpdu: false,
        };
        self.finish(Event::Negotiated(negotiated));
    }
}
