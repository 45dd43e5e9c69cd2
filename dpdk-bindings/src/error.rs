//! The error of DPDK's control path: which call failed, DPDK's `rte_errno`
//! (or the negative return code), and DPDK's text for it. Only setup and
//! control operations return it; the fast path reports counts, not errors.

use std::ffi::CStr;
use std::fmt;

use crate::sys;

/// A failed DPDK call: the operation, its errno and DPDK's message for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkError {
    op: &'static str,
    errno: i32,
    message: String,
}

impl DpdkError {
    /// An error with DPDK's own message for `errno` (`rte_strerror`).
    pub fn new(op: &'static str, errno: i32) -> Self {
        Self {
            op,
            errno,
            message: strerror(errno),
        }
    }

    /// An error whose cause this crate detected, with its own message.
    pub fn with_message(op: &'static str, errno: i32, message: impl Into<String>) -> Self {
        Self {
            op,
            errno,
            message: message.into(),
        }
    }

    /// The error of a call that reports failure through `rte_errno`.
    pub(crate) fn from_rte_errno(op: &'static str) -> Self {
        // SAFETY: reads the calling thread's `rte_errno`; no preconditions.
        let errno = unsafe { sys::shim_rte_errno() };
        Self::new(op, errno)
    }

    /// The error of a call that returned a negative errno (`-EINVAL`), or -1
    /// with the cause in `rte_errno`.
    pub(crate) fn from_ret(op: &'static str, ret: i32) -> Self {
        if ret == -1 {
            Self::from_rte_errno(op)
        } else {
            Self::new(op, ret.saturating_neg())
        }
    }

    /// The DPDK call (or this crate's operation) that failed.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// The errno value (`rte_errno` or the negated return code).
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// DPDK's text for the error, or this crate's.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for DpdkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (errno {})", self.op, self.message, self.errno)
    }
}

impl std::error::Error for DpdkError {}

fn strerror(errno: i32) -> String {
    // SAFETY: rte_strerror accepts any value and returns a NUL-terminated
    // string in static or per-thread storage, copied out at once.
    let ptr = unsafe { sys::rte_strerror(errno) };
    if ptr.is_null() {
        return format!("error {errno}");
    }
    // SAFETY: non-null and NUL-terminated, per rte_strerror's contract.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// Checks a `0 = ok / negative = error` return code.
pub(crate) fn check(op: &'static str, ret: i32) -> Result<(), DpdkError> {
    if ret < 0 {
        Err(DpdkError::from_ret(op, ret))
    } else {
        Ok(())
    }
}
