//! Zero-copy TX from application memory: registering it with DPDK
//! ([`ExtMem`]), backing it with hugepages ([`HugeMap`]), and accounting for
//! the mbufs that point into it ([`ExtBufPool`], [`ExtBuf`]).
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
//! IOVA-contiguous: [`ExtMem::contiguous`] says how far a range is, and
//! callers split there. With IOVA-as-VA (every `--no-huge` run) everything
//! is contiguous; with IOVA-as-PA only a page is, and hugepages make that
//! page 2 MiB.
//!
//! Registration (`rte_extmem_register`) makes the memory known to EAL as an
//! external memory segment list with one IOVA per page, which
//! `rte_dev_dma_map` then requires before it maps the range into a device's
//! IOMMU domain (VFIO). Every live registration is counted
//! ([`ExtMem::live`]), so tests can prove none outlives its memory.

use std::cell::UnsafeCell;
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::eal::Eal;
use crate::error::DpdkError;
use crate::port::Port;
use crate::sys;

/// Registrations alive in the process (registered, not yet unregistered).
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Application memory registered with DPDK as external memory, with its
/// per-page IOVAs, and mapped for DMA on the ports that need it.
/// Unmapped and unregistered on drop: drop it only once every attachment
/// from it is released, or a device may still be reading it.
///
/// IOVA mode matters: `--no-huge` (and VFIO) give IOVA-as-VA, where any
/// range is contiguous. EAL on hugepages as root without VFIO picks
/// IOVA-as-PA, where ordinary 4 KiB pages are contiguous only within a page
/// and may even move; there use hugepage-backed memory ([`HugeMap`]), or
/// `--iova-mode=va` when every port is a virtual device.
#[derive(Debug)]
pub struct ExtMem {
    addr: NonNull<u8>,
    len: usize,
    page_size: usize,
    iovas: Box<[u64]>,
    /// Ports (id, device) the region was DMA-mapped for, to unmap on drop.
    /// Locked only on the control path (mapping, unmapping).
    mapped: Mutex<Vec<(u16, NonNull<sys::rte_device>)>>,
    _eal: Eal,
}

// SAFETY: the handle only records addresses; DPDK's registration calls are
// thread-safe, and the list of mapped devices is behind a mutex.
unsafe impl Send for ExtMem {}
// SAFETY: `&self` methods read the recorded addresses or lock the list.
unsafe impl Sync for ExtMem {}

impl ExtMem {
    /// Registers `len` bytes at `addr` with DPDK (`rte_extmem_register`),
    /// computing each page's IOVA: the address itself when EAL runs with
    /// IOVA-as-VA, the physical address (from `/proc/self/pagemap`, which
    /// needs root) otherwise.
    ///
    /// # Safety
    /// - `addr` and `len` must be multiples of `page_size` (a power of two,
    ///   the size of the pages backing the memory), and the memory must stay
    ///   allocated until the `ExtMem` is dropped.
    /// - With IOVA-as-PA, the pages must be pinned (hugepages) so that their
    ///   physical addresses do not change.
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
            if iova == u64::MAX || (!va && iova == 0) {
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
        LIVE.fetch_add(1, Ordering::AcqRel);
        Ok(ExtMem {
            addr,
            len,
            page_size,
            iovas: iovas.into_boxed_slice(),
            mapped: Mutex::new(Vec::new()),
            _eal: eal.clone(),
        })
    }

    /// Registrations alive in this process: what tests check is back to
    /// zero once every region is gone.
    pub fn live() -> usize {
        LIVE.load(Ordering::Acquire)
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

    /// The IOVA of each page, as registered.
    pub fn iovas(&self) -> &[u64] {
        &self.iovas
    }

    /// The IOVA of `len` bytes at `ptr`, if they lie in this region and are
    /// IOVA-contiguous (every page after the first follows on from the one
    /// before); `None` otherwise, and the caller splits at a page boundary.
    pub fn iova(&self, ptr: *const u8, len: usize) -> Option<u64> {
        let start = (ptr as usize).checked_sub(self.addr.as_ptr() as usize)?;
        if start.checked_add(len)? > self.len {
            return None;
        }
        match self.contiguous(ptr, len) {
            Some((iova, n)) if n == len || len == 0 => Some(iova),
            _ => None,
        }
    }

    /// The IOVA of the byte at `ptr` and how many of the `len` bytes from
    /// there are IOVA-contiguous (at least up to the end of `ptr`'s page,
    /// at most `len` or the end of the region); `None` if `ptr` is outside
    /// the region. An external buffer is at most that long.
    pub fn contiguous(&self, ptr: *const u8, len: usize) -> Option<(u64, usize)> {
        let start = (ptr as usize).checked_sub(self.addr.as_ptr() as usize)?;
        if start >= self.len {
            return None;
        }
        Some(contiguous_run(&self.iovas, self.page_size, start, len))
    }

    /// The IOVA-contiguous runs of the region: (offset, IOVA, length).
    fn runs(&self) -> impl Iterator<Item = (usize, u64, usize)> + '_ {
        iova_runs(&self.iovas, self.page_size)
    }

    /// Maps the region for DMA by `port`'s device (`rte_dev_dma_map`), as a
    /// device behind VFIO needs; see [`ExtMem::dma_map_port`].
    pub fn dma_map(&self, port: &Port) -> Result<bool, DpdkError> {
        self.dma_map_port(port.id())
    }

    /// Maps the region for DMA by the device of port `port_id`
    /// (`rte_dev_dma_map`, one call per IOVA-contiguous run), as a device
    /// behind VFIO needs; unmapped on drop, mapped once per device however
    /// often asked. Returns `Ok(false)` where the bus or driver has no such
    /// operation (`ENOTSUP`: a PCI device without VFIO, whose DMA uses the
    /// registered IOVAs as they are) or the port has no device. The vdev
    /// bus accepts the call and does nothing for drivers without a mapping
    /// of their own (every virtual device here, which reads memory by its
    /// virtual address): there the registration alone suffices.
    pub fn dma_map_port(&self, port_id: u16) -> Result<bool, DpdkError> {
        let Some(dev) = crate::port::device_of(port_id) else {
            return Ok(false);
        };
        // A poisoned lock only means a panic elsewhere; the list is updated
        // in single statements.
        let mut mapped = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
        if mapped.iter().any(|&(_, d)| d == dev) {
            return Ok(true);
        }
        let mut done = Vec::new();
        for (off, iova, len) in self.runs() {
            let va = self.addr.as_ptr().wrapping_add(off);
            // SAFETY: the run lies in the range registered as external
            // memory, as rte_dev_dma_map requires; `dev` is the port's live
            // device.
            let ret = unsafe { sys::rte_dev_dma_map(dev.as_ptr(), va.cast(), iova, len) };
            if ret == 0 {
                done.push((va, iova, len));
                continue;
            }
            // SAFETY: reads this thread's rte_errno, set by the failed call.
            let errno = unsafe { sys::shim_rte_errno() };
            for (va, iova, len) in done {
                // SAFETY: undoes the mappings just made, on the same device.
                unsafe { sys::rte_dev_dma_unmap(dev.as_ptr(), va.cast(), iova, len) };
            }
            return if errno == libc::ENOTSUP {
                Ok(false)
            } else {
                Err(DpdkError::new("rte_dev_dma_map", errno))
            };
        }
        mapped.push((port_id, dev));
        Ok(true)
    }
}

/// The IOVA of byte `start` of memory whose pages of `ps` bytes have the
/// IOVAs `iovas`, and how many of the `len` bytes from there are
/// IOVA-contiguous (never past the last page). `start` lies in the memory.
fn contiguous_run(iovas: &[u64], ps: usize, start: usize, len: usize) -> (u64, usize) {
    let want = len.min(iovas.len() * ps - start);
    let mut p = start / ps;
    let iova = iovas[p] + (start % ps) as u64;
    let mut run = ps - start % ps;
    while run < want && p + 1 < iovas.len() {
        if iovas[p + 1] != iovas[p].wrapping_add(ps as u64) {
            break;
        }
        run += ps;
        p += 1;
    }
    (iova, run.min(want))
}

/// The maximal IOVA-contiguous runs of pages of `ps` bytes with the IOVAs
/// `iovas`: (offset, IOVA, length).
fn iova_runs(iovas: &[u64], ps: usize) -> impl Iterator<Item = (usize, u64, usize)> + '_ {
    let n = iovas.len();
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= n {
            return None;
        }
        let first = at;
        at += 1;
        while at < n && iovas[at] == iovas[at - 1].wrapping_add(ps as u64) {
            at += 1;
        }
        Some((first * ps, iovas[first], (at - first) * ps))
    })
}

impl Drop for ExtMem {
    fn drop(&mut self) {
        let mapped = std::mem::take(self.mapped.get_mut().unwrap_or_else(|e| e.into_inner()));
        for (port, dev) in mapped {
            // A port closed since (its device possibly freed) took its
            // mappings with it: unmap only from the device still behind it.
            if crate::port::device_of(port) != Some(dev) {
                continue;
            }
            for (off, iova, len) in self.runs() {
                let va = self.addr.as_ptr().wrapping_add(off);
                // SAFETY: `dev` is the live device of `port`, for which
                // `dma_map_port` mapped exactly this run.
                unsafe { sys::rte_dev_dma_unmap(dev.as_ptr(), va.cast(), iova, len) };
            }
        }
        // SAFETY: registered by `register`; EAL is alive (`_eal`).
        unsafe { sys::rte_extmem_unregister(self.addr.as_ptr().cast(), self.len) };
        LIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether `ptr` lies in memory EAL knows as external (registered with
/// `rte_extmem_register` and not yet unregistered): DPDK's own view, which
/// tests use to prove a registration happened and is gone.
pub fn is_external_memory(_eal: &Eal, ptr: *const u8) -> bool {
    // SAFETY: EAL is running (`_eal`); the lookup only reads its tables.
    let msl = unsafe { sys::rte_mem_virt2memseg_list(ptr.cast()) };
    // SAFETY: a non-null result is one of EAL's live memseg lists.
    !msl.is_null() && unsafe { (*msl).external } != 0
}

/// The IOVA EAL has for `ptr` (`rte_mem_virt2iova`), if it knows the
/// memory: the IOVA a registration recorded, for external memory.
pub fn iova_of(_eal: &Eal, ptr: *const u8) -> Option<u64> {
    // SAFETY: EAL is running (`_eal`); the lookup only reads its tables
    // (or, in IOVA-as-PA mode for unknown memory, /proc/self/pagemap).
    let iova = unsafe { sys::rte_mem_virt2iova(ptr.cast()) };
    (iova != u64::MAX).then_some(iova)
}

/// The physical address of `ptr` from `/proc/self/pagemap`, where the
/// process may read it (root) and the page is resident.
pub fn phys_addr(ptr: *const u8) -> Option<u64> {
    // SAFETY: reads /proc/self/pagemap for the page of `ptr`; no memory is
    // touched.
    let pa = unsafe { sys::rte_mem_virt2phy(ptr.cast()) };
    (pa != u64::MAX && pa != 0).then_some(pa)
}

/// The name of the bus the device of port `port_id` is on (`"vdev"`,
/// `"pci"`, …), if it has one: a device off the vdev bus reads memory
/// through DMA, so its memory must be registered and mapped.
pub fn port_bus_name(port_id: u16) -> Option<String> {
    let dev = crate::port::device_of(port_id)?;
    // SAFETY: `dev` is a live device; its bus outlives it.
    let bus = unsafe { sys::rte_dev_bus(dev.as_ptr()) };
    if bus.is_null() {
        return None;
    }
    // SAFETY: `bus` is a registered bus; its name is a static C string.
    let name = unsafe { sys::rte_bus_name(bus) };
    if name.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated, static.
    Some(
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Anonymous memory backed by hugepages (`mmap` with `MAP_HUGETLB`),
/// populated at once: its pages are pinned, physically contiguous within
/// each page, and need no hugetlbfs mount. Unmapped on drop.
#[derive(Debug)]
pub struct HugeMap {
    ptr: NonNull<u8>,
    len: usize,
    page_size: usize,
}

// SAFETY: a plain owned mapping; nothing in it is tied to a thread.
unsafe impl Send for HugeMap {}
// SAFETY: `&self` only hands out the address.
unsafe impl Sync for HugeMap {}

/// Why hugepage memory could not be mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugeMapError {
    /// Not enough free hugepages of the size (none reserved, or all in
    /// use): `echo N > /proc/sys/vm/nr_hugepages` reserves them.
    NoneFree {
        /// The page size asked for.
        page_size: usize,
        /// Free pages of that size, as the kernel reports them.
        free: u64,
    },
    /// The page size is not one the kernel offers.
    UnsupportedPageSize(usize),
    /// Another `mmap` failure (errno).
    Os(i32),
}

impl std::fmt::Display for HugeMapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HugeMapError::NoneFree { page_size, free } => write!(
                f,
                "not enough free {} KiB hugepages ({free} free; reserve more with \
                 echo N > /sys/kernel/mm/hugepages/hugepages-{}kB/nr_hugepages)",
                page_size / 1024,
                page_size / 1024
            ),
            HugeMapError::UnsupportedPageSize(s) => {
                write!(f, "no {} KiB hugepages on this kernel", s / 1024)
            }
            HugeMapError::Os(e) => write!(
                f,
                "mmap of hugepages failed: {}",
                std::io::Error::from_raw_os_error(*e)
            ),
        }
    }
}

impl std::error::Error for HugeMapError {}

impl HugeMap {
    /// The default hugepage size on x86-64.
    pub const PAGE_2M: usize = 2 << 20;

    /// Maps `len` bytes (rounded up to whole pages) of `page_size`
    /// hugepages, zeroed.
    pub fn new(len: usize, page_size: usize) -> Result<HugeMap, HugeMapError> {
        if !page_size.is_power_of_two() || page_size < 4096 {
            return Err(HugeMapError::UnsupportedPageSize(page_size));
        }
        let Some(free) = HugeMap::free_pages(page_size) else {
            return Err(HugeMapError::UnsupportedPageSize(page_size));
        };
        let len = len.max(1).div_ceil(page_size) * page_size;
        let size_flag = (page_size.trailing_zeros() as libc::c_int) << libc::MAP_HUGE_SHIFT;
        // SAFETY: an anonymous private mapping at an address the kernel
        // picks; nothing existing is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_HUGETLB
                    | libc::MAP_POPULATE
                    | size_flag,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(if errno == libc::ENOMEM {
                HugeMapError::NoneFree { page_size, free }
            } else {
                HugeMapError::Os(errno)
            });
        }
        let Some(ptr) = NonNull::new(p.cast::<u8>()) else {
            return Err(HugeMapError::Os(libc::EFAULT));
        };
        Ok(HugeMap {
            ptr,
            len,
            page_size,
        })
    }

    /// Free hugepages of `page_size` (`None`: the kernel has no such size).
    pub fn free_pages(page_size: usize) -> Option<u64> {
        let path = format!(
            "/sys/kernel/mm/hugepages/hugepages-{}kB/free_hugepages",
            page_size / 1024
        );
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    /// The mapping's start (page-aligned).
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes mapped (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The hugepage size.
    pub fn page_size(&self) -> usize {
        self.page_size
    }
}

impl Drop for HugeMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; whoever handed out
        // pointers into it (a region) is gone.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
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

#[cfg(test)]
mod tests {
    use super::*;

    const PS: usize = 2 << 20;
    /// Pages 0-1 physically adjacent, page 2 elsewhere, page 3 after it.
    const IOVAS: [u64; 4] = [0x4000_0000, 0x4020_0000, 0x9000_0000, 0x9020_0000];

    #[test]
    fn runs_end_where_the_next_page_is_not_adjacent() {
        // Inside one page.
        assert_eq!(contiguous_run(&IOVAS, PS, 100, 1000), (0x4000_0064, 1000));
        // Across the adjacent boundary 0 → 1.
        assert_eq!(contiguous_run(&IOVAS, PS, PS - 10, 20), (0x401f_fff6, 20));
        // Up to the boundary 1 → 2 only: the caller splits there.
        assert_eq!(
            contiguous_run(&IOVAS, PS, 2 * PS - 10, 9000),
            (0x403f_fff6, 10)
        );
        // The rest from the next page.
        assert_eq!(
            contiguous_run(&IOVAS, PS, 2 * PS, 8990),
            (0x9000_0000, 8990)
        );
        // Never past the memory's end.
        assert_eq!(
            contiguous_run(&IOVAS, PS, 4 * PS - 4, 100),
            (0x903f_fffc, 4)
        );
        // IOVA-as-VA: one run however long.
        let va: Vec<u64> = (0..4).map(|i| 0x7f00_0000_0000 + i * 4096).collect();
        assert_eq!(
            contiguous_run(&va, 4096, 5, 16_000),
            (0x7f00_0000_0005, 16_000)
        );
    }

    #[test]
    fn dma_runs_cover_the_memory_once() {
        let runs: Vec<_> = iova_runs(&IOVAS, PS).collect();
        assert_eq!(
            runs,
            [(0, 0x4000_0000, 2 * PS), (2 * PS, 0x9000_0000, 2 * PS)]
        );
        let one: Vec<_> = iova_runs(&[7 * 4096, 8 * 4096, 9 * 4096], 4096).collect();
        assert_eq!(one, [(0, 7 * 4096, 3 * 4096)]);
        assert_eq!(iova_runs(&[], 4096).count(), 0);
    }
}
