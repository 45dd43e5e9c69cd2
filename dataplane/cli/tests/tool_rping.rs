//! `iwarp rping` against itself and against what rping put on the wire.
//!
//! - In one process: two dataplanes over an in-memory link, the rping
//!   server and client on two threads, 20 validated pings at the default
//!   size and at rping's largest; a server that corrupts one echo, which
//!   the client must report as a data mismatch naming the ping; a client
//!   refused by a port nobody listens on; a server nobody connects to.
//! - On the wire: rping's connection from `rping.pcap` (`rping -C 10 -S
//!   100`, siw on both sides; embedded in rdmap's replay tests, and read
//!   from the fixture `deploy/interop/captures/rping.pcap` too) is
//!   taken apart, and every message in it is checked against this
//!   module's encoding: the MPA IRD/ORD words, each 16-byte advertisement
//!   (decoded and re-encoded byte for byte), the server's zero go-aheads,
//!   the Read Request and Write lengths, and each ping's data against
//!   [`ping_data`].
//! - As two processes (root only): the built `iwarp` binary as
//!   `rping -s` and `rping -c -C 10 -V` in two network namespaces joined by
//!   a veth pair, on `net_af_packet`; both must exit 0, and the
//!   namespaces and EAL runtime directories must be gone afterwards.

#[path = "../../tests/netns_common/mod.rs"]
mod netns_common;
#[path = "../../tests/runtime_common/mod.rs"]
mod runtime_common;

#[path = "../../../rdmap/tests/replay_golden/mod.rs"]
#[allow(
    dead_code,
    reason = "the segment lengths serve rdmap's replay, not this test"
)]
mod rping_golden;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dataplane::api::{Dataplane, DriveMode};
use iwarp::rping::{
    client, persistent_server, ping_data, server, PersistentEnd, RpingInfo, RpingOptions,
    RpingRole, RpingSummary, CONN_DEPTH, INFO_LEN, MAX_SIZE,
};
use iwarp::ToolError;
use netns_common::{require_root, NsChild, TwoNs};
use rdmap::mpa::deframe::{DeframeEvent, Deframer};
use rdmap::mpa::frame::{FrameKind, FrameRepr};
use rdmap::wire::{DdpRepr, RdmapOpcode, ReadRequest};
use runtime_common::{Pair, PairOptions, IP_A, IP_B};

// ---------------------------------------------------------------------
// In one process.
// ---------------------------------------------------------------------

fn threads_pair() -> Pair {
    Pair::new(&PairOptions {
        mode: DriveMode::Threads,
        ..PairOptions::default()
    })
}

/// Runs a server on `p.b` and a client on `p.a`; both results and the
/// client's `-v` output.
fn run_pair(
    p: &Pair,
    server_opts: &RpingOptions,
    client_opts: &RpingOptions,
) -> (
    Result<RpingSummary, ToolError>,
    Result<RpingSummary, ToolError>,
    String,
) {
    let (a, b): (&Dataplane, &Dataplane) = (&p.a, &p.b);
    std::thread::scope(|s| {
        let srv = s.spawn(move || server(b, server_opts, &mut std::io::sink()));
        // The server listens before the client's SYN can reach it: the
        // listen call returns once every worker has the listener.
        std::thread::sleep(Duration::from_millis(100));
        let mut out = Vec::new();
        let cli = client(
            a,
            SocketAddrV4::new(IP_B, client_opts.port),
            client_opts,
            &mut out,
        );
        let srv = srv.join().expect("server thread");
        (srv, cli, String::from_utf8(out).expect("text output"))
    })
}

fn opts(size: usize) -> RpingOptions {
    RpingOptions {
        count: Some(20),
        size,
        validate: true,
        timeout: Duration::from_secs(15),
        accept_timeout: Some(Duration::from_secs(15)),
        ..RpingOptions::default()
    }
}

fn ping_pong(size: usize) {
    let p = threads_pair();
    let client_opts = RpingOptions {
        verbose: true,
        ..opts(size)
    };
    let (srv, cli, out) = run_pair(&p, &opts(size), &client_opts);
    let srv = srv.expect("server");
    let cli = cli.expect("client");
    println!("{cli}");
    println!("{srv}");
    assert_eq!(cli.role, RpingRole::Client);
    assert_eq!(srv.role, RpingRole::Server);
    assert_eq!((cli.iterations, srv.iterations), (20, 20));
    assert_eq!((cli.size, srv.size), (size, size));
    let n = 20 * size as u64;
    assert_eq!(cli.bytes_verified, n, "client: every echo compared");
    assert_eq!(srv.bytes_verified, n, "server: every ping read compared");
    assert_eq!(cli.bytes_moved, 2 * n);
    assert_eq!(
        srv.bytes_moved,
        2 * n,
        "a Read and a Write of the whole ping"
    );
    assert_eq!(cli.peer, SocketAddrV4::new(IP_B, 7174));
    assert_eq!(*srv.peer.ip(), IP_A);
    // `-v`: one line per ping, the string rping prints.
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 20);
    for (i, line) in lines.iter().enumerate() {
        let want = ping_data(i as u64, size);
        let want = std::str::from_utf8(&want[..size - 1]).unwrap();
        assert_eq!(*line, format!("ping data: {want}"));
    }
    println!("first line of -v: {}", &lines[0][..60.min(lines[0].len())]);
}

#[test]
fn twenty_validated_pings_default_size() {
    ping_pong(64);
}

#[test]
fn twenty_validated_pings_largest_size() {
    ping_pong(MAX_SIZE);
}

#[test]
fn corrupted_echo_is_a_data_mismatch_naming_the_ping() {
    let p = threads_pair();
    let server_opts = RpingOptions {
        corrupt_ping: Some(7),
        ..opts(100)
    };
    let (srv, cli, _) = run_pair(&p, &server_opts, &opts(100));
    match cli {
        Err(ToolError::DataMismatch(m)) => {
            println!("client: data check failed: {m}");
            assert!(m.contains("ping 7:"), "{m}");
        }
        other => panic!("the client should report a mismatch, got {other:?}"),
    }
    // The server finished ping 7 (it sent the corrupt echo and its
    // go-ahead), then saw the client leave between pings: rping's end.
    let srv = srv.expect("server ends with the connection");
    assert_eq!(srv.iterations, 8);
}

#[test]
fn crc_required_server_refuses_a_client_without_crc_in_one_line_each() {
    // As `iwarp rping -s --set mpa.crc=required` against a client that
    // does not ask for CRC (as siw's rping never does).
    let p = Pair::with_configs(
        &PairOptions {
            mode: DriveMode::Threads,
            ..PairOptions::default()
        },
        |c, is_a| {
            c.mpa.crc = if is_a {
                dataplane::config::CrcPolicy::Off
            } else {
                dataplane::config::CrcPolicy::Required
            }
        },
    );
    let (srv, cli, _) = run_pair(&p, &opts(64), &opts(64));
    let srv = srv.expect_err("the server refuses").to_string();
    let cli = cli.expect_err("the client is refused").to_string();
    println!("server: {srv}\nclient: {cli}");
    for m in [&srv, &cli] {
        assert!(
            !m.contains('\n') && !m.contains('{') && !m.contains("::"),
            "{m}"
        );
    }
    assert!(
        srv.starts_with("we refused the MPA request from 10.77.0.1:")
            && srv.contains("the peer did not ask for MPA CRCs, and CRCs are required here")
            && srv.ends_with("(see mpa.crc)"),
        "{srv}"
    );
    assert!(
        cli.contains("10.77.0.2:") && cli.contains("rejected") && cli.contains("MPA CRC required"),
        "{cli}"
    );
}

#[test]
fn client_refused_when_nobody_listens() {
    let p = threads_pair();
    let o = RpingOptions {
        port: 7999,
        ..opts(64)
    };
    let e = client(
        &p.a,
        SocketAddrV4::new(IP_B, 7999),
        &o,
        &mut std::io::sink(),
    )
    .expect_err("nobody listens on 7999");
    let msg = e.to_string();
    println!("client: {msg}");
    assert!(matches!(e, ToolError::Peer(_)), "{e:?}");
    assert!(
        msg.contains("refused") && msg.contains("10.77.0.2:7999"),
        "{msg}"
    );
}

#[test]
fn client_gives_up_on_an_unreachable_peer() {
    let p = threads_pair();
    let o = RpingOptions {
        timeout: Duration::from_secs(1),
        ..opts(64)
    };
    let nobody = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 99), 7174);
    let started = Instant::now();
    let e = client(&p.a, nobody, &o, &mut std::io::sink()).expect_err("nobody is at .99");
    let msg = e.to_string();
    println!("client: {msg} (after {:?})", started.elapsed());
    assert!(msg.contains("10.77.0.99:7174"), "{msg}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn server_gives_up_when_no_client_comes() {
    let p = threads_pair();
    let o = RpingOptions {
        accept_timeout: Some(Duration::from_millis(300)),
        ..opts(64)
    };
    let e = server(&p.b, &o, &mut std::io::sink()).expect_err("no client");
    println!("server: {e}");
    assert!(e.to_string().contains("no client connected"), "{e}");
}

#[test]
fn sizes_outside_rpings_range_are_refused() {
    let p = threads_pair();
    for size in [0, 25, MAX_SIZE + 1] {
        let e = client(
            &p.a,
            SocketAddrV4::new(IP_B, 7174),
            &opts(size),
            &mut std::io::sink(),
        )
        .expect_err("bad size");
        assert!(matches!(e, ToolError::Usage(_)), "{size}: {e:?}");
        assert!(e.to_string().contains("26 to 65535"), "{e}");
    }
}

/// A peer that plays rping by hand and stops half-way through ping 0.
mod vanishing {
    use super::*;
    use dataplane::api::{Access, CmEvent, ConnectParams, RecvWr, SendWr, SgeList};
    use runtime_common::{buffer, wait_wc, Buf, End};

    fn rw() -> Access {
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
    }

    fn recv(end: &End, buf: &Buf, id: u64) {
        let wr = RecvWr {
            wr_id: id,
            sges: SgeList::single(buf.mr.sge(0, INFO_LEN as u32)),
        };
        end.qp.post_recv(&wr).unwrap();
    }

    fn established(p: &Pair, dp: &Dataplane, end: &End) {
        p.until("established", |_| match dp.poll_event() {
            Some(CmEvent::Established { qp, .. }) if qp == end.qp.num() => Some(()),
            Some(other) => panic!("unexpected {other:?}"),
            None => None,
        });
    }

    #[test]
    fn client_leaving_mid_ping_fails_the_server() {
        let p = threads_pair();
        let o = opts(100);
        std::thread::scope(|s| {
            let srv = s.spawn(|| server(&p.b, &o, &mut std::io::sink()));
            std::thread::sleep(Duration::from_millis(100));
            // The client's half of ping 0: the start buffer advertised, the
            // first go-ahead taken; then a reset instead of the sink.
            let mut end = End::new(&p.a);
            let start = buffer(&p.a, end.pd, 100, rw());
            start.region.write(4096, &ping_data(0, 100)).unwrap();
            let adv = buffer(&p.a, end.pd, INFO_LEN, rw());
            let info = RpingInfo {
                addr: start.mr.addr(),
                rkey: start.mr.rkey().0,
                size: 100,
            };
            adv.region.write(4096, &info.encode()).unwrap();
            let go = buffer(&p.a, end.pd, INFO_LEN, rw());
            recv(&end, &go, 1);
            let params = ConnectParams {
                ird: 1,
                ord: 1,
                private_data: Vec::new(),
            };
            p.a.connect(&end.qp, SocketAddrV4::new(IP_B, o.port), &params)
                .unwrap();
            established(&p, &p.a, &end);
            let wr = SendWr::send(2, SgeList::single(adv.mr.sge(0, INFO_LEN as u32)));
            end.qp.post_send(&wr).unwrap();
            let wc = wait_wc(&p, &mut end, 1);
            assert_eq!(wc.byte_len as usize, INFO_LEN, "rping's go-ahead");
            assert_eq!(go.bytes(), [0u8; INFO_LEN]);
            p.a.disconnect(&end.qp, true).unwrap();
            let e = srv.join().unwrap().expect_err("the client left mid-ping");
            println!("server: {e}");
            assert!(matches!(e, ToolError::Peer(_)), "{e:?}");
            let m = e.to_string();
            assert!(
                m.contains("went away in ping 0") && m.contains("sink buffer"),
                "{m}"
            );
        });
    }

    #[test]
    fn server_leaving_mid_ping_fails_the_client() {
        let p = threads_pair();
        let o = opts(100);
        p.b.listen(o.port, 3).unwrap();
        std::thread::scope(|s| {
            let cli = s.spawn(|| {
                client(
                    &p.a,
                    SocketAddrV4::new(IP_B, o.port),
                    &o,
                    &mut std::io::sink(),
                )
            });
            // The server takes the start advertisement, then resets.
            let req = p.until("a connection request", |_| match p.b.poll_event() {
                Some(CmEvent::ConnectRequest(r)) => Some(r),
                Some(other) => panic!("unexpected {other:?}"),
                None => None,
            });
            assert_eq!((req.ird, req.ord), (Some(1), Some(1)), "rping's conn_param");
            assert!(req.private_data.is_empty());
            let mut end = End::new(&p.b);
            let adv = buffer(&p.b, end.pd, INFO_LEN, rw());
            recv(&end, &adv, 1);
            let params = ConnectParams {
                ird: 1,
                ord: 1,
                private_data: Vec::new(),
            };
            p.b.accept(&req, &end.qp, &params).unwrap();
            established(&p, &p.b, &end);
            let wc = wait_wc(&p, &mut end, 1);
            assert_eq!(wc.byte_len as usize, INFO_LEN);
            let info = RpingInfo::decode(&adv.bytes()).unwrap();
            assert_eq!(info.size, 100);
            p.b.disconnect(&end.qp, true).unwrap();
            let e = cli.join().unwrap().expect_err("the server left mid-ping");
            println!("client: {e}");
            let m = e.to_string();
            assert!(
                m.contains("went away in ping 0") && m.contains("go-ahead"),
                "{m}"
            );
        });
    }
}

// ---------------------------------------------------------------------
// On the wire: rping's own connection.
// ---------------------------------------------------------------------

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// One FPDU's DDP/RDMAP header and payload.
struct Pdu {
    header: DdpRepr,
    payload: Vec<u8>,
}

/// The MPA frame at the start of `stream` and the FPDUs after it (no CRC:
/// siw negotiated none, and the deframer is told so).
fn split(stream: &[u8], kind: FrameKind) -> (Option<(u16, u16)>, Vec<Pdu>) {
    let (frame, len) = FrameRepr::parse_prefix(stream).expect("the MPA frame");
    assert_eq!(frame.kind, kind);
    assert!(frame.private_data.is_empty(), "rping sends no private data");
    let ird_ord = frame.ird_ord.map(|w| (w.ird, w.ord));
    let mut d = Deframer::new(frame.crc, frame.markers, u16::MAX);
    let mut input = &stream[len..];
    let mut ulpdus: Vec<Vec<u8>> = Vec::new();
    while let Some(ev) = d.next_event(&mut input).expect("FPDUs deframe") {
        match ev {
            DeframeEvent::UlpduStart { len } => ulpdus.push(Vec::with_capacity(len.into())),
            DeframeEvent::Bytes(b) => ulpdus.last_mut().unwrap().extend_from_slice(b),
            DeframeEvent::UlpduEnd { .. } => {}
        }
    }
    let pdus = ulpdus
        .iter()
        .map(|u| {
            let (header, hl) = DdpRepr::parse_ulpdu(u).expect("DDP/RDMAP header");
            Pdu {
                header,
                payload: u[hl..].to_vec(),
            }
        })
        .collect();
    (ird_ord, pdus)
}

fn opcode(h: &DdpRepr) -> RdmapOpcode {
    match *h {
        DdpRepr::Tagged { opcode, .. } | DdpRepr::Untagged { opcode, .. } => opcode,
    }
}

/// Checks rping's connection, both directions, against this module;
/// returns the number of messages checked.
fn check_rping_connection(client_stream: &[u8], server_stream: &[u8], what: &str) -> usize {
    const PINGS: usize = 10;
    const SIZE: usize = 100;
    let (req, up) = split(client_stream, FrameKind::Request);
    let (rep, down) = split(server_stream, FrameKind::Reply);
    // rping's conn_param (1, 1), and the server's answer mirroring it.
    let depth = Some((CONN_DEPTH, CONN_DEPTH));
    assert_eq!((req, rep), (depth, depth), "{what}: IRD/ORD words");

    // The client: a start advertisement, a Read Response, a sink
    // advertisement per ping.
    let sends: Vec<&Pdu> = up
        .iter()
        .filter(|p| opcode(&p.header) == RdmapOpcode::Send)
        .collect();
    let responses: Vec<&Pdu> = up
        .iter()
        .filter(|p| opcode(&p.header) == RdmapOpcode::ReadResponse)
        .collect();
    assert_eq!((sends.len(), responses.len()), (2 * PINGS, PINGS), "{what}");
    let mut advertised = Vec::new();
    for s in &sends {
        assert_eq!(s.payload.len(), INFO_LEN);
        let info = RpingInfo::decode(&s.payload).expect("an rping_rdma_info");
        assert_eq!(
            info.encode().as_slice(),
            s.payload.as_slice(),
            "{what}: re-encoding"
        );
        assert_eq!(info.size as usize, SIZE, "{what}: the client's -S");
        advertised.push(info);
    }
    let (start, sink) = (advertised[0], advertised[1]);
    assert_ne!(start.rkey, sink.rkey, "two buffers");
    for pair in advertised.chunks(2) {
        assert_eq!(
            (pair[0], pair[1]),
            (start, sink),
            "{what}: the same buffers every ping"
        );
    }
    // Golden bytes, as tshark shows them.
    assert_eq!(
        start.encode().to_vec(),
        unhex("0000564378b75460f52e240000000064")
    );
    assert_eq!(
        sink.encode().to_vec(),
        unhex("0000564378b72dc00f28aa0000000064")
    );

    // The server: Read Request, go-ahead, Write, go-ahead per ping.
    let ops: Vec<RdmapOpcode> = down.iter().map(|p| opcode(&p.header)).collect();
    let one = [
        RdmapOpcode::ReadRequest,
        RdmapOpcode::Send,
        RdmapOpcode::RdmaWrite,
        RdmapOpcode::Send,
    ];
    assert_eq!(ops, one.repeat(PINGS), "{what}: the server's message order");
    let mut checked = sends.len();
    for (ping, msgs) in down.chunks(4).enumerate() {
        let want = ping_data(ping as u64, SIZE);
        let rr = ReadRequest::parse_bytes(&msgs[0].payload).expect("a Read Request");
        assert_eq!(
            (rr.source_stag, rr.source_to, rr.size as usize),
            (start.rkey, start.addr, SIZE),
            "{what}: ping {ping}: the Read takes the advertised start buffer"
        );
        assert_eq!(
            responses[ping].payload, want,
            "{what}: ping {ping}: start buffer"
        );
        for go in [&msgs[1], &msgs[3]] {
            assert_eq!(
                go.payload, [0u8; INFO_LEN],
                "{what}: rping's go-ahead is zeros"
            );
        }
        match msgs[2].header {
            DdpRepr::Tagged { stag, to, .. } => {
                assert_eq!(
                    (stag, to),
                    (sink.rkey, sink.addr),
                    "{what}: ping {ping}: sink"
                );
            }
            DdpRepr::Untagged { .. } => panic!("a Write is tagged"),
        }
        // strlen + 1: the whole ping, its final NUL included.
        assert_eq!(msgs[2].payload, want, "{what}: ping {ping}: the echo");
        checked += 5;
    }
    checked
}

#[test]
fn rping_messages_match_the_capture() {
    let c = unhex(rping_golden::CLIENT_STREAM_HEX);
    let s = unhex(rping_golden::SERVER_STREAM_HEX);
    let n = check_rping_connection(&c, &s, "embedded rping streams");
    println!("embedded rping.pcap streams: {n} messages match the encoding and the pattern");

    let path = runtime_common::siw_capture("rping.pcap");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let records = pcap_kit::Reader::read_all(&bytes).expect("the capture reads");
    let conns = pcap_kit::Reassembler::from_records(records);
    let conn = conns
        .iter()
        .find(|c| {
            c.streams
                .iter()
                .any(|s| s.dst.port() == 7174 && !s.data.is_empty())
        })
        .expect("rping's connection in the capture");
    let up = conn.streams.iter().find(|s| s.dst.port() == 7174).unwrap();
    let down = conn.streams.iter().find(|s| s.src.port() == 7174).unwrap();
    assert!(up.gaps.is_empty() && down.gaps.is_empty());
    let n = check_rping_connection(&up.data, &down.data, "rping.pcap");
    assert_eq!(up.data, c, "the embedded client stream is the capture's");
    println!("rping.pcap: {n} messages match the encoding and the pattern");
}

// ---------------------------------------------------------------------
// Two processes, two namespaces (root).
// ---------------------------------------------------------------------

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
const CHILD_TIMEOUT: Duration = Duration::from_secs(90);

fn spawn(
    name: &'static str,
    ns: &str,
    args: &[String],
    lines: mpsc::Sender<(&'static str, String)>,
) -> NsChild {
    let mut all = vec!["rping".to_string()];
    all.extend_from_slice(args);
    NsChild::spawn(
        name,
        ns,
        Path::new(env!("CARGO_BIN_EXE_iwarp")),
        &all,
        &[],
        lines,
    )
}

/// What a two-process run printed.
struct Outcome {
    client_summary: String,
    server_summary: String,
    pings_shown: usize,
}

/// `iwarp rping -s -V` and `iwarp rping -c -V -v CLIENT_ARGS` in two
/// namespaces; with `interrupt_after`, the client gets SIGINT once it has
/// shown that many pings. Both must exit 0 and leave nothing behind.
fn two_processes(client_args: &[&str], interrupt_after: Option<usize>) -> Outcome {
    let net = TwoNs::create().expect("two namespaces and a veth pair");
    let endpoint = |iface: &str, ip: Ipv4Addr| -> Vec<String> {
        vec![
            "--device".into(),
            format!("net_af_packet0,iface={iface}"),
            "--ip".into(),
            ip.to_string(),
            "--timeout".into(),
            "20".into(),
        ]
    };
    let strings = |a: &[&str]| -> Vec<String> { a.iter().map(|s| s.to_string()).collect() };
    let (tx, rx) = mpsc::channel();
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let mut server_args = strings(&["-s", "-d", "-V", "-a", "10.79.0.1", "--wait", "60"]);
    server_args.extend(endpoint(&net.ifs[0], SERVER_IP));
    let mut srv = spawn("server", &net.ns[0], &server_args, tx.clone());
    // The server says when it listens (-d).
    let mut seen: Vec<(&str, String)> = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "the server never listened");
        if let Ok(Some(st)) = srv.child.try_wait() {
            while let Ok(l) = rx.try_recv() {
                println!("[{}] {}", l.0, l.1);
            }
            panic!("the server exited early: {st}");
        }
        if let Ok((who, line)) = rx.recv_timeout(Duration::from_millis(100)) {
            println!("[{who}] {line}");
            let ready = line.contains("listening on 10.79.0.1:7174");
            seen.push((who, line));
            if ready {
                break;
            }
        }
    }
    let mut args = strings(&["-c", "-V", "-v", "-a", "10.79.0.1"]);
    args.extend(strings(client_args));
    args.extend(endpoint(&net.ifs[1], CLIENT_IP));
    let mut cli = spawn("client", &net.ns[1], &args, tx);
    let mut status = [None, None];
    let mut shown = 0;
    let mut signalled = false;
    while status.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "the rping processes did not finish within {CHILD_TIMEOUT:?}"
        );
        for (i, p) in [&mut srv, &mut cli].into_iter().enumerate() {
            if status[i].is_none() {
                status[i] = p.child.try_wait().expect("waiting for a child");
            }
        }
        while let Ok((who, line)) = rx.recv_timeout(Duration::from_millis(50)) {
            if who == "client" && line.starts_with("ping data: rdma-ping-") {
                shown += 1;
            }
            println!("[{who}] {line}");
            seen.push((who, line));
            // Signalled as soon as the count is seen: the lines keep coming.
            if interrupt_after.is_some_and(|n| shown >= n) && !signalled && status[1].is_none() {
                let pid = libc::pid_t::try_from(cli.child.id()).expect("a pid");
                // SAFETY: kill has no memory effects; `pid` is our child
                // (iwarp itself: ip netns exec execs it), not yet reaped
                // (its status is taken only in the outer loop).
                assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
                println!("SIGINT sent to the client after {shown} pings shown");
                signalled = true;
            }
            if Instant::now() >= deadline {
                break;
            }
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    while let Ok((who, line)) = rx.try_recv() {
        println!("[{who}] {line}");
        seen.push((who, line));
    }
    let [s, c] = status.map(Option::unwrap);
    assert!(c.success(), "the client failed: {c}");
    assert!(s.success(), "the server failed: {s}");
    assert_eq!(signalled, interrupt_after.is_some());
    for p in [&srv, &cli] {
        p.assert_runtime_gone();
    }
    let summary = |who: &str| {
        seen.iter()
            .find(|(w, l)| *w == who && l.starts_with(&format!("rping {who}:")))
            .map(|(_, l)| l.clone())
            .unwrap_or_else(|| panic!("no summary from the {who}"))
    };
    let out = Outcome {
        client_summary: summary("client"),
        server_summary: summary("server"),
        pings_shown: seen
            .iter()
            .filter(|(w, l)| *w == "client" && l.starts_with("ping data: rdma-ping-"))
            .count(),
    };
    net.remove_and_check();
    out
}

#[test]
fn two_processes_over_af_packet() {
    if !require_root() {
        return;
    }
    let o = two_processes(&["-C", "10", "-S", "100"], None);
    let (cs, ss) = (&o.client_summary, &o.server_summary);
    assert!(
        cs.contains("10 pings of 100 bytes") && cs.contains("1000 bytes verified"),
        "{cs}"
    );
    assert!(
        ss.contains("10 pings of 100 bytes") && ss.contains("1000 bytes verified"),
        "{ss}"
    );
    assert_eq!(o.pings_shown, 10, "-v prints each ping");
    println!(
        "two processes over net_af_packet: {cs} / {ss}; namespaces and runtime directories removed"
    );
}

/// Without -C the client pings until stopped: SIGINT ends it between two
/// pings, with its summary and status 0, and the server with it.
#[test]
fn two_processes_client_stopped_by_sigint_over_af_packet() {
    if !require_root() {
        return;
    }
    let o = two_processes(&[], Some(3));
    let (cs, ss) = (&o.client_summary, &o.server_summary);
    assert!(cs.ends_with("stopped by a signal"), "{cs}");
    assert!(!ss.contains("signal"), "{ss}");
    // Every ping the client finished, the server finished: the same count
    // in both summaries, each validated.
    let pings = |s: &str| -> u64 {
        s.split_whitespace()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {s}"))
    };
    let n = pings(cs);
    assert!(n >= 3, "{cs}");
    assert_eq!(pings(ss), n, "{cs} / {ss}");
    assert_eq!(o.pings_shown as u64, n);
    assert!(cs.contains(&format!("{} bytes verified", 64 * n)), "{cs}");
    println!("SIGINT: {cs} / {ss}; namespaces and runtime directories removed");
}

// ---------------------------------------------------------------------
// -P, -I and -q.
// ---------------------------------------------------------------------

/// `-P` in one process: five clients one after another, each served in
/// full by the same persistent server, which ends once no client has come
/// for its accept timeout (its SIGINT/SIGTERM end is the two-process test
/// below). Each client connects as soon as the previous one's close ends,
/// which may be before the server's does: the server serves it next
/// rather than refusing it as a second client (it did, in about one run
/// in eight on a loaded machine).
#[test]
fn persistent_server_serves_clients_one_after_another() {
    const CLIENTS: usize = 5;
    let p = threads_pair();
    let server_opts = RpingOptions {
        accept_timeout: Some(Duration::from_secs(3)),
        ..opts(100)
    };
    let client_opts = RpingOptions {
        count: Some(5),
        ..opts(100)
    };
    let (a, b): (&Dataplane, &Dataplane) = (&p.a, &p.b);
    let (served, end) = std::thread::scope(|s| {
        let srv = s.spawn(move || {
            let mut served: Vec<Result<RpingSummary, String>> = Vec::new();
            let end = persistent_server(b, &server_opts, &mut std::io::sink(), &mut |r| {
                served.push(r.cloned().map_err(|e| e.to_string()))
            });
            (served, end)
        });
        std::thread::sleep(Duration::from_millis(100));
        for k in 0..CLIENTS {
            let c = client(
                a,
                SocketAddrV4::new(IP_B, 7174),
                &client_opts,
                &mut std::io::sink(),
            )
            .unwrap_or_else(|e| panic!("client {k}: {e}"));
            assert_eq!((c.iterations, c.bytes_verified), (5, 500), "client {k}");
            println!("client {k}: {c}");
        }
        srv.join().expect("server thread")
    });
    assert_eq!(end.expect("the server ends cleanly"), PersistentEnd::Idle);
    assert_eq!(served.len(), CLIENTS, "{served:?}");
    for (k, s) in served.iter().enumerate() {
        let s = s
            .as_ref()
            .unwrap_or_else(|e| panic!("client {k} failed: {e}"));
        assert_eq!(
            (s.iterations, s.bytes_verified),
            (5, 500),
            "server, client {k}"
        );
        assert_eq!(*s.peer.ip(), IP_A);
        assert!(!s.interrupted);
    }
    // Each client came from a port of its own: one connection each.
    let ports: std::collections::HashSet<u16> =
        served.iter().flatten().map(|s| s.peer.port()).collect();
    assert_eq!(ports.len(), CLIENTS, "{served:?}");
}

/// `-q` (rdma-core: a QP the program creates and moves itself) is refused
/// before anything is opened, in one line that names `--quiet`, the quiet
/// summary's option here.
#[test]
fn q_is_refused_in_one_line_naming_quiet() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_iwarp"))
        .args(["rping", "-c", "-a", "10.0.0.1", "-C", "1", "-q"])
        .output()
        .expect("running iwarp");
    assert!(!out.status.success(), "{:?}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("iwarp: ") && lines[0].contains("--quiet"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_iwarp"))
        .args(["rping", "--help"])
        .output()
        .expect("running iwarp");
    let help = String::from_utf8_lossy(&help.stdout);
    for opt in ["-P", "-I <ADDR>", "-q", "--quiet"] {
        assert!(help.contains(opt), "--help names {opt}:\n{help}");
    }
    println!("-q: {}", lines[0]);
}

/// Two processes: `rping -s -P` serves two clients one after another, the
/// second connecting from the address it gives with `-I` (no --ip); each
/// client exits 0 with its summary, the server prints a summary per
/// client, and SIGTERM then ends it with status 0 and its last line.
#[test]
fn persistent_server_and_source_address_over_af_packet() {
    if !require_root() {
        return;
    }
    let net = TwoNs::create().expect("two namespaces and a veth pair");
    let (tx, rx) = mpsc::channel();
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let strings = |a: &[&str]| -> Vec<String> { a.iter().map(|s| s.to_string()).collect() };
    let dev = |i: usize| format!("net_af_packet0,iface={}", net.ifs[i]);
    let mut server_args = strings(&["-s", "-P", "-V", "-d", "-a", "10.79.0.1"]);
    server_args.extend(strings(&["--device", &dev(0), "--ip", "10.79.0.1"]));
    let mut srv = spawn("server", &net.ns[0], &server_args, tx.clone());
    let mut seen: Vec<(&str, String)> = Vec::new();
    let wait_for = |who: &str, what: &str, seen: &mut Vec<(&str, String)>| loop {
        assert!(Instant::now() < deadline, "no {what:?} from the {who}");
        if let Ok((w, line)) = rx.recv_timeout(Duration::from_millis(100)) {
            println!("[{w}] {line}");
            let hit = w == who && line.contains(what);
            seen.push((w, line));
            if hit {
                return;
            }
        }
    };
    wait_for("server", "listening on 10.79.0.1:7174", &mut seen);
    for (k, source) in [["--ip", "10.79.0.2"], ["-I", "10.79.0.2"]]
        .iter()
        .enumerate()
    {
        let mut args = strings(&["-c", "-V", "-a", "10.79.0.1", "-C", "4", "-S", "64"]);
        args.extend(strings(&["--device", &dev(1)]));
        args.extend(strings(source));
        let mut cli = spawn(
            if k == 0 { "client" } else { "client2" },
            &net.ns[1],
            &args,
            tx.clone(),
        );
        let status = loop {
            assert!(Instant::now() < deadline, "client {k} did not finish");
            if let Some(st) = cli.child.try_wait().expect("waiting for a client") {
                break st;
            }
            while let Ok((w, line)) = rx.recv_timeout(Duration::from_millis(50)) {
                println!("[{w}] {line}");
                seen.push((w, line));
            }
        };
        assert!(status.success(), "client {k} ({source:?}): {status}");
        cli.assert_runtime_gone();
        // The server's summary of this client, before the next one.
        let who = "server";
        let n = k + 1;
        let count = |seen: &Vec<(&str, String)>| {
            seen.iter()
                .filter(|(w, l)| {
                    *w == who && l.starts_with("rping server: 4 pings of 64 bytes from 10.79.0.2:")
                })
                .count()
        };
        while count(&seen) < n {
            wait_for("server", "rping server: 4 pings", &mut seen);
        }
    }
    let pid = libc::pid_t::try_from(srv.child.id()).expect("a pid");
    // SAFETY: kill has no memory effects; `pid` is our child (iwarp itself:
    // ip netns exec execs it), not yet reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = loop {
        assert!(
            Instant::now() < deadline,
            "the server did not end on SIGTERM"
        );
        if let Some(st) = srv.child.try_wait().expect("waiting for the server") {
            break st;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(200));
    while let Ok((w, line)) = rx.try_recv() {
        println!("[{w}] {line}");
        seen.push((w, line));
    }
    assert!(status.success(), "the server after SIGTERM: {status}");
    srv.assert_runtime_gone();
    let clients: Vec<&String> = seen
        .iter()
        .filter(|(w, l)| w.starts_with("client") && l.starts_with("rping client: 4 pings"))
        .map(|(_, l)| l)
        .collect();
    assert_eq!(clients.len(), 2, "{seen:?}");
    for c in &clients {
        assert!(c.contains("256 bytes verified"), "{c}");
    }
    let last = seen
        .iter()
        .rev()
        .find(|(w, _)| *w == "server")
        .map(|(_, l)| l.clone())
        .unwrap_or_default();
    assert_eq!(
        last, "rping server: 2 clients served, 0 failed; stopped by a signal",
        "{seen:?}"
    );
    net.remove_and_check();
    println!("-P served 2 clients (the second with -I), SIGTERM -> {status}: {last}");
}
