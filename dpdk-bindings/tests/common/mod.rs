//! What every EAL test shares: the arguments for a hugepage-free EAL with its
//! own file prefix, and a guard that removes the prefix's runtime directory
//! even when the test fails.
//!
//! EAL starts once per process, so each test file holds one `#[test]` that
//! starts it: cargo-nextest runs every test in a process of its own, and
//! plain `cargo test` runs each file as its own binary.
#![allow(dead_code, reason = "each test binary uses a different part")]

use std::path::PathBuf;

/// A file prefix unique to this test and process.
pub fn prefix(test: &str) -> String {
    format!("iwarp-{test}-{}", std::process::id())
}

/// EAL arguments without hugepages (which forces IOVA-as-VA), without PCI,
/// with `vdevs` as virtual devices. `--no-huge` cannot be combined with
/// `--in-memory`, so DPDK writes a runtime directory that `Eal`'s drop (and
/// [`RuntimeDir`] on failure) removes.
pub fn eal_args(prefix: &str, vdevs: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "-l",
        "0",
        "--no-huge",
        "-m",
        "256",
        "--no-pci",
        "--no-telemetry",
        "--log-level=warning",
        "--file-prefix",
        prefix,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(vdevs.iter().map(|v| format!("--vdev={v}")));
    args
}

/// Where EAL puts the runtime files of `prefix` (as root:
/// `/var/run/dpdk/<prefix>`).
pub fn runtime_dir(prefix: &str) -> PathBuf {
    // DPDK's choice: root uses /var/run, others XDG_RUNTIME_DIR or /tmp.
    let base = if is_root() {
        PathBuf::from("/var/run")
    } else {
        std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"))
    };
    base.join("dpdk").join(prefix)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Removes the prefix's runtime directory on drop, for the case where the
/// test failed before `Eal` could clean up after itself.
pub struct RuntimeDir(pub PathBuf);

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts EAL for one test; the guard goes out of scope after the `Eal`.
pub fn start(test: &str, vdevs: &[&str]) -> (RuntimeDir, dpdk_bindings::Eal) {
    let prefix = prefix(test);
    let guard = RuntimeDir(runtime_dir(&prefix));
    let args = eal_args(&prefix, vdevs);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let eal = dpdk_bindings::Eal::init(&args).expect("EAL starts without hugepages");
    (guard, eal)
}
