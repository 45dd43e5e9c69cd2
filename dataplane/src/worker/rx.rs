//! Receive: the second stage of each iteration. One receive burst from
//! the link, each frame classified (slow path, ARP to forward), handed to
//! its owning worker where the port cannot steer, and fed by reference
//! to the TCP engine with the device's checksum verdicts; then the frames
//! other workers forwarded or dispatched here.

use tcp_offload::Instant;

use crate::ctl::{PollPop, SmallFrame};
use crate::link::LinkQueue;
use crate::steer::RxSummary;

use super::counters::bump;
use super::{Worker, DISPATCH_PER_POLL, RX_BURST};

/// What the worker's interface receives: a frame of its own queue, or one
/// forwarded by another worker.
///
/// TCP keeps received payload in these (the in-order queue and the
/// out-of-order assembler of every connection have room for thousands),
/// so the rare forwarded frame (ARP, the slow path) is boxed: inline, its
/// 65 bytes would make every entry of those queues that much larger.
#[derive(Debug)]
pub enum RxFrame<B> {
    /// From the port.
    Nic(B),
    /// From another worker.
    Forwarded(Box<SmallFrame>),
}

impl<B: AsRef<[u8]>> AsRef<[u8]> for RxFrame<B> {
    fn as_ref(&self) -> &[u8] {
        match self {
            RxFrame::Nic(b) => b.as_ref(),
            RxFrame::Forwarded(f) => &f.bytes[..usize::from(f.len)],
        }
    }
}

/// How much of the next frame of a burst is prefetched while one is
/// handled: a standard frame whole; of a jumbo frame the start, after
/// which the hardware's stream prefetcher keeps ahead.
const RX_PREFETCH: usize = 2048;

impl<Q: LinkQueue> Worker<Q> {
    pub(super) fn receive(&mut self, now: Instant) -> bool {
        // Before the burst: a capture starts or stops on a burst's edge.
        self.capture.refresh(&self.counters.capture);
        let n = self.queue.rx_burst(&mut self.rx_batch, RX_BURST);
        self.rx_crcs.clear();
        if let Some(ring) = self.capture.ring() {
            let ts = ring.now_ns();
            for buf in &self.rx_batch {
                ring.record_bytes(ts, buf.as_ref());
            }
        }
        let mut bytes = 0u64;
        let mut punts = 0u64;
        let (mut dispatched, mut dispatch_drops) = (0u64, 0u64);
        let mut frames = self.rx_batch.drain(..).peekable();
        while let Some(buf) = frames.next() {
            // The next frame's first lines start coming while this one is
            // read: written by another core, each line of a fresh frame
            // is a miss the stream prefetcher has not seen coming.
            if let Some(next) = frames.peek() {
                let n = next.as_ref();
                crate::memory::prefetch(n.as_ptr(), n.len().min(RX_PREFETCH));
            }
            let f = buf.as_ref();
            bytes += f.len() as u64;
            // Read once: the punt counter, ARP forwarding and the
            // dispatcher's owner all come from this.
            let view = RxSummary::of(f);
            if view.punt() {
                punts += 1;
            }
            if view.arp {
                if let Some(sf) = SmallFrame::of(f) {
                    for q in &self.forward_out {
                        if q.push(sf).is_ok() {
                            bump(&self.counters.forwarded, 1);
                        }
                    }
                }
            }
            let cksum = self.queue.rx_checksum(&buf);
            let owner = self
                .dispatch_rss
                .as_ref()
                .zip(view.flow)
                .map(|(rss, (src, dst, sport, dport))| rss.queue_for(src, dst, sport, dport))
                .map(usize::from)
                .filter(|&o| o != self.index);
            if let Some(ring) = owner.and_then(|o| self.dispatch.rings.get(o)) {
                // The buffer moves to its owner; a full ring drops it (the
                // buffer goes back to the pool) and TCP recovers.
                if ring.push((buf, cksum)).is_ok() {
                    dispatched += 1;
                } else {
                    dispatch_drops += 1;
                }
                continue;
            }
            // Checksum and FPDU CRC in one read (`rx_pass`), for frames
            // this worker keeps.
            let before = cksum;
            let cksum = super::rx_pass::verify(buf.as_ref(), cksum, &mut self.rx_crcs);
            if cksum.any_good() && !before.any_good() {
                // Counted as trusted by the interface for our verdict.
                self.rx_pass_verified += 1;
            }
            self.iface.handle_frame_with(now, RxFrame::Nic(buf), cksum);
        }
        let mut fwd = 0;
        while let Some(sf) = self.forward_in.poll_pop() {
            fwd += 1;
            self.iface
                .handle_frame(now, RxFrame::Forwarded(Box::new(sf)));
        }
        let mut handed = 0;
        if self.dispatch_rss.is_some() {
            if let Some(ring) = self.dispatch.rings.get(self.index) {
                while handed < DISPATCH_PER_POLL {
                    let Some((buf, cksum)) = ring.poll_pop() else {
                        break;
                    };
                    handed += 1;
                    self.iface.handle_frame_with(now, RxFrame::Nic(buf), cksum);
                }
            }
        }
        if n > 0 {
            bump(&self.counters.rx_packets, n as u64);
            bump(&self.counters.rx_bytes, bytes);
            bump(&self.counters.punts, punts);
            if dispatched > 0 {
                bump(&self.counters.dispatched_out, dispatched);
            }
            if dispatch_drops > 0 {
                bump(&self.counters.dispatch_drops, dispatch_drops);
            }
        }
        if handed > 0 {
            bump(&self.counters.dispatched_in, handed as u64);
        }
        n + fwd + handed > 0
    }
}
