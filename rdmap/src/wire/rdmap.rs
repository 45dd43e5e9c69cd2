//! RDMAP opcodes and the RDMA Read Request header (RFC 5040 §4.1–§4.4).
//!
//! RDMAP rides in DDP: its Control Field is the DDP header's second byte
//! (see [`super::ddp`]), and two messages carry more header after the DDP
//! header: the RDMA Read Request (this module) and the Terminate
//! ([`super::terminate`]). The receive path reads the opcode to pick the
//! message handler; a Read Request's 28 bytes describe which local region
//! the Read Response comes from and where it lands on the peer.

use super::{Result, WireError};

/// The RDMAP version this implementation speaks (RFC 5040 §4.1: RV = 01b).
pub const RDMAP_VERSION: u8 = 1;

/// RDMA message opcodes (RFC 5040 §4.2), the low 4 bits of the RDMAP
/// Control Field.
///
/// Values 0x8 and up are not in RFC 5040; RFC 7306 later assigned some of
/// them (Immediate Data, Atomic operations). This implementation does not
/// support those extensions, so they parse as
/// [`WireError::UnknownOpcode`], which a receiver answers with Remote
/// Operation Error / Unexpected OpCode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum RdmapOpcode {
    /// RDMA Write: tagged, placed at (STag, TO) on the peer.
    RdmaWrite = 0x0,
    /// RDMA Read Request: untagged on queue 1, a 28-byte header.
    ReadRequest = 0x1,
    /// RDMA Read Response: tagged, placed at the Read Request's sink.
    ReadResponse = 0x2,
    /// Send: untagged on queue 0.
    Send = 0x3,
    /// Send with Invalidate: a Send that also invalidates the STag in the
    /// DDP header's reserved ULP field.
    SendInvalidate = 0x4,
    /// Send with Solicited Event.
    SendSe = 0x5,
    /// Send with Solicited Event and Invalidate.
    SendSeInvalidate = 0x6,
    /// Terminate: untagged on queue 2, reports a fatal error.
    Terminate = 0x7,
}

impl RdmapOpcode {
    /// Every opcode, in wire order.
    pub const ALL: [RdmapOpcode; 8] = [
        RdmapOpcode::RdmaWrite,
        RdmapOpcode::ReadRequest,
        RdmapOpcode::ReadResponse,
        RdmapOpcode::Send,
        RdmapOpcode::SendInvalidate,
        RdmapOpcode::SendSe,
        RdmapOpcode::SendSeInvalidate,
        RdmapOpcode::Terminate,
    ];

    /// The opcode for a 4-bit wire value.
    pub const fn from_u4(value: u8) -> Option<RdmapOpcode> {
        Some(match value {
            0x0 => RdmapOpcode::RdmaWrite,
            0x1 => RdmapOpcode::ReadRequest,
            0x2 => RdmapOpcode::ReadResponse,
            0x3 => RdmapOpcode::Send,
            0x4 => RdmapOpcode::SendInvalidate,
            0x5 => RdmapOpcode::SendSe,
            0x6 => RdmapOpcode::SendSeInvalidate,
            0x7 => RdmapOpcode::Terminate,
            _ => return None,
        })
    }

    /// The 4-bit wire value.
    pub const fn as_u4(self) -> u8 {
        self as u8
    }

    /// Whether the message uses DDP's tagged buffer model (RFC 5040 §4.2:
    /// RDMA Write and Read Response; everything else is untagged).
    pub const fn is_tagged(self) -> bool {
        matches!(self, RdmapOpcode::RdmaWrite | RdmapOpcode::ReadResponse)
    }

    /// The DDP queue number an untagged opcode travels on (RFC 5040 §5:
    /// 0 for the Send family, 1 for RDMA Read Requests, 2 for Terminate),
    /// or `None` for a tagged one.
    pub const fn queue_number(self) -> Option<u32> {
        match self {
            RdmapOpcode::RdmaWrite | RdmapOpcode::ReadResponse => None,
            RdmapOpcode::ReadRequest => Some(QN_READ_REQUEST),
            RdmapOpcode::Terminate => Some(QN_TERMINATE),
            RdmapOpcode::Send
            | RdmapOpcode::SendInvalidate
            | RdmapOpcode::SendSe
            | RdmapOpcode::SendSeInvalidate => Some(QN_SEND),
        }
    }

    /// Whether the message carries an STag to invalidate in the DDP
    /// header's reserved ULP field (RFC 5040 §4.1).
    pub const fn carries_invalidate_stag(self) -> bool {
        matches!(
            self,
            RdmapOpcode::SendInvalidate | RdmapOpcode::SendSeInvalidate
        )
    }

    /// Whether the message asks for a solicited event at the receiver.
    pub const fn solicited_event(self) -> bool {
        matches!(self, RdmapOpcode::SendSe | RdmapOpcode::SendSeInvalidate)
    }

    /// Whether the message is one of the four Send variants.
    pub const fn is_send(self) -> bool {
        matches!(
            self,
            RdmapOpcode::Send
                | RdmapOpcode::SendInvalidate
                | RdmapOpcode::SendSe
                | RdmapOpcode::SendSeInvalidate
        )
    }
}

/// Queue number of the Send family (RFC 5040 §5).
pub const QN_SEND: u32 = 0;
/// Queue number of RDMA Read Requests (RFC 5040 §5).
pub const QN_READ_REQUEST: u32 = 1;
/// Queue number of Terminate messages (RFC 5040 §5).
pub const QN_TERMINATE: u32 = 2;

mod field {
    use core::ops::Range;
    pub const SINK_STAG: Range<usize> = 0..4;
    pub const SINK_TO: Range<usize> = 4..12;
    pub const SIZE: Range<usize> = 12..16;
    pub const SRC_STAG: Range<usize> = 16..20;
    pub const SRC_TO: Range<usize> = 20..28;
}

/// Length of the RDMA Read Request header (RFC 5040 §4.4).
pub const READ_REQUEST_LEN: usize = 28;

/// A view of the RDMA Read Request header, the 28 bytes after the untagged
/// DDP header of an RDMA Read Request (RFC 5040 §4.4).
#[derive(Debug, Clone)]
pub struct ReadRequestPacket<T: AsRef<[u8]>> {
    buffer: T,
}

fn be32(b: &[u8], r: core::ops::Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8], r: core::ops::Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_be_bytes(a)
}

impl<T: AsRef<[u8]>> ReadRequestPacket<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> ReadRequestPacket<T> {
        ReadRequestPacket { buffer }
    }

    /// Wraps a buffer of at least [`READ_REQUEST_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<ReadRequestPacket<T>> {
        let p = ReadRequestPacket::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Fails with [`WireError::Truncated`] if the buffer is too short.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < READ_REQUEST_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Data Sink STag: where the Read Response lands (the requester's
    /// region).
    pub fn sink_stag(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SINK_STAG)
    }

    /// Data Sink Tagged Offset.
    pub fn sink_to(&self) -> u64 {
        be64(self.buffer.as_ref(), field::SINK_TO)
    }

    /// RDMA Read Message Size in bytes.
    pub fn read_size(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SIZE)
    }

    /// Data Source STag: the responder's region to read.
    pub fn source_stag(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SRC_STAG)
    }

    /// Data Source Tagged Offset.
    pub fn source_to(&self) -> u64 {
        be64(self.buffer.as_ref(), field::SRC_TO)
    }
}

/// The meaning of an RDMA Read Request header. Every bit pattern is a valid
/// header at this level; whether the STags and ranges are acceptable is
/// the verbs layer's question.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReadRequest {
    /// Data Sink STag (the requester's region, where the response lands).
    pub sink_stag: u32,
    /// Data Sink Tagged Offset.
    pub sink_to: u64,
    /// RDMA Read Message Size.
    pub size: u32,
    /// Data Source STag (the responder's region).
    pub source_stag: u32,
    /// Data Source Tagged Offset.
    pub source_to: u64,
}

impl ReadRequest {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(packet: &ReadRequestPacket<T>) -> ReadRequest {
        ReadRequest {
            sink_stag: packet.sink_stag(),
            sink_to: packet.sink_to(),
            size: packet.read_size(),
            source_stag: packet.source_stag(),
            source_to: packet.source_to(),
        }
    }

    /// Reads the first [`READ_REQUEST_LEN`] bytes of `bytes`.
    pub fn parse_bytes(bytes: &[u8]) -> Result<ReadRequest> {
        Ok(ReadRequest::parse(&ReadRequestPacket::new_checked(bytes)?))
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        READ_REQUEST_LEN
    }

    /// Writes the header into `buf[..28]`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`READ_REQUEST_LEN`], a caller bug.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = &mut buf[..READ_REQUEST_LEN];
        b[field::SINK_STAG].copy_from_slice(&self.sink_stag.to_be_bytes());
        b[field::SINK_TO].copy_from_slice(&self.sink_to.to_be_bytes());
        b[field::SIZE].copy_from_slice(&self.size.to_be_bytes());
        b[field::SRC_STAG].copy_from_slice(&self.source_stag.to_be_bytes());
        b[field::SRC_TO].copy_from_slice(&self.source_to.to_be_bytes());
    }

    /// The header as bytes.
    pub fn to_bytes(&self) -> [u8; READ_REQUEST_LEN] {
        let mut b = [0u8; READ_REQUEST_LEN];
        self.emit(&mut b);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_numbering_is_rfc_5040() {
        for (i, op) in RdmapOpcode::ALL.iter().enumerate() {
            assert_eq!(op.as_u4() as usize, i);
            assert_eq!(RdmapOpcode::from_u4(i as u8), Some(*op));
        }
        for v in 8..16 {
            assert_eq!(RdmapOpcode::from_u4(v), None);
        }
    }

    #[test]
    fn buffer_models_and_queues() {
        use RdmapOpcode::*;
        assert!(RdmaWrite.is_tagged() && ReadResponse.is_tagged());
        for op in [
            ReadRequest,
            Send,
            SendInvalidate,
            SendSe,
            SendSeInvalidate,
            Terminate,
        ] {
            assert!(!op.is_tagged());
        }
        assert_eq!(Send.queue_number(), Some(0));
        assert_eq!(SendSeInvalidate.queue_number(), Some(0));
        assert_eq!(ReadRequest.queue_number(), Some(1));
        assert_eq!(Terminate.queue_number(), Some(2));
        assert_eq!(RdmaWrite.queue_number(), None);
        assert!(SendInvalidate.carries_invalidate_stag() && !SendSe.carries_invalidate_stag());
        assert!(SendSe.solicited_event() && !Send.solicited_event());
        assert!(SendSeInvalidate.is_send() && !Terminate.is_send());
    }

    #[test]
    fn read_request_fields() {
        let bytes: [u8; 28] = [
            0x2b, 0x9d, 0x4f, 0x00, // sink STag
            0x00, 0x00, 0x55, 0x57, 0xc0, 0xeb, 0xed, 0xc0, // sink TO
            0x00, 0x00, 0x00, 0x64, // size
            0xf5, 0x2e, 0x24, 0x00, // source STag
            0x00, 0x00, 0x56, 0x43, 0x78, 0xb7, 0x54, 0x60, // source TO
        ];
        let rr = ReadRequest::parse_bytes(&bytes).unwrap();
        assert_eq!(
            rr,
            ReadRequest {
                sink_stag: 0x2b9d_4f00,
                sink_to: 0x0000_5557_c0eb_edc0,
                size: 100,
                source_stag: 0xf52e_2400,
                source_to: 0x0000_5643_78b7_5460,
            }
        );
        assert_eq!(rr.to_bytes(), bytes);
        assert_eq!(
            ReadRequest::parse_bytes(&bytes[..27]),
            Err(WireError::Truncated)
        );
    }
}
