#!/bin/sh
# Aggregate bandwidth and connection setup against the number of queue
# pairs: runs `iwarp demo --json --rounds bandwidth --qps N` for each N of
# QPS (default "1 100 1000 10000"), RUNS times (default 3), alternating
# the counts so that a noisy neighbour hurts all alike, and prints the
# medians with each count's ratio to one QP, and the ratios taken run by
# run against the one-QP run next to it (scale-table). Then the heap
# an idle connected QP costs, from the dataplane's qp_memory test. Extra
# arguments go to every demo run, e.g. `benches/scale.sh --size 16K`.
#
# Rounds last SECONDS_PER_ROUND (default 6): with 10,000 QPs the demo
# keeps 20,000 messages of 64 KiB in flight (1.3 GB a side), shared out
# fairly, so hardly any completes in the first half second, and every
# connection starts in slow start with a whole round of turns for its
# round trip. A two-second round is mostly that start.
set -eu
RUNS=${RUNS:-3}
QPS=${QPS:-"1 100 1000 10000"}
SECONDS_PER_ROUND=${SECONDS_PER_ROUND:-6}
cd "$(dirname "$0")/.."
cargo build --release -q -p iwarp -p benches --bin iwarp --bin scale-table
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
i=1
while [ "$i" -le "$RUNS" ]; do
    for q in $QPS; do
        echo "run $i of $RUNS, $q queue pairs" >&2
        if ! target/release/iwarp demo --json --rounds bandwidth --qps "$q" \
            --seconds "$SECONDS_PER_ROUND" "$@" >"$dir/$q-$i.json" 2>"$dir/err"; then
            echo "scale: iwarp demo --qps $q failed:" >&2
            tail -5 "$dir/err" >&2
            exit 1
        fi
    done
    i=$((i + 1))
done
target/release/scale-table "$dir"/*.json
echo
echo "heap per idle connected QP (tests/qp_memory, live bytes per side):"
cargo test -q --release -p dataplane --test qp_memory -- --nocapture 2>/dev/null |
    grep -E "per idle QP" || {
    echo "scale: the qp_memory test failed" >&2
    exit 1
}
