//! `iwarp serve` as an operator runs it: the built binary started as a
//! service, queried through its control socket (`iwarp stats`, `iwarp qp
//! list`, both `--json`), its Prometheus endpoint scraped and every line
//! parsed, then stopped by SIGTERM: exit 0 within seconds, the control
//! socket removed, nothing left under the EAL runtime directory.
//!
//! - Without root: a service on an in-memory link (no peer), and the
//!   one-line errors of a bad configuration and of a service that is not
//!   running; in this process, two threads sharing one dataplane in event
//!   scopes of their own ports, as the responders do, each receiving only
//!   its own events.
//! - With root: the service in one network namespace on `net_af_packet`
//!   over a veth pair, `iwarp perf write-bw` and `iwarp rping -c` as its
//!   clients in the other; the control socket is a file-system path, so
//!   the test reaches it from outside both namespaces; the metrics are
//!   read from a thread that joined the service's namespace (setns(2)).
//!   During the perf run, both show the af_packet device's own counters
//!   (`device_counters`, `iwarp_port_*_total{port,device}`) next to the
//!   worker's; over the in-memory link there are none. Without root it prints a skip notice, or fails with
//!   `IWARP_REQUIRE_ROOT_TESTS=1`.

#[path = "../../tests/capture_common/mod.rs"]
mod capture_common;
#[path = "../../tests/netns_common/mod.rs"]
mod netns_common;
#[path = "../../tests/runtime_common/mod.rs"]
mod runtime_common;
mod tool_common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use capture_common::{have_tshark, tshark_lines};
use serde_json::Value;
use tool_common::{
    eal_args, iwarp, require_root, runtime_dir, unique_prefix, Proc, RuntimeDir, TwoNs, IWARP,
};

/// Limit of each process.
const LIMIT: Duration = Duration::from_secs(90);
/// How long a stopped service may take.
const STOP_LIMIT: Duration = Duration::from_secs(8);

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(unique_prefix(tag));
        std::fs::create_dir_all(&p).expect("scratch directory");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free local TCP port (bound and released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The PID of the process whose command line holds `needle` (the service,
/// found by its unique configuration path: `ip netns exec` execs it).
fn pid_of(needle: &str) -> Option<libc::pid_t> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: libc::pid_t = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        (cmd.contains(needle) && cmd.contains(" serve ") && !cmd.starts_with("ip ")).then_some(pid)
    })
}

fn sigterm(pid: libc::pid_t) {
    // SAFETY: kill has no memory effects; the PID is the service this test
    // started (found by its unique configuration path), still running.
    unsafe { libc::kill(pid, libc::SIGTERM) };
}

/// `iwarp <cmd…> --socket S --json`, parsed.
fn query(args: &[&str], socket: &Path) -> Value {
    let mut a: Vec<&str> = args.to_vec();
    let s = socket.to_str().expect("utf-8 path");
    a.extend(["--socket", s, "--json"]);
    let out = iwarp(&args.join("-"), &a, Duration::from_secs(20));
    assert!(out.status.success(), "iwarp {a:?}: {:?}", out.stderr);
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("iwarp {a:?} --json is not JSON ({e}): {}", out.stdout))
}

/// `GET /metrics` over HTTP/1.1; the body.
fn scrape(addr: &str) -> Result<String, String> {
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP head in {text:?}"))?;
    if !head.starts_with("HTTP/1.1 200") || !head.contains("text/plain; version=0.0.4") {
        return Err(format!("unexpected response head {head:?}"));
    }
    Ok(body.to_string())
}

/// `iwarp capture <args…> --socket S` (with `--json` if asked).
fn capture_cmd(args: &[&str], socket: &Path, json: bool) -> tool_common::Ended {
    let mut a = vec!["capture"];
    a.extend_from_slice(args);
    a.extend(["--socket", socket.to_str().expect("utf-8 path")]);
    if json {
        a.push("--json");
    }
    iwarp("capture", &a, Duration::from_secs(20))
}

/// `iwarp capture <args…> --json`, which must succeed; its answer.
fn capture_json(args: &[&str], socket: &Path) -> Value {
    let out = capture_cmd(args, socket, true);
    assert!(out.status.success(), "capture {args:?}: {:?}", out.stderr);
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("capture {args:?} --json is not JSON ({e}): {}", out.stdout))
}

/// `iwarp capture <args…>`, which must fail in one line; that line.
fn capture_refused(args: &[&str], socket: &Path) -> String {
    let out = capture_cmd(args, socket, false);
    assert!(!out.status.success(), "capture {args:?} succeeded");
    assert_eq!(out.stderr.len(), 1, "one line: {:?}", out.stderr);
    out.stderr[0].clone()
}

/// Reads the capture back with `pcap_kit`: its records.
fn pcap_records(path: &Path) -> usize {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    pcap_kit::Reader::read_all(&bytes)
        .unwrap_or_else(|e| panic!("{} does not parse as pcap: {e:?}", path.display()))
        .len()
}

/// A sample's name and labels (sorted), and its value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the text exposition format strictly: `# HELP` / `# TYPE` lines
/// before their family's samples, each sample `name{labels} value` with a
/// valid name, quoted label values, a number.
fn parse_exposition(text: &str) -> Result<Vec<Sample>, String> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut p = rest.splitn(3, ' ');
            let (kw, name, what) = (p.next(), p.next(), p.next());
            match (kw, name, what) {
                (Some("HELP"), Some(n), Some(_)) if name_ok(n) => {}
                (Some("TYPE"), Some(n), Some(t))
                    if name_ok(n)
                        && ["counter", "gauge", "summary", "histogram", "untyped"].contains(&t) =>
                {
                    typed.insert(n.to_string(), t.to_string());
                }
                _ => return Err(format!("bad comment line {line:?}")),
            }
            continue;
        }
        if line.is_empty() {
            return Err("empty line".into());
        }
        let (series, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("no value in {line:?}"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| format!("bad value in {line:?}"))?,
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((n, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .ok_or_else(|| format!("unclosed labels in {line:?}"))?;
                let mut labels = BTreeMap::new();
                for pair in body.split(',').filter(|p| !p.is_empty()) {
                    let (k, v) = pair
                        .split_once('=')
                        .ok_or_else(|| format!("bad label in {line:?}"))?;
                    let v = v
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .ok_or_else(|| format!("unquoted label value in {line:?}"))?;
                    if !name_ok(k) {
                        return Err(format!("bad label name in {line:?}"));
                    }
                    labels.insert(k.to_string(), v.to_string());
                }
                (n, labels)
            }
        };
        if !name_ok(name) {
            return Err(format!("bad metric name in {line:?}"));
        }
        let family = ["_sum", "_count", "_bucket"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains_key(*f)))
            .unwrap_or(name);
        if !typed.contains_key(family) {
            return Err(format!("sample before its # TYPE: {line:?}"));
        }
        if typed[family] == "counter" && !name.ends_with("_total") {
            return Err(format!("counter not named *_total: {line:?}"));
        }
        out.push((name.to_string(), labels, value));
    }
    Ok(out)
}

fn sample(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.2)
}

fn n(v: &Value, path: &[&str]) -> u64 {
    let mut x = v;
    for p in path {
        x = match p.parse::<usize>() {
            Ok(i) => &x[i],
            Err(_) => &x[*p],
        };
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("{path:?} not a number in {v}"))
}

/// Sends SIGTERM to the service `p` started with configuration `cfg` and
/// waits until it exits, at most [`STOP_LIMIT`]; it must exit with
/// success.
fn stop_service(p: &mut Proc, cfg: &Path) -> tool_common::Ended {
    let pid = pid_of(cfg.to_str().expect("utf-8")).expect("the service's PID");
    let since = Instant::now();
    sigterm(pid);
    let ended = p.wait(since + STOP_LIMIT).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "service stopped in {:.2} s with {}",
        since.elapsed().as_secs_f64(),
        ended.status
    );
    assert!(ended.status.success(), "{:?}", ended.stderr);
    ended
}

// ---------------------------------------------------------------------
// Without root.
// ---------------------------------------------------------------------

#[test]
fn bad_configuration_fails_in_one_line() {
    let dir = TempDir::new("serve-bad");
    let cfg = dir.0.join("bad.toml");
    for (what, body, want) in [
        (
            "unknown test",
            "[[serve.perf]]\nport = 18515\ntest = \"write-fast\"\n",
            "unknown test",
        ),
        (
            "unknown key",
            "[serve]\ncontrol_sock = \"/x\"\n",
            "control_sock",
        ),
        (
            "two responders on a port",
            "[[serve.perf]]\nport = 7174\ntest = \"write-bw\"\n[[serve.rping]]\nport = 7174\n",
            "two responders",
        ),
        (
            "bad metrics address",
            "[metrics]\nlisten = \"localhost\"\n",
            "metrics.listen",
        ),
    ] {
        let text = format!(
            "[[ports]]\ndevice = \"mem:serve-bad\"\nip = \"10.9.9.1\"\nmac = \"02:00:00:00:09:01\"\n{body}"
        );
        std::fs::write(&cfg, text).expect("config file");
        let out = iwarp(
            what,
            &["serve", "--config", cfg.to_str().expect("utf-8")],
            Duration::from_secs(20),
        );
        assert_eq!(out.status.code(), Some(1), "{what}: {:?}", out.stderr);
        assert_eq!(
            out.stderr.len(),
            1,
            "{what}: one line, got {:?}",
            out.stderr
        );
        assert!(
            out.stderr[0].starts_with("iwarp: ") && out.stderr[0].contains(want),
            "{what}: {:?}",
            out.stderr
        );
        println!("{what}: {}", out.stderr[0]);
    }
    for args in [&["stats"][..], &["qp", "list"][..]] {
        let mut a = args.to_vec();
        let missing = dir.0.join("nobody.sock");
        a.extend(["--socket", missing.to_str().expect("utf-8")]);
        let out = iwarp("no service", &a, Duration::from_secs(20));
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(out.stderr.len(), 1, "{:?}", out.stderr);
        assert!(
            out.stderr[0].contains("cannot reach the service"),
            "{:?}",
            out.stderr
        );
        println!("{args:?} without a service: {}", out.stderr[0]);
    }
}

#[test]
fn service_on_a_memory_link_answers_and_stops_clean() {
    let dir = TempDir::new("serve-mem");
    let socket = dir.0.join("control.sock");
    let captures = dir.0.join("captures");
    let metrics = format!("127.0.0.1:{}", free_port());
    let cfg = dir.0.join("serve.toml");
    // SAFETY: getgid has no preconditions and cannot fail.
    let gid = unsafe { libc::getgid() };
    // systemd's readiness socket, played by the test.
    let notify_path = dir.0.join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).expect("notify socket");
    notify
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    std::fs::write(
        &cfg,
        format!(
            "[[ports]]\ndevice = \"mem:serve-mem\"\nip = \"10.9.8.1\"\nmac = \"02:00:00:00:08:01\"\n\
             [idle]\nspin = 200\nsleep_us = 50\n\
             [serve]\ncontrol_socket = {socket:?}\nsocket_mode = \"0660\"\nsocket_group = \"{gid}\"\n\
             capture_dir = {captures:?}\ncapture_ring_frames = 64\n\
             [[serve.perf]]\nport = 18515\ntest = \"write-bw\"\nsize = 65536\nrx_depth = 512\nouts = 16\n\
             [[serve.perf]]\nport = 18516\ntest = \"read-lat\"\nsize = \"2\"\n\
             [[serve.rping]]\nport = 7174\nsize = 64\n\
             [metrics]\nlisten = {metrics:?}\n"
        ),
    )
    .expect("config file");
    let mut cmd = Command::new(IWARP);
    cmd.args(["serve", "--config", cfg.to_str().expect("utf-8")])
        .env("NOTIFY_SOCKET", &notify_path);
    let mut svc = Proc::spawn("serve", cmd);
    let mut buf = [0u8; 256];
    let got = notify.recv(&mut buf).expect("READY=1 from the service");
    let ready = String::from_utf8_lossy(&buf[..got]).to_string();
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    println!("systemd notification: {ready:?}");
    let deadline = Instant::now() + LIMIT;
    svc.wait_stderr("event=started", deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    // The responders start on threads of their own, in any order.
    let mut listening: Vec<String> = (0..3)
        .map(|_| {
            let l = svc
                .wait_stderr("event=listening", deadline)
                .unwrap_or_else(|e| panic!("{e}"));
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("responder="))
                .unwrap_or("")
                .to_string()
        })
        .collect();
    listening.sort();
    assert_eq!(listening, ["perf:18515", "perf:18516", "rping:7174"]);
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let meta = std::fs::metadata(&socket).expect("the control socket exists");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660, "socket mode");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.gid(), gid, "socket group");

    let stats = query(&["stats"], &socket);
    assert_eq!(
        stats["workers"].as_array().map(Vec::len),
        Some(1),
        "{stats}"
    );
    assert!(n(&stats, &["workers", "0", "loops"]) > 0, "{stats}");
    let names: Vec<&str> = stats["responders"]
        .as_array()
        .expect("responders")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(names, ["perf:18515", "perf:18516", "rping:7174"]);
    assert_eq!(stats["ports"][0]["device"], "mem:serve-mem");
    assert!(
        stats["ports"][0]["link"]["tx_frames"].is_u64(),
        "the memory link's counters: {stats}"
    );
    assert!(
        stats["ports"][0]["device_counters"].is_null(),
        "an in-memory link has no device counters: {stats}"
    );
    let qps = query(&["qp", "list"], &socket);
    let list = qps["qps"].as_array().expect("qps");
    assert!(
        list.iter()
            .all(|q| q["state"] == "idle" && q["peer"].is_null()),
        "no client: every queue pair idle, {qps}"
    );
    // The table forms print too.
    for args in [&["stats"][..], &["qp", "list"][..]] {
        let mut a = args.to_vec();
        a.extend(["--socket", socket.to_str().expect("utf-8")]);
        let out = iwarp("table", &a, Duration::from_secs(20));
        assert!(
            out.status.success() && !out.stdout.is_empty(),
            "{:?}",
            out.stderr
        );
    }

    // An idle service with sleep_us = 50 sleeps once it has spun 200
    // empty polls; on a loaded machine its first 200 may take a while.
    let (body, samples) = loop {
        let body = scrape(&metrics).unwrap_or_else(|e| panic!("{e}"));
        let samples = parse_exposition(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
        let slept = sample(&samples, "iwarp_idle_sleeps_total", &[("worker", "0")]);
        if slept.is_some_and(|v| v > 0.0) {
            break (body, samples);
        }
        assert!(
            Instant::now() < deadline,
            "the idle worker never slept: {body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(sample(&samples, "iwarp_loops_total", &[("worker", "0")]).is_some_and(|v| v > 0.0));
    assert!(sample(&samples, "iwarp_idle_wakeups_total", &[("worker", "0")]).is_some());
    // PAWS drops: in the metrics and in `iwarp stats --json`, zero here.
    assert_eq!(
        sample(&samples, "iwarp_paws_drops_total", &[("worker", "0")]),
        Some(0.0),
        "{body}"
    );
    assert_eq!(
        stats["workers"][0]["paws_drops"].as_u64(),
        Some(0),
        "{stats}"
    );
    assert!(sample(&samples, "iwarp_link_rx_ring_full_total", &[("port", "0")]).is_some());
    assert!(
        !body.contains("iwarp_port_"),
        "no device families over an in-memory link: {body}"
    );
    assert_eq!(
        sample(
            &samples,
            "iwarp_responder_sessions_total",
            &[("responder", "rping:7174")]
        ),
        Some(0.0)
    );
    println!(
        "scraped {} samples of {} families from {metrics}",
        samples.len(),
        body.lines().filter(|l| l.starts_with("# TYPE")).count()
    );

    // Packet capture through the control socket (the link has no peer:
    // the file holds what the idle service sends, its header at least).
    let e = capture_refused(&["stop"], &socket);
    assert!(e.contains("no capture is running"), "{e}");
    let started = capture_json(&["start", "idle.pcap", "--snaplen", "128"], &socket);
    let file = captures.join("idle.pcap");
    assert_eq!(started["file"], file.display().to_string(), "{started}");
    assert_eq!(started["snaplen"], 128, "{started}");
    assert_eq!(started["ring_frames"], 64, "{started}");
    assert!(file.exists(), "the capture directory was made");
    let e = capture_refused(&["start", "other.pcap"], &socket);
    assert!(e.contains("a capture is running already"), "{e}");
    let stats = query(&["stats"], &socket);
    assert!(n(&stats, &["workers", "0", "loops"]) > 0, "{stats}");
    let stopped = capture_json(&["stop"], &socket);
    assert_eq!(
        stopped["workers"].as_array().map(Vec::len),
        Some(1),
        "{stopped}"
    );
    assert_eq!(stopped["dropped"], 0, "{stopped}");
    let records = pcap_records(&file);
    assert_eq!(
        Some(records as u64),
        stopped["captured"].as_u64(),
        "{stopped}"
    );
    assert_eq!(
        stopped["bytes"].as_u64(),
        std::fs::metadata(&file).ok().map(|m| m.len()),
        "{stopped}"
    );
    // Refusals, each one line.
    let e = capture_refused(&["start", "../escape.pcap"], &socket);
    assert!(e.contains("stays under"), "{e}");
    let e = capture_refused(&["start", "/proc/no-such-dir/x.pcap"], &socket);
    assert!(
        e.starts_with("iwarp: the service refused capture start: cannot create capture file /proc/no-such-dir/x.pcap: ")
            && e.contains(&format!("capture files go under {}", captures.display())),
        "{e}"
    );
    println!("capture refused outside the capture directory: {e}");
    // The table form: the file, then one line per worker.
    capture_json(&["start", "second.pcap"], &socket);
    let out = capture_cmd(&["stop"], &socket, false);
    assert!(out.status.success(), "{:?}", out.stderr);
    assert!(
        out.stdout.contains("second.pcap: ") && out.stdout.contains("  worker 0: "),
        "{}",
        out.stdout
    );
    println!(
        "capture on the idle memory link: {records} frames read back; stop printed {:?}",
        out.stdout
    );
    let _ = capture_json(&["start", "at-stop.pcap"], &socket);

    let ended = stop_service(&mut svc, &cfg);
    assert!(!socket.exists(), "control socket left behind");
    assert!(
        ended
            .stderr
            .iter()
            .any(|l| l.contains("event=capture_stopped") && l.contains("stopped_by=shutdown")),
        "a capture running at SIGTERM is closed: {:?}",
        ended.stderr
    );
    // Flushed and closed: it reads back (pcap_records panics otherwise).
    pcap_records(&captures.join("at-stop.pcap"));
    let got = notify.recv(&mut buf).expect("STOPPING=1 from the service");
    assert_eq!(&buf[..got], b"STOPPING=1");
    assert!(
        ended.stderr.iter().any(|l| l.contains("event=stopped")),
        "{:?}",
        ended.stderr
    );
    for l in &ended.stderr {
        assert!(
            l.starts_with("ts=") && l.contains(" level=") && l.contains(" event="),
            "structured log line: {l:?}"
        );
    }
}

// ---------------------------------------------------------------------
// With root: a perf client and an rping client over a veth pair.
// ---------------------------------------------------------------------

/// Joins the network namespace `ns` on this thread.
fn enter_netns(ns: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(format!("/run/netns/{ns}")).map_err(|e| e.to_string())?;
    // SAFETY: setns takes a namespace file descriptor we own (open for the
    // call) and changes only the calling thread's network namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(())
}

/// Scrapes `addr` from a thread inside `ns`.
fn scrape_in(ns: &str, addr: &str) -> Result<String, String> {
    let (ns, addr) = (ns.to_string(), addr.to_string());
    std::thread::spawn(move || {
        enter_netns(&ns)?;
        scrape(&addr)
    })
    .join()
    .map_err(|_| "scraper panicked".to_string())?
}

/// The NIC's own counters during a perf run, from the control socket (a
/// `stats` answer taken before the scrape) and the scraped metrics: the
/// af_packet device received at least the frames the worker did and
/// counted bytes, no frame was in error or lacked an mbuf, the metrics
/// (scraped after) are no smaller, and `iwarp stats` prints them as a
/// table too. `rx_missed` is printed, not asserted zero: frames the kernel
/// ring of af_packet had no room for, on a loaded machine, are exactly what
/// it shows where the driver reports them.
fn device_counters_while_running(stats: &Value, samples: &[Sample], socket: &Path) {
    let dev = &stats["ports"][0]["device_counters"];
    assert_eq!(dev["name"], "net_af_packet0", "{stats}");
    assert_eq!(dev["driver"], "net_af_packet", "{stats}");
    let dn = |k: &str| n(dev, &[k]);
    let worker_rx = n(stats, &["workers", "0", "rx_packets"]);
    assert!(
        dn("rx_packets") >= worker_rx && dn("rx_packets") > 0,
        "the device counts every frame a worker sees: {dev}, worker rx {worker_rx}"
    );
    assert!(
        dn("tx_packets") > 0 && dn("rx_bytes") > 0 && dn("tx_bytes") > 0,
        "{dev}"
    );
    assert!(
        dn("rx_bytes") >= 60 * dn("rx_packets"),
        "at least a minimal frame each: {dev}"
    );
    for k in ["rx_errors", "rx_nombuf"] {
        assert_eq!(dn(k), 0, "{k}: {dev}");
    }
    assert!(
        dev["tx_errors"].is_u64() && dev["rx_missed"].is_u64(),
        "{dev}"
    );
    assert!(dev["xstats"].is_object(), "{dev}");
    let labels = [("port", "0"), ("device", "net_af_packet0")];
    let m = |name: &str| {
        sample(samples, name, &labels).unwrap_or_else(|| panic!("no {name}{labels:?} scraped"))
    };
    let scraped = [
        "iwarp_port_rx_packets_total",
        "iwarp_port_tx_packets_total",
        "iwarp_port_rx_bytes_total",
        "iwarp_port_tx_bytes_total",
        "iwarp_port_rx_missed_total",
        "iwarp_port_rx_errors_total",
        "iwarp_port_tx_errors_total",
        "iwarp_port_rx_nombuf_total",
    ]
    .map(|name| (name, m(name)));
    for (name, v) in scraped {
        let key = name
            .strip_prefix("iwarp_port_")
            .and_then(|k| k.strip_suffix("_total"))
            .unwrap_or(name);
        assert!(
            v >= dn(key) as f64,
            "{name} {v} scraped after stats said {}",
            dn(key)
        );
    }
    let xstats = samples
        .iter()
        .filter(|(n, l, _)| n == "iwarp_port_xstat" && l.contains_key("stat"))
        .count();
    println!(
        "device counters during write-bw: stats {dev}; metrics {}, {xstats} iwarp_port_xstat samples",
        scraped
            .iter()
            .map(|(n, v)| format!("{n}{{port=\"0\",device=\"net_af_packet0\"}} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let out = iwarp(
        "stats-table",
        &["stats", "--socket", socket.to_str().expect("utf-8")],
        Duration::from_secs(20),
    );
    let text = &out.stdout;
    assert!(out.status.success(), "{:?}", out.stderr);
    let line = text
        .lines()
        .find(|l| l.starts_with("  device net_af_packet0 (net_af_packet, port "))
        .unwrap_or_else(|| panic!("no device line in `iwarp stats`:\n{text}"));
    assert!(line.contains(", rx errors 0, "), "{line}");
    println!("iwarp stats: {line}");
}

#[test]
fn service_serves_perf_and_rping_over_veth() {
    if !require_root() {
        return;
    }
    let net = TwoNs::create().expect("two namespaces and a veth pair");
    let ips = ["10.83.0.1", "10.83.0.2"];
    let macs = ["02:1a:fc:00:00:01", "02:1a:fc:00:00:02"];
    let prefixes = [unique_prefix("serve-s"), unique_prefix("serve-c")];
    let dirs = prefixes.clone().map(|p| RuntimeDir(runtime_dir(&p)));
    let dir = TempDir::new("serve-veth");
    let socket = dir.0.join("control.sock");
    let captures = dir.0.join("captures");
    let metrics = "127.0.0.1:9478";
    let cfg = dir.0.join("serve.toml");
    let eal: Vec<String> = eal_args(&prefixes[0])
        .split_whitespace()
        .map(String::from)
        .collect();
    std::fs::write(
        &cfg,
        format!(
            "[eal]\nargs = {eal:?}\n\
             [[ports]]\ndevice = \"net_af_packet0,iface={}\"\nip = \"{}\"\nmac = \"{}\"\n\
             [idle]\nspin = 200\nsleep_us = 20\n\
             [serve]\ncontrol_socket = {socket:?}\nshutdown_timeout_s = 4\ncapture_dir = {captures:?}\n\
             [[serve.perf]]\nport = 18515\ntest = \"write-bw\"\nsize = 65536\nduration = 4\n\
             [[serve.perf]]\nport = 18516\ntest = \"write-lat\"\nsize = 64\niters = 2000\n\
             [[serve.rping]]\nport = 7174\nsize = 64\nvalidate = true\n\
             [metrics]\nlisten = \"{metrics}\"\n",
            net.ifs[0], ips[0], macs[0]
        ),
    )
    .expect("config file");
    let deadline = Instant::now() + LIMIT;
    let mut svc = {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &net.ns[0], IWARP, "serve", "--config"])
            .arg(&cfg);
        Proc::spawn("serve", c)
    };
    for _ in 0..3 {
        svc.wait_stderr("event=listening", deadline)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let client_cmd = |what: &[&str]| {
        let device = format!("net_af_packet0,iface={}", net.ifs[1]);
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &net.ns[1], IWARP])
            .args(what)
            .args(["--device", &device, "--ip", ips[1], "--mac", macs[1]])
            .args(["--eal", &eal_args(&prefixes[1])])
            .args(["--set", "idle.spin=200", "--set", "idle.sleep_us=20"]);
        c
    };

    // A perf client; while it measures, the control socket and the
    // metrics show it.
    let mut perf = Proc::spawn(
        "perf",
        client_cmd(&[
            "perf", "write-bw", ips[0], "-s", "65536", "-D", "4", "--json",
        ]),
    );
    let accepted = svc
        .wait_stderr("event=accepted responder=perf:18515", deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(accepted.contains(&format!("peer={}", ips[1])), "{accepted}");
    std::thread::sleep(Duration::from_millis(1500));
    let stats = query(&["stats"], &socket);
    let qps = query(&["qp", "list"], &socket);
    let body = scrape_in(&net.ns[0], metrics).unwrap_or_else(|e| panic!("{e}"));
    let rx = n(&stats, &["ports", "0", "rx_packets"]);
    let rx0 = stats["workers"][0]["rx_packets"].as_u64().unwrap_or(0);
    assert!(
        rx > 0 && rx0 > 0,
        "packets counted while perf runs: {stats}"
    );
    assert_eq!(stats["responders"][0]["active"], true, "{stats}");
    let link = &stats["ports"][0]["link"];
    assert!(
        link["rx_dropped"].is_u64(),
        "the DPDK link's counters: {stats}"
    );
    let connected: Vec<&Value> = qps["qps"]
        .as_array()
        .expect("qps")
        .iter()
        .filter(|q| q["state"] == "connected")
        .collect();
    let data_qp = connected
        .iter()
        .copied()
        .max_by_key(|q| q["bytes_received"].as_u64().unwrap_or(0))
        .unwrap_or_else(|| panic!("a connected queue pair: {qps}"));
    let peer = data_qp["peer"].as_str().unwrap_or("");
    assert!(
        peer.starts_with(&format!("{}:", ips[1])),
        "peer address: {data_qp}"
    );
    assert!(
        data_qp["bytes_received"].as_u64().unwrap_or(0) > 0,
        "bytes counted on the data QP: {data_qp}"
    );
    assert!(
        data_qp["mpa"]["crc"].is_boolean(),
        "negotiated MPA options: {data_qp}"
    );
    // Both ends offer revision 2 (RFC 6581) by default.
    assert_eq!(
        data_qp["mpa"]["revision"], 2,
        "negotiated MPA revision: {data_qp}"
    );
    let samples = parse_exposition(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    let scraped_rx = sample(&samples, "iwarp_rx_packets_total", &[("worker", "0")]);
    assert!(scraped_rx.is_some_and(|v| v > 0.0), "{body}");
    device_counters_while_running(&stats, &samples, &socket);
    assert!(
        sample(&samples, "iwarp_qps", &[("state", "connected")]).is_some_and(|v| v >= 1.0),
        "{body}"
    );
    println!(
        "during write-bw: stats rx_packets {rx}, tx_packets {}, data QP {} peer {peer} received {} bytes (MPA rev {}, crc {}, ird/ord {}/{}); \
         metrics: {} samples, iwarp_rx_packets_total{{worker=\"0\"}} {}",
        n(&stats, &["ports", "0", "tx_packets"]),
        data_qp["qpn"],
        data_qp["bytes_received"],
        data_qp["mpa"]["revision"],
        data_qp["mpa"]["crc"],
        data_qp["mpa"]["ird"],
        data_qp["mpa"]["ord"],
        samples.len(),
        scraped_rx.unwrap_or(0.0)
    );
    let p = perf.wait(deadline).unwrap_or_else(|e| panic!("{e}"));
    assert!(p.status.success(), "perf client: {:?}", p.stderr);
    let finished = svc
        .wait_stderr("event=finished responder=perf:18515", deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    println!("service logged: {finished}");

    // A capture of the rping and write-lat exchanges, started through
    // the control socket before their connections.
    let started = capture_json(&["start", "exchange.pcap"], &socket);
    let file = captures.join("exchange.pcap");
    assert_eq!(started["file"], file.display().to_string(), "{started}");

    // An rping client, after the perf client (each responder takes one
    // client after another).
    let mut ping = Proc::spawn(
        "rping",
        client_cmd(&["rping", "-c", "-a", ips[0], "-C", "5", "-V"]),
    );
    let r = ping.wait(deadline).unwrap_or_else(|e| panic!("{e}"));
    assert!(r.status.success(), "rping client: {:?}", r.stderr);
    let accepted = svc
        .wait_stderr("event=accepted responder=rping:7174", deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(accepted.contains(&format!("peer={}", ips[1])), "{accepted}");
    println!("service logged: {accepted}");
    let finished = svc
        .wait_stderr("event=finished responder=rping:7174", deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(finished.contains("pings=5"), "{finished}");
    println!("service logged: {finished}");

    // A latency client on the second perf responder.
    let mut lat = Proc::spawn(
        "lat",
        client_cmd(&[
            "perf",
            "write-lat",
            ips[0],
            "-p",
            "18516",
            "-s",
            "64",
            "-n",
            "2000",
            "--json",
        ]),
    );
    let l = lat.wait(deadline).unwrap_or_else(|e| panic!("{e}"));
    assert!(l.status.success(), "write-lat client: {:?}", l.stderr);
    let finished = svc
        .wait_stderr("event=finished responder=perf:18516", deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    println!("service logged: {finished}");
    let stopped = capture_json(&["stop"], &socket);
    let captured = stopped["captured"].as_u64().unwrap_or(0);
    assert!(captured > 0, "{stopped}");
    assert_eq!(stopped["dropped"], 0, "{stopped}");
    assert_eq!(
        stopped["workers"].as_array().map(Vec::len),
        Some(1),
        "{stopped}"
    );
    let records = pcap_records(&file);
    assert_eq!(records as u64, captured, "{stopped}");
    if have_tshark() {
        let iwarp = tshark_lines(&file, &["-Y", "iwarp_ddp_rdmap"]).len();
        let bad = tshark_lines(
            &file,
            &["-Y", "_ws.malformed || _ws.expert.severity >= error"],
        );
        let verbose = tshark_lines(&file, &["-V"]);
        let bad_crc = verbose.iter().filter(|l| l.contains("Bad CRC32")).count();
        println!(
            "capture of rping and write-lat: {captured} frames ({} bytes), {} dropped, \
             {records} read back by pcap_kit; tshark: {iwarp} iWARP (DDP/RDMAP) frames, \
             {} malformed or in error, {bad_crc} bad CRC32",
            stopped["bytes"],
            stopped["dropped"],
            bad.len()
        );
        assert!(iwarp > 0, "Wireshark decoded no iWARP frame");
        assert!(bad.is_empty(), "malformed frames: {bad:?}");
        assert_eq!(bad_crc, 0, "bad MPA CRCs");
    } else {
        println!("capture: {captured} frames, {records} read back; tshark not installed");
    }

    // A second write-bw client: the responder serves one after another.
    let mut perf2 = Proc::spawn(
        "perf2",
        client_cmd(&[
            "perf", "write-bw", ips[0], "-s", "65536", "-D", "2", "--json",
        ]),
    );
    let p2 = perf2.wait(deadline).unwrap_or_else(|e| panic!("{e}"));
    assert!(p2.status.success(), "second perf client: {:?}", p2.stderr);
    svc.wait_stderr("event=finished responder=perf:18515", deadline)
        .unwrap_or_else(|e| panic!("{e}"));

    let stats = query(&["stats"], &socket);
    let sessions: Vec<(String, u64)> = stats["responders"]
        .as_array()
        .expect("responders")
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or("").to_string(),
                r["sessions"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        sessions,
        [
            ("perf:18515".to_string(), 2),
            ("perf:18516".to_string(), 1),
            ("rping:7174".to_string(), 1)
        ],
        "{stats}"
    );
    let body = scrape_in(&net.ns[0], metrics).unwrap_or_else(|e| panic!("{e}"));
    let samples = parse_exposition(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    let bw = sample(
        &samples,
        "iwarp_perf_bandwidth_bytes_per_second",
        &[("responder", "perf:18515")],
    );
    assert!(bw.is_some_and(|v| v > 0.0), "{body}");
    assert_eq!(
        sample(
            &samples,
            "iwarp_responder_sessions_total",
            &[("responder", "perf:18515")]
        ),
        Some(2.0)
    );
    let lat_labels = [("responder", "perf:18516"), ("test", "write-lat")];
    let p50 = sample(
        &samples,
        "iwarp_perf_last_latency_seconds",
        &[lat_labels[0], lat_labels[1], ("quantile", "0.5")],
    );
    let p99 = sample(
        &samples,
        "iwarp_perf_last_latency_seconds",
        &[lat_labels[0], lat_labels[1], ("quantile", "0.99")],
    );
    let count = sample(
        &samples,
        "iwarp_perf_last_latency_seconds_count",
        &lat_labels,
    );
    assert!(
        p50.is_some_and(|v| v > 0.0) && p99 >= p50 && count.is_some_and(|c| c > 0.0),
        "write-lat summary: {body}"
    );
    // The histogram of every write-lat sample: cumulative buckets in
    // increasing `le`, `+Inf` last and equal to `_count`.
    let buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|(n, l, _)| {
            n == "iwarp_perf_latency_seconds_bucket"
                && lat_labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, l, v)| {
            let le = match l.get("le").map(String::as_str) {
                Some("+Inf") => f64::INFINITY,
                Some(t) => t.parse().unwrap_or_else(|_| panic!("bad le {t:?}")),
                None => panic!("bucket without le: {l:?}"),
            };
            (le, *v)
        })
        .collect();
    assert!(buckets.len() > 1, "write-lat histogram buckets: {body}");
    assert!(
        buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
        "buckets increase in le and count: {buckets:?}"
    );
    let hist_count = sample(&samples, "iwarp_perf_latency_seconds_count", &lat_labels);
    let hist_sum = sample(&samples, "iwarp_perf_latency_seconds_sum", &lat_labels);
    let inf = buckets.last().copied().unwrap_or_default();
    assert!(inf.0.is_infinite(), "+Inf bucket last: {buckets:?}");
    assert_eq!(hist_count, Some(inf.1), "_count equals the +Inf bucket");
    assert!(
        inf.1 > 0.0 && hist_sum.is_some_and(|s| s > 0.0),
        "write-lat histogram: {body}"
    );
    // No sample of the bandwidth responder's.
    assert_eq!(
        sample(
            &samples,
            "iwarp_perf_latency_seconds_count",
            &[("responder", "perf:18515")]
        ),
        None
    );
    let median_bucket = buckets
        .iter()
        .find(|b| b.1 >= inf.1 / 2.0)
        .map_or(f64::NAN, |b| b.0);
    println!(
        "write-lat histogram: {} samples, sum {:.6} s, {} buckets, median at most {} s",
        inf.1,
        hist_sum.unwrap_or(0.0),
        buckets.len(),
        median_bucket
    );
    println!(
        "after: sessions perf:18515 2, perf:18516 1, rping:7174 1; last write-bw {:.1} MB/s; \
         write-lat p50 {:.1} us p99 {:.1} us over {} samples; rx {} tx {} packets, {} retransmits, {} drops",
        bw.unwrap_or(0.0) / 1e6,
        p50.unwrap_or(0.0) * 1e6,
        p99.unwrap_or(0.0) * 1e6,
        count.unwrap_or(0.0),
        sample(&samples, "iwarp_rx_packets_total", &[("worker", "0")]).unwrap_or(0.0),
        sample(&samples, "iwarp_tx_packets_total", &[("worker", "0")]).unwrap_or(0.0),
        sample(&samples, "iwarp_retransmits_total", &[("worker", "0")]).unwrap_or(0.0),
        sample(&samples, "iwarp_drops_total", &[("worker", "0")]).unwrap_or(0.0),
    );

    // SIGTERM in the middle of a run: the connections are closed, exit 0
    // within seconds, nothing left behind.
    let mut busy = Proc::spawn(
        "busy",
        client_cmd(&[
            "perf", "write-bw", ips[0], "-s", "65536", "-D", "30", "--json",
        ]),
    );
    svc.wait_stderr("event=accepted responder=perf:18515", deadline)
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(1000));
    let ended = stop_service(&mut svc, &cfg);
    assert!(
        ended
            .stderr
            .iter()
            .any(|l| l.contains("event=disconnecting") && l.contains("qps=")),
        "the running session's connections closed: {:?}",
        ended.stderr
    );
    assert!(!socket.exists(), "control socket left behind");
    let b = busy
        .wait(Instant::now() + LIMIT)
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "the client of the interrupted run ended with {} ({:?})",
        b.status,
        b.stderr.last()
    );
    drop((perf, perf2, lat, ping, busy, svc));
    for d in &dirs {
        assert!(!d.0.exists(), "{} left behind", d.0.display());
    }
    net.remove_and_check();
}

// ---------------------------------------------------------------------
// In one process: responders sharing a dataplane each see their events.
// ---------------------------------------------------------------------

/// A server and a client dataplane on one in-memory link: addresses
/// 10.66.`net`.1 and .2, MACs ending in `mac` and `mac + 1`.
fn mem_pair(
    tag: &str,
    net: u8,
    mac: u8,
) -> (
    dataplane::api::Dataplane,
    dataplane::api::Dataplane,
    std::net::Ipv4Addr,
    std::net::Ipv4Addr,
) {
    use dataplane::api::Dataplane;
    use dataplane::config::Config;
    use std::net::Ipv4Addr;
    use tcp_offload::wire::EthernetAddress;

    let link = format!("mem:{}", unique_prefix(tag));
    let (ip_s, ip_c) = (Ipv4Addr::new(10, 66, net, 1), Ipv4Addr::new(10, 66, net, 2));
    let server = Dataplane::open(&Config::single(
        &link,
        ip_s,
        EthernetAddress([2, 0, 0, 0, 0x66, mac]),
    ))
    .expect("server dataplane");
    let client = Dataplane::open(&Config::single(
        &link,
        ip_c,
        EthernetAddress([2, 0, 0, 0, 0x66, mac + 1]),
    ))
    .expect("client dataplane");
    (server, client, ip_s, ip_c)
}

/// Two threads share one dataplane, each in an event scope of its own
/// port, as the service's responders do; a client connects to both ports.
/// Each thread receives exactly its own connection request and its own
/// queue pair's events, never the other's; a second `listen` on a port
/// is not an error; the queue pairs' snapshots show the peer and the
/// negotiated options.
#[test]
fn event_scopes_route_events_to_their_threads() {
    use dataplane::api::{CmEvent, ConnectParams, EventScope, QpOptions, QpStatus};
    use std::net::SocketAddrV4;

    let (server, client, ip_s, ip_c) = mem_pair("scopes", 0, 1);
    let ports = [18700u16, 18701];
    let limit = Duration::from_secs(20);
    let ready = std::sync::Barrier::new(3);
    std::thread::scope(|scope| {
        let server = &server;
        let ready = &ready;
        let handles: Vec<_> = ports
            .iter()
            .map(|&port| {
                scope.spawn(move || {
                    let _scope = EventScope::enter(&[port]);
                    let pd = server.alloc_pd().expect("pd");
                    let cq = server.create_cq(64).expect("cq");
                    let qp = server
                        .create_qp(pd, &cq, &cq, QpOptions::default())
                        .expect("qp");
                    server.listen(port, 4).expect("listen");
                    server.listen(port, 4).expect("listening again is no error");
                    ready.wait();
                    let mut seen = Vec::new();
                    let deadline = Instant::now() + limit;
                    while Instant::now() < deadline {
                        let Some(e) = server.wait_event(Duration::from_millis(50)) else {
                            continue;
                        };
                        match &e {
                            CmEvent::ConnectRequest(r) => {
                                assert_eq!(r.local_port, port, "another port's request");
                                server
                                    .accept(r, &qp, &ConnectParams::default())
                                    .expect("accept");
                            }
                            CmEvent::Established { qp: n, .. } => {
                                assert_eq!(*n, qp.num(), "another queue pair's event");
                                seen.push(e);
                                break;
                            }
                            other => panic!("port {port}: unexpected {other:?}"),
                        }
                        seen.push(e);
                    }
                    assert_eq!(qp.status(), QpStatus::Connected, "port {port}");
                    // The first thread resets what it made, and only that.
                    let reset = if port == ports[0] {
                        server.abort_scope_connections()
                    } else {
                        0
                    };
                    (port, qp, seen.len(), reset)
                })
            })
            .collect();
        ready.wait();
        let pd = client.alloc_pd().expect("pd");
        let cq = client.create_cq(64).expect("cq");
        let mut qps = Vec::new();
        for &port in &ports {
            let qp = client
                .create_qp(pd, &cq, &cq, QpOptions::default())
                .expect("qp");
            client
                .connect(
                    &qp,
                    SocketAddrV4::new(ip_s, port),
                    &ConnectParams::default(),
                )
                .expect("connect");
            qps.push(qp);
        }
        let served: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("responder thread"))
            .collect();
        for (port, qp, events, reset) in &served {
            assert_eq!(
                *reset,
                usize::from(*port == ports[0]),
                "port {port}: its own reset"
            );
            assert_eq!(*events, 2, "port {port}: its request and its establishment");
            let snap = server
                .qp_snapshots()
                .into_iter()
                .find(|s| s.qpn == qp.num())
                .expect("a snapshot of the queue pair");
            let c = snap.connection.expect("what the connection negotiated");
            assert_eq!(*c.remote.ip(), ip_c);
            assert_eq!(c.revision, 2, "MPA revision both ends offer");
            println!(
                "port {port}: QP {} from {} (MPA rev {}, crc {}, ird/ord {}/{}), {} events",
                snap.qpn.0, c.remote, c.revision, c.crc, c.ird, c.ord, events
            );
        }
        // The reset one goes down; the other stays up until closed here.
        let gone = Instant::now() + limit;
        while served[0].1.status() != QpStatus::Disconnected && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            served[0].1.status(),
            QpStatus::Disconnected,
            "the reset connection"
        );
        assert_eq!(
            served[1].1.status(),
            QpStatus::Connected,
            "the other thread's"
        );
        assert_eq!(
            server.disconnect_all(false),
            1,
            "the remaining connection closed"
        );
        drop(qps);
    });
}

/// A service makes queue pairs for every client: the table limit counts
/// those alive at once, not those ever made, and numbers stay unique.
#[test]
fn queue_pair_limit_counts_live_ones() {
    use dataplane::api::{Dataplane, QpOptions};
    use dataplane::config::Config;
    use std::net::Ipv4Addr;
    use tcp_offload::wire::EthernetAddress;

    let link = format!("mem:{}", unique_prefix("qp-limit"));
    let mut config = Config::single(
        &link,
        Ipv4Addr::new(10, 66, 1, 1),
        EthernetAddress([2, 0, 0, 0, 0x66, 3]),
    );
    config.limits.max_qp = 4;
    let dp = Dataplane::open(&config).expect("dataplane");
    let pd = dp.alloc_pd().expect("pd");
    let cq = dp.create_cq(16).expect("cq");
    let make = || dp.create_qp(pd, &cq, &cq, QpOptions::default());
    let mut numbers = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let qp = make().expect("a queue pair made and dropped, many times over the limit");
        assert!(numbers.insert(qp.num().0), "numbers are not reused");
    }
    let held: Vec<_> = (0..4).map(|_| make().expect("up to the limit")).collect();
    assert!(make().is_err(), "a fifth live queue pair is refused");
    drop(held);
    assert!(make().is_ok(), "room again once they are gone");
    assert_eq!(
        dp.qp_snapshots().len(),
        0,
        "the dropped ones are not listed"
    );
    println!(
        "44 queue pairs made with max_qp 4, numbers {}..={}",
        numbers.first().copied().unwrap_or(0),
        numbers.last().copied().unwrap_or(0)
    );
}

// ---------------------------------------------------------------------
// In one process: failed perftest sessions give their registrations back.
// ---------------------------------------------------------------------

/// A responder's failed sessions, over and over (no client within the
/// timeout; a client whose control connection comes up and goes away
/// before the exchange), leave the dataplane's memory registrations as
/// they were: a long-running service does not leak one per failure.
#[test]
fn failed_perftest_sessions_give_their_registrations_back() {
    use dataplane::api::{Access, ConnectParams, QpOptions, QpStatus, Region};
    use iwarp::perftest::{Session, SessionParams};
    use iwarp::runner::{RemoteBuf, TestKind};
    use std::net::SocketAddrV4;

    let (server, client, ip_s, _) = mem_pair("perf-leak", 2, 5);
    let pd = server.alloc_pd().expect("pd");
    let cq = server.create_cq(64).expect("cq");
    let region = Region::new(4096).expect("region");
    let mr = server
        .reg_mr(
            pd,
            &region,
            0,
            4096,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .expect("the data buffer's registration");
    let local = [RemoteBuf {
        addr: mr.sge(0, 1).addr,
        rkey: mr.sge(0, 1).lkey.0,
    }];
    let params = SessionParams::new(TestKind::WriteBw, 4096, 10);
    let port = 18790;
    let before = server.mr_count();
    const ROUNDS: usize = 4;
    for round in 0..ROUNDS {
        // Nobody comes.
        let qp = server
            .create_qp(pd, &cq, &cq, QpOptions::default())
            .expect("data qp");
        let e = Session::server(
            &server,
            port,
            &params,
            &[qp],
            &local,
            Duration::from_millis(100),
        )
        .expect_err("no client");
        assert!(e.to_string().contains("nothing within"), "{e}");
        assert_eq!(server.mr_count(), before, "round {round}: after a timeout");
    }
    for round in 0..ROUNDS {
        // A client whose control connection is up, then gone.
        let qp = server
            .create_qp(pd, &cq, &cq, QpOptions::default())
            .expect("data qp");
        let rogue = std::thread::scope(|scope| {
            let t = scope.spawn(|| {
                let cpd = client.alloc_pd().expect("pd");
                let ccq = client.create_cq(16).expect("cq");
                let cqp = client
                    .create_qp(cpd, &ccq, &ccq, QpOptions::default())
                    .expect("qp");
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    if client
                        .connect(
                            &cqp,
                            SocketAddrV4::new(ip_s, port),
                            &ConnectParams::default(),
                        )
                        .is_ok()
                    {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                while cqp.status() != QpStatus::Connected && Instant::now() < deadline {
                    let _ = client.wait_event(Duration::from_millis(20));
                }
                let up = cqp.status() == QpStatus::Connected;
                let _ = client.disconnect(&cqp, true);
                up
            });
            let e = Session::server(
                &server,
                port,
                &params,
                &[qp],
                &local,
                Duration::from_secs(5),
            )
            .expect_err("the client went away");
            (t.join().expect("client thread"), e)
        });
        assert!(rogue.0, "round {round}: the control connection came up");
        let _ = server.disconnect_all(true);
        assert_eq!(
            server.mr_count(),
            before,
            "round {round}: after a client left ({})",
            rogue.1
        );
        if round == 0 {
            println!("a failed session with a client: {}", rogue.1);
        }
    }
    println!(
        "{} failed perftest sessions ({ROUNDS} without a client, {ROUNDS} with one that left): \
         {} memory registrations before, {} after",
        2 * ROUNDS,
        before,
        server.mr_count()
    );
}
