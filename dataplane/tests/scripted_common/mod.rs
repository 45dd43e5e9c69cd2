//! A scripted peer for the runtime tests: a TCP engine of its own
//! (`tcp-sim`'s interface) on the far end of an in-memory link, which a
//! test drives by hand around its script.

/// A scripted peer's engine on the far end of an in-memory link: hands it
/// the frames the link delivered, then (after the caller's script has run)
/// its timers and the frames it has to send, built whole.
pub struct ScriptedEnd {
    pub iface: tcp_sim::host::SimInterface,
    pub queue: dataplane::link::MemQueue,
}

impl ScriptedEnd {
    /// Frames in.
    pub fn receive(&mut self, now: tcp_offload::time::Instant) {
        use dataplane::link::LinkQueue;
        let mut bufs = Vec::new();
        self.queue.rx_burst(&mut bufs, 64);
        for b in bufs {
            self.iface.handle_frame(now, b.as_ref().to_vec());
        }
    }

    /// Timers, then frames out.
    pub fn transmit(&mut self, now: tcp_offload::time::Instant) {
        use dataplane::link::{LinkQueue, TxFrame};
        if self.iface.poll_timeout().is_some_and(|t| t <= now) {
            self.iface.handle_timeout(now);
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1600];
        while let Some(n) = self.iface.poll_frame(now, &mut buf) {
            let mut f = self.queue.alloc_tx().expect("a frame");
            f.append(&buf[..n]).expect("a frame fits");
            out.push(f);
        }
        while !out.is_empty() {
            self.queue.tx_burst(&mut out);
        }
    }
}
