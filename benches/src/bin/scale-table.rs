//! `scale-table FILE...`: the medians of several `iwarp demo --json
//! --qps N` documents, per queue-pair count and bandwidth test, as one
//! table: the aggregate bandwidth, its ratio to the same test's median
//! with one queue pair (from the same documents, so the same sitting),
//! the same two over the round's middle half (`bw_steady_mbps`, the
//! window perftest reports with `-D`: without the start, where thousands
//! of connections take their first buffers), the time the QPs took to
//! connect and connections per second.
//! `benches/scale.sh` runs the demos and calls it.

use std::collections::BTreeMap;
use std::process::ExitCode;

use benches::{median, outln, read_json, write_out};
use serde_json::Value;

/// Bandwidth (whole round and middle half), setup seconds and
/// connections per second of each run.
#[derive(Default)]
struct Runs {
    bw: Vec<f64>,
    steady: Vec<f64>,
    setup: Vec<f64>,
    rate: Vec<f64>,
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
            r.bw.push(num("bw_avg_mbps"));
            r.steady.push(num("bw_steady_mbps"));
            r.setup.push(num("setup_seconds"));
            r.rate.push(num("connects_per_second"));
        }
    }
    if rows.is_empty() {
        eprintln!("scale-table: no bandwidth rows in the documents");
        return ExitCode::FAILURE;
    }
    // test -> (whole round, middle half) with one QP.
    let mut one: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for ((test, qps), r) in &mut rows {
        if *qps == 1 {
            one.insert(test.clone(), (median(&mut r.bw), median(&mut r.steady)));
        }
    }
    let mut out = String::new();
    outln!(
        out,
        "{:<10} {:>6} {:>5} {:>10} {:>9} {:>10} {:>9} {:>10} {:>12}",
        "test",
        "QPs",
        "runs",
        "BW MB/s",
        "x 1 QP",
        "steady",
        "x 1 QP",
        "setup s",
        "connects/s"
    );
    for ((test, qps), r) in &mut rows {
        let bw = median(&mut r.bw);
        let steady = median(&mut r.steady);
        let (ratio, steady_ratio) = one
            .get(test)
            .map_or((f64::NAN, f64::NAN), |b| (bw / b.0, steady / b.1));
        outln!(
            out,
            "{:<10} {:>6} {:>5} {:>10.1} {:>9.3} {:>10.1} {:>9.3} {:>10.3} {:>12.0}",
            test,
            qps,
            r.bw.len(),
            bw,
            ratio,
            steady,
            steady_ratio,
            median(&mut r.setup),
            median(&mut r.rate)
        );
    }
    outln!(
        out,
        "(medians; x 1 QP = the median with N QPs / the median with one, same runs;\n \
         steady = the round's middle half, perftest's -D window)"
    );
    write_out("scale-table", &out)
}
