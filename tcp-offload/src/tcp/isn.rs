//! Initial sequence numbers per RFC 6528: ISN = M + F(4-tuple, secret),
//! where M is a 4 µs clock (here derived from the caller's `now`) and F a
//! keyed hash (SipHash-2-4) of the connection's addresses and ports.

use core::net::SocketAddrV4;

use crate::seq::SeqNumber;
use crate::time::Instant;

/// ISN generator holding the secret key.
#[derive(Debug, Clone)]
pub struct IsnGenerator {
    _key: [u8; 16],
}

impl IsnGenerator {
    /// A generator with a secret `key`; the dataplane draws it from the OS
    /// at start-up, tests fix it.
    pub fn new(key: [u8; 16]) -> IsnGenerator {
        IsnGenerator { _key: key }
    }

    /// The ISN for a connection from `local` to `remote` at `now`.
    pub fn isn(&self, now: Instant, local: SocketAddrV4, remote: SocketAddrV4) -> SeqNumber {
        let _ = (now, local, remote);
        unimplemented!()
    }
}
