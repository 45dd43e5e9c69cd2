//! Replays the siw captures in `deploy/interop/captures/` through MPA:
//! both directions of every TCP connection are reassembled, the MPA
//! request and reply go through the negotiator (which must consume exactly
//! them and rebuild the initiator's request byte for byte), and the rest
//! goes through the deframer. Asserts zero framing errors, zero CRC errors
//! other than the ones host-probe.pcap's client made on purpose, and
//! prints how many FPDUs of each RDMAP opcode each direction carried.
//!
//! The captures are fixtures of the repository: a missing one fails.

#![allow(
    clippy::disallowed_methods,
    reason = "reads the capture fixtures from disk"
)]

mod captures_common;

use std::collections::BTreeMap;
use std::time::Duration;

use pcap_kit::{Connection, LinkType, Reader, Reassembler, Stream};
use rdmap::mpa::deframe::{DeframeEvent, Deframer};
use rdmap::mpa::frame::{FrameKind, FrameRepr, RtrSet, RtrType, REQUEST_KEY};
use rdmap::mpa::negotiate::{Config, CrcPolicy, Event, Negotiator};
use rdmap::mpa::rtr;

// ------------------------------------------------------------ pcap ----

/// Every TCP connection of a capture, both directions reassembled.
fn reassemble(bytes: &[u8]) -> Vec<Connection> {
    let records = Reader::read_all(bytes).expect("capture reads");
    assert!(
        records.iter().all(|r| r.link_type == LinkType::ETHERNET),
        "Ethernet link type"
    );
    Reassembler::from_records(records)
}

/// Whether a direction's stream opens with an MPA request.
fn is_request(s: &Stream) -> bool {
    s.prefix().starts_with(REQUEST_KEY)
}

// ------------------------------------------------------------- MPA ----

const OPCODES: [&str; 8] = [
    "Write",
    "ReadReq",
    "ReadResp",
    "Send",
    "SendInv",
    "SendSE",
    "SendSEInv",
    "Terminate",
];

#[derive(Default, Debug)]
struct Tally {
    fpdus: usize,
    by_opcode: BTreeMap<&'static str, usize>,
    crc_bad: usize,
    crc_bad_big_endian: usize,
    first_ulpdu: Option<Vec<u8>>,
    at_boundary: bool,
}

/// Deframes one direction's FPDUs; panics on a framing error.
fn deframe(bytes: &[u8], crc: bool, markers: bool, what: &str) -> Tally {
    let mut t = Tally::default();
    let mut d = Deframer::new(crc, markers, u16::MAX);
    let mut ulpdu = Vec::new();
    // Feed in segment-like chunks of varying size, as TCP would.
    let mut at = 0;
    let mut step = 1;
    while at < bytes.len() {
        let end = (at + 1 + step % 1500).min(bytes.len());
        step = (step * 7 + 3) % 10_007;
        let mut input = &bytes[at..end];
        while let Some(ev) = d
            .next_event(&mut input)
            .unwrap_or_else(|e| panic!("{what}: deframe error {e}"))
        {
            match ev {
                DeframeEvent::UlpduStart { .. } => ulpdu.clear(),
                DeframeEvent::Bytes(b) => ulpdu.extend_from_slice(b),
                DeframeEvent::UlpduEnd { crc_ok } => {
                    t.fpdus += 1;
                    let op = ulpdu
                        .get(1)
                        .map_or("(empty)", |b| OPCODES[usize::from(b & 0x0f) % 8]);
                    *t.by_opcode.entry(op).or_default() += 1;
                    if !crc_ok {
                        t.crc_bad += 1;
                        let (received, computed) = d.last_crc();
                        if received == computed.swap_bytes() {
                            t.crc_bad_big_endian += 1;
                        }
                    }
                    if t.first_ulpdu.is_none() {
                        t.first_ulpdu = Some(ulpdu.clone());
                    }
                }
            }
        }
        at = end;
    }
    t.at_boundary = d.at_boundary();
    t
}

/// The initiator configuration that reproduces a captured request.
fn mirror(req: &FrameRepr<'_>) -> Config {
    let w = req.ird_ord.unwrap_or_default();
    Config {
        revision: req.revision,
        crc: req.crc.into(),
        markers_wanted: req.markers,
        ird: w.ird,
        ord: w.ord,
        rtr_offer: if w.peer_to_peer { w.rtr } else { RtrSet::NONE },
        ..Config::default()
    }
}

struct Summary {
    connections: usize,
    not_mpa: usize,
    rejected: usize,
    fpdus: usize,
    crc_bad_big_endian: usize,
    rtr_connections: usize,
    per_dir: Vec<(String, Tally)>,
}

fn replay(name: &str, bytes: &[u8], expect_complete: bool) -> Summary {
    let connections = reassemble(bytes);
    let mut sum = Summary {
        connections: 0,
        not_mpa: 0,
        rejected: 0,
        fpdus: 0,
        crc_bad_big_endian: 0,
        rtr_connections: 0,
        per_dir: Vec::new(),
    };
    for conn in &connections {
        for (i, req_dir) in conn.streams.iter().enumerate() {
            let rep_dir = &conn.streams[1 - i];
            if !is_request(req_dir) || rep_dir.frames == 0 {
                continue;
            }
            replay_connection(name, req_dir, rep_dir, expect_complete, &mut sum);
        }
    }
    for conn in &connections {
        for (i, s) in conn.streams.iter().enumerate() {
            let reverse_is_mpa = is_request(&conn.streams[1 - i]);
            if !s.prefix().is_empty() && !is_request(s) && !reverse_is_mpa {
                sum.not_mpa += 1;
                println!("{name} {}>{}: not an MPA connection, skipped", s.src, s.dst);
            }
        }
    }
    println!(
        "{name}: {} MPA connections ({} rejected), {} FPDUs deframed",
        sum.connections, sum.rejected, sum.fpdus
    );
    sum
}

/// Negotiates and deframes one MPA connection: `req_dir` carries the
/// request, `rep_dir` the reply.
fn replay_connection(
    name: &str,
    req_dir: &Stream,
    rep_dir: &Stream,
    expect_complete: bool,
    sum: &mut Summary,
) {
    let (src, dst) = (req_dir.src, req_dir.dst);
    let (req_stream, req_complete) = (req_dir.prefix(), req_dir.is_complete());
    let (rep_stream, rep_complete) = (rep_dir.prefix(), rep_dir.is_complete());
    sum.connections += 1;
    let what = format!("{name} {src}>{dst}");
    // The responder side consumes exactly the request.
    let (req, req_len) = FrameRepr::parse_prefix(req_stream).expect("request parses");
    let mut responder = Negotiator::responder(
        Config {
            crc: CrcPolicy::Off,
            ..Config::default()
        },
        Duration::ZERO,
    )
    .unwrap();
    assert_eq!(
        responder.handle_input(req_stream, Duration::ZERO),
        req_len,
        "{what}"
    );
    // Our initiator, configured like the captured one, sends the same
    // request, and consumes exactly the captured reply.
    let mut init = Negotiator::initiator(mirror(&req), req.private_data, Duration::ZERO).unwrap();
    assert_eq!(
        init.poll_transmit().unwrap(),
        &req_stream[..req_len],
        "{what}: request rebuilt"
    );
    let (rep, rep_len) = FrameRepr::parse_prefix(rep_stream).expect("reply parses");
    assert_eq!(
        init.handle_input(rep_stream, Duration::ZERO),
        rep_len,
        "{what}"
    );
    let negotiated = match init.poll_event() {
        Some(Event::Negotiated(n)) => n,
        Some(Event::Rejected(_)) => {
            assert_eq!(rep.kind, FrameKind::Reject);
            assert_eq!(req_stream.len(), req_len, "{what}: no FPDU after a reject");
            assert_eq!(rep_stream.len(), rep_len, "{what}: no FPDU after a reject");
            sum.rejected += 1;
            return;
        }
        other => panic!("{what}: {other:?}"),
    };
    let f = negotiated.framing;
    let up = deframe(&req_stream[req_len..], f.crc, f.markers_tx, &what);
    let back_what = format!("{name} {dst}>{src}");
    let down = deframe(&rep_stream[rep_len..], f.crc, f.markers_rx, &back_what);
    if let Some(rtr_kind) = negotiated.send_rtr() {
        // The initiator's first FPDU is its RTR, the responder's a
        // zero-length Read Response to a Read RTR.
        sum.rtr_connections += 1;
        let first = up.first_ulpdu.as_deref().expect("an RTR");
        assert_eq!(rtr::recognize_rtr(first), Some(rtr_kind), "{what}");
        if rtr_kind == RtrType::Read {
            let (stag, to) = rtr::read_rtr_sink(first).unwrap();
            assert_eq!(
                down.first_ulpdu.as_deref(),
                Some(&rtr::read_response_ulpdu(stag, to)[..])
            );
        }
    }
    for (w, t, complete) in [(what, up, req_complete), (back_what, down, rep_complete)] {
        if expect_complete && complete {
            assert!(t.at_boundary, "{w}: stream ends inside an FPDU");
        }
        assert_eq!(t.crc_bad, t.crc_bad_big_endian, "{w}: CRC errors");
        sum.fpdus += t.fpdus;
        sum.crc_bad_big_endian += t.crc_bad_big_endian;
        let crc_note = match (f.crc, t.crc_bad) {
            (false, _) => String::new(),
            (true, 0) => " (CRC on)".to_string(),
            (true, n) => format!(" (CRC on; {n} with a big-endian CRC, sent so on purpose)"),
        };
        println!("{w}: {} FPDUs {:?}{crc_note}", t.fpdus, t.by_opcode);
        sum.per_dir.push((w, t));
    }
}
#[test]
fn replay_every_capture() {
    let dir = captures_common::captures_dir();
    let mut total = 0;
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    names.sort();
    for path in names {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        if name == "read_bw_n5000.pcap" {
            // Headers only (160-octet snap length): check the split-CRC
            // shape instead of deframing.
            let crc_alone = reassemble(&bytes)
                .iter()
                .flat_map(|c| &c.streams)
                .flat_map(|s| s.segments.windows(2))
                .filter(|w| w[0].len == 1444 && w[1].len == 4)
                .count();
            println!("{name}: {crc_alone} FPDUs sent as 1444 octets + a 4-octet CRC segment");
            assert!(crc_alone > 0);
            continue;
        }
        // The *_bw captures keep only their first frames, and
        // write_bw_offload.pcap has a 256-octet snap length: their streams
        // may end inside an FPDU.
        let truncated = name.contains("_bw");
        let sum = replay(&name, &bytes, !truncated);
        assert!(sum.connections > 0, "{name}: no MPA connection");
        total += sum.fpdus;
        match name.as_str() {
            "rping.pcap" => {
                let dirs: Vec<_> = sum.per_dir.iter().map(|(_, t)| &t.by_opcode).collect();
                let m = |pairs: &[(&'static str, usize)]| {
                    pairs.iter().copied().collect::<BTreeMap<_, _>>()
                };
                assert_eq!(*dirs[0], m(&[("ReadResp", 10), ("Send", 20)]));
                assert_eq!(*dirs[1], m(&[("ReadReq", 10), ("Send", 20), ("Write", 10)]));
            }
            "host-probe.pcap" => {
                assert_eq!(sum.not_mpa, 1, "the port-5000 probe");
                assert_eq!(sum.rejected, 1, "the markers request");
                assert_eq!(sum.rtr_connections, 1);
                assert!(sum.crc_bad_big_endian > 0, "the probe's big-endian CRC");
            }
            // Complete captures: 200 iterations each way on the data QP,
            // plus perftest's exchange on its control connection.
            "read_lat.pcap" | "send_lat.pcap" => assert_eq!(sum.fpdus, 422),
            "write_lat.pcap" => assert_eq!(sum.fpdus, 420),
            _ => {}
        }
        if name != "host-probe.pcap" {
            assert_eq!(sum.crc_bad_big_endian, 0, "{name}");
        }
    }
    println!("all captures: {total} FPDUs deframed, no framing error");
    assert!(total > 6_000);
}
