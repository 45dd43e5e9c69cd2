//! MPA (RFC 5044, RFC 6581): connection setup frames, negotiation, FPDU framing and deframing.
//!
//! MPA sits between TCP and DDP. During connection setup it exchanges one
//! request and one reply ([`frame`], driven by [`negotiate`]); afterwards it
//! wraps every DDP segment (a ULPDU) in an FPDU ([`fpdu`]): a 2-byte
//! length, the ULPDU, a pad to four bytes and a CRC32c, with a marker every
//! 512 octets of the TCP stream when the receiver asked for them
//! ([`markers`]). The [`deframe`] module undoes that on receipt. In
//! peer-to-peer mode the first FPDU is a zero-length RTR message ([`rtr`]).
//!
//! For the QP engine: [`Negotiator`] during setup, then a [`Framer`] and a
//! [`Deframer`] built from [`Negotiated::framing`].

pub mod deframe;
pub mod fpdu;
pub mod frame;
pub mod markers;
pub mod negotiate;
pub mod rtr;

pub use deframe::{DeframeError, DeframeEvent, Deframer};
pub use fpdu::{FpduLayout, FramedFpdu, Framer, FramerError};
pub use frame::{Frame, FrameError, FrameKind, FrameRepr, IrdOrd, RtrSet, RtrType};
pub use negotiate::{
    Config, CrcPolicy, Event, Framing, Negotiated, NegotiationError, Negotiator, PeerRequest,
    RejectReason, Rejection, Role, SetupError,
};
