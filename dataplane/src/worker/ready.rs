//! The ready list: which connections the connection stage of the loop
//! ([`super::Worker::poll`], step 5) services in an iteration. A
//! connection is marked when something gives it work: a received segment
//! or a TCP timer (the stack's touched slots), a post to its queue pair
//! (the posted ring of its worker's `IdleWake`), a control message, its
//! creation; and it stays marked while it has work of its own left
//! (a held or refused completion, a stashed work request, a setup timer,
//! budgets used up). Idle connections cost nothing per iteration. Sized
//! for every connection at bring-up: marking never allocates.

/// Connection slots (`ConnId::index`) to service: those marked since the
/// last iteration's service, each once.
#[derive(Debug)]
pub(super) struct ReadyList {
    /// Whether a slot is in `next`.
    marked: Vec<bool>,
    /// Marked for the coming service.
    next: Vec<u32>,
    /// Being serviced now (the previous `next`).
    now: Vec<u32>,
}

impl ReadyList {
    /// Room for `connections` slots.
    pub(super) fn new(connections: usize) -> ReadyList {
        ReadyList {
            marked: vec![false; connections],
            next: Vec::with_capacity(connections),
            now: Vec::with_capacity(connections),
        }
    }

    /// Makes room for slots below `slots` (at connection setup, when the
    /// stack hands out a slot beyond the configured count).
    pub(super) fn ensure(&mut self, slots: usize) {
        if self.marked.len() < slots {
            self.marked.resize(slots, false);
            self.next.reserve(slots - self.next.len());
            self.now.reserve(slots - self.now.len());
        }
    }

    /// Marks `slot` for the coming service (a slot never set up is
    /// ignored).
    pub(super) fn mark(&mut self, slot: u32) {
        if let Some(m) = self.marked.get_mut(slot as usize) {
            if !*m {
                *m = true;
                self.next.push(slot);
            }
        }
    }

    /// Marks every slot below `slots`.
    pub(super) fn mark_all(&mut self, slots: usize) {
        for i in 0..slots {
            self.mark(i as u32);
        }
    }

    /// Starts a service: takes the marked slots (given back with
    /// [`ReadyList::end`]); marks made meanwhile are for the next one.
    pub(super) fn begin(&mut self) -> Vec<u32> {
        core::mem::swap(&mut self.now, &mut self.next);
        for &i in &self.now {
            self.marked[i as usize] = false;
        }
        core::mem::take(&mut self.now)
    }

    /// Gives back the list [`ReadyList::begin`] took, emptied (its room is
    /// reused: no allocation per iteration).
    pub(super) fn end(&mut self, mut list: Vec<u32>) {
        list.clear();
        self.now = list;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_serviced_once_per_mark() {
        let mut r = ReadyList::new(4);
        r.mark(2);
        r.mark(2);
        r.mark(9); // never set up
        let now = r.begin();
        assert_eq!(now, [2]);
        r.mark(2); // during the service: for the next one
        r.end(now);
        let now = r.begin();
        assert_eq!(now, [2]);
        r.end(now);
        assert!(r.begin().is_empty());
    }
}
