//! MPA (RFC 5044, RFC 6581): connection setup frames, negotiation, FPDU framing and deframing.
//!
//! MPA sits between TCP and DDP. During connection setup it exchanges one
//! request and one reply ([`frame`]); afterwards it wraps every DDP segment
//! (a ULPDU) in an FPDU: a 2-byte length, the ULPDU, a pad to four bytes
//! and a CRC32c, with a marker every 512 octets of the TCP stream when the
//! receiver asked for them.

pub mod frame;

pub use frame::{Frame, FrameError, FrameKind, FrameRepr, IrdOrd, RtrSet, RtrType};
