//! Test plumbing for running the TCP engine against the Linux kernel:
//! a network namespace joined by a veth pair ([`netns`]), a raw socket on
//! our end of it ([`raw`]), the I/O loop around the engine ([`driver`]),
//! the kernel's TCP peer ([`peer`]) and a bulk transfer between the two
//! ([`transfer`]).

pub mod driver;
pub mod netns;
pub mod peer;
pub mod raw;
pub mod transfer;
