//! `demo-table FILE...`: the medians of several `iwarp demo --json`
//! documents, per MTU and bandwidth test, as one table: our bandwidth,
//! the kernel's TCP over loopback measured in the same runs and the ratio
//! of the two, the ratio to one core copying and CRC32c-summing the same
//! bytes, the ratio to one core handing the bytes to another, and each
//! side's worker CPU time per byte. `benches/demo-bw.sh`
//! runs the demos and calls it.

use std::collections::BTreeMap;
use std::process::ExitCode;

use serde_json::Value;

/// The figures of one bandwidth row that the table shows, in order.
const FIGURES: [(&str, &[&str]); 9] = [
    ("BW MB/s", &["bw_avg_mbps"]),
    ("kernel MB/s", &["kernel_tcp_mbps"]),
    ("x kernel", &["kernel_ratio"]),
    ("x copy+CRC", &["ratio"]),
    ("x cross-core", &["cross_core_ratio"]),
    ("src ns/B", &["source_workers", "ns_per_byte"]),
    ("sink ns/B", &["sink_workers", "ns_per_byte"]),
    ("kern tx ns/B", &["kernel_sender", "ns_per_byte"]),
    ("kern rx ns/B", &["kernel_receiver", "ns_per_byte"]),
];

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn field(row: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(row, |v, k| v.get(k))?.as_f64()
}

fn main() -> ExitCode {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        eprintln!("usage: demo-table FILE... (documents of `iwarp demo --json`)");
        return ExitCode::from(2);
    }
    // (mtu, test) -> one list of values per figure.
    let mut rows: BTreeMap<(u64, String), Vec<Vec<f64>>> = BTreeMap::new();
    for f in &files {
        let doc: Value = match std::fs::read_to_string(f)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
        {
            Ok(d) => d,
            Err(e) => {
                eprintln!("demo-table: {f}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mtu = doc["mtu"].as_u64().unwrap_or(0);
        for row in doc["bandwidth"].as_array().into_iter().flatten() {
            let test = row["test"].as_str().unwrap_or("?").to_string();
            let slot = rows
                .entry((mtu, test))
                .or_insert_with(|| vec![Vec::new(); FIGURES.len()]);
            for (i, (_, path)) in FIGURES.iter().enumerate() {
                if let Some(x) = field(row, path) {
                    slot[i].push(x);
                }
            }
        }
    }
    let runs = rows.values().map(|r| r[0].len()).max().unwrap_or(0);
    println!(
        "medians of {runs} run(s) per row, from {} document(s)",
        files.len()
    );
    print!("{:>5} {:<9}", "MTU", "test");
    for (name, _) in FIGURES {
        print!(" {name:>12}");
    }
    println!();
    for ((mtu, test), mut figs) in rows {
        print!("{mtu:>5} {test:<9}");
        for v in figs.iter_mut() {
            print!(" {:>12.3}", median(v));
        }
        println!();
    }
    ExitCode::SUCCESS
}
