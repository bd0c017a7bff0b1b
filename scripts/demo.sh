#!/usr/bin/env bash
# The main job: three instances of the axum example behind one throw-away redis-server, and
# a load generator that sends concurrent orders for many tenants (a few hot) spread over the
# instances. It checks per tenant that no two handlers overlapped, that fencing tokens grew
# and that no update was lost, prints a report and a JSON line, and exits non-zero if any
# check failed. Every process it starts is stopped at the end.
#
# Options go to the load generator, e.g. ./scripts/demo.sh --requests 10000 --concurrency 64
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/lib.sh

cargo build --locked --quiet --examples
start_redis
out=$(mktemp -d)
trap 'cleanup; rm -rf "$out"' EXIT

targets=()
for instance in a b c; do
    target/debug/examples/axum_tenants --redis "$REDIS_URL" --port 0 --instance "$instance" \
        >"$out/$instance.log" 2>&1 &
    started_pids+=($!)
    addr=""
    for _ in $(seq 1 200); do
        addr=$(sed -n 's/.*"addr":"\([^"]*\)".*/\1/p' "$out/$instance.log" 2>/dev/null | head -n 1)
        [ -n "$addr" ] && break
        sleep 0.05
    done
    [ -n "$addr" ] || { echo "instance $instance did not start:" >&2; cat "$out/$instance.log" >&2; exit 1; }
    echo "instance $instance listening on $addr"
    targets+=("http://$addr")
done

echo "redis-server on port $REDIS_PORT; sending load"
targets_csv=$(IFS=,; echo "${targets[*]}")
target/debug/examples/loadgen --redis "$REDIS_URL" --targets "$targets_csv" "$@"
