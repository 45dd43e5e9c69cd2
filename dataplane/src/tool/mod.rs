//! The `iwarp` command-line tool, as a library so that its pieces can be
//! tested and embedded: the perftest-compatible `perf` runs
//! ([`perftest`] speaks perftest's control exchange, [`runner`] runs the
//! measured loops), `rping` ([`rping`]), the self-contained [`demo`], and
//! what they share ([`common`]: opening an endpoint from command-line
//! options; [`report`]: tables and JSON); and the long-running service
//! ([`serve`], with its control socket, [`control`], and Prometheus
//! endpoint, [`metrics`]).
//!
//! Every subcommand returns a [`ToolError`] instead of panicking or
//! exiting: `main` prints it as one line and exits non-zero.

pub mod common;
pub mod control;
pub mod demo;
pub mod metrics;
pub mod perf;
pub mod perftest;
pub mod report;
pub mod rping;
pub mod runner;
pub mod serve;

pub use common::ToolError;
