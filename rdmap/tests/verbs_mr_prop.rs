//! Random sequences of registration, fast registration, invalidation,
//! deregistration, pins and checks against a reference model of the STag
//! table: every check agrees with the model, and no check or pin ever yields
//! a range outside the span of a live, valid region of the right domain
//! that grants the right asked for.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rdmap::placement::{MemSpan, RegionHandle, RegionRef};
use rdmap::verbs::{
    Access, AccessError, DeregStatus, FastReg, MrEvent, MrKind, MrState, MrTable, PdId, RegOptions,
    Stag,
};

const CAPACITY: u32 = 6;

#[derive(Clone, Debug)]
enum Op {
    Reg {
        pd: u32,
        offset: u64,
        len: u64,
        high_iova: bool,
        access: u8,
        invalidatable: bool,
    },
    AllocMr {
        pd: u32,
        max_len: u64,
    },
    Dereg {
        pick: usize,
        wrong_key: bool,
    },
    InvalidateLocal {
        pick: usize,
        pd: u32,
    },
    InvalidateRemote {
        pick: usize,
        pd: u32,
    },
    FastReg {
        pick: usize,
        key: u8,
        offset: u64,
        len: u64,
        iova: u64,
        access: u8,
        pd: u32,
    },
    Check {
        pick: usize,
        raw_stag: Option<u32>,
        kind: u8,
        to_delta: i64,
        len: u32,
        pd: u32,
        edge: u8,
    },
    Pin {
        pick: usize,
        to_delta: i64,
        len: u32,
        pd: u32,
        remote: bool,
        edge: u8,
    },
    Unpin {
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let pd = 1u32..=2;
    prop_oneof![
        (
            pd.clone(),
            0u64..300,
            0u64..300,
            any::<bool>(),
            0u8..32,
            any::<bool>()
        )
            .prop_map(
                |(pd, offset, len, high_iova, access, invalidatable)| Op::Reg {
                    pd,
                    offset,
                    len,
                    high_iova,
                    access,
                    invalidatable
                }
            ),
        (pd.clone(), 0u64..200).prop_map(|(pd, max_len)| Op::AllocMr { pd, max_len }),
        (any::<usize>(), prop::bool::weighted(0.2))
            .prop_map(|(pick, wrong_key)| Op::Dereg { pick, wrong_key }),
        (any::<usize>(), pd.clone()).prop_map(|(pick, pd)| Op::InvalidateLocal { pick, pd }),
        (any::<usize>(), pd.clone()).prop_map(|(pick, pd)| Op::InvalidateRemote { pick, pd }),
        (
            any::<usize>(),
            any::<u8>(),
            0u64..300,
            0u64..300,
            prop_oneof![Just(0u64), Just(u64::MAX - 100), any::<u64>()],
            0u8..32,
            pd.clone()
        )
            .prop_map(|(pick, key, offset, len, iova, access, pd)| Op::FastReg {
                pick,
                key,
                offset,
                len,
                iova,
                access,
                pd
            }),
        (
            any::<usize>(),
            prop::option::weighted(0.2, any::<u32>()),
            0u8..3,
            -20i64..300,
            prop_oneof![0u32..300, Just(u32::MAX)],
            pd.clone(),
            0u8..6
        )
            .prop_map(
                |(pick, raw_stag, kind, to_delta, len, pd, edge)| Op::Check {
                    pick,
                    raw_stag,
                    kind,
                    to_delta,
                    len,
                    pd,
                    edge
                }
            ),
        (
            any::<usize>(),
            -20i64..300,
            0u32..300,
            pd,
            any::<bool>(),
            0u8..6
        )
            .prop_map(|(pick, to_delta, len, pd, remote, edge)| Op::Pin {
                pick,
                to_delta,
                len,
                pd,
                remote,
                edge
            }),
        any::<usize>().prop_map(|pick| Op::Unpin { pick }),
    ]
}

/// The model's view of one region.
#[derive(Clone, Debug)]
struct Model {
    stag: Stag,
    pd: PdId,
    kind: MrKind,
    state: MrState,
    access: Access,
    iova: u64,
    mem: MemSpan,
    max_len: u64,
    invalidatable: bool,
    pins: u32,
}

fn access(bits: u8) -> Access {
    let mut a = Access::NONE;
    for (bit, flag) in [
        (1, Access::LOCAL_WRITE),
        (2, Access::REMOTE_WRITE),
        (4, Access::REMOTE_READ),
        (8, Access::REMOTE_ATOMIC),
        (16, Access::MW_BIND),
    ] {
        if bits & bit != 0 {
            a |= flag;
        }
    }
    a
}

fn expected(
    models: &BTreeMap<u32, Model>,
    stag: Stag,
    to: u64,
    len: u32,
    pd: PdId,
    need: Access,
) -> Result<Option<(RegionHandle, u64, u32)>, AccessError> {
    if len == 0 {
        return Ok(None);
    }
    let m = models
        .get(&stag.index())
        .filter(|m| m.stag == stag)
        .ok_or(AccessError::InvalidStag)?;
    if m.state != MrState::Valid {
        return Err(AccessError::InvalidStag);
    }
    if m.pd != pd {
        return Err(AccessError::PdMismatch);
    }
    if !m.access.contains(need) {
        return Err(AccessError::AccessRights);
    }
    let end = to.checked_add(u64::from(len)).ok_or(AccessError::ToWrap)?;
    if to < m.iova || end > m.iova + m.mem.len {
        return Err(AccessError::BaseBounds);
    }
    Ok(Some((m.mem.region, m.mem.offset + (to - m.iova), len)))
}

/// Where an access goes: at a random offset from the region's base, or at
/// one of its edges (ending exactly at the bound or one past it, starting
/// one before the base, the whole region), where off-by-one errors live.
fn aim(models: &BTreeMap<u32, Model>, stag: Stag, edge: u8, to_delta: i64, len: u32) -> (u64, u32) {
    let (iova, mlen) = models
        .get(&stag.index())
        .map_or((0, 0), |m| (m.iova, m.mem.len));
    let fit = u64::from(len).min(mlen.max(1)) as u32;
    match edge {
        0 | 1 => (iova.wrapping_add_signed(to_delta), len),
        2 => (iova.wrapping_add(mlen - u64::from(fit).min(mlen)), fit),
        3 => (
            iova.wrapping_add(mlen + 1 - u64::from(fit).min(mlen + 1)),
            fit,
        ),
        4 => (iova.wrapping_sub(1), fit),
        _ => (iova, mlen.min(u64::from(u32::MAX)) as u32),
    }
}

fn pick_stag(models: &BTreeMap<u32, Model>, pick: usize) -> Stag {
    let mut indices: Vec<u32> = models.keys().copied().collect();
    indices.sort_unstable();
    if indices.is_empty() {
        Stag::new((pick % (CAPACITY as usize + 2)) as u32, 0)
    } else {
        models[&indices[pick % indices.len()]].stag
    }
}

fn in_live_span(
    models: &BTreeMap<u32, Model>,
    index: u32,
    region: RegionHandle,
    offset: u64,
    len: u32,
) -> bool {
    models.get(&index).is_some_and(|m| {
        m.mem.region == region
            && offset >= m.mem.offset
            && offset + u64::from(len) <= m.mem.offset + m.mem.len
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn stag_table_agrees_with_model(ops in prop::collection::vec(op(), 1..80)) {
        let mut t = MrTable::with_seed(CAPACITY, 7);
        let mut models: BTreeMap<u32, Model> = BTreeMap::new();
        // Held pins: the pin and the index of the region it pins, with the
        // span it was taken from (a fast re-registration may move the region).
        let mut pins: Vec<(RegionRef, u32, MemSpan)> = Vec::new();
        let region = RegionHandle(3);

        for op in ops {
            match op {
                Op::Reg { pd, offset, len, high_iova, access: bits, invalidatable } => {
                    let mem = MemSpan::new(region, offset, len);
                    let iova = if high_iova { u64::MAX - 200 } else { 0x1000 };
                    let a = access(bits);
                    let r = t.reg_mr_with(PdId(pd), mem, iova, a, RegOptions { invalidatable });
                    let valid = len > 0 && a.is_consistent() && iova.checked_add(len).is_some();
                    match r {
                        Ok(stag) => {
                            prop_assert!(valid);
                            prop_assert!(!models.contains_key(&stag.index()));
                            prop_assert!(stag.index() >= 1 && stag.index() <= CAPACITY);
                            models.insert(stag.index(), Model {
                                stag, pd: PdId(pd), kind: MrKind::Registered,
                                state: MrState::Valid, access: a, iova, mem,
                                max_len: len, invalidatable, pins: 0,
                            });
                        }
                        Err(_) => prop_assert!(!valid || models.len() == CAPACITY as usize),
                    }
                }
                Op::AllocMr { pd, max_len } => {
                    match t.alloc_mr(PdId(pd), max_len) {
                        Ok(stag) => {
                            prop_assert!(max_len > 0);
                            models.insert(stag.index(), Model {
                                stag, pd: PdId(pd), kind: MrKind::FastRegister,
                                state: MrState::Invalid, access: Access::NONE, iova: 0,
                                mem: MemSpan::new(RegionHandle(0), 0, 0), max_len,
                                invalidatable: true, pins: 0,
                            });
                        }
                        Err(_) => prop_assert!(max_len == 0 || models.len() == CAPACITY as usize),
                    }
                }
                Op::Dereg { pick, wrong_key } => {
                    let mut stag = pick_stag(&models, pick);
                    if wrong_key {
                        stag = stag.with_key(stag.key() ^ 1);
                    }
                    let r = t.dereg_mr(stag);
                    match models.get_mut(&stag.index()).filter(|m| m.stag == stag) {
                        Some(m) if m.state != MrState::Deregistering => {
                            if m.pins == 0 {
                                prop_assert_eq!(r, Ok(DeregStatus::Done));
                                models.remove(&stag.index());
                            } else {
                                prop_assert_eq!(r, Ok(DeregStatus::Pending));
                                m.state = MrState::Deregistering;
                            }
                        }
                        _ => prop_assert!(r.is_err()),
                    }
                }
                Op::InvalidateLocal { pick, pd } | Op::InvalidateRemote { pick, pd } => {
                    let remote = matches!(op, Op::InvalidateRemote { .. });
                    let stag = pick_stag(&models, pick);
                    let r = if remote {
                        t.invalidate_remote(stag, PdId(pd))
                    } else {
                        t.invalidate_local(stag, PdId(pd))
                    };
                    let want = match models.get_mut(&stag.index()).filter(|m| m.stag == stag) {
                        None => Err(AccessError::InvalidStag),
                        Some(m) if m.state == MrState::Deregistering => Err(AccessError::InvalidStag),
                        Some(m) if m.pd != PdId(pd) => Err(AccessError::PdMismatch),
                        Some(m) if !m.invalidatable || (remote && !m.access.is_remote()) => {
                            Err(AccessError::CannotInvalidate)
                        }
                        Some(m) => {
                            m.state = MrState::Invalid;
                            Ok(())
                        }
                    };
                    prop_assert_eq!(r, want);
                }
                Op::FastReg { pick, key, offset, len, iova, access: bits, pd } => {
                    let stag = pick_stag(&models, pick).with_key(key);
                    let wr = FastReg {
                        stag,
                        mem: MemSpan::new(region, offset, len),
                        iova,
                        access: access(bits),
                    };
                    let r = t.fast_register(&wr, PdId(pd));
                    let want = match models.get_mut(&stag.index()) {
                        None => Err(AccessError::InvalidStag),
                        Some(m) => match m.state {
                            MrState::Deregistering => Err(AccessError::InvalidStag),
                            MrState::Valid => Err(AccessError::InvalidOperation),
                            MrState::Invalid if m.kind != MrKind::FastRegister => {
                                Err(AccessError::InvalidOperation)
                            }
                            MrState::Invalid if m.pd != PdId(pd) => Err(AccessError::PdMismatch),
                            MrState::Invalid if !wr.access.is_consistent() => {
                                Err(AccessError::AccessRights)
                            }
                            MrState::Invalid
                                if len == 0 || len > m.max_len || iova.checked_add(len).is_none() =>
                            {
                                Err(AccessError::InvalidOperation)
                            }
                            MrState::Invalid => {
                                m.state = MrState::Valid;
                                m.stag = stag;
                                m.mem = wr.mem;
                                m.iova = iova;
                                m.access = wr.access;
                                Ok(())
                            }
                        },
                    };
                    prop_assert_eq!(r, want);
                }
                Op::Check { pick, raw_stag, kind, to_delta, len, pd, edge } => {
                    let stag = raw_stag.map(Stag).unwrap_or_else(|| pick_stag(&models, pick));
                    let (to, len) = aim(&models, stag, edge, to_delta, len);
                    let (need, got) = match kind {
                        0 => (Access::REMOTE_WRITE, t.check_remote_write(stag, to, len, PdId(pd))),
                        1 => (Access::REMOTE_READ, t.check_remote_read(stag, to, len, PdId(pd))),
                        _ => (Access::LOCAL_WRITE, t.check_local(stag, to, len, PdId(pd), Access::LOCAL_WRITE)),
                    };
                    let got = got.map(|r| r.map(|r| (r.region(), r.offset(), r.len())));
                    let want = expected(&models, stag, to, len, PdId(pd), need);
                    prop_assert_eq!(got, want);
                    if let Ok(Some((region, offset, len))) = got {
                        prop_assert!(in_live_span(&models, stag.index(), region, offset, len));
                    }
                }
                Op::Pin { pick, to_delta, len, pd, remote, edge } => {
                    let stag = pick_stag(&models, pick);
                    let (to, len) = aim(&models, stag, edge, to_delta, len);
                    let (need, got) = if remote {
                        (Access::REMOTE_READ, t.pin_remote_read(stag, to, len, PdId(pd)))
                    } else {
                        (Access::NONE, t.pin_local(stag, to, len, PdId(pd), Access::NONE))
                    };
                    let want = expected(&models, stag, to, len, PdId(pd), need);
                    match got {
                        Ok(Some(pin)) => {
                            let r = pin.range();
                            prop_assert_eq!(want, Ok(Some((r.region(), r.offset(), r.len()))));
                            let m = models.get_mut(&stag.index()).unwrap();
                            m.pins += 1;
                            let span = m.mem;
                            pins.push((pin, stag.index(), span));
                        }
                        other => prop_assert_eq!(other.map(|_| None::<()>), want.map(|_| None::<()>)),
                    }
                }
                Op::Unpin { pick } => {
                    if pins.is_empty() {
                        continue;
                    }
                    let (pin, index, _) = pins.swap_remove(pick % pins.len());
                    t.unpin(pin);
                    let m = models.get_mut(&index).unwrap();
                    m.pins -= 1;
                    if m.pins == 0 && m.state == MrState::Deregistering {
                        let stag = m.stag;
                        models.remove(&index);
                        prop_assert_eq!(t.poll_event(), Some(MrEvent::Deregistered(stag)));
                    }
                    prop_assert_eq!(t.poll_event(), None);
                }
            }

            // Invariants after every step.
            prop_assert_eq!(t.len() as usize, models.len());
            for (index, m) in &models {
                let info = t.query_mr(Stag::new(*index, 0)).unwrap();
                prop_assert_eq!(info.stag, m.stag);
                prop_assert_eq!(info.state, m.state);
                prop_assert_eq!(info.pins, m.pins);
            }
            for (pin, index, span) in &pins {
                // A pinned region is never freed, and the pin's bytes lie in
                // the span it was taken from.
                prop_assert!(models.contains_key(index));
                let r = pin.range();
                prop_assert!(r.region() == span.region
                    && r.offset() >= span.offset
                    && r.offset() + u64::from(r.len()) <= span.offset + span.len);
                prop_assert!(r.offset() + u64::from(r.len()) <= 600);
            }
        }
        for (pin, _, _) in pins {
            t.unpin(pin);
        }
    }
}
