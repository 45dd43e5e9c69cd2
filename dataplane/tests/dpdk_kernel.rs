//! The Linux kernel's TCP against our TCP engine on a DPDK port: a
//! `net_af_packet` port on our end of a veth pair (root namespace, no
//! address), the kernel's address on the other end inside a network
//! namespace with its offloads off. The engine runs below the RDMA layer
//! (the dataplane's application API carries RDMA, not plain TCP streams),
//! driven over the dataplane's own `DpdkLink` queue, so that these tests
//! prove the DPDK port and the TCP engine against a real third-party TCP.
//!
//! Each test runs in a process of its own (one EAL per process: run with
//! cargo-nextest), needs root (prints a skip notice without it, or fails
//! with `IWARP_REQUIRE_ROOT_TESTS=1`), and checks at the end that the EAL
//! runtime directory and the namespace are gone; guards remove both on
//! failure too.

#[path = "kernel/dpdk_driver.rs"]
mod dpdk_driver;
#[allow(dead_code, reason = "shared plumbing; this file uses part of it")]
mod kernel;

use std::io::Read;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dpdk_driver::{DpdkDriver, RuntimeDirGuard};
use kernel::driver::Loss;
use kernel::netns::{require_root, Netns};
use kernel::peer::{self, check_pattern, fill_pattern, PeerSpec, Role};
use kernel::transfer::kernel_counters;
use tcp_offload::tcp::{Config, ConnId, ConnStats, Event, State};

/// Bytes each way in the bulk tests.
const BULK_BYTES: u64 = 10 << 20;

/// Wall-clock limit of each transfer.
const TIMEOUT: Duration = Duration::from_secs(120);

const SEED_US_TO_KERNEL: u64 = 0x0bad_cafe_1234_5678;
const SEED_KERNEL_TO_US: u64 = 0x8765_4321_efac_dab0;

fn counter(counters: &[(String, i64)], name: &str) -> i64 {
    counters
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, v)| *v)
}

/// Builds the namespace and the DPDK port, runs `f`, tears everything
/// down and checks that nothing is left: the EAL runtime directory, the
/// namespace and our veth end.
fn with_port<T>(
    test: &str,
    tcp: Config,
    loss: Option<Loss>,
    f: impl FnOnce(&Netns, &mut DpdkDriver) -> T,
) -> Option<T> {
    if !require_root() {
        return None;
    }
    let net = Netns::create().expect("creating the namespace and veth pair");
    let (ns, host_if) = (net.ns.clone(), net.host_if.clone());
    let prefix = format!("iwarp-{test}-{}", std::process::id());
    let guard = RuntimeDirGuard(PathBuf::from("/var/run/dpdk").join(&prefix));
    let (mut driver, eal) =
        DpdkDriver::new(&net, &prefix, tcp, loss).expect("EAL and the net_af_packet port");
    println!(
        "net_af_packet on {} (kernel {} in {}), our {} {:02x?}; setup {:?}",
        net.host_if,
        net.kernel_ip,
        net.ns,
        net.our_ip,
        net.our_mac(),
        driver.link().setup()
    );
    let out = f(&net, &mut driver);
    drop(driver);
    drop(eal);
    assert!(!guard.0.exists(), "EAL left {} behind", guard.0.display());
    drop(net);
    let list = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    assert!(
        !String::from_utf8_lossy(&list.stdout).contains(&ns),
        "namespace {ns} still there"
    );
    assert!(
        !std::path::Path::new(&format!("/sys/class/net/{host_if}")).exists(),
        "{host_if} still there"
    );
    println!(
        "cleanup: {} removed, namespace {ns} and {host_if} removed",
        guard.0.display()
    );
    Some(out)
}

/// Which side opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    /// Our engine connects to the kernel's listener.
    Active,
    /// The kernel connects to our listener.
    Passive,
}

/// What a transfer measured.
#[derive(Debug)]
struct Outcome {
    received: u64,
    acked: u64,
    final_state: State,
    conn: ConnStats,
    kernel_sent: u64,
    kernel_received: u64,
    kernel_counters: Vec<(String, i64)>,
}

fn state_report(driver: &DpdkDriver, id: Option<ConnId>) -> String {
    let conn = id.and_then(|id| driver.iface.stack().conn(id)).map_or_else(
        || "no connection".to_string(),
        |c| {
            format!(
                "{} -> {}: {}, {:?}, cwnd {}, rto {:?}",
                c.local(),
                c.remote(),
                c.state().name(),
                c.stats(),
                c.cwnd(),
                c.rto()
            )
        },
    );
    format!(
        "  ours: {conn}\n  interface {:?}\n  driver {:?}\n",
        driver.iface.stats(),
        driver.stats
    )
}

/// Both ways at once, `bytes` each, verified on both sides, then FINs
/// both ways; panics with both sides' state on any failure.
fn transfer(net: &Netns, driver: &mut DpdkDriver, name: &str, open: Open, bytes: u64) -> Outcome {
    let wall = Instant::now();
    let port = 6000 + u16::try_from(std::process::id() % 1000).unwrap_or(0);
    let mut id: Option<ConnId> = None;
    let role = match open {
        Open::Active => Role::Listen(SocketAddrV4::new(net.kernel_ip, port)),
        Open::Passive => {
            driver
                .iface
                .stack_mut()
                .listen(SocketAddrV4::new(net.our_ip, port), 8)
                .expect("listening on our side");
            Role::Connect(SocketAddrV4::new(net.our_ip, port))
        }
    };
    let kernel = peer::spawn(PeerSpec {
        ns_path: net.ns_path(),
        role,
        bytes,
        send_seed: SEED_KERNEL_TO_US,
        recv_seed: SEED_US_TO_KERNEL,
        timeout: TIMEOUT,
    })
    .expect("starting the kernel peer");
    if open == Open::Active {
        let now = driver.now();
        id = Some(
            driver
                .iface
                .stack_mut()
                .connect(now, net.our_ip, SocketAddrV4::new(net.kernel_ip, port))
                .expect("connect"),
        );
    }

    macro_rules! fail {
        ($($why:tt)*) => {{
            let counters = kernel_counters(net);
            let nonzero: Vec<_> = counters
                .iter()
                .filter(|(n, v)| *v != 0 && n.starts_with("Tcp"))
                .collect();
            panic!(
                "{name}: {}\n{}  kernel: {nonzero:?}",
                format!($($why)*),
                state_report(driver, id),
            )
        }};
    }

    let (mut sent, mut acked, mut received) = (0u64, 0u64, 0u64);
    let (mut peer_closed, mut closing, mut closed_event) = (false, false, false);
    let mut connected_at: Option<Instant> = None;
    let mut finished_at: Option<Instant> = None;
    let mut last_state = State::Closed;
    let mut final_stats = ConnStats::default();

    loop {
        if wall.elapsed() > TIMEOUT {
            fail!(
                "timed out: sent {sent}, acked {acked}, received {received} of {bytes}; peer \
                 closed {peer_closed}, closing {closing}, kernel finished {}",
                kernel.is_finished()
            );
        }
        let mut busy = driver.receive() > 0;
        driver.run_timers();
        if id.is_none() {
            id = driver.iface.stack_mut().accept(port);
        }
        if let Some(cid) = id {
            while let Some(ev) = driver.iface.stack_mut().poll_event(cid) {
                busy = true;
                match ev {
                    Event::Connected => {
                        connected_at.get_or_insert_with(Instant::now);
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
            if let Some(conn) = driver.iface.stack_mut().conn_mut(cid) {
                last_state = conn.state();
                final_stats = *conn.stats();
                while let Some(p) = conn.recv() {
                    busy = true;
                    if let Err(e) = check_pattern(SEED_KERNEL_TO_US, received, p.bytes()) {
                        error = Some(format!("we received corrupt data: {e}"));
                        break;
                    }
                    received += p.len() as u64;
                }
                if matches!(conn.state(), State::Established | State::CloseWait) {
                    while sent < bytes && error.is_none() {
                        let cap = conn.send_capacity();
                        if cap == 0 {
                            break;
                        }
                        let len = usize::try_from((bytes - sent).min(cap as u64)).unwrap_or(cap);
                        let mut rec = vec![0u8; len];
                        fill_pattern(SEED_US_TO_KERNEL, sent, &mut rec);
                        if let Err((e, _)) = conn.send_record(now, rec) {
                            error = Some(format!("send_record of {len} refused: {e:?}"));
                        }
                        sent += len as u64;
                        busy = true;
                    }
                    if sent == bytes && !closing {
                        conn.close(now);
                        closing = true;
                        busy = true;
                    }
                }
            }
            if let Some(e) = error {
                fail!("{e}");
            }
            if received > bytes {
                fail!("received {received} bytes, more than sent");
            }
        }
        busy |= driver.transmit() > 0;

        let ours_done = received == bytes
            && acked == bytes
            && peer_closed
            && closing
            && (closed_event || matches!(last_state, State::TimeWait | State::Closed));
        if ours_done && finished_at.is_none() {
            finished_at = Some(Instant::now());
        }
        if ours_done && kernel.is_finished() {
            break;
        }
        if !busy {
            driver.wait();
        }
    }

    let report = match kernel.join() {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => fail!("kernel side failed: {e}"),
        Err(_) => fail!("kernel peer thread panicked"),
    };
    let secs = (finished_at.unwrap_or_else(Instant::now) - connected_at.unwrap_or(wall))
        .as_secs_f64()
        .max(1e-6);
    println!(
        "{name}: {bytes} bytes each way verified (we received {received}, the kernel {}), both \
         FINs exchanged, our state {}; {secs:.3} s from ESTABLISHED, {:.1} Mbit/s each way \
         ({:.1} Mbit/s total)",
        report.received,
        last_state.name(),
        bytes as f64 * 8.0 / secs / 1e6,
        2.0 * bytes as f64 * 8.0 / secs / 1e6,
    );
    print!("{}", state_report(driver, id));
    Outcome {
        received,
        acked,
        final_state: last_state,
        conn: final_stats,
        kernel_sent: report.sent,
        kernel_received: report.received,
        kernel_counters: kernel_counters(net),
    }
}

fn assert_complete(out: &Outcome) {
    assert_eq!(out.received, BULK_BYTES, "bytes we received");
    assert_eq!(out.acked, BULK_BYTES, "bytes of ours acknowledged");
    assert_eq!(out.kernel_sent, BULK_BYTES, "bytes the kernel sent");
    assert_eq!(out.kernel_received, BULK_BYTES, "bytes the kernel received");
    assert!(
        matches!(out.final_state, State::TimeWait | State::Closed),
        "our connection ended in {}",
        out.final_state.name()
    );
    let c = &out.kernel_counters;
    assert_eq!(counter(c, "TcpEstabResets"), 0, "the kernel saw a reset");
    assert_eq!(counter(c, "TcpOutRsts"), 0, "the kernel sent a RST");
    assert_eq!(counter(c, "TcpInCsumErrors"), 0, "our checksums");
}

/// The dataplane's TCP as client of a kernel TCP server.
#[test]
fn dpdk_active_open_to_kernel_server() {
    let Some(out) = with_port("kact", Config::default(), None, |net, d| {
        transfer(
            net,
            d,
            "DPDK client, kernel server",
            Open::Active,
            BULK_BYTES,
        )
    }) else {
        return;
    };
    assert_complete(&out);
}

/// The dataplane's TCP as server for a kernel TCP client.
#[test]
fn dpdk_passive_open_from_kernel_client() {
    let Some(out) = with_port("kpas", Config::default(), None, |net, d| {
        transfer(
            net,
            d,
            "kernel client, DPDK server",
            Open::Passive,
            BULK_BYTES,
        )
    }) else {
        return;
    };
    assert_complete(&out);
}

/// The client transfer with 2 % of the TCP frames we receive and 2 % of
/// those we send dropped on our side (seeded): recovery against the
/// kernel's TCP still delivers every byte, both ways.
#[test]
fn dpdk_active_open_with_loss() {
    let loss = Loss {
        rx: 0.02,
        tx: 0.02,
        seed: 0xd9d4,
    };
    let Some((out, rx_drops, tx_drops)) =
        with_port("kloss", Config::default(), Some(loss), |net, d| {
            let out = transfer(
                net,
                d,
                "DPDK client, 2 % loss each way",
                Open::Active,
                BULK_BYTES,
            );
            (out, d.stats.rx_injected_drops, d.stats.tx_injected_drops)
        })
    else {
        return;
    };
    assert_complete(&out);
    assert!(rx_drops > 0 && tx_drops > 0, "loss was injected");
    assert!(out.conn.retransmits > 0, "loss without retransmissions");
    println!(
        "injected drops: {rx_drops} received, {tx_drops} sent; our retransmits {}, fast \
         retransmits {}, RTO expirations {}; kernel retransmitted {} segments",
        out.conn.retransmits,
        out.conn.fast_retransmits,
        out.conn.rto_expirations,
        counter(&out.kernel_counters, "TcpRetransSegs")
    );
}

/// `ping` in the namespace: the kernel's ARP request for our address and
/// its echo requests are answered through the DPDK port.
#[test]
fn dpdk_answers_kernel_arp_and_ping() {
    let Some((status, text, stats)) = with_port("kping", Config::default(), None, |net, d| {
        let mut ping = net
            .command("ping")
            .args(["-c", "5", "-i", "0.2", "-W", "2", "-s", "1000"])
            .arg(net.our_ip.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running ping in the namespace (package iputils-ping)");
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(status) = ping.try_wait().expect("waiting for ping") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = ping.kill();
                let _ = ping.wait();
                panic!("ping still running after 15 s; {:?}", d.iface.stats());
            }
            let rx = d.receive();
            d.run_timers();
            let tx = d.transmit();
            if rx == 0 && tx == 0 {
                d.wait();
            }
        };
        let mut text = String::new();
        if let Some(mut so) = ping.stdout.take() {
            let _ = so.read_to_string(&mut text);
        }
        (status, text, *d.iface.stats())
    }) else {
        return;
    };
    print!("{text}");
    println!("interface {stats:?}");
    assert!(status.success(), "ping failed ({status}): {text}");
    assert!(text.contains("5 received"), "ping output: {text}");
    assert!(
        stats.icmp_in >= 5 && stats.icmp_out >= 5,
        "echo requests and replies counted"
    );
    assert!(
        stats.arp_in >= 1 && stats.arp_out >= 1,
        "the kernel's ARP request answered"
    );
}
