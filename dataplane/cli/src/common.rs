//! What the subcommands share: the options that say which device, address
//! and cores an endpoint uses ([`EndpointArgs`]), opening a [`Dataplane`]
//! from them, the one error type that `main` prints as a single line, and
//! the interrupt flag the long runs poll (kept in `interrupt`, with the
//! crate's only `unsafe`).

use std::net::Ipv4Addr;
use std::path::PathBuf;

use clap::Args;

use dataplane::api::{Dataplane, Error};
use dataplane::config::{Config, ConfigError, MacAddr};

pub use crate::interrupt::{catch_interrupts, interrupted};

/// Why a subcommand failed: printed by `main` as one line, exit status 1.
#[derive(Debug)]
pub enum ToolError {
    /// Bad command-line input (size, count, address…).
    Usage(String),
    /// The configuration file or an override was refused.
    Config(ConfigError),
    /// The dataplane refused (device, memory, connection…).
    Dataplane(Error),
    /// The peer misbehaved or went away, or a transfer failed.
    Peer(String),
    /// Received data differed from what was sent.
    DataMismatch(String),
    /// Writing output failed.
    Io(std::io::Error),
}

impl core::fmt::Display for ToolError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ToolError::Usage(m) => write!(f, "{m}"),
            ToolError::Config(e) => write!(f, "configuration: {e}"),
            ToolError::Dataplane(e) => write!(f, "{e}"),
            ToolError::Peer(m) => write!(f, "{m}"),
            ToolError::DataMismatch(m) => write!(f, "data check failed: {m}"),
            ToolError::Io(e) => write!(f, "output: {e}"),
        }
    }
}

impl std::error::Error for ToolError {}

impl From<Error> for ToolError {
    fn from(e: Error) -> ToolError {
        ToolError::Dataplane(e)
    }
}

impl From<ConfigError> for ToolError {
    fn from(e: ConfigError) -> ToolError {
        ToolError::Config(e)
    }
}

impl From<std::io::Error> for ToolError {
    fn from(e: std::io::Error) -> ToolError {
        ToolError::Io(e)
    }
}

/// Where an endpoint runs: a configuration file, or a device and an
/// address given on the command line (which override the file's).
#[derive(Debug, Clone, Default, Args)]
pub struct EndpointArgs {
    /// Configuration file (TOML; see `deploy/iwarp.toml`). Options below
    /// override its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// DPDK device string of the port: a PCI address, or a virtual device
    /// such as `net_af_packet0,iface=veth0` or `net_tap0,iface=dtap0`.
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
    /// Our IPv4 address on the port.
    #[arg(long, value_name = "IP")]
    pub ip: Option<Ipv4Addr>,
    /// Our MAC address (the port's own if omitted).
    #[arg(long, value_name = "MAC")]
    pub mac: Option<String>,
    /// IP MTU of the port.
    #[arg(long, value_name = "BYTES")]
    pub mtu: Option<usize>,
    /// Worker cores, comma separated (one worker per core).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub cores: Vec<usize>,
    /// Extra EAL arguments, space separated (for example
    /// `"--no-huge -m 512"`); replaces the defaults.
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub eal: Option<String>,
    /// Configuration overrides, `key=value` in TOML syntax (repeatable),
    /// for example `--set mpa.crc=false`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

impl EndpointArgs {
    /// The configuration these options describe.
    pub fn config(&self) -> Result<Config, ToolError> {
        let mut config = match &self.config {
            Some(path) => Config::load(path, &self.overrides)?,
            None => {
                let device = self.device.as_deref().ok_or_else(|| {
                    ToolError::Usage("no device: give --device DEVICE or --config FILE".into())
                })?;
                let ip = self.ip.ok_or_else(|| {
                    ToolError::Usage("no address: give --ip ADDRESS or --config FILE".into())
                })?;
                let mut c = Config::single(device, ip, tcp_offload::wire::EthernetAddress([0; 6]));
                c.ports[0].mac = None;
                if !self.overrides.is_empty() {
                    c = Config::parse(&config_text(&c), &self.overrides)?;
                }
                c
            }
        };
        let port = &mut config.ports[0];
        if let Some(d) = &self.device {
            port.device.clone_from(d);
        }
        if let Some(ip) = self.ip {
            port.ip = ip;
        }
        if let Some(m) = &self.mac {
            let mac: MacAddr = m
                .parse()
                .map_err(|_| ToolError::Usage(format!("bad MAC address {m:?}")))?;
            port.mac = Some(mac);
        }
        if let Some(mtu) = self.mtu {
            port.mtu = mtu;
        }
        if !self.cores.is_empty() {
            config.workers.cores.clone_from(&self.cores);
            config.workers.count = self.cores.len();
        }
        if let Some(eal) = &self.eal {
            config.eal.args = eal.split_whitespace().map(String::from).collect();
        }
        config.validate()?;
        Ok(config)
    }

    /// Opens the dataplane these options describe.
    pub fn open(&self) -> Result<Dataplane, ToolError> {
        let config = self.config()?;
        open_dataplane(&config)
    }
}

/// Opens a dataplane on `config`; when that fails, removes the runtime
/// directory a failed EAL start leaves behind (`rte_eal_init` creates it
/// before it looks at the devices and does not remove it on failure), if
/// it was not there before, so that bad input leaves nothing in
/// `/var/run/dpdk`. A device error names the device.
pub fn open_dataplane(config: &Config) -> Result<Dataplane, ToolError> {
    let device = &config.ports[0].device;
    let runtime = eal_runtime_dir(config).filter(|d| !d.exists());
    Dataplane::open(config).map_err(|e| {
        if let Some(dir) = &runtime {
            let _ = std::fs::remove_dir_all(dir);
        }
        match e {
            // The defaults are for virtual devices (`--no-pci`).
            Error::Device(m) if config.eal.args.is_empty() && !device.starts_with("net_") => {
                ToolError::Usage(format!(
                    "cannot open device {device:?}: {m} (the default EAL arguments exclude \
                     PCI ports: give --eal or [eal] args, see deploy/REAL-NIC.md)"
                ))
            }
            Error::Device(m) => ToolError::Usage(format!("cannot open device {device:?}: {m}")),
            other => ToolError::Dataplane(other),
        }
    })
}

/// Where EAL keeps the runtime files of `config`'s file prefix (as DPDK
/// places them: `/var/run/dpdk` for root, `$XDG_RUNTIME_DIR/dpdk` or
/// `/tmp/dpdk` otherwise); `None` for a device that starts no EAL.
pub fn eal_runtime_dir(config: &Config) -> Option<PathBuf> {
    let device = &config.ports[0].device;
    if device.starts_with("mem:") {
        return None;
    }
    let args = dataplane::dpdk_link::eal_args_for(&config.eal.args, device);
    let prefix = args.iter().enumerate().find_map(|(i, a)| {
        if a == "--file-prefix" {
            args.get(i + 1).cloned()
        } else {
            a.strip_prefix("--file-prefix=").map(String::from)
        }
    })?;
    Some(eal_prefix_dir(&prefix))
}

/// Where EAL keeps the runtime files of file prefix `prefix`: under
/// `/var/run/dpdk` for root, `$XDG_RUNTIME_DIR/dpdk` or `/tmp/dpdk`
/// otherwise.
pub fn eal_prefix_dir(prefix: &str) -> PathBuf {
    // The effective user id is the second on the `Uid:` line.
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    let base = if root {
        PathBuf::from("/var/run")
    } else {
        std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"))
    };
    base.join("dpdk").join(prefix)
}

/// A minimal TOML rendering of a one-port configuration, so that
/// command-line overrides go through the same parser as a file's.
fn config_text(c: &Config) -> String {
    let p = &c.ports[0];
    format!(
        "[[ports]]\ndevice = {:?}\nip = \"{}\"\nmtu = {}\n",
        p.device, p.ip, p.mtu
    )
}
