//! The bounded ring under a queue pair's posting rings
//! ([`super::wr_ring`]): entries of a few words, pushed by any number of
//! application threads, taken by the worker that owns the queue pair.
//!
//! Each slot carries a stamp, as in the sequence-numbered bounded queue
//! that crossbeam's `ArrayQueue` also is: a slot is free for position `p`
//! when its stamp is `p`, holds position `p`'s entry when it is `p + 1`,
//! and is free again for the next lap at `p + cap`. What this ring adds
//! to such a queue:
//! - a producer reserves a run of positions with one CAS on the tail and
//!   then fills and publishes them one by one, so a list of requests
//!   (`ibv_post_send` with a chain) costs one atomic read-modify-write,
//!   not one per request;
//! - a ring with one consumer ([`Consumers::One`]) takes entries with
//!   plain loads and stores: no read-modify-write at all on the worker's
//!   side. A shared receive queue, which several workers take from, uses
//!   [`Consumers::Many`], a CAS on the head per entry.
//!
//! Entries are stored as atomic words, so the ring needs no `unsafe`: the
//! stamp's release store after the words, and the acquire load that
//! reads it, order them for the other side.
//!
//! Empty is decided on the tail, read with a sequentially consistent load
//! after the tail was moved with a sequentially consistent CAS, as the
//! general queue did: a worker that clears its doorbell and then looks
//! still meets a poster that reserves and then rings it
//! (`QpShared::wake_worker`). A position reserved and not yet published
//! reads as empty; its poster rings the doorbell after publishing.

use core::sync::atomic::{AtomicU64, Ordering};

/// A slot's payload: a fixed number of atomic words.
pub(crate) trait Words: Send + Sync {
    /// The words as plain values.
    type Plain: Copy;
    /// All zero.
    fn zero() -> Self;
    /// Reads the words (relaxed; the stamp orders them).
    fn load(&self) -> Self::Plain;
    /// Writes the words (relaxed; the stamp orders them).
    fn store(&self, v: Self::Plain);
}

impl<const N: usize> Words for [AtomicU64; N] {
    type Plain = [u64; N];

    fn zero() -> Self {
        core::array::from_fn(|_| AtomicU64::new(0))
    }

    #[inline]
    fn load(&self) -> [u64; N] {
        core::array::from_fn(|i| self[i].load(Ordering::Relaxed))
    }

    #[inline]
    fn store(&self, v: [u64; N]) {
        for (w, v) in self.iter().zip(v) {
            w.store(v, Ordering::Relaxed);
        }
    }
}

/// Who takes entries from a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Consumers {
    /// One thread at a time (the owning worker; a queue pair is bound to
    /// one worker for its life).
    One,
    /// Any number at once.
    Many,
}

struct Slot<A> {
    stamp: AtomicU64,
    words: A,
}

/// A counter on a cache line of its own, so that producers moving the
/// tail and the consumer moving the head do not share one.
#[repr(align(64))]
struct Line(AtomicU64);

/// A bounded ring of `A`-sized entries (see the module documentation).
pub(crate) struct Slots<A: Words> {
    /// The next position to reserve.
    tail: Line,
    /// The next position to take.
    head: Line,
    slots: Box<[Slot<A>]>,
    consumers: Consumers,
}

/// A run of reserved positions: `first..first + count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reserved {
    pub(crate) first: u64,
    pub(crate) count: usize,
}

impl<A: Words> Slots<A> {
    /// A ring of `cap` entries (at least one).
    pub(crate) fn new(cap: usize, consumers: Consumers) -> Slots<A> {
        let slots = (0..cap.max(1) as u64)
            .map(|p| Slot {
                stamp: AtomicU64::new(p),
                words: A::zero(),
            })
            .collect();
        Slots {
            tail: Line(AtomicU64::new(0)),
            head: Line(AtomicU64::new(0)),
            slots,
            consumers,
        }
    }

    /// Entries it holds at most.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    fn slot(&self, p: u64) -> &Slot<A> {
        // Never past the end: the index is reduced modulo the length.
        &self.slots[(p % self.slots.len() as u64) as usize]
    }

    /// Reserves up to `want` consecutive positions, as many as are free
    /// (none when the ring is full). Each must then be [`Slots::publish`]ed.
    pub(crate) fn reserve(&self, want: usize) -> Reserved {
        let mut t = self.tail.0.load(Ordering::Relaxed);
        loop {
            let mut n = 0;
            let mut moved = false;
            while n < want {
                let p = t + n as u64;
                // Acquire: the consumer's reads of the slot's last entry
                // are done before this producer writes the next.
                let s = self.slot(p).stamp.load(Ordering::Acquire);
                if s != p {
                    // Behind: another producer took `p` already.
                    moved = s > p;
                    break;
                }
                n += 1;
            }
            if n == 0 {
                if !moved {
                    return Reserved { first: t, count: 0 };
                }
                t = self.tail.0.load(Ordering::Relaxed);
                continue;
            }
            // The positions were free for `t`; the CAS makes them ours
            // only if no other producer took `t` meanwhile (positions
            // only grow, so a stale `t` cannot match again).
            match self.tail.0.compare_exchange_weak(
                t,
                t + n as u64,
                Ordering::SeqCst,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Reserved { first: t, count: n },
                Err(now) => t = now,
            }
        }
    }

    /// Fills reserved position `p` and makes it visible to the consumer.
    #[inline]
    pub(crate) fn publish(&self, p: u64, v: A::Plain) {
        let slot = self.slot(p);
        slot.words.store(v);
        slot.stamp.store(p + 1, Ordering::Release);
    }

    /// Pushes one entry; `false` when the ring is full.
    pub(crate) fn push(&self, v: A::Plain) -> bool {
        let r = self.reserve(1);
        if r.count == 0 {
            return false;
        }
        self.publish(r.first, v);
        true
    }

    /// The oldest entry, if one is published.
    #[inline]
    pub(crate) fn pop(&self) -> Option<A::Plain> {
        match self.consumers {
            Consumers::One => {
                let h = self.head.0.load(Ordering::Relaxed);
                if self.tail.0.load(Ordering::SeqCst) == h {
                    return None;
                }
                let slot = self.slot(h);
                if slot.stamp.load(Ordering::Acquire) != h + 1 {
                    // Reserved, not yet published.
                    return None;
                }
                let v = slot.words.load();
                // Release: the reads above are done before a producer
                // takes the slot for the next lap.
                slot.stamp
                    .store(h + self.slots.len() as u64, Ordering::Release);
                self.head.0.store(h + 1, Ordering::Relaxed);
                Some(v)
            }
            Consumers::Many => self.pop_shared(),
        }
    }

    fn pop_shared(&self) -> Option<A::Plain> {
        let mut h = self.head.0.load(Ordering::Relaxed);
        loop {
            if self.tail.0.load(Ordering::SeqCst) == h {
                return None;
            }
            let slot = self.slot(h);
            let s = slot.stamp.load(Ordering::Acquire);
            if s == h + 1 {
                match self.head.0.compare_exchange_weak(
                    h,
                    h + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let v = slot.words.load();
                        slot.stamp
                            .store(h + self.slots.len() as u64, Ordering::Release);
                        return Some(v);
                    }
                    Err(now) => h = now,
                }
            } else if s < h + 1 {
                // Reserved, not yet published.
                return None;
            } else {
                // Another consumer took `h`.
                h = self.head.0.load(Ordering::Relaxed);
            }
        }
    }

    /// Entries reserved and not yet taken.
    pub(crate) fn len(&self) -> usize {
        let t = self.tail.0.load(Ordering::SeqCst);
        let h = self.head.0.load(Ordering::Relaxed);
        t.saturating_sub(h).min(self.slots.len() as u64) as usize
    }

    /// Whether it holds none.
    pub(crate) fn is_empty(&self) -> bool {
        self.tail.0.load(Ordering::SeqCst) == self.head.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    type Two = [AtomicU64; 2];

    #[test]
    fn fifo_through_many_laps() {
        let r = Slots::<Two>::new(3, Consumers::One);
        assert_eq!(r.pop(), None);
        for lap in 0..10u64 {
            assert!(r.push([lap, 1]) && r.push([lap, 2]) && r.push([lap, 3]));
            assert!(!r.push([0, 0]), "full at three");
            assert_eq!(r.len(), 3);
            for k in 1..=3 {
                assert_eq!(r.pop(), Some([lap, k]));
            }
            assert!(r.is_empty() && r.pop().is_none());
        }
    }

    #[test]
    fn a_reservation_takes_what_is_free_and_publishes_in_any_order() {
        let r = Slots::<Two>::new(4, Consumers::One);
        assert!(r.push([9, 9]));
        let got = r.reserve(8);
        assert_eq!(got, Reserved { first: 1, count: 3 });
        assert_eq!(r.reserve(1).count, 0, "full");
        // The second of the run first: the head's entry is published, the
        // next is not, so taking stops there.
        r.publish(2, [2, 2]);
        assert_eq!(r.pop(), Some([9, 9]));
        assert_eq!(r.pop(), None, "position 1 reserved, not published");
        r.publish(1, [1, 1]);
        r.publish(3, [3, 3]);
        assert_eq!(
            (r.pop(), r.pop(), r.pop()),
            (Some([1, 1]), Some([2, 2]), Some([3, 3]))
        );
        assert_eq!(r.pop(), None);
    }

    fn producers_and_consumers(consumers: usize, mode: Consumers) {
        const EACH: u64 = 30_000;
        const PRODUCERS: u64 = 3;
        let r = Arc::new(Slots::<Two>::new(16, mode));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    let mut i = 0;
                    while i < EACH {
                        // Runs of one to five.
                        let want = (1 + i % 5).min(EACH - i) as usize;
                        let got = r.reserve(want);
                        for k in 0..got.count as u64 {
                            r.publish(got.first + k, [t, i + k]);
                        }
                        i += got.count as u64;
                        if got.count == 0 {
                            std::hint::spin_loop();
                        }
                    }
                })
            })
            .collect();
        let taken = Arc::new(AtomicU64::new(0));
        let takers: Vec<_> = (0..consumers)
            .map(|_| {
                let (r, taken) = (r.clone(), taken.clone());
                std::thread::spawn(move || {
                    let mut seen = Vec::new();
                    while taken.load(Ordering::Relaxed) < PRODUCERS * EACH {
                        match r.pop() {
                            Some(v) => {
                                taken.fetch_add(1, Ordering::Relaxed);
                                seen.push(v);
                            }
                            None => std::hint::spin_loop(),
                        }
                    }
                    seen
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        let mut all = Vec::new();
        for t in takers {
            let seen = t.join().unwrap();
            // Each consumer sees each producer's entries in order.
            let mut last = [None::<u64>; PRODUCERS as usize];
            for &[t, i] in &seen {
                let l = &mut last[t as usize];
                assert!(l.is_none_or(|l| l < i), "producer {t} out of order");
                *l = Some(i);
            }
            all.extend(seen);
        }
        all.sort();
        let want: Vec<[u64; 2]> = (0..PRODUCERS)
            .flat_map(|t| (0..EACH).map(move |i| [t, i]))
            .collect();
        assert_eq!(all, want, "every entry exactly once");
        assert!(r.is_empty());
    }

    #[test]
    fn producers_on_threads_lose_nothing_with_one_consumer() {
        producers_and_consumers(1, Consumers::One);
    }

    #[test]
    fn producers_on_threads_lose_nothing_with_several_consumers() {
        producers_and_consumers(3, Consumers::Many);
    }
}
