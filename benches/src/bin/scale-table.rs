//! `scale-table FILE...`: the medians of several `iwarp demo --json
//! --qps N` documents, per queue-pair count and bandwidth test, as one
//! table: the aggregate bandwidth, its ratio to the same test's median
//! with one queue pair (from the same documents, so the same sitting),
//! the same two over the round's middle half (`bw_steady_mbps`, the
//! window perftest reports with `-D`: without the start, where thousands
//! of connections take their first buffers), the time the QPs took to
//! connect and connections per second.
//!
//! Then the same ratios taken run by run: a document named `Q-I.json`
//! (as `benches/scale.sh` names them: QP count, run) is paired with the
//! one-QP document of the same run `I`, which ran next to it in time,
//! and the table gives the median of those ratios and their range. On a
//! shared machine whose speed drifts over minutes, the paired ratio
//! cancels the drift that the ratio of two medians keeps.
//! `benches/scale.sh` runs the demos and calls it.

use std::collections::BTreeMap;
use std::process::ExitCode;

use benches::{median, outln, read_json, write_out};
use serde_json::Value;

/// Bandwidth (whole round and middle half), setup seconds and
/// connections per second of each run.
#[derive(Default)]
struct Runs {
    /// Each run's name (from its file, for the paired ratios) with its
    /// bandwidth, whole round and middle half.
    bw: Vec<(Option<String>, f64, f64)>,
    setup: Vec<f64>,
    rate: Vec<f64>,
}

impl Runs {
    /// The medians of the bandwidth, whole round and middle half.
    fn medians(&self) -> (f64, f64) {
        let mut whole: Vec<f64> = self.bw.iter().map(|r| r.1).collect();
        let mut middle: Vec<f64> = self.bw.iter().map(|r| r.2).collect();
        (median(&mut whole), median(&mut middle))
    }
}

/// The run a document belongs to: `I` of a file named `Q-I.json`.
fn run_of(file: &str) -> Option<String> {
    let stem = std::path::Path::new(file).file_stem()?.to_str()?;
    let (_, run) = stem.rsplit_once('-')?;
    Some(run.to_string())
}

/// Median, least and greatest of `v` (NaN when empty).
fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    let lo = v.iter().copied().fold(f64::NAN, f64::min);
    let hi = v.iter().copied().fold(f64::NAN, f64::max);
    (median(v), lo, hi)
}

fn main() -> ExitCode {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        eprintln!("usage: scale-table FILE... (documents of `iwarp demo --json --qps N`)");
        return ExitCode::from(2);
    }
    // (test, qps) -> runs.
    let mut rows: BTreeMap<(String, u64), Runs> = BTreeMap::new();
    for f in &files {
        let doc: Value = match read_json(f) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("scale-table: {f}: {e}");
                return ExitCode::FAILURE;
            }
        };
        for row in doc["bandwidth"].as_array().into_iter().flatten() {
            let (Some(test), Some(qps)) = (row["test"].as_str(), row["qps"].as_u64()) else {
                eprintln!("scale-table: {f}: a bandwidth row without test or qps");
                return ExitCode::FAILURE;
            };
            let r = rows.entry((test.to_string(), qps)).or_default();
            let num = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
            r.bw.push((run_of(f), num("bw_avg_mbps"), num("bw_steady_mbps")));
            r.setup.push(num("setup_seconds"));
            r.rate.push(num("connects_per_second"));
        }
    }
    if rows.is_empty() {
        eprintln!("scale-table: no bandwidth rows in the documents");
        return ExitCode::FAILURE;
    }
    // With one QP: test -> medians (whole round, middle half), and
    // (test, run) -> that run's.
    let mut one: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let mut one_run: BTreeMap<(String, String), (f64, f64)> = BTreeMap::new();
    for ((test, qps), r) in &rows {
        if *qps == 1 {
            one.insert(test.clone(), r.medians());
            for (run, bw, steady) in &r.bw {
                if let Some(run) = run {
                    one_run.insert((test.clone(), run.clone()), (*bw, *steady));
                }
            }
        }
    }
    let mut out = String::new();
    outln!(
        out,
        "{:<10} {:>6} {:>5} {:>10} {:>9} {:>10} {:>9} {:>10} {:>12} {:>8} {:>13} {:>9}",
        "test",
        "QPs",
        "runs",
        "BW MB/s",
        "x 1 QP",
        "steady",
        "x 1 QP",
        "setup s",
        "connects/s",
        "paired",
        "range",
        "paired st"
    );
    for ((test, qps), r) in &mut rows {
        let (mut whole, mut middle): (Vec<f64>, Vec<f64>) =
            r.bw.iter()
                .filter_map(|(run, bw, steady)| {
                    let b = one_run.get(&(test.clone(), run.clone()?))?;
                    Some((bw / b.0, steady / b.1))
                })
                .unzip();
        let (paired, lo, hi) = spread(&mut whole);
        let paired_steady = median(&mut middle);
        let (bw, steady) = r.medians();
        let (ratio, steady_ratio) = one
            .get(test)
            .map_or((f64::NAN, f64::NAN), |b| (bw / b.0, steady / b.1));
        outln!(
            out,
            "{:<10} {:>6} {:>5} {:>10.1} {:>9.3} {:>10.1} {:>9.3} {:>10.3} {:>12.0} {:>8.3} {:>13} {:>9.3}",
            test,
            qps,
            r.bw.len(),
            bw,
            ratio,
            steady,
            steady_ratio,
            median(&mut r.setup),
            median(&mut r.rate),
            paired,
            format!("{lo:.3}-{hi:.3}"),
            paired_steady
        );
    }
    outln!(
        out,
        "(medians; x 1 QP = the median with N QPs / the median with one, same runs;\n \
         steady = the round's middle half, perftest's -D window;\n \
         paired = the median of each run's ratio to the one-QP run of the same\n \
         round of runs (files Q-I.json), range = their least and greatest,\n \
         paired st = the same over the middle half)"
    );
    write_out("scale-table", &out)
}
