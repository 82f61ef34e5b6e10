"""PyPI's libnfs (Python bindings of libnfs) against `upright nfs`: every procedure a file system
user reaches through it, as two users. Run by crates/cli/tests/nfs_gateway.rs:

    nfs_clients.py PORT BIG_FILE_MIB MANY

/many holds entry-00000 .. entry-<MANY-1> (the Rust test makes them, all at once).

Prints "nfs clients: ok" when every check passed; raises otherwise."""
import errno
import os
import stat
import sys
import time

import libnfs

# The benchmark's readers and writers (scripts/nfs_bench.py) serve here too.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts"))
from nfs_bench import read_file as read, write_file  # noqa: E402

PORT = int(sys.argv[1])
BIG_MIB = int(sys.argv[2])
MANY = int(sys.argv[3])


def url(uid=None):
    u = f"nfs://127.0.0.1/?nfsport={PORT}&mountport={PORT}&version=3"
    if uid is not None:
        u += f"&uid={uid}&gid={uid}"
    return u


def write(nfs, path, data, mode="wb+"):
    write_file(nfs, path, data, mode)


def fails(what, call):
    try:
        call()
    except Exception:
        return
    raise AssertionError(f"{what} succeeded")


root = libnfs.NFS(url())
ctx = root._nfs
root.mkdir("/t")
assert libnfs.nfs_chmod(ctx, "/t", 0o777) == 0

# Files, rename over an existing file, hard links, symlinks.
write(root, "/t/a", b"first file")
write(root, "/t/b", b"second file")
assert libnfs.nfs_rename(ctx, "/t/a", "/t/b") == 0, "rename over an existing file"
assert read(root, "/t/b") == b"first file"
fails("stat of the renamed-away name", lambda: root.stat("/t/a"))
assert libnfs.nfs_link(ctx, "/t/b", "/t/hard") == 0
assert root.stat("/t/b")["nlink"] == 2 and root.stat("/t/hard")["ino"] == root.stat("/t/b")["ino"]
root.unlink("/t/b")
assert root.stat("/t/hard")["nlink"] == 1 and read(root, "/t/hard") == b"first file"
assert libnfs.nfs_symlink(ctx, "hard", "/t/sym") == 0
assert root.lstat("/t/sym")["mode"] & 0o170000 == 0o120000
assert read(root, "/t/sym") == b"first file", "a symlink is followed"
# Directories: rmdir of a non-empty one fails; a moved directory keeps its contents.
root.mkdir("/t/d")
write(root, "/t/d/inner", b"inside")
assert root.rmdir("/t/d") == -errno.ENOTEMPTY, "rmdir of a non-empty directory"
assert libnfs.nfs_rename(ctx, "/t/d", "/t/e") == 0
assert read(root, "/t/e/inner") == b"inside"
# Truncation and writes at offsets.
write(root, "/t/off", b"0123456789")
f = root.open("/t/off", mode="rb+")
f.seek(4)
f.write(bytearray(b"xy"))
f.close()
assert read(root, "/t/off") == b"0123xy6789"
assert libnfs.nfs_truncate(ctx, "/t/off", 3) == 0 and read(root, "/t/off") == b"012"

# Permissions with two users: Alice's 0600 file is hers alone; Bob's 0644 file is readable by her.
alice, bob = libnfs.NFS(url(1000)), libnfs.NFS(url(1001))
write(alice, "/t/alice", b"alice's secret")
assert libnfs.nfs_chmod(alice._nfs, "/t/alice", 0o600) == 0
assert alice.stat("/t/alice")["uid"] == 1000
fails("bob reads alice's 0600 file", lambda: read(bob, "/t/alice"))
fails("bob writes alice's 0600 file", lambda: write(bob, "/t/alice", b"x", mode="rb+"))
assert libnfs.nfs_chmod(bob._nfs, "/t/alice", 0o666) == -errno.EPERM, "bob chmods alice's file"
write(bob, "/t/bob", b"bob's note")
assert libnfs.nfs_chmod(bob._nfs, "/t/bob", 0o644) == 0
assert read(alice, "/t/bob") == b"bob's note"
bob.mkdir("/t/bobdir")
assert libnfs.nfs_chmod(bob._nfs, "/t/bobdir", 0o755) == 0
fails("alice creates in bob's 0755 directory", lambda: write(alice, "/t/bobdir/x", b"x"))
# ACCESS, MKNOD and SETATTR of owner and group, which libnfs reaches directly.
assert libnfs.nfs_access(alice._nfs, "/t/alice", os.R_OK | os.W_OK) == 0
assert libnfs.nfs_access(bob._nfs, "/t/alice", os.R_OK) == -errno.EACCES, "ACCESS denies bob"
assert libnfs.nfs_mknod(ctx, "/t/fifo", stat.S_IFIFO | 0o644, 0) == 0
assert stat.S_ISFIFO(root.lstat("/t/fifo")["mode"])
assert libnfs.nfs_chown(ctx, "/t/bob", 1000, 100) == 0, "root gives bob's file to alice"
assert (root.stat("/t/bob")["uid"], root.stat("/t/bob")["gid"]) == (1000, 100)
assert libnfs.nfs_chown(bob._nfs, "/t/bobdir", 1000, 1001) == -errno.EPERM, "bob cannot give away"

# A directory of MANY entries, listed whole (libnfs reads it with READDIRPLUS, page by page).
t = time.time()
names = set(root.listdir("/many")) - {".", ".."}
assert names == {f"entry-{i:05d}" for i in range(MANY)}, len(names)
assert root.stat("/many/entry-00042")["size"] == 0
print(f"{MANY} entries listed in {time.time() - t:.1f} s")

# A big file written and read back.
block = os.urandom(1 << 20)
t = time.time()
f = root.open("/t/big", mode="wb+")
for i in range(BIG_MIB):
    f.write(bytearray(block[i % 7:] + block[: i % 7]))
f.close()
written = time.time() - t
assert root.stat("/t/big")["size"] == BIG_MIB << 20
t = time.time()
f = root.open("/t/big", mode="rb")
for i in range(BIG_MIB):
    got = bytes(f.read(1 << 20))
    assert got == block[i % 7:] + block[: i % 7], f"MiB {i} differs"
assert not f.read(1)
f.close()
print(f"{BIG_MIB} MiB written in {written:.1f} s, read back in {time.time() - t:.1f} s")
print("nfs clients: ok")
