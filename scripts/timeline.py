#!/usr/bin/env python3
"""Where a request's time goes: reads the files that UPRIGHT_TIMELINE_DIR made
(crates/node/src/timeline.rs) and prints, for the middle half of the requests,

1. the median time from the client's send to each step of the normal case, per replica;
2. per link, how long PRE-PREPARE, PREPARE and COMMIT took from the sender's routing to the
   receiver's handling (a hop: the sender's write, the wakeup, the receiver's read);
3. the log flushes (a `sync-start` .. `sync-end` longer than 20 us is one with an fsync);
4. for the Redis gateway, the phase between an answer and the next operation (writing the
   replies, the clients sending their next commands).

Usage:
    mkdir /tmp/tl && UPRIGHT_TIMELINE_DIR=/tmp/tl upright demo --port 6390 &
    redis-benchmark -p 6390 -t set -n 100000 -c 16
    kill %1; python3 scripts/timeline.py /tmp/tl
"""

import collections
import glob
import os
import re
import sys


def load(directory):
    """{label: [(t_ns, event, a, b, c)]} for the files in `directory`."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.timeline"))):
        label = re.sub(r"-\d+\.timeline$", "", os.path.basename(path))
        events = out.setdefault(label, [])
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) == 5:
                    events.append((int(p[0]), p[1], int(p[2]), int(p[3]), int(p[4])))
        events.sort()
    return out


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def show(name, values):
    if not values:
        print(f"  {name:44s} -")
        return
    us = [v / 1000 for v in values]
    print(f"  {name:44s} p10 {pct(us, .1):7.1f}  p50 {pct(us, .5):7.1f}  p90 {pct(us, .9):7.1f}  (n={len(us)})")


def first(events, name, key):
    d = {}
    for t, e, a, b, c in events:
        if e == name:
            d.setdefault(key(a, b, c), t)
    return d


def main(directory):
    tl = load(directory)
    replicas = sorted(k for k in tl if k.startswith("replica-"))
    clients = [k for k in tl if k.startswith("client")]
    if not replicas or not clients:
        sys.exit(f"{directory}: no replica-*.timeline or client-*.timeline files")
    cl = [e for k in clients for e in tl[k]]
    cl.sort()
    sent = first(cl, "client-send", lambda a, b, c: (a, b))
    delivered = first(cl, "client-deliver", lambda a, b, c: (a, b))
    primary = max(replicas, key=lambda r: sum(1 for e in tl[r] if e[1] == "send-pre-prepare"))
    entry = {}
    for t, e, a, b, c in tl[primary]:
        if e == "entry":
            entry.setdefault((b, c), a)
    keys = sorted((k for k in sent if k in delivered and k in entry), key=lambda k: sent[k])
    keys = keys[len(keys) // 4: len(keys) * 3 // 4]
    print(f"{len(keys)} requests (middle half); primary {primary}")

    def rel(table, key_of):
        return [table[key_of(k)] - sent[k] for k in keys if key_of(k) in table]

    print("\n1. time since the client's send (us)")
    show("client-deliver", rel(delivered, lambda k: k))
    for r in replicas:
        show(f"{r} recv-client-request", rel(first(tl[r], "recv-client-request", lambda a, b, c: (a, b)), lambda k: k))
    rows = collections.defaultdict(list)
    for t, e, a, b, c in tl[primary]:
        if e == "auth-item":
            rows[(a, b)].append(t)
    for i in range(3):
        show(f"{primary} auth row #{i + 1} (its own or a peer's)", [sorted(rows[k])[i] - sent[k] for k in keys if len(rows[k]) > i])
    seq = lambda k: entry[k]
    for r in replicas:
        if r == primary:
            show(f"{r} send-pre-prepare", rel(first(tl[r], "send-pre-prepare", lambda a, b, c: a), seq))
            continue
        show(f"{r} recv-pre-prepare", rel(first(tl[r], "recv-pre-prepare", lambda a, b, c: a), seq))
    for step in ("send-prepare", "send-commit", "local-next-batch"):
        for r in replicas:
            show(f"{r} {step}", rel(first(tl[r], step, lambda a, b, c: a), seq))
    reply_at = {r: first(tl[r], "send-reply", lambda a, b, c: (c, b)) for r in replicas}
    for r in replicas:
        show(f"{r} send-reply", rel(reply_at[r], lambda k: k))

    print("\n2. hops: sender routes -> receiver handles (us)")
    sends, recvs = {}, {}
    for r in replicas:
        me = 1000 + int(r.split("-")[1])
        for t, e, a, b, c in tl[r]:
            for kind in ("pre-prepare", "prepare", "commit"):
                if e == "send-" + kind:
                    sends.setdefault((kind, a, me, c), t)
                elif e == "recv-" + kind:
                    recvs.setdefault((kind, a, c, me), t)
    links = collections.defaultdict(list)
    for k, t in sends.items():
        if k in recvs:
            links[(k[0], k[2] - 1000, k[3] - 1000)].append(recvs[k] - t)
    for (kind, a, b), v in sorted(links.items()):
        if len(v) > 100:
            show(f"{kind} replica {a} -> {b}", v)

    print("\n3. log flushes with an fsync (sync-start .. sync-end > 20 us)")
    for r in replicas:
        start, took = None, []
        for t, e, a, b, c in tl[r]:
            if e == "sync-start":
                start = t
            elif e == "sync-end" and start is not None:
                if t - start > 20_000:
                    took.append(t - start)
                start = None
        show(f"{r}", took)

    answers = [i for i, e in enumerate(cl) if e[1] == "gateway-answer"]
    if answers:
        print("\n4. gateway: from an answer to the next operation (us)")
        phases = collections.defaultdict(list)
        for i in answers[1:-1]:
            t0 = cl[i][0]
            writes, reads, j = [], [], i + 1
            while j < len(cl) and cl[j][1] != "gateway-op":
                if cl[j][1] == "gateway-write":
                    writes.append(cl[j][0])
                elif cl[j][1] == "gateway-read":
                    reads.append(cl[j][0])
                j += 1
            if j == len(cl) or not writes or not reads:
                continue
            phases["last reply written"].append(writes[-1] - t0)
            phases["first next command read"].append(reads[0] - t0)
            phases["last next command read"].append(reads[-1] - t0)
            phases["next operation sent"].append(cl[j][0] - t0)
            phases["commands per operation (count, not us)"].append(cl[j][2] * 1000)
        for name, v in phases.items():
            show(name, v)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
