//! Memory regions and STags: every check of the placement path, invalidation
//! (local and remote), fast registration, and deregistration that waits for
//! pinned in-flight users.

use rdmap::error::TerminateCause;
use rdmap::placement::{MemSpan, Placement, RegionHandle, VecMemory};
use rdmap::verbs::{
    Access, AccessError, DeregStatus, Device, DeviceLimits, FastReg, MrEvent, MrKind, MrState,
    PdId, RegOptions, Stag, VerbsError,
};

struct Fixture {
    dev: Device,
    mem: VecMemory,
    region: RegionHandle,
    pd: PdId,
    other_pd: PdId,
}

fn fixture() -> Fixture {
    let mut dev = Device::new(DeviceLimits {
        max_mr: 16,
        ..DeviceLimits::default()
    });
    let mut mem = VecMemory::new();
    let region = mem.add_region_with((0..=255u8).cycle().take(4096).collect());
    let pd = dev.alloc_pd().unwrap();
    let other_pd = dev.alloc_pd().unwrap();
    Fixture {
        dev,
        mem,
        region,
        pd,
        other_pd,
    }
}

const VA: u64 = 0x7f3a_2000_0000;
fn all_remote() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
}

#[test]
fn key_mismatch_unknown_index_and_stag_zero_are_invalid() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 0, 1024).unwrap();
    let stag = f.dev.reg_mr(f.pd, span, VA, all_remote()).unwrap();
    let mrs = f.dev.mrs();
    assert!(mrs.check_remote_write(stag, VA, 8, f.pd).unwrap().is_some());
    let wrong_key = stag.with_key(stag.key().wrapping_add(1));
    assert_eq!(
        mrs.check_remote_write(wrong_key, VA, 8, f.pd),
        Err(AccessError::InvalidStag)
    );
    // Index beyond the table (16 entries) and an unused index inside it.
    assert_eq!(
        mrs.check_remote_read(Stag::new(17, stag.key()), VA, 8, f.pd),
        Err(AccessError::InvalidStag)
    );
    assert_eq!(
        mrs.check_remote_read(Stag::new(0xff_ffff, 0), VA, 8, f.pd),
        Err(AccessError::InvalidStag)
    );
    assert_eq!(
        mrs.check_remote_read(Stag::new(stag.index() + 1, stag.key()), VA, 8, f.pd),
        Err(AccessError::InvalidStag)
    );
    assert_eq!(
        mrs.check_local(Stag(0), VA, 8, f.pd, Access::NONE),
        Err(AccessError::InvalidStag)
    );
    assert_eq!(
        AccessError::InvalidStag.ddp_tagged_cause(),
        TerminateCause::DDP_TAGGED_INVALID_STAG
    );
    assert_eq!(
        AccessError::InvalidStag.rdmap_cause(),
        TerminateCause::RDMAP_PROT_INVALID_STAG
    );
}

#[test]
fn stag_from_an_earlier_registration_no_longer_matches() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 0, 64).unwrap();
    let old = f.dev.reg_mr(f.pd, span, VA, all_remote()).unwrap();
    assert_eq!(f.dev.dereg_mr(old), Ok(DeregStatus::Done));
    // Fill the table so the old index comes round again.
    let mut newer = Vec::new();
    while let Ok(s) = f.dev.reg_mr(f.pd, span, VA, all_remote()) {
        newer.push(s);
    }
    let reused = newer.iter().find(|s| s.index() == old.index()).unwrap();
    assert_ne!(reused.key(), old.key());
    assert_eq!(
        f.dev.mrs().check_remote_write(old, VA, 8, f.pd),
        Err(AccessError::InvalidStag)
    );
    assert_eq!(f.dev.dereg_mr(old), Err(VerbsError::InvalidStag));
    assert_eq!(
        f.dev.reg_mr(f.pd, span, VA, all_remote()),
        Err(VerbsError::TableFull)
    );
}

#[test]
fn protection_domain_mismatch() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 0, 64).unwrap();
    let stag = f.dev.reg_mr(f.pd, span, VA, all_remote()).unwrap();
    let mrs = f.dev.mrs();
    for result in [
        mrs.check_remote_write(stag, VA, 8, f.other_pd)
            .map(|r| r.is_some()),
        mrs.check_remote_read(stag, VA, 8, f.other_pd)
            .map(|r| r.is_some()),
        mrs.check_local(stag, VA, 8, f.other_pd, Access::NONE)
            .map(|r| r.is_some()),
    ] {
        assert_eq!(result, Err(AccessError::PdMismatch));
    }
    assert_eq!(
        AccessError::PdMismatch.ddp_tagged_cause(),
        TerminateCause::DDP_TAGGED_STAG_NOT_ASSOCIATED
    );
    assert_eq!(
        AccessError::PdMismatch.rdmap_cause(),
        TerminateCause::RDMAP_PROT_STAG_NOT_ASSOCIATED
    );
}

#[test]
fn access_rights_each_way() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 0, 64).unwrap();
    let read_only = f.dev.reg_mr(f.pd, span, VA, Access::REMOTE_READ).unwrap();
    let write_only = f
        .dev
        .reg_mr(f.pd, span, VA, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let local_only = f.dev.reg_mr(f.pd, span, VA, Access::NONE).unwrap();
    let mrs = f.dev.mrs();

    assert!(mrs
        .check_remote_read(read_only, VA, 8, f.pd)
        .unwrap()
        .is_some());
    assert_eq!(
        mrs.check_remote_write(read_only, VA, 8, f.pd),
        Err(AccessError::AccessRights)
    );
    assert!(mrs
        .check_remote_write(write_only, VA, 8, f.pd)
        .unwrap()
        .is_some());
    assert_eq!(
        mrs.check_remote_read(write_only, VA, 8, f.pd),
        Err(AccessError::AccessRights)
    );
    for remote in [
        mrs.check_remote_read(local_only, VA, 8, f.pd)
            .map(|r| r.is_some()),
        mrs.check_remote_write(local_only, VA, 8, f.pd)
            .map(|r| r.is_some()),
    ] {
        assert_eq!(remote, Err(AccessError::AccessRights));
    }
    // Local read is always allowed; local write needs LOCAL_WRITE.
    assert!(mrs
        .check_local(local_only, VA, 8, f.pd, Access::NONE)
        .unwrap()
        .is_some());
    assert_eq!(
        mrs.check_local(read_only, VA, 8, f.pd, Access::LOCAL_WRITE),
        Err(AccessError::AccessRights)
    );
    assert!(mrs
        .check_local(write_only, VA, 8, f.pd, Access::LOCAL_WRITE)
        .unwrap()
        .is_some());
    assert_eq!(
        AccessError::AccessRights.ddp_tagged_cause(),
        TerminateCause::RDMAP_PROT_ACCESS_RIGHTS
    );
    assert_eq!(
        AccessError::AccessRights.wc_status(),
        rdmap::verbs::WcStatus::LocalProtectionError
    );
}

#[test]
fn remote_write_without_local_write_is_refused_at_registration() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 0, 64).unwrap();
    assert_eq!(
        f.dev.reg_mr(f.pd, span, VA, Access::REMOTE_WRITE),
        Err(VerbsError::InvalidAccess)
    );
    assert_eq!(
        f.dev
            .reg_mr(f.pd, MemSpan::new(f.region, 0, 0), VA, Access::NONE),
        Err(VerbsError::InvalidLength)
    );
    assert_eq!(
        f.dev.reg_mr(PdId(99), span, VA, Access::NONE),
        Err(VerbsError::InvalidPd)
    );
}

#[test]
fn base_and_bounds_exact_edges() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 100, 1000).unwrap();
    let stag = f.dev.reg_mr(f.pd, span, VA, all_remote()).unwrap();
    let mrs = f.dev.mrs();
    let ok = |to: u64, len: u32| {
        let r = mrs
            .check_remote_write(stag, to, len, f.pd)
            .unwrap()
            .unwrap();
        (r.offset(), r.len())
    };
    assert_eq!(ok(VA, 1000), (100, 1000), "the whole region");
    assert_eq!(ok(VA, 1), (100, 1), "first byte");
    assert_eq!(ok(VA + 999, 1), (1099, 1), "last byte");
    for (to, len) in [
        (VA - 1, 1),    // one before the base
        (VA - 1, 2),    // straddles the base
        (VA + 1000, 1), // one past the end
        (VA + 999, 2),  // straddles the end
        (VA, 1001),     // one too long
        (0, 1),         // far below
    ] {
        assert_eq!(
            mrs.check_remote_write(stag, to, len, f.pd),
            Err(AccessError::BaseBounds),
            "to {to:#x} len {len}"
        );
    }
    assert_eq!(
        AccessError::BaseBounds.ddp_tagged_cause(),
        TerminateCause::DDP_TAGGED_BASE_BOUNDS
    );
}

#[test]
fn zero_based_region() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 512, 256).unwrap();
    let stag = f.dev.reg_mr(f.pd, span, 0, all_remote()).unwrap();
    let mrs = f.dev.mrs();
    let r = mrs.check_remote_read(stag, 16, 4, f.pd).unwrap().unwrap();
    let mut out = [0u8; 4];
    f.mem.read(r, &mut out);
    assert_eq!(out, [16, 17, 18, 19], "bytes 528.. of the region");
    assert_eq!(
        mrs.check_remote_read(stag, 256, 1, f.pd),
        Err(AccessError::BaseBounds)
    );
}

#[test]
fn tagged_offset_wrap_is_its_own_error() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 0, 16).unwrap();
    // The highest region that fits: its end is exactly 2^64 - 1.
    let top = u64::MAX - 16;
    let stag = f.dev.reg_mr(f.pd, span, top, all_remote()).unwrap();
    let mrs = f.dev.mrs();
    assert!(mrs
        .check_remote_read(stag, top, 16, f.pd)
        .unwrap()
        .is_some());
    assert!(mrs
        .check_remote_read(stag, u64::MAX - 1, 1, f.pd)
        .unwrap()
        .is_some());
    assert_eq!(
        mrs.check_remote_read(stag, u64::MAX - 1, 2, f.pd),
        Err(AccessError::ToWrap)
    );
    assert_eq!(
        mrs.check_remote_write(stag, u64::MAX, u32::MAX, f.pd),
        Err(AccessError::ToWrap)
    );
    // Wrap is reported before bounds, whatever the region.
    let low = f.dev.reg_mr(f.pd, span, 0, all_remote()).unwrap();
    assert_eq!(
        f.dev.mrs().check_remote_write(low, u64::MAX - 3, 8, f.pd),
        Err(AccessError::ToWrap)
    );
    // A region whose end would pass 2^64 cannot be registered.
    assert_eq!(
        f.dev.reg_mr(f.pd, span, u64::MAX - 15, all_remote()),
        Err(VerbsError::AddressOverflow)
    );
    assert_eq!(
        AccessError::ToWrap.ddp_tagged_cause(),
        TerminateCause::DDP_TAGGED_TO_WRAP
    );
    assert_eq!(
        AccessError::ToWrap.rdmap_cause(),
        TerminateCause::RDMAP_PROT_TO_WRAP
    );
}

#[test]
fn zero_length_accesses_validate_nothing() {
    // A zero-length Write, Read Request or Read Response places no byte:
    // no STag is checked (the RTR of RFC 6581 may name an unregistered
    // STag, as siw's STag 1 does), and no range is produced.
    let mut f = fixture();
    let span = f.mem.span(f.region, 0, 16).unwrap();
    let stag = f.dev.reg_mr(f.pd, span, VA, Access::NONE).unwrap();
    let mrs = f.dev.mrs();
    for s in [Stag(0), Stag(1), stag, Stag(0xffff_ffff)] {
        assert_eq!(mrs.check_remote_write(s, u64::MAX, 0, f.other_pd), Ok(None));
        assert_eq!(mrs.check_remote_read(s, 0, 0, f.other_pd), Ok(None));
        assert_eq!(
            mrs.check_local(s, 0, 0, f.other_pd, Access::LOCAL_WRITE),
            Ok(None)
        );
    }
    assert_eq!(
        f.dev.mrs_mut().pin_remote_read(Stag(1), 0, 0, f.pd),
        Ok(None)
    );
}

#[test]
fn placement_writes_only_the_checked_bytes() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 1000, 100).unwrap();
    let stag = f.dev.reg_mr(f.pd, span, VA, all_remote()).unwrap();
    let before = f.mem.bytes(f.region).unwrap().to_vec();
    // One DDP segment of 10 bytes at TO VA+20, handed over in two pieces.
    let mut seg = f
        .dev
        .mrs()
        .check_remote_write(stag, VA + 20, 10, f.pd)
        .unwrap()
        .unwrap();
    let first = seg.take_front(4).unwrap();
    f.mem.write(first, &[0xa0; 4]).unwrap();
    assert!(seg.take_front(7).is_none(), "longer than what is left");
    let rest = seg.take_front(6).unwrap();
    f.mem.write(rest, &[0xb0; 6]).unwrap();
    assert!(seg.is_empty());
    assert!(seg.take_front(1).is_none());
    let after = f.mem.bytes(f.region).unwrap();
    assert_eq!(&after[1020..1024], &[0xa0; 4]);
    assert_eq!(&after[1024..1030], &[0xb0; 6]);
    assert_eq!(&after[..1020], &before[..1020]);
    assert_eq!(&after[1030..], &before[1030..]);

    let whole = f
        .dev
        .mrs()
        .check_remote_write(stag, VA, 100, f.pd)
        .unwrap()
        .unwrap();
    assert_eq!(whole.sub(99, 1).map(|r| r.offset()), Some(1099));
    assert!(whole.sub(99, 2).is_none());
    assert!(whole.sub(100, 0).is_none());
    assert!(whole.sub(u32::MAX, 2).is_none());
}

#[test]
fn local_and_remote_invalidation_rules() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 0, 64).unwrap();
    let inval = RegOptions {
        invalidatable: true,
    };
    let plain = f.dev.reg_mr(f.pd, span, VA, all_remote()).unwrap();
    let remote = f
        .dev
        .reg_mr_with(f.pd, span, VA, Access::REMOTE_READ, inval)
        .unwrap();
    let local_rights = f
        .dev
        .reg_mr_with(f.pd, span, VA, Access::LOCAL_WRITE, inval)
        .unwrap();
    let mrs = f.dev.mrs_mut();

    // A plain registration is not invalidatable, locally or remotely.
    assert_eq!(
        mrs.invalidate_local(plain, f.pd),
        Err(AccessError::CannotInvalidate)
    );
    assert_eq!(
        mrs.invalidate_remote(plain, f.pd),
        Err(AccessError::CannotInvalidate)
    );
    assert_eq!(
        AccessError::CannotInvalidate.invalidate_cause(),
        TerminateCause::RDMAP_OP_CANNOT_INVALIDATE
    );
    // No remote right: the peer may not invalidate it, the owner may.
    assert_eq!(
        mrs.invalidate_remote(local_rights, f.pd),
        Err(AccessError::CannotInvalidate)
    );
    assert_eq!(mrs.invalidate_local(local_rights, f.pd), Ok(()));
    // Another domain, a wrong key, an unknown index.
    assert_eq!(
        mrs.invalidate_remote(remote, f.other_pd),
        Err(AccessError::PdMismatch)
    );
    assert_eq!(
        mrs.invalidate_remote(remote.with_key(remote.key() ^ 0x55), f.pd),
        Err(AccessError::InvalidStag)
    );
    assert_eq!(
        mrs.invalidate_remote(Stag::new(15, 0), f.pd),
        Err(AccessError::InvalidStag)
    );
    for e in [AccessError::PdMismatch, AccessError::InvalidStag] {
        assert_eq!(
            e.invalidate_cause(),
            TerminateCause::RDMAP_PROT_CANNOT_INVALIDATE
        );
    }
    // The real thing: refused at once afterwards, and idempotent.
    assert!(mrs
        .check_remote_read(remote, VA, 8, f.pd)
        .unwrap()
        .is_some());
    assert_eq!(mrs.invalidate_remote(remote, f.pd), Ok(()));
    assert_eq!(
        mrs.check_remote_read(remote, VA, 8, f.pd),
        Err(AccessError::InvalidStag)
    );
    assert_eq!(mrs.query_mr(remote).unwrap().state, MrState::Invalid);
    assert_eq!(mrs.invalidate_remote(remote, f.pd), Ok(()));
    assert_eq!(mrs.invalidate_local(remote, f.pd), Ok(()));
    // Deregistering an invalidated region works as usual.
    assert_eq!(mrs.dereg_mr(remote), Ok(DeregStatus::Done));
}

#[test]
fn fast_register_binds_with_a_new_key() {
    let mut f = fixture();
    let frmr = f.dev.alloc_mr(f.pd, 256).unwrap();
    let info = f.dev.mrs().query_mr(frmr).unwrap();
    assert_eq!(
        (info.kind, info.state),
        (MrKind::FastRegister, MrState::Invalid)
    );
    assert!(info.invalidatable);
    assert_eq!(
        f.dev.mrs().check_remote_write(frmr, 0, 1, f.pd),
        Err(AccessError::InvalidStag),
        "allocated invalid"
    );
    let new = frmr.with_key(frmr.key().wrapping_add(0x21));
    let wr = FastReg {
        stag: new,
        mem: f.mem.span(f.region, 2048, 128).unwrap(),
        iova: VA,
        access: all_remote(),
    };
    let mrs = f.dev.mrs_mut();
    assert_eq!(
        mrs.fast_register(&wr, f.other_pd),
        Err(AccessError::PdMismatch)
    );
    let too_long = FastReg {
        mem: MemSpan::new(wr.mem.region, 0, 257),
        ..wr
    };
    assert_eq!(
        mrs.fast_register(&too_long, f.pd),
        Err(AccessError::InvalidOperation)
    );
    let inconsistent = FastReg {
        access: Access::REMOTE_WRITE,
        ..wr
    };
    assert_eq!(
        mrs.fast_register(&inconsistent, f.pd),
        Err(AccessError::AccessRights)
    );
    assert_eq!(mrs.fast_register(&wr, f.pd), Ok(()));
    assert_eq!(
        mrs.fast_register(&wr, f.pd),
        Err(AccessError::InvalidOperation),
        "still valid"
    );

    assert_eq!(
        mrs.check_remote_write(frmr, VA, 8, f.pd),
        Err(AccessError::InvalidStag),
        "the old key is dead"
    );
    let r = mrs
        .check_remote_write(new, VA + 8, 8, f.pd)
        .unwrap()
        .unwrap();
    assert_eq!((r.region(), r.offset(), r.len()), (f.region, 2056, 8));
    assert_eq!(
        mrs.check_remote_write(new, VA + 128, 1, f.pd),
        Err(AccessError::BaseBounds),
        "bounds of the new binding, not of max_len"
    );

    // Invalidate and re-bind elsewhere with yet another key.
    assert_eq!(mrs.invalidate_local(new, f.pd), Ok(()));
    let again = FastReg {
        stag: new.with_key(new.key().wrapping_add(1)),
        mem: MemSpan::new(f.region, 0, 16),
        iova: 0,
        access: Access::REMOTE_READ,
    };
    assert_eq!(mrs.fast_register(&again, f.pd), Ok(()));
    assert!(mrs
        .check_remote_read(again.stag, 0, 16, f.pd)
        .unwrap()
        .is_some());
    assert_eq!(
        mrs.check_remote_read(new, 0, 16, f.pd),
        Err(AccessError::InvalidStag)
    );

    // A plain registration cannot be fast-registered.
    let plain = f
        .dev
        .reg_mr(f.pd, MemSpan::new(f.region, 0, 16), 0, Access::NONE)
        .unwrap();
    let mrs = f.dev.mrs_mut();
    assert_eq!(
        mrs.invalidate_local(plain, f.pd),
        Err(AccessError::CannotInvalidate)
    );
    assert_eq!(
        mrs.fast_register(&FastReg { stag: plain, ..wr }, f.pd),
        Err(AccessError::InvalidOperation)
    );
}

#[test]
fn deregistration_waits_for_pins() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 0, 64).unwrap();
    let stag = f.dev.reg_mr(f.pd, span, VA, all_remote()).unwrap();
    let mrs = f.dev.mrs_mut();
    let a = mrs
        .pin_local(stag, VA, 32, f.pd, Access::NONE)
        .unwrap()
        .unwrap();
    let b = mrs.pin_sub(&a, 16, 16).unwrap();
    assert!(mrs.pin_sub(&a, 16, 17).is_none());
    assert_eq!(mrs.query_mr(stag).unwrap().pins, 2);

    assert_eq!(mrs.dereg_mr(stag), Ok(DeregStatus::Pending));
    assert_eq!(mrs.query_mr(stag).unwrap().state, MrState::Deregistering);
    assert_eq!(
        mrs.dereg_mr(stag),
        Err(VerbsError::InvalidStag),
        "only once"
    );
    assert_eq!(
        mrs.check_local(stag, VA, 1, f.pd, Access::NONE),
        Err(AccessError::InvalidStag),
        "dead for new users at once"
    );
    assert_eq!(
        mrs.invalidate_local(stag, f.pd),
        Err(AccessError::InvalidStag)
    );

    // The pinned bytes stay readable.
    let mut out = [0u8; 16];
    f.mem.read(b.range(), &mut out);
    assert_eq!(out[0], 16);

    let mrs = f.dev.mrs_mut();
    mrs.unpin(a);
    assert_eq!(mrs.poll_event(), None);
    assert!(mrs.query_mr(stag).is_some());
    mrs.unpin(b);
    assert_eq!(mrs.poll_event(), Some(MrEvent::Deregistered(stag)));
    assert_eq!(mrs.poll_event(), None);
    assert!(mrs.query_mr(stag).is_none());
    assert!(mrs.is_empty());
}

/// The case: a Read Response is in flight (its source pinned) when
/// the peer's Send with Invalidate invalidates the STag. New Read Requests
/// fail with the right cause; the in-flight response can still be
/// retransmitted from the region; deregistration completes when TCP has
/// acknowledged it and the pin is returned.
#[test]
fn read_response_retransmitted_after_remote_invalidate() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 256, 512).unwrap();
    let stag = f
        .dev
        .reg_mr_with(
            f.pd,
            span,
            VA,
            Access::REMOTE_READ,
            RegOptions {
                invalidatable: true,
            },
        )
        .unwrap();
    let mrs = f.dev.mrs_mut();
    // Inbound Read Request for 300 bytes at VA+100: checked and pinned.
    let source = mrs
        .pin_remote_read(stag, VA + 100, 300, f.pd)
        .unwrap()
        .unwrap();
    let mut first = vec![0u8; 300];
    f.mem.read(source.range(), &mut first);

    // The peer's Send with Invalidate.
    let mrs = f.dev.mrs_mut();
    assert_eq!(mrs.invalidate_remote(stag, f.pd), Ok(()));
    let refused = mrs.pin_remote_read(stag, VA, 1, f.pd).unwrap_err();
    assert_eq!(
        refused.rdmap_cause(),
        TerminateCause::RDMAP_PROT_INVALID_STAG
    );
    assert_eq!(mrs.dereg_mr(stag), Ok(DeregStatus::Pending));
    assert_eq!(mrs.poll_event(), None);

    // Retransmission of the response: the same bytes, from the region.
    let mut again = vec![0u8; 300];
    f.mem.read(source.range(), &mut again);
    assert_eq!(first, again);
    assert_eq!(again[0], ((256 + 100) % 256) as u8);

    // TCP acknowledges it: the pin goes back, deregistration completes.
    let mrs = f.dev.mrs_mut();
    mrs.unpin(source);
    assert_eq!(mrs.poll_event(), Some(MrEvent::Deregistered(stag)));
    assert_eq!(
        mrs.check_remote_read(stag, VA, 1, f.pd),
        Err(AccessError::InvalidStag)
    );
}

#[test]
fn protection_domain_stays_while_regions_use_it() {
    let mut f = fixture();
    let span = f.mem.span(f.region, 0, 64).unwrap();
    let stag = f.dev.reg_mr(f.pd, span, VA, all_remote()).unwrap();
    assert_eq!(f.dev.dealloc_pd(f.pd), Err(VerbsError::Busy));
    let pin = f
        .dev
        .mrs_mut()
        .pin_local(stag, VA, 1, f.pd, Access::NONE)
        .unwrap()
        .unwrap();
    assert_eq!(f.dev.dereg_mr(stag), Ok(DeregStatus::Pending));
    assert_eq!(
        f.dev.dealloc_pd(f.pd),
        Err(VerbsError::Busy),
        "still deregistering"
    );
    f.dev.mrs_mut().unpin(pin);
    assert_eq!(f.dev.dealloc_pd(f.pd), Ok(()));
    assert_eq!(f.dev.dealloc_pd(f.pd), Err(VerbsError::InvalidPd));
}
