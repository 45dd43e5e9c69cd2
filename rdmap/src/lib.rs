//! iWARP protocol core: MPA framing and connection setup (RFC 5044, RFC 6581),
//! DDP placement (RFC 5041) and RDMAP (RFC 5040), with the verbs object model.
//!
//! Like `tcp-offload`, this crate is sans-IO: it never reads a clock, never
//! does I/O and holds no `unsafe`. It reaches application memory only
//! through the [`placement`] trait, so a peer can never make it write
//! outside a registered region.
//!
//! - [`mpa`]: MPA request/reply/reject frames, the connection-setup
//!   negotiator (revision 1 and 2, IRD/ORD, peer-to-peer RTR), the FPDU
//!   framer and the deframer (CRC32c, markers).
//! - [`wire`]: DDP tagged and untagged headers, RDMAP control, the Read
//!   Request payload and the Terminate message.
//! - [`error`]: every (layer, error type, error code) the RFCs define, as
//!   small `Copy` values that map one-to-one to Terminate bytes.
//! - [`verbs`]: protection domains, memory regions and STags, completion
//!   queues, shared receive queues, queue-pair states and work requests.
//! - [`engine`]: the per-connection endpoint that ties them together: MPA
//!   setup, the receive path (deframe, check, place, complete, Terminate)
//!   and the send path (FPDU records with payload by reference).
#![forbid(unsafe_code)]

pub mod crc;
pub mod engine;
pub mod error;
pub mod mpa;
pub mod placement;
pub mod verbs;
pub mod wire;
