//! Closing and resetting (RFC 9293 §3.6, §3.10.4, §3.10.7.4 "check the FIN
//! bit"): `close` queues a FIN after every record (ESTABLISHED → FIN-WAIT-1,
//! CLOSE-WAIT → LAST-ACK); the peer's FIN, once every byte before it is in
//! order, reports `PeerClosed` and moves ESTABLISHED → CLOSE-WAIT,
//! FIN-WAIT-1 → CLOSING (simultaneous close), FIN-WAIT-2 → TIME-WAIT; the
//! ACK of our FIN moves FIN-WAIT-1 → FIN-WAIT-2, CLOSING → TIME-WAIT,
//! LAST-ACK → CLOSED. TIME-WAIT lasts 2·MSL and re-ACKs a repeated FIN.
//! `abort` sends a RST (§3.10.5); a segment reaching a CLOSED connection
//! draws one (§3.10.7.1).

use super::connection::{Connection, PendingRst};
use super::{Event, Record, State};
use crate::seq::SeqNumber;
use crate::time::Instant;
use crate::wire::{TcpFlags, TcpRepr};

impl<B: AsRef<[u8]>, R: Record> Connection<B, R> {
    pub(super) fn start_close(&mut self, now: Instant) {
        let _ = now;
        match self.state {
            State::SynSent => self.terminate(Event::Closed),
            // The FIN goes out once the handshake completes (`establish`).
            State::SynReceived => self.fin_seq = Some(self.sendq.end()),
            State::Established => {
                self.fin_seq = Some(self.sendq.end());
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.fin_seq = Some(self.sendq.end());
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    pub(super) fn reset_local(&mut self, now: Instant) {
        let _ = now;
        match self.state {
            State::Closed | State::Listen => {}
            State::SynSent | State::TimeWait => self.terminate(Event::Reset),
            _ => {
                self.rst_pending = Some(PendingRst {
                    seq: self.snd_nxt,
                    ack: Some(self.rcv_nxt),
                });
                self.terminate(Event::Reset);
            }
        }
    }

    /// A FIN at `seq` arrived with acceptable text before it.
    pub(super) fn on_fin_flag(&mut self, now: Instant, seq: SeqNumber) {
        if seq == self.rcv_nxt {
            if matches!(
                self.state,
                State::SynReceived | State::Established | State::FinWait1 | State::FinWait2
            ) {
                self.consume_fin(now);
            } else {
                self.ack_now = true;
            }
        } else if seq > self.rcv_nxt && self.rx_fin.is_none() {
            // Payload before it is still missing: take it when it is in.
            self.rx_fin = Some(seq);
        }
    }

    /// The peer's FIN is in order: every byte before it is queued for
    /// `recv`.
    pub(super) fn consume_fin(&mut self, now: Instant) {
        self.rx_fin = None;
        self.rcv_nxt += 1;
        self.ack_now = true;
        self.events.push_back(Event::PeerClosed);
        match self.state {
            State::SynReceived | State::Established => self.state = State::CloseWait,
            State::FinWait1 => self.state = State::Closing,
            State::FinWait2 => self.enter_time_wait(now),
            _ => {}
        }
    }

    /// Our FIN is acknowledged.
    pub(super) fn on_fin_acked(&mut self, now: Instant) {
        self.fin_rtx = false;
        match self.state {
            State::FinWait1 => self.state = State::FinWait2,
            State::Closing => self.enter_time_wait(now),
            State::LastAck => self.terminate(Event::Closed),
            _ => {}
        }
    }

    fn enter_time_wait(&mut self, now: Instant) {
        self.state = State::TimeWait;
        self.sendq.drop_all();
        self.timers.rto = None;
        self.timers.reo = None;
        self.timers.pto = None;
        self.timers.persist = None;
        self.timers.keepalive = None;
        self.probe_pending = false;
        self.keepalive_pending = false;
        self.timers.time_wait = Some(now + self.config.time_wait);
    }

    /// RFC 9293 §3.10.7.1: anything but a RST reaching a CLOSED connection
    /// is answered with one.
    pub(super) fn on_segment_closed(&mut self, repr: &TcpRepr, plen: usize) {
        if repr.flags.contains(TcpFlags::RST) || self.state != State::Closed {
            return;
        }
        self.rst_pending = Some(match repr.ack() {
            Some(a) => PendingRst { seq: a, ack: None },
            None => PendingRst {
                seq: SeqNumber(0),
                ack: Some(repr.seq + repr.segment_len(plen)),
            },
        });
    }
}
