//! Deterministic network simulation on virtual time: the test bench of
//! the `tcp-offload` engine and of every layer above it.
//!
//! This crate is test support, kept out of the engine's public API: the
//! engine's tests, the upper layers' tests and the benchmarks take it as a
//! dev-dependency. Endpoints (the engine's
//! [`Interface`](tcp_offload::iface::Interface), or anything implementing
//! [`Endpoint`]) exchange Ethernet frames over links that lose, reorder,
//! duplicate, corrupt, delay and rate-limit them, each link direction with
//! its own seeded generator, while time jumps from one event to the next.
//! A run is a pure function of its seed, so a failing seed replays
//! exactly. No clock, no I/O, no threads, no OS entropy (the same lints as
//! the engine enforce it); unlike the engine it allocates freely (a frame
//! is a `Vec<u8>`), being test infrastructure.
//!
//! - [`rng`]: the seeded generators (SplitMix64, xoshiro256\*\*).
//! - [`link`]: one link direction and its [`LinkConfig`].
//! - [`network`]: endpoints, switches, links and the event loop.
//! - [`host`]: the engine's [`Interface`](tcp_offload::iface::Interface) as an
//!   endpoint.
//! - [`bulk`]: a bulk-transfer application with byte-exact checking.
//! - [`frame`]: reading and crafting TCP/IPv4 frames in tests, independent
//!   of the wire layer so that it can check it.
//!
//! A two-host transfer, the usual starting point of a test:
//!
//! ```
//! use tcp_sim::bulk::{Transfer, TransferSpec};
//! use tcp_sim::LinkConfig;
//! use tcp_offload::tcp::Config;
//! use tcp_offload::Instant;
//!
//! // 64 KiB each way over a link that loses, reorders, duplicates and
//! // corrupts frames; every byte is checked on arrival.
//! let link = LinkConfig::impaired(0.02);
//! let spec = TransferSpec::symmetric(42, Config::default(), link, 64 * 1024);
//! let mut t = Transfer::new(&spec).unwrap();
//! t.run(Instant::from_millis(600_000)).unwrap();
//! assert_eq!(t.apps.bytes_received(), 2 * 64 * 1024);
//! ```
//!
//! Other layers plug in by implementing [`Endpoint`] (an RDMAP stack over a
//! [`Host`], a dataplane worker over its simulated port) and driving the
//! [`Network`] with [`Network::run_until`], playing their application in
//! its closure; [`Transfer::run_until`](bulk::Transfer::run_until) shows the
//! pattern.

#![forbid(unsafe_code)]

pub mod bulk;
pub mod frame;
pub mod host;
pub mod link;
pub mod network;
pub mod rng;

pub use bulk::{BulkError, BulkPeer, Pattern};
pub use host::{Host, SimInterface};
pub use link::{DropReason, Fate, LinkConfig, LinkStats};
pub use network::{Captured, DirId, DropFilter, Endpoint, Link, Network, NodeId, SimError};
pub use rng::Rng;
