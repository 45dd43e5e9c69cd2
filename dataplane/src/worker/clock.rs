//! Time for the worker's pipeline: one clock read at the top of each
//! iteration ([`super::Worker::poll`]) is the `now` every stage of that
//! iteration uses, in the units the sans-IO engines take.
//!
//! The worker reads through a [`ClockReader`] of its own. Where the kernel
//! keeps time with the CPU's time-stamp counter, the reader reads the
//! counter (a few nanoseconds) and scales it from the last real reading,
//! taking a real one (the vDSO clock, some 25 ns) once a millisecond: a
//! worker polls millions of times a second, and the clock read was the
//! largest single item of a busy-polled small-message round.

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

/// How long the reader goes on the time-stamp counter alone before it
/// reads the real clock again, in nanoseconds of that clock.
const REAL_EVERY_NS: u64 = 1_000_000;

/// The most two real readings around a counter reading may be apart for
/// the three to anchor the counter.
const PAIR_NS: u64 = 5_000;

/// A worker's reader of its [`Clock`]: the clock's time, read cheaply.
/// On a real clock, where the time-stamp counter is the kernel's own
/// clock source (so it runs at a constant rate, the same on every CPU),
/// a reading is the last real reading plus the counter's ticks since,
/// scaled by the rate the last two real readings (a millisecond apart)
/// showed; past a millisecond, or if the counter seems to have gone
/// back (a CPU whose counter differs), it reads the real clock again.
/// The time it returns never goes back. Elsewhere it reads the clock.
#[derive(Debug)]
pub(crate) struct ClockReader {
    clock: Clock,
    tsc: Option<TscScale>,
}

/// The state of the counter's scaling: the last real reading (counter
/// and nanoseconds since the clock's epoch), the rate, the last result.
#[derive(Debug, Default)]
struct TscScale {
    anchor_tsc: u64,
    anchor_ns: u64,
    /// Nanoseconds per tick, as a 32.32 fixed-point number; 0 until two
    /// real readings a millisecond apart have measured it.
    ns_per_tick_q32: u64,
    /// Ticks after the anchor past which the real clock is read again.
    span: u64,
    last_us: u64,
}

impl ClockReader {
    pub(crate) fn new(clock: Clock) -> ClockReader {
        let tsc = match clock.source {
            ClockSource::Real(_) if crate::sys::tsc_is_clock_source() => Some(TscScale::default()),
            _ => None,
        };
        ClockReader { clock, tsc }
    }

    /// The clock it reads.
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Time since the clock's epoch.
    pub(crate) fn now(&mut self) -> Instant {
        match (&self.clock.source, &mut self.tsc) {
            (ClockSource::Real(origin), Some(s)) => {
                Instant::from_micros(s.now(crate::sys::tsc, || real_ns(origin)))
            }
            _ => self.clock.now(),
        }
    }
}

/// Nanoseconds since `origin`.
fn real_ns(origin: &std::time::Instant) -> u64 {
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl TscScale {
    /// Microseconds now, from the counter (`tsc`) when it will do, else
    /// from the real clock (`real`, nanoseconds). A real reading taken to
    /// anchor the counter is bracketed by two, and anchors only if they
    /// are close: a thread preempted between its counter and clock reads
    /// would otherwise pair them wrongly and skew the rate.
    fn now(&mut self, mut tsc: impl FnMut() -> u64, mut real: impl FnMut() -> u64) -> u64 {
        let ticks = tsc().wrapping_sub(self.anchor_tsc);
        let us = if self.ns_per_tick_q32 != 0 && ticks < self.span {
            let ns = (u128::from(ticks) * u128::from(self.ns_per_tick_q32)) >> 32;
            self.anchor_ns.saturating_add(ns as u64) / 1000
        } else {
            let before = real();
            let t = tsc();
            let after = real();
            let gap = after.saturating_sub(before);
            if gap <= PAIR_NS {
                self.anchor(t, before + gap / 2);
            }
            after / 1000
        };
        self.last_us = self.last_us.max(us);
        self.last_us
    }

    /// A real reading `ns` at counter value `tsc`: measures the rate if the
    /// last anchor is at least [`REAL_EVERY_NS`] old and the counter moved
    /// forward, and anchors here.
    fn anchor(&mut self, tsc: u64, ns: u64) {
        let dns = ns.saturating_sub(self.anchor_ns);
        let ticks = tsc.wrapping_sub(self.anchor_tsc);
        let first = self.anchor_tsc == 0 && self.anchor_ns == 0;
        if first || ticks == 0 || ticks > (1 << 62) {
            // No earlier reading, or the counter stood still or went
            // back: learn the rate again from here.
            self.ns_per_tick_q32 = 0;
        } else if dns >= REAL_EVERY_NS {
            let q = (u128::from(dns) << 32) / u128::from(ticks);
            self.ns_per_tick_q32 = u64::try_from(q).unwrap_or(0);
            // Ticks in REAL_EVERY_NS at that rate.
            self.span =
                u64::try_from(u128::from(REAL_EVERY_NS) * u128::from(ticks) / u128::from(dns))
                    .unwrap_or(0);
        } else {
            // Too soon to measure: keep the old anchor (and rate).
            return;
        }
        self.anchor_tsc = tsc;
        self.anchor_ns = ns;
    }
}

/// The QP engine's time is a `Duration` since the same epoch.
pub(super) fn engine_time(now: Instant) -> Duration {
    Duration::from_micros(now.total_micros())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter at 3 ticks per nanosecond that started at 1000 ticks.
    fn ticks(ns: u64) -> u64 {
        1000 + 3 * ns
    }

    #[test]
    fn the_counter_is_scaled_once_its_rate_is_measured() {
        let mut s = TscScale::default();
        // Until two real readings a millisecond apart, every reading is real.
        assert_eq!(s.now(|| ticks(5_000), || 5_000), 5);
        assert_eq!(s.now(|| ticks(400_000), || 400_000), 400);
        assert_eq!(s.now(|| ticks(1_005_000), || 1_005_000), 1005);
        // Now the counter alone, within a microsecond of the truth.
        for ns in [1_005_000u64, 1_200_000, 1_777_777, 2_004_000] {
            let us = s.now(|| ticks(ns), || panic!("read the real clock at {ns}"));
            assert!(us.abs_diff(ns / 1000) <= 1, "{us} µs at {ns} ns");
        }
        // A millisecond past the anchor, the real clock again: its reading
        // wins even where the counter's rate seems off.
        let mut real = false;
        assert_eq!(
            s.now(
                || ticks(2_100_000),
                || {
                    real = true;
                    2_100_000
                }
            ),
            2100
        );
        assert!(real);
    }

    #[test]
    fn a_counter_that_goes_back_sends_it_to_the_real_clock_and_time_never_goes_back() {
        let mut s = TscScale::default();
        s.now(|| ticks(0), || 0);
        s.now(|| ticks(1_000_000), || 1_000_000);
        assert!(s.ns_per_tick_q32 != 0);
        // Another CPU's counter, behind this one's: the real clock is read
        // and the rate learnt again.
        let mut real = false;
        let us = s.now(
            || ticks(10),
            || {
                real = true;
                1_300_000
            },
        );
        assert!(real);
        assert_eq!(us, 1300);
        assert_eq!(s.ns_per_tick_q32, 0);
        // A real reading earlier than a result already given is not
        // returned: time stands still instead.
        assert_eq!(s.now(|| ticks(20), || 1_250_000), 1300);
    }

    #[test]
    fn a_reading_interrupted_between_its_clock_reads_anchors_nothing() {
        let mut s = TscScale::default();
        s.now(|| ticks(0), || 0);
        // Preempted for 300 µs between the two real reads around the
        // counter's: the pair is not used to measure the rate.
        let mut reads = [1_000_000u64, 1_300_000].into_iter();
        assert_eq!(
            s.now(|| ticks(1_000_000), || reads.next().unwrap_or(0)),
            1300
        );
        assert_eq!(s.ns_per_tick_q32, 0);
        assert_eq!(s.anchor_ns, 0);
        // A clean pair later measures it.
        s.now(|| ticks(1_400_000), || 1_400_000);
        assert!(s.ns_per_tick_q32 != 0);
    }

    #[test]
    fn a_manual_clock_is_read_as_it_is_set() {
        let t = ManualTime::new();
        let mut r = ClockReader::new(Clock::manual(&t));
        t.set(Instant::from_micros(42));
        assert_eq!(r.now(), Instant::from_micros(42));
        t.set(Instant::from_micros(4_000_000));
        assert_eq!(r.now(), Instant::from_micros(4_000_000));
    }

    #[test]
    fn a_real_reader_follows_the_real_clock() {
        let clock = Clock::new();
        let mut r = ClockReader::new(clock.clone());
        let wall = std::time::Instant::now();
        let mut last = r.now();
        while wall.elapsed() < Duration::from_millis(30) {
            let a = clock.now();
            let b = r.now();
            let c = clock.now();
            assert!(b >= last, "went back");
            // Within the two real readings around it, give or take the
            // counter's error over a millisecond.
            assert!(
                b.total_micros() + 2 >= a.total_micros(),
                "{b:?} before {a:?}"
            );
            assert!(
                b.total_micros() <= c.total_micros() + 2,
                "{b:?} after {c:?}"
            );
            last = b;
        }
    }
}
