//! Packet-buffer pools (`rte_pktmbuf_pool_create`): where every RX mbuf and
//! every TX header mbuf comes from. Allocation from an EAL lcore goes through
//! that lcore's cache; from any other thread it hits the shared ring.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::eal::Eal;
use crate::error::DpdkError;
use crate::mbuf::{Mbuf, MbufBurst, BURST};
use crate::sys;

/// A pktmbuf pool. Clones share the pool; it is freed when the last clone
/// goes, unless mbufs from it are still out (in a queue, a ring, a burst),
/// in which case it is leaked together with EAL rather than freed under them.
///
/// The one exception is mbufs a closed port's driver took and can never give
/// back (net_af_xdp's fill ring; the port credits them when it closes, see
/// [`Mempool::orphaned_count`]): they count as out, but nothing can reach
/// them any more, so they do not keep the pool.
#[derive(Clone, Debug)]
pub struct Mempool {
    inner: Arc<MempoolInner>,
}

#[derive(Debug)]
struct MempoolInner {
    ptr: NonNull<sys::rte_mempool>,
    /// Mbufs counted in use that a closed device held when it closed and
    /// dropped without returning: no code and no device can touch them
    /// again. A lower bound on such mbufs, never more.
    orphaned: AtomicU32,
    eal: Option<Eal>,
}

// SAFETY: rte_mempool operations are thread-safe (multi-producer and
// multi-consumer by default); the pointer is owned by this handle.
unsafe impl Send for MempoolInner {}
// SAFETY: as above; `&self` methods only alloc, free and read counters.
unsafe impl Sync for MempoolInner {}

impl Mempool {
    /// Creates a pool of `n` mbufs with `data_room` bytes each (headroom
    /// included: `RTE_MBUF_DEFAULT_BUF_SIZE` gives 2048 bytes of data after
    /// 128 of headroom), a per-lcore cache of `cache_size`, on `socket_id`
    /// (`-1` for any). `n` is best a power of two minus one.
    pub fn new(
        eal: &Eal,
        name: &str,
        n: u32,
        cache_size: u32,
        data_room: u16,
        socket_id: i32,
    ) -> Result<Mempool, DpdkError> {
        Mempool::with_ops(eal, name, n, cache_size, data_room, socket_id, None)
    }

    /// [`Mempool::new`] with the pool's backing store named: `"stack"`
    /// hands out the mbufs freed last first, so that buffers come back
    /// while their lines are still in cache; DPDK's default (`"ring_mp_mc"`)
    /// cycles through the whole pool. `None` takes the default. A name no
    /// loaded driver provides fails (`ENOENT`, or `EINVAL` in some
    /// releases).
    pub fn with_ops(
        eal: &Eal,
        name: &str,
        n: u32,
        cache_size: u32,
        data_room: u16,
        socket_id: i32,
        ops: Option<&str>,
    ) -> Result<Mempool, DpdkError> {
        let what = "rte_pktmbuf_pool_create";
        let cname = CString::new(name)
            .map_err(|_| DpdkError::with_message(what, libc::EINVAL, "name has a NUL"))?;
        let cops = ops
            .map(CString::new)
            .transpose()
            .map_err(|_| DpdkError::with_message(what, libc::EINVAL, "ops name has a NUL"))?;
        let ptr = match &cops {
            // SAFETY: EAL is running (`eal`); the names are copied by DPDK.
            Some(o) => unsafe {
                sys::rte_pktmbuf_pool_create_by_ops(
                    cname.as_ptr(),
                    n,
                    cache_size,
                    0,
                    data_room,
                    socket_id,
                    o.as_ptr(),
                )
            },
            // SAFETY: as above.
            None => unsafe {
                sys::rte_pktmbuf_pool_create(cname.as_ptr(), n, cache_size, 0, data_room, socket_id)
            },
        };
        let ptr = NonNull::new(ptr).ok_or_else(|| DpdkError::from_rte_errno(what))?;
        Ok(Mempool {
            inner: Arc::new(MempoolInner {
                ptr,
                orphaned: AtomicU32::new(0),
                eal: Some(eal.clone()),
            }),
        })
    }

    /// One mbuf, reset and empty; `None` when the pool is exhausted.
    #[inline]
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: the pool is alive; DPDK returns NULL or an owned mbuf.
        let m = unsafe { sys::shim_pktmbuf_alloc(self.as_ptr()) };
        // SAFETY: a non-null result is a fresh mbuf that nothing else owns.
        NonNull::new(m).map(|m| unsafe { Mbuf::from_raw(m) })
    }

    /// Fills `burst` up to `n` mbufs (at most [`BURST`]) in one call; all or
    /// nothing. Returns whether it allocated.
    pub fn alloc_bulk(&self, burst: &mut MbufBurst, n: usize) -> bool {
        let want = n.min(BURST).saturating_sub(burst.len());
        if want == 0 {
            return true;
        }
        let spare = burst.spare_ptr();
        // SAFETY: `spare` points at `BURST - len >= want` empty slots, which
        // DPDK fills with owned mbufs on success and leaves alone on failure.
        let ret = unsafe { sys::shim_pktmbuf_alloc_bulk(self.as_ptr(), spare, want as u32) };
        if ret != 0 {
            return false;
        }
        // SAFETY: DPDK wrote `want` valid mbufs into the spare slots.
        unsafe { burst.commit(want) };
        true
    }

    /// The driver behind the pool: `"ring_mp_mc"` by default, `"stack"`
    /// for a LIFO pool ([`Mempool::with_ops`]).
    pub fn ops_name(&self) -> String {
        // SAFETY: the pool is alive; its ops entry names a driver with a
        // static NUL-terminated string.
        let name = unsafe { sys::shim_mempool_ops_name(self.as_ptr()) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-null and NUL-terminated, as above.
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// Mbufs currently in the pool (caches included).
    pub fn avail_count(&self) -> u32 {
        // SAFETY: the pool is alive.
        unsafe { sys::rte_mempool_avail_count(self.as_ptr()) }
    }

    /// Mbufs currently out of the pool.
    pub fn in_use_count(&self) -> u32 {
        // SAFETY: the pool is alive.
        unsafe { sys::rte_mempool_in_use_count(self.as_ptr()) }
    }

    /// The pool's size in mbufs.
    pub fn size(&self) -> u32 {
        // SAFETY: the pool is alive; `size` is set at creation.
        unsafe { (*self.as_ptr()).size }
    }

    /// Bytes of buffer per mbuf, headroom included.
    pub fn data_room(&self) -> u16 {
        // SAFETY: the pool is alive and is a pktmbuf pool.
        unsafe { sys::shim_pktmbuf_data_room_size(self.as_ptr()) }
    }

    /// Mbufs credited as orphaned by closed ports so far.
    pub fn orphaned_count(&self) -> u32 {
        self.inner.orphaned.load(Ordering::Acquire)
    }

    /// Records that `n` mbufs counted in use were held by a device that is
    /// now closed and dropped them without returning them to the pool, so
    /// that they no longer stop the pool from being freed.
    ///
    /// Only for a count known to be at most what the closed device really
    /// abandoned: the pool is freed once its in-use count is no more than
    /// the credited total, so an overstated credit would free it under an
    /// mbuf still in use.
    pub(crate) fn credit_orphaned(&self, n: u32) {
        self.inner.orphaned.fetch_add(n, Ordering::AcqRel);
    }

    /// The raw pool, for DPDK calls that take one (queue setup).
    pub fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.inner.ptr.as_ptr()
    }
}

impl Drop for MempoolInner {
    fn drop(&mut self) {
        // SAFETY: the pool is alive until rte_mempool_free below.
        let in_use = unsafe { sys::rte_mempool_in_use_count(self.ptr.as_ptr()) };
        // Orphaned mbufs are out for good but unreachable (their device is
        // closed); being a lower bound, `in_use <= orphaned` means every
        // mbuf out is one of them, and none is held by anyone.
        if in_use <= *self.orphaned.get_mut() {
            // SAFETY: no mbuf of the pool is outstanding except those a
            // closed device abandoned, and no handle is left, so nothing can
            // touch it again.
            unsafe { sys::rte_mempool_free(self.ptr.as_ptr()) };
        } else {
            // An mbuf still out would point into freed memory: keep the pool,
            // and EAL under it, for the rest of the process.
            std::mem::forget(self.eal.take());
        }
    }
}
