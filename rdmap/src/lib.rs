//! iWARP protocol core: MPA framing and connection setup (RFC 5044, RFC 6581),
//! DDP placement (RFC 5041) and RDMAP (RFC 5040), with the verbs object model.
//!
//! Like `tcp-offload`, this crate is sans-IO: it never reads a clock, never
//! does I/O and holds no `unsafe`. It reaches application memory only through
//! a placement trait. The protocol layers land here in later increments; the
//! crate exists now so that the workspace layout is fixed from the start.
#![forbid(unsafe_code)]
