//! The receive path: deframed ULPDUs to placement, completions and
//! Terminates (DDP RFC 5041 §5–§7, RDMAP RFC 5040 §5–§7, RTR RFC 6581 §4).
//!
//! Per ULPDU: the first octet says the header's length (tagged or
//! untagged); the header is gathered into [`SegState::ctl`] (with the 28
//! octets of a Read Request, a Terminate's header, or a whole RTR), parsed
//! and checked; payload octets are then placed as they come. Per stream:
//! the untagged Send queue's MSN and the receive buffer in progress
//! ([`RxState::recv`]), the Read Request queue's MSN, and, apart from them,
//! the progress of the Read Response being placed ([`RxState::rresp_placed`]).

use super::{Blamed, Endpoint, Env};
use crate::error::TerminateCause;
use crate::mpa::rtr::{read_rtr_sink, recognize_rtr};
use crate::mpa::DeframeEvent;
use crate::placement::{CheckedRange, Placement, Unplaced};
use crate::verbs::{Access, InboundRead, QpError, RecvDone, Stag, WcStatus, IRD_EXCEEDED};
use crate::wire::ddp::{header_len_for_ctrl, DDP_VERSION};
use crate::wire::rdmap::READ_REQUEST_LEN;
use crate::wire::{DdpRepr, RdmapOpcode, ReadRequest, TerminateMessage, UNTAGGED_HEADER_LEN};

/// Octets of a ULPDU kept for parsing: the longest Terminate header
/// behind an untagged DDP header (4 + 2 + 18 + 28), which also covers a
/// Read Request (18 + 28) and any RTR.
pub(super) const CTL_CAP: usize =
    UNTAGGED_HEADER_LEN + 4 + 2 + UNTAGGED_HEADER_LEN + READ_REQUEST_LEN;

/// The longest RTR ULPDU (a Read RTR: untagged header and Read Request).
const RTR_MAX: usize = UNTAGGED_HEADER_LEN + READ_REQUEST_LEN;

/// What the ULPDU being received turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SegKind {
    /// Header not complete yet.
    Unknown,
    /// Refused: payload is skipped, the pending error ends the stream.
    Skip,
    /// RDMA Write segment at (STag, TO).
    Write { stag: u32, to: u64 },
    /// Read Response segment into the oldest outstanding Read's sink.
    ReadResponse { stag: u32, to: u64, last: bool },
    /// The zero-length Read Response answering our Read RTR.
    RtrReadResponse,
    /// A Send segment into the receive buffer in progress.
    Send {
        opcode: RdmapOpcode,
        mo: u32,
        last: bool,
        inv_stag: Option<u32>,
    },
    /// An RDMA Read Request (gathering its 28 octets).
    ReadRequest { msn: u32, last: bool },
    /// A Terminate (gathering its header).
    Terminate,
    /// Responder in peer-to-peer mode: the first ULPDU, which must be the
    /// negotiated RTR (gathered whole).
    Rtr,
}

/// The ULPDU being received.
#[derive(Debug, Clone, Copy)]
pub(super) struct SegState {
    /// ULPDU length.
    len: u16,
    /// ULPDU octets seen so far.
    at: usize,
    ctl: [u8; CTL_CAP],
    ctl_len: usize,
    /// Octets to gather into `ctl` before acting.
    ctl_need: usize,
    /// DDP header length, once the first octet is known (0 before).
    hdr_len: usize,
    kind: SegKind,
    /// A fault found in this ULPDU, reported at its end (a CRC error found
    /// there takes precedence: the header may be the corrupted part).
    err: Option<TerminateCause>,
}

impl SegState {
    const fn new(len: u16) -> SegState {
        SegState {
            len,
            at: 0,
            ctl: [0; CTL_CAP],
            ctl_len: 0,
            ctl_need: 0,
            hdr_len: 0,
            kind: SegKind::Unknown,
            err: None,
        }
    }

    fn payload_len(&self) -> u32 {
        u32::from(self.len).saturating_sub(self.hdr_len as u32)
    }

    fn refuse(&mut self, cause: TerminateCause) {
        if self.err.is_none() {
            self.err = Some(cause);
        }
        self.kind = SegKind::Skip;
    }
}

/// The receive buffer a Send is being placed into.
#[derive(Debug, Clone, Copy)]
struct RecvProgress {
    /// Its length (sum of its SGEs).
    len: u32,
    /// Bytes of the message placed (the next MO expected).
    placed: u32,
}

/// Receive-side state of one stream.
#[derive(Debug)]
pub(super) struct RxState {
    seg: SegState,
    /// Next MSN on the Send queue (queue 0).
    send_msn: u32,
    /// Next MSN on the Read Request queue (queue 1).
    read_msn: u32,
    /// Untagged reassembly: the Send in progress.
    recv: Option<RecvProgress>,
    /// Tagged reassembly, kept apart: bytes of the current Read Response
    /// placed so far.
    rresp_placed: u32,
}

impl RxState {
    pub(super) const fn new() -> RxState {
        RxState {
            seg: SegState::new(0),
            send_msn: 1,
            read_msn: 1,
            recv: None,
            rresp_placed: 0,
        }
    }

    /// Whether no message is half received: no Send in progress into a
    /// receive buffer, no Read Response partly placed.
    pub(super) fn between_messages(&self) -> bool {
        self.recv.is_none() && self.rresp_placed == 0
    }
}

impl Endpoint {
    /// Runs a chunk through the deframer and the receive path.
    pub(super) fn rx_feed<M: Placement + ?Sized>(
        &mut self,
        chunk: &[u8],
        fpdu_crc: Option<u32>,
        env: &mut Env<'_, M>,
    ) {
        if let Some(crc) = fpdu_crc.filter(|_| crate::mpa::fpdu::is_one_fpdu(chunk)) {
            if self.deframer.next_fpdu_crc(crc) {
                self.stats.fpdu_crcs_given += 1;
            }
        }
        let mut input = chunk;
        while self.rx_running {
            match self.deframer.next_event(&mut input) {
                Ok(None) => break,
                Ok(Some(DeframeEvent::UlpduStart { len })) => self.rx_start(len),
                Ok(Some(DeframeEvent::Bytes(b))) => self.rx_bytes(b, env),
                Ok(Some(DeframeEvent::UlpduEnd { crc_ok })) => self.rx_end(crc_ok, env),
                Err(e) => {
                    self.fail(e.terminate_cause(), None);
                    break;
                }
            }
        }
        self.deframer.forget_next_crc();
        if self.rx_running && !self.deframer.at_boundary() {
            self.stats.chunks_mid_fpdu += 1;
        }
    }

    fn rx_start(&mut self, len: u16) {
        let mut seg = SegState::new(len);
        if self.rtr_expected.is_some() {
            seg.kind = SegKind::Rtr;
            seg.ctl_need = usize::from(len).min(RTR_MAX);
        } else {
            seg.ctl_need = usize::from(len).min(1);
        }
        self.rx.seg = seg;
    }

    fn rx_bytes<M: Placement + ?Sized>(&mut self, mut piece: &[u8], env: &mut Env<'_, M>) {
        while !piece.is_empty() {
            let seg = &mut self.rx.seg;
            if seg.ctl_len == 0 && seg.kind == SegKind::Unknown {
                // The whole DDP header at hand (an FPDU that starts in
                // the segment): parsed from the input. Read back from
                // `ctl`, each of its words waited for the copy's stores
                // to reach the cache. `ctl` still gets the header, for a
                // Terminate that quotes it.
                if let Some(hl) = header_len_of(piece[0])
                    .filter(|&hl| hl <= usize::from(seg.len) && hl <= piece.len())
                {
                    let (hdr, rest) = piece.split_at(hl);
                    seg.ctl[..hl].copy_from_slice(hdr);
                    seg.ctl_len = hl;
                    seg.ctl_need = hl;
                    seg.hdr_len = hl;
                    seg.at += hl;
                    piece = rest;
                    self.rx_header(Some(hdr), env);
                    continue;
                }
            }
            if seg.ctl_len < seg.ctl_need {
                let n = (seg.ctl_need - seg.ctl_len).min(piece.len());
                seg.ctl[seg.ctl_len..seg.ctl_len + n].copy_from_slice(&piece[..n]);
                seg.ctl_len += n;
                seg.at += n;
                piece = &piece[n..];
                if seg.ctl_len == seg.ctl_need {
                    self.rx_ctl_ready(env);
                }
                continue;
            }
            let off = seg.at.saturating_sub(seg.hdr_len);
            seg.at += piece.len();
            if seg.err.is_none() {
                self.rx_place(off, piece, env);
            }
            piece = &[];
        }
    }

    /// `ctl` holds what was asked for: the first octet, the header, or the
    /// RDMAP header after it.
    fn rx_ctl_ready<M: Placement + ?Sized>(&mut self, env: &mut Env<'_, M>) {
        let seg = &mut self.rx.seg;
        if seg.kind != SegKind::Unknown {
            // The body of a Read Request, Terminate or RTR: acted on at the
            // ULPDU's end, once the CRC has matched.
            return;
        }
        if seg.hdr_len == 0 {
            let Some(hl) = header_len_of(seg.ctl[0]) else {
                // The rest of the header has no known layout.
                let cause = header_cause(&seg.ctl[..1]);
                seg.refuse(cause);
                return;
            };
            seg.hdr_len = hl;
            seg.ctl_need = seg.hdr_len.min(usize::from(seg.len));
        }
        if seg.ctl_len < seg.hdr_len {
            // Shorter than its own header: reported at the end.
            return;
        }
        self.rx_header(None, env);
    }

    /// The header is in `ctl` (and in `hdr`, if given: read from there).
    fn rx_header<M: Placement + ?Sized>(&mut self, hdr: Option<&[u8]>, env: &mut Env<'_, M>) {
        let seg = &mut self.rx.seg;
        let repr = match DdpRepr::parse_ulpdu_inline(hdr.unwrap_or(&seg.ctl[..seg.hdr_len])) {
            Ok((repr, _)) => repr,
            Err(e) => {
                let cause = e
                    .terminate_cause()
                    .unwrap_or(TerminateCause::RDMAP_OP_CATASTROPHIC_STREAM);
                seg.refuse(cause);
                return;
            }
        };
        if let Some(i) = stat_index(repr.opcode()) {
            self.stats.fpdus_in[i] += 1;
        }
        let plen = seg.payload_len();
        let pd = self.qp.pd();
        match repr {
            DdpRepr::Tagged {
                opcode: RdmapOpcode::RdmaWrite,
                stag,
                to,
                ..
            } => {
                match env
                    .device
                    .mrs()
                    .check_remote_write(Stag(stag), to, plen, pd)
                {
                    Ok(_) => seg.kind = SegKind::Write { stag, to },
                    Err(e) => seg.refuse(e.ddp_tagged_cause()),
                }
            }
            DdpRepr::Tagged { stag, to, last, .. } => {
                self.rx_read_response_header(stag, to, last, plen, env)
            }
            DdpRepr::Untagged {
                opcode: RdmapOpcode::ReadRequest,
                msn,
                last,
                ..
            } => {
                seg.kind = SegKind::ReadRequest { msn, last };
                seg.ctl_need = (seg.hdr_len + READ_REQUEST_LEN).min(usize::from(seg.len));
            }
            DdpRepr::Untagged {
                opcode: RdmapOpcode::Terminate,
                ..
            } => {
                seg.kind = SegKind::Terminate;
                seg.ctl_need = usize::from(seg.len).min(CTL_CAP);
            }
            DdpRepr::Untagged {
                opcode,
                msn,
                mo,
                last,
                inv_stag,
                ..
            } => self.rx_send_header(opcode, msn, mo, last, inv_stag, plen, env),
        }
    }

    fn rx_read_response_header<M: Placement + ?Sized>(
        &mut self,
        stag: u32,
        to: u64,
        last: bool,
        plen: u32,
        env: &mut Env<'_, M>,
    ) {
        if self.rtr_read_pending && plen == 0 && last {
            self.rx.seg.kind = SegKind::RtrReadResponse;
            return;
        }
        let placed = self.rx.rresp_placed;
        let pd = self.qp.pd();
        let cause = match self.qp.oldest_read() {
            None => Some(TerminateCause::RDMAP_OP_UNEXPECTED_OPCODE),
            Some((_, wr)) => match wr.sges.as_slice().first() {
                // A zero-length Read with no sink: nothing may arrive.
                None => (plen != 0).then_some(TerminateCause::DDP_TAGGED_BASE_BOUNDS),
                Some(sink) => {
                    let expected_to = sink.addr.checked_add(u64::from(placed));
                    if stag != sink.lkey.0 {
                        Some(TerminateCause::DDP_TAGGED_INVALID_STAG)
                    } else if expected_to != Some(to)
                        || u64::from(placed) + u64::from(plen) > u64::from(sink.length)
                    {
                        // Responses arrive in order and fill the sink from
                        // its start (RFC 5040 §5.2); anything else reaches
                        // outside what this Read asked for.
                        Some(TerminateCause::DDP_TAGGED_BASE_BOUNDS)
                    } else {
                        env.device
                            .mrs()
                            .check_local(Stag(stag), to, plen, pd, Access::LOCAL_WRITE)
                            .err()
                            .map(|e| e.ddp_tagged_cause())
                    }
                }
            },
        };
        let seg = &mut self.rx.seg;
        match cause {
            Some(c) => seg.refuse(c),
            None => seg.kind = SegKind::ReadResponse { stag, to, last },
        }
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "the fields of one untagged header and the environment"
    )]
    fn rx_send_header<M: Placement + ?Sized>(
        &mut self,
        opcode: RdmapOpcode,
        msn: u32,
        mo: u32,
        last: bool,
        inv_stag: Option<u32>,
        plen: u32,
        env: &mut Env<'_, M>,
    ) {
        if msn != self.rx.send_msn {
            self.rx.seg.refuse(TerminateCause::DDP_UNTAGGED_MSN_RANGE);
            return;
        }
        let progress = match self.rx.recv {
            Some(p) => p,
            None => match self.begin_recv(env) {
                Ok(p) => p,
                Err(cause) => {
                    self.rx.seg.refuse(cause);
                    return;
                }
            },
        };
        let cause = if mo > progress.len || mo != progress.placed {
            Some(TerminateCause::DDP_UNTAGGED_INVALID_MO)
        } else if u64::from(mo) + u64::from(plen) > u64::from(progress.len) {
            Some(TerminateCause::DDP_UNTAGGED_TOO_LONG)
        } else {
            None
        };
        let seg = &mut self.rx.seg;
        match cause {
            Some(c) => seg.refuse(c),
            None => {
                seg.kind = SegKind::Send {
                    opcode,
                    mo,
                    last,
                    inv_stag,
                }
            }
        }
    }

    /// Takes a receive buffer for a new Send and checks every SGE of it.
    fn begin_recv<M: Placement + ?Sized>(
        &mut self,
        env: &mut Env<'_, M>,
    ) -> Result<RecvProgress, TerminateCause> {
        match self.qp.begin_recv(env.srq.as_deref_mut()) {
            Ok(()) => {}
            Err(QpError::NoReceiveBuffer) => return Err(TerminateCause::DDP_UNTAGGED_NO_BUFFER),
            // Our own misconfiguration (wrong SRQ passed, wrong state).
            Err(_) => return Err(TerminateCause::DDP_LOCAL_CATASTROPHIC),
        }
        let pd = self.qp.pd();
        let Some(wr) = self.qp.current_recv().copied() else {
            return Err(TerminateCause::DDP_LOCAL_CATASTROPHIC);
        };
        let bad = wr.sges.as_slice().iter().any(|s| {
            env.device
                .mrs()
                .check_local(s.lkey, s.addr, s.length, pd, Access::LOCAL_WRITE)
                .is_err()
        });
        if bad {
            // The application posted a buffer it may not write: its
            // receive fails, and the stream with it (no fault of the peer).
            let done = RecvDone {
                status: WcStatus::LocalProtectionError,
                byte_len: 0,
                solicited: false,
                invalidated_stag: None,
            };
            let _ = self.qp.finish_recv(env.recv_cq(), done);
            return Err(TerminateCause::DDP_LOCAL_CATASTROPHIC);
        }
        let progress = RecvProgress {
            len: wr.sges.total_len().unwrap_or(0),
            placed: 0,
        };
        self.rx.recv = Some(progress);
        Ok(progress)
    }

    /// Places `data`, the payload octets at `off` of the current segment.
    fn rx_place<M: Placement + ?Sized>(&mut self, off: usize, data: &[u8], env: &mut Env<'_, M>) {
        let pd = self.qp.pd();
        let Ok(off) = u32::try_from(off) else {
            return;
        };
        let Ok(n) = u32::try_from(data.len()) else {
            return;
        };
        let result = match self.rx.seg.kind {
            SegKind::Write { stag, to } => match to.checked_add(u64::from(off)) {
                Some(at) => env
                    .device
                    .mrs()
                    .check_remote_write(Stag(stag), at, n, pd)
                    .map_err(|e| e.ddp_tagged_cause())
                    .and_then(|r| place(env.mem, r, data)),
                None => Err(TerminateCause::DDP_TAGGED_TO_WRAP),
            },
            SegKind::ReadResponse { stag, to, .. } => match to.checked_add(u64::from(off)) {
                Some(at) => env
                    .device
                    .mrs()
                    .check_local(Stag(stag), at, n, pd, Access::LOCAL_WRITE)
                    .map_err(|e| e.ddp_tagged_cause())
                    .and_then(|r| place(env.mem, r, data)),
                None => Err(TerminateCause::DDP_TAGGED_TO_WRAP),
            },
            SegKind::Send { mo, .. } => self.place_recv(mo.saturating_add(off), data, env),
            _ => return,
        };
        match result {
            Ok(_) => self.stats.bytes_placed += u64::from(n),
            Err(cause) => self.rx.seg.refuse(cause),
        }
    }

    /// Places `data` at message offset `at` of the receive in progress,
    /// across its SGEs.
    fn place_recv<M: Placement + ?Sized>(
        &mut self,
        mut at: u32,
        mut data: &[u8],
        env: &mut Env<'_, M>,
    ) -> Result<(), TerminateCause> {
        let pd = self.qp.pd();
        let wr = *self
            .qp
            .current_recv()
            .ok_or(TerminateCause::DDP_LOCAL_CATASTROPHIC)?;
        let mut start = 0u32;
        for sge in wr.sges.as_slice() {
            if data.is_empty() {
                break;
            }
            let end = start.saturating_add(sge.length);
            if at < end {
                let local = at - start;
                let n = (sge.length - local).min(data.len() as u32);
                let addr = sge
                    .addr
                    .checked_add(u64::from(local))
                    .ok_or(TerminateCause::DDP_LOCAL_CATASTROPHIC)?;
                let range = env
                    .device
                    .mrs()
                    .check_local(sge.lkey, addr, n, pd, Access::LOCAL_WRITE)
                    .map_err(|_| TerminateCause::DDP_LOCAL_CATASTROPHIC)?;
                let (now, rest) = data.split_at(n as usize);
                place(env.mem, range, now)?;
                data = rest;
                at += n;
            }
            start = end;
        }
        if data.is_empty() {
            Ok(())
        } else {
            // Checked against the buffer's length at the header.
            Err(TerminateCause::DDP_UNTAGGED_TOO_LONG)
        }
    }

    fn rx_end<M: Placement + ?Sized>(&mut self, crc_ok: bool, env: &mut Env<'_, M>) {
        let seg = self.rx.seg;
        let offending = Some((&seg.ctl[..seg.ctl_len], seg.len));
        if !crc_ok {
            self.fail(TerminateCause::MPA_CRC, None);
            return;
        }
        if seg.kind == SegKind::Unknown {
            // Shorter than the header its first octet announces.
            let cause = header_cause(&seg.ctl[..seg.ctl_len]);
            self.fail(cause, offending);
            return;
        }
        if let Some(cause) = seg.err {
            self.fail(cause, offending);
            return;
        }
        let pd = self.qp.pd();
        let plen = seg.payload_len();
        match seg.kind {
            SegKind::Unknown | SegKind::Skip | SegKind::Write { .. } => {}
            SegKind::RtrReadResponse => self.rtr_read_pending = false,
            SegKind::ReadResponse { last, .. } => {
                self.rx.rresp_placed = self.rx.rresp_placed.saturating_add(plen);
                if last {
                    let expected = self
                        .qp
                        .oldest_read()
                        .and_then(|(_, wr)| wr.sges.total_len())
                        .unwrap_or(0);
                    if self.rx.rresp_placed != expected {
                        // The Response ended short of the Read's size.
                        self.fail(TerminateCause::DDP_TAGGED_BASE_BOUNDS, offending);
                        return;
                    }
                    self.rx.rresp_placed = 0;
                    let _ = self.qp.complete_read(WcStatus::Success);
                }
            }
            SegKind::Send {
                opcode,
                last,
                inv_stag,
                ..
            } => {
                let Some(mut progress) = self.rx.recv else {
                    return;
                };
                progress.placed = progress.placed.saturating_add(plen);
                self.rx.recv = Some(progress);
                if last {
                    let mut invalidated = None;
                    if let Some(inv) = inv_stag {
                        if let Err(e) = env.device.mrs_mut().invalidate_remote(Stag(inv), pd) {
                            self.fail(e.invalidate_cause(), offending);
                            return;
                        }
                        invalidated = Some(Stag(inv));
                    }
                    let done = RecvDone {
                        status: WcStatus::Success,
                        byte_len: progress.placed,
                        solicited: opcode.solicited_event(),
                        invalidated_stag: invalidated,
                    };
                    // A full CQ moves the queue pair to Error; service()
                    // turns that into a Terminate.
                    let _ = self.qp.finish_recv(env.recv_cq(), done);
                    self.rx.recv = None;
                    self.rx.send_msn = self.rx.send_msn.wrapping_add(1);
                }
            }
            SegKind::ReadRequest { msn, last } => {
                if let Err(cause) = self.rx_read_request(&seg, msn, last, env) {
                    self.fail(cause, offending);
                    return;
                }
            }
            SegKind::Terminate => {
                let (cause, about) = match TerminateMessage::parse(&seg.ctl[..seg.ctl_len]) {
                    Ok((m, _layout)) => (
                        Some(m.header.cause),
                        Blamed::from_report(
                            m.header.ddp_header.and_then(|h| h.parse().ok()),
                            m.header.rdma_header,
                        ),
                    ),
                    Err(_) => (None, None),
                };
                self.peer_terminated(cause, about);
                return;
            }
            SegKind::Rtr => {
                let ulpdu = &seg.ctl[..seg.ctl_len];
                let got = (usize::from(seg.len) <= RTR_MAX)
                    .then(|| recognize_rtr(ulpdu))
                    .flatten();
                if got.is_none() || got != self.rtr_expected {
                    self.fail(TerminateCause::MPA_NO_MATCHING_RTR, offending);
                    return;
                }
                match got {
                    Some(crate::mpa::RtrType::Send) => self.rx.send_msn = 2,
                    Some(crate::mpa::RtrType::Read) => {
                        self.rx.read_msn = 2;
                        self.rtr_read_response = read_rtr_sink(ulpdu);
                    }
                    _ => {}
                }
                self.rtr_expected = None;
            }
        }
        if self.rtr_expected.is_none() {
            self.may_send_fpdus = true;
        }
    }

    /// An inbound RDMA Read Request (RFC 5040 §5.2): checked, its source
    /// pinned, queued against IRD.
    fn rx_read_request<M: Placement + ?Sized>(
        &mut self,
        seg: &SegState,
        msn: u32,
        last: bool,
        env: &mut Env<'_, M>,
    ) -> Result<(), TerminateCause> {
        let body = seg
            .ctl
            .get(seg.hdr_len..seg.ctl_len)
            .ok_or(TerminateCause::RDMAP_OP_CATASTROPHIC_STREAM)?;
        if !last || usize::from(seg.len) != seg.hdr_len + READ_REQUEST_LEN {
            // One segment of exactly the header and the 28 octets.
            return Err(TerminateCause::RDMAP_OP_CATASTROPHIC_STREAM);
        }
        let rr = ReadRequest::parse_bytes(body)
            .map_err(|_| TerminateCause::RDMAP_OP_CATASTROPHIC_STREAM)?;
        if msn != self.rx.read_msn {
            return Err(TerminateCause::DDP_UNTAGGED_MSN_RANGE);
        }
        self.rx.read_msn = self.rx.read_msn.wrapping_add(1);
        if self.qp.inbound_reads() >= self.qp.ird() as usize {
            return Err(IRD_EXCEEDED);
        }
        let pd = self.qp.pd();
        let source = env
            .device
            .mrs_mut()
            .pin_remote_read(Stag(rr.source_stag), rr.source_to, rr.size, pd)
            .map_err(|e| e.rdmap_cause())?;
        let read = InboundRead {
            sink_stag: Stag(rr.sink_stag),
            sink_to: rr.sink_to,
            len: rr.size,
            source,
            sent: 0,
        };
        if let Err(read) = self.qp.push_inbound_read(read) {
            if let Some(pin) = read.source {
                env.device.mrs_mut().unpin(pin);
            }
            return Err(IRD_EXCEEDED);
        }
        Ok(())
    }
}

/// Writes `data` into the checked range `range`, if there is one (a
/// zero-length piece has none). Memory that is not there after all
/// (the implementation lost the region: [`Unplaced`]) ends the stream
/// with a local catastrophic error: completing the message would report
/// bytes that were never placed.
fn place<M: Placement + ?Sized>(
    mem: &mut M,
    range: Option<CheckedRange<'_>>,
    data: &[u8],
) -> Result<(), TerminateCause> {
    match range {
        Some(r) => mem
            .write(r, data)
            .map_err(|Unplaced| TerminateCause::DDP_LOCAL_CATASTROPHIC),
        None => Ok(()),
    }
}

/// The length of the DDP header that starts with control octet `ctrl`,
/// if its DDP version is ours (else the rest has no known layout).
fn header_len_of(ctrl: u8) -> Option<usize> {
    (ctrl & crate::wire::ddp::ddp_ctrl::VERSION == DDP_VERSION).then(|| header_len_for_ctrl(ctrl))
}

/// The cause for a ULPDU whose DDP header could not be read: what the
/// header parser says (invalid DDP version first), or a catastrophic
/// stream error for a header cut short.
fn header_cause(bytes: &[u8]) -> TerminateCause {
    DdpRepr::parse_ulpdu(bytes)
        .err()
        .and_then(|e| e.terminate_cause())
        .unwrap_or(TerminateCause::RDMAP_OP_CATASTROPHIC_STREAM)
}

/// Index of an opcode in [`super::Stats`].
pub(super) fn stat_index(op: RdmapOpcode) -> Option<usize> {
    let i = usize::from(op.as_u4());
    (i < 8).then_some(i)
}
