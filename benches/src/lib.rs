//! Shared helpers for the benchmarks in `benches/benches/`.
