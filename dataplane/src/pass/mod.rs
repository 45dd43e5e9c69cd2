//! The payload pass: the MPA CRC32c (RFC 5044 §4) and the TCP checksum's
//! partial sum (RFC 1071) of a run of payload, taken in one read of each
//! byte, optionally while copying it. The transmit path copies an FPDU's
//! payload from registered memory into its frame through
//! `copy_crc_sum`; the CRC and the sum come from the same loads.
//!
//! Where the CPU has AVX-512 with VPCLMULQDQ and VNNI (`avx512`), or
//! else AVX2 with VPCLMULQDQ (`avx2`; the widest found once, `kernel`),
//! each vector loaded is stored
//! to the destination, folded into one of four CRC accumulators
//! (carry-less multiplication by x^n mod P, the folding of Gopal et al.,
//! "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", with
//! constants computed below at compile time) and added into the
//! checksum's sums of the even and the odd bytes. The three separate
//! passes this replaces (copy, CRC, checksum) read the bytes three times;
//! on a 9000-byte FPDU the one pass takes about half their time on this
//! project's test machines (`benches`: the demo's write-bw at MTU 9000).
//! Runs under [`VECTOR_MIN`] bytes take the CRC instruction and the sum
//! in one loop of 8-byte words (`words`, SSE4.2); elsewhere the copy, the
//! CRC and the sum are taken one after the other with the portable code.
//!
//! Reading registered memory: the vector loop that reads the source is
//! inline assembly, for the reason [`crate::memory`] copies with `rep
//! movsb` (see `memory/shared.rs`): the source may be registered memory
//! the application writes meanwhile, and the block's effect on memory is
//! that of relaxed byte loads and stores. Everything the intrinsics read
//! is the destination, which the caller owns.

use tcp_offload::wire::checksum;

/// Runs shorter than this take the portable path (the vector loop's
/// first step takes 256 bytes).
pub const VECTOR_MIN: usize = 256;

/// Bytes one call of the vector kernel takes at most: each of the 16
/// checksum lanes gains at most 510 per 64-byte vector, and their total
/// must stay under 2^32 (65,536 vectors give 2^29 at most); larger runs
/// are taken in pieces.
const MAX_RUN: usize = 1 << 22;

/// The CRC32c of `bytes` extended from `crc` (as `crc32c_append`), and
/// their Internet checksum partial sum (as [`checksum::sum`]), in one
/// read of each byte. `bytes` is the caller's own memory.
pub fn crc_sum(crc: u32, bytes: &[u8]) -> (u32, u32) {
    let (mut crc, mut sum, mut at) = (crc, 0u32, 0usize);
    for run in bytes.chunks(MAX_RUN) {
        let (c, s) = crc_sum_run(crc, run);
        crc = c;
        sum = checksum::combine_at(sum, s, at);
        at += run.len();
    }
    (crc, sum)
}

/// The widest vector kernel the CPU has.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Avx512 = 1,
    Avx2 = 2,
    Neither = 3,
}

/// [`Kernel`], found once: each pass asked the CPU feature cache for
/// five features (two or three passes a frame; every answer an atomic
/// load and a test of its own).
#[cfg(target_arch = "x86_64")]
#[inline]
fn kernel() -> Kernel {
    use core::sync::atomic::{AtomicU8, Ordering};
    static KERNEL: AtomicU8 = AtomicU8::new(0);
    match KERNEL.load(Ordering::Relaxed) {
        1 => Kernel::Avx512,
        2 => Kernel::Avx2,
        3 => Kernel::Neither,
        _ => {
            let k = widest();
            KERNEL.store(k as u8, Ordering::Relaxed);
            k
        }
    }
}

/// The widest kernel the CPU has, asked of its feature cache.
#[cfg(target_arch = "x86_64")]
fn widest() -> Kernel {
    if avx512::available() {
        Kernel::Avx512
    } else if avx2::available() {
        Kernel::Avx2
    } else {
        Kernel::Neither
    }
}

fn crc_sum_run(crc: u32, bytes: &[u8]) -> (u32, u32) {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() >= VECTOR_MIN {
        match kernel() {
            // SAFETY: the CPU has the features `crc_sum` is compiled for
            // (`kernel` checked them).
            Kernel::Avx512 => return unsafe { avx512::crc_sum(crc, bytes) },
            // SAFETY: as above, for the 256-bit kernel.
            Kernel::Avx2 => return unsafe { avx2::crc_sum(crc, bytes) },
            Kernel::Neither => {}
        }
    } else if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2 (checked just above).
        return unsafe { words::crc_sum(crc, bytes) };
    }
    (rdmap::crc::append(crc, bytes), crate::checksum::sum(bytes))
}

/// The pass over a short run (a small record, a vector pass's tail) in
/// 8-byte words: each word goes into the CRC instruction and, as two
/// 32-bit halves, into a 64-bit sum, in the same loop. For a 64-byte
/// message's record this replaces two calls (the CRC crate's, whose
/// alignment and three-way set-up dominate at this size, and the
/// checksum's) with one loop of a dozen steps.
#[cfg(target_arch = "x86_64")]
mod words {
    use core::arch::x86_64::{_mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};

    use tcp_offload::wire::checksum;

    /// [`super::crc_sum`] for runs under 2^32 bytes (each word adds under
    /// 2^33 to the 64-bit total). The halves are summed little-endian,
    /// as [`checksum::sum`] does, and the folded total swapped back.
    ///
    /// # Safety
    /// The CPU has SSE4.2.
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn crc_sum(crc: u32, bytes: &[u8]) -> (u32, u32) {
        // The instruction runs the register; the CRC value is its
        // complement (as `crc32c_append` takes and returns it).
        let mut c = u64::from(!crc);
        let mut total = 0u64;
        let mut chunks = bytes.chunks_exact(8);
        for w in &mut chunks {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            let w = u64::from_le_bytes(b);
            c = _mm_crc32_u64(c, w);
            total += (w & 0xffff_ffff) + (w >> 32);
        }
        let mut c = c as u32;
        let mut rest = chunks.remainder();
        if let [a, b, d, e, more @ ..] = rest {
            let w = u32::from_le_bytes([*a, *b, *d, *e]);
            c = _mm_crc32_u32(c, w);
            total += u64::from(w);
            rest = more;
        }
        if let [a, b, more @ ..] = rest {
            let w = u16::from_le_bytes([*a, *b]);
            c = _mm_crc32_u16(c, w);
            total += u64::from(w);
            rest = more;
        }
        if let [a] = rest {
            c = _mm_crc32_u8(c, *a);
            // The odd byte is the high octet of its big-endian word: the
            // low one in this little-endian view.
            total += u64::from(*a);
        }
        (!c, u32::from(checksum::fold64(total).swap_bytes()))
    }
}

/// Copies `len` bytes from `src` to `dst` and returns their CRC32c
/// extended from `crc` and their Internet checksum partial sum, as
/// [`crc_sum`] over the copy would; the source is read once.
///
/// # Safety
/// As for `memory/shared.rs`'s `copy`: `src` is valid for reads and
/// `dst` for writes of `len` bytes for the whole call, the ranges do not
/// overlap, and any other access to `src` meanwhile is made through that
/// copy, this function, atomically at byte width, or by a device. `dst`
/// is the caller's own: nothing else reads or writes it during the call.
pub(crate) unsafe fn copy_crc_sum(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    crc: u32,
) -> (u32, u32) {
    let (mut crc, mut sum, mut at) = (crc, 0u32, 0usize);
    while at < len {
        let n = (len - at).min(MAX_RUN);
        // SAFETY: `[at, at + n)` lies inside both ranges; the contract is
        // the caller's.
        let (c, s) = unsafe { copy_crc_sum_run(dst.add(at), src.add(at), n, crc) };
        crc = c;
        sum = checksum::combine_at(sum, s, at);
        at += n;
    }
    (crc, sum)
}

/// [`copy_crc_sum`] for at most [`MAX_RUN`] bytes.
///
/// # Safety
/// As for [`copy_crc_sum`].
unsafe fn copy_crc_sum_run(dst: *mut u8, src: *const u8, len: usize, crc: u32) -> (u32, u32) {
    #[cfg(target_arch = "x86_64")]
    if len >= VECTOR_MIN {
        match kernel() {
            // SAFETY: the CPU has the features (`kernel` checked them);
            // the pointers are as the caller guarantees.
            Kernel::Avx512 => return unsafe { avx512::copy_crc_sum(dst, src, len, crc) },
            // SAFETY: as above, for the 256-bit kernel.
            Kernel::Avx2 => return unsafe { avx2::copy_crc_sum(dst, src, len, crc) },
            Kernel::Neither => {}
        }
    }
    // SAFETY: as the caller guarantees; `dst` is then the caller's own
    // initialised bytes, read by nobody else.
    unsafe {
        crate::memory::copy_raw(dst, src, len);
        let copied = core::slice::from_raw_parts(dst.cast_const(), len);
        crc_sum_run(crc, copied)
    }
}

/// `x^n mod P` for the CRC32c polynomial P (bit i is the coefficient of
/// x^i).
const fn xpow_mod(n: u32) -> u32 {
    const P: u64 = 0x1_1edc_6f41;
    let mut r: u64 = 1;
    let mut i = 0;
    while i < n {
        r <<= 1;
        if r & (1 << 32) != 0 {
            r ^= P;
        }
        i += 1;
    }
    r as u32
}

/// A polynomial of degree below 32 as a 64-bit operand of the folding
/// multiplication, bit-reflected as the CRC's data is: the coefficient of
/// x^m at bit 63 - m.
const fn reflect64(k: u32) -> u64 {
    let mut out = 0u64;
    let mut m = 0;
    while m < 32 {
        if (k >> m) & 1 == 1 {
            out |= 1 << (63 - m);
        }
        m += 1;
    }
    out
}

/// The two constants that fold a 128-bit lane forward by `bits`: the
/// lane's first 64 bits (the higher-degree half) are multiplied by
/// x^(bits + 64), its last 64 by x^bits, each less one power for the
/// product of two reflected operands, which comes out one place up.
const fn fold_constants(bits: u32) -> (u64, u64) {
    (
        reflect64(xpow_mod(bits + 63)),
        reflect64(xpow_mod(bits - 1)),
    )
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::*;

    use crate::checksum::test_bytes as bytes;

    fn reference(crc: u32, b: &[u8]) -> (u32, u32) {
        (crc32c::crc32c_append(crc, b), checksum::sum(b))
    }

    #[test]
    fn the_fold_constants_are_powers_of_x() {
        // x^32 mod P is P without its top term; x^31 is itself.
        assert_eq!(xpow_mod(32), 0x1edc_6f41);
        assert_eq!(xpow_mod(31), 1 << 31);
        assert_eq!(reflect64(1), 1 << 63);
        assert_eq!(reflect64(1 << 31), 1 << 32);
    }

    #[test]
    fn crc_and_sum_match_the_reference_at_every_length_and_offset() {
        let data = bytes(20_000, 5);
        for len in (0..1200).chain([1459, 1460, 4096, 8960, 8961, 9000, 16_383]) {
            for off in [0, 1, 3, 63] {
                for crc in [0, 0xdead_beef] {
                    let d = &data[off..off + len];
                    assert_eq!(crc_sum(crc, d), reference(crc, d), "len {len} offset {off}");
                }
            }
        }
    }

    #[test]
    fn the_copy_is_exact_and_its_results_match() {
        let data = bytes(20_000, 9);
        for len in (0..700).chain([1460, 8960, 9001, 16_384]) {
            for off in [0, 5, 64] {
                let src = &data[off..off + len];
                let mut dst = vec![0xeeu8; len + 2];
                // SAFETY: `src` and `dst[1..]` are valid for `len` bytes
                // and distinct allocations; nothing else touches them.
                let got = unsafe { copy_crc_sum(dst.as_mut_ptr().add(1), src.as_ptr(), len, 7) };
                assert_eq!(got, reference(7, src), "len {len} offset {off}");
                assert_eq!(&dst[1..=len], src, "len {len}");
                assert_eq!((dst[0], dst[len + 1]), (0xee, 0xee));
            }
        }
    }

    #[test]
    fn the_copy_reads_nothing_past_the_source_end() {
        // The source's last byte is the last of a page whose successor
        // is inaccessible: a read past it (the tail's masked load taking
        // a byte it should not) would fault.
        // SAFETY: plain anonymous mappings, unmapped at the end; the
        // pointers used lie inside the first page.
        unsafe {
            let page = 4096;
            let map = libc::mmap(
                core::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(map, libc::MAP_FAILED);
            let base = map.cast::<u8>();
            assert_eq!(
                libc::mprotect(base.add(page).cast(), page, libc::PROT_NONE),
                0
            );
            let data = bytes(page, 11);
            core::ptr::copy_nonoverlapping(data.as_ptr(), base, page);
            for len in (256..=600).chain([1460, 4096]) {
                let src = base.add(page - len);
                let mut dst = vec![0u8; len];
                let got = copy_crc_sum(dst.as_mut_ptr(), src, len, 0);
                let want = &data[page - len..];
                assert_eq!(got, reference(0, want), "len {len}");
                assert_eq!(dst, want, "len {len}");
            }
            libc::munmap(map, 2 * page);
        }
    }

    #[test]
    fn all_ones_and_all_zero_keep_their_sums() {
        let ones = vec![0xffu8; 70_000];
        assert_eq!(crc_sum(0, &ones), reference(0, &ones));
        assert_eq!(crc_sum(0, &ones).1, 0xffff);
        let zero = vec![0u8; 4096];
        assert_eq!(crc_sum(0, &zero), reference(0, &zero));
    }

    #[test]
    fn runs_past_a_lane_emptying_match() {
        let big = bytes(MAX_RUN + 1000, 3);
        assert_eq!(crc_sum(1, &big), reference(1, &big));
        let mut dst = vec![0u8; big.len()];
        // SAFETY: both vectors hold `big.len()` bytes, distinct.
        let got = unsafe { copy_crc_sum(dst.as_mut_ptr(), big.as_ptr(), big.len(), 1) };
        assert_eq!(got, reference(1, &big));
        assert!(dst == big);
    }

    /// One kernel against the reference at every length from 256 to
    /// 1200 and some longer, at several source offsets, copying and not.
    #[cfg(target_arch = "x86_64")]
    fn check_kernel(
        crc_sum: unsafe fn(u32, &[u8]) -> (u32, u32),
        copy_crc_sum: unsafe fn(*mut u8, *const u8, usize, u32) -> (u32, u32),
    ) {
        let data = bytes(20_000, 13);
        for len in (VECTOR_MIN..1200).chain([1459, 1460, 4096, 8960, 8961, 9000, 16_383]) {
            for off in [0, 1, 31, 64] {
                let src = &data[off..off + len];
                // SAFETY: the caller checked the CPU; `len >= 256`.
                let got = unsafe { crc_sum(0x1234_5678, src) };
                assert_eq!(got, reference(0x1234_5678, src), "len {len} offset {off}");
                let mut dst = vec![0xeeu8; len + 2];
                // SAFETY: as above; `src` and `dst[1..]` are valid for
                // `len` bytes and distinct allocations.
                let got = unsafe { copy_crc_sum(dst.as_mut_ptr().add(1), src.as_ptr(), len, 9) };
                assert_eq!(got, reference(9, src), "copy, len {len} offset {off}");
                assert_eq!(&dst[1..=len], src, "copy, len {len} offset {off}");
                assert_eq!((dst[0], dst[len + 1]), (0xee, 0xee));
            }
        }
    }

    // The comparisons above go through the dispatch, which takes the
    // widest kernel the CPU has; these take each kernel directly, and
    // say so where the CPU lacks one.

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_kernel_found_once_is_the_widest_the_cpu_has() {
        assert_eq!(kernel(), widest());
        assert_eq!(kernel(), widest(), "the remembered answer");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_512_bit_kernel_matches_where_the_cpu_has_it() {
        if !avx512::available() {
            eprintln!("no AVX-512 VNNI + VPCLMULQDQ here: that kernel is untested");
            return;
        }
        check_kernel(avx512::crc_sum, avx512::copy_crc_sum);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_256_bit_kernel_matches_where_the_cpu_has_it() {
        if !avx2::available() {
            eprintln!("no AVX2 + VPCLMULQDQ here: that kernel is untested");
            return;
        }
        check_kernel(avx2::crc_sum, avx2::copy_crc_sum);
    }
}
