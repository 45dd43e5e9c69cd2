//! Two dataplane processes on a veth pair whose ends sit in two network
//! namespaces, each on a DPDK port of the kind the test names
//! ([`Exchange::device`]): RDMA WRITE, READ and SEND between them, verified
//! byte for byte.
//!
//! The test re-executes its own binary under `ip netns exec` once per side
//! (a marker in the environment says which side to play); each child is a
//! full `Dataplane` on its veth end with EAL under a file prefix of its
//! own. The server registers a region and hands its address and STag to
//! the client in the MPA private data; the client WRITEs a pattern into
//! it, READs it back and compares, then SENDs the same bytes with their
//! hash, which the server checks against the message and against what the
//! WRITE left in its region. Each side then hands its workers' counters to
//! [`Exchange::check`]. The parent waits for a readiness line from the
//! server before starting the client, limits both in time, kills them by
//! PID on failure, and checks that the namespaces and both EAL runtime
//! directories are gone. Needs root (prints a skip notice without it, or
//! fails with `IWARP_REQUIRE_ROOT_TESTS=1`).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dataplane::api::{
    Access, CmEvent, ConnectParams, Cq, Dataplane, QpOptions, RecvWr, Region, SendWr, SgeList,
    Stag, WcOpcode, WcStatus, WorkCompletion,
};
use dataplane::config::Config;

use crate::netns_common::{require_root, NsChild, TwoNs};
use crate::runtime_common::pattern;
use tcp_offload::wire::EthernetAddress;

/// The environment variable naming the side a child plays.
const ROLE: &str = "IWARP_XCHG_ROLE";
/// The veth end a child's port opens.
const IFACE: &str = "IWARP_XCHG_IFACE";

/// What differs between the tests that run the exchange.
pub struct Exchange {
    /// The `#[test]` function's name, for the re-executed children's
    /// filter.
    pub test: &'static str,
    /// The PMD's name, for messages.
    pub pmd: &'static str,
    /// The DPDK device on veth end `iface`.
    pub device: fn(iface: &str) -> String,
    /// Runs in the child's namespace once its dataplane is open, with the
    /// veth end's name: joins a port the PMD created itself (a tap) to
    /// the veth. `None` for PMDs that open the veth end directly.
    pub attach: Option<fn(iface: &str)>,
    /// Changes each side's configuration before its dataplane opens.
    pub configure: Option<fn(&mut Config)>,
    /// Checks a side's counters (`side`: "server" or "client") once its
    /// transfers are done: the workers' ([`Dataplane::stats`]) and the
    /// port's ([`Dataplane::link_stats`]); panics to fail it.
    pub check: fn(side: &str, dp: &Dataplane),
}

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
const SERVER_MAC: EthernetAddress = EthernetAddress([2, 0x1a, 0xfa, 0, 0, 1]);
const CLIENT_MAC: EthernetAddress = EthernetAddress([2, 0x1a, 0xfa, 0, 0, 2]);
const PORT: u16 = 4791;

/// Transfer sizes; each is written at its own offset of the server's
/// region, so that a later WRITE cannot overwrite what the server has yet
/// to check.
const SIZES: [usize; 7] = [1, 3, 1500, 4097, 65_536, 1 << 20, 4 << 20];

/// Bytes of the header (length, hash) in front of each SEND's payload.
const HEADER: usize = 16;

/// Limit of each child, and of any wait inside one.
const CHILD_TIMEOUT: Duration = Duration::from_secs(90);

/// Bytes the client moves one way with each of WRITE, READ and SEND.
pub fn total() -> usize {
    SIZES.iter().sum()
}

fn offset_of(i: usize) -> usize {
    SIZES[..i].iter().sum()
}

/// FNV-1a, 64 bits: enough to tell the server's region from the bytes the
/// client meant to put there.
fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Starts this binary as `role` in `ns`, its port on `ifname`; its output
/// lines go to `lines`, prefixed.
fn spawn_child(
    x: &Exchange,
    role: &'static str,
    ns: &str,
    ifname: &str,
    lines: mpsc::Sender<(&'static str, String)>,
) -> NsChild {
    let exe = std::env::current_exe().expect("own executable");
    let args = ["--exact", x.test, "--nocapture", "--test-threads", "1"].map(String::from);
    NsChild::spawn(
        role,
        ns,
        &exe,
        &args,
        &[(ROLE, role), (IFACE, ifname)],
        lines,
    )
}

/// The children's output as received, kept so that a line one wait
/// passes over (the server's verdict, printed before the client's) is
/// still found by the next.
struct Lines {
    rx: mpsc::Receiver<(&'static str, String)>,
    seen: Vec<(&'static str, String)>,
}

impl Lines {
    /// The first line seen from `role` containing `prefix`, from there on.
    fn find(&self, role: &str, prefix: &str) -> Option<String> {
        self.seen.iter().find_map(|(who, line)| {
            line.find(prefix)
                .filter(|_| *who == role)
                .map(|at| line[at..].to_string())
        })
    }

    fn recv_timeout(
        &mut self,
        t: Duration,
    ) -> Result<(&'static str, String), mpsc::RecvTimeoutError> {
        let (who, line) = self.rx.recv_timeout(t)?;
        println!("[{who}] {line}");
        self.seen.push((who, line.clone()));
        Ok((who, line))
    }
}

/// Waits for a line from `role` containing `prefix` (one seen before
/// counts); prints every line as it comes. Fails if a child exits or the
/// deadline passes first.
fn wait_line(
    lines: &mut Lines,
    role: &str,
    prefix: &str,
    deadline: Instant,
    children: &mut [&mut NsChild],
) -> String {
    if let Some(line) = lines.find(role, prefix) {
        return line;
    }
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no `{prefix}` line from the {role} in time"
        );
        match lines.recv_timeout(left.min(Duration::from_millis(200))) {
            Ok((who, line)) => {
                // libtest may have printed `test … ...` on the same line.
                if let Some(at) = line.find(prefix).filter(|_| who == role) {
                    return line[at..].to_string();
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("children's output closed"),
        }
        for c in children.iter_mut() {
            let Ok(Some(status)) = c.child.try_wait() else {
                continue;
            };
            // A child that succeeded may end before its peer; one that
            // failed, or the one awaited ending without the line, fails
            // the test. Its last words may still be in the pipe.
            if status.success() && c.name != role {
                continue;
            }
            while let Ok((who, line)) = lines.recv_timeout(Duration::from_millis(200)) {
                if let Some(at) = line.find(prefix).filter(|_| who == role) {
                    if status.success() {
                        return line[at..].to_string();
                    }
                }
            }
            panic!("the {} exited ({status}) without `{prefix}`", c.name);
        }
    }
}

/// The whole test: in the parent, namespaces, both children, their
/// verdicts, cleanup; in a child, its side.
pub fn run(x: &Exchange) {
    match std::env::var(ROLE).as_deref() {
        Ok("server") => return server(x),
        Ok("client") => return client(x),
        _ => {}
    }
    if !require_root() {
        return;
    }
    let net = TwoNs::create().expect("two namespaces and a veth pair");
    let (tx, rx) = mpsc::channel();
    let mut lines = Lines {
        rx,
        seen: Vec::new(),
    };
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let mut server = spawn_child(x, "server", &net.ns[0], &net.ifs[0], tx.clone());
    wait_line(&mut lines, "server", "READY", deadline, &mut [&mut server]);
    let mut client = spawn_child(x, "client", &net.ns[1], &net.ifs[1], tx);
    let client_line = wait_line(
        &mut lines,
        "client",
        "CLIENT DONE",
        deadline,
        &mut [&mut server, &mut client],
    );
    let server_line = wait_line(
        &mut lines,
        "server",
        "SERVER DONE",
        deadline,
        &mut [&mut server, &mut client],
    );
    for c in [&mut server, &mut client] {
        let status = loop {
            if let Some(s) = c.child.try_wait().expect("waiting for a child") {
                break s;
            }
            assert!(Instant::now() < deadline, "the {} did not exit", c.name);
            while let Ok((who, line)) = lines.rx.try_recv() {
                println!("[{who}] {line}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "the {} failed: {status}", c.name);
        // The process removes its runtime directory itself when EAL is
        // cleaned up; the harness's removal is only for a failed run.
        c.assert_runtime_gone();
    }
    while let Ok((who, line)) = lines.rx.try_recv() {
        println!("[{who}] {line}");
    }
    let expect = 3 * total();
    for line in [&client_line, &server_line] {
        let n: usize = line
            .split_whitespace()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no byte count in {line:?}"));
        let want = if line.starts_with("CLIENT") {
            expect
        } else {
            2 * total()
        };
        assert_eq!(n, want, "{line}");
    }
    let runtimes = [server.runtime.clone(), client.runtime.clone()];
    drop((server, client));
    for dir in runtimes {
        assert!(!dir.exists(), "{} still there", dir.display());
    }
    net.remove_and_check();
    println!(
        "{}, two processes: {expect} bytes verified by the client (WRITE, READ back, \
         SEND), {} by the server (WRITE region and SEND payload); namespaces and runtime \
         directories removed",
        x.pmd,
        2 * total()
    );
}

// ---------------------------------------------------------------------
// The children.
// ---------------------------------------------------------------------

/// A dataplane on this namespace's veth end.
fn open(x: &Exchange, ip: Ipv4Addr, mac: EthernetAddress) -> Dataplane {
    let iface = std::env::var(IFACE).expect("the interface to open");
    let mut c = Config::single(&(x.device)(&iface), ip, mac);
    // Both processes and the kernel share two cores: back off when idle.
    c.idle.spin = 200;
    c.idle.sleep_us = 20;
    if let Some(configure) = x.configure {
        configure(&mut c);
    }
    let dp =
        Dataplane::open(&c).unwrap_or_else(|e| panic!("opening the dataplane on {}: {e}", x.pmd));
    if let Some(attach) = x.attach {
        attach(&iface);
    }
    dp
}

fn wait_wc(cq: &Cq, what: &str) -> WorkCompletion {
    let end = Instant::now() + CHILD_TIMEOUT;
    loop {
        if let Some(wc) = cq.poll_one() {
            return wc;
        }
        assert!(Instant::now() < end, "no completion for {what}");
        std::thread::sleep(Duration::from_micros(50));
    }
}

fn wait_event(dp: &Dataplane, what: &str) -> CmEvent {
    let end = Instant::now() + CHILD_TIMEOUT;
    loop {
        if let Some(e) = dp.poll_event() {
            return e;
        }
        assert!(Instant::now() < end, "no event: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Registers a region for remote access, takes every SEND, checks each
/// against its payload, its hash and what the WRITE left in the region.
fn server(x: &Exchange) {
    let dp = open(x, SERVER_IP, SERVER_MAC);
    let pd = dp.alloc_pd().expect("pd");
    let cq = dp.create_cq(1024).expect("cq");
    let qp = dp
        .create_qp(pd, &cq, &cq, QpOptions::default())
        .expect("qp");
    let target = Region::new(total()).expect("target region");
    let target_mr = dp
        .reg_mr(
            pd,
            &target,
            0,
            total(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .expect("registering the target");
    let inbox_len = total() + HEADER * SIZES.len();
    let inbox = Region::new(inbox_len).expect("inbox region");
    let inbox_mr = dp
        .reg_mr(pd, &inbox, 0, inbox_len, Access::LOCAL_WRITE)
        .expect("registering the inbox");
    // Every receive posted before the client may send.
    let mut at = 0usize;
    for (i, len) in SIZES.iter().enumerate() {
        let n = u32::try_from(len + HEADER).expect("size");
        qp.post_recv(&RecvWr {
            wr_id: i as u64,
            sges: SgeList::single(inbox_mr.sge(at as u64, n)),
        })
        .expect("post_recv");
        at += len + HEADER;
    }
    dp.listen(PORT, 4).expect("listen");
    println!("READY");
    let mut private = Vec::with_capacity(20);
    private.extend_from_slice(&target_mr.addr().to_be_bytes());
    private.extend_from_slice(&target_mr.rkey().0.to_be_bytes());
    private.extend_from_slice(&(total() as u64).to_be_bytes());
    loop {
        match wait_event(&dp, "connect request") {
            CmEvent::ConnectRequest(req) => {
                let reply = ConnectParams {
                    private_data: private.clone(),
                    ..ConnectParams::default()
                };
                dp.accept(&req, &qp, &reply).expect("accept");
            }
            CmEvent::Established { .. } => break,
            other => panic!("server: unexpected {other:?}"),
        }
    }
    println!("server: established");
    let mut verified = 0usize;
    let mut at = 0usize;
    for (i, &len) in SIZES.iter().enumerate() {
        let wc = wait_wc(&cq, "a SEND");
        assert_eq!(
            (wc.status, wc.opcode, wc.wr_id, wc.byte_len as usize),
            (WcStatus::Success, WcOpcode::Recv, i as u64, len + HEADER),
            "receive {i}: {wc:?}"
        );
        let msg = inbox.to_vec(at, len + HEADER).expect("inbox bytes");
        at += len + HEADER;
        let (head, payload) = msg.split_at(HEADER);
        let mut n = [0u8; 8];
        n.copy_from_slice(&head[..8]);
        assert_eq!(u64::from_be_bytes(n), len as u64, "SEND {i} length field");
        let mut h = [0u8; 8];
        h.copy_from_slice(&head[8..]);
        let hash = u64::from_be_bytes(h);
        assert!(payload == pattern(i as u64, len), "SEND {i} payload");
        assert_eq!(fnv(payload), hash, "SEND {i} hash");
        let written = target.to_vec(offset_of(i), len).expect("target bytes");
        assert_eq!(
            fnv(&written),
            hash,
            "WRITE {i} of {len} bytes: region differs"
        );
        verified += 2 * len;
        println!("server: WRITE and SEND of {len} B verified (hash {hash:016x})");
    }
    match wait_event(&dp, "disconnect") {
        CmEvent::Disconnected { reason, .. } => println!("server: disconnected ({reason:?})"),
        other => panic!("server: unexpected {other:?}"),
    }
    println!("server: {:?}", dp.stats());
    (x.check)("server", &dp);
    println!("SERVER DONE {verified}");
}

/// WRITEs each size into the server's region, READs it back, compares,
/// then SENDs it with its hash.
fn client(x: &Exchange) {
    let dp = open(x, CLIENT_IP, CLIENT_MAC);
    let pd = dp.alloc_pd().expect("pd");
    let cq = dp.create_cq(1024).expect("cq");
    let qp = dp
        .create_qp(pd, &cq, &cq, QpOptions::default())
        .expect("qp");
    let max = SIZES.iter().max().copied().unwrap_or(0);
    let src = Region::new(max + HEADER).expect("source region");
    let src_mr = dp
        .reg_mr(pd, &src, 0, max + HEADER, Access::LOCAL_WRITE)
        .expect("registering the source");
    let back = Region::new(max).expect("read-back region");
    let back_mr = dp
        .reg_mr(pd, &back, 0, max, Access::LOCAL_WRITE)
        .expect("registering the read-back buffer");
    let start = Instant::now();
    dp.connect(
        &qp,
        SocketAddrV4::new(SERVER_IP, PORT),
        &ConnectParams::default(),
    )
    .expect("connect");
    let (addr, rkey) = match wait_event(&dp, "established") {
        CmEvent::Established { info, .. } => {
            let p = &info.private_data;
            assert!(p.len() >= 20, "private data {p:?}");
            let mut a = [0u8; 8];
            a.copy_from_slice(&p[..8]);
            let mut k = [0u8; 4];
            k.copy_from_slice(&p[8..12]);
            (u64::from_be_bytes(a), Stag(u32::from_be_bytes(k)))
        }
        other => panic!("client: unexpected {other:?}"),
    };
    println!("client: established in {:?}", start.elapsed());
    let t0 = Instant::now();
    let mut verified = 0usize;
    for (i, &len) in SIZES.iter().enumerate() {
        let data = pattern(i as u64, len);
        let n32 = u32::try_from(len).expect("size");
        let remote = addr + offset_of(i) as u64;
        // WRITE from the payload part of the source.
        src.write(HEADER, &data).expect("fill");
        let id = 10 * i as u64;
        qp.post_send(&SendWr::write(
            id,
            SgeList::single(src_mr.sge(HEADER as u64, n32)),
            remote,
            rkey,
        ))
        .expect("post WRITE");
        let wc = wait_wc(&cq, "WRITE");
        assert_eq!(
            (wc.status, wc.opcode, wc.wr_id),
            (WcStatus::Success, WcOpcode::RdmaWrite, id),
            "{wc:?}"
        );
        // READ it back and compare.
        back.fill(0, len, 0).expect("clear");
        qp.post_send(&SendWr::read(id + 1, back_mr.sge(0, n32), remote, rkey))
            .expect("post READ");
        let wc = wait_wc(&cq, "READ");
        assert_eq!(
            (wc.status, wc.opcode, wc.wr_id, wc.byte_len),
            (WcStatus::Success, WcOpcode::RdmaRead, id + 1, n32),
            "{wc:?}"
        );
        let got = back.to_vec(0, len).expect("read-back bytes");
        assert!(
            got == data,
            "READ back of {len} bytes differs from the WRITE"
        );
        // SEND the bytes with their length and hash in front.
        let hash = fnv(&data);
        let mut head = [0u8; HEADER];
        head[..8].copy_from_slice(&(len as u64).to_be_bytes());
        head[8..].copy_from_slice(&hash.to_be_bytes());
        src.write(0, &head).expect("header");
        qp.post_send(&SendWr::send(
            id + 2,
            SgeList::single(src_mr.sge(0, n32 + HEADER as u32)),
        ))
        .expect("post SEND");
        let wc = wait_wc(&cq, "SEND");
        assert_eq!(
            (wc.status, wc.opcode, wc.wr_id),
            (WcStatus::Success, WcOpcode::Send, id + 2),
            "{wc:?}"
        );
        verified += 3 * len;
        println!("client: WRITE, READ and SEND of {len} B verified (hash {hash:016x})");
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-6);
    println!(
        "client: {verified} bytes moved and verified in {secs:.3} s ({:.1} Mbit/s)",
        verified as f64 * 8.0 / secs / 1e6
    );
    dp.disconnect(&qp, false).expect("disconnect");
    match wait_event(&dp, "disconnect") {
        CmEvent::Disconnected { reason, .. } => println!("client: disconnected ({reason:?})"),
        other => panic!("client: unexpected {other:?}"),
    }
    println!("client: {:?}", dp.stats());
    (x.check)("client", &dp);
    println!("CLIENT DONE {verified}");
}
