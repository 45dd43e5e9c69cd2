#!/usr/bin/env bash
# Installs what the siw interop suite needs on the host (Debian 12): QEMU
# for the guest, debootstrap to build its image, tcpdump and tshark for the
# captures and their checks, and the tools the rig scripts call.
# Idempotent: installs only what is missing. Root only.
set -euo pipefail

pkgs=(qemu-system-x86 debootstrap tshark tcpdump iproute2 ethtool iputils-ping kmod bc util-linux)
missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "interop/install-deps.sh: missing packages: ${missing[*]} (run as root)" >&2
    exit 1
fi
echo "interop/install-deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
