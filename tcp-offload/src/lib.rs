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
//! - [`pcap`]: classic pcap and pcapng reading, classic pcap writing, and
//!   TCP stream reassembly of a capture, for replaying real traffic in
//!   tests and for the dataplane's packet capture.
//! - [`sim`]: a deterministic network simulator (seeded loss, reordering,
//!   duplication, corruption, latency, bandwidth, MTU) on virtual time, used
//!   by the tests here and by the upper layers' tests.
#![forbid(unsafe_code)]

pub mod iface;
pub mod pcap;
pub mod seq;
pub mod sim;
pub mod tcp;
pub mod time;
pub mod wire;

pub use seq::SeqNumber;
pub use time::Instant;
