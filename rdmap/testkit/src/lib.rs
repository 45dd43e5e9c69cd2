//! Test support for `rdmap` and the layers above it, kept out of the
//! protocol crate's public API: rdmap's tests and the dataplane's take it
//! as a dev-dependency.
//!
//! - [`message`]: the rules every connection-setup failure message
//!   follows (one sentence, no debug shapes, a remedy where the peer is
//!   at fault) and [`message::rule_broken`], which checks one.
#![forbid(unsafe_code)]

pub mod message;
