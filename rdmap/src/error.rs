//! Terminate causes: the (layer, error type, error code) triples of RFC 5040,
//! 5041, 5044 and 6581.
//!
//! When the receive path finds a fault it cannot recover from, the queue
//! pair records a [`TerminateCause`] (the first one recorded wins), sends
//! it to the peer in a Terminate message ([`crate::wire::terminate`]) and
//! moves to the error state. A cause is three small numbers that map
//! one-to-one to the first two bytes of the Terminate Control field, so it
//! is a plain `Copy` value and not an error hierarchy.
//!
//! Where the numbers come from:
//! - layer 0, RDMAP: RFC 5040 §4.8 (Terminate Header, Error Code table);
//! - layer 1, DDP: RFC 5041 §7.2 (DDP Error Numbers);
//! - layer 2, the LLP, here MPA: RFC 5044 §8 for codes 1–4 and
//!   RFC 6581 (enhanced connection setup) for codes 5–7.
//!
//! All of them are also listed in the IANA "Remote Direct Data Placement"
//! registries that RFC 6580 created. [`ALL`] is that table with, for each
//! row, the condition that raises it in this implementation.

use core::fmt;

/// The protocol layer that detected the error: the Terminate Control
/// field's 4-bit Layer (RFC 5040 §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Layer {
    /// RDMAP, RFC 5040.
    Rdmap = 0,
    /// DDP, RFC 5041.
    Ddp = 1,
    /// The lower-layer protocol under DDP; for iWARP over TCP that is MPA
    /// (RFC 5044, RFC 6581).
    Llp = 2,
}

impl Layer {
    /// The layer for a 4-bit wire value; values 3–15 are not assigned.
    pub const fn from_u4(value: u8) -> Option<Layer> {
        match value {
            0 => Some(Layer::Rdmap),
            1 => Some(Layer::Ddp),
            2 => Some(Layer::Llp),
            _ => None,
        }
    }

    /// The 4-bit wire value.
    pub const fn as_u4(self) -> u8 {
        self as u8
    }
}

/// One Terminate cause: layer, error type (4 bits on the wire) and error
/// code (8 bits).
///
/// The fields are public so that a received Terminate carrying a triple no
/// RFC defines (a vendor's private code) can still be represented and
/// reported; [`TerminateCause::is_defined`] says whether it is one of
/// [`ALL`]. `etype` is masked to 4 bits by [`TerminateCause::new`] and on
/// emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateCause {
    /// Layer that detected the error.
    pub layer: Layer,
    /// Error type within the layer (0–15).
    pub etype: u8,
    /// Error code within the error type.
    pub ecode: u8,
}

/// RDMAP error types (RFC 5040 §4.8).
pub mod rdmap_etype {
    /// Local Catastrophic Error.
    pub const LOCAL_CATASTROPHIC: u8 = 0x0;
    /// Remote Protection Error.
    pub const REMOTE_PROTECTION: u8 = 0x1;
    /// Remote Operation Error.
    pub const REMOTE_OPERATION: u8 = 0x2;
}

/// DDP error types (RFC 5041 §7.2).
pub mod ddp_etype {
    /// Local Catastrophic Error.
    pub const LOCAL_CATASTROPHIC: u8 = 0x0;
    /// Tagged Buffer Error.
    pub const TAGGED_BUFFER: u8 = 0x1;
    /// Untagged Buffer Error.
    pub const UNTAGGED_BUFFER: u8 = 0x2;
    /// Reserved by RFC 5041 for use by the LLP. Intel's RNICs (and their
    /// predecessors) send MPA errors as layer 2 with this error type
    /// rather than 0; see [`super::TerminateCause::is_recognised`].
    pub const RESERVED_FOR_LLP: u8 = 0x3;
}

/// MPA error types (RFC 5044 §8): MPA defines a single one.
pub mod mpa_etype {
    /// MPA Error.
    pub const MPA: u8 = 0x0;
}

impl TerminateCause {
    /// A cause from its three numbers; `etype` keeps its low 4 bits.
    pub const fn new(layer: Layer, etype: u8, ecode: u8) -> TerminateCause {
        TerminateCause {
            layer,
            etype: etype & 0x0F,
            ecode,
        }
    }

    // ---- RDMAP, layer 0 (RFC 5040 §4.8) --------------------------------

    /// RFC 5040 §4.8, 0/0/any: Local Catastrophic Error. The local RDMAP
    /// implementation failed in a way that is no fault of the peer. RFC 5040
    /// registers the whole error type ("ALL" codes); we send code 0x00 and
    /// accept any code on receipt.
    pub const RDMAP_LOCAL_CATASTROPHIC: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::LOCAL_CATASTROPHIC, 0x00);
    /// RFC 5040 §4.8, 0/1/0x00: Remote Protection Error, Invalid STag. The
    /// Data Source STag of an incoming RDMA Read Request is not valid.
    pub const RDMAP_PROT_INVALID_STAG: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_PROTECTION, 0x00);
    /// RFC 5040 §4.8, 0/1/0x01: Remote Protection Error, Base or bounds
    /// violation. An RDMA Read Request reaches outside its source region.
    pub const RDMAP_PROT_BASE_BOUNDS: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_PROTECTION, 0x01);
    /// RFC 5040 §4.8, 0/1/0x02: Remote Protection Error, Access rights
    /// violation. The region lacks the remote access right the operation
    /// needs.
    pub const RDMAP_PROT_ACCESS_RIGHTS: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_PROTECTION, 0x02);
    /// RFC 5040 §4.8, 0/1/0x03: Remote Protection Error, STag not
    /// associated with RDMAP Stream. The STag belongs to another protection
    /// domain.
    pub const RDMAP_PROT_STAG_NOT_ASSOCIATED: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_PROTECTION, 0x03);
    /// RFC 5040 §4.8, 0/1/0x04: Remote Protection Error, TO wrap. Source TO
    /// plus Read size passes 2^64.
    pub const RDMAP_PROT_TO_WRAP: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_PROTECTION, 0x04);
    /// RFC 5040 §4.8, 0/1/0x09: Remote Protection Error, STag cannot be
    /// invalidated. A Send with Invalidate names an STag this stream may not
    /// invalidate.
    pub const RDMAP_PROT_CANNOT_INVALIDATE: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_PROTECTION, 0x09);
    /// RFC 5040 §4.8, 0/1/0xFF: Remote Protection Error, Unspecified.
    pub const RDMAP_PROT_UNSPECIFIED: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_PROTECTION, 0xFF);
    /// RFC 5040 §4.8, 0/2/0x05: Remote Operation Error, Invalid RDMAP
    /// version. The RDMAP Control Field's RV is not 1.
    pub const RDMAP_OP_INVALID_VERSION: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_OPERATION, 0x05);
    /// RFC 5040 §4.8, 0/2/0x06: Remote Operation Error, Unexpected OpCode.
    pub const RDMAP_OP_UNEXPECTED_OPCODE: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_OPERATION, 0x06);
    /// RFC 5040 §4.8, 0/2/0x07: Remote Operation Error, Catastrophic error,
    /// localized to RDMAP Stream.
    pub const RDMAP_OP_CATASTROPHIC_STREAM: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_OPERATION, 0x07);
    /// RFC 5040 §4.8, 0/2/0x08: Remote Operation Error, Catastrophic error,
    /// global.
    pub const RDMAP_OP_CATASTROPHIC_GLOBAL: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_OPERATION, 0x08);
    /// RFC 5040 §4.8, 0/2/0x09: Remote Operation Error, STag cannot be
    /// invalidated.
    pub const RDMAP_OP_CANNOT_INVALIDATE: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_OPERATION, 0x09);
    /// RFC 5040 §4.8, 0/2/0xFF: Remote Operation Error, Unspecified.
    pub const RDMAP_OP_UNSPECIFIED: TerminateCause =
        TerminateCause::new(Layer::Rdmap, rdmap_etype::REMOTE_OPERATION, 0xFF);

    // ---- DDP, layer 1 (RFC 5041 §7.2) ----------------------------------

    /// RFC 5041 §7.2, 1/0/0x00: Local Catastrophic error in DDP.
    pub const DDP_LOCAL_CATASTROPHIC: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::LOCAL_CATASTROPHIC, 0x00);
    /// RFC 5041 §7.2, 1/1/0x00: Tagged Buffer Error, Invalid STag.
    pub const DDP_TAGGED_INVALID_STAG: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::TAGGED_BUFFER, 0x00);
    /// RFC 5041 §7.2, 1/1/0x01: Tagged Buffer Error, Base or bounds
    /// violation.
    pub const DDP_TAGGED_BASE_BOUNDS: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::TAGGED_BUFFER, 0x01);
    /// RFC 5041 §7.2, 1/1/0x02: Tagged Buffer Error, STag not associated
    /// with DDP Stream.
    pub const DDP_TAGGED_STAG_NOT_ASSOCIATED: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::TAGGED_BUFFER, 0x02);
    /// RFC 5041 §7.2, 1/1/0x03: Tagged Buffer Error, TO wrap.
    pub const DDP_TAGGED_TO_WRAP: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::TAGGED_BUFFER, 0x03);
    /// RFC 5041 §7.2, 1/1/0x04: Tagged Buffer Error, Invalid DDP version.
    pub const DDP_TAGGED_INVALID_VERSION: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::TAGGED_BUFFER, 0x04);
    /// RFC 5041 §7.2, 1/2/0x01: Untagged Buffer Error, Invalid QN.
    pub const DDP_UNTAGGED_INVALID_QN: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::UNTAGGED_BUFFER, 0x01);
    /// RFC 5041 §7.2, 1/2/0x02: Untagged Buffer Error, Invalid MSN, no
    /// buffer available.
    pub const DDP_UNTAGGED_NO_BUFFER: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::UNTAGGED_BUFFER, 0x02);
    /// RFC 5041 §7.2, 1/2/0x03: Untagged Buffer Error, Invalid MSN, MSN
    /// range is not valid.
    pub const DDP_UNTAGGED_MSN_RANGE: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::UNTAGGED_BUFFER, 0x03);
    /// RFC 5041 §7.2, 1/2/0x04: Untagged Buffer Error, Invalid MO.
    pub const DDP_UNTAGGED_INVALID_MO: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::UNTAGGED_BUFFER, 0x04);
    /// RFC 5041 §7.2, 1/2/0x05: Untagged Buffer Error, DDP Message too long
    /// for available buffer.
    pub const DDP_UNTAGGED_TOO_LONG: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::UNTAGGED_BUFFER, 0x05);
    /// RFC 5041 §7.2, 1/2/0x06: Untagged Buffer Error, Invalid DDP version.
    pub const DDP_UNTAGGED_INVALID_VERSION: TerminateCause =
        TerminateCause::new(Layer::Ddp, ddp_etype::UNTAGGED_BUFFER, 0x06);

    // ---- MPA, layer 2 (RFC 5044 §8, RFC 6581) -----------------------

    /// RFC 5044 §8, 2/0/0x01: TCP connection closed, terminated or lost.
    pub const MPA_TCP_CLOSED: TerminateCause =
        TerminateCause::new(Layer::Llp, mpa_etype::MPA, 0x01);
    /// RFC 5044 §8, 2/0/0x02: MPA CRC error.
    pub const MPA_CRC: TerminateCause = TerminateCause::new(Layer::Llp, mpa_etype::MPA, 0x02);
    /// RFC 5044 §8, 2/0/0x03: MPA Marker and ULPDU Length field mismatch.
    pub const MPA_MARKER_MISMATCH: TerminateCause =
        TerminateCause::new(Layer::Llp, mpa_etype::MPA, 0x03);
    /// RFC 5044 §8, 2/0/0x04: Invalid MPA Request Frame or MPA Response
    /// Frame.
    pub const MPA_INVALID_REQUEST_REPLY: TerminateCause =
        TerminateCause::new(Layer::Llp, mpa_etype::MPA, 0x04);
    /// RFC 6581, 2/0/0x05: Local catastrophic error (MPA).
    pub const MPA_LOCAL_CATASTROPHIC: TerminateCause =
        TerminateCause::new(Layer::Llp, mpa_etype::MPA, 0x05);
    /// RFC 6581, 2/0/0x06: Insufficient IRD resources.
    pub const MPA_INSUFFICIENT_IRD: TerminateCause =
        TerminateCause::new(Layer::Llp, mpa_etype::MPA, 0x06);
    /// RFC 6581, 2/0/0x07: No matching RTR option.
    pub const MPA_NO_MATCHING_RTR: TerminateCause =
        TerminateCause::new(Layer::Llp, mpa_etype::MPA, 0x07);

    /// Whether this exact triple is one the RFCs define (a row of [`ALL`]),
    /// counting every code of RDMAP Local Catastrophic Error, which RFC 5040
    /// registers as a whole.
    pub fn is_defined(self) -> bool {
        if self.layer == Layer::Rdmap && self.etype == rdmap_etype::LOCAL_CATASTROPHIC {
            return true;
        }
        ALL.iter().any(|(c, _)| *c == self)
    }

    /// Whether a receiver should take this triple as meaningful: a defined
    /// one, or an MPA error code sent with error type 3 ("reserved for the
    /// LLP" in RFC 5041), which is how Intel's RNICs (nes, i40iw, irdma)
    /// report MPA errors. Used to tell the two Terminate layouts apart.
    pub fn is_recognised(self) -> bool {
        self.is_defined()
            || (self.layer == Layer::Llp
                && self.etype == ddp_etype::RESERVED_FOR_LLP
                && TerminateCause::new(Layer::Llp, mpa_etype::MPA, self.ecode).is_defined())
    }

    /// Whether a Terminate for this cause reports the offending segment: the
    /// DDP Segment Length (M), the DDP header (D) and, for an RDMA Read
    /// Request, the RDMA header (R) (RFC 5040 §4.8).
    ///
    /// True for errors found in an incoming DDP segment whose header could
    /// be read: DDP tagged and untagged buffer errors, RDMAP remote
    /// protection errors, and RDMAP remote operation errors other than the
    /// global catastrophic one. False for local and global catastrophic
    /// errors (no segment is at fault), for the two Invalid DDP version
    /// codes (the rest of the header has no known layout) and for MPA
    /// errors (the segment is untrustworthy or there is none).
    pub fn reports_segment(self) -> bool {
        match self.layer {
            Layer::Rdmap => match self.etype {
                rdmap_etype::REMOTE_PROTECTION => true,
                rdmap_etype::REMOTE_OPERATION => {
                    self != TerminateCause::RDMAP_OP_CATASTROPHIC_GLOBAL
                }
                _ => false,
            },
            Layer::Ddp => {
                (self.etype == ddp_etype::TAGGED_BUFFER || self.etype == ddp_etype::UNTAGGED_BUFFER)
                    && self != TerminateCause::DDP_TAGGED_INVALID_VERSION
                    && self != TerminateCause::DDP_UNTAGGED_INVALID_VERSION
            }
            Layer::Llp => false,
        }
    }

    /// The RFC's name for this triple, or `None` if no RFC defines it.
    pub fn name(self) -> Option<&'static str> {
        let c = TerminateCause::new(self.layer, self.etype, self.ecode);
        let name = match c {
            _ if c.layer == Layer::Rdmap && c.etype == rdmap_etype::LOCAL_CATASTROPHIC => {
                "RDMAP local catastrophic error"
            }
            TerminateCause::RDMAP_PROT_INVALID_STAG => "RDMAP remote protection: invalid STag",
            TerminateCause::RDMAP_PROT_BASE_BOUNDS => {
                "RDMAP remote protection: base or bounds violation"
            }
            TerminateCause::RDMAP_PROT_ACCESS_RIGHTS => {
                "RDMAP remote protection: access rights violation"
            }
            TerminateCause::RDMAP_PROT_STAG_NOT_ASSOCIATED => {
                "RDMAP remote protection: STag not associated with RDMAP stream"
            }
            TerminateCause::RDMAP_PROT_TO_WRAP => "RDMAP remote protection: TO wrap",
            TerminateCause::RDMAP_PROT_CANNOT_INVALIDATE => {
                "RDMAP remote protection: STag cannot be invalidated"
            }
            TerminateCause::RDMAP_PROT_UNSPECIFIED => "RDMAP remote protection: unspecified",
            TerminateCause::RDMAP_OP_INVALID_VERSION => {
                "RDMAP remote operation: invalid RDMAP version"
            }
            TerminateCause::RDMAP_OP_UNEXPECTED_OPCODE => {
                "RDMAP remote operation: unexpected opcode"
            }
            TerminateCause::RDMAP_OP_CATASTROPHIC_STREAM => {
                "RDMAP remote operation: catastrophic error, localized to RDMAP stream"
            }
            TerminateCause::RDMAP_OP_CATASTROPHIC_GLOBAL => {
                "RDMAP remote operation: catastrophic error, global"
            }
            TerminateCause::RDMAP_OP_CANNOT_INVALIDATE => {
                "RDMAP remote operation: STag cannot be invalidated"
            }
            TerminateCause::RDMAP_OP_UNSPECIFIED => "RDMAP remote operation: unspecified",
            TerminateCause::DDP_LOCAL_CATASTROPHIC => "DDP local catastrophic error",
            TerminateCause::DDP_TAGGED_INVALID_STAG => "DDP tagged buffer: invalid STag",
            TerminateCause::DDP_TAGGED_BASE_BOUNDS => "DDP tagged buffer: base or bounds violation",
            TerminateCause::DDP_TAGGED_STAG_NOT_ASSOCIATED => {
                "DDP tagged buffer: STag not associated with DDP stream"
            }
            TerminateCause::DDP_TAGGED_TO_WRAP => "DDP tagged buffer: TO wrap",
            TerminateCause::DDP_TAGGED_INVALID_VERSION => "DDP tagged buffer: invalid DDP version",
            TerminateCause::DDP_UNTAGGED_INVALID_QN => "DDP untagged buffer: invalid QN",
            TerminateCause::DDP_UNTAGGED_NO_BUFFER => {
                "DDP untagged buffer: invalid MSN, no buffer available"
            }
            TerminateCause::DDP_UNTAGGED_MSN_RANGE => {
                "DDP untagged buffer: invalid MSN, MSN range is not valid"
            }
            TerminateCause::DDP_UNTAGGED_INVALID_MO => "DDP untagged buffer: invalid MO",
            TerminateCause::DDP_UNTAGGED_TOO_LONG => {
                "DDP untagged buffer: DDP message too long for available buffer"
            }
            TerminateCause::DDP_UNTAGGED_INVALID_VERSION => {
                "DDP untagged buffer: invalid DDP version"
            }
            TerminateCause::MPA_TCP_CLOSED => "MPA: TCP connection closed, terminated or lost",
            TerminateCause::MPA_CRC => "MPA: CRC error",
            TerminateCause::MPA_MARKER_MISMATCH => "MPA: marker and ULPDU length field mismatch",
            TerminateCause::MPA_INVALID_REQUEST_REPLY => {
                "MPA: invalid MPA request frame or MPA response frame"
            }
            TerminateCause::MPA_LOCAL_CATASTROPHIC => "MPA: local catastrophic error",
            TerminateCause::MPA_INSUFFICIENT_IRD => "MPA: insufficient IRD resources",
            TerminateCause::MPA_NO_MATCHING_RTR => "MPA: no matching RTR option",
            _ => return None,
        };
        Some(name)
    }

    /// The condition that raises this cause here (the [`ALL`] row), or
    /// `None` for an undefined triple. Every RDMAP Local Catastrophic code
    /// maps to the row of code 0x00.
    pub fn condition(self) -> Option<&'static str> {
        let key = if self.layer == Layer::Rdmap && self.etype == rdmap_etype::LOCAL_CATASTROPHIC {
            TerminateCause::RDMAP_LOCAL_CATASTROPHIC
        } else {
            TerminateCause::new(self.layer, self.etype, self.ecode)
        };
        ALL.iter().find(|(c, _)| *c == key).map(|(_, cond)| *cond)
    }
}

impl fmt::Display for TerminateCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name)?,
            None => f.write_str("undefined Terminate cause")?,
        }
        write!(
            f,
            " ({}/{}/0x{:02x})",
            self.layer.as_u4(),
            self.etype & 0x0F,
            self.ecode
        )
    }
}

/// Every (layer, etype, ecode) triple that RFC 5040, RFC 5041, RFC 5044 and
/// RFC 6581 define, each with the condition that raises it in this
/// implementation. The receive-path tests provoke each row; the Terminate
/// table tests check each row's bytes on the wire.
pub const ALL: &[(TerminateCause, &str)] = &[
    (
        TerminateCause::RDMAP_LOCAL_CATASTROPHIC,
        "The local RDMAP implementation failed in a way that is no fault of the peer \
         (an internal invariant broke, a local resource was lost); any error code of this \
         type means the same, 0x00 is sent.",
    ),
    (
        TerminateCause::RDMAP_PROT_INVALID_STAG,
        "An RDMA Read Request names a Data Source STag that is not valid: unknown index, \
         wrong key, or already invalidated.",
    ),
    (
        TerminateCause::RDMAP_PROT_BASE_BOUNDS,
        "An RDMA Read Request's Data Source TO and RDMA Read Message Size reach outside \
         the region its source STag names.",
    ),
    (
        TerminateCause::RDMAP_PROT_ACCESS_RIGHTS,
        "The region named by an incoming RDMA Read Request (remote read) or RDMA Write \
         (remote write) does not grant that remote access right.",
    ),
    (
        TerminateCause::RDMAP_PROT_STAG_NOT_ASSOCIATED,
        "An RDMA Read Request's source STag is valid but belongs to a protection domain \
         other than this queue pair's.",
    ),
    (
        TerminateCause::RDMAP_PROT_TO_WRAP,
        "An RDMA Read Request's source TO plus its RDMA Read Message Size passes 2^64.",
    ),
    (
        TerminateCause::RDMAP_PROT_CANNOT_INVALIDATE,
        "A Send with Invalidate (or with SE and Invalidate) names an STag this stream may \
         not invalidate: unknown, owned by another protection domain, or a region \
         registered as not invalidatable. Invalidating an STag that is already invalid \
         succeeds, as the verbs specification and siw have it.",
    ),
    (
        TerminateCause::RDMAP_PROT_UNSPECIFIED,
        "A protection violation by an incoming RDMAP message that no more specific remote \
         protection code describes.",
    ),
    (
        TerminateCause::RDMAP_OP_INVALID_VERSION,
        "An incoming RDMAP Control Field carries an RDMAP Version (RV) other than 1.",
    ),
    (
        TerminateCause::RDMAP_OP_UNEXPECTED_OPCODE,
        "An incoming message carries an opcode outside RFC 5040's eight (RFC 7306 \
         extensions are not supported), a known opcode in the wrong buffer model or on \
         another RDMAP queue number than its own, or a Read Response with no RDMA Read \
         outstanding.",
    ),
    (
        TerminateCause::RDMAP_OP_CATASTROPHIC_STREAM,
        "The peer broke this stream so that it cannot continue and no more specific code \
         applies: a DDP segment shorter than its own header, an RDMA Read Request or \
         Terminate payload cut short.",
    ),
    (
        TerminateCause::RDMAP_OP_CATASTROPHIC_GLOBAL,
        "A fault that stops every stream of this RNIC, not only this one (the dataplane \
         worker is shutting down on an internal error).",
    ),
    (
        TerminateCause::RDMAP_OP_CANNOT_INVALIDATE,
        "A Send with Invalidate names a valid STag of this stream that may not be \
         invalidated remotely (its region forbids remote invalidation, or memory windows \
         are still bound to it).",
    ),
    (
        TerminateCause::RDMAP_OP_UNSPECIFIED,
        "An error in an incoming RDMAP message that no more specific remote operation code \
         describes.",
    ),
    (
        TerminateCause::DDP_LOCAL_CATASTROPHIC,
        "The local DDP implementation failed in a way that is no fault of the peer \
         (placement into a registered region failed locally).",
    ),
    (
        TerminateCause::DDP_TAGGED_INVALID_STAG,
        "A tagged segment (RDMA Write or Read Response) names an STag that is not valid: \
         unknown index, wrong key, or invalidated.",
    ),
    (
        TerminateCause::DDP_TAGGED_BASE_BOUNDS,
        "A tagged segment's TO and payload length reach outside the region its STag \
         names; checked before any byte is placed.",
    ),
    (
        TerminateCause::DDP_TAGGED_STAG_NOT_ASSOCIATED,
        "A tagged segment's STag is valid but belongs to a protection domain other than \
         this queue pair's.",
    ),
    (
        TerminateCause::DDP_TAGGED_TO_WRAP,
        "A tagged segment's TO plus its payload length passes 2^64.",
    ),
    (
        TerminateCause::DDP_TAGGED_INVALID_VERSION,
        "A tagged segment carries a DDP Version (DV) other than 1.",
    ),
    (
        TerminateCause::DDP_UNTAGGED_INVALID_QN,
        "An untagged segment names a Queue Number RDMAP does not use (only 0 for Sends, \
         1 for RDMA Read Requests and 2 for Terminate exist).",
    ),
    (
        TerminateCause::DDP_UNTAGGED_NO_BUFFER,
        "An untagged segment starts a message for which no buffer is available: no \
         receive posted (and the shared receive queue is empty) for a Send, or an RDMA \
         Read Request beyond the negotiated IRD on queue 1.",
    ),
    (
        TerminateCause::DDP_UNTAGGED_MSN_RANGE,
        "An untagged segment's MSN is outside the window of messages this queue can take: \
         one already completed, or further ahead than the buffers posted.",
    ),
    (
        TerminateCause::DDP_UNTAGGED_INVALID_MO,
        "An untagged segment's MO lies beyond the end of the buffer its message was \
         given.",
    ),
    (
        TerminateCause::DDP_UNTAGGED_TOO_LONG,
        "An untagged message (MO plus payload length of a segment) is longer than the \
         receive buffer posted for it.",
    ),
    (
        TerminateCause::DDP_UNTAGGED_INVALID_VERSION,
        "An untagged segment carries a DDP Version (DV) other than 1.",
    ),
    (
        TerminateCause::MPA_TCP_CLOSED,
        "The TCP connection under the stream was closed, reset or lost while the queue \
         pair was in RTS; reported locally, as no Terminate can reach the peer.",
    ),
    (
        TerminateCause::MPA_CRC,
        "An FPDU's CRC32c does not match its contents while CRCs are in use.",
    ),
    (
        TerminateCause::MPA_MARKER_MISMATCH,
        "With markers in use, a marker does not point at the start of the FPDU it \
         belongs to, or disagrees with that FPDU's ULPDU Length.",
    ),
    (
        TerminateCause::MPA_INVALID_REQUEST_REPLY,
        "An MPA Request or Reply frame is malformed: wrong key, unsupported revision, \
         reserved bits or a private data length over the limit.",
    ),
    (
        TerminateCause::MPA_LOCAL_CATASTROPHIC,
        "MPA connection setup failed locally, no fault of the peer (RFC 6581).",
    ),
    (
        TerminateCause::MPA_INSUFFICIENT_IRD,
        "The IRD/ORD the peer asked for or returned cannot be met, and this side will not \
         continue with lower values (RFC 6581).",
    ),
    (
        TerminateCause::MPA_NO_MATCHING_RTR,
        "In peer-to-peer mode no ready-to-receive message type is offered by one side \
         and supported by the other, or the RTR received is not the one negotiated \
         (RFC 6581).",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_every_rfc_row_once() {
        // 14 RDMAP + 12 DDP + 7 MPA rows.
        assert_eq!(ALL.len(), 33);
        for (i, (a, _)) in ALL.iter().enumerate() {
            for (b, _) in &ALL[i + 1..] {
                assert_ne!(a, b, "duplicate row {a}");
            }
        }
        let count = |l| ALL.iter().filter(|(c, _)| c.layer == l).count();
        assert_eq!(count(Layer::Rdmap), 14);
        assert_eq!(count(Layer::Ddp), 12);
        assert_eq!(count(Layer::Llp), 7);
    }

    #[test]
    fn every_row_is_named_and_conditioned() {
        for (c, cond) in ALL {
            assert!(c.is_defined());
            assert!(c.name().is_some(), "{c:?} has no name");
            assert_eq!(c.condition(), Some(*cond));
            assert!(c.etype <= 0x0F);
        }
    }

    #[test]
    fn local_catastrophic_takes_any_code() {
        let c = TerminateCause::new(Layer::Rdmap, 0, 0x42);
        assert!(c.is_defined());
        assert_eq!(c.name(), Some("RDMAP local catastrophic error"));
        assert_eq!(
            c.condition(),
            TerminateCause::RDMAP_LOCAL_CATASTROPHIC.condition()
        );
        // Only for RDMAP: DDP's local catastrophic is code 0x00 alone.
        assert!(!TerminateCause::new(Layer::Ddp, 0, 0x42).is_defined());
    }

    #[test]
    fn undefined_triples() {
        for c in [
            TerminateCause::new(Layer::Rdmap, 1, 0x05),
            TerminateCause::new(Layer::Rdmap, 2, 0x02),
            TerminateCause::new(Layer::Ddp, 2, 0x00),
            TerminateCause::new(Layer::Ddp, 3, 0x02),
            TerminateCause::new(Layer::Llp, 0, 0x00),
            TerminateCause::new(Layer::Llp, 0, 0x08),
            TerminateCause::new(Layer::Llp, 1, 0x02),
        ] {
            assert!(!c.is_defined(), "{c:?}");
            assert_eq!(c.name(), None);
            assert_eq!(c.condition(), None);
        }
    }

    #[test]
    fn intel_mpa_etype_is_recognised_not_defined() {
        let c = TerminateCause::new(Layer::Llp, ddp_etype::RESERVED_FOR_LLP, 0x02);
        assert!(!c.is_defined());
        assert!(c.is_recognised());
        assert!(!TerminateCause::new(Layer::Llp, 3, 0x09).is_recognised());
    }

    #[test]
    fn etype_is_four_bits() {
        assert_eq!(TerminateCause::new(Layer::Ddp, 0x12, 1).etype, 0x02);
    }

    #[test]
    fn segment_reporting_policy() {
        let reports: Vec<_> = ALL.iter().filter(|(c, _)| c.reports_segment()).collect();
        // 7 protection + 5 operation (not global) + 4 tagged + 5 untagged.
        assert_eq!(reports.len(), 21);
        assert!(!TerminateCause::MPA_CRC.reports_segment());
        assert!(!TerminateCause::DDP_TAGGED_INVALID_VERSION.reports_segment());
        assert!(TerminateCause::RDMAP_OP_INVALID_VERSION.reports_segment());
        assert!(!TerminateCause::RDMAP_OP_CATASTROPHIC_GLOBAL.reports_segment());
    }

    #[test]
    fn display_names_and_numbers() {
        assert_eq!(
            TerminateCause::DDP_TAGGED_BASE_BOUNDS.to_string(),
            "DDP tagged buffer: base or bounds violation (1/1/0x01)"
        );
        assert_eq!(
            TerminateCause::new(Layer::Llp, 5, 0x99).to_string(),
            "undefined Terminate cause (2/5/0x99)"
        );
    }

    #[test]
    fn layer_nibbles() {
        for v in 0..16u8 {
            match Layer::from_u4(v) {
                Some(l) => assert_eq!(l.as_u4(), v),
                None => assert!(v > 2),
            }
        }
    }
}
