//! Orderly close of an RDMAP stream (RFC 5040 §6.2's graceful termination
//! by the ULP, with the RDMAC verbs' Closing state): the abortive endings
//! (a Terminate, an abort, TCP going away) live in the parent module.
//!
//! Either side may start it. Locally, [`Endpoint::disconnect`] moves the
//! queue pair from Rts to Closing: new send work is refused by the queue
//! pair, work already posted still goes out and completes, Read Requests
//! the peer already sent are still answered, and receiving goes on. Once
//! the send queue is empty, no inbound Read waits for its Response and TCP
//! has acknowledged every record, the endpoint reports
//! [`EngineEvent::ReadyToClose`] and sends nothing more: the driver closes
//! TCP (its FIN). The peer's FIN ([`Endpoint::handle_peer_closed`]) moves a
//! queue pair still in Rts to Closing the same way (a passive close); after
//! both — our side drained, the peer's stream ended on a message boundary —
//! the stream has closed in order: receives still posted are flushed with
//! `WrFlushError`, the queue pair returns to Idle, and
//! [`EngineEvent::Closed`] is reported.
//!
//! What cannot complete makes the close abortive, as any other loss of
//! the stream: the peer's stream ending inside an FPDU or a message, or
//! with one of our RDMA Reads unanswered (RFC 5040 §6.2.1: a graceful close
//! with Reads outstanding is an error), or TCP going away before our side
//! has drained. A fault of the peer found after ReadyToClose ends the
//! stream the same way but sends no Terminate: our FIN is out, and nothing
//! may follow it. [`Endpoint::handle_stream_closed`] after the drain (a
//! driver that reports the peer's FIN and the end of the connection as one
//! event) is the normal ending.

use super::{Endpoint, EngineEvent, Env, Fatal, TerminateOrigin};
use crate::error::TerminateCause;
use crate::placement::Placement;
use crate::verbs::{QpModify, QpState, VerbsError};

/// Progress of an orderly close.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Closing {
    /// The peer's FIN has arrived: nothing more will be received.
    pub(super) peer_fin: bool,
    /// The close has finished ([`EngineEvent::Closed`] reported).
    pub(super) done: bool,
}

impl Endpoint {
    /// Starts an orderly close (the verbs' disconnect: `rdma_disconnect`,
    /// or `modify_qp` to Closing): the queue pair moves to Closing, so
    /// `post_send` is refused from now on; what was posted before still
    /// goes out and completes. [`EngineEvent::ReadyToClose`] follows once
    /// everything is acknowledged, and [`EngineEvent::Closed`] once the
    /// peer has closed too.
    ///
    /// Refused with [`VerbsError::InvalidTransition`] unless the stream is
    /// up and healthy (setup still running: abort it instead; the stream
    /// already ended, abnormally or in order: nothing to close). Calling it
    /// again while closing changes nothing.
    pub fn disconnect<M: Placement + ?Sized>(
        &mut self,
        env: &mut Env<'_, M>,
    ) -> Result<(), VerbsError> {
        if self.closing.is_some_and(|c| !c.done) && self.fatal.is_none() {
            return Ok(());
        }
        if !self.connected || self.fatal.is_some() || self.qp.state() != QpState::Rts {
            return Err(VerbsError::InvalidTransition);
        }
        self.qp.modify_qp(QpModify::state(QpState::Closing))?;
        self.closing = Some(Closing::default());
        self.service(env);
        Ok(())
    }

    /// The peer closed its direction of the stream (TCP reported its FIN):
    /// no more bytes will arrive, though ours may still be sent and
    /// acknowledged. A queue pair in Rts starts closing (a close the peer
    /// began); one already closing finishes once our side has drained.
    /// The peer's stream ending inside a message, or with one of our Reads
    /// unanswered, ends the stream abnormally instead
    /// ([`TerminateCause::MPA_TCP_CLOSED`], reported locally). Reporting
    /// the FIN again changes nothing.
    pub fn handle_peer_closed<M: Placement + ?Sized>(&mut self, env: &mut Env<'_, M>) {
        if self.fatal.is_some() || self.closing.is_some_and(|c| c.done || c.peer_fin) {
            self.service(env);
            return;
        }
        if !self.connected {
            // Setup cannot finish without the peer.
            self.handle_stream_closed(env);
            return;
        }
        if !self.peer_ended_cleanly() {
            self.stream_lost(env);
            return;
        }
        self.rx_running = false;
        if self.qp.state() == QpState::Rts {
            // Rts -> Closing is always allowed.
            let _ = self.qp.modify_qp(QpModify::state(QpState::Closing));
        }
        let closing = self.closing.get_or_insert_with(Closing::default);
        closing.peer_fin = true;
        self.service(env);
    }

    /// Whether the stream has closed in order ([`EngineEvent::Closed`]).
    pub fn is_closed(&self) -> bool {
        self.closing.is_some_and(|c| c.done)
    }

    /// Whether an orderly close is in progress: started, by either side,
    /// not finished and not turned abortive.
    pub fn is_closing(&self) -> bool {
        self.closing.is_some_and(|c| !c.done) && self.fatal.is_none()
    }

    /// [`Endpoint::handle_stream_closed`]'s part: whether the end of the
    /// connection is the normal end of an orderly close (our side drained,
    /// the peer's stream at a message boundary), which it then completes.
    pub(super) fn stream_closed_in_order<M: Placement + ?Sized>(
        &mut self,
        env: &mut Env<'_, M>,
    ) -> bool {
        let Some(c) = self.closing else {
            return false;
        };
        if self.fatal.is_some() {
            return false;
        }
        if c.done {
            return true;
        }
        if !self.close_reported || !(c.peer_fin || self.peer_ended_cleanly()) {
            return false;
        }
        self.rx_running = false;
        if let Some(c) = self.closing.as_mut() {
            c.peer_fin = true;
        }
        self.service(env);
        true
    }

    /// Whether nothing is left to send or to be acknowledged, so TCP may
    /// close our direction.
    fn drained(&self) -> bool {
        self.qp.sq_len() == 0
            && self.qp.inbound_reads() == 0
            && self.setup_tx.is_none()
            && self.terminate_tx.is_none()
            && self.rtr_to_send.is_none()
            && self.rtr_read_response.is_none()
            && self.acked_offset >= self.tx_offset
    }

    /// Whether the peer's stream, ending here, ended between messages with
    /// nothing of ours left unanswered.
    fn peer_ended_cleanly(&self) -> bool {
        self.deframer.at_boundary()
            && self.rx.between_messages()
            && self.qp.outstanding_reads() == 0
            && !self.rtr_read_pending
            && self.rtr_expected.is_none()
    }

    /// The stream ends abnormally, as when TCP goes away under it.
    fn stream_lost<M: Placement + ?Sized>(&mut self, env: &mut Env<'_, M>) {
        self.fatal = Some(Fatal {
            origin: TerminateOrigin::Stream,
        });
        self.events.push_back(EngineEvent::Terminated {
            cause: Some(TerminateCause::MPA_TCP_CLOSED),
            origin: TerminateOrigin::Stream,
        });
        self.rx_running = false;
        self.terminate_tx = None;
        self.tx.abandon();
        self.enter_error();
        self.close_pending = true;
        self.service(env);
    }

    /// Part of [`Endpoint::service`]: reports the drain, finishes a close
    /// both sides have made, and returns a flushed queue pair to Idle.
    pub(super) fn service_close<M: Placement + ?Sized>(&mut self, env: &mut Env<'_, M>) {
        let Some(c) = self.closing else {
            return;
        };
        if self.fatal.is_some() {
            return;
        }
        if !c.done {
            if !self.close_reported && self.drained() {
                self.close_reported = true;
                self.close_pending = true;
                self.events.push_back(EngineEvent::ReadyToClose);
            }
            if !(self.close_reported && c.peer_fin) {
                return;
            }
            self.closing = Some(Closing {
                peer_fin: true,
                done: true,
            });
            self.rx_running = false;
            // Read Requests that came after our FIN cannot be answered.
            self.qp.drain_inbound_reads(env.device.mrs_mut());
            // Error flushes the receives still posted; Idle follows once
            // they are in the CQ.
            self.enter_error();
            let _ = self.qp.flush_rq(env.recv_cq());
            self.events.push_back(EngineEvent::Closed);
        }
        if self.qp.state() == QpState::Error && !self.qp.needs_flush() {
            let _ = self.qp.flush_rq(env.recv_cq());
            let _ = self.qp.modify_qp(QpModify::state(QpState::Idle));
        }
    }
}
