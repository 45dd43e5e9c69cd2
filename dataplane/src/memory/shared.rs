//! Copies into and out of registered memory: the one way any byte of a
//! [`super::Region`] is read or written by the dataplane or by the
//! application through the region's methods (placement of received
//! payload, the send path's CRC and checksum passes and its copy into a
//! frame, `Region::read` and `Region::write`). Ports that attach region
//! memory to a frame hand it to the device, which reads it by DMA.
//!
//! # Why a concurrent access is not undefined behaviour
//!
//! Registered memory is shared, as a NIC's DMA target is: the
//! application may write a buffer while a peer's RDMA Write lands in it,
//! or read it while we place into it. Rust gives a data race between
//! non-atomic accesses undefined behaviour, so these copies must not be
//! plain `memcpy` on `&[u8]`. Each copy is instead one `rep movsb` in
//! inline assembly on x86-64. The compiler treats the block as opaque:
//! it can only assume that the block does what some Rust code could
//! have done with the same pointers, and the hardware's effect of `rep
//! movsb` is exactly what a loop of relaxed atomic one-byte loads and
//! stores does (each byte moved is read and written whole, in some
//! order; x86 never tears a byte). Relaxed atomic accesses may race
//! with each other without undefined behaviour; they only yield some
//! interleaving of the racing writes, as the hardware does. Every access
//! to region memory is of that one kind and width (bytes), so no mixed-
//! size atomic access is ever made. Elsewhere the same loop is written
//! in Rust, one `AtomicU8` at a time (slower, with the same meaning).
//! The transmit path's payload pass (`crate::pass`) reads region memory
//! in a vector loop written as inline assembly for the same reason, with
//! the same argument: its loads and stores are whole bytes in effect.
//!
//! What makes the bytes *specified* is the completion ring (module
//! documentation of [`super`]): an access that races yields unspecified
//! bytes, never undefined behaviour.

#[cfg(not(target_arch = "x86_64"))]
use core::sync::atomic::{AtomicU8, Ordering};

/// Copies `len` bytes from `src` to `dst`, either of which may be region
/// memory that others read or write meanwhile (see the module
/// documentation).
///
/// # Safety
/// `src` is valid for reads of `len` bytes and `dst` for writes of `len`
/// bytes for the whole call, the two ranges do not overlap, and any
/// other access to them meanwhile is made through this function (or is
/// atomic at byte width, or a device's DMA).
#[inline]
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len < 16 {
        // SAFETY: as the caller guarantees; `len < 16`.
        unsafe { copy_short(dst, src, len) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if len < SHORT || slow_distance(dst, src) {
        // SAFETY: as the caller guarantees; `len >= 16`.
        unsafe { copy_by_vectors(dst, src, len) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller guarantees both ranges are valid for `len`
    // bytes and disjoint. `rep movsb` moves `rcx` bytes from `[rsi]` to
    // `[rdi]` upwards (the direction flag is clear on entry to inline
    // assembly, as the ABI requires), touches no stack and no flags, and
    // leaves the three registers changed, which the operands declare.
    unsafe {
        core::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    for i in 0..len {
        // SAFETY: as the caller guarantees, byte `i` of each range is
        // valid; `AtomicU8` has the size and alignment of `u8`, and only
        // shared references to atomics are made.
        unsafe {
            let b = (*src.add(i).cast::<AtomicU8>()).load(Ordering::Relaxed);
            (*dst.add(i).cast::<AtomicU8>()).store(b, Ordering::Relaxed);
        }
    }
}

/// Below this, [`copy`] moves vectors rather than starting `rep movsb`,
/// whose start-up costs ~12 ns whatever the length up to here (a 40-byte
/// copy: ~12 ns against ~5 by vectors, on AMD Zen 3): a small message's
/// placement and its copy into a frame.
const SHORT: usize = 128;

/// Whether `dst` lies 1 to 31 bytes past `src` modulo 4096, where `rep
/// movsb` runs some fifteen times slower on AMD Zen 3 (measured: 1,448
/// bytes in ~880 ns against ~30–50 elsewhere, 8,948 in ~3.3 µs against
/// ~105 ns), as if each store waited on the load 4 KiB-aliased just
/// ahead of it. A placement meets it about once in 130 frames (the
/// payload's offset in its buffer and the tagged offset move
/// independently).
#[inline]
fn slow_distance(dst: *mut u8, src: *const u8) -> bool {
    let d = (dst as usize).wrapping_sub(src as usize) & 4095;
    (1..32).contains(&d)
}

/// [`copy`] under 16 bytes: two overlapping moves of the widest size
/// that fits (8, 4, or a byte and a 16-bit word), so that no length
/// loops. Inline assembly for the reason `rep movsb` is, with the same
/// effect (a byte stored twice gets a byte the source held each time).
///
/// # Safety
/// As for [`copy`]; `len < 16`.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn copy_short(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(len < 16);
    // SAFETY: each branch reads and writes inside `[0, len)` of both
    // ranges the caller vouches for: 8 bytes at 0 and at `len - 8` when
    // `len >= 8`, 4 at 0 and `len - 4` when `len >= 4`, else a byte at 0
    // and, for 2 or 3 bytes, a 16-bit word at `len - 2`; nothing when
    // `len == 0`. The registers written and the flags are declared.
    unsafe {
        core::arch::asm!(
            "cmp {len}, 8",
            "jb 4f",
            "mov {a}, qword ptr [{src}]",
            "mov {b}, qword ptr [{src} + {len} - 8]",
            "mov qword ptr [{dst}], {a}",
            "mov qword ptr [{dst} + {len} - 8], {b}",
            "jmp 6f",
            "4:",
            "cmp {len}, 4",
            "jb 5f",
            "mov {a:e}, dword ptr [{src}]",
            "mov {b:e}, dword ptr [{src} + {len} - 4]",
            "mov dword ptr [{dst}], {a:e}",
            "mov dword ptr [{dst} + {len} - 4], {b:e}",
            "jmp 6f",
            "5:",
            "test {len}, {len}",
            "jz 6f",
            "movzx {a:e}, byte ptr [{src}]",
            "mov byte ptr [{dst}], {a:l}",
            "cmp {len}, 1",
            "je 6f",
            "movzx {b:e}, word ptr [{src} + {len} - 2]",
            "mov word ptr [{dst} + {len} - 2], {b:x}",
            "6:",
            src = in(reg) src,
            dst = in(reg) dst,
            len = in(reg) len,
            a = out(reg) _,
            b = out(reg) _,
            options(nostack),
        );
    }
}

/// [`copy`] in 16-byte vectors, for short runs and for the distances
/// where `rep movsb` is slow (~40 ns for 1,448 bytes at such a
/// distance): the loop takes the
/// whole vectors, then the last 16 bytes again, overlapping the loop's
/// last store. Inline assembly for the reason `rep movsb` is; its loads
/// and stores have the effect of byte accesses as that instruction's do
/// (a byte stored twice gets a byte the source held each time).
///
/// # Safety
/// As for [`copy`]; `len >= 16`.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn copy_by_vectors(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(len >= 16);
    // SAFETY: the loop moves 16 bytes at offsets `i < len - 16` and then
    // at `len - 16`, all inside both ranges the caller vouches for; SSE2
    // is part of x86-64; the registers written are declared (and the
    // flags, no `preserves_flags`); no stack is touched.
    unsafe {
        core::arch::asm!(
            "lea {end}, [{len} - 16]",
            "xor {i}, {i}",
            "2:",
            "cmp {i}, {end}",
            "jae 3f",
            "movdqu {v}, xmmword ptr [{src} + {i}]",
            "movdqu xmmword ptr [{dst} + {i}], {v}",
            "add {i}, 16",
            "jmp 2b",
            "3:",
            "movdqu {v}, xmmword ptr [{src} + {end}]",
            "movdqu xmmword ptr [{dst} + {end}], {v}",
            src = in(reg) src,
            dst = in(reg) dst,
            len = in(reg) len,
            end = out(reg) _,
            i = out(reg) _,
            v = out(xmm_reg) _,
            options(nostack),
        );
    }
}

/// Asks the CPU to start bringing the cache lines of `len` bytes at
/// `ptr` into its caches, ahead of a pass that reads them soon (the send
/// path's copy of the next record). A hint only: a prefetch
/// loads nothing the program can observe, changes no byte, never faults
/// (whatever the address) and is not an access in the memory model, so
/// it may race with anything and needs no valid pointer.
#[inline]
pub(crate) fn prefetch(ptr: *const u8, len: usize) {
    prefetch_lines::<false>(ptr, len);
}

/// Asks the CPU to start bringing the cache lines of `len` bytes at
/// `ptr` into its caches for writing (owned, so that the stores that
/// follow need not ask the core that last held them): before a transmit
/// frame whose buffer another core used last is filled. A hint only, as
/// [`prefetch`].
#[inline]
pub(crate) fn prefetch_write(ptr: *const u8, len: usize) {
    prefetch_lines::<true>(ptr, len);
}

/// The loop of [`prefetch_lines`] with the hint instruction `$hint`:
/// `{n}` lines from `{p}` on, four a turn, then one at a time.
#[cfg(target_arch = "x86_64")]
macro_rules! hint_lines {
    ($hint:literal) => {
        concat!(
            "cmp {n}, 4\n",
            "jb 3f\n",
            "2:\n",
            $hint,
            " byte ptr [{p}]\n",
            $hint,
            " byte ptr [{p} + 64]\n",
            $hint,
            " byte ptr [{p} + 128]\n",
            $hint,
            " byte ptr [{p} + 192]\n",
            "add {p}, 256\n",
            "sub {n}, 4\n",
            "cmp {n}, 4\n",
            "jae 2b\n",
            "3:\n",
            "test {n}, {n}\n",
            "jz 5f\n",
            "4:\n",
            $hint,
            " byte ptr [{p}]\n",
            "add {p}, 64\n",
            "dec {n}\n",
            "jnz 4b\n",
            "5:",
        )
    };
}

/// [`prefetch`] (`prefetcht0`) or, with `WRITE`, [`prefetch_write`]
/// (`prefetchw`) of every line of `len` bytes at `ptr`.
///
/// Four lines a turn of the loop, then one at a time: the hints are
/// issued on every frame, mostly for lines already near (a frame's 24
/// lines just written by this core, placement's next lines on a busy
/// connection), where the loop around them was most of their cost.
#[inline]
fn prefetch_lines<const WRITE: bool>(ptr: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if len == 0 {
            return;
        }
        let first = ptr as usize & !63;
        let last = (ptr as usize).saturating_add(len - 1) & !63;
        let lines = ((last - first) >> 6) + 1;
        // SAFETY: `prefetcht0` and `prefetchw` only hint the cache
        // hierarchy: they make no architectural memory access and raise
        // no fault for any address (an unmapped one is dropped, and the
        // address register may wrap past the top of the address space
        // without harm). The loop writes only the two registers it
        // declares and the flags; no stack is touched.
        unsafe {
            if WRITE {
                core::arch::asm!(
                    hint_lines!("prefetchw"),
                    p = inout(reg) first => _,
                    n = inout(reg) lines => _,
                    options(nostack, readonly)
                );
            } else {
                core::arch::asm!(
                    hint_lines!("prefetcht0"),
                    p = inout(reg) first => _,
                    n = inout(reg) lines => _,
                    options(nostack, readonly)
                );
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ptr, len);
}

/// How many of the first `len` bytes at `shared` (memory others may
/// write meanwhile, as for [`copy`]) match `own` from the start, in
/// whole 64-byte blocks: the first block holding a difference, and
/// everything after it, is not counted. Where the CPU has AVX-512BW the
/// blocks are compared in a loop of inline assembly that reads each
/// shared byte once (a vector load, whose effect is that of byte loads as
/// `rep movsb`'s is; see the module documentation); elsewhere it returns
/// 0 and the caller compares through a copy.
///
/// # Safety
/// `shared` is valid for reads of `len` bytes for the whole call and any
/// other access to it meanwhile is made through these functions (or is
/// atomic at byte width, or a device's DMA); `own` holds at least `len`
/// bytes.
pub(crate) unsafe fn equal_blocks(shared: *const u8, own: &[u8], len: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bw") {
        // SAFETY: the CPU has AVX-512BW (checked just above); the
        // pointers are as the caller guarantees.
        return unsafe { equal_blocks_avx512(shared, own.as_ptr(), len.min(own.len())) };
    }
    let _ = (shared, own, len);
    0
}

/// [`equal_blocks`] in 64-byte vectors.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW; `shared` and `own` are valid for
/// reads of `len` bytes, `shared` as [`equal_blocks`] requires.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn equal_blocks_avx512(shared: *const u8, own: *const u8, len: usize) -> usize {
    let blocks = len / 64;
    let left: usize;
    // SAFETY: the loop reads `64 * blocks <= len` bytes from each
    // pointer, upwards, both valid as the caller guarantees; it writes
    // only the registers declared (zmm0, k1, the counters) and the flags
    // (no `preserves_flags`), touches no stack. It stops at the first
    // block with a difference, leaving in `rcx` the blocks not matched.
    unsafe {
        core::arch::asm!(
            "test {n}, {n}",
            "jz 3f",
            "2:",
            "vmovdqu64 {v}, zmmword ptr [{s}]",
            "vpcmpneqb {k}, {v}, zmmword ptr [{o}]",
            "kortestq {k}, {k}",
            "jnz 3f",
            "add {s}, 64",
            "add {o}, 64",
            "dec {n}",
            "jnz 2b",
            "3:",
            s = inout(reg) shared => _,
            o = inout(reg) own => _,
            n = inout(reg) blocks => left,
            v = out(zmm_reg) _,
            k = out(kreg) _,
            options(nostack, readonly)
        );
    }
    (blocks - left) * 64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_exact_at_every_distance_modulo_a_page() {
        // Under 16 bytes the overlapping moves, under 128 and at
        // distances 1 to 31 modulo 4096 the vector loop, else `rep
        // movsb`: each must move exactly the bytes asked for.
        let page = 4096;
        let src: Vec<u8> = (0..3 * page).map(|i| (i * 7 + 1) as u8).collect();
        let mut dst = vec![0u8; 4 * page];
        let s = 100;
        let base = (dst.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize) & (page - 1);
        for d in (0..70).chain([4000, 4090, 4095]) {
            // The offset in `dst` that puts it `d` past the source.
            let at = (d + page - base) % page + s;
            for len in (0..=17).chain([31, 32, 33, 100, 127, 128, 1448, 8948]) {
                dst.fill(0xee);
                let from = &src[s..s + len];
                // SAFETY: `dst[at..at + len]` and `src[s..s + len]` are
                // inside their vectors (at < 4196, len < 9000), distinct
                // allocations; nothing else touches them.
                unsafe { copy(dst.as_mut_ptr().add(at), from.as_ptr(), len) };
                assert_eq!(
                    (dst[at..].as_ptr() as usize).wrapping_sub(from.as_ptr() as usize) & 4095,
                    d
                );
                assert_eq!(&dst[at..at + len], from, "distance {d}, len {len}");
                assert!(
                    dst[..at].iter().all(|&b| b == 0xee),
                    "distance {d}, len {len}"
                );
                assert!(
                    dst[at + len..].iter().all(|&b| b == 0xee),
                    "distance {d}, len {len}"
                );
            }
        }
    }

    #[test]
    fn equal_blocks_counts_the_matching_blocks_before_a_difference() {
        let a: Vec<u8> = (0..1000u32).map(|i| (i * 13 + 5) as u8).collect();
        let vector =
            cfg!(target_arch = "x86_64") && std::arch::is_x86_feature_detected!("avx512bw");
        for len in [0, 1, 63, 64, 65, 128, 640, 999] {
            let b = a.clone();
            // SAFETY: both vectors hold 1000 bytes; nothing else touches
            // them.
            let n = unsafe { equal_blocks(a.as_ptr(), &b, len) };
            assert_eq!(n, if vector { len / 64 * 64 } else { 0 }, "len {len}");
            for flip in [0, 63, 64, 300, len.saturating_sub(1)] {
                if flip >= len {
                    continue;
                }
                let mut c = a.clone();
                c[flip] ^= 0x10;
                // SAFETY: as above.
                let n = unsafe { equal_blocks(a.as_ptr(), &c, len) };
                let want = if vector {
                    (flip / 64 * 64).min(len / 64 * 64)
                } else {
                    0
                };
                assert_eq!(n, want, "len {len} flip {flip}");
            }
        }
    }

    #[test]
    fn every_length_and_alignment_copies_exactly() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in 0..9 {
            for len in [0, 1, 7, 8, 9, 63, 64, 65, 200] {
                let mut dst = vec![0xeeu8; 300];
                // SAFETY: both ranges lie inside their vectors, which are
                // distinct allocations.
                unsafe { copy(dst.as_mut_ptr().add(off), src.as_ptr().add(3), len) };
                assert_eq!(&dst[off..off + len], &src[3..3 + len], "{off} {len}");
                assert!(dst[..off].iter().all(|&b| b == 0xee));
                assert!(dst[off + len..].iter().all(|&b| b == 0xee));
            }
        }
    }
}
