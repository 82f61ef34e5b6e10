#!/usr/bin/env bash
# The same ZooKeeper client program (upright zk-bench) against upright-zk (upright demo --service
# zk: u = r = 1, 4 replicas, fsync on every batch) and against Apache ZooKeeper (a 3-server
# ensemble of Debian's zookeeper package on this host, fsync on every transaction), in one run:
# 1 KiB creates and setData, getData, and a 90/10 getData/setData mix at 1, 16 and 64 clients.
#
#   scripts/zk-benchmark.sh [SECONDS] [CLIENTS] [OUT_DIR]
#
# Defaults: 5-second windows (after 1 s of warm-up), clients 1,16,64, results in
# target/zk-bench/: results.jsonl (one line per point), table.md (with the ratio to
# ZooKeeper) and throughput.svg. Needs: cargo, java, Debian's zookeeper (apt-get install
# zookeeper).
set -euo pipefail

SECONDS_PER_POINT=${1:-5}
CLIENTS=${2:-1,16,64}
OUT=${3:-target/zk-bench}
WORKLOADS=create,set,get,mix
ZK_SERVER=/usr/share/zookeeper/bin/zkServer.sh
UPRIGHT_PORT=${UPRIGHT_PORT:-22181}
ZK_BASE=${ZK_BASE:-22281}

cd "$(dirname "$0")/.."
[ -x "$ZK_SERVER" ] || { echo "needs Apache ZooKeeper: apt-get install zookeeper" >&2; exit 2; }
cargo build --release -q -p upright-cli
UPRIGHT=target/release/upright
mkdir -p "$OUT"
rm -f "$OUT/results.jsonl"
WORK=$(mktemp -d /tmp/zk-bench.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_ruok() { # host port
    for _ in $(seq 1 120); do
        if [ "$( (exec 3<>/dev/tcp/127.0.0.1/"$1" && printf ruok >&3 && timeout 2 cat <&3) 2>/dev/null || true)" = imok ]; then
            return 0
        fi
        sleep 0.5
    done
    echo "nothing answers ruok on port $1" >&2
    return 1
}

echo "== upright-zk: upright demo --service zk --port $UPRIGHT_PORT"
"$UPRIGHT" demo --service zk --port "$UPRIGHT_PORT" > "$WORK/demo.log" 2>&1 &
DEMO=$!
PIDS+=("$DEMO")
wait_ruok "$UPRIGHT_PORT"
"$UPRIGHT" zk-bench --servers "127.0.0.1:$UPRIGHT_PORT" --clients "$CLIENTS" --workload "$WORKLOADS" \
    --seconds "$SECONDS_PER_POINT" --label upright-zk --json "$OUT/results.jsonl"
kill -INT "$DEMO"
wait "$DEMO" || true

echo "== Apache ZooKeeper: 3-server ensemble on ports $ZK_BASE..$((ZK_BASE + 2))"
SERVERS=""
for i in 1 2 3; do
    dir="$WORK/zk$i"
    mkdir -p "$dir/data"
    echo "$i" > "$dir/data/myid"
    {
        echo "tickTime=2000"
        echo "initLimit=10"
        echo "syncLimit=5"
        echo "dataDir=$dir/data"
        echo "clientPort=$((ZK_BASE + i - 1))"
        echo "maxClientCnxns=0"
        echo "admin.enableServer=false"
        echo "4lw.commands.whitelist=ruok,srvr,stat,mntr"
        for j in 1 2 3; do
            echo "server.$j=127.0.0.1:$((ZK_BASE + 1000 + j)):$((ZK_BASE + 2000 + j))"
        done
    } > "$dir/zoo.cfg"
    cp /etc/zookeeper/conf/log4j.properties "$dir/" 2>/dev/null || true
    ZOOCFGDIR="$dir" ZOO_LOG_DIR="$dir" SERVER_JVMFLAGS="-Xmx1g" \
        "$ZK_SERVER" start-foreground "$dir/zoo.cfg" > "$dir/out.log" 2>&1 &
    PIDS+=("$!")
    SERVERS="$SERVERS${SERVERS:+,}127.0.0.1:$((ZK_BASE + i - 1))"
done
for i in 1 2 3; do wait_ruok $((ZK_BASE + i - 1)); done
# ruok answers before the ensemble has a leader: wait until one server says it leads.
for _ in $(seq 1 120); do
    if for i in 1 2 3; do exec 3<>/dev/tcp/127.0.0.1/$((ZK_BASE + i - 1)); printf srvr >&3; timeout 2 cat <&3; done 2>/dev/null | grep -q "Mode: leader"; then
        break
    fi
    sleep 0.5
done
"$UPRIGHT" zk-bench --servers "$SERVERS" --clients "$CLIENTS" --workload "$WORKLOADS" \
    --seconds "$SECONDS_PER_POINT" --label zookeeper --json "$OUT/results.jsonl"

python3 scripts/zk_bench_report.py "$OUT/results.jsonl" "$OUT/table.md" "$OUT/throughput.svg"
cat "$OUT/table.md"
