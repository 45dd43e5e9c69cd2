//! Results of perf runs and the demo: perftest-like tables and JSON.
