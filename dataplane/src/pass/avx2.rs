//! The payload pass at 256-bit width, for CPUs with AVX2 and VPCLMULQDQ
//! but not the AVX-512 set of [`super::avx512`] (AMD Zen 3, Intel client
//! cores from Alder Lake on). Per 32-byte vector: a load (and, copying, a
//! store), the checksum's byte sums by `vpsadbw` (all bytes, and the odd
//! ones shifted down), and a carry-less fold into one of four CRC
//! accumulators. Without it such a CPU takes the copy, the CRC and the
//! sum as three passes; `benches/demo-bw.sh` measures the difference.
//! [`super`] says what the pass computes and why the loops that read
//! registered memory are inline assembly.

use core::arch::x86_64::{
    __m256i, _mm256_add_epi64, _mm256_clmulepi64_epi128, _mm256_loadu_si256, _mm256_sad_epu8,
    _mm256_set_epi64x, _mm256_setzero_si256, _mm256_srli_epi16, _mm256_storeu_si256,
    _mm256_xor_si256, _mm_crc32_u64,
};

use super::fold_constants;
use tcp_offload::wire::checksum;

/// Bytes the accumulators take per step: four vectors of 32.
const BLOCK: usize = 128;

/// Four accumulators of 32 bytes: each 128-bit lane folds a block (128
/// bytes) forward.
const FOLD_BLOCK: (u64, u64) = fold_constants(1024);
/// One accumulator folded into the next, 32 bytes on.
const FOLD_32: (u64, u64) = fold_constants(256);

/// Whether the CPU has what the kernels are compiled for.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("vpclmulqdq")
        && std::arch::is_x86_feature_detected!("sse4.2")
}

/// The running state of a pass: four CRC accumulators and the checksum's
/// two byte sums (every byte, the odd-numbered bytes), each four 64-bit
/// lanes.
struct State {
    a: [__m256i; 4],
    all: __m256i,
    odd: __m256i,
}

#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn constants(k: (u64, u64)) -> __m256i {
    let (lo, hi) = (k.0 as i64, k.1 as i64);
    _mm256_set_epi64x(hi, lo, hi, lo)
}

/// `acc` folded forward by the distance of `k`, with `data` added.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold(acc: __m256i, k: __m256i, data: __m256i) -> __m256i {
    let lo = _mm256_clmulepi64_epi128::<0x00>(acc, k);
    let hi = _mm256_clmulepi64_epi128::<0x11>(acc, k);
    _mm256_xor_si256(_mm256_xor_si256(lo, hi), data)
}

/// Loads the 32 bytes at `p`.
///
/// # Safety
/// `p` is valid for reads of 32 bytes that nobody writes meanwhile.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: as the caller guarantees (unaligned load).
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// The four 64-bit lanes of `v`.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes(v: __m256i) -> [u64; 4] {
    let mut out = [0u64; 4];
    // SAFETY: `out` is 32 writable bytes (unaligned store).
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) };
    out
}

impl State {
    /// The state after the first block, at `p`, with the CRC register
    /// before it (`!crc`) folded into its first vector.
    ///
    /// # Safety
    /// `p` is valid for reads of a block that nobody writes meanwhile.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    unsafe fn start(crc: u32, p: *const u8) -> State {
        // SAFETY: four vectors inside the block vouched for.
        let v = unsafe { [0, 1, 2, 3].map(|i| load(p.add(i * 32))) };
        State::with(crc, v)
    }

    /// The state after the first block, already loaded.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn with(crc: u32, v: [__m256i; 4]) -> State {
        let zero = _mm256_setzero_si256();
        let mut s = State {
            a: v,
            all: zero,
            odd: zero,
        };
        for v in v {
            s.add(v);
        }
        let init = _mm256_set_epi64x(0, 0, 0, i64::from(!crc));
        s.a[0] = _mm256_xor_si256(s.a[0], init);
        s
    }

    /// Adds the bytes of `v` to the checksum's sums: `vpsadbw` against
    /// zero sums each group of eight bytes into its 64-bit lane, and the
    /// odd bytes, shifted down into the even places, likewise.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn add(&mut self, v: __m256i) {
        let zero = _mm256_setzero_si256();
        self.all = _mm256_add_epi64(self.all, _mm256_sad_epu8(v, zero));
        self.odd = _mm256_add_epi64(self.odd, _mm256_sad_epu8(_mm256_srli_epi16::<8>(v), zero));
    }

    /// Takes the blocks at `p`, `blocks` of them.
    ///
    /// # Safety
    /// `p` is valid for reads of `blocks` blocks that nobody writes
    /// meanwhile.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    unsafe fn blocks(&mut self, p: *const u8, blocks: usize) {
        let k = constants(FOLD_BLOCK);
        for b in 0..blocks {
            for i in 0..4 {
                // SAFETY: inside the blocks vouched for.
                let v = unsafe { load(p.add(b * BLOCK + i * 32)) };
                self.add(v);
                self.a[i] = fold(self.a[i], k, v);
            }
        }
    }

    /// Ends the pass over the bytes after the blocks: the whole vectors
    /// after them, already loaded (`vectors`, at most three), then `rest`
    /// (under 32 bytes). Returns the CRC (as `crc32c_append` returns it)
    /// and the checksum partial sum of everything taken.
    ///
    /// # Safety
    /// The CPU has the features enabled here.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq,sse4.2")]
    unsafe fn finish_with(mut self, vectors: &[__m256i], rest: &[u8]) -> (u32, u32) {
        debug_assert!(vectors.len() <= 3 && rest.len() < 32);
        let k = constants(FOLD_32);
        let [a0, a1, a2, a3] = self.a;
        let mut acc = fold(fold(fold(a0, k, a1), k, a2), k, a3);
        for &v in vectors {
            self.add(v);
            acc = fold(acc, k, v);
        }
        // The accumulator stands for all the bytes so far: its CRC from a
        // zero register is theirs.
        let reg = lanes(acc).iter().fold(0u64, |r, &w| _mm_crc32_u64(r, w));
        // SAFETY: this function's features include SSE4.2.
        let (crc, tail_sum) = unsafe { super::words::crc_sum(!(reg as u32), rest) };
        // Even-numbered bytes are the high octets of the 16-bit words
        // (network order), odd ones the low; each sum is under 2^31 for
        // a run of `MAX_RUN` bytes.
        let all: u64 = lanes(self.all).iter().sum();
        let low: u64 = lanes(self.odd).iter().sum();
        let high = all - low;
        let vectors = (high << 8) + low;
        let total = u64::from(tail_sum) + checksum::fold64(vectors) as u64;
        (crc, u32::from(checksum::fold64(total)))
    }
}

/// [`super::crc_sum`] at 256-bit width.
///
/// # Safety
/// The CPU has AVX2, VPCLMULQDQ and SSE4.2; `bytes.len() >= 256`.
#[target_feature(enable = "avx2,vpclmulqdq,sse4.2")]
pub(super) unsafe fn crc_sum(crc: u32, bytes: &[u8]) -> (u32, u32) {
    let len = bytes.len();
    debug_assert!(len >= super::VECTOR_MIN);
    let p = bytes.as_ptr();
    let blocks = len / BLOCK - 1;
    let done = BLOCK * (blocks + 1);
    let vectors = (len - done) / 32;
    // SAFETY: every read lies inside `bytes`, which the borrow keeps
    // unchanged.
    unsafe {
        let mut s = State::start(crc, p);
        s.blocks(p.add(BLOCK), blocks);
        let mut v = [_mm256_setzero_si256(); 3];
        for (j, v) in v.iter_mut().enumerate().take(vectors) {
            *v = load(p.add(done + j * 32));
        }
        s.finish_with(&v[..vectors], &bytes[done + vectors * 32..])
    }
}

/// [`super::copy_crc_sum`] at 256-bit width.
///
/// # Safety
/// The CPU has AVX2, VPCLMULQDQ and SSE4.2; `len >= 256`; the pointers
/// are as [`super::copy_crc_sum`] requires.
#[target_feature(enable = "avx2,vpclmulqdq,sse4.2")]
pub(super) unsafe fn copy_crc_sum(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    crc: u32,
) -> (u32, u32) {
    debug_assert!(len >= super::VECTOR_MIN);
    let blocks = len / BLOCK - 1;
    let done = BLOCK * (blocks + 1);
    let vectors = (len - done) / 32;
    let at = done + vectors * 32;
    let rest = len - at;
    let mut last = [0u8; 32];
    // SAFETY: the head, the blocks and the whole vectors of the tail are
    // read from the source once each, by the assembly of `copy_head`,
    // `copy_blocks` and `copy_vectors`, inside the `len` bytes vouched
    // for, and stored to `dst`; the pass takes them as read, never back
    // from `dst`. The last `rest` bytes are copied from the source by
    // `memory::copy_raw` (whose contract is this function's) into `last`,
    // the caller's own, and from there to `dst`.
    unsafe {
        let mut s = State::with(crc, copy_head(dst, src));
        copy_blocks(&mut s, dst.add(BLOCK), src.add(BLOCK), blocks);
        let tail = copy_vectors(dst.add(done), src.add(done), vectors);
        crate::memory::copy_raw(last.as_mut_ptr(), src.add(at), rest);
        core::ptr::copy_nonoverlapping(last.as_ptr(), dst.add(at), rest);
        s.finish_with(&tail[..vectors], &last[..rest])
    }
}

/// Copies the first block from `src` to `dst` and returns it as four
/// vectors, so that the pass need not read it back (a load right after
/// stores to the same place waits for them to reach the cache). Inline
/// assembly, for the reason given at [`copy_blocks`].
///
/// # Safety
/// As for [`copy_blocks`], over one block.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn copy_head(dst: *mut u8, src: *const u8) -> [__m256i; 4] {
    let (v0, v1, v2, v3);
    // SAFETY: reads 128 bytes at `src` and writes 128 at `dst`, both
    // vouched for by the caller, and touches nothing else.
    unsafe {
        core::arch::asm!(
            "vmovdqu {v0}, ymmword ptr [{src}]",
            "vmovdqu {v1}, ymmword ptr [{src} + 32]",
            "vmovdqu {v2}, ymmword ptr [{src} + 64]",
            "vmovdqu {v3}, ymmword ptr [{src} + 96]",
            "vmovdqu ymmword ptr [{dst}], {v0}",
            "vmovdqu ymmword ptr [{dst} + 32], {v1}",
            "vmovdqu ymmword ptr [{dst} + 64], {v2}",
            "vmovdqu ymmword ptr [{dst} + 96], {v3}",
            src = in(reg) src,
            dst = in(reg) dst,
            v0 = out(ymm_reg) v0,
            v1 = out(ymm_reg) v1,
            v2 = out(ymm_reg) v2,
            v3 = out(ymm_reg) v3,
            options(nostack, preserves_flags),
        );
    }
    [v0, v1, v2, v3]
}

/// Copies `vectors` whole vectors (at most three) from `src` to `dst`
/// and returns them as read, those past `vectors` zero. Inline assembly,
/// for the reason given at [`copy_blocks`].
///
/// # Safety
/// As for [`copy_blocks`], over `vectors * 32` bytes; `vectors <= 3`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn copy_vectors(dst: *mut u8, src: *const u8, vectors: usize) -> [__m256i; 3] {
    debug_assert!(vectors <= 3);
    let (v0, v1, v2);
    // SAFETY: reads `vectors * 32` bytes at `src` and writes as many at
    // `dst`, both vouched for by the caller; nothing else.
    unsafe {
        core::arch::asm!(
            "vpxor {v0}, {v0}, {v0}",
            "vpxor {v1}, {v1}, {v1}",
            "vpxor {v2}, {v2}, {v2}",
            "test {n}, {n}",
            "jz 3f",
            "vmovdqu {v0}, ymmword ptr [{src}]",
            "vmovdqu ymmword ptr [{dst}], {v0}",
            "cmp {n}, 1",
            "je 3f",
            "vmovdqu {v1}, ymmword ptr [{src} + 32]",
            "vmovdqu ymmword ptr [{dst} + 32], {v1}",
            "cmp {n}, 2",
            "je 3f",
            "vmovdqu {v2}, ymmword ptr [{src} + 64]",
            "vmovdqu ymmword ptr [{dst} + 64], {v2}",
            "3:",
            src = in(reg) src,
            dst = in(reg) dst,
            n = in(reg) vectors,
            v0 = out(ymm_reg) v0,
            v1 = out(ymm_reg) v1,
            v2 = out(ymm_reg) v2,
            options(nostack),
        );
    }
    [v0, v1, v2]
}

/// [`State::blocks`] over `blocks` blocks read from `src`, each stored to
/// `dst` as it is read.
///
/// The loop is inline assembly: `src` may be registered memory that the
/// application writes meanwhile, and, as for `memory/shared.rs`'s `rep
/// movsb`, the compiler treats the block as opaque; its effect on memory
/// is that of relaxed atomic byte loads from `src` and stores to `dst` (a
/// vector access never tears a byte), so a racing write yields
/// unspecified bytes, never undefined behaviour. The instructions are
/// the ones [`State::blocks`] compiles to: per 32-byte vector a load, a
/// store, two `vpsadbw` (and the shift of the odd bytes) with their
/// additions for the checksum, and two `vpclmulqdq` and two `vpxor` for
/// the CRC fold.
///
/// # Safety
/// The CPU has the features enabled here; `src` is valid for reads and
/// `dst` for writes of `blocks` blocks, not overlapping, and other
/// accesses to `src` are as [`super::copy_crc_sum`] requires.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
unsafe fn copy_blocks(s: &mut State, dst: *mut u8, src: *const u8, blocks: usize) {
    if blocks == 0 {
        return;
    }
    let k = constants(FOLD_BLOCK);
    let zero = _mm256_setzero_si256();
    let [mut a0, mut a1, mut a2, mut a3] = s.a;
    // SAFETY: the loop reads `blocks * 128` bytes from `src` and writes
    // as many to `dst`, both vouched for by the caller, and touches
    // nothing else; the registers it changes are declared. AVX2 and
    // VPCLMULQDQ are enabled for this function.
    unsafe {
        core::arch::asm!(
            "2:",
            "vmovdqu {v0}, ymmword ptr [{src}]",
            "vmovdqu {v1}, ymmword ptr [{src} + 32]",
            "vmovdqu {v2}, ymmword ptr [{src} + 64]",
            "vmovdqu {v3}, ymmword ptr [{src} + 96]",
            "vmovdqu ymmword ptr [{dst}], {v0}",
            "vmovdqu ymmword ptr [{dst} + 32], {v1}",
            "vmovdqu ymmword ptr [{dst} + 64], {v2}",
            "vmovdqu ymmword ptr [{dst} + 96], {v3}",
            "vpclmulqdq {t}, {a0}, {k}, 0x00",
            "vpclmulqdq {a0}, {a0}, {k}, 0x11",
            "vpxor {a0}, {a0}, {t}",
            "vpxor {a0}, {a0}, {v0}",
            "vpsadbw {u}, {v0}, {zero}",
            "vpaddq {all}, {all}, {u}",
            "vpsrlw {v0}, {v0}, 8",
            "vpsadbw {v0}, {v0}, {zero}",
            "vpaddq {odd}, {odd}, {v0}",
            "vpclmulqdq {t}, {a1}, {k}, 0x00",
            "vpclmulqdq {a1}, {a1}, {k}, 0x11",
            "vpxor {a1}, {a1}, {t}",
            "vpxor {a1}, {a1}, {v1}",
            "vpsadbw {u}, {v1}, {zero}",
            "vpaddq {all}, {all}, {u}",
            "vpsrlw {v1}, {v1}, 8",
            "vpsadbw {v1}, {v1}, {zero}",
            "vpaddq {odd}, {odd}, {v1}",
            "vpclmulqdq {t}, {a2}, {k}, 0x00",
            "vpclmulqdq {a2}, {a2}, {k}, 0x11",
            "vpxor {a2}, {a2}, {t}",
            "vpxor {a2}, {a2}, {v2}",
            "vpsadbw {u}, {v2}, {zero}",
            "vpaddq {all}, {all}, {u}",
            "vpsrlw {v2}, {v2}, 8",
            "vpsadbw {v2}, {v2}, {zero}",
            "vpaddq {odd}, {odd}, {v2}",
            "vpclmulqdq {t}, {a3}, {k}, 0x00",
            "vpclmulqdq {a3}, {a3}, {k}, 0x11",
            "vpxor {a3}, {a3}, {t}",
            "vpxor {a3}, {a3}, {v3}",
            "vpsadbw {u}, {v3}, {zero}",
            "vpaddq {all}, {all}, {u}",
            "vpsrlw {v3}, {v3}, 8",
            "vpsadbw {v3}, {v3}, {zero}",
            "vpaddq {odd}, {odd}, {v3}",
            "add {src}, 128",
            "add {dst}, 128",
            "dec {n}",
            "jnz 2b",
            src = inout(reg) src => _,
            dst = inout(reg) dst => _,
            n = inout(reg) blocks => _,
            a0 = inout(ymm_reg) a0,
            a1 = inout(ymm_reg) a1,
            a2 = inout(ymm_reg) a2,
            a3 = inout(ymm_reg) a3,
            all = inout(ymm_reg) s.all,
            odd = inout(ymm_reg) s.odd,
            k = in(ymm_reg) k,
            zero = in(ymm_reg) zero,
            v0 = out(ymm_reg) _,
            v1 = out(ymm_reg) _,
            v2 = out(ymm_reg) _,
            v3 = out(ymm_reg) _,
            t = out(ymm_reg) _,
            u = out(ymm_reg) _,
            options(nostack),
        );
    }
    s.a = [a0, a1, a2, a3];
}
