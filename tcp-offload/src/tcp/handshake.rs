//! Opening a connection (RFC 9293 §3.5): the active open from CLOSED to
//! SYN-SENT, the passive open from a listener's SYN to SYN-RECEIVED, the
//! SYN-cookie path straight to ESTABLISHED, and simultaneous open (SYN-SENT
//! receiving a bare SYN moves to SYN-RECEIVED and answers with a SYN-ACK).
//!
//! Option negotiation happens here: the peer's MSS caps our send MSS (536
//! when absent, RFC 9293 §3.7.1); window scaling only when both SYNs carry
//! it, the peer's shift clamped to 14 (RFC 7323 §2.2, §2.3); SACK when
//! both allow it (RFC 2018 §2); timestamps when both SYNs carry them
//! (RFC 7323 §3.2).

use core::net::SocketAddrV4;

use super::config::Config;
use super::connection::{Connection, PendingRst};
use super::{Event, Payload, Record, State};
use crate::seq::SeqNumber;
use crate::time::Instant;
use crate::wire::{TcpFlags, TcpOptions, TcpRepr};

/// Largest window shift RFC 7323 §2.3 allows.
const MAX_SHIFT: u8 = 14;

/// The smallest window shift whose largest window covers `buffer`.
pub(super) fn shift_for(buffer: usize) -> u8 {
    let mut s = 0u8;
    while s < MAX_SHIFT && (usize::from(u16::MAX) << s) < buffer {
        s += 1;
    }
    s
}

/// The window a SYN or SYN-ACK announces (never scaled).
pub(super) fn syn_window(config: &Config) -> usize {
    config.recv_buffer.min(usize::from(u16::MAX))
}

impl<B: AsRef<[u8]>, R: Record> Connection<B, R> {
    pub(super) fn open_active(
        now: Instant,
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: SeqNumber,
    ) -> Connection<B, R> {
        let mut c = Self::new_tcb(now, config, local, remote, iss, State::SynSent);
        if c.config.window_scaling {
            c.opts.rcv_shift = shift_for(c.config.recv_buffer);
        }
        c.syn_pending = true;
        c.last_now = now;
        c
    }

    pub(super) fn open_passive(
        now: Instant,
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        syn: &TcpRepr,
        iss: SeqNumber,
    ) -> Connection<B, R> {
        let mut c = Self::new_tcb(now, config, local, remote, iss, State::SynReceived);
        c.learn_peer_syn(now, syn);
        c.snd_wl2 = iss;
        c.syn_pending = true;
        c.last_now = now;
        c
    }

    #[allow(clippy::too_many_arguments)] // mirrors the public `from_cookie`
    pub(super) fn open_from_cookie(
        now: Instant,
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        ack: &TcpRepr,
        iss: SeqNumber,
        irs: SeqNumber,
        peer_mss: u16,
    ) -> Connection<B, R> {
        let mut c = Self::new_tcb(now, config, local, remote, iss, State::SynReceived);
        c.irs = irs;
        c.rcv_nxt = irs + 1;
        c.rcv_adv = c.rcv_nxt + syn_window(&c.config);
        c.opts.peer_mss = if peer_mss == 0 { 536 } else { peer_mss };
        c.update_eff_mss();
        c.snd_una = iss + 1;
        c.snd_nxt = iss + 1;
        c.sendq.restart(iss + 1);
        c.snd_wnd = usize::from(ack.window);
        c.max_snd_wnd = c.snd_wnd;
        c.snd_wl1 = ack.seq;
        c.snd_wl2 = ack.ack_number;
        c.last_ack_sent = c.rcv_nxt;
        c.last_now = now;
        c.establish(now);
        c
    }

    /// Takes the peer's ISN, window and options from its SYN.
    fn learn_peer_syn(&mut self, now: Instant, syn: &TcpRepr) {
        self.irs = syn.seq;
        self.rcv_nxt = syn.seq + 1;
        self.rcv_adv = self.rcv_nxt + syn_window(&self.config);
        self.last_ack_sent = self.rcv_nxt;
        self.negotiate(&syn.options);
        if let (true, Some(ts)) = (self.opts.timestamps, syn.options.timestamp) {
            self.ts_recent = ts.tsval;
            self.ts_recent_at = now;
        }
        // RFC 7323 §2.2: the window field of a SYN is never scaled.
        self.snd_wnd = usize::from(syn.window);
        self.max_snd_wnd = self.snd_wnd;
        self.snd_wl1 = syn.seq;
    }

    fn negotiate(&mut self, peer: &TcpOptions) {
        self.opts.peer_mss = match peer.mss {
            Some(m) if m > 0 => m,
            _ => 536,
        };
        match (self.config.window_scaling, peer.window_scale) {
            (true, Some(s)) => {
                self.opts.wscale = true;
                self.opts.snd_shift = s.min(MAX_SHIFT);
                self.opts.rcv_shift = shift_for(self.config.recv_buffer);
            }
            _ => {
                self.opts.wscale = false;
                self.opts.snd_shift = 0;
                self.opts.rcv_shift = 0;
            }
        }
        self.opts.sack = self.config.sack && peer.sack_permitted;
        self.opts.timestamps = self.config.timestamps && peer.timestamp.is_some();
        self.update_eff_mss();
    }

    /// SYN-SENT (RFC 9293 §3.10.7.3).
    pub(super) fn on_segment_syn_sent(
        &mut self,
        now: Instant,
        repr: &TcpRepr,
        payload: Option<Payload<B>>,
    ) {
        let rst = repr.flags.contains(TcpFlags::RST);
        let ack = repr.ack();
        if let Some(a) = ack {
            if a <= self.iss || a > self.snd_nxt {
                if !rst {
                    self.rst_pending = Some(PendingRst { seq: a, ack: None });
                }
                self.stats.dropped += 1;
                return;
            }
        }
        if rst {
            if ack.is_some() {
                self.terminate(Event::Reset);
            } else {
                self.stats.dropped += 1;
            }
            return;
        }
        if !repr.flags.contains(TcpFlags::SYN) {
            self.stats.dropped += 1;
            return;
        }
        self.learn_peer_syn(now, repr);
        match ack {
            Some(a) => {
                self.snd_una = a;
                self.snd_wl2 = a;
                self.handshake_acked(now, repr);
                self.establish(now);
                self.ack_now = true;
                let plen = payload.as_ref().map_or(0, Payload::len);
                let whole = match payload {
                    Some(p) => self.on_text(now, repr.seq + 1, p),
                    None => true,
                };
                if whole && repr.flags.contains(TcpFlags::FIN) {
                    self.on_fin_flag(now, repr.seq + 1 + plen);
                }
            }
            None => {
                // Simultaneous open: answer with a SYN-ACK of our ISN.
                self.state = State::SynReceived;
                self.syn_pending = true;
                self.syn_sends = 0;
                self.timers.retries = 0;
            }
        }
    }

    /// The peer acknowledged our SYN: stop the SYN timer and take an RTT
    /// sample if the SYN went out only once.
    fn handshake_acked(&mut self, now: Instant, repr: &TcpRepr) {
        self.timers.rto = None;
        self.timers.retries = 0;
        if let Some(t) = self.syn_sent_at.take() {
            self.rtt.sample(now - t);
        } else if let (true, Some(ts)) = (self.opts.timestamps, repr.options.timestamp) {
            if ts.tsecr != 0 {
                self.rtt_sample_ts(now, ts.tsecr);
            }
        }
    }

    /// SYN-RECEIVED, "check the ACK field" (RFC 9293 §3.10.7.4): an ACK of
    /// our SYN-ACK completes the handshake; any other ACK draws a RST.
    /// Returns whether processing of the segment continues.
    pub(super) fn ack_syn_received(&mut self, now: Instant, repr: &TcpRepr) -> bool {
        let a = repr.ack_number;
        if !(self.snd_una < a && a <= self.snd_nxt) {
            self.rst_pending = Some(PendingRst { seq: a, ack: None });
            self.stats.dropped += 1;
            return false;
        }
        self.snd_una = a;
        self.snd_wnd = usize::from(repr.window) << self.opts.snd_shift;
        self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
        self.snd_wl1 = repr.seq;
        self.snd_wl2 = a;
        self.handshake_acked(now, repr);
        self.establish(now);
        true
    }

    /// Enters ESTABLISHED (or FIN-WAIT-1, if `close` came during the
    /// handshake) and reports `Connected`.
    pub(super) fn establish(&mut self, now: Instant) {
        self.state = State::Established;
        self.syn_pending = false;
        self.events.push_back(Event::Connected);
        self.restart_keepalive(now);
        if self.fin_seq.is_some() {
            self.state = State::FinWait1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shift_covers_buffer() {
        assert_eq!(shift_for(1000), 0);
        assert_eq!(shift_for(65535), 0);
        assert_eq!(shift_for(65536), 1);
        assert_eq!(shift_for(256 * 1024), 3);
        assert_eq!(shift_for(usize::MAX), 14);
    }
}
