//! The Toeplitz hash NICs use for receive-side scaling, in pure Rust (no EAL,
//! no DPDK call), so that the active side of a connection can choose a
//! source port whose replies the NIC steers to the opener's own queue: hash
//! the reply's tuple with the port's actual key ([`crate::Port::rss_hash_conf_get`])
//! and look the queue up in its redirection table ([`crate::Port::reta_query`]).
//!
//! The hash of an input bit string is the XOR, over every set input bit `i`
//! (most significant bit of the first byte first), of the 32 key bits that
//! start at key bit `i`. Key bits past the key's end count as zero; a key
//! needs at least four bytes more than the input (40 bytes cover IPv6 with
//! ports).

/// The key from Microsoft's RSS verification suite, which many NICs use by
/// default.
pub const MICROSOFT_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// A key whose hash is the same for both directions of a flow (the 16-bit
/// pattern repeats, so swapping source and destination fields leaves the
/// hash unchanged): replies land on the same queue as requests.
pub const SYMMETRIC_KEY: [u8; 40] = {
    let mut key = [0u8; 40];
    let mut i = 0;
    while i < key.len() {
        key[i] = if i % 2 == 0 { 0x6d } else { 0x5a };
        i += 1;
    }
    key
};

/// The Toeplitz hash of `input` bytes under `key`.
#[inline]
pub fn hash(key: &[u8], input: &[u8]) -> u32 {
    let key_byte = |i: usize| u64::from(key.get(i).copied().unwrap_or(0));
    // Key bits [8*i, 8*i + 64) of the current input byte `i`.
    let mut window = (0..8).fold(0u64, |w, i| (w << 8) | key_byte(i));
    let mut result = 0u32;
    for (i, &byte) in input.iter().enumerate() {
        for bit in 0..8 {
            if byte & (0x80 >> bit) != 0 {
                // The 32 key bits starting `bit` bits into the window.
                result ^= (window >> (32 - bit)) as u32;
            }
        }
        window = (window << 8) | key_byte(i + 8);
    }
    result
}

/// The Toeplitz hash of `input` as DPDK's `rte_softrss` takes it: 32-bit
/// words in host order, each hashed most significant byte first (so a word
/// holding an IPv4 address in host order hashes as the address's wire
/// bytes).
#[inline]
pub fn softrss(input: &[u32], key: &[u8]) -> u32 {
    let key_byte = |i: usize| u64::from(key.get(i).copied().unwrap_or(0));
    let mut window = (0..8).fold(0u64, |w, i| (w << 8) | key_byte(i));
    let mut result = 0u32;
    for (w, &word) in input.iter().enumerate() {
        for (b, byte) in word.to_be_bytes().into_iter().enumerate() {
            for bit in 0..8 {
                if byte & (0x80 >> bit) != 0 {
                    result ^= (window >> (32 - bit)) as u32;
                }
            }
            window = (window << 8) | key_byte(w * 4 + b + 8);
        }
    }
    result
}

/// The RSS input of an IPv4 TCP segment, in the order NICs hash it:
/// source address, destination address, source port, destination port.
#[inline]
pub fn ipv4_tcp_input(src: [u8; 4], dst: [u8; 4], src_port: u16, dst_port: u16) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[0..4].copy_from_slice(&src);
    out[4..8].copy_from_slice(&dst);
    out[8..10].copy_from_slice(&src_port.to_be_bytes());
    out[10..12].copy_from_slice(&dst_port.to_be_bytes());
    out
}

/// The same tuple as `rte_softrss` words (`struct rte_ipv4_tuple`).
#[inline]
pub fn ipv4_tcp_words(src: [u8; 4], dst: [u8; 4], src_port: u16, dst_port: u16) -> [u32; 3] {
    [
        u32::from_be_bytes(src),
        u32::from_be_bytes(dst),
        (u32::from(src_port) << 16) | u32::from(dst_port),
    ]
}

/// The RX queue a device with redirection table `reta` steers `hash` to:
/// the table is indexed by the hash's low bits (`reta.len()` is a power of
/// two on every device). `None` for an empty table.
#[inline]
pub fn reta_queue(hash: u32, reta: &[u16]) -> Option<u16> {
    if reta.is_empty() {
        return None;
    }
    reta.get(hash as usize % reta.len()).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (source, source port, destination, destination port, IPv4-only
    /// hash, IPv4/TCP hash).
    type Vector = ([u8; 4], u16, [u8; 4], u16, u32, u32);

    /// Microsoft's RSS verification vectors.
    const VECTORS: [Vector; 5] = [
        (
            [66, 9, 149, 187],
            2794,
            [161, 142, 100, 80],
            1766,
            0x323e_8fc2,
            0x51cc_c178,
        ),
        (
            [199, 92, 111, 2],
            14230,
            [65, 69, 140, 83],
            4739,
            0xd718_262a,
            0xc626_b0ea,
        ),
        (
            [24, 19, 198, 95],
            12898,
            [12, 22, 207, 184],
            38024,
            0xd2d0_a5de,
            0x5c2b_394a,
        ),
        (
            [38, 27, 205, 30],
            48228,
            [209, 142, 163, 6],
            2217,
            0x8298_9176,
            0xafc7_327f,
        ),
        (
            [153, 39, 163, 191],
            44251,
            [202, 188, 127, 2],
            1303,
            0x5d18_09c5,
            0x10e8_28a2,
        ),
    ];

    #[test]
    fn microsoft_vectors_bytes() {
        for (src, sp, dst, dp, h_ip, h_tcp) in VECTORS {
            let tcp = ipv4_tcp_input(src, dst, sp, dp);
            assert_eq!(hash(&MICROSOFT_KEY, &tcp[..8]), h_ip, "{src:?} -> {dst:?}");
            assert_eq!(
                hash(&MICROSOFT_KEY, &tcp),
                h_tcp,
                "{src:?}:{sp} -> {dst:?}:{dp}"
            );
        }
    }

    #[test]
    fn microsoft_vectors_words() {
        for (src, sp, dst, dp, h_ip, h_tcp) in VECTORS {
            let words = ipv4_tcp_words(src, dst, sp, dp);
            assert_eq!(softrss(&words[..2], &MICROSOFT_KEY), h_ip);
            assert_eq!(softrss(&words, &MICROSOFT_KEY), h_tcp);
        }
    }

    /// The pure-Rust hash agrees with DPDK's own `rte_softrss` (an inline
    /// function, reached through the shim; no EAL needed).
    #[test]
    fn matches_rte_softrss() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for len in 0..=9usize {
            for _ in 0..50 {
                let mut words = [0u32; 9];
                for w in &mut words[..len] {
                    // xorshift: any varied input will do.
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *w = x as u32;
                }
                for key in [&MICROSOFT_KEY, &SYMMETRIC_KEY] {
                    // SAFETY: `words` holds `len` words and the 40-byte key
                    // covers 4 * len + 4 <= 40 bytes.
                    let dpdk = unsafe {
                        crate::sys::shim_softrss(words.as_mut_ptr(), len as u32, key.as_ptr())
                    };
                    assert_eq!(softrss(&words[..len], key), dpdk, "len {len}");
                }
            }
        }
    }

    #[test]
    fn symmetric_key_hashes_both_directions_alike() {
        for (src, sp, dst, dp, _, _) in VECTORS {
            let fwd = hash(&SYMMETRIC_KEY, &ipv4_tcp_input(src, dst, sp, dp));
            let rev = hash(&SYMMETRIC_KEY, &ipv4_tcp_input(dst, src, dp, sp));
            assert_eq!(fwd, rev);
        }
        // ...which the Microsoft key does not.
        let (src, sp, dst, dp, _, _) = VECTORS[0];
        assert_ne!(
            hash(&MICROSOFT_KEY, &ipv4_tcp_input(src, dst, sp, dp)),
            hash(&MICROSOFT_KEY, &ipv4_tcp_input(dst, src, dp, sp))
        );
    }

    #[test]
    fn short_key_reads_zero_bits_and_reta_lookup() {
        // Past the key's end the bits are zero: a 4-byte key hashes only the
        // first input bit's window fully.
        assert_eq!(hash(&[0xff; 4], &[0x80]), 0xffff_ffff);
        assert_eq!(hash(&[], &[0xff; 12]), 0);
        let reta: Vec<u16> = (0..128).map(|i| i % 4).collect();
        assert_eq!(reta_queue(0x51cc_c178, &reta), Some((0x78 % 4) as u16));
        assert_eq!(reta_queue(7, &[]), None);
    }
}
