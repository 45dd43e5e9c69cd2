//! Idle back-off: what a worker thread does between iterations that
//! found nothing to do (spin, yield, then sleep until woken through its
//! `IdleWake` doorbell); see "Idle back-off" in the worker's module
//! documentation.

use core::time::Duration;

use crate::config::IdleConfig;
use crate::link::LinkQueue;

use super::counters::bump;
use super::Worker;

impl<Q: LinkQueue> Worker<Q> {
    /// Runs on its own thread until a shutdown message arrives, backing
    /// off when idle as `idle` says (see "Idle back-off" in the module
    /// documentation).
    pub(crate) fn run(mut self, idle: &IdleConfig) {
        crate::sys::fine_timer_slack();
        let wake = self.wake.clone();
        let me = wake.get(self.index);
        if let Some(w) = me {
            let _ = w.thread.set(std::thread::current());
        }
        let nap = Duration::from_micros(idle.sleep_us);
        let mut empty = 0u32;
        while !self.stopping {
            if self.poll() {
                empty = 0;
                continue;
            }
            empty = empty.saturating_add(1);
            if idle.sleep_us > 0 && empty >= idle.spin {
                bump(&self.counters.idle_sleeps, 1);
                let woken = match me {
                    Some(w) => w.sleep(nap),
                    None => {
                        std::thread::sleep(nap);
                        false
                    }
                };
                if woken {
                    bump(&self.counters.idle_wakeups, 1);
                }
            } else if idle.yield_cpu {
                std::thread::yield_now();
            }
        }
        self.shutdown();
    }
}
