#!/usr/bin/env bash
# The floor under a lock's Redis work with its commands as they are: what Redis executes
# (callgrind instructions) for a script call alone, for the acquire's fourteen keys and
# arguments, and for each of the six commands its fast path runs, each inside a script of its
# own with those inputs; then a hand-over between instances, its two calls with their inputs
# and the commands they run. No Lua code of the library runs here, so each sum is what the
# operation with these commands costs Redis at the least, however its Lua is written.
#
#   ./scripts/script-floor.sh [--rounds N]   (default 1000)
#
# Each figure is the difference between N calls (or hand-overs) and 3N, over the 2N between.
# Installs valgrind when missing. Prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/lib.sh
ensure_valgrind script-floor

rounds_argument 1000 "$@"

out=$(mktemp -d)
trap 'cleanup; rm -rf "$out"' EXIT
start_redis valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.%p"
server=${started_pids[-1]}
cli() { redis-cli -p "$REDIS_PORT" "$@"; }

# The inputs of an acquire as the library sends them (names and sizes from a real call): the
# lock, its last grant, queue and waiters' terms, the scope's token counter, the epoch and
# its marker; the wake prefix, the owner, the lease, the mode, the token block, the slower
# paths' terms and whether the lease is within the longest known.
keys=("lock:{floor:0}" "lock:{floor:0}:fence" "lock:{floor:0}:queue" "lock:{floor:0}:waiters"
    "lock:tokens" "lock:epoch" "lock:epoch:1796071595971159:30000")
args=("lock:wake:" "d50dad76f3b1b6e6843357de9c907e48:5" "30000" "join" "17"
    "3000 1796071595971159 30000 60000 no" "yes")
cli HSET "${keys[0]}" holder 1 >/dev/null

# Prints what Redis executed for `n` calls of the script `sha` with the inputs that follow.
measure() {
    local sha=$1 n=$2
    shift 2
    callgrind_control -z "$server" >/dev/null 2>&1
    cli -r "$n" EVALSHA "$sha" "$@" >/dev/null
    callgrind_instructions "$server" "$out"
}

# Prints the instructions per call of `script` (Lua) called with the inputs that follow (the
# count of keys first, as EVALSHA takes them).
per_call() {
    local script=$1 sha first third
    shift
    sha=$(cli SCRIPT LOAD "$script")
    cli -r 20 EVALSHA "$sha" "$@" >/dev/null
    first=$(measure "$sha" "$rounds" "$@")
    third=$(measure "$sha" "$((3 * rounds))" "$@")
    echo $(((third - first) / (2 * rounds)))
}

bare=$(per_call 'return 1' 0)
inputs=$(per_call 'return 1' 7 "${keys[@]}" "${args[@]}")
printf '%-44s %12s\n' "per call" instructions
printf '%-44s %12d\n' "a script call, no inputs" "$bare"
printf '%-44s %12d\n' "the same with the acquire's 14 inputs" "$inputs"
# The fast path's six commands, as acquire.lua and lib/ run them: its one look names the lock
# and the queue once and the epoch and its marker three times each.
exists="redis.call('exists', KEYS[1], KEYS[3], KEYS[6], KEYS[6], KEYS[6], KEYS[7], KEYS[7],"
exists+=" KEYS[7])"
commands=(
    "LASTSAVE|redis.call('lastsave')"
    "EXISTS of 8 keys|$exists"
    "HSET|redis.call('hset', KEYS[1], ARGV[2], '1')"
    "PEXPIRE|redis.call('pexpire', KEYS[1], ARGV[3])"
    "TIME|redis.call('time')"
    "SET ... GET (the token counter)|redis.call('set', KEYS[5], '1796071596334139', 'get')"
)
all=""
sum=0
for command in "${commands[@]}"; do
    name=${command%%|*}
    call=${command#*|}
    all+="$call "
    cost=$(($(per_call "$call return 1" 7 "${keys[@]}" "${args[@]}") - inputs))
    sum=$((sum + cost))
    printf '%-44s %12d\n' "  + $name" "$cost"
done
together=$(per_call "$all return 1" 7 "${keys[@]}" "${args[@]}")
printf '%-44s %12d\n' "the six in one script, with the 14 inputs" "$together"
printf '%-44s %12d\n' "  (the call, its inputs and each command: sum)" "$((inputs + sum))"

# A hand-over between instances: the waiter's look at a held lock (the acquire's inputs, its
# owner seen for the first time) and the holder's release that grants it the lock, each with
# the commands it runs in the library (as MONITOR shows them) and a reply of the same shape.
# The two owners are one here, so that each look and release leave the keys as they found
# them; a subscriber listens on the waiter's wake channel, as its instance does.
waiter="d50dad76f3b1b6e6843357de9c907e48:5"
instance=${waiter%%:*}
look_args=("lock:wake:" "$waiter" "30000" "join" "17" "3000 1796071595971159 30000 60000 no"
    "yes")
release_keys=("${keys[@]:0:5}" "${keys[0]}")
release_args=("lock:wake:" "$waiter" "all" "0")
look="redis.call('lastsave') $exists redis.call('pttl', KEYS[1]) redis.call('time')"
look+=" redis.call('hset', KEYS[1], 'queued', '1', 'queued.2', '1')"
look+=" redis.call('zadd', KEYS[3], 'NX', '1796094512560022', ARGV[2])"
look+=" redis.call('hset', KEYS[4], ARGV[2], '1796094515560 30000 17')"
look+=" redis.call('pexpire', KEYS[3], '6000') redis.call('pexpire', KEYS[4], '6000')"
look+=" return {2, 29000, 1796094512560, 0}"
grant="redis.call('hdel', KEYS[1], ARGV[2], 'queued', 'queued.2') redis.call('time')"
grant+=" local head = redis.call('zpopmin', KEYS[3])[1]"
grant+=" redis.call('hget', KEYS[4], head) redis.call('hdel', KEYS[4], head)"
grant+=" redis.call('hset', KEYS[1], head, '1', 'queued', '1', 'queued.2', '1')"
grant+=" redis.call('pexpire', KEYS[1], '30000')"
grant+=" redis.call('set', KEYS[5], '1796094512562193', 'get')"
grant+=" redis.call('set', KEYS[2], '1796094512562193 1796094512562177 ' .. head, 'px', '30000')"
grant+=" redis.call('publish', ARGV[1] .. '$instance',"
grant+=" head .. ' 1796094512562177 1796094512562 30000 17') return {1, 0}"
bare_look='return {2, 29000, 1796094512560, 0}'
bare_grant='return {1, 0}'

# Quotes each of its arguments for a line redis-cli reads.
quoted() {
    local arg line=""
    for arg in "$@"; do
        line+="\"$arg\" "
    done
    echo "$line"
}

# Prints the instructions per hand-over of the scripts `look` and `release`, each call with
# its inputs, a look then a release, over lines redis-cli reads one at a time.
per_hand_over() {
    local look_sha release_sha lines n first third
    look_sha=$(cli SCRIPT LOAD "$1")
    release_sha=$(cli SCRIPT LOAD "$2")
    lines="$out/hand-over"
    {
        quoted EVALSHA "$look_sha" 7 "${keys[@]}" "${look_args[@]}"
        quoted EVALSHA "$release_sha" 6 "${release_keys[@]}" "${release_args[@]}"
    } >"$lines.one"
    for n in 20 "$rounds" "$((3 * rounds))"; do
        for _ in $(seq "$n"); do cat "$lines.one"; done >"$lines.$n"
    done
    cli <"$lines.20" >/dev/null
    callgrind_control -z "$server" >/dev/null 2>&1
    cli <"$lines.$rounds" >/dev/null
    first=$(callgrind_instructions "$server" "$out")
    callgrind_control -z "$server" >/dev/null 2>&1
    cli <"$lines.$((3 * rounds))" >/dev/null
    third=$(callgrind_instructions "$server" "$out")
    echo $(((third - first) / (2 * rounds)))
}

cli DEL "${keys[0]}" >/dev/null
cli HSET "${keys[0]}" "$waiter" 1 >/dev/null
redis-cli -p "$REDIS_PORT" SUBSCRIBE "lock:wake:$instance" >/dev/null &
subscriber=$!
until [ "$(cli PUBSUB NUMSUB "lock:wake:$instance" | tail -1)" = 1 ]; do
    sleep 0.05
done
calls=$(per_hand_over "$bare_look" "$bare_grant")
whole=$(per_hand_over "$look" "$grant")
kill "$subscriber"
echo
printf '%-44s %12s\n' "per hand-over" instructions
printf '%-44s %12d\n' "its two calls with their inputs and replies" "$calls"
printf '%-44s %12d\n' "the same with their 19 commands" "$whole"
