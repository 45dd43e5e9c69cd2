//! The doorbell between the threads that hand a worker work and the
//! worker's idle back-off: a sleeping worker says so here, and a post or
//! a control message wakes it.

use core::time::Duration;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_queue::ArrayQueue;

use super::PollPop;

/// Whether a worker sleeps, as the threads that hand it work see it: they
/// call [`IdleWake::wake`] after each post, which costs a load while the
/// worker is awake and unparks it while it sleeps, so that a request
/// posted to an idle worker does not wait for the end of its sleep. A
/// post that races with the worker going to sleep may miss it and waits
/// at most one sleep, as it would without this.
///
/// It is also where a queue pair's posts announce themselves: the first
/// post since the worker last drained that queue pair's submission rings
/// puts the connection's slot in [`IdleWake::posted`], so that the worker
/// services the connections with new work without looking at every one.
#[derive(Debug)]
pub(crate) struct IdleWake {
    sleeping: AtomicBool,
    /// The worker's thread, once it runs (none in inline mode).
    pub(crate) thread: OnceLock<std::thread::Thread>,
    /// Slots of connections with newly posted work (multi-producer: every
    /// application thread; one entry per queue pair at most, see
    /// `QpShared::doorbell`). Sized at bring-up for every connection.
    posted: ArrayQueue<u32>,
    /// A post found [`IdleWake::posted`] full: the worker looks at every
    /// connection once.
    posted_overflow: AtomicBool,
}

impl IdleWake {
    /// One per worker, each with room for `connections` posted slots.
    pub(crate) fn set(workers: usize, connections: usize) -> Arc<[IdleWake]> {
        (0..workers)
            .map(|_| IdleWake {
                sleeping: AtomicBool::new(false),
                thread: OnceLock::new(),
                posted: ArrayQueue::new(connections.max(1)),
                posted_overflow: AtomicBool::new(false),
            })
            .collect()
    }

    /// Says that the connection in `slot` has new posted work.
    pub(crate) fn ring(&self, slot: u32) {
        if self.posted.push(slot).is_err() {
            self.posted_overflow.store(true, Ordering::SeqCst);
        }
    }

    /// The worker's side: the next slot with new posted work.
    pub(crate) fn take_posted(&self) -> Option<u32> {
        self.posted.poll_pop()
    }

    /// The worker's side: whether a post overflowed [`IdleWake::posted`]
    /// since the last call (then every connection needs a look).
    pub(crate) fn take_overflow(&self) -> bool {
        self.posted_overflow.load(Ordering::Relaxed)
            && self.posted_overflow.swap(false, Ordering::SeqCst)
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
