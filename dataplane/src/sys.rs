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
