//! Records in flight: where each record a connection queues into TCP (an
//! FPDU or MPA frame bytes, [`FpduRecord`]) lives from the moment the QP
//! engine builds it until TCP reports it acknowledged or gives it up.
//!
//! TCP holds only a handle ([`RecordRef`], 8 bytes) in its send queue and
//! its events; the record itself (some 190 bytes: the engine's record with
//! its headers and pin, the region) is built straight into a slot here
//! ([`Records::build`], `Endpoint::poll_record_into`) and never moves
//! while it waits, is retransmitted and is reported. The transmit path
//! reads it in place through the handle; the acknowledgement hands it to
//! the engine in place ([`Records::release`]), and `poll_dropped` takes it
//! out once. Moving records between functions was a measurable part of
//! the small-message path. Slots are reused through a free list; the table
//! grows only when more records are in flight on the worker than ever
//! before, never in the steady state.

use rdmap::engine::OutRecord;
use tcp_offload::tcp::Record;

use super::tx::{FpduRecord, Sendable};
use crate::memory::MemoryTable;

/// TCP's handle on a record kept in the worker's table of records in
/// flight: its slot and length, and whether it must have a frame of its
/// own (not ride in a train).
#[derive(Debug, PartialEq, Eq)]
pub struct RecordRef {
    slot: u32,
    len: u32,
    solo: bool,
    last: bool,
}

impl Record for RecordRef {
    fn len(&self) -> usize {
        self.len as usize
    }

    fn joins_train(&self) -> bool {
        !self.solo
    }

    fn ends_message(&self) -> bool {
        self.last
    }
}

/// A slot [`Records::build`] filled, to [`Records::settle`].
#[must_use = "settle the slot: it holds the engine's record"]
#[derive(Debug)]
pub(super) struct Building(u32);

/// The worker's records in flight.
#[derive(Debug, Default)]
pub(super) struct Records {
    slots: Vec<Option<FpduRecord>>,
    free: Vec<u32>,
    /// A record whose payload has an odd length gets a frame of its own:
    /// the port's segmentation sums each piece of a chain as if it began
    /// at an even offset ([`crate::link::TsoCaps::even_pieces`]), and the
    /// payload is attached as a piece of its own.
    pub(super) odd_payload_solo: bool,
}

impl Records {
    /// Room for `n` records in flight before the table grows.
    pub(super) fn with_capacity(n: usize) -> Records {
        Records {
            slots: Vec::with_capacity(n),
            free: Vec::with_capacity(n),
            odd_payload_solo: false,
        }
    }

    /// Keeps `rec`; the handle TCP queues for it.
    #[cfg(test)]
    pub(super) fn insert(&mut self, rec: FpduRecord) -> RecordRef {
        let slot = self.vacant();
        self.slots[slot as usize] = Some(rec);
        self.handle(slot)
    }

    /// Builds a record straight into a free slot: `build` writes the
    /// engine's record into it (`Endpoint::poll_record_into`) and says
    /// whether it did. When it did, [`Records::settle`] finishes the slot;
    /// when not, the slot is free again.
    #[inline]
    pub(super) fn build(
        &mut self,
        build: impl FnOnce(&mut Option<OutRecord>) -> bool,
    ) -> Option<Building> {
        let slot = self.vacant();
        let entry = &mut self.slots[slot as usize];
        let held = entry.insert(FpduRecord::vacant());
        if build(held.engine_slot()) {
            return Some(Building(slot));
        }
        *entry = None;
        self.free.push(slot);
        None
    }

    /// Finishes the slot [`Records::build`] filled; the handle TCP
    /// queues for it.
    #[inline]
    pub(super) fn settle(&mut self, b: Building) -> RecordRef {
        if let Some(held) = self.slots[b.0 as usize].as_mut() {
            held.settle();
        }
        self.handle(b.0)
    }

    /// A free slot (its entry `None`), the table grown by one if none is.
    #[inline]
    fn vacant(&mut self) -> u32 {
        if let Some(slot) = self.free.pop() {
            return slot;
        }
        let slot = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        self.slots.push(None);
        // The free list can then hold every slot: returning one never
        // allocates.
        self.free
            .reserve(self.slots.len().saturating_sub(self.free.len()));
        slot
    }

    /// TCP's handle on the record in `slot`.
    #[inline]
    fn handle(&self, slot: u32) -> RecordRef {
        let rec = self.slots[slot as usize].as_ref();
        RecordRef {
            slot,
            len: rec.map_or(0, |r| u32::try_from(Record::len(r)).unwrap_or(u32::MAX)),
            solo: self.odd_payload_solo && rec.is_some_and(FpduRecord::odd_payload),
            last: rec.is_some_and(FpduRecord::ends_message),
        }
    }

    /// The record behind `r`, in place.
    pub(super) fn get(&self, r: &RecordRef) -> Option<&FpduRecord> {
        self.slots.get(r.slot as usize)?.as_ref()
    }

    /// The record behind `r` with its region from `mem`, to send.
    pub(super) fn sendable<'a>(
        &'a self,
        r: &RecordRef,
        mem: &'a MemoryTable,
    ) -> Option<Sendable<'a>> {
        self.get(r).map(|rec| Sendable::new(rec, mem))
    }

    /// Takes the record behind `r` out (TCP is done with it); its slot is
    /// free again.
    pub(super) fn remove(&mut self, r: RecordRef) -> Option<FpduRecord> {
        let rec = self.slots.get_mut(r.slot as usize)?.take()?;
        self.free.push(r.slot);
        Some(rec)
    }

    /// Hands the engine's record behind `r` to `f` where it lies (TCP is
    /// done with it: `f` gives its pin back), then empties its slot for
    /// reuse. Whether there was a record.
    #[inline]
    pub(super) fn release(&mut self, r: RecordRef, f: impl FnOnce(&mut OutRecord)) -> bool {
        let Some(slot) = self.slots.get_mut(r.slot as usize) else {
            return false;
        };
        let Some(held) = slot.as_mut() else {
            return false;
        };
        held.release_with(f);
        *slot = None;
        self.free.push(r.slot);
        true
    }

    /// Records in flight.
    pub(super) fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_the_table_grows_only_past_its_high_water() {
        let mut t = Records::with_capacity(2);
        let a = t.insert(FpduRecord::empty_for_test(100));
        let b = t.insert(FpduRecord::empty_for_test(200));
        assert_eq!((Record::len(&a), Record::len(&b)), (100, 200));
        assert_eq!(t.get(&b).map(Record::len), Some(200));
        assert_eq!(t.in_flight(), 2);
        let cap = (t.slots.capacity(), t.free.capacity());
        assert!(t.remove(a).is_some());
        let c = t.insert(FpduRecord::empty_for_test(300));
        assert_eq!(c.slot, 0, "the freed slot is reused");
        assert_eq!((t.slots.capacity(), t.free.capacity()), cap);
        assert!(t.remove(b).is_some());
        assert!(t.remove(c).is_some());
        assert_eq!(t.in_flight(), 0);
        // A handle taken out twice finds nothing the second time.
        let d = t.insert(FpduRecord::empty_for_test(1));
        assert!(d.joins_train());
        let again = RecordRef {
            slot: d.slot,
            len: d.len,
            solo: d.solo,
            last: d.last,
        };
        assert!(t.remove(d).is_some());
        assert!(t.remove(again).is_none());
    }

    #[test]
    fn a_released_record_frees_its_slot_once() {
        let mut t = Records::with_capacity(2);
        let a = t.insert(FpduRecord::empty_for_test(100));
        let b = t.insert(FpduRecord::empty_for_test(200));
        let slot = a.slot;
        let again = RecordRef {
            slot: a.slot,
            len: a.len,
            solo: a.solo,
            last: a.last,
        };
        assert!(t.release(a, |_| {}));
        assert_eq!(t.in_flight(), 1);
        assert!(!t.release(again, |_| {}), "a second release finds nothing");
        assert_eq!(t.in_flight(), 1);
        let c = t.insert(FpduRecord::empty_for_test(300));
        assert_eq!(c.slot, slot, "the released slot is reused");
        assert_eq!(t.get(&c).map(Record::len), Some(300));
        assert!(t.release(b, |_| {}) && t.release(c, |_| {}));
        assert_eq!(t.in_flight(), 0);
    }
}
