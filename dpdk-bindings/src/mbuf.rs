//! Owned packet buffers and fixed-size bursts of them.
//!
//! An [`Mbuf`] is one `rte_mbuf` chain owned by Rust and freed on drop; a
//! [`MbufBurst`] is the array of up to [`BURST`] of them that RX and TX bursts
//! fill and drain in place, so that the poll loop allocates nothing per burst.
//! Headers are written into direct mbufs; TX payload is attached from
//! registered memory as an external buffer ([`Mbuf::attach_extbuf`]), which
//! this module never writes through.

use std::fmt;
use std::ptr::NonNull;

use crate::extmem::ExtBuf;
use crate::sys;

/// Mbufs per RX/TX burst: DPDK's customary batch, large enough to amortise
/// the per-call cost, small enough that a batch's headers stay in L1.
pub const BURST: usize = 32;

/// One owned `rte_mbuf` chain, returned to its pool when dropped.
#[repr(transparent)]
pub struct Mbuf(NonNull<sys::rte_mbuf>);

// The burst arrays below rely on `Option<Mbuf>` being a nullable pointer.
const _: () = assert!(size_of::<Option<Mbuf>>() == size_of::<*mut sys::rte_mbuf>());

// SAFETY: an Mbuf is the sole owner of its chain; freeing it from any thread
// is allowed (mempool put is thread-safe).
unsafe impl Send for Mbuf {}
// SAFETY: `&Mbuf` only reads the chain, which nothing else writes while it is
// owned here (external payload is read-only by `attach_extbuf`'s contract).
unsafe impl Sync for Mbuf {}

/// What the NIC said about a received checksum (RX offload flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CksumStatus {
    /// Not checked by the device: verify in software.
    Unknown,
    /// Checked and wrong.
    Bad,
    /// Checked and right.
    Good,
    /// The checksum field is not right, but the device verified the data's
    /// integrity (e.g. a virtual device that never computed it).
    IntegrityVerified,
}

impl CksumStatus {
    /// Whether software may skip its own check.
    pub fn is_verified(self) -> bool {
        matches!(self, CksumStatus::Good | CksumStatus::IntegrityVerified)
    }

    fn from_bits(flags: u64, bad: u64, good: u64) -> Self {
        match (flags & bad != 0, flags & good != 0) {
            (false, false) => CksumStatus::Unknown,
            (true, false) => CksumStatus::Bad,
            (false, true) => CksumStatus::Good,
            (true, true) => CksumStatus::IntegrityVerified,
        }
    }
}

/// Why an external buffer could not be attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachError {
    /// The mbuf already holds data or other segments: attach to a fresh one.
    NotEmpty,
    /// The mbuf is indirect, already external, or shared (refcnt > 1).
    NotDirect,
    /// The shared-info slot is still attached to an mbuf in flight.
    SlotBusy,
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttachError::NotEmpty => "mbuf is not empty",
            AttachError::NotDirect => "mbuf is not a direct, unshared mbuf",
            AttachError::SlotBusy => "external-buffer slot is still in flight",
        })
    }
}

impl std::error::Error for AttachError {}

impl Mbuf {
    /// Takes ownership of a raw mbuf chain.
    ///
    /// # Safety
    /// `ptr` must be a valid mbuf chain head that nothing else owns or frees
    /// (e.g. one just returned by a DPDK alloc or burst, or by
    /// [`Mbuf::into_raw`]), from a pool that outlives it.
    #[inline]
    pub unsafe fn from_raw(ptr: NonNull<sys::rte_mbuf>) -> Mbuf {
        Mbuf(ptr)
    }

    /// Gives up ownership without freeing, e.g. to hand the chain to DPDK.
    #[inline]
    pub fn into_raw(self) -> NonNull<sys::rte_mbuf> {
        let p = self.0;
        std::mem::forget(self);
        p
    }

    /// The raw chain head, still owned by `self`.
    #[inline]
    pub fn as_ptr(&self) -> *mut sys::rte_mbuf {
        self.0.as_ptr()
    }

    /// Bytes in the whole chain (`pkt_len`).
    #[inline]
    pub fn len(&self) -> usize {
        // SAFETY: `self` owns a valid mbuf; a plain field read.
        unsafe { (*self.as_ptr()).pkt_len as usize }
    }

    /// Whether the chain holds no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes in the first segment (`data_len`).
    #[inline]
    pub fn data_len(&self) -> usize {
        // SAFETY: `self` owns a valid mbuf; a plain field read.
        unsafe { usize::from((*self.as_ptr()).data_len) }
    }

    /// Segments in the chain.
    #[inline]
    pub fn nb_segs(&self) -> u16 {
        // SAFETY: `self` owns a valid mbuf; a plain field read.
        unsafe { (*self.as_ptr()).nb_segs }
    }

    /// The first segment's bytes (a whole packet unless RX scattered it or
    /// TX chained it: see [`Mbuf::segments`]).
    #[inline]
    pub fn data(&self) -> &[u8] {
        // SAFETY: the first segment is valid and owned by `self`.
        unsafe { seg_data(self.as_ptr()) }
    }

    /// Whether the first segment's buffer may be written: a direct mbuf not
    /// shared with any clone. External buffers are never writable here.
    #[inline]
    pub fn is_writable(&self) -> bool {
        // SAFETY: `self` owns a valid mbuf.
        unsafe { sys::shim_pktmbuf_is_writable(self.as_ptr()) != 0 }
    }

    /// The first segment's bytes, writable; `None` unless
    /// [`Mbuf::is_writable`].
    #[inline]
    pub fn data_mut(&mut self) -> Option<&mut [u8]> {
        if !self.is_writable() {
            return None;
        }
        let m = self.as_ptr();
        // SAFETY: a direct mbuf with refcnt 1 owns its buffer alone, and
        // `&mut self` excludes any other reference to it.
        unsafe {
            let data = sys::shim_pktmbuf_mtod(m).cast::<u8>();
            Some(std::slice::from_raw_parts_mut(
                data,
                usize::from((*m).data_len),
            ))
        }
    }

    /// Where the first segment's data starts: in a fresh mbuf, where the
    /// first byte appended goes. An address for cache hints (a prefetch
    /// before the frame is written); reading or writing through it is
    /// what [`Mbuf::data`] and [`Mbuf::data_mut`] are for.
    #[inline]
    pub fn data_ptr(&self) -> *const u8 {
        let m = self.as_ptr();
        // SAFETY: `self` owns a valid mbuf; two plain field reads, and the
        // address is computed, not dereferenced.
        unsafe {
            (*m).buf_addr
                .cast::<u8>()
                .cast_const()
                .wrapping_add(usize::from((*m).data_off))
        }
    }

    /// Free bytes before the first segment's data.
    #[inline]
    pub fn headroom(&self) -> usize {
        // SAFETY: `self` owns a valid mbuf.
        usize::from(unsafe { sys::shim_pktmbuf_headroom(self.as_ptr()) })
    }

    /// Free bytes after the last segment's data.
    #[inline]
    pub fn tailroom(&self) -> usize {
        let last = self.last_seg();
        // SAFETY: `last` is a valid segment of the chain `self` owns.
        usize::from(unsafe { sys::shim_pktmbuf_tailroom(last) })
    }

    /// Extends the last segment by `len` bytes and returns them for writing;
    /// `None` if that segment lacks tailroom or is not writable (external).
    #[inline]
    pub fn append(&mut self, len: usize) -> Option<&mut [u8]> {
        let len16 = u16::try_from(len).ok()?;
        // SAFETY: `self` owns the chain; the shim checks that the last
        // segment is direct with a reference count of 1 and DPDK checks
        // the tailroom, each returning NULL without changing anything.
        let p = unsafe { sys::shim_pktmbuf_append_own(self.as_ptr(), len16) };
        let p = NonNull::new(p.cast::<u8>())?;
        // SAFETY: DPDK reserved `len` bytes at `p` inside the last segment's
        // own buffer, which `&mut self` gives exclusive access to.
        Some(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) })
    }

    /// Extends the first segment forwards by `len` bytes (into headroom) and
    /// returns them for writing; `None` without headroom or if not writable.
    #[inline]
    pub fn prepend(&mut self, len: usize) -> Option<&mut [u8]> {
        let len16 = u16::try_from(len).ok()?;
        if !self.is_writable() {
            return None;
        }
        // SAFETY: `self` owns the chain; DPDK checks the headroom.
        let p = unsafe { sys::shim_pktmbuf_prepend(self.as_ptr(), len16) };
        let p = NonNull::new(p.cast::<u8>())?;
        // SAFETY: `len` bytes at `p` in the first segment's own buffer.
        Some(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) })
    }

    /// Removes `len` bytes from the front of the first segment; false (and no
    /// change) if it holds fewer.
    #[inline]
    pub fn adj(&mut self, len: usize) -> bool {
        let Ok(len16) = u16::try_from(len) else {
            return false;
        };
        // SAFETY: `self` owns the chain; DPDK checks the length.
        !unsafe { sys::shim_pktmbuf_adj(self.as_ptr(), len16) }.is_null()
    }

    /// Removes `len` bytes from the end of the last segment; false (and no
    /// change) if it holds fewer.
    #[inline]
    pub fn trim(&mut self, len: usize) -> bool {
        let Ok(len16) = u16::try_from(len) else {
            return false;
        };
        // SAFETY: `self` owns the chain; DPDK checks the length.
        unsafe { sys::shim_pktmbuf_trim(self.as_ptr(), len16) == 0 }
    }

    /// Appends `tail`'s chain after this one. Gives `tail` back if the chain
    /// would exceed DPDK's segment limit.
    #[inline]
    pub fn chain(&mut self, tail: Mbuf) -> Result<(), Mbuf> {
        // SAFETY: both chains are valid and owned; on success `self` owns
        // `tail`'s segments, on failure nothing changed.
        let ret = unsafe { sys::shim_pktmbuf_chain(self.as_ptr(), tail.as_ptr()) };
        if ret == 0 {
            std::mem::forget(tail);
            Ok(())
        } else {
            Err(tail)
        }
    }

    /// The chain's segments, in order, as byte slices.
    #[inline]
    pub fn segments(&self) -> Segments<'_> {
        Segments {
            next: self.as_ptr(),
            _chain: std::marker::PhantomData,
        }
    }

    /// Copies the chain's bytes from `offset` into `dst`; returns how many.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> usize {
        let mut skip = offset;
        let mut done = 0;
        for seg in self.segments() {
            if done == dst.len() {
                break;
            }
            if skip >= seg.len() {
                skip -= seg.len();
                continue;
            }
            let src = &seg[skip..];
            skip = 0;
            let n = src.len().min(dst.len() - done);
            dst[done..done + n].copy_from_slice(&src[..n]);
            done += n;
        }
        done
    }

    /// Raw offload flags (`ol_flags`) of the first segment.
    #[inline]
    pub fn ol_flags(&self) -> u64 {
        // SAFETY: `self` owns a valid mbuf; a plain field read.
        unsafe { (*self.as_ptr()).ol_flags }
    }

    /// The device's verdict on the IPv4 header checksum.
    #[inline]
    pub fn ip_cksum(&self) -> CksumStatus {
        CksumStatus::from_bits(
            self.ol_flags(),
            u64::from(sys::RTE_MBUF_F_RX_IP_CKSUM_BAD),
            u64::from(sys::RTE_MBUF_F_RX_IP_CKSUM_GOOD),
        )
    }

    /// The device's verdict on the TCP/UDP checksum.
    #[inline]
    pub fn l4_cksum(&self) -> CksumStatus {
        CksumStatus::from_bits(
            self.ol_flags(),
            u64::from(sys::RTE_MBUF_F_RX_L4_CKSUM_BAD),
            u64::from(sys::RTE_MBUF_F_RX_L4_CKSUM_GOOD),
        )
    }

    /// The RSS hash the device computed, if it reported one.
    #[inline]
    pub fn rss_hash(&self) -> Option<u32> {
        if self.ol_flags() & u64::from(sys::RTE_MBUF_F_RX_RSS_HASH) == 0 {
            return None;
        }
        // SAFETY: the flag says the `hash` union holds the RSS value.
        Some(unsafe { (*self.as_ptr()).__bindgen_anon_2.hash.rss })
    }

    /// The port the mbuf was received on.
    #[inline]
    pub fn port(&self) -> u16 {
        // SAFETY: `self` owns a valid mbuf; a plain field read.
        unsafe { (*self.as_ptr()).port }
    }

    /// The device's packet-type classification (`RTE_PTYPE_*`), 0 if none.
    #[inline]
    pub fn packet_type(&self) -> u32 {
        // SAFETY: `packet_type` overlays the classification bitfields; any
        // value is a valid u32.
        unsafe { (*self.as_ptr()).__bindgen_anon_1.packet_type }
    }

    /// The first segment's reference count (1 unless cloned).
    #[inline]
    pub fn refcnt(&self) -> u16 {
        // SAFETY: `self` owns a valid mbuf; an atomic read.
        unsafe { sys::shim_mbuf_refcnt_read(self.as_ptr()) }
    }

    /// Whether the first segment's data is an attached external buffer.
    #[inline]
    pub fn has_extbuf(&self) -> bool {
        self.ol_flags() & sys::RTE_MBUF_F_EXTERNAL != 0
    }

    /// Asks the device to compute the IPv4 header and/or TCP checksum on
    /// transmit. The header lengths are in bytes. With `tcp`, the TCP
    /// checksum field must already hold the pseudo-header checksum, as DPDK
    /// requires; use it only when the port's setup reports the offload.
    #[inline]
    pub fn set_tx_cksum_offload(
        &mut self,
        l2_len: u8,
        l3_len: u16,
        l4_len: u8,
        ipv4_hdr: bool,
        tcp: bool,
    ) {
        let m = self.as_ptr();
        let mut flags = sys::RTE_MBUF_F_TX_IPV4;
        if ipv4_hdr {
            flags |= sys::RTE_MBUF_F_TX_IP_CKSUM;
        }
        if tcp {
            flags |= sys::RTE_MBUF_F_TX_TCP_CKSUM;
        }
        // SAFETY: `&mut self` owns the mbuf; only metadata fields change.
        unsafe {
            sys::shim_mbuf_set_tx_lens(m, l2_len, l3_len, l4_len);
            (*m).ol_flags |= flags;
        }
    }

    /// Asks the device to cut this frame, one TCP segment of any length,
    /// into segments of `tso_segsz` payload bytes each, with the IPv4 and
    /// TCP checksums of each computed. The header lengths are in bytes.
    /// DPDK requires the TCP checksum field to hold the pseudo-header sum
    /// without the TCP length, and the IPv4 checksum field to be 0; use it
    /// only when the port's setup reports the offload.
    #[inline]
    pub fn set_tx_tso(&mut self, l2_len: u8, l3_len: u16, l4_len: u8, tso_segsz: u16) {
        // SAFETY: `&mut self` owns the mbuf; only metadata fields change.
        unsafe { sys::shim_mbuf_set_tso(self.as_ptr(), l2_len, l3_len, l4_len, tso_segsz) }
    }

    /// Points this empty mbuf's data at `len` bytes of external memory at
    /// `addr` (device address `iova`), accounted to the shared-info slot
    /// `buf`. The bytes become the mbuf's data (`data_len = pkt_len = len`).
    /// When the last mbuf referring to `buf` is freed — by the driver after
    /// transmission, or by whoever receives it over `net_ring` — the slot's
    /// release is counted ([`ExtBuf::releases`]) and it is no longer
    /// [`ExtBuf::is_in_flight`].
    ///
    /// # Safety
    /// - `addr..addr + len` must stay valid for reads and must not be written
    ///   until `buf` is no longer in flight: the mbuf, and the device, read it
    ///   until then.
    /// - `iova` must be the device address of `addr`, and the range must be
    ///   IOVA-contiguous (see [`crate::ExtMem::iova`]); with IOVA-as-VA (any
    ///   `--no-huge` run) the address itself.
    pub unsafe fn attach_extbuf(
        &mut self,
        addr: NonNull<u8>,
        iova: u64,
        len: u16,
        buf: &ExtBuf,
    ) -> Result<(), AttachError> {
        if !self.is_empty() || self.nb_segs() != 1 {
            return Err(AttachError::NotEmpty);
        }
        if !self.is_writable() {
            return Err(AttachError::NotDirect);
        }
        if !buf.try_arm() {
            return Err(AttachError::SlotBusy);
        }
        let m = self.as_ptr();
        // SAFETY: `m` is a direct, unshared, empty mbuf owned by `self`; the
        // slot's shared info lives apart from the user memory, has its free
        // callback set and was just armed with refcnt 1 for this mbuf; the
        // caller vouches for the memory and its IOVA.
        unsafe {
            sys::shim_pktmbuf_attach_extbuf(m, addr.as_ptr().cast(), iova, len, buf.shinfo_ptr());
            (*m).data_len = len;
            (*m).pkt_len = u32::from(len);
        }
        Ok(())
    }

    fn last_seg(&self) -> *mut sys::rte_mbuf {
        let mut m = self.as_ptr();
        // SAFETY: walks the `next` links of a valid chain owned by `self`.
        unsafe {
            while !(*m).next.is_null() {
                m = (*m).next;
            }
        }
        m
    }
}

impl Drop for Mbuf {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: `self` owns the chain and gives it back exactly once.
        unsafe { sys::shim_pktmbuf_free(self.as_ptr()) }
    }
}

impl fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mbuf")
            .field("len", &self.len())
            .field("nb_segs", &self.nb_segs())
            .field("ol_flags", &format_args!("{:#x}", self.ol_flags()))
            .finish()
    }
}

/// # Safety
/// `m` must be a valid segment whose data nothing writes while the returned
/// slice lives.
unsafe fn seg_data<'a>(m: *mut sys::rte_mbuf) -> &'a [u8] {
    // SAFETY: per the caller, `m` is valid; `buf_addr + data_off` for
    // `data_len` bytes is the segment's data.
    unsafe {
        let len = usize::from((*m).data_len);
        if len == 0 {
            return &[];
        }
        let data = (*m).buf_addr.cast::<u8>().add(usize::from((*m).data_off));
        std::slice::from_raw_parts(data, len)
    }
}

/// Iterator over a chain's segments as byte slices.
#[derive(Debug)]
pub struct Segments<'a> {
    next: *mut sys::rte_mbuf,
    _chain: std::marker::PhantomData<&'a Mbuf>,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.next.is_null() {
            return None;
        }
        let m = self.next;
        // SAFETY: `m` is a segment of the chain borrowed for `'a`.
        unsafe {
            self.next = (*m).next;
            Some(seg_data(m))
        }
    }
}

/// Up to [`BURST`] owned mbufs in a fixed array: what RX bursts fill and TX
/// bursts drain, with no allocation. Mbufs still in it are freed on drop.
pub struct MbufBurst {
    /// `slots[..len]` are `Some`, `slots[len..]` are `None`; the array is
    /// passed to DPDK as `struct rte_mbuf **`.
    slots: [Option<Mbuf>; BURST],
    len: usize,
}

impl Default for MbufBurst {
    fn default() -> Self {
        Self::new()
    }
}

impl MbufBurst {
    /// An empty burst.
    pub const fn new() -> Self {
        MbufBurst {
            slots: [const { None }; BURST],
            len: 0,
        }
    }

    /// Mbufs held.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it holds [`BURST`].
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == BURST
    }

    /// Adds an mbuf at the end, or gives it back when full.
    #[inline]
    pub fn push(&mut self, m: Mbuf) -> Result<(), Mbuf> {
        if self.len == BURST {
            return Err(m);
        }
        self.slots[self.len] = Some(m);
        self.len += 1;
        Ok(())
    }

    /// Takes the last mbuf.
    #[inline]
    pub fn pop(&mut self) -> Option<Mbuf> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        self.slots[self.len].take()
    }

    /// The last mbuf, the one [`MbufBurst::pop`] takes next.
    #[inline]
    pub fn last(&self) -> Option<&Mbuf> {
        self.slots[..self.len].last()?.as_ref()
    }

    /// The `i`th mbuf.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&Mbuf> {
        self.slots[..self.len].get(i)?.as_ref()
    }

    /// The `i`th mbuf, mutably.
    #[inline]
    pub fn get_mut(&mut self, i: usize) -> Option<&mut Mbuf> {
        self.slots[..self.len].get_mut(i)?.as_mut()
    }

    /// The mbufs in order.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = &Mbuf> + '_ {
        self.slots[..self.len].iter().flatten()
    }

    /// The mbufs in order, mutably.
    #[inline]
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Mbuf> + '_ {
        self.slots[..self.len].iter_mut().flatten()
    }

    /// Takes every mbuf out, in order; those the iterator is not asked for
    /// are freed when it drops.
    #[inline]
    pub fn drain(&mut self) -> Drain<'_> {
        Drain {
            burst: self,
            pos: 0,
        }
    }

    /// Frees every mbuf (in one bulk call).
    pub fn clear(&mut self) {
        if self.len == 0 {
            return;
        }
        let n = self.len;
        self.len = 0;
        // SAFETY: the first `n` slots hold owned mbufs; DPDK frees them and
        // the slots are then overwritten with None without dropping.
        unsafe {
            sys::rte_pktmbuf_free_bulk(self.as_mut_ptr(), n as u32);
            for slot in &mut self.slots[..n] {
                std::ptr::write(slot, None);
            }
        }
    }

    /// The slot array as DPDK's `struct rte_mbuf **`.
    #[inline]
    pub(crate) fn as_mut_ptr(&mut self) -> *mut *mut sys::rte_mbuf {
        self.slots.as_mut_ptr().cast()
    }

    /// The first empty slot, where DPDK may write `BURST - len` mbufs.
    #[inline]
    pub(crate) fn spare_ptr(&mut self) -> *mut *mut sys::rte_mbuf {
        let len = self.len;
        self.slots[len..].as_mut_ptr().cast()
    }

    /// Spare capacity.
    #[inline]
    pub(crate) fn spare(&self) -> usize {
        BURST - self.len
    }

    /// Counts `n` mbufs that DPDK wrote into the spare slots.
    ///
    /// # Safety
    /// The `n` slots after `len` must now hold owned, valid mbufs.
    #[inline]
    pub(crate) unsafe fn commit(&mut self, n: usize) {
        debug_assert!(n <= self.spare());
        self.len += n;
    }

    /// Forgets the first `n` mbufs (DPDK took them) and moves the rest to
    /// the front, keeping their order.
    ///
    /// # Safety
    /// DPDK must own the first `n` mbufs now (`n <= len`).
    #[inline]
    pub(crate) unsafe fn consume_front(&mut self, n: usize) {
        debug_assert!(n <= self.len);
        for slot in &mut self.slots[..n] {
            // The pointer now belongs to DPDK: clear without freeing.
            std::mem::forget(slot.take());
        }
        self.slots[..self.len].rotate_left(n);
        self.len -= n;
    }
}

impl Drop for MbufBurst {
    fn drop(&mut self) {
        self.clear();
    }
}

impl fmt::Debug for MbufBurst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Draining iterator of a [`MbufBurst`]; see [`MbufBurst::drain`].
#[derive(Debug)]
pub struct Drain<'a> {
    burst: &'a mut MbufBurst,
    pos: usize,
}

impl Iterator for Drain<'_> {
    type Item = Mbuf;

    #[inline]
    fn next(&mut self) -> Option<Mbuf> {
        if self.pos >= self.burst.len {
            return None;
        }
        let m = self.burst.slots[self.pos].take();
        self.pos += 1;
        m
    }
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        let len = self.burst.len;
        self.burst.len = 0;
        for slot in &mut self.burst.slots[self.pos..len] {
            drop(slot.take());
        }
    }
}
