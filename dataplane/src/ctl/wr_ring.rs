//! The posting rings of a queue pair and of a shared receive queue: the
//! application's threads push work requests, the owning worker pops them
//! (`worker::conn`'s `drain_posts`, the SRQ supply). They sit between
//! [`crate::api`]'s `post_send` / `post_recv` and the rdmap engine's queues.
//!
//! A ring is taken whole when its queue is created (as a hardware RNIC
//! takes its work queues), so its entry size is what an idle queue pair
//! costs: a [`SendWr`] is 168 bytes, because its scatter/gather list holds
//! [`rdmap::verbs::MAX_SGE`] entries inline and a fast registration rides
//! in its operation. Nearly every request carries one entry (or none) and
//! no fast registration, so the ring stores a packed form of 40 bytes
//! (receives: 32) with one entry inline. A request that does not fit
//! (two entries or more, a fast registration) goes whole into a block of
//! a spill area and the ring carries the block's index; the area, a block
//! per ring entry and a free list of their indices, is allocated the first
//! time a request spills, so only queues that post such requests pay for
//! it, once. Posting stays lock-free and allocation-free after that.
//!
//! A block is a run of atomic words the request is written into and read
//! back from: the index that names it moves through the rings, whose push
//! happens-before the pop that takes it, so the poster's stores are
//! visible to the worker that reads them, and its reads are done before
//! the index goes back to the free list for the next poster. No `unsafe`
//! is needed for that, and no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crossbeam_queue::ArrayQueue;
use rdmap::placement::{MemSpan, RegionHandle};
use rdmap::verbs::{
    Access, FastReg, RecvWr, SendFlags, SendOp, SendWr, Sge, SgeList, Stag, MAX_SGE,
};

use super::slots::{Consumers, Slots, Words};

/// The ring (and, if any, the spill area) is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Full;

/// A work request's ring form: packed when it fits, else a spill block's
/// index.
pub(crate) trait Packable: Copy + Send {
    /// What a ring entry holds.
    type Packed: Copy + Send;
    /// A ring entry's words.
    type Atoms: Words;
    /// The entry as words.
    fn to_words(p: Self::Packed) -> <Self::Atoms as Words>::Plain;
    /// [`Packable::to_words`] back.
    fn from_words(w: <Self::Atoms as Words>::Plain) -> Self::Packed;
    /// The packed form, or `None` when the request must spill.
    fn pack(&self) -> Option<Self::Packed>;
    /// The entry naming spill block `index`.
    fn spilled(index: u32) -> Self::Packed;
    /// The request back, or the index of its spill block.
    fn unpack(p: Self::Packed) -> Result<Self, u32>;
    /// Words of a spill block.
    const WORDS: usize;
    /// Writes the whole request into a block of [`Self::WORDS`] words.
    fn store(&self, block: &[AtomicU64]);
    /// The request a block holds.
    fn load(block: &[AtomicU64]) -> Self;
}

/// A bounded ring of work requests, pushed by any thread (see
/// [`super::slots`] for who takes them).
pub(crate) struct WrRing<W: Packable> {
    ring: Slots<W::Atoms>,
    spill: OnceLock<Spill>,
    _wr: core::marker::PhantomData<fn(W) -> W>,
}

/// Blocks for requests that do not pack, and their free indices. As many
/// blocks as the ring has entries: a ring with room always finds a block.
struct Spill {
    free: ArrayQueue<u32>,
    /// The blocks, [`Packable::WORDS`] words each.
    words: Box<[AtomicU64]>,
}

impl Spill {
    fn block<W: Packable>(&self, i: u32) -> Option<&[AtomicU64]> {
        let at = i as usize * W::WORDS;
        self.words.get(at..at + W::WORDS)
    }
}

impl<W: Packable> WrRing<W> {
    /// A ring of `cap` entries (at least one) that one worker at a time
    /// takes from: a queue pair's.
    pub(crate) fn new(cap: usize) -> WrRing<W> {
        WrRing::with(cap, Consumers::One)
    }

    /// A ring of `cap` entries that several workers take from at once: a
    /// shared receive queue's.
    pub(crate) fn shared(cap: usize) -> WrRing<W> {
        WrRing::with(cap, Consumers::Many)
    }

    fn with(cap: usize, consumers: Consumers) -> WrRing<W> {
        WrRing {
            ring: Slots::new(cap, consumers),
            spill: OnceLock::new(),
            _wr: core::marker::PhantomData,
        }
    }

    /// Appends `wr`; a full ring refuses it.
    pub(crate) fn push(&self, wr: &W) -> Result<(), Full> {
        if let Some(p) = wr.pack() {
            return self.ring.push(W::to_words(p)).then_some(()).ok_or(Full);
        }
        let cap = self.ring.capacity();
        let spill = self.spill.get_or_init(|| Spill {
            free: {
                let free = ArrayQueue::new(cap);
                for i in 0..cap as u32 {
                    let _ = free.push(i);
                }
                free
            },
            words: (0..cap * W::WORDS).map(|_| AtomicU64::new(0)).collect(),
        });
        let i = spill.free.pop().ok_or(Full)?;
        // The index is this thread's until the entry naming it is popped.
        wr.store(spill.block::<W>(i).ok_or(Full)?);
        if !self.ring.push(W::to_words(W::spilled(i))) {
            // Full meanwhile: the block was never published.
            let _ = spill.free.push(i);
            return Err(Full);
        }
        Ok(())
    }

    /// Appends `wrs` in order, as many as there is room for, and returns
    /// how many. A run of requests that pack is reserved with one atomic
    /// operation ([`Slots::reserve`]); a request that spills goes alone.
    pub(crate) fn push_list(&self, wrs: &[W]) -> usize {
        /// Requests packed on the stack before their run is reserved.
        const RUN: usize = 16;
        let mut done = 0;
        while let Some(rest) = wrs.get(done..).filter(|r| !r.is_empty()) {
            let mut run: [Option<<W::Atoms as Words>::Plain>; RUN] = [None; RUN];
            let mut n = 0;
            for (slot, wr) in run.iter_mut().zip(rest) {
                match wr.pack() {
                    Some(p) => *slot = Some(W::to_words(p)),
                    None => break,
                }
                n += 1;
            }
            if n == 0 {
                if self.push(&rest[0]).is_err() {
                    break;
                }
                done += 1;
                continue;
            }
            let got = self.ring.reserve(n);
            for (k, v) in run[..got.count].iter().flatten().enumerate() {
                self.ring.publish(got.first + k as u64, *v);
            }
            done += got.count;
            if got.count < n {
                break;
            }
        }
        done
    }

    /// The oldest request.
    pub(crate) fn pop(&self) -> Option<W> {
        let p = W::from_words(self.ring.pop()?);
        match W::unpack(p) {
            Ok(wr) => Some(wr),
            Err(i) => {
                // An entry naming a block was pushed after the area was
                // made (and the push happens-before this pop).
                let spill = self.spill.get()?;
                let wr = W::load(spill.block::<W>(i)?);
                // Read: the block may take the next poster's request.
                let _ = spill.free.push(i);
                Some(wr)
            }
        }
    }

    /// Requests in the ring.
    pub(crate) fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether it holds none.
    pub(crate) fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Requests it holds at most.
    pub(crate) fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Whether the spill area was made.
    #[cfg(test)]
    fn has_spill_area(&self) -> bool {
        self.spill.get().is_some()
    }
}

impl<W: Packable> core::fmt::Debug for WrRing<W> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WrRing")
            .field("len", &self.ring.len())
            .field("capacity", &self.ring.capacity())
            .field("spill", &self.spill.get().is_some())
            .finish()
    }
}

/// A send request with at most one entry and no fast registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PackedSend {
    /// The request's id; a spilled entry's block index.
    wr_id: u64,
    /// Tagged offset at the peer (Writes and Reads).
    remote_addr: u64,
    /// The entry's address.
    addr: u64,
    /// The entry's length.
    length: u32,
    /// The entry's STag.
    lkey: u32,
    /// The peer's STag (Writes, Reads), the STag to invalidate (Send with
    /// Invalidate, Local Invalidate).
    key: u32,
    /// Which operation ([`SEND`] ... [`SPILLED`]).
    kind: u8,
    /// The request's flags.
    flags: u8,
    /// Entries: 0 or 1.
    sges: u8,
}

const SEND: u8 = 0;
const SEND_INV: u8 = 1;
const WRITE: u8 = 2;
const READ: u8 = 3;
const LOCAL_INV: u8 = 4;
const SPILLED: u8 = 5;
/// Only in a spill block.
const FAST_REG: u8 = 6;

/// The flags' bits as [`PackedSend`] keeps them.
const FLAG_BITS: [(SendFlags, u8); 3] = [
    (SendFlags::SIGNALED, 1),
    (SendFlags::SOLICITED, 2),
    (SendFlags::FENCE, 4),
];

fn flag_bits(flags: SendFlags) -> u8 {
    FLAG_BITS
        .iter()
        .filter(|(f, _)| flags.contains(*f))
        .fold(0, |acc, (_, b)| acc | b)
}

fn flags_of(bits: u8) -> SendFlags {
    FLAG_BITS
        .iter()
        .filter(|(_, b)| bits & b != 0)
        .fold(SendFlags::NONE, |acc, (f, _)| acc | *f)
}

/// An operation other than a fast registration as its kind, the peer's
/// address and the STag it names.
fn op_fields(op: &SendOp) -> Option<(u8, u64, u32)> {
    Some(match *op {
        SendOp::Send => (SEND, 0, 0),
        SendOp::SendWithInvalidate { invalidate } => (SEND_INV, 0, invalidate.0),
        SendOp::RdmaWrite { remote_addr, rkey } => (WRITE, remote_addr, rkey.0),
        SendOp::RdmaRead { remote_addr, rkey } => (READ, remote_addr, rkey.0),
        SendOp::LocalInvalidate { stag } => (LOCAL_INV, 0, stag.0),
        SendOp::FastRegister(_) => return None,
    })
}

/// [`op_fields`] back; `None` for [`SPILLED`] and [`FAST_REG`].
fn op_of(kind: u8, remote_addr: u64, key: u32) -> Option<SendOp> {
    let key = Stag(key);
    Some(match kind {
        SEND => SendOp::Send,
        SEND_INV => SendOp::SendWithInvalidate { invalidate: key },
        WRITE => SendOp::RdmaWrite {
            remote_addr,
            rkey: key,
        },
        READ => SendOp::RdmaRead {
            remote_addr,
            rkey: key,
        },
        LOCAL_INV => SendOp::LocalInvalidate { stag: key },
        _ => return None,
    })
}

/// Words an SGE list takes in a block: its length, then each entry's
/// address and its length and STag.
const SGE_WORDS: usize = 1 + 2 * MAX_SGE;

fn store_sges(sges: &SgeList, out: &[AtomicU64]) {
    out[0].store(sges.len() as u64, Ordering::Relaxed);
    for (k, s) in sges.as_slice().iter().enumerate() {
        out[1 + 2 * k].store(s.addr, Ordering::Relaxed);
        out[2 + 2 * k].store(
            u64::from(s.length) | u64::from(s.lkey.0) << 32,
            Ordering::Relaxed,
        );
    }
}

fn load_sges(words: &[AtomicU64]) -> SgeList {
    let n = (words[0].load(Ordering::Relaxed) as usize).min(MAX_SGE);
    let mut sges = [Sge::default(); MAX_SGE];
    for (k, s) in sges[..n].iter_mut().enumerate() {
        let w = words[2 + 2 * k].load(Ordering::Relaxed);
        *s = Sge {
            addr: words[1 + 2 * k].load(Ordering::Relaxed),
            length: w as u32,
            lkey: Stag((w >> 32) as u32),
        };
    }
    SgeList::new(&sges[..n]).unwrap_or_default()
}

/// Every access right, to rebuild [`Access`] from its bits.
const RIGHTS: [Access; 5] = [
    Access::LOCAL_WRITE,
    Access::REMOTE_WRITE,
    Access::REMOTE_READ,
    Access::REMOTE_ATOMIC,
    Access::MW_BIND,
];

/// An empty list, or one entry.
fn one_sge(sges: &SgeList) -> Option<(Sge, u8)> {
    match sges.as_slice() {
        [] => Some((Sge::default(), 0)),
        [s] => Some((*s, 1)),
        _ => None,
    }
}

impl Packable for SendWr {
    type Packed = PackedSend;
    type Atoms = [AtomicU64; 5];

    fn to_words(p: PackedSend) -> [u64; 5] {
        [
            p.wr_id,
            p.remote_addr,
            p.addr,
            u64::from(p.length) | u64::from(p.lkey) << 32,
            u64::from(p.key)
                | u64::from(p.kind) << 32
                | u64::from(p.flags) << 40
                | u64::from(p.sges) << 48,
        ]
    }

    fn from_words(w: [u64; 5]) -> PackedSend {
        PackedSend {
            wr_id: w[0],
            remote_addr: w[1],
            addr: w[2],
            length: w[3] as u32,
            lkey: (w[3] >> 32) as u32,
            key: w[4] as u32,
            kind: (w[4] >> 32) as u8,
            flags: (w[4] >> 40) as u8,
            sges: (w[4] >> 48) as u8,
        }
    }

    fn pack(&self) -> Option<PackedSend> {
        let (sge, sges) = one_sge(&self.sges)?;
        let (kind, remote_addr, key) = op_fields(&self.op)?;
        Some(PackedSend {
            wr_id: self.wr_id,
            remote_addr,
            addr: sge.addr,
            length: sge.length,
            lkey: sge.lkey.0,
            key,
            kind,
            flags: flag_bits(self.flags),
            sges,
        })
    }

    fn spilled(index: u32) -> PackedSend {
        PackedSend {
            wr_id: u64::from(index),
            remote_addr: 0,
            addr: 0,
            length: 0,
            lkey: 0,
            key: 0,
            kind: SPILLED,
            flags: 0,
            sges: 0,
        }
    }

    fn unpack(p: PackedSend) -> Result<SendWr, u32> {
        let op = op_of(p.kind, p.remote_addr, p.key).ok_or(p.wr_id as u32)?;
        let sges = if p.sges == 0 {
            SgeList::empty()
        } else {
            SgeList::single(Sge {
                addr: p.addr,
                length: p.length,
                lkey: Stag(p.lkey),
            })
        };
        Ok(SendWr {
            wr_id: p.wr_id,
            op,
            sges,
            flags: flags_of(p.flags),
        })
    }

    /// The id; kind, flags and STag; the peer's address or a fast
    /// registration's four other fields; the SGE list.
    const WORDS: usize = 7 + SGE_WORDS;

    fn store(&self, block: &[AtomicU64]) {
        let (kind, key, fields) = match (self.op, op_fields(&self.op)) {
            (SendOp::FastRegister(f), _) => (
                FAST_REG,
                f.stag.0,
                [
                    f.mem.region.0,
                    f.mem.offset,
                    f.mem.len,
                    f.iova,
                    u64::from(f.access.bits()),
                ],
            ),
            (_, Some((kind, remote_addr, key))) => (kind, key, [remote_addr, 0, 0, 0, 0]),
            (_, None) => (SEND, 0, [0; 5]),
        };
        block[0].store(self.wr_id, Ordering::Relaxed);
        block[1].store(
            u64::from(kind) | u64::from(flag_bits(self.flags)) << 8 | u64::from(key) << 32,
            Ordering::Relaxed,
        );
        for (w, v) in block[2..7].iter().zip(fields) {
            w.store(v, Ordering::Relaxed);
        }
        store_sges(&self.sges, &block[7..]);
    }

    fn load(block: &[AtomicU64]) -> SendWr {
        let w = |i: usize| block[i].load(Ordering::Relaxed);
        let head = w(1);
        let (kind, key) = (head as u8, (head >> 32) as u32);
        let op = if kind == FAST_REG {
            SendOp::FastRegister(FastReg {
                stag: Stag(key),
                mem: MemSpan {
                    region: RegionHandle(w(2)),
                    offset: w(3),
                    len: w(4),
                },
                iova: w(5),
                access: RIGHTS
                    .iter()
                    .filter(|r| w(6) as u8 & r.bits() != 0)
                    .fold(Access::NONE, |acc, r| acc | *r),
            })
        } else {
            op_of(kind, w(2), key).unwrap_or(SendOp::Send)
        };
        SendWr {
            wr_id: w(0),
            op,
            sges: load_sges(&block[7..]),
            flags: flags_of((head >> 8) as u8),
        }
    }
}

/// A receive request with at most one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PackedRecv {
    /// The request's id; a spilled entry's block index.
    wr_id: u64,
    /// The entry's address.
    addr: u64,
    /// The entry's length.
    length: u32,
    /// The entry's STag.
    lkey: u32,
}

/// The address, length and STag of a [`PackedRecv`] that names a spill
/// block: an entry of 4 GiB at the last address lies in no region. A
/// request whose one entry equals this or [`RECV_EMPTY`] spills, so that
/// every request still comes back as posted.
const RECV_SPILLED: (u64, u32, u32) = (u64::MAX, u32::MAX, u32::MAX);
/// A [`PackedRecv`] without entries.
const RECV_EMPTY: (u64, u32, u32) = (u64::MAX, u32::MAX, u32::MAX - 1);

impl Packable for RecvWr {
    type Packed = PackedRecv;
    type Atoms = [AtomicU64; 3];

    fn to_words(p: PackedRecv) -> [u64; 3] {
        [
            p.wr_id,
            p.addr,
            u64::from(p.length) | u64::from(p.lkey) << 32,
        ]
    }

    fn from_words(w: [u64; 3]) -> PackedRecv {
        PackedRecv {
            wr_id: w[0],
            addr: w[1],
            length: w[2] as u32,
            lkey: (w[2] >> 32) as u32,
        }
    }

    fn pack(&self) -> Option<PackedRecv> {
        let (addr, length, lkey) = match self.sges.as_slice() {
            [] => RECV_EMPTY,
            [s] => (s.addr, s.length, s.lkey.0),
            _ => return None,
        };
        if (addr, length, lkey) == RECV_SPILLED
            || (!self.sges.is_empty() && (addr, length, lkey) == RECV_EMPTY)
        {
            // The markers themselves: never a real entry, but exact all
            // the same.
            return None;
        }
        Some(PackedRecv {
            wr_id: self.wr_id,
            addr,
            length,
            lkey,
        })
    }

    fn spilled(index: u32) -> PackedRecv {
        let (addr, length, lkey) = RECV_SPILLED;
        PackedRecv {
            wr_id: u64::from(index),
            addr,
            length,
            lkey,
        }
    }

    fn unpack(p: PackedRecv) -> Result<RecvWr, u32> {
        let sges = match (p.addr, p.length, p.lkey) {
            RECV_SPILLED => return Err(p.wr_id as u32),
            RECV_EMPTY => SgeList::empty(),
            (addr, length, lkey) => SgeList::single(Sge {
                addr,
                length,
                lkey: Stag(lkey),
            }),
        };
        Ok(RecvWr {
            wr_id: p.wr_id,
            sges,
        })
    }

    /// The id, the SGE list.
    const WORDS: usize = 1 + SGE_WORDS;

    fn store(&self, block: &[AtomicU64]) {
        block[0].store(self.wr_id, Ordering::Relaxed);
        store_sges(&self.sges, &block[1..]);
    }

    fn load(block: &[AtomicU64]) -> RecvWr {
        RecvWr {
            wr_id: block[0].load(Ordering::Relaxed),
            sges: load_sges(&block[1..]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmap::verbs::{Access, FastReg, MAX_SGE};

    fn sge(k: u64) -> Sge {
        Sge {
            addr: 0x1000 * k + 3,
            length: 100 + k as u32,
            lkey: Stag(0x0001_0200 + k as u32),
        }
    }

    fn sges(n: usize) -> SgeList {
        let v: Vec<Sge> = (0..n as u64).map(sge).collect();
        SgeList::new(&v).unwrap()
    }

    fn every_send() -> Vec<SendWr> {
        let mut out = Vec::new();
        let ops = [
            SendOp::Send,
            SendOp::SendWithInvalidate {
                invalidate: Stag(0xabcdef01),
            },
            SendOp::RdmaWrite {
                remote_addr: u64::MAX - 5,
                rkey: Stag(0x1234_5678),
            },
            SendOp::RdmaRead {
                remote_addr: 77,
                rkey: Stag(u32::MAX),
            },
            SendOp::LocalInvalidate { stag: Stag(9) },
            SendOp::FastRegister(FastReg {
                stag: Stag(0x300),
                mem: rdmap::placement::MemSpan {
                    region: rdmap::placement::RegionHandle(4),
                    offset: 8,
                    len: 4096,
                },
                iova: 0x7000,
                access: Access::REMOTE_WRITE,
            }),
        ];
        let flag_sets = [
            SendFlags::NONE,
            SendFlags::SIGNALED,
            SendFlags::SOLICITED | SendFlags::FENCE,
            SendFlags::SIGNALED | SendFlags::SOLICITED | SendFlags::FENCE,
        ];
        for (i, op) in ops.into_iter().enumerate() {
            for (j, flags) in flag_sets.into_iter().enumerate() {
                for n in 0..=MAX_SGE {
                    out.push(SendWr {
                        wr_id: (i * 100 + j * 10 + n) as u64 | 1 << 63,
                        op,
                        sges: sges(n),
                        flags,
                    });
                }
            }
        }
        out
    }

    #[test]
    fn entries_are_small() {
        assert!(std::mem::size_of::<PackedSend>() <= 40);
        assert!(std::mem::size_of::<PackedRecv>() <= 24);
        // What they replace.
        assert!(std::mem::size_of::<SendWr>() >= 160);
        assert!(std::mem::size_of::<RecvWr>() >= 104);
    }

    #[test]
    fn every_send_comes_back_exactly_and_only_the_large_spill() {
        let all = every_send();
        let ring = WrRing::<SendWr>::new(all.len());
        for wr in &all {
            ring.push(wr).unwrap();
        }
        assert_eq!(ring.len(), all.len());
        for wr in &all {
            assert_eq!(ring.pop().as_ref(), Some(wr));
        }
        assert!(ring.pop().is_none() && ring.is_empty());
        for wr in &all {
            let spills = wr.sges.len() > 1 || matches!(wr.op, SendOp::FastRegister(_));
            assert_eq!(wr.pack().is_none(), spills, "{wr:?}");
        }
    }

    #[test]
    fn every_recv_comes_back_exactly() {
        let mut all: Vec<RecvWr> = (0..=MAX_SGE)
            .map(|n| RecvWr {
                wr_id: n as u64 * 7,
                sges: sges(n),
            })
            .collect();
        // Entries that look like the markers still come back as posted.
        for (addr, length, lkey) in [RECV_SPILLED, RECV_EMPTY] {
            all.push(RecvWr {
                wr_id: 5,
                sges: SgeList::single(Sge {
                    addr,
                    length,
                    lkey: Stag(lkey),
                }),
            });
        }
        let ring = WrRing::<RecvWr>::new(all.len());
        for wr in &all {
            ring.push(wr).unwrap();
        }
        for wr in &all {
            assert_eq!(ring.pop().as_ref(), Some(wr));
        }
        assert!(ring.pop().is_none());
    }

    #[test]
    fn a_full_ring_refuses_either_form_and_frees_the_block() {
        let ring = WrRing::<SendWr>::new(2);
        let small = SendWr::send(1, sges(1));
        let large = SendWr::send(2, sges(3));
        ring.push(&large).unwrap();
        ring.push(&small).unwrap();
        assert_eq!(ring.push(&small), Err(Full));
        assert_eq!(ring.push(&large), Err(Full));
        assert_eq!(ring.pop(), Some(large));
        // The refused spill gave its block back: two spills fit again
        // once the ring has room.
        ring.push(&large).unwrap();
        assert_eq!(ring.pop(), Some(small));
        ring.push(&large).unwrap();
        assert_eq!(ring.push(&large), Err(Full));
        assert_eq!(ring.pop(), Some(large));
        assert_eq!(ring.pop(), Some(large));
        assert_eq!(ring.pop(), None);
    }

    #[test]
    fn a_list_goes_in_order_as_far_as_there_is_room() {
        // Runs longer than the packing stack, a spilling request between
        // two runs, and a ring too small for the whole list.
        let mut list: Vec<SendWr> = (0..40).map(|i| SendWr::send(i, sges(1))).collect();
        list[20] = SendWr::send(20, sges(3));
        let ring = WrRing::<SendWr>::new(33);
        assert_eq!(ring.push_list(&list), 33, "as many as fit");
        assert_eq!(ring.push_list(&list[33..]), 0, "none once full");
        for wr in &list[..33] {
            assert_eq!(ring.pop().as_ref(), Some(wr));
        }
        assert_eq!(ring.push_list(&list[33..]), 7);
        for wr in &list[33..] {
            assert_eq!(ring.pop().as_ref(), Some(wr));
        }
        assert!(ring.pop().is_none());
        assert_eq!(ring.push_list(&[]), 0);
    }

    #[test]
    fn the_spill_area_is_made_only_when_needed() {
        let ring = WrRing::<SendWr>::new(256);
        for i in 0..1000 {
            ring.push(&SendWr::send(i, sges(1))).unwrap();
            ring.pop().unwrap();
        }
        assert!(!ring.has_spill_area());
        ring.push(&SendWr::send(0, sges(2))).unwrap();
        assert!(ring.has_spill_area());
    }

    #[test]
    fn producers_on_threads_keep_their_order_and_lose_nothing() {
        const EACH: u64 = 20_000;
        let ring = std::sync::Arc::new(WrRing::<SendWr>::new(64));
        let producers: Vec<_> = (0..3u64)
            .map(|t| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        // Every third request spills.
                        let wr = SendWr::send(t << 32 | i, sges(1 + (i % 3 == 0) as usize * 2));
                        while ring.push(&wr).is_err() {
                            std::hint::spin_loop();
                        }
                    }
                })
            })
            .collect();
        let mut next = [0u64; 3];
        let mut got = 0;
        while got < 3 * EACH {
            let Some(wr) = ring.pop() else {
                std::hint::spin_loop();
                continue;
            };
            let (t, i) = ((wr.wr_id >> 32) as usize, wr.wr_id & 0xffff_ffff);
            assert_eq!(i, next[t], "producer {t} out of order");
            assert_eq!(wr.sges, sges(1 + (i % 3 == 0) as usize * 2));
            next[t] += 1;
            got += 1;
        }
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!(next, [EACH; 3]);
        assert!(ring.is_empty());
    }
}
