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
//! runs, and prints perftest's table ([`super::report`]) or JSON.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use clap::Args;

use super::common::EndpointArgs;
use super::runner::TestKind;
use super::ToolError;

/// perftest's default port (`DEF_PORT`).
pub const DEFAULT_PORT: u16 = 18515;
/// Largest message: 1 GiB, so that a buffer per QP stays a sane size on
/// a machine without hugepages (perftest allows up to 2 GiB).
pub const MAX_SIZE: usize = 1 << 30;
/// perftest's bounds on the queue depths (`MIN_TX`..`MAX_TX`,
/// `MIN_RX`..`MAX_RX`).
const MAX_TX_DEPTH: u32 = 15_000;
const MAX_RX_DEPTH: u32 = 16_384;
/// Queue pairs: perftest allows 16384; each needs a connection and a
/// buffer here, so fewer.
const MAX_QPS: usize = 256;
/// Outstanding RDMA Reads: the most a queue pair may negotiate.
const MAX_OUTS: u32 = 128;
/// What a read test asks for without `-o` (the queue pair's default ORD).
const DEFAULT_OUTS: u32 = 16;
/// perftest's lower bound on `-n` (`MIN_ITER`).
const MIN_ITERS: u64 = 5;
/// Longest `-D` accepted: a day.
const MAX_DURATION_S: u64 = 86_400;
/// Largest size of `-a` (perftest: 2 B to 2^23 B).
pub const ALL_SIZES_MAX: usize = 1 << 23;

/// Options of `iwarp perf TEST`.
///
/// Numbers are taken as text and checked by [`PerfArgs::plan`], so that a
/// bad value is reported in one line like every other error.
#[derive(Debug, Clone, Default, Args)]
pub struct PerfArgs {
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
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration", value_name = "SECONDS")]
    pub duration: Option<String>,
    /// Queue pairs, each its own connection on the same port (default 1).
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
    /// Print the results as one JSON document on standard output instead
    /// of a table.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for the peer: the client's connection attempts, the
    /// server's wait for a client (default 60).
    #[arg(long = "timeout", value_name = "SECONDS")]
    pub timeout: Option<String>,
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
    /// `--json`.
    pub json: bool,
    /// How long to wait for the peer.
    pub timeout: Duration,
}

/// Whether a test measures latency (perftest's `LAT`) or bandwidth.
pub fn is_latency(test: TestKind) -> bool {
    matches!(
        test,
        TestKind::WriteLat | TestKind::ReadLat | TestKind::SendLat
    )
}

/// Whether a test takes receives (perftest's `has_recv_comp`).
fn is_send(test: TestKind) -> bool {
    matches!(test, TestKind::SendBw | TestKind::SendLat)
}

/// Whether a test posts RDMA Reads.
fn is_read(test: TestKind) -> bool {
    matches!(test, TestKind::ReadBw | TestKind::ReadLat)
}

/// perftest's name for a test (`ib_write_bw`…), for messages.
pub fn perftest_name(test: TestKind) -> &'static str {
    match test {
        TestKind::WriteBw => "ib_write_bw",
        TestKind::ReadBw => "ib_read_bw",
        TestKind::SendBw => "ib_send_bw",
        TestKind::WriteLat => "ib_write_lat",
        TestKind::ReadLat => "ib_read_lat",
        TestKind::SendLat => "ib_send_lat",
    }
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

impl PerfArgs {
    /// Checks the options of `test` and fills in perftest's defaults; no
    /// device is touched.
    pub fn plan(&self, test: TestKind) -> Result<Plan, ToolError> {
        let lat = is_latency(test);
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
                if !is_send(test) && r > 1 {
                    return Err(ToolError::Usage(
                        "-r/--rx-depth applies to send tests only".into(),
                    ));
                }
                r
            }
            None if is_send(test) && !lat => 512,
            None => 1,
        };
        let outstanding_reads = match &self.outs {
            Some(o) if !is_read(test) => {
                return Err(ToolError::Usage(format!(
                    "-o/--outs {o:?} applies to read tests only"
                )));
            }
            Some(o) => parse_num(o, "-o/--outs", 1, u64::from(MAX_OUTS))? as u32,
            None if is_read(test) => DEFAULT_OUTS,
            None => 0,
        };
        // perftest: with a fixed number of iterations, no more in flight
        // than there are iterations.
        if duration.is_none() {
            let cap = u32::try_from(iterations).unwrap_or(u32::MAX);
            tx_depth = tx_depth.min(cap);
            if is_send(test) {
                rx_depth = rx_depth.min(cap);
            }
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
            json: self.json,
            timeout,
        })
    }
}

/// Runs one perf test.
pub fn run(test: TestKind, args: &PerfArgs) -> Result<(), ToolError> {
    let _plan = args.plan(test)?;
    Err(ToolError::Usage(
        "iwarp perf: not available in this build yet".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(f: impl FnOnce(&mut PerfArgs)) -> PerfArgs {
        let mut a = PerfArgs::default();
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
        let p = PerfArgs::default().plan(TestKind::WriteBw).expect("plan");
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
        let p = PerfArgs::default().plan(TestKind::SendBw).expect("plan");
        assert_eq!((p.iterations, p.tx_depth, p.rx_depth), (1000, 128, 512));
        let p = PerfArgs::default().plan(TestKind::ReadLat).expect("plan");
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
        let cases: [(fn(&mut PerfArgs), &str); 9] = [
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
