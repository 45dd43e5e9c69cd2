//! Per-connection configuration and the peer profiles used in tests.

use core::time::Duration;

/// Configuration of a connection. `Config::default()` behaves like a Linux
/// peer; [`Config::iwarp_hardware`] like the TCP of a hardware iWARP NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// MSS we announce: the largest payload we accept in one segment
    /// (interface MTU − 40).
    pub mss: u16,
    /// Receive buffer: the most payload (in order but not yet read, plus
    /// out of order) the connection holds. The advertised window never
    /// exceeds what is left of it.
    pub recv_buffer: usize,
    /// At most this many out-of-order segments are held (each is a buffer
    /// reference); more are dropped. Bounds memory per connection together
    /// with `recv_buffer`.
    pub max_ooo_segments: usize,
    /// Offer window scaling (RFC 7323 §2). The shift is the smallest that
    /// covers `recv_buffer`.
    pub window_scaling: bool,
    /// Offer and use timestamps (RFC 7323 §3, §5: RTTM and PAWS).
    pub timestamps: bool,
    /// Offer and use SACK (RFC 2018, RFC 6675).
    pub sack: bool,
    /// Initial RTO (RFC 6298 §2.1: 1 s).
    pub rto_initial: Duration,
    /// Lower bound on the RTO (RFC 6298 says 1 s; Linux uses 200 ms).
    pub rto_min: Duration,
    /// Upper bound on the RTO after backoff (RFC 6298 §2.5 allows ≥ 60 s).
    pub rto_max: Duration,
    /// Retransmissions of one segment before the connection times out.
    pub max_retransmits: u32,
    /// SYN (or SYN-ACK) retransmissions before the open times out.
    pub max_syn_retransmits: u32,
    /// Delayed-ACK timeout (RFC 9293 §3.8.6.3: under 500 ms; Linux 40 ms).
    /// Zero disables delayed ACKs.
    pub delayed_ack: Duration,
    /// Keepalive idle time before the first probe; `None` disables
    /// keepalive.
    pub keepalive: Option<Duration>,
    /// Interval between keepalive probes.
    pub keepalive_interval: Duration,
    /// Unanswered keepalive probes before the connection times out.
    pub keepalive_probes: u32,
    /// Time in TIME-WAIT (2 × MSL).
    pub time_wait: Duration,
    /// Initial congestion window in segments (RFC 6928: 10).
    pub initial_window_segments: u32,
    /// TCP segmentation offload: new records that follow one another,
    /// each as long as the first (the last at most), leave as one segment
    /// of up to this many payload bytes ([`crate::tcp::Segment::more`]),
    /// for a port that cuts it into segments of one record each. 0: every
    /// segment carries one record.
    pub train_bytes: usize,
    /// Most records in one such segment.
    pub train_records: usize,
    /// Bytes by which the port's largest cut segment falls short of the
    /// MSS. While trains are on, records are at most this much shorter
    /// than the MSS ([`crate::tcp::Connection::max_record_len`]).
    pub train_shortfall: usize,
    /// Most whole records one segment of new data carries when several
    /// are queued and fit the MSS together (RFC 5044 §5 lets a segment
    /// hold several complete FPDUs; none is split). The segment is not
    /// cut: [`crate::tcp::Train::is_pack`]. 0 or 1: a record per segment.
    pub pack_records: usize,
    /// Payload bytes one connection may send in a turn of the stack's
    /// transmit round robin before the next connection with data gets
    /// its turn; a turn always carries at least one segment, and goes on
    /// to the end of the message under way ([`crate::tcp::Record::ends_message`])
    /// up to twice this, so that a message's last segments do not wait
    /// a whole round of the other connections' turns. Longer turns
    /// keep a connection's state (and its data) in cache while it sends,
    /// which matters with thousands of busy connections; shorter ones let
    /// a connection that just got data wait less behind the others (at
    /// most twice this much from each). 0: one segment per turn.
    pub turn_bytes: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            mss: 1460,
            recv_buffer: 256 * 1024,
            max_ooo_segments: 256,
            window_scaling: true,
            timestamps: true,
            sack: true,
            rto_initial: Duration::from_secs(1),
            rto_min: Duration::from_millis(200),
            rto_max: Duration::from_secs(60),
            max_retransmits: 15,
            max_syn_retransmits: 6,
            delayed_ack: Duration::from_millis(40),
            keepalive: None,
            keepalive_interval: Duration::from_secs(75),
            keepalive_probes: 9,
            time_wait: Duration::from_secs(60),
            initial_window_segments: 10,
            train_bytes: 0,
            train_records: 0,
            train_shortfall: 0,
            pack_records: 0,
            turn_bytes: 0,
        }
    }
}

impl Config {
    /// The TCP of a hardware iWARP NIC (Chelsio T5/T6, Intel X722/E810):
    /// MSS and window scale only, no SACK, no timestamps; 256 KB window.
    pub fn iwarp_hardware() -> Config {
        Config {
            timestamps: false,
            sack: false,
            ..Config::default()
        }
    }
}
