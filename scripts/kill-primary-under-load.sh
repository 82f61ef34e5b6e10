#!/usr/bin/env bash
# Kills the view-0 primary (replica 0) with SIGKILL six seconds into a 20-second
# `upright bench` run and prints the ops/s of every second, so a view change under load can be
# watched: the cluster should keep ordering after at most a view-change timeout.
#
#   scripts/kill-primary-under-load.sh [PROTOCOL] [WORKLOAD] [CLIENTS]
#
# Defaults: pbft, 4/0, 256. Needs a release build (cargo build --release).
set -euo pipefail
PROTOCOL=${1:-pbft}
WORKLOAD=${2:-4/0}
CLIENTS=${3:-256}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
UPRIGHT=$ROOT/target/release/upright
[ -x "$UPRIGHT" ] || { echo "kill-primary-under-load.sh: build first: cargo build --release" >&2; exit 2; }
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
"$UPRIGHT" bench --workload "$WORKLOAD" --clients "$CLIENTS" --protocol "$PROTOCOL" --fsync never \
    --duration 20s --no-baseline > "$LOG" 2>&1 &
BENCH=$!
for _ in $(seq 1 60); do
    sleep 1
    grep -qE "t= *6\.[0-9]s" "$LOG" && break
done
VICTIM=$(pgrep -f "upright replica .*--id 0\$" | head -1 || true)
if [ -n "$VICTIM" ]; then
    kill -9 "$VICTIM"
    echo "killed replica 0 (pid $VICTIM) at t = 6 s"
else
    echo "replica 0 not found" >&2
fi
wait "$BENCH" || true
echo "ops/s per second: $(grep -E "t= *[0-9.]+s" "$LOG" | awk '{print $(NF-1)}' | tr '\n' ' ')"
