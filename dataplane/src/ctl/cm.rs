//! Connection-management events: what a worker reports to the
//! application about its connections (requests, establishment, rejects,
//! failures, ends) and the control path about deregistrations. Workers
//! make them; the API queues and hands them out.

use core::net::SocketAddrV4;

use rdmap::engine::{SetupFailure, TerminateOrigin};
use rdmap::error::TerminateCause;
use rdmap::mpa::{NegotiationError, RejectReason, RtrType};
use rdmap::verbs::{QpNum, Stag};
use tcp_offload::tcp::ConnId;

/// A peer's connection request, to answer with [`crate::api::Dataplane::accept`] or
/// [`crate::api::Dataplane::reject`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    pub(crate) worker: usize,
    pub(crate) conn: ConnId,
    /// The peer's address and port.
    pub remote: SocketAddrV4,
    /// Our listening port it came to.
    pub local_port: u16,
    /// The peer's private data.
    pub private_data: Vec<u8>,
    /// The IRD the peer announced (MPA revision 2).
    pub ird: Option<u16>,
    /// The ORD the peer announced.
    pub ord: Option<u16>,
}

impl ConnectRequest {
    /// The worker that received it (and will own the connection).
    pub fn worker(&self) -> usize {
        self.worker
    }
}

/// A request MPA setup refused by itself ([`CmEvent::RequestRefused`]).
/// Its [`fmt::Display`](core::fmt::Display) is one sentence: who asked,
/// why it was refused and what to change, with the configuration key
/// where one applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusedRequest {
    /// The peer's address and port.
    pub remote: SocketAddrV4,
    /// Our listening port it came to.
    pub local_port: u16,
    /// Why.
    pub reason: RejectReason,
}

impl RefusedRequest {
    /// One value for every reason MPA setup refuses a request by itself,
    /// for the tests that walk each message.
    pub fn all() -> Vec<RefusedRequest> {
        RejectReason::ALL
            .iter()
            .filter(|r| **r != RejectReason::ByPeer && **r != RejectReason::ByApplication)
            .map(|r| RefusedRequest {
                remote: SocketAddrV4::new(core::net::Ipv4Addr::new(192, 0, 2, 1), 40000),
                local_port: 7471,
                reason: *r,
            })
            .collect()
    }

    /// The configuration key that changes the outcome, if one does.
    pub fn setting(&self) -> Option<&'static str> {
        match self.reason {
            RejectReason::CrcRequired => Some("mpa.crc"),
            _ => None,
        }
    }
}

impl core::fmt::Display for RefusedRequest {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "we refused the MPA request from {} to port {}: {}",
            self.remote, self.local_port, self.reason
        )?;
        if let Some(key) = self.setting() {
            write!(f, " (see {key})")?;
        }
        Ok(())
    }
}

/// What connection setup agreed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// The peer.
    pub remote: SocketAddrV4,
    /// Our inbound Read depth.
    pub ird: u16,
    /// Our outbound Read depth.
    pub ord: u16,
    /// The MPA revision in use: the reply's (1 is RFC 5044, 2 adds
    /// RFC 6581's peer-to-peer and IRD/ORD words).
    pub revision: u8,
    /// CRC32c in use.
    pub crc: bool,
    /// The peer inserts markers.
    pub markers_rx: bool,
    /// We insert markers.
    pub markers_tx: bool,
    /// The peer-to-peer RTR, if any.
    pub rtr: Option<RtrType>,
    /// The peer's private data.
    pub private_data: Vec<u8>,
}

/// Why an active open, or a passive one the application accepted, did
/// not produce a connection. Its [`fmt::Display`](core::fmt::Display) is
/// one sentence naming what the peer did and what to change, with the
/// configuration key to change where there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// TCP was refused (RST).
    Refused,
    /// TCP's handshake timed out.
    TimedOut,
    /// MPA setup failed.
    Setup(SetupFailure),
}

impl ConnectFailure {
    /// One value of every variant (every setup failure and reject reason
    /// among them), for the tests that walk each message.
    pub fn all() -> Vec<ConnectFailure> {
        let mut all = vec![ConnectFailure::Refused, ConnectFailure::TimedOut];
        all.extend(SetupFailure::all().into_iter().map(ConnectFailure::Setup));
        all
    }

    /// Whether the peer (or the path to it) is at fault, so that the
    /// message must say what to change.
    pub fn peer_at_fault(&self) -> bool {
        match self {
            ConnectFailure::Refused | ConnectFailure::TimedOut => true,
            ConnectFailure::Setup(f) => f.peer_at_fault(),
        }
    }

    /// The configuration key that changes the outcome, if one does.
    pub fn setting(&self) -> Option<&'static str> {
        match self {
            ConnectFailure::Setup(SetupFailure::Negotiation(e)) => match e {
                NegotiationError::Timeout => Some("mpa.timeout_s"),
                NegotiationError::NoMatchingRtr { .. } => Some("mpa.rtr"),
                NegotiationError::CrcNotHonoured(_) => Some("mpa.crc"),
                _ => None,
            },
            _ => None,
        }
    }
}

impl core::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ConnectFailure::Refused => f.write_str(
                "the peer refused the TCP connection; \
                 check that a server listens on that address and port",
            )?,
            ConnectFailure::TimedOut => f.write_str(
                "the peer is unreachable: it did not answer the TCP connection attempt in time; \
                 check its address and that it is up",
            )?,
            ConnectFailure::Setup(s) => write!(f, "{s}")?,
        }
        if let Some(key) = self.setting() {
            write!(f, " (see {key})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConnectFailure {}

/// Why a connection ended. Its [`fmt::Display`](core::fmt::Display) is
/// one sentence, with what to change when the peer ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisconnectReason {
    /// TCP closed with FINs (an orderly close).
    Closed,
    /// TCP was reset by the peer.
    Reset,
    /// TCP gave up retransmitting.
    TimedOut,
    /// We aborted it ([`crate::api::Dataplane::disconnect`] with `abort`).
    LocalAbort,
    /// A Terminate ended the stream.
    Terminated {
        /// Its cause, if it could be read.
        cause: Option<TerminateCause>,
        /// Who sent it.
        origin: TerminateOrigin,
    },
}

impl DisconnectReason {
    /// One value of every variant, for the tests that walk each message.
    pub fn all() -> Vec<DisconnectReason> {
        let mut all = vec![
            DisconnectReason::Closed,
            DisconnectReason::Reset,
            DisconnectReason::TimedOut,
            DisconnectReason::LocalAbort,
        ];
        for origin in [
            TerminateOrigin::Local,
            TerminateOrigin::Peer,
            TerminateOrigin::Stream,
        ] {
            all.push(DisconnectReason::Terminated {
                cause: None,
                origin,
            });
            all.extend(
                rdmap::error::ALL
                    .iter()
                    .map(|(c, _)| DisconnectReason::Terminated {
                        cause: Some(*c),
                        origin,
                    }),
            );
        }
        all
    }

    /// Whether the peer (or the path to it) ended the connection, so that
    /// the message must say what to change.
    pub fn peer_at_fault(&self) -> bool {
        !matches!(
            self,
            DisconnectReason::Closed | DisconnectReason::LocalAbort
        )
    }
}

impl core::fmt::Display for DisconnectReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DisconnectReason::Closed => f.write_str("the connection was closed in order"),
            DisconnectReason::Reset => {
                f.write_str("the peer reset the TCP connection; check the peer's logs for why")
            }
            DisconnectReason::TimedOut => f.write_str(
                "TCP gave up retransmitting to the peer; check the link and that the peer is up",
            ),
            DisconnectReason::LocalAbort => f.write_str("we aborted the connection"),
            DisconnectReason::Terminated { cause, origin } => {
                match origin {
                    TerminateOrigin::Peer => {
                        f.write_str("the peer ended the stream with a Terminate")?
                    }
                    TerminateOrigin::Local => {
                        f.write_str("we ended the stream with a Terminate for what the peer sent")?
                    }
                    TerminateOrigin::Stream => f.write_str("TCP went away under the stream")?,
                }
                match cause {
                    Some(c) => write!(f, ", {c}")?,
                    None => f.write_str(", its cause unreadable")?,
                }
                f.write_str(match origin {
                    TerminateOrigin::Peer => "; check the peer's logs for what it found wrong",
                    TerminateOrigin::Local => {
                        "; check the peer's application, which that cause describes"
                    }
                    TerminateOrigin::Stream => "; check the peer's logs for why it closed",
                })
            }
        }
    }
}

/// A connection-management event (`rdma_cm_event`). Its
/// [`fmt::Display`](core::fmt::Display) is one line for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A peer asks to connect.
    ConnectRequest(ConnectRequest),
    /// The connection of `qp` is up (both sides get it).
    Established {
        /// The queue pair.
        qp: QpNum,
        /// What was agreed.
        info: ConnectionInfo,
    },
    /// The peer rejected our request.
    Rejected {
        /// The queue pair.
        qp: QpNum,
        /// The peer's private data.
        private_data: Vec<u8>,
    },
    /// A peer's request that MPA setup refused by itself, before asking
    /// the application (the peer asked for markers, offered no RTR we
    /// take, or did not ask for CRCs where `mpa.crc = "required"`); the
    /// peer got an MPA reject.
    RequestRefused(RefusedRequest),
    /// Our active open failed, or a passive one the application accepted.
    ConnectFailed {
        /// The queue pair.
        qp: QpNum,
        /// Why.
        reason: ConnectFailure,
    },
    /// An established connection ended; outstanding work was flushed.
    Disconnected {
        /// The queue pair.
        qp: QpNum,
        /// Why.
        reason: DisconnectReason,
    },
    /// A deregistration that had to wait for in-flight data finished: the
    /// memory is no longer referenced by the dataplane.
    MrDeregistered(Stag),
}

impl core::fmt::Display for CmEvent {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CmEvent::ConnectRequest(r) => write!(
                f,
                "connection request from {} to port {}",
                r.remote, r.local_port
            ),
            CmEvent::Established { qp, info } => {
                write!(
                    f,
                    "queue pair {} is connected to {}, MPA revision {}, CRC {}",
                    qp.0,
                    info.remote,
                    info.revision,
                    if info.crc { "on" } else { "off" }
                )?;
                match info.rtr {
                    Some(RtrType::Send) => f.write_str(", Send RTR"),
                    Some(RtrType::Write) => f.write_str(", Write RTR"),
                    Some(RtrType::Read) => f.write_str(", Read RTR"),
                    None => f.write_str(", no RTR"),
                }
            }
            CmEvent::Rejected { qp, private_data } => {
                write!(f, "the peer rejected the connection of queue pair {}", qp.0)?;
                match printable(private_data) {
                    Some(text) => write!(f, ", saying {text}"),
                    None if private_data.is_empty() => Ok(()),
                    None => write!(f, " with {} bytes of private data", private_data.len()),
                }
            }
            CmEvent::RequestRefused(r) => write!(f, "{r}"),
            CmEvent::ConnectFailed { qp, reason } => {
                write!(f, "queue pair {} did not connect: {reason}", qp.0)
            }
            CmEvent::Disconnected { qp, reason } => {
                write!(f, "queue pair {} disconnected: {reason}", qp.0)
            }
            CmEvent::MrDeregistered(stag) => {
                write!(f, "the memory region of STag {stag} is free")
            }
        }
    }
}

/// A reject's private data as words, when it is printable text (with at
/// most a C string's terminating zero), as ours is when we require CRC.
pub fn printable(private_data: &[u8]) -> Option<&str> {
    let text = private_data.strip_suffix(&[0]).unwrap_or(private_data);
    let text = core::str::from_utf8(text).ok()?;
    (!text.is_empty() && text.chars().all(|c| c == ' ' || c.is_ascii_graphic())).then_some(text)
}
