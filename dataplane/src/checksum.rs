//! The Internet checksum's partial sum at vector width, for the payload
//! passes of the data path: the transmit pass that copies a record into
//! its frame and sums it, the completion of a TCP checksum over a frame,
//! and the verification of every received segment (handed to
//! `tcp-offload` as its summing function, [`InterfaceConfig::sum`]).
//!
//! `tcp-offload`'s [`checksum::sum`] is portable: 128-bit vectors at most
//! on an x86-64 baseline build. Where the CPU has AVX2 (checked once, by
//! the standard library's cached feature test), [`sum`] adds 256-bit
//! vectors instead: about twice the bytes per cycle (a 9000-byte frame in
//! ~90 ns against ~190 on this project's test machines). The result is
//! the portable function's, bit for bit, for every input.
//!
//! [`InterfaceConfig::sum`]: tcp_offload::iface::InterfaceConfig::sum

use tcp_offload::wire::checksum;

/// The one's-complement partial sum of `data` (RFC 1071), exactly as
/// [`checksum::sum`] computes it: folded to 16 bits, not complemented,
/// ready for [`checksum::combine`].
pub fn sum(data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= VECTOR_MIN && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, which `sum_avx2` is compiled for.
        return unsafe { sum_avx2(data) };
    }
    checksum::sum(data)
}

/// Below this, the portable loop is as fast (a header, a small record).
const VECTOR_MIN: usize = 128;

/// [`sum`] in 256-bit vectors: each 32-bit lane adds the two 16-bit
/// little-endian halves of its word (RFC 1071 §2(B): summing in either
/// byte order and swapping the folded result is the same), so a lane
/// gains at most 2 × 0xffff per block of 64 bytes; every 16 384 blocks
/// (1 MiB, less than 2^32 in a lane) the lanes are emptied into a 64-bit
/// total. The tail under 64 bytes goes to the portable loop.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(data: &[u8]) -> u32 {
    use std::arch::x86_64::{
        __m256i, _mm256_add_epi32, _mm256_add_epi64, _mm256_and_si256, _mm256_loadu_si256,
        _mm256_set1_epi32, _mm256_set1_epi64x, _mm256_setzero_si256, _mm256_srli_epi32,
        _mm256_srli_epi64, _mm256_storeu_si256,
    };
    /// Blocks of 64 bytes between two emptyings of the lanes.
    const BLOCKS: usize = 1 << 14;
    let mut total = 0u64;
    let mut blocks = data.chunks_exact(64);
    loop {
        let mut taken = 0;
        // SAFETY: AVX2 is enabled for this function, which the intrinsics
        // need; the loads read 32 bytes at offsets 0 and 32 of a 64-byte
        // chunk of `data` (unaligned loads), the store writes the 32
        // bytes of `out`.
        let lanes = unsafe {
            let low16 = _mm256_set1_epi32(0xffff);
            let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for c in blocks.by_ref().take(BLOCKS) {
                let v = _mm256_loadu_si256(c.as_ptr().cast::<__m256i>());
                let w = _mm256_loadu_si256(c.as_ptr().add(32).cast::<__m256i>());
                let v = _mm256_add_epi32(_mm256_and_si256(v, low16), _mm256_srli_epi32(v, 16));
                let w = _mm256_add_epi32(_mm256_and_si256(w, low16), _mm256_srli_epi32(w, 16));
                a = _mm256_add_epi32(a, v);
                b = _mm256_add_epi32(b, w);
                taken += 1;
            }
            // Each 32-bit lane of `a` and `b` widened to 64 bits and added.
            let low32 = _mm256_set1_epi64x(0xffff_ffff);
            let wide = _mm256_add_epi64(
                _mm256_add_epi64(_mm256_and_si256(a, low32), _mm256_srli_epi64(a, 32)),
                _mm256_add_epi64(_mm256_and_si256(b, low32), _mm256_srli_epi64(b, 32)),
            );
            let mut out = [0u64; 4];
            _mm256_storeu_si256(out.as_mut_ptr().cast::<__m256i>(), wide);
            out
        };
        total += lanes.iter().sum::<u64>();
        if taken < BLOCKS {
            break;
        }
    }
    // The tail starts at an even offset: its portable sum, taken back to
    // little-endian order, adds in as it is.
    let tail = checksum::sum(blocks.remainder()) as u16;
    total += u64::from(tail.swap_bytes());
    u32::from(checksum::fold64(total).swap_bytes())
}

/// Bytes that make every vector lane carry, for the tests of the
/// vector sums here and in [`crate::pass`]: a pseudo-random fill with
/// runs of 0xff.
#[cfg(test)]
pub(crate) fn test_bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if (i / 97) % 3 == 0 {
                0xff
            } else {
                x as u8
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::test_bytes as bytes;

    #[test]
    fn equals_the_portable_sum_for_every_length_and_offset() {
        let data = bytes(70_000, 7);
        for len in 0..600 {
            for off in [0, 1, 2, 3, 31, 33, 63] {
                let d = &data[off..off + len];
                assert_eq!(sum(d), checksum::sum(d), "len {len} offset {off}");
            }
        }
        for len in [1459, 1460, 8960, 8961, 65_535, 65_536, 69_999] {
            let d = &data[1..=len];
            assert_eq!(sum(d), checksum::sum(d), "len {len}");
        }
    }

    #[test]
    fn equals_the_portable_sum_past_a_lane_emptying() {
        // More than 16 384 blocks of 64 bytes of 0xff: every lane would
        // overflow 32 bits without the emptying.
        let all = vec![0xffu8; (1 << 20) * 5 + 77];
        assert_eq!(sum(&all), checksum::sum(&all));
        let mixed = bytes((1 << 20) * 2 + 3, 11);
        assert_eq!(sum(&mixed), checksum::sum(&mixed));
    }

    #[test]
    fn all_zero_and_all_ones_keep_their_distinct_sums() {
        let zero = vec![0u8; 4096];
        assert_eq!(sum(&zero), 0);
        let ones = vec![0xffu8; 4096];
        assert_eq!(sum(&ones), 0xffff);
        assert_eq!(sum(&ones), checksum::sum(&ones));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_path_runs_where_the_cpu_has_it() {
        // The comparisons above prove nothing about the vector path on a
        // CPU without AVX2; where it is there, call it directly too.
        if std::arch::is_x86_feature_detected!("avx2") {
            let d = bytes(10_000, 3);
            for len in [128, 129, 1460, 9999] {
                // SAFETY: the CPU has AVX2 (checked above).
                let v = unsafe { sum_avx2(&d[..len]) };
                assert_eq!(v, checksum::sum(&d[..len]), "len {len}");
            }
        }
    }
}
