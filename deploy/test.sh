#!/usr/bin/env bash
# Runs the project's tests: installs what is missing (as root, Debian 12),
# then the whole workspace under cargo-nextest, which runs every test in a
# process of its own (tests that start DPDK's EAL need that). The tests
# build in the `tests` profile: release optimisation without the release
# profile's whole-program LTO (Cargo.toml), into target/tests.
#
# Tests that need root (network namespaces, veth pairs, raw sockets) create
# what they use and remove it themselves. As root they run with
# IWARP_REQUIRE_ROOT_TESTS=1, so that one that cannot set up fails; as
# another user they are left out by a filter (ROOT_TESTS below), which
# nextest reports as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/install-deps.sh

if ! command -v cargo-nextest >/dev/null && ! cargo nextest --version >/dev/null 2>&1; then
    echo "test.sh: installing cargo-nextest" >&2
    cargo install --locked cargo-nextest
fi

# The tests that need root: whole test binaries that talk to the kernel
# over namespaces, veths, raw and AF_XDP sockets; tests named *_over_veth
# or *_over_af_packet (the `iwarp` tool as two processes on a veth pair);
# and the hugepage test. A new root-only test joins one of these.
ROOT_TESTS='binary(kernel_tcp) | binary(dpdk_kernel) | binary(dpdk_afpacket) | binary(dpdk_afxdp) | binary(dpdk_tap)
    | binary(afxdp_port) | test(/_over_veth$/) | test(/_over_af_packet$/)
    | test(=registered_hugepage_regions_over_net_ring)'

if [ "$(id -u)" -eq 0 ]; then
    export IWARP_REQUIRE_ROOT_TESTS=1
    exec cargo nextest run --workspace --cargo-profile tests --no-fail-fast "$@"
fi
# Not root: nextest counts the root-only tests as skipped.
echo "test.sh: not root: the tests that need root are skipped" >&2
exec cargo nextest run --workspace --cargo-profile tests --no-fail-fast -E "not ($ROOT_TESTS)" "$@"
