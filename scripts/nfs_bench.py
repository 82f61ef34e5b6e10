#!/usr/bin/env python3
"""Andrew-like and PostMark-like runs through a real NFS client library (PyPI's libnfs), after
the evaluation of PBFT's BFS, against one or more NFSv3 servers in the same run.

    nfs_bench.py [--scale N] [--files N] [--transactions N] [--rounds R] [--json FILE] NAME=URL...

URL is a libnfs URL of a writable export, e.g.
nfs://127.0.0.1/?nfsport=2049&mountport=2049&version=3. Each round runs every target in turn
(Andrew-like, then PostMark-like) in a fresh directory of its own; the table gives each phase's
median seconds over the rounds and its ratio to the first target's.

Andrew-like (Howard et al.'s five phases over a generated source tree, `--scale` copies of 20
directories and 200 files of 100 B to 64 KiB of source-like text, the same bytes every run):
  mkdir    make the directory tree
  copy     copy every file in
  stat     stat every directory and file
  read     read every byte of every file
  compile  read each source, write its object (zlib level 6 of it: the client's CPU work, as a
           compiler's), then link: read every object and write one binary

PostMark-like (Katcher's small-file transactions): a pool of `--files` files of 500 B to
9.77 KiB in 10 directories, `--transactions` transactions each of a create or a delete and a
read of a whole file or an append of 500 B to 9.77 KiB, then the deletion of every file left.
"""
import argparse
import json
import random
import statistics
import sys
import time
import zlib

import libnfs

WORDS = (
    "fn let mut match impl struct enum pub use mod self return if else for while loop break "
    "continue where trait type const static unsafe async await move ref Some None Ok Err Vec "
    "Bytes u32 u64 usize bool String into iter map collect clone len push insert remove"
).split()


def check(status, what):
    """libnfs's NFS methods return a negative errno instead of raising."""
    if isinstance(status, int) and status < 0:
        raise OSError(-status, f"{what} failed")
    return status


def source_tree(scale, seed=1):
    """Directories and (path, bytes) files, the same for every run of the same scale."""
    rng = random.Random(seed)
    dirs, files = [], []
    for copy in range(scale):
        top = f"src{copy}"
        dirs.append(top)
        subdirs = [top]
        for d in range(19):
            parent = rng.choice(subdirs)
            path = f"{parent}/d{d}"
            dirs.append(path)
            subdirs.append(path)
        for f in range(200):
            size = int(min(65536, max(100, rng.lognormvariate(8.3, 1.0))))
            text = []
            n = 0
            while n < size:
                line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) + ";\n"
                text.append(line)
                n += len(line)
            data = "".join(text).encode()[:size]
            files.append((f"{rng.choice(subdirs)}/f{f}.c", data))
    return dirs, files


def write_file(nfs, path, data, mode="wb"):
    f = nfs.open(path, mode=mode)
    f.write(bytearray(data))
    f.close()


def read_file(nfs, path):
    f = nfs.open(path, mode="rb")
    out = bytearray()
    while True:
        chunk = f.read(1 << 20)
        if not chunk:
            break
        out += chunk
    f.close()
    return bytes(out)


def timed(phases, name, work):
    start = time.perf_counter()
    work()
    phases[name] = time.perf_counter() - start


def andrew(nfs, base, tree):
    dirs, files = tree
    phases = {}

    def mkdir():
        check(nfs.mkdir(base), f"mkdir {base}")
        for d in dirs:
            check(nfs.mkdir(f"{base}/{d}"), f"mkdir {d}")

    def copy():
        for path, data in files:
            write_file(nfs, f"{base}/{path}", data)

    def stat():
        for d in dirs:
            nfs.stat(f"{base}/{d}")
        for path, data in files:
            if nfs.stat(f"{base}/{path}")["size"] != len(data):
                raise AssertionError(f"{path}: wrong size")

    def read():
        for path, data in files:
            if read_file(nfs, f"{base}/{path}") != data:
                raise AssertionError(f"{path}: wrong bytes read")

    def compile_():
        check(nfs.mkdir(f"{base}/build"), "mkdir build")
        objects = []
        for i, (path, _) in enumerate(files):
            obj = f"{base}/build/o{i}.o"
            write_file(nfs, obj, zlib.compress(read_file(nfs, f"{base}/{path}"), 6))
            objects.append(obj)
        binary = b"".join(read_file(nfs, o) for o in objects)
        write_file(nfs, f"{base}/build/a.out", binary)

    timed(phases, "mkdir", mkdir)
    timed(phases, "copy", copy)
    timed(phases, "stat", stat)
    timed(phases, "read", read)
    timed(phases, "compile", compile_)
    phases["andrew total"] = sum(phases.values())
    return phases


def postmark(nfs, base, files, transactions, seed=2):
    rng = random.Random(seed)
    phases = {}
    live = []
    counter = [0]

    def size():
        return rng.randint(500, 10000)

    def create():
        counter[0] += 1
        path = f"{base}/s{counter[0] % 10}/p{counter[0]}"
        write_file(nfs, path, rng.randbytes(size()))
        live.append(path)

    def pool():
        check(nfs.mkdir(base), f"mkdir {base}")
        for s in range(10):
            check(nfs.mkdir(f"{base}/s{s}"), "mkdir")
        for _ in range(files):
            create()

    def run():
        for _ in range(transactions):
            if rng.random() < 0.5 or not live:
                create()
            else:
                check(nfs.unlink(live.pop(rng.randrange(len(live)))), "unlink")
            if not live:
                continue
            path = live[rng.randrange(len(live))]
            if rng.random() < 0.5:
                read_file(nfs, path)
            else:
                write_file(nfs, path, rng.randbytes(size()), mode="ab")

    def delete():
        for path in live:
            check(nfs.unlink(path), f"unlink {path}")
        live.clear()

    timed(phases, "pool", pool)
    timed(phases, "transactions", run)
    timed(phases, "delete", delete)
    phases["postmark total"] = sum(phases.values())
    return phases


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=int, default=1, help="copies of the 200-file source tree")
    p.add_argument("--files", type=int, default=500, help="PostMark-like pool of files")
    p.add_argument("--transactions", type=int, default=1000, help="PostMark-like transactions")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", help="also write every round's seconds here")
    p.add_argument("targets", nargs="+", metavar="NAME=URL")
    a = p.parse_args()
    targets = []
    for t in a.targets:
        name, sep, url = t.partition("=")
        if not sep or not url.startswith("nfs://"):
            p.error(f"{t!r} is not NAME=nfs://...")
        targets.append((name, url))
    tree = source_tree(a.scale)
    total_bytes = sum(len(d) for _, d in tree[1])
    print(f"source tree: {len(tree[0])} directories, {len(tree[1])} files, {total_bytes} bytes", flush=True)
    results = {name: [] for name, _ in targets}
    tag = f"{int(time.time())}"
    for r in range(a.rounds):
        for name, url in targets:
            try:
                nfs = libnfs.NFS(url)
            except Exception as e:
                sys.exit(f"{name}: cannot mount {url}: {e}")
            phases = andrew(nfs, f"/andrew-{tag}-{r}", tree)
            phases.update(postmark(nfs, f"/postmark-{tag}-{r}", a.files, a.transactions))
            results[name].append(phases)
            print(f"round {r + 1}/{a.rounds} {name}: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()), flush=True)
    names = [n for n, _ in targets]
    phase_names = list(results[names[0]][0].keys())
    median = {n: {ph: statistics.median(run[ph] for run in results[n]) for ph in phase_names} for n in names}
    head = "| phase | " + " | ".join(f"{n} s" for n in names) + " | " + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |"
    print(head)
    print("|" + "---|" * (1 + 2 * len(names) - 1))
    for ph in phase_names:
        cells = [f"{median[n][ph]:.2f}" for n in names]
        ratios = [f"{median[n][ph] / median[names[0]][ph]:.2f}x" if median[names[0]][ph] > 0 else "-" for n in names[1:]]
        print(f"| {ph} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"scale": a.scale, "files": a.files, "transactions": a.transactions, "rounds": results}, f, indent=1)


if __name__ == "__main__":
    main()
