#!/usr/bin/env bash
# Runs every test against real redis-server processes the tests start themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The benches share the test harness; make sure they still build.
cargo build --locked --all-features --benches
cargo test --locked --all-features
