//! Round-trip time estimation and the retransmission timeout, per RFC 6298
//! §2: SRTT and RTTVAR with gains 1/8 and 1/4, RTO = SRTT + max(G, 4 ×
//! RTTVAR) clamped to the configured bounds, and exponential backoff on
//! expiry (§5.5) kept until a valid sample arrives (Karn's algorithm: the
//! callers never feed a sample taken from a retransmitted segment unless
//! timestamps make it unambiguous). It also keeps what RACK-TLP (RFC 8985)
//! reads: the minimum RTT seen, and whether a sample arrived since the last
//! tail loss probe (§7.3 sends no probe otherwise).

use core::time::Duration;

/// Clock granularity G: timestamps tick in milliseconds.
const GRANULARITY_US: u64 = 1000;

/// Most doublings of the RTO; beyond this `rto_max` rules anyway.
const MAX_BACKOFF: u32 = 16;

/// The RTT estimator of one connection.
#[derive(Debug, Clone)]
pub(super) struct RttEstimator {
    /// Smoothed RTT in µs, `None` before the first sample.
    srtt: Option<u64>,
    /// RTT variation in µs.
    rttvar: u64,
    /// RTO before backoff, in µs.
    base: u64,
    /// Doublings applied since the last valid sample.
    backoff: u32,
    /// Smallest sample, in µs. RFC 8985 suggests a windowed minimum; the
    /// paths this engine runs on do not lengthen for good, and a minimum
    /// that only falls errs towards a smaller reordering window.
    min_rtt: Option<u64>,
    /// A sample arrived since `clear_fresh`.
    fresh: bool,
    min: u64,
    max: u64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl RttEstimator {
    pub(super) fn new(initial: Duration, min: Duration, max: Duration) -> RttEstimator {
        let min = micros(min);
        let max = micros(max).max(min);
        RttEstimator {
            srtt: None,
            rttvar: 0,
            base: micros(initial).clamp(min, max),
            backoff: 0,
            min_rtt: None,
            fresh: false,
            min,
            max,
        }
    }

    /// Feeds one RTT measurement (RFC 6298 §2.2, §2.3) and ends any backoff.
    pub(super) fn sample(&mut self, rtt: Duration) {
        let r = micros(rtt);
        self.min_rtt = Some(self.min_rtt.map_or(r, |m| m.min(r)));
        self.fresh = true;
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                let err = srtt.abs_diff(r);
                self.rttvar = (3 * self.rttvar + err) / 4;
                self.srtt = Some((7 * srtt + r) / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(r);
        let rto = srtt.saturating_add(GRANULARITY_US.max(self.rttvar.saturating_mul(4)));
        self.base = rto.clamp(self.min, self.max);
        self.backoff = 0;
    }

    /// The current RTO, backoff included.
    pub(super) fn rto(&self) -> Duration {
        let rto = self.base.checked_shl(self.backoff).unwrap_or(u64::MAX);
        Duration::from_micros(rto.min(self.max))
    }

    /// The RTO before backoff, the base of the persist timer.
    pub(super) fn base_rto(&self) -> Duration {
        Duration::from_micros(self.base)
    }

    /// Doubles the RTO after an expiry (RFC 6298 §5.5).
    pub(super) fn back_off(&mut self) {
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
    }

    /// The smoothed RTT, if any sample was taken.
    pub(super) fn srtt(&self) -> Option<Duration> {
        self.srtt.map(Duration::from_micros)
    }

    /// The smallest RTT sample so far (RFC 8985 `RACK.min_RTT`).
    pub(super) fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt.map(Duration::from_micros)
    }

    /// Whether a sample arrived since the last `clear_fresh`.
    pub(super) fn fresh(&self) -> bool {
        self.fresh
    }

    /// Starts waiting for a new sample (a tail loss probe went out).
    pub(super) fn clear_fresh(&mut self) {
        self.fresh = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est() -> RttEstimator {
        RttEstimator::new(
            Duration::from_secs(1),
            Duration::from_millis(200),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn first_sample_and_smoothing() {
        let mut e = est();
        assert_eq!(e.rto(), Duration::from_secs(1));
        e.sample(Duration::from_millis(100));
        // SRTT 100, RTTVAR 50: RTO = 100 + 200 = 300 ms.
        assert_eq!(e.rto(), Duration::from_millis(300));
        e.sample(Duration::from_millis(100));
        // RTTVAR = 3/4 × 50 = 37.5; RTO = 100 + 150 = 250 ms.
        assert_eq!(e.rto(), Duration::from_micros(250_000));
        assert_eq!(e.srtt(), Some(Duration::from_millis(100)));
    }

    #[test]
    fn min_rtt_and_freshness() {
        let mut e = est();
        assert_eq!(e.min_rtt(), None);
        assert!(!e.fresh());
        e.sample(Duration::from_millis(30));
        e.sample(Duration::from_millis(10));
        e.sample(Duration::from_millis(20));
        assert_eq!(e.min_rtt(), Some(Duration::from_millis(10)));
        assert!(e.fresh());
        e.clear_fresh();
        assert!(!e.fresh());
        e.sample(Duration::from_millis(25));
        assert!(e.fresh());
        assert_eq!(e.min_rtt(), Some(Duration::from_millis(10)));
    }

    #[test]
    fn clamps_and_backs_off() {
        let mut e = est();
        e.sample(Duration::from_micros(10));
        assert_eq!(e.rto(), Duration::from_millis(200));
        e.back_off();
        assert_eq!(e.rto(), Duration::from_millis(400));
        e.back_off();
        assert_eq!(e.rto(), Duration::from_millis(800));
        for _ in 0..40 {
            e.back_off();
        }
        assert_eq!(e.rto(), Duration::from_secs(60));
        e.sample(Duration::from_micros(10));
        assert_eq!(e.rto(), Duration::from_millis(200));
    }
}
