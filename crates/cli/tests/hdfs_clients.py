"""PyPI's `hdfs` (hdfscli: its Python API and its command line) against upright's WebHDFS gateway.

Usage: hdfs_clients.py PORT SECONDS

Writes files of several sizes and block sizes (some spanning many blocks), appends, lists,
renames, deletes, sets permissions, owners and replication, reads everything back (whole and in
ranges) and checks every byte, for at least SECONDS (while the test SIGKILLs a NameNode replica,
corrupts its log and restarts it, another replica lies in every reply and one DataNode serves
a block with a flipped bit). The first file written is /flip/first.bin (the block the faulty
DataNode flips); it is read several times so that every DataNode is asked for it.
"""

import hashlib
import os
import random
import subprocess
import sys
import tempfile
import time

import hdfs

port = int(sys.argv[1])
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0
url = f"http://127.0.0.1:{port}"
client = hdfs.InsecureClient(url, user="alice")
failures = []


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got!r}, want {want!r}")
        print(f"FAIL {what}: got {got!r:.200}, want {want!r:.200}", flush=True)


def read(path, **kw):
    with client.read(path, **kw) as r:
        return r.read()


rng = random.Random(29)
MiB = 1 << 20

# 1. The faulty DataNode's block: written first, read from every DataNode in turn.
first = rng.randbytes(MiB + 12345)
client.write("/flip/first.bin", data=first)
for i in range(6):
    check(f"read {i} of /flip/first.bin", hashlib.sha256(read("/flip/first.bin")).hexdigest(),
          hashlib.sha256(first).hexdigest())
print("first file read back 6 times", flush=True)

# 2. Files of several sizes, block sizes and replication factors, written and read back.
written = {}
sizes = [0, 1, 511, 512, 65535, 65536, 65537, 3 * MiB + 17]
for n, size in enumerate(sizes):
    data = rng.randbytes(size)
    path = f"/sizes/f{n}"
    client.write(path, data=data, blocksize=MiB, replication=2 + n % 2)
    written[path] = data
for path, data in written.items():
    check(f"read {path}", read(path), data)
    st = client.status(path)
    check(f"length of {path}", st["length"], len(data))
    check(f"type of {path}", st["type"], "FILE")
# Ranges crossing sub-block and block boundaries.
big = written["/sizes/f7"]
for offset, length in [(0, 10), (65530, 20), (MiB - 5, 10), (2 * MiB + 100, MiB), (3 * MiB, 17)]:
    check(f"range {offset}+{length}", read("/sizes/f7", offset=offset, length=length), big[offset:offset + length])
print(f"{len(sizes)} files of sizes {sizes} read back whole and in ranges", flush=True)

# 3. Appends (each a new block), overwrite, and the errors HDFS gives.
client.write("/app/log", data=b"one\n")
client.write("/app/log", data=b"two\n", append=True)
client.write("/app/log", data=b"three\n", append=True)
check("appended", read("/app/log"), b"one\ntwo\nthree\n")
client.write("/app/log", data=b"fresh\n", overwrite=True)
check("overwritten", read("/app/log"), b"fresh\n")
try:
    client.write("/app/log", data=b"x")
    failures.append("CREATE of an existing file without overwrite succeeded")
except hdfs.HdfsError as e:
    check("exists error mentions the path", "/app/log" in str(e), True)
try:
    read("/nope")
    failures.append("OPEN of a missing file succeeded")
except hdfs.HdfsError as e:
    check("missing error", "does not exist" in str(e), True)
check("status of a missing path", client.status("/nope", strict=False), None)

# 4. The namespace: directories, listing, rename, delete, permissions, owners, replication.
client.makedirs("/tree/a/b", permission="750")
check("mkdir permission", client.status("/tree/a/b")["permission"], "750")
for i in range(30):
    client.write(f"/tree/a/f{i:02}", data=str(i).encode())
check("listing", client.list("/tree/a"), ["b"] + [f"f{i:02}" for i in range(30)])
client.rename("/tree/a/f00", "/tree/a/b")
check("renamed into a directory", client.list("/tree/a/b"), ["f00"])
client.rename("/tree/a/f01", "/tree/moved")
check("renamed", read("/tree/moved"), b"1")
client.set_permission("/tree/moved", "600")
client.set_owner("/tree/moved", owner="bob", group="staff")
client.set_replication("/tree/moved", 1)
st = client.status("/tree/moved")
check("set status", (st["permission"], st["owner"], st["group"], st["replication"]), ("600", "bob", "staff", 1))
summary = client.content("/tree")
check("content summary", (summary["directoryCount"], summary["fileCount"]), (3, 30))
try:
    client.delete("/tree/a")
    failures.append("non-recursive DELETE of a non-empty directory succeeded")
except hdfs.HdfsError:
    pass
check("recursive delete", client.delete("/tree", recursive=True), True)
check("deleted", client.status("/tree", strict=False), None)
check("checksum algorithm", client.checksum("/flip/first.bin")["algorithm"], "MD5-of-0MD5-of-512CRC32C")
check("home", client.resolve("x"), "/user/alice/x")
print("namespace operations checked", flush=True)

# 5. hdfscli's command line: upload, download, list (a config file names the alias).
with tempfile.TemporaryDirectory() as tmp:
    config = os.path.join(tmp, "hdfscli.cfg")
    with open(config, "w") as f:
        f.write(f"[global]\ndefault.alias = upright\n\n[upright.alias]\nurl = {url}\nuser = alice\n")
    env = dict(os.environ, HDFSCLI_CONFIG=config)
    local = os.path.join(tmp, "cli.bin")
    payload = rng.randbytes(2 * MiB + 3)
    with open(local, "wb") as f:
        f.write(payload)

    def hdfscli(*args):
        out = subprocess.run(["hdfscli", *args], env=env, capture_output=True, timeout=120)
        if out.returncode != 0:
            failures.append(f"hdfscli {' '.join(args)}: exit {out.returncode}: {out.stderr.decode().strip()}")
        return out.stdout

    hdfscli("upload", local, "/cli/cli.bin")
    back = os.path.join(tmp, "back.bin")
    hdfscli("download", "/cli/cli.bin", back)
    with open(back, "rb") as f:
        check("hdfscli download", f.read(), payload)
    check("hdfscli download to stdout", hdfscli("download", "/cli/cli.bin", "-"), payload)
    check("hdfscli upload of a directory", hdfscli("upload", tmp, "/cli/dir"), b"")
    check("uploaded directory", sorted(client.list("/cli/dir")), ["back.bin", "cli.bin", "hdfscli.cfg"])
print("hdfscli command line checked", flush=True)

# 6. Load until the time is up (the test injects its faults meanwhile), then read all back.
until = time.time() + seconds
rounds = 0
kept = {}
while time.time() < until or rounds < 3:
    data = rng.randbytes(rng.randrange(1, 300_000))
    path = f"/load/r{rounds}"
    client.write(path, data=data, blocksize=MiB)
    kept[path] = data
    check(f"load read {path}", read(path), data)
    rounds += 1
for path, data in kept.items():
    check(f"final read {path}", read(path), data)
for path, data in written.items():
    check(f"final read {path}", read(path), data)
check("final read of the flipped file", read("/flip/first.bin"), first)
print(f"load: {rounds} files written and read back during the faults", flush=True)

if failures:
    print(f"{len(failures)} FAILURES", flush=True)
    sys.exit(1)
print("hdfs clients: all checks passed", flush=True)
