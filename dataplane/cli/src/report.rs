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

/// The bandwidth header line (perftest's `RESULT_FMT`, `RESULT_FMT_G`).
pub fn bw_header(units: BwUnits) -> String {
    let u = units.label();
    format!(" #bytes     #iterations    BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]")
}

/// One bandwidth line, as perftest's `print_full_bw_report` prints it
/// (`REPORT_FMT`; `REPORT_FMT_EXT`, six decimals, for an average under
/// 0.1 Gb/s).
pub fn bw_line(r: &RunResult, units: BwUnits) -> String {
    let (peak, avg) = (units.convert(r.bw_peak_mbps), units.convert(r.bw_avg_mbps));
    if units == BwUnits::Gbps && avg < 0.1 {
        format!(
            " {:<7}    {}           {peak:<7.6}            {avg:<7.6}            {:<7.6}",
            r.size, r.iterations, r.msg_rate_mpps
        )
    } else {
        format!(
            " {:<7}    {:<10}       {peak:<7.2}            {avg:<7.2}\t\t   {:<7.6}",
            r.size, r.iterations, r.msg_rate_mpps
        )
    }
}

/// The latency header line (`RESULT_FMT_LAT`, its trailing space
/// included), or with `duration` that of a timed run (`RESULT_FMT_LAT_DUR`).
pub fn lat_header(duration: bool) -> String {
    if duration {
        " #bytes        #iterations       t_avg[usec]    tps average".into()
    } else {
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    \
         t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
            .into()
    }
}

/// One latency line as perftest's `print_report_lat` prints it
/// (`REPORT_FMT_LAT`; a run without latency figures prints zeros): the
/// iterations column holds the iterations run, `iterations`, as
/// perftest's does, not the samples taken.
pub fn lat_line(r: &RunResult, iterations: u64) -> String {
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
        " {:<7} {iterations}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t\
         {:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        r.size, l.min_us, l.max_us, l.p50_us, l.avg_us, l.stdev_us, l.p99_us, l.p999_us
    )
}

/// One line of a timed latency run (`-D`), as perftest's
/// `print_report_lat_duration` prints it (`REPORT_FMT_LAT_DUR`): round
/// trips, their average half (a Read's whole), and round trips a second.
pub fn lat_duration_line(r: &RunResult) -> String {
    let avg = r.latency.map_or(0.0, |l| l.avg_us);
    let secs = r.elapsed.as_secs_f64();
    let tps = if secs > 0.0 {
        r.iterations as f64 / secs
    } else {
        0.0
    };
    format!(
        " {:<7}       {}            {avg:<7.2}        {tps:<7.2}",
        r.size, r.iterations
    )
}

/// The heading of a run's table: its opening rule and column line.
pub fn table_heading(spec: &RunSpec, units: BwUnits) -> String {
    let h = if spec.test.is_latency() {
        lat_header(spec.duration.is_some())
    } else {
        bw_header(units)
    };
    format!("{RULE}\n{h}\n")
}

/// One result's line of the table (with its newline).
pub fn table_line(r: &RunResult, spec: &RunSpec, units: BwUnits) -> String {
    let l = if !spec.test.is_latency() {
        bw_line(&r.as_perftest_reports(spec.duration), units)
    } else if spec.duration.is_some() {
        lat_duration_line(r)
    } else {
        lat_line(r, spec.iterations)
    };
    format!("{l}\n")
}

/// perftest's results table for `results` (one line per size), in MB/s.
pub fn perftest_table(results: &[RunResult], spec: &RunSpec) -> String {
    perftest_table_in(results, spec, BwUnits::MBps)
}

/// perftest's results table with the bandwidth in `units`.
pub fn perftest_table_in(results: &[RunResult], spec: &RunSpec, units: BwUnits) -> String {
    let mut out = table_heading(spec, units);
    for r in results {
        out.push_str(&table_line(r, spec, units));
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
    use crate::runner::LatencySummary;
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
            busy_poll: false,
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
            bw_steady_mbps: None,
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

    /// With `-D`, perftest counts only what happens between its margins
    /// (a quarter of the duration at each end): the table shows that
    /// window's messages, average and message rate, not the whole run's
    /// with its start; iteration mode keeps the whole run's.
    #[test]
    fn a_duration_run_reports_the_window_between_the_margins() {
        let mut r = bw();
        r.elapsed = Duration::from_secs(4);
        r.bw_steady_mbps = Some(1600.0);
        let mut timed = spec(TestKind::WriteBw);
        timed.duration = Some(Duration::from_secs(4));
        let t = perftest_table(&[r.clone()], &timed);
        let f: Vec<&str> = t.lines().nth(2).unwrap().split_whitespace().collect();
        // 1600 MiB/s of 64 KiB messages: 25,600 a second, over the two
        // seconds of the window.
        assert_eq!(f, ["65536", "51200", "1300.50", "1600.00", "0.025600"]);
        let t = perftest_table(&[r], &spec(TestKind::WriteBw));
        let f: Vec<&str> = t.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(f, ["65536", "5000", "1300.50", "1250.00", "0.020000"]);
        // A run too short for its window keeps its own figures.
        let mut short = bw();
        short.bw_steady_mbps = None;
        let t = perftest_table(&[short], &timed);
        assert!(t.contains("1250.00"), "{t}");
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
        // The iterations run (the spec's 5000), not the samples taken.
        assert_eq!(
            f,
            ["2", "5000", "1.50", "9.25", "2.00", "2.10", "0.30", "3.00", "4.00"]
        );
    }

    /// The heading and figure line of a siw guest's `ib_write_bw -R`,
    /// byte for byte (its tabs included).
    #[test]
    fn bandwidth_lines_are_perftests_bytes() {
        let r = RunResult {
            size: 65536,
            iterations: 200,
            bw_peak_mbps: 4.37,
            bw_avg_mbps: 4.35,
            bw_steady_mbps: None,
            msg_rate_mpps: 0.000070,
            ..bw()
        };
        let mut s = spec(TestKind::WriteBw);
        s.iterations = 200;
        assert_eq!(
            perftest_table(std::slice::from_ref(&r), &s),
            format!(
                "{RULE}\n #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   \
                 MsgRate[Mpps]\n 65536      200              4.37               4.35   \t\t   \
                 0.000070\n{RULE}\n"
            )
        );
        // Under 0.1 Gb/s, perftest's six-decimal line.
        let slow = RunResult {
            bw_peak_mbps: 5.0,
            bw_avg_mbps: 4.0,
            bw_steady_mbps: None,
            ..r
        };
        assert_eq!(
            bw_line(&slow, BwUnits::Gbps),
            " 65536      200           0.041943            0.033554            0.000070"
        );
    }

    #[test]
    fn latency_lines_are_perftests_bytes() {
        let mut r = bw();
        r.size = 64;
        r.iterations = 199;
        r.elapsed = Duration::from_millis(100);
        r.latency = Some(LatencySummary {
            min_us: 95.5,
            p50_us: 120.25,
            p99_us: 300.0,
            p999_us: 1234.5,
            max_us: 1500.0,
            avg_us: 130.0,
            stdev_us: 20.5,
            histogram: Default::default(),
        });
        let mut s = spec(TestKind::WriteLat);
        s.iterations = 200;
        assert_eq!(
            perftest_table(std::slice::from_ref(&r), &s),
            format!(
                "{RULE}\n #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
                 t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n \
                 64      200          95.50          1500.00      120.25   \t       130.00      \t\
                 20.50  \t\t300.00  \t\t1234.50\n{RULE}\n"
            )
        );
        s.duration = Some(Duration::from_secs(5));
        assert_eq!(
            perftest_table(&[r], &s),
            format!(
                "{RULE}\n #bytes        #iterations       t_avg[usec]    tps average\n \
                 64            199            130.00         1990.00\n{RULE}\n"
            )
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
