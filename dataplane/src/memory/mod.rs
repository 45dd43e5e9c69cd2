//! Registered memory: the buffers applications hand to the dataplane, and
//! the [`Placement`] implementation through which the QP engine reaches
//! them (RFC 5041 tagged and untagged placement, RFC 5040 Read Response
//! source).
//!
//! It sits at the end of the receive path (the one copy from a received
//! frame into application memory) and at the start of the transmit path
//! (payload attached to a frame by reference, or copied where the port
//! cannot chain segments). It is one of the two places in the workspace
//! that hold `unsafe` (the other is `dpdk-bindings`).
//!
//! # Sharing and the memory model
//!
//! A [`Region`] is shared by the application thread and the worker that
//! places into it, and a peer may write into a remotely writable region at
//! any time. Handing out `&[u8]` or `&mut [u8]` over such memory would be
//! a data race, so every access — the application's [`Region::read`] and
//! [`Region::write`], the worker's placement, CRC and checksum passes, a
//! port's copy into a frame — goes through one copy primitive
//! (`memory/shared.rs`: a `rep movsb` on x86-64, at `memcpy` speed, whose effect
//! is that of relaxed atomic byte accesses; why that is sound is said
//! there). Every byte is always reached at that one width, so two parties
//! writing neighbouring bytes never lose each other's update, and no
//! mixed-size atomic access is made. The payload pass ([`crate::pass`])
//! reads region memory in a loop of its own, written as inline assembly
//! for the same reason and with the same effect.
//!
//! Concurrent access therefore never has undefined behaviour; it only
//! yields unspecified bytes, as it would on an RNIC. What makes the bytes
//! *specified* is the completion ring:
//!
//! - **Receive:** the worker places the payload (relaxed stores), then
//!   pushes the work completion into the CQ ring, whose push is a release
//!   operation; the application pops it with an acquire operation. The
//!   placement therefore happens-before everything the application does
//!   after popping the completion, and its reads see the placed bytes.
//! - **Send:** the application writes its buffer, then pushes the work
//!   request into the QP's submission ring (release); the worker pops it
//!   (acquire) before it reads a byte of the buffer. The application must
//!   not change the buffer until the work request's completion: TCP may
//!   retransmit from it until then.
//!
//! Deregistration and lifetime: a [`Region`] is reference counted. The
//! application's handle, each worker's [`MemoryTable`] entry (one per
//! memory registration still known to that worker) and each frame that
//! carries part of it by reference hold one count; the memory is freed when
//! the last goes. The STag table's pins (rdmap's `RegionRef`) decide when a
//! worker drops its entry, so memory an in-flight FPDU refers to is never
//! freed under it.
//!
//! # Storage and registration with DPDK
//!
//! A region is page-aligned heap memory ([`Region::new`], 4 KiB pages),
//! hugepage-backed ([`Region::new_hugepage`]: an anonymous `MAP_HUGETLB`
//! mapping of 2 MiB pages, pinned and physically contiguous within each
//! page; it fails with [`MemoryError::NoHugepages`] when none are free,
//! and falls back to the heap only through [`Region::with_options`] when
//! the caller asks), or memory the application owns (next section). All
//! are reached through the same copy primitive.
//!
//! When a region is registered with a dataplane over a DPDK port, the
//! port's queue registers its memory with EAL once
//! (`rte_extmem_register`, with the page size and each page's IOVA: the
//! address under IOVA-as-VA, the physical address from
//! `/proc/self/pagemap` under IOVA-as-PA) and DMA-maps it for the port
//! (`rte_dev_dma_map`, what a device behind VFIO needs). The registration
//! lives in the region's storage: external buffers take their IOVA from it
//! ([`Region::dma_run`]), split where consecutive pages are not
//! IOVA-contiguous, and it is unmapped and unregistered when the storage
//! goes — after the last handle, and so after the last in-flight mbuf,
//! whose pin holds one. Under IOVA-as-PA, heap regions and application
//! memory are not registered (the kernel may move their 4 KiB pages):
//! their payload is copied into mbufs; hugepage-backed regions are
//! attached.
//!
//! # Application memory
//!
//! [`Region::from_vec`] takes an application's `Vec<u8>` (and
//! [`Region::from_boxed_slice`] a `Box<[u8]>`) without copying and
//! [`Region::into_inner`] gives it back once nothing refers to it any
//! more; [`Region::from_raw_parts`] (`unsafe`, with its contract) takes
//! memory the application mapped itself and runs a release callback when
//! the dataplane is done with it. Such memory starts and ends anywhere;
//! it is reached byte by byte like any region's, and no access reaches
//! outside the region's bytes.
//!
//! `rte_extmem_register` takes whole pages, and two vectors from the
//! allocator may share one, so registering "the enclosing pages" of each
//! region would register the shared page twice (a page belongs in one
//! external-memory registration and one VFIO DMA mapping, which refuses an
//! overlapping one) and the first one's removal would take the second's
//! page with it. Instead registrations are chunks kept in one process-wide
//! table ([`DpdkRegistration`]): the pages a region covers only in part
//! become one-page chunks shared by reference count, its whole pages one
//! chunk of its own. A region takes a use of the chunks already covering
//! its pages and registers the rest; a chunk is unregistered when its last
//! user goes, under the table's lock (registration is a control-path
//! operation), so a new registration of the same page never races its
//! removal. Every page of a chunk holds bytes of a live region that uses
//! it, so a registration never outlives its memory, nor refers to a page
//! the allocator has since given back to the kernel and mapped afresh
//! (which under VFIO would leave the device reading the old page). External
//! buffers split at a chunk boundary only where the IOVAs do not follow on.
//! Each chunk is one of EAL's external memory segment lists, of which DPDK
//! 22.11 has 128 in all; past them a registration fails, and virtual
//! devices then attach by address while other ports refuse the memory
//! registration. The alternative, registering only page-aligned memory,
//! would leave every ordinary vector unregistered, and so unusable with a
//! device behind VFIO.
//!
//! A registration keeps EAL alive (unregistering needs it): EAL is cleaned
//! up only once every region a DPDK port registered is gone too.

mod shared;

pub(crate) use shared::copy as copy_raw;
pub(crate) use shared::{prefetch, prefetch_write};

use core::ptr::NonNull;
use core::sync::atomic::AtomicU64;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use dpdk_bindings::{DpdkError, Eal, ExtMem, HugeMap, HugeMapError};

use rdmap::placement::{CheckedRange, Placement, RegionHandle, Unplaced};

/// Alignment and granularity of every region the dataplane allocates, and
/// the page size application memory is registered with: one base page.
/// External buffers must not straddle a page boundary of a non-contiguous
/// IOVA space, so the DPDK port splits attachments at this size.
pub const PAGE_SIZE: usize = 4096;

/// Regions from this long have a mapping of their own on transparent
/// huge pages ([`Region::new`]): a huge page's worth.
pub const ANON_MIN: usize = 2 << 20;

const WORD: usize = 8;
const WORDS_PER_PAGE: usize = PAGE_SIZE / WORD;

/// Bytes read into a stack buffer at a time by the CRC and checksum passes:
/// a jumbo frame's FPDU payload in one piece, for the CRC's speed.
const PASS_CHUNK: usize = 9216;

/// The largest region: what a `u32` page count with room to spare allows,
/// and far beyond what a machine of this project's size would register.
pub const MAX_REGION_LEN: usize = 1 << 40;

/// One page of words, page-aligned. `repr(C)` with a size that is a
/// multiple of its alignment: an array of pages is a gapless array of
/// words.
#[repr(C, align(4096))]
struct Page([AtomicU64; WORDS_PER_PAGE]);

const _: () = assert!(core::mem::size_of::<Page>() == PAGE_SIZE);

impl Page {
    fn zeroed() -> Page {
        Page([const { AtomicU64::new(0) }; WORDS_PER_PAGE])
    }
}

/// Why a memory operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryError {
    /// A zero-length region.
    Empty,
    /// Longer than [`MAX_REGION_LEN`].
    TooLarge,
    /// The access does not lie inside the region.
    OutOfBounds,
    /// No region handle left (more than 2^32 regions alive at once).
    HandlesExhausted,
    /// Not enough free hugepages for a hugepage-backed region (none
    /// reserved, or all in use).
    NoHugepages {
        /// Pages of [`HUGE_PAGE_SIZE`] the region needs.
        needed: u64,
        /// Pages the kernel reported free.
        free: u64,
    },
    /// Mapping hugepages failed otherwise (the `errno`; 0 if the kernel
    /// has no 2 MiB pages).
    Hugepages(i32),
}

impl core::fmt::Display for MemoryError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MemoryError::Empty => f.write_str("a region must not be empty"),
            MemoryError::TooLarge => f.write_str("region larger than the dataplane supports"),
            MemoryError::OutOfBounds => f.write_str("access outside the region"),
            MemoryError::HandlesExhausted => f.write_str("no region handle left"),
            MemoryError::NoHugepages { needed, free } => write!(
                f,
                "not enough free 2 MiB hugepages: {needed} needed, {free} free (reserve them: \
                 echo N > /proc/sys/vm/nr_hugepages)"
            ),
            MemoryError::Hugepages(0) => f.write_str("this kernel offers no 2 MiB hugepages"),
            MemoryError::Hugepages(e) => write!(
                f,
                "mapping hugepages failed: {}",
                std::io::Error::from_raw_os_error(*e)
            ),
        }
    }
}

impl std::error::Error for MemoryError {}

/// The process-wide allocator of region handles: a dense index (so a
/// worker finds a region by indexing a vector) and a generation that
/// changes each time an index is reused (so a stale handle never names a
/// newer region). Locked only when a region is created or freed.
#[derive(Debug, Default)]
struct HandleSlab {
    generations: Vec<u32>,
    free: Vec<u32>,
}

static HANDLES: Mutex<HandleSlab> = Mutex::new(HandleSlab {
    generations: Vec::new(),
    free: Vec::new(),
});

fn handle_of(index: u32, generation: u32) -> RegionHandle {
    RegionHandle(u64::from(generation) << 32 | u64::from(index))
}

fn split_handle(h: RegionHandle) -> (usize, u32) {
    ((h.0 & 0xffff_ffff) as usize, (h.0 >> 32) as u32)
}

fn alloc_handle() -> Result<RegionHandle, MemoryError> {
    // A poisoned lock only means another thread panicked while holding
    // it; the slab itself is always consistent between statements.
    let mut slab = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(index) = slab.free.pop() {
        let generation = slab.generations[index as usize];
        return Ok(handle_of(index, generation));
    }
    let index = u32::try_from(slab.generations.len()).map_err(|_| MemoryError::HandlesExhausted)?;
    slab.generations.push(0);
    Ok(handle_of(index, 0))
}

fn free_handle(h: RegionHandle) {
    let (index, generation) = split_handle(h);
    let mut slab = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(g) = slab.generations.get_mut(index) {
        if *g == generation {
            *g = g.wrapping_add(1);
            slab.free.push(index as u32);
        }
    }
}

/// What backs a region's bytes: owned only to be freed (the bytes are
/// reached through `Storage::ptr`).
#[derive(Debug)]
#[allow(dead_code, reason = "the fields are owned to be freed, never read")]
enum Backing {
    Heap(Box<[Page]>),
    /// A large region's own mapping, on transparent huge pages where the
    /// kernel has them ([`crate::sys::AnonMap`]).
    Anon(crate::sys::AnonMap),
    Huge(HugeMap),
    /// An application's buffer ([`Region::from_vec`]).
    Vec(OwnedVec),
    /// Memory the application mapped ([`Region::from_raw_parts`]).
    Foreign(ForeignMem),
    /// Handed back by [`Region::into_inner`].
    Taken,
}

/// A `Vec<u8>` in pieces, so that its bytes are reached only through the
/// region's atomic view while the region owns it; rebuilt to be handed
/// back or freed.
#[derive(Debug)]
struct OwnedVec {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

impl OwnedVec {
    fn new(v: Vec<u8>) -> OwnedVec {
        let mut v = core::mem::ManuallyDrop::new(v);
        OwnedVec {
            // A `Vec`'s pointer is never null (dangling when unallocated).
            ptr: NonNull::new(v.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            len: v.len(),
            cap: v.capacity(),
        }
    }

    fn into_vec(self) -> Vec<u8> {
        let me = core::mem::ManuallyDrop::new(self);
        // SAFETY: the pieces came from `Vec::as_mut_ptr`, `len` and
        // `capacity` of a vector that `new` took apart and nothing else
        // freed; `ManuallyDrop` keeps `Drop` from freeing it a second time.
        unsafe { Vec::from_raw_parts(me.ptr.as_ptr(), me.len, me.cap) }
    }
}

impl Drop for OwnedVec {
    fn drop(&mut self) {
        // SAFETY: as in `into_vec`; this is the only place that frees it.
        drop(unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), self.len, self.cap) });
    }
}

/// Memory the application mapped, and what it asked to run once the
/// dataplane no longer refers to it.
struct ForeignMem {
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl core::fmt::Debug for ForeignMem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("ForeignMem")
    }
}

impl Drop for ForeignMem {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// The size of the pages of a hugepage-backed region.
pub const HUGE_PAGE_SIZE: usize = HugeMap::PAGE_2M;

/// How [`Region::with_options`] allocates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegionOptions {
    /// Back the region with 2 MiB hugepages.
    pub hugepages: bool,
    /// When no hugepages are free, use ordinary heap pages instead of
    /// failing.
    pub fallback_to_heap: bool,
}

#[derive(Debug)]
struct Storage {
    /// The registration with DPDK, if a DPDK port registered the region:
    /// declared first so that it is unmapped and unregistered before the
    /// memory goes (fields are dropped in order, after `Drop::drop`).
    /// Read without a lock on the transmit path.
    dpdk: OnceLock<DpdkRegistration>,
    /// Serialises registration attempts (control path only).
    dpdk_lock: Mutex<()>,
    /// Byte 0, valid for `len` bytes while `backing` is.
    ptr: NonNull<u8>,
    len: usize,
    /// The memory the region owns whole pages of (`[start, start + len)`,
    /// page-aligned) or, for application memory, only the bytes of the
    /// region: what a DPDK registration covers.
    extent: (usize, usize),
    page_size: usize,
    backing: Backing,
    handle: RegionHandle,
}

// SAFETY: `ptr` points into memory `backing` owns (or, for application
// memory, that the application vouched for); every access through it is
// made by `shared::copy` (see the module documentation). `backing` is
// touched only when the storage is dropped or taken apart through
// `&mut`/ownership (a foreign release callback is `Send` and runs then),
// and the rest is `Send`/`Sync` on its own.
unsafe impl Send for Storage {}
// SAFETY: as above.
unsafe impl Sync for Storage {}

impl Drop for Storage {
    fn drop(&mut self) {
        free_handle(self.handle);
    }
}

impl core::fmt::Debug for Page {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Page")
    }
}

// ---------------------------------------------------------------------
// Registrations with DPDK, shared where regions share a page.
// ---------------------------------------------------------------------

/// One `rte_extmem_register` registration of a page range, and how many
/// regions use it.
#[derive(Debug)]
struct Chunk {
    end: usize,
    users: usize,
    mem: Arc<ExtMem>,
}

/// Every live registration, by start address; the ranges never overlap.
/// Locked only to register or unregister (the control path, and the drop
/// of a region's last handle).
static CHUNKS: Mutex<BTreeMap<usize, Chunk>> = Mutex::new(BTreeMap::new());

/// A region's share of the process's DPDK registrations: the chunks that
/// cover its memory, by address. Dropping it gives each back; a chunk no
/// region uses any more is unmapped and unregistered then, under the
/// registry's lock, so that a new registration of the same pages never
/// races with its removal.
#[derive(Debug)]
pub struct DpdkRegistration {
    chunks: Vec<Arc<ExtMem>>,
}

impl DpdkRegistration {
    /// Registers `[start, end)` with pages of `page_size` (a power of
    /// two). A page the region covers only in part may hold other memory
    /// (two vectors from the allocator may share one), which another
    /// region may register too: such pages become one-page chunks shared
    /// by reference count, so that neither region's registration fails
    /// for the other's and neither unregisters the other's page. Whole
    /// pages are the region's alone and become one chunk; a chunk
    /// therefore never outlives the memory on it, since each of its pages
    /// holds bytes of a region that still uses it.
    ///
    /// # Safety
    /// `[start, end)` must be memory that stays mapped while the returned
    /// registration lives; under IOVA-as-PA its pages must be pinned.
    unsafe fn new(
        eal: &Eal,
        start: usize,
        end: usize,
        page_size: usize,
    ) -> Result<DpdkRegistration, DpdkError> {
        let ps = page_size;
        let lo = start - start % ps;
        let hi = end.div_ceil(ps) * ps;
        let mut segments = Vec::with_capacity(3);
        let (mut a, mut b) = (lo, hi);
        if !start.is_multiple_of(ps) {
            segments.push((lo, lo + ps));
            a = lo + ps;
        }
        if !end.is_multiple_of(ps) && hi - ps >= a {
            segments.push((hi - ps, hi));
            b = hi - ps;
        }
        if a < b {
            segments.push((a, b));
        }
        segments.sort_unstable();
        let mut map = CHUNKS.lock().unwrap_or_else(|e| e.into_inner());
        let mut chunks = Vec::new();
        for (s, e) in segments {
            // SAFETY: `[s, e)` is made of pages that hold bytes of
            // `[start, end)`, which the caller vouches for.
            if let Err(err) = unsafe { take_range(&mut map, eal, s, e, ps, &mut chunks) } {
                release(&mut map, &mut chunks);
                return Err(err);
            }
        }
        chunks.sort_unstable_by_key(|m| m.addr().as_ptr() as usize);
        chunks.dedup_by(|x, y| Arc::ptr_eq(x, y));
        Ok(DpdkRegistration { chunks })
    }

    /// The registrations covering the region, by address.
    pub fn chunks(&self) -> &[Arc<ExtMem>] {
        &self.chunks
    }

    /// The IOVA of the byte at `ptr` and how many of the `len` bytes from
    /// there are IOVA-contiguous, across chunks where their IOVAs follow
    /// on from each other.
    fn contiguous(&self, ptr: *const u8, len: usize) -> Option<(u64, usize)> {
        let at = ptr as usize;
        let i = self.chunks.iter().position(|m| {
            let s = m.addr().as_ptr() as usize;
            at >= s && at < s + m.len()
        })?;
        let (iova, mut run) = self.chunks[i].contiguous(ptr, len)?;
        for next in &self.chunks[i + 1..] {
            if run >= len || next.addr().as_ptr() as usize != at + run {
                break;
            }
            match next.contiguous(next.addr().as_ptr(), len - run) {
                Some((i2, n)) if i2 == iova.wrapping_add(run as u64) => run += n,
                _ => break,
            }
        }
        Some((iova, run.min(len)))
    }
}

impl Drop for DpdkRegistration {
    fn drop(&mut self) {
        let mut map = CHUNKS.lock().unwrap_or_else(|e| e.into_inner());
        release(&mut map, &mut self.chunks);
    }
}

/// Takes a use of every chunk overlapping `[s, e)` and registers the gaps
/// between them as new chunks, appending all to `out`.
///
/// # Safety
/// As [`DpdkRegistration::new`], for `[s, e)`.
unsafe fn take_range(
    map: &mut BTreeMap<usize, Chunk>,
    eal: &Eal,
    s: usize,
    e: usize,
    ps: usize,
    out: &mut Vec<Arc<ExtMem>>,
) -> Result<(), DpdkError> {
    // Disjoint ranges sorted by start are sorted by end too.
    let mut overlapping: Vec<usize> = map
        .range(..e)
        .rev()
        .take_while(|(_, c)| c.end > s)
        .map(|(&k, _)| k)
        .collect();
    overlapping.reverse();
    let mut cursor = s;
    let register = |from: usize, to: usize, map: &mut BTreeMap<usize, Chunk>, out: &mut Vec<_>| {
        let Some(addr) = NonNull::new(from as *mut u8) else {
            return Err(DpdkError::with_message(
                "rte_extmem_register",
                libc::EINVAL,
                "null address",
            ));
        };
        // SAFETY: `[from, to)` lies in `[s, e)` (whole pages of `ps`),
        // which the caller vouches for until the registration goes; the
        // chunk is dropped (unregistered) by `release` once no region
        // uses it.
        let mem = Arc::new(unsafe { ExtMem::register(eal, addr, to - from, ps) }?);
        map.insert(
            from,
            Chunk {
                end: to,
                users: 1,
                mem: mem.clone(),
            },
        );
        out.push(mem);
        Ok(())
    };
    for k in overlapping {
        if k > cursor {
            register(cursor, k, map, out)?;
        }
        if let Some(c) = map.get_mut(&k) {
            c.users += 1;
            cursor = cursor.max(c.end);
            out.push(c.mem.clone());
        }
    }
    if cursor < e {
        register(cursor, e, map, out)?;
    }
    Ok(())
}

/// Gives back one use of each chunk in `chunks` (emptied); a chunk no one
/// uses is unregistered here, under the registry's lock.
fn release(map: &mut BTreeMap<usize, Chunk>, chunks: &mut Vec<Arc<ExtMem>>) {
    for mem in chunks.drain(..) {
        let key = mem.addr().as_ptr() as usize;
        let last = match map.get_mut(&key) {
            Some(c) if Arc::ptr_eq(&c.mem, &mem) => {
                c.users -= 1;
                c.users == 0
            }
            _ => false,
        };
        drop(mem);
        if last {
            // The registry held the last reference: unregistered here.
            drop(map.remove(&key));
        }
    }
}

/// Registrations (chunks) alive in the process; each is one
/// `rte_extmem_register` (see [`ExtMem::live`]).
pub fn dpdk_chunks() -> usize {
    CHUNKS.lock().unwrap_or_else(|e| e.into_inner()).len()
}

// ---------------------------------------------------------------------
// Regions.
// ---------------------------------------------------------------------

/// A block of memory registered with the dataplane and shared with its
/// workers: allocated by the dataplane (page-aligned, zeroed:
/// [`Region::new`], [`Region::new_hugepage`]) or owned by the application
/// ([`Region::from_vec`], [`Region::from_raw_parts`]). Cloning makes
/// another handle on the same memory.
///
/// See the module documentation for the rules of concurrent access.
#[derive(Debug, Clone)]
pub struct Region {
    inner: Arc<Storage>,
}

impl Region {
    /// A zeroed region of `len` bytes (rounded up to whole pages in
    /// memory; accesses are bounded by `len`), every page present. From
    /// [`ANON_MIN`] bytes on, a mapping of its own on transparent huge
    /// pages where the kernel offers them; smaller, on the heap.
    pub fn new(len: usize) -> Result<Region, MemoryError> {
        if len == 0 {
            return Err(MemoryError::Empty);
        }
        if len > MAX_REGION_LEN {
            return Err(MemoryError::TooLarge);
        }
        let pages = len.div_ceil(PAGE_SIZE);
        let handle = alloc_handle()?;
        if len >= ANON_MIN {
            if let Some(map) = crate::sys::AnonMap::new(pages * PAGE_SIZE) {
                let base = map.as_ptr().cast::<AtomicU64>();
                let words = map.len() / WORD;
                return Ok(Region::from_parts(
                    base,
                    words,
                    PAGE_SIZE,
                    Backing::Anon(map),
                    len,
                    handle,
                ));
            }
        }
        let pages: Box<[Page]> = (0..pages).map(|_| Page::zeroed()).collect();
        let words = pages.len() * WORDS_PER_PAGE;
        let base = NonNull::from(&pages[0]).cast::<AtomicU64>();
        Ok(Region::from_parts(
            base,
            words,
            PAGE_SIZE,
            Backing::Heap(pages),
            len,
            handle,
        ))
    }

    /// A zeroed region of `len` bytes on 2 MiB hugepages (rounded up to
    /// whole pages): pinned and physically contiguous within each page, so
    /// that a device can read it by physical address (IOVA-as-PA) and an
    /// external buffer need split only every 2 MiB.
    /// [`MemoryError::NoHugepages`] when not enough are free.
    pub fn new_hugepage(len: usize) -> Result<Region, MemoryError> {
        if len == 0 {
            return Err(MemoryError::Empty);
        }
        if len > MAX_REGION_LEN {
            return Err(MemoryError::TooLarge);
        }
        let map = HugeMap::new(len, HUGE_PAGE_SIZE).map_err(|e| match e {
            HugeMapError::NoneFree { free, .. } => MemoryError::NoHugepages {
                needed: len.div_ceil(HUGE_PAGE_SIZE) as u64,
                free,
            },
            HugeMapError::UnsupportedPageSize(_) => MemoryError::Hugepages(0),
            HugeMapError::Os(errno) => MemoryError::Hugepages(errno),
        })?;
        let handle = alloc_handle()?;
        let base = map.as_ptr().cast::<AtomicU64>();
        let words = map.len() / WORD;
        Ok(Region::from_parts(
            base,
            words,
            HUGE_PAGE_SIZE,
            Backing::Huge(map),
            len,
            handle,
        ))
    }

    /// A region as `opts` asks: on hugepages, falling back to the heap
    /// when none are free only if `opts.fallback_to_heap`.
    pub fn with_options(len: usize, opts: RegionOptions) -> Result<Region, MemoryError> {
        if !opts.hugepages {
            return Region::new(len);
        }
        match Region::new_hugepage(len) {
            Err(MemoryError::NoHugepages { .. } | MemoryError::Hugepages(_))
                if opts.fallback_to_heap =>
            {
                Region::new(len)
            }
            r => r,
        }
    }

    /// A region over the application's buffer `buf`, without copying it:
    /// its `buf.len()` bytes, as they are, at whatever alignment the
    /// allocator gave. The region owns the buffer until
    /// [`Region::into_inner`] gives it back (or frees it with its last
    /// handle); meanwhile the application reaches the bytes through the
    /// region, as for any other. Refused (and `buf` dropped) only when it
    /// is empty or no region handle is left.
    ///
    /// A `Box<[u8]>` comes in through [`Region::from_boxed_slice`].
    pub fn from_vec(buf: Vec<u8>) -> Result<Region, MemoryError> {
        let owned = OwnedVec::new(buf);
        let (ptr, len) = (owned.ptr, owned.len);
        // SAFETY: `owned` holds the vector's allocation: `len` initialised
        // bytes at `ptr`, freed only when the backing is dropped (after the
        // storage's registration) or handed back by `into_inner`, and
        // reached by nothing but the region meanwhile, since the vector
        // was moved in.
        unsafe { Region::from_user(ptr, len, Backing::Vec(owned)) }
    }

    /// [`Region::from_vec`] for a boxed slice (no copy either);
    /// [`Region::into_inner`] gives it back as a vector whose
    /// `into_boxed_slice` does not copy.
    pub fn from_boxed_slice(buf: Box<[u8]>) -> Result<Region, MemoryError> {
        Region::from_vec(buf.into_vec())
    }

    /// A region over `len` bytes at `ptr` that the application mapped
    /// itself (a file mapping, shared memory, memory another library
    /// allocated), without copying. `release` runs once the dataplane no
    /// longer refers to the memory: after the region's last handle, every
    /// registration and every frame in flight from it are gone, and after
    /// its DPDK registration (if any) is undone. It may run on a worker
    /// thread, so it should be quick (`munmap`, `close`). If this returns
    /// an error, `release` is dropped without running and the memory is
    /// still the caller's.
    ///
    /// # Safety
    ///
    /// Until `release` runs:
    /// - `[ptr, ptr + len)` stays mapped readable and writable and is not
    ///   freed, unmapped, remapped or `mprotect`ed; a file behind it is
    ///   not truncated below it (a shared file mapping past the file's
    ///   end faults with `SIGBUS`);
    /// - no other [`Region`] is made over any of these bytes (sharing a
    ///   page with another region is fine);
    /// - this process reaches these bytes only through the region, or
    ///   with atomic accesses of its own, never through plain references
    ///   or pointers (`&[u8]`, `&mut [u8]`, `ptr::copy`) while the region
    ///   lives.
    ///
    /// Writes from outside this process (another process sharing the
    /// mapping, a device) while the dataplane reads the bytes leave what
    /// it sends or places unspecified, as they would on an RNIC, but are
    /// not undefined behaviour here: the dataplane reaches the memory
    /// only with atomic word and byte accesses. The dataplane writes only
    /// inside `[ptr, ptr + len)`, and there only where a registration
    /// with write access (or [`Region::write`]) says.
    pub unsafe fn from_raw_parts(
        ptr: NonNull<u8>,
        len: usize,
        release: impl FnOnce() + Send + 'static,
    ) -> Result<Region, MemoryError> {
        let backing = Backing::Foreign(ForeignMem {
            release: Some(Box::new(release)),
        });
        // SAFETY: the caller vouches for `[ptr, ptr + len)` until the
        // release callback, which runs when the backing is dropped: after
        // the storage's registration, with the region's last handle.
        unsafe { Region::from_user(ptr, len, backing) }
    }

    /// A region over application memory.
    ///
    /// # Safety
    /// `len` initialised bytes at `ptr` stay valid for reads and writes
    /// while `backing` lives, and are reached by nothing but the region
    /// (or atomically) meanwhile.
    unsafe fn from_user(
        ptr: NonNull<u8>,
        len: usize,
        backing: Backing,
    ) -> Result<Region, MemoryError> {
        let disarm = |b: Backing| {
            // A refused foreign region stays the caller's: its release
            // callback must not run.
            if let Backing::Foreign(mut f) = b {
                drop(f.release.take());
            }
        };
        if len == 0 {
            disarm(backing);
            return Err(MemoryError::Empty);
        }
        if len > MAX_REGION_LEN || (ptr.as_ptr() as usize).checked_add(len).is_none() {
            disarm(backing);
            return Err(MemoryError::TooLarge);
        }
        let handle = match alloc_handle() {
            Ok(h) => h,
            Err(e) => {
                disarm(backing);
                return Err(e);
            }
        };
        let addr = ptr.as_ptr() as usize;
        Ok(Region {
            inner: Arc::new(Storage {
                dpdk: OnceLock::new(),
                dpdk_lock: Mutex::new(()),
                ptr,
                len,
                extent: (addr, len),
                page_size: PAGE_SIZE,
                backing,
                handle,
            }),
        })
    }

    fn from_parts(
        base: NonNull<AtomicU64>,
        words: usize,
        page_size: usize,
        backing: Backing,
        len: usize,
        handle: RegionHandle,
    ) -> Region {
        Region {
            inner: Arc::new(Storage {
                dpdk: OnceLock::new(),
                dpdk_lock: Mutex::new(()),
                ptr: base.cast(),
                len,
                extent: (base.as_ptr() as usize, words * WORD),
                page_size,
                backing,
                handle,
            }),
        }
    }

    /// The application's buffer back, once nothing else refers to it: no
    /// other handle, no memory registration (deregistered, and for a
    /// [`DeregStatus::Pending`](rdmap::verbs::DeregStatus) deregistration
    /// its `MrDeregistered` event seen), no queue pair or frame in flight
    /// holding it. Its DPDK registration, if any, is undone first. Gives
    /// the region back unchanged while it is still shared (try again
    /// later), and for a region that does not own a vector.
    pub fn into_inner(self) -> Result<Vec<u8>, Region> {
        if !matches!(self.inner.backing, Backing::Vec(_)) {
            return Err(self);
        }
        let mut storage = match Arc::try_unwrap(self.inner) {
            Ok(s) => s,
            Err(inner) => return Err(Region { inner }),
        };
        let backing = core::mem::replace(&mut storage.backing, Backing::Taken);
        // Unregisters from DPDK and frees the handle before the buffer is
        // the application's again.
        drop(storage);
        match backing {
            Backing::Vec(v) => Ok(v.into_vec()),
            _ => Ok(Vec::new()),
        }
    }

    /// Whether the region owns an application's vector
    /// ([`Region::from_vec`]).
    pub fn is_vec_backed(&self) -> bool {
        matches!(self.inner.backing, Backing::Vec(_))
    }

    /// Handles on this memory alive (this one included): what keeps
    /// [`Region::into_inner`] from giving the buffer back.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// The size of the pages backing the region: 4 KiB, or
    /// [`HUGE_PAGE_SIZE`] for a hugepage-backed one.
    pub fn page_size(&self) -> usize {
        self.inner.page_size
    }

    /// Whether the region lives on hugepages.
    pub fn is_hugepage_backed(&self) -> bool {
        matches!(self.inner.backing, Backing::Huge(_))
    }

    /// The DPDK registration that covers byte 0, once a DPDK port made
    /// one: the whole region's, for memory the dataplane allocated.
    pub fn dpdk_registration(&self) -> Option<&ExtMem> {
        let reg = self.inner.dpdk.get()?;
        let at = self.inner.ptr.as_ptr() as usize;
        reg.chunks()
            .iter()
            .find(|m| {
                let s = m.addr().as_ptr() as usize;
                at >= s && at < s + m.len()
            })
            .map(|m| &**m)
    }

    /// Every DPDK registration that covers the region (more than one for
    /// application memory that does not begin and end on page
    /// boundaries: see [`DpdkRegistration`]), once a DPDK port made them.
    pub fn dpdk_registrations(&self) -> Option<&DpdkRegistration> {
        self.inner.dpdk.get()
    }

    /// Registers the region's memory with EAL (once; later calls return
    /// the first registration), page by page at its page size; `true` in
    /// the second place if this call made it. Control path only. The
    /// caller must not ask under IOVA-as-PA for a heap region, whose pages
    /// are not pinned.
    pub(crate) fn register_with_dpdk(
        &self,
        eal: &Eal,
    ) -> Result<(&DpdkRegistration, bool), DpdkError> {
        if let Some(m) = self.inner.dpdk.get() {
            return Ok((m, false));
        }
        // A poisoned lock only means a panic elsewhere; it guards nothing
        // but the order of attempts.
        let _g = self
            .inner
            .dpdk_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(m) = self.inner.dpdk.get() {
            return Ok((m, false));
        }
        if !eal.iova_is_va() && !self.is_hugepage_backed() {
            return Err(DpdkError::with_message(
                "rte_extmem_register",
                libc::EINVAL,
                "memory without a stable physical address (IOVA-as-PA): use hugepages",
            ));
        }
        let (start, len) = self.inner.extent;
        // SAFETY: the extent is memory the region owns or was vouched for
        // (whole pages of `page_size` for the dataplane's own, the
        // region's bytes for application memory, whose partly covered
        // pages are therefore mapped), valid until the storage is dropped,
        // which drops `dpdk` (unregistering) first. Under IOVA-as-PA only
        // hugepage-backed memory gets here (checked above), whose pages
        // are pinned.
        let m = unsafe { DpdkRegistration::new(eal, start, start + len, self.inner.page_size) }?;
        let _ = self.inner.dpdk.set(m);
        match self.inner.dpdk.get() {
            Some(m) => Ok((m, true)),
            None => Err(DpdkError::with_message(
                "rte_extmem_register",
                libc::EINVAL,
                "registration lost",
            )),
        }
    }

    /// The IOVA of byte `offset` and how many of the `len` bytes from
    /// there a device can read as one IOVA-contiguous buffer: from the
    /// region's DPDK registration; without one, the address itself and all
    /// `len` bytes if `iova_is_va` (virtual devices under IOVA-as-VA need
    /// no registration), `None` otherwise (copy instead).
    pub fn dma_run(&self, offset: usize, len: usize, iova_is_va: bool) -> Option<(u64, usize)> {
        self.check(offset, len).ok()?;
        let ptr = self.as_ptr().wrapping_add(offset);
        match self.inner.dpdk.get() {
            Some(m) => m.contiguous(ptr, len),
            None => iova_is_va.then_some((ptr as u64, len)),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether the region is empty (never: creation refuses it).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The dataplane's name for this memory, passed through the STag
    /// table to [`Placement`].
    pub fn handle(&self) -> RegionHandle {
        self.inner.handle
    }

    /// The virtual address of byte 0: the usual base of the tagged offsets
    /// a registration gives out ("TO = VA", as rping and perftest expect),
    /// and the address a DMA mapping needs.
    pub fn addr(&self) -> u64 {
        self.inner.ptr.as_ptr() as u64
    }

    /// A raw pointer to byte 0, for registering the memory with a device
    /// (DMA mapping, external buffers). Accesses through it must follow the
    /// module's rules: a device's DMA is outside the Rust memory model;
    /// a CPU access must be atomic.
    pub fn as_ptr(&self) -> *const u8 {
        self.inner.ptr.as_ptr().cast_const()
    }

    /// Whether `self` and `other` are handles on the same memory.
    pub fn same(&self, other: &Region) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Stores `src` at `offset`; the caller checked bounds.
    fn store_at(&self, offset: usize, src: &[u8]) {
        debug_assert!(offset + src.len() <= self.inner.len);
        // SAFETY: `[offset, offset + src.len())` lies inside the region's
        // `len` bytes (checked by every caller), valid while `self` keeps
        // the storage alive; `src` is the caller's own buffer, not region
        // memory (a `&[u8]` cannot point into a region), so the two do
        // not overlap; every other access to region memory goes through
        // `shared::copy` too.
        unsafe { shared::copy(self.inner.ptr.as_ptr().add(offset), src.as_ptr(), src.len()) }
    }

    /// Loads `dst.len()` bytes from `offset`; the caller checked bounds.
    fn load_at(&self, offset: usize, dst: &mut [u8]) {
        debug_assert!(offset + dst.len() <= self.inner.len);
        // SAFETY: as in `store_at`, with the roles swapped.
        unsafe {
            shared::copy(
                dst.as_mut_ptr(),
                self.inner.ptr.as_ptr().add(offset),
                dst.len(),
            )
        }
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), MemoryError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.inner.len => Ok(()),
            _ => Err(MemoryError::OutOfBounds),
        }
    }

    /// Starts bringing `[offset, offset + len)` into the CPU's caches for
    /// a pass that will read it soon (a hint: out-of-range bytes are left
    /// out, nothing is read or changed).
    pub(crate) fn prefetch(&self, offset: usize, len: usize) {
        let end = offset.saturating_add(len).min(self.inner.len);
        if offset < end {
            shared::prefetch(self.inner.ptr.as_ptr().wrapping_add(offset), end - offset);
        }
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        self.check(offset, dst.len())?;
        self.load_at(offset, dst);
        Ok(())
    }

    /// Copies `dst.len()` bytes from `offset` into `dst` and returns
    /// their CRC32c extended from `crc` and their Internet checksum
    /// partial sum, reading each byte once ([`crate::pass`]).
    pub fn read_pass(
        &self,
        offset: usize,
        dst: &mut [u8],
        crc: u32,
    ) -> Result<(u32, u32), MemoryError> {
        self.check(offset, dst.len())?;
        // SAFETY: `[offset, offset + len)` lies inside the region (checked
        // above), valid while `self` keeps the storage alive, and is read
        // only as `copy_crc_sum` reads it; `dst` is an exclusive borrow of
        // memory outside every region, so the ranges are disjoint and
        // nobody else touches `dst`.
        Ok(unsafe {
            crate::pass::copy_crc_sum(
                dst.as_mut_ptr(),
                self.inner.ptr.as_ptr().add(offset),
                dst.len(),
                crc,
            )
        })
    }

    /// Whether the region holds `expected` at `offset` (a verifying
    /// receiver's check of each message): compared in place, one read of
    /// each byte, where the CPU allows (`shared::equal_blocks`); the
    /// rest through a small buffer on the stack, a piece at a time while
    /// it is in L1.
    pub fn equals(&self, offset: usize, expected: &[u8]) -> Result<bool, MemoryError> {
        self.check(offset, expected.len())?;
        // SAFETY: `[offset, offset + len)` lies inside the region (checked
        // above), valid while `self` keeps the storage alive, and is read
        // only as `equal_blocks` reads it; `expected` holds `len` bytes.
        let same = unsafe {
            shared::equal_blocks(
                self.inner.ptr.as_ptr().add(offset),
                expected,
                expected.len(),
            )
        };
        const PIECE: usize = 4096;
        let mut buf = [0u8; PIECE];
        for (i, want) in expected[same..].chunks(PIECE).enumerate() {
            let got = &mut buf[..want.len()];
            self.load_at(offset + same + i * PIECE, got);
            if got != want {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Copies `src` into the region at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        self.check(offset, src.len())?;
        self.store_at(offset, src);
        Ok(())
    }

    /// Sets `len` bytes from `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), MemoryError> {
        self.check(offset, len)?;
        let chunk = [byte; PASS_CHUNK];
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let n = (end - at).min(PASS_CHUNK);
            self.store_at(at, &chunk[..n]);
            at += n;
        }
        Ok(())
    }

    /// The bytes `[offset, offset + len)` as a vector (tests, the control
    /// path).
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, MemoryError> {
        let mut v = vec![0; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// Extends CRC32c `crc` over `[offset, offset + len)` (the MPA CRC of
    /// an FPDU whose payload stays here).
    pub fn crc32c_append(&self, crc: u32, offset: usize, len: usize) -> u32 {
        // The sum comes from the same loads (two vector operations per 64
        // bytes): one pass serves both needs.
        self.crc32c_and_sum(crc, offset, len).0
    }

    /// The Internet checksum's partial sum (as
    /// [`tcp_offload::wire::checksum::sum`]) of `[offset, offset + len)`,
    /// taken as if the bytes started at an even offset: the TCP checksum
    /// of a payload sent by reference.
    pub fn checksum_sum(&self, offset: usize, len: usize) -> u32 {
        self.crc32c_and_sum(0, offset, len).1
    }

    /// Extends CRC32c `crc` over `[offset, offset + len)` and returns it
    /// with the Internet checksum's partial sum of the same bytes (as
    /// [`Region::checksum_sum`]), in one pass: each chunk is loaded once
    /// and both run over it while it is in L1. The send path's FPDU CRC
    /// and the TCP checksum of the segment that carries the payload, on
    /// ports that cannot offload the checksum (ARCHITECTURE.md,
    /// "Checksums").
    pub fn crc32c_and_sum(&self, crc: u32, offset: usize, len: usize) -> (u32, u32) {
        use tcp_offload::wire::checksum;
        let (mut crc, mut acc) = (crc, 0u32);
        if self.check(offset, len).is_err() {
            debug_assert!(false, "pass outside the region");
            return (crc, acc);
        }
        // One read of each byte: copied into a stack buffer (which nobody
        // else sees) by the payload pass, CRC and sum from the same loads.
        let mut buf = core::mem::MaybeUninit::<[u8; PASS_CHUNK]>::uninit();
        let base = buf.as_mut_ptr().cast::<u8>();
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let n = (end - at).min(PASS_CHUNK);
            // SAFETY: `[at, at + n)` lies inside the region (checked
            // above), valid while `self` keeps the storage alive, and is
            // read as the pass reads it; `base` is this stack buffer of
            // `PASS_CHUNK >= n` bytes, private to this call.
            let (c, sum) =
                unsafe { crate::pass::copy_crc_sum(base, self.inner.ptr.as_ptr().add(at), n, crc) };
            crc = c;
            // PASS_CHUNK is even: every chunk starts at an even offset of
            // the range, so sums add without a byte swap.
            acc = checksum::combine(acc, sum);
            at += n;
        }
        (crc, acc)
    }

    /// Copies `[offset, offset + dst.len())` into `dst` for a port that
    /// builds whole frames; nothing if out of range (the caller checked).
    pub(crate) fn copy_out(&self, offset: usize, dst: &mut [u8]) {
        if self.read(offset, dst).is_err() {
            debug_assert!(false, "copy outside the region");
        }
    }
}

/// `len` bytes of a region at `offset`, held by reference: what a frame
/// carries when its payload is attached rather than copied. Holding it
/// keeps the memory alive (the external buffer's reference count, in DPDK
/// terms).
#[derive(Debug, Clone)]
pub struct RegionSlice {
    /// The memory.
    pub region: Region,
    /// First byte.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

// ---------------------------------------------------------------------
// External buffers: region memory attached to DPDK mbufs.
// ---------------------------------------------------------------------

/// Region memory attached to an mbuf as an external buffer: the slot that
/// observes the driver's release and a handle that keeps the memory alive
/// until then. The DPDK port keeps it in its queue's in-flight list and
/// drops it once [`ExtPin::in_flight`] turns false. Dropped while still in
/// flight (a queue torn down with mbufs still in a ring), it parks itself
/// in a process-wide list instead, so the memory outlives the last mbuf
/// that points into it; [`reap_parked`] frees what was released since.
#[derive(Debug)]
pub struct ExtPin {
    inner: Option<(dpdk_bindings::ExtBuf, Region)>,
}

/// Pins dropped while their mbuf was still alive.
static PARKED: Mutex<Vec<ExtPin>> = Mutex::new(Vec::new());

impl ExtPin {
    /// Whether an mbuf still points into the memory.
    pub fn in_flight(&self) -> bool {
        self.inner.as_ref().is_some_and(|(b, _)| b.is_in_flight())
    }
}

impl Drop for ExtPin {
    fn drop(&mut self) {
        if self.in_flight() {
            let pin = ExtPin {
                inner: self.inner.take(),
            };
            PARKED.lock().unwrap_or_else(|e| e.into_inner()).push(pin);
        }
    }
}

/// Frees the parked pins whose mbufs are gone; returns how many are still
/// parked.
pub fn reap_parked() -> usize {
    let mut parked = PARKED.lock().unwrap_or_else(|e| e.into_inner());
    let mut keep = Vec::new();
    for mut p in parked.drain(..) {
        if p.in_flight() {
            keep.push(ExtPin {
                inner: p.inner.take(),
            });
        }
    }
    *parked = keep;
    parked.len()
}

/// Makes the empty mbuf `m` carry `slice` by reference (zero-copy TX) as
/// one external buffer at device address `iova`, accounted to the slot
/// `ext`; the returned pin keeps the region alive until the driver (or,
/// over `net_ring`, the receiver) frees the mbuf.
///
/// `iova` and the slice come from [`Region::dma_run`]: the IOVA the
/// region's DPDK registration recorded for those bytes, which are
/// IOVA-contiguous, or (no registration, IOVA-as-VA) the address itself.
pub fn attach_ext(
    m: &mut dpdk_bindings::Mbuf,
    slice: &RegionSlice,
    iova: u64,
    ext: dpdk_bindings::ExtBuf,
) -> Result<ExtPin, dpdk_bindings::ExtBuf> {
    let Ok(len) = u16::try_from(slice.len) else {
        return Err(ext);
    };
    if len == 0 || slice.region.check(slice.offset, slice.len).is_err() {
        return Err(ext);
    }
    let base = slice.region.as_ptr();
    let Some(addr) = core::ptr::NonNull::new(base.wrapping_add(slice.offset).cast_mut()) else {
        return Err(ext);
    };
    // SAFETY: `addr..addr + len` lies inside the region (checked above),
    // whose pages stay allocated while the returned pin holds a handle,
    // and the pin is kept (in the queue's list, or parked by its `Drop`)
    // until the slot is no longer in flight, i.e. until the last mbuf that
    // points here is freed. The caller took `iova` from `Region::dma_run`
    // for exactly this range: the registration's IOVA of an
    // IOVA-contiguous run, or the address under IOVA-as-VA. Writes while
    // the mbuf is alive are the application's to avoid, as on an RNIC: a
    // Send or Write buffer must not change before its completion, which
    // comes after TCP's acknowledgement; a device (or `net_ring`'s
    // receiver) reading concurrently written bytes gets unspecified bytes,
    // the same stance the module takes for DMA.
    let r = unsafe { m.attach_extbuf(addr, iova, len, &ext) };
    match r {
        Ok(()) => Ok(ExtPin {
            inner: Some((ext, slice.region.clone())),
        }),
        Err(_) => Err(ext),
    }
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    region: Region,
    /// Registrations on this worker that name the region.
    users: u32,
}

/// One worker's view of registered memory: region handle → [`Region`],
/// filled by the control path as registrations arrive, emptied as the
/// worker's STag table releases them. Lookup is a vector index; nothing
/// here is shared or locked.
#[derive(Debug, Default)]
pub struct MemoryTable {
    slots: Vec<Option<Slot>>,
    /// Placement calls that named a region this worker does not know
    /// (a broken invariant; counted, and the engine ends the stream with
    /// a local catastrophic error instead of completing the message).
    misses: u64,
    /// Take the TCP checksum's payload sum in the CRC pass (a port
    /// without checksum offload).
    sum_with_crc: bool,
    /// The transmit path copies payload into frames and computes the CRC
    /// there ([`Placement::crc_at_transmit`]).
    crc_at_transmit: bool,
}

impl MemoryTable {
    /// An empty table.
    pub fn new() -> MemoryTable {
        MemoryTable::default()
    }

    /// An empty table whose send path takes each FPDU payload's TCP
    /// checksum sum in its CRC pass when `sum_with_crc` (the port cannot
    /// offload the checksum; see [`Placement::sum_with_crc`]).
    pub fn with_sum_with_crc(sum_with_crc: bool) -> MemoryTable {
        MemoryTable {
            sum_with_crc,
            ..MemoryTable::default()
        }
    }

    /// Says whether the transmit path computes the MPA CRC of FPDUs with
    /// payload itself, in the pass that copies the payload into the frame
    /// (a port that takes no payload by reference; see
    /// [`Placement::crc_at_transmit`]).
    pub fn set_crc_at_transmit(&mut self, on: bool) {
        self.crc_at_transmit = on;
    }

    /// Records one more registration of `region` (the first one makes it
    /// known to this worker).
    pub fn insert(&mut self, region: &Region) {
        let (index, generation) = split_handle(region.handle());
        if self.slots.len() <= index {
            self.slots.resize_with(index + 1, || None);
        }
        match &mut self.slots[index] {
            Some(s) if s.generation == generation => s.users += 1,
            slot => {
                *slot = Some(Slot {
                    generation,
                    region: region.clone(),
                    users: 1,
                })
            }
        }
    }

    /// One registration of `handle` is gone; the last one drops this
    /// worker's reference to the memory.
    pub fn release(&mut self, handle: RegionHandle) {
        let (index, generation) = split_handle(handle);
        if let Some(slot) = self.slots.get_mut(index) {
            if let Some(s) = slot.as_mut().filter(|s| s.generation == generation) {
                s.users -= 1;
                if s.users == 0 {
                    *slot = None;
                }
            }
        }
    }

    /// The region named `handle`, if this worker knows it.
    pub fn get(&self, handle: RegionHandle) -> Option<&Region> {
        let (index, generation) = split_handle(handle);
        self.slots
            .get(index)?
            .as_ref()
            .filter(|s| s.generation == generation)
            .map(|s| &s.region)
    }

    /// Regions known.
    pub fn len(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Whether no region is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Placement calls that named an unknown region.
    pub fn misses(&self) -> u64 {
        self.misses
    }

    fn range(&self, r: &CheckedRange<'_>) -> Option<(&Region, usize)> {
        let region = self.get(r.region())?;
        let offset = usize::try_from(r.offset()).ok()?;
        Some((region, offset))
    }
}

/// The most bytes a placement hints ahead of itself (see
/// `MemoryTable::write`).
const PLACE_AHEAD: usize = 2048;

impl Placement for MemoryTable {
    fn write(&mut self, dst: CheckedRange<'_>, data: &[u8]) -> Result<(), Unplaced> {
        let ok = match self.range(&dst) {
            Some((region, offset)) => {
                let ok = region.write(offset, data).is_ok();
                // The next FPDU of a message is most often placed right
                // after this one: start bringing those lines in while
                // this frame's work goes on (with thousands of queue
                // pairs the destination is in memory, not in cache). The
                // first lines are enough for the hardware to follow on
                // a long FPDU; more would cost where they are cached.
                region.prefetch(offset + data.len(), data.len().min(PLACE_AHEAD));
                ok
            }
            None => false,
        };
        if ok {
            Ok(())
        } else {
            self.misses += 1;
            Err(Unplaced)
        }
    }

    fn read(&self, src: CheckedRange<'_>, dst: &mut [u8]) {
        if let Some((region, offset)) = self.range(&src) {
            if region.read(offset, dst).is_ok() {
                return;
            }
        }
        debug_assert!(false, "read of an unknown region");
        dst.fill(0);
    }

    fn crc32c_append(&self, crc: u32, src: CheckedRange<'_>) -> u32 {
        match self.range(&src) {
            Some((region, offset)) => region.crc32c_append(crc, offset, src.len() as usize),
            None => crc,
        }
    }

    fn sum_with_crc(&self) -> bool {
        self.sum_with_crc
    }

    fn crc_at_transmit(&self) -> bool {
        self.crc_at_transmit
    }

    fn crc32c_and_sum(&self, crc: u32, src: CheckedRange<'_>) -> (u32, u32) {
        match self.range(&src) {
            Some((region, offset)) => region.crc32c_and_sum(crc, offset, src.len() as usize),
            None => (crc, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::Ordering;

    #[test]
    fn equals_finds_a_difference_in_any_piece_and_checks_bounds() {
        let r = Region::new(20_000).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 13 + 5) as u8).collect();
        r.write(777, &data).unwrap();
        assert_eq!(r.equals(777, &data), Ok(true));
        assert_eq!(r.equals(777, &data[..1]), Ok(true));
        assert_eq!(r.equals(777, &[]), Ok(true));
        for at in [0, 4095, 4096, 9_999] {
            let mut other = data.clone();
            other[at] ^= 1;
            assert_eq!(r.equals(777, &other), Ok(false), "byte {at}");
        }
        assert_eq!(r.equals(778, &data), Ok(false));
        assert_eq!(r.equals(19_999, &data[..2]), Err(MemoryError::OutOfBounds));
    }

    #[test]
    fn region_is_page_aligned_zeroed_and_bounded() {
        let r = Region::new(10_000).unwrap();
        assert_eq!(r.addr() % PAGE_SIZE as u64, 0);
        assert_eq!(r.len(), 10_000);
        assert!(r.to_vec(0, 10_000).unwrap().iter().all(|&b| b == 0));
        assert_eq!(r.write(9_999, &[1, 2]), Err(MemoryError::OutOfBounds));
        assert_eq!(r.read(usize::MAX, &mut [0]), Err(MemoryError::OutOfBounds));
        assert_eq!(Region::new(0).unwrap_err(), MemoryError::Empty);
    }

    /// A prefetch is a hint: any offset and length, however far past the
    /// end, leaves the bytes as they were and faults nowhere (the part past
    /// the end is not even hinted: the mapping may end there).
    #[test]
    fn prefetch_changes_nothing_and_stays_inside() {
        let r = Region::new(10_000).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        r.write(0, &data).unwrap();
        for (offset, len) in [
            (0, 10_000),
            (1, 63),
            (9_999, 1),
            (9_999, usize::MAX),
            (10_000, 64),
            (usize::MAX, usize::MAX),
            (5_000, 0),
        ] {
            r.prefetch(offset, len);
        }
        assert_eq!(r.to_vec(0, 10_000).unwrap(), data);
    }

    /// A prefetch for writing changes no byte, and no address makes it
    /// fault: past the end of a buffer, null, unmapped, the end of the
    /// address space.
    #[test]
    fn prefetch_for_writing_changes_nothing_and_never_faults() {
        let data: Vec<u8> = (0..5_000u32).map(|i| (i * 13) as u8).collect();
        let copy = data.clone();
        super::prefetch_write(data.as_ptr(), data.len());
        super::prefetch_write(data.as_ptr().wrapping_add(4_999), 4_096);
        super::prefetch_write(core::ptr::null(), 4_096);
        super::prefetch_write(usize::MAX as *const u8, 64);
        super::prefetch_write(0x10 as *const u8, 0);
        assert_eq!(data, copy);
    }

    /// A large region has its own mapping, aligned for a transparent huge
    /// page, zeroed, bounded, and usable to its last byte; a smaller one
    /// stays on the heap.
    #[test]
    fn large_regions_have_an_aligned_mapping_of_their_own() {
        let len = ANON_MIN + 5;
        let r = Region::new(len).unwrap();
        assert!(matches!(r.inner.backing, Backing::Anon(_)));
        assert_eq!(r.addr() % ANON_MIN as u64, 0);
        assert_eq!(r.len(), len);
        assert_eq!(r.page_size(), PAGE_SIZE);
        assert!(r.to_vec(0, len).unwrap().iter().all(|&b| b == 0));
        r.write(len - 3, &[7, 8, 9]).unwrap();
        r.write(0, &[1]).unwrap();
        let mut end = [0u8; 4];
        r.read(len - 4, &mut end).unwrap();
        assert_eq!(end, [0, 7, 8, 9]);
        assert_eq!(r.write(len - 2, &[1, 2, 3]), Err(MemoryError::OutOfBounds));
        drop(r);
        let small = Region::new(ANON_MIN - 1).unwrap();
        assert!(matches!(small.inner.backing, Backing::Heap(_)));
    }

    #[test]
    fn unaligned_writes_and_reads_round_trip_and_keep_neighbours() {
        let r = Region::new(256).unwrap();
        r.fill(0, 256, 0xee).unwrap();
        for start in 0..17 {
            for len in 0..40 {
                let data: Vec<u8> = (0..len).map(|i| (start * 31 + i) as u8).collect();
                r.fill(0, 256, 0xee).unwrap();
                r.write(start + 50, &data).unwrap();
                let all = r.to_vec(0, 256).unwrap();
                assert_eq!(&all[start + 50..start + 50 + len], &data[..]);
                assert!(all[..start + 50].iter().all(|&b| b == 0xee));
                assert!(all[start + 50 + len..].iter().all(|&b| b == 0xee));
                let mut back = vec![0; len];
                r.read(start + 50, &mut back).unwrap();
                assert_eq!(back, data);
            }
        }
    }

    #[test]
    fn crc_and_checksum_passes_match_slices() {
        let r = Region::new(3 * PASS_CHUNK + 77).unwrap();
        let data: Vec<u8> = (0..r.len()).map(|i| (i * 7 + 3) as u8).collect();
        r.write(0, &data).unwrap();
        for (off, len) in [(0, 1), (3, 5000), (1, r.len() - 1), (PASS_CHUNK - 1, 3)] {
            let s = &data[off..off + len];
            assert_eq!(r.crc32c_append(9, off, len), crc32c::crc32c_append(9, s));
            let a = tcp_offload::wire::checksum::fold(r.checksum_sum(off, len));
            let b = tcp_offload::wire::checksum::fold(tcp_offload::wire::checksum::sum(s));
            assert_eq!(a, b, "checksum at {off}+{len}");
        }
    }

    #[test]
    fn folded_pass_equals_the_separate_passes() {
        use tcp_offload::wire::checksum::{fold, sum};
        let r = Region::new(3 * PASS_CHUNK + 77).unwrap();
        let data: Vec<u8> = (0..r.len()).map(|i| (i * 13 + i / 97) as u8).collect();
        r.write(0, &data).unwrap();
        let cases = [
            (0, 1),
            (1, 1),
            (0, 2),
            (1, 2),
            (0, PASS_CHUNK),
            (1, PASS_CHUNK),
            (PASS_CHUNK - 1, 3),
            (3, 5001),
            (2, 5000),
            (1, r.len() - 1),
            (0, r.len()),
        ];
        for (off, len) in cases {
            let s = &data[off..off + len];
            let (crc, folded) = r.crc32c_and_sum(7, off, len);
            assert_eq!(crc, r.crc32c_append(7, off, len), "crc at {off}+{len}");
            assert_eq!(crc, crc32c::crc32c_append(7, s), "crc at {off}+{len}");
            assert_eq!(
                fold(folded),
                fold(r.checksum_sum(off, len)),
                "sum at {off}+{len}"
            );
            assert_eq!(fold(folded), fold(sum(s)), "sum at {off}+{len}");
        }
    }

    #[test]
    fn hugepage_regions_or_a_clear_error() {
        let opts = |fallback_to_heap| RegionOptions {
            hugepages: true,
            fallback_to_heap,
        };
        match Region::new_hugepage(5000) {
            Ok(r) => {
                assert!(r.is_hugepage_backed());
                assert_eq!(r.page_size(), HUGE_PAGE_SIZE);
                assert_eq!(r.addr() % HUGE_PAGE_SIZE as u64, 0);
                assert_eq!(r.len(), 5000);
                assert!(r.to_vec(0, 5000).unwrap().iter().all(|&b| b == 0));
                r.write(4090, b"across").unwrap();
                assert_eq!(r.to_vec(4090, 6).unwrap(), b"across");
                assert_eq!(r.write(4999, &[1, 2]), Err(MemoryError::OutOfBounds));
                assert!(Region::with_options(5000, opts(false))
                    .unwrap()
                    .is_hugepage_backed());
            }
            Err(e @ MemoryError::NoHugepages { needed, .. }) => {
                assert_eq!(needed, 1);
                assert!(e.to_string().contains("nr_hugepages"), "{e}");
                assert_eq!(Region::with_options(5000, opts(false)).unwrap_err(), e);
                let r = Region::with_options(5000, opts(true)).unwrap();
                assert!(!r.is_hugepage_backed());
                assert_eq!(r.page_size(), PAGE_SIZE);
            }
            Err(e) => panic!("unexpected: {e}"),
        }
        assert!(!Region::with_options(5000, RegionOptions::default())
            .unwrap()
            .is_hugepage_backed());
        assert_eq!(Region::new_hugepage(0).unwrap_err(), MemoryError::Empty);
    }

    #[test]
    fn a_placement_into_a_region_the_table_lacks_fails_and_is_counted() {
        use rdmap::placement::MemSpan;
        use rdmap::verbs::{Access, Device, DeviceLimits};
        let region = Region::new(64).unwrap();
        let mut dev = Device::new(DeviceLimits::default());
        let pd = dev.alloc_pd().unwrap();
        let span = MemSpan::new(region.handle(), 0, 64);
        let stag = dev
            .reg_mr(pd, span, 0x1000, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let range = || {
            dev.mrs()
                .check_remote_write(stag, 0x1008, 4, pd)
                .unwrap()
                .unwrap()
        };
        let mut t = MemoryTable::new();
        // The STag table knows the region, this worker does not.
        assert_eq!(t.write(range(), &[1, 2, 3, 4]), Err(Unplaced));
        assert_eq!(t.misses(), 1);
        assert_eq!(region.to_vec(0, 64).unwrap(), vec![0; 64]);
        t.insert(&region);
        assert_eq!(t.write(range(), &[1, 2, 3, 4]), Ok(()));
        assert_eq!(t.misses(), 1);
        assert_eq!(region.to_vec(8, 4).unwrap(), [1, 2, 3, 4]);
    }

    #[test]
    fn handles_are_reused_with_a_new_generation() {
        let a = Region::new(1).unwrap();
        let ha = a.handle();
        drop(a);
        let b = Region::new(1).unwrap();
        assert_ne!(ha, b.handle());
        let mut t = MemoryTable::new();
        t.insert(&b);
        t.insert(&b);
        assert!(t.get(ha).is_none() || split_handle(ha).0 != split_handle(b.handle()).0);
        assert!(t.get(b.handle()).is_some_and(|r| r.same(&b)));
        t.release(b.handle());
        assert!(t.get(b.handle()).is_some());
        t.release(b.handle());
        assert!(t.get(b.handle()).is_none());
        assert!(t.is_empty());
    }

    /// Writes and reads of every shape at the start, middle and end of
    /// `r`, whose bytes were `original`: each lands where asked and
    /// nowhere else.
    fn check_round_trips(r: &Region, original: &[u8]) {
        let n = r.len();
        assert_eq!(r.to_vec(0, n).unwrap(), original);
        for start in [0, 1, 3, 7, 8, 9, n / 2, n - 10, n - 7] {
            for len in [0, 1, 2, 7, 8, 9, 15, 17] {
                if start + len > n {
                    continue;
                }
                let data: Vec<u8> = (0..len).map(|i| (start + i * 31) as u8 ^ 0x5a).collect();
                r.write(start, &data).unwrap();
                let all = r.to_vec(0, n).unwrap();
                assert_eq!(&all[start..start + len], &data[..], "{start}+{len}");
                assert_eq!(all[..start], original[..start]);
                assert_eq!(all[start + len..], original[start + len..]);
                r.write(start, &original[start..start + len]).unwrap();
            }
        }
        assert_eq!(r.write(n - 1, &[1, 2]), Err(MemoryError::OutOfBounds));
        let crc = r.crc32c_append(3, 1, n - 2);
        assert_eq!(crc, crc32c::crc32c_append(3, &original[1..n - 1]));
        let (c2, sum) = r.crc32c_and_sum(3, 1, n - 2);
        assert_eq!(c2, crc);
        assert_eq!(
            tcp_offload::wire::checksum::fold(sum),
            tcp_offload::wire::checksum::fold(tcp_offload::wire::checksum::sum(
                &original[1..n - 1]
            ))
        );
    }

    #[test]
    fn vec_regions_round_trip_and_come_back() {
        let original: Vec<u8> = (0..300).map(|i| (i * 7) as u8).collect();
        let buf = original.clone();
        let ptr = buf.as_ptr();
        let r = Region::from_vec(buf).unwrap();
        assert!(r.is_vec_backed());
        assert_eq!(r.as_ptr(), ptr, "no copy");
        assert_eq!(r.len(), 300);
        check_round_trips(&r, &original);
        let other = r.clone();
        assert_eq!(r.handles(), 2);
        let r = r.into_inner().expect_err("shared: not given back");
        drop(other);
        let back = r.into_inner().expect("given back once alone");
        assert_eq!(back, original);
        assert_eq!(back.as_ptr(), ptr);
        let boxed: Box<[u8]> = back.into_boxed_slice();
        let r = Region::from_boxed_slice(boxed).unwrap();
        assert_eq!(r.as_ptr(), ptr, "no copy");
        let again = r.into_inner().unwrap().into_boxed_slice();
        assert_eq!((&*again, again.as_ptr()), (&original[..], ptr));
        assert_eq!(
            Region::from_vec(Vec::new()).unwrap_err(),
            MemoryError::Empty
        );
        let heap = Region::new(10).unwrap();
        assert!(!heap.is_vec_backed());
        assert!(heap.into_inner().is_err(), "a heap region owns no vector");
    }

    #[test]
    fn raw_regions_at_every_alignment_round_trip() {
        for skew in 0..=WORD {
            for len in [1, 5, 8, 13, 64, 301] {
                // The region starts `skew` bytes into a boxed buffer, so
                // that byte 0 falls on every position of a word.
                let whole: Box<[u8]> = (0..len + skew + 8).map(|i| (i * 13) as u8).collect();
                let original = whole[skew..skew + len].to_vec();
                let outside = whole.to_vec();
                let raw = Box::into_raw(whole);
                let start = NonNull::new(raw.cast::<u8>().wrapping_add(skew)).unwrap();
                let back = Arc::new(Mutex::new(None));
                let slot = back.clone();
                let addr = raw as *mut u8 as usize;
                let total = len + skew + 8;
                let release = move || {
                    let p = core::ptr::slice_from_raw_parts_mut(addr as *mut u8, total);
                    // SAFETY: the box leaked above, returned once.
                    *slot.lock().unwrap() = Some(unsafe { Box::from_raw(p) });
                };
                // SAFETY: the box is ours, reached only through the region
                // until the callback hands it back.
                let r = unsafe { Region::from_raw_parts(start, len, release) }.unwrap();
                if len >= 12 {
                    check_round_trips(&r, &original);
                } else {
                    assert_eq!(r.to_vec(0, len).unwrap(), original);
                    r.write(0, &vec![0xff; len]).unwrap();
                    r.write(0, &original).unwrap();
                }
                r.fill(0, len, 0xee).unwrap();
                drop(r);
                let whole = back.lock().unwrap().take().expect("released");
                assert!(whole[skew..skew + len].iter().all(|&b| b == 0xee));
                assert_eq!(whole[..skew], outside[..skew], "nothing written before");
                assert_eq!(whole[skew + len..], outside[skew + len..], "nor after");
            }
        }
    }

    #[test]
    fn mapped_regions_release_after_the_last_handle() {
        use std::sync::atomic::AtomicUsize;
        let len = 3 * PAGE_SIZE;
        // SAFETY: a fresh private anonymous mapping, unmapped below by the
        // release callback only.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let base = NonNull::new(p.cast::<u8>()).unwrap();
        let released = Arc::new(AtomicUsize::new(0));
        let rel = released.clone();
        let addr = p as usize;
        // The region is the middle of the mapping, not word-aligned.
        let start = NonNull::new(base.as_ptr().wrapping_add(PAGE_SIZE - 3)).unwrap();
        let release = move || {
            rel.fetch_add(1, Ordering::SeqCst);
            // SAFETY: the mapping made above, no longer referred to.
            unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        };
        // SAFETY: the mapping is ours and stays mapped until the callback,
        // which unmaps it; nothing else reaches it meanwhile.
        let r = unsafe { Region::from_raw_parts(start, PAGE_SIZE + 6, release) }.unwrap();
        r.write(0, b"edges").unwrap();
        r.write(PAGE_SIZE + 1, b"edges").unwrap();
        assert_eq!(r.to_vec(0, 5).unwrap(), b"edges");
        assert_eq!(r.to_vec(PAGE_SIZE + 1, 5).unwrap(), b"edges");
        assert_eq!(
            r.write(PAGE_SIZE + 2, b"edges"),
            Err(MemoryError::OutOfBounds)
        );
        let clone = r.clone();
        drop(r);
        assert_eq!(released.load(Ordering::SeqCst), 0, "a handle is left");
        assert!(
            clone.into_inner().is_err(),
            "foreign memory is not a vector"
        );
        assert_eq!(
            released.load(Ordering::SeqCst),
            1,
            "released once, at the last handle"
        );
        // A refused region does not run its callback.
        let never = Arc::new(AtomicUsize::new(0));
        let n2 = never.clone();
        // SAFETY: refused before the memory is touched.
        let e = unsafe {
            Region::from_raw_parts(NonNull::dangling(), 0, move || {
                n2.fetch_add(1, Ordering::SeqCst);
            })
        };
        assert_eq!(e.unwrap_err(), MemoryError::Empty);
        assert_eq!(never.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn concurrent_writers_of_neighbouring_bytes_lose_nothing() {
        let r = Region::new(64).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let r = r.clone();
                s.spawn(move || {
                    for i in 0..2000 {
                        // Thread t owns bytes t, t+4, t+8, ...: every word
                        // is shared by all four.
                        let at = usize::from(t) + 4 * (i % 16);
                        r.write(at, &[t.wrapping_add(i as u8)]).unwrap();
                    }
                    for k in 0..16 {
                        r.write(usize::from(t) + 4 * k, &[0x10 + t]).unwrap();
                    }
                });
            }
        });
        let all = r.to_vec(0, 64).unwrap();
        for (i, b) in all.iter().enumerate() {
            assert_eq!(*b, 0x10 + (i % 4) as u8);
        }
    }
}
