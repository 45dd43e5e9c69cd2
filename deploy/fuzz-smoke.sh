#!/usr/bin/env bash
# Short fuzzing run of every cargo-fuzz target in the repository, for CI:
# catches a parser that panics on the first inputs a fuzzer tries, and a
# fuzz target that no longer builds. Not a substitute for long runs.
#
# Every `<crate>/fuzz/` project is found by its Cargo.toml and every target
# in it by `cargo fuzz list`, so new targets are picked up by themselves.
# Each runs for FUZZ_SECONDS (default 15) of libFuzzer's -max_total_time,
# starting from `fuzz/corpus/<target>` (local, git-ignored; a long run's
# corpus left there is reused) plus `fuzz/seeds/<target>` when present:
# a few small inputs cut from the siw captures (Ethernet frames, DDP/RDMAP
# ULPDUs, MPA request/reply frames, FPDU streams), each with the leading
# mode bytes its target reads. Crashes are written to
# `fuzz/artifacts/<target>/` (git-ignored) and fail the script; the build
# goes to $CARGO_TARGET_DIR, by default `target/fuzz`, shared by all the
# projects. Nothing is written where git would see it.
#
# Needs the nightly toolchain (the sanitizer flags are nightly-only) and
# cargo-fuzz, which is installed when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

seconds=${FUZZ_SECONDS:-15}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/fuzz}
export CARGO_TERM_COLOR=never

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz-smoke: the nightly toolchain is missing; cargo-fuzz needs it." >&2
    echo "fuzz-smoke: install it with: rustup toolchain install nightly --profile minimal" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: installing cargo-fuzz" >&2
    cargo install --locked cargo-fuzz
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# One of libFuzzer's -print_final_stats lines from a log.
final_stat() {
    sed -n "s/^stat::$2: *//p" "$1" | tail -1
}

failed=()
summary=()
for manifest in */fuzz/Cargo.toml; do
    fuzz_dir=$(dirname "$manifest")
    crate_dir=$(dirname "$fuzz_dir")
    echo "-- $fuzz_dir: build"
    (cd "$crate_dir" && cargo +nightly fuzz build)
    targets=$(cd "$crate_dir" && cargo +nightly fuzz list)
    for target in $targets; do
        corpus=(fuzz/corpus/"$target")
        mkdir -p "$crate_dir/${corpus[0]}"
        if [ -d "$fuzz_dir/seeds/$target" ]; then
            corpus+=(fuzz/seeds/"$target")
        fi
        log=$logs/$target.log
        echo "-- $fuzz_dir: $target for ${seconds}s"
        # -timeout: an input that takes this long is a failure too.
        if (cd "$crate_dir" && cargo +nightly fuzz run "$target" "${corpus[@]}" -- \
            -max_total_time="$seconds" -timeout=10 -print_final_stats=1) >"$log" 2>&1; then
            line=$(printf '%-32s %12s executions  %8s/s  corpus %s' "$fuzz_dir:$target" \
                "$(final_stat "$log" number_of_executed_units)" "$(final_stat "$log" average_exec_per_sec)" \
                "$(grep -o 'corp: [0-9]*/[0-9a-zA-Z]*' "$log" | tail -1 | cut -d' ' -f2)")
            echo "$line"
            summary+=("$line")
        else
            echo "fuzz-smoke: $fuzz_dir:$target FAILED; the end of its output:" >&2
            tail -n 60 "$log" >&2
            echo "fuzz-smoke: reproducer(s) in $crate_dir/fuzz/artifacts/$target/" >&2
            failed+=("$fuzz_dir:$target")
        fi
    done
done

echo "== fuzz smoke summary (${seconds}s per target)"
for line in "${summary[@]}"; do
    echo "  $line"
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz-smoke: failed: ${failed[*]}" >&2
    exit 1
fi
