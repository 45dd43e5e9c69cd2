//! Time for the worker's pipeline: one clock read at the top of each
//! iteration ([`super::Worker::poll`]) is the `now` every stage of that
//! iteration uses, in the units the sans-IO engines take.

use core::time::Duration;

use tcp_offload::Instant;

/// The worker's clock: microseconds since the dataplane started, as the
/// sans-IO engines take time. `std::time::Instant` reads the vDSO clock
/// (no system call); a TSC-based clock can replace it behind this type.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: std::time::Instant,
}

impl Clock {
    /// A clock whose epoch is now.
    pub fn new() -> Clock {
        Clock {
            origin: std::time::Instant::now(),
        }
    }

    /// Time since the epoch.
    pub fn now(&self) -> Instant {
        Instant::from_micros(u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX))
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

/// The QP engine's time is a `Duration` since the same epoch.
pub(super) fn engine_time(now: Instant) -> Duration {
    Duration::from_micros(now.total_micros())
}
