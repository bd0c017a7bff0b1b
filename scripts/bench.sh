#!/usr/bin/env bash
# Benchmarks on one throw-away redis-server: first the load benchmark comparing this library
# with rslock and a naive SET NX lock (tools/lockbench, a package of its own; arguments go to it, e.g.
# `--reps 1 --seconds 1 --only ours`), then the criterion benches of the lock engine next to
# `redis-benchmark -t ping -c 1` on the same server, then the benches of each lock kind and of readers.
#
# lockbench prints its tables on stderr and one JSON line per run, summary row and target on
# stdout. The script exits with lockbench's status (1: a mutual-exclusion violation) after
# the criterion benches have run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/lib.sh
start_redis

# Release build: the figures are timings.
status=0
cargo run --release --locked --manifest-path tools/lockbench/Cargo.toml --target-dir target \
    -- --redis "$REDIS_URL" "$@" || status=$?

ping() {
    redis-benchmark -p "$REDIS_PORT" -t ping -c 1 -n 20000 -q | tr '\r' '\n' | grep 'requests per second'
}
echo "== redis-benchmark -t ping -c 1 (before)"
ping
LOCK_BENCH_REDIS_URL="$REDIS_URL" cargo bench --locked --bench lock
# Each lock kind next to the exclusive lock; it starts its own servers (five for RedLock).
cargo bench --locked --bench kinds
# What one more reader costs a read-write lock 10, 100 and 1,000 readers hold.
cargo bench --locked --bench readers
echo "== redis-benchmark -t ping -c 1 (after)"
ping
exit "$status"
