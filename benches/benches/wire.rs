//! Wire-layer cost per full-sized segment, against a memcpy of its payload.
//!
//! The frame is Ethernet + IPv4 + TCP with timestamps + 1448 payload bytes,
//! the shape of every bulk iWARP segment with a Linux peer. Parsing with
//! verification sums the whole segment once (the pseudo-header checksum);
//! parsing with `Checksum::Trusted` is what runs when the NIC has checked
//! it; emitting sums the payload once and writes 66 header bytes. The
//! checksum of the payload alone is measured too, since it dominates the
//! verifying parse and the emit. The baseline is copying the 1448 payload
//! bytes, measured in the same run; after criterion's own output the
//! ratios to it are printed.

use std::hint::black_box;
use std::net::Ipv4Addr;

use benches::Estimates;
use criterion::{Criterion, Throughput};
use tcp_offload::wire::{
    checksum, Checksum, EtherType, EthernetAddress, EthernetFrame, EthernetRepr, IpProtocol,
    Ipv4Packet, Ipv4Repr, TcpFlags, TcpOptions, TcpPacket, TcpRepr, TcpTimestamp,
};
use tcp_offload::SeqNumber;

const PAYLOAD: usize = 1448;
const SRC: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 12);
const DST: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 11);

struct Headers {
    eth: EthernetRepr,
    ip: Ipv4Repr,
    tcp: TcpRepr,
}

fn headers() -> Headers {
    let tcp = TcpRepr {
        src_port: 35889,
        dst_port: 18515,
        seq: SeqNumber(4_277_059_220),
        ack_number: SeqNumber(2_757_918_412),
        flags: TcpFlags::PSH | TcpFlags::ACK,
        window: 502,
        urgent: 0,
        options: TcpOptions {
            timestamp: Some(TcpTimestamp {
                tsval: 0xfa42_1db5,
                tsecr: 0xc1b0_7046,
            }),
            ..TcpOptions::default()
        },
    };
    Headers {
        eth: EthernetRepr {
            src_addr: EthernetAddress([0x52, 0x54, 0, 0x77, 0, 0x0c]),
            dst_addr: EthernetAddress([0x52, 0x54, 0, 0x77, 0, 0x0b]),
            ethertype: EtherType::Ipv4,
            vlan: None,
        },
        ip: Ipv4Repr {
            src_addr: SRC,
            dst_addr: DST,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.header_len() + PAYLOAD,
            hop_limit: 64,
            tos: 0,
            ident: 13743,
            dont_frag: true,
        },
        tcp,
    }
}

/// Writes the three headers in front of `payload` in `frame`; the payload
/// is summed, not copied.
fn emit(h: &Headers, frame: &mut [u8], payload: &[u8]) {
    h.eth.emit(frame);
    h.ip.emit(&mut frame[14..]);
    h.tcp.emit(&mut frame[34..], SRC, DST, payload);
}

/// Parses the whole frame down to the TCP payload; returns its length.
fn parse(frame: &[u8], cs: Checksum) -> usize {
    let f = EthernetFrame::new_checked(frame).expect("ethernet");
    let eth = EthernetRepr::parse(&f).expect("ethernet repr");
    assert_eq!(eth.ethertype, EtherType::Ipv4);
    let ipp = Ipv4Packet::new_checked(f.payload()).expect("ipv4");
    let ip = Ipv4Repr::parse(&ipp, cs).expect("ipv4 repr");
    let tp = TcpPacket::new_checked(ipp.payload()).expect("tcp");
    let tcp = TcpRepr::parse(&tp, ip.src_addr, ip.dst_addr, cs).expect("tcp repr");
    black_box(tcp);
    tp.payload().len()
}

fn frame() -> Vec<u8> {
    let h = headers();
    let hl = 14 + 20 + h.tcp.header_len();
    let mut f = vec![0u8; hl + PAYLOAD];
    for (i, b) in f[hl..].iter_mut().enumerate() {
        *b = (i * 31 + 7) as u8;
    }
    let payload = f[hl..].to_vec();
    emit(&h, &mut f, &payload);
    f
}

fn bench(c: &mut Criterion) {
    let frame = frame();
    assert_eq!(frame.len(), 1514);
    assert_eq!(parse(&frame, Checksum::Verify), PAYLOAD);
    let h = headers();
    let payload = frame[66..].to_vec();
    let mut out = vec![0u8; frame.len()];

    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Bytes(PAYLOAD as u64));
    g.bench_function("memcpy_1448", |b| {
        b.iter(|| {
            out[66..].copy_from_slice(black_box(&payload[..]));
            black_box(&out);
        })
    });
    g.bench_function("checksum_1448", |b| {
        b.iter(|| checksum::sum(black_box(&payload[..])))
    });
    g.bench_function("parse_verify", |b| {
        b.iter(|| parse(black_box(&frame), Checksum::Verify))
    });
    g.bench_function("parse_trusted", |b| {
        b.iter(|| parse(black_box(&frame), Checksum::Trusted))
    });
    g.bench_function("emit_with_payload_checksum", |b| {
        b.iter(|| {
            emit(black_box(&h), &mut out, black_box(&payload));
            black_box(&out);
        })
    });
    let sum = checksum::sum(&payload);
    g.bench_function("emit_payload_sum_given", |b| {
        b.iter(|| {
            h.eth.emit(&mut out);
            h.ip.emit(&mut out[14..]);
            h.tcp
                .emit_with_payload_sum(&mut out[34..], SRC, DST, PAYLOAD, black_box(sum));
            black_box(&out);
        })
    });
    g.finish();
}

fn main() {
    let est = Estimates::new(env!("CARGO_TARGET_TMPDIR"));
    let mut c = Criterion::default()
        .output_directory(est.dir())
        .configure_from_args();
    bench(&mut c);
    c.final_summary();

    let Some(base) = est.ns("wire", "memcpy_1448") else {
        return;
    };
    println!("\nratio to memcpy of the {PAYLOAD}-byte payload ({base:.1} ns):");
    for name in [
        "checksum_1448",
        "parse_verify",
        "parse_trusted",
        "emit_with_payload_checksum",
        "emit_payload_sum_given",
    ] {
        if let Some(t) = est.ns("wire", name) {
            println!("  {name:<28} {t:>8.1} ns  {:>6.2}x", t / base);
        }
    }
}
