#!/usr/bin/env bash
# Runs the project's tests: installs what is missing (as root, Debian 12),
# then the whole workspace under cargo-nextest, which runs every test in a
# process of its own (tests that start DPDK's EAL need that).
#
# Tests that need root (network namespaces, veth pairs, raw sockets) create
# what they use and remove it themselves; with IWARP_REQUIRE_ROOT_TESTS=1
# (set here when running as root) they fail instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v ip >/dev/null || need_pkgs+=(iproute2)
command -v ethtool >/dev/null || need_pkgs+=(ethtool)
# The kernel-interop test pings our engine from inside its namespace.
command -v ping >/dev/null || need_pkgs+=(iputils-ping)
command -v pkg-config >/dev/null || need_pkgs+=(pkg-config)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "test.sh: missing ${need_pkgs[*]}; run as root or install them" >&2
        exit 1
    fi
    echo "test.sh: installing ${need_pkgs[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

if ! command -v cargo-nextest >/dev/null && ! cargo nextest --version >/dev/null 2>&1; then
    echo "test.sh: installing cargo-nextest" >&2
    cargo install --locked cargo-nextest
fi

if [ "$(id -u)" -eq 0 ]; then
    export IWARP_REQUIRE_ROOT_TESTS=1
fi

exec cargo nextest run --workspace --release --no-fail-fast "$@"
