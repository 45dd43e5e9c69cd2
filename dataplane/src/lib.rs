//! The iWARP dataplane: the only crate that does I/O. It brings up DPDK
//! through `dpdk-bindings`, runs the poll-mode workers that drive the
//! `tcp-offload` and `rdmap` engines, and offers the application API. The
//! `iwarp` command-line tool is a crate of its own (`dataplane/cli`) on that
//! API, so programs embedding the dataplane build none of it.
//!
//! - [`link`]: ports and queues as a worker sees them (receive bursts,
//!   frames built from headers and attached payload, transmit bursts), and
//!   [`link::MemLink`], an in-memory port pair for tests and the demo.
//! - [`dpdk_link`]: the DPDK port behind the same seam: EAL once per
//!   process, a queue pair per worker, mbuf chains with payload attached
//!   from registered memory.
//! - [`memory`]: registered memory shared by applications and workers, and
//!   the placement implementation the QP engine writes through.
//! - [`checksum`]: the Internet checksum's sum at vector width, for the
//!   payload passes.
//! - [`steer`]: the Toeplitz RSS hash, to keep each connection on the queue
//!   of the worker that owns it.
//! - `ctl`: the rings and messages the API and the workers share (control
//!   messages, CM events, queue pairs' shared state, the error type).
//! - [`worker`]: the per-core run-to-completion loop and its budgets.
//! - [`api`]: the application API (protection domains, memory
//!   registration, CQs, QPs, connection management, posting and polling).
//! - [`config`]: the TOML configuration with command-line overrides.
//! - `sys`: the few system calls made directly (a worker thread's timer
//!   slack).
//!
//! `unsafe` code is denied crate-wide and allowed in four modules only:
//! [`memory`] (mapping and attaching application memory, shared with the
//! workers as a NIC's DMA target is), `sys`, and [`checksum`] and
//! [`pass`] (vector instructions chosen at run time; the pass also reads
//! registered memory). DPDK's FFI stays in
//! `dpdk-bindings`.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod api;
pub mod capture;
#[allow(unsafe_code, reason = "vector instructions chosen at run time")]
pub mod checksum;
pub mod config;
mod ctl;
pub mod dpdk_link;
pub mod link;
#[allow(
    unsafe_code,
    reason = "maps, registers and attaches application memory"
)]
pub mod memory;
#[allow(
    unsafe_code,
    reason = "vector instructions chosen at run time, reading registered memory"
)]
pub mod pass;
pub mod steer;
#[allow(unsafe_code, reason = "the dataplane's own system calls")]
mod sys;
pub mod worker;

pub use api::{Dataplane, DriveMode};
pub use config::Config;
