#!/usr/bin/env bash
# Criterion benches of the lock engine against a throw-away redis-server, next to
# `redis-benchmark -t ping -c 1` on the same server in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/lib.sh
start_redis

ping() {
    redis-benchmark -p "$REDIS_PORT" -t ping -c 1 -n 20000 -q | tr '\r' '\n' | grep 'requests per second'
}
echo "== redis-benchmark -t ping -c 1 (before)"
ping
LOCK_BENCH_REDIS_URL="$REDIS_URL" cargo bench --locked --bench lock -- "$@"
echo "== redis-benchmark -t ping -c 1 (after)"
ping
