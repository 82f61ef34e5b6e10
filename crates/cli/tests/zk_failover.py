"""A kazoo client keeps its session across gateways: zk_failover.py PORT_A PORT_B PID_A.

The client connects through gateway A (the first host of its connect string), holds an ephemeral
node and a data watch, then gateway A is SIGKILLed. While the client is away another client
changes the watched node through gateway B. The client must come back through B with the same
session, its ephemeral node still there, and learn of the change it missed (setWatches).
"""
import os
import signal
import sys
import threading
import time

from kazoo.client import KazooClient, KazooState

port_a, port_b, pid_a = sys.argv[1], sys.argv[2], int(sys.argv[3])
ROOT = "/failover-%d" % os.getpid()

z = KazooClient(hosts="127.0.0.1:%s,127.0.0.1:%s" % (port_a, port_b), randomize_hosts=False, timeout=10)
z.start(timeout=60)
session = z.client_id[0]
z.ensure_path(ROOT)
z.create(ROOT + "/eph", b"", ephemeral=True)
z.create(ROOT + "/watched", b"0")
changed = threading.Event()
z.get(ROOT + "/watched", watch=lambda event: changed.set())
states = []
z.add_listener(lambda state: states.append(state))

other = KazooClient(hosts="127.0.0.1:%s" % port_b, timeout=10)
other.start(timeout=60)

os.kill(pid_a, signal.SIGKILL)
time.sleep(0.2)
other.set(ROOT + "/watched", b"1")

assert changed.wait(40), "the change made while the client was away never reached it"
assert z.client_id[0] == session, "a new session instead of the old one"
assert KazooState.SUSPENDED in states, states
assert KazooState.LOST not in states, states
assert z.exists(ROOT + "/eph") is not None, "the ephemeral node went with the gateway"
assert other.get(ROOT + "/watched")[0] == b"1"
z.stop()
other.stop()
print("failover: ok")
