"""Real-client checks for the upright Redis gateway: the Python `redis` package, RESP2 and RESP3,
plain commands and pipelines. Usage: redis_clients.py PORT. Exits non-zero on the first mismatch."""
import sys

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
print("python redis: ok")
