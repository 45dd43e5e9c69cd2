//! Shared helpers for the benchmarks in `benches/benches/`.
//!
//! Every figure is reported against a baseline measured in the same run.
//! Criterion prints each benchmark alone; the benches that rely on its
//! timing read its estimates back here after the run to print the ratios.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The estimates criterion writes during one run of a bench binary.
///
/// The directory is fixed (rather than left to criterion) so that it can be
/// read back; only estimates written after [`Estimates::new`] count, so a
/// filtered or `--test` run prints no stale figures from an earlier one.
#[derive(Debug, Clone)]
pub struct Estimates {
    dir: PathBuf,
    since: SystemTime,
}

impl Estimates {
    /// Starts the run now. `target_tmpdir` is the bench's
    /// `env!("CARGO_TARGET_TMPDIR")`, which cargo sets for bench targets
    /// only, not for this library.
    pub fn new(target_tmpdir: &str) -> Estimates {
        Estimates {
            dir: criterion_dir(Path::new(target_tmpdir)),
            since: SystemTime::now(),
        }
    }

    /// Where criterion is to write its estimates; pass it to
    /// `Criterion::output_directory`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The point estimate (ns) criterion reports as the time per iteration
    /// of `group/name` (the regression slope, or the mean where there is
    /// none); `None` if absent or written before this run.
    pub fn ns(&self, group: &str, name: &str) -> Option<f64> {
        let path = self.dir.join(group).join(name).join("new/estimates.json");
        let meta = std::fs::metadata(&path).ok()?;
        if meta.modified().ok()? < self.since {
            return None;
        }
        let text = std::fs::read_to_string(&path).ok()?;
        let point = |key: &str| -> Option<f64> {
            let at = &text[text.find(&format!("\"{key}\":{{"))?..];
            let v = &at[at.find("\"point_estimate\":")? + "\"point_estimate\":".len()..];
            let end = v.find([',', '}'])?;
            v[..end].trim().parse().ok()
        };
        point("slope").or_else(|| point("mean"))
    }
}

/// The place criterion chooses by default: `$CRITERION_HOME`, else
/// `criterion/` in the target directory (the parent of its `tmp/`).
fn criterion_dir(target_tmpdir: &Path) -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    target_tmpdir
        .parent()
        .unwrap_or(target_tmpdir)
        .join("criterion")
}

/// This thread's CPU time so far (`CLOCK_THREAD_CPUTIME_ID`, to the
/// nanosecond): a figure other processes on a shared machine do not
/// inflate, as they do the wall clock.
pub fn thread_cpu() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec for the call's duration,
    // and the clock is one every Linux kernel provides.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The median of `v` (sorted in place); NaN when empty.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The JSON document in the file at `path`, or why it could not be read.
pub fn read_json(path: &str) -> Result<serde_json::Value, String> {
    std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
}

/// Appends one formatted line to a `String` (the table tools build their
/// whole output first and write it with [`write_out`]).
#[macro_export]
macro_rules! outln {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($arg:tt)*) => {{
        $out.push_str(&format!($($arg)*));
        $out.push('\n');
    }};
}

/// Appends formatted text to a `String`, with no line end.
#[macro_export]
macro_rules! out {
    ($out:expr, $($arg:tt)*) => {
        $out.push_str(&format!($($arg)*))
    };
}

/// Writes a table tool's output to stdout. A reader that went away
/// (`| head`) ends the tool quietly and successfully, as it does `cat`;
/// any other write error is one line on stderr and a failure.
pub fn write_out(tool: &str, text: &str) -> std::process::ExitCode {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{tool}: writing the table: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
