//! perftest's `-R` control exchange against the real thing: the control
//! connections of the siw↔siw perftest captures in
//! `deploy/interop/captures/` are replayed into our exchange, each side
//! in turn — fed the client's messages, our server must answer each with a
//! message of the shape perftest's server sent (same length; the same
//! bytes where perftest's content does not depend on the host: version,
//! cycle buffer, cache line, MTU, zeroed syncs; the same `pingpong_dest`
//! fields where they are not addresses, keys or QP numbers; and the same
//! pattern of repeats, so that a sync is sent where perftest sends one and
//! a per-QP round where it sends one); fed the server's, our client must
//! do likewise. Any message perftest does not send, or a missing one,
//! fails, and so does a data connection or a run that starts after a
//! different number of exchanges than in the capture (read off the
//! capture's frame order). The control streams are embedded
//! (`perftest_replay/golden.rs`), and the copies are checked against the
//! captures, which are fixtures of the repository (a missing one fails).
//!
//! Then the whole session end to end: two dataplanes over an in-memory
//! link, `Session::server` and `Session::client` on two threads, every
//! test kind with one and two data QPs, each side learning exactly the
//! buffers the other advertised.

#[path = "../../tests/runtime_common/mod.rs"]
mod runtime_common;

#[path = "perftest_replay/golden.rs"]
mod golden;

use std::net::SocketAddrV4;
use std::time::Duration;

use dataplane::api::{Access, Dataplane, DriveMode, Qp, QpOptions, QpStatus, Region};
use dataplane::capture::CaptureOptions;
use iwarp::perftest::exchange::{script, Action, Exchange, Local, Side, ALL_SIZES};
use iwarp::perftest::wire::{Dest, DestLayout};
use iwarp::perftest::{client_awaits_server_close, BwFigures, Session, SessionParams};
use iwarp::runner::{RemoteBuf, TestKind};
use pcap_kit::{Reader, Reassembler};
use rdmap::mpa::deframe::{DeframeEvent, Deframer};
use rdmap::mpa::frame::{FrameRepr, REQUEST_KEY};
use rdmap::wire::{DdpRepr, RdmapOpcode};
use runtime_common::{Pair, PairOptions, IP_B, PORT};

/// The Send messages of one direction of an MPA connection, in order,
/// and the stream offset just past each.
fn sends(stream: &[u8], what: &str) -> (Vec<Vec<u8>>, Vec<usize>) {
    let (frame, skip) = FrameRepr::parse_prefix(stream).unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let mut d = Deframer::new(frame.crc, frame.markers, u16::MAX);
    let mut input = &stream[skip..];
    let mut ulpdus: Vec<(Vec<u8>, bool)> = Vec::new();
    let mut ends = Vec::new();
    while let Some(ev) = d
        .next_event(&mut input)
        .unwrap_or_else(|e| panic!("{what}: deframe error {e:?}"))
    {
        match ev {
            DeframeEvent::UlpduStart { .. } => ulpdus.push((Vec::new(), false)),
            DeframeEvent::Bytes(b) => ulpdus.last_mut().unwrap().0.extend_from_slice(b),
            DeframeEvent::UlpduEnd { .. } => {
                ulpdus.last_mut().unwrap().1 = true;
                ends.push(stream.len() - input.len());
            }
        }
    }
    let mut msg_ends = Vec::new();
    let mut msgs = Vec::new();
    let mut open: Vec<u8> = Vec::new();
    for ((u, _), end) in ulpdus.iter().filter(|(_, whole)| *whole).zip(&ends) {
        let (repr, hl) = DdpRepr::parse_ulpdu(u).unwrap_or_else(|e| panic!("{what}: {e:?}"));
        match repr {
            DdpRepr::Untagged {
                opcode: RdmapOpcode::Send,
                last,
                mo,
                ..
            } => {
                assert_eq!(mo as usize, open.len(), "{what}: Send segments in order");
                open.extend_from_slice(&u[hl..]);
                if last {
                    msgs.push(core::mem::take(&mut open));
                    msg_ends.push(*end);
                }
            }
            other => panic!("{what}: the control connection carries only Sends, not {other:?}"),
        }
    }
    (msgs, msg_ends)
}

/// Where perftest's data connections and data traffic start, counted in
/// control exchanges completed before them (both directions' messages
/// wholly sent, by TCP sequence): read off the capture's frame order.
struct Timeline {
    /// Exchanges before the first data connection's SYN.
    connect_at: usize,
    /// Exchanges before the first byte after the MPA frames on a data
    /// connection.
    run_at: usize,
}

/// (source port, destination port, SYN, sequence number, payload) of an
/// Ethernet/IPv4/TCP frame.
fn tcp_of(frame: &[u8]) -> Option<(u16, u16, bool, u32, &[u8])> {
    if frame.get(12..14)? != [0x08, 0x00] {
        return None;
    }
    let ip = frame.get(14..)?;
    let ihl = usize::from(ip.first()? & 0x0f) * 4;
    if *ip.get(9)? != 6 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let tcp = ip.get(ihl..total)?;
    let doff = usize::from(tcp.get(12)? >> 4) * 4;
    let be16 = |o: usize| u16::from_be_bytes([tcp[o], tcp[o + 1]]);
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    Some((be16(0), be16(2), tcp[13] & 0x02 != 0, seq, tcp.get(doff..)?))
}

fn timeline(records: &[pcap_kit::Record<'_>], ctl: &Control) -> Timeline {
    use std::collections::HashMap;
    let (cport, sport) = ctl.ports;
    // Per direction of every connection: ISN, and (control) bytes sent.
    let mut isn: HashMap<(u16, u16), u32> = HashMap::new();
    let mut sent = [0usize; 2];
    let done = |sent: &[usize; 2]| {
        let c = ctl.client_ends.iter().filter(|&&e| e <= sent[0]).count();
        let s = ctl.server_ends.iter().filter(|&&e| e <= sent[1]).count();
        c.min(s)
    };
    let mut connect_at = None;
    for r in records {
        let Some((src, dst, syn, seq, payload)) = tcp_of(r.data) else {
            continue;
        };
        if syn {
            isn.insert((src, dst), seq);
            if dst == sport && src != cport && connect_at.is_none() {
                connect_at = Some(done(&sent));
            }
            continue;
        }
        let Some(&i) = isn.get(&(src, dst)) else {
            continue;
        };
        if payload.is_empty() {
            continue;
        }
        let off = seq.wrapping_sub(i).wrapping_sub(1) as usize;
        if (src, dst) == (cport, sport) {
            sent[0] = sent[0].max(off + payload.len());
        } else if (src, dst) == (sport, cport) {
            sent[1] = sent[1].max(off + payload.len());
        } else if (src == sport || dst == sport) && off >= MPA_FRAME_LEN {
            return Timeline {
                connect_at: connect_at.expect("a data connection's SYN"),
                run_at: done(&sent),
            };
        }
    }
    panic!("no data traffic in the capture")
}

/// perftest's MPA frames: 20 bytes and 4 of IRD/ORD.
const MPA_FRAME_LEN: usize = 24;

/// The control connection of a capture: the client's and the server's
/// messages, and whether each direction was captured to its end.
struct Control {
    client: Vec<Vec<u8>>,
    server: Vec<Vec<u8>>,
    client_ends: Vec<usize>,
    server_ends: Vec<usize>,
    /// (client port, server port).
    ports: (u16, u16),
    timeline: Option<Timeline>,
    complete: bool,
    /// MPA connections in the capture after the control connection.
    data_connections: usize,
}

/// The control connection of capture `name`, read from the capture.
fn captured(name: &str) -> Control {
    let path = runtime_common::siw_capture(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let records = Reader::read_all(&bytes).expect("capture reads");
    let conns = Reassembler::from_records(records.clone());
    let mpa: Vec<_> = conns
        .iter()
        .filter(|c| c.streams[0].prefix().starts_with(REQUEST_KEY))
        .collect();
    let ctl = mpa
        .first()
        .unwrap_or_else(|| panic!("{name}: no MPA connection"));
    let [up, down] = &ctl.streams;
    let (client, client_ends) = sends(up.prefix(), &format!("{name} client"));
    let (server, server_ends) = sends(down.prefix(), &format!("{name} server"));
    let mut c = Control {
        client,
        server,
        client_ends,
        server_ends,
        ports: (up.src.port(), up.dst.port()),
        timeline: None,
        // Whole, up to both FINs (the bandwidth captures were cut short).
        complete: up.is_complete() && down.is_complete() && up.fin.is_some() && down.fin.is_some(),
        data_connections: mpa.len() - 1,
    };
    c.timeline = Some(timeline(&records, &c));
    c
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The control connection of capture `name`, from the embedded copy.
fn control(name: &str) -> Control {
    let g = golden::GOLDEN
        .iter()
        .find(|g| g.name == name)
        .unwrap_or_else(|| panic!("{name}: no golden copy"));
    let msgs = |l: &[&str]| l.iter().map(|m| unhex(m)).collect::<Vec<_>>();
    Control {
        client: msgs(g.client),
        server: msgs(g.server),
        client_ends: Vec::new(),
        server_ends: Vec::new(),
        ports: (0, 0),
        timeline: Some(Timeline {
            connect_at: g.connect_at,
            run_at: g.run_at,
        }),
        complete: g.complete,
        data_connections: 1,
    }
}

/// The embedded copies are what the captures hold.
#[test]
fn golden_matches_the_captures() {
    for g in &golden::GOLDEN {
        let c = captured(g.name);
        let e = control(g.name);
        assert_eq!(c.client, e.client, "{}: client", g.name);
        assert_eq!(c.server, e.server, "{}: server", g.name);
        let (t, u) = (c.timeline.unwrap(), e.timeline.unwrap());
        assert_eq!(
            (t.connect_at, t.run_at),
            (u.connect_at, u.run_at),
            "{}",
            g.name
        );
        assert_eq!(c.complete, e.complete, "{}", g.name);
        assert_eq!(c.data_connections, 1, "{}: one data connection", g.name);
        println!("{}: the embedded copy matches the capture", g.name);
    }
}

/// Our side's dests in the replay: values no capture has.
fn our_dests(out_reads: u32) -> Vec<Dest> {
    let mut gid = [0u8; 16];
    gid[..6].copy_from_slice(&[2, 0, 0, 0, 0, 0x0a]);
    vec![Dest {
        out_reads,
        qpn: 0x77,
        psn: 0x12_3456,
        rkey: 0x00ab_cd00,
        vaddr: 0x1000_0000,
        gid,
        ..Dest::default()
    }]
}

/// `ours` has the shape of `theirs` (perftest's message at the same
/// position of the same side).
fn same_shape(what: &str, ours: &[u8], theirs: &[u8]) {
    assert_eq!(ours.len(), theirs.len(), "{what}: length");
    match theirs.len() {
        // Version, cycle buffer, cache line, MTU: host-independent here.
        16 | 4 | 2 => assert_eq!(ours, theirs, "{what}: content"),
        56 => {
            let o = Dest::parse(ours, DestLayout::V45).unwrap();
            let t = Dest::parse(theirs, DestLayout::V45).unwrap();
            if t == Dest::default() {
                assert_eq!(o, t, "{what}: a zeroed sync");
            } else {
                assert_ne!(o, Dest::default(), "{what}: a real pingpong_dest");
                assert_eq!(
                    (o.lid, o.out_reads, o.srqn, o.gid_index),
                    (t.lid, t.out_reads, t.srqn, t.gid_index),
                    "{what}: lid, out_reads, srqn, gid_index"
                );
                assert_eq!(o.gid[6..], t.gid[6..], "{what}: gid beyond the MAC");
            }
        }
        8 => {}
        n => panic!("{what}: perftest sent a {n}-byte message"),
    }
}

/// Which messages of a list repeat which earlier one (padding ignored):
/// the pattern of rounds and syncs.
fn repeats(msgs: &[Vec<u8>]) -> Vec<Option<usize>> {
    let norm = |m: &Vec<u8>| {
        let mut m = m.clone();
        if m.len() == 56 {
            m[20..24].fill(0);
        }
        m
    };
    // Report fields carry figures (perftest's server sends garbage).
    (0..msgs.len())
        .map(|i| {
            (msgs[i].len() != 8)
                .then(|| (0..i).find(|&j| norm(&msgs[j]) == norm(&msgs[i])))
                .flatten()
        })
        .collect()
}

struct Replayed {
    ours: Vec<Vec<u8>>,
    points: Vec<(usize, Action)>,
    at_end: Action,
    x: Exchange,
}

/// Feeds `side`'s exchange the peer's messages of the capture; returns
/// what it sent and where its caller would have acted.
fn replay(side: Side, test: TestKind, peer_msgs: &[Vec<u8>], out_reads: u32) -> Replayed {
    let mut x = Exchange::new(
        side,
        script(test, 1, 1),
        Local {
            dests: our_dests(out_reads),
            mtu_code: 3,
        },
    );
    let mut ours = Vec::new();
    let mut points = Vec::new();
    let mut fed = 0;
    let at_end = loop {
        match x.action() {
            Action::Send(m) => ours.push(m),
            Action::Receive(what) => {
                let Some(m) = peer_msgs.get(fed) else {
                    break Action::Receive(what);
                };
                x.received(m)
                    .unwrap_or_else(|e| panic!("{test:?} {side:?}: message {fed}: {e}"));
                fed += 1;
            }
            Action::Done => break Action::Done,
            a => {
                points.push((ours.len(), a));
                x.proceed();
            }
        }
    };
    assert_eq!(
        fed,
        peer_msgs.len(),
        "{test:?} {side:?}: perftest sent messages past our script's end"
    );
    Replayed {
        ours,
        points,
        at_end,
        x,
    }
}

fn replay_capture(name: &str, test: TestKind) {
    let c = control(name);
    let out_reads = if matches!(test, TestKind::ReadBw | TestKind::ReadLat) {
        128
    } else {
        1
    };
    assert!(c.data_connections >= 1, "{name}: the data connection");
    assert_eq!(
        c.client.len(),
        c.server.len(),
        "{name}: perftest ping-pongs"
    );
    let theirs_server = repeats(&c.server);
    let theirs_client = repeats(&c.client);
    for (side, peer, mine, pattern) in [
        (Side::Server, &c.client, &c.server, &theirs_server),
        (Side::Client, &c.server, &c.client, &theirs_client),
    ] {
        let r = replay(side, test, peer, out_reads);
        let what = format!("{name} as {side:?}");
        // A client sends before it reads: past the capture's end it has
        // sent one more, which the truncated capture lacks.
        let n = mine.len();
        assert!(
            r.ours.len() >= n,
            "{what}: {} messages, perftest {n}",
            r.ours.len()
        );
        for (i, (o, t)) in r.ours.iter().zip(mine).enumerate() {
            same_shape(&format!("{what}, message {i}"), o, t);
        }
        assert_eq!(&repeats(&r.ours[..n]), pattern, "{what}: rounds and syncs");
        // The data connections come after the fifth exchange (the zeroed
        // sync), and the run after the last setup message perftest sends.
        // The data connections and the run start after as many exchanges
        // as perftest's did in the capture.
        let t = c.timeline.as_ref().unwrap();
        assert_eq!(
            r.points.get(..2),
            Some(&[(t.connect_at, Action::ConnectData), (t.run_at, Action::Run)][..]),
            "{what}: data connections and run"
        );
        let run_at = t.run_at;
        if c.complete {
            assert_eq!(r.at_end, Action::Done, "{what}: perftest's exchange ended");
            assert_eq!(r.ours.len(), n, "{what}: as many messages as perftest");
        }
        // It learnt perftest's own dest.
        let last_dest = peer
            .iter()
            .rev()
            .find(|m| m.len() == 56 && m.iter().any(|&b| b != 0));
        let learnt = r.x.peer().dests[0].expect("peer dest");
        assert_eq!(
            Some(learnt),
            last_dest.map(|m| Dest::parse(m, DestLayout::V45).unwrap()),
            "{what}"
        );
        assert_eq!(r.x.peer().version.as_ref().unwrap().as_str(), "6.06");
        println!(
            "{what}: {} messages matched ({} before the run), complete={}",
            n.min(r.ours.len()),
            run_at,
            c.complete
        );
    }
}

#[test]
fn replay_write_bw() {
    replay_capture("write_bw.pcap", TestKind::WriteBw);
}

#[test]
fn replay_read_bw() {
    replay_capture("read_bw.pcap", TestKind::ReadBw);
}

#[test]
fn replay_send_bw() {
    replay_capture("send_bw.pcap", TestKind::SendBw);
}

#[test]
fn replay_write_lat() {
    replay_capture("write_lat.pcap", TestKind::WriteLat);
}

#[test]
fn replay_read_lat() {
    replay_capture("read_lat.pcap", TestKind::ReadLat);
}

#[test]
fn replay_send_lat() {
    replay_capture("send_lat.pcap", TestKind::SendLat);
}

/// A script that is not perftest's fails the replay: every test's
/// exchange fed another test's capture (with one QP the messages look
/// alike; where the run starts, what follows it, or the outstanding reads
/// a read test advertises differ). Each must fail on that difference: the
/// replay's panic names it, and any other panic fails the test.
#[test]
fn a_foreign_script_fails_the_replay() {
    for (name, wrong, mismatch) in [
        // perftest's send test has one more exchange before the run
        (
            "send_bw.pcap",
            TestKind::WriteBw,
            "send_bw.pcap as Server: data connections and run",
        ),
        (
            "write_bw.pcap",
            TestKind::SendBw,
            "write_bw.pcap as Server: data connections and run",
        ),
        // a read test's dest asks for 128 outstanding reads, the others' 1
        (
            "write_lat.pcap",
            TestKind::ReadLat,
            "write_lat.pcap as Server, message 6: lid, out_reads, srqn, gid_index",
        ),
        (
            "read_lat.pcap",
            TestKind::SendLat,
            "read_lat.pcap as Server, message 6: lid, out_reads, srqn, gid_index",
        ),
        // the send latency test's exchange is longer than the write's
        (
            "send_lat.pcap",
            TestKind::WriteLat,
            "WriteLat Server: perftest sent messages past our script's end",
        ),
    ] {
        let r = std::panic::catch_unwind(|| replay_capture(name, wrong));
        let Err(payload) = r else {
            panic!("{wrong:?}'s exchange passed for {name}");
        };
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("<a panic without a message>");
        assert!(
            message.contains(mismatch),
            "{wrong:?} fed {name}: expected the mismatch \"{mismatch}\", the replay failed on: {message}"
        );
    }
}

// ------------------------------------------------------ end to end ----

/// What a side sets up before a session: a PD, a CQ, the data QPs and one
/// registered buffer per QP (as the runner does).
struct Ends {
    qps: Vec<Qp>,
    bufs: Vec<RemoteBuf>,
    _regions: Vec<Region>,
}

fn side(dp: &Dataplane, n: usize, ord: u32) -> Ends {
    let pd = dp.alloc_pd().unwrap();
    let cq = dp.create_cq(1024).unwrap();
    let mut qps = Vec::new();
    let mut bufs = Vec::new();
    let mut regions = Vec::new();
    for _ in 0..n {
        let qp = dp
            .create_qp(
                pd,
                &cq,
                &cq,
                QpOptions {
                    max_ord: ord,
                    max_ird: ord,
                    ..QpOptions::default()
                },
            )
            .unwrap();
        let region = Region::new(8192).unwrap();
        let mr = dp
            .reg_mr(
                pd,
                &region,
                0,
                8192,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        bufs.push(RemoteBuf {
            addr: mr.addr(),
            rkey: mr.rkey().0,
        });
        qps.push(qp);
        regions.push(region);
    }
    Ends {
        qps,
        bufs,
        _regions: regions,
    }
}

/// Per connection, in the order of their SYNs (the control connection
/// first): whether the first FIN on it came from the server's port. An
/// attempt refused with a reset (the server not listening yet) is left
/// out.
fn first_fins(pcap: &[u8]) -> Vec<bool> {
    let mut conns: Vec<(u16, Option<bool>, bool)> = Vec::new();
    for r in Reader::read_all(pcap).expect("our capture reads") {
        let f = r.data;
        if f.get(12..14) != Some(&[0x08, 0x00][..]) || f.get(23) != Some(&6) {
            continue;
        }
        let ihl = usize::from(f[14] & 0x0f) * 4;
        let Some(tcp) = f.get(14 + ihl..14 + ihl + 14) else {
            continue;
        };
        let (src, dst) = (
            u16::from_be_bytes([tcp[0], tcp[1]]),
            u16::from_be_bytes([tcp[2], tcp[3]]),
        );
        let from_server = src == PORT;
        let client_port = if from_server { dst } else { src };
        let (syn, fin, rst) = (
            tcp[13] & 0x02 != 0,
            tcp[13] & 0x01 != 0,
            tcp[13] & 0x04 != 0,
        );
        if syn && !from_server && !conns.iter().any(|c| c.0 == client_port) {
            conns.push((client_port, None, false));
        }
        if let Some(c) = conns.iter_mut().find(|c| c.0 == client_port) {
            if fin && c.1.is_none() {
                c.1 = Some(from_server);
            }
            c.2 |= rst;
        }
    }
    conns
        .into_iter()
        .filter(|c| c.1.is_some() || !c.2)
        .map(|(port, fin, _)| fin.unwrap_or_else(|| panic!("no FIN on the connection from {port}")))
        .collect()
}

fn end_to_end(test: TestKind, n: usize) {
    end_to_end_sizes(test, n, false);
}

/// With `all_sizes`, each side goes through the sizes of an `-a` run
/// (`next_size` between two) before finishing.
fn end_to_end_sizes(test: TestKind, n: usize, all_sizes: bool) {
    let pair = Pair::new(&PairOptions {
        mode: DriveMode::Threads,
        ..PairOptions::default()
    });
    let mut p = SessionParams::new(test, 65536, 100);
    p.qps = n;
    p.outstanding_reads = 8;
    p.all_sizes = all_sizes;
    let between = if all_sizes { ALL_SIZES - 1 } else { 0 };
    let ord = 8;
    let (sa, sb) = (side(&pair.a, n, ord), side(&pair.b, n, ord));
    let pcap = std::env::temp_dir().join(format!(
        "perftest-e2e-{}-{test:?}-{n}-{all_sizes}.pcap",
        std::process::id()
    ));
    pair.a
        .capture_start(&pcap, &CaptureOptions::default())
        .unwrap();
    let timeout = Duration::from_secs(10);
    let figures = BwFigures {
        size: 65536,
        iters: 100 * n as u64,
        bw_peak: 2000.0,
        bw_avg: 1900.5,
        msg_rate: 0.03,
    };
    // Each side has seen its data connections up before either finishes
    // (bounded: a side that failed before it does not hold the other).
    let connected = std::sync::atomic::AtomicUsize::new(0);
    let both_connected = || {
        connected.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let deadline = std::time::Instant::now() + timeout;
        while connected.load(std::sync::atomic::Ordering::SeqCst) < 2
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let (server_got, client_got) = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let mut sess = Session::server(&pair.b, PORT, &p, &sb.qps, &sb.bufs, timeout)
                .unwrap_or_else(|e| panic!("{test:?} server: {e}"));
            let remote = sess.remote();
            assert_eq!(sess.peer_version(), "6.06");
            assert!(sb.qps.iter().all(|q| q.status() == QpStatus::Connected));
            // Where the script has no sync after the setup (the latency
            // tests), finishing closes at once: wait for the client's look.
            both_connected();
            for _ in 0..between {
                sess.next_size().unwrap();
            }
            let report = sess.finish(None).unwrap();
            // finish closed the data connections and saw them closed.
            assert!(sb.qps.iter().all(|q| q.status() == QpStatus::Disconnected));
            (remote, report)
        });
        let client = s.spawn(|| {
            // The server thread may not listen yet: perftest's client gives
            // up at once then, this one tries again.
            let mut tries = 0;
            let mut sess = loop {
                match Session::client(
                    &pair.a,
                    SocketAddrV4::new(IP_B, PORT),
                    &p,
                    &sa.qps,
                    &sa.bufs,
                    timeout,
                ) {
                    Ok(s) => break s,
                    Err(e) if tries < 50 && e.to_string().contains("refused") => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => panic!("{test:?} client: {e}"),
                }
            };
            let remote = sess.remote();
            assert!(sa.qps.iter().all(|q| q.status() == QpStatus::Connected));
            both_connected();
            for _ in 0..between {
                sess.next_size().unwrap();
            }
            let report = sess.finish(Some(&figures)).unwrap();
            assert!(sa.qps.iter().all(|q| q.status() == QpStatus::Disconnected));
            (remote, report)
        });
        (server.join().unwrap(), client.join().unwrap())
    });
    assert_eq!(
        server_got.0, sa.bufs,
        "{test:?} -q {n}: the server learnt the client's"
    );
    assert_eq!(
        client_got.0, sb.bufs,
        "{test:?} -q {n}: the client learnt the server's"
    );
    let bw = matches!(test, TestKind::WriteBw | TestKind::ReadBw);
    assert_eq!(server_got.1, bw.then_some(figures), "{test:?}: the report");
    assert_eq!(client_got.1, None);
    // Close order: where the server's Send ends the closing exchange, our
    // client waits for the server's FIN on the control connection before
    // sending its own (Linux siw's server may fail that Send otherwise).
    pair.a.capture_stop().unwrap();
    let bytes = std::fs::read(&pcap).unwrap();
    let _ = std::fs::remove_file(&pcap);
    let fins = first_fins(&bytes);
    assert_eq!(
        fins.len(),
        n + 1,
        "{test:?}: control and {n} data connections"
    );
    if client_awaits_server_close(test) {
        assert!(
            fins[0],
            "{test:?}: the server's FIN first on the control connection"
        );
    }
    println!("{test:?} -q {n}: both sides learnt each other's buffers");
}

#[test]
fn sessions_end_to_end_one_qp() {
    for test in TestKind::ALL {
        end_to_end(test, 1);
    }
}

#[test]
fn sessions_end_to_end_two_qps() {
    for test in [TestKind::WriteBw, TestKind::ReadBw, TestKind::SendBw] {
        end_to_end(test, 2);
    }
}

/// A peer that accepts the control connection and then says nothing, or
/// answers the version with something that is not perftest's: the client
/// fails within its timeout with one line naming the step.
#[test]
fn a_silent_or_foreign_peer_fails_cleanly() {
    use dataplane::api::{CmEvent, ConnectParams, RecvWr, SendWr, SgeList};
    for garbage in [false, true] {
        let pair = Pair::new(&PairOptions {
            mode: DriveMode::Threads,
            ..PairOptions::default()
        });
        let b = &pair.b;
        b.listen(PORT, 4).unwrap();
        let pd = b.alloc_pd().unwrap();
        let cq = b.create_cq(64).unwrap();
        let qp = b.create_qp(pd, &cq, &cq, QpOptions::default()).unwrap();
        let region = Region::new(4096).unwrap();
        let mr = b.reg_mr(pd, &region, 0, 4096, Access::LOCAL_WRITE).unwrap();
        qp.post_recv(&RecvWr {
            wr_id: 1,
            sges: SgeList::single(mr.sge(0, 256)),
        })
        .unwrap();
        let sa = side(&pair.a, 1, 0);
        let p = SessionParams::new(TestKind::WriteBw, 65536, 100);
        let err = std::thread::scope(|s| {
            let client = s.spawn(|| {
                Session::client(
                    &pair.a,
                    SocketAddrV4::new(IP_B, PORT),
                    &p,
                    &sa.qps,
                    &sa.bufs,
                    Duration::from_secs(1),
                )
                .map(|_| ())
            });
            let req = loop {
                if let Some(CmEvent::ConnectRequest(r)) = b.wait_event(Duration::from_secs(5)) {
                    break r;
                }
            };
            b.accept(&req, &qp, &ConnectParams::default()).unwrap();
            if garbage {
                // Wait for the client's version, then answer with junk.
                let wc = loop {
                    if let Some(wc) = cq.poll_one() {
                        break wc;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                };
                assert_eq!(wc.byte_len, 16, "the version message");
                region.write(1024, b"hello, iwarp\0\0\0\0").unwrap();
                qp.post_send(&SendWr::send(2, SgeList::single(mr.sge(1024, 16))))
                    .unwrap();
            }
            client.join().unwrap().unwrap_err()
        });
        let msg = err.to_string();
        println!("{}: {msg}", if garbage { "foreign" } else { "silent" });
        assert!(!msg.contains('\n'), "one line: {msg}");
        if garbage {
            assert!(msg.contains("not a perftest version string"), "{msg}");
        } else {
            assert!(
                msg.contains("no answer within 1 s at the version exchange"),
                "{msg}"
            );
        }
    }
}

/// `-a`: the send tests sync between sizes, the others do not; either
/// way both sides agree through all 23 sizes and the close.
#[test]
fn sessions_end_to_end_all_sizes() {
    for test in [TestKind::SendBw, TestKind::SendLat, TestKind::WriteBw] {
        end_to_end_sizes(test, 1, true);
    }
}
