#!/usr/bin/env bash
# Hands a NIC port to DPDK (binds it to vfio-pci, through DPDK's
# dpdk-devbind.py) and gives it back to its kernel driver.
#
# Binding takes the port away from the kernel with its addresses and
# routes, so it refuses a port whose interface holds an IPv4 address, a
# global IPv6 address, or carries a default route, unless --force: that is
# how one loses the SSH session to a host. The kernel driver the port had
# is remembered in /var/lib/iwarp/nic-bind/<PCI address>, so `unbind`
# restores it. Loads the vfio-pci module when needed and warns when the
# host has no IOMMU.
set -euo pipefail

prog=nic-bind.sh
# Test hooks: a fake sysfs tree, another state directory, a devbind path.
sys=${NIC_BIND_SYSFS:-/sys}
state_dir=${NIC_BIND_STATE_DIR:-/var/lib/iwarp/nic-bind}

usage() {
    cat <<EOF
usage: deploy/nic-bind.sh [--dry-run] --status
       deploy/nic-bind.sh [--dry-run] bind PCI|IFACE [--driver vfio-pci] [--force]
       deploy/nic-bind.sh [--dry-run] unbind PCI [--driver DRIVER]

  --status         network devices and their drivers (dpdk-devbind.py
                   --status-dev net), and the ports this script bound
  bind TARGET      bind the port (PCI address like 0000:01:00.0, or an
                   interface name) to --driver (default vfio-pci); refuses
                   an interface with an IPv4 / global IPv6 address or a
                   default route unless --force
  unbind PCI       give the port back to the kernel driver it had before
                   bind (or to --driver DRIVER)
  --dry-run        print what would be done (the dpdk-devbind.py command
                   included), change nothing

dpdk-devbind.py comes with the 'dpdk' package; set DPDK_DEVBIND=PATH to use
another copy. Records: $state_dir/<PCI>.
EOF
}

die() {
    echo "$prog: error: $*" >&2
    exit 1
}
say() { echo "$prog: $*"; }

dry=0
force=0
driver=
action=
target=
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run | -n) dry=1 ;;
    --force) force=1 ;;
    --driver)
        [ $# -ge 2 ] || die "--driver needs a driver name"
        driver=$2
        shift
        ;;
    --driver=*) driver=${1#*=} ;;
    --status | status) action=status ;;
    bind | unbind)
        [ -z "$action" ] || die "give one action"
        action=$1
        [ $# -ge 2 ] || die "$1 needs a PCI address or an interface name"
        target=$2
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done
[ -n "$action" ] || die "nothing to do: give --status, bind or unbind (see --help)"
case "$driver" in
"" | *[!a-zA-Z0-9_-]*)
    [ -z "$driver" ] || die "'$driver' is not a driver name"
    ;;
esac

find_devbind() {
    local c
    if [ -n "${DPDK_DEVBIND:-}" ]; then
        [ -x "$DPDK_DEVBIND" ] || die "DPDK_DEVBIND=$DPDK_DEVBIND is not an executable"
        echo "$DPDK_DEVBIND"
        return 0
    fi
    for c in dpdk-devbind.py dpdk-devbind; do
        if command -v "$c" >/dev/null; then
            command -v "$c"
            return 0
        fi
    done
    for c in /usr/share/dpdk/usertools/dpdk-devbind.py /usr/sbin/dpdk-devbind.py \
        /usr/sbin/dpdk-devbind /usr/bin/dpdk-devbind.py /usr/local/bin/dpdk-devbind.py; do
        if [ -x "$c" ]; then
            echo "$c"
            return 0
        fi
    done
    return 1
}
devbind=$(find_devbind || true)
no_devbind="dpdk-devbind.py not found (in PATH, /usr/share/dpdk/usertools, /usr/sbin): apt-get install dpdk, or set DPDK_DEVBIND"

# Runs a command that changes the system, or prints it under --dry-run.
act() {
    if [ "$dry" -eq 1 ]; then
        say "would run: $*"
    else
        say "run: $*"
        "$@"
    fi
}
# Runs dpdk-devbind.py with ARGS, or prints it.
devbind_run() {
    if [ -n "$devbind" ]; then
        act "$devbind" "$@"
    elif [ "$dry" -eq 1 ]; then
        say "would run: dpdk-devbind.py $* (not installed here: apt-get install dpdk)"
    else
        die "$no_devbind"
    fi
}

# "0000:01:00.0" for "01:00.0" or "0000:01:00.0"; empty when not a PCI address.
pci_of() {
    local a=${1,,}
    if [[ "$a" =~ ^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$ ]]; then
        echo "$a"
    elif [[ "$a" =~ ^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$ ]]; then
        echo "0000:$a"
    fi
}
driver_of() { # PCI -> its driver, or "none"
    local l
    l=$(readlink "$sys/bus/pci/devices/$1/driver" 2>/dev/null || true)
    if [ -n "$l" ]; then basename "$l"; else echo none; fi
}
is_dpdk_driver() {
    case "$1" in vfio-pci | uio_pci_generic | igb_uio) return 0 ;; *) return 1 ;; esac
}

# Why IFACE must not be taken, from its facts: ADDRS is `ip -o addr show
# dev IFACE`, ROUTES is `ip route show default` for both families. Prints
# one reason per line; nothing when it may be taken.
refusal() {
    local ifc=$1 addrs=$2 routes=$3 fam addr scope
    while read -r _ _ fam addr rest; do
        [ -n "${fam:-}" ] || continue
        scope=$(awk '{ for (i = 1; i < NF; i++) if ($i == "scope") { print $(i + 1); exit } }' <<<"$rest")
        case "$fam" in
        inet) echo "$ifc has the IPv4 address $addr" ;;
        inet6) [ "$scope" = link ] || echo "$ifc has the IPv6 address $addr (scope ${scope:-?})" ;;
        esac
    done <<<"$addrs"
    if grep -Eq "(^|[[:space:]])dev $ifc([[:space:]]|$)" <<<"$routes"; then
        echo "$ifc carries a default route"
    fi
}
iface_refusal() {
    local ifc=$1 addrs routes
    addrs=$(ip -o addr show dev "$ifc" 2>/dev/null || true)
    routes=$( (ip -4 route show default; ip -6 route show default) 2>/dev/null || true)
    refusal "$ifc" "$addrs" "$routes"
}
check_ifaces() { # IFACE...: refuses unless --force
    local ifc why all=
    for ifc in "$@"; do
        why=$(iface_refusal "$ifc")
        [ -n "$why" ] && all+="$why"$'\n'
    done
    [ -z "$all" ] && return 0
    if [ "$force" -eq 1 ]; then
        while IFS= read -r l; do [ -n "$l" ] && say "warning: $l (--force: binding anyway)"; done <<<"$all"
        return 0
    fi
    while IFS= read -r l; do [ -n "$l" ] && echo "$prog: refused: $l" >&2; done <<<"$all"
    die "binding would take these away from the kernel (and maybe your session): remove the addresses and routes first, or give --force"
}

# The PCI function under IFACE's device, walking up from it (a virtio-net
# interface hangs off virtioN, itself under the PCI function); empty if none.
pci_of_iface() {
    local d
    d=$(readlink -f "$sys/class/net/$1/device" 2>/dev/null || true)
    while [ -n "$d" ] && [ "$d" != / ] && [ "$d" != "$sys" ] && [ -d "$d" ]; do
        if [ "$(basename "$(readlink -f "$d/subsystem" 2>/dev/null || echo x)")" = pci ] &&
            [ -n "$(pci_of "$(basename "$d")")" ]; then
            basename "$d"
            return 0
        fi
        d=$(dirname "$d")
    done
}
# Every interface whose device is PCI or below it (one per line).
ifaces_of() {
    local n
    for n in "$sys"/class/net/*; do
        [ -e "$n" ] || continue
        [ "$(pci_of_iface "$(basename "$n")")" = "$1" ] && basename "$n"
    done
    return 0
}

# ---------------------------------------------------------------------------
do_status() {
    if [ -n "$devbind" ]; then
        "$devbind" --status-dev net
    else
        say "$no_devbind"
        say "network devices from sysfs (PCI address, driver, interfaces):"
        local d class pci n
        for d in "$sys"/bus/pci/devices/*; do
            [ -e "$d" ] || continue
            class=$(cat "$d/class" 2>/dev/null || echo)
            [[ "$class" == 0x02* ]] || continue
            pci=$(basename "$d")
            n=$(ifaces_of "$pci" | tr '\n' ' ')
            echo "  $pci driver=$(driver_of "$pci") ${n:+if=$n}"
        done
    fi
    local f
    say "bound by this script (original drivers, in $state_dir):"
    for f in "$state_dir"/*; do
        [ -f "$f" ] || { echo "  none"; break; }
        echo "  $(basename "$f"): $(tr '\n' ' ' <"$f") now $(driver_of "$(basename "$f")")"
    done
}

do_bind() {
    local want=${driver:-vfio-pci} pci ifaces=() ifc cur
    pci=$(pci_of "$target")
    if [ -n "$pci" ]; then
        [ -d "$sys/bus/pci/devices/$pci" ] || die "no PCI device $pci"
    else
        ifc=$target
        [ -e "$sys/class/net/$ifc" ] || die "no network interface '$ifc' (and not a PCI address)"
        [ "$ifc" != lo ] || die "lo is not a NIC"
        # Refuse before anything else, even for a port that is not PCI.
        check_ifaces "$ifc"
        pci=$(pci_of_iface "$ifc")
        [ -n "$pci" ] || die "$ifc is not a PCI device (a virtual interface? use net_af_packet on it instead)"
    fi
    mapfile -t ifaces < <(ifaces_of "$pci")
    [ ${#ifaces[@]} -gt 0 ] && check_ifaces "${ifaces[@]}"
    cur=$(driver_of "$pci")
    say "$pci: driver $cur${ifaces[*]:+, interface ${ifaces[*]}}"
    if [ "$cur" = "$want" ]; then
        say "unchanged: $pci is already bound to $want"
        return 0
    fi
    if [ "$dry" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
        die "binding needs root (or --dry-run to see the steps)"
    fi

    # Remember the kernel driver, so unbind can give the port back.
    if ! is_dpdk_driver "$cur"; then
        if [ "$dry" -eq 1 ]; then
            say "would record the original driver $cur in $state_dir/$pci"
        else
            mkdir -p "$state_dir"
            printf 'driver=%s\nifaces=%s\n' "$cur" "${ifaces[*]}" >"$state_dir/$pci"
            say "recorded the original driver $cur in $state_dir/$pci"
        fi
    fi

    local mod=${want//-/_}
    if [ ! -d "$sys/bus/pci/drivers/$want" ] && [ ! -d "$sys/module/$mod" ]; then
        act modprobe "$want"
    fi
    if [ "$want" = vfio-pci ] && [ -z "$(ls -A "$sys/kernel/iommu_groups" 2>/dev/null)" ]; then
        say "warning: no IOMMU groups: turn the IOMMU on (intel_iommu=on iommu=pt on the kernel command line) or use VFIO's no-IOMMU mode (echo 1 > /sys/module/vfio/parameters/enable_unsafe_noiommu_mode), which needs --iova-mode=pa (see deploy/iwarp.service)"
    fi

    local args=()
    [ "$force" -eq 1 ] && args+=(--force)
    devbind_run "${args[@]}" "--bind=$want" "$pci"
    if [ "$dry" -eq 0 ]; then
        cur=$(driver_of "$pci")
        [ "$cur" = "$want" ] || die "$pci is bound to $cur after dpdk-devbind.py, not $want (see its messages above)"
        say "bound: $pci to $want (deploy/nic-bind.sh unbind $pci gives it back)"
    fi
}

do_unbind() {
    local pci orig cur
    pci=$(pci_of "$target")
    [ -n "$pci" ] || die "unbind needs a PCI address (like 0000:01:00.0), not '$target'"
    [ -d "$sys/bus/pci/devices/$pci" ] || die "no PCI device $pci"
    if [ -n "$driver" ]; then
        orig=$driver
    elif [ -f "$state_dir/$pci" ]; then
        orig=$(sed -n 's/^driver=//p' "$state_dir/$pci")
    else
        die "no record of $pci's original driver in $state_dir: name it, as in unbind $pci --driver ixgbe"
    fi
    [ -n "$orig" ] || die "the record $state_dir/$pci names no driver: give --driver"
    cur=$(driver_of "$pci")
    if [ "$cur" = "$orig" ]; then
        say "unchanged: $pci is already bound to $orig"
    else
        if [ "$dry" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
            die "unbinding needs root (or --dry-run to see the steps)"
        fi
        if [ "$orig" = none ]; then
            devbind_run -u "$pci"
        else
            devbind_run "--bind=$orig" "$pci"
        fi
        if [ "$dry" -eq 0 ]; then
            cur=$(driver_of "$pci")
            [ "$cur" = "$orig" ] || die "$pci is bound to $cur after dpdk-devbind.py, not $orig"
            say "gave $pci back to $orig"
        fi
    fi
    if [ -f "$state_dir/$pci" ]; then
        if [ "$dry" -eq 1 ]; then say "would remove $state_dir/$pci"; else rm -f "$state_dir/$pci"; fi
    fi
    return 0
}

[ "$dry" -eq 1 ] && say "dry run: nothing will be changed"
case "$action" in
status) do_status ;;
bind) do_bind ;;
unbind) do_unbind ;;
esac
