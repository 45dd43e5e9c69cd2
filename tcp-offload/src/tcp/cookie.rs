//! SYN cookies (RFC 4987 §3.6): when a listener's backlog of half-open
//! connections is full, its SYN-ACK carries all the state in the ISN, so
//! that a SYN flood cannot exhaust memory and a genuine client still
//! completes its handshake. The table ([`super::Stack`]) answers such a SYN
//! statelessly and, when a bare ACK for a listener arrives, checks `ack − 1`
//! here to rebuild the connection.
//!
//! Layout of the 32-bit cookie, in the Linux style:
//!
//! ```text
//!  31    29 28   26 25                                0
//! +--------+-------+-----------------------------------+
//! |  slot  |  mss  |  SipHash(key, 4-tuple, peer ISN,  |
//! | mod 8  | index |        full slot, mss index)      |
//! +--------+-------+-----------------------------------+
//! ```
//!
//! The slot is a coarse clock of [`SLOT`] (64 s); a cookie is accepted in
//! its own slot and the [`MAX_AGE_SLOTS`] after it, so it lives between
//! 128 and 192 s. The MSS index names an entry of [`MSS_TABLE`]: the largest
//! not above what the peer offered. The 26-bit keyed hash binds both to the
//! connection, so a blind attacker must guess 2^26 values per tuple.
//!
//! Only the MSS survives: window scale, SACK-permitted and timestamps are
//! not encoded. A SYN-ACK sent with a cookie therefore offers the MSS alone,
//! and the connection built from the returning ACK uses none of those
//! options (RFC 7323 §1.3 and RFC 2018 §2 forbid using an option that the
//! SYN-ACK did not offer, so both ends agree).

use core::net::SocketAddrV4;
use core::time::Duration;

use super::isn::{siphash24, tuple_bytes};
use crate::seq::SeqNumber;
use crate::time::Instant;

/// MSS values a cookie can encode. 536 is the RFC 9293 §3.7.1 default for
/// a peer that sends no MSS option; 1220 covers IPv6-in-IPv4 tunnels and
/// other reduced MTUs; 1440 and 1460 are the Ethernet values with and
/// without timestamps; 8960 is a 9000-byte jumbo frame.
pub const MSS_TABLE: [u16; 5] = [536, 1220, 1440, 1460, 8960];

/// Length of one time slot of the cookie clock.
pub const SLOT: Duration = Duration::from_secs(64);

/// How many slots after its own a cookie is still accepted.
pub const MAX_AGE_SLOTS: u64 = 2;

const SLOT_SHIFT: u32 = 29;
const MSS_SHIFT: u32 = 26;
const HASH_MASK: u32 = (1 << MSS_SHIFT) - 1;
/// Separates the cookie hash from other uses of the same key (the ISN).
const DOMAIN: u8 = b'C';

/// What a valid cookie gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CookieInfo {
    /// The MSS the peer offered, rounded down to a [`MSS_TABLE`] entry.
    pub peer_mss: u16,
}

/// SYN cookie generator and checker, holding the secret key.
#[derive(Debug, Clone)]
pub struct SynCookies {
    key: [u8; 16],
}

fn slot_of(now: Instant) -> u64 {
    now.total_micros() / SLOT.as_micros() as u64
}

/// The table index for a peer's MSS option (absent: 536).
fn mss_index(peer_mss: Option<u16>) -> usize {
    let mss = peer_mss.unwrap_or(536);
    MSS_TABLE.iter().rposition(|&m| m <= mss).unwrap_or(0)
}

impl SynCookies {
    /// A cookie jar with a secret `key` (it may be the ISN key: the hash
    /// input is domain-separated).
    pub fn new(key: [u8; 16]) -> SynCookies {
        SynCookies { key }
    }

    fn hash(
        &self,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        peer_isn: SeqNumber,
        slot: u64,
        index: usize,
    ) -> u32 {
        let mut m = [0u8; 26];
        m[0] = DOMAIN;
        m[1..13].copy_from_slice(&tuple_bytes(local, remote));
        m[13..17].copy_from_slice(&peer_isn.0.to_be_bytes());
        m[17..25].copy_from_slice(&slot.to_be_bytes());
        m[25] = index as u8; // below MSS_TABLE.len()
        siphash24(&self.key, &m) as u32 & HASH_MASK
    }

    /// The cookie to use as our ISN in a SYN-ACK answering a SYN from
    /// `remote` to `local` with sequence number `peer_isn` and MSS option
    /// `peer_mss`, and the MSS it encodes.
    pub fn generate(
        &self,
        now: Instant,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        peer_isn: SeqNumber,
        peer_mss: Option<u16>,
    ) -> (SeqNumber, u16) {
        let slot = slot_of(now);
        let index = mss_index(peer_mss);
        let cookie = ((slot & 7) as u32) << SLOT_SHIFT
            | (index as u32) << MSS_SHIFT
            | self.hash(local, remote, peer_isn, slot, index);
        (SeqNumber(cookie), MSS_TABLE[index])
    }

    /// Checks the ACK completing a cookie handshake: `peer_isn` is the
    /// ACK's `seq − 1`, `cookie` its `ack − 1`. `None` when the hash does
    /// not match or the cookie is older than [`MAX_AGE_SLOTS`] slots.
    pub fn validate(
        &self,
        now: Instant,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        peer_isn: SeqNumber,
        cookie: SeqNumber,
    ) -> Option<CookieInfo> {
        let current = slot_of(now);
        let age = current.wrapping_sub(u64::from(cookie.0 >> SLOT_SHIFT)) & 7;
        if age > MAX_AGE_SLOTS || age > current {
            return None;
        }
        let slot = current - age;
        let index = ((cookie.0 >> MSS_SHIFT) & 7) as usize;
        let peer_mss = *MSS_TABLE.get(index)?;
        if cookie.0 & HASH_MASK != self.hash(local, remote, peer_isn, slot, index) {
            return None;
        }
        Some(CookieInfo { peer_mss })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    fn addr(a: u8, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(192, 168, 1, a), port)
    }

    const KEY: [u8; 16] = [0x5a; 16];

    #[test]
    fn round_trip_for_each_mss() {
        let c = SynCookies::new(KEY);
        let (l, r) = (addr(1, 5000), addr(2, 43210));
        let now = Instant::from_millis(1_000_000);
        for &mss in &MSS_TABLE {
            let isn = SeqNumber(0xdead_beef);
            let (cookie, enc) = c.generate(now, l, r, isn, Some(mss));
            assert_eq!(enc, mss);
            let got = c.validate(now + Duration::from_millis(300), l, r, isn, cookie);
            assert_eq!(got, Some(CookieInfo { peer_mss: mss }));
        }
        // Offers between table entries round down; no option means 536.
        assert_eq!(c.generate(now, l, r, SeqNumber(1), Some(1400)).1, 1220);
        assert_eq!(c.generate(now, l, r, SeqNumber(1), Some(9000)).1, 8960);
        assert_eq!(c.generate(now, l, r, SeqNumber(1), Some(100)).1, 536);
        let (cookie, enc) = c.generate(now, l, r, SeqNumber(1), None);
        assert_eq!(enc, 536);
        assert_eq!(
            c.validate(now, l, r, SeqNumber(1), cookie),
            Some(CookieInfo { peer_mss: 536 })
        );
    }

    #[test]
    fn wrong_tuple_isn_or_key_fails() {
        let c = SynCookies::new(KEY);
        let (l, r) = (addr(1, 5000), addr(2, 43210));
        let now = Instant::from_millis(77_000);
        let isn = SeqNumber(12345);
        let (cookie, _) = c.generate(now, l, r, isn, Some(1460));
        assert!(c.validate(now, l, r, isn, cookie).is_some());
        assert!(c.validate(now, l, addr(2, 43211), isn, cookie).is_none());
        assert!(c.validate(now, l, addr(3, 43210), isn, cookie).is_none());
        assert!(c.validate(now, addr(1, 5001), r, isn, cookie).is_none());
        assert!(c.validate(now, l, r, isn + 1, cookie).is_none());
        assert!(c.validate(now, l, r, isn, cookie + 1).is_none());
        // Another MSS index with the same hash bits fails.
        let tampered = SeqNumber(cookie.0 ^ (1 << MSS_SHIFT));
        assert!(c.validate(now, l, r, isn, tampered).is_none());
        assert!(SynCookies::new([1; 16])
            .validate(now, l, r, isn, cookie)
            .is_none());
    }

    #[test]
    fn slot_age_limits() {
        let c = SynCookies::new(KEY);
        let (l, r) = (addr(1, 5000), addr(2, 43210));
        let now = Instant::from_millis(10 * 64_000 + 5);
        let isn = SeqNumber(999);
        let (cookie, _) = c.generate(now, l, r, isn, Some(1460));
        for age in 0..=MAX_AGE_SLOTS {
            let later = now + SLOT * age as u32;
            assert!(c.validate(later, l, r, isn, cookie).is_some(), "age {age}");
        }
        for age in [MAX_AGE_SLOTS + 1, 8, 9, 100] {
            let later = now + SLOT * age as u32;
            assert!(c.validate(later, l, r, isn, cookie).is_none(), "age {age}");
        }
        // A cookie from the future (a slot not yet reached) fails too.
        assert!(c.validate(now - SLOT, l, r, isn, cookie).is_none());
        // Near the epoch, where the slot counter cannot go back.
        let (early, _) = c.generate(Instant::ZERO, l, r, isn, None);
        assert!(c
            .validate(Instant::from_millis(1), l, r, isn, early)
            .is_some());
    }

    #[test]
    fn blind_guesses_fail() {
        let c = SynCookies::new(KEY);
        let (l, r) = (addr(1, 5000), addr(2, 43210));
        let now = Instant::from_millis(500_000);
        // A fixed xorshift sequence of guesses: with a 26-bit hash and one
        // valid cookie per (slot, MSS), 20 000 guesses all fail (the chance
        // of any success is about 20 000 × 15 / 2^32).
        let mut x: u32 = 0x1234_5678;
        let mut accepted = 0;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if c.validate(now, l, r, SeqNumber(7), SeqNumber(x)).is_some() {
                accepted += 1;
            }
        }
        assert_eq!(accepted, 0);
    }
}
