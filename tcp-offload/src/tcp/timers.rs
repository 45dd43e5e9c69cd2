//! The connection's timers: retransmission (RFC 6298 §5, and SYN
//! retransmission in the handshake), delayed ACK (RFC 9293 §3.8.6.3,
//! RFC 5681 §4.2), persist for zero-window probes (RFC 9293 §3.8.6.1),
//! keepalive (RFC 9293 §3.8.4, RFC 1122 §4.2.3.6), TIME-WAIT (2·MSL,
//! RFC 9293 §3.6), RACK-TLP's reordering timer and probe timeout (RFC 8985
//! §6.3, §7.2; their logic is in `rack`), and F-RTO's wake-up (RFC 5682
//! step 2 b; in `recovery`). Each is a deadline; the driver sleeps until
//! the earliest (`poll_timeout`) and calls `handle_timeout`, which runs the
//! expired ones.

use super::connection::{Connection, PendingRst};
use super::{Event, Record, State};
use crate::time::Instant;

/// Deadlines and the counters that go with them.
#[derive(Debug, Clone, Default)]
pub(super) struct Timers {
    pub(super) rto: Option<Instant>,
    /// RACK's reordering timer.
    pub(super) reo: Option<Instant>,
    /// The tail loss probe timeout (never later than `rto`).
    pub(super) pto: Option<Instant>,
    /// F-RTO's wake-up when step 2 b found nothing new to send (see
    /// `recovery`).
    pub(super) frto: Option<Instant>,
    pub(super) delack: Option<Instant>,
    pub(super) persist: Option<Instant>,
    pub(super) keepalive: Option<Instant>,
    pub(super) time_wait: Option<Instant>,
    /// Consecutive RTO expirations without progress (SYN retransmissions
    /// during the handshake).
    pub(super) retries: u32,
    /// Probes sent since the peer's window closed.
    pub(super) persist_backoff: u32,
    /// Keepalive probes sent without an answer.
    pub(super) keepalive_sent: u32,
}

impl Timers {
    /// The earliest deadline.
    ///
    /// Compared pairwise on the fields in place: collecting the eight into
    /// an array to iterate copied 128 bytes, and this runs for every busy
    /// connection on every turn of its worker.
    pub(super) fn next(&self) -> Option<Instant> {
        let e = earlier;
        e(
            e(e(self.rto, self.reo), e(self.pto, self.frto)),
            e(
                e(self.delack, self.persist),
                e(self.keepalive, self.time_wait),
            ),
        )
    }

    pub(super) fn clear(&mut self) {
        *self = Timers::default();
    }
}

/// The earlier of two deadlines, either of which may be unset.
fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

fn due(t: Option<Instant>, now: Instant) -> bool {
    t.is_some_and(|t| t <= now)
}

impl<B: AsRef<[u8]>, R: Record> Connection<B, R> {
    pub(super) fn on_timeout(&mut self, now: Instant) {
        if self.state == State::Closed {
            return;
        }
        if due(self.timers.time_wait, now) {
            self.timers.time_wait = None;
            self.terminate(Event::Closed);
            return;
        }
        // RACK's timer may start recovery, which a probe must not precede;
        // a probe due with the RTO goes first and restarts it.
        if due(self.timers.reo, now) {
            self.timers.reo = None;
            self.on_rack_timeout(now);
        }
        if due(self.timers.pto, now) {
            self.timers.pto = None;
            self.on_pto(now);
        }
        if due(self.timers.frto, now) {
            self.timers.frto = None;
            self.on_frto_timeout();
        }
        if due(self.timers.rto, now) {
            self.timers.rto = None;
            self.on_rto(now);
            if self.state == State::Closed {
                return;
            }
        }
        if due(self.timers.delack, now) {
            self.timers.delack = None;
            self.ack_now = true;
        }
        if due(self.timers.persist, now) {
            self.timers.persist = None;
            if self.window_blocked() {
                self.probe_pending = true;
            }
        }
        if due(self.timers.keepalive, now) {
            self.timers.keepalive = None;
            self.on_keepalive(now);
        }
    }

    /// RFC 6298 §5.4-5.6: retransmit the earliest unacknowledged segment,
    /// back the timer off, and restart it. During the handshake the SYN (or
    /// SYN-ACK) is what is retransmitted.
    fn on_rto(&mut self, now: Instant) {
        match self.state {
            State::SynSent | State::SynReceived => {
                self.timers.retries += 1;
                if self.timers.retries > self.config.max_syn_retransmits {
                    self.time_out(false);
                    return;
                }
                self.stats.rto_expirations += 1;
                self.rtt.back_off();
                self.syn_pending = true;
                self.syn_sent_at = None;
                self.timers.rto = Some(now + self.rtt.rto());
            }
            _ => {
                if self.snd_una == self.snd_nxt {
                    return;
                }
                self.timers.retries += 1;
                if self.timers.retries > self.config.max_retransmits {
                    self.time_out(true);
                    return;
                }
                self.stats.rto_expirations += 1;
                self.rtt.back_off();
                self.on_rto_loss(now);
                self.timers.rto = Some(now + self.rtt.rto());
            }
        }
    }

    /// Gives up: TimedOut, CLOSED, and an RST to the peer if `rst`.
    pub(super) fn time_out(&mut self, rst: bool) {
        if rst {
            self.rst_pending = Some(PendingRst {
                seq: self.snd_nxt,
                ack: Some(self.rcv_nxt),
            });
        }
        self.terminate(Event::TimedOut);
    }

    fn on_keepalive(&mut self, now: Instant) {
        let Some(idle) = self.config.keepalive else {
            return;
        };
        if !matches!(self.state, State::Established | State::CloseWait) {
            return;
        }
        if self.timers.keepalive_sent >= self.config.keepalive_probes {
            self.time_out(true);
            return;
        }
        if self.snd_una != self.snd_nxt || self.sendq.unsent_bytes(self.snd_nxt) > 0 {
            // Data in flight has its own timer; check again later.
            self.timers.keepalive = Some(now + idle);
            return;
        }
        self.keepalive_pending = true;
        self.timers.keepalive_sent += 1;
        self.timers.keepalive = Some(now + self.config.keepalive_interval);
    }

    /// A segment arrived: the connection is not idle.
    pub(super) fn restart_keepalive(&mut self, now: Instant) {
        self.timers.keepalive_sent = 0;
        self.timers.keepalive = match self.config.keepalive {
            Some(idle) if matches!(self.state, State::Established | State::CloseWait) => {
                Some(now + idle)
            }
            _ => None,
        };
    }

    /// Payload arrived in order: ACK at once every second full-sized
    /// segment (RFC 5681 §4.2), otherwise within the delayed-ACK time.
    pub(super) fn schedule_ack(&mut self, now: Instant, len: usize) {
        self.rcv_unacked += len;
        self.rcv_mss = self.rcv_mss.max(len.min(usize::from(u16::MAX)));
        if self.config.delayed_ack.is_zero() || self.rcv_unacked >= 2 * self.rcv_mss {
            self.ack_now = true;
        } else if self.timers.delack.is_none() {
            self.timers.delack = Some(now + self.config.delayed_ack);
        }
    }

    /// Whether the sender is held back by the peer's window alone: nothing
    /// in flight (so no RTO runs) and the window is zero, or too small for
    /// the next record, which cannot be split.
    pub(super) fn window_blocked(&self) -> bool {
        if !matches!(
            self.state,
            State::Established | State::CloseWait | State::FinWait1 | State::LastAck
        ) {
            return false;
        }
        if self.snd_una != self.snd_nxt {
            return false;
        }
        if self.snd_wnd == 0 {
            return true;
        }
        let i = self.sendq.next_new();
        if i < self.sendq.len() {
            let r = self.sendq.get(i);
            let piece = r.len.min(self.eff_mss);
            return piece > self.snd_wnd;
        }
        false
    }

    /// Arms or disarms the persist timer (RFC 9293 §3.8.6.1): probes go out
    /// while the window is closed, spaced by the RTO doubled after each
    /// probe, up to `rto_max`; they never give up while the peer answers.
    pub(super) fn update_persist(&mut self, now: Instant) {
        if self.state == State::Closed {
            return;
        }
        if self.window_blocked() {
            if self.timers.persist.is_none() && !self.probe_pending {
                let base = self.rtt.base_rto();
                let shift = self.timers.persist_backoff.min(16);
                let d = base
                    .checked_mul(1u32 << shift)
                    .unwrap_or(self.config.rto_max)
                    .min(self.config.rto_max);
                self.timers.persist = Some(now + d);
            }
        } else {
            self.timers.persist = None;
            self.timers.persist_backoff = 0;
            self.probe_pending = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each of the eight deadlines, set alone or with later ones in any
    /// other field, is the one `next` returns.
    #[test]
    fn next_is_the_earliest_set_deadline() {
        let fields: [fn(&mut Timers) -> &mut Option<Instant>; 8] = [
            |t| &mut t.rto,
            |t| &mut t.reo,
            |t| &mut t.pto,
            |t| &mut t.frto,
            |t| &mut t.delack,
            |t| &mut t.persist,
            |t| &mut t.keepalive,
            |t| &mut t.time_wait,
        ];
        assert_eq!(Timers::default().next(), None);
        for (i, set) in fields.iter().enumerate() {
            let mut t = Timers::default();
            *set(&mut t) = Some(Instant::from_micros(100));
            assert_eq!(t.next(), Some(Instant::from_micros(100)), "field {i} alone");
            for (j, other) in fields.iter().enumerate() {
                if j != i {
                    *other(&mut t) = Some(Instant::from_micros(200 + j as u64));
                }
            }
            assert_eq!(t.next(), Some(Instant::from_micros(100)), "field {i} first");
            *set(&mut t) = Some(Instant::from_micros(300));
            let first_other = if i == 0 { 201 } else { 200 };
            assert_eq!(
                t.next(),
                Some(Instant::from_micros(first_other)),
                "field {i} last"
            );
        }
    }
}
