"""Real-client checks for the upright Redis gateway: the Python `redis` package, RESP2 and RESP3,
plain commands and pipelines, every data type, transactions with WATCH, blocking pops, pub/sub and
values larger than one upright operation. Usage: redis_clients.py PORT. Exits non-zero on the first
mismatch."""
import sys
import threading
import time

import redis

port = int(sys.argv[1])


def check(got, want, what):
    if got != want:
        print(f"MISMATCH {what}: got {got!r}, want {want!r}")
        sys.exit(1)


for proto in (2, 3):
    r = redis.Redis(host="127.0.0.1", port=port, protocol=proto, socket_timeout=60)
    p = f"py{proto}:"
    check(r.ping(), True, "ping")
    check(r.set(p + "a", "1"), True, "set")
    check(r.get(p + "a"), b"1", "get")
    check(r.set(p + "a", "2", nx=True), None, "set nx")
    check(r.incr(p + "n"), 1, "incr")
    check(r.incrby(p + "n", 41), 42, "incrby")
    check(r.decr(p + "n"), 41, "decr")
    check(r.append(p + "a", "xyz"), 4, "append")
    check(r.strlen(p + "a"), 4, "strlen")
    check(r.mset({p + "m1": "x", p + "m2": "y"}), True, "mset")
    check(r.mget([p + "m1", p + "nope", p + "m2"]), [b"x", None, b"y"], "mget")
    check(r.getset(p + "m1", "z"), b"x", "getset")
    check(r.set(p + "t", "v", ex=100), True, "set ex")
    check(r.ttl(p + "t"), 100, "ttl")
    check(r.persist(p + "t"), True, "persist")
    check(r.ttl(p + "t"), -1, "ttl after persist")
    check(r.exists(p + "a", p + "nope"), 1, "exists")
    check(r.delete(p + "m1", p + "m2"), 2, "delete")
    check(sorted(r.keys(p + "*")), sorted([x.encode() for x in (p + "a", p + "n", p + "t")]), "keys")
    check(sorted(r.scan_iter(match=p + "*", count=2)), sorted(r.keys(p + "*")), "scan_iter")
    try:
        r.incr(p + "a")
        check("no error", "error", "incr on text")
    except redis.ResponseError as e:
        check(str(e), "value is not an integer or out of range", "incr error")

    # Pipelined (no MULTI: transaction=False): replies come back in order.
    pipe = r.pipeline(transaction=False)
    for i in range(300):
        pipe.incr(p + "pipe")
        pipe.set(f"{p}k{i}", str(i))
        pipe.get(f"{p}k{i}")
    out = pipe.execute()
    for i in range(300):
        check(out[3 * i], i + 1, f"pipelined incr {i}")
        check(out[3 * i + 1], True, f"pipelined set {i}")
        check(out[3 * i + 2], str(i).encode(), f"pipelined get {i}")
    check(r.get(p + "pipe"), b"300", "pipeline total")

    # Every type.
    check(r.hset(p + "h", mapping={"f1": "a", "f2": "b"}), 2, "hset")
    check(r.hgetall(p + "h"), {b"f1": b"a", b"f2": b"b"}, "hgetall")
    check(r.rpush(p + "l", "x", "y", "z"), 3, "rpush")
    check(r.lrange(p + "l", 0, -1), [b"x", b"y", b"z"], "lrange")
    check(r.sadd(p + "s", "m1", "m2"), 2, "sadd")
    check(r.smembers(p + "s"), {b"m1", b"m2"}, "smembers")
    check(r.zadd(p + "z", {"one": 1, "two": 2.5}), 2, "zadd")
    scored = [tuple(pair) for pair in r.zrange(p + "z", 0, -1, withscores=True)]
    check(scored, [(b"one", 1.0), (b"two", 2.5)], "zrange withscores")
    check(r.zscore(p + "z", "two"), 2.5, "zscore")

    # MULTI/EXEC, and WATCH that sees another client's write.
    pipe = r.pipeline(transaction=True)
    pipe.incr(p + "tx").incr(p + "tx").get(p + "tx")
    check(pipe.execute(), [1, 2, b"2"], "multi/exec")
    other = redis.Redis(host="127.0.0.1", port=port, protocol=proto, socket_timeout=60)
    with r.pipeline() as pipe:
        pipe.watch(p + "tx")
        other.set(p + "tx", "changed")
        pipe.multi()
        pipe.set(p + "tx", "mine")
        try:
            pipe.execute()
            check("executed", "aborted", "watch")
        except redis.WatchError:
            pass
    check(r.get(p + "tx"), b"changed", "aborted transaction wrote nothing")

    # A blocking pop served by another client's push.
    def push_later():
        time.sleep(0.5)
        other.rpush(p + "queue", "job")

    threading.Thread(target=push_later).start()
    popped = r.blpop([p + "queue"], timeout=10)
    check(tuple(popped or ()), ((p + "queue").encode(), b"job"), "blpop")
    check(r.blpop([p + "empty"], timeout=0.2), None, "blpop timeout")

    # Pub/sub.
    sub = other.pubsub()
    sub.subscribe(p + "news")
    check(sub.get_message(timeout=5)["type"], "subscribe", "subscribe confirmation")
    check(r.publish(p + "news", "hello"), 1, "publish count")
    message = sub.get_message(timeout=5)
    check((message["type"], message["data"]), ("message", b"hello"), "message")
    sub.close()

    # Values larger than one upright operation, both ways.
    big = bytes(range(256)) * (6 * 4096)  # 6 MiB
    check(r.set(p + "big", big), True, "set 6 MiB")
    check(r.strlen(p + "big"), len(big), "strlen 6 MiB")
    check(r.get(p + "big"), big, "get 6 MiB")
    other.close()
print("python redis: ok")
