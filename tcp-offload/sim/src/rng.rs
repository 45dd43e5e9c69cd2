//! Seeded pseudo-random numbers for the simulator.
//!
//! Two small, well-studied generators, written here so that the simulator
//! needs no dependency and its output never changes under a crate upgrade:
//!
//! - **SplitMix64** (Steele, Lea and Flood, "Fast splittable pseudorandom
//!   number generators", OOPSLA 2014) turns one 64-bit seed into a stream
//!   of well-mixed words. It is only used to expand seeds: its 64-bit state
//!   is too small for the long streams a simulation draws.
//! - **xoshiro256\*\*** (Blackman and Vigna, "Scrambled linear pseudorandom
//!   number generators", 2018) draws the simulation's numbers: 256 bits of
//!   state, period 2^256 − 1, fast, and good in every bit.
//!
//! Each link direction owns one [`Rng`] derived from the network's master
//! seed and the direction's index ([`Rng::derive`]), so that adding traffic
//! on one direction does not change the draws on another. None of this is
//! cryptographic.

/// SplitMix64: a 64-bit counter passed through a strong mixing function.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The generator whose first output mixes `seed + γ`.
    pub const fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next word.
    pub fn next_u64(&mut self) -> u64 {
        // γ is the odd integer closest to 2^64 / φ, the published increment.
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// xoshiro256\*\*, seeded through SplitMix64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator seeded from `seed`: the state is four SplitMix64 words,
    /// as the xoshiro authors recommend.
    pub fn new(seed: u64) -> Rng {
        let mut sm = SplitMix64::new(seed);
        Rng::from_state([sm.next_u64(), sm.next_u64(), sm.next_u64(), sm.next_u64()])
    }

    /// A generator with exactly this state. The all-zero state is the one
    /// fixed point of xoshiro and is replaced by a non-zero one.
    pub fn from_state(s: [u64; 4]) -> Rng {
        if s == [0; 4] {
            return Rng::new(0);
        }
        Rng { s }
    }

    /// An independent stream number `stream` of the master seed `master`:
    /// both are mixed before they are combined, so that neighbouring seeds
    /// and neighbouring streams give unrelated generators.
    pub fn derive(master: u64, stream: u64) -> Rng {
        let a = SplitMix64::new(master).next_u64();
        let b = SplitMix64::new(stream ^ 0x5EED_F11A_C0DE_5EED).next_u64();
        Rng::new(a ^ b.rotate_left(17))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform number in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        // Intentional precision loss: the 53 high bits fit an f64 mantissa exactly.
        #[allow(clippy::cast_precision_loss)]
        let x = (self.next_u64() >> 11) as f64;
        x * (1.0 / (1u64 << 53) as f64)
    }

    /// `true` with probability `p` (clamped to `[0, 1]`). Always draws one
    /// number, so that the stream stays aligned whatever `p` is.
    pub fn chance(&mut self, p: f64) -> bool {
        let x = self.next_f64();
        x < p
    }

    /// A uniform integer in `[0, n)`; zero when `n` is zero. Lemire's
    /// multiply-and-shift with rejection, so there is no modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            // Truncation keeps the low word, as the method requires.
            #[allow(clippy::cast_possible_truncation)]
            let low = m as u64;
            if low >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// A uniform integer in `[lo, hi]`.
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.below(span),
            None => self.next_u64(),
        }
    }

    /// Fills `dst` with random bytes.
    pub fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            let w = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xoshiro_reference_vector() {
        // From the reference implementation seeded with state {1, 2, 3, 4}.
        let mut r = Rng::from_state([1, 2, 3, 4]);
        assert_eq!(r.next_u64(), 11520);
        assert_eq!(r.next_u64(), 0);
        assert_eq!(r.next_u64(), 1_509_978_240);
        assert_eq!(r.next_u64(), 1_215_971_899_390_074_240);
    }

    #[test]
    fn splitmix_reference_vector() {
        // The first outputs for seed 0 of the published algorithm.
        let mut s = SplitMix64::new(0);
        assert_eq!(s.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(s.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    fn first_words(mut r: Rng) -> [u64; 4] {
        [r.next_u64(), r.next_u64(), r.next_u64(), r.next_u64()]
    }

    #[test]
    fn derived_streams_differ_and_repeat() {
        let a = first_words(Rng::derive(7, 0));
        assert_eq!(a, first_words(Rng::derive(7, 0)));
        assert_ne!(a, first_words(Rng::derive(7, 1)));
        assert_ne!(a, first_words(Rng::derive(8, 0)));
        assert_ne!(
            first_words(Rng::derive(0, 1)),
            first_words(Rng::derive(1, 0))
        );
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut r = Rng::new(42);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            let x = r.below(6);
            counts[usize::try_from(x).unwrap()] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        assert_eq!(r.below(0), 0);
        assert_eq!(r.range_inclusive(5, 5), 5);
        assert!((3..=9).contains(&r.range_inclusive(3, 9)));
    }

    #[test]
    fn chance_matches_probability() {
        let mut r = Rng::new(1);
        let hits = (0..100_000).filter(|_| r.chance(0.25)).count();
        assert!((24_000..26_000).contains(&hits), "{hits}");
        assert!(!(0..1000).any(|_| r.chance(0.0)));
        assert!((0..1000).all(|_| r.chance(1.0)));
    }
}
