//! The connections' setup deadlines: when each connection's engine next
//! wants `Endpoint::handle_timeout` (MPA's setup timer, and on the
//! initiator the nudge of a silent responder, which waits 200 ms after
//! the first FPDU; see `Conn::next_due`). The connection stage of the
//! loop ([`super::Worker::poll`], step 5) marks ready the connections
//! whose deadline has come, and only those are looked at: a min-heap of
//! (deadline, slot), each connection holding the deadline of its current
//! entry, stale entries dropped as they surface (as `tcp-offload`'s timer
//! heap does). A list of the connections with a deadline, walked on
//! every iteration, cost one cache miss per connection: with ten thousand
//! initiators in their nudge's wait it was most of the worker's time, and
//! their first messages crawled. Sized for every connection at bring-up:
//! arming never allocates.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tcp_offload::Instant;

/// The heap of (deadline, connection slot) entries.
#[derive(Debug)]
pub(super) struct Deadlines {
    heap: BinaryHeap<Reverse<(Instant, u32)>>,
    /// Connection slots: at most one current entry each.
    connections: usize,
}

impl Deadlines {
    /// Room for `connections` slots, each with a current entry and a stale
    /// one, and some.
    pub(super) fn new(connections: usize) -> Deadlines {
        Deadlines {
            heap: BinaryHeap::with_capacity(2 * connections + 64),
            connections,
        }
    }

    /// Arms slot `i` for `due`. `queued` is the connection's record of its
    /// current entry, a lower bound of its deadline: a deadline that moved
    /// later keeps the entry (found so when it surfaces), one that moved
    /// earlier gets a new entry.
    pub(super) fn arm(&mut self, i: u32, due: Instant, queued: &mut Option<Instant>) {
        if queued.is_some_and(|q| due >= q) {
            return;
        }
        *queued = Some(due);
        self.heap.push(Reverse((due, i)));
    }

    /// Makes room for an iteration's arming (at most one entry per
    /// connection) within the capacity sized at bring-up, by dropping the
    /// entries that are not their connection's current one (`current`).
    pub(super) fn make_room(&mut self, mut current: impl FnMut(Instant, u32) -> bool) {
        if self.heap.len() + self.connections > self.heap.capacity() {
            self.heap.retain(|&Reverse((t, i))| current(t, i));
        }
    }

    /// The earliest entry due at `now`, taken out, if any.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<(Instant, u32)> {
        let &Reverse((t, i)) = self.heap.peek()?;
        if t > now {
            return None;
        }
        self.heap.pop();
        Some((t, i))
    }

    /// Entries in the heap, current or stale.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn only_the_due_entries_come_out_earliest_first() {
        let mut d = Deadlines::new(4);
        let mut q = [None; 4];
        d.arm(0, at(30), &mut q[0]);
        d.arm(1, at(10), &mut q[1]);
        d.arm(2, at(20), &mut q[2]);
        assert_eq!(d.pop_due(at(5)), None);
        assert_eq!(d.pop_due(at(20)), Some((at(10), 1)));
        assert_eq!(d.pop_due(at(20)), Some((at(20), 2)));
        assert_eq!(d.pop_due(at(20)), None);
        assert_eq!(d.pop_due(at(100)), Some((at(30), 0)));
    }

    #[test]
    fn a_later_deadline_keeps_the_entry_and_an_earlier_one_adds_one() {
        let mut d = Deadlines::new(2);
        let mut q = None;
        d.arm(0, at(10), &mut q);
        d.arm(0, at(50), &mut q);
        assert_eq!((d.len(), q), (1, Some(at(10))));
        d.arm(0, at(5), &mut q);
        assert_eq!((d.len(), q), (2, Some(at(5))));
    }

    #[test]
    fn stale_entries_are_dropped_before_the_heap_would_grow() {
        let n = 8;
        let mut d = Deadlines::new(n);
        let cap = d.heap.capacity();
        let mut q = vec![None; n];
        // Every connection's deadline moves earlier again and again: each
        // move leaves a stale entry behind.
        for round in 0..100u64 {
            let current = |t: Instant, i: u32| q[i as usize] == Some(t);
            d.make_room(current);
            for (i, q) in q.iter_mut().enumerate() {
                d.arm(i as u32, at(10_000 - round), q);
            }
            assert_eq!(d.heap.capacity(), cap, "round {round}");
        }
        // What is left due comes out once per connection, at its last
        // deadline, after the stale ones are skipped as the caller does.
        let mut out = Vec::new();
        while let Some((t, i)) = d.pop_due(at(20_000)) {
            if q[i as usize] == Some(t) {
                q[i as usize] = None;
                out.push(i);
            }
        }
        out.sort_unstable();
        assert_eq!(out, (0..n as u32).collect::<Vec<_>>());
    }
}
