#!/usr/bin/env bash
# The same WebHDFS client program (upright hdfs-bench) against UpRight-HDFS (upright demo
# --service hdfs: 4 NameNode replicas at u = r = 1, 3 DataNodes, the WebHDFS gateway) and
# against Apache HDFS (Hadoop's MiniDFSCluster from Maven Central: 1 NameNode, 3 DataNodes in
# one JVM) twice: with HDFS's defaults (a DataNode does not sync a block to disk when it is
# closed) and with dfs.datanode.synconclose (it does, as upright's DataNodes always do); all on
# this host, in one run: writes and reads of 64 MiB, 256 MiB and 1 GiB files
# by several clients, replication 3, every byte checked on read. The two systems are measured in
# turn, ROUNDS times each, the medians tabled with their ratio.
#
#   scripts/hdfs-bench.sh [ROUNDS] [OUT_DIR]
#
# Defaults: 3 rounds, results in target/hdfs-bench/: results.jsonl (one line per phase) and
# table.md. Needs: cargo, java and mvn (the minicluster jars are fetched on the first run).
set -euo pipefail

ROUNDS=${1:-3}
OUT=${2:-target/hdfs-bench}
UPRIGHT_PORT=${UPRIGHT_PORT:-29870}
HDFS_PORT=${HDFS_PORT:-29880}
HDFS_SYNC_PORT=${HDFS_SYNC_PORT:-29881}
# size in MiB : clients : files per client
POINTS=${POINTS:-"64:4:2 256:4:1 1024:2:1"}

cd "$(dirname "$0")/.."
cargo build --release -q -p upright-cli
UPRIGHT=target/release/upright
JARS=target/hadoop-minicluster
if ! ls "$JARS"/hadoop-client-minicluster-*.jar >/dev/null 2>&1; then
    echo "== fetching Hadoop's MiniDFSCluster jars into $JARS"
    mvn -q -B --no-transfer-progress -Dstyle.color=never -f scripts/hadoop/minicluster/pom.xml \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$PWD/$JARS"
fi
mkdir -p "$OUT"
rm -f "$OUT/results.jsonl"
WORK=$(mktemp -d /tmp/hdfs-bench.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_line() { # file text seconds
    for _ in $(seq 1 $(($3 * 2))); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.5
    done
    echo "no \"$2\" in $1 after $3 s:" >&2
    tail -20 "$1" >&2
    return 1
}

echo "== UpRight-HDFS: upright demo --service hdfs --port $UPRIGHT_PORT"
"$UPRIGHT" demo --service hdfs --port "$UPRIGHT_PORT" > "$WORK/demo.log" 2>&1 &
DEMO=$!
PIDS+=("$DEMO")
wait_line "$WORK/demo.log" "WebHDFS on" 120

echo "== Apache HDFS: MiniDFSCluster, WebHDFS on port $HDFS_PORT; with synconclose on port $HDFS_SYNC_PORT"
java -cp "$JARS/*" scripts/hadoop/MiniHdfs.java "$HDFS_PORT" "$WORK/minidfs" 3 > "$WORK/minidfs.log" 2>&1 &
MINI=$!
PIDS+=("$MINI")
wait_line "$WORK/minidfs.log" "MiniDFSCluster ready" 180
java -cp "$JARS/*" scripts/hadoop/MiniHdfs.java "$HDFS_SYNC_PORT" "$WORK/minidfs-sync" 3 sync > "$WORK/minidfs-sync.log" 2>&1 &
MINI_SYNC=$!
PIDS+=("$MINI_SYNC")
wait_line "$WORK/minidfs-sync.log" "MiniDFSCluster ready" 180

for point in $POINTS; do
    IFS=: read -r mib clients files <<< "$point"
    for round in $(seq 1 "$ROUNDS"); do
        echo "== ${mib} MiB x ${clients} clients x ${files} files, round $round"
        # Each system starts with nothing of another's left to write back (HDFS without
        # synconclose leaves its blocks to the kernel, and whoever runs next would pay).
        sync
        "$UPRIGHT" hdfs-bench --url "http://127.0.0.1:$UPRIGHT_PORT" --clients "$clients" --files "$files" \
            --file-mib "$mib" --label upright-hdfs --server-pid "$DEMO" --json "$OUT/results.jsonl" | tail -2
        sync
        "$UPRIGHT" hdfs-bench --url "http://127.0.0.1:$HDFS_PORT" --clients "$clients" --files "$files" \
            --file-mib "$mib" --label hdfs --server-pid "$MINI" --json "$OUT/results.jsonl" | tail -2
        sync
        "$UPRIGHT" hdfs-bench --url "http://127.0.0.1:$HDFS_SYNC_PORT" --clients "$clients" --files "$files" \
            --file-mib "$mib" --label hdfs-sync --server-pid "$MINI_SYNC" --json "$OUT/results.jsonl" | tail -2
    done
done

python3 - "$OUT/results.jsonl" > "$OUT/table.md" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
points = sorted({(r["file_mib"], r["clients"], r["files"]) for r in rows})
print("| clients x files x size | phase | UpRight-HDFS MiB/s | HDFS MiB/s | ratio | HDFS synconclose MiB/s | ratio | CPU s/GiB: UpRight-HDFS / HDFS / synconclose |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for mib, clients, files in points:
    for phase in ("write", "read"):
        def pick(label, key):
            vals = [r[key] for r in rows if r["label"] == label and r["phase"] == phase
                    and (r["file_mib"], r["clients"], r["files"]) == (mib, clients, files) and r[key] is not None]
            return statistics.median(vals) if vals else float("nan")
        gib = clients * files * mib / 1024
        u, h, s = (pick(l, "mib_per_s") for l in ("upright-hdfs", "hdfs", "hdfs-sync"))
        cpu = " / ".join(f"{pick(l, 'server_cpu_s') / gib:.2f}" for l in ("upright-hdfs", "hdfs", "hdfs-sync"))
        print(f"| {clients} x {files} x {mib} MiB | {phase} | {u:.0f} | {h:.0f} | {u / h:.2f} | {s:.0f} | {u / s:.2f} | {cpu} |")
PY
cat "$OUT/table.md"
