//! Deterministic network simulation on virtual time.
//!
//! The test bench of the engine and of every layer above it: endpoints
//! (the engine's [`Interface`](crate::iface), or anything implementing
//! [`Endpoint`]) exchange Ethernet frames over links that lose, reorder,
//! duplicate, corrupt, delay and rate-limit them, each link direction with
//! its own seeded generator, while time jumps from one event to the next.
//! A run is a pure function of its seed, so a failing seed replays
//! exactly. No clock, no I/O, no threads; unlike the engine it allocates
//! freely (a frame is a `Vec<u8>`), being test infrastructure.
//!
//! - [`rng`]: the seeded generators (SplitMix64, xoshiro256\*\*).
//! - [`link`]: one link direction and its [`LinkConfig`].
//! - [`network`]: endpoints, switches, links and the event loop.
//! - [`host`]: the engine's [`Interface`](crate::iface::Interface) as an
//!   endpoint.
//! - [`bulk`]: a bulk-transfer application with byte-exact checking.
//! - [`frame`]: reading and crafting TCP/IPv4 frames in tests, independent
//!   of the wire layer so that it can check it.

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
