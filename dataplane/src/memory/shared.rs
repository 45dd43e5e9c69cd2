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

#[cfg(test)]
mod tests {
    use super::*;

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
