//! The service's Prometheus endpoint: the text exposition format, version
//! 0.0.4 (`text/plain; version=0.0.4`), served by a small HTTP/1.1
//! responder on a standard `TcpListener` thread (`GET /metrics`, one
//! request per connection).
//!
//! Every figure comes from what the workers publish into atomics
//! ([`Dataplane::stats`], [`Dataplane::qp_snapshots`]), from the DPDK
//! device's own counters ([`Dataplane::port_stats`], read by the scraping
//! thread as DPDK's telemetry reads them) or from the responders' last
//! runs: a scrape takes no lock a worker could wait on and sends nothing
//! to the workers, so scraping does not slow the data path (the `scrape`
//! benchmark in `benches/` measures it).
//!
//! Names: `iwarp_<what>_total` counters and gauges labelled by `worker`,
//! the link's own counters as `iwarp_link_<what>_total{port="0"}`, the
//! NIC's as `iwarp_port_<what>_total{port="0",device="net_af_packet0"}`
//! (`rx_packets`, `tx_packets`, `rx_bytes`, `tx_bytes`, `rx_missed`,
//! `rx_errors`, `tx_errors`, `rx_nombuf`: frames the NIC counted or dropped
//! before a worker saw them) and its driver's extended counters as
//! `iwarp_port_xstat{port,device,stat="rx_good_packets"}` (untyped: the
//! drivers decide what they mean),
//! queue-pair gauges labelled by `state`, responder figures labelled by
//! `responder` (`perf:18515`, `rping:7174`), the perf latency tests'
//! samples of all sessions as a histogram,
//! `iwarp_perf_latency_seconds_bucket{le=…}` (1, 2 and 5 of each decade
//! from 1 µs to 10 s), and their last run's quantiles as a summary,
//! `iwarp_perf_last_latency_seconds{quantile=…}` (a family has one type,
//! hence two names).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read as _, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::runner::{LatencyHistogram, LATENCY_BOUNDS_NS};
use super::serve::Service;
use super::ToolError;
use dataplane::api::{Dataplane, QpStatus};
use dataplane::link::{DeviceCounters, DevicePortStats};
use dataplane::worker::WorkerStats;

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// How long a scraper may take to send its request.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest request head read.
const MAX_HEAD: u64 = 8192;

/// `ADDRESS:PORT`, or empty for no endpoint.
pub fn parse_listen(text: &str) -> Result<Option<SocketAddr>, ToolError> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(None);
    }
    t.parse().map(Some).map_err(|_| {
        ToolError::Usage(format!(
            "metrics.listen {text:?}: expected ADDRESS:PORT such as 127.0.0.1:9478, or \"\""
        ))
    })
}

/// Serves scrapes until the service stops.
pub fn serve(svc: &Service, listener: TcpListener, path: &str) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    while !svc.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = answer(svc, stream, path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn answer(svc: &Service, stream: TcpStream, path: &str) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?).take(MAX_HEAD);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The rest of the head: read up to the blank line.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 0 && line.trim_end() != "" {
        line.clear();
    }
    let mut parts = request.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let target = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, target == path) {
        ("GET", true) => ("200 OK", CONTENT_TYPE, render_service(svc)),
        ("GET", false) => (
            "404 Not Found",
            "text/plain",
            format!("not found; metrics are at {path}\n"),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_string(),
        ),
    };
    let mut w = stream;
    write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    w.flush()
}

/// One metric family: its help, type and samples.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn head<'a>(out: &'a mut String, name: &str, kind: &str, help: &str) -> Family<'a> {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let _ = write!(self.out, "{name}");
        if !labels.is_empty() {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            let _ = write!(self.out, "{{{}}}", l.join(","));
        }
        let _ = writeln!(self.out, " {}", number(value));
    }
}

/// A histogram's `_bucket` (cumulative, `+Inf` last), `_sum` and
/// `_count` samples of one series; `name` is the family's.
fn histogram(f: &mut Family<'_>, name: &str, labels: &[(&str, &str)], h: &LatencyHistogram) {
    let bucket = format!("{name}_bucket");
    let mut below = 0u64;
    for (i, &c) in h.counts.iter().enumerate() {
        below = below.saturating_add(c);
        let le = LATENCY_BOUNDS_NS
            .get(i)
            .map_or(f64::INFINITY, |&ns| ns as f64 / 1e9);
        let le = number(le);
        let mut l = labels.to_vec();
        l.push(("le", le.as_str()));
        f.sample(&bucket, &l, below as f64);
    }
    f.sample(&format!("{name}_sum"), labels, h.sum_ns as f64 / 1e9);
    f.sample(&format!("{name}_count"), labels, below as f64);
}

/// A label value escaped as the format asks (backslash, quote, newline).
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample value: integers without a fraction, others as Go's
/// `strconv.FormatFloat` would, `NaN` and `±Inf` by name.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// A per-worker counter or gauge: its name, help and where it is read.
type WorkerCounter = (&'static str, &'static str, fn(&WorkerStats) -> u64);

/// The worker and queue-pair families of `dp` (what a dataplane alone
/// can say; the service adds its responders).
pub fn render_dataplane(dp: &Dataplane, out: &mut String) {
    let stats = dp.stats();
    let counters: [WorkerCounter; 26] = [
        ("iwarp_rx_packets_total", "Frames received.", |s| {
            s.rx_packets
        }),
        (
            "iwarp_rx_bytes_total",
            "Bytes of the frames received.",
            |s| s.rx_bytes,
        ),
        ("iwarp_tx_packets_total", "Frames transmitted.", |s| {
            s.tx_packets
        }),
        (
            "iwarp_tx_bytes_total",
            "Bytes of the frames transmitted.",
            |s| s.tx_bytes,
        ),
        (
            "iwarp_punts_total",
            "Frames that took the slow path (ARP, ICMP, TCP control).",
            |s| s.punts,
        ),
        (
            "iwarp_retransmits_total",
            "TCP segments retransmitted.",
            |s| s.retransmits,
        ),
        (
            "iwarp_paws_drops_total",
            "TCP segments dropped by PAWS: TSval more than one tick behind TS.Recent.",
            |s| s.paws_drops,
        ),
        (
            "iwarp_shutdown_resets_total",
            "Connections reset at stop because their FIN exchange had not finished in time.",
            |s| s.shutdown_resets,
        ),
        (
            "iwarp_drops_total",
            "Frames dropped (malformed, not for us, no room, unresolved).",
            |s| s.drops,
        ),
        (
            "iwarp_terminates_total",
            "Streams ended by an RDMAP/DDP/MPA Terminate.",
            |s| s.terminates,
        ),
        (
            "iwarp_dispatch_drops_total",
            "Frames dropped because the owning worker's dispatch ring was full.",
            |s| s.dispatch_drops,
        ),
        (
            "iwarp_tx_summed_bytes_total",
            "Payload bytes summed for a TCP checksum apart from the MPA CRC pass.",
            |s| s.tx_summed_bytes,
        ),
        (
            "iwarp_tx_resummed_bytes_total",
            "Payload bytes summed again for a TCP checksum on retransmission.",
            |s| s.tx_resummed_bytes,
        ),
        (
            "iwarp_tx_payload_changed_total",
            "Retransmissions whose payload the application changed before its completion.",
            |s| s.tx_payload_changed,
        ),
        (
            "iwarp_tx_copied_frames_total",
            "Frames whose payload was copied into the frame because the port lacks multi-segment transmit.",
            |s| s.tx_copied_frames,
        ),
        (
            "iwarp_tx_fused_frames_total",
            "Frames whose payload copy, MPA CRC and TCP checksum were one pass.",
            |s| s.tx_fused_frames,
        ),
        (
            "iwarp_rx_cksum_trusted_total",
            "Received frames whose checksums the port had verified, not summed again.",
            |s| s.rx_cksum_trusted,
        ),
        (
            "iwarp_rx_segments_mid_fpdu_total",
            "Received TCP segments that ended inside an FPDU (the peer split its FPDUs).",
            |s| s.rx_segments_mid_fpdu,
        ),
        (
            "iwarp_rx_crc_in_pass_total",
            "Received FPDUs whose CRC was taken in the same read as the TCP checksum.",
            |s| s.rx_crc_in_pass,
        ),
        (
            "iwarp_tx_packed_segments_total",
            "TCP segments sent carrying several whole FPDUs.",
            |s| s.tx_packed_segments,
        ),
        (
            "iwarp_tx_packed_fpdus_total",
            "FPDUs carried by packed TCP segments.",
            |s| s.tx_packed_fpdus,
        ),
        (
            "iwarp_tx_cut_trains_total",
            "Trains of FPDUs the worker cut into segments itself (no segmentation offload).",
            |s| s.tx_cut_trains,
        ),
        (
            "iwarp_tx_ack_passes_total",
            "TX passes for owed ACKs between a receive burst and its placement.",
            |s| s.tx_ack_passes,
        ),
        ("iwarp_loops_total", "Poll-loop iterations.", |s| s.loops),
        (
            "iwarp_idle_sleeps_total",
            "Times the worker slept after its idle spins (idle.sleep_us).",
            |s| s.idle_sleeps,
        ),
        (
            "iwarp_idle_wakeups_total",
            "Times a post or control message woke the sleeping worker.",
            |s| s.idle_wakeups,
        ),
    ];
    let gauges: [WorkerCounter; 2] = [
        (
            "iwarp_worker_connections",
            "Connections a worker owns.",
            |s| s.connections,
        ),
        (
            "iwarp_worker_tx_records",
            "Records a worker has built for TCP and TCP has not had acknowledged.",
            |s| s.tx_records,
        ),
    ];
    for (kind, table) in [("counter", &counters[..]), ("gauge", &gauges[..])] {
        for &(name, help, get) in table {
            let mut f = Family::head(out, name, kind, help);
            for (i, s) in stats.iter().enumerate() {
                f.sample(name, &[("worker", &i.to_string())], get(s) as f64);
            }
        }
    }
    for (counter, value) in dp.link_stats() {
        let name = format!("iwarp_link_{counter}_total");
        let help = format!("The port's link counter {counter} (below the workers).");
        Family::head(out, &name, "counter", &help).sample(&name, &[("port", "0")], value as f64);
    }
    render_ports(&dp.port_stats(), out);
    let qps = dp.qp_snapshots();
    let mut f = Family::head(out, "iwarp_qps", "gauge", "Queue pairs by state.");
    for (state, st) in [
        ("idle", QpStatus::Idle),
        ("connecting", QpStatus::Connecting),
        ("connected", QpStatus::Connected),
        ("disconnected", QpStatus::Disconnected),
    ] {
        let n = qps.iter().filter(|q| q.status == st).count();
        f.sample("iwarp_qps", &[("state", state)], n as f64);
    }
}

/// A device counter: its name, help and where it is read.
type PortCounter = (&'static str, &'static str, fn(&DeviceCounters) -> u64);

/// The device counters of the DPDK ports, labelled by `port` (the
/// dataplane's port index) and `device` (DPDK's name for it); nothing for
/// a link with no device. A port whose counters could not be read has no
/// samples rather than zeros.
fn render_ports(ports: &[DevicePortStats], out: &mut String) {
    if ports.is_empty() {
        return;
    }
    let families: [PortCounter; 8] = [
        (
            "iwarp_port_rx_packets_total",
            "Frames the NIC received (rte_eth_stats ipackets), before any worker.",
            |c| c.rx_packets,
        ),
        (
            "iwarp_port_tx_packets_total",
            "Frames the NIC sent (opackets).",
            |c| c.tx_packets,
        ),
        (
            "iwarp_port_rx_bytes_total",
            "Bytes the NIC received (ibytes; 0 where the driver does not count them).",
            |c| c.rx_bytes,
        ),
        (
            "iwarp_port_tx_bytes_total",
            "Bytes the NIC sent (obytes).",
            |c| c.tx_bytes,
        ),
        (
            "iwarp_port_rx_missed_total",
            "Frames the NIC dropped for want of an RX descriptor: the workers fell behind (imissed).",
            |c| c.rx_missed,
        ),
        (
            "iwarp_port_rx_errors_total",
            "Erroneous frames the NIC received (ierrors).",
            |c| c.rx_errors,
        ),
        (
            "iwarp_port_tx_errors_total",
            "Frames the NIC failed to send (oerrors).",
            |c| c.tx_errors,
        ),
        (
            "iwarp_port_rx_nombuf_total",
            "Times the NIC found no mbuf to receive into (rx_nombuf).",
            |c| c.rx_nombuf,
        ),
    ];
    let labels: Vec<[(&str, String); 2]> = (0..ports.len())
        .map(|i| [("port", i.to_string()), ("device", ports[i].name.clone())])
        .collect();
    for (name, help, get) in families {
        let mut f = Family::head(out, name, "counter", help);
        for (p, l) in ports.iter().zip(&labels) {
            if let Ok(c) = &p.counters {
                f.sample(name, &[(l[0].0, &l[0].1), (l[1].0, &l[1].1)], get(c) as f64);
            }
        }
    }
    let name = "iwarp_port_xstat";
    let mut f = Family::head(
        out,
        name,
        "untyped",
        "The driver's extended counters (rte_eth_xstats), by the driver's name for each.",
    );
    for (p, l) in ports.iter().zip(&labels) {
        for (stat, value) in &p.xstats {
            f.sample(
                name,
                &[(l[0].0, &l[0].1), (l[1].0, &l[1].1), ("stat", stat)],
                *value as f64,
            );
        }
    }
}

/// Everything the service exposes.
pub fn render_service(svc: &Service) -> String {
    let mut out = String::new();
    render_dataplane(&svc.dp, &mut out);
    let name = "iwarp_uptime_seconds";
    Family::head(
        &mut out,
        name,
        "gauge",
        "Seconds since the service started.",
    )
    .sample(name, &[], svc.started.elapsed().as_secs_f64());
    let rs = &svc.responders;
    let name = "iwarp_responder_sessions_total";
    let mut f = Family::head(
        &mut out,
        name,
        "counter",
        "Sessions a responder served to the end.",
    );
    for r in rs {
        f.sample(
            name,
            &[("responder", r.name.as_str()), ("test", r.kind.as_str())],
            r.sessions.load(Ordering::Relaxed) as f64,
        );
    }
    let name = "iwarp_responder_failures_total";
    let mut f = Family::head(
        &mut out,
        name,
        "counter",
        "Sessions that failed after a client came.",
    );
    for r in rs {
        f.sample(
            name,
            &[("responder", r.name.as_str()), ("test", r.kind.as_str())],
            r.failures.load(Ordering::Relaxed) as f64,
        );
    }
    let name = "iwarp_responder_active";
    let mut f = Family::head(
        &mut out,
        name,
        "gauge",
        "1 while a responder serves a client.",
    );
    for r in rs {
        f.sample(
            name,
            &[("responder", r.name.as_str()), ("test", r.kind.as_str())],
            f64::from(u8::from(r.active.load(Ordering::Relaxed))),
        );
    }
    let lasts: Vec<_> = rs.iter().map(|r| (r, r.last_run())).collect();
    let name = "iwarp_perf_bandwidth_bytes_per_second";
    let mut f = Family::head(
        &mut out,
        name,
        "gauge",
        "Average bandwidth of a perf responder's last bandwidth run.",
    );
    for (r, l) in &lasts {
        if let Some(bw) = l.as_ref().and_then(|l| l.bw_mbps) {
            f.sample(
                name,
                &[("responder", r.name.as_str()), ("test", r.kind.as_str())],
                bw * 1e6,
            );
        }
    }
    let name = "iwarp_perf_latency_seconds";
    let mut f = Family::head(
        &mut out,
        name,
        "histogram",
        "Latency samples of a perf latency responder's sessions served to the end.",
    );
    for r in rs {
        if let Some(h) = r.latency_histogram() {
            let labels = [("responder", r.name.as_str()), ("test", r.kind.as_str())];
            histogram(&mut f, name, &labels, &h);
        }
    }
    let name = "iwarp_perf_last_latency_seconds";
    let mut f = Family::head(
        &mut out,
        name,
        "summary",
        "Latency quantiles of a perf responder's last latency run.",
    );
    for (r, l) in &lasts {
        let Some((lat, iters)) = l
            .as_ref()
            .and_then(|l| l.latency.map(|x| (x, l.iterations)))
        else {
            continue;
        };
        for (q, us) in [
            ("0.5", lat.p50_us),
            ("0.99", lat.p99_us),
            ("0.999", lat.p999_us),
        ] {
            f.sample(
                name,
                &[
                    ("responder", r.name.as_str()),
                    ("test", r.kind.as_str()),
                    ("quantile", q),
                ],
                us / 1e6,
            );
        }
        let labels = [("responder", r.name.as_str()), ("test", r.kind.as_str())];
        f.sample(
            "iwarp_perf_last_latency_seconds_sum",
            &labels,
            lat.avg_us / 1e6 * iters as f64,
        );
        f.sample(
            "iwarp_perf_last_latency_seconds_count",
            &labels,
            iters as f64,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_labels_follow_the_format() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        let mut out = String::new();
        Family::head(&mut out, "x_total", "counter", "An x.").sample(
            "x_total",
            &[("worker", "0")],
            7.0,
        );
        assert_eq!(
            out,
            "# HELP x_total An x.\n# TYPE x_total counter\nx_total{worker=\"0\"} 7\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_inf_last() {
        let mut h = LatencyHistogram::default();
        for ns in [500, 1_500, 1_500, 3_000, 20_000_000_000] {
            h.record(ns);
        }
        let mut out = String::new();
        let mut f = Family::head(&mut out, "l_seconds", "histogram", "L.");
        histogram(&mut f, "l_seconds", &[("test", "t")], &h);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2 + LATENCY_BOUNDS_NS.len() + 1 + 2, "{out}");
        assert_eq!(lines[2], "l_seconds_bucket{test=\"t\",le=\"0.000001\"} 1");
        assert_eq!(lines[3], "l_seconds_bucket{test=\"t\",le=\"0.000002\"} 3");
        assert_eq!(lines[4], "l_seconds_bucket{test=\"t\",le=\"0.000005\"} 4");
        assert!(
            out.contains("l_seconds_bucket{test=\"t\",le=\"0.001\"} 4\n"),
            "{out}"
        );
        assert!(
            out.contains("l_seconds_bucket{test=\"t\",le=\"10\"} 4\n"),
            "{out}"
        );
        assert!(
            out.contains("l_seconds_bucket{test=\"t\",le=\"+Inf\"} 5\n"),
            "{out}"
        );
        assert!(
            out.ends_with("l_seconds_sum{test=\"t\"} 20.0000065\nl_seconds_count{test=\"t\"} 5\n"),
            "{out}"
        );
    }

    #[test]
    fn port_counters_are_labelled_by_port_and_device() {
        let ok = DevicePortStats {
            port_id: 3,
            name: "net_af_packet0".into(),
            driver: "net_af_packet".into(),
            counters: Ok(DeviceCounters {
                rx_packets: 10,
                tx_packets: 9,
                rx_bytes: 1000,
                tx_bytes: 900,
                rx_missed: 2,
                rx_errors: 1,
                tx_errors: 0,
                rx_nombuf: 4,
            }),
            xstats: vec![("rx_good_packets".into(), 10), ("rx_q0_errors".into(), 1)],
        };
        let failed = DevicePortStats {
            port_id: 4,
            name: "0000:01:00.0".into(),
            counters: Err("rte_eth_stats_get: not supported".into()),
            xstats: Vec::new(),
            ..ok.clone()
        };
        let mut out = String::new();
        render_ports(&[ok, failed], &mut out);
        let p0 = "{port=\"0\",device=\"net_af_packet0\"}";
        for line in [
            format!("iwarp_port_rx_packets_total{p0} 10"),
            format!("iwarp_port_tx_bytes_total{p0} 900"),
            format!("iwarp_port_rx_missed_total{p0} 2"),
            format!("iwarp_port_rx_errors_total{p0} 1"),
            format!("iwarp_port_tx_errors_total{p0} 0"),
            format!("iwarp_port_rx_nombuf_total{p0} 4"),
            "# TYPE iwarp_port_rx_missed_total counter".to_string(),
            "# TYPE iwarp_port_xstat untyped".to_string(),
            "iwarp_port_xstat{port=\"0\",device=\"net_af_packet0\",stat=\"rx_q0_errors\"} 1"
                .to_string(),
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
        assert!(
            !out.contains("port=\"1\""),
            "an unreadable port has no samples, not zeros:\n{out}"
        );
        let mut none = String::new();
        render_ports(&[], &mut none);
        assert!(none.is_empty(), "no device, no port families");
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen("").unwrap(), None);
        assert_eq!(
            parse_listen("127.0.0.1:9478").unwrap(),
            Some("127.0.0.1:9478".parse().unwrap())
        );
        assert!(parse_listen("localhost").is_err());
    }
}
