//! Test plumbing for running the TCP engine against the Linux kernel: a
//! raw socket on our end of the namespace's veth pair (`Netns` of
//! `netns_common`, which the including test file declares) ([`raw`]), the
//! I/O loop around the engine ([`driver`]), the kernel's TCP peer
//! ([`peer`]), and a bulk transfer and a ping between the two
//! ([`transfer`]).

pub mod driver;
pub mod peer;
pub mod raw;
pub mod transfer;
