//! The bytes of perftest's control messages: each is the whole payload of
//! one Send on the control connection, in network byte order, with the
//! exact length perftest gives it (perftest reads each into the one
//! receive buffer it keeps posted and takes the first bytes it expects).
//!
//! Layouts follow perftest's `perftest_communication.c` (`exchange_versions`,
//! `check_sys_data`, `check_mtu`, `rdma_write_keys`, `xchg_bw_reports`) and
//! `perftest_resources.h` (`struct pingpong_dest`), tag v4.5-0.18, checked
//! against the captures in `deploy/interop/captures/`. Parsing is strict
//! about lengths and lenient about fields perftest itself ignores (the
//! padding word of `pingpong_dest` carries stack garbage in the captures).

use core::fmt;

/// The version string we send: perftest 4.5-0.18's (Debian 12), whose
/// exchange this module speaks.
pub const OUR_VERSION: &str = "6.06";
/// Length of the version message (`MAX_VERSION`).
pub const VERSION_LEN: usize = 16;
/// Length of the cycle-buffer and cache-line messages (a C `int`).
pub const SYS_LEN: usize = 4;
/// Length of the MTU message (two characters since perftest 5.31).
pub const MTU_LEN: usize = 2;
/// Length of each of the five bandwidth-report messages.
pub const REPORT_FIELD_LEN: usize = 8;
/// Our cycle buffer (perftest: the page size).
pub const CYCLE_BUFFER: u32 = 4096;
/// Our cache line (perftest: the CPU's, 64 on x86).
pub const CACHE_LINE: u32 = 64;

/// Oldest peer perftest talks to (`check_version_compatibility`: 5.70),
/// in hundredths.
pub const MIN_PEER_VERSION: u32 = 570;
/// First version whose `pingpong_dest` carries `tail_markers_vaddr`
/// (perftest 26.04, version 6.29): 64 bytes instead of 56.
pub const TAIL_MARKERS_VERSION: u32 = 629;

/// Why a control message was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// Not the length this message has.
    Length {
        /// Which message.
        what: &'static str,
        /// Its length.
        expected: usize,
        /// What arrived.
        got: usize,
    },
    /// The version message is not a perftest version string.
    Version(String),
    /// The peer's perftest is older than any this exchange speaks to.
    TooOld(String),
    /// The MTU message is not an IB MTU code.
    Mtu([u8; 2]),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Length {
                what,
                expected,
                got,
            } => {
                write!(f, "{what}: {got} bytes where perftest sends {expected}")
            }
            WireError::Version(v) => write!(f, "not a perftest version string: {v:?}"),
            WireError::TooOld(v) => write!(
                f,
                "peer perftest version {v} is older than 5.70, which perftest refuses too"
            ),
            WireError::Mtu(b) => write!(f, "not an IB MTU code: {b:02x?}"),
        }
    }
}

impl std::error::Error for WireError {}

fn exact<'a>(what: &'static str, msg: &'a [u8], len: usize) -> Result<&'a [u8], WireError> {
    if msg.len() == len {
        Ok(msg)
    } else {
        Err(WireError::Length {
            what,
            expected: len,
            got: msg.len(),
        })
    }
}

/// A peer's perftest version, e.g. "6.06".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    text: String,
    /// The value as perftest's `atof` comparisons see it, in hundredths
    /// (a third decimal digit never matters to them).
    hundredths: u32,
}

impl Version {
    /// The string as sent.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The value in hundredths ("6.06" is 606, "5.7" is 570).
    pub fn hundredths(&self) -> u32 {
        self.hundredths
    }

    /// Parses perftest's version message: ASCII digits, a dot, digits,
    /// NUL-padded to 16 bytes.
    pub fn parse(msg: &[u8]) -> Result<Version, WireError> {
        let msg = exact("version", msg, VERSION_LEN)?;
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = &msg[..end];
        let shown = String::from_utf8_lossy(text).into_owned();
        let bad = || WireError::Version(shown.clone());
        if msg[end..].iter().any(|&b| b != 0) {
            return Err(bad());
        }
        let s = core::str::from_utf8(text).map_err(|_| bad())?;
        let (major, minor) = s.split_once('.').ok_or_else(bad)?;
        let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        if !digits(major) || !digits(minor) || major.len() > 4 {
            return Err(bad());
        }
        let major: u32 = major.parse().map_err(|_| bad())?;
        let mut frac = 0;
        for (i, b) in minor
            .bytes()
            .chain(core::iter::repeat(b'0'))
            .take(2)
            .enumerate()
        {
            frac += u32::from(b - b'0') * if i == 0 { 10 } else { 1 };
        }
        Ok(Version {
            text: s.to_string(),
            hundredths: major * 100 + frac,
        })
    }

    /// Checks that perftest of this version is one this exchange speaks to.
    pub fn check_supported(&self) -> Result<(), WireError> {
        if self.hundredths < MIN_PEER_VERSION {
            return Err(WireError::TooOld(self.text.clone()));
        }
        Ok(())
    }

    /// The `pingpong_dest` layout a peer of this version sends and reads.
    pub fn dest_layout(&self) -> DestLayout {
        if self.hundredths >= TAIL_MARKERS_VERSION {
            DestLayout::TailMarkers
        } else {
            DestLayout::V45
        }
    }
}

/// Our version message.
pub fn emit_version() -> Vec<u8> {
    let mut out = vec![0u8; VERSION_LEN];
    out[..OUR_VERSION.len()].copy_from_slice(OUR_VERSION.as_bytes());
    out
}

/// A 4-byte big-endian `int` (cycle buffer, cache line).
pub fn emit_u32(v: u32) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

/// Parses a 4-byte big-endian `int`.
pub fn parse_u32(what: &'static str, msg: &[u8]) -> Result<u32, WireError> {
    let m = exact(what, msg, SYS_LEN)?;
    Ok(u32::from_be_bytes([m[0], m[1], m[2], m[3]]))
}

/// The IB MTU code (`enum ibv_mtu`: 1 = 256 … 5 = 4096) an iWARP device
/// reports for a link MTU: the largest IB MTU that fits (1500 gives 3).
pub fn ib_mtu_code(link_mtu: usize) -> u8 {
    match link_mtu {
        0..=511 => 1,
        512..=1023 => 2,
        1024..=2047 => 3,
        2048..=4095 => 4,
        _ => 5,
    }
}

/// The MTU message: the code as a decimal digit and a NUL (perftest
/// `sprintf`s the enum and sends the first two bytes).
pub fn emit_mtu(code: u8) -> Vec<u8> {
    vec![b'0' + code.min(9), 0]
}

/// Parses the MTU message into the IB MTU code.
pub fn parse_mtu(msg: &[u8]) -> Result<u8, WireError> {
    let m = exact("MTU", msg, MTU_LEN)?;
    match (m[0], m[1]) {
        (d @ b'1'..=b'5', 0) => Ok(d - b'0'),
        _ => Err(WireError::Mtu([m[0], m[1]])),
    }
}

/// Which `struct pingpong_dest` a peer speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestLayout {
    /// perftest up to 6.28 (4.5 included): 56 bytes.
    V45,
    /// perftest 6.29 and later: `tail_markers_vaddr` after `vaddr`, 64
    /// bytes.
    TailMarkers,
}

impl DestLayout {
    /// Its length.
    pub fn bytes(self) -> usize {
        match self {
            DestLayout::V45 => 56,
            DestLayout::TailMarkers => 64,
        }
    }
}

/// perftest's `pingpong_dest`: what one side says about one data QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// IB LID (0 on iWARP).
    pub lid: u32,
    /// Outstanding RDMA Reads (1 outside the read tests).
    pub out_reads: u32,
    /// The QP number.
    pub qpn: u32,
    /// A random 24-bit PSN (unused on iWARP).
    pub psn: u32,
    /// The STag of the buffer the peer is to write, read, or (send tests
    /// on iWARP) write credits into.
    pub rkey: u32,
    /// Its tagged offset.
    pub vaddr: u64,
    /// Newer perftest's data-validation markers (0 from us).
    pub tail_markers_vaddr: u64,
    /// The GID (siw: the MAC, then zeros).
    pub gid: [u8; 16],
    /// XRC/DC SRQ number (0).
    pub srqn: u32,
    /// GID index.
    pub gid_index: u32,
}

impl Dest {
    /// The message, in `layout`. The padding word before `vaddr` is zero.
    pub fn emit(&self, layout: DestLayout) -> Vec<u8> {
        let mut out = Vec::with_capacity(layout.bytes());
        for v in [self.lid, self.out_reads, self.qpn, self.psn, self.rkey, 0] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&self.vaddr.to_be_bytes());
        if layout == DestLayout::TailMarkers {
            out.extend_from_slice(&self.tail_markers_vaddr.to_be_bytes());
        }
        out.extend_from_slice(&self.gid);
        out.extend_from_slice(&self.srqn.to_be_bytes());
        out.extend_from_slice(&self.gid_index.to_be_bytes());
        out
    }

    /// Parses a message in `layout`; the padding word is ignored.
    pub fn parse(msg: &[u8], layout: DestLayout) -> Result<Dest, WireError> {
        let m = exact("pingpong_dest", msg, layout.bytes())?;
        let u32_at = |o: usize| u32::from_be_bytes([m[o], m[o + 1], m[o + 2], m[o + 3]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&m[o..o + 8]);
            u64::from_be_bytes(b)
        };
        let (tail, gid_at) = match layout {
            DestLayout::V45 => (0, 32),
            DestLayout::TailMarkers => (u64_at(32), 40),
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&m[gid_at..gid_at + 16]);
        Ok(Dest {
            lid: u32_at(0),
            out_reads: u32_at(4),
            qpn: u32_at(8),
            psn: u32_at(12),
            rkey: u32_at(16),
            vaddr: u64_at(24),
            tail_markers_vaddr: tail,
            gid,
            srqn: u32_at(gid_at + 16),
            gid_index: u32_at(gid_at + 20),
        })
    }
}

/// The five fields of the bandwidth report, in the order sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportField {
    /// Message size (`unsigned long`).
    Size,
    /// Iterations (`uint64_t`, peers 5.33 and later).
    Iters,
    /// Peak bandwidth (`double`).
    BwPeak,
    /// Average bandwidth (`double`).
    BwAvg,
    /// Message rate (`double`).
    MsgRate,
}

impl ReportField {
    /// All of them, in wire order.
    pub const ALL: [ReportField; 5] = [
        ReportField::Size,
        ReportField::Iters,
        ReportField::BwPeak,
        ReportField::BwAvg,
        ReportField::MsgRate,
    ];

    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            ReportField::Size => "report: size",
            ReportField::Iters => "report: iterations",
            ReportField::BwPeak => "report: peak bandwidth",
            ReportField::BwAvg => "report: average bandwidth",
            ReportField::MsgRate => "report: message rate",
        }
    }
}

/// One report field's message: integers as big-endian 64-bit words,
/// doubles as their IEEE-754 bits byte-swapped to big-endian (perftest's
/// `hton_double`).
pub fn emit_report_field(r: &super::BwFigures, f: ReportField) -> Vec<u8> {
    let word = match f {
        ReportField::Size => r.size,
        ReportField::Iters => r.iters,
        ReportField::BwPeak => r.bw_peak.to_bits(),
        ReportField::BwAvg => r.bw_avg.to_bits(),
        ReportField::MsgRate => r.msg_rate.to_bits(),
    };
    word.to_be_bytes().to_vec()
}

/// Parses one report field's message into `r`.
pub fn parse_report_field(
    r: &mut super::BwFigures,
    f: ReportField,
    msg: &[u8],
) -> Result<(), WireError> {
    let m = exact(f.name(), msg, REPORT_FIELD_LEN)?;
    let mut b = [0u8; 8];
    b.copy_from_slice(m);
    let word = u64::from_be_bytes(b);
    match f {
        ReportField::Size => r.size = word,
        ReportField::Iters => r.iters = word,
        ReportField::BwPeak => r.bw_peak = f64::from_bits(word),
        ReportField::BwAvg => r.bw_avg = f64::from_bits(word),
        ReportField::MsgRate => r.msg_rate = f64::from_bits(word),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QP 0 of ib_write_bw's client in write_bw.pcap (frame 45).
    const CAPTURED: &str = "000000000000000100000002007faaa8b1d7e1000000000000007fca287fa000\
                            52540077000c000000000000000000000000000000000000";

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn captured_dest_parses_and_reemits() {
        let bytes = unhex(CAPTURED);
        let d = Dest::parse(&bytes, DestLayout::V45).unwrap();
        assert_eq!(d.out_reads, 1);
        assert_eq!(d.qpn, 2);
        assert_eq!(d.psn, 0x7faaa8);
        assert_eq!(d.rkey, 0xb1d7_e100);
        assert_eq!(d.vaddr, 0x7fca_287f_a000);
        assert_eq!(&d.gid[..6], &[0x52, 0x54, 0, 0x77, 0, 0x0c]);
        assert_eq!(d.emit(DestLayout::V45), bytes);
        let wide = d.emit(DestLayout::TailMarkers);
        assert_eq!(wide.len(), 64);
        assert_eq!(Dest::parse(&wide, DestLayout::TailMarkers).unwrap(), d);
        assert!(matches!(
            Dest::parse(&wide, DestLayout::V45),
            Err(WireError::Length {
                expected: 56,
                got: 64,
                ..
            })
        ));
    }

    #[test]
    fn versions() {
        assert_eq!(emit_version(), b"6.06\0\0\0\0\0\0\0\0\0\0\0\0");
        let v = Version::parse(&emit_version()).unwrap();
        assert_eq!((v.as_str(), v.hundredths()), ("6.06", 606));
        assert_eq!(v.dest_layout(), DestLayout::V45);
        let mut m = [0u8; 16];
        m[..4].copy_from_slice(b"6.29");
        assert_eq!(
            Version::parse(&m).unwrap().dest_layout(),
            DestLayout::TailMarkers
        );
        m[..4].copy_from_slice(b"5.6\0");
        let old = Version::parse(&m).unwrap();
        assert_eq!(old.hundredths(), 560);
        assert!(matches!(old.check_supported(), Err(WireError::TooOld(_))));
        m[..4].copy_from_slice(b"six\0");
        assert!(matches!(Version::parse(&m), Err(WireError::Version(_))));
        m[..4].copy_from_slice(b"6.06");
        m[10] = b'x';
        assert!(matches!(Version::parse(&m), Err(WireError::Version(_))));
        assert!(matches!(
            Version::parse(b"6.06"),
            Err(WireError::Length {
                expected: 16,
                got: 4,
                ..
            })
        ));
    }

    #[test]
    fn mtu_and_sys() {
        assert_eq!(emit_mtu(ib_mtu_code(1500)), b"3\0");
        assert_eq!(ib_mtu_code(9000), 5);
        assert_eq!(parse_mtu(b"3\0"), Ok(3));
        assert!(matches!(parse_mtu(b"9\0"), Err(WireError::Mtu(_))));
        assert!(matches!(parse_mtu(b"3"), Err(WireError::Length { .. })));
        assert_eq!(emit_u32(4096), [0, 0, 0x10, 0]);
        assert_eq!(parse_u32("cycle buffer", &[0, 0, 0, 0x40]), Ok(64));
    }

    #[test]
    fn report_round_trip() {
        let r = super::super::BwFigures {
            size: 65536,
            iters: 200,
            bw_peak: 1234.5,
            bw_avg: 1200.25,
            msg_rate: 0.019,
        };
        let mut back = super::super::BwFigures::default();
        for f in ReportField::ALL {
            let m = emit_report_field(&r, f);
            assert_eq!(m.len(), 8);
            parse_report_field(&mut back, f, &m).unwrap();
        }
        assert_eq!(back, r);
        assert_eq!(
            emit_report_field(&r, ReportField::Size),
            [0, 0, 0, 0, 0, 1, 0, 0]
        );
        assert_eq!(
            emit_report_field(&r, ReportField::BwPeak),
            1234.5f64.to_bits().to_be_bytes()
        );
    }
}
