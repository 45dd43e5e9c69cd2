//! The dataplane's configuration: a TOML file, command-line overrides of
//! any key (`--set workers.count=2`), validation with errors that name the
//! offending key. Nothing here panics on bad input.
//!
//! It is read once, before the EAL starts and the workers run; the
//! runtime takes the validated [`Config`] (ports, workers and their cores,
//! EAL arguments passed through, idle back-off, MPA and TCP options,
//! object limits).
//!
//! ```toml
//! [eal]
//! args = ["--no-huge", "-m", "512"]
//!
//! [[ports]]
//! device = "net_ring0"          # any DPDK device string, or mem:NAME
//! ip = "10.0.0.1"
//! mac = "02:00:00:00:00:01"
//! mtu = 1500
//! neighbors = [{ ip = "10.0.0.2", mac = "02:00:00:00:00:02" }]
//!
//! [workers]
//! count = 2
//! cores = [2, 3]                # pin worker i to cores[i]; omit to not pin
//!
//! [idle]
//! spin = 1000                   # empty iterations before sleeping
//! sleep_us = 50                 # 0: busy poll
//! yield_cpu = true              # yield the core on empty iterations
//!
//! [mpa]
//! crc = "requested"            # required | requested | off (true, false)
//! rtr = "write"                 # none | send | write | read
//! ```

use core::net::Ipv4Addr;
use std::path::Path;

pub use rdmap::mpa::CrcPolicy;
use serde::Deserialize;
use tcp_offload::wire::EthernetAddress;

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The file could not be read.
    Io {
        /// The path.
        path: String,
        /// The system's message.
        message: String,
    },
    /// Not valid TOML, or a key of the wrong type or unknown.
    Syntax(String),
    /// An override is not `key=value` or its value is not a TOML value.
    Override {
        /// The override as given.
        given: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A value out of range or inconsistent with another.
    Invalid {
        /// The key, as `ports[0].mtu`.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ConfigError::Io { path, message } => write!(f, "cannot read {path}: {message}"),
            ConfigError::Syntax(m) => write!(f, "configuration: {m}"),
            ConfigError::Override { given, reason } => {
                write!(f, "override `{given}`: {reason}")
            }
            ConfigError::Invalid { key, reason } => write!(f, "configuration key {key}: {reason}"),
        }
    }
}

impl std::error::Error for ConfigError {}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// A MAC address written `02:00:00:00:00:01`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacAddr(pub EthernetAddress);

impl core::str::FromStr for MacAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<MacAddr, String> {
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in &mut out {
            let p = parts.next().ok_or("expected six bytes")?;
            if p.len() != 2 {
                return Err(format!("`{p}` is not two hex digits"));
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| format!("`{p}` is not hex"))?;
        }
        if parts.next().is_some() {
            return Err("more than six bytes".into());
        }
        Ok(MacAddr(EthernetAddress(out)))
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e| serde::de::Error::custom(format!("MAC address `{s}`: {e}")))
    }
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// DPDK's EAL.
    #[serde(default)]
    pub eal: EalConfig,
    /// The ports (one today).
    pub ports: Vec<PortConfig>,
    /// Worker threads.
    #[serde(default)]
    pub workers: WorkersConfig,
    /// Idle back-off of the poll loop.
    #[serde(default)]
    pub idle: IdleConfig,
    /// MPA connection setup.
    #[serde(default)]
    pub mpa: MpaConfig,
    /// TCP.
    #[serde(default)]
    pub tcp: TcpConfig,
    /// Sizes of the verbs object tables.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// `iwarp serve`: control socket and always-on responders (read by the
    /// service only; the runtime ignores it).
    #[serde(default)]
    pub serve: ServeConfig,
    /// `iwarp serve`: the Prometheus endpoint.
    #[serde(default)]
    pub metrics: MetricsConfig,
}

/// `[serve]`: the service's control socket, logs and responders (see
/// `deploy/iwarp.toml` for each key).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    /// Path of the control socket.
    pub control_socket: String,
    /// Its permissions, octal digits.
    pub socket_mode: String,
    /// Group to give the socket (empty: the service's).
    pub socket_group: String,
    /// Where captures with a relative file name go.
    pub capture_dir: String,
    /// Largest capture file in bytes.
    pub capture_max_bytes: u64,
    /// Frames queued per worker towards the capture writer.
    pub capture_ring_frames: u64,
    /// Seconds a stop waits for the queue pairs to close.
    pub shutdown_timeout_s: u64,
    /// `text` or `json`.
    pub log_format: String,
    /// `error`, `warn`, `info` or `debug`.
    pub log_level: String,
    /// perftest responders, one per port.
    pub perf: Vec<PerfResponderConfig>,
    /// rping responders, one per port.
    pub rping: Vec<RpingResponderConfig>,
}

impl Default for ServeConfig {
    fn default() -> ServeConfig {
        ServeConfig {
            control_socket: "/run/iwarp/control.sock".into(),
            socket_mode: "0660".into(),
            socket_group: String::new(),
            capture_dir: "/var/lib/iwarp/captures".into(),
            capture_max_bytes: 1 << 30,
            capture_ring_frames: 8192,
            shutdown_timeout_s: 10,
            log_format: "text".into(),
            log_level: "info".into(),
            perf: Vec::new(),
            rping: Vec::new(),
        }
    }
}

/// A size: a number of bytes, or text with a `K`/`M`/`G` suffix.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum SizeValue {
    /// Bytes.
    Bytes(u64),
    /// perftest's notation, such as `"64K"`.
    Text(String),
}

/// `[[serve.perf]]`: a perftest responder's port and profile (the keys
/// are `iwarp perf`'s options; perftest does not announce its test).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerfResponderConfig {
    /// TCP port.
    pub port: u16,
    /// `write-bw`, `read-bw`, `send-bw`, `write-lat`, `read-lat`,
    /// `send-lat`.
    pub test: String,
    /// `-s`.
    #[serde(default)]
    pub size: Option<SizeValue>,
    /// `-n`.
    #[serde(default)]
    pub iters: Option<u64>,
    /// `-D`, seconds.
    #[serde(default)]
    pub duration: Option<u64>,
    /// `-q`.
    #[serde(default)]
    pub qps: Option<u64>,
    /// `-t`.
    #[serde(default)]
    pub tx_depth: Option<u64>,
    /// `-r` (send tests; ignored by the others).
    #[serde(default)]
    pub rx_depth: Option<u64>,
    /// `-o` (read tests; ignored by the others).
    #[serde(default)]
    pub outs: Option<u64>,
    /// `-a`.
    #[serde(default)]
    pub all_sizes: bool,
    /// `--data_validation`.
    #[serde(default)]
    pub data_validation: bool,
    /// `--report_gbits`.
    #[serde(default)]
    pub report_gbits: bool,
}

/// `[[serve.rping]]`: an rping responder.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RpingResponderConfig {
    /// TCP port.
    pub port: u16,
    /// `-S`: the largest ping accepted.
    #[serde(default)]
    pub size: Option<u64>,
    /// `-V`.
    #[serde(default)]
    pub validate: bool,
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `ADDRESS:PORT` to listen on; empty: no endpoint.
    pub listen: String,
    /// URL path.
    pub path: String,
}

impl Default for MetricsConfig {
    fn default() -> MetricsConfig {
        MetricsConfig {
            listen: "127.0.0.1:9478".into(),
            path: "/metrics".into(),
        }
    }
}

/// EAL arguments, passed through as given (after the ones the runtime
/// adds: lcores, devices).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EalConfig {
    /// Extra arguments, for example `["--no-huge", "-m", "512"]`.
    #[serde(default)]
    pub args: Vec<String>,
}

/// One port.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortConfig {
    /// A DPDK device string (a PCI address, `net_ring0`,
    /// `net_af_packet0,iface=veth0`, …) or `mem:NAME` for an in-memory
    /// link shared with another dataplane of this process.
    pub device: String,
    /// Our IPv4 address on it.
    pub ip: Ipv4Addr,
    /// Our MAC address (a DPDK port's own if omitted; required for `mem:`).
    #[serde(default)]
    pub mac: Option<MacAddr>,
    /// IP MTU (68 to 9000).
    #[serde(default = "default_mtu")]
    pub mtu: usize,
    /// Static neighbours (no ARP needed for them).
    #[serde(default)]
    pub neighbors: Vec<Neighbor>,
}

fn default_mtu() -> usize {
    1500
}

/// A static ARP entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Neighbor {
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its MAC address.
    pub mac: MacAddr,
}

/// Worker threads: one per core, each owning one queue of each port.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkersConfig {
    /// How many (1 to 64).
    #[serde(default = "one")]
    pub count: usize,
    /// Core of each worker; empty: not pinned.
    #[serde(default)]
    pub cores: Vec<usize>,
}

fn one() -> usize {
    1
}

impl Default for WorkersConfig {
    fn default() -> WorkersConfig {
        WorkersConfig {
            count: 1,
            cores: Vec::new(),
        }
    }
}

/// What a worker does when its loop finds nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleConfig {
    /// Consecutive empty iterations before it sleeps.
    #[serde(default = "default_spin")]
    pub spin: u32,
    /// How long it sleeps, in microseconds (0: never; busy polling). At
    /// most one second.
    #[serde(default = "default_sleep")]
    pub sleep_us: u64,
    /// Give the processor to other runnable threads after each empty
    /// iteration that does not sleep (`sched_yield`, which returns at once
    /// when nothing else waits for the core).
    #[serde(default = "yes")]
    pub yield_cpu: bool,
}

fn default_spin() -> u32 {
    1000
}

fn default_sleep() -> u64 {
    50
}

impl Default for IdleConfig {
    fn default() -> IdleConfig {
        IdleConfig {
            spin: default_spin(),
            sleep_us: default_sleep(),
            yield_cpu: true,
        }
    }
}

/// MPA connection setup defaults (per connection, IRD/ORD come from the
/// application).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MpaConfig {
    /// CRC32c: `"required"` (ask, and refuse a peer that does not ask
    /// too), `"requested"` (ask; the default) or `"off"` (use CRCs only
    /// when the peer asks). `true` and `false`, from configurations written
    /// before the choice had three values, mean `"requested"` and `"off"`.
    #[serde(default, deserialize_with = "crc_policy")]
    pub crc: CrcPolicy,
    /// Ask the peer for markers.
    #[serde(default)]
    pub markers: bool,
    /// The RTR to offer as initiator: `none`, `send`, `write` or `read`.
    #[serde(default = "default_rtr")]
    pub rtr: String,
    /// Seconds to wait for the peer's request or reply.
    #[serde(default = "default_mpa_timeout")]
    pub timeout_s: u64,
    /// As initiator, milliseconds of silence from the peer after our first
    /// FPDU before one zero-length RDMA Write wakes it (Linux siw as
    /// responder can leave that FPDU unread); 0 disables.
    #[serde(default = "default_nudge_ms")]
    pub nudge_ms: u64,
    /// As responder without peer-to-peer: hold our FPDUs until the
    /// initiator's first one (RFC 5044 §7.1.1, strict) when true; when false
    /// (the default, as Linux siw does) the application may speak first
    /// once the peer has acknowledged our MPA reply and work is posted after
    /// the connection is up. perftest's write_lat has the passive side
    /// write first, and siw never asks for peer-to-peer.
    #[serde(default)]
    pub responder_waits_for_first_fpdu: bool,
}

fn default_nudge_ms() -> u64 {
    200
}

/// `mpa.crc`: one of the three names, or the boolean of older files.
fn crc_policy<'de, D: serde::Deserializer<'de>>(d: D) -> Result<CrcPolicy, D::Error> {
    struct Policy;
    impl serde::de::Visitor<'_> for Policy {
        type Value = CrcPolicy;

        fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str("one of required, requested, off (or true, false)")
        }

        fn visit_bool<E: serde::de::Error>(self, ask: bool) -> Result<CrcPolicy, E> {
            Ok(CrcPolicy::from(ask))
        }

        fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<CrcPolicy, E> {
            match name {
                "required" => Ok(CrcPolicy::Required),
                "requested" => Ok(CrcPolicy::Requested),
                "off" => Ok(CrcPolicy::Off),
                other => Err(E::custom(format!(
                    "`{other}` is not one of required, requested, off"
                ))),
            }
        }
    }
    d.deserialize_any(Policy)
}

fn yes() -> bool {
    true
}

fn default_rtr() -> String {
    "write".into()
}

fn default_mpa_timeout() -> u64 {
    10
}

impl Default for MpaConfig {
    fn default() -> MpaConfig {
        MpaConfig {
            crc: CrcPolicy::Requested,
            markers: false,
            rtr: default_rtr(),
            timeout_s: default_mpa_timeout(),
            nudge_ms: default_nudge_ms(),
            responder_waits_for_first_fpdu: false,
        }
    }
}

/// TCP options (the rest are `tcp-offload`'s defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpConfig {
    /// SACK (RFC 2018).
    #[serde(default = "yes")]
    pub sack: bool,
    /// Timestamps (RFC 7323).
    #[serde(default = "yes")]
    pub timestamps: bool,
    /// Receive buffer per connection, bytes (4 KiB to 64 MiB).
    #[serde(default = "default_recv_buffer")]
    pub recv_buffer: usize,
    /// Connections per worker.
    #[serde(default = "default_conns")]
    pub max_connections: usize,
    /// How long a stopping dataplane lets its connections' FIN exchanges
    /// finish (ms): connections still up are closed with a FIN, and those
    /// not closed (or in TIME-WAIT) when the time is up are reset and
    /// counted (`shutdown_resets`). 0: reset at once.
    #[serde(default = "default_close_linger_ms")]
    pub close_linger_ms: u64,
    /// Send runs of whole FPDUs as trains under one header, cut into one
    /// FPDU per segment: by the port where it has TCP segmentation
    /// offload, by the worker where it has not (one TCP output decision
    /// and one header for up to 16 segments).
    #[serde(default = "yes")]
    pub segmentation_offload: bool,
    /// Put several whole FPDUs into one TCP segment (at most the MSS, none
    /// split) when more small ones are queued than go out one by one
    /// (RFC 5044 §5); off, every FPDU has a segment of its own.
    #[serde(default = "yes")]
    pub pack_fpdus: bool,
    /// Payload bytes one connection sends in its turn before the next
    /// connection with data to send gets its own (0 to 16 MiB; 0: one
    /// segment per turn); past them the turn goes on to the end of the
    /// message under way, up to twice as many. Long turns keep the
    /// sending connection's state and data in cache, which is what keeps
    /// thousands of busy connections near one's bandwidth; a connection
    /// that just got data waits behind at most twice this much from each
    /// of the others.
    #[serde(default = "default_turn_bytes")]
    pub turn_bytes: usize,
}

fn default_turn_bytes() -> usize {
    64 * 1024
}

fn default_close_linger_ms() -> u64 {
    1000
}

fn default_recv_buffer() -> usize {
    1024 * 1024
}

fn default_conns() -> usize {
    1024
}

impl Default for TcpConfig {
    fn default() -> TcpConfig {
        TcpConfig {
            sack: true,
            timestamps: true,
            recv_buffer: default_recv_buffer(),
            max_connections: default_conns(),
            close_linger_ms: default_close_linger_ms(),
            segmentation_offload: true,
            pack_fpdus: true,
            turn_bytes: default_turn_bytes(),
        }
    }
}

/// Sizes of the verbs object tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Memory registrations.
    #[serde(default = "default_max_mr")]
    pub max_mr: u32,
    /// Queue pairs.
    #[serde(default = "default_max_qp")]
    pub max_qp: u32,
    /// Work requests per send or receive queue.
    #[serde(default = "default_max_wr")]
    pub max_qp_wr: u32,
    /// Entries per completion queue.
    #[serde(default = "default_max_cqe")]
    pub max_cqe: u32,
}

fn default_max_mr() -> u32 {
    4096
}

fn default_max_qp() -> u32 {
    1024
}

fn default_max_wr() -> u32 {
    4096
}

fn default_max_cqe() -> u32 {
    64 * 1024
}

impl Default for LimitsConfig {
    fn default() -> LimitsConfig {
        LimitsConfig {
            max_mr: default_max_mr(),
            max_qp: default_max_qp(),
            max_qp_wr: default_max_wr(),
            max_cqe: default_max_cqe(),
        }
    }
}

impl Config {
    /// Reads `path`, applies `overrides` (`key=value`, the value in TOML
    /// syntax or a bare string), validates.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Config::parse(&text, overrides)
    }

    /// Parses `text`, applies `overrides`, validates.
    pub fn parse(text: &str, overrides: &[String]) -> Result<Config, ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax(e.to_string()))?;
        let mut root = toml::Value::Table(table);
        for o in overrides {
            apply_override(&mut root, o)?;
        }
        let config: Config = root
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Syntax(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// A one-port, one-worker configuration (tests and the demo).
    pub fn single(device: &str, ip: Ipv4Addr, mac: EthernetAddress) -> Config {
        Config {
            eal: EalConfig::default(),
            ports: vec![PortConfig {
                device: device.into(),
                ip,
                mac: Some(MacAddr(mac)),
                mtu: default_mtu(),
                neighbors: Vec::new(),
            }],
            workers: WorkersConfig::default(),
            idle: IdleConfig::default(),
            mpa: MpaConfig::default(),
            tcp: TcpConfig::default(),
            limits: LimitsConfig::default(),
            serve: ServeConfig::default(),
            metrics: MetricsConfig::default(),
        }
    }

    /// Checks ranges and consistency; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.ports.is_empty() {
            return Err(invalid("ports", "at least one port is needed"));
        }
        if self.ports.len() > 1 {
            return Err(invalid(
                "ports",
                "one port per dataplane is supported so far",
            ));
        }
        for (i, p) in self.ports.iter().enumerate() {
            let k = |f: &str| format!("ports[{i}].{f}");
            if p.device.trim().is_empty() {
                return Err(invalid(k("device"), "empty device string"));
            }
            if p.device.starts_with("mem:") && p.mac.is_none() {
                return Err(invalid(k("mac"), "an in-memory link needs a MAC address"));
            }
            if p.ip.is_unspecified() || p.ip.is_broadcast() || p.ip.is_multicast() {
                return Err(invalid(k("ip"), format!("{} is not a host address", p.ip)));
            }
            if let Some(m) = p.mac {
                if !m.0.is_unicast() {
                    return Err(invalid(k("mac"), "not a unicast address"));
                }
            }
            if !(68..=9000).contains(&p.mtu) {
                return Err(invalid(k("mtu"), format!("{} is not in 68..=9000", p.mtu)));
            }
            for (j, n) in p.neighbors.iter().enumerate() {
                if !n.mac.0.is_unicast() {
                    return Err(invalid(
                        format!("ports[{i}].neighbors[{j}].mac"),
                        "not a unicast address",
                    ));
                }
            }
        }
        let w = &self.workers;
        if !(1..=64).contains(&w.count) {
            return Err(invalid(
                "workers.count",
                format!("{} is not in 1..=64", w.count),
            ));
        }
        if !w.cores.is_empty() && w.cores.len() != w.count {
            return Err(invalid(
                "workers.cores",
                format!("{} cores for {} workers", w.cores.len(), w.count),
            ));
        }
        let mut seen = w.cores.clone();
        seen.sort_unstable();
        if seen.windows(2).any(|p| p[0] == p[1]) {
            return Err(invalid("workers.cores", "a core is named twice"));
        }
        if self.idle.sleep_us > 1_000_000 {
            return Err(invalid("idle.sleep_us", "more than one second"));
        }
        self.mpa_rtr()?;
        if self.mpa.timeout_s == 0 || self.mpa.timeout_s > 3600 {
            return Err(invalid("mpa.timeout_s", "not in 1..=3600"));
        }
        if self.mpa.nudge_ms > 60_000 {
            return Err(invalid("mpa.nudge_ms", "more than 60000"));
        }
        if !(4096..=64 << 20).contains(&self.tcp.recv_buffer) {
            return Err(invalid("tcp.recv_buffer", "not in 4 KiB..=64 MiB"));
        }
        if self.tcp.turn_bytes > 16 << 20 {
            return Err(invalid("tcp.turn_bytes", "above 16 MiB"));
        }
        if self.tcp.close_linger_ms > 60_000 {
            return Err(invalid("tcp.close_linger_ms", "above 60000"));
        }
        if !(1..=1 << 20).contains(&self.tcp.max_connections) {
            return Err(invalid("tcp.max_connections", "not in 1..=1048576"));
        }
        let l = &self.limits;
        for (key, v, max) in [
            ("limits.max_mr", l.max_mr, rdmap::verbs::MAX_STAG_INDEX),
            ("limits.max_qp", l.max_qp, 1 << 20),
            ("limits.max_qp_wr", l.max_qp_wr, 1 << 16),
            ("limits.max_cqe", l.max_cqe, 1 << 22),
        ] {
            if v == 0 || v > max {
                return Err(invalid(key, format!("{v} is not in 1..={max}")));
            }
        }
        Ok(())
    }

    /// The RTR kind the initiator offers (`None`: not peer-to-peer).
    pub fn mpa_rtr(&self) -> Result<Option<rdmap::mpa::RtrType>, ConfigError> {
        use rdmap::mpa::RtrType;
        match self.mpa.rtr.as_str() {
            "none" => Ok(None),
            "send" => Ok(Some(RtrType::Send)),
            "write" => Ok(Some(RtrType::Write)),
            "read" => Ok(Some(RtrType::Read)),
            other => Err(invalid(
                "mpa.rtr",
                format!("`{other}` is not one of none, send, write, read"),
            )),
        }
    }
}

/// Sets `key=value` in `root`. The key is dotted; a numeric component
/// indexes an array (`ports.0.mtu`). The value is parsed as TOML, and
/// taken as a string if that fails (`ports.0.device=net_ring0`).
fn apply_override(root: &mut toml::Value, given: &str) -> Result<(), ConfigError> {
    let err = |reason: &str| ConfigError::Override {
        given: given.to_owned(),
        reason: reason.to_owned(),
    };
    let (key, raw) = given
        .split_once('=')
        .ok_or_else(|| err("expected key=value"))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(err("empty key"));
    }
    let value = parse_value(raw.trim());
    let parts: Vec<&str> = key.split('.').collect();
    let mut node: &mut toml::Value = root;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        if part.is_empty() {
            return Err(err("empty key component"));
        }
        node = match node {
            toml::Value::Table(t) => {
                if last {
                    t.insert((*part).to_owned(), value);
                    return Ok(());
                }
                t.entry((*part).to_owned())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            }
            toml::Value::Array(a) => {
                let idx: usize = part
                    .parse()
                    .map_err(|_| err(&format!("`{part}` indexes an array: use a number")))?;
                let len = a.len();
                let Some(slot) = a.get_mut(idx) else {
                    return Err(err(&format!("index {idx} beyond the array's {len}")));
                };
                if last {
                    *slot = value;
                    return Ok(());
                }
                slot
            }
            _ => {
                return Err(err(&format!(
                    "`{part}` is inside a value that is not a table"
                )))
            }
        };
    }
    Ok(())
}

fn parse_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_owned())),
        Err(_) => toml::Value::String(raw.to_owned()),
    }
}
