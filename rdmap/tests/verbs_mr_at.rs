//! Regions registered under a caller-chosen STag (`reg_mr_at`): every
//! check (key, protection domain, access right, wrap, base and bounds)
//! gives the same answer as for the same region registered with `reg_mr`;
//! pins, deregistration and invalidation behave the same; the index rules
//! (taken, zero, inside or beyond the dense table) and the capacity hold.

use rdmap::placement::{CheckedRange, MemSpan, RegionHandle, VecMemory};
use rdmap::verbs::{
    Access, AccessError, DeregStatus, Device, DeviceLimits, MrEvent, MrKind, MrState, MrTable,
    PdId, RegOptions, Stag, VerbsError,
};

const PD: PdId = PdId(1);
const OTHER_PD: PdId = PdId(2);
const VA: u64 = 0x7ffd_1c40_2000;
/// The STag siw gave rping's buffer in the capture: index 0x2b9d4f, far
/// beyond any dense table here.
const SIW_STAG: Stag = Stag(0x2b9d_4f00);

fn span(len: u64) -> MemSpan {
    MemSpan::new(RegionHandle(3), 256, len)
}

/// A check's outcome with the range reduced to comparable numbers.
type Outcome = Result<Option<(RegionHandle, u64, u32)>, AccessError>;

fn outcome(r: Result<Option<CheckedRange<'_>>, AccessError>) -> Outcome {
    r.map(|o| o.map(|c| (c.region(), c.offset(), c.len())))
}

/// Every check of the table for one (STag, TO, length, domain).
fn all_checks(t: &MrTable, stag: Stag, to: u64, len: u32, pd: PdId) -> [Outcome; 5] {
    [
        outcome(t.check_remote_write(stag, to, len, pd)),
        outcome(t.check_remote_read(stag, to, len, pd)),
        outcome(t.check_local(stag, to, len, pd, Access::NONE)),
        outcome(t.check_local(stag, to, len, pd, Access::LOCAL_WRITE)),
        outcome(t.check_local(stag, to, len, pd, Access::REMOTE_READ)),
    ]
}

#[test]
fn every_check_matches_a_dense_registration() {
    let rights = [
        Access::NONE,
        Access::LOCAL_WRITE,
        Access::REMOTE_READ,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    ];
    let len = 1000u64;
    let tos = [
        0,
        VA - 1,
        VA,
        VA + 1,
        VA + 999,
        VA + 1000,
        u64::MAX - 3,
        u64::MAX,
    ];
    let lens = [0u32, 1, 8, 999, 1000, 1001, u32::MAX];
    let mut compared = 0;
    for access in rights {
        let mut t = MrTable::new(8);
        let dense = t.reg_mr(PD, span(len), VA, access).unwrap();
        let at = t.reg_mr_at(SIW_STAG, PD, span(len), VA, access).unwrap();
        assert_eq!(at, SIW_STAG);
        for key_delta in [0u8, 1, 0xff] {
            let d = dense.with_key(dense.key().wrapping_add(key_delta));
            let a = at.with_key(at.key().wrapping_add(key_delta));
            for pd in [PD, OTHER_PD] {
                for &to in &tos {
                    for &n in &lens {
                        assert_eq!(
                            all_checks(&t, d, to, n, pd),
                            all_checks(&t, a, to, n, pd),
                            "{access:?} key+{key_delta} {pd:?} to {to:#x} len {n}"
                        );
                        compared += 1;
                    }
                }
            }
        }
    }
    assert_eq!(compared, 5 * 3 * 2 * tos.len() * lens.len());
}

#[test]
fn imported_checks_name_the_registered_bytes() {
    let mut t = MrTable::new(4);
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    t.reg_mr_at(SIW_STAG, PD, span(64), VA, rights).unwrap();
    let r = t
        .check_remote_write(SIW_STAG, VA + 16, 8, PD)
        .unwrap()
        .unwrap();
    assert_eq!((r.region(), r.offset(), r.len()), (RegionHandle(3), 272, 8));
    // Each refusal, by the rule that raises it.
    assert_eq!(
        t.check_remote_write(SIW_STAG.with_key(1), VA, 8, PD),
        Err(AccessError::InvalidStag)
    );
    assert_eq!(
        t.check_remote_write(SIW_STAG, VA, 8, OTHER_PD),
        Err(AccessError::PdMismatch)
    );
    assert_eq!(
        t.check_remote_read(SIW_STAG, VA, 8, PD),
        Err(AccessError::AccessRights)
    );
    assert_eq!(
        t.check_remote_write(SIW_STAG, VA + 60, 8, PD),
        Err(AccessError::BaseBounds)
    );
    assert_eq!(
        t.check_remote_write(SIW_STAG, u64::MAX - 2, 8, PD),
        Err(AccessError::ToWrap)
    );
    // A neighbouring index of the side map is not registered.
    assert_eq!(
        t.check_remote_write(Stag::new(SIW_STAG.index() + 1, 0), VA, 8, PD),
        Err(AccessError::InvalidStag)
    );
    let info = t.query_mr(SIW_STAG).unwrap();
    assert_eq!(
        (info.stag, info.pd, info.kind, info.state, info.len, info.iova),
        (SIW_STAG, PD, MrKind::Registered, MrState::Valid, 64, VA)
    );
}

#[test]
fn pinned_imported_region_deregisters_when_the_last_pin_returns() {
    let mut t = MrTable::new(4);
    t.reg_mr_at(SIW_STAG, PD, span(128), VA, Access::REMOTE_READ)
        .unwrap();
    let pin = t
        .pin_remote_read(SIW_STAG, VA, 100, PD)
        .unwrap()
        .expect("a range");
    let sub = t.pin_sub(&pin, 10, 20).expect("sub-pin");
    assert_eq!(t.query_mr(SIW_STAG).unwrap().pins, 2);
    assert_eq!(t.dereg_mr(SIW_STAG), Ok(DeregStatus::Pending));
    assert_eq!(
        t.check_remote_read(SIW_STAG, VA, 1, PD),
        Err(AccessError::InvalidStag),
        "dead for new accesses at once"
    );
    assert_eq!(
        t.reg_mr_at(SIW_STAG, PD, span(8), 0, Access::NONE),
        Err(VerbsError::Busy),
        "index held until the last pin returns"
    );
    t.unpin(sub);
    assert_eq!(t.poll_event(), None);
    t.unpin(pin);
    assert_eq!(t.poll_event(), Some(MrEvent::Deregistered(SIW_STAG)));
    assert!(t.query_mr(SIW_STAG).is_none());
    assert!(t.is_empty());
    // The STag can be registered again, and pins count from zero.
    t.reg_mr_at(SIW_STAG, PD, span(128), VA, Access::REMOTE_READ)
        .unwrap();
    let again = t.pin_remote_read(SIW_STAG, VA, 8, PD).unwrap().unwrap();
    assert_eq!(t.query_mr(SIW_STAG).unwrap().pins, 1);
    t.unpin(again);
    assert_eq!(t.dereg_mr(SIW_STAG), Ok(DeregStatus::Done));
}

#[test]
fn invalidation_follows_the_registration_options() {
    let mut t = MrTable::new(4);
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let fixed = Stag::new(0x40_0000, 0x11);
    let inv = Stag::new(0x40_0001, 0x22);
    t.reg_mr_at(fixed, PD, span(64), VA, rights).unwrap();
    t.reg_mr_at_with(
        inv,
        PD,
        span(64),
        VA,
        rights,
        RegOptions {
            invalidatable: true,
        },
    )
    .unwrap();
    assert_eq!(
        t.invalidate_remote(fixed, PD),
        Err(AccessError::CannotInvalidate)
    );
    assert_eq!(
        t.invalidate_remote(inv, OTHER_PD),
        Err(AccessError::PdMismatch)
    );
    assert_eq!(
        t.invalidate_remote(inv.with_key(0), PD),
        Err(AccessError::InvalidStag)
    );
    t.invalidate_remote(inv, PD).unwrap();
    assert_eq!(
        t.check_remote_write(inv, VA, 8, PD),
        Err(AccessError::InvalidStag)
    );
    assert!(t.check_remote_write(fixed, VA, 8, PD).unwrap().is_some());
    t.invalidate_local(inv, PD).unwrap();
    assert_eq!(t.query_mr(inv).unwrap().state, MrState::Invalid);
}

#[test]
fn index_rules_and_capacity() {
    let mut t = MrTable::new(3);
    assert_eq!(
        t.reg_mr_at(Stag::new(0, 5), PD, span(8), 0, Access::NONE),
        Err(VerbsError::InvalidStag)
    );
    assert_eq!(
        t.reg_mr_at(SIW_STAG, PD, span(0), 0, Access::NONE),
        Err(VerbsError::InvalidLength)
    );
    assert_eq!(
        t.reg_mr_at(SIW_STAG, PD, span(8), u64::MAX - 3, Access::NONE),
        Err(VerbsError::AddressOverflow)
    );
    assert_eq!(
        t.reg_mr_at(SIW_STAG, PD, span(8), 0, Access::REMOTE_WRITE),
        Err(VerbsError::InvalidAccess)
    );
    // A free index inside the dense table, with a key of our choosing: the
    // allocator no longer hands it out.
    let inside = Stag::new(2, 0x9c);
    t.reg_mr_at(inside, PD, span(8), 0, Access::NONE).unwrap();
    assert_eq!(
        t.reg_mr_at(inside.with_key(0), PD, span(8), 0, Access::NONE),
        Err(VerbsError::Busy)
    );
    let a = t.reg_mr(PD, span(8), 0, Access::NONE).unwrap();
    assert_eq!(a.index(), 1);
    t.reg_mr_at(SIW_STAG, PD, span(8), 0, Access::NONE).unwrap();
    assert_eq!(t.len(), 3);
    // Three regions in a table of three, whatever their indices.
    assert_eq!(
        t.reg_mr(PD, span(8), 0, Access::NONE),
        Err(VerbsError::TableFull)
    );
    assert_eq!(
        t.reg_mr_at(Stag::new(0x77_0000, 0), PD, span(8), 0, Access::NONE),
        Err(VerbsError::TableFull)
    );
    assert_eq!(t.dereg_mr(SIW_STAG), Ok(DeregStatus::Done));
    let b = t.reg_mr(PD, span(8), 0, Access::NONE).unwrap();
    assert_eq!(b.index(), 3, "index 2 stays taken by the chosen STag");
    assert_eq!(t.dereg_mr(inside), Ok(DeregStatus::Done));
    // Freed like any dense index: its key advances.
    let again = t.reg_mr(PD, span(8), 0, Access::NONE).unwrap();
    assert_eq!(again, Stag::new(2, 0x9d));
}

#[test]
fn device_checks_the_domain_and_counts_imported_regions() {
    let mut dev = Device::new(DeviceLimits {
        max_mr: 4,
        ..DeviceLimits::default()
    });
    let mut mem = VecMemory::new();
    let region = mem.add_region(64);
    let whole = mem.whole(region).unwrap();
    assert_eq!(
        dev.reg_mr_at(SIW_STAG, PdId(9), whole, VA, Access::NONE),
        Err(VerbsError::InvalidPd)
    );
    let pd = dev.alloc_pd().unwrap();
    dev.reg_mr_at(SIW_STAG, pd, whole, VA, Access::NONE)
        .unwrap();
    assert_eq!(dev.dealloc_pd(pd), Err(VerbsError::Busy));
    assert_eq!(dev.dereg_mr(SIW_STAG), Ok(DeregStatus::Done));
    dev.dealloc_pd(pd).unwrap();
}
