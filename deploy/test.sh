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

deploy/install-deps.sh

if ! command -v cargo-nextest >/dev/null && ! cargo nextest --version >/dev/null 2>&1; then
    echo "test.sh: installing cargo-nextest" >&2
    cargo install --locked cargo-nextest
fi

if [ "$(id -u)" -eq 0 ]; then
    export IWARP_REQUIRE_ROOT_TESTS=1
fi

exec cargo nextest run --workspace --release --no-fail-fast "$@"
