//! MPA (RFC 5044, RFC 6581): connection setup frames, negotiation, FPDU framing and deframing.
//!
//! MPA sits between TCP and DDP. During connection setup it exchanges one
//! request and one reply ([`frame`], driven by [`negotiate`]); afterwards it
//! wraps every DDP segment (a ULPDU) in an FPDU: a 2-byte length, the ULPDU,
//! a pad to four bytes and a CRC32c, with a marker every 512 octets of the
//! TCP stream when the receiver asked for them. In peer-to-peer mode the
//! first FPDU is a zero-length RTR message ([`rtr`]).

pub mod frame;
pub mod negotiate;
pub mod rtr;

pub use frame::{Frame, FrameError, FrameKind, FrameRepr, IrdOrd, RtrSet, RtrType};
pub use negotiate::{
    Config, Event, Framing, Negotiated, NegotiationError, Negotiator, PeerRequest, RejectReason,
    Rejection, Role, SetupError,
};
