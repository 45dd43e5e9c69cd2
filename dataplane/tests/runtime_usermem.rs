//! Memory the application owns, registered with the dataplane: a vector
//! handed over with `Region::from_vec` (and given back intact by
//! `Region::into_inner`) and a file mapping of a memfd handed over with
//! `Region::from_raw_parts` (released through its callback), carrying RDMA
//! WRITE, READ and SEND in both directions between two dataplanes over an
//! in-memory link, every byte verified; remote accesses beyond a
//! registration end in RFC 5040's Terminate with nothing written outside;
//! and shared receive queues are given back with `destroy_srq`.

mod runtime_common;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dataplane::api::{
    Access, Dataplane, DriveMode, Error, MemoryRegistration, PostError, ProtectionDomain,
    QpOptions, RecvWr, Region, SendWr, SgeList, TerminateCause, WcOpcode, WcStatus,
};
use rdmap::verbs::VerbsError;
use runtime_common::*;

/// Bytes before and after each registration, not page-aligned so that
/// registrations start anywhere in a word and a page.
const GUARD: usize = 1003;
const CANARY: u8 = 0xa5;
const SIZES: [usize; 4] = [1, 13, 4097, 100_003];

fn rw() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
}

/// A memfd of `len` bytes mapped shared, as a region; the callback unmaps
/// it (and counts) while the file stays open for the test to read back.
struct Mapped {
    fd: libc::c_int,
    len: usize,
    released: Arc<AtomicUsize>,
}

impl Mapped {
    fn new(len: usize, fill: u8) -> (Mapped, Region) {
        Mapped::inset(len, 0, fill)
    }

    /// A file of `len` bytes of `fill`, mapped whole; the region leaves
    /// out `inset` bytes at each end of the mapping.
    fn inset(len: usize, inset: usize, fill: u8) -> (Mapped, Region) {
        // SAFETY: a new anonymous file; the name is a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"iwarp-usermem".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is ours.
        assert_eq!(unsafe { libc::ftruncate(fd, len as libc::off_t) }, 0);
        let bytes = vec![fill; len];
        // SAFETY: writes `len` bytes from `bytes` into the file.
        let n = unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), len, 0) };
        assert_eq!(n, len as isize);
        // SAFETY: a new shared mapping of the whole file, ours until the
        // release callback unmaps it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        let released = Arc::new(AtomicUsize::new(0));
        let rel = released.clone();
        let addr = p as usize;
        let release = move || {
            // SAFETY: the mapping made above, no longer referred to.
            unsafe { libc::munmap(addr as *mut libc::c_void, len) };
            rel.fetch_add(1, Ordering::SeqCst);
        };
        let ptr = NonNull::new(p.cast::<u8>().wrapping_add(inset)).unwrap();
        // SAFETY: the mapping stays mapped (and the file is never
        // truncated) until the callback, which unmaps it; the test reaches
        // it only through the region until then.
        let region = unsafe { Region::from_raw_parts(ptr, len - 2 * inset, release) }
            .expect("region over the mapping");
        (Mapped { fd, len, released }, region)
    }

    /// The file's bytes, read with `pread` once the mapping is released.
    fn contents(&self) -> Vec<u8> {
        assert_eq!(self.released.load(Ordering::SeqCst), 1, "released once");
        let mut v = vec![0u8; self.len];
        // SAFETY: reads into `v`, which is `len` bytes long.
        let n = unsafe { libc::pread(self.fd, v.as_mut_ptr().cast(), self.len, 0) };
        assert_eq!(n, self.len as isize);
        v
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours.
        unsafe { libc::close(self.fd) };
    }
}

/// Application memory of one kind, `len` bytes of canary.
enum Mem {
    Vec,
    Mapped(Mapped),
}

fn make(kind: &str, len: usize) -> (Mem, Region) {
    match kind {
        "vec" => (
            Mem::Vec,
            Region::from_vec(vec![CANARY; len]).expect("region over a vector"),
        ),
        _ => {
            let (m, r) = Mapped::new(len, CANARY);
            (Mem::Mapped(m), r)
        }
    }
}

/// The memory back once the dataplane lets go of it: the vector from
/// `into_inner` (retried while frames still hold the region), or the
/// file's bytes after the release callback.
fn give_back(p: &Pair, mem: Mem, region: Region) -> Vec<u8> {
    let mut region = Some(region);
    match mem {
        Mem::Vec => p.until("the vector back", |_| {
            match region.take().expect("held").into_inner() {
                Ok(v) => Some(v),
                Err(r) => {
                    region = Some(r);
                    None
                }
            }
        }),
        Mem::Mapped(m) => {
            let r = region.take().expect("held");
            p.until("the mapping released", |_| (r.handles() == 1).then_some(()));
            drop(r);
            m.contents()
        }
    }
}

/// Checks the memory given back: the registered span holds `data`, every
/// byte around it is still the canary.
fn check_back(what: &str, bytes: &[u8], data: &[u8]) {
    let len = data.len();
    assert_eq!(bytes.len(), len + 2 * GUARD, "{what}: length");
    assert!(&bytes[GUARD..GUARD + len] == data, "{what}: data differs");
    assert!(
        bytes[..GUARD]
            .iter()
            .chain(&bytes[GUARD + len..])
            .all(|&b| b == CANARY),
        "{what}: bytes outside the registration changed"
    );
}

/// `op` of `len` bytes from `src_kind` memory into `dst_kind` memory (a
/// initiates; a Read moves b's bytes into a's), both registered with
/// `GUARD` bytes of canary around them; the memory is given back and
/// checked. Returns the bytes verified.
#[allow(clippy::too_many_arguments, reason = "one test step, spelled out")]
fn exchange_user(
    p: &Pair,
    a: &mut End,
    b: &mut End,
    src_kind: &str,
    dst_kind: &str,
    op: Op,
    len: usize,
    id: u64,
) -> usize {
    let (src_dp, dst_dp, src_pd, dst_pd): (&Dataplane, &Dataplane, ProtectionDomain, _) = match op {
        Op::Read => (&p.b, &p.a, b.pd, a.pd),
        _ => (&p.a, &p.b, a.pd, b.pd),
    };
    let (smem, src) = make(src_kind, len + 2 * GUARD);
    let (dmem, dst) = make(dst_kind, len + 2 * GUARD);
    let data = pattern(id, len);
    src.write(GUARD, &data).unwrap();
    let smr = src_dp.reg_mr(src_pd, &src, GUARD, len, rw()).unwrap();
    let dmr = dst_dp.reg_mr(dst_pd, &dst, GUARD, len, rw()).unwrap();
    assert_eq!(smr.addr(), src.addr() + GUARD as u64);
    let len32 = len as u32;
    match op {
        Op::Write => {
            let wr = SendWr::write(
                id,
                SgeList::single(smr.sge(0, len32)),
                dmr.addr(),
                dmr.rkey(),
            );
            a.qp.post_send(&wr).unwrap();
        }
        Op::Read => {
            let wr = SendWr::read(id, dmr.sge(0, len32), smr.addr(), smr.rkey());
            a.qp.post_send(&wr).unwrap();
        }
        Op::Send => {
            let rwr = RecvWr {
                wr_id: id,
                sges: SgeList::single(dmr.sge(0, len32)),
            };
            b.qp.post_recv(&rwr).unwrap();
            let wr = SendWr::send(id, SgeList::single(smr.sge(0, len32)));
            a.qp.post_send(&wr).unwrap();
        }
    }
    let wc = wait_wc(p, a, id);
    assert_eq!(
        (wc.status, wc.byte_len),
        (WcStatus::Success, len32),
        "{op:?} {len}: {wc:?}"
    );
    if op == Op::Send {
        let rc = wait_wc(p, b, id);
        assert_eq!(
            (rc.status, rc.opcode, rc.byte_len),
            (WcStatus::Success, WcOpcode::Recv, len32)
        );
    }
    if op == Op::Write {
        wait_placed(p, &format!("Write of {len} bytes"), &data, || {
            dst.to_vec(GUARD, len).unwrap()
        });
    }
    assert!(
        dst.to_vec(GUARD, len).unwrap() == data,
        "{op:?} {len}: placed"
    );
    src_dp.dereg_mr(&smr).unwrap();
    dst_dp.dereg_mr(&dmr).unwrap();
    drop((smr, dmr));
    let what = format!("{op:?} of {len} B, {src_kind} -> {dst_kind}");
    check_back(&format!("{what}: source"), &give_back(p, smem, src), &data);
    check_back(&format!("{what}: sink"), &give_back(p, dmem, dst), &data);
    len
}

/// Every operation and size between vector-backed and mapped memory.
fn write_read_send(mode: DriveMode, workers: usize, label: &str) {
    let p = Pair::new(&PairOptions {
        workers,
        mode,
        ..PairOptions::default()
    });
    let (mut a, mut b) = connect(&p);
    let mut id = 1;
    for (src, dst) in [("vec", "vec"), ("vec", "mapped"), ("mapped", "vec")] {
        for op in [Op::Write, Op::Read, Op::Send] {
            let mut total = 0;
            for len in SIZES {
                total += exchange_user(&p, &mut a, &mut b, src, dst, op, len, id);
                id += 1;
            }
            println!(
                "{label}: {op:?} {src} -> {dst}: sizes {SIZES:?}, {total} bytes verified, memory \
                 given back with every byte around the registrations unchanged"
            );
        }
    }
}

#[test]
fn vec_and_mapped_regions_carry_write_read_send_inline() {
    write_read_send(DriveMode::Inline, 1, "inline");
}

#[test]
fn vec_and_mapped_regions_carry_write_read_send_threads() {
    write_read_send(DriveMode::Threads, 2, "two worker threads");
}

/// a Writes `n` bytes of `mrs.0` to `to`, outside b's registration
/// `mrs.1`: both sides report the DDP base-or-bounds Terminate; then both
/// registrations are given back.
fn rejected_write(
    p: &Pair,
    ea: &mut End,
    eb: &End,
    mrs: (MemoryRegistration, MemoryRegistration),
    n: u32,
    to: u64,
) {
    let (smr, dmr) = mrs;
    let wr = SendWr::write(1, SgeList::single(smr.sge(0, n)), to, dmr.rkey());
    ea.qp.post_send(&wr).unwrap();
    expect_terminated(
        p,
        [ea.qp.num(), eb.qp.num()],
        TerminateCause::DDP_TAGGED_BASE_BOUNDS,
    );
    // (A Write completes when TCP has it acknowledged: the Terminate may
    // come after its completion.)
    let wc = wait_wc(p, ea, 1);
    assert!(
        matches!(wc.status, WcStatus::Success | WcStatus::RemoteAccessError),
        "{wc:?}"
    );
    p.a.dereg_mr(&smr).unwrap();
    p.b.dereg_mr(&dmr).unwrap();
}

#[test]
fn remote_access_beyond_a_registration_ends_in_a_terminate() {
    let p = Pair::new(&PairOptions::default());
    p.b.listen(PORT, 16).unwrap();
    let len = 10_000;
    for kind in ["vec", "mapped"] {
        // A Write that runs 8 bytes past the end of b's registration, and
        // one that starts before it: DDP's base-or-bounds Terminate, not a
        // byte placed (not even the part inside).
        for (label, to_off, n) in [
            ("past the end of", len - 56, 64),
            ("before the start of", 0, 64),
        ] {
            let (mut ea, eb) = open_conn(&p, true);
            let (smem, src) = make("vec", len + 2 * GUARD);
            let (dmem, dst) = make(kind, len + 2 * GUARD);
            let fresh = pattern(7, len + 2 * GUARD);
            src.write(0, &fresh).unwrap();
            let smr = p.a.reg_mr(ea.pd, &src, GUARD, len, rw()).unwrap();
            let dmr = p.b.reg_mr(eb.pd, &dst, GUARD, len, rw()).unwrap();
            let to = if label == "before the start of" {
                dmr.addr() - 8
            } else {
                dmr.addr() + to_off as u64
            };
            rejected_write(&p, &mut ea, &eb, (smr, dmr), n, to);
            let back = give_back(&p, dmem, dst);
            assert!(
                back.iter().all(|&b| b == CANARY),
                "{kind}: a Write {label} changed memory"
            );
            drop(give_back(&p, smem, src));
            println!(
                "{kind}: Write of {n} B {label} the registration -> Terminate (DDP base or \
                 bounds) on both sides; all {} bytes unchanged",
                back.len()
            );
        }
        // A Read of b's registration that runs past its end: RDMAP's
        // Terminate, no Read Response from beyond it.
        let (mut ea, eb) = open_conn(&p, true);
        let (smem, src) = make(kind, len + 2 * GUARD);
        let (dmem, sink) = make("vec", len + 2 * GUARD);
        let secret = pattern(9, len + 2 * GUARD);
        src.write(0, &secret).unwrap();
        let smr = p.b.reg_mr(eb.pd, &src, GUARD, len, rw()).unwrap();
        let dmr = p.a.reg_mr(ea.pd, &sink, GUARD, len, rw()).unwrap();
        let wr = SendWr::read(2, dmr.sge(0, 64), smr.addr() + len as u64 - 32, smr.rkey());
        ea.qp.post_send(&wr).unwrap();
        let wc = wait_wc(&p, &mut ea, 2);
        assert_eq!(wc.status, WcStatus::RemoteAccessError, "{wc:?}");
        expect_terminated(
            &p,
            [ea.qp.num(), eb.qp.num()],
            TerminateCause::RDMAP_PROT_BASE_BOUNDS,
        );
        p.a.dereg_mr(&dmr).unwrap();
        p.b.dereg_mr(&smr).unwrap();
        drop((smr, dmr));
        let got = give_back(&p, dmem, sink);
        assert!(
            got.iter().all(|&b| b == CANARY),
            "{kind}: nothing placed from a refused Read"
        );
        assert!(
            give_back(&p, smem, src) == secret,
            "{kind}: source unchanged"
        );
        println!(
            "{kind}: Read of 64 B past the registration -> RemoteAccessError and Terminate \
             (RDMAP base or bounds); sink unchanged"
        );
    }
}

#[test]
fn remote_write_beyond_a_mapped_region_touches_nothing_around_it() {
    let p = Pair::new(&PairOptions::default());
    p.b.listen(PORT, 16).unwrap();
    let len = 3 * 4096;
    for (label, past_end) in [("past the end of", true), ("before the start of", false)] {
        let (mut ea, eb) = open_conn(&p, true);
        let (smem, src) = make("vec", 4096);
        src.write(0, &pattern(3, 4096)).unwrap();
        // The region is the mapping less GUARD bytes at each end, and the
        // registration is the whole region: the bytes around it are mapped
        // memory the dataplane must never write.
        let (m, dst) = Mapped::inset(len, GUARD, CANARY);
        let rlen = dst.len();
        let smr = p.a.reg_mr(ea.pd, &src, 0, 4096, rw()).unwrap();
        let dmr = p.b.reg_mr(eb.pd, &dst, 0, rlen, rw()).unwrap();
        let to = if past_end {
            dmr.addr() + rlen as u64 - 100
        } else {
            dmr.addr() - 100
        };
        rejected_write(&p, &mut ea, &eb, (smr, dmr), 200, to);
        let file = give_back(&p, Mem::Mapped(m), dst);
        assert_eq!(file.len(), len);
        assert!(
            file.iter().all(|&b| b == CANARY),
            "a Write {label} the region changed the mapping"
        );
        drop(give_back(&p, smem, src));
        println!(
            "mapped region of {rlen} B inside a {len} B mapping, registered whole: Write of \
             200 B {label} it -> Terminate (DDP base or bounds); all {len} bytes of the \
             mapping unchanged"
        );
    }
}

#[test]
fn shared_receive_queues_are_destroyed_once_unused() {
    let p = Pair::new(&PairOptions::default());
    let dp = &p.a;
    let cq = dp.create_cq(16).unwrap();
    let pd = dp.alloc_pd().unwrap();
    let srq = dp.create_srq(pd, 16, 1).unwrap();
    let qp = dp
        .create_qp_with_srq(pd, &cq, &cq, Some(&srq), QpOptions::default())
        .unwrap();
    let busy = Err(Error::Verbs(VerbsError::Busy));
    assert_eq!(dp.destroy_srq(&srq), busy, "a queue pair uses it");
    assert_eq!(
        dp.dealloc_pd(pd),
        busy,
        "the queue and the pair hold the domain"
    );
    drop(qp);
    let region = Region::from_vec(vec![0; 64]).unwrap();
    let mr = dp.reg_mr(pd, &region, 0, 64, rw()).unwrap();
    let recv = RecvWr {
        wr_id: 1,
        sges: SgeList::single(mr.sge(0, 64)),
    };
    srq.post_recv(&recv).unwrap();
    dp.destroy_srq(&srq).unwrap();
    assert_eq!(srq.post_recv(&recv), Err(PostError::InvalidState));
    assert!(srq.is_empty(), "posted receives dropped");
    let gone = Err(Error::Verbs(VerbsError::InvalidSrq));
    assert_eq!(dp.destroy_srq(&srq), gone, "destroyed once");
    assert!(matches!(
        dp.create_qp_with_srq(pd, &cq, &cq, Some(&srq), QpOptions::default()),
        Err(Error::Verbs(VerbsError::InvalidSrq))
    ));
    dp.dereg_mr(&mr).unwrap();
    drop(mr);
    dp.dealloc_pd(pd).unwrap();

    // Many more than the device's table holds (256 by default), each used
    // by a queue pair and destroyed after: none leaks.
    let rounds = 1000;
    let pd = dp.alloc_pd().unwrap();
    for i in 0..rounds {
        let srq = dp
            .create_srq(pd, 4, 1)
            .unwrap_or_else(|e| panic!("round {i}: queues leaked: {e}"));
        let qp = dp
            .create_qp_with_srq(pd, &cq, &cq, Some(&srq), QpOptions::default())
            .unwrap();
        assert_eq!(dp.destroy_srq(&srq), busy);
        drop(qp);
        dp.destroy_srq(&srq).unwrap();
    }
    dp.dealloc_pd(pd).unwrap();
    assert_eq!(region.into_inner().unwrap(), vec![0; 64]);
    println!(
        "destroy_srq refused while a queue pair used the queue, accepted after; {rounds} \
         queues created and destroyed"
    );
}
