//! TCP sequence numbers: 32-bit values compared modulo 2^32 (RFC 9293 §3.4).

use core::cmp::Ordering;
use core::fmt;
use core::ops::{Add, AddAssign, Sub};

/// A TCP sequence number. Ordering is circular: `a < b` when `b` is less than
/// 2^31 ahead of `a`. This makes `PartialOrd` non-transitive over the whole
/// space, which is why `Ord` is not implemented.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SeqNumber(pub u32);

impl SeqNumber {
    /// Signed distance from `other` to `self`: positive when `self` is ahead.
    pub fn diff(self, other: SeqNumber) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }

    /// The later of two sequence numbers.
    pub fn max(self, other: SeqNumber) -> SeqNumber {
        if self.diff(other) >= 0 {
            self
        } else {
            other
        }
    }

    /// The earlier of two sequence numbers.
    pub fn min(self, other: SeqNumber) -> SeqNumber {
        if self.diff(other) <= 0 {
            self
        } else {
            other
        }
    }

    /// Whether `self` lies in the half-open range `[start, end)`.
    pub fn in_range(self, start: SeqNumber, end: SeqNumber) -> bool {
        self.diff(start) >= 0 && end.diff(self) > 0
    }
}

impl Add<usize> for SeqNumber {
    type Output = SeqNumber;
    fn add(self, rhs: usize) -> SeqNumber {
        // Sequence arithmetic is modulo 2^32; callers never add more than a
        // window (< 2^30), so truncating the addend is the intended wrap.
        SeqNumber(self.0.wrapping_add(rhs as u32))
    }
}

impl AddAssign<usize> for SeqNumber {
    fn add_assign(&mut self, rhs: usize) {
        *self = *self + rhs;
    }
}

impl Sub<usize> for SeqNumber {
    type Output = SeqNumber;
    fn sub(self, rhs: usize) -> SeqNumber {
        SeqNumber(self.0.wrapping_sub(rhs as u32))
    }
}

impl Sub<SeqNumber> for SeqNumber {
    type Output = usize;
    /// Distance from `rhs` up to `self`; zero when `rhs` is ahead. Use
    /// [`SeqNumber::diff`] where the sign matters.
    fn sub(self, rhs: SeqNumber) -> usize {
        let d = self.diff(rhs);
        if d < 0 {
            0
        } else {
            d as usize
        }
    }
}

impl PartialOrd for SeqNumber {
    fn partial_cmp(&self, other: &SeqNumber) -> Option<Ordering> {
        Some(self.diff(*other).cmp(&0))
    }
}

impl fmt::Debug for SeqNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for SeqNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_compares_circularly() {
        let a = SeqNumber(u32::MAX - 10);
        let b = a + 20;
        assert_eq!(b, SeqNumber(9));
        assert!(a < b);
        assert!(b > a);
        assert_eq!(b - a, 20);
        assert_eq!(a - b, 0);
        assert_eq!(a.diff(b), -20);
        assert_eq!(a.max(b), b);
        assert_eq!(a.min(b), a);
        assert!(SeqNumber(5).in_range(a, b));
        assert!(!b.in_range(a, b));
        assert_eq!(b - 20usize, a);
    }
}
