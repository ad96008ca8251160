#!/usr/bin/env python3
"""Where a metadata operation's time goes: requests counted per operation.

For each workload below, on a fresh K-server loopback volume (default 4, one
copy) with one FUSE mount, N operations in one directory, one at a time, and
for each:

  fuse        FUSE requests the kernel sent, by opcode (tracepoint
              fuse:fuse_request_send, counted with `perf record -a`)
  requests    server requests, by name, summed over the servers (the
              servers' own counters, `morris status --json`, before/after)
  syscalls    fsync + fdatasync and pwrite64 of the server processes
              (perf stat -e syscalls:sys_enter_*), so SQLite commits that
              reach the disk and block writes show
  time        ops/s of the same workload run again without perf (median of
              --runs), and on a local directory for scale

Workloads: create (open O_CREAT|O_EXCL + close), stat (os.stat, same mount,
right after), small write (create + write 4 KiB + close), rename (to a new
name in the same directory), unlink, mkdir.

Prints one table per workload (counts per operation) and writes JSON.
Needs root (perf system-wide, FUSE, tracefs), `perf` (linux-perf).
Usage: sudo python3 bench/create_cost.py [--n 2000] [--k 4] [--runs 3]
           [--exe target/release/morris] [--out bench/results-create-cost.json]
           [--base-dir /var/tmp]
"""

import argparse
import collections
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.loopback import BenchError, Volume, require_root_fuse  # noqa: E402

WORKLOADS = ["create", "stat", "small write", "rename", "unlink", "mkdir"]
DATA = b"x" * 4096


def run_workload(d, kind, n):
    """Runs `kind` over names 0..n in directory d (made by the create step before)."""
    t0 = time.perf_counter()
    for i in range(n):
        p = os.path.join(d, f"f{i}")
        if kind == "create":
            os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        elif kind == "stat":
            os.stat(p)
        elif kind == "small write":
            fd = os.open(os.path.join(d, f"w{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            os.write(fd, DATA)
            os.close(fd)
        elif kind == "rename":
            os.rename(p, os.path.join(d, f"r{i}"))
        elif kind == "unlink":
            os.unlink(os.path.join(d, f"r{i}"))
        elif kind == "mkdir":
            os.mkdir(os.path.join(d, f"d{i}"))
    return n / (time.perf_counter() - t0)


def server_requests(vol):
    total = collections.Counter()
    for s in vol.status().get("servers", []):
        st = s.get("stats") or s
        for name, n in st.get("requests_by_op", []):
            total[name] += n
    return total


def fuse_opcodes(perf_data):
    out = subprocess.run(["perf", "script", "-i", perf_data],
                         capture_output=True, text=True, check=True)
    # "... fuse:fuse_request_send: connection 57 req 12 opcode 1 (FUSE_LOOKUP) len 46"
    return collections.Counter(re.findall(r"\((FUSE_\w+)\)", out.stdout))


def counted(vol, mnt, kind, n, base):
    """One pass of `kind` with every counter on: per-operation figures."""
    d = os.path.join(mnt, "t")
    pids = ",".join(str(p.pid) for p in vol.procs)
    perf_data = os.path.join(base, "fuse.data")
    stat_out = os.path.join(base, "stat.csv")
    before = server_requests(vol)
    rec = subprocess.Popen(["perf", "record", "-q", "-a", "-e", "fuse:fuse_request_send", "-o", perf_data],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sc = subprocess.Popen(["perf", "stat", "-x", ",", "-o", stat_out, "-p", pids,
                           "-e", "syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync,syscalls:sys_enter_pwrite64"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    run_workload(d, kind, n)
    time.sleep(0.5)
    for p in (rec, sc):
        p.send_signal(2)
        p.wait(timeout=60)
    after = server_requests(vol)
    reqs = {k: (after[k] - before[k]) / n for k in after if after[k] - before[k] > 0}
    fuse = {k: v / n for k, v in fuse_opcodes(perf_data).items()}
    sys_calls = {}
    with open(stat_out) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) > 2 and parts[2].startswith("syscalls:"):
                try:
                    sys_calls[parts[2].split("sys_enter_")[1]] = float(parts[0]) / n
                except ValueError:
                    pass
    return {"fuse": fuse, "requests": reqs, "syscalls": sys_calls}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--exe", default="target/release/morris")
    ap.add_argument("--out", default="bench/results-create-cost.json")
    ap.add_argument("--base-dir", default="/var/tmp",
                    help="where the servers' data and the local directory go (default /var/tmp)")
    a = ap.parse_args()
    exe = os.path.abspath(a.exe)
    require_root_fuse("create_cost.py", exe)
    if not shutil.which("perf"):
        sys.exit("create_cost.py: needs perf (linux-perf)")
    if not os.path.isdir("/sys/kernel/tracing/events/fuse"):
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=False)
    if not os.path.isdir("/sys/kernel/tracing/events/fuse"):
        sys.exit("create_cost.py: the kernel has no fuse tracepoints (tracefs: events/fuse)")
    base = tempfile.mkdtemp(prefix="morris-cc-", dir=a.base_dir)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "n": a.n, "k": a.k,
              "base_dir": a.base_dir,
              "exe": exe, "counts": {}, "rates": {w: [] for w in WORKLOADS},
              "local": {w: [] for w in WORKLOADS}}
    try:
        # Counted pass (perf slows the run: its times are not used).
        vol = Volume(exe, os.path.join(base, "counted"), a.k, 1)
        try:
            mnt = vol.mount(os.path.join(base, "mnt"))
            os.mkdir(os.path.join(mnt, "t"))
            for w in WORKLOADS:
                result["counts"][w] = counted(vol, mnt, w, a.n, base)
        finally:
            vol.stop()
        # Timed passes, each on a fresh volume, then a local directory.
        for r in range(a.runs):
            # Each starts with nothing left to write back (the previous
            # volume's removal would otherwise slow the next pass).
            os.sync()
            vol = Volume(exe, os.path.join(base, f"timed{r}"), a.k, 1)
            try:
                mnt = vol.mount(os.path.join(base, f"mnt{r}"))
                d = os.path.join(mnt, "t")
                os.mkdir(d)
                for w in WORKLOADS:
                    result["rates"][w].append(run_workload(d, w, a.n))
            finally:
                vol.stop()
            os.sync()
            local = os.path.join(base, f"local{r}")
            os.makedirs(local)
            for w in WORKLOADS:
                result["local"][w].append(run_workload(local, w, a.n))
    except BenchError as e:
        sys.exit(f"create_cost.py: {e} (logs kept in {base})")
    for w in WORKLOADS:
        c = result["counts"][w]
        rate = statistics.median(result["rates"][w])
        local = statistics.median(result["local"][w])
        print(f"\n## {w}: {rate:,.0f} ops/s (local directory {local:,.0f}); per operation:")
        print("  FUSE requests  " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(c["fuse"].items(), key=lambda x: -x[1])))
        print("  server reqs    " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(c["requests"].items(), key=lambda x: -x[1])))
        print("  server calls   " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(c["syscalls"].items())))
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {a.out}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
