//! A ring of mbufs between threads (`rte_ring`, multi-producer and
//! multi-consumer): the software dispatcher's path from the worker whose
//! queue received a segment to the worker that owns its connection, where
//! the device cannot steer.

use std::ffi::CString;
use std::ptr::NonNull;

use crate::eal::Eal;
use crate::error::DpdkError;
use crate::mbuf::MbufBurst;
use crate::sys;

/// A bounded lock-free ring of owned mbufs; mbufs left in it are freed on
/// drop.
#[derive(Debug)]
pub struct MbufRing {
    ring: NonNull<sys::rte_ring>,
    _eal: Eal,
}

// SAFETY: a multi-producer/multi-consumer rte_ring may be used from any
// thread; the handle owns the ring.
unsafe impl Send for MbufRing {}
// SAFETY: as above: enqueue and dequeue are safe concurrently.
unsafe impl Sync for MbufRing {}

impl MbufRing {
    /// A ring with room for `count - 1` mbufs (`count` a power of two).
    pub fn new(eal: &Eal, name: &str, count: u32) -> Result<MbufRing, DpdkError> {
        let op = "rte_ring_create";
        let cname = CString::new(name)
            .map_err(|_| DpdkError::with_message(op, libc::EINVAL, "name has a NUL"))?;
        // SAFETY: EAL is running; flags 0 make it MP/MC; DPDK copies the name.
        let r = unsafe { sys::rte_ring_create(cname.as_ptr(), count, -1, 0) };
        let ring = NonNull::new(r).ok_or_else(|| DpdkError::from_rte_errno(op))?;
        Ok(MbufRing {
            ring,
            _eal: eal.clone(),
        })
    }

    /// Moves as many of `burst`'s mbufs as fit, from the front, into the
    /// ring; returns how many. The rest stay in `burst`, in order.
    #[inline]
    pub fn enqueue_burst(&self, burst: &mut MbufBurst) -> usize {
        let len = burst.len();
        if len == 0 {
            return 0;
        }
        // SAFETY: the first `len` slots hold owned mbufs; the ring takes the
        // first `n` of them.
        let n = unsafe {
            sys::shim_ring_enqueue_burst(self.ring.as_ptr(), burst.as_mut_ptr().cast(), len as u32)
        };
        let n = (n as usize).min(len);
        // SAFETY: the ring owns the first `n` mbufs now.
        unsafe { burst.consume_front(n) };
        n
    }

    /// Takes up to `out`'s spare room from the ring, appending; returns how
    /// many.
    #[inline]
    pub fn dequeue_burst(&self, out: &mut MbufBurst) -> usize {
        let spare = out.spare();
        if spare == 0 {
            return 0;
        }
        // SAFETY: `out` has `spare` empty slots; everything in the ring is
        // an owned mbuf put there by `enqueue_burst`.
        let n = unsafe {
            sys::shim_ring_dequeue_burst(self.ring.as_ptr(), out.spare_ptr().cast(), spare as u32)
        };
        let n = (n as usize).min(spare);
        // SAFETY: the ring wrote `n` owned mbufs into the spare slots.
        unsafe { out.commit(n) };
        n
    }

    /// Mbufs in the ring now.
    pub fn len(&self) -> usize {
        // SAFETY: the ring is valid.
        unsafe { sys::shim_ring_count(self.ring.as_ptr()) as usize }
    }

    /// Whether the ring is empty now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for MbufRing {
    fn drop(&mut self) {
        let mut burst = MbufBurst::new();
        while self.dequeue_burst(&mut burst) > 0 {
            burst.clear();
        }
        // SAFETY: the handle owned the ring and it is empty; nothing else
        // refers to it.
        unsafe { sys::rte_ring_free(self.ring.as_ptr()) };
    }
}
