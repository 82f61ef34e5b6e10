#!/usr/bin/env bash
# Runs redis-benchmark against `upright demo` (4 replicas, one Redis gateway), redis-server
# (no persistence) and redis-server with `appendfsync always` (the durable baseline), one after
# the other in the same run, and prints one CSV table: test, target, requests/s, p50 ms, p99 ms.
#
#   scripts/redis-benchmark.sh [REQUESTS] [CLIENTS] [TESTS] [PROTOCOLS]
#
# Defaults: 20000 requests, 50 clients (redis-benchmark's default), the tests
# set,get,incr,lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,zpopmin,lrange,mset, and the ordering
# protocol pbft. PROTOCOLS is a comma-separated list of `upright demo --protocol` values (pbft,
# lcr); each runs its own demo, target `upright` for pbft and `upright-<protocol>` otherwise.
# Needs redis-server and redis-benchmark (Debian: redis-server, redis-tools) and a release build
# (cargo build --release). Ports 16390-16392; data in a temporary directory removed at the end.
set -euo pipefail

REQUESTS=${1:-20000}
CLIENTS=${2:-50}
TESTS=${3:-set,get,incr,lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,zpopmin,lrange,mset}
PROTOCOLS=${4:-pbft}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
UPRIGHT=$ROOT/target/release/upright
WORK=$(mktemp -d)
PIDS=()

for tool in redis-server redis-benchmark redis-cli; do
    command -v "$tool" >/dev/null || { echo "redis-benchmark.sh: $tool is not installed" >&2; exit 2; }
done
[ -x "$UPRIGHT" ] || { echo "redis-benchmark.sh: build first: cargo build --release" >&2; exit 2; }

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_port() {
    for _ in $(seq 1 100); do
        redis-cli -p "$1" ping >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "redis-benchmark.sh: nothing answers on port $1" >&2
    exit 1
}

# One target: redis-benchmark's CSV rows (test, rps, avg, min, p50, p95, p99, max) as
# test,target,rps,p50,p99.
measure() {
    local port=$1 target=$2
    redis-cli -p "$port" flushall >/dev/null
    redis-benchmark -p "$port" -n "$REQUESTS" -c "$CLIENTS" -t "$TESTS" --csv 2>/dev/null |
        tail -n +2 | tr -d '"' | awk -F, -v t="$target" '{ printf "%s,%s,%s,%s,%s\n", $1, t, $2, $5, $7 }'
}

echo "test,target,requests_per_s,p50_ms,p99_ms"

for protocol in ${PROTOCOLS//,/ }; do
    target=upright
    [ "$protocol" = pbft ] || target=upright-$protocol
    "$UPRIGHT" demo --port 16390 --protocol "$protocol" >"$WORK/upright-$protocol.log" 2>&1 &
    PIDS+=($!)
    wait_port 16390
    measure 16390 "$target"
    kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
done

redis-server --port 16391 --save "" --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
wait_port 16391
measure 16391 redis-server
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true

mkdir -p "$WORK/aof"
redis-server --port 16392 --save "" --appendonly yes --appendfsync always --dir "$WORK/aof" >"$WORK/redis-aof.log" 2>&1 &
PIDS+=($!)
wait_port 16392
measure 16392 redis-server-appendfsync-always
