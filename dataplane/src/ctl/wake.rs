//! The doorbell between the threads that hand a worker work and the
//! worker's idle back-off: a sleeping worker says so here, and a post or
//! a control message wakes it.

use core::time::Duration;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Whether a worker sleeps, as the threads that hand it work see it: they
/// call [`IdleWake::wake`] after each post, which costs a load while the
/// worker is awake and unparks it while it sleeps, so that a request
/// posted to an idle worker does not wait for the end of its sleep. A
/// post that races with the worker going to sleep may miss it and waits
/// at most one sleep, as it would without this.
#[derive(Debug, Default)]
pub(crate) struct IdleWake {
    sleeping: AtomicBool,
    /// The worker's thread, once it runs (none in inline mode).
    pub(crate) thread: OnceLock<std::thread::Thread>,
}

impl IdleWake {
    /// One per worker.
    pub(crate) fn set(workers: usize) -> Arc<[IdleWake]> {
        (0..workers).map(|_| IdleWake::default()).collect()
    }

    /// Wakes the worker if it sleeps.
    pub(crate) fn wake(&self) {
        if self.sleeping.load(Ordering::SeqCst) && self.sleeping.swap(false, Ordering::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// Sleeps at most `d` unless woken; whether [`IdleWake::wake`] cut
    /// it short.
    pub(crate) fn sleep(&self, d: Duration) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        std::thread::park_timeout(d);
        // Still set: nobody woke it (a timeout, or a spurious return).
        !self.sleeping.swap(false, Ordering::SeqCst)
    }
}
