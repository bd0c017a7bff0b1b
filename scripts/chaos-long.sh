#!/usr/bin/env bash
# Long chaos runs (not CI): the chaos suites again and again for a given time, on Redis and on
# Valkey, on one server, a cluster and Sentinel, each run with a seed of its own. Every run
# prints one line (server, suite, seed, seconds, pass or FAIL); a failure also prints its panic,
# its summary and the end of its output, and keeps the whole output and the workers' logs in
# a directory it names; CHAOS_SEED=<seed> with the same suite and server repeats its schedule.
#
#   ./scripts/chaos-long.sh [--minutes N] [--servers redis,valkey] [--suites chaos,chaos_cluster,chaos_sentinel]
#
# Defaults: 30 minutes in all, both servers, the three suites, taken in turn. Each run is the
# suite's own length (90 s on one server, 60 s on a cluster or Sentinel) plus its set-up.
# Each run builds what changed: leave the tree alone while it runs, or a run fails on a build.
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
        CHAOS_KEEP_LOGS=1 CHAOS_SEED=$seed LOCK_TEST_SERVER=$server RUST_BACKTRACE=0 \
            cargo test --locked --all-features --quiet --test "$suite" -- --nocapture \
            >"$out/run" 2>&1 || status=$?
        # The workers' logs of this run (kept for a failure, removed for a pass).
        logs=$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name "${suite//_/-}-*-$seed" -newer "$out" 2>/dev/null)
        runs=$((runs + 1))
        if ((status == 0)); then
            summary=$(grep -m1 '^{' "$out/run" || true)
            echo "$server $suite seed=$seed $((SECONDS - started)) s pass $summary"
            [ -z "$logs" ] || rm -rf $logs
        else
            failures=$((failures + 1))
            echo "$server $suite seed=$seed $((SECONDS - started)) s FAIL (exit $status)"
            # What failed first (the panic, the summary), then the end of the output; the whole
            # output is kept beside the workers' logs.
            # Kept first: a run that failed before any test ran (a build that broke) has no
            # panic to print, and nothing here may end the script before it is kept.
            kept=$(mktemp -d "${TMPDIR:-/tmp}/chaos-long-failed-XXXX")
            cp "$out/run" "$kept/output"
            grep -m3 -E "panicked|^\{|^error" "$out/run" | sed 's/^/    /' || true
            tail -n 20 "$out/run" | sed 's/^/    /' || true
            [ -z "$logs" ] || mv $logs "$kept/"
            echo "    output and logs kept in $kept"
        fi
    done
    round=$((round + 1))
done
echo "chaos-long: $runs runs in $(((SECONDS + 59) / 60)) minutes, $failures failed"
((failures == 0))
