//! Memory registered with DPDK: regions registered with a dataplane over a
//! `net_ring` pair are registered with EAL (DPDK's own lookup finds them as
//! external memory, with the IOVAs the mode calls for), carry RDMA WRITE,
//! READ and SEND with every byte verified, and are unregistered once
//! deregistered and dropped.
//!
//! Two variants, each with an EAL of its own:
//! - heap regions with EAL on `--no-huge` (IOVA-as-VA), in this process;
//! - hugepage-backed regions with EAL on hugepages (`--in-memory`), in a
//!   child process: the test reserves 2 MiB pages (root only; the previous
//!   count is restored), and as root without an IOMMU EAL picks
//!   IOVA-as-PA, so the regions are registered with their physical
//!   addresses. Without root or free hugepages it prints why and skips,
//!   unless `IWARP_REQUIRE_ROOT_TESTS=1`.
//!
//! Both check that nothing is left in the EAL runtime directory or in
//! `/dev/hugepages` afterwards.

mod dpdk_common;
mod runtime_common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use dataplane::api::{Access, RecvWr, Region, SendWr, SgeList, WcOpcode, WcStatus};
use dataplane::dpdk_link::{start_eal, DpdkLinkStats};
use dpdk_bindings::{iova_of, is_external_memory, phys_addr, Eal, ExtMem};
use dpdk_common::*;
use runtime_common::*;

const SIZES: [usize; 5] = [1, 4097, 100_003, 1 << 20, 4 << 20];
const GUARD: usize = 4096;
const CHILD_ENV: &str = "IWARP_EXTMEM_CHILD";
/// 2 MiB pages the hugepage variant reserves on top of what is there.
const HUGEPAGES: u64 = 192;

/// Checks that DPDK knows `region` as registered external memory, with
/// the IOVA of the mode (the address, or the page's physical address).
fn assert_registered(eal: &Eal, region: &Region) {
    let reg = region
        .dpdk_registration()
        .expect("the region was registered with EAL");
    assert_eq!(reg.page_size(), region.page_size());
    assert_eq!(reg.addr().as_ptr().cast_const(), region.as_ptr());
    for at in [0, region.len() / 2, region.len() - 1] {
        let ptr = region.as_ptr().wrapping_add(at);
        assert!(
            is_external_memory(eal, ptr),
            "EAL finds byte {at} in an external memory segment list"
        );
        let iova = iova_of(eal, ptr).expect("EAL has an IOVA for it");
        if eal.iova_is_va() {
            assert_eq!(iova, ptr as u64, "IOVA-as-VA");
        } else {
            let pa = phys_addr(ptr).expect("physical address (root)");
            assert_eq!(iova, pa, "IOVA-as-PA: the page's physical address");
        }
    }
}

/// Sources whose payload crossed a page boundary where the IOVAs are not
/// adjacent: their FPDUs must have been split there.
static GAPS_CROSSED: AtomicU64 = AtomicU64::new(0);

/// Whether `[offset, offset + len)` of `region` spans two pages whose
/// registered IOVAs are not adjacent.
fn crosses_a_gap(region: &Region, offset: usize, len: usize) -> bool {
    let Some(reg) = region.dpdk_registration() else {
        return false;
    };
    let ps = reg.page_size();
    let (first, last) = (offset / ps, (offset + len - 1) / ps);
    reg.iovas()[first..=last]
        .windows(2)
        .any(|w| w[1] != w[0].wrapping_add(ps as u64))
}

/// Runs `op` of `len` bytes between regions made by `alloc`, both
/// registered with DPDK while it runs (checked when `registered`), the
/// bytes verified; then deregisters and drops them and waits until EAL no
/// longer knows them. Returns the bytes verified.
#[allow(clippy::too_many_arguments, reason = "one test step, spelled out")]
fn exchange_on(
    eal: &Eal,
    p: &Pair,
    a: &mut End,
    b: &mut End,
    alloc: fn(usize) -> Region,
    registered: bool,
    op: Op,
    len: usize,
    id: u64,
) -> usize {
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (src_dp, dst_dp, src_pd, dst_pd) = match op {
        Op::Read => (&p.b, &p.a, b.pd, a.pd),
        _ => (&p.a, &p.b, a.pd, b.pd),
    };
    let src = alloc(len + 2 * GUARD);
    let dst = alloc(len + 2 * GUARD);
    let smr = src_dp.reg_mr(src_pd, &src, GUARD, len, rw).unwrap();
    let dmr = dst_dp.reg_mr(dst_pd, &dst, GUARD, len, rw).unwrap();
    if registered {
        assert_registered(eal, &src);
        assert_registered(eal, &dst);
        if crosses_a_gap(&src, GUARD, len) {
            GAPS_CROSSED.fetch_add(1, Ordering::Relaxed);
        }
    } else {
        assert!(src.dpdk_registration().is_none() && dst.dpdk_registration().is_none());
        assert!(!is_external_memory(eal, src.as_ptr()));
    }
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u64 * 131 + id * 7 + (i as u64 >> 12)) as u8)
        .collect();
    src.write(GUARD, &data).unwrap();
    dst.fill(0, dst.len(), 0xa5).unwrap();
    dst.fill(GUARD, len, 0).unwrap();
    let n = len as u32;
    match op {
        Op::Write => {
            let wr = SendWr::write(id, SgeList::single(smr.sge(0, n)), dmr.addr(), dmr.rkey());
            a.qp.post_send(&wr).unwrap();
        }
        Op::Read => {
            let wr = SendWr::read(id, dmr.sge(0, n), smr.addr(), smr.rkey());
            a.qp.post_send(&wr).unwrap();
        }
        Op::Send => {
            let rwr = RecvWr {
                wr_id: id,
                sges: SgeList::single(dmr.sge(0, n)),
            };
            b.qp.post_recv(&rwr).unwrap();
            a.qp.post_send(&SendWr::send(id, SgeList::single(smr.sge(0, n))))
                .unwrap();
        }
    }
    let wc = wait_wc(p, a, id);
    assert_eq!(
        (wc.status, wc.byte_len),
        (WcStatus::Success, n),
        "{op:?} {len}"
    );
    if op == Op::Send {
        let rc = wait_wc(p, b, id);
        assert_eq!(
            (rc.status, rc.opcode, rc.byte_len),
            (WcStatus::Success, WcOpcode::Recv, n)
        );
    }
    if op == Op::Write {
        wait_placed(p, &format!("Write of {len} bytes"), &data, || {
            dst.to_vec(GUARD, len).unwrap()
        });
    }
    assert!(
        dst.to_vec(GUARD, len).unwrap() == data,
        "{op:?} of {len} bytes: data differs"
    );
    let before = dst.to_vec(0, GUARD).unwrap();
    let after = dst.to_vec(GUARD + len, GUARD).unwrap();
    assert!(
        before.iter().chain(&after).all(|&x| x == 0xa5),
        "{op:?} of {len} bytes: wrote outside the span"
    );
    src_dp.dereg_mr(&smr).unwrap();
    dst_dp.dereg_mr(&dmr).unwrap();
    let addrs = [src.as_ptr() as usize, dst.as_ptr() as usize];
    drop((smr, dmr, src, dst));
    // The workers drop their handles at deregistration and the queues
    // theirs once the driver freed the last mbuf: then the storage goes,
    // and with it the registration.
    let start = Instant::now();
    while addrs
        .iter()
        .any(|&a| is_external_memory(eal, a as *const u8))
    {
        assert!(
            start.elapsed() < PATIENCE,
            "{op:?} {len}: a registration outlived its region"
        );
        p.pump();
    }
    len
}

/// The exchange of every size and operation over one connection;
/// returns the bytes verified.
fn run_all(
    eal: &Eal,
    p: &Pair,
    ends: &mut (End, End),
    alloc: fn(usize) -> Region,
    registered: bool,
    tag: &str,
) -> usize {
    let (a, b) = ends;
    let mut total = 0;
    for op in [Op::Write, Op::Read, Op::Send] {
        for len in SIZES {
            let id = a.seen.len() as u64 + 1000;
            let n = exchange_on(eal, p, a, b, alloc, registered, op, len, id);
            println!("{tag}: {op:?} {len} B: {n} bytes verified");
            total += n;
        }
    }
    total
}

fn heap(len: usize) -> Region {
    Region::new(len).unwrap()
}

fn huge(len: usize) -> Region {
    Region::new_hugepage(len).expect("hugepages reserved by the parent")
}

fn print_stats(tag: &str, s: &DpdkLinkStats) {
    println!(
        "{tag}: {} regions registered with EAL, {} DMA-mapped, {} mappings unsupported, \
         {} left unregistered (copied), {} registrations failed; {} payloads attached, \
         {} copied, {} split at a page boundary",
        s.mem_registered.load(Ordering::Relaxed),
        s.mem_dma_mapped.load(Ordering::Relaxed),
        s.mem_dma_unsupported.load(Ordering::Relaxed),
        s.mem_not_registered.load(Ordering::Relaxed),
        s.mem_register_failed.load(Ordering::Relaxed),
        s.tx_attached.load(Ordering::Relaxed),
        s.tx_copied.load(Ordering::Relaxed),
        s.tx_split.load(Ordering::Relaxed),
    );
}

/// EAL's files for this run under the runtime directory whose names
/// mention external memory (its segment arrays, without `--in-memory`).
fn extmem_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("extmem"))
            .count()
    })
}

#[test]
fn registered_heap_regions_over_net_ring_no_hugepages() {
    let (guard, eal) = start("dpdk-extmem", 256);
    assert_eq!(ExtMem::live(), 0);
    {
        let (p, sa, sb) = ring_pair(&eal, 1500, 1);
        // A registration is visible in EAL's runtime directory too, and
        // gone with it.
        let r = Region::new(3 * 4096).unwrap();
        let pd = p.a.alloc_pd().unwrap();
        let mr = p.a.reg_mr(pd, &r, 0, r.len(), Access::LOCAL_WRITE).unwrap();
        assert_registered(&eal, &r);
        assert_eq!(ExtMem::live(), 1);
        let files = extmem_files(&guard.0);
        p.a.dereg_mr(&mr).unwrap();
        drop((mr, r));
        assert_eq!(ExtMem::live(), 0, "unregistered when the region went");
        let left = extmem_files(&guard.0);
        println!("no-huge: external memory files in the runtime directory: {files} registered, {left} after");
        assert_eq!(left, 0);

        let mut ends = connect(&p);
        let total = run_all(&eal, &p, &mut ends, heap, true, "no-huge");
        println!("no-huge: {total} bytes verified in all");

        // EAL has a fixed number of memory segment lists (128): past them
        // registration fails, and on virtual devices under IOVA-as-VA the
        // region is attached by address as without registration.
        let many: Vec<_> = (0..140)
            .map(|_| {
                let r = Region::new(4096).unwrap();
                let mr = p.a.reg_mr(pd, &r, 0, 4096, Access::LOCAL_WRITE).unwrap();
                (r, mr)
            })
            .collect();
        let live = ExtMem::live();
        let failed = sa.mem_register_failed.load(Ordering::Relaxed);
        println!("no-huge: 140 more regions: {live} registered with EAL, {failed} not");
        assert!(failed > 0 && live < 140, "EAL's segment lists ran out");
        let (a, b) = &mut ends;
        let n = exchange_on(&eal, &p, a, b, heap, false, Op::Write, 1 << 20, 1);
        println!("no-huge: Write of {n} B from unregistered memory verified");
        for (_, mr) in &many {
            p.a.dereg_mr(mr).unwrap();
        }
        drop(many);
        assert_eq!(ExtMem::live(), 0);
        p.a.disconnect(&ends.0.qp, true).unwrap();
        print_stats("no-huge a", &sa);
        print_stats("no-huge b", &sb);
        let registered =
            sa.mem_registered.load(Ordering::Relaxed) + sb.mem_registered.load(Ordering::Relaxed);
        assert!(registered > 2 * 3 * SIZES.len() as u64);
        assert!(sa.tx_attached.load(Ordering::Relaxed) > 1000);
        drop(p);
    }
    assert_eq!(ExtMem::live(), 0, "no registration outlives its region");
    drop(eal);
    assert_clean(&guard);
}

/// The 4 KiB pages `[ptr, ptr + len)` touches.
fn pages_of(ptr: *const u8, len: usize) -> std::ops::RangeInclusive<usize> {
    let a = ptr as usize;
    a / 4096..=(a + len - 1) / 4096
}

/// Two vectors of `len` bytes whose memory shares a page (small
/// allocations from the heap sit next to each other), each filled with
/// its own byte.
fn vectors_sharing_a_page(len: usize) -> (Vec<u8>, Vec<u8>) {
    let mut spare = Vec::new();
    for _ in 0..256 {
        let x = vec![0x11u8; len];
        let y = vec![0x22u8; len];
        let (px, py) = (pages_of(x.as_ptr(), len), pages_of(y.as_ptr(), len));
        if px.contains(py.start()) || py.contains(px.start()) {
            return (x, y);
        }
        spare.push((x, y));
    }
    panic!("no two heap vectors of {len} bytes shared a page in 256 tries");
}

/// Writes the bytes of `src` (registered as `smr` on a) into b's `sink`
/// and checks them.
fn write_and_check(
    p: &Pair,
    a: &mut End,
    src: &dataplane::api::MemoryRegistration,
    sink: &dataplane::api::MemoryRegistration,
    id: u64,
) -> usize {
    let n = src.len() as u32;
    let want = src.region().to_vec(src.offset(), n as usize).unwrap();
    // The Write completes on b's ACK, which b may send before it places
    // the FPDUs that segment carried: only a sink where every byte must
    // change tells that all of them landed (a sink still holding the
    // previous Write's bytes matched once the first FPDU was in).
    let blank = (0..=u8::MAX)
        .find(|v| !want.contains(v))
        .expect("a byte value the source lacks");
    sink.region()
        .fill(sink.offset(), n as usize, blank)
        .unwrap();
    let wr = SendWr::write(id, SgeList::single(src.sge(0, n)), sink.addr(), sink.rkey());
    a.qp.post_send(&wr).unwrap();
    let wc = wait_wc(p, a, id);
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, n), "{wc:?}");
    wait_placed(p, &format!("Write {id}"), &want, || {
        sink.region().to_vec(sink.offset(), n as usize).unwrap()
    });
    let got = sink.region().to_vec(sink.offset(), n as usize).unwrap();
    assert!(got == want, "Write {id}: data differs");
    n as usize
}

#[test]
fn vector_regions_sharing_a_page_over_net_ring() {
    let (guard, eal) = start("dpdk-extmem-vec", 256);
    assert_eq!(ExtMem::live(), 0);
    {
        let (p, sa, _sb) = ring_pair(&eal, 1500, 1);
        let (mut a, b) = connect(&p);
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let len = 3000;
        let sink = Region::new(len).unwrap();
        let smr = p.b.reg_mr(b.pd, &sink, 0, len, rw).unwrap();
        let base = ExtMem::live();

        let (x, y) = vectors_sharing_a_page(len);
        let (px, py) = (pages_of(x.as_ptr(), len), pages_of(y.as_ptr(), len));
        let pages: std::collections::BTreeSet<usize> = px.clone().chain(py.clone()).collect();
        let (xv, yv) = (x.clone(), y.clone());
        let rx = Region::from_vec(x).unwrap();
        let ry = Region::from_vec(y).unwrap();
        let mx = p.a.reg_mr(a.pd, &rx, 0, len, rw).unwrap();
        let my = p.a.reg_mr(a.pd, &ry, 0, len, rw).unwrap();
        // Both registered, the shared page once: each page touched is one
        // registration of its own (neither vector covers a whole page).
        assert_eq!(
            ExtMem::live() - base,
            pages.len(),
            "one registration per page"
        );
        for r in [&rx, &ry] {
            assert!(r.dpdk_registrations().is_some(), "registered");
            for at in [0, len / 2, len - 1] {
                let ptr = r.as_ptr().wrapping_add(at);
                assert!(
                    is_external_memory(&eal, ptr),
                    "byte {at} is external memory"
                );
                assert_eq!(iova_of(&eal, ptr), Some(ptr as u64), "IOVA-as-VA");
            }
        }
        let mut total = write_and_check(&p, &mut a, &mx, &smr, 1);
        total += write_and_check(&p, &mut a, &my, &smr, 2);

        // The first goes: its vector comes back intact, the page it shares
        // stays registered for the second, which keeps working.
        p.a.dereg_mr(&mx).unwrap();
        drop(mx);
        let mut rx = Some(rx);
        let back = p.until("the first vector back", |_| {
            match rx.take().expect("held").into_inner() {
                Ok(v) => Some(v),
                Err(r) => {
                    rx = Some(r);
                    None
                }
            }
        });
        assert!(back == xv, "the first vector comes back unchanged");
        let shared: Vec<usize> = px.clone().filter(|pg| py.contains(pg)).collect();
        assert!(!shared.is_empty());
        assert_eq!(
            ExtMem::live() - base,
            py.clone().count(),
            "the second's pages stay"
        );
        for at in [0, len / 2, len - 1] {
            assert!(is_external_memory(&eal, ry.as_ptr().wrapping_add(at)));
        }
        for pg in px.clone().filter(|pg| !py.contains(pg)) {
            assert!(
                !is_external_memory(&eal, (pg * 4096) as *const u8),
                "the first's own page {pg:#x} is unregistered"
            );
        }
        ry.write(0, b"still working").unwrap();
        total += write_and_check(&p, &mut a, &my, &smr, 3);
        // And a Read into it from b.
        sink.fill(0, len, 0x77).unwrap();
        let rd = SendWr::read(4, my.sge(0, len as u32), smr.addr(), smr.rkey());
        a.qp.post_send(&rd).unwrap();
        let wc = wait_wc(&p, &mut a, 4);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        let got = ry.to_vec(0, len).unwrap();
        let wrong: Vec<usize> = (0..len).filter(|&i| got[i] != 0x77).collect();
        assert!(
            wrong.is_empty(),
            "the Read completed with {} of {len} bytes not placed (first at {:?}, last at \
             {:?}); a's workers: {:?}; b's: {:?}",
            wrong.len(),
            wrong.first(),
            wrong.last(),
            p.a.stats(),
            p.b.stats()
        );
        total += len;

        // The second goes: every registration of both is gone.
        p.a.dereg_mr(&my).unwrap();
        drop(my);
        let mut ry = Some(ry);
        let back = p.until("the second vector back", |_| {
            match ry.take().expect("held").into_inner() {
                Ok(v) => Some(v),
                Err(r) => {
                    ry = Some(r);
                    None
                }
            }
        });
        assert_eq!(back.len(), len);
        assert!(
            back.iter().all(|&v| v == 0x77),
            "the Read's bytes are in the vector"
        );
        assert_ne!(back, yv);
        assert_eq!(
            ExtMem::live(),
            base,
            "no registration of the vectors is left"
        );
        for pg in &pages {
            assert!(!is_external_memory(&eal, (pg * 4096) as *const u8));
        }
        println!(
            "two vectors of {len} B on pages {px:x?} and {py:x?} (sharing {shared:x?}): {} \
             registrations for {} pages, the shared one kept while either lived; {total} \
             bytes verified; {} payloads attached",
            pages.len(),
            pages.len(),
            sa.tx_attached.load(Ordering::Relaxed)
        );
        p.b.dereg_mr(&smr).unwrap();
        drop((smr, sink));
        p.a.disconnect(&a.qp, true).unwrap();
        drop(p);
    }
    assert_eq!(ExtMem::live(), 0, "no registration outlives its region");
    assert_eq!(dataplane::memory::dpdk_chunks(), 0);
    drop(eal);
    assert_clean(&guard);
}

/// Restores `/proc/sys/vm/nr_hugepages` when dropped.
struct HugepageReservation {
    previous: u64,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl Drop for HugepageReservation {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.previous.to_string());
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Skips (prints why) unless root tests are required, then fails.
fn skip(why: &str) {
    if std::env::var("IWARP_REQUIRE_ROOT_TESTS").as_deref() == Ok("1") {
        panic!("IWARP_REQUIRE_ROOT_TESTS=1 but {why}");
    }
    println!("skipped: {why}");
}

#[test]
fn registered_hugepage_regions_over_net_ring() {
    if !is_root() {
        return skip("not root: cannot reserve hugepages");
    }
    let Some(previous) = read_u64(NR_HUGEPAGES) else {
        return skip("no /proc/sys/vm/nr_hugepages");
    };
    let reservation = HugepageReservation { previous };
    if std::fs::write(NR_HUGEPAGES, (previous + HUGEPAGES).to_string()).is_err() {
        return skip("cannot write /proc/sys/vm/nr_hugepages");
    }
    let free = dpdk_bindings::HugeMap::free_pages(dpdk_bindings::HugeMap::PAGE_2M).unwrap_or(0);
    if free < HUGEPAGES {
        drop(reservation);
        return skip(&format!(
            "only {free} 2 MiB hugepages free after reserving {HUGEPAGES}"
        ));
    }
    println!("hugepages: {HUGEPAGES} reserved ({previous} before, {free} free)");
    let prefix = format!("iwarp-dpdk-extmem-huge-{}", std::process::id());
    let dir = RuntimeDir(runtime_dir(&prefix));
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hugepage_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &prefix)
        .output()
        .expect("run the child");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed: {}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("hugepages: ") && stdout.contains("bytes verified in all"),
        "the child ran the exchange"
    );
    // Nothing left behind: no runtime directory, no hugepage files.
    assert!(!dir.0.exists(), "{} left behind", dir.0.display());
    if let Ok(d) = std::fs::read_dir("/dev/hugepages") {
        let left: Vec<_> = d
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "hugepage files left: {left:?}");
    }
    drop(reservation);
    assert_eq!(
        read_u64(NR_HUGEPAGES),
        Some(previous),
        "reservation restored"
    );
    let free_after =
        dpdk_bindings::HugeMap::free_pages(dpdk_bindings::HugeMap::PAGE_2M).unwrap_or(0);
    println!("hugepages: {previous} reserved again, {free_after} free; nothing left behind");
}

/// The hugepage variant's body, in a process of its own (EAL on
/// hugepages cannot share a process with the `--no-huge` one).
#[test]
#[ignore = "run by registered_hugepage_regions_over_net_ring in a child process"]
fn hugepage_child() {
    let prefix = std::env::var(CHILD_ENV).expect("run by the parent test");
    let _guard = RuntimeDir(runtime_dir(&prefix));
    let args: Vec<String> = [
        "-l",
        "0",
        "--in-memory",
        "--no-pci",
        "--no-telemetry",
        "--log-level=warning",
        "--file-prefix",
        &prefix,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let eal = start_eal(&args).expect("EAL starts on hugepages");
    assert!(eal.has_hugepages());
    let mode = if eal.iova_is_va() { "VA" } else { "PA" };
    println!("hugepages: EAL on hugepages, IOVA-as-{mode}");
    {
        let (p, sa, sb) = ring_pair(&eal, 1500, 1);
        let mut ends = connect(&p);
        let total = run_all(&eal, &p, &mut ends, huge, true, "hugepages");
        println!("hugepages: {total} bytes verified in all");
        // Heap regions: registered under IOVA-as-VA; under IOVA-as-PA
        // their pages may move, so they stay unregistered and are copied.
        let va = eal.iova_is_va();
        let total = run_all(&eal, &p, &mut ends, heap, va, "heap on hugepage EAL");
        println!("heap on hugepage EAL: {total} bytes verified");
        p.a.disconnect(&ends.0.qp, true).unwrap();
        print_stats("hugepages a", &sa);
        print_stats("hugepages b", &sb);
        assert!(sa.mem_registered.load(Ordering::Relaxed) >= 3 * SIZES.len() as u64);
        assert!(sa.tx_attached.load(Ordering::Relaxed) > 1000);
        if !eal.iova_is_va() {
            assert!(sa.mem_not_registered.load(Ordering::Relaxed) > 0);
            assert!(sa.tx_copied.load(Ordering::Relaxed) > 0);
        }
        let gaps = GAPS_CROSSED.load(Ordering::Relaxed);
        let split = sa.tx_split.load(Ordering::Relaxed) + sb.tx_split.load(Ordering::Relaxed);
        println!("hugepages: {gaps} sources crossed a gap between physical pages; {split} payloads split there");
        if gaps > 0 {
            assert!(split > 0, "payload across non-adjacent pages was split");
        }
        drop(p);
    }
    assert_eq!(ExtMem::live(), 0, "no registration outlives its region");
    drop(eal);
}
