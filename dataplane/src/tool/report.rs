//! Results of perf runs and the demo as people and scripts read them: a
//! table in perftest's column layout (so that output compares line by
//! line with `ib_write_bw` and friends, perftest 4.5's `print_report_bw`
//! and `print_report_lat` headers), and JSON with every figure for ops
//! tooling.

use serde::Serialize;

use super::runner::{Role, RunResult, RunSpec, TestKind, MB};

/// The rule perftest draws around its results.
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// Bandwidth units of a table (perftest's `--report_gbits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BwUnits {
    /// MB/s, MB being 2^20 bytes (perftest's default).
    #[default]
    MBps,
    /// Gb/s, 10^9 bits.
    Gbps,
}

impl BwUnits {
    fn convert(self, mb_per_s: f64) -> f64 {
        match self {
            BwUnits::MBps => mb_per_s,
            BwUnits::Gbps => mb_per_s * MB * 8.0 / 1e9,
        }
    }

    fn label(self) -> &'static str {
        match self {
            BwUnits::MBps => "MB/sec",
            BwUnits::Gbps => "Gb/sec",
        }
    }
}

/// The bandwidth header line.
pub fn bw_header(units: BwUnits) -> String {
    let u = units.label();
    format!(
        " {:<10} {:<14} {:<18} {:<20} {}",
        "#bytes",
        "#iterations",
        format!("BW peak[{u}]"),
        format!("BW average[{u}]"),
        "MsgRate[Mpps]"
    )
}

/// One bandwidth line.
pub fn bw_line(r: &RunResult, units: BwUnits) -> String {
    format!(
        " {:<10} {:<14} {:<18.2} {:<20.2} {:.6}",
        r.size,
        r.iterations,
        units.convert(r.bw_peak_mbps),
        units.convert(r.bw_avg_mbps),
        r.msg_rate_mpps
    )
}

/// The latency header line.
pub fn lat_header() -> String {
    format!(
        " {:<7} {:<12} {:<14} {:<14} {:<16} {:<14} {:<15} {:<22} {}",
        "#bytes",
        "#iterations",
        "t_min[usec]",
        "t_max[usec]",
        "t_typical[usec]",
        "t_avg[usec]",
        "t_stdev[usec]",
        "99% percentile[usec]",
        "99.9% percentile[usec]"
    )
}

/// One latency line (a run without latency figures prints zeros).
pub fn lat_line(r: &RunResult) -> String {
    let l = r.latency.unwrap_or(super::runner::LatencySummary {
        min_us: 0.0,
        p50_us: 0.0,
        p99_us: 0.0,
        p999_us: 0.0,
        max_us: 0.0,
        avg_us: 0.0,
        stdev_us: 0.0,
        histogram: super::runner::LatencyHistogram::default(),
    });
    format!(
        " {:<7} {:<12} {:<14.2} {:<14.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {:.2}",
        r.size,
        r.iterations,
        l.min_us,
        l.max_us,
        l.p50_us,
        l.avg_us,
        l.stdev_us,
        l.p99_us,
        l.p999_us
    )
}

/// perftest's results table for `results` (one line per size), in MB/s.
pub fn perftest_table(results: &[RunResult], spec: &RunSpec) -> String {
    perftest_table_in(results, spec, BwUnits::MBps)
}

/// perftest's results table with the bandwidth in `units`.
pub fn perftest_table_in(results: &[RunResult], spec: &RunSpec, units: BwUnits) -> String {
    let mut out = String::new();
    out.push_str(RULE);
    out.push('\n');
    if spec.test.is_latency() {
        out.push_str(&lat_header());
        out.push('\n');
        for r in results {
            out.push_str(&lat_line(r));
            out.push('\n');
        }
    } else {
        out.push_str(&bw_header(units));
        out.push('\n');
        for r in results {
            out.push_str(&bw_line(r, units));
            out.push('\n');
        }
    }
    out.push_str(RULE);
    out.push('\n');
    out
}

/// The JSON document of a perf run: what was run, and every figure.
#[derive(Debug, Clone, Serialize)]
pub struct PerfReport<'a> {
    /// Which test.
    pub test: TestKind,
    /// Which side printed it.
    pub role: Role,
    /// Data connections.
    pub qps: usize,
    /// Messages per QP asked for (0 in duration mode).
    pub iterations: u64,
    /// Duration asked for, seconds.
    pub duration_s: Option<f64>,
    /// Send-queue depth.
    pub tx_depth: u32,
    /// Receive-queue depth.
    pub rx_depth: u32,
    /// Outstanding RDMA Reads (read tests).
    pub outstanding_reads: u32,
    /// Data verification was on.
    pub verify: bool,
    /// Bandwidth unit of the `bw_*` figures.
    pub bw_unit: &'static str,
    /// One entry per size.
    pub results: &'a [RunResult],
}

impl<'a> PerfReport<'a> {
    /// The report of `results` run as `spec`.
    pub fn new(results: &'a [RunResult], spec: &RunSpec) -> PerfReport<'a> {
        PerfReport {
            test: spec.test,
            role: spec.role,
            qps: spec.qps,
            iterations: if spec.duration.is_some() {
                0
            } else {
                spec.iterations
            },
            duration_s: spec.duration.map(|d| d.as_secs_f64()),
            tx_depth: spec.tx_depth,
            rx_depth: spec.rx_depth,
            outstanding_reads: spec.outstanding_reads,
            verify: spec.verify,
            bw_unit: "MiB/s",
            results,
        }
    }
}

/// `results` as one pretty-printed JSON document.
pub fn perftest_json(results: &[RunResult], spec: &RunSpec) -> String {
    to_json(&PerfReport::new(results, spec))
}

/// Any report as pretty-printed JSON. Serialising these plain structs
/// cannot fail; were it ever to, the error is the document.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value)
        .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::runner::LatencySummary;
    use core::time::Duration;

    fn spec(test: TestKind) -> RunSpec {
        RunSpec {
            test,
            role: Role::Client,
            size: 65536,
            iterations: 5000,
            duration: None,
            qps: 1,
            tx_depth: 128,
            rx_depth: 512,
            outstanding_reads: 16,
            verify: false,
            all_sizes: false,
        }
    }

    fn bw() -> RunResult {
        RunResult {
            size: 65536,
            bytes: 65536 * 5000,
            iterations: 5000,
            elapsed: Duration::from_millis(250),
            bw_peak_mbps: 1300.5,
            bw_avg_mbps: 1250.0,
            msg_rate_mpps: 0.02,
            latency: None,
            verified_bytes: 65536,
        }
    }

    #[test]
    fn bandwidth_table_has_perftest_columns() {
        let t = perftest_table(&[bw()], &spec(TestKind::WriteBw));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], RULE);
        for h in [
            "#bytes",
            "#iterations",
            "BW peak[MB/sec]",
            "BW average[MB/sec]",
            "MsgRate[Mpps]",
        ] {
            assert!(lines[1].contains(h), "{h} in {}", lines[1]);
        }
        let f: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(f, ["65536", "5000", "1300.50", "1250.00", "0.020000"]);
        let g = perftest_table_in(&[bw()], &spec(TestKind::WriteBw), BwUnits::Gbps);
        assert!(g.contains("BW average[Gb/sec]"));
        // 1250 MiB/s = 10.49 Gb/s.
        assert!(g.contains("10.49"), "{g}");
    }

    #[test]
    fn latency_table_has_perftest_columns() {
        let mut r = bw();
        r.size = 2;
        r.iterations = 1000;
        r.latency = Some(LatencySummary {
            min_us: 1.5,
            p50_us: 2.0,
            p99_us: 3.0,
            p999_us: 4.0,
            max_us: 9.25,
            avg_us: 2.1,
            stdev_us: 0.3,
            histogram: Default::default(),
        });
        let t = perftest_table(&[r], &spec(TestKind::SendLat));
        let lines: Vec<&str> = t.lines().collect();
        for h in [
            "t_min[usec]",
            "t_max[usec]",
            "t_typical[usec]",
            "t_avg[usec]",
            "t_stdev[usec]",
            "99% percentile[usec]",
            "99.9% percentile[usec]",
        ] {
            assert!(lines[1].contains(h), "{h}");
        }
        let f: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            f,
            ["2", "1000", "1.50", "9.25", "2.00", "2.10", "0.30", "3.00", "4.00"]
        );
    }

    #[test]
    fn json_carries_every_figure() {
        let results = [bw()];
        let j: serde_json::Value =
            serde_json::from_str(&perftest_json(&results, &spec(TestKind::ReadBw))).unwrap();
        assert_eq!(j["test"], "read-bw");
        assert_eq!(j["role"], "client");
        let r = &j["results"][0];
        assert_eq!(r["size"], 65536);
        assert_eq!(r["iterations"], 5000);
        assert_eq!(r["bytes"], 65536u64 * 5000);
        assert_eq!(r["seconds"], 0.25);
        assert_eq!(r["bw_peak_mbps"], 1300.5);
        assert_eq!(r["bw_avg_mbps"], 1250.0);
        assert_eq!(r["msg_rate_mpps"], 0.02);
        assert_eq!(r["verified_bytes"], 65536);
        assert!(r["latency"].is_null());
    }
}
