#!/usr/bin/env bash
# The floor under an uncontended acquire's Redis work with its commands as they are: what Redis
# executes (callgrind instructions) for a script call alone, for the acquire's fourteen keys
# and arguments, and for each of the six commands its fast path runs, each inside a script of
# its own with those inputs. No Lua code of the library runs here, so the sum is what an
# acquire with these commands costs Redis at the least, however its Lua is written.
#
#   ./scripts/script-floor.sh [--rounds N]   (default 1000)
#
# Each figure is the difference between N calls and 3N calls, over the 2N between them.
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
