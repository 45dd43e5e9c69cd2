//! Shared harness of the runtime tests: two dataplanes joined by an
//! in-memory link, a connection between them, and helpers that run RDMA
//! WRITE, READ and SEND and check every byte and every completion.

#![allow(dead_code, reason = "each test file uses part of the harness")]

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use dataplane::api::{
    Access, CmEvent, ConnectParams, Cq, Dataplane, DisconnectReason, DriveMode, MemoryRegistration,
    ProtectionDomain, Qp, QpNum, QpOptions, RecvWr, Region, SendWr, SgeList, TerminateCause,
    TerminateOrigin, WcOpcode, WcStatus, WorkCompletion,
};
use dataplane::config::{Config, Neighbor};
use dataplane::link::{MemLink, MemLinkConfig};
use tcp_offload::wire::EthernetAddress;

pub const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
pub const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xb]);
pub const IP_A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const IP_B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
pub const PORT: u16 = 4791;

/// How long any one wait may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// Two dataplanes over one link.
pub struct Pair {
    pub a: Dataplane,
    pub b: Dataplane,
}

/// The link's counters at a pair's `a` end and at its `b` end.
pub type LinkCounters = [dataplane::link::MemLinkStatsHandle; 2];

/// Options of a pair.
#[derive(Clone)]
pub struct PairOptions {
    pub link: MemLinkConfig,
    pub workers: usize,
    pub mode: DriveMode,
    /// Static ARP entries instead of resolution.
    pub static_arp: bool,
}

impl Default for PairOptions {
    fn default() -> PairOptions {
        PairOptions {
            link: MemLinkConfig::default(),
            workers: 1,
            mode: DriveMode::Inline,
            static_arp: false,
        }
    }
}

fn config(
    ip: Ipv4Addr,
    mac: EthernetAddress,
    peer: (Ipv4Addr, EthernetAddress),
    o: &PairOptions,
) -> Config {
    let mut c = Config::single("mem:test", ip, mac);
    c.workers.count = o.workers;
    c.ports[0].mtu = o.link.mtu;
    c.idle.spin = 200;
    c.idle.sleep_us = 20;
    if o.static_arp {
        c.ports[0].neighbors.push(Neighbor {
            ip: peer.0,
            mac: dataplane::config::MacAddr(peer.1),
        });
    }
    c
}

impl Pair {
    pub fn new(o: &PairOptions) -> Pair {
        Pair::with_configs(o, |_, _| {})
    }

    /// [`Pair::new`], with `tweak(config, is_a)` applied to each side's
    /// configuration first (MPA options of one side, say).
    pub fn with_configs(o: &PairOptions, tweak: impl Fn(&mut Config, bool)) -> Pair {
        Pair::with_link_counters(o, tweak).0
    }

    /// [`Pair::with_configs`], and the link's counters.
    #[allow(dead_code)]
    pub fn with_link_counters(
        o: &PairOptions,
        tweak: impl Fn(&mut Config, bool),
    ) -> (Pair, LinkCounters) {
        let link = MemLinkConfig {
            queues: o.workers as u16,
            ..o.link.clone()
        };
        let (la, lb) = MemLink::pair(&link, MAC_A, MAC_B);
        let links = [la.stats_handle(), lb.stats_handle()];
        let mut ca = config(IP_A, MAC_A, (IP_B, MAC_B), o);
        tweak(&mut ca, true);
        let mut cb = config(IP_B, MAC_B, (IP_A, MAC_A), o);
        tweak(&mut cb, false);
        let a = Dataplane::open_with_link(&ca, la, o.mode).expect("open a");
        let b = Dataplane::open_with_link(&cb, lb, o.mode).expect("open b");
        (Pair { a, b }, links)
    }

    /// One round of both sides' loops (inline), or a short nap (threads).
    pub fn pump(&self) {
        let work = self.a.poll() | self.b.poll();
        if !work {
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Pumps until `f` returns something, or fails the test.
    pub fn until<T>(&self, what: &str, mut f: impl FnMut(&Pair) -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(t) = f(self) {
                return t;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "timed out waiting for {what}; a: {:?}; b: {:?}",
                self.a.stats(),
                self.b.stats()
            );
            self.pump();
        }
    }
}

/// One side's objects for a connection.
pub struct End {
    pub pd: ProtectionDomain,
    pub cq: Cq,
    pub qp: Qp,
    /// Completions seen, by work request id.
    pub seen: HashMap<u64, WorkCompletion>,
}

impl End {
    pub fn new(dp: &Dataplane) -> End {
        let pd = dp.alloc_pd().unwrap();
        let cq = dp.create_cq(4096).unwrap();
        let qp = dp
            .create_qp(
                pd,
                &cq,
                &cq,
                QpOptions {
                    max_send_wr: 512,
                    max_recv_wr: 512,
                    ..QpOptions::default()
                },
            )
            .unwrap();
        End {
            pd,
            cq,
            qp,
            seen: HashMap::new(),
        }
    }

    /// Takes every completion waiting; fails the test on a duplicate id.
    pub fn drain(&mut self) {
        while let Some(wc) = self.cq.poll_one() {
            let dup = self.seen.insert(wc.wr_id, wc);
            assert!(dup.is_none(), "work request {} completed twice", wc.wr_id);
        }
    }
}

/// Connects `a` (active) to `b` (passive), both ends established.
pub fn connect(p: &Pair) -> (End, End) {
    connect_crc(p, true)
}

/// [`connect`] between dataplanes whose configuration asks for the MPA
/// CRC or not: `crc` is whether the connection uses it.
pub fn connect_crc(p: &Pair, crc: bool) -> (End, End) {
    p.b.listen(PORT, 16).unwrap();
    let ea = End::new(&p.a);
    let eb = End::new(&p.b);
    let params = ConnectParams {
        private_data: b"hello from a".to_vec(),
        ..ConnectParams::default()
    };
    p.a.connect(&ea.qp, SocketAddrV4::new(IP_B, PORT), &params)
        .unwrap();
    let mut up = (false, false);
    p.until("both ends established", |p| {
        while let Some(e) = p.b.poll_event() {
            match e {
                CmEvent::ConnectRequest(req) => {
                    assert_eq!(req.private_data, b"hello from a");
                    assert_eq!(req.local_port, PORT);
                    let reply = ConnectParams {
                        private_data: b"welcome".to_vec(),
                        ..ConnectParams::default()
                    };
                    p.b.accept(&req, &eb.qp, &reply).unwrap();
                }
                CmEvent::Established { qp, info } => {
                    assert_eq!(qp, eb.qp.num());
                    assert_eq!(info.private_data, b"hello from a");
                    up.1 = true;
                }
                other => panic!("b: unexpected {other:?}"),
            }
        }
        while let Some(e) = p.a.poll_event() {
            match e {
                CmEvent::Established { qp, info } => {
                    assert_eq!(qp, ea.qp.num());
                    assert_eq!(info.private_data, b"welcome");
                    assert_eq!(info.crc, crc);
                    up.0 = true;
                }
                other => panic!("a: unexpected {other:?}"),
            }
        }
        (up.0 && up.1).then_some(())
    });
    (ea, eb)
}

/// Opens one connection, `a` active if `from_a`, both sides already
/// listening on [`PORT`]; returns the ends on `a` and on `b`. Unlike
/// [`connect`], callable many times on one pair.
pub fn open_conn(p: &Pair, from_a: bool) -> (End, End) {
    let ea = End::new(&p.a);
    let eb = End::new(&p.b);
    let (active, passive, ip) = if from_a {
        (&ea, &eb, IP_B)
    } else {
        (&eb, &ea, IP_A)
    };
    let (adp, pdp): (&Dataplane, &Dataplane) = if from_a { (&p.a, &p.b) } else { (&p.b, &p.a) };
    adp.connect(
        &active.qp,
        SocketAddrV4::new(ip, PORT),
        &ConnectParams::default(),
    )
    .unwrap();
    let mut up = (false, false);
    p.until("both ends established", |_| {
        while let Some(e) = pdp.poll_event() {
            match e {
                CmEvent::ConnectRequest(req) => {
                    pdp.accept(&req, &passive.qp, &ConnectParams::default())
                        .unwrap();
                }
                CmEvent::Established { qp, .. } => {
                    assert_eq!(qp, passive.qp.num());
                    up.1 = true;
                }
                CmEvent::MrDeregistered(_) => {}
                other => panic!("passive side: unexpected {other:?}"),
            }
        }
        while let Some(e) = adp.poll_event() {
            match e {
                CmEvent::Established { qp, info } => {
                    assert_eq!(qp, active.qp.num());
                    assert!(info.crc);
                    up.0 = true;
                }
                CmEvent::MrDeregistered(_) => {}
                other => panic!("active side: unexpected {other:?}"),
            }
        }
        (up.0 && up.1).then_some(())
    });
    (ea, eb)
}

/// A registered buffer.
pub struct Buf {
    pub region: Region,
    pub mr: MemoryRegistration,
}

pub fn buffer(dp: &Dataplane, pd: ProtectionDomain, len: usize, access: Access) -> Buf {
    // A guard page's worth on each side, to catch writes outside the span.
    let region = Region::new(len + 2 * 4096).unwrap();
    region.fill(0, region.len(), 0xa5).unwrap();
    let mr = dp.reg_mr(pd, &region, 4096, len, access).unwrap();
    Buf { region, mr }
}

/// `len` bytes of a xorshift sequence seeded by `seed`: different seeds,
/// different bytes, so a misplaced or stale message shows.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

impl Buf {
    pub fn fill_pattern(&self, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let data: Vec<u8> = (0..self.mr.len())
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        self.region.write(4096, &data).unwrap();
        data
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.region.to_vec(4096, self.mr.len() as usize).unwrap()
    }

    /// The canary around the registered span is intact.
    pub fn guards_intact(&self) -> bool {
        let len = self.mr.len() as usize;
        let before = self.region.to_vec(0, 4096).unwrap();
        let after = self.region.to_vec(4096 + len, 4096).unwrap();
        before.iter().chain(after.iter()).all(|&b| b == 0xa5)
    }
}

/// Waits for completion `id` on `end`; returns it.
/// Waits until `read` gives `want`. A Write's completion at its initiator
/// says that the peer's TCP has every byte (the source may be reused), not
/// that the peer has placed them yet: as on any iWARP RNIC, the peer
/// acknowledges a burst before it places it (RFC 5040 leaves placement
/// visible to the peer's application only through a later Send or Read
/// Response). A test that reads the target right after that completion
/// waits here; bytes still wrong after the patience fail it.
pub fn wait_placed(p: &Pair, what: &str, want: &[u8], mut read: impl FnMut() -> Vec<u8>) {
    p.until(&format!("{what} placed"), |_| {
        (read() == want).then_some(())
    });
}

pub fn wait_wc(p: &Pair, end: &mut End, id: u64) -> WorkCompletion {
    p.until(&format!("completion {id}"), |_| {
        end.drain();
        end.seen.get(&id).copied()
    })
}

/// Waits until both ends of one connection, queue pair `qps[0]` on a and
/// `qps[1]` on b, report its end by a Terminate of `cause` that b sent;
/// no other queue pair may end meanwhile.
pub fn expect_terminated(p: &Pair, qps: [QpNum; 2], cause: TerminateCause) {
    let mut got = [false, false];
    p.until("both sides report the Terminate", |p| {
        for (i, (dp, origin)) in [
            (&p.a, TerminateOrigin::Peer),
            (&p.b, TerminateOrigin::Local),
        ]
        .into_iter()
        .enumerate()
        {
            while let Some(e) = dp.poll_event() {
                match e {
                    CmEvent::Disconnected { qp, reason } => {
                        assert_eq!(qp, qps[i], "only queue pair {:?} ends", qps[i]);
                        assert_eq!(
                            reason,
                            DisconnectReason::Terminated {
                                cause: Some(cause),
                                origin
                            }
                        );
                        got[i] = true;
                    }
                    CmEvent::MrDeregistered(_) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        (got[0] && got[1]).then_some(())
    });
}

/// The RDMA operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write,
    Read,
    Send,
}

/// Posts `op` of `len` bytes from `src` to `dst` as work request `id`: a
/// initiates (a Read brings `src`, on b, into `dst`, on a); for a Send, b
/// posts the receive first.
pub fn post_op(a: &End, b: &End, op: Op, src: &Buf, dst: &Buf, len: u32, id: u64) {
    match op {
        Op::Write => {
            let wr = SendWr::write(
                id,
                SgeList::single(src.mr.sge(0, len)),
                dst.mr.addr(),
                dst.mr.rkey(),
            );
            a.qp.post_send(&wr).unwrap();
        }
        Op::Read => {
            let wr = SendWr::read(id, dst.mr.sge(0, len), src.mr.addr(), src.mr.rkey());
            a.qp.post_send(&wr).unwrap();
        }
        Op::Send => {
            let rwr = RecvWr {
                wr_id: id,
                sges: SgeList::single(dst.mr.sge(0, len)),
            };
            b.qp.post_recv(&rwr).unwrap();
            let wr = SendWr::send(id, SgeList::single(src.mr.sge(0, len)));
            a.qp.post_send(&wr).unwrap();
        }
    }
}

/// Runs `op` of `len` bytes between the two ends (a initiates), checks
/// the bytes, the completion and the guards; returns the bytes verified.
pub fn exchange(p: &Pair, a: &mut End, b: &mut End, op: Op, len: usize, id: u64) -> usize {
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let src_dp = if op == Op::Read { &p.b } else { &p.a };
    let dst_dp = if op == Op::Read { &p.a } else { &p.b };
    let src_pd = if op == Op::Read { b.pd } else { a.pd };
    let dst_pd = if op == Op::Read { a.pd } else { b.pd };
    let src = buffer(src_dp, src_pd, len, rw);
    let dst = buffer(dst_dp, dst_pd, len, rw);
    let data = src.fill_pattern(id);
    dst.region.fill(4096, len, 0).unwrap();
    let len32 = len as u32;
    post_op(a, b, op, &src, &dst, len32, id);
    let wc = wait_wc(p, a, id);
    assert_eq!(wc.status, WcStatus::Success, "{op:?} {len}: {wc:?}");
    assert_eq!(wc.byte_len, len32);
    let expect = match op {
        Op::Write => WcOpcode::RdmaWrite,
        Op::Read => WcOpcode::RdmaRead,
        Op::Send => WcOpcode::Send,
    };
    assert_eq!(wc.opcode, expect);
    if op == Op::Send {
        let rc = wait_wc(p, b, id);
        assert_eq!(
            (rc.status, rc.opcode, rc.byte_len),
            (WcStatus::Success, WcOpcode::Recv, len32)
        );
    }
    if op == Op::Write {
        wait_placed(p, &format!("Write of {len} bytes"), &data, || dst.bytes());
    }
    let got = dst.bytes();
    assert!(got == data, "{op:?} of {len} bytes: data differs");
    assert!(
        dst.guards_intact(),
        "{op:?} of {len} bytes: wrote outside the span"
    );
    src_dp.dereg_mr(&src.mr).unwrap();
    dst_dp.dereg_mr(&dst.mr).unwrap();
    len
}

/// The path of siw capture `name`, one of the repository's test fixtures
/// in `deploy/interop/captures/`; panics, naming the path, if it is not
/// there.
pub fn siw_capture(name: &str) -> std::path::PathBuf {
    // The harness serves the dataplane's tests and the tool's (one folder
    // deeper): the fixtures are found from the workspace root.
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or(manifest);
    let path = root.join("deploy/interop/captures").join(name);
    assert!(
        path.is_file(),
        "siw capture fixture missing: {} (the repository's deploy/interop/captures)",
        path.display()
    );
    path
}
