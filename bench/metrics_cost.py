#!/usr/bin/env python3
"""What the Prometheus metrics cost (issue 20): two `morris up` clusters of
the same binary at once, one with metrics on and every endpoint scraped once
a second, one with --no-metrics; on each in turn, ROUNDS times:

  creates   2,000 empty files made (O_CREAT|O_EXCL, close) in a new directory
  small     1,000 files of 4 KiB made and written
  appends   100,000 O_APPEND writes of 100 bytes
  read      a 1 GiB file read sequentially, the mount's page cache dropped
            first (the servers' kept: CPU per request, not the disk)

Prints each run and the medians, and the ratio on/off. Root (FUSE mounts).

Usage: sudo python3 bench/metrics_cost.py [--exe target/release/morris] [--rounds 5]
       [--out bench/results-metrics-cost.json]
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.util import free_range  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_up(exe, base, metrics):
    port = free_range(12)
    args = [exe, "up", "--servers", "4", "--dir", f"{base}/data", "--mount", f"{base}/mnt",
            "--port", str(port), "--no-allow-other"]
    args += ["--metrics-port", str(port + 5)] if metrics else ["--no-metrics"]
    p = subprocess.Popen(args, stdout=open(f"{base}/up.log", "w"), stderr=subprocess.STDOUT,
                         start_new_session=True)
    for _ in range(300):
        if os.path.ismount(f"{base}/mnt"):
            return p, [f"127.0.0.1:{port + 5 + i}" for i in range(5)] if metrics else []
        time.sleep(0.1)
    sys.exit("morris up did not mount: " + open(f"{base}/up.log").read())


def creates(mnt, tag):
    d = f"{mnt}/c{tag}"
    os.makedirs(d)
    t = time.perf_counter()
    for i in range(2000):
        os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    return 2000 / (time.perf_counter() - t)


def small(mnt, tag):
    d = f"{mnt}/s{tag}"
    os.makedirs(d)
    data = b"x" * 4096
    t = time.perf_counter()
    for i in range(1000):
        fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, data)
        os.close(fd)
    return 1000 / (time.perf_counter() - t)


def appends(mnt, tag):
    fd = os.open(f"{mnt}/a{tag}", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    b = b"y" * 100
    t = time.perf_counter()
    for _ in range(100000):
        os.write(fd, b)
    os.close(fd)
    return 100000 / (time.perf_counter() - t)


def read(mnt, tag):
    # The mount's page cache only: the servers keep the file in theirs, so
    # the read costs CPU per request (where the metrics would show), not
    # this VM's disk (whose speed varies 2x between runs).
    with open(f"{mnt}/big", "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    t = time.perf_counter()
    n = 0
    with open(f"{mnt}/big", "rb", buffering=0) as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            n += len(b)
    return n / (1 << 20) / (time.perf_counter() - t)


TESTS = [("creates", creates, "files/s"), ("small", small, "files/s"),
         ("appends", appends, "writes/s"), ("read", read, "MiB/s")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", default=os.path.join(ROOT, "target/release/morris"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    exe = os.path.abspath(a.exe)
    tmp = tempfile.mkdtemp(prefix="morris-mcost-", dir="/var/tmp")
    ups, stop = {}, threading.Event()
    try:
        for name, metrics in (("on", True), ("off", False)):
            os.makedirs(f"{tmp}/{name}")
            ups[name] = start_up(exe, f"{tmp}/{name}", metrics)
        def scraper():
            while not stop.is_set():
                for e in ups["on"][1]:
                    try:
                        urllib.request.urlopen(f"http://{e}/metrics", timeout=5).read()
                    except OSError:
                        pass
                stop.wait(1)
        threading.Thread(target=scraper, daemon=True).start()
        for name in ups:
            with open(f"{tmp}/{name}/mnt/big", "wb") as f:
                for _ in range(1024):
                    f.write(os.urandom(1 << 20))
        runs = {t: {"on": [], "off": []} for t, _, _ in TESTS}
        for r in range(a.rounds):
            order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
            for t, fn, unit in TESTS:
                for name in order:
                    v = fn(f"{tmp}/{name}/mnt", f"{r}")
                    runs[t][name].append(v)
                    print(f"round {r} {t:8} {name:3} {v:12.1f} {unit}", flush=True)
        print("\nmedians (metrics on / off):")
        summary = {}
        for t, _, unit in TESTS:
            on, off = statistics.median(runs[t]["on"]), statistics.median(runs[t]["off"])
            summary[t] = {"on": on, "off": off, "ratio": on / off, "unit": unit,
                          "runs": runs[t]}
            print(f"  {t:8} {on:12.1f} / {off:12.1f} {unit}   on/off {on / off:.3f}")
        if a.out:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "exe": exe, "rounds": a.rounds, "tests": summary},
                      open(a.out, "w"), indent=1)
    finally:
        stop.set()
        for p, _ in ups.values():
            p.send_signal(signal.SIGINT)
        for p, _ in ups.values():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
