#!/usr/bin/env bash
# BFS's benchmark after PBFT's: an Andrew-like and a PostMark-like run through PyPI's libnfs
# (scripts/nfs_bench.py) against three NFSv3 servers on this machine in the same run:
#
#   NO-REP    upright-fs unreplicated: `upright norep --service fs` (the same file system code,
#             in memory, no agreement) behind the standalone gateway `upright nfs`
#   upright   u = r = 1: four `upright replica --service fs` processes (fsync always, loopback
#             TCP) behind the same standalone gateway
#   ganesha   nfs-ganesha 4 (Debian) exporting a directory of this disk through its VFS FSAL,
#             if ganesha.nfsd is installed (it registers with rpcbind, which is started if needed)
#
#   scripts/nfs-bench.sh [ROUNDS] [SCALE] [-- more nfs_bench.py arguments]
#
# Defaults: 3 rounds, scale 1 (20 directories, 200 files, about 1.2 MB of source). Prints each
# round's phases and a Markdown table of medians with ratios to NO-REP; writes nfs-bench.json in
# the current directory. Needs a release build (cargo build --release) and PyPI's libnfs (pip
# install libnfs; Debian's libnfs-dev). Ports 17049 (NO-REP gateway), 17149 (upright gateway),
# 17249-17252 (ganesha), 17300-17500 (the NO-REP server), 17600-17803 (the replicas); data in a
# temporary directory removed at the end. Both gateways keep their request ids durable (an
# fsync per ordered request, as deployed); docs/PERFORMANCE.md "NFS" has a run and its profile.
set -euo pipefail

ROUNDS=${1:-3}
SCALE=${2:-1}
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
UPRIGHT=${UPRIGHT:-$ROOT/target/release/upright}
WORK=$(mktemp -d)
PIDS=()

[ -x "$UPRIGHT" ] || { echo "nfs-bench.sh: build first: cargo build --release" >&2; exit 2; }
python3 -c "import libnfs" 2>/dev/null || { echo "nfs-bench.sh: PyPI's libnfs is not installed (pip install libnfs)" >&2; exit 2; }

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_port() {
    for _ in $(seq 1 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nfs-bench.sh: nothing listens on port $1 (logs in $WORK)" >&2
    tail -n 20 "$WORK"/*.log >&2 || true
    exit 1
}

url() { echo "nfs://127.0.0.1/${2:-}?nfsport=$1&mountport=${3:-$1}&version=3"; }
TARGETS=()

# NO-REP: the same file system unreplicated, behind the same gateway.
"$UPRIGHT" init --replicas 1 --u 0 --r 0 --hosts 127.0.0.1 --clients 4 --base-port 17300 --out "$WORK/norep" >/dev/null
"$UPRIGHT" norep --config "$WORK/norep/cluster.toml" --service fs >"$WORK/norep.log" 2>&1 &
PIDS+=($!)
wait_port 17400
"$UPRIGHT" nfs --client "$WORK/norep/client-0.toml" --listen 127.0.0.1:17049 --pool 4 >"$WORK/norep-gateway.log" 2>&1 &
PIDS+=($!)
wait_port 17049
TARGETS+=("NO-REP=$(url 17049)")

# upright-fs, u = r = 1.
"$UPRIGHT" init --replicas 4 --u 1 --r 1 --hosts 127.0.0.1 --clients 4 --base-port 17600 --out "$WORK/upright" >/dev/null
for id in 0 1 2 3; do
    "$UPRIGHT" replica --config "$WORK/upright/cluster.toml" --id "$id" --service fs >"$WORK/replica-$id.log" 2>&1 &
    PIDS+=($!)
done
for id in 0 1 2 3; do wait_port $((17700 + id)); done
"$UPRIGHT" nfs --client "$WORK/upright/client-0.toml" --listen 127.0.0.1:17149 --pool 4 >"$WORK/upright-gateway.log" 2>&1 &
PIDS+=($!)
wait_port 17149
TARGETS+=("upright=$(url 17149)")

# nfs-ganesha, if installed.
if command -v ganesha.nfsd >/dev/null; then
    pgrep -x rpcbind >/dev/null || rpcbind -w || { echo "nfs-bench.sh: cannot start rpcbind" >&2; exit 1; }
    mkdir -p "$WORK/ganesha-export"
    cat >"$WORK/ganesha.conf" <<EOF
NFS_CORE_PARAM {
  NFS_Port = 17249; MNT_Port = 17250; NLM_Port = 17251; Rquota_Port = 17252;
  Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false;
  Protocols = 3; Bind_addr = 127.0.0.1;
}
NFSV4 { Graceless = true; }
EXPORT {
  Export_Id = 1; Path = $WORK/ganesha-export; Pseudo = $WORK/ganesha-export;
  Access_Type = RW; Squash = No_Root_Squash; Protocols = 3; Transports = TCP; SecType = sys;
  FSAL { Name = VFS; }
}
LOG { Default_Log_Level = WARN; }
EOF
    ganesha.nfsd -F -f "$WORK/ganesha.conf" -L "$WORK/ganesha.log" -p "$WORK/ganesha.pid" >"$WORK/ganesha-out.log" 2>&1 &
    PIDS+=($!)
    wait_port 17249
    TARGETS+=("ganesha=$(url 17249 "${WORK#/}/ganesha-export" 17250)")
else
    echo "nfs-bench.sh: ganesha.nfsd is not installed (Debian: nfs-ganesha nfs-ganesha-vfs); NO-REP and upright only" >&2
fi

python3 "$ROOT/scripts/nfs_bench.py" --rounds "$ROUNDS" --scale "$SCALE" --json nfs-bench.json "$@" "${TARGETS[@]}"
