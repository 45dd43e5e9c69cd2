//! CPU time of threads, for the demo's per-byte figures: how long a
//! thread has run on a core, read from `/proc` (the scheduler's
//! nanosecond count in `schedstat`, or the tick counts in `stat` where a
//! kernel keeps no schedstat). Read before and after a round, never on
//! the data path.

use std::path::Path;

/// Nanoseconds per `stat` tick: Linux reports utime and stime in
/// USER_HZ, which is 100 on every architecture it exports to userspace.
const NS_PER_TICK: u64 = 10_000_000;

/// CPU time of thread `tid` of this process, in nanoseconds.
pub fn thread_ns(tid: u32) -> Option<u64> {
    read(&Path::new("/proc/self/task").join(tid.to_string()))
}

/// CPU time of the calling thread, in nanoseconds.
pub fn own_ns() -> Option<u64> {
    read(Path::new("/proc/thread-self"))
}

fn read(dir: &Path) -> Option<u64> {
    if let Some(ns) = std::fs::read_to_string(dir.join("schedstat"))
        .ok()
        .and_then(|s| parse_schedstat(&s))
    {
        return Some(ns);
    }
    std::fs::read_to_string(dir.join("stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
}

/// `schedstat`: time on a CPU (ns), time waiting to run (ns), slices.
fn parse_schedstat(s: &str) -> Option<u64> {
    s.split_whitespace().next()?.parse().ok()
}

/// `stat`: utime and stime are fields 14 and 15, counted after the
/// command name, which is in parentheses and may hold spaces.
fn parse_stat(s: &str) -> Option<u64> {
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some((utime + stime) * NS_PER_TICK)
}

/// What a side's threads spent on `bytes` in `seconds` of wall time.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CpuUse {
    /// CPU nanoseconds per byte moved.
    pub ns_per_byte: f64,
    /// CPU time over wall time (1.0: one core busy throughout).
    pub busy: f64,
}

impl CpuUse {
    /// From a CPU time in nanoseconds (`None`: unreadable, all zero).
    pub fn new(cpu_ns: Option<u64>, bytes: u64, seconds: f64) -> CpuUse {
        match cpu_ns {
            Some(ns) if bytes > 0 && seconds > 0.0 => CpuUse {
                ns_per_byte: ns as f64 / bytes as f64,
                busy: ns as f64 / 1e9 / seconds,
            },
            _ => CpuUse::default(),
        }
    }
}

/// What a side's workers handled in a round, from their counters: the
/// frames they sent and received and their loop iterations, with the
/// side's CPU time per frame. With the bytes moved, this splits a side's
/// cost into what it pays per byte and what it pays per frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct FrameWork {
    /// Frames the side's workers sent (data and acknowledgements).
    pub frames_sent: u64,
    /// Frames they received.
    pub frames_received: u64,
    /// Their loop iterations.
    pub loops: u64,
    /// The side's CPU nanoseconds per frame sent or received (0 when the
    /// CPU time could not be read).
    pub ns_per_frame: f64,
}

impl FrameWork {
    /// From the counters' growth over the round (`sent`, `received`,
    /// `loops`) and the side's CPU time in nanoseconds.
    pub fn new(counts: (u64, u64, u64), cpu_ns: Option<u64>) -> FrameWork {
        let (frames_sent, frames_received, loops) = counts;
        let frames = frames_sent + frames_received;
        FrameWork {
            frames_sent,
            frames_received,
            loops,
            ns_per_frame: match cpu_ns {
                Some(ns) if frames > 0 => ns as f64 / frames as f64,
                _ => 0.0,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_parse() {
        assert_eq!(parse_schedstat("123456 789 10\n"), Some(123_456));
        let stat = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 25 7 0 0 20 0 1";
        assert_eq!(parse_stat(stat), Some(32 * NS_PER_TICK));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_busy_thread_counts_its_time() {
        let before = own_ns().expect("this thread's CPU time");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = own_ns().unwrap();
        assert!(after > before, "{before} -> {after}");
    }

    #[test]
    fn use_per_byte_and_busy() {
        let u = CpuUse::new(Some(2_000_000_000), 1_000_000_000, 4.0);
        assert_eq!(u.ns_per_byte, 2.0);
        assert_eq!(u.busy, 0.5);
        assert_eq!(CpuUse::new(None, 1, 1.0), CpuUse::default());
    }

    #[test]
    fn frame_work_divides_the_cpu_time_by_the_frames_each_way() {
        let f = FrameWork::new((300, 100, 50), Some(40_000));
        assert_eq!((f.frames_sent, f.frames_received, f.loops), (300, 100, 50));
        assert_eq!(f.ns_per_frame, 100.0);
        assert_eq!(FrameWork::new((0, 0, 7), Some(40_000)).ns_per_frame, 0.0);
        assert_eq!(FrameWork::new((3, 1, 7), None).ns_per_frame, 0.0);
    }
}
