//! What scraping the service's Prometheus endpoint costs the data path:
//! `write-bw` between two dataplanes of this process over an in-memory
//! link, in rounds alternating between not scraped and scraped at 10 Hz
//! (a client thread sending `GET /metrics` over TCP to the endpoint of
//! `iwarp serve`, `iwarp::metrics::serve`, which renders the
//! sender's counters and queue pairs), in the same run. Prints each
//! pair of rounds (not scraped, then scraped) with its ratio, and the
//! median of those ratios (target: at least 0.98).
//!
//! The endpoint reads only what the workers publish into atomics, so the
//! ratio should be 1 within the noise of the machine. On a small machine
//! shared with other work the bandwidth of a round drifts with the load,
//! hence short rounds, each scraped round compared with the unscraped one
//! just before it, and the median of the pairs.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dataplane::api::Dataplane;
use dataplane::config::Config;
use iwarp::metrics;
use iwarp::runner::{connect_direct, RemoteBuf, Resources, Role, RunSpec, TestKind};
use iwarp::serve::{Level, Log, Service};
use tcp_offload::wire::EthernetAddress;

/// Rounds of each kind.
const ROUNDS: usize = 7;
/// Length of a round.
const ROUND: Duration = Duration::from_millis(1500);
/// Message size.
const SIZE: usize = 64 << 10;
/// Scrape interval: 10 Hz.
const SCRAPE_EVERY: Duration = Duration::from_millis(100);

fn config(ip: Ipv4Addr, mac: [u8; 6]) -> Config {
    let mut c = Config::single("mem:scrape-bench", ip, EthernetAddress(mac));
    c.idle.spin = 200;
    c.idle.sleep_us = 20;
    c
}

fn spec(role: Role) -> RunSpec {
    RunSpec {
        test: TestKind::WriteBw,
        role,
        size: SIZE,
        iterations: 1 << 40,
        duration: Some(ROUND),
        qps: 1,
        tx_depth: 128,
        rx_depth: 1,
        outstanding_reads: 0,
        verify: false,
        all_sizes: false,
        busy_poll: false,
    }
}

/// `GET /metrics`; the body's length.
fn scrape(addr: &str) -> std::io::Result<usize> {
    let mut s = TcpStream::connect(addr)?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")?;
    let mut text = Vec::new();
    s.read_to_end(&mut text)?;
    Ok(text.len())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that names something else
    // skips this benchmark.
    if let Some(f) = std::env::args().skip(1).find(|a| !a.starts_with('-')) {
        if !"scrape".contains(f.as_str()) {
            return;
        }
    }
    let (ip_a, ip_b) = (Ipv4Addr::new(10, 77, 0, 1), Ipv4Addr::new(10, 77, 0, 2));
    let sender_config = config(ip_a, [2, 0, 0, 0, 0x77, 1]);
    let a = Dataplane::open(&sender_config).expect("sender dataplane");
    let b = Dataplane::open(&config(ip_b, [2, 0, 0, 0, 0x77, 2])).expect("receiver dataplane");
    let svc = Service {
        dp: a,
        config: sender_config,
        responders: Vec::new(),
        stop: AtomicBool::new(false),
        started: Instant::now(),
        log: Log::new(Level::Error, false),
        capture: Default::default(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").expect("metrics listener");
    let addr = listener.local_addr().expect("its address").to_string();
    let client_spec = spec(Role::Client);
    let server_spec = spec(Role::Server);
    let rc = Resources::new(&svc.dp, &client_spec).expect("sender resources");
    let rs = Resources::new(&b, &server_spec).expect("receiver resources");
    connect_direct(&svc.dp, &rc, &b, &rs, SocketAddrV4::new(ip_b, 18600), 0).expect("connection");
    let remote: Vec<RemoteBuf> = vec![rs.local_buf(0)];
    let scraping = AtomicBool::new(false);
    let scrapes = AtomicU64::new(0);
    let scraped_bytes = AtomicU64::new(0);
    let mut plain = Vec::new();
    let mut scraped = Vec::new();
    let mut pairs = Vec::new();
    std::thread::scope(|scope| {
        scope.spawn(|| metrics::serve(&svc, listener, "/metrics"));
        scope.spawn(|| {
            let mut next = Instant::now();
            while !svc.stop.load(Ordering::Acquire) {
                if scraping.load(Ordering::Acquire) {
                    if let Ok(n) = scrape(&addr) {
                        scrapes.fetch_add(1, Ordering::Relaxed);
                        scraped_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
                next += SCRAPE_EVERY;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        // A warm-up round, not counted.
        let _ = rc.run(&svc.dp, &client_spec, &remote, &mut |_| {});
        for round in 0..2 * ROUNDS {
            let on = round % 2 == 1;
            scraping.store(on, Ordering::Release);
            let before = scrapes.load(Ordering::Relaxed);
            let r = rc
                .run(&svc.dp, &client_spec, &remote, &mut |_| {})
                .expect("write-bw round");
            let n = scrapes.load(Ordering::Relaxed) - before;
            println!(
                "round {:>2} {:<11} {:>9.1} MB/s ({} scrapes)",
                round + 1,
                if on { "scraped" } else { "not scraped" },
                r.bw_avg_mbps,
                n
            );
            if on {
                scraped.push(r.bw_avg_mbps);
                let (p, s) = (plain[plain.len() - 1], r.bw_avg_mbps);
                pairs.push(s / p);
                println!(
                    "   pair {:>2}: scraped / not scraped {:.3}",
                    pairs.len(),
                    s / p
                );
            } else {
                plain.push(r.bw_avg_mbps);
            }
        }
        scraping.store(false, Ordering::Release);
        svc.stop.store(true, Ordering::Release);
    });
    rc.close(&svc.dp);
    rs.close(&b);
    let (p, s) = (median(&mut plain), median(&mut scraped));
    let ratio = median(&mut pairs);
    println!(
        "write-bw {SIZE} B over a memory link: median {p:.1} MB/s not scraped, {s:.1} MB/s scraped at 10 Hz \
         ({} scrapes, {} bytes each on average)",
        scrapes.load(Ordering::Relaxed),
        scraped_bytes.load(Ordering::Relaxed) / scrapes.load(Ordering::Relaxed).max(1)
    );
    println!(
        "scraped / not scraped, median of {} pairs: {ratio:.3} (target >= 0.98); ratio of the medians {:.3}{}",
        pairs.len(),
        s / p,
        if ratio >= 0.98 { "" } else { "  BELOW TARGET" }
    );
}
