//! The order of perftest's control messages as a pure state machine: no
//! connection, no clock. [`super::Session`] drives it over the dataplane;
//! the replay test drives it with the messages of a capture.
//!
//! Every step is one exchange in which the client sends first and the
//! server answers (perftest's `ctx_xchg_data` / `ctx_hand_shake`: the side
//! with a server name writes, then reads). Between exchanges sit the
//! points where the caller acts: the data connections, and the measured
//! loop of each size (one, or the 23 of an `-a` run). The script per test is
//! in the module documentation of [`super`].

use super::wire::{
    emit_mtu, emit_report_field, emit_u32, emit_version, parse_mtu, parse_report_field, parse_u32,
    Dest, DestLayout, ReportField, Version, WireError, CACHE_LINE, CYCLE_BUFFER,
};
use super::BwFigures;
use crate::runner::TestKind as Kind;

/// Which end of the control connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// perftest's client: connects, speaks first in every exchange.
    Client,
    /// perftest's server.
    Server,
}

/// One message kind of the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// The 16-byte version string.
    Version,
    /// The cycle buffer (page size).
    CycleBuffer,
    /// The cache line size.
    CacheLine,
    /// The MTU code as two characters.
    Mtu,
    /// A zeroed `pingpong_dest` (the syncs around the data connections:
    /// perftest sends its still-zeroed array there).
    ZeroDest,
    /// QP `i`'s `pingpong_dest` (QP 0's for the plain syncs).
    Dest(usize),
    /// A field of the bandwidth report.
    Report(ReportField),
}

/// A step of the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// One exchange; `what` names it in errors.
    Exchange(Msg, &'static str),
    /// Make the data connections now (client: connect, server: accept).
    ConnectData,
    /// Run the measured loop of the next size (one per size of an `-a`
    /// run; the first ends the setup).
    Run,
}

/// What the caller is to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send these bytes as one Send (the machine has moved on).
    Send(Vec<u8>),
    /// Wait for the peer's next message, which is this step's.
    Receive(&'static str),
    /// Make the data connections, then [`Exchange::proceed`].
    ConnectData,
    /// Run the measured loop of the next size, then
    /// [`Exchange::proceed`].
    Run,
    /// Nothing is left to exchange.
    Done,
}

/// Why the exchange cannot go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExchangeError {
    /// A message arrived malformed.
    Wire {
        /// The step.
        what: &'static str,
        /// What is wrong.
        err: WireError,
    },
    /// A message arrived when none was due.
    Unexpected {
        /// The step the machine was at.
        what: &'static str,
        /// Its length.
        len: usize,
    },
}

impl core::fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ExchangeError::Wire { what, err } => write!(f, "perftest exchange, {what}: {err}"),
            ExchangeError::Unexpected { what, len } => write!(
                f,
                "perftest exchange: a {len}-byte message arrived at {what}, where none was due"
            ),
        }
    }
}

impl std::error::Error for ExchangeError {}

/// Sizes of an `-a` run: 2 B to 8 MiB (perftest's loop `1 << i`, `i` in
/// 1..24).
pub const ALL_SIZES: usize = 23;

/// The script of `test` with `qps` data QPs (`sizes` > 1 for `-a`).
pub fn script(test: Kind, qps: usize, sizes: usize) -> Vec<Item> {
    use Item::{ConnectData, Exchange as X, Run};
    let mut s = vec![
        X(Msg::Version, "the version exchange"),
        X(Msg::CycleBuffer, "the cycle buffer exchange"),
        X(Msg::CacheLine, "the cache line exchange"),
        X(Msg::Mtu, "the MTU exchange"),
        X(Msg::ZeroDest, "the sync before the data connections"),
        ConnectData,
        X(Msg::ZeroDest, "the sync after the data connections"),
    ];
    let round = |s: &mut Vec<Item>, what: &'static str| {
        for i in 0..qps {
            s.push(X(Msg::Dest(i), what));
        }
    };
    let d0 = |s: &mut Vec<Item>, what: &'static str| s.push(X(Msg::Dest(0), what));
    let between = sizes.saturating_sub(1);
    match test {
        Kind::WriteBw | Kind::ReadBw => {
            round(&mut s, "the first pingpong_dest round");
            round(&mut s, "the second pingpong_dest round");
            d0(&mut s, "the sync after the connections are ready");
            s.extend(core::iter::repeat(Run).take(sizes.max(1)));
            d0(&mut s, "the client's end-of-run sync");
            for f in ReportField::ALL {
                s.push(X(Msg::Report(f), f.name()));
            }
            d0(&mut s, "the closing sync");
        }
        Kind::SendBw => {
            round(&mut s, "the first pingpong_dest round");
            d0(&mut s, "the sync after the credit buffers");
            round(&mut s, "the second pingpong_dest round");
            d0(&mut s, "the sync after the receives are posted");
            s.push(Run);
            for _ in 0..between {
                d0(&mut s, "the sync after a size");
                d0(&mut s, "the sync after the receives are posted");
                s.push(Run);
            }
            if sizes > 1 {
                d0(&mut s, "the sync after a size");
            }
            d0(&mut s, "the closing sync");
        }
        Kind::WriteLat | Kind::ReadLat => {
            d0(&mut s, "the sync before the pingpong_dest rounds");
            round(&mut s, "the first pingpong_dest round");
            round(&mut s, "the second pingpong_dest round");
            d0(&mut s, "the sync after the connections are ready");
            s.extend(core::iter::repeat(Run).take(sizes.max(1)));
            if test == Kind::ReadLat {
                d0(&mut s, "the closing sync");
            }
        }
        Kind::SendLat => {
            round(&mut s, "the first pingpong_dest round");
            d0(&mut s, "the sync between the pingpong_dest rounds");
            round(&mut s, "the second pingpong_dest round");
            d0(&mut s, "the sync after the receives are posted");
            s.push(Run);
            for _ in 0..between {
                d0(&mut s, "the sync after the receives are posted");
                s.push(Run);
            }
            d0(&mut s, "the closing sync");
        }
    }
    s
}

/// What this side tells the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    /// One `pingpong_dest` per data QP.
    pub dests: Vec<Dest>,
    /// The MTU code (`enum ibv_mtu`).
    pub mtu_code: u8,
}

/// What the peer told us.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Peer {
    /// Its version, once received.
    pub version: Option<Version>,
    /// Its cycle buffer.
    pub cycle_buffer: u32,
    /// Its cache line.
    pub cache_line: u32,
    /// Its MTU code.
    pub mtu_code: u8,
    /// The last `pingpong_dest` it sent per data QP.
    pub dests: Vec<Option<Dest>>,
    /// Its bandwidth report (the client's, as the server sees it).
    pub report: BwFigures,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Our message of the current exchange is due.
    Send,
    /// The peer's is.
    Receive,
}

/// The exchange of one side. See the module documentation.
#[derive(Debug, Clone)]
pub struct Exchange {
    side: Side,
    script: Vec<Item>,
    pos: usize,
    phase: Phase,
    local: Local,
    report: BwFigures,
    peer: Peer,
}

impl Exchange {
    /// A side at the start of `script`.
    pub fn new(side: Side, script: Vec<Item>, local: Local) -> Exchange {
        let n = local.dests.len();
        let mut x = Exchange {
            side,
            script,
            pos: 0,
            phase: Phase::Send,
            local,
            report: BwFigures::default(),
            peer: Peer {
                dests: vec![None; n],
                ..Peer::default()
            },
        };
        x.enter();
        x
    }

    fn enter(&mut self) {
        self.phase = match self.side {
            Side::Client => Phase::Send,
            Side::Server => Phase::Receive,
        };
    }

    fn advance(&mut self) {
        self.pos += 1;
        self.enter();
    }

    /// The script.
    pub fn script(&self) -> &[Item] {
        &self.script
    }

    /// What this side tells the peer.
    pub fn local(&self) -> &Local {
        &self.local
    }

    /// What the peer has told us so far.
    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    /// The report this side sends (the client's figures; the server sends
    /// zeros, where perftest's server sends an uninitialised one).
    pub fn set_report(&mut self, r: BwFigures) {
        self.report = r;
    }

    /// Measured runs still ahead after the step at hand.
    pub fn runs_after(&self) -> usize {
        self.script
            .get(self.pos + 1..)
            .map_or(0, |rest| rest.iter().filter(|i| **i == Item::Run).count())
    }

    /// Whether the whole script has been exchanged.
    pub fn is_done(&self) -> bool {
        self.pos >= self.script.len()
    }

    /// The step at hand, for messages.
    pub fn step(&self) -> &'static str {
        match self.script.get(self.pos) {
            Some(Item::Exchange(_, what)) => what,
            Some(Item::ConnectData) => "the data connections",
            Some(Item::Run) => "the measured run",
            None => "the end of the exchange",
        }
    }

    fn layout(&self) -> DestLayout {
        self.peer
            .version
            .as_ref()
            .map_or(DestLayout::V45, Version::dest_layout)
    }

    fn emit(&self, msg: Msg) -> Vec<u8> {
        match msg {
            Msg::Version => emit_version(),
            Msg::CycleBuffer => emit_u32(CYCLE_BUFFER),
            Msg::CacheLine => emit_u32(CACHE_LINE),
            Msg::Mtu => emit_mtu(self.local.mtu_code),
            Msg::ZeroDest => Dest::default().emit(self.layout()),
            Msg::Dest(i) => self.local.dests[i].emit(self.layout()),
            Msg::Report(f) => emit_report_field(&self.report, f),
        }
    }

    /// What to do now. A [`Action::Send`] is taken as sent.
    pub fn action(&mut self) -> Action {
        match self.script.get(self.pos).copied() {
            None => Action::Done,
            Some(Item::ConnectData) => Action::ConnectData,
            Some(Item::Run) => Action::Run,
            Some(Item::Exchange(msg, what)) => match self.phase {
                Phase::Receive => Action::Receive(what),
                Phase::Send => {
                    let bytes = self.emit(msg);
                    match self.side {
                        Side::Client => self.phase = Phase::Receive,
                        Side::Server => self.advance(),
                    }
                    Action::Send(bytes)
                }
            },
        }
    }

    /// Past a [`Action::ConnectData`] or [`Action::Run`] (no effect at an
    /// exchange).
    pub fn proceed(&mut self) {
        if matches!(
            self.script.get(self.pos),
            Some(Item::ConnectData | Item::Run)
        ) {
            self.advance();
        }
    }

    /// The peer's message for the step at hand.
    pub fn received(&mut self, bytes: &[u8]) -> Result<(), ExchangeError> {
        let Some(Item::Exchange(msg, what)) = self.script.get(self.pos).copied() else {
            return Err(ExchangeError::Unexpected {
                what: self.step(),
                len: bytes.len(),
            });
        };
        if self.phase != Phase::Receive {
            return Err(ExchangeError::Unexpected {
                what,
                len: bytes.len(),
            });
        }
        let wire = |err| ExchangeError::Wire { what, err };
        match msg {
            Msg::Version => {
                let v = Version::parse(bytes).map_err(wire)?;
                v.check_supported().map_err(wire)?;
                self.peer.version = Some(v);
            }
            Msg::CycleBuffer => {
                self.peer.cycle_buffer = parse_u32("cycle buffer", bytes).map_err(wire)?;
            }
            Msg::CacheLine => {
                self.peer.cache_line = parse_u32("cache line", bytes).map_err(wire)?;
            }
            Msg::Mtu => self.peer.mtu_code = parse_mtu(bytes).map_err(wire)?,
            Msg::ZeroDest => {
                Dest::parse(bytes, self.layout()).map_err(wire)?;
            }
            Msg::Dest(i) => {
                let d = Dest::parse(bytes, self.layout()).map_err(wire)?;
                self.peer.dests[i] = Some(d);
            }
            Msg::Report(f) => {
                parse_report_field(&mut self.peer.report, f, bytes).map_err(wire)?;
            }
        }
        match self.side {
            Side::Client => self.advance(),
            Side::Server => self.phase = Phase::Send,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(qpn: u32) -> Dest {
        Dest {
            out_reads: 1,
            qpn,
            rkey: 0x100 + qpn,
            vaddr: 0x1000 * u64::from(qpn),
            ..Dest::default()
        }
    }

    /// Runs a client and a server against each other; returns the
    /// messages each sent and the actions met.
    fn run_pair(test: Kind, qps: usize, sizes: usize) -> (Exchange, Exchange, Vec<Action>) {
        let local = |base| Local {
            dests: (0..qps as u32).map(|i| dest(base + i)).collect(),
            mtu_code: 3,
        };
        let mut c = Exchange::new(Side::Client, script(test, qps, sizes), local(10));
        let mut s = Exchange::new(Side::Server, script(test, qps, sizes), local(20));
        c.set_report(BwFigures {
            size: 65536,
            iters: 200,
            bw_peak: 1.5,
            bw_avg: 1.25,
            msg_rate: 0.5,
        });
        let mut points = Vec::new();
        loop {
            match (c.action(), s.action()) {
                (Action::Done, Action::Done) => break,
                (Action::Send(m), Action::Receive(_)) => {
                    s.received(&m).unwrap();
                    let Action::Send(r) = s.action() else {
                        panic!("server did not answer")
                    };
                    assert_eq!(r.len(), m.len(), "answers have the request's length");
                    c.received(&r).unwrap();
                }
                (a, b) if a == b => {
                    points.push(a);
                    c.proceed();
                    s.proceed();
                }
                (a, b) => panic!("sides disagree: {a:?} / {b:?}"),
            }
        }
        (c, s, points)
    }

    #[test]
    fn both_sides_learn_each_other() {
        for test in [
            Kind::WriteBw,
            Kind::ReadBw,
            Kind::SendBw,
            Kind::WriteLat,
            Kind::ReadLat,
            Kind::SendLat,
        ] {
            for qps in [1, 3] {
                let (c, s, points) = run_pair(test, qps, 1);
                assert_eq!(points, [Action::ConnectData, Action::Run], "{test:?}");
                for i in 0..qps {
                    assert_eq!(c.peer().dests[i], Some(dest(20 + i as u32)));
                    assert_eq!(s.peer().dests[i], Some(dest(10 + i as u32)));
                }
                assert_eq!(c.peer().version.as_ref().unwrap().as_str(), "6.06");
                assert_eq!((s.peer().cycle_buffer, s.peer().cache_line), (4096, 64));
                if matches!(test, Kind::WriteBw | Kind::ReadBw) {
                    assert_eq!(s.peer().report.iters, 200);
                    assert_eq!(s.peer().report.bw_avg, 1.25);
                    assert_eq!(c.peer().report, BwFigures::default());
                }
            }
        }
    }

    #[test]
    fn all_sizes_have_their_boundaries() {
        let (_, _, points) = run_pair(Kind::SendBw, 2, ALL_SIZES);
        assert_eq!(
            points.len(),
            1 + ALL_SIZES,
            "the connections and a run per size"
        );
        let count = |t| {
            script(t, 1, ALL_SIZES)
                .iter()
                .filter(|i| matches!(i, Item::Exchange(..)))
                .count()
                - script(t, 1, 1)
                    .iter()
                    .filter(|i| matches!(i, Item::Exchange(..)))
                    .count()
        };
        assert_eq!(count(Kind::SendBw), 2 * (ALL_SIZES - 1) + 1);
        // From the first run on: R = a size's run, x = an exchange.
        let tail = |t, k| {
            let s = script(t, 1, k);
            let first = s.iter().position(|i| *i == Item::Run).unwrap();
            s[first..]
                .iter()
                .map(|i| if *i == Item::Run { 'R' } else { 'x' })
                .collect::<String>()
        };
        // send_bw: after each size a sync, before the next one another.
        assert_eq!(tail(Kind::SendBw, 3), "RxxRxxRxx");
        assert_eq!(tail(Kind::SendBw, 1), "Rx");
        // send_lat: a sync before each further size.
        assert_eq!(tail(Kind::SendLat, 3), "RxRxRx");
        assert_eq!(tail(Kind::WriteBw, 3), "RRRxxxxxxx");
        assert_eq!(tail(Kind::ReadLat, 3), "RRRx");
        assert_eq!(tail(Kind::WriteLat, 3), "RRR");
        assert_eq!(count(Kind::SendLat), ALL_SIZES - 1);
        assert_eq!(count(Kind::WriteBw), 0);
    }

    /// A peer of perftest 6.29 or later reads and writes the 64-byte
    /// `pingpong_dest`: our answers follow its version.
    #[test]
    fn newer_peer_gets_the_wide_layout() {
        let local = Local {
            dests: vec![dest(1)],
            mtu_code: 3,
        };
        let mut s = Exchange::new(Side::Server, script(Kind::WriteBw, 1, 1), local);
        let mut v = [0u8; 16];
        v[..4].copy_from_slice(b"6.29");
        let peer = [
            v.to_vec(),
            4096u32.to_be_bytes().to_vec(),
            64u32.to_be_bytes().to_vec(),
            b"3\0".to_vec(),
            vec![0; 64],
        ];
        let mut lens = Vec::new();
        for m in &peer {
            assert!(matches!(s.action(), Action::Receive(_)));
            s.received(m).unwrap();
            let Action::Send(r) = s.action() else {
                panic!("no answer")
            };
            lens.push(r.len());
        }
        assert_eq!(lens, [16, 4, 4, 2, 64]);
        assert_eq!(s.action(), Action::ConnectData);
        s.proceed();
        // A 56-byte dest from a 6.29 peer is malformed.
        let err = s.received(&[0; 56]).unwrap_err();
        assert!(
            err.to_string().contains("56 bytes where perftest sends 64"),
            "{err}"
        );
    }

    #[test]
    fn malformed_and_unexpected_messages_are_errors() {
        let local = Local {
            dests: vec![dest(1)],
            mtu_code: 3,
        };
        let mut s = Exchange::new(Side::Server, script(Kind::WriteBw, 1, 1), local.clone());
        assert_eq!(s.action(), Action::Receive("the version exchange"));
        let err = s.received(b"hello").unwrap_err();
        assert!(err.to_string().contains("the version exchange"), "{err}");
        let mut c = Exchange::new(Side::Client, script(Kind::WriteBw, 1, 1), local);
        assert!(matches!(
            c.received(&[0; 16]),
            Err(ExchangeError::Unexpected { len: 16, .. })
        ));
    }
}
