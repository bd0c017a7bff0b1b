#!/usr/bin/env bash
# Redis's own work per lock operation, counted in instructions that redis-server executes
# (callgrind), so the figures do not move with the load on a shared machine as timings do:
# per uncontended acquire + release of this library (16 at once on one client, without and
# with group commit, and one at a time), per hand-over between two instances through Redis, and per acquire + release of a
# plain `SET NX PX` lock with a compare-and-delete release (the commands rslock sends, 16 at
# once and one at a time), with the ratios of ours to it. Each figure is the difference between a run of N rounds and one of
# 3N, over the operations between them, so connecting and warming up cancel out; the
# commands Redis ran (scripts' own included) are counted over the same window.
#
#   ./scripts/redis-work.sh [--cluster] [--rounds N]   (default 100)
#
# With `--cluster` Redis is a cluster of one master that serves every slot, and the locks'
# clients are cluster clients: the same figures for the scripts a cluster runs.
#
# Installs valgrind when missing. Prints a table on stderr and one JSON line on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/lib.sh
ensure_valgrind redis-work

cluster=()
if [ "${1:-}" = "--cluster" ]; then
    cluster=(--cluster)
    shift
fi
rounds_argument 100 "$@"

cargo build --locked --quiet --example redis_work
work=${CARGO_TARGET_DIR:-target}/debug/examples/redis_work
out=$(mktemp -d)
trap 'cleanup; rm -rf "$out"' EXIT
callgrind=(valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.%p")
if [ ${#cluster[@]} -gt 0 ]; then
    start_one_node_cluster "$out/cluster" "${callgrind[@]}"
else
    start_redis "${callgrind[@]}"
fi
server=${started_pids[-1]}

# Runs `workload` for `n` rounds and prints "<operations> <instructions> <commands>": what
# Redis executed between the program's warm-up and the end of its rounds.
count() {
    local workload=$1 n=$2 line operations commands instructions
    coproc WORK { "$work" --redis "$REDIS_URL" "${cluster[@]}" --workload "$workload" --rounds "$n"; }
    read -r line <&"${WORK[0]}"
    [ "$line" = ready ] || { echo "redis_work $workload: $line" >&2; exit 1; }
    callgrind_control -z "$server" >/dev/null 2>&1
    echo go >&"${WORK[1]}"
    read -r line <&"${WORK[0]}"
    instructions=$(callgrind_instructions "$server" "$out")
    echo end >&"${WORK[1]}"
    wait "$WORK_PID"
    read -r _ operations commands <<<"$line"
    echo "$operations $instructions $commands"
}

json="{\"cluster\":$([ ${#cluster[@]} -gt 0 ] && echo true || echo false),\"rounds\":$rounds"
printf '%-19s %14s %12s\n' workload instructions commands >&2
for workload in uncontended group-commit one-at-a-time hand-over peer peer-one-at-a-time; do
    # Assigned first, so that a run that failed ends the script (`set -e`).
    once=$(count "$workload" "$rounds")
    thrice=$(count "$workload" "$((3 * rounds))")
    read -r ops1 ir1 cmds1 <<<"$once"
    read -r ops3 ir3 cmds3 <<<"$thrice"
    per_op=$(((ir3 - ir1) / (ops3 - ops1)))
    commands=$(awk -v a="$cmds1" -v b="$cmds3" -v n="$((ops3 - ops1))" \
        'BEGIN { printf "%.2f", (b - a) / n }')
    printf '%-19s %14d %12s\n' "$workload" "$per_op" "$commands" >&2
    key=${workload//-/_}
    json+=",\"${key}_instructions\":$per_op,\"${key}_commands\":$commands"
    declare "per_op_$key=$per_op"
done
ratio=$(awk -v a="$per_op_uncontended" -v b="$per_op_peer" 'BEGIN { printf "%.3f", a / b }')
group_ratio=$(awk -v a="$per_op_group_commit" -v b="$per_op_peer" 'BEGIN { printf "%.3f", a / b }')
one_ratio=$(awk -v a="$per_op_one_at_a_time" -v b="$per_op_peer_one_at_a_time" \
    'BEGIN { printf "%.3f", a / b }')
echo "instructions per uncontended acquire + release against the peer's:" \
    "$ratio (16 at once), $group_ratio (with group commit), $one_ratio (one at a time)" >&2
echo "$json,\"uncontended_vs_peer\":$ratio,\"group_commit_vs_peer\":$group_ratio,\"one_at_a_time_vs_peer\":$one_ratio}"
