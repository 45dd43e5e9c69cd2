//! The payload pass at 512-bit width, for CPUs with AVX-512 (F, BW,
//! VNNI) and VPCLMULQDQ: per 64-byte vector a load (and, copying, a
//! store), two `vpdpbusd` for the checksum's even and odd byte sums and a
//! carry-less fold into one of four CRC accumulators. [`super`] says
//! what the pass computes and why the loops that read registered memory
//! are inline assembly.

use core::arch::x86_64::{
    __m512i, _mm512_castsi128_si512, _mm512_clmulepi64_epi128, _mm512_dpbusd_epi32,
    _mm512_loadu_si512, _mm512_reduce_add_epi32, _mm512_set1_epi32, _mm512_set_epi64,
    _mm512_setzero_si512, _mm512_storeu_si512, _mm512_ternarylogic_epi64, _mm512_xor_si512,
    _mm_crc32_u64, _mm_cvtsi32_si128,
};

use super::fold_constants;
use tcp_offload::wire::checksum;

/// Four accumulators of 64 bytes: each 128-bit lane folds 256 bytes
/// forward.
const FOLD_256: (u64, u64) = fold_constants(2048);
/// One accumulator folded into the next, 64 bytes on.
const FOLD_64: (u64, u64) = fold_constants(512);

/// Whether the CPU has what the kernels are compiled for.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("vpclmulqdq")
        && std::arch::is_x86_feature_detected!("sse4.2")
}

/// The running state of a pass: four CRC accumulators and the two
/// checksum lane sets (even bytes, odd bytes).
struct State {
    a: [__m512i; 4],
    even: __m512i,
    odd: __m512i,
}

#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn constants(k: (u64, u64)) -> __m512i {
    let (lo, hi) = (k.0 as i64, k.1 as i64);
    _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)
}

/// `acc` folded forward by the distance of `k`, with `data` added.
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn fold(acc: __m512i, k: __m512i, data: __m512i) -> __m512i {
    let lo = _mm512_clmulepi64_epi128::<0x00>(acc, k);
    let hi = _mm512_clmulepi64_epi128::<0x11>(acc, k);
    _mm512_ternarylogic_epi64::<0x96>(lo, hi, data)
}

/// Byte weights 1, 0, 1, 0 (even bytes) and 0, 1, 0, 1 (odd bytes).
#[inline]
#[target_feature(enable = "avx512f")]
fn weights() -> (__m512i, __m512i) {
    (
        _mm512_set1_epi32(0x0001_0001),
        _mm512_set1_epi32(0x0100_0100),
    )
}

/// Loads the 64 bytes at `p`.
///
/// # Safety
/// `p` is valid for reads of 64 bytes that nobody writes meanwhile.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load(p: *const u8) -> __m512i {
    // SAFETY: as the caller guarantees (unaligned load).
    unsafe { _mm512_loadu_si512(p.cast()) }
}

impl State {
    /// The state after the first 256 bytes, at `p`, with the CRC
    /// register before them (`!crc`) folded into their first four.
    ///
    /// # Safety
    /// `p` is valid for reads of 256 bytes that nobody writes
    /// meanwhile.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni,vpclmulqdq")]
    unsafe fn start(crc: u32, p: *const u8) -> State {
        // SAFETY: four vectors inside the 256 bytes vouched for.
        let v = unsafe { [0, 1, 2, 3].map(|i| load(p.add(i * 64))) };
        State::with(crc, v)
    }

    /// The state after the first 256 bytes, already loaded.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni,vpclmulqdq")]
    fn with(crc: u32, v: [__m512i; 4]) -> State {
        let (we, wo) = weights();
        let zero = _mm512_setzero_si512();
        let mut s = State {
            a: v,
            even: zero,
            odd: zero,
        };
        for v in v {
            s.even = _mm512_dpbusd_epi32(s.even, v, we);
            s.odd = _mm512_dpbusd_epi32(s.odd, v, wo);
        }
        let init = _mm512_castsi128_si512(_mm_cvtsi32_si128(!crc as i32));
        s.a[0] = _mm512_xor_si512(s.a[0], init);
        s
    }

    /// Takes the 256-byte blocks at `p`, `blocks` of them.
    ///
    /// # Safety
    /// `p` is valid for reads of `blocks * 256` bytes that nobody
    /// writes meanwhile.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni,vpclmulqdq")]
    unsafe fn blocks(&mut self, p: *const u8, blocks: usize) {
        let k = constants(FOLD_256);
        let (we, wo) = weights();
        for b in 0..blocks {
            for (i, a) in self.a.iter_mut().enumerate() {
                // SAFETY: inside the `blocks * 256` bytes vouched for.
                let v = unsafe { load(p.add(b * 256 + i * 64)) };
                self.even = _mm512_dpbusd_epi32(self.even, v, we);
                self.odd = _mm512_dpbusd_epi32(self.odd, v, wo);
                *a = fold(*a, k, v);
            }
        }
    }

    /// Ends the pass over the bytes after the blocks: `vectors` whole
    /// vectors at `p` (at most three), then `rest` (under 64 bytes).
    /// Returns the CRC (as `crc32c_append` returns it) and the
    /// checksum partial sum of everything taken.
    ///
    /// # Safety
    /// `p` is valid for reads of `vectors * 64` bytes that nobody
    /// writes meanwhile.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni,vpclmulqdq,sse4.2")]
    unsafe fn finish(self, p: *const u8, vectors: usize, rest: &[u8]) -> (u32, u32) {
        debug_assert!(vectors <= 3);
        let mut v = [_mm512_setzero_si512(); 3];
        for (j, v) in v.iter_mut().enumerate().take(vectors) {
            // SAFETY: inside the `vectors * 64` bytes vouched for.
            *v = unsafe { load(p.add(j * 64)) };
        }
        // SAFETY: this function's features are `finish_with`'s.
        unsafe { self.finish_with(&v[..vectors], rest) }
    }

    /// [`State::finish`] with the whole vectors after the blocks
    /// already loaded (`vectors`, at most three).
    ///
    /// # Safety
    /// The CPU has the features enabled here.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni,vpclmulqdq,sse4.2")]
    unsafe fn finish_with(self, vectors: &[__m512i], rest: &[u8]) -> (u32, u32) {
        debug_assert!(vectors.len() <= 3 && rest.len() < 64);
        let k = constants(FOLD_64);
        let (we, wo) = weights();
        let [a0, a1, a2, a3] = self.a;
        let (mut even, mut odd) = (self.even, self.odd);
        let mut acc = fold(fold(fold(a0, k, a1), k, a2), k, a3);
        for &v in vectors {
            even = _mm512_dpbusd_epi32(even, v, we);
            odd = _mm512_dpbusd_epi32(odd, v, wo);
            acc = fold(acc, k, v);
        }
        // The accumulator stands for all the bytes so far: its CRC
        // from a zero register is theirs.
        let mut words = [0u64; 8];
        // SAFETY: `words` is 64 writable bytes (unaligned store).
        unsafe { _mm512_storeu_si512(words.as_mut_ptr().cast(), acc) };
        let reg = words.iter().fold(0u64, |r, &w| _mm_crc32_u64(r, w));
        // SAFETY: this function's features include SSE4.2.
        let (crc, tail_sum) = unsafe { super::words::crc_sum(!(reg as u32), rest) };
        // Even bytes are the high octets of the 16-bit words (network
        // order), odd ones the low; the lanes hold under 2^31 each.
        let high = u64::from(_mm512_reduce_add_epi32(even) as u32);
        let low = u64::from(_mm512_reduce_add_epi32(odd) as u32);
        let vectors = (high << 8) + low;
        let total = u64::from(tail_sum) + checksum::fold64(vectors) as u64;
        (crc, u32::from(checksum::fold64(total)))
    }
}

/// [`super::crc_sum`] at vector width.
///
/// # Safety
/// The CPU has AVX-512F, AVX-512 VNNI, VPCLMULQDQ and SSE4.2;
/// `bytes.len() >= 256`.
#[target_feature(enable = "avx512f,avx512vnni,vpclmulqdq,sse4.2")]
pub(super) unsafe fn crc_sum(crc: u32, bytes: &[u8]) -> (u32, u32) {
    let len = bytes.len();
    debug_assert!(len >= super::VECTOR_MIN);
    let p = bytes.as_ptr();
    let blocks = len / 256 - 1;
    let done = 256 * (blocks + 1);
    let vectors = (len - done) / 64;
    // SAFETY: every read lies inside `bytes`, which the borrow keeps
    // unchanged.
    unsafe {
        let mut s = State::start(crc, p);
        s.blocks(p.add(256), blocks);
        s.finish(p.add(done), vectors, &bytes[done + vectors * 64..])
    }
}

/// [`super::copy_crc_sum`] at vector width.
///
/// # Safety
/// The CPU has AVX-512F, AVX-512 VNNI, VPCLMULQDQ and SSE4.2;
/// `len >= 256`; the pointers are as [`super::copy_crc_sum`] requires.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,vpclmulqdq,sse4.2")]
pub(super) unsafe fn copy_crc_sum(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    crc: u32,
) -> (u32, u32) {
    debug_assert!(len >= super::VECTOR_MIN);
    let blocks = len / 256 - 1;
    let done = 256 * (blocks + 1);
    let vectors = (len - done) / 64;
    let rest = len - done - vectors * 64;
    let mut last = [0u8; 64];
    // SAFETY: the head, the blocks and the tail are read from the
    // source once each, by the assembly of `copy_head`, `copy_blocks`
    // and `copy_tail`, inside the `len` bytes vouched for, and stored
    // to `dst`; the pass takes them as read, never back from `dst`.
    unsafe {
        let mut s = State::with(crc, copy_head(dst, src));
        copy_blocks(&mut s, dst.add(256), src.add(256), blocks);
        let tail = copy_tail(dst.add(done), src.add(done), vectors, rest, &mut last);
        s.finish_with(&tail[..vectors], &last[..rest])
    }
}

/// The assembly that moves 256 bytes from `{src}` to `{dst}` through
/// `{v0}` to `{v3}`, which keep them: the head's copy and each step
/// of the block loop.
macro_rules! move_256 {
    () => {
        concat!(
            "vmovdqu64 {v0}, zmmword ptr [{src}]\n",
            "vmovdqu64 {v1}, zmmword ptr [{src} + 64]\n",
            "vmovdqu64 {v2}, zmmword ptr [{src} + 128]\n",
            "vmovdqu64 {v3}, zmmword ptr [{src} + 192]\n",
            "vmovdqu64 zmmword ptr [{dst}], {v0}\n",
            "vmovdqu64 zmmword ptr [{dst} + 64], {v1}\n",
            "vmovdqu64 zmmword ptr [{dst} + 128], {v2}\n",
            "vmovdqu64 zmmword ptr [{dst} + 192], {v3}",
        )
    };
}

/// Copies the first 256 bytes from `src` to `dst` and returns them
/// as four vectors, so that the pass need not read them back (a load
/// right after a `rep movsb` to the same place waits for its stores
/// to reach the cache). Inline assembly, for the reason given at
/// [`copy_blocks`].
///
/// # Safety
/// As for [`copy_blocks`], over 256 bytes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn copy_head(dst: *mut u8, src: *const u8) -> [__m512i; 4] {
    let (v0, v1, v2, v3);
    // SAFETY: reads 256 bytes at `src` and writes 256 at `dst`, both
    // vouched for by the caller, and touches nothing else.
    unsafe {
        core::arch::asm!(
            move_256!(),
            src = in(reg) src,
            dst = in(reg) dst,
            v0 = out(zmm_reg) v0,
            v1 = out(zmm_reg) v1,
            v2 = out(zmm_reg) v2,
            v3 = out(zmm_reg) v3,
            options(nostack, preserves_flags),
        );
    }
    [v0, v1, v2, v3]
}

/// Copies the tail after the blocks from `src` to `dst`: `vectors`
/// whole vectors, returned as they were read (those past `vectors`
/// zero), then `rest` bytes (under 64) with a masked load and store,
/// which touch no byte past the end (a masked-out byte is neither
/// read nor faulted on), also written whole, its unused bytes zero,
/// to `last`. The pass takes them from there, not from `dst`: a
/// load of bytes just stored waits for the stores to reach the
/// cache, and a transmit frame's lines are most often still the
/// other core's (the receiver freed the buffer), so that wait was a
/// cross-core round trip per frame. Inline assembly, for the reason
/// given at [`copy_blocks`].
///
/// # Safety
/// The CPU has AVX-512BW; `src` is valid for reads and `dst` for
/// writes of `vectors * 64 + rest` bytes as [`copy_blocks`] requires;
/// `vectors <= 3`, `rest < 64`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn copy_tail(
    dst: *mut u8,
    src: *const u8,
    vectors: usize,
    rest: usize,
    last: &mut [u8; 64],
) -> [__m512i; 3] {
    debug_assert!(vectors <= 3 && rest < 64);
    let mask: u64 = (1u64 << rest) - 1;
    let (v0, v1, v2);
    // SAFETY: reads `vectors * 64 + rest` bytes at `src` and writes
    // as many at `dst` (the masked accesses touch only the `rest`
    // bytes), both vouched for by the caller, and 64 bytes at `last`,
    // a borrowed array; nothing else.
    unsafe {
        core::arch::asm!(
            "vpxorq {v0}, {v0}, {v0}",
            "vpxorq {v1}, {v1}, {v1}",
            "vpxorq {v2}, {v2}, {v2}",
            "test {n}, {n}",
            "jz 3f",
            "vmovdqu64 {v0}, zmmword ptr [{src}]",
            "vmovdqu64 zmmword ptr [{dst}], {v0}",
            "cmp {n}, 1",
            "je 3f",
            "vmovdqu64 {v1}, zmmword ptr [{src} + 64]",
            "vmovdqu64 zmmword ptr [{dst} + 64], {v1}",
            "cmp {n}, 2",
            "je 3f",
            "vmovdqu64 {v2}, zmmword ptr [{src} + 128]",
            "vmovdqu64 zmmword ptr [{dst} + 128], {v2}",
            "3:",
            "kmovq {k}, {m}",
            "vmovdqu8 {v} {{{k}}} {{z}}, zmmword ptr [{rsrc}]",
            "vmovdqu8 zmmword ptr [{rdst}] {{{k}}}, {v}",
            "vmovdqu64 zmmword ptr [{last}], {v}",
            src = in(reg) src,
            dst = in(reg) dst,
            rsrc = in(reg) src.wrapping_add(vectors * 64),
            rdst = in(reg) dst.wrapping_add(vectors * 64),
            n = in(reg) vectors,
            m = in(reg) mask,
            last = in(reg) last.as_mut_ptr(),
            k = out(kreg) _,
            v = out(zmm_reg) _,
            v0 = out(zmm_reg) v0,
            v1 = out(zmm_reg) v1,
            v2 = out(zmm_reg) v2,
            options(nostack),
        );
    }
    [v0, v1, v2]
}

/// [`State::blocks`] over `blocks` 256-byte blocks read from `src`,
/// each stored to `dst` as it is read.
///
/// The loop is inline assembly: `src` may be registered memory that
/// the application writes meanwhile, and, as for `memory/shared.rs`'s
/// `rep movsb`, the compiler treats the block as opaque; its effect on
/// memory is that of relaxed atomic byte loads from `src` and stores
/// to `dst` (a vector access never tears a byte), so a racing write
/// yields unspecified bytes, never undefined behaviour. The
/// instructions are the ones [`State::blocks`] compiles to: per
/// 64-byte vector a load, a store, two `vpdpbusd` for the checksum
/// lanes and two `vpclmulqdq` and a `vpternlogq` for the CRC fold.
///
/// # Safety
/// The CPU has the features enabled here; `src` is valid for reads
/// and `dst` for writes of `blocks * 256` bytes, not overlapping, and
/// other accesses to `src` are as [`super::copy_crc_sum`] requires.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni,vpclmulqdq")]
unsafe fn copy_blocks(s: &mut State, dst: *mut u8, src: *const u8, blocks: usize) {
    if blocks == 0 {
        return;
    }
    let k = constants(FOLD_256);
    let (we, wo) = weights();
    let [mut a0, mut a1, mut a2, mut a3] = s.a;
    // SAFETY: the loop reads `blocks * 256` bytes from `src` and
    // writes as many to `dst`, both vouched for by the caller, and
    // touches nothing else; the registers it changes are declared.
    // AVX-512F, VNNI and VPCLMULQDQ are enabled for this function.
    unsafe {
        core::arch::asm!(
            "2:",
            move_256!(),
            "vpdpbusd {even}, {v0}, {we}",
            "vpdpbusd {odd}, {v0}, {wo}",
            "vpclmulqdq {t}, {a0}, {k}, 0x00",
            "vpclmulqdq {a0}, {a0}, {k}, 0x11",
            "vpternlogq {a0}, {t}, {v0}, 0x96",
            "vpdpbusd {even}, {v1}, {we}",
            "vpdpbusd {odd}, {v1}, {wo}",
            "vpclmulqdq {t}, {a1}, {k}, 0x00",
            "vpclmulqdq {a1}, {a1}, {k}, 0x11",
            "vpternlogq {a1}, {t}, {v1}, 0x96",
            "vpdpbusd {even}, {v2}, {we}",
            "vpdpbusd {odd}, {v2}, {wo}",
            "vpclmulqdq {t}, {a2}, {k}, 0x00",
            "vpclmulqdq {a2}, {a2}, {k}, 0x11",
            "vpternlogq {a2}, {t}, {v2}, 0x96",
            "vpdpbusd {even}, {v3}, {we}",
            "vpdpbusd {odd}, {v3}, {wo}",
            "vpclmulqdq {t}, {a3}, {k}, 0x00",
            "vpclmulqdq {a3}, {a3}, {k}, 0x11",
            "vpternlogq {a3}, {t}, {v3}, 0x96",
            "add {src}, 256",
            "add {dst}, 256",
            "dec {n}",
            "jnz 2b",
            src = inout(reg) src => _,
            dst = inout(reg) dst => _,
            n = inout(reg) blocks => _,
            a0 = inout(zmm_reg) a0,
            a1 = inout(zmm_reg) a1,
            a2 = inout(zmm_reg) a2,
            a3 = inout(zmm_reg) a3,
            even = inout(zmm_reg) s.even,
            odd = inout(zmm_reg) s.odd,
            k = in(zmm_reg) k,
            we = in(zmm_reg) we,
            wo = in(zmm_reg) wo,
            v0 = out(zmm_reg) _,
            v1 = out(zmm_reg) _,
            v2 = out(zmm_reg) _,
            v3 = out(zmm_reg) _,
            t = out(zmm_reg) _,
            options(nostack),
        );
    }
    s.a = [a0, a1, a2, a3];
}
