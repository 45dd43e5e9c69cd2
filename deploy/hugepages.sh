#!/usr/bin/env bash
# Reserves hugepages for the dataplane's EAL: 2 MiB or 1 GiB pages, for this
# boot (sysfs) and optionally for every boot (a sysctl.d file for pages of
# the default size; the kernel command line for 1 GiB pages, which need
# contiguous memory the kernel only reliably finds at boot: printed, never
# written into the bootloader). Mounts hugetlbfs where asked. Reads back
# what the kernel actually reserved and refuses, restoring the previous
# count, when it granted fewer pages than asked.
#
# --count N sets the pool to N pages (not N more). See deploy/REAL-NIC.md §2
# for how many the dataplane needs (about 512 MiB per port's NUMA node).
set -euo pipefail

prog=hugepages.sh
# Test hooks: a fake sysfs / sysctl.d / meminfo / cmdline.
sys=${HUGEPAGES_SYSFS:-/sys}
sysctl_dir=${HUGEPAGES_SYSCTL_DIR:-/etc/sysctl.d}
meminfo=${HUGEPAGES_MEMINFO:-/proc/meminfo}
cmdline=${HUGEPAGES_CMDLINE:-/proc/cmdline}
sysctl_file="$sysctl_dir/80-iwarp-hugepages.conf"

usage() {
    cat <<EOF
usage: deploy/hugepages.sh [--size 2M|1G] --count N [--node N] [--persistent] [--mount DIR] [--dry-run]
       deploy/hugepages.sh [--size 2M|1G] --release [--persistent] [--dry-run]
       deploy/hugepages.sh --mount DIR [--size 2M|1G] [--dry-run]
       deploy/hugepages.sh --status

  --size 2M|1G   page size (default 2M)
  --count N      set the pool of that size to N pages, now (sysfs); fails,
                 restoring the old count, if the kernel grants fewer
  --node N       only on NUMA node N (the NIC's: /sys/bus/pci/devices/<PCI>/numa_node)
  --persistent   also for every boot: writes $sysctl_file for pages of
                 the default size, prints the kernel command line otherwise
  --mount DIR    mount hugetlbfs with that page size on DIR if not mounted
  --release      set the pool to 0 (every size unless --size is given);
                 with --persistent also removes $sysctl_file
  --status       pools, mounts and boot-time settings
  --dry-run      print what would be done, change nothing
EOF
}

die() {
    echo "$prog: error: $*" >&2
    exit 1
}
say() { echo "$prog: $*"; }

size=2M
size_given=0
count=
node=
persistent=0
mount_dir=
release=0
status=0
dry=0
while [ $# -gt 0 ]; do
    case "$1" in
    --size | --count | --node | --mount)
        [ $# -ge 2 ] || die "$1 needs a value"
        case "$1" in
        --size)
            size=$2
            size_given=1
            ;;
        --count) count=$2 ;;
        --node) node=$2 ;;
        --mount) mount_dir=$2 ;;
        esac
        shift
        ;;
    --persistent) persistent=1 ;;
    --release) release=1 ;;
    --status) status=1 ;;
    --dry-run | -n) dry=1 ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done

case "${size^^}" in
2M | 2MB | 2048K | 2048KB) size=2M kb=2048 ;;
1G | 1GB | 1024M | 1048576K | 1048576KB) size=1G kb=1048576 ;;
*) die "--size must be 2M or 1G, not '$size'" ;;
esac
if [ -n "$count" ] && ! [[ "$count" =~ ^[0-9]+$ ]]; then
    die "--count must be a whole number of pages, not '$count'"
fi
if [ -n "$node" ] && ! [[ "$node" =~ ^[0-9]+$ ]]; then
    die "--node must be a NUMA node number, not '$node'"
fi
if [ -n "$count" ] && [ "$release" -eq 1 ]; then
    die "--count and --release exclude each other"
fi
if [ "$status" -eq 0 ] && [ -z "$count" ] && [ "$release" -eq 0 ] && [ -z "$mount_dir" ]; then
    die "nothing to do: give --count N, --release, --mount DIR or --status (see --help)"
fi

# The pool file of a size (kB), on NODE or system-wide.
pool_dir() {
    if [ -n "$2" ]; then
        echo "$sys/devices/system/node/node$2/hugepages/hugepages-$1kB"
    else
        echo "$sys/kernel/mm/hugepages/hugepages-$1kB"
    fi
}
read_num() {
    local v
    v=$(cat "$1" 2>/dev/null || true)
    v=${v//[[:space:]]/}
    [[ "$v" =~ ^[0-9]+$ ]] || v=0
    echo "$v"
}
human() { # pages, kB per page
    local mib=$(($1 * $2 / 1024))
    if [ "$mib" -ge 1024 ] && [ $((mib % 1024)) -eq 0 ]; then echo "$((mib / 1024)) GiB"; else echo "$mib MiB"; fi
}
default_kb() {
    sed -n 's/^Hugepagesize:[[:space:]]*\([0-9]*\) kB/\1/p' "$meminfo" 2>/dev/null | head -1
}
need_root() {
    if [ "$dry" -eq 0 ] && [ "$(id -u)" -ne 0 ] && [ -z "${HUGEPAGES_SYSFS:-}" ]; then
        die "$1 needs root (or --dry-run to see the steps)"
    fi
}
# Writes VALUE into FILE (sysfs), or prints it under --dry-run.
write() {
    if [ "$dry" -eq 1 ]; then
        say "would write $1 to $2"
    else
        say "write $1 to $2"
        echo "$1" >"$2" 2>/dev/null || die "cannot write $2 (read-only sysfs, as in a container?)"
    fi
}

# ---------------------------------------------------------------------------
show_status() {
    local d kbs n free resv surp def
    def=$(default_kb)
    say "default page size: ${def:-unknown} kB"
    for d in "$sys"/kernel/mm/hugepages/hugepages-*kB; do
        [ -d "$d" ] || continue
        kbs=${d##*hugepages-}
        kbs=${kbs%kB}
        n=$(read_num "$d/nr_hugepages")
        free=$(read_num "$d/free_hugepages")
        resv=$(read_num "$d/resv_hugepages")
        surp=$(read_num "$d/surplus_hugepages")
        say "pool ${kbs} kB: $n pages ($(human "$n" "$kbs")), free $free, reserved $resv, surplus $surp"
        for nd in "$sys"/devices/system/node/node*/hugepages/hugepages-"$kbs"kB; do
            [ -d "$nd" ] || continue
            local nn=${nd#"$sys"/devices/system/node/node}
            say "  node ${nn%%/*}: $(read_num "$nd/nr_hugepages") pages, free $(read_num "$nd/free_hugepages")"
        done
    done
    local mounts
    mounts=$(awk '$3 == "hugetlbfs" { print "  " $2 " (" $4 ")" }' /proc/mounts 2>/dev/null || true)
    if [ -n "$mounts" ]; then
        say "hugetlbfs mounts:"
        echo "$mounts"
    else
        say "hugetlbfs mounts: none"
    fi
    if [ -f "$sysctl_file" ]; then
        say "at boot ($sysctl_file): $(grep -v '^#' "$sysctl_file" | tr '\n' ' ')"
    else
        say "at boot: no $sysctl_file"
    fi
    local cl
    cl=$(tr ' ' '\n' <"$cmdline" 2>/dev/null | grep -E '^(default_)?hugepages?(sz)?=' | tr '\n' ' ' || true)
    say "kernel command line: ${cl:-no hugepage parameters}"
}

# ---------------------------------------------------------------------------
reserve() {
    local dir file before got
    dir=$(pool_dir "$kb" "$node")
    file="$dir/nr_hugepages"
    [ -d "$dir" ] || die "no $size pages here ($dir is missing): the CPU, the kernel or the NUMA node does not offer them"
    need_root "reserving hugepages"
    before=$(read_num "$file")
    if [ "$before" -eq "$count" ]; then
        say "unchanged: $count $size pages ($(human "$count" "$kb")) already reserved${node:+ on node $node}"
        return
    fi
    write "$count" "$file"
    [ "$dry" -eq 1 ] && return
    got=$(read_num "$file")
    if [ "$got" -lt "$count" ]; then
        echo "$before" >"$file" 2>/dev/null || true
        die "the kernel reserved only $got of $count $size pages${node:+ on node $node} (not enough free contiguous memory); the pool is back to $before. Free memory, ask for fewer, or reserve them at boot (--persistent)"
    fi
    say "reserved: $got $size pages ($(human "$got" "$kb"))${node:+ on node $node}, was $before"
}

release_size() {
    local k=$1 label=$2 dir file before got
    dir=$(pool_dir "$k" "$node")
    file="$dir/nr_hugepages"
    [ -d "$dir" ] || return 0
    before=$(read_num "$file")
    if [ "$before" -eq 0 ]; then
        say "unchanged: no $label pages reserved${node:+ on node $node}"
        return 0
    fi
    need_root "releasing hugepages"
    write 0 "$file"
    [ "$dry" -eq 1 ] && return 0
    got=$(read_num "$file")
    if [ "$got" -ne 0 ]; then
        say "error: $got $label pages are still in use (a running DPDK process?); they are freed when it exits" >&2
        return 1
    fi
    say "released: $before $label pages"
}

kernel_args() { # count
    # Not default_hugepagesz: /dev/hugepages keeps the default size, and
    # EAL finds the other sizes through their own mounts.
    echo "hugepagesz=$size hugepages=${node:+$node:}$1"
}

persist() {
    local def
    def=$(default_kb)
    if [ "$kb" = "$def" ] && [ -z "$node" ]; then
        local want
        want="# Written by deploy/hugepages.sh: $count pages of $size ($(human "$count" "$kb")) at every boot.
vm.nr_hugepages = $count"
        if [ -f "$sysctl_file" ] && [ "$(cat "$sysctl_file")" = "$want" ]; then
            say "unchanged: $sysctl_file"
        elif [ "$dry" -eq 1 ]; then
            say "would write $sysctl_file: vm.nr_hugepages = $count"
        else
            need_root "writing $sysctl_file"
            mkdir -p "$sysctl_dir"
            printf '%s\n' "$want" >"$sysctl_file"
            say "wrote $sysctl_file: vm.nr_hugepages = $count (applied at every boot)"
        fi
    else
        local args
        args=$(kernel_args "$count")
        if tr ' ' '\n' <"$cmdline" 2>/dev/null | grep -qx "hugepages=${node:+$node:}$count"; then
            say "the kernel command line already has hugepages=${node:+$node:}$count"
        fi
        say "for every boot, add to the kernel command line (not done here):"
        say "    $args"
        say "  Debian/Ubuntu: append it to GRUB_CMDLINE_LINUX in /etc/default/grub, run update-grub, reboot."
        if [ "$size" = 1G ]; then
            say "  1 GiB pages are best reserved there: at run time memory is often too fragmented."
        fi
    fi
}

unpersist() {
    if [ -f "$sysctl_file" ]; then
        if [ "$dry" -eq 1 ]; then
            say "would remove $sysctl_file"
        else
            need_root "removing $sysctl_file"
            rm -f "$sysctl_file"
            say "removed $sysctl_file"
        fi
    else
        say "unchanged: no $sysctl_file"
    fi
    if grep -q 'hugepages' "$cmdline" 2>/dev/null; then
        say "the kernel command line still reserves pages at boot: remove its hugepage parameters from /etc/default/grub and run update-grub"
    fi
}

do_mount() {
    local dir=$1 have
    case "$dir" in /*) ;; *) die "--mount needs an absolute path, not '$dir'" ;; esac
    have=$(awk -v d="$dir" '$2 == d && $3 == "hugetlbfs" { print $4 }' /proc/mounts)
    if [ -n "$have" ]; then
        case ",$have," in
        *",pagesize=$size,"* | *",pagesize=${size}B,"*) say "unchanged: hugetlbfs already mounted on $dir ($have)" ;;
        *) say "warning: hugetlbfs already mounted on $dir with other options ($have): left as it is" ;;
        esac
        return
    fi
    need_root "mounting hugetlbfs"
    if [ "$dry" -eq 1 ]; then
        say "would run: mkdir -p $dir"
        say "would run: mount -t hugetlbfs -o pagesize=$size nodev $dir"
    else
        mkdir -p "$dir"
        mount -t hugetlbfs -o "pagesize=$size" nodev "$dir" || die "mount of hugetlbfs on $dir failed"
        say "mounted hugetlbfs (pagesize=$size) on $dir"
    fi
    if [ "$persistent" -eq 1 ]; then
        say "for every boot, add to /etc/fstab (not done here): nodev $dir hugetlbfs pagesize=$size 0 0"
    fi
}

[ "$dry" -eq 1 ] && say "dry run: nothing will be changed"
rc=0
if [ -n "$count" ]; then
    reserve
    if [ "$persistent" -eq 1 ]; then persist; fi
fi
if [ "$release" -eq 1 ]; then
    if [ "$size_given" -eq 1 ]; then
        release_size "$kb" "$size" || rc=1
    else
        release_size 2048 2M || rc=1
        release_size 1048576 1G || rc=1
    fi
    if [ "$persistent" -eq 1 ]; then unpersist; fi
fi
if [ -n "$mount_dir" ]; then
    do_mount "$mount_dir"
fi
if [ "$status" -eq 1 ]; then
    show_status
fi
exit "$rc"
