//! Test plumbing for running the TCP engine against the Linux kernel:
//! a network namespace joined by a veth pair ([`netns`]), a raw socket on
//! our end of it ([`raw`]), and the kernel's TCP peer ([`peer`]).

pub mod netns;
pub mod peer;
pub mod raw;
