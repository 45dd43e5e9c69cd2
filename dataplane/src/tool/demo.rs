//! `iwarp demo`: two dataplane endpoints in one process on virtual
//! devices, WRITE, READ and SEND bandwidth and latency rounds with the data
//! verified, and a summary next to what one core does copying and
//! CRC32c-summing the same bytes.

use clap::Args;

use super::ToolError;

/// Options of `iwarp demo`.
#[derive(Debug, Clone, Default, Args)]
pub struct DemoArgs {
    /// Print the results as one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the demo.
pub fn run(_args: &DemoArgs) -> Result<(), ToolError> {
    Err(ToolError::Usage("iwarp demo: not available in this build yet".into()))
}
