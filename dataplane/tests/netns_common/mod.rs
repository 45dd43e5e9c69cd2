//! The root-only plumbing every namespace test shares: whether the test
//! may run at all, helper commands with errors that say what failed,
//! network namespaces joined by veth pairs, processes started inside them,
//! and checks that nothing is left afterwards.
//!
//! - [`require_root`]: root goes on; otherwise a skip notice, or a failure
//!   when `IWARP_REQUIRE_ROOT_TESTS=1` forbids skipping.
//! - [`Netns`]: one namespace holding the kernel's end of a veth pair with
//!   an address; our end stays in the root namespace without one (for an
//!   engine that talks to the kernel's TCP).
//! - [`TwoNs`]: two namespaces, one veth end in each, no addresses (for
//!   two dataplanes that own theirs).
//! - [`NsChild`]: a process started in a namespace, its output lines sent
//!   to a channel shared with its peer, stopped by PID and its EAL runtime
//!   directory removed on drop.
//!
//! Names are `iwt<pid in hex>-<counter>` plus a suffix per end: unique
//! per test process (nextest runs each test in a process of its own) and
//! per call (`cargo test` runs tests as threads of one process), and at
//! most 15 bytes as interface names must be. Everything is removed on drop,
//! panics included; what a killed process left (a SIGKILL at a timeout
//! runs no destructor) is swept before the next fixture is made. The
//! kernel side's offloads are off: real, fully checksummed frames of at
//! most the MTU.
#![allow(dead_code, reason = "each test file uses part of the harness")]

use std::io::{BufRead, BufReader, Read};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Prefix of every namespace and interface made here; the stale sweep
/// removes only such names whose process is gone.
const PREFIX: &str = "iwt";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Whether the test process may create namespaces and open AF_PACKET or
/// AF_XDP sockets.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Returns `true` when the caller should go on; prints a skip notice and
/// returns `false` without root, or fails when root tests are required.
pub fn require_root() -> bool {
    if is_root() {
        return true;
    }
    assert!(
        std::env::var("IWARP_REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
        "this test needs root (network namespaces, veth, AF_PACKET) and \
         IWARP_REQUIRE_ROOT_TESTS=1 forbids skipping it"
    );
    println!("skipped: needs root");
    false
}

/// Runs a helper command to completion; its stdout, or the command line,
/// its status and its stderr.
pub fn sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`sh`] inside the namespace `ns`.
pub fn sh_in(ns: &str, args: &[&str]) -> Result<String, String> {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(args);
    sh(&full)
}

/// A fresh base name (see the module documentation), after sweeping what
/// dead test processes left.
fn fresh_base() -> String {
    sweep_stale();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let base = format!("{PREFIX}{:x}-{n}", std::process::id());
    // pid_max is at most 2^22 (6 hex digits): 3 + 6 + 1 + 2 + the
    // one-byte suffix stays within 15 while a process makes under 100.
    assert!(base.len() < 15, "interface name {base}a too long");
    base
}

/// Removes namespaces (and their veth pairs) left by test processes that
/// died without running their destructors.
fn sweep_stale() {
    let Ok(list) = sh(&["ip", "netns", "list"]) else {
        return;
    };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| u32::from_str_radix(pid, 16).ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // A root-side end whose peer never made it into the namespace.
        if let Some(base) = name.strip_suffix(['s', 'c']) {
            let _ = sh(&["ip", "link", "del", &format!("{base}a")]);
        } else {
            let _ = sh(&["ip", "link", "del", &format!("{name}a")]);
        }
        let _ = sh(&["ip", "netns", "del", name]);
    }
}

/// Offloads off on `ifname` (in `ns`, or the root namespace): no GSO
/// super-frames, no partial checksums, no GRO merging on receive.
pub fn offloads_off(ns: Option<&str>, ifname: &str) -> Result<(), String> {
    let args = [
        "ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off", "sg", "off", "rx", "off",
        "gro", "off",
    ];
    match ns {
        Some(ns) => sh_in(ns, &args),
        None => sh(&args),
    }
    .map(drop)
}

/// IPv6 off on `ifname` (no router solicitations or DAD frames); best
/// effort, a kernel without IPv6 has no such key.
fn ipv6_off(ns: Option<&str>, ifname: &str) {
    let key = format!("net.ipv6.conf.{ifname}.disable_ipv6=1");
    let args = ["sysctl", "-qw", key.as_str()];
    let _ = match ns {
        Some(ns) => sh_in(ns, &args),
        None => sh(&args),
    };
}

/// Which of `names` still exist as namespaces.
pub fn namespaces_left(names: &[String]) -> Vec<String> {
    let list = sh(&["ip", "netns", "list"]).unwrap_or_default();
    names
        .iter()
        .filter(|n| {
            list.lines()
                .any(|l| l.split_whitespace().next() == Some(n.as_str()))
        })
        .cloned()
        .collect()
}

/// Which of `ifs` still exist in the root namespace.
pub fn interfaces_left(ifs: &[String]) -> Vec<String> {
    ifs.iter()
        .filter(|i| Path::new(&format!("/sys/class/net/{i}")).exists())
        .cloned()
        .collect()
}

/// Fails the test if any of the namespaces or root-side interfaces
/// is still there.
pub fn assert_nothing_left(namespaces: &[String], ifs: &[String]) {
    let ns = namespaces_left(namespaces);
    assert!(ns.is_empty(), "namespaces still there: {ns:?}");
    let i = interfaces_left(ifs);
    assert!(i.is_empty(), "interfaces still there: {i:?}");
}

fn read_mac(ns: Option<&str>, ifname: &str) -> Result<[u8; 6], String> {
    let path = format!("/sys/class/net/{ifname}/address");
    let text = match ns {
        Some(ns) => sh_in(ns, &["cat", &path])?,
        None => std::fs::read_to_string(&path)
            .map_err(|e| format!("reading the MAC of {ifname}: {e}"))?,
    };
    parse_mac(text.trim()).ok_or_else(|| format!("unparsable MAC {text:?} on {ifname}"))
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Creates the veth pair `host_if`/`peer_if` with `host_if`'s interface
/// index a multiple of 2^16 (the first one free of a run that starts at
/// a place of `pid`'s).
///
/// DPDK's `net_af_packet` joins each socket to a `PACKET_FANOUT` group
/// numbered `(pid ^ ifindex) & 0xffff`, and a socket on another
/// interface that asks for a group of that number already held in the
/// same network namespace is refused (`EINVAL`, and the port does not
/// come up). Test processes that open the port in the root namespace run
/// side by side with close pids and close interface indices, whose XORs
/// meet far more often than one in 65,536: a `dpdk_kernel` test failed
/// that way. With the index's low 16 bits zero the group number is the
/// pid's low 16 bits, which processes running together do not share.
fn add_veth_with_index(host_if: &str, peer_if: &str, pid: u32) -> Result<(), String> {
    const TRIES: u32 = 64;
    // Indices are positive 32-bit numbers: 1 to 32,767 times 2^16.
    let start = pid.wrapping_mul(37);
    let mut last = String::new();
    for k in 0..TRIES {
        let index = (start.wrapping_add(k) % 32_767 + 1) << 16;
        let index = index.to_string();
        match sh(&[
            "ip", "link", "add", host_if, "index", &index, "type", "veth", "peer", "name", peer_if,
        ]) {
            Ok(_) => return Ok(()),
            // Another process holds that index: the next one.
            Err(e) if e.contains("exists") => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(format!(
        "no free interface index after {TRIES} tries: {last}"
    ))
}

/// One namespace joined to the root namespace by a veth pair: the
/// kernel's end (`peer_if`) lives in the namespace with an address; our
/// end (`host_if`) stays in the root namespace with no address, so the
/// root kernel ignores what arrives on it and a raw socket or DPDK port
/// there sees every frame.
#[derive(Debug)]
pub struct Netns {
    /// Name of the network namespace (also under `/run/netns/`).
    pub ns: String,
    /// Our end, in the root namespace, without an address.
    pub host_if: String,
    /// The kernel's end, inside the namespace.
    pub peer_if: String,
    /// The kernel's address (on `peer_if`).
    pub kernel_ip: Ipv4Addr,
    /// The address our engine owns; nothing in any kernel has it.
    pub our_ip: Ipv4Addr,
    /// The kernel's MAC on `peer_if`.
    pub kernel_mac: [u8; 6],
    /// The MAC of `host_if` itself. Our engine uses another one, so that
    /// the root kernel sees our traffic as addressed elsewhere.
    pub host_if_mac: [u8; 6],
}

impl Netns {
    /// Creates the namespace and the veth pair, offloads off on both ends,
    /// IPv6 off, both ends up (ours promiscuous).
    pub fn create() -> Result<Netns, String> {
        let ns = fresh_base();
        let pid = std::process::id();
        let n = COUNTER.load(Ordering::Relaxed);
        let subnet = u8::try_from(1 + (pid + n) % 250).unwrap_or(1);
        let mut me = Netns {
            host_if: format!("{ns}a"),
            peer_if: format!("{ns}b"),
            ns,
            kernel_ip: Ipv4Addr::new(10, 99, subnet, 1),
            our_ip: Ipv4Addr::new(10, 99, subnet, 2),
            kernel_mac: [0; 6],
            host_if_mac: [0; 6],
        };
        // From here on, `me` is dropped (and everything removed) on error.
        sh(&["ip", "netns", "add", &me.ns])?;
        add_veth_with_index(&me.host_if, &me.peer_if, pid)?;
        sh(&["ip", "link", "set", &me.peer_if, "netns", &me.ns])?;
        ipv6_off(Some(&me.ns), &me.peer_if);
        ipv6_off(None, &me.host_if);
        offloads_off(Some(&me.ns), &me.peer_if)?;
        offloads_off(None, &me.host_if)?;
        let cidr = format!("{}/24", me.kernel_ip);
        sh_in(&me.ns, &["ip", "addr", "add", &cidr, "dev", &me.peer_if])?;
        sh_in(&me.ns, &["ip", "link", "set", "lo", "up"])?;
        sh_in(&me.ns, &["ip", "link", "set", &me.peer_if, "up"])?;
        sh(&["ip", "link", "set", &me.host_if, "promisc", "on"])?;
        sh(&["ip", "link", "set", &me.host_if, "up"])?;
        me.kernel_mac = read_mac(Some(&me.ns), &me.peer_if)?;
        me.host_if_mac = read_mac(None, &me.host_if)?;
        Ok(me)
    }

    /// A locally administered unicast MAC for our engine, distinct from
    /// both veth ends.
    pub fn our_mac(&self) -> [u8; 6] {
        let mut mac = [0x02, 0x1a, 0x0b, 0x00, 0x00, 0x02];
        mac[3] = self.our_ip.octets()[2];
        if mac == self.host_if_mac || mac == self.kernel_mac {
            mac[5] ^= 0x80;
        }
        mac
    }

    /// Path of the namespace's handle, for `setns(2)`.
    pub fn ns_path(&self) -> String {
        format!("/run/netns/{}", self.ns)
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, program]);
        cmd
    }

    /// Removes everything now and fails the test if anything is left.
    pub fn remove_and_check(self) {
        let (ns, ifs) = (vec![self.ns.clone()], vec![self.host_if.clone()]);
        drop(self);
        assert_nothing_left(&ns, &ifs);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end of a veth deletes both; deleting the namespace
        // would too, but the explicit delete covers a pair whose peer never
        // made it into the namespace.
        let _ = sh(&["ip", "link", "del", &self.host_if]);
        let _ = sh(&["ip", "netns", "del", &self.ns]);
    }
}

/// Two namespaces joined by a veth pair, one end in each (index 0: the
/// server's, 1: the client's), with no kernel address (the dataplanes own
/// theirs); removed on drop.
#[derive(Debug)]
pub struct TwoNs {
    /// Server's and client's namespace.
    pub ns: [String; 2],
    /// The veth end in each.
    pub ifs: [String; 2],
}

impl TwoNs {
    /// Creates them: offloads and IPv6 off, loopback and both ends up
    /// (promiscuous).
    pub fn create() -> Result<TwoNs, String> {
        let base = fresh_base();
        let me = TwoNs {
            ns: [format!("{base}s"), format!("{base}c")],
            ifs: [format!("{base}a"), format!("{base}b")],
        };
        for ns in &me.ns {
            sh(&["ip", "netns", "add", ns])?;
        }
        sh(&[
            "ip", "link", "add", &me.ifs[0], "type", "veth", "peer", "name", &me.ifs[1],
        ])?;
        for (ns, ifname) in me.ns.iter().zip(&me.ifs) {
            sh(&["ip", "link", "set", ifname, "netns", ns])?;
            ipv6_off(Some(ns), ifname);
            offloads_off(Some(ns), ifname)?;
            sh_in(ns, &["ip", "link", "set", "lo", "up"])?;
            sh_in(ns, &["ip", "link", "set", ifname, "promisc", "on"])?;
            sh_in(ns, &["ip", "link", "set", ifname, "up"])?;
        }
        Ok(me)
    }

    /// Which of the namespaces `names` still exist.
    pub fn names_left(names: &[String]) -> Vec<String> {
        namespaces_left(names)
    }

    /// Removes everything now and fails the test if anything is left.
    pub fn remove_and_check(self) {
        let ns = self.ns.to_vec();
        let ifs = self.ifs.to_vec();
        drop(self);
        assert_nothing_left(&ns, &ifs);
    }
}

impl Drop for TwoNs {
    fn drop(&mut self) {
        // A pair still in the root namespace (creation failed half-way).
        let _ = sh(&["ip", "link", "del", &self.ifs[0]]);
        for ns in &self.ns {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
    }
}

/// A process started in a namespace with `ip netns exec` (which execs it:
/// the PID is the program's own), its stdout and stderr lines sent to a
/// channel tagged with its name; on drop it is stopped by PID (SIGINT,
/// SIGKILL two seconds later) and its EAL runtime directory
/// (`/var/run/dpdk/iwarp-<pid>`, the dataplane's default prefix) removed.
#[derive(Debug)]
pub struct NsChild {
    /// For messages and the channel's tag.
    pub name: &'static str,
    /// The process.
    pub child: Child,
    /// Its EAL runtime directory.
    pub runtime: PathBuf,
}

impl NsChild {
    /// Starts `program args…` in `ns` with `envs` set.
    pub fn spawn(
        name: &'static str,
        ns: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
        lines: mpsc::Sender<(&'static str, String)>,
    ) -> NsChild {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting the {name} under ip netns exec: {e}"));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if lines.send((name, line)).is_err() {
                        break;
                    }
                }
            });
        }
        let runtime = PathBuf::from(format!("/var/run/dpdk/iwarp-{}", child.id()));
        NsChild {
            name,
            child,
            runtime,
        }
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails the test if its EAL runtime directory is still there.
    pub fn assert_runtime_gone(&self) {
        assert!(
            !self.runtime.exists(),
            "the {} (pid {}) left {} behind",
            self.name,
            self.pid(),
            self.runtime.display()
        );
    }
}

impl Drop for NsChild {
    fn drop(&mut self) {
        if stop_child(&mut self.child) {
            eprintln!("{} (pid {}) stopped", self.name, self.child.id());
        }
        // A safety net for a failed run: a clean exit leaves nothing here
        // (the tests assert that first), so say when there was something.
        if self.runtime.exists() {
            eprintln!(
                "{} (pid {}) left {} behind; removed",
                self.name,
                self.child.id(),
                self.runtime.display()
            );
            let _ = std::fs::remove_dir_all(&self.runtime);
        }
    }
}

/// Stops `child` if it still runs: SIGINT (a dataplane then cleans up),
/// SIGKILL two seconds later; whether it was running.
pub fn stop_child(child: &mut Child) -> bool {
    if !matches!(child.try_wait(), Ok(None)) {
        return false;
    }
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill has no memory effects; `pid` is our own child, not
        // yet reaped (waited for just below).
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    true
}
