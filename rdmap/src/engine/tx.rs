//! The send path: work requests, Read Responses, RTRs and Terminates to
//! FPDU records sized to the segment TCP offers (RDMAP RFC 5040 §5, DDP
//! RFC 5041 §4–§5, MPA framing RFC 5044 §4–§6, RTR RFC 6581 §4).
//!
//! Priority, per call: MPA frame bytes; our Terminate (then nothing else);
//! in peer-to-peer mode the RTR (initiator) or the zero-length Read
//! Response a Read RTR asked for (responder); the initiator's nudge of a
//! silent responder, between messages; then Read Responses and the send
//! queue's own messages, alternating FPDU by FPDU.

use super::record::{fpdu_crc, Body, Fpdu, OutRecord, RecordKind, MAX_HEAD_LEN};
use super::rx::stat_index;
use super::{Endpoint, Env};
use crate::error::TerminateCause;
use crate::mpa::fpdu::LENGTH_LEN;
use crate::mpa::rtr::{nudge_ulpdu, read_response_ulpdu, rtr_ulpdu, RTR_STAG};
use crate::mpa::RtrType;
use crate::placement::{Placement, RegionRef};
use crate::verbs::{Access, QpModify, QpState, Stag, WireOp, WrSeq};
use crate::wire::rdmap::READ_REQUEST_LEN;
use crate::wire::{
    DdpRepr, RdmapOpcode, ReadRequest, TerminateMessage, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN,
};

/// What [`Endpoint::next_control_record`] found.
enum Control {
    /// A record to send.
    Record(OutRecord),
    /// Nothing may be sent now.
    Stop,
    /// No control record: data FPDUs may follow.
    Data,
}

/// A send-queue request being put on the wire: what framing needs of it
/// (its SGEs are read where they lie, in the send queue,
/// [`QueuePair::work_sges`]).
///
/// [`QueuePair::work_sges`]: crate::verbs::QueuePair::work_sges
#[derive(Debug, Clone, Copy)]
struct TxWork {
    /// Its position in the send queue.
    seq: WrSeq,
    op: WireOp,
    /// Message length.
    len: u32,
    /// Message bytes framed so far.
    sent: u32,
    /// The SGE the next byte comes from, and the offset in it.
    sge: usize,
    sge_off: u32,
    /// The MSN it goes out with (Sends and Read Requests).
    msn: u32,
}

/// Send-side state of one stream.
#[derive(Debug)]
pub(super) struct TxState {
    cur: Option<TxWork>,
    /// Next MSN on the peer's Send queue (queue 0).
    send_msn: u32,
    /// Next MSN on the peer's Read Request queue (queue 1).
    read_msn: u32,
    /// Whose turn it is: a Read Response FPDU (true) or the send queue's.
    response_turn: bool,
}

impl TxState {
    pub(super) const fn new() -> TxState {
        TxState {
            cur: None,
            send_msn: 1,
            read_msn: 1,
            response_turn: true,
        }
    }

    /// Stops the message in progress (the stream has ended; the queue pair
    /// flushes it).
    pub(super) fn abandon(&mut self) {
        self.cur = None;
    }
}

/// What to frame: the ULPDU's header bytes (DDP header and any RDMAP
/// header) and the payload pin.
struct Ulpdu {
    head: [u8; MAX_HEAD_LEN - LENGTH_LEN],
    head_len: usize,
}

impl Ulpdu {
    fn new() -> Ulpdu {
        Ulpdu {
            head: [0; MAX_HEAD_LEN - LENGTH_LEN],
            head_len: 0,
        }
    }

    fn ddp(repr: &DdpRepr) -> Ulpdu {
        let mut u = Ulpdu::new();
        repr.emit(&mut u.head);
        u.head_len = repr.header_len();
        u
    }

    fn bytes(b: &[u8]) -> Ulpdu {
        let mut u = Ulpdu::new();
        let n = b.len().min(u.head.len());
        u.head[..n].copy_from_slice(&b[..n]);
        u.head_len = n;
        u
    }
}

impl Endpoint {
    /// The next record to hand to TCP, at most `max_segment` octets (the
    /// size TCP offers now: `send_capacity`, never above the MSS). `None`
    /// when there is nothing to send or it does not fit; call again when
    /// TCP has room, after posting work, and after receiving.
    ///
    /// A record returned is part of the stream already (the MPA framer's
    /// position, markers, MSNs and offsets have moved past it): the driver
    /// must queue it, so it asks with no more than TCP will accept. Its
    /// [`OutRecord::end_offset`] identifies it and grows with every record.
    #[inline]
    pub fn poll_record<M: Placement + ?Sized>(
        &mut self,
        max_segment: usize,
        env: &mut Env<'_, M>,
    ) -> Option<OutRecord> {
        let mut out = None;
        self.poll_record_into(max_segment, env, &mut out);
        out
    }

    /// [`Endpoint::poll_record`] into `out`, which must be empty: the
    /// record is built where the driver keeps it (its table of records in
    /// flight) rather than returned by value. Whether there was one; `out`
    /// stays empty when not.
    #[inline]
    pub fn poll_record_into<M: Placement + ?Sized>(
        &mut self,
        max_segment: usize,
        env: &mut Env<'_, M>,
        out: &mut Option<OutRecord>,
    ) -> bool {
        debug_assert!(out.is_none(), "poll_record_into over a record");
        let mut got = self.next_record(max_segment, env, out);
        self.service(env);
        if !got && self.terminate_tx.is_some() {
            // Building found a local failure (a request's memory gone):
            // its Terminate goes out now.
            got = self.next_record(max_segment, env, out);
            self.service(env);
        }
        got
    }

    /// The next record into `out`: connection setup, a Terminate and the
    /// other control messages first, then Read Responses and the send
    /// queue's FPDUs in turn.
    #[inline]
    fn next_record<M: Placement + ?Sized>(
        &mut self,
        max_segment: usize,
        env: &mut Env<'_, M>,
        out: &mut Option<OutRecord>,
    ) -> bool {
        match self.next_control_record(max_segment, env) {
            Control::Record(r) => {
                *out = Some(r);
                return true;
            }
            Control::Stop => return false,
            Control::Data => {}
        }
        let first_response = self.tx.response_turn;
        self.tx.response_turn = !self.tx.response_turn;
        for response in [first_response, !first_response] {
            let got = if response {
                self.next_read_response(max_segment, env, out)
            } else {
                self.next_sq_fpdu(max_segment, env, out)
            };
            if got {
                return true;
            }
            if self.fatal.is_some() {
                return false;
            }
        }
        false
    }

    /// The records that go before any FPDU of data: setup bytes, a
    /// Terminate, the ready-to-receive message, its Read Response, a
    /// nudge; or whether data FPDUs may follow.
    fn next_control_record<M: Placement + ?Sized>(
        &mut self,
        max_segment: usize,
        env: &mut Env<'_, M>,
    ) -> Control {
        if max_segment == 0 || (self.closing.is_some() && self.close_reported) {
            // After an orderly close's ReadyToClose, TCP is closing: not
            // even a Terminate may follow.
            return Control::Stop;
        }
        if let Some(r) = self.next_setup_record(max_segment) {
            return Control::Record(r);
        }
        if self.setup_tx.is_some() {
            return Control::Stop;
        }
        if let Some(repr) = self.terminate_tx {
            let msg = TerminateMessage {
                msn: 1,
                header: repr,
            };
            let mut u = Ulpdu::new();
            u.head_len = msg.emit(&mut u.head);
            if !self.fits(u.head_len, max_segment) {
                return Control::Stop;
            }
            let Some(r) = self.frame(RecordKind::Terminate, &u, None, env) else {
                return Control::Stop;
            };
            self.terminate_tx = None;
            // RFC 5040 §6.2: the Terminate is the stream's last message.
            let _ = self.qp.modify_qp(QpModify::state(QpState::Error));
            return Control::Record(r);
        }
        if !self.may_send_fpdus {
            if let Some(first) = self.speak_first_after {
                // Relaxed responder: the reply is acknowledged (setup_tx is
                // empty and nothing else was sent) and new work is posted.
                if self.acked_offset >= self.tx_offset
                    && self.qp.head_seq().0 + self.qp.sq_len() as u64 > first
                {
                    self.may_send_fpdus = true;
                    self.speak_first_after = None;
                }
            }
        }
        if self.fatal.is_some() || !self.connected || !self.may_send_fpdus {
            return Control::Stop;
        }
        if let Some(rtr) = self.rtr_to_send {
            let u = Ulpdu::bytes(rtr_ulpdu(rtr).as_bytes());
            if !self.fits(u.head_len, max_segment) {
                return Control::Stop;
            }
            let Some(r) = self.frame(RecordKind::Rtr, &u, None, env) else {
                return Control::Stop;
            };
            self.rtr_to_send = None;
            match rtr {
                RtrType::Send => self.tx.send_msn = 2,
                RtrType::Read => {
                    self.tx.read_msn = 2;
                    self.rtr_read_pending = true;
                }
                RtrType::Write => {}
            }
            return Control::Record(r);
        }
        if let Some((stag, to)) = self.rtr_read_response {
            let u = Ulpdu::bytes(&read_response_ulpdu(stag, to));
            if !self.fits(u.head_len, max_segment) {
                return Control::Stop;
            }
            let Some(r) = self.frame(RecordKind::ReadResponse, &u, None, env) else {
                return Control::Stop;
            };
            self.rtr_read_response = None;
            return Control::Record(r);
        }
        if self.nudge == super::Nudge::Due && self.tx.cur.is_none() && self.closing.is_none() {
            // Between our messages only: a tagged message inside another
            // one's segments would end the peer's reassembly context early
            // on some receivers.
            let u = Ulpdu::bytes(nudge_ulpdu().as_bytes());
            if !self.fits(u.head_len, max_segment) {
                return Control::Stop;
            }
            let Some(r) = self.frame(RecordKind::RdmaWrite, &u, None, env) else {
                return Control::Stop;
            };
            self.nudge = super::Nudge::Off;
            self.stats.nudges += 1;
            return Control::Record(r);
        }
        Control::Data
    }

    fn next_setup_record(&mut self, max_segment: usize) -> Option<OutRecord> {
        let (bytes, at) = self.setup_tx.as_mut()?;
        let n = (bytes.len() - *at).min(max_segment);
        let chunk: Box<[u8]> = bytes[*at..*at + n].into();
        *at += n;
        if *at == bytes.len() {
            self.setup_tx = None;
        }
        self.tx_offset += n as u64;
        Some(OutRecord {
            kind: RecordKind::MpaFrame,
            end: self.tx_offset,
            body: Body::Setup(chunk),
        })
    }

    /// Whether a ULPDU of `ulpdu_len` octets fits `max_segment` here.
    fn fits(&self, ulpdu_len: usize, max_segment: usize) -> bool {
        self.framer
            .max_ulpdu_len(max_segment)
            .is_some_and(|m| m >= ulpdu_len)
    }

    /// How much payload fits behind a `header_len`-octet header; `None` if
    /// not even the header does.
    fn payload_room(&self, header_len: usize, max_segment: usize) -> Option<u32> {
        let max = self.framer.max_ulpdu_len(max_segment)?;
        let room = max.checked_sub(header_len)?;
        Some(u32::try_from(room).unwrap_or(u32::MAX))
    }

    /// The next Read Response FPDU, written into `out` (left empty when
    /// there is none): whether there was one.
    fn next_read_response<M: Placement + ?Sized>(
        &mut self,
        max_segment: usize,
        env: &mut Env<'_, M>,
        out: &mut Option<OutRecord>,
    ) -> bool {
        let Some(room) = self.payload_room(TAGGED_HEADER_LEN, max_segment) else {
            return false;
        };
        let Some(front) = self.qp.inbound_read_front() else {
            return false;
        };
        let remaining = front.len - front.sent;
        if remaining > 0 && room == 0 {
            return false;
        }
        let n = remaining.min(room);
        let last = front.sent + n == front.len;
        let header = DdpRepr::tagged(
            RdmapOpcode::ReadResponse,
            last,
            front.sink_stag.0,
            front.sink_to.wrapping_add(u64::from(front.sent)),
        );
        let pin = match (&front.source, n) {
            (_, 0) => None,
            (Some(source), n) => match env.device.mrs_mut().pin_sub(source, front.sent, n) {
                Some(pin) => Some(pin),
                None => {
                    self.fail(TerminateCause::RDMAP_LOCAL_CATASTROPHIC, None);
                    return false;
                }
            },
            (None, _) => {
                self.fail(TerminateCause::RDMAP_LOCAL_CATASTROPHIC, None);
                return false;
            }
        };
        front.sent += n;
        let r = self.frame_into(
            RecordKind::ReadResponse,
            &Ulpdu::ddp(&header),
            pin,
            env,
            out,
        );
        if last && r {
            // The FPDUs hold their own pins until acknowledged; the
            // request's pin on the whole source goes back now.
            if let Some(done) = self.qp.pop_inbound_read() {
                if let Some(pin) = done.source {
                    env.device.mrs_mut().unpin(pin);
                }
            }
        }
        r
    }

    /// The next FPDU of the send queue's work, written into `out` (left
    /// empty when there is none): whether there was one.
    fn next_sq_fpdu<M: Placement + ?Sized>(
        &mut self,
        max_segment: usize,
        env: &mut Env<'_, M>,
        out: &mut Option<OutRecord>,
    ) -> bool {
        if self.tx.cur.is_none() {
            if self.rtr_read_pending {
                // Our Read RTR holds one of the peer's IRD slots until its
                // Response arrives: start nothing that could exceed it.
                return false;
            }
            let Some(work) = self.qp.next_work(env.device.mrs_mut()) else {
                return false;
            };
            let msn = match work.op {
                WireOp::Send { .. } => {
                    let m = self.tx.send_msn;
                    self.tx.send_msn = m.wrapping_add(1);
                    m
                }
                WireOp::RdmaRead { .. } => {
                    let m = self.tx.read_msn;
                    self.tx.read_msn = m.wrapping_add(1);
                    m
                }
                WireOp::RdmaWrite { .. } => 0,
            };
            self.tx.cur = Some(TxWork {
                seq: work.seq,
                op: work.op,
                len: work.len,
                sent: 0,
                sge: 0,
                sge_off: 0,
                msn,
            });
        }
        // The request in progress is read and advanced in place, its SGEs
        // in the send queue: copying a request (some 170 bytes with its
        // SGE list) out and back for each FPDU was a measurable part of
        // the small-message path.
        let Some(op) = self.tx.cur.as_ref().map(|c| c.op) else {
            return false;
        };
        match op {
            WireOp::RdmaRead { remote_addr, rkey } => {
                if !self.fits(UNTAGGED_HEADER_LEN + READ_REQUEST_LEN, max_segment) {
                    return false;
                }
                let Some(cur) = self.tx.cur.as_ref() else {
                    return false;
                };
                let (seq, len, msn) = (cur.seq, cur.len, cur.msn);
                let sink = self
                    .qp
                    .work_sges(seq)
                    .and_then(|s| s.as_slice().first().copied());
                let rr = ReadRequest {
                    sink_stag: sink.map_or(RTR_STAG, |s| s.lkey.0),
                    sink_to: sink.map_or(0, |s| s.addr),
                    size: len,
                    source_stag: rkey.0,
                    source_to: remote_addr,
                };
                let header = DdpRepr::untagged(RdmapOpcode::ReadRequest, true, msn, 0);
                let mut u = Ulpdu::ddp(&header);
                rr.emit(&mut u.head[u.head_len..]);
                u.head_len += READ_REQUEST_LEN;
                let r = self.frame_into(RecordKind::ReadRequest, &u, None, env, out);
                if r {
                    self.tx.cur = None;
                    let _ = self.qp.transmitted(seq, self.tx_offset);
                }
                r
            }
            WireOp::Send { .. } | WireOp::RdmaWrite { .. } => {
                let (header_len, kind) = match op {
                    WireOp::Send { .. } => (UNTAGGED_HEADER_LEN, RecordKind::Send),
                    _ => (TAGGED_HEADER_LEN, RecordKind::RdmaWrite),
                };
                let Some(room) = self.payload_room(header_len, max_segment) else {
                    return false;
                };
                let Some(cur) = self.tx.cur.as_mut() else {
                    return false;
                };
                let remaining = cur.len - cur.sent;
                if remaining > 0 && room == 0 {
                    return false;
                }
                // Skip empty SGEs; an FPDU's payload stays within one SGE.
                let Some(sges) = self.qp.work_sges(cur.seq) else {
                    // Cannot happen: a request stays queued until it
                    // completes, and it cannot before it is sent.
                    self.tx.cur = None;
                    return false;
                };
                let sges = sges.as_slice();
                while remaining > 0 && sges.get(cur.sge).is_some_and(|s| cur.sge_off >= s.length) {
                    cur.sge += 1;
                    cur.sge_off = 0;
                }
                let sge = sges.get(cur.sge).copied();
                let (seq, sent, sge_off, msn) = (cur.seq, cur.sent, cur.sge_off, cur.msn);
                let last_len = cur.len;
                let n = match sge {
                    Some(s) if remaining > 0 => remaining.min(room).min(s.length - sge_off),
                    _ => 0,
                };
                let pin = match (sge, n) {
                    (_, 0) => None,
                    (Some(s), n) => {
                        let pd = self.qp.pd();
                        let pinned = s.addr.checked_add(u64::from(sge_off)).map(|addr| {
                            env.device
                                .mrs_mut()
                                .pin_local(s.lkey, addr, n, pd, Access::NONE)
                        });
                        match pinned {
                            Some(Ok(Some(pin))) => Some(pin),
                            Some(Err(e)) => {
                                // The source went away since the post: the
                                // request fails, and the queue pair with it.
                                self.tx.cur = None;
                                let _ = self.qp.complete(seq, e.wc_status());
                                return false;
                            }
                            _ => {
                                self.tx.cur = None;
                                let _ = self
                                    .qp
                                    .complete(seq, crate::verbs::WcStatus::LocalLengthError);
                                return false;
                            }
                        }
                    }
                    (None, _) => None,
                };
                let last = sent + n == last_len;
                let header = match op {
                    WireOp::Send {
                        solicited,
                        invalidate,
                    } => DdpRepr::Untagged {
                        opcode: send_opcode(solicited, invalidate.is_some()),
                        last,
                        qn: 0,
                        msn,
                        mo: sent,
                        inv_stag: invalidate.map(|s: Stag| s.0),
                    },
                    WireOp::RdmaWrite { remote_addr, rkey } => DdpRepr::tagged(
                        RdmapOpcode::RdmaWrite,
                        last,
                        rkey.0,
                        remote_addr.wrapping_add(u64::from(sent)),
                    ),
                    WireOp::RdmaRead { .. } => return false,
                };
                let r = self.frame_into(kind, &Ulpdu::ddp(&header), pin, env, out);
                if r {
                    if last {
                        self.tx.cur = None;
                        let _ = self.qp.transmitted(seq, self.tx_offset);
                    } else if let Some(cur) = self.tx.cur.as_mut() {
                        cur.sent += n;
                        cur.sge_off += n;
                    }
                }
                r
            }
        }
    }

    /// Frames one FPDU at the current stream position: length field and
    /// header in the record, payload by reference, pad and CRC computed.
    fn frame<M: Placement + ?Sized>(
        &mut self,
        kind: RecordKind,
        ulpdu: &Ulpdu,
        payload: Option<RegionRef>,
        env: &mut Env<'_, M>,
    ) -> Option<OutRecord> {
        let mut out = None;
        self.frame_into(kind, ulpdu, payload, env, &mut out);
        out
    }

    /// [`Endpoint::frame`] into `out`, where the record is built and
    /// finished in place (a record returned by value was copied at each
    /// level on its way to the records table); whether it was built.
    fn frame_into<M: Placement + ?Sized>(
        &mut self,
        kind: RecordKind,
        ulpdu: &Ulpdu,
        payload: Option<RegionRef>,
        env: &mut Env<'_, M>,
        out: &mut Option<OutRecord>,
    ) -> bool {
        let plen = payload.as_ref().map_or(0, RegionRef::len);
        let layout = match self.framer.layout(ulpdu.head_len + plen as usize) {
            Ok(l) => l,
            Err(_) => {
                // Sized by max_ulpdu_len, so unreachable; fail safe.
                if let Some(pin) = payload {
                    env.device.mrs_mut().unpin(pin);
                }
                self.fail(TerminateCause::RDMAP_LOCAL_CATASTROPHIC, None);
                return false;
            }
        };
        let deferred = self.framer.crc_enabled()
            && env.mem.crc_at_transmit()
            && layout.markers().next().is_none();
        *out = Some(OutRecord {
            kind,
            end: 0,
            body: Body::Fpdu(Fpdu {
                layout,
                head: [0u8; MAX_HEAD_LEN],
                head_len: (LENGTH_LEN + ulpdu.head_len) as u8,
                payload,
                trailer: layout.trailer(0),
                payload_sum: None,
                crc_pending: deferred,
            }),
        });
        if let Some(record) = out.as_mut() {
            // The length field and the header straight into the record:
            // assembled on the stack and copied in, the copy's wide loads
            // met the narrow stores that had just written them, which the
            // CPU cannot forward (42 % of this function's samples).
            if let Body::Fpdu(f) = &mut record.body {
                f.head[..LENGTH_LEN].copy_from_slice(&layout.prefix());
                f.head[LENGTH_LEN..LENGTH_LEN + ulpdu.head_len]
                    .copy_from_slice(&ulpdu.head[..ulpdu.head_len]);
            }
            if !deferred && self.framer.crc_enabled() {
                let (crc, sum) = fpdu_crc(record, &*env.mem);
                if let Body::Fpdu(f) = &mut record.body {
                    f.trailer = layout.trailer(crc);
                    f.payload_sum = sum;
                }
            }
            self.framer.advance(&layout);
            if self.nudge == super::Nudge::Armed && kind != RecordKind::Terminate {
                self.nudge = super::Nudge::Stamp;
            }
            self.tx_offset += layout.wire_len() as u64;
            record.end = self.tx_offset;
        }
        if let Some(i) = opcode_of(&ulpdu.head[..ulpdu.head_len]).and_then(stat_index) {
            self.stats.fpdus_out[i] += 1;
        }
        self.stats.bytes_sent += u64::from(plen);
        true
    }
}

/// The RDMAP opcode of a Send work request's message.
fn send_opcode(solicited: bool, invalidate: bool) -> RdmapOpcode {
    match (solicited, invalidate) {
        (false, false) => RdmapOpcode::Send,
        (true, false) => RdmapOpcode::SendSe,
        (false, true) => RdmapOpcode::SendInvalidate,
        (true, true) => RdmapOpcode::SendSeInvalidate,
    }
}

fn opcode_of(ulpdu: &[u8]) -> Option<RdmapOpcode> {
    ulpdu
        .get(1)
        .and_then(|b| RdmapOpcode::from_u4(b & crate::wire::ddp::rdmap_ctrl::OPCODE))
}
