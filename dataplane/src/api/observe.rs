//! Observation: the workers', the link's and the device's counters, the
//! queue pairs' published figures, and packet capture.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rdmap::verbs::QpNum;

use crate::ctl::{ConnectionInfo, Error, QpStatus};
use crate::ctl::{QpShared, UNBOUND};
use crate::worker::WorkerStats;

use super::control::lock;
use super::Dataplane;

/// A queue pair as the control path sees it, from
/// [`Dataplane::qp_snapshots`]: the figures are the owning worker's last
/// publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpSnapshot {
    /// Its number.
    pub qpn: QpNum,
    /// The worker that owns its connection, once bound.
    pub worker: Option<usize>,
    /// Where it stands.
    pub status: QpStatus,
    /// What its connection negotiated, once established.
    pub connection: Option<ConnectionInfo>,
    /// TCP payload bytes sent (MPA framing included).
    pub bytes_sent: u64,
    /// TCP payload bytes received.
    pub bytes_received: u64,
    /// TCP segments retransmitted.
    pub retransmits: u64,
    /// RDMA Reads sent whose Response has not completed.
    pub outstanding_reads: u64,
}

impl Dataplane {
    /// Memory registrations alive (valid, invalidated, or deregistering
    /// while data in flight still refers to them): what shows that a
    /// long-running service's failed sessions give their buffers back.
    pub fn mr_count(&self) -> u32 {
        lock(&self.control).device.mrs().len()
    }

    /// Each worker's counters, read while it runs.
    pub fn stats(&self) -> Vec<WorkerStats> {
        self.workers.iter().map(|w| w.counters.snapshot()).collect()
    }

    /// The port's own counters (the link's, below the workers), as name
    /// and value, where the link keeps any: a DPDK port's receive drops,
    /// linearized chains and zero-copy attachments, an in-memory link's
    /// frames and drops. Empty for a link given to
    /// [`Dataplane::open_with_link`].
    pub fn link_stats(&self) -> Vec<(&'static str, u64)> {
        let _g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.link_counters
            .as_ref()
            .map_or_else(Vec::new, |c| c.read())
    }

    /// The device counters of each DPDK port under the dataplane (its
    /// first and only port today), read now: what the NIC or its driver
    /// counted, including frames dropped before any worker saw them
    /// (`rx_missed`, `rx_nombuf`, errors). Empty for an in-memory link,
    /// which has no device; its software counters are in
    /// [`Dataplane::link_stats`]. Called from the control path (a control
    /// socket, a metrics scrape): it takes nothing a worker waits on.
    pub fn port_stats(&self) -> Vec<crate::link::DevicePortStats> {
        self.dev_port.iter().map(|d| d.read()).collect()
    }

    /// Every live queue pair (one the application still holds), in order
    /// of creation, with the figures its worker last published.
    pub fn qp_snapshots(&self) -> Vec<QpSnapshot> {
        let live: Vec<Arc<QpShared>> = lock(&self.qps).live();
        live.iter()
            .map(|q| {
                let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
                let worker = q.worker.load(Ordering::Acquire);
                QpSnapshot {
                    qpn: q.qpn,
                    worker: (worker != UNBOUND).then_some(worker),
                    status: QpStatus::from_u8(q.status.load(Ordering::Acquire)),
                    connection: lock(&q.connection).clone(),
                    bytes_sent: g(&q.counters.bytes_sent),
                    bytes_received: g(&q.counters.bytes_received),
                    retransmits: g(&q.counters.retransmits),
                    outstanding_reads: g(&q.counters.outstanding_reads),
                }
            })
            .collect()
    }

    /// Starts capturing every frame each worker receives and transmits
    /// into the pcap file `path` (created, or truncated), written by a
    /// thread of its own off the workers' path (see [`crate::capture`]).
    /// Start it before the connections to look at: Wireshark recognises
    /// MPA from the connection's MPA request. One capture at a time.
    pub fn capture_start(
        &self,
        path: &std::path::Path,
        opts: &crate::capture::CaptureOptions,
    ) -> Result<(), Error> {
        let taps: Vec<&crate::capture::CaptureTap> =
            self.workers.iter().map(|w| &w.counters.capture).collect();
        self.capture
            .start(&taps, path, opts)
            .map_err(Error::Capture)
    }

    /// Stops the capture: waits for each worker to let go of its ring
    /// (running the loops meanwhile in [`DriveMode::Inline`](super::DriveMode::Inline)), writes what
    /// the rings hold, closes the file, and says per worker how many
    /// frames were written and how many were dropped for want of a slot.
    pub fn capture_stop(&self) -> Result<crate::capture::CaptureSummary, Error> {
        let taps: Vec<&crate::capture::CaptureTap> =
            self.workers.iter().map(|w| &w.counters.capture).collect();
        self.capture
            .stop(&taps, || {
                self.poll();
            })
            .map_err(Error::Capture)
    }

    /// Whether a capture runs.
    pub fn capturing(&self) -> bool {
        self.capture.running()
    }
}
