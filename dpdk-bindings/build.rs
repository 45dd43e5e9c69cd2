//! Finds the system DPDK with pkg-config, generates the FFI bindings with
//! bindgen and compiles the C shim for DPDK's `static inline` fast path.
//!
//! The raw `pkg-config --cflags libdpdk` string goes to both bindgen and the C
//! compiler unchanged: it carries `-include rte_config.h` and an `-march`
//! flag that DPDK's headers need, and that the `pkg-config` crate would drop.
//! Libraries are linked dynamically as pkg-config lists them; poll-mode
//! drivers are plugins that EAL loads from the system directory at start.

use std::env;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The one line a user sees when DPDK is missing, naming what to install.
const INSTALL_HINT: &str =
    "DPDK not found: install it with 'apt-get install -y dpdk-dev libdpdk-dev \
     clang libclang-dev pkg-config' (or run deploy/install-deps.sh)";

/// The line shown when bindgen cannot load libclang.
const LIBCLANG_HINT: &str =
    "libclang not found (bindgen reads DPDK's headers with it): install it \
     with 'apt-get install -y clang libclang-dev' (or run deploy/install-deps.sh)";

fn main() -> ExitCode {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/shim.h");
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");

    let Some(cflags) = pkg_config(&["--cflags", "libdpdk"]) else {
        return fail(INSTALL_HINT);
    };
    let Some(libs) = pkg_config(&["--libs", "libdpdk"]) else {
        return fail(INSTALL_HINT);
    };
    let libdir = pkg_config(&["--variable=libdir", "libdpdk"]).unwrap_or_default();
    let version = pkg_config(&["--modversion", "libdpdk"]).unwrap_or_default();
    let cflags: Vec<String> = cflags.split_whitespace().map(str::to_owned).collect();

    link(&libs, libdir.trim());

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // bindgen panics when it cannot load libclang: catch that too, so that
    // the one-line hint (which names libclang's package) is what shows.
    let generated = std::panic::catch_unwind(|| generate_bindings(&cflags, &out));
    match generated {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return fail(&format!("bindgen failed on DPDK's headers: {e}")),
        Err(_) => return fail(LIBCLANG_HINT),
    }

    let mut build = cc::Build::new();
    build.file("src/shim.c").include("src");
    for flag in &cflags {
        build.flag(flag);
    }
    // DPDK's headers trip a few of the compiler's extra warnings; the shim
    // itself is small enough to read.
    build.warnings(false);
    build.compile("iwarp_dpdk_shim");

    println!("cargo:version={}", version.trim());
    println!("cargo:rustc-env=IWARP_DPDK_VERSION={}", version.trim());
    ExitCode::SUCCESS
}

/// Runs the `pkg-config` binary; `None` when it or libdpdk is missing.
fn pkg_config(args: &[&str]) -> Option<String> {
    let pkg_config = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_owned());
    let out = Command::new(pkg_config).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok()
}

/// Prints the one-line error so that it stands out in cargo's output, then
/// fails the build script.
fn fail(msg: &str) -> ExitCode {
    println!("cargo:warning=error: {msg}");
    eprintln!("error: {msg}");
    ExitCode::FAILURE
}

/// Turns `pkg-config --libs` output into cargo link directives: `-L` into
/// search paths, `-l` into dynamic libraries, anything else to the linker.
fn link(libs: &str, libdir: &str) {
    for tok in libs.split_whitespace() {
        if let Some(dir) = tok.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = tok.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={lib}");
        } else {
            println!("cargo:rustc-link-arg={tok}");
        }
    }
    // `Port::ring_pair` calls `rte_eth_from_rings`, which lives in the ring
    // PMD rather than in a library that libdpdk.pc lists. It is the same file
    // that EAL loads as a plugin, so the driver registers once.
    let ring_pmd = PathBuf::from(libdir).join("librte_net_ring.so");
    if libdir.is_empty() || ring_pmd.exists() {
        if !libdir.is_empty() {
            println!("cargo:rustc-link-search=native={libdir}");
        }
        println!("cargo:rustc-link-lib=dylib=rte_net_ring");
    }
}

fn generate_bindings(cflags: &[String], out: &std::path::Path) -> Result<(), String> {
    let bindings = bindgen::Builder::default()
        .header("src/shim.h")
        .clang_args(cflags)
        .clang_arg("-Isrc")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .allowlist_function("rte_.*")
        .allowlist_function("shim_.*")
        .allowlist_type("rte_.*")
        .allowlist_var("RTE_.*|RING_F_.*|SHIM_.*")
        // Packed structs with aligned members: deriving on them does not
        // compile, and nothing here reads them through these types.
        .opaque_type("rte_arp_ipv4")
        .opaque_type("rte_arp_hdr")
        .opaque_type("rte_l2tpv2_combined_msg_hdr")
        .opaque_type("rte_gtp_psc_generic_hdr")
        // The fast-path inline functions are reached through the shim; their
        // would-be external symbols do not exist.
        .generate_inline_functions(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .prepend_enum_name(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .generate()
        .map_err(|e| e.to_string())?;
    bindings
        .write_to_file(out.join("bindings.rs"))
        .map_err(|e| e.to_string())
}
