#!/usr/bin/env python3
"""Small files, metadata and writes: morris beside MooseFS and the local disk, one run (issue 18).

The rows of issue 18's table, on hosts of their own: network namespaces on
one bridge (bench/cluster; MooseFS refuses 127.0.0.1), every link shaped to
--rate (default 4gbit: the links are not what is measured here, the round
trips are). h0 is the client (one `morris mount`, one `mfsmount`), h1..h4 run
4 morris servers (one copy), h1..h3 MooseFS's 3 chunkservers and h4 its
master (goal 1). Each run, for each system in turn (local = a directory on
this machine's disk, the same one the servers use), one process at a time,
in a fresh directory:

  creates     --files empty files in one directory (open O_CREAT|O_EXCL, close) -> ops/s
  unlinks     each of them                                                   -> ops/s
  write1m     --write-mib 1 MiB writes, fsync, close                         -> MiB/s
  cp          `cp -r` of a tree of 2,000 files of 4-64 KiB (log-uniform,
              20 directories; made once, deterministic) from the local disk,
              then `sync -f` on the target                                   -> s

Page caches are dropped before each system's turn. Prints medians, the
ratios morris/MooseFS and morris/local, and writes JSON (--out) with every
figure. Needs root, iproute2, fuse3, moosefs-master, moosefs-chunkserver,
moosefs-client.

Usage: python3 bench/small_files.py [--exe target/release/morris] [--runs 3]
           [--files 10000] [--write-mib 512] [--rate 4gbit] [--out FILE]
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from cluster.hosts import Cluster, drop_caches, require_root_and_tools  # noqa: E402
from cluster import systems  # noqa: E402

TESTS = ["creates", "unlinks", "write1m", "cp"]
UNITS = {"creates": "ops/s", "unlinks": "ops/s", "write1m": "MiB/s", "cp": "s"}


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def make_tree(root, n=2000, dirs=20, seed=1):
    rng = random.Random(seed)
    for d in range(dirs):
        os.makedirs(os.path.join(root, f"d{d:02}"), exist_ok=True)
    for i in range(n):
        size = int(2 ** rng.uniform(12, 16))  # 4 KiB .. 64 KiB, log-uniform
        with open(os.path.join(root, f"d{i % dirs:02}", f"f{i:05}"), "wb") as f:
            f.write(rng.randbytes(size))


def workload(d, a, tree):
    os.makedirs(d)
    r = {}
    names = [os.path.join(d, f"e{i:06}") for i in range(a.files)]
    t = time.perf_counter()
    for p in names:
        os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    r["creates"] = a.files / (time.perf_counter() - t)
    t = time.perf_counter()
    for p in names:
        os.unlink(p)
    r["unlinks"] = a.files / (time.perf_counter() - t)
    buf = os.urandom(1 << 20)
    p = os.path.join(d, "big")
    t = time.perf_counter()
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    for _ in range(a.write_mib):
        os.write(fd, buf)
    os.fsync(fd)
    os.close(fd)
    r["write1m"] = a.write_mib / (time.perf_counter() - t)
    os.unlink(p)
    t = time.perf_counter()
    subprocess.run(["cp", "-r", tree, os.path.join(d, "tree")], check=True)
    subprocess.run(["sync", "-f", os.path.join(d, "tree")], check=True)
    r["cp"] = time.perf_counter() - t
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=os.environ.get("MORRIS_EXE", "target/release/morris"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--write-mib", type=int, default=512)
    ap.add_argument("--rate", default="4gbit")
    ap.add_argument("--base-dir", default="/var/tmp")
    ap.add_argument("--out", default="bench/results-small-files.json")
    a = ap.parse_args()
    require_root_and_tools(("mfsmaster", "mfschunkserver", "mfsmount"))
    exe = os.path.abspath(a.exe)
    work = tempfile.mkdtemp(prefix="morris-sf-", dir=a.base_dir)
    tree = os.path.join(work, "tree")
    make_tree(tree)
    local = os.path.join(work, "local")
    os.makedirs(local)
    runs = []
    try:
        with Cluster(5, a.rate, prefix="sf-", subnet="10.78.0") as cl:
            mo, mfs, mnt = systems.morris_beside_moosefs(cl, exe)
            mnt["local"] = local
            try:
                for run in range(a.runs):
                    for name in ("local", "morris", "moosefs"):
                        drop_caches()
                        log(f"run {run + 1}/{a.runs}: {name}")
                        r = workload(os.path.join(mnt[name], f"r{run}"), a, tree)
                        log("  ", {k: round(v, 3) for k, v in r.items()})
                        runs.append({"run": run, "system": name, **r})
            finally:
                mo.stop()
                mfs.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {s: {t: statistics.median(x[t] for x in runs if x["system"] == s) for t in TESTS}
           for s in ("local", "morris", "moosefs")}
    print(f"\n{'test':10} {'unit':6} {'local':>10} {'morris':>10} {'MooseFS':>10} {'morris/MooseFS':>15} "
          f"{'morris/local':>13}")
    for t in TESTS:
        m, f, lo = med["morris"][t], med["moosefs"][t], med["local"][t]
        print(f"{t:10} {UNITS[t]:6} {lo:10.2f} {m:10.2f} {f:10.2f} {m / f:15.2f} {m / lo:13.2f}")
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv),
           "exe": exe, "rate": a.rate, "files": a.files, "write_mib": a.write_mib,
           "units": UNITS, "runs": runs, "median": med}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print("(cp: seconds, so a ratio below 1 is morris taking less time)")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
