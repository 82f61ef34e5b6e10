"""kazoo (PyPI) against upright-zk: the calls and recipes applications make.

Usage: zk_clients.py PORT. Exits non-zero with the first failed check. Run by crates/cli/tests/zk.rs
against `upright demo --service zk` with a replica that corrupts its replies and pushes.
"""
import os
import subprocess
import sys
import threading
import time

from kazoo.client import KazooClient
from kazoo.exceptions import (BadVersionError, NoAuthError, NodeExistsError, NoNodeError,
                              NotEmptyError, NoChildrenForEphemeralsError, RolledBackError)
from kazoo.security import make_digest_acl

SERVER = "127.0.0.1:%s" % sys.argv[1]
# Each run works under its own root (kazoo's chroot), so runs against one cluster do not meet.
ROOT = "/kazoo-%d-%d" % (os.getpid(), int(time.time()))
HOSTS = SERVER + ROOT


def client(**kw):
    z = KazooClient(hosts=HOSTS, timeout=15, **kw)
    z.start(timeout=30)
    return z


def expect(error, call, *args, **kw):
    try:
        call(*args, **kw)
    except error:
        return
    raise AssertionError("%s%r did not raise %s" % (call.__name__, args, error.__name__))


def wait_for(what, check, seconds=20):
    until = time.time() + seconds
    while time.time() < until:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def crud(z):
    assert z.create("/app", b"v1") == "/app"
    data, stat = z.get("/app")
    assert data == b"v1" and stat.version == 0 and stat.dataLength == 2, (data, stat)
    assert stat.czxid == stat.mzxid and stat.ctime == stat.mtime and stat.ctime > 1_600_000_000_000
    expect(NodeExistsError, z.create, "/app", b"")
    expect(NoNodeError, z.get, "/missing")
    expect(NoNodeError, z.create, "/missing/child", b"")
    stat = z.set("/app", b"v2")
    assert stat.version == 1
    expect(BadVersionError, z.set, "/app", b"v3", version=0)
    z.set("/app", b"v3", version=1)
    assert z.get("/app")[0] == b"v3"
    z.ensure_path("/app/a/b")
    assert z.get_children("/app") == ["a"]
    children, stat = z.get_children("/app", include_data=True)
    assert stat.numChildren == 1 and stat.cversion == 1, stat
    expect(NotEmptyError, z.delete, "/app")
    z.delete("/app", recursive=True)
    assert z.exists("/app") is None
    assert z.get_children("/") == []
    print("crud: ok")


def ephemeral_and_sequential(z):
    z.ensure_path("/seq")
    names = [z.create("/seq/n-", b"", sequence=True) for _ in range(3)]
    assert names == ["/seq/n-0000000000", "/seq/n-0000000001", "/seq/n-0000000002"], names
    path = z.create("/seq/e-", b"", ephemeral=True, sequence=True)
    assert path == "/seq/e-0000000003", path
    assert z.exists(path).ephemeralOwner == z.client_id[0]
    expect(NoChildrenForEphemeralsError, z.create, path + "/child", b"")
    print("ephemeral and sequential: ok")


def watches(z, other):
    z.create("/w", b"0")
    seen = []
    got = threading.Event()

    def note(event):
        seen.append((event.type, event.path))
        got.set()

    z.get("/w", watch=note)
    other.set("/w", b"1")
    assert got.wait(10), "data watch"
    # The event arrives before the reply that shows the change.
    assert seen == [("CHANGED", "/w")], seen
    got.clear()
    z.exists("/w/x", watch=note)
    other.create("/w/x", b"")
    assert got.wait(10), "exists watch"
    got.clear()
    z.get_children("/w", watch=note)
    other.create("/w/y", b"")
    assert got.wait(10), "child watch"
    got.clear()
    z.get("/w/x", watch=note)
    other.delete("/w/x")
    assert got.wait(10), "delete"
    assert seen == [("CHANGED", "/w"), ("CREATED", "/w/x"), ("CHILD", "/w"), ("DELETED", "/w/x")], seen
    # A one-shot watch fired once.
    other.set("/w", b"2")
    time.sleep(0.5)
    assert len(seen) == 4, seen
    # DataWatch / ChildrenWatch helpers.
    values = []
    z.DataWatch("/w", lambda data, stat: values.append(data))
    other.set("/w", b"3")
    wait_for("DataWatch", lambda: values[-1:] == [b"3"])
    print("watches: ok")


def transactions(z):
    z.create("/tx", b"")
    t = z.transaction()
    t.create("/tx/a", b"")
    t.check("/tx", 5)
    results = t.commit()
    assert isinstance(results[0], RolledBackError) and isinstance(results[1], BadVersionError), results
    assert z.exists("/tx/a") is None
    t = z.transaction()
    t.create("/tx/a", b"")
    t.set_data("/tx", b"x")
    t.delete("/tx/a")
    results = t.commit()
    assert results[0] == "/tx/a" and results[1].version == 1 and results[2] is True, results
    print("transactions: ok")


def acls(z):
    acl = make_digest_acl("alice", "secret", all=True)
    alice = client(auth_data=[("digest", "alice:secret")])
    alice.create("/private", b"mine", acl=[acl])
    assert alice.get("/private")[0] == b"mine"
    expect(NoAuthError, z.get, "/private")
    expect(NoAuthError, z.set, "/private", b"x")
    acls_, _ = alice.get_acls("/private")
    assert acls_[0].id.id == acl.id.id, acls_
    alice.stop()
    alice.close()
    print("acls: ok")


def session_expiry(z):
    # A client that dies without closing its session: its ephemeral goes after the timeout.
    code = (
        "import os; from kazoo.client import KazooClient as K; z=K(%r, timeout=4); z.start(30);"
        "z.create('/expiring', b'', ephemeral=True); os._exit(0)" % HOSTS
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert z.exists("/expiring") is not None
    gone = threading.Event()
    z.exists("/expiring", watch=lambda e: gone.set())
    assert gone.wait(30), "the session did not expire"
    assert z.exists("/expiring") is None
    print("session expiry: ok")


def recipes(z, other):
    lock = z.Lock("/lock", "z")
    with lock:
        contender = other.Lock("/lock", "other")
        assert not contender.acquire(blocking=False)
    assert contender.acquire(timeout=10)
    contender.release()
    counter = z.Counter("/counter")
    counter += 5
    other_counter = other.Counter("/counter")
    other_counter -= 2
    assert z.Counter("/counter").value == 3
    q = z.Queue("/queue")
    q.put(b"a")
    q.put(b"b")
    assert other.Queue("/queue").get() == b"a"
    party = z.Party("/party", "z")
    party.join()
    other.Party("/party", "other").join()
    assert sorted(z.Party("/party")) == ["other", "z"]
    barrier = z.Barrier("/barrier")
    barrier.create()
    released = threading.Event()
    threading.Thread(target=lambda: (other.Barrier("/barrier").wait(20), released.set())).start()
    time.sleep(0.3)
    barrier.remove()
    assert released.wait(20), "barrier"
    election = z.Election("/election", "z")
    won, resign = threading.Event(), threading.Event()
    threading.Thread(target=lambda: election.run(lambda: (won.set(), resign.wait(20)))).start()
    assert won.wait(20), "election"
    assert other.Election("/election").contenders() == ["z"]
    resign.set()
    wait_for("the leader to resign", lambda: other.Election("/election").contenders() == [])
    print("recipes: ok")


def main():
    setup = KazooClient(hosts=SERVER, timeout=15)
    setup.start(timeout=30)
    assert "zookeeper" in setup.get_children("/")
    setup.create(ROOT, b"")
    setup.stop()
    z = client()
    other = client()
    crud(z)
    ephemeral_and_sequential(z)
    watches(z, other)
    transactions(z)
    acls(z)
    session_expiry(z)
    recipes(z, other)
    other.stop()
    z.stop()
    print("kazoo: all checks passed")


if __name__ == "__main__":
    main()
