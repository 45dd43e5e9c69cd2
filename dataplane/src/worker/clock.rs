//! Time for the worker's pipeline: one clock read at the top of each
//! iteration ([`super::Worker::poll`]) is the `now` every stage of that
//! iteration uses, in the units the sans-IO engines take.

use core::time::Duration;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tcp_offload::Instant;

/// The worker's clock: microseconds since the dataplane started, as the
/// sans-IO engines take time. The real clock reads `std::time::Instant`
/// (the vDSO clock, no system call); a manual clock reads the time a
/// [`ManualTime`] was last set to, so that a simulation moves every worker
/// of every dataplane in the same virtual time.
#[derive(Debug, Clone)]
pub struct Clock {
    source: ClockSource,
}

#[derive(Debug, Clone)]
enum ClockSource {
    Real(std::time::Instant),
    Manual(Arc<AtomicU64>),
}

impl Clock {
    /// A real clock whose epoch is now.
    pub fn new() -> Clock {
        Clock {
            source: ClockSource::Real(std::time::Instant::now()),
        }
    }

    /// A clock that reads `time`: it stands still until `time` is set.
    pub fn manual(time: &ManualTime) -> Clock {
        Clock {
            source: ClockSource::Manual(time.0.clone()),
        }
    }

    /// Time since the epoch.
    pub fn now(&self) -> Instant {
        match &self.source {
            ClockSource::Real(origin) => Instant::from_micros(
                u64::try_from(origin.elapsed().as_micros()).unwrap_or(u64::MAX),
            ),
            ClockSource::Manual(t) => Instant::from_micros(t.load(Ordering::Acquire)),
        }
    }

    /// Whether this clock is a [`ManualTime`]'s: waits measured on it make
    /// no sense in real time, so the worker never sleeps for them.
    pub fn is_manual(&self) -> bool {
        matches!(self.source, ClockSource::Manual(_))
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

/// Virtual time that a program sets by hand, read by every [`Clock`] made
/// from it with [`Clock::manual`]: how a simulation runs real dataplanes
/// in virtual time (see [`crate::Dataplane::open_simulated`]).
#[derive(Debug, Clone, Default)]
pub struct ManualTime(Arc<AtomicU64>);

impl ManualTime {
    /// Time zero.
    pub fn new() -> ManualTime {
        ManualTime::default()
    }

    /// Sets the time; it never goes backwards (an earlier time is ignored).
    pub fn set(&self, now: Instant) {
        self.0.fetch_max(now.total_micros(), Ordering::AcqRel);
    }

    /// The time last set.
    pub fn now(&self) -> Instant {
        Instant::from_micros(self.0.load(Ordering::Acquire))
    }
}

/// The QP engine's time is a `Duration` since the same epoch.
pub(super) fn engine_time(now: Instant) -> Duration {
    Duration::from_micros(now.total_micros())
}
