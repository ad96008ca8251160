#!/usr/bin/env python3
"""Small writes and small files: morris builds side by side with local disk.

For each of --runs rounds, in order: a local directory under --base-dir, then
for each --exe a fresh 4-server loopback volume (--replicas copies, default
one) with one FUSE mount (bench/lib/loopback.py). Page caches dropped before each system. On
each, one process at a time:

  append4    --appends four-byte O_APPEND writes of 0, 1, 2, ... then close,
             read back and checked (xfstests generic/069's append_writer and
             append_reader; bench/lib/smallio.c)          -> appends/s
  write100   200,000 sequential 100-byte writes + close    -> writes/s
  write4k    50,000 sequential 4 KiB writes + close        -> MiB/s
  write1m    1,024 sequential 1 MiB writes + fsync + close -> MiB/s
  untar      `tar xf` of a tree of 14,015 entries (715 directories, 13,300
             files of 64 B to 64 KiB, log-uniform, ~125 MiB; made once per
             bench run, deterministic) into an empty directory -> s
  untar+sync the same, then `sync -f` on the target         -> s
  lsR        `ls -lR` of that tree (a stat and two getxattrs per entry, as
             GNU ls sends them), right after the untar, on the same mount -> s
  lsR2       the same again                                -> s
  rm         `rm -rf` of that tree                          -> s

Prints medians per system and the ratio to local disk; writes JSON with every
figure (--out). Needs root (FUSE, drop_caches), gcc, tar.
Usage:
  sudo python3 bench/small_writes.py --exe target/release/morris [--exe OTHER ...]
           (an --exe may carry mount options: --exe "target/release/morris --entry-ttl-ms 10000")
           [--runs 3] [--appends 3000000] [--replicas 1] [--tests write1m,untar,...]
           [--base-dir /var/tmp] [--out FILE]
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from lib.loopback import BenchError, Volume, require_root_fuse  # noqa: E402
from lib.util import drop_caches  # noqa: E402

TESTS = ["append4", "write100", "write4k", "write1m", "untar", "untar+sync", "lsR", "lsR2", "rm"]
UNITS = {"append4": "appends/s", "write100": "writes/s", "write4k": "MiB/s", "write1m": "MiB/s",
         "untar": "s", "untar+sync": "s", "lsR": "s", "lsR2": "s", "rm": "s"}


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def make_tree_tar(path):
    """The tarball of the deterministic 14,015-entry tree."""
    rng = random.Random(14000)
    src = tempfile.mkdtemp(prefix="tree-", dir=os.path.dirname(path))
    for d in range(700):
        dp = os.path.join(src, f"d{d // 50:02d}", f"s{d:03d}")
        os.makedirs(dp, exist_ok=True)
        for f in range(19):
            size = int(64 * (1024 ** rng.random()))
            with open(os.path.join(dp, f"f{f:02d}.dat"), "wb") as fh:
                fh.write(rng.randbytes(size))
    with tarfile.open(path, "w") as t:
        t.add(src, arcname="tree")
    shutil.rmtree(src)


def run(cmd, timeout):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed: {out.stdout}{out.stderr}")
    return out.stdout


def seconds(out):
    for line in out.splitlines():
        if line.startswith("seconds="):
            return float(line.split("=", 1)[1])
    raise BenchError(f"no seconds= in {out!r}")


def workload(where, smallio, tarball, appends, timeout, tests):
    r = {}
    if "append4" in tests:
        out = run([smallio, "append", os.path.join(where, "appends"), str(appends)], timeout)
        if f"verified={appends}" not in out:
            raise BenchError(f"append check failed: {out}")
        r["append4"] = appends / seconds(out)
    if "write100" in tests:
        r["write100"] = 200_000 / seconds(
            run([smallio, "write", os.path.join(where, "w100"), "100", "200000"], timeout))
    if "write4k" in tests:
        r["write4k"] = 50_000 * 4096 / 2**20 / seconds(
            run([smallio, "write", os.path.join(where, "w4k"), "4096", "50000"], timeout))
    if "write1m" in tests:
        r["write1m"] = 1024 / seconds(
            run([smallio, "syncwrite", os.path.join(where, "w1m"), str(1 << 20), "1024"], timeout))
    if any(t in tests for t in ("untar", "rm", "lsR", "lsR2")):
        # `rm` and `ls -lR` use what `untar` made (made untimed if `untar`
        # is not asked).
        os.mkdir(os.path.join(where, "x1"))
        t = time.perf_counter()
        run(["tar", "xf", tarball, "-C", os.path.join(where, "x1")], timeout)
        if "untar" in tests:
            r["untar"] = time.perf_counter() - t
        n = sum(len(fs) + len(ds) for _, ds, fs in os.walk(os.path.join(where, "x1")))
        if n != 14_015:
            raise BenchError(f"untar made {n} entries, want 14,015")
    for name in ("lsR", "lsR2"):
        if name in tests:
            t = time.perf_counter()
            out = run(["ls", "-lR", os.path.join(where, "x1")], timeout)
            r[name] = time.perf_counter() - t
            if out.count(".dat") != 13_300:
                raise BenchError(f"ls -lR listed {out.count('.dat')} files, want 13,300")
    if "untar+sync" in tests:
        os.mkdir(os.path.join(where, "x2"))
        t = time.perf_counter()
        run(["tar", "xf", tarball, "-C", os.path.join(where, "x2")], timeout)
        run(["sync", "-f", os.path.join(where, "x2")], timeout)
        r["untar+sync"] = time.perf_counter() - t
    if "rm" in tests:
        t = time.perf_counter()
        run(["rm", "-rf", os.path.join(where, "x1")], timeout)
        r["rm"] = time.perf_counter() - t
    return {k: round(v, 3) for k, v in r.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", action="append", help="morris binary (repeat to compare builds)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--appends", type=int, default=3_000_000)
    ap.add_argument("--replicas", type=int, default=1, help="copies of each block (morris)")
    ap.add_argument("--tests", default=",".join(TESTS), help="comma-separated subset of " + ",".join(TESTS))
    ap.add_argument("--base-dir", default="/var/tmp")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one step may take")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tests = [t for t in a.tests.split(",") if t]
    unknown = [t for t in tests if t not in TESTS]
    if unknown:
        ap.error(f"unknown tests {unknown}; known: {TESTS}")
    specs = [e.split() for e in (a.exe or ["target/release/morris"])]
    exes = [os.path.abspath(s[0]) for s in specs]
    mount_args = {" ".join([os.path.basename(os.path.abspath(s[0]))] + s[1:]): s[1:] for s in specs}
    for e in exes:
        require_root_fuse("small_writes.py", e)
    base = tempfile.mkdtemp(prefix="morris-sw-", dir=a.base_dir)
    smallio = os.path.join(base, "smallio")
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
              "exes": exes, "appends": a.appends, "base_dir": a.base_dir, "replicas": a.replicas,
              "tests": tests, "runs": []}
    failure = None
    try:
        run(["gcc", "-O2", "-Wall", "-o", smallio, os.path.join(BENCH, "lib", "smallio.c")], 120)
        tarball = os.path.join(base, "tree.tar")
        make_tree_tar(tarball)
        for r in range(a.runs):
            systems = [("local", None)] + [(n, e) for n, e in zip(mount_args, exes)]
            for name, exe in systems:
                drop_caches()
                log(f"run {r + 1}/{a.runs}: {name}")
                if exe is None:
                    where = os.path.join(base, f"local{r}")
                    os.mkdir(where)
                    res = workload(where, smallio, tarball, a.appends, a.timeout, tests)
                    shutil.rmtree(where)
                else:
                    tag = f"{r}-{len(result['runs'])}"
                    vol = Volume(exe, os.path.join(base, f"vol{tag}"), 4, a.replicas)
                    try:
                        mnt = vol.mount(os.path.join(base, f"mnt{tag}"), mount_args[name])
                        res = workload(mnt, smallio, tarball, a.appends, a.timeout, tests)
                    finally:
                        vol.stop()
                    shutil.rmtree(os.path.join(base, f"vol{tag}"), ignore_errors=True)
                log(f"  {res}")
                result["runs"].append({"run": r, "system": name, **res})
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        failure = str(e)
    except KeyboardInterrupt:
        failure = "interrupted"
    names = ["local"] + list(mount_args)
    summary = {}
    for n in names:
        rows = [x for x in result["runs"] if x["system"] == n]
        summary[n] = {t: statistics.median([x[t] for x in rows]) for t in tests if rows}
    result["median"] = summary
    print(f"\n{'test':12} {'unit':10}" + "".join(f" {n[:22]:>22}" for n in names)
          + "".join(f" {n[:14] + '/local':>20}" for n in names[1:]))
    for t in tests:
        if not all(t in summary[n] for n in names):
            continue
        row = f"{t:12} {UNITS[t]:10}" + "".join(f" {summary[n][t]:22.3f}" for n in names)
        for n in names[1:]:
            ratio = summary[n][t] / summary["local"][t] if summary["local"][t] else float("nan")
            row += f" {ratio:20.3f}"
        print(row)
    out = a.out or os.path.join(BENCH, "results-small-writes.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}")
    if failure:
        print(f"\nFAILED: {failure} (logs under {base})", file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
