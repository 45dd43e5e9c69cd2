//! A throwaway network namespace joined to the root namespace by a veth
//! pair: the kernel's end (`b`) lives in the namespace with an address; our
//! end (`a`) stays in the root namespace with no address, so the root
//! kernel ignores what arrives on it and the raw socket sees every frame.
//!
//! Everything is created by name with `ip`, `ethtool` and `sysctl`, and
//! [`Netns`]'s `Drop` removes it again, panics included. Names carry the
//! process id and a counter: nextest runs each test in a process of its
//! own, `cargo test` runs them as threads of one.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Prefix of every namespace and interface these tests create; the stale
/// sweep removes only names that start with it.
const PREFIX: &str = "iwk";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Whether the test process may create namespaces and raw sockets.
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
    if std::env::var("IWARP_REQUIRE_ROOT_TESTS").as_deref() == Ok("1") {
        panic!(
            "this test needs root (network namespaces, veth, AF_PACKET) and \
             IWARP_REQUIRE_ROOT_TESTS=1 forbids skipping it"
        );
    }
    println!("skipped: needs root");
    false
}

/// The namespace, the veth pair and the addresses on either side.
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

fn run(args: &[&str]) -> Result<String, String> {
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

fn read_mac(ns: Option<&str>, ifname: &str) -> Result<[u8; 6], String> {
    let text = match ns {
        Some(ns) => run(&[
            "ip",
            "netns",
            "exec",
            ns,
            "cat",
            &format!("/sys/class/net/{ifname}/address"),
        ])?,
        None => std::fs::read_to_string(format!("/sys/class/net/{ifname}/address"))
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

/// Removes namespaces (and their veth pairs) left by test processes that
/// died without running their destructors (a SIGKILL at a timeout).
fn sweep_stale() {
    let Ok(list) = run(&["ip", "netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = run(&["ip", "link", "del", &format!("{name}a")]);
        let _ = run(&["ip", "netns", "del", name]);
    }
}

impl Netns {
    /// Creates the namespace and the veth pair, offloads off on both ends
    /// (real, fully checksummed, MTU-sized frames), IPv6 off (no router
    /// solicitations or DAD in the capture), both ends up.
    pub fn create() -> Result<Netns, String> {
        sweep_stale();
        let pid = std::process::id();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let ns = format!("{PREFIX}{pid}-{n}");
        // Interface names are at most 15 bytes: "iwk" + 7-digit pid + "-"
        // + counter + "a" fits while the counter stays under 100.
        assert!(ns.len() < 15, "interface name {ns}a too long");
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
        run(&["ip", "netns", "add", &me.ns])?;
        run(&[
            "ip",
            "link",
            "add",
            &me.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &me.peer_if,
        ])?;
        run(&["ip", "link", "set", &me.peer_if, "netns", &me.ns])?;
        let ns = me.ns.clone();
        let in_ns = |args: &[&str]| {
            let mut full = vec!["ip", "netns", "exec", ns.as_str()];
            full.extend_from_slice(args);
            run(&full)
        };
        let v6_peer = format!("net.ipv6.conf.{}.disable_ipv6=1", me.peer_if);
        let v6_host = format!("net.ipv6.conf.{}.disable_ipv6=1", me.host_if);
        // Best effort: a kernel without IPv6 has no such key.
        let _ = in_ns(&["sysctl", "-qw", &v6_peer]);
        let _ = run(&["sysctl", "-qw", &v6_host]);
        in_ns(&[
            "ethtool",
            "-K",
            &me.peer_if,
            "tx",
            "off",
            "tso",
            "off",
            "gso",
            "off",
            "sg",
            "off",
        ])?;
        run(&[
            "ethtool",
            "-K",
            &me.host_if,
            "tx",
            "off",
            "tso",
            "off",
            "gso",
            "off",
            "sg",
            "off",
            "rx",
            "off",
            "gro",
            "off",
        ])?;
        let cidr = format!("{}/24", me.kernel_ip);
        in_ns(&["ip", "addr", "add", &cidr, "dev", &me.peer_if])?;
        in_ns(&["ip", "link", "set", "lo", "up"])?;
        in_ns(&["ip", "link", "set", &me.peer_if, "up"])?;
        run(&["ip", "link", "set", &me.host_if, "promisc", "on"])?;
        run(&["ip", "link", "set", &me.host_if, "up"])?;
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
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end of a veth deletes both; deleting the namespace
        // would too, but the explicit delete covers a pair whose peer never
        // made it into the namespace.
        let _ = run(&["ip", "link", "del", &self.host_if]);
        let _ = run(&["ip", "netns", "del", &self.ns]);
    }
}
