#!/bin/sh
# Bandwidth of the demo against its same-run baselines, at MTU 1500 and
# 9000: runs `iwarp demo --json` RUNS times per MTU (default 3),
# alternating the MTUs so that a noisy neighbour hurts both alike, and
# prints the medians (demo-table). Extra arguments go to every demo run,
# e.g. `benches/demo-bw.sh --size 1M --seconds 3`.
set -eu
RUNS=${RUNS:-3}
cd "$(dirname "$0")/.."
cargo build --release -q -p iwarp -p benches --bin iwarp --bin demo-table
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
i=1
while [ "$i" -le "$RUNS" ]; do
    for mtu in 1500 9000; do
        echo "run $i of $RUNS, MTU $mtu" >&2
        if ! target/release/iwarp demo --json --mtu "$mtu" "$@" >"$dir/$mtu-$i.json" 2>"$dir/err"; then
            echo "demo-bw: iwarp demo --mtu $mtu failed:" >&2
            tail -5 "$dir/err" >&2
            exit 1
        fi
    done
    i=$((i + 1))
done
target/release/demo-table "$dir"/*.json
