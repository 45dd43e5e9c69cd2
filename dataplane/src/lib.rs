//! The iWARP dataplane: the only crate that does I/O. It brings up DPDK
//! through `dpdk-bindings`, runs the poll-mode workers that drive the
//! `tcp-offload` and `rdmap` engines, and offers the application API and the
//! `iwarp` command-line tool.
//!
//! The runtime lands in later increments; today the crate carries the
//! command-line skeleton and the integration test that runs the TCP engine
//! against the Linux kernel's TCP.
#![deny(unsafe_op_in_unsafe_fn)]
