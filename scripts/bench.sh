#!/usr/bin/env bash
# Benchmarks on one throw-away redis-server: first the load benchmark comparing this library
# with rslock and a naive SET NX lock (tools/lockbench, a package of its own; arguments go to it, e.g.
# `--reps 1 --seconds 1 --only ours`), then the criterion benches of the lock engine next to
# `redis-benchmark -t ping -c 1` on the same server, then the benches of each lock kind and of readers.
#
# With --cluster (first), it runs the load benchmark twice in one go instead, this library
# only: on one throw-away redis-server, then on a throw-away Redis Cluster of three masters
# on the same machine, so the two sets of figures (and their round trips and server commands
# per acquisition) can be read side by side; e.g. ./scripts/bench.sh --cluster --reps 3
# --workload uncontended-w16,contended-w8-2proc. No criterion bench runs then.
#
# With --pin (first), it runs the load benchmark alone, with Redis on a core of its own (the
# last one, by taskset) and the benchmark's processes on the others, as when Redis runs on a
# machine of its own; e.g. ./scripts/bench.sh --pin --reps 3 --workload uncontended-w16.
#
# lockbench prints its tables on stderr and one JSON line per run, summary row, ratio against
# rslock and target on stdout. A run whose 1-minute load average was at or over --max-load (default 0.25
# per core) when lockbench started has its ratios marked loaded (`loaded: true` in the JSON):
# they converge toward 1 on a busy machine. The build this script runs first raises it, so for
# figures to quote pass --wait-quiet SECS (wait up to SECS for the load to fall first), e.g.
# ./scripts/bench.sh --pin --wait-quiet 300 --reps 3 --seconds 3 --workload uncontended-w16.
# The script exits with lockbench's status (1: a mutual-exclusion violation) after the
# criterion benches have run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/lib.sh

# Release build: the figures are timings.
cargo build --release --locked --manifest-path tools/lockbench/Cargo.toml --target-dir target
lockbench=${CARGO_TARGET_DIR:-target}/release/lockbench

if [ "${1:-}" = "--cluster" ]; then
    shift
    cargo build --locked --quiet --features cli --bin lockctl
    out=$(mktemp -d)
    trap 'cleanup; rm -rf "$out"' EXIT
    start_redis
    start_cluster "$out/cluster"
    seeds=()
    for url in "${CLUSTER_URLS[@]}"; do
        seeds+=(--url "$url")
    done
    # A cluster that just started: every slot's epoch without a restart quarantine, as an
    # operator gives one known to be new (else it grants nothing until up the lease limit).
    "${CARGO_TARGET_DIR:-target}"/debug/lockctl --cluster "${seeds[@]}" waive-quarantine >/dev/null
    status=0
    echo "== one redis-server" >&2
    "$lockbench" --redis "$REDIS_URL" --only ours "$@" || status=$?
    echo "== a Redis Cluster of ${#CLUSTER_URLS[@]} masters" >&2
    "$lockbench" --cluster "${seeds[@]/--url/--redis}" "$@" || status=$?
    exit "$status"
fi

if [ "${1:-}" = "--pin" ]; then
    shift
    cores=$(nproc)
    if [ "$cores" -lt 2 ]; then
        echo "--pin needs two cores or more; this machine has $cores" >&2
        exit 2
    fi
    start_redis
    taskset -pc "$((cores - 1))" "${started_pids[-1]}" >/dev/null
    status=0
    taskset -c "0-$((cores - 2))" "$lockbench" --redis "$REDIS_URL" "$@" || status=$?
    exit "$status"
fi

start_redis
status=0
"$lockbench" --redis "$REDIS_URL" "$@" || status=$?

ping() {
    redis-benchmark -p "$REDIS_PORT" -t ping -c 1 -n 20000 -q | tr '\r' '\n' | grep 'requests per second'
}
echo "== redis-benchmark -t ping -c 1 (before)"
ping
LOCK_BENCH_REDIS_URL="$REDIS_URL" cargo bench --locked --bench lock
# The uncontended fast path next to the simplest lock, with heap allocations counted; it
# starts its own server.
cargo bench --locked --bench fast_path
# Each lock kind next to the exclusive lock; it starts its own servers (five for RedLock).
cargo bench --locked --bench kinds
# What one more reader costs a read-write lock 10, 100 and 1,000 readers hold.
cargo bench --locked --bench readers
echo "== redis-benchmark -t ping -c 1 (after)"
ping
exit "$status"
