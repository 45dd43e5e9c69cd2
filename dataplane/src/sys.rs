//! The system calls the dataplane makes itself, outside DPDK and the
//! registered-memory module: each needs `unsafe`, so they live here, small
//! and alone, and the rest of the crate denies `unsafe` code. Called from
//! a worker thread's start (never per packet). Also what a worker thread
//! learns about itself from the system at its start.

/// Asks the kernel to wake this thread within a microsecond of a timed
/// sleep's end instead of the default 50 µs, which would more than double
/// the idle back-off's short sleeps. Once per worker thread.
#[cfg(target_os = "linux")]
pub(crate) fn fine_timer_slack() {
    const SLACK_NS: libc::c_ulong = 1_000;
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and changes only
    // the calling thread's timer slack; no memory is passed.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, SLACK_NS, 0, 0, 0) };
}

/// Nothing to tune where the call does not exist.
#[cfg(not(target_os = "linux"))]
pub(crate) fn fine_timer_slack() {}

/// The calling thread's Linux thread id, from `/proc/thread-self` (a
/// link to `<pid>/task/<tid>`); `None` where there is no such file.
pub(crate) fn thread_id() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// The CPU's time-stamp counter (`RDTSC`): ticks at a rate that
/// [`tsc_is_clock_source`] says whether to trust.
#[cfg(target_arch = "x86_64")]
pub(crate) fn tsc() -> u64 {
    // SAFETY: RDTSC exists on every x86-64 CPU; it reads a counter into
    // registers and touches no memory.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn tsc() -> u64 {
    0
}

/// Whether the kernel keeps time with the time-stamp counter: it chooses
/// it only when the counter runs at a constant rate and agrees across
/// CPUs, which is what a clock scaled from it needs. Read once per
/// worker at its start, never on the data path.
pub(crate) fn tsc_is_clock_source() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == "tsc")
}

/// Zeroed anonymous memory (`mmap`), aligned to [`AnonMap::ALIGN`] and
/// offered to the kernel's transparent huge pages (`MADV_HUGEPAGE`, which
/// Debian's default "madvise" setting waits for), then written once per
/// page so that every page is present before it is used, as a registered
/// region's pages are. Registered buffers of 10,000 queue pairs span more
/// than a gigabyte: on 4 KiB pages nearly every frame's source and
/// destination missed the TLB, and the kernel zeroed their pages for the
/// heap's sake on top of the allocator's own zeroing. Unmapped on drop.
#[derive(Debug)]
pub(crate) struct AnonMap {
    /// The mapping as made, alignment slack included.
    map: core::ptr::NonNull<u8>,
    map_len: usize,
    /// Offset of the aligned start in it.
    offset: usize,
    len: usize,
}

// SAFETY: a plain owned mapping; nothing in it is tied to a thread.
unsafe impl Send for AnonMap {}
// SAFETY: `&self` only hands out the address.
unsafe impl Sync for AnonMap {}

impl AnonMap {
    /// The alignment of the start: a transparent huge page's.
    pub(crate) const ALIGN: usize = 2 << 20;

    /// `len` bytes (a multiple of 4096, not zero), zeroed and present;
    /// `None` when the kernel refuses the mapping.
    pub(crate) fn new(len: usize) -> Option<AnonMap> {
        debug_assert!(len > 0 && len.is_multiple_of(4096));
        let map_len = len.checked_add(Self::ALIGN)?;
        // SAFETY: a fresh private anonymous mapping at an address the
        // kernel picks; no existing memory is named.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let map = core::ptr::NonNull::new(p.cast::<u8>())?;
        let offset = (Self::ALIGN - (map.as_ptr() as usize) % Self::ALIGN) % Self::ALIGN;
        let m = AnonMap {
            map,
            map_len,
            offset,
            len,
        };
        let start = m.as_ptr().as_ptr();
        // SAFETY: `start..start + len` lies inside the mapping just made
        // (`offset + len <= map_len`). The advice is a hint: where the
        // kernel has no transparent huge pages it fails, and the mapping
        // stays on small pages, which is fine.
        let _ = unsafe { libc::madvise(start.cast(), len, libc::MADV_HUGEPAGE) };
        let mut at = 0;
        while at < len {
            // SAFETY: in bounds as above; nothing else can reach the
            // mapping yet. Writing the zero a fresh anonymous page already
            // holds makes the page present without changing it.
            unsafe { core::ptr::write_volatile(start.add(at), 0) };
            at += 4096;
        }
        Some(m)
    }

    /// The aligned start.
    pub(crate) fn as_ptr(&self) -> core::ptr::NonNull<u8> {
        // SAFETY: `offset < ALIGN` and the mapping is `len + ALIGN` long,
        // so the result is inside it and not null.
        unsafe { core::ptr::NonNull::new_unchecked(self.map.as_ptr().add(self.offset)) }
    }

    /// Bytes from [`AnonMap::as_ptr`].
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made, once; whoever
        // borrowed its memory (the region) is gone before its backing is
        // dropped.
        let _ = unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}
