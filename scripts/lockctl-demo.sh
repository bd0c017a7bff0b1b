#!/usr/bin/env bash
# The lockctl demo (operator tool): processes contend for one lock on a throw-away redis-server.
# Shows the wait, the hand-over with a larger fencing token, a wait that times out, a fixed
# lease that runs out, and force-unlock. Exits non-zero if any step misbehaves.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/lib.sh

cargo build --locked --quiet --features cli --bin lockctl
lockctl="${CARGO_TARGET_DIR:-target}/debug/lockctl"
start_redis
echo "redis-server on port $REDIS_PORT"
out=$(mktemp -d)
trap 'cleanup; rm -rf "$out"' EXIT

fail() {
    echo "demo FAILED: $*" >&2
    exit 1
}
field() { # field NAME JSON-LINE: a number or string value from a flat JSON line
    sed -n "s/.*\"$1\":\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$2"
}

echo "== process A holds 'invoice-42' for 2 s (watchdog lease)"
"$lockctl" --url "$REDIS_URL" hold invoice-42 --for 2s >"$out/a" &
started_pids+=($!)
a_pid=$!
for _ in $(seq 1 200); do grep -q acquired "$out/a" 2>/dev/null && break; sleep 0.05; done
a_acquired=$(head -n 1 "$out/a")
echo "A: $a_acquired"
[ "$(field event "$a_acquired")" = acquired ] || fail "A did not acquire"

echo "== an operator lists the locks and inspects it"
"$lockctl" --url "$REDIS_URL" list
"$lockctl" --url "$REDIS_URL" inspect invoice-42

echo "== process B waits up to 10 s for it"
"$lockctl" --url "$REDIS_URL" hold invoice-42 --for 200ms --wait 10s >"$out/b" &
started_pids+=($!)
b_pid=$!

echo "== process C gives up after 300 ms"
set +e
c_line=$("$lockctl" --url "$REDIS_URL" hold invoice-42 --for 1s --wait 300ms)
c_code=$?
set -e
echo "C: $c_line (exit $c_code)"
[ "$c_code" -eq 3 ] || fail "C should have timed out with exit 3"

wait "$a_pid" || fail "A did not release cleanly"
wait "$b_pid" || fail "B did not finish cleanly"
echo "A: $(tail -n 1 "$out/a")"
b_acquired=$(head -n 1 "$out/b")
echo "B: $b_acquired"
echo "B: $(tail -n 1 "$out/b")"
a_token=$(field token "$a_acquired")
b_token=$(field token "$b_acquired")
[ "$b_token" -gt "$a_token" ] || fail "B's token $b_token is not larger than A's $a_token"
echo "B acquired after A released, after waiting $(field waited_ms "$b_acquired") ms, token $a_token -> $b_token"

echo "== process D takes a fixed 500 ms lease and holds past it"
set +e
d_line=$("$lockctl" --url "$REDIS_URL" hold invoice-42 --for 5s --lease 500ms | tail -n 1)
d_code=$?
set -e
echo "D: $d_line (exit $d_code)"
[ "$d_code" -eq 4 ] || fail "D should have been told its lease was lost (exit 4)"

echo "== process E holds it; an operator force-unlocks it"
"$lockctl" --url "$REDIS_URL" hold invoice-42 --for 30s >"$out/e" &
started_pids+=($!)
for _ in $(seq 1 200); do grep -q acquired "$out/e" 2>/dev/null && break; sleep 0.05; done
"$lockctl" --url "$REDIS_URL" force-unlock invoice-42 --yes
state=$("$lockctl" --url "$REDIS_URL" inspect invoice-42 --json)
echo "$state"
[ "$(field locked "$state")" = false ] || fail "the lock is still held after force-unlock"

echo "demo OK"
