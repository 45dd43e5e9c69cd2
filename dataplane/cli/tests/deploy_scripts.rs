//! The operations material under `deploy/`: the service configuration
//! `deploy/iwarp.toml` against the runtime's configuration parser (every
//! field of `dataplane/src/config.rs` present, documented with its
//! default, the runtime's part parsing to the defaults), and the shell
//! checks of `deploy/ops-test.sh` (systemd unit, install, hugepages, NIC
//! binding, the example configuration under `iwarp serve`), one test per
//! section so each reports on its own.
//!
//! The sections needing root (network namespaces, EAL) skip inside the script
//! when not root, or fail with `IWARP_REQUIRE_ROOT_TESTS=1`.

use std::path::PathBuf;
use std::process::Command;

use dataplane::config::{
    Config, IdleConfig, LimitsConfig, MetricsConfig, MpaConfig, TcpConfig, WorkersConfig,
};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the cli crate sits in dataplane/ in the workspace")
        .to_path_buf()
}

fn example() -> String {
    let path = repo().join("deploy/iwarp.toml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn example_config_parses_with_the_runtime_defaults() {
    let text = example();
    let config = Config::parse(&text, &[]).unwrap_or_else(|e| panic!("deploy/iwarp.toml: {e}"));
    assert_eq!(config.ports.len(), 1);
    assert_eq!(config.ports[0].device, "0000:01:00.0");
    assert_eq!(config.ports[0].mtu, 1500);
    assert!(config.ports[0].mac.is_none(), "mac is left to the port");
    assert!(config.ports[0].neighbors.is_empty());
    assert!(
        config.eal.args.iter().any(|a| a == "--in-memory"),
        "a service leaves nothing in /run/dpdk: {:?}",
        config.eal.args
    );
    assert!(
        !config.eal.args.iter().any(|a| a.starts_with("--iova-mode")),
        "IOVA-as-PA is opt-in (it needs two more capabilities)"
    );
    // Every other section sets each key to its default.
    assert_eq!(config.workers, WorkersConfig::default());
    assert_eq!(config.idle, IdleConfig::default());
    assert_eq!(config.mpa, MpaConfig::default());
    assert_eq!(config.tcp, TcpConfig::default());
    assert_eq!(config.limits, LimitsConfig::default());
    assert_eq!(config.metrics, MetricsConfig::default());
    println!(
        "deploy/iwarp.toml parses; workers, idle, mpa, tcp, limits, metrics equal the defaults"
    );

    // The names the unit and the operators rely on, read as plain TOML.
    let table: toml::Table = text.parse().expect("deploy/iwarp.toml is TOML");
    let get = |path: &[&str]| -> Option<toml::Value> {
        let mut v = toml::Value::Table(table.clone());
        for p in path {
            v = match p.parse::<usize>() {
                Ok(i) => v.as_array()?.get(i)?.clone(),
                Err(_) => v.as_table()?.get(*p)?.clone(),
            };
        }
        Some(v)
    };
    let s = |v: &str| Some(toml::Value::String(v.into()));
    let i = |v: i64| Some(toml::Value::Integer(v));
    assert_eq!(
        get(&["serve", "control_socket"]),
        s("/run/iwarp/control.sock")
    );
    assert_eq!(get(&["metrics", "listen"]), s("127.0.0.1:9478"));
    assert_eq!(get(&["serve", "perf", "0", "port"]), i(18515));
    assert_eq!(get(&["serve", "perf", "0", "test"]), s("write-bw"));
    assert_eq!(get(&["serve", "perf", "0", "size"]), i(65536));
    assert_eq!(get(&["serve", "rping", "0", "port"]), i(7174));
    println!(
        "serve tables: control_socket, metrics.listen, {} perf responder(s), {} rping responder(s)",
        get(&["serve", "perf"])
            .and_then(|v| v.as_array().map(Vec::len))
            .unwrap_or(0),
        get(&["serve", "rping"])
            .and_then(|v| v.as_array().map(Vec::len))
            .unwrap_or(0),
    );
}

/// A struct of config.rs: its name and its `pub` fields with their types.
struct Struct {
    name: String,
    fields: Vec<(String, String)>,
}

/// The brace structs of `config.rs`, read from the source.
fn config_structs() -> Vec<Struct> {
    let src = std::fs::read_to_string(repo().join("dataplane/src/config.rs"))
        .expect("reading dataplane/src/config.rs");
    let mut out = Vec::new();
    let mut current: Option<Struct> = None;
    for line in src.lines() {
        if let Some(rest) = line.strip_prefix("pub struct ") {
            if let Some(name) = rest.strip_suffix(" {") {
                current = Some(Struct {
                    name: name.trim().to_owned(),
                    fields: Vec::new(),
                });
            }
            continue;
        }
        if line == "}" {
            out.extend(current.take());
            continue;
        }
        if let (Some(s), Some(f)) = (current.as_mut(), line.trim().strip_prefix("pub ")) {
            if let Some((name, ty)) = f.split_once(':') {
                let ty = ty.trim().trim_end_matches(',');
                s.fields.push((name.trim().to_owned(), ty.to_owned()));
            }
        }
    }
    out
}

/// The type a field holds, inside `Vec<…>` / `Option<…>`.
fn inner(ty: &str) -> &str {
    let mut t = ty;
    for w in ["Vec<", "Option<"] {
        if let Some(r) = t.strip_prefix(w) {
            t = r.strip_suffix('>').unwrap_or(r);
        }
    }
    t
}

/// The example's lines of table `name` (`[name]` or `[[name]]`), up to the
/// next table header.
fn section<'a>(lines: &[&'a str], name: &str) -> Vec<&'a str> {
    let headers = [format!("[{name}]"), format!("[[{name}]]")];
    let mut out = Vec::new();
    let mut inside = false;
    for l in lines {
        let t = l.trim();
        if t.starts_with('[') && !t.starts_with("[\"") {
            inside = headers.iter().any(|h| t == h);
            continue;
        }
        if inside {
            out.push(*l);
        }
    }
    out
}

/// Whether `line` sets key `key`, commented out or not, or inside an
/// inline table (`{ ip = …`).
fn sets_key(line: &str, key: &str) -> bool {
    let pat = format!("{key} =");
    line.match_indices(&pat).any(|(at, _)| {
        line[..at].chars().last().map_or(true, |c| {
            c.is_whitespace() || c == '#' || c == '{' || c == ','
        })
    })
}

#[test]
fn every_config_field_is_in_the_example_with_its_default() {
    let text = example();
    let lines: Vec<&str> = text.lines().collect();
    let structs = config_structs();
    let top = structs
        .iter()
        .find(|s| s.name == "Config")
        .expect("config.rs has `pub struct Config`");
    // Which tables each struct's fields may be written in: the top-level
    // field holding it; for a struct held by another, `parent.field`
    // (`[[serve.perf]]`) or inline in the parent (`neighbors = [{ … }]`).
    let mut table_of: Vec<(String, Vec<String>)> = top
        .fields
        .iter()
        .map(|(f, ty)| (inner(ty).to_owned(), vec![f.clone()]))
        .collect();
    for s in &structs {
        let Some(t) = table_of
            .iter()
            .find(|(n, _)| *n == s.name)
            .map(|(_, t)| t[0].clone())
        else {
            continue;
        };
        for (f, ty) in &s.fields {
            if structs.iter().any(|o| o.name == inner(ty)) {
                table_of.push((inner(ty).to_owned(), vec![format!("{t}.{f}"), t.clone()]));
            }
        }
    }

    let mut checked = 0;
    for (field, _) in &top.fields {
        assert!(
            lines
                .iter()
                .any(|l| l.trim() == format!("[{field}]") || l.trim() == format!("[[{field}]]")),
            "deploy/iwarp.toml has no [{field}] table (Config::{field})"
        );
        checked += 1;
    }
    for s in structs.iter().filter(|s| s.name != "Config") {
        let Some(tables) = table_of.iter().find(|(n, _)| *n == s.name).map(|(_, t)| t) else {
            continue; // not part of the configuration file
        };
        let table = &tables[0];
        let body: Vec<&str> = tables.iter().flat_map(|t| section(&lines, t)).collect();
        for (field, ty) in &s.fields {
            // A field holding tables may be written as their headers
            // (`[[serve.perf]]`), else it is a key of the table.
            let headers = [format!("[[{table}.{field}]]"), format!("[{table}.{field}]")];
            let header_at = structs
                .iter()
                .any(|o| o.name == inner(ty))
                .then(|| {
                    lines
                        .iter()
                        .position(|l| headers.iter().any(|h| l.trim() == h))
                })
                .flatten();
            let (text, at): (&[&str], usize) = match header_at {
                Some(at) => (&lines, at),
                None => {
                    let at = body
                        .iter()
                        .position(|l| sets_key(l, field))
                        .unwrap_or_else(|| {
                            panic!(
                                "deploy/iwarp.toml: [{table}] does not mention `{field} =` ({}::{field})",
                                s.name
                            )
                        });
                    (&body, at)
                }
            };
            // Its comment, on the line or in the comment lines just above it,
            // says the default.
            let said = |l: &&str| {
                l.split_once('#')
                    .is_some_and(|(_, c)| c.to_lowercase().contains("default"))
            };
            assert!(
                said(&text[at])
                    || text[..at]
                        .iter()
                        .rev()
                        .take_while(|l| l.trim_start().starts_with('#'))
                        .any(said),
                "deploy/iwarp.toml: `{field}` in [{table}] has no comment with its default above it"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 25,
        "only {checked} fields found in config.rs: the reader is broken"
    );
    println!(
        "deploy/iwarp.toml: {checked} fields of {} config.rs structs present, each with its default",
        structs.len()
    );
}

/// Runs one section of deploy/ops-test.sh and checks it passed.
fn ops_section(section: &str) {
    let out = Command::new("bash")
        .arg(repo().join("deploy/ops-test.sh"))
        .arg(section)
        .env("IWARP_BIN", env!("CARGO_BIN_EXE_iwarp"))
        .output()
        .expect("running deploy/ops-test.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(
        out.status.success(),
        "deploy/ops-test.sh {section}: {}",
        out.status
    );
    assert!(
        !stdout.contains("FAIL:"),
        "deploy/ops-test.sh {section} reported failures"
    );
    let oks = stdout.lines().filter(|l| l.starts_with("ok: ")).count();
    assert!(oks > 0, "deploy/ops-test.sh {section} checked nothing");
    assert!(
        stdout.contains(", 0 failed"),
        "deploy/ops-test.sh {section} did not finish"
    );
}

#[test]
fn ops_systemd_unit() {
    ops_section("unit");
}

#[test]
fn ops_install_script() {
    ops_section("install");
}

#[test]
fn ops_hugepages_script() {
    ops_section("hugepages");
}

#[test]
fn ops_nic_bind_script() {
    ops_section("nicbind");
}

#[test]
fn ops_example_config_under_iwarp_serve() {
    ops_section("serve");
}
