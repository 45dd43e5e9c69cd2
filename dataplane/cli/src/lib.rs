//! `iwarp`: the command-line tool that runs, measures and operates the
//! software iWARP dataplane (the `dataplane` crate) — a program on its
//! application API like any other RDMA program, kept out of the library so
//! that programs embedding the dataplane build none of it (command-line
//! parsing, JSON, signal handling, the service's sockets).
//!
//! The binary (`src/main.rs`) parses the command line and calls one of
//! the subcommands below; they live in this library so that tests and
//! benchmarks can drive their pieces directly:
//!
//! - the perftest-compatible `perf` runs ([`perf`]): [`perftest`] speaks
//!   perftest's control exchange, [`runner`] runs the measured loops;
//! - `rping` ([`rping`]), rping's ping-pong with the data verified;
//! - the self-contained [`demo`], two endpoints on virtual devices in one
//!   process;
//! - the long-running service ([`serve`]), with its control socket
//!   ([`control`]: `stats`, `qp list`, `capture`) and Prometheus endpoint
//!   ([`metrics`]);
//! - what they share: [`common`] (opening an endpoint from command-line
//!   options, the interrupt flag) and [`report`] (tables and JSON).
//!
//! Every subcommand returns a [`ToolError`] instead of panicking or
//! exiting: `main` prints it as one line and exits non-zero.
#![deny(unsafe_code)]

pub mod common;
pub mod control;
pub mod demo;
// sigaction(2) for SIGINT / SIGTERM: the crate's only `unsafe`, each block
// with its SAFETY comment.
#[allow(unsafe_code)]
mod interrupt;
pub mod metrics;
pub mod perf;
pub mod perftest;
pub mod report;
pub mod rping;
pub mod runner;
pub mod serve;

pub use common::ToolError;
