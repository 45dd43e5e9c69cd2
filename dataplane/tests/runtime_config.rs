//! The configuration file: a full example parses (and so does the
//! real-NIC example under `deploy/`), overrides change any key, and every
//! kind of bad input is refused with an error that names the key (never a
//! panic). Then two dataplanes opened from configurations naming the same
//! in-memory link talk to each other.

mod runtime_common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use dataplane::api::{CmEvent, ConnectParams, Dataplane, Error};
use dataplane::config::{Config, ConfigError, CrcPolicy};
use runtime_common::*;

const FULL: &str = r#"
[eal]
args = ["--no-huge", "-m", "512"]

[[ports]]
device = "net_ring0"
ip = "10.0.0.1"
mac = "02:00:00:00:00:01"
mtu = 9000
neighbors = [{ ip = "10.0.0.2", mac = "02:00:00:00:00:02" }]

[workers]
count = 2
cores = [0, 1]

[idle]
spin = 10
sleep_us = 100

[mpa]
crc = false
markers = true
rtr = "read"
timeout_s = 3

[tcp]
sack = false
timestamps = false
recv_buffer = 65536
max_connections = 64

[limits]
max_mr = 100
max_qp = 10
max_qp_wr = 128
max_cqe = 1024
"#;

#[test]
fn full_example_parses() {
    let c = Config::parse(FULL, &[]).unwrap();
    assert_eq!(c.eal.args, ["--no-huge", "-m", "512"]);
    assert_eq!(c.ports[0].device, "net_ring0");
    assert_eq!(c.ports[0].ip, Ipv4Addr::new(10, 0, 0, 1));
    assert_eq!(c.ports[0].mac.unwrap().0 .0, [2, 0, 0, 0, 0, 1]);
    assert_eq!(c.ports[0].mtu, 9000);
    assert_eq!(c.ports[0].neighbors[0].ip, Ipv4Addr::new(10, 0, 0, 2));
    assert_eq!((c.workers.count, c.workers.cores.clone()), (2, vec![0, 1]));
    assert_eq!((c.idle.spin, c.idle.sleep_us), (10, 100));
    assert!(c.mpa.crc == CrcPolicy::Off && c.mpa.markers);
    assert_eq!(c.mpa_rtr().unwrap(), Some(dataplane::api::RtrType::Read));
    assert!(!c.tcp.sack && !c.tcp.timestamps);
    assert_eq!(c.limits.max_cqe, 1024);
    // Defaults fill what a minimal file leaves out.
    let m = Config::parse(
        "[[ports]]\ndevice = \"net_null0\"\nip = \"10.1.1.1\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(
        (m.workers.count, m.ports[0].mtu, m.idle.sleep_us),
        (1, 1500, 50)
    );
    assert_eq!(m.mpa.crc, CrcPolicy::Requested);
    assert_eq!(m.mpa.nudge_ms, 200);
    assert_eq!(m.tcp.turn_bytes, 65536);
    assert!(!m.mpa.responder_waits_for_first_fpdu);
}

#[test]
fn overrides_set_any_key() {
    let c = Config::parse(
        FULL,
        &[
            "workers.count=1".into(),
            "workers.cores=[3]".into(),
            "ports.0.device=net_af_packet0,iface=veth0".into(),
            "ports.0.mtu = 1500".into(),
            "mpa.rtr=none".into(),
            "mpa.nudge_ms=0".into(),
            "mpa.responder_waits_for_first_fpdu=true".into(),
            "eal.args=[\"-l\", \"0-1\"]".into(),
        ],
    )
    .unwrap();
    assert_eq!((c.workers.count, c.workers.cores.clone()), (1, vec![3]));
    assert_eq!(c.ports[0].device, "net_af_packet0,iface=veth0");
    assert_eq!(c.ports[0].mtu, 1500);
    assert_eq!(c.mpa_rtr().unwrap(), None);
    assert_eq!(c.mpa.nudge_ms, 0);
    assert!(c.mpa.responder_waits_for_first_fpdu);
    assert_eq!(c.eal.args, ["-l", "0-1"]);
}

#[test]
fn mpa_crc_takes_three_values_and_the_old_booleans() {
    // In the file, as a quoted string or a boolean of older files; on the
    // command line, `--set mpa.crc=required` arrives as a bare word.
    for (text, want) in [
        ("\"required\"", CrcPolicy::Required),
        ("\"requested\"", CrcPolicy::Requested),
        ("\"off\"", CrcPolicy::Off),
        ("true", CrcPolicy::Requested),
        ("false", CrcPolicy::Off),
    ] {
        let file = FULL.replace("crc = false", &format!("crc = {text}"));
        assert_eq!(
            Config::parse(&file, &[]).unwrap().mpa.crc,
            want,
            "crc = {text}"
        );
    }
    for (set, want) in [
        ("mpa.crc=required", CrcPolicy::Required),
        ("mpa.crc=requested", CrcPolicy::Requested),
        ("mpa.crc=off", CrcPolicy::Off),
        ("mpa.crc=true", CrcPolicy::Requested),
        ("mpa.crc=false", CrcPolicy::Off),
    ] {
        assert_eq!(
            Config::parse(FULL, &[set.into()]).unwrap().mpa.crc,
            want,
            "{set}"
        );
    }
    // Anything else is refused, naming the key and the choices.
    for bad in ["mpa.crc=sometimes", "mpa.crc=1", "mpa.crc=Required"] {
        match Config::parse(FULL, &[bad.into()]) {
            Err(e @ ConfigError::Syntax(_)) => {
                let m = e.to_string();
                println!("{bad}: {}", m.lines().next().unwrap_or(""));
                assert!(
                    m.contains("mpa.crc") && m.contains("required, requested, off"),
                    "{m}"
                );
            }
            other => panic!("{bad}: expected a refusal, got {other:?}"),
        }
    }
}

fn invalid_key(text: &str, overrides: &[&str]) -> String {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    match Config::parse(text, &o) {
        Err(ConfigError::Invalid { key, reason }) => {
            println!("refused {key}: {reason}");
            key
        }
        other => panic!("expected an invalid key, got {other:?}"),
    }
}

#[test]
fn bad_values_name_their_key() {
    assert_eq!(invalid_key(FULL, &["ports.0.mtu=9001"]), "ports[0].mtu");
    assert_eq!(invalid_key(FULL, &["ports.0.mtu=67"]), "ports[0].mtu");
    assert_eq!(
        invalid_key(FULL, &["ports.0.ip=\"0.0.0.0\""]),
        "ports[0].ip"
    );
    assert_eq!(
        invalid_key(FULL, &["ports.0.mac=\"01:00:5e:00:00:01\""]),
        "ports[0].mac"
    );
    assert_eq!(
        invalid_key(FULL, &["ports.0.device=\" \""]),
        "ports[0].device"
    );
    assert_eq!(invalid_key(FULL, &["workers.count=0"]), "workers.count");
    assert_eq!(invalid_key(FULL, &["workers.count=3"]), "workers.cores");
    assert_eq!(
        invalid_key(FULL, &["workers.cores=[1, 1]"]),
        "workers.cores"
    );
    assert_eq!(
        invalid_key(FULL, &["idle.sleep_us=2000000"]),
        "idle.sleep_us"
    );
    assert_eq!(invalid_key(FULL, &["mpa.rtr=\"sometimes\""]), "mpa.rtr");
    assert_eq!(invalid_key(FULL, &["mpa.timeout_s=0"]), "mpa.timeout_s");
    assert_eq!(invalid_key(FULL, &["mpa.nudge_ms=60001"]), "mpa.nudge_ms");
    assert_eq!(
        invalid_key(FULL, &["tcp.recv_buffer=10"]),
        "tcp.recv_buffer"
    );
    assert_eq!(
        invalid_key(FULL, &["tcp.turn_bytes=16777217"]),
        "tcp.turn_bytes"
    );
    assert_eq!(invalid_key(FULL, &["limits.max_cqe=0"]), "limits.max_cqe");
    assert_eq!(invalid_key("ports = []", &[]), "ports");
    assert_eq!(
        invalid_key("[[ports]]\ndevice = \"mem:x\"\nip = \"10.0.0.1\"\n", &[]),
        "ports[0].mac"
    );
}

#[test]
fn syntax_types_unknown_keys_and_bad_overrides_are_errors() {
    for (text, overrides) in [
        ("[[ports]\ndevice = 1", vec![]),
        ("[[ports]]\ndevice = 1\nip = \"10.0.0.1\"", vec![]),
        ("[[ports]]\ndevice = \"d\"\nip = \"10.0.0.300\"", vec![]),
        (
            "[[ports]]\ndevice = \"d\"\nip = \"10.0.0.1\"\nmac = \"02:00:00:00:00\"",
            vec![],
        ),
        (
            "[[ports]]\ndevice = \"d\"\nip = \"10.0.0.1\"\nspeed = 10",
            vec![],
        ),
        (FULL, vec!["workers.count=-1"]),
        (FULL, vec!["nosuchsection.key=1"]),
    ] {
        let o: Vec<String> = overrides.iter().map(|s: &&str| s.to_string()).collect();
        match Config::parse(text, &o) {
            Err(ConfigError::Syntax(m)) => println!("refused: {}", m.lines().next().unwrap_or("")),
            other => panic!("expected a syntax error for {text:?} {o:?}, got {other:?}"),
        }
    }
    for o in [
        "novalue",
        "=3",
        "ports.x.mtu=1",
        "ports.5.mtu=1",
        "workers.count.deeper=1",
        "a..b=1",
    ] {
        match Config::parse(FULL, &[o.to_string()]) {
            Err(e @ ConfigError::Override { .. }) => println!("refused: {e}"),
            other => panic!("expected an override error for {o}, got {other:?}"),
        }
    }
    let missing = Config::load(std::path::Path::new("/nonexistent/iwarp.toml"), &[]);
    assert!(matches!(missing, Err(ConfigError::Io { .. })));
}

#[test]
fn a_dpdk_device_string_opens_the_dpdk_port_and_cleans_up() {
    // The only test here that starts EAL (once per process).
    let c = Config::parse(
        FULL,
        &[
            "workers.cores=[]".into(),
            r#"eal.args=["--no-huge", "-m", "512", "--no-pci", "--no-telemetry"]"#.into(),
        ],
    )
    .unwrap();
    let dir = std::path::PathBuf::from(format!("/var/run/dpdk/iwarp-{}", std::process::id()));
    let dp = Dataplane::open(&c).expect("net_ring0 from the configuration");
    assert_eq!(dp.workers(), 2);
    drop(dp);
    assert!(!dir.exists(), "{} left behind", dir.display());
    // EAL does not start twice in a process.
    assert!(matches!(Dataplane::open(&c), Err(Error::Device(_))));
}

#[test]
fn two_dataplanes_opened_from_configuration_files() {
    let text = |ip: &str, mac: &str| {
        format!(
            "[[ports]]\ndevice = \"mem:cfg-link\"\nip = \"{ip}\"\nmac = \"{mac}\"\n[idle]\nspin = 100\nsleep_us = 20\n"
        )
    };
    let ca = Config::parse(&text("10.9.0.1", "02:00:00:00:09:01"), &[]).unwrap();
    let cb = Config::parse(&text("10.9.0.2", "02:00:00:00:09:02"), &[]).unwrap();
    let a = Dataplane::open(&ca).unwrap();
    let b = Dataplane::open(&cb).unwrap();
    b.listen(7777, 4).unwrap();
    let (ea, eb) = (End::new(&a), End::new(&b));
    a.connect(
        &ea.qp,
        SocketAddrV4::new(Ipv4Addr::new(10, 9, 0, 2), 7777),
        &ConnectParams::default(),
    )
    .unwrap();
    let Some(CmEvent::ConnectRequest(req)) = b.wait_event(Duration::from_secs(20)) else {
        panic!("no request");
    };
    assert_eq!(*req.remote.ip(), Ipv4Addr::new(10, 9, 0, 1));
    b.accept(&req, &eb.qp, &ConnectParams::default()).unwrap();
    assert!(matches!(
        a.wait_event(Duration::from_secs(20)),
        Some(CmEvent::Established { .. })
    ));
    assert!(matches!(
        b.wait_event(Duration::from_secs(20)),
        Some(CmEvent::Established { .. })
    ));
    println!("configured dataplanes connected: {:?}", a.stats());
}

#[test]
fn real_nic_example_in_deploy_parses_and_keeps_its_eal_arguments() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/iwarp-real-nic.example.toml");
    let c = Config::load(&path, &[]).expect("deploy/iwarp-real-nic.example.toml");
    let port = &c.ports[0];
    assert_eq!(port.device, "0000:01:00.0");
    assert_eq!(port.ip, Ipv4Addr::new(192, 168, 50, 10));
    assert!(port.mac.is_none(), "the example uses the port's own MAC");
    assert_eq!(port.mtu, 9000);
    assert_eq!(port.neighbors.len(), 1);
    assert_eq!((c.workers.count, c.workers.cores.clone()), (2, vec![2, 3]));
    assert_eq!(c.idle.sleep_us, 0);
    let eal = &c.eal.args;
    // Hugepages and PCI: none of the virtual-device defaults.
    assert!(!eal.iter().any(|a| a == "--no-huge" || a == "--no-pci"));
    // The port is allow-listed, and the main lcore is not a worker's core.
    let after = |flag: &str| {
        let i = eal.iter().position(|a| a == flag).unwrap();
        eal[i + 1].clone()
    };
    assert_eq!(after("-a"), port.device);
    let main_lcore: usize = after("-l").parse().unwrap();
    assert!(!c.workers.cores.contains(&main_lcore));
    // The runtime passes the list through: no vdev added for a PCI
    // address, and the file's own prefix kept.
    let args = dataplane::dpdk_link::eal_args_for(eal, &port.device);
    assert_eq!(&args, eal);
    assert_eq!(args.iter().filter(|a| *a == "--file-prefix").count(), 1);
    // Overrides work on it as on any file (a host with other cores).
    let o = Config::load(&path, &["workers.cores=[4, 5]".into()]).unwrap();
    assert_eq!(o.workers.cores, vec![4, 5]);
}
