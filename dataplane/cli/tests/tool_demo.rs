//! `iwarp demo` as a user runs it: the built binary, no NIC, no hugepages.
//! Its JSON carries non-zero figures for every round and a passed data
//! check, it exits 0, and the EAL runtime directory of its file prefix is
//! gone afterwards; a bad option is one line and a non-zero exit.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Where EAL keeps the runtime files of `prefix` (as root:
/// `/var/run/dpdk/<prefix>`).
fn runtime_dir(prefix: &str) -> PathBuf {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    let base = if root {
        PathBuf::from("/var/run")
    } else {
        std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"))
    };
    base.join("dpdk").join(prefix)
}

fn positive(v: &serde_json::Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x > 0.0, "{what} is {x}");
    x
}

#[test]
fn demo_json_has_every_figure_and_leaves_nothing_behind() {
    let child = Command::new(env!("CARGO_BIN_EXE_iwarp"))
        .args([
            "demo",
            "--json",
            // Small enough that a debug build on a busy machine sees
            // completions well within the stall timeout.
            "--size",
            "16K",
            "--seconds",
            "0.5",
            "--lat-iterations",
            "200",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iwarp runs");
    let pid = child.id();
    let out = child.wait_with_output().expect("iwarp finishes");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(out.status.success(), "iwarp demo failed: {stderr}");
    let dir = runtime_dir(&format!("iwarp-demo-{pid}"));
    assert!(!dir.exists(), "{} left behind", dir.display());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(j["data_check"], "passed");
    positive(&j["verified_bytes"], "verified_bytes");
    // The cores' distance, before and after the rounds: measured wherever
    // the process may use two cores.
    let two = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    for i in 0..2 {
        let rtt = &j["cross_core_round_trip_ns"][i];
        if two {
            positive(rtt, "cross_core_round_trip_ns");
        } else {
            assert!(rtt.is_null(), "{rtt}");
        }
    }
    // `--drive auto` tried both ways and kept the faster.
    let trial = &j["drive_trial"];
    positive(&trial["round_trips"], "drive_trial round_trips");
    positive(&trial["trials"], "drive_trial trials");
    let threads = positive(&trial["threads_p50_us"], "drive_trial threads_p50_us");
    let busy = positive(&trial["busy_poll_p50_us"], "drive_trial busy_poll_p50_us");
    let want = if busy <= threads {
        "busy-poll"
    } else {
        "threads"
    };
    assert_eq!(j["drive"], want, "{trial}");
    let bw = j["bandwidth"].as_array().expect("bandwidth rounds");
    let tests: Vec<&str> = bw.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["write-bw", "read-bw", "send-bw"]);
    for r in bw {
        let t = r["test"].as_str().unwrap();
        for f in [
            "size",
            "iterations",
            "bytes",
            "seconds",
            "bw_avg_mbps",
            "bw_peak_mbps",
            "msg_rate_mpps",
            "copy_crc_mbps",
            "ratio",
            "kernel_tcp_mbps",
            "kernel_tcp_bytes",
            "kernel_tcp_seconds",
            "kernel_ratio",
            "cross_core_mbps",
            "cross_core_ratio",
            "verified_bytes",
        ] {
            positive(&r[f], &format!("{t} {f}"));
        }
        let ratio = r["bw_avg_mbps"].as_f64().unwrap() / r["copy_crc_mbps"].as_f64().unwrap();
        assert!((ratio - r["ratio"].as_f64().unwrap()).abs() < 1e-9);
        let vs_kernel = r["bw_avg_mbps"].as_f64().unwrap() / r["kernel_tcp_mbps"].as_f64().unwrap();
        assert!((vs_kernel - r["kernel_ratio"].as_f64().unwrap()).abs() < 1e-9);
        let vs_cross = r["bw_avg_mbps"].as_f64().unwrap() / r["cross_core_mbps"].as_f64().unwrap();
        assert!((vs_cross - r["cross_core_ratio"].as_f64().unwrap()).abs() < 1e-9);
        // Every side's CPU time was read (worker threads through their
        // ids, the kernel stream's threads themselves).
        for side in [
            "source_workers",
            "sink_workers",
            "kernel_sender",
            "kernel_receiver",
        ] {
            positive(&r[side]["ns_per_byte"], &format!("{t} {side} ns_per_byte"));
            positive(&r[side]["busy"], &format!("{t} {side} busy"));
        }
        // The workers' frames: every byte went in a data frame of at most
        // an MSS (1460 at the default MTU) from the source to the sink,
        // which sent at least one acknowledgement back.
        for side in ["source_frames", "sink_frames"] {
            for f in ["frames_sent", "frames_received", "loops", "ns_per_frame"] {
                positive(&r[side][f], &format!("{t} {side} {f}"));
            }
        }
        let bytes = r["bytes"].as_u64().unwrap();
        let data_frames = r["source_frames"]["frames_sent"].as_u64().unwrap();
        assert!(
            data_frames * 1460 >= bytes,
            "{t}: {data_frames} frames for {bytes} bytes"
        );
        assert!(r["sink_frames"]["frames_received"].as_u64().unwrap() >= data_frames * 9 / 10);
        println!(
            "{t}: {:.1} MB/s, one core copy+CRC32c {:.1} MB/s, ratio {:.3}, {} bytes verified",
            r["bw_avg_mbps"].as_f64().unwrap(),
            r["copy_crc_mbps"].as_f64().unwrap(),
            r["ratio"].as_f64().unwrap(),
            r["verified_bytes"]
        );
    }
    let rate = j["message_rate"].as_array().expect("message-rate rounds");
    let tests: Vec<&str> = rate.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["write-bw", "read-bw", "send-bw"]);
    for r in rate {
        let t = r["test"].as_str().unwrap();
        assert_eq!(r["size"], 64, "{t}: the default message-rate size");
        for f in [
            "iterations",
            "seconds",
            "msg_rate_mpps",
            "bw_avg_mbps",
            "verified_bytes",
        ] {
            positive(&r[f], &format!("{t} message rate {f}"));
        }
        let mpps = r["iterations"].as_f64().unwrap() / r["seconds"].as_f64().unwrap() / 1e6;
        let got = r["msg_rate_mpps"].as_f64().unwrap();
        assert!((mpps - got).abs() <= 0.05 * got, "{t}: {mpps} vs {got}");
        for side in ["source_workers", "sink_workers"] {
            positive(&r[side]["ns_per_byte"], &format!("{t} {side} ns_per_byte"));
        }
        for side in ["source_frames", "sink_frames"] {
            positive(
                &r[side]["ns_per_frame"],
                &format!("{t} message rate {side} ns_per_frame"),
            );
        }
        println!("{t} 64 B: {got:.3} M messages/s");
    }
    let lat = j["latency"].as_array().expect("latency rounds");
    let tests: Vec<&str> = lat.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["write-lat", "read-lat", "send-lat"]);
    for r in lat {
        let t = r["test"].as_str().unwrap();
        for f in [
            "size",
            "iterations",
            "min_us",
            "p50_us",
            "p99_us",
            "p999_us",
            "max_us",
            "avg_us",
            "stdev_us",
            "kernel_p50_us",
            "kernel_p99_us",
            "kernel_ratio",
            "verified_bytes",
        ] {
            positive(&r[f], &format!("{t} {f}"));
        }
        let vs_kernel = r["p50_us"].as_f64().unwrap() / r["kernel_p50_us"].as_f64().unwrap();
        assert!((vs_kernel - r["kernel_ratio"].as_f64().unwrap()).abs() < 1e-9);
        let (min, p50, max) = (
            r["min_us"].as_f64().unwrap(),
            r["p50_us"].as_f64().unwrap(),
            r["max_us"].as_f64().unwrap(),
        );
        assert!(min <= p50 && p50 <= max * 1.001, "{t}: {r}");
        // Every message of a latency round is checked, by both ends
        // where both receive.
        let per = r["size"].as_u64().unwrap() * 200;
        let expect = if t == "read-lat" { per } else { 2 * per };
        assert_eq!(r["verified_bytes"].as_u64().unwrap(), expect, "{t}");
        println!("{t}: typical {p50:.2} us");
    }
}

/// `--drive busy-poll`: the application's threads drive the workers in
/// every round (no trial), the data is checked, and the CPU figures still
/// count the time the workers' work took (on the driving threads).
#[test]
fn demo_can_be_told_to_busy_poll() {
    let out = Command::new(env!("CARGO_BIN_EXE_iwarp"))
        .args([
            "demo",
            "--json",
            "--drive",
            "busy-poll",
            "--size",
            "4K",
            "--seconds",
            "0.3",
            "--lat-iterations",
            "100",
        ])
        .output()
        .expect("iwarp runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "iwarp demo failed: {stderr}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(j["drive"], "busy-poll");
    assert!(j["drive_trial"].is_null(), "no trial when told");
    assert_eq!(j["data_check"], "passed");
    for r in j["bandwidth"].as_array().unwrap() {
        let t = r["test"].as_str().unwrap();
        positive(&r["source_workers"]["ns_per_byte"], &format!("{t} source"));
        positive(&r["bw_avg_mbps"], &format!("{t} bw"));
    }
    for r in j["latency"].as_array().unwrap() {
        positive(&r["p50_us"], "latency p50");
    }
}

#[test]
fn demo_refuses_a_bad_option_in_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_iwarp"))
        .args(["demo", "--bogus"])
        .output()
        .expect("iwarp runs");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("iwarp: ") && err.contains("--bogus"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_iwarp"))
        .args(["demo", "--size", "0"])
        .output()
        .expect("iwarp runs");
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}

#[test]
fn demo_help_explains_every_option() {
    let out = Command::new(env!("CARGO_BIN_EXE_iwarp"))
        .args(["demo", "--help"])
        .output()
        .expect("iwarp runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--json",
        "--size",
        "--seconds",
        "--iterations",
        "--lat-size",
        "--rate-size",
        "--lat-iterations",
        "--mtu",
        "--drive",
    ] {
        assert!(help.contains(opt), "{opt} missing from:\n{help}");
    }
}
