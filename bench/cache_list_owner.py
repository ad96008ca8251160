#!/usr/bin/env python3
"""The first listing of a big home directory on one morris server, and what it costs that server.

Where bench/cache.py (b) measures a listing on the emulated cluster beside libnfs, this isolates
the directory owner's work: nfs-ganesha on this host exports a directory of N empty files
(bench/lib/ganesha.py: its own rpcbind in a private /run), a 1-server `morris up --home` mount is
bound to it, and the first `os.listdir` of the directory (a miss: every name fetched from home,
stored as a placeholder and listed) is timed, with the CPU seconds the server process used
meanwhile and the size of its WAL afterwards. Then the same listing again (a hit). Each --exe
gets a fresh volume per run; the builds take turns, so that the machine's drift touches all of
them alike. Prints one line per run and the medians; --out writes them as JSON.

    python3 bench/cache_list_owner.py --exe /work/bin/morris-old --exe target/release/morris \\
        --entries 100000 --runs 3

Needs root (ganesha, FUSE), nfs-ganesha + nfs-ganesha-vfs, rpcbind, fuse3. Everything it starts is
stopped and unmounted at the end; the work directory (--work, default /var/tmp/cache-list-owner)
is removed unless --keep.
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


def cpu_secs(pid):
    with open(f"/proc/{pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def one_run(exe, url, work, n, port):
    vol, mnt = os.path.join(work, "vol"), os.path.join(work, "mnt")
    shutil.rmtree(vol, ignore_errors=True)
    os.makedirs(mnt, exist_ok=True)
    log = open(os.path.join(work, "up.log"), "w")
    up = subprocess.Popen([exe, "up", "--servers", "1", "--dir", vol, "--mount", mnt, "--port", str(port),
                           "--no-metrics", "--home", url], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while not os.path.ismount(mnt):
            if up.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"morris up did not mount: see {log.name}")
            time.sleep(0.1)
        pids = subprocess.run(["pgrep", "-f", f"{exe} server --data {vol}"], capture_output=True,
                              text=True).stdout.split()
        if len(pids) != 1:
            raise RuntimeError(f"expected one server process, found {pids}")
        server = int(pids[0])
        path = os.path.join(mnt, f"d{n}")
        c0, t0 = cpu_secs(server), time.perf_counter()
        got = len(os.listdir(path))
        miss, c1 = time.perf_counter() - t0, cpu_secs(server)
        t0 = time.perf_counter()
        again = len(os.listdir(path))
        hit = time.perf_counter() - t0
        if got != n or again != n:
            raise RuntimeError(f"listed {got} and {again} names, expected {n}")
        wal = os.path.join(vol, "server-0", "meta.sqlite-wal")
        return {"miss_s": round(miss, 4), "hit_s": round(hit, 4), "server_cpu_s": round(c1 - c0, 3),
                "wal_bytes": os.path.getsize(wal) if os.path.exists(wal) else 0}
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", mnt], check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", action="append", required=True, help="a morris binary (repeat to compare)")
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=7990, help="the server's port")
    ap.add_argument("--work", default="/var/tmp/cache-list-owner")
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
                    r = one_run(exe, g.url(""), a.work, n, a.port)
                    res[exe].append(r)
                    print(f"run {rep + 1} {exe}: miss {r['miss_s']:.3f} s, hit {r['hit_s']:.3f} s, "
                          f"server CPU {r['server_cpu_s']:.2f} s, WAL {r['wal_bytes'] / 2**20:.0f} MiB", flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(a.work, ignore_errors=True)
    summary = {exe: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for exe, rs in res.items() if rs}
    for exe, s in summary.items():
        print(f"median {exe}: miss {s['miss_s']:.3f} s, hit {s['hit_s']:.3f} s, server CPU {s['server_cpu_s']:.2f} s, "
              f"WAL {s['wal_bytes'] / 2**20:.0f} MiB")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"experiment": "cache_list_owner", "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                       "command": " ".join(sys.argv), "entries": n, "runs": res, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
