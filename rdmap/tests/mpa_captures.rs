//! Replays the siw captures in `../shared/interop/captures/` through MPA:
//! both directions of every TCP connection are reassembled, the MPA
//! request and reply go through the negotiator (which must consume exactly
//! them and rebuild the initiator's request byte for byte), and the rest
//! goes through the deframer. Asserts zero framing errors, zero CRC errors
//! other than the ones host-probe.pcap's client made on purpose, and
//! prints how many FPDUs of each RDMAP opcode each direction carried.
//!
//! Skipped (with a message) when the captures are not there: the golden
//! bytes the repository needs are embedded in the other tests.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdmap::mpa::deframe::{DeframeEvent, Deframer};
use rdmap::mpa::frame::{FrameKind, FrameRepr, RtrSet, RtrType, REQUEST_KEY};
use rdmap::mpa::negotiate::{Config, Event, Negotiator};
use rdmap::mpa::rtr;

fn captures_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/interop/captures");
    dir.is_dir().then_some(dir)
}

// ------------------------------------------------------------ pcap ----

/// Frames of a classic little-endian pcap or a pcapng file: (captured
/// bytes, original length). Only Ethernet link types are expected.
fn read_frames(bytes: &[u8]) -> Vec<(&[u8], usize)> {
    let u32le =
        |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let mut out = Vec::new();
    match bytes.get(..4) {
        Some([0xd4, 0xc3, 0xb2, 0xa1]) => {
            assert_eq!(u32le(bytes, 20), 1, "Ethernet link type");
            let mut at = 24;
            while at + 16 <= bytes.len() {
                let incl = u32le(bytes, at + 8);
                let orig = u32le(bytes, at + 12);
                out.push((&bytes[at + 16..at + 16 + incl], orig));
                at += 16 + incl;
            }
        }
        Some([0x0a, 0x0d, 0x0d, 0x0a]) => {
            assert_eq!(u32le(bytes, 8), 0x1a2b3c4d, "little-endian pcapng");
            let mut at = 0;
            while at + 12 <= bytes.len() {
                let kind = u32le(bytes, at);
                let len = u32le(bytes, at + 4);
                match kind {
                    1 => assert_eq!(
                        u16::from_le_bytes([bytes[at + 8], bytes[at + 9]]),
                        1,
                        "Ethernet link type"
                    ),
                    6 => {
                        let incl = u32le(bytes, at + 20);
                        let orig = u32le(bytes, at + 24);
                        out.push((&bytes[at + 28..at + 28 + incl], orig));
                    }
                    _ => {}
                }
                at += len;
            }
        }
        _ => panic!("not a pcap file"),
    }
    out
}

type Endpoint = ([u8; 4], u16);

/// One TCP segment: direction, sequence number, SYN flag, payload, and
/// whether the capture cut its payload short.
struct Segment<'a> {
    src: Endpoint,
    dst: Endpoint,
    seq: u32,
    syn: bool,
    payload: &'a [u8],
    /// Payload length the IP header declares.
    len: usize,
    truncated: bool,
}

fn tcp_segment(frame: &[u8]) -> Option<Segment<'_>> {
    let mut eth_type = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let mut l3 = 14;
    if eth_type == 0x8100 {
        eth_type = u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]);
        l3 = 18;
    }
    if eth_type != 0x0800 {
        return None;
    }
    let ip = frame.get(l3..)?;
    let ihl = usize::from(ip.first()? & 0x0f) * 4;
    if *ip.get(9)? != 6 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
    let src_ip: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
    let dst_ip: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
    let tcp = ip.get(ihl..)?;
    let sport = u16::from_be_bytes([*tcp.first()?, *tcp.get(1)?]);
    let dport = u16::from_be_bytes([*tcp.get(2)?, *tcp.get(3)?]);
    let seq = u32::from_be_bytes(tcp.get(4..8)?.try_into().ok()?);
    let doff = usize::from(tcp.get(12)? >> 4) * 4;
    let syn = tcp.get(13)? & 0x02 != 0;
    let want = total.checked_sub(ihl + doff)?;
    let have = tcp.len().saturating_sub(doff);
    let payload = tcp.get(doff..doff + want.min(have)).unwrap_or(&[]);
    Some(Segment {
        src: (src_ip, sport),
        dst: (dst_ip, dport),
        seq,
        syn,
        payload,
        len: want,
        truncated: have < want,
    })
}

/// One direction of a connection, reassembled in sequence order up to
/// the first hole (or payload the capture cut short).
#[derive(Default)]
struct Direction {
    isn: Option<u32>,
    /// Relative offset -> payload, first copy wins.
    segments: BTreeMap<u64, Vec<u8>>,
    /// Offset of the first octet the capture cut off, if any.
    cut_at: Option<u64>,
    /// TCP payload lengths in arrival order (for shapes).
    lengths: Vec<usize>,
}

impl Direction {
    fn stream(&self) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        for (&off, data) in &self.segments {
            let end = off + data.len() as u64;
            if off > out.len() as u64 {
                return (out, false);
            }
            if end > out.len() as u64 {
                out.extend_from_slice(&data[(out.len() as u64 - off) as usize..]);
            }
        }
        let complete = self.cut_at.map_or(true, |c| c >= out.len() as u64);
        if let Some(c) = self.cut_at {
            out.truncate(c as usize);
        }
        (out, complete)
    }
}

fn reassemble(frames: &[(&[u8], usize)]) -> Vec<(Endpoint, Endpoint, Direction)> {
    let mut dirs: HashMap<(Endpoint, Endpoint), Direction> = HashMap::new();
    let mut order = Vec::new();
    for (frame, _) in frames {
        let Some(seg) = tcp_segment(frame) else {
            continue;
        };
        let key = (seg.src, seg.dst);
        let d = dirs.entry(key).or_insert_with(|| {
            order.push(key);
            Direction::default()
        });
        if seg.syn {
            d.isn = Some(seg.seq);
            continue;
        }
        let Some(isn) = d.isn else { continue };
        if seg.len == 0 {
            continue;
        }
        let off = u64::from(seg.seq.wrapping_sub(isn).wrapping_sub(1));
        d.lengths.push(seg.len);
        if seg.truncated {
            let cut = off + seg.payload.len() as u64;
            d.cut_at = Some(d.cut_at.map_or(cut, |c| c.min(cut)));
        }
        d.segments
            .entry(off)
            .or_insert_with(|| seg.payload.to_vec());
    }
    order
        .into_iter()
        .map(|k| {
            let d = dirs.remove(&k).unwrap();
            (k.0, k.1, d)
        })
        .collect()
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
        crc: req.crc,
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

fn fmt_ep(e: Endpoint) -> String {
    format!("{}.{}.{}.{}:{}", e.0[0], e.0[1], e.0[2], e.0[3], e.1)
}

fn replay(name: &str, bytes: &[u8], expect_complete: bool) -> Summary {
    let frames = read_frames(bytes);
    let dirs = reassemble(&frames);
    let mut by_key: HashMap<(Endpoint, Endpoint), (Vec<u8>, bool)> = HashMap::new();
    for (s, d, dir) in &dirs {
        by_key.insert((*s, *d), dir.stream());
    }
    let mut sum = Summary {
        connections: 0,
        not_mpa: 0,
        rejected: 0,
        fpdus: 0,
        crc_bad_big_endian: 0,
        rtr_connections: 0,
        per_dir: Vec::new(),
    };
    for (src, dst, _) in &dirs {
        let (req_stream, req_complete) = &by_key[&(*src, *dst)];
        if req_stream.len() < 16 || &req_stream[..16] != REQUEST_KEY {
            continue;
        }
        let Some((rep_stream, rep_complete)) = by_key.get(&(*dst, *src)) else {
            continue;
        };
        sum.connections += 1;
        let what = format!("{name} {}>{}", fmt_ep(*src), fmt_ep(*dst));
        // The responder side consumes exactly the request.
        let (req, req_len) = FrameRepr::parse_prefix(req_stream).expect("request parses");
        let mut responder = Negotiator::responder(
            Config {
                crc: false,
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
        let mut init =
            Negotiator::initiator(mirror(&req), req.private_data, Duration::ZERO).unwrap();
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
                continue;
            }
            other => panic!("{what}: {other:?}"),
        };
        let f = negotiated.framing;
        let up = deframe(&req_stream[req_len..], f.crc, f.markers_tx, &what);
        let back_what = format!("{name} {}>{}", fmt_ep(*dst), fmt_ep(*src));
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
        for (w, t, complete) in [(what, up, *req_complete), (back_what, down, *rep_complete)] {
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
    for (src, dst, _) in &dirs {
        let (s, _) = &by_key[&(*src, *dst)];
        let reverse_is_mpa = by_key
            .get(&(*dst, *src))
            .is_some_and(|(r, _)| r.len() >= 16 && &r[..16] == REQUEST_KEY);
        if !s.is_empty() && &s[..16.min(s.len())] != REQUEST_KEY && !reverse_is_mpa {
            sum.not_mpa += 1;
            println!(
                "{name} {}>{}: not an MPA connection, skipped",
                fmt_ep(*src),
                fmt_ep(*dst)
            );
        }
    }
    println!(
        "{name}: {} MPA connections ({} rejected), {} FPDUs deframed",
        sum.connections, sum.rejected, sum.fpdus
    );
    sum
}

#[test]
fn replay_every_capture() {
    let Some(dir) = captures_dir() else {
        eprintln!("captures not found; skipped");
        return;
    };
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
            let frames = read_frames(&bytes);
            let dirs = reassemble(&frames);
            let crc_alone = dirs
                .iter()
                .flat_map(|(_, _, d)| d.lengths.windows(2))
                .filter(|w| w[0] == 1444 && w[1] == 4)
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
