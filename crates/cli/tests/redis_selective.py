"""Real-client checks for the upright Redis gateway in front of a cluster with selective execution
(each command on keys runs on the two execution replicas that maintain them): the Python `redis`
package with every data type, expiry, pipelines, MULTI/EXEC and pub/sub, and the clear errors for
what selective execution refuses (blocking commands, WATCH, keyspace notifications, replies over
256 KiB to commands on keys). Usage: redis_selective.py PORT. Exits non-zero on the first
mismatch."""
import sys
import time

import redis

port = int(sys.argv[1])


def check(got, want, what):
    if got != want:
        print(f"MISMATCH {what}: got {got!r}, want {want!r}")
        sys.exit(1)


def refused(call, what):
    try:
        call()
    except redis.ResponseError as e:
        if "not available under selective execution" not in str(e):
            print(f"MISMATCH {what}: refused with {e!r}")
            sys.exit(1)
        return
    print(f"MISMATCH {what}: not refused")
    sys.exit(1)


for proto in (2, 3):
    r = redis.Redis(host="127.0.0.1", port=port, protocol=proto, socket_timeout=60)
    p = f"sel{proto}:"
    check(r.ping(), True, "ping")
    check(r.set(p + "a", "1"), True, "set")
    check(r.get(p + "a"), b"1", "get")
    check(r.incrby(p + "n", 41), 41, "incrby")
    check(r.append(p + "a", "xyz"), 4, "append")
    check(r.mset({p + "m1": "x", p + "m2": "y"}), True, "mset")
    check(r.mget([p + "m1", p + "nope", p + "m2"]), [b"x", None, b"y"], "mget")
    check(r.rpush(p + "l", "a", "b", "c"), 3, "rpush")
    check(r.lrange(p + "l", 0, -1), [b"a", b"b", b"c"], "lrange")
    check(r.sadd(p + "s", "x", "y", "z"), 3, "sadd")
    check(r.smembers(p + "s"), {b"x", b"y", b"z"}, "smembers")
    popped = r.spop(p + "s")
    check(popped in (b"x", b"y", b"z") and r.scard(p + "s") == 2, True, "spop")
    check(r.hset(p + "h", mapping={"f": "1", "g": "2"}), 2, "hset")
    check(r.hgetall(p + "h"), {b"f": b"1", b"g": b"2"}, "hgetall")
    check(r.zadd(p + "z", {"a": 1, "b": 2}), 2, "zadd")
    zrange = [tuple(pair) for pair in r.zrange(p + "z", 0, -1, withscores=True)]
    check(zrange, [(b"a", 1.0), (b"b", 2.0)], "zrange")
    check(r.rename(p + "a", p + "a2"), True, "rename across keys")
    check(r.get(p + "a2"), b"1xyz", "renamed")

    # Expiry by agreed time: a short one passes, a long one stays.
    check(r.set(p + "short", "v", px=300), True, "set px")
    check(r.set(p + "long", "v", ex=100), True, "set ex")
    time.sleep(0.8)
    check(r.get(p + "short"), None, "expired key is gone")
    check(r.exists(p + "short"), 0, "expired key does not exist")
    check(r.ttl(p + "long") in (99, 100), True, "ttl of the long one")

    # Whole-store commands run on every replica.
    keys = sorted(r.keys(p + "*"))
    check(p.encode() + b"short" in keys, False, "keys leaves out the expired key")
    check(sorted(r.scan_iter(match=p + "*", count=3)), keys, "scan_iter")

    # Pipelined, and as a transaction (MULTI/EXEC, no WATCH).
    pipe = r.pipeline(transaction=False)
    for i in range(100):
        pipe.incr(p + "pipe")
        pipe.set(f"{p}k{i}", str(i))
        pipe.get(f"{p}k{i}")
    out = pipe.execute()
    for i in range(100):
        check(out[3 * i : 3 * i + 3], [i + 1, True, str(i).encode()], f"pipelined {i}")
    tx = r.pipeline(transaction=True)
    tx.incr(p + "tx")
    tx.incr(p + "tx")
    tx.get(p + "tx")
    check(tx.execute(), [1, 2, b"2"], "multi/exec")

    # Pub/sub: PUBLISH and subscriptions are global, so their pushes are numbered alike.
    other = redis.Redis(host="127.0.0.1", port=port, protocol=proto, socket_timeout=60)
    sub = other.pubsub()
    sub.subscribe(p + "news")
    check(sub.get_message(timeout=5)["type"], "subscribe", "subscribe confirmation")
    check(r.publish(p + "news", "hello"), 1, "publish count")
    message = sub.get_message(timeout=5)
    check((message or {}).get("data"), b"hello", "published message")
    sub.close()
    other.close()

    # Refused, with an error that says why.
    refused(lambda: r.blpop([p + "queue"], timeout=1), "blpop")
    def watched():
        with r.pipeline() as w:
            w.watch(p + "n")
    refused(watched, "watch")
    refused(lambda: r.config_set("notify-keyspace-events", "KEA"), "keyspace notifications")
    big = b"v" * (300 * 1024)
    check(r.set(p + "big", big), True, "set 300 KiB")
    check(r.strlen(p + "big"), len(big), "strlen 300 KiB")
    refused(lambda: r.get(p + "big"), "get 300 KiB")
    check(r.get(p + "n"), b"41", "the cluster still answers")
print("python redis (selective execution): ok")
