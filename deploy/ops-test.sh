#!/usr/bin/env bash
# Checks the operations material under deploy/: the systemd unit
# (systemd-analyze verify, with and without install.sh's drop-ins),
# install.sh (--dry-run changes nothing on this machine; a staged install
# under a temporary root is idempotent and keeps an edited configuration),
# hugepages.sh (--status, --dry-run, a refused count, a real reservation
# restored afterwards) and nic-bind.sh (refusal of interfaces with
# addresses or the default route, on dummy interfaces in a network
# namespace of its own; dry-run and stubbed bind/unbind on a fake sysfs).
# Never touches a real NIC: binding only ever runs against the fake sysfs.
#
# With IWARP_BIN, the example configuration also runs under `iwarp serve`
# (on a virtual device): responders, control socket, metrics, SIGTERM.
#
# usage: deploy/ops-test.sh [unit|install|hugepages|nicbind|serve]...  (default: all)
#
# Prints one "ok:" line per check, "skip:" for what needs root when not root
# (a failure instead with IWARP_REQUIRE_ROOT_TESTS=1), "FAIL:" lines and
# exit status 1 when a check fails. IWARP_BIN names an iwarp binary to
# point the unit at (dataplane/cli/tests/deploy_scripts.rs passes the one it
# built); without it a copy of /bin/true stands in, since verify only needs
# ExecStart to exist. IWARP_OPS_REAL_HUGEPAGES=1 (root) also resizes the
# real 2 MiB pool by two pages and back.
set -euo pipefail
cd "$(dirname "$0")/.."

fails=0
checks=0
ok() {
    checks=$((checks + 1))
    echo "ok: $*"
}
fail() {
    checks=$((checks + 1))
    fails=$((fails + 1))
    echo "FAIL: $*"
}
skip() {
    if [ "${IWARP_REQUIRE_ROOT_TESTS:-}" = 1 ]; then
        fail "$* (IWARP_REQUIRE_ROOT_TESTS=1)"
    else
        echo "skip: $*"
    fi
}
is_root() { [ "$(id -u)" -eq 0 ]; }
indent() { while IFS= read -r l; do echo "    $l"; done <<<"$1"; }
# expect_rc WANT LABEL CMD...: runs CMD, output in $out, checks its status.
out=
expect_rc() {
    local want=$1 label=$2 rc=0
    shift 2
    out=$("$@" 2>&1) || rc=$?
    if [ "$rc" -eq "$want" ]; then
        return 0
    fi
    fail "$label: exit status $rc, expected $want; output:"
    indent "$out"
    return 1
}
# has TEXT LABEL: the last output contains TEXT.
has() {
    if grep -qF -- "$1" <<<"$out"; then
        ok "$2"
    else
        fail "$2: no '$1' in the output:"
        indent "$out"
    fi
}

work=$(mktemp -d -t iwarp-ops-test.XXXXXX)
netns=
cleanup() {
    [ -n "$netns" ] && ip netns del "$netns" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

stand_in_binary() {
    if [ -n "${IWARP_BIN:-}" ] && [ -x "$IWARP_BIN" ]; then
        cp "$IWARP_BIN" "$work/iwarp"
    else
        cp /bin/true "$work/iwarp"
    fi
}

# ---------------------------------------------------------------------------
test_unit() {
    echo "== unit: deploy/iwarp.service"
    if ! command -v systemd-analyze >/dev/null; then
        if is_root && [ "${IWARP_REQUIRE_ROOT_TESTS:-}" = 1 ] && command -v apt-get >/dev/null; then
            echo "installing systemd for systemd-analyze"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
        else
            skip "systemd-analyze missing (package systemd): unit not verified"
            return
        fi
    fi
    local u="$work/unit" rc=0 v
    mkdir -p "$u"
    stand_in_binary
    sed "s#^ExecStart=/usr/local/bin/iwarp #ExecStart=$work/iwarp #" deploy/iwarp.service >"$u/iwarp.service"
    v=$(systemd-analyze verify "$u/iwarp.service" 2>&1) || rc=$?
    # Unknown keys are only warnings (status 0): any output is a failure.
    if [ "$rc" -eq 0 ] && [ -z "$v" ]; then
        ok "systemd-analyze verify accepts the unit, silently (ExecStart pointed at a copy in $u)"
    else
        fail "systemd-analyze verify: status $rc: $v"
    fi

    # systemd's own rating of the sandbox (lower is tighter; 10 = none).
    local sec score
    if sec=$(systemd-analyze security --offline=yes --no-pager "$u/iwarp.service" 2>&1); then
        score=$(sed -n 's/.*Overall exposure level for iwarp.service: \([0-9.]*\).*/\1/p' <<<"$sec")
        if [ -n "$score" ] && awk -v s="$score" 'BEGIN { exit !(s < 7.0) }'; then
            ok "systemd-analyze security: exposure $score (below 7.0, systemd's MEDIUM or better)"
        else
            fail "systemd-analyze security: exposure '${score:-?}' not below 7.0"
        fi
    else
        echo "skip: systemd-analyze security --offline not available here"
    fi

    local k
    for k in "Wants=network-online.target" "After=network-online.target" \
        "RequiresMountsFor=/dev/hugepages" "ExecStart=/usr/local/bin/iwarp serve --config /etc/iwarp/iwarp.toml" \
        "LimitMEMLOCK=infinity" "ProtectSystem=strict" "PrivateTmp=yes" "NoNewPrivileges=yes" \
        "RuntimeDirectory=iwarp" "Restart=on-failure" "KillSignal=SIGTERM" "TimeoutStopSec=" \
        "DeviceAllow=/dev/vfio/vfio rw" "DeviceAllow=char-vfio rw"; do
        grep -qxF -- "$k" deploy/iwarp.service || grep -q "^$k" deploy/iwarp.service ||
            { fail "unit lacks '$k'"; continue; }
    done
    ok "unit has the dependencies, limits, sandbox and restart policy (14 directives checked)"
    local caps
    caps=$(sed -n 's/^CapabilityBoundingSet=//p' deploy/iwarp.service)
    if [ "$caps" = "CAP_IPC_LOCK CAP_NET_ADMIN CAP_NET_RAW" ] &&
        [ "$(sed -n 's/^AmbientCapabilities=//p' deploy/iwarp.service)" = "$caps" ]; then
        ok "capabilities: bounding = ambient = $caps"
    else
        fail "capabilities: bounding set '$caps' is not CAP_IPC_LOCK CAP_NET_ADMIN CAP_NET_RAW (or ambient differs)"
    fi
    if grep -q '^ReadWritePaths=.*/dev/hugepages.*/run/dpdk.*/dev/vfio' deploy/iwarp.service; then
        ok "ReadWritePaths has the hugepage mount, /run/dpdk and /dev/vfio"
    else
        fail "ReadWritePaths lacks /dev/hugepages, /run/dpdk or /dev/vfio"
    fi

    # The unit with the drop-ins install.sh derives from a configuration
    # that pins cores and asks for IOVA-as-PA.
    local root="$work/unit-root"
    mkdir -p "$root/etc/iwarp"
    sed -e 's/^cores = \[\]/cores = [2, 3]/' -e 's/# "--iova-mode=pa",/"--iova-mode=pa",/' \
        -e 's/^socket_group = ""/socket_group = "iwarp"/' deploy/iwarp.toml >"$root/etc/iwarp/iwarp.toml"
    if ! expect_rc 0 "install.sh --root (drop-ins)" deploy/install.sh --root "$root" --binary "$work/iwarp" --prefix "$work/prefix"; then
        return
    fi
    local d="$root/etc/systemd/system/iwarp.service.d"
    if grep -qx 'CPUAffinity=0 2 3' "$d/cpu-affinity.conf" 2>/dev/null &&
        grep -qx 'CapabilityBoundingSet=CAP_SYS_ADMIN CAP_SYS_RAWIO' "$d/iova-pa.conf" 2>/dev/null &&
        grep -qx 'SupplementaryGroups=iwarp' "$d/socket-group.conf" 2>/dev/null; then
        ok "install.sh drop-ins: CPUAffinity=0 2 3 (EAL -l 0 + workers.cores [2, 3]), IOVA-as-PA capabilities, SupplementaryGroups=iwarp"
    else
        fail "install.sh drop-ins missing or wrong: $(cat "$d"/*.conf 2>&1)"
    fi
    cp "$root/etc/systemd/system/iwarp.service" "$u/iwarp.service"
    mkdir -p "$u/iwarp.service.d"
    cp "$d"/*.conf "$u/iwarp.service.d/"
    mkdir -p "$work/prefix/bin" && cp "$work/iwarp" "$work/prefix/bin/iwarp"
    rc=0
    v=$(systemd-analyze verify "$u/iwarp.service" 2>&1) || rc=$?
    if [ "$rc" -eq 0 ] && [ -z "$v" ]; then
        ok "systemd-analyze verify accepts the installed unit with its three drop-ins"
    else
        fail "systemd-analyze verify with drop-ins: status $rc: $v"
    fi
}

# ---------------------------------------------------------------------------
snapshot() {
    local p
    for p in /usr/local/bin /etc/systemd/system /etc/iwarp /var/lib/iwarp /etc/sysctl.d; do
        echo "## $p"
        find "$p" -maxdepth 2 -printf '%p %m %s %T@\n' 2>/dev/null | sort || true
    done
    dpkg-query -W -f='${Package} ${Status}\n' 2>/dev/null | md5sum || true
}

test_install() {
    echo "== install: deploy/install.sh"
    expect_rc 0 "install.sh --help" deploy/install.sh --help && has "--dry-run" "install.sh --help prints the options"
    if expect_rc 1 "install.sh --bogus" deploy/install.sh --bogus; then
        [ "$(wc -l <<<"$out")" -eq 1 ] && has "unknown option '--bogus'" "install.sh refuses an unknown option in one line"
    fi

    local before after n
    before=$(snapshot)
    if expect_rc 0 "install.sh --dry-run" deploy/install.sh --dry-run; then
        n=$(grep -c 'would run' <<<"$out" || true)
        has "dry run" "install.sh --dry-run passes ($n actions listed)"
        if grep -q "^install.sh: run:" <<<"$out"; then
            fail "install.sh --dry-run ran something: $(grep '^install.sh: run:' <<<"$out")"
        fi
    fi
    if expect_rc 0 "install.sh --dry-run --no-build" deploy/install.sh --dry-run --no-deps --binary /bin/true --prefix /opt/iwarp-test; then
        has "/opt/iwarp-test/bin/iwarp" "install.sh --dry-run --prefix names the prefix's binary"
    fi
    after=$(snapshot)
    if [ "$before" = "$after" ]; then
        ok "install.sh --dry-run changed nothing (/usr/local/bin, /etc/systemd/system, /etc/iwarp, /var/lib/iwarp, /etc/sysctl.d, dpkg state compared)"
    else
        fail "install.sh --dry-run changed the system: $(diff <(echo "$before") <(echo "$after") | head -20)"
    fi

    stand_in_binary
    local root="$work/install-root"
    if expect_rc 0 "install.sh --root (first)" deploy/install.sh --root "$root" --binary "$work/iwarp"; then
        local f path want mode missing=
        for f in "usr/local/bin/iwarp 755" "etc/systemd/system/iwarp.service 644" "etc/iwarp/iwarp.toml 644" "var/lib/iwarp 750"; do
            read -r path want <<<"$f"
            mode=$(stat -c %a "$root/$path" 2>/dev/null || echo absent)
            [ "$mode" = "$want" ] || missing+=" $path($mode, want $want)"
        done
        if [ -z "$missing" ]; then
            ok "staged install: binary 755, unit 644, config 644, state dir 750"
        else
            fail "staged install:$missing"
        fi
        cmp -s deploy/iwarp.toml "$root/etc/iwarp/iwarp.toml" && ok "staged install: the example configuration is /etc/iwarp/iwarp.toml"
    fi
    if expect_rc 0 "install.sh --root (second)" deploy/install.sh --root "$root" --binary "$work/iwarp"; then
        if grep -q "^install.sh: run:" <<<"$out"; then
            fail "second install ran: $(grep '^install.sh: run:' <<<"$out")"
        else
            has "nothing to change" "install.sh is idempotent: the second run changes nothing and says so"
        fi
    fi
    echo "# edited by the operator" >>"$root/etc/iwarp/iwarp.toml"
    cp "$root/etc/iwarp/iwarp.toml" "$work/edited.toml"
    if expect_rc 0 "install.sh --root (edited config)" deploy/install.sh --root "$root" --binary "$work/iwarp"; then
        if cmp -s "$work/edited.toml" "$root/etc/iwarp/iwarp.toml" && cmp -s deploy/iwarp.toml "$root/etc/iwarp/iwarp.toml.example"; then
            ok "install.sh keeps an edited iwarp.toml and installs iwarp.toml.example next to it"
        else
            fail "install.sh overwrote the edited configuration or did not write the example"
        fi
    fi
    # As a user (nobody, when it can reach this checkout).
    if is_root && id nobody >/dev/null 2>&1 && command -v runuser >/dev/null &&
        runuser -u nobody -- test -x deploy/install.sh 2>/dev/null; then
        if expect_rc 1 "install.sh as a user" runuser -u nobody -- deploy/install.sh --no-deps --binary /bin/true; then
            has "needs root" "install.sh refuses to install without root, in one line"
        fi
    fi
}

# ---------------------------------------------------------------------------
test_hugepages() {
    echo "== hugepages: deploy/hugepages.sh"
    if expect_rc 0 "hugepages.sh --status" deploy/hugepages.sh --status; then
        has "pool 2048 kB" "hugepages.sh --status lists the 2 MiB pool ($(grep -m1 'pool 2048' <<<"$out" | sed 's/^hugepages.sh: //'))"
    fi
    local f=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages before
    before=$(cat "$f" 2>/dev/null || echo none)
    if expect_rc 0 "hugepages.sh --dry-run" deploy/hugepages.sh --dry-run --count $((before == 0 ? 64 : before + 64)) --persistent --mount "$work/hp"; then
        has "would write" "hugepages.sh --dry-run prints the sysfs write"
        has "vm.nr_hugepages" "hugepages.sh --dry-run --persistent prints the sysctl.d setting"
        has "mount -t hugetlbfs" "hugepages.sh --dry-run --mount prints the mount"
    fi
    # Only the output is checked for the pool: other tests of the suite
    # (dpdk_extmem) may resize it meanwhile.
    if ! grep -q '^hugepages.sh: write ' <<<"$out" && [ ! -e "$work/hp" ] &&
        [ ! -e /etc/sysctl.d/80-iwarp-hugepages.conf ]; then
        ok "hugepages.sh --dry-run changed nothing (no sysfs write, no mount point, no sysctl.d file)"
    else
        fail "hugepages.sh --dry-run changed something"
    fi
    if expect_rc 0 "hugepages.sh 1G --persistent --dry-run" deploy/hugepages.sh --dry-run --size 1G --count 2 --persistent; then
        has "hugepagesz=1G hugepages=2" "hugepages.sh prints the kernel command line for persistent 1 GiB pages"
    fi
    expect_rc 1 "hugepages.sh --size 3M" deploy/hugepages.sh --size 3M --count 1 && has "2M or 1G" "hugepages.sh refuses a size it does not know"

    # A fake sysfs whose pool accepts writes but reads back 0: the kernel
    # granting nothing.
    local fake="$work/hp-sys"
    mkdir -p "$fake/kernel/mm/hugepages/hugepages-2048kB"
    ln -s /dev/null "$fake/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    if expect_rc 1 "hugepages.sh refusal" env HUGEPAGES_SYSFS="$fake" deploy/hugepages.sh --count 100000; then
        has "reserved only 0 of 100000" "hugepages.sh refuses a count the kernel does not grant, and says what it got"
    fi
    # A fake sysfs that keeps what is written: persistence is idempotent.
    rm "$fake/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    echo 0 >"$fake/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    local envs=(env HUGEPAGES_SYSFS="$fake" HUGEPAGES_SYSCTL_DIR="$work/sysctl.d")
    if expect_rc 0 "hugepages.sh fake reserve" "${envs[@]}" deploy/hugepages.sh --count 8 --persistent; then
        if grep -qx 'vm.nr_hugepages = 8' "$work/sysctl.d/80-iwarp-hugepages.conf" 2>/dev/null; then
            ok "hugepages.sh --persistent writes vm.nr_hugepages = 8 to sysctl.d"
        else
            fail "hugepages.sh --persistent did not write the sysctl.d file"
        fi
        expect_rc 0 "hugepages.sh fake reserve again" "${envs[@]}" deploy/hugepages.sh --count 8 --persistent &&
            has "unchanged: $work/sysctl.d/80-iwarp-hugepages.conf" "hugepages.sh: a second identical run changes nothing"
        expect_rc 0 "hugepages.sh fake release" "${envs[@]}" deploy/hugepages.sh --release --size 2M --persistent &&
            [ ! -e "$work/sysctl.d/80-iwarp-hugepages.conf" ] && has "released: 8 2M pages" "hugepages.sh --release --persistent frees the pool and removes the sysctl.d file"
    fi

    # Per NUMA node: the node's own pool file, and the kernel command
    # line form for every boot.
    mkdir -p "$fake/devices/system/node/node1/hugepages/hugepages-2048kB"
    echo 0 >"$fake/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"
    if expect_rc 0 "hugepages.sh --node 1" "${envs[@]}" deploy/hugepages.sh --count 16 --node 1 --persistent; then
        if [ "$(cat "$fake/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages")" = 16 ] &&
            grep -qF "hugepagesz=2M hugepages=1:16" <<<"$out"; then
            ok "hugepages.sh --node 1 reserves on node 1 and prints hugepages=1:16 for every boot"
        else
            fail "hugepages.sh --node 1: $out"
        fi
    fi
    expect_rc 1 "hugepages.sh --node 5" "${envs[@]}" deploy/hugepages.sh --count 16 --node 5 &&
        has "is missing" "hugepages.sh refuses a NUMA node that has no pool"

    # The real pool, briefly: 2 pages more, then back. Opt-in: dpdk_extmem
    # resizes the same pool when the suite runs, and the two would race.
    if [ "${IWARP_OPS_REAL_HUGEPAGES:-}" != 1 ]; then
        echo "skip: real 2 MiB reservation (set IWARP_OPS_REAL_HUGEPAGES=1; not run alongside the suite)"
    elif ! is_root; then
        skip "real 2 MiB reservation needs root"
    elif ! [ -w "$f" ] || ! (echo "$before" >"$f") 2>/dev/null; then
        echo "skip: $f is not writable here (read-only sysfs)"
    else
        local want=$((before + 2)) got
        if expect_rc 0 "hugepages.sh real reserve" deploy/hugepages.sh --count "$want"; then
            got=$(cat "$f")
            [ "$got" = "$want" ] && ok "hugepages.sh reserved $want real 2 MiB pages (kernel reads back $got)"
        fi
        deploy/hugepages.sh --count "$before" >/dev/null 2>&1 || echo "$before" >"$f"
        [ "$(cat "$f")" = "$before" ] && ok "2 MiB pool restored to $before"
    fi
}

# ---------------------------------------------------------------------------
# A fake sysfs: PCI function PCI with driver DRIVER and interface IFACE.
fake_pci() {
    local sys=$1 pci=$2 drv=$3 ifc=${4:-}
    mkdir -p "$sys/devices/pci0000:00/$pci" "$sys/bus/pci/devices" "$sys/bus/pci/drivers/$drv" \
        "$sys/bus/pci/drivers/vfio-pci" "$sys/class/net" "$sys/kernel/iommu_groups/7"
    ln -sfn "../../../bus/pci" "$sys/devices/pci0000:00/$pci/subsystem"
    ln -sfn "../../../bus/pci/drivers/$drv" "$sys/devices/pci0000:00/$pci/driver"
    echo 0x020000 >"$sys/devices/pci0000:00/$pci/class"
    ln -sfn "../../../devices/pci0000:00/$pci" "$sys/bus/pci/devices/$pci"
    if [ -n "$ifc" ]; then
        mkdir -p "$sys/devices/pci0000:00/$pci/net/$ifc"
        ln -sfn "../../devices/pci0000:00/$pci/net/$ifc" "$sys/class/net/$ifc"
        ln -sfn "../../../$pci" "$sys/devices/pci0000:00/$pci/net/$ifc/device"
    fi
}

test_nicbind() {
    echo "== nicbind: deploy/nic-bind.sh"
    expect_rc 0 "nic-bind.sh --status" deploy/nic-bind.sh --status && has "bound by this script" "nic-bind.sh --status lists devices and records"
    expect_rc 1 "nic-bind.sh bind 0000:99:99.7" deploy/nic-bind.sh --dry-run bind 0000:99:99.7 && has "no PCI device 0000:99:99.7" "nic-bind.sh refuses a PCI address that does not exist"

    # Without root: a fake sysfs with one port (no interface), bound to
    # vfio-pci earlier with its original driver recorded.
    local sys="$work/nic-sys" state="$work/nic-state"
    fake_pci "$sys" 0000:00:1f.6 e1000e
    local envs=(env NIC_BIND_SYSFS="$sys" NIC_BIND_STATE_DIR="$state")
    if expect_rc 0 "nic-bind.sh dry-run bind by PCI" "${envs[@]}" deploy/nic-bind.sh --dry-run bind 00:1f.6; then
        has "--bind=vfio-pci 0000:00:1f.6" "nic-bind.sh --dry-run bind 00:1f.6 prints the devbind command"
        has "would record the original driver e1000e" "nic-bind.sh --dry-run says it would record e1000e"
        [ -e "$state" ] && fail "nic-bind.sh --dry-run created $state"
    fi
    mkdir -p "$state"
    printf 'driver=e1000e\nifaces=\n' >"$state/0000:00:1f.6"
    ln -sfn ../../../bus/pci/drivers/vfio-pci "$sys/devices/pci0000:00/0000:00:1f.6/driver"
    if expect_rc 0 "nic-bind.sh dry-run unbind" "${envs[@]}" deploy/nic-bind.sh --dry-run unbind 0000:00:1f.6; then
        has "--bind=e1000e 0000:00:1f.6" "nic-bind.sh --dry-run unbind prints the devbind command giving the port back to e1000e"
    fi
    rm -rf "$sys" "$state"

    if ! is_root; then
        skip "network namespace with dummy interfaces needs root"
        return
    fi
    netns="iwops$$"
    ip netns add "$netns"
    local n=(ip -n "$netns") kind=dummy
    # A dummy interface where the kernel has the module, else one end of a
    # veth pair (its peer left unused).
    mkif() {
        "${n[@]}" link add "$1" type dummy 2>/dev/null ||
            { kind=veth && "${n[@]}" link add "$1" type veth peer name "$1-p"; }
    }
    mkif dummy-iw0
    "${n[@]}" addr add 10.99.0.1/24 dev dummy-iw0
    "${n[@]}" addr add 2001:db8:99::1/64 dev dummy-iw0 nodad
    "${n[@]}" link set dummy-iw0 up
    mkif dummy-iw1
    "${n[@]}" link set dummy-iw1 up
    "${n[@]}" route add default dev dummy-iw1
    mkif dummy-iw2
    "${n[@]}" link set dummy-iw2 up
    echo "   namespace $netns: dummy-iw0 (10.99.0.1/24, 2001:db8:99::1/64), dummy-iw1 (default route), dummy-iw2 (no address); kind $kind"
    local in=(ip netns exec "$netns" env NIC_BIND_STATE_DIR="$state")

    if expect_rc 1 "bind dummy-iw0 (addresses)" "${in[@]}" deploy/nic-bind.sh --dry-run bind dummy-iw0; then
        has "refused: dummy-iw0 has the IPv4 address 10.99.0.1/24" "nic-bind.sh refuses dummy-iw0: IPv4 address 10.99.0.1/24"
        has "refused: dummy-iw0 has the IPv6 address 2001:db8:99::1/64" "nic-bind.sh refuses dummy-iw0: global IPv6 address"
    fi
    if expect_rc 1 "bind dummy-iw1 (default route)" "${in[@]}" deploy/nic-bind.sh --dry-run bind dummy-iw1; then
        has "refused: dummy-iw1 carries a default route" "nic-bind.sh refuses dummy-iw1: it carries the default route"
    fi
    # dummy-iw2 has only its IPv6 link-local address: allowed, but it is no
    # PCI device.
    if expect_rc 1 "bind dummy-iw2 (real sysfs)" "${in[@]}" deploy/nic-bind.sh --dry-run bind dummy-iw2; then
        has "dummy-iw2 is not a PCI device" "nic-bind.sh passes dummy-iw2's checks, then says it is not a PCI device"
    fi

    # The same interfaces seen through a fake sysfs that puts them on PCI
    # functions.
    fake_pci "$sys" 0000:00:1f.6 e1000e dummy-iw2
    fake_pci "$sys" 0000:00:1f.7 e1000e dummy-iw0
    in=(ip netns exec "$netns" env NIC_BIND_SYSFS="$sys" NIC_BIND_STATE_DIR="$state")
    if expect_rc 0 "dry-run bind dummy-iw2" "${in[@]}" deploy/nic-bind.sh --dry-run bind dummy-iw2; then
        has "--bind=vfio-pci 0000:00:1f.6" "nic-bind.sh --dry-run bind dummy-iw2 (address-less) prints the devbind command"
        [ -e "$state" ] && fail "nic-bind.sh --dry-run created $state"
    fi
    expect_rc 1 "bind 0000:00:1f.7 (dummy-iw0 behind it)" "${in[@]}" deploy/nic-bind.sh --dry-run bind 0000:00:1f.7 &&
        has "refused: dummy-iw0 has the IPv4 address" "nic-bind.sh bind by PCI address checks the interface behind it"
    if expect_rc 0 "dry-run bind --force dummy-iw0" "${in[@]}" deploy/nic-bind.sh --dry-run --force bind dummy-iw0; then
        has "--force --bind=vfio-pci 0000:00:1f.7" "nic-bind.sh --force binds dummy-iw0 anyway, passing --force to devbind"
    fi

    # A full bind / unbind round trip on the fake sysfs, dpdk-devbind.py
    # replaced by a stub that moves the driver link.
    cat >"$work/devbind-stub" <<EOF
#!/bin/sh
echo "devbind-stub \$*" >>"$work/devbind.log"
for a in "\$@"; do case "\$a" in --bind=*) drv=\${a#--bind=} ;; -u) drv= ;; 0000:*) pci=\$a ;; esac; done
if [ -n "\$drv" ]; then ln -sfn "../../../bus/pci/drivers/\$drv" "$sys/devices/pci0000:00/\$pci/driver"
else rm -f "$sys/devices/pci0000:00/\$pci/driver"; fi
EOF
    chmod +x "$work/devbind-stub"
    in+=(DPDK_DEVBIND="$work/devbind-stub")
    if expect_rc 0 "stub bind dummy-iw2" "${in[@]}" deploy/nic-bind.sh bind dummy-iw2; then
        if [ "$(basename "$(readlink "$sys/bus/pci/devices/0000:00:1f.6/driver")")" = vfio-pci ] &&
            grep -qx 'driver=e1000e' "$state/0000:00:1f.6" 2>/dev/null; then
            ok "nic-bind.sh bind (stubbed devbind): 0000:00:1f.6 on vfio-pci, e1000e recorded in the state file"
        else
            fail "stub bind: driver $(readlink "$sys/bus/pci/devices/0000:00:1f.6/driver"), record $(cat "$state/0000:00:1f.6" 2>&1)"
        fi
        expect_rc 0 "stub bind again" "${in[@]}" deploy/nic-bind.sh bind dummy-iw2 && has "already bound to vfio-pci" "nic-bind.sh bind is idempotent"
        if expect_rc 0 "stub unbind" "${in[@]}" deploy/nic-bind.sh unbind 0000:00:1f.6; then
            if [ "$(basename "$(readlink "$sys/bus/pci/devices/0000:00:1f.6/driver")")" = e1000e ] && [ ! -e "$state/0000:00:1f.6" ]; then
                ok "nic-bind.sh unbind gives 0000:00:1f.6 back to e1000e and drops the record"
            else
                fail "stub unbind: driver $(readlink "$sys/bus/pci/devices/0000:00:1f.6/driver")"
            fi
        fi
        echo "   devbind calls: $(tr '\n' ';' <"$work/devbind.log")"
    fi
    ip netns del "$netns"
    netns=
    ok "network namespace removed"
}

# ---------------------------------------------------------------------------
# The example configuration as the unit runs it: `iwarp serve --config`,
# moved onto a virtual device (net_ring0, the runtime's EAL defaults) with
# its control socket and metrics address moved out of the way; then
# SIGTERM, which must stop it within the unit's TimeoutStopSec.
test_serve() {
    echo "== serve: iwarp serve --config deploy/iwarp.toml"
    if [ -z "${IWARP_BIN:-}" ] || [ ! -x "${IWARP_BIN:-}" ]; then
        echo "skip: IWARP_BIN not set (dataplane/cli/tests/deploy_scripts.rs sets it)"
        return
    fi
    if ! is_root; then
        skip "DPDK's EAL needs root here"
        return
    fi
    local sock="$work/control.sock" port=$((20000 + $$ % 20000)) log="$work/serve.log" pid rc=0
    "$IWARP_BIN" serve --config deploy/iwarp.toml --set 'eal.args=[]' --set ports.0.device=net_ring0 \
        --set ports.0.mac=02:00:00:00:50:0a --set "serve.control_socket=$sock" \
        --set "metrics.listen=127.0.0.1:$port" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
        [ "$(grep -c 'event=listening' "$log")" -ge 3 ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ "$(grep -c 'event=listening' "$log")" -ge 3 ]; then
        ok "iwarp serve runs the example: $(grep -c 'event=listening' "$log") responders listening ($(grep -o 'responder=[a-z]*:[0-9]*' "$log" | sort | tr '\n' ' '))"
    else
        fail "iwarp serve did not start its 3 responders within 30 s:"
        indent "$(cat "$log")"
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        return
    fi
    local mode
    mode=$(stat -c %a "$sock" 2>/dev/null || echo absent)
    if [ "$mode" = 660 ]; then ok "control socket mode 0660 (serve.socket_mode)"; else fail "control socket mode $mode, not 660"; fi
    if expect_rc 0 "iwarp stats" "$IWARP_BIN" stats --socket "$sock" --json; then
        has "{" "iwarp stats --json answers through the control socket"
    fi
    local metrics=
    if exec 3<>"/dev/tcp/127.0.0.1/$port"; then
        printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
        metrics=$(timeout 10 cat <&3 || true)
        exec 3<&-
    fi
    out=$metrics
    if grep -q '^HTTP/1.[01] 200' <<<"$metrics" && grep -q '^# TYPE ' <<<"$metrics"; then
        ok "metrics endpoint (metrics.listen, path /metrics) answers: $(grep -c '^# TYPE ' <<<"$metrics") metric families"
    else
        fail "metrics endpoint on 127.0.0.1:$port: $(head -3 <<<"$metrics")"
    fi
    local t0=$SECONDS
    kill -TERM "$pid"
    wait "$pid" || rc=$?
    if [ "$rc" -eq 0 ] && grep -q 'event=stopped' "$log" && [ ! -e "$sock" ] && [ $((SECONDS - t0)) -lt 30 ]; then
        ok "SIGTERM: stopped in $((SECONDS - t0)) s (TimeoutStopSec=30), exit 0, control socket removed"
    else
        fail "SIGTERM: exit $rc after $((SECONDS - t0)) s, socket $( [ -e "$sock" ] && echo left || echo removed)"
        indent "$(tail -5 "$log")"
    fi
}

sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(unit install hugepages nicbind serve)
for s in "${sections[@]}"; do
    case "$s" in
    unit) test_unit ;;
    install) test_install ;;
    hugepages) test_hugepages ;;
    nicbind) test_nicbind ;;
    serve) test_serve ;;
    *)
        echo "ops-test.sh: unknown section '$s' (unit, install, hugepages, nicbind, serve)" >&2
        exit 2
        ;;
    esac
done
echo "ops-test: $checks checks, $fails failed"
[ "$fails" -eq 0 ]
