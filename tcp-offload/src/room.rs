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
pub fn room_for<T>(q: &mut VecDeque<T>, n: usize) {
    if q.len() == q.capacity() && q.len() < n {
        let want = if q.capacity() < FIRST_ROOM {
            FIRST_ROOM.min(n)
        } else {
            n
        };
        q.reserve_exact(want - q.len());
    }
}
