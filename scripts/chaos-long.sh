#!/usr/bin/env bash
# Long chaos runs (not CI): the chaos suites again and again for a given time, on Redis and on
# Valkey, on one server, a cluster and Sentinel, each run with a seed of its own. Every run
# prints one line (server, suite, seed, seconds, pass or FAIL); a failure also prints the end
# of its output, and CHAOS_SEED=<seed> with the same suite and server repeats its schedule.
#
#   ./scripts/chaos-long.sh [--minutes N] [--servers redis,valkey] [--suites chaos,chaos_cluster,chaos_sentinel]
#
# Defaults: 30 minutes in all, both servers, the three suites, taken in turn. Each run is the
# suite's own length (90 s on one server, 60 s on a cluster or Sentinel) plus its set-up.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=30
servers=redis,valkey
suites=chaos,chaos_cluster,chaos_sentinel
while (($#)); do
    case "$1" in
    --minutes) minutes=$2 ;;
    --servers) servers=$2 ;;
    --suites) suites=$2 ;;
    *)
        echo "chaos-long: unknown argument $1" >&2
        exit 2
        ;;
    esac
    shift 2
done
IFS=, read -r -a server_list <<<"$servers"
IFS=, read -r -a suite_list <<<"$suites"

./scripts/setup.sh
cargo build --locked --all-features --examples --quiet
cargo test --locked --all-features --no-run --quiet "${suite_list[@]/#/--test=}"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
deadline=$((SECONDS + minutes * 60))
runs=0
failures=0
round=0
while ((SECONDS < deadline)); do
    for server in "${server_list[@]}"; do
        suite=${suite_list[round % ${#suite_list[@]}]}
        ((SECONDS < deadline)) || break
        seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
        started=$SECONDS
        status=0
        CHAOS_SEED=$seed LOCK_TEST_SERVER=$server cargo test --locked --all-features --quiet \
            --test "$suite" -- --nocapture >"$out/run" 2>&1 || status=$?
        runs=$((runs + 1))
        if ((status == 0)); then
            summary=$(grep -m1 '^{' "$out/run" || true)
            echo "$server $suite seed=$seed $((SECONDS - started)) s pass $summary"
        else
            failures=$((failures + 1))
            echo "$server $suite seed=$seed $((SECONDS - started)) s FAIL (exit $status)"
            tail -n 40 "$out/run" | sed 's/^/    /'
        fi
    done
    round=$((round + 1))
done
echo "chaos-long: $runs runs in $(((SECONDS + 59) / 60)) minutes, $failures failed"
((failures == 0))
