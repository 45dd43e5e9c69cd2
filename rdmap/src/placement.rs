//! The placement trait: the only way the protocol core reaches application memory.
//!
//! The receive path (DDP tagged placement into a region and untagged
//! placement into posted receive buffers, RFC 5041's two buffer models) and
//! the send path (FPDU payload described by reference, Read Response source,
//! RFC 5040 §5.1–§5.3)
//! never hold pointers. They hold *capabilities* that only the memory-region
//! table in [`crate::verbs::mr`] can mint, after it has checked STag, key,
//! protection domain, access rights, base and bounds:
//!
//! - [`CheckedRange`]: a byte range inside one registered region, borrowed
//!   from the check that produced it (from the table, or from a
//!   [`RegionRef`]). Its lifetime keeps it from outliving the check: the
//!   receive path checks, places, and drops it; a later segment checks again.
//! - [`RegionRef`]: an owned, *pinned* reference. While it exists the region
//!   cannot finish deregistering, so the send path can hand its bytes to the
//!   NIC as an external buffer and retransmit them until TCP reports them
//!   acknowledged. It is returned to the table with
//!   [`MrTable::unpin`](crate::verbs::mr::MrTable::unpin).
//!
//! The dataplane implements [`Placement`] over its registered (hugepage)
//! memory; tests use [`VecMemory`]. Because every range handed to an
//! implementation was minted by the table, an implementation never sees an
//! offset or length outside the span the application registered.

use crate::verbs::mr::Mint;

/// The dataplane's name for one block of registered memory (a hugepage
/// buffer, an application allocation). Opaque to rdmap: it is only passed
/// back to [`Placement`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionHandle(pub u64);

/// The bytes `[offset, offset + len)` of the dataplane region `region`: what a
/// memory registration (or a fast-register work request) binds an STag to.
///
/// Trusted input: it comes from the application through the dataplane, which
/// owns the region and must only describe bytes that exist. A peer can never
/// produce one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemSpan {
    /// The dataplane region.
    pub region: RegionHandle,
    /// Offset of the first byte inside the region.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl MemSpan {
    /// The bytes `[offset, offset + len)` of `region`.
    pub const fn new(region: RegionHandle, offset: u64, len: u64) -> MemSpan {
        MemSpan {
            region,
            offset,
            len,
        }
    }
}

/// A checked byte range of one registered region.
///
/// Only the memory-region table mints these, after every protection check
/// has passed, so `offset + len` always lies inside the span the application
/// registered. The lifetime ties it to the check: it cannot be kept across a
/// deregistration. A check never yields an empty range (zero-length
/// accesses yield no range at all); only the remainder left by
/// [`CheckedRange::take_front`] can become empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckedRange<'a> {
    region: RegionHandle,
    offset: u64,
    len: u32,
    _check: core::marker::PhantomData<&'a ()>,
}

impl<'a> CheckedRange<'a> {
    /// Minted by [`crate::verbs::mr`] only (the [`Mint`] token has a private
    /// constructor there).
    pub(crate) fn mint(_: Mint, region: RegionHandle, offset: u64, len: u32) -> CheckedRange<'a> {
        CheckedRange {
            region,
            offset,
            len,
            _check: core::marker::PhantomData,
        }
    }

    /// The dataplane region.
    pub fn region(&self) -> RegionHandle {
        self.region
    }

    /// Offset inside the dataplane region (not the tagged offset).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether nothing is left (only after [`CheckedRange::take_front`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sub-range `[at, at + len)` of this range, or `None` if it does not
    /// lie inside it or is empty. How the receive path places the pieces of
    /// one DDP segment that the deframer hands over in several slices.
    pub fn sub(&self, at: u32, len: u32) -> Option<CheckedRange<'a>> {
        let end = at.checked_add(len)?;
        if len == 0 || end > self.len {
            return None;
        }
        Some(CheckedRange {
            region: self.region,
            offset: self.offset + u64::from(at),
            len,
            _check: core::marker::PhantomData,
        })
    }

    /// Splits off the first `n` bytes: returns them and leaves the rest in
    /// `self`. `None` (and `self` untouched) if `n` is zero or longer than
    /// the range; taking the whole range leaves `self` empty.
    pub fn take_front(&mut self, n: usize) -> Option<CheckedRange<'a>> {
        let n = u32::try_from(n).ok()?;
        if n == 0 || n > self.len {
            return None;
        }
        let front = CheckedRange {
            region: self.region,
            offset: self.offset,
            len: n,
            _check: core::marker::PhantomData,
        };
        self.offset += u64::from(n);
        self.len -= n;
        Some(front)
    }
}

/// A pinned reference to part of a registered region, owned by whoever
/// must keep the bytes alive: an FPDU waiting for TCP's acknowledgement, a
/// Read Response that may be retransmitted, an inbound Read Request queued
/// for response.
///
/// While any `RegionRef` to a memory region exists, deregistering it only
/// *starts* (the region is refused to every new access at once) and
/// completes when the last reference is returned with
/// [`MrTable::unpin`](crate::verbs::mr::MrTable::unpin). Invalidation is
/// immediate for new accesses but does not disturb existing references.
///
/// Not `Clone`: each one accounts for one pin count. Dropping one without
/// returning it leaks the pin (the region then never finishes
/// deregistering), which is safe but a bug in the caller.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a RegionRef must be returned with MrTable::unpin"]
pub struct RegionRef {
    pub(crate) index: u32,
    pub(crate) epoch: u32,
    region: RegionHandle,
    offset: u64,
    len: u32,
}

impl RegionRef {
    pub(crate) fn mint(
        _: Mint,
        index: u32,
        epoch: u32,
        region: RegionHandle,
        offset: u64,
        len: u32,
    ) -> RegionRef {
        RegionRef {
            index,
            epoch,
            region,
            offset,
            len,
        }
    }

    /// The pinned bytes, for the framer and the dataplane's external buffer.
    pub fn range(&self) -> CheckedRange<'_> {
        CheckedRange {
            region: self.region,
            offset: self.offset,
            len: self.len,
            _check: core::marker::PhantomData,
        }
    }

    /// Length in bytes (at least 1).
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Always false (see [`CheckedRange::is_empty`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A placement whose memory was not there: nothing was written. Never
/// the peer's doing (every range was checked against the memory-region
/// table first), so the engine answers it with a local catastrophic
/// error (RFC 5041 §7.2), not a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unplaced;

/// Access to registered memory, implemented by the dataplane.
///
/// Every range passed in was minted by the memory-region table after its
/// checks; implementations may rely on `range.offset() + range.len()` lying
/// inside the region, and on the region being registered.
pub trait Placement {
    /// Copies `data` into `dst`. `data.len()` equals `dst.len()`: callers cut
    /// the range to the slice with [`CheckedRange::take_front`] or
    /// [`CheckedRange::sub`]. [`Unplaced`] when the memory behind the
    /// range is not there after all (a broken invariant of the
    /// implementation): the engine then ends the stream rather than
    /// complete a message whose bytes are missing.
    fn write(&mut self, dst: CheckedRange<'_>, data: &[u8]) -> Result<(), Unplaced>;

    /// Copies `src` into `dst`; `dst.len()` equals `src.len()`. The send path
    /// uses it only where the port cannot attach the region as an external
    /// buffer (and tests use it to check placement).
    fn read(&self, src: CheckedRange<'_>, dst: &mut [u8]);

    /// Extends the CRC32c `crc` (as [`crc32c::crc32c_append`] does) over the
    /// bytes of `src`. The send path computes the MPA CRC of an FPDU whose
    /// payload stays in the region (RFC 5044 §4, zero-copy transmit).
    ///
    /// The default reads the range through [`Placement::read`] into a
    /// small stack buffer, chunk by chunk; implementations that can see
    /// their memory as slices should override it and run over the bytes in
    /// place.
    fn crc32c_append(&self, crc: u32, src: CheckedRange<'_>) -> u32 {
        const CHUNK: usize = 512;
        let mut buf = [0u8; CHUNK];
        let mut rest = src;
        let mut crc = crc;
        while !rest.is_empty() {
            let n = (rest.len() as usize).min(CHUNK);
            let Some(front) = rest.take_front(n) else {
                break;
            };
            self.read(front, &mut buf[..n]);
            crc = crate::crc::append(crc, &buf[..n]);
        }
        crc
    }

    /// Whether the send path should take the payload's Internet checksum
    /// sum in the same pass as its MPA CRC ([`Placement::crc32c_and_sum`])
    /// and keep it in the record. Worth it only where the port cannot
    /// offload the TCP checksum: elsewhere the sum is work nobody uses, so
    /// the default says no and the CRC pass runs alone.
    fn sum_with_crc(&self) -> bool {
        false
    }

    /// Whether the driver computes the MPA CRC of an FPDU (one without
    /// markers) itself, in the pass that copies the record into the frame
    /// (a port that takes no payload by reference), so that the send path
    /// leaves it out ([`OutRecord::crc_pending`]) instead of reading the
    /// payload once more. The default says no: the send path computes
    /// every CRC.
    ///
    /// [`OutRecord::crc_pending`]: crate::engine::OutRecord::crc_pending
    fn crc_at_transmit(&self) -> bool {
        false
    }

    /// Extends the CRC32c `crc` over the bytes of `src` and returns it with
    /// the Internet checksum's partial sum of the same bytes (RFC 1071,
    /// see [`internet_sum`]), taken as if they started at an even offset.
    ///
    /// The send path needs both for an FPDU whose payload stays in the
    /// region: the MPA CRC (RFC 5044 §4) and, on ports that cannot offload
    /// it, the TCP checksum of the segment carrying it. Without checksum
    /// offload the TCP checksum touches every payload byte, so an
    /// implementation that sees its memory should override this and make
    /// one pass, feeding each chunk to both while it is in L1. The default
    /// makes the two passes one after the other, so every implementation
    /// stays correct.
    fn crc32c_and_sum(&self, crc: u32, src: CheckedRange<'_>) -> (u32, u32) {
        const CHUNK: usize = 512;
        let crc = self.crc32c_append(crc, src);
        let mut buf = [0u8; CHUNK];
        let mut rest = src;
        let mut sum = 0u32;
        while !rest.is_empty() {
            let n = (rest.len() as usize).min(CHUNK);
            let Some(front) = rest.take_front(n) else {
                break;
            };
            self.read(front, &mut buf[..n]);
            // CHUNK is even, so every chunk starts at an even offset.
            sum = sum_combine(sum, internet_sum(&buf[..n]));
        }
        (crc, sum)
    }
}

/// The Internet checksum's partial sum of `data` (RFC 1071 §4.1): the
/// one's-complement sum of its big-endian 16-bit words, a final odd byte
/// padded with zero, folded to 16 bits and not complemented.
///
/// Its own small copy here because rdmap does not depend on the TCP crate;
/// the value is the one `tcp_offload::wire::checksum::sum` computes, so
/// the dataplane combines them freely.
pub fn internet_sum(data: &[u8]) -> u32 {
    // 2^16 ≡ 1 (mod 2^16 − 1): 32-bit words added into a 64-bit
    // accumulator and folded at the end give the same sum, with no
    // overflow for any buffer under 16 GiB.
    let mut acc = 0u64;
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        acc += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    acc += u64::from(u32::from_be_bytes(tail));
    u32::from(fold64(acc))
}

/// Adds two partial sums of blocks that both start at even offsets of the
/// checksummed whole (RFC 1071 §2(B), associativity).
pub fn sum_combine(a: u32, b: u32) -> u32 {
    u32::from(fold64(u64::from(a) + u64::from(b)))
}

/// Adds the partial sum `b` of a block that starts `offset` bytes into the
/// checksummed whole to `a`: at an odd offset the block's bytes sit in the
/// other half of every word, so its folded sum is byte-swapped first (RFC
/// 1071 §2(B)).
pub fn sum_combine_at(a: u32, b: u32, offset: usize) -> u32 {
    let b = if offset % 2 == 1 {
        u32::from(fold64(u64::from(b)).swap_bytes())
    } else {
        b
    };
    sum_combine(a, b)
}

/// Folds a one's-complement accumulator to 16 bits with end-around carry.
fn fold64(mut s: u64) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    // The loop leaves `s <= 0xffff`.
    s as u16
}

/// Registered memory as plain vectors: the test and simulation
/// implementation of [`Placement`].
#[derive(Debug, Default, Clone)]
pub struct VecMemory {
    regions: Vec<Vec<u8>>,
    crc_at_transmit: bool,
    /// Regions whose placements fail ([`VecMemory::refuse_writes`]).
    refused: Vec<RegionHandle>,
}

impl VecMemory {
    /// No regions yet.
    pub fn new() -> VecMemory {
        VecMemory::default()
    }

    /// Whether to say that the driver computes the CRC of FPDUs with
    /// payload ([`Placement::crc_at_transmit`]); off at first.
    pub fn set_crc_at_transmit(&mut self, on: bool) {
        self.crc_at_transmit = on;
    }

    /// Makes every placement into `region` fail with [`Unplaced`] from
    /// now on, as memory the implementation lost track of would (tests
    /// of the engine's answer to it).
    pub fn refuse_writes(&mut self, region: RegionHandle) {
        self.refused.push(region);
    }

    /// Adds a zeroed region of `len` bytes.
    pub fn add_region(&mut self, len: usize) -> RegionHandle {
        self.regions.push(vec![0; len]);
        RegionHandle((self.regions.len() - 1) as u64)
    }

    /// Adds a region holding `bytes`.
    pub fn add_region_with(&mut self, bytes: Vec<u8>) -> RegionHandle {
        self.regions.push(bytes);
        RegionHandle((self.regions.len() - 1) as u64)
    }

    /// The span `[offset, offset + len)` of `region`, or `None` if it does
    /// not exist there.
    pub fn span(&self, region: RegionHandle, offset: u64, len: u64) -> Option<MemSpan> {
        let bytes = self.regions.get(usize::try_from(region.0).ok()?)?;
        let end = offset.checked_add(len)?;
        (end <= bytes.len() as u64).then_some(MemSpan::new(region, offset, len))
    }

    /// The whole of `region` as a span.
    pub fn whole(&self, region: RegionHandle) -> Option<MemSpan> {
        let len = self.bytes(region)?.len() as u64;
        Some(MemSpan::new(region, 0, len))
    }

    /// The bytes of `region`.
    pub fn bytes(&self, region: RegionHandle) -> Option<&[u8]> {
        self.regions
            .get(usize::try_from(region.0).ok()?)
            .map(Vec::as_slice)
    }

    /// The bytes of `region`, writable (what the application itself does
    /// with its buffers).
    pub fn bytes_mut(&mut self, region: RegionHandle) -> Option<&mut [u8]> {
        self.regions
            .get_mut(usize::try_from(region.0).ok()?)
            .map(Vec::as_mut_slice)
    }

    fn slot(&self, range: &CheckedRange<'_>) -> core::ops::Range<usize> {
        // A range outside the vector is a broken invariant of the MR table
        // (or a span the test registered wrongly): panicking is the point
        // of a test implementation.
        let start = usize::try_from(range.offset).expect("offset fits usize");
        start..start + range.len as usize
    }
}

impl Placement for VecMemory {
    fn write(&mut self, dst: CheckedRange<'_>, data: &[u8]) -> Result<(), Unplaced> {
        assert_eq!(data.len(), dst.len as usize, "placement length mismatch");
        if self.refused.contains(&dst.region) {
            return Err(Unplaced);
        }
        let slot = self.slot(&dst);
        let bytes = &mut self.regions[dst.region.0 as usize];
        bytes[slot].copy_from_slice(data);
        Ok(())
    }

    fn read(&self, src: CheckedRange<'_>, dst: &mut [u8]) {
        assert_eq!(dst.len(), src.len as usize, "placement length mismatch");
        let slot = self.slot(&src);
        dst.copy_from_slice(&self.regions[src.region.0 as usize][slot]);
    }

    fn crc32c_append(&self, crc: u32, src: CheckedRange<'_>) -> u32 {
        let slot = self.slot(&src);
        crate::crc::append(crc, &self.regions[src.region.0 as usize][slot])
    }

    /// Yes: the simulator's ports offload nothing, and tests check the sum.
    fn sum_with_crc(&self) -> bool {
        true
    }

    fn crc_at_transmit(&self) -> bool {
        self.crc_at_transmit
    }

    fn crc32c_and_sum(&self, crc: u32, src: CheckedRange<'_>) -> (u32, u32) {
        // Chunks small enough to stay in L1 between the two uses, and
        // even, so every chunk starts at an even offset.
        const CHUNK: usize = 2048;
        let slot = self.slot(&src);
        let bytes = &self.regions[src.region.0 as usize][slot];
        let (mut crc, mut sum) = (crc, 0u32);
        for c in bytes.chunks(CHUNK) {
            crc = crate::crc::append(crc, c);
            sum = sum_combine(sum, internet_sum(c));
        }
        (crc, sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::mr::MrTable;
    use crate::verbs::{Access, PdId};

    /// The textbook definition: 16-bit words, end-around carry after every
    /// addition.
    fn naive(data: &[u8]) -> u16 {
        let mut s: u32 = 0;
        for w in data.chunks(2) {
            s += u32::from(w[0]) << 8 | u32::from(w.get(1).copied().unwrap_or(0));
            if s > 0xffff {
                s = (s & 0xffff) + 1;
            }
        }
        s as u16
    }

    /// Memory that offers only `read` and `write`: the trait's defaults.
    struct Plain(VecMemory);

    impl Placement for Plain {
        fn write(&mut self, dst: CheckedRange<'_>, data: &[u8]) -> Result<(), Unplaced> {
            self.0.write(dst, data)
        }
        fn read(&self, src: CheckedRange<'_>, dst: &mut [u8]) {
            self.0.read(src, dst);
        }
    }

    #[test]
    fn internet_sum_matches_rfc1071() {
        // RFC 1071 §3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(internet_sum(&data), 0xddf2);
        let bytes: Vec<u8> = (0..1001u32).map(|i| (i * 151 + 7) as u8).collect();
        for len in [0, 1, 2, 3, 5, 8, 33, 1000, 1001] {
            let s = &bytes[..len];
            assert_eq!(u32::from(naive(s)), internet_sum(s), "len {len}");
            for cut in [0, 1, len / 2, len.saturating_sub(1)]
                .into_iter()
                .filter(|&c| c <= len)
            {
                let joined = sum_combine_at(internet_sum(&s[..cut]), internet_sum(&s[cut..]), cut);
                assert_eq!(fold64(u64::from(joined)), naive(s), "len {len} cut {cut}");
            }
        }
    }

    #[test]
    fn folded_crc_and_sum_equal_the_separate_passes() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 37 + i / 251) as u8).collect();
        let mut vm = VecMemory::new();
        let region = vm.add_region_with(bytes.clone());
        let plain = Plain(vm.clone());
        let mut mrs = MrTable::new(4);
        let stag = mrs
            .reg_mr(PdId(0), vm.whole(region).unwrap(), 0, Access::NONE)
            .unwrap();
        for (off, len) in [
            (0, 1),
            (1, 1),
            (0, 4096),
            (1, 4095),
            (3, 5000),
            (2, 9998),
            (7, 513),
        ] {
            let r = mrs
                .check_local(stag, off, len, PdId(0), Access::NONE)
                .unwrap()
                .unwrap();
            let s = &bytes[off as usize..(off + u64::from(len)) as usize];
            let want = (crc32c::crc32c_append(5, s), naive(s));
            for (crc, sum) in [vm.crc32c_and_sum(5, r), plain.crc32c_and_sum(5, r)] {
                assert_eq!((crc, fold64(u64::from(sum))), want, "{off}+{len}");
            }
        }
    }
}
