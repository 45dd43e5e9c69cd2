//! `iwarp perf` as operators run it: the built binary, as server in one
//! network namespace and as client in another, over `net_af_packet` on a
//! veth pair between them, every test type, both sides' `--json` read
//! back; and its errors, which need no root: a bad size, an unknown device
//! (with nothing left under `/var/run/dpdk`), `--help` naming every option,
//! an unreachable peer.
//!
//! Each run is limited in time and killed by PID when over; namespaces and
//! EAL runtime directories are removed on every exit and checked gone.
//! The namespace tests need root: without it they print a skip notice, or
//! fail with `IWARP_REQUIRE_ROOT_TESTS=1`.

#[path = "../../tests/netns_common/mod.rs"]
mod netns_common;
mod tool_common;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tool_common::{
    eal_args, iwarp, require_root, runtime_dir, unique_prefix, Proc, RuntimeDir, TwoNs, IWARP,
};

/// Limit of each `iwarp` process in the namespace tests: generous, the
/// machine may be loaded.
const LIMIT: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------
// Errors and help (no root).
// ---------------------------------------------------------------------

/// One line on stderr, starting with the tool's name.
fn assert_one_line(what: &str, stderr: &[String]) -> String {
    assert_eq!(
        stderr.len(),
        1,
        "{what}: one line on stderr, got {stderr:?}"
    );
    let line = stderr[0].clone();
    assert!(line.starts_with("iwarp: "), "{what}: {line}");
    line
}

#[test]
fn bad_numbers_fail_in_one_line() {
    let cases: [(&[&str], &str); 8] = [
        (&["perf", "write-bw", "-s", "0"], "bad size"),
        (&["perf", "send-bw", "--size", "3G"], "bad size"),
        (&["perf", "read-lat", "-s", "lots"], "bad size"),
        (&["perf", "write-bw", "-q", "0"], "-q/--qp"),
        (&["perf", "send-lat", "10.0.0.2", "-n", "1"], "-n/--iters"),
        (&["perf", "read-bw", "not-an-address"], "bad peer address"),
        (
            &["perf", "write-bw", "-n", "10", "-D", "2"],
            "cannot be used with",
        ),
        (&["perf", "write-bw", "-o", "4"], "-o/--outs"),
    ];
    for (args, want) in cases {
        let end = iwarp("iwarp", args, Duration::from_secs(20));
        assert!(!end.status.success(), "{args:?} succeeded");
        let line = assert_one_line(&format!("{args:?}"), &end.stderr);
        assert!(line.contains(want), "{args:?}: {line}");
        assert!(end.stdout.is_empty(), "{args:?}: stdout {:?}", end.stdout);
        println!("{args:?} -> {} {line:?}", end.status);
    }
}

#[test]
fn help_explains_every_option() {
    let end = iwarp(
        "iwarp",
        &["perf", "write-bw", "--help"],
        Duration::from_secs(20),
    );
    assert!(end.status.success(), "--help: {}", end.status);
    let help = end.stdout;
    for option in [
        "-s, --size",
        "-n, --iters",
        "-D, --duration",
        "-q, --qp",
        "-p, --port",
        "-a, --all",
        "-F, --CPU-freq",
        "-R, --rdma_cm",
        "-t, --tx-depth",
        "-r, --rx-depth",
        "-o, --outs",
        "--report_gbits",
        "--data_validation",
        "--json",
        "--timeout",
        "--config",
        "--device",
        "--ip",
        "--mac",
        "--mtu",
        "--cores",
        "--eal",
        "--set",
        "[PEER]",
    ] {
        assert!(
            help.contains(option),
            "--help does not mention {option}:\n{help}"
        );
    }
    for test in [
        "write-bw",
        "read-bw",
        "send-bw",
        "write-lat",
        "read-lat",
        "send-lat",
    ] {
        let end = iwarp("iwarp", &["perf", test, "-h"], Duration::from_secs(20));
        assert!(
            end.status.success() && end.stdout.contains("--size"),
            "{test} -h"
        );
    }
    println!(
        "--help: {} lines, every option explained",
        help.lines().count()
    );
}

#[test]
fn unknown_device_fails_and_leaves_nothing() {
    let prefix = unique_prefix("perf-nodev");
    let dir = RuntimeDir(runtime_dir(&prefix));
    let eal = eal_args(&prefix);
    let end = iwarp(
        "iwarp",
        &[
            "perf",
            "write-bw",
            "--device",
            "net_nosuchdriver0",
            "--ip",
            "10.77.0.1",
            "--eal",
            &eal,
        ],
        Duration::from_secs(30),
    );
    assert!(!end.status.success(), "an unknown device was accepted");
    // EAL logs its own complaint first (its log level is the user's to
    // choose); ours is the one line of the tool.
    let (ours, eal): (Vec<String>, Vec<String>) = end
        .stderr
        .iter()
        .cloned()
        .partition(|l| l.starts_with("iwarp: "));
    assert!(eal.iter().all(|l| l.starts_with("EAL: ")), "{eal:?}");
    let line = assert_one_line("unknown device", &ours);
    assert!(
        line.contains("net_nosuchdriver0"),
        "names the device: {line}"
    );
    assert!(!dir.0.exists(), "{} left behind", dir.0.display());
    println!(
        "unknown device -> {} {line:?}; {} absent",
        end.status,
        dir.0.display()
    );
}

#[test]
fn no_device_fails_in_one_line() {
    let end = iwarp("iwarp", &["perf", "write-bw"], Duration::from_secs(20));
    assert!(!end.status.success());
    let line = assert_one_line("no device", &end.stderr);
    assert!(line.contains("--device"), "{line}");
    println!("no device -> {} {line:?}", end.status);
}

/// A client on a memory port that nothing answers: the connection times
/// out and says which peer.
#[test]
fn unreachable_peer_fails_in_one_line() {
    let t0 = Instant::now();
    let end = iwarp(
        "iwarp",
        &[
            "perf",
            "write-bw",
            "10.77.0.2",
            "--device",
            "mem:nobody",
            "--ip",
            "10.77.0.1",
            "--mac",
            "02:00:00:00:77:01",
            "--timeout",
            "2",
            "-n",
            "10",
        ],
        Duration::from_secs(40),
    );
    assert!(!end.status.success(), "connected to nobody");
    let line = assert_one_line("unreachable", &end.stderr);
    assert!(
        line.contains("10.77.0.2:18515") && line.contains("unreachable"),
        "{line}"
    );
    println!(
        "unreachable peer -> {} after {:.1} s: {line:?}",
        end.status,
        t0.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------
// Server and client over a veth pair.
// ---------------------------------------------------------------------

/// Objects in a JSON document that carry run figures (`iterations` and
/// `bytes`), wherever the report puts them.
fn runs(v: &Value) -> Vec<&serde_json::Map<String, Value>> {
    let mut out = Vec::new();
    match v {
        Value::Object(m) => {
            if m.contains_key("iterations") && m.contains_key("bytes") {
                out.push(m);
            }
            for x in m.values() {
                out.extend(runs(x));
            }
        }
        Value::Array(a) => {
            for x in a {
                out.extend(runs(x));
            }
        }
        _ => {}
    }
    out
}

fn num(m: &serde_json::Map<String, Value>, key: &str) -> f64 {
    m.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number {key:?} in {m:?}"))
}

/// Server in one namespace, client in the other, `test` with `extra`
/// options on both; both must exit 0 with figures for `iters` messages
/// (any number in duration mode, `iters` 0); with `--data_validation` in
/// `extra`, some side must have checked bytes and found them right.
fn pair(test: &str, extra: &[&str], iters: u64) {
    if !require_root() {
        return;
    }
    let net = TwoNs::create().expect("two namespaces and a veth pair");
    let ips = ["10.79.0.1", "10.79.0.2"];
    let macs = ["02:1a:fb:00:00:01", "02:1a:fb:00:00:02"];
    let prefixes = [
        unique_prefix(&format!("perf-{test}-s")),
        unique_prefix(&format!("perf-{test}-c")),
    ];
    let dirs = prefixes.clone().map(|p| RuntimeDir(runtime_dir(&p)));
    // Each side's counters at the end (`--counters`).
    let counters = prefixes
        .clone()
        .map(|p| std::env::temp_dir().join(format!("{p}.counters.json")));
    let command = |side: usize| {
        let device = format!("net_af_packet0,iface={}", net.ifs[side]);
        let eal = eal_args(&prefixes[side]);
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &net.ns[side], IWARP, "perf", test]);
        if side == 1 {
            c.arg(ips[0]);
        }
        c.args(["--device", &device, "--ip", ips[side], "--mac", macs[side]])
            .args(["--eal", &eal])
            // Both processes and the kernel share the cores: back off when
            // idle.
            .args(["--set", "idle.spin=200", "--set", "idle.sleep_us=20"])
            .args(["--json", "--timeout", "60"])
            .arg("--counters")
            .arg(&counters[side])
            .args(extra);
        c
    };
    let deadline = Instant::now() + LIMIT;
    let mut server = Proc::spawn("server", command(0));
    server
        .wait_stderr("waiting for a client", deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    // The listen follows the line at once; give a loaded machine a moment.
    std::thread::sleep(Duration::from_millis(300));
    let mut client = Proc::spawn("client", command(1));
    let c = client.wait(deadline).unwrap_or_else(|e| panic!("{e}"));
    let s = server.wait(deadline).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        c.status.success(),
        "client failed: {} {:?}",
        c.status,
        c.stderr
    );
    assert!(
        s.status.success(),
        "server failed: {} {:?}",
        s.status,
        s.stderr
    );
    drop((client, server));
    for d in &dirs {
        assert!(!d.0.exists(), "{} left behind", d.0.display());
    }
    net.remove_and_check();
    for (side, path) in ["server", "client"].iter().zip(&counters) {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{side}: no counters at {}: {e}", path.display()));
        let _ = std::fs::remove_file(path);
        let doc: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{side}'s counters are not JSON ({e}): {text}"));
        let sent = doc["workers"][0]["tx_packets"].as_u64().unwrap_or(0);
        assert!(sent > 0, "{side}: no frames sent in its counters: {doc}");
        assert!(
            doc["link"].get("tx_tso_frames").is_some(),
            "{side}: no link counters in {doc}"
        );
    }

    let lat = test.ends_with("-lat");
    let verify = extra.contains(&"--data_validation");
    let mut verified = 0.0;
    let mut report = Vec::new();
    for (side, out) in [("client", &c), ("server", &s)] {
        let doc: Value = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("{side}'s --json is not JSON ({e}): {}", out.stdout));
        let found = runs(&doc);
        let by = doc.get("measured_by").and_then(Value::as_str);
        let want_by = match (side, test) {
            ("server", "write-bw" | "read-bw") => "peer",
            ("server", "read-lat") => "none",
            _ => "local",
        };
        assert_eq!(by, Some(want_by), "{side}: measured_by in {doc}");
        if side == "client" {
            let want = if extra.contains(&"-a") { 23 } else { 1 };
            assert_eq!(found.len(), want, "sizes in the client's JSON: {doc}");
        }
        for r in found {
            let n = num(r, "iterations");
            if iters == 0 {
                assert!(n > 0.0, "{side}: no messages in {r:?}");
            } else if lat {
                // Latency figures count samples: a ping-pong's n round
                // trips are timed as the n - 1 intervals between them, as
                // perftest times them.
                assert!(
                    n as u64 == iters || n as u64 + 1 == iters,
                    "{side}: {n} samples of {iters} iterations in {r:?}"
                );
            } else {
                assert_eq!(n as u64, iters, "{side}: iterations in {r:?}");
            }
            let bytes = num(r, "bytes");
            assert!(bytes > 0.0, "{side}: bytes in {r:?}");
            let bw = num(r, "bw_avg_mbps");
            assert!(bw > 0.0, "{side}: bandwidth in {r:?}");
            let mut line = format!("{side}: {n} x {} B, {bw:.1} MB/s", num(r, "size"));
            if lat {
                let l = r
                    .get("latency")
                    .and_then(Value::as_object)
                    .unwrap_or_else(|| panic!("{side}: no latency in {r:?}"));
                let (min, p50, p99, max) = (
                    num(l, "min_us"),
                    num(l, "p50_us"),
                    num(l, "p99_us"),
                    num(l, "max_us"),
                );
                assert!(
                    0.0 < min && min <= p50 && p50 <= p99 && p99 <= max,
                    "{side}: latency figures out of order: {l:?}"
                );
                line +=
                    &format!(", latency min {min:.1} p50 {p50:.1} p99 {p99:.1} max {max:.1} us");
            }
            let checked = num(r, "verified_bytes");
            verified += checked;
            if checked > 0.0 {
                line += &format!(", {checked} bytes verified");
            }
            report.push(line);
        }
        if verify {
            assert_eq!(
                doc.get("data_check").and_then(Value::as_str),
                Some("passed"),
                "{side}: data check in {doc}"
            );
        }
    }
    if verify {
        assert!(verified > 0.0, "--data_validation checked nothing");
    }
    println!(
        "{test} {extra:?}: both sides exited 0; {}",
        report.join("; ")
    );
    println!("namespaces and EAL runtime directories removed");
}

#[test]
fn write_bw_over_veth() {
    pair("write-bw", &["-s", "65536", "-n", "200"], 200);
}

#[test]
fn read_bw_over_veth() {
    pair("read-bw", &["-s", "65536", "-n", "200"], 200);
}

#[test]
fn send_bw_over_veth() {
    pair("send-bw", &["-s", "65536", "-n", "200"], 200);
}

#[test]
fn write_lat_over_veth() {
    pair("write-lat", &["-s", "64", "-n", "200"], 200);
}

#[test]
fn read_lat_over_veth() {
    pair("read-lat", &["-s", "64", "-n", "200"], 200);
}

#[test]
fn send_lat_over_veth() {
    pair("send-lat", &["-s", "64", "-n", "200"], 200);
}

#[test]
fn write_bw_two_qps_verified_over_veth() {
    pair(
        "write-bw",
        &["-s", "4096", "-n", "100", "-q", "2", "--data_validation"],
        200,
    );
}

#[test]
fn read_bw_verified_over_veth() {
    pair(
        "read-bw",
        &["-s", "4096", "-n", "100", "--data_validation"],
        100,
    );
}

#[test]
fn send_bw_two_qps_verified_over_veth() {
    pair(
        "send-bw",
        &["-s", "4096", "-n", "100", "-q", "2", "--data_validation"],
        200,
    );
}

#[test]
fn write_lat_verified_over_veth() {
    pair(
        "write-lat",
        &["-s", "64", "-n", "50", "--data_validation"],
        50,
    );
}

#[test]
fn write_bw_duration_over_veth() {
    pair("write-bw", &["-s", "4096", "-D", "2"], 0);
}

/// A server waiting for a client, then a client in the middle of its run,
/// each stopped by SIGINT: one line, exit 130, no runtime directory left.
#[test]
fn interrupted_runs_leave_nothing_over_veth() {
    if !require_root() {
        return;
    }
    let net = TwoNs::create().expect("two namespaces and a veth pair");
    let prefixes = [unique_prefix("perf-int-s"), unique_prefix("perf-int-c")];
    let dirs = prefixes.clone().map(|p| RuntimeDir(runtime_dir(&p)));
    let command = |side: usize, peer: Option<&str>| {
        let device = format!("net_af_packet0,iface={}", net.ifs[side]);
        let ip = ["10.79.1.1", "10.79.1.2"][side];
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &net.ns[side], IWARP, "perf", "send-bw"]);
        c.args(peer);
        c.args(["--device", &device, "--ip", ip])
            .args(["--mac", ["02:1a:fb:00:01:01", "02:1a:fb:00:01:02"][side]])
            .args(["--eal", &eal_args(&prefixes[side])])
            .args(["--set", "idle.spin=200", "--set", "idle.sleep_us=20"])
            .args(["-s", "4096", "-D", "60"]);
        c
    };
    let deadline = Instant::now() + LIMIT;
    let mut server = Proc::spawn("server", command(0, None));
    server
        .wait_stderr("waiting for a client", deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(300));
    let mut client = Proc::spawn("client", command(1, Some("10.79.1.1")));
    // Progress lines begin after two seconds of measuring.
    client
        .wait_stderr(" moved, ", deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    let t0 = Instant::now();
    client.interrupt();
    let c = client.wait(deadline).unwrap_or_else(|e| panic!("{e}"));
    let client_took = t0.elapsed();
    let t0 = Instant::now();
    server.interrupt();
    let s = server.wait(deadline).unwrap_or_else(|e| panic!("{e}"));
    let server_took = t0.elapsed();
    for (side, end, took) in [("client", &c, client_took), ("server", &s, server_took)] {
        assert_eq!(
            end.status.code(),
            Some(130),
            "{side}: {} {:?}",
            end.status,
            end.stderr
        );
        let ours: Vec<&String> = end
            .stderr
            .iter()
            .filter(|l| l.starts_with("iwarp: "))
            .collect();
        assert_eq!(ours.len(), 1, "{side}: {:?}", end.stderr);
        assert!(ours[0].contains("interrupted"), "{side}: {}", ours[0]);
        println!(
            "{side}: SIGINT -> {} after {:.2} s: {:?}",
            end.status,
            took.as_secs_f64(),
            ours[0]
        );
    }
    for d in &dirs {
        assert!(!d.0.exists(), "{} left behind", d.0.display());
    }
    net.remove_and_check();
    println!("runtime directories and namespaces removed");
}

/// The MiB moved in a progress line ("ib_write_bw N B: 12.5 MiB/1536.0 MiB
/// (1%), 0/20 messages, 2.0 s"), and its message count done.
fn progress_of(line: &str) -> Option<(f64, u64)> {
    let (_, rest) = line.split_once(" B: ")?;
    let (moved, rest) = rest.split_once(" MiB/")?;
    let (_, rest) = rest.split_once("), ")?;
    let (done, _) = rest.split_once('/')?;
    Some((moved.parse().ok()?, done.parse().ok()?))
}

/// A run of a few large messages shows its progress in bytes: lines with
/// growing byte counts while messages are still to complete, each within
/// the run's total, on the client (which posts them) before it ends.
#[test]
fn large_messages_show_byte_progress_over_veth() {
    if !require_root() {
        return;
    }
    let net = TwoNs::create().expect("two namespaces and a veth pair");
    let prefixes = [unique_prefix("perf-prog-s"), unique_prefix("perf-prog-c")];
    let dirs = prefixes.clone().map(|p| RuntimeDir(runtime_dir(&p)));
    let (size, iters) = (64u64 << 20, 24u64);
    let command = |side: usize, peer: Option<&str>| {
        let device = format!("net_af_packet0,iface={}", net.ifs[side]);
        let ip = ["10.79.2.1", "10.79.2.2"][side];
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &net.ns[side], IWARP, "perf", "write-bw"]);
        c.args(peer);
        c.args(["--device", &device, "--ip", ip])
            .args(["--mac", ["02:1a:fb:00:02:01", "02:1a:fb:00:02:02"][side]])
            .args(["--eal", &eal_args(&prefixes[side])])
            .args(["--set", "idle.spin=200", "--set", "idle.sleep_us=20"])
            .args(["-s", &size.to_string(), "-n", &iters.to_string()])
            .args(["--timeout", "60"]);
        c
    };
    let deadline = Instant::now() + LIMIT;
    let mut server = Proc::spawn("server", command(0, None));
    server
        .wait_stderr("waiting for a client", deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(300));
    let mut client = Proc::spawn("client", command(1, Some("10.79.2.1")));
    let c = client.wait(deadline).unwrap_or_else(|e| panic!("{e}"));
    let s = server.wait(deadline).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.status.success(), "client: {} {:?}", c.status, c.stderr);
    assert!(s.status.success(), "server: {} {:?}", s.status, s.stderr);
    drop((client, server));
    for d in &dirs {
        assert!(!d.0.exists(), "{} left behind", d.0.display());
    }
    net.remove_and_check();
    let seen: Vec<(f64, u64)> = c.stderr.iter().filter_map(|l| progress_of(l)).collect();
    let total_mib = (size * iters) as f64 / f64::from(1 << 20);
    assert!(
        seen.len() >= 2,
        "fewer than two progress lines: {:?}",
        c.stderr
    );
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
    assert!(seen.iter().all(|&(m, _)| m <= total_mib), "{seen:?}");
    let unfinished: Vec<&(f64, u64)> = seen.iter().filter(|&&(_, d)| d < iters).collect();
    assert!(
        unfinished.len() >= 2 && unfinished[0].0 < unfinished[unfinished.len() - 1].0,
        "no growing byte count while messages were in flight: {seen:?}"
    );
    println!(
        "client progress (MiB moved, messages done of {iters}): {seen:?}; \
         namespaces and runtime directories removed"
    );
}

/// `-a`: every size from 2 B to 8 MiB, a line each on the client; the
/// server shows the client's report of the last.
#[test]
fn write_bw_all_sizes_over_veth() {
    pair("write-bw", &["-a", "-n", "5"], 5);
}
