//! Storage a queue takes as it is first used, rather than when it is
//! made: a connection's and a queue pair's queues cost nothing while they
//! are only open (most of them, in a server holding thousands), and take
//! their bound once, so that a busy one never grows in its steady state.
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
}
