#!/usr/bin/env python3
"""Creates and unlinks per second through one mount of a 4-server loopback
volume (`morris up`), for several builds, interleaved, medians printed.

    python3 bench/create_unlink_loop.py --rounds 5 OLD_MORRIS NEW_MORRIS

Each round starts a fresh volume per build, creates N empty files in one
directory (open O_CREAT|O_EXCL, close), then unlinks them. No peer runs:
this is for comparing two builds of morris on the same machine, in one
run (docs/benchmarks.md). bench/small_files.py is the table against
MooseFS.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time


def one(exe, port, n):
    d = tempfile.mkdtemp(prefix="morris-loop-")
    up = subprocess.Popen(
        [exe, "up", "--servers", "4", "--dir", f"{d}/data", "--mount", f"{d}/mnt",
         "--port", str(port), "--no-metrics"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(80):
            if os.path.ismount(f"{d}/mnt"):
                break
            time.sleep(0.25)
        else:
            raise SystemExit(f"{exe}: no mount at {d}/mnt")
        time.sleep(1)
        work = f"{d}/mnt/d"
        os.mkdir(work)
        t = time.perf_counter()
        for i in range(n):
            os.close(os.open(f"{work}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        creates = n / (time.perf_counter() - t)
        names = os.listdir(work)
        t = time.perf_counter()
        for name in names:
            os.unlink(f"{work}/{name}")
        unlinks = len(names) / (time.perf_counter() - t)
        return creates, unlinks
    finally:
        up.terminate()
        up.wait(timeout=60)
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exes", nargs="+", help="morris binaries to compare")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--port", type=int, default=7870)
    a = ap.parse_args()
    got = {e: ([], []) for e in a.exes}
    for r in range(a.rounds):
        order = a.exes if r % 2 == 0 else list(reversed(a.exes))
        for e in order:
            c, u = one(e, a.port, a.files)
            got[e][0].append(c)
            got[e][1].append(u)
            print(f"round {r + 1} {e}: creates/s {c:.0f} unlinks/s {u:.0f}", flush=True)
    base = a.exes[0]
    for e in a.exes:
        c, u = statistics.median(got[e][0]), statistics.median(got[e][1])
        rc = c / statistics.median(got[base][0])
        ru = u / statistics.median(got[base][1])
        print(f"{e}: median creates/s {c:.0f} ({rc:.2f}x), unlinks/s {u:.0f} ({ru:.2f}x)")


if __name__ == "__main__":
    main()
