//! Packet capture: on demand, every frame each worker receives and
//! transmits, written to a classic pcap file (`LINKTYPE_ETHERNET`) that
//! tcpdump and Wireshark read, and that Wireshark decodes as iWARP (MPA,
//! DDP, RDMAP) when the capture holds the connection's MPA request.
//!
//! It sits beside the worker's loop, not in it. Each worker has a
//! [`CaptureTap`] (on its [`crate::worker::WorkerCounters`], the state the
//! worker shares with the control path). Off, the tap costs the worker
//! one relaxed atomic load per receive burst: the generation number it
//! compares with the one it last saw. [`Capture::start`] (through
//! [`crate::api::Dataplane::capture_start`]) arms every tap with a ring
//! of its own and starts one writer thread; each worker, on its next
//! burst, picks its ring up and from then on copies each frame (up to the
//! snap length) into a preallocated slot taken from the ring's free list,
//! with the burst's timestamp, and queues the slot for the writer. The
//! writer drains every ring, orders what it took by timestamp, writes the
//! records with [`pcap_format::Writer`] and hands the slots back.
//!
//! Memory is bounded by the slots allocated at start: a worker that finds
//! no free slot (the writer is behind, the disk is slow) counts a drop
//! and carries on; it never waits for the writer. Nothing is allocated,
//! locked or called into the kernel per packet: a slot is a fixed buffer
//! sized for the port's largest frame, recycled through a lock-free ring.
//!
//! The file format is the classic pcap of the IETF OPSAWG pcap draft.

use core::ops::Range;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_queue::ArrayQueue;
use pcap_format::{LinkType, Writer};
use tcp_offload::tcp::RecordBytes;

pub use pcap_format::Precision;

/// The snap length a capture keeps by default: tcpdump's customary
/// 65535, more than any frame the dataplane sends or receives, so frames
/// are whole.
pub const DEFAULT_SNAPLEN: u32 = 65_535;

/// Slots per worker by default: about 6 MB per worker at a 1500-byte MTU,
/// and at 10 Gb/s some 5 ms of full-size frames for the writer to fall
/// behind by before anything is dropped.
pub const DEFAULT_RING_SLOTS: usize = 4096;

/// The largest slot when the port's frame size is not known yet (no
/// worker has started): a jumbo frame.
const FALLBACK_FRAME: usize = 9216 + crate::link::FRAME_OVERHEAD;

/// How long the writer sleeps when every ring is empty: short enough that
/// a ring of [`DEFAULT_RING_SLOTS`] does not fill meanwhile at line rate.
const WRITER_NAP: Duration = Duration::from_micros(500);

/// How long the writer holds a frame before writing it, so that frames
/// of other workers stamped earlier but queued later (a worker stamps a
/// burst, then builds it) still go before it in the file: a dispatched
/// connection's frames cross two workers, and Wireshark needs the MPA
/// request before the reply. Holding a slot keeps it from its worker for
/// this long, a small part of what a ring holds at line rate.
const REORDER_WINDOW_NS: u64 = 2_000_000;

/// How long [`Capture::stop`] waits for the workers to let go of their
/// rings before it writes what it has (a worker that stopped polling).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// What to capture and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureOptions {
    /// Bytes kept of each frame (the rest is counted in the record's
    /// original length, as pcap does); 0 means [`DEFAULT_SNAPLEN`].
    pub snaplen: u32,
    /// Frames each worker may have waiting for the writer; beyond that
    /// frames are dropped and counted.
    pub ring_slots: usize,
    /// Timestamp precision of the file.
    pub precision: Precision,
}

impl Default for CaptureOptions {
    fn default() -> CaptureOptions {
        CaptureOptions {
            snaplen: DEFAULT_SNAPLEN,
            ring_slots: DEFAULT_RING_SLOTS,
            precision: Precision::Nanos,
        }
    }
}

/// What one worker contributed to a capture.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerCapture {
    /// Frames written to the file.
    pub captured: u64,
    /// Frames not captured because no slot was free.
    pub dropped: u64,
}

/// What a finished capture wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureSummary {
    /// The file.
    pub path: PathBuf,
    /// Per worker, in worker order.
    pub workers: Vec<WorkerCapture>,
    /// Bytes of the file (header included).
    pub bytes: u64,
}

impl CaptureSummary {
    /// Frames written, over all workers.
    pub fn captured(&self) -> u64 {
        self.workers.iter().map(|w| w.captured).sum()
    }

    /// Frames dropped, over all workers.
    pub fn dropped(&self) -> u64 {
        self.workers.iter().map(|w| w.dropped).sum()
    }
}

/// Why a capture could not start or finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaptureError {
    /// A capture is running already.
    Running,
    /// No capture is running.
    NotRunning,
    /// Zero slots per worker.
    NoSlots,
    /// The file could not be created.
    Create(PathBuf, String),
    /// Writing the file failed (the capture went on counting, and
    /// discarded what it could not write).
    Write(PathBuf, String),
    /// The writer thread could not be started, or ended by panicking.
    Thread(String),
}

impl core::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CaptureError::Running => f.write_str("a capture is running already"),
            CaptureError::NotRunning => f.write_str("no capture is running"),
            CaptureError::NoSlots => f.write_str("a capture needs at least one slot per worker"),
            CaptureError::Create(p, e) => {
                write!(f, "cannot create capture file {}: {e}", p.display())
            }
            CaptureError::Write(p, e) => {
                write!(f, "cannot write capture file {}: {e}", p.display())
            }
            CaptureError::Thread(m) => write!(f, "capture writer: {m}"),
        }
    }
}

impl std::error::Error for CaptureError {}

// ---------------------------------------------------------------------
// The per-worker ring.
// ---------------------------------------------------------------------

/// One captured frame, preallocated and recycled.
#[derive(Debug)]
struct Slot {
    ts_ns: u64,
    orig_len: u32,
    len: u32,
    data: Box<[u8]>,
}

/// The slots of one worker: those waiting for the writer and those free.
/// Only its worker pushes to `filled` and pops from `free`; only the
/// writer does the opposite. Both rings hold every slot, so a push never
/// finds them full.
#[derive(Debug)]
pub(crate) struct Ring {
    filled: ArrayQueue<Box<Slot>>,
    free: ArrayQueue<Box<Slot>>,
    /// Bytes kept of a frame: the snap length, at most a slot.
    snap: usize,
    /// Written by the worker alone.
    dropped: AtomicU64,
    /// The wall clock at start, against a monotonic instant: timestamps
    /// are the monotonic clock's progress since then, so they never go
    /// back when the system clock is stepped.
    epoch_ns: u64,
    start: std::time::Instant,
}

impl Ring {
    fn new(slots: usize, slot_bytes: usize, snap: usize, epoch: (u64, std::time::Instant)) -> Ring {
        let free = ArrayQueue::new(slots);
        for _ in 0..slots {
            let _ = free.push(Box::new(Slot {
                ts_ns: 0,
                orig_len: 0,
                len: 0,
                data: vec![0u8; slot_bytes].into_boxed_slice(),
            }));
        }
        Ring {
            filled: ArrayQueue::new(slots),
            free,
            snap: snap.min(slot_bytes),
            dropped: AtomicU64::new(0),
            epoch_ns: epoch.0,
            start: epoch.1,
        }
    }

    /// Nanoseconds since the Unix epoch, for the frames of one burst.
    pub(crate) fn now_ns(&self) -> u64 {
        let since = self.start.elapsed().as_nanos();
        self.epoch_ns
            .saturating_add(u64::try_from(since).unwrap_or(u64::MAX))
    }

    /// Captures a frame of `len` bytes at `ts_ns`: `fill` writes its first
    /// bytes (as many as the slice it is given holds, the snap length at
    /// most). Without a free slot, counts a drop.
    pub(crate) fn record(&self, ts_ns: u64, len: usize, fill: impl FnOnce(&mut [u8])) {
        let Some(mut slot) = self.free.pop() else {
            self.drop_one();
            return;
        };
        let n = len.min(self.snap);
        fill(&mut slot.data[..n]);
        slot.ts_ns = ts_ns;
        slot.len = n as u32;
        slot.orig_len = u32::try_from(len).unwrap_or(u32::MAX);
        if let Err(slot) = self.filled.push(slot) {
            // Cannot happen (both rings hold every slot); keep the slot.
            let _ = self.free.push(slot);
            self.drop_one();
        }
    }

    /// Captures `frame` whole (up to the snap length).
    pub(crate) fn record_bytes(&self, ts_ns: u64, frame: &[u8]) {
        self.record(ts_ns, frame.len(), |dst| {
            dst.copy_from_slice(&frame[..dst.len()])
        });
    }

    /// Captures a TCP segment as the worker builds it in parts: `head`
    /// (Ethernet, IPv4 and TCP headers), the bytes `range` of each record
    /// of `payload` (one, or a pack's; read through the record, so
    /// attached payload comes from its region), then `pad` zero bytes.
    pub(crate) fn record_segment<R: RecordBytes>(
        &self,
        ts_ns: u64,
        head: &[u8],
        payload: impl Iterator<Item = (R, Range<usize>)> + Clone,
        pad: usize,
    ) {
        let body: usize = payload.clone().map(|(_, r)| r.len()).sum();
        self.record(ts_ns, head.len() + body + pad, |dst| {
            let h = head.len().min(dst.len());
            dst[..h].copy_from_slice(&head[..h]);
            let mut rest = &mut dst[h..];
            // A pack's records one after another.
            for (rec, range) in payload {
                let b = range.len().min(rest.len());
                let (this, next) = rest.split_at_mut(b);
                rec.copy_to(range.start, this);
                rest = next;
            }
            // Slots are reused: the pad is written, not assumed.
            rest.fill(0);
        });
    }

    fn drop_one(&self) {
        // Only this ring's worker writes the counter: no locked
        // instruction.
        let d = &self.dropped;
        d.store(d.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------
// The tap: the worker's side.
// ---------------------------------------------------------------------

/// A worker's capture point, shared with the control path. See the
/// module documentation.
#[derive(Debug, Default)]
pub struct CaptureTap {
    /// Bumped (under `armed`'s lock) each time a capture starts or stops.
    generation: AtomicU64,
    /// The generation the worker last picked up.
    seen: AtomicU64,
    /// The largest frame the worker's port carries (0 until it starts),
    /// the size of its slots.
    frame_cap: AtomicUsize,
    /// The ring of the running capture.
    armed: Mutex<Option<Arc<Ring>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoned only by a panic while the lock was held; the value is
    // replaced in single statements.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CaptureTap {
    /// Called by the worker once, when it knows its port: slots are made
    /// this large.
    pub(crate) fn set_frame_cap(&self, bytes: usize) {
        self.frame_cap.store(bytes, Ordering::Relaxed);
    }

    fn arm(&self, ring: Option<Arc<Ring>>) -> u64 {
        let mut armed = lock(&self.armed);
        *armed = ring;
        self.generation.fetch_add(1, Ordering::Release) + 1
    }

    fn released(&self, generation: u64) -> bool {
        self.seen.load(Ordering::Acquire) >= generation
    }
}

/// What a worker holds of its tap: the generation it saw and, while a
/// capture runs, its ring.
#[derive(Debug, Default)]
pub(crate) struct TapState {
    generation: u64,
    ring: Option<Arc<Ring>>,
}

impl TapState {
    /// Once per burst: one relaxed load when nothing changed; otherwise
    /// takes (or lets go of) the ring.
    #[inline]
    pub(crate) fn refresh(&mut self, tap: &CaptureTap) {
        if tap.generation.load(Ordering::Relaxed) != self.generation {
            self.pick_up(tap);
        }
    }

    #[cold]
    fn pick_up(&mut self, tap: &CaptureTap) {
        let armed = lock(&tap.armed);
        self.ring = armed.clone();
        self.generation = tap.generation.load(Ordering::Relaxed);
        drop(armed);
        tap.seen.store(self.generation, Ordering::Release);
    }

    /// The running capture's ring, if any.
    #[inline]
    pub(crate) fn ring(&self) -> Option<&Ring> {
        self.ring.as_deref()
    }
}

// ---------------------------------------------------------------------
// The control path's side: start, stop, the writer.
// ---------------------------------------------------------------------

/// What the writer thread returns.
#[derive(Debug)]
struct Written {
    frames: Vec<u64>,
    bytes: u64,
    error: Option<String>,
}

/// A running capture.
#[derive(Debug)]
struct Session {
    path: PathBuf,
    rings: Vec<Arc<Ring>>,
    stop: Arc<AtomicBool>,
    writer: Option<JoinHandle<Written>>,
}

impl Session {
    /// Stops the writer after it has drained every ring; what it wrote.
    fn finish(&mut self) -> Result<CaptureSummary, CaptureError> {
        self.stop.store(true, Ordering::Release);
        let written = self
            .writer
            .take()
            .ok_or_else(|| CaptureError::Thread("already stopped".into()))?
            .join()
            .map_err(|_| CaptureError::Thread("the writer panicked".into()))?;
        if let Some(e) = written.error {
            return Err(CaptureError::Write(self.path.clone(), e));
        }
        Ok(CaptureSummary {
            path: self.path.clone(),
            workers: self
                .rings
                .iter()
                .zip(&written.frames)
                .map(|(r, &captured)| WorkerCapture {
                    captured,
                    dropped: r.dropped.load(Ordering::Relaxed),
                })
                .collect(),
            bytes: written.bytes,
        })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // A dataplane dropped with a capture running: the file is still
        // completed with what the rings hold.
        if self.writer.is_some() {
            let _ = self.finish();
        }
    }
}

/// The capture of one dataplane: at most one runs at a time.
#[derive(Debug, Default)]
pub struct Capture {
    session: Mutex<Option<Session>>,
}

impl Capture {
    /// Creates `path`, arms every tap with a ring and starts the writer.
    pub fn start(
        &self,
        taps: &[&CaptureTap],
        path: &Path,
        opts: &CaptureOptions,
    ) -> Result<(), CaptureError> {
        let mut session = lock(&self.session);
        if session.is_some() {
            return Err(CaptureError::Running);
        }
        if opts.ring_slots == 0 {
            return Err(CaptureError::NoSlots);
        }
        let snaplen = if opts.snaplen == 0 {
            DEFAULT_SNAPLEN
        } else {
            opts.snaplen
        };
        let file = File::create(path)
            .map_err(|e| CaptureError::Create(path.to_path_buf(), e.to_string()))?;
        let writer = Writer::new(LinkType::ETHERNET, snaplen, opts.precision);
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let mut header = Vec::with_capacity(24);
        writer.write_header(&mut header);
        out.write_all(&header)
            .map_err(|e| CaptureError::Create(path.to_path_buf(), e.to_string()))?;
        let epoch_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let epoch = (epoch_ns, std::time::Instant::now());
        let rings: Vec<Arc<Ring>> = taps
            .iter()
            .map(|t| {
                let cap = match t.frame_cap.load(Ordering::Relaxed) {
                    0 => FALLBACK_FRAME,
                    n => n,
                };
                let bytes = cap.min(snaplen as usize);
                Arc::new(Ring::new(opts.ring_slots, bytes, snaplen as usize, epoch))
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let (rings, stop) = (rings.clone(), stop.clone());
            std::thread::Builder::new()
                .name("iwarp-capture".into())
                .spawn(move || write_loop(&rings, out, writer, &stop, header.len() as u64))
                .map_err(|e| CaptureError::Thread(e.to_string()))?
        };
        for (t, r) in taps.iter().zip(&rings) {
            t.arm(Some(r.clone()));
        }
        *session = Some(Session {
            path: path.to_path_buf(),
            rings,
            stop,
            writer: Some(handle),
        });
        Ok(())
    }

    /// Whether a capture runs.
    pub fn running(&self) -> bool {
        lock(&self.session).is_some()
    }

    /// Disarms every tap, waits until each worker has let go of its ring
    /// (calling `pump` meanwhile: a dataplane whose loops the caller runs
    /// runs them there), then lets the writer drain the rings, flush and
    /// end.
    pub fn stop(
        &self,
        taps: &[&CaptureTap],
        mut pump: impl FnMut(),
    ) -> Result<CaptureSummary, CaptureError> {
        let mut session = lock(&self.session).take().ok_or(CaptureError::NotRunning)?;
        let generations: Vec<u64> = taps.iter().map(|t| t.arm(None)).collect();
        let deadline = std::time::Instant::now() + RELEASE_TIMEOUT;
        while !taps.iter().zip(&generations).all(|(t, &g)| t.released(g))
            && std::time::Instant::now() < deadline
        {
            pump();
            std::thread::sleep(Duration::from_micros(200));
        }
        session.finish()
    }
}

/// The writer thread: drains the rings until told to stop and they are
/// empty. A write error is kept (and reported at stop); the rings are
/// drained all the same so the workers never run out of slots for it.
fn write_loop(
    rings: &[Arc<Ring>],
    mut out: BufWriter<File>,
    writer: Writer,
    stop: &AtomicBool,
    mut bytes: u64,
) -> Written {
    let total: usize = rings.iter().map(|r| r.free.capacity()).sum();
    // Frames taken from the rings and not written yet, oldest first.
    let mut pending: Vec<(usize, Box<Slot>)> = Vec::with_capacity(total);
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut frames = vec![0u64; rings.len()];
    let mut error: Option<String> = None;
    loop {
        // Read the flag first: whatever the workers queued before they let
        // go of their rings (which `Capture::stop` waited for) is then
        // found by this drain.
        let stopping = stop.load(Ordering::Acquire);
        let horizon = rings
            .first()
            .map_or(0, |r| r.now_ns().saturating_sub(REORDER_WINDOW_NS));
        let mut took = 0;
        for (w, r) in rings.iter().enumerate() {
            // At most what the ring held when the drain began, so that a
            // busy worker cannot keep the writer on its ring alone.
            for _ in 0..r.filled.len() {
                match r.filled.pop() {
                    Some(s) => pending.push((w, s)),
                    None => break,
                }
                took += 1;
            }
        }
        // Each ring is in order already: the stable sort merges them.
        pending.sort_by_key(|(_, s)| s.ts_ns);
        let ready = if stopping {
            pending.len()
        } else {
            pending.partition_point(|(_, s)| s.ts_ns <= horizon)
        };
        for (w, slot) in pending.drain(..ready) {
            let data = &slot.data[..slot.len as usize];
            if slot.orig_len as usize == data.len() {
                writer.write_record(&mut buf, slot.ts_ns, data);
            } else {
                write_cut_record(&mut buf, &writer, slot.ts_ns, data, slot.orig_len);
            }
            frames[w] += 1;
            // The ring holds every slot: the push finds room.
            let _ = rings[w].free.push(slot);
            if buf.len() >= 1 << 20 {
                flush_buf(&mut out, &mut buf, &mut bytes, &mut error);
            }
        }
        flush_buf(&mut out, &mut buf, &mut bytes, &mut error);
        if stopping {
            break;
        }
        if took == 0 {
            std::thread::sleep(WRITER_NAP);
        }
    }
    if let Err(e) = out.flush() {
        error.get_or_insert(e.to_string());
    }
    Written {
        frames,
        bytes,
        error,
    }
}

/// A record whose frame the snap length cut: the captured bytes, and the
/// frame's length on the wire. The writer takes its original length from
/// what it is given, so the record header is written here in its layout.
fn write_cut_record(out: &mut Vec<u8>, writer: &Writer, ts_ns: u64, data: &[u8], orig_len: u32) {
    let at = out.len();
    writer.write_record(out, ts_ns, data);
    // Bytes 12..16 of the record header: the original length.
    out[at + 12..at + 16].copy_from_slice(&orig_len.to_le_bytes());
}

fn flush_buf(
    out: &mut BufWriter<File>,
    buf: &mut Vec<u8>,
    bytes: &mut u64,
    error: &mut Option<String>,
) {
    if buf.is_empty() {
        return;
    }
    if error.is_none() {
        match out.write_all(buf) {
            Ok(()) => *bytes += buf.len() as u64,
            Err(e) => *error = Some(e.to_string()),
        }
    }
    buf.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_kit::Reader;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("iwarp-capture-{}-{name}.pcap", std::process::id()))
    }

    #[test]
    fn frames_from_two_taps_land_in_order_with_cut_ones_marked() {
        let taps = [CaptureTap::default(), CaptureTap::default()];
        taps[0].set_frame_cap(1518);
        let refs: Vec<&CaptureTap> = taps.iter().collect();
        let path = temp("order");
        let cap = Capture::default();
        let opts = CaptureOptions {
            snaplen: 100,
            ring_slots: 8,
            ..CaptureOptions::default()
        };
        cap.start(&refs, &path, &opts).unwrap();
        assert_eq!(cap.start(&refs, &path, &opts), Err(CaptureError::Running));
        let mut states = [TapState::default(), TapState::default()];
        for (s, t) in states.iter_mut().zip(&taps) {
            s.refresh(t);
        }
        let (r0, r1) = (states[0].ring().unwrap(), states[1].ring().unwrap());
        r1.record_bytes(20, &[1; 60]);
        r0.record_bytes(10, &[0; 60]);
        r0.record_bytes(30, &[2; 300]);
        let summary = cap.stop(&refs, || {
            for (s, t) in states.iter_mut().zip(&taps) {
                s.refresh(t);
            }
        });
        let summary = summary.unwrap();
        assert!(states.iter().all(|s| s.ring().is_none()));
        assert_eq!(summary.captured(), 3);
        assert_eq!(summary.dropped(), 0);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(summary.bytes, bytes.len() as u64);
        let recs = Reader::read_all(&bytes).unwrap();
        let mut got: Vec<(u64, u8, usize, u32)> = recs
            .iter()
            .map(|r| (r.timestamp_ns.unwrap(), r.data[0], r.data.len(), r.orig_len))
            .collect();
        // The writer may have drained one ring before the other was
        // filled; within one drain it orders by timestamp.
        got.sort_unstable();
        assert_eq!(
            got,
            vec![(10, 0, 60, 60), (20, 1, 60, 60), (30, 2, 100, 300)]
        );
        assert!(recs.iter().any(|r| r.is_truncated()));
        let _ = std::fs::remove_file(&path);
        assert_eq!(cap.stop(&refs, || {}), Err(CaptureError::NotRunning));
    }

    #[test]
    fn a_full_ring_counts_drops_instead_of_waiting() {
        let tap = CaptureTap::default();
        tap.set_frame_cap(64);
        let path = temp("drops");
        let cap = Capture::default();
        let opts = CaptureOptions {
            ring_slots: 4,
            ..CaptureOptions::default()
        };
        let mut state = TapState::default();
        // The writer may drain meanwhile; with four slots and no pause,
        // 10 000 frames overrun it.
        cap.start(&[&tap], &path, &opts).unwrap();
        state.refresh(&tap);
        let ring = state.ring().unwrap();
        for i in 0..10_000u64 {
            ring.record_bytes(i, &[7; 64]);
        }
        let s = cap.stop(&[&tap], || state.refresh(&tap)).unwrap();
        assert_eq!(s.captured() + s.dropped(), 10_000);
        assert!(s.dropped() > 0, "{s:?}");
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(Reader::read_all(&bytes).unwrap().len() as u64, s.captured());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn an_uncreatable_file_is_a_clear_error() {
        let tap = CaptureTap::default();
        let cap = Capture::default();
        let path = Path::new("/nonexistent-dir/x.pcap");
        let e = cap
            .start(&[&tap], path, &CaptureOptions::default())
            .unwrap_err();
        assert!(matches!(e, CaptureError::Create(..)), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("cannot create capture file /nonexistent-dir/x.pcap: "),
            "{e}"
        );
        assert!(!cap.running());
        let zero = CaptureOptions {
            ring_slots: 0,
            ..CaptureOptions::default()
        };
        assert_eq!(
            cap.start(&[&tap], &temp("zero"), &zero),
            Err(CaptureError::NoSlots)
        );
    }
}
