//! `iwarp serve --config FILE`: the dataplane as a long-running service.
//!
//! One [`Dataplane`] is opened from the file's runtime sections; each
//! `[[serve.perf]]` entry becomes a perftest `-R` responder on its port
//! (perftest does not announce its test, so the port's profile is fixed by
//! the entry: test, size, iterations, queue pairs…), each `[[serve.rping]]`
//! an rping server; every responder takes one client after another until
//! the service stops. Responders share the dataplane on threads, each in
//! its own [`EventScope`] so that connection events reach the responder
//! they belong to. The control socket ([`super::control`]) and the
//! Prometheus endpoint ([`super::metrics`]) run beside them and read only
//! what the workers publish.
//!
//! SIGTERM or SIGINT stops the service: connections are closed, the
//! responders return, the control socket is removed and the dataplane is
//! dropped (EAL removes its runtime directory); exit status 0. Logs are
//! one line per event on stderr, `key=value` pairs (logfmt), or one JSON
//! object per line with `log_format = "json"`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;

use super::common::{catch_interrupts, eal_runtime_dir, interrupted, open_dataplane, EndpointArgs};
use super::perf::{PerfOptions, Plan};
use super::perftest::{Session, SessionParams};
use super::rping::{self, RpingOptions};
use super::runner::{
    LatencyHistogram, LatencySummary, RemoteBuf, Resources, Role, RunSpec, TestKind,
};
use super::{control, metrics, ToolError};
use dataplane::api::{Dataplane, EventScope};
use dataplane::config::{Config, PerfResponderConfig, RpingResponderConfig, SizeValue};

/// How long a perf responder waits for any one step of a client's
/// exchange before it gives the session up.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle perf responder looks at the stop flag.
const IDLE_SLICE: Duration = Duration::from_millis(200);
/// How long an rping responder waits for a client before it looks at the
/// stop flag again.
const RPING_WAIT_SLICE: Duration = Duration::from_secs(1);
/// Pause after a failed session, so that a misbehaving peer cannot make a
/// responder spin.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Options of `iwarp serve`.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// The endpoint and the service (`--config FILE` with its `[serve]`
    /// and `[metrics]` sections).
    #[command(flatten)]
    pub endpoint: EndpointArgs,
}

// ---------------------------------------------------------------------
// Logs.
// ---------------------------------------------------------------------

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Something failed for good.
    Error,
    /// Something failed and will be retried.
    Warn,
    /// A normal event.
    Info,
    /// Detail.
    Debug,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }

    fn parse(text: &str) -> Result<Level, ToolError> {
        Ok(match text {
            "error" => Level::Error,
            "warn" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            _ => {
                return Err(ToolError::Usage(format!(
                    "serve.log_level {text:?}: expected error, warn, info or debug"
                )))
            }
        })
    }
}

/// Structured log lines on stderr: `ts=… level=… event=… key=value…`.
#[derive(Debug, Clone, Copy)]
pub struct Log {
    level: Level,
    json: bool,
}

impl Log {
    /// Lines up to `level`, as JSON objects if `json`.
    pub fn new(level: Level, json: bool) -> Log {
        Log { level, json }
    }

    /// One line for `event` with `fields`, if `level` is shown.
    pub fn emit(&self, level: Level, event: &str, fields: &[(&str, String)]) {
        if level > self.level {
            return;
        }
        eprintln!("{}", self.format(level, event, fields));
    }

    /// The line [`Log::emit`] writes.
    pub fn format(&self, level: Level, event: &str, fields: &[(&str, String)]) -> String {
        let ts = utc_timestamp(SystemTime::now());
        if self.json {
            let mut m = serde_json::Map::new();
            m.insert("ts".into(), ts.into());
            m.insert("level".into(), level.name().into());
            m.insert("event".into(), event.into());
            for (k, v) in fields {
                m.insert((*k).into(), v.clone().into());
            }
            return serde_json::Value::Object(m).to_string();
        }
        let mut s = format!("ts={ts} level={} event={event}", level.name());
        for (k, v) in fields {
            let _ = write!(s, " {k}={}", logfmt_value(v));
        }
        s
    }

    /// [`Level::Info`].
    pub fn info(&self, event: &str, fields: &[(&str, String)]) {
        self.emit(Level::Info, event, fields);
    }

    /// [`Level::Warn`].
    pub fn warn(&self, event: &str, fields: &[(&str, String)]) {
        self.emit(Level::Warn, event, fields);
    }
}

/// A logfmt value: bare if it needs no quoting.
fn logfmt_value(v: &str) -> String {
    if !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_graphic() && c != '"' && c != '=' && c != '\\')
    {
        v.to_string()
    } else {
        format!("{v:?}")
    }
}

/// RFC 3339 UTC time with milliseconds (`2026-11-29T18:31:33.123Z`).
pub fn utc_timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's method).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

// ---------------------------------------------------------------------
// What the responders publish.
// ---------------------------------------------------------------------

/// One responder's figures, for the control socket and the metrics.
#[derive(Debug)]
pub struct ResponderState {
    /// `perf:PORT` or `rping:PORT`.
    pub name: String,
    /// The test (perf) or `rping`.
    pub kind: String,
    /// Sessions served to the end.
    pub sessions: AtomicU64,
    /// Sessions that failed after a client came.
    pub failures: AtomicU64,
    /// Whether a client is being served.
    pub active: AtomicBool,
    /// The last session's figures.
    pub last: Mutex<Option<LastRun>>,
    /// Perf latency tests: the samples of every run of every session
    /// served to the end, for the metrics' histogram.
    pub latency: Option<Mutex<LatencyHistogram>>,
}

/// What a responder's last session measured.
#[derive(Debug, Clone)]
pub struct LastRun {
    /// The client.
    pub peer: String,
    /// Bytes moved.
    pub bytes: u64,
    /// Average bandwidth in MB/s (perf bandwidth tests).
    pub bw_mbps: Option<f64>,
    /// Latency (perf latency tests).
    pub latency: Option<LatencySummary>,
    /// Iterations (messages or pings).
    pub iterations: u64,
}

impl ResponderState {
    fn new(name: String, kind: String, latency: bool) -> ResponderState {
        ResponderState {
            name,
            kind,
            sessions: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            active: AtomicBool::new(false),
            last: Mutex::new(None),
            latency: latency.then(|| Mutex::new(LatencyHistogram::default())),
        }
    }

    /// The last session's figures.
    pub fn last_run(&self) -> Option<LastRun> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The latency samples of all its sessions (perf latency tests).
    pub fn latency_histogram(&self) -> Option<LatencyHistogram> {
        self.latency
            .as_ref()
            .map(|h| *h.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What the service's threads share.
#[derive(Debug)]
pub struct Service {
    /// The dataplane.
    pub dp: Dataplane,
    /// Its configuration.
    pub config: Config,
    /// The responders.
    pub responders: Vec<ResponderState>,
    /// Set when the service stops.
    pub stop: AtomicBool,
    /// When it started.
    pub started: Instant,
    /// The log.
    pub log: Log,
    /// The packet capture the control socket runs.
    pub capture: Mutex<CaptureState>,
}

/// What the service remembers of `iwarp capture`.
#[derive(Debug, Default)]
pub struct CaptureState {
    /// The file of the running capture.
    pub file: Option<PathBuf>,
    /// The summary of a capture the service stopped by itself (the file
    /// reached `capture_max_bytes`, or the service stopped), for the next
    /// `iwarp capture stop`.
    pub finished: Option<serde_json::Value>,
}

// ---------------------------------------------------------------------
// The service.
// ---------------------------------------------------------------------

/// A perf responder's checked profile.
#[derive(Debug, Clone)]
struct PerfProfile {
    port: u16,
    plan: Plan,
}

fn perf_profile(c: &PerfResponderConfig) -> Result<PerfProfile, ToolError> {
    use clap::ValueEnum;
    let at = |m: String| ToolError::Usage(format!("serve.perf on port {}: {m}", c.port));
    let test = TestKind::from_str(&c.test, true).map_err(|_| {
        at(format!(
            "unknown test {:?}: expected write-bw, read-bw, send-bw, write-lat, read-lat or send-lat",
            c.test
        ))
    })?;
    let opts = PerfOptions {
        size: c.size.as_ref().map(|s| match s {
            SizeValue::Bytes(n) => n.to_string(),
            SizeValue::Text(t) => t.clone(),
        }),
        iters: if c.duration.is_some() {
            None
        } else {
            c.iters.map(|n| n.to_string())
        },
        duration: c.duration.map(|d| d.to_string()),
        qps: c.qps.map(|n| n.to_string()),
        port: Some(c.port.to_string()),
        all: c.all_sizes,
        tx_depth: c.tx_depth.map(|n| n.to_string()),
        // The example file documents every key on the first entry: keys
        // that do not apply to the test are ignored, not refused.
        rx_depth: c.rx_depth.filter(|_| test.is_send()).map(|n| n.to_string()),
        outs: c.outs.filter(|_| test.is_read()).map(|n| n.to_string()),
        report_gbits: c.report_gbits,
        verify: c.data_validation,
        ..PerfOptions::default()
    };
    let mut plan = opts.plan(test).map_err(|e| at(e.to_string()))?;
    plan.timeout = STEP_TIMEOUT;
    Ok(PerfProfile { port: c.port, plan })
}

fn rping_options(c: &RpingResponderConfig) -> Result<RpingOptions, ToolError> {
    let size = c.size.map_or(rping::DEFAULT_SIZE, |s| {
        usize::try_from(s).unwrap_or(usize::MAX)
    });
    if !(rping::MIN_SIZE..=rping::MAX_SIZE).contains(&size) {
        return Err(ToolError::Usage(format!(
            "serve.rping on port {}: size {size} outside {} to {}",
            c.port,
            rping::MIN_SIZE,
            rping::MAX_SIZE
        )));
    }
    Ok(RpingOptions {
        port: c.port,
        size,
        validate: c.validate,
        accept_timeout: Some(RPING_WAIT_SLICE),
        ..RpingOptions::default()
    })
}

// ---------------------------------------------------------------------
// Packet capture through the control socket.
// ---------------------------------------------------------------------

/// Where `iwarp capture start FILE` writes: a relative `file` under
/// `dir` (`serve.capture_dir`, created if missing; no `..` to leave it),
/// an absolute one as given.
pub fn capture_path(dir: &Path, file: &str) -> Result<PathBuf, String> {
    if file.is_empty() {
        return Err("capture start needs a file name".into());
    }
    let f = Path::new(file);
    if f.is_absolute() {
        return Ok(f.to_path_buf());
    }
    if f.components().any(|c| {
        !matches!(
            c,
            std::path::Component::Normal(_) | std::path::Component::CurDir
        )
    }) {
        return Err(format!(
            "capture file {file:?}: a relative name stays under {} (no \"..\")",
            dir.display()
        ));
    }
    Ok(dir.join(f))
}

/// The hint given when a capture file cannot be made: the unit leaves
/// only the state directory writable.
fn capture_hint(dir: &Path, path: &Path) -> String {
    if path.starts_with(dir) {
        String::new()
    } else {
        format!(
            "; capture files go under {} (the service's file system is read-only elsewhere)",
            dir.display()
        )
    }
}

fn summary_json(s: &dataplane::capture::CaptureSummary, stopped_by: &str) -> serde_json::Value {
    serde_json::json!({
        "file": s.path.display().to_string(),
        "bytes": s.bytes,
        "captured": s.captured(),
        "dropped": s.dropped(),
        "stopped_by": stopped_by,
        "workers": s.workers.iter().enumerate().map(|(i, w)| serde_json::json!({
            "worker": i, "captured": w.captured, "dropped": w.dropped,
        })).collect::<Vec<_>>(),
    })
}

impl Service {
    fn capture_lock(&self) -> std::sync::MutexGuard<'_, CaptureState> {
        self.capture.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a capture into `file` (see [`capture_path`]) keeping
    /// `snaplen` bytes of each frame (0: the library's default).
    pub fn capture_start(&self, file: &str, snaplen: u32) -> Result<serde_json::Value, String> {
        let s = &self.config.serve;
        let dir = Path::new(&s.capture_dir);
        let path = capture_path(dir, file)?;
        let mut st = self.capture_lock();
        if self.dp.capturing() {
            let running = st
                .file
                .as_ref()
                .map_or_else(String::new, |f| format!(" (into {})", f.display()));
            return Err(format!("a capture is running already{running}"));
        }
        if let Some(parent) = path.parent().filter(|p| p.starts_with(dir)) {
            std::fs::create_dir_all(parent).map_err(|e| {
                format!(
                    "cannot create capture directory {}: {e}{}",
                    parent.display(),
                    capture_hint(dir, parent)
                )
            })?;
        }
        let opts = dataplane::capture::CaptureOptions {
            snaplen,
            ring_slots: usize::try_from(s.capture_ring_frames.max(1)).unwrap_or(usize::MAX),
            ..dataplane::capture::CaptureOptions::default()
        };
        self.dp
            .capture_start(&path, &opts)
            .map_err(|e| format!("{e}{}", capture_hint(dir, &path)))?;
        st.file = Some(path.clone());
        st.finished = None;
        let snaplen = if snaplen == 0 {
            dataplane::capture::DEFAULT_SNAPLEN
        } else {
            snaplen
        };
        self.log.info(
            "capture_started",
            &[
                ("file", path.display().to_string()),
                ("snaplen", snaplen.to_string()),
            ],
        );
        Ok(serde_json::json!({
            "file": path.display().to_string(),
            "snaplen": snaplen,
            "ring_frames": opts.ring_slots,
            "max_bytes": s.capture_max_bytes,
        }))
    }

    /// Stops the running capture, or reports the one the service stopped
    /// by itself since the last `stop`.
    pub fn capture_stop(&self) -> Result<serde_json::Value, String> {
        if self.dp.capturing() {
            return self.capture_end("request");
        }
        self.capture_lock()
            .finished
            .take()
            .ok_or_else(|| "no capture is running".to_string())
    }

    /// Stops the capture; the summary (also logged).
    fn capture_end(&self, stopped_by: &str) -> Result<serde_json::Value, String> {
        let mut st = self.capture_lock();
        let summary = self.dp.capture_stop().map_err(|e| e.to_string())?;
        st.file = None;
        self.log.info(
            "capture_stopped",
            &[
                ("file", summary.path.display().to_string()),
                ("captured", summary.captured().to_string()),
                ("dropped", summary.dropped().to_string()),
                ("bytes", summary.bytes.to_string()),
                ("stopped_by", stopped_by.to_string()),
            ],
        );
        Ok(summary_json(&summary, stopped_by))
    }

    /// Stops a capture whose file reached `serve.capture_max_bytes`,
    /// keeping its summary for `iwarp capture stop`.
    fn capture_limit(&self) {
        let limit = self.config.serve.capture_max_bytes;
        let file = match &self.capture_lock().file {
            Some(f) if limit > 0 && self.dp.capturing() => f.clone(),
            _ => return,
        };
        let size = std::fs::metadata(&file).map_or(0, |m| m.len());
        if size >= limit {
            if let Ok(v) = self.capture_end("max_bytes") {
                self.capture_lock().finished = Some(v);
            }
        }
    }
}

/// Runs the service until SIGTERM or SIGINT.
pub fn run(args: &ServeArgs) -> Result<(), ToolError> {
    if args.endpoint.config.is_none() {
        return Err(ToolError::Usage("serve needs --config FILE".into()));
    }
    // The TOML parser's messages may span lines: one line, as every error.
    let config = args.endpoint.config().map_err(|e| match e {
        ToolError::Config(c) => ToolError::Usage(format!(
            "configuration: {}",
            c.to_string()
                .trim_start_matches("configuration: ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        )),
        other => other,
    })?;
    let s = &config.serve;
    let log = Log::new(
        Level::parse(&s.log_level)?,
        match s.log_format.as_str() {
            "text" => false,
            "json" => true,
            other => {
                return Err(ToolError::Usage(format!(
                    "serve.log_format {other:?}: expected text or json"
                )))
            }
        },
    );
    // Everything is checked before EAL starts.
    let perf: Vec<PerfProfile> = s.perf.iter().map(perf_profile).collect::<Result<_, _>>()?;
    let rpings: Vec<RpingOptions> = s
        .rping
        .iter()
        .map(rping_options)
        .collect::<Result<_, _>>()?;
    let mut ports: Vec<u16> = perf
        .iter()
        .map(|p| p.port)
        .chain(rpings.iter().map(|r| r.port))
        .collect();
    ports.sort_unstable();
    if let Some(w) = ports.windows(2).find(|w| w[0] == w[1]) {
        return Err(ToolError::Usage(format!(
            "serve: port {} has two responders",
            w[0]
        )));
    }
    let mode = control::parse_mode(&s.socket_mode)?;
    let metrics_addr = metrics::parse_listen(&config.metrics.listen)?;
    let shutdown_timeout = Duration::from_secs(s.shutdown_timeout_s.max(1));
    let socket_path = std::path::PathBuf::from(&s.control_socket);
    let runtime = eal_runtime_dir(&config).filter(|d| !d.exists());

    catch_interrupts();
    let dp = open_dataplane(&config)?;
    let mut responders: Vec<ResponderState> = perf
        .iter()
        .map(|p| {
            ResponderState::new(
                format!("perf:{}", p.port),
                p.plan.test.to_string(),
                p.plan.test.is_latency(),
            )
        })
        .collect();
    responders.extend(
        rpings
            .iter()
            .map(|r| ResponderState::new(format!("rping:{}", r.port), "rping".into(), false)),
    );
    let svc = Service {
        dp,
        config: config.clone(),
        responders,
        stop: AtomicBool::new(false),
        started: Instant::now(),
        log,
        capture: Mutex::new(CaptureState::default()),
    };
    let ctl = control::Server::bind(&socket_path, mode, &s.socket_group)
        .map_err(|e| ToolError::Usage(format!("control socket {}: {e}", socket_path.display())))?;
    let http = match metrics_addr {
        Some(a) => Some(
            std::net::TcpListener::bind(a)
                .map_err(|e| ToolError::Usage(format!("metrics.listen {a}: {e}")))?,
        ),
        None => None,
    };
    log.info(
        "started",
        &[
            ("ip", svc.dp.ip().to_string()),
            ("device", config.ports[0].device.clone()),
            ("workers", svc.dp.workers().to_string()),
            ("control_socket", socket_path.display().to_string()),
            (
                "metrics",
                metrics_addr.map_or("off".into(), |a| a.to_string()),
            ),
            ("responders", svc.responders.len().to_string()),
        ],
    );

    // A stop that hangs (a responder that does not return) must not keep
    // the service alive past its shutdown timeout: the watchdog cleans up
    // what a killed process would leave and exits.
    std::thread::scope(|scope| {
        let svc = &svc;
        for (i, p) in perf.iter().enumerate() {
            let state = &svc.responders[i];
            scope.spawn(move || perf_responder(svc, state, p));
        }
        for (j, r) in rpings.iter().enumerate() {
            let state = &svc.responders[perf.len() + j];
            scope.spawn(move || rping_responder(svc, state, r));
        }
        scope.spawn(|| ctl.serve(svc));
        if let Some(l) = http {
            let path = svc.config.metrics.path.clone();
            scope.spawn(move || metrics::serve(svc, l, &path));
        }
        notify_systemd(&format!(
            "READY=1\nSTATUS=serving {} responders",
            svc.responders.len()
        ));
        while !interrupted() {
            std::thread::sleep(Duration::from_millis(100));
            svc.capture_limit();
        }
        notify_systemd("STOPPING=1");
        if svc.dp.capturing() {
            let _ = svc.capture_end("shutdown");
        }
        log.info("stopping", &[("signal", "SIGTERM/SIGINT".into())]);
        svc.stop.store(true, Ordering::Release);
        let closed = svc.dp.disconnect_all(false);
        if closed > 0 {
            log.info("disconnecting", &[("qps", closed.to_string())]);
        }
        let socket = socket_path.clone();
        let runtime = runtime.clone();
        let _ = std::thread::Builder::new()
            .name("iwarp-stop-watchdog".into())
            .spawn(move || {
                std::thread::sleep(shutdown_timeout + STEP_TIMEOUT);
                let _ = std::fs::remove_file(&socket);
                if let Some(d) = &runtime {
                    let _ = std::fs::remove_dir_all(d);
                }
                log.emit(
                    Level::Error,
                    "stop_timeout",
                    &[(
                        "waited_s",
                        (shutdown_timeout + STEP_TIMEOUT).as_secs().to_string(),
                    )],
                );
                std::process::exit(1);
            });
        // A connection closed in order still needs the peer's FIN: past
        // half the timeout, what remains is reset.
        let deadline = Instant::now() + shutdown_timeout / 2;
        while Instant::now() < deadline
            && svc
                .responders
                .iter()
                .any(|r| r.active.load(Ordering::Acquire))
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let aborted = svc.dp.disconnect_all(true);
        if aborted > 0 {
            log.warn("aborted", &[("qps", aborted.to_string())]);
        }
    });
    let _ = std::fs::remove_file(&socket_path);
    // The dataplane goes with the service: EAL removes its runtime
    // directory.
    drop(svc);
    log.info("stopped", &[]);
    Ok(())
}

/// Tells systemd (a `Type=notify` unit) how the service stands, through
/// the datagram socket `$NOTIFY_SOCKET` names (`@` for an abstract name);
/// nothing without it.
fn notify_systemd(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
        }
        None => std::os::unix::net::SocketAddr::from_pathname(&path),
    };
    if let Ok(a) = addr {
        let _ = sock.send_to_addr(state.as_bytes(), &a);
    }
}

/// Whether a failed session only means that no client came in time.
fn idle_timeout(e: &ToolError) -> bool {
    let m = e.to_string();
    m.contains("the control connection request") && m.contains("nothing within")
        || m.contains("no client connected")
}

fn peer_of(dp: &Dataplane, qp: dataplane::api::QpNum) -> String {
    dp.qp_snapshots()
        .into_iter()
        .find(|s| s.qpn == qp)
        .and_then(|s| s.connection)
        .map_or_else(|| "?".into(), |c| c.remote.ip().to_string())
}

/// A perf responder: one perftest client after another.
fn perf_responder(svc: &Service, state: &ResponderState, p: &PerfProfile) {
    let _scope = EventScope::enter(&[p.port]);
    let dp = &svc.dp;
    let log = svc.log;
    let plan = &p.plan;
    let mtu = svc.config.ports[0].mtu;
    let responder = state.name.clone();
    log.info(
        "listening",
        &[
            ("responder", responder.clone()),
            ("test", plan.test.to_string()),
            ("size", plan.size.to_string()),
            ("qps", plan.qps.to_string()),
        ],
    );
    // Resources are made when a client asks, not while waiting: a
    // responder idle for days holds one set at most.
    let backlog = plan.qps + 1;
    while !svc.stop.load(Ordering::Acquire) {
        if let Err(e) = dp.listen(p.port, backlog) {
            state.failures.fetch_add(1, Ordering::Relaxed);
            log.warn(
                "listen_failed",
                &[("responder", responder.clone()), ("error", e.to_string())],
            );
            std::thread::sleep(RETRY_PAUSE.max(Duration::from_secs(1)));
            continue;
        }
        let port = p.port;
        let asked = dp.await_event_where(IDLE_SLICE, |e| match e {
            dataplane::api::CmEvent::ConnectRequest(r) => r.local_port == port,
            dataplane::api::CmEvent::RequestRefused(r) => r.local_port == port,
            _ => false,
        });
        if !asked {
            continue;
        }
        match perf_session(dp, plan, mtu, state, log) {
            Ok(()) => {}
            Err(e) if idle_timeout(&e) => {}
            Err(e) => {
                // No connection of the failed session stays up.
                let reset = dp.abort_scope_connections();
                if !svc.stop.load(Ordering::Acquire) {
                    state.failures.fetch_add(1, Ordering::Relaxed);
                    log.warn(
                        "session_failed",
                        &[
                            ("responder", responder.clone()),
                            ("error", e.to_string()),
                            ("reset", reset.to_string()),
                        ],
                    );
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
        state.active.store(false, Ordering::Release);
    }
}

fn spec_of(plan: &Plan, size: usize) -> RunSpec {
    RunSpec {
        test: plan.test,
        role: Role::Server,
        size,
        iterations: plan.iterations,
        duration: plan.duration,
        qps: plan.qps,
        tx_depth: plan.tx_depth,
        rx_depth: plan.rx_depth,
        outstanding_reads: plan.outstanding_reads,
        verify: plan.verify,
        all_sizes: plan.all_sizes,
        busy_poll: false,
    }
}

fn perf_session(
    dp: &Dataplane,
    plan: &Plan,
    mtu: usize,
    state: &ResponderState,
    log: Log,
) -> Result<(), ToolError> {
    let resources = Resources::new(dp, &spec_of(plan, plan.size))?;
    let local: Vec<RemoteBuf> = (0..plan.qps).map(|i| resources.local_buf(i)).collect();
    let params = SessionParams {
        test: plan.test,
        size: plan.size,
        iterations: plan.iterations,
        qps: plan.qps,
        duration: plan.duration,
        all_sizes: plan.all_sizes,
        outstanding_reads: plan.outstanding_reads,
        link_mtu: mtu,
        ..SessionParams::new(plan.test, plan.size, plan.iterations)
    };
    let mut session =
        match Session::server(dp, plan.port, &params, &resources.qps, &local, plan.timeout) {
            Ok(s) => s,
            Err(e) => {
                // The buffers go back whatever happened.
                resources.close(dp);
                return Err(e);
            }
        };
    state.active.store(true, Ordering::Release);
    let peer = resources
        .qps
        .first()
        .map_or_else(|| "?".into(), |q| peer_of(dp, q.num()));
    let responder = state.name.clone();
    log.info(
        "accepted",
        &[
            ("responder", responder.clone()),
            ("peer", peer.clone()),
            ("peer_version", session.peer_version().to_string()),
        ],
    );
    let remote = session.remote();
    let mut last = None;
    let mut bytes = 0;
    let mut histogram = LatencyHistogram::default();
    let result = (|| {
        for (k, &size) in plan.sizes.iter().enumerate() {
            if k > 0 {
                session.next_size()?;
            }
            let r = resources.run(dp, &spec_of(plan, size), &remote, &mut |_| {})?;
            bytes += r.bytes;
            if let Some(l) = &r.latency {
                histogram.add(&l.histogram);
            }
            last = Some(r);
        }
        Ok::<_, ToolError>(())
    })();
    let theirs = match result {
        Ok(()) => session.finish(None),
        Err(e) => Err(e),
    };
    resources.close(dp);
    let theirs = theirs?;
    state.sessions.fetch_add(1, Ordering::Relaxed);
    if let Some(h) = &state.latency {
        h.lock().unwrap_or_else(|e| e.into_inner()).add(&histogram);
    }
    let run = LastRun {
        peer: peer.clone(),
        bytes: theirs
            .as_ref()
            .map_or(bytes, |f| f.size.saturating_mul(f.iters))
            .max(bytes),
        bw_mbps: theirs.as_ref().map(|f| f.bw_avg).or(last
            .as_ref()
            .filter(|r| r.latency.is_none())
            .map(|r| r.bw_avg_mbps)),
        latency: last.as_ref().and_then(|r| r.latency),
        iterations: theirs
            .as_ref()
            .map_or(last.as_ref().map_or(0, |r| r.iterations), |f| f.iters),
    };
    let mut fields = vec![
        ("responder", responder),
        ("peer", peer),
        ("bytes", run.bytes.to_string()),
        ("iterations", run.iterations.to_string()),
    ];
    if let Some(bw) = run.bw_mbps {
        fields.push(("bw_mbps", format!("{bw:.2}")));
    }
    if let Some(l) = &run.latency {
        fields.push(("lat_p50_us", format!("{:.2}", l.p50_us)));
        fields.push(("lat_p99_us", format!("{:.2}", l.p99_us)));
    }
    log.info("finished", &fields);
    *state.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(run);
    Ok(())
}

/// An rping responder: one rping client after another.
fn rping_responder(svc: &Service, state: &ResponderState, opts: &RpingOptions) {
    let _scope = EventScope::enter(&[opts.port]);
    let log = svc.log;
    let responder = state.name.clone();
    log.info(
        "listening",
        &[
            ("responder", responder.clone()),
            ("size", opts.size.to_string()),
        ],
    );
    // A client that came as the previous one left, served next (or
    // refused when the responder stops).
    let mut next = rping::NextClient::new(&svc.dp);
    while !svc.stop.load(Ordering::Acquire) && !interrupted() {
        let mut sink = std::io::sink();
        let mut accepted = |peer: std::net::SocketAddrV4| {
            state.active.store(true, Ordering::Release);
            log.info(
                "accepted",
                &[
                    ("responder", responder.clone()),
                    ("peer", peer.ip().to_string()),
                ],
            );
        };
        let result = rping::server_next(&svc.dp, opts, &mut sink, &mut accepted, &mut next);
        state.active.store(false, Ordering::Release);
        match result {
            Ok(s) => {
                state.sessions.fetch_add(1, Ordering::Relaxed);
                let peer = s.peer.ip().to_string();
                log.info(
                    "finished",
                    &[
                        ("responder", responder.clone()),
                        ("peer", peer.clone()),
                        ("pings", s.iterations.to_string()),
                        ("bytes", s.bytes_moved.to_string()),
                    ],
                );
                *state.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(LastRun {
                    peer,
                    bytes: s.bytes_moved,
                    bw_mbps: None,
                    latency: None,
                    iterations: s.iterations,
                });
            }
            Err(e) if idle_timeout(&e) => {}
            Err(e) => {
                if !svc.stop.load(Ordering::Acquire) && !interrupted() {
                    state.failures.fetch_add(1, Ordering::Relaxed);
                    log.warn(
                        "session_failed",
                        &[("responder", responder.clone()), ("error", e.to_string())],
                    );
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_files_resolve_under_the_capture_directory() {
        let dir = Path::new("/var/lib/iwarp/captures");
        assert_eq!(
            capture_path(dir, "a.pcap").as_deref(),
            Ok(Path::new("/var/lib/iwarp/captures/a.pcap"))
        );
        assert_eq!(
            capture_path(dir, "./day/b.pcap").as_deref(),
            Ok(Path::new("/var/lib/iwarp/captures/day/b.pcap"))
        );
        assert_eq!(
            capture_path(dir, "/var/lib/iwarp/x.pcap").as_deref(),
            Ok(Path::new("/var/lib/iwarp/x.pcap"))
        );
        assert!(capture_path(dir, "").is_err());
        let e = capture_path(dir, "day/../../etc/x.pcap").expect_err("leaves the directory");
        assert!(e.contains("stays under /var/lib/iwarp/captures"), "{e}");
        assert_eq!(
            capture_hint(dir, Path::new("/var/lib/iwarp/captures/a")),
            ""
        );
        assert!(capture_hint(dir, Path::new("/etc/a.pcap"))
            .contains("capture files go under /var/lib/iwarp/captures"));
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_000_000_123);
        assert_eq!(utc_timestamp(t), "2026-11-30T00:53:20.123Z");
        assert_eq!(utc_timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // A leap day.
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc_timestamp(t), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn log_lines_are_logfmt_or_json() {
        let fields = [
            ("responder", "perf:18515".to_string()),
            ("error", "peer said \"no\"".to_string()),
            ("empty", String::new()),
        ];
        let text = Log::new(Level::Info, false).format(Level::Warn, "session_failed", &fields);
        let rest = text.split_once(' ').map(|(ts, r)| {
            assert!(ts.starts_with("ts=") && ts.ends_with('Z'), "{ts}");
            r
        });
        assert_eq!(
            rest,
            Some(
                "level=warn event=session_failed responder=perf:18515 \
                 error=\"peer said \\\"no\\\"\" empty=\"\""
            )
        );
        let json = Log::new(Level::Info, true).format(Level::Info, "accepted", &fields);
        let v: serde_json::Value = serde_json::from_str(&json).expect("one JSON object");
        assert_eq!(v["event"], "accepted");
        assert_eq!(v["level"], "info");
        assert_eq!(v["error"], "peer said \"no\"");
        assert!(Level::parse("verbose").is_err());
        assert_eq!(Level::parse("debug").ok(), Some(Level::Debug));
    }

    #[test]
    fn profiles_follow_perf_options() {
        let c = PerfResponderConfig {
            port: 18515,
            test: "write-bw".into(),
            size: Some(SizeValue::Text("64K".into())),
            iters: Some(100),
            duration: None,
            qps: Some(2),
            tx_depth: None,
            // Ignored by a write test, as the example file lists them.
            rx_depth: Some(512),
            outs: Some(16),
            all_sizes: false,
            data_validation: false,
            report_gbits: false,
        };
        let p = perf_profile(&c).expect("a profile");
        assert_eq!(
            (p.plan.size, p.plan.iterations, p.plan.qps),
            (65_536, 100, 2)
        );
        assert_eq!(p.plan.timeout, STEP_TIMEOUT);
        let bad = PerfResponderConfig {
            size: Some(SizeValue::Bytes(0)),
            ..c.clone()
        };
        let e = perf_profile(&bad).expect_err("a zero size");
        assert!(e.to_string().contains("port 18515"), "{e}");
        let bad = PerfResponderConfig {
            test: "write-fast".into(),
            ..c
        };
        assert!(perf_profile(&bad).is_err());
        let r = RpingResponderConfig {
            port: 7174,
            size: Some(10),
            validate: false,
        };
        assert!(rping_options(&r).is_err(), "below rping's smallest size");
    }
}
