#!/usr/bin/env bash
# The main job: three instances of the axum example behind one throw-away redis-server, and
# a load generator that sends concurrent orders for many tenants (a few hot) spread over the
# instances. It checks per tenant that no two handlers overlapped, that fencing tokens grew
# and that no update was lost, prints a report and a JSON line, and exits non-zero if any
# check failed, then a summary of one instance's lock metrics (its GET /metrics). Every
# process it starts is stopped at the end.
#
# Options go to the load generator, e.g. ./scripts/demo.sh --requests 10000 --concurrency 64
# With --cluster (first), the same runs on a throw-away Redis Cluster of three masters.
# With --limit N (first, or after --cluster), the instances let N orders per tenant in at
# once (LockLayer::limit) and the limit's checker (limitgen) counts, per tenant, the most
# handlers that ran at once across the instances: it fails if one went over N or none
# reached N.
# With --idempotent (first, or after --cluster), the load goes to the instances' idempotent
# route (POST /payments, behind IdempotencyLayer) from idemgen: 1,000 idempotency keys, each
# sent 5 times at once spread over the instances, while it pauses the instances in turn
# (SIGSTOP, 3 times 1.5 s, past their 1 s watchdog lease: a handler loses its lease
# mid-payment). It checks per key that the payment was charged once (its counter in Redis)
# and that every copy got the same status and body (and, when no pause was made, that all
# but one say `idempotent-replayed: true`), and that a key reused with another body gets 422
# from every instance; the JSON line says how often it paused (`"paused"`) beside
# `"executed_more"`, which must be 0. Options after it go to idemgen (e.g. --keys 5000
# --copies 3, or --pauses 0).
# With --singleton, the instances run the service's background jobs (a reconciliation loop
# on one instance at a time, and a balance report once per second of the server's clock),
# and the demo kills (SIGKILL), pauses (SIGSTOP past the 1 s lease) and stops (SIGTERM, a
# hand-over) the instance that leads, again and again (--rounds N, 12 by default), restarting
# the ones it ended. Its checker (singleton_check) then reads the instances' logs and Redis
# and prints one JSON line (leader_changes, overlaps, term_disorder, journal_disorder,
# ticks_run, ticks_twice, ticks_missed, ...), exiting non-zero when two leaders ran at once,
# a stale leader's write landed, a tick ran twice, or the leader changed less than N times.
# The order load is left out in this mode: a killed instance fails the orders it was serving,
# which the order checker counts as failures.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/lib.sh

cluster=false
limit=""
idempotent=false
singleton=false
rounds=12
while [ $# -gt 0 ]; do
    case "$1" in
        --cluster) cluster=true; shift ;;
        --singleton) singleton=true; shift ;;
        --rounds)
            [ $# -ge 2 ] || { echo "--rounds needs a number" >&2; exit 2; }
            rounds=$2
            shift 2
            ;;
        --idempotent) idempotent=true; shift ;;
        --limit)
            [ $# -ge 2 ] || { echo "--limit needs a number" >&2; exit 2; }
            limit=$2
            shift 2
            ;;
        *) break ;;
    esac
done
demos=0
$idempotent && demos=$((demos + 1))
[ -n "$limit" ] && demos=$((demos + 1))
$singleton && demos=$((demos + 1))
if [ "$demos" -gt 1 ]; then
    echo "--idempotent, --limit and --singleton are three demos: pick one" >&2
    exit 2
fi
if $singleton && $cluster; then
    echo "--singleton runs on one redis-server (the tests cover a cluster)" >&2
    exit 2
fi
cargo build --locked --quiet --examples
# Where cargo put them: CARGO_TARGET_DIR when set, as cargo reads it.
bin=${CARGO_TARGET_DIR:-target}/debug
out=$(mktemp -d)
trap 'cleanup; rm -rf "$out"' EXIT
redis_args=()
if $cluster; then
    cargo build --locked --quiet --features cli --bin lockctl
    start_cluster "$out/cluster"
    redis_args+=(--cluster)
    for url in "${CLUSTER_URLS[@]}"; do
        redis_args+=(--redis "$url")
    done
    # A cluster that just started: every slot's epoch without a restart quarantine, as an
    # operator gives one known to be new (else it grants nothing until up the lease limit).
    "$bin"/lockctl "${redis_args[@]/--redis/--url}" waive-quarantine >/dev/null
    where="a Redis Cluster of ${#CLUSTER_URLS[@]} masters"
else
    start_redis
    redis_args+=(--redis "$REDIS_URL")
    where="redis-server on port $REDIS_PORT"
fi

if $singleton; then
    source scripts/singleton-demo.sh
    exit "$status"
fi

limit_args=()
[ -n "$limit" ] && limit_args+=(--limit "$limit")
# The idempotent demo pauses instances past their lease: a short one, renewed every third.
$idempotent && limit_args+=(--watchdog-lease-ms 1000)
targets=()
for instance in a b c; do
    "$bin"/examples/axum_tenants "${redis_args[@]}" ${limit_args[@]+"${limit_args[@]}"} \
        --port 0 --instance "$instance" >"$out/$instance.log" 2>&1 &
    started_pids+=($!)
    addr=""
    for _ in $(seq 1 200); do
        addr=$(sed -n '/"addr":"/{s/.*"addr":"\([^"]*\)".*/\1/p;q}' "$out/$instance.log" 2>/dev/null || true)
        [ -n "$addr" ] && break
        sleep 0.05
    done
    [ -n "$addr" ] || { echo "instance $instance did not start:" >&2; cat "$out/$instance.log" >&2; exit 1; }
    echo "instance $instance listening on $addr"
    targets+=("http://$addr")
done

echo "$where; sending load"
targets_csv=$(IFS=,; echo "${targets[*]}")
status=0
if $idempotent; then
    pids_csv=$(IFS=,; echo "${started_pids[*]: -3}")
    "$bin"/examples/idemgen "${redis_args[@]}" --targets "$targets_csv" \
        --pause-pids "$pids_csv" --pauses 3 "$@" || status=$?
elif [ -n "$limit" ]; then
    "$bin"/examples/limitgen --limit "$limit" --targets "$targets_csv" "$@" || status=$?
else
    "$bin"/examples/loadgen "${redis_args[@]}" --targets "$targets_csv" "$@" || status=$?
fi

# What one instance's lock metrics say after the load: its GET /metrics (Prometheus text),
# counters and gauges whole, the wait and hold times as their count and sum (their buckets
# left out). Every series a client can count starts at 0; those still at 0 are left out here.
echo "lock metrics of instance a (GET ${targets[0]}/metrics), series above 0:"
exec 3<>"/dev/tcp/127.0.0.1/${targets[0]##*:}"
printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
grep -E '^redis_lock_' <&3 | grep -Ev '_bucket\{| 0$' \
    | sed 's/^/  /' || true
exec 3<&-
exit "$status"
