//! `iwarp rping`: the ping-pong of rdmacm-utils' `rping` (Send, RDMA Read,
//! RDMA Write, data checked), as client or server, interoperable with it.

use clap::Args;

use super::ToolError;

/// Options of `iwarp rping`.
#[derive(Debug, Clone, Default, Args)]
pub struct RpingArgs {}

/// Runs rping.
pub fn run(_args: &RpingArgs) -> Result<(), ToolError> {
    Err(ToolError::Usage("iwarp rping: not available in this build yet".into()))
}
