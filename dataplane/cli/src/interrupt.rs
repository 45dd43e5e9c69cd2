//! Stopping cleanly on SIGINT and SIGTERM: the signal handler the long
//! runs (`perf`, `rping`, `serve`) install before they start, and the flag
//! their loops poll. The crate's only `unsafe` (sigaction(2)) is here.

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_interrupt(_signal: libc::c_int) {
    // An atomic store and nothing else: async-signal-safe.
    INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Makes the first SIGINT or SIGTERM set a flag ([`interrupted`]) instead
/// of killing the process, so that a run that polls the flag stops
/// cleanly: it closes its connections, reports what it did, and drops its
/// dataplane, which removes EAL's runtime directory (a killed process
/// leaves it in `/var/run/dpdk`). A second signal kills as usual.
pub fn catch_interrupts() {
    let handler: extern "C" fn(libc::c_int) = on_interrupt;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed `sigaction` is a valid one (empty mask, no
        // flags), filled in before use; the handler only stores to an
        // atomic, and SA_RESETHAND puts the default action back after its
        // first run. A failure leaves the default action, which is safe.
        unsafe {
            let mut action: libc::sigaction = core::mem::zeroed();
            action.sa_sigaction = handler as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, core::ptr::null_mut());
        }
    }
}

/// Whether SIGINT or SIGTERM arrived since [`catch_interrupts`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed)
}
