//! Real dataplanes in the deterministic simulator.
//!
//! Each [`Node`] is a whole [`dataplane::Dataplane`] (its real workers,
//! memory table, API and in-memory port) opened with
//! [`Dataplane::open_simulated`](dataplane::Dataplane::open_simulated): its
//! workers run inline and read a [`ManualTime`](dataplane::api::ManualTime)
//! that the simulator's network moves. The port's far side
//! ([`dataplane::link::MemPort`]) is plugged into the simulator's seeded
//! links, which lose, reorder, duplicate, corrupt, delay and rate-limit
//! frames. Everything runs on one thread, so a run is a function of its
//! seed and replays exactly.
//!
//! - [`node`]: a dataplane as a simulator endpoint.
//! - [`world`]: two dataplanes on one link, connections between them, and
//!   waiting in virtual time.
//! - [`scenario`]: a random mix of WRITE, READ and SEND drawn from a seed,
//!   every byte and every completion checked, nothing left pinned.

pub mod node;
pub mod scenario;
pub mod world;

pub use node::Node;
pub use scenario::{Outcome, Scenario};
pub use world::{World, WorldSpec};
