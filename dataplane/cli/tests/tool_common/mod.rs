//! What the tests of the `iwarp` binary share: running it with a time
//! limit (killed by PID when over, its output kept for the report), EAL
//! arguments under a file prefix of the test's own, and the runtime
//! directories EAL makes for them — all removed on drop, failed
//! assertions included. The namespaces and veth pairs for a server and a
//! client on `net_af_packet` come from `netns_common` (re-exported here).
#![allow(dead_code, reason = "each test file uses part of the harness")]

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::netns_common::stop_child;
pub use crate::netns_common::{is_root, require_root, TwoNs};

/// The binary under test.
pub const IWARP: &str = env!("CARGO_BIN_EXE_iwarp");

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The runtime directory EAL makes for `prefix` (root: under
/// `/var/run/dpdk`, otherwise under `$XDG_RUNTIME_DIR/dpdk` or `/tmp/dpdk`).
pub fn runtime_dir(prefix: &str) -> PathBuf {
    let base = if is_root() {
        PathBuf::from("/var/run")
    } else {
        std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"))
    };
    base.join("dpdk").join(prefix)
}

/// A file prefix unique to this process and call.
pub fn unique_prefix(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("iwarp-{tag}-{}-{n}", std::process::id())
}

/// EAL arguments without hugepages or PCI under `prefix`, for `--eal`.
pub fn eal_args(prefix: &str) -> String {
    format!(
        "-l 0 --no-huge -m 256 --no-pci --no-telemetry --log-level=warning --file-prefix {prefix}"
    )
}

/// Removes a runtime directory on drop, for a run that failed before EAL
/// could clean up after itself.
pub struct RuntimeDir(pub PathBuf);

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `iwarp` (or any command): its output lines arrive on a
/// channel, and it is stopped by its PID when dropped still running.
pub struct Proc {
    /// For messages.
    pub name: String,
    child: Child,
    lines: mpsc::Receiver<(bool, String)>,
    /// Every stdout line so far.
    pub stdout: Vec<String>,
    /// Every stderr line so far.
    pub stderr: Vec<String>,
}

/// How a [`Proc`] ended.
#[derive(Debug)]
pub struct Ended {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error, line by line.
    pub stderr: Vec<String>,
}

impl Proc {
    /// Starts `cmd` with its output captured.
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let (tx, rx) = mpsc::channel();
        let out = child
            .stdout
            .take()
            .map(|s| (false, Box::new(s) as Box<dyn Read + Send>));
        let err = child
            .stderr
            .take()
            .map(|s| (true, Box::new(s) as Box<dyn Read + Send>));
        for (is_err, stream) in [out, err].into_iter().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                // Progress lines end in `\r`: split on both.
                let mut r = BufReader::new(stream);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match r.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let text = String::from_utf8_lossy(&buf);
                            for l in text.split(['\n', '\r']).filter(|l| !l.is_empty()) {
                                if tx.send((is_err, l.to_string())).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                }
            });
        }
        Proc {
            name: name.to_string(),
            child,
            lines: rx,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    fn take(&mut self, timeout: Duration) -> Option<(bool, String)> {
        match self.lines.recv_timeout(timeout) {
            Ok((is_err, line)) => {
                println!(
                    "[{}{}] {line}",
                    self.name,
                    if is_err { " stderr" } else { "" }
                );
                if is_err {
                    self.stderr.push(line.clone());
                } else {
                    self.stdout.push(line.clone());
                }
                Some((is_err, line))
            }
            Err(_) => None,
        }
    }

    /// Waits for a stderr line containing `needle`; `Err` with what was
    /// seen if the process ends or `deadline` passes first.
    pub fn wait_stderr(&mut self, needle: &str, deadline: Instant) -> Result<String, String> {
        loop {
            if let Some((true, line)) = self.take(Duration::from_millis(100)) {
                if line.contains(needle) {
                    return Ok(line);
                }
                continue;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                while self.take(Duration::from_millis(100)).is_some() {}
                return Err(format!(
                    "{} exited ({status}) before printing {needle:?}; stderr: {:?}",
                    self.name, self.stderr
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("{} printed no {needle:?} in time", self.name));
            }
        }
    }

    /// Waits for it to end, at most until `deadline` (then it is killed
    /// and `Err` says so).
    pub fn wait(&mut self, deadline: Instant) -> Result<Ended, String> {
        loop {
            while self.take(Duration::from_millis(20)).is_some() {}
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    // The readers end with the pipes; collect the rest.
                    while self.take(Duration::from_millis(200)).is_some() {}
                    return Ok(Ended {
                        status,
                        stdout: self.stdout.join("\n"),
                        stderr: self.stderr.clone(),
                    });
                }
                Ok(None) if Instant::now() > deadline => {
                    self.stop();
                    return Err(format!(
                        "{} did not finish in time; killed (stderr: {:?})",
                        self.name, self.stderr
                    ));
                }
                Ok(None) => {}
                Err(e) => return Err(format!("waiting for {}: {e}", self.name)),
            }
        }
    }

    /// Sends SIGINT (to the program itself: `ip netns exec` execs it).
    pub fn interrupt(&self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill has no memory effects; `pid` is our own child,
            // not yet reaped (its `Child` is alive and not waited for).
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
    }

    /// SIGINT, then SIGKILL two seconds later if still running.
    fn stop(&mut self) {
        if stop_child(&mut self.child) {
            println!("{} (pid {}) stopped", self.name, self.child.id());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `iwarp` with `args` to completion within `limit`.
pub fn iwarp(name: &str, args: &[&str], limit: Duration) -> Ended {
    let mut cmd = Command::new(IWARP);
    cmd.args(args);
    let mut p = Proc::spawn(name, cmd);
    p.wait(Instant::now() + limit)
        .unwrap_or_else(|e| panic!("{e}"))
}
