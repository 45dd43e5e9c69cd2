//! The `iwarp` command-line tool, as a library so that its pieces can be
//! tested and embedded: the perftest-compatible `perf` runs
//! ([`perftest`] speaks perftest's control exchange, [`runner`] runs the
//! measured loops), `rping` ([`rping`]), the self-contained [`demo`], and
//! what they share ([`common`]: opening an endpoint from command-line
//! options; [`report`]: tables and JSON).
//!
//! Every subcommand returns a [`ToolError`] instead of panicking or
//! exiting: `main` prints it as one line and exits non-zero.

pub mod common;
pub mod demo;
pub mod perf;
pub mod perftest;
pub mod report;
pub mod rping;
pub mod runner;

pub use common::ToolError;
