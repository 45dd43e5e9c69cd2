//! Idle back-off: what a worker thread does between iterations that
//! found nothing to do (spin, yield, then sleep until woken through its
//! `IdleWake` doorbell); see "Idle back-off" in the worker's module
//! documentation. The loop also stops when an application thread asks to
//! drive the worker itself (busy polling, `crate::api::BusyPoll`).

use core::sync::atomic::{AtomicUsize, Ordering};
use core::time::Duration;

use crate::config::IdleConfig;
use crate::link::LinkQueue;

use super::counters::bump;
use super::Worker;

impl<Q: LinkQueue> Worker<Q> {
    /// Runs on its own thread, backing off when idle as `idle` says (see
    /// "Idle back-off" in the module documentation), until a shutdown
    /// message arrives (true) or `wanted` shows that an application thread
    /// waits to drive the worker (false; a relaxed load per iteration).
    pub(crate) fn run_until(&mut self, idle: &IdleConfig, wanted: &AtomicUsize) -> bool {
        crate::sys::fine_timer_slack();
        let wake = self.wake.clone();
        let me = wake.get(self.index);
        if let Some(w) = me {
            let _ = w.thread.set(std::thread::current());
        }
        let nap = Duration::from_micros(idle.sleep_us);
        let mut empty = 0u32;
        while !self.stopping {
            if wanted.load(Ordering::Relaxed) > 0 {
                return false;
            }
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
        true
    }
}
