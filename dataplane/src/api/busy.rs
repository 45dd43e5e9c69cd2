//! Busy polling: an application thread drives its dataplane's workers
//! itself, run to completion, instead of handing work to worker threads
//! through the submission rings and waiting for them to notice.
//!
//! Each worker thread lends its worker through a [`Handover`]: when an
//! application thread asks for it ([`Dataplane::busy_poll`]), the worker
//! thread finishes its iteration, puts the worker in the handover's slot
//! and waits; the application thread takes it and runs its loop with
//! [`BusyPoll::poll`] (no lock, no hand-off between threads: a post, the
//! transmission it causes and the completion it ends in happen on one
//! core). Dropping the [`BusyPoll`] gives the worker back to its thread,
//! which goes on serving the connections (the peer's last messages, the
//! close). The ring and the condition variable are touched only when the
//! worker changes hands, never per packet.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;
use std::time::Instant;

use crate::config::IdleConfig;
use crate::ctl::Error;

use super::bringup::Pollable;
use super::control::lock;
use super::{Dataplane, CONTROL_TIMEOUT};

/// Where a worker thread and the application threads that busy-poll pass
/// the worker between them.
pub(super) struct Handover {
    /// Application threads that hold or wait for the worker; the worker
    /// thread stops its loop while it is not 0.
    wanted: AtomicUsize,
    /// The worker while no thread runs it.
    slot: Mutex<Option<Box<dyn Pollable>>>,
    /// Signalled whenever the slot fills.
    moved: Condvar,
}

impl core::fmt::Debug for Handover {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Handover")
            .field("wanted", &self.wanted.load(Ordering::Relaxed))
            .finish()
    }
}

impl Handover {
    pub(super) fn new() -> Arc<Handover> {
        Arc::new(Handover {
            wanted: AtomicUsize::new(0),
            slot: Mutex::new(None),
            moved: Condvar::new(),
        })
    }

    /// The worker thread's life: run the worker's loop, lend it whenever
    /// an application thread wants it and take it back when that thread
    /// is done, until a shutdown message arrives; then close its
    /// connections.
    pub(super) fn drive(&self, mut w: Box<dyn Pollable>, idle: &IdleConfig) {
        loop {
            if w.run_until(idle, &self.wanted) {
                w.shutdown();
                return;
            }
            let mut slot = lock(&self.slot);
            *slot = Some(w);
            self.moved.notify_all();
            w = loop {
                if self.wanted.load(Ordering::SeqCst) == 0 {
                    if let Some(w) = slot.take() {
                        break w;
                    }
                }
                slot = self.moved.wait(slot).unwrap_or_else(|e| e.into_inner());
            };
        }
    }

    /// An application thread's side: the worker, once its thread has let
    /// it go, or `None` at `deadline` (the caller is then no longer
    /// counted as wanting it).
    fn take(&self, deadline: Instant) -> Option<Box<dyn Pollable>> {
        let mut slot = lock(&self.slot);
        loop {
            if let Some(w) = slot.take() {
                return Some(w);
            }
            let now = Instant::now();
            if now >= deadline {
                self.wanted.fetch_sub(1, Ordering::SeqCst);
                self.moved.notify_all();
                return None;
            }
            slot = self
                .moved
                .wait_timeout(slot, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Gives the worker back (to its thread, or to the next application
    /// thread waiting for it).
    fn give_back(&self, w: Box<dyn Pollable>) {
        let mut slot = lock(&self.slot);
        *slot = Some(w);
        self.wanted.fetch_sub(1, Ordering::SeqCst);
        self.moved.notify_all();
    }
}

/// The calling thread drives the dataplane's workers until this is
/// dropped ([`Dataplane::busy_poll`]): call [`BusyPoll::poll`] wherever
/// the program would otherwise wait (for a completion, for a byte a peer
/// writes). Not `Send`: the workers run on the thread that took them
/// (over a DPDK port the thread is registered with EAL meanwhile).
///
/// While it lives, control calls from the same thread (`reg_mr`,
/// `connect`, ...) fail with [`Error::BusyPolling`] instead of waiting for
/// a worker that only this thread runs; other threads' control calls are
/// answered when this thread polls.
pub struct BusyPoll<'a> {
    dp: &'a Dataplane,
    /// The workers taken from their threads, each with its handover.
    taken: Vec<(Arc<Handover>, Box<dyn Pollable>)>,
    /// The thread's registrations with the port, dropped after the
    /// workers have gone back.
    _entered: Vec<Box<dyn core::any::Any>>,
}

impl core::fmt::Debug for BusyPoll<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BusyPoll")
            .field("workers", &self.taken.len())
            .finish()
    }
}

impl BusyPoll<'_> {
    /// Runs one iteration of every worker's loop; whether any did work.
    pub fn poll(&mut self) -> bool {
        if self.taken.is_empty() {
            // An inline dataplane: its workers are driven through it.
            return self.dp.poll();
        }
        let mut work = false;
        for (_, w) in &mut self.taken {
            work |= w.poll();
        }
        work
    }

    /// How many workers this thread drives (0 for an inline dataplane,
    /// whose [`Dataplane::poll`] this calls).
    pub fn workers(&self) -> usize {
        self.taken.len()
    }
}

impl Drop for BusyPoll<'_> {
    fn drop(&mut self) {
        for (h, w) in self.taken.drain(..) {
            h.give_back(w);
        }
        self.dp.busy_thread_done();
    }
}

impl Dataplane {
    /// Takes the workers from their threads for the calling thread to
    /// drive, busy polling (see [`BusyPoll`]); they go back when it is
    /// dropped. An inline dataplane ([`super::DriveMode::Inline`]) is
    /// driven through [`Dataplane::poll`] as always. Fails if the thread
    /// holds one already, if a worker does not let go within
    /// [`CONTROL_TIMEOUT`] (another thread holds it that long), or if the
    /// port cannot run on this thread.
    pub fn busy_poll(&self) -> Result<BusyPoll<'_>, Error> {
        let me = std::thread::current().id();
        {
            let mut busy = lock(&self.busy_threads);
            if busy.contains(&me) {
                return Err(Error::InvalidArgument(
                    "this thread busy-polls the dataplane already",
                ));
            }
            busy.push(me);
        }
        let mut bp = BusyPoll {
            dp: self,
            taken: Vec::new(),
            _entered: Vec::new(),
        };
        if self.inline.is_some() {
            return Ok(bp);
        }
        let deadline = Instant::now() + CONTROL_TIMEOUT;
        for (i, h) in self.workers.iter().enumerate() {
            h.handover.wanted.fetch_add(1, Ordering::SeqCst);
            self.wake_worker(i);
            match h.handover.take(deadline) {
                Some(w) => bp.taken.push((h.handover.clone(), w)),
                None => return Err(Error::Timeout),
            }
        }
        for (_, w) in &bp.taken {
            match w.enter_thread() {
                Ok(Some(g)) => bp._entered.push(g),
                Ok(None) => {}
                Err(m) => return Err(Error::Thread(m)),
            }
        }
        Ok(bp)
    }

    /// Whether the calling thread holds a [`BusyPoll`] of this dataplane.
    pub(super) fn busy_here(&self) -> bool {
        let me = std::thread::current().id();
        lock(&self.busy_threads).contains(&me)
    }

    fn busy_thread_done(&self) {
        let me: ThreadId = std::thread::current().id();
        lock(&self.busy_threads).retain(|&t| t != me);
    }
}
