//! `iwarp perf`: perftest-compatible bandwidth and latency tests (the
//! control exchange of perftest's `-R` mode, see [`super::perftest`]), as
//! server without a peer address and as client with one.
//!
//! This module is the command's edge: it reads perftest's options (names,
//! defaults and bounds follow perftest's `perftest_parameters.c`: `-s` with
//! `K`/`M` suffixes, 5000 iterations for `write-bw` and 1000 otherwise,
//! tx depth 128 for bandwidth and 1 for latency, rx depth 512 for sends,
//! port 18515), checks them before anything is opened so that bad input
//! costs one line and no EAL, then opens the dataplane, sets up the
//! resources ([`super::runner`]), does the exchange ([`super::perftest`]),
//! runs, and prints what perftest prints, line for line (its information
//! and address lines, [`super::perftest::text`]; its table,
//! [`super::report`]), or JSON.

use std::io::{IsTerminal, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::common::{catch_interrupts, eal_runtime_dir, interrupted, open_dataplane, EndpointArgs};
use super::perftest::wire::ib_mtu_code;
use super::perftest::{text, BwFigures, Session, SessionParams};
use super::report::{self, BwUnits, PerfReport};
use super::runner::{
    cq_moderation, Progress, RemoteBuf, Resources, Role, RunResult, RunSpec, TestKind, MAX_QPS, MB,
};
use super::ToolError;
use dataplane::api::Dataplane;

/// perftest's default port (`DEF_PORT`).
pub const DEFAULT_PORT: u16 = 18515;
/// Largest message: 1 GiB, so that a buffer per QP stays a sane size on
/// a machine without hugepages (perftest allows up to 2 GiB).
pub const MAX_SIZE: usize = 1 << 30;
/// perftest's bounds on the queue depths (`MIN_TX`..`MAX_TX`,
/// `MIN_RX`..`MAX_RX`).
const MAX_TX_DEPTH: u32 = 15_000;
const MAX_RX_DEPTH: u32 = 16_384;
/// Outstanding RDMA Reads: the most a queue pair may negotiate.
const MAX_OUTS: u32 = dataplane::api::MAX_RD_ATOM;
/// What a read test asks for without `-o` (the queue pair's default ORD).
const DEFAULT_OUTS: u32 = 16;
/// perftest's lower bound on `-n` (`MIN_ITER`).
const MIN_ITERS: u64 = 5;
/// Longest `-D` accepted: a day.
const MAX_DURATION_S: u64 = 86_400;
/// Largest size of `-a` (perftest: 2 B to 2^23 B).
pub const ALL_SIZES_MAX: usize = 1 << 23;

/// Options of `iwarp perf TEST`, boxed: the command line's enum of
/// subcommands stays small.
#[derive(Debug, Clone, Default, Args)]
pub struct PerfArgs {
    /// The options themselves.
    #[command(flatten)]
    pub options: Box<PerfOptions>,
}

impl PerfArgs {
    /// See [`PerfOptions::plan`].
    pub fn plan(&self, test: TestKind) -> Result<Plan, ToolError> {
        self.options.plan(test)
    }
}

/// The options of `iwarp perf TEST`.
///
/// Numbers are taken as text and checked by [`PerfOptions::plan`], so that
/// a bad value is reported in one line like every other error.
#[derive(Debug, Clone, Default, Args)]
pub struct PerfOptions {
    /// The server's IPv4 address: run as client. Without it, run as server
    /// and wait for a client (perftest's convention).
    #[arg(value_name = "PEER")]
    pub peer: Option<String>,
    /// Message size in bytes; `K`, `M` and `G` suffixes multiply by 1024,
    /// 1024², 1024³ (1 B to 1 GiB; default 65536 for bandwidth tests, 2
    /// for latency tests). Both sides must give the same.
    #[arg(short = 's', long = "size", value_name = "BYTES")]
    pub size: Option<String>,
    /// Iterations (at least 5; default 5000 for write-bw, 1000 otherwise).
    /// Both sides must give the same.
    #[arg(
        short = 'n',
        long = "iters",
        value_name = "N",
        conflicts_with = "duration"
    )]
    pub iters: Option<String>,
    /// Run for this many seconds instead of a number of iterations. As
    /// with perftest, the table's messages, average bandwidth and message
    /// rate are those of the middle half of the run (a quarter of it at
    /// each end is left out: the start with its cold connections, the
    /// end); `--json` gives both that (`bw_steady_mbps`) and the whole
    /// run's (`bw_avg_mbps`).
    #[arg(short = 'D', long = "duration", value_name = "SECONDS")]
    pub duration: Option<String>,
    /// Queue pairs, each its own connection on the same port (default 1,
    /// at most 16384). The configuration must have room for them:
    /// `limits.max_qp`, `tcp.max_connections` (per worker; the session's
    /// own connection counts too) and `limits.max_cqe` for their
    /// completions, e.g. `--set tcp.max_connections=10240`.
    #[arg(short = 'q', long = "qp", value_name = "N")]
    pub qps: Option<String>,
    /// TCP port of the control connection and of the data connections
    /// (default 18515).
    #[arg(short = 'p', long = "port", value_name = "PORT")]
    pub port: Option<String>,
    /// Run every size from 2 B to 8 MiB, powers of two (replaces `-s`).
    #[arg(short = 'a', long = "all", conflicts_with_all = ["size", "duration"])]
    pub all: bool,
    /// Accepted for perftest compatibility and ignored: no CPU frequency
    /// check is made, times come from the monotonic clock.
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Accepted for perftest compatibility: connections always use the
    /// RDMA CM's exchange (MPA over TCP), as perftest does with `-R`.
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// Send queue depth: work requests kept in flight per QP (1 to 15000;
    /// default 128 for bandwidth tests, 1 for latency tests).
    #[arg(short = 't', long = "tx-depth", value_name = "N")]
    pub tx_depth: Option<String>,
    /// Receive queue depth of send tests (1 to 16384; default 512, at
    /// most the number of iterations).
    #[arg(short = 'r', long = "rx-depth", value_name = "N")]
    pub rx_depth: Option<String>,
    /// Outstanding RDMA Reads per QP (the ORD/IRD asked for) in read tests
    /// (1 to 128; default 16).
    #[arg(short = 'o', long = "outs", value_name = "N")]
    pub outs: Option<String>,
    /// Report bandwidth in Gbit/s instead of MB/s.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Fill the buffers with a pattern and check what arrives (both sides
    /// must be `iwarp`; perftest sends no pattern).
    #[arg(long = "data_validation", alias = "verify")]
    pub verify: bool,
    /// Drive the dataplane's worker from the test's own thread while it
    /// measures (busy polling: a post, its transmission and its completion
    /// on one core, no hand-off to the worker thread). Best when the
    /// machine has a core for every busy thread; the worker thread serves
    /// the connection again before and after the measured loop.
    #[arg(long = "busy-poll")]
    pub busy_poll: bool,
    /// Print the results as one JSON document on standard output instead
    /// of a table.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for the peer: the client's connection attempts, the
    /// server's wait for a client (default 60).
    #[arg(long = "timeout", value_name = "SECONDS")]
    pub timeout: Option<String>,
    /// At the end, write the dataplane's counters (each worker's and the
    /// port's, as `iwarp stats --json` names them) to FILE as JSON, also
    /// after a failed run.
    #[arg(long = "counters", value_name = "FILE")]
    pub counters: Option<std::path::PathBuf>,
    /// The endpoint: device, address, cores, configuration.
    #[command(flatten)]
    pub endpoint: EndpointArgs,
}

/// A checked `iwarp perf` invocation: what to run, with whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Which test.
    pub test: TestKind,
    /// The server's address and port (client), or `None` (server).
    pub peer: Option<SocketAddrV4>,
    /// The port listened on (server) or connected to (client).
    pub port: u16,
    /// Bytes per message (the largest with `-a`).
    pub size: usize,
    /// Message sizes to run, in order (one, or the `-a` series).
    pub sizes: Vec<usize>,
    /// Iterations per size (ignored with a duration).
    pub iterations: u64,
    /// `-D`.
    pub duration: Option<Duration>,
    /// `-q`.
    pub qps: usize,
    /// `-t`, after perftest's adjustment to the iteration count.
    pub tx_depth: u32,
    /// `-r`, after perftest's adjustment to the iteration count.
    pub rx_depth: u32,
    /// `-o`.
    pub outstanding_reads: u32,
    /// `-a`.
    pub all_sizes: bool,
    /// `--data_validation`.
    pub verify: bool,
    /// `--report_gbits`.
    pub report_gbits: bool,
    /// `--busy-poll`.
    pub busy_poll: bool,
    /// `--json`.
    pub json: bool,
    /// How long to wait for the peer.
    pub timeout: Duration,
}

/// A size: decimal digits, optionally followed by `K`, `M` or `G`
/// (binary multiples; perftest takes `K` and `M`), 1 B to [`MAX_SIZE`].
pub fn parse_size(text: &str) -> Result<usize, ToolError> {
    let bad = |why: &str| ToolError::Usage(format!("bad size {text:?} (-s): {why}"));
    let t = text.trim();
    let (digits, factor) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1usize << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("expected a number of bytes, such as 4096 or 64K"));
    }
    let n = digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| bad("more than 1 GiB"))?;
    if n == 0 {
        return Err(bad("must be at least 1 byte"));
    }
    if n > MAX_SIZE {
        return Err(bad("more than 1 GiB"));
    }
    Ok(n)
}

/// A decimal number between `min` and `max`, named after its option in
/// the error.
fn parse_num(text: &str, option: &str, min: u64, max: u64) -> Result<u64, ToolError> {
    let n: u64 = text.trim().parse().map_err(|_| {
        ToolError::Usage(format!(
            "bad value {text:?} for {option}: expected a whole number"
        ))
    })?;
    if n < min || n > max {
        return Err(ToolError::Usage(format!(
            "bad value {text:?} for {option}: must be between {min} and {max}"
        )));
    }
    Ok(n)
}

/// The peer: an IPv4 address, optionally with `:port` (which then
/// overrides `-p`).
fn parse_peer(text: &str, port: u16) -> Result<SocketAddrV4, ToolError> {
    if let Ok(ip) = text.parse::<Ipv4Addr>() {
        return Ok(SocketAddrV4::new(ip, port));
    }
    text.parse::<SocketAddrV4>().map_err(|_| {
        ToolError::Usage(format!(
            "bad peer address {text:?}: expected an IPv4 address such as 10.0.0.2 \
             (host names are not resolved)"
        ))
    })
}

impl PerfOptions {
    /// Checks the options of `test` and fills in perftest's defaults; no
    /// device is touched.
    pub fn plan(&self, test: TestKind) -> Result<Plan, ToolError> {
        let lat = test.is_latency();
        let port = match &self.port {
            Some(p) => parse_num(p, "-p/--port", 1, u64::from(u16::MAX))? as u16,
            None => DEFAULT_PORT,
        };
        let peer = self
            .peer
            .as_deref()
            .map(|p| parse_peer(p, port))
            .transpose()?;
        let port = peer.map_or(port, |p| p.port());
        let sizes = if self.all {
            (1..=23).map(|b| 1usize << b).collect()
        } else {
            vec![match &self.size {
                Some(s) => parse_size(s)?,
                None if lat => 2,
                None => 65_536,
            }]
        };
        let size = sizes.iter().copied().max().unwrap_or(1);
        let duration = self
            .duration
            .as_deref()
            .map(|d| parse_num(d, "-D/--duration", 1, MAX_DURATION_S).map(Duration::from_secs))
            .transpose()?;
        let iterations = match &self.iters {
            Some(n) => parse_num(n, "-n/--iters", MIN_ITERS, u64::from(u32::MAX))?,
            None if test == TestKind::WriteBw => 5000,
            None => 1000,
        };
        let qps = match &self.qps {
            Some(q) => parse_num(q, "-q/--qp", 1, MAX_QPS as u64)? as usize,
            None => 1,
        };
        let mut tx_depth = match &self.tx_depth {
            Some(t) => parse_num(t, "-t/--tx-depth", 1, u64::from(MAX_TX_DEPTH))? as u32,
            None if lat => 1,
            None => 128,
        };
        let mut rx_depth = match &self.rx_depth {
            Some(r) => {
                let r = parse_num(r, "-r/--rx-depth", 1, u64::from(MAX_RX_DEPTH))? as u32;
                if !test.is_send() && r > 1 {
                    return Err(ToolError::Usage(
                        "-r/--rx-depth applies to send tests only".into(),
                    ));
                }
                r
            }
            // perftest 4.5: 512 for every send test, latency included.
            None if test.is_send() => 512,
            None => 1,
        };
        let outstanding_reads = match &self.outs {
            Some(o) if !test.is_read() => {
                return Err(ToolError::Usage(format!(
                    "-o/--outs {o:?} applies to read tests only"
                )));
            }
            Some(o) => parse_num(o, "-o/--outs", 1, u64::from(MAX_OUTS))? as u32,
            None if test.is_read() => DEFAULT_OUTS,
            // The data check of write-bw reads the destination back.
            None if self.verify && test == TestKind::WriteBw => DEFAULT_OUTS,
            None => 0,
        };
        // perftest: with a fixed number of iterations, no more in flight
        // than there are iterations.
        if duration.is_none() {
            let cap = u32::try_from(iterations).unwrap_or(u32::MAX);
            tx_depth = tx_depth.min(cap);
            if test.is_send() {
                rx_depth = rx_depth.min(cap);
            }
        }
        // perftest: an odd receive depth of a send test is made even (a
        // workaround of its own, kept so that credits fall where its do).
        if test.is_send() && !self.all && rx_depth % 2 == 1 {
            rx_depth += 1;
        }
        if lat && qps > 1 {
            return Err(ToolError::Usage(
                "-q/--qp: latency tests run on one QP".into(),
            ));
        }
        if self.verify && self.all {
            return Err(ToolError::Usage(
                "--data_validation checks one size per run: not with -a".into(),
            ));
        }
        let timeout = match &self.timeout {
            Some(t) => Duration::from_secs(parse_num(t, "--timeout", 1, MAX_DURATION_S)?),
            None => Duration::from_secs(60),
        };
        Ok(Plan {
            test,
            peer,
            port,
            size,
            sizes,
            iterations,
            duration,
            qps,
            tx_depth,
            rx_depth,
            outstanding_reads,
            all_sizes: self.all,
            verify: self.verify,
            report_gbits: self.report_gbits,
            busy_poll: self.busy_poll,
            json: self.json,
            timeout,
        })
    }
}

impl Plan {
    fn role(&self) -> Role {
        if self.peer.is_some() {
            Role::Client
        } else {
            Role::Server
        }
    }

    /// The runner's description of one size.
    fn spec(&self, size: usize) -> RunSpec {
        RunSpec {
            test: self.test,
            role: self.role(),
            size,
            iterations: self.iterations,
            duration: self.duration,
            qps: self.qps,
            tx_depth: self.tx_depth,
            rx_depth: self.rx_depth,
            outstanding_reads: self.outstanding_reads,
            verify: self.verify,
            all_sizes: self.all_sizes,
            busy_poll: self.busy_poll,
        }
    }

    fn session(&self, link_mtu: usize) -> SessionParams {
        SessionParams {
            test: self.test,
            size: self.size,
            iterations: self.iterations,
            qps: self.qps,
            duration: self.duration,
            all_sizes: self.all_sizes,
            outstanding_reads: self.outstanding_reads,
            link_mtu,
            // write-bw's data check reads the destination back.
            read_back: self.verify && self.test == TestKind::WriteBw,
        }
    }

    fn units(&self) -> BwUnits {
        if self.report_gbits {
            BwUnits::Gbps
        } else {
            BwUnits::MBps
        }
    }

    /// perftest's unit of the exchanged bandwidths per MiB/s (the unit of
    /// [`RunResult`]): itself, or Gbit/s with `--report_gbits`.
    fn unit_per_mibps(&self) -> f64 {
        if self.report_gbits {
            MB * 8.0 / 1e9
        } else {
            1.0
        }
    }
}

/// What this side reports to a perftest server (its `bw_report_data`).
fn figures_of(r: &RunResult, plan: &Plan) -> BwFigures {
    let k = plan.unit_per_mibps();
    BwFigures {
        size: r.size as u64,
        iters: r.iterations,
        bw_peak: r.bw_peak_mbps * k,
        bw_avg: r.bw_avg_mbps * k,
        msg_rate: r.msg_rate_mpps,
    }
}

/// The client's figures as the server got them, in a run's units (the
/// time is what the bytes and the average bandwidth imply).
fn result_of(f: &BwFigures, plan: &Plan) -> RunResult {
    let k = plan.unit_per_mibps();
    let bytes = f.size.saturating_mul(f.iters);
    let avg = f.bw_avg / k;
    let secs = if avg > 0.0 {
        bytes as f64 / (avg * MB)
    } else {
        0.0
    };
    RunResult {
        size: usize::try_from(f.size).unwrap_or(usize::MAX),
        bytes,
        iterations: f.iters,
        elapsed: Duration::try_from_secs_f64(secs).unwrap_or_default(),
        bw_peak_mbps: f.bw_peak / k,
        bw_avg_mbps: avg,
        bw_steady_mbps: None,
        msg_rate_mpps: f.msg_rate,
        latency: None,
        verified_bytes: 0,
    }
}

/// Progress on stderr once a run has lasted a while: one line a second,
/// rewritten in place on a terminal. It counts bytes on the wire, not
/// only completed messages, so that a run of a few large messages shows
/// movement while the first one is in flight; a duration run shows its
/// seconds.
struct ProgressLine {
    label: String,
    next: Duration,
    tty: bool,
    shown: bool,
}

/// How long a run goes before progress is shown, and how often then.
const PROGRESS_AFTER: Duration = Duration::from_secs(2);

/// `n` bytes in KiB, MiB or GiB, one decimal, the unit chosen by `scale`
/// (so that "done" and "total" share one).
fn binary_units(n: u64, scale: u64) -> String {
    let (div, unit) = match scale {
        s if s >= 10 << 30 => (1u64 << 30, "GiB"),
        s if s >= 10 << 20 => (1 << 20, "MiB"),
        _ => (1 << 10, "KiB"),
    };
    format!("{:.1} {unit}", n as f64 / div as f64)
}

/// One progress line (without its end).
fn progress_text(label: &str, p: &Progress) -> String {
    let secs = p.elapsed.as_secs_f64();
    match p.duration {
        Some(d) => format!(
            "{label}: {:.0}/{} s, {} moved, {} messages",
            secs.min(d.as_secs_f64()),
            d.as_secs(),
            binary_units(p.bytes, p.bytes),
            p.done
        ),
        None => {
            // The wire carries framing too: the count is capped at the
            // total, and 100% waits for the last completion.
            let moved = p.bytes.min(p.total_bytes);
            let pct = if p.done >= p.total {
                100
            } else {
                moved
                    .saturating_mul(100)
                    .checked_div(p.total_bytes)
                    .unwrap_or(0)
                    .min(99)
            };
            format!(
                "{label}: {}/{} ({pct}%), {}/{} messages, {secs:.1} s",
                binary_units(moved, p.total_bytes),
                binary_units(p.total_bytes, p.total_bytes),
                p.done,
                p.total
            )
        }
    }
}

impl ProgressLine {
    fn new(label: String) -> ProgressLine {
        ProgressLine {
            label,
            next: PROGRESS_AFTER,
            tty: std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    fn update(&mut self, p: &Progress) {
        if p.elapsed < self.next {
            return;
        }
        self.next = p.elapsed + Duration::from_secs(1);
        let end = if self.tty { "\r" } else { "\n" };
        eprint!("{}{end}", progress_text(&self.label, p));
        self.shown = true;
    }

    fn finish(&self) {
        if self.shown && self.tty {
            eprintln!();
        }
    }
}

/// Runs one perf test.
///
/// Options are checked before EAL starts; the dataplane is dropped (and
/// with it EAL, which removes its runtime directory) before this returns,
/// on every path. Without `--json`, perftest's lines go to standard output
/// as perftest prints them, each part as soon as it is known.
pub fn run(test: TestKind, args: &PerfArgs) -> Result<(), ToolError> {
    let plan = args.plan(test)?;
    let config = args.options.endpoint.config()?;
    let port = PortInfo::of(&config.ports[0]);
    let local = SocketAddrV4::new(config.ports[0].ip, plan.port);
    watch_interrupts(eal_runtime_dir(&config).filter(|d| !d.exists()));
    let dp = open_dataplane(&config)?;
    let mut stdout = std::io::stdout();
    let lines: Option<&mut dyn Write> = if plan.json { None } else { Some(&mut stdout) };
    let outcome = run_on(&dp, &plan, &port, lines);
    let written = args.options.counters.as_ref().map(|path| {
        let doc = crate::control::counters_json(&dp);
        std::fs::write(path, format!("{doc}\n")).map_err(|e| {
            ToolError::Io(std::io::Error::new(
                e.kind(),
                format!("writing the counters to {}: {e}", path.display()),
            ))
        })
    });
    drop(dp);
    let outcome = outcome?;
    written.transpose()?;
    if plan.json {
        let spec = plan.spec(plan.size);
        let doc = PerfJson {
            report: PerfReport::new(&outcome.results, &spec),
            local: local.to_string(),
            peer: plan.peer.map(|p| p.to_string()),
            peer_version: outcome.peer_version.clone(),
            measured_by: outcome.measured_by,
            data_check: match (&outcome.mismatch, plan.verify) {
                (Some(_), _) => "failed",
                (None, true) => "passed",
                (None, false) => "off",
            },
            mismatch: outcome.mismatch.clone(),
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", report::to_json(&doc))?;
        out.flush()?;
    }
    match outcome.mismatch {
        Some(m) => Err(ToolError::DataMismatch(m)),
        None => Ok(()),
    }
}

/// How often the interrupt watcher looks at the flag.
const INTERRUPT_POLL: Duration = Duration::from_millis(50);

/// SIGINT or SIGTERM ends the run at once, from any phase (waiting for a
/// client, connecting, measuring): the loops and the session do not poll
/// for signals, so a thread does. It removes EAL's runtime directory
/// (`runtime`, when this process made it), which a process that exits
/// without dropping its dataplane would leave behind, says so in one line
/// and exits with 130 (128 + SIGINT, as a shell reports it).
fn watch_interrupts(runtime: Option<PathBuf>) {
    let spawned = std::thread::Builder::new()
        .name("iwarp-signals".into())
        .spawn(move || loop {
            if interrupted() {
                if let Some(dir) = &runtime {
                    let _ = std::fs::remove_dir_all(dir);
                }
                eprintln!("iwarp: interrupted: run abandoned");
                std::process::exit(130);
            }
            std::thread::sleep(INTERRUPT_POLL);
        });
    // Without the watcher, signals keep their default action.
    if spawned.is_ok() {
        catch_interrupts();
    }
}

/// What `--json` prints: the runner's report of the figures, and the
/// session around them.
#[derive(Debug, serde::Serialize)]
struct PerfJson<'a> {
    #[serde(flatten)]
    report: PerfReport<'a>,
    /// Our address and port.
    local: String,
    /// The server's address and port (on the client).
    peer: Option<String>,
    /// The peer's perftest version string.
    peer_version: String,
    /// `local`: this side measured the results; `peer`: the client did
    /// (a write or read bandwidth server prints the client's figures, as
    /// perftest's does); `none`: no results (a read latency server).
    measured_by: &'static str,
    /// `passed`, `failed` or `off` (without `--data_validation`).
    data_check: &'static str,
    /// What differed, if the check failed.
    mismatch: Option<String>,
}

/// What a run produced.
struct Outcome {
    results: Vec<RunResult>,
    peer_version: String,
    measured_by: &'static str,
    mismatch: Option<String>,
}

/// What the test information block says of this side's port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PortInfo {
    /// The DPDK device (its name, without its arguments).
    device: String,
    /// The port's MTU.
    mtu: usize,
}

impl PortInfo {
    fn of(p: &dataplane::config::PortConfig) -> PortInfo {
        PortInfo {
            device: p.device.split(',').next().unwrap_or_default().to_string(),
            mtu: p.mtu,
        }
    }
}

/// Refuses a run that needs more queue pairs or connections than the
/// dataplane's tables hold, naming the setting to raise: otherwise the
/// run would fail part way through its setup with a table-full error.
fn check_capacity(dp: &Dataplane, spec: &RunSpec) -> Result<(), ToolError> {
    let qps = spec.qps;
    let max_qp = dp.limits().max_qp as usize;
    if qps > max_qp {
        return Err(ToolError::Usage(format!(
            "-q/--qp {qps}: limits.max_qp is {max_qp}; raise it, e.g. --set limits.max_qp={qps}"
        )));
    }
    // The data connections and the session's own.
    let needed = qps + 1;
    let room = dp.max_connections().saturating_mul(dp.workers().max(1));
    if needed > room {
        return Err(ToolError::Usage(format!(
            "-q/--qp {qps}: {needed} connections do not fit in tcp.max_connections = {} \
             per worker ({} worker(s)); raise it, e.g. --set tcp.max_connections={needed}",
            dp.max_connections(),
            dp.workers()
        )));
    }
    // Completions that can be outstanding at once: signalled sends, and
    // for Send tests the receives and the credit Writes. A smaller queue
    // would overrun in mid-run.
    let (tx, rx) = (
        u64::from(spec.tx_depth.max(1)),
        u64::from(spec.rx_depth.max(1)),
    );
    let per_qp = tx + 8 + if spec.test.is_send() { rx + tx } else { 0 };
    let cqe = per_qp * qps as u64;
    let max_cqe = u64::from(dp.limits().max_cqe);
    if cqe > max_cqe {
        return Err(ToolError::Usage(format!(
            "-q/--qp {qps}: {cqe} completions may be outstanding at once, more than \
             limits.max_cqe = {max_cqe}; raise it (--set limits.max_cqe={cqe}) or lower \
             -t/--tx-depth{}",
            if spec.test.is_send() {
                " and -r/--rx-depth"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// Writes perftest's lines, if they are wanted, flushed at once (a person
/// or a script watches them arrive as perftest's do).
fn emit(out: &mut Option<&mut dyn Write>, text: &str) -> Result<(), ToolError> {
    if let Some(w) = out {
        w.write_all(text.as_bytes())?;
        w.flush()?;
    }
    Ok(())
}

fn run_on(
    dp: &Dataplane,
    plan: &Plan,
    port: &PortInfo,
    mut out: Option<&mut dyn Write>,
) -> Result<Outcome, ToolError> {
    let role = plan.role();
    let name = plan.test.perftest_name();
    check_capacity(dp, &plan.spec(plan.size))?;
    let resources = Resources::new(dp, &plan.spec(plan.size))?;
    let local: Vec<RemoteBuf> = (0..plan.qps).map(|i| resources.local_buf(i)).collect();
    let params = plan.session(port.mtu);
    let mut session = match plan.peer {
        Some(peer) => Session::client(dp, peer, &params, &resources.qps, &local, plan.timeout)
            .map_err(|e| client_error(peer, e))?,
        None => {
            emit(&mut out, text::WAITING_BANNER)?;
            eprintln!(
                "{name}: server on port {}, waiting for a client ({} s)",
                plan.port,
                plan.timeout.as_secs()
            );
            Session::server(dp, plan.port, &params, &resources.qps, &local, plan.timeout)
                .map_err(|e| server_error(plan.port, e))?
        }
    };
    let (mine, theirs) = session.dests();
    emit(&mut out, &info_block(plan, port))?;
    emit(&mut out, &text::addresses(&mine, &theirs))?;
    let spec = plan.spec(plan.size);
    let units = plan.units();
    // perftest's read latency server measures nothing and prints no table.
    let table = !(role == Role::Server && plan.test == TestKind::ReadLat);
    if table {
        emit(&mut out, &report::table_heading(&spec, units))?;
    }
    let remote = session.remote();
    let peer_version = session.peer_version().to_string();
    let mut results = Vec::new();
    let mut mismatch = None;
    for (k, &size) in plan.sizes.iter().enumerate() {
        if k > 0 {
            session.next_size()?;
        }
        let spec = plan.spec(size);
        let mut line = ProgressLine::new(format!("{name} {size} B"));
        let r = resources.run(dp, &spec, &remote, &mut |p| line.update(p));
        line.finish();
        match r {
            // The sides that only wait return no figures.
            Ok(r) if r.iterations == 0 => {}
            Ok(r) => {
                emit(&mut out, &report::table_line(&r, &spec, units))?;
                results.push(r);
            }
            Err(ToolError::DataMismatch(m)) => {
                mismatch = Some(format!("{size} B: {m}"));
                break;
            }
            Err(e) => return Err(e),
        }
    }
    let mine = match (role, plan.test) {
        (Role::Client, TestKind::WriteBw | TestKind::ReadBw) => results
            .last()
            .map(|r| figures_of(&r.as_perftest_reports(plan.duration), plan)),
        _ => None,
    };
    let theirs = session.finish(mine.as_ref())?;
    resources.close(dp);
    let measured_by = match (role, theirs) {
        (Role::Server, Some(f)) if results.is_empty() => {
            let r = result_of(&f, plan);
            emit(&mut out, &report::table_line(&r, &spec, units))?;
            results.push(r);
            "peer"
        }
        _ if results.is_empty() => "none",
        _ => "local",
    };
    emit(&mut out, &format!("{}\n", report::RULE))?;
    Ok(Outcome {
        results,
        peer_version,
        measured_by,
        mismatch,
    })
}

/// A client that could not set the session up, in one line that names
/// the peer: no answer at all on the control connection is an unreachable
/// peer; a message that names the address already (a refused connection)
/// stays as it is; anything else gets the address in front.
fn client_error(peer: SocketAddrV4, e: ToolError) -> ToolError {
    let m = match e {
        ToolError::Peer(m) => m,
        ToolError::Dataplane(d) => d.to_string(),
        other => return other,
    };
    let addr = peer.to_string();
    ToolError::Peer(
        if m.contains("nothing within") && m.contains("the control connection") {
            format!("peer {addr} unreachable: {m}")
        } else if m.contains(&addr) {
            m
        } else {
            format!("peer {addr}: {m}")
        },
    )
}

/// A server that could not set the session up.
fn server_error(port: u16, e: ToolError) -> ToolError {
    match e {
        ToolError::Dataplane(d) => ToolError::Peer(format!("port {port}: {d}")),
        other => other,
    }
}

/// perftest's test information block for this run.
fn info_block(plan: &Plan, port: &PortInfo) -> String {
    text::test_info(&text::TestInfo {
        test: plan.test,
        role: plan.role(),
        device: &port.device,
        qps: plan.qps,
        tx_depth: plan.tx_depth,
        rx_depth: plan.rx_depth,
        cq_mod: cq_moderation(plan.size, plan.all_sizes, plan.tx_depth),
        mtu_code: ib_mtu_code(port.mtu),
        outstanding_reads: plan.outstanding_reads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::api::DriveMode;
    use dataplane::config::Config;
    use dataplane::link::{MemLink, MemLinkConfig};
    use std::time::Instant;
    use tcp_offload::wire::EthernetAddress;

    const MAC_C: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0x5e, 1]);
    const MAC_S: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0x5e, 2]);
    const IP_C: Ipv4Addr = Ipv4Addr::new(10, 94, 0, 1);
    const IP_S: Ipv4Addr = Ipv4Addr::new(10, 94, 0, 2);

    /// A client's and a server's dataplane over a memory link.
    fn pair() -> (Dataplane, Dataplane) {
        let (lc, ls) = MemLink::pair(&MemLinkConfig::default(), MAC_C, MAC_S);
        let cfg = |ip, mac| {
            let mut c = Config::single("mem:perf", ip, mac);
            c.idle.spin = 200;
            c.idle.sleep_us = 20;
            c
        };
        let c = Dataplane::open_with_link(&cfg(IP_C, MAC_C), lc, DriveMode::Threads)
            .expect("client dataplane");
        let s = Dataplane::open_with_link(&cfg(IP_S, MAC_S), ls, DriveMode::Threads)
            .expect("server dataplane");
        (c, s)
    }

    /// The port both sides of the memory link describe.
    fn port() -> PortInfo {
        PortInfo {
            device: "mem:perf".into(),
            mtu: 1500,
        }
    }

    /// `run_on` as server and as client of `test` with the options `set`
    /// gives both; the client tries again while nothing listens yet (the
    /// server's thread may not have reached its listen).
    fn both(test: TestKind, set: impl Fn(&mut PerfOptions)) -> (Outcome, Outcome) {
        let ((c, _), (s, _)) = both_printed(test, set);
        (c, s)
    }

    /// [`both`], with what each side printed (client, then server).
    fn both_printed(
        test: TestKind,
        set: impl Fn(&mut PerfOptions),
    ) -> ((Outcome, String), (Outcome, String)) {
        let (c, s) = pair();
        let server = args(|a| {
            set(a);
            a.timeout = Some("20".into());
        })
        .plan(test)
        .expect("server plan");
        let client = args(|a| {
            set(a);
            a.timeout = Some("20".into());
            a.peer = Some(IP_S.to_string());
        })
        .plan(test)
        .expect("client plan");
        let text = |b: Vec<u8>| String::from_utf8(b).expect("text");
        std::thread::scope(|scope| {
            let srv = scope.spawn(|| {
                let mut b = Vec::new();
                run_on(&s, &server, &port(), Some(&mut b)).map(|o| (o, text(b)))
            });
            let mut tries = 0;
            let cli = loop {
                let mut b = Vec::new();
                match run_on(&c, &client, &port(), Some(&mut b)) {
                    Err(e)
                        if (e.to_string().contains("nothing listens")
                            || e.to_string().contains("refused"))
                            && tries < 100 =>
                    {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    r => break r.map(|o| (o, text(b))),
                }
            };
            let cli = cli.unwrap_or_else(|e| panic!("{test} client: {e}"));
            let srv = srv
                .join()
                .expect("server thread")
                .unwrap_or_else(|e| panic!("{test} server: {e}"));
            (cli, srv)
        })
    }

    /// What each side prints of every test, line for line: the server's
    /// banner, perftest's information block for the side, the address
    /// lines of ours and the peer's QP, the table's heading, the figures
    /// of whichever side measured (none on the read latency server) and
    /// the closing rule; nothing else.
    #[test]
    fn every_test_prints_perftests_lines() {
        for test in TestKind::ALL {
            let set = |a: &mut PerfOptions| {
                a.iters = Some("20".into());
                a.size = Some(if test.is_latency() { "64" } else { "16K" }.into());
            };
            let ((_, ctext), (_, stext)) = both_printed(test, set);
            for (role, text) in [(Role::Client, &ctext), (Role::Server, &stext)] {
                println!("{test} {role:?}:\n{text}");
                let mut plan = args(set).plan(test).expect("plan");
                if role == Role::Client {
                    plan.peer = Some(SocketAddrV4::new(IP_S, plan.port));
                }
                let mut want = String::new();
                if role == Role::Server {
                    want.push_str(text::WAITING_BANNER);
                }
                want.push_str(&info_block(&plan, &port()));
                assert!(text.starts_with(&want), "{test} {role:?}: {text}");
                let rest: Vec<&str> = text[want.len()..].lines().collect();
                let (ours, peers) = match role {
                    Role::Client => (&MAC_C, &MAC_S),
                    Role::Server => (&MAC_S, &MAC_C),
                };
                let gid = |m: &EthernetAddress| {
                    let mut g: Vec<String> = m.0.iter().map(|b| format!("{b:02}")).collect();
                    g.resize(16, "00".into());
                    format!(" GID: {}", g.join(":"))
                };
                assert!(
                    rest[0].starts_with(" local address: LID 0000 QPN 0x"),
                    "{test}"
                );
                assert!(rest[0].contains(" PSN 0x"), "{test}: {}", rest[0]);
                assert_eq!(rest[1], gid(ours), "{test} {role:?}");
                assert!(
                    rest[2].starts_with(" remote address: LID 0000 QPN 0x"),
                    "{test}"
                );
                assert_eq!(rest[3], gid(peers), "{test} {role:?}");
                let mut at = 4;
                if !(test == TestKind::ReadLat && role == Role::Server) {
                    assert_eq!(rest[at], report::RULE, "{test} {role:?}");
                    let heading = if test.is_latency() {
                        report::lat_header(false)
                    } else {
                        report::bw_header(BwUnits::MBps)
                    };
                    assert_eq!(rest[at + 1], heading, "{test} {role:?}");
                    let fields: Vec<&str> = rest[at + 2].split_whitespace().collect();
                    assert_eq!(
                        fields.len(),
                        if test.is_latency() { 9 } else { 5 },
                        "{test} {role:?}: {}",
                        rest[at + 2]
                    );
                    let size = if test.is_latency() { "64" } else { "16384" };
                    // The iterations column: all messages of a bandwidth
                    // run, the iterations of a latency run (not samples).
                    assert_eq!(fields[..2], [size, "20"], "{test} {role:?}");
                    at += 3;
                }
                assert_eq!(rest[at..], [report::RULE], "{test} {role:?}: {rest:?}");
            }
            // The two sides print each other's QP numbers.
            let qpn = |t: &str, which: &str| -> String {
                t.lines()
                    .find(|l| l.starts_with(which))
                    .and_then(|l| l.split(" QPN ").nth(1))
                    .map(|r| r[..r.find(' ').unwrap_or(r.len())].to_string())
                    .unwrap_or_default()
            };
            assert_eq!(
                qpn(&ctext, " local address"),
                qpn(&stext, " remote address"),
                "{test}"
            );
            assert_eq!(
                qpn(&stext, " local address"),
                qpn(&ctext, " remote address"),
                "{test}"
            );
        }
    }

    /// Every test between two `run_on`s: the figures each side keeps, the
    /// bandwidth report the write and read servers get from the client.
    #[test]
    fn every_test_over_a_memory_link() {
        for test in TestKind::ALL {
            let (c, s) = both(test, |a| {
                a.iters = Some("40".into());
                a.size = Some(if test.is_latency() { "64" } else { "8K" }.into());
            });
            assert_eq!(c.peer_version, "6.06", "{test}");
            assert_eq!(c.measured_by, "local", "{test}");
            assert_eq!(c.results.len(), 1, "{test}");
            let r = &c.results[0];
            let samples = if test.is_latency() && test != TestKind::ReadLat {
                39
            } else {
                40
            };
            assert_eq!(r.iterations, samples, "{test}: {r:?}");
            assert!(r.bw_avg_mbps > 0.0 && r.bytes > 0, "{test}: {r:?}");
            assert_eq!(r.latency.is_some(), test.is_latency(), "{test}: {r:?}");
            match test {
                TestKind::WriteBw | TestKind::ReadBw => {
                    // The client's report, crossed in perftest's units.
                    assert_eq!(s.measured_by, "peer", "{test}");
                    let got = &s.results[0];
                    assert_eq!((got.size, got.iterations), (8192, 40), "{test}");
                    assert!((got.bw_avg_mbps - r.bw_avg_mbps).abs() < 1e-6, "{test}");
                    assert!((got.bw_peak_mbps - r.bw_peak_mbps).abs() < 1e-6, "{test}");
                }
                TestKind::ReadLat => {
                    assert_eq!(s.measured_by, "none", "{test}");
                    assert!(s.results.is_empty(), "{test}");
                }
                _ => {
                    assert_eq!(s.measured_by, "local", "{test}");
                    assert_eq!(s.results[0].iterations, samples, "{test}");
                }
            }
            assert!(c.mismatch.is_none() && s.mismatch.is_none(), "{test}");
            println!(
                "{test}: client {} x {} B, {:.1} MB/s; server {} ({})",
                r.iterations,
                r.size,
                r.bw_avg_mbps,
                s.results.len(),
                s.measured_by
            );
        }
    }

    /// With `-D`, both sides of every latency test run for the duration
    /// and end with their figures, as perftest's do: the side whose time
    /// is up first must not leave the other waiting for a message that
    /// never comes, nor fail it when it closes.
    #[test]
    fn latency_tests_in_duration_mode_end_well_on_both_sides() {
        for test in [TestKind::WriteLat, TestKind::ReadLat, TestKind::SendLat] {
            let t0 = Instant::now();
            let (c, s) = both(test, |a| {
                a.duration = Some("1".into());
                a.size = Some("64".into());
            });
            let took = t0.elapsed();
            assert_eq!(c.results.len(), 1, "{test}");
            let r = &c.results[0];
            assert!(r.iterations > 10, "{test}: {r:?}");
            assert!(r.latency.is_some(), "{test}: {r:?}");
            if test == TestKind::ReadLat {
                assert!(s.results.is_empty(), "{test}");
            } else {
                assert_eq!(s.results.len(), 1, "{test}");
                assert!(s.results[0].iterations > 10, "{test}: {:?}", s.results[0]);
            }
            assert!(took < Duration::from_secs(8), "{test}: took {took:?}");
            println!(
                "{test}: client {} samples, server {:?}",
                r.iterations,
                s.results.first().map(|r| r.iterations)
            );
        }
    }

    /// `--busy-poll` on both sides: every test runs with each side's
    /// thread driving its own worker, the data checked, and ends well on
    /// both sides, in iteration and in duration mode. The side that ends
    /// first gives its worker back to its thread, which still answers the
    /// peer's last messages.
    #[test]
    fn every_test_runs_busy_polling_on_both_sides() {
        for test in TestKind::ALL {
            for duration in [false, true] {
                let (c, s) = both(test, |a| {
                    a.busy_poll = true;
                    a.size = Some("64".into());
                    a.verify = test != TestKind::ReadLat;
                    if duration {
                        a.duration = Some("1".into());
                    } else {
                        a.iters = Some("500".into());
                    }
                });
                let r = &c.results[0];
                if duration {
                    assert!(r.iterations > 10, "{test}: {r:?}");
                    if !test.is_latency() {
                        // The table's figures are the middle half's, and
                        // a write-bw or read-bw server that only waits
                        // prints the client's, as perftest does.
                        let shown = r.as_perftest_reports(Some(Duration::from_secs(1)));
                        assert!(r.bw_steady_mbps.is_some(), "{test}: {r:?}");
                        assert!(
                            shown.iterations > 0 && shown.iterations < r.iterations,
                            "{test}: {shown:?} of {r:?}"
                        );
                        if matches!(test, TestKind::WriteBw | TestKind::ReadBw) {
                            let theirs = s.results[0].iterations;
                            assert_eq!(theirs, shown.iterations, "{test}");
                        }
                    }
                } else {
                    // write-lat and send-lat count one sample per round
                    // trip after the first, as perftest does.
                    let want = if test.is_latency() && test != TestKind::ReadLat {
                        499
                    } else {
                        500
                    };
                    assert_eq!(r.iterations, want, "{test}: {r:?}");
                }
                assert!(c.mismatch.is_none() && s.mismatch.is_none(), "{test}");
                println!(
                    "{test} busy polling, duration {duration}: client {} messages, server {:?}",
                    r.iterations,
                    s.results.first().map(|r| r.iterations)
                );
            }
        }
    }

    /// Two QPs, data checked by the receiving side.
    #[test]
    fn send_bw_two_qps_verified_over_a_memory_link() {
        let (c, s) = both(TestKind::SendBw, |a| {
            a.iters = Some("30".into());
            a.size = Some("4K".into());
            a.qps = Some("2".into());
            a.verify = true;
        });
        assert_eq!(c.results[0].iterations, 60);
        assert_eq!(s.results[0].iterations, 60);
        // Each QP's one 4 KiB receive slot, compared after the run.
        assert_eq!(s.results[0].verified_bytes, 2 * 4096);
        assert!(c.mismatch.is_none() && s.mismatch.is_none());
    }

    /// A thousand QPs between two dataplanes of one worker each: every
    /// connection is set up, moves its share and the data checks out.
    #[test]
    fn a_thousand_qps_write_and_verify() {
        let (c, s) = both(TestKind::WriteBw, |a| {
            a.iters = Some("8".into());
            a.size = Some("1K".into());
            a.qps = Some("1000".into());
            a.tx_depth = Some("4".into());
            a.verify = true;
        });
        assert_eq!(c.results[0].iterations, 8000);
        assert!(c.mismatch.is_none() && s.mismatch.is_none());
    }

    /// More QPs than the tables hold is refused up front, naming the
    /// setting to raise.
    #[test]
    fn more_qps_than_the_tables_hold_is_refused() {
        let plan = args(|a| {
            a.qps = Some("2000".into());
            a.peer = Some(IP_S.to_string());
        })
        .plan(TestKind::WriteBw)
        .expect("plan");
        // The usage error a client with `cfg` gets for `plan`.
        let refusal = |cfg: &Config| {
            let (l, _peer) = MemLink::pair(&MemLinkConfig::default(), MAC_C, MAC_S);
            let dp = Dataplane::open_with_link(cfg, l, DriveMode::Threads).expect("dataplane");
            match run_on(&dp, &plan, &port(), None) {
                Err(ToolError::Usage(m)) => m,
                Err(e) => panic!("expected a usage error, got {e:?}"),
                Ok(_) => panic!("ran"),
            }
        };
        let mut cfg = Config::single("mem:perf", IP_C, MAC_C);
        let err = refusal(&cfg);
        assert!(err.contains("limits.max_qp"), "{err}");
        cfg.limits.max_qp = 4096;
        let err = refusal(&cfg);
        assert!(err.contains("--set tcp.max_connections=2001"), "{err}");
        // Room in the tables, not in the completion queue: 2000 QPs of
        // 128 signalled writes each.
        cfg.tcp.max_connections = 4096;
        let err = refusal(&cfg);
        assert!(err.contains("limits.max_cqe = 65536"), "{err}");
        assert!(err.contains("-t/--tx-depth"), "{err}");
        let too_many = args(|a| a.qps = Some("16385".into())).plan(TestKind::WriteBw);
        assert!(usage(too_many).contains("-q/--qp"));
    }

    fn args(f: impl FnOnce(&mut PerfOptions)) -> PerfOptions {
        let mut a = PerfOptions::default();
        f(&mut a);
        a
    }

    fn usage(r: Result<Plan, ToolError>) -> String {
        match r {
            Err(ToolError::Usage(m)) => {
                assert!(!m.contains('\n'), "one line: {m}");
                m
            }
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn progress_lines_count_bytes_and_seconds() {
        let mib = 1u64 << 20;
        let p = Progress {
            done: 0,
            total: 20,
            bytes: 37 * mib + mib / 2,
            total_bytes: 80 * mib,
            elapsed: Duration::from_millis(4000),
            duration: None,
        };
        assert_eq!(
            progress_text("ib_write_bw 4194304 B", &p),
            "ib_write_bw 4194304 B: 37.5 MiB/80.0 MiB (46%), 0/20 messages, 4.0 s"
        );
        // Framing makes the wire count pass the total before the last
        // completion: capped, and not yet 100%.
        let near = Progress {
            done: 19,
            bytes: 81 * mib,
            ..p
        };
        let t = progress_text("x", &near);
        assert!(t.starts_with("x: 80.0 MiB/80.0 MiB (99%), 19/20"), "{t}");
        let done = Progress { done: 20, ..near };
        assert!(progress_text("x", &done).contains("(100%)"));
        let small = Progress {
            done: 1,
            total: 5,
            bytes: 3 << 10,
            total_bytes: 10 << 10,
            ..p
        };
        assert!(progress_text("x", &small).starts_with("x: 3.0 KiB/10.0 KiB (30%)"));
        let d = Progress {
            done: 8190,
            total: 0,
            bytes: 512 * mib,
            total_bytes: 0,
            elapsed: Duration::from_millis(4200),
            duration: Some(Duration::from_secs(10)),
        };
        assert_eq!(
            progress_text("ib_send_bw 65536 B", &d),
            "ib_send_bw 65536 B: 4/10 s, 512.0 MiB moved, 8190 messages"
        );
    }

    #[test]
    fn sizes_take_perftest_suffixes_and_bounds() {
        assert_eq!(parse_size("4096").ok(), Some(4096));
        assert_eq!(parse_size("64K").ok(), Some(65_536));
        assert_eq!(parse_size("8M").ok(), Some(8 << 20));
        assert_eq!(parse_size("1G").ok(), Some(1 << 30));
        for bad in [
            "0",
            "0K",
            "",
            "K",
            "-1",
            "1.5",
            "2G",
            "99999999999999999999",
            "12Q",
        ] {
            let e = parse_size(bad).expect_err(bad).to_string();
            assert!(e.starts_with("bad size"), "{bad}: {e}");
        }
    }

    #[test]
    fn defaults_follow_perftest() {
        let p = PerfOptions::default()
            .plan(TestKind::WriteBw)
            .expect("plan");
        assert_eq!(
            (
                p.peer,
                p.port,
                p.size,
                p.iterations,
                p.qps,
                p.tx_depth,
                p.rx_depth
            ),
            (None, 18515, 65_536, 5000, 1, 128, 1)
        );
        assert_eq!(p.outstanding_reads, 0);
        let p = PerfOptions::default().plan(TestKind::SendBw).expect("plan");
        assert_eq!((p.iterations, p.tx_depth, p.rx_depth), (1000, 128, 512));
        let p = args(|a| a.iters = Some("200".into()))
            .plan(TestKind::SendLat)
            .expect("plan");
        assert_eq!((p.size, p.tx_depth, p.rx_depth), (2, 1, 200));
        let p = PerfOptions::default()
            .plan(TestKind::ReadLat)
            .expect("plan");
        assert_eq!(
            (p.size, p.iterations, p.tx_depth, p.outstanding_reads),
            (2, 1000, 1, 16)
        );
    }

    #[test]
    fn client_and_server_by_peer() {
        let p = args(|a| {
            a.peer = Some("10.0.0.2".into());
            a.port = Some("9000".into());
        })
        .plan(TestKind::SendLat)
        .expect("plan");
        assert_eq!(p.peer, Some("10.0.0.2:9000".parse().expect("addr")));
        let p = args(|a| a.peer = Some("10.0.0.2:7000".into()))
            .plan(TestKind::SendLat)
            .expect("plan");
        assert_eq!((p.peer.map(|p| p.port()), p.port), (Some(7000), 7000));
        let m = usage(args(|a| a.peer = Some("host.example".into())).plan(TestKind::WriteBw));
        assert!(m.contains("bad peer address"), "{m}");
    }

    #[test]
    fn depths_shrink_to_the_iterations() {
        let p = args(|a| a.iters = Some("20".into()))
            .plan(TestKind::SendBw)
            .expect("plan");
        assert_eq!((p.tx_depth, p.rx_depth), (20, 20));
        let p = args(|a| a.iters = Some("201".into()))
            .plan(TestKind::SendBw)
            .expect("plan");
        assert_eq!((p.tx_depth, p.rx_depth), (128, 202));
        let p = args(|a| {
            a.duration = Some("3".into());
        })
        .plan(TestKind::SendBw)
        .expect("plan");
        assert_eq!(
            (p.tx_depth, p.rx_depth, p.duration),
            (128, 512, Some(Duration::from_secs(3)))
        );
    }

    #[test]
    fn reports_cross_in_perftest_units() {
        let r = RunResult {
            size: 65_536,
            bytes: 65_536 * 1000,
            iterations: 1000,
            elapsed: Duration::from_millis(500),
            bw_peak_mbps: 150.0,
            bw_avg_mbps: 125.0,
            bw_steady_mbps: None,
            msg_rate_mpps: 0.002,
            latency: None,
            verified_bytes: 0,
        };
        let mib = PerfOptions::default()
            .plan(TestKind::WriteBw)
            .expect("plan");
        let gbit = args(|a| a.report_gbits = true)
            .plan(TestKind::WriteBw)
            .expect("plan");
        let f = figures_of(&r, &mib);
        assert_eq!(
            (f.size, f.iters, f.bw_avg, f.bw_peak),
            (65_536, 1000, 125.0, 150.0)
        );
        let f = figures_of(&r, &gbit);
        // 125 MiB/s = 131.072 MB/s = 1.048576 Gbit/s.
        assert!((f.bw_avg - 1.048_576).abs() < 1e-9, "{f:?}");
        let back = result_of(&f, &gbit);
        assert!((back.bw_avg_mbps - 125.0).abs() < 1e-9, "{back:?}");
        assert!((back.bw_peak_mbps - 150.0).abs() < 1e-9, "{back:?}");
        assert_eq!((back.bytes, back.iterations), (r.bytes, 1000));
        // The time the bytes and the average imply.
        assert!((back.elapsed.as_secs_f64() - 0.5).abs() < 1e-6, "{back:?}");
    }

    #[test]
    fn client_errors_name_the_peer_once() {
        let peer: SocketAddrV4 = "10.0.0.2:18515".parse().expect("addr");
        let line = |m: &str| client_error(peer, ToolError::Peer(m.into())).to_string();
        assert_eq!(
            line("perftest peer: nothing within 2 s at the control connection"),
            "peer 10.0.0.2:18515 unreachable: perftest peer: nothing within 2 s at the \
             control connection"
        );
        let refused = "the control connection: nothing listens on 10.0.0.2:18515 \
                       (connection refused)";
        assert_eq!(line(refused), refused);
        assert_eq!(
            line("perftest peer closed the control connection at the version exchange"),
            "peer 10.0.0.2:18515: perftest peer closed the control connection at the \
             version exchange"
        );
        assert!(matches!(
            client_error(peer, ToolError::Usage("x".into())),
            ToolError::Usage(_)
        ));
    }

    #[test]
    fn all_sizes_run_two_bytes_to_eight_mib() {
        let p = args(|a| a.all = true)
            .plan(TestKind::WriteBw)
            .expect("plan");
        assert_eq!(p.sizes.first(), Some(&2));
        assert_eq!(p.sizes.last(), Some(&ALL_SIZES_MAX));
        assert_eq!(p.sizes.len(), 23);
        assert_eq!(p.size, ALL_SIZES_MAX);
    }

    #[test]
    fn bad_numbers_are_one_line_each() {
        type Case = (fn(&mut PerfOptions), &'static str);
        let cases: [Case; 9] = [
            (|a| a.qps = Some("0".into()), "-q/--qp"),
            (|a| a.iters = Some("2".into()), "-n/--iters"),
            (|a| a.iters = Some("many".into()), "-n/--iters"),
            (|a| a.port = Some("0".into()), "-p/--port"),
            (|a| a.port = Some("70000".into()), "-p/--port"),
            (|a| a.duration = Some("0".into()), "-D/--duration"),
            (|a| a.tx_depth = Some("0".into()), "-t/--tx-depth"),
            (|a| a.outs = Some("4".into()), "-o/--outs"),
            (|a| a.rx_depth = Some("64".into()), "-r/--rx-depth"),
        ];
        for (set, option) in cases {
            let m = usage(args(set).plan(TestKind::WriteBw));
            assert!(m.contains(option), "{option}: {m}");
        }
        let m = usage(args(|a| a.outs = Some("200".into())).plan(TestKind::ReadBw));
        assert!(m.contains("between 1 and 128"), "{m}");
    }
}
