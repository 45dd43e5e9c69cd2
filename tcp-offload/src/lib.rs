//! A sans-IO TCP/IPv4 engine for a software iWARP RNIC.
//!
//! The crate sits at the bottom of the pipeline (TCP → MPA → DDP → RDMAP):
//! the dataplane hands it received frames and the current time, and asks it
//! what to transmit and when it next needs to be woken. It never reads a
//! clock, never does I/O and holds no `unsafe`.
//!
//! - [`wire`]: zero-copy views and validated representations of Ethernet II,
//!   ARP, IPv4, ICMP echo and TCP headers.
//! - [`tcp`]: the RFC 9293 state machine with RFC 7323, RFC 6298, RFC 2018,
//!   RFC 6675 and RFC 6582 behaviour, record-oriented sends for iWARP FPDUs
//!   and an out-of-order assembler that keeps received buffers by reference.
//!
//! The deterministic network simulator the tests run on (`tcp-sim`) and
//! the capture reader and reassembler (`pcap-kit`) are test-support crates
//! beside this one, not part of its API.
#![forbid(unsafe_code)]

pub mod iface;
pub mod room;
pub mod seq;
pub mod tcp;
pub mod time;
pub mod wire;

pub use seq::SeqNumber;
pub use time::Instant;
