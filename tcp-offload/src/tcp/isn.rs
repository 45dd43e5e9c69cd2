//! Initial sequence numbers per RFC 6528 §3: ISN = M + F(4-tuple, secret),
//! where M is a clock ticking every 4 µs (here derived from the caller's
//! `now`, since the engine reads no clock) and F is SipHash-2-4 keyed with
//! a 16-byte secret over the connection's addresses and ports. The clock
//! keeps successive incarnations of one 4-tuple moving forward (RFC 9293
//! §3.4.1); the keyed hash keeps an off-path attacker from predicting the
//! ISN of a connection whose tuple it does not share.
//!
//! The SipHash-2-4 here (Aumasson and Bernstein, 2012) is also used by the
//! SYN cookies and is small enough to carry rather than depend on.

use core::net::SocketAddrV4;

use crate::seq::SeqNumber;
use crate::time::Instant;

/// One SipHash round on the four state words.
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13);
    v[1] ^= v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17);
    v[1] ^= v[2];
    v[2] = v[2].rotate_left(32);
}

/// SipHash-2-4 of `data` under `key`: a keyed pseudo-random function, so
/// its output cannot be predicted or forged without the key. Allocates
/// nothing.
pub fn siphash24(key: &[u8; 16], data: &[u8]) -> u64 {
    let mut k = [0u8; 8];
    k.copy_from_slice(&key[..8]);
    let k0 = u64::from_le_bytes(k);
    k.copy_from_slice(&key[8..]);
    let k1 = u64::from_le_bytes(k);
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        let m = u64::from_le_bytes(b);
        v[3] ^= m;
        sip_round(&mut v);
        sip_round(&mut v);
        v[0] ^= m;
    }
    // The last block: the remaining bytes, and the length's low byte on top.
    let mut last = [0u8; 8];
    let rest = words.remainder();
    last[..rest.len()].copy_from_slice(rest);
    last[7] = data.len() as u8; // the length modulo 256, by definition
    let m = u64::from_le_bytes(last);
    v[3] ^= m;
    sip_round(&mut v);
    sip_round(&mut v);
    v[0] ^= m;
    v[2] ^= 0xff;
    for _ in 0..4 {
        sip_round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// The 12 bytes naming a connection: local address and port, then remote.
pub(crate) fn tuple_bytes(local: SocketAddrV4, remote: SocketAddrV4) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0..4].copy_from_slice(&local.ip().octets());
    b[4..6].copy_from_slice(&local.port().to_be_bytes());
    b[6..10].copy_from_slice(&remote.ip().octets());
    b[10..12].copy_from_slice(&remote.port().to_be_bytes());
    b
}

/// ISN generator holding the secret key.
#[derive(Debug, Clone)]
pub struct IsnGenerator {
    key: [u8; 16],
}

impl IsnGenerator {
    /// A generator with a secret `key`; the dataplane draws it from the OS
    /// at start-up, tests fix it.
    pub fn new(key: [u8; 16]) -> IsnGenerator {
        IsnGenerator { key }
    }

    /// The ISN for a connection from `local` to `remote` at `now`.
    pub fn isn(&self, now: Instant, local: SocketAddrV4, remote: SocketAddrV4) -> SeqNumber {
        // M: the 4 µs clock, modulo 2^32 (it wraps every 4.77 hours, as the
        // RFC 793 clock did).
        let m = (now.total_micros() / 4) as u32;
        let f = siphash24(&self.key, &tuple_bytes(local, remote)) as u32;
        SeqNumber(m.wrapping_add(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    fn key() -> [u8; 16] {
        core::array::from_fn(|i| i as u8)
    }

    #[test]
    fn siphash_reference_vectors() {
        // The SipHash paper's Appendix A example: key 00..0f, message 00..0e.
        let msg: [u8; 15] = core::array::from_fn(|i| i as u8);
        assert_eq!(siphash24(&key(), &msg), 0xa129_ca61_49be_45e5);
        // The first and ninth entries of the reference implementation's
        // vector table (messages 00..len-1 for len 0 and 8).
        assert_eq!(siphash24(&key(), &[]), 0x726f_db47_dd0e_0e31);
        let msg8: [u8; 8] = core::array::from_fn(|i| i as u8);
        assert_eq!(siphash24(&key(), &msg8), 0x93f5_f579_9a93_2462);
    }

    fn addr(a: u8, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, a), port)
    }

    #[test]
    fn tuples_give_different_isns() {
        let g = IsnGenerator::new(key());
        let now = Instant::from_millis(1234);
        let base = g.isn(now, addr(1, 80), addr(2, 40000));
        assert_ne!(base, g.isn(now, addr(1, 80), addr(2, 40001)));
        assert_ne!(base, g.isn(now, addr(1, 81), addr(2, 40000)));
        assert_ne!(base, g.isn(now, addr(3, 80), addr(2, 40000)));
        assert_ne!(base, g.isn(now, addr(2, 40000), addr(1, 80)));
        // Same tuple, same time: same ISN; another key: another ISN.
        assert_eq!(base, g.isn(now, addr(1, 80), addr(2, 40000)));
        let other = IsnGenerator::new([7; 16]);
        assert_ne!(base, other.isn(now, addr(1, 80), addr(2, 40000)));
    }

    #[test]
    fn isn_grows_with_time() {
        let g = IsnGenerator::new(key());
        let (l, r) = (addr(1, 80), addr(2, 40000));
        let t0 = Instant::from_millis(10);
        let a = g.isn(t0, l, r);
        let b = g.isn(t0 + core::time::Duration::from_micros(4), l, r);
        let c = g.isn(t0 + core::time::Duration::from_secs(1), l, r);
        assert_eq!(b, a + 1);
        assert_eq!(c, a + 250_000);
        assert!(a < b && b < c);
    }
}
