//! Every connection-setup failure reads as one sentence: each error type's
//! `ALL` list is walked through the rules of `rdmap_testkit::message` (one
//! line, no debug shapes or variant names, a remedy after "; " wherever
//! the peer is at fault). The `variant` functions below match every
//! variant without a wildcard, so a new variant does not compile until it
//! is given a number here, and the test fails until `ALL` holds it.

use rdmap::engine::SetupFailure;
use rdmap::mpa::frame::FrameKind;
use rdmap::mpa::{FrameError, NegotiationError, RejectReason, SetupError};
use rdmap::verbs::VerbsError;
use rdmap_testkit::message::rule_broken;

fn frame_variant(e: &FrameError) -> usize {
    match e {
        FrameError::Truncated => 0,
        FrameError::BadKey => 1,
        FrameError::BadRevision(_) => 2,
        FrameError::TooMuchPrivateData(_) => 3,
        FrameError::MissingIrdOrd => 4,
        FrameError::BadIrdOrd => 5,
        FrameError::BufferTooShort => 6,
    }
}

fn negotiation_variant(e: &NegotiationError) -> usize {
    match e {
        NegotiationError::Timeout => 0,
        NegotiationError::Frame(_) => 1,
        NegotiationError::UnexpectedFrame(_) => 2,
        NegotiationError::RevisionMismatch { .. } => 3,
        NegotiationError::MarkersRefused(_) => 4,
        NegotiationError::InsufficientIrd { .. } => 5,
        NegotiationError::NoMatchingRtr { .. } => 6,
        NegotiationError::CrcNotHonoured(_) => 7,
    }
}

fn reject_variant(r: &RejectReason) -> usize {
    match r {
        RejectReason::ByPeer => 0,
        RejectReason::ByApplication => 1,
        RejectReason::MarkersRefused => 2,
        RejectReason::NoMatchingRtr { .. } => 3,
        RejectReason::CrcRequired => 4,
    }
}

fn setup_error_variant(e: &SetupError) -> usize {
    match e {
        SetupError::BadRevision(_) => 0,
        SetupError::PrivateDataTooLong { .. } => 1,
        SetupError::NoPendingRequest => 2,
    }
}

fn setup_failure_variant(f: &SetupFailure) -> usize {
    match f {
        SetupFailure::Negotiation(_) => 0,
        SetupFailure::UnexpectedData => 1,
        SetupFailure::QueuePair(_) => 2,
        SetupFailure::StreamClosed => 3,
    }
}

fn verbs_variant(e: &VerbsError) -> usize {
    match e {
        VerbsError::InvalidPd => 0,
        VerbsError::InvalidCq => 1,
        VerbsError::InvalidSrq => 2,
        VerbsError::InvalidStag => 3,
        VerbsError::Busy => 4,
        VerbsError::TableFull => 5,
        VerbsError::InvalidAccess => 6,
        VerbsError::InvalidLength => 7,
        VerbsError::AddressOverflow => 8,
        VerbsError::InvalidValue => 9,
        VerbsError::InvalidTransition => 10,
    }
}

/// Checks that `all` holds each of `count` variants and that every
/// message keeps the rules; returns how many messages it read.
fn walk<T: std::fmt::Display>(
    name: &str,
    all: &[T],
    count: usize,
    variant: impl Fn(&T) -> usize,
    needs_remedy: impl Fn(&T) -> bool,
) -> usize {
    let mut seen = vec![false; count];
    for item in all {
        seen[variant(item)] = true;
        let m = item.to_string();
        if let Some(why) = rule_broken(&m, needs_remedy(item)) {
            panic!("{name}: {why}: {m:?}");
        }
    }
    let missing: Vec<usize> = (0..count).filter(|i| !seen[*i]).collect();
    assert!(missing.is_empty(), "{name}::ALL lacks variants {missing:?}");
    all.len()
}

#[test]
fn every_setup_failure_is_one_sentence_with_a_remedy() {
    let mut n = 0;
    // A frame error alone does not say whose frame it is: no remedy.
    n += walk("FrameError", FrameError::ALL, 7, frame_variant, |_| false);
    n += walk(
        "NegotiationError",
        NegotiationError::ALL,
        8,
        negotiation_variant,
        |_| true,
    );
    n += walk("RejectReason", RejectReason::ALL, 5, reject_variant, |r| {
        r.peer_at_fault()
    });
    n += walk(
        "SetupError",
        SetupError::ALL,
        3,
        setup_error_variant,
        |_| true,
    );
    n += walk("VerbsError", VerbsError::ALL, 11, verbs_variant, |_| false);
    n += walk(
        "SetupFailure",
        &SetupFailure::all(),
        4,
        setup_failure_variant,
        SetupFailure::peer_at_fault,
    );
    // Every frame error is also read as the peer's, with its remedy.
    for e in FrameError::ALL {
        let m = NegotiationError::Frame(*e).to_string();
        assert_eq!(rule_broken(&m, true), None, "{m}");
        n += 1;
    }
    // Every kind of unexpected frame, in both roles.
    for k in [FrameKind::Request, FrameKind::Reply, FrameKind::Reject] {
        let m = NegotiationError::UnexpectedFrame(k).to_string();
        assert_eq!(rule_broken(&m, true), None, "{m}");
        n += 1;
    }
    println!("{n} setup failure messages read as one sentence each");
    for e in NegotiationError::ALL {
        println!("  {e}");
    }
}
