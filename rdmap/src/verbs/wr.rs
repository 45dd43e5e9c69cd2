//! Work requests: what the consumer posts to a send queue (`ibv_send_wr`)
//! and to a receive queue or shared receive queue (`ibv_recv_wr`).
//!
//! The RDMAP operations they turn into are those of RFC 5040 §5: RDMA
//! Write (§5.1), RDMA Read (§5.2) and Send with its Solicited Event and
//! Invalidate variants (§5.3). Local invalidation and fast registration are local memory
//! operations of the verbs specifications that travel the send queue for
//! their ordering and completion. Every type is `Copy` and of fixed size: a
//! scatter/gather list holds at most [`MAX_SGE`] entries inline, so posting
//! allocates nothing.

use super::mr::{FastReg, Stag};

/// Scatter/gather entries per work request, at most (siw allows 6 too).
pub const MAX_SGE: usize = 6;

/// One scatter/gather entry (`ibv_sge`): `length` bytes at address (tagged
/// offset) `addr` of the region with STag `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Address in the region's tagged-offset space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The region's STag (its local key).
    pub lkey: Stag,
}

/// A scatter/gather list of up to [`MAX_SGE`] entries, stored inline.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct SgeList {
    len: u8,
    sges: [Sge; MAX_SGE],
}

impl SgeList {
    /// No entries.
    pub const fn empty() -> SgeList {
        SgeList {
            len: 0,
            sges: [Sge {
                addr: 0,
                length: 0,
                lkey: Stag(0),
            }; MAX_SGE],
        }
    }

    /// One entry.
    pub fn single(sge: Sge) -> SgeList {
        let mut list = SgeList::empty();
        list.sges[0] = sge;
        list.len = 1;
        list
    }

    /// The entries of `sges`, or `None` if there are more than [`MAX_SGE`].
    pub fn new(sges: &[Sge]) -> Option<SgeList> {
        if sges.len() > MAX_SGE {
            return None;
        }
        let mut list = SgeList::empty();
        list.sges[..sges.len()].copy_from_slice(sges);
        list.len = sges.len() as u8;
        Some(list)
    }

    /// The entries.
    pub fn as_slice(&self) -> &[Sge] {
        &self.sges[..self.len as usize]
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The total length, or `None` if it exceeds `u32` (an RDMAP message
    /// length; a Read Request carries it in 32 bits).
    pub fn total_len(&self) -> Option<u32> {
        self.as_slice()
            .iter()
            .try_fold(0u32, |acc, s| acc.checked_add(s.length))
    }
}

impl core::fmt::Debug for SgeList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// Flags of a send work request (`ibv_send_flags`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SendFlags(u8);

impl SendFlags {
    /// No flags.
    pub const NONE: SendFlags = SendFlags(0);
    /// Produce a completion on success too (`IBV_SEND_SIGNALED`).
    pub const SIGNALED: SendFlags = SendFlags(1);
    /// Send as "Send with Solicited Event" (RFC 5040 §5.3;
    /// `IBV_SEND_SOLICITED`). Sends only.
    pub const SOLICITED: SendFlags = SendFlags(2);
    /// Start only after every earlier RDMA Read of this send queue has
    /// completed (`IBV_SEND_FENCE`).
    pub const FENCE: SendFlags = SendFlags(4);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// The operation of a send work request (`ibv_wr_opcode`, iWARP subset).
/// A Send with [`SendFlags::SOLICITED`] is RDMAP's "Send with Solicited
/// Event"; [`SendOp::SendWithInvalidate`] with it is "Send with Solicited
/// Event and Invalidate".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// Send the SGEs' bytes into the peer's next receive buffer.
    Send,
    /// Send, and have the peer invalidate `invalidate` (one of its STags)
    /// when the message arrives (RFC 5040 §5.3).
    SendWithInvalidate {
        /// The peer's STag to invalidate.
        invalidate: Stag,
    },
    /// Write the SGEs' bytes to the peer's `rkey` at `remote_addr`.
    RdmaWrite {
        /// Tagged offset at the peer.
        remote_addr: u64,
        /// The peer's STag.
        rkey: Stag,
    },
    /// Read the SGE's length from the peer's `rkey` at `remote_addr` into the
    /// single local SGE (the Data Sink is one tagged buffer, RFC 5040 §5.2).
    RdmaRead {
        /// Tagged offset at the peer.
        remote_addr: u64,
        /// The peer's STag.
        rkey: Stag,
    },
    /// Invalidate one of our own STags (`IBV_WR_LOCAL_INV`).
    LocalInvalidate {
        /// The STag to invalidate.
        stag: Stag,
    },
    /// Bind a fast-register region to memory (`IBV_WR_REG_MR`).
    FastRegister(FastReg),
}

/// A send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// The consumer's id, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local data (source for Send and Write, sink for Read; none for local
    /// memory operations).
    pub sges: SgeList,
    /// Flags.
    pub flags: SendFlags,
}

impl SendWr {
    /// A signalled Send of `sges`.
    pub fn send(wr_id: u64, sges: SgeList) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Send,
            sges,
            flags: SendFlags::SIGNALED,
        }
    }

    /// A signalled RDMA Write of `sges` to `rkey` at `remote_addr`.
    pub fn write(wr_id: u64, sges: SgeList, remote_addr: u64, rkey: Stag) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::RdmaWrite { remote_addr, rkey },
            sges,
            flags: SendFlags::SIGNALED,
        }
    }

    /// A signalled RDMA Read from `rkey` at `remote_addr` into `sink`.
    pub fn read(wr_id: u64, sink: Sge, remote_addr: u64, rkey: Stag) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::RdmaRead { remote_addr, rkey },
            sges: SgeList::single(sink),
            flags: SendFlags::SIGNALED,
        }
    }

    /// The same request with `flags`.
    pub fn with_flags(self, flags: SendFlags) -> SendWr {
        SendWr { flags, ..self }
    }
}

/// A receive work request: a buffer for one incoming Send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// The consumer's id, returned in the completion.
    pub wr_id: u64,
    /// Where the message goes, in order.
    pub sges: SgeList,
}

/// Why a post was refused outright (the `ibv_post_*` error return; the
/// request was not queued and produces no completion).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PostError {
    /// The queue is full (ENOMEM).
    QueueFull,
    /// More SGEs than the queue was created for (EINVAL).
    TooManySges,
    /// Malformed for its operation: a Read with more than one SGE, SGEs on a
    /// local memory operation, a total length over 32 bits (EINVAL).
    InvalidWr,
    /// The queue pair's state does not take posts (Closing, Terminate).
    InvalidState,
    /// Receives go to the shared receive queue of this queue pair.
    SrqAttached,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sge_list_bounds_and_total() {
        let sge = Sge {
            addr: 0,
            length: u32::MAX,
            lkey: Stag(0x100),
        };
        assert!(SgeList::new(&[sge; MAX_SGE + 1]).is_none());
        let two = SgeList::new(&[sge, Sge { length: 1, ..sge }]).unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two.total_len(), None);
        assert_eq!(
            SgeList::single(Sge { length: 5, ..sge }).total_len(),
            Some(5)
        );
        assert_eq!(SgeList::empty().total_len(), Some(0));
        assert!(SendFlags::SIGNALED | SendFlags::FENCE == SendFlags(5));
    }
}
