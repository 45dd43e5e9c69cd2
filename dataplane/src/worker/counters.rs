//! The worker's counters: written by the worker alone at each stage of
//! the pipeline (receive, transmit, connections, idle), read by the
//! control path while it runs (`Dataplane::stats`).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Counters of one worker, written by it alone and readable by anyone
/// while it runs (relaxed atomics: each value is exact, values are not
/// mutually consistent snapshots).
#[derive(Debug, Default)]
pub struct WorkerCounters {
    /// Frames received.
    pub rx_packets: AtomicU64,
    /// Bytes of those frames.
    pub rx_bytes: AtomicU64,
    /// Frames transmitted.
    pub tx_packets: AtomicU64,
    /// Bytes of those frames.
    pub tx_bytes: AtomicU64,
    /// Frames that took the slow path: ARP, ICMP, TCP with SYN, FIN or
    /// RST, anything not TCP.
    pub punts: AtomicU64,
    /// TCP segments retransmitted (summed over connections every
    /// [`STATS_PERIOD`](super::STATS_PERIOD)).
    pub retransmits: AtomicU64,
    /// TCP segments dropped by PAWS (RFC 7323 §5.3; TSval more than one
    /// tick behind TS.Recent, see [`tcp_offload::tcp::PAWS_WINDOW`]),
    /// summed over connections every [`STATS_PERIOD`](super::STATS_PERIOD). A steady rise on a
    /// path that reorders means the peer's timestamps run backwards.
    pub paws_drops: AtomicU64,
    /// Connections reset when the dataplane stopped because their FIN
    /// exchange had not finished within `tcp.close_linger_ms` (the peer
    /// did not acknowledge our FIN, or did not close its side).
    pub shutdown_resets: AtomicU64,
    /// Frames dropped: malformed or not for us on receive, no buffer or no
    /// room on transmit, unresolved neighbours (published every
    /// [`STATS_PERIOD`](super::STATS_PERIOD)).
    pub drops: AtomicU64,
    /// Streams ended by a Terminate, sent or received.
    pub terminates: AtomicU64,
    /// ARP frames forwarded to other workers.
    pub forwarded: AtomicU64,
    /// Connections currently owned.
    pub connections: AtomicU64,
    /// Loop iterations.
    pub loops: AtomicU64,
    /// Times the idle back-off slept.
    pub idle_sleeps: AtomicU64,
    /// Sleeps an application thread cut short by posting work or a
    /// control message (see "Idle back-off" in the module documentation).
    pub idle_wakeups: AtomicU64,
    /// Payload bytes the TX path read from registered memory to sum a TCP
    /// checksum (ports without checksum offload) because no sum from the
    /// record's CRC pass covered them: with the MPA CRC on this stays at
    /// zero unless the CRC is off, markers cut the payload, or a record
    /// no longer fits one segment (after an MSS shrink).
    pub tx_summed_bytes: AtomicU64,
    /// Payload bytes summed again from registered memory for a segment
    /// that the record's stored sum would have covered, because that sum
    /// was already used once: a retransmission, which carries whatever the
    /// application's buffer holds by then and must be summed from it (see
    /// the module documentation). Zero on ports that offload the checksum.
    pub tx_resummed_bytes: AtomicU64,
    /// Retransmissions whose payload, summed again, no longer matched the
    /// sum taken when the record was built: the application changed the
    /// buffer of a posted Send or Write before its completion, or the
    /// source of a Read being answered. A lower bound (a change that keeps the 16-bit sum goes
    /// unseen); the peer's MPA CRC check is what ends such a stream.
    pub tx_payload_changed: AtomicU64,
    /// Frames queued for transmit whose payload was copied into the frame
    /// because the link lacks multi-segment transmit ([`LinkCaps::multi_seg_tx`]:
    /// af_xdp in DPDK 22.11): zero on links that take payload by reference.
    ///
    /// [`LinkCaps::multi_seg_tx`]: crate::link::LinkCaps::multi_seg_tx
    pub tx_copied_frames: AtomicU64,
    /// Frames whose payload was copied into the frame, the MPA CRC and the
    /// TCP checksum computed over the copy in the same pass
    /// ([`rdmap::placement::Placement::crc_at_transmit`]): every copied
    /// FPDU with payload, the CRC on and no markers. In a train (a frame
    /// the port cuts into segments) each such FPDU counts, with the
    /// checksum left to the port.
    pub tx_fused_frames: AtomicU64,
    /// Received TCP frames handed to the worker that owns their connection
    /// (on a port that cannot steer flows to queues, the software
    /// dispatcher).
    pub dispatched_out: AtomicU64,
    /// Frames other workers handed to this one.
    pub dispatched_in: AtomicU64,
    /// Frames dropped because the owner's dispatch ring was full.
    pub dispatch_drops: AtomicU64,
    /// Connection services run: each iteration services only the
    /// connections on its ready list (those that received something, had
    /// work posted, a control message or a timer, or still have work
    /// left), so idle connections do not add to it.
    pub conn_visits: AtomicU64,
    /// ARP frames the worker's interface took in: requests it answered or
    /// learnt from, replies that resolved a neighbour (published every
    /// stats period).
    pub arp_in: AtomicU64,
    /// ARP frames it sent: requests and replies (published every stats
    /// period).
    pub arp_out: AtomicU64,
    /// Received frames whose IPv4 or TCP checksum the port had verified,
    /// so that the interface did not sum them again (published every
    /// stats period; 0 on ports without checksum verdicts).
    pub rx_cksum_trusted: AtomicU64,
    /// Received TCP segments of FPDU streams that ended inside an FPDU
    /// (the peer's segments split its FPDUs; 0 from a peer that keeps
    /// every FPDU in one segment).
    pub rx_segments_mid_fpdu: AtomicU64,
    /// Received FPDUs whose MPA CRC the receive pass took in the same read
    /// as the segment's TCP checksum: the payload was read once before its
    /// placement, not twice.
    pub rx_crc_in_pass: AtomicU64,
    /// TCP segments sent carrying several whole FPDUs (`tcp.pack_fpdus`).
    pub tx_packed_segments: AtomicU64,
    /// FPDUs those segments carried: divided by `tx_packed_segments`, the
    /// FPDUs per packed segment.
    pub tx_packed_fpdus: AtomicU64,
    /// Trains the worker cut into frames itself, the port having no
    /// segmentation offload (`tcp.segmentation_offload`): each one TCP
    /// output decision and one header for several segments.
    pub tx_cut_trains: AtomicU64,
    /// Records in flight: built from the queue pairs' work and not yet
    /// acknowledged by TCP (a gauge, set at each transmit pass). Each
    /// busy connection holds those it has sent and not had acknowledged,
    /// one queued ahead of its turn to send, and during its turn what it
    /// is about to send, never its whole window's worth.
    pub tx_records: AtomicU64,
    /// TX passes made right after a receive burst for the ACKs TCP owed
    /// for it, before the burst's payload was placed (see the worker's
    /// loop, step 2): a peer sending data gets its ACKs that much sooner.
    pub tx_ack_passes: AtomicU64,
    /// The EAL lcore id of the worker's thread plus one, recorded when the
    /// thread starts; 0 when it has none (see [`WorkerStats::lcore`]).
    lcore: AtomicU32,
    /// The Linux thread id of the worker's thread; 0 when it has none
    /// (see [`WorkerStats::thread_id`]).
    thread_id: AtomicU32,
    /// The worker's packet-capture point, armed by the control path
    /// ([`crate::capture`]); it rides here as the other state a worker
    /// shares with the control path.
    pub capture: crate::capture::CaptureTap,
}

/// A copy of [`WorkerCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// See [`WorkerCounters::rx_packets`].
    pub rx_packets: u64,
    /// See [`WorkerCounters::rx_bytes`].
    pub rx_bytes: u64,
    /// See [`WorkerCounters::tx_packets`].
    pub tx_packets: u64,
    /// See [`WorkerCounters::tx_bytes`].
    pub tx_bytes: u64,
    /// See [`WorkerCounters::punts`].
    pub punts: u64,
    /// See [`WorkerCounters::retransmits`].
    pub retransmits: u64,
    /// See [`WorkerCounters::paws_drops`].
    pub paws_drops: u64,
    /// See [`WorkerCounters::shutdown_resets`].
    pub shutdown_resets: u64,
    /// See [`WorkerCounters::drops`].
    pub drops: u64,
    /// See [`WorkerCounters::terminates`].
    pub terminates: u64,
    /// See [`WorkerCounters::forwarded`].
    pub forwarded: u64,
    /// See [`WorkerCounters::connections`].
    pub connections: u64,
    /// See [`WorkerCounters::loops`].
    pub loops: u64,
    /// See [`WorkerCounters::idle_sleeps`].
    pub idle_sleeps: u64,
    /// See [`WorkerCounters::idle_wakeups`].
    pub idle_wakeups: u64,
    /// See [`WorkerCounters::tx_summed_bytes`].
    pub tx_summed_bytes: u64,
    /// See [`WorkerCounters::tx_resummed_bytes`].
    pub tx_resummed_bytes: u64,
    /// See [`WorkerCounters::tx_payload_changed`].
    pub tx_payload_changed: u64,
    /// See [`WorkerCounters::tx_copied_frames`].
    pub tx_copied_frames: u64,
    /// See [`WorkerCounters::tx_fused_frames`].
    pub tx_fused_frames: u64,
    /// See [`WorkerCounters::dispatched_out`].
    pub dispatched_out: u64,
    /// See [`WorkerCounters::dispatched_in`].
    pub dispatched_in: u64,
    /// See [`WorkerCounters::dispatch_drops`].
    pub dispatch_drops: u64,
    /// See [`WorkerCounters::conn_visits`].
    pub conn_visits: u64,
    /// See [`WorkerCounters::arp_in`].
    pub arp_in: u64,
    /// See [`WorkerCounters::arp_out`].
    pub arp_out: u64,
    /// See [`WorkerCounters::rx_cksum_trusted`].
    pub rx_cksum_trusted: u64,
    /// See [`WorkerCounters::rx_segments_mid_fpdu`].
    pub rx_segments_mid_fpdu: u64,
    /// See [`WorkerCounters::rx_crc_in_pass`].
    pub rx_crc_in_pass: u64,
    /// See [`WorkerCounters::tx_packed_segments`].
    pub tx_packed_segments: u64,
    /// See [`WorkerCounters::tx_packed_fpdus`].
    pub tx_packed_fpdus: u64,
    /// See [`WorkerCounters::tx_cut_trains`].
    pub tx_cut_trains: u64,
    /// See [`WorkerCounters::tx_records`].
    pub tx_records: u64,
    /// See [`WorkerCounters::tx_ack_passes`].
    pub tx_ack_passes: u64,
    /// The EAL lcore id its thread runs as (`rte_lcore_id()`), recorded
    /// when a worker thread starts (`DriveMode::Threads`); `None` for a
    /// thread EAL does not know and for workers the application drives.
    pub lcore: Option<u32>,
    /// The Linux thread id of its thread (`DriveMode::Threads`), to read
    /// the thread's CPU time (`/proc/self/task/<id>/schedstat`); `None`
    /// for workers the application drives.
    pub thread_id: Option<u32>,
}

impl WorkerCounters {
    /// Records the EAL lcore id of the worker's thread (`None`: a thread
    /// EAL does not know).
    pub(crate) fn set_lcore(&self, lcore: Option<u32>) {
        let v = lcore.map_or(0, |id| id.saturating_add(1));
        self.lcore.store(v, Ordering::Relaxed);
    }

    /// Records the Linux thread id of the worker's thread.
    pub(crate) fn set_thread_id(&self, id: Option<u32>) {
        self.thread_id.store(id.unwrap_or(0), Ordering::Relaxed);
    }

    /// The current values.
    pub fn snapshot(&self) -> WorkerStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerStats {
            rx_packets: g(&self.rx_packets),
            rx_bytes: g(&self.rx_bytes),
            tx_packets: g(&self.tx_packets),
            tx_bytes: g(&self.tx_bytes),
            punts: g(&self.punts),
            retransmits: g(&self.retransmits),
            paws_drops: g(&self.paws_drops),
            shutdown_resets: g(&self.shutdown_resets),
            drops: g(&self.drops),
            terminates: g(&self.terminates),
            forwarded: g(&self.forwarded),
            connections: g(&self.connections),
            loops: g(&self.loops),
            idle_sleeps: g(&self.idle_sleeps),
            idle_wakeups: g(&self.idle_wakeups),
            tx_summed_bytes: g(&self.tx_summed_bytes),
            tx_resummed_bytes: g(&self.tx_resummed_bytes),
            tx_payload_changed: g(&self.tx_payload_changed),
            tx_copied_frames: g(&self.tx_copied_frames),
            tx_fused_frames: g(&self.tx_fused_frames),
            dispatched_out: g(&self.dispatched_out),
            dispatched_in: g(&self.dispatched_in),
            dispatch_drops: g(&self.dispatch_drops),
            conn_visits: g(&self.conn_visits),
            arp_in: g(&self.arp_in),
            rx_cksum_trusted: g(&self.rx_cksum_trusted),
            rx_segments_mid_fpdu: g(&self.rx_segments_mid_fpdu),
            rx_crc_in_pass: g(&self.rx_crc_in_pass),
            tx_packed_segments: g(&self.tx_packed_segments),
            tx_packed_fpdus: g(&self.tx_packed_fpdus),
            tx_cut_trains: g(&self.tx_cut_trains),
            tx_records: g(&self.tx_records),
            tx_ack_passes: g(&self.tx_ack_passes),
            arp_out: g(&self.arp_out),
            lcore: self.lcore.load(Ordering::Relaxed).checked_sub(1),
            thread_id: Some(self.thread_id.load(Ordering::Relaxed)).filter(|&t| t != 0),
        }
    }
}

/// Adds to a counter only this worker writes: a plain load and store
/// (no locked instruction on the data path).
pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}
