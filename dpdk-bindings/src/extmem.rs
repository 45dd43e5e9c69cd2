//! Zero-copy TX from application memory: registering it with DPDK
//! ([`ExtMem`]) and accounting for the mbufs that point into it
//! ([`ExtBufPool`], [`ExtBuf`]).
//!
//! The transmit path attaches payload from a registered region to an mbuf as
//! an external buffer, and must not let the application reuse (or deregister)
//! that region until both TCP has the bytes acknowledged and the driver has
//! freed the mbuf. The second half is what an [`ExtBuf`] slot observes: DPDK
//! calls its free callback when the last mbuf referring to it is freed.
//!
//! The shared info DPDK keeps per external buffer (`rte_mbuf_ext_shared_info`)
//! lives in the pool's own array, never in the user memory (DPDK's helper
//! would carve it from the buffer's tail). External buffers must be
//! IOVA-contiguous: hugepage-backed regions are, within a page; elsewhere
//! [`ExtMem::iova`] refuses ranges that cross a page whose IOVA does not
//! follow on, and callers split there. With IOVA-as-VA (every `--no-huge`
//! run) everything is contiguous.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::eal::Eal;
use crate::error::DpdkError;
use crate::port::Port;
use crate::sys;

/// Application memory registered with DPDK as external memory, with its
/// per-page IOVAs, and mapped for DMA on the ports that need it.
/// Unmapped and unregistered on drop: drop it only once every attachment
/// from it is released, or a device may still be reading it.
///
/// IOVA mode matters: `--no-huge` (and VFIO) give IOVA-as-VA, where any
/// range is contiguous. EAL on hugepages as root without VFIO picks
/// IOVA-as-PA, where ordinary 4 KiB pages are contiguous only within a page;
/// there use hugepage-backed memory, or `--iova-mode=va` when every port is
/// a virtual device.
#[derive(Debug)]
pub struct ExtMem {
    addr: NonNull<u8>,
    len: usize,
    page_size: usize,
    iovas: Box<[u64]>,
    /// Ports (id, device) the region was DMA-mapped for, to unmap on drop.
    mapped: Vec<(u16, NonNull<sys::rte_device>)>,
    _eal: Eal,
}

// SAFETY: the handle only records addresses; DPDK's registration calls are
// thread-safe.
unsafe impl Send for ExtMem {}
// SAFETY: `&self` methods only read the recorded addresses.
unsafe impl Sync for ExtMem {}

impl ExtMem {
    /// Registers `len` bytes at `addr` with DPDK (`rte_extmem_register`),
    /// computing each page's IOVA: the address itself when EAL runs with
    /// IOVA-as-VA, the physical address otherwise.
    ///
    /// # Safety
    /// - `addr` and `len` must be multiples of `page_size` (a power of two,
    ///   the size of the pages backing the memory), and the memory must stay
    ///   allocated until the `ExtMem` is dropped.
    /// - With IOVA-as-PA, the pages must be pinned (hugepages, or `mlock`ed)
    ///   so that their physical addresses do not change.
    pub unsafe fn register(
        eal: &Eal,
        addr: NonNull<u8>,
        len: usize,
        page_size: usize,
    ) -> Result<ExtMem, DpdkError> {
        let op = "rte_extmem_register";
        if page_size == 0
            || !page_size.is_power_of_two()
            || len == 0
            || len % page_size != 0
            || addr.as_ptr() as usize % page_size != 0
        {
            return Err(DpdkError::with_message(
                op,
                libc::EINVAL,
                "address and length must be non-zero multiples of a power-of-two page size",
            ));
        }
        let pages = len / page_size;
        let va = eal.iova_is_va();
        let mut iovas = Vec::with_capacity(pages);
        for i in 0..pages {
            let page = addr.as_ptr().wrapping_add(i * page_size);
            let iova = if va {
                page as u64
            } else {
                // SAFETY: `page` lies in the caller's allocation; DPDK reads
                // /proc/self/pagemap for it.
                unsafe { sys::rte_mem_virt2phy(page.cast()) }
            };
            if iova == u64::MAX {
                return Err(DpdkError::with_message(
                    op,
                    libc::EFAULT,
                    "no physical address for a page (not resident, or not root)",
                ));
            }
            iovas.push(iova);
        }
        let n_pages = u32::try_from(pages)
            .map_err(|_| DpdkError::with_message(op, libc::E2BIG, "too many pages"))?;
        // SAFETY: the caller vouches for the range; `iovas` has one entry
        // per page, which DPDK copies.
        let ret = unsafe {
            sys::rte_extmem_register(
                addr.as_ptr().cast(),
                len,
                iovas.as_mut_ptr(),
                n_pages,
                page_size,
            )
        };
        if ret < 0 {
            return Err(DpdkError::from_rte_errno(op));
        }
        Ok(ExtMem {
            addr,
            len,
            page_size,
            iovas: iovas.into_boxed_slice(),
            mapped: Vec::new(),
            _eal: eal.clone(),
        })
    }

    /// The registered range's start.
    pub fn addr(&self) -> NonNull<u8> {
        self.addr
    }

    /// The registered range's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty (never, once registered).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The page size the range was registered with.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The IOVA of `len` bytes at `ptr`, if they lie in this region and are
    /// IOVA-contiguous (every page after the first follows on from the one
    /// before); `None` otherwise, and the caller splits at a page boundary.
    pub fn iova(&self, ptr: *const u8, len: usize) -> Option<u64> {
        let start = (ptr as usize).checked_sub(self.addr.as_ptr() as usize)?;
        let end = start.checked_add(len)?;
        if end > self.len {
            return None;
        }
        let first = start / self.page_size;
        let last = if len == 0 {
            first
        } else {
            (end - 1) / self.page_size
        };
        for p in first..last {
            if self.iovas[p + 1] != self.iovas[p].wrapping_add(self.page_size as u64) {
                return None;
            }
        }
        Some(self.iovas[first] + (start % self.page_size) as u64)
    }

    /// Maps the region for DMA by `port`'s device (`rte_dev_dma_map`), as a
    /// device behind VFIO needs; unmapped on drop. Returns `Ok(false)` where
    /// the bus has no such operation (`ENOTSUP`). The vdev bus accepts the
    /// call and does nothing for drivers without a mapping of their own
    /// (every virtual device here, which read memory by its virtual address):
    /// there the registration alone suffices, as it does without an IOMMU.
    pub fn dma_map(&mut self, port: &Port) -> Result<bool, DpdkError> {
        let Some(dev) = port.device() else {
            return Ok(false);
        };
        if self.mapped.iter().any(|&(_, d)| d == dev) {
            return Ok(true);
        }
        // SAFETY: the region is registered as external memory, as
        // rte_dev_dma_map requires, and `dev` is the port's live device.
        let ret = unsafe {
            sys::rte_dev_dma_map(
                dev.as_ptr(),
                self.addr.as_ptr().cast(),
                self.iovas[0],
                self.len,
            )
        };
        if ret == 0 {
            self.mapped.push((port.id(), dev));
            return Ok(true);
        }
        // SAFETY: reads this thread's rte_errno, set by the failed call.
        let errno = unsafe { sys::shim_rte_errno() };
        if errno == libc::ENOTSUP {
            Ok(false)
        } else {
            Err(DpdkError::new("rte_dev_dma_map", errno))
        }
    }
}

impl Drop for ExtMem {
    fn drop(&mut self) {
        for (port, dev) in std::mem::take(&mut self.mapped) {
            // A port closed since (its device possibly freed) took its
            // mappings with it: unmap only from the device still behind it.
            if crate::port::device_of(port) != Some(dev) {
                continue;
            }
            // SAFETY: `dev` is the live device of `port`, for which `dma_map`
            // mapped exactly this range.
            unsafe {
                sys::rte_dev_dma_unmap(
                    dev.as_ptr(),
                    self.addr.as_ptr().cast(),
                    self.iovas[0],
                    self.len,
                )
            };
        }
        // SAFETY: registered by `register`; EAL is alive (`_eal`).
        unsafe { sys::rte_extmem_unregister(self.addr.as_ptr().cast(), self.len) };
    }
}

/// One slot: DPDK's shared info for an external buffer, and its accounting.
struct Slot {
    /// Written by DPDK (refcnt) from whichever thread frees the mbuf.
    shinfo: UnsafeCell<sys::rte_mbuf_ext_shared_info>,
    /// 1 while an [`ExtBuf`] handle holds the slot, plus 1 while an mbuf is
    /// attached; the slot is free for `acquire` at 0.
    holders: AtomicUsize,
    /// Times the last attached mbuf was freed.
    releases: AtomicU64,
    /// The pool the slot lives in, whose strong count an attachment holds.
    pool: *const PoolInner,
}

struct PoolInner {
    slots: Box<[Slot]>,
    /// Where `acquire` starts looking, so that a busy slot is not rescanned
    /// first every time.
    cursor: AtomicUsize,
    released_total: AtomicU64,
}

// SAFETY: the shared infos are touched by DPDK only through atomics (refcnt)
// or while the slot is exclusively held (arming); the rest is atomic.
unsafe impl Send for PoolInner {}
// SAFETY: as above.
unsafe impl Sync for PoolInner {}

/// Shared-info slots for external buffers, allocated once, apart from any
/// user memory. Each in-flight attachment takes one [`ExtBuf`] slot; the pool
/// stays alive until its last slot is released, even if every handle is gone.
#[derive(Clone)]
pub struct ExtBufPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for ExtBufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtBufPool")
            .field("slots", &self.inner.slots.len())
            .field("released_total", &self.released_total())
            .finish()
    }
}

impl ExtBufPool {
    /// A pool of `n` slots: one per external attachment that may be in
    /// flight at once.
    pub fn new(n: usize) -> ExtBufPool {
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<PoolInner>| {
            let pool = weak.as_ptr();
            let slots = (0..n)
                .map(|_| Slot {
                    shinfo: UnsafeCell::new(sys::rte_mbuf_ext_shared_info {
                        free_cb: Some(ext_free_cb),
                        fcb_opaque: std::ptr::null_mut(),
                        refcnt: 0,
                    }),
                    holders: AtomicUsize::new(0),
                    releases: AtomicU64::new(0),
                    pool,
                })
                .collect();
            PoolInner {
                slots,
                cursor: AtomicUsize::new(0),
                released_total: AtomicU64::new(0),
            }
        });
        for slot in inner.slots.iter() {
            let opaque = std::ptr::from_ref(slot).cast_mut().cast::<c_void>();
            // SAFETY: no attachment exists yet, so nothing else reads the
            // shared info; the slot's address is stable inside the Arc.
            unsafe { (*slot.shinfo.get()).fcb_opaque = opaque };
        }
        ExtBufPool { inner }
    }

    /// A free slot, or `None` if every slot is held or in flight.
    pub fn acquire(&self) -> Option<ExtBuf> {
        let slots = &self.inner.slots;
        let n = slots.len();
        let start = self.inner.cursor.load(Ordering::Relaxed);
        for k in 0..n {
            let i = (start + k) % n;
            if slots[i]
                .holders
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                self.inner.cursor.store((i + 1) % n, Ordering::Relaxed);
                return Some(ExtBuf {
                    pool: self.clone(),
                    index: i,
                });
            }
        }
        None
    }

    /// Slots in the pool.
    pub fn capacity(&self) -> usize {
        self.inner.slots.len()
    }

    /// Releases counted over all slots since the pool was made.
    pub fn released_total(&self) -> u64 {
        self.inner.released_total.load(Ordering::Acquire)
    }
}

/// A held shared-info slot: attach it to one mbuf at a time with
/// [`crate::Mbuf::attach_extbuf`], and watch for the driver's release.
pub struct ExtBuf {
    pool: ExtBufPool,
    index: usize,
}

impl std::fmt::Debug for ExtBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtBuf")
            .field("index", &self.index)
            .field("in_flight", &self.is_in_flight())
            .field("releases", &self.releases())
            .finish()
    }
}

impl ExtBuf {
    fn slot(&self) -> &Slot {
        &self.pool.inner.slots[self.index]
    }

    fn refcnt(&self) -> &AtomicU16 {
        // SAFETY: the refcnt field is valid for the pool's lifetime, aligned
        // for u16, and every access to it (DPDK's included) is atomic.
        unsafe { AtomicU16::from_ptr(std::ptr::addr_of_mut!((*self.slot().shinfo.get()).refcnt)) }
    }

    /// The slot's position in its pool.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether an mbuf attached through this slot is still alive (queued,
    /// in the driver, or received and held).
    pub fn is_in_flight(&self) -> bool {
        // The handle holds 1 and an attachment 1 more. Reading the count the
        // free callback releases (rather than DPDK's refcnt, which DPDK may
        // store with relaxed ordering) orders the caller after the driver's
        // last use of the memory.
        self.slot().holders.load(Ordering::Acquire) > 1
    }

    /// How many times the mbufs attached through this slot were released.
    pub fn releases(&self) -> u64 {
        self.slot().releases.load(Ordering::Acquire)
    }

    /// The shared info to hand to `rte_pktmbuf_attach_extbuf`.
    pub(crate) fn shinfo_ptr(&self) -> *mut sys::rte_mbuf_ext_shared_info {
        self.slot().shinfo.get()
    }

    /// Claims the slot for one attachment: refcnt 0 → 1, the slot held and
    /// the pool kept alive until the free callback. False if in flight.
    pub(crate) fn try_arm(&self) -> bool {
        if self
            .refcnt()
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.slot().holders.fetch_add(1, Ordering::AcqRel);
        // SAFETY: the pointer came from the live Arc `self.pool.inner`; the
        // extra count is given back by `ext_free_cb`.
        unsafe { Arc::increment_strong_count(Arc::as_ptr(&self.pool.inner)) };
        true
    }
}

impl Drop for ExtBuf {
    fn drop(&mut self) {
        // An attachment still in flight keeps the slot until its release.
        self.slot().holders.fetch_sub(1, Ordering::AcqRel);
    }
}

/// DPDK's free callback: the last mbuf attached through the slot at
/// `opaque` was freed (refcnt already 0).
unsafe extern "C" fn ext_free_cb(_addr: *mut c_void, opaque: *mut c_void) {
    // SAFETY: `opaque` is the slot set by `ExtBufPool::new`; the pool is kept
    // alive by the strong count the attachment took in `try_arm`.
    let slot = unsafe { &*opaque.cast::<Slot>() };
    let pool = slot.pool;
    slot.releases.fetch_add(1, Ordering::AcqRel);
    // SAFETY: as above; the pool outlives this line.
    unsafe { (*pool).released_total.fetch_add(1, Ordering::AcqRel) };
    slot.holders.fetch_sub(1, Ordering::AcqRel);
    // SAFETY: gives back the count taken in `try_arm`; may free the pool, so
    // nothing of it is touched after this.
    unsafe { Arc::decrement_strong_count(pool) };
}
