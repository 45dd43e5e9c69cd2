//! Deterministic network simulation on virtual time.
