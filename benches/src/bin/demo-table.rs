//! `demo-table FILE...`: the medians of several `iwarp demo --json`
//! documents, per MTU and bandwidth test, as one table: our bandwidth,
//! the kernel's TCP over loopback measured in the same runs and the ratio
//! of the two, the ratio to one core copying and CRC32c-summing the same
//! bytes, the ratio to one core handing the bytes to another, and each
//! side's worker CPU time per byte; then the message-rate rounds (millions
//! of small messages per second) and the latency rounds beside the
//! kernel's TCP ping-pong of the same runs; last, each run's cache-line
//! round trip between the two cores, before and after its rounds.
//!
//! That round trip says where the host put the machine's vCPUs, which
//! moves every figure of the ring demo (on a two-vCPU machine, write-bw
//! at MTU 9000 ran three times faster with the cores near each other):
//! the rows are kept apart by it, `near` (both round trips under
//! [`NEAR_NS`]), `far` (both at or over it), `moved` (one of each: the
//! host moved the vCPUs during the run) and `-` (no figure), so that a
//! median never mixes the two kinds of machine. `benches/demo-bw.sh`
//! runs the demos and calls it.

use std::collections::BTreeMap;
use std::process::ExitCode;

use benches::{median, out, outln, read_json, write_out};
use serde_json::Value;

/// A figure's column name and its path in a row.
type Figure = (&'static str, &'static [&'static str]);

/// The figures of one bandwidth row that the table shows, in order.
const FIGURES: &[Figure] = &[
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

/// The figures of a message-rate row.
const RATE_FIGURES: &[Figure] = &[
    ("bytes", &["size"]),
    ("M msg/s", &["msg_rate_mpps"]),
    ("src ns/B", &["source_workers", "ns_per_byte"]),
    ("sink ns/B", &["sink_workers", "ns_per_byte"]),
];

/// The figures of a latency row.
const LAT_FIGURES: &[Figure] = &[
    ("bytes", &["size"]),
    ("p50 us", &["p50_us"]),
    ("p99 us", &["p99_us"]),
    ("kernel p50", &["kernel_p50_us"]),
    ("kernel p99", &["kernel_p99_us"]),
    ("x kernel", &["kernel_ratio"]),
];

/// The documents' sections the tables show, with their figures.
const SECTIONS: [(&str, &[Figure]); 3] = [
    ("bandwidth", FIGURES),
    ("message_rate", RATE_FIGURES),
    ("latency", LAT_FIGURES),
];

/// (placement, mtu, test) -> one list of values per figure.
type Rows = BTreeMap<(&'static str, u64, String), Vec<Vec<f64>>>;

/// A cache-line round trip between the cores below this is cores that
/// share a cache (tens of nanoseconds); across dies or sockets it takes
/// hundreds.
const NEAR_NS: f64 = 150.0;

/// A run's cache-line round trips between its two cores, before and after
/// the rounds (`None` where the document has no figure).
fn round_trips(doc: &Value) -> [Option<f64>; 2] {
    [0, 1].map(|i| doc["cross_core_round_trip_ns"][i].as_f64())
}

/// Where the run's two cores were, from its round trips.
fn placement(trips: [Option<f64>; 2]) -> &'static str {
    let [before, after] = trips.map(|t| t.map(|x| x < NEAR_NS));
    match (before, after) {
        (Some(true), Some(true)) => "near",
        (Some(false), Some(false)) => "far",
        (Some(_), Some(_)) => "moved",
        _ => "-",
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
    let mut out = String::new();
    let mut tables: Vec<Rows> = vec![Rows::new(); SECTIONS.len()];
    let mut trips = Vec::new();
    for f in &files {
        let doc: Value = match read_json(f) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("demo-table: {f}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mtu = doc["mtu"].as_u64().unwrap_or(0);
        let rt = round_trips(&doc);
        let cores = placement(rt);
        let [before, after] = rt.map(|x| x.map_or("-".to_string(), |x| format!("{x:.0}")));
        trips.push(format!("  {f}: MTU {mtu}, {before} / {after} ({cores})"));
        for ((key, figures), rows) in SECTIONS.iter().zip(tables.iter_mut()) {
            for row in doc[*key].as_array().into_iter().flatten() {
                let test = row["test"].as_str().unwrap_or("?").to_string();
                let slot = rows
                    .entry((cores, mtu, test))
                    .or_insert_with(|| vec![Vec::new(); figures.len()]);
                for (i, (_, path)) in figures.iter().enumerate() {
                    if let Some(x) = field(row, path) {
                        slot[i].push(x);
                    }
                }
            }
        }
    }
    let runs = tables[0].values().map(|r| r[0].len()).max().unwrap_or(0);
    outln!(
        out,
        "medians of {runs} run(s) per row, from {} document(s)",
        files.len()
    );
    for ((key, figures), rows) in SECTIONS.iter().zip(tables) {
        if rows.is_empty() {
            continue;
        }
        outln!(out, "{key}:");
        print_table(&mut out, figures, rows);
    }
    outln!(
        out,
        "cache line round trip between the two cores, ns, before / after the rounds \
         (near: both under {NEAR_NS} ns):"
    );
    for t in trips {
        outln!(out, "{t}");
    }
    write_out("demo-table", &out)
}

fn print_table(out: &mut String, figures: &[Figure], rows: Rows) {
    out!(
        out,
        "{:<6} {:>5} {:<9} {:>4}",
        "cores",
        "MTU",
        "test",
        "runs"
    );
    for (name, _) in figures {
        out!(out, " {name:>12}");
    }
    outln!(out);
    for ((cores, mtu, test), mut figs) in rows {
        out!(out, "{cores:<6} {mtu:>5} {test:<9} {:>4}", figs[0].len());
        for v in figs.iter_mut() {
            out!(out, " {:>12.3}", median(v));
        }
        outln!(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(trips: Value) -> Value {
        serde_json::json!({ "cross_core_round_trip_ns": trips })
    }

    #[test]
    fn runs_are_told_apart_by_where_their_cores_were() {
        let at = |trips: Value| placement(round_trips(&doc(trips)));
        assert_eq!(at(serde_json::json!([62.0, 64.0])), "near");
        assert_eq!(at(serde_json::json!([320.0, 345.0])), "far");
        assert_eq!(at(serde_json::json!([64.0, 330.0])), "moved");
        assert_eq!(at(serde_json::json!([null, null])), "-");
        // A document from before the figure existed.
        assert_eq!(
            placement(round_trips(&serde_json::json!({ "mtu": 1500 }))),
            "-"
        );
    }
}
