#!/usr/bin/env python3
"""Foreground reads while a replaced server is rebuilt, per `--resync-rate`.

Loopback, one machine, one volume per rate: K `morris server` processes
started with `--resync-rate RATE` (and `--lease-ms 3000`, so that the lost
server's metadata range is taken over sooner), `format --stripe-unit 1M
--replicas 2`, one FUSE mount through server 1 (never killed).

  write      FILES files of SIZE/FILES bytes each
  idle read  every file read once through the mount (caches dropped,
             sha256 checked): the foreground rate with nothing else running
  rebuild    kill -9 the victim (server 2), delete its data directory, start
             it again empty, `morris volume replace`; while it rebuilds, a
             reader reads the files round and round through the mount
             (O_DIRECT-like: caches dropped before each file), noting the
             time of every 16 MiB; until the volume is healthy
  figures    from the victim's log, its resync pass [start, end]; the
             reader's bytes inside that window / its length = foreground
             MiB/s during the rebuild; bytes rebuilt / pass length = rebuild
             MiB/s. Ratio: foreground during / idle.

Prints one row per rate (medians of --runs runs) and writes JSON. Fails
loudly on any error, wrong checksum or timeout. Needs root.
Usage:
  python3 bench/rebuild_rate.py [--rates 0,128M,32M] [--size 1G] [--files 4] [--runs 1]
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

MiB = 1 << 20
BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from lib.loopback import (BenchError, Volume, interrupt_on_signals, make_keys, require_root_fuse,  # noqa: E402
                          run_bench)
from lib.util import drop_caches, finish, log_times, med, parse_size  # noqa: E402
from resync import Pattern, read_check, write_pattern  # noqa: E402

ROOT_ID = 1
STEP = 16 * MiB


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


class Reader(threading.Thread):
    """Reads the files round and round, noting (wall time, bytes so far) every STEP; checks each file's sha256."""

    def __init__(self, paths, pats):
        super().__init__(daemon=True)
        self.paths, self.pats = paths, pats
        self.stop, self.marks, self.error = threading.Event(), [], None

    def run(self):
        total = 0
        try:
            while not self.stop.is_set():
                for path, p in zip(self.paths, self.pats):
                    drop_caches()
                    h = hashlib.sha256()
                    with open(path, "rb", buffering=0) as f:
                        while True:
                            b = f.read(STEP)
                            if not b:
                                break
                            h.update(b)
                            total += len(b)
                            self.marks.append((time.time(), total))
                    if h.hexdigest() != p.sha:
                        raise BenchError(f"{path}: sha256 differs while rebuilding (DATA MISMATCH)")
                    if self.stop.is_set():
                        return
        except (OSError, BenchError) as e:
            self.error = str(e)

    def rate(self, t0, t1):
        """MiB/s read between wall times t0 and t1."""
        inside = [(t, n) for t, n in self.marks if t0 <= t <= t1]
        if len(inside) < 2:
            return None
        (ta, na), (tb, nb) = inside[0], inside[-1]
        return (nb - na) / MiB / max(tb - ta, 1e-3)


def one_run(a, rate, run, base, size, keys):
    rd = os.path.join(base, f"rate-{rate}-run{run}")
    os.makedirs(rd)
    r = {"rate": rate, "run": run + 1}
    via = ROOT_ID % a.servers
    victim = (via + 1) % a.servers
    vol = Volume(a.exe, os.path.join(rd, "volume"), a.servers, 2, stripe_unit="1M", via=via, keys=keys,
                 lease_ms=3000, server_args=["--resync-rate", rate])
    try:
        mnt = vol.mount(os.path.join(rd, "mnt"))
        per = size // a.files // MiB * MiB
        pats = [Pattern(per, 10 * run + i) for i in range(a.files)]
        paths = [os.path.join(mnt, f"f{i}") for i in range(a.files)]
        for path, p in zip(paths, pats):
            write_pattern(path, p)
        drop_caches()
        buf = bytearray(per)
        t0 = time.perf_counter()
        for path, p in zip(paths, pats):
            read_check(path, per, p.sha, buf)
        r["idle_read"] = per * a.files / MiB / (time.perf_counter() - t0)

        vol.kill9(victim)
        shutil.rmtree(vol.data_dir(victim))
        vol.start_server(victim)
        vol.wait_port(victim)
        reader = Reader(paths, pats)
        wall0 = time.time()
        out = subprocess.run([a.exe, "volume", "replace", "--key", keys.volume, vol.live, str(victim)],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise BenchError(f"volume replace failed: {out.stdout}{out.stderr}")
        reader.start()
        try:
            healthy_s, _, st = vol.wait_healthy(a.timeout, "volume replace", check_alive=[victim])
        finally:
            reader.stop.set()
            reader.join(timeout=600)
        if reader.error:
            raise BenchError(f"reader: {reader.error}")
        r["time_to_healthy_s"] = healthy_s
        vs = next(s for s in st["servers"] if s["index"] == victim)["stats"]
        r["bytes_copied"] = vs["resync"]["bytes_copied"]
        lt = log_times(vol.log_path(victim), "formatted as a replacement",
                       {"pass_start": "resync: catching up stale copies", "pass_end": "resync pass finished"})
        if not all(lt.values()):
            raise BenchError(f"victim's log lacks the resync pass: {lt}")
        r["resync_pass_s"] = lt["pass_end"] - lt["pass_start"]
        r["rebuild_rate"] = r["bytes_copied"] / MiB / max(r["resync_pass_s"], 1e-3)
        r["read_during"] = reader.rate(lt["pass_start"], lt["pass_end"])
        r["read_before_pass"] = reader.rate(wall0, lt["pass_start"])
        if r["read_during"] is None:
            raise BenchError(f"the reader noted too little during the {r['resync_pass_s']:.1f} s pass")
        r["during/idle"] = r["read_during"] / r["idle_read"]
        log(f"rate {rate} run {run + 1}: idle read {r['idle_read']:.0f} MiB/s; pass {r['resync_pass_s']:.1f} s "
            f"rebuilt {r['bytes_copied'] / MiB:.0f} MiB at {r['rebuild_rate']:.0f} MiB/s; "
            f"read during it {r['read_during']:.0f} MiB/s ({r['during/idle']:.2f} of idle)")
        vol.umount(mnt)
    finally:
        vol.stop()
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="0,128M,32M", help="--resync-rate values, comma-separated (0: no limit)")
    ap.add_argument("--size", default="1G", help="bytes written in all (default 1G)")
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for healthy")
    ap.add_argument("--exe", default=os.path.join(BENCH, "..", "target", "release", "morris"))
    ap.add_argument("--dir", default=None, help="where the temp dir goes (default: system temp)")
    ap.add_argument("--out", default=os.path.join(BENCH, "results-rebuild-rate.json"))
    a = ap.parse_args()
    a.exe = os.path.abspath(a.exe)
    require_root_fuse("rebuild_rate.py", a.exe)
    size = parse_size(a.size)
    rates = [x.strip() for x in a.rates.split(",") if x.strip()]
    interrupt_on_signals()
    base = tempfile.mkdtemp(prefix="morris-rebuild-rate-", dir=a.dir)
    runs = []
    t_all = time.time()

    def all_runs():
        keys = make_keys(a.exe, os.path.join(base, "keys"))
        # Rates interleaved run by run, so that drift in the machine's load
        # falls on every rate alike.
        for run in range(a.runs):
            for rate in rates:
                runs.append(one_run(a, rate, run, base, size, keys))

    failure = run_bench(all_runs, base, lambda d: shutil.rmtree(d, ignore_errors=True), log, a.dir,
                        "morris-rebuild-rate-failure-logs-")
    keys = ["idle_read", "read_during", "during/idle", "resync_pass_s", "bytes_copied", "rebuild_rate",
            "time_to_healthy_s"]
    per_rate = {rate: {k: med([r for r in runs if r["rate"] == rate], k) for k in keys} for rate in rates}
    summary = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "command": " ".join([sys.executable] + sys.argv), "exe": a.exe, "size_bytes": size,
               "files": a.files, "servers": a.servers, "replicas": 2, "stripe_unit": "1M",
               "runs_completed": len(runs), "runs_requested": a.runs * len(rates), "failure": failure,
               "elapsed_s": time.time() - t_all, "median_per_rate": per_rate}
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "raw": runs}, f, indent=1)
    if runs:
        print(f"\nmorris {a.servers} servers on loopback, --replicas 2, {size // MiB} MiB in {a.files} files, "
              f"median of {a.runs} run(s) per rate")
        print(f"{'--resync-rate':<14}{'idle read':>11}{'read during':>13}{'during/idle':>13}"
              f"{'rebuild MiB/s':>15}{'pass (s)':>10}{'healthy (s)':>13}")
        for rate, m in per_rate.items():
            def f(k, fmt):
                return "-" if m[k] is None else format(m[k], fmt)
            print(f"{rate:<14}{f('idle_read', '11.0f')}{f('read_during', '13.0f')}{f('during/idle', '13.2f')}"
                  f"{f('rebuild_rate', '15.0f')}{f('resync_pass_s', '10.1f')}{f('time_to_healthy_s', '13.1f')}")
    finish(a.out, failure)


if __name__ == "__main__":
    main()
