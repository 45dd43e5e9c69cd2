//! perftest's control exchange in `-R` (rdma_cm) mode, byte for byte.

use std::net::SocketAddrV4;
use std::time::Duration;

use crate::api::{Dataplane, Qp};

use super::runner::{RemoteBuf, TestKind};
use super::ToolError;

/// What both sides are started with (perftest sends none of it: the two
/// command lines must agree).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionParams {
    /// Which test.
    pub test: TestKind,
    /// Bytes per message (`-s`).
    pub size: usize,
    /// Messages (`-n`).
    pub iterations: u64,
    /// Data connections (`-q`).
    pub qps: usize,
    /// Run for this long instead (`-D`).
    pub duration: Option<Duration>,
    /// Every size from 2 B to 8 MiB (`-a`).
    pub all_sizes: bool,
    /// The read tests' IRD and ORD on the data connections (perftest's
    /// `out_reads`); ignored by the other tests.
    pub outstanding_reads: u32,
    /// The port's MTU in bytes: sent as perftest's IB MTU code.
    pub link_mtu: usize,
}

/// One side's bandwidth report (perftest's `bw_report_data`, the part it
/// exchanges): bandwidths in MiB/s (2^20 bytes per second, perftest's
/// default unit; Gb/s when run with `--report_gbits`), message rate in
/// millions per second.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwFigures {
    /// Bytes per message.
    pub size: u64,
    /// Messages, all queue pairs together.
    pub iters: u64,
    /// Peak bandwidth.
    pub bw_peak: f64,
    /// Average bandwidth.
    pub bw_avg: f64,
    /// Average message rate.
    pub msg_rate: f64,
}

/// A perftest session: the control connection and the data connections
/// it set up.
#[derive(Debug)]
pub struct Session<'dp> {
    dp: &'dp Dataplane,
    remote: Vec<RemoteBuf>,
    peer_version: String,
}

impl<'dp> Session<'dp> {
    /// Server: listen on `port`, accept perftest's control connection, do
    /// the exchange, then accept the `qps.len()` data connections on the
    /// same port, binding them to `qps`.
    pub fn server(
        dp: &'dp Dataplane,
        port: u16,
        p: &SessionParams,
        qps: &[Qp],
        local: &[RemoteBuf],
        timeout: Duration,
    ) -> Result<Session<'dp>, ToolError> {
        let _ = (dp, port, p, qps, local, timeout);
        Err(ToolError::Peer("perftest session: not yet".into()))
    }

    /// Client: connect the control connection to `peer`, exchange, connect
    /// the data QPs.
    pub fn client(
        dp: &'dp Dataplane,
        peer: SocketAddrV4,
        p: &SessionParams,
        qps: &[Qp],
        local: &[RemoteBuf],
        timeout: Duration,
    ) -> Result<Session<'dp>, ToolError> {
        let _ = (dp, peer, p, qps, local, timeout);
        Err(ToolError::Peer("perftest session: not yet".into()))
    }

    /// The peer's buffers, per data QP.
    pub fn remote(&self) -> Vec<RemoteBuf> {
        self.remote.clone()
    }

    /// The peer's perftest version string.
    pub fn peer_version(&self) -> &str {
        &self.peer_version
    }

    /// Between two sizes of an `-a` run: the syncs perftest's send tests
    /// make there (none for the others).
    pub fn next_size(&mut self) -> Result<(), ToolError> {
        Ok(())
    }

    /// After the measured loop: perftest's closing sync / report exchange.
    /// The client's report goes to the server, which gets it back here.
    pub fn finish(self, local: Option<&BwFigures>) -> Result<Option<BwFigures>, ToolError> {
        let _ = (self.dp, local);
        Ok(None)
    }
}
