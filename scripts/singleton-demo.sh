# The --singleton part of demo.sh, sourced by it after redis-server started: three instances
# of the example service running their background jobs, whose leader is killed, paused and
# stopped in turn, then the checker. Uses demo.sh's $bin, $out, $rounds, $REDIS_URL,
# $REDIS_PORT and started_pids; sets $status.

# Starts (or starts again) instance $1, its log appended to $out/$1.log; sets pid_of[$1].
declare -A pid_of
start_instance() {
    "$bin"/examples/axum_tenants --redis "$REDIS_URL" --port 0 --instance "$1" \
        --watchdog-lease-ms 1000 --background-jobs 1000 >>"$out/$1.log" 2>&1 &
    pid_of[$1]=$!
    started_pids+=("$!")
}

# Waits for instance process $1 to end, and leaves it out of the clean-up's list.
reap() {
    wait "$1" 2>/dev/null || true
    local kept=() pid
    for pid in "${started_pids[@]}"; do
        [ "$pid" = "$1" ] || kept+=("$pid")
    done
    started_pids=("${kept[@]}")
}

# The instance that leads the reconciliation loop now ("" while none does): its lock's
# holder is `orders-<instance>.<id>:<holder>`.
leader() {
    redis-cli -p "$REDIS_PORT" HKEYS 'lock:{reconcile-balances}' |
        sed -n 's/^orders-\([abc]\)\..*/\1/p' | head -n 1
}

# Waits up to 15 s (a lease is 1 s; a loaded machine is slow) for a leader other than $1.
await_leader_other_than() {
    local deadline=$((SECONDS + 15)) now
    while ((SECONDS < deadline)); do
        now=$(leader)
        if [ -n "$now" ] && [ "$now" != "$1" ]; then
            echo "$now"
            return 0
        fi
        sleep 0.05
    done
    echo "no new leader within 15 s (the last was $1)" >&2
    return 1
}

for instance in a b c; do
    start_instance "$instance"
done
echo "redis-server on port $REDIS_PORT; three instances with background jobs; $rounds rounds of faults"
current=$(await_leader_other_than "")
status=0
for round in $(seq 1 "$rounds"); do
    pid=${pid_of[$current]}
    case $((round % 3)) in
    1)
        fault="SIGKILL"
        kill -KILL "$pid"
        reap "$pid"
        ;;
    2)
        fault="SIGSTOP for 2.5 s"
        kill -STOP "$pid"
        ;;
    0)
        fault="SIGTERM"
        kill -TERM "$pid"
        ;;
    esac
    next=$(await_leader_other_than "$current") || { status=1; break; }
    case $((round % 3)) in
    1) start_instance "$current" ;;
    2)
        sleep 2.5
        kill -CONT "$pid"
        ;;
    0)
        reap "$pid"
        start_instance "$current"
        ;;
    esac
    echo "round $round: $fault to the leader $current; $next leads now"
    current=$next
done
# Every instance stops gracefully, handing over what it leads, before the check.
for instance in a b c; do
    kill -TERM "${pid_of[$instance]}" 2>/dev/null || true
done
for instance in a b c; do
    reap "${pid_of[$instance]}"
done
"$bin"/examples/singleton_check --redis "$REDIS_URL" --min-changes "$rounds" \
    "$out"/a.log "$out"/b.log "$out"/c.log || status=1
