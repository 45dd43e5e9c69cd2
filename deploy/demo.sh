#!/usr/bin/env bash
# The quick start's main job: builds `iwarp` and runs its embedded demo,
# which needs no NIC and no hugepages.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
cargo build --release -p iwarp
exec target/release/iwarp demo "$@"
