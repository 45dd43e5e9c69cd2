//! The measured loops of the perf tests and the demo.

use core::time::Duration;

use crate::api::{Cq, Dataplane, MemoryRegistration, ProtectionDomain, Qp};

use super::ToolError;

/// The six perftest tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TestKind {
    /// RDMA Write bandwidth (`ib_write_bw`).
    WriteBw,
    /// RDMA Read bandwidth (`ib_read_bw`).
    ReadBw,
    /// Send bandwidth (`ib_send_bw`).
    SendBw,
    /// RDMA Write latency (`ib_write_lat`).
    WriteLat,
    /// RDMA Read latency (`ib_read_lat`).
    ReadLat,
    /// Send latency (`ib_send_lat`).
    SendLat,
}

/// Which end of a test this side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side given a peer address (perftest's client).
    Client,
    /// The side waiting for one (perftest's server).
    Server,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSpec {
    /// Which test.
    pub test: TestKind,
    /// Which side.
    pub role: Role,
    /// Bytes per message (`-s`).
    pub size: usize,
    /// Messages (`-n`).
    pub iterations: u64,
    /// Run for this long instead (`-D`, bandwidth tests).
    pub duration: Option<Duration>,
    /// Data connections (`-q`).
    pub qps: usize,
    /// Send-queue depth (`-t`).
    pub tx_depth: u32,
    /// Receive-queue depth (`-r`).
    pub rx_depth: u32,
    /// Outstanding RDMA Reads (`-o`).
    pub outstanding_reads: u32,
    /// Fill a pattern and check the received bytes.
    pub verify: bool,
    /// Every size from 2 bytes to 8 MiB (`-a`).
    pub all_sizes: bool,
}

/// A peer's buffer: what goes into perftest's `pingpong_dest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuf {
    /// Tagged offset of its first byte.
    pub addr: u64,
    /// Its STag.
    pub rkey: u32,
}

/// The verbs objects of a run.
#[derive(Debug)]
pub struct Resources {
    /// The protection domain.
    pub pd: ProtectionDomain,
    /// The one completion queue all QPs share.
    pub cq: Cq,
    /// The data queue pairs (unconnected).
    pub qps: Vec<Qp>,
    /// One registered buffer per QP.
    pub mrs: Vec<MemoryRegistration>,
}

impl Resources {
    /// Allocates what `spec` needs on `dp`.
    pub fn new(_dp: &Dataplane, _spec: &RunSpec) -> Result<Resources, ToolError> {
        Err(ToolError::Usage("not yet".into()))
    }

    /// What this side advertises for QP `i`.
    pub fn local_buf(&self, i: usize) -> RemoteBuf {
        RemoteBuf {
            addr: self.mrs[i].addr(),
            rkey: self.mrs[i].rkey().0,
        }
    }

    /// Runs the measured loop on the connected QPs.
    pub fn run(
        &self,
        _dp: &Dataplane,
        _spec: &RunSpec,
        _remote: &[RemoteBuf],
        _progress: &mut dyn FnMut(&Progress),
    ) -> Result<RunResult, ToolError> {
        Err(ToolError::Usage("not yet".into()))
    }
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Messages done.
    pub done: u64,
    /// Messages in all (0 in duration mode).
    pub total: u64,
    /// Time since the start.
    pub elapsed: Duration,
}

/// Latency figures, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    /// Fastest.
    pub min_us: f64,
    /// Median (perftest's "typical").
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest.
    pub max_us: f64,
    /// Mean.
    pub avg_us: f64,
    /// Standard deviation.
    pub stdev_us: f64,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunResult {
    /// Bytes per message.
    pub size: usize,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Messages completed.
    pub iterations: u64,
    /// Measured time.
    #[serde(serialize_with = "ser_secs")]
    pub elapsed: Duration,
    /// Peak bandwidth, MB/s (10^6 bytes).
    pub bw_peak_mbps: f64,
    /// Average bandwidth, MB/s.
    pub bw_avg_mbps: f64,
    /// Message rate, millions per second.
    pub msg_rate_mpps: f64,
    /// Latency test figures.
    pub latency: Option<LatencySummary>,
    /// Bytes whose content was checked.
    pub verified_bytes: u64,
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}
