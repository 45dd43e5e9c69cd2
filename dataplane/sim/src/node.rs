//! One dataplane as an endpoint of the simulated network: frames the
//! network delivers go into the dataplane's port, frames its workers send
//! come out of it, and before either the dataplane's time is set to the
//! network's. Between frames the node wakes on a fixed tick, so that the
//! workers' own timers (retransmission, delayed ACK, MPA timeouts) run.

use core::time::Duration;

use dataplane::api::ManualTime;
use dataplane::link::MemPort;
use dataplane::Dataplane;
use tcp_offload::Instant;
use tcp_sim::Endpoint;

/// How often an otherwise quiet node runs its workers' loops: the
/// resolution of its timers in virtual time.
pub const TICK: Duration = Duration::from_micros(100);

/// Loop iterations one request for a frame runs at most before it reports
/// that none is ready.
const POLLS_PER_FRAME: usize = 4;

/// A dataplane plugged into the simulator.
#[derive(Debug)]
pub struct Node {
    dp: Dataplane,
    port: MemPort,
    time: ManualTime,
    next_tick: Instant,
    injected: u64,
    refused: u64,
}

impl Node {
    /// A node around `dp`, whose port's far side is `port` and whose
    /// clock is `time`.
    pub fn new(dp: Dataplane, port: MemPort, time: ManualTime) -> Node {
        Node {
            dp,
            port,
            time,
            next_tick: Instant::ZERO,
            injected: 0,
            refused: 0,
        }
    }

    /// The dataplane.
    pub fn dp(&self) -> &Dataplane {
        &self.dp
    }

    /// Frames the network delivered to the port, and how many of those
    /// the port refused (no receive buffer or ring room).
    pub fn frames_in(&self) -> (u64, u64) {
        (self.injected, self.refused)
    }

    /// Takes the dataplane out (to stop it).
    pub fn into_dataplane(self) -> Dataplane {
        self.dp
    }
}

impl Endpoint for Node {
    fn handle_frame(&mut self, now: Instant, frame: Vec<u8>) {
        self.time.set(now);
        self.injected += 1;
        if !self.port.inject(&frame) {
            self.refused += 1;
        }
    }

    fn poll_frame(&mut self, now: Instant) -> Option<Vec<u8>> {
        self.time.set(now);
        if let Some(f) = self.port.take() {
            return Some(f);
        }
        for _ in 0..POLLS_PER_FRAME {
            let work = self.dp.poll();
            if let Some(f) = self.port.take() {
                return Some(f);
            }
            if !work {
                break;
            }
        }
        None
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        Some(self.next_tick)
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.time.set(now);
        self.dp.poll();
        self.next_tick = now + TICK;
    }
}
