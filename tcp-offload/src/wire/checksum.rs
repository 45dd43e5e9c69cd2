//! The Internet checksum (RFC 1071) used by IPv4, ICMP and TCP.
//!
//! Every header parser and emitter in [`crate::wire`] goes through here. The
//! sums are kept *partial* (a one's-complement sum folded to 16 bits, not yet
//! complemented) so that the dataplane can sum a header and a payload that
//! live in different buffers — the zero-copy transmit path attaches payload
//! from registered memory — and [`combine`] them afterwards (RFC 1071 §2(B),
//! associativity; §2(C), byte-order independence for odd offsets).

use core::net::Ipv4Addr;

/// One's-complement sum of `data` read as big-endian 16-bit words, a final
/// odd byte padded with a zero byte (RFC 1071 §4.1). The result is folded
/// to 16 bits but not complemented, ready for [`combine`].
///
/// Two facts make this fast without `unsafe` or target features. Since
/// 2^16 ≡ 1 (mod 2^16 − 1), adding 32-bit words into 64-bit accumulators
/// and folding at the end gives the same one's-complement sum, with no
/// overflow for any buffer under 16 GiB. And the sum is byte-order
/// independent (RFC 1071 §2(B)): summing little-endian words and swapping
/// the folded result equals the big-endian sum, so the loads need no byte
/// swaps. Eight independent accumulators let the compiler vectorise the
/// loop on any x86-64 baseline.
pub fn sum(data: &[u8]) -> u32 {
    // An IPv4 header without options, summed twice a frame (sent and
    // received): five loads and adds, none of the loop's tests.
    if let Ok(h) = <&[u8; 20]>::try_from(data) {
        let w = |i: usize| u64::from(u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
        let total = w(0) + w(4) + w(8) + w(12) + w(16);
        return u32::from(fold64(total).swap_bytes());
    }
    // A TCP header with the timestamp option, every data segment's,
    // summed twice a frame as well: four 64-bit words, each split into
    // its halves so that no addition can overflow.
    if let Ok(h) = <&[u8; 32]>::try_from(data) {
        let w = |i: usize| {
            let v = u64::from_le_bytes([
                h[i],
                h[i + 1],
                h[i + 2],
                h[i + 3],
                h[i + 4],
                h[i + 5],
                h[i + 6],
                h[i + 7],
            ]);
            (v & 0xffff_ffff) + (v >> 32)
        };
        let total = w(0) + w(8) + w(16) + w(24);
        return u32::from(fold64(total).swap_bytes());
    }
    let mut acc = [0u64; 8];
    let mut chunks = data.chunks_exact(32);
    for c in &mut chunks {
        for (i, a) in acc.iter_mut().enumerate() {
            let w = [c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]];
            *a += u64::from(u32::from_le_bytes(w));
        }
    }
    let mut total: u64 = acc.iter().sum();
    let mut rest = chunks.remainder();
    while rest.len() >= 4 {
        total += u64::from(u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]));
        rest = &rest[4..];
    }
    if rest.len() >= 2 {
        total += u64::from(u16::from_le_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
    }
    if let Some(&last) = rest.first() {
        // The odd byte is the high-order byte of its big-endian word, which
        // is the low-order byte in the little-endian view.
        total += u64::from(last);
    }
    u32::from(fold64(total).swap_bytes())
}

/// Folds a 64-bit accumulator to 16 bits with end-around carry (for a
/// caller that sums into 64 bits itself, as the dataplane's vector sum
/// does).
pub fn fold64(s: u64) -> u16 {
    // A fixed number of steps, no loop whose exit a branch predictor must
    // guess (every header of every frame ends here). Each step keeps the
    // value modulo 2^16 - 1 (2^16 and 2^32 are 1 there) and keeps it
    // non-zero if it was; the bounds: below 2^33, 2^18, 2^16 + 3, then at
    // most 0xffff, which is the loop's result, the one value in 1..=0xffff
    // of that residue.
    let s = (s & 0xffff_ffff) + (s >> 32);
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// Folds a partial sum to 16 bits with end-around carry, without
/// complementing it.
pub fn fold(sum: u32) -> u16 {
    fold64(u64::from(sum))
}

/// Adds two partial sums, both of data that starts at an even offset of the
/// checksummed whole.
pub fn combine(a: u32, b: u32) -> u32 {
    u32::from(fold64(u64::from(a) + u64::from(b)))
}

/// Adds the partial sum `b` of a block that starts `offset` bytes into the
/// checksummed whole to `a`. A block at an odd offset has its bytes in the
/// other half of every 16-bit word, so its folded sum is byte-swapped
/// first (RFC 1071 §2(B)).
pub fn combine_at(a: u32, b: u32, offset: usize) -> u32 {
    let b = if offset % 2 == 1 {
        u32::from(fold(b).swap_bytes())
    } else {
        b
    };
    combine(a, b)
}

/// The value to store in a checksum field: the complement of the folded sum.
pub fn finish(sum: u32) -> u16 {
    !fold(sum)
}

/// Whether a partial sum taken over data that includes its checksum field
/// verifies: the one's-complement total must be negative zero.
pub fn verifies(sum: u32) -> bool {
    fold(sum) == 0xffff
}

/// Partial sum of the IPv4 pseudo-header that TCP and UDP checksums cover
/// (RFC 9293 §3.1): source, destination, zero and protocol, and the length
/// of the TCP header plus payload. Lengths above 65535 (never valid in
/// IPv4) are summed as a 32-bit field rather than truncated.
pub fn pseudo_header(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, length: usize) -> u32 {
    let s = src.octets();
    let d = dst.octets();
    let mut acc = u64::from(u16::from_be_bytes([s[0], s[1]]))
        + u64::from(u16::from_be_bytes([s[2], s[3]]))
        + u64::from(u16::from_be_bytes([d[0], d[1]]))
        + u64::from(u16::from_be_bytes([d[2], d[3]]))
        + u64::from(protocol);
    // Split so that a (never valid) length beyond u32 still folds rather
    // than being silently cut.
    let len = length as u64;
    acc += (len & 0xffff_ffff) + (len >> 32);
    u32::from(fold64(acc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The textbook definition: 16-bit words, end-around carry after every
    /// addition.
    fn naive(data: &[u8]) -> u16 {
        let mut s: u32 = 0;
        let mut i = 0;
        while i < data.len() {
            let hi = u32::from(data[i]);
            let lo = u32::from(data.get(i + 1).copied().unwrap_or(0));
            s += (hi << 8) | lo;
            if s > 0xffff {
                s = (s & 0xffff) + 1;
            }
            i += 2;
        }
        s as u16
    }

    #[test]
    fn fold64_equals_folding_until_it_fits() {
        let by_loop = |mut s: u64| {
            while s > 0xffff {
                s = (s & 0xffff) + (s >> 16);
            }
            s as u16
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let edges = [
            0,
            1,
            0xffff,
            0x1_0000,
            0x1_0001,
            0x1_fffe,
            0xffff_ffff,
            0x1_0000_0000,
            0xffff_0000_ffff,
            u64::MAX,
            u64::MAX - 1,
            1 << 63,
        ];
        for s in edges.into_iter().chain((0..100_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x >> (x % 64)
        })) {
            assert_eq!(fold64(s), by_loop(s), "{s:#x}");
        }
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: the bytes 00 01 f2 03 f4 f5 f6 f7 sum to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&data)), 0xddf2);
        assert_eq!(finish(sum(&data)), !0xddf2);
        // Summed in two halves and combined, the result is the same.
        assert_eq!(fold(combine(sum(&data[..4]), sum(&data[4..]))), 0xddf2);
        // Split at an odd offset, the second half is byte-swapped.
        assert_eq!(
            fold(combine_at(sum(&data[..3]), sum(&data[3..]), 3)),
            0xddf2
        );
    }

    #[test]
    fn ipv4_header_vector() {
        // A well-known IPv4 header whose checksum field holds b861.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert!(verifies(sum(&hdr)));
        let mut zeroed = hdr;
        zeroed[10] = 0;
        zeroed[11] = 0;
        assert_eq!(finish(sum(&zeroed)), 0xb861);
        zeroed[0] ^= 1;
        assert!(!verifies(sum(&zeroed)));
    }

    #[test]
    fn every_short_length_matches_the_naive_sum() {
        let data: Vec<u8> = (0..64u32).map(|i| (i * 151 + 89) as u8).collect();
        for len in 0..=data.len() {
            assert_eq!(fold(sum(&data[..len])), naive(&data[..len]), "length {len}");
        }
        assert_eq!(fold(sum(&[0xff; 20])), naive(&[0xff; 20]));
        assert_eq!(fold(sum(&[0xff; 32])), naive(&[0xff; 32]));
    }

    #[test]
    fn empty_and_odd() {
        assert_eq!(sum(&[]), 0);
        assert_eq!(sum(&[0xab]), 0xab00);
        assert_eq!(sum(&[0xff, 0xff, 0x00, 0x01]), 0x0001);
        assert_eq!(fold(0x1_fffe), 0xffff);
        assert_eq!(fold(0xffff_ffff), 0xffff);
    }

    #[test]
    fn pseudo_header_matches_bytes() {
        let src = Ipv4Addr::new(10, 77, 0, 12);
        let dst = Ipv4Addr::new(10, 77, 0, 11);
        let bytes = [10, 77, 0, 12, 10, 77, 0, 11, 0, 6, 0x05, 0xdc];
        assert_eq!(pseudo_header(src, dst, 6, 1500), sum(&bytes));
    }

    proptest! {
        #[test]
        fn matches_naive(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(fold(sum(&data)), naive(&data));
        }

        #[test]
        fn combine_at_any_split(
            data in proptest::collection::vec(any::<u8>(), 0..300),
            cut in any::<prop::sample::Index>(),
        ) {
            let cut = cut.index(data.len() + 1);
            let (head, tail) = data.split_at(cut);
            prop_assert_eq!(fold(combine_at(sum(head), sum(tail), cut)), naive(&data));
        }

        #[test]
        fn three_way_split(
            data in proptest::collection::vec(any::<u8>(), 0..300),
            c1 in any::<prop::sample::Index>(),
            c2 in any::<prop::sample::Index>(),
        ) {
            let mut c1 = c1.index(data.len() + 1);
            let mut c2 = c2.index(data.len() + 1);
            if c1 > c2 {
                core::mem::swap(&mut c1, &mut c2);
            }
            let s = combine_at(
                combine_at(sum(&data[..c1]), sum(&data[c1..c2]), c1),
                sum(&data[c2..]),
                c2,
            );
            prop_assert_eq!(fold(s), naive(&data));
        }
    }
}
