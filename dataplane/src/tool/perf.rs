//! `iwarp perf`: perftest-compatible bandwidth and latency tests (the
//! control exchange of perftest's `-R` mode, see [`super::perftest`]), as
//! server without a peer address and as client with one.

use clap::Args;

use super::ToolError;

/// Options of `iwarp perf TEST`.
#[derive(Debug, Clone, Default, Args)]
pub struct PerfArgs {}

/// Runs one perf test.
pub fn run(_test: super::runner::TestKind, _args: &PerfArgs) -> Result<(), ToolError> {
    Err(ToolError::Usage("iwarp perf: not available in this build yet".into()))
}
