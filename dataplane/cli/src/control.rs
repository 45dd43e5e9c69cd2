//! The service's control socket and the subcommands that talk to it
//! (`iwarp stats`, `iwarp qp list`, `iwarp capture start|stop`).
//!
//! A Unix stream socket (path and mode from `[serve]`), removed when the
//! service stops. The protocol is line-oriented JSON: the client sends one
//! request object and reads one response object, each on one line:
//!
//! ```text
//! > {"cmd":"stats"}
//! < {"ok":true,"data":{"workers":[…],"ports":[…],"responders":[…],…}}
//! > {"cmd":"qp_list"}
//! < {"ok":true,"data":{"qps":[…]}}
//! > {"cmd":"capture_start","file":"a.pcap","snaplen":0}
//! < {"ok":true,"data":{"file":"/var/lib/iwarp/captures/a.pcap",…}}
//! > {"cmd":"capture_stop"}
//! < {"ok":true,"data":{"captured":…,"dropped":…,"workers":[…],…}}
//! > {"cmd":"nonsense"}
//! < {"ok":false,"error":"unknown command \"nonsense\""}
//! ```
//!
//! Everything served is read from what the workers publish into atomics
//! ([`Dataplane::stats`], [`Dataplane::qp_snapshots`]) or from the DPDK
//! device's own counters ([`Dataplane::port_stats`], under each port's
//! `device_counters`: what the NIC dropped before a worker saw it): a
//! request never waits for a worker and a worker never waits for a
//! request. A capture
//! is written by a thread of its own ([`dataplane::capture`]); stopping one
//! waits for each worker's next loop to let go of its ring.

use std::io::{BufRead, BufReader, Read as _, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

use super::serve::Service;
use super::ToolError;
use dataplane::api::{Dataplane, QpStatus};
use dataplane::link::DevicePortStats;
use dataplane::worker::WorkerStats;

/// Where `iwarp stats` and `iwarp qp list` look without `--socket`.
pub const DEFAULT_SOCKET: &str = "/run/iwarp/control.sock";
/// Largest snap length taken (tcpdump's largest).
pub const MAX_SNAPLEN: u32 = 262_144;
/// Longest request line taken.
const MAX_REQUEST: usize = 4096;
/// How long a connection may take to send its request, and a client to
/// get its answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Octal permissions such as `"0660"`.
pub fn parse_mode(text: &str) -> Result<u32, ToolError> {
    let t = text.trim();
    u32::from_str_radix(t, 8)
        .ok()
        .filter(|m| !t.is_empty() && *m <= 0o777)
        .ok_or_else(|| {
            ToolError::Usage(format!(
                "serve.socket_mode {text:?}: expected octal permissions such as \"0660\""
            ))
        })
}

/// The service's end of the socket.
#[derive(Debug)]
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
}

impl Server {
    /// Binds `path` with permissions `mode`, owned by `group` if not
    /// empty (a name from `/etc/group`, or a number). A stale socket
    /// (nobody answers on it) is replaced; a live one is refused, so that
    /// two services do not share a path.
    pub fn bind(path: &Path, mode: u32, group: &str) -> std::io::Result<Server> {
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another service answers on it",
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        let placed = (|| {
            if !group.is_empty() {
                let gid = group_id(group).ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("no group {group:?} (serve.socket_group)"),
                    )
                })?;
                std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("giving it to group {group:?}: {e}"))
                })?;
            }
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        })();
        if let Err(e) = placed {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        listener.set_nonblocking(true)?;
        Ok(Server {
            listener,
            path: path.to_path_buf(),
        })
    }

    /// Answers requests until the service stops, one connection at a time
    /// (requests are short), then removes the socket.
    pub fn serve(&self, svc: &Service) {
        while !svc.stop.load(Ordering::Acquire) {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = answer(svc, stream) {
                        svc.log.emit(
                            super::serve::Level::Debug,
                            "control_error",
                            &[("error", e.to_string())],
                        );
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The id of group `name` (from `/etc/group`), or `name` as a number.
fn group_id(name: &str) -> Option<u32> {
    let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
    groups
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let (n, _, gid) = (f.next()?, f.next()?, f.next()?);
            (n == name).then(|| gid.parse().ok()).flatten()
        })
        .next()
        .or_else(|| name.parse().ok())
}

fn answer(svc: &Service, stream: UnixStream) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?).take(MAX_REQUEST as u64);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let reply = match handle(svc, &line) {
        Ok(data) => json!({ "ok": true, "data": data }),
        Err(e) => json!({ "ok": false, "error": e }),
    };
    let mut w = stream;
    writeln!(w, "{reply}")?;
    w.flush()
}

/// The answer to one request line.
fn handle(svc: &Service, line: &str) -> Result<Value, String> {
    let req: Value = serde_json::from_str(line.trim()).map_err(|e| format!("bad request: {e}"))?;
    let cmd = req
        .get("cmd")
        .and_then(Value::as_str)
        .ok_or("bad request: no \"cmd\"")?;
    match cmd {
        "stats" => Ok(stats_json(svc)),
        "qp_list" => Ok(json!({ "qps": qps_json(&svc.dp) })),
        "capture_start" => {
            let file = req
                .get("file")
                .and_then(Value::as_str)
                .ok_or("bad request: capture_start without \"file\"")?;
            let snaplen = match req.get("snaplen") {
                None | Some(Value::Null) => 0,
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n <= MAX_SNAPLEN)
                    .ok_or(format!("bad request: snaplen {v} (0 to {MAX_SNAPLEN})"))?,
            };
            svc.capture_start(file, snaplen)
        }
        "capture_stop" => svc.capture_stop(),
        other => Err(format!("unknown command {other:?}")),
    }
}

fn worker_json(i: usize, s: &WorkerStats) -> Value {
    json!({
        "worker": i,
        "rx_packets": s.rx_packets,
        "rx_bytes": s.rx_bytes,
        "tx_packets": s.tx_packets,
        "tx_bytes": s.tx_bytes,
        "punts": s.punts,
        "retransmits": s.retransmits,
        "paws_drops": s.paws_drops,
        "shutdown_resets": s.shutdown_resets,
        "drops": s.drops,
        "terminates": s.terminates,
        "forwarded": s.forwarded,
        "connections": s.connections,
        "loops": s.loops,
        "idle_sleeps": s.idle_sleeps,
        "tx_summed_bytes": s.tx_summed_bytes,
        "tx_resummed_bytes": s.tx_resummed_bytes,
        "tx_payload_changed": s.tx_payload_changed,
        "tx_copied_frames": s.tx_copied_frames,
        "tx_fused_frames": s.tx_fused_frames,
        "rx_cksum_trusted": s.rx_cksum_trusted,
        "rx_segments_mid_fpdu": s.rx_segments_mid_fpdu,
        "rx_crc_in_pass": s.rx_crc_in_pass,
        "tx_packed_segments": s.tx_packed_segments,
        "tx_packed_fpdus": s.tx_packed_fpdus,
        "tx_cut_trains": s.tx_cut_trains,
        "tx_records": s.tx_records,
        "tx_ack_passes": s.tx_ack_passes,
        "idle_wakeups": s.idle_wakeups,
        "dispatched_out": s.dispatched_out,
        "dispatched_in": s.dispatched_in,
        "dispatch_drops": s.dispatch_drops,
    })
}

/// Each worker's counters and the port's link counters, as `stats` names
/// them (`iwarp perf --counters`).
pub fn counters_json(dp: &Dataplane) -> Value {
    json!({
        "workers": dp.stats().iter().enumerate().map(|(i, s)| worker_json(i, s)).collect::<Vec<_>>(),
        "link": dp
            .link_stats()
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::from(v)))
            .collect::<serde_json::Map<_, _>>(),
    })
}

/// The `stats` answer: per worker, per port (the workers' sums: each
/// worker owns one queue of the port), the responders and queue pairs.
pub fn stats_json(svc: &Service) -> Value {
    let dp = &svc.dp;
    let stats = dp.stats();
    let sum = |f: fn(&WorkerStats) -> u64| stats.iter().map(f).sum::<u64>();
    let qps = dp.qp_snapshots();
    let connected = qps
        .iter()
        .filter(|q| q.status == QpStatus::Connected)
        .count();
    let port = &svc.config.ports[0];
    json!({
        "uptime_s": svc.started.elapsed().as_secs_f64(),
        "workers": stats.iter().enumerate().map(|(i, s)| worker_json(i, s)).collect::<Vec<_>>(),
        "ports": [{
            "port": 0,
            "device": port.device,
            "ip": dp.ip().to_string(),
            "mac": dp.mac().to_string(),
            "mtu": port.mtu,
            "rx_packets": sum(|s| s.rx_packets),
            "rx_bytes": sum(|s| s.rx_bytes),
            "tx_packets": sum(|s| s.tx_packets),
            "tx_bytes": sum(|s| s.tx_bytes),
            "drops": sum(|s| s.drops),
            "link": dp
                .link_stats()
                .into_iter()
                .map(|(k, v)| (k.to_string(), Value::from(v)))
                .collect::<serde_json::Map<_, _>>(),
            "device_counters": dp.port_stats().first().map(device_json),
        }],
        "qps": { "total": qps.len(), "connected": connected },
        "responders": svc.responders.iter().map(|r| {
            let last = r.last_run().map(|l| json!({
                "peer": l.peer,
                "bytes": l.bytes,
                "iterations": l.iterations,
                "bw_mbps": l.bw_mbps,
                "latency_us": l.latency.map(|x| json!({
                    "min": x.min_us, "p50": x.p50_us, "p99": x.p99_us,
                    "p999": x.p999_us, "max": x.max_us, "avg": x.avg_us,
                })),
            }));
            json!({
                "name": r.name,
                "kind": r.kind,
                "sessions": r.sessions.load(Ordering::Relaxed),
                "failures": r.failures.load(Ordering::Relaxed),
                "active": r.active.load(Ordering::Relaxed),
                "last": last,
            })
        }).collect::<Vec<_>>(),
    })
}

/// A port's device counters: the basic ones by name, or `error` when the
/// driver could not report them, and the driver's extended ones under
/// `xstats`. (`null` in place of the object: a link with no device.)
fn device_json(d: &DevicePortStats) -> Value {
    let mut o = serde_json::Map::new();
    o.insert("port_id".into(), d.port_id.into());
    o.insert("name".into(), d.name.clone().into());
    o.insert("driver".into(), d.driver.clone().into());
    match &d.counters {
        Ok(c) => {
            for (k, v) in c.named() {
                o.insert(k.into(), v.into());
            }
        }
        Err(e) => {
            o.insert("error".into(), e.clone().into());
        }
    }
    let x: serde_json::Map<String, Value> = d
        .xstats
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(*v)))
        .collect();
    o.insert("xstats".into(), x.into());
    Value::Object(o)
}

fn status_name(s: QpStatus) -> &'static str {
    match s {
        QpStatus::Idle => "idle",
        QpStatus::Connecting => "connecting",
        QpStatus::Connected => "connected",
        QpStatus::Disconnected => "disconnected",
    }
}

/// The `qp_list` answer: every live queue pair.
pub fn qps_json(dp: &Dataplane) -> Vec<Value> {
    dp.qp_snapshots()
        .iter()
        .map(|q| {
            let c = q.connection.as_ref();
            json!({
                "qpn": q.qpn.0,
                "worker": q.worker,
                "state": status_name(q.status),
                "peer": c.map(|c| c.remote.to_string()),
                "mpa": c.map(|c| json!({
                    "revision": c.revision,
                    "crc": c.crc,
                    "markers_rx": c.markers_rx,
                    "markers_tx": c.markers_tx,
                    "rtr": c.rtr.map(|r| format!("{r:?}").to_lowercase()),
                    "ird": c.ird,
                    "ord": c.ord,
                })),
                "bytes_sent": q.bytes_sent,
                "bytes_received": q.bytes_received,
                "retransmits": q.retransmits,
                "outstanding_reads": q.outstanding_reads,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------
// The client side.
// ---------------------------------------------------------------------

/// Options of `iwarp stats`.
#[derive(Debug, Clone, Args)]
pub struct StatsArgs {
    /// The service's control socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print the service's JSON answer instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Options of `iwarp qp list`.
pub type QpListArgs = StatsArgs;

/// Sends `cmd` to the service at `socket`; its `data`.
pub fn request(socket: &Path, cmd: &str) -> Result<Value, ToolError> {
    request_with(socket, cmd, &json!({ "cmd": cmd }))
}

/// Sends the request object `req` (whose `cmd` is `cmd`); its `data`.
pub fn request_with(socket: &Path, cmd: &str, req: &Value) -> Result<Value, ToolError> {
    let unreachable = |e: std::io::Error| {
        ToolError::Peer(format!(
            "cannot reach the service at {}: {e} (is `iwarp serve` running?)",
            socket.display()
        ))
    };
    let mut s = UnixStream::connect(socket).map_err(unreachable)?;
    s.set_read_timeout(Some(IO_TIMEOUT)).map_err(unreachable)?;
    s.set_write_timeout(Some(IO_TIMEOUT)).map_err(unreachable)?;
    writeln!(s, "{req}").map_err(unreachable)?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .map_err(unreachable)?;
    let v: Value = serde_json::from_str(line.trim())
        .map_err(|e| ToolError::Peer(format!("the service's answer is not JSON: {e}")))?;
    if v.get("ok").and_then(Value::as_bool) == Some(true) {
        Ok(v.get("data").cloned().unwrap_or(Value::Null))
    } else {
        Err(ToolError::Peer(format!(
            "the service refused {}: {}",
            cmd.replace('_', " "),
            v.get("error")
                .and_then(Value::as_str)
                .unwrap_or("no reason")
        )))
    }
}

fn n(v: &Value, k: &str) -> String {
    match v.get(k) {
        Some(Value::Number(x)) => x.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => "-".into(),
    }
}

/// `iwarp stats`.
pub fn run_stats(a: &StatsArgs) -> Result<(), ToolError> {
    let data = request(&a.socket, "stats")?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{data}")?;
        return Ok(());
    }
    let cols = [
        "rx_packets",
        "rx_bytes",
        "tx_packets",
        "tx_bytes",
        "retransmits",
        "paws_drops",
        "drops",
        "terminates",
        "connections",
    ];
    writeln!(
        out,
        "{:<8}{}",
        "worker",
        cols.iter().map(|c| format!("{c:>14}")).collect::<String>()
    )?;
    for w in data["workers"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "{:<8}{}",
            n(w, "worker"),
            cols.iter()
                .map(|c| format!("{:>14}", n(w, c)))
                .collect::<String>()
        )?;
    }
    // Rare and a sign of an application bug, so a line only when it
    // happened rather than a column always zero.
    for w in data["workers"].as_array().into_iter().flatten() {
        if w["tx_payload_changed"].as_u64().is_some_and(|c| c > 0) {
            writeln!(
                out,
                "worker {}: {} retransmissions carried payload the application changed before \
                 its completion ({} bytes summed again on retransmission)",
                n(w, "worker"),
                n(w, "tx_payload_changed"),
                n(w, "tx_resummed_bytes")
            )?;
        }
    }
    for p in data["ports"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "port {} {} {} {}: rx {} packets {} bytes, tx {} packets {} bytes, {} drops",
            n(p, "port"),
            n(p, "device"),
            n(p, "ip"),
            n(p, "mac"),
            n(p, "rx_packets"),
            n(p, "rx_bytes"),
            n(p, "tx_packets"),
            n(p, "tx_bytes"),
            n(p, "drops")
        )?;
        if let Some(link) = p["link"].as_object().filter(|l| !l.is_empty()) {
            let parts: Vec<String> = link.iter().map(|(k, v)| format!("{k} {v}")).collect();
            writeln!(out, "  link: {}", parts.join(", "))?;
        }
        write_device(&mut out, &p["device_counters"])?;
    }
    writeln!(
        out,
        "queue pairs: {} connected of {}",
        n(&data["qps"], "connected"),
        n(&data["qps"], "total")
    )?;
    for r in data["responders"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "responder {:<12} {:<10} sessions {:>6} failures {:>4}{}",
            n(r, "name"),
            n(r, "kind"),
            n(r, "sessions"),
            n(r, "failures"),
            if r["active"].as_bool() == Some(true) {
                "  (serving)"
            } else {
                ""
            }
        )?;
    }
    out.flush()?;
    Ok(())
}

/// The `device` lines of a port: the NIC's own counters, then its
/// driver's extended counters that are not zero.
fn write_device(out: &mut impl Write, d: &Value) -> std::io::Result<()> {
    if !d.is_object() {
        return writeln!(out, "  device: none (not a DPDK port)");
    }
    let head = format!(
        "  device {} ({}, port {})",
        n(d, "name"),
        n(d, "driver"),
        n(d, "port_id")
    );
    if d.get("error").is_some() {
        return writeln!(out, "{head}: counters unavailable: {}", n(d, "error"));
    }
    writeln!(
        out,
        "{head}: rx {} packets {} bytes, tx {} packets {} bytes, rx missed {}, rx errors {}, \
         tx errors {}, rx no mbuf {}",
        n(d, "rx_packets"),
        n(d, "rx_bytes"),
        n(d, "tx_packets"),
        n(d, "tx_bytes"),
        n(d, "rx_missed"),
        n(d, "rx_errors"),
        n(d, "tx_errors"),
        n(d, "rx_nombuf")
    )?;
    let nonzero: Vec<String> = d["xstats"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| v.as_u64() != Some(0))
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if !nonzero.is_empty() {
        writeln!(out, "  device xstats (non-zero): {}", nonzero.join(", "))?;
    }
    Ok(())
}

/// `iwarp qp list`.
pub fn run_qp_list(a: &QpListArgs) -> Result<(), ToolError> {
    let data = request(&a.socket, "qp_list")?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{data}")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:>6} {:>6} {:<13} {:<21} {:>3} {:<5} {:<7} {:<6} {:>7} {:>14} {:>14} {:>8} {:>6}",
        "qpn",
        "worker",
        "state",
        "peer",
        "rev",
        "crc",
        "markers",
        "rtr",
        "ird/ord",
        "bytes_sent",
        "bytes_recv",
        "retrans",
        "reads"
    )?;
    for q in data["qps"].as_array().into_iter().flatten() {
        let m = &q["mpa"];
        let markers = match (m["markers_rx"].as_bool(), m["markers_tx"].as_bool()) {
            (Some(rx), Some(tx)) => format!("{}/{}", u8::from(rx), u8::from(tx)),
            _ => "-".into(),
        };
        let ird_ord = if m.is_object() {
            format!("{}/{}", n(m, "ird"), n(m, "ord"))
        } else {
            "-".into()
        };
        writeln!(
            out,
            "{:>6} {:>6} {:<13} {:<21} {:>3} {:<5} {:<7} {:<6} {:>7} {:>14} {:>14} {:>8} {:>6}",
            n(q, "qpn"),
            n(q, "worker"),
            n(q, "state"),
            n(q, "peer"),
            if m.is_object() {
                n(m, "revision")
            } else {
                "-".into()
            },
            if m.is_object() {
                n(m, "crc")
            } else {
                "-".into()
            },
            markers,
            if m.is_object() {
                n(m, "rtr")
            } else {
                "-".into()
            },
            ird_ord,
            n(q, "bytes_sent"),
            n(q, "bytes_received"),
            n(q, "retransmits"),
            n(q, "outstanding_reads")
        )?;
    }
    out.flush()?;
    Ok(())
}

/// Options of `iwarp capture start`.
#[derive(Debug, Clone, Args)]
pub struct CaptureStartArgs {
    /// The pcap file the service writes (created, or truncated). A
    /// relative name is taken under the service's `serve.capture_dir`
    /// (default /var/lib/iwarp/captures), not the current directory; an
    /// absolute one is used as given, but under the systemd unit the
    /// service's file system is read-only outside /var/lib/iwarp.
    #[arg(value_name = "FILE")]
    pub file: String,
    /// Bytes kept of each frame (default 65535: whole frames).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SNAPLEN)))]
    pub snaplen: Option<u32>,
    /// The service's control socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print the service's JSON answer.
    #[arg(long)]
    pub json: bool,
}

/// Options of `iwarp capture stop`.
pub type CaptureStopArgs = StatsArgs;

/// `iwarp capture start`.
pub fn run_capture_start(a: &CaptureStartArgs) -> Result<(), ToolError> {
    let req = json!({ "cmd": "capture_start", "file": a.file, "snaplen": a.snaplen });
    let data = request_with(&a.socket, "capture_start", &req)?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{data}")?;
    } else {
        writeln!(
            out,
            "capturing to {} (snaplen {}, {} frames queued per worker at most, up to {} bytes)",
            n(&data, "file"),
            n(&data, "snaplen"),
            n(&data, "ring_frames"),
            n(&data, "max_bytes")
        )?;
    }
    out.flush()?;
    Ok(())
}

/// `iwarp capture stop`.
pub fn run_capture_stop(a: &CaptureStopArgs) -> Result<(), ToolError> {
    let data = request(&a.socket, "capture_stop")?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{data}")?;
        return Ok(());
    }
    writeln!(
        out,
        "{}: {} frames captured, {} dropped, {} bytes{}",
        n(&data, "file"),
        n(&data, "captured"),
        n(&data, "dropped"),
        n(&data, "bytes"),
        match data["stopped_by"].as_str() {
            Some("max_bytes") => " (stopped at serve.capture_max_bytes)",
            Some("shutdown") => " (stopped with the service)",
            _ => "",
        }
    )?;
    for w in data["workers"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "  worker {}: {} captured, {} dropped",
            n(w, "worker"),
            n(w, "captured"),
            n(w, "dropped")
        )?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_groups() {
        assert_eq!(parse_mode("0660").unwrap(), 0o660);
        assert_eq!(parse_mode("600").unwrap(), 0o600);
        assert!(parse_mode("0999").is_err());
        assert!(parse_mode("").is_err());
        assert!(parse_mode("01777").is_err());
        assert_eq!(group_id("root"), Some(0));
        assert_eq!(group_id("4242"), Some(4242));
        assert_eq!(group_id("no-such-group-here"), None);
    }

    fn device(counters: Result<dataplane::link::DeviceCounters, String>) -> DevicePortStats {
        DevicePortStats {
            port_id: 0,
            name: "net_ring0".into(),
            driver: "net_ring".into(),
            counters,
            xstats: vec![("rx_good_packets".into(), 5), ("rx_q0_errors".into(), 0)],
        }
    }

    #[test]
    fn device_counters_in_json_and_text() {
        let c = dataplane::link::DeviceCounters {
            rx_packets: 5,
            tx_packets: 6,
            rx_missed: 1,
            ..Default::default()
        };
        let j = device_json(&device(Ok(c)));
        assert_eq!(j["name"], "net_ring0");
        assert_eq!(j["driver"], "net_ring");
        assert_eq!(j["rx_packets"], 5);
        assert_eq!(j["tx_packets"], 6);
        assert_eq!(j["rx_missed"], 1);
        assert_eq!(j["rx_nombuf"], 0);
        assert_eq!(j["xstats"]["rx_good_packets"], 5);
        assert!(j.get("error").is_none());
        let mut text = Vec::new();
        write_device(&mut text, &j).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("device net_ring0 (net_ring, port 0): rx 5 packets")
                && text.contains("rx missed 1,")
                && text.contains("device xstats (non-zero): rx_good_packets 5\n")
                && !text.contains("rx_q0_errors"),
            "{text}"
        );

        let j = device_json(&device(Err("rte_eth_stats_get: not supported".into())));
        assert_eq!(j["error"], "rte_eth_stats_get: not supported");
        assert!(
            j.get("rx_packets").is_none(),
            "no zeros in place of a failed read"
        );
        let mut text = Vec::new();
        write_device(&mut text, &j).unwrap();
        assert!(String::from_utf8(text)
            .unwrap()
            .contains("counters unavailable: rte_eth_stats_get: not supported"));

        let mut text = Vec::new();
        write_device(&mut text, &Value::Null).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "  device: none (not a DPDK port)\n"
        );
    }
}
