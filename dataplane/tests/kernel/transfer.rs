//! One bulk transfer between our engine and the kernel's TCP, both ways at
//! once, with the bytes checked on both sides and a clean close; and
//! `ping` from the kernel answered by our engine. Both run over any
//! [`Engine`]: the raw socket's [`Driver`] or a DPDK port's.

use std::fmt::Write as _;
use std::io::Read;
use std::net::SocketAddrV4;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use tcp_offload::iface::{IfaceStats, Interface};
use tcp_offload::tcp::{Config, ConnId, ConnStats, Event, State};
use tcp_offload::time::Instant;

use super::driver::{Driver, DriverStats, Loss};
use super::peer::{self, check_pattern, fill_pattern, PeerSpec, Role};
use crate::netns_common::{require_root, Netns};

/// The I/O loop around the engine, whatever carries its frames.
pub trait Engine {
    /// The engine.
    fn iface(&self) -> &Interface<Vec<u8>, Vec<u8>>;
    /// The engine, to drive.
    fn iface_mut(&mut self) -> &mut Interface<Vec<u8>, Vec<u8>>;
    /// The engine's clock.
    fn now(&self) -> Instant;
    /// Hands received frames to the engine; how many came.
    fn receive(&mut self) -> Result<usize, String>;
    /// Runs the engine's timers if one is due.
    fn run_timers(&mut self);
    /// Sends what the engine has to send; how many frames it produced.
    fn transmit(&mut self) -> Result<usize, String>;
    /// Sleeps a little when idle.
    fn wait(&mut self) -> Result<(), String>;
    /// The loop's counters, brought up to date.
    fn stats(&mut self) -> DriverStats;
}

impl Engine for Driver {
    fn iface(&self) -> &Interface<Vec<u8>, Vec<u8>> {
        &self.iface
    }
    fn iface_mut(&mut self) -> &mut Interface<Vec<u8>, Vec<u8>> {
        &mut self.iface
    }
    fn now(&self) -> Instant {
        Driver::now(self)
    }
    fn receive(&mut self) -> Result<usize, String> {
        Driver::receive(self).map_err(|e| format!("raw socket receive: {e}"))
    }
    fn run_timers(&mut self) {
        Driver::run_timers(self);
    }
    fn transmit(&mut self) -> Result<usize, String> {
        Driver::transmit(self).map_err(|e| format!("raw socket send: {e}"))
    }
    fn wait(&mut self) -> Result<(), String> {
        Driver::wait(self).map_err(|e| format!("poll: {e}"))
    }
    fn stats(&mut self) -> DriverStats {
        self.update_socket_drops();
        self.stats
    }
}

/// Pattern seeds, distinct per direction so that data reflected back
/// would not verify.
const SEED_US_TO_KERNEL: u64 = 0x0123_4567_89ab_cdef;
const SEED_KERNEL_TO_US: u64 = 0xfedc_ba98_7654_3210;

/// Which side opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Our engine connects to the kernel's listener.
    Active,
    /// The kernel connects to our listener.
    Passive,
}

/// A transfer to run.
#[derive(Debug, Clone)]
pub struct Transfer {
    pub name: &'static str,
    pub open: Open,
    /// Bytes each way.
    pub bytes: u64,
    pub config: Config,
    pub loss: Option<Loss>,
    /// Wall-clock limit for the whole test.
    pub timeout: Duration,
}

/// What a completed transfer measured.
#[derive(Debug)]
pub struct Outcome {
    pub received: u64,
    pub acked: u64,
    pub final_state: State,
    /// Our connection's counters at the end.
    pub conn: ConnStats,
    pub driver: DriverStats,
    /// What the kernel's side sent and received.
    #[allow(dead_code, reason = "read by the DPDK variant's checks only")]
    pub kernel_sent: u64,
    #[allow(dead_code, reason = "read by the DPDK variant's checks only")]
    pub kernel_received: u64,
    /// The namespace's TCP counters at the end.
    #[allow(
        dead_code,
        reason = "read by some of the binaries that include this module"
    )]
    pub kernel_counters: Vec<(String, i64)>,
}

/// Kernel TCP counters of the namespace (`/proc/net/snmp` and
/// `/proc/net/netstat`), as `Group:Name → value`.
pub fn kernel_counters(net: &Netns) -> Vec<(String, i64)> {
    let Ok(out) = net
        .command("cat")
        .args(["/proc/net/snmp", "/proc/net/netstat"])
        .output()
    else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let mut counters = Vec::new();
    // The files alternate a header line and a value line per group.
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        let mut names = names.split_whitespace();
        let mut values = values.split_whitespace();
        let (Some(group), Some(_)) = (names.next(), values.next()) else {
            continue;
        };
        for (n, v) in names.zip(values) {
            if let Ok(v) = v.parse::<i64>() {
                counters.push((format!("{}{n}", group.trim_end_matches(':')), v));
            }
        }
    }
    counters
}

/// The counter `name` of [`kernel_counters`], 0 if absent.
pub fn counter(counters: &[(String, i64)], name: &str) -> i64 {
    counters
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, v)| *v)
}

/// Kernel counters worth printing after a transfer.
const KERNEL_COUNTERS: &[&str] = &[
    "TcpActiveOpens",
    "TcpPassiveOpens",
    "TcpEstabResets",
    "TcpInSegs",
    "TcpOutSegs",
    "TcpRetransSegs",
    "TcpInErrs",
    "TcpInCsumErrors",
    "TcpOutRsts",
    "TcpExtTCPSackRecovery",
    "TcpExtTCPRenoRecovery",
    "TcpExtTCPTimeouts",
    "TcpExtTCPOFOQueue",
    "TcpExtTCPDSACKRecv",
    "TcpExtTCPAbortOnData",
    "TcpExtPAWSEstab",
];

fn state_report(driver: &mut impl Engine, id: Option<ConnId>) -> String {
    let mut s = String::new();
    match id.and_then(|id| driver.iface().stack().conn(id)) {
        Some(c) => {
            let _ = writeln!(
                s,
                "  our connection {} -> {}: {}",
                c.local(),
                c.remote(),
                c.state().name()
            );
            let _ = writeln!(s, "  {:?}", c.stats());
            let _ = writeln!(
                s,
                "  cwnd {} ssthresh {} peer window {} rto {:?} srtt {:?} sack {} timestamps {} \
                 wscale {:?} records queued {} recv queued {}",
                c.cwnd(),
                c.ssthresh(),
                c.peer_window(),
                c.rto(),
                c.srtt(),
                c.sack_enabled(),
                c.timestamps_enabled(),
                c.window_shifts(),
                c.records_queued(),
                c.recv_queued(),
            );
        }
        None => {
            let _ = writeln!(s, "  no connection (yet, or any more)");
        }
    }
    let _ = writeln!(s, "  interface {:?}", driver.iface().stats());
    let _ = writeln!(s, "  stack {:?}", driver.iface().stack().stats());
    let _ = writeln!(s, "  driver {:?}", driver.stats());
    s
}

fn kernel_report(net: &Netns) -> String {
    let counters = kernel_counters(net);
    let mut s = String::from("  kernel:");
    for name in KERNEL_COUNTERS {
        let _ = write!(s, " {name}={}", counter(&counters, name));
    }
    // Everything else the kernel's TCP counted, for the post-mortem.
    let _ = write!(s, "\n  kernel, other non-zero:");
    for (name, v) in &counters {
        if *v != 0 && name.starts_with("Tcp") && !KERNEL_COUNTERS.contains(&name.as_str()) {
            let _ = write!(s, " {name}={v}");
        }
    }
    if let Ok(out) = Command::new("ip")
        .args(["netns", "exec", &net.ns, "ss", "-tinoH"])
        .output()
    {
        let _ = write!(
            s,
            "\n  kernel sockets:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    s
}

/// A packet capture on the kernel's end of the veth, taken when
/// `IWARP_KERNEL_PCAP` names a directory (for post-mortems; needs
/// tcpdump). The frames are as the kernel sees them: after the loss we
/// inject on our side, in both directions.
#[derive(Debug)]
struct Capture(std::process::Child);

impl Capture {
    fn start(net: &Netns, name: &str) -> Option<Capture> {
        let dir = std::env::var_os("IWARP_KERNEL_PCAP")?;
        let file: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = std::path::Path::new(&dir).join(format!("{file}.pcap"));
        let mut child = net
            .command("tcpdump")
            .args([
                "-i",
                &net.peer_if,
                "-s",
                "200",
                "-B",
                "16384",
                "--immediate-mode",
                "-U",
                "-w",
            ])
            .arg(&path)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| eprintln!("tcpdump not started: {e}"))
            .ok()?;
        // Wait for "listening on", so that the capture misses nothing.
        if let Some(err) = child.stderr.take() {
            use std::io::BufRead;
            let mut lines = std::io::BufReader::new(err).lines();
            let _ = lines.next();
        }
        println!("capturing the kernel side into {}", path.display());
        Some(Capture(child))
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // Let tcpdump drain the capture ring first: on SIGTERM it stops at
        // once, dropping what it has not written yet.
        std::thread::sleep(Duration::from_millis(500));
        // SIGTERM lets tcpdump flush its file.
        if let Ok(pid) = libc::pid_t::try_from(self.0.id()) {
            // SAFETY: kill has no memory effects; `pid` is our own child,
            // not yet reaped (we wait for it just below).
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let _ = self.0.wait();
    }
}

/// Runs `t` over a raw socket in a namespace of its own; panics with our
/// connection's state and stats, and the kernel's view, on any failure.
pub fn run(t: &Transfer) -> Option<Outcome> {
    if !require_root() {
        return None;
    }
    let net = Netns::create().expect("creating the namespace and veth pair");
    let mut driver = Driver::new(&net, t.config.clone(), t.loss).expect("opening the raw socket");
    let out = drive(&net, &mut driver, t);
    drop(driver);
    net.remove_and_check();
    Some(out)
}

/// Runs `t` over `driver` (made with `t.config` and `t.loss`) against the
/// kernel in `net`; panics with our connection's state and stats, and the
/// kernel's view, on any failure.
pub fn drive(net: &Netns, driver: &mut impl Engine, t: &Transfer) -> Outcome {
    let _capture = Capture::start(net, t.name);
    let wall = std::time::Instant::now();
    let port = 5000 + u16::try_from(std::process::id() % 1000).unwrap_or(0);

    let mut id: Option<ConnId> = None;
    let role = match t.open {
        Open::Active => Role::Listen(SocketAddrV4::new(net.kernel_ip, port)),
        Open::Passive => {
            driver
                .iface_mut()
                .stack_mut()
                .listen(SocketAddrV4::new(net.our_ip, port), 8)
                .expect("listening on our side");
            Role::Connect(SocketAddrV4::new(net.our_ip, port))
        }
    };
    let kernel = peer::spawn(PeerSpec {
        ns_path: net.ns_path(),
        role,
        bytes: t.bytes,
        send_seed: SEED_KERNEL_TO_US,
        recv_seed: SEED_US_TO_KERNEL,
        timeout: t.timeout,
    })
    .expect("starting the kernel peer");
    if t.open == Open::Active {
        let now = driver.now();
        id = Some(
            driver
                .iface_mut()
                .stack_mut()
                .connect(now, net.our_ip, SocketAddrV4::new(net.kernel_ip, port))
                .expect("connect"),
        );
    }

    // Fails the test with everything known about both sides.
    macro_rules! fail {
        ($($why:tt)*) => {{
            panic!(
                "{}: {}\n{}{}",
                t.name,
                format!($($why)*),
                state_report(driver, id),
                kernel_report(net)
            )
        }};
    }

    let mut sent = 0u64;
    let mut acked = 0u64;
    let mut received = 0u64;
    let mut peer_closed = false;
    let mut closing = false;
    let mut closed_event = false;
    let mut connected_at: Option<std::time::Instant> = None;
    let mut finished_at: Option<std::time::Instant> = None;
    let mut last_state = State::Closed;
    let mut final_stats = ConnStats::default();

    loop {
        if wall.elapsed() > t.timeout {
            fail!(
                "timed out after {:?}: sent {sent}, acked {acked}, received {received} of {} \
                 bytes; peer closed {peer_closed}, closing {closing}, kernel peer finished {}",
                t.timeout,
                t.bytes,
                kernel.is_finished()
            );
        }
        let mut busy = match driver.receive() {
            Ok(n) => n > 0,
            Err(e) => fail!("{e}"),
        };
        driver.run_timers();

        if id.is_none() {
            id = driver.iface_mut().stack_mut().accept(port);
        }
        if let Some(cid) = id {
            while let Some(ev) = driver.iface_mut().stack_mut().poll_event(cid) {
                busy = true;
                match ev {
                    Event::Connected => {
                        connected_at.get_or_insert_with(std::time::Instant::now);
                    }
                    Event::RecordAcked(r) => acked += r.len() as u64,
                    Event::PeerClosed => peer_closed = true,
                    Event::Closed => closed_event = true,
                    Event::Reset => fail!("connection reset"),
                    Event::TimedOut => fail!("connection timed out"),
                }
            }
            let now = driver.now();
            let mut error = None;
            if let Some(conn) = driver.iface_mut().stack_mut().conn_mut(cid) {
                last_state = conn.state();
                final_stats = *conn.stats();
                // In-order payload, verified.
                while let Some(p) = conn.recv() {
                    busy = true;
                    if let Err(e) = check_pattern(SEED_KERNEL_TO_US, received, p.bytes()) {
                        error = Some(format!("we received corrupt data: {e}"));
                        break;
                    }
                    received += p.len() as u64;
                }
                // Records, each sized to what the connection takes now.
                if matches!(conn.state(), State::Established | State::CloseWait) {
                    while sent < t.bytes && error.is_none() {
                        let cap = conn.send_capacity();
                        if cap == 0 {
                            break;
                        }
                        let len = usize::try_from((t.bytes - sent).min(cap as u64)).unwrap_or(cap);
                        let mut rec = vec![0u8; len];
                        fill_pattern(SEED_US_TO_KERNEL, sent, &mut rec);
                        if let Err((e, _)) = conn.send_record(now, rec) {
                            error = Some(format!(
                                "send_record of {len} (capacity {cap}) refused: {e:?}"
                            ));
                        }
                        sent += len as u64;
                        busy = true;
                    }
                    if sent == t.bytes && !closing {
                        conn.close(now);
                        closing = true;
                        busy = true;
                    }
                }
            }
            if let Some(e) = error {
                fail!("{e}");
            }
            if received > t.bytes {
                fail!("received {received} bytes, more than sent");
            }
        }

        match driver.transmit() {
            Ok(n) => busy |= n > 0,
            Err(e) => fail!("{e}"),
        }

        let ours_done = received == t.bytes
            && acked == t.bytes
            && peer_closed
            && closing
            && (closed_event || matches!(last_state, State::TimeWait | State::Closed));
        if ours_done && finished_at.is_none() {
            finished_at = Some(std::time::Instant::now());
        }
        if ours_done && kernel.is_finished() {
            break;
        }
        if !busy {
            if let Err(e) = driver.wait() {
                fail!("{e}");
            }
        }
    }

    let report = match kernel.join() {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => fail!("kernel side failed: {e}"),
        Err(_) => fail!("kernel peer thread panicked"),
    };
    let start = connected_at.unwrap_or(wall);
    let elapsed = finished_at.unwrap_or_else(std::time::Instant::now) - start;
    let secs = elapsed.as_secs_f64().max(1e-6);
    let counters = kernel_counters(net);
    println!(
        "{}: {} bytes each way verified (we received {received}, the kernel {} in {:.3} s), \
         both FINs exchanged, our state {}; {:.3} s from ESTABLISHED, \
         {:.1} Mbit/s each way ({:.1} Mbit/s total)",
        t.name,
        t.bytes,
        report.received,
        report.elapsed.as_secs_f64(),
        last_state.name(),
        secs,
        t.bytes as f64 * 8.0 / secs / 1e6,
        2.0 * t.bytes as f64 * 8.0 / secs / 1e6,
    );
    print!("{}", state_report(driver, id));
    println!("{}", kernel_report(net));
    // The kernel's loss recovery depends on our ACKs: one duplicate ACK
    // per out-of-order segment (RFC 5681 §4.2), SACK blocks when agreed.
    // Recovering mostly by timeout means it did not get them.
    let rtos = counter(&counters, "TcpExtTCPTimeouts");
    let recoveries =
        counter(&counters, "TcpExtTCPSackRecovery") + counter(&counters, "TcpExtTCPRenoRecovery");
    if rtos > recoveries {
        println!(
            "note: the kernel recovered by retransmission timeout {rtos} times and by fast \
             recovery only {recoveries} times: too few duplicate ACKs from our side?"
        );
    }
    assert_eq!(report.sent, t.bytes, "bytes the kernel sent");
    assert_eq!(report.received, t.bytes, "bytes the kernel received");
    assert_eq!(
        counter(&counters, "TcpEstabResets"),
        0,
        "the kernel saw a reset"
    );
    // Without loss the kernel never has a reason to send a RST. With loss
    // injected, a FIN it retransmitted may reach us twice, and the second
    // ACK from our TIME-WAIT arrives after its socket is gone: it answers
    // that stray ACK with a RST, as RFC 9293 §3.10.7.1 says, after every
    // byte was delivered (checked above). Established connections were
    // never reset either way (TcpEstabResets above).
    let rsts = counter(&counters, "TcpOutRsts");
    if t.loss.is_none() {
        assert_eq!(rsts, 0, "the kernel sent a RST");
    } else if rsts > 0 {
        println!("note: the kernel answered {rsts} late segment(s) after its close with a RST");
    }
    assert_eq!(counter(&counters, "TcpInCsumErrors"), 0, "our checksums");
    Outcome {
        received,
        acked,
        final_state: last_state,
        conn: final_stats,
        driver: driver.stats(),
        kernel_sent: report.sent,
        kernel_received: report.received,
        kernel_counters: counters,
    }
}

/// `ping -c count -s 1000` from the namespace to our address, our engine
/// answering (the kernel's ARP request first) until ping ends; its status,
/// its output and the engine's counters.
pub fn ping(net: &Netns, driver: &mut impl Engine, count: u32) -> (ExitStatus, String, IfaceStats) {
    let mut ping = net
        .command("ping")
        .args([
            "-c",
            &count.to_string(),
            "-i",
            "0.2",
            "-W",
            "2",
            "-s",
            "1000",
        ])
        .arg(net.our_ip.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running ping in the namespace (package iputils-ping)");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = ping.try_wait().expect("waiting for ping") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = ping.kill();
            let _ = ping.wait();
            panic!(
                "ping still running after 15 s; interface {:?}",
                driver.iface().stats()
            );
        }
        let rx = driver.receive().unwrap_or_else(|e| panic!("{e}"));
        driver.run_timers();
        let tx = driver.transmit().unwrap_or_else(|e| panic!("{e}"));
        if rx == 0 && tx == 0 {
            driver.wait().unwrap_or_else(|e| panic!("{e}"));
        }
    };
    let mut text = String::new();
    if let Some(mut so) = ping.stdout.take() {
        let _ = so.read_to_string(&mut text);
    }
    (status, text, *driver.iface().stats())
}
