#!/usr/bin/env python3
"""What identity on the wire costs: the same workload on a volume of the
build before it (no handshake, no fencing, no connection limits) and of the
build with it, alternated in one run on the same machine.

    sudo python3 bench/auth.py --old /work/bin/morris-d20f993 --new target/release/morris \
        [--servers 4] [--rounds 3] [--big-size 1G] [--small-files 2000]

With --tls-new the new build's servers, format and mount run with --tls
(the same binary as --old, with --old-keyed, measures what TLS costs).
With --old-keyed the old build gets keys too (a build of protocol 13 or
later): the difference is then what came after it, e.g. checksums.

Each round starts K servers of each build in turn (which goes first
alternates) (old: no keys; new: keys
made by `morris key new`), formats, mounts, runs `morris bench MNT` (the new
build's bench command: it only does file I/O on the mount), and tears it
down. Prints medians and new/old ratios, writes bench/results-auth.json.
The difference is an upper bound of the handshake's cost: the new build
also fences data writes and bounds connections.
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.util import drop_caches, free_port, wait_mounted  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))
FIELDS = {
    "big_write_mib_s": r"big file write\s+([\d.]+)",
    "big_read_mib_s": r"big file read\s+([\d.]+)",
    "small_write_files_s": r"small write\s+([\d.]+)",
    "small_read_files_s": r"small read\s+([\d.]+)",
    "stat_files_s": r"stat\s+([\d.]+)",
    "delete_files_s": r"delete\s+([\d.]+)",
}


def wait_port(addr, proc, timeout=20):
    host, port = addr.split(":")
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server {addr} exited with {proc.returncode}")
        try:
            socket.create_connection((host, int(port)), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server {addr} did not listen")


def one_run(exe, bench_exe, base, k, keyed, a, tls=False):
    """Servers, format, mount, `morris bench`; returns its figures."""
    os.makedirs(base)
    vkey = ckey = []
    if keyed:
        out = subprocess.run([exe, "key", "new", os.path.join(base, "keys")], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(out.stdout + out.stderr)
        vkey = ["--key", os.path.join(base, "keys", "volume.key")] + (["--tls"] if tls else [])
        ckey = ["--key", os.path.join(base, "keys", "client.key")] + (["--tls"] if tls else [])
    procs, addrs, mnt, mount = [], [], os.path.join(base, "mnt"), None
    try:
        for i in range(k):
            addr = f"127.0.0.1:{free_port()}"
            log = open(os.path.join(base, f"server-{i}.log"), "ab")
            procs.append(subprocess.Popen([exe, "server", *vkey, "--data", os.path.join(base, f"s{i}"),
                                           "--listen", addr], stdout=log, stderr=log))
            addrs.append(addr)
        for addr, p in zip(addrs, procs):
            wait_port(addr, p)
        out = subprocess.run([exe, "format", *vkey, "--servers", ",".join(addrs)], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(out.stdout + out.stderr)
        os.makedirs(mnt)
        mlog_path = os.path.join(base, "mount.log")
        mlog = open(mlog_path, "ab")
        mount = subprocess.Popen([exe, "mount", *ckey, addrs[0], mnt], stdout=mlog, stderr=mlog)
        wait_mounted(mnt, mount, mlog_path, RuntimeError)
        drop_caches()
        out = subprocess.run([bench_exe, "bench", mnt, "--big-size", a.big_size,
                              "--small-files", str(a.small_files)], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(out.stdout + out.stderr)
        row = {}
        for name, pat in FIELDS.items():
            m = re.search(pat, out.stdout)
            row[name] = float(m.group(1)) if m else None
        return row
    finally:
        if mount is not None:
            subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
            try:
                mount.wait(timeout=30)
            except subprocess.TimeoutExpired:
                mount.kill()
                mount.wait()
        for p in procs:
            p.kill()
            p.wait()


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="morris binary from before the handshake")
    ap.add_argument("--new", required=True, help="morris binary with it")
    ap.add_argument("--old-keyed", action="store_true",
                    help="the old build takes keys too (protocol 13 or later): compare what came after")
    ap.add_argument("--tls-new", action="store_true",
                    help="the new build runs every connection inside TLS (--tls); e.g. --old X --old-keyed --new X")
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-size", default="1G")
    ap.add_argument("--small-files", type=int, default=2000)
    ap.add_argument("--dir", default="/var/tmp", help="parent of the temporary directory")
    ap.add_argument("--out", default=os.path.join(BENCH, "results-auth.json"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("auth.py: needs root (FUSE, drop_caches)")
    tmp = tempfile.mkdtemp(prefix="morris-auth-", dir=a.dir)
    rows = {"old": [], "new": []}
    try:
        for r in range(a.rounds):
            both = [("old", a.old, a.old_keyed, False), ("new", a.new, True, a.tls_new)]
            # Which build goes first alternates: no build always runs on a
            # machine the other one just warmed or loaded.
            for label, exe, keyed, tls in (both if r % 2 == 0 else both[::-1]):
                row = one_run(exe, a.new, os.path.join(tmp, f"{label}-{r}"), a.servers, keyed, a, tls)
                rows[label].append(row)
                print(f"round {r + 1} {label}: {row}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {}
    for name in FIELDS:
        o = median([x[name] for x in rows["old"]])
        n = median([x[name] for x in rows["new"]])
        summary[name] = {"old": o, "new": n, "ratio": (n / o) if o and n else None}
        print(f"{name:22} old {o:>10.1f}  new {n:>10.1f}  new/old {summary[name]['ratio']:.3f}")
    with open(a.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(a), "rows": rows,
                   "medians": summary}, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
