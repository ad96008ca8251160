#!/usr/bin/env python3
"""`ls -l` of a cached home directory: on the mount that listed it first, and on a fresh mount.

nfs-ganesha on this host exports a directory of N empty files (bench/lib/ganesha.py: its own
rpcbind in a private /run); a 4-server `morris up --home` mount (A) is bound to it, and a second
mount (B) of the same volume is made. Timed, in order:

  list       `os.listdir` on A: the miss (every name fetched from home, stored as placeholders)
  lsl_a      `ls -l` on A (each name's object made from its seed at first use)
  lsl_b      `ls -l` on B, which has seen nothing (the objects exist now)
  lsl_b2     `ls -l` on B again
  direct     libnfs's `nfs-ls` of the directory (mode, owner, size and name of each entry)

Each --exe gets a fresh volume per run; the builds take turns. Prints one line per run and the
medians; --out writes them as JSON.

    python3 bench/cache_ls.py --exe /work/bin/morris-old --exe target/release/morris \\
        --entries 10000 --runs 3

Needs root (ganesha, FUSE), nfs-ganesha + nfs-ganesha-vfs, rpcbind, fuse3, libnfs-utils.
Everything it starts is stopped and unmounted at the end; the work directory (--work, default
/var/tmp/cache-ls) is removed unless --keep.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.ganesha import Ganesha  # noqa: E402

TESTS = ["list", "lsl_a", "lsl_b", "lsl_b2", "direct"]


def timed(cmd, expect):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    t = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {p.stderr[-500:]}")
    lines = [ln for ln in p.stdout.splitlines() if ".dat" in ln]
    if len(lines) != expect:
        raise RuntimeError(f"{cmd}: {len(lines)} entries, expected {expect}")
    return t


def wait_mount(path, proc, log):
    deadline = time.time() + 60
    while not os.path.ismount(path):
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"no mount at {path}: see {log}")
        time.sleep(0.1)


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def one_run(exe, url, direct_url, work, n, port):
    vol, ma, mb = (os.path.join(work, x) for x in ("vol", "mnt-a", "mnt-b"))
    shutil.rmtree(vol, ignore_errors=True)
    os.makedirs(ma, exist_ok=True)
    os.makedirs(mb, exist_ok=True)
    loga, logb = os.path.join(work, "up.log"), os.path.join(work, "mount-b.log")
    up = subprocess.Popen([exe, "up", "--servers", "4", "--dir", vol, "--mount", ma, "--port", str(port),
                           "--no-metrics", "--home", url], stdout=open(loga, "w"), stderr=subprocess.STDOUT)
    b = None
    try:
        wait_mount(ma, up, loga)
        b = subprocess.Popen([exe, "mount", f"127.0.0.1:{port}", mb, "--key", os.path.join(vol, "keys", "client.key")],
                             stdout=open(logb, "w"), stderr=subprocess.STDOUT)
        wait_mount(mb, b, logb)
        d = f"d{n}"
        r = {}
        t0 = time.perf_counter()
        got = len([x for x in os.listdir(os.path.join(ma, d)) if x.endswith(".dat")])
        r["list"] = time.perf_counter() - t0
        if got != n:
            raise RuntimeError(f"listed {got} names, expected {n}")
        r["lsl_a"] = timed(["ls", "-l", os.path.join(ma, d)], n)
        r["lsl_b"] = timed(["ls", "-l", os.path.join(mb, d)], n)
        r["lsl_b2"] = timed(["ls", "-l", os.path.join(mb, d)], n)
        r["direct"] = timed(["nfs-ls", direct_url], n)
        return {k: round(v, 4) for k, v in r.items()}
    finally:
        for m, p in ((mb, b), (ma, up)):
            stop(p)
            if os.path.ismount(m):
                subprocess.run(["umount", "-l", m], check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", action="append", required=True, help="a morris binary (repeat to compare)")
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=7980, help="the first server's port")
    ap.add_argument("--work", default="/var/tmp/cache-ls")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    n = a.entries
    export = os.path.join(a.work, "export")
    d = os.path.join(export, f"d{n}")
    if not os.path.isdir(d) or len(os.listdir(d)) != n:
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for i in range(n):
            open(os.path.join(d, f"file-{i:06d}.dat"), "w").close()
    res = {exe: [] for exe in a.exe}
    try:
        with Ganesha(export, os.path.join(a.work, "ganesha")) as g:
            for rep in range(a.runs):
                for exe in a.exe:
                    r = one_run(exe, g.url(""), g.url(f"d{n}"), a.work, n, a.port)
                    res[exe].append(r)
                    print(f"run {rep + 1} {exe}: " + ", ".join(f"{k} {r[k]:.3f}" for k in TESTS), flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(a.work, ignore_errors=True)
    summary = {exe: {k: statistics.median(r[k] for r in rs) for k in TESTS} for exe, rs in res.items() if rs}
    print(f"{'median (s)':<40}" + "".join(f"{k:>10}" for k in TESTS))
    for exe, s in summary.items():
        print(f"{exe[-40:]:<40}" + "".join(f"{s[k]:>10.3f}" for k in TESTS))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"experiment": "cache_ls", "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                       "command": " ".join(sys.argv), "entries": n, "runs": res, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
