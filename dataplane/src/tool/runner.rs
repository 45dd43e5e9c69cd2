//! The measured loops of the perf tests and the demo.

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
