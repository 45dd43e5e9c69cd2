//! The Environment Abstraction Layer: started once per process, kept alive by
//! every DPDK object made from it, cleaned up when the last one is dropped.
//!
//! Worker threads pinned with `core_affinity` register as EAL lcores
//! ([`Eal::register_thread`]) so that mempool per-core caches work for them;
//! an unregistered thread gets no cache and contends on every alloc/free.

use std::ffi::{c_char, CStr, CString};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::DpdkError;
use crate::sys;

/// Set by the first [`Eal::init`]; DPDK cannot start twice in one process,
/// not even after `rte_eal_cleanup`.
static STARTED: AtomicBool = AtomicBool::new(false);

/// Program name passed as `argv[0]`; EAL only uses it in log lines.
const PROGRAM: &str = "iwarp";

/// A handle on the running EAL. Cloning is cheap; `rte_eal_cleanup` runs when
/// the last clone (including those held by pools, ports and rings) is dropped.
#[derive(Clone, Debug)]
pub struct Eal {
    inner: Arc<EalInner>,
}

#[derive(Debug)]
struct EalInner {
    runtime_dir: Option<PathBuf>,
    primary: bool,
}

impl Eal {
    /// Starts EAL with `args` (EAL options only, without a program name),
    /// e.g. `["-l", "0", "--no-huge", "-m", "256", "--file-prefix", "t1",
    /// "--no-pci", "--vdev=net_ring0"]`.
    ///
    /// Every process should pass its own `--file-prefix`: a second process on
    /// the same prefix fails on DPDK's runtime config file. Succeeds once per
    /// process; any later call returns an `EALREADY` error.
    ///
    /// The calling thread keeps the CPUs it may run on: `rte_eal_init` pins
    /// it to the main lcore, and threads started from it later would all
    /// inherit that one core. Threads that should own a core pin
    /// themselves.
    pub fn init(args: &[&str]) -> Result<Eal, DpdkError> {
        if STARTED
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(DpdkError::with_message(
                "rte_eal_init",
                libc::EALREADY,
                "EAL was already started (or tried) in this process: it starts once per process",
            ));
        }
        let mut owned = Vec::with_capacity(args.len() + 1);
        for arg in std::iter::once(PROGRAM).chain(args.iter().copied()) {
            let c = CString::new(arg).map_err(|_| {
                DpdkError::with_message(
                    "rte_eal_init",
                    libc::EINVAL,
                    format!("argument {arg:?} has a NUL"),
                )
            })?;
            owned.push(c);
        }
        // EAL may keep pointers into argv (it permutes and saves it), so the
        // strings and the array live for the rest of the process.
        let owned: &'static mut [CString] = Vec::leak(owned);
        let argv: &'static mut [*mut c_char] =
            Vec::leak(owned.iter().map(|c| c.as_ptr().cast_mut()).collect());
        let argc = i32::try_from(argv.len()).map_err(|_| {
            DpdkError::with_message("rte_eal_init", libc::E2BIG, "too many EAL arguments")
        })?;
        let affinity = CpuAffinity::of_this_thread();
        // SAFETY: argv holds argc valid NUL-terminated strings that outlive
        // the process; STARTED guarantees this is the only call.
        let ret = unsafe { sys::rte_eal_init(argc, argv.as_mut_ptr()) };
        // EAL pins the calling thread to its main lcore. Here that thread
        // is the application's, which runs no DPDK loop, and every thread
        // it starts afterwards (the dataplane's workers among them) would
        // inherit the one core: it gets back the CPUs it had.
        if let Some(a) = affinity {
            a.restore();
        }
        if ret < 0 {
            return Err(DpdkError::from_rte_errno("rte_eal_init"));
        }
        // SAFETY: EAL is initialised; the returned string is static in EAL.
        let dir = unsafe { sys::rte_eal_get_runtime_dir() };
        let runtime_dir = (!dir.is_null())
            // SAFETY: non-null, NUL-terminated, owned by EAL.
            .then(|| PathBuf::from(unsafe { CStr::from_ptr(dir) }.to_string_lossy().as_ref()));
        // SAFETY: EAL is initialised.
        let primary = unsafe { sys::rte_eal_process_type() } == sys::RTE_PROC_PRIMARY;
        Ok(Eal {
            inner: Arc::new(EalInner {
                runtime_dir,
                primary,
            }),
        })
    }

    /// Whether DPDK hands devices virtual addresses as IOVAs (always so with
    /// `--no-huge`): then an address's IOVA is the address itself.
    pub fn iova_is_va(&self) -> bool {
        // SAFETY: EAL is running while `self` exists.
        unsafe { sys::rte_eal_iova_mode() == sys::RTE_IOVA_VA }
    }

    /// Whether EAL runs on hugepages (false with `--no-huge`).
    pub fn has_hugepages(&self) -> bool {
        // SAFETY: EAL is running while `self` exists.
        unsafe { sys::rte_eal_has_hugepages() != 0 }
    }

    /// The directory of this process's runtime files
    /// (`/var/run/dpdk/<file-prefix>` as root); removed after cleanup.
    pub fn runtime_dir(&self) -> Option<&std::path::Path> {
        self.inner.runtime_dir.as_deref()
    }

    /// TSC ticks per second, measured by EAL at start.
    pub fn tsc_hz(&self) -> u64 {
        // SAFETY: EAL is running while `self` exists.
        unsafe { sys::rte_get_tsc_hz() }
    }

    /// The lcore EAL runs `main` on (the first of `-l`).
    pub fn main_lcore(&self) -> u32 {
        // SAFETY: EAL is running while `self` exists.
        unsafe { sys::rte_get_main_lcore() }
    }

    /// The NUMA socket of the calling thread's lcore (0 when unknown).
    pub fn socket_id(&self) -> i32 {
        // SAFETY: EAL is running while `self` exists.
        let s = unsafe { sys::rte_socket_id() };
        i32::try_from(s).unwrap_or(0)
    }

    /// Registers the calling thread (pinned by the caller, e.g. with
    /// `core_affinity`) as an EAL lcore, so that it gets an lcore id and
    /// mempool caches. Unregistered again when the guard drops, on the same
    /// thread (the guard is not `Send`).
    pub fn register_thread(&self) -> Result<ThreadRegistration, DpdkError> {
        if lcore_id().is_some() {
            return Err(DpdkError::with_message(
                "rte_thread_register",
                libc::EALREADY,
                "thread is already an EAL lcore",
            ));
        }
        // SAFETY: EAL is running; registers only the calling thread.
        let ret = unsafe { sys::rte_thread_register() };
        if ret < 0 {
            return Err(DpdkError::from_rte_errno("rte_thread_register"));
        }
        let lcore = lcore_id().ok_or_else(|| {
            DpdkError::with_message(
                "rte_thread_register",
                libc::EINVAL,
                "no lcore id after registration",
            )
        })?;
        Ok(ThreadRegistration {
            lcore,
            _eal: self.clone(),
            _not_send: PhantomData,
        })
    }
}

impl Drop for EalInner {
    fn drop(&mut self) {
        // SAFETY: the last handle is gone: no pool, port or ring made from
        // this EAL is left (each holds a clone), so nothing uses its memory.
        let ret = unsafe { sys::rte_eal_cleanup() };
        if ret < 0 {
            return;
        }
        // rte_eal_cleanup leaves the runtime directory (config file, fbarray
        // and socket files) behind; a primary with its own --file-prefix owns
        // it, so it goes too. A secondary leaves its primary's files alone.
        if self.primary {
            if let Some(dir) = &self.runtime_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// The calling thread's registration as an EAL lcore; unregisters on drop.
#[derive(Debug)]
pub struct ThreadRegistration {
    lcore: u32,
    _eal: Eal,
    /// rte_thread_unregister acts on the calling thread: stay on this one.
    _not_send: PhantomData<*const ()>,
}

impl ThreadRegistration {
    /// The lcore id EAL gave this thread.
    pub fn lcore_id(&self) -> u32 {
        self.lcore
    }
}

impl Drop for ThreadRegistration {
    fn drop(&mut self) {
        // SAFETY: runs on the thread that registered (the guard is !Send),
        // while EAL is alive (`_eal`).
        unsafe { sys::rte_thread_unregister() };
    }
}

/// The calling thread's EAL lcore id, or `None` for a thread EAL does not
/// know (`LCORE_ID_ANY`).
pub fn lcore_id() -> Option<u32> {
    // SAFETY: reads a thread-local; valid before and after EAL init.
    let id = unsafe { sys::shim_lcore_id() };
    (id != u32::MAX).then_some(id)
}

/// The CPU's time-stamp counter (`rte_get_tsc_cycles`); see
/// [`Eal::tsc_hz`] for its rate.
#[inline]
pub fn tsc() -> u64 {
    // SAFETY: reads the TSC; no preconditions.
    unsafe { sys::shim_get_tsc_cycles() }
}

/// The CPUs a thread may run on, saved to be put back.
struct CpuAffinity(libc::cpu_set_t);

impl CpuAffinity {
    /// The calling thread's CPU set, if the kernel reports it.
    fn of_this_thread() -> Option<CpuAffinity> {
        // SAFETY: an all-zero cpu_set_t is a valid (empty) set.
        let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
        // SAFETY: pid 0 is the calling thread; the size is the set's own.
        let rc = unsafe {
            libc::sched_getaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &mut set)
        };
        (rc == 0).then_some(CpuAffinity(set))
    }

    /// Gives the calling thread this CPU set again (best effort: a set the
    /// kernel refuses leaves the thread as it is).
    fn restore(&self) {
        // SAFETY: pid 0 is the calling thread; the set was read by
        // sched_getaffinity and is passed with its own size.
        let _ =
            unsafe { libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &self.0) };
    }
}
