#!/usr/bin/env bash
# Installs the dataplane as a service on a Debian or Ubuntu host: the DPDK
# runtime packages, the `iwarp` binary (built here in release mode, or one
# given), the systemd unit, the example configuration, the state directory,
# and the unit's drop-ins derived from the configuration (CPU affinity; the
# capabilities IOVA-as-PA needs; the control socket's group).
#
# Idempotent: every step compares what is there with what it would put
# there and does nothing when they agree; a second run says "nothing to
# change". An existing /etc/iwarp/iwarp.toml is never overwritten: the new
# example goes next to it as iwarp.toml.example. --dry-run prints each
# action and changes nothing (no apt, no build, no file written).
#
# Host setup that is not installation (hugepages, binding the NIC) is done
# by deploy/hugepages.sh and deploy/nic-bind.sh.
set -euo pipefail

prog=install.sh
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

usage() {
    cat <<EOF
usage: deploy/install.sh [options]

Installs iwarp, its systemd unit and an example configuration.

  --prefix DIR     install the binary as DIR/bin/iwarp (default /usr/local,
                   so /usr/local/bin/iwarp); the unit's ExecStart follows
  --no-build       do not build: install the binary already built in
                   \${CARGO_TARGET_DIR:-target}/release/iwarp
  --binary FILE    install FILE as the binary (implies --no-build)
  --no-deps        do not install system packages
  --root DIR       install under DIR instead of / (staging, packaging);
                   implies --no-deps, runs no systemctl
  --enable         also enable the unit (systemctl enable; not started)
  --dry-run        print every action, change nothing
  -h, --help       this text

After it: deploy/hugepages.sh, deploy/nic-bind.sh, edit /etc/iwarp/iwarp.toml,
then systemctl enable --now iwarp.service.
EOF
}

die() {
    echo "$prog: error: $*" >&2
    exit 1
}
say() { echo "$prog: $*"; }

prefix=/usr/local
build=1
binary=
deps=1
root=
enable=0
dry=0
while [ $# -gt 0 ]; do
    case "$1" in
    --prefix)
        [ $# -ge 2 ] || die "--prefix needs a directory"
        prefix=$2
        shift
        ;;
    --prefix=*) prefix=${1#*=} ;;
    --no-build) build=0 ;;
    --binary)
        [ $# -ge 2 ] || die "--binary needs a file"
        binary=$2
        build=0
        shift
        ;;
    --binary=*)
        binary=${1#*=}
        build=0
        ;;
    --no-deps) deps=0 ;;
    --root)
        [ $# -ge 2 ] || die "--root needs a directory"
        root=$2
        shift
        ;;
    --root=*) root=${1#*=} ;;
    --enable) enable=1 ;;
    --dry-run | -n) dry=1 ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done

case "$prefix" in
/*) ;;
*) die "--prefix must be an absolute path, not '$prefix'" ;;
esac
prefix=${prefix%/}
if [ -n "$root" ]; then
    case "$root" in
    /*) ;;
    *) die "--root must be an absolute path, not '$root'" ;;
    esac
    root=${root%/}
    deps=0
fi

if [ "$dry" -eq 0 ] && [ -z "$root" ] && [ "$(id -u)" -ne 0 ]; then
    die "installing needs root (or --dry-run to see the steps, --root DIR to stage)"
fi

bin_dest="$root$prefix/bin/iwarp"
exec_path="$prefix/bin/iwarp"
unit_dest="$root/etc/systemd/system/iwarp.service"
dropin_dir="$root/etc/systemd/system/iwarp.service.d"
conf_dir="$root/etc/iwarp"
conf_dest="$conf_dir/iwarp.toml"
state_dir="$root/var/lib/iwarp"

changed=0
unit_changed=0
problems=0
[ "$dry" -eq 1 ] && say "dry run: nothing will be changed"

# Runs a command that changes the system, or prints it under --dry-run.
act() {
    changed=1
    if [ "$dry" -eq 1 ]; then
        say "would run: $*"
    else
        say "run: $*"
        "$@"
    fi
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---------------------------------------------------------------------------
# 1. System packages.
runtime_pkgs=(
    dpdk             # dpdk-devbind.py, dpdk-hugepages.py
    librte-meta-all  # the DPDK 22.11 libraries iwarp links to and its PMD plugins
    kmod             # modprobe vfio-pci
    iproute2         # nic-bind.sh inspects addresses and routes
    pciutils         # dpdk-devbind.py lists devices with lspci
    python3          # dpdk-devbind.py; install.sh reads the configuration
)
build_pkgs=(
    libdpdk-dev      # headers and pkg-config file of DPDK
    clang libclang-dev # bindgen parses DPDK's headers with libclang
    pkg-config       # the build finds DPDK with it
    gcc libc6-dev    # the linker cargo drives
)

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

if [ "$deps" -eq 1 ]; then
    if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
        die "not a Debian or Ubuntu system (no apt-get): install DPDK 22.11, clang, libclang and pkg-config yourself, then rerun with --no-deps"
    fi
    want=("${runtime_pkgs[@]}")
    [ "$build" -eq 1 ] && want+=("${build_pkgs[@]}")
    missing=()
    for p in "${want[@]}"; do
        installed "$p" || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        say "packages: all ${#want[@]} present"
    else
        say "packages: missing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        act apt-get update -qq
        act apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
else
    say "packages: skipped (--no-deps or --root)"
fi

# ---------------------------------------------------------------------------
# 2. The binary.
target_dir=${CARGO_TARGET_DIR:-$repo/target}
case "$target_dir" in
/*) ;;
*) target_dir="$repo/$target_dir" ;;
esac
if [ "$build" -eq 1 ]; then
    cargo=$(command -v cargo || true)
    builder=
    if [ -z "$cargo" ] && [ -x "${HOME:-/nonexistent}/.cargo/bin/cargo" ]; then
        cargo="$HOME/.cargo/bin/cargo"
    fi
    # Under sudo, build as the calling user: the target directory stays
    # theirs, and their toolchain is the one found.
    if [ "$(id -u)" -eq 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
        user_home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
        if [ -x "$user_home/.cargo/bin/cargo" ]; then
            cargo="$user_home/.cargo/bin/cargo"
            builder=$SUDO_USER
        fi
    fi
    no_cargo="cargo not found: install a Rust toolchain (https://rustup.rs, Rust 1.80 or later), or build elsewhere and pass --binary FILE"
    if [ -z "$cargo" ]; then
        [ "$dry" -eq 1 ] || die "$no_cargo"
        # A dry run goes on, to show the rest; the real run would stop here.
        say "problem: $no_cargo"
        problems=$((problems + 1))
        cargo=cargo
    fi
    cmd=("$cargo" build --release --locked -p iwarp)
    if [ "$dry" -eq 1 ]; then
        say "would run (in $repo): ${builder:+runuser -u $builder -- }CARGO_TARGET_DIR=$target_dir ${cmd[*]}"
    else
        say "building: ${cmd[*]} (in $repo)"
        if [ -n "$builder" ]; then
            (cd "$repo" && runuser -u "$builder" -- env "PATH=$(dirname "$cargo"):$PATH" "CARGO_TARGET_DIR=$target_dir" "${cmd[@]}") ||
                die "the build failed (see cargo's messages above)"
        else
            (cd "$repo" && CARGO_TARGET_DIR=$target_dir "${cmd[@]}") ||
                die "the build failed (see cargo's messages above)"
        fi
    fi
fi
if [ -z "$binary" ]; then
    binary="$target_dir/release/iwarp"
fi

# Installs SRC as DEST with MODE unless DEST already has that content and mode.
install_file() {
    local src=$1 dest=$2 mode=$3
    if [ -f "$dest" ] && cmp -s "$src" "$dest" &&
        [ "$(stat -c %a "$dest")" = "${mode#0}" ]; then
        say "unchanged: $dest"
        return 1
    fi
    act install -D -m "$mode" "$src" "$dest"
    return 0
}

bin_changed=0
if [ -f "$binary" ]; then
    if install_file "$binary" "$bin_dest" 0755; then bin_changed=1; fi
elif [ "$dry" -eq 1 ] && [ "$build" -eq 1 ]; then
    changed=1
    say "would run: install -D -m 0755 $binary $bin_dest (once built)"
else
    die "no binary at $binary: build it (cargo build --release -p iwarp), drop --no-build, or give --binary FILE"
fi

# ---------------------------------------------------------------------------
# 3. The unit, pointing at the installed binary.
sed "s#^ExecStart=/usr/local/bin/iwarp #ExecStart=$exec_path #" "$here/iwarp.service" >"$tmp/iwarp.service"
grep -q "^ExecStart=$exec_path serve " "$tmp/iwarp.service" ||
    die "deploy/iwarp.service has no 'ExecStart=/usr/local/bin/iwarp serve' line to point at $exec_path"
if install_file "$tmp/iwarp.service" "$unit_dest" 0644; then unit_changed=1; fi

# ---------------------------------------------------------------------------
# 4. Configuration and state directories.
ensure_dir() {
    local dir=$1 mode=$2
    if [ -d "$dir" ] && [ "$(stat -c %a "$dir")" = "${mode#0}" ]; then
        say "unchanged: $dir/"
    else
        act install -d -m "$mode" "$dir"
    fi
}
ensure_dir "$conf_dir" 0755
ensure_dir "$state_dir" 0750

# The configuration the service will read (for the drop-ins below).
if [ ! -e "$conf_dest" ]; then
    install_file "$here/iwarp.toml" "$conf_dest" 0644 || true
    effective_conf="$here/iwarp.toml"
elif cmp -s "$here/iwarp.toml" "$conf_dest"; then
    say "unchanged: $conf_dest"
    effective_conf=$conf_dest
else
    say "kept: $conf_dest (yours, left as it is)"
    if install_file "$here/iwarp.toml" "$conf_dir/iwarp.toml.example" 0644; then
        say "the new example is $conf_dir/iwarp.toml.example: compare it with yours"
    fi
    effective_conf=$conf_dest
fi

# ---------------------------------------------------------------------------
# 5. Drop-ins derived from the configuration: CPUAffinity= (systemd cannot
#    take it from an environment file), SupplementaryGroups= for
#    serve.socket_group, and for IOVA-as-PA the two extra capabilities (see
#    the unit's comments).
read_conf() {
    python3 - "$1" <<'EOF'
import sys
try:
    import tomllib
except ImportError:  # Python before 3.11 (Ubuntu 22.04): the same API
    try:
        import tomli as tomllib
    except ImportError:
        print("error=python3 before 3.11 without the tomli module (apt-get install python3-tomli)")
        sys.exit(0)
path = sys.argv[1]
try:
    with open(path, "rb") as f:
        conf = tomllib.load(f)
except (OSError, tomllib.TOMLDecodeError) as e:
    print(f"error={e}".replace("\n", " "))
    sys.exit(0)
def expand(spec):
    out = []
    for part in str(spec).split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out
args = [str(a) for a in conf.get("eal", {}).get("args", [])]
cpus, note = [], ""
for i, a in enumerate(args):
    spec = None
    if a in ("-l", "--lcores") and i + 1 < len(args):
        spec = args[i + 1]
    elif a.startswith("--lcores="):
        spec = a.split("=", 1)[1]
    elif a.startswith("-l") and len(a) > 2:
        spec = a[2:]
    elif a == "-c" or a.startswith("--coremask"):
        note = "EAL's -c core mask is not read: list the cores with -l"
    if spec is not None:
        try:
            cpus.extend(expand(spec))
        except ValueError:
            note = f"EAL lcores '{spec}' not understood: only lists and ranges are read"
try:
    cores = [int(c) for c in conf.get("workers", {}).get("cores", [])]
except (TypeError, ValueError):
    cores, note = [], "workers.cores is not a list of numbers"
cpus = sorted(set(cpus + cores)) if cores else []
pa = any(a == "--iova-mode=pa" for a in args) or any(
    a == "--iova-mode" and i + 1 < len(args) and args[i + 1] == "pa" for i, a in enumerate(args))
group = conf.get("serve", {}).get("socket_group", "")
print("group=" + (group if isinstance(group, str) else ""))
print("cpus=" + " ".join(map(str, cpus)))
print("iova_pa=" + ("1" if pa else "0"))
print("note=" + note)
EOF
}

# Puts CONTENT in the drop-in NAME, or removes NAME when CONTENT is empty.
dropin() {
    local name=$1 content=$2 dest="$dropin_dir/$1"
    if [ -z "$content" ]; then
        if [ -e "$dest" ]; then
            act rm -f "$dest"
            unit_changed=1
        else
            say "unchanged: $dest not needed"
        fi
        return
    fi
    printf '%s\n' "$content" >"$tmp/$name"
    if install_file "$tmp/$name" "$dest" 0644; then unit_changed=1; fi
}

if ! command -v python3 >/dev/null; then
    say "warning: python3 missing: the CPU affinity and IOVA-as-PA drop-ins are not written"
else
    facts=$(read_conf "$effective_conf" 2>&1) || facts="error=python3 failed: ${facts//$'\n'/ }"
    err=$(sed -n 's/^error=//p' <<<"$facts")
    if [ -n "$err" ]; then
        say "warning: cannot read $effective_conf ($err): drop-ins left as they are"
    else
        cpus=$(sed -n 's/^cpus=//p' <<<"$facts")
        iova_pa=$(sed -n 's/^iova_pa=//p' <<<"$facts")
        note=$(sed -n 's/^note=//p' <<<"$facts")
        [ -n "$note" ] && say "warning: $note"
        header="# Written by deploy/install.sh from $(basename "$effective_conf"); re-run it after editing the configuration."
        if [ -n "$cpus" ]; then
            say "CPU affinity from the configuration: $cpus"
            dropin cpu-affinity.conf "$header
[Service]
CPUAffinity=$cpus"
        else
            say "CPU affinity: workers.cores is empty, the service may run on every core"
            dropin cpu-affinity.conf ""
        fi
        group=$(sed -n 's/^group=//p' <<<"$facts")
        if [ -n "$group" ]; then
            # The service chowns the control socket to this group: as root
            # without CAP_CHOWN it may do so only for a group it is in.
            if ! [[ "$group" =~ ^[a-z_][a-z0-9_-]*$ ]]; then
                say "warning: serve.socket_group '$group' is not a valid group name: no drop-in written"
            else
                if [ -n "$root" ]; then
                    say "serve.socket_group $group: create the group on the target host (groupadd --system $group)"
                elif getent group "$group" >/dev/null; then
                    say "unchanged: group $group exists"
                else
                    act groupadd --system "$group"
                fi
                dropin socket-group.conf "$header
# serve.socket_group: the service may give the control socket to this group.
[Service]
SupplementaryGroups=$group"
            fi
        else
            dropin socket-group.conf ""
        fi
        if [ "$iova_pa" = 1 ]; then
            say "eal.args has --iova-mode=pa: granting CAP_SYS_ADMIN and CAP_SYS_RAWIO"
            dropin iova-pa.conf "$header
# IOVA-as-PA: physical page numbers from /proc/self/pagemap (CAP_SYS_ADMIN)
# and VFIO's no-IOMMU groups (CAP_SYS_RAWIO).
[Service]
CapabilityBoundingSet=CAP_SYS_ADMIN CAP_SYS_RAWIO
AmbientCapabilities=CAP_SYS_ADMIN CAP_SYS_RAWIO"
        else
            dropin iova-pa.conf ""
        fi
    fi
fi

# ---------------------------------------------------------------------------
# 6. systemd.
if [ -n "$root" ]; then
    say "systemctl: skipped (--root)"
elif [ ! -d /run/systemd/system ]; then
    say "systemctl: systemd is not running here; the unit is used at the next boot"
else
    if [ "$unit_changed" -eq 1 ]; then
        act systemctl daemon-reload
    fi
    if [ $((bin_changed + unit_changed)) -gt 0 ] && systemctl is-active --quiet iwarp.service 2>/dev/null; then
        say "iwarp.service is running the previous version: systemctl restart iwarp.service (not done here)"
    fi
    if [ "$enable" -eq 1 ]; then
        if systemctl is-enabled --quiet iwarp.service 2>/dev/null; then
            say "unchanged: iwarp.service is enabled"
        else
            act systemctl enable iwarp.service
        fi
    fi
fi

if [ "$changed" -eq 0 ]; then
    say "nothing to change: everything is installed and up to date"
elif [ "$dry" -eq 1 ]; then
    if [ "$problems" -gt 0 ]; then
        say "dry run done: the actions above were not taken; $problems problem(s) above would stop the real run"
    else
        say "dry run done: the actions above were not taken"
    fi
else
    say "installed. Next: deploy/hugepages.sh --count 256, deploy/nic-bind.sh bind <PCI>, edit $conf_dest, systemctl enable --now iwarp.service"
fi
