//! Storage a queue takes as it is first used, rather than when it is
//! made: a connection's and a queue pair's queues cost nothing while they
//! are only open (most of them, in a server holding thousands), and take
//! their bound once (or, for a queue that may never empty, room as it is
//! needed), so that a busy one never grows in its steady state.
//! Shared by the TCP engine, the rdmap verbs and the dataplane's worker.

use std::collections::VecDeque;

/// Entries [`room_for`] takes room for at a queue's first use.
pub const FIRST_ROOM: usize = 8;

/// Gives `q` room for all of its `n` entries the first time it is used,
/// once.
pub fn room_at_first_use<T>(q: &mut VecDeque<T>, n: usize) {
    if q.capacity() == 0 {
        q.reserve_exact(n);
    }
}

/// Makes room in `q`, which never holds more than `n` entries, for one
/// more. At its first use it takes room for a few ([`FIRST_ROOM`]); the
/// first time those are not enough, room for all `n` at once. For queues
/// a connection uses from its first exchange (TCP's, during the MPA
/// setup): they cost little while it is only open and take their whole
/// bound, once in the connection's life, when it first gets busy.
///
/// A queue is a ring whose entries slide around all of its room: one that
/// holds a few dozen entries in room for thousands would touch (fault in,
/// and keep in the cache) all of that room in turn. An empty queue starts
/// again at the beginning of its room, so that a connection whose queue
/// drains between bursts (most of them, with thousands) keeps using the
/// same few pages.
pub fn room_for<T>(q: &mut VecDeque<T>, n: usize) {
    if q.is_empty() {
        // Resets the ring's start; allocates and frees nothing.
        q.clear();
    }
    if q.len() == q.capacity() && q.len() < n {
        let want = if q.capacity() < FIRST_ROOM {
            FIRST_ROOM.min(n)
        } else {
            n
        };
        q.reserve_exact(want - q.len());
    }
}

/// Makes room in `q`, which never holds more than `n` entries, for one
/// more, taking room as it is needed: a few ([`FIRST_ROOM`]) at its first
/// use, then twice as much each time that is not enough, up to `n`. For a
/// queue that may never empty while its connection is busy, so that
/// [`room_for`]'s restart at the beginning never comes: a ring in room for
/// its whole bound would slide through all of it, and TCP's send queue,
/// sized for a receive window of records, did so on every busy
/// connection. With 10,000 of them, the first touches of those pages were
/// a fifth of the sending thread's time. In room no larger than it has
/// needed, it keeps going round the same pages. It grows while the
/// connection's traffic first reaches its working size, never after.
pub fn room_as_needed<T>(q: &mut VecDeque<T>, n: usize) {
    if q.is_empty() {
        q.clear();
    }
    if q.len() == q.capacity() && q.len() < n {
        let want = (q.capacity() * 2).max(FIRST_ROOM).min(n);
        q.reserve_exact(want - q.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_queue_restarts_at_the_beginning_of_its_room() {
        let mut q: VecDeque<u64> = VecDeque::new();
        room_for(&mut q, 100);
        q.push_back(0);
        let start: *const u64 = &q[0];
        for k in 1..1000u64 {
            q.pop_front();
            room_for(&mut q, 100);
            q.push_back(k);
            assert!(core::ptr::eq(&q[0], start), "entry {k} moved on");
        }
    }

    #[test]
    fn room_for_a_few_then_for_all() {
        let mut q: VecDeque<u64> = VecDeque::new();
        room_for(&mut q, 100);
        assert_eq!(q.capacity(), FIRST_ROOM);
        for k in 0..100 {
            room_for(&mut q, 100);
            q.push_back(k);
        }
        assert_eq!(q.capacity(), 100);
    }

    #[test]
    fn room_as_needed_doubles_up_to_the_bound_and_then_holds() {
        let mut q: VecDeque<u64> = VecDeque::new();
        let mut seen = vec![];
        for k in 0..100 {
            room_as_needed(&mut q, 100);
            q.push_back(k);
            if seen.last() != Some(&q.capacity()) {
                seen.push(q.capacity());
            }
        }
        assert_eq!(seen, [FIRST_ROOM, 16, 32, 64, 100]);
        // A busy queue that never empties keeps going round its room.
        for k in 0..10_000 {
            q.pop_front();
            room_as_needed(&mut q, 100);
            q.push_back(k);
        }
        assert_eq!(q.capacity(), 100);
        let mut small: VecDeque<u64> = VecDeque::new();
        for k in 0..3 {
            room_as_needed(&mut small, 3);
            small.push_back(k);
        }
        assert_eq!(small.capacity(), 3, "never more than the bound");
    }
}
