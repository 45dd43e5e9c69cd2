//! The control path's registry of queue pairs: every one the application
//! created and still holds, by number, for numbering new ones, the queue
//! pair limit, connection records and snapshots. Locked by control calls
//! only, never by a worker; each call costs a lookup, not a walk of every
//! queue pair, so that setting up ten thousand stays linear.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use rdmap::verbs::QpNum;

use crate::ctl::QpShared;

/// Queue pairs by number; entries whose queue pair is gone are forgotten
/// when the count of entries reaches the limit ([`QpRegistry::live_len`]).
#[derive(Debug, Default)]
pub(super) struct QpRegistry {
    by_qpn: BTreeMap<u32, Weak<QpShared>>,
}

impl QpRegistry {
    /// How many queue pairs are alive; forgets the others first.
    pub(super) fn live_len(&mut self) -> usize {
        self.by_qpn.retain(|_, w| w.strong_count() > 0);
        self.by_qpn.len()
    }

    /// Whether at least `limit` queue pairs are alive. Looks at each only
    /// when the entries (live or not) reach the limit.
    pub(super) fn full(&mut self, limit: usize) -> bool {
        self.by_qpn.len() >= limit && self.live_len() >= limit
    }

    /// Entries, alive or not yet forgotten.
    pub(super) fn len(&self) -> usize {
        self.by_qpn.len()
    }

    /// Whether number `n` belongs to a live queue pair.
    pub(super) fn in_use(&self, n: u32) -> bool {
        self.by_qpn.get(&n).is_some_and(|w| w.strong_count() > 0)
    }

    pub(super) fn insert(&mut self, q: &Arc<QpShared>) {
        self.by_qpn.insert(q.qpn.0, Arc::downgrade(q));
    }

    /// The live queue pair numbered `qpn`.
    pub(super) fn get(&self, qpn: QpNum) -> Option<Arc<QpShared>> {
        self.by_qpn.get(&qpn.0).and_then(Weak::upgrade)
    }

    /// Every live queue pair, in order of number (of creation, until the
    /// numbers wrap).
    pub(super) fn live(&self) -> Vec<Arc<QpShared>> {
        self.by_qpn.values().filter_map(Weak::upgrade).collect()
    }

    /// Whether a live queue pair satisfies `f`.
    pub(super) fn any(&self, mut f: impl FnMut(&QpShared) -> bool) -> bool {
        self.by_qpn
            .values()
            .any(|w| w.upgrade().is_some_and(|q| f(&q)))
    }
}
