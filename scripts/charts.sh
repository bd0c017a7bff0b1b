#!/usr/bin/env bash
# The charts of docs/benchmarks.md, in one command: runs the load benchmark (tools/lockbench)
# on a throw-away redis-server, this library (`ours`, `ours-pw`) against rslock on three
# workloads, keeps its JSON lines in docs/charts/lockbench.jsonl, then draws them into
# docs/charts/*.svg with `lockbench charts`.
#
#   ./scripts/charts.sh                 # run the benchmark, keep its data, draw the charts
#   ./scripts/charts.sh --from FILE     # redraw from kept data, without running anything
#
# The data's first line says where it came from (date, commit, whether the code it was built
# from had uncommitted changes, Redis's version), so each chart's caption can; every line
# lockbench prints carries the load average at its start, which the caption gives too.
# lockbench waits up to 120 s for the load to fall first (the build just before raises it).
# The kept data is replaced only when the benchmark ran to its end; the script exits with
# lockbench's status (1: a mutual-exclusion violation, whose data and charts are kept).
set -euo pipefail

from=
if [ "${1:-}" = "--from" ]; then
    if [ "$#" -lt 2 ]; then
        echo "usage: ./scripts/charts.sh [--from FILE]: --from needs a file" >&2
        exit 2
    fi
    from=$2
    shift 2
    # Relative to where the script was called from, not to the repository it moves to.
    [[ "$from" = /* ]] || from=$PWD/$from
fi
if [ "$#" -gt 0 ]; then
    echo "usage: ./scripts/charts.sh [--from FILE]" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
out=docs/charts

# Release build: the figures are timings. `--target-dir` wins over CARGO_TARGET_DIR, so the
# binary is always here.
cargo build --release --locked --manifest-path tools/lockbench/Cargo.toml --target-dir target
lockbench=target/release/lockbench

status=0
if [ -z "$from" ]; then
    ./scripts/setup.sh
    source scripts/lib.sh
    mkdir -p "$out"
    data=$(mktemp)
    trap 'cleanup; rm -f "$data"' EXIT
    dirty=false
    # What the benchmark is built from; the docs and the charts themselves do not count.
    if [ -n "$(git status --porcelain -- src tools Cargo.toml Cargo.lock 2>/dev/null)" ]; then
        dirty=true
    fi
    printf '{"kind":"source","date":"%s","commit":"%s","uncommitted_changes":%s,"redis":"%s"}\n' \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
        "$dirty" \
        "$(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')" >"$data"
    start_redis
    "$lockbench" --redis "$REDIS_URL" --only ours,ours-pw,rslock \
        --workload uncontended-w1,uncontended-w16,contended-w8 \
        --reps 3 --seconds 3 --wait-quiet 120 >>"$data" || status=$?
    # The server is not needed for the drawing: stop it now (lib.sh's cleanup kills what
    # this script started, by its id), and empty the list so the exit trap has nothing left.
    cleanup
    started_pids=()
    if [ "$status" -ne 0 ] && [ "$status" -ne 1 ]; then
        echo "charts: lockbench failed (exit $status); $out/lockbench.jsonl left as it was" >&2
        exit "$status"
    fi
    # Written over, not copied: mktemp's file is private, the kept data is not.
    cat "$data" >"$out/lockbench.jsonl"
    from=$out/lockbench.jsonl
fi

"$lockbench" charts --from "$from" --out "$out"
exit "$status"
