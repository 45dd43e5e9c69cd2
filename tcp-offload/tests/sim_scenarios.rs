//! Scenario tests at the frame level: each sets up one situation on the
//! simulated wire (a dropped segment, a dead link, a stalled reader, a
//! flood) and checks the engine's reaction both in its counters and in
//! the frames it put on the wire.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use tcp_offload::tcp::Config;
use tcp_offload::wire::TcpFlags;
use tcp_offload::{Instant, SeqNumber};
use tcp_sim::bulk::{Apps, Transfer, TransferSpec, SERVER_PORT};
use tcp_sim::frame::{build_tcp_frame, drop_data_segments, peek_tcp, RawSegment, TcpView};
use tcp_sim::{Captured, DirId, DropReason, Endpoint, Fate, Host, LinkConfig, Network, Rng};

const KIB: u64 = 1024;
const LATENCY: Duration = Duration::from_millis(1);
const DEADLINE: Instant = Instant::from_millis(1_000_000);

/// Client → server only, over a clean 1 ms link, ARP pre-filled.
fn one_way(tcp: Config, bytes: u64) -> TransferSpec {
    let link = LinkConfig::perfect().with_latency(LATENCY);
    TransferSpec {
        server_bytes: 0,
        static_arp: true,
        ..TransferSpec::symmetric(7, tcp, link, bytes)
    }
}

/// The TCP frames captured on `dir`, with their capture record.
fn tcp_on(cap: &[Captured], dir: DirId) -> Vec<(&Captured, TcpView)> {
    cap.iter()
        .filter(|c| c.dir == dir)
        .filter_map(|c| peek_tcp(&c.frame).map(|v| (c, v)))
        .collect()
}

/// Data segments on `dir` that resend a sequence number already sent.
fn retransmissions(cap: &[Captured], dir: DirId) -> Vec<(Instant, TcpView)> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (c, v) in tcp_on(cap, dir) {
        if v.has_data() && !seen.insert(v.seq.0) {
            out.push((c.at, v));
        }
    }
    out
}

fn run(t: &mut Transfer) -> Instant {
    t.run(DEADLINE).unwrap_or_else(|e| {
        panic!(
            "{e}\nclient {:?}\nserver {:?}",
            t.apps.client_app, t.apps.server_app
        )
    })
}

/// Drops data segment 40 (in the third flight of slow start, when the
/// flight is long enough to produce duplicate ACKs) and returns the stats
/// and the wire facts of the recovery.
fn fast_retransmit(tcp: Config) {
    let sack = tcp.sack;
    let mut t = Transfer::new(&one_way(tcp, 512 * KIB)).unwrap();
    t.net.enable_capture();
    t.net
        .set_drop_filter(t.link.forward, Some(drop_data_segments(&[40])));
    run(&mut t);
    assert_eq!(t.apps.server_app.received, 512 * KIB);
    let s = t.apps.client_app.conn_stats;
    assert!(s.fast_retransmits >= 1, "sack={sack}: {s:?}");
    assert_eq!(s.rto_expirations, 0, "sack={sack}: {s:?}");
    assert_eq!(s.retransmits, 1, "sack={sack}: {s:?}");

    let cap = t.net.captured();
    let dropped = cap
        .iter()
        .find(|c| c.fate == Fate::Dropped(DropReason::Filter))
        .expect("a dropped segment");
    let lost = peek_tcp(&dropped.frame).unwrap().seq;
    let retx = retransmissions(cap, t.link.forward);
    assert_eq!(retx.len(), 1, "sack={sack}: {retx:?}");
    let (resent_at, resent) = retx[0];
    assert_eq!(resent.seq, lost);
    // The ACKs of the hole that reached the client before it resent.
    let acks_for_hole = tcp_on(cap, t.link.backward)
        .iter()
        .filter(|(c, v)| c.at + LATENCY <= resent_at && v.ack == lost && !v.has_data())
        .count();
    let waited = resent_at - dropped.at;
    println!(
        "sack={sack}: segment {:?} resent {waited:?} after its loss, after {acks_for_hole} ACKs \
         of the hole",
        lost
    );
    if sack {
        // RFC 6675 may declare the hole lost from a single ACK whose SACK
        // blocks cover three segments above it: one round trip suffices.
        assert!(acks_for_hole >= 1);
        assert!(
            waited <= 2 * LATENCY + Duration::from_micros(10),
            "{waited:?}"
        );
    } else {
        // One ACK that first acknowledged up to the hole, then at least
        // three duplicates.
        assert!(
            acks_for_hole >= 4,
            "resent after only {acks_for_hole} ACKs of the hole"
        );
        // Well before the RTO could have fired (200 ms at least).
        assert!(waited < Duration::from_millis(50), "{waited:?}");
    }
}

/// RFC 5681 §4.2: a receiver sends an immediate duplicate ACK for every
/// out-of-order segment. When a burst of segments arrives at one instant
/// (as a poll-mode driver hands over a batch), each out-of-order segment
/// in it must still draw its own duplicate ACK: a peer without SACK
/// (every hardware iWARP NIC) counts them to trigger fast retransmit, and
/// one ACK per burst would cost it a round trip per duplicate.
#[test]
fn each_out_of_order_segment_of_a_burst_gets_a_duplicate_ack() {
    let mut t = Transfer::new(&one_way(Config::iwarp_hardware(), 256 * KIB)).unwrap();
    t.net.enable_capture();
    t.net
        .set_drop_filter(t.link.forward, Some(drop_data_segments(&[40])));
    run(&mut t);
    let cap = t.net.captured();
    let dropped = cap
        .iter()
        .find(|c| c.fate == Fate::Dropped(DropReason::Filter))
        .unwrap();
    let hole = peek_tcp(&dropped.frame).unwrap().seq;
    // The segments sent after the hole in the same burst all arrive one
    // latency later, at the same instant.
    let burst_after_hole = tcp_on(cap, t.link.forward)
        .iter()
        .filter(|(c, v)| c.at == dropped.at && v.has_data() && v.seq.diff(hole) > 0)
        .count();
    let answer_at = dropped.at + LATENCY;
    let dupacks = tcp_on(cap, t.link.backward)
        .iter()
        .filter(|(c, v)| c.at == answer_at && v.ack == hole && !v.has_data())
        .count();
    assert!(burst_after_hole >= 3, "{burst_after_hole}");
    assert_eq!(
        dupacks, burst_after_hole,
        "{burst_after_hole} out-of-order segments arrived together and drew {dupacks} ACKs"
    );
    let s = t.apps.client_app.conn_stats;
    assert_eq!(s.fast_retransmits, 1, "{s:?}");
}

#[test]
fn three_duplicate_acks_trigger_fast_retransmit() {
    fast_retransmit(Config::iwarp_hardware());
    fast_retransmit(Config::default());
}

/// Black-holes the client's uplink in mid-transfer for `outage` and
/// returns the send times of the segment at `snd.una` during the outage.
fn blackout(tcp: Config, outage: Duration) -> (Vec<Instant>, Transfer) {
    let mut t = Transfer::new(&one_way(tcp, 1024 * KIB)).unwrap();
    t.net.enable_capture();
    let up = t.link.forward;
    let healthy = t.net.link_config(up).clone();
    let mut cut_at = None;
    let mut healed = false;
    let mut una_at_cut = None;
    t.run_until(DEADLINE, |net, apps| {
        let now = net.now();
        match cut_at {
            None if apps.client_app.acked >= 256 * KIB => {
                net.set_link_config(up, LinkConfig::black_hole());
                net.schedule_wakeup(now + outage);
                cut_at = Some(now);
                let host = net.endpoint(apps.client);
                una_at_cut = host
                    .iface()
                    .stack()
                    .conn(apps.client_conn)
                    .map(|c| c.snd_una());
            }
            Some(at) if !healed && now >= at + outage => {
                net.set_link_config(up, healthy.clone());
                healed = true;
            }
            _ => {}
        }
        apps.finished()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.apps.server_app.received, 1024 * KIB);
    let cut_at = cut_at.unwrap();
    let una = una_at_cut.unwrap();
    let sends: Vec<Instant> = tcp_on(t.net.captured(), up)
        .iter()
        .filter(|(c, v)| c.at >= cut_at && v.seq == una && v.has_data())
        .map(|(c, _)| c.at)
        .collect();
    (sends, t)
}

#[test]
fn rto_doubles_on_each_expiry_up_to_its_bound() {
    for tcp in [Config::iwarp_hardware(), Config::default()] {
        let sack = tcp.sack;
        let rto_max = tcp.rto_max;
        let (sends, t) = blackout(tcp, Duration::from_secs(250));
        let gaps: Vec<Duration> = sends.windows(2).map(|w| w[1] - w[0]).collect();
        println!("sack={sack}: retransmission gaps of the first unacknowledged segment: {gaps:?}");
        // 250 s of outage from a 200 ms-ish RTO: 0.2, 0.4, … 51.2 s, then
        // capped at 60 s.
        assert!(gaps.len() >= 10, "{gaps:?}");
        let mut capped = 0;
        for w in gaps.windows(2) {
            let (a, b) = (w[0].as_micros() as f64, w[1].as_micros() as f64);
            if w[1] >= rto_max - Duration::from_millis(1) {
                capped += 1;
                assert!(w[1] <= rto_max + Duration::from_millis(1), "{gaps:?}");
            } else {
                assert!((b / a - 2.0).abs() < 0.01, "gap {b} after {a}: {gaps:?}");
            }
        }
        assert!(capped >= 1, "the RTO never reached its bound: {gaps:?}");
        let s = t.apps.client_app.conn_stats;
        assert!(s.rto_expirations >= gaps.len() as u64, "{s:?}");
    }
}

/// The return path's delay jumps from 1 ms to 400 ms (and stays) once
/// 256 KiB are acknowledged: every ACK comes late, the retransmission
/// timer fires once (the late ACKs arrive before it would fire again), and
/// nothing was lost. Without timestamps F-RTO finds the timeout spurious
/// (here the application offers the two new records only after the
/// engine's first output poll, so the wake-up that waits for it is what
/// lets them go); with timestamps, Eifel. Either way the flight on its way
/// is not resent.
#[test]
fn a_delay_spike_on_the_return_path_is_a_spurious_timeout() {
    for tcp in [
        Config::iwarp_hardware(),
        Config {
            timestamps: false,
            ..Config::default()
        },
        Config::default(),
    ] {
        let (sack, timestamps) = (tcp.sack, tcp.timestamps);
        // A 100 Mbit/s bottleneck spaces the segments, so that the
        // receiver acknowledges every second one rather than whole bursts.
        let spec = TransferSpec {
            uplink: LinkConfig::perfect()
                .with_latency(LATENCY)
                .with_bandwidth(100_000_000),
            ..one_way(tcp, 2048 * KIB)
        };
        let mut t = Transfer::new(&spec).unwrap();
        t.net.enable_capture();
        let back = t.link.backward;
        let mut spiked = false;
        t.run_until(DEADLINE, |net, apps| {
            if !spiked && apps.client_app.acked >= 256 * KIB {
                let cfg = net
                    .link_config(back)
                    .clone()
                    .with_latency(Duration::from_millis(400));
                net.set_link_config(back, cfg);
                spiked = true;
            }
            apps.finished()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.apps.server_app.received, 2048 * KIB);
        let s = t.apps.client_app.conn_stats;
        let resent = retransmissions(t.net.captured(), t.link.forward).len();
        println!(
            "delay spike, sack={sack} timestamps={timestamps}: {resent} segments resent, {s:?}"
        );
        assert_eq!(s.rto_expirations, 1, "{s:?}");
        assert_eq!(s.spurious_rtos, 1, "{s:?}");
        // The timeout's own retransmission and a tail loss probe at most,
        // where a go-back-N would resend the flight (tens of segments).
        assert!(resent <= 2, "{resent} resent: {s:?}");
        assert_eq!(s.retransmits as usize, resent, "{s:?}");
    }
}

/// Drops data segments 40 and 44 (one flight) and returns (retransmitted
/// segments on the wire, time between the two retransmissions, stats).
fn two_losses(tcp: Config) -> (usize, Duration, tcp_offload::tcp::ConnStats) {
    let mut t = Transfer::new(&one_way(tcp, 512 * KIB)).unwrap();
    t.net.enable_capture();
    t.net
        .set_drop_filter(t.link.forward, Some(drop_data_segments(&[40, 44])));
    run(&mut t);
    assert_eq!(t.apps.server_app.received, 512 * KIB);
    let retx = retransmissions(t.net.captured(), t.link.forward);
    let gap = match retx.as_slice() {
        [a, b, ..] => b.0 - a.0,
        _ => Duration::ZERO,
    };
    (retx.len(), gap, t.apps.client_app.conn_stats)
}

#[test]
fn sack_resends_only_what_was_lost() {
    let (sack_retx, sack_gap, sack_stats) = two_losses(Config::default());
    let (reno_retx, reno_gap, reno_stats) = two_losses(Config::iwarp_hardware());
    println!(
        "two losses in one flight: SACK resent {sack_retx} segments ({sack_gap:?} apart), \
         NewReno {reno_retx} ({reno_gap:?} apart)"
    );
    assert_eq!(sack_retx, 2, "{sack_stats:?}");
    assert_eq!(sack_stats.retransmits, 2, "{sack_stats:?}");
    assert_eq!(sack_stats.rto_expirations, 0, "{sack_stats:?}");
    assert!(reno_retx >= sack_retx, "{reno_stats:?}");
    // SACK learns of both holes from the same duplicate ACKs and repairs
    // them in one round trip; NewReno learns of the second only from the
    // partial ACK a round trip later.
    let rtt = 2 * LATENCY;
    assert!(sack_gap < rtt, "{sack_gap:?}");
    assert!(reno_gap >= rtt, "{reno_gap:?}");
}

#[test]
fn zero_window_is_probed_without_data_until_the_reader_returns() {
    for tcp in [Config::iwarp_hardware(), Config::default()] {
        zero_window(tcp);
    }
}

fn zero_window(tcp: Config) {
    let sack = tcp.sack;
    let bytes = 1024 * KIB;
    let mut t = Transfer::new(&one_way(tcp, bytes)).unwrap();
    t.net.enable_capture();
    t.apps.server_app.reading = false;
    let stall = Duration::from_secs(10);
    let mut zero_at = None;
    t.run_until(DEADLINE, |net, apps| {
        let now = net.now();
        let host = net.endpoint(apps.client);
        let conn = host.iface().stack().conn(apps.client_conn);
        match zero_at {
            None => {
                if let Some(c) = conn {
                    if c.peer_window() == 0 && apps.client_app.acked > 0 {
                        assert_eq!(c.send_capacity(), 0);
                        zero_at = Some(now);
                        net.schedule_wakeup(now + stall);
                    }
                }
            }
            Some(at) if now >= at + stall => apps.server_app.reading = true,
            Some(_) => {}
        }
        apps.finished()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.apps.server_app.received, bytes);
    let zero_at = zero_at.expect("the window never closed");

    // On the wire, during the stall: every client segment is a probe with
    // no payload and seq = snd.una − 1, where snd.una is the server's
    // latest acknowledgment; the server keeps advertising a zero window.
    let cap = t.net.captured();
    let (up, down) = (t.link.forward, t.link.backward);
    let mut una = SeqNumber(0);
    let mut probes = Vec::new();
    let mut zero_windows = 0;
    let mut events: Vec<(Instant, bool, TcpView)> = tcp_on(cap, up)
        .into_iter()
        .map(|(c, v)| (c.at, true, v))
        .chain(
            tcp_on(cap, down)
                .into_iter()
                .map(|(c, v)| (c.at + LATENCY, false, v)),
        )
        .collect();
    events.sort_by_key(|e| e.0);
    for (at, from_client, v) in events {
        if !from_client {
            una = v.ack;
            if v.window == 0 && at > zero_at && at < zero_at + stall {
                zero_windows += 1;
            }
            continue;
        }
        if at <= zero_at + Duration::from_millis(5) || at >= zero_at + stall {
            continue;
        }
        assert!(
            !v.has_data(),
            "sack={sack}: data sent into a zero window at {at}: {v:?}"
        );
        if v.seq == una - 1 {
            probes.push(at);
        }
    }
    let s = t.apps.client_app.conn_stats;
    println!(
        "sack={sack}: window closed at {zero_at}, {} probes in the {stall:?} stall at {probes:?}; \
         {zero_windows} zero-window ACKs; stats {s:?}",
        probes.len()
    );
    assert!(probes.len() >= 3, "sack={sack}: {probes:?}");
    assert!(s.window_probes >= probes.len() as u64, "{s:?}");
    assert!(zero_windows >= probes.len(), "every probe is answered");
    // The persist timer backs off.
    let gaps: Vec<Duration> = probes.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
    assert!(gaps.last() > gaps.first(), "{gaps:?}");
}

/// A host that floods a listener with SYNs from random addresses and
/// ports, answers every ARP request for an address it forged, and counts
/// what comes back. It never completes a handshake.
#[derive(Debug)]
struct SynFlooder {
    mac: [u8; 6],
    target_mac: [u8; 6],
    target: SocketAddrV4,
    rng: Rng,
    /// How many distinct source addresses to forge (from 10.1.0.0).
    pool: u64,
    /// SYNs still to send, one per `interval`.
    remaining: u64,
    interval: Duration,
    next: Option<Instant>,
    outbox: VecDeque<Vec<u8>>,
    sent: u64,
    syn_acks: u64,
    rsts: u64,
    arp_replies: u64,
}

impl SynFlooder {
    fn forged_ip(&mut self) -> Ipv4Addr {
        // In 10.1.0.0/16: the genuine hosts are 10.0.0.x.
        let x = self.rng.below(self.pool.min(1 << 16)) as u16;
        Ipv4Addr::new(10, 1, (x >> 8) as u8, x as u8)
    }

    fn syn(&mut self) -> Vec<u8> {
        let src = SocketAddrV4::new(self.forged_ip(), 1024 + self.rng.below(60_000) as u16);
        build_tcp_frame(&RawSegment {
            src_mac: self.mac,
            dst_mac: self.target_mac,
            src,
            dst: self.target,
            seq: SeqNumber(self.rng.next_u64() as u32),
            ack: SeqNumber(0),
            flags: TcpFlags::SYN,
            window: 65535,
            mss: Some(1460),
            payload: &[],
        })
    }

    /// An ARP reply claiming `ip` for the flooder, if `frame` is a request
    /// for a forged address.
    fn arp_reply(&self, frame: &[u8]) -> Option<Vec<u8>> {
        if frame.len() < 42 || frame[12..14] != [0x08, 0x06] || frame[20..22] != [0, 1] {
            return None;
        }
        let (sha, spa, tpa) = (&frame[22..28], &frame[28..32], &frame[38..42]);
        if tpa[0..2] != [10, 1] {
            return None;
        }
        let mut r = vec![0u8; 60];
        r[0..6].copy_from_slice(sha);
        r[6..12].copy_from_slice(&self.mac);
        r[12..14].copy_from_slice(&[0x08, 0x06]);
        r[14..22].copy_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 2]);
        r[22..28].copy_from_slice(&self.mac);
        r[28..32].copy_from_slice(tpa);
        r[32..38].copy_from_slice(sha);
        r[38..42].copy_from_slice(spa);
        Some(r)
    }
}

impl Endpoint for SynFlooder {
    fn handle_frame(&mut self, _now: Instant, frame: Vec<u8>) {
        if let Some(reply) = self.arp_reply(&frame) {
            self.arp_replies += 1;
            self.outbox.push_back(reply);
        } else if let Some(v) = peek_tcp(&frame) {
            if v.has(TcpFlags::SYN | TcpFlags::ACK) {
                self.syn_acks += 1;
            } else if v.has(TcpFlags::RST) {
                self.rsts += 1;
            }
        }
    }
    fn poll_frame(&mut self, _now: Instant) -> Option<Vec<u8>> {
        self.outbox.pop_front()
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        self.next
    }
    fn handle_timeout(&mut self, now: Instant) {
        if self.remaining > 0 {
            let f = self.syn();
            self.outbox.push_back(f);
            self.remaining -= 1;
            self.sent += 1;
        }
        self.next = (self.remaining > 0).then(|| now + self.interval);
    }
}

#[derive(Debug)]
// Three nodes per test: boxing the host would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Node {
    Host(Host),
    Flooder(SynFlooder),
}

impl Node {
    fn host(&self) -> &Host {
        match self {
            Node::Host(h) => h,
            Node::Flooder(_) => panic!("not a host"),
        }
    }
    fn host_mut(&mut self) -> &mut Host {
        match self {
            Node::Host(h) => h,
            Node::Flooder(_) => panic!("not a host"),
        }
    }
}

impl Endpoint for Node {
    fn handle_frame(&mut self, now: Instant, frame: Vec<u8>) {
        match self {
            Node::Host(h) => h.handle_frame(now, frame),
            Node::Flooder(f) => f.handle_frame(now, frame),
        }
    }
    fn poll_frame(&mut self, now: Instant) -> Option<Vec<u8>> {
        match self {
            Node::Host(h) => h.poll_frame(now),
            Node::Flooder(f) => f.poll_frame(now),
        }
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        match self {
            Node::Host(h) => h.poll_timeout(),
            Node::Flooder(f) => f.poll_timeout(),
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        match self {
            Node::Host(h) => h.handle_timeout(now),
            Node::Flooder(f) => f.handle_timeout(now),
        }
    }
}

/// Floods the listener with 20 000 SYNs from `pool` forged addresses while
/// a genuine client connects and moves 256 KiB each way.
fn syn_flood(pool: u64) {
    const FLOOD: u64 = 20_000;
    const BACKLOG: usize = 16;
    let seed = 99;
    let mut net: Network<Node> = Network::new(seed);
    let sw = net.add_switch();
    let client = net.add_endpoint(Node::Host(Host::numbered(1, Config::default(), seed)));
    let server = net.add_endpoint(Node::Host(Host::numbered(2, Config::default(), seed)));
    let server_addr = SocketAddrV4::new(Host::ip_of(2), SERVER_PORT);
    let flooder = net.add_endpoint(Node::Flooder(SynFlooder {
        mac: [0x02, 0xee, 0, 0, 0, 1],
        target_mac: Host::mac_of(2).0,
        target: server_addr,
        rng: Rng::new(seed),
        pool,
        remaining: FLOOD,
        // 50 000 SYNs per second, over 0.4 s.
        interval: Duration::from_micros(20),
        next: Some(Instant::ZERO),
        outbox: VecDeque::new(),
        sent: 0,
        syn_acks: 0,
        rsts: 0,
        arp_replies: 0,
    }));
    for n in [client, server, flooder] {
        net.connect(
            n,
            sw,
            LinkConfig::perfect().with_latency(Duration::from_micros(200)),
        );
    }
    net.endpoint_mut(server)
        .host_mut()
        .iface_mut()
        .stack_mut()
        .listen(server_addr, BACKLOG)
        .unwrap();

    // Let the flood build up, then connect the genuine client in its midst.
    let start = Instant::from_millis(100);
    net.run_until(start, |_| false).unwrap_err();
    let spec = TransferSpec {
        static_arp: false,
        ..TransferSpec::symmetric(seed, Config::default(), LinkConfig::perfect(), 256 * KIB)
    };
    let client_conn = net
        .endpoint_mut(client)
        .host_mut()
        .iface_mut()
        .stack_mut()
        .connect(start, Host::ip_of(1), server_addr)
        .unwrap();
    let mut apps = Apps::new(&spec, client, server, client_conn);
    let mut max_conns = 0;
    let mut accepted_at = None;
    let mut error = None;
    let finished = net.run_until(DEADLINE, |net| {
        let now = net.now();
        let (c, s) = net.endpoint_pair_mut(client, server);
        let (c, s) = (c.host_mut(), s.host_mut());
        if let Err(e) = apps.step_stacks(now, c.iface_mut().stack_mut(), s.iface_mut().stack_mut())
        {
            error = Some(e);
            return true;
        }
        if accepted_at.is_none() && apps.server_conn.is_some() {
            accepted_at = Some(now);
        }
        max_conns = max_conns.max(s.iface().stack().len());
        apps.finished()
    });
    if let Some(e) = error {
        panic!("{e}");
    }
    let finished = finished.unwrap_or_else(|e| panic!("{e}: {apps:?}"));
    let accepted_at = accepted_at.expect("the genuine client was never accepted");

    let Node::Flooder(f) = net.endpoint(flooder) else {
        unreachable!()
    };
    let server_host = net.endpoint(server).host();
    let st = *server_host.iface().stack().stats();
    let iface = *server_host.iface().stats();
    println!(
        "SYN flood from {pool} addresses: {} SYNs sent, {} SYN-ACKs and {} RSTs back, {} ARP replies forged; \
         server stack {st:?}; at most {max_conns} connections held; genuine client accepted \
         {:?} after its connect, transfer finished at {finished}; server interface {iface:?}",
        f.sent,
        f.syn_acks,
        f.rsts,
        f.arp_replies,
        accepted_at - start,
    );
    assert_eq!(f.sent, FLOOD);
    assert_eq!(apps.server_app.received, 256 * KIB);
    assert_eq!(apps.client_app.received, 256 * KIB);
    assert!(st.syns_received >= FLOOD, "{st:?}");
    assert!(
        st.cookies_sent > 0,
        "the listener never fell back to cookies: {st:?}"
    );
    // Connection state stays bounded by the backlog (half-open plus
    // accept queue) plus the genuine connection.
    assert!(max_conns <= 2 * BACKLOG + 1, "{max_conns} connections held");
    // The flood did not cost the genuine client a SYN retransmission (the
    // first would come after 1 s): its handshake went through at once,
    // through a cookie if the backlog was full.
    assert!(
        accepted_at - start < Duration::from_millis(500),
        "{:?}",
        accepted_at - start
    );
    if pool <= 16 {
        // Few enough forged addresses for ARP to resolve them all: the
        // cookies went out on the wire.
        assert!(f.syn_acks * 2 > FLOOD, "{} SYN-ACKs", f.syn_acks);
    }
}

#[test]
fn syn_flood_from_many_addresses_does_not_stop_an_accept() {
    syn_flood(1 << 16);
}

#[test]
fn syn_flood_from_few_addresses_does_not_stop_an_accept() {
    syn_flood(8);
}

/// The path MTU shrinks from 1500 to 1000 in mid-transfer. The link drops
/// what no longer fits; the test, playing the ICMP "fragmentation needed"
/// message, lowers the client's MSS to 960. Records already sent are
/// resent in segments of the new size (the receiver reassembles them, as
/// MPA receivers must), new records are sized to it, and every byte still
/// arrives.
fn path_mtu_shrinks(tcp: Config) {
    let sack = tcp.sack;
    const NEW_MTU: usize = 1000;
    let bytes = 1024 * KIB;
    let mut t = Transfer::new(&one_way(tcp, bytes)).unwrap();
    t.net.enable_capture();
    let up = t.link.forward;
    // The "fragmentation needed" message takes a while to come back: the
    // client sends full-sized segments into the smaller MTU until then.
    let icmp_delay = Duration::from_millis(3);
    let mut shrunk_at = None;
    let mut told = false;
    t.run_until(DEADLINE, |net, apps| {
        let now = net.now();
        match shrunk_at {
            None if apps.client_app.acked >= 256 * KIB => {
                let cfg = net.link_config(up).clone().with_mtu(NEW_MTU);
                net.set_link_config(up, cfg);
                net.schedule_wakeup(now + icmp_delay);
                shrunk_at = Some(now);
            }
            Some(at) if !told && now >= at + icmp_delay => {
                let id = apps.client_conn;
                let stack = net.endpoint_mut(apps.client).iface_mut().stack_mut();
                let conn = stack.conn_mut(id).expect("client connection");
                conn.set_path_mtu_mss((NEW_MTU - 40) as u16);
                assert!(conn.max_record_len() <= NEW_MTU - 40);
                told = true;
            }
            _ => {}
        }
        apps.finished()
    })
    .unwrap_or_else(|e| panic!("sack={sack}: {e}"));
    assert_eq!(t.apps.server_app.received, bytes);
    let shrunk_at = shrunk_at.unwrap();
    let s = t.apps.client_app.conn_stats;
    let too_big = t.net.link_stats(up).dropped_mtu;
    let after: Vec<&Captured> = t
        .net
        .captured()
        .iter()
        .filter(|c| c.dir == up && c.at > shrunk_at + icmp_delay)
        .collect();
    let largest = after.iter().map(|c| c.frame.len()).max().unwrap_or(0);
    println!(
        "sack={sack}: MTU 1500 → {NEW_MTU} at {shrunk_at}: {too_big} frames too big for the link, \
         {} records resent split, largest frame afterwards {largest} bytes; {s:?}",
        s.records_split
    );
    // Whatever was in flight when the MTU fell was too big, and is resent
    // split; nothing sent afterwards exceeds the new MTU.
    assert!(too_big > 0);
    assert!(s.records_split >= 1, "{s:?}");
    assert!(
        largest <= NEW_MTU + 14,
        "a {largest}-byte frame after the MTU fell"
    );
}

#[test]
fn records_are_resent_split_when_the_path_mtu_shrinks() {
    path_mtu_shrinks(Config::iwarp_hardware());
    path_mtu_shrinks(Config::default());
}

/// The TSval of a captured TCP frame.
fn tsval_of(frame: &[u8]) -> Option<u32> {
    use tcp_offload::wire::{Checksum, TcpPacket, TcpRepr};
    let v = peek_tcp(frame)?;
    let ihl = usize::from(frame.get(14)? & 0x0f) * 4;
    let tcp = frame.get(14 + ihl..v.payload_offset + v.payload_len)?;
    let pkt = TcpPacket::new_checked(tcp).ok()?;
    let repr = TcpRepr::parse(&pkt, *v.src.ip(), *v.dst.ip(), Checksum::Trusted).ok()?;
    Some(repr.options.timestamp?.tsval)
}

/// A fast retransmission overtakes originals that a reordering path held
/// back (as netem's `reorder` does): the retransmission is in sequence,
/// so its TSval, one tick newer than theirs, becomes TS.Recent, and the
/// originals, right after it in sequence, arrive one tick "old". Strict
/// RFC 7323 PAWS drops them and the sender has to resend them; Linux's
/// one-tick PAWS window (and ours, [`tcp_offload::tcp::PAWS_WINDOW`])
/// takes them.
fn retransmission_overtakes_held_originals(tcp: Config) {
    use std::cell::RefCell;
    use std::rc::Rc;

    let sack = tcp.sack;
    // Latency under half a millisecond: the fast retransmission leaves
    // within one round trip, less than a tick of the 1 ms timestamp
    // clock after the originals.
    let latency = Duration::from_micros(300);
    let spec = TransferSpec {
        server_bytes: 0,
        static_arp: true,
        ..TransferSpec::symmetric(
            11,
            tcp,
            LinkConfig::perfect().with_latency(latency),
            512 * KIB,
        )
    };
    let mut t = Transfer::new(&spec).unwrap();
    t.net.enable_capture();
    // Data segment LOST is lost; HELD more right after it are held back
    // until its retransmission goes out, then let through behind it.
    const LOST: u64 = 40;
    const HELD: u64 = 4;
    #[derive(Default)]
    struct Hold {
        seen: u64,
        lost: Option<SeqNumber>,
        held: Vec<Vec<u8>>,
        released: bool,
    }
    let hold = Rc::new(RefCell::new(Hold::default()));
    let h = Rc::clone(&hold);
    t.net.set_drop_filter(
        t.link.forward,
        Some(Box::new(move |_now, frame| {
            let mut h = h.borrow_mut();
            let Some(v) = peek_tcp(frame) else {
                return false;
            };
            if !v.has_data() || h.released {
                return false;
            }
            let i = h.seen;
            h.seen += 1;
            if i == LOST {
                h.lost = Some(v.seq);
                return true;
            }
            if i > LOST && i <= LOST + HELD {
                h.held.push(frame.to_vec());
                return true;
            }
            false
        })),
    );
    let up = t.link.forward;
    let mut premise = None;
    t.run_until(DEADLINE, |net, apps| {
        let released = hold.borrow().released;
        if !released {
            let lost = hold.borrow().lost;
            let resent = lost.and_then(|seq| {
                net.captured()
                    .iter()
                    .filter(|c| c.dir == up)
                    .filter(|c| peek_tcp(&c.frame).is_some_and(|v| v.seq == seq))
                    .nth(1)
                    .map(|c| tsval_of(&c.frame))
            });
            if let Some(resent_ts) = resent {
                let mut h = hold.borrow_mut();
                h.released = true;
                let held = std::mem::take(&mut h.held);
                drop(h);
                assert_eq!(held.len() as u64, HELD, "sack={sack}");
                premise = Some((tsval_of(&held[0]), resent_ts));
                for f in held {
                    net.inject(up, f);
                }
            }
        }
        apps.finished()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.apps.server_app.received, 512 * KIB, "sack={sack}");
    let (orig_ts, resent_ts) = premise.expect("the lost segment was retransmitted");
    let (orig_ts, resent_ts) = (orig_ts.unwrap(), resent_ts.unwrap());
    assert_eq!(
        resent_ts.wrapping_sub(orig_ts),
        1,
        "sack={sack}: the retransmission is one tick newer than the held originals"
    );
    let server = t.apps.server_app.conn_stats;
    let client = t.apps.client_app.conn_stats;
    println!("sack={sack}: server {server:?}\nclient {client:?}");
    assert_eq!(server.paws_dropped, 0, "sack={sack}: {server:?}");
    assert!(server.paws_tolerated >= 1, "sack={sack}: {server:?}");
    // With SACK, RFC 6675 declares the held segments lost as soon as
    // three segments above them are SACKed and resends them right behind
    // the hole: the originals then come in as duplicates, dropped as such
    // and not by PAWS, and what is resent is the sender's choice.
    if !sack {
        // Only the lost segment was sent again: the held originals were
        // taken. (With strict PAWS, NewReno resends each of them on a
        // partial ACK.)
        assert_eq!(client.retransmits, 1, "{client:?}");
    }
    assert_eq!(client.rto_expirations, 0, "sack={sack}: {client:?}");
}

#[test]
fn retransmission_overtaking_held_originals_passes_paws() {
    let no_sack = Config {
        sack: false,
        ..Config::default()
    };
    retransmission_overtakes_held_originals(no_sack);
    retransmission_overtakes_held_originals(Config::default());
}
