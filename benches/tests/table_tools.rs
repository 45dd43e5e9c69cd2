//! The table tools end well when their reader goes away (`| head`): the
//! rest of the table is dropped, the exit status is success, and nothing
//! panics.

use std::process::{Command, Stdio};

/// A directory of `n` small demo documents, each with its own QP count:
/// with enough of them, either table's output (demo-table's line per
/// document, scale-table's row per QP count) is larger than a pipe holds.
fn documents(name: &str, n: usize) -> (std::path::PathBuf, Vec<String>) {
    let dir = std::env::temp_dir().join(format!("table-tools-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let files = (0..n)
        .map(|i| {
            let f = dir.join(format!("run-{i:05}.json"));
            let doc = serde_json::json!({
                "mtu": 1500,
                "cross_core_round_trip_ns": [60.0, 330.0],
                "bandwidth": [{
                    "test": "write-bw", "qps": 1 + i, "bw_avg_mbps": 1000.0 + i as f64,
                    "setup_seconds": 0.001, "connects_per_second": 900.0
                }],
            });
            std::fs::write(&f, doc.to_string()).expect("write a document");
            f.display().to_string()
        })
        .collect();
    (dir, files)
}

fn ends_well_with_no_reader(exe: &str, files: &[String]) {
    let mut child = Command::new(exe)
        .args(files)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the tool");
    // Close the read end at once: the tool's writes find no reader.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("the tool ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{exe}: {:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{exe}: {stderr}");
}

#[test]
fn a_reader_that_goes_away_ends_the_tables_quietly() {
    let (dir, files) = documents("pipe", 2000);
    ends_well_with_no_reader(env!("CARGO_BIN_EXE_demo-table"), &files);
    // One row per QP count: as large.
    ends_well_with_no_reader(env!("CARGO_BIN_EXE_scale-table"), &files);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_demo_table_tells_each_run_where_its_cores_were() {
    let (dir, files) = documents("placement", 3);
    let out = Command::new(env!("CARGO_BIN_EXE_demo-table"))
        .args(&files)
        .output()
        .expect("run demo-table");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("moved   1500 write-bw     3"), "{text}");
    assert_eq!(text.matches("60 / 330 (moved)").count(), 3, "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// scale-table's output for write-bw documents, one per `(file stem,
/// QPs, whole-round MB/s, middle-half MB/s)`, written to a directory of
/// their own (`name`) and removed after.
fn scale_table(name: &str, docs: &[(String, u64, f64, f64)]) -> String {
    let dir = std::env::temp_dir().join(format!("table-tools-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let files: Vec<String> = docs
        .iter()
        .map(|(stem, qps, avg, steady)| {
            let f = dir.join(format!("{stem}.json"));
            let doc = serde_json::json!({
                "bandwidth": [{
                    "test": "write-bw", "qps": qps, "bw_avg_mbps": avg,
                    "bw_steady_mbps": steady, "setup_seconds": 0.5,
                    "connects_per_second": 20000.0
                }],
            });
            std::fs::write(&f, doc.to_string()).expect("write a document");
            f.display().to_string()
        })
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_scale-table"))
        .args(&files)
        .output()
        .expect("run scale-table");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    let _ = std::fs::remove_dir_all(dir);
    text
}

/// The columns of `text`'s write-bw row for `qps` queue pairs.
fn row(text: &str, qps: &str) -> Vec<String> {
    text.lines()
        .find(|l| l.starts_with("write-bw") && l.split_whitespace().nth(1) == Some(qps))
        .unwrap_or_else(|| panic!("no {qps}-QP row: {text}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn the_scale_table_gives_both_ratios_to_one_qp() {
    // One QP: 1000 over the round, 1100 in its middle half; 10,000 QPs:
    // 600 over the round (a slow start), 990 in the middle.
    let docs = [(1, 1000.0, 1100.0), (10_000, 600.0, 990.0)]
        .map(|(qps, avg, steady)| (format!("run-{qps}"), qps, avg, steady));
    let text = scale_table("scale", &docs);
    assert_eq!(
        row(&text, "10000")[3..7],
        ["600.0", "0.600", "990.0", "0.900"],
        "{text}"
    );
}

/// Each run's ratio is taken against the one-QP run of the same round
/// (files `Q-I.json`): the machine ran at 1,000, 2,000 and 3,000 MB/s in
/// three rounds, 10,000 QPs at 0.7, 0.9 and 0.8 of each. The ratio of
/// the medians (1800 / 2000) says 0.9; the paired ratios say 0.8, from
/// 0.7 to 0.9.
#[test]
fn the_scale_table_pairs_each_run_with_its_own_round() {
    let runs = [(1, 1000.0, 700.0), (2, 2000.0, 1800.0), (3, 3000.0, 2400.0)];
    let docs: Vec<_> = runs
        .iter()
        .flat_map(|&(run, one, many)| {
            [(1, one), (10_000, many)].map(|(qps, bw)| (format!("{qps}-{run}"), qps, bw, bw))
        })
        .collect();
    let text = scale_table("paired", &docs);
    let many = row(&text, "10000");
    assert_eq!(many[4], "0.900", "{text}");
    assert_eq!(many[9..12], ["0.800", "0.700-0.900", "0.800"], "{text}");
    assert_eq!(
        row(&text, "1")[9..12],
        ["1.000", "1.000-1.000", "1.000"],
        "{text}"
    );
}
