# Shared by the scripts: start a throw-away redis-server on a free port, and clean up.
# Sourced, not run. Never touches port 6379 or a server it did not start.

started_pids=()

# Kills every process this script started, by its id.
cleanup() {
    local pid
    for pid in "${started_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${started_pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT

# Starts redis-server on a random free port; sets REDIS_PORT and REDIS_URL. Arguments, if
# any, are a command that runs the server (e.g. `valgrind --tool=callgrind`).
start_redis() {
    local attempt port pid
    for attempt in 1 2 3 4 5; do
        port=$((20000 + RANDOM % 40000))
        if redis-cli -p "$port" ping >/dev/null 2>&1; then
            continue # taken by someone else's server
        fi
        "$@" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
            --daemonize no --loglevel warning >/dev/null 2>&1 &
        pid=$!
        for _ in $(seq 1 100); do
            if ! kill -0 "$pid" 2>/dev/null; then
                break # it exited: the port was taken, try another
            fi
            if redis-cli -p "$port" ping >/dev/null 2>&1; then
                # A server that just started: its epoch without a restart quarantine (else it
                # grants nothing until up the lease limit), as an operator gives a server
                # known to be new (`lockctl waive-quarantine`).
                redis-cli -p "$port" SET lock:epoch "$(date +%s%6N) 0 0" >/dev/null
                started_pids+=("$pid")
                REDIS_PORT=$port
                REDIS_URL="redis://127.0.0.1:$port"
                return 0
            fi
            sleep 0.05
        done
        kill "$pid" 2>/dev/null || true
    done
    echo "could not start redis-server" >&2
    return 1
}

# Starts a cluster-enabled redis-server on a free port, in a directory of its own under $1,
# run under the command and arguments that follow (none: redis-server alone); sets NODE_PORT.
# Fails when the port was taken (the caller tries another).
start_cluster_node() {
    local dir=$1 port pid
    shift
    port=$((20000 + RANDOM % 40000))
    if redis-cli -p "$port" ping >/dev/null 2>&1; then
        return 1 # taken by someone else's server
    fi
    mkdir -p "$dir/$port"
    (cd "$dir/$port" && exec "$@" redis-server --port "$port" --bind 127.0.0.1 --save "" \
        --appendonly no --daemonize no --loglevel warning --cluster-enabled yes \
        --cluster-config-file nodes.conf) >/dev/null 2>&1 &
    pid=$!
    # Up to 10 s: a node run under callgrind starts slowly.
    for _ in $(seq 1 200); do
        kill -0 "$pid" 2>/dev/null || break
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 0.05
    done
    if redis-cli -p "$port" ping >/dev/null 2>&1; then
        started_pids+=("$pid")
        NODE_PORT=$port
        return 0
    fi
    kill "$pid" 2>/dev/null || true
    return 1
}

# Waits until the cluster node on port $1 says the cluster is up.
await_cluster_ok() {
    for _ in $(seq 1 200); do
        redis-cli -p "$1" cluster info | grep -q cluster_state:ok && return 0
        sleep 0.05
    done
}

# Starts a Redis Cluster of three masters on free ports, each node in a directory of its own
# under $1, joined by `redis-cli --cluster create`; sets CLUSTER_URLS (one per master).
start_cluster() {
    local dir=$1 port ports=() addresses=()
    while [ "${#ports[@]}" -lt 3 ]; do
        start_cluster_node "$dir" || continue
        ports+=("$NODE_PORT")
        addresses+=("127.0.0.1:$NODE_PORT")
    done
    redis-cli --cluster create "${addresses[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
    CLUSTER_URLS=()
    for port in "${ports[@]}"; do
        await_cluster_ok "$port"
        CLUSTER_URLS+=("redis://127.0.0.1:$port")
    done
}

# Starts a Redis Cluster of one master that serves every slot, in a directory of its own
# under $1, run under the command and arguments that follow (as `start_redis` takes them);
# sets REDIS_PORT and REDIS_URL (a seed of the cluster).
start_one_node_cluster() {
    local dir=$1
    shift
    for _ in 1 2 3 4 5; do
        if start_cluster_node "$dir" "$@"; then
            redis-cli -p "$NODE_PORT" cluster addslotsrange 0 16383 >/dev/null
            await_cluster_ok "$NODE_PORT"
            REDIS_PORT=$NODE_PORT
            REDIS_URL="redis://127.0.0.1:$NODE_PORT"
            return 0
        fi
    done
    echo "could not start a cluster node" >&2
    return 1
}

# Installs valgrind when missing, for the scripts that count Redis's instructions under
# callgrind (`$1` names the script). apt's output goes to stderr: their stdout carries results.
ensure_valgrind() {
    local sudo=""
    command -v callgrind_control >/dev/null 2>&1 && return 0
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    echo "$1: installing valgrind" >&2
    $sudo apt-get update >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y valgrind >&2
}

# Dumps the counts of the server `$1` run under callgrind with its files in `$2`, and prints
# the instructions it executed since its counts were last zeroed (`callgrind_control -z`).
callgrind_instructions() {
    local server=$1 dir=$2 dumps
    callgrind_control -d "$server" >/dev/null 2>&1
    # Each dump is a file of its own, numbered from 1: the newest is the count of them.
    dumps=$(find "$dir" -name "callgrind.$server.*" | wc -l)
    awk '/^summary:/ { print $2 }' "$dir/callgrind.$server.$dumps"
}

# Sets `rounds` from the arguments `[--rounds N]` that follow its default `$1`; any other
# argument ends the script with its usage.
rounds_argument() {
    rounds=$1
    shift
    if [ "${1:-}" = "--rounds" ] && [ -n "${2:-}" ]; then
        rounds=$2
    elif [ $# -gt 0 ]; then
        echo "usage: $0 [--rounds N]" >&2
        exit 2
    fi
}
