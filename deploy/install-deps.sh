#!/usr/bin/env bash
# Installs the system packages the project builds and tests with (Debian 12):
# DPDK 22.11 and what bindgen needs to read its headers, plus the network
# tools the integration tests drive. Idempotent: installs only what is
# missing, and does nothing when everything is there.
#
# As root it installs with apt-get; as any other user it names the missing
# packages and exits 1.
set -euo pipefail

pkgs=(
    dpdk-dev libdpdk-dev   # DPDK 22.11 LTS: headers, libraries, PMD plugins
    clang libclang-dev     # bindgen loads libclang to parse DPDK's headers
    pkg-config             # build.rs finds DPDK with it
    iproute2               # ip netns / ip link for the veth tests
    ethtool                # turning the kernel side's offloads off
    iputils-ping           # the kernel pings the dataplane
    tshark                 # decodes the dataplane's packet captures as iWARP
)

missing=()
for p in "${pkgs[@]}"; do
    # `dpkg -s` also lists removed-but-configured packages: check the status.
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps.sh: missing packages: ${missing[*]}" >&2
    echo "install them as root with: apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi

echo "install-deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# tshark's package asks whether non-root users may capture: answer no
# beforehand (the tests only read files).
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
# A fresh machine has no package lists; an old list may name gone versions.
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps.sh: done" >&2
