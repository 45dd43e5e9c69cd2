//! Protection domains: the grouping that decides which queue pairs may use
//! which memory regions.
//!
//! An STag is usable by a queue pair only if both belong to the same
//! protection domain; a tagged access through an STag of another domain is
//! the "STag not associated with RDMAP Stream" Terminate error of RFC 5040
//! (DDP's "STag not associated with DDP Stream", RFC 5041). The
//! domain itself is just an id with a count of the objects that use it, so
//! that it cannot be freed under them (`ibv_dealloc_pd` fails with EBUSY).

use super::VerbsError;

/// A protection domain, as returned by [`Device::alloc_pd`](super::Device::alloc_pd).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

#[derive(Clone, Copy, Debug, Default)]
struct PdSlot {
    live: bool,
    /// Queue pairs and shared receive queues created in the domain (memory
    /// regions are counted by the MR table itself).
    users: u32,
}

/// The bounded table of protection domains.
#[derive(Debug)]
pub struct PdTable {
    slots: Vec<PdSlot>,
}

impl PdTable {
    /// Room for `capacity` domains, allocated now.
    pub fn new(capacity: u32) -> PdTable {
        PdTable {
            slots: vec![PdSlot::default(); capacity as usize],
        }
    }

    /// Allocates a domain (`ibv_alloc_pd`). Ids start at 1.
    pub fn alloc_pd(&mut self) -> Result<PdId, VerbsError> {
        let index = self
            .slots
            .iter()
            .position(|s| !s.live)
            .ok_or(VerbsError::TableFull)?;
        self.slots[index] = PdSlot {
            live: true,
            users: 0,
        };
        Ok(PdId(index as u32 + 1))
    }

    /// Frees a domain that no queue pair or SRQ uses any more. Memory
    /// regions are checked by the caller ([`super::Device::dealloc_pd`]).
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        let slot = self.slot_mut(pd)?;
        if slot.users > 0 {
            return Err(VerbsError::Busy);
        }
        slot.live = false;
        Ok(())
    }

    /// Whether `pd` is allocated.
    pub fn is_live(&self, pd: PdId) -> bool {
        self.slot(pd).is_some()
    }

    /// Counts one more object in `pd`.
    pub(crate) fn acquire(&mut self, pd: PdId) -> Result<(), VerbsError> {
        let slot = self.slot_mut(pd)?;
        slot.users += 1;
        Ok(())
    }

    /// Counts one object fewer in `pd`.
    pub(crate) fn release(&mut self, pd: PdId) {
        if let Ok(slot) = self.slot_mut(pd) {
            slot.users = slot.users.saturating_sub(1);
        }
    }

    fn slot(&self, pd: PdId) -> Option<&PdSlot> {
        let index = pd.0.checked_sub(1)? as usize;
        self.slots.get(index).filter(|s| s.live)
    }

    fn slot_mut(&mut self, pd: PdId) -> Result<&mut PdSlot, VerbsError> {
        let index = pd.0.checked_sub(1).ok_or(VerbsError::InvalidPd)? as usize;
        self.slots
            .get_mut(index)
            .filter(|s| s.live)
            .ok_or(VerbsError::InvalidPd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_dealloc_and_busy() {
        let mut t = PdTable::new(2);
        let a = t.alloc_pd().unwrap();
        let b = t.alloc_pd().unwrap();
        assert_ne!(a, b);
        assert_eq!(t.alloc_pd(), Err(VerbsError::TableFull));
        t.acquire(a).unwrap();
        assert_eq!(t.dealloc_pd(a), Err(VerbsError::Busy));
        t.release(a);
        t.dealloc_pd(a).unwrap();
        assert!(!t.is_live(a));
        assert_eq!(t.dealloc_pd(a), Err(VerbsError::InvalidPd));
        assert_eq!(t.acquire(PdId(0)), Err(VerbsError::InvalidPd));
        assert_eq!(t.alloc_pd(), Ok(a));
    }
}
