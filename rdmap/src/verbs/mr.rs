//! Memory regions and the STag table: registration, fast registration,
//! local and remote invalidation, deregistration that waits for in-flight
//! users, and the checks that stand between a peer's STag and memory.
//!
//! An STag (RFC 5040 §2.1, RFC 5041 §2) is 32 bits: a 24-bit index into this
//! table and an 8-bit key in the low byte, the layout siw and the hardware
//! RNICs use (siw's `0x2b9d4f00` is index `0x2b9d4f`, key `0x00`). Freeing an
//! index advances its key, so an STag from an earlier registration no longer
//! matches; index 0 is never handed out (some peers treat STag 0 specially).
//!
//! **Caller-chosen STags.** [`MrTable::reg_mr_at`] registers a region under
//! an STag the caller names, whatever its index: STags imported from
//! elsewhere (a replayed capture names siw's `0x2b9d4f00`; a control plane
//! that mirrors a hardware RNIC's STag layout). Indices beyond the dense
//! table live in a small ordered side map, allocated at registration and
//! consulted by the same checks only when it is not empty; everything
//! else (key, domain, rights, bounds, pins, invalidation, deregistration)
//! behaves exactly as for a region from [`MrTable::reg_mr`].
//!
//! The checks follow RFC 5041's tagged buffer model and RFC 5040 §5 with
//! the Terminate errors both define: STag known, key
//! matching and valid; same protection domain as the stream; access right;
//! tagged offset not wrapping; base and bounds. A check that passes mints a
//! [`CheckedRange`] or a pinned [`RegionRef`] — the only values that
//! [`Placement`](crate::placement::Placement) accepts — so a byte outside a
//! live region can never be named.
//!
//! **Zero-length accesses** (a zero-length RDMA Write, Read Request or Read
//! Response) validate nothing and yield no range: no byte is placed or read,
//! so there is nothing to protect, and the peer-to-peer "ready to receive"
//! messages of RFC 6581 are zero-length tagged messages whose STag need not
//! be registered (siw sends STag 1 in its RTR and skips the check for a
//! zero-length Write the same way).
//!
//! **Lifetime.** Each region counts the [`RegionRef`]s that pin it. Invalidation
//! (local, or remote through Send with Invalidate) refuses new accesses at
//! once and leaves the pins alone, so an in-flight Read Response can still be
//! retransmitted from it. Deregistration of a pinned region moves it to
//! [`MrState::Deregistering`]: the STag is dead for everyone, and the table
//! reports [`MrEvent::Deregistered`] when the last pin is returned. Only then
//! may the application reuse or free the memory.

use std::collections::{BTreeMap, VecDeque};

use super::pd::PdId;
use super::VerbsError;
use crate::error::TerminateCause;
use crate::placement::{CheckedRange, MemSpan, RegionHandle, RegionRef};

/// The largest STag index (24 bits).
pub const MAX_STAG_INDEX: u32 = 0x00ff_ffff;

/// Steering tag: 24-bit index, 8-bit key in the low byte.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stag(pub u32);

impl Stag {
    /// The STag with `index` (masked to 24 bits) and `key`.
    pub const fn new(index: u32, key: u8) -> Stag {
        Stag(((index & MAX_STAG_INDEX) << 8) | key as u32)
    }

    /// The table index (high 24 bits).
    pub const fn index(self) -> u32 {
        self.0 >> 8
    }

    /// The key (low 8 bits), chosen by the consumer for fast registration.
    pub const fn key(self) -> u8 {
        self.0 as u8
    }

    /// The same index with another key (what `ib_update_fast_reg_key` does).
    pub const fn with_key(self, key: u8) -> Stag {
        Stag::new(self.index(), key)
    }
}

impl core::fmt::Debug for Stag {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Stag({:#010x})", self.0)
    }
}

impl core::fmt::Display for Stag {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// Access rights of a memory region (`ibv_access_flags`). Local read is
/// always allowed, as in libibverbs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u8);

impl Access {
    /// No rights beyond local read.
    pub const NONE: Access = Access(0);
    /// The region may be written locally: receive buffers, Read sinks.
    pub const LOCAL_WRITE: Access = Access(1);
    /// The peer may RDMA Write into the region.
    pub const REMOTE_WRITE: Access = Access(2);
    /// The peer may RDMA Read from the region.
    pub const REMOTE_READ: Access = Access(4);
    /// The peer may run atomics on it (RFC 7306; not implemented yet).
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Memory windows may be bound to it (windows are not implemented yet).
    pub const MW_BIND: Access = Access(16);

    const NAMES: [(Access, &'static str); 5] = [
        (Access::LOCAL_WRITE, "LOCAL_WRITE"),
        (Access::REMOTE_WRITE, "REMOTE_WRITE"),
        (Access::REMOTE_READ, "REMOTE_READ"),
        (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        (Access::MW_BIND, "MW_BIND"),
    ];

    /// The raw bits.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether every right in `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any remote right is granted.
    pub const fn is_remote(self) -> bool {
        self.0 & (Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0) != 0
    }

    /// libibverbs' rule: remote write or atomic rights need local write.
    pub const fn is_consistent(self) -> bool {
        let needs_local = self.0 & (Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0) != 0;
        !needs_local || self.contains(Access::LOCAL_WRITE)
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl core::ops::BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl core::fmt::Debug for Access {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.0 == 0 {
            return f.write_str("Access(NONE)");
        }
        f.write_str("Access(")?;
        let mut first = true;
        for (flag, name) in Access::NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

/// Why an access through an STag was refused. Small and `Copy`; the QP
/// engine maps it to the Terminate cause of the layer that checked
/// ([`AccessError::ddp_tagged_cause`] for tagged placement,
/// [`AccessError::rdmap_cause`] for a Read Request's source,
/// [`AccessError::invalidate_cause`] for Send with Invalidate) or, for a
/// local SGE, to [`AccessError::wc_status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessError {
    /// Unknown index, key mismatch, invalidated or being deregistered.
    InvalidStag,
    /// The region belongs to another protection domain than the stream.
    PdMismatch,
    /// The region does not grant the right the access needs.
    AccessRights,
    /// The range starts before the region's base or ends after its bound.
    BaseBounds,
    /// Tagged offset plus length overflows 64 bits.
    ToWrap,
    /// The STag may not be invalidated (registered without that option, or
    /// with no remote right for a remote invalidation).
    CannotInvalidate,
    /// A fast registration the region cannot take: not a fast-register
    /// region, still valid, longer than allocated, or inconsistent rights.
    InvalidOperation,
}

impl AccessError {
    /// The completion status of a work request whose local SGE (or local
    /// memory operation) failed this check.
    pub fn wc_status(self) -> super::cq::WcStatus {
        super::cq::WcStatus::LocalProtectionError
    }

    /// The Terminate cause for a failed *tagged placement* check (RDMA Write
    /// or Read Response segment): DDP's Tagged Buffer errors (RFC 5041),
    /// except access rights, which only RDMAP names (RFC 5040).
    pub fn ddp_tagged_cause(self) -> TerminateCause {
        match self {
            AccessError::InvalidStag => TerminateCause::DDP_TAGGED_INVALID_STAG,
            AccessError::BaseBounds => TerminateCause::DDP_TAGGED_BASE_BOUNDS,
            AccessError::PdMismatch => TerminateCause::DDP_TAGGED_STAG_NOT_ASSOCIATED,
            AccessError::ToWrap => TerminateCause::DDP_TAGGED_TO_WRAP,
            AccessError::AccessRights => TerminateCause::RDMAP_PROT_ACCESS_RIGHTS,
            AccessError::CannotInvalidate | AccessError::InvalidOperation => {
                TerminateCause::RDMAP_PROT_UNSPECIFIED
            }
        }
    }

    /// The Terminate cause for a failed check of an RDMA Read Request's
    /// Data Source: RDMAP's Remote Protection errors (RFC 5040).
    pub fn rdmap_cause(self) -> TerminateCause {
        match self {
            AccessError::InvalidStag => TerminateCause::RDMAP_PROT_INVALID_STAG,
            AccessError::BaseBounds => TerminateCause::RDMAP_PROT_BASE_BOUNDS,
            AccessError::AccessRights => TerminateCause::RDMAP_PROT_ACCESS_RIGHTS,
            AccessError::PdMismatch => TerminateCause::RDMAP_PROT_STAG_NOT_ASSOCIATED,
            AccessError::ToWrap => TerminateCause::RDMAP_PROT_TO_WRAP,
            AccessError::CannotInvalidate | AccessError::InvalidOperation => {
                TerminateCause::RDMAP_PROT_UNSPECIFIED
            }
        }
    }

    /// The Terminate cause for a failed [`MrTable::invalidate_remote`]: a
    /// valid STag of the stream that forbids remote invalidation is a Remote
    /// Operation error; an STag that is unknown, of another domain or being
    /// deregistered is a Remote Protection error (the split siw makes too).
    pub fn invalidate_cause(self) -> TerminateCause {
        match self {
            AccessError::CannotInvalidate => TerminateCause::RDMAP_OP_CANNOT_INVALIDATE,
            _ => TerminateCause::RDMAP_PROT_CANNOT_INVALIDATE,
        }
    }
}

/// Outcome of [`MrTable::dereg_mr`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeregStatus {
    /// The region is gone; its memory may be reused now.
    Done,
    /// The region is pinned by in-flight users: the STag is dead already,
    /// and [`MrEvent::Deregistered`] follows when the last pin is returned.
    Pending,
}

/// Asynchronous news from the table, drained with [`MrTable::poll_event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MrEvent {
    /// A deregistration that was [`DeregStatus::Pending`] has completed.
    Deregistered(Stag),
}

/// State of a memory region's STag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MrState {
    /// Usable within its rights.
    Valid,
    /// Allocated for fast registration and not registered yet, or
    /// invalidated. Refused to every access.
    Invalid,
    /// Deregistration requested while pinned. Refused to every access; the
    /// index stays taken until the last pin is returned.
    Deregistering,
}

/// How a region was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MrKind {
    /// `reg_mr`: bound to its memory for life.
    Registered,
    /// `alloc_mr`: bound (and re-bound) by fast-register work requests.
    FastRegister,
}

/// Options of [`MrTable::reg_mr_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegOptions {
    /// Allow local invalidation and remote invalidation (Send with
    /// Invalidate) of this region. Off for `reg_mr`, as in the verbs
    /// specifications, where only fast-registered regions and windows are
    /// invalidated; fast-register regions always allow it.
    pub invalidatable: bool,
}

/// A fast-register work request's payload (`IB_WR_REG_MR`): binds an
/// invalid fast-register region to memory, with a new key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastReg {
    /// The region's index with the *new* key.
    pub stag: Stag,
    /// The memory the STag will name.
    pub mem: MemSpan,
    /// Tagged offset of the first byte (the virtual address, or 0 for a
    /// zero-based region).
    pub iova: u64,
    /// Rights of the new registration.
    pub access: Access,
}

/// A snapshot of one region, for the control path and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrInfo {
    /// The current STag (index and current key).
    pub stag: Stag,
    /// Its protection domain.
    pub pd: PdId,
    /// How it was created.
    pub kind: MrKind,
    /// Its state.
    pub state: MrState,
    /// Its rights.
    pub access: Access,
    /// Tagged offset of its first byte.
    pub iova: u64,
    /// Its length (0 for a fast-register region never registered).
    pub len: u64,
    /// The memory it names.
    pub mem: MemSpan,
    /// How many [`RegionRef`]s pin it.
    pub pins: u32,
    /// Whether it may be invalidated.
    pub invalidatable: bool,
}

/// Proof, for [`CheckedRange`] and [`RegionRef`] construction, that a check
/// of this module passed. Its field is private, so no other module can make
/// one.
#[derive(Debug)]
pub(crate) struct Mint(());

#[derive(Clone, Copy, Debug)]
struct Mr {
    pd: PdId,
    kind: MrKind,
    state: MrState,
    access: Access,
    iova: u64,
    mem: MemSpan,
    max_len: u64,
    invalidatable: bool,
    pins: u32,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: u8,
    /// Advanced each time the index is freed, so a [`RegionRef`] can never
    /// unpin a later region that reuses its index.
    epoch: u32,
    mr: Option<Mr>,
}

/// What a passed check resolved to, before it is minted into a range.
#[derive(Clone, Copy, Debug)]
struct Resolved {
    index: u32,
    epoch: u32,
    region: RegionHandle,
    offset: u64,
    len: u32,
}

/// The STag table: every memory region of a device.
///
/// Bounded: `capacity` regions, allocated at construction. A plain struct:
/// the dataplane shares it between workers (read-mostly; registration on
/// the control path) with whatever synchronisation it chooses.
#[derive(Debug)]
pub struct MrTable {
    entries: Vec<Entry>,
    /// Regions registered at a caller-chosen index beyond `entries`
    /// ([`MrTable::reg_mr_at`]); empty unless that is used.
    imported: BTreeMap<u32, Entry>,
    /// Epoch of the next imported entry: never reused, so a pin of a
    /// deregistered imported region cannot reach a later one at its index.
    imported_epoch: u32,
    free: VecDeque<u32>,
    events: VecDeque<MrEvent>,
    events_lost: u64,
    live: u32,
}

impl MrTable {
    /// A table of `capacity` regions (at most [`MAX_STAG_INDEX`]), with keys
    /// starting at 0.
    pub fn new(capacity: u32) -> MrTable {
        MrTable::with_seed(capacity, 0)
    }

    /// Like [`MrTable::new`], with each index's first key drawn from `seed`
    /// so that STags are harder for a peer to guess (the table never reads
    /// a random source itself).
    pub fn with_seed(capacity: u32, seed: u64) -> MrTable {
        let capacity = capacity.min(MAX_STAG_INDEX);
        let mut state = seed;
        let mut entries = Vec::with_capacity(capacity as usize + 1);
        for _ in 0..=capacity {
            let key = if seed == 0 {
                0
            } else {
                (splitmix64(&mut state) >> 56) as u8
            };
            entries.push(Entry {
                key,
                epoch: 0,
                mr: None,
            });
        }
        MrTable {
            entries,
            imported: BTreeMap::new(),
            imported_epoch: 0,
            free: (1..=capacity).collect(),
            events: VecDeque::with_capacity(capacity as usize),
            events_lost: 0,
            live: 0,
        }
    }

    /// How many regions the table can hold.
    pub fn capacity(&self) -> u32 {
        (self.entries.len() - 1) as u32
    }

    /// How many indices are taken (valid, invalid or deregistering).
    pub fn len(&self) -> u32 {
        self.live
    }

    /// Whether no region exists.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Registers `mem` under a new STag (`ibv_reg_mr_iova`): tagged offsets
    /// `[iova, iova + mem.len)` name it. Pass the buffer's virtual address as
    /// `iova` for the usual "TO = VA" peers (rping, perftest), or 0 for a
    /// zero-based region. Not invalidatable (see [`RegOptions`]). The
    /// protection domain is checked by [`Device`](super::Device).
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        mem: MemSpan,
        iova: u64,
        access: Access,
    ) -> Result<Stag, VerbsError> {
        self.reg_mr_with(pd, mem, iova, access, RegOptions::default())
    }

    /// [`MrTable::reg_mr`] with options.
    pub fn reg_mr_with(
        &mut self,
        pd: PdId,
        mem: MemSpan,
        iova: u64,
        access: Access,
        options: RegOptions,
    ) -> Result<Stag, VerbsError> {
        if !access.is_consistent() {
            return Err(VerbsError::InvalidAccess);
        }
        validate_binding(mem, iova)?;
        self.insert(Mr {
            pd,
            kind: MrKind::Registered,
            state: MrState::Valid,
            access,
            iova,
            mem,
            max_len: mem.len,
            invalidatable: options.invalidatable,
            pins: 0,
        })
    }

    /// Allocates a fast-register region of up to `max_len` bytes
    /// (`ib_alloc_mr`). Its STag starts invalid; a fast-register work
    /// request binds it to memory.
    pub fn alloc_mr(&mut self, pd: PdId, max_len: u64) -> Result<Stag, VerbsError> {
        if max_len == 0 {
            return Err(VerbsError::InvalidLength);
        }
        self.insert(Mr {
            pd,
            kind: MrKind::FastRegister,
            state: MrState::Invalid,
            access: Access::NONE,
            iova: 0,
            mem: MemSpan::new(RegionHandle(0), 0, 0),
            max_len,
            invalidatable: true,
            pins: 0,
        })
    }

    /// Registers `mem` under the caller's `stag` (index and key as given),
    /// for STags chosen elsewhere: a replayed or imported connection whose
    /// peer already names them, or a hardware-compatible STag layout. The
    /// region then behaves exactly like one from [`MrTable::reg_mr`]: the
    /// same checks (key, domain, rights, wrap, bounds), pins,
    /// deregistration and, with [`RegOptions::invalidatable`],
    /// invalidation.
    ///
    /// An index inside the dense table must be free (it is taken out of the
    /// free list); one beyond it goes to a side map allocated here, on the
    /// control path, never per packet. Counts against the table's capacity
    /// like any region. Errors: [`VerbsError::InvalidStag`] for index 0,
    /// [`VerbsError::Busy`] if the index is taken, [`VerbsError::TableFull`],
    /// and those of [`MrTable::reg_mr`].
    pub fn reg_mr_at(
        &mut self,
        stag: Stag,
        pd: PdId,
        mem: MemSpan,
        iova: u64,
        access: Access,
    ) -> Result<Stag, VerbsError> {
        self.reg_mr_at_with(stag, pd, mem, iova, access, RegOptions::default())
    }

    /// [`MrTable::reg_mr_at`] with options.
    pub fn reg_mr_at_with(
        &mut self,
        stag: Stag,
        pd: PdId,
        mem: MemSpan,
        iova: u64,
        access: Access,
        options: RegOptions,
    ) -> Result<Stag, VerbsError> {
        if !access.is_consistent() {
            return Err(VerbsError::InvalidAccess);
        }
        validate_binding(mem, iova)?;
        self.insert_at(
            stag,
            Mr {
                pd,
                kind: MrKind::Registered,
                state: MrState::Valid,
                access,
                iova,
                mem,
                max_len: mem.len,
                invalidatable: options.invalidatable,
                pins: 0,
            },
        )
    }

    /// [`MrTable::alloc_mr`] under the caller's `stag`: a table that mirrors
    /// another one (a dataplane's per-worker copies of the control path's
    /// table) allocates the same fast-register region under the same STag.
    /// Errors as for [`MrTable::reg_mr_at`], and
    /// [`VerbsError::InvalidLength`] for a zero `max_len`.
    pub fn alloc_mr_at(&mut self, stag: Stag, pd: PdId, max_len: u64) -> Result<Stag, VerbsError> {
        if max_len == 0 {
            return Err(VerbsError::InvalidLength);
        }
        self.insert_at(
            stag,
            Mr {
                pd,
                kind: MrKind::FastRegister,
                state: MrState::Invalid,
                access: Access::NONE,
                iova: 0,
                mem: MemSpan::new(RegionHandle(0), 0, 0),
                max_len,
                invalidatable: true,
                pins: 0,
            },
        )
    }

    /// Puts `mr` at `stag`'s index with its key (see [`MrTable::reg_mr_at`]).
    fn insert_at(&mut self, stag: Stag, mr: Mr) -> Result<Stag, VerbsError> {
        let index = stag.index();
        if index == 0 {
            return Err(VerbsError::InvalidStag);
        }
        if self.entry(index).is_some_and(|e| e.mr.is_some()) {
            return Err(VerbsError::Busy);
        }
        if self.live >= self.capacity() {
            return Err(VerbsError::TableFull);
        }
        if (index as usize) < self.entries.len() {
            self.free.retain(|&i| i != index);
            let entry = &mut self.entries[index as usize];
            entry.key = stag.key();
            entry.mr = Some(mr);
        } else {
            let epoch = self.imported_epoch;
            self.imported_epoch = epoch.wrapping_add(1);
            self.imported.insert(
                index,
                Entry {
                    key: stag.key(),
                    epoch,
                    mr: Some(mr),
                },
            );
        }
        self.live += 1;
        Ok(stag)
    }

    /// Deregisters the region named by `stag` (index and current key).
    /// Immediate if nothing pins it; otherwise the STag dies now and the
    /// memory is released when the last pin is returned.
    pub fn dereg_mr(&mut self, stag: Stag) -> Result<DeregStatus, VerbsError> {
        let index = self.lookup(stag).map_err(|_| VerbsError::InvalidStag)?;
        let Some(mr) = self.entry_mut(index).and_then(|e| e.mr.as_mut()) else {
            return Err(VerbsError::InvalidStag);
        };
        if mr.state == MrState::Deregistering {
            return Err(VerbsError::InvalidStag);
        }
        if mr.pins > 0 {
            mr.state = MrState::Deregistering;
            return Ok(DeregStatus::Pending);
        }
        self.free_index(index);
        Ok(DeregStatus::Done)
    }

    /// Executes a fast-register work request of a queue pair in `pd`:
    /// binds an invalid fast-register region to `wr.mem` with the key in
    /// `wr.stag` and makes it valid.
    pub fn fast_register(&mut self, wr: &FastReg, pd: PdId) -> Result<(), AccessError> {
        let index = wr.stag.index();
        let entry = self.entry_mut(index).ok_or(AccessError::InvalidStag)?;
        let mr = entry.mr.as_mut().ok_or(AccessError::InvalidStag)?;
        match mr.state {
            MrState::Deregistering => return Err(AccessError::InvalidStag),
            MrState::Valid => return Err(AccessError::InvalidOperation),
            MrState::Invalid => {}
        }
        if mr.kind != MrKind::FastRegister {
            return Err(AccessError::InvalidOperation);
        }
        if mr.pd != pd {
            return Err(AccessError::PdMismatch);
        }
        if !wr.access.is_consistent() {
            return Err(AccessError::AccessRights);
        }
        if wr.mem.len > mr.max_len || validate_binding(wr.mem, wr.iova).is_err() {
            return Err(AccessError::InvalidOperation);
        }
        mr.state = MrState::Valid;
        mr.access = wr.access;
        mr.iova = wr.iova;
        mr.mem = wr.mem;
        entry.key = wr.stag.key();
        Ok(())
    }

    /// Local invalidation (`IBV_WR_LOCAL_INV`) by a queue pair in `pd`.
    /// Invalidating an invalid STag is not an error (verbs semantics); pins
    /// are untouched.
    pub fn invalidate_local(&mut self, stag: Stag, pd: PdId) -> Result<(), AccessError> {
        let index = self.lookup(stag)?;
        let mr = self
            .entry_mut(index)
            .and_then(|e| e.mr.as_mut())
            .ok_or(AccessError::InvalidStag)?;
        if mr.state == MrState::Deregistering {
            return Err(AccessError::InvalidStag);
        }
        if mr.pd != pd {
            return Err(AccessError::PdMismatch);
        }
        if !mr.invalidatable {
            return Err(AccessError::CannotInvalidate);
        }
        mr.state = MrState::Invalid;
        Ok(())
    }

    /// Remote invalidation: the Invalidate STag of a received Send with
    /// Invalidate (RFC 5040 §5.3), on a stream whose queue pair is in
    /// `pd`. Allowed only for an invalidatable region of the same domain
    /// that grants some remote right; the new state refuses every later
    /// access while existing pins (an in-flight Read Response) stay valid.
    pub fn invalidate_remote(&mut self, stag: Stag, pd: PdId) -> Result<(), AccessError> {
        let index = self.lookup(stag)?;
        let mr = self
            .entry_mut(index)
            .and_then(|e| e.mr.as_mut())
            .ok_or(AccessError::InvalidStag)?;
        if mr.state == MrState::Deregistering {
            return Err(AccessError::InvalidStag);
        }
        if mr.pd != pd {
            return Err(AccessError::PdMismatch);
        }
        if !mr.invalidatable || !mr.access.is_remote() {
            return Err(AccessError::CannotInvalidate);
        }
        mr.state = MrState::Invalid;
        Ok(())
    }

    /// Checks a tagged placement (RDMA Write payload, RFC 5040 §5.1, RFC 5041
    /// tagged buffer model) of `len` bytes at tagged offset `to` through `stag`, on a stream
    /// in `pd`. `Ok(None)` for a zero-length access (see the module docs).
    pub fn check_remote_write(
        &self,
        stag: Stag,
        to: u64,
        len: u32,
        pd: PdId,
    ) -> Result<Option<CheckedRange<'_>>, AccessError> {
        Ok(self
            .resolve(stag, to, len, pd, Access::REMOTE_WRITE)?
            .map(|r| CheckedRange::mint(Mint(()), r.region, r.offset, r.len)))
    }

    /// Checks the Data Source of an inbound RDMA Read Request (RFC 5040
    /// §5.2): `len` bytes at `to` through `stag`, on a stream in `pd`.
    pub fn check_remote_read(
        &self,
        stag: Stag,
        to: u64,
        len: u32,
        pd: PdId,
    ) -> Result<Option<CheckedRange<'_>>, AccessError> {
        Ok(self
            .resolve(stag, to, len, pd, Access::REMOTE_READ)?
            .map(|r| CheckedRange::mint(Mint(()), r.region, r.offset, r.len)))
    }

    /// Checks a local SGE (`lkey`, `addr`, `len`) of a queue pair in `pd`
    /// that needs `access` ([`Access::LOCAL_WRITE`] for receive buffers and
    /// Read sinks, [`Access::NONE`] for data to send).
    pub fn check_local(
        &self,
        lkey: Stag,
        addr: u64,
        len: u32,
        pd: PdId,
        access: Access,
    ) -> Result<Option<CheckedRange<'_>>, AccessError> {
        Ok(self
            .resolve(lkey, addr, len, pd, access)?
            .map(|r| CheckedRange::mint(Mint(()), r.region, r.offset, r.len)))
    }

    /// [`MrTable::check_remote_read`], pinning the source for the Read
    /// Response that will be built (and possibly retransmitted) from it.
    pub fn pin_remote_read(
        &mut self,
        stag: Stag,
        to: u64,
        len: u32,
        pd: PdId,
    ) -> Result<Option<RegionRef>, AccessError> {
        let resolved = self.resolve(stag, to, len, pd, Access::REMOTE_READ)?;
        resolved.map(|r| self.pin_resolved(r)).transpose()
    }

    /// [`MrTable::check_local`], pinning the bytes (the send path's source
    /// data for FPDUs waiting for acknowledgement).
    pub fn pin_local(
        &mut self,
        lkey: Stag,
        addr: u64,
        len: u32,
        pd: PdId,
        access: Access,
    ) -> Result<Option<RegionRef>, AccessError> {
        let resolved = self.resolve(lkey, addr, len, pd, access)?;
        resolved.map(|r| self.pin_resolved(r)).transpose()
    }

    /// Another pin on the bytes `[at, at + len)` of `pinned`, for example one
    /// per FPDU when the dataplane frees each FPDU's buffer separately. Needs
    /// no check: the region cannot have gone while `pinned` exists. `None`
    /// if the sub-range is empty or outside `pinned`.
    pub fn pin_sub(&mut self, pinned: &RegionRef, at: u32, len: u32) -> Option<RegionRef> {
        let range = pinned.range().sub(at, len)?;
        let entry = self.entry_mut(pinned.index)?;
        let mr = entry.mr.as_mut().filter(|_| entry.epoch == pinned.epoch)?;
        mr.pins = mr.pins.checked_add(1)?;
        Some(RegionRef::mint(
            Mint(()),
            pinned.index,
            pinned.epoch,
            range.region(),
            range.offset(),
            range.len(),
        ))
    }

    /// Returns a pin. If it was the last one of a region being deregistered,
    /// the region is released and [`MrEvent::Deregistered`] is queued.
    pub fn unpin(&mut self, pinned: RegionRef) {
        let index = pinned.index;
        let Some(entry) = self.entry_mut(index) else {
            debug_assert!(false, "RegionRef from another table");
            return;
        };
        let Some(mr) = entry
            .mr
            .as_mut()
            .filter(|m| entry.epoch == pinned.epoch && m.pins > 0)
        else {
            debug_assert!(false, "RegionRef outlived its region");
            return;
        };
        mr.pins -= 1;
        if mr.pins == 0 && mr.state == MrState::Deregistering {
            let stag = Stag::new(index, entry.key);
            self.free_index(index);
            if self.events.len() == self.events.capacity().max(1) {
                self.events.pop_front();
                self.events_lost += 1;
            }
            self.events.push_back(MrEvent::Deregistered(stag));
        }
    }

    /// The next asynchronous event, if any.
    pub fn poll_event(&mut self) -> Option<MrEvent> {
        self.events.pop_front()
    }

    /// Events dropped because nobody polled them and the queue (one slot
    /// per region) overflowed. Zero unless the dataplane stops polling.
    pub fn events_lost(&self) -> u64 {
        self.events_lost
    }

    /// A snapshot of the region with `stag`'s index, whatever its key.
    pub fn query_mr(&self, stag: Stag) -> Option<MrInfo> {
        let index = stag.index();
        let entry = self.entry(index)?;
        let mr = entry.mr?;
        Some(MrInfo {
            stag: Stag::new(index, entry.key),
            pd: mr.pd,
            kind: mr.kind,
            state: mr.state,
            access: mr.access,
            iova: mr.iova,
            len: mr.mem.len,
            mem: mr.mem,
            pins: mr.pins,
            invalidatable: mr.invalidatable,
        })
    }

    /// Whether any region (in any state) belongs to `pd`.
    pub fn pd_in_use(&self, pd: PdId) -> bool {
        self.entries
            .iter()
            .chain(self.imported.values())
            .any(|e| e.mr.is_some_and(|mr| mr.pd == pd))
    }

    fn insert(&mut self, mr: Mr) -> Result<Stag, VerbsError> {
        if self.live >= self.capacity() {
            return Err(VerbsError::TableFull);
        }
        let index = self.free.pop_front().ok_or(VerbsError::TableFull)?;
        let entry = &mut self.entries[index as usize];
        entry.mr = Some(mr);
        self.live += 1;
        Ok(Stag::new(index, entry.key))
    }

    fn free_index(&mut self, index: u32) {
        if index as usize >= self.entries.len() {
            if self.imported.remove(&index).is_some() {
                self.live -= 1;
            }
            return;
        }
        let entry = &mut self.entries[index as usize];
        entry.mr = None;
        entry.key = entry.key.wrapping_add(1);
        entry.epoch = entry.epoch.wrapping_add(1);
        self.live -= 1;
        // Freed indices go to the back: the longest possible time before an
        // index (and, 256 reuses later, a key) comes round again.
        self.free.push_back(index);
    }

    /// The slot of `index`: the dense table's, or an imported one. Index 0
    /// has none. The side map is searched only when it holds anything, so
    /// tables that never import pay one comparison.
    fn entry(&self, index: u32) -> Option<&Entry> {
        if index == 0 {
            return None;
        }
        match self.entries.get(index as usize) {
            Some(e) => Some(e),
            None if self.imported.is_empty() => None,
            None => self.imported.get(&index),
        }
    }

    fn entry_mut(&mut self, index: u32) -> Option<&mut Entry> {
        if index == 0 {
            return None;
        }
        if (index as usize) < self.entries.len() {
            return self.entries.get_mut(index as usize);
        }
        self.imported.get_mut(&index)
    }

    /// The index of a live region whose index and key match `stag`.
    fn lookup(&self, stag: Stag) -> Result<u32, AccessError> {
        let index = stag.index();
        let entry = self.entry(index).ok_or(AccessError::InvalidStag)?;
        if entry.mr.is_none() || entry.key != stag.key() {
            return Err(AccessError::InvalidStag);
        }
        Ok(index)
    }

    /// The checks, in the order DDP's error list and siw apply them: STag,
    /// domain, rights, wrap, bounds. Inlined into its callers, the send
    /// path's pin of every record and the receive path's check of every
    /// tagged segment among them: called, its result came back through
    /// memory and was read back in pieces wider than the stores that
    /// wrote it, which the CPU cannot forward (the hottest instruction
    /// of `pin_local`). A hint was not taken: it is always inlined.
    #[inline(always)]
    fn resolve(
        &self,
        stag: Stag,
        to: u64,
        len: u32,
        pd: PdId,
        need: Access,
    ) -> Result<Option<Resolved>, AccessError> {
        if len == 0 {
            return Ok(None);
        }
        let index = self.lookup(stag)?;
        let entry = self.entry(index).ok_or(AccessError::InvalidStag)?;
        let mr = entry.mr.as_ref().ok_or(AccessError::InvalidStag)?;
        if mr.state != MrState::Valid {
            return Err(AccessError::InvalidStag);
        }
        if mr.pd != pd {
            return Err(AccessError::PdMismatch);
        }
        if !mr.access.contains(need) {
            return Err(AccessError::AccessRights);
        }
        let end = to.checked_add(u64::from(len)).ok_or(AccessError::ToWrap)?;
        // Registration guarantees `iova + len` and `mem.offset + len` fit.
        if to < mr.iova || end > mr.iova + mr.mem.len {
            return Err(AccessError::BaseBounds);
        }
        Ok(Some(Resolved {
            index,
            epoch: entry.epoch,
            region: mr.mem.region,
            offset: mr.mem.offset + (to - mr.iova),
            len,
        }))
    }

    #[inline]
    fn pin_resolved(&mut self, r: Resolved) -> Result<RegionRef, AccessError> {
        let mr = self
            .entry_mut(r.index)
            .and_then(|e| e.mr.as_mut())
            .ok_or(AccessError::InvalidStag)?;
        mr.pins = mr
            .pins
            .checked_add(1)
            .ok_or(AccessError::InvalidOperation)?;
        Ok(RegionRef::mint(
            Mint(()),
            r.index,
            r.epoch,
            r.region,
            r.offset,
            r.len,
        ))
    }
}

/// A binding of `mem` at tagged offset `iova` must be non-empty and keep
/// both ends inside 64 bits, so the bounds arithmetic of the checks cannot
/// overflow.
fn validate_binding(mem: MemSpan, iova: u64) -> Result<(), VerbsError> {
    if mem.len == 0 {
        return Err(VerbsError::InvalidLength);
    }
    if iova.checked_add(mem.len).is_none() || mem.offset.checked_add(mem.len).is_none() {
        return Err(VerbsError::AddressOverflow);
    }
    Ok(())
}

/// SplitMix64, for the seeded initial keys.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PD: PdId = PdId(1);

    fn span(len: u64) -> MemSpan {
        MemSpan::new(RegionHandle(7), 100, len)
    }

    #[test]
    fn stag_layout_matches_siw() {
        let s = Stag(0x2b9d_4f00);
        assert_eq!(s.index(), 0x2b9d4f);
        assert_eq!(s.key(), 0);
        assert_eq!(Stag::new(0x2b9d4f, 0x17), Stag(0x2b9d_4f17));
        assert_eq!(s.with_key(0xff).0, 0x2b9d_4fff);
        assert_eq!(format!("{s:?}"), "Stag(0x2b9d4f00)");
    }

    #[test]
    fn access_debug_and_consistency() {
        let a = Access::LOCAL_WRITE | Access::REMOTE_READ;
        assert_eq!(format!("{a:?}"), "Access(LOCAL_WRITE | REMOTE_READ)");
        assert!(!Access::REMOTE_WRITE.is_consistent());
        assert!((Access::REMOTE_WRITE | Access::LOCAL_WRITE).is_consistent());
        assert!(Access::REMOTE_READ.is_consistent());
    }

    #[test]
    fn freed_index_changes_key_and_epoch() {
        let mut t = MrTable::new(1);
        let a = t.reg_mr(PD, span(10), 0, Access::NONE).unwrap();
        assert_eq!(t.dereg_mr(a), Ok(DeregStatus::Done));
        let b = t.reg_mr(PD, span(10), 0, Access::NONE).unwrap();
        assert_eq!(a.index(), b.index());
        assert_ne!(a.key(), b.key());
        assert_eq!(t.entries[b.index() as usize].epoch, 1);
    }

    #[test]
    fn seeded_keys_differ_between_indices() {
        let t = MrTable::with_seed(64, 42);
        let keys: std::collections::BTreeSet<u8> = t.entries.iter().map(|e| e.key).collect();
        assert!(keys.len() > 16, "keys barely vary: {keys:?}");
    }

    #[test]
    fn resolve_maps_tagged_offset_into_span() {
        let mut t = MrTable::new(4);
        let s = t
            .reg_mr(PD, span(64), 0x7f00_0000_1000, Access::REMOTE_READ)
            .unwrap();
        let r = t
            .check_remote_read(s, 0x7f00_0000_1010, 8, PD)
            .unwrap()
            .unwrap();
        assert_eq!((r.region(), r.offset(), r.len()), (RegionHandle(7), 116, 8));
    }

    #[test]
    fn stale_pin_cannot_reach_a_reused_index() {
        // The epoch guard: a pin taken before an index was freed cannot
        // reach the region that reuses it (exercised through pin_sub, which
        // does not assert).
        let mut t = MrTable::new(1);
        let a = t.reg_mr(PD, span(8), 0, Access::NONE).unwrap();
        let pin = t.pin_local(a, 0, 8, PD, Access::NONE).unwrap().unwrap();
        let forged = RegionRef::mint(Mint(()), pin.index, pin.epoch + 1, RegionHandle(7), 100, 8);
        assert!(t.pin_sub(&forged, 0, 1).is_none());
        t.unpin(pin);
    }

    #[test]
    fn imported_regions_never_reuse_an_epoch() {
        // A region at a caller-chosen index beyond the dense table, freed
        // and registered again: the pin of the first cannot reach the
        // second.
        let mut t = MrTable::new(2);
        let stag = Stag(0x2b9d_4f00);
        t.reg_mr_at(stag, PD, span(8), 0, Access::NONE).unwrap();
        let pin = t.pin_local(stag, 0, 8, PD, Access::NONE).unwrap().unwrap();
        let (index, epoch) = (pin.index, pin.epoch);
        t.unpin(pin);
        assert_eq!(t.dereg_mr(stag), Ok(DeregStatus::Done));
        assert!(t.imported.is_empty());
        t.reg_mr_at(stag, PD, span(8), 0, Access::NONE).unwrap();
        let forged = RegionRef::mint(Mint(()), index, epoch, RegionHandle(7), 100, 8);
        assert!(t.pin_sub(&forged, 0, 1).is_none());
        let fresh = t.pin_local(stag, 0, 8, PD, Access::NONE).unwrap().unwrap();
        assert_ne!(fresh.epoch, epoch);
        t.unpin(fresh);
    }

    #[test]
    fn mirrored_fast_register_region_behaves_like_the_original() {
        // The control path allocates; a mirror allocates under the same
        // STag; the same fast registration and invalidation give the same
        // states on both.
        let mut origin = MrTable::new(4);
        let stag = origin.alloc_mr(PD, 64).unwrap();
        let mut mirror = MrTable::new(4);
        assert_eq!(mirror.alloc_mr_at(stag, PD, 64), Ok(stag));
        assert_eq!(mirror.alloc_mr_at(stag, PD, 64), Err(VerbsError::Busy));
        assert_eq!(
            mirror.alloc_mr_at(Stag::new(0, 1), PD, 64),
            Err(VerbsError::InvalidStag)
        );
        assert_eq!(
            mirror.alloc_mr_at(Stag::new(2, 0), PD, 0),
            Err(VerbsError::InvalidLength)
        );
        let fr = FastReg {
            stag: stag.with_key(0x42),
            mem: span(32),
            iova: 0x1000,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        };
        for t in [&mut origin, &mut mirror] {
            assert!(t.check_remote_write(stag, 0, 1, PD).is_err());
            t.fast_register(&fr, PD).unwrap();
            assert!(t.check_remote_write(fr.stag, 0x1000, 32, PD).is_ok());
            t.invalidate_local(fr.stag, PD).unwrap();
            assert_eq!(
                t.check_remote_write(fr.stag, 0x1000, 1, PD).err(),
                Some(AccessError::InvalidStag)
            );
            let info = t.query_mr(stag).unwrap();
            assert_eq!(
                (info.kind, info.state),
                (MrKind::FastRegister, MrState::Invalid)
            );
        }
    }
}
